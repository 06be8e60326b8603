// mma_backward_step.cuh: the per-warp step of the K/V-outer backwards on mma.sync tensor cores,
// shared by flash2's (flash2/sm80/flash2_backward_kernel.cuh) and flash1's (flash1/flash1_backward.cu).
//
// Both give each warp 16 keys of a key block of BLOCK_N = 16·NWARPS keys and step over query blocks
// of BLOCK_M rows, with the same shared-memory tiles (BackwardStepConfig::Tile, ::DsTile); they
// differ in where D and LSE come from and in how dQ is added to dq_accum. Here:
//   BackwardStepConfig  the block's shapes, tiles and the split of dQ_block = dS K over the warps
//   backward_lanes      the ldmatrix lane addresses of a step's Q and dO tiles
//   backward_warp_step  Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ and dSᵀ (attention_math.cuh), dV += Pᵀ dO and
//                       dK += dSᵀ Q in registers, dSᵀ to shared memory
//   dq_block_product    this warp's share of dQ_block = dS K, from the dSᵀ of every warp
//   stage_dk_dv         dK·scale and dV to bf16 in shared memory after the last step
#ifndef ATTENTION_MMA_BACKWARD_STEP_CUH
#define ATTENTION_MMA_BACKWARD_STEP_CUH

#include "attention/common/attention_math.cuh"
#include "attention/common/mma_common.cuh"

// The shapes of a block of the K/V-outer backward: NWARPS warps of 16 keys, query blocks of BLOCK_M
// rows. SMEM_BYTES is flash2's layout (K, V; two buffers each of Q, dO and dSᵀ; LSE and D); flash1
// adds its O tiles to it (Flash1BackwardConfig).
template <int HD, int BLOCK_M, int NWARPS>
struct BackwardStepConfig {
    static constexpr int THREADS = NWARPS * 32;
    static constexpr int BLOCK_N = 16 * NWARPS;  // each warp owns 16 keys
    static constexpr int Q_TILES = BLOCK_M / 8;  // n8 tiles of Sᵀ (queries)
    static constexpr int D_TILES = HD / 8;
    static constexpr int D_STEPS = HD / 16;
    // dQ_block (BLOCK_M × HD) = dS K split over warps: DQ_M row groups of DQ_MT m16 tiles by DQ_N
    // column groups. Two m16 tiles per warp where the split allows it: each K fragment then feeds
    // two MMAs, a quarter fewer ldmatrix than one tile per warp.
    static constexpr bool DQ_PAIRS = (BLOCK_M / 32) > 0 && NWARPS % (BLOCK_M / 32) == 0 &&
                                     D_TILES % (NWARPS / (BLOCK_M / 32 > 0 ? BLOCK_M / 32 : 1)) == 0;
    static constexpr int DQ_MT = DQ_PAIRS ? 2 : 1;
    static constexpr int DQ_M = BLOCK_M / (16 * DQ_MT);
    static constexpr int DQ_N = NWARPS / DQ_M;
    static constexpr int DQ_TILES = D_TILES / DQ_N;  // n8 tiles of dQ per warp
    typedef SmemTile<HD> Tile;
    typedef SmemTile<BLOCK_M> DsTile;  // dSᵀ (BLOCK_N keys, BLOCK_M queries)
    static constexpr int KV_ELEMS = Tile::elems(BLOCK_N);
    static constexpr int QO_ELEMS = Tile::elems(BLOCK_M);
    static constexpr int DS_ELEMS = DsTile::elems(BLOCK_N);
    static constexpr size_t SMEM_BYTES =
        (size_t)(2 * KV_ELEMS + 4 * QO_ELEMS + 2 * DS_ELEMS) * sizeof(__nv_bfloat16) + 4 * BLOCK_M * sizeof(float);
    static_assert(NWARPS % DQ_M == 0 && D_TILES % DQ_N == 0, "dQ warp split");
    static_assert(!Tile::SWIZZLE || DQ_TILES % 2 == 0, "SmemTile::at needs even chunks in swizzled tiles");
    static_assert(BLOCK_M % 16 == 0, "query blocks are whole m16 tiles");
};

// ldmatrix lane addresses (SmemTile::lane_base) of one step's operands: K and V as A operands,
// Q and dO as B operands (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ) and read transposed (dV += Pᵀ dO, dK += dSᵀ Q).
typedef struct {
    uint32_t k_a, v_a, q_b, do_b, q_t, do_t;
} BackwardLanes;

// The lanes of the step on q_tile and do_tile (BLOCK_M, HD). The kernels compute them at the top
// of the step, before its barrier and the dQ product: computed inside backward_warp_step instead,
// ptxas spills more.
template <int HD>
__device__ __forceinline__ BackwardLanes backward_lanes(uint32_t k_a_lane, uint32_t v_a_lane,
                                                        const __nv_bfloat16* q_tile, const __nv_bfloat16* do_tile) {
    typedef SmemTile<HD> Tile;
    const int lane = threadIdx.x % 32;
    BackwardLanes l;
    l.k_a = k_a_lane;
    l.v_a = v_a_lane;
    l.q_b = Tile::lane_base(q_tile, b_row(lane), b_chunk(lane));
    l.do_b = Tile::lane_base(do_tile, b_row(lane), b_chunk(lane));
    l.q_t = Tile::lane_base(q_tile, bt_row(lane), bt_chunk(lane));
    l.do_t = Tile::lane_base(do_tile, bt_row(lane), bt_chunk(lane));
    return l;
}

