// flash2_forward_hopper.cuh: the flash2 forward (Algorithm 1 of the paper) on Hopper, warp-specialized
// (sm_90a), head dims 64, 80, 96 and 128. Inputs and outputs as flash2_forward_kernel.cuh: q rows
// (b, t, h) at qkv_stride, k and v rows (b, t, h / (NH / NKV)) at kv_stride, out (B, T, NH, HD) at
// out_stride, lse (B, NH, T) fp32. The query heads of one K/V head are consecutive tiles' heads, so
// their K and V blocks are read from L2 after the first.
//
// Persistent: one thread block per SM walks the tiles (query block of 64·CONSUMERS rows, b·NH + h),
// heaviest causal query blocks first, so that one tile's loads overlap the previous tile's epilogue:
// non-causal round-robin; causal (tiles of different lengths) taking the next tile from a counter in
// the call's workspace (without one, causal runs one block per tile). The producer picks the tile and
// hands its index to the consumers beside its Q buffer (tile_of_q; `tiles` there means stop).
// 1 + CONSUMERS warpgroups:
//   producer   warpgroup 0 gives its registers away (setmaxnreg) and one thread issues every load:
//              per tile the Q tile (once its previous O has been stored from there), then K and V
//              blocks (BLOCK_N keys) into a ring of STAGES slots that runs on across tiles, each slot
//              guarded by a "full" mbarrier (TMA bytes landed) and an "empty" one (consumers done).
//   storer     (STORER, flash2_tiles.h) one thread of the producer's second warp issues the O
//              stores: per tile and consumer warpgroup it waits for that warpgroup's O in shared
//              memory ("o_full"), stores it by TMA, and once every store of the tile has read its
//              rows hands the Q buffer back ("q_empty"). The consumers go on to their next tile at
//              once. Without it a thread of each consumer warpgroup issues its store.
//   consumers  warpgroup 1 + c owns query rows 64c..64c+63. Per key block j (from the last down;
//              causal with two warpgroups from the first up: forward_key_block):
//                issue S(j) = Q K(j)ᵀ         wgmma, Q and K from shared memory
//                issue O += P(j−1) V(j−1)     wgmma, P from registers
//                softmax of S(j) while both run: mask, row max, P = exp2, running sum
//                wait for O, rescale it, P(j) to bf16
//              and the warpgroups take turns issuing their products (named barriers, "ping-pong"),
//              so one's softmax runs while the tensor cores do another's products. Where registers
//              do not allow P(j−1) and S(j) at once (three warpgroups over 128-key blocks at head
//              dims 80, 96 and 128: Flash2ForwardWsConfig::OVERLAP), a turn issues
//              O += P(j−1) V(j−1), waits for it, then issues S(j); the other warpgroups' products
//              fill the gap. Causal with three warpgroups, a warpgroup issues no products for the
//              blocks wholly above its diagonal (or its rows past T), but still takes their turns
//              and releases their slots.
//   epilogue   O /= ℓ into this warpgroup's rows of the Q tile, stored by TMA; LSE per row. The Q
//              tile goes back to the producer ("q_empty") once the store has read it: without the
//              storer and with two Q buffers, only after the next tile's first product is issued,
//              so that no one waits for it.
// The shared arithmetic (masking, online softmax, rescale, LSE) is attention_math.cuh's.
#ifndef FLASH2_FORWARD_HOPPER_CUH
#define FLASH2_FORWARD_HOPPER_CUH

#include <atomic>

#include "attention/common/attention_math.cuh"
#include "attention/common/cuda_check.h"
#include "attention/flash2/flash2_params.h"
#include "attention/flash2/sm90/tensor_map.h"
#include "attention/flash2/sm90/wgmma.cuh"

typedef struct {
    CUtensorMap q, k, v, o;  // boxes: BLOCK_M, BLOCK_N, BLOCK_N and 64 rows (tensor_map.h)
} Flash2ForwardMaps;

