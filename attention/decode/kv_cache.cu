// kv_cache.cu: appends new tokens' K and V rows to the decoding KV cache (decode.h).
//
//   k_new, v_new  bf16 rows (b, t) of NKV·HD values at ptr + (b·Tn + t)·src_stride
//   start         int32 (B) on the GPU: the position of sequence b's first new token
//   k_cache, v_cache  bf16 (B, Tmax, NKV, HD); row (b, start[b] + t) receives row (b, t)
// One block per (b, t), 16-byte copies (NKV·HD is a multiple of 8; rows are 16-byte aligned).
#include "attention/common/cuda_check.h"
#include "attention/decode.h"

__global__ void decode_cache_append_kernel(const __nv_bfloat16* k_new, const __nv_bfloat16* v_new, long src_stride,
                                           int Tn, int row_elems, const int* start, __nv_bfloat16* k_cache,
                                           __nv_bfloat16* v_cache, int Tmax) {
    const int b = blockIdx.x / Tn, t = blockIdx.x % Tn;
    const int pos = start[b] + t;
    if (pos < 0 || pos >= Tmax) return;
    const long src = (long)blockIdx.x * src_stride, dst = ((long)b * Tmax + pos) * row_elems;
    for (int c = threadIdx.x; c < row_elems / 8; c += blockDim.x) {
        *(uint4*)(k_cache + dst + 8 * c) = *(const uint4*)(k_new + src + 8 * c);
        *(uint4*)(v_cache + dst + 8 * c) = *(const uint4*)(v_new + src + 8 * c);
    }
}

extern "C" void decode_cache_append(const __nv_bfloat16* k_new, const __nv_bfloat16* v_new, long src_stride, int B,
                                    int Tn, int NKV, int HD, const int* start, __nv_bfloat16* k_cache,
                                    __nv_bfloat16* v_cache, int Tmax, cudaStream_t stream) {
    if (B < 1 || Tn < 1) return;
    const int row_elems = NKV * HD;
    const int threads = row_elems / 8 < 256 ? (row_elems / 8 + 31) / 32 * 32 : 256;
    decode_cache_append_kernel<<<B * Tn, threads, 0, stream>>>(k_new, v_new, src_stride, Tn, row_elems, start, k_cache,
                                                               v_cache, Tmax);
    ATTN_CUDA_CHECK(cudaGetLastError());
}
