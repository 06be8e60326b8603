// gpt_decode.cuh: the model for generation: a KV cache and a cached decode step that runs Tq new
// tokens per sequence (1 ≤ Tq ≤ DECODE_MAX_QUERY_TOKENS) through the same layers as the training
// forward (layers/model/gpt_model.cuh), with the split-KV decode attention (attention/decode.h).
// The prompt goes in through gpt_prefill.cuh; the tokens drawn one by one through gpt_generator.cuh.
//
// Shapes: L layers, C channels, NH query heads and NKV key/value heads of HD, V vocab padded to Vp;
// B sequences, Tmax positions of cache (≤ maxT, the rows of wpe); N = B·Tq rows per step.
//   KV cache   k, v (L, B, Tmax, NKV, HD) bf16; lengths (B) int32 on the GPU: the positions of
//              sequence b that hold keys (a host copy is kept as bookkeeping, never read by a kernel).
//   A step on d->tokens (B, Tq) on the GPU (sequence b's new tokens go to positions lengths[b] ..
//   lengths[b]+Tq−1), everything read from device memory so that it can be captured once in a CUDA
//   graph and replayed at every length:
//     starts[b] = lengths[b]; lengths[b] += Tq           (a kernel; first, so the attention sees the new keys)
//     x (N, C)        = wte[tok] + wpe[pos]
//     per block l (gpt_inference_block: the training forward's recipe on N rows, no statistics saved):
//       ln (N, C)     = LN1(x)
//       qkv (N, R)    = ln · qkvwᵀ + qkvb                R = (NH + 2·NKV)·HD, a row: q | k | v heads
//       cache[l][b, pos] = k, v of the row               (decode_cache_append, attention/decode/kv_cache.cu)
//       atty (N, C)   = decode attention(q straight from the qkv rows (stride R), cache[l], lengths)
//       r2 (N, C)     = x + atty · attprojwᵀ + attprojb  (the residual added in the GEMM, as in training)
//       ln            = LN2(r2)
//       fch_gelu      = GELU(ln · fcwᵀ + fcb);  x = r2 + fch_gelu · fcprojwᵀ + fcprojb
//     last (B, C) = x's row Tq−1 of each sequence;  ln = LNf(last)
//     logits (B, Vp) = ln · wteᵀ                         (the next-token logits of each sequence)
//   At N ≤ GPT_DECODE_LINEAR_ROWS rows (gpt_decode_block_small) every product is decode_linear
//   (decode_linear.cuh), with LN1 and LN2 inside the QKV and FC products and the cache append in the
//   QKV product's epilogue: four launches and the attention per layer instead of seven; more rows go
//   through cuBLASLt.
//   The decode attention runs with max_length 0 (lengths only on the GPU) and a split count fixed
//   per Tq from the cache's capacity Tmax (decode.h): the same launch for every length.
//
// GQA: gpt_qkv_layout is the one place that says how many K/V heads there are and where q, k and v sit
// in a qkv row (B, T, NH + 2·NKV, HD); everything here reads it.
//
// The decoder borrows a GPTModel for its parameters, its cuBLASLt context, its attention backend
// (prefill) and its stream (the trainer's model while sampling during training; an inference-only
// model in --generate, gpt_inference_model.cuh) and owns its own activations (B·Tq_max rows), the
// cache and the prefill's buffers. Everything runs on model->stream.
#ifndef GPT_DECODE_CUH
#define GPT_DECODE_CUH

#include "attention/decode.h"
#include "layers/generate/decode_linear.cuh"
#include "layers/model/gpt_model.cuh"

// ---- the packed qkv row ---------------------------------------------------------------------------

// Where q, k and v sit in a row of the qkv activation, in elements, and how many K/V heads there are.
typedef struct {
    int NH, NKV, HD;
    long row;                  // elements per row: (NH + 2·NKV)·HD
    long q_off, k_off, v_off;  // q heads at [q_off, +NH·HD), k at [k_off, +NKV·HD), v at [v_off, +NKV·HD)
} GPTQKVLayout;

