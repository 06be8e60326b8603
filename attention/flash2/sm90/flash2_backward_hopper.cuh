// flash2_backward_hopper.cuh: the flash2 backward (Algorithm 2 of the paper) on Hopper, warp-specialized
// (sm_90a), head dims 64, 80, 96 and 128. Inputs and outputs as flash2_backward_kernel.cuh (q, k, v,
// out, dout, lse in; dq, dk, dv out, overwritten); the workspace is laid out here (below).
//
// One thread block per (key block of 128 keys, b·NKV + kv head), started in backward_block_at's
// order, three warpgroups; its steps are the query blocks of each query head of the K/V head's
// group in turn (grouped-query attention: K and V loaded once, dK and dV summed over the group in
// registers; G = NH / NKV times the steps):
//   warpgroup 0  gives its registers away (setmaxnreg); one thread loads K and V once, then, per
//                query block of BLOCK_M rows, Q with LSE·log2 e and dO with D = rowsum(dO ∘ O) into
//                a two-slot ring (TMA and bulk copies; "full" mbarriers, and one "empty" per slot that
//                every consumer thread arrives at); another thread
//                adds each step's dQ tile from shared memory into the fp32 dq_accum with one bulk
//                reduction (cp.reduce.async.bulk .add.f32), so no compute warp waits on atomics; the
//                first contribution to a query block is a plain bulk store instead (a ticket from the
//                block's counter says who is first), so dq_accum is never zeroed.
//   warpgroups 1, 2 own 64 keys each, with dK and dV (64 × HD each) in registers for the whole loop:
//                Sᵀ = K Qᵀ, dPᵀ = V dOᵀ            wgmma, both operands from shared memory
//                Pᵀ (while dPᵀ runs), dSᵀ = Pᵀ ∘ (dPᵀ − D)      attention_math.cuh
//                dSᵀ → shared memory (for dQ, and for dK where DK_FROM_SMEM)
//                dV += Pᵀ dO, dK += dSᵀ Q          wgmma, A from registers (dK: or shared memory)
//                dQ(m−1) = dS(m−1) K               issued behind them (BWD_DQ_FIRST: before them),
//                                                  from the other dSᵀ buffer (both warpgroups'
//                                                  keys; mbarriers between them)
//                dQ(m−1) → shared memory (fragment order), handed to the reducing thread.
//                BWD_PINGPONG: the two take turns issuing each batch of products (named barriers).
// Deterministic mode: the reducing thread of key block n adds to query block m only after key
// blocks 0..n−1 have (a counter per query block; key block 0 stores), so dq_accum is summed in a
// fixed order; the launch order (backward_block_at) starts key block n−1 of a pair before key block
// n, so a block never waits on one that has not started.
//
// Around it, one pass before (the prepare kernel: the counters zeroed, D and LSE·log2 e) and one
// after (the convert kernel: dq from dq_accum), each a thread block per (b·NH + h, query block).
// Workspace (flash2_backward_ws_workspace_bytes), T_pad = T rounded up to whole query blocks:
//   dq_accum (B·NH, m_blocks, DQ_SLOTS) fp32, each query block's dQ in the compute threads'
//            fragment order (conflict-free shared-memory writes, one contiguous bulk reduction);
//            the convert kernel turns it into bf16 dq (B, T, NH, HD).
//   D, LSE·log2 e (B·NH, T_pad) fp32 each, zero past T; counters (B·NH, m_blocks) int.
#ifndef FLASH2_BACKWARD_HOPPER_CUH
#define FLASH2_BACKWARD_HOPPER_CUH

#include <type_traits>

#include "attention/common/attention_math.cuh"
#include "attention/common/cuda_check.h"
#include "attention/flash2/flash2_params.h"
#include "attention/flash2/flash2_rowsum.cuh"
#include "attention/flash2/flash2_tiles.h"
#include "attention/flash2/sm90/flash2_backward_order.h"
#include "attention/flash2/sm90/tensor_map.h"
#include "attention/flash2/sm90/wgmma.cuh"

typedef struct {
    CUtensorMap q, k, v, dout;  // boxes: BLOCK_M, 128, 128 and BLOCK_M rows (tensor_map.h)
} Flash2BackwardMaps;

typedef struct {
    __nv_bfloat16 *dk, *dv;  // rows (b, t, kv head) at dkv_stride
    float* dq_accum;         // (B·NH, m_blocks, DQ_SLOTS)
    const float* d_rows;     // (B·NH, T_pad)
    const float* lse_log2;   // (B·NH, T_pad)
    int* dq_counters;        // (B·NH, m_blocks), zero at launch
    long dkv_stride;
    int T, T_pad, NH, NKV, m_blocks;
    int key_blocks, pairs, order_chunk, order_tail;  // launch order: backward_order_chunk, backward_order_tail
    float scale, scale_log2;
} Flash2BackwardWsParams;

