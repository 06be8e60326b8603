// test_gpu_decode_linear.cu: decode_linear (layers/generate/decode_linear.cuh), the decode step's linear
// layers at 1-16 rows, against an fp64 host reference on fresh random inputs ($TEST_SEED repeats them).
//
// Cases (PLAN states the same count with and without a GPU):
//   SHAPE x OPS        every shape (rows M, IC, OC: 1-16 rows; IC from 32, fewer 32-k steps than the
//                      kernel's 8 warps, to 8192; OC from 8 to 8192, so both kernels run: deep groups
//                      under two tiles per SM, plain groups above, blocks of one to three tiles (the
//                      partials of a block's third tile reuse the first's half); A staged and read per
//                      step) with every epilogue: plain, bias, LN + bias, LN + bias + GELU, bias +
//                      residual, the residual being y itself; and LN + bias + KV append on two shapes
//                      of the K/V layout (3 and 8 sequences of 2 rows). y (and the cache) poisoned first.
//   ln_equals_layernorm_forward  with w = I and no bias, y is layernorm_forward's output bit for bit
//   deterministic      two launches give the same bits
//   graph_of_two_dependent_products  two products, the second reading the first's y, captured in a CUDA
//                      graph and replayed: the same bits as direct launches (the dependent launch's
//                      wait holds inside a graph)
//   planted_*          wrong results the check must reject (see planted_cases)
//   supported_shapes   decode_linear_supported's answers
// The bound per output, |y − ref| ≤ 2^-8·|ref| + 2^-9·Σ_k |a_k·w_k|: y is rounded to bf16 once (half an
// ulp is 2^-9 of |ref|; 2x room); the sum is fp32 over IC ≤ 8192 terms (at worst IC·2^-24 ≤ 2^-11 of
// Σ|a·w|), a LayerNorm's a may differ from the reference's by one bf16 ulp (2^-8) in a rare element,
// and GELU's slope is at most 1.13: 2^-9 holds all three with room. NaN (poison) never passes.
#include <math.h>

#include "layers/generate/decode_linear.cuh"
#include "test/gpu_test_util.h"

typedef enum {
    OPS_PLAIN, OPS_BIAS, OPS_LN_BIAS, OPS_LN_BIAS_GELU, OPS_BIAS_RESIDUAL, OPS_IN_PLACE, OPS_KV, NUM_OPS
} OpsKind;
static const char* const OPS_NAMES[NUM_OPS] = {"plain", "bias", "ln_bias", "ln_bias_gelu", "bias_residual",
                                              "residual_in_place", "ln_bias_kv_append"};
typedef struct { int M, IC, OC; } Shape;
// OC = 512 with IC = 128 fits the KV layout below (4 query heads and 2 K/V heads of 64).
static const Shape SHAPES[] = {{1, 32, 8}, {2, 96, 24}, {6, 128, 512}, {7, 768, 2304}, {8, 2048, 256},
                               {9, 2048, 136}, {16, 768, 504}, {1, 8192, 64}, {3, 8192, 40}, {4, 2048, 6144},
                               {2, 256, 8192}};  // 1024 tiles: three per block on 132 SMs
#define NUM_SHAPES ((int)COUNT(SHAPES))
#define KV_TQ 2   // rows per sequence in the KV cases (M = B·KV_TQ)
#define KV_TMAX 12
#define NUM_PLANTED 4

