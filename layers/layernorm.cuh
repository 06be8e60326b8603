// layernorm.cuh: fused residual add + LayerNorm, forward and backward. N = B·T rows of C channels.
//
//   forward   residual (N, C) = inp1 + inp2                  bf16 (the sum rounded once)
//             mean, rstd (N)  = statistics of residual's rows fp32 (biased variance, eps 1e-5)
//             out (N, C)      = (residual − mean)·rstd·weight + bias      bf16
//             weight, bias (C) bf16. With inp2 = NULL the LayerNorm reads inp1 itself and residual_out
//             is not written (may be NULL): the first block's LN1 takes the embedding output directly.
//             The statistics are of the bf16-rounded residual, the tensor the backward is given.
//   backward  given dout (N, C), the LN input inp (N, C) (the saved residual), weight, mean, rstd:
//             dinp (N, C)    += rstd·(g − mean_c(g) − xhat·mean_c(g·xhat)),  g = dout·weight,
//                               xhat = (inp − mean)·rstd        (dinp: the residual stream's gradient)
//             dweight (C)    += Σ_rows dout·xhat
//             dbias (C)      += Σ_rows dout
//             all three ADDED into bf16 with one rounding each; math in fp32. Optionally also
//             dinp_sum (C)   += Σ_rows dinp (the new dinp, as rounded to bf16): the residual stream's
//                               gradient is the dout of the linear layer whose output was added into
//                               it, so this is that layer's bias gradient, made where dinp is
//                               written instead of in a second pass over it (cuBLASLt's BGRADB).
// C must be a multiple of 8 and at most LAYERNORM_MAX_C, pointers 16-byte aligned (checked).
//
// Kernels: one warp per row; each lane holds its 8-channel vectors (channels 8·(32·i + lane) ..
// +7) in registers, so a row is read from memory once. Forward: the mean, then the variance as the
// mean of squared deviations (two passes over registers, no E[x²] − mean² cancellation). Backward:
// each lane also adds its channels' dout·xhat and dout into per-warp fp32 accumulators in shared
// memory (a lane only ever touches its own channels there, so no atomics); the rows of a block are
// a fixed set, so at the end the block sums its warps' accumulators in warp order into one fp32
// partial row (2·C values, 3·C with dinp_sum) in scratch; a second kernel sums the partials in block
// order and adds them to dweight, dbias (and dinp_sum). The grid is fixed by (N, C, the GPU), so the
// backward is bit-identical run to run. Scratch: layernorm_backward_scratch_bytes(N, C) bytes (fp32,
// the block count times 3·C at most); it may hold anything on entry.
#ifndef LAYERNORM_CUH
#define LAYERNORM_CUH

#include "layer_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define LAYERNORM_MAX_C 8192
#define LN_FWD_THREADS 256           // 8 rows per block
#define LN_BWD_SMEM_BUDGET (64 * 1024)  // shared-memory accumulators per backward block, at most

// Vectors per lane the kernel instance holds: the smallest instantiated MAX_VPL >= ceil(C / 256).
static int layernorm_max_vpl(int C) {
    int vpl = (C + 255) / 256;
    if (vpl <= 2) return 2;
    if (vpl <= 4) return 4;
    if (vpl <= 6) return 6;
    if (vpl <= 8) return 8;
    if (vpl <= 10) return 10;
    if (vpl <= 12) return 12;
    if (vpl <= 16) return 16;
    return 32;
}

static void layernorm_check(const char* who, int N, int C) {
    LAYER_REQUIRE(N >= 1 && C >= 8 && C % 8 == 0 && C <= LAYERNORM_MAX_C,
                  "%s: N = %d, C = %d: need N >= 1 and C a multiple of 8 (hidden sizes are multiples of 64) "
                  "no larger than %d",
                  who, N, C, LAYERNORM_MAX_C);
}

// ---- forward -------------------------------------------------------------------------------------

