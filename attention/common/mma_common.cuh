// mma_common.cuh: the building blocks the flash1 and flash2 kernels share: tensor-core MMA
// (mma.sync m16n8k16, bf16 in, fp32 accumulate), ldmatrix, cp.async copies with zero fill, the
// bank-conflict-free shared-memory tile layout, fast exp2, and their launch.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), from the PTX ISA:
//   A (16×16, row-major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16×8, k × n)       b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n g)
//   C (16×8, fp32)        c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
// So the accumulator of two adjacent n8 tiles is, after packing to bf16, the A operand of the
// next product (P = softmax(S) feeds O += P V without leaving registers).
#ifndef ATTENTION_MMA_COMMON_CUH
#define ATTENTION_MMA_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "attention/common/cuda_check.h"

#define FLASH2_LOG2E 1.4426950408889634f
#define FLASH2_LN2 0.6931471805599453f

// Launches KERNEL(args...) with smem_bytes of dynamic shared memory (more than the default 48 KB
// needs the kernel's limit raised, done on its first launch only: launches sit on the training hot
// path).
template <auto KERNEL, typename... Args>
static inline void launch_with_smem(dim3 grid, int threads, size_t smem_bytes, cudaStream_t stream,
                                    const Args&... args) {
    static int limit_set = 0;  // one per kernel (per template instance)
    if (!limit_set) {
        ATTN_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
        limit_set = 1;
    }
    KERNEL<<<grid, threads, smem_bytes, stream>>>(args...);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

// An attribute of the current device (one device per process, as in the trainer; callers cache it).
static inline int flash2_device_attribute(cudaDeviceAttr attr) {
    int device = 0, value = 0;
    ATTN_CUDA_CHECK(cudaGetDevice(&device));
    ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
    return value;
}

// Multiprocessors of the current device: the persistent kernels start one block per multiprocessor.
static inline int flash2_sm_count(void) {
    static int count = 0;
    if (!count) count = flash2_device_attribute(cudaDevAttrMultiProcessorCount);
    return count;
}

// Bytes of L2 cache of the current device.
static inline long flash2_l2_bytes(void) {
    static int bytes = 0;
    if (!bytes) bytes = flash2_device_attribute(cudaDevAttrL2CacheSize);
    return bytes;
}

// ---- shared-memory tiles ------------------------------------------------------------------------
// A tile is ROWS rows of COLS bf16, moved in 16-byte chunks (8 values). When a row is a multiple of
// 64 values, chunk c of row r is stored at chunk (c ^ r) within its 128-byte group (XOR swizzle);
// otherwise (head dims 80, 96) rows are padded by one chunk. Either way the 8 rows one ldmatrix
// phase reads fall in 8 different 16-byte bank groups: no bank conflicts, for cp.async writes too.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

template <int COLS>
struct SmemTile {
    static constexpr bool SWIZZLE = COLS % 64 == 0;
    static constexpr int ROW_ELEMS = SWIZZLE ? COLS : COLS + 8;
    static constexpr int ROW_BYTES = ROW_ELEMS * 2;
    static constexpr int CHUNKS = COLS / 8;
    static __device__ __forceinline__ int index(int row, int chunk) {
        if (SWIZZLE) return row * ROW_ELEMS + (((chunk ^ row) & 7) | (chunk & ~7)) * 8;
        return row * ROW_ELEMS + chunk * 8;
    }
    static constexpr int elems(int rows) { return rows * ROW_ELEMS; }
    // ldmatrix addressing without per-load index arithmetic: a lane that reads row row0 + lane_row,
    // chunk chunk0 + lane_chunk (lane_chunk 0 or 1) computes lane_base once; then, for row0 a multiple
    // of 8 and chunk0 even, the swizzle of chunk0 is one XOR on bits 4-6 of that base (tiles start
    // 128-byte aligned and rows are 128-byte multiples, so the XOR commutes with the row offset).
    static __device__ __forceinline__ uint32_t lane_base(const __nv_bfloat16* tile, int lane_row, int lane_chunk) {
        return smem_address(tile) + lane_row * ROW_BYTES +
               (SWIZZLE ? ((lane_chunk ^ lane_row) & 7) << 4 : lane_chunk << 4);
    }
    static __device__ __forceinline__ uint32_t at(uint32_t lane_base, int row0, int chunk0) {
        if (SWIZZLE) return (lane_base ^ ((chunk0 & 6) << 4)) + row0 * ROW_BYTES + ((chunk0 & ~7) << 4);
        return lane_base + row0 * ROW_BYTES + (chunk0 << 4);
    }
};

// 16-byte global→shared copy that bypasses L1; src_bytes = 0 writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 4-byte global→shared copy; src_bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
                 "r"(src_bytes));
}

