// matmul_lt.cuh: what the linear layers (matmul.cuh) build on: their context (the cuBLASLt handle,
// workspaces, stream, and the choices made so far), one cuBLASLt GEMM described by MatmulLtGemm and
// run with an algorithm chosen once per shape (the heuristic's first, or the fastest of its best
// MATMUL_TUNE_CANDIDATES when ctx->tune is set) and cached in the context, the timing helpers, and
// the cache of fused-or-kernel path choices. matmul.cuh's header says how these are used; the FP8
// GEMMs of matmul_fp8.cuh are the same MatmulLtGemm with FP8 operand types and scales.
#ifndef MATMUL_LT_CUH
#define MATMUL_LT_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_common.h"

#define MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)  // cuBLASLt workspace; NVIDIA recommends 32 MiB on Hopper
#define MATMUL_TUNE_CANDIDATES 8   // heuristic algorithms timed per GEMM shape
#define MATMUL_TUNE_ROUNDS 2       // timing rounds over the candidates (the minimum counts)
#define MATMUL_TUNE_RUNS 3         // back-to-back runs per timing
#define MATMUL_TUNE_MARGIN 0.01f   // another algorithm replaces the heuristic's first when this much faster
#define MATMUL_ALGO_CACHE 96       // GEMM shapes remembered (a GPT uses about 15)
#define MATMUL_PATH_CACHE 128      // fused-or-kernel choices (and backward shapes seen) remembered

typedef enum {
    MATMUL_FUSE_EPILOGUES = 0,  // GELU, dGELU and dbias in cuBLASLt epilogues where cuBLASLt has an algorithm
    MATMUL_FUSE_NONE = 1,       // plain GEMMs (BIAS epilogue only) and the kernels of this file
    MATMUL_FUSE_AUTO = 2,       // per shape, the faster of the two, timed once (epilogues when ctx->tune is 0)
} MatmulFusion;

// What a GEMM's algorithm is looked up by.
typedef struct {
    int32_t transa, transb, epilogue, beta_nonzero, has_bias, has_aux;
    int64_t m, n, k, lda, ldb, ldd, aux_ld;
    uint32_t align_a, align_b, align_c, align_d;
    int32_t a_type, b_type, fast_accum, has_scales;  // operand types (cudaDataType_t), FP8 settings
} MatmulGemmKey;

typedef struct {
    MatmulGemmKey key;
    int found;                  // 0: cuBLASLt has no algorithm for it
    cublasLtMatmulAlgo_t algo;  // the chosen one
    float ms;                   // its time when tuned (0 when not timed)
} MatmulAlgoEntry;

// Which path a fused-or-kernel choice took, by (kind, sizes).
typedef struct {
    int kind, N, IC, OC, accumulate, has_bias;
    int path;
} MatmulPathEntry;

typedef struct {
    cublasLtHandle_t lt;
    void* workspace;         // MATMUL_WORKSPACE_BYTES of device memory, owned
    size_t workspace_bytes;
    cudaStream_t stream;     // every GEMM and kernel of this context runs on it
    MatmulFusion fusion;     // MATMUL_FUSE_AUTO after matmul_context_create
    int tune;                // 1: time the heuristic's candidates and the paths per shape (0 after create)
    int log;                 // print timings and choices to stderr (MATMUL_TUNE_LOG=1)
    // What the last calls did (static strings, for logs and tests).
    const char* last_forward;
    const char* last_dinp;
    const char* last_dbias;
    const char* last_dbias_pre;
    unsigned noted_fallbacks;  // epilogues whose fallback has been reported on stderr (bit per epilogue)
    // the choices made so far (this context's life)
    MatmulAlgoEntry algos[MATMUL_ALGO_CACHE];
    int num_algos;
    MatmulAlgoEntry spill;   // the entry used once the cache is full (looked up again every call)
    MatmulPathEntry paths[MATMUL_PATH_CACHE];
    int num_paths;
    cudaEvent_t events[2];   // for the timings
} MatmulContext;