template <int MAX_VPL>
static __global__ void __launch_bounds__(LN_FWD_THREADS)
    layernorm_forward_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             __nv_bfloat16* __restrict__ residual_out, const __nv_bfloat16* __restrict__ inp1,
                             const __nv_bfloat16* __restrict__ inp2, const __nv_bfloat16* __restrict__ weight,
                             const __nv_bfloat16* __restrict__ bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (LN_FWD_THREADS / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int vecs = C / 8;
    const size_t base = (size_t)row * C;
    uint4 x[MAX_VPL];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c < C) {
            x[i] = load16_stream(inp1 + base + c);
            if (inp2) {
                float a[8], b[8];
                bf16x8_unpack(a, x[i]);
                bf16x8_unpack(b, load16_stream(inp2 + base + c));
#pragma unroll
                for (int k = 0; k < 8; k++) a[k] += b[k];
                x[i] = bf16x8_pack(a);
                store16(residual_out + base + c, x[i]);
            }
            float f[8];
            bf16x8_unpack(f, x[i]);
#pragma unroll
            for (int k = 0; k < 8; k++) sum += f[k];
        }
    }
    const float m = layer_warp_sum(sum) / (float)C;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        if ((i * 32 + lane) < vecs) {
            float f[8];
            bf16x8_unpack(f, x[i]);
#pragma unroll
            for (int k = 0; k < 8; k++) sq += (f[k] - m) * (f[k] - m);
        }
    }
    const float s = rsqrtf(layer_warp_sum(sq) / (float)C + LAYERNORM_EPS);
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c < C) {
            float f[8], w[8], b[8];
            bf16x8_unpack(f, x[i]);
            bf16x8_unpack(w, load16(weight + c));
            bf16x8_unpack(b, load16(bias + c));
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] = (f[k] - m) * s * w[k] + b[k];
            store16(out + base + c, bf16x8_pack(f));
        }
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = s;
    }
}

// residual_out = inp1 + inp2 (when inp2 != NULL), out = LayerNorm(residual_out or inp1)·weight + bias,
// mean and rstd saved (either may be NULL, e.g. for inference). Shapes at the top of the file.
// residual_out and out must not alias inp1, inp2 or each other.
static void fused_residual_layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd,
                                             __nv_bfloat16* residual_out, const __nv_bfloat16* inp1,
                                             const __nv_bfloat16* inp2, const __nv_bfloat16* weight,
                                             const __nv_bfloat16* bias, int N, int C, cudaStream_t stream) {
    layernorm_check("layernorm_forward", N, C);
    LAYER_REQUIRE(layer_is_aligned16(out) && layer_is_aligned16(inp1) && layer_is_aligned16(weight) &&
                      layer_is_aligned16(bias) && layer_is_aligned16(inp2) && layer_is_aligned16(residual_out),
                  "layernorm_forward: out, inp1, inp2, residual_out, weight and bias must be 16-byte aligned");
    LAYER_REQUIRE(inp2 == NULL || residual_out != NULL, "layernorm_forward: inp2 given but residual_out is NULL");
    const unsigned grid = (unsigned)layer_ceil_div((size_t)N, LN_FWD_THREADS / 32);
    switch (layernorm_max_vpl(C)) {
#define LN_FWD_CASE(V)                                                                                         \
    case V:                                                                                                    \
        layernorm_forward_kernel<V>                                                                            \
            <<<grid, LN_FWD_THREADS, 0, stream>>>(out, mean, rstd, residual_out, inp1, inp2, weight, bias, N, C); \
        break;
        LN_FWD_CASE(2)
        LN_FWD_CASE(4)
        LN_FWD_CASE(6)
        LN_FWD_CASE(8)
        LN_FWD_CASE(10)
        LN_FWD_CASE(12)
        LN_FWD_CASE(16)
        LN_FWD_CASE(32)
#undef LN_FWD_CASE
    }
    CUDA_CHECK(cudaGetLastError());
}

