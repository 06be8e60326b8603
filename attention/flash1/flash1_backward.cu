// flash1_backward.cu: FlashAttention-1 backward (the reference's "Flash Attention 1" backward,
// Algorithm 4 of the FlashAttention paper) on mma.sync tensor cores.
//
// Inputs: q, k, v as the forward read them (attention.h layout: k, v with NKV heads at kv_stride),
// out and dout (B, T, NH, HD) at out_stride, lse (B, NH, T) from the forward. Outputs dq at
// dqkv_stride, dk and dv at dkv_stride, overwritten.
// Workspace (fp32): dq_accum (B, NH, T, HD); nothing of size T².
//
// One thread block per (b, K/V head) (grid = B·NKV), one kernel, no pre- or post-pass; with
// grouped-query attention "each query block" below means each query block of each of the group's
// NH / NKV query heads in turn, so dK_j, dV_j sum over the group in registers:
//   for each key block j (BLOCK_N = 16·NWARPS keys; K_j, V_j in shared memory; dK_j, dV_j in registers)
//     for each query block i (BLOCK_M rows; Q_i, dO_i, O_i, LSE_i double-buffered with cp.async)
//       D_i = rowsum(dO_i ∘ O_i), recomputed here for every key block (FA1 has no pre-pass);
//       each warp, on its slice of 16 keys (the split of the forward): Sᵀ = K Qᵀ, Pᵀ = exp(Sᵀ − LSE)
//       (P recomputed from the saved LSE), dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D),
//       dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i;
//       dQ_i += dS K_j: the product sums over the keys of every warp, so the warps exchange dSᵀ
//       through shared memory (two buffers) and each warp forms a tile of dS K over all BLOCK_N
//       keys one step later, after the next step's first barrier. That tile is read-modified-written
//       in dq_accum in HBM (fp32, plain loads and stores: this block owns the whole (b, K/V head), all G
//       of its query heads, and each
//       element always belongs to the same thread, so no atomics are needed; key block 0, which
//       meets every query block, writes without reading).
//     dK_j·scale and dV_j to bf16 into dk, dv.
//   finally dq = dq_accum·scale in bf16, read back by the same block after a barrier.
// Causal: query blocks wholly before the key block are skipped; masking only on diagonal and
// end-of-sequence blocks.
// The per-warp step (Sᵀ, dPᵀ, Pᵀ, dSᵀ, dV and dK, dSᵀ to shared memory), the dS K product and the
// staging of dK, dV are attention/common/mma_backward_step.cuh's, shared with flash2's mma.sync
// backward, on the same tiles; flash1's own are the loop order, D_i in the step and the
// read-modify-write of dq_accum.
#include <stdio.h>
#include <stdlib.h>

#include "attention/backends.h"
#include "attention/common/alignment.h"
#include "attention/common/cuda_check.h"
#include "attention/common/mma_backward_step.cuh"
#include "attention/common/mma_common.cuh"
#include "attention/flash1/flash1_params.h"