template <int HD, int BLOCK_N, int CONSUMERS_, bool STORER_ = false>
struct Flash2ForwardWsConfig {
    static constexpr int CONSUMERS = CONSUMERS_;
    static constexpr bool STORER = STORER_;
    static constexpr int BLOCK_M = 64 * CONSUMERS, THREADS = 128 * (CONSUMERS + 1), STAGES = 2;
    typedef WgTile<BLOCK_M, HD, true> QTile;  // 32-column sub-tiles at head dim 96 (wgmma.cuh)
    typedef WgTile<BLOCK_N, HD, true> KvTile;
    // The producer's 128 threads keep few registers so that the consumers get up to 240.
    static constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 24 : 32, CONSUMER_REGS = CONSUMERS == 2 ? 240 : 160;
    static constexpr uint32_t Q_BYTES = QTile::ELEMS * 2, KV_BYTES = KvTile::ELEMS * 2;
    static constexpr int BARRIERS = 4 + 4 * STAGES + (STORER ? 2 * CONSUMERS : 0);
    // Whether a warpgroup issues S(j) beside O += P(j−1) V(j−1) and runs the softmax of S(j) under
    // the latter (P(j−1) and S(j) live at once). Three warpgroups over 128-key blocks at head dims
    // 80, 96 and 128 have no registers for that (ptxas serializes the products, C7512): there a
    // warpgroup finishes O += P(j−1) V(j−1) before S(j) and the other warpgroups' products fill the
    // gap.
    static constexpr bool OVERLAP = !(CONSUMERS == 3 && BLOCK_N == 128 && HD > 64);
    // Two Q tiles where shared memory allows: a persistent block then loads the next tile's Q while
    // this tile's O is still being stored from the other.
    static constexpr int Q_BUFFERS = 1024 + 2 * Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS + 8 <= 227 * 1024 ? 2 : 1;
    static constexpr size_t SMEM_BYTES =
        1024 /* alignment slack */ + Q_BUFFERS * Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS + 4 * Q_BUFFERS;
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
    uint64_t* o_full;  // STORER: [Q buffer][consumer], that warpgroup's O is in the buffer's rows
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

// The key block of step i of a tile's walk. Causal with two warpgroups: from block 0 up, so that a
// head's query blocks, running side by side on different SMs, ask for the same K and V at the same
// moment and one fill serves them all. Otherwise the last block first: with three warpgroups the
// blocks wholly above a warpgroup's rows then come first, where it skips them; non-causal tiles
// start together at the same block either way (attention/PERF_NOTES.md).
template <typename C, bool CAUSAL>
__device__ __forceinline__ int forward_key_block(const Flash2ForwardTile& tile, int i) {
    return CAUSAL && C::CONSUMERS == 2 ? i : tile.n_blocks - 1 - i;
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
    sm.o_full = sm.v_empty + C::STAGES;
    sm.tile_of_q = (int*)(sm.o_full + (C::STORER ? 2 * C::CONSUMERS : 0));
    return sm;
}

// A new epoch for each launch that takes tiles from a counter, one sequence for the whole process
// (an inline function with external linkage has one static). Epochs are fp32 signaling-NaN bit
// patterns (0x7F800001 ... 0x7FBFFFFE), which no finite number, no small integer, no zeroed memory
// and no NaN that arithmetic makes (quiet: 0x7FC00000 and up) can equal in the scratch word's high
// half, so a launch never mistakes old scratch for its own claims.
inline unsigned flash2_next_tile_epoch() {
    static std::atomic<unsigned> launches{0};
    return 0x7F800000u | (1u + launches.fetch_add(1) % 0x3FFFFEu);
}

#if WGMMA_AVAILABLE
// The next claim of this launch on the tile counter: 0, 1, 2, ... The word is (epoch << 32 | claims
// so far), so no zeroing pass (a separate operation before every causal call) is needed. A claim is
// one atomicAdd; the claims that find another launch's epoch there (only the first few of a launch)
// race to install this one with a compare-and-swap, whose winner takes claim 0, and the others then
// add again (a compare-and-swap for every claim would make the blocks' first claims, which come all
// at once, wait on each other).
__device__ __forceinline__ int claim_tile(unsigned long long* counter, unsigned epoch) {
    unsigned long long taken = atomicAdd(counter, 1ull);
    while ((unsigned)(taken >> 32) != epoch) {
        const unsigned long long now = taken + 1;  // the stale word as this add left it
        const unsigned long long before = atomicCAS(counter, now, (unsigned long long)epoch << 32 | 1ull);
        if (before == now) return 0;
        taken = (unsigned)(before >> 32) == epoch ? atomicAdd(counter, 1ull) : before - 1;
    }
    return (int)(unsigned)taken;
}

// The tile a block takes after tile t: the next of a fixed round-robin, or with a tile counter the
// next one no block has taken yet (blocks that drew short causal tiles come back sooner).
__device__ __forceinline__ int next_tile(const Flash2ForwardParams& p, int t) {
    return p.tile_counter ? gridDim.x + claim_tile(p.tile_counter, p.tile_epoch) : t + gridDim.x;
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
            const int n = forward_key_block<C, CAUSAL>(tile, i);
            const int stage = ring % C::STAGES, phase = (ring / C::STAGES) & 1;
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
    // The stop value is ordered for the consumers as every tile index is (the arrival releases it,
    // q_full's wait acquires it; the buffer came back through q_empty only after their last reads).
    // Written with an atomic, not a plain store, only for compute-sanitizer's racecheck, which does not
    // follow that chain through a warpgroup's named barrier to its one arriving thread and reported
    // this store against the reads (a relaxed st.shared did not satisfy it); once per block, free.
    atomicExch(&sm.tile_of_q[qb], tiles);
    mbar_arrive(&sm.q_full[qb]);
}

// A consumer warp is done with a ring slot (its wgmma reads of it have completed).
__device__ __forceinline__ void release_slot(uint64_t* empty) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// TMA stores of consumer warpgroup cw's 64 rows of O from the Q tile (none where they all lie past T).
template <typename C, int HD>
__device__ __forceinline__ void store_o_rows(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                             const __nv_bfloat16* q_tile, int cw, int m0, int b, int h) {
    typedef typename C::QTile QTile;
    if (m0 + cw * 64 >= p.T) return;
#pragma unroll
    for (int j = 0; j < HD / QTile::SUB_COLS; j++)
        tma_store_4d(&maps.o, q_tile + j * (QTile::SUB_BYTES / 2) + cw * 64 * QTile::ROW_ELEMS, j * QTile::SUB_COLS,
                     h, m0 + cw * 64, b);
}

// O /= ℓ and LSE for this warpgroup's 64 rows; O goes through its rows of the Q tile (its own
// products no longer read them) and out by TMA. With the storer each warp tells it through o_full;
// without, one thread stores the rows, and the Q buffer is handed back (q_empty) at once with one
// buffer, with two by hand_back_previous_q during the next tile.
template <typename C, int HD>
__device__ __forceinline__ void forward_epilogue(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                 const Flash2ForwardSmem<C>& sm, __nv_bfloat16* q_tile, int qb,
                                                 int cw, int m0, int b, int h, float (&acc_o)[HD / 2],
                                                 const float (&row_max)[2], const float (&row_sum)[2]) {
    typedef typename C::QTile QTile;
    constexpr int CONSUMERS = C::CONSUMERS;
    const int tid = threadIdx.x % 128, g = (tid % 32) / 4, t4 = tid % 4;
    const int tile_row = cw * 64 + (tid / 32) * 16 + g;  // this thread's rows: tile_row, tile_row + 8
    float inv[2], lse[2];
    softmax_finish(row_max, row_sum, inv, lse);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = m0 + tile_row + 8 * half;
        if (t4 == 0 && row < p.T) p.lse[((long)b * p.NH + h) * p.T + row] = lse[half];
        float* row_f32 = p.out_f32 && row < p.T ? p.out_f32 + ((long)b * p.T + row) * p.out_stride + (long)h * HD
                                                 : NULL;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            const float o0 = acc_o[4 * nt + 2 * half] * inv[half], o1 = acc_o[4 * nt + 2 * half + 1] * inv[half];
            *(uint32_t*)(q_tile + QTile::index(tile_row + 8 * half, nt) + 2 * t4) = pack_bf16(o0, o1);
            if (row_f32) *(float2*)(row_f32 + nt * 8 + 2 * t4) = make_float2(o0, o1);
        }
    }
    fence_proxy_async();  // the TMA store reads what these ordinary stores wrote
    if (C::STORER) {
        __syncwarp();  // the warp's stores and fences before its one arrival (release)
        if (tid % 32 == 0) mbar_arrive(&sm.o_full[qb * CONSUMERS + cw]);
        return;
    }
    named_barrier_sync(C::EPILOGUE_BARRIER + cw, 128);
    if (tid == 0) {
        store_o_rows<C, HD>(p, maps, q_tile, cw, m0, b, h);
        bulk_commit();
        if (C::Q_BUFFERS == 1) {  // with two buffers this waits until the next tile's first product is issued
            bulk_wait_read();  // the next tile's Q may overwrite these rows only once the store has read them
            mbar_arrive(&sm.q_empty[qb]);
        }
    }
}

