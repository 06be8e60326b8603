// attention_math.cuh: the attention arithmetic every flash kernel shares (flash1, flash2 on
// mma.sync, flash2 on Hopper), so that they differ only in how they move data.
//
// All of it works on one thread's share of a score tile in the accumulator layout of
// mma.m16n8k16, which wgmma's accumulators also follow (mma_common.cuh): NT n8 tiles of
// 4 floats, where elements 0 and 1 of tile nt are (row, col0 + 8·nt) and (row, col0 + 8·nt + 1),
// and elements 2 and 3 the same columns of row + 8. `col0` is the thread's first column (the
// block's first column + 2·(lane % 4)). The four lanes of a quad (lane / 4 equal) share rows, so
// row reductions are two shuffles.
//
// Forward (Algorithm 1 of the FlashAttention-2 paper), per key block:
//   mask_scores       keys past T, and keys after the query when causal, to −∞
//   online_softmax    new row max m, P = exp2(S·scale_log2 − m) in place, running sum ℓ, and the
//                     factor exp2(m_old − m) that the output accumulator is multiplied by
//   rescale_rows      O ·= that factor
// and once at the end softmax_finish: 1/ℓ for the deferred normalization and the row's
// log-sum-exp (natural log). Backward (Algorithm 2), per block of Sᵀ (rows keys, columns queries):
//   probs_from_scores   P = exp2(S·scale_log2 − LSE·log2 e), masked to 0
//   dscores_from_probs  dS = P ∘ (dP − D)
// The mma.sync and flash1 kernels also use rescale_rows_if_moved (the rescale skipped by a warp
// vote when no row max moved) and block_softmax (the softmax of one key block alone: flash1's
// per-warp slice); flash1's merge across warps also uses softmax_base, softmax_inv and softmax_lse
// (one row's exponent base, 1/ℓ and LSE), which the softmaxes here are built from too, with
// quad_row_max and exp2_row.
#ifndef ATTENTION_MATH_CUH
#define ATTENTION_MATH_CUH

#include <math.h>

#include "attention/common/mma_common.cuh"

// s: NT n8 tiles of scores at rows (row, row + 8) and columns col0 + 8·nt + {0, 1}.
template <int NT, bool CAUSAL>
__device__ __forceinline__ void mask_scores(float* s, int row, int col0, int T) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = row + (e >= 2 ? 8 : 0), c = col0 + nt * 8 + (e & 1);
            if (c >= T || (CAUSAL && c > r)) s[4 * nt + e] = -INFINITY;
        }
}

// The exponent base of a row whose max is m (units of S·scale_log2): m, or 0 for a row whose keys
// are all masked (m = −∞), so that exp2(x − base) gives 0 there, not NaN.
__device__ __forceinline__ float softmax_base(float row_max) { return row_max == -INFINITY ? 0.f : row_max; }

// 1/ℓ for the deferred normalization, 0 for a row with no keys (ℓ = 0).
__device__ __forceinline__ float softmax_inv(float row_sum) { return row_sum > 0.f ? 1.f / row_sum : 0.f; }

// The row's log-sum-exp (natural log) from m (units of S·scale_log2) and ℓ.
__device__ __forceinline__ float softmax_lse(float row_max, float row_sum) {
    return (row_max + __log2f(row_sum)) * FLASH2_LN2;
}

// A row's sum over the quad (the four lanes that share its rows).
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Half `half` of this thread's score rows (row for 0, row + 8 for 1): the row's max over the quad.
template <int NT>
__device__ __forceinline__ float quad_row_max(const float* s, int half) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// P = exp2(S·scale_log2 − base) in place for half `half` of the rows; returns this thread's sum of it.
template <int NT>
__device__ __forceinline__ float exp2_row(float* s, int half, float scale_log2, float base) {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; e++) {
            s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], scale_log2, -base));
            sum += s[4 * nt + e];
        }
    return sum;
}

// One online-softmax step (the paper's line 10 of Algorithm 1, in base 2). row_max holds
// m·scale_log2 per row; row_sum is this thread's partial ℓ (its columns only; softmax_finish adds
// the quad's). A row whose keys are all masked so far keeps m = −∞ and gets P = 0, not NaN.
template <int NT>
__device__ __forceinline__ void online_softmax(float* s, float (&row_max)[2], float (&row_sum)[2], float scale_log2,
                                               float (&rescale)[2]) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float new_max = fmaxf(row_max[half], quad_row_max<NT>(s, half) * scale_log2);
        const float base = softmax_base(new_max);
        rescale[half] = fast_exp2(row_max[half] - base);
        row_max[half] = new_max;
        row_sum[half] = row_sum[half] * rescale[half] + exp2_row<NT>(s, half, scale_log2, base);
    }
}

