// flash1_forward.cu: FlashAttention-1 forward (the reference's "Flash Attention 1", Algorithm 1 of the
// FlashAttention paper) on mma.sync tensor cores.
//
// Inputs q (B, T, NH, HD) rows at qkv_stride, k and v (B, T, NKV, HD) rows at kv_stride (attention.h;
// query head h reads K/V head h / (NH / NKV)); outputs out (B, T, NH, HD) bf16 at out_stride and lse
// (B, NH, T) fp32 (natural log), as flash2.
// Workspace (fp32): o_accum (B, NH, T, HD), row_max and row_sum (B, NH, T): the running O, m and ℓ
// of every query row, kept in HBM between key blocks. Nothing of size T².
//
// One thread block per (b, h) (grid = B·NH), looping over the sequence by itself:
//   for each key block j (BLOCK_N keys; K_j, V_j in shared memory; each warp's K slice in registers)
//     for each query block i (BLOCK_M rows; Q_i, O_i, m_i, ℓ_i prefetched from HBM with cp.async)
//       each warp w, on its slice of KEYS_PER_WARP keys (split-K):
//         S_w = Q_i K_wᵀ, m_w = rowmax(S_w), P_w = exp(S_w − m_w), ℓ_w = rowsum(P_w), PV_w = P_w V_w
//       and writes m_w, ℓ_w, PV_w to shared memory; after a barrier all threads reduce them:
//         m̃ = max_w m_w,  m_new = max(m_i, m̃),
//         ℓ_new = e^{m_i − m_new} ℓ_i + Σ_w e^{m_w − m_new} ℓ_w,
//         O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i) e^{m_i − m_new} O_i + Σ_w e^{m_w − m_new} PV_w)
//       (Σ_w e^{m_w − m_new} PV_w is the reference's e^{m̃ − m_new} P̃_ij V_j with P̃_ij = e^{S_ij − m̃})
//       and write O_i, m_i, ℓ_i back to HBM; on a query block's last key block, O_i goes to `out`
//       in bf16 and LSE = m + log ℓ to `lse` instead.
// Causal: query blocks wholly before the key block are not visited, a warp whose keys all lie
// after the query block skips its products, and masking is applied only to slices that cross the
// diagonal or the end of the sequence.
// Exponentials are base 2 of S·scale·log2(e); m is kept in those units in HBM. The arithmetic (masking,
// the per-warp softmax, the merge's base, 1/ℓ and LSE) is attention_math.cuh's.
#include <stdio.h>
#include <stdlib.h>

#include "attention/common/cuda_check.h"
#include "attention/common/attention_math.cuh"
#include "attention/backends.h"
#include "attention/common/alignment.h"
#include "attention/common/mma_common.cuh"
#include "attention/flash1/flash1_params.h"

template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS>
struct Flash1ForwardConfig {
    static constexpr int THREADS = NWARPS * 32;
    static constexpr int KEYS_PER_WARP = BLOCK_N / NWARPS;  // the split-K slice of each warp
    static constexpr int M_TILES = BLOCK_M / 16;            // m16 tiles of S and O per warp
    static constexpr int S_TILES = KEYS_PER_WARP / 8;       // n8 tiles of S per warp
    static constexpr int KEY_STEPS = KEYS_PER_WARP / 16;    // k16 steps of P V per warp
    static constexpr int D_TILES = HD / 8;                  // n8 tiles of O
    static constexpr int D_STEPS = HD / 16;                 // k16 steps of S = Q Kᵀ
    // A warp's K slice is the same for every query block of a key block: keep its fragments in
    // registers when they are few, and read only Q and V from shared memory in the inner loop.
    static constexpr bool K_IN_REGS = KEY_STEPS * D_STEPS * 4 <= 64;
    typedef SmemTile<HD> Tile;
    static constexpr int Q_ELEMS = Tile::elems(BLOCK_M);
    static constexpr int KV_ELEMS = Tile::elems(BLOCK_N);
    // fp32 tiles (BLOCK_M, HD): rows padded by 8 floats, so that the float2 stores of an mma
    // accumulator (rows g, columns 2t) from 16 lanes hit 16 different bank pairs.
    static constexpr int ACC_STRIDE = HD + 8;
    static constexpr int ACC_ELEMS = BLOCK_M * ACC_STRIDE;
    static constexpr int THREADS_PER_ROW = THREADS / BLOCK_M;  // in the reduction across warps
    static constexpr int ROW_CHUNKS = HD / 4;                  // float4 chunks of one row of O
    static constexpr size_t SMEM_BYTES =
        (size_t)(2 * KV_ELEMS + 2 * Q_ELEMS) * sizeof(__nv_bfloat16) +
        (size_t)((2 + NWARPS) * ACC_ELEMS + 4 * BLOCK_M + 2 * NWARPS * BLOCK_M) * sizeof(float);
    static_assert(BLOCK_M % 16 == 0 && KEYS_PER_WARP % 16 == 0 && HD % 16 == 0, "tile shapes");
    static_assert(THREADS % BLOCK_M == 0 && THREADS_PER_ROW <= 32, "whole rows per thread group in the reduction");
    static_assert(!Tile::SWIZZLE || D_TILES % 2 == 0, "SmemTile::at needs even chunks in swizzled tiles");
};