template <int HD, int BLOCK_M_>
struct Flash2BackwardWsConfig {
    static constexpr int BLOCK_M = BLOCK_M_, BLOCK_N = 128, THREADS = 384, STAGES = 2;
    typedef WgTile<BLOCK_N, HD> KvTile;
    typedef WgTile<BLOCK_M, HD> QoTile;
    typedef WgTile<BLOCK_N, BLOCK_M> DsTile;  // dSᵀ (keys × queries)
    // Registers: the launch gives every thread 168 (65536 / 384, rounded down to 8); setmaxnreg moves
    // them from the producer warpgroup to the consumers, within that pool.
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
    // dQ (BLOCK_M × HD) = dS K as one 64 × DQ_N product per warpgroup: at BLOCK_M 128 (head dim 64)
    // warpgroup w takes queries 64w.., all columns; at BLOCK_M 64 it takes columns DQ_COL0·w..:
    // 64 + 64 at head dim 128, 48 + 48 at 96, and at 80 columns 0-47 and 32-79 (a product spans whole
    // 16-column sub-tiles), where the convert kernel reads 32-47 from warpgroup 0.
    static constexpr bool DQ_M_SPLIT = BLOCK_M == 128;
    static constexpr int DQ_N = DQ_M_SPLIT ? HD : HD == 128 ? 64 : 48;
    static constexpr int DQ_COL0 = DQ_M_SPLIT ? 0 : HD - DQ_N;  // warpgroup 1's first column
    static constexpr int DQ_SLOTS = 2 * 128 * (DQ_N / 2);      // floats per query block
    static constexpr uint32_t KV_BYTES = KvTile::ELEMS * 2, QO_BYTES = QoTile::ELEMS * 2, DS_BYTES = DsTile::ELEMS * 2;
    static constexpr uint32_t STAT_BYTES = BLOCK_M * 4, DQ_BYTES = DQ_SLOTS * 4;
    // kv_full; q_full, do_full, slot_empty per stage; dq_full, dq_empty; ds_ready, ds_free × 2
    static constexpr int BARRIERS = 1 + 3 * STAGES + 2 + 4;
    // One dQ staging tile: a second one, where shared memory allows, gains nothing
    // (attention/PERF_NOTES.md).
    static constexpr size_t SMEM_BYTES = 1024 /* alignment slack */ + 2 * KV_BYTES +
                                         STAGES * (2 * QO_BYTES + 2 * STAT_BYTES) + 2 * DS_BYTES + DQ_BYTES +
                                         8 * BARRIERS;
    static_assert(BLOCK_M == 64 || (BLOCK_M == 128 && HD == 64), "BLOCK_M 128 at head dim 64, else 64");
    static_assert(HD == 64 || HD == 80 || HD == 96 || HD == 128, "head dims 64, 80, 96, 128");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= (65536 / THREADS / 8 * 8) * THREADS, "register pool");
};

// The order of a consumer warpgroup's products within a step: BWD_DQ_FIRST, BWD_PINGPONG (flash2_tiles.h).
constexpr int BWD_TURN_BARRIER = 3;  // named barriers 3, 4: the turns (1, 2: DK_FROM_SMEM's dSᵀ writes)

template <typename C>
struct Flash2BackwardSmem {
    __nv_bfloat16 *k, *v, *q, *dout, *ds;  // K, V; STAGES × Q, dO; 2 × dSᵀ
    float *lse, *d, *dq;                    // STAGES × BLOCK_M each; DQ_SLOTS
    uint64_t *kv_full, *q_full, *do_full, *slot_empty, *dq_full, *dq_empty, *ds_ready, *ds_free;
};

template <typename C>
__device__ __forceinline__ Flash2BackwardSmem<C> backward_smem(uint8_t* raw) {
    uint8_t* base = raw + (((smem_address(raw) + 1023) & ~1023u) - smem_address(raw));
    Flash2BackwardSmem<C> sm;
    sm.k = (__nv_bfloat16*)base;
    sm.v = (__nv_bfloat16*)(base + C::KV_BYTES);
    sm.q = (__nv_bfloat16*)(base + 2 * C::KV_BYTES);
    sm.dout = (__nv_bfloat16*)(base + 2 * C::KV_BYTES + C::STAGES * C::QO_BYTES);
    sm.ds = (__nv_bfloat16*)(base + 2 * C::KV_BYTES + 2 * C::STAGES * C::QO_BYTES);
    sm.dq = (float*)(base + 2 * C::KV_BYTES + 2 * C::STAGES * C::QO_BYTES + 2 * C::DS_BYTES);
    sm.lse = sm.dq + C::DQ_SLOTS;
    sm.d = sm.lse + C::STAGES * C::BLOCK_M;
    sm.kv_full = (uint64_t*)(sm.d + C::STAGES * C::BLOCK_M);
    sm.q_full = sm.kv_full + 1;
    sm.do_full = sm.q_full + C::STAGES;
    sm.slot_empty = sm.do_full + C::STAGES;
    sm.dq_full = sm.slot_empty + C::STAGES;
    sm.dq_empty = sm.dq_full + 1;
    sm.ds_ready = sm.dq_empty + 1;
    sm.ds_free = sm.ds_ready + 2;
    return sm;
}

// A key block's walk over the query blocks of each query head of its group: m_first, ..., m_blocks − 1,
// then m_lo, ..., m_first − 1, then the next head (h + 1). Causal starts at the first query block
// that sees these keys (m_lo = m_first); non-causal, key block n starts n/key_blocks of the way in, so
// that the key blocks of one head reach a query block at different times (its first contribution
// to dq_accum is a store the others wait for: backward_reduce_dq), except in deterministic mode,
// where key block n adds after n − 1 and all start at 0.
__device__ __forceinline__ int next_query_block(int m, int m_first, int m_lo, int m_blocks, int& h) {
    m = m + 1 < m_blocks ? m + 1 : m_lo;
    if (m == m_first) h++;
    return m;
}

#if WGMMA_AVAILABLE
// One thread: K and V once, then per step Q + LSE and dO + D through the two-slot ring. Step j is
// the j-th of the walk (next_query_block).
template <typename C, int HD>
__device__ __forceinline__ void backward_produce(const Flash2BackwardMaps& maps, const Flash2BackwardWsParams& p,
                                                 const Flash2BackwardSmem<C>& sm, int n0, int b, int kv_head, int h0,
                                                 int m_first, int m_lo, int steps) {
    constexpr int BLOCK_M = C::BLOCK_M;
    mbar_arrive_expect_tx(sm.kv_full, 2 * C::KV_BYTES);
    tma_load_tile<typename C::KvTile, HD>(sm.k, &maps.k, sm.kv_full, kv_head, n0, b);
    tma_load_tile<typename C::KvTile, HD>(sm.v, &maps.v, sm.kv_full, kv_head, n0, b);
#pragma unroll 1  // 24 registers here: an unrolled loop spills
    // (h, m) counted along (no division: this thread has few registers)
    for (int j = 0, h = h0, m = m_first; j < steps; j++, m = next_query_block(m, m_first, m_lo, p.m_blocks, h)) {
        const long stat_head = ((long)b * p.NH + h) * p.T_pad;
        const int stage = j % C::STAGES, phase = (j / C::STAGES) & 1, m0 = m * BLOCK_M;
        mbar_wait(&sm.slot_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&sm.q_full[stage], C::QO_BYTES + C::STAT_BYTES);
        tma_load_tile<typename C::QoTile, HD>(sm.q + stage * C::QoTile::ELEMS, &maps.q, &sm.q_full[stage], h, m0, b);
        bulk_load(sm.lse + stage * BLOCK_M, p.lse_log2 + stat_head + m0, C::STAT_BYTES, &sm.q_full[stage]);
        mbar_arrive_expect_tx(&sm.do_full[stage], C::QO_BYTES + C::STAT_BYTES);
        tma_load_tile<typename C::QoTile, HD>(sm.dout + stage * C::QoTile::ELEMS, &maps.dout, &sm.do_full[stage], h,
                                              m0, b);
        bulk_load(sm.d + stage * BLOCK_M, p.d_rows + stat_head + m0, C::STAT_BYTES, &sm.do_full[stage]);
    }
}

