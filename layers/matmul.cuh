// matmul.cuh: the trainer's linear layers, every GEMM through cuBLASLt (bf16 in and out, fp32
// accumulation, fp32 scale), with bias, GELU and their gradients fused into cuBLASLt epilogues.
//
// Tensors, row-major as everywhere in the trainer (weights in nn.Linear's (out, in) layout):
//   inp (N, IC)  weight (OC, IC)  bias (OC) or NULL  out (N, OC)  gelu_pre (N, OC) or NULL
// N = B·T rows (up to 16·8192); IC, OC multiples of 8 (up to 4·2560 and the padded vocab 50304).
//
// matmul_forward:   out = inp · weightᵀ + bias
//   with gelu_pre:  gelu_pre = inp · weightᵀ + bias (the pre-activation, saved for the backward)
//                   out = GELU(gelu_pre), tanh approximation, from the fp32 pre-activation
//   The LM head, logits (N, Vp) = lnf (N, C) · wteᵀ, is matmul_forward(weight = wte (Vp, C), bias NULL).
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
//
// Row-major ↔ cuBLASLt (column-major): a row-major (R, C) matrix is the column-major (C, R) matrix
// with leading dimension C, the same bytes. Each GEMM is therefore written on the transposes; the
// mapping is spelled out above each call (Xᶜ = the column-major view of row-major X, (rows, cols)).
//
// Epilogues (ctx->fusion = MATMUL_FUSE_EPILOGUES, the default):
//   forward            BIAS, GELU_AUX or GELU_AUX_BIAS (aux = gelu_pre), DEFAULT without either
//   backward dinp      DGELU (aux = gelu_pre) with gelu_pre, DEFAULT without
//   backward dweight   BGRADB (Σ over k = N of op(B) = doutᶜᵀ: the column sums of dout) with dbias
// Where cuBLASLt has no algorithm for a GELU/dGELU/BGRADB epilogue on this GPU, and always with
// MATMUL_FUSE_NONE, the plain GEMM runs and small kernels finish the job (gelu.cuh: GELU of the bf16
// pre-activation; dGELU in place on the bf16 dinp; dbias by a deterministic two-pass reduction:
// fp32 partial sums per row chunk, then a fixed-order sum). ctx->last_* say which path ran.
//
// Determinism: every path should give the same bits run to run (cuBLASLt documents bitwise
// reproducibility for a fixed algorithm, workspace and single stream; the reduction kernel sums in a
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

#include "cuda_common.h"
#include "gelu.cuh"

#define MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)  // cuBLASLt workspace; NVIDIA recommends 32 MiB on Hopper

typedef enum {
    MATMUL_FUSE_EPILOGUES = 0,  // GELU, dGELU and dbias in cuBLASLt epilogues where cuBLASLt has an algorithm
    MATMUL_FUSE_NONE = 1,       // plain GEMMs (BIAS epilogue only) and the kernels of this file
} MatmulFusion;

typedef struct {
    cublasLtHandle_t lt;
    void* workspace;         // MATMUL_WORKSPACE_BYTES of device memory, owned
    size_t workspace_bytes;
    cudaStream_t stream;     // every GEMM and kernel of this context runs on it
    MatmulFusion fusion;
    // What the last calls did (static strings, for logs and tests).
    const char* last_forward;
    const char* last_dinp;
    const char* last_dbias;
    unsigned noted_fallbacks;  // epilogues whose fallback has been reported on stderr (bit per epilogue)
} MatmulContext;

// ---- sizes and checks ---------------------------------------------------------------------------

#define MATMUL_DBIAS_MAX_CHUNKS 64     // row chunks of the dbias reduction kernel
#define MATMUL_DBIAS_MIN_CHUNK_ROWS 64

static inline int matmul_dbias_chunks(int N) {
    int chunks = (N + MATMUL_DBIAS_MIN_CHUNK_ROWS - 1) / MATMUL_DBIAS_MIN_CHUNK_ROWS;
    return chunks < 1 ? 1 : (chunks > MATMUL_DBIAS_MAX_CHUNKS ? MATMUL_DBIAS_MAX_CHUNKS : chunks);
}

