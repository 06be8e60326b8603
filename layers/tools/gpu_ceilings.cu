// gpu_ceilings.cu: the two ceilings a profile of the training step is measured against, on this GPU
// now: a large bf16 GEMM through cuBLASLt (the matmul layer's own path: matmul.cuh, its algorithm
// timed as for the model) and a device-to-device copy. Prints one "name value" line each:
//   gemm_tflops   D (8192, 8192) = A (8192, 8192) · B (8192, 8192), bf16, fp32 accumulation: 2·8192³ / time
//   copy_gbs      cudaMemcpyAsync of 1 GiB, device to device: bytes read + bytes written / time
// Inputs are random (never zeros: zeros run faster), times are the median of repeated runs after a
// warm-up, taken with CUDA events. Used by scripts/profile_step.py; `build/gpu_ceilings` alone prints them.
#include "layers/cuda_common.h"
#include "layers/model/matmul.cuh"
#include "layers/tools/median_time.cuh"

#define CEIL_GEMM_SIZE 8192
#define CEIL_COPY_BYTES ((size_t)1 << 30)
#define CEIL_REPEATS 31

// x[i] = uniform in [-1, 1) from a hash of (i, seed), as bf16.
static __global__ void ceilings_fill_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
        x[i] = __float2bfloat16((float)(h >> 8) / 8388608.0f - 1.0f);
    }
}

typedef struct {
    MatmulContext* ctx;
    __nv_bfloat16 *a, *b, *d;
} GemmArg;

static void gemm_work(void* p, cudaStream_t) {
    GemmArg* g = (GemmArg*)p;  // d (N, OC) = b (N, IC) · a (OC, IC)ᵀ, all 8192
    matmul_forward(g->ctx, g->d, g->b, g->a, NULL, CEIL_GEMM_SIZE, CEIL_GEMM_SIZE, CEIL_GEMM_SIZE, NULL);
}

typedef struct {
    void *dst, *src;
} CopyArg;

static void copy_work(void* p, cudaStream_t stream) {
    CopyArg* c = (CopyArg*)p;
    CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, CEIL_COPY_BYTES, cudaMemcpyDeviceToDevice, stream));
}

int main(void) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s\n", prop.name);

    const size_t n = (size_t)CEIL_GEMM_SIZE * CEIL_GEMM_SIZE;
    GemmArg g;
    MatmulContext ctx;
    matmul_context_create(&ctx, stream);
    ctx.tune = 1;  // the fastest of cuBLASLt's candidates, as the trainer times them
    g.ctx = &ctx;
    CUDA_CHECK(cudaMalloc(&g.a, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&g.b, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&g.d, n * sizeof(__nv_bfloat16)));
    ceilings_fill_kernel<<<1024, 256, 0, stream>>>(g.a, n, 1u);
    ceilings_fill_kernel<<<1024, 256, 0, stream>>>(g.b, n, 2u);
    CUDA_CHECK(cudaGetLastError());
    const float gemm_ms = median_time_ms(gemm_work, &g, CEIL_REPEATS, stream);
    printf("gemm_tflops %.1f\n", 2.0 * CEIL_GEMM_SIZE * (double)n / (gemm_ms * 1e-3) / 1e12);
    CUDA_CHECK(cudaFree(g.a));
    CUDA_CHECK(cudaFree(g.b));
    CUDA_CHECK(cudaFree(g.d));
    matmul_context_destroy(&ctx);

    CopyArg c;
    CUDA_CHECK(cudaMalloc(&c.dst, CEIL_COPY_BYTES));
    CUDA_CHECK(cudaMalloc(&c.src, CEIL_COPY_BYTES));
    ceilings_fill_kernel<<<1024, 256, 0, stream>>>((__nv_bfloat16*)c.src, CEIL_COPY_BYTES / 2, 3u);
    CUDA_CHECK(cudaGetLastError());
    const float copy_ms = median_time_ms(copy_work, &c, CEIL_REPEATS, stream);
    printf("copy_gbs %.1f\n", 2.0 * CEIL_COPY_BYTES / (copy_ms * 1e-3) / 1e9);
    CUDA_CHECK(cudaFree(c.dst));
    CUDA_CHECK(cudaFree(c.src));
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
