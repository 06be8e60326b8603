// test_gpu_matmul.cu: the cuBLASLt linear layers (layers/model/matmul.cuh) against the fp64 CPU reference
// (test/cpu_reference.h: ref_matmul_forward/backward, ref_gelu_forward/backward).
//
// Tensors (row-major): inp (N, IC), weight (OC, IC), bias (OC), out and gelu_pre (N, OC) in the
// forward; dout (N, OC), gelu_pre (N, IC), dinp (N, IC), dweight (OC, IC), dbias (OC) in the backward.
//
// Input sets: N in {1, 37, 1000} × (IC, OC) in {(64, 192), (768, 2304), (768, 3072), (3072, 768),
// (768, 50304)} (the last is the LM head). Fresh inputs every run: the seed comes from the clock unless
// TEST_SEED is set, and is printed. Values are drawn uniform with unit variance (weight scaled by
// 1/√IC so pre-activations are O(1) and the GELU is exercised on both sides), rounded to bf16 on the
// host, and the fp64 reference is computed from exactly those values.
//
// Cases per input set:
// - forward: bias on/off × GELU epilogue on/off, and the two GELU variants again with the epilogues
//   off (ctx.fusion = MATMUL_FUSE_NONE: GEMM, then the GELU kernel), and timed (MATMUL_FUSE_AUTO). Checks out and, with GELU,
//   gelu_pre (the pre-activation) against inp·weightᵀ + bias and ref_gelu_forward of it.
//   matmul_forward_residual (out = residual + inp·weightᵀ + bias; dout's values as the residual):
//   bias on/off, in place (out holding the residual), and on the timing context.
// - backward: dbias on/off × dGELU on/off × accumulate on/off, and every variant with dbias or
//   dGELU again with the epilogues off (GEMM, then the dGELU / dbias reduction kernels). With dGELU,
//   dinp is checked against ref_gelu_backward(gelu_pre, dout·weight). With accumulate, dweight and
//   dbias start from nonzero random values (of the size of one micro-batch's gradient) and the
//   reference is start + gradient. Then the timed choice of paths (ctx.fusion = MATMUL_FUSE_AUTO) with
//   dbias and/or dGELU, and dbias_pre (matmul_backward_dgelu_dbias: the bias gradient of the layer
//   before the GELU) on the epilogue, kernel and timed paths, with and without accumulate: dbias_pre is
//   checked against the fp64 column sums of the dinp the call wrote (dinp itself checked as above).
// - N = 1000 only: determinism: forward and backward (bias, GELU, dbias_pre, accumulate) run twice give the
//   same bits.
// Two contexts: one with ctx.tune = 0 (cuBLASLt's first algorithm) for the epilogue and kernel
// cases, one that times its algorithms and paths (ctx.tune = 1) for the MATMUL_FUSE_AUTO cases.
// Checks: relative error ‖x − ref‖/‖ref‖ ≤ 1e-2 for every output, printed for every case with the
// path matmul.cuh took (epilogue or kernel); outputs (and the dbias scratch) are poisoned with NaN
// (0xFF bytes) before every run and every output element must be finite afterwards (written); a
// guard of poison around every output must stay untouched; the backward must leave its inputs as
// they were. Outputs sit 16 but not 32 bytes into their buffers, as weights inside a packed
// parameter buffer may. Where the fp64 reference would be slow (N·IC·OC > 2e8 multiply-adds) the
// values are checked on a random subset of rows of out/gelu_pre/dinp and of rows (output channels)
// of dweight, always including the first and the last; dbias and the written/guard checks always
// cover every element.
// CPU-only cases (size and pointer checks, scratch size) run everywhere; GPU cases are reported
// as SKIP where no GPU is found.
#include <cuda_bf16.h>
#include <time.h>
#include <unistd.h>

#include "layers/model/matmul.cuh"
#include "test/cpu_reference.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

typedef struct {
    int IC, OC;
} Dims;

static const int ROWS[] = {1, 37, 1000};
static const Dims DIMS[] = {{64, 192}, {768, 2304}, {768, 3072}, {3072, 768}, {768, 50304}};

#define TOLERANCE 1e-2
#define GUARD 136          // bf16 elements of poison before and after every output (272 bytes: 16-, not 32-byte aligned)
#define INPUT_OFFSET 8     // inputs start 8 elements (16 bytes) into their buffers
#define REF_BUDGET 2.0e8   // multiply-adds of a reference GEMM beyond which a subset is checked
#define MIN_ROWS 8
#define MIN_CHANS 32
#define UNIT_UNIFORM 1.7320508075688772  // uniform in [-√3, √3) has variance 1

typedef struct {
    int bias, gelu, unfused;
    int autofuse;  // ctx.fusion = MATMUL_FUSE_AUTO on the context that times its choices
    int residual;  // matmul_forward_residual: 1 residual apart from out, 2 in place (out holds it)
} FwdVariant;
static const FwdVariant FWD_VARIANTS[] = {{0, 0, 0, 0, 0}, {1, 0, 0, 0, 0}, {0, 1, 0, 0, 0}, {1, 1, 0, 0, 0},
                                          {0, 1, 1, 0, 0}, {1, 1, 1, 0, 0}, {0, 1, 0, 1, 0}, {1, 1, 0, 1, 0},
                                          {0, 0, 0, 0, 1}, {1, 0, 0, 0, 1}, {1, 0, 0, 0, 2}, {1, 0, 0, 1, 1}};

typedef struct {
    int bias, gelu, acc, unfused;
    int autofuse;  // ctx.fusion = MATMUL_FUSE_AUTO (timed choice) instead of MATMUL_FUSE_EPILOGUES
    int pre;       // dbias_pre: the bias gradient of the layer before the GELU (needs gelu)
} BwdVariant;
static BwdVariant BWD_VARIANTS[32];
static int NUM_BWD_VARIANTS = 0;