// Without the storer and with two Q buffers a warpgroup hands the previous tile's buffer back
// (q_empty) only once this tile's first product has been issued: its storing thread waits for the
// TMA store to read the O there with the tensor cores busy, not idle (the producer needs that
// buffer only for the tile after this one).
template <typename C>
__device__ __forceinline__ void hand_back_previous_q(const Flash2ForwardSmem<C>& sm, int iter) {
    if (!C::STORER && C::Q_BUFFERS == 2 && iter > 0 && threadIdx.x % 128 == 0) {
        bulk_wait_read();
        mbar_arrive(&sm.q_empty[(iter - 1) % 2]);
    }
}

// One thread: per tile, each consumer warpgroup's O stored by TMA as soon as that warpgroup has
// written it, then (once the stores have read shared memory) the Q buffer handed back. It follows
// the tiles through the Q buffers as the consumers do, and stops where they stop.
template <typename C, int HD, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void forward_store(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                              const Flash2ForwardSmem<C>& sm, int tiles) {
    typedef typename C::QTile QTile;
    constexpr int CONSUMERS = C::CONSUMERS;
    tma_prefetch_map(&maps.o);
#pragma unroll 1
    for (int iter = 0;; iter++) {
        const int qb = iter % C::Q_BUFFERS, parity = (iter / C::Q_BUFFERS) & 1;
        mbar_wait(&sm.q_full[qb], parity);
        const int t = sm.tile_of_q[qb];
        if (t >= tiles) break;
        const Flash2ForwardTile tile = forward_tile<C::BLOCK_M, BLOCK_N, CAUSAL>(p, t);
        const __nv_bfloat16* q_tile = sm.q + qb * QTile::ELEMS;
#pragma unroll 1
        for (int cw = 0; cw < CONSUMERS; cw++) {
            mbar_wait(&sm.o_full[qb * CONSUMERS + cw], parity);
            store_o_rows<C, HD>(p, maps, q_tile, cw, tile.m0, tile.b, tile.h);
        }
        bulk_commit();
        bulk_wait_read();  // the next Q may overwrite these rows only once the stores have read them
        mbar_arrive(&sm.q_empty[qb]);
    }
}

