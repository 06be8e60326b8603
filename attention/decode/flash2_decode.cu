// flash2_decode.cu: split-KV decoding attention (the interface, shapes and layouts: decode.h).
//
//   decode_split_kernel    grid (splits, NKV · row groups, B), 4 warps. The query rows of one K/V
//                          head are its G = NH/NKV query heads times the Tq new tokens, row r =
//                          t·G + g; a block takes 16·MT of them (MT m16 tiles; more rows than 64 make
//                          several row groups, each reading the cache again). Sequence b's
//                          ceil(lengths[b] / 64) tiles are shared out evenly over the splits (read on
//                          the GPU, so one launch serves any length up to Tmax; a split left without
//                          keys writes LSE −∞ and exits). The block streams the
//                          split's keys in tiles of 64 (K and V, cp.async, 3 stages); warp w owns
//                          m-tile w / KW and keys [w % KW · 64/KW, +64/KW) of every tile (KW = 4/MT),
//                          so each K/V byte crosses HBM once per block and every warp has tensor-core
//                          work however small G·Tq is. Online softmax per warp (attention_math.cuh),
//                          then the KW warps of an m-tile merge (m, ℓ, O) through shared memory.
//                          One split: writes out (bf16) and lse. Several: writes out_s = O/ℓ and
//                          lse_s (fp32) to the workspace, (B, Tq, NH, splits[, HD]).
//   decode_combine_kernel  one block per (b, t, h), threads over splits: lse = log Σ_s exp(lse_s),
//                          out = Σ_s exp(lse_s − lse)·out_s; splits with lse_s = −∞ (no keys) skipped.
//                          A programmatic dependent launch on Hopper (its start overlaps the split
//                          kernel's tail); so is the split kernel (its start overlaps the tail of the
//                          kernel that wrote q and the cache). Each waits for its predecessor before
//                          it reads anything, and the combine lets the next kernel start at once.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/common/attention_math.cuh"
#include "attention/common/dependent_launch.cuh"
#include "attention/common/kernel_trace.cuh"
#include "attention/common/mma_common.cuh"
#include "attention/decode.h"

namespace {

constexpr int DECODE_WARPS = 4;
constexpr int DECODE_THREADS = 32 * DECODE_WARPS;
constexpr int DECODE_STAGES = 3;

struct DecodeParams {
    const __nv_bfloat16* q;
    long q_stride;
    const __nv_bfloat16 *k, *v;
    const int* lengths;
    __nv_bfloat16* out;
    long out_stride;
    float* lse;       // (B, NH, Tq) or NULL
    float* part_o;    // (B, Tq, NH, splits, HD), several splits only
    float* part_lse;  // (B, Tq, NH, splits)
    int Tq, NH, NKV, G, Tmax;
    int M;            // query rows per K/V head: Tq·G
    int row_groups;   // ceil(M / (16·MT))
    int splits;       // split s of sequence b takes tiles [s·per, (s+1)·per) of its ceil(lengths[b]/64)
    float scale_log2;  // log2(e) / √HD
};

template <int HD, int MT>
struct DecodeConfig {
    typedef SmemTile<HD> Tile;
    static constexpr int KW = DECODE_WARPS / MT;                // warps sharing an m-tile (key slices)
    static constexpr int WARP_KEYS = DECODE_KEY_BLOCK / KW;     // keys of a tile per warp: 16, 32, 64
    static constexpr int NT = WARP_KEYS / 8;                    // score n8 tiles per warp
    static constexpr int TILE_ELEMS = Tile::elems(DECODE_KEY_BLOCK);
    static constexpr int Q_ELEMS = Tile::elems(16 * MT);
    static constexpr int RED_STRIDE = HD + 8;  // floats per row of the merge buffer (fewer bank conflicts)
    static constexpr size_t PIPE_BYTES = (size_t)(2 * DECODE_STAGES * TILE_ELEMS + Q_ELEMS) * 2;
    static constexpr size_t MERGE_BYTES = (size_t)DECODE_WARPS * 16 * (RED_STRIDE + 2) * 4;
    static constexpr size_t SMEM_BYTES = PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES;
};

// Loads one tile of keys [k0, k0 + 64) ∩ [., k_end) of K and V; rows past k_end become zeros.
template <int HD>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* k_tile, __nv_bfloat16* v_tile, const __nv_bfloat16* k,
                                             const __nv_bfloat16* v, long row_stride, int k0, int k_end) {
    const long offset = (long)k0 * row_stride;
    load_tile_async<DECODE_KEY_BLOCK, HD, DECODE_THREADS>(k_tile, k + offset, row_stride, k_end - k0);
    load_tile_async<DECODE_KEY_BLOCK, HD, DECODE_THREADS>(v_tile, v + offset, row_stride, k_end - k0);
}