// out (N, C) = LayerNorm(inp (N, C))·weight + bias, mean and rstd (N) saved.
static void layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* inp,
                              const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C,
                              cudaStream_t stream) {
    fused_residual_layernorm_forward(out, mean, rstd, NULL, inp, NULL, weight, bias, N, C, stream);
}

// ---- backward ------------------------------------------------------------------------------------

// Block of `warps` warps (blockDim.x = 32·warps); dynamic shared memory warps·SUMS·C floats. partials
// (gridDim.x, SUMS·C) fp32: row b holds block b's Σ dout·xhat (channels 0..C−1), Σ dout (C..2C−1)
// and, with SUMS = 3, Σ dinp (2C..3C−1).
template <int MAX_VPL, int SUMS>
static __global__ void __launch_bounds__(256)
    layernorm_backward_kernel(__nv_bfloat16* __restrict__ dinp, float* __restrict__ partials,
                              const __nv_bfloat16* __restrict__ dout, const __nv_bfloat16* __restrict__ inp,
                              const __nv_bfloat16* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C) {
    extern __shared__ float4 ln_bwd_smem4[];
    float* smem = (float*)ln_bwd_smem4;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float* acc_dw = smem + (size_t)warp * SUMS * C;
    float* acc_db = acc_dw + C;
    float* acc_dx = acc_db + C;  // SUMS == 3 only
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c < C)
            for (int k = 0; k < SUMS; k++) {
                *(float4*)(acc_dw + k * C + c) = zero;
                *(float4*)(acc_dw + k * C + c + 4) = zero;
            }
    }
    const float inv_C = 1.0f / (float)C;
    for (int row = blockIdx.x * warps + warp; row < N; row += gridDim.x * warps) {
        const size_t base = (size_t)row * C;
        uint4 dy[MAX_VPL], x[MAX_VPL], dx_old[MAX_VPL];
#pragma unroll
        for (int i = 0; i < MAX_VPL; i++) {
            const int c = (i * 32 + lane) * 8;
            if (c < C) {
                dy[i] = load16_stream(dout + base + c);
                x[i] = load16_stream(inp + base + c);
                dx_old[i] = load16(dinp + base + c);
            }
        }
        const float m = mean[row], s = rstd[row];
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_VPL; i++) {
            const int c = (i * 32 + lane) * 8;
            if (c < C) {
                float d[8], f[8], w[8];
                bf16x8_unpack(d, dy[i]);
                bf16x8_unpack(f, x[i]);
                bf16x8_unpack(w, load16(weight + c));
                float4 dw0 = *(float4*)(acc_dw + c), dw1 = *(float4*)(acc_dw + c + 4);
                float4 db0 = *(float4*)(acc_db + c), db1 = *(float4*)(acc_db + c + 4);
                float dw[8] = {dw0.x, dw0.y, dw0.z, dw0.w, dw1.x, dw1.y, dw1.z, dw1.w};
                float db[8] = {db0.x, db0.y, db0.z, db0.w, db1.x, db1.y, db1.z, db1.w};
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float xhat = (f[k] - m) * s;
                    const float g = d[k] * w[k];
                    sum_g += g;
                    sum_gx += g * xhat;
                    dw[k] += d[k] * xhat;
                    db[k] += d[k];
                }
                *(float4*)(acc_dw + c) = make_float4(dw[0], dw[1], dw[2], dw[3]);
                *(float4*)(acc_dw + c + 4) = make_float4(dw[4], dw[5], dw[6], dw[7]);
                *(float4*)(acc_db + c) = make_float4(db[0], db[1], db[2], db[3]);
                *(float4*)(acc_db + c + 4) = make_float4(db[4], db[5], db[6], db[7]);
            }
        }
        const float mean_g = layer_warp_sum(sum_g) * inv_C, mean_gx = layer_warp_sum(sum_gx) * inv_C;
