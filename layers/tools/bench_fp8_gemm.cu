// bench_fp8_gemm.cu: what FP8 could gain in the linear layers on this GPU now. For each linear
// layer of a transformer block of GPT3-1.3B (C = 2048) and GPT3-2.7B (C = 2560), at N tokens
// (default 8 · 2048 = 16384), it times the layer's three GEMMs in bf16 (matmul.cuh, the trainer's
// own path) and in FP8 (matmul_fp8.cuh), and the casts the FP8 path adds (fp8_cast.cuh):
//   forward  out (N, OC) = x (N, IC) · W (OC, IC)ᵀ          FP8: E4M3 × E4M3, fast accumulation (and without)
//   dinp     dinp (N, IC) = dy (N, OC) · W                  FP8: E5M2 dy × E4M3 Wᵀ copy
//   dweight  dW (OC, IC) += dyᵀ · x                         FP8: E5M2 dyᵀ copy × E4M3 xᵀ copy
//   casts    cast-transpose of x, W (E4M3) and dy (E5M2): bf16 read once, both FP8 layouts written
//            (4 bytes of traffic per element); the plain cast (3 bytes) and the amax pass of current
//            scaling (2 bytes) of x for comparison
// Layers (IC, OC): qkv (C, 3C), attention projection (C, C), fc (C, 4C), fc projection (4C, C).
// Each time is the median of --repeats timed runs (CUDA events around one call) after a warm-up;
// both paths first time cuBLASLt's best candidates for each shape (ctx.tune = 1), as the trainer
// does. Inputs are random (never zeros: zeros draw less power and run faster).
// The table gives ms, TFLOP/s (2·M·N·K / time) and the bf16/FP8 time ratio (> 1: FP8 is faster); a
// summary per block: the bf16 GEMMs, the FP8 GEMMs alone (the gain once every cast is fused into
// the kernel producing the tensor) and the FP8 GEMMs plus the three cast-transposes (the gain with
// separate cast kernels; W's cast is needed once per optimizer step, not per micro-batch).
// Usage: build/bench_fp8_gemm [--tokens N] [--repeats R] [--model gpt3-1.3b|gpt3-2.7b|all]
#include "layers/cuda_common.h"
#include "layers/model/fp8_cast.cuh"
#include "layers/model/fp8_scaling.cuh"
#include "layers/model/matmul.cuh"
#include "layers/model/matmul_fp8.cuh"
#include "layers/tools/median_time.cuh"


// x[i] = uniform in [-1, 1) · scale from a hash of (i, seed), as bf16.
static __global__ void bench_fill_kernel(__nv_bfloat16* x, size_t n, uint32_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
        x[i] = __float2bfloat16(scale * ((float)(h >> 8) / 8388608.0f - 1.0f));
    }
}

// One tensor of a layer: bf16, its FP8 copies in both layouts and its scale.
typedef struct {
    __nv_bfloat16* bf16;
    uint8_t *fp8, *fp8_t;
    Fp8Format format;
    Fp8ScaleState* state;  // device
} BenchTensor;

typedef struct {
    MatmulContext* ctx;
    cudaStream_t stream;
    int N, IC, OC;
    BenchTensor x, w, dy;
    __nv_bfloat16 *out, *dinp, *dw;
} Bench;

typedef enum {
    W_BF16_FWD, W_BF16_DINP, W_BF16_DWEIGHT,
    W_FP8_FWD_FAST, W_FP8_FWD, W_FP8_DINP, W_FP8_DWEIGHT,
    W_CT_X, W_CT_W, W_CT_DY, W_CAST_X, W_AMAX_X, NUM_WORK
} BenchWork;
static const char* WORK_NAMES[NUM_WORK] = {"forward",          "dinp",   "dweight", "forward fast-acc", "forward",
                                           "dinp",             "dweight", "cast-T x", "cast-T W",       "cast-T dy",
                                           "cast x (no T)",    "amax x"};

static Fp8Operand bench_op(const BenchTensor* t, int transposed) {
    return fp8_operand(transposed ? t->fp8_t : t->fp8, t->format, &t->state->scale_inv);
}

static void bench_cast_t(const Bench* b, const BenchTensor* t, int rows, int cols) {
    fp8_cast_transpose(t->fp8, t->fp8_t, t->bf16, rows, cols, t->format, &t->state->scale, &t->state->amax, b->stream);
}