static void make_bwd_variants(void) {
    NUM_BWD_VARIANTS = 0;
    for (int unfused = 0; unfused <= 1; unfused++)
        for (int bias = 0; bias <= 1; bias++)
            for (int gelu = 0; gelu <= 1; gelu++)
                for (int acc = 0; acc <= 1; acc++) {
                    if (unfused && !bias && !gelu) continue;  // nothing to fuse: the same as the fused case
                    BwdVariant v = {bias, gelu, acc, unfused, 0, 0};
                    BWD_VARIANTS[NUM_BWD_VARIANTS++] = v;
                }
    // The timed choice, and dbias_pre on every path (epilogues, kernels, timed).
    for (int bias = 0; bias <= 1; bias++)
        for (int gelu = 0; gelu <= 1; gelu++) {
            if (!bias && !gelu) continue;
            BwdVariant v = {bias, gelu, 1, 0, 1, 0};
            BWD_VARIANTS[NUM_BWD_VARIANTS++] = v;
        }
    for (int fusion = 0; fusion < 3; fusion++)
        for (int acc = 0; acc <= 1; acc++) {
            BwdVariant v = {1, 1, acc, fusion == 1, fusion == 2, 1};
            BWD_VARIANTS[NUM_BWD_VARIANTS++] = v;
        }
}

static MatmulFusion bwd_fusion(const BwdVariant* v) {
    return v->unfused ? MATMUL_FUSE_NONE : v->autofuse ? MATMUL_FUSE_AUTO : MATMUL_FUSE_EPILOGUES;
}

static void fwd_name(char* buf, size_t size, int N, Dims d, const FwdVariant* v) {
    const char* residual = v->residual == 1 ? "_residual" : v->residual == 2 ? "_residual_inplace" : "";
    snprintf(buf, size, "matmul_fwd_N%d_IC%d_OC%d_%s_%s%s%s%s", N, d.IC, d.OC, v->bias ? "bias" : "nobias",
             v->gelu ? "gelu" : "nogelu", v->unfused ? "_unfused" : "", v->autofuse ? "_auto" : "", residual);
}

static void bwd_name(char* buf, size_t size, int N, Dims d, const BwdVariant* v) {
    snprintf(buf, size, "matmul_bwd_N%d_IC%d_OC%d_%s_%s_%s%s%s%s", N, d.IC, d.OC, v->bias ? "dbias" : "nodbias",
             v->gelu ? "dgelu" : "nodgelu", v->acc ? "acc" : "noacc", v->pre ? "_dbiaspre" : "",
             v->unfused ? "_unfused" : "", v->autofuse ? "_auto" : "");
}

// The determinism case runs on the largest input sets only.
static int has_determinism_case(int N) { return N == 1000; }

static void det_name(char* buf, size_t size, int N, Dims d) {
    snprintf(buf, size, "matmul_deterministic_N%d_IC%d_OC%d", N, d.IC, d.OC);
}

// ---- inputs and the reference ----------------------------------------------------------------------

typedef struct {
    int N, IC, OC;
    // bf16 bits as uploaded: inp (N, IC), weight (OC, IC), bias (OC), dout (N, OC), pre (N, IC) (the
    // backward's gelu_pre), dweight0 (OC, IC) and dbias0 (OC) (starting gradients for accumulate).
    uint16_t *inp_bits, *weight_bits, *bias_bits, *dout_bits, *pre_bits, *dweight0_bits, *dbias0_bits;
    uint16_t* dbias_pre0_bits;  // (IC): the starting dbias_pre for accumulate
    double *inp, *weight, *bias, *dout, *pre;  // the same values
    int nrows, *rows;    // rows of out, gelu_pre and dinp checked against the reference (sorted)
    int nchans, *chans;  // rows of dweight (output channels) checked (sorted)
    double* ref_mm;       // (nrows, OC): inp[rows] · weightᵀ, no bias
    double* ref_dinp;     // (nrows, IC): dout[rows] · weight, before any dGELU
    double* ref_dweight;  // (nchans, IC): dout[:, chans]ᵀ · inp
    double* ref_dbias;    // (OC): column sums of dout
} InputSet;

static void fill(TestRng* rng, uint16_t* bits, double* vals, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = test_float_to_bf16((float)(scale * test_rng_uniform(rng, -UNIT_UNIFORM, UNIT_UNIFORM)));
        if (vals) vals[i] = test_bf16_to_float(bits[i]);
    }
}

// want sorted distinct indices in [0, total), including 0 and total − 1 (all of them when want >= total).
static int* pick_subset(TestRng* rng, int total, int want, int* count) {
    int* out = (int*)host_alloc((size_t)total * sizeof(int));
    if (want >= total) {
        for (int i = 0; i < total; i++) out[i] = i;
        *count = total;
        return out;
    }
    char* taken = (char*)calloc((size_t)total, 1);
    int n = 0;
    taken[0] = taken[total - 1] = 1;
    n = total > 1 ? 2 : 1;
    while (n < want) {
        int i = (int)(test_rng_next(rng) % (uint64_t)total);
        if (!taken[i]) {
            taken[i] = 1;
            n++;
        }
    }
    int k = 0;
    for (int i = 0; i < total; i++)
        if (taken[i]) out[k++] = i;
    free(taken);
    *count = k;
    return out;
}

static double* gather_rows(const double* x, int cols, const int* rows, int nrows) {
    double* out = test_alloc((size_t)nrows * cols);
    for (int r = 0; r < nrows; r++) memcpy(out + (size_t)r * cols, x + (size_t)rows[r] * cols, cols * sizeof(double));
    return out;
}