#pragma unroll
        for (int i = 0; i < MAX_VPL; i++) {
            const int c = (i * 32 + lane) * 8;
            if (c < C) {
                float d[8], f[8], w[8], o[8];
                bf16x8_unpack(d, dy[i]);
                bf16x8_unpack(f, x[i]);
                bf16x8_unpack(w, load16(weight + c));
                bf16x8_unpack(o, dx_old[i]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float xhat = (f[k] - m) * s;
                    o[k] += s * (d[k] * w[k] - mean_g - xhat * mean_gx);
                }
                const uint4 packed = bf16x8_pack(o);
                store16(dinp + base + c, packed);
                if (SUMS == 3) {  // the stored (rounded) values
                    bf16x8_unpack(o, packed);
                    float4 a0 = *(float4*)(acc_dx + c), a1 = *(float4*)(acc_dx + c + 4);
                    *(float4*)(acc_dx + c) = make_float4(a0.x + o[0], a0.y + o[1], a0.z + o[2], a0.w + o[3]);
                    *(float4*)(acc_dx + c + 4) = make_float4(a1.x + o[4], a1.y + o[5], a1.z + o[6], a1.w + o[7]);
                }
            }
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < SUMS * C; j += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++) total += smem[(size_t)w * SUMS * C + j];
        partials[(size_t)blockIdx.x * SUMS * C + j] = total;
    }
}

#define LN_REDUCE_COLS 32
#define LN_REDUCE_ROWS 8

// dweight[j] += Σ_b partials[b, j] (j < C), dbias[j − C] += Σ_b partials[b, j] (C <= j < 2C) and,
// with sums = 3, dinp_sum[j − 2C] += Σ_b partials[b, j]; b summed as LN_REDUCE_ROWS interleaved strands
// added in strand order. blockDim (32, 8), one block per 32 columns.
static __global__ void __launch_bounds__(LN_REDUCE_COLS* LN_REDUCE_ROWS)
    layernorm_backward_reduce_kernel(__nv_bfloat16* __restrict__ dweight, __nv_bfloat16* __restrict__ dbias,
                                     __nv_bfloat16* __restrict__ dinp_sum, const float* __restrict__ partials,
                                     int num_partials, int C, int sums) {
    __shared__ float strands[LN_REDUCE_ROWS][LN_REDUCE_COLS + 1];
    const int j = blockIdx.x * LN_REDUCE_COLS + threadIdx.x, width = sums * C;
    float acc = 0.0f;
    if (j < width)
        for (int b = threadIdx.y; b < num_partials; b += LN_REDUCE_ROWS) acc += partials[(size_t)b * width + j];
    strands[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < width) {
        float total = 0.0f;
#pragma unroll
        for (int r = 0; r < LN_REDUCE_ROWS; r++) total += strands[r][threadIdx.x];
        __nv_bfloat16* g = j < C ? dweight + j : j < 2 * C ? dbias + (j - C) : dinp_sum + (j - 2 * C);
        *g = __float2bfloat16(__bfloat162float(*g) + total);
    }
}

typedef void (*LayernormBackwardKernel)(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*,
                                        const __nv_bfloat16*, const float*, const float*, int, int);

typedef struct {
    LayernormBackwardKernel kernel;
    int warps;      // per block
    int blocks;     // grid, also the number of partial rows in scratch
    size_t smem;    // dynamic shared memory per block, bytes
} LayernormBackwardPlan;

template <int SUMS>
static LayernormBackwardKernel layernorm_backward_kernel_for(int C) {
    switch (layernorm_max_vpl(C)) {
        case 2: return layernorm_backward_kernel<2, SUMS>;
        case 4: return layernorm_backward_kernel<4, SUMS>;
        case 6: return layernorm_backward_kernel<6, SUMS>;
        case 8: return layernorm_backward_kernel<8, SUMS>;
        case 10: return layernorm_backward_kernel<10, SUMS>;
        case 12: return layernorm_backward_kernel<12, SUMS>;
        case 16: return layernorm_backward_kernel<16, SUMS>;
        default: return layernorm_backward_kernel<32, SUMS>;
    }
}

