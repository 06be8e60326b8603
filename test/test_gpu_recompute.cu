// test_gpu_recompute.cu: activation recomputation (--recompute selective, full) and the chunked LM head of
// layers/model/gpt_model.cuh give the loss and gradients of the plain model.
//
// A small GPT (L = 3, C = 128, NH = 2 so HD = 64, V = 200 padded to Vp = 256, maxT = 96) on B = 2, T = 67
// (odd, N = 134 rows, not a multiple of any tile). Parameters are drawn GPT-2-like and rounded to bf16,
// inputs are fresh random ids and targets the fp64 model's most likely next tokens (cpu_gpt_likely_targets:
// the mean loss then lies ~0.5 nats below ln V, the loss of all-zero logits, so the loss check can tell
// the two apart); before every run the activation memory is poisoned (0xFF bytes: NaN), so
// a recomputed slot that is read before it is written shows up. A run is one forward and one backward
// from zeroed gradients (grad_scale 1/N), as the trainer runs them (gpt_model_forward_train: the last
// LM-head chunk's dlogits made in the forward); its mean loss, per-row losses (N) and all gradients
// are read.
// Cases:
//   recompute_<backend>_<fusion>_<head>: selective and full against none with the same backend, GEMM
//     epilogue fusion and LM-head chunking. Bit for bit (mean loss, losses, every gradient) where the
//     attention backward is deterministic (naive; flash2 --deterministic on Hopper), except selective with
//     the fused GELU epilogue (it starts from the fp32 pre-activation, the recomputed GELU from the bf16
//     one; on an H100 the losses then differ by 2.6e-4 relative): there, and for flash2 off Hopper,
//     relative errors ||x - ref|| / ||ref|| <= 1e-3 (losses) and 1e-2 (each gradient tensor).
//   lm_head_chunks_<backend>: the LM head in chunks of 16 rows (9 chunks, the last of 6) against one
//     chunk: losses <= 1e-5, each gradient <= 1e-2 (dwte adds each chunk's part in bf16).
//   Every run is also checked against the fp64 CPU model (test/cpu_gpt.h): loss within 2e-3 nats, each
//     gradient <= 3e-2, as in test_gpu_gpt.cu.
//   activation_bytes: full < selective < none, and the estimate the plan prints (no GPU) is within
//     1 MiB below the exact size.
//   recompute_planted_*: on the CPU everywhere, the loss of all-zero logits (ln V) and a loss off by
//     twice the bound must fail the check against the fp64 model.
// Bounds and their reasons: TOL_* below.
// The seed comes from the clock unless TEST_SEED is set, and is printed. GPU cases are SKIPped where no GPU
// is found.
#include <cuda_bf16.h>

#include "layers/model/gpt_model.cuh"
#include "test/cpu_gpt.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

// Selective with the fused GELU epilogue against none: GELU from the fp32 pre-activation against GELU
// recomputed from its bf16 rounding; measured <= 2.6e-4 (losses) and <= 6.5e-3 (gradients) on H100s.
// The chunked LM head against the whole: dwte adds each chunk's part in bf16; measured <= 4.3e-3.
#define TOL_LOSSES 1e-3
#define TOL_GRAD 1e-2
// The LM head in chunks against one chunk: the same GEMM per row at another M, which cuBLAS may tile
// otherwise, moving a logit by a bf16 ulp now and then (~1e-6 in a loss); measured 0 (bit-identical).
#define TOL_CHUNK_LOSSES 1e-5
// Against the fp64 model: the mean loss in nats, the logits' bf16 error through the cross-entropy
// (measured <= 3.4e-4 nats here, <= 4.6e-4 in test_gpu_gpt.cu, whose TOL_LOSS says more), and each
// gradient tensor (bf16 end to end; measured <= 6.9e-3 here, <= 9.1e-3 in test_gpu_gpt.cu).
#define TOL_REF_LOSS 2e-3
#define TOL_REF_GRAD 3e-2
// The plan's estimate of the activation bytes without a GPU leaves out LayerNorm backward's block
// partial sums (at most N·3C fp32: 206 KB here) and CUB's sort storage (a few KB for 134 keys);
// measured 70 KB.
#define TOL_ESTIMATE_BYTES ((size_t)1 << 20)
#define CHUNK_ROWS 16