// Bytes of the dbias scratch matmul_backward needs for N rows and OC outputs (fp32 partial sums,
// (chunks, OC)). Non-decreasing in N and OC: the value for the largest N and OC serves every call.
static inline size_t matmul_dbias_scratch_bytes(int N, int OC) {
    return (size_t)matmul_dbias_chunks(N) * (size_t)OC * sizeof(float);
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

// ---- context ------------------------------------------------------------------------------------

// Creates the cuBLASLt handle and the workspace; everything runs on stream (0: the default stream).
static inline void matmul_context_create(MatmulContext* ctx, cudaStream_t stream) {
    ctx->lt = NULL;
    ctx->workspace = NULL;
    ctx->workspace_bytes = MATMUL_WORKSPACE_BYTES;
    ctx->stream = stream;
    ctx->fusion = MATMUL_FUSE_EPILOGUES;
    ctx->last_forward = ctx->last_dinp = ctx->last_dbias = "none";
    ctx->noted_fallbacks = 0;
    CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    CUDA_CHECK(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
}

static inline void matmul_context_destroy(MatmulContext* ctx) {
    if (ctx->workspace) CUDA_CHECK(cudaFree(ctx->workspace));
    if (ctx->lt) CUBLAS_CHECK(cublasLtDestroy(ctx->lt));
    ctx->workspace = NULL;
    ctx->lt = NULL;
}

// ---- one cuBLASLt GEMM --------------------------------------------------------------------------

// Column-major D (m, n, ld ldd) = op(A) (m, k) · op(B) (k, n) + beta · D, bf16 A, B, D, fp32
// compute and scale; A is stored (m, k) when transa is N and (k, m) when T (likewise B).
typedef struct {
    const char* what;  // for messages, e.g. "matmul_forward (out = inp·weightᵀ)"
    cublasOperation_t transa, transb;
    int64_t m, n, k;
    const void* A;
    int64_t lda;
    const void* B;
    int64_t ldb;
    void* D;
    int64_t ldd;
    float beta;                   // C = D (in place) when nonzero
    cublasLtEpilogue_t epilogue;
    const void* bias;             // BIAS*: input (m); BGRADB: output (n)
    void* aux;                    // GELU_AUX*: output (m, n); DGELU: input (m, n); ld aux_ld
    int64_t aux_ld;
} MatmulLtGemm;

static inline const char* matmul_epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
        default: return "other";
    }
}

// Largest power of two up to 256 dividing the address: what cuBLASLt may assume of a buffer.
static inline uint32_t matmul_alignment(const void* p) {
    uint32_t align = 256;
    while (align > 1 && (uintptr_t)p % align != 0) align >>= 1;
    return align;
}

// Runs g on ctx's stream. Returns 1 when it ran. When cuBLASLt has no algorithm: returns 0 if
// allow_missing (the caller falls back), otherwise ends the program with a message.
static inline int matmul_lt_gemm(MatmulContext* ctx, const MatmulLtGemm* g, int allow_missing) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t transa = g->transa, transb = g->transb;
    uint32_t epilogue = (uint32_t)g->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (g->bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof(g->bias)));
    }
    if (g->aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                    sizeof(g->aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g->aux_ld,
                                                    sizeof(g->aux_ld)));
    }
    const int a_n = g->transa == CUBLAS_OP_N;
    const int b_n = g->transb == CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, a_n ? g->m : g->k, a_n ? g->k : g->m, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, b_n ? g->k : g->n, b_n ? g->n : g->k, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_16BF, g->m, g->n, g->ldd));

    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace_bytes = ctx->workspace_bytes;
    uint32_t align_a = matmul_alignment(g->A), align_b = matmul_alignment(g->B), align_d = matmul_alignment(g->D);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                      sizeof(workspace_bytes)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                      sizeof(align_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                      sizeof(align_d)));

    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, a_layout, b_layout, d_layout, d_layout, pref, 1, &heuristic, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(status);
    const int have_algo = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (have_algo) {
        const float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(ctx->lt, desc, &alpha, g->A, a_layout, g->B, b_layout, &g->beta, g->D, d_layout,
                                    g->D, d_layout, &heuristic.algo, ctx->workspace, ctx->workspace_bytes, ctx->stream));
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(b_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(a_layout));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    if (have_algo) return 1;
    if (allow_missing) return 0;
    fprintf(stderr,
            "error: cuBLASLt (version %zu) found no algorithm for %s: column-major m=%lld n=%lld k=%lld, op(A)=%c "
            "lda=%lld, op(B)=%c ldb=%lld, ldd=%lld, bf16 in/out, fp32 compute, epilogue %s, alignment A/B/D "
            "%u/%u/%u bytes, workspace %zu bytes\n",
            cublasLtGetVersion(), g->what, (long long)g->m, (long long)g->n, (long long)g->k,
            g->transa == CUBLAS_OP_N ? 'N' : 'T', (long long)g->lda, g->transb == CUBLAS_OP_N ? 'N' : 'T',
            (long long)g->ldb, (long long)g->ldd, matmul_epilogue_name(g->epilogue), align_a, align_b, align_d,
            ctx->workspace_bytes);
    fprintf(stderr,
            "hint: bf16 GEMMs need a GPU of compute capability 8.0 or newer; check nvidia-smi, that the sizes are "
            "multiples of 8, and that the CUDA toolkit and driver are recent\n");
    exit(1);
}

