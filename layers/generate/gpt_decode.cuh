// gpt_decode.cuh: the model for generation: a KV cache and a cached decode step that runs Tq new
// tokens per sequence (1 ≤ Tq ≤ DECODE_MAX_QUERY_TOKENS) through the same layers as the training
// forward (layers/model/gpt_model.cuh), with the split-KV decode attention (attention/decode.h).
//
// Shapes: L layers, C channels, NH query heads and NKV key/value heads of HD, V vocab padded to Vp;
// B sequences, Tmax positions of cache (≤ maxT, the rows of wpe); N = B·Tq rows per step.
//   KV cache   k, v (L, B, Tmax, NKV, HD) bf16; lengths (B) int32 on the GPU (and a host copy): the
//              positions of sequence b that hold keys.
//   A step on tokens (B, Tq) (sequence b's new tokens go to positions lengths[b] .. lengths[b]+Tq−1):
//     lengths[b] += Tq                                   (first, so the attention sees the new keys)
//     x (N, C)        = wte[tok] + wpe[pos]
//     per block l (the training forward's recipe on N rows; no statistics are saved):
//       ln (N, C)     = LN1(x)
//       qkv (N, R)    = ln · qkvwᵀ + qkvb                R = (NH + 2·NKV)·HD, a row: q | k | v heads
//       cache[l][b, pos] = k, v of the row               (decode_cache_append, attention/decode/kv_cache.cu)
//       atty (N, C)   = decode attention(q straight from the qkv rows (stride R), cache[l], lengths)
//       r2 (N, C)     = x + atty · attprojwᵀ + attprojb  (the residual added in the GEMM, as in training)
//       ln            = LN2(r2)
//       fch_gelu      = GELU(ln · fcwᵀ + fcb);  x = r2 + fch_gelu · fcprojwᵀ + fcprojb
//     ln = LNf(x); last (B, C) = ln's row Tq−1 of each sequence
//     logits (B, Vp) = last · wteᵀ                       (the next-token logits of each sequence)
// Prefill (gpt_decoder_prefill): the prompt (B, T) runs through gpt_model_forward (causal, any
// backend), its K and V are copied from the model's qkv activation into the cache (positions 0..T−1)
// and the logits of its last position start the decoding.
//
// GQA: gpt_qkv_layout is the one place that says how many K/V heads there are and where q, k and v sit
// in a qkv row (B, T, NH + 2·NKV, HD); everything here reads it.
//
// The decoder borrows a GPTModel for its parameters, its cuBLASLt context and its stream (the
// trainer's model while sampling during training; a model sized for the prompt in --generate) and
// owns its own activations (B·Tq_max rows) and the cache. Everything runs on model->stream.
#ifndef GPT_DECODE_CUH
#define GPT_DECODE_CUH

#include "attention/decode.h"
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
    int* host_lengths;     // (B) the same on the host (every change is made by the host)
    int max_length;        // max of host_lengths
} KVCache;

static size_t kv_cache_layer_elems(const KVCache* c) { return (size_t)c->B * c->Tmax * c->NKV * c->HD; }

// ---- kernels --------------------------------------------------------------------------------------

// starts[b] = lengths[b], lengths[b] += Tq (one thread per sequence).
static __global__ void gpt_decode_advance_kernel(int* lengths, int* starts, int B, int Tq) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B) {
        starts[b] = lengths[b];
        lengths[b] += Tq;
    }
}

