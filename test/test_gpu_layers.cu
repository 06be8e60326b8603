// test_gpu_layers.cu: the non-GEMM GPU layers (layers/model/encoder.cuh, layernorm.cuh, gelu.cuh,
// classifier.cuh, adamw.cuh, global_norm.cuh) against the fp64 CPU reference (test/cpu_reference.h).
//
// Every case draws fresh inputs (the seed comes from the clock unless TEST_SEED is set, and is
// printed), rounds them to bf16 on the host with test_float_to_bf16 and computes the reference from
// exactly those values. Outputs are poisoned with NaN (0xFF bytes) before every run and every output
// element must come back finite (written); every device buffer sits between guards of poison that
// must stay untouched; scratch is poisoned too. Relative errors ‖x − ref‖/‖ref‖ are printed for every
// case; bounds (TOL_* below, with their reasons): 1e-2 for bf16 outputs, 1e-6 for fp32 outputs (mean,
// rstd, losses, master weights, AdamW moments, the norm), 1e-4 for the change AdamW makes to the
// master weights. Where a result is exactly defined (a bf16 sum of two bf16 values, the bf16 copy of
// the fp32 master weights, untouched gradient rows, padding columns) it must match bit for bit.
// Gradients the layers ADD into start from random values, and the reference adds to the same; the
// encoder's are checked by what the backward added (result − start against the reference's sum),
// since at N = 1 a row's starting value would hide a sum 30% wrong.
//
// Cases (N = B·T rows):
// - encoder forward and backward: N in {1, 37, 1000}, C in {64, 768, 2048, 2560}, V = 1000 (Vp = 1024),
//   tokens uniform or skewed (60% one token, so its run spans many sort chunks; the last real token
//   id appears); plus V = 50257 (Vp = 50304) at C = 64. The backward runs twice: bit-identical.
//   Planted errors on the backward's output at N = 1, C = 768: increments 30% and 3% too large
//   (encoder_backward_planted_*) must fail the increment bound.
// - layernorm forward and backward (the backward run twice: bit-identical), same N and C; rows
//   offset from zero so the variance is not E[x²].
// - gelu forward, backward, backward in place, and an unaligned (scalar path) slice.
// - cross-entropy: N in {1, 37, 1000}, (V, Vp) in {(1000, 1024), (50257, 50304)}: validation (losses
//   only, logits untouched) and training (losses, dlogits in place); padding columns hold NaN on
//   input and must be ignored and come back 0; targets include 0, V − 1 and a near-one-hot row.
// - AdamW: 4 steps with fresh gradients, with and without weight decay, grad_scale < 1 on the host
//   and on the device, an unaligned slice; master weights, their change, m, v and the bf16 copy.
// - global norm: n in {1, 37, 1000, 1000003}, unaligned, squared, repeat bit-identical, clip scale,
//   and n = 2^32 + 37 (size_t indexing; skipped where the GPU lacks the ~8.6 GB).
// - init_weights: statistics of 10^6 normals, bf16 copy, shards equal to slices of the whole tensor,
//   repeatable, seeds and tensors independent, constant fill.
// - determinism: encoder and LayerNorm backward run three times with scratch poisoned differently.
// - argument checks (CPU, everywhere): launchers reject C or Vp not a multiple of 8 with a message.
// GPU cases are reported as SKIP where no GPU is found (and the program exits 0).
#include <cuda_bf16.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "layers/optimizer/adamw.cuh"
#include "layers/model/classifier.cuh"
#include "layers/model/encoder.cuh"
#include "layers/model/gelu.cuh"
#include "layers/optimizer/global_norm.cuh"
#include "layers/model/init_weights.cuh"
#include "data/gpt_config.h"
#include "layers/model/layernorm.cuh"
#include "test/cpu_reference.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

// bf16 outputs: rounding to bf16 alone errs by up to 2^-9 = 2e-3 per element (all of a single
// element's error); measured <= 3.4e-3 (gelu at n = 1), else <= 2.4e-3.
#define TOL_BF16 1e-2
// fp32 outputs: fp32 arithmetic, a few ulps (6e-8) through sums of up to C or V terms; measured
// <= 1.2e-7 (LayerNorm's rstd). Below what a LayerNorm without its eps would make (5e-6 in rstd).
#define TOL_F32 1e-6
// AdamW's change to the master weights (~1e-2 a step, ADAMW_TEST_LR) carries the fp32 rounding of
// the master weights (6e-8 of ~1): ~1e-5 of one step's size; measured <= 5.2e-6. The error is taken
// relative to the larger of the net change and one step per element: with n = 1 the 4 steps can
// cancel to a net change far below one step (seen: 5e-3 relative to such a net change, 5e-6 of a step).
#define TOL_UPDATE 1e-4
#define ADAMW_TEST_LR 1e-2f
// The encoder backward's increments: bf16 rounding of start + increment, at N = 1 as large as the
// increment itself: <= 4.0e-3 of it (these cases with 150 seeds, the kernel's arithmetic on the host).
#define TOL_INCREMENT 1e-2
#define GUARD_BYTES 256

static const int ROWS[] = {1, 37, 1000};
static const int CHANNELS[] = {64, 768, 2048, 2560};

static uint64_t g_seed;
static uint64_t g_set_index;
static const char* g_skip_why;  // non-NULL: no usable GPU, every GPU case is skipped
static cudaStream_t g_stream;

// The cases are listed twice: first only counted (for the PLAN line), then run; the same calls do both.
static int g_counting = 0;
static int g_num_cases = 0;

// Starts a GPU case: returns 0 when only counting, and (after printing SKIP) where there is no GPU.
static int case_begin(const char* name) {
    if (g_counting) {
        g_num_cases++;
        return 0;
    }
    if (g_skip_why) {
        test_skip(name, g_skip_why);
        return 0;
    }
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    return 1;
}

static void case_end(const char* name, const char* problems) {
    test_report(name, problems[0] == 0, "%s", problems);
    g_running_case[0] = 0;
}

// A generator per case, so a case's inputs depend only on the seed and its place in the order.
static TestRng case_rng(void) {
    TestRng rng = {g_seed + 0x9E3779B97F4A7C15ull * ++g_set_index};
    return rng;
}

static uint16_t* host_bf16(size_t n) { return (uint16_t*)host_alloc(n * sizeof(uint16_t)); }

// ---- host values ------------------------------------------------------------------------------------

static uint16_t bf16_bits(double x) { return test_float_to_bf16((float)x); }
static double bf16_value(uint16_t h) { return test_bf16_to_float(h); }

// bits[i] = bf16(scale·normal + offset), val[i] its exact value.
static void fill_bf16_normal(TestRng* rng, uint16_t* bits, double* val, size_t n, double scale, double offset) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = bf16_bits(scale * test_rng_normal(rng) + offset);
        if (val) val[i] = bf16_value(bits[i]);
    }
}

static void bits_to_double(double* out, const uint16_t* bits, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_value(bits[i]);
}

// ‖x − ref‖/‖ref‖ for bf16 x; *nonfinite counts NaN/Inf elements of x (unwritten: poison is NaN).
static double rel_error_bf16(const uint16_t* x, const double* ref, size_t n, size_t* nonfinite) {
    double num = 0.0, den = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!bf16_is_finite(x[i])) bad++;
        double d = bf16_value(x[i]) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (nonfinite) *nonfinite += bad;
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static double rel_error_f32(const float* x, const double* ref, size_t n, size_t* nonfinite) {
    double num = 0.0, den = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) bad++;
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (nonfinite) *nonfinite += bad;
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

// Adds "<what> relative error E > bound" when over the bound (NaN fails too).
static void check_error(char* problems, size_t size, const char* what, double err, double bound) {
    if (!(err <= bound)) add_problem(problems, size, "%s relative error %.3e > %.0e", what, err, bound);
}

static void check_written(char* problems, size_t size, const char* what, size_t nonfinite, size_t n) {
    if (nonfinite) add_problem(problems, size, "%zu of %zu %s elements non-finite or unwritten", nonfinite, n, what);
}

// ---- device buffers between guards of poison ------------------------------------------------------

typedef struct {
    unsigned char* base;  // [guard | bytes | guard]
    size_t bytes;
} DevBuf;

static DevBuf dev_alloc(size_t bytes) {
    DevBuf b;
    b.bytes = bytes;
    CUDA_CHECK(cudaMalloc(&b.base, bytes + 2 * GUARD_BYTES));
    CUDA_CHECK(cudaMemset(b.base, 0xFF, bytes + 2 * GUARD_BYTES));
    return b;
}
static void* dptr(DevBuf b) { return b.base + GUARD_BYTES; }
static void dev_poison(DevBuf b, int byte) { CUDA_CHECK(cudaMemset(b.base + GUARD_BYTES, byte, b.bytes)); }
static void dev_upload(DevBuf b, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dptr(b), src, bytes, cudaMemcpyHostToDevice));
}
static void dev_download(void* dst, DevBuf b, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, dptr(b), bytes, cudaMemcpyDeviceToHost));
}
static void dev_free(DevBuf* b) {
    if (b->base) CUDA_CHECK(cudaFree(b->base));
    b->base = NULL;
}

