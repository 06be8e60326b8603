// matmul.cuh: the trainer's linear layers, every GEMM through cuBLASLt (bf16 in and out, fp32
// accumulation, fp32 scale), with bias, GELU and their gradients fused into cuBLASLt epilogues or
// into small kernels, whichever is faster for the shape.
//
// Tensors, row-major as everywhere in the trainer (weights in nn.Linear's (out, in) layout):
//   inp (N, IC)  weight (OC, IC)  bias (OC) or NULL  out (N, OC)  gelu_pre (N, OC) or NULL
// N = B·T rows (up to 16·8192); IC, OC multiples of 8 (up to 4·2560 and the padded vocab 50304).
//
// matmul_forward:   out = inp · weightᵀ + bias
//   with gelu_pre:  gelu_pre = inp · weightᵀ + bias (the pre-activation, saved for the backward)
//                   out = GELU(gelu_pre), tanh approximation, from the fp32 pre-activation
//   The LM head, logits (N, Vp) = lnf (N, C) · wteᵀ, is matmul_forward(weight = wte (Vp, C), bias NULL).
// matmul_forward_residual: out = residual (N, OC) + inp · weightᵀ + bias, the residual added in the
//   GEMM's epilogue (the attention and MLP projections, whose outputs join the residual stream).
// matmul_backward, given dout (N, OC) and the forward's inp and weight:
//   dinp (N, IC)    = dout · weight                         OVERWRITTEN (skipped when dinp is NULL)
//     with gelu_pre (N, IC), the saved pre-activation of the GELU that PRODUCED inp (inp = GELU(gelu_pre),
//     e.g. the MLP's projection, whose input is GELU(fc output)):
//                   dinp = GELU'(gelu_pre) ∘ (dout · weight), the gradient of gelu_pre, i.e. of the
//                   previous linear layer's output; the dGELU multiplies the dinp GEMM's result.
//   dweight (OC, IC) = doutᵀ · inp        (+= when accumulate, = otherwise)
//   dbias (OC)       = Σ_n dout[n, :]     (+= when accumulate, = otherwise; skipped when dbias is NULL)
//   The LM head's backward, matmul_backward(dweight = dwte, dbias NULL, accumulate = 1), adds
//   dlogitsᵀ · lnf into the tied embedding's gradient.
// matmul_backward_dgelu_dbias: matmul_backward, and also, with gelu_pre, the bias gradient of the
//   layer that produced gelu_pre: dbias_pre (IC) (+)= Σ_n dinp[n, :] (the MLP's fc bias, computed while
//   its gradient dinp is made, so that the fc layer's own backward passes dbias NULL).
//
// Row-major ↔ cuBLASLt (column-major): a row-major (R, C) matrix is the column-major (C, R) matrix
// with leading dimension C, the same bytes. Each GEMM is therefore written on the transposes; the
// mapping is spelled out above each call (Xᶜ = the column-major view of row-major X, (rows, cols)).
//
// Paths (ctx->fusion):
//   forward GELU       GELU_AUX(_BIAS) epilogue (aux = gelu_pre), or BIAS/DEFAULT + GELU kernel
//   backward dGELU     DGELU epilogue (aux = gelu_pre), or DEFAULT + dGELU kernel
//   dGELU + dbias_pre  DGELU_BGRAD epilogue; or the dGELU path above + the dbias reduction on dinp;
//                      or DEFAULT + one kernel doing the dGELU and the dbias reduction's first pass
//   backward dbias     BGRADB on the dweight GEMM (Σ over k = N of op(B) = doutᶜᵀ: the column sums of
//                      dout), or DEFAULT + the dbias reduction kernels
//   MATMUL_FUSE_AUTO (the default) times the paths of each shape once, at its first call, and keeps
//   the fastest for the context's life (untimed, with ctx->tune = 0: the epilogues, except the DGELU
//   path + reduction for dbias_pre); MATMUL_FUSE_EPILOGUES takes the epilogue wherever cuBLASLt has an
//   algorithm for it; MATMUL_FUSE_NONE always the kernels (gelu.cuh: GELU of the bf16
//   pre-activation, dGELU of the bf16 dinp; dbias by a deterministic two-pass reduction: fp32 partial
//   sums per row chunk, then a fixed-order sum). ctx->last_* say which path ran.
// Algorithms (ctx->tune = 1; 0 after matmul_context_create): at the first GEMM of each shape (sizes, layouts, epilogue,
// alignment, beta), the MATMUL_TUNE_CANDIDATES best algorithms of cuBLASLt's heuristic are timed on
// the call's own buffers (an output read because beta != 0 is saved and restored around the timing)
// and the fastest is cached for the context's life; the heuristic's first stays unless another is
// at least MATMUL_TUNE_MARGIN faster. ctx->tune = 0 takes the heuristic's first and fixed paths, a
// choice that does not depend on timing: the same bits in every process (train_gpt --deterministic,
// and naive or flash1 attention). MATMUL_TUNE_LOG=1 in the environment prints every timing and
// choice to stderr.
//
// Streams: everything runs on ctx->stream (the dweight half on a second stream beside the dinp half
// is no faster on an H100: layers/PERF_NOTES.md).
// Determinism: every path gives the same bits run to run within a context (cuBLASLt documents bitwise
// reproducibility for a fixed algorithm and workspace size; each GEMM runs on one stream; the reduction kernels sum in a
// fixed order); test/test_gpu_matmul.cu checks it.
// Errors: sizes that are not multiples of 8, pointers not 16-byte aligned, or a cuBLASLt with no
// algorithm for a GEMM end the program with a message saying what to change.
#ifndef MATMUL_CUH
#define MATMUL_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_common.h"
#include "layers/model/gelu.cuh"
#include "layers/model/matmul_lt.cuh"

