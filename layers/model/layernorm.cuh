// layernorm.cuh: LayerNorm, forward and backward. N = B·T rows of C channels.
//
//   forward   given inp (N, C) (the residual stream: the projections add into it in their GEMM's
//             epilogue, matmul_forward_residual, so no residual add is fused here)
//             mean, rstd (N)  = statistics of inp's rows fp32 (biased variance, eps 1e-5)
//             out (N, C)      = (inp − mean)·rstd·weight + bias      bf16
//             weight, bias (C) bf16.
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
// Forward: one warp per row; each lane holds its 8-channel vectors (channels 8·(32·i + lane) .. +7)
// in registers, so a row is read from memory once; the mean, then the variance as the mean of squared
// deviations (two passes over registers, no E[x²] − mean² cancellation).
// Backward: one block per row at a time, a thread per 8-channel vector (two when C > 4096), so each
// thread adds its channels' dout·xhat, dout (and dinp) into fp32 registers over all of the block's
// rows, and the block's shared memory holds only the two per-row sums; at the end each block writes
// one fp32 partial row (2·C values, 3·C with dinp_sum) to scratch, and a second kernel sums the
// partials in block order and adds them to dweight, dbias (and dinp_sum). (The earlier design, one
// warp per row with per-warp accumulators in shared memory, left 8 warps per SM with three sums.)
// Every sum has an order fixed by the grid, which is fixed by (N, C, the GPU), so the backward is
// bit-identical run to run. Scratch: layernorm_backward_scratch_bytes(N, C) bytes (fp32, the block
// count times 3·C at most); it may hold anything on entry.
#ifndef LAYERNORM_CUH
#define LAYERNORM_CUH

#include "layers/model/layer_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define LAYERNORM_MAX_C 8192
#define LN_FWD_THREADS 256           // 8 rows per block

// Vectors per lane the forward kernel instance holds: the smallest instantiated MAX_VPL >= ceil(C / 256).
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

// The switch cases of every launch over layernorm_max_vpl's values: CASE(V) for each.
#define LAYERNORM_FOR_EACH_VPL(CASE) CASE(2) CASE(4) CASE(6) CASE(8) CASE(10) CASE(12) CASE(16) CASE(32)

static void layernorm_check(const char* who, int N, int C) {
    LAYER_REQUIRE(N >= 1 && C >= 8 && C % 8 == 0 && C <= LAYERNORM_MAX_C,
                  "%s: N = %d, C = %d: need N >= 1 and C a multiple of 8 (hidden sizes are multiples of 64) "
                  "no larger than %d",
                  who, N, C, LAYERNORM_MAX_C);
}

// ---- forward -------------------------------------------------------------------------------------

// The mean and rstd of a row a warp holds in registers, MAX_VPL 16-byte chunks per lane (chunk i of
// lane l: channels 8·(32·i + l) .. +7; chunks at or past C are not read), added in that order: the
// arithmetic of every LayerNorm forward here, so they all give the same bits.
template <int MAX_VPL>
static __device__ __forceinline__ void layernorm_warp_statistics(const uint4 (&x)[MAX_VPL], int C, float* mean,
                                                                 float* rstd) {
    const int lane = threadIdx.x % 32, vecs = C / 8;
    float sum = 0.0f, f[8];
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++)
        if (i * 32 + lane < vecs) {
            bf16x8_unpack(f, x[i]);
#pragma unroll
            for (int k = 0; k < 8; k++) sum += f[k];
        }
    const float m = layer_warp_sum(sum) / (float)C;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++)
        if (i * 32 + lane < vecs) {
            bf16x8_unpack(f, x[i]);
#pragma unroll
            for (int k = 0; k < 8; k++) sq += (f[k] - m) * (f[k] - m);
        }
    *mean = m;
    *rstd = rsqrtf(layer_warp_sum(sq) / (float)C + LAYERNORM_EPS);
}

// 8 channels of the output: (x − mean)·rstd·weight + bias, rounded to bf16.
static __device__ __forceinline__ uint4 layernorm_chunk(uint4 x, uint4 weight, uint4 bias, float mean, float rstd) {
    float f[8], w[8], b[8];
    bf16x8_unpack(f, x);
    bf16x8_unpack(w, weight);
    bf16x8_unpack(b, bias);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = (f[k] - mean) * rstd * w[k] + b[k];
    return bf16x8_pack(f);
}

template <int MAX_VPL>
static __global__ void __launch_bounds__(LN_FWD_THREADS)
    layernorm_forward_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             const __nv_bfloat16* __restrict__ inp, const __nv_bfloat16* __restrict__ weight,
                             const __nv_bfloat16* __restrict__ bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (LN_FWD_THREADS / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = (size_t)row * C;
    uint4 x[MAX_VPL];
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c < C) x[i] = load16_stream(inp + base + c);
    }
    float m, s;
    layernorm_warp_statistics<MAX_VPL>(x, C, &m, &s);
