// fp8_cast.cuh: bf16 → FP8 casts with a per-tensor scale, the operands of the FP8 GEMMs
// (matmul_fp8.cuh), and the amax their scales are made from (fp8_scaling.cuh).
//
//   stored byte = fp8(x · scale)   x bf16, scale fp32 (a device scalar), the product in fp32, then
//                                  rounded to nearest even into E4M3 or E5M2, saturating: beyond the
//                                  format's largest finite value (and ±inf) gives ±max, NaN stays NaN
//   value of a byte = decode(byte) · scale_inv, scale_inv = 1 / scale (what the GEMMs are given)
//   amax (fp32, device) = max(amax, max |x|) over the input, before scaling: the casts accumulate
//                         into it (atomicMax on the bits of a non-negative float), so it must start
//                         at +0 or at an earlier amax; any NaN in the input makes it NaN (the bit
//                         pattern of |NaN| is above every number's), so a bad tensor is not hidden.
//
// Formats (fp8_format_max): E4M3 (4 exponent bits, 3 mantissa bits, max 448, no infinities) for
// weights and activations, E5M2 (5, 2, max 57344, four more binades at half the precision) for
// gradients, whose range is wider.
//
// Tensors (row-major):
//   fp8_cast            inp (N, C) bf16 → out (N, C) FP8
//   fp8_cast_transpose  inp (N, C) bf16 → out (N, C) FP8 and/or out_t (C, N) FP8, one read of inp.
//                       cuBLASLt's FP8 GEMMs on Hopper take only operands whose reduction dimension
//                       is contiguous ("TN"), so the backward GEMMs need x, dy and W transposed
//                       (matmul_fp8.cuh says which); this writes both layouts in one pass.
//   fp8_cast_transpose_op  the same from x = op(inp) (Fp8CastArgs: a copy, GELU, dGELU, or a
//                       LayerNorm's output from its input and row statistics), computed in fp32 and
//                       never written in bf16; optionally also the count of values that saturated
//                       and the column sums of x per 64-row tile (a bias gradient), in the same
//                       pass; with no output, the amax alone (current scaling's first pass).
//   fp8_amax            amax of inp (N, C) alone: current scaling needs it before the cast.
// Sizes: N ≥ 1, C a positive multiple of 16: 16 bf16 (two 16-byte loads) become one 16-byte
// store of FP8, and the FP8 GEMMs need their leading dimensions to be multiples of 16 bytes
// anyway. out_t's rows are N bytes apart; any N works here, but as a GEMM operand (the weight
// gradient's reduction runs over N) N must be a multiple of 16 too. Pointers 16-byte aligned.
//
// The casts are also correct (by software conversion) on GPUs without FP8 hardware (sm_80); only
// the GEMMs need sm_89 or newer.
#ifndef FP8_CAST_CUH
#define FP8_CAST_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "layers/cuda_common.h"
#include "layers/model/gelu.cuh"
#include "layers/model/layer_common.cuh"

typedef enum {
    FP8_E4M3 = 0,  // weights and activations
    FP8_E5M2 = 1,  // gradients
} Fp8Format;

static __host__ __device__ inline float fp8_format_max(Fp8Format f) { return f == FP8_E5M2 ? 57344.0f : 448.0f; }
static inline const char* fp8_format_name(Fp8Format f) { return f == FP8_E5M2 ? "e5m2" : "e4m3"; }

#define FP8_CAST_THREADS 256
#define FP8_CT_ROWS 64      // cast-transpose tile: 64 rows × 128 channels
#define FP8_CT_COLS 128
#define FP8_CT_THREADS 128  // phase 1: 4 chunks of 16 channels each; phase 2: one 16 × 4 block each
#define FP8_CT_WORDS (FP8_CT_COLS / 4 + 1)  // the tile's row in 4-byte words; the extra word keeps both
                                            // phases free of shared-memory bank conflicts

// ---- device: conversion and amax -------------------------------------------------------------------

// Four floats → four FP8 bytes in memory order (x.x of each pair is the low byte).
template <int FMT>
static __device__ __forceinline__ uint32_t fp8x4_from_floats(float a, float b, float c, float d) {
    const __nv_fp8_interpretation_t kind = FMT == FP8_E5M2 ? __NV_E5M2 : __NV_E4M3;
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kind);
    return lo | hi << 16;
}