template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS, bool CAUSAL>
__global__ void __launch_bounds__(NWARPS * 32, 1) flash1_forward_kernel(Flash1ForwardParams p) {
    typedef Flash1ForwardConfig<HD, BLOCK_M, BLOCK_N, NWARPS> C;
    typedef typename C::Tile Tile;
    constexpr int KPW = C::KEYS_PER_WARP;
    extern __shared__ __align__(128) __nv_bfloat16 smem[];
    __nv_bfloat16* k_tile = smem;                                   // (BLOCK_N, HD)
    __nv_bfloat16* v_tile = k_tile + C::KV_ELEMS;                   // (BLOCK_N, HD)
    __nv_bfloat16* q_tiles = v_tile + C::KV_ELEMS;                  // 2 × (BLOCK_M, HD)
    float* o_tiles = (float*)(q_tiles + 2 * C::Q_ELEMS);            // 2 × (BLOCK_M, HD): O_i as read
    float* partial_o = o_tiles + 2 * C::ACC_ELEMS;                  // NWARPS × (BLOCK_M, HD): P_w V_w
    float* state_tiles = partial_o + NWARPS * C::ACC_ELEMS;         // 2 × (m_i, ℓ_i) × BLOCK_M as read
    float* partial_max = state_tiles + 4 * BLOCK_M;                 // NWARPS × BLOCK_M: m_w
    float* partial_sum = partial_max + NWARPS * BLOCK_M;            // NWARPS × BLOCK_M: ℓ_w

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int bh = blockIdx.x, b = bh / p.NH, h = bh % p.NH;
    const int T = p.T;
    const long qkv_offset = (long)b * T * p.qkv_stride + (long)h * HD;
    const long kv_offset = (long)b * T * p.kv_stride + (long)(h / (p.NH / p.NKV)) * HD;
    const long head_row0 = (long)bh * T;  // row (b, h, 0) of o_accum, row_max, row_sum and lse
    float* o_head = p.o_accum + head_row0 * HD;
    float* max_head = p.row_max + head_row0;
    float* sum_head = p.row_sum + head_row0;
    const int n_blocks = (T + BLOCK_N - 1) / BLOCK_N;
    const int m_blocks = (T + BLOCK_M - 1) / BLOCK_M;
    const int key_row0 = warp * KPW;  // this warp's keys within the key block

    // Loads query block m into buffer `buf`: Q, and (with_state) the O, m and ℓ the previous key
    // blocks left in HBM. Rows past the end become zeros.
    auto load_query_block = [&](int m, int buf, bool with_state) {
        const int m0 = m * BLOCK_M;
        load_tile_async<BLOCK_M, HD, C::THREADS>(q_tiles + buf * C::Q_ELEMS, p.q + qkv_offset + (long)m0 * p.qkv_stride,
                                                 p.qkv_stride, T - m0);
        if (!with_state) return;
        float* o_tile = o_tiles + buf * C::ACC_ELEMS;
        for (int i = threadIdx.x; i < BLOCK_M * C::ROW_CHUNKS; i += C::THREADS) {
            const int row = i / C::ROW_CHUNKS, chunk = i % C::ROW_CHUNKS;
            const bool valid = m0 + row < T;
            cp_async_16(o_tile + row * C::ACC_STRIDE + chunk * 4, valid ? o_head + (long)(m0 + row) * HD + chunk * 4 : o_head,
                        valid ? 16 : 0);
        }
        float* state = state_tiles + buf * 2 * BLOCK_M;
        for (int i = threadIdx.x; i < BLOCK_M; i += C::THREADS) {
            const bool valid = m0 + i < T;
            cp_async_4(state + i, valid ? max_head + m0 + i : max_head, valid ? 4 : 0);
            cp_async_4(state + BLOCK_M + i, valid ? sum_head + m0 + i : sum_head, valid ? 4 : 0);
        }
    };

    const uint32_t k_lane = Tile::lane_base(k_tile, b_row(lane), b_chunk(lane));
    const uint32_t v_lane = Tile::lane_base(v_tile, bt_row(lane), bt_chunk(lane));
    uint32_t k_frag[C::K_IN_REGS ? C::KEY_STEPS : 1][C::K_IN_REGS ? C::D_STEPS : 1][4];

    for (int n = 0; n < n_blocks; n++) {
        const int n0 = n * BLOCK_N;
        const bool first = n == 0;  // every query block meets key block 0 first (key 0 is never masked)
        const int m_begin = CAUSAL ? n0 / BLOCK_M : 0;
        const int warp_key0 = n0 + key_row0;
        __syncthreads();  // every warp is done with the previous key block's K, V and query buffers
        load_tile_async<BLOCK_N, HD, C::THREADS>(k_tile, p.k + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
        load_tile_async<BLOCK_N, HD, C::THREADS>(v_tile, p.v + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
        load_query_block(m_begin, 0, !first);
        cp_async_commit();

        for (int m = m_begin; m < m_blocks; m++) {
            const int m0 = m * BLOCK_M, buf = (m - m_begin) & 1;
            // Barrier A publishes query block m (and K, V) and frees the other buffer: every thread
            // has left step m-1, whose reduction read it. So the prefetch of block m+1 goes after it.
            cp_async_wait<0>();
            __syncthreads();
            if (m + 1 < m_blocks) load_query_block(m + 1, buf ^ 1, !first);
            cp_async_commit();
            if (C::K_IN_REGS && m == m_begin) {
#pragma unroll
                for (int np = 0; np < C::KEY_STEPS; np++)
#pragma unroll
                    for (int ks = 0; ks < C::D_STEPS; ks++)
                        ldmatrix_x4(k_frag[C::K_IN_REGS ? np : 0][C::K_IN_REGS ? ks : 0],
                                    Tile::at(k_lane, key_row0 + np * 16, ks * 2));
            }

            // ---- this warp's slice: S_w, m_w, P_w, ℓ_w and P_w V_w ----
            float acc_o[C::M_TILES][C::D_TILES][4];
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
                for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc_o[mt][dt][e] = 0.f;
            float warp_max[C::M_TILES][2], warp_sum[C::M_TILES][2];  // rows g and g+8 of each m tile
            // Causal: keys that all come after the last query of the block contribute nothing; keys
            // past the end of the sequence neither.
            const bool active = warp_key0 < T && (!CAUSAL || warp_key0 <= m0 + BLOCK_M - 1);
            if (active) {
                const uint32_t q_lane = Tile::lane_base(q_tiles + buf * C::Q_ELEMS, a_row(lane), a_chunk(lane));
                // S = Q Kᵀ (BLOCK_M × KEYS_PER_WARP), fp32
                float s[C::M_TILES][C::S_TILES][4];
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
                    for (int nt = 0; nt < C::S_TILES; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
#pragma unroll
                for (int ks = 0; ks < C::D_STEPS; ks++) {
                    uint32_t a[C::M_TILES][4];
#pragma unroll
                    for (int mt = 0; mt < C::M_TILES; mt++) ldmatrix_x4(a[mt], Tile::at(q_lane, mt * 16, ks * 2));
#pragma unroll
                    for (int np = 0; np < C::KEY_STEPS; np++) {
                        uint32_t kb[4];
                        if (C::K_IN_REGS) {
#pragma unroll
                            for (int e = 0; e < 4; e++) kb[e] = k_frag[C::K_IN_REGS ? np : 0][C::K_IN_REGS ? ks : 0][e];
                        } else {
                            ldmatrix_x4(kb, Tile::at(k_lane, key_row0 + np * 16, ks * 2));
                        }
#pragma unroll
                        for (int mt = 0; mt < C::M_TILES; mt++) {
                            mma_16816(s[mt][2 * np], a[mt], kb[0], kb[1]);
                            mma_16816(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
                        }
                    }
                }

                // Mask keys past the end of the sequence and, across the diagonal, keys after the query.
                const bool needs_mask = warp_key0 + KPW > T || (CAUSAL && warp_key0 + KPW - 1 > m0);
                if (needs_mask) {
#pragma unroll
                    for (int mt = 0; mt < C::M_TILES; mt++)
                        mask_scores<C::S_TILES, CAUSAL>(&s[mt][0][0], m0 + mt * 16 + g, warp_key0 + 2 * t4, T);
                }

                // m_w, P_w = exp2(S·scale_log2 − m_w) and ℓ_w, per row over this warp's keys
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++)
                    block_softmax<C::S_TILES>(&s[mt][0][0], warp_max[mt], warp_sum[mt], p.scale_log2);

                // P_w V_w (BLOCK_M × HD), P straight from the S accumulators (bf16), k = this warp's keys
#pragma unroll
                for (int ks = 0; ks < C::KEY_STEPS; ks++) {
                    uint32_t a[C::M_TILES][4];
#pragma unroll
                    for (int mt = 0; mt < C::M_TILES; mt++) accumulators_to_a(a[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
#pragma unroll
                    for (int dp = 0; dp < C::D_TILES / 2; dp++) {
                        uint32_t vb[4];
                        ldmatrix_x4_trans(vb, Tile::at(v_lane, key_row0 + ks * 16, dp * 2));
#pragma unroll
                        for (int mt = 0; mt < C::M_TILES; mt++) {
                            mma_16816(acc_o[mt][2 * dp], a[mt], vb[0], vb[1]);
                            mma_16816(acc_o[mt][2 * dp + 1], a[mt], vb[2], vb[3]);
                        }
                    }
                    if (C::D_TILES % 2) {  // head dim 80: one n8 tile left over
                        uint32_t vb[2];
                        ldmatrix_x2_trans(vb, Tile::at(v_lane, key_row0 + ks * 16, C::D_TILES - 1));  // unswizzled
#pragma unroll
                        for (int mt = 0; mt < C::M_TILES; mt++) mma_16816(acc_o[mt][C::D_TILES - 1], a[mt], vb[0], vb[1]);
                    }
                }
            } else {
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; mt++) {
                    warp_max[mt][0] = warp_max[mt][1] = -INFINITY;
                    warp_sum[mt][0] = warp_sum[mt][1] = 0.f;
                }
            }

            // m_w, ℓ_w and P_w V_w to shared memory (zeros from an inactive warp: 0 · garbage could be NaN)
            float* my_partial = partial_o + warp * C::ACC_ELEMS;
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int row = mt * 16 + g + 8 * half;
                    if (t4 == 0) {
                        partial_max[warp * BLOCK_M + row] = warp_max[mt][half];
                        partial_sum[warp * BLOCK_M + row] = warp_sum[mt][half];
                    }
#pragma unroll
                    for (int dt = 0; dt < C::D_TILES; dt++)
                        *(float2*)(my_partial + row * C::ACC_STRIDE + dt * 8 + 2 * t4) =
                            make_float2(acc_o[mt][dt][2 * half], acc_o[mt][dt][2 * half + 1]);
                }
            __syncthreads();  // barrier B: every warp's partial results are in shared memory

            // ---- reduction across warps and the FA1 update of O_i, m_i, ℓ_i (THREADS_PER_ROW threads a row) ----
            {
                const int row = threadIdx.x / C::THREADS_PER_ROW, part = threadIdx.x % C::THREADS_PER_ROW;
                const int qi = m0 + row;
                const float* state = state_tiles + buf * 2 * BLOCK_M;
                float m_tilde = -INFINITY;
#pragma unroll
                for (int w = 0; w < NWARPS; w++) m_tilde = fmaxf(m_tilde, partial_max[w * BLOCK_M + row]);
                const float m_old = first ? -INFINITY : state[row];
                const float m_new = fmaxf(m_old, m_tilde);
                const float base = softmax_base(m_new);
                // diag(ℓ_i) e^{m_i − m_new}, then ℓ_new; alpha[w] = e^{m_w − m_new} (0 for a warp with no keys)
                const float carried = first ? 0.f : state[BLOCK_M + row] * fast_exp2(m_old - base);
                float alpha[NWARPS];
                float l_new = carried;
#pragma unroll
                for (int w = 0; w < NWARPS; w++) {
                    alpha[w] = fast_exp2(partial_max[w * BLOCK_M + row] - base);
                    l_new += alpha[w] * partial_sum[w * BLOCK_M + row];
                }
                const float inv = softmax_inv(l_new);
                // The last key block this query block meets: the final O and LSE leave the workspace.
                const bool last = CAUSAL ? n == (min(T, m0 + BLOCK_M) - 1) / BLOCK_N : n == n_blocks - 1;
                const float* o_tile = o_tiles + buf * C::ACC_ELEMS + row * C::ACC_STRIDE;
                const float* partial_row = partial_o + row * C::ACC_STRIDE;
                constexpr int CHUNK_STEPS = (C::ROW_CHUNKS + C::THREADS_PER_ROW - 1) / C::THREADS_PER_ROW;
#pragma unroll
                for (int k = 0; k < CHUNK_STEPS; k++) {
                    const int chunk = part + k * C::THREADS_PER_ROW;
                    if (C::ROW_CHUNKS % C::THREADS_PER_ROW != 0 && chunk >= C::ROW_CHUNKS) break;
                    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (!first) {
                        o = *(const float4*)(o_tile + chunk * 4);
                        o.x *= carried, o.y *= carried, o.z *= carried, o.w *= carried;
                    }
#pragma unroll
                    for (int w = 0; w < NWARPS; w++) {
                        const float4 pv = *(const float4*)(partial_row + w * C::ACC_ELEMS + chunk * 4);
                        o.x = fmaf(alpha[w], pv.x, o.x);
                        o.y = fmaf(alpha[w], pv.y, o.y);
                        o.z = fmaf(alpha[w], pv.z, o.z);
                        o.w = fmaf(alpha[w], pv.w, o.w);
                    }
                    o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
                    if (qi < T) {
                        if (last) {
                            uint2 packed;
                            packed.x = pack_bf16(o.x, o.y);
                            packed.y = pack_bf16(o.z, o.w);
                            *(uint2*)(p.out + ((long)b * T + qi) * p.out_stride + (long)h * HD + chunk * 4) = packed;
                        } else {
                            *(float4*)(o_head + (long)qi * HD + chunk * 4) = o;
                        }
                    }
                }
                if (part == 0 && qi < T) {
                    if (last) {
                        p.lse[head_row0 + qi] = softmax_lse(m_new, l_new);
                    } else {
                        max_head[qi] = m_new;
                        sum_head[qi] = l_new;
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
}

// ---- launch -------------------------------------------------------------------------------------
template <int HD, int BLOCK_M, int BLOCK_N, int NWARPS, bool CAUSAL>
static void launch_flash1_forward(const Flash1ForwardParams* p, int B, cudaStream_t stream) {
    typedef Flash1ForwardConfig<HD, BLOCK_M, BLOCK_N, NWARPS> C;
    launch_with_smem<flash1_forward_kernel<HD, BLOCK_M, BLOCK_N, NWARPS, CAUSAL>>(
        B * p->NH, C::THREADS, C::SMEM_BYTES, stream, *p);
}

// ---- block shapes per head dim ------------------------------------------------------------------
// (query rows per step, keys per key block, warps). The reference sizes the key block to fill
// shared memory (B_c ≈ M / (8·HD) bf16 values for K and V): the larger it is, the fewer times O,
// m and ℓ travel through HBM. 8 warps of 32 keys (64 at head dim 64), one block per SM; the query
// step is one m16 tile, so that each warp's fp32 partial P V stays small enough to share.
template <bool CAUSAL>
static void dispatch_flash1_forward(const Flash1ForwardParams* p, int B, int HD, cudaStream_t stream) {
    switch (HD) {
        case 64: launch_flash1_forward<64, 16, 512, 8, CAUSAL>(p, B, stream); break;
        case 80: launch_flash1_forward<80, 16, 256, 8, CAUSAL>(p, B, stream); break;
        case 96: launch_flash1_forward<96, 16, 256, 8, CAUSAL>(p, B, stream); break;
        case 128: launch_flash1_forward<128, 16, 256, 8, CAUSAL>(p, B, stream); break;
    }
}

// o_accum (B, NH, T, HD), then row_max and row_sum (B, NH, T), all fp32. The backward's dq_accum
// (B, NH, T, HD) fp32 fits in the same bytes.
size_t flash1_attention_workspace_bytes(const AttentionShape* s) {
    const size_t rows = (size_t)s->B * s->NH * s->T;
    return rows * s->HD * sizeof(float) + 2 * rows * sizeof(float);
}

void flash1_attention_forward(const AttentionArgs* args, cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    attention_require_forward_aligned("flash1", args);
    Flash1ForwardParams p;
    const size_t rows = (size_t)s->B * s->NH * s->T;
    p.q = args->q;
    p.k = args->k;
    p.v = args->v;
    p.out = args->out;
    p.lse = args->lse;
    p.o_accum = (float*)args->workspace;
    p.row_max = p.o_accum + rows * s->HD;
    p.row_sum = p.row_max + rows;
    p.qkv_stride = args->qkv_stride;
    p.kv_stride = attention_kv_stride(args);
    p.out_stride = args->out_stride;
    p.T = s->T;
    p.NH = s->NH;
    p.NKV = s->NKV;
    p.scale_log2 = FLASH2_LOG2E / sqrtf((float)s->HD);
    if (s->causal) dispatch_flash1_forward<true>(&p, s->B, s->HD, stream);
    else dispatch_flash1_forward<false>(&p, s->B, s->HD, stream);
}