// One thread: each step's dQ tile (shared) into dq_accum (global). The first contribution to a query
// block is stored, the others added, so dq_accum needs no zeroing pass: in key-block order if
// DETERMINISTIC (key block 0, which every query block sees, stores); otherwise the first to take a
// ticket from the block's counter stores and then sets DQ_STORED there, and the others wait for that
// bit before adding. The ticket and the waits come before the step's dQ tile is ready, so that their
// latency passes while the consumers compute it.
#define DQ_STORED (1 << 30)
template <typename C, bool DETERMINISTIC>
__device__ __forceinline__ void backward_reduce_dq(const Flash2BackwardWsParams& p, const Flash2BackwardSmem<C>& sm,
                                                   int n_block, int b, int h0, int m_first, int m_lo, int steps) {
#pragma unroll 1
    for (int j = 0, h = h0, m = m_first; j < steps; j++, m = next_query_block(m, m_first, m_lo, p.m_blocks, h)) {
        const long bh = (long)b * p.NH + h;
        float* dst = p.dq_accum + ((long)bh * p.m_blocks + m) * C::DQ_SLOTS;
        int* counter = p.dq_counters + (long)bh * p.m_blocks + m;
        bool first;
        if (DETERMINISTIC) {
            while (load_acquire(counter) != n_block) {
            }
            first = n_block == 0;
        } else {
            first = fetch_add_relaxed(counter, 1) == 0;
            if (!first)
                while ((load_acquire(counter) & DQ_STORED) == 0) {
                }
        }
        mbar_wait(sm.dq_full, j & 1);
        fence_proxy_async_global();  // the async writes below come after what the counter announced
        if (first) bulk_store(dst, sm.dq, C::DQ_BYTES);
        else bulk_reduce_add_f32(dst, sm.dq, C::DQ_BYTES);
        bulk_commit();
        bulk_wait_read();
        mbar_arrive(sm.dq_empty);  // the consumers may write the next dQ tile
        if (DETERMINISTIC || first) {
            bulk_wait_all();
            fence_proxy_async_global();
            add_release(counter, DETERMINISTIC ? 1 : DQ_STORED);
        }
    }
}

// Two words of one row, n-tiles nt and nt + 1 (columns 8nt + 2t4 and 8nt + 8 + 2t4 of each quad
// lane t4), traded within the quad so that lane t4 = 2a + c ends with columns 8(nt + a) + 4c .. + 3:
// 8 contiguous bytes a lane, a whole 32-byte sector a quad (the fragment layout stores 16 bytes a
// quad per row: half of every store sector). Two shuffles per pair of words.
__device__ __forceinline__ uint2 quad_gather_columns(uint32_t w_nt, uint32_t w_next, int t4) {
    const int a = t4 >> 1, c = t4 & 1;
    const uint32_t keep = a ? w_next : w_nt;  // n-tile nt + a: this lane's part of it stays
    const uint32_t got = __shfl_xor_sync(0xffffffffu, a ? w_nt : w_next, 2);  // lane t4 ^ 2's part of it
    // keep, got: n-tile nt + a of lanes 2a + c and 2(1 − a) + c. This lane needs that n-tile's words
    // of lanes 2c and 2c + 1: one it has (from lane 2c + c), the other lane t4 ^ 1 has.
    const uint32_t mine = c == a ? keep : got;
    const uint32_t theirs = __shfl_xor_sync(0xffffffffu, c == a ? got : keep, 1);
    return c ? make_uint2(theirs, mine) : make_uint2(mine, theirs);
}

// dK·scale and dV from the accumulators: rows key and key + 8 of this thread, K/V head h.
template <int HD>
__device__ __forceinline__ void backward_store_dkdv(const Flash2BackwardWsParams& p, const float (&acc_dk)[HD / 2],
                                                    const float (&acc_dv)[HD / 2], int key, int b, int h) {
    static_assert(HD % 16 == 0, "n-tiles are stored in pairs");
    const int t4 = threadIdx.x % 4;
    const int col = 8 * (t4 >> 1) + 4 * (t4 & 1);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const bool row_in = key + 8 * half < p.T;  // the shuffles run on every lane; the stores only here
        const long offset = ((long)b * p.T + key + 8 * half) * p.dkv_stride + (long)h * HD + col;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt += 2) {
            const int i = 4 * nt + 2 * half, j = i + 4;  // n-tiles nt and nt + 1
            const uint2 dk = quad_gather_columns(pack_bf16(acc_dk[i] * p.scale, acc_dk[i + 1] * p.scale),
                                                 pack_bf16(acc_dk[j] * p.scale, acc_dk[j + 1] * p.scale), t4);
            const uint2 dv = quad_gather_columns(pack_bf16(acc_dv[i], acc_dv[i + 1]),
                                                 pack_bf16(acc_dv[j], acc_dv[j + 1]), t4);
            if (row_in) {
                *(uint2*)(p.dk + offset + nt * 8) = dk;
                *(uint2*)(p.dv + offset + nt * 8) = dv;
            }
        }
    }
}

