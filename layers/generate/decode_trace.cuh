// decode_trace.cuh: the per-block timeline of a few replayed decode steps, for seeing which kernel of
// the step waits on which (attention/common/kernel_trace.cuh records it). Only in a build with
// -DKERNEL_TRACE (`make build/train_gpt_trace`); elsewhere decode_trace_replay does nothing.
//
//   GPT_TRACE_FILE   the CSV to write (unset: no trace)
//   GPT_TRACE_FIRST  the first replay traced (default 100)
//   GPT_TRACE_STEPS  how many replays in a row (default 3)
//
// scripts/decode_trace.py summarizes the file. The records cost the traced kernels time (an atomic and
// a store per block, about 9% of a GPT3-1.3B step): read the trace for where the step's time goes,
// and measure a change with bench_generate.py on the ordinary build.
#ifndef DECODE_TRACE_CUH
#define DECODE_TRACE_CUH

#include <cuda_runtime.h>

#ifndef KERNEL_TRACE
static inline void decode_trace_replay(cudaStream_t, int) {}
#else
#include <stdio.h>
#include <stdlib.h>

#include "attention/common/kernel_trace.cuh"
#include "attention/decode.h"
#include "layers/cuda_common.h"

#define DECODE_TRACE_CAPACITY (1u << 20)  // records: three GPT3-1.3B steps at batch 4 take about 100k

// Every translation unit's copy of the buffer pointer: this one's and attention/decode's.
static void decode_trace_arm_all(KernelTraceBuffer* b, cudaStream_t s) {
    CUDA_CHECK(kernel_trace_arm(b, s));
    CUDA_CHECK(decode_attention_trace_arm(b, s));
}

static void decode_trace_write(const KernelTraceBuffer* dev, const char* path) {
    unsigned head[2];  // count, capacity
    CUDA_CHECK(cudaMemcpy(head, dev, sizeof(head), cudaMemcpyDeviceToHost));
    const unsigned n = head[0] < head[1] ? head[0] : head[1];
    KernelTraceRecord* r = (KernelTraceRecord*)malloc((size_t)n * sizeof(KernelTraceRecord) + 1);
    FILE* f = fopen(path, "w");
    if (!r || !f) {
        fprintf(stderr, "error: decode trace: cannot write %s (GPT_TRACE_FILE)\n", path);
        exit(1);
    }
    CUDA_CHECK(cudaMemcpy(r, dev->records, (size_t)n * sizeof(KernelTraceRecord), cudaMemcpyDeviceToHost));
    fprintf(f, "tag,block,smid,aux,start,ready,end\n");
    for (unsigned i = 0; i < n; i++)
        fprintf(f, "%c,%u,%u,%u,%llu,%llu,%llu\n", (char)r[i].tag, r[i].block, r[i].smid, r[i].aux, r[i].start,
                r[i].ready, r[i].end);
    fclose(f);
    fprintf(stderr, "decode trace: %u block records to %s%s\n", n, path,
            head[0] > n ? " (the buffer filled: trace fewer steps)" : "");
    free(r);
}

static long decode_trace_env(const char* name, long fallback) {
    const char* v = getenv(name);
    if (!v) return fallback;
    char* end;
    const long x = strtol(v, &end, 10);
    if (*v == 0 || *end != 0 || x < 0) {
        fprintf(stderr, "error: %s=%s: expected a count (0 or more)\n", name, v);
        exit(2);
    }
    return x;
}

// Around each replay of the step's graph: before = 1 just before the launch, 0 just after.
static void decode_trace_replay(cudaStream_t s, int before) {
    static long replays = 0, first = -1, steps = 0;
    static const char* path = NULL;
    static KernelTraceBuffer* dev = NULL;
    if (first < 0) {
        path = getenv("GPT_TRACE_FILE");
        first = decode_trace_env("GPT_TRACE_FIRST", 100);
        steps = decode_trace_env("GPT_TRACE_STEPS", 3);
    }
    if (!path || steps == 0) return;
    if (before && replays == first) {
        const size_t bytes = sizeof(KernelTraceBuffer) + (size_t)DECODE_TRACE_CAPACITY * sizeof(KernelTraceRecord);
        CUDA_CHECK(cudaMalloc(&dev, bytes));
        const unsigned head[2] = {0, DECODE_TRACE_CAPACITY};
        CUDA_CHECK(cudaMemcpy(dev, head, sizeof(head), cudaMemcpyHostToDevice));
        decode_trace_arm_all(dev, s);
    }
    if (before) return;
    if (++replays == first + steps && dev) {
        decode_trace_arm_all(NULL, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        decode_trace_write(dev, path);
        CUDA_CHECK(cudaFree(dev));
        dev = NULL;
    }
}
#endif  // KERNEL_TRACE

#endif  // DECODE_TRACE_CUH