static void bench_run(const Bench* b, BenchWork w) {
    MatmulContext* ctx = b->ctx;
    const int N = b->N, IC = b->IC, OC = b->OC;
    switch (w) {
        case W_BF16_FWD: matmul_forward(ctx, b->out, b->x.bf16, b->w.bf16, NULL, N, IC, OC, NULL); break;
        case W_BF16_DINP: matmul_backward_dinp(ctx, b->dinp, b->dy.bf16, b->w.bf16, N, IC, OC, NULL, 0, NULL, NULL); break;
        case W_BF16_DWEIGHT: matmul_backward_dweight(ctx, b->dw, NULL, b->dy.bf16, b->x.bf16, N, IC, OC, 1, NULL); break;
        case W_FP8_FWD_FAST: matmul_fp8_forward(ctx, b->out, bench_op(&b->x, 0), bench_op(&b->w, 0), NULL, N, IC, OC, 1); break;
        case W_FP8_FWD: matmul_fp8_forward(ctx, b->out, bench_op(&b->x, 0), bench_op(&b->w, 0), NULL, N, IC, OC, 0); break;
        case W_FP8_DINP: matmul_fp8_backward_dinp(ctx, b->dinp, bench_op(&b->dy, 0), bench_op(&b->w, 1), N, IC, OC); break;
        case W_FP8_DWEIGHT:
            matmul_fp8_backward_dweight(ctx, b->dw, bench_op(&b->dy, 1), bench_op(&b->x, 1), N, IC, OC, 1);
            break;
        case W_CT_X: bench_cast_t(b, &b->x, N, IC); break;
        case W_CT_W: bench_cast_t(b, &b->w, OC, IC); break;
        case W_CT_DY: bench_cast_t(b, &b->dy, N, OC); break;
        case W_CAST_X: fp8_cast(b->x.fp8, b->x.bf16, N, IC, FP8_E4M3, &b->x.state->scale, &b->x.state->amax, b->stream); break;
        case W_AMAX_X: fp8_amax(&b->x.state->amax, b->x.bf16, N, IC, b->stream); break;
        default: break;
    }
}

// One work item of a bench, as median_time_ms runs it (on the bench's stream).
typedef struct {
    const Bench* bench;
    BenchWork work;
} BenchItem;

static void bench_item_run(void* arg, cudaStream_t) {
    const BenchItem* item = (const BenchItem*)arg;
    bench_run(item->bench, item->work);
}

// Median ms of one call of w over `repeats` timed calls, after one warm-up call (which also makes
// the algorithm choices of a new shape).
static float bench_median_ms(const Bench* b, BenchWork w, int repeats) {
    BenchItem item = {b, w};
    return median_time_ms(bench_item_run, &item, repeats, b->stream);
}

// The GEMM's (M, N, K) as the table shows them: output rows × columns × reduction.
static void work_mnk(const Bench* b, BenchWork w, double mnk[3]) {
    const int dweight = w == W_BF16_DWEIGHT || w == W_FP8_DWEIGHT, dinp = w == W_BF16_DINP || w == W_FP8_DINP;
    mnk[0] = dweight ? b->OC : b->N;
    mnk[1] = dweight || dinp ? b->IC : b->OC;
    mnk[2] = dweight ? b->N : dinp ? b->OC : b->IC;
}

// Elements a cast-type work touches and the bytes per element it moves.
static void work_traffic(const Bench* b, BenchWork w, double* elems, double* bytes_per_elem) {
    *elems = w == W_CT_W ? (double)b->OC * b->IC : w == W_CT_DY ? (double)b->N * b->OC : (double)b->N * b->IC;
    *bytes_per_elem = w == W_CAST_X ? 3.0 : w == W_AMAX_X ? 2.0 : 4.0;
}

