// init_weights.cuh: seeded weight initialization on the GPU, counter-based so that any element can
// be drawn on its own (in parallel, or a shard at a time) and a run gives the same weights on any
// GPU count.
//
//   init_weights   master[j] = value_j (fp32), params[j] = bf16(value_j) for j in [0, n)
//                  value_j = constant            when std == 0
//                          = std · N(0, 1)_j     otherwise, N_j drawn from (seed, tensor, first + j)
// N(0, 1)_j: Box-Muller on two 24-bit uniforms, each the splitmix64 finalizer of a counter that
// mixes the seed, the tensor index and the element's index in its tensor. `first` is the index of
// master[0] in the whole tensor, so a shard [first, first + n) gets the same values as the full
// tensor would there. master (n) fp32, params (n) bf16; either may be NULL.
// On the GPU because drawing billions of normals one by one on the host took minutes at start-up
// (GPT3-2.7B: about two); here it takes milliseconds.
#ifndef INIT_WEIGHTS_CUH
#define INIT_WEIGHTS_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "layers/model/layer_common.cuh"

static __device__ __forceinline__ uint64_t init_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static __global__ void __launch_bounds__(256)
    init_weights_kernel(float* __restrict__ master, __nv_bfloat16* __restrict__ params, size_t n, size_t first,
                        float std, float constant, uint64_t key) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        float value = constant;
        if (std != 0.0f) {
            const uint64_t counter = key + 2 * (first + j) * 0x9E3779B97F4A7C15ull;
            // u1 in (0, 1] (log is finite), u2 in [0, 1)
            const float u1 = (float)((init_mix64(counter) >> 40) + 1) * (1.0f / 16777216.0f);
            const float u2 = (float)(init_mix64(counter + 0x9E3779B97F4A7C15ull) >> 40) * (1.0f / 16777216.0f);
            value = std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        }
        if (master) master[j] = value;
        if (params) params[j] = __float2bfloat16_rn(value);
    }
}

// See the top of the file. `tensor` tells tensors apart (the same seed gives each its own values).
static void init_weights(float* master, __nv_bfloat16* params, size_t n, size_t first, float std, float constant,
                         uint64_t seed, int tensor, cudaStream_t stream) {
    if (n == 0) return;
    const uint64_t key = (seed * 0x2545F4914F6CDD1Dull + 1) ^ ((uint64_t)(tensor + 1) << 48);
    size_t blocks = (n + 255) / 256;
    const size_t max_blocks = (size_t)layer_num_sms() * 8;
    if (blocks > max_blocks) blocks = max_blocks;
    init_weights_kernel<<<(unsigned)blocks, 256, 0, stream>>>(master, params, n, first, std, constant, key);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // INIT_WEIGHTS_CUH