// The one place that knows the K/V head count (the model's, GPTConfig.num_kv_heads).
static GPTQKVLayout gpt_qkv_layout(const GPTModel* m) {
    GPTQKVLayout l;
    l.NH = m->NH, l.NKV = m->NKV, l.HD = m->HD;
    l.q_off = 0;
    l.k_off = (long)l.NH * l.HD;
    l.v_off = (long)(l.NH + l.NKV) * l.HD;
    l.row = (long)(l.NH + 2 * l.NKV) * l.HD;
    return l;
}

// ---- KV cache -------------------------------------------------------------------------------------

typedef struct {
    int L, B, Tmax, NKV, HD;
    __nv_bfloat16 *k, *v;  // (L, B, Tmax, NKV, HD)
    int* lengths;          // (B) on the GPU
    int* starts;           // (B) on the GPU: the lengths before the last advance (where it appends)
    int* host_lengths;     // (B) the same on the host: bookkeeping of what was enqueued (bounds checks)
    int max_length;        // max of host_lengths
} KVCache;

static size_t kv_cache_layer_elems(const KVCache* c) { return (size_t)c->B * c->Tmax * c->NKV * c->HD; }

// ---- kernels --------------------------------------------------------------------------------------

// starts[b] = lengths[b], lengths[b] += Tq (one thread per sequence).
static __global__ void gpt_decode_advance_kernel(int* lengths, int* starts, int B, int Tq) {
    KernelTraceStamp trace = kernel_trace_begin();
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B) {
        starts[b] = lengths[b];
        lengths[b] += Tq;
    }
    kernel_trace_end(&trace, 'A', (unsigned)B);
}

// One thread per 8 channels of a row (b, t): out[row] = wte[tokens[row]] + wpe[lengths[b] − Tq + t].
static __global__ void __launch_bounds__(256)
    gpt_decode_embed_kernel(__nv_bfloat16* __restrict__ out, const int* __restrict__ tokens,
                            const int* __restrict__ lengths, const __nv_bfloat16* __restrict__ wte,
                            const __nv_bfloat16* __restrict__ wpe, int Tq, int C, size_t total_vecs) {
    KernelTraceStamp trace = kernel_trace_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total_vecs) return;
    const int vecs = C / 8;
    const size_t row = i / vecs;
    const int c = (int)(i % vecs) * 8;
    const int b = (int)(row / Tq), t = (int)(row % Tq);
    const int pos = lengths[b] - Tq + t;
    float a[8], p[8];
    bf16x8_unpack(a, load16(wte + (size_t)tokens[row] * C + c));
    bf16x8_unpack(p, load16(wpe + (size_t)pos * C + c));
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] += p[k];
    store16(out + row * C + c, bf16x8_pack(a));
    kernel_trace_end(&trace, 'E', 0);
}

// One thread per 8 channels: out[b] = in[b·Tq + Tq − 1] (the last new row of each sequence).
static __global__ void gpt_decode_last_rows_kernel(__nv_bfloat16* __restrict__ out,
                                                   const __nv_bfloat16* __restrict__ in, int B, int Tq, int C) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int vecs = C / 8;
    if (i >= B * vecs) return;
    const int b = i / vecs, c = (i % vecs) * 8;
    store16(out + (size_t)b * C + c, load16(in + ((size_t)b * Tq + Tq - 1) * C + c));
}