// Reports once per epilogue that cuBLASLt had no algorithm for it and the kernels run instead.
static inline void matmul_note_fallback(MatmulContext* ctx, cublasLtEpilogue_t e, const char* what) {
    unsigned bit = e == CUBLASLT_EPILOGUE_DGELU ? 1u : (e == CUBLASLT_EPILOGUE_BGRADB ? 2u : 4u);
    if (ctx->noted_fallbacks & bit) return;
    ctx->noted_fallbacks |= bit;
    fprintf(stderr, "note: cuBLASLt has no algorithm for the %s epilogue of %s on this GPU; using a plain GEMM and a "
                    "separate kernel instead (same results, a little slower)\n",
            matmul_epilogue_name(e), what);
}

// ---- kernels for the unfused paths ---------------------------------------------------------------

// GELU and its gradient for these paths are gelu_forward / gelu_backward (gelu.cuh).

#define MATMUL_DBIAS_THREADS_X 32  // column groups of 8 per block: 256 columns
#define MATMUL_DBIAS_THREADS_Y 8   // rows read at once per block

// Pass 1 of dbias: partial (chunks, OC) fp32, partial[c][o] = Σ of dout[n][o] (dout (N, OC) bf16)
// over rows n of chunk c = blockIdx.y (rows_per_chunk rows), in a fixed order. Grid
// (ceil(OC / 256), chunks), block (32, 8); thread x sums columns 8x..8x+7 of its block over rows
// y, y + 8, ..., then the 8 row groups are added in order y = 0..7.
static __global__ void matmul_dbias_partial_kernel(float* partial, const __nv_bfloat16* dout, int N, int OC,
                                                   int rows_per_chunk) {
    __shared__ float sums[MATMUL_DBIAS_THREADS_Y][MATMUL_DBIAS_THREADS_X * 8];
    const int col = (blockIdx.x * MATMUL_DBIAS_THREADS_X + threadIdx.x) * 8;
    const int row_begin = blockIdx.y * rows_per_chunk;
    const int row_end = min(N, row_begin + rows_per_chunk);
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = 0.0f;
    if (col < OC) {
        for (int r = row_begin + threadIdx.y; r < row_end; r += MATMUL_DBIAS_THREADS_Y) {
            uint4 v = *reinterpret_cast<const uint4*>(dout + (size_t)r * OC + col);
            const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&v);
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(v2[j]);
                acc[2 * j] += f.x;
                acc[2 * j + 1] += f.y;
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

// dbias (OC) += grad (OC), both bf16 (the BGRADB epilogue's result when accumulating).
static __global__ void matmul_dbias_add_kernel(__nv_bfloat16* dbias, const __nv_bfloat16* grad, int OC) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < OC) dbias[o] = __float2bfloat16(__bfloat162float(dbias[o]) + __bfloat162float(grad[o]));
}

