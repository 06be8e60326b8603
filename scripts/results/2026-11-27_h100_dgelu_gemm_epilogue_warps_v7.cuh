// matmul_dgelu_ws.cuh (experiment v7): the MLP's backward GEMM with its dGELU and the fc bias partial
// sums, warp-specialized three ways: a TMA producer, two MMA warpgroups that never run epilogue math,
// and three epilogue warps that finish each staged tile while the MMA warpgroups compute the next.
//
//   d (M, N)  = GELU'(aux) ∘ bf16(a · b)      a (M, K) row-major, b (K, N) row-major, aux (M, N)
//   partial (⌈M/128⌉, N) fp32 = column sums of d over each 128-row band (fixed order)
//
// Warps: 0 producer (one thread); 1-3 epilogue; 4-11 MMA (two warpgroups, rows 0-63 and
// 64-127 of a 128 × 256 tile). One staging tile (bf16) hands a tile from the MMA warps to the
// epilogue warps: `staged` (the MMA threads arrive once it is written) and `drained` (the epilogue
// threads arrive once they have read it).
#ifndef MATMUL_DGELU_WS_CUH
#define MATMUL_DGELU_WS_CUH

#include "../../attention/hopper_async.cuh"
#include "../../attention/tensor_map.h"
#include "../../attention/wgmma.cuh"
#include "../../layers/gelu.cuh"

#define DWS_BM 128
#define DWS_BN 256
#define DWS_BK 64
#define DWS_STAGES 3
#define DWS_THREADS 384
#define DWS_EPI_WARPS 3
#define DWS_EPI_THREADS (32 * DWS_EPI_WARPS)
#define DWS_PITCH (DWS_BN + 8)  // bf16 per staging row: conflict-free stores from the MMA layout
#ifndef DWS_ROWS_PER_BATCH
#define DWS_ROWS_PER_BATCH 4
#endif
#ifndef DWS_EPI_REGS
#define DWS_EPI_REGS 96
#endif
// the launch gives 168 registers to each of the 384 threads (ptxas -v); setmaxnreg moves them within that pool
#define DWS_MMA_REGS ((168 * DWS_THREADS - 128 * DWS_EPI_REGS) / 256 / 8 * 8)

#ifndef DWS_PREFETCH
#define DWS_PREFETCH 1  // the next tile's aux rows into L2 ahead of their loads
#endif
#ifndef DWS_HINT
#define DWS_HINT 1  // operand loads marked evict_last in L2, d stored evict-first
#endif

typedef struct {
    __nv_bfloat16 a[DWS_STAGES][DWS_BM * DWS_BK];  // WgTile<128, 64>, K-major
    __nv_bfloat16 b[DWS_STAGES][DWS_BK * DWS_BN];  // WgTile<64, 256>, N-major
    __nv_bfloat16 staging[DWS_BM * DWS_PITCH];
    float column_sums[DWS_EPI_WARPS][DWS_BN];
    uint64_t full[DWS_STAGES], empty[DWS_STAGES], staged, drained;
} DwsSmem;

#define DWS_SMEM_BYTES (sizeof(DwsSmem) + 1024)

typedef WgTile<DWS_BM, DWS_BK> DwsTileA;
typedef WgTile<DWS_BK, DWS_BN> DwsTileB;

typedef struct {
    const __nv_bfloat16* aux;
    __nv_bfloat16* d;
    float* partial;
    int M, N, K;
    int group_m;
    int mode;  // 0 tanhf, 1 tanh.approx, 2 no epilogue work, 3 no GELU math, 4 no aux loads, 5 as 1 but the MMA warps overwrite staging without waiting (2-5: timing only; 5 gives wrong d)
} DwsParams;

#if WGMMA_AVAILABLE
// tma_load_2d with an L2 cache policy (createpolicy): the GEMM's operands are read by many tiles, the
// epilogue's aux and d pass through once.
__device__ __forceinline__ void dws_tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row,
                                             uint64_t policy) {
#if DWS_HINT
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, "
        "%4}], [%2], %5;\n" ::"r"(smem_address(dst)),
        "l"((uint64_t)map), "r"(smem_address(bar)), "r"(col), "r"(row), "l"(policy)
        : "memory");
#else
    tma_load_2d(dst, map, bar, col, row);
#endif
}