// The final LayerNorm of a step's B rows, out = LN(x)·w + b: layernorm_forward's arithmetic
// (layernorm_warp_statistics and layernorm_chunk, a warp per row; the same bits), arranged for a few
// rows at the end of a step: a programmatic dependent launch whose weight and bias loads (no kernel
// writes them) go out before it waits for the last layer, so only the read of x is left after.
template <int VPL>  // 16-byte chunks per lane: ceil(C / 256), as layernorm_max_vpl rounds it
static __global__ void __launch_bounds__(LN_FWD_THREADS)
    gpt_decode_layernorm_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                const __nv_bfloat16* __restrict__ weight, const __nv_bfloat16* __restrict__ bias, int N,
                                int C) {
    constexpr bool EARLY = VPL <= 12;  // beyond, the weights would not fit beside x in registers
    const int lane = threadIdx.x % 32, row = blockIdx.x * (LN_FWD_THREADS / 32) + threadIdx.x / 32;
    const int vecs = C / 8;
    KernelTraceStamp trace = kernel_trace_begin();
    uint4 w[VPL], b[VPL], v[VPL];  // w and b unused (and not allocated) unless EARLY
#pragma unroll
    for (int i = 0; i < VPL; i++)
        if (EARLY && i * 32 + lane < vecs) {
            w[i] = load16(weight + (i * 32 + lane) * 8);
            b[i] = load16(bias + (i * 32 + lane) * 8);
        }
    wait_for_prerequisite_grid();
    kernel_trace_ready(&trace);
    allow_dependent_launch();
    if (row >= N) return;
#pragma unroll
    for (int i = 0; i < VPL; i++)
        if (i * 32 + lane < vecs) v[i] = load16(x + (size_t)row * C + (i * 32 + lane) * 8);
    float mean, rstd;
    layernorm_warp_statistics<VPL>(v, C, &mean, &rstd);
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c < C)
            store16(out + (size_t)row * C + c, layernorm_chunk(v[i], EARLY ? w[i] : load16(weight + c),
                                                               EARLY ? b[i] : load16(bias + c), mean, rstd));
    }
    kernel_trace_end(&trace, 'N', (unsigned)N);
}

static void gpt_decode_layernorm(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* weight,
                                 const __nv_bfloat16* bias, int N, int C, cudaStream_t s) {
    layernorm_check("gpt_decode_layernorm", N, C);
    LAYER_REQUIRE(layer_is_aligned16(out) && layer_is_aligned16(x) && layer_is_aligned16(weight) &&
                      layer_is_aligned16(bias),
                  "gpt_decode_layernorm: out, x, weight and bias must be 16-byte aligned");
    const dim3 grid((unsigned)layer_ceil_div((size_t)N, LN_FWD_THREADS / 32));
    switch (layernorm_max_vpl(C)) {
#define GPT_DECODE_LN_CASE(V)                                                                                      \
    case V:                                                                                                        \
        CUDA_CHECK(launch_dependent(gpt_decode_layernorm_kernel<V>, grid, LN_FWD_THREADS, 0, s, out, x, weight, bias, \
                                    N, C));                                                                        \
        break;
        LAYERNORM_FOR_EACH_VPL(GPT_DECODE_LN_CASE)
#undef GPT_DECODE_LN_CASE
    }
}

// Rows of `in` (B, T, C) at T − 1, 2T − 1, ... into out (B, C).
static void gpt_decode_last_rows(__nv_bfloat16* out, const __nv_bfloat16* in, int B, int T, int C, cudaStream_t s) {
    gpt_decode_last_rows_kernel<<<(unsigned)layer_ceil_div((size_t)B * (C / 8), 256), 256, 0, s>>>(out, in, B, T, C);
    CUDA_CHECK(cudaGetLastError());
}

// ---- the decoder ----------------------------------------------------------------------------------

// The activations of one step, B·max_tq rows each (see the top of the file), in one allocation.
#define GPT_DECODE_ACTIVATIONS(X)                      \
    X(x,        __nv_bfloat16, N * C)                  \
    X(r2,       __nv_bfloat16, N * C)                  \
    X(ln,       __nv_bfloat16, N * C)                  \
    X(qkv,      __nv_bfloat16, N * R)                  \
    X(atty,     __nv_bfloat16, N * C)                  \
    X(fch,      __nv_bfloat16, N * 4 * C)              \
    X(fch_gelu, __nv_bfloat16, N * 4 * C)              \
    X(last,     __nv_bfloat16, B * C)                  \
    X(logits,   __nv_bfloat16, B * Vp) /* (B, Vp) */   \
    X(tokens,   int,           N)      /* (B, Tq): the step's input, written by the host or the sampler */