// This thread's dSᵀ A fragments (keys × 16 queries per k-step) into the dSᵀ tile. The fragment
// a[0..3] holds (row, 2t), (row + 8, 2t), (row, 2t + 8), (row + 8, 2t + 8) of queries 16·kq...
template <typename DsTile, int KSTEPS>
__device__ __forceinline__ void store_ds(__nv_bfloat16* ds_tile, const uint32_t (&dsa)[KSTEPS][4], int ds_row) {
    const int t4 = threadIdx.x % 4;
#pragma unroll
    for (int kq = 0; kq < KSTEPS; kq++) {
        *(uint32_t*)(ds_tile + DsTile::index(ds_row, 2 * kq) + 2 * t4) = dsa[kq][0];
        *(uint32_t*)(ds_tile + DsTile::index(ds_row + 8, 2 * kq) + 2 * t4) = dsa[kq][1];
        *(uint32_t*)(ds_tile + DsTile::index(ds_row, 2 * kq + 1) + 2 * t4) = dsa[kq][2];
        *(uint32_t*)(ds_tile + DsTile::index(ds_row + 8, 2 * kq + 1) + 2 * t4) = dsa[kq][3];
    }
}

// Consumer warpgroup cw: keys n0 + 64·cw ..., the query blocks of each query head of the group in
// next_query_block's order (`steps` in all; the heads differ only in what the producer loaded).
// DK_FROM_SMEM: dK += dSᵀ Q reads dSᵀ from shared memory instead of registers (flash2_tiles.h).
template <typename C, int HD, bool CAUSAL, bool DK_FROM_SMEM, int SCHED>
__device__ __forceinline__ void backward_consume(const Flash2BackwardWsParams& p, const Flash2BackwardSmem<C>& sm,
                                                 int cw, int n0, int b, int kv_head, int m_first, int m_lo, int steps) {
    typedef typename C::KvTile KvTile;
    typedef typename C::QoTile QoTile;
    typedef typename C::DsTile DsTile;
    constexpr int BLOCK_M = C::BLOCK_M, DQ_N = C::DQ_N, KSTEPS = BLOCK_M / 16;
    const int tid = threadIdx.x % 128, t4 = tid % 4, lane = tid % 32;
    const int ds_row = cw * 64 + (tid / 32) * 16 + lane / 4, key = n0 + ds_row;  // rows key, key + 8
    const uint32_t wg_rows = KvTile::row_offset(cw * 64);
    const uint32_t k_addr = smem_address(sm.k), v_addr = smem_address(sm.v);
    const uint64_t k_desc = KvTile::k_major(k_addr + wg_rows), v_desc = KvTile::k_major(v_addr + wg_rows);
    const uint32_t q_addr0 = smem_address(sm.q), do_addr0 = smem_address(sm.dout), ds_addr0 = smem_address(sm.ds);
    const int dq_row0 = C::DQ_M_SPLIT ? cw * 64 : 0, dq_col0 = cw * C::DQ_COL0;

    float acc_dk[HD / 2], acc_dv[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc_dk[i] = acc_dv[i] = 0.f;

    // dQ = dS K from dSᵀ buffer dbuf: A = dS (queries × keys) is MN-major in dSᵀ; B = K MN-major.
    auto issue_dq = [&](float (&acc_dq)[DQ_N / 2], int dbuf) {
        const uint32_t a0 = ds_addr0 + dbuf * C::DS_BYTES + (dq_row0 / 64) * DsTile::SUB_BYTES;
        const uint32_t b0 = k_addr + (dq_col0 / KvTile::SUB_COLS) * KvTile::SUB_BYTES;
        const uint64_t a_desc = DsTile::mn_major(a0), b_desc = KvTile::mn_major(b0);
#pragma unroll
        for (int ks = 0; ks < C::BLOCK_N / 16; ks++)
            wgmma_ss<DQ_N, 1, 1>(acc_dq, DsTile::advance(a_desc, DsTile::mn_step(ks)),
                                 KvTile::advance(b_desc, KvTile::mn_step(ks)), ks > 0);
    };
    // dQ of step j into the shared staging tile, in fragment order, then to the reducing thread.
    auto hand_over_dq = [&](const float (&acc_dq)[DQ_N / 2], int j) {
        mbar_wait(sm.dq_empty, (j & 1) ^ 1);
#pragma unroll
        for (int nt = 0; nt < DQ_N / 8; nt++)
            *(float4*)(sm.dq + ((cw * (DQ_N / 8) + nt) * 128 + tid) * 4) =
                make_float4(acc_dq[4 * nt], acc_dq[4 * nt + 1], acc_dq[4 * nt + 2], acc_dq[4 * nt + 3]);
        fence_proxy_async();  // the bulk reduction reads these through the async proxy
        __syncwarp();
        if (lane == 0) mbar_arrive(sm.dq_full);
    };

    // BWD_PINGPONG: wait for this warpgroup's turn to issue products / hand the turn to the other.
    auto my_turn = [&]() {
        if constexpr ((SCHED & BWD_PINGPONG) != 0) named_barrier_sync(BWD_TURN_BARRIER + cw, 256);
    };
    auto their_turn = [&]() {
        if constexpr ((SCHED & BWD_PINGPONG) != 0) named_barrier_arrive(BWD_TURN_BARRIER + (cw ^ 1), 256);
    };
    constexpr bool DQ_FIRST = (SCHED & BWD_DQ_FIRST) != 0;

    // One step: query block m, the j-th of this key block. FIRST (a compile-time tag) has no dQ of
    // a previous step to issue; peeling it keeps every wgmma and every wait unconditional, which
    // ptxas needs to keep the products in flight rather than serialize them.
    auto step = [&](int m, int j, auto first_tag) {
        constexpr bool FIRST = decltype(first_tag)::value;
        const int stage = j % C::STAGES, phase = (j / C::STAGES) & 1, m0 = m * BLOCK_M;
        const uint32_t q_addr = q_addr0 + stage * C::QO_BYTES, do_addr = do_addr0 + stage * C::QO_BYTES;
        const uint64_t q_mn_desc = QoTile::mn_major(q_addr), do_mn_desc = QoTile::mn_major(do_addr);
        float s[BLOCK_M / 2], dp[BLOCK_M / 2];
        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: 64 keys × BLOCK_M queries, k = HD
        mbar_wait(&sm.q_full[stage], phase);
        mbar_wait(&sm.do_full[stage], phase);
        my_turn();
        wgmma_fence();
        const uint64_t q_desc = QoTile::k_major(q_addr), do_desc = QoTile::k_major(do_addr);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_M, 0, 0>(s, KvTile::advance(k_desc, KvTile::k_step(ks)),
                                    QoTile::advance(q_desc, QoTile::k_step(ks)), ks > 0);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_M, 0, 0>(dp, KvTile::advance(v_desc, KvTile::k_step(ks)),
                                    QoTile::advance(do_desc, QoTile::k_step(ks)), ks > 0);
        wgmma_commit();
        their_turn();
        // Pᵀ while dPᵀ is still being computed, then dSᵀ
        wgmma_wait<1>();
        wgmma_fence_registers(s);
        const bool masked = m0 + BLOCK_M > p.T || n0 + C::BLOCK_N > p.T || (CAUSAL && n0 + C::BLOCK_N - 1 > m0);
        // two copies, so that the blocks without a mask (most of them) skip its compares and selects
        // instead of issuing them predicated off
        if (masked)
            probs_from_scores<BLOCK_M / 8, CAUSAL>(s, key, m0 + 2 * t4, p.T, true, sm.lse + stage * BLOCK_M + 2 * t4,
                                                   p.scale_log2);
        else
            probs_from_scores<BLOCK_M / 8, CAUSAL>(s, key, m0 + 2 * t4, p.T, false, sm.lse + stage * BLOCK_M + 2 * t4,
                                                   p.scale_log2);
        uint32_t pa[KSTEPS][4], dsa[KSTEPS][4];
#pragma unroll
        for (int kq = 0; kq < KSTEPS; kq++) accumulators_to_a(pa[kq], &s[8 * kq], &s[8 * kq + 4]);
        wgmma_wait<0>();
        wgmma_fence_registers(dp);
        dscores_from_probs<BLOCK_M / 8>(dp, s, sm.d + stage * BLOCK_M + 2 * t4);
#pragma unroll
        for (int kq = 0; kq < KSTEPS; kq++) accumulators_to_a(dsa[kq], &dp[8 * kq], &dp[8 * kq + 4]);
        // dSᵀ(j) into buffer j % 2, once both warpgroups' dQ(j − 2) has read it
        mbar_wait(&sm.ds_free[j & 1], ((j >> 1) & 1) ^ 1);
        store_ds<DsTile, KSTEPS>(sm.ds + (j & 1) * DsTile::ELEMS, dsa, ds_row);
        fence_proxy_async();  // read next by wgmma, i.e. the async proxy
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.ds_ready[j & 1]);
        if constexpr (DK_FROM_SMEM)
            named_barrier_sync(1 + cw, 128);  // this warpgroup's rows of dSᵀ are all written

        // dV += Pᵀ dO and dK += dSᵀ Q (Pᵀ from registers, dSᵀ too or from shared memory): B = dO, Q
        // (queries × HD), MN-major. DQ_FIRST: dQ(j − 1) before them.
        float acc_dq[DQ_N / 2];
        if constexpr (DQ_FIRST && !FIRST) mbar_wait(&sm.ds_ready[(j - 1) & 1], ((j - 1) >> 1) & 1);
        wgmma_fence_operands(pa);
        wgmma_fence_operands(dsa);
        wgmma_fence_registers(acc_dv);
        wgmma_fence_registers(acc_dk);
        my_turn();
        wgmma_fence();
        if constexpr (DQ_FIRST && !FIRST) {
            issue_dq(acc_dq, (j - 1) & 1);
            wgmma_commit();
        }
#pragma unroll
        for (int kq = 0; kq < KSTEPS; kq++)
            wgmma_rs<HD, 1>(acc_dv, pa[kq], QoTile::advance(do_mn_desc, QoTile::mn_step(kq)), 1);
        if constexpr (DK_FROM_SMEM) {
            const uint64_t ds_desc = DsTile::k_major(ds_addr0 + (j & 1) * C::DS_BYTES + DsTile::row_offset(cw * 64));
#pragma unroll
            for (int kq = 0; kq < KSTEPS; kq++)
                wgmma_ss<HD, 0, 1>(acc_dk, DsTile::advance(ds_desc, DsTile::k_step(kq)),
                                   QoTile::advance(q_mn_desc, QoTile::mn_step(kq)), 1);
        } else {
#pragma unroll
            for (int kq = 0; kq < KSTEPS; kq++)
                wgmma_rs<HD, 1>(acc_dk, dsa[kq], QoTile::advance(q_mn_desc, QoTile::mn_step(kq)), 1);
        }
        wgmma_commit();
        if constexpr (DQ_FIRST && !FIRST) {  // dQ(j − 1) is done first: stage it while dV, dK run
            their_turn();
            wgmma_wait<1>();
            wgmma_fence_registers(acc_dq);
            if (lane == 0) mbar_arrive(&sm.ds_free[(j - 1) & 1]);
            hand_over_dq(acc_dq, j - 1);
            wgmma_wait<0>();
        } else if constexpr (!FIRST) {  // dQ(j − 1), from the other buffer, written by both warpgroups
            mbar_wait(&sm.ds_ready[(j - 1) & 1], ((j - 1) >> 1) & 1);
            wgmma_fence();
            issue_dq(acc_dq, (j - 1) & 1);
            wgmma_commit();
            their_turn();
            wgmma_wait<1>();
        } else {
            their_turn();
            wgmma_wait<0>();
        }
        wgmma_fence_registers(acc_dv);
        wgmma_fence_registers(acc_dk);
        wgmma_fence_operands(pa);
        wgmma_fence_operands(dsa);
        // Q, dO, LSE and D of this step are no longer read. Every thread arrives, not one per warp
        // after __syncwarp: compute-sanitizer's racecheck orders only a thread's own reads (of LSE
        // and D) before its arrival, so it reports a per-warp release as a race with the next bulk
        // copy into the slot.
        mbar_arrive(&sm.slot_empty[stage]);
        if constexpr (!DQ_FIRST && !FIRST) {
            wgmma_wait<0>();
            wgmma_fence_registers(acc_dq);
            if (lane == 0) mbar_arrive(&sm.ds_free[(j - 1) & 1]);
            hand_over_dq(acc_dq, j - 1);
        }
    };
    if (cw == 1) their_turn();  // BWD_PINGPONG: warpgroup 0 issues first
    mbar_wait(sm.kv_full, 0);
    step(m_first, 0, std::true_type());
    for (int j = 1, m = m_first, h = 0; j < steps; j++) {  // (the head does not matter here)
        m = next_query_block(m, m_first, m_lo, p.m_blocks, h);
        step(m, j, std::false_type());
    }
    mbar_wait(&sm.ds_ready[(steps - 1) & 1], ((steps - 1) >> 1) & 1);  // the last step's dQ
    float acc_dq[DQ_N / 2];
    my_turn();
    wgmma_fence();
    issue_dq(acc_dq, (steps - 1) & 1);
    wgmma_commit();
    their_turn();
    if (cw == 0) my_turn();  // takes warpgroup 1's last hand-over, so that every arrival is matched
    wgmma_wait<0>();
    wgmma_fence_registers(acc_dq);
    hand_over_dq(acc_dq, steps - 1);
    backward_store_dkdv<HD>(p, acc_dk, acc_dv, key, b, kv_head);
}
#endif  // WGMMA_AVAILABLE