// Scores of keys that are past the split's end or after the row's query position become −∞.
// s: NT n8 tiles at rows (g, g+8) of the warp's m-tile and keys key0 + 8·nt + {0, 1}.
template <int NT>
__device__ __forceinline__ void mask_decode_scores(float* s, int key0, int k_end, const int (&last_key)[2]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = key0 + nt * 8 + (e & 1);
            if (j >= k_end || j > last_key[e >> 1]) s[4 * nt + e] = -INFINITY;
        }
}

template <int HD, int MT>
__global__ void __launch_bounds__(DECODE_THREADS) decode_split_kernel(const DecodeParams p) {
    typedef DecodeConfig<HD, MT> Cfg;
    typedef typename Cfg::Tile Tile;
    constexpr int KW = Cfg::KW, NT = Cfg::NT, WARP_KEYS = Cfg::WARP_KEYS;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16* k_tiles = (__nv_bfloat16*)smem;                  // [STAGES][64 keys][HD]
    __nv_bfloat16* v_tiles = k_tiles + DECODE_STAGES * Cfg::TILE_ELEMS;
    __nv_bfloat16* q_tile = v_tiles + DECODE_STAGES * Cfg::TILE_ELEMS;  // [16·MT rows][HD]

    KernelTraceStamp trace = kernel_trace_begin();
    wait_for_prerequisite_grid();  // launched as a dependent of the kernel writing q and the cache
    kernel_trace_ready(&trace);
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / p.row_groups, row0 = (blockIdx.y % p.row_groups) * 16 * MT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int mt = warp / KW, kw = warp % KW;
    // The sequence's own tiles are shared out over the splits (per tiles each), so the work of a split
    // follows lengths[b] on the GPU: a launch sized for the cache's capacity serves every length.
    const int len = p.lengths[b];
    const int len_tiles = (len + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    const int split_keys = (len_tiles + p.splits - 1) / p.splits * DECODE_KEY_BLOCK;
    const int k_begin = split * split_keys;
    const int k_end = min(len, k_begin + split_keys);
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK : 0;
    if (n_tiles == 0 && p.splits > 1) {
        // Past the sequence's keys: an empty partial (LSE −∞; the combine gives it weight 0 and never
        // reads its output).
        for (int r = threadIdx.x; r < 16 * MT; r += DECODE_THREADS) {
            const int R = row0 + r;
            if (R >= p.M) break;
            const int t = R / p.G, h = kvh * p.G + R % p.G;
            p.part_lse[(((long)b * p.Tq + t) * p.NH + h) * p.splits + split] = -INFINITY;
        }
        kernel_trace_end(&trace, 's', (unsigned)split);
        return;
    }

    // Query rows: row r of the block is query row R = row0 + r = t·G + g, head kvh·G + g.
    constexpr int CHUNKS = HD / 8;
    for (int i = threadIdx.x; i < 16 * MT * CHUNKS; i += DECODE_THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS, R = row0 + r;
        const bool valid = R < p.M;
        const int t = valid ? R / p.G : 0, h = kvh * p.G + (valid ? R % p.G : 0);
        cp_async_16(q_tile + Tile::index(r, c), p.q + ((long)b * p.Tq + t) * p.q_stride + (long)h * HD + c * 8,
                    valid ? 16 : 0);
    }
    cp_async_commit();

    const long row_stride = (long)p.NKV * HD;
    const __nv_bfloat16* k = p.k + ((long)b * p.Tmax * p.NKV + kvh) * HD;
    const __nv_bfloat16* v = p.v + ((long)b * p.Tmax * p.NKV + kvh) * HD;
#pragma unroll
    for (int s = 0; s < DECODE_STAGES - 1; s++) {
        if (s < n_tiles)
            load_kv_tile<HD>(k_tiles + s * Cfg::TILE_ELEMS, v_tiles + s * Cfg::TILE_ELEMS, k, v, row_stride,
                             k_begin + s * DECODE_KEY_BLOCK, k_end);
        cp_async_commit();  // empty groups keep the count uniform
    }

    // Q fragments of the warp's m-tile, kept in registers for the whole split.
    cp_async_wait<DECODE_STAGES - 1>();
    __syncthreads();
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ldmatrix_x4(qa[kk], smem_address(q_tile + Tile::index(mt * 16 + a_row(lane), 2 * kk + a_chunk(lane))));

    // The two rows this thread holds (g, g+8 of the m-tile): the last key each may see.
    int last_key[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int R = row0 + mt * 16 + lane / 4 + 8 * half;
        last_key[half] = R < p.M ? len - p.Tq + R / p.G : len - 1;
    }

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    const uint32_t k_base = Tile::lane_base(k_tiles, b_row(lane), b_chunk(lane));
    const uint32_t v_base = Tile::lane_base(v_tiles, bt_row(lane), bt_chunk(lane));
    constexpr uint32_t TILE_BYTES = Cfg::TILE_ELEMS * 2;
    const int first_masked = min(k_end, len - p.Tq + 1);  // keys from here on may be masked for some row

    for (int i = 0; i < n_tiles; i++) {
        cp_async_wait<DECODE_STAGES - 2>();
        __syncthreads();  // tile i is in; every warp is done with tile i-1, whose stage is refilled now
        {
            const int next = i + DECODE_STAGES - 1;
            if (next < n_tiles) {
                const int st = next % DECODE_STAGES;
                load_kv_tile<HD>(k_tiles + st * Cfg::TILE_ELEMS, v_tiles + st * Cfg::TILE_ELEMS, k, v, row_stride,
                                 k_begin + next * DECODE_KEY_BLOCK, k_end);
            }
            cp_async_commit();
        }
        const uint32_t stage_offset = (uint32_t)(i % DECODE_STAGES) * TILE_BYTES;
        const int key0 = k_begin + i * DECODE_KEY_BLOCK + kw * WARP_KEYS;  // the warp's first key

        // S = Q Kᵀ over the warp's keys: (16, WARP_KEYS).
        float s[NT * 4];
#pragma unroll
        for (int j = 0; j < NT * 4; j++) s[j] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t kb[4];
                ldmatrix_x4(kb, Tile::at(k_base + stage_offset, kw * WARP_KEYS + np * 16, 2 * kk));
                mma_16816(s + 8 * np, qa[kk], kb[0], kb[1]);
                mma_16816(s + 8 * np + 4, qa[kk], kb[2], kb[3]);
            }
        if (key0 + WARP_KEYS > first_masked) mask_decode_scores<NT>(s, key0 + 2 * (lane % 4), k_end, last_key);

        float rescale[2];
        online_softmax<NT>(s, row_max, row_sum, p.scale_log2, rescale);
        rescale_rows<HD / 8>(&o[0][0], rescale);

        // O += P V over the warp's keys.
#pragma unroll
        for (int ks = 0; ks < NT / 2; ks++) {
            uint32_t pa[4];
            accumulators_to_a(pa, s + 8 * ks, s + 8 * ks + 4);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, Tile::at(v_base + stage_offset, kw * WARP_KEYS + ks * 16, 2 * dp));
                mma_16816(o[2 * dp], pa, vb[0], vb[1]);
                mma_16816(o[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
    }
    cp_async_wait<0>();
    allow_dependent_launch();  // the combine (several splits) may start; it waits for our writes
    __syncthreads();  // the ring is free: it becomes the merge buffer

    // Merge the KW warps of each m-tile: m = max_w m_w, ℓ = Σ_w ℓ_w·2^(m_w − m), O = Σ_w O_w·2^(m_w − m).
    float* red_o = (float*)smem;                                        // [warp][16][RED_STRIDE]
    float* red_m = red_o + DECODE_WARPS * 16 * Cfg::RED_STRIDE;         // [warp][16]
    float* red_l = red_m + DECODE_WARPS * 16;                           // [warp][16]
    const int g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float sum = row_sum[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        row_sum[half] = sum;
        if (tq == 0) {
            red_m[warp * 16 + g + 8 * half] = row_max[half];
            red_l[warp * 16 + g + 8 * half] = sum;
        }
    }
    __syncthreads();
    float total_max[2], total_sum[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = g + 8 * half;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < KW; w++) m = fmaxf(m, red_m[(mt * KW + w) * 16 + row]);
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) {
            const float mw = red_m[(mt * KW + w) * 16 + row];
            if (mw != -INFINITY) l += red_l[(mt * KW + w) * 16 + row] * fast_exp2(mw - m);
        }
        total_max[half] = m, total_sum[half] = l;
        const float factor = row_max[half] == -INFINITY ? 0.f : fast_exp2(row_max[half] - m);
#pragma unroll
        for (int i = 0; i < HD / 8; i++) o[i][2 * half] *= factor, o[i][2 * half + 1] *= factor;
    }
    if (KW > 1) {
        if (kw != 0) {
            float* mine = red_o + warp * 16 * Cfg::RED_STRIDE;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                *(float2*)(mine + g * Cfg::RED_STRIDE + i * 8 + 2 * tq) = make_float2(o[i][0], o[i][1]);
                *(float2*)(mine + (g + 8) * Cfg::RED_STRIDE + i * 8 + 2 * tq) = make_float2(o[i][2], o[i][3]);
            }
        }
        __syncthreads();
        if (kw != 0) return;
#pragma unroll
        for (int w = 1; w < KW; w++) {
            const float* theirs = red_o + (warp + w) * 16 * Cfg::RED_STRIDE;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                const float2 lo = *(const float2*)(theirs + g * Cfg::RED_STRIDE + i * 8 + 2 * tq);
                const float2 hi = *(const float2*)(theirs + (g + 8) * Cfg::RED_STRIDE + i * 8 + 2 * tq);
                o[i][0] += lo.x, o[i][1] += lo.y, o[i][2] += hi.x, o[i][3] += hi.y;
            }
        }
    }

    // Write the m-tile's rows: out and lse (one split) or the split's normalized partials.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int R = row0 + mt * 16 + g + 8 * half;
        if (R >= p.M) continue;
        const int t = R / p.G, h = kvh * p.G + R % p.G;
        const float l = total_sum[half];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse = l > 0.f ? (total_max[half] + __log2f(l)) * FLASH2_LN2 : -INFINITY;
        if (p.splits == 1) {
            __nv_bfloat16* dst = p.out + ((long)b * p.Tq + t) * p.out_stride + (long)h * HD + 2 * tq;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                *(uint32_t*)(dst + i * 8) = pack_bf16(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
            if (p.lse && tq == 0) p.lse[((long)b * p.NH + h) * p.Tq + t] = lse;
        } else {
            const long part = (((long)b * p.Tq + t) * p.NH + h) * p.splits + split;
            float* dst = p.part_o + part * HD + 2 * tq;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                *(float2*)(dst + i * 8) = make_float2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
            if (tq == 0) p.part_lse[part] = lse;
        }
    }
    kernel_trace_end(&trace, 'S', (unsigned)split);
}

