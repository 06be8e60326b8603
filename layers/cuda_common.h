// cuda_common.h: checked CUDA calls and the facts about the GPU that the trainer reports.
#ifndef CUDA_COMMON_H
#define CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

// Exits with the file, line and CUDA's message when a CUDA runtime call fails.
static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "error: CUDA call failed at %s:%d: %s (%s)\n", file, line, cudaGetErrorString(err),
            cudaGetErrorName(err));
    if (err == cudaErrorMemoryAllocation)
        fprintf(stderr, "hint: the GPU is out of memory; lower --batch-size or --seq-len, or use a smaller model\n");
    else if (err == cudaErrorNoKernelImageForDevice)
        fprintf(stderr, "hint: this binary has no code for this GPU; rebuild with GPU_ARCH set to its "
                        "compute capability, e.g. make GPU_ARCH=\"80 90a\"\n");
    exit(EXIT_FAILURE);
}
#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__)

typedef struct {
    int found;              // 0 when no usable CUDA device (no GPU or no driver)
    char name[256];
    int major, minor;       // compute capability
    int num_sms;
    size_t total_bytes, free_bytes;
} GpuInfo;

// Describes device `device`; found = 0 (and no exit) when CUDA reports no usable device.
static inline GpuInfo gpu_info(int device) {
    GpuInfo info = {};
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device) {
        cudaGetLastError();  // clear the sticky "no device" error
        return info;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    info.found = 1;
    snprintf(info.name, sizeof(info.name), "%s", prop.name);
    info.major = prop.major;
    info.minor = prop.minor;
    info.num_sms = prop.multiProcessorCount;
    return info;
}

#endif  // CUDA_COMMON_H