// One step for this warp: its 16 keys (rows key_row0.. of the K and V tiles, key block at n0)
// against query block m0 (the Q and dO tiles of `lanes`; lse_log2 and d, BLOCK_M floats each):
// Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, Pᵀ and dSᵀ (attention_math.cuh), dV += Pᵀ dO and dK += dSᵀ Q in
// acc_dv, acc_dk (rows g, g + 8 of the 16 keys), and dSᵀ in bf16 into this warp's 16 rows of
// ds_tile (BLOCK_N, BLOCK_M) for the dQ product. SYNC_BEFORE_P: a block-wide barrier between the
// products and Pᵀ, for a caller whose lse_log2 and d other threads are still writing (flash1
// computes them in the step).
template <int HD, int BLOCK_M, int NWARPS, bool CAUSAL, bool SYNC_BEFORE_P>
__device__ __forceinline__ void backward_warp_step(float (&acc_dk)[HD / 8][4], float (&acc_dv)[HD / 8][4],
                                                   const BackwardLanes& lanes, const float* lse_log2, const float* d,
                                                   __nv_bfloat16* ds_tile, int key_row0, int n0, int m0, int T,
                                                   float scale_log2) {
    typedef BackwardStepConfig<HD, BLOCK_M, NWARPS> C;
    typedef typename C::Tile Tile;
    typedef typename C::DsTile DsTile;
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const uint32_t k_a_lane = lanes.k_a, v_a_lane = lanes.v_a, q_b_lane = lanes.q_b, do_b_lane = lanes.do_b;
    const uint32_t q_t_lane = lanes.q_t, do_t_lane = lanes.do_t;

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, 16 keys × BLOCK_M queries
    float s[C::Q_TILES][4], dp[C::Q_TILES][4];
#pragma unroll
    for (int nt = 0; nt < C::Q_TILES; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::D_STEPS; ks++) {
        uint32_t ka[4], va[4];
        ldmatrix_x4(ka, Tile::at(k_a_lane, key_row0, ks * 2));
        ldmatrix_x4(va, Tile::at(v_a_lane, key_row0, ks * 2));
#pragma unroll
        for (int np = 0; np < C::Q_TILES / 2; np++) {
            uint32_t qb[4], dob[4];
            ldmatrix_x4(qb, Tile::at(q_b_lane, np * 16, ks * 2));
            ldmatrix_x4(dob, Tile::at(do_b_lane, np * 16, ks * 2));
            mma_16816(s[2 * np], ka, qb[0], qb[1]);
            mma_16816(s[2 * np + 1], ka, qb[2], qb[3]);
            mma_16816(dp[2 * np], va, dob[0], dob[1]);
            mma_16816(dp[2 * np + 1], va, dob[2], dob[3]);
        }
    }
    if (SYNC_BEFORE_P) __syncthreads();

    // dV += Pᵀ dO and dK += dSᵀ Q (k = queries), A operands straight from the accumulators: Pᵀ =
    // exp2(Sᵀ·scale_log2 − LSE·log2 e) (masked to 0 on diagonal and end-of-sequence blocks) and
    // dSᵀ = Pᵀ ∘ (dPᵀ − D), formed a k16 step (two n8 tiles, queries m0 + 16·ks + 2·t4 + {0, 1, 8, 9})
    // at a time just before their MMAs: ptxas then holds fewer fp32 values (fewer spills than all
    // of Pᵀ and dSᵀ first).
    const bool masked = m0 + BLOCK_M > T || n0 + C::BLOCK_N > T || (CAUSAL && n0 + C::BLOCK_N - 1 > m0);
#pragma unroll
    for (int ks = 0; ks < BLOCK_M / 16; ks++) {
        uint32_t pa[4], dsa[4];
        probs_from_scores<2, CAUSAL>(&s[2 * ks][0], n0 + key_row0 + g, m0 + 2 * t4 + 16 * ks, T, masked,
                                     lse_log2 + 2 * t4 + 16 * ks, scale_log2);
        dscores_from_probs<2>(&dp[2 * ks][0], &s[2 * ks][0], d + 2 * t4 + 16 * ks);
        accumulators_to_a(pa, s[2 * ks], s[2 * ks + 1]);
        accumulators_to_a(dsa, dp[2 * ks], dp[2 * ks + 1]);
#pragma unroll
        for (int dp2 = 0; dp2 < C::D_TILES / 2; dp2++) {
            uint32_t dob[4], qb[4];
            ldmatrix_x4_trans(dob, Tile::at(do_t_lane, ks * 16, dp2 * 2));
            ldmatrix_x4_trans(qb, Tile::at(q_t_lane, ks * 16, dp2 * 2));
            mma_16816(acc_dv[2 * dp2], pa, dob[0], dob[1]);
            mma_16816(acc_dv[2 * dp2 + 1], pa, dob[2], dob[3]);
            mma_16816(acc_dk[2 * dp2], dsa, qb[0], qb[1]);
            mma_16816(acc_dk[2 * dp2 + 1], dsa, qb[2], qb[3]);
        }
        if (C::D_TILES % 2) {
            uint32_t dob[2], qb[2];
            ldmatrix_x2_trans(dob, Tile::at(do_t_lane, ks * 16, C::D_TILES - 1));  // unswizzled (HD 80)
            ldmatrix_x2_trans(qb, Tile::at(q_t_lane, ks * 16, C::D_TILES - 1));
            mma_16816(acc_dv[C::D_TILES - 1], pa, dob[0], dob[1]);
            mma_16816(acc_dk[C::D_TILES - 1], dsa, qb[0], qb[1]);
        }
    }

    // dSᵀ (bf16) to shared memory for the dQ product
#pragma unroll
    for (int nt = 0; nt < C::Q_TILES; nt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = key_row0 + g + 8 * half;
            *(uint32_t*)(ds_tile + DsTile::index(row, nt) + 2 * t4) = pack_bf16(dp[nt][2 * half], dp[nt][2 * half + 1]);
        }
}