// ---- context ------------------------------------------------------------------------------------

// Creates the cuBLASLt handle and the workspaces; everything runs on stream (0: the default stream).
// MATMUL_FUSE_AUTO with ctx->tune = 0: fixed choices, the same in every context and process; set
// ctx->tune = 1 before the first GEMM to time them (train_gpt does, for flash2 without --deterministic).
static inline void matmul_context_create(MatmulContext* ctx, cudaStream_t stream) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->workspace_bytes = MATMUL_WORKSPACE_BYTES;
    ctx->stream = stream;
    ctx->fusion = MATMUL_FUSE_AUTO;
    ctx->tune = 0;
    const char* log = getenv("MATMUL_TUNE_LOG");
    ctx->log = log && log[0] && strcmp(log, "0") != 0;
    ctx->last_forward = ctx->last_dinp = ctx->last_dbias = ctx->last_dbias_pre = "none";
    CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    CUDA_CHECK(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
    CUDA_CHECK(cudaEventCreate(&ctx->events[0]));
    CUDA_CHECK(cudaEventCreate(&ctx->events[1]));
}

static inline void matmul_context_destroy(MatmulContext* ctx) {
    if (ctx->workspace) CUDA_CHECK(cudaFree(ctx->workspace));
    if (ctx->lt) CUBLAS_CHECK(cublasLtDestroy(ctx->lt));
    if (ctx->events[0]) CUDA_CHECK(cudaEventDestroy(ctx->events[0]));
    if (ctx->events[1]) CUDA_CHECK(cudaEventDestroy(ctx->events[1]));
    ctx->workspace = NULL;
    ctx->lt = NULL;
    ctx->events[0] = ctx->events[1] = NULL;
}

// ---- timing -------------------------------------------------------------------------------------

// Work enqueued on ctx->stream by a timing: a GEMM with one algorithm, or a kernel. Returns 0 when
// it was enqueued.
typedef int (*MatmulWork)(MatmulContext* ctx, const void* arg);

// Milliseconds per run of work: MATMUL_TUNE_RUNS runs back to back between two events; a negative
// value when work failed to enqueue. Synchronizes ctx->stream (start-up only).
static inline float matmul_time_once(MatmulContext* ctx, MatmulWork work, const void* arg) {
    CUDA_CHECK(cudaEventRecord(ctx->events[0], ctx->stream));
    for (int r = 0; r < MATMUL_TUNE_RUNS; r++)
        if (work(ctx, arg) != 0) return -1.0f;
    CUDA_CHECK(cudaEventRecord(ctx->events[1], ctx->stream));
    CUDA_CHECK(cudaEventSynchronize(ctx->events[1]));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ctx->events[0], ctx->events[1]));
    return ms / MATMUL_TUNE_RUNS;
}

// The best of MATMUL_TUNE_ROUNDS timings of work after one warm-up run (a kernel's cost in a path).
static inline float matmul_time_work(MatmulContext* ctx, MatmulWork work, const void* arg) {
    if (work(ctx, arg) != 0) return -1.0f;
    float best = -1.0f;
    for (int round = 0; round < MATMUL_TUNE_ROUNDS; round++) {
        float ms = matmul_time_once(ctx, work, arg);
        if (ms < 0.0f) return -1.0f;
        if (best < 0.0f || ms < best) best = ms;
    }
    return best;
}

// ---- one cuBLASLt GEMM --------------------------------------------------------------------------

