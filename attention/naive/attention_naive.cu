// attention_naive.cu: standard attention, the "without FlashAttention" baseline: the (T, T) score
// and probability matrices of every (batch, head) are materialized in GPU memory.
//
// Per batch b and head h, with scale = 1/√HD (attention.h for the layouts and strides):
//   forward   S  = Q Kᵀ                      fp32  workspace (B, NH, T, T)    cuBLAS
//             P  = softmax(S · scale)        bf16  saved     (B, NH, T, T)    softmax_forward_kernel
//             LSE = log Σ_j exp(S · scale)   fp32  lse       (B, NH, T)       (same kernel)
//             O  = P V                       bf16  out       (B, T, NH, HD)   cuBLAS
//   backward  dV = Pᵀ dO                     bf16  dv        (B, T, NH, HD)   cuBLAS
//             dP = dO Vᵀ                     fp32  workspace (B, NH, T, T)    cuBLAS
//             dS = P ∘ (dP − D) · scale,     bf16  over P in saved            softmax_backward_kernel
//                  D = rowsum(dO ∘ O)
//             dQ = dS K,  dK = dSᵀ Q         bf16  dq, dk    (B, T, NH, HD)   cuBLAS
// q, dq are (B, T, NH, HD) and k, v, dk, dv (B, T, NKV, HD) rows at their strides (inside the packed
// (B, T, NH + 2·NKV, HD) activation or plain); the scale is folded into dS, so dQ and dK need no
// extra factor.
// Grouped-query attention (G = NH / NKV query heads per K/V head g, heads g·G .. g·G + G − 1): every
// per-head product is G strided-batched calls of NKV heads each (query heads j, G + j, 2G + j, ...
// against K/V heads 0, 1, 2, ...). dV = Σ_group Pᵀ dO and dK = Σ_group dSᵀ Q are one GEMM per K/V
// head with k = G·T: the group's P (dS) are consecutive (G·T, T) rows already, and Q and dO are first
// gathered head-major, (B, NH, T, HD), into the workspace, so the sum is taken in fp32 inside cuBLAS.
// D is taken from the bf16 out, as attention.h defines it and as flash2 does, rather than as
// Σ_j P_ij dP_ij from the bf16 P: equal in exact arithmetic, but with large logits (near one-hot
// rows, where dP − D cancels) the two roundings give dQ and dK up to ~1e-2 relative apart, and
// this way both backends compute the same function of (q, k, v, out, lse, dout).
// Causal: keys j > query i get P = 0 exactly (and so dS = 0); the GEMMs still compute all of S and dP.
//
// The backward CONSUMES `saved`: it overwrites P with dS in place. Run the forward again before
// another backward of the same inputs.
// Memory: saved B·NH·T·T·2 bytes, workspace B·NH·T·T·4 bytes (at T = 16384: 512 MiB and 1 GiB per
// (b, h) pair), which is why this is the baseline and not the backend to train with; with GQA the
// workspace adds 2·B·NH·T·HD·2 bytes for the gathered Q and dO.
//
// naive-recompute: the same standard attention for when storing P of every layer does not fit
// (long sequences): the forward keeps P in the workspace only, and the backward recomputes
// S = Q Kᵀ (one more GEMM) and P = exp(S · scale − LSE) from the saved LSE before the steps above.
// Memory: saved nothing, workspace B·NH·T·T·6 bytes (S or dP fp32, then P or dS bf16), for one
// layer at a time.
//
// cuBLAS is column-major. A row-major (rows, cols) matrix with row stride ld is, to cuBLAS, the
// column-major (cols, rows) matrix with leading dimension ld, i.e. its transpose. Writing Xc for
// that view of a row-major X (Qc = Qᵀ, (HD, T), ld = qkv_stride; Sc = Sᵀ, (T, T), ld = T), each
// row-major product X = Y Z becomes the column-major product Xc = Xᵀ = Zᵀ Yᵀ:
//   S  = Q Kᵀ  → Sc  = K Qᵀ   = Kcᵀ · Qc      OP_T, OP_N, m = T,  n = T, k = HD
//   O  = P V   → Oc  = Vᵀ Pᵀ  = Vc  · Pc      OP_N, OP_N, m = HD, n = T, k = T
//   dV = Pᵀ dO → dVc = dOᵀ P  = dOc · Pcᵀ     OP_N, OP_T, m = HD, n = T, k = T
//   dP = dO Vᵀ → dPc = V dOᵀ  = Vcᵀ · dOc     OP_T, OP_N, m = T,  n = T, k = HD
//   dQ = dS K  → dQc = Kᵀ dSᵀ = Kc  · dSc     OP_N, OP_N, m = HD, n = T, k = T
//   dK = dSᵀ Q → dKc = Qᵀ dS  = Qc  · dScᵀ    OP_N, OP_T, m = HD, n = T, k = T
// One strided-batched call per batch index b covers its NH heads: consecutive heads of a (T, HD)
// operand are HD elements apart (same leading dimension), consecutive heads of a (T, T) matrix
// T·T apart. Batches b are a loop, since b·T·stride is not one stride across b and h together.
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/common/cuda_check.h"
#include "attention/backends.h"

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) ----------------------------------