__device__ __forceinline__ void dws_tile(int t, int tiles_m, int tiles_n, int group_m, int* m_tile, int* n_tile) {
    const int per_group = group_m * tiles_n, first_m = t / per_group * group_m;
    const int rows_in_group = min(group_m, tiles_m - first_m), r = t % per_group;
    *m_tile = first_m + r % rows_in_group;
    *n_tile = r / rows_in_group;
}

__device__ __forceinline__ void dws_producer(DwsSmem& s, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                             const DwsParams& p, int tiles_m, int tiles_n) {
    const int k_blocks = p.K / DWS_BK;
    tma_prefetch_map(map_a);
    tma_prefetch_map(map_b);
    uint64_t keep = 0;
#if DWS_HINT
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
#endif
    int it = 0;
    for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
        int m_tile, n_tile;
        dws_tile(t, tiles_m, tiles_n, p.group_m, &m_tile, &n_tile);
        for (int kb = 0; kb < k_blocks; kb++, it++) {
            const int slot = it % DWS_STAGES, phase = (it / DWS_STAGES) & 1;
            mbar_wait(&s.empty[slot], phase ^ 1);
            mbar_arrive_expect_tx(&s.full[slot], (DWS_BM * DWS_BK + DWS_BK * DWS_BN) * 2);
            dws_tma_load(s.a[slot], map_a, &s.full[slot], kb * DWS_BK, m_tile * DWS_BM, keep);
#pragma unroll
            for (int j = 0; j < DWS_BN / 64; j++)
                dws_tma_load(s.b[slot] + j * (DwsTileB::SUB_BYTES / 2), map_b, &s.full[slot], n_tile * DWS_BN + 64 * j,
                             kb * DWS_BK, keep);
        }
    }
}

template <bool FIRST>
__device__ __forceinline__ void dws_k_block(float (&acc)[128], DwsSmem& s, int slot, int half) {
    const uint64_t desc_a = DwsTileA::k_major(smem_address(s.a[slot]) + half * 64 * DwsTileA::ROW_BYTES);
    const uint64_t desc_b = DwsTileB::mn_major(smem_address(s.b[slot]));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DWS_BK / 16; ks++)
        wgmma_ss<256, 0, 1>(acc, DwsTileA::advance(desc_a, DwsTileA::k_step(ks)),
                            DwsTileB::advance(desc_b, DwsTileB::mn_step(ks)), !FIRST || ks > 0);
    wgmma_commit();
}

// MMA warpgroup `half`: rows 64·half .. +63 of every tile into acc, then acc (bf16) into staging once
// the epilogue warps have drained the previous tile.
template <int MODE>
__device__ __forceinline__ void dws_mma(DwsSmem& s, const DwsParams& p, int tiles_m, int tiles_n, int half) {
    const int k_blocks = p.K / DWS_BK;
    const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    int it = 0, tile_count = 0;
    float acc[128];
    for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x, tile_count++) {
        int slot = it % DWS_STAGES;
        mbar_wait(&s.full[slot], (it / DWS_STAGES) & 1);
        dws_k_block<true>(acc, s, slot, half);
        int prev_slot = slot;
        it++;
        for (int kb = 1; kb < k_blocks; kb++, it++) {
            slot = it % DWS_STAGES;
            mbar_wait(&s.full[slot], (it / DWS_STAGES) & 1);
            dws_k_block<false>(acc, s, slot, half);
            wgmma_wait<1>();
            if (lane == 0) mbar_arrive(&s.empty[prev_slot]);
            prev_slot = slot;
        }
        wgmma_wait<0>();
        wgmma_fence_registers(acc);
        if (lane == 0) mbar_arrive(&s.empty[prev_slot]);
        if (MODE != 5 && tile_count > 0) mbar_wait(&s.drained, (tile_count - 1) & 1);
        __nv_bfloat16* row0 = s.staging + (size_t)(64 * half + 16 * warp_in_group + g) * DWS_PITCH + 2 * q;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            *(__nv_bfloat162*)(row0 + 8 * i) = __floats2bfloat162_rn(acc[4 * i], acc[4 * i + 1]);
            *(__nv_bfloat162*)(row0 + 8 * DWS_PITCH + 8 * i) = __floats2bfloat162_rn(acc[4 * i + 2], acc[4 * i + 3]);
        }
        mbar_arrive(&s.staged);
    }
}

__device__ __forceinline__ float dws_gelu_grad_approx(float x) {
    const float inner = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x);
    float th;
    asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(inner));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

