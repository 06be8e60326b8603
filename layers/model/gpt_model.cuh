// gpt_model.cuh: the whole GPT on the GPU (llm.c structure), forward and backward, in bf16 with fp32
// accumulation, built from the layers of this folder and the attention interface. With
// GPTModelOptions.precision = PRECISION_FP8 the four linear layers of every block run on FP8 tensor
// cores instead (gpt_fp8.cuh: gpt_block_forward_fp8 and the fp8 branches of the backward); ln1, ln2
// and fch_gelu then exist only inside the FP8 casts, and the blocks keep transposed FP8 inputs.
//
// Shapes: L layers, C channels, NH heads of HD = C / NH, NKV key/value heads (NH % NKV == 0;
// grouped-query attention when NKV < NH), QKV = (NH + 2·NKV)·HD features of the QKV projection (3C
// for multi-head), V vocab padded to Vp, maxT positions; the model is sized for micro-batches of B
// sequences of T tokens, N = B·T rows.
//
// Forward (pre-LayerNorm; residual_l = encoded for l = 0, else residual3[l−1]):
//   encoded (N, C)          = wte[inputs] + wpe[t]                  (wpe[positions[t]] when set)
//   per block l:
//     ln1 (N, C)            = LN1(residual_l)
//     qkv (N, QKV)          = ln1 · qkvwᵀ + qkvb                    viewed as (B, T, NH + 2·NKV, HD)
//     atty (N, C), lse      = causal attention(qkv)                 atty (B, T, NH, HD), lse (B, NH, T)
//     residual2 (N, C)      = residual_l + atty · attprojwᵀ + attprojb
//     ln2 (N, C)            = LN2(residual2)
//     fch (N, 4C), fch_gelu = ln2 · fcwᵀ + fcb, GELU(fch)           (cuBLASLt GELU epilogue)
//     residual3 (N, C)      = residual2 + fch_gelu · fcprojwᵀ + fcprojb
//   The two projections add the residual in their GEMM's epilogue (matmul_forward_residual), so
//   the LayerNorm after each reads one (N, C) tensor and writes one.
//   lnf (N, C)              = LNf(residual3[L−1])
//   logits (N, Vp)          = lnf · wteᵀ                            (tied LM head, no bias)
//   losses (N) fp32         = cross-entropy(logits[:, :V], targets); mean_loss = mean of losses
// gpt_model_forward leaves the logits of the last LM-head chunk intact (all of them when N <=
// lm_head_rows: they can be read back); gpt_model_backward first runs the fused cross-entropy, which
// rewrites the logits in place with dlogits = grad_scale·(softmax − onehot) (and writes the same
// losses again), then goes through the layers in reverse. A training micro step calls
// gpt_model_forward_train instead, whose cross-entropy writes the last chunk's dlogits at once (one
// pass over the logits fewer); the backward then starts from them. The residual
// stream's gradient lives in one (N, C) buffer, dresidual: every LayerNorm backward ADDS into it, and
// the matmuls whose output is added to the residual (attproj, fcproj) read it as their dout.
//
// Long sequences: activation recomputation (--recompute) and the LM head in chunks.
//   --recompute none       every activation above is kept for all L layers (the fastest).
//   --recompute selective  the GEMM outputs (qkv, atty, residual2, fch) are kept per layer; ln1, ln2 and
//                          fch_gelu keep one layer's slot and the backward recomputes them (two LayerNorms
//                          and a GELU per layer; the MLP's GELU then runs as its own kernel in the forward
//                          too, so the backward sees the same bits); a backend that keeps T² data per
//                          layer (naive's P) keeps one layer of it and the backward reruns its forward.
//   --recompute full       only each block's input (encoded, residual3[0..L−2]) and residual3[L−1] are
//                          kept per layer (with the LayerNorm statistics); every other per-layer tensor has
//                          one slot, and the backward of block l first reruns block l's forward into it.
//   The backward does the same arithmetic on the same bits in every mode, so the loss and gradients
//   do not depend on the mode (with deterministic attention; selective vs none also needs the same GELU
//   path, i.e. MATMUL_FUSE_NONE, since the fused GELU epilogue starts from the fp32 pre-activation).
//   The LM head runs in chunks of lm_head_rows rows (GPT_LM_HEAD_CHUNK_ROWS): logits holds one chunk
//   (lm_head_rows, Vp), never the whole (N, Vp). The forward computes each chunk's logits and losses;
//   the backward goes over the chunks in reverse, recomputing each chunk's logits except the last
//   one's (still in place from the forward). With N <= lm_head_rows there is one chunk and nothing is
//   recomputed. gpt_recompute_flops counts what the recomputation costs.
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
// Multi-GPU (layers/multi_gpu/multi_gpu.cuh): gpt_model_create pads both allocations to a multiple of
// GPTModelOptions.pad_multiple elements (zero-filled, after the 16 tensors) so they split evenly over ranks, and an
// optional hook, grads_ready(user, l), is called during gpt_model_backward as soon as layer l's 12
// gradient slices are final (l = L−1 .. 0), and with l = −1 at the very end, when wte, wpe, lnfw
// and lnfb are final; it may enqueue work on other streams after an event on model->stream. Its twin
// params_needed(user, l) is called by the forward before it reads layer l's weights (l = -1 before
// the embeddings, l = L before the FP8 casts of every layer), so that weights still arriving from
// other ranks (ZeRO-1's all-gather) are waited for layer by layer.
// Everything runs on model->stream. inputs and targets are device arrays (B, T) int32 that must stay
// valid from gpt_model_forward until gpt_model_backward returns (the backward reads them again).
#ifndef GPT_MODEL_CUH
#define GPT_MODEL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"
#include "layers/model/classifier.cuh"
#include "layers/cuda_common.h"
#include "layers/model/encoder.cuh"
#include "data/gpt_config.h"
#include "layers/model/layer_common.cuh"
#include "layers/model/layernorm.cuh"
#include "layers/model/matmul.cuh"
#include "layers/model/gpt_memory_plan.cuh"
#include "layers/model/qkv_bias.cuh"


