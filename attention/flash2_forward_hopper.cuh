// flash2_forward_hopper.cuh: the flash2 forward (Algorithm 1 of the paper) on Hopper, warp-specialized
// (sm_90a), head dims 64, 80, 96 and 128. Inputs and outputs as flash2_forward_kernel.cuh: q rows
// (b, t, h) at qkv_stride, k and v rows (b, t, h / (NH / NKV)) at kv_stride, out (B, T, NH, HD) at
// out_stride, lse (B, NH, T) fp32. The query heads of one K/V head are consecutive tiles' heads, so
// their K and V blocks are read from L2 after the first.
//
// Persistent: one thread block per SM walks the tiles (query block of 64·CONSUMERS rows, b·NH + h),
// heaviest causal query blocks first: non-causal round-robin; causal (tiles of different lengths)
// taking the next tile from a counter in the call's workspace (without one, causal runs one block per
// tile). The producer picks the tile and hands its index to the consumers beside its Q buffer
// (tile_of_q; `tiles` there means stop). 1 + CONSUMERS warpgroups:
//   producer   warpgroup 0 gives its registers away (setmaxnreg) and one thread issues every load:
//              per tile the Q tile into one of two buffers (once that buffer's previous O has been
//              stored), then K and V blocks (BLOCK_N keys) into a ring of STAGES slots that runs on
//              across tiles, each slot guarded by a "full" mbarrier (TMA bytes landed) and an "empty"
//              one (consumers done).
//   consumers  warpgroup 1 + c owns query rows 64c..64c+63 of each tile. Its key blocks, last block
//              first (the masked ones come first), form one walk that runs on across tiles:
//                issue S(j) = Q K(j)ᵀ         wgmma, Q and K from shared memory
//                issue O += P(j−1) V(j−1)     wgmma, P from registers; j−1 may be the previous tile's
//                                             last block
//                softmax of S(j) while both run: mask, row max, P = exp2, running sum
//                wait for O; if j−1 ended a tile, its O /= ℓ goes through this warpgroup's rows of
//                that tile's Q buffer out by TMA (LSE per row), else O is rescaled; P(j) to bf16
//              and the warpgroups take turns issuing their products (named barriers, "ping-pong"),
//              so one's softmax runs while the tensor cores do another's products. A tile's start
//              and end are thus inside the pipeline: the tensor cores do not idle between tiles.
// The shared arithmetic (masking, online softmax, rescale, LSE) is attention_math.cuh's.
#ifndef FLASH2_FORWARD_HOPPER_CUH
#define FLASH2_FORWARD_HOPPER_CUH

#include "attention_math.cuh"
#include "flash2_forward_kernel.cuh"
#include "tensor_map.h"
#include "wgmma.cuh"

typedef struct {
    CUtensorMap q, k, v, o;  // boxes: BLOCK_M, BLOCK_N, BLOCK_N and 64 rows (tensor_map.h)
} Flash2ForwardMaps;

template <int HD, int BLOCK_N, int CONSUMERS>
struct Flash2ForwardWsConfig {
    static constexpr int BLOCK_M = 64 * CONSUMERS, THREADS = 128 * (CONSUMERS + 1), STAGES = 2;
    typedef WgTile<BLOCK_M, HD> QTile;
    typedef WgTile<BLOCK_N, HD> KvTile;
    // The producer's 128 threads keep few registers so that the consumers get up to 240.
    static constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 24 : 32, CONSUMER_REGS = CONSUMERS == 2 ? 240 : 160;
    static constexpr uint32_t Q_BYTES = QTile::ELEMS * 2, KV_BYTES = KvTile::ELEMS * 2;
    static constexpr int BARRIERS = 4 + 4 * STAGES;
    // Two Q tiles: a tile's first product is issued while the previous tile's O, stored through the
    // other buffer, is still being computed.
    static constexpr int Q_BUFFERS = 2;
    static constexpr size_t SMEM_BYTES =
        1024 /* alignment slack */ + Q_BUFFERS * Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS + 4 * Q_BUFFERS;
    static_assert(SMEM_BYTES <= 227 * 1024, "two Q tiles and the K/V ring must fit in shared memory");
    // named barriers: 1..CONSUMERS the ping-pong turns, then one per consumer for its epilogue
    static constexpr int TURN_BARRIER = 1, EPILOGUE_BARRIER = 1 + CONSUMERS;
    static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "key blocks: a multiple of 16, at most one TMA box");
    // setmaxnreg moves registers within the pool the launch gave: 65536 / THREADS per thread,
    // rounded down to 8 (168 for 384 threads, 128 for 512). A consumer asking for more than the pool
    // holds would wait forever.
    static_assert(CONSUMER_REGS * 128 * CONSUMERS + PRODUCER_REGS * 128 <= (65536 / THREADS / 8 * 8) * THREADS,
                  "register pool");
};

