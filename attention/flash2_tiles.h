// flash2_tiles.h: the tile shapes of flash2's Hopper kernels per head dim and mask, in one place:
// the launchers (flash2_forward.cu, flash2_backward.cu) and the tuner (flash2_tune.cu, which times
// these against alternatives and marks them) all read them from here.
#ifndef FLASH2_TILES_H
#define FLASH2_TILES_H

// Forward (flash2_forward_hopper.cuh): 64·CONSUMERS query rows per block, BLOCK_N keys per step;
// PERSISTENT: one block per multiprocessor walks the tiles (else one block per tile): non-causal
// round-robin, causal taking the next tile from a counter in the workspace (tiles differ in length;
// without a workspace, one block per tile).
// CONSUMERS: 3 at head dim 64, except causal up to CAUSAL_SHORT_T tokens, where 2 (more, shorter
// tiles) balance the SMs better; else 2.
template <int HD, bool CAUSAL>
struct Flash2ForwardTiles {
    static constexpr int CAUSAL_SHORT_T = 1024;
    static constexpr int consumers(int T) { return HD == 64 && !(CAUSAL && T <= CAUSAL_SHORT_T) ? 3 : 2; }
    static constexpr int BLOCK_N = 128;
    static constexpr bool PERSISTENT = true;
};

// Backward (flash2_backward_hopper.cuh): 128 keys per block, BLOCK_M queries per step (registers allow
// 128 only at head dim 64); DK_FROM_SMEM: dK's product reads dSᵀ from shared memory (faster only
// at head dim 128 without the mask).
template <int HD, bool CAUSAL>
struct Flash2BackwardTiles {
    static constexpr int BLOCK_M = HD == 64 ? 128 : 64;
    static constexpr bool DK_FROM_SMEM = HD == 128 && !CAUSAL;
};

#endif  // FLASH2_TILES_H