// ---- forward ------------------------------------------------------------------------------------

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
    MatmulLtGemm g;
    g.what = "matmul_forward (out = inp·weightᵀ)";
    g.transa = CUBLAS_OP_T;
    g.transb = CUBLAS_OP_N;
    g.m = OC;
    g.n = N;
    g.k = IC;
    g.A = weight;
    g.lda = IC;
    g.B = inp;
    g.ldb = IC;
    g.D = out;
    g.ldd = OC;
    g.beta = 0.0f;
    g.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = bias;
    g.aux = NULL;
    g.aux_ld = 0;
    if (!gelu_pre) {
        matmul_lt_gemm(ctx, &g, 0);
        ctx->last_forward = bias ? "BIAS epilogue" : "DEFAULT epilogue";
        return;
    }
    if (ctx->fusion == MATMUL_FUSE_EPILOGUES) {
        MatmulLtGemm fused = g;
        fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        fused.aux = gelu_pre;
        fused.aux_ld = OC;
        if (matmul_lt_gemm(ctx, &fused, 1)) {
            ctx->last_forward = bias ? "GELU_AUX_BIAS epilogue" : "GELU_AUX epilogue";
            return;
        }
        matmul_note_fallback(ctx, fused.epilogue, fn);
    }
    // Unfused: the GEMM (+ bias) writes the pre-activation, then out = GELU(gelu_pre).
    g.D = gelu_pre;
    matmul_lt_gemm(ctx, &g, 0);
    gelu_forward(out, gelu_pre, (size_t)N * OC, ctx->stream);
    ctx->last_forward = bias ? "BIAS epilogue + GELU kernel" : "DEFAULT epilogue + GELU kernel";
}

// ---- backward -----------------------------------------------------------------------------------

