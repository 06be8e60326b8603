// global_norm.cuh: the L2 norm of a flat bf16 array (the whole gradient) for global-norm clipping,
// left on the GPU (no host synchronization), and the clip factor derived from it.
//
//   global_norm          out[0] = √(Σ_i x_i²)      x (n) bf16, n up to billions (size_t)
//   global_norm_squared  out[0] =   Σ_i x_i²       (for sharded gradients: all-reduce, then √)
//   global_norm_clip_scale  scale[0] = min(1, max_norm / (norm[0] + 1e-6))   (PyTorch's clip_grad_norm_)
// Deterministic two-stage reduction in fp32: stage 1, a grid fixed by (n, the GPU's SM count), each
// thread strides over 16-byte vectors summing squares, each block sums its threads in a fixed
// order into one fp32 partial in scratch; stage 2, one block sums the partials in a fixed order.
// Bit-identical run to run on one GPU. Scratch: global_norm_scratch_bytes() bytes (fp32 partials),
// may hold anything on entry.
#ifndef GLOBAL_NORM_CUH
#define GLOBAL_NORM_CUH

#include "layers/model/layer_common.cuh"

#define GLOBAL_NORM_THREADS 256
#define GLOBAL_NORM_BLOCKS_PER_SM 8
#define GLOBAL_NORM_MAX_BLOCKS 4096  // partials in scratch (also caps the stage-1 grid)
#define GLOBAL_NORM_FINAL_THREADS 1024

static size_t global_norm_scratch_bytes(void) { return GLOBAL_NORM_MAX_BLOCKS * sizeof(float); }

// partials[blockIdx.x] = this block's Σ x². vector: x 16-byte aligned.
static __global__ void __launch_bounds__(GLOBAL_NORM_THREADS)
    global_norm_partials_kernel(float* __restrict__ partials, const __nv_bfloat16* __restrict__ x, size_t n,
                                int vector) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    size_t scalar_from = 0;
    if (vector) {
        const size_t vecs = n / 8;
#pragma unroll 4
        for (size_t i = tid; i < vecs; i += stride) {
            float f[8];
            bf16x8_unpack(f, load16_stream(x + i * 8));
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) s += f[k] * f[k];
            acc += s;
        }
        scalar_from = vecs * 8;
    }
    for (size_t i = scalar_from + tid; i < n; i += stride) {
        float f = __bfloat162float(x[i]);
        acc += f * f;
    }
    acc = layer_block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = Σ partials (or its square root); one block.
static __global__ void __launch_bounds__(GLOBAL_NORM_FINAL_THREADS)
    global_norm_final_kernel(float* __restrict__ out, const float* __restrict__ partials, int num_partials,
                             int take_sqrt) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) acc += partials[i];
    acc = layer_block_sum(acc);
    if (threadIdx.x == 0) out[0] = take_sqrt ? sqrtf(acc) : acc;
}

static void global_norm_launch(float* out, float* scratch, const __nv_bfloat16* x, size_t n, int take_sqrt,
                               cudaStream_t stream) {
    LAYER_REQUIRE(scratch != NULL && ((uintptr_t)scratch & 3u) == 0,
                  "global_norm: scratch must be a 4-byte aligned buffer of global_norm_scratch_bytes() bytes");
    size_t blocks = layer_ceil_div(n, 8 * (size_t)GLOBAL_NORM_THREADS);
    size_t max_blocks = (size_t)layer_num_sms() * GLOBAL_NORM_BLOCKS_PER_SM;
    if (max_blocks > GLOBAL_NORM_MAX_BLOCKS) max_blocks = GLOBAL_NORM_MAX_BLOCKS;
    if (blocks > max_blocks) blocks = max_blocks;
    if (blocks < 1) blocks = 1;
    global_norm_partials_kernel<<<(unsigned)blocks, GLOBAL_NORM_THREADS, 0, stream>>>(scratch, x, n,
                                                                                      layer_is_aligned16(x));
    CUDA_CHECK(cudaGetLastError());
    global_norm_final_kernel<<<1, GLOBAL_NORM_FINAL_THREADS, 0, stream>>>(out, scratch, (int)blocks, take_sqrt);
    CUDA_CHECK(cudaGetLastError());
}

// out[0] (device fp32) = ‖x (n)‖₂. scratch: global_norm_scratch_bytes() bytes.
static void global_norm(float* out, float* scratch, const __nv_bfloat16* x, size_t n, cudaStream_t stream) {
    global_norm_launch(out, scratch, x, n, 1, stream);
}

// out[0] (device fp32) = Σ x² over x (n). scratch: global_norm_scratch_bytes() bytes.
static void global_norm_squared(float* out, float* scratch, const __nv_bfloat16* x, size_t n, cudaStream_t stream) {
    global_norm_launch(out, scratch, x, n, 0, stream);
}

static __global__ void global_norm_clip_scale_kernel(float* scale, const float* norm, float max_norm) {
    float c = max_norm / (norm[0] + 1e-6f);
    scale[0] = c < 1.0f ? c : 1.0f;
}

// scale[0] = min(1, max_norm / (norm[0] + 1e-6)), both device fp32 scalars: the grad_scale_device
// of adamw_update for global-norm clipping.
static void global_norm_clip_scale(float* scale, const float* norm, float max_norm, cudaStream_t stream) {
    global_norm_clip_scale_kernel<<<1, 1, 0, stream>>>(scale, norm, max_norm);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // GLOBAL_NORM_CUH