typedef struct {
    GPTConfig config;
    int B, T;  // the micro-batch the activations are sized for
    int L, C, NH, HD, V, Vp, maxT;
    int NKV, QKV;  // key/value heads; QKV = (NH + 2·NKV)·HD features of qkv

    // parameters and gradients: one allocation each, cut into the 16 tensors
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t param_offsets[NUM_PARAM_TENSORS];  // elements
    size_t num_params;
    size_t num_params_padded;  // elements of the params and grads allocations (>= num_params, zeros after)
    __nv_bfloat16* params;
    __nv_bfloat16* grads;
    __nv_bfloat16* param_tensors[NUM_PARAM_TENSORS];
    __nv_bfloat16* grad_tensors[NUM_PARAM_TENSORS];

    // activations: one allocation, cut as the memory plan's table says (which layers each per-layer
    // activation keeps: L, or 1 slot reused by every layer under --recompute)
    GPTMemoryPlan memory;
    void* acts_memory;
#define GPT_ACT_MEMBER(member, type, shape, bytes) type* member;
    GPT_ACTIVATIONS(GPT_ACT_MEMBER)  // pointers into acts_memory (att_saved: L slices of att_saved_bytes)
#undef GPT_ACT_MEMBER

    // compute
    AttentionBackend backend;
    int deterministic_attention;  // AttentionArgs.deterministic of every layer
    AttentionShape att_shape;
    AttentionContext att_ctx;  // .cublas owned (naive backend only)
    int att_sums_dq;           // the backend's backward adds dq's column sums (the q bias gradient)
    MatmulContext matmul;
    GPTPrecision precision;
    GPTFp8 fp8;  // with PRECISION_FP8: the FP8 weights and scales (gpt_fp8.cuh)
    cudaStream_t stream;

    // the last forward's token arrays (device, (B, T) int32), read again by the backward
    const int* inputs;
    const int* targets;
    // > 0: gpt_model_forward_train left dlogits for this grad_scale in the last LM-head chunk's logits
    float dlogits_scale;

    // optional backward hook (NULL: none): layer l's gradients are final (l = -1: the embeddings and lnf)
    void (*grads_ready)(void* user, int layer);
    void* grads_ready_user;
    // optional forward hook (NULL: none): the forward is about to read layer l's weights (l = -1: the
    // embeddings and lnf, l = L: all of them); it may make model->stream wait for them
    void (*params_needed)(void* user, int layer);
    void* params_needed_user;
    // optional attention in place of the backend (NULL: attention_forward/backward of `backend`), with the
    // same arguments (the layer's local q, k, v in qkv, out, lse; dout, dq, dk, dv): context
    // parallelism's ring attention over the sequence's group (layers/context_parallel/context_parallel.cuh).
    // It does not add dq's column sums (att_sums_dq is 0 with it).
    void (*attention)(void* user, const AttentionArgs* a, int backward, cudaStream_t stream);
    void* attention_user;
    // optional (T) int32 device: the global position of each of a sequence's T local rows, the same for
    // every sequence (NULL: row t is position t). Context parallelism's zigzag share of a longer sequence.
    const int* positions;
} GPTModel;

// ---- memory ----------------------------------------------------------------------------------------

// Prints the parameter layout and the activation table (name, shape, MiB, offset).
static void gpt_model_print_memory(const GPTModel* m, FILE* f) {
    fprintf(f, "memory plan: L=%d C=%d NH=%d HD=%d V=%d Vp=%d maxT=%d, B=%d T=%d, attention %s\n", m->L, m->C,
            m->NH, m->HD, m->V, m->Vp, m->maxT, m->B, m->T, attention_backend_name(m->backend));
    const double MiB = 1024.0 * 1024.0;
    fprintf(f, "  parameters: %zu (bf16 %.1f MiB; gradients the same)\n", m->num_params,
            m->num_params * sizeof(__nv_bfloat16) / MiB);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        fprintf(f, "    %-10s %12zu elements at %12zu\n", GPT_PARAMS[i].name, m->param_sizes[i], m->param_offsets[i]);
    fprintf(f, "  activations: %.1f MiB in one allocation; --recompute %s: l = %d for qkv, atty, att_lse, "
               "residual2, fch; %d for ln1, ln2, fch_gelu; %d for att_saved; LM head in chunks of %d rows\n",
            m->memory.act_bytes / MiB, RECOMPUTE_NAMES[m->memory.recompute], m->memory.layers_gemm,
            m->memory.layers_cheap, m->memory.layers_att, m->memory.lm_head_rows);
    for (int i = 0; i < GPT_NUM_ACTS; i++) {
        const GPTActTensor* t = &m->memory.act_table[i];
        fprintf(f, "    %-10s %-28s %10.2f MiB at %12zu\n", t->name, t->shape, t->bytes / MiB, t->offset);
    }
}

// ---- create / destroy -------------------------------------------------------------------------------

