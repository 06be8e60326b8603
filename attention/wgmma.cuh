// wgmma.cuh: Hopper's warpgroup tensor-core product (wgmma.mma_async, sm_90a) and the shared-memory
// layout it reads, for the flash2 Hopper kernels (flash2_forward_hopper.cuh, flash2_backward_hopper.cuh).
//
// A warpgroup is 4 consecutive warps (the first a multiple of 4). One wgmma computes a 64×N fp32
// product D (+)= A·B with k = 16: warp w of the group holds rows 16w..16w+15 of D in the same
// fragment layout as mma.m16n8k16 (n8 tile i: d[4i], d[4i+1] at row g, columns 8i+2t, 8i+2t+1;
// d[4i+2], d[4i+3] at row g+8), so accumulators_to_a() turns D into a register A operand as before.
// B always comes from shared memory, A from shared memory or registers; the product runs
// asynchronously until wgmma_wait() and reads its shared-memory operands through the async proxy
// (hence fence_proxy_async() after ordinary stores into them, before the barrier).
//
// Shared-memory operands are swizzled tiles (WgTile): the tile is cut into sub-tiles of W columns,
// each stored row after row with rows of 2W bytes, and 16-byte chunk c of row r stored at chunk
// c ^ (bits 7.. of the row's byte offset), which is how the tensor cores read it. W = 64 (the
// 128-byte swizzle) when the width is a multiple of 64, else W = 16 (the 32-byte swizzle: head dims
// 80 and 96). The pattern repeats every 8 rows (8·2W bytes). A descriptor (PTX ISA "matrix
// descriptor") gives the start address, LBO, SBO and the swizzle mode:
//   K-major operand (k contiguous, e.g. K for S = K Qᵀ): SBO = 8 rows (next 8 rows of M or N); a
//     step of 16 in k is +32 bytes within the row, past the row's end the next sub-tile; LBO unused.
//   MN-major operand (m or n contiguous, e.g. dO as B of dV = Pᵀ dO): SBO = 8 rows (next 8 rows of
//     k), LBO = the sub-tile size (next W of m or n); a step of 16 in k is 16 rows.
// Tiles must start aligned to 8 rows of their swizzle (1024 bytes covers both).
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

// ROWS × COLS bf16 in swizzled sub-tiles of SUB_COLS columns (64 with the 128-byte swizzle when
// COLS allows, else 16 with the 32-byte swizzle).
template <int ROWS, int COLS>
struct WgTile {
    static_assert(COLS % 16 == 0 && ROWS % 8 == 0, "WgTile: 16-column multiples and 8-row groups");
    static constexpr int ELEMS = ROWS * COLS;
    static constexpr int ROW_BYTES = COLS % 64 == 0 ? 128 : 32;  // one row of a sub-tile
    static constexpr int SUB_COLS = ROW_BYTES / 2, SUB_BYTES = ROWS * ROW_BYTES;
    static constexpr int ROW_ELEMS = SUB_COLS;  // from one row to the next within a sub-tile
    static constexpr int CHUNKS_PER_ROW = ROW_BYTES / 16;
    static constexpr uint64_t SWIZZLE_MODE = ROW_BYTES == 128 ? 1 : 3;  // descriptor bits 62-63
    // element offset of chunk (8 columns) `chunk` of row `row`
    static __device__ __forceinline__ int index(int row, int chunk) {
        const int sub = chunk / CHUNKS_PER_ROW, c = chunk % CHUNKS_PER_ROW;
        const int pattern = (row * ROW_BYTES >> 7) & (CHUNKS_PER_ROW - 1);
        return sub * ROWS * SUB_COLS + row * SUB_COLS + ((c ^ pattern) << 3);
    }
    // Descriptors of the operand at byte address `addr` (a row-group boundary of this tile).
    static __device__ __forceinline__ uint64_t k_major(uint32_t addr) { return desc(addr, 16, 8 * ROW_BYTES); }
    static __device__ __forceinline__ uint64_t mn_major(uint32_t addr) { return desc(addr, SUB_BYTES, 8 * ROW_BYTES); }
    // Byte offset of k-step ks (16 columns) of a K-major operand; of rows 16·ks of an MN-major one.
    static __host__ __device__ constexpr uint32_t k_step(int ks) {
        return (ks * 32 / ROW_BYTES) * SUB_BYTES + (ks * 32 % ROW_BYTES);
    }
    static __host__ __device__ constexpr uint32_t mn_step(int ks) { return ks * 16 * ROW_BYTES; }
    // byte offset of row `row` within a sub-tile (a multiple of 8)
    static __host__ __device__ constexpr uint32_t row_offset(int row) { return row * ROW_BYTES; }