// Merges the online-softmax pair (m2, l2) into (m, l): m the max, l = Σ exp(x − m).
static __device__ __forceinline__ void online_merge(float* m, float* l, float m2, float l2) {
    float mn = fmaxf(*m, m2);
    if (mn == -INFINITY) return;  // both empty
    *l = *l * expf(*m - mn) + l2 * expf(m2 - mn);
    *m = mn;
}

static __device__ __forceinline__ void warp_online_merge(float* m, float* l) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(0xFFFFFFFFu, *m, offset);
        float l2 = __shfl_xor_sync(0xFFFFFFFFu, *l, offset);
        online_merge(m, l, m2, l2);
    }
}

// Every thread ends with the block's (max, sum of exp(x − max)).
static __device__ void block_online_merge(float* m, float* l) {
    __shared__ float shared_m[32], shared_l[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    warp_online_merge(m, l);
    if (lane == 0) {
        shared_m[warp] = *m;
        shared_l[warp] = *l;
    }
    __syncthreads();
    *m = lane < num_warps ? shared_m[lane] : -INFINITY;
    *l = lane < num_warps ? shared_l[lane] : 0.0f;
    warp_online_merge(m, l);  // every warp merges the per-warp results, so all threads have them
    __syncthreads();          // the shared arrays may be rewritten by the next call
}

// Every thread ends with the block's sum of x.
static __device__ float block_sum(float x) {
    __shared__ float shared[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < num_warps ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
    __syncthreads();
    return x;
}

// Four bf16 in one 8-byte word (the VEC = 4 paths).
static __device__ __forceinline__ uint2 pack_bf16x4(float a, float b, float c, float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    return packed;
}

static __device__ __forceinline__ void unpack_bf16x4(uint2 packed, float* x) {
    __nv_bfloat162 lo = *reinterpret_cast<__nv_bfloat162*>(&packed.x);
    __nv_bfloat162 hi = *reinterpret_cast<__nv_bfloat162*>(&packed.y);
    float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    x[0] = a.x;
    x[1] = a.y;
    x[2] = b.x;
    x[3] = b.y;
}

// ---- kernels ---------------------------------------------------------------------------------------

// Row softmax. S (rows, T) fp32 unscaled scores, rows = B·NH·T (row = (b·NH + h)·T + i); writes
// P (rows, T) bf16 = exp(S·scale − LSE) for keys j < num_keys(i), exactly 0 for masked keys, and
// lse (rows) fp32. One block per row (grid-stride over rows); two passes over the row: an online
// max/sum, then the write. VEC = 4: float4 loads and 8-byte stores (T % 4 == 0, aligned bases).
// LSE_GIVEN (the recomputing backward): lse is read, not computed, and only the write pass runs.
template <int VEC, bool LSE_GIVEN>
__global__ void softmax_forward_kernel(__nv_bfloat16* P, float* lse, const float* S, int T, size_t rows, float scale,
                                       int causal) {
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int i = (int)(row % (size_t)T);
        const int num_keys = causal ? i + 1 : T;
        const float* s = S + row * (size_t)T;
        __nv_bfloat16* p = P + row * (size_t)T;

        float m = -INFINITY, l = 0.0f;
        if (LSE_GIVEN) {
            // no statistics pass
        } else if (VEC == 4) {
            const int num_chunks = (num_keys + 3) / 4;  // the last chunk may hold masked keys (still in the row)
            for (int c = threadIdx.x; c < num_chunks; c += blockDim.x) {
                float4 x4 = reinterpret_cast<const float4*>(s)[c];
                float x[4] = {x4.x * scale, x4.y * scale, x4.z * scale, x4.w * scale};
                int valid = min(4, num_keys - 4 * c);
                float cm = x[0];
                for (int e = 1; e < valid; e++) cm = fmaxf(cm, x[e]);
                float cl = 0.0f;
                for (int e = 0; e < valid; e++) cl += expf(x[e] - cm);
                online_merge(&m, &l, cm, cl);
            }
        } else {
            for (int j = threadIdx.x; j < num_keys; j += blockDim.x) {
                float x = s[j] * scale;
                if (x > m) {
                    l = l * expf(m - x) + 1.0f;
                    m = x;
                } else {
                    l += expf(x - m);
                }
            }
        }
        float row_lse;
        if (LSE_GIVEN) {
            row_lse = lse[row];
        } else {
            block_online_merge(&m, &l);
            row_lse = m + logf(l);
            if (threadIdx.x == 0) lse[row] = row_lse;
        }

        if (VEC == 4) {
            for (int c = threadIdx.x; c < T / 4; c += blockDim.x) {
                uint2 out = make_uint2(0u, 0u);  // bf16 +0 in all four
                if (4 * c < num_keys) {
                    float4 x4 = reinterpret_cast<const float4*>(s)[c];
                    float x[4] = {x4.x, x4.y, x4.z, x4.w};
                    float y[4];
                    for (int e = 0; e < 4; e++) y[e] = 4 * c + e < num_keys ? expf(x[e] * scale - row_lse) : 0.0f;
                    out = pack_bf16x4(y[0], y[1], y[2], y[3]);
                }
                reinterpret_cast<uint2*>(p)[c] = out;
            }
        } else {
            for (int j = threadIdx.x; j < T; j += blockDim.x)
                p[j] = __float2bfloat16(j < num_keys ? expf(s[j] * scale - row_lse) : 0.0f);
        }
    }
}

// Softmax backward, in place. PdS (rows, T) bf16 holds P on entry and dS = P ∘ (dP − D) · scale on
// exit, dP (rows, T) fp32, D_i = Σ_d dO[b, i, h, d] · O[b, i, h, d] from out and dout (B, T, NH, HD)
// at out_stride. Masked keys (j > i when causal) hold P = 0 and are left as they are (dS = 0).
// One block per row (grid-stride), row = (b·NH + h)·T + i. VEC as in softmax_forward_kernel.
template <int VEC>
__global__ void softmax_backward_kernel(__nv_bfloat16* PdS, const float* dP, const __nv_bfloat16* out,
                                        const __nv_bfloat16* dout, long out_stride, int T, int NH, int HD,
                                        size_t rows, float scale, int causal) {
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t bh = row / (size_t)T;
        const int i = (int)(row % (size_t)T);
        const size_t b = bh / (size_t)NH, h = bh % (size_t)NH;
        const size_t o_offset = (b * (size_t)T + (size_t)i) * (size_t)out_stride + h * (size_t)HD;
        float d = 0.0f;
        for (int c = threadIdx.x; c < HD; c += blockDim.x)
            d += __bfloat162float(out[o_offset + c]) * __bfloat162float(dout[o_offset + c]);
        const float D = block_sum(d);

        const int num_keys = causal ? i + 1 : T;
        __nv_bfloat16* p = PdS + row * (size_t)T;
        const float* dp = dP + row * (size_t)T;
        if (VEC == 4) {
            const int num_chunks = (num_keys + 3) / 4;
            for (int c = threadIdx.x; c < num_chunks; c += blockDim.x) {
                float pv[4];
                unpack_bf16x4(reinterpret_cast<const uint2*>(p)[c], pv);
                float4 g4 = reinterpret_cast<const float4*>(dp)[c];
                float g[4] = {g4.x, g4.y, g4.z, g4.w};
                float y[4];
                for (int e = 0; e < 4; e++) y[e] = 4 * c + e < num_keys ? pv[e] * (g[e] - D) * scale : 0.0f;
                reinterpret_cast<uint2*>(p)[c] = pack_bf16x4(y[0], y[1], y[2], y[3]);
            }
        } else {
            for (int j = threadIdx.x; j < num_keys; j += blockDim.x)
                p[j] = __float2bfloat16(__bfloat162float(p[j]) * (dp[j] - D) * scale);
        }
    }
}