// 16 floats times s → 16 FP8 bytes.
template <int FMT>
static __device__ __forceinline__ uint4 fp8x16_from_floats(const float* f, float s) {
    uint4 v;
    v.x = fp8x4_from_floats<FMT>(f[0] * s, f[1] * s, f[2] * s, f[3] * s);
    v.y = fp8x4_from_floats<FMT>(f[4] * s, f[5] * s, f[6] * s, f[7] * s);
    v.z = fp8x4_from_floats<FMT>(f[8] * s, f[9] * s, f[10] * s, f[11] * s);
    v.w = fp8x4_from_floats<FMT>(f[12] * s, f[13] * s, f[14] * s, f[15] * s);
    return v;
}

// 16 bf16 (two 16-byte vectors, memory order) times s → 16 FP8 bytes.
template <int FMT>
static __device__ __forceinline__ uint4 fp8x16_from_bf16(uint4 lo, uint4 hi, float s) {
    float f[16];
    bf16x8_unpack(f, lo);
    bf16x8_unpack(f + 8, hi);
    return fp8x16_from_floats<FMT>(f, s);
}

// The largest |x| of 8 bf16, as the bits of a bf16 (sign cleared): integer order of non-negative
// bf16 bits is their numeric order, with NaN above +inf.
static __device__ __forceinline__ uint32_t bf16x8_absmax_bits(uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) m = max(m, max(w[k] & 0x7FFFu, (w[k] >> 16) & 0x7FFFu));
    return m;
}

// The bits of |x| as a float: for non-negative floats (and +0 to start from) unsigned order is
// numeric order, with NaN above +inf.
static __device__ __forceinline__ uint32_t fp8_abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// amax = max(amax, the block's largest bits) with one atomic per block; bits: a float's, as from
// fp8_abs_bits (a bf16's bits << 16 are its float's). Contains __syncthreads: every thread of the
// block must call it.
static __device__ void fp8_block_amax(float* amax, uint32_t bits) {
    __shared__ uint32_t warp_max[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    bits = __reduce_max_sync(0xFFFFFFFFu, bits);
    if (lane == 0) warp_max[warp] = bits;
    __syncthreads();
    if (warp == 0) {
        bits = lane < num_warps ? warp_max[lane] : 0u;
        bits = __reduce_max_sync(0xFFFFFFFFu, bits);
        if (lane == 0 && bits != 0u) atomicMax((unsigned int*)amax, bits);
    }
}

// *count += the block's values of n (one atomic per warp).
static __device__ __forceinline__ void fp8_warp_count(unsigned long long* count, uint32_t n) {
    n = __reduce_add_sync(0xFFFFFFFFu, n);
    if (threadIdx.x % 32 == 0 && n != 0u) atomicAdd(count, (unsigned long long)n);
}

// ---- kernels -----------------------------------------------------------------------------------------

// out (N·C bytes) = fp8(inp · *scale), 16 elements per thread and step; amax (may be NULL) as above.
template <int FMT>
static __global__ void __launch_bounds__(FP8_CAST_THREADS)
    fp8_cast_kernel(uint8_t* __restrict__ out, const __nv_bfloat16* __restrict__ inp, size_t chunks,
                    const float* scale, float* amax) {
    const float s = *scale;
    uint32_t m = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 lo = load16(inp + 16 * i), hi = load16(inp + 16 * i + 8);
        m = max(m, max(bf16x8_absmax_bits(lo), bf16x8_absmax_bits(hi)));
        store16(out + 16 * i, fp8x16_from_bf16<FMT>(lo, hi, s));
    }
    if (amax) fp8_block_amax(amax, m << 16);
}

// amax only (inp's N·C elements as 16-element chunks).
static __global__ void __launch_bounds__(FP8_CAST_THREADS)
    fp8_amax_kernel(float* amax, const __nv_bfloat16* inp, size_t chunks) {
    uint32_t m = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += (size_t)gridDim.x * blockDim.x)
        m = max(m, max(bf16x8_absmax_bits(load16(inp + 16 * i)), bf16x8_absmax_bits(load16(inp + 16 * i + 8))));
    fp8_block_amax(amax, m << 16);
}

