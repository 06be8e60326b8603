// flash2_rowsum.cuh: D = rowsum(dO ∘ O) per query row, as the first pass of both flash2 backwards
// computes it (flash2_backward_kernel.cuh's preprocess kernel, flash2_backward_hopper.cuh's prepare
// kernel): a group of lanes per row, each lane a dot product of 8 bf16 values, summed by shuffles.
#ifndef FLASH2_ROWSUM_CUH
#define FLASH2_ROWSUM_CUH

#include <cuda_bf16.h>

// Lanes per row: a power of two ≥ the row's HD / 8 chunks.
template <int HD>
__host__ __device__ constexpr int preprocess_lanes_per_row() { return HD / 8 <= 8 ? 8 : 16; }

// Σ a[i]·b[i] over 8 bf16 values each, in fp32 (a lane's share of a row of dO ∘ O).
__device__ __forceinline__ float dot_bf16x8(uint4 a, uint4 b) {
    const __nv_bfloat162 *a2 = (const __nv_bfloat162*)&a, *b2 = (const __nv_bfloat162*)&b;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 af = __bfloat1622float2(a2[i]), bf = __bfloat1622float2(b2[i]);
        dot += af.x * bf.x + af.y * bf.y;
    }
    return dot;
}

#endif  // FLASH2_ROWSUM_CUH
