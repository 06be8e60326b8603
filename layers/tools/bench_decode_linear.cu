// bench_decode_linear.cu: the linear layers of a decode step at 1 to 16 rows, through decode_linear
// (layers/generate/decode_linear.cuh) and through cuBLASLt (matmul.cuh, the path of more rows), against
// the copy rate of the same GPU: how close does each come to reading its weights at that rate?
//
//   build/bench_decode_linear [--model gpt2-124m|gpt3-1.3b|gpt3-2.7b|all] [--rows 1,4,16] [--repeats R]
//
// Per model (C channels, L layers) and row count M, every figure a median over R replays of a CUDA graph
// (the way a decode step runs them), with L layers' own weights, so the weights come from DRAM as in a
// step (L·12·C² bf16: hundreds of MB to GB, far more than L2):
//   qkv, proj, fc, fcproj  L products of one kind back to back: µs per product and its weight-read rate;
//   lm_head                the (Vp, C) product alone (Vp = 50304, 100-250 MB);
//   chain                  a step's linear part: per layer LN1 + qkv, proj + residual, LN2 + fc + GELU,
//                          fcproj + residual, L layers: ms per chain and the rate of all its weights.
// Paths: "ours" = decode_linear (the LayerNorms and the epilogues inside the products); "lt" =
// cuBLASLt with the trainer's epilogues and layernorm_forward before qkv and fc, with the heuristic's
// fixed choices as --generate makes them ("lt fixed", ctx.tune = 0) and with the fastest of its
// candidates per shape ("lt tuned", ctx.tune = 1). copy = a 1 GiB device-to-device copy, bytes read +
// written per second (the weight-read bound of a step is its weight bytes / this rate). Inputs are
// random; the rate column is ours; "ours/lt" is the speed ratio against the faster cuBLASLt.
#include <getopt.h>

#include "layers/cuda_common.h"
#include "layers/generate/decode_linear.cuh"
#include "layers/model/matmul.cuh"
#include "layers/tools/median_time.cuh"

#define BENCH_MAX_ROWS_LIST 8
#define BENCH_VP 50304

// Fills n bf16 with values uniform in ±scale from a hash of the index and seed.
static __global__ void bench_fill_kernel(__nv_bfloat16* p, size_t n, float scale, uint32_t seed) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16(scale * ((float)(h & 0xFFFFFF) / 8388608.0f - 1.0f));
}

static __nv_bfloat16* bench_alloc(size_t n, float scale, uint32_t seed) {
    __nv_bfloat16* p;
    CUDA_CHECK(cudaMalloc((void**)&p, n * sizeof(__nv_bfloat16)));
    bench_fill_kernel<<<(unsigned)layer_ceil_div(n, 256), 256>>>(p, n, scale, seed);
    CUDA_CHECK(cudaGetLastError());
    return p;
}

typedef struct {
    int C, L, M;
    __nv_bfloat16 *qkvw, *projw, *fcw, *fcprojw, *lmw;  // L layers each (lmw: one)
    __nv_bfloat16 *bias, *lnw, *lnb;                    // shared by every layer: 4C each
    __nv_bfloat16 *x, *r2, *ln, *qkv, *atty, *fch, *fch_gelu, *logits;
    MatmulContext* lt;  // NULL: decode_linear
    int kind;           // BENCH_* below
} BenchModel;

enum { BENCH_QKV, BENCH_PROJ, BENCH_FC, BENCH_FCPROJ, BENCH_LM_HEAD, BENCH_CHAIN, BENCH_KINDS };
static const char* const BENCH_NAMES[BENCH_KINDS] = {"qkv", "proj", "fc", "fcproj", "lm_head", "chain"};