// Column-major D (m, n, ld ldd) = op(A) (m, k) · op(B) (k, n) + beta · C, bf16 A, B, C, D, fp32
// compute and scale; A is stored (m, k) when transa is N and (k, m) when T (likewise B). C is D
// itself (in place) unless given: then it is laid out like D (m, n, ld ldd) and D is only written.
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
    float beta;                   // C is read when nonzero
    const void* C;                // NULL: C = D (in place)
    cublasLtEpilogue_t epilogue;
    const void* bias;             // BIAS*: input (m); BGRADB: output (n); DGELU_BGRAD: output (m)
    void* aux;                    // GELU_AUX*: output (m, n); DGELU*: input (m, n); ld aux_ld
    int64_t aux_ld;
    // A and B types: CUDA_R_16BF (matmul_lt_plain), or FP8 (CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2) for
    // matmul_fp8.cuh, where cuBLASLt needs transa = T, transb = N; C and D stay bf16.
    cudaDataType_t a_type, b_type;
    const float* a_scale;         // device fp32 factor applied to A (FP8: its inverse quantization scale); NULL: 1
    const float* b_scale;         // likewise for B
    int fast_accum;               // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM (no periodic promotion to fp32)
} MatmulLtGemm;

// The GEMM above with the DEFAULT epilogue and no bias or aux (callers set those where they fuse).
static inline MatmulLtGemm matmul_lt_plain(const char* what, cublasOperation_t transa, cublasOperation_t transb,
                                           int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
                                           const void* B, int64_t ldb, void* D, int64_t ldd, float beta) {
    MatmulLtGemm g;
    g.what = what;
    g.transa = transa;
    g.transb = transb;
    g.m = m, g.n = n, g.k = k;
    g.A = A, g.lda = lda;
    g.B = B, g.ldb = ldb;
    g.D = D, g.ldd = ldd;
    g.beta = beta;
    g.C = NULL;
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    g.aux = NULL;
    g.aux_ld = 0;
    g.a_type = g.b_type = CUDA_R_16BF;
    g.a_scale = g.b_scale = NULL;
    g.fast_accum = 0;
    return g;
}

static inline int matmul_lt_is_fp8(const MatmulLtGemm* g) {
    return g->a_type == CUDA_R_8F_E4M3 || g->a_type == CUDA_R_8F_E5M2;
}

static inline const char* matmul_type_name(cudaDataType_t t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_8F_E4M3 ? "e4m3" : t == CUDA_R_8F_E5M2 ? "e5m2" : "other";
}

static inline const char* matmul_epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
        default: return "other";
    }
}

// The C input of g: D itself unless g->C is given.
static inline const void* matmul_lt_c(const MatmulLtGemm* g) { return g->C ? g->C : g->D; }

// Largest power of two up to 256 dividing the address: what cuBLASLt may assume of a buffer.
static inline uint32_t matmul_alignment(const void* p) {
    uint32_t align = 256;
    while (align > 1 && (uintptr_t)p % align != 0) align >>= 1;
    return align;
}

// The descriptors of one GEMM (made per call: they hold the call's bias and aux pointers).
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
} MatmulLtDescs;

// The FP8 attributes of g's descriptor: the operand scales and the accumulation mode.
static inline void matmul_lt_desc_set_fp8(const MatmulLtGemm* g, cublasLtMatmulDesc_t desc) {
    if (g->a_scale)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->a_scale,
                                                    sizeof(g->a_scale)));
    if (g->b_scale)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->b_scale,
                                                    sizeof(g->b_scale)));
    const int8_t fast = g->fast_accum ? 1 : 0;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
}

static inline void matmul_lt_descs_create(const MatmulLtGemm* g, MatmulLtDescs* x) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&x->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t transa = g->transa, transb = g->transb;
    uint32_t epilogue = (uint32_t)g->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (g->bias) {
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof(g->bias)));
    }
    if (g->aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                    sizeof(g->aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g->aux_ld,
                                                    sizeof(g->aux_ld)));
    }
    if (matmul_lt_is_fp8(g)) matmul_lt_desc_set_fp8(g, x->desc);
    const int a_n = g->transa == CUBLAS_OP_N;
    const int b_n = g->transb == CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->a, g->a_type, a_n ? g->m : g->k, a_n ? g->k : g->m, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->b, g->b_type, b_n ? g->k : g->n, b_n ? g->n : g->k, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->d, CUDA_R_16BF, g->m, g->n, g->ldd));
}

static inline void matmul_lt_descs_destroy(MatmulLtDescs* x) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(x->d));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(x->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(x->a));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(x->desc));
}