// Times every work of one layer, prints its rows and returns the times in ms.
static void bench_layer(const Bench* b, const char* model, const char* layer, int repeats, float t[NUM_WORK]) {
    for (int w = 0; w < NUM_WORK; w++) t[w] = bench_median_ms(b, (BenchWork)w, repeats);
    for (int g = 0; g < 3; g++) {  // bf16 forward/dinp/dweight beside their FP8 counterparts
        const BenchWork bw = (BenchWork)g, fw = g == 0 ? W_FP8_FWD_FAST : (BenchWork)(W_FP8_FWD + g);
        double mnk[3];
        work_mnk(b, bw, mnk);
        const double flop = 2.0 * mnk[0] * mnk[1] * mnk[2];
        printf("%-10s %-9s %-8s %6.0f %6.0f %6.0f  %8.3f %7.1f  %8.3f %7.1f  %5.2fx", model, layer, WORK_NAMES[bw],
               mnk[0], mnk[1], mnk[2], t[bw], flop / (t[bw] * 1e9), t[fw], flop / (t[fw] * 1e9), t[bw] / t[fw]);
        if (g == 0)
            printf("   (without fast accumulation: %.3f ms, %.2fx)", t[W_FP8_FWD], t[bw] / t[W_FP8_FWD]);
        printf("\n");
    }
    printf("%-10s %-9s casts:", model, layer);
    for (int w = W_CT_X; w <= W_AMAX_X; w++) {
        double elems, bpe;
        work_traffic(b, (BenchWork)w, &elems, &bpe);
        printf("  %s %.3f ms %.0f GB/s", WORK_NAMES[w], t[w], elems * bpe / (t[w] * 1e6));
    }
    printf("\n");
}

// Buffers for every layer of hidden size C at N tokens (the largest: 4C wide).
typedef struct {
    __nv_bfloat16 *x, *w, *dy, *out, *dinp, *dw;
    uint8_t *x8, *x8t, *w8, *w8t, *dy8, *dy8t;
    Fp8ScaleState* states;  // x, w, dy
} BenchBuffers;

static void* bench_alloc(size_t bytes) {
    void* p = NULL;
    cuda_malloc_or_explain(&p, bytes, "bench_fp8_gemm's buffers", "lower --tokens");
    return p;
}

static void buffers_create(BenchBuffers* m, int N, int C, cudaStream_t stream) {
    const size_t act = (size_t)N * 4 * C, wt = (size_t)4 * C * C;
    m->x = (__nv_bfloat16*)bench_alloc(act * 2), m->dy = (__nv_bfloat16*)bench_alloc(act * 2);
    m->out = (__nv_bfloat16*)bench_alloc(act * 2), m->dinp = (__nv_bfloat16*)bench_alloc(act * 2);
    m->w = (__nv_bfloat16*)bench_alloc(wt * 2), m->dw = (__nv_bfloat16*)bench_alloc(wt * 2);
    m->x8 = (uint8_t*)bench_alloc(act), m->x8t = (uint8_t*)bench_alloc(act);
    m->dy8 = (uint8_t*)bench_alloc(act), m->dy8t = (uint8_t*)bench_alloc(act);
    m->w8 = (uint8_t*)bench_alloc(wt), m->w8t = (uint8_t*)bench_alloc(wt);
    m->states = (Fp8ScaleState*)bench_alloc(3 * sizeof(Fp8ScaleState));
    const Fp8Format formats[3] = {FP8_E4M3, FP8_E4M3, FP8_E5M2};
    fp8_scale_states_init(m->states, formats, 3, stream);
    // activations ~ 1, weights ~ 0.02, gradients ~ 1e-3: the magnitudes of a trained GPT's
    bench_fill_kernel<<<1024, 256, 0, stream>>>(m->x, act, 1u, 1.0f);
    bench_fill_kernel<<<1024, 256, 0, stream>>>(m->dy, act, 2u, 1e-3f);
    bench_fill_kernel<<<1024, 256, 0, stream>>>(m->w, wt, 3u, 0.02f);
    bench_fill_kernel<<<1024, 256, 0, stream>>>(m->dw, wt, 4u, 1e-3f);
    CUDA_CHECK(cudaGetLastError());
}

static void buffers_destroy(BenchBuffers* m) {
    void* all[] = {m->x, m->w, m->dy, m->out, m->dinp, m->dw, m->x8, m->x8t, m->w8, m->w8t, m->dy8, m->dy8t, m->states};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) CUDA_CHECK(cudaFree(all[i]));
}

// The layer (IC, OC) on the buffers, its FP8 copies made with current scaling.
static Bench bench_layer_setup(MatmulContext* ctx, cudaStream_t stream, const BenchBuffers* m, int N, int IC, int OC) {
    Bench b;
    b.ctx = ctx, b.stream = stream, b.N = N, b.IC = IC, b.OC = OC;
    b.x = (BenchTensor){m->x, m->x8, m->x8t, FP8_E4M3, m->states};
    b.w = (BenchTensor){m->w, m->w8, m->w8t, FP8_E4M3, m->states + 1};
    b.dy = (BenchTensor){m->dy, m->dy8, m->dy8t, FP8_E5M2, m->states + 2};
    b.out = m->out, b.dinp = m->dinp, b.dw = m->dw;
    fp8_current_scale(b.x.state, b.x.bf16, N, IC, 0, 0, stream);
    fp8_current_scale(b.w.state, b.w.bf16, OC, IC, 0, 0, stream);
    fp8_current_scale(b.dy.state, b.dy.bf16, N, OC, 0, 0, stream);
    bench_cast_t(&b, &b.x, N, IC), bench_cast_t(&b, &b.w, OC, IC), bench_cast_t(&b, &b.dy, N, OC);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return b;
}