// 4 × 4 bytes: rows a, b, c, d (byte j of each = column j) → the word of column j (rows in byte order).
static __device__ __forceinline__ void fp8_transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                                        uint32_t col[4]) {
    const uint32_t ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1 | a2 b2 a3 b3
    const uint32_t cd01 = __byte_perm(c, d, 0x5140), cd23 = __byte_perm(c, d, 0x7362);
    col[0] = __byte_perm(ab01, cd01, 0x5410);  // a0 b0 c0 d0
    col[1] = __byte_perm(ab01, cd01, 0x7632);
    col[2] = __byte_perm(ab23, cd23, 0x5410);
    col[3] = __byte_perm(ab23, cd23, 0x7632);
}

// Phase 2 of a tile: warp w takes the tile's rows 16w..16w+15, lane l its channels 4l..4l+3, and
// writes those 4 channels' 16 rows into out_t (C, N): one 16-byte store each when all 16 rows
// exist and N keeps them 16-byte aligned, byte by byte otherwise (the last rows, odd N).
static __device__ __forceinline__ void fp8_ct_store_transposed(uint8_t* out_t, const uint32_t (*tile)[FP8_CT_WORDS],
                                                               int r0, int c0, int N, int C) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = r0 + 16 * warp, col = c0 + 4 * lane;
    if (row >= N || col >= C) return;
    uint32_t cols[4][4];  // [channel j][word k]: rows 4k..4k+3 of channel col + j
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t c4[4];
        fp8_transpose4x4(tile[16 * warp + 4 * k][lane], tile[16 * warp + 4 * k + 1][lane],
                         tile[16 * warp + 4 * k + 2][lane], tile[16 * warp + 4 * k + 3][lane], c4);
#pragma unroll
        for (int j = 0; j < 4; j++) cols[j][k] = c4[j];
    }
    const int rows = min(16, N - row);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint8_t* dst = out_t + (size_t)(col + j) * N + row;
        if (rows == 16 && N % 16 == 0) {
            store16(dst, make_uint4(cols[j][0], cols[j][1], cols[j][2], cols[j][3]));
        } else {
            for (int i = 0; i < rows; i++) dst[i] = (uint8_t)(cols[j][i / 4] >> (8 * (i % 4)));
        }
    }
}

// What a cast-transpose computes from its input before scaling, and what it writes (see the top).
typedef enum {
    FP8_OP_COPY = 0,   // x = inp
    FP8_OP_GELU = 1,   // x = GELU(inp): the MLP's activation from its pre-activation, for the projection
    FP8_OP_DGELU = 2,  // x = inp · GELU'(aux): the pre-activation's gradient, inp = d(GELU output), aux = input
    FP8_OP_LAYERNORM = 3,  // x = (inp − mean)·rstd·ln_weight + ln_bias: a LayerNorm's output from its input
                           // and row statistics (layernorm_forward with out = NULL), never written in bf16
} Fp8CastOp;

typedef struct {
    uint8_t* out;                   // (N, C) FP8, or NULL
    uint8_t* out_t;                 // (C, N) FP8, or NULL; both NULL: amax (and column sums) only
    const __nv_bfloat16* inp;       // (N, C)
    const __nv_bfloat16* aux;       // (N, C): FP8_OP_DGELU's GELU input; NULL otherwise
    const float *mean, *rstd;       // (N): FP8_OP_LAYERNORM's row statistics; NULL otherwise
    const __nv_bfloat16 *ln_weight, *ln_bias;  // (C): FP8_OP_LAYERNORM's; NULL otherwise
    int N, C;
    Fp8Format format;
    Fp8CastOp op;
    const float* scale;             // device fp32; may be NULL when nothing is written
    float* amax;                    // NULL, or max(amax, max |x|)
    unsigned long long* saturated;  // NULL, or += the values with |x · scale| above the format's max
    float* colsum_partial;          // NULL, or (fp8_colsum_tiles(N), C) fp32: Σ x over each tile's 64 rows
} Fp8CastArgs;

// Tiles of rows a cast-transpose's column sums come in (the rows of its colsum_partial).
static inline int fp8_colsum_tiles(int N) { return (N + FP8_CT_ROWS - 1) / FP8_CT_ROWS; }