// One product of `kind` for layer l, by the path b->lt says.
static void bench_product(const BenchModel* b, int kind, int l, cudaStream_t s) {
    const int C = b->C, M = b->M;
    const size_t lC2 = (size_t)l * C * C;
    DecodeLinearOps ops = {NULL, NULL, b->bias, NULL, 0, {}};
    if (kind == BENCH_QKV || kind == BENCH_FC) {
        ops.ln_w = b->lnw, ops.ln_b = b->lnb, ops.gelu = kind == BENCH_FC;
        const int OC = kind == BENCH_QKV ? 3 * C : 4 * C;
        __nv_bfloat16* w = (kind == BENCH_QKV ? b->qkvw : b->fcw) + lC2 * (OC / C);
        __nv_bfloat16* out = kind == BENCH_QKV ? b->qkv : b->fch_gelu;
        if (!b->lt) return decode_linear(out, kind == BENCH_QKV ? b->x : b->r2, w, &ops, M, C, OC, s);
        layernorm_forward(b->ln, NULL, NULL, kind == BENCH_QKV ? b->x : b->r2, b->lnw, b->lnb, M, C, s);
        return matmul_forward(b->lt, out, b->ln, w, b->bias, M, C, OC, kind == BENCH_FC ? b->fch : NULL);
    }
    if (kind == BENCH_LM_HEAD) {
        ops.bias = NULL;
        if (!b->lt) return decode_linear(b->logits, b->ln, b->lmw, &ops, M, C, BENCH_VP, s);
        return matmul_forward(b->lt, b->logits, b->ln, b->lmw, NULL, M, C, BENCH_VP, NULL);
    }
    const int IC = kind == BENCH_PROJ ? C : 4 * C;
    __nv_bfloat16* w = (kind == BENCH_PROJ ? b->projw : b->fcprojw) + lC2 * (IC / C);
    __nv_bfloat16 *in = kind == BENCH_PROJ ? b->atty : b->fch_gelu, *out = kind == BENCH_PROJ ? b->r2 : b->x;
    __nv_bfloat16* residual = kind == BENCH_PROJ ? b->x : b->r2;
    ops.residual = residual;
    if (!b->lt) return decode_linear(out, in, w, &ops, M, IC, C, s);
    matmul_forward_residual(b->lt, out, residual, in, w, b->bias, M, IC, C);
}

// The work one graph holds: L products of b->kind, the LM head once, or the L layers' chain.
static void bench_work(void* arg, cudaStream_t s) {
    const BenchModel* b = (const BenchModel*)arg;
    if (b->kind == BENCH_LM_HEAD) return bench_product(b, BENCH_LM_HEAD, 0, s);
    for (int l = 0; l < b->L; l++) {
        if (b->kind != BENCH_CHAIN) {
            bench_product(b, b->kind, l, s);
            continue;
        }
        for (int k = BENCH_QKV; k <= BENCH_FCPROJ; k++) bench_product(b, k, l, s);
    }
}

typedef struct {
    cudaGraphExec_t exec;
} BenchGraph;

static void bench_replay(void* arg, cudaStream_t s) { CUDA_CHECK(cudaGraphLaunch(((BenchGraph*)arg)->exec, s)); }