// A warpgroup's walk over key blocks none of its rows see: no products, so the other warpgroups
// have the tensor cores to themselves, but its place in the turns kept and each slot released once
// this use of it has landed (an earlier arrival would count for the slot's previous use).
template <typename C>
__device__ __forceinline__ void forward_skip_blocks(const Flash2ForwardSmem<C>& sm, int blocks, int& stage, int& phase,
                                                    int my_turn, int next_turn) {
    for (int i = 0; i < blocks; i++) {
        if (i > 0) {
            named_barrier_sync(my_turn, 256);
            named_barrier_arrive(next_turn, 256);
        }
        mbar_wait(&sm.k_full[stage], phase);
        release_slot(&sm.k_empty[stage]);
        mbar_wait(&sm.v_full[stage], phase);
        release_slot(&sm.v_empty[stage]);
        if (++stage == C::STAGES) stage = 0, phase ^= 1;
    }
}

// Consumer warpgroup cw, one tile: rows m0 + 64·cw ... of its query block against every key block.
// `ring` counts the K/V blocks consumed so far (the ring runs on across tiles).
template <typename C, int HD, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void forward_consume_tile(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                     const Flash2ForwardSmem<C>& sm, int cw,
                                                     const Flash2ForwardTile& tile, int& ring) {
    typedef typename C::QTile QTile;
    typedef typename C::KvTile KvTile;
    constexpr int CONSUMERS = C::CONSUMERS, NT = BLOCK_N / 8, KSTEPS = BLOCK_N / 16;
    const int tid = threadIdx.x % 128, t4 = tid % 4, n_blocks = tile.n_blocks;
    const int wg_row0 = tile.m0 + cw * 64, row = wg_row0 + (tid / 32) * 16 + tid % 32 / 4;
    const int qb = tile.iter % C::Q_BUFFERS;
    __nv_bfloat16* q_tile = sm.q + qb * QTile::ELEMS;
    const uint32_t q_addr = smem_address(q_tile) + QTile::row_offset(cw * 64);
    const uint32_t k_addr0 = smem_address(sm.k), v_addr0 = smem_address(sm.v);

    float acc_o[HD / 2], s[BLOCK_N / 2];
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, rescale[2];
    uint32_t pa[KSTEPS][4];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc_o[i] = 0.f;

    const uint64_t q_desc = QTile::k_major(q_addr);
    auto issue_qk = [&](int stage) {  // S = Q K(stage)ᵀ, 64 × BLOCK_N, k = HD
        const uint64_t k_desc = KvTile::k_major(k_addr0 + stage * C::KV_BYTES);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_N, 0, 0>(s, QTile::advance(q_desc, QTile::k_step(ks)),
                                    KvTile::advance(k_desc, KvTile::k_step(ks)), ks > 0);
    };
    auto issue_pv = [&](int stage) {  // O += P V(stage): V is MN-major (keys × HD)
        const uint64_t v_desc = KvTile::mn_major(v_addr0 + stage * C::KV_BYTES);
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) wgmma_rs<HD, 1>(acc_o, pa[kk], KvTile::advance(v_desc, KvTile::mn_step(kk)), 1);
    };
    auto softmax_block = [&](int n) {  // S of key block n → P (fp32, in place)
        const int n0 = n * BLOCK_N;
        if (n0 + BLOCK_N > p.T || (CAUSAL && n0 + BLOCK_N - 1 > wg_row0))
            mask_scores<NT, CAUSAL>(s, row, n0 + 2 * t4, p.T);
        online_softmax<NT>(s, row_max, row_sum, p.scale_log2, rescale);
    };
    auto p_to_bf16 = [&]() {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) accumulators_to_a(pa[kk], &s[8 * kk], &s[8 * kk + 4]);
    };
    const int my_turn = C::TURN_BARRIER + cw, next_turn = C::TURN_BARRIER + (cw + 1) % CONSUMERS;

    // Causal with three warpgroups, the key blocks this warpgroup's rows see: not the tile's last
    // blocks where they lie wholly above its rows' diagonal, none where its rows lie past T (the last
    // tile of a head). The others come first in the walk (last block first) and are skipped. With two
    // warpgroups (64-row halves of 128-row tiles over 128-key blocks) no block lies wholly above a
    // warpgroup's diagonal; non-causal only a warpgroup past T would skip, and the skip's code costs
    // more than it saves there, so both walk every block.
    constexpr bool FORWARD_SKIP = CAUSAL && CONSUMERS == 3;
    const int row_end = min(wg_row0 + 64, p.T);
    const int live = !FORWARD_SKIP       ? n_blocks
                     : row_end <= wg_row0 ? 0
                     : CAUSAL             ? min(n_blocks, (row_end + BLOCK_N - 1) / BLOCK_N)
                                          : n_blocks;
    int stage = ring % C::STAGES, phase = (ring / C::STAGES) & 1;
    forward_skip_blocks<C>(sm, n_blocks - live, stage, phase, my_turn, next_turn);
    if (live == 0) hand_back_previous_q<C>(sm, tile.iter);
    if (live > 0) {
        // after skipped blocks the first live one takes its turn, as it would have in the walk
        const bool turn = live < n_blocks;
        mbar_wait(&sm.k_full[stage], phase);
        if (turn) named_barrier_sync(my_turn, 256);
        wgmma_fence();
        issue_qk(stage);
        wgmma_commit();
        if (turn) named_barrier_arrive(next_turn, 256);
        hand_back_previous_q<C>(sm, tile.iter);
        wgmma_wait<0>();
        wgmma_fence_registers(s);
        release_slot(&sm.k_empty[stage]);
        softmax_block(forward_key_block<C, CAUSAL>(tile, n_blocks - live));
        p_to_bf16();

        for (int i = 1; i < live && !C::OVERLAP; i++) {  // O += P(j−1) V(j−1), then S(j), in one turn
            const int prev = stage, prev_phase = phase;
            if (++stage == C::STAGES) stage = 0, phase ^= 1;
            mbar_wait(&sm.v_full[prev], prev_phase);
            named_barrier_sync(my_turn, 256);
            wgmma_fence_registers(acc_o);
            wgmma_fence_operands(pa);
            wgmma_fence();
            issue_pv(prev);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_registers(acc_o);
            wgmma_fence_operands(pa);
            release_slot(&sm.v_empty[prev]);
            mbar_wait(&sm.k_full[stage], phase);
            wgmma_fence();
            issue_qk(stage);
            wgmma_commit();
            named_barrier_arrive(next_turn, 256);
            wgmma_wait<0>();
            wgmma_fence_registers(s);
            release_slot(&sm.k_empty[stage]);
            softmax_block(forward_key_block<C, CAUSAL>(tile, n_blocks - live + i));
            if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) rescale_rows<HD / 8>(acc_o, rescale);
            p_to_bf16();
        }
        for (int i = 1; i < live && C::OVERLAP; i++) {
            const int prev = stage, prev_phase = phase;
            if (++stage == C::STAGES) stage = 0, phase ^= 1;
            mbar_wait(&sm.k_full[stage], phase);
            named_barrier_sync(my_turn, 256);
            wgmma_fence_registers(acc_o);  // the rescale and the bf16 P are done before the products start
            wgmma_fence_operands(pa);
            wgmma_fence();
            issue_qk(stage);
            wgmma_commit();
            mbar_wait(&sm.v_full[prev], prev_phase);
            wgmma_fence();
            issue_pv(prev);
            wgmma_commit();
            named_barrier_arrive(next_turn, 256);
            wgmma_wait<1>();  // S(j) done; O += P(j−1) V(j−1) still running
            wgmma_fence_registers(s);
            release_slot(&sm.k_empty[stage]);
            softmax_block(forward_key_block<C, CAUSAL>(tile, n_blocks - live + i));
            wgmma_wait<0>();
            wgmma_fence_registers(acc_o);
            wgmma_fence_operands(pa);
            release_slot(&sm.v_empty[prev]);
            // a warp's own 16 rows: skipped when none of their maxima moved (most blocks, once they settle)
            if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) rescale_rows<HD / 8>(acc_o, rescale);
            p_to_bf16();
        }
        mbar_wait(&sm.v_full[stage], phase);
        wgmma_fence_registers(acc_o);
        wgmma_fence_operands(pa);
        wgmma_fence();
        issue_pv(stage);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_registers(acc_o);
        wgmma_fence_operands(pa);
        release_slot(&sm.v_empty[stage]);
    }
    ring += n_blocks;
    forward_epilogue<C, HD>(p, maps, sm, q_tile, qb, cw, tile.m0, tile.b, tile.h, acc_o, row_max, row_sum);
}