// acc: NT n8 tiles at rows (row, row + 8), each row multiplied by its factor.
template <int NT>
__device__ __forceinline__ void rescale_rows(float* acc, const float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < 4 * NT; i++) acc[i] *= rescale[(i % 4) / 2];
}

// After the last key block: the quad's sums, 1/ℓ (0 for an empty row) and LSE = (m + log2 ℓ)·ln 2.
__device__ __forceinline__ void softmax_finish(const float (&row_max)[2], const float (&row_sum)[2], float (&inv)[2],
                                               float (&lse)[2]) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float sum = quad_sum(row_sum[half]);
        inv[half] = softmax_inv(sum);
        lse[half] = softmax_lse(row_max[half], sum);
    }
}

// Backward, in place: s (Sᵀ) becomes Pᵀ = exp2(S·scale_log2 − LSE·log2 e), for rows key and key + 8
// and columns col0 + 8·nt + {0, 1} (queries; col0 is the block's first query + 2·(lane % 4)).
// lse_log2[j] is that of column col0 + j (8-byte aligned). With `masked`, entries with a key or
// query past T, or (causal) key > query, become 0. Up to 8 tiles the LSE values are read as pairs
// (half the shared-memory loads); with more, the pairs' registers make ptxas spill (d64's 128 rows).
template <int NT, bool CAUSAL>
__device__ __forceinline__ void probs_from_scores(float* s, int key, int col0, int T, bool masked,
                                                  const float* lse_log2, float scale_log2) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 lse = NT <= 8 ? *(const float2*)&lse_log2[nt * 8]  // columns col0 + 8·nt + {0, 1}
                                   : make_float2(lse_log2[nt * 8], lse_log2[nt * 8 + 1]);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = nt * 8 + (e & 1);
            const int k = key + (e >= 2 ? 8 : 0), q = col0 + j;
            float pe = fast_exp2(fmaf(s[4 * nt + e], scale_log2, -((e & 1) ? lse.y : lse.x)));
            if (masked && (k >= T || q >= T || (CAUSAL && k > q))) pe = 0.f;
            s[4 * nt + e] = pe;
        }
    }
}

// Backward, in place: dp (dPᵀ) becomes dSᵀ = Pᵀ ∘ (dPᵀ − D), same layout; d[j] = rowsum(dO ∘ O) of
// column col0 + j (8-byte aligned; read as pairs up to 8 tiles, as in probs_from_scores).
template <int NT>
__device__ __forceinline__ void dscores_from_probs(float* dp, const float* p, const float* d) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 dd = NT <= 8 ? *(const float2*)&d[nt * 8] : make_float2(d[nt * 8], d[nt * 8 + 1]);
#pragma unroll
        for (int e = 0; e < 4; e++) dp[4 * nt + e] = p[4 * nt + e] * (dp[4 * nt + e] - ((e & 1) ? dd.y : dd.x));
    }
}

// ---- used by the mma.sync and flash1 kernels only ---------------------------------------------
// Several m16 tiles per warp (the mma.sync forward): O ·= the online softmax's factors, skipped when
// every row of the warp kept its max (all factors 1, as in most key blocks once the maxima settle).
// The test is a warp vote, so the branch is uniform. acc: MT m16 tiles × NT n8 tiles.
template <int MT, int NT>
__device__ __forceinline__ void rescale_rows_if_moved(float (&acc)[MT][NT][4], const float (&rescale)[MT][2]) {
    bool changed = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) changed |= rescale[mt][0] != 1.f || rescale[mt][1] != 1.f;
    if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) rescale_rows<NT>(&acc[mt][0][0], rescale[mt]);
    }
}

// The softmax of one key block on its own, not online (flash1's per-warp slice of keys, whose
// statistics are merged across warps afterwards): row_max = m = rowmax(S)·scale_log2,
// P = exp2(S·scale_log2 − m) in place, row_sum = ℓ = rowsum(P) over the quad (whole rows).
template <int NT>
__device__ __forceinline__ void block_softmax(float* s, float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        row_max[half] = quad_row_max<NT>(s, half) * scale_log2;
        row_sum[half] = quad_sum(exp2_row<NT>(s, half, scale_log2, softmax_base(row_max[half])));
    }
}

#endif  // ATTENTION_MATH_CUH