// Gathers rows (b, t, h) of HD bf16 at src + (b·T + t)·stride + h·HD into dst (B, NH, T, HD), contiguous.
__global__ void gather_heads_kernel(__nv_bfloat16* dst, const __nv_bfloat16* src, long stride, int T, int NH, int HD,
                                    size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % HD);
        const size_t row = i / HD;  // (b·NH + h)·T + t
        const int t = (int)(row % T), h = (int)(row / T % NH);
        const size_t b = row / T / NH;
        dst[i] = src[(b * T + t) * (size_t)stride + (size_t)h * HD + d];
    }
}

// ---- host side -------------------------------------------------------------------------------------

static void naive_fail(const char* what, const char* why) {
    fprintf(stderr, "error: naive attention %s: %s\n", what, why);
    exit(EXIT_FAILURE);
}

// The checks cuBLAS and the kernels rely on, with what to change when one fails.
static void naive_check_args(const AttentionContext* ctx, const AttentionArgs* args, const char* what,
                             int needs_saved) {
    if (ctx == NULL || ctx->cublas == NULL)
        naive_fail(what, "AttentionContext.cublas is NULL; create a handle with cublasCreate and pass it");
    if ((needs_saved && args->saved == NULL) || args->workspace == NULL)
        naive_fail(what, "saved or workspace is NULL; allocate attention_saved_bytes() and "
                         "attention_workspace_bytes() for this shape and pass them");
    if (args->qkv_stride > INT_MAX || args->out_stride > INT_MAX || args->dqkv_stride > INT_MAX ||
        attention_kv_stride(args) > INT_MAX || attention_dkv_stride(args) > INT_MAX)
        naive_fail(what, "a row stride exceeds INT_MAX elements, more than cuBLAS leading dimensions allow");
}

