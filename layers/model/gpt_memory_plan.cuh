// gpt_memory_plan.cuh: what a model of a given config costs, worked out from the config and the
// creation options alone, with no model and no GPU: the activation table (every tensor of the one
// activation allocation, its shape, size and offset), the shared scratch size, which layers keep
// which activations under each --recompute mode, and the FLOPs recomputation adds. gpt_model_create
// allocates exactly this plan; the trainer's plan prints it for every mode before any GPU work.
#ifndef GPT_MEMORY_PLAN_CUH
#define GPT_MEMORY_PLAN_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"
#include "data/gpt_config.h"
#include "layers/model/encoder.cuh"
#include "layers/model/gpt_fp8.cuh"
#include "layers/model/layer_common.cuh"
#include "layers/model/layernorm.cuh"
#include "layers/model/matmul.cuh"

// Every tensor of the activation allocation, in allocation order: the GPTModel member (a pointer of
// the given element type), its shape as printed in the memory plan, and its size in bytes, an
// expression in N = B·T, C, QKV = (NH + 2·NKV)·HD, NH, Vp, bf = 2 and f4 = 4, the layers a tensor keeps
// (L for all; Lg, Lc, La: L or 1 by the recompute mode, see gpt_memory_plan), Nh = lm_head_rows,
// F8 = 1 with --precision fp8 and 0 with bf16, and Ncs = the row tiles of the FP8 column sums
// (evaluated in gpt_memory_plan_table). "l" in a shape is that layer count.
#define GPT_ACTIVATIONS(X)                                                                                         \
    X(encoded,   __nv_bfloat16, "(B, T, C) bf16",             N * C * bf)                                          \
    X(ln1,       __nv_bfloat16, "(l, B, T, C) bf16",          (1 - F8) * Lc * N * C * bf)                          \
    X(ln1_mean,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(ln1_rstd,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(qkv,       __nv_bfloat16, "(l, B, T, NH+2NKV, HD) bf16", Lg * N * QKV * bf)                                  \
    X(atty,      __nv_bfloat16, "(l, B, T, NH, HD) bf16",     Lg * N * C * bf)                                     \
    X(att_lse,   float,         "(l, B, NH, T) fp32",         Lg * NH * N * f4)                                    \
    /* the backend's `saved` per layer (naive: P; flash: empty) */                                                 \
    X(att_saved, char,          "(l, backend saved bytes)",   La * layer_align256(p->att_saved_bytes))             \
    X(residual2, __nv_bfloat16, "(l, B, T, C) bf16",          Lg * N * C * bf)                                     \
    X(ln2,       __nv_bfloat16, "(l, B, T, C) bf16",          (1 - F8) * Lc * N * C * bf)                          \
    X(ln2_mean,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(ln2_rstd,  float,         "(L, B, T) fp32",             L * N * f4)                                          \
    X(fch,       __nv_bfloat16, "(l, B, T, 4C) bf16",         Lg * N * 4 * C * bf) /* before GELU */               \
    /* fp8 casts LN1, LN2 and GELU(fch) straight to FP8: no bf16 ln1, ln2, fch_gelu */                            \
    X(fch_gelu,  __nv_bfloat16, "(l, B, T, 4C) bf16",         (1 - F8) * Lc * N * 4 * C * bf)                      \
    X(residual3, __nv_bfloat16, "(L, B, T, C) bf16",          L * N * C * bf)                                      \
    X(lnf,       __nv_bfloat16, "(B, T, C) bf16",             N * C * bf)                                          \
    X(lnf_mean,  float,         "(B, T) fp32",                N * f4)                                              \
    X(lnf_rstd,  float,         "(B, T) fp32",                N * f4)                                              \
    /* one LM-head chunk of rows; dlogits in place after the backward's cross-entropy */                           \
    X(logits,    __nv_bfloat16, "(chunk rows, Vp) bf16",      Nh * Vp * bf)                                        \
    X(losses,    float,         "(B, T) fp32",                N * f4)                                              \
    X(mean_loss, float,         "(1) fp32",                   f4)                                                  \
    X(dresidual, __nv_bfloat16, "(B, T, C) bf16",             N * C * bf) /* gradient of the residual stream */    \
    X(dln,       __nv_bfloat16, "(B, T, C) bf16",             N * C * bf) /* gradient of an LN output / atty */    \
    X(dwide,     __nv_bfloat16, "(B, T, 4C) bf16",            N * 4 * C * bf) /* d fch (N, 4C) or d qkv (N, QKV) */\
    /* fp8 (gpt_fp8.cuh): a linear layer's FP8 input; the transposed FP8 inputs kept for the weight gradients; */ \
    /* the FP8 output gradient, both layouts; the column sums of the fc bias gradient */                          \
    X(fp8_x,      uint8_t,      "(B, T, 4C) e4m3",            F8 * N * 4 * C)                                      \
    X(fp8_ln1_t,  uint8_t,      "(l, C, B·T) e4m3",           F8 * Lg * C * N)                                     \
    X(fp8_atty_t, uint8_t,      "(l, C, B·T) e4m3",           F8 * Lg * C * N)                                     \
    X(fp8_ln2_t,  uint8_t,      "(l, C, B·T) e4m3",           F8 * Lg * C * N)                                     \
    X(fp8_gelu_t, uint8_t,      "(l, 4C, B·T) e4m3",          F8 * Lg * 4 * C * N)                                 \
    X(fp8_dy,     uint8_t,      "(B, T, 4C) e5m2",            F8 * N * 4 * C)                                      \
    X(fp8_dy_t,   uint8_t,      "(4C, B·T) e5m2",             F8 * N * 4 * C)                                      \
    X(fp8_colsum, float,        "(B·T/64, 4C) fp32",          F8 * Ncs * 4 * C * f4)                               \
    /* max of encoder/LN/dbias backward scratch and the attention workspace */                                     \
    X(scratch,   void,          "(bytes)",                    p->scratch_bytes)

// GPT_ACT_encoded, GPT_ACT_ln1, ...: a tensor's index in the table.
enum {
#define GPT_ACT_ENUM(member, type, shape, bytes) GPT_ACT_##member,
    GPT_ACTIVATIONS(GPT_ACT_ENUM)
#undef GPT_ACT_ENUM
    GPT_NUM_ACTS
};

// --precision: the arithmetic of the blocks' linear layers (bf16, or FP8 as gpt_fp8.cuh says).
typedef enum { PRECISION_BF16 = 0, PRECISION_FP8 = 1 } GPTPrecision;
#define NUM_PRECISIONS 2
static const char* const PRECISION_NAMES[NUM_PRECISIONS] = {"bf16", "fp8"};

// 0 and *precision set for "bf16" or "fp8"; -1 otherwise.
static inline int gpt_precision_from_name(const char* name, GPTPrecision* precision) {
    const int i = layer_name_index(name, PRECISION_NAMES, NUM_PRECISIONS);
    if (i >= 0) *precision = (GPTPrecision)i;
    return i >= 0 ? 0 : -1;
}

// --recompute: what the backward recomputes instead of keeping (layers/model/gpt_model.cuh says how).
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_SELECTIVE = 1, RECOMPUTE_FULL = 2 } RecomputeMode;
#define NUM_RECOMPUTE_MODES 3
static const char* const RECOMPUTE_NAMES[NUM_RECOMPUTE_MODES] = {"none", "selective", "full"};

// 0 and *mode set for "none", "selective" or "full"; -1 otherwise.
static inline int gpt_recompute_from_name(const char* name, RecomputeMode* mode) {
    const int i = layer_name_index(name, RECOMPUTE_NAMES, NUM_RECOMPUTE_MODES);
    if (i >= 0) *mode = (RecomputeMode)i;
    return i >= 0 ? 0 : -1;
}

// Rows of one LM-head chunk: logits (16384, 50304) bf16 are 1.5 GiB. Micro batches of at most this
// many tokens (every Table 1 config) run the head in one piece, as without chunking.
#define GPT_LM_HEAD_CHUNK_ROWS 16384


typedef struct {
    const char* name;
    const char* shape;  // for the memory plan
    size_t bytes;       // exact size
    size_t offset;      // into the allocation, 256-byte aligned
} GPTActTensor;

// Everything a model is built for besides its config; gpt_model_create takes it whole, so a model
// is finished in one call. Zero is the default of every field but B, T and backend.
typedef struct {
    int B, T;                     // the micro batch the activations are sized for, 1 <= T <= config.max_seq_len
    AttentionBackend backend;
    RecomputeMode recompute;      // RECOMPUTE_NONE: keep every activation (the fastest)
    int lm_head_rows;             // rows of one LM-head chunk; 0: GPT_LM_HEAD_CHUNK_ROWS
    int deterministic_attention;  // AttentionArgs.deterministic of every layer (bit-identical reruns)
    int tune_gemms;               // time GEMM algorithms at start-up; the choice may differ between processes
    size_t pad_multiple;          // params and grads padded to a multiple of this (ZeRO-1 shards); 0, 1: none
    GPTPrecision precision;       // PRECISION_BF16: every GEMM in bf16
    Fp8Recipe fp8_recipe;         // with PRECISION_FP8: how activation and gradient scales are chosen
    cudaStream_t stream;          // all of the model's work
} GPTModelOptions;

// The activation allocation of a model: the table of its tensors and what the recompute mode keeps.
typedef struct {
    RecomputeMode recompute;
    int layers_gemm;          // layers kept of qkv, atty, att_lse, residual2, fch: 1 with full, else L
    int layers_cheap;         // of ln1, ln2, fch_gelu: L with none, else 1 (fp8: none of them, F8 above)
    int layers_att;           // of att_saved: as layers_cheap
    int lm_head_rows;         // rows of one LM-head chunk, <= N
    size_t att_saved_bytes;   // the backend's saved data per layer
    size_t scratch_bytes;
    GPTActTensor act_table[GPT_NUM_ACTS];
    size_t act_bytes;         // the whole allocation
} GPTMemoryPlan;

static inline size_t gpt_max_size(size_t a, size_t b) { return a > b ? a : b; }

// The attention shape of every layer: causal, over (B, T) micro batches.
static AttentionShape gpt_attention_shape(const GPTConfig* config, int B, int T) {
    AttentionShape s;
    memset(&s, 0, sizeof(s));
    s.B = B, s.T = T, s.NH = config->num_heads, s.HD = config->channels / config->num_heads;
    s.NKV = config->num_kv_heads;
    s.causal = 1;
    return s;
}

// Bytes of the shared scratch buffer. exact = 1 asks the GPU (LayerNorm's backward grid and CUB's
// sort storage depend on it); exact = 0 (the plan, before any CUDA call) leaves those two out: they
// are small next to the attention workspace and the dbias partial sums.
static size_t gpt_scratch_bytes(const GPTConfig* config, const GPTModelOptions* o, int exact) {
    const int N = o->B * o->T, C = config->channels;
    const AttentionShape shape = gpt_attention_shape(config, o->B, o->T);
    size_t scratch = matmul_dbias_scratch_bytes(N, 4 * C);  // the widest biased output, 4C
    scratch = gpt_max_size(scratch, matmul_dbias_scratch_bytes(C, C));  // qkv_bias.cuh's (1, C)·(C, C) sums
    scratch = gpt_max_size(scratch, attention_workspace_bytes(o->backend, &shape));
    if (exact) {
        scratch = gpt_max_size(scratch, encoder_backward_scratch_bytes(N, C, config->padded_vocab_size));
        scratch = gpt_max_size(scratch, layernorm_backward_scratch_bytes(N, C));
    } else {
        const size_t chunks = layer_ceil_div((size_t)N, ENCODER_BWD_CHUNK);
        scratch = gpt_max_size(scratch, 3 * layer_align256((size_t)N * sizeof(int)) +
                                              layer_align256(chunks * 2 * (size_t)C * sizeof(float)));
    }
    return scratch;
}

// Fills the table: each tensor's size from GPT_ACTIVATIONS, its offset 256-byte aligned after the last.
static void gpt_memory_plan_table(GPTMemoryPlan* p, const GPTConfig* config, const GPTModelOptions* o) {
    const size_t L = config->num_layers, C = config->channels, NH = config->num_heads, N = (size_t)o->B * o->T;
    const size_t Vp = config->padded_vocab_size, QKV = gpt_qkv_features(config);
    const size_t Lg = p->layers_gemm, Lc = p->layers_cheap, La = p->layers_att, Nh = p->lm_head_rows;
    const size_t F8 = o->precision == PRECISION_FP8, Ncs = (size_t)fp8_colsum_tiles((int)N);
    const size_t bf = 2, f4 = 4;  // bytes of bf16 and fp32
    GPTActTensor* t = p->act_table;
#define GPT_ACT_PLAN(member, type, shp, nbytes) \
    t[GPT_ACT_##member].name = #member, t[GPT_ACT_##member].shape = shp, t[GPT_ACT_##member].bytes = (nbytes);
    GPT_ACTIVATIONS(GPT_ACT_PLAN)
#undef GPT_ACT_PLAN
    size_t offset = 0;
    for (int i = 0; i < GPT_NUM_ACTS; i++) {
        t[i].offset = offset;
        offset += layer_align256(t[i].bytes);
    }
    p->act_bytes = offset;
}

// The memory plan of a model of `config` built with `o` (exact: as for gpt_scratch_bytes). No CUDA
// call with exact = 0; the config and (B, T) must be valid (gpt_config_check).
static void gpt_memory_plan(GPTMemoryPlan* p, const GPTConfig* config, const GPTModelOptions* o, int exact) {
    memset(p, 0, sizeof(*p));
    const int L = config->num_layers, N = o->B * o->T;
    p->recompute = o->recompute;
    p->layers_gemm = o->recompute == RECOMPUTE_FULL ? 1 : L;
    p->layers_cheap = o->recompute == RECOMPUTE_NONE ? L : 1;
    p->layers_att = p->layers_cheap;
    const int rows = o->lm_head_rows > 0 ? o->lm_head_rows : GPT_LM_HEAD_CHUNK_ROWS;
    p->lm_head_rows = rows < N ? rows : N;
    const AttentionShape shape = gpt_attention_shape(config, o->B, o->T);
    p->att_saved_bytes = attention_saved_bytes(o->backend, &shape);
    p->scratch_bytes = gpt_scratch_bytes(config, o, exact);
    gpt_memory_plan_table(p, config, o);
}

// Bytes of the activation allocation of a model of `config` built with `o` (exact: as above).
static size_t gpt_activation_bytes(const GPTConfig* config, const GPTModelOptions* o, int exact) {
    static GPTMemoryPlan plan;  // a table of GPT_NUM_ACTS entries: kept off the stack
    gpt_memory_plan(&plan, config, o, exact);
    return plan.act_bytes;
}

// FLOPs per micro step (B sequences) that recomputation adds, as the kernels execute them (a GEMM
// 2·m·n·k; attention's forward by attention_executed_flops, so causal flash attention counts its
// unmasked half; LayerNorm and GELU nothing): full reruns each block's forward up to its last GEMM
// (qkv, attproj and fc: 2·N·C·(QKV + C + 4C) per layer, 16·N·C² without GQA) and its attention
// forward; selective reruns the attention forward where the backend keeps T² data; the LM head
// recomputes the logits of every chunk but the last, 2·rows·C·Vp.
static double gpt_recompute_flops(const GPTConfig* config, const GPTModelOptions* o, const GPTMemoryPlan* p) {
    const double N = (double)o->B * o->T, C = config->channels, L = config->num_layers;
    const double Vp = config->padded_vocab_size, QKV = (double)gpt_qkv_features(config);
    const AttentionShape shape = gpt_attention_shape(config, o->B, o->T);
    const double attention_forward = attention_executed_flops(o->backend, &shape, 0);
    double flops = 0.0;
    if (p->recompute == RECOMPUTE_FULL) flops += L * (2.0 * N * C * (QKV + 5.0 * C) + attention_forward);
    if (p->recompute == RECOMPUTE_SELECTIVE && p->att_saved_bytes > 0) flops += L * attention_forward;
    const int rows = o->B * o->T, last_chunk_rows = rows - (rows - 1) / p->lm_head_rows * p->lm_head_rows;
    return flops + 2.0 * (double)(rows - last_chunk_rows) * C * Vp;
}

// FLOPs per micro step the kernels execute (the trainer's "hw" TFLOP/s): every GEMM's forward and
// both backward products, 6·N per weight (qkv QKV·C, attproj C², fc and fcproj 4C² each, the LM head
// Vp·C; the embeddings' lookups and LayerNorm are not products), attention's forward and backward as
// the backend runs them, and the recomputation. Unlike the model FLOPs (6·T·P + 12·L·h·T², the
// paper's count, which includes the masked half of causal attention) this cannot exceed the peak.
static double gpt_executed_flops(const GPTConfig* config, const GPTModelOptions* o, const GPTMemoryPlan* p) {
    const double N = (double)o->B * o->T, C = config->channels, L = config->num_layers;
    const double Vp = config->padded_vocab_size, QKV = (double)gpt_qkv_features(config);
    const AttentionShape shape = gpt_attention_shape(config, o->B, o->T);
    const double attention = attention_executed_flops(o->backend, &shape, 0) +
                             attention_executed_flops(o->backend, &shape, 1);
    const double gemms = 6.0 * N * (L * C * (QKV + 9.0 * C) + Vp * C);
    return gemms + L * attention + gpt_recompute_flops(config, o, p);
}

#endif  // GPT_MEMORY_PLAN_CUH