// Prints "error: ..." and returns -1 when the config, the micro batch or the backend
// cannot make a model; 0 otherwise.
static int gpt_model_check(const GPTConfig* config, const GPTModelOptions* o) {
    char why[512];
    if (gpt_config_check(config, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: %s\n", why);
        return -1;
    }
    if (o->B < 1 || o->T < 1 || o->T > config->max_seq_len) {
        fprintf(stderr, "error: batch %d x sequence length %d: need B >= 1 and 1 <= T <= max_seq_len (%d)\n", o->B,
                o->T, config->max_seq_len);
        return -1;
    }
    if (config->channels % 8 != 0 || config->padded_vocab_size % 8 != 0) {
        fprintf(stderr, "error: hidden size %d and padded vocab %d must be multiples of 8 (16-byte bf16 rows)\n",
                config->channels, config->padded_vocab_size);
        return -1;
    }
    if (o->precision == PRECISION_FP8 &&
        gpt_fp8_check(o->B * o->T, config->channels, (int)gpt_qkv_features(config), why, sizeof(why)) != 0) {
        fprintf(stderr, "error: --precision fp8 cannot run this shape: %s\n", why);
        return -1;
    }
    const AttentionShape shape = gpt_attention_shape(config, o->B, o->T);
    if (attention_check(o->backend, &shape, why, sizeof(why)) != 0) {
        const char* name = attention_backend_name(o->backend);
        fprintf(stderr, "error: attention backend %s cannot run head dim %d (hidden %d / %d heads), T = %d: %s\n",
                name ? name : "(unknown)", shape.HD, config->channels, config->num_heads, o->T, why);
        return -1;
    }
    return 0;
}

// The shape fields, from the config and the micro batch.
static void gpt_model_set_shape(GPTModel* m, const GPTConfig* config, const GPTModelOptions* o) {
    m->config = *config;
    m->B = o->B, m->T = o->T;
    m->L = config->num_layers, m->C = config->channels, m->NH = config->num_heads;
    m->HD = m->C / m->NH, m->V = config->vocab_size, m->Vp = config->padded_vocab_size;
    m->maxT = config->max_seq_len;
    m->NKV = config->num_kv_heads, m->QKV = (int)gpt_qkv_features(config);
    m->backend = o->backend;
    m->att_shape = gpt_attention_shape(config, o->B, o->T);
}

// The bf16 parameters and gradients: one zeroed allocation each, padded to a multiple of
// pad_multiple elements, cut into the 16 tensors.
static void gpt_model_alloc_params(GPTModel* m, size_t pad_multiple) {
    gpt_param_sizes(m->param_sizes, &m->config);
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
    CUDA_CHECK(cudaMemsetAsync(m->params, 0, alloc, m->stream));
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, alloc, m->stream));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        m->param_tensors[i] = m->params + m->param_offsets[i];
        m->grad_tensors[i] = m->grads + m->param_offsets[i];
    }
}

