// attention.h: the one interface every attention backend sits behind (naive, flash1, flash2).
//
// Computes causal or full softmax attention with softmax scale 1/√HD, per batch b and head h:
//   S = Q Kᵀ / √HD  (T, T),  P = softmax(S) row-wise (keys j > query i masked when causal),
//   O = P V (T, HD),         LSE[i] = log Σ_j exp(S[i, j])  (natural log, fp32).
// Backward, given dO: dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = dS K / √HD,
// dK = dSᵀ Q / √HD.
//
// Grouped-query attention: NKV key/value heads (NH a multiple of NKV); query head h reads K/V head
// h / (NH / NKV), so the NH / NKV query heads of a group share one K and V (NKV = NH: multi-head,
// NKV = 1: multi-query). The backward's dK and dV of a K/V head sum over its group's query heads.
//
// Layout: row (b, t, h) of q is the HD contiguous bf16 values at q + (b·T + t)·qkv_stride + h·HD;
// row (b, t, g) of k and v (g < NKV) the same at kv_stride. With the packed activation qkv
// (B, T, NH + 2·NKV, HD): q = qkv, k = qkv + NH·HD, v = qkv + (NH + NKV)·HD and both strides
// (NH + 2·NKV)·HD (for NKV = NH this is (B, T, 3, NH, HD)); with plain tensors q (B, T, NH, HD) at
// NH·HD and k, v (B, T, NKV, HD) at NKV·HD. kv_stride = 0 means kv_stride = qkv_stride. out and dout
// are (B, T, NH, HD) with stride out_stride; dq follows q's rule with stride dqkv_stride, dk and dv
// k's with dkv_stride (0: dqkv_stride), so the backward writes straight into the packed gradient
// dqkv (B, T, NH + 2·NKV, HD). lse is (B, NH, T).
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
    int B, T, NH, HD;  // batch, sequence length, query heads, head dim
    int causal;        // 1: key j > query i is masked
    int NKV;           // key/value heads: NH % NKV == 0 (NH: multi-head, 1: multi-query)
} AttentionShape;

typedef struct {
    AttentionShape shape;
    // forward inputs and outputs
    const __nv_bfloat16 *q, *k, *v;  // q (B, T, NH, HD) rows at qkv_stride; k, v (B, T, NKV, HD) at kv_stride
    long qkv_stride;
    long kv_stride;  // 0: the same as qkv_stride (the packed activation)
    __nv_bfloat16* out;  // (B, T, NH, HD) rows at stride out_stride
    long out_stride;
    float* lse;  // (B, NH, T)
    // forward, optional (NULL: not written): O in fp32 as well, (B, T, NH, HD) rows at stride out_stride,
    // the values `out` holds before their rounding to bf16 (bf16(out_f32) == out, bit for bit). For a
    // caller that merges partial outputs by their LSE (context parallelism), where rounding each
    // partial to bf16 first would cost one more rounding of the result. flash2 only: attention_forward
    // refuses it for the other backends (attention_writes_fp32_out).
    float* out_f32;
    // backward inputs (q, k, v, out and lse as the forward left them) and outputs
    const __nv_bfloat16* dout;  // (B, T, NH, HD) rows at stride out_stride
    __nv_bfloat16 *dq, *dk, *dv;  // dq as q at dqkv_stride; dk, dv as k, v at dkv_stride
    long dqkv_stride;
    long dkv_stride;  // 0: the same as dqkv_stride
    // memory the caller provides (sizes below): `saved` lives from a forward to its backward
    // (the naive backend keeps P there), `workspace` is scratch for the duration of one call, forward
    // or backward (flash2's causal forward on Hopper keeps its tile counter there; without one it
    // launches a block per tile instead).
    void* saved;
    void* workspace;
    // backward: 1 adds the contributions to dq in a fixed order, so that reruns are bit-identical
    // (flash2 on Hopper; naive and flash1 are deterministic anyway, flash2 on mma.sync is not).
    int deterministic;
    // backward, optional (NULL: not computed): dq_colsum (NH·HD) bf16 = Σ over b and t of dq[b, t, :]
    // (the gradient of a bias added to q), summed in fp32 in a fixed order from the bf16 dq written,
    // plus dq_colsum's old values when dq_colsum_accumulate. Only where attention_sums_dq_columns
    // says so: flash2 on Hopper sums the tiles its dQ pass writes, saving a pass over dq.
    __nv_bfloat16* dq_colsum;
    int dq_colsum_accumulate;
} AttentionArgs;

