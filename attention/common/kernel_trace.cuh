// kernel_trace.cuh: an optional timeline of the decode step, one record per block of each kernel
// (when it started, when its wait for the previous kernel returned, when thread 0 finished; which SM),
// for seeing in one replayed step which kernel waits on which. Built only with -DKERNEL_TRACE; without
// it every call here is empty and the kernels are unchanged.
//
// Each translation unit has its own device pointer to the buffer (no relocatable device code), so each
// arms its own: kernel_trace_arm here, decode_attention_trace_arm for attention/decode.
#ifndef ATTENTION_KERNEL_TRACE_CUH
#define ATTENTION_KERNEL_TRACE_CUH

#include <cuda_runtime.h>

typedef struct {
    unsigned tag, block, smid, aux;            // tag: a letter per kernel kind; aux: the kind's own detail
    unsigned long long start, ready, end;      // %globaltimer, ns
} KernelTraceRecord;

typedef struct {
    unsigned count, capacity, pad[2];
    KernelTraceRecord records[1];  // capacity of them
} KernelTraceBuffer;

typedef struct {
    unsigned long long start, ready;
} KernelTraceStamp;

#ifdef KERNEL_TRACE
static __device__ KernelTraceBuffer* kernel_trace_buffer;  // NULL: not tracing

static __device__ __forceinline__ unsigned long long kernel_trace_clock() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// This translation unit's kernels record into `buffer` (NULL: they stop), in stream order.
static cudaError_t kernel_trace_arm(KernelTraceBuffer* buffer, cudaStream_t stream) {
    return cudaMemcpyToSymbolAsync(kernel_trace_buffer, &buffer, sizeof(buffer), 0, cudaMemcpyHostToDevice, stream);
}
#endif

static __device__ __forceinline__ KernelTraceStamp kernel_trace_begin() {
    KernelTraceStamp s = {0, 0};
#ifdef KERNEL_TRACE
    s.start = s.ready = kernel_trace_clock();
#endif
    return s;
}

static __device__ __forceinline__ void kernel_trace_ready(KernelTraceStamp* s) {
#ifdef KERNEL_TRACE
    s->ready = kernel_trace_clock();
#else
    (void)s;
#endif
}

// Thread 0 of the block writes its record (call where thread 0 ends).
static __device__ __forceinline__ void kernel_trace_end(const KernelTraceStamp* s, char tag, unsigned aux) {
#ifdef KERNEL_TRACE
    KernelTraceBuffer* b = kernel_trace_buffer;
    if (!b || threadIdx.x != 0) return;
    const unsigned linear_block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned i = atomicAdd(&b->count, 1u);
    if (i < b->capacity) {
        KernelTraceRecord r = {(unsigned)tag, linear_block, smid, aux, s->start, s->ready, kernel_trace_clock()};
        b->records[i] = r;
    }
#else
    (void)s, (void)tag, (void)aux;
#endif
}

#endif  // ATTENTION_KERNEL_TRACE_CUH
