// gpt_model.cuh: the whole GPT on the GPU (llm.c structure), forward and backward, in bf16 with fp32
// accumulation, built from the layers of this folder and the attention interface.
//
// Shapes: L layers, C channels, NH heads of HD = C / NH, V vocab padded to Vp, maxT positions;
// the model is sized for micro-batches of B sequences of T tokens, N = B·T rows.
//
// Forward (pre-LayerNorm; residual_l = encoded for l = 0, else residual3[l−1]):
//   encoded (N, C)          = wte[inputs] + wpe[t]
//   per block l:
//     ln1 (N, C)            = LN1(residual_l)                       (fused with the previous residual add)
//     qkv (N, 3C)           = ln1 · qkvwᵀ + qkvb                    viewed as (B, T, 3, NH, HD)
//     atty (N, C), lse      = causal attention(qkv)                 atty (B, T, NH, HD), lse (B, NH, T)
//     proj (N, C)           = atty · attprojwᵀ + attprojb
//     residual2, ln2        = residual_l + proj, LN2(residual2)     (fused_residual_layernorm_forward)
//     fch (N, 4C), fch_gelu = ln2 · fcwᵀ + fcb, GELU(fch)           (cuBLASLt GELU epilogue)
//     proj (N, C)           = fch_gelu · fcprojwᵀ + fcprojb
//     residual3 = residual2 + proj                                  (fused into the next LN1 / the final LN)
//   lnf (N, C)              = LNf(residual3[L−1])
//   logits (N, Vp)          = lnf · wteᵀ                            (tied LM head, no bias)
//   losses (N) fp32         = cross-entropy(logits[:, :V], targets); mean_loss = mean of losses
// gpt_model_forward leaves the logits intact (they can be read back); gpt_model_backward first runs
// the fused cross-entropy, which rewrites the logits in place with dlogits = grad_scale·(softmax −
// onehot) (and writes the same losses again), then goes through the layers in reverse. The residual
// stream's gradient lives in one (N, C) buffer, dresidual: every LayerNorm backward ADDS into it, and
// the matmuls whose output is added to the residual (attproj, fcproj) read it as their dout.
//
// Gradients: every backward kernel ADDS into the bf16 parameter gradients (matmul_backward with
// accumulate = 1, layernorm/encoder backward always add). The caller zeroes them with
// gpt_model_zero_grad before the first micro-step of a step, then calls forward/backward per
// micro-step with grad_scale = 1/(B·T·accum_steps).
//
// Memory: three device allocations.
//   params (bf16)  the 16 tensors of gpt_config.h's GPT_PARAM_TENSORS back to back, one cudaMalloc
//   grads  (bf16)  same layout
//   acts           every activation, activation gradient and scratch buffer, one cudaMalloc cut into
//                  the named tensors of GPT_ACTIVATIONS (each 256-byte aligned); see
//                  gpt_model_print_memory. The scratch buffer is shared by the encoder, LayerNorm and
//                  dbias backward scratch and the attention workspace (all run one after another on
//                  the model's stream).
// Multi-GPU (layers/multi_gpu.cuh): gpt_model_create_padded pads both allocations to a multiple of
// pad_multiple elements (zero-filled, after the 16 tensors) so they split evenly over ranks, and an
// optional hook, grads_ready(user, l), is called during gpt_model_backward as soon as layer l's 12
// gradient slices are final (l = L−1 .. 0), and with l = −1 at the very end, when wte, wpe, lnfw
// and lnfb are final; it may enqueue work on other streams after an event on model->stream.
// Everything runs on model->stream. inputs and targets are device arrays (B, T) int32 that must stay
// valid from gpt_model_forward until gpt_model_backward returns (the backward reads them again).
#ifndef GPT_MODEL_CUH
#define GPT_MODEL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "../attention/attention.h"
#include "classifier.cuh"
#include "cuda_common.h"
#include "encoder.cuh"
#include "gpt_config.h"
#include "layer_common.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