typedef struct {
    GPTConfig config;
    int B, T, N;
    size_t num_params, sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    uint16_t* params_bf16;
    int *inputs, *targets;  // (B, T)
    double ref_loss;
    double* ref_grads;      // fp64 CPU model
} Problem;

typedef struct {
    float loss;
    float* losses;     // (N)
    uint16_t* grads;   // num_params bf16 bits
} Run;

static void problem_make(Problem* pb, uint64_t seed) {
    GPTConfig c;
    c.num_layers = 3, c.channels = 128, c.num_heads = 2, c.num_kv_heads = 2, c.vocab_size = 200;
    c.padded_vocab_size = gpt_round_up(c.vocab_size, VOCAB_PAD_MULTIPLE), c.max_seq_len = 96;
    pb->config = c;
    pb->B = 2, pb->T = 67, pb->N = pb->B * pb->T;
    gpt_param_sizes(pb->sizes, &c);
    pb->num_params = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) pb->offsets[i] = pb->num_params, pb->num_params += pb->sizes[i];
    double* params = test_alloc(pb->num_params);
    pb->params_bf16 = (uint16_t*)calloc(pb->num_params, sizeof(uint16_t));
    TestRng rng = {seed};
    const double proj_scale = 0.02 / sqrt(2.0 * c.num_layers);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        double* x = params + pb->offsets[i];
        const int ln_weight = GPT_PARAMS[i].init == INIT_ONES;
        const int ln_bias = i == GPT_LN1B || i == GPT_LN2B || i == GPT_LNFB;
        const double scale = (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? proj_scale : ln_weight ? 0.1 : ln_bias ? 0.05 : 0.02;
        test_fill_normal(&rng, x, pb->sizes[i], scale);
        for (size_t j = 0; j < pb->sizes[i]; j++) {
            if (ln_weight) x[j] += 1.0;
            const uint16_t h = test_float_to_bf16((float)x[j]);
            pb->params_bf16[pb->offsets[i] + j] = h;
            x[j] = test_bf16_to_float(h);
        }
    }
    pb->inputs = (int*)calloc(pb->N, sizeof(int));
    pb->targets = (int*)calloc(pb->N, sizeof(int));
    for (int i = 0; i < pb->N; i++) pb->inputs[i] = (int)(test_rng_next(&rng) % (uint64_t)c.vocab_size);
    pb->ref_grads = test_alloc(pb->num_params);
    double* ref_logits = test_alloc((size_t)pb->N * c.padded_vocab_size);
    const int cfg[7] = {c.num_layers,        c.channels,    c.num_heads,   c.vocab_size,
                        c.padded_vocab_size, c.max_seq_len, c.num_kv_heads};
    pb->ref_loss = NAN;
    if (cpu_gpt_likely_targets(cfg, pb->B, pb->T, params, pb->inputs, pb->targets) == 0)
        pb->ref_loss = cpu_gpt_forward_backward(cfg, pb->B, pb->T, params, pb->inputs, pb->targets, ref_logits,
                                                pb->ref_grads);
    free(ref_logits), free(params);
}

static void problem_free(Problem* pb) {
    free(pb->params_bf16), free(pb->inputs), free(pb->targets), free(pb->ref_grads);
}

static void run_free(Run* r) { free(r->losses), free(r->grads); }