template <typename C>
struct Flash2ForwardSmem {
    __nv_bfloat16 *q, *k, *v;  // Q_BUFFERS × (BLOCK_M, HD), STAGES × (BLOCK_N, HD), STAGES × (BLOCK_N, HD)
    uint64_t *q_full, *q_empty, *k_full, *k_empty, *v_full, *v_empty;
    int* tile_of_q;  // Q_BUFFERS: the tile whose Q the buffer holds (the producer's choice), or `tiles`: stop
};

// The tiles in the order the blocks take them: tile t is query block m_blocks − 1 − t % m_blocks of
// head-sequence t / m_blocks. The query blocks of one head run side by side, so that its K and V
// stay in L2 for all of them, the longest causal ones first.
typedef struct {
    int m0, b, h, n_blocks;
    int iter;  // this block's tiles before this one
} Flash2ForwardTile;

template <int BLOCK_M, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ Flash2ForwardTile forward_tile(const Flash2ForwardParams& p, int t) {
    const int m_blocks = (p.T + BLOCK_M - 1) / BLOCK_M, bh = t / m_blocks;
    Flash2ForwardTile tile;
    tile.m0 = (m_blocks - 1 - t % m_blocks) * BLOCK_M;
    tile.b = bh / p.NH;
    tile.h = bh % p.NH;
    const int key_end = CAUSAL ? min(p.T, tile.m0 + BLOCK_M) : p.T;
    tile.n_blocks = (key_end + BLOCK_N - 1) / BLOCK_N;
    return tile;
}

template <typename C>
__device__ __forceinline__ Flash2ForwardSmem<C> forward_smem(uint8_t* raw) {
    // wgmma's and TMA's 128-byte swizzle repeats every 1024 bytes: tiles start 1024-aligned
    uint8_t* base = raw + (((smem_address(raw) + 1023) & ~1023u) - smem_address(raw));
    Flash2ForwardSmem<C> sm;
    sm.q = (__nv_bfloat16*)base;
    sm.k = (__nv_bfloat16*)(base + C::Q_BUFFERS * C::Q_BYTES);
    sm.v = sm.k + C::STAGES * C::KvTile::ELEMS;
    sm.q_full = (uint64_t*)(base + C::Q_BUFFERS * C::Q_BYTES + 2 * C::STAGES * C::KV_BYTES);
    sm.q_empty = sm.q_full + 2;
    sm.k_full = sm.q_empty + 2;
    sm.k_empty = sm.k_full + C::STAGES;
    sm.v_full = sm.k_empty + C::STAGES;
    sm.v_empty = sm.v_full + C::STAGES;
    sm.tile_of_q = (int*)(sm.v_empty + C::STAGES);
    return sm;
}

#if WGMMA_AVAILABLE
// The tile a block takes after tile t: the next of a fixed round-robin, or with a tile counter the
// next one no block has taken yet (blocks that drew short causal tiles come back sooner).
__device__ __forceinline__ int next_tile(const Flash2ForwardParams& p, int t) {
    return p.tile_counter ? gridDim.x + atomicAdd(p.tile_counter, 1) : t + gridDim.x;
}