// Copies rows [0, ROWS) of a (rows, COLS) bf16 matrix whose rows are `row_stride` apart in global
// memory into a SmemTile; rows ≥ rows_valid become zeros (partial last blocks). Fully unrolled;
// when the threads cover whole rows 8 at a time, each thread keeps one chunk column and its
// shared-memory offsets are constants apart (the swizzle repeats every 8 rows).
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* src, long row_stride,
                                                int rows_valid) {
    typedef SmemTile<COLS> Tile;
    constexpr int CHUNKS = COLS / 8, TOTAL = ROWS * CHUNKS;
    if constexpr (THREADS % CHUNKS == 0 && (THREADS / CHUNKS) % 8 == 0 && TOTAL % THREADS == 0) {
        constexpr int ROW_STEP = THREADS / CHUNKS;
        const int row0 = threadIdx.x / CHUNKS, chunk = threadIdx.x % CHUNKS;
        __nv_bfloat16* dst = tile + Tile::index(row0, chunk);
        const __nv_bfloat16* from = src + (long)row0 * row_stride + chunk * 8;
#pragma unroll
        for (int j = 0; j < TOTAL / THREADS; j++) {
            const bool valid = row0 + j * ROW_STEP < rows_valid;
            cp_async_16(dst + j * ROW_STEP * Tile::ROW_ELEMS, valid ? from + (long)j * ROW_STEP * row_stride : src,
                        valid ? 16 : 0);
        }
    } else {
#pragma unroll
        for (int j = 0; j < (TOTAL + THREADS - 1) / THREADS; j++) {
            const int i = threadIdx.x + j * THREADS;
            if (TOTAL % THREADS != 0 && i >= TOTAL) break;
            const int row = i / CHUNKS, chunk = i % CHUNKS;
            const bool valid = row < rows_valid;
            const __nv_bfloat16* from = valid ? src + (long)row * row_stride + chunk * 8 : src;
            cp_async_16(tile + Tile::index(row, chunk), from, valid ? 16 : 0);
        }
    }
}

// Copies rows [0, rows_valid) of a SmemTile to global memory with 16-byte stores.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void store_tile(__nv_bfloat16* dst, long row_stride, const __nv_bfloat16* tile,
                                           int rows_valid, int first_thread) {
    constexpr int CHUNKS = COLS / 8;
    for (int i = threadIdx.x - first_thread; i < ROWS * CHUNKS; i += THREADS) {
        int row = i / CHUNKS, chunk = i % CHUNKS;
        if (row < rows_valid)
            *(uint4*)(dst + (long)row * row_stride + chunk * 8) =
                *(const uint4*)(tile + SmemTile<COLS>::index(row, chunk));
    }
}

// ---- tensor-core fragments ----------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

// c (16×8 fp32) += a (16×16 bf16) · b (16×8 bf16)
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t*)&v;
}

// The A operand of a product over k = 16·kk..16·kk+15 from the accumulators of n8 tiles 2kk, 2kk+1.
__device__ __forceinline__ void accumulators_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// ldmatrix lane addressing. A operand (16 rows × 16 k) of a row-major tile: rows row0 + (lane & 15),
// chunk k_chunk0 + lane / 16.
__device__ __forceinline__ int a_row(int lane) { return lane & 15; }
__device__ __forceinline__ int a_chunk(int lane) { return lane >> 4; }
// B operand for two n8 tiles from a tile stored n-major ([n][k], e.g. K for S = Q Kᵀ), non-transposed
// x4: r0,r1 = tile n0, r2,r3 = tile n0+8. Row n0 + b_row(lane), chunk k_chunk0 + b_chunk(lane).
__device__ __forceinline__ int b_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
__device__ __forceinline__ int b_chunk(int lane) { return (lane >> 3) & 1; }
// B operand for two n8 tiles from a tile stored k-major ([k][n], e.g. V for O = P V), transposed x4:
// r0,r1 = n tile chunk0, r2,r3 = chunk0+1. Row k0 + bt_row(lane), chunk n_chunk0 + bt_chunk(lane).
__device__ __forceinline__ int bt_row(int lane) { return (lane & 7) + (((lane >> 3) & 1) << 3); }
__device__ __forceinline__ int bt_chunk(int lane) { return lane >> 4; }

// dst[0] += x, dst[1] += y in global memory (8-byte aligned); one vector reduction on Hopper.
__device__ __forceinline__ void atomic_add_f32x2(float* dst, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif  // ATTENTION_MMA_COMMON_CUH