// The activation allocation of the memory plan, and the members pointing into it. An out-of-memory
// error says which flags lower it.
static void gpt_model_alloc_activations(GPTModel* m, const GPTModelOptions* o) {
    gpt_memory_plan(&m->memory, &m->config, o, 1);
    char acts_what[160], acts_hint[512];
    snprintf(acts_what, sizeof(acts_what), "the activations of a %d x %d micro batch (--recompute %s)", o->B, o->T,
             RECOMPUTE_NAMES[o->recompute]);
    snprintf(acts_hint, sizeof(acts_hint),
             "activations grow with --batch-size x --seq-len%s; %slower --batch-size (--total-batch-tokens keeps "
             "the tokens per step through accumulation) or --seq-len%s",
             o->backend == ATTN_NAIVE ? ", and naive attention stores B x heads x T^2 probabilities per layer" : "",
             o->recompute != RECOMPUTE_FULL ? "use --recompute full (or selective), " : "",
             o->backend == ATTN_NAIVE ? ", or use --attn naive-recompute or flash2" : "");
    cuda_malloc_or_explain(&m->acts_memory, m->memory.act_bytes, acts_what, acts_hint);
    char* base = (char*)m->acts_memory;
#define GPT_ACT_POINTER(member, type, shape, bytes) \
    m->member = (type*)(base + m->memory.act_table[GPT_ACT_##member].offset);
    GPT_ACTIVATIONS(GPT_ACT_POINTER)
#undef GPT_ACT_POINTER
}

// Creates the whole model of `config` as `o` says: parameters and gradients (left zero: the caller
// uploads or initializes the parameters into model->params), activations, GEMM and attention
// contexts. Returns 0, or -1 after printing "error: ..." for an unusable config (head dim, sizes) or
// backend/shape; CUDA errors exit.
static int gpt_model_create(GPTModel* m, const GPTConfig* config, const GPTModelOptions* o) {
    memset(m, 0, sizeof(*m));
    if (gpt_model_check(config, o) != 0) return -1;
    gpt_model_set_shape(m, config, o);
    m->stream = o->stream;
    m->deterministic_attention = o->deterministic_attention;
    gpt_model_alloc_params(m, o->pad_multiple);
    gpt_model_alloc_activations(m, o);
    m->precision = o->precision;
    if (o->precision == PRECISION_FP8) {
        gpt_fp8_create(&m->fp8, m->L, m->C, m->QKV, o->fp8_recipe, o->stream);
        m->fp8.x8 = m->fp8_x, m->fp8.dy8 = m->fp8_dy, m->fp8.dy8_t = m->fp8_dy_t, m->fp8.colsum = m->fp8_colsum;
    }
    matmul_context_create(&m->matmul, o->stream);
    m->matmul.tune = o->tune_gemms;
    m->att_sums_dq = attention_sums_dq_columns(o->backend, &m->att_shape);
    m->att_ctx.cublas = NULL;
    if (attention_uses_cublas(o->backend)) {
        CUBLAS_CHECK(cublasCreate(&m->att_ctx.cublas));
        CUBLAS_CHECK(cublasSetStream(m->att_ctx.cublas, o->stream));
    }
    return 0;
}

// The options of the simplest model: micro batches (B, T), no recomputation, the default LM-head
// chunks, fixed GEMM choices, no padding (the tests, --generate's prefill).
static GPTModelOptions gpt_model_options(int B, int T, AttentionBackend backend, cudaStream_t stream) {
    GPTModelOptions o;
    memset(&o, 0, sizeof(o));
    o.B = B, o.T = T, o.backend = backend, o.stream = stream;
    return o;
}

static void gpt_model_destroy(GPTModel* m) {
    if (m->precision == PRECISION_FP8) gpt_fp8_destroy(&m->fp8);
    if (m->matmul.lt) matmul_context_destroy(&m->matmul);
    if (m->att_ctx.cublas) CUBLAS_CHECK(cublasDestroy(m->att_ctx.cublas));
    if (m->acts_memory) CUDA_CHECK(cudaFree(m->acts_memory));
    if (m->grads) CUDA_CHECK(cudaFree(m->grads));
    if (m->params) CUDA_CHECK(cudaFree(m->params));
    memset(m, 0, sizeof(*m));
}

// ---- one block's activations ------------------------------------------------------------------------

// Where layer l's slice of a per-layer activation that keeps `kept` layers lives: its own (kept = L),
// or the one slot every layer reuses (kept = 1: recomputed in the backward).
static inline size_t gpt_slot(int kept, int l) { return kept == 1 ? 0 : (size_t)l; }

// Block l's activations, each (N, ·) as in the table.
typedef struct {
    const __nv_bfloat16* residual;  // (N, C) the block's input: encoded (l = 0) or residual3[l−1]
    __nv_bfloat16 *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    uint8_t *ln1_t, *atty_t, *ln2_t, *gelu_t;  // fp8: the linear layers' transposed FP8 inputs (C or 4C, N)
} GPTBlockActs;

static GPTBlockActs gpt_block_acts(const GPTModel* m, int l) {
    const size_t N = (size_t)m->B * m->T, NC = N * m->C, g = gpt_slot(m->memory.layers_gemm, l);
    const size_t c = gpt_slot(m->memory.layers_cheap, l);
    GPTBlockActs a;
    a.residual = l == 0 ? m->encoded : m->residual3 + (size_t)(l - 1) * NC;
    a.ln1 = m->ln1 + c * NC;
    a.qkv = m->qkv + g * (size_t)N * m->QKV;
    a.atty = m->atty + g * NC;
    a.residual2 = m->residual2 + g * NC;
    a.ln2 = m->ln2 + c * NC;
    a.fch = m->fch + g * NC * 4;
    a.fch_gelu = m->fch_gelu + c * NC * 4;
    a.ln1_mean = m->ln1_mean + l * N, a.ln1_rstd = m->ln1_rstd + l * N;
    a.ln2_mean = m->ln2_mean + l * N, a.ln2_rstd = m->ln2_rstd + l * N;
    a.ln1_t = m->fp8_ln1_t + g * NC, a.atty_t = m->fp8_atty_t + g * NC, a.ln2_t = m->fp8_ln2_t + g * NC;
    a.gelu_t = m->fp8_gelu_t + g * NC * 4;
    return a;
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
    const size_t N = (size_t)m->B * m->T, C = m->C, QKV = m->QKV, KV = (size_t)m->NKV * m->HD;
    const size_t g = gpt_slot(m->memory.layers_gemm, l);
    AttentionArgs a;
    memset(&a, 0, sizeof(a));
    a.shape = m->att_shape;
    __nv_bfloat16* qkv = m->qkv + g * N * QKV;  // rows (NH + 2·NKV, HD): q = NH·HD = C values, k, v NKV·HD each
    a.q = qkv;
    a.k = qkv + C;
    a.v = qkv + C + KV;
    a.qkv_stride = (long)QKV;  // kv_stride 0: the same
    a.out = m->atty + g * N * C;
    a.out_stride = (long)C;
    a.lse = m->att_lse + g * N * m->NH;
    a.dout = m->dln;  // datty lives in dln during the backward
    a.dq = m->dwide;  // dqkv (N, QKV) in the first QKV columns' worth of dwide
    a.dk = m->dwide + C;
    a.dv = m->dwide + C + KV;
    a.dqkv_stride = (long)QKV;
    const size_t saved_bytes = m->memory.att_saved_bytes;
    a.saved = saved_bytes ? (void*)(m->att_saved + gpt_slot(m->memory.layers_att, l) * layer_align256(saved_bytes))
                          : NULL;
    a.workspace = m->scratch;
    a.deterministic = m->deterministic_attention;
    return a;
}

// The attention of a layer, forward or backward: the model's hook when set (context parallelism), else
// the backend's.
static void gpt_attention_run(GPTModel* m, const AttentionArgs* a, int backward) {
    if (m->attention) m->attention(m->attention_user, a, backward, m->stream);
    else if (backward) attention_backward(m->backend, &m->att_ctx, a, m->stream);
    else attention_forward(m->backend, &m->att_ctx, a, m->stream);
}

// fch (N, 4C) = ln2 · fcwᵀ + fcb, fch_gelu = GELU(fch). Selective recomputation redoes the GELU from
// the bf16 fch with gelu_forward, so then the forward runs that kernel too (the fused epilogue starts
// from the fp32 pre-activation and would give other bits).
static void gpt_mlp_up_forward(GPTModel* m, const GPTBlockActs* a, int l) {
    const size_t lC = (size_t)l * m->C;
    const int N = m->B * m->T, C = m->C;
    __nv_bfloat16* const* p = m->param_tensors;
    if (m->memory.recompute == RECOMPUTE_SELECTIVE) {
        matmul_forward(&m->matmul, a->fch, a->ln2, p[GPT_FCW] + lC * 4 * C, p[GPT_FCB] + lC * 4, N, C, 4 * C, NULL);
        gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C, m->stream);
    } else {
        matmul_forward(&m->matmul, a->fch_gelu, a->ln2, p[GPT_FCW] + lC * 4 * C, p[GPT_FCB] + lC * 4, N, C, 4 * C,
                       a->fch);
    }
}

// Block l's forward in bf16: residual3[l] from its input. Recomputing (full, in the backward),
// residual3[l] is kept and the last GEMM, which only writes it, is skipped.
static void gpt_block_forward_bf16(GPTModel* m, int l, int recomputing) {
    const int N = m->B * m->T, C = m->C;
    const size_t NC = (size_t)N * C, lC = (size_t)l * C;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    const GPTBlockActs a = gpt_block_acts(m, l);

    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, N, C, s);
    // qkv (N, QKV) = ln1 · qkvwᵀ + qkvb
    const size_t lQKV = (size_t)l * m->QKV;
    matmul_forward(mm, a.qkv, a.ln1, p[GPT_QKVW] + lQKV * C, p[GPT_QKVB] + lQKV, N, C, m->QKV, NULL);
    AttentionArgs att = gpt_attention_args(m, l);
    gpt_attention_run(m, &att, 0);  // atty (B, T, NH, HD), lse (B, NH, T)
    // residual2 (N, C) = residual + atty · attprojwᵀ + attprojb; ln2 = LN2(residual2)
    matmul_forward_residual(mm, a.residual2, a.residual, a.atty, p[GPT_ATTPROJW] + lC * C, p[GPT_ATTPROJB] + lC, N,
                            C, C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, N, C, s);
    gpt_mlp_up_forward(m, &a, l);  // fch, fch_gelu (N, 4C)
    if (recomputing) return;
    // residual3[l] (N, C) = residual2 + fch_gelu · fcprojwᵀ + fcprojb
    matmul_forward_residual(mm, m->residual3 + l * NC, a.residual2, a.fch_gelu, p[GPT_FCPROJW] + lC * 4 * C,
                            p[GPT_FCPROJB] + lC, N, 4 * C, C);
}