// Adds a problem when the guards around `b` are no longer all 0xFF.
static void check_guards(char* problems, size_t size, DevBuf b, const char* what) {
    unsigned char g[2 * GUARD_BYTES];
    CUDA_CHECK(cudaMemcpy(g, b.base, GUARD_BYTES, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(g + GUARD_BYTES, b.base + GUARD_BYTES + b.bytes, GUARD_BYTES, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 2 * GUARD_BYTES; i++)
        if (g[i] != 0xFFu) {
            add_problem(problems, size, "wrote outside %s", what);
            return;
        }
}

// ---- encoder ----------------------------------------------------------------------------------------

typedef enum { TOKENS_UNIFORM = 0, TOKENS_SKEWED = 1 } TokenMix;
static const char* TOKEN_MIX_NAMES[] = {"uniform", "skewed"};

// tokens (N) in [0, V): uniform, or 60% one token; position 0 gets V − 1 and the last gets 0.
static void make_tokens(TestRng* rng, int* tokens, int N, int V, TokenMix mix) {
    int common = (int)(test_rng_next(rng) % (uint64_t)V);
    for (int i = 0; i < N; i++) {
        if (mix == TOKENS_SKEWED && test_rng_uniform(rng, 0.0, 1.0) < 0.6) tokens[i] = common;
        else tokens[i] = (int)(test_rng_next(rng) % (uint64_t)V);
    }
    tokens[0] = V - 1;
    if (N > 1) tokens[N - 1] = 0;
}

static void encoder_shape(int N, int* B, int* T) {
    *B = N >= 1000 ? 4 : 1;
    *T = N / *B;
}

static void encoder_forward_case(int N, int C, int V, int Vp) {
    char name[160];
    snprintf(name, sizeof(name), "encoder_forward_N%d_C%d_V%d", N, C, V);
    if (!case_begin(name)) return;
    int B, T;
    encoder_shape(N, &B, &T);
    const int maxT = T + 3;
    TestRng rng = case_rng();
    const size_t n_wte = (size_t)Vp * C, n_wpe = (size_t)maxT * C, n_out = (size_t)N * C;
    uint16_t* wte = host_bf16(n_wte);
    uint16_t* wpe = host_bf16(n_wpe);
    uint16_t* out = host_bf16(n_out);
    int* tokens = (int*)host_alloc(N * sizeof(int));
    double *dwte = test_alloc(n_wte), *dwpe = test_alloc(n_wpe), *ref = test_alloc(n_out);
    fill_bf16_normal(&rng, wte, dwte, n_wte, 1.0, 0.0);
    fill_bf16_normal(&rng, wpe, dwpe, n_wpe, 1.0, 0.0);
    make_tokens(&rng, tokens, N, V, TOKENS_UNIFORM);
    ref_encoder_forward(ref, tokens, dwte, dwpe, B, T, C);

    DevBuf d_wte = dev_alloc(n_wte * 2), d_wpe = dev_alloc(n_wpe * 2), d_out = dev_alloc(n_out * 2),
           d_tok = dev_alloc(N * sizeof(int));
    dev_upload(d_wte, wte, n_wte * 2);
    dev_upload(d_wpe, wpe, n_wpe * 2);
    dev_upload(d_tok, tokens, N * sizeof(int));
    encoder_forward((__nv_bfloat16*)dptr(d_out), (const int*)dptr(d_tok), (const __nv_bfloat16*)dptr(d_wte),
                    (const __nv_bfloat16*)dptr(d_wpe), B, T, C, g_stream);
    sync_or_die(g_stream, name, "kernel");
    dev_download(out, d_out, n_out * 2);

    char problems[1024] = "";
    size_t bad = 0, mismatched = 0;
    double err = rel_error_bf16(out, ref, n_out, &bad);
    for (size_t i = 0; i < n_out; i++)
        mismatched += out[i] != bf16_bits((float)bf16_value(wte[(size_t)tokens[i / C] * C + i % C]) +
                                          (float)bf16_value(wpe[(size_t)((i / C) % T) * C + i % C]));
    printf("%s: out %.2e, %zu of %zu not the bf16 of the fp32 sum\n", name, err, mismatched, n_out);
    check_written(problems, sizeof(problems), "out", bad, n_out);
    check_error(problems, sizeof(problems), "out", err, TOL_BF16);
    if (mismatched) add_problem(problems, sizeof(problems), "%zu elements differ from bf16(wte + wpe)", mismatched);
    check_guards(problems, sizeof(problems), d_out, "out");
    case_end(name, problems);

    dev_free(&d_wte), dev_free(&d_wpe), dev_free(&d_out), dev_free(&d_tok);
    free(wte), free(wpe), free(out), free(tokens), free(dwte), free(dwpe), free(ref);
}

// One output the encoder backward adds into: what came back, its starting values, and the sum the
// reference says the backward adds.
typedef struct {
    const char* name;
    const uint16_t *result, *start;  // n bf16
    const double* ref_inc;           // n
    size_t n;
} Increment;

// ‖(result − start) − ref_inc‖/‖ref_inc‖: the error of what the backward added, which a starting value
// as large as the sum (N = 1) would hide in the error of the result. *nonfinite counts non-finite results.
static double increment_error(const Increment* x, size_t* nonfinite) {
    double num = 0.0, den = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (!bf16_is_finite(x->result[i])) bad++;
        const double d = (bf16_value(x->result[i]) - bf16_value(x->start[i])) - x->ref_inc[i];
        num += d * d;
        den += x->ref_inc[i] * x->ref_inc[i];
    }
    if (nonfinite) *nonfinite += bad;
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

// Planted errors: every increment of a backward's dwte and dwpe made this much too large (then rounded
// to bf16, as a kernel's result would be) must fail TOL_INCREMENT. 3%, not 1%: at N = 1 the rounding
// alone is up to 4.0e-3 of the increment, so a 1% error would stand out of it only 2.5-fold.
static const double ENCODER_PLANTS[] = {0.30, 0.03};

// The planted cases on the increments `outs` of the case named `source` (num_outs 0: list them only,
// as case_begin does when counting or skipping).
static void encoder_plant_cases(const char* source, const Increment* outs, int num_outs) {
    for (size_t p = 0; p < COUNT(ENCODER_PLANTS); p++) {
        char name[160];
        snprintf(name, sizeof(name), "encoder_backward_planted_increments_%g_percent_too_large_rejected",
                 100.0 * ENCODER_PLANTS[p]);
        if (!case_begin(name)) continue;
        char problems[512] = "";
        for (int k = 0; k < num_outs; k++) {
            const Increment* x = &outs[k];
            uint16_t* wrong = host_bf16(x->n);
            for (size_t i = 0; i < x->n; i++) {
                const double start = bf16_value(x->start[i]);
                wrong[i] = bf16_bits(start + (1.0 + ENCODER_PLANTS[p]) * (bf16_value(x->result[i]) - start));
            }
            Increment planted = *x;
            planted.result = wrong;
            const double before = increment_error(x, NULL), after = increment_error(&planted, NULL);
            printf("%s (on %s): %s increments' error %.2e -> %.2e (bound %.0e)\n", name, source, x->name, before, after,
                   TOL_INCREMENT);
            if (!(before <= TOL_INCREMENT))
                add_problem(problems, sizeof(problems), "uncorrupted %s error %.3e is over its bound already", x->name,
                            before);
            if (after <= TOL_INCREMENT)
                add_problem(problems, sizeof(problems), "%s: corrupted increments' error %.3e within %.0e: not rejected",
                            x->name, after, TOL_INCREMENT);
            free(wrong);
        }
        case_end(name, problems);
    }
}

// Host side of an encoder backward case: the gradients' starting values (…0), what the first run left
// and what a later run left (…_again), dout, tokens and the reference increments.
typedef struct {
    uint16_t *dwte0, *dwpe0, *dwte, *dwpe, *dwte_again, *dwpe_again, *dout;
    int* tokens;
    double *inc_wte, *inc_wpe;
} EncoderBackwardHost;

static EncoderBackwardHost encoder_backward_inputs(TestRng* rng, int N, int C, int V, int Vp, int T, TokenMix mix) {
    const size_t n_wte = (size_t)Vp * C, n_wpe = (size_t)(T + 3) * C, n_out = (size_t)N * C;
    EncoderBackwardHost h;
    h.dwte0 = host_bf16(n_wte), h.dwpe0 = host_bf16(n_wpe), h.dout = host_bf16(n_out);
    h.dwte = host_bf16(n_wte), h.dwpe = host_bf16(n_wpe), h.dwte_again = host_bf16(n_wte);
    h.dwpe_again = host_bf16(n_wpe);
    h.tokens = (int*)host_alloc(N * sizeof(int));
    h.inc_wte = test_alloc(n_wte), h.inc_wpe = test_alloc(n_wpe);  // zeroed: the reference adds into them
    double* ddout = test_alloc(n_out);
    fill_bf16_normal(rng, h.dwte0, NULL, n_wte, 1.0, 0.0);
    fill_bf16_normal(rng, h.dwpe0, NULL, n_wpe, 1.0, 0.0);
    fill_bf16_normal(rng, h.dout, ddout, n_out, 1.0, 0.0);
    make_tokens(rng, h.tokens, N, V, mix);
    ref_encoder_backward(h.inc_wte, h.inc_wpe, ddout, h.tokens, N / T, T, C);
    free(ddout);
    return h;
}

static void encoder_backward_free(EncoderBackwardHost* h) {
    free(h->dwte0), free(h->dwpe0), free(h->dwte), free(h->dwpe), free(h->dwte_again), free(h->dwpe_again);
    free(h->dout), free(h->tokens), free(h->inc_wte), free(h->inc_wpe);
}

// Runs encoder_backward `runs` times from the same starting dwte and dwpe (scratch poisoned with a
// different byte each run): run 1's results in h->dwte, h->dwpe, later runs' compared bit for bit.
// Checks the guards; returns 1 when the runs were identical.
static int encoder_backward_runs(const char* name, EncoderBackwardHost* h, int N, int C, int Vp, int T, int runs,
                                 char* problems, size_t size) {
    const size_t n_wte = (size_t)Vp * C, n_wpe = (size_t)(T + 3) * C, n_out = (size_t)N * C;
    const size_t scratch_bytes = encoder_backward_scratch_bytes(N, C, Vp);
    DevBuf d_wte = dev_alloc(n_wte * 2), d_wpe = dev_alloc(n_wpe * 2), d_dout = dev_alloc(n_out * 2),
           d_tok = dev_alloc(N * sizeof(int)), d_scratch = dev_alloc(scratch_bytes);
    dev_upload(d_dout, h->dout, n_out * 2);
    dev_upload(d_tok, h->tokens, N * sizeof(int));
    int identical = 1;
    for (int run = 0; run < runs; run++) {
        dev_upload(d_wte, h->dwte0, n_wte * 2);
        dev_upload(d_wpe, h->dwpe0, n_wpe * 2);
        dev_poison(d_scratch, run == 0 ? 0xFF : run == 1 ? 0x00 : 0x7F);
        encoder_backward((__nv_bfloat16*)dptr(d_wte), (__nv_bfloat16*)dptr(d_wpe), dptr(d_scratch), scratch_bytes,
                         (const __nv_bfloat16*)dptr(d_dout), (const int*)dptr(d_tok), N / T, T, C, Vp, g_stream);
        sync_or_die(g_stream, name, "kernel");
        dev_download(run == 0 ? h->dwte : h->dwte_again, d_wte, n_wte * 2);
        dev_download(run == 0 ? h->dwpe : h->dwpe_again, d_wpe, n_wpe * 2);
        if (run > 0 && (memcmp(h->dwte, h->dwte_again, n_wte * 2) != 0 || memcmp(h->dwpe, h->dwpe_again, n_wpe * 2) != 0)) {
            identical = 0;
            add_problem(problems, size, "run %d differs from run 1 (not deterministic)", run + 1);
        }
    }
    check_guards(problems, size, d_wte, "dwte");
    check_guards(problems, size, d_wpe, "dwpe");
    check_guards(problems, size, d_scratch, "scratch");
    dev_free(&d_wte), dev_free(&d_wpe), dev_free(&d_dout), dev_free(&d_tok), dev_free(&d_scratch);
    return identical;
}

// Checks run 1 of encoder_backward against the reference increments, later runs bit for bit against
// run 1 (encoder_backward_runs). plant: the planted cases follow, on this case's output.
static void encoder_backward_case(const char* prefix, int N, int C, int V, int Vp, TokenMix mix, int runs, int plant) {
    char name[160];
    snprintf(name, sizeof(name), "%s_N%d_C%d_V%d_%s", prefix, N, C, V, TOKEN_MIX_NAMES[mix]);
    if (!case_begin(name)) {
        if (plant) encoder_plant_cases(name, NULL, 0);
        return;
    }
    int B, T;
    encoder_shape(N, &B, &T);
    const int maxT = T + 3;
    TestRng rng = case_rng();
    EncoderBackwardHost h = encoder_backward_inputs(&rng, N, C, V, Vp, T, mix);
    char problems[1024] = "";
    const int identical = encoder_backward_runs(name, &h, N, C, Vp, T, runs, problems, sizeof(problems));
    const Increment outs[2] = {{"dwte", h.dwte, h.dwte0, h.inc_wte, (size_t)Vp * C},
                               {"dwpe", h.dwpe, h.dwpe0, h.inc_wpe, (size_t)maxT * C}};
    size_t bad = 0;
    double err_wte = increment_error(&outs[0], &bad);
    check_written(problems, sizeof(problems), "dwte", bad, outs[0].n);
    bad = 0;
    double err_wpe = increment_error(&outs[1], &bad);
    check_written(problems, sizeof(problems), "dwpe", bad, outs[1].n);
    // Rows no position touches must be exactly as they were.
    char* present = (char*)calloc(Vp, 1);
    for (int i = 0; i < N; i++) present[h.tokens[i]] = 1;
    size_t changed_rows = 0;
    int distinct = 0;
    for (int v = 0; v < Vp; v++) {
        distinct += present[v];
        if (!present[v] && memcmp(h.dwte + (size_t)v * C, h.dwte0 + (size_t)v * C, C * 2) != 0) changed_rows++;
    }
    if (memcmp(h.dwpe + (size_t)T * C, h.dwpe0 + (size_t)T * C, (size_t)(maxT - T) * C * 2) != 0)
        add_problem(problems, sizeof(problems), "dwpe rows t >= T changed");
    if (changed_rows) add_problem(problems, sizeof(problems), "%zu dwte rows of absent tokens changed", changed_rows);
    printf("%s: increments of dwte %.2e, dwpe %.2e (%d distinct tokens in %d positions), %d runs %s\n", name, err_wte,
           err_wpe, distinct, N, runs, identical ? "bit-identical" : "DIFFER");
    check_error(problems, sizeof(problems), "dwte increment", err_wte, TOL_INCREMENT);
    check_error(problems, sizeof(problems), "dwpe increment", err_wpe, TOL_INCREMENT);
    case_end(name, problems);
    if (plant) encoder_plant_cases(name, outs, 2);
    free(present);
    encoder_backward_free(&h);
}

// ---- layernorm --------------------------------------------------------------------------------------

// Rows of inp: normal(0, 1) + a per-row offset of magnitude 0.5 .. 2 (either sign).
static void fill_rows_offset(TestRng* rng, uint16_t* bits, double* val, int N, int C) {
    for (int r = 0; r < N; r++) {
        double offset = test_rng_uniform(rng, 0.5, 2.0) * (test_rng_next(rng) & 1 ? 1.0 : -1.0);
        fill_bf16_normal(rng, bits + (size_t)r * C, val ? val + (size_t)r * C : NULL, C, 1.0, offset);
    }
}

static void layernorm_forward_case(int N, int C) {
    char name[160];
    snprintf(name, sizeof(name), "layernorm_forward_N%d_C%d", N, C);
    if (!case_begin(name)) return;
    TestRng rng = case_rng();
    const size_t n = (size_t)N * C;
    uint16_t *inp = host_bf16(n), *w = host_bf16(C), *b = host_bf16(C), *out = host_bf16(n);
    float *mean = (float*)host_alloc(N * 4), *rstd = (float*)host_alloc(N * 4);
    double *x = test_alloc(n), *dw = test_alloc(C), *db = test_alloc(C), *ref = test_alloc(n);
    double *ref_mean = test_alloc(N), *ref_rstd = test_alloc(N);
    fill_rows_offset(&rng, inp, x, N, C);
    fill_bf16_normal(&rng, w, dw, C, 0.2, 1.0);
    fill_bf16_normal(&rng, b, db, C, 0.2, 0.0);
    ref_layernorm_forward(ref, ref_mean, ref_rstd, x, dw, db, N, C);

    DevBuf d_inp = dev_alloc(n * 2), d_w = dev_alloc(C * 2), d_b = dev_alloc(C * 2), d_out = dev_alloc(n * 2),
           d_mean = dev_alloc(N * 4), d_rstd = dev_alloc(N * 4);
    dev_upload(d_inp, inp, n * 2);
    dev_upload(d_w, w, C * 2);
    dev_upload(d_b, b, C * 2);
    layernorm_forward((__nv_bfloat16*)dptr(d_out), (float*)dptr(d_mean), (float*)dptr(d_rstd),
                      (const __nv_bfloat16*)dptr(d_inp), (const __nv_bfloat16*)dptr(d_w),
                      (const __nv_bfloat16*)dptr(d_b), N, C, g_stream);
    sync_or_die(g_stream, name, "kernel");
    dev_download(out, d_out, n * 2);
    dev_download(mean, d_mean, N * 4);
    dev_download(rstd, d_rstd, N * 4);

    char problems[1024] = "";
    size_t bad_out = 0, bad_mean = 0, bad_rstd = 0;
    double err_out = rel_error_bf16(out, ref, n, &bad_out);
    double err_mean = rel_error_f32(mean, ref_mean, N, &bad_mean);
    double err_rstd = rel_error_f32(rstd, ref_rstd, N, &bad_rstd);
    printf("%s: out %.2e, mean %.2e, rstd %.2e\n", name, err_out, err_mean, err_rstd);
    check_written(problems, sizeof(problems), "out", bad_out, n);
    check_written(problems, sizeof(problems), "mean", bad_mean, N);
    check_written(problems, sizeof(problems), "rstd", bad_rstd, N);
    check_error(problems, sizeof(problems), "out", err_out, TOL_BF16);
    check_error(problems, sizeof(problems), "mean", err_mean, TOL_F32);
    check_error(problems, sizeof(problems), "rstd", err_rstd, TOL_F32);
    check_guards(problems, sizeof(problems), d_out, "out");
    check_guards(problems, sizeof(problems), d_mean, "mean");
    check_guards(problems, sizeof(problems), d_rstd, "rstd");
    case_end(name, problems);

    dev_free(&d_inp), dev_free(&d_w), dev_free(&d_b), dev_free(&d_out), dev_free(&d_mean), dev_free(&d_rstd);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd);
    free(x), free(dw), free(db), free(ref), free(ref_mean), free(ref_rstd);
}

// Host side of a layernorm backward case: inputs, mean and rstd (fp32), the gradients' starting values
// (…0), the outputs of the first run and of a later run (…2), and the fp64 references.
typedef struct {
    uint16_t *inp, *dout, *w;
    uint16_t *dinp0, *dw0, *db0, *ds0;
    uint16_t *dinp, *dw, *db, *ds;
    uint16_t *dinp2, *dw2, *db2, *ds2;
    float *mean, *rstd;
    double *ref_dinp, *ref_dw, *ref_db, *ref_ds;
} LayernormBackwardHost;

typedef struct {
    DevBuf inp, dout, w, mean, rstd, dinp, dw, db, scratch, ds;
    size_t scratch_bytes;
} LayernormBackwardDev;

// Allocates the host buffers and draws the inputs (in this order: inp, dout, weight, the starting
// dinp, dweight, dbias, then dinp_sum); computes the references from them.
static LayernormBackwardHost layernorm_backward_inputs(TestRng* rng, int N, int C) {
    const size_t n = (size_t)N * C;
    LayernormBackwardHost h;
    h.inp = host_bf16(n), h.dout = host_bf16(n), h.w = host_bf16(C);
    h.dinp0 = host_bf16(n), h.dw0 = host_bf16(C), h.db0 = host_bf16(C);
    h.dinp = host_bf16(n), h.dw = host_bf16(C), h.db = host_bf16(C);
    h.dinp2 = host_bf16(n), h.dw2 = host_bf16(C), h.db2 = host_bf16(C);
    h.ds0 = host_bf16(C), h.ds = host_bf16(C), h.ds2 = host_bf16(C);
    h.ref_ds = test_alloc(C);
    h.mean = (float*)host_alloc(N * 4), h.rstd = (float*)host_alloc(N * 4);
    double *x = test_alloc(n), *dy = test_alloc(n), *wv = test_alloc(C), *tmp = test_alloc(n), *zeros = test_alloc(C);
    double *m64 = test_alloc(N), *r64 = test_alloc(N);
    h.ref_dinp = test_alloc(n), h.ref_dw = test_alloc(C), h.ref_db = test_alloc(C);
    fill_rows_offset(rng, h.inp, x, N, C);
    fill_bf16_normal(rng, h.dout, dy, n, 1.0, 0.0);
    fill_bf16_normal(rng, h.w, wv, C, 0.2, 1.0);
    fill_bf16_normal(rng, h.dinp0, h.ref_dinp, n, 1.0, 0.0);
    fill_bf16_normal(rng, h.dw0, h.ref_dw, C, 1.0, 0.0);
    fill_bf16_normal(rng, h.db0, h.ref_db, C, 1.0, 0.0);
    ref_layernorm_forward(tmp, m64, r64, x, wv, zeros, N, C);
    for (int r = 0; r < N; r++) {
        h.mean[r] = (float)m64[r];
        h.rstd[r] = (float)r64[r];
        m64[r] = h.mean[r];
        r64[r] = h.rstd[r];
    }
    ref_layernorm_backward(h.ref_dinp, h.ref_dw, h.ref_db, dy, x, wv, m64, r64, N, C);
    fill_bf16_normal(rng, h.ds0, h.ref_ds, C, 1.0, 0.0);
    for (size_t i = 0; i < n; i++) h.ref_ds[i % C] += h.ref_dinp[i];  // Σ over rows of the final dinp
    free(x), free(dy), free(wv), free(tmp), free(zeros), free(m64), free(r64);
    return h;
}

// Device buffers between guards, the inputs uploaded.
static LayernormBackwardDev layernorm_backward_upload(const LayernormBackwardHost* h, int N, int C) {
    const size_t n = (size_t)N * C;
    LayernormBackwardDev d;
    d.scratch_bytes = layernorm_backward_scratch_bytes(N, C);
    d.inp = dev_alloc(n * 2), d.dout = dev_alloc(n * 2), d.w = dev_alloc(C * 2), d.mean = dev_alloc(N * 4);
    d.rstd = dev_alloc(N * 4), d.dinp = dev_alloc(n * 2), d.dw = dev_alloc(C * 2), d.db = dev_alloc(C * 2);
    d.scratch = dev_alloc(d.scratch_bytes), d.ds = dev_alloc(C * 2);
    dev_upload(d.inp, h->inp, n * 2);
    dev_upload(d.dout, h->dout, n * 2);
    dev_upload(d.w, h->w, C * 2);
    dev_upload(d.mean, h->mean, N * 4);
    dev_upload(d.rstd, h->rstd, N * 4);
    return d;
}

// Runs the backward `runs` times from the same starting gradients, scratch poisoned differently each
// time; the first run's outputs land in dinp/dw/db/ds, later runs' in …2 and must match bit for bit.
// 1 when they all did.
static int layernorm_backward_runs(const char* name, LayernormBackwardHost* h, const LayernormBackwardDev* d, int N,
                                   int C, int runs, int with_sum, char* problems, size_t size) {
    const size_t n = (size_t)N * C;
    int identical = 1;
    for (int run = 0; run < runs; run++) {
        dev_upload(d->dinp, h->dinp0, n * 2);
        dev_upload(d->dw, h->dw0, C * 2);
        dev_upload(d->db, h->db0, C * 2);
        dev_upload(d->ds, h->ds0, C * 2);
        dev_poison(d->scratch, run == 0 ? 0xFF : run == 1 ? 0x00 : 0x7F);
        layernorm_backward((__nv_bfloat16*)dptr(d->dinp), (__nv_bfloat16*)dptr(d->dw), (__nv_bfloat16*)dptr(d->db),
                           with_sum ? (__nv_bfloat16*)dptr(d->ds) : NULL, (float*)dptr(d->scratch), d->scratch_bytes,
                           (const __nv_bfloat16*)dptr(d->dout), (const __nv_bfloat16*)dptr(d->inp),
                           (const __nv_bfloat16*)dptr(d->w), (const float*)dptr(d->mean), (const float*)dptr(d->rstd),
                           N, C, g_stream);
        sync_or_die(g_stream, name, "kernel");
        dev_download(run == 0 ? h->dinp : h->dinp2, d->dinp, n * 2);
        dev_download(run == 0 ? h->dw : h->dw2, d->dw, C * 2);
        dev_download(run == 0 ? h->db : h->db2, d->db, C * 2);
        dev_download(run == 0 ? h->ds : h->ds2, d->ds, C * 2);
        if (run > 0 && (memcmp(h->dinp, h->dinp2, n * 2) || memcmp(h->dw, h->dw2, C * 2) ||
                        memcmp(h->db, h->db2, C * 2) || memcmp(h->ds, h->ds2, C * 2))) {
            identical = 0;
            add_problem(problems, size, "run %d differs from run 1 (not deterministic)", run + 1);
        }
    }
    return identical;
}

// The first run's outputs against the references, and every guard.
static void layernorm_backward_check(const char* name, const LayernormBackwardHost* h, const LayernormBackwardDev* d,
                                     int N, int C, int runs, int with_sum, int identical, char* problems,
                                     size_t size) {
    const size_t n = (size_t)N * C;
    size_t bad_dinp = 0, bad_dw = 0, bad_db = 0;
    double err_dinp = rel_error_bf16(h->dinp, h->ref_dinp, n, &bad_dinp);
    double err_dw = rel_error_bf16(h->dw, h->ref_dw, C, &bad_dw);
    double err_db = rel_error_bf16(h->db, h->ref_db, C, &bad_db);
    size_t bad_ds = 0;
    double err_ds = with_sum ? rel_error_bf16(h->ds, h->ref_ds, C, &bad_ds) : 0.0;
    if (!with_sum && memcmp(h->ds, h->ds0, C * 2)) add_problem(problems, size, "dinp_sum written although NULL");
    printf("%s: dinp %.2e, dweight %.2e, dbias %.2e, dinp_sum %.2e, %d runs %s (scratch %zu bytes)\n", name,
           err_dinp, err_dw, err_db, err_ds, runs, identical ? "bit-identical" : "DIFFER", d->scratch_bytes);
    check_written(problems, size, "dinp", bad_dinp, n);
    check_written(problems, size, "dweight", bad_dw, C);
    check_written(problems, size, "dbias", bad_db, C);
    check_error(problems, size, "dinp", err_dinp, TOL_BF16);
    check_error(problems, size, "dweight", err_dw, TOL_BF16);
    check_error(problems, size, "dbias", err_db, TOL_BF16);
    if (with_sum) {
        check_written(problems, size, "dinp_sum", bad_ds, C);
        check_error(problems, size, "dinp_sum", err_ds, TOL_BF16);
    }
    check_guards(problems, size, d->ds, "dinp_sum");
    check_guards(problems, size, d->dinp, "dinp");
    check_guards(problems, size, d->dw, "dweight");
    check_guards(problems, size, d->db, "dbias");
    check_guards(problems, size, d->scratch, "scratch");
}

static void layernorm_backward_free(LayernormBackwardHost* h, LayernormBackwardDev* d) {
    dev_free(&d->inp), dev_free(&d->dout), dev_free(&d->w), dev_free(&d->mean), dev_free(&d->rstd);
    dev_free(&d->dinp), dev_free(&d->dw), dev_free(&d->db), dev_free(&d->scratch), dev_free(&d->ds);
    free(h->ds0), free(h->ds), free(h->ds2), free(h->ref_ds);
    free(h->inp), free(h->dout), free(h->w), free(h->dinp0), free(h->dw0), free(h->db0);
    free(h->dinp), free(h->dw), free(h->db), free(h->dinp2), free(h->dw2), free(h->db2);
    free(h->mean), free(h->rstd), free(h->ref_dinp), free(h->ref_dw), free(h->ref_db);
}

// The backward is checked on its own inputs: mean and rstd are the fp64 statistics rounded to fp32,
// given to the kernel and (as those fp32 values) to the reference. with_sum: also dinp_sum, the
// column sums of the new dinp added into a random bf16 vector.
static void layernorm_backward_case(const char* prefix, int N, int C, int runs, int with_sum) {
    char name[160];
    snprintf(name, sizeof(name), "%s%s_N%d_C%d", prefix, with_sum ? "_dinp_sum" : "", N, C);
    if (!case_begin(name)) return;
    TestRng rng = case_rng();
    LayernormBackwardHost h = layernorm_backward_inputs(&rng, N, C);
    LayernormBackwardDev d = layernorm_backward_upload(&h, N, C);
    char problems[1024] = "";
    int identical = layernorm_backward_runs(name, &h, &d, N, C, runs, with_sum, problems, sizeof(problems));
    layernorm_backward_check(name, &h, &d, N, C, runs, with_sum, identical, problems, sizeof(problems));
    case_end(name, problems);
    layernorm_backward_free(&h, &d);
}

// ---- gelu -------------------------------------------------------------------------------------------

typedef enum { GELU_FORWARD = 0, GELU_BACKWARD = 1, GELU_BACKWARD_IN_PLACE = 2 } GeluMode;
static const char* GELU_MODE_NAMES[] = {"forward", "backward", "backward_in_place"};

// offset: elements by which every pointer is moved off 16-byte alignment (scalar path when odd).
static void gelu_case(size_t n, GeluMode mode, int offset) {
    char name[160];
    snprintf(name, sizeof(name), "gelu_%s_n%zu%s", GELU_MODE_NAMES[mode], n, offset ? "_unaligned" : "");
    if (!case_begin(name)) return;
    TestRng rng = case_rng();
    uint16_t *inp = host_bf16(n), *dout = host_bf16(n);
    uint16_t* res = host_bf16(n);
    double *x = test_alloc(n), *dy = test_alloc(n), *ref = test_alloc(n);
    fill_bf16_normal(&rng, inp, x, n, 2.0, 0.0);
    fill_bf16_normal(&rng, dout, dy, n, 1.0, 0.0);
    if (mode == GELU_FORWARD) ref_gelu_forward(ref, x, n);
    else ref_gelu_backward(ref, dy, x, n);  // adds into zeros

    const size_t bytes = (n + offset) * 2;
    DevBuf d_inp = dev_alloc(bytes), d_dout = dev_alloc(bytes), d_res = dev_alloc(bytes);
    __nv_bfloat16* p_inp = (__nv_bfloat16*)dptr(d_inp) + offset;
    __nv_bfloat16* p_dout = (__nv_bfloat16*)dptr(d_dout) + offset;
    __nv_bfloat16* p_res = (__nv_bfloat16*)dptr(d_res) + offset;
    CUDA_CHECK(cudaMemcpy(p_inp, inp, n * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p_dout, dout, n * 2, cudaMemcpyHostToDevice));
    char problems[1024] = "";
    if (mode == GELU_FORWARD) {
        gelu_forward(p_res, p_inp, n, g_stream);
    } else if (mode == GELU_BACKWARD) {
        gelu_backward(p_res, p_dout, p_inp, n, g_stream);
    } else {
        gelu_backward(p_dout, p_dout, p_inp, n, g_stream);
    }
    sync_or_die(g_stream, name, "kernel");
    CUDA_CHECK(cudaMemcpy(res, mode == GELU_BACKWARD_IN_PLACE ? p_dout : p_res, n * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double err = rel_error_bf16(res, ref, n, &bad);
    printf("%s: %s %.2e\n", name, mode == GELU_FORWARD ? "out" : "dinp", err);
    check_written(problems, sizeof(problems), mode == GELU_FORWARD ? "out" : "dinp", bad, n);
    check_error(problems, sizeof(problems), mode == GELU_FORWARD ? "out" : "dinp", err, TOL_BF16);
    if (offset) {  // the elements before the slice are guard too
        uint16_t head[8];
        CUDA_CHECK(cudaMemcpy(head, dptr(mode == GELU_BACKWARD_IN_PLACE ? d_dout : d_res), offset * 2,
                              cudaMemcpyDeviceToHost));
        if (mode != GELU_BACKWARD_IN_PLACE)
            for (int i = 0; i < offset; i++)
                if (head[i] != 0xFFFFu) add_problem(problems, sizeof(problems), "wrote before the slice");
    }
    check_guards(problems, sizeof(problems), d_res, "out");
    check_guards(problems, sizeof(problems), d_dout, "dout");
    case_end(name, problems);
    dev_free(&d_inp), dev_free(&d_dout), dev_free(&d_res);
    free(inp), free(dout), free(res), free(x), free(dy), free(ref);
}

// ---- cross-entropy ----------------------------------------------------------------------------------

// One cross-entropy input set: logits (bf16, padding columns NaN), targets and the reference losses,
// a host buffer for what comes back, scratch rows for the reference, and the device copies.
typedef struct {
    int N, V, Vp;
    uint16_t *logits, *back;
    int* targets;
    float* losses;
    double *ref_loss, *row, *drow;
    DevBuf d_logits, d_targets, d_losses;
} CrossEntropySet;

// Logits uniform in [−6, 6); padding columns NaN; row 0 targets V − 1, row 1 targets 0, row 2 has its
// target logit raised by 20 (softmax near one-hot). Draws row by row: the target, then the logits.
static CrossEntropySet crossentropy_inputs(TestRng* rng, int N, int V, int Vp) {
    CrossEntropySet s;
    s.N = N, s.V = V, s.Vp = Vp;
    const size_t n = (size_t)N * Vp;
    s.logits = host_bf16(n), s.back = host_bf16(n);
    s.targets = (int*)host_alloc(N * sizeof(int));
    s.losses = (float*)host_alloc(N * 4);
    s.ref_loss = test_alloc(N), s.row = test_alloc(Vp), s.drow = test_alloc(Vp);
    for (int r = 0; r < N; r++) {
        s.targets[r] = r == 0 ? V - 1 : r == 1 ? 0 : (int)(test_rng_next(rng) % (uint64_t)V);
        for (int c = 0; c < Vp; c++)
            s.logits[(size_t)r * Vp + c] = c < V ? bf16_bits(test_rng_uniform(rng, -6.0, 6.0)) : 0xFFFFu;
        uint16_t* t = &s.logits[(size_t)r * Vp + s.targets[r]];
        if (r == 2) *t = bf16_bits(bf16_value(*t) + 20.0);
    }
    for (int r = 0; r < N; r++) {
        bits_to_double(s.row, s.logits + (size_t)r * Vp, Vp);
        ref_crossentropy_forward(&s.ref_loss[r], s.row, &s.targets[r], 1, V, Vp);
    }
    s.d_logits = dev_alloc(n * 2), s.d_targets = dev_alloc(N * sizeof(int)), s.d_losses = dev_alloc(N * 4);
    dev_upload(s.d_logits, s.logits, n * 2);
    dev_upload(s.d_targets, s.targets, N * sizeof(int));
    return s;
}

// Validation: losses only, the logits must come back untouched.
static void crossentropy_validation_case(CrossEntropySet* s, const char* name_val) {
    const int N = s->N, V = s->V, Vp = s->Vp;
    const size_t n = (size_t)N * Vp;
    snprintf(g_running_case, sizeof(g_running_case), "%s", name_val);
    char problems[1024] = "";
    crossentropy_forward((float*)dptr(s->d_losses), (const __nv_bfloat16*)dptr(s->d_logits),
                         (const int*)dptr(s->d_targets), N, V, Vp, g_stream);
    sync_or_die(g_stream, name_val, "kernel");
    dev_download(s->losses, s->d_losses, N * 4);
    dev_download(s->back, s->d_logits, n * 2);
    size_t bad = 0;
    double err = rel_error_f32(s->losses, s->ref_loss, N, &bad);
    double mean_loss = 0.0;
    for (int r = 0; r < N; r++) mean_loss += s->losses[r] / N;
    printf("%s: losses %.2e (mean loss %.4f)\n", name_val, err, mean_loss);
    check_written(problems, sizeof(problems), "losses", bad, N);
    check_error(problems, sizeof(problems), "losses", err, TOL_F32);
    if (memcmp(s->back, s->logits, n * 2) != 0) add_problem(problems, sizeof(problems), "logits changed");
    check_guards(problems, sizeof(problems), s->d_logits, "logits");
    check_guards(problems, sizeof(problems), s->d_losses, "losses");
    case_end(name_val, problems);
}

// ‖dlogits − ref‖/‖ref‖ over the real columns of s->back; counts non-finite real columns and padding
// columns that are not +0.
static double crossentropy_dlogits_error(CrossEntropySet* s, float dloss, size_t* bad_grad, size_t* pad_nonzero) {
    const int V = s->V, Vp = s->Vp;
    double num = 0.0, den = 0.0;
    for (int r = 0; r < s->N; r++) {
        bits_to_double(s->row, s->logits + (size_t)r * Vp, Vp);
        memset(s->drow, 0, Vp * sizeof(double));
        ref_crossentropy_backward(s->drow, s->row, &s->targets[r], (double)dloss, 1, V, Vp);
        const uint16_t* g = s->back + (size_t)r * Vp;
        for (int c = 0; c < Vp; c++) {
            if (c >= V) {
                *pad_nonzero += g[c] != 0;
                continue;
            }
            if (!bf16_is_finite(g[c])) (*bad_grad)++;
            double d = bf16_value(g[c]) - s->drow[c];
            num += d * d;
            den += s->drow[c] * s->drow[c];
        }
    }
    return sqrt(num / den);
}

// Training: losses, and dlogits written over the logits in place.
static void crossentropy_training_case(CrossEntropySet* s, const char* name_train) {
    const int N = s->N, V = s->V, Vp = s->Vp;
    const size_t n = (size_t)N * Vp;
    snprintf(g_running_case, sizeof(g_running_case), "%s", name_train);
    char problems[1024] = "";
    const float dloss = 1.0f / (float)(N * 2);  // as with 2 gradient-accumulation steps
    dev_poison(s->d_losses, 0xFF);
    crossentropy_forward_backward((float*)dptr(s->d_losses), (__nv_bfloat16*)dptr(s->d_logits),
                                  (const int*)dptr(s->d_targets), dloss, N, V, Vp, g_stream);
    sync_or_die(g_stream, name_train, "kernel");
    dev_download(s->losses, s->d_losses, N * 4);
    dev_download(s->back, s->d_logits, n * 2);
    size_t bad = 0;
    double err_loss = rel_error_f32(s->losses, s->ref_loss, N, &bad);
    check_written(problems, sizeof(problems), "losses", bad, N);
    size_t bad_grad = 0, pad_nonzero = 0;
    double err_grad = crossentropy_dlogits_error(s, dloss, &bad_grad, &pad_nonzero);
    printf("%s: losses %.2e, dlogits %.2e\n", name_train, err_loss, err_grad);
    check_written(problems, sizeof(problems), "dlogits", bad_grad, (size_t)N * V);
    check_error(problems, sizeof(problems), "losses", err_loss, TOL_F32);
    check_error(problems, sizeof(problems), "dlogits", err_grad, TOL_BF16);
    if (pad_nonzero) add_problem(problems, sizeof(problems), "%zu padding columns not set to +0", pad_nonzero);
    check_guards(problems, sizeof(problems), s->d_logits, "logits");
    check_guards(problems, sizeof(problems), s->d_losses, "losses");
    case_end(name_train, problems);
}

// Validation then training on one input set (crossentropy_inputs).
static void crossentropy_cases(int N, int V, int Vp) {
    char name_val[160], name_train[160];
    snprintf(name_val, sizeof(name_val), "crossentropy_validation_N%d_V%d_Vp%d", N, V, Vp);
    snprintf(name_train, sizeof(name_train), "crossentropy_training_N%d_V%d_Vp%d", N, V, Vp);
    if (g_counting || g_skip_why) {  // counted or skipped by case_begin
        case_begin(name_val);
        case_begin(name_train);
        return;
    }
    TestRng rng = case_rng();
    CrossEntropySet s = crossentropy_inputs(&rng, N, V, Vp);
    crossentropy_validation_case(&s, name_val);
    crossentropy_training_case(&s, name_train);
    dev_free(&s.d_logits), dev_free(&s.d_targets), dev_free(&s.d_losses);
    free(s.logits), free(s.back), free(s.targets), free(s.losses), free(s.ref_loss), free(s.row), free(s.drow);
}

// ---- AdamW ------------------------------------------------------------------------------------------

// Host side of an AdamW case: the initial master weights, what comes back (master, m, v, the bf16
// params), one step's gradients, and the fp64 reference (params, m, v, the scaled gradients).
typedef struct {
    size_t n;
    float *master0, *master, *m, *v;
    uint16_t *grads, *params;
    double *ref_p, *ref_m, *ref_v, *g;
} AdamwHost;

// Device buffers (between guards) and the slices the update works on, `offset` elements in.
typedef struct {
    DevBuf master, params, grads, m, v, scale;
    float *p_master, *p_m, *p_v;
    __nv_bfloat16 *p_params, *p_grads;
} AdamwDev;

// Allocates the host buffers and draws the initial master weights.
static AdamwHost adamw_inputs(TestRng* rng, size_t n) {
    AdamwHost h;
    h.n = n;
    h.master0 = (float*)host_alloc(n * 4);
    h.master = (float*)host_alloc(n * 4), h.m = (float*)host_alloc(n * 4), h.v = (float*)host_alloc(n * 4);
    h.grads = host_bf16(n), h.params = host_bf16(n);
    h.ref_p = test_alloc(n), h.ref_m = test_alloc(n), h.ref_v = test_alloc(n), h.g = test_alloc(n);
    for (size_t i = 0; i < n; i++) {
        h.master0[i] = (float)test_rng_normal(rng);
        h.ref_p[i] = h.master0[i];
    }
    return h;
}

// Device buffers: master uploaded, m and v zero, the device-side scale uploaded when there is one.
static AdamwDev adamw_upload(const AdamwHost* h, int offset, float device_scale) {
    const size_t n = h->n;
    const size_t fbytes = (n + offset) * 4, hbytes = (n + offset) * 2;
    AdamwDev d;
    d.master = dev_alloc(fbytes), d.params = dev_alloc(hbytes), d.grads = dev_alloc(hbytes);
    d.m = dev_alloc(fbytes), d.v = dev_alloc(fbytes), d.scale = dev_alloc(4);
    d.p_master = (float*)dptr(d.master) + offset;
    d.p_m = (float*)dptr(d.m) + offset;
    d.p_v = (float*)dptr(d.v) + offset;
    d.p_params = (__nv_bfloat16*)dptr(d.params) + offset;
    d.p_grads = (__nv_bfloat16*)dptr(d.grads) + offset;
    CUDA_CHECK(cudaMemcpy(d.p_master, h->master0, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d.p_m, 0, n * 4));
    CUDA_CHECK(cudaMemset(d.p_v, 0, n * 4));
    if (device_scale != 0.0f) dev_upload(d.scale, &device_scale, 4);
    return d;
}

// `steps` updates, each with fresh gradients, on the device and in the reference; downloads master, m
// and v at the end. Returns how many bf16 params came back non-finite over all steps.
static size_t adamw_steps(const char* name, TestRng* rng, AdamwHost* h, const AdamwDev* d, int steps,
                          float weight_decay, float grad_scale, float device_scale) {
    const size_t n = h->n;
    const float lr = ADAMW_TEST_LR, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    const double total_scale = (double)grad_scale * (device_scale != 0.0f ? (double)device_scale : 1.0);
    size_t bad_params = 0;
    for (int step = 1; step <= steps; step++) {
        fill_bf16_normal(rng, h->grads, NULL, n, 0.01, 0.0);
        for (size_t i = 0; i < n; i++) h->g[i] = bf16_value(h->grads[i]) * total_scale;
        ref_adamw_step(h->ref_p, h->g, h->ref_m, h->ref_v, n, lr, beta1, beta2, eps, weight_decay, step);
        CUDA_CHECK(cudaMemcpy(d->p_grads, h->grads, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(d->p_params, 0xFF, n * 2));
        adamw_update(d->p_master, d->p_params, d->p_grads, d->p_m, d->p_v, n, lr, beta1, beta2, eps, weight_decay,
                     step, grad_scale, device_scale != 0.0f ? (const float*)dptr(d->scale) : NULL, g_stream);
        sync_or_die(g_stream, name, "kernel");
        CUDA_CHECK(cudaMemcpy(h->params, d->p_params, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) bad_params += !bf16_is_finite(h->params[i]);
    }
    CUDA_CHECK(cudaMemcpy(h->master, d->p_master, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(h->m, d->p_m, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(h->v, d->p_v, n * 4, cudaMemcpyDeviceToHost));
    return bad_params;
}

// Master weights, their change, m, v and the bf16 copy against the reference; the guards, and the
// elements before an unaligned slice.
static void adamw_check(const char* name, const AdamwHost* h, const AdamwDev* d, int steps, int offset,
                        size_t bad_params, char* problems, size_t size) {
    const size_t n = h->n;
    size_t bad = 0, copy_mismatch = 0;
    double err_p = rel_error_f32(h->master, h->ref_p, n, &bad);
    double err_m = rel_error_f32(h->m, h->ref_m, n, &bad);
    double err_v = rel_error_f32(h->v, h->ref_v, n, &bad);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double dd = ((double)h->master[i] - h->master0[i]) - (h->ref_p[i] - h->master0[i]);
        num += dd * dd;
        const double change = h->ref_p[i] - h->master0[i], step = ADAMW_TEST_LR;
        den += change * change > step * step ? change * change : step * step;
        copy_mismatch += h->params[i] != test_float_to_bf16(h->master[i]);
    }
    double err_delta = sqrt(num / den);
    double err_params = rel_error_bf16(h->params, h->ref_p, n, NULL);
    printf("%s: master %.2e, update %.2e, m %.2e, v %.2e, bf16 params %.2e (%d steps)\n", name, err_p, err_delta, err_m,
           err_v, err_params, steps);
    check_written(problems, size, "master/m/v", bad, 3 * n);
    check_written(problems, size, "params", bad_params, steps * n);
    check_error(problems, size, "master", err_p, TOL_F32);
    check_error(problems, size, "master update (master − initial)", err_delta, TOL_UPDATE);
    check_error(problems, size, "m", err_m, TOL_F32);
    check_error(problems, size, "v", err_v, TOL_F32);
    check_error(problems, size, "bf16 params", err_params, TOL_BF16);
    if (copy_mismatch) add_problem(problems, size, "%zu bf16 params are not the rounded master weights", copy_mismatch);
    if (offset) {
        unsigned char head[32];
        CUDA_CHECK(cudaMemcpy(head, dptr(d->master), offset * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < offset * 4; i++)
            if (head[i] != 0xFFu) {
                add_problem(problems, size, "wrote before the master slice");
                break;
            }
    }
    check_guards(problems, size, d->master, "master");
    check_guards(problems, size, d->params, "params");
    check_guards(problems, size, d->m, "m");
    check_guards(problems, size, d->v, "v");
}

// `steps` steps over n elements with fresh bf16 gradients each step. grad_scale multiplies on the
// host side of the call, device_scale (0: none) through grad_scale_device. offset: elements by which
// every pointer is moved off 16-byte alignment.
static void adamw_case(size_t n, float weight_decay, float grad_scale, float device_scale, int offset) {
    char name[160];
    snprintf(name, sizeof(name), "adamw_n%zu_wd%g_scale%g%s%s", n, weight_decay, grad_scale,
             device_scale != 0.0f ? "_devscale" : "", offset ? "_unaligned" : "");
    if (!case_begin(name)) return;
    const int steps = 4;
    TestRng rng = case_rng();
    AdamwHost h = adamw_inputs(&rng, n);
    AdamwDev d = adamw_upload(&h, offset, device_scale);
    char problems[1024] = "";
    size_t bad_params = adamw_steps(name, &rng, &h, &d, steps, weight_decay, grad_scale, device_scale);
    adamw_check(name, &h, &d, steps, offset, bad_params, problems, sizeof(problems));
    case_end(name, problems);

    dev_free(&d.master), dev_free(&d.params), dev_free(&d.grads), dev_free(&d.m), dev_free(&d.v), dev_free(&d.scale);
    free(h.master0), free(h.master), free(h.m), free(h.v), free(h.grads), free(h.params);
    free(h.ref_p), free(h.ref_m), free(h.ref_v), free(h.g);
}

// ---- global norm ------------------------------------------------------------------------------------

static void global_norm_case(size_t n, int offset, int squared) {
    char name[160];
    snprintf(name, sizeof(name), "global_norm%s_n%zu%s", squared ? "_squared" : "", n, offset ? "_unaligned" : "");
    if (!case_begin(name)) return;
    TestRng rng = case_rng();
    uint16_t* x = host_bf16(n);
    fill_bf16_normal(&rng, x, NULL, n, 1.0, 0.0);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += bf16_value(x[i]) * bf16_value(x[i]);
    double ref = squared ? sum : sqrt(sum);
    DevBuf d_x = dev_alloc((n + offset) * 2), d_out = dev_alloc(8), d_scratch = dev_alloc(global_norm_scratch_bytes());
    __nv_bfloat16* p_x = (__nv_bfloat16*)dptr(d_x) + offset;
    CUDA_CHECK(cudaMemcpy(p_x, x, n * 2, cudaMemcpyHostToDevice));
    char problems[1024] = "";
    float out[2];
    for (int run = 0; run < 2; run++) {
        dev_poison(d_scratch, run ? 0x00 : 0xFF);
        dev_poison(d_out, 0xFF);
        if (squared) global_norm_squared((float*)dptr(d_out), (float*)dptr(d_scratch), p_x, n, g_stream);
        else global_norm((float*)dptr(d_out), (float*)dptr(d_scratch), p_x, n, g_stream);
        sync_or_die(g_stream, name, "kernel");
        dev_download(&out[run], d_out, 4);
    }
    size_t bad = 0;
    double err = rel_error_f32(&out[0], &ref, 1, &bad);
    int identical = memcmp(&out[0], &out[1], 4) == 0;
    printf("%s: %.9g (reference %.9g), error %.2e, repeat %s\n", name, (double)out[0], ref, err,
           identical ? "bit-identical" : "DIFFERS");
    check_written(problems, sizeof(problems), "norm", bad, 1);
    check_error(problems, sizeof(problems), "norm", err, TOL_F32);
    if (!identical) add_problem(problems, sizeof(problems), "second run differs (not deterministic)");
    check_guards(problems, sizeof(problems), d_out, "out");
    check_guards(problems, sizeof(problems), d_scratch, "scratch");
    check_guards(problems, sizeof(problems), d_x, "x");
    case_end(name, problems);
    dev_free(&d_x), dev_free(&d_out), dev_free(&d_scratch);
    free(x);
}

// x[i] = 1024 for i >= 2^32 (so a 32-bit index that wraps is seen), else 1 when i % 3 == 0, else 0.5.
static __global__ void fill_pattern_kernel(__nv_bfloat16* x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(i >= (1ull << 32) ? 1024.0f : i % 3 == 0 ? 1.0f : 0.5f);
}

static void global_norm_huge_case(void) {
    const size_t n = (1ull << 32) + 37;
    char name[160];
    snprintf(name, sizeof(name), "global_norm_n%zu_size_t", n);
    if (!case_begin(name)) return;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (free_bytes < n * 2 + (1ull << 30)) {
        g_running_case[0] = 0;
        test_skip(name, "needs 9.6 GB of free GPU memory");
        return;
    }
    __nv_bfloat16* x;
    float *out, *scratch;
    CUDA_CHECK(cudaMalloc(&x, n * 2));
    CUDA_CHECK(cudaMalloc(&out, 4));
    CUDA_CHECK(cudaMalloc(&scratch, global_norm_scratch_bytes()));
    CUDA_CHECK(cudaMemset(out, 0xFF, 4));
    CUDA_CHECK(cudaMemset(scratch, 0xFF, global_norm_scratch_bytes()));
    fill_pattern_kernel<<<4096, 256, 0, g_stream>>>(x, n);
    CUDA_CHECK(cudaGetLastError());
    global_norm(out, scratch, x, n, g_stream);
    sync_or_die(g_stream, name, "kernel");
    float got;
    CUDA_CHECK(cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost));
    const double low = 1ull << 32, ones = (double)(((1ull << 32) + 2) / 3);
    double ref = sqrt(ones * 1.0 + (low - ones) * 0.25 + 37.0 * 1024.0 * 1024.0);
    double err = fabs((double)got - ref) / ref;
    char problems[256] = "";
    printf("%s: %.9g (reference %.9g), error %.2e\n", name, (double)got, ref, err);
    check_error(problems, sizeof(problems), "norm", err, TOL_F32);
    case_end(name, problems);
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(scratch));
}

// scale = min(1, max_norm / (norm + 1e-6)) for max_norm below and above the norm.
static void global_norm_clip_scale_case(void) {
    const char* name = "global_norm_clip_scale";
    if (!case_begin(name)) return;
    float *d_norm, *d_scale;
    CUDA_CHECK(cudaMalloc(&d_norm, 4));
    CUDA_CHECK(cudaMalloc(&d_scale, 4));
    const float norm = 3.0f;
    CUDA_CHECK(cudaMemcpy(d_norm, &norm, 4, cudaMemcpyHostToDevice));
    float got[2];
    const float max_norms[2] = {1.5f, 6.0f};
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMemset(d_scale, 0xFF, 4));
        global_norm_clip_scale(d_scale, d_norm, max_norms[k], g_stream);
        sync_or_die(g_stream, name, "kernel");
        CUDA_CHECK(cudaMemcpy(&got[k], d_scale, 4, cudaMemcpyDeviceToHost));
    }
    double want0 = 1.5 / (3.0 + 1e-6);
    char problems[256] = "";
    printf("%s: %.9g (want %.9g), %.9g (want 1)\n", name, (double)got[0], want0, (double)got[1]);
    // fp32: 3 + 1e-6 rounds to 3 + 4 ulps (9.5e-7) and the quotient to 1 ulp, 3.6e-8 off in all; dropping
    // the 1e-6 would be 3.3e-7 off.
    if (!(fabs(got[0] - want0) <= 1e-7 * want0)) add_problem(problems, sizeof(problems), "clip below the norm wrong");
    if (got[1] != 1.0f) add_problem(problems, sizeof(problems), "clip above the norm is not exactly 1");
    case_end(name, problems);
    CUDA_CHECK(cudaFree(d_norm));
    CUDA_CHECK(cudaFree(d_scale));
}

// ---- argument checks (CPU only: the launchers refuse before touching the GPU) -----------------------

static void reject_layernorm_C100(void) {
    layernorm_forward(NULL, NULL, NULL, NULL, NULL, NULL, 4, 100, (cudaStream_t)0);
}
static void reject_encoder_C100(void) { encoder_forward(NULL, NULL, NULL, NULL, 1, 4, 100, (cudaStream_t)0); }
static void reject_crossentropy_Vp50257(void) {
    crossentropy_forward(NULL, NULL, NULL, 4, 50257, 50257, (cudaStream_t)0);
}

// Runs fn in a child process; passes when it exits non-zero with a message on stderr that mentions `mention`.
static void expect_rejection(const char* name, void (*fn)(void), const char* mention) {
    if (g_counting) {
        g_num_cases++;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    if (pipe(fds) != 0) {
        test_fail(name, "pipe() failed");
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        test_fail(name, "fork() failed");
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char msg[1024];
    size_t used = 0;
    ssize_t got;
    while (used + 1 < sizeof(msg) && (got = read(fds[0], msg + used, sizeof(msg) - 1 - used)) > 0) used += got;
    msg[used] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char* nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) != 0 && strstr(msg, mention) != NULL;
    test_report(name, ok, "exit status %d, message \"%s\" (want a non-zero exit and a message mentioning \"%s\")",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1, msg, mention);
}

// ---- main ---------------------------------------------------------------------------------------------

// ---- weight initialization ---------------------------------------------------------------------------

// init_weights: n = 1000003 normals with std 0.02 (written everywhere, bf16 copy = bf16(master) bit for
// bit, mean and standard deviation within 4 standard errors, about 68.3% within one std, different
// seeds and tensors give different values, the same seed the same bits), a shard [first, first + m)
// equal bit for bit to that slice of the whole tensor, and a constant fill.
static void init_weights_case(void) {
    const char* name = "init_weights_normal_shards_constant";
    if (!case_begin(name)) return;
    char problems[1024] = "";
    const size_t n = 1000003, first = 123457, m = 400001;
    const float std = 0.02f;
    DevBuf master = dev_alloc(n * sizeof(float)), params = dev_alloc(n * sizeof(uint16_t));
    DevBuf shard = dev_alloc(m * sizeof(float)), other = dev_alloc(n * sizeof(float));
    dev_poison(master, 0xFF); dev_poison(params, 0xFF); dev_poison(shard, 0xFF); dev_poison(other, 0xFF);
    const uint64_t seed = g_seed;
    init_weights((float*)dptr(master), (__nv_bfloat16*)dptr(params), n, 0, std, 0.0f, seed, 4, g_stream);
    init_weights((float*)dptr(shard), NULL, m, first, std, 0.0f, seed, 4, g_stream);
    sync_or_die(g_stream, name, "kernel");
    float* x = (float*)host_alloc(n * sizeof(float));
    float* y = (float*)host_alloc(n * sizeof(float));
    uint16_t* bits = host_bf16(n);
    dev_download(x, master, n * sizeof(float));
    dev_download(bits, params, n * sizeof(uint16_t));
    size_t nonfinite = 0, copy_mismatch = 0, within = 0;
    double sum = 0.0, sum_sq = 0.0;
    for (size_t j = 0; j < n; j++) {
        if (!isfinite(x[j])) { nonfinite++; continue; }
        if (bits[j] != test_float_to_bf16(x[j])) copy_mismatch++;
        sum += x[j];
        sum_sq += (double)x[j] * x[j];
        within += fabs(x[j]) <= std;
    }
    check_written(problems, sizeof(problems), "master", nonfinite, n);
    if (copy_mismatch) add_problem(problems, sizeof(problems), "%zu bf16 weights differ from bf16(master)", copy_mismatch);
    const double mean = sum / n, sd = sqrt(sum_sq / n - mean * mean), frac = (double)within / n;
    // Each statistic within 4 of its standard errors (a false alarm once in ~16000 runs each): std/√n for
    // the mean, 1/√(2n) relative for the std, √(p(1 − p)/n) for the fraction p within one std.
    const double frac_bound = 4 * sqrt(0.6827 * 0.3173 / n);
    printf("  init: mean %.3e (bound %.1e), std %.5f (want %.5f), within one std %.4f (want 0.6827 +- %.4f)\n", mean,
           4 * std / sqrt((double)n), sd, std, frac, frac_bound);
    if (fabs(mean) > 4 * std / sqrt((double)n)) add_problem(problems, sizeof(problems), "mean %.3e not near 0", mean);
    if (fabs(sd / std - 1) > 4 / sqrt(2.0 * n)) add_problem(problems, sizeof(problems), "std %.5f not %.5f", sd, std);
    if (fabs(frac - 0.6827) > frac_bound)
        add_problem(problems, sizeof(problems), "%.4f within one std, not 0.6827", frac);
    dev_download(y, shard, m * sizeof(float));
    if (memcmp(y, x + first, m * sizeof(float)) != 0)
        add_problem(problems, sizeof(problems), "the shard [%zu, %zu) differs from that slice of the whole tensor",
                    first, first + m);
    // the same call again: the same bits; another seed or tensor index: other values
    init_weights((float*)dptr(other), NULL, n, 0, std, 0.0f, seed, 4, g_stream);
    sync_or_die(g_stream, name, "kernel");
    dev_download(y, other, n * sizeof(float));
    if (memcmp(x, y, n * sizeof(float)) != 0) add_problem(problems, sizeof(problems), "not repeatable");
    const uint64_t seeds[2] = {seed + 1, seed};
    const int tensors[2] = {4, 5};
    for (int k = 0; k < 2; k++) {
        init_weights((float*)dptr(other), NULL, n, 0, std, 0.0f, seeds[k], tensors[k], g_stream);
        sync_or_die(g_stream, name, "kernel");
        dev_download(y, other, n * sizeof(float));
        // Two independent fp32 normals of std 0.02 are equal with probability ~4e-8: ~0.04 of 10^6
        // pairs. 100 lets chance be and still catches a block of one thread's values repeated.
        size_t same = 0;
        for (size_t j = 0; j < n; j++) same += x[j] == y[j];
        if (same > 100)
            add_problem(problems, sizeof(problems), "%s %zu of %zu values equal", k ? "another tensor:" : "another seed:",
                        same, n);
    }
    // constant fill (LayerNorm weights): every element exactly 1
    init_weights((float*)dptr(master), (__nv_bfloat16*)dptr(params), n, 0, 0.0f, 1.0f, seed, 2, g_stream);
    sync_or_die(g_stream, name, "kernel");
    dev_download(x, master, n * sizeof(float));
    dev_download(bits, params, n * sizeof(uint16_t));
    size_t not_one = 0;
    for (size_t j = 0; j < n; j++) not_one += x[j] != 1.0f || bits[j] != 0x3F80u;
    if (not_one) add_problem(problems, sizeof(problems), "constant fill: %zu elements not 1", not_one);
    check_guards(problems, sizeof(problems), master, "master");
    check_guards(problems, sizeof(problems), params, "params");
    check_guards(problems, sizeof(problems), shard, "shard");
    free(x); free(y); free(bits);
    dev_free(&master); dev_free(&params); dev_free(&shard); dev_free(&other);
    case_end(name, problems);
}

// Every case, in order; run twice by main: counting, then running (case_begin).
static void all_cases(void) {
    expect_rejection("layernorm_rejects_C_not_multiple_of_8", reject_layernorm_C100, "multiple of 8");
    expect_rejection("encoder_rejects_C_not_multiple_of_8", reject_encoder_C100, "multiple of 8");
    expect_rejection("crossentropy_rejects_Vp_not_multiple_of_8", reject_crossentropy_Vp50257, "multiple of 8");

    for (size_t r = 0; r < COUNT(ROWS); r++)
        for (size_t c = 0; c < COUNT(CHANNELS); c++) encoder_forward_case(ROWS[r], CHANNELS[c], 1000, 1024);
    encoder_forward_case(1000, 64, GPT2_VOCAB_SIZE, 50304);
    for (size_t r = 0; r < COUNT(ROWS); r++)
        for (size_t c = 0; c < COUNT(CHANNELS); c++)
            for (int mix = 0; mix < 2; mix++) {
                // the planted errors go on one N = 1 case: there a starting value could hide them
                const int plant = ROWS[r] == 1 && CHANNELS[c] == 768 && mix == TOKENS_UNIFORM;
                encoder_backward_case("encoder_backward", ROWS[r], CHANNELS[c], 1000, 1024, (TokenMix)mix, 2, plant);
            }
    encoder_backward_case("encoder_backward", 1000, 64, GPT2_VOCAB_SIZE, 50304, TOKENS_SKEWED, 2, 0);
    encoder_backward_case("encoder_backward_deterministic", 1000, 2560, 1000, 1024, TOKENS_SKEWED, 3, 0);

    for (size_t r = 0; r < COUNT(ROWS); r++)
        for (size_t c = 0; c < COUNT(CHANNELS); c++)
            layernorm_forward_case(ROWS[r], CHANNELS[c]);
    for (size_t r = 0; r < COUNT(ROWS); r++)
        for (size_t c = 0; c < COUNT(CHANNELS); c++)
            for (int with_sum = 0; with_sum <= 1; with_sum++)
                layernorm_backward_case("layernorm_backward", ROWS[r], CHANNELS[c], 2, with_sum);
    layernorm_backward_case("layernorm_backward_deterministic", 1000, 2560, 3, 1);
    layernorm_backward_case("layernorm_backward_deterministic", 1000, 768, 3, 0);
    // C/8 not a multiple of 32 (idle threads in the block sum); C > 4096 (two vectors per thread)
    layernorm_backward_case("layernorm_backward", 37, 200, 2, 1);
    layernorm_backward_case("layernorm_backward", 300, 8192, 2, 1);
    layernorm_backward_case("layernorm_backward", 37, 4104, 2, 0);

    const size_t gelu_sizes[] = {1, 37, 1000, (size_t)1000 * 4 * 768 + 5};
    for (size_t i = 0; i < COUNT(gelu_sizes); i++)
        for (int mode = 0; mode < 3; mode++) gelu_case(gelu_sizes[i], (GeluMode)mode, 0);
    gelu_case(1001, GELU_FORWARD, 1);
    gelu_case(1001, GELU_BACKWARD, 1);

    for (size_t r = 0; r < COUNT(ROWS); r++) {
        crossentropy_cases(ROWS[r], 1000, 1024);
        crossentropy_cases(ROWS[r], GPT2_VOCAB_SIZE, 50304);
    }

    const size_t adamw_sizes[] = {1, 37, 1000003};
    for (size_t i = 0; i < COUNT(adamw_sizes); i++) {
        adamw_case(adamw_sizes[i], 0.0f, 1.0f, 0.0f, 0);
        adamw_case(adamw_sizes[i], 0.1f, 1.0f, 0.0f, 0);
    }
    adamw_case(1000003, 0.1f, 0.37f, 0.0f, 0);
    adamw_case(1000003, 0.1f, 1.0f, 0.25f, 0);
    adamw_case(1001, 0.1f, 0.5f, 0.0f, 1);

    const size_t norm_sizes[] = {1, 37, 1000, 1000003};
    for (size_t i = 0; i < COUNT(norm_sizes); i++) global_norm_case(norm_sizes[i], 0, 0);
    global_norm_case(1000003, 1, 0);
    global_norm_case(1000003, 0, 1);
    global_norm_clip_scale_case();
    global_norm_huge_case();
    init_weights_case();
}

int main(void) {
    test_begin();
    g_seed = pick_and_print_seed();
    g_counting = 1;
    all_cases();
    g_counting = 0;
    test_plan(g_num_cases);

    GpuInfo gpu = gpu_info(0);
    g_skip_why = gpu_skip_reason(&gpu, "the layers");
    if (!g_skip_why) {
        printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
        printf("errors: ||x - ref|| / ||ref|| (bounds: bf16 %.0e, fp32 %.0e, AdamW's update %.0e, encoder "
               "backward's increments %.0e)\n", TOL_BF16, TOL_F32, TOL_UPDATE, TOL_INCREMENT);
        // A blocking stream: it waits for the poisoning cudaMemset calls on the default stream.
        CUDA_CHECK(cudaStreamCreate(&g_stream));
        atexit(report_exit_during_case);
    }
    all_cases();
    if (!g_skip_why) CUDA_CHECK(cudaStreamDestroy(g_stream));
    return test_end();
}
