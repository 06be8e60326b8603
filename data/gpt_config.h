// gpt_config.h: the model's shape, its parameter tensors, and FLOP accounting.
//
// Plain C (no CUDA), shared by the trainer and the CPU reference, so both lay the
// parameters out identically and count FLOPs the same way.
//
// GPT_PARAM_TENSORS below is the one list of the 16 parameter tensors: their order in memory and in
// every file (llm.c's), shapes, initialization and weight decay. The sizes (gpt_param_sizes), the
// model (layers/model/gpt_model.cuh), the initialization and AdamW (layers/optimizer/optimizer.cuh), the multi-GPU
// gradient buckets (layers/multi_gpu/multi_gpu.cuh) and the file formats (data/) all read it.
// Linear weights are (out_features, in_features), row-major.
#ifndef GPT_CONFIG_H
#define GPT_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define GPT2_VOCAB_SIZE 50257
#define GPT2_EOT_TOKEN 50256
#define VOCAB_PAD_MULTIPLE 128  // pad the vocab so the LM-head GEMM has friendly sizes

typedef struct {
    int num_layers;         // L
    int channels;           // C, the hidden size
    int num_heads;          // NH; head dim HD = C / NH
    int num_kv_heads;       // NKV key/value heads (NH % NKV == 0): NH multi-head, 1 multi-query, else grouped-query
    int vocab_size;         // V, real tokens
    int padded_vocab_size;  // Vp >= V, multiple of VOCAB_PAD_MULTIPLE; rows past V are never targets
    int max_seq_len;        // maxT, rows of wpe
} GPTConfig;

// How the GPT-2 initialization draws a tensor.
typedef enum {
    INIT_NORMAL,           // N(0, 0.02)
    INIT_NORMAL_RESIDUAL,  // N(0, 0.02 / √(2L)): the projections that add into the residual stream
    INIT_ONES,             // LayerNorm gains
    INIT_ZEROS,            // biases
} GPTParamInit;