// x (16 floats) of the chunk at (row, col): the op applied to inp (and aux).
template <int OP>
static __device__ __forceinline__ void fp8_cast_load(float* x, const Fp8CastArgs& a, int row, int col) {
    const size_t at = (size_t)row * a.C + col;
    bf16x8_unpack(x, load16(a.inp + at));
    bf16x8_unpack(x + 8, load16(a.inp + at + 8));
    if (OP == FP8_OP_GELU) {
#pragma unroll
        for (int k = 0; k < 16; k++) x[k] = gelu_f32(x[k]);
    }
    if (OP == FP8_OP_LAYERNORM) {
        float w[16], b[16];
        bf16x8_unpack(w, load16(a.ln_weight + col));
        bf16x8_unpack(w + 8, load16(a.ln_weight + col + 8));
        bf16x8_unpack(b, load16(a.ln_bias + col));
        bf16x8_unpack(b + 8, load16(a.ln_bias + col + 8));
        const float m = a.mean[row], r = a.rstd[row];
#pragma unroll
        for (int k = 0; k < 16; k++) x[k] = (x[k] - m) * r * w[k] + b[k];
    }
    if (OP == FP8_OP_DGELU) {
        float pre[16];
        bf16x8_unpack(pre, load16(a.aux + at));
        bf16x8_unpack(pre + 8, load16(a.aux + at + 8));
#pragma unroll
        for (int k = 0; k < 16; k++) x[k] *= gelu_grad_f32(pre[k]);
    }
}

// The tile's column sums: every thread holds the sums of its 16 channels (group g = threadIdx % 8)
// over its rows; lanes of one group are 8 apart in a warp, the 4 warps meet in shared memory, and
// thread c writes channel c0 + c's sum for rows r0..r0+63. Contains __syncthreads.
static __device__ __forceinline__ void fp8_ct_colsums(float* partial, float (*red)[FP8_CT_COLS], float* sums,
                                                      int r0, int c0, int C) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        sums[k] += __shfl_xor_sync(0xFFFFFFFFu, sums[k], 8);
        sums[k] += __shfl_xor_sync(0xFFFFFFFFu, sums[k], 16);
    }
    if (lane < 8) {
#pragma unroll
        for (int k = 0; k < 16; k++) red[warp][16 * lane + k] = sums[k];
    }
    __syncthreads();
    const int c = threadIdx.x;  // FP8_CT_THREADS == FP8_CT_COLS
    if (c0 + c < C) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < FP8_CT_THREADS / 32; w++) s += red[w][c];
        partial[(size_t)(r0 / FP8_CT_ROWS) * C + c0 + c] = s;
    }
#pragma unroll
    for (int k = 0; k < 16; k++) sums[k] = 0.0f;
}

// out (N, C) and out_t (C, N) (either or both may be NULL) = fp8(x · *scale), x the op of inp
// (N, C); tiles of 64 × 128 taken in turn by a grid that fills the GPU. Phase 1 computes the tile's
// x (row-major, 16 channels a thread), writes out and keeps the bytes in shared memory; phase 2
// writes them transposed (and the column sums when asked for).
template <int FMT, int OP>
static __global__ void __launch_bounds__(FP8_CT_THREADS) fp8_cast_transpose_kernel(const Fp8CastArgs a) {
    __shared__ uint32_t tile[FP8_CT_ROWS][FP8_CT_WORDS];
    __shared__ float red[FP8_CT_THREADS / 32][FP8_CT_COLS];
    const int N = a.N, C = a.C, writes = a.out || a.out_t;
    const float s = a.scale ? *a.scale : 1.0f, fmax = fp8_format_max((Fp8Format)FMT);
    const int tiles_c = (C + FP8_CT_COLS - 1) / FP8_CT_COLS;
    const int tiles = ((N + FP8_CT_ROWS - 1) / FP8_CT_ROWS) * tiles_c;
    uint32_t m = 0, saturated = 0;
    float sums[16];
#pragma unroll
    for (int k = 0; k < 16; k++) sums[k] = 0.0f;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int r0 = (t / tiles_c) * FP8_CT_ROWS, c0 = (t % tiles_c) * FP8_CT_COLS;
#pragma unroll
        for (int it = 0; it < FP8_CT_ROWS * FP8_CT_COLS / 16 / FP8_CT_THREADS; it++) {
            const int q = threadIdx.x + it * FP8_CT_THREADS;  // a warp: 4 rows × 8 chunks of 16 channels
            const int r = q / (FP8_CT_COLS / 16), g = q % (FP8_CT_COLS / 16);
            const int row = r0 + r, col = c0 + 16 * g;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (row < N && col < C) {  // C % 16 == 0: a chunk is wholly inside or outside
                float x[16];
                fp8_cast_load<OP>(x, a, row, col);
#pragma unroll
                for (int k = 0; k < 16; k++) {
                    m = max(m, fp8_abs_bits(x[k]));
                    saturated += fabsf(x[k]) * s > fmax;
                    sums[k] += x[k];
                }
                if (writes) v = fp8x16_from_floats<FMT>(x, s);
                if (a.out) store16(a.out + (size_t)row * C + col, v);
            }
            tile[r][4 * g] = v.x, tile[r][4 * g + 1] = v.y, tile[r][4 * g + 2] = v.z, tile[r][4 * g + 3] = v.w;
        }
        __syncthreads();
        if (a.out_t) fp8_ct_store_transposed(a.out_t, tile, r0, c0, N, C);
        if (a.colsum_partial) fp8_ct_colsums(a.colsum_partial, red, sums, r0, c0, C);
        __syncthreads();  // the next tile overwrites the shared tile
    }
    if (a.saturated) fp8_warp_count(a.saturated, saturated);
    if (a.amax) fp8_block_amax(a.amax, m);
}

