// median_time.cuh: the median time of repeated runs of some GPU work, taken with CUDA events, for the
// tools that time kernels (gpu_ceilings, bench_fp8_gemm). The median, not the mean, so that one run
// slowed by something else on the machine does not move the result.
#ifndef MEDIAN_TIME_CUH
#define MEDIAN_TIME_CUH

#include <algorithm>

#include "layers/cuda_common.h"

#define MEDIAN_TIME_MAX_REPEATS 1001

typedef void (*TimedWork)(void* arg, cudaStream_t stream);  // enqueues the work on stream

// Median milliseconds of one enqueue of work over `repeats` timed runs (1..MEDIAN_TIME_MAX_REPEATS),
// after one untimed warm-up run (which also makes start-up choices such as GEMM algorithms).
static float median_time_ms(TimedWork work, void* arg, int repeats, cudaStream_t stream) {
    static float ms[MEDIAN_TIME_MAX_REPEATS];
    if (repeats < 1 || repeats > MEDIAN_TIME_MAX_REPEATS) {
        fprintf(stderr, "median_time_ms: repeats %d is outside 1..%d\n", repeats, MEDIAN_TIME_MAX_REPEATS);
        exit(EXIT_FAILURE);
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    work(arg, stream);
    for (int r = 0; r < repeats; r++) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        work(arg, stream);
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms, ms + repeats);
    return ms[repeats / 2];
}

#endif  // MEDIAN_TIME_CUH