// The parameter tensors, in storage order. Per row: the tensor, its shape (rows, cols) for one
// copy, how many copies are stacked (GPT_ONCE, or GPT_PER_LAYER: (L, rows, cols)), its initialization,
// and whether AdamW decays it (the 2-D weights only). rows and cols are expressions in C (hidden),
// QKV (= (NH + 2·NKV)·HD, the query, key and value features: 3C for multi-head), Vp (padded vocab)
// and maxT (positions).
#define GPT_PARAM_TENSORS(X)                                                                             \
    /* id        name        rows   cols   stacked        init                  decay */                 \
    X(WTE,      "wte",      Vp,    C,     GPT_ONCE,      INIT_NORMAL,          1) /* also the LM head */ \
    X(WPE,      "wpe",      maxT,  C,     GPT_ONCE,      INIT_NORMAL,          1)                        \
    X(LN1W,     "ln1w",     1,     C,     GPT_PER_LAYER, INIT_ONES,            0)                        \
    X(LN1B,     "ln1b",     1,     C,     GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(QKVW,     "qkvw",     QKV,   C,     GPT_PER_LAYER, INIT_NORMAL,          1)                        \
    X(QKVB,     "qkvb",     1,     QKV,   GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(ATTPROJW, "attprojw", C,     C,     GPT_PER_LAYER, INIT_NORMAL_RESIDUAL, 1)                        \
    X(ATTPROJB, "attprojb", 1,     C,     GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(LN2W,     "ln2w",     1,     C,     GPT_PER_LAYER, INIT_ONES,            0)                        \
    X(LN2B,     "ln2b",     1,     C,     GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(FCW,      "fcw",      4 * C, C,     GPT_PER_LAYER, INIT_NORMAL,          1)                        \
    X(FCB,      "fcb",      1,     4 * C, GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(FCPROJW,  "fcprojw",  C,     4 * C, GPT_PER_LAYER, INIT_NORMAL_RESIDUAL, 1)                        \
    X(FCPROJB,  "fcprojb",  1,     C,     GPT_PER_LAYER, INIT_ZEROS,           0)                        \
    X(LNFW,     "lnfw",     1,     C,     GPT_ONCE,      INIT_ONES,            0) /* final LayerNorm */  \
    X(LNFB,     "lnfb",     1,     C,     GPT_ONCE,      INIT_ZEROS,           0)

enum { GPT_ONCE = 0, GPT_PER_LAYER = 1 };

// GPT_WTE, GPT_WPE, ...: a tensor's index in the table.
enum {
#define GPT_PARAM_ENUM(id, name, rows, cols, stacked, init, decay) GPT_##id,
    GPT_PARAM_TENSORS(GPT_PARAM_ENUM)
#undef GPT_PARAM_ENUM
    NUM_PARAM_TENSORS
};

typedef struct {
    const char* name;
    int per_layer;      // 1: (L, rows, cols), one slice per layer
    GPTParamInit init;
    int weight_decay;   // 1: AdamW decays it
} GPTParamSpec;

static const GPTParamSpec GPT_PARAMS[NUM_PARAM_TENSORS] = {
#define GPT_PARAM_SPEC(id, name, rows, cols, stacked, init, decay) {name, stacked, init, decay},
    GPT_PARAM_TENSORS(GPT_PARAM_SPEC)
#undef GPT_PARAM_SPEC
};

typedef struct {
    const char* name;
    int num_layers, channels, num_heads;  // multi-head; --kv-heads makes any of them grouped-query
} NamedGPTShape;

// The named shapes `--model` accepts. GPT-3 shapes follow the GPT-3 paper's Table 2.1;
// gpt3-2.7b-d128 is 2.7B with 20 heads of 128 so every layer uses the fastest head dim.
static const NamedGPTShape NAMED_GPT_SHAPES[] = {
    {"gpt2-124m", 12, 768, 12},      {"gpt2-350m", 24, 1024, 16},
    {"gpt2-774m", 36, 1280, 20},     {"gpt2-1558m", 48, 1600, 25},
    {"gpt3-1.3b", 24, 2048, 16},     {"gpt3-2.7b", 32, 2560, 32},
    {"gpt3-2.7b-d128", 32, 2560, 20},
};
#define NUM_NAMED_GPT_SHAPES ((int)(sizeof(NAMED_GPT_SHAPES) / sizeof(NAMED_GPT_SHAPES[0])))

// Head dims every attention backend is built for.
static const int SUPPORTED_HEAD_DIMS[] = {64, 80, 96, 128};
#define NUM_SUPPORTED_HEAD_DIMS 4

static inline const NamedGPTShape* gpt_find_named_shape(const char* name) {
    for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++)
        if (strcmp(NAMED_GPT_SHAPES[i].name, name) == 0) return &NAMED_GPT_SHAPES[i];
    return NULL;
}

static inline int gpt_round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

static inline int gpt_head_dim_supported(int head_dim) {
    for (int i = 0; i < NUM_SUPPORTED_HEAD_DIMS; i++)
        if (SUPPORTED_HEAD_DIMS[i] == head_dim) return 1;
    return 0;
}

// Checks a config for the GPU trainer. Returns 0 when usable; otherwise writes a message that
// says what is wrong and what to change into err and returns -1.
static inline int gpt_config_check(const GPTConfig* c, char* err, size_t err_len) {
    if (c->num_layers < 1 || c->channels < 1 || c->num_heads < 1 || c->max_seq_len < 1) {
        snprintf(err, err_len, "layers (%d), hidden (%d), heads (%d) and sequence length (%d) must all be >= 1",
                 c->num_layers, c->channels, c->num_heads, c->max_seq_len);
        return -1;
    }
    if (c->channels % c->num_heads != 0) {
        snprintf(err, err_len, "hidden size %d is not divisible by %d heads; choose --heads that divides --hidden",
                 c->channels, c->num_heads);
        return -1;
    }
    int head_dim = c->channels / c->num_heads;
    if (!gpt_head_dim_supported(head_dim)) {
        snprintf(err, err_len,
                 "head dim %d (hidden %d / %d heads) is not supported: the attention kernels are built for "
                 "head dims 64, 80, 96 and 128; choose --heads so that hidden / heads is one of them",
                 head_dim, c->channels, c->num_heads);
        return -1;
    }
    if (c->num_kv_heads < 1 || c->num_kv_heads > c->num_heads || c->num_heads % c->num_kv_heads != 0) {
        snprintf(err, err_len,
                 "%d key/value heads do not divide %d heads; choose --kv-heads that divides --heads (--kv-heads %d "
                 "is multi-head attention, 1 multi-query)",
                 c->num_kv_heads, c->num_heads, c->num_heads);
        return -1;
    }
    if (c->padded_vocab_size < c->vocab_size) {
        snprintf(err, err_len, "padded vocab %d is smaller than vocab %d", c->padded_vocab_size, c->vocab_size);
        return -1;
    }
    return 0;
}

// Features of the QKV projection: (NH + 2·NKV)·HD, the packed (B, T, NH + 2·NKV, HD) activation's row.
static inline size_t gpt_qkv_features(const GPTConfig* c) {
    const size_t HD = (size_t)(c->channels / c->num_heads);
    return ((size_t)c->num_heads + 2 * (size_t)c->num_kv_heads) * HD;
}

// Element counts of the parameter tensors, in storage order (GPT_PARAM_TENSORS).
static inline void gpt_param_sizes(size_t sizes[NUM_PARAM_TENSORS], const GPTConfig* c) {
    const size_t Vp = (size_t)c->padded_vocab_size, C = (size_t)c->channels, L = (size_t)c->num_layers;
    const size_t maxT = (size_t)c->max_seq_len, QKV = gpt_qkv_features(c);
#define GPT_PARAM_SIZE(id, name, rows, cols, stacked, init, decay) \
    sizes[GPT_##id] = (stacked == GPT_PER_LAYER ? L : 1) * (size_t)(rows) * (size_t)(cols);
    GPT_PARAM_TENSORS(GPT_PARAM_SIZE)
#undef GPT_PARAM_SIZE
}

static inline size_t gpt_num_params(const GPTConfig* c) {
    size_t sizes[NUM_PARAM_TENSORS], total = 0;
    gpt_param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) total += sizes[i];
    return total;
}

// Model FLOPs of one training step (forward + backward) on one sequence of length T, by the
// Megatron formula the FlashAttention-2 paper's Table 1 uses: 6·T·P + 12·L·h·T². P counts all
// parameters (embeddings and padded vocab included); attention is not halved for the causal mask.
// Grouped-query attention changes only P (the QKV projection is C × (NH + 2·NKV)·HD): every query
// head still computes Q Kᵀ and P V over all T keys, so the attention term 12·L·h·T² (h = NH·HD) stays.
static inline double gpt_flops_per_sequence(const GPTConfig* c, int T) {
    double P = (double)gpt_num_params(c), L = c->num_layers, h = c->channels, s = T;
    return 6.0 * s * P + 12.0 * L * h * s * s;
}

// Dense bf16 tensor-core peak in TFLOP/s for a GPU known by its CUDA device name, or 0 when the
// name is not known (then the user passes --peak-tflops). SXM parts; PCIe/NVL parts run lower clocks.
static inline double gpu_peak_bf16_tflops(const char* device_name) {
    if (strstr(device_name, "H100") || strstr(device_name, "H200")) {
        if (strstr(device_name, "PCIe")) return 756.0;
        if (strstr(device_name, "NVL")) return 835.0;
        return 989.4;
    }
    if (strstr(device_name, "A100")) return 312.0;
    return 0.0;
}

#endif  // GPT_CONFIG_H
