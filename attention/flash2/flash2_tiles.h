// flash2_tiles.h: the tile shapes of flash2's Hopper kernels per head dim and mask, in one place:
// the launchers (flash2_forward.cu, flash2_backward.cu) and the tuner (flash2_tune.cu, which times
// these against alternatives and marks them) all read them from here. Host code only (constants).
// Each shape is the fastest the tuner found on an H100; the measurements are in attention/PERF_NOTES.md.
#ifndef FLASH2_TILES_H
#define FLASH2_TILES_H

// Forward (flash2_forward_hopper.cuh): 64·CONSUMERS query rows per block, BLOCK_N keys per step,
// persistent (one block per multiprocessor walks the tiles: non-causal round-robin, causal taking the
// next tile from a counter in the workspace, as tiles differ in length; without a workspace causal
// runs one block per tile).
// CONSUMERS: consumer warpgroups of 64 query rows each: 3, but 2 at head dim 128, where three pay
// only on long sequences (LONG_T). BLOCK_N: 128 keys, which beat 96 everywhere but at head dim 80
// causal.
// LONG_T: from this many keys on (0: never) LONG_CONSUMERS warpgroups instead: at head dim 128 three
// win from 2k keys on and lose below. Read through flash2_forward_long_shape (below).
// STORER: a thread of the producer warpgroup issues the O stores instead of one of each consumer
// warpgroup; it wins non-causal at head dims 64 and 96 only.
template <int HD, bool CAUSAL>
struct Flash2ForwardTiles {
    static constexpr int CONSUMERS = HD == 128 ? 2 : 3;
    static constexpr int BLOCK_N = HD == 80 && CAUSAL ? 96 : 128;
    static constexpr int LONG_T = HD == 128 ? 2048 : 0, LONG_CONSUMERS = 3;
    static constexpr bool STORER = !CAUSAL && (HD == 64 || HD == 96);
};

// Whether a head dim's forward takes its LONG_CONSUMERS shape at T keys: from LONG_T on (never
// where LONG_T is 0), or, with override_t > 0, from override_t keys on for every head dim that has
// the shape (FLASH2_FORWARD_LONG_T, attention.h's AttentionFlash2Settings: the tests and the
// sanitizer script reach that shape at short lengths with it).
inline bool flash2_forward_long_shape(int tiles_long_t, int T, int override_t) {
    return tiles_long_t > 0 && T >= (override_t > 0 ? override_t : tiles_long_t);
}

// How a backward consumer warpgroup orders its products within a step (bits of SCHEDULE below):
//   BWD_DQ_FIRST  dQ(j−1) is issued before dV, dK of step j (not after), so its result is staged
//                 to shared memory while dV and dK run, instead of after them with the tensor cores idle
//   BWD_PINGPONG  the two warpgroups take turns issuing their batches of products (Sᵀ, dPᵀ; then dQ,
//                 dV, dK; named barriers), so one's Pᵀ/dSᵀ arithmetic runs while the other's products do
enum { BWD_DQ_FIRST = 1, BWD_PINGPONG = 2 };

// Backward (flash2_backward_hopper.cuh): 128 keys per block, BLOCK_M queries per step (registers allow
// 128 only at head dim 64); DK_FROM_SMEM: dK's product reads dSᵀ from shared memory; SCHEDULE: the
// order of the products (above): dQ first without ping-pong at 64, 96 and 128, neither at 80.
template <int HD, bool CAUSAL>
struct Flash2BackwardTiles {
    static constexpr int BLOCK_M = HD == 64 ? 128 : 64;
    static constexpr bool DK_FROM_SMEM = HD == 128 || HD == 64;
    static constexpr int SCHEDULE = HD == 80 ? 0 : BWD_DQ_FIRST;
};

#endif  // FLASH2_TILES_H
