// gelu.cuh: GELU, tanh approximation, elementwise over n values (the MLP's (B, T, 4C) activation).
//
//   forward   out (n)  = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))),  x = inp           bf16
//   backward  dinp (n) = dout · gelu'(inp)                                               bf16
//             gelu'(x) = 0.5·(1 + th) + 0.5·x·(1 − th²)·√(2/π)·(1 + 3·0.044715·x²),  th as above
// Math in fp32 (accurate tanhf), one rounding to bf16 per output. The backward WRITES dinp (does not
// accumulate) and may run in place (dinp == dout); the forward may run in place (out == inp).
// Any n; 16-byte vectors of 8 values when every pointer is 16-byte aligned, scalar otherwise.
// The trainer may instead fuse GELU into the matmul (cuBLASLt epilogue); these kernels are the
// fallback and the version checked against the CPU reference.
#ifndef GELU_CUH
#define GELU_CUH

#include "layers/model/layer_common.cuh"

#define GELU_THREADS 256
#define GELU_SCALING_FACTOR 0.7978845608028654f  // √(2/π)

static __device__ __forceinline__ float gelu_f32(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
}

static __device__ __forceinline__ float gelu_grad_f32(float x) {
    float cube = 0.044715f * x * x * x;
    float th = tanhf(GELU_SCALING_FACTOR * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

// One thread per 8 values (the last thread of a ragged n takes the remainder one by one).
// vector: all pointers 16-byte aligned.
static __global__ void __launch_bounds__(GELU_THREADS)
    gelu_forward_kernel(__nv_bfloat16* out, const __nv_bfloat16* inp, size_t n, int vector) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (vector && i0 + 8 <= n) {
        float f[8];
        bf16x8_unpack(f, load16_stream(inp + i0));
#pragma unroll
        for (int k = 0; k < 8; k++) f[k] = gelu_f32(f[k]);
        store16(out + i0, bf16x8_pack(f));
    } else {
        for (size_t i = i0; i < n && i < i0 + 8; i++) out[i] = __float2bfloat16(gelu_f32(__bfloat162float(inp[i])));
    }
}

static __global__ void __launch_bounds__(GELU_THREADS)
    gelu_backward_kernel(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* inp, size_t n,
                         int vector) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (vector && i0 + 8 <= n) {
        float x[8], d[8];
        bf16x8_unpack(x, load16_stream(inp + i0));
        bf16x8_unpack(d, load16_stream(dout + i0));
#pragma unroll
        for (int k = 0; k < 8; k++) d[k] *= gelu_grad_f32(x[k]);
        store16(dinp + i0, bf16x8_pack(d));
    } else {
        for (size_t i = i0; i < n && i < i0 + 8; i++)
            dinp[i] = __float2bfloat16(__bfloat162float(dout[i]) * gelu_grad_f32(__bfloat162float(inp[i])));
    }
}

// out (n) = gelu(inp (n)).
static void gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    int vector = layer_is_aligned16(out) && layer_is_aligned16(inp);
    unsigned grid = (unsigned)layer_ceil_div(layer_ceil_div(n, 8), GELU_THREADS);
    gelu_forward_kernel<<<grid, GELU_THREADS, 0, stream>>>(out, inp, n, vector);
    CUDA_CHECK(cudaGetLastError());
}

// dinp (n) = dout (n) · gelu'(inp (n)); WRITES dinp (no accumulation); dinp may be dout (in place).
static void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* inp, size_t n,
                          cudaStream_t stream) {
    if (n == 0) return;
    int vector = layer_is_aligned16(dinp) && layer_is_aligned16(dout) && layer_is_aligned16(inp);
    unsigned grid = (unsigned)layer_ceil_div(layer_ceil_div(n, 8), GELU_THREADS);
    gelu_backward_kernel<<<grid, GELU_THREADS, 0, stream>>>(dinp, dout, inp, n, vector);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // GELU_CUH