template <int HD, int BLOCK_M, bool CAUSAL, bool DETERMINISTIC, bool DK_FROM_SMEM, int SCHED>
__global__ void __launch_bounds__(384, 1)
    flash2_backward_ws_kernel(const __grid_constant__ Flash2BackwardMaps maps, const Flash2BackwardWsParams p) {
#if WGMMA_AVAILABLE
    typedef Flash2BackwardWsConfig<HD, BLOCK_M> C;
    extern __shared__ __align__(1024) __nv_bfloat16 smem_raw[];
    const Flash2BackwardSmem<C> sm = backward_smem<C>((uint8_t*)smem_raw);
    int n_block, bkv;
    backward_block_at(blockIdx.x, p.order_chunk, p.order_tail, p.key_blocks, p.pairs, n_block, bkv);
    const int n0 = n_block * C::BLOCK_N;
    const int b = bkv / p.NKV, kv_head = bkv % p.NKV, group = p.NH / p.NKV;
    const int m_lo = CAUSAL ? n0 / BLOCK_M : 0;  // causal: earlier query blocks see none of these keys
    const int m_first = CAUSAL || DETERMINISTIC ? m_lo : (int)((long)n_block * p.m_blocks / p.key_blocks);
    const int steps = group * (p.m_blocks - m_lo);
    if (threadIdx.x == 0) {
        mbar_init(sm.kv_full, 1);
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(&sm.q_full[s], 1);
            mbar_init(&sm.do_full[s], 1);
            mbar_init(&sm.slot_empty[s], C::THREADS - 128);  // every thread of both consumer warpgroups
        }
        mbar_init(sm.dq_full, 8);
        mbar_init(sm.dq_empty, 1);
        for (int s = 0; s < 2; s++) {
            mbar_init(&sm.ds_ready[s], 8);  // every consumer warp has written its rows of dSᵀ
            mbar_init(&sm.ds_free[s], 8);   // every consumer warp's dQ product has read the buffer
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        registers_decrease<C::PRODUCER_REGS>();
        if (threadIdx.x == 0)
            backward_produce<C, HD>(maps, p, sm, n0, b, kv_head, kv_head * group, m_first, m_lo, steps);
        else if (threadIdx.x == 32)
            backward_reduce_dq<C, DETERMINISTIC>(p, sm, n_block, b, kv_head * group, m_first, m_lo, steps);
    } else {
        registers_increase<C::CONSUMER_REGS>();
        // the consumer warpgroup's index, from lane 0 so that ptxas knows it is warp-uniform
        const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128 - 1, 0);
        backward_consume<C, HD, CAUSAL, DK_FROM_SMEM, SCHED>(p, sm, cw, n0, b, kv_head, m_first, m_lo, steps);
    }
