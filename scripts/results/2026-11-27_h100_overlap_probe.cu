// dev probe: does a memory-bound pass run beside a GEMM on a second stream cost less than after it,
// with the GPU at its power limit? GPT3-1.3B shapes (16384 tokens, C 2048), each sequence repeated
// for a window long enough to reach 700 W, alternating order between rounds.
//   A: the MLP backward's dGELU: fcproj dinp GEMM, dGELU, fc bias sums, fcproj dweight GEMM
//      A0 DGELU epilogue -> reduction over dinp -> dweight           (the trainer's path)
//      A1 plain GEMM -> dGELU+reduction pass -> dweight              (serial, unfused)
//      A2 plain GEMM -> dweight || dGELU+reduction on a side stream  (SM target for the GEMM)
//      A3 DGELU epilogue -> dweight || reduction on a side stream
//   B: a LayerNorm-sized pass (reads 2 x 67 MB, writes 67 MB) beside the fc dweight GEMM
//      B0 serial, B1 concurrent (SM target)
// nvcc -O2 -arch=sm_90a -std=c++17 -I. -lcublasLt -ldl
#include <dlfcn.h>
#include <unistd.h>
#include "layers/matmul.cuh"
typedef int (*nvml_fn0)(void);
typedef int (*nvml_handle_fn)(unsigned, void**);
typedef int (*nvml_clock_fn)(void*, int, unsigned*);
typedef int (*nvml_power_fn)(void*, unsigned*);
static nvml_clock_fn nvml_clock; static nvml_power_fn nvml_power; static void* nvml_dev;
static void nvml_open() {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("no NVML\n"); return; }
    ((nvml_fn0)dlsym(h, "nvmlInit_v2"))();
    ((nvml_handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2"))(0, &nvml_dev);
    nvml_clock = (nvml_clock_fn)dlsym(h, "nvmlDeviceGetClockInfo");
    nvml_power = (nvml_power_fn)dlsym(h, "nvmlDeviceGetPowerUsage");
}
static unsigned sm_mhz() { unsigned c = 0; if (nvml_clock) nvml_clock(nvml_dev, 1, &c); return c; }
static unsigned power_mw() { unsigned p = 0; if (nvml_power) nvml_power(nvml_dev, &p); return p; }
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.2f);
    }
}

// One GEMM with its descriptors and the algorithm the trainer's start-up timing would pick.
struct Gemm { MatmulLtGemm g; MatmulLtDescs x; cublasLtMatmulAlgo_t algo; };
static void gemm_make(MatmulContext* ctx, Gemm* G, MatmulLtGemm g, int sm_target) {
    G->g = g;
    matmul_lt_descs_create(&G->g, &G->x);
    if (sm_target > 0) {
        int32_t t = sm_target;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(G->x.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &t, sizeof(t)));
    }
    cublasLtMatmulHeuristicResult_t res[MATMUL_TUNE_CANDIDATES];
    float ms[MATMUL_TUNE_CANDIDATES];
    const int count = matmul_lt_heuristic(ctx, &G->g, &G->x, res, MATMUL_TUNE_CANDIDATES);
    if (count == 0) { printf("no algorithm for %s\n", g.what); exit(1); }
    G->algo = res[matmul_lt_tune(ctx, &G->g, &G->x, res, count, ms)].algo;
}
static void gemm_run(MatmulContext* ctx, Gemm* G) { CUBLAS_CHECK(matmul_lt_launch(ctx, &G->g, &G->x, &G->algo)); }

struct Bufs {
    __nv_bfloat16 *dout, *w_proj, *dinp, *pre, *gelu, *dw_proj, *x_ln, *dw_fc, *dpre_c, *ln_a, *ln_b, *ln_out, *dbias;
    float *scratch1, *scratch2;
};
struct Probe {
    MatmulContext ctx;   // main stream
    MatmulContext side;  // side stream (kernels only)
    cudaEvent_t fork, join;
    Gemm dgelu, plain, dweight, dweight_t[3], fc_dweight, fc_dweight_t[3];
    Bufs b;
};
static const int T = 16384, C = 2048;

