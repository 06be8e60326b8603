// layer_common.cuh: device helpers shared by the non-GEMM layers (encoder, layernorm, gelu,
// classifier, adamw, global_norm): 16-byte vector loads and stores of 8 bf16, their conversion to
// and from fp32, deterministic warp and block sums, argument checks that exit with a clear
// message, and the SM count launchers size their grids with.
//
// Vectors: 8 bf16 travel as one uint4 (16 bytes): element k of the vector is the low (k even) or
// high (k odd) half of word k / 2, i.e. memory order. bf16 → fp32 is exact (a shift); fp32 → bf16
// rounds to nearest even (__floats2bfloat162_rn), the same rounding as __float2bfloat16.
//
// Determinism: every reduction here combines values in an order fixed by thread indices alone
// (xor-butterfly shuffles give every lane the same bits, since a + b == b + a exactly), so a kernel
// with a fixed grid gives bit-identical results run to run.
#ifndef LAYER_COMMON_CUH
#define LAYER_COMMON_CUH

#include <cuda_bf16.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_common.h"

// ---- host: argument checks and device facts ------------------------------------------------------

// Prints "error: <message>" and exits: for arguments no kernel can run with (a bug in the caller
// or a model shape the layers do not support).
static void layer_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(EXIT_FAILURE);
}
#define LAYER_REQUIRE(cond, ...)              \
    do {                                      \
        if (!(cond)) layer_fail(__VA_ARGS__); \
    } while (0)

static inline int layer_is_aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

// The index of name in names[0..count), or -1: a flag's value by its name.
static inline int layer_name_index(const char* name, const char* const* names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

// Streaming multiprocessors of the current device (grids are sized to fill them).
static int layer_num_sms(void) {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

static inline size_t layer_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static inline size_t layer_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---- device: 8 bf16 in 16 bytes --------------------------------------------------------------------

static __device__ __forceinline__ uint4 load16(const void* p) { return *(const uint4*)p; }
// Read once, evict first (inputs no later kernel needs from L2).
static __device__ __forceinline__ uint4 load16_stream(const void* p) { return __ldcs((const uint4*)p); }
static __device__ __forceinline__ void store16(void* p, uint4 v) { *(uint4*)p = v; }
static __device__ __forceinline__ void store16_stream(void* p, uint4 v) { __stcs((uint4*)p, v); }

static __device__ __forceinline__ void bf16x8_unpack(float f[8], uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(w[k] << 16);
        f[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
}

static __device__ __forceinline__ uint32_t bf16x2_pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    uint32_t u;
    memcpy(&u, &h, sizeof(u));
    return u;
}

static __device__ __forceinline__ uint4 bf16x8_pack(const float f[8]) {
    uint4 v;
    v.x = bf16x2_pack(f[0], f[1]);
    v.y = bf16x2_pack(f[2], f[3]);
    v.z = bf16x2_pack(f[4], f[5]);
    v.w = bf16x2_pack(f[6], f[7]);
    return v;
}

// 8 fp32 as two 16-byte accesses, streaming (read or written once per kernel).
static __device__ __forceinline__ void f32x8_load_stream(float f[8], const float* p) {
    float4 a = __ldcs((const float4*)p), b = __ldcs((const float4*)p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
static __device__ __forceinline__ void f32x8_store_stream(float* p, const float f[8]) {
    __stcs((float4*)p, make_float4(f[0], f[1], f[2], f[3]));
    __stcs((float4*)p + 1, make_float4(f[4], f[5], f[6], f[7]));
}

// ---- device: deterministic sums --------------------------------------------------------------------

// Every lane gets the same sum of the warp's 32 values (bit-identical across lanes).
static __device__ __forceinline__ float layer_warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
    return x;
}

// Every thread gets the block's sum (blockDim.x a multiple of 32, at most 1024). Warp sums are
// added in warp order. Contains __syncthreads: every thread of the block must call it.
static __device__ float layer_block_sum(float x) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    x = layer_warp_sum(x);
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < num_warps ? warp_sums[lane] : 0.0f;
    x = layer_warp_sum(x);
    __syncthreads();  // warp_sums may be rewritten by the next call
    return x;
}

#endif  // LAYER_COMMON_CUH