// ---- host --------------------------------------------------------------------------------------------

// 0 when inp (N, C) can be cast; otherwise -1 and a message in why saying what to change.
static inline int fp8_check_cast(int N, int C, char* why, size_t why_size) {
    if (N < 1) {
        snprintf(why, why_size, "N = %d rows; it must be at least 1", N);
        return -1;
    }
    if (C < 16 || C % 16 != 0) {
        snprintf(why, why_size,
                 "C = %d channels is not a positive multiple of 16; FP8 GEMM operands need leading dimensions of a "
                 "multiple of 16 bytes (16 FP8 values): choose hidden sizes that are multiples of 16, or use bf16",
                 C);
        return -1;
    }
    return 0;
}

static inline void fp8_require_cast(const char* fn, int N, int C, const void* inp, const void* out,
                                    const void* out_t) {
    char why[320];
    if (fp8_check_cast(N, C, why, sizeof(why)) != 0) layer_fail("%s: %s", fn, why);
    LAYER_REQUIRE(inp && layer_is_aligned16(inp), "%s: inp must be a 16-byte aligned device pointer", fn);
    LAYER_REQUIRE(!out || layer_is_aligned16(out), "%s: out must be 16-byte aligned", fn);
    LAYER_REQUIRE(!out_t || layer_is_aligned16(out_t), "%s: out_t must be 16-byte aligned", fn);
}

// As fp8_require_cast, and the scale a cast reads.
static inline void fp8_require_scaled_cast(const char* fn, int N, int C, const void* inp, const void* out,
                                           const void* out_t, const float* scale) {
    fp8_require_cast(fn, N, C, inp, out, out_t);
    LAYER_REQUIRE(scale != NULL, "%s: scale must be a device pointer to the fp32 scale", fn);
}

// Blocks for `blocks` blocks' worth of work: at most as many as the GPU holds at once (the kernels
// loop over the rest), so that no second, partial wave of blocks trails the first.
static inline int fp8_cast_grid(const void* kernel, int threads, size_t blocks) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    const size_t most = (size_t)layer_num_sms() * (size_t)(per_sm > 0 ? per_sm : 1);
    return (int)(blocks < most ? (blocks > 0 ? blocks : 1) : most);
}

// out (N, C) = fp8(inp (N, C) · *scale) in format fmt; amax (NULL: not wanted) as at the top.
static inline void fp8_cast(uint8_t* out, const __nv_bfloat16* inp, int N, int C, Fp8Format fmt, const float* scale,
                            float* amax, cudaStream_t stream) {
    fp8_require_scaled_cast("fp8_cast", N, C, inp, out, NULL, scale);
    LAYER_REQUIRE(out != NULL, "fp8_cast: out is NULL");
    const size_t chunks = (size_t)N * C / 16, blocks = layer_ceil_div(chunks, FP8_CAST_THREADS);
    if (fmt == FP8_E5M2) {
        const int grid = fp8_cast_grid((const void*)fp8_cast_kernel<FP8_E5M2>, FP8_CAST_THREADS, blocks);
        fp8_cast_kernel<FP8_E5M2><<<grid, FP8_CAST_THREADS, 0, stream>>>(out, inp, chunks, scale, amax);
    } else {
        const int grid = fp8_cast_grid((const void*)fp8_cast_kernel<FP8_E4M3>, FP8_CAST_THREADS, blocks);
        fp8_cast_kernel<FP8_E4M3><<<grid, FP8_CAST_THREADS, 0, stream>>>(out, inp, chunks, scale, amax);
    }
    CUDA_CHECK(cudaGetLastError());
}