typedef struct {
    GPTModel* model;  // borrowed: parameters, matmul context, attention backend, stream
    GPTQKVLayout qkv_layout;
    KVCache cache;
    int B, max_tq;
#define GPT_DECODE_MEMBER(name, type, count) type* name;
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_MEMBER)
#undef GPT_DECODE_MEMBER
    void* acts_memory;
    size_t acts_bytes;
    void* workspace;  // the decode attention's split workspace
    size_t workspace_bytes;
    int* host_tokens;  // pinned (B, max_tq): the step's tokens on their way up
    int splits_override;  // 0: the split count for the cache's capacity; else this many splits (tests)
    void* prefill_memory;  // the prefill's buffers (gpt_prefill.cuh), grown on demand
    size_t prefill_bytes;
} GPTDecoder;

// Allocates the cache (keys and values, the lengths) for B sequences of up to Tmax positions.
static void gpt_decoder_alloc_cache(GPTDecoder* d, int Tmax, const char* hint) {
    KVCache* c = &d->cache;
    c->L = d->model->L, c->B = d->B, c->Tmax = Tmax, c->NKV = d->qkv_layout.NKV, c->HD = d->qkv_layout.HD;
    const size_t cache_bytes = (size_t)c->L * kv_cache_layer_elems(c) * sizeof(__nv_bfloat16);
    cuda_malloc_or_explain((void**)&c->k, cache_bytes, "the KV cache (keys)", hint);
    cuda_malloc_or_explain((void**)&c->v, cache_bytes, "the KV cache (values)", hint);
    CUDA_CHECK(cudaMalloc((void**)&c->lengths, d->B * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&c->starts, d->B * sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(c->lengths, 0, d->B * sizeof(int), d->model->stream));
    CUDA_CHECK(cudaMemsetAsync(c->starts, 0, d->B * sizeof(int), d->model->stream));
    c->host_lengths = (int*)calloc(d->B, sizeof(int));
}

// Bytes of the KV cache (keys and values).
static size_t gpt_decoder_cache_bytes(const GPTDecoder* d) {
    return 2 * (size_t)d->cache.L * kv_cache_layer_elems(&d->cache) * sizeof(__nv_bfloat16);
}

// The activations of B·max_tq rows, in one allocation cut as GPT_DECODE_ACTIVATIONS says.
static void gpt_decoder_alloc_activations(GPTDecoder* d, const char* hint) {
    const size_t B = d->B, N = (size_t)d->B * d->max_tq, C = d->model->C, R = d->qkv_layout.row, Vp = d->model->Vp;
    size_t bytes = 0;
#define GPT_DECODE_SIZE(name, type, count) bytes += layer_align256((count) * sizeof(type));
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_SIZE)
#undef GPT_DECODE_SIZE
    cuda_malloc_or_explain(&d->acts_memory, bytes, "the decoding activations", hint);
    d->acts_bytes = bytes;
    char* base = (char*)d->acts_memory;
#define GPT_DECODE_POINTER(name, type, count) d->name = (type*)base, base += layer_align256((count) * sizeof(type));
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_POINTER)
#undef GPT_DECODE_POINTER
}

