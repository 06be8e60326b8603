// attention.h: the one interface every attention backend sits behind (naive, flash1, flash2).
//
// Computes causal or full softmax attention with softmax scale 1/√HD, per batch b and head h:
//   S = Q Kᵀ / √HD  (T, T),  P = softmax(S) row-wise (keys j > query i masked when causal),
//   O = P V (T, HD),         LSE[i] = log Σ_j exp(S[i, j])  (natural log, fp32).
// Backward, given dO: dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = dS K / √HD,
// dK = dSᵀ Q / √HD.
//
// Layout: row (b, t, h) of q, k and v is the HD contiguous bf16 values at ptr + (b·T + t)·stride + h·HD.
// With the packed activation qkv (B, T, 3, NH, HD): q = qkv, k = qkv + NH·HD, v = qkv + 2·NH·HD and
// stride = 3·NH·HD; with plain (B, T, NH, HD) tensors stride = NH·HD. out and dout are (B, T, NH, HD)
// with stride out_stride; dq, dk, dv follow the same rule as q, k, v with stride dqkv_stride, so the
// backward writes straight into the packed gradient dqkv (B, T, 3, NH, HD). lse is (B, NH, T).
// Backward overwrites dq, dk and dv (it does not accumulate).
#ifndef ATTENTION_H
#define ATTENTION_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// naive-recompute is naive attention that recomputes S and P in the backward instead of storing P
// (for sequences where P of every layer does not fit; attention_naive.cu).
typedef enum { ATTN_NAIVE = 0, ATTN_FLASH1 = 1, ATTN_FLASH2 = 2, ATTN_NAIVE_RECOMPUTE = 3 } AttentionBackend;
#define NUM_ATTENTION_BACKENDS 4

typedef struct {
    int B, T, NH, HD;  // batch, sequence length, heads, head dim
    int causal;        // 1: key j > query i is masked
} AttentionShape;

typedef struct {
    AttentionShape shape;
    // forward inputs and outputs
    const __nv_bfloat16 *q, *k, *v;  // (B, T, NH, HD) rows at stride qkv_stride
    long qkv_stride;
    __nv_bfloat16* out;  // (B, T, NH, HD) rows at stride out_stride
    long out_stride;
    float* lse;  // (B, NH, T)
    // backward inputs (q, k, v, out and lse as the forward left them) and outputs
    const __nv_bfloat16* dout;  // (B, T, NH, HD) rows at stride out_stride
    __nv_bfloat16 *dq, *dk, *dv;  // (B, T, NH, HD) rows at stride dqkv_stride
    long dqkv_stride;
    // memory the caller provides (sizes below): `saved` lives from a forward to its backward
    // (the naive backend keeps P there), `workspace` is scratch for the duration of one call, forward
    // or backward (flash2's causal forward on Hopper keeps its tile counter there; without one it
    // launches a block per tile instead).
    void* saved;
    void* workspace;
    // backward: 1 adds the contributions to dq in a fixed order, so that reruns are bit-identical
    // (flash2 on Hopper; naive and flash1 are deterministic anyway, flash2 on mma.sync is not).
    int deterministic;
} AttentionArgs;

typedef struct {
    cublasHandle_t cublas;  // the naive backend's GEMMs; may be NULL for the flash backends
} AttentionContext;

#ifdef __cplusplus
extern "C" {
#endif

// "naive", "flash1", "flash2"; NULL for an unknown value.
const char* attention_backend_name(AttentionBackend backend);
// Parses a backend name; returns 0 on success, -1 for an unknown name.
int attention_backend_from_name(const char* name, AttentionBackend* backend);
// 0 when `backend` can run `shape`; otherwise -1 and a message in `why` that says what to change.
int attention_check(AttentionBackend backend, const AttentionShape* shape, char* why, size_t why_size);
// Bytes of `saved` and `workspace` a backend needs for `shape` (0 when none).
size_t attention_saved_bytes(AttentionBackend backend, const AttentionShape* shape);
// 1 when the backend runs cuBLAS (AttentionContext.cublas must be a handle), else 0.
int attention_uses_cublas(AttentionBackend backend);
size_t attention_workspace_bytes(AttentionBackend backend, const AttentionShape* shape);
// Enqueue the forward or backward pass on `stream`. The shape must have passed attention_check.
// Errors from CUDA or cuBLAS exit with a message (layers/cuda_common.h).
void attention_forward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                       cudaStream_t stream);
void attention_backward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif  // ATTENTION_H
