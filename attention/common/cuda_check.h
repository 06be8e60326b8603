// cuda_check.h: checked CUDA and cuBLAS calls inside the attention library. The library depends on
// nothing else of the project, so it has its own checks; their hints speak of shapes and memory,
// not of any program's flags.
#ifndef ATTENTION_CUDA_CHECK_H
#define ATTENTION_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

// Exits with the file, line and CUDA's message when a CUDA runtime call fails.
static inline void attention_cuda_check(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "error: CUDA call failed at %s:%d: %s (%s)\n", file, line, cudaGetErrorString(err),
            cudaGetErrorName(err));
    if (err == cudaErrorMemoryAllocation)
        fprintf(stderr, "hint: the GPU is out of memory; use a smaller batch or sequence length\n");
    else if (err == cudaErrorNoKernelImageForDevice)
        fprintf(stderr, "hint: this binary has no code for this GPU; rebuild with GPU_ARCH set to its "
                        "compute capability, e.g. make GPU_ARCH=\"80 90a\"\n");
    exit(EXIT_FAILURE);
}
#define ATTN_CUDA_CHECK(call) attention_cuda_check((call), __FILE__, __LINE__)

// Exits with the file, line and cuBLAS's own name and description of the status when a cuBLAS call
// fails (only the naive backend calls cuBLAS).
static inline void attention_cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "error: cuBLAS call failed at %s:%d: %s (%s)\n", file, line, cublasGetStatusName(status),
            cublasGetStatusString(status));
    if (status == CUBLAS_STATUS_ALLOC_FAILED)
        fprintf(stderr, "hint: the GPU is out of memory; use a smaller batch or sequence length\n");
    exit(EXIT_FAILURE);
}
#define ATTN_CUBLAS_CHECK(call) attention_cublas_check((call), __FILE__, __LINE__)

#endif  // ATTENTION_CUDA_CHECK_H