// Block l's forward in fp8 (gpt_fp8.cuh): as in bf16, the linear layers on FP8 tensor cores, each
// keeping its transposed FP8 input for the backward; the LayerNorm outputs and GELU(fch) exist only
// inside the casts (no bf16 ln1, ln2, fch_gelu).
static void gpt_block_forward_fp8(GPTModel* m, int l, int recomputing) {
    const int N = m->B * m->T, C = m->C;
    const size_t NC = (size_t)N * C, lC = (size_t)l * C, lQKV = (size_t)l * m->QKV;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    GPTFp8* f = &m->fp8;
    __nv_bfloat16* const* p = m->param_tensors;
    const GPTBlockActs a = gpt_block_acts(m, l);

    // LN1's statistics; its output is computed inside qkv's input cast
    layernorm_forward(NULL, a.ln1_mean, a.ln1_rstd, a.residual, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, N, C, s);
    const Fp8CastArgs ln1 = gpt_fp8_ln_input(a.residual, a.ln1_mean, a.ln1_rstd, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC);
    gpt_fp8_linear_forward(f, mm, l, GPT_LIN_QKV, a.qkv, NULL, p[GPT_QKVB] + lQKV, ln1, a.ln1_t, N);
    AttentionArgs att = gpt_attention_args(m, l);
    gpt_attention_run(m, &att, 0);
    gpt_fp8_linear_forward(f, mm, l, GPT_LIN_ATTPROJ, a.residual2, a.residual, p[GPT_ATTPROJB] + lC,
                           gpt_fp8_input(a.atty, FP8_OP_COPY), a.atty_t, N);
    layernorm_forward(NULL, a.ln2_mean, a.ln2_rstd, a.residual2, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, N, C, s);
    const Fp8CastArgs ln2 = gpt_fp8_ln_input(a.residual2, a.ln2_mean, a.ln2_rstd, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC);
    gpt_fp8_linear_forward(f, mm, l, GPT_LIN_FC, a.fch, NULL, p[GPT_FCB] + lC * 4, ln2, a.ln2_t, N);
    const Fp8CastArgs gelu = gpt_fp8_input(a.fch, FP8_OP_GELU);
    if (recomputing) {  // residual3[l] is kept: only the projection's FP8 input, for its weight gradient
        gpt_fp8_cast_input(f, l, GPT_LIN_FCPROJ, gelu, NULL, a.gelu_t, N);
        return;
    }
    gpt_fp8_linear_forward(f, mm, l, GPT_LIN_FCPROJ, m->residual3 + l * NC, a.residual2, p[GPT_FCPROJB] + lC, gelu,
                           a.gelu_t, N);
}

static void gpt_block_forward(GPTModel* m, int l, int recomputing) {
    if (m->precision == PRECISION_FP8) gpt_block_forward_fp8(m, l, recomputing);
    else gpt_block_forward_bf16(m, l, recomputing);
}