static inline MatmulGemmKey matmul_gemm_key(const MatmulLtGemm* g) {
    MatmulGemmKey k;
    memset(&k, 0, sizeof(k));  // the key is compared with memcmp: no stray padding bytes
    k.transa = g->transa, k.transb = g->transb, k.epilogue = (int32_t)g->epilogue;
    k.beta_nonzero = g->beta != 0.0f, k.has_bias = g->bias != NULL, k.has_aux = g->aux != NULL;
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldd = g->ldd, k.aux_ld = g->aux ? g->aux_ld : 0;
    k.align_a = matmul_alignment(g->A), k.align_b = matmul_alignment(g->B), k.align_d = matmul_alignment(g->D);
    k.align_c = matmul_alignment(matmul_lt_c(g));
    k.a_type = (int32_t)g->a_type, k.b_type = (int32_t)g->b_type, k.fast_accum = g->fast_accum != 0;
    k.has_scales = (g->a_scale != NULL) | (g->b_scale != NULL) << 1;
    return k;
}

// Up to want candidates from cuBLASLt's heuristic, best first; the number found (0: none).
static inline int matmul_lt_heuristic(MatmulContext* ctx, const MatmulLtGemm* g, const MatmulLtDescs* x,
                                      cublasLtMatmulHeuristicResult_t* results, int want) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace_bytes = ctx->workspace_bytes;
    uint32_t align_a = matmul_alignment(g->A), align_b = matmul_alignment(g->B), align_d = matmul_alignment(g->D);
    uint32_t align_c = matmul_alignment(matmul_lt_c(g));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                      sizeof(workspace_bytes)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                      sizeof(align_c)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                      sizeof(align_d)));
    int found = 0;
    cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(ctx->lt, x->desc, x->a, x->b, x->d, x->d, pref, want, results, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(status);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (status != CUBLAS_STATUS_SUCCESS) return 0;
    int usable = 0;  // keep the candidates the heuristic says work, in order
    for (int i = 0; i < found; i++)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) results[usable++] = results[i];
    return usable;
}

static inline cublasStatus_t matmul_lt_launch(MatmulContext* ctx, const MatmulLtGemm* g, const MatmulLtDescs* x,
                                              const cublasLtMatmulAlgo_t* algo) {
    const float alpha = 1.0f;
    return cublasLtMatmul(ctx->lt, x->desc, &alpha, g->A, x->a, g->B, x->b, &g->beta, matmul_lt_c(g), x->d, g->D,
                          x->d, algo, ctx->workspace, ctx->workspace_bytes, ctx->stream);
}

typedef struct {
    const MatmulLtGemm* g;
    const MatmulLtDescs* x;
    const cublasLtMatmulAlgo_t* algo;
} MatmulGemmWork;

static inline int matmul_gemm_work(MatmulContext* ctx, const void* arg) {
    const MatmulGemmWork* w = (const MatmulGemmWork*)arg;
    return matmul_lt_launch(ctx, w->g, w->x, w->algo) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

// "id 66 tile 20 stages 8 splitK 1 cluster 2": what the log says of an algorithm.
static inline void matmul_algo_describe(const cublasLtMatmulAlgo_t* algo, char* buf, size_t size) {
    int32_t id = 0;
    uint32_t tile = 0, stages = 0, splitk = 0, cluster = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &got);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &got);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &got);
    snprintf(buf, size, "id %d tile %u stages %u splitK %u cluster %u", id, tile, stages, splitk, cluster);
}