// The references of the checked rows and channels (in->rows, in->chans): forward and dinp of the rows,
// dweight of the channels, dbias of every channel; the whole layer's backward when they are all of them.
static void make_references(InputSet* in) {
    const int N = in->N, IC = in->IC, OC = in->OC;
    const size_t n_inp = (size_t)N * IC, n_w = (size_t)OC * IC;
    in->ref_mm = test_alloc((size_t)in->nrows * OC);
    in->ref_dinp = test_alloc((size_t)in->nrows * IC);
    in->ref_dweight = test_alloc((size_t)in->nchans * IC);
    in->ref_dbias = test_alloc(OC);
    double* inp_rows = gather_rows(in->inp, IC, in->rows, in->nrows);
    ref_matmul_forward(in->ref_mm, inp_rows, in->weight, NULL, in->nrows, IC, OC);
    if (in->nrows == N && in->nchans == OC) {
        ref_matmul_backward(in->ref_dinp, in->ref_dweight, in->ref_dbias, in->dout, in->inp, in->weight, N, IC, OC);
    } else {
        // dinp of the checked rows (the dweight this call also forms is discarded).
        double* dout_rows = gather_rows(in->dout, OC, in->rows, in->nrows);
        double* junk_w = test_alloc(n_w);
        ref_matmul_backward(in->ref_dinp, junk_w, NULL, dout_rows, inp_rows, in->weight, in->nrows, IC, OC);
        free(junk_w);
        free(dout_rows);
        // dweight of the checked channels: the layer restricted to those outputs.
        double* dout_cols = test_alloc((size_t)N * in->nchans);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < in->nchans; c++)
                dout_cols[(size_t)n * in->nchans + c] = in->dout[(size_t)n * OC + in->chans[c]];
        double* weight_chans = gather_rows(in->weight, IC, in->chans, in->nchans);
        double* junk_x = test_alloc(n_inp);
        ref_matmul_backward(junk_x, in->ref_dweight, NULL, dout_cols, in->inp, weight_chans, N, IC, in->nchans);
        free(junk_x);
        free(weight_chans);
        free(dout_cols);
        // dbias of every channel: the backward of a layer with one zero input channel.
        double* zeros_n = test_alloc(N);
        double* zeros_oc = test_alloc(OC);
        double* junk_n = test_alloc(N);
        double* junk_oc = test_alloc(OC);
        ref_matmul_backward(junk_n, junk_oc, in->ref_dbias, in->dout, zeros_n, zeros_oc, N, 1, OC);
        free(zeros_n);
        free(zeros_oc);
        free(junk_n);
        free(junk_oc);
    }
    free(inp_rows);
}

static InputSet make_inputs(int N, int IC, int OC, uint64_t seed) {
    InputSet in;
    memset(&in, 0, sizeof(in));
    in.N = N;
    in.IC = IC;
    in.OC = OC;
    const size_t n_inp = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    in.inp_bits = (uint16_t*)host_alloc(n_inp * 2);
    in.weight_bits = (uint16_t*)host_alloc(n_w * 2);
    in.bias_bits = (uint16_t*)host_alloc((size_t)OC * 2);
    in.dout_bits = (uint16_t*)host_alloc(n_out * 2);
    in.pre_bits = (uint16_t*)host_alloc(n_inp * 2);
    in.dweight0_bits = (uint16_t*)host_alloc(n_w * 2);
    in.dbias0_bits = (uint16_t*)host_alloc((size_t)OC * 2);
    in.dbias_pre0_bits = (uint16_t*)host_alloc((size_t)IC * 2);
    in.inp = test_alloc(n_inp);
    in.weight = test_alloc(n_w);
    in.bias = test_alloc(OC);
    in.dout = test_alloc(n_out);
    in.pre = test_alloc(n_inp);
    TestRng rng = {seed};
    fill(&rng, in.inp_bits, in.inp, n_inp, 1.0);
    fill(&rng, in.weight_bits, in.weight, n_w, 1.0 / sqrt((double)IC));
    fill(&rng, in.bias_bits, in.bias, OC, 0.5);
    fill(&rng, in.dout_bits, in.dout, n_out, 1.0);
    fill(&rng, in.pre_bits, in.pre, n_inp, 2.0);
    fill(&rng, in.dweight0_bits, NULL, n_w, sqrt((double)N));  // about the size of one gradient
    fill(&rng, in.dbias0_bits, NULL, OC, sqrt((double)N));
    fill(&rng, in.dbias_pre0_bits, NULL, IC, sqrt((double)N));

    // Subsets where the full reference would be slow.
    const double mm = (double)N * IC * OC;
    int want_rows = N, want_chans = OC;
    if (mm > REF_BUDGET) {
        want_rows = (int)(REF_BUDGET / ((double)IC * OC));
        if (want_rows < MIN_ROWS) want_rows = MIN_ROWS;
        want_chans = (int)(REF_BUDGET / ((double)N * IC));
        if (want_chans < MIN_CHANS) want_chans = MIN_CHANS;
    }
    in.rows = pick_subset(&rng, N, want_rows, &in.nrows);
    in.chans = pick_subset(&rng, OC, want_chans, &in.nchans);
    make_references(&in);
    return in;
}

static void free_inputs(InputSet* in) {
    free(in->inp_bits);
    free(in->weight_bits);
    free(in->bias_bits);
    free(in->dout_bits);
    free(in->pre_bits);
    free(in->dweight0_bits);
    free(in->dbias0_bits);
    free(in->dbias_pre0_bits);
    free(in->inp);
    free(in->weight);
    free(in->bias);
    free(in->dout);
    free(in->pre);
    free(in->rows);
    free(in->chans);
    free(in->ref_mm);
    free(in->ref_dinp);
    free(in->ref_dweight);
    free(in->ref_dbias);
}

