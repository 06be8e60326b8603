// dependent_launch.cuh: programmatic dependent launch (Hopper, sm_90+), for the decoding kernels here
// and the decode step's linear layers (layers/generate/decode_linear.cuh).
//
// A kernel launched with launch_dependent may start while the stream's previous kernel still runs
// (once every block of that kernel has called allow_dependent_launch, or exited). Before it reads
// anything the previous kernel wrote, or writes anything it reads, it must call
// wait_for_prerequisite_grid, which returns once that kernel has finished and its writes are visible.
// Data that no kernel since the stream's last ordinary launch writes (weights) may be read before.
// Every kernel launched so must wait, so that the order holds across a chain of them. Before sm_90
// both device calls are no-ops and the launch is an ordinary one.
#ifndef ATTENTION_DEPENDENT_LAUNCH_CUH
#define ATTENTION_DEPENDENT_LAUNCH_CUH

#include <cuda_runtime.h>

static __device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void wait_for_prerequisite_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether the current device has programmatic dependent launch (compute capability 9.0 or newer).
static inline int device_has_pdl() {
    static int has = -1;
    if (has < 0) {
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
            return 0;
        has = major >= 9;
    }
    return has;
}

// kernel<<<grid, threads, smem, stream>>>(args...) as a programmatic dependent of the stream's
// previous kernel where the device has it. Returns the launch's error.
template <typename... Params, typename... Args>
static cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, int threads, size_t smem,
                                    cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = device_has_pdl() ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, args...);
}

#endif  // ATTENTION_DEPENDENT_LAUNCH_CUH