// Times the candidates on g's buffers and returns the index of the one to keep (see the top of the
// file); ms[i] their times. D, when beta != 0 makes it an input (C in place), is saved first and
// restored after.
static inline int matmul_lt_tune(MatmulContext* ctx, const MatmulLtGemm* g, const MatmulLtDescs* x,
                                 const cublasLtMatmulHeuristicResult_t* results, int count, float* ms) {
    void* saved = NULL;
    const size_t d_bytes = ((size_t)g->ldd * (size_t)(g->n - 1) + (size_t)g->m) * sizeof(__nv_bfloat16);
    if (g->beta != 0.0f && g->C == NULL) {
        if (cudaMallocAsync(&saved, d_bytes, ctx->stream) != cudaSuccess) {
            (void)cudaGetLastError();  // no room to save D: keep the heuristic's first, untimed
            return 0;
        }
        CUDA_CHECK(cudaMemcpyAsync(saved, g->D, d_bytes, cudaMemcpyDeviceToDevice, ctx->stream));
    }
    MatmulGemmWork w[MATMUL_TUNE_CANDIDATES];
    for (int i = 0; i < count; i++) {
        w[i].g = g, w[i].x = x, w[i].algo = &results[i].algo;
        ms[i] = matmul_gemm_work(ctx, &w[i]) == 0 ? 0.0f : -1.0f;  // warm-up; -1: refused
    }
    for (int round = 0; round < MATMUL_TUNE_ROUNDS; round++)  // rounds across candidates: clocks drift alike
        for (int i = 0; i < count; i++) {
            if (ms[i] < 0.0f) continue;
            float t = matmul_time_once(ctx, matmul_gemm_work, &w[i]);
            if (t < 0.0f) ms[i] = -1.0f;
            else if (round == 0 || t < ms[i]) ms[i] = t;
        }
    (void)cudaGetLastError();
    if (saved) {
        CUDA_CHECK(cudaMemcpyAsync(g->D, saved, d_bytes, cudaMemcpyDeviceToDevice, ctx->stream));
        CUDA_CHECK(cudaFreeAsync(saved, ctx->stream));
    }
    int best = 0;
    for (int i = 1; i < count; i++)
        if (ms[i] >= 0.0f && (ms[best] < 0.0f || ms[i] < ms[best])) best = i;
    if (best != 0 && ms[0] >= 0.0f && ms[best] > ms[0] * (1.0f - MATMUL_TUNE_MARGIN)) best = 0;
    return best;
}

// The algorithm for g: from the cache, or chosen now (timed when ctx->tune) and cached.
static inline const MatmulAlgoEntry* matmul_lt_algo(MatmulContext* ctx, const MatmulLtGemm* g, const MatmulLtDescs* x) {
    const MatmulGemmKey key = matmul_gemm_key(g);
    for (int i = 0; i < ctx->num_algos; i++)
        if (memcmp(&ctx->algos[i].key, &key, sizeof(key)) == 0) return &ctx->algos[i];
    MatmulAlgoEntry* e = ctx->num_algos < MATMUL_ALGO_CACHE ? &ctx->algos[ctx->num_algos++] : &ctx->spill;
    memset(e, 0, sizeof(*e));
    e->key = key;
    cublasLtMatmulHeuristicResult_t results[MATMUL_TUNE_CANDIDATES];
    const int tune = ctx->tune && e != &ctx->spill;
    const int count = matmul_lt_heuristic(ctx, g, x, results, tune ? MATMUL_TUNE_CANDIDATES : 1);
    e->found = count > 0;
    if (!e->found) return e;
    float ms[MATMUL_TUNE_CANDIDATES];
    for (int i = 0; i < MATMUL_TUNE_CANDIDATES; i++) ms[i] = -1.0f;
    // A single candidate is timed too: the fused-or-kernel choices compare these times.
    const int best = tune ? matmul_lt_tune(ctx, g, x, results, count, ms) : 0;
    e->algo = results[best].algo;
    e->ms = tune && ms[best] > 0.0f ? ms[best] : 0.0f;
    if (ctx->log) {
        const double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k;
        char types[64] = "";  // bf16 GEMMs say nothing of their types
        if (matmul_lt_is_fp8(g))
            snprintf(types, sizeof(types), " A/B %s/%s%s", matmul_type_name(g->a_type), matmul_type_name(g->b_type),
                     g->fast_accum ? " fast-accum" : "");
        fprintf(stderr, "matmul tune: %s m=%lld n=%lld k=%lld op(A)=%c op(B)=%c beta=%g epilogue %s%s: %d candidates\n",
                g->what, (long long)g->m, (long long)g->n, (long long)g->k, g->transa == CUBLAS_OP_N ? 'N' : 'T',
                g->transb == CUBLAS_OP_N ? 'N' : 'T', g->beta, matmul_epilogue_name(g->epilogue), types, count);
        for (int i = 0; i < (tune ? count : 1); i++) {
            char desc[128];
            matmul_algo_describe(&results[i].algo, desc, sizeof(desc));
            if (tune)
                fprintf(stderr, "  %s %d: %8.4f ms %7.1f TFLOP/s  %s\n", i == best ? "*" : " ", i, ms[i],
                        ms[i] > 0.0f ? flops / (ms[i] * 1e-3) / 1e12 : 0.0, desc);
            else
                fprintf(stderr, "  * %d: (untimed)  %s\n", i, desc);
        }
    }
    return e;
}