// One forward and backward of a fresh model; returns 0, or -1 when the model could not be made.
static int run_model(const Problem* pb, AttentionBackend backend, MatmulFusion fusion, RecomputeMode recompute,
                     int lm_head_rows, cudaStream_t stream, Run* out) {
    GPTModel m;
    GPTModelOptions options = gpt_model_options(pb->B, pb->T, backend, stream);
    options.recompute = recompute, options.lm_head_rows = lm_head_rows, options.deterministic_attention = 1;
    if (gpt_model_create(&m, &pb->config, &options) != 0) return -1;
    m.matmul.fusion = fusion;
    int *d_inputs, *d_targets;
    CUDA_CHECK(cudaMalloc((void**)&d_inputs, pb->N * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&d_targets, pb->N * sizeof(int)));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the create's memsets are done before the uploads
    CUDA_CHECK(cudaMemcpy(d_inputs, pb->inputs, pb->N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_targets, pb->targets, pb->N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m.params, pb->params_bf16, pb->num_params * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(m.acts_memory, 0xFF, m.memory.act_bytes));  // poison: NaN everywhere
    CUDA_CHECK(cudaDeviceSynchronize());
    gpt_model_forward_train(&m, d_inputs, d_targets, 1.0f / (float)pb->N);
    out->loss = gpt_model_mean_loss(&m);
    gpt_model_zero_grad(&m);
    gpt_model_backward(&m, 1.0f / (float)pb->N);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    out->losses = (float*)host_alloc(pb->N * sizeof(float));
    out->grads = (uint16_t*)host_alloc(pb->num_params * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(out->losses, m.losses, pb->N * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(out->grads, m.grads, pb->num_params * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_inputs));
    CUDA_CHECK(cudaFree(d_targets));
    gpt_model_destroy(&m);
    return 0;
}

static double* grads_f64(const Problem* pb, const Run* r) {
    double* g = test_alloc(pb->num_params);
    for (size_t i = 0; i < pb->num_params; i++) g[i] = test_bf16_to_float(r->grads[i]);
    return g;
}

// A mean loss against the fp64 CPU model's: adds a problem when it is more than TOL_REF_LOSS nats off.
static void check_reference_loss(const Problem* pb, double loss, const char* label, char* problems, size_t size) {
    const double off = fabs(loss - pb->ref_loss);
    if (!(off <= TOL_REF_LOSS))
        add_problem(problems, size, "%s: loss %.6f vs CPU %.6f, %.2e nats off (bound %.0e)", label, loss, pb->ref_loss,
                    off, TOL_REF_LOSS);
}

// Run r against the fp64 CPU model.
static void check_reference(const Problem* pb, const Run* r, const char* label, char* problems, size_t size) {
    check_reference_loss(pb, r->loss, label, problems, size);
    double* g = grads_f64(pb, r);
    double worst = 0.0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const double e = test_rel_error(g + pb->offsets[i], pb->ref_grads + pb->offsets[i], pb->sizes[i]);
        if (!(e <= worst)) worst = e;  // NaN sticks
        if (!(e <= TOL_REF_GRAD))
            add_problem(problems, size, "%s: d%s vs CPU rel err %.2e", label, GPT_PARAMS[i].name, e);
    }
    printf("  %s: loss %.6f (CPU %.6f), worst gradient rel err vs CPU %.2e\n", label, r->loss, pb->ref_loss, worst);
    free(g);
}

// Run r against run ref: bit for bit (exact) or within tol_losses / tol_grad.
static void check_same(const Problem* pb, const Run* r, const Run* ref, int exact, double tol_losses, double tol_grad,
                       const char* label, char* problems, size_t size) {
    if (exact) {
        const int same_loss = memcmp(&r->loss, &ref->loss, sizeof(float)) == 0;
        const int same_losses = memcmp(r->losses, ref->losses, pb->N * sizeof(float)) == 0;
        printf("  %s: bit for bit: mean loss %s, losses %s\n", label, same_loss ? "same" : "DIFFERENT",
               same_losses ? "same" : "DIFFERENT");
        if (!same_loss || !same_losses)
            add_problem(problems, size, "%s: loss %.9g vs %.9g, losses %s", label, r->loss, ref->loss,
                        same_losses ? "same" : "differ");
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            size_t differ = 0;
            for (size_t j = pb->offsets[i]; j < pb->offsets[i] + pb->sizes[i]; j++) differ += r->grads[j] != ref->grads[j];
            if (differ) add_problem(problems, size, "%s: d%s differs in %zu of %zu values", label, GPT_PARAMS[i].name,
                                    differ, pb->sizes[i]);
        }
        return;
    }
    double* a = test_alloc(pb->N);
    double* b = test_alloc(pb->N);
    for (int i = 0; i < pb->N; i++) a[i] = r->losses[i], b[i] = ref->losses[i];
    const double e_losses = test_rel_error(a, b, pb->N);
    free(a), free(b);
    if (!(e_losses <= tol_losses)) add_problem(problems, size, "%s: losses rel err %.2e", label, e_losses);
    double* g = grads_f64(pb, r);
    double* g_ref = grads_f64(pb, ref);
    double worst = 0.0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const double e = test_rel_error(g + pb->offsets[i], g_ref + pb->offsets[i], pb->sizes[i]);
        if (!(e <= worst)) worst = e;
        if (!(e <= tol_grad)) add_problem(problems, size, "%s: d%s rel err %.2e", label, GPT_PARAMS[i].name, e);
    }
    printf("  %s: losses rel err %.2e, worst gradient rel err %.2e\n", label, e_losses, worst);
    free(g), free(g_ref);
}