// The step's shapes, tiles and dQ warp split are BackwardStepConfig's; flash1 adds double-buffered O
// tiles (for D_i) to shared memory.
template <int HD, int BLOCK_M, int NWARPS>
struct Flash1BackwardConfig {
    typedef BackwardStepConfig<HD, BLOCK_M, NWARPS> Step;
    typedef typename Step::Tile Tile;
    typedef typename Step::DsTile DsTile;  // dSᵀ (BLOCK_N keys, BLOCK_M queries)
    static constexpr int THREADS = Step::THREADS;
    static constexpr int BLOCK_N = Step::BLOCK_N;  // 16 keys per warp
    static constexpr int D_TILES = Step::D_TILES;
    static constexpr int DQ_MT = Step::DQ_MT, DQ_M = Step::DQ_M, DQ_TILES = Step::DQ_TILES;
    // D_i: THREADS_PER_ROW consecutive threads share one query row.
    static constexpr int THREADS_PER_ROW = THREADS / BLOCK_M;
    static constexpr int KV_ELEMS = Step::KV_ELEMS, QO_ELEMS = Step::QO_ELEMS, DS_ELEMS = Step::DS_ELEMS;
    static constexpr size_t SMEM_BYTES =
        (size_t)(2 * KV_ELEMS + 6 * QO_ELEMS + 2 * DS_ELEMS) * sizeof(__nv_bfloat16) + 4 * BLOCK_M * sizeof(float);
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
    const int b = blockIdx.x / p.NKV, kv_head = blockIdx.x % p.NKV;
    const int group = p.NH / p.NKV, h0 = kv_head * group;  // this block's query heads: h0 .. h0 + group − 1
    const int T = p.T;
    const long kv_offset = (long)b * T * p.kv_stride + (long)kv_head * HD;
    const long dkv_offset = (long)b * T * p.dkv_stride + (long)kv_head * HD;
    const int n_blocks = (T + BLOCK_N - 1) / BLOCK_N;
    const int m_blocks = (T + BLOCK_M - 1) / BLOCK_M;
    const int key_row0 = warp * 16;  // this warp's keys within the key block
    const int dq_m = warp % C::DQ_M, dq_n = warp / C::DQ_M;
    const int dq_chunk0 = dq_n * C::DQ_TILES;