// ---- sizes and checks ---------------------------------------------------------------------------

#define MATMUL_DBIAS_MAX_CHUNKS 64     // row chunks of the dbias reduction kernel for OC >= MATMUL_DBIAS_WIDE
#define MATMUL_DBIAS_WIDE 8192         // narrower outputs get more chunks (as many partial sums in all),
                                       // so that their grid still fills the GPU
#define MATMUL_DBIAS_MIN_CHUNK_ROWS 64

// Row chunks of the dbias reduction for N rows and OC columns: one per 64 rows, at most
// 64·max(OC, 8192)/OC (so at most 64·max(OC, 8192) partial sums).
static inline int matmul_dbias_chunks(int N, int OC) {
    const long long wide = OC > MATMUL_DBIAS_WIDE ? OC : MATMUL_DBIAS_WIDE;
    const int most = (int)(MATMUL_DBIAS_MAX_CHUNKS * wide / (OC > 0 ? OC : 1));
    const int chunks = (N + MATMUL_DBIAS_MIN_CHUNK_ROWS - 1) / MATMUL_DBIAS_MIN_CHUNK_ROWS;
    return chunks < 1 ? 1 : (chunks > most ? most : chunks);
}

// Bytes of the dbias scratch matmul_backward needs for N rows and OC outputs: the fp32 partial sums
// (chunks, OC), bounded by min(ceil(N / 64)·OC, 64·max(OC, 8192)) values. Non-decreasing in N and
// OC: the value for the largest N and OC serves every call.
static inline size_t matmul_dbias_scratch_bytes(int N, int OC) {
    const size_t by_rows = (size_t)((N + MATMUL_DBIAS_MIN_CHUNK_ROWS - 1) / MATMUL_DBIAS_MIN_CHUNK_ROWS) * (size_t)OC;
    const size_t most = (size_t)MATMUL_DBIAS_MAX_CHUNKS * (size_t)(OC > MATMUL_DBIAS_WIDE ? OC : MATMUL_DBIAS_WIDE);
    const size_t values = by_rows < most ? by_rows : most;
    return (values > (size_t)OC ? values : (size_t)OC) * sizeof(float);
}

// 0 when N, IC, OC are usable; otherwise -1 and a message in why saying what to change.
static inline int matmul_check_sizes(int N, int IC, int OC, char* why, size_t why_size) {
    if (N < 1) {
        snprintf(why, why_size, "N = %d rows; it must be at least 1 (N = batch size × sequence length)", N);
        return -1;
    }
    if (IC < 8 || IC % 8 != 0 || OC < 8 || OC % 8 != 0) {
        const char* which = (IC < 8 || IC % 8 != 0) ? "IC" : "OC";
        snprintf(why, why_size,
                 "%s = %d (IC = %d, OC = %d) is not a positive multiple of 8; the bf16 tensor-core GEMMs need the "
                 "channel sizes to be multiples of 8 (16 bytes): choose a hidden size that is a multiple of 8, "
                 "and pad the vocabulary to a multiple of 128 as gpt_config.h does",
                 which, which[0] == 'I' ? IC : OC, IC, OC);
        return -1;
    }
    return 0;
}

// 0 when pointer p (named name, for the message) is non-NULL and 16-byte aligned; -1 and a message otherwise.
static inline int matmul_check_pointer(const char* name, const void* p, char* why, size_t why_size) {
    if (p == NULL) {
        snprintf(why, why_size, "%s is NULL; pass a device buffer of the size in matmul.cuh's header comment", name);
        return -1;
    }
    if ((uintptr_t)p % 16 != 0) {
        snprintf(why, why_size,
                 "%s (%p) is not 16-byte aligned; cuBLASLt and the vectorized kernels need 16-byte alignment: "
                 "allocate with cudaMalloc (256-byte aligned) and keep offsets into shared buffers multiples "
                 "of 8 bf16 elements",
                 name, p);
        return -1;
    }
    return 0;
}

static inline void matmul_die(const char* fn, const char* why) {
    fprintf(stderr, "error: %s: %s\n", fn, why);
    exit(1);
}

static inline void matmul_require_sizes(const char* fn, int N, int IC, int OC) {
    char why[512];
    if (matmul_check_sizes(N, IC, OC, why, sizeof(why)) != 0) matmul_die(fn, why);
}

static inline void matmul_require_pointer(const char* fn, const char* name, const void* p) {
    char why[512];
    if (matmul_check_pointer(name, p, why, sizeof(why)) != 0) matmul_die(fn, why);
}

// ---- kernels for the unfused paths ---------------------------------------------------------------

// GELU and its gradient for these paths are gelu_forward / gelu_backward (gelu.cuh).

#define MATMUL_DBIAS_THREADS_X 32  // column groups of 8 per block: 256 columns
#define MATMUL_DBIAS_THREADS_Y 8   // rows read at once per block
#define MATMUL_DBIAS_ROWS_IN_FLIGHT 4  // rows each thread loads before adding any