// Runs g on ctx's stream. Returns 1 when it ran. When cuBLASLt has no algorithm: returns 0 if
// allow_missing (the caller falls back), otherwise ends the program with a message.
static inline int matmul_lt_gemm(MatmulContext* ctx, const MatmulLtGemm* g, int allow_missing) {
    MatmulLtDescs x;
    matmul_lt_descs_create(g, &x);
    const MatmulAlgoEntry* e = matmul_lt_algo(ctx, g, &x);
    if (e->found) CUBLAS_CHECK(matmul_lt_launch(ctx, g, &x, &e->algo));
    matmul_lt_descs_destroy(&x);
    if (e->found) return 1;
    if (allow_missing) return 0;
    fprintf(stderr,
            "error: cuBLASLt (version %zu) found no algorithm for %s: column-major m=%lld n=%lld k=%lld, op(A)=%c "
            "lda=%lld, op(B)=%c ldb=%lld, ldd=%lld, A/B %s/%s, bf16 out, fp32 compute, epilogue %s, alignment A/B/D "
            "%u/%u/%u bytes, workspace %zu bytes\n",
            cublasLtGetVersion(), g->what, (long long)g->m, (long long)g->n, (long long)g->k,
            g->transa == CUBLAS_OP_N ? 'N' : 'T', (long long)g->lda, g->transb == CUBLAS_OP_N ? 'N' : 'T',
            (long long)g->ldb, (long long)g->ldd, matmul_type_name(g->a_type), matmul_type_name(g->b_type),
            matmul_epilogue_name(g->epilogue), e->key.align_a, e->key.align_b, e->key.align_d, ctx->workspace_bytes);
    if (matmul_lt_is_fp8(g))
        fprintf(stderr, "hint: FP8 GEMMs need a GPU of compute capability 8.9 or newer (an H100 is 9.0), op(A)=T and "
                        "op(B)=N, sizes and leading dimensions that are multiples of 16, and a recent CUDA toolkit "
                        "(bf16 GEMMs run elsewhere)\n");
    else
        fprintf(stderr, "hint: bf16 GEMMs need a GPU of compute capability 8.0 or newer; check nvidia-smi, that the "
                        "sizes are multiples of 8, and that the CUDA toolkit and driver are recent\n");
    exit(1);
}

// The tuned time of g's algorithm in ms (choosing it now if needed, which may run g on its buffers);
// -1 when cuBLASLt has none; 0 when not timed.
static inline float matmul_lt_gemm_ms(MatmulContext* ctx, const MatmulLtGemm* g) {
    MatmulLtDescs x;
    matmul_lt_descs_create(g, &x);
    const MatmulAlgoEntry* e = matmul_lt_algo(ctx, g, &x);
    matmul_lt_descs_destroy(&x);
    return e->found ? e->ms : -1.0f;
}