// Median ms of one replay of a graph of bench_work (run once uncaptured first: cuBLASLt's choices).
static float bench_graph_ms(BenchModel* b, int repeats, cudaStream_t s) {
    bench_work(b, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph;
    BenchGraph g;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    bench_work(b, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    const float ms = median_time_ms(bench_replay, &g, repeats, s);
    CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return ms;
}

// Bytes of weights one graph of `kind` reads.
static double bench_weight_bytes(const BenchModel* b, int kind) {
    const double C2 = (double)b->C * b->C * 2.0;
    const double per[BENCH_KINDS] = {3 * C2, C2, 4 * C2, 4 * C2, 0, 12 * C2};
    if (kind == BENCH_LM_HEAD) return (double)BENCH_VP * b->C * 2.0;
    return per[kind] * b->L;
}

static void bench_model_alloc(BenchModel* b, int C, int L) {
    memset(b, 0, sizeof(*b));
    b->C = C, b->L = L;
    const size_t C2 = (size_t)C * C, R = DECODE_LINEAR_MAX_ROWS;
    const float ws = 1.0f / sqrtf((float)C);
    b->qkvw = bench_alloc(L * 3 * C2, ws, 1), b->projw = bench_alloc(L * C2, ws, 2);
    b->fcw = bench_alloc(L * 4 * C2, ws, 3), b->fcprojw = bench_alloc(L * 4 * C2, ws / 2, 4);
    b->lmw = bench_alloc((size_t)BENCH_VP * C, ws, 5);
    b->bias = bench_alloc(4 * C, 0.1f, 6), b->lnw = bench_alloc(4 * C, 1.0f, 7), b->lnb = bench_alloc(4 * C, 0.1f, 8);
    b->x = bench_alloc(R * C, 1.0f, 9), b->r2 = bench_alloc(R * C, 1.0f, 10), b->ln = bench_alloc(R * C, 1.0f, 11);
    b->qkv = bench_alloc(R * 3 * C, 1.0f, 12), b->atty = bench_alloc(R * C, 1.0f, 13);
    b->fch = bench_alloc(R * 4 * C, 1.0f, 14), b->fch_gelu = bench_alloc(R * 4 * C, 1.0f, 15);
    b->logits = bench_alloc(R * BENCH_VP, 1.0f, 16);
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void bench_model_free(BenchModel* b) {
    __nv_bfloat16* all[] = {b->qkvw, b->projw, b->fcw, b->fcprojw, b->lmw, b->bias, b->lnw, b->lnb, b->x, b->r2,
                            b->ln, b->qkv, b->atty, b->fch, b->fch_gelu, b->logits};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) CUDA_CHECK(cudaFree(all[i]));
}

// One table row per kind at M rows: ours, lt fixed, lt tuned (ms), ours' rate and share of the copy rate.
static void bench_rows(BenchModel* b, const char* name, int M, double copy_gbps, int repeats, MatmulContext* fixed,
                       MatmulContext* tuned, cudaStream_t s) {
    b->M = M;
    for (int kind = 0; kind < BENCH_KINDS; kind++) {
        float ms[3];
        MatmulContext* paths[3] = {NULL, fixed, tuned};
        b->kind = kind;
        for (int p = 0; p < 3; p++) b->lt = paths[p], ms[p] = bench_graph_ms(b, repeats, s);
        const double per = kind == BENCH_LM_HEAD || kind == BENCH_CHAIN ? 1.0 : (double)b->L;
        const double gbps = bench_weight_bytes(b, kind) / (ms[0] * 1e-3) / 1e9;
        const float best_lt = ms[1] < ms[2] ? ms[1] : ms[2];
        printf("%-10s %3d %-8s %10.2f %10.2f %10.2f %9.0f %8.1f%% %8.2f\n", name, M, BENCH_NAMES[kind],
               1e3 * ms[0] / per, 1e3 * ms[1] / per, 1e3 * ms[2] / per, gbps, 100.0 * gbps / copy_gbps,
               best_lt / ms[0]);
    }
}

static void bench_copy_free(void* arg, cudaStream_t s) {
    void** p = (void**)arg;
    CUDA_CHECK(cudaMemcpyAsync(p[0], p[1], (size_t)1 << 30, cudaMemcpyDeviceToDevice, s));
}

// GB/s of a 1 GiB device-to-device copy, bytes read + written.
static double bench_copy_gbps(int repeats, cudaStream_t s) {
    void* p[2];
    CUDA_CHECK(cudaMalloc(&p[0], (size_t)1 << 30));
    CUDA_CHECK(cudaMalloc(&p[1], (size_t)1 << 30));
    const float ms = median_time_ms(bench_copy_free, p, repeats, s);
    CUDA_CHECK(cudaFree(p[0]));
    CUDA_CHECK(cudaFree(p[1]));
    return 2.0 * (double)((size_t)1 << 30) / (ms * 1e-3) / 1e9;
}

static void usage_exit(const char* prog, int code) {
    fprintf(code ? stderr : stdout, "usage: %s [--model gpt2-124m|gpt3-1.3b|gpt3-2.7b|all] [--rows 1,4,16] "
            "[--repeats R (1..%d, default 30)]\n(the decode step's linear layers at few rows: decode_linear "
            "against cuBLASLt and the copy rate; see the top of layers/tools/bench_decode_linear.cu)\n",
            prog, MEDIAN_TIME_MAX_REPEATS);
    exit(code);
}

// "1,4,16" → rows[], each 1..16; returns the count (0 on a bad list).
static int parse_rows(const char* s, int* rows) {
    int n = 0;
    for (char* end; *s && n < BENCH_MAX_ROWS_LIST; s = *end == ',' ? end + 1 : end) {
        const long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > DECODE_LINEAR_MAX_ROWS || (*end && *end != ',')) return 0;
        rows[n++] = (int)v;
    }
    return *s ? 0 : n;
}

int main(int argc, char** argv) {
    const char* model = "gpt3-1.3b";
    int rows[BENCH_MAX_ROWS_LIST] = {1, 4, 16}, num_rows = 3, repeats = 30;
    const struct option options[] = {{"model", required_argument, NULL, 'm'}, {"rows", required_argument, NULL, 'r'},
                                     {"repeats", required_argument, NULL, 'n'}, {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
    for (int o; (o = getopt_long(argc, argv, "h", options, NULL)) != -1;) {
        switch (o) {
            case 'm': model = optarg; break;
            case 'r': num_rows = parse_rows(optarg, rows); break;
            case 'n': repeats = atoi(optarg); break;
            case 'h': usage_exit(argv[0], 0); break;
            default: usage_exit(argv[0], 2);
        }
    }
    const char* names[3] = {"gpt2-124m", "gpt3-1.3b", "gpt3-2.7b"};
    const int Cs[3] = {768, 2048, 2560}, Ls[3] = {12, 24, 32};
    int chosen = -1;
    for (int i = 0; i < 3; i++) chosen = strcmp(model, names[i]) == 0 ? i : chosen;
    if ((chosen < 0 && strcmp(model, "all") != 0) || optind != argc || num_rows == 0 || repeats < 1 ||
        repeats > MEDIAN_TIME_MAX_REPEATS)
        usage_exit(argv[0], 2);
    const GpuInfo gpu = gpu_info(0);
    if (!gpu.found) {
        fprintf(stderr, "error: bench_decode_linear needs a CUDA GPU\n");
        return 1;
    }
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    MatmulContext fixed, tuned;
    matmul_context_create(&fixed, s);
    matmul_context_create(&tuned, s);
    tuned.tune = 1;
    const double copy = bench_copy_gbps(repeats, s);
    printf("device %s, %d SMs; copy rate %.0f GB/s (1 GiB device-to-device, read + written); median of %d replays\n",
           gpu.name, gpu.num_sms, copy, repeats);
    printf("%-10s %3s %-8s %10s %10s %10s %9s %9s %8s\n", "model", "M", "product", "ours us", "lt fixed", "lt tuned",
           "ours GB/s", "of copy", "ours/lt");
    for (int i = 0; i < 3; i++) {
        if (chosen >= 0 && i != chosen) continue;
        BenchModel b;
        bench_model_alloc(&b, Cs[i], Ls[i]);
        for (int r = 0; r < num_rows; r++) bench_rows(&b, names[i], rows[r], copy, repeats, &fixed, &tuned, s);
        bench_model_free(&b);
    }
    matmul_context_destroy(&fixed);
    matmul_context_destroy(&tuned);
    CUDA_CHECK(cudaStreamDestroy(s));
    return 0;
}
