// dev probe (2026-11-27): joules per call of the MLP's GELU GEMM paths at the power limit. The
// paths are the trainer's own (matmul_backward_dinp and matmul_forward of layers/matmul.cuh with
// the 2026-11-27_h100_dgelu_gemm_epilogue_warps.patch applied, which adds the Hopper dGELU GEMM v7).
// Backward, fcproj dinp (N 16384, IC 8192, OC 2048):
//   lt       cuBLASLt DGELU epilogue + the fc bias reduction kernel (the trainer's choice on main)
//   v7       the Hopper dGELU GEMM of our own with its bias partial sums + the finish kernel
//   unfused  cuBLASLt DEFAULT GEMM + one kernel doing dGELU and the reduction
//   plain    cuBLASLt DEFAULT GEMM alone (no GELU, no bias: the floor)
// Forward, fc (N 16384, IC 2048, OC 8192):
//   f-lt     cuBLASLt GELU_AUX_BIAS epilogue (the trainer's choice on main)
//   f-unfused  BIAS GEMM writing the pre-activation + the GELU kernel
//   f-plain  BIAS GEMM alone (the floor)
// Each runs back to back for `window` seconds; NVML's energy counter and the CUDA events cover the
// last two thirds, with the SM clock sampled every 50 ms there. Rounds rotate the order. Two inputs:
// "wide" (dout uniform in ±1, as the v7 driver) and "narrow" (dout ±0.01, gelu_pre ±3: closer to a
// trained model's gradients).
// Usage: dgelu_energy_probe [window s] [rounds] [modes, e.g. lt,v7,plain] [datasets: 1 wide, 2 both]
// Build (in a tree with the patch): nvcc -std=c++17 -O3 -arch=sm_90a -I. -o dgelu_energy_probe \
//     scripts/results/2026-11-27_h100_dgelu_energy_probe.cu -lcublasLt -lcublas -ldl
#include <dlfcn.h>
#include <unistd.h>

#include "layers/matmul.cuh"

typedef int (*nvml_fn0)(void);
typedef int (*nvml_handle_fn)(unsigned, void**);
typedef int (*nvml_energy_fn)(void*, unsigned long long*);
typedef int (*nvml_clock_fn)(void*, int, unsigned*);
static nvml_energy_fn nvml_energy;
static nvml_clock_fn nvml_clock;
static void* nvml_dev;
static void nvml_open() {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return;
    ((nvml_fn0)dlsym(h, "nvmlInit_v2"))();
    ((nvml_handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2"))(0, &nvml_dev);
    nvml_energy = (nvml_energy_fn)dlsym(h, "nvmlDeviceGetTotalEnergyConsumption");
    nvml_clock = (nvml_clock_fn)dlsym(h, "nvmlDeviceGetClockInfo");
}
static unsigned long long energy_mj() { unsigned long long e = 0; if (nvml_energy) nvml_energy(nvml_dev, &e); return e; }
static unsigned sm_mhz() { unsigned c = 0; if (nvml_clock) nvml_clock(nvml_dev, 1, &c); return c; }

__global__ void fill_uniform(__nv_bfloat16* p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f * 2.0f - 1.0f) * scale);
    }
}

typedef struct { __nv_bfloat16 *dinp, *dout, *weight, *gelu_pre, *dbias; void* scratch; int N, IC, OC; } Problem;

#define NUM_MODES 7
static const char* MODES[NUM_MODES] = {"lt", "v7", "unfused", "plain", "f-lt", "f-unfused", "f-plain"};

// One call of `mode`. Backward (0-3): dinp (N, IC) = [GELU'(gelu_pre) ∘] dout (N, OC) · weight (OC, IC)
// [, dbias = column sums]. Forward (4-6), reusing the buffers: dinp (N, IC) = [GELU](dout (N, OC) ·
// weightᵀ + bias) with the pre-activation into gelu_pre.
static void call(MatmulContext* ctx, const Problem* p, int mode) {
    ctx->dgelu_hopper = mode == 1 ? 1 : 0;
    ctx->fusion = mode == 2 || mode == 5 ? MATMUL_FUSE_NONE : MATMUL_FUSE_AUTO;
    if (mode >= 4) {
        matmul_forward(ctx, p->dinp, p->dout, p->weight, p->dbias, p->N, p->OC, p->IC, mode == 6 ? NULL : p->gelu_pre);
        return;
    }
    matmul_backward_dinp(ctx, p->dinp, p->dout, p->weight, p->N, p->IC, p->OC, mode == 3 ? NULL : p->gelu_pre, 0,
                         p->scratch, mode == 3 ? NULL : p->dbias);
}