// Threads per row: enough to cover a row in a few steps, a multiple of 32, at most 512.
static int row_threads(int T) {
    if (T <= 512) return 64;
    if (T <= 2048) return 128;
    if (T <= 8192) return 256;
    return 512;
}

static unsigned row_blocks(size_t rows) { return (unsigned)(rows < (size_t)INT_MAX ? rows : (size_t)INT_MAX); }

// C = op(A) · op(B), one call per batch index over NH heads; alpha = 1, beta = 0, fp32 accumulation.
static void gemm_heads(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                       const void* A, long lda, long long stride_a, const void* B, long ldb, long long stride_b,
                       void* C, cudaDataType c_type, long ldc, long long stride_c, int heads) {
    const float alpha = 1.0f, beta = 0.0f;
    ATTN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_a, op_b, m, n, k, &alpha, A, CUDA_R_16BF, (int)lda, stride_a, B,
                                            CUDA_R_16BF, (int)ldb, stride_b, &beta, C, c_type, (int)ldc, stride_c,
                                            heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static size_t naive_scores(const AttentionShape* s) { return (size_t)s->B * s->NH * (size_t)s->T * s->T; }

size_t naive_attention_saved_bytes(const AttentionShape* s) { return naive_scores(s) * sizeof(__nv_bfloat16); }  // P

// With GQA, the gathered Q and dO (B, NH, T, HD) bf16 each, after the score matrices (256-aligned).
static size_t naive_gather_bytes(const AttentionShape* s) {
    return s->NKV == s->NH ? 0 : 2 * (size_t)s->B * s->NH * s->T * s->HD * sizeof(__nv_bfloat16);
}
static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

size_t naive_attention_workspace_bytes(const AttentionShape* s) {
    return align256(naive_scores(s) * sizeof(float)) + naive_gather_bytes(s);  // S, dP; gathered Q, dO
}

size_t naive_recompute_attention_workspace_bytes(const AttentionShape* s) {
    // S or dP fp32, then P or dS bf16; gathered Q, dO
    return align256(naive_scores(s) * (sizeof(float) + sizeof(__nv_bfloat16))) + naive_gather_bytes(s);
}

// S (B, NH, T, T) fp32 = Q Kᵀ (unscaled), every (b, h): per b, one call per query head j of the
// groups (batched over the NKV K/V heads).
static void naive_scores_gemm(const AttentionContext* ctx, const AttentionArgs* args, float* S) {
    const AttentionShape* s = &args->shape;
    const int T = s->T, NH = s->NH, HD = s->HD, G = NH / s->NKV;
    const size_t TT = (size_t)T * T;
    const long kv_stride = attention_kv_stride(args);
    for (int b = 0; b < s->B; b++) {  // S = Q Kᵀ: Sc = Kcᵀ · Qc
        const size_t q_b = (size_t)b * T * args->qkv_stride, kv_b = (size_t)b * T * kv_stride;
        for (int j = 0; j < G; j++)
            gemm_heads(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HD, args->k + kv_b, kv_stride, HD,
                       args->q + q_b + (size_t)j * HD, args->qkv_stride, (long long)G * HD,
                       S + ((size_t)b * NH + j) * TT, CUDA_R_32F, T, (long long)G * TT, s->NKV);
    }
}

// P (B, NH, T, T) bf16 = softmax of S · scale; writes args->lse, or reads it when lse_given.
static void naive_softmax(const AttentionArgs* args, __nv_bfloat16* P, const float* S, int lse_given,
                          cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    const int T = s->T;
    const size_t rows = (size_t)s->B * s->NH * T;
    const float scale = 1.0f / sqrtf((float)s->HD);
    const int vec = T % 4 == 0 && (uintptr_t)S % 16 == 0 && (uintptr_t)P % 8 == 0;
    const unsigned blocks = row_blocks(rows);
    const int threads = row_threads(T);
    if (vec && lse_given)
        softmax_forward_kernel<4, true><<<blocks, threads, 0, stream>>>(P, args->lse, S, T, rows, scale, s->causal);
    else if (vec)
        softmax_forward_kernel<4, false><<<blocks, threads, 0, stream>>>(P, args->lse, S, T, rows, scale, s->causal);
    else if (lse_given)
        softmax_forward_kernel<1, true><<<blocks, threads, 0, stream>>>(P, args->lse, S, T, rows, scale, s->causal);
    else
        softmax_forward_kernel<1, false><<<blocks, threads, 0, stream>>>(P, args->lse, S, T, rows, scale, s->causal);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

// The forward with P written to `P` (saved, or the recomputing variant's workspace).
static void naive_forward_into(const AttentionContext* ctx, const AttentionArgs* args, float* S, __nv_bfloat16* P,
                               cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    const int T = s->T, NH = s->NH, HD = s->HD, G = NH / s->NKV;
    const size_t TT = (size_t)T * T;
    const long kv_stride = attention_kv_stride(args);
    ATTN_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
    naive_scores_gemm(ctx, args, S);
    naive_softmax(args, P, S, 0, stream);
    for (int b = 0; b < s->B; b++) {  // O = P V: Oc = Vc · Pc
        for (int j = 0; j < G; j++)
            gemm_heads(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, HD, T, T, args->v + (size_t)b * T * kv_stride, kv_stride,
                       HD, P + ((size_t)b * NH + j) * TT, T, (long long)G * TT,
                       args->out + (size_t)b * T * args->out_stride + (size_t)j * HD, CUDA_R_16BF, args->out_stride,
                       (long long)G * HD, s->NKV);
    }
}

// The backward from P in `P` (consumed: it becomes dS), with dP in `dP`.
static void naive_backward_from(const AttentionContext* ctx, const AttentionArgs* args, __nv_bfloat16* P, float* dP,
                                __nv_bfloat16* gathered, cudaStream_t stream);

// The gathered Q and dO (GQA only) at the end of the workspace, after `scores_bytes`.
static __nv_bfloat16* naive_gathered(const AttentionArgs* args, size_t scores_bytes) {
    if (naive_gather_bytes(&args->shape) == 0) return NULL;
    return (__nv_bfloat16*)((char*)args->workspace + align256(scores_bytes));
}

void naive_attention_forward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream) {
    naive_check_args(ctx, args, "forward", 1);
    naive_forward_into(ctx, args, (float*)args->workspace, (__nv_bfloat16*)args->saved, stream);
}

void naive_attention_backward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream) {
    naive_check_args(ctx, args, "backward", 1);
    ATTN_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
    naive_backward_from(ctx, args, (__nv_bfloat16*)args->saved, (float*)args->workspace,
                        naive_gathered(args, naive_scores(&args->shape) * sizeof(float)), stream);
}