// Given dout (N, OC) and the forward's inp (N, IC) and weight (OC, IC):
//   dinp (N, IC) = dout · weight (overwritten; skipped when dinp is NULL); with gelu_pre (N, IC)
//     non-NULL, dinp = GELU'(gelu_pre) ∘ (dout · weight), for inp = GELU(gelu_pre);
//   dweight (OC, IC) (+)= doutᵀ · inp;   dbias (OC) (+)= column sums of dout (skipped when NULL);
//   "+=" when accumulate (micro-batches after the first, the tied LM head), "=" otherwise.
// dbias_scratch: device memory of matmul_dbias_scratch_bytes(N, OC) bytes, 16-byte aligned, needed
// when dbias is non-NULL (NULL otherwise); its contents on entry do not matter. Runs on ctx->stream.
static inline void matmul_backward(MatmulContext* ctx, __nv_bfloat16* dinp, __nv_bfloat16* dweight,
                                   __nv_bfloat16* dbias, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                                   const __nv_bfloat16* weight, int N, int IC, int OC, const __nv_bfloat16* gelu_pre,
                                   int accumulate, void* dbias_scratch) {
    const char* fn = "matmul_backward";
    matmul_require_sizes(fn, N, IC, OC);
    if (dinp) matmul_require_pointer(fn, "dinp", dinp);
    matmul_require_pointer(fn, "dweight", dweight);
    matmul_require_pointer(fn, "dout", dout);
    matmul_require_pointer(fn, "inp", inp);
    matmul_require_pointer(fn, "weight", weight);
    if (dinp && gelu_pre) matmul_require_pointer(fn, "gelu_pre", gelu_pre);
    if (dbias) {
        matmul_require_pointer(fn, "dbias", dbias);
        matmul_require_pointer(fn, "dbias_scratch", dbias_scratch);
    }

    // ---- dinp
    // dinpᶜ (IC, N) = weightᶜ (IC, OC) · doutᶜ (OC, N):
    //   A = weight, stored (IC, OC) ld IC, op N;  B = dout, stored (OC, N) ld OC, op N;
    //   D = dinp (IC, N) ld IC;  m = IC, n = N, k = OC;  DGELU aux = gelu_pre (N, IC) row-major =
    //   (IC, N) ld IC, laid out like D: D = GELU'(aux) ∘ (A·B), elementwise.
    ctx->last_dinp = "skipped";
    if (dinp) {
        MatmulLtGemm g;
        g.what = "matmul_backward (dinp = dout·weight)";
        g.transa = CUBLAS_OP_N;
        g.transb = CUBLAS_OP_N;
        g.m = IC;
        g.n = N;
        g.k = OC;
        g.A = weight;
        g.lda = IC;
        g.B = dout;
        g.ldb = OC;
        g.D = dinp;
        g.ldd = IC;
        g.beta = 0.0f;
        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        g.bias = NULL;
        g.aux = NULL;
        g.aux_ld = 0;
        int done = 0;
        if (gelu_pre && ctx->fusion == MATMUL_FUSE_EPILOGUES) {
            MatmulLtGemm fused = g;
            fused.epilogue = CUBLASLT_EPILOGUE_DGELU;
            fused.aux = (void*)gelu_pre;  // read only
            fused.aux_ld = IC;
            done = matmul_lt_gemm(ctx, &fused, 1);
            if (done) ctx->last_dinp = "DGELU epilogue";
            else matmul_note_fallback(ctx, fused.epilogue, fn);
        }
        if (!done) {
            matmul_lt_gemm(ctx, &g, 0);
            ctx->last_dinp = "DEFAULT epilogue";
            if (gelu_pre) {
                gelu_backward(dinp, dinp, gelu_pre, (size_t)N * IC, ctx->stream);  // in place
                ctx->last_dinp = "DEFAULT epilogue + dGELU kernel";
            }
        }
    }

    // ---- dweight (and dbias)
    // dweightᶜ (IC, OC) = inpᶜ (IC, N) · doutᶜᵀ (N, OC):
    //   A = inp, stored (IC, N) ld IC, op N;  B = dout, stored (OC, N) ld OC, op T;
    //   D = dweight (IC, OC) ld IC;  m = IC, n = OC, k = N;  beta = 1 accumulates in place.
    //   BGRADB: Σ over k of op(B) (N, OC) = the column sums of dout, n = OC values, written (not
    //   accumulated) to the bias pointer: dbias itself, or the scratch when accumulating.
    MatmulLtGemm g;
    g.what = "matmul_backward (dweight = doutᵀ·inp)";
    g.transa = CUBLAS_OP_N;
    g.transb = CUBLAS_OP_T;
    g.m = IC;
    g.n = OC;
    g.k = N;
    g.A = inp;
    g.lda = IC;
    g.B = dout;
    g.ldb = OC;
    g.D = dweight;
    g.ldd = IC;
    g.beta = accumulate ? 1.0f : 0.0f;
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    g.aux = NULL;
    g.aux_ld = 0;
    ctx->last_dbias = "skipped";
    if (dbias && ctx->fusion == MATMUL_FUSE_EPILOGUES) {
        MatmulLtGemm fused = g;
        fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        fused.bias = accumulate ? dbias_scratch : (void*)dbias;
        if (matmul_lt_gemm(ctx, &fused, 1)) {
            if (accumulate) {
                matmul_dbias_add_kernel<<<(OC + 255) / 256, 256, 0, ctx->stream>>>(
                    dbias, (const __nv_bfloat16*)dbias_scratch, OC);
                CUDA_CHECK(cudaGetLastError());
                ctx->last_dbias = "BGRADB epilogue + add kernel";
            } else {
                ctx->last_dbias = "BGRADB epilogue";
            }
            return;
        }
        matmul_note_fallback(ctx, fused.epilogue, fn);
    }
    matmul_lt_gemm(ctx, &g, 0);
    if (dbias) {
        const int chunks = matmul_dbias_chunks(N);
        const int rows_per_chunk = (N + chunks - 1) / chunks;
        dim3 grid((OC + MATMUL_DBIAS_THREADS_X * 8 - 1) / (MATMUL_DBIAS_THREADS_X * 8), chunks);
        dim3 block(MATMUL_DBIAS_THREADS_X, MATMUL_DBIAS_THREADS_Y);
        matmul_dbias_partial_kernel<<<grid, block, 0, ctx->stream>>>((float*)dbias_scratch, dout, N, OC,
                                                                     rows_per_chunk);
        CUDA_CHECK(cudaGetLastError());
        matmul_dbias_finish_kernel<<<(OC + 255) / 256, 256, 0, ctx->stream>>>(dbias, (const float*)dbias_scratch,
                                                                              chunks, OC, accumulate);
        CUDA_CHECK(cudaGetLastError());
        ctx->last_dbias = "reduction kernel";
    }
}

#endif  // MATMUL_CUH