// Reports once per epilogue that cuBLASLt had no algorithm for it and the kernels run instead.
static inline void matmul_note_fallback(MatmulContext* ctx, cublasLtEpilogue_t e, const char* what) {
    unsigned bit = e == CUBLASLT_EPILOGUE_DGELU         ? 1u
                   : e == CUBLASLT_EPILOGUE_BGRADB      ? 2u
                   : e == CUBLASLT_EPILOGUE_DGELU_BGRAD ? 8u
                                                        : 4u;
    if (ctx->noted_fallbacks & bit) return;
    ctx->noted_fallbacks |= bit;
    fprintf(stderr, "note: cuBLASLt has no algorithm for the %s epilogue of %s on this GPU; using a plain GEMM and a "
                    "separate kernel instead (same results, a little slower)\n",
            matmul_epilogue_name(e), what);
}

// ---- fused-or-kernel choices --------------------------------------------------------------------

typedef enum {
    MATMUL_CHOICE_GELU = 0,     // forward GELU: 0 epilogue, 1 kernel
    MATMUL_CHOICE_DGELU = 1,    // backward dGELU: 0 epilogue, 1 kernel
    MATMUL_CHOICE_DBIAS = 2,    // backward dbias: 0 BGRADB epilogue, 1 reduction kernels
    MATMUL_CHOICE_DGELU_DBIAS = 3,  // dGELU + dbias_pre: 0 DGELU_BGRAD, 1 dGELU path + reduction, 2 fused kernel
} MatmulChoiceKind;

static inline const char* matmul_choice_name(int kind) {
    static const char* names[] = {"forward GELU", "backward dGELU", "backward dbias", "backward dGELU + dbias_pre"};
    return names[kind];
}

// The cached path for (kind, sizes), or -1.
static inline int matmul_path_find(const MatmulContext* ctx, int kind, int N, int IC, int OC, int accumulate,
                                   int has_bias) {
    for (int i = 0; i < ctx->num_paths; i++) {
        const MatmulPathEntry* p = &ctx->paths[i];
        if (p->kind == kind && p->N == N && p->IC == IC && p->OC == OC && p->accumulate == accumulate &&
            p->has_bias == has_bias)
            return p->path;
    }
    return -1;
}

// Whether a new choice may be timed: ctx->tune, and room to remember it (with full caches every
// call would be timed again, e.g. generation's many prompt lengths; fixed choices then).
static inline int matmul_timing_on(const MatmulContext* ctx) {
    return ctx->tune && ctx->num_paths < MATMUL_PATH_CACHE && ctx->num_algos < MATMUL_ALGO_CACHE;
}

// Remembers path for (kind, sizes) while there is room (otherwise it is chosen again next time).
static inline void matmul_path_remember(MatmulContext* ctx, int kind, int N, int IC, int OC, int accumulate,
                                        int has_bias, int path) {
    if (ctx->num_paths >= MATMUL_PATH_CACHE) return;
    MatmulPathEntry* p = &ctx->paths[ctx->num_paths++];
    p->kind = kind, p->N = N, p->IC = IC, p->OC = OC, p->accumulate = accumulate, p->has_bias = has_bias;
    p->path = path;
}

// Picks the cheapest of count paths (cost < 0: not available; path 0 when none is) and remembers it.
static inline int matmul_path_choose(MatmulContext* ctx, int kind, int N, int IC, int OC, int accumulate, int has_bias,
                                     const float* cost, int count) {
    int best = -1;
    for (int i = 0; i < count; i++)
        if (cost[i] >= 0.0f && (best < 0 || cost[i] < cost[best])) best = i;
    if (best < 0) best = 0;
    matmul_path_remember(ctx, kind, N, IC, OC, accumulate, has_bias, best);
    if (ctx->log) {
        fprintf(stderr, "matmul path: %s N=%d IC=%d OC=%d:", matmul_choice_name(kind), N, IC, OC);
        for (int i = 0; i < count; i++) fprintf(stderr, " %s%d %.4f ms", i == best ? "*" : "", i, cost[i]);
        fprintf(stderr, "\n");
    }
    return best;
}

#endif  // MATMUL_LT_CUH