__device__ __forceinline__ void dws_load_aux(uint4 (&x)[DWS_ROWS_PER_BATCH], const DwsParams& p, size_t at, int rows,
                                             int r0) {
#pragma unroll
    for (int u = 0; u < DWS_ROWS_PER_BATCH; u++) {
        const int r = r0 + DWS_EPI_WARPS * u;
        if (r < rows) x[u] = load16_stream(p.aux + at + (size_t)r * p.N);
    }
}

// One batch of rows r0 + 3·u: d = GELU'(x) ∘ staged, stored; sums[8] += what was stored.
template <int MODE>
__device__ __forceinline__ void dws_finish_batch(const DwsSmem& s, const DwsParams& p, size_t at, int rows, int r0,
                                                 const uint4 (&x)[DWS_ROWS_PER_BATCH], float (&sums)[8]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int u = 0; u < DWS_ROWS_PER_BATCH; u++) {
        const int r = r0 + DWS_EPI_WARPS * u;
        if (r >= rows) break;
        float xf[8], yf[8];
        bf16x8_unpack(yf, load16(s.staging + (size_t)r * DWS_PITCH + 8 * lane));
        if (MODE != 4) bf16x8_unpack(xf, x[u]);
        else bf16x8_unpack(xf, load16(s.staging + (size_t)r * DWS_PITCH + 8 * lane));
        if (MODE != 3) {
#pragma unroll
            for (int c = 0; c < 8; c++) yf[c] *= MODE == 0 ? gelu_grad_f32(xf[c]) : dws_gelu_grad_approx(xf[c]);
        } else {
#pragma unroll
            for (int c = 0; c < 8; c++) yf[c] += xf[c];
        }
        const uint4 packed = bf16x8_pack(yf);
#if DWS_HINT
        store16_stream(p.d + at + (size_t)r * p.N, packed);
#else
        store16(p.d + at + (size_t)r * p.N, packed);
#endif
        bf16x8_unpack(yf, packed);
#pragma unroll
        for (int c = 0; c < 8; c++) sums[c] += yf[c];
    }
}

// Rows r = warp + 3·j of a staged tile, a batch of rows at a time with the next batch's aux loads in
// flight (MODE 4: no aux loads, for timing).
template <int MODE>
__device__ __forceinline__ void dws_rows(const DwsSmem& s, const DwsParams& p, size_t at, int rows, int warp,
                                         float (&sums)[8]) {
    constexpr int STEP = DWS_EPI_WARPS * DWS_ROWS_PER_BATCH;
    uint4 x[DWS_ROWS_PER_BATCH], next[DWS_ROWS_PER_BATCH];
    if (MODE != 4) dws_load_aux(x, p, at, rows, warp);
    for (int r0 = warp; r0 < rows; r0 += STEP) {
        if (MODE != 4 && r0 + STEP < rows) dws_load_aux(next, p, at, rows, r0 + STEP);
        dws_finish_batch<MODE>(s, p, at, rows, r0, x, sums);
#pragma unroll
        for (int u = 0; u < DWS_ROWS_PER_BATCH; u++) x[u] = next[u];
    }
}

__device__ __forceinline__ void dws_prefetch_rows(const DwsParams& p, int t, int tiles_m, int tiles_n, int warp) {
    int m_tile, n_tile;
    dws_tile(t, tiles_m, tiles_n, p.group_m, &m_tile, &n_tile);
    const size_t at = (size_t)m_tile * DWS_BM * p.N + (size_t)n_tile * DWS_BN + 8 * (threadIdx.x % 32);
    const int rows = min(DWS_BM, p.M - m_tile * DWS_BM);
    for (int r = warp; r < rows; r += DWS_EPI_WARPS) asm volatile("prefetch.global.L2 [%0];" ::"l"(p.aux + at + (size_t)r * p.N));
}

