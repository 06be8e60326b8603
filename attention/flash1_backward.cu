// flash1_backward.cu: FlashAttention-1 backward (the reference's "Flash Attention 1" backward,
// Algorithm 4 of the FlashAttention paper) on mma.sync tensor cores.
//
// Inputs: q, k, v as the forward read them (attention.h layout), out and dout (B, T, NH, HD) at
// out_stride, lse (B, NH, T) from the forward. Outputs dq, dk, dv at dqkv_stride, overwritten.
// Workspace (fp32): dq_accum (B, NH, T, HD); nothing of size T².
//
// One thread block per (b, h) (grid = B·NH), one kernel, no pre- or post-pass:
//   for each key block j (BLOCK_N = 16·NWARPS keys; K_j, V_j in shared memory; dK_j, dV_j in registers)
//     for each query block i (BLOCK_M rows; Q_i, dO_i, O_i, LSE_i double-buffered with cp.async)
//       D_i = rowsum(dO_i ∘ O_i), recomputed here for every key block (FA1 has no pre-pass);
//       each warp, on its slice of 16 keys (the split of the forward): Sᵀ = K Qᵀ, Pᵀ = exp(Sᵀ − LSE)
//       (P recomputed from the saved LSE), dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D),
//       dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i;
//       dQ_i += dS K_j: the product sums over the keys of every warp, so the warps exchange dSᵀ
//       through shared memory (two buffers) and each warp forms a tile of dS K over all BLOCK_N
//       keys one step later, after the next step's first barrier. That tile is read-modified-written
//       in dq_accum in HBM (fp32, plain loads and stores: this block owns the whole (b, h), and each
//       element always belongs to the same thread, so no atomics are needed; key block 0, which
//       meets every query block, writes without reading).
//     dK_j·scale and dV_j to bf16 into dk, dv.
//   finally dq = dq_accum·scale in bf16, read back by the same block after a barrier.
// Causal: query blocks wholly before the key block are skipped; masking only on diagonal and
// end-of-sequence blocks.
#include <stdio.h>
#include <stdlib.h>

#include "../layers/cuda_common.h"
#include "backends.h"
#include "flash2_common.cuh"

void flash1_require_aligned(const void* ptr, long stride, const char* what);  // flash1_forward.cu

typedef struct {
    const __nv_bfloat16 *q, *k, *v, *out, *dout;
    const float* lse;
    __nv_bfloat16 *dq, *dk, *dv;
    float* dq_accum;  // (B, NH, T, HD)
    long qkv_stride, out_stride, dqkv_stride;
    int T, NH;
    float scale, scale_log2;
} Flash1BackwardParams;

