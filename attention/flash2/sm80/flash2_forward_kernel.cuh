// flash2_forward_kernel.cuh: FlashAttention-2 forward (Algorithm 1 of the paper) on mma.sync tensor cores.
//
// Inputs q (B, T, NH, HD) rows at qkv_stride, k and v (B, T, NKV, HD) rows at kv_stride (attention.h);
// outputs out (B, T, NH, HD) bf16 at out_stride and lse (B, NH, T) fp32 (natural log). Query head h
// reads K/V head h / (NH / NKV) (grouped-query attention: nothing else changes in the forward).
//
// One thread block per (query block of BLOCK_M rows, b·NH + h); the query block is split across
// warps (WARP_ROWS rows each), so no warp needs another's results (no split-K). Each block loops
// over key/value blocks of BLOCK_N rows, double-buffered in shared memory with cp.async, and keeps
// the running row max m, the running row sum ℓ and the unnormalized O in registers, dividing by ℓ
// once at the end (deferred normalization). Only O and LSE = m + log ℓ are written.
// Causal: key blocks wholly above the diagonal are skipped, and masking is applied only to the
// blocks that cross the diagonal or the end of the sequence. The arithmetic (masking, online softmax,
// rescale, O/LSE epilogue) is attention_math.cuh's.
#ifndef FLASH2_FORWARD_KERNEL_CUH
#define FLASH2_FORWARD_KERNEL_CUH

#include "attention/common/cuda_check.h"
#include "attention/common/attention_math.cuh"
#include "attention/common/mma_common.cuh"
#include "attention/flash2/flash2_params.h"

template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS>
struct Flash2ForwardConfig {
    static constexpr int THREADS = NWARPS * 32;
    static constexpr int WARP_ROWS = BLOCK_M / NWARPS;
    static constexpr int M_TILES = WARP_ROWS / 16;  // m16 tiles per warp
    static constexpr int N_TILES = BLOCK_N / 8;     // n8 tiles of S per key block
    static constexpr int D_TILES = HD / 8;          // n8 tiles of O
    static constexpr int D_STEPS = HD / 16;         // k16 steps of S = Q Kᵀ
    // Q fragments stay in registers when they are few; otherwise they are re-read from shared memory.
    static constexpr bool Q_IN_REGS = M_TILES * D_STEPS * 4 <= 32;
    typedef SmemTile<HD> Tile;
    static constexpr int Q_ELEMS = Tile::elems(BLOCK_M);
    static constexpr int KV_ELEMS = Tile::elems(BLOCK_N);
    static constexpr size_t SMEM_BYTES = (size_t)(Q_ELEMS + 4 * KV_ELEMS) * sizeof(__nv_bfloat16);
    static_assert(WARP_ROWS % 16 == 0 && BLOCK_N % 16 == 0 && HD % 16 == 0, "tile shapes");
    static_assert(!Tile::SWIZZLE || D_TILES % 2 == 0, "SmemTile::at needs even chunks in swizzled tiles");
};