// One thread: per tile, Q (once the previous tile's O has left its shared memory) with the tile's
// index beside it for the consumers, then K(j) and V(j) for j = n_blocks − 1 down to 0 through the
// ring. At the end, `tiles` in the next Q buffer tells the consumers to stop.
template <typename C, int HD, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void forward_produce(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                const Flash2ForwardSmem<C>& sm, int tiles) {
    tma_prefetch_map(&maps.q);
    tma_prefetch_map(&maps.k);
    tma_prefetch_map(&maps.v);
    int ring = 0;  // K/V blocks loaded so far: slot ring % STAGES, its use (ring / STAGES)
    int t = blockIdx.x, iter = 0;
    for (; t < tiles; t = next_tile(p, t), iter++) {
        const Flash2ForwardTile tile = forward_tile<C::BLOCK_M, BLOCK_N, CAUSAL>(p, t);
        const int qb = iter % C::Q_BUFFERS, q_use = iter / C::Q_BUFFERS, kv_head = tile.h / (p.NH / p.NKV);
        mbar_wait(&sm.q_empty[qb], (q_use & 1) ^ 1);
        sm.tile_of_q[qb] = t;  // published by the arrival below (release), read after q_full (acquire)
        mbar_arrive_expect_tx(&sm.q_full[qb], C::Q_BYTES);
        tma_load_tile<typename C::QTile, HD>(sm.q + qb * C::QTile::ELEMS, &maps.q, &sm.q_full[qb], tile.h, tile.m0,
                                             tile.b);
#pragma unroll 1  // the producer has 24 registers: an unrolled loop spills
        for (int i = 0; i < tile.n_blocks; i++, ring++) {
            const int n = tile.n_blocks - 1 - i, stage = ring % C::STAGES, phase = (ring / C::STAGES) & 1;
            mbar_wait(&sm.k_empty[stage], phase ^ 1);
            mbar_arrive_expect_tx(&sm.k_full[stage], C::KV_BYTES);
            tma_load_tile<typename C::KvTile, HD>(sm.k + stage * C::KvTile::ELEMS, &maps.k, &sm.k_full[stage], kv_head,
                                                  n * BLOCK_N, tile.b);
            mbar_wait(&sm.v_empty[stage], phase ^ 1);
            mbar_arrive_expect_tx(&sm.v_full[stage], C::KV_BYTES);
            tma_load_tile<typename C::KvTile, HD>(sm.v + stage * C::KvTile::ELEMS, &maps.v, &sm.v_full[stage], kv_head,
                                                  n * BLOCK_N, tile.b);
        }
    }
    const int qb = iter % C::Q_BUFFERS;
    mbar_wait(&sm.q_empty[qb], ((iter / C::Q_BUFFERS) & 1) ^ 1);
    sm.tile_of_q[qb] = tiles;
    mbar_arrive(&sm.q_full[qb]);
}

// A consumer warp is done with a ring slot (its wgmma reads of it have completed).
__device__ __forceinline__ void release_slot(uint64_t* empty) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// O /= ℓ and LSE for this warpgroup's 64 rows of `tile`; O goes through its rows of the tile's Q
// buffer (its products no longer read them) and out by TMA. The buffer goes back to the producer
// later (hand_back_q), once the store has read it.
template <typename C, int HD>
__device__ __forceinline__ void forward_store_o(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                const Flash2ForwardSmem<C>& sm, int cw, const Flash2ForwardTile& tile,
                                                const float (&acc_o)[HD / 2], const float (&row_max)[2],
                                                const float (&row_sum)[2]) {
    typedef typename C::QTile QTile;
    const int tid = threadIdx.x % 128, g = (tid % 32) / 4, t4 = tid % 4;
    const int tile_row = cw * 64 + (tid / 32) * 16 + g;  // this thread's rows: tile_row, tile_row + 8
    __nv_bfloat16* q_tile = sm.q + (tile.iter % 2) * QTile::ELEMS;
    float inv[2], lse[2];
    softmax_finish(row_max, row_sum, inv, lse);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = tile.m0 + tile_row + 8 * half;
        if (t4 == 0 && row < p.T) p.lse[((long)tile.b * p.NH + tile.h) * p.T + row] = lse[half];
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
            *(uint32_t*)(q_tile + QTile::index(tile_row + 8 * half, nt) + 2 * t4) =
                pack_bf16(acc_o[4 * nt + 2 * half] * inv[half], acc_o[4 * nt + 2 * half + 1] * inv[half]);
    }
    fence_proxy_async();  // the TMA store reads what these ordinary stores wrote
    named_barrier_sync(C::EPILOGUE_BARRIER + cw, 128);
    if (tid == 0) {
        if (tile.m0 + cw * 64 < p.T) {  // a warpgroup whose rows all lie past T has nothing to store
#pragma unroll
            for (int j = 0; j < HD / QTile::SUB_COLS; j++)
                tma_store_4d(&maps.o, q_tile + j * (QTile::SUB_BYTES / 2) + cw * 64 * QTile::ROW_ELEMS,
                             j * QTile::SUB_COLS, tile.h, tile.m0 + cw * 64, tile.b);
        }
        bulk_commit();
    }
}