static const char* fusion_name(MatmulFusion f) { return f == MATMUL_FUSE_NONE ? "unfused" : "fused"; }

// selective and full against none.
static void recompute_case(const Problem* pb, AttentionBackend backend, MatmulFusion fusion, int lm_head_rows,
                           int deterministic_backend, const char* skip_why, cudaStream_t stream) {
    char name[128];
    snprintf(name, sizeof(name), "recompute_%s_%s_%s_L3_C128_B2_T67", attention_backend_name(backend),
             fusion_name(fusion), lm_head_rows ? "head_chunks16" : "head_whole");
    if (skip_why) {
        test_skip(name, skip_why);
        return;
    }
    char problems[4096] = "";
    Run runs[NUM_RECOMPUTE_MODES];
    for (int r = 0; r < NUM_RECOMPUTE_MODES; r++) {
        snprintf(g_running_case, sizeof(g_running_case), "%s (%s)", name, RECOMPUTE_NAMES[r]);
        if (run_model(pb, backend, fusion, (RecomputeMode)r, lm_head_rows, stream, &runs[r]) != 0) {
            test_fail(name, "gpt_model_create failed for --recompute %s (see above)", RECOMPUTE_NAMES[r]);
            for (int k = 0; k < r; k++) run_free(&runs[k]);
            return;
        }
        char label[64];
        snprintf(label, sizeof(label), "%s vs CPU", RECOMPUTE_NAMES[r]);
        check_reference(pb, &runs[r], label, problems, sizeof(problems));
    }
    const int exact_full = deterministic_backend;
    const int exact_selective = deterministic_backend && fusion == MATMUL_FUSE_NONE;
    check_same(pb, &runs[RECOMPUTE_SELECTIVE], &runs[RECOMPUTE_NONE], exact_selective, TOL_LOSSES, TOL_GRAD,
               "selective vs none", problems, sizeof(problems));
    check_same(pb, &runs[RECOMPUTE_FULL], &runs[RECOMPUTE_NONE], exact_full, TOL_LOSSES, TOL_GRAD, "full vs none",
               problems, sizeof(problems));
    for (int r = 0; r < NUM_RECOMPUTE_MODES; r++) run_free(&runs[r]);
    g_running_case[0] = 0;
    test_report(name, problems[0] == 0, "%s", problems);
}

// The LM head in chunks of CHUNK_ROWS rows against one chunk (no recomputation).
static void lm_head_chunks_case(const Problem* pb, AttentionBackend backend, const char* skip_why, cudaStream_t stream) {
    char name[160];
    snprintf(name, sizeof(name), "lm_head_chunks_%s_rows%d_of_N134", attention_backend_name(backend), CHUNK_ROWS);
    if (skip_why) {
        test_skip(name, skip_why);
        return;
    }
    char problems[4096] = "";
    Run whole, chunked;
    if (run_model(pb, backend, MATMUL_FUSE_EPILOGUES, RECOMPUTE_NONE, 0, stream, &whole) != 0 ||
        run_model(pb, backend, MATMUL_FUSE_EPILOGUES, RECOMPUTE_NONE, CHUNK_ROWS, stream, &chunked) != 0) {
        test_fail(name, "gpt_model_create failed (see above)");
        return;
    }
    check_reference(pb, &chunked, "chunked vs CPU", problems, sizeof(problems));
    check_same(pb, &chunked, &whole, 0, TOL_CHUNK_LOSSES, TOL_GRAD, "chunked vs whole", problems, sizeof(problems));
    run_free(&whole), run_free(&chunked);
    test_report(name, problems[0] == 0, "%s", problems);
}