// The four linear layers of a block of hidden size C; prints the block's summary.
static void bench_model(const char* model, int C, int N, int repeats, MatmulContext* ctx, cudaStream_t stream) {
    static const char* names[4] = {"qkv", "attn-proj", "fc", "fc-proj"};
    const int ics[4] = {C, C, C, 4 * C}, ocs[4] = {3 * C, C, 4 * C, C};
    BenchBuffers m;
    buffers_create(&m, N, C, stream);
    double bf16 = 0.0, fp8 = 0.0, casts = 0.0;
    for (int l = 0; l < 4; l++) {
        const Bench b = bench_layer_setup(ctx, stream, &m, N, ics[l], ocs[l]);
        float t[NUM_WORK];
        bench_layer(&b, model, names[l], repeats, t);
        bf16 += t[W_BF16_FWD] + t[W_BF16_DINP] + t[W_BF16_DWEIGHT];
        fp8 += t[W_FP8_FWD_FAST] + t[W_FP8_DINP] + t[W_FP8_DWEIGHT];
        casts += t[W_CT_X] + t[W_CT_W] + t[W_CT_DY];
    }
    printf("%-10s block's linear layers: bf16 GEMMs %.3f ms; FP8 GEMMs %.3f ms (%.2fx); FP8 GEMMs + cast-transposes "
           "%.3f ms (%.2fx)\n\n",
           model, bf16, fp8, bf16 / fp8, fp8 + casts, bf16 / (fp8 + casts));
    buffers_destroy(&m);
}

static void usage_exit(const char* prog, int status) {
    fprintf(status ? stderr : stdout, "usage: %s [--tokens N (multiple of 16, default 16384)] [--repeats R (1..%d, default 50)] "
                    "[--model gpt3-1.3b|gpt3-2.7b|all]\n", prog, MEDIAN_TIME_MAX_REPEATS);
    exit(status);
}

int main(int argc, char** argv) {
    int N = 8 * 2048, repeats = 50;
    const char* model = "all";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) usage_exit(argv[0], 0);
        if (i + 1 >= argc) usage_exit(argv[0], 2);
        if (strcmp(argv[i], "--tokens") == 0) N = atoi(argv[++i]);
        else if (strcmp(argv[i], "--repeats") == 0) repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "--model") == 0) model = argv[++i];
        else usage_exit(argv[0], 2);
    }
    const int all = strcmp(model, "all") == 0, small = strcmp(model, "gpt3-1.3b") == 0, big = strcmp(model, "gpt3-2.7b") == 0;
    if (N < 16 || N % 16 != 0 || repeats < 1 || repeats > MEDIAN_TIME_MAX_REPEATS || !(all || small || big))
        usage_exit(argv[0], 2);
    GpuInfo gpu = gpu_info(0);
    if (!gpu.found || gpu.major * 10 + gpu.minor < 89) {
        fprintf(stderr, "error: bench_fp8_gemm needs a GPU with FP8 tensor cores (compute capability 8.9 or newer)\n");
        return 1;
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    MatmulContext ctx;
    matmul_context_create(&ctx, stream);
    ctx.tune = 1;  // the fastest of cuBLASLt's candidates per shape, for bf16 and FP8 alike
    printf("device %s, sm_%d%d, %d SMs, cuBLASLt %zu; N = %d tokens; median of %d runs\n", gpu.name, gpu.major,
           gpu.minor, gpu.num_sms, cublasLtGetVersion(), N, repeats);
    printf("%-10s %-9s %-8s %6s %6s %6s  %8s %7s  %8s %7s  %s\n", "model", "layer", "GEMM", "M", "N", "K", "bf16 ms",
           "TFLOP/s", "fp8 ms", "TFLOP/s", "bf16/fp8 time");
    if (all || small) bench_model("gpt3-1.3b", 2048, N, repeats, &ctx, stream);
    if (all || big) bench_model("gpt3-2.7b", 2560, N, repeats, &ctx, stream);
    matmul_context_destroy(&ctx);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