template <int HD, int BLOCK_M, int NWARPS>
struct Flash1BackwardConfig {
    static constexpr int THREADS = NWARPS * 32;
    static constexpr int BLOCK_N = 16 * NWARPS;  // each warp owns 16 keys
    static constexpr int Q_TILES = BLOCK_M / 8;  // n8 tiles of Sᵀ (queries)
    static constexpr int D_TILES = HD / 8;
    static constexpr int D_STEPS = HD / 16;
    // dQ_i (BLOCK_M × HD) = dS K split over warps: DQ_M row groups of DQ_MT m16 tiles by DQ_N column
    // groups of DQ_TILES n8 tiles. Two m16 tiles per warp where the warps divide that way, so that
    // each K fragment feeds two MMAs.
    static constexpr int PAIR_ROWS = BLOCK_M / 32;  // row groups of two m16 tiles
    static constexpr bool DQ_PAIRS =
        PAIR_ROWS > 0 && NWARPS % PAIR_ROWS == 0 && D_TILES % (NWARPS / (PAIR_ROWS > 0 ? PAIR_ROWS : 1)) == 0;
    static constexpr int DQ_MT = DQ_PAIRS ? 2 : 1;
    static constexpr int DQ_M = BLOCK_M / (16 * DQ_MT);
    static constexpr int DQ_N = NWARPS / DQ_M;
    static constexpr int DQ_TILES = D_TILES / DQ_N;
    // D_i: THREADS_PER_ROW consecutive threads share one query row.
    static constexpr int THREADS_PER_ROW = THREADS / BLOCK_M;
    typedef SmemTile<HD> Tile;
    typedef SmemTile<BLOCK_M> DsTile;  // dSᵀ (BLOCK_N keys, BLOCK_M queries)
    static constexpr int KV_ELEMS = Tile::elems(BLOCK_N);
    static constexpr int QO_ELEMS = Tile::elems(BLOCK_M);
    static constexpr int DS_ELEMS = DsTile::elems(BLOCK_N);
    static constexpr size_t SMEM_BYTES =
        (size_t)(2 * KV_ELEMS + 6 * QO_ELEMS + 2 * DS_ELEMS) * sizeof(__nv_bfloat16) + 4 * BLOCK_M * sizeof(float);
    static_assert(NWARPS % DQ_M == 0 && D_TILES % DQ_N == 0, "dQ warp split");
    static_assert(!Tile::SWIZZLE || DQ_TILES % 2 == 0, "SmemTile::at needs even chunks in swizzled tiles");
    static_assert(BLOCK_M % 16 == 0, "query blocks are whole m16 tiles");
    static_assert(THREADS % BLOCK_M == 0 && THREADS_PER_ROW <= 32 && (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0,
                  "D_i: a power-of-two group of lanes per row");
};

template <int HD, int BLOCK_M, int NWARPS, bool CAUSAL>
__global__ void __launch_bounds__(NWARPS * 32, 1) flash1_backward_kernel(Flash1BackwardParams p) {
    typedef Flash1BackwardConfig<HD, BLOCK_M, NWARPS> C;
    typedef typename C::Tile Tile;
    typedef typename C::DsTile DsTile;
    constexpr int BLOCK_N = C::BLOCK_N;
    extern __shared__ __align__(128) __nv_bfloat16 smem[];
    __nv_bfloat16* k_tile = smem;                         // (BLOCK_N, HD)
    __nv_bfloat16* v_tile = k_tile + C::KV_ELEMS;         // (BLOCK_N, HD)
    __nv_bfloat16* q_tiles = v_tile + C::KV_ELEMS;        // 2 × (BLOCK_M, HD)
    __nv_bfloat16* do_tiles = q_tiles + 2 * C::QO_ELEMS;  // 2 × (BLOCK_M, HD)
    __nv_bfloat16* o_tiles = do_tiles + 2 * C::QO_ELEMS;  // 2 × (BLOCK_M, HD)
    __nv_bfloat16* ds_tiles = o_tiles + 2 * C::QO_ELEMS;  // 2 × (BLOCK_N, BLOCK_M): dSᵀ
    float* lse_tiles = (float*)(ds_tiles + 2 * C::DS_ELEMS);  // 2 × BLOCK_M: LSE, then LSE·log2 e
    float* d_tiles = lse_tiles + 2 * BLOCK_M;                 // 2 × BLOCK_M: D

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int bh = blockIdx.x, b = bh / p.NH, h = bh % p.NH;
    const int T = p.T;
    const long qkv_offset = (long)b * T * p.qkv_stride + (long)h * HD;
    const long out_offset = (long)b * T * p.out_stride + (long)h * HD;
    const long dqkv_offset = (long)b * T * p.dqkv_stride + (long)h * HD;
    const float* lse_head = p.lse + (long)bh * T;
    float* dq_head = p.dq_accum + (long)bh * T * HD;
    const int n_blocks = (T + BLOCK_N - 1) / BLOCK_N;
    const int m_blocks = (T + BLOCK_M - 1) / BLOCK_M;
    const int key_row0 = warp * 16;  // this warp's keys within the key block
    const int dq_m = warp % C::DQ_M, dq_n = warp / C::DQ_M;
    const int dq_chunk0 = dq_n * C::DQ_TILES;

    // Loads query block m (Q, dO, O, LSE) into buffer `buf`; rows past the end become zeros.
    auto load_query_block = [&](int m, int buf) {
        const int m0 = m * BLOCK_M;
        load_tile_async<BLOCK_M, HD, C::THREADS>(q_tiles + buf * C::QO_ELEMS, p.q + qkv_offset + (long)m0 * p.qkv_stride,
                                                 p.qkv_stride, T - m0);
        load_tile_async<BLOCK_M, HD, C::THREADS>(do_tiles + buf * C::QO_ELEMS,
                                                 p.dout + out_offset + (long)m0 * p.out_stride, p.out_stride, T - m0);
        load_tile_async<BLOCK_M, HD, C::THREADS>(o_tiles + buf * C::QO_ELEMS,
                                                 p.out + out_offset + (long)m0 * p.out_stride, p.out_stride, T - m0);
        for (int i = threadIdx.x; i < BLOCK_M; i += C::THREADS) {
            const bool valid = m0 + i < T;
            cp_async_4(lse_tiles + buf * BLOCK_M + i, valid ? lse_head + m0 + i : lse_head, valid ? 4 : 0);
        }
    };

    // D = rowsum(dO ∘ O) of the block in `buf` (fp32 from the bf16 tiles) and LSE into log2 units,
    // in place. Read by every warp after the step's second barrier.
    auto row_terms = [&](int buf) {
        const int row = threadIdx.x / C::THREADS_PER_ROW, part = threadIdx.x % C::THREADS_PER_ROW;
        const __nv_bfloat16* do_tile = do_tiles + buf * C::QO_ELEMS;
        const __nv_bfloat16* o_tile = o_tiles + buf * C::QO_ELEMS;
        float dot = 0.f;
        for (int chunk = part; chunk < HD / 8; chunk += C::THREADS_PER_ROW) {
            const uint4 d4 = *(const uint4*)(do_tile + Tile::index(row, chunk));
            const uint4 o4 = *(const uint4*)(o_tile + Tile::index(row, chunk));
            const __nv_bfloat162* d2 = (const __nv_bfloat162*)&d4;
            const __nv_bfloat162* o2 = (const __nv_bfloat162*)&o4;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 df = __bfloat1622float2(d2[e]), of = __bfloat1622float2(o2[e]);
                dot = fmaf(df.x, of.x, fmaf(df.y, of.y, dot));
            }
        }
#pragma unroll
        for (int off = 1; off < C::THREADS_PER_ROW; off *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (part == 0) {
            d_tiles[buf * BLOCK_M + row] = dot;
            lse_tiles[buf * BLOCK_M + row] *= FLASH2_LOG2E;
        }
    };

    const uint32_t k_a_lane = Tile::lane_base(k_tile, a_row(lane), a_chunk(lane));
    const uint32_t v_a_lane = Tile::lane_base(v_tile, a_row(lane), a_chunk(lane));
    const uint32_t k_t_lane = Tile::lane_base(k_tile, bt_row(lane), bt_chunk(lane));
    // dS read transposed, x4 matrices (queries 0-7, keys 0-7), (q 8-15, k 0-7), (q 0-7, k 8-15), (q 8-15, k 8-15)
    const uint32_t ds_lane = DsTile::lane_base(ds_tiles, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    // dQ_m += dS K from dS buffer dbuf: this warp's DQ_MT m16 tiles and DQ_TILES columns of dq_accum,
    // k = the BLOCK_N keys. The old values are all loaded before the first store, one latency for all
    // (loading them before the products instead would hold 32 more registers through them: spills).
    auto add_dq_block = [&](int m, int dbuf, bool overwrite) {
        float acc_dq[C::DQ_MT][C::DQ_TILES][4];
#pragma unroll
        for (int mt = 0; mt < C::DQ_MT; mt++)
#pragma unroll
            for (int dt = 0; dt < C::DQ_TILES; dt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc_dq[mt][dt][e] = 0.f;
        const uint32_t ds_buf_lane = ds_lane + dbuf * C::DS_ELEMS * 2;
#pragma unroll
        for (int ks = 0; ks < BLOCK_N / 16; ks++) {
            uint32_t dsa[C::DQ_MT][4];
#pragma unroll
            for (int mt = 0; mt < C::DQ_MT; mt++)
                ldmatrix_x4_trans(dsa[mt], DsTile::at(ds_buf_lane, ks * 16, (dq_m * C::DQ_MT + mt) * 2));
#pragma unroll
            for (int dp2 = 0; dp2 < C::DQ_TILES / 2; dp2++) {
                uint32_t kb[4];
                ldmatrix_x4_trans(kb, Tile::at(k_t_lane, ks * 16, dq_chunk0 + dp2 * 2));
#pragma unroll
                for (int mt = 0; mt < C::DQ_MT; mt++) {
                    mma_16816(acc_dq[mt][2 * dp2], dsa[mt], kb[0], kb[1]);
                    mma_16816(acc_dq[mt][2 * dp2 + 1], dsa[mt], kb[2], kb[3]);
                }
            }
            if (C::DQ_TILES % 2) {
                uint32_t kb[2];
                ldmatrix_x2_trans(kb, Tile::at(k_t_lane, ks * 16, dq_chunk0 + C::DQ_TILES - 1));  // unswizzled
#pragma unroll
                for (int mt = 0; mt < C::DQ_MT; mt++) mma_16816(acc_dq[mt][C::DQ_TILES - 1], dsa[mt], kb[0], kb[1]);
            }
        }
        if (!overwrite) {
#pragma unroll
            for (int mt = 0; mt < C::DQ_MT; mt++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int qi = m * BLOCK_M + (dq_m * C::DQ_MT + mt) * 16 + g + 8 * half;
                    const float* src = dq_head + (long)qi * HD + dq_chunk0 * 8 + 2 * t4;
#pragma unroll
                    for (int dt = 0; dt < C::DQ_TILES; dt++) {
                        const float2 old = qi < T ? *(const float2*)(src + dt * 8) : make_float2(0.f, 0.f);
                        acc_dq[mt][dt][2 * half] += old.x;
                        acc_dq[mt][dt][2 * half + 1] += old.y;
                    }
                }
        }
#pragma unroll
        for (int mt = 0; mt < C::DQ_MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int qi = m * BLOCK_M + (dq_m * C::DQ_MT + mt) * 16 + g + 8 * half;
                if (qi < T) {
                    float* dst = dq_head + (long)qi * HD + dq_chunk0 * 8 + 2 * t4;
#pragma unroll
                    for (int dt = 0; dt < C::DQ_TILES; dt++)
                        *(float2*)(dst + dt * 8) = make_float2(acc_dq[mt][dt][2 * half], acc_dq[mt][dt][2 * half + 1]);
                }
            }
    };

    for (int n = 0; n < n_blocks; n++) {
        const int n0 = n * BLOCK_N;
        const bool first = n == 0;  // key block 0 meets every query block: it writes dq_accum
        const int m_begin = CAUSAL ? n0 / BLOCK_M : 0;
        __syncthreads();  // every warp is done with the previous key block's tiles
        load_tile_async<BLOCK_N, HD, C::THREADS>(k_tile, p.k + qkv_offset + (long)n0 * p.qkv_stride, p.qkv_stride, T - n0);
        load_tile_async<BLOCK_N, HD, C::THREADS>(v_tile, p.v + qkv_offset + (long)n0 * p.qkv_stride, p.qkv_stride, T - n0);
        load_query_block(m_begin, 0);
        cp_async_commit();

        float acc_dk[C::D_TILES][4], acc_dv[C::D_TILES][4];  // rows g, g+8 of this warp's 16 keys
#pragma unroll
        for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;

        for (int m = m_begin; m < m_blocks; m++) {
            const int m0 = m * BLOCK_M, buf = (m - m_begin) & 1;
            const __nv_bfloat16* q_tile = q_tiles + buf * C::QO_ELEMS;
            const __nv_bfloat16* do_tile = do_tiles + buf * C::QO_ELEMS;
            const uint32_t q_b_lane = Tile::lane_base(q_tile, b_row(lane), b_chunk(lane));
            const uint32_t do_b_lane = Tile::lane_base(do_tile, b_row(lane), b_chunk(lane));
            const uint32_t q_t_lane = Tile::lane_base(q_tile, bt_row(lane), bt_chunk(lane));
            const uint32_t do_t_lane = Tile::lane_base(do_tile, bt_row(lane), bt_chunk(lane));
            // Barrier A publishes block m (and K, V) and the dS of step m-1, and frees the other
            // buffers (every warp has left step m-1), so the prefetch of block m+1 goes after it.
            cp_async_wait<0>();
            __syncthreads();
            if (m + 1 < m_blocks) load_query_block(m + 1, buf ^ 1);
            cp_async_commit();
            row_terms(buf);
            if (m > m_begin) add_dq_block(m - 1, buf ^ 1, first);

            // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, 16 keys × BLOCK_M queries per warp
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
            __syncthreads();  // barrier B: D and LSE·log2 e of block m are in shared memory

            // Pᵀ = exp2(Sᵀ·scale_log2 − LSE·log2 e); dSᵀ = Pᵀ ∘ (dPᵀ − D). Masked entries get P = 0.
            const float* lse_tile = lse_tiles + buf * BLOCK_M;
            const float* d_tile = d_tiles + buf * BLOCK_M;
            const bool needs_mask = m0 + BLOCK_M > T || n0 + BLOCK_N > T || (CAUSAL && n0 + BLOCK_N - 1 > m0);
#pragma unroll
            for (int nt = 0; nt < C::Q_TILES; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = n0 + key_row0 + g + (e >= 2 ? 8 : 0);
                    const int qi = nt * 8 + 2 * t4 + (e & 1);
                    float pe = fast_exp2(fmaf(s[nt][e], p.scale_log2, -lse_tile[qi]));
                    if (needs_mask && (key >= T || m0 + qi >= T || (CAUSAL && key > m0 + qi))) pe = 0.f;
                    s[nt][e] = pe;
                    dp[nt][e] = pe * (dp[nt][e] - d_tile[qi]);
                }

            // dV += Pᵀ dO and dK += dSᵀ Q (k = queries), A operands straight from the accumulators
#pragma unroll
            for (int ks = 0; ks < BLOCK_M / 16; ks++) {
                uint32_t pa[4], dsa[4];
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

            // dSᵀ (bf16) to shared memory for the dQ product of the next step
#pragma unroll
            for (int nt = 0; nt < C::Q_TILES; nt++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int row = key_row0 + g + 8 * half;
                    *(uint32_t*)(ds_tiles + buf * C::DS_ELEMS + DsTile::index(row, nt) + 2 * t4) =
                        pack_bf16(dp[nt][2 * half], dp[nt][2 * half + 1]);
                }
        }
        __syncthreads();  // the last dS is in shared memory
        add_dq_block(m_blocks - 1, (m_blocks - 1 - m_begin) & 1, first);
        cp_async_wait<0>();
        __syncthreads();  // every warp is done reading K and V: their tiles now stage dK and dV

        // dK·scale and dV to bf16 in this warp's own rows of the K and V tiles, then 16-byte stores.
#pragma unroll
        for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int row = key_row0 + g + 8 * half;
                *(uint32_t*)(k_tile + Tile::index(row, dt) + 2 * t4) =
                    pack_bf16(acc_dk[dt][2 * half] * p.scale, acc_dk[dt][2 * half + 1] * p.scale);
                *(uint32_t*)(v_tile + Tile::index(row, dt) + 2 * t4) =
                    pack_bf16(acc_dv[dt][2 * half], acc_dv[dt][2 * half + 1]);
            }
        __syncwarp();
        const long key_offset = dqkv_offset + (long)(n0 + key_row0) * p.dqkv_stride;
        store_tile<16, HD, 32>(p.dk + key_offset, p.dqkv_stride, k_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                               warp * 32);
        store_tile<16, HD, 32>(p.dv + key_offset, p.dqkv_stride, v_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                               warp * 32);
    }

    // dq = bf16(dq_accum · scale), 8 values per thread and step. The barrier makes every warp's
    // last read-modify-write of dq_accum visible to the whole block.
    __syncthreads();
    const long chunks = (long)T * (HD / 8);
    for (long i = threadIdx.x; i < chunks; i += C::THREADS) {
        const int t = (int)(i / (HD / 8)), chunk = (int)(i % (HD / 8));
        const float4* src = (const float4*)(dq_head + (long)t * HD + chunk * 8);
        const float4 x = src[0], y = src[1];
        uint4 packed;
        packed.x = pack_bf16(x.x * p.scale, x.y * p.scale);
        packed.y = pack_bf16(x.z * p.scale, x.w * p.scale);
        packed.z = pack_bf16(y.x * p.scale, y.y * p.scale);
        packed.w = pack_bf16(y.z * p.scale, y.w * p.scale);
        *(uint4*)(p.dq + dqkv_offset + (long)t * p.dqkv_stride + chunk * 8) = packed;
    }
}

// ---- launch -------------------------------------------------------------------------------------
template <int HD, int BLOCK_M, int NWARPS, bool CAUSAL>
static void launch_flash1_backward(const Flash1BackwardParams* p, int B, cudaStream_t stream) {
    typedef Flash1BackwardConfig<HD, BLOCK_M, NWARPS> C;
    launch_with_smem<flash1_backward_kernel<HD, BLOCK_M, NWARPS, CAUSAL>>(
        B * p->NH, C::THREADS, C::SMEM_BYTES, stream, *p);
}

// ---- block shapes per head dim ------------------------------------------------------------------
// (query rows per step, warps of 16 keys): 8 warps, 128 keys per key block, which is as many keys
// as the registers hold dK and dV for; query steps as long as registers allow (those of flash2's
// backward, whose per-warp work is the same).
template <bool CAUSAL>
static void dispatch_flash1_backward(const Flash1BackwardParams* p, int B, int HD, cudaStream_t stream) {
    switch (HD) {
        case 64: launch_flash1_backward<64, 128, 8, CAUSAL>(p, B, stream); break;
        case 80: launch_flash1_backward<80, 64, 8, CAUSAL>(p, B, stream); break;
        case 96: launch_flash1_backward<96, 64, 8, CAUSAL>(p, B, stream); break;
        case 128: launch_flash1_backward<128, 64, 8, CAUSAL>(p, B, stream); break;
    }
}

void flash1_attention_backward(const AttentionArgs* args, cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    flash1_require_aligned(args->q, args->qkv_stride, "q");
    flash1_require_aligned(args->k, args->qkv_stride, "k");
    flash1_require_aligned(args->v, args->qkv_stride, "v");
    flash1_require_aligned(args->out, args->out_stride, "out");
    flash1_require_aligned(args->dout, args->out_stride, "dout");
    flash1_require_aligned(args->dq, args->dqkv_stride, "dq");
    flash1_require_aligned(args->dk, args->dqkv_stride, "dk");
    flash1_require_aligned(args->dv, args->dqkv_stride, "dv");
    flash1_require_aligned(args->workspace, 8, "the workspace");
    Flash1BackwardParams p;
    p.q = args->q;
    p.k = args->k;
    p.v = args->v;
    p.out = args->out;
    p.dout = args->dout;
    p.lse = args->lse;
    p.dq = args->dq;
    p.dk = args->dk;
    p.dv = args->dv;
    p.dq_accum = (float*)args->workspace;
    p.qkv_stride = args->qkv_stride;
    p.out_stride = args->out_stride;
    p.dqkv_stride = args->dqkv_stride;
    p.T = s->T;
    p.NH = s->NH;
    p.scale = 1.f / sqrtf((float)s->HD);
    p.scale_log2 = p.scale * FLASH2_LOG2E;
    if (s->causal) dispatch_flash1_backward<true>(&p, s->B, s->HD, stream);
    else dispatch_flash1_backward<false>(&p, s->B, s->HD, stream);
}