    static __device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
        return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16 |
               (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32 | SWIZZLE_MODE << 62;
    }
};

// Copies rows [0, ROWS) of a (rows, COLS) bf16 matrix (rows `row_stride` apart) into a WgTile with
// cp.async; rows ≥ rows_valid become zeros (flash2_common.cuh's loader, on this tile's layout).
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_wg_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* src, long row_stride,
                                                   int rows_valid) {
    load_tile_async_into<WgTile<ROWS, COLS>, ROWS, COLS, THREADS>(tile, src, row_stride, rows_valid);
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
#define WGMMA_ACC8(d, i) WGMMA_ACC4(d, i), WGMMA_ACC4(d, i + 4)
#define WGMMA_ACC16(d, i) WGMMA_ACC4(d, i), WGMMA_ACC4(d, i + 4), WGMMA_ACC4(d, i + 8), WGMMA_ACC4(d, i + 12)
#define WGMMA_ACC24(d) WGMMA_ACC16(d, 0), WGMMA_ACC8(d, 16)
#define WGMMA_ACC32(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16)
#define WGMMA_ACC40(d) WGMMA_ACC32(d), WGMMA_ACC8(d, 32)
#define WGMMA_ACC48(d) WGMMA_ACC32(d), WGMMA_ACC16(d, 32)
#define WGMMA_ACC64(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16), WGMMA_ACC16(d, 32), WGMMA_ACC16(d, 48)

#if WGMMA_AVAILABLE
// One function per N (the instruction names N and lists N/2 accumulator registers); otherwise alike.
// d (64×48 fp32, this thread's 24) (+)= A (64×16, shared) · B (16×48, shared)
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_n48(float (&d)[24], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, %27, %28;\n}\n"
        : WGMMA_ACC24(d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}
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
// d (64×64 fp32, this thread's 32) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this
// warp's 16 rows) · B (16×64, shared)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : WGMMA_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
// d (64×80 fp32, this thread's 40) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this
// warp's 16 rows) · B (16×80, shared)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n80(float (&d)[40], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, {%40, %41, %42, %43}, %44, p, 1, 1, %46;\n}\n"
        : WGMMA_ACC40(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
// d (64×96 fp32, this thread's 48) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this
// warp's 16 rows) · B (16×96, shared)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n96(float (&d)[48], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, %54;\n}\n"
        : WGMMA_ACC48(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
// d (64×128 fp32, this thread's 64) (+)= A (64×16, registers: the mma.m16n8k16 A fragment of this
// warp's 16 rows) · B (16×128, shared)
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

// d (+)= A · B for N = 48, 64 or 128 (A from shared memory) and 64, 80, 96 or 128 (A from registers).
// TRANS = 0: the operand is K-major in shared memory, 1: MN-major.
template <int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if WGMMA_AVAILABLE
    if constexpr (N == 48) wgmma_ss_n48<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
    else if constexpr (N == 64) wgmma_ss_n64<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
    else wgmma_ss_n128<TRANS_A, TRANS_B>(d, desc_a, desc_b, accumulate);
#else
    __trap();
#endif
}
template <int N, int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int accumulate) {
#if WGMMA_AVAILABLE
    if constexpr (N == 64) wgmma_rs_n64<TRANS_B>(d, a, desc_b, accumulate);
    else if constexpr (N == 80) wgmma_rs_n80<TRANS_B>(d, a, desc_b, accumulate);
    else if constexpr (N == 96) wgmma_rs_n96<TRANS_B>(d, a, desc_b, accumulate);
    else wgmma_rs_n128<TRANS_B>(d, a, desc_b, accumulate);
#else
    __trap();
#endif
}

#endif  // WGMMA_CUH
