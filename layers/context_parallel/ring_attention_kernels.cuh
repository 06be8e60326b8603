// ring_attention_kernels.cuh: the small kernels around the ring attention's flash2 calls
// (layers/context_parallel/ring_attention.cuh): moving rows between the model's local layout and the
// ring's chunk-major one, the fp32 merge of partial outputs by their LSE, and fp32 accumulation.
//
// Layouts (C = T / (2N) tokens per chunk, a = a rank's local chunk, 0 early or 1 late):
//   local        (B, 2C, W): row (b, a·C + t) at local + (b·2C + a·C + t)·local_stride, the model's own
//                layout (strided rows inside a packed activation, for instance);
//   chunk-major  (2, B, C, W): row (a, b, t) at chunked + ((a·B + b)·C + t)·chunk_stride, so that one
//                chunk of every batch row is a plain (B, C, W) tensor, which attention.h's interface can
//                take as a sequence of C tokens (its rows must be b·T + t).
// A local LSE (B, NH, 2C) is the same with B·NH rows of one float: (2, B·NH, C) chunk-major.
#ifndef RING_ATTENTION_KERNELS_CUH
#define RING_ATTENTION_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "layers/cuda_common.h"

#define RING_THREADS 256

static inline unsigned ring_grid(size_t units) {
    const size_t blocks = (units + RING_THREADS - 1) / RING_THREADS;
    return (unsigned)(blocks < 8192 ? (blocks ? blocks : 1) : 8192);  // the kernels stride over the rest
}

// The local row of chunk-major row r = (a·B + b)·C + t.
static __device__ __forceinline__ size_t ring_local_row(size_t r, int B, int C) {
    const size_t t = r % (size_t)C, b = (r / (size_t)C) % (size_t)B, a = r / ((size_t)C * (size_t)B);
    return (b * 2 + a) * (size_t)C + t;
}

// Copies rows of `width` units of U between the layouts (above): to_chunks 1: local -> chunk-major.
template <typename U>
static __global__ void ring_rows_kernel(U* chunked, long chunk_stride, U* local, long local_stride, int width, int B,
                                        int C, int to_chunks) {
    const size_t n = (size_t)2 * B * C * width;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)width, u = i % (size_t)width;
        U* c = chunked + r * (size_t)chunk_stride + u;
        U* l = local + ring_local_row(r, B, C) * (size_t)local_stride + u;
        if (to_chunks) *c = *l;
        else *l = *c;
    }
}

// bf16 rows (B, 2C, width) of the local layout into the chunk-major one; strides in elements.
// 16-byte units when every row start is 16-byte aligned (head dims are multiples of 8), else 2-byte.
static void ring_load_rows(__nv_bfloat16* chunked, long chunk_stride, const __nv_bfloat16* local, long local_stride,
                           int width, int B, int C, cudaStream_t stream) {
    const int vec = width % 8 == 0 && chunk_stride % 8 == 0 && local_stride % 8 == 0 &&
                    (uintptr_t)chunked % 16 == 0 && (uintptr_t)local % 16 == 0;
    if (vec) {
        ring_rows_kernel<uint4><<<ring_grid((size_t)2 * B * C * width / 8), RING_THREADS, 0, stream>>>(
            (uint4*)chunked, chunk_stride / 8, (uint4*)local, local_stride / 8, width / 8, B, C, 1);
    } else {
        ring_rows_kernel<unsigned short><<<ring_grid((size_t)2 * B * C * width), RING_THREADS, 0, stream>>>(
            (unsigned short*)chunked, chunk_stride, (unsigned short*)local, local_stride, width, B, C, 1);
    }
    CUDA_CHECK(cudaGetLastError());
}

// An LSE (B, NH, 2C) local <-> (2, B·NH, C) chunk-major; to_chunks 1: local -> chunk-major (the local
// one is written only with to_chunks 0).
static void ring_lse_rows(float* chunked, float* local, int B, int NH, int C, int to_chunks, cudaStream_t stream) {
    ring_rows_kernel<float><<<ring_grid((size_t)2 * B * NH * C), RING_THREADS, 0, stream>>>(chunked, 1, local, 1, 1,
                                                                                           B * NH, C, to_chunks);
    CUDA_CHECK(cudaGetLastError());
}

// local bf16 rows (B, 2C, width) at local_stride = the fp32 chunk-major rows, rounded once.
static __global__ void ring_store_kernel(__nv_bfloat16* local, long local_stride, const float* chunked,
                                         long chunk_stride, int width, int B, int C) {
    const size_t n = (size_t)2 * B * C * width;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)width, u = i % (size_t)width;
        local[ring_local_row(r, B, C) * (size_t)local_stride + u] = __float2bfloat16(chunked[r * (size_t)chunk_stride + u]);
    }
}

static void ring_store(__nv_bfloat16* local, long local_stride, const float* chunked, long chunk_stride, int width,
                       int B, int C, cudaStream_t stream) {
    ring_store_kernel<<<ring_grid((size_t)2 * B * C * width), RING_THREADS, 0, stream>>>(local, local_stride, chunked,
                                                                                         chunk_stride, width, B, C);
    CUDA_CHECK(cudaGetLastError());
}