// One thread per 8 channels of a row (b, t): out[row] = wte[tokens[row]] + wpe[lengths[b] − Tq + t].
static __global__ void __launch_bounds__(256)
    gpt_decode_embed_kernel(__nv_bfloat16* __restrict__ out, const int* __restrict__ tokens,
                            const int* __restrict__ lengths, const __nv_bfloat16* __restrict__ wte,
                            const __nv_bfloat16* __restrict__ wpe, int Tq, int C, size_t total_vecs) {
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
    X(tokens,   int,           N)

typedef struct {
    GPTModel* model;  // borrowed: parameters, matmul context, stream
    GPTQKVLayout qkv_layout;
    KVCache cache;
    int B, max_tq;
#define GPT_DECODE_MEMBER(name, type, count) type* name;
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_MEMBER)
#undef GPT_DECODE_MEMBER
    void* acts_memory;
    void* workspace;  // the decode attention's split workspace
    size_t workspace_bytes;
    int* host_tokens;  // pinned (B, max_tq): the step's tokens on their way up
    int splits_override;  // 0: decode_num_splits; else this many splits (tests)
} GPTDecoder;

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
    if (decode_check(&shape, Tmax, 1, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: the decode attention cannot run this model: %s\n", why);
        return -1;
    }
    KVCache* c = &d->cache;
    c->L = model->L, c->B = B, c->Tmax = Tmax, c->NKV = q->NKV, c->HD = q->HD;
    const size_t cache_bytes = (size_t)c->L * kv_cache_layer_elems(c) * sizeof(__nv_bfloat16);
    char hint[256];
    snprintf(hint, sizeof(hint), "the cache grows with samples x positions (%d x %d): lower --num-samples or the "
                                 "tokens to generate", B, Tmax);
    cuda_malloc_or_explain((void**)&c->k, cache_bytes, "the KV cache (keys)", hint);
    cuda_malloc_or_explain((void**)&c->v, cache_bytes, "the KV cache (values)", hint);
    CUDA_CHECK(cudaMalloc((void**)&c->lengths, B * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&c->starts, B * sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(c->lengths, 0, B * sizeof(int), model->stream));
    c->host_lengths = (int*)calloc(B, sizeof(int));

    // activations
    const size_t N = (size_t)B * max_tq, C = model->C, R = q->row, Vp = model->Vp;
    size_t bytes = 0;
#define GPT_DECODE_SIZE(name, type, count) bytes += layer_align256((count) * sizeof(type));
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_SIZE)
#undef GPT_DECODE_SIZE
    cuda_malloc_or_explain(&d->acts_memory, bytes, "the decoding activations", hint);
    char* base = (char*)d->acts_memory;
#define GPT_DECODE_POINTER(name, type, count) d->name = (type*)base, base += layer_align256((count) * sizeof(type));
    GPT_DECODE_ACTIVATIONS(GPT_DECODE_POINTER)
#undef GPT_DECODE_POINTER

    // The split workspace for one token per sequence and as many splits as the cache has tiles (capped);
    // a step that would need more (several tokens per step) runs with fewer splits.
    DecodeShape one = shape;
    one.Tq = 1;
    int most = (Tmax + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    if (most > DECODE_MAX_SPLITS) most = DECODE_MAX_SPLITS;
    d->workspace_bytes = decode_workspace_bytes(&one, most);
    if (d->workspace_bytes) cuda_malloc_or_explain(&d->workspace, d->workspace_bytes, "the decode workspace", hint);
    CUDA_CHECK(cudaMallocHost((void**)&d->host_tokens, N * sizeof(int)));
    return 0;
}

static void gpt_decoder_destroy(GPTDecoder* d) {
    if (d->host_tokens) CUDA_CHECK(cudaFreeHost(d->host_tokens));
    if (d->workspace) CUDA_CHECK(cudaFree(d->workspace));
    if (d->acts_memory) CUDA_CHECK(cudaFree(d->acts_memory));
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

// lengths[b] += Tq on both sides; exits when a sequence would pass the cache's Tmax positions.
static void gpt_decoder_advance(GPTDecoder* d, int Tq) {
    KVCache* c = &d->cache;
    for (int b = 0; b < d->B; b++) {
        if (c->host_lengths[b] + Tq > c->Tmax) {
            fprintf(stderr, "error: sequence %d would reach %d positions, past the %d the cache holds (at most the "
                            "model's positions): generate fewer tokens or use a shorter prompt\n",
                    b, c->host_lengths[b] + Tq, c->Tmax);
            exit(1);
        }
        c->host_lengths[b] += Tq;
        if (c->host_lengths[b] > c->max_length) c->max_length = c->host_lengths[b];
    }
    gpt_decode_advance_kernel<<<(d->B + 127) / 128, 128, 0, d->model->stream>>>(c->lengths, c->starts, d->B, Tq);
    CUDA_CHECK(cudaGetLastError());
}

// Copies K and V of `rows` rows per sequence from qkv (B, rows, R) of layer l into the cache, at the
// positions starts[b] .. starts[b] + rows − 1 (the lengths before the last advance).
static void gpt_decoder_append(GPTDecoder* d, int l, const __nv_bfloat16* qkv, int rows) {
    const KVCache* c = &d->cache;
    const GPTQKVLayout* q = &d->qkv_layout;
    const size_t off = (size_t)l * kv_cache_layer_elems(c);
    decode_cache_append(qkv + q->k_off, qkv + q->v_off, q->row, d->B, rows, q->NKV, q->HD, c->starts, c->k + off,
                        c->v + off, c->Tmax, d->model->stream);
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
    a.max_length = c->max_length;
    a.out = d->atty;
    a.out_stride = (long)q->NH * q->HD;
    a.lse = NULL;
    // The splits the kernel would pick, as many as the workspace holds.
    int splits = d->splits_override ? d->splits_override : decode_num_splits(&a.shape, c->max_length);
    const int tiles = (c->max_length + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    if (splits > tiles) splits = tiles;  // no split without keys
    const size_t per_split = decode_workspace_bytes(&a.shape, 2) / 2;
    if (splits > 1 && decode_workspace_bytes(&a.shape, splits) > d->workspace_bytes)
        splits = (int)(d->workspace_bytes / per_split);
    a.num_splits = splits > 1 ? splits : 1;
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

// One step: tokens (B, Tq) on the host (row-major: sequence b's new tokens at b·Tq ..), each in
// [0, Vp); afterwards d->logits (B, Vp) holds the next-token logits of each sequence (on the GPU, not
// synchronized). See the top of the file.
static void gpt_decoder_step(GPTDecoder* d, const int* tokens, int Tq) {
    GPTModel* m = d->model;
    LAYER_REQUIRE(Tq >= 1 && Tq <= d->max_tq, "gpt_decoder_step: Tq = %d, the decoder was made for 1..%d", Tq,
                  d->max_tq);
    const int B = d->B, C = m->C, L = m->L, N = B * Tq, Vp = m->Vp;
    const int R = (int)d->qkv_layout.row;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;

    CUDA_CHECK(cudaStreamSynchronize(s));  // the previous step's upload of host_tokens is done
    memcpy(d->host_tokens, tokens, (size_t)N * sizeof(int));
    CUDA_CHECK(cudaMemcpyAsync(d->tokens, d->host_tokens, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    gpt_decoder_advance(d, Tq);
    const size_t vecs = (size_t)N * (C / 8);
    gpt_decode_embed_kernel<<<(unsigned)layer_ceil_div(vecs, 256), 256, 0, s>>>(d->x, d->tokens, d->cache.lengths,
                                                                               p[GPT_WTE], p[GPT_WPE], Tq, C, vecs);
    CUDA_CHECK(cudaGetLastError());
    for (int l = 0; l < L; l++) {
        const size_t lC = (size_t)l * C;
        layernorm_forward(d->ln, NULL, NULL, d->x, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, N, C, s);
        matmul_forward(mm, d->qkv, d->ln, p[GPT_QKVW] + lC * R, p[GPT_QKVB] + (size_t)l * R, N, C, R, NULL);
        gpt_decoder_append(d, l, d->qkv, Tq);
        gpt_decoder_attention(d, l, Tq);
        matmul_forward_residual(mm, d->r2, d->x, d->atty, p[GPT_ATTPROJW] + lC * C, p[GPT_ATTPROJB] + lC, N, C, C);
        layernorm_forward(d->ln, NULL, NULL, d->r2, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, N, C, s);
        matmul_forward(mm, d->fch_gelu, d->ln, p[GPT_FCW] + lC * 4 * C, p[GPT_FCB] + lC * 4, N, C, 4 * C, d->fch);
        matmul_forward_residual(mm, d->x, d->r2, d->fch_gelu, p[GPT_FCPROJW] + lC * 4 * C, p[GPT_FCPROJB] + lC, N,
                                4 * C, C);
    }
    layernorm_forward(d->ln, NULL, NULL, d->x, p[GPT_LNFW], p[GPT_LNFB], N, C, s);
    gpt_decode_last_rows_kernel<<<(unsigned)layer_ceil_div((size_t)B * (C / 8), 256), 256, 0, s>>>(d->last, d->ln, B,
                                                                                                  Tq, C);
    CUDA_CHECK(cudaGetLastError());
    matmul_forward(mm, d->logits, d->last, p[GPT_WTE], NULL, B, C, Vp, NULL);
}

// Prefill: the decoder's model must be sized (B, T) for the prompt (its B the decoder's) with
// inputs (B, T) on the GPU, tokens < V. Runs the training forward (targets = inputs: the loss is not
// used), fills the cache with positions 0..T−1 of every sequence and d->logits with the next-token
// logits after the prompt. The cache must be empty (fresh or gpt_decoder_reset).
static void gpt_decoder_prefill(GPTDecoder* d, const int* inputs) {
    GPTModel* m = d->model;
    LAYER_REQUIRE(m->B == d->B, "gpt_decoder_prefill: the model is sized for %d sequences, the decoder for %d", m->B,
                  d->B);
    LAYER_REQUIRE(d->cache.max_length == 0, "gpt_decoder_prefill: the cache is not empty (gpt_decoder_reset first)");
    LAYER_REQUIRE(m->memory.recompute == RECOMPUTE_NONE, "gpt_decoder_prefill: the model must keep every layer's qkv");
    const int B = m->B, T = m->T, C = m->C;
    gpt_model_forward(m, inputs, inputs);
    gpt_decoder_advance(d, T);
    for (int l = 0; l < m->L; l++) gpt_decoder_append(d, l, gpt_block_acts(m, l).qkv, T);
    // logits (B, Vp) from rows T−1, 2T−1, ... of lnf: the model keeps only one chunk of its LM head's
    // logits (GPT_LM_HEAD_CHUNK_ROWS rows), not all B·T
    gpt_decode_last_rows_kernel<<<(unsigned)layer_ceil_div((size_t)B * (C / 8), 256), 256, 0, m->stream>>>(
        d->last, m->lnf, B, T, C);
    CUDA_CHECK(cudaGetLastError());
    matmul_forward(&m->matmul, d->logits, d->last, m->param_tensors[GPT_WTE], NULL, B, C, m->Vp, NULL);
}

#endif  // GPT_DECODE_CUH