template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS, int MIN_BLOCKS, bool CAUSAL>
__global__ void __launch_bounds__(NWARPS * 32, MIN_BLOCKS) flash2_forward_kernel(Flash2ForwardParams p) {
    typedef Flash2ForwardConfig<HD, BLOCK_M, BLOCK_N, NWARPS> C;
    typedef typename C::Tile Tile;
    extern __shared__ __align__(128) __nv_bfloat16 smem[];
    __nv_bfloat16* q_tile = smem;                       // (BLOCK_M, HD)
    __nv_bfloat16* k_tiles = smem + C::Q_ELEMS;         // 2 × (BLOCK_N, HD)
    __nv_bfloat16* v_tiles = k_tiles + 2 * C::KV_ELEMS;  // 2 × (BLOCK_N, HD)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    // Heaviest causal query blocks (the last ones) go first, so the short ones fill the tail.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH;
    const int T = p.T;
    const long kv_stride = p.kv_stride, kv_offset = (long)b * T * kv_stride + (long)(h / (p.NH / p.NKV)) * HD;
    const __nv_bfloat16* q_base = p.q + (long)b * T * p.qkv_stride + (long)h * HD + (long)m0 * p.qkv_stride;
    const __nv_bfloat16* k_base = p.k + kv_offset;
    const __nv_bfloat16* v_base = p.v + kv_offset;

    const int key_end = CAUSAL ? min(T, m0 + BLOCK_M) : T;
    const int n_blocks = (key_end + BLOCK_N - 1) / BLOCK_N;

    load_tile_async<BLOCK_M, HD, C::THREADS>(q_tile, q_base, p.qkv_stride, T - m0);
    cp_async_commit();
    load_tile_async<BLOCK_N, HD, C::THREADS>(k_tiles, k_base, kv_stride, T);
    cp_async_commit();
    load_tile_async<BLOCK_N, HD, C::THREADS>(v_tiles, v_base, kv_stride, T);
    cp_async_commit();

    float acc_o[C::M_TILES][C::D_TILES][4];
    float row_max[C::M_TILES][2], row_sum[C::M_TILES][2];  // rows g and g+8 of each m tile
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; mt++) {
#pragma unroll
        for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc_o[mt][dt][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    uint32_t q_frag[C::Q_IN_REGS ? C::M_TILES : 1][C::Q_IN_REGS ? C::D_STEPS : 1][4];
    const int warp_row0 = warp * C::WARP_ROWS;
    const uint32_t q_lane = Tile::lane_base(q_tile, a_row(lane), a_chunk(lane));

    for (int n = 0; n < n_blocks; n++) {
        const int n0 = n * BLOCK_N;
        const uint32_t k_lane = Tile::lane_base(k_tiles + (n & 1) * C::KV_ELEMS, b_row(lane), b_chunk(lane));
        const uint32_t v_lane = Tile::lane_base(v_tiles + (n & 1) * C::KV_ELEMS, bt_row(lane), bt_chunk(lane));
        // One barrier both publishes K_n and frees the other buffer (every warp has left iteration
        // n-1), so the prefetch of block n+1 goes after it.
        cp_async_wait<1>();  // Q and K_n have landed (V_n may still be in flight)
        __syncthreads();
        if (n + 1 < n_blocks) {
            const long next = (long)(n0 + BLOCK_N) * kv_stride;
            load_tile_async<BLOCK_N, HD, C::THREADS>(k_tiles + ((n + 1) & 1) * C::KV_ELEMS, k_base + next, kv_stride,
                                                     T - n0 - BLOCK_N);
            cp_async_commit();
            load_tile_async<BLOCK_N, HD, C::THREADS>(v_tiles + ((n + 1) & 1) * C::KV_ELEMS, v_base + next, kv_stride,
                                                     T - n0 - BLOCK_N);
            cp_async_commit();
        } else {
            cp_async_commit();
            cp_async_commit();
        }

        if (C::Q_IN_REGS && n == 0) {
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
                for (int ks = 0; ks < C::D_STEPS; ks++)
                    ldmatrix_x4(q_frag[C::Q_IN_REGS ? mt : 0][C::Q_IN_REGS ? ks : 0],
                                Tile::at(q_lane, warp_row0 + mt * 16, ks * 2));
        }

        // S = Q Kᵀ (WARP_ROWS × BLOCK_N per warp), fp32
        float s[C::M_TILES][C::N_TILES][4];
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
            for (int nt = 0; nt < C::N_TILES; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < C::D_STEPS; ks++) {
            uint32_t a[C::M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++) {
                if (C::Q_IN_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[mt][e] = q_frag[C::Q_IN_REGS ? mt : 0][C::Q_IN_REGS ? ks : 0][e];
                } else {
                    ldmatrix_x4(a[mt], Tile::at(q_lane, warp_row0 + mt * 16, ks * 2));
                }
            }
#pragma unroll
            for (int np = 0; np < C::N_TILES / 2; np++) {
                uint32_t kb[4];
                ldmatrix_x4(kb, Tile::at(k_lane, np * 16, ks * 2));
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++) {
                    mma_16816(s[mt][2 * np], a[mt], kb[0], kb[1]);
                    mma_16816(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
                }
            }
        }

        // Mask keys past the end of the sequence and, on diagonal blocks, keys after the query.
        const bool needs_mask = n0 + BLOCK_N > T || (CAUSAL && n0 + BLOCK_N - 1 > m0);
        if (needs_mask) {
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++)
                mask_scores<C::N_TILES, CAUSAL>(&s[mt][0][0], m0 + warp_row0 + mt * 16 + g, n0 + 2 * t4, T);
        }

        // Online softmax: new row max, P = exp2(S·scale_log2 − max), and the running sum and O
        // rescaled by exp2(old max − new max) (O's multiply skipped when no row of the warp moved).
        float rescale[C::M_TILES][2];
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; mt++)
            online_softmax<C::N_TILES>(&s[mt][0][0], row_max[mt], row_sum[mt], p.scale_log2, rescale[mt]);
        rescale_rows_if_moved(acc_o, rescale);

        cp_async_wait<2>();  // V_n has landed
        __syncthreads();

        // O += P V, P straight from the S accumulators (bf16)
#pragma unroll
        for (int ks = 0; ks < BLOCK_N / 16; ks++) {
            uint32_t a[C::M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++) accumulators_to_a(a[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
#pragma unroll
            for (int dp = 0; dp < C::D_TILES / 2; dp++) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, Tile::at(v_lane, ks * 16, dp * 2));
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++) {
                    mma_16816(acc_o[mt][2 * dp], a[mt], vb[0], vb[1]);
                    mma_16816(acc_o[mt][2 * dp + 1], a[mt], vb[2], vb[3]);
                }
            }
            if (C::D_TILES % 2) {  // head dim 80: one n8 tile left over
                uint32_t vb[2];
                ldmatrix_x2_trans(vb, Tile::at(v_lane, ks * 16, C::D_TILES - 1));  // unswizzled (HD 80)
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++) mma_16816(acc_o[mt][C::D_TILES - 1], a[mt], vb[0], vb[1]);
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue: O /= ℓ, LSE = (m + log2 ℓ)·ln 2. Each warp writes its rows of O into its own rows of
    // the Q tile (no other warp reads them), then stores them with 16-byte writes.
    float* lse_row = p.lse + (long)bh * T;
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; mt++) {
        float inv[2], lse[2];
        softmax_finish(row_max[mt], row_sum[mt], inv, lse);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = warp_row0 + mt * 16 + g + 8 * half;
            if (t4 == 0 && m0 + row < T) lse_row[m0 + row] = lse[half];
            float* row_f32 = p.out_f32 && m0 + row < T
                                 ? p.out_f32 + ((long)b * T + m0 + row) * p.out_stride + (long)h * HD
                                 : NULL;
#pragma unroll
            for (int dt = 0; dt < C::D_TILES; dt++) {
                const float o0 = acc_o[mt][dt][2 * half] * inv[half], o1 = acc_o[mt][dt][2 * half + 1] * inv[half];
                *(uint32_t*)(q_tile + Tile::index(row, dt) + 2 * t4) = pack_bf16(o0, o1);
                if (row_f32) *(float2*)(row_f32 + dt * 8 + 2 * t4) = make_float2(o0, o1);
            }
        }
    }
    __syncwarp();
    store_tile<C::WARP_ROWS, HD, 32>(p.out + ((long)b * T + m0 + warp_row0) * p.out_stride + (long)h * HD,
                                     p.out_stride, q_tile + Tile::index(warp_row0, 0), T - m0 - warp_row0,
                                     warp * 32);
}

// ---- launch -------------------------------------------------------------------------------------
template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS, int MIN_BLOCKS, bool CAUSAL>
static inline void launch_forward(const Flash2ForwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2ForwardConfig<HD, BLOCK_M, BLOCK_N, NWARPS> C;
    launch_with_smem<flash2_forward_kernel<HD, BLOCK_M, BLOCK_N, NWARPS, MIN_BLOCKS, CAUSAL>>(
        dim3((p->T + BLOCK_M - 1) / BLOCK_M, B * p->NH), C::THREADS, C::SMEM_BYTES, stream, *p);
}

#endif  // FLASH2_FORWARD_KERNEL_CUH
