// cuda_common.h: checked CUDA and cuBLAS calls and the facts about the GPU that the trainer reports.
#ifndef CUDA_COMMON_H
#define CUDA_COMMON_H

#include <cublas_v2.h>
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

// The float at `device`, after the work queued on `stream` (waits for the stream).
static inline float cuda_read_float(const float* device, cudaStream_t stream) {
    float value = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&value, device, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return value;
}

// cudaMalloc that, when the GPU is out of memory, says how much `what` needed, how much was free
// and `hint` (what to lower), then exits; other CUDA errors exit as CUDA_CHECK does.
static inline void cuda_malloc_or_explain(void** ptr, size_t bytes, const char* what, const char* hint) {
    cudaError_t err = cudaMalloc(ptr, bytes);
    if (err != cudaErrorMemoryAllocation) {
        cuda_check(err, __FILE__, __LINE__);
        return;
    }
    cudaGetLastError();  // clear it, so cudaMemGetInfo answers
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    fprintf(stderr, "error: out of GPU memory: %s need %.2f GiB, %.2f GiB of %.2f GiB are free\nhint: %s\n", what,
            bytes / GiB, free_bytes / GiB, total_bytes / GiB, hint);
    exit(EXIT_FAILURE);
}

// Exits with the file, line and cuBLAS's status when a cuBLAS call fails. The status names are
// spelled out here, so a file that includes this header without calling cuBLAS links without it.
static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    const char* name = "unknown status";
    const char* hint = "check the arguments of this call";
    switch (status) {
        case CUBLAS_STATUS_NOT_INITIALIZED:
            name = "CUBLAS_STATUS_NOT_INITIALIZED";
            hint = "the handle is not set up: call cublasCreate after the CUDA device is chosen, and check "
                   "that the CUDA driver works (nvidia-smi)";
            break;
        case CUBLAS_STATUS_ALLOC_FAILED:
            name = "CUBLAS_STATUS_ALLOC_FAILED";
            hint = "the GPU is out of memory; lower --batch-size or --seq-len, or use a smaller model";
            break;
        case CUBLAS_STATUS_INVALID_VALUE:
            name = "CUBLAS_STATUS_INVALID_VALUE";
            hint = "a size, leading dimension or stride passed to cuBLAS is invalid; this is a bug in the "
                   "caller, report it with the shapes you ran";
            break;
        case CUBLAS_STATUS_ARCH_MISMATCH:
            name = "CUBLAS_STATUS_ARCH_MISMATCH";
            hint = "this GPU lacks a feature the call needs (bf16 GEMMs need compute capability 8.0 or newer)";
            break;
        case CUBLAS_STATUS_MAPPING_ERROR:
            name = "CUBLAS_STATUS_MAPPING_ERROR";
            hint = "cuBLAS could not access GPU memory; check the pointers passed to this call";
            break;
        case CUBLAS_STATUS_EXECUTION_FAILED:
            name = "CUBLAS_STATUS_EXECUTION_FAILED";
            hint = "a GPU kernel failed; an earlier kernel may have corrupted memory: rerun under "
                   "compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1 to find the first failing kernel";
            break;
        case CUBLAS_STATUS_INTERNAL_ERROR:
            name = "CUBLAS_STATUS_INTERNAL_ERROR";
            hint = "cuBLAS failed internally, often after an earlier CUDA error; rerun with "
                   "CUDA_LAUNCH_BLOCKING=1 to find the first failing call";
            break;
        case CUBLAS_STATUS_NOT_SUPPORTED:
            name = "CUBLAS_STATUS_NOT_SUPPORTED";
            hint = "this combination of types, shapes or alignment is not supported by the installed cuBLAS; "
                   "report it with the shapes you ran and your CUDA version";
            break;
        case CUBLAS_STATUS_LICENSE_ERROR:
            name = "CUBLAS_STATUS_LICENSE_ERROR";
            break;
        default: break;
    }
    fprintf(stderr, "error: cuBLAS call failed at %s:%d: %s (%d)\n", file, line, name, (int)status);
    fprintf(stderr, "hint: %s\n", hint);
    exit(EXIT_FAILURE);
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__)

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