template <int FMT, int OP>
static inline void fp8_cast_transpose_launch(const Fp8CastArgs* a, cudaStream_t stream) {
    const size_t tiles = layer_ceil_div((size_t)a->N, FP8_CT_ROWS) * layer_ceil_div((size_t)a->C, FP8_CT_COLS);
    const int grid = fp8_cast_grid((const void*)fp8_cast_transpose_kernel<FMT, OP>, FP8_CT_THREADS, tiles);
    fp8_cast_transpose_kernel<FMT, OP><<<grid, FP8_CT_THREADS, 0, stream>>>(*a);
}

template <int FMT>
static inline void fp8_cast_transpose_launch_op(const Fp8CastArgs* a, cudaStream_t stream) {
    switch (a->op) {
        case FP8_OP_GELU: fp8_cast_transpose_launch<FMT, FP8_OP_GELU>(a, stream); break;
        case FP8_OP_DGELU: fp8_cast_transpose_launch<FMT, FP8_OP_DGELU>(a, stream); break;
        case FP8_OP_LAYERNORM: fp8_cast_transpose_launch<FMT, FP8_OP_LAYERNORM>(a, stream); break;
        default: fp8_cast_transpose_launch<FMT, FP8_OP_COPY>(a, stream); break;
    }
}

// The cast-transpose a describes (Fp8CastArgs): out and out_t (either or both NULL), amax, the
// saturated count and the column sums, each where asked for.
static inline void fp8_cast_transpose_op(const Fp8CastArgs* a, cudaStream_t stream) {
    const char* fn = "fp8_cast_transpose_op";
    const int writes = a->out || a->out_t;
    if (writes || a->saturated) fp8_require_scaled_cast(fn, a->N, a->C, a->inp, a->out, a->out_t, a->scale);
    else fp8_require_cast(fn, a->N, a->C, a->inp, a->out, a->out_t);
    LAYER_REQUIRE(writes || a->amax || a->colsum_partial, "%s: asks for nothing (no output, amax or column sums)", fn);
    LAYER_REQUIRE(a->op != FP8_OP_DGELU || (a->aux && layer_is_aligned16(a->aux)),
                  "%s: FP8_OP_DGELU needs aux, the GELU input, 16-byte aligned", fn);
    LAYER_REQUIRE(a->op != FP8_OP_LAYERNORM || (a->mean && a->rstd && a->ln_weight && a->ln_bias &&
                                                layer_is_aligned16(a->ln_weight) && layer_is_aligned16(a->ln_bias)),
                  "%s: FP8_OP_LAYERNORM needs mean, rstd and the 16-byte aligned weight and bias", fn);
    if (a->format == FP8_E5M2) fp8_cast_transpose_launch_op<FP8_E5M2>(a, stream);
    else fp8_cast_transpose_launch_op<FP8_E4M3>(a, stream);
    CUDA_CHECK(cudaGetLastError());
}

// out (N, C) and out_t (C, N) (either may be NULL, not both) = fp8(inp (N, C) · *scale); amax as at the top.
static inline void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* inp, int N, int C,
                                      Fp8Format fmt, const float* scale, float* amax, cudaStream_t stream) {
    LAYER_REQUIRE(out || out_t, "fp8_cast_transpose: out and out_t are both NULL");
    Fp8CastArgs a;
    memset(&a, 0, sizeof(a));
    a.out = out, a.out_t = out_t, a.inp = inp, a.N = N, a.C = C, a.format = fmt, a.op = FP8_OP_COPY;
    a.scale = scale, a.amax = amax;
    fp8_cast_transpose_op(&a, stream);
}

// *amax = max(*amax, max |inp (N, C)|) (start it at +0 for the amax of inp alone).
static inline void fp8_amax(float* amax, const __nv_bfloat16* inp, int N, int C, cudaStream_t stream) {
    LAYER_REQUIRE(amax != NULL, "fp8_amax: amax must be a device pointer to an fp32 value");
    fp8_require_cast("fp8_amax", N, C, inp, NULL, NULL);
    const size_t chunks = (size_t)N * C / 16;
    const int grid = fp8_cast_grid((const void*)fp8_amax_kernel, FP8_CAST_THREADS, layer_ceil_div(chunks, FP8_CAST_THREADS));
    fp8_amax_kernel<<<grid, FP8_CAST_THREADS, 0, stream>>>(amax, inp, chunks);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // FP8_CAST_CUH