// The backward's launch shape for (N, C) and 2 or 3 column sums on the current GPU: as many warps
// per block as fit the shared-memory budget (at most 8), and as many blocks as are resident at once
// (capped by the rows). The last shape of each kind is kept: the trainer asks for the same (N, C)
// 2L + 1 times per micro-step, and the attribute and occupancy queries should not sit on that path.
static LayernormBackwardPlan layernorm_backward_plan(int N, int C, int sums) {
    static int cached_N[2] = {-1, -1}, cached_C[2] = {-1, -1};
    static LayernormBackwardPlan cached[2];
    const int k = sums == 3;
    if (N == cached_N[k] && C == cached_C[k]) return cached[k];
    LayernormBackwardPlan p;
    p.kernel = sums == 3 ? layernorm_backward_kernel_for<3>(C) : layernorm_backward_kernel_for<2>(C);
    const size_t per_warp = (size_t)sums * C * sizeof(float);
    p.warps = (int)(LN_BWD_SMEM_BUDGET / per_warp);
    if (p.warps > 8) p.warps = 8;
    if (p.warps < 1) p.warps = 1;
    p.smem = p.warps * per_warp;
    CUDA_CHECK(cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p.kernel, 32 * p.warps, p.smem));
    if (per_sm < 1) per_sm = 1;
    size_t blocks = (size_t)per_sm * layer_num_sms();
    size_t needed = layer_ceil_div((size_t)N, (size_t)p.warps);
    p.blocks = (int)(needed < blocks ? needed : blocks);
    cached_N[k] = N, cached_C[k] = C, cached[k] = p;
    return p;
}

// Scratch bytes of layernorm_backward for (N, C) on the current GPU (needs a CUDA device). Enough for
// any N' <= N with the same C.
static size_t layernorm_backward_scratch_bytes(int N, int C) {
    layernorm_check("layernorm_backward_scratch_bytes", N, C);
    const size_t two = (size_t)layernorm_backward_plan(N, C, 2).blocks * 2 * C * sizeof(float);
    const size_t three = (size_t)layernorm_backward_plan(N, C, 3).blocks * 3 * C * sizeof(float);
    return two > three ? two : three;
}

// dinp (N, C) +=, dweight (C) +=, dbias (C) += the LayerNorm gradients, and dinp_sum (C) += the column
// sums of the new dinp unless dinp_sum is NULL; see the top of the file. inp is the LayerNorm's
// input (the residual), mean and rstd (N) from the forward. dinp must not alias dout or inp.
// scratch: scratch_bytes >= layernorm_backward_scratch_bytes(N, C).
static void layernorm_backward(__nv_bfloat16* dinp, __nv_bfloat16* dweight, __nv_bfloat16* dbias,
                               __nv_bfloat16* dinp_sum, float* scratch, size_t scratch_bytes,
                               const __nv_bfloat16* dout, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                               const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    layernorm_check("layernorm_backward", N, C);
    LAYER_REQUIRE(layer_is_aligned16(dinp) && layer_is_aligned16(dout) && layer_is_aligned16(inp) &&
                      layer_is_aligned16(weight) && layer_is_aligned16(scratch),
                  "layernorm_backward: dinp, dout, inp, weight and scratch must be 16-byte aligned");
    const int sums = dinp_sum ? 3 : 2;
    LayernormBackwardPlan p = layernorm_backward_plan(N, C, sums);
    const size_t need = (size_t)p.blocks * sums * C * sizeof(float);
    LAYER_REQUIRE(scratch_bytes >= need,
                  "layernorm_backward: scratch of %zu bytes, need %zu (layernorm_backward_scratch_bytes(%d, %d))",
                  scratch_bytes, need, N, C);
    p.kernel<<<p.blocks, 32 * p.warps, p.smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    dim3 block(LN_REDUCE_COLS, LN_REDUCE_ROWS);
    layernorm_backward_reduce_kernel<<<(unsigned)layer_ceil_div((size_t)sums * C, LN_REDUCE_COLS), block, 0,
                                       stream>>>(dweight, dbias, dinp_sum, scratch, p.blocks, C, sums);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // LAYERNORM_CUH