#else
    __trap();  // built for a GPU without wgmma; the host never launches it there
#endif
}

// ---- the passes before and after the main kernel: one thread block of 256 per (b·NH + h, query
// block), so that every global read and write is a whole coalesced row or a contiguous run.

// Before: this query block's counter zeroed; D = rowsum(dO ∘ O) and LSE·log2 e for its rows (zero
// past T). With dq_accum written first by a store (backward_reduce_dq), every byte of the workspace
// is written before it is read, so no memset is needed. Blocks run head-fastest, (b, m, h): blocks
// that run together read the NH adjacent HD-wide slices of the same rows of O and dO, whole
// contiguous rows of memory, rather than one head's slice of rows far apart.
template <int HD, int BLOCK_M>
__global__ void flash2_backward_ws_prepare_kernel(Flash2BackwardParams p, float* d_rows,
                                                  float* lse_log2, int* counters, int m_blocks, int T_pad) {
    constexpr int GROUP = preprocess_lanes_per_row<HD>(), ROWS = 256 / GROUP;  // lanes per row, rows per pass
    const int h = (int)(blockIdx.x % p.NH), m = (int)(blockIdx.x / p.NH % m_blocks);
    const int b = (int)(blockIdx.x / p.NH / m_blocks);
    const long bh = (long)b * p.NH + h;
    if (threadIdx.x == 0) counters[bh * m_blocks + m] = 0;  // dq_accum itself is stored by its first contribution

    const int chunk = threadIdx.x % GROUP, row0 = m * BLOCK_M + (int)threadIdx.x / GROUP;
    constexpr int PASSES = BLOCK_M / ROWS;
    uint4 o4[PASSES], d4[PASSES];  // every pass's loads issued before any is used: bytes in flight
#pragma unroll
    for (int pass = 0; pass < PASSES; pass++) {
        const int t = row0 + pass * ROWS;
        o4[pass] = d4[pass] = make_uint4(0u, 0u, 0u, 0u);
        if (t < p.T && chunk < HD / 8) {
            const long offset = ((long)b * p.T + t) * p.out_stride + (long)h * HD + chunk * 8;
            o4[pass] = *(const uint4*)(p.out + offset);
            d4[pass] = *(const uint4*)(p.dout + offset);
        }
    }
    float dot[PASSES];
#pragma unroll
    for (int pass = 0; pass < PASSES; pass++) dot[pass] = dot_bf16x8(o4[pass], d4[pass]);
#pragma unroll
    for (int pass = 0; pass < PASSES; pass++) {
        const int t = row0 + pass * ROWS;
#pragma unroll
        for (int off = GROUP / 2; off > 0; off /= 2) dot[pass] += __shfl_xor_sync(0xffffffffu, dot[pass], off);
        if (chunk == 0) {
            d_rows[bh * T_pad + t] = dot[pass];
            lse_log2[bh * T_pad + t] = t < p.T ? p.lse[bh * p.T + t] * FLASH2_LOG2E : 0.f;
        }
    }
}

