// cpu_reference.h: the CPU oracle for every GPU layer: forward and backward of each layer
// of the GPT, in plain C.
//
// Everything is fp64. One code path then serves as the higher-precision reference for the
// bf16/fp32 GPU kernels and as the function that finite differences check in fp64.
//
// Conventions
// - Row-major, shapes in comments as (B, T, C). N = B·T rows where a layer is row-wise.
// - Forward functions overwrite their outputs.
// - Backward functions ADD into every gradient they produce (dinp, dweight, ...), so residual
//   branches and the tied embedding accumulate naturally; callers zero gradients first.
// - Attention follows the trainer's interface: q, k, v packed as qkv (B, T, NH + 2·NKV, HD) (NKV
//   key/value heads; (B, T, 3, NH, HD) for multi-head), output (B, T, NH, HD), per-row log-sum-exp
//   lse (B, NH, T) of the scaled scores.
#ifndef CPU_REFERENCE_H
#define CPU_REFERENCE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// out (B, T, C) = wte[tokens[b, t]] + wpe[t]. tokens (B, T), wte (V, C), wpe (>=T, C).
void ref_encoder_forward(double* out, const int* tokens, const double* wte, const double* wpe, int B, int T, int C);
void ref_encoder_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, int B, int T, int C);

// out (N, C) = (inp - mean) · rstd · weight + bias per row; mean, rstd (N) saved for backward.
void ref_layernorm_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                           const double* bias, int N, int C);
void ref_layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                            const double* weight, const double* mean, const double* rstd, int N, int C);

// out (N, OC) = inp (N, IC) · weightᵀ + bias; weight (OC, IC), bias (OC) or NULL.
void ref_matmul_forward(double* out, const double* inp, const double* weight, const double* bias, int N, int IC,
                        int OC);
// dbias may be NULL (no bias).
void ref_matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                         const double* weight, int N, int IC, int OC);

// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), elementwise over n.
void ref_gelu_forward(double* out, const double* inp, size_t n);
void ref_gelu_backward(double* dinp, const double* dout, const double* inp, size_t n);

// Standard attention, materializing S = QKᵀ/√HD and P = softmax(S) row by row, with NKV key/value
// heads (NH % NKV == 0; query head h reads K/V head h / (NH / NKV); NKV = NH: multi-head).
// qkv (B, T, NH + 2·NKV, HD): per token the NH query heads, then NKV key heads, then NKV value heads
// ((B, T, 3, NH, HD) when NKV = NH). out (B, T, NH, HD), lse (B, NH, T). causal: key j > query i is masked.
void ref_attention_forward(double* out, double* lse, const double* qkv, int B, int T, int NH, int NKV, int HD,
                           int causal);
// dqkv (B, T, NH + 2·NKV, HD) += gradient of q, k and v given dout (B, T, NH, HD), using the saved
// out and lse (P is recomputed from them, as the flash backward does); dK and dV of a K/V head sum
// over its NH / NKV query heads.
void ref_attention_backward(double* dqkv, const double* dout, const double* qkv, const double* out,
                            const double* lse, int B, int T, int NH, int NKV, int HD, int causal);

// Softmax cross-entropy over the first V of Vp logits per row (columns V..Vp-1 are vocab padding,
// ignored). logits (N, Vp), targets (N) in [0, V). Writes losses (N); returns their mean.
double ref_crossentropy_forward(double* losses, const double* logits, const int* targets, int N, int V, int Vp);
// dlogits (N, Vp) += dloss · (softmax − onehot(target)), 0 in padding columns. dloss is the
// gradient of the total with respect to each row's loss (1/N for the mean).
void ref_crossentropy_backward(double* dlogits, const double* logits, const int* targets, double dloss, int N,
                               int V, int Vp);

// One AdamW step (decoupled weight decay, bias-corrected moments), step counting from 1:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   p −= lr · ( m/(1−β1^step) / (√(v/(1−β2^step)) + eps) + weight_decay·p )
void ref_adamw_step(double* params, const double* grads, double* m, double* v, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step);

#ifdef __cplusplus
}
#endif

#endif  // CPU_REFERENCE_H
