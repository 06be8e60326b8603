// cpu_gpt.h: the whole GPT on the CPU in fp64, forward and backward, built from the layers of
// cpu_reference.h with the parameter layout of data/gpt_config.h. It is the oracle the GPU
// model is compared with, on the same weights.
#ifndef CPU_GPT_H
#define CPU_GPT_H

#include <stddef.h>

#include "data/gpt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    GPTConfig config;
    int B, T;  // the batch the activations are sized for

    // Parameters and their gradients: one array each, cut into the 16 tensors of gpt_config.h.
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t num_params;
    double* params;
    double* grads;
    double* param_tensors[NUM_PARAM_TENSORS];  // pointers into params
    double* grad_tensors[NUM_PARAM_TENSORS];   // pointers into grads

    // Activations saved by the forward for the backward. L = layers, C = channels, Vp = padded vocab.
    double* encoded;    // (B, T, C)      token + position embedding
    double* ln1;        // (L, B, T, C)
    double* ln1_mean;   // (L, B, T)
    double* ln1_rstd;   // (L, B, T)
    double* qkv;        // (L, B, T, 3, NH, HD)
    double* atty;       // (L, B, T, NH, HD)
    double* att_lse;    // (L, B, NH, T)
    double* residual2;  // (L, B, T, C)   after the attention branch
    double* ln2;        // (L, B, T, C)
    double* ln2_mean;   // (L, B, T)
    double* ln2_rstd;   // (L, B, T)
    double* fch;        // (L, B, T, 4C)  before GELU
    double* fch_gelu;   // (L, B, T, 4C)
    double* residual3;  // (L, B, T, C)   after the MLP branch: the layer's output
    double* lnf;        // (B, T, C)
    double* lnf_mean;   // (B, T)
    double* lnf_rstd;   // (B, T)
    double* logits;     // (B, T, Vp)
    double* losses;     // (B, T)
} CpuGPT;

// Allocates parameters, gradients and activations for batches of (B, T), T <= config.max_seq_len.
// Parameters are left zero: the caller fills them. Returns 0, or -1 when out of memory.
int cpu_gpt_create(CpuGPT* model, GPTConfig config, int B, int T);
void cpu_gpt_destroy(CpuGPT* model);

// Runs the forward on inputs (B, T) and returns the mean cross-entropy against targets (B, T).
double cpu_gpt_forward(CpuGPT* model, const int* inputs, const int* targets);

// Sets model->grads to the gradient of the mean loss of the last forward (which must have been
// run on these same inputs and targets). Returns 0, or -1 when out of memory for its scratch.
int cpu_gpt_backward(CpuGPT* model, const int* inputs, const int* targets);

// The whole model in one call, for callers outside C (the numpy and PyTorch checks, through
// ctypes). config = {L, C, NH, V, Vp, maxT, NKV}; params in gpt_config.h's layout; inputs, targets
// (B, T). Writes logits (B, T, Vp) and, when grads is not NULL, the gradient of the mean loss
// (same layout as params). Returns the mean loss, or NaN when out of memory, T > maxT or NKV does
// not divide NH.
double cpu_gpt_forward_backward(const int config[7], int B, int T, const double* params, const int* inputs,
                                const int* targets, double* logits, double* grads);

// targets (B, T) = the model's most likely next token at each position: the argmax over the first V
// logits of the forward on inputs (config, params as cpu_gpt_forward_backward). With them the mean
// loss lies clearly below ln V, the loss of all-zero logits, so a test can tell the two apart.
// Returns 0, or -1 as cpu_gpt_forward_backward fails.
int cpu_gpt_likely_targets(const int config[7], int B, int T, const double* params, const int* inputs, int* targets);

#ifdef __cplusplus
}
#endif

#endif  // CPU_GPT_H