int main(int argc, char** argv) {
    const double window = argc > 1 ? atof(argv[1]) : 1.5;
    const int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int use[NUM_MODES] = {0};
    for (int m = 0; m < NUM_MODES; m++) {
        char key[32];
        snprintf(key, sizeof(key), ",%s,", MODES[m]);
        char list[256];
        snprintf(list, sizeof(list), ",%s,", argc > 3 ? argv[3] : "lt,v7,unfused,plain,f-lt,f-unfused,f-plain");
        use[m] = strstr(list, key) != NULL;
    }
    const int datasets = argc > 4 ? atoi(argv[4]) : 2;
    nvml_open();
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    MatmulContext ctx;
    matmul_context_create(&ctx, s);
    ctx.tune = 1;  // as train_gpt: algorithms (and the lt path against DGELU_BGRAD) timed once
    Problem p = {NULL, NULL, NULL, NULL, NULL, NULL, 16384, 8192, 2048};
    const size_t nic = (size_t)p.N * p.IC, noc = (size_t)p.N * p.OC;
    CUDA_CHECK(cudaMalloc(&p.dinp, nic * 2));
    CUDA_CHECK(cudaMalloc(&p.gelu_pre, nic * 2));
    CUDA_CHECK(cudaMalloc(&p.dout, noc * 2));
    CUDA_CHECK(cudaMalloc(&p.weight, (size_t)p.OC * p.IC * 2));
    CUDA_CHECK(cudaMalloc(&p.dbias, (size_t)p.IC * 2));
    CUDA_CHECK(cudaMalloc(&p.scratch, matmul_dbias_scratch_bytes(p.N, p.IC)));
    const double flops = 2.0 * p.N * p.IC * p.OC;
    for (int data = 0; data < datasets; data++) {
        fill_uniform<<<1024, 256, 0, s>>>(p.dout, noc, 11 + data, data == 0 ? 1.0f : 0.01f);
        fill_uniform<<<1024, 256, 0, s>>>(p.weight, (size_t)p.OC * p.IC, 12, 1.7f / sqrtf((float)p.OC));
        fill_uniform<<<1024, 256, 0, s>>>(p.gelu_pre, nic, 13, 3.0f);
        double ms_sum[NUM_MODES] = {0}, j_sum[NUM_MODES] = {0}, mhz_sum[NUM_MODES] = {0};
        for (int round = 0; round < rounds; round++) {
            for (int jj = 0; jj < NUM_MODES; jj++) {
                const int mode = (jj + round) % NUM_MODES;
                if (!use[mode]) continue;
                call(&ctx, &p, mode);  // the first call makes the choices
                CUDA_CHECK(cudaStreamSynchronize(s));
                CUDA_CHECK(cudaEventRecord(ctx.events[0], s));
                for (int i = 0; i < 5; i++) call(&ctx, &p, mode);
                CUDA_CHECK(cudaEventRecord(ctx.events[1], s));
                CUDA_CHECK(cudaEventSynchronize(ctx.events[1]));
                float est;
                CUDA_CHECK(cudaEventElapsedTime(&est, ctx.events[0], ctx.events[1]));
                const int warm = (int)(window / 3 * 1e3 / (est / 5)) + 1, runs = (int)(window * 2 / 3 * 1e3 / (est / 5)) + 1;
                for (int i = 0; i < warm; i++) call(&ctx, &p, mode);
                CUDA_CHECK(cudaStreamSynchronize(s));
                const unsigned long long e0 = energy_mj();
                CUDA_CHECK(cudaEventRecord(ctx.events[0], s));
                for (int i = 0; i < runs; i++) call(&ctx, &p, mode);
                CUDA_CHECK(cudaEventRecord(ctx.events[1], s));
                double clk_sum = 0;
                int clk_n = 0;
                while (cudaEventQuery(ctx.events[1]) == cudaErrorNotReady) {
                    clk_sum += sm_mhz(), clk_n++;
                    usleep(50000);
                }
                const double clk = clk_n ? clk_sum / clk_n : 0.0;
                CUDA_CHECK(cudaEventSynchronize(ctx.events[1]));
                const unsigned long long e1 = energy_mj();
                float ms;
                CUDA_CHECK(cudaEventElapsedTime(&ms, ctx.events[0], ctx.events[1]));
                ms_sum[mode] += ms / runs / rounds;
                j_sum[mode] += (e1 - e0) * 1e-3 / runs / rounds;
                mhz_sum[mode] += (double)clk / rounds;
                printf("  %s round %d %-8s %.4f ms/call %.1f mJ/call %.0f W %.0f MHz (%s; %s)\n", data ? "narrow" : "wide", round,
                       MODES[mode], ms / runs, (e1 - e0) / (double)runs, (e1 - e0) / (double)ms, clk,
                       mode >= 4 ? ctx.last_forward : ctx.last_dinp, mode == 3 || mode >= 4 ? "-" : ctx.last_dbias_pre);
                fflush(stdout);
            }
        }
        printf("%s inputs, means of %d rounds (N %d, IC %d, OC %d):\n", data ? "narrow" : "wide", rounds, p.N, p.IC, p.OC);
        for (int m = 0; m < NUM_MODES; m++)
            if (use[m] && use[m < 4 ? 3 : 6]) printf("  %-9s %.4f ms/call  %6.1f TFLOP/s  %6.1f mJ/call  (%.3fx its plain GEMM's joules)  %5.0f W  %4.0f MHz\n",
                   MODES[m], ms_sum[m], flops / (ms_sum[m] * 1e-3) / 1e12, j_sum[m] * 1e3, j_sum[m] / j_sum[m < 4 ? 3 : 6],
                   j_sum[m] / (ms_sum[m] * 1e-3), mhz_sum[m]);
        fflush(stdout);
    }
    return 0;
}