// Every tensor of the activation allocation, in allocation order: the GPTModel member (a pointer of
// the given element type), its shape as printed in the memory plan, and its size in bytes, an
// expression in L, N = B·T, C, NH, Vp, bf = 2 and f4 = 4 (evaluated in gpt_model_plan_acts).
#define GPT_ACTIVATIONS(X)                                                                                         \
    X(encoded,   __nv_bfloat16, "(B, T, C) bf16",             N * C * bf)                                          \
    X(ln1,       __nv_bfloat16, "(L, B, T, C) bf16",          L * N * C * bf)                                      \
    X(ln1_mean,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(ln1_rstd,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(qkv,       __nv_bfloat16, "(L, B, T, 3, NH, HD) bf16",  L * N * 3 * C * bf)                                  \
    X(atty,      __nv_bfloat16, "(L, B, T, NH, HD) bf16",     L * N * C * bf)                                      \
    X(att_lse,   float,         "(L, B, NH, T) fp32",         L * NH * N * f4)                                     \
    /* the backend's `saved` per layer (naive: P; flash: empty) */                                                 \
    X(att_saved, char,          "(L, backend saved bytes)",   L * layer_align256(m->att_saved_bytes))              \
    X(residual2, __nv_bfloat16, "(L, B, T, C) bf16",          L * N * C * bf)                                      \
    X(ln2,       __nv_bfloat16, "(L, B, T, C) bf16",          L * N * C * bf)                                      \
    X(ln2_mean,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(ln2_rstd,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(fch,       __nv_bfloat16, "(L, B, T, 4C) bf16",         L * N * 4 * C * bf) /* before GELU */                \
    X(fch_gelu,  __nv_bfloat16, "(L, B, T, 4C) bf16",         L * N * 4 * C * bf)                                  \
    X(residual3, __nv_bfloat16, "(L, B, T, C) bf16",          L * N * C * bf)                                      \
    X(lnf,       __nv_bfloat16, "(B, T, C) bf16",             N * C * bf)                                          \
    X(lnf_mean,  float,         "(B, T) fp32",                N * f4)                                              \
    X(lnf_rstd,  float,         "(B, T) fp32",                N * f4)                                              \
    /* dlogits in place after the backward's cross-entropy */                                                      \
    X(logits,    __nv_bfloat16, "(B, T, Vp) bf16",            N * Vp * bf)                                         \
    X(losses,    float,         "(B, T) fp32",                N * f4)                                              \
    X(mean_loss, float,         "(1) fp32",                   f4)                                                  \
    /* attproj / fcproj output before its residual add */                                                          \
    X(proj,      __nv_bfloat16, "(B, T, C) bf16",             N * C * bf)                                          \
    X(dresidual, __nv_bfloat16, "(B, T, C) bf16",             N * C * bf) /* gradient of the residual stream */    \
    X(dln,       __nv_bfloat16, "(B, T, C) bf16",             N * C * bf) /* gradient of an LN output / atty */    \
    X(dwide,     __nv_bfloat16, "(B, T, 4C) bf16",            N * 4 * C * bf) /* d fch (N, 4C) or d qkv (N, 3C) */ \
    /* max of encoder/LN/dbias backward scratch and the attention workspace */                                     \
    X(scratch,   void,          "(bytes)",                    m->scratch_bytes)

// GPT_ACT_encoded, GPT_ACT_ln1, ...: a tensor's index in the table.
enum {
#define GPT_ACT_ENUM(member, type, shape, bytes) GPT_ACT_##member,
    GPT_ACTIVATIONS(GPT_ACT_ENUM)
#undef GPT_ACT_ENUM
    GPT_NUM_ACTS
};

typedef struct {
    const char* name;
    const char* shape;  // for the memory plan
    size_t bytes;       // exact size
    size_t offset;      // into the allocation, 256-byte aligned
} GPTActTensor;

typedef struct {
    GPTConfig config;
    int B, T;  // the micro-batch the activations are sized for
    int L, C, NH, HD, V, Vp, maxT;

    // parameters and gradients: one allocation each, cut into the 16 tensors
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t param_offsets[NUM_PARAM_TENSORS];  // elements
    size_t num_params;
    size_t num_params_padded;  // elements of the params and grads allocations (>= num_params, zeros after)
    __nv_bfloat16* params;
    __nv_bfloat16* grads;
    __nv_bfloat16* param_tensors[NUM_PARAM_TENSORS];
    __nv_bfloat16* grad_tensors[NUM_PARAM_TENSORS];

    // activations: one allocation, cut as the table says
    GPTActTensor act_table[GPT_NUM_ACTS];
    size_t act_bytes;
    void* acts_memory;
#define GPT_ACT_MEMBER(member, type, shape, bytes) type* member;
    GPT_ACTIVATIONS(GPT_ACT_MEMBER)  // pointers into acts_memory (att_saved: L slices of att_saved_bytes)
#undef GPT_ACT_MEMBER
    size_t att_saved_bytes;  // per layer
    size_t scratch_bytes;

    // compute
    AttentionBackend backend;
    int deterministic_attention;  // AttentionArgs.deterministic of every layer
    AttentionShape att_shape;
    AttentionContext att_ctx;  // .cublas owned (naive backend only)
    MatmulContext matmul;
    cudaStream_t stream;

    // the last forward's token arrays (device, (B, T) int32), read again by the backward
    const int* inputs;
    const int* targets;

    // optional backward hook (NULL: none): layer l's gradients are final (l = -1: the embeddings and lnf)
    void (*grads_ready)(void* user, int layer);
    void* grads_ready_user;
} GPTModel;

// ---- memory plan ------------------------------------------------------------------------------------

static void gpt_model_plan_acts(GPTModel* m) {
    const size_t L = m->L, C = m->C, NH = m->NH, N = (size_t)m->B * m->T, Vp = m->Vp;
    const size_t bf = sizeof(__nv_bfloat16), f4 = sizeof(float);
    GPTActTensor* t = m->act_table;
#define GPT_ACT_PLAN(member, type, shp, nbytes) \
    t[GPT_ACT_##member].name = #member, t[GPT_ACT_##member].shape = shp, t[GPT_ACT_##member].bytes = (nbytes);
    GPT_ACTIVATIONS(GPT_ACT_PLAN)
#undef GPT_ACT_PLAN
    size_t offset = 0;
    for (int i = 0; i < GPT_NUM_ACTS; i++) {
        t[i].offset = offset;
        offset += layer_align256(t[i].bytes);
    }
    m->act_bytes = offset;
}

// Prints the parameter layout and the activation table (name, shape, MiB, offset).
static void gpt_model_print_memory(const GPTModel* m, FILE* f) {
    fprintf(f, "memory plan: L=%d C=%d NH=%d HD=%d V=%d Vp=%d maxT=%d, B=%d T=%d, attention %s\n", m->L, m->C,
            m->NH, m->HD, m->V, m->Vp, m->maxT, m->B, m->T, attention_backend_name(m->backend));
    const double MiB = 1024.0 * 1024.0;
    fprintf(f, "  parameters: %zu (bf16 %.1f MiB; gradients the same)\n", m->num_params,
            m->num_params * sizeof(__nv_bfloat16) / MiB);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        fprintf(f, "    %-10s %12zu elements at %12zu\n", GPT_PARAMS[i].name, m->param_sizes[i], m->param_offsets[i]);
    fprintf(f, "  activations: %.1f MiB in one allocation\n", m->act_bytes / MiB);
    for (int i = 0; i < GPT_NUM_ACTS; i++)
        fprintf(f, "    %-10s %-28s %10.2f MiB at %12zu\n", m->act_table[i].name, m->act_table[i].shape,
                m->act_table[i].bytes / MiB, m->act_table[i].offset);
}

static inline size_t gpt_max_size(size_t a, size_t b) { return a > b ? a : b; }

// ---- create / destroy -------------------------------------------------------------------------------

// Allocates the model for micro-batches (B, T), T <= config.max_seq_len, with attention `backend`, all
// work on `stream`. Parameters and gradients are left zero (the caller uploads or initializes the
// parameters into model->params). Returns 0, or -1 after printing "error: ..." for an unusable config
// (head dim, sizes) or backend/shape; CUDA errors exit.
static int gpt_model_create_padded(GPTModel* m, GPTConfig config, int B, int T, AttentionBackend backend,
                                   cudaStream_t stream, size_t pad_multiple) {
    memset(m, 0, sizeof(*m));
    char why[512];
    if (gpt_config_check(&config, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: %s\n", why);
        return -1;
    }
    if (B < 1 || T < 1 || T > config.max_seq_len) {
        fprintf(stderr, "error: batch %d x sequence length %d: need B >= 1 and 1 <= T <= max_seq_len (%d)\n", B, T,
                config.max_seq_len);
        return -1;
    }
    if (config.channels % 8 != 0 || config.padded_vocab_size % 8 != 0) {
        fprintf(stderr, "error: hidden size %d and padded vocab %d must be multiples of 8 (16-byte bf16 rows)\n",
                config.channels, config.padded_vocab_size);
        return -1;
    }
    m->config = config;
    m->B = B, m->T = T;
    m->L = config.num_layers, m->C = config.channels, m->NH = config.num_heads;
    m->HD = m->C / m->NH, m->V = config.vocab_size, m->Vp = config.padded_vocab_size, m->maxT = config.max_seq_len;
    m->backend = backend;
    m->stream = stream;
    m->att_shape.B = B, m->att_shape.T = T, m->att_shape.NH = m->NH, m->att_shape.HD = m->HD;
    m->att_shape.causal = 1;
    if (attention_check(backend, &m->att_shape, why, sizeof(why)) != 0) {
        const char* name = attention_backend_name(backend);
        fprintf(stderr, "error: attention backend %s cannot run head dim %d (hidden %d / %d heads), T = %d: %s\n",
                name ? name : "(unknown)", m->HD, m->C, m->NH, T, why);
        return -1;
    }

    // parameters and gradients
    gpt_param_sizes(m->param_sizes, &config);
    m->num_params = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        m->param_offsets[i] = m->num_params;
        m->num_params += m->param_sizes[i];
    }
    if (pad_multiple < 1) pad_multiple = 1;
    m->num_params_padded = (m->num_params + pad_multiple - 1) / pad_multiple * pad_multiple;
    const size_t alloc = m->num_params_padded * sizeof(__nv_bfloat16);
    const char* params_hint = "use a smaller model (--model, --layers, --hidden)";
    cuda_malloc_or_explain((void**)&m->params, alloc, "the bf16 weights", params_hint);
    cuda_malloc_or_explain((void**)&m->grads, alloc, "the bf16 gradients", params_hint);
    CUDA_CHECK(cudaMemsetAsync(m->params, 0, alloc, stream));
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, alloc, stream));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        m->param_tensors[i] = m->params + m->param_offsets[i];
        m->grad_tensors[i] = m->grads + m->param_offsets[i];
    }

    // activations
    const int N = B * T, C = m->C;
    m->att_saved_bytes = attention_saved_bytes(backend, &m->att_shape);
    size_t scratch = encoder_backward_scratch_bytes(N, C, m->Vp);
    scratch = gpt_max_size(scratch, layernorm_backward_scratch_bytes(N, C));
    scratch = gpt_max_size(scratch, matmul_dbias_scratch_bytes(N, 4 * C));  // the widest biased output, 4C
    scratch = gpt_max_size(scratch, attention_workspace_bytes(backend, &m->att_shape));
    m->scratch_bytes = scratch;
    gpt_model_plan_acts(m);
    char acts_what[128], acts_hint[512];
    snprintf(acts_what, sizeof(acts_what), "the activations of a %d x %d micro batch", B, T);
    snprintf(acts_hint, sizeof(acts_hint),
             "activations grow with --batch-size x --seq-len%s; lower --batch-size (--total-batch-tokens keeps the "
             "tokens per step through accumulation) or --seq-len%s",
             backend == ATTN_NAIVE ? ", and naive attention stores B x heads x T^2 probabilities per layer" : "",
             backend == ATTN_NAIVE ? ", or use --attn naive-recompute or flash2" : "");
    cuda_malloc_or_explain(&m->acts_memory, m->act_bytes, acts_what, acts_hint);
    char* base = (char*)m->acts_memory;
#define GPT_ACT_POINTER(member, type, shape, bytes) m->member = (type*)(base + m->act_table[GPT_ACT_##member].offset);
    GPT_ACTIVATIONS(GPT_ACT_POINTER)
#undef GPT_ACT_POINTER

    // compute contexts
    matmul_context_create(&m->matmul, stream);
    m->att_ctx.cublas = NULL;
    if (attention_uses_cublas(backend)) {
        CUBLAS_CHECK(cublasCreate(&m->att_ctx.cublas));
        CUBLAS_CHECK(cublasSetStream(m->att_ctx.cublas, stream));
    }
    return 0;
}

static int gpt_model_create(GPTModel* m, GPTConfig config, int B, int T, AttentionBackend backend,
                            cudaStream_t stream) {
    return gpt_model_create_padded(m, config, B, T, backend, stream, 1);
}

static void gpt_model_destroy(GPTModel* m) {
    if (m->matmul.lt) matmul_context_destroy(&m->matmul);
    if (m->att_ctx.cublas) CUBLAS_CHECK(cublasDestroy(m->att_ctx.cublas));
    if (m->acts_memory) CUDA_CHECK(cudaFree(m->acts_memory));
    if (m->grads) CUDA_CHECK(cudaFree(m->grads));
    if (m->params) CUDA_CHECK(cudaFree(m->params));
    memset(m, 0, sizeof(*m));
}

// ---- forward ----------------------------------------------------------------------------------------

// mean[0] = (Σ_i losses[i]) / n, one block, summed in a fixed order (deterministic).
static __global__ void __launch_bounds__(256) gpt_mean_loss_kernel(float* mean, const float* losses, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += losses[i];
    s = layer_block_sum(s);
    if (threadIdx.x == 0) mean[0] = s / (float)n;
}

// The attention arguments of layer l (forward and backward fields both filled).
static AttentionArgs gpt_attention_args(GPTModel* m, int l) {
    const size_t N = (size_t)m->B * m->T, C = m->C;
    AttentionArgs a;
    memset(&a, 0, sizeof(a));
    a.shape = m->att_shape;
    __nv_bfloat16* qkv = m->qkv + l * N * 3 * C;
    a.q = qkv;
    a.k = qkv + C;
    a.v = qkv + 2 * C;
    a.qkv_stride = (long)(3 * C);
    a.out = m->atty + l * N * C;
    a.out_stride = (long)C;
    a.lse = m->att_lse + l * N * m->NH;
    a.dout = m->dln;  // datty lives in dln during the backward
    a.dq = m->dwide;  // dqkv (N, 3C) in the first 3C columns' worth of dwide
    a.dk = m->dwide + C;
    a.dv = m->dwide + 2 * C;
    a.dqkv_stride = (long)(3 * C);
    a.saved = m->att_saved_bytes ? (void*)(m->att_saved + l * layer_align256(m->att_saved_bytes)) : NULL;
    a.workspace = m->scratch;
    a.deterministic = m->deterministic_attention;
    return a;
}

// Forward on inputs and targets (device, (B, T) int32, inputs in [0, Vp), targets in [0, V)): fills
// model->losses (N) fp32 and model->mean_loss (1) fp32 on the device; logits (N, Vp) are left intact.
// Enqueued on model->stream; nothing is synchronized (gpt_model_mean_loss copies the scalar back).
static void gpt_model_forward(GPTModel* m, const int* inputs, const int* targets) {
    const int B = m->B, T = m->T, C = m->C, L = m->L, N = B * T, Vp = m->Vp;
    const size_t NC = (size_t)N * C;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    m->inputs = inputs;
    m->targets = targets;

    encoder_forward(m->encoded, inputs, p[GPT_WTE], p[GPT_WPE], B, T, C, s);  // (B, T, C)
    for (int l = 0; l < L; l++) {
        const size_t lC = (size_t)l * C;
        __nv_bfloat16* ln1 = m->ln1 + l * NC;  // (B, T, C)
        float* ln1_mean = m->ln1_mean + (size_t)l * N;
        float* ln1_rstd = m->ln1_rstd + (size_t)l * N;
        __nv_bfloat16* qkv = m->qkv + l * NC * 3;        // (B, T, 3C)
        __nv_bfloat16* atty = m->atty + l * NC;          // (B, T, C)
        __nv_bfloat16* residual2 = m->residual2 + l * NC;
        __nv_bfloat16* ln2 = m->ln2 + l * NC;
        float* ln2_mean = m->ln2_mean + (size_t)l * N;
        float* ln2_rstd = m->ln2_rstd + (size_t)l * N;
        __nv_bfloat16* fch = m->fch + l * NC * 4;        // (B, T, 4C)
        __nv_bfloat16* fch_gelu = m->fch_gelu + l * NC * 4;
        const __nv_bfloat16* residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * NC;

        // LN1: on the embedding for block 0; otherwise residual3[l−1] = residual2[l−1] + proj (the
        // previous block's MLP output) fused with the LayerNorm.
        if (l == 0)
            layernorm_forward(ln1, ln1_mean, ln1_rstd, m->encoded, p[GPT_LN1W], p[GPT_LN1B], N, C, s);
        else
            fused_residual_layernorm_forward(ln1, ln1_mean, ln1_rstd, m->residual3 + (l - 1) * NC,
                                             m->residual2 + (l - 1) * NC, m->proj, p[GPT_LN1W] + lC,
                                             p[GPT_LN1B] + lC, N, C, s);
        // qkv (N, 3C) = ln1 · qkvwᵀ + qkvb
        matmul_forward(mm, qkv, ln1, p[GPT_QKVW] + lC * 3 * C, p[GPT_QKVB] + lC * 3, N, C, 3 * C, NULL);
        AttentionArgs a = gpt_attention_args(m, l);
        attention_forward(m->backend, &m->att_ctx, &a, s);  // atty (B, T, NH, HD), lse (B, NH, T)
        // proj (N, C) = atty · attprojwᵀ + attprojb; residual2 = residual + proj; ln2 = LN2(residual2)
        matmul_forward(mm, m->proj, atty, p[GPT_ATTPROJW] + lC * C, p[GPT_ATTPROJB] + lC, N, C, C, NULL);
        fused_residual_layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, residual, m->proj, p[GPT_LN2W] + lC,
                                         p[GPT_LN2B] + lC, N, C, s);
        // fch (N, 4C) = ln2 · fcwᵀ + fcb, fch_gelu = GELU(fch)
        matmul_forward(mm, fch_gelu, ln2, p[GPT_FCW] + lC * 4 * C, p[GPT_FCB] + lC * 4, N, C, 4 * C, fch);
        // proj (N, C) = fch_gelu · fcprojwᵀ + fcprojb (added to residual2 by the next LayerNorm)
        matmul_forward(mm, m->proj, fch_gelu, p[GPT_FCPROJW] + lC * 4 * C, p[GPT_FCPROJB] + lC, N, 4 * C, C, NULL);
    }
    // residual3[L−1] = residual2[L−1] + proj; lnf = LNf(residual3[L−1])
    fused_residual_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->residual3 + (L - 1) * NC,
                                     m->residual2 + (L - 1) * NC, m->proj, p[GPT_LNFW], p[GPT_LNFB], N, C, s);
    // logits (N, Vp) = lnf · wteᵀ
    matmul_forward(mm, m->logits, m->lnf, p[GPT_WTE], NULL, N, C, Vp, NULL);
    crossentropy_forward(m->losses, m->logits, targets, N, m->V, Vp, s);
    gpt_mean_loss_kernel<<<1, 256, 0, s>>>(m->mean_loss, m->losses, N);
    CUDA_CHECK(cudaGetLastError());
}