// ---- device buffers ----------------------------------------------------------------------------------

// Inputs sit INPUT_OFFSET elements into their buffers; outputs between guards of GUARD elements:
//   [guard | tensor | guard].
typedef struct {
    __nv_bfloat16 *inp, *weight, *bias, *dout, *pre;  // inputs (pre: the backward's gelu_pre (N, IC))
    void *inp_base, *weight_base, *bias_base, *dout_base, *pre_base;
    __nv_bfloat16 *out_buf, *pre_out_buf, *dinp_buf, *dweight_buf, *dbias_buf, *dbias_pre_buf;  // outputs with guards
    size_t n_out, n_inp, n_w, n_bias;  // elements of the tensors (without guards)
    void* scratch;
    size_t scratch_bytes;
} DeviceSet;

static __nv_bfloat16* upload_input(const uint16_t* bits, size_t n, void** base) {
    *base = device_alloc((n + INPUT_OFFSET) * 2);
    __nv_bfloat16* p = (__nv_bfloat16*)*base + INPUT_OFFSET;
    CUDA_CHECK(cudaMemcpy(p, bits, n * 2, cudaMemcpyHostToDevice));
    return p;
}

static DeviceSet device_set(const InputSet* in) {
    DeviceSet d;
    memset(&d, 0, sizeof(d));
    d.n_out = (size_t)in->N * in->OC;
    d.n_inp = (size_t)in->N * in->IC;
    d.n_w = (size_t)in->OC * in->IC;
    d.n_bias = in->OC;
    d.inp = upload_input(in->inp_bits, d.n_inp, &d.inp_base);
    d.weight = upload_input(in->weight_bits, d.n_w, &d.weight_base);
    d.bias = upload_input(in->bias_bits, d.n_bias, &d.bias_base);
    d.dout = upload_input(in->dout_bits, d.n_out, &d.dout_base);
    d.pre = upload_input(in->pre_bits, d.n_inp, &d.pre_base);
    d.out_buf = (__nv_bfloat16*)device_alloc((d.n_out + 2 * GUARD) * 2);
    d.pre_out_buf = (__nv_bfloat16*)device_alloc((d.n_out + 2 * GUARD) * 2);
    d.dinp_buf = (__nv_bfloat16*)device_alloc((d.n_inp + 2 * GUARD) * 2);
    d.dweight_buf = (__nv_bfloat16*)device_alloc((d.n_w + 2 * GUARD) * 2);
    d.dbias_buf = (__nv_bfloat16*)device_alloc((d.n_bias + 2 * GUARD) * 2);
    d.dbias_pre_buf = (__nv_bfloat16*)device_alloc(((size_t)in->IC + 2 * GUARD) * 2);
    d.scratch_bytes = matmul_dbias_scratch_bytes(in->N, in->OC > in->IC ? in->OC : in->IC);
    d.scratch = device_alloc(d.scratch_bytes);
    return d;
}

static void free_device_set(DeviceSet* d) {
    void* ptrs[] = {d->inp_base, d->weight_base, d->bias_base, d->dout_base, d->pre_base, d->out_buf,
                    d->pre_out_buf, d->dinp_buf, d->dweight_buf, d->dbias_buf, d->dbias_pre_buf, d->scratch};
    for (size_t i = 0; i < COUNT(ptrs); i++) CUDA_CHECK(cudaFree(ptrs[i]));
}

static uint16_t* fetch(const void* dev, size_t n) {
    uint16_t* h = (uint16_t*)host_alloc(n * 2);
    CUDA_CHECK(cudaMemcpy(h, dev, n * 2, cudaMemcpyDeviceToHost));
    return h;
}

// Copies back a guarded output of n elements and adds to problems: unwritten or non-finite elements,
// bytes of the guards changed. Returns the host copy (the tensor starts at GUARD).
static uint16_t* fetch_output(const __nv_bfloat16* buf, size_t n, const char* what, char* problems, size_t size) {
    uint16_t* h = fetch(buf, n + 2 * GUARD);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!bf16_is_finite(h[GUARD + i]) && bad++ == 0) first = i;
    if (bad) add_problem(problems, size, "%zu of %zu %s elements non-finite or unwritten (first at %zu)", bad, n, what, first);
    if (changed_poison_bytes(h, GUARD * 2) || changed_poison_bytes(h + GUARD + n, GUARD * 2))
        add_problem(problems, size, "wrote outside %s", what);
    return h;
}

// Rows `rows` of a row-major bf16 (·, cols) tensor as doubles (nrows, cols).
static double* rows_to_double(const uint16_t* x, int cols, const int* rows, int nrows) {
    double* out = test_alloc((size_t)nrows * cols);
    for (int r = 0; r < nrows; r++)
        for (int c = 0; c < cols; c++) out[(size_t)r * cols + c] = test_bf16_to_float(x[(size_t)rows[r] * cols + c]);
    return out;
}

static void check_error(char* problems, size_t size, const char* what, double err) {
    if (!(err <= TOLERANCE)) add_problem(problems, size, "%s relative error %.3e > %.0e", what, err, TOLERANCE);
}

// ---- one forward case --------------------------------------------------------------------------------