#pragma unroll
    for (int i = 0; i < MAX_VPL; i++) {
        const int c = (i * 32 + lane) * 8;
        if (c >= C) continue;
        const uint4 y = layernorm_chunk(x[i], load16(weight + c), load16(bias + c), m, s);
        if (out) store16(out + base + c, y);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = s;
    }
}

// out (N, C) = LayerNorm(inp (N, C))·weight + bias, mean and rstd (N) saved (either may be NULL, e.g.
// for inference). out must not alias inp. out NULL: the statistics only (--precision fp8 computes
// the output inside its cast, fp8_cast.cuh's FP8_OP_LAYERNORM).
static void layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* inp,
                              const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C,
                              cudaStream_t stream) {
    layernorm_check("layernorm_forward", N, C);
    LAYER_REQUIRE((out || (mean && rstd)) && (!out || layer_is_aligned16(out)), "layernorm_forward: out is NULL "
                  "and so is mean or rstd (nothing to write), or out is not 16-byte aligned");
    LAYER_REQUIRE(layer_is_aligned16(inp) && layer_is_aligned16(weight) &&
                      layer_is_aligned16(bias),
                  "layernorm_forward: out, inp, weight and bias must be 16-byte aligned");
    const unsigned grid = (unsigned)layer_ceil_div((size_t)N, LN_FWD_THREADS / 32);
    switch (layernorm_max_vpl(C)) {
#define LN_FWD_CASE(V)                                                                                         \
    case V:                                                                                                    \
        layernorm_forward_kernel<V>                                                                            \
            <<<grid, LN_FWD_THREADS, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);                     \
        break;
        LAYERNORM_FOR_EACH_VPL(LN_FWD_CASE)
#undef LN_FWD_CASE
    }
    CUDA_CHECK(cudaGetLastError());
}

// ---- backward ------------------------------------------------------------------------------------

// One row at a time per block: thread t of `threads` owns the 8-channel vectors t + threads·i (i <
// VPT) of every row, so its shares of Σ dout·xhat, Σ dout (and Σ dinp) stay in registers across all
// the block's rows (rows blockIdx.x, + gridDim.x, ...), and a row's two means take one block sum.
// The next row's inputs are loaded before the current row's block sum, so a block keeps two rows of
// loads in flight. partials (gridDim.x, SUMS·C) fp32: row b holds block b's Σ dout·xhat (channels
// 0..C−1), Σ dout (C..2C−1) and, with SUMS = 3, Σ dinp (2C..3C−1).
template <int VPT>
struct LayernormRowSlice {  // one row's vectors owned by one thread
    uint4 dy[VPT], x[VPT], dx_old[VPT];
    float mean, rstd;
};

template <int VPT>
static __device__ __forceinline__ void layernorm_load_row_slice(LayernormRowSlice<VPT>& s, int row, int vecs,
                                                                const __nv_bfloat16* __restrict__ dout,
                                                                const __nv_bfloat16* __restrict__ inp,
                                                                const __nv_bfloat16* __restrict__ dinp,
                                                                const float* mean, const float* rstd, int C) {
    const size_t base = (size_t)row * C;
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int v = threadIdx.x + blockDim.x * i;
        if (v < vecs) {
            s.dy[i] = load16_stream(dout + base + 8 * v);
            s.x[i] = load16_stream(inp + base + 8 * v);
            s.dx_old[i] = load16(dinp + base + 8 * v);
        }
    }
    s.mean = mean[row];
    s.rstd = rstd[row];
}

// Both values summed over the block, in warp order (every thread gets the same bits). exchange: one
// float2 per warp; the caller alternates between two such arrays from one row to the next, so one
// barrier per row suffices (layer_block_sum sums one value with two barriers).
static __device__ __forceinline__ float2 layernorm_block_sum2(float a, float b, float2* exchange) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    a = layer_warp_sum(a);
    b = layer_warp_sum(b);
    if (lane == 0) exchange[warp] = make_float2(a, b);
    __syncthreads();
    float2 total = make_float2(0.0f, 0.0f);
    for (int w = 0; w < warps; w++) {
        const float2 e = exchange[w];
        total.x += e.x;
        total.y += e.y;
    }
    return total;
}