// The Q buffer qb, whose O this warpgroup stored last, goes back to the producer (q_empty) once the
// store has read it.
template <typename C>
__device__ __forceinline__ void hand_back_q(const Flash2ForwardSmem<C>& sm, int qb) {
    if (threadIdx.x % 128 == 0) {
        bulk_wait_read();
        mbar_arrive(&sm.q_empty[qb]);
    }
}

// Consumer warpgroup cw: its rows (64·cw ...) of every tile this block takes, as one walk over key
// blocks that runs on across tiles (and through the ring of K/V slots). At each block but the walk's
// first the warpgroup takes its turn (named barriers TURN_BARRIER + c, so that one warpgroup's softmax
// runs while the others' products do) to issue S = Q K(j)ᵀ together with O += P V of the block before
// it. That block may be the previous tile's last: its O is then stored once the product is done,
// after this tile's first softmax, so the tensor cores do not idle between tiles. Causal with three
// warpgroups, a warpgroup issues no products for the blocks none of its rows see (rows past T, or
// blocks wholly above its diagonal); it still takes their turns and releases their slots.
template <typename C, int HD, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void forward_consume(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                const Flash2ForwardSmem<C>& sm, int cw, int tiles) {
    typedef typename C::QTile QTile;
    typedef typename C::KvTile KvTile;
    constexpr int CONSUMERS = C::BLOCK_M / 64, NT = BLOCK_N / 8, KSTEPS = BLOCK_N / 16;
    // With two warpgroups (64-row halves of 128-row tiles over 128-key blocks) no block lies wholly
    // above a warpgroup's diagonal; non-causal only a warpgroup past T would skip, which measured
    // 2-4% slower at 512 (the skip's code cost more than it saved).
    constexpr bool SKIP = CAUSAL && CONSUMERS == 3;
    const int tid = threadIdx.x % 128, t4 = tid % 4;
    const int my_turn = C::TURN_BARRIER + cw, next_turn = C::TURN_BARRIER + (cw + 1) % CONSUMERS;
    const uint32_t k_addr0 = smem_address(sm.k), v_addr0 = smem_address(sm.v);

    float acc_o[HD / 2], s[BLOCK_N / 2];
    float row_max[2], row_sum[2], rescale[2];
    uint32_t pa[KSTEPS][4];
    int stage = 0, phase = 0;        // the ring slot of the next K/V block
    int pv_stage = 0, pv_phase = 0;  // the slot of the V that the pending P multiplies
    bool pending = false;            // pa holds the last block's P; its O += P V is not issued yet
    bool first = true;               // the walk's first block takes no turn
    int stored_qb = -1;              // the Q buffer of an O stored but not yet handed back
    int out_t = 0, out_iter = 0;     // the tile whose O acc_o accumulates, and its place in the walk

    auto issue_qk = [&](uint64_t q_desc) {  // S = Q K(stage)ᵀ, 64 × BLOCK_N, k = HD
        const uint64_t k_desc = KvTile::k_major(k_addr0 + stage * C::KV_BYTES);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_N, 0, 0>(s, QTile::advance(q_desc, QTile::k_step(ks)),
                                    KvTile::advance(k_desc, KvTile::k_step(ks)), ks > 0);
    };
    auto issue_pv = [&]() {  // O += P V(pv_stage): V is MN-major (keys × HD)
        const uint64_t v_desc = KvTile::mn_major(v_addr0 + pv_stage * C::KV_BYTES);
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++)
            wgmma_rs<HD, 1>(acc_o, pa[kk], KvTile::advance(v_desc, KvTile::mn_step(kk)), 1);
    };
    auto softmax_block = [&](const Flash2ForwardTile& tile, int n) {  // S of key block n → P (fp32, in place)
        const int n0 = n * BLOCK_N, wg_row0 = tile.m0 + cw * 64, row = wg_row0 + (tid / 32) * 16 + tid % 32 / 4;
        if (n0 + BLOCK_N > p.T || (CAUSAL && n0 + BLOCK_N - 1 > wg_row0))
            mask_scores<NT, CAUSAL>(s, row, n0 + 2 * t4, p.T);
        online_softmax<NT>(s, row_max, row_sum, p.scale_log2, rescale);
    };
    auto p_to_bf16 = [&]() {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) accumulators_to_a(pa[kk], &s[8 * kk], &s[8 * kk + 4]);
    };
    auto hand_back = [&]() {
        if (stored_qb >= 0) hand_back_q<C>(sm, stored_qb);
        stored_qb = -1;
    };
    auto store_o = [&](const float (&max)[2], const float (&sum)[2]) {  // tile out_t is complete in acc_o
        hand_back();
        Flash2ForwardTile out = forward_tile<C::BLOCK_M, BLOCK_N, CAUSAL>(p, out_t);
        out.iter = out_iter;
        forward_store_o<C, HD>(p, maps, sm, cw, out, acc_o, max, sum);
        stored_qb = out_iter % 2;
    };
    auto next_slot = [&]() {
        if (++stage == C::STAGES) stage = 0, phase ^= 1;
    };
    auto turn_begin = [&]() {
        if (!first) named_barrier_sync(my_turn, 256);
    };
    auto turn_end = [&]() {
        if (!first) named_barrier_arrive(next_turn, 256);
        first = false;
    };
    auto pending_pv_issue = [&]() {
        mbar_wait(&sm.v_full[pv_stage], pv_phase);
        wgmma_fence_registers(acc_o);
        wgmma_fence_operands(pa);
        wgmma_fence();
        issue_pv();
        wgmma_commit();
    };
    auto pending_pv_done = [&]() {  // the O += P V issued last is done: store the tile's O
        wgmma_wait<0>();
        wgmma_fence_registers(acc_o);
        wgmma_fence_operands(pa);
        release_slot(&sm.v_empty[pv_stage]);
        store_o(row_max, row_sum);
        pending = false;
    };
    // A block none of this warpgroup's rows see: its turn, then its slots released once landed (an
    // earlier arrival would count for the slot's previous use). A pending P is finished meanwhile.
    auto skip_block = [&]() {
        if (pending) {  // issue and wait in one branch: ptxas then knows no product is in flight after it
            turn_begin();
            pending_pv_issue();
            turn_end();
            pending_pv_done();
        } else {
            turn_begin();
            turn_end();
        }
        mbar_wait(&sm.k_full[stage], phase);
        release_slot(&sm.k_empty[stage]);
        mbar_wait(&sm.v_full[stage], phase);
        release_slot(&sm.v_empty[stage]);
        next_slot();
    };
    // A tile's first product with no P pending (the walk's start, or after skipped blocks).
    auto first_block = [&](const Flash2ForwardTile& tile, int t, uint64_t q_desc, int n) {
        mbar_wait(&sm.k_full[stage], phase);
        turn_begin();
        wgmma_fence();
        issue_qk(q_desc);
        wgmma_commit();
        turn_end();
        hand_back();
        wgmma_wait<0>();
        wgmma_fence_registers(s);
        release_slot(&sm.k_empty[stage]);
#pragma unroll
        for (int i = 0; i < HD / 2; i++) acc_o[i] = 0.f;
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.f;
        softmax_block(tile, n);
        p_to_bf16();
        out_t = t, out_iter = tile.iter;
        pending = true;
        pv_stage = stage, pv_phase = phase;
        next_slot();
    };
    // S of block n with O += P V of the block before; `crossing`: that block was the previous tile's last.
    auto next_block = [&](const Flash2ForwardTile& tile, int t, uint64_t q_desc, int n, bool crossing) {
        mbar_wait(&sm.k_full[stage], phase);
        named_barrier_sync(my_turn, 256);  // never the walk's first block: a P is pending
        wgmma_fence_registers(acc_o);      // the rescale and the bf16 P are done before the products start
        wgmma_fence_operands(pa);
        wgmma_fence();
        issue_qk(q_desc);
        wgmma_commit();
        mbar_wait(&sm.v_full[pv_stage], pv_phase);
        wgmma_fence();
        issue_pv();
        wgmma_commit();
        named_barrier_arrive(next_turn, 256);
        hand_back();
        wgmma_wait<1>();  // S(j) done; O += P(j−1) V(j−1) still running
        wgmma_fence_registers(s);
        release_slot(&sm.k_empty[stage]);
        const float done_max[2] = {row_max[0], row_max[1]}, done_sum[2] = {row_sum[0], row_sum[1]};
        if (crossing) {  // S belongs to a new tile: its softmax starts afresh
            row_max[0] = row_max[1] = -INFINITY;
            row_sum[0] = row_sum[1] = 0.f;
        }
        softmax_block(tile, n);
        wgmma_wait<0>();
        wgmma_fence_registers(acc_o);
        wgmma_fence_operands(pa);
        release_slot(&sm.v_empty[pv_stage]);
        if (crossing) {
            store_o(done_max, done_sum);
#pragma unroll
            for (int i = 0; i < HD / 2; i++) acc_o[i] = 0.f;
            out_t = t, out_iter = tile.iter;
        } else if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
            // a warp's own 16 rows: skipped when none of their maxima moved (most blocks, once they settle)
            rescale_rows<HD / 8>(acc_o, rescale);
        }
        p_to_bf16();
        pv_stage = stage, pv_phase = phase;
        next_slot();
    };

    if (cw == CONSUMERS - 1) named_barrier_arrive(C::TURN_BARRIER, 256);  // warpgroup 0 issues first
    for (int iter = 0;; iter++) {
        hand_back();  // the producer may be waiting for it to load this tile's Q (tiles of one block)
        mbar_wait(&sm.q_full[iter % 2], (iter / 2) & 1);
        const int t = sm.tile_of_q[iter % 2];
        if (t >= tiles) break;
        Flash2ForwardTile tile = forward_tile<C::BLOCK_M, BLOCK_N, CAUSAL>(p, t);
        tile.iter = iter;
        const uint64_t q_desc =
            QTile::k_major(smem_address(sm.q + (iter % 2) * QTile::ELEMS) + QTile::row_offset(cw * 64));
        // this warpgroup's live blocks: the tile's first `live` (the walk goes from the last block down)
        const int wg_row0 = tile.m0 + cw * 64, row_end = min(wg_row0 + 64, p.T);
        const int live = !SKIP ? tile.n_blocks
                         : row_end <= wg_row0 ? 0
                                              : min(tile.n_blocks, (row_end + BLOCK_N - 1) / BLOCK_N);
        for (int n = tile.n_blocks - 1; n >= live; n--) skip_block();
        if (live == 0) continue;
        const bool crossing = pending;
        int n = live - 1;
        if (!crossing) first_block(tile, t, q_desc, n--);
        for (bool cross = crossing; n >= 0; n--, cross = false) next_block(tile, t, q_desc, n, cross);
    }
    if (pending) {  // the walk's last block: no turn, as the others have none left to give
        pending_pv_issue();
        pending_pv_done();
    }
    if (tid == 0) bulk_wait_read();  // the last O stores have left shared memory
    // Warpgroup 0's turn was announced once more than it took (the first arrival above).
    if (cw == 0) named_barrier_sync(C::TURN_BARRIER, 256);
}
#endif  // WGMMA_AVAILABLE

