// gpt_prefill.cuh: the prompt into the decoder (gpt_decode.cuh): P tokens of each of n sequences
// through the training forward's layers at once (causal attention of the model's backend, flash2 by
// default), their keys and values into the KV cache at positions 0 .. P−1, and the next-token logits
// of each sequence into d->logits. Inference only: one layer's activations at a time (nothing is
// kept for a backward), in passes of at most GPT_PREFILL_MAX_ROWS rows, so a long prompt or a large
// batch needs neither the training activations nor a model sized for it.
//
// Shapes (a pass of n' ≤ n sequences, Np = n'·P rows, R = (NH + 2·NKV)·HD):
//   x, r2, ln, atty (Np, C)   qkv (Np, R)   fch, fch_gelu (Np, 4C)   lse (n', NH, P) fp32
//   x (Np, C)    = wte[tokens] + wpe[0 .. P−1]
//   per block l: gpt_inference_block (gpt_decode.cuh, the decode step's too) on these buffers, with
//                cache[l][b, 0 .. P−1] = the k and v heads of qkv and the backend's causal attention
//   last (n', C) = x's rows P−1, 2P−1, ...;  logits[b] = LNf(last) · wteᵀ
// The same kernels and GEMM calls as the training forward, so the same bits as gpt_model_forward
// wherever cuBLASLt picks the same algorithm for the same shape.
#ifndef GPT_PREFILL_CUH
#define GPT_PREFILL_CUH

#include "layers/generate/gpt_decode.cuh"

#define GPT_PREFILL_MAX_ROWS 16384  // rows per pass: large GEMMs, about 0.7 GB of buffers at C = 2560

// The prefill's buffers for a pass of n sequences of P tokens, cut from d->prefill_memory.
#define GPT_PREFILL_BUFFERS(X)                          \
    X(x,        __nv_bfloat16, Np * C)                  \
    X(r2,       __nv_bfloat16, Np * C)                  \
    X(ln,       __nv_bfloat16, Np * C)                  \
    X(qkv,      __nv_bfloat16, Np * R)                  \
    X(atty,     __nv_bfloat16, Np * C)                  \
    X(fch,      __nv_bfloat16, Np * 4 * C)              \
    X(fch_gelu, __nv_bfloat16, Np * 4 * C)              \
    X(lse,      float,         Np * NH)                 \
    X(saved,    unsigned char, saved_bytes)             \
    X(scratch,  unsigned char, workspace_bytes)

typedef struct {
#define GPT_PREFILL_MEMBER(name, type, count) type* name;
    GPT_PREFILL_BUFFERS(GPT_PREFILL_MEMBER)
#undef GPT_PREFILL_MEMBER
    AttentionShape shape;
} GPTPrefillPass;

// Sequences per pass for prompts of P tokens.
static int gpt_prefill_pass_sequences(int n, int P) {
    int per = GPT_PREFILL_MAX_ROWS / P;
    if (per < 1) per = 1;
    return per < n ? per : n;
}

// Cuts (growing d->prefill_memory first when it is too small) the buffers of a pass of n sequences
// of P tokens. Returns them with the attention shape; exits when the backend cannot run it.
static GPTPrefillPass gpt_prefill_buffers(GPTDecoder* d, int n, int P) {
    const GPTModel* m = d->model;
    GPTPrefillPass pass;
    memset(&pass, 0, sizeof(pass));
    pass.shape.B = n, pass.shape.T = P, pass.shape.NH = m->NH, pass.shape.HD = m->HD, pass.shape.NKV = m->NKV;
    pass.shape.causal = 1;
    char why[512];
    if (attention_check(m->backend, &pass.shape, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: the prefill's attention (%s) cannot run %d x %d: %s\n",
                attention_backend_name(m->backend), n, P, why);
        exit(1);
    }
    const size_t Np = (size_t)n * P, C = m->C, R = d->qkv_layout.row, NH = m->NH;
    const size_t saved_bytes = attention_saved_bytes(m->backend, &pass.shape);
    const size_t workspace_bytes = attention_workspace_bytes(m->backend, &pass.shape);
    size_t bytes = 0;
#define GPT_PREFILL_SIZE(name, type, count) bytes += layer_align256((count) * sizeof(type));
    GPT_PREFILL_BUFFERS(GPT_PREFILL_SIZE)
#undef GPT_PREFILL_SIZE
    if (bytes > d->prefill_bytes) {
        if (d->prefill_memory) CUDA_CHECK(cudaFree(d->prefill_memory));
        cuda_malloc_or_explain(&d->prefill_memory, bytes, "the prefill's activations",
                               "they grow with the prompt's length (and with the batch up to "
                               "GPT_PREFILL_MAX_ROWS rows): shorten the prompt");
        d->prefill_bytes = bytes;
    }
    char* base = (char*)d->prefill_memory;
#define GPT_PREFILL_POINTER(name, type, count) pass.name = (type*)base, base += layer_align256((count) * sizeof(type));
    GPT_PREFILL_BUFFERS(GPT_PREFILL_POINTER)
#undef GPT_PREFILL_POINTER
    return pass;
}