// Consumer warpgroup cw: its rows of every tile this block takes. The warpgroups take turns issuing
// their products through the tiles as one sequence (named barriers TURN_BARRIER + c).
template <typename C, int HD, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void forward_consume(const Flash2ForwardParams& p, const Flash2ForwardMaps& maps,
                                                const Flash2ForwardSmem<C>& sm, int cw, int tiles) {
    constexpr int CONSUMERS = C::CONSUMERS;
    if (cw == CONSUMERS - 1) named_barrier_arrive(C::TURN_BARRIER, 256);  // warpgroup 0 issues first
    int ring = 0;
    for (int iter = 0;; iter++) {
        const int qb = iter % C::Q_BUFFERS;
        mbar_wait(&sm.q_full[qb], (iter / C::Q_BUFFERS) & 1);
        const int t = sm.tile_of_q[qb];
        if (t >= tiles) break;
        Flash2ForwardTile tile = forward_tile<C::BLOCK_M, BLOCK_N, CAUSAL>(p, t);
        tile.iter = iter;
        forward_consume_tile<C, HD, BLOCK_N, CAUSAL>(p, maps, sm, cw, tile, ring);
    }
    // Warpgroup 0's turn was announced once more than it took (the first arrival above).
    if (cw == 0) named_barrier_sync(C::TURN_BARRIER, 256);
    if (!C::STORER && C::Q_BUFFERS == 2 && threadIdx.x % 128 == 0) bulk_wait_read();  // the last O store has read
}
#endif  // WGMMA_AVAILABLE