constexpr int COMBINE_WARPS = 8;
constexpr int COMBINE_THREADS = 32 * COMBINE_WARPS;
static_assert(COMBINE_THREADS >= DECODE_MAX_SPLITS, "one thread per split for the LSE");

// Sum (or max) over the block's threads; every thread gets the result.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = MAX ? fmaxf(x, y) : x + y;
    }
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
    __syncthreads();
    x = scratch[0];
#pragma unroll
    for (int w = 1; w < COMBINE_WARPS; w++) x = MAX ? fmaxf(x, scratch[w]) : x + scratch[w];
    __syncthreads();  // scratch is reused
    return x;
}

// One block per query row (b, t, h): thread s takes split s's LSE; then warp w sums splits w, w+8, ...
// with lane l on columns 4l .. 4l+3 (HD ≤ 128), and the warps' sums meet in shared memory.
template <int HD>
__global__ void __launch_bounds__(COMBINE_THREADS) decode_combine_kernel(const DecodeParams p) {
    __shared__ float weight[DECODE_MAX_SPLITS];
    __shared__ float scratch[COMBINE_WARPS];
    __shared__ __align__(16) float partial[COMBINE_WARPS][HD];
    KernelTraceStamp trace = kernel_trace_begin();
    wait_for_prerequisite_grid();
    kernel_trace_ready(&trace);
    // With one query row per head (B·Tq = 1: NH blocks) the next kernel (a projection) may start
    // loading its weights now; with more rows its blocks' weight stream slows this merge more than its
    // early start gains, so it launches at this kernel's exit (GPT3-1.3B on an H200, ms per token
    // early / at exit: batch 1 1.265 / 1.276, batch 4 1.504 / 1.467; layers/PERF_NOTES.md 39).
    if (gridDim.x == (unsigned)p.NH) allow_dependent_launch();
    const long row = blockIdx.x;  // (b·Tq + t)·NH + h
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
    const float* lse_s = p.part_lse + row * p.splits;
    const float x = tid < p.splits ? lse_s[tid] : -INFINITY;
    const float m = block_reduce<true>(x, scratch);
    const float e = (x == -INFINITY) ? 0.f : __expf(x - m);
    const float sum = block_reduce<false>(e, scratch);
    const float lse = m == -INFINITY ? -INFINITY : m + __logf(sum);
    if (tid < p.splits) weight[tid] = (x == -INFINITY) ? 0.f : __expf(x - lse);  // empty splits: 0, never read
    __syncthreads();

    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (4 * lane < HD) {
        const float* o_s = p.part_o + row * p.splits * HD + 4 * lane;
#pragma unroll 4
        for (int s = warp; s < p.splits; s += COMBINE_WARPS) {
            const float w = weight[s];
            if (w == 0.f) continue;
            const float4 v = *(const float4*)(o_s + (long)s * HD);
            acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
        }
        *(float4*)&partial[warp][4 * lane] = acc;
    }
    __syncthreads();
    if (warp == 0 && 4 * lane < HD) {
        acc = *(const float4*)&partial[0][4 * lane];
#pragma unroll
        for (int w = 1; w < COMBINE_WARPS; w++) {
            const float4 v = *(const float4*)&partial[w][4 * lane];
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
        const long bt = row / p.NH;
        const int h = (int)(row % p.NH);
        __nv_bfloat16* dst = p.out + bt * p.out_stride + (long)h * HD + 4 * lane;
        *(uint2*)dst = make_uint2(pack_bf16(acc.x, acc.y), pack_bf16(acc.z, acc.w));
        if (p.lse && lane == 0) {
            const int t = (int)(bt % p.Tq), b = (int)(bt / p.Tq);
            p.lse[((long)b * p.NH + h) * p.Tq + t] = lse;
        }
    }
    kernel_trace_end(&trace, 'C', (unsigned)p.splits);
}

// m-tiles per block for M query rows per K/V head: 1, 2 or 4 (more than 64 rows: row groups of 64).
int tiles_for_rows(int M) { return M <= 16 ? 1 : M <= 32 ? 2 : 4; }

template <int HD, int MT>
int blocks_per_sm() {
    static int count = 0;
    if (!count) {
        constexpr size_t bytes = DecodeConfig<HD, MT>::SMEM_BYTES;
        ATTN_CUDA_CHECK(cudaFuncSetAttribute(decode_split_kernel<HD, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
        ATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, decode_split_kernel<HD, MT>,
                                                                 DECODE_THREADS, bytes));
        if (count < 1) count = 1;
    }
    return count;
}

template <int HD>
int blocks_per_sm_for(int MT) {
    return MT == 1 ? blocks_per_sm<HD, 1>() : MT == 2 ? blocks_per_sm<HD, 2>() : blocks_per_sm<HD, 4>();
}

int blocks_per_sm_hd(int HD, int MT) {
    switch (HD) {
        case 64: return blocks_per_sm_for<64>(MT);
        case 80: return blocks_per_sm_for<80>(MT);
        case 96: return blocks_per_sm_for<96>(MT);
        default: return blocks_per_sm_for<128>(MT);
    }
}

template <int HD, int MT>
void launch_split(const DecodeParams& p, int B, cudaStream_t stream) {
    blocks_per_sm<HD, MT>();  // raises the shared-memory limit once
    ATTN_CUDA_CHECK(launch_dependent(decode_split_kernel<HD, MT>, dim3(p.splits, p.NKV * p.row_groups, B),
                                     DECODE_THREADS, DecodeConfig<HD, MT>::SMEM_BYTES, stream, p));
}

template <int HD>
void launch_hd(const DecodeParams& p, int B, int MT, cudaStream_t stream) {
    if (MT == 1) launch_split<HD, 1>(p, B, stream);
    else if (MT == 2) launch_split<HD, 2>(p, B, stream);
    else launch_split<HD, 4>(p, B, stream);
    if (p.splits > 1)
        ATTN_CUDA_CHECK(launch_dependent(decode_combine_kernel<HD>, dim3((unsigned)(B * p.Tq * p.NH)), COMBINE_THREADS,
                                         0, stream, p));
}

long row_groups_of(const DecodeShape* s) {
    const int M = s->Tq * (s->NH / s->NKV), MT = tiles_for_rows(M);
    return (M + 16 * MT - 1) / (16 * MT);
}

}  // namespace