typedef struct {
    GPTDecoder* d;
    const GPTPrefillPass* pass;
    int b0;
} GPTPrefillAttend;

// A prefill's attend (gpt_inference_block) over sequences [b0, b0 + n) of P tokens: K and V of every
// position to the cache, then the model's causal attention backend on the whole prompt.
static void gpt_prefill_attend(void* user, int l) {
    const GPTPrefillAttend* u = (const GPTPrefillAttend*)user;
    const GPTPrefillPass* pass = u->pass;
    GPTModel* m = u->d->model;
    const GPTQKVLayout* q = &u->d->qkv_layout;
    gpt_decoder_append(u->d, l, pass->qkv, u->b0, pass->shape.B, pass->shape.T);
    AttentionArgs a;
    memset(&a, 0, sizeof(a));
    a.shape = pass->shape;
    a.q = pass->qkv + q->q_off, a.k = pass->qkv + q->k_off, a.v = pass->qkv + q->v_off;
    a.qkv_stride = q->row;
    a.out = pass->atty, a.out_stride = m->C;
    a.lse = pass->lse;
    a.saved = pass->saved, a.workspace = pass->scratch;
    attention_forward(m->backend, &m->att_ctx, &a, m->stream);  // atty (n, P, NH, HD)
}

// One pass: sequences [b0, b0 + n) from tokens (n, P) on the GPU.
static void gpt_prefill_pass(GPTDecoder* d, const int* tokens, int b0, int n, int P) {
    GPTModel* m = d->model;
    const int C = m->C;
    cudaStream_t s = m->stream;
    __nv_bfloat16* const* p = m->param_tensors;
    const GPTPrefillPass pass = gpt_prefill_buffers(d, n, P);
    // starts = 0 (the cache rows are empty), lengths = P
    gpt_decode_advance_kernel<<<(n + 127) / 128, 128, 0, s>>>(d->cache.lengths + b0, d->cache.starts + b0, n, P);
    CUDA_CHECK(cudaGetLastError());
    encoder_forward(pass.x, tokens, p[GPT_WTE], p[GPT_WPE], n, P, C, s);
    const GPTInferenceActs acts = {pass.x, pass.r2, pass.ln, pass.qkv, pass.atty, pass.fch, pass.fch_gelu};
    GPTPrefillAttend attend = {d, &pass, b0};
    for (int l = 0; l < m->L; l++)
        gpt_inference_block(m, &acts, l, n * P, (int)d->qkv_layout.row, gpt_prefill_attend, &attend);
    // logits of rows b0 .. b0+n−1 from the last position of each sequence (LNf of those rows only)
    gpt_decode_last_rows(pass.r2, pass.x, n, P, C, s);
    layernorm_forward(pass.ln, NULL, NULL, pass.r2, p[GPT_LNFW], p[GPT_LNFB], n, C, s);
    matmul_forward(&m->matmul, d->logits + (size_t)b0 * m->Vp, pass.ln, p[GPT_WTE], NULL, n, C, m->Vp, NULL);
}

// Prefill of sequences [b0, b0 + n), whose cache rows must be empty (fresh or gpt_decoder_reset), with
// prompts (n, P) on the GPU (tokens < V): their caches hold positions 0 .. P−1 and rows b0 .. of
// d->logits their next-token logits afterwards. Sequences may be prefilled with different P, each in
// its own call; the decode steps then continue every sequence from its own length.
static void gpt_decoder_prefill_rows(GPTDecoder* d, const int* prompts, int b0, int n, int P) {
    LAYER_REQUIRE(b0 >= 0 && n >= 1 && b0 + n <= d->B && P >= 1, "gpt_decoder_prefill_rows: sequences %d..%d of %d, "
                  "P = %d", b0, b0 + n - 1, d->B, P);
    for (int b = b0; b < b0 + n; b++)
        LAYER_REQUIRE(d->cache.host_lengths[b] == 0, "gpt_decoder_prefill_rows: sequence %d is not empty "
                      "(gpt_decoder_reset first)", b);
    gpt_decoder_count(d, b0, n, P);  // exits when P does not fit the cache
    const int per = gpt_prefill_pass_sequences(n, P);
    for (int i = 0; i < n; i += per) {
        const int k = n - i < per ? n - i : per;
        gpt_prefill_pass(d, prompts + (size_t)i * P, b0 + i, k, P);
    }
}

// Prefill of all B sequences with prompts (B, P) on the GPU (see gpt_decoder_prefill_rows).
static void gpt_decoder_prefill(GPTDecoder* d, const int* prompts, int P) {
    gpt_decoder_prefill_rows(d, prompts, 0, d->B, P);
}

// Frees the prefill's buffers (generation keeps only the cache and one step's activations).
static void gpt_decoder_release_prefill(GPTDecoder* d) {
    if (d->prefill_memory) CUDA_CHECK(cudaFree(d->prefill_memory));
    d->prefill_memory = NULL, d->prefill_bytes = 0;
}

#endif  // GPT_PREFILL_CUH