// out[d] (HD) = Σ of tile[r][d] over rows r < rows, by 256 threads: G = 256 / HD row groups each sum
// every G-th row, then the G partial sums are added in order g = 0..G−1.
template <int HD, int PITCH>
__device__ __forceinline__ void convert_dq_column_sums(const __nv_bfloat16* tile, int rows, float* out) {
    constexpr int G = 256 / HD;
    __shared__ float group_sums[G * HD];
    const int g = (int)threadIdx.x / HD, d = (int)threadIdx.x % HD;
    if (g < G) {
        float s = 0.f;
        for (int r = g; r < rows; r += G) s += __bfloat162float(tile[r * PITCH + d]);
        group_sums[g * HD + d] = s;
    }
    __syncthreads();
    if (threadIdx.x < HD) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < G; k++) s += group_sums[k * HD + threadIdx.x];
        out[threadIdx.x] = s;
    }
}

// After: dq (B, T, NH, HD) bf16 = dq_accum · scale for one query block: its fragment-ordered slots
// read in order (a float4 is rows r and r + 8 of two adjacent columns, hand_over_dq's order), scattered into a
// shared tile, then written out as whole rows. With col_partials non-NULL, also the block's column
// sums of the bf16 values written, in a fixed order, to col_partials[((b·m_blocks + m)·NH + h)·HD + d]
// (chunk-major: flash2_backward_ws_dq_colsum_kernel adds the B·m_blocks chunks up).
template <int HD, int BLOCK_M>
__global__ void flash2_backward_ws_convert_dq_kernel(const float* dq_accum, __nv_bfloat16* dq, long dq_stride, int T,
                                                     int NH, int m_blocks, float scale, float* col_partials) {
    typedef Flash2BackwardWsConfig<HD, BLOCK_M> C;
    constexpr int PITCH = HD + 8;  // bf16 per tile row: 16 bytes of padding, so a warp's 8 rows hit 32 banks
    __shared__ __align__(16) __nv_bfloat16 tile[BLOCK_M * PITCH];
    const long block = blockIdx.x;  // (b·NH + h)·m_blocks + m
    const float4* slots = (const float4*)(dq_accum + block * C::DQ_SLOTS);
    constexpr int PER_THREAD = C::DQ_SLOTS / 4 / 256;
    static_assert(C::DQ_SLOTS % (4 * 256) == 0, "whole float4s per thread");
    float4 v[PER_THREAD];  // all loads issued before any is used: bytes in flight
#pragma unroll
    for (int k = 0; k < PER_THREAD; k++) v[k] = slots[threadIdx.x + 256 * k];
#pragma unroll
    for (int k = 0; k < PER_THREAD; k++) {
        const int i = threadIdx.x + 256 * k, tid = i % 128, group = i / 128, wg = group / (C::DQ_N / 8);
        const int row = (C::DQ_M_SPLIT ? 64 * wg : 0) + (tid / 32) * 16 + (tid % 32) / 4;
        const int col = (C::DQ_M_SPLIT ? 0 : wg * C::DQ_COL0) + (group % (C::DQ_N / 8)) * 8 + (tid % 4) * 2;
        if (!C::DQ_M_SPLIT && wg == 1 && col < C::DQ_N) continue;  // head dim 80: columns 32-47 from warpgroup 0
        *(uint32_t*)&tile[row * PITCH + col] = pack_bf16(v[k].x * scale, v[k].y * scale);
        *(uint32_t*)&tile[(row + 8) * PITCH + col] = pack_bf16(v[k].z * scale, v[k].w * scale);
    }
    __syncthreads();
    const long bh = block / m_blocks;
    const int m = (int)(block % m_blocks), h = (int)(bh % NH), b = (int)(bh / NH);
    for (int i = threadIdx.x; i < BLOCK_M * (HD / 8); i += 256) {
        const int row = i / (HD / 8), col = (i % (HD / 8)) * 8, t = m * BLOCK_M + row;
        if (t < T)
            *(uint4*)(dq + ((long)b * T + t) * dq_stride + (long)h * HD + col) = *(const uint4*)&tile[row * PITCH + col];
    }
    if (col_partials) convert_dq_column_sums<HD, PITCH>(tile, min(BLOCK_M, T - m * BLOCK_M),
                                                        col_partials + (((long)b * m_blocks + m) * NH + h) * HD);
}