// Selective, in the backward of block l: ln1, ln2 and fch_gelu again from the kept residual,
// residual2 and fch (LayerNorm of the same bf16 input gives the same bits; fp8 skips them: its
// backward reads the FP8 inputs kept per layer), and the attention forward where the backend keeps
// T² data per layer (naive's P).
static void gpt_block_recompute_selective(GPTModel* m, int l) {
    const int N = m->B * m->T, C = m->C;
    const size_t lC = (size_t)l * C;
    __nv_bfloat16* const* p = m->param_tensors;
    const GPTBlockActs a = gpt_block_acts(m, l);
    if (m->precision != PRECISION_FP8) {
        layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, p[GPT_LN1W] + lC, p[GPT_LN1B] + lC, N, C,
                          m->stream);
        layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p[GPT_LN2W] + lC, p[GPT_LN2B] + lC, N, C,
                          m->stream);
        gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C, m->stream);
    }
    if (m->memory.att_saved_bytes > 0) {
        AttentionArgs att = gpt_attention_args(m, l);
        gpt_attention_run(m, &att, 0);
    }
}

// logits (rows, Vp) = lnf[row0 : row0 + rows] · wteᵀ: one LM-head chunk.
static void gpt_lm_head_chunk(GPTModel* m, int row0, int rows) {
    matmul_forward(&m->matmul, m->logits, m->lnf + (size_t)row0 * m->C, m->param_tensors[GPT_WTE], NULL, rows, m->C,
                   m->Vp, NULL);
}

static void gpt_params_needed(GPTModel* m, int layer) {
    if (m->params_needed) m->params_needed(m->params_needed_user, layer);
}

// The forward; grad_scale > 0: the last LM-head chunk's cross-entropy also writes dlogits (the
// backward's first step, done while the logits are fresh in memory). See the two callers below.
static void gpt_model_forward_impl(GPTModel* m, const int* inputs, const int* targets, float grad_scale) {
    const int B = m->B, T = m->T, C = m->C, L = m->L, N = B * T, Vp = m->Vp;
    const size_t NC = (size_t)N * C;
    cudaStream_t s = m->stream;
    __nv_bfloat16* const* p = m->param_tensors;
    m->inputs = inputs;
    m->targets = targets;
    // fp8: the weights are cast once per optimizer step (and for every evaluation forward, which
    // may follow an update without a new step)
    if (m->precision == PRECISION_FP8 && (m->fp8.weights_stale || grad_scale == 0.0f)) {
        gpt_params_needed(m, L);
        const __nv_bfloat16* w[GPT_LINEARS] = {p[GPT_QKVW], p[GPT_ATTPROJW], p[GPT_FCW], p[GPT_FCPROJW]};
        gpt_fp8_cast_weights(&m->fp8, w);
    }

    gpt_params_needed(m, -1);
    encoder_forward_at(m->encoded, inputs, m->positions, p[GPT_WTE], p[GPT_WPE], B, T, C, s);  // (B, T, C)
    for (int l = 0; l < L; l++) {
        gpt_params_needed(m, l);
        gpt_block_forward(m, l, 0);
    }
    // lnf = LNf(residual3[L−1])
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->residual3 + (L - 1) * NC, p[GPT_LNFW], p[GPT_LNFB], N, C,
                      s);
    // per chunk of rows: logits (rows, Vp) = lnf · wteᵀ, then their losses (and the last chunk's
    // dlogits in place when training)
    for (int row0 = 0; row0 < N; row0 += m->memory.lm_head_rows) {
        const int rows = N - row0 < m->memory.lm_head_rows ? N - row0 : m->memory.lm_head_rows;
        gpt_lm_head_chunk(m, row0, rows);
        if (grad_scale > 0.0f && row0 + rows == N)
            crossentropy_forward_backward(m->losses + row0, m->logits, targets + row0, grad_scale, rows, m->V, Vp, s);
        else
            crossentropy_forward(m->losses + row0, m->logits, targets + row0, rows, m->V, Vp, s);
    }
    m->dlogits_scale = grad_scale;
    gpt_mean_loss_kernel<<<1, 256, 0, s>>>(m->mean_loss, m->losses, N);
    CUDA_CHECK(cudaGetLastError());
}

// Forward on inputs and targets (device, (B, T) int32, inputs in [0, Vp), targets in [0, V)): fills
// model->losses (N) fp32 and model->mean_loss (1) fp32 on the device; the logits of the last LM-head
// chunk (all of them when N <= lm_head_rows) are left intact. Enqueued on model->stream; nothing is
// synchronized (gpt_model_mean_loss copies the scalar back).
static void gpt_model_forward(GPTModel* m, const int* inputs, const int* targets) {
    gpt_model_forward_impl(m, inputs, targets, 0.0f);
}

// The forward of a training micro step, to be followed by gpt_model_backward(m, grad_scale) with the
// same grad_scale (> 0): as gpt_model_forward, but the last LM-head chunk's logits are overwritten
// with their dlogits, which saves the backward a pass over them.
static void gpt_model_forward_train(GPTModel* m, const int* inputs, const int* targets, float grad_scale) {
    LAYER_REQUIRE(grad_scale > 0.0f, "gpt_model_forward_train: grad_scale %g must be > 0", grad_scale);
    gpt_model_forward_impl(m, inputs, targets, grad_scale);
}

// *sum = (first ? 0 : *sum) + weight · mean[0], on the GPU: micro steps add their loss without a host wait.
static __global__ void gpt_add_loss_kernel(float* sum, const float* mean, float weight, int first) {
    *sum = (first ? 0.0f : *sum) + weight * mean[0];
}