static void pass_reduce(MatmulContext* c, Bufs& b, int with_dgelu) {
    MatmulDbiasPass a = {b.scratch1, b.dinp, with_dgelu ? b.pre : NULL, with_dgelu ? b.dinp : NULL, T, 4 * C, 4 * C, NULL};
    matmul_dbias_both_passes(c, b.dbias, &a, 0);
}
static void pass_ln_sized(MatmulContext* c, Bufs& b) {  // reads ln_a, ln_b (N, C), writes ln_out
    MatmulDbiasPass a = {b.scratch2, b.ln_a, b.ln_b, b.ln_out, T, C, C, NULL};
    matmul_dbias_both_passes(c, b.dbias + 8192, &a, 0);
}
static void fork_side(Probe& P) {
    CUDA_CHECK(cudaEventRecord(P.fork, P.ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(P.side.stream, P.fork, 0));
}
static void join_side(Probe& P) {
    CUDA_CHECK(cudaEventRecord(P.join, P.side.stream));
    CUDA_CHECK(cudaStreamWaitEvent(P.ctx.stream, P.join, 0));
}

// variant v, one iteration
static void run_variant(Probe& P, int v) {
    Bufs& b = P.b;
    switch (v) {
    case 0: gemm_run(&P.ctx, &P.dgelu); pass_reduce(&P.ctx, b, 0); gemm_run(&P.ctx, &P.dweight); break;
    case 1: gemm_run(&P.ctx, &P.plain); pass_reduce(&P.ctx, b, 1); gemm_run(&P.ctx, &P.dweight); break;
    case 2: case 3: case 4: {
        gemm_run(&P.ctx, &P.plain);
        fork_side(P);
        pass_reduce(&P.side, b, 1);
        gemm_run(&P.ctx, v == 2 ? &P.dweight : &P.dweight_t[v - 2]);
        join_side(P);
        break;
    }
    case 5: case 6: {
        gemm_run(&P.ctx, &P.dgelu);
        fork_side(P);
        pass_reduce(&P.side, b, 0);
        gemm_run(&P.ctx, v == 5 ? &P.dweight : &P.dweight_t[1]);
        join_side(P);
        break;
    }
    case 7: gemm_run(&P.ctx, &P.fc_dweight); pass_ln_sized(&P.ctx, b); break;
    case 8: case 9: case 10: {
        fork_side(P);
        pass_ln_sized(&P.side, b);
        gemm_run(&P.ctx, v == 8 ? &P.fc_dweight : &P.fc_dweight_t[v - 8]);
        join_side(P);
        break;
    }
    case 11: gemm_run(&P.ctx, &P.dweight); break;     // the parts alone, for reference
    case 12: pass_reduce(&P.ctx, b, 0); break;
    case 13: pass_reduce(&P.ctx, b, 1); break;
    case 14: gemm_run(&P.ctx, &P.fc_dweight); break;
    case 15: pass_ln_sized(&P.ctx, b); break;
    case 16: gemm_run(&P.ctx, &P.dgelu); break;
    case 17: gemm_run(&P.ctx, &P.plain); break;
    }
}
static const char* names[] = {
    "A0 DGELU -> reduce -> dweight (trainer)", "A1 plain -> dGELU+reduce -> dweight", "A2 plain -> dweight || dGELU+reduce",
    "A2 same, dweight SM target 124", "A2 same, dweight SM target 116", "A3 DGELU -> dweight || reduce",
    "A3 same, dweight SM target 124", "B0 fc dweight -> LN-sized pass", "B1 fc dweight || LN-sized pass",
    "B1 same, SM target 124", "B1 same, SM target 116", "   fcproj dweight alone", "   reduce over dinp alone",
    "   dGELU+reduce alone", "   fc dweight alone", "   LN-sized pass alone", "   DGELU GEMM alone", "   plain GEMM alone"};
static const int NV = sizeof(names) / sizeof(names[0]);

int main(int argc, char** argv) {
    const double window_s = argc > 1 ? atof(argv[1]) : 1.0;
    const int rounds = argc > 2 ? atoi(argv[2]) : 2;
    nvml_open();
    Probe P;
    cudaStream_t s, s2;
    int lo, hi;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
    matmul_context_create(&P.ctx, s);
    P.side = P.ctx;
    P.side.stream = s2;
    CUDA_CHECK(cudaEventCreateWithFlags(&P.fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&P.join, cudaEventDisableTiming));
    Bufs& b = P.b;
    const size_t NC = (size_t)T * C, N4C = (size_t)T * 4 * C, W = (size_t)4 * C * C;
    __nv_bfloat16** bf[] = {&b.dout, &b.w_proj, &b.dinp, &b.pre, &b.gelu, &b.dw_proj, &b.x_ln, &b.dw_fc, &b.dpre_c,
                            &b.ln_a, &b.ln_b, &b.ln_out, &b.dbias};
    size_t sizes[] = {NC, W, N4C, N4C, N4C, W, NC, W, N4C, NC, NC, NC, 65536};
    for (int i = 0; i < 13; i++) {
        CUDA_CHECK(cudaMalloc(bf[i], sizes[i] * 2));
        fill<<<1024, 256>>>(*bf[i], sizes[i], 11 + i);
    }
    CUDA_CHECK(cudaMalloc(&b.scratch1, matmul_dbias_scratch_bytes(T, 4 * C)));
    CUDA_CHECK(cudaMalloc(&b.scratch2, matmul_dbias_scratch_bytes(T, 4 * C)));
    CUDA_CHECK(cudaDeviceSynchronize());
    // fcproj: IC 4C, OC C. dinp (IC, N)ᶜ = weight (IC, OC)ᶜ · dout (OC, N)ᶜ
    MatmulLtGemm g = matmul_lt_plain("fcproj dinp", CUBLAS_OP_N, CUBLAS_OP_N, 4 * C, T, C, b.w_proj, 4 * C, b.dout, C,
                                     b.dinp, 4 * C, 0.0f);
    gemm_make(&P.ctx, &P.plain, g, 0);
    g.epilogue = CUBLASLT_EPILOGUE_DGELU, g.aux = b.pre, g.aux_ld = 4 * C;
    gemm_make(&P.ctx, &P.dgelu, g, 0);
    // fcproj dweight (IC, OC)ᶜ += inp (IC, N)ᶜ · dout (N, OC): m 4C, n C, k N, beta 1
    g = matmul_lt_plain("fcproj dweight", CUBLAS_OP_N, CUBLAS_OP_T, 4 * C, C, T, b.gelu, 4 * C, b.dout, C, b.dw_proj,
                        4 * C, 1.0f);
    gemm_make(&P.ctx, &P.dweight, g, 0);
    gemm_make(&P.ctx, &P.dweight_t[1], g, 124);
    gemm_make(&P.ctx, &P.dweight_t[2], g, 116);
    // fc dweight: IC C, OC 4C: m C, n 4C, k N, A = ln out (C, N)ᶜ, B = dpre (4C, N)ᶜ op T
    g = matmul_lt_plain("fc dweight", CUBLAS_OP_N, CUBLAS_OP_T, C, 4 * C, T, b.x_ln, C, b.dpre_c, 4 * C, b.dw_fc, C, 1.0f);
    gemm_make(&P.ctx, &P.fc_dweight, g, 0);
    gemm_make(&P.ctx, &P.fc_dweight_t[1], g, 124);
    gemm_make(&P.ctx, &P.fc_dweight_t[2], g, 116);
    CUDA_CHECK(cudaDeviceSynchronize());

    // a first estimate of each variant's time (10 runs)
    double est[NV];
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0)); CUDA_CHECK(cudaEventCreate(&e1));
    for (int v = 0; v < NV; v++) {
        run_variant(P, v);
        CUDA_CHECK(cudaEventRecord(e0, s));
        for (int i = 0; i < 10; i++) run_variant(P, v);
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        est[v] = ms / 10;
    }
    double sum_ms[NV] = {0}, sum_w[NV] = {0}, sum_mhz[NV] = {0};
    for (int round = 0; round < rounds; round++)
        for (int vv = 0; vv < NV; vv++) {
            const int v = round % 2 ? NV - 1 - vv : vv;
            const int warm = (int)(window_s * 0.25e3 / est[v]) + 1, runs = (int)(window_s * 0.75e3 / est[v]) + 1;
            for (int i = 0; i < warm; i++) run_variant(P, v);
            CUDA_CHECK(cudaEventRecord(e0, s));
            for (int i = 0; i < runs; i++) run_variant(P, v);
            CUDA_CHECK(cudaEventRecord(e1, s));
            usleep((useconds_t)(window_s * 0.6e6));
            const unsigned mw = power_mw(), clk = sm_mhz();
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            sum_ms[v] += ms / runs / rounds;
            sum_w[v] += mw / 1e3 / rounds;
            sum_mhz[v] += (double)clk / rounds;
        }
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("sustained, %.2f s per window, %d rounds (ms per iteration; burst = 10 runs from cold)\n", window_s, rounds);
    for (int v = 0; v < NV; v++)
        printf("  %-44s %7.4f ms  (burst %7.4f)  %4.0f W  %4.0f MHz\n", names[v], sum_ms[v], est[v], sum_w[v], sum_mhz[v]);
    return 0;
}