static uint16_t bf16_bits(double v) {
    const __nv_bfloat16 h = __float2bfloat16((float)v);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
static double bf16_value(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// One problem's host inputs (bf16 bits) and the reference.
typedef struct {
    Shape s;
    OpsKind ops;
    uint16_t *x, *w, *bias, *ln_w, *ln_b, *residual;  // residual (M, OC)
    double *ref, *scale;                               // (M, OC): the reference and Σ|a·w| per output
    double* a;                                         // (M, IC): the reference's A (after its bf16 rounding)
    int starts[DECODE_LINEAR_MAX_ROWS];
} Problem;

static uint16_t* random_bf16(TestRng* rng, size_t n, double mean, double sd) {
    uint16_t* p = (uint16_t*)host_alloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = bf16_bits(mean + sd * test_rng_normal(rng));
    return p;
}

static int has_ln(OpsKind o) { return o == OPS_LN_BIAS || o == OPS_LN_BIAS_GELU || o == OPS_KV; }
static int has_bias(OpsKind o) { return o != OPS_PLAIN; }
static int has_residual(OpsKind o) { return o == OPS_BIAS_RESIDUAL || o == OPS_IN_PLACE; }

// A's rows as the kernel should see them: x, or LayerNorm(x) in fp64 rounded to bf16.
static void reference_a(Problem* p) {
    const int M = p->s.M, IC = p->s.IC;
    for (int m = 0; m < M; m++) {
        double mean = 0.0, var = 0.0;
        for (int k = 0; k < IC; k++) mean += bf16_value(p->x[(size_t)m * IC + k]);
        mean /= IC;
        for (int k = 0; k < IC; k++) var += pow(bf16_value(p->x[(size_t)m * IC + k]) - mean, 2);
        const double rstd = 1.0 / sqrt(var / IC + 1e-5);
        for (int k = 0; k < IC; k++) {
            const double x = bf16_value(p->x[(size_t)m * IC + k]);
            p->a[(size_t)m * IC + k] = has_ln(p->ops) ? bf16_value(bf16_bits((x - mean) * rstd *
                                                                   bf16_value(p->ln_w[k]) + bf16_value(p->ln_b[k])))
                                                      : x;
        }
    }
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static void reference_y(Problem* p) {
    const int M = p->s.M, IC = p->s.IC, OC = p->s.OC;
    reference_a(p);
    for (int m = 0; m < M; m++)
        for (int o = 0; o < OC; o++) {
            double sum = 0.0, scale = 0.0;
            for (int k = 0; k < IC; k++) {
                const double t = p->a[(size_t)m * IC + k] * bf16_value(p->w[(size_t)o * IC + k]);
                sum += t, scale += fabs(t);
            }
            if (has_bias(p->ops)) sum += bf16_value(p->bias[o]);
            if (p->ops == OPS_LN_BIAS_GELU) sum = gelu_ref(sum);
            if (has_residual(p->ops)) sum += bf16_value(p->residual[(size_t)m * OC + o]);
            p->ref[(size_t)m * OC + o] = sum, p->scale[(size_t)m * OC + o] = scale;
        }
}

static Problem make_problem(Shape s, OpsKind ops, uint64_t seed) {
    Problem p;
    memset(&p, 0, sizeof(p));
    TestRng rng = {seed};
    p.s = s, p.ops = ops;
    p.x = random_bf16(&rng, (size_t)s.M * s.IC, 0.0, 1.0);
    for (size_t i = 0; i < (size_t)s.M * s.IC; i++)  // a row offset, so that the LayerNorm's mean matters
        p.x[i] = bf16_bits(bf16_value(p.x[i]) + 0.5 * (double)(i / s.IC));
    p.w = random_bf16(&rng, (size_t)s.OC * s.IC, 0.0, 1.0 / sqrt((double)s.IC));
    p.bias = random_bf16(&rng, s.OC, 0.0, 0.5);
    p.ln_w = random_bf16(&rng, s.IC, 1.0, 0.2);
    p.ln_b = random_bf16(&rng, s.IC, 0.0, 0.2);
    p.residual = random_bf16(&rng, (size_t)s.M * s.OC, 0.0, 1.0);
    p.ref = (double*)host_alloc((size_t)s.M * s.OC * sizeof(double));
    p.scale = (double*)host_alloc((size_t)s.M * s.OC * sizeof(double));
    p.a = (double*)host_alloc((size_t)s.M * s.IC * sizeof(double));
    for (int b = 0; b < s.M / KV_TQ; b++) p.starts[b] = (int)(test_rng_next(&rng) % (KV_TMAX - KV_TQ + 1));
    reference_y(&p);
    return p;
}

static void free_problem(Problem* p) {
    free(p->x), free(p->w), free(p->bias), free(p->ln_w), free(p->ln_b), free(p->residual);
    free(p->ref), free(p->scale), free(p->a);
}

// The worst error over the bound of y against the reference (NaN counts as infinitely far); 0 outputs
// over it is a pass. Returns how many are over.
static int check_y(const Problem* p, const uint16_t* y, double* worst_ratio) {
    int over = 0;
    *worst_ratio = 0.0;
    for (size_t i = 0; i < (size_t)p->s.M * p->s.OC; i++) {
        const double got = bf16_value(y[i]), bound = ldexp(fabs(p->ref[i]), -8) + ldexp(p->scale[i], -9);
        const double ratio = isfinite(got) ? fabs(got - p->ref[i]) / bound : INFINITY;
        if (ratio > *worst_ratio) *worst_ratio = ratio;
        over += !(ratio <= 1.0);
    }
    return over;
}

// ---- on the GPU ----------------------------------------------------------------------------------------

typedef struct {
    __nv_bfloat16 *x, *w, *bias, *ln_w, *ln_b, *residual, *y, *k, *v;
    int* starts;
} DeviceProblem;

static __nv_bfloat16* upload_bf16(const uint16_t* h, size_t n) {
    __nv_bfloat16* d = (__nv_bfloat16*)device_alloc(n * 2);
    CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    return d;
}

// The KV layout of the OPS_KV cases: 4 query heads and 2 K/V heads of 64 in a row of 512.
static const int KV_K_COL = 256, KV_V_COL = 384, KV_WIDTH = 128;

static size_t kv_cache_elems(const Problem* p) { return (size_t)(p->s.M / KV_TQ) * KV_TMAX * KV_WIDTH; }

static DeviceProblem upload_problem(const Problem* p) {
    DeviceProblem d;
    const size_t M = p->s.M, IC = p->s.IC, OC = p->s.OC;
    d.x = upload_bf16(p->x, M * IC), d.w = upload_bf16(p->w, OC * IC), d.bias = upload_bf16(p->bias, OC);
    d.ln_w = upload_bf16(p->ln_w, IC), d.ln_b = upload_bf16(p->ln_b, IC);
    d.residual = upload_bf16(p->residual, M * OC);
    d.y = (__nv_bfloat16*)device_alloc(M * OC * 2);
    d.k = (__nv_bfloat16*)device_alloc(kv_cache_elems(p) * 2 + 2);
    d.v = (__nv_bfloat16*)device_alloc(kv_cache_elems(p) * 2 + 2);
    d.starts = (int*)device_alloc(sizeof(p->starts));
    CUDA_CHECK(cudaMemcpy(d.starts, p->starts, sizeof(p->starts), cudaMemcpyHostToDevice));
    return d;
}

static void free_device_problem(DeviceProblem* d) {
    void* all[] = {d->x, d->w, d->bias, d->ln_w, d->ln_b, d->residual, d->y, d->k, d->v, d->starts};
    for (size_t i = 0; i < COUNT(all); i++) CUDA_CHECK(cudaFree(all[i]));
}

// One case's problem on the host and on the GPU; the case is named as the running one meanwhile (an exit
// inside decode_linear then names it).
typedef struct {
    Problem p;
    DeviceProblem d;
} Rig;

static Rig rig_open(const char* name, Shape s, OpsKind ops, uint64_t seed) {
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    Rig r;
    r.p = make_problem(s, ops, seed);
    r.d = upload_problem(&r.p);
    return r;
}

static void rig_close(Rig* r) {
    free_device_problem(&r->d);
    free_problem(&r->p);
    g_running_case[0] = 0;
}

static DecodeLinearOps device_ops(const Problem* p, const DeviceProblem* d) {
    DecodeLinearOps ops;
    memset(&ops, 0, sizeof(ops));
    if (has_ln(p->ops)) ops.ln_w = d->ln_w, ops.ln_b = d->ln_b;
    if (has_bias(p->ops)) ops.bias = d->bias;
    ops.gelu = p->ops == OPS_LN_BIAS_GELU;
    if (p->ops == OPS_BIAS_RESIDUAL) ops.residual = d->residual;
    if (p->ops == OPS_IN_PLACE) ops.residual = d->y;  // y holds the residual before the launch
    if (p->ops == OPS_KV)
        ops.kv = (DecodeLinearKV){d->k, d->v, d->starts, KV_TQ, KV_TMAX, KV_K_COL, KV_V_COL, KV_WIDTH};
    return ops;
}

// Poisons y (NaN) and the cache (0x7F7F), or puts the residual in y for the in-place case; launches;
// returns y (M, OC) on the host.
static uint16_t* run_problem(const Problem* p, const DeviceProblem* d, cudaStream_t s, const char* name) {
    const size_t n = (size_t)p->s.M * p->s.OC;
    if (p->ops == OPS_IN_PLACE) CUDA_CHECK(cudaMemcpyAsync(d->y, d->residual, n * 2, cudaMemcpyDeviceToDevice, s));
    else CUDA_CHECK(cudaMemsetAsync(d->y, 0xFF, n * 2, s));
    CUDA_CHECK(cudaMemsetAsync(d->k, 0x7F, kv_cache_elems(p) * 2, s));
    CUDA_CHECK(cudaMemsetAsync(d->v, 0x7F, kv_cache_elems(p) * 2, s));
    const DecodeLinearOps ops = device_ops(p, d);
    decode_linear(d->y, d->x, d->w, &ops, p->s.M, p->s.IC, p->s.OC, s);
    sync_or_die(s, name, "decode_linear");
    uint16_t* y = (uint16_t*)host_alloc(n * 2);
    CUDA_CHECK(cudaMemcpy(y, d->y, n * 2, cudaMemcpyDeviceToHost));
    return y;
}

// The KV cases: K and V columns of row m = b·Tq + t at position starts[b] + t, bit for bit y's; every
// other position still the sentinel. Adds what is wrong to problems.
static void check_cache(const Problem* p, const uint16_t* y, const uint16_t* k, const uint16_t* v, char* problems,
                        size_t size) {
    const int B = p->s.M / KV_TQ;
    int wrong = 0, stray = 0;
    for (int b = 0; b < B; b++)
        for (int pos = 0; pos < KV_TMAX; pos++) {
            const int t = pos - p->starts[b], ours = t >= 0 && t < KV_TQ;
            for (int c = 0; c < KV_WIDTH; c++) {
                const size_t at = ((size_t)b * KV_TMAX + pos) * KV_WIDTH + c;
                const uint16_t* row = y + (size_t)(b * KV_TQ + t) * p->s.OC;
                if (ours) wrong += k[at] != row[KV_K_COL + c] || v[at] != row[KV_V_COL + c];
                else stray += k[at] != 0x7F7F || v[at] != 0x7F7F;
            }
        }
    if (wrong) add_problem(problems, size, "%d cache entries differ from y's K/V columns", wrong);
    if (stray) add_problem(problems, size, "%d cache entries outside the new positions were written", stray);
}

static uint16_t* download_bf16(const __nv_bfloat16* d, size_t n) {
    uint16_t* h = (uint16_t*)host_alloc(n * 2);
    CUDA_CHECK(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    return h;
}

static void shape_ops_case(Shape s, OpsKind ops, uint64_t seed, cudaStream_t stream) {
    char name[160];
    snprintf(name, sizeof(name), "M%d_IC%d_OC%d_%s", s.M, s.IC, s.OC, OPS_NAMES[ops]);
    Rig r = rig_open(name, s, ops, seed);
    const Problem& p = r.p;
    uint16_t* y = run_problem(&p, &r.d, stream, name);
    double worst;
    char problems[512] = "";
    const int over = check_y(&p, y, &worst);
    if (over) add_problem(problems, sizeof(problems), "%d of %d outputs over the bound", over, s.M * s.OC);
    if (ops == OPS_KV) {
        uint16_t *k = download_bf16(r.d.k, kv_cache_elems(&p)), *v = download_bf16(r.d.v, kv_cache_elems(&p));
        check_cache(&p, y, k, v, problems, sizeof(problems));
        free(k), free(v);
    }
    test_report(name, problems[0] == 0, "%s (worst error %.3f of the bound)", problems, worst);
    if (!problems[0]) printf("   %s: worst error %.3f of the bound\n", name, worst);
    free(y);
    rig_close(&r);
}

// ---- bit-for-bit cases -----------------------------------------------------------------------------

// With w = I (OC = IC) and no bias, y = a exactly: the LayerNorm inside must give layernorm_forward's bits.
static void ln_identity_case(int M, int IC, uint64_t seed, cudaStream_t stream) {
    char name[160];
    snprintf(name, sizeof(name), "ln_equals_layernorm_forward_M%d_IC%d", M, IC);
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    Problem p = make_problem((Shape){M, IC, 8}, OPS_LN_BIAS, seed);
    uint16_t* eye = (uint16_t*)host_alloc((size_t)IC * IC * 2);
    for (size_t i = 0; i < (size_t)IC * IC; i++) eye[i] = i % (IC + 1) == 0 ? 0x3F80 : 0;  // 1.0 on the diagonal
    __nv_bfloat16 *x = upload_bf16(p.x, (size_t)M * IC), *w = upload_bf16(eye, (size_t)IC * IC);
    __nv_bfloat16 *g = upload_bf16(p.ln_w, IC), *b = upload_bf16(p.ln_b, IC);
    __nv_bfloat16* y = (__nv_bfloat16*)device_alloc((size_t)M * IC * 2);
    __nv_bfloat16* ln = (__nv_bfloat16*)device_alloc((size_t)M * IC * 2);
    CUDA_CHECK(cudaMemsetAsync(y, 0xFF, (size_t)M * IC * 2, stream));
    CUDA_CHECK(cudaMemsetAsync(ln, 0xFF, (size_t)M * IC * 2, stream));
    const DecodeLinearOps ops = {g, b, NULL, NULL, 0, {}};
    decode_linear(y, x, w, &ops, M, IC, IC, stream);
    layernorm_forward(ln, NULL, NULL, x, g, b, M, IC, stream);
    sync_or_die(stream, name, "decode_linear or layernorm_forward");
    uint16_t *hy = download_bf16(y, (size_t)M * IC), *hl = download_bf16(ln, (size_t)M * IC);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)M * IC; i++) differ += hy[i] != hl[i];
    test_report(name, differ == 0, "%zu of %d values differ from layernorm_forward's", differ, M * IC);
    void* all[] = {x, w, g, b, y, ln};
    for (size_t i = 0; i < COUNT(all); i++) CUDA_CHECK(cudaFree(all[i]));
    free(eye), free(hy), free(hl);
    free_problem(&p);
    g_running_case[0] = 0;
}

static void deterministic_case(uint64_t seed, cudaStream_t stream) {
    const char* name = "deterministic_M3_IC8192_OC40_ln_bias_gelu";
    Rig r = rig_open(name, (Shape){3, 8192, 40}, OPS_LN_BIAS_GELU, seed);
    uint16_t *a = run_problem(&r.p, &r.d, stream, name), *b = run_problem(&r.p, &r.d, stream, name);
    test_report(name, memcmp(a, b, (size_t)3 * 40 * 2) == 0, "two launches on the same inputs differ");
    free(a), free(b);
    rig_close(&r);
}

// y1 = GELU(LN(x)·w1ᵀ + b) (2 rows, 768 → 3072), then y2 = y1·w2ᵀ (3072 → 768): direct launches, then
// the same two captured in one graph and replayed twice with y1 and y2 poisoned first.
static void graph_case(uint64_t seed, cudaStream_t stream) {
    const char* name = "graph_of_two_dependent_products";
    Rig r1 = rig_open(name, (Shape){2, 768, 3072}, OPS_LN_BIAS_GELU, seed);
    Rig r2 = rig_open(name, (Shape){2, 3072, 768}, OPS_PLAIN, seed + 1);
    const DeviceProblem &d1 = r1.d, &d2 = r2.d;
    const DecodeLinearOps o1 = device_ops(&r1.p, &d1), o2 = device_ops(&r2.p, &d2);
    decode_linear(d1.y, d1.x, d1.w, &o1, 2, 768, 3072, stream);
    decode_linear(d2.y, d1.y, d2.w, &o2, 2, 3072, 768, stream);
    sync_or_die(stream, name, "decode_linear");
    uint16_t* direct = download_bf16(d2.y, 2 * 768);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    decode_linear(d1.y, d1.x, d1.w, &o1, 2, 768, 3072, stream);
    decode_linear(d2.y, d1.y, d2.w, &o2, 2, 3072, 768, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int differ = 0;
    for (int r = 0; r < 2; r++) {
        CUDA_CHECK(cudaMemsetAsync(d1.y, 0xFF, 2 * 3072 * 2, stream));  // a stale y1 would show
        CUDA_CHECK(cudaMemsetAsync(d2.y, 0xFF, 2 * 768 * 2, stream));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        sync_or_die(stream, name, "the graph");
        uint16_t* replay = download_bf16(d2.y, 2 * 768);
        differ += memcmp(replay, direct, 2 * 768 * 2) != 0;
        free(replay);
    }
    test_report(name, differ == 0, "%d of 2 replays differ from the direct launches", differ);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    free(direct);
    rig_close(&r1), rig_close(&r2);
}

// ---- planted errors: the checks must reject them ----------------------------------------------------

// Output (row m, feature o) of y, minus a term in fp64, rounded back to bf16.
static void plant(uint16_t* y, const Problem* p, int m, int o, double minus) {
    const size_t i = (size_t)m * p->s.OC + o;
    y[i] = bf16_bits(bf16_value(y[i]) - minus);
}

// The 32 consecutive k of the largest contribution to one output, taken away (a lane's step lost).
static void plant_dropped_step(uint16_t* y, const Problem* p) {
    double best = 0.0;
    int best_o = 0;
    for (int o = 0; o < p->s.OC; o++)
        for (int j = 0; j < p->s.IC / 32; j++) {
            double part = 0.0;
            for (int k = 32 * j; k < 32 * j + 32; k++) part += p->a[k] * bf16_value(p->w[(size_t)o * p->s.IC + k]);
            if (fabs(part) > fabs(best)) best = part, best_o = o;
        }
    plant(y, p, 0, best_o, best);
}

static void plant_no_residual(uint16_t* y, const Problem* p) {
    for (int o = 0; o < p->s.OC; o++) plant(y, p, 1, o, bf16_value(p->residual[(size_t)p->s.OC + o]));
}

// Row 1 as if the LayerNorm had no bias: minus Σ_k ln_b_k·w_ok.
static void plant_no_ln_bias(uint16_t* y, const Problem* p) {
    for (int o = 0; o < p->s.OC; o++) {
        double s = 0.0;
        for (int k = 0; k < p->s.IC; k++) s += bf16_value(p->ln_b[k]) * bf16_value(p->w[(size_t)o * p->s.IC + k]);
        plant(y, p, 1, o, s);
    }
}

typedef void (*Planter)(uint16_t* y, const Problem* p);

// A correct result that passes, then the same with `planter` applied, which must fail.
static void planted_y_case(const char* name, Shape s, OpsKind ops, Planter planter, uint64_t seed,
                           cudaStream_t stream) {
    Rig r = rig_open(name, s, ops, seed);
    const Problem& p = r.p;
    uint16_t* y = run_problem(&p, &r.d, stream, name);
    double before, after;
    const int clean = check_y(&p, y, &before) == 0;
    planter(y, &p);
    const int rejected = check_y(&p, y, &after) > 0;
    test_report(name, clean && rejected, "the correct result %s (worst %.3f of the bound), the planted one %s "
                "(worst %.3f)", clean ? "passes" : "FAILS", before, rejected ? "is rejected" : "PASSES", after);
    free(y);
    rig_close(&r);
}

// The cache of sequence 0 as if its keys had gone one position late: check_cache must object.
static void planted_kv_case(uint64_t seed, cudaStream_t stream) {
    const char* name = "planted_kv_append_one_position_late_rejected";
    Rig r = rig_open(name, (Shape){6, 128, 512}, OPS_KV, seed);
    Problem& p = r.p;
    p.starts[0] = 0;  // room for the shift
    CUDA_CHECK(cudaMemcpy(r.d.starts, p.starts, sizeof(p.starts), cudaMemcpyHostToDevice));
    uint16_t* y = run_problem(&p, &r.d, stream, name);
    uint16_t *k = download_bf16(r.d.k, kv_cache_elems(&p)), *v = download_bf16(r.d.v, kv_cache_elems(&p));
    char clean[512] = "", planted[512] = "";
    check_cache(&p, y, k, v, clean, sizeof(clean));
    memmove(k + KV_WIDTH, k, (size_t)KV_TQ * KV_WIDTH * 2);  // positions 0, 1 of sequence 0 -> 1, 2
    for (int c = 0; c < KV_WIDTH; c++) k[c] = 0x7F7F;
    check_cache(&p, y, k, v, planted, sizeof(planted));
    test_report(name, clean[0] == 0 && planted[0] != 0, "correct cache: %s; planted: %s", clean[0] ? clean : "ok",
                planted[0] ? planted : "NOT rejected");
    free(y), free(k), free(v);
    rig_close(&r);
}

static void planted_cases(uint64_t seed, cudaStream_t stream) {
    planted_y_case("planted_one_step_of_32_k_dropped_rejected", (Shape){1, 2048, 6144}, OPS_PLAIN,
                   plant_dropped_step, seed, stream);
    planted_y_case("planted_residual_missing_in_a_row_rejected", (Shape){4, 2048, 256}, OPS_BIAS_RESIDUAL,
                   plant_no_residual, seed + 1, stream);
    planted_y_case("planted_layernorm_without_its_bias_rejected", (Shape){4, 2048, 256}, OPS_LN_BIAS,
                   plant_no_ln_bias, seed + 2, stream);
    planted_kv_case(seed + 3, stream);
}

static const char* const PLANTED_NAMES[NUM_PLANTED] = {
    "planted_one_step_of_32_k_dropped_rejected", "planted_residual_missing_in_a_row_rejected",
    "planted_layernorm_without_its_bias_rejected", "planted_kv_append_one_position_late_rejected"};

// ---- argument checks (no GPU needed) ----------------------------------------------------------------

static void supported_case(void) {
    const Shape no[] = {{0, 32, 8}, {17, 32, 8}, {1, 48, 8}, {1, 32, 12}};
    int wrong = 0;
    for (size_t i = 0; i < COUNT(no); i++) wrong += decode_linear_supported(no[i].M, no[i].IC, no[i].OC) != 0;
    wrong += decode_linear_supported(16, 32, 8) != 1;
    test_report("supported_shapes", wrong == 0, "%d of 5 answers wrong (M 0 or 17, IC 48, OC 12: no; 16 x 32 x 8: yes)",
                wrong);
}

// ---- the cases' list ------------------------------------------------------------------------------------

static const Shape KV_SHAPES[] = {{6, 128, 512}, {16, 128, 512}};  // B = 3 and 8 sequences of KV_TQ rows

static void gpu_cases(uint64_t seed, cudaStream_t stream) {
    int c = 0;
    for (int s = 0; s < NUM_SHAPES; s++)
        for (int o = 0; o < OPS_KV; o++) shape_ops_case(SHAPES[s], (OpsKind)o, seed + 1000 * (uint64_t)c++, stream);
    for (size_t s = 0; s < COUNT(KV_SHAPES); s++) shape_ops_case(KV_SHAPES[s], OPS_KV, seed + 77 + s, stream);
    const int ln_rows[3] = {1, 9, 16};
    for (int i = 0; i < 3; i++) ln_identity_case(ln_rows[i], i == 2 ? 2048 : 768, seed + 500 + i, stream);
    deterministic_case(seed + 600, stream);
    graph_case(seed + 700, stream);
    planted_cases(seed + 800, stream);
}

static void skip_gpu_cases(const char* why) {
    char name[160];
    for (int s = 0; s < NUM_SHAPES; s++)
        for (int o = 0; o < OPS_KV; o++) {
            snprintf(name, sizeof(name), "M%d_IC%d_OC%d_%s", SHAPES[s].M, SHAPES[s].IC, SHAPES[s].OC, OPS_NAMES[o]);
            test_skip(name, why);
        }
    for (size_t s = 0; s < COUNT(KV_SHAPES); s++) {
        snprintf(name, sizeof(name), "M%d_IC%d_OC%d_%s", KV_SHAPES[s].M, KV_SHAPES[s].IC, KV_SHAPES[s].OC,
                 OPS_NAMES[OPS_KV]);
        test_skip(name, why);
    }
    const char* others[] = {"ln_equals_layernorm_forward_M1_IC768", "ln_equals_layernorm_forward_M9_IC768",
                            "ln_equals_layernorm_forward_M16_IC2048", "deterministic_M3_IC8192_OC40_ln_bias_gelu",
                            "graph_of_two_dependent_products"};
    for (size_t i = 0; i < COUNT(others); i++) test_skip(others[i], why);
    for (int i = 0; i < NUM_PLANTED; i++) test_skip(PLANTED_NAMES[i], why);
}

int main(void) {
    test_begin();
    test_plan(NUM_SHAPES * OPS_KV + (int)COUNT(KV_SHAPES) + 3 + 1 + 1 + NUM_PLANTED + 1);  // same without a GPU
    const uint64_t seed = pick_and_print_seed();
    supported_case();
    GpuInfo gpu = gpu_info(0);
    const char* skip_why = gpu_skip_reason(&gpu, "decode_linear's kernels");
    if (skip_why) {
        skip_gpu_cases(skip_why);
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    atexit(report_exit_during_case);
    gpu_cases(seed, stream);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return test_end();
}