// Allocates the cache for B sequences of up to Tmax positions (Tmax ≤ model->maxT, the rows of wpe)
// and the activations for steps of up to max_tq tokens per sequence; lengths start at 0. Returns 0,
// or -1 after printing "error: ..." for an unusable shape. Out of memory exits with what to lower.
static int gpt_decoder_create(GPTDecoder* d, GPTModel* model, int B, int Tmax, int max_tq) {
    memset(d, 0, sizeof(*d));
    if (B < 1 || Tmax < 1 || Tmax > model->maxT || max_tq < 1 || max_tq > DECODE_MAX_QUERY_TOKENS) {
        fprintf(stderr, "error: generation of %d sequences of up to %d positions, %d tokens per step: need at least "
                        "one sequence, 1 <= positions <= the model's %d positions, 1 <= tokens per step <= %d\n",
                B, Tmax, max_tq, model->maxT, DECODE_MAX_QUERY_TOKENS);
        return -1;
    }
    d->model = model;
    d->qkv_layout = gpt_qkv_layout(model);
    d->B = B, d->max_tq = max_tq;
    const GPTQKVLayout* q = &d->qkv_layout;
    DecodeShape shape = {B, max_tq, q->NH, q->NKV, q->HD, Tmax};
    char why[512];
    if (decode_check(&shape, 0, 1, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: the decode attention cannot run this model: %s\n", why);
        return -1;
    }
    char hint[256];
    snprintf(hint, sizeof(hint), "the cache grows with samples x positions (%d x %d): lower --num-samples or the "
                                 "tokens to generate", B, Tmax);
    gpt_decoder_alloc_cache(d, Tmax, hint);
    gpt_decoder_alloc_activations(d, hint);
    // The split workspace for one token per sequence and as many splits as the cache has tiles (capped);
    // a step that would need more (several tokens per step) runs with fewer splits.
    DecodeShape one = shape;
    one.Tq = 1;
    int most = (Tmax + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    if (most > DECODE_MAX_SPLITS) most = DECODE_MAX_SPLITS;
    d->workspace_bytes = decode_workspace_bytes(&one, most);
    if (d->workspace_bytes) cuda_malloc_or_explain(&d->workspace, d->workspace_bytes, "the decode workspace", hint);
    CUDA_CHECK(cudaMallocHost((void**)&d->host_tokens, (size_t)B * max_tq * sizeof(int)));
    return 0;
}

static void gpt_decoder_destroy(GPTDecoder* d) {
    if (d->host_tokens) CUDA_CHECK(cudaFreeHost(d->host_tokens));
    if (d->workspace) CUDA_CHECK(cudaFree(d->workspace));
    if (d->acts_memory) CUDA_CHECK(cudaFree(d->acts_memory));
    if (d->prefill_memory) CUDA_CHECK(cudaFree(d->prefill_memory));
    if (d->cache.k) CUDA_CHECK(cudaFree(d->cache.k));
    if (d->cache.v) CUDA_CHECK(cudaFree(d->cache.v));
    if (d->cache.lengths) CUDA_CHECK(cudaFree(d->cache.lengths));
    if (d->cache.starts) CUDA_CHECK(cudaFree(d->cache.starts));
    free(d->cache.host_lengths);
    memset(d, 0, sizeof(*d));
}

// Empties the cache (every sequence back to length 0).
static void gpt_decoder_reset(GPTDecoder* d) {
    CUDA_CHECK(cudaMemsetAsync(d->cache.lengths, 0, d->B * sizeof(int), d->model->stream));
    memset(d->cache.host_lengths, 0, d->B * sizeof(int));
    d->cache.max_length = 0;
}

// The host's bookkeeping of a step of Tq tokens for sequences [b0, b0 + n) (the GPU's lengths advance
// in the step itself); exits when a sequence would pass the cache's Tmax positions.
static void gpt_decoder_count(GPTDecoder* d, int b0, int n, int Tq) {
    KVCache* c = &d->cache;
    for (int b = b0; b < b0 + n; b++) {
        if (c->host_lengths[b] + Tq > c->Tmax) {
            fprintf(stderr, "error: sequence %d would reach %d positions, past the %d the cache holds (at most the "
                            "model's positions): generate fewer tokens or use a shorter prompt\n",
                    b, c->host_lengths[b] + Tq, c->Tmax);
            exit(1);
        }
        c->host_lengths[b] += Tq;
        if (c->host_lengths[b] > c->max_length) c->max_length = c->host_lengths[b];
    }
}

// Copies K and V of `rows` rows per sequence from qkv (n, rows, R) of layer l into the cache of
// sequences [b0, b0 + n), at the positions starts[b] .. starts[b] + rows − 1.
static void gpt_decoder_append(GPTDecoder* d, int l, const __nv_bfloat16* qkv, int b0, int n, int rows) {
    const KVCache* c = &d->cache;
    const GPTQKVLayout* q = &d->qkv_layout;
    const size_t off = (size_t)l * kv_cache_layer_elems(c) + (size_t)b0 * c->Tmax * c->NKV * c->HD;
    decode_cache_append(qkv + q->k_off, qkv + q->v_off, q->row, n, rows, q->NKV, q->HD, c->starts + b0, c->k + off,
                        c->v + off, c->Tmax, d->model->stream);
}

// The splits of a step of Tq tokens per sequence: fixed by the cache's capacity (not the lengths, so
// that one captured step serves every length), at most one per tile and as many as the workspace holds.
static int gpt_decoder_splits(const GPTDecoder* d, const DecodeShape* shape) {
    int splits = d->splits_override ? d->splits_override : decode_num_splits(shape, shape->Tmax);
    const int tiles = (shape->Tmax + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    if (splits > tiles) splits = tiles;
    const size_t per_split = decode_workspace_bytes(shape, 2) / 2;
    if (splits > 1 && decode_workspace_bytes(shape, splits) > d->workspace_bytes)
        splits = (int)(d->workspace_bytes / per_split);
    return splits > 1 ? splits : 1;
}

// The decode attention of layer l for Tq new tokens per sequence: q from d->qkv, out into d->atty.
static void gpt_decoder_attention(GPTDecoder* d, int l, int Tq) {
    const KVCache* c = &d->cache;
    const GPTQKVLayout* q = &d->qkv_layout;
    DecodeArgs a;
    memset(&a, 0, sizeof(a));
    a.shape.B = d->B, a.shape.Tq = Tq, a.shape.NH = q->NH, a.shape.NKV = q->NKV, a.shape.HD = q->HD;
    a.shape.Tmax = c->Tmax;
    a.q = d->qkv + q->q_off;
    a.q_stride = q->row;
    a.k_cache = c->k + (size_t)l * kv_cache_layer_elems(c);
    a.v_cache = c->v + (size_t)l * kv_cache_layer_elems(c);
    a.lengths = c->lengths;
    a.max_length = 0;  // the lengths live on the GPU only
    a.out = d->atty;
    a.out_stride = (long)q->NH * q->HD;
    a.lse = NULL;
    a.num_splits = gpt_decoder_splits(d, &a.shape);
    a.workspace = a.num_splits > 1 ? d->workspace : NULL;
    if (l == 0) {
        char why[512];
        if (decode_check_args(&a, why, sizeof(why)) != 0) {
            fprintf(stderr, "error: decode attention: %s\n", why);
            exit(1);
        }
    }
    decode_attention(&a, d->model->stream);
}

// The buffers one block runs through (rows N; R = the qkv row): the step's or the prefill's.
typedef struct {
    __nv_bfloat16 *x, *r2, *ln, *qkv, *atty, *fch, *fch_gelu;  // (N, C) but qkv (N, R), fch* (N, 4C)
} GPTInferenceActs;

// Block l on the N rows of a.x (in and out): the training forward's recipe without the statistics it
// keeps for the backward. attend(user, l) writes a.atty from a.qkv (and puts K and V in the cache):
// the decode attention for a step, the full causal attention for a prefill.
static void gpt_inference_block(GPTModel* m, const GPTInferenceActs* a, int l, int N, int R,
                                void (*attend)(void* user, int l), void* user) {
    const int C = m->C;
    const size_t lC = (size_t)l * C;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    layernorm_forward(a->ln, NULL, NULL, a->x, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, N, C, s);
    matmul_forward(mm, a->qkv, a->ln, p[GPT_QKVW] + lC * R, p[GPT_QKVB] + (size_t)l * R, N, C, R, NULL);
    attend(user, l);
    matmul_forward_residual(mm, a->r2, a->x, a->atty, p[GPT_ATTPROJW] + lC * C, p[GPT_ATTPROJB] + lC, N, C, C);
    layernorm_forward(a->ln, NULL, NULL, a->r2, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, N, C, s);
    matmul_forward(mm, a->fch_gelu, a->ln, p[GPT_FCW] + lC * 4 * C, p[GPT_FCB] + lC * 4, N, C, 4 * C, a->fch);
    matmul_forward_residual(mm, a->x, a->r2, a->fch_gelu, p[GPT_FCPROJW] + lC * 4 * C, p[GPT_FCPROJB] + lC, N, 4 * C,
                            C);
}

// Rows up to which a step's linear layers run through decode_linear: a GPT3-1.3B step on an H200 was
// faster than through cuBLASLt at 1 and 4 sequences and slower at 8 (layers/PERF_NOTES.md, 34).
#define GPT_DECODE_LINEAR_ROWS 4

// Whether a step of N rows runs its linear layers through decode_linear (each a read of its weights,
// four launches per layer) rather than gpt_inference_block's cuBLASLt GEMMs.
static int gpt_decoder_reads_weights_once(const GPTDecoder* d, int N) {
    const GPTModel* m = d->model;
    return N <= GPT_DECODE_LINEAR_ROWS &&
           decode_linear_supported(N, m->C, (int)d->qkv_layout.row) && decode_linear_supported(N, 4 * m->C, m->C);
}

// Block l of a step of N = B·Tq ≤ GPT_DECODE_LINEAR_ROWS rows (d->x in and out): the recipe of gpt_inference_block with
// each LayerNorm inside the next product, and the QKV product appending K and V to the cache.
static void gpt_decode_block_small(GPTDecoder* d, int l, int Tq) {
    GPTModel* m = d->model;
    const KVCache* c = &d->cache;
    const GPTQKVLayout* q = &d->qkv_layout;
    const int C = m->C, N = d->B * Tq, R = (int)q->row;
    const size_t lC = (size_t)l * C, layer = (size_t)l * kv_cache_layer_elems(c);
    __nv_bfloat16* const* p = m->param_tensors;
    cudaStream_t s = m->stream;
    DecodeLinearOps qkv = {p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, p[GPT_QKVB] + (size_t)l * R, NULL, 0,
                           {c->k + layer, c->v + layer, c->starts, Tq, c->Tmax, (int)q->k_off, (int)q->v_off,
                            q->NKV * q->HD}};
    decode_linear(d->qkv, d->x, p[GPT_QKVW] + lC * R, &qkv, N, C, R, s);
    gpt_decoder_attention(d, l, Tq);
    const DecodeLinearOps proj = {NULL, NULL, p[GPT_ATTPROJB] + lC, d->x, 0, {}};
    decode_linear(d->r2, d->atty, p[GPT_ATTPROJW] + lC * C, &proj, N, C, C, s);
    const DecodeLinearOps fc = {p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, p[GPT_FCB] + lC * 4, NULL, 1, {}};
    decode_linear(d->fch_gelu, d->r2, p[GPT_FCW] + lC * 4 * C, &fc, N, C, 4 * C, s);
    const DecodeLinearOps fcproj = {NULL, NULL, p[GPT_FCPROJB] + lC, d->r2, 0, {}};
    decode_linear(d->x, d->fch_gelu, p[GPT_FCPROJW] + lC * 4 * C, &fcproj, N, 4 * C, C, s);
}

typedef struct {
    GPTDecoder* d;
    int Tq;
} GPTDecodeAttend;

// A step's attend: the new rows' K and V to the cache, then the decode attention.
static void gpt_decode_attend(void* user, int l) {
    const GPTDecodeAttend* a = (const GPTDecodeAttend*)user;
    gpt_decoder_append(a->d, l, a->d->qkv, 0, a->d->B, a->Tq);
    gpt_decoder_attention(a->d, l, a->Tq);
}

// The step on d->tokens (B, Tq), already on the GPU: afterwards d->logits (B, Vp) holds the
// next-token logits of each sequence. Only kernels and GEMMs on model->stream, every changing value
// read from device memory: capturable in a CUDA graph. The host's bookkeeping (gpt_decoder_count) is
// the caller's.
static void gpt_decoder_forward_tokens(GPTDecoder* d, int Tq) {
    GPTModel* m = d->model;
    const int B = d->B, C = m->C, L = m->L, N = B * Tq, Vp = m->Vp, R = (int)d->qkv_layout.row;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;

    gpt_decode_advance_kernel<<<(B + 127) / 128, 128, 0, s>>>(d->cache.lengths, d->cache.starts, B, Tq);
    CUDA_CHECK(cudaGetLastError());
    const size_t vecs = (size_t)N * (C / 8);
    gpt_decode_embed_kernel<<<(unsigned)layer_ceil_div(vecs, 256), 256, 0, s>>>(d->x, d->tokens, d->cache.lengths,
                                                                               p[GPT_WTE], p[GPT_WPE], Tq, C, vecs);
    CUDA_CHECK(cudaGetLastError());
    const int small = gpt_decoder_reads_weights_once(d, N);
    const GPTInferenceActs acts = {d->x, d->r2, d->ln, d->qkv, d->atty, d->fch, d->fch_gelu};
    GPTDecodeAttend attend = {d, Tq};
    for (int l = 0; l < L; l++) {
        if (small) gpt_decode_block_small(d, l, Tq);
        else gpt_inference_block(m, &acts, l, N, R, gpt_decode_attend, &attend);
    }
    // LNf of the last row of each sequence only (a LayerNorm is per row): one token, all rows. The LM
    // head through cuBLASLt at every row count: one large product, where it streams faster than
    // decode_linear (52-58 against 64 µs on GPT3-1.3B, build/bench_decode_linear).
    const __nv_bfloat16* last = d->x;
    if (Tq > 1) gpt_decode_last_rows(d->last, d->x, B, Tq, C, s), last = d->last;
    gpt_decode_layernorm(d->ln, last, p[GPT_LNFW], p[GPT_LNFB], B, C, s);
    matmul_forward(mm, d->logits, d->ln, p[GPT_WTE], NULL, B, C, Vp, NULL);
}

// One step on tokens (B, Tq) from the host (row-major: sequence b's new tokens at b·Tq ..), each in
// [0, Vp): uploads them, then gpt_decoder_forward_tokens. Afterwards d->logits (B, Vp) holds the
// next-token logits of each sequence (on the GPU, not synchronized).
static void gpt_decoder_step(GPTDecoder* d, const int* tokens, int Tq) {
    LAYER_REQUIRE(Tq >= 1 && Tq <= d->max_tq, "gpt_decoder_step: Tq = %d, the decoder was made for 1..%d", Tq,
                  d->max_tq);
    const size_t N = (size_t)d->B * Tq;
    cudaStream_t s = d->model->stream;
    CUDA_CHECK(cudaStreamSynchronize(s));  // the previous step's upload of host_tokens is done
    memcpy(d->host_tokens, tokens, N * sizeof(int));
    CUDA_CHECK(cudaMemcpyAsync(d->tokens, d->host_tokens, N * sizeof(int), cudaMemcpyHostToDevice, s));
    gpt_decoder_count(d, 0, d->B, Tq);
    gpt_decoder_forward_tokens(d, Tq);
}

#endif  // GPT_DECODE_CUH