template <int VPT, int SUMS>
static __global__ void __launch_bounds__(512, VPT == 1 ? 2 : 1)  // VPT 1: <= 64 registers, 4 blocks of 256 per SM
    layernorm_backward_kernel(__nv_bfloat16* __restrict__ dinp, float* __restrict__ partials,
                              const __nv_bfloat16* __restrict__ dout, const __nv_bfloat16* __restrict__ inp,
                              const __nv_bfloat16* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C) {
    __shared__ float2 exchange[2][16];
    const int vecs = C / 8;
    float acc[SUMS][VPT][8] = {};  // Σ dout·xhat, Σ dout, Σ dinp per owned channel
    uint4 w_packed[VPT];
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int v = threadIdx.x + blockDim.x * i;
        if (v < vecs) w_packed[i] = load16(weight + 8 * v);
    }
    const float inv_C = 1.0f / (float)C;
    LayernormRowSlice<VPT> cur, next;
    int parity = 0;
    if (blockIdx.x < N) layernorm_load_row_slice(cur, blockIdx.x, vecs, dout, inp, dinp, mean, rstd, C);
    for (int row = blockIdx.x; row < N; row += gridDim.x, parity ^= 1) {
        if (row + gridDim.x < N)
            layernorm_load_row_slice(next, row + gridDim.x, vecs, dout, inp, dinp, mean, rstd, C);
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; i++) {
            if (threadIdx.x + blockDim.x * i < vecs) {
                float d[8], f[8], w[8];
                bf16x8_unpack(d, cur.dy[i]);
                bf16x8_unpack(f, cur.x[i]);
                bf16x8_unpack(w, w_packed[i]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float xhat = (f[k] - cur.mean) * cur.rstd, g = d[k] * w[k];
                    sum_g += g;
                    sum_gx += g * xhat;
                    acc[0][i][k] += d[k] * xhat;
                    acc[1][i][k] += d[k];
                }
            }
        }
        const float2 sums = layernorm_block_sum2(sum_g, sum_gx, exchange[parity]);
        const float mean_g = sums.x * inv_C, mean_gx = sums.y * inv_C;
#pragma unroll
        for (int i = 0; i < VPT; i++) {
            const int v = threadIdx.x + blockDim.x * i;
            if (v < vecs) {
                float d[8], f[8], w[8], o[8];
                bf16x8_unpack(d, cur.dy[i]);
                bf16x8_unpack(f, cur.x[i]);
                bf16x8_unpack(w, w_packed[i]);
                bf16x8_unpack(o, cur.dx_old[i]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float xhat = (f[k] - cur.mean) * cur.rstd;
                    o[k] += cur.rstd * (d[k] * w[k] - mean_g - xhat * mean_gx);
                }
                const uint4 packed = bf16x8_pack(o);
                store16(dinp + (size_t)row * C + 8 * v, packed);
                if (SUMS == 3) {  // the stored (rounded) values
                    bf16x8_unpack(o, packed);
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[SUMS - 1][i][k] += o[k];
                }
            }
        }
        cur = next;
    }
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int v = threadIdx.x + blockDim.x * i;
        if (v < vecs)
            for (int s = 0; s < SUMS; s++) {  // plain stores: the reduce kernel reads them from L2 next
                float4* out = (float4*)(partials + (size_t)blockIdx.x * SUMS * C + s * C + 8 * v);
                out[0] = make_float4(acc[s][i][0], acc[s][i][1], acc[s][i][2], acc[s][i][3]);
                out[1] = make_float4(acc[s][i][4], acc[s][i][5], acc[s][i][6], acc[s][i][7]);
            }
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
    int threads;    // per block: one per 8-channel vector of a row, or per two vectors when C > 4096
    int blocks;     // grid, also the number of partial rows in scratch
} LayernormBackwardPlan;

// The backward's launch shape for (N, C) and 2 or 3 column sums on the current GPU: as many blocks
// as are resident at once, capped by the rows. The last shape of each kind is kept: the trainer asks
// for the same (N, C) 2L + 1 times per micro-step, and the occupancy query should not sit on that path.
static LayernormBackwardPlan layernorm_backward_plan(int N, int C, int sums) {
    static int cached_N[2] = {-1, -1}, cached_C[2] = {-1, -1};
    static LayernormBackwardPlan cached[2];
    const int k = sums == 3;
    if (N == cached_N[k] && C == cached_C[k]) return cached[k];
    LayernormBackwardPlan p;
    const int vecs = C / 8, vpt = vecs <= 512 ? 1 : 2;  // C <= LAYERNORM_MAX_C: at most 512 threads
    p.kernel = vpt == 1 ? (sums == 3 ? layernorm_backward_kernel<1, 3> : layernorm_backward_kernel<1, 2>)
                        : (sums == 3 ? layernorm_backward_kernel<2, 3> : layernorm_backward_kernel<2, 2>);
    p.threads = (int)layer_ceil_div(layer_ceil_div((size_t)vecs, (size_t)vpt), 32) * 32;
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p.kernel, p.threads, 0));
    if (per_sm < 1) per_sm = 1;
    const size_t blocks = (size_t)per_sm * layer_num_sms();
    p.blocks = (int)((size_t)N < blocks ? (size_t)N : blocks);
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
    p.kernel<<<p.blocks, p.threads, 0, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    dim3 block(LN_REDUCE_COLS, LN_REDUCE_ROWS);
    layernorm_backward_reduce_kernel<<<(unsigned)layer_ceil_div((size_t)sums * C, LN_REDUCE_COLS), block, 0,
                                       stream>>>(dweight, dbias, dinp_sum, scratch, p.blocks, C, sums);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // LAYERNORM_CUH