// Adds weight × the last forward's mean loss into the device scalar *sum (first: sets it).
static void gpt_model_add_mean_loss(GPTModel* m, float* sum, float weight, int first) {
    gpt_add_loss_kernel<<<1, 1, 0, m->stream>>>(sum, m->mean_loss, weight, first);
    CUDA_CHECK(cudaGetLastError());
}

// Copies the last forward's mean loss to the host (synchronizes the stream).
static float gpt_model_mean_loss(GPTModel* m) { return cuda_read_float(m->mean_loss, m->stream); }

// ---- backward ---------------------------------------------------------------------------------------

// grads = 0 (before the first micro-step of a step). fp8: also the start of a step (gpt_fp8_begin_step:
// the last step's amaxes set this step's scales, and the weights are cast again).
static void gpt_model_zero_grad(GPTModel* m) {
    if (m->precision == PRECISION_FP8) gpt_fp8_begin_step(&m->fp8);
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, m->num_params_padded * sizeof(__nv_bfloat16), m->stream));
}

// The LM head and the loss, chunk by chunk from the last: losses again and dlogits in place of the
// chunk's logits (recomputed, except the last chunk's, which the forward left: as logits, or already
// as dlogits after gpt_model_forward_train with this grad_scale), then dln (rows, C) = dlogits · wte
// and dwte += dlogitsᵀ · lnf.
static void gpt_lm_head_backward(GPTModel* m, float grad_scale) {
    const int N = m->B * m->T, C = m->C, Vp = m->Vp, chunk = m->memory.lm_head_rows, last = (N - 1) / chunk * chunk;
    LAYER_REQUIRE(m->dlogits_scale == 0.0f || m->dlogits_scale == grad_scale,
                  "gpt_model_backward: grad_scale %g differs from the %g given to gpt_model_forward_train; pass the "
                  "same value to both",
                  grad_scale, m->dlogits_scale);
    for (int row0 = last; row0 >= 0; row0 -= m->memory.lm_head_rows) {
        const int rows = N - row0 < m->memory.lm_head_rows ? N - row0 : m->memory.lm_head_rows;
        if (row0 != last) gpt_lm_head_chunk(m, row0, rows);
        if (row0 != last || m->dlogits_scale == 0.0f)
            crossentropy_forward_backward(m->losses + row0, m->logits, m->targets + row0, grad_scale, rows, m->V, Vp,
                                          m->stream);
        matmul_backward(&m->matmul, m->dln + (size_t)row0 * C, m->grad_tensors[GPT_WTE], NULL, m->logits,
                        m->lnf + (size_t)row0 * C, m->param_tensors[GPT_WTE], rows, C, Vp, NULL, 1, NULL);
    }
    m->dlogits_scale = 0.0f;  // the logits buffer holds dlogits either way now
}

// The MLP's backward, from dresidual = d(residual3): dln (N, C) = d(ln2); the fc projection's and
// fc's weight gradients and the fc bias gradient += (the projection's own bias gradient comes with
// dresidual, from the LayerNorm backward). bf16: dwide (N, 4C) = d(fch) through the fused dGELU, the
// fc bias gradient made with it. fp8: dwide = d(fch_gelu), and the fc layer's gradient cast takes
// GELU' and the bias gradient's column sums in its one pass.
static void gpt_mlp_backward(GPTModel* m, const GPTBlockActs* a, int l) {
    const int N = m->B * m->T, C = m->C;
    const size_t lC = (size_t)l * C;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    __nv_bfloat16* const* g = m->grad_tensors;
    if (m->precision == PRECISION_FP8) {
        gpt_fp8_linear_backward(&m->fp8, mm, l, GPT_LIN_FCPROJ, m->dwide, g[GPT_FCPROJW] + lC * 4 * C, NULL,
                                m->dresidual, FP8_OP_COPY, NULL, a->gelu_t, N);
        gpt_fp8_linear_backward(&m->fp8, mm, l, GPT_LIN_FC, m->dln, g[GPT_FCW] + lC * 4 * C, g[GPT_FCB] + lC * 4,
                                m->dwide, FP8_OP_DGELU, a->fch, a->ln2_t, N);
        return;
    }
    matmul_backward_dgelu_dbias(mm, m->dwide, g[GPT_FCPROJW] + lC * 4 * C, NULL, m->dresidual, a->fch_gelu,
                                p[GPT_FCPROJW] + lC * 4 * C, N, 4 * C, C, a->fch, 1, m->scratch, g[GPT_FCB] + lC * 4);
    matmul_backward(mm, m->dln, g[GPT_FCW] + lC * 4 * C, NULL, m->dwide, a->ln2, p[GPT_FCW] + lC * 4 * C, N, C, 4 * C,
                    NULL, 1, m->scratch);
}

// The backward of the attention projection (dy = dresidual, now d(residual2); dln (N, C) = d(atty))
// or of qkv (dy = dqkv (N, QKV) in dwide; dln = d(ln1)); the weight gradient +=. Their bias
// gradients are made elsewhere (LayerNorm backward, qkv_bias.cuh).
static void gpt_linear_backward(GPTModel* m, const GPTBlockActs* a, int l, GPTLinear lin) {
    const int N = m->B * m->T, C = m->C, qkv = lin == GPT_LIN_QKV;
    const int OC = qkv ? m->QKV : C;
    const size_t w = (size_t)l * OC * C;  // layer l's weight (OC, C)
    const int wi = qkv ? GPT_QKVW : GPT_ATTPROJW;
    __nv_bfloat16* dy = qkv ? m->dwide : m->dresidual;
    if (m->precision == PRECISION_FP8)
        gpt_fp8_linear_backward(&m->fp8, &m->matmul, l, lin, m->dln, m->grad_tensors[wi] + w, NULL, dy, FP8_OP_COPY,
                                NULL, qkv ? a->ln1_t : a->atty_t, N);
    else
        matmul_backward(&m->matmul, m->dln, m->grad_tensors[wi] + w, NULL, dy, qkv ? a->ln1 : a->atty,
                        m->param_tensors[wi] + w, N, C, OC, NULL, 1, m->scratch);
}

