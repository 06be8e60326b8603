// flash2_tiles.h: the tile shapes of flash2's Hopper kernels per head dim and mask, in one place:
// the launchers (flash2_forward.cu, flash2_backward.cu) and the tuner (flash2_tune.cu, which times
// these against alternatives and marks them) all read them from here.
#ifndef FLASH2_TILES_H
#define FLASH2_TILES_H

#include <stdlib.h>  // getenv, atoi: the FLASH2_FORWARD_LONG_T override

// Forward (flash2_forward_hopper.cuh): 64·CONSUMERS query rows per block, BLOCK_N keys per step,
// persistent (one block per multiprocessor walks the tiles: non-causal round-robin, causal taking the
// next tile from a counter in the workspace, as tiles differ in length; without a workspace causal
// runs one block per tile).
// CONSUMERS: 2 at head dim 128; 3 at 64, 80 and 96. BLOCK_N: 128, but 96 at 80 causal.
// Measured with build/flash2_tune on an H100 (attention/PERF_NOTES.md): three × 96 keys beat two ×
// 128 at 80 and 96 by 3-29% (equal at d80 non-causal 512); three × 128 (a warpgroup then finishes
// O += P(j−1) V(j−1) before S(j): no registers for both, Flash2ForwardWsConfig::OVERLAP) beat three
// × 96 non-causal by 4-8% at 512-2k and 1-4% at 4k-16k (no key padding at lengths that are
// multiples of 128), and tie causal (−3% at 512-1k to +2% at 16k); since head dim 96 loads its tiles
// in 32-column boxes (wgmma.cuh's WIDE32), 128 keys also win causal there (+1.8-2.7% from 1k, +1.6%
// at 512), so 96 keys remain at head dim 80 causal only; at 64 causal, since a warpgroup
// skips the key blocks wholly above its diagonal, three are as fast as two or faster at every
// length (before the skip two were ahead at 512-1k).
// LONG_T: from this many keys on (0: never) LONG_CONSUMERS warpgroups instead: at 128 three over
// 128-key blocks (no intra-warpgroup overlap, as at 80 non-causal and 96) beat two by 2-6% from 2k
// on, causal or not, and lose up to 2.5% at 512-1k. The launcher (flash2_forward.cu) and the tuner
// read it through flash2_forward_long_shape (below), with FLASH2_FORWARD_LONG_T in the environment
// as an override for tests.
// STORER: a thread of the producer warpgroup issues the O stores instead of one of each consumer
// warpgroup: +3-7% at 64 non-causal and up to +3% at 96 non-causal, but 1.5% slower at 64 causal and
// 1-3% at 128 (where its three-warpgroup kernel also spills in its loop with it), ±1% at 80.
template <int HD, bool CAUSAL>
struct Flash2ForwardTiles {
    static constexpr int CONSUMERS = HD == 128 ? 2 : 3;
    static constexpr int BLOCK_N = HD == 80 && CAUSAL ? 96 : 128;
    static constexpr int LONG_T = HD == 128 ? 2048 : 0, LONG_CONSUMERS = 3;
    static constexpr bool STORER = !CAUSAL && (HD == 64 || HD == 96);
};

// FLASH2_FORWARD_LONG_T=N in the environment: N > 0, else 0 (read once per process).
inline int flash2_forward_long_t_env(void) {
    static int override_t = -1;
    if (override_t < 0) {
        const char* env = getenv("FLASH2_FORWARD_LONG_T");
        override_t = env && env[0] ? atoi(env) : 0;
        if (override_t < 0) override_t = 0;
    }
    return override_t;
}

// Whether a head dim's forward takes its LONG_CONSUMERS shape at T keys: from LONG_T on (never
// where LONG_T is 0), or from the override's length for every head dim that has the shape (the
// tests and the sanitizer script use it to reach that shape at short lengths).
inline bool flash2_forward_long_shape(int tiles_long_t, int T) {
    const int override_t = flash2_forward_long_t_env();
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
// order of the products (above). Measured with build/flash2_tune on an H100 (attention/PERF_NOTES.md),
// since the consumer step's instructions were halved (wgmma descriptors advanced by constants): dQ
// first without ping-pong at 64, 96 and 128 (up to 10% over both at d96 8k; ping-pong now costs the
// shorter step more than it hides), neither at 80 (2-7% non-causal); dK from shared memory at 64
// and 128.
template <int HD, bool CAUSAL>
struct Flash2BackwardTiles {
    static constexpr int BLOCK_M = HD == 64 ? 128 : 64;
    static constexpr bool DK_FROM_SMEM = HD == 128 || HD == 64;
    static constexpr int SCHEDULE = HD == 80 ? 0 : BWD_DQ_FIRST;
};

#endif  // FLASH2_TILES_H
