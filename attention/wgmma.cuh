// wgmma.cuh: Hopper's warpgroup tensor-core product (wgmma.mma_async, sm_90a) and the shared-memory
// layout it reads, for the flash2 backward (flash2_backward_hopper.cuh).
//
// A warpgroup is 4 consecutive warps (the first a multiple of 4). One wgmma computes a 64×N fp32
// product D (+)= A·B with k = 16: warp w of the group holds rows 16w..16w+15 of D in the same
// fragment layout as mma.m16n8k16 (n8 tile i: d[4i], d[4i+1] at row g, columns 8i+2t, 8i+2t+1;
// d[4i+2], d[4i+3] at row g+8), so accumulators_to_a() turns D into a register A operand as before.
// B always comes from shared memory, A from shared memory or registers; the product runs
// asynchronously until wgmma_wait() and reads its shared-memory operands through the async proxy
// (hence fence_proxy_async() after ordinary stores into them, before the barrier).
//
// Shared-memory operands use the 128-byte swizzle (WgTile): rows of 64 bf16 (128 bytes), 8-row
// groups of 1024 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8); a tile wider than 64
// columns is a sequence of such 64-column sub-tiles. A descriptor (PTX ISA "matrix descriptor")
// gives the start address, LBO and SBO; for this swizzle:
//   K-major operand (k contiguous, e.g. K for S = K Qᵀ): SBO = 1024 (next 8 rows of M or N); a step
//     of 16 in k is +32 bytes within the 128-byte row, the next 64 k the next sub-tile; LBO unused.
//   MN-major operand (m or n contiguous, e.g. dO as B of dV = Pᵀ dO): SBO = 1024 (next 8 rows of k),
//     LBO = the sub-tile size (next 64 of m or n); a step of 16 in k is +2048 bytes.
// Tiles must start 1024-byte aligned (the swizzle is applied to address bits 4-6 from bits 7-9).
#ifndef WGMMA_CUH
#define WGMMA_CUH

#include <stdint.h>

#include "flash2_common.cuh"

// The wgmma instructions exist only in the sm_90a target; other targets compile these helpers to
// a trap (the host dispatches to the Hopper kernel only on compute capability 9.x).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_AVAILABLE 1
#else
#define WGMMA_AVAILABLE 0
#endif

// ROWS × COLS bf16 in 64-column sub-tiles with the 128-byte swizzle (COLS a multiple of 64).
template <int ROWS, int COLS>
struct WgTile {
    static_assert(COLS % 64 == 0 && ROWS % 8 == 0, "WgTile: whole 64-column sub-tiles and 8-row groups");
    static constexpr int ELEMS = ROWS * COLS;
    static constexpr int SUB_BYTES = ROWS * 128;  // one 64-column sub-tile
    // element offset of chunk (8 columns) `chunk` of row `row`
    static __device__ __forceinline__ int index(int row, int chunk) {
        return (chunk >> 3) * ROWS * 64 + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
    }
};

// Copies rows [0, ROWS) of a (rows, COLS) bf16 matrix (rows `row_stride` apart) into a WgTile with
// cp.async; rows ≥ rows_valid become zeros. Each thread keeps one chunk column, 8-row multiples apart.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_wg_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* src, long row_stride,
                                                   int rows_valid) {
    constexpr int CHUNKS = COLS / 8, ROW_STEP = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && ROW_STEP % 8 == 0 && ROWS % ROW_STEP == 0, "load_wg_tile_async split");
    const int row0 = threadIdx.x / CHUNKS, chunk = threadIdx.x % CHUNKS;
    __nv_bfloat16* dst = tile + WgTile<ROWS, COLS>::index(row0, chunk);
    const __nv_bfloat16* from = src + (long)row0 * row_stride + chunk * 8;
#pragma unroll
    for (int j = 0; j < ROWS / ROW_STEP; j++) {
        const bool valid = row0 + j * ROW_STEP < rows_valid;
        cp_async_16(dst + j * ROW_STEP * 64, valid ? from + (long)j * ROW_STEP * row_stride : src, valid ? 16 : 0);
    }
}

// Matrix descriptor for a 128-byte-swizzled operand at shared address `addr` (bytes).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void fence_proxy_async() {
#if WGMMA_AVAILABLE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Orders this warpgroup's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
#if WGMMA_AVAILABLE
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if WGMMA_AVAILABLE
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if WGMMA_AVAILABLE
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulators across wgmma_wait().
template <int N>
__device__ __forceinline__ void wgmma_fence_registers(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define WGMMA_ACC4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WGMMA_ACC16(d, i) WGMMA_ACC4(d, i), WGMMA_ACC4(d, i + 4), WGMMA_ACC4(d, i + 8), WGMMA_ACC4(d, i + 12)
#define WGMMA_ACC32(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16)
#define WGMMA_ACC64(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16), WGMMA_ACC16(d, 32), WGMMA_ACC16(d, 48)

#if WGMMA_AVAILABLE
// d (64×64 fp32, this thread's 32) (+)= A (64×16, shared) · B (16×64, shared)
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : WGMMA_ACC32(d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}
// d (64×64 fp32) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this warp's 16 rows) · B (shared)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : WGMMA_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// d (64×128 fp32, this thread's 64) (+)= A (64×16, shared) · B (16×128, shared)
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : WGMMA_ACC64(d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}
// d (64×128 fp32) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this warp's 16 rows) · B (shared)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : WGMMA_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
#endif  // WGMMA_AVAILABLE

// d (+)= A · B for N = 64 or 128. TRANS = 0: the operand is K-major in shared memory, 1: MN-major.
template <int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if WGMMA_AVAILABLE
    if constexpr (N == 64) wgmma_ss_n64<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
    else wgmma_ss_n128<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
#else
    __trap();
#endif
}
template <int N, int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int accumulate) {
#if WGMMA_AVAILABLE
    if constexpr (N == 64) wgmma_rs_n64<TRANS_B>(d, a, desc_b, accumulate);
    else wgmma_rs_n128<TRANS_B>(d, a, desc_b, accumulate);
#else
    __trap();
#endif
}

#endif  // WGMMA_CUH