// ADDS the gradient of grad_scale · Σ losses (grad_scale = 1/(B·T·accum_steps) for the mean over a
// step) into model->grads. Must follow gpt_model_forward, or gpt_model_forward_train with the same
// grad_scale, on the same batch (its inputs and targets still valid). Overwrites the logits with
// dlogits.
static void gpt_model_backward(GPTModel* m, float grad_scale) {
    const int B = m->B, T = m->T, C = m->C, L = m->L, N = B * T, Vp = m->Vp, QKV = m->QKV;
    const size_t NC = (size_t)N * C;
    cudaStream_t s = m->stream;
    MatmulContext* mm = &m->matmul;
    __nv_bfloat16* const* p = m->param_tensors;
    __nv_bfloat16* const* g = m->grad_tensors;
    float* ln_scratch = (float*)m->scratch;
    const size_t scratch_bytes = m->memory.scratch_bytes;

    // LM head: losses again, dln (N, C) = d(lnf), dwte +=
    gpt_lm_head_backward(m, grad_scale);
    // final LN: dresidual (N, C) = 0 + LNf backward (the gradient of residual3[L−1]). Each LayerNorm
    // backward also sums the columns of the dresidual it writes: the bias gradient of the projection
    // whose output was added there (so those two GEMMs run without a bias-gradient epilogue)
    CUDA_CHECK(cudaMemsetAsync(m->dresidual, 0, NC * sizeof(__nv_bfloat16), s));
    layernorm_backward(m->dresidual, g[GPT_LNFW], g[GPT_LNFB], g[GPT_FCPROJB] + (size_t)(L - 1) * C, ln_scratch,
                       scratch_bytes, m->dln, m->residual3 + (L - 1) * NC, p[GPT_LNFW], m->lnf_mean,
                       m->lnf_rstd, N, C, s);

    for (int l = L - 1; l >= 0; l--) {
        const size_t lC = (size_t)l * C;
        if (m->memory.recompute == RECOMPUTE_FULL) gpt_block_forward(m, l, 1);
        if (m->memory.recompute == RECOMPUTE_SELECTIVE) gpt_block_recompute_selective(m, l);
        const GPTBlockActs a = gpt_block_acts(m, l);
        gpt_mlp_backward(m, &a, l);  // dln (N, C) = d(ln2); dfcprojw, dfcw, dfcb +=
        // dresidual += LN2 backward: now d(residual2); dattprojb += its column sums
        layernorm_backward(m->dresidual, g[GPT_LN2W] + lC, g[GPT_LN2B] + lC, g[GPT_ATTPROJB] + lC, ln_scratch,
                           scratch_bytes, m->dln, a.residual2, p[GPT_LN2W] + lC, a.ln2_mean, a.ln2_rstd, N, C, s);
        gpt_linear_backward(m, &a, l, GPT_LIN_ATTPROJ);  // dln (N, C) = d(atty); dattprojw +=
        // attention: dwide[:, :QKV] = dqkv (B, T, NH + 2·NKV, HD) (overwritten); where the backend
        // can, it also adds dq's column sums, the q part of dqkvb, from the tiles it writes
        const size_t lQKV = (size_t)l * QKV;
        AttentionArgs att = gpt_attention_args(m, l);
        att.dq_colsum = m->att_sums_dq ? g[GPT_QKVB] + lQKV : NULL;
        att.dq_colsum_accumulate = 1;
        gpt_attention_run(m, &att, 1);
        // qkv: the rest of dqkvb from the q columns of dqkv (unless done above) and the attention
        // projection's bias gradient (qkv_bias.cuh; dln, free until the next call writes it, holds
        // its (C) temporary); then dln (N, C) = d(ln1), dqkvw += (dqkv is (N, QKV) contiguous in dwide)
        qkv_bias_backward(mm, g[GPT_QKVB] + lQKV, m->dwide, g[GPT_ATTPROJB] + lC, p[GPT_ATTPROJW] + lC * C, m->dln,
                          m->scratch, N, m->NH, m->NKV, m->HD, 1, m->att_sums_dq);
        gpt_linear_backward(m, &a, l, GPT_LIN_QKV);
        // dresidual += LN1 backward: now d(residual_l), the previous block's output (or the embedding);
        // the previous block's MLP projection bias gradient += its column sums
        layernorm_backward(m->dresidual, g[GPT_LN1W] + lC, g[GPT_LN1B] + lC,
                           l > 0 ? g[GPT_FCPROJB] + lC - C : NULL, ln_scratch, scratch_bytes, m->dln, a.residual,
                           p[GPT_LN1W] + lC, a.ln1_mean, a.ln1_rstd, N, C, s);
        if (m->grads_ready) m->grads_ready(m->grads_ready_user, l);  // layer l's gradients are final
    }
    // embedding: dwte += (rows of the input tokens), dwpe += (rows t < T, or the rows of m->positions)
    encoder_backward_at(g[GPT_WTE], g[GPT_WPE], m->scratch, scratch_bytes, m->dresidual, m->inputs, m->positions, B, T,
                        C, Vp, s);
    if (m->grads_ready) m->grads_ready(m->grads_ready_user, -1);  // wte, wpe, lnfw, lnfb are final
}

#endif  // GPT_MODEL_CUH
