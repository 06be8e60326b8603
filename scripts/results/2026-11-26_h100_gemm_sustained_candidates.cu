// dev probe: the trainer's GEMM shapes (GPT3-1.3B, 16384 tokens), each of cuBLASLt's 8 heuristic
// candidates run back to back for a window long enough to reach the power limit: TFLOP/s over the
// window's last part, energy per TFLOP (NVML), SM clock; beside the short "burst" timing the trainer
// uses at start-up. Question: does the burst choice lose under sustained load (power-limited)?
#include <dlfcn.h>
#include <unistd.h>
#include "layers/matmul_lt.cuh"
typedef int (*nvml_fn0)(void);
typedef int (*nvml_handle_fn)(unsigned, void**);
typedef int (*nvml_energy_fn)(void*, unsigned long long*);
typedef int (*nvml_clock_fn)(void*, int, unsigned*);
typedef int (*nvml_power_fn)(void*, unsigned*);
static nvml_energy_fn nvml_energy; static nvml_clock_fn nvml_clock; static nvml_power_fn nvml_power; static void* nvml_dev;
static void nvml_open() {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("no NVML\n"); return; }
    ((nvml_fn0)dlsym(h, "nvmlInit_v2"))();
    ((nvml_handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2"))(0, &nvml_dev);
    nvml_energy = (nvml_energy_fn)dlsym(h, "nvmlDeviceGetTotalEnergyConsumption");
    nvml_clock = (nvml_clock_fn)dlsym(h, "nvmlDeviceGetClockInfo");
    nvml_power = (nvml_power_fn)dlsym(h, "nvmlDeviceGetPowerUsage");
}
static unsigned long long energy_mj() { unsigned long long e = 0; if (nvml_energy) nvml_energy(nvml_dev, &e); return e; }
static unsigned sm_mhz() { unsigned c = 0; if (nvml_clock) nvml_clock(nvml_dev, 1 /*NVML_CLOCK_SM*/, &c); return c; }
static unsigned power_mw() { unsigned p = 0; if (nvml_power) nvml_power(nvml_dev, &p); return p; }
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.2f);
    }
}
struct Role { const char* name; cublasOperation_t ta, tb; int64_t m, n, k; float beta; cublasLtEpilogue_t epi; };
int main(int argc, char** argv) {
    const double window_s = argc > 1 ? atof(argv[1]) : 0.8;  // per candidate; the first quarter not counted
    const int rounds = argc > 2 ? atoi(argv[2]) : 2;
    const char* only = argc > 3 ? argv[3] : NULL;  // run only the roles whose name contains this
    nvml_open();
    cudaStream_t s; CUDA_CHECK(cudaStreamCreate(&s));
    MatmulContext ctx; matmul_context_create(&ctx, s);
    size_t big = (size_t)16384 * 8192;
    __nv_bfloat16 *A, *B, *D, *AUX, *BIAS;
    CUDA_CHECK(cudaMalloc(&A, big * 2)); CUDA_CHECK(cudaMalloc(&B, big * 2)); CUDA_CHECK(cudaMalloc(&D, big * 2));
    CUDA_CHECK(cudaMalloc(&AUX, big * 2)); CUDA_CHECK(cudaMalloc(&BIAS, 65536 * 2));
    fill<<<1024, 256>>>(A, big, 1); fill<<<1024, 256>>>(B, big, 2); fill<<<1024, 256>>>(D, big, 3);
    fill<<<1024, 256>>>(AUX, big, 4); fill<<<64, 256>>>(BIAS, 65536, 5);
    CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t T = 16384, C = 2048;
    Role roles[] = {
        {"qkv fwd", CUBLAS_OP_T, CUBLAS_OP_N, 3 * C, T, C, 0, CUBLASLT_EPILOGUE_BIAS},
        {"fc fwd", CUBLAS_OP_T, CUBLAS_OP_N, 4 * C, T, C, 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS},
        {"fcproj fwd", CUBLAS_OP_T, CUBLAS_OP_N, C, T, 4 * C, 0, CUBLASLT_EPILOGUE_BIAS},
        {"fcproj dinp", CUBLAS_OP_N, CUBLAS_OP_N, 4 * C, T, C, 0, CUBLASLT_EPILOGUE_DGELU},
        {"fc dinp", CUBLAS_OP_N, CUBLAS_OP_N, C, T, 4 * C, 0, CUBLASLT_EPILOGUE_DEFAULT},
        {"qkv dinp", CUBLAS_OP_N, CUBLAS_OP_N, C, T, 3 * C, 0, CUBLASLT_EPILOGUE_DEFAULT},
        {"fc dweight", CUBLAS_OP_N, CUBLAS_OP_T, C, 4 * C, T, 1, CUBLASLT_EPILOGUE_DEFAULT},
        {"fcproj dweight", CUBLAS_OP_N, CUBLAS_OP_T, 4 * C, C, T, 1, CUBLASLT_EPILOGUE_DEFAULT},
        {"qkv dweight", CUBLAS_OP_N, CUBLAS_OP_T, C, 3 * C, T, 1, CUBLASLT_EPILOGUE_DEFAULT},
        // the two GELU-epilogue GEMMs' shapes without the GELU: what a fused epilogue costs them
        {"fc fwd plain", CUBLAS_OP_T, CUBLAS_OP_N, 4 * C, T, C, 0, CUBLASLT_EPILOGUE_BIAS},
        {"fcproj dinp plain", CUBLAS_OP_N, CUBLAS_OP_N, 4 * C, T, C, 0, CUBLASLT_EPILOGUE_DEFAULT},
    };
    const int R = sizeof(roles) / sizeof(roles[0]);
    printf("window %.2f s per candidate, %d rounds; GPU power now %.0f W, SM %u MHz\n", window_s, rounds, power_mw() / 1e3, sm_mhz());
    for (int r = 0; r < R; r++) {
        Role& ro = roles[r];
        if (only && !strstr(ro.name, only) && !strstr(only, ro.name)) continue;
        MatmulLtGemm g = matmul_lt_plain(ro.name, ro.ta, ro.tb, ro.m, ro.n, ro.k, A, ro.ta == CUBLAS_OP_N ? ro.m : ro.k,
                                         B, ro.tb == CUBLAS_OP_N ? ro.k : ro.n, D, ro.m, ro.beta);
        g.epilogue = ro.epi;
        if (ro.epi == CUBLASLT_EPILOGUE_BIAS || ro.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) g.bias = BIAS;
        if (ro.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || ro.epi == CUBLASLT_EPILOGUE_DGELU) g.aux = AUX, g.aux_ld = ro.m;
        MatmulLtDescs x; matmul_lt_descs_create(&g, &x);
        cublasLtMatmulHeuristicResult_t res[MATMUL_TUNE_CANDIDATES];
        const int count = matmul_lt_heuristic(&ctx, &g, &x, res, MATMUL_TUNE_CANDIDATES);
        float burst[MATMUL_TUNE_CANDIDATES];
        const int pick = matmul_lt_tune(&ctx, &g, &x, res, count, burst);  // the trainer's start-up choice
        const double flops = 2.0 * ro.m * ro.n * ro.k;
        double tf[MATMUL_TUNE_CANDIDATES] = {0}, jpt[MATMUL_TUNE_CANDIDATES] = {0}, mhz[MATMUL_TUNE_CANDIDATES] = {0};
        for (int round = 0; round < rounds; round++)
            for (int jj = 0; jj < count; jj++) {
                const int j = round % 2 ? count - 1 - jj : jj;  // alternate the order between rounds
                const double est_ms = burst[j] > 0 ? burst[j] : 1.0;
                const int warm = (int)(window_s * 0.25e3 / est_ms) + 1, runs = (int)(window_s * 0.75e3 / est_ms) + 1;
                for (int i = 0; i < warm; i++) matmul_lt_launch(&ctx, &g, &x, &res[j].algo);
                CUDA_CHECK(cudaStreamSynchronize(s));
                unsigned long long e0 = energy_mj();
                CUDA_CHECK(cudaEventRecord(ctx.events[0], s));
                for (int i = 0; i < runs; i++) matmul_lt_launch(&ctx, &g, &x, &res[j].algo);
                CUDA_CHECK(cudaEventRecord(ctx.events[1], s));
                usleep((useconds_t)(window_s * 0.5e6));
                const unsigned clk = sm_mhz();
                CUDA_CHECK(cudaEventSynchronize(ctx.events[1]));
                unsigned long long e1 = energy_mj();
                float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, ctx.events[0], ctx.events[1]));
                tf[j] += flops * runs / (ms * 1e-3) / 1e12 / rounds;
                jpt[j] += (e1 - e0) * 1e-3 / (flops * runs / 1e12) / rounds;
                mhz[j] += (double)clk / rounds;
            }
        int best = 0;
        for (int j = 1; j < count; j++) if (tf[j] > tf[best]) best = j;
        printf("%-15s m %5lld n %5lld k %5lld %s: start-up pick #%d, sustained best #%d (%+.1f%% over the pick)\n", ro.name,
               (long long)ro.m, (long long)ro.n, (long long)ro.k, matmul_epilogue_name(ro.epi), pick, best, 100.0 * (tf[best] / tf[pick] - 1));
        for (int j = 0; j < count; j++) {
            char d[128]; matmul_algo_describe(&res[j].algo, d, sizeof(d));
            printf("  %c%c #%d burst %6.1f  sustained %6.1f TFLOP/s  %5.3f J/TFLOP  %4.0f MHz  %s\n", j == pick ? 'P' : ' ', j == best ? 'S' : ' ',
                   j, burst[j] > 0 ? flops / (burst[j] * 1e-3) / 1e12 : 0.0, tf[j], jpt[j], mhz[j], d);
        }
        fflush(stdout);
        matmul_lt_descs_destroy(&x);
    }
    return 0;
}