static void run_forward(MatmulContext* ctx, const DeviceSet* d, const InputSet* in, const FwdVariant* v) {
    CUDA_CHECK(cudaMemset(d->out_buf, 0xFF, (d->n_out + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d->pre_out_buf, 0xFF, (d->n_out + 2 * GUARD) * 2));
    ctx->fusion = v->unfused ? MATMUL_FUSE_NONE : v->autofuse ? MATMUL_FUSE_AUTO : MATMUL_FUSE_EPILOGUES;
    const __nv_bfloat16* bias = v->bias ? d->bias : NULL;
    if (v->residual) {  // the residual is dout's values (N, OC), copied into out for the in-place case
        const __nv_bfloat16* residual = d->dout;
        if (v->residual == 2) {
            CUDA_CHECK(cudaMemcpy(d->out_buf + GUARD, d->dout, d->n_out * 2, cudaMemcpyDeviceToDevice));
            residual = d->out_buf + GUARD;
        }
        matmul_forward_residual(ctx, d->out_buf + GUARD, residual, d->inp, d->weight, bias, in->N, in->IC, in->OC);
        return;
    }
    matmul_forward(ctx, d->out_buf + GUARD, d->inp, d->weight, bias, in->N, in->IC, in->OC,
                   v->gelu ? d->pre_out_buf + GUARD : NULL);
}

static void forward_case(MatmulContext* ctx, const DeviceSet* d, const InputSet* in, const FwdVariant* v,
                         const char* name) {
    const int OC = in->OC, nrows = in->nrows;
    char problems[1024] = "";
    run_forward(ctx, d, in, v);
    sync_or_die(NULL, name, "forward");
    const char* path = ctx->last_forward;

    uint16_t* out = fetch_output(d->out_buf, d->n_out, "out", problems, sizeof(problems));
    uint16_t* pre = v->gelu ? fetch_output(d->pre_out_buf, d->n_out, "gelu_pre", problems, sizeof(problems)) : NULL;
    uint16_t* inp_after = fetch(d->inp, d->n_inp);
    uint16_t* w_after = fetch(d->weight, d->n_w);
    uint16_t* residual_after = fetch(d->dout, d->n_out);
    if (memcmp(inp_after, in->inp_bits, d->n_inp * 2) || memcmp(w_after, in->weight_bits, d->n_w * 2) ||
        memcmp(residual_after, in->dout_bits, d->n_out * 2))
        add_problem(problems, sizeof(problems), "inp, weight or residual changed");

    // Reference on the checked rows: pre = inp·weightᵀ + bias (+ residual), out = GELU(pre) or pre.
    const size_t n = (size_t)nrows * OC;
    double* ref_pre = test_alloc(n);
    for (int r = 0; r < nrows; r++)
        for (int o = 0; o < OC; o++)
            ref_pre[(size_t)r * OC + o] = in->ref_mm[(size_t)r * OC + o] + (v->bias ? in->bias[o] : 0.0) +
                                          (v->residual ? in->dout[(size_t)in->rows[r] * OC + o] : 0.0);
    double* ref_out = ref_pre;
    if (v->gelu) {
        ref_out = test_alloc(n);
        ref_gelu_forward(ref_out, ref_pre, n);
    }
    double* gpu_out = rows_to_double(out + GUARD, OC, in->rows, nrows);
    double err_out = test_rel_error(gpu_out, ref_out, n), err_pre = 0.0;
    check_error(problems, sizeof(problems), "out", err_out);
    if (v->gelu) {
        double* gpu_pre = rows_to_double(pre + GUARD, OC, in->rows, nrows);
        err_pre = test_rel_error(gpu_pre, ref_pre, n);
        check_error(problems, sizeof(problems), "gelu_pre", err_pre);
        free(gpu_pre);
        printf("%s: out %.2e gelu_pre %.2e [%s] (rows checked %d/%d)\n", name, err_out, err_pre, path, nrows, in->N);
    } else {
        printf("%s: out %.2e [%s] (rows checked %d/%d)\n", name, err_out, path, nrows, in->N);
    }
    test_report(name, problems[0] == 0, "%s", problems);

    if (ref_out != ref_pre) free(ref_out);
    free(ref_pre);
    free(gpu_out);
    free(out);
    free(pre);
    free(inp_after);
    free(w_after);
    free(residual_after);
}

// ---- one backward case -------------------------------------------------------------------------------

static void run_backward(MatmulContext* ctx, const DeviceSet* d, const InputSet* in, const BwdVariant* v) {
    CUDA_CHECK(cudaMemset(d->dinp_buf, 0xFF, (d->n_inp + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d->dweight_buf, 0xFF, (d->n_w + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d->dbias_buf, 0xFF, (d->n_bias + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d->dbias_pre_buf, 0xFF, ((size_t)in->IC + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d->scratch, 0xFF, d->scratch_bytes));
    if (v->acc) {
        CUDA_CHECK(cudaMemcpy(d->dweight_buf + GUARD, in->dweight0_bits, d->n_w * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d->dbias_buf + GUARD, in->dbias0_bits, d->n_bias * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d->dbias_pre_buf + GUARD, in->dbias_pre0_bits, (size_t)in->IC * 2, cudaMemcpyHostToDevice));
    }
    ctx->fusion = bwd_fusion(v);
    matmul_backward_dgelu_dbias(ctx, d->dinp_buf + GUARD, d->dweight_buf + GUARD, v->bias ? d->dbias_buf + GUARD : NULL,
                                d->dout, d->inp, d->weight, in->N, in->IC, in->OC, v->gelu ? d->pre : NULL, v->acc,
                                (v->bias || v->pre) ? d->scratch : NULL, v->pre ? d->dbias_pre_buf + GUARD : NULL);
}

// The backward's inputs must come back as they were uploaded.
static void check_backward_inputs_unchanged(const DeviceSet* d, const InputSet* in, char* problems, size_t size) {
    const uint16_t* bits[] = {in->inp_bits, in->weight_bits, in->dout_bits, in->pre_bits};
    const __nv_bfloat16* dev[] = {d->inp, d->weight, d->dout, d->pre};
    const size_t sizes[] = {d->n_inp, d->n_w, d->n_out, d->n_inp};
    const char* names[] = {"inp", "weight", "dout", "gelu_pre"};
    for (int t = 0; t < 4; t++) {
        uint16_t* after = fetch(dev[t], sizes[t]);
        if (memcmp(after, bits[t], sizes[t] * 2) != 0) add_problem(problems, size, "%s changed", names[t]);
        free(after);
    }
}

// dinp on the checked rows: dout·weight, times GELU'(gelu_pre) with dGELU. dinp: the fetched buffer,
// guards included. Returns the relative error (checked against the bound).
static double backward_dinp_error(const InputSet* in, const BwdVariant* v, const uint16_t* dinp, char* problems,
                                  size_t size) {
    const int IC = in->IC, nrows = in->nrows;
    const size_t n_dinp = (size_t)nrows * IC;
    double* ref_dinp = in->ref_dinp;
    if (v->gelu) {
        double* pre_rows = gather_rows(in->pre, IC, in->rows, nrows);
        ref_dinp = test_alloc(n_dinp);  // zeroed: ref_gelu_backward adds into it
        ref_gelu_backward(ref_dinp, in->ref_dinp, pre_rows, n_dinp);
        free(pre_rows);
    }
    double* gpu_dinp = rows_to_double(dinp + GUARD, IC, in->rows, nrows);
    double err_dinp = test_rel_error(gpu_dinp, ref_dinp, n_dinp);
    check_error(problems, size, "dinp", err_dinp);
    if (ref_dinp != in->ref_dinp) free(ref_dinp);
    free(gpu_dinp);
    return err_dinp;
}

// dweight on the checked channels, on top of the starting gradient when accumulating.
static double backward_dweight_error(const InputSet* in, const BwdVariant* v, const uint16_t* dweight, char* problems,
                                     size_t size) {
    const int IC = in->IC, nchans = in->nchans;
    const size_t n_dw = (size_t)nchans * IC;
    double* ref_dw = test_alloc(n_dw);
    for (int c = 0; c < nchans; c++)
        for (int i = 0; i < IC; i++) {
            size_t at = (size_t)in->chans[c] * IC + i;
            ref_dw[(size_t)c * IC + i] =
                in->ref_dweight[(size_t)c * IC + i] + (v->acc ? test_bf16_to_float(in->dweight0_bits[at]) : 0.0);
        }
    double* gpu_dw = rows_to_double(dweight + GUARD, IC, in->chans, nchans);
    double err_dw = test_rel_error(gpu_dw, ref_dw, n_dw);
    check_error(problems, size, "dweight", err_dw);
    free(ref_dw);
    free(gpu_dw);
    return err_dw;
}

// dbias_pre: the column sums of the dinp written (itself checked on its rows), in fp64, on top of the
// starting values when accumulating. Prints its error with the paths taken.
static void check_backward_dbias_pre(const InputSet* in, const BwdVariant* v, const uint16_t* dinp,
                                     const uint16_t* dbias_pre, const char* name, const char* dinp_path,
                                     const char* dbias_pre_path, char* problems, size_t size) {
    const int IC = in->IC;
    double* ref_dbp = test_alloc(IC);
    double* gpu_dbp = test_alloc(IC);
    for (int n = 0; n < in->N; n++)
        for (int i = 0; i < IC; i++) ref_dbp[i] += test_bf16_to_float(dinp[GUARD + (size_t)n * IC + i]);
    for (int i = 0; i < IC; i++) {
        if (v->acc) ref_dbp[i] += test_bf16_to_float(in->dbias_pre0_bits[i]);
        gpu_dbp[i] = test_bf16_to_float(dbias_pre[GUARD + i]);
    }
    double err_dbp = test_rel_error(gpu_dbp, ref_dbp, IC);
    check_error(problems, size, "dbias_pre", err_dbp);
    printf("%s: dbias_pre %.2e [dinp: %s; dbias_pre: %s]\n", name, err_dbp, dinp_path, dbias_pre_path);
    free(ref_dbp);
    free(gpu_dbp);
}

// dbias of every channel, on top of the starting values when accumulating.
static double backward_dbias_error(const InputSet* in, const BwdVariant* v, const uint16_t* dbias, char* problems,
                                   size_t size) {
    const int OC = in->OC;
    double* ref_db = test_alloc(OC);
    double* gpu_db = test_alloc(OC);
    for (int o = 0; o < OC; o++) {
        ref_db[o] = in->ref_dbias[o] + (v->acc ? test_bf16_to_float(in->dbias0_bits[o]) : 0.0);
        gpu_db[o] = test_bf16_to_float(dbias[GUARD + o]);
    }
    double err_db = test_rel_error(gpu_db, ref_db, OC);
    check_error(problems, size, "dbias", err_db);
    free(ref_db);
    free(gpu_db);
    return err_db;
}

static void backward_case(MatmulContext* ctx, const DeviceSet* d, const InputSet* in, const BwdVariant* v,
                          const char* name) {
    const int IC = in->IC, OC = in->OC, nrows = in->nrows, nchans = in->nchans;
    char problems[1024] = "";
    run_backward(ctx, d, in, v);
    sync_or_die(NULL, name, "backward");
    const char* dinp_path = ctx->last_dinp;
    const char* dbias_path = ctx->last_dbias;
    const char* dbias_pre_path = ctx->last_dbias_pre;

    uint16_t* dinp = fetch_output(d->dinp_buf, d->n_inp, "dinp", problems, sizeof(problems));
    uint16_t* dweight = fetch_output(d->dweight_buf, d->n_w, "dweight", problems, sizeof(problems));
    uint16_t* dbias = v->bias ? fetch_output(d->dbias_buf, d->n_bias, "dbias", problems, sizeof(problems)) : NULL;
    uint16_t* dbias_pre =
        v->pre ? fetch_output(d->dbias_pre_buf, (size_t)IC, "dbias_pre", problems, sizeof(problems)) : NULL;
    check_backward_inputs_unchanged(d, in, problems, sizeof(problems));

    double err_dinp = backward_dinp_error(in, v, dinp, problems, sizeof(problems));
    double err_dw = backward_dweight_error(in, v, dweight, problems, sizeof(problems));
    if (v->pre)
        check_backward_dbias_pre(in, v, dinp, dbias_pre, name, dinp_path, dbias_pre_path, problems, sizeof(problems));
    if (v->bias) {
        double err_db = backward_dbias_error(in, v, dbias, problems, sizeof(problems));
        printf("%s: dinp %.2e dweight %.2e dbias %.2e [dinp: %s; dbias: %s] (rows %d/%d, channels %d/%d)\n", name,
               err_dinp, err_dw, err_db, dinp_path, dbias_path, nrows, in->N, nchans, OC);
    } else {
        printf("%s: dinp %.2e dweight %.2e [dinp: %s] (rows %d/%d, channels %d/%d)\n", name, err_dinp, err_dw,
               dinp_path, nrows, in->N, nchans, OC);
    }
    test_report(name, problems[0] == 0, "%s", problems);

    free(dinp);
    free(dweight);
    free(dbias);
    free(dbias_pre);
}

// ---- determinism ---------------------------------------------------------------------------------------

static void determinism_case(MatmulContext* ctx, const DeviceSet* d, const InputSet* in, const char* name) {
    const FwdVariant fv = {1, 1, 0, 0, 0};
    const BwdVariant bv = {1, 1, 1, 0, 0, 1};  // with dbias_pre (the DGELU_BGRAD epilogue)
    const size_t sizes[6] = {d->n_out, d->n_out, d->n_inp, d->n_w, d->n_bias, (size_t)in->IC};
    const __nv_bfloat16* bufs[6] = {d->out_buf, d->pre_out_buf, d->dinp_buf, d->dweight_buf, d->dbias_buf,
                                    d->dbias_pre_buf};
    const char* names[6] = {"out", "gelu_pre", "dinp", "dweight", "dbias", "dbias_pre"};
    uint16_t* first[6];
    char problems[512] = "";
    for (int run = 0; run < 2; run++) {
        run_forward(ctx, d, in, &fv);
        run_backward(ctx, d, in, &bv);
        sync_or_die(NULL, name, run == 0 ? "first run" : "second run");
        for (int t = 0; t < 6; t++) {
            uint16_t* h = fetch(bufs[t] + GUARD, sizes[t]);
            if (run == 0) {
                first[t] = h;
                continue;
            }
            size_t differ = 0;
            for (size_t i = 0; i < sizes[t]; i++) differ += h[i] != first[t][i];
            if (differ) add_problem(problems, sizeof(problems), "%zu of %zu %s elements differ between runs", differ, sizes[t], names[t]);
            free(h);
            free(first[t]);
        }
    }
    printf("%s: [forward: %s; dinp: %s; dbias: %s]\n", name, ctx->last_forward, ctx->last_dinp, ctx->last_dbias);
    test_report(name, problems[0] == 0, "%s", problems);
}

// ---- CPU-only cases ----------------------------------------------------------------------------------

// The named cases of cpu_cases.
#define CPU_CASES 6

static void cpu_cases(void) {
    char why[512];
    {
        const char* name = "matmul_check_rejects_IC_not_multiple_of_8";
        why[0] = 0;
        int rc = matmul_check_sizes(37, 100, 192, why, sizeof(why));
        test_report(name, rc != 0 && strstr(why, "IC = 100") && strstr(why, "multiple of 8"),
                    "returned %d with \"%s\" (want -1 and a message naming IC = 100 and multiples of 8)", rc, why);
    }
    {
        const char* name = "matmul_check_rejects_OC_not_multiple_of_8";
        why[0] = 0;
        int rc = matmul_check_sizes(37, 768, 50257, why, sizeof(why));
        test_report(name, rc != 0 && strstr(why, "OC = 50257") && strstr(why, "multiple of 8"),
                    "returned %d with \"%s\" (want -1 and a message naming OC = 50257 and multiples of 8)", rc, why);
    }
    {
        const char* name = "matmul_check_rejects_N_0";
        why[0] = 0;
        int rc = matmul_check_sizes(0, 768, 768, why, sizeof(why));
        test_report(name, rc != 0 && strstr(why, "N = 0"), "returned %d with \"%s\"", rc, why);
    }
    {
        const char* name = "matmul_check_accepts_trainer_sizes";
        const int sizes[][3] = {{1, 8, 8}, {131072, 768, 2304}, {131072, 2560, 10240}, {131072, 10240, 2560},
                                {131072, 768, 50304}, {131072, 2560, 50304}, {37, 64, 192}};
        char bad[512] = "";
        for (size_t i = 0; i < COUNT(sizes); i++)
            if (matmul_check_sizes(sizes[i][0], sizes[i][1], sizes[i][2], why, sizeof(why)) != 0)
                add_problem(bad, sizeof(bad), "N=%d IC=%d OC=%d refused: %s", sizes[i][0], sizes[i][1], sizes[i][2], why);
        test_report(name, bad[0] == 0, "%s", bad);
    }
    {
        const char* name = "matmul_check_pointer_alignment";
        char bad[1024] = "";
        if (matmul_check_pointer("inp", (const void*)(uintptr_t)0x7f0000001008ull, why, sizeof(why)) == 0)
            add_problem(bad, sizeof(bad), "an 8-byte aligned pointer was accepted");
        else if (!strstr(why, "inp") || !strstr(why, "16-byte"))
            add_problem(bad, sizeof(bad), "message \"%s\" does not name the tensor and the 16-byte rule", why);
        if (matmul_check_pointer("weight", (const void*)(uintptr_t)0x7f0000001010ull, why, sizeof(why)) != 0)
            add_problem(bad, sizeof(bad), "a 16-byte aligned pointer was refused: %s", why);
        if (matmul_check_pointer("dweight", NULL, why, sizeof(why)) == 0)
            add_problem(bad, sizeof(bad), "NULL was accepted");
        test_report(name, bad[0] == 0, "%s", bad);
    }
    {
        const char* name = "matmul_dbias_scratch_bytes";
        char bad[512] = "";
        size_t big = matmul_dbias_scratch_bytes(131072, 10240);
        if (big != (size_t)MATMUL_DBIAS_MAX_CHUNKS * 10240 * sizeof(float))
            add_problem(bad, sizeof(bad), "N=131072 OC=10240: %zu bytes", big);
        if (matmul_dbias_scratch_bytes(1, 768) < 768 * 2)  // the BGRADB path keeps OC bf16 values there
            add_problem(bad, sizeof(bad), "N=1: %zu bytes, less than OC bf16 values", matmul_dbias_scratch_bytes(1, 768));
        for (int N = 1; N < 10000; N += 7)
            if (matmul_dbias_scratch_bytes(N + 7, 768) < matmul_dbias_scratch_bytes(N, 768)) {
                add_problem(bad, sizeof(bad), "decreases from N=%d to N=%d", N, N + 7);
                break;
            }
        test_report(name, bad[0] == 0, "%s", bad);
    }
}

// ---- main --------------------------------------------------------------------------------------------

// Every case of this run, with or without a GPU (without one, the GPU cases are reported as skipped).
static int num_cases(void) {
    int n = CPU_CASES;
    for (size_t r = 0; r < COUNT(ROWS); r++)
        n += (int)COUNT(DIMS) * ((int)COUNT(FWD_VARIANTS) + NUM_BWD_VARIANTS + has_determinism_case(ROWS[r]));
    return n;
}

int main(void) {
    test_begin();
    make_bwd_variants();
    test_plan(num_cases());
    uint64_t seed = pick_and_print_seed();

    cpu_cases();

    GpuInfo gpu = gpu_info(0);
    const char* skip_why = gpu_skip_reason(&gpu, "bf16 GEMMs");
    char name[160];
    if (skip_why) {
        for (size_t r = 0; r < COUNT(ROWS); r++)
            for (size_t s = 0; s < COUNT(DIMS); s++) {
                for (size_t v = 0; v < COUNT(FWD_VARIANTS); v++) {
                    fwd_name(name, sizeof(name), ROWS[r], DIMS[s], &FWD_VARIANTS[v]);
                    test_skip(name, skip_why);
                }
                for (int v = 0; v < NUM_BWD_VARIANTS; v++) {
                    bwd_name(name, sizeof(name), ROWS[r], DIMS[s], &BWD_VARIANTS[v]);
                    test_skip(name, skip_why);
                }
                if (has_determinism_case(ROWS[r])) {
                    det_name(name, sizeof(name), ROWS[r], DIMS[s]);
                    test_skip(name, skip_why);
                }
            }
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs; cuBLASLt version %zu\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms,
           cublasLtGetVersion());
    printf("errors: ||x - ref|| / ||ref|| (bound %.0e); [..] names the path matmul.cuh took\n", TOLERANCE);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered after the poisoning cudaMemsets on the default stream
    MatmulContext ctx;
    matmul_context_create(&ctx, stream);  // ctx.tune = 0: the heuristic's first algorithm
    MatmulContext tuned;                   // timed algorithms and paths: the MATMUL_FUSE_AUTO cases
    matmul_context_create(&tuned, stream);
    tuned.tune = 1;
    atexit(report_exit_during_case);

    uint64_t set_index = 0;
    for (size_t r = 0; r < COUNT(ROWS); r++)
        for (size_t s = 0; s < COUNT(DIMS); s++) {
            const int N = ROWS[r];
            const Dims dims = DIMS[s];
            // One generator per input set, so a set's inputs depend only on the seed and its place.
            InputSet in = make_inputs(N, dims.IC, dims.OC, seed + 0x9E3779B97F4A7C15ull * ++set_index);
            DeviceSet d = device_set(&in);
            for (size_t v = 0; v < COUNT(FWD_VARIANTS); v++) {
                fwd_name(g_running_case, sizeof(g_running_case), N, dims, &FWD_VARIANTS[v]);
                snprintf(name, sizeof(name), "%s", g_running_case);
                forward_case(FWD_VARIANTS[v].autofuse ? &tuned : &ctx, &d, &in, &FWD_VARIANTS[v], name);
                g_running_case[0] = 0;
            }
            for (int v = 0; v < NUM_BWD_VARIANTS; v++) {
                bwd_name(g_running_case, sizeof(g_running_case), N, dims, &BWD_VARIANTS[v]);
                snprintf(name, sizeof(name), "%s", g_running_case);
                backward_case(BWD_VARIANTS[v].autofuse ? &tuned : &ctx, &d, &in, &BWD_VARIANTS[v], name);
                g_running_case[0] = 0;
            }
            if (has_determinism_case(N)) {
                det_name(g_running_case, sizeof(g_running_case), N, dims);
                snprintf(name, sizeof(name), "%s", g_running_case);
                determinism_case(&ctx, &d, &in, name);
                g_running_case[0] = 0;
            }
            free_device_set(&d);
            free_inputs(&in);
        }

    matmul_context_destroy(&ctx);
    matmul_context_destroy(&tuned);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return test_end();
}