// dQ_block = dS K for this warp's share of it, into acc_dq (zeroed here): DQ_MT m16 tiles of queries
// (row group dq_m) × DQ_TILES n8 tiles of head dims from chunk dq_chunk0, k = the BLOCK_N keys.
// A = dS (queries × keys) read transposed from dSᵀ at ds_buf_lane (the buffer's ds_lane); B = K
// read transposed at k_t_lane. The caller adds acc_dq into dq_accum its own way.
template <int HD, int BLOCK_M, int NWARPS, int DQ_MT, int DQ_TILES>
__device__ __forceinline__ void dq_block_product(float (&acc_dq)[DQ_MT][DQ_TILES][4], uint32_t ds_buf_lane,
                                                 uint32_t k_t_lane, int dq_m, int dq_chunk0) {
    typedef BackwardStepConfig<HD, BLOCK_M, NWARPS> C;
    typedef typename C::Tile Tile;
    typedef typename C::DsTile DsTile;
    static_assert(DQ_MT == C::DQ_MT && DQ_TILES == C::DQ_TILES, "acc_dq is this warp's share of dQ_block");
#pragma unroll
    for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DQ_TILES; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc_dq[mt][dt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::BLOCK_N / 16; ks++) {
        uint32_t dsa[DQ_MT][4];
#pragma unroll
        for (int mt = 0; mt < DQ_MT; mt++)
            ldmatrix_x4_trans(dsa[mt], DsTile::at(ds_buf_lane, ks * 16, (dq_m * DQ_MT + mt) * 2));
#pragma unroll
        for (int dp2 = 0; dp2 < DQ_TILES / 2; dp2++) {
            uint32_t kb[4];
            ldmatrix_x4_trans(kb, Tile::at(k_t_lane, ks * 16, dq_chunk0 + dp2 * 2));
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++) {
                mma_16816(acc_dq[mt][2 * dp2], dsa[mt], kb[0], kb[1]);
                mma_16816(acc_dq[mt][2 * dp2 + 1], dsa[mt], kb[2], kb[3]);
            }
        }
        if (DQ_TILES % 2) {
            uint32_t kb[2];
            ldmatrix_x2_trans(kb, Tile::at(k_t_lane, ks * 16, dq_chunk0 + DQ_TILES - 1));  // unswizzled
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++) mma_16816(acc_dq[mt][DQ_TILES - 1], dsa[mt], kb[0], kb[1]);
        }
    }
}

// After the last step: dK·scale and dV to bf16 in this warp's own 16 rows of the K and V tiles
// (the caller has made sure no warp still reads them), for 16-byte stores (store_tile) after a
// __syncwarp. (The stores stay in the kernels: with them in here ptxas spills more.)
template <int HD>
__device__ __forceinline__ void stage_dk_dv(const float (&acc_dk)[HD / 8][4], const float (&acc_dv)[HD / 8][4],
                                            __nv_bfloat16* k_tile, __nv_bfloat16* v_tile, int key_row0, float scale) {
    typedef SmemTile<HD> Tile;
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = key_row0 + g + 8 * half;
            *(uint32_t*)(k_tile + Tile::index(row, dt) + 2 * t4) =
                pack_bf16(acc_dk[dt][2 * half] * scale, acc_dk[dt][2 * half + 1] * scale);
            *(uint32_t*)(v_tile + Tile::index(row, dt) + 2 * t4) = pack_bf16(acc_dv[dt][2 * half], acc_dv[dt][2 * half + 1]);
        }
}

#endif  // ATTENTION_MMA_BACKWARD_STEP_CUH