// The memory plan: each mode keeps less, and the plan's GPU-free estimate is close to the exact size.
static void activation_bytes_case(const Problem* pb, const char* skip_why) {
    const char* name = "activation_bytes_by_recompute_mode";
    if (skip_why) {
        test_skip(name, skip_why);
        return;
    }
    char problems[2048] = "";
    const AttentionBackend backends[] = {ATTN_NAIVE, ATTN_FLASH2};
    for (int b = 0; b < 2; b++) {
        size_t exact[NUM_RECOMPUTE_MODES];
        for (int r = 0; r < NUM_RECOMPUTE_MODES; r++) {
            GPTModelOptions options = gpt_model_options(pb->B, pb->T, backends[b], 0);
            options.recompute = (RecomputeMode)r;
            exact[r] = gpt_activation_bytes(&pb->config, &options, 1);
            const size_t estimate = gpt_activation_bytes(&pb->config, &options, 0);
            printf("  %s --recompute %-9s %10zu bytes (estimate without a GPU %10zu)\n",
                   attention_backend_name(backends[b]), RECOMPUTE_NAMES[r], exact[r], estimate);
            if (estimate > exact[r] || exact[r] - estimate > TOL_ESTIMATE_BYTES)
                add_problem(problems, sizeof(problems), "%s %s: estimate %zu vs exact %zu",
                            attention_backend_name(backends[b]), RECOMPUTE_NAMES[r], estimate, exact[r]);
        }
        if (!(exact[RECOMPUTE_FULL] < exact[RECOMPUTE_SELECTIVE] && exact[RECOMPUTE_SELECTIVE] < exact[RECOMPUTE_NONE]))
            add_problem(problems, sizeof(problems), "%s: not full < selective < none", attention_backend_name(backends[b]));
    }
    test_report(name, problems[0] == 0, "%s", problems);
}

// The test's loss check, for planted_loss_cases (gpu_test_util.h): 1 when it rejects loss.
static int loss_rejected(const void* problem, double loss) {
    char problems[256] = "";
    check_reference_loss((const Problem*)problem, loss, "planted", problems, sizeof(problems));
    return problems[0] != 0;
}

// The recompute cases: backend, GEMM epilogue fusion, LM-head chunk rows (0: one chunk), and whether
// its attention backward is deterministic (-1: where flash2 runs its Hopper kernels).
typedef struct {
    AttentionBackend backend;
    MatmulFusion fusion;
    int lm_head_rows, deterministic;
} RecomputeSpec;
static const RecomputeSpec RECOMPUTE_CASES[] = {
    {ATTN_NAIVE, MATMUL_FUSE_EPILOGUES, 0, 1},
    {ATTN_NAIVE, MATMUL_FUSE_NONE, CHUNK_ROWS, 1},
    {ATTN_FLASH2, MATMUL_FUSE_EPILOGUES, CHUNK_ROWS, -1},
    {ATTN_FLASH2, MATMUL_FUSE_NONE, 0, -1},
};
static const AttentionBackend CHUNK_BACKENDS[] = {ATTN_NAIVE, ATTN_FLASH2};

int main(void) {
    test_begin();
    atexit(report_exit_during_case);
    uint64_t seed = pick_and_print_seed();
    test_plan((int)(1 + COUNT(RECOMPUTE_CASES) + COUNT(CHUNK_BACKENDS) + PLANTED_LOSS_CASES));
    GpuInfo gpu = gpu_info(0);
    const char* skip_why = gpu_skip_reason(&gpu, "the model");
    Problem pb;
    memset(&pb, 0, sizeof(pb));
    problem_make(&pb, seed);  // the fp64 reference is quick here: made without a GPU too, for the planted errors
    planted_loss_cases("recompute", &pb, loss_rejected, pb.ref_loss, TOL_REF_LOSS, pb.config.vocab_size);
    cudaStream_t stream = 0;
    int hopper = 0;
    if (!skip_why) {
        printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
        CUDA_CHECK(cudaStreamCreate(&stream));
        hopper = gpu.major == 9;  // flash2's deterministic backward is its Hopper kernels'
        if (!isfinite(pb.ref_loss)) skip_why = "the CPU reference failed (out of memory?)";
    }
    activation_bytes_case(&pb, skip_why);
    for (size_t i = 0; i < COUNT(RECOMPUTE_CASES); i++) {
        const RecomputeSpec* r = &RECOMPUTE_CASES[i];
        recompute_case(&pb, r->backend, r->fusion, r->lm_head_rows, r->deterministic < 0 ? hopper : r->deterministic,
                       skip_why, stream);
    }
    for (size_t i = 0; i < COUNT(CHUNK_BACKENDS); i++) lm_head_chunks_case(&pb, CHUNK_BACKENDS[i], skip_why, stream);
    problem_free(&pb);
    if (stream) CUDA_CHECK(cudaStreamDestroy(stream));
    return test_end();
}