template <int HD, int BLOCK_N, int CONSUMERS, bool CAUSAL, bool STORER>
__global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    flash2_forward_ws_kernel(const __grid_constant__ Flash2ForwardMaps maps, const Flash2ForwardParams p) {
#if WGMMA_AVAILABLE
    typedef Flash2ForwardWsConfig<HD, BLOCK_N, CONSUMERS, STORER> C;
    extern __shared__ __align__(1024) __nv_bfloat16 smem_raw[];
    const Flash2ForwardSmem<C> sm = forward_smem<C>((uint8_t*)smem_raw);
    const int tiles = (p.T + C::BLOCK_M - 1) / C::BLOCK_M * (p.B * p.NH);
    if (threadIdx.x == 0) {
        for (int q = 0; q < C::Q_BUFFERS; q++) {
            mbar_init(&sm.q_full[q], 1);
            // once the tile's O has left: the storer, or each consumer's storing thread
            mbar_init(&sm.q_empty[q], C::STORER ? 1 : CONSUMERS);
            for (int c = 0; c < CONSUMERS && C::STORER; c++) mbar_init(&sm.o_full[q * CONSUMERS + c], 4);  // per warp
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
        if (C::STORER && threadIdx.x == 32) forward_store<C, HD, BLOCK_N, CAUSAL>(p, maps, sm, tiles);
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
// p->tile_counter when that is given (with a new epoch, no zeroing) or round-robin; otherwise one
// block per tile.
template <int HD, int BLOCK_N, int CONSUMERS, bool CAUSAL, bool PERSISTENT = true, bool STORER = false>
static inline void launch_forward_ws(const Flash2ForwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2ForwardWsConfig<HD, BLOCK_N, CONSUMERS, STORER> C;
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
    if (params.tile_counter) {
        params.tile_epoch = flash2_next_tile_epoch();
        // A captured graph replays this epoch: there the word is zeroed inside the graph, before the kernel.
        cudaStreamCaptureStatus capture;
        ATTN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
        if (capture != cudaStreamCaptureStatusNone)
            ATTN_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(*params.tile_counter), stream));
    }
    launch_with_smem<flash2_forward_ws_kernel<HD, BLOCK_N, CONSUMERS, CAUSAL, STORER>>(
        dim3(persistent && tiles > flash2_sm_count() ? flash2_sm_count() : tiles), C::THREADS, C::SMEM_BYTES, stream,
        maps, params);
}

#endif  // FLASH2_FORWARD_HOPPER_CUH