// Epilogue warp `warp` (0..2) over every tile of this block.
template <int MODE>
__device__ __forceinline__ void dws_epilogue(DwsSmem& s, const DwsParams& p, int tiles_m, int tiles_n, int warp) {
    const int lane = threadIdx.x % 32, et = 32 * warp + lane;
    int tile_count = 0;
    if (DWS_PREFETCH && MODE != 2 && (int)blockIdx.x < tiles_m * tiles_n) dws_prefetch_rows(p, blockIdx.x, tiles_m, tiles_n, warp);
    for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x, tile_count++) {
        int m_tile, n_tile;
        dws_tile(t, tiles_m, tiles_n, p.group_m, &m_tile, &n_tile);
        const size_t at = (size_t)m_tile * DWS_BM * p.N + (size_t)n_tile * DWS_BN + 8 * lane;
        const int rows = min(DWS_BM, p.M - m_tile * DWS_BM);
        float sums[8];
#pragma unroll
        for (int c = 0; c < 8; c++) sums[c] = 0.0f;
        mbar_wait(&s.staged, tile_count & 1);
        // the next tile's aux rows into L2 while this one is finished (a tile's time ahead of their loads)
        if (DWS_PREFETCH && MODE != 2 && t + (int)gridDim.x < tiles_m * tiles_n) dws_prefetch_rows(p, t + gridDim.x, tiles_m, tiles_n, warp);
        if (MODE != 2) dws_rows<MODE>(s, p, at, rows, warp, sums);
        mbar_arrive(&s.drained);
        float* mine = s.column_sums[warp] + 8 * lane;
#pragma unroll
        for (int c = 0; c < 8; c++) mine[c] = sums[c];
        named_barrier_sync(1, DWS_EPI_THREADS);
        for (int c = et; c < DWS_BN; c += DWS_EPI_THREADS) {
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < DWS_EPI_WARPS; w++) total += s.column_sums[w][c];
            p.partial[(size_t)m_tile * p.N + (size_t)n_tile * DWS_BN + c] = total;
        }
        named_barrier_sync(1, DWS_EPI_THREADS);
    }
}
#endif  // WGMMA_AVAILABLE

template <int MODE>
__global__ void __launch_bounds__(DWS_THREADS, 1)
    matmul_dgelu_ws_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const DwsParams p) {
#if WGMMA_AVAILABLE
    extern __shared__ uint8_t smem_raw[];
    DwsSmem& s = *(DwsSmem*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int tiles_m = (p.M + DWS_BM - 1) / DWS_BM, tiles_n = p.N / DWS_BN;
    if (threadIdx.x == 0) {
        for (int i = 0; i < DWS_STAGES; i++) {
            mbar_init(&s.full[i], 1);
            mbar_init(&s.empty[i], 8);  // lane 0 of each MMA warp
        }
        mbar_init(&s.staged, 256);
        mbar_init(&s.drained, DWS_EPI_THREADS);
        mbar_fence_init();
    }
    __syncthreads();
    const int warp = threadIdx.x / 32;
    if (warp >= 4 && warp < 12) {
        registers_increase<DWS_MMA_REGS>();
        dws_mma<MODE>(s, p, tiles_m, tiles_n, warp / 4 - 1);
    } else {
        registers_decrease<DWS_EPI_REGS>();
        if (warp == 0) {
            if (threadIdx.x == 0) dws_producer(s, &map_a, &map_b, p, tiles_m, tiles_n);
        } else {
            dws_epilogue<MODE>(s, p, tiles_m, tiles_n, warp - 1);
        }
    }
#else
    __trap();
#endif
}

static inline size_t matmul_dgelu_ws_partial_floats(int M, int N) { return (size_t)((M + DWS_BM - 1) / DWS_BM) * N; }

static int dws_mode = 0;
static inline void matmul_dgelu_ws(__nv_bfloat16* d, float* partial, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                   const __nv_bfloat16* aux, int M, int N, int K, int group_m, cudaStream_t stream) {
    const CUtensorMap map_a = make_matrix_tensor_map(a, M, K, DWS_BM, "the dGELU GEMM's a");
    const CUtensorMap map_b = make_matrix_tensor_map(b, K, N, DWS_BK, "the dGELU GEMM's b");
    const DwsParams p = {aux, d, partial, M, N, K, group_m > 0 ? group_m : 8, dws_mode};
    const int tiles = (M + DWS_BM - 1) / DWS_BM * (N / DWS_BN);
    const int grid = tiles < flash2_sm_count() ? tiles : flash2_sm_count();
    if (dws_mode == 1)
        launch_with_smem<matmul_dgelu_ws_kernel<1>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
    else if (dws_mode == 3)
        launch_with_smem<matmul_dgelu_ws_kernel<3>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
    else if (dws_mode == 5)
        launch_with_smem<matmul_dgelu_ws_kernel<5>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
    else if (dws_mode == 4)
        launch_with_smem<matmul_dgelu_ws_kernel<4>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
    else if (dws_mode == 2)
        launch_with_smem<matmul_dgelu_ws_kernel<2>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
    else
        launch_with_smem<matmul_dgelu_ws_kernel<0>>(dim3(grid), DWS_THREADS, DWS_SMEM_BYTES, stream, map_a, map_b, p);
}

#endif  // MATMUL_DGELU_WS_CUH
