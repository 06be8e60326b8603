// decode.h: attention for decoding (generation): a few new query tokens per sequence against
// a KV cache, split along the cache across thread blocks (FlashAttention-2 paper, section 3.2).
//
// Per sequence b of length L = lengths[b] (keys 0..L-1 are in the cache, the Tq new tokens included:
// they sit at positions L-Tq .. L-1), query token t (position L-Tq+t) and query head h, with
// G = NH / NKV query heads sharing K/V head kvh = h / G (GQA; G = 1 is multi-head, NKV = 1 multi-query):
//   S[j] = q[b, t, h] · K[b, j, kvh] / √HD        for keys j ≤ L-Tq+t (causal among the new tokens)
//   out[b, t, h] = Σ_j softmax(S)[j] V[b, j, kvh],   lse[b, h, t] = log Σ_j exp(S[j])   (natural log)
//
// Layouts (bf16 unless noted; strides count elements):
//   q        (B, Tq, NH, HD)      row (b, t) at q + (b·Tq + t)·q_stride (q_stride ≥ NH·HD, e.g. the
//                                 packed QKV activation's row)
//   k_cache  (B, Tmax, NKV, HD)   contiguous; entries at positions ≥ lengths[b] are never read
//   v_cache  (B, Tmax, NKV, HD)   contiguous
//   lengths  int32 (B), on the GPU: 1 ≤ Tq ≤ lengths[b] ≤ max_length ≤ Tmax (max_length 0: not known on
//            the host, lengths[b] ≤ Tmax)
//   out      (B, Tq, NH, HD)      row (b, t) at out + (b·Tq + t)·out_stride
//   lse      fp32 (B, NH, Tq), or NULL when not wanted
//
// How it runs: one thread block per (split, K/V head, batch) loads the cache in tiles of 64 keys
// (cp.async, a 3-stage ring) once for all G·Tq query rows of its K/V head (tensor cores, the rows
// padded to 16), its 4 warps taking different keys of each tile; the warps' partial softmax states are
// merged in shared memory. With one split the block writes out and lse; with several, each split
// writes its normalized partial output and LSE (fp32) to the workspace and a combine kernel rescales
// and sums them: out = Σ_s exp(lse_s − lse) · out_s, lse = log Σ_s exp(lse_s).
// Each sequence's keys are shared out over the splits by its own length, read on the GPU: the host's
// max_length only picks the number of splits. With max_length = 0 (the lengths live only on the GPU,
// e.g. a decode step captured once in a CUDA graph and replayed at every length) the splits are
// picked for the capacity Tmax; splits past a sequence's keys return an empty partial (LSE −∞) that
// the combine skips, so the same launch is right for every lengths[b] ≤ Tmax.
// Both kernels are programmatic dependent launches on sm_90+ (attention/common/dependent_launch.cuh):
// each may start while the stream's previous kernel ends, and waits for it before reading anything.
#ifndef FLASH2_DECODE_H
#define FLASH2_DECODE_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#define DECODE_MAX_QUERY_TOKENS 16
#define DECODE_MAX_SPLITS 256
#define DECODE_KEY_BLOCK 64  // keys per tile; a split covers a whole number of tiles

typedef struct {
    int B, Tq, NH, NKV, HD;  // batch, new query tokens per sequence, query heads, K/V heads, head dim
    int Tmax;                // cache capacity (positions)
} DecodeShape;

typedef struct {
    DecodeShape shape;
    const __nv_bfloat16* q;  // (B, Tq, NH, HD), rows at q_stride
    long q_stride;
    const __nv_bfloat16 *k_cache, *v_cache;  // (B, Tmax, NKV, HD)
    const int* lengths;                      // (B) on the GPU
    int max_length;                          // ≥ every lengths[b], known on the host; 0: unknown (≤ Tmax)
    __nv_bfloat16* out;                      // (B, Tq, NH, HD), rows at out_stride
    long out_stride;
    float* lse;        // (B, NH, Tq) or NULL
    int num_splits;    // 0: decode_num_splits picks it; else 1..DECODE_MAX_SPLITS
    void* workspace;   // decode_workspace_bytes(shape, splits) bytes (NULL when that is 0)
} DecodeArgs;

#ifdef __cplusplus
extern "C" {
#endif

// 0 when the shape (with max_length, 0 = not known on the host, and num_splits, 0 = automatic) can
// run; otherwise -1 and a message in `why` that says what to change.
int decode_check(const DecodeShape* shape, int max_length, int num_splits, char* why, size_t why_size);

// decode_check, and the arguments: strides of at least NH·HD and pointers and strides aligned to
// 16 bytes (8 elements), a workspace when the splits are more than one.
int decode_check_args(const DecodeArgs* args, char* why, size_t why_size);

// The number of splits for a launch of `blocks` thread blocks per split (batch × K/V heads × row
// groups), caches of up to max_length keys and `concurrent_blocks` blocks resident on the whole GPU
// at once (SMs × blocks per SM): the fewest splits whose blocks fill the GPU's waves nearly as well
// (95%) as any count does; one when the blocks already fill their waves. At most one split per tile of
// DECODE_KEY_BLOCK keys and DECODE_MAX_SPLITS.
int decode_splits_for(long blocks, int max_length, long concurrent_blocks);

// The splits decode_attention runs with for num_splits = 0 on the current GPU.
int decode_num_splits(const DecodeShape* shape, int max_length);

// The length the automatic split count is planned for: args->max_length, or Tmax when it is 0.
int decode_planned_length(const DecodeArgs* args);

// Bytes of workspace for `num_splits` splits (0 for one split): partial outputs and LSEs, fp32.
size_t decode_workspace_bytes(const DecodeShape* shape, int num_splits);

// Appends Tn new tokens' K and V to the cache (kv_cache.cu): rows (b, t) of k_new and v_new, each
// NKV·HD bf16 at k_new + (b·Tn + t)·src_stride (e.g. slices of the packed QKV activation), go to
// positions start[b] + t of k_cache and v_cache (B, Tmax, NKV, HD). start (B, int32, on the GPU) is
// each sequence's length before the append; positions ≥ Tmax are not written (the caller keeps
// start[b] + Tn ≤ Tmax). Prefill appends the prompt's T tokens, each decode step its Tq tokens.
void decode_cache_append(const __nv_bfloat16* k_new, const __nv_bfloat16* v_new, long src_stride, int B, int Tn,
                         int NKV, int HD, const int* start, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                         int Tmax, cudaStream_t stream);

// Enqueues the decode attention on `stream`. args must have passed decode_check_args; with
// num_splits = 0 the workspace must hold decode_workspace_bytes(shape, decode_num_splits(...)).
// CUDA errors exit with a message (attention/common/cuda_check.h).
void decode_attention(const DecodeArgs* args, cudaStream_t stream);
#ifdef KERNEL_TRACE
// Builds with -DKERNEL_TRACE: the decode kernels record their blocks into `buffer` (a KernelTraceBuffer,
// attention/common/kernel_trace.cuh; NULL: they stop), in stream order.
cudaError_t decode_attention_trace_arm(void* buffer, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif

#endif  // FLASH2_DECODE_H