// Recomputing variant: workspace = [S or dP fp32 (B, NH, T, T)][P or dS bf16 (B, NH, T, T)].
void naive_recompute_attention_forward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream) {
    naive_check_args(ctx, args, "forward", 0);
    float* S = (float*)args->workspace;
    naive_forward_into(ctx, args, S, (__nv_bfloat16*)(S + naive_scores(&args->shape)), stream);
}

void naive_recompute_attention_backward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream) {
    naive_check_args(ctx, args, "backward", 0);
    float* S = (float*)args->workspace;
    __nv_bfloat16* P = (__nv_bfloat16*)(S + naive_scores(&args->shape));
    ATTN_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
    naive_scores_gemm(ctx, args, S);       // S again
    naive_softmax(args, P, S, 1, stream);  // P = exp(S · scale − LSE), from the forward's LSE
    naive_backward_from(ctx, args, P, S,
                        naive_gathered(args, naive_scores(&args->shape) * (sizeof(float) + sizeof(__nv_bfloat16))),
                        stream);
}

// Gathers rows of x (B, T, NH, HD) at `stride` into dst (B, NH, T, HD).
static void gather_heads(__nv_bfloat16* dst, const __nv_bfloat16* x, long stride, const AttentionShape* s,
                         cudaStream_t stream) {
    const size_t total = (size_t)s->B * s->NH * s->T * s->HD;
    const size_t blocks = (total + 255) / 256;
    gather_heads_kernel<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(
        dst, x, stride, s->T, s->NH, s->HD, total);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

static void naive_backward_from(const AttentionContext* ctx, const AttentionArgs* args, __nv_bfloat16* P, float* dP,
                                __nv_bfloat16* gathered, cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    const int T = s->T, NH = s->NH, HD = s->HD, NKV = s->NKV, G = NH / NKV;
    const size_t TT = (size_t)T * T, rows = (size_t)s->B * NH * T;
    const float scale = 1.0f / sqrtf((float)HD);
    const long kv_stride = attention_kv_stride(args), dkv_stride = attention_dkv_stride(args);

    // The k = G·T operands of dV and dK: dO and Q as they are (G = 1: k = T, heads HD apart), else
    // gathered head-major, so that a group's G heads are one (G·T, HD) matrix.
    const __nv_bfloat16 *dout_k = args->dout, *q_k = args->q;
    long dout_ld = args->out_stride, q_ld = args->qkv_stride, dout_b = (long)T * args->out_stride,
         q_b = (long)T * args->qkv_stride;
    long long group_stride = HD;  // from one K/V head's group to the next
    if (G > 1) {
        __nv_bfloat16* dout_g = gathered;
        __nv_bfloat16* q_g = gathered + rows * HD;
        gather_heads(dout_g, args->dout, args->out_stride, s, stream);
        gather_heads(q_g, args->q, args->qkv_stride, s, stream);
        dout_k = dout_g, q_k = q_g;
        dout_ld = q_ld = HD;
        dout_b = q_b = (long)NH * T * HD;
        group_stride = (long long)G * T * HD;
    }

    for (int b = 0; b < s->B; b++) {
        const size_t kv_b = (size_t)b * T * kv_stride, out_b = (size_t)b * T * args->out_stride;
        const size_t dkv_b = (size_t)b * T * dkv_stride;
        __nv_bfloat16* P_b = P + (size_t)b * NH * TT;
        // dV = Σ_group Pᵀ dO: dVc = dOc · Pcᵀ, k = G·T (the group's query heads and queries)
        gemm_heads(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, HD, T, G * T, dout_k + (size_t)b * dout_b, dout_ld,
                   group_stride, P_b, T, (long long)G * TT, args->dv + dkv_b, CUDA_R_16BF, dkv_stride, HD, NKV);
        // dP = dO Vᵀ: dPc = Vcᵀ · dOc, per query head j of the groups
        for (int j = 0; j < G; j++)
            gemm_heads(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HD, args->v + kv_b, kv_stride, HD,
                       args->dout + out_b + (size_t)j * HD, args->out_stride, (long long)G * HD,
                       dP + ((size_t)b * NH + j) * TT, CUDA_R_32F, T, (long long)G * TT, NKV);
    }

    const int vec = T % 4 == 0 && (uintptr_t)dP % 16 == 0 && (uintptr_t)P % 8 == 0;
    if (vec)
        softmax_backward_kernel<4><<<row_blocks(rows), row_threads(T), 0, stream>>>(
            P, dP, args->out, args->dout, args->out_stride, T, NH, HD, rows, scale, s->causal);
    else
        softmax_backward_kernel<1><<<row_blocks(rows), row_threads(T), 0, stream>>>(
            P, dP, args->out, args->dout, args->out_stride, T, NH, HD, rows, scale, s->causal);
    ATTN_CUDA_CHECK(cudaGetLastError());

    for (int b = 0; b < s->B; b++) {
        const size_t kv_b = (size_t)b * T * kv_stride, dq_b = (size_t)b * T * args->dqkv_stride;
        const size_t dkv_b = (size_t)b * T * dkv_stride;
        const __nv_bfloat16* dS_b = P + (size_t)b * NH * TT;
        // dQ = dS K: dQc = Kc · dSc, per query head j of the groups
        for (int j = 0; j < G; j++)
            gemm_heads(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, HD, T, T, args->k + kv_b, kv_stride, HD,
                       dS_b + (size_t)j * TT, T, (long long)G * TT, args->dq + dq_b + (size_t)j * HD, CUDA_R_16BF,
                       args->dqkv_stride, (long long)G * HD, NKV);
        // dK = Σ_group dSᵀ Q: dKc = Qc · dScᵀ, k = G·T
        gemm_heads(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, HD, T, G * T, q_k + (size_t)b * q_b, q_ld, group_stride,
                   dS_b, T, (long long)G * TT, args->dk + dkv_b, CUDA_R_16BF, dkv_stride, HD, NKV);
    }
}