extern "C" {

int decode_check(const DecodeShape* s, int max_length, int num_splits, char* why, size_t why_size) {
    if (s->B < 1 || s->Tq < 1 || s->NH < 1 || s->NKV < 1 || s->Tmax < 1) {
        snprintf(why, why_size, "decode shape B=%d Tq=%d NH=%d NKV=%d Tmax=%d: every size must be at least 1", s->B,
                 s->Tq, s->NH, s->NKV, s->Tmax);
        return -1;
    }
    if (s->HD != 64 && s->HD != 80 && s->HD != 96 && s->HD != 128) {
        snprintf(why, why_size, "decode attention supports head dims 64, 80, 96 and 128, not %d", s->HD);
        return -1;
    }
    if (s->NH % s->NKV != 0) {
        snprintf(why, why_size, "the query heads (%d) must be a multiple of the K/V heads (%d)", s->NH, s->NKV);
        return -1;
    }
    if (s->Tq > DECODE_MAX_QUERY_TOKENS) {
        snprintf(why, why_size,
                 "decode attention takes at most %d new tokens per sequence, not %d; run longer prompts "
                 "through the training forward (prefill)",
                 DECODE_MAX_QUERY_TOKENS, s->Tq);
        return -1;
    }
    if (max_length != 0 && (max_length < s->Tq || max_length > s->Tmax)) {
        snprintf(why, why_size, "max_length %d must be between the new tokens (%d) and the cache capacity (%d), or 0 "
                 "(not known on the host)", max_length, s->Tq, s->Tmax);
        return -1;
    }
    if (num_splits < 0 || num_splits > DECODE_MAX_SPLITS) {
        snprintf(why, why_size, "num_splits %d must be 0 (automatic) or 1 .. %d", num_splits, DECODE_MAX_SPLITS);
        return -1;
    }
    if (s->NKV * row_groups_of(s) > 65535 || s->B > 65535) {
        snprintf(why, why_size, "decode attention runs at most 65535 sequences and K/V heads (times row groups) "
                                "in one call; lower the batch or the heads");
        return -1;
    }
    return 0;
}

int decode_planned_length(const DecodeArgs* a) { return a->max_length > 0 ? a->max_length : a->shape.Tmax; }

int decode_check_args(const DecodeArgs* a, char* why, size_t why_size) {
    const DecodeShape* s = &a->shape;
    if (decode_check(s, a->max_length, a->num_splits, why, why_size) != 0) return -1;
    const long row = (long)s->NH * s->HD;
    if (a->q_stride < row || a->out_stride < row || a->q_stride % 8 != 0 || a->out_stride % 8 != 0) {
        snprintf(why, why_size, "q_stride %ld and out_stride %ld must be multiples of 8 and at least NH*HD = %ld",
                 a->q_stride, a->out_stride, row);
        return -1;
    }
    if (!a->q || !a->k_cache || !a->v_cache || !a->lengths || !a->out ||
        ((size_t)a->q | (size_t)a->k_cache | (size_t)a->v_cache | (size_t)a->out) % 16 != 0) {
        snprintf(why, why_size, "q, k_cache, v_cache, lengths and out must be GPU pointers, the bf16 ones 16-byte aligned");
        return -1;
    }
    const int splits = a->num_splits > 0 ? a->num_splits : decode_num_splits(s, decode_planned_length(a));
    if (splits > 1 && (!a->workspace || (size_t)a->workspace % 16 != 0)) {
        snprintf(why, why_size, "%d splits need a 16-byte aligned workspace of %zu bytes (decode_workspace_bytes)",
                 splits, decode_workspace_bytes(s, splits));
        return -1;
    }
    return 0;
}

int decode_splits_for(long blocks, int max_length, long concurrent_blocks) {
    const int tiles = (max_length + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    const int most = tiles < DECODE_MAX_SPLITS ? tiles : DECODE_MAX_SPLITS;
    // s splits take ceil(tiles / s) tiles each, so ceil(tiles / that) of them hold keys; their wave
    // efficiency is the blocks over the slots of the waves they need.
    double eff[DECODE_MAX_SPLITS + 1], best = 0.0;
    int used[DECODE_MAX_SPLITS + 1];
    for (int s = 1; s <= most; s++) {
        const int per_split = (tiles + s - 1) / s;
        used[s] = (tiles + per_split - 1) / per_split;
        const long n = blocks * used[s], waves = (n + concurrent_blocks - 1) / concurrent_blocks;
        eff[s] = (double)n / (double)(waves * concurrent_blocks);
        if (eff[s] > best) best = eff[s];
    }
    for (int s = 1; s <= most; s++)
        if (eff[s] >= 0.95 * best) return used[s];
    return 1;
}

int decode_num_splits(const DecodeShape* s, int max_length) {
    const int M = s->Tq * (s->NH / s->NKV);
    const long blocks = (long)s->B * s->NKV * row_groups_of(s);
    const long concurrent = (long)flash2_sm_count() * blocks_per_sm_hd(s->HD, tiles_for_rows(M));
    return decode_splits_for(blocks, max_length, concurrent);
}

size_t decode_workspace_bytes(const DecodeShape* s, int num_splits) {
    if (num_splits <= 1) return 0;
    return (size_t)s->B * s->Tq * s->NH * num_splits * (s->HD + 1) * sizeof(float);
}

void decode_attention(const DecodeArgs* a, cudaStream_t stream) {
    const DecodeShape* s = &a->shape;
    DecodeParams p;
    p.q = a->q, p.q_stride = a->q_stride;
    p.k = a->k_cache, p.v = a->v_cache;
    p.lengths = a->lengths;
    p.out = a->out, p.out_stride = a->out_stride;
    p.lse = a->lse;
    p.Tq = s->Tq, p.NH = s->NH, p.NKV = s->NKV, p.G = s->NH / s->NKV, p.Tmax = s->Tmax;
    p.M = s->Tq * p.G;
    p.row_groups = (int)row_groups_of(s);
    p.splits = a->num_splits > 0 ? a->num_splits : decode_num_splits(s, decode_planned_length(a));
    const size_t parts = (size_t)s->B * s->Tq * s->NH * p.splits;
    p.part_o = (float*)a->workspace;  // first, so that its rows stay 16-byte aligned
    p.part_lse = p.part_o ? p.part_o + parts * s->HD : NULL;
    p.scale_log2 = FLASH2_LOG2E / sqrtf((float)s->HD);
    const int MT = tiles_for_rows(p.M);
    switch (s->HD) {
        case 64: launch_hd<64>(p, s->B, MT, stream); break;
        case 80: launch_hd<80>(p, s->B, MT, stream); break;
        case 96: launch_hd<96>(p, s->B, MT, stream); break;
        default: launch_hd<128>(p, s->B, MT, stream); break;
    }
}

#ifdef KERNEL_TRACE
cudaError_t decode_attention_trace_arm(void* buffer, cudaStream_t stream) {
    return kernel_trace_arm((KernelTraceBuffer*)buffer, stream);
}
#endif

}  // extern "C"