template <int HD, int BLOCK_N, int CONSUMERS, bool CAUSAL>
__global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    flash2_forward_ws_kernel(const __grid_constant__ Flash2ForwardMaps maps, const Flash2ForwardParams p) {
#if WGMMA_AVAILABLE
    typedef Flash2ForwardWsConfig<HD, BLOCK_N, CONSUMERS> C;
    extern __shared__ __align__(1024) __nv_bfloat16 smem_raw[];
    const Flash2ForwardSmem<C> sm = forward_smem<C>((uint8_t*)smem_raw);
    const int tiles = (p.T + C::BLOCK_M - 1) / C::BLOCK_M * (p.B * p.NH);
    if (threadIdx.x == 0) {
        for (int q = 0; q < C::Q_BUFFERS; q++) {
            mbar_init(&sm.q_full[q], 1);
            mbar_init(&sm.q_empty[q], CONSUMERS);  // each consumer's storing thread, once its O has left
        }
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(&sm.k_full[s], 1);
            mbar_init(&sm.v_full[s], 1);
            mbar_init(&sm.k_empty[s], 4 * CONSUMERS);  // one arrival per consumer warp
            mbar_init(&sm.v_empty[s], 4 * CONSUMERS);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        registers_decrease<C::PRODUCER_REGS>();
        if (threadIdx.x == 0) forward_produce<C, HD, BLOCK_N, CAUSAL>(p, maps, sm, tiles);
    } else {
        registers_increase<C::CONSUMER_REGS>();
        // the consumer warpgroup's index, from lane 0 so that ptxas knows it is warp-uniform
        const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128 - 1, 0);
        forward_consume<C, HD, BLOCK_N, CAUSAL>(p, maps, sm, cw, tiles);
    }
