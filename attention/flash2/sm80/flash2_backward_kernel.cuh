// flash2_backward_kernel.cuh: FlashAttention-2 backward (Algorithm 2 of the paper) on mma.sync tensor cores.
//
// Inputs: q, k, v as the forward read them (attention.h layout: k, v with NKV heads at kv_stride),
// out and dout (B, T, NH, HD) at out_stride, lse (B, NH, T) from the forward. Outputs dq at
// dqkv_stride, dk and dv at dkv_stride, overwritten.
// Workspace (fp32): dq_accum (B, NH, T, HD), D and LSE·log2(e) (B, NH, T); nothing of size T².
// Grouped-query attention: a block owns a key block of one K/V head and steps through the query
// blocks of every query head of its group in turn (G = NH / NKV times as many steps), so K and V are
// loaded once and dK, dV sum over the group in registers, with no extra memory and no atomics.
//
// Three kernels:
//  1. preprocess: D = rowsum(dO ∘ O) and LSE in log2 units per row, and dq_accum zeroed.
//  2. main: one thread block per (key block of BLOCK_N rows, b·NKV + kv head), looping over the query
//     blocks of BLOCK_M rows of each query head of the group (double-buffered with cp.async). Each
//     warp owns 16 keys: it recomputes its slice of Sᵀ = K Qᵀ and Pᵀ = exp(Sᵀ − LSE) (no softmax
//     pass needed), computes dPᵀ = V dOᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − D), and accumulates its rows of
//     dV += Pᵀ dO and dK += dSᵀ Q in registers for the whole loop. dSᵀ goes through shared memory
//     (two buffers) so all warps can form dQ_block = dS K one step later, after the next step's only
//     barrier; it is added into dq_accum with fp32 atomics (other key blocks add to the same rows).
//  3. convert: dq = dq_accum · scale, to bf16, into the strided dq.
// Causal: query blocks wholly before the key block are skipped; masking only on diagonal and
// end-of-sequence blocks.
// The per-warp step (backward_warp_step, dq_block_product, stage_dk_dv) and the block's shapes
// (BackwardStepConfig) are attention/common/mma_backward_step.cuh's, shared with flash1's backward;
// its arithmetic (P and dS) is attention_math.cuh's.
#ifndef FLASH2_BACKWARD_KERNEL_CUH
#define FLASH2_BACKWARD_KERNEL_CUH

#include "attention/common/cuda_check.h"
#include "attention/common/attention_math.cuh"
#include "attention/common/mma_backward_step.cuh"
#include "attention/common/mma_common.cuh"
#include "attention/flash2/flash2_params.h"
#include "attention/flash2/flash2_rowsum.cuh"

// ---- 1. D = rowsum(dO ∘ O), LSE·log2 e, dq_accum = 0: GROUP lanes per row (b, t, h), 8 values each
template <int HD>
__global__ void flash2_backward_preprocess_kernel(Flash2BackwardParams p, int rows) {
    constexpr int CHUNKS = HD / 8, GROUP = preprocess_lanes_per_row<HD>();
    const int lane = threadIdx.x % 32, chunk = lane % GROUP;
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / GROUP;
    const bool valid = row < rows;  // no early return: every lane takes part in the shuffles
    const int h = row % p.NH, bt = row / p.NH, t = bt % p.T, b = bt / p.T;  // row = (b·T + t)·NH + h
    const long offset = (long)bt * p.out_stride + (long)h * HD + chunk * 8;
    const long head_row = ((long)b * p.NH + h) * p.T + t, stat_row = ((long)b * p.NH + h) * p.lse_rows + t;
    float dot = 0.f;
    if (valid && chunk < CHUNKS) {
        dot = dot_bf16x8(*(const uint4*)(p.out + offset), *(const uint4*)(p.dout + offset));
        if (p.dq_accum) {
            float4* acc = (float4*)(p.dq_accum + head_row * HD + chunk * 8);
            acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
            acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int off = GROUP / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (valid && chunk == 0) {
        p.d_rows[stat_row] = dot;
        p.lse_log2[stat_row] = p.lse[head_row] * FLASH2_LOG2E;
    }
}

// ---- 3. dq = bf16(dq_accum · scale): one thread per 8 values -------------------------------------
template <int HD>
__global__ void flash2_backward_convert_dq_kernel(Flash2BackwardParams p, long chunks) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= chunks) return;
    const int chunk = (int)(i % (HD / 8));
    const long head_row = i / (HD / 8);  // (b·NH + h)·T + t
    const int t = (int)(head_row % p.T);
    const long bh = head_row / p.T;
    const int h = (int)(bh % p.NH), b = (int)(bh / p.NH);
    const float4* src = (const float4*)(p.dq_accum + head_row * HD + chunk * 8);
    float4 x = src[0], y = src[1];
    uint4 packed;
    packed.x = pack_bf16(x.x * p.scale, x.y * p.scale);
    packed.y = pack_bf16(x.z * p.scale, x.w * p.scale);
    packed.z = pack_bf16(y.x * p.scale, y.y * p.scale);
    packed.w = pack_bf16(y.z * p.scale, y.w * p.scale);
    *(uint4*)(p.dq + ((long)b * p.T + t) * p.dqkv_stride + (long)h * HD + chunk * 8) = packed;
}