// Copies the last forward's mean loss to the host (synchronizes the stream).
static float gpt_model_mean_loss(GPTModel* m) {
    float loss = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&loss, m->mean_loss, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    return loss;
}

// ---- backward ---------------------------------------------------------------------------------------

// grads = 0 (before the first micro-step of a step).
static void gpt_model_zero_grad(GPTModel* m) {
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, m->num_params_padded * sizeof(__nv_bfloat16), m->stream));
}

// ADDS the gradient of grad_scale · Σ losses (grad_scale = 1/(B·T·accum_steps) for the mean over a
// step) into model->grads. Must follow gpt_model_forward on the same batch (its inputs and targets
// still valid). Overwrites the logits with dlogits.
static void gpt_model_backward(GPTModel* m, float grad_scale) {
    const int B = m->B, T = m->T, C = m->C, L = m->L, N = B * T, Vp = m->Vp;
    const size_t NC = (size_t)N * C;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    __nv_bfloat16* const* g = m->grad_tensors;
    float* ln_scratch = (float*)m->scratch;

    // losses again, and logits (N, Vp) := dlogits = grad_scale·(softmax − onehot)
    crossentropy_forward_backward(m->losses, m->logits, m->targets, grad_scale, N, m->V, Vp, s);
    // LM head: dln (N, C) = dlogits · wte; dwte += dlogitsᵀ · lnf
    matmul_backward(mm, m->dln, g[GPT_WTE], NULL, m->logits, m->lnf, p[GPT_WTE], N, C, Vp, NULL, 1, NULL);
    // final LN: dresidual (N, C) = 0 + LNf backward (the gradient of residual3[L−1])
    CUDA_CHECK(cudaMemsetAsync(m->dresidual, 0, NC * sizeof(__nv_bfloat16), s));
    layernorm_backward(m->dresidual, g[GPT_LNFW], g[GPT_LNFB], ln_scratch, m->scratch_bytes, m->dln,
                       m->residual3 + (L - 1) * NC, p[GPT_LNFW], m->lnf_mean, m->lnf_rstd, N, C, s);

    for (int l = L - 1; l >= 0; l--) {
        const size_t lC = (size_t)l * C;
        const __nv_bfloat16* residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * NC;
        // MLP: dresidual is d(residual3) = d(proj); dwide (N, 4C) = d(fch) through the fused dGELU,
        // and the fc bias gradient dfcb += column sums of d(fch), made with it
        matmul_backward_dgelu_dbias(mm, m->dwide, g[GPT_FCPROJW] + lC * 4 * C, g[GPT_FCPROJB] + lC, m->dresidual,
                                    m->fch_gelu + l * NC * 4, p[GPT_FCPROJW] + lC * 4 * C, N, 4 * C, C,
                                    m->fch + l * NC * 4, 1, m->scratch, g[GPT_FCB] + lC * 4);
        // dln (N, C) = d(ln2) (the fc bias gradient is done)
        matmul_backward(mm, m->dln, g[GPT_FCW] + lC * 4 * C, NULL, m->dwide, m->ln2 + l * NC,
                        p[GPT_FCW] + lC * 4 * C, N, C, 4 * C, NULL, 1, m->scratch);
        // dresidual += LN2 backward: now d(residual2)
        layernorm_backward(m->dresidual, g[GPT_LN2W] + lC, g[GPT_LN2B] + lC, ln_scratch, m->scratch_bytes, m->dln,
                           m->residual2 + l * NC, p[GPT_LN2W] + lC, m->ln2_mean + (size_t)l * N,
                           m->ln2_rstd + (size_t)l * N, N, C, s);
        // attention projection: dln (N, C) = d(atty)
        matmul_backward(mm, m->dln, g[GPT_ATTPROJW] + lC * C, g[GPT_ATTPROJB] + lC, m->dresidual, m->atty + l * NC,
                        p[GPT_ATTPROJW] + lC * C, N, C, C, NULL, 1, m->scratch);
        // attention: dwide[:, :3C] = dqkv (B, T, 3, NH, HD) (overwritten)
        AttentionArgs a = gpt_attention_args(m, l);
        attention_backward(m->backend, &m->att_ctx, &a, s);
        // qkv: dln (N, C) = d(ln1), dqkvw, dqkvb += (dqkv is (N, 3C) contiguous in dwide)
        matmul_backward(mm, m->dln, g[GPT_QKVW] + lC * 3 * C, g[GPT_QKVB] + lC * 3, m->dwide, m->ln1 + l * NC,
                        p[GPT_QKVW] + lC * 3 * C, N, C, 3 * C, NULL, 1, m->scratch);
        // dresidual += LN1 backward: now d(residual_l), the previous block's output (or the embedding)
        layernorm_backward(m->dresidual, g[GPT_LN1W] + lC, g[GPT_LN1B] + lC, ln_scratch, m->scratch_bytes, m->dln,
                           residual, p[GPT_LN1W] + lC, m->ln1_mean + (size_t)l * N, m->ln1_rstd + (size_t)l * N, N,
                           C, s);
        if (m->grads_ready) m->grads_ready(m->grads_ready_user, l);  // layer l's gradients are final
    }
    // embedding: dwte += (rows of the input tokens), dwpe += (rows t < T)
    encoder_backward(g[GPT_WTE], g[GPT_WPE], m->scratch, m->scratch_bytes, m->dresidual, m->inputs, B, T, C, Vp, s);
    if (m->grads_ready) m->grads_ready(m->grads_ready_user, -1);  // wte, wpe, lnfw, lnfb are final
}

#endif  // GPT_MODEL_CUH