typedef struct {
    cublasHandle_t cublas;  // the naive backend's GEMMs; may be NULL for the flash backends
} AttentionContext;

// flash2's switches, from the environment. The library reads them once, on the first call that needs
// them (the only environment it reads), and passes them to flash2:
//   FLASH2_MMA_SYNC=1 (any value but empty and "0")  flash2 runs its mma.sync kernels on Hopper too,
//       to test or time them there;
//   FLASH2_FORWARD_LONG_T=N (N > 0)  flash2's Hopper forward takes its long-sequence tile shape from
//       N keys on, for every head dim that has one (attention/flash2/flash2_tiles.h), so that tests
//       reach it at short lengths.
typedef struct {
    int mma_sync_forced;  // FLASH2_MMA_SYNC set (1) or not (0)
    int forward_long_t;   // FLASH2_FORWARD_LONG_T, 0 when unset (the tile shapes' own lengths)
} AttentionFlash2Settings;

// The row strides of k, v and of dk, dv (kv_stride and dkv_stride, or the q strides where those are 0).
static inline long attention_kv_stride(const AttentionArgs* a) { return a->kv_stride ? a->kv_stride : a->qkv_stride; }
static inline long attention_dkv_stride(const AttentionArgs* a) {
    return a->dkv_stride ? a->dkv_stride : a->dqkv_stride;
}

#ifdef __cplusplus
extern "C" {
#endif

// "naive", "flash1", "flash2"; NULL for an unknown value.
const char* attention_backend_name(AttentionBackend backend);
// Parses a backend name; returns 0 on success, -1 for an unknown name.
int attention_backend_from_name(const char* name, AttentionBackend* backend);
// 0 when `backend` can run `shape`; otherwise -1 and a message in `why` that says what to change.
int attention_check(AttentionBackend backend, const AttentionShape* shape, char* why, size_t why_size);
// 1 when `backend`'s forward can also write O in fp32 (AttentionArgs.out_f32): flash2.
int attention_writes_fp32_out(AttentionBackend backend);
// Bytes of `saved` and `workspace` a backend needs for `shape` (0 when none).
size_t attention_saved_bytes(AttentionBackend backend, const AttentionShape* shape);
// FLOPs of the matrix products one forward (backward = 0) or one backward (backward = 1) call of
// `backend` executes for `shape` (2 per multiply-add; softmax and masking not counted). The flash
// backends skip the masked half of causal attention and recompute S = Q Kᵀ in their backward; naive
// multiplies whole T x T matrices and keeps P (naive-recompute recomputes S). Used for the trainer's
// hardware TFLOP/s, which must not count work the kernels skip.
double attention_executed_flops(AttentionBackend backend, const AttentionShape* shape, int backward);
// 1 when the backend runs cuBLAS (AttentionContext.cublas must be a handle), else 0.
int attention_uses_cublas(AttentionBackend backend);
size_t attention_workspace_bytes(AttentionBackend backend, const AttentionShape* shape);
// 1 when the backend's backward can fill AttentionArgs.dq_colsum for `shape` on this GPU, else 0.
int attention_sums_dq_columns(AttentionBackend backend, const AttentionShape* shape);
// flash2's switches in effect (AttentionFlash2Settings above); asks no GPU.
AttentionFlash2Settings attention_flash2_settings(void);
// 1 when flash2 runs its Hopper (wgmma) kernels on the current GPU, whose backward can be
// deterministic (AttentionArgs.deterministic); 0 when it runs its mma.sync kernels. Asks the GPU on
// its first call.
int attention_flash2_uses_wgmma(void);
// Enqueue the forward or backward pass on `stream`. The shape must have passed attention_check.
// Errors from CUDA or cuBLAS exit with a message (attention/common/cuda_check.h).
void attention_forward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                       cudaStream_t stream);
void attention_backward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif  // ATTENTION_H