// ---- 2. the main kernel: one thread block per (key block, b·NKV + kv head) ------------------------
template <int HD, int BLOCK_M, int NWARPS, int MIN_BLOCKS, bool CAUSAL>
__global__ void __launch_bounds__(NWARPS * 32, MIN_BLOCKS) flash2_backward_kernel(Flash2BackwardParams p) {
    typedef BackwardStepConfig<HD, BLOCK_M, NWARPS> C;
    typedef typename C::Tile Tile;
    typedef typename C::DsTile DsTile;
    constexpr int BLOCK_N = C::BLOCK_N;
    extern __shared__ __align__(128) __nv_bfloat16 smem[];
    __nv_bfloat16* k_tile = smem;                          // (BLOCK_N, HD)
    __nv_bfloat16* v_tile = k_tile + C::KV_ELEMS;          // (BLOCK_N, HD)
    __nv_bfloat16* q_tiles = v_tile + C::KV_ELEMS;         // 2 × (BLOCK_M, HD)
    __nv_bfloat16* do_tiles = q_tiles + 2 * C::QO_ELEMS;   // 2 × (BLOCK_M, HD)
    __nv_bfloat16* ds_tile = do_tiles + 2 * C::QO_ELEMS;   // 2 × (BLOCK_N, BLOCK_M): dSᵀ
    float* lse_tiles = (float*)(ds_tile + 2 * C::DS_ELEMS);    // 2 × BLOCK_M, in log2 units
    float* d_tiles = lse_tiles + 2 * BLOCK_M;              // 2 × BLOCK_M

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int n_block = blockIdx.x, n0 = n_block * BLOCK_N;
    const int bg = blockIdx.y, b = bg / p.NKV, kv_head = bg % p.NKV;
    const int group = p.NH / p.NKV, h0 = kv_head * group;  // this block's query heads: h0 .. h0 + group − 1
    const int T = p.T;
    const long kv_offset = (long)b * T * p.kv_stride + (long)kv_head * HD;

    // Steps j = 0 .. steps − 1: query head h0 + j / per_head, query block m_begin + j % per_head.
    const int m_begin = CAUSAL ? n0 / BLOCK_M : 0;
    const int m_end = (T + BLOCK_M - 1) / BLOCK_M;
    const int per_head = m_end - m_begin, steps = group * per_head;

    // Loads step j's query block (Q, dO, LSE·log2 e, D) into buffer `buf`.
    auto load_query_block = [&](int j, int buf) {
        const int h = h0 + j / per_head, m0 = (m_begin + j % per_head) * BLOCK_M;
        const long stat_head = ((long)b * p.NH + h) * p.lse_rows;
        const float* lse_head = p.lse_log2 + stat_head;
        const float* d_head = p.d_rows + stat_head;
        load_tile_async<BLOCK_M, HD, C::THREADS>(q_tiles + buf * C::QO_ELEMS,
                                                 p.q + ((long)b * T + m0) * p.qkv_stride + (long)h * HD, p.qkv_stride,
                                                 T - m0);
        load_tile_async<BLOCK_M, HD, C::THREADS>(do_tiles + buf * C::QO_ELEMS,
                                                 p.dout + ((long)b * T + m0) * p.out_stride + (long)h * HD,
                                                 p.out_stride, T - m0);
        // Rows past the end get LSE = D = 0; they are masked out below.
        for (int i = threadIdx.x; i < BLOCK_M; i += C::THREADS) {
            const bool valid = m0 + i < T;
            cp_async_4(lse_tiles + buf * BLOCK_M + i, valid ? lse_head + m0 + i : lse_head, valid ? 4 : 0);
            cp_async_4(d_tiles + buf * BLOCK_M + i, valid ? d_head + m0 + i : d_head, valid ? 4 : 0);
        }
    };

    load_tile_async<BLOCK_N, HD, C::THREADS>(k_tile, p.k + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
    load_tile_async<BLOCK_N, HD, C::THREADS>(v_tile, p.v + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
    load_query_block(0, 0);
    cp_async_commit();

    float acc_dk[C::D_TILES][4], acc_dv[C::D_TILES][4];  // rows g, g+8 of this warp's 16 keys
#pragma unroll
    for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;
    const int key_row0 = warp * 16;
    const int dq_m = warp % C::DQ_M, dq_n = warp / C::DQ_M;
    const uint32_t k_a_lane = Tile::lane_base(k_tile, a_row(lane), a_chunk(lane));
    const uint32_t v_a_lane = Tile::lane_base(v_tile, a_row(lane), a_chunk(lane));
    const uint32_t k_t_lane = Tile::lane_base(k_tile, bt_row(lane), bt_chunk(lane));
    // dS read transposed, x4 matrices (queries 0-7, keys 0-7), (q 8-15, k 0-7), (q 0-7, k 8-15), (q 8-15, k 8-15)
    const uint32_t ds_lane = DsTile::lane_base(ds_tile, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    // dQ_block of step j += dS K from dS buffer dbuf, added into dq_accum with fp32 atomics (other
    // key blocks add to the same rows). Called one step late (after the next step's barrier), so dS
    // needs no barrier of its own.
    auto add_dq_block = [&](int j, int dbuf) {
        float acc_dq[C::DQ_MT][C::DQ_TILES][4];
        const int dq_chunk0 = dq_n * C::DQ_TILES;
        const int h = h0 + j / per_head, mq = m_begin + j % per_head;
        float* dq_head = p.dq_accum + ((long)b * p.NH + h) * T * HD;
        dq_block_product<HD, BLOCK_M, NWARPS>(acc_dq, ds_lane + dbuf * C::DS_ELEMS * 2, k_t_lane, dq_m, dq_chunk0);
#pragma unroll
        for (int mt = 0; mt < C::DQ_MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int qi = mq * BLOCK_M + (dq_m * C::DQ_MT + mt) * 16 + g + 8 * half;
                if (qi < T) {
                    float* dst = dq_head + (long)qi * HD + dq_chunk0 * 8 + 2 * t4;
#pragma unroll
                    for (int dt = 0; dt < C::DQ_TILES; dt++)
                        atomic_add_f32x2(dst + dt * 8, acc_dq[mt][dt][2 * half], acc_dq[mt][dt][2 * half + 1]);
                }
            }
    };

    for (int j = 0; j < steps; j++) {
        const int m0 = (m_begin + j % per_head) * BLOCK_M, buf = j & 1;
        const BackwardLanes lanes =
            backward_lanes<HD>(k_a_lane, v_a_lane, q_tiles + buf * C::QO_ELEMS, do_tiles + buf * C::QO_ELEMS);
        // One barrier per step: it publishes step j's block and the dS of step j-1, and frees the
        // other buffers (every warp has left step j-1), so the prefetch of step j+1 goes after it.
        cp_async_wait<0>();  // step j's block (and K, V) have landed
        __syncthreads();
        if (j + 1 < steps) load_query_block(j + 1, buf ^ 1);
        cp_async_commit();
        if (j > 0) add_dq_block(j - 1, buf ^ 1);
        backward_warp_step<HD, BLOCK_M, NWARPS, CAUSAL, false>(
            acc_dk, acc_dv, lanes, lse_tiles + buf * BLOCK_M, d_tiles + buf * BLOCK_M, ds_tile + buf * C::DS_ELEMS,
            key_row0, n0, m0, T, p.scale_log2);
    }
    __syncthreads();  // the last dS is in shared memory
    add_dq_block(steps - 1, (steps - 1) & 1);
    cp_async_wait<0>();
    __syncthreads();  // every warp is done reading K and V: their tiles now stage dK and dV
    stage_dk_dv<HD>(acc_dk, acc_dv, k_tile, v_tile, key_row0, p.scale);
    __syncwarp();
    const long key_offset = ((long)b * T + n0 + key_row0) * p.dkv_stride + (long)kv_head * HD;
    store_tile<16, HD, 32>(p.dk + key_offset, p.dkv_stride, k_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                           warp * 32);
    store_tile<16, HD, 32>(p.dv + key_offset, p.dkv_stride, v_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                           warp * 32);
}

// ---- launch -------------------------------------------------------------------------------------
template <int HD>
static inline void launch_backward_preprocess(const Flash2BackwardParams* p, int B, cudaStream_t stream) {
    const int rows = B * p->T * p->NH, rows_per_block = 256 / preprocess_lanes_per_row<HD>();
    flash2_backward_preprocess_kernel<HD><<<(rows + rows_per_block - 1) / rows_per_block, 256, 0, stream>>>(*p, rows);
    ATTN_CUDA_CHECK(cudaGetLastError());
}
template <int HD>
static inline void launch_backward_convert_dq(const Flash2BackwardParams* p, int B, cudaStream_t stream) {
    const long chunks = (long)B * p->T * p->NH * (HD / 8);
    flash2_backward_convert_dq_kernel<HD><<<(unsigned)((chunks + 255) / 256), 256, 0, stream>>>(*p, chunks);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

template <int HD, int BLOCK_M, int NWARPS, int MIN_BLOCKS, bool CAUSAL>
static inline void launch_backward(const Flash2BackwardParams* p, int B, cudaStream_t stream) {
    typedef BackwardStepConfig<HD, BLOCK_M, NWARPS> C;
    launch_backward_preprocess<HD>(p, B, stream);

    launch_with_smem<flash2_backward_kernel<HD, BLOCK_M, NWARPS, MIN_BLOCKS, CAUSAL>>(
        dim3((p->T + C::BLOCK_N - 1) / C::BLOCK_N, B * p->NKV), C::THREADS, C::SMEM_BYTES, stream, *p);

    launch_backward_convert_dq<HD>(p, B, stream);
}

#endif  // FLASH2_BACKWARD_KERNEL_CUH