// Pass 1 of dbias: partial (chunks, OC) fp32, partial[c][o] = Σ of g[n][o] over rows n of chunk c =
// blockIdx.y (rows_per_chunk rows), in a fixed order, where g = dout (N, OC) bf16 (rows ld elements
// apart), or, with gelu_pre (N, OC) non-NULL (then ld = OC), g = bf16(dout · GELU'(gelu_pre)), which
// is also written to dgelu_out (N, OC) (may be dout: in place), or, with row_weights (N) non-NULL,
// g[n][o] = row_weights[n]·dout[n][o] (a vector-matrix product). Grid (ceil(OC / 256), chunks),
// block (32, 8); thread x sums columns 8x..8x+7 of its block over rows y, y + 8, ..., then the 8 row
// groups are added in order y = 0..7.
static __global__ void matmul_dbias_partial_kernel(float* partial, const __nv_bfloat16* dout,
                                                   const __nv_bfloat16* gelu_pre, __nv_bfloat16* dgelu_out,
                                                   const __nv_bfloat16* row_weights, int N, int OC, long ld,
                                                   int rows_per_chunk) {
    __shared__ float sums[MATMUL_DBIAS_THREADS_Y][MATMUL_DBIAS_THREADS_X * 8];
    const int col = (blockIdx.x * MATMUL_DBIAS_THREADS_X + threadIdx.x) * 8;
    const int row_begin = blockIdx.y * rows_per_chunk;
    const int row_end = min(N, row_begin + rows_per_chunk);
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = 0.0f;
    if (col < OC) {
        // MATMUL_DBIAS_ROWS_IN_FLIGHT rows' loads issued before any is used (one at a time reached 74%
        // of the copy rate); the rows are still added in order r = row_begin + threadIdx.y, + 8, ...
        constexpr int R = MATMUL_DBIAS_ROWS_IN_FLIGHT, STEP = MATMUL_DBIAS_THREADS_Y;
        for (int r0 = row_begin + threadIdx.y; r0 < row_end; r0 += R * STEP) {
            uint4 g[R], pre[R];
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int r = r0 + u * STEP;
                if (r < row_end) {
                    g[u] = load16_stream(dout + (size_t)r * ld + col);
                    if (gelu_pre) pre[u] = load16_stream(gelu_pre + (size_t)r * ld + col);
                }
            }
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int r = r0 + u * STEP;
                if (r >= row_end) break;
                float f[8];
                bf16x8_unpack(f, g[u]);
                if (gelu_pre) {
                    float x[8];
                    bf16x8_unpack(x, pre[u]);
                    for (int j = 0; j < 8; j++) f[j] *= gelu_grad_f32(x[j]);
                    const uint4 packed = bf16x8_pack(f);
                    store16(dgelu_out + (size_t)r * ld + col, packed);
                    bf16x8_unpack(f, packed);  // sum what was stored, as the other paths do
                }
                if (row_weights) {
                    const float w = __bfloat162float(row_weights[r]);
                    for (int j = 0; j < 8; j++) f[j] *= w;
                }
                for (int j = 0; j < 8; j++) acc[j] += f[j];
            }
        }
    }
    for (int j = 0; j < 8; j++) sums[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
    __syncthreads();
    const int t = threadIdx.y * MATMUL_DBIAS_THREADS_X + threadIdx.x;  // column within the block
    const int o = blockIdx.x * MATMUL_DBIAS_THREADS_X * 8 + t;
    if (o < OC) {
        float s = 0.0f;
        for (int y = 0; y < MATMUL_DBIAS_THREADS_Y; y++) s += sums[y][t];
        partial[(size_t)blockIdx.y * OC + o] = s;
    }
}

// Pass 2 of dbias: dbias[o] (OC) = Σ_c partial[c][o] over c = 0..chunks-1 in order, plus the old
// dbias[o] when accumulate.
static __global__ void matmul_dbias_finish_kernel(__nv_bfloat16* dbias, const float* partial, int chunks, int OC,
                                                  int accumulate) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float s = 0.0f;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * OC + o];
    if (accumulate) s += __bfloat162float(dbias[o]);
    dbias[o] = __float2bfloat16(s);
}

// dbias (OC) += grad (OC), both bf16 (a bias-gradient epilogue's result when accumulating).
static __global__ void matmul_dbias_add_kernel(__nv_bfloat16* dbias, const __nv_bfloat16* grad, int OC) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < OC) dbias[o] = __float2bfloat16(__bfloat162float(dbias[o]) + __bfloat162float(grad[o]));
}

// One pass of the reduction (and the dGELU, with gelu_pre): see matmul_dbias_partial_kernel.
typedef struct {
    float* partial;
    const __nv_bfloat16* dout;
    const __nv_bfloat16* gelu_pre;  // NULL: no dGELU
    __nv_bfloat16* dgelu_out;
    int N, OC;
    long ld;                           // elements between rows of dout (OC with gelu_pre)
    const __nv_bfloat16* row_weights;  // NULL, or (N): weighted sums
} MatmulDbiasPass;

