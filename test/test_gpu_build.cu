// test_gpu_build.cu: the GPU build itself: a usable GPU is found, this binary carries code for
// it (the GPU_ARCH the Makefile compiled for), a kernel writes every element it should, and the
// host bf16 conversion that GPU tests build their inputs with matches the device's bit for bit.
// Every case is skipped when no GPU is found.
#include <cuda_bf16.h>

#include "layers/cuda_common.h"
#include "test/test_harness.h"

// out[i] = bits of bf16(in[i]), in (n) fp32, out (n) bf16 bit patterns.
__global__ void float_to_bf16_kernel(uint16_t* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16(in[i]));
}

static const char* CASES[] = {"gpu_is_sm80_or_newer", "kernel_image_runs_and_writes_every_element",
                              "host_bf16_rounding_matches_device"};

int main(void) {
    test_begin();
    test_plan((int)(sizeof(CASES) / sizeof(CASES[0])));
    GpuInfo gpu = gpu_info(0);
    if (!gpu.found) {
        for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) test_skip(CASES[i], "no CUDA GPU found");
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
    test_report(CASES[0], gpu.major >= 8, "compute capability %d.%d; the kernels need 8.0 or newer", gpu.major,
                gpu.minor);

    // An odd size, so the last block is partial; values span ties, subnormals, huge and tiny.
    const size_t n = 1000003;
    float* host_in = (float*)malloc(n * sizeof(float));
    uint16_t* host_out = (uint16_t*)malloc(n * sizeof(uint16_t));
    TestRng rng = {12345u};
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)test_rng_next(&rng);
        if ((bits & 0x7F800000u) == 0x7F800000u) bits &= 0xBFFFFFFFu;  // no NaN or Inf inputs
        if (i % 7 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;           // exact ties
        memcpy(&host_in[i], &bits, sizeof(bits));
    }
    float* dev_in;
    uint16_t* dev_out;
    CUDA_CHECK(cudaMalloc(&dev_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dev_out, n * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemcpy(dev_in, host_in, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dev_out, 0xFF, n * sizeof(uint16_t)));  // poison: 0xFFFF is a NaN no input makes
    const int threads = 256;
    float_to_bf16_kernel<<<(unsigned)((n + threads - 1) / threads), threads>>>(dev_out, dev_in, n);
    cudaError_t launch = cudaGetLastError();
    cudaError_t run = cudaDeviceSynchronize();
    if (launch != cudaSuccess || run != cudaSuccess) {
        test_fail(CASES[1], "kernel failed: %s (is GPU_ARCH missing sm_%d%d?)",
                  cudaGetErrorString(launch != cudaSuccess ? launch : run), gpu.major, gpu.minor);
        test_skip(CASES[2], "kernel did not run");
        return test_end();
    }
    CUDA_CHECK(cudaMemcpy(host_out, dev_out, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    size_t unwritten = 0, mismatched = 0, first_bad = n;
    for (size_t i = 0; i < n; i++) {
        if (host_out[i] == 0xFFFFu) unwritten++;
        if (host_out[i] != test_float_to_bf16(host_in[i])) {
            mismatched++;
            if (first_bad == n) first_bad = i;
        }
    }
    test_report(CASES[1], unwritten == 0, "%zu of %zu elements left unwritten", unwritten, n);
    test_report(CASES[2], mismatched == 0, "%zu of %zu differ; first at %zu: %a -> device 0x%04x, host 0x%04x",
                mismatched, n, first_bad, first_bad < n ? host_in[first_bad] : 0.0f,
                first_bad < n ? host_out[first_bad] : 0, first_bad < n ? test_float_to_bf16(host_in[first_bad]) : 0);
    CUDA_CHECK(cudaFree(dev_in));
    CUDA_CHECK(cudaFree(dev_out));
    free(host_in);
    free(host_out);
    return test_end();
}