// dq_colsum[o] (cols) = Σ_c partials[c·cols + o] over c = 0..chunks−1 (+ its old value when
// accumulate), rounded to bf16 once. Block (32, DQ_COLSUM_GROUPS), 32 columns: thread (x, y) sums
// chunks y, y + DQ_COLSUM_GROUPS, ... (several loads in flight), then the groups' sums in order.
static constexpr int DQ_COLSUM_GROUPS = 16;
static __global__ void __launch_bounds__(32 * DQ_COLSUM_GROUPS)
    flash2_backward_ws_dq_colsum_kernel(__nv_bfloat16* dq_colsum, const float* partials, int chunks, int cols,
                                        int accumulate) {
    __shared__ float group_sums[DQ_COLSUM_GROUPS][32];
    const int o = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (o < cols) {
#pragma unroll 8
        for (int c = threadIdx.y; c < chunks; c += DQ_COLSUM_GROUPS) s += partials[(long)c * cols + o];
    }
    group_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || o >= cols) return;
    s = 0.f;
    for (int y = 0; y < DQ_COLSUM_GROUPS; y++) s += group_sums[y][threadIdx.x];
    if (accumulate) s += __bfloat162float(dq_colsum[o]);
    dq_colsum[o] = __float2bfloat16(s);
}

template <int HD, int BLOCK_M>
static inline size_t flash2_backward_ws_workspace_bytes_for(int B, int NH, int T) {
    typedef Flash2BackwardWsConfig<HD, BLOCK_M> C;
    const size_t m_blocks = (T + BLOCK_M - 1) / BLOCK_M, heads = (size_t)B * NH;
    return heads * m_blocks * (C::DQ_SLOTS * 4 + 2 * BLOCK_M * 4 + 4 + HD * 4);  // + dq's column partials
}

// p: the backward's arguments, with p->dq_accum the start of a workspace of the size above.
template <int HD, int BLOCK_M, bool CAUSAL, bool DETERMINISTIC, bool DK_FROM_SMEM, int SCHED>
static inline void launch_backward_ws(const Flash2BackwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2BackwardWsConfig<HD, BLOCK_M> C;
    const int m_blocks = (p->T + BLOCK_M - 1) / BLOCK_M, T_pad = m_blocks * BLOCK_M;
    const size_t heads = (size_t)B * p->NH;
    Flash2BackwardWsParams w;
    w.dk = p->dk;
    w.dv = p->dv;
    w.dq_accum = p->dq_accum;
    float* d_rows = w.dq_accum + heads * m_blocks * C::DQ_SLOTS;
    float* lse_log2 = d_rows + heads * T_pad;
    w.d_rows = d_rows;
    w.lse_log2 = lse_log2;
    w.dq_counters = (int*)(lse_log2 + heads * T_pad);
    float* col_partials = p->dq_colsum ? (float*)(w.dq_counters + heads * m_blocks) : NULL;
    w.dkv_stride = p->dkv_stride;
    w.T = p->T;
    w.T_pad = T_pad;
    w.NH = p->NH;
    w.NKV = p->NKV;
    w.m_blocks = m_blocks;
    w.key_blocks = (p->T + C::BLOCK_N - 1) / C::BLOCK_N;
    w.pairs = B * p->NKV;
    w.order_chunk = backward_order_chunk(CAUSAL, p->NH, p->NKV, w.pairs, p->T, HD, flash2_l2_bytes());
    w.order_tail = backward_order_tail(CAUSAL, w.order_chunk, p->NH, p->NKV, w.pairs, w.key_blocks, p->T, HD,
                                       flash2_sm_count(), flash2_l2_bytes());
    w.scale = p->scale;
    w.scale_log2 = p->scale_log2;
    const unsigned query_blocks = (unsigned)(heads * m_blocks);
    flash2_backward_ws_prepare_kernel<HD, BLOCK_M><<<query_blocks, 256, 0, stream>>>(
        *p, d_rows, lse_log2, w.dq_counters, m_blocks, T_pad);
    ATTN_CUDA_CHECK(cudaGetLastError());

    constexpr int SUB = C::QoTile::SUB_COLS;
    Flash2BackwardMaps maps;
    maps.q = make_rows_tensor_map(p->q, B, p->T, p->NH, HD, p->qkv_stride, BLOCK_M, SUB);
    maps.k = make_rows_tensor_map(p->k, B, p->T, p->NKV, HD, p->kv_stride, C::BLOCK_N, SUB);
    maps.v = make_rows_tensor_map(p->v, B, p->T, p->NKV, HD, p->kv_stride, C::BLOCK_N, SUB);
    maps.dout = make_rows_tensor_map(p->dout, B, p->T, p->NH, HD, p->out_stride, BLOCK_M, SUB);
    launch_with_smem<flash2_backward_ws_kernel<HD, BLOCK_M, CAUSAL, DETERMINISTIC, DK_FROM_SMEM, SCHED>>(
        dim3((unsigned)((long)w.key_blocks * w.pairs)),
        C::THREADS, C::SMEM_BYTES, stream, maps, w);

    flash2_backward_ws_convert_dq_kernel<HD, BLOCK_M><<<query_blocks, 256, 0, stream>>>(
        w.dq_accum, p->dq, p->dqkv_stride, p->T, p->NH, m_blocks, p->scale, col_partials);
    ATTN_CUDA_CHECK(cudaGetLastError());
    if (col_partials) {
        const int cols = p->NH * HD;
        flash2_backward_ws_dq_colsum_kernel<<<(cols + 31) / 32, dim3(32, DQ_COLSUM_GROUPS), 0, stream>>>(
            p->dq_colsum, col_partials, B * m_blocks, cols, p->dq_colsum_accumulate);
        ATTN_CUDA_CHECK(cudaGetLastError());
    }
}

#endif  // FLASH2_BACKWARD_HOPPER_CUH