static inline int matmul_dbias_pass(MatmulContext* ctx, const void* arg) {
    const MatmulDbiasPass* a = (const MatmulDbiasPass*)arg;
    const int chunks = matmul_dbias_chunks(a->N, a->OC);
    const int rows_per_chunk = (a->N + chunks - 1) / chunks;
    dim3 grid((a->OC + MATMUL_DBIAS_THREADS_X * 8 - 1) / (MATMUL_DBIAS_THREADS_X * 8), chunks);
    dim3 block(MATMUL_DBIAS_THREADS_X, MATMUL_DBIAS_THREADS_Y);
    matmul_dbias_partial_kernel<<<grid, block, 0, ctx->stream>>>(a->partial, a->dout, a->gelu_pre, a->dgelu_out,
                                                                 a->row_weights, a->N, a->OC, a->ld, rows_per_chunk);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

// dbias (+)= the partial sums of pass a, added up (pass 2).
static inline void matmul_dbias_both_passes(MatmulContext* ctx, __nv_bfloat16* dbias, const MatmulDbiasPass* a,
                                            int accumulate) {
    matmul_dbias_pass(ctx, a);
    matmul_dbias_finish_kernel<<<(a->OC + 255) / 256, 256, 0, ctx->stream>>>(
        dbias, a->partial, matmul_dbias_chunks(a->N, a->OC), a->OC, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// dbias (OC) (+)= column sums of dout (N, OC), or of dout·GELU'(gelu_pre), then written to dgelu_out;
// scratch: matmul_dbias_scratch_bytes(N, OC).
static inline void matmul_dbias_reduce(MatmulContext* ctx, __nv_bfloat16* dbias, void* scratch,
                                       const __nv_bfloat16* dout, const __nv_bfloat16* gelu_pre,
                                       __nv_bfloat16* dgelu_out, int N, int OC, int accumulate) {
    const MatmulDbiasPass a = {(float*)scratch, dout, gelu_pre, dgelu_out, N, OC, OC, NULL};
    matmul_dbias_both_passes(ctx, dbias, &a, accumulate);
}

// dbias (OC) (+)= a bias-gradient epilogue's result: already in dbias when it was written there
// (not accumulating), otherwise in the scratch, added now.
static inline void matmul_dbias_from_epilogue(MatmulContext* ctx, __nv_bfloat16* dbias, const void* scratch, int OC,
                                              int accumulate) {
    if (!accumulate) return;
    matmul_dbias_add_kernel<<<(OC + 255) / 256, 256, 0, ctx->stream>>>(dbias, (const __nv_bfloat16*)scratch, OC);
    CUDA_CHECK(cudaGetLastError());
}

// The elementwise kernels as timed work.
typedef struct {
    __nv_bfloat16* out;
    const __nv_bfloat16* inp;
    const __nv_bfloat16* pre;  // backward only
    size_t n;
} MatmulGeluWork;

static inline int matmul_gelu_forward_work(MatmulContext* ctx, const void* arg) {
    const MatmulGeluWork* a = (const MatmulGeluWork*)arg;
    gelu_forward(a->out, a->inp, a->n, ctx->stream);
    return 0;
}

static inline int matmul_gelu_backward_work(MatmulContext* ctx, const void* arg) {
    const MatmulGeluWork* a = (const MatmulGeluWork*)arg;
    gelu_backward(a->out, a->inp, a->pre, a->n, ctx->stream);
    return 0;
}

// Adds b to a cost (either negative: unavailable).
static inline float matmul_cost_add(float a, float b) { return a < 0.0f || b < 0.0f ? -1.0f : a + b; }

// ---- forward ------------------------------------------------------------------------------------

// Which forward-GELU path to take (0 epilogue, 1 kernel) for fused / plain (plain writes gelu_pre).
static inline int matmul_gelu_path(MatmulContext* ctx, const MatmulLtGemm* fused, const MatmulLtGemm* plain,
                                   __nv_bfloat16* out, const __nv_bfloat16* gelu_pre, int N, int IC, int OC) {
    if (ctx->fusion == MATMUL_FUSE_NONE) return 1;
    if (ctx->fusion == MATMUL_FUSE_EPILOGUES) return 0;
    const int has_bias = fused->bias != NULL;
    int path = matmul_path_find(ctx, MATMUL_CHOICE_GELU, N, IC, OC, 0, has_bias);
    if (path >= 0) return path;
    if (!matmul_timing_on(ctx)) return 0;
    MatmulGeluWork w = {out, gelu_pre, NULL, (size_t)N * OC};
    float cost[2];
    cost[0] = matmul_lt_gemm_ms(ctx, fused);
    cost[1] = matmul_cost_add(matmul_lt_gemm_ms(ctx, plain), matmul_time_work(ctx, matmul_gelu_forward_work, &w));
    return matmul_path_choose(ctx, MATMUL_CHOICE_GELU, N, IC, OC, 0, has_bias, cost, 2);
}

// out (N, OC) = inp (N, IC) · weight (OC, IC)ᵀ + bias (OC, or NULL); with gelu_pre (N, OC) non-NULL:
// gelu_pre = that, out = GELU(gelu_pre). Runs on ctx->stream.
static inline void matmul_forward(MatmulContext* ctx, __nv_bfloat16* out, const __nv_bfloat16* inp,
                                  const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int IC, int OC,
                                  __nv_bfloat16* gelu_pre) {
    const char* fn = "matmul_forward";
    matmul_require_sizes(fn, N, IC, OC);
    matmul_require_pointer(fn, "out", out);
    matmul_require_pointer(fn, "inp", inp);
    matmul_require_pointer(fn, "weight", weight);
    if (bias) matmul_require_pointer(fn, "bias", bias);
    if (gelu_pre) matmul_require_pointer(fn, "gelu_pre", gelu_pre);

    // outᶜ (OC, N) = weightᶜᵀ (OC, IC) · inpᶜ (IC, N):
    //   A = weight, stored (IC, OC) ld IC, op T;  B = inp, stored (IC, N) ld IC, op N;
    //   D = out (OC, N) ld OC;  m = OC, n = N, k = IC;  bias (m = OC) is added to every column of D
    //   (every row of out);  GELU aux = gelu_pre, laid out like D: (OC, N) ld OC.
    MatmulLtGemm g = matmul_lt_plain("matmul_forward (out = inp·weightᵀ)", CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC,
                                     weight, IC, inp, IC, out, OC, 0.0f);
    if (bias) {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        g.bias = bias;
    }
    if (!gelu_pre) {
        matmul_lt_gemm(ctx, &g, 0);
        ctx->last_forward = bias ? "BIAS epilogue" : "DEFAULT epilogue";
        return;
    }
    MatmulLtGemm fused = g;
    fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    fused.aux = gelu_pre;
    fused.aux_ld = OC;
    MatmulLtGemm plain = g;  // the GEMM (+ bias) writes the pre-activation, then out = GELU(gelu_pre)
    plain.D = gelu_pre;
    if (matmul_gelu_path(ctx, &fused, &plain, out, gelu_pre, N, IC, OC) == 0) {
        if (matmul_lt_gemm(ctx, &fused, 1)) {
            ctx->last_forward = bias ? "GELU_AUX_BIAS epilogue" : "GELU_AUX epilogue";
            return;
        }
        matmul_note_fallback(ctx, fused.epilogue, fn);
    }
    matmul_lt_gemm(ctx, &plain, 0);
    gelu_forward(out, gelu_pre, (size_t)N * OC, ctx->stream);
    ctx->last_forward = bias ? "BIAS epilogue + GELU kernel" : "DEFAULT epilogue + GELU kernel";
}

// out (N, OC) = residual (N, OC) + inp (N, IC) · weight (OC, IC)ᵀ + bias (OC, or NULL): a projection
// whose output joins the residual stream, the add done in the GEMM's epilogue (beta = 1, C =
// residual) from the fp32 product. That saves the next LayerNorm reading the product and writing the
// sum. out must not overlap residual unless it is residual itself. Runs on ctx->stream.
static inline void matmul_forward_residual(MatmulContext* ctx, __nv_bfloat16* out, const __nv_bfloat16* residual,
                                           const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                                           const __nv_bfloat16* bias, int N, int IC, int OC) {
    const char* fn = "matmul_forward_residual";
    matmul_require_sizes(fn, N, IC, OC);
    matmul_require_pointer(fn, "out", out);
    matmul_require_pointer(fn, "residual", residual);
    matmul_require_pointer(fn, "inp", inp);
    matmul_require_pointer(fn, "weight", weight);
    if (bias) matmul_require_pointer(fn, "bias", bias);
    const size_t bytes = (size_t)N * OC * sizeof(__nv_bfloat16);
    const char *o = (const char*)out, *r = (const char*)residual;
    if (o != r && o < r + bytes && r < o + bytes) matmul_die(fn, "out overlaps residual without being it");
    // outᶜ (OC, N) = weightᶜᵀ (OC, IC) · inpᶜ (IC, N) + residualᶜ (OC, N): matmul_forward's mapping
    // with C = residual, laid out like D (ld OC).
    MatmulLtGemm g = matmul_lt_plain("matmul_forward_residual (out = residual + inp·weightᵀ)", CUBLAS_OP_T,
                                     CUBLAS_OP_N, OC, N, IC, weight, IC, inp, IC, out, OC, 1.0f);
    g.C = residual == out ? NULL : residual;
    if (bias) {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        g.bias = bias;
    }
    matmul_lt_gemm(ctx, &g, 0);
    ctx->last_forward = bias ? "BIAS epilogue, residual as C" : "DEFAULT epilogue, residual as C";
}

// ---- backward -----------------------------------------------------------------------------------

// Which dGELU path (0 DGELU epilogue, 1 GEMM + dGELU kernel); with cost_out non-NULL also its time
// in *cost_out (-1 when untimed).
static inline int matmul_dgelu_path(MatmulContext* ctx, const MatmulLtGemm* fused, const MatmulLtGemm* plain,
                                    const __nv_bfloat16* gelu_pre, int N, int IC, int OC, float* cost_out) {
    if (cost_out) *cost_out = -1.0f;
    if (ctx->fusion == MATMUL_FUSE_NONE) return 1;
    if (ctx->fusion == MATMUL_FUSE_EPILOGUES) return 0;
    int path = matmul_path_find(ctx, MATMUL_CHOICE_DGELU, N, IC, OC, 0, 0);
    if (path >= 0 && !cost_out) return path;
    if (!matmul_timing_on(ctx)) return path >= 0 ? path : 0;
    float cost[2];
    cost[0] = matmul_lt_gemm_ms(ctx, fused);
    MatmulGeluWork w = {(__nv_bfloat16*)plain->D, (const __nv_bfloat16*)plain->D, gelu_pre, (size_t)N * IC};
    cost[1] = matmul_cost_add(matmul_lt_gemm_ms(ctx, plain), matmul_time_work(ctx, matmul_gelu_backward_work, &w));
    if (path < 0) path = matmul_path_choose(ctx, MATMUL_CHOICE_DGELU, N, IC, OC, 0, 0, cost, 2);
    if (cost_out) *cost_out = cost[path];
    return path;
}

// Runs the dGELU path: dinp = GELU'(gelu_pre) ∘ (the GEMM of plain).
static inline void matmul_dgelu_run(MatmulContext* ctx, const MatmulLtGemm* fused, const MatmulLtGemm* plain,
                                    const __nv_bfloat16* gelu_pre, int N, int IC, int OC, const char* fn) {
    if (matmul_dgelu_path(ctx, fused, plain, gelu_pre, N, IC, OC, NULL) == 0) {
        if (matmul_lt_gemm(ctx, fused, 1)) {
            ctx->last_dinp = "DGELU epilogue";
            return;
        }
        matmul_note_fallback(ctx, fused->epilogue, fn);
    }
    matmul_lt_gemm(ctx, plain, 0);
    gelu_backward((__nv_bfloat16*)plain->D, (const __nv_bfloat16*)plain->D, gelu_pre, (size_t)N * IC, ctx->stream);
    ctx->last_dinp = "DEFAULT epilogue + dGELU kernel";
}

// Which dGELU + dbias_pre path: 0 DGELU_BGRAD epilogue, 1 the dGELU path + the reduction on dinp,
// 2 GEMM + the kernel doing both.
static inline int matmul_dgelu_dbias_path(MatmulContext* ctx, const MatmulLtGemm* fused_bgrad,
                                          const MatmulLtGemm* fused, const MatmulLtGemm* plain,
                                          const __nv_bfloat16* gelu_pre, void* scratch, int N, int IC, int OC,
                                          int accumulate) {
    if (ctx->fusion == MATMUL_FUSE_NONE) return 2;
    if (ctx->fusion == MATMUL_FUSE_EPILOGUES) return 0;
    int path = matmul_path_find(ctx, MATMUL_CHOICE_DGELU_DBIAS, N, IC, OC, accumulate, 1);
    if (path >= 0) return path;
    if (!matmul_timing_on(ctx)) return 1;  // untimed: DGELU_BGRAD ran at ~290 TFLOP/s on an H100, DGELU ~690
    __nv_bfloat16* dinp = (__nv_bfloat16*)plain->D;
    MatmulDbiasPass reduce = {(float*)scratch, dinp, NULL, NULL, N, IC, IC, NULL};
    MatmulDbiasPass dgelu_reduce = {(float*)scratch, dinp, gelu_pre, dinp, N, IC, IC, NULL};
    float cost[3], dgelu_cost;
    cost[0] = matmul_lt_gemm_ms(ctx, fused_bgrad);
    matmul_dgelu_path(ctx, fused, plain, gelu_pre, N, IC, OC, &dgelu_cost);
    cost[1] = matmul_cost_add(dgelu_cost, matmul_time_work(ctx, matmul_dbias_pass, &reduce));
    cost[2] = matmul_cost_add(matmul_lt_gemm_ms(ctx, plain), matmul_time_work(ctx, matmul_dbias_pass, &dgelu_reduce));
    return matmul_path_choose(ctx, MATMUL_CHOICE_DGELU_DBIAS, N, IC, OC, accumulate, 1, cost, 3);
}

// Which dbias path for the dweight GEMM: 0 BGRADB epilogue, 1 plain GEMM + the reduction kernels.
static inline int matmul_dbias_path(MatmulContext* ctx, const MatmulLtGemm* fused, const MatmulLtGemm* plain,
                                    const __nv_bfloat16* dout, void* scratch, int N, int IC, int OC, int accumulate) {
    if (ctx->fusion == MATMUL_FUSE_NONE) return 1;
    if (ctx->fusion == MATMUL_FUSE_EPILOGUES) return 0;
    int path = matmul_path_find(ctx, MATMUL_CHOICE_DBIAS, N, IC, OC, accumulate, 1);
    if (path >= 0) return path;
    if (!matmul_timing_on(ctx)) return 0;
    MatmulDbiasPass reduce = {(float*)scratch, dout, NULL, NULL, N, OC, OC, NULL};
    float cost[2];
    cost[0] = matmul_lt_gemm_ms(ctx, fused);
    cost[1] = matmul_cost_add(matmul_lt_gemm_ms(ctx, plain), matmul_time_work(ctx, matmul_dbias_pass, &reduce));
    return matmul_path_choose(ctx, MATMUL_CHOICE_DBIAS, N, IC, OC, accumulate, 1, cost, 2);
}

// dinp = GELU'(gelu_pre) ∘ (the GEMM of plain), and dbias_pre (IC) (+)= its column sums, by the
// path matmul_dgelu_dbias_path picks (fused: the DGELU epilogue, bgrad: DGELU_BGRAD).
static inline void matmul_dgelu_dbias_run(MatmulContext* ctx, const MatmulLtGemm* bgrad, const MatmulLtGemm* fused,
                                          const MatmulLtGemm* plain, const __nv_bfloat16* gelu_pre,
                                          __nv_bfloat16* dbias_pre, void* dbias_scratch, int N, int IC, int OC,
                                          int accumulate, const char* fn) {
    __nv_bfloat16* dinp = (__nv_bfloat16*)plain->D;
    int path = matmul_dgelu_dbias_path(ctx, bgrad, fused, plain, gelu_pre, dbias_scratch, N, IC, OC, accumulate);
    if (path == 0) {
        if (matmul_lt_gemm(ctx, bgrad, 1)) {
            matmul_dbias_from_epilogue(ctx, dbias_pre, dbias_scratch, IC, accumulate);
            ctx->last_dinp = "DGELU_BGRAD epilogue";
            ctx->last_dbias_pre = accumulate ? "DGELU_BGRAD epilogue + add kernel" : "DGELU_BGRAD epilogue";
            return;
        }
        matmul_note_fallback(ctx, bgrad->epilogue, fn);
        path = 2;
    }
    if (path == 1) {
        matmul_dgelu_run(ctx, fused, plain, gelu_pre, N, IC, OC, fn);
        matmul_dbias_reduce(ctx, dbias_pre, dbias_scratch, dinp, NULL, NULL, N, IC, accumulate);
        ctx->last_dbias_pre = "reduction kernel";
        return;
    }
    matmul_lt_gemm(ctx, plain, 0);
    matmul_dbias_reduce(ctx, dbias_pre, dbias_scratch, dinp, gelu_pre, dinp, N, IC, accumulate);
    ctx->last_dinp = "DEFAULT epilogue + dGELU in the reduction kernel";
    ctx->last_dbias_pre = "dGELU + reduction kernel";
}

// The dinp half of matmul_backward_dgelu_dbias (with dbias_pre), on ctx->stream.
static inline void matmul_backward_dinp(MatmulContext* ctx, __nv_bfloat16* dinp, const __nv_bfloat16* dout,
                                        const __nv_bfloat16* weight, int N, int IC, int OC,
                                        const __nv_bfloat16* gelu_pre, int accumulate, void* dbias_scratch,
                                        __nv_bfloat16* dbias_pre) {
    const char* fn = "matmul_backward";
    // dinpᶜ (IC, N) = weightᶜ (IC, OC) · doutᶜ (OC, N):
    //   A = weight, stored (IC, OC) ld IC, op N;  B = dout, stored (OC, N) ld OC, op N;
    //   D = dinp (IC, N) ld IC;  m = IC, n = N, k = OC;  DGELU aux = gelu_pre (N, IC) row-major =
    //   (IC, N) ld IC, laid out like D: D = GELU'(aux) ∘ (A·B), elementwise;  DGELU_BGRAD also writes
    //   the row sums of Dᶜ (m = IC values: the column sums of dinp) to the bias pointer.
    MatmulLtGemm g = matmul_lt_plain("matmul_backward (dinp = dout·weight)", CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC,
                                     weight, IC, dout, OC, dinp, IC, 0.0f);
    if (!gelu_pre) {
        matmul_lt_gemm(ctx, &g, 0);
        ctx->last_dinp = "DEFAULT epilogue";
        return;
    }
    MatmulLtGemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_DGELU;
    fused.aux = (void*)gelu_pre;  // read only
    fused.aux_ld = IC;
    if (!dbias_pre) {
        matmul_dgelu_run(ctx, &fused, &g, gelu_pre, N, IC, OC, fn);
        return;
    }
    MatmulLtGemm bgrad = fused;
    bgrad.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    bgrad.bias = accumulate ? dbias_scratch : (void*)dbias_pre;  // written, not accumulated
    matmul_dgelu_dbias_run(ctx, &bgrad, &fused, &g, gelu_pre, dbias_pre, dbias_scratch, N, IC, OC, accumulate, fn);
}

// The dweight (and dbias) half of matmul_backward_dgelu_dbias, on ctx->stream.
static inline void matmul_backward_dweight(MatmulContext* ctx, __nv_bfloat16* dweight, __nv_bfloat16* dbias,
                                           const __nv_bfloat16* dout, const __nv_bfloat16* inp, int N, int IC,
                                           int OC, int accumulate, void* dbias_scratch) {
    const char* fn = "matmul_backward";
    // dweightᶜ (IC, OC) = inpᶜ (IC, N) · doutᶜᵀ (N, OC):
    //   A = inp, stored (IC, N) ld IC, op N;  B = dout, stored (OC, N) ld OC, op T;
    //   D = dweight (IC, OC) ld IC;  m = IC, n = OC, k = N;  beta = 1 accumulates in place.
    //   BGRADB: Σ over k of op(B) (N, OC) = the column sums of dout, n = OC values, written (not
    //   accumulated) to the bias pointer: dbias itself, or the scratch when accumulating.
    MatmulLtGemm g = matmul_lt_plain("matmul_backward (dweight = doutᵀ·inp)", CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N,
                                     inp, IC, dout, OC, dweight, IC, accumulate ? 1.0f : 0.0f);
    ctx->last_dbias = "skipped";
    if (dbias) {
        MatmulLtGemm fused = g;
        fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        fused.bias = accumulate ? dbias_scratch : (void*)dbias;
        if (matmul_dbias_path(ctx, &fused, &g, dout, dbias_scratch, N, IC, OC, accumulate) == 0) {
            if (matmul_lt_gemm(ctx, &fused, 1)) {
                matmul_dbias_from_epilogue(ctx, dbias, dbias_scratch, OC, accumulate);
                ctx->last_dbias = accumulate ? "BGRADB epilogue + add kernel" : "BGRADB epilogue";
                return;
            }
            matmul_note_fallback(ctx, fused.epilogue, fn);
        }
    }
    matmul_lt_gemm(ctx, &g, 0);
    if (dbias) {
        matmul_dbias_reduce(ctx, dbias, dbias_scratch, dout, NULL, NULL, N, OC, accumulate);
        ctx->last_dbias = "reduction kernel";
    }
}

// Given dout (N, OC) and the forward's inp (N, IC) and weight (OC, IC):
//   dinp (N, IC) = dout · weight (overwritten; skipped when dinp is NULL); with gelu_pre (N, IC)
//     non-NULL, dinp = GELU'(gelu_pre) ∘ (dout · weight), for inp = GELU(gelu_pre);
//   dweight (OC, IC) (+)= doutᵀ · inp;   dbias (OC) (+)= column sums of dout (skipped when NULL);
//   dbias_pre (IC) (+)= column sums of the dinp written (needs dinp and gelu_pre; skipped when NULL);
//   "+=" when accumulate (micro-batches after the first, the tied LM head), "=" otherwise.
// dbias_scratch: device memory of matmul_dbias_scratch_bytes(N, max(OC, IC when dbias_pre)) bytes,
// 16-byte aligned, needed when dbias or dbias_pre is non-NULL (NULL otherwise); its contents on entry
// do not matter. Runs on ctx->stream.
static inline void matmul_backward_dgelu_dbias(MatmulContext* ctx, __nv_bfloat16* dinp, __nv_bfloat16* dweight,
                                               __nv_bfloat16* dbias, const __nv_bfloat16* dout,
                                               const __nv_bfloat16* inp, const __nv_bfloat16* weight, int N, int IC,
                                               int OC, const __nv_bfloat16* gelu_pre, int accumulate,
                                               void* dbias_scratch, __nv_bfloat16* dbias_pre) {
    const char* fn = "matmul_backward";
    matmul_require_sizes(fn, N, IC, OC);
    if (dinp) matmul_require_pointer(fn, "dinp", dinp);
    matmul_require_pointer(fn, "dweight", dweight);
    matmul_require_pointer(fn, "dout", dout);
    matmul_require_pointer(fn, "inp", inp);
    matmul_require_pointer(fn, "weight", weight);
    if (dinp && gelu_pre) matmul_require_pointer(fn, "gelu_pre", gelu_pre);
    if (dbias) matmul_require_pointer(fn, "dbias", dbias);
    if (dbias_pre) {
        if (!dinp || !gelu_pre)
            matmul_die(fn, "dbias_pre (the bias gradient of the layer that produced gelu_pre) needs dinp and gelu_pre");
        matmul_require_pointer(fn, "dbias_pre", dbias_pre);
    }
    if (dbias || dbias_pre) matmul_require_pointer(fn, "dbias_scratch", dbias_scratch);

    ctx->last_dinp = "skipped";
    ctx->last_dbias_pre = "skipped";
    if (dinp) matmul_backward_dinp(ctx, dinp, dout, weight, N, IC, OC, gelu_pre, accumulate, dbias_scratch, dbias_pre);
    matmul_backward_dweight(ctx, dweight, dbias, dout, inp, N, IC, OC, accumulate, dbias_scratch);
}

// dbias (OC) (+)= the column sums of the first OC columns of dout, N rows ld >= OC elements apart (a
// bias gradient from part of a wider gradient), each row weighted by row_weights[n] unless that is
// NULL (dbias = row_weightsᵀ · dout: a vector-matrix product; cuBLASLt's GEMM with one row took 28 µs
// under ncu for (1, 2048) · (2048, 2048) on an H100; this pass spreads the 8 MB over 256 blocks
// and 32 row chunks), "+=" when accumulate. scratch: matmul_dbias_scratch_bytes(N, OC) bytes,
// 16-byte aligned. Runs on ctx->stream.
static inline void matmul_column_sums(MatmulContext* ctx, __nv_bfloat16* dbias, void* scratch,
                                      const __nv_bfloat16* dout, const __nv_bfloat16* row_weights, long ld, int N,
                                      int OC, int accumulate) {
    const char* fn = "matmul_column_sums";
    matmul_require_sizes(fn, N, OC, OC);
    matmul_require_pointer(fn, "dbias", dbias);
    matmul_require_pointer(fn, "dout", dout);
    matmul_require_pointer(fn, "scratch", scratch);
    if (ld < OC || ld % 8 != 0) matmul_die(fn, "the row stride ld must be a multiple of 8 and at least OC");
    const MatmulDbiasPass a = {(float*)scratch, dout, NULL, NULL, N, OC, ld, row_weights};
    matmul_dbias_both_passes(ctx, dbias, &a, accumulate);
}

// matmul_backward_dgelu_dbias without dbias_pre (see above).
static inline void matmul_backward(MatmulContext* ctx, __nv_bfloat16* dinp, __nv_bfloat16* dweight,
                                   __nv_bfloat16* dbias, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                                   const __nv_bfloat16* weight, int N, int IC, int OC, const __nv_bfloat16* gelu_pre,
                                   int accumulate, void* dbias_scratch) {
    matmul_backward_dgelu_dbias(ctx, dinp, dweight, dbias, dout, inp, weight, N, IC, OC, gelu_pre, accumulate,
                                dbias_scratch, NULL);
}

#endif  // MATMUL_CUH