#else
    __trap();  // built for a GPU without wgmma; the host never launches it there
#endif
}

// PERSISTENT: one block per multiprocessor walks the tiles, taking them in turn through
// p->tile_counter when that is given (zeroed here) or round-robin; otherwise one block per tile.
template <int HD, int BLOCK_N, int CONSUMERS, bool CAUSAL, bool PERSISTENT = true>
static inline void launch_forward_ws(const Flash2ForwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2ForwardWsConfig<HD, BLOCK_N, CONSUMERS> C;
    constexpr int SUB = C::QTile::SUB_COLS;
    Flash2ForwardMaps maps;
    maps.q = make_rows_tensor_map(p->q, B, p->T, p->NH, HD, p->qkv_stride, C::BLOCK_M, SUB);
    maps.k = make_rows_tensor_map(p->k, B, p->T, p->NKV, HD, p->kv_stride, BLOCK_N, SUB);
    maps.v = make_rows_tensor_map(p->v, B, p->T, p->NKV, HD, p->kv_stride, BLOCK_N, SUB);
    maps.o = make_rows_tensor_map(p->out, B, p->T, p->NH, HD, p->out_stride, 64, SUB);
    const int tiles = (p->T + C::BLOCK_M - 1) / C::BLOCK_M * B * p->NH;
    Flash2ForwardParams params = *p;
    params.B = B;
    // Causal tiles differ in length: walked round-robin, blocks finish far apart (and where the SM
    // count is a multiple of the query blocks per head, one block gets every longest tile), so
    // without a counter causal runs one block per tile.
    const bool persistent = PERSISTENT && (!CAUSAL || params.tile_counter);
    if (!persistent) params.tile_counter = NULL;
    if (params.tile_counter) CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream));
    launch_with_smem<flash2_forward_ws_kernel<HD, BLOCK_N, CONSUMERS, CAUSAL>>(
        dim3(persistent && tiles > flash2_sm_count() ? flash2_sm_count() : tiles), C::THREADS, C::SMEM_BYTES, stream,
        maps, params);
}

#endif  // FLASH2_FORWARD_HOPPER_CUH