    // Query head h, query block m (step j of a key block takes h = h0 + j / per_head and
    // m = m_begin + j % per_head): loads it (Q, dO, O, LSE) into buffer `buf`; rows past T become zeros.
    auto load_query_block = [&](int h, int m, int buf) {
        const int m0 = m * BLOCK_M;
        const long out_offset = (long)b * T * p.out_stride + (long)h * HD;
        const float* lse_head = p.lse + ((long)b * p.NH + h) * T;
        load_tile_async<BLOCK_M, HD, C::THREADS>(q_tiles + buf * C::QO_ELEMS,
                                                 p.q + ((long)b * T + m0) * p.qkv_stride + (long)h * HD, p.qkv_stride,
                                                 T - m0);
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

    // dQ_m += dS K from dS buffer dbuf: this warp's DQ_MT m16 tiles and DQ_TILES columns of dq_accum.
    // The old values are all loaded after the product and before the first store, one latency for
    // all (loading them before the product instead would hold 32 more registers through it: spills).
    auto add_dq_block = [&](int h, int m, int dbuf, bool overwrite) {
        float* dq_head = p.dq_accum + ((long)b * p.NH + h) * T * HD;
        float acc_dq[C::DQ_MT][C::DQ_TILES][4];
        dq_block_product<HD, BLOCK_M, NWARPS>(acc_dq, ds_lane + dbuf * C::DS_ELEMS * 2, k_t_lane, dq_m, dq_chunk0);
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
        const int per_head = m_blocks - m_begin, steps = group * per_head;
        load_tile_async<BLOCK_N, HD, C::THREADS>(k_tile, p.k + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
        load_tile_async<BLOCK_N, HD, C::THREADS>(v_tile, p.v + kv_offset + (long)n0 * p.kv_stride, p.kv_stride, T - n0);
        load_query_block(h0, m_begin, 0);
        cp_async_commit();

        float acc_dk[C::D_TILES][4], acc_dv[C::D_TILES][4];  // rows g, g+8 of this warp's 16 keys
#pragma unroll
        for (int dt = 0; dt < C::D_TILES; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;

        for (int j = 0; j < steps; j++) {
            const int m0 = (m_begin + j % per_head) * BLOCK_M, buf = j & 1;
            const BackwardLanes lanes =
                backward_lanes<HD>(k_a_lane, v_a_lane, q_tiles + buf * C::QO_ELEMS, do_tiles + buf * C::QO_ELEMS);
            // Barrier A publishes step j's query block (and K, V) and the dS of step j-1, and frees the
            // other buffers (every warp has left step j-1), so the prefetch of step j+1 goes after it.
            cp_async_wait<0>();
            __syncthreads();
            if (j + 1 < steps) load_query_block(h0 + (j + 1) / per_head, m_begin + (j + 1) % per_head, buf ^ 1);
            cp_async_commit();
            row_terms(buf);
            if (j > 0) add_dq_block(h0 + (j - 1) / per_head, m_begin + (j - 1) % per_head, buf ^ 1, first);

            // The warp's step (mma_backward_step.cuh); its barrier B, after the products, publishes
            // D and LSE·log2 e of block m (row_terms above).
            backward_warp_step<HD, BLOCK_M, NWARPS, CAUSAL, true>(
                acc_dk, acc_dv, lanes, lse_tiles + buf * BLOCK_M, d_tiles + buf * BLOCK_M, ds_tiles + buf * C::DS_ELEMS,
                key_row0, n0, m0, T, p.scale_log2);
        }
        __syncthreads();  // the last dS is in shared memory
        add_dq_block(h0 + group - 1, m_blocks - 1, (steps - 1) & 1, first);
        cp_async_wait<0>();
        __syncthreads();  // every warp is done reading K and V: their tiles now stage dK and dV

        stage_dk_dv<HD>(acc_dk, acc_dv, k_tile, v_tile, key_row0, p.scale);
        __syncwarp();
        const long key_offset = dkv_offset + (long)(n0 + key_row0) * p.dkv_stride;
        store_tile<16, HD, 32>(p.dk + key_offset, p.dkv_stride, k_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                               warp * 32);
        store_tile<16, HD, 32>(p.dv + key_offset, p.dkv_stride, v_tile + Tile::index(key_row0, 0), T - n0 - key_row0,
                               warp * 32);
    }

    // dq = bf16(dq_accum · scale), 8 values per thread and step. The barrier makes every warp's
    // last read-modify-write of dq_accum visible to the whole block.
    __syncthreads();
    const long chunks = (long)group * T * (HD / 8);  // the group's query heads are consecutive in dq_accum
    const float* dq_group = p.dq_accum + ((long)b * p.NH + h0) * T * HD;
    for (long i = threadIdx.x; i < chunks; i += C::THREADS) {
        const int t = (int)(i / (HD / 8) % T), chunk = (int)(i % (HD / 8)), h = h0 + (int)(i / (HD / 8) / T);
        const float4* src = (const float4*)(dq_group + i * 8);
        const float4 x = src[0], y = src[1];
        uint4 packed;
        packed.x = pack_bf16(x.x * p.scale, x.y * p.scale);
        packed.y = pack_bf16(x.z * p.scale, x.w * p.scale);
        packed.z = pack_bf16(y.x * p.scale, y.y * p.scale);
        packed.w = pack_bf16(y.z * p.scale, y.w * p.scale);
        *(uint4*)(p.dq + ((long)b * T + t) * p.dqkv_stride + (long)h * HD + chunk * 8) = packed;
    }
}

// ---- launch -------------------------------------------------------------------------------------
template <int HD, int BLOCK_M, int NWARPS, bool CAUSAL>
static void launch_flash1_backward(const Flash1BackwardParams* p, int B, cudaStream_t stream) {
    typedef Flash1BackwardConfig<HD, BLOCK_M, NWARPS> C;
    launch_with_smem<flash1_backward_kernel<HD, BLOCK_M, NWARPS, CAUSAL>>(
        B * p->NKV, C::THREADS, C::SMEM_BYTES, stream, *p);
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
    attention_require_backward_aligned("flash1", args);
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
    p.kv_stride = attention_kv_stride(args);
    p.out_stride = args->out_stride;
    p.dqkv_stride = args->dqkv_stride;
    p.dkv_stride = attention_dkv_stride(args);
    p.T = s->T;
    p.NH = s->NH;
    p.NKV = s->NKV;
    p.scale = 1.f / sqrtf((float)s->HD);
    p.scale_log2 = p.scale * FLASH2_LOG2E;
    if (s->causal) dispatch_flash1_backward<true>(&p, s->B, s->HD, stream);
    else dispatch_flash1_backward<false>(&p, s->B, s->HD, stream);
}