// Folds one block's partial result into a chunk's running fp32 output and LSE, one warp per row
// (b, t, h) of the chunk: with L the LSE so far and L_s the block's,
//   L' = log(exp(L) + exp(L_s)),  O' = exp(L − L') O + exp(L_s − L') O_s.
// Over the blocks this is out = Σ_s exp(L_s − lse) O_s with lse = log Σ_s exp(L_s): each O_s is
// normalized over its own keys, and exp(L_s − lse) is the share of the row's softmax mass those keys
// hold. Computed around the larger of L and L_s (no overflow); L = −inf (nothing yet) gives weight 0.
// Every block merged has at least one visible key per row (full, or diagonal: the row's own key), so
// L_s is finite. acc_o, part_o (B, C, NH, HD); acc_lse, part_lse (B, NH, C).
static __global__ void ring_merge_kernel(float* acc_o, float* acc_lse, const float* part_o,
                                         const float* part_lse, int B, int C, int NH, int HD) {
    const size_t rows = (size_t)B * C * NH;
    const int lane = threadIdx.x % 32;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
        const size_t h = r % NH, t = (r / NH) % C, b = r / ((size_t)NH * C);
        const size_t l = (b * NH + h) * C + t;
        const float la = acc_lse[l], ls = part_lse[l];
        const float m = fmaxf(la, ls);
        const float lnew = m + logf(expf(la - m) + expf(ls - m));
        const float wa = expf(la - lnew), ws = expf(ls - lnew);
        for (int d = lane; d < HD; d += 32) {
            float* o = acc_o + r * HD + d;
            *o = wa * *o + ws * part_o[r * HD + d];
        }
        __syncwarp();  // every lane has read acc_lse[l] before lane 0 replaces it
        if (lane == 0) acc_lse[l] = lnew;
    }
}

static void ring_merge(float* acc_o, float* acc_lse, const float* part_o, const float* part_lse, int B, int C,
                       int NH, int HD, cudaStream_t stream) {
    ring_merge_kernel<<<ring_grid((size_t)B * C * NH * 32), RING_THREADS, 0, stream>>>(acc_o, acc_lse, part_o,
                                                                                      part_lse, B, C, NH, HD);
    CUDA_CHECK(cudaGetLastError());
}

// acc[i] = part[i] + (add ? acc[i] : 0) (fp32 from bf16), n elements; 8 a thread per iteration where
// n and the pointers allow (16-byte loads: these passes are pure memory traffic).
static __global__ void ring_add_bf16_kernel(float* acc, const __nv_bfloat16* part, size_t n, int add) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] = __bfloat162float(part[i]) + (add ? acc[i] : 0.0f);
}

static __global__ void ring_add_bf16x8_kernel(float4* acc, const uint4* part, size_t n8, int add) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 raw = part[i];
        const __nv_bfloat162* h = (const __nv_bfloat162*)&raw;
        const float2 p0 = __bfloat1622float2(h[0]), p1 = __bfloat1622float2(h[1]);
        const float2 p2 = __bfloat1622float2(h[2]), p3 = __bfloat1622float2(h[3]);
        float4 lo = make_float4(p0.x, p0.y, p1.x, p1.y), hi = make_float4(p2.x, p2.y, p3.x, p3.y);
        if (add) {
            const float4 a = acc[2 * i], b = acc[2 * i + 1];
            lo.x += a.x, lo.y += a.y, lo.z += a.z, lo.w += a.w;
            hi.x += b.x, hi.y += b.y, hi.z += b.z, hi.w += b.w;
        }
        acc[2 * i] = lo, acc[2 * i + 1] = hi;
    }
}

static void ring_add_bf16(float* acc, const __nv_bfloat16* part, size_t n, int add, cudaStream_t stream) {
    if (n % 8 == 0 && (uintptr_t)acc % 16 == 0 && (uintptr_t)part % 16 == 0)
        ring_add_bf16x8_kernel<<<ring_grid(n / 8), RING_THREADS, 0, stream>>>((float4*)acc, (const uint4*)part, n / 8,
                                                                             add);
    else
        ring_add_bf16_kernel<<<ring_grid(n), RING_THREADS, 0, stream>>>(acc, part, n, add);
    CUDA_CHECK(cudaGetLastError());
}

// dst[i] = a[i] + (add ? dst[i] : 0), n fp32 elements (4 a thread per iteration where n allows).
static __global__ void ring_sum_f32_kernel(float* dst, const float* a, size_t n, int add) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = add ? dst[i] + a[i] : a[i];
}

static __global__ void ring_sum_f32x4_kernel(float4* dst, const float4* a, size_t n4, int add) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = a[i];
        if (add) {
            const float4 d = dst[i];
            v.x += d.x, v.y += d.y, v.z += d.z, v.w += d.w;
        }
        dst[i] = v;
    }
}

static void ring_sum_f32(float* dst, const float* a, size_t n, int add, cudaStream_t stream) {
    if (n % 4 == 0 && (uintptr_t)dst % 16 == 0 && (uintptr_t)a % 16 == 0)
        ring_sum_f32x4_kernel<<<ring_grid(n / 4), RING_THREADS, 0, stream>>>((float4*)dst, (const float4*)a, n / 4,
                                                                            add);
    else
        ring_sum_f32_kernel<<<ring_grid(n), RING_THREADS, 0, stream>>>(dst, a, n, add);
    CUDA_CHECK(cudaGetLastError());
}

static __global__ void ring_fill_f32_kernel(float* x, size_t n, float value) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

static void ring_fill_f32(float* x, size_t n, float value, cudaStream_t stream) {
    ring_fill_f32_kernel<<<ring_grid(n), RING_THREADS, 0, stream>>>(x, n, value);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // RING_ATTENTION_KERNELS_CUH
