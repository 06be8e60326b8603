// hopper_async.cuh: Hopper's asynchronous data movement and synchronization (sm_90), as the
// warp-specialized flash2 kernels use them (flash2_forward_hopper.cuh, flash2_backward_hopper.cuh):
//
//   mbarrier   a 64-bit barrier in shared memory with a phase bit. It completes a phase when the
//              expected number of arrivals has come and every byte announced with expect_tx has
//              landed; waiters spin on the parity of the phase they need (mbar_wait).
//   TMA        cp.async.bulk.tensor: one thread copies a whole tile between global memory (described
//              by a tensor map made on the host, tensor_map.h) and shared memory, applying the
//              wgmma swizzle on the way and zero-filling rows outside the tensor; loads complete
//              on an mbarrier, stores are waited for with bulk groups.
//   bulk copy  cp.async.bulk / cp.reduce.async.bulk: contiguous bytes, no tensor map; the reduce
//              form adds fp32 shared-memory values into global memory (the backward's dQ).
//   named barriers (bar.sync / bar.arrive with an id and a thread count) order warpgroups without
//              stopping the whole block; setmaxnreg moves registers between warpgroups.
//
// Pipeline convention (as in every TMA ring): a consumer waits on "full[s]" with phase 0 first; a
// producer waits on "empty[s]" with phase 1 first, which a fresh barrier satisfies at once.
#ifndef HOPPER_ASYNC_CUH
#define HOPPER_ASYNC_CUH

#include <cuda.h>  // CUtensorMap (a 128-byte opaque struct; nothing is linked from libcuda)
#include <stdint.h>

#include "attention/common/mma_common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define HOPPER_ASYNC_AVAILABLE 1
#else
#define HOPPER_ASYNC_AVAILABLE 0
#endif

#if HOPPER_ASYNC_AVAILABLE
// ---- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}
// Makes initialized barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// One arrival that also announces `bytes` of asynchronous copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}
// Spins until the phase of parity `phase` has completed.
#ifdef FLASH2_HANG_CHECK  // debugging: a wait of over 2 s names the barrier and traps
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int phase) {
    uint64_t start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (true) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_address(bar)), "r"(phase) : "memory");
        if (done) return;
        uint64_t now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > 2000000000ull) {
            printf("hang: block (%d, %d) thread %d waits on the mbarrier at shared %u for parity %d\n", blockIdx.x,
                   blockIdx.y, threadIdx.x, smem_address(bar), phase);
            __trap();
        }
    }
}
#else
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int phase) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "MBAR_WAIT_LOOP:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra MBAR_WAIT_LOOP;\n}\n" ::"r"(smem_address(bar)),
        "r"(phase)
        : "memory");
}
#endif

// ---- TMA (tensor maps of rank 4: columns, heads, rows, batch) ---------------------------------
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}
// Box at (col, head, row, batch) → shared memory at `dst`; completes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int head,
                                            int row, int batch) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(smem_address(dst)),
        "l"((uint64_t)map), "r"(smem_address(bar)), "r"(col), "r"(head), "r"(row), "r"(batch)
        : "memory");
}
// Shared memory at `src` → box at (col, head, row, batch); rows outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int col, int head, int row,
                                             int batch) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(smem_address(src)), "r"(col), "r"(head), "r"(row), "r"(batch)
                 : "memory");
}

// ---- bulk copies (contiguous, 16-byte multiples) -----------------------------------------------
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_address(dst)),
        "l"(src), "r"(bytes), "r"(smem_address(bar))
        : "memory");
}
// global[dst] += shared[src], fp32, element by element (atomic per element in L2).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_address(src)), "r"(bytes)
                 : "memory");
}
// global[dst] = shared[src] (a plain bulk copy out of shared memory).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_address(src)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's bulk groups have finished reading shared memory (it may be reused).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Waits until this thread's bulk groups are complete (their global writes performed).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders the async proxy's global writes before this thread's later generic accesses (and back).
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- named barriers and register reallocation --------------------------------------------------
// Barrier 0 is __syncthreads'; the kernels number theirs from 1. `threads` counts every thread
// that syncs or arrives, a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int REGS>
__device__ __forceinline__ void registers_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// ---- global semaphores (the backward's ordering of dQ stores and additions) --------------------
__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void add_release(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// The value before the addition (relaxed: orders nothing else).
__device__ __forceinline__ int fetch_add_relaxed(int* p, int v) {
    int old;
    asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
#endif  // HOPPER_ASYNC_AVAILABLE

#endif  // HOPPER_ASYNC_CUH
