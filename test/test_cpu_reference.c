// test_cpu_reference.c: checks the CPU reference itself, since every GPU test will trust it.
//
// Each backward is compared with central finite differences of its forward in fp64: for a
// random upstream gradient dout, the scalar f(x) = Σ dout·forward(x) has ∂f/∂x = backward(dout).
// Each forward is checked on cases with a known answer. Sizes are small and odd on purpose.
#include "data/gpt_config.h"
#include "test/cpu_gpt.h"
#include "test/cpu_reference.h"
#include "test/test_harness.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define FD_STEP 1e-6       // central differences in fp64: error ~ step² + 1e-16 / step
#define FD_TOLERANCE 1e-6  // relative error ‖analytic − numeric‖ / ‖numeric‖

// ---------------------------------------------------------------------------------------------
// Finite differences

// Evaluates the scalar f at the current contents of the inputs it reads.
typedef double (*ScalarFn)(void* ctx);

// numeric[i] = (f(x + h·e_i) − f(x − h·e_i)) / 2h for the n elements of x (restored after).
static void finite_differences(double* numeric, ScalarFn f, void* ctx, double* x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_STEP;
        double up = f(ctx);
        x[i] = saved - FD_STEP;
        double down = f(ctx);
        x[i] = saved;
        numeric[i] = (up - down) / (2.0 * FD_STEP);
    }
}

// Checks analytic against finite differences of f with respect to x; reports one case.
static void check_gradient(const char* name, ScalarFn f, void* ctx, double* x, const double* analytic, size_t n) {
    double* numeric = test_alloc(n);
    finite_differences(numeric, f, ctx, x, n);
    double err = test_rel_error(analytic, numeric, n);
    test_report(name, err <= FD_TOLERANCE, "relative error %.3e > %.0e over %zu elements", err, FD_TOLERANCE, n);
    free(numeric);
}

static double dot(const double* a, const double* b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// ---------------------------------------------------------------------------------------------
// Encoder

typedef struct {
    int B, T, C;
    const int* tokens;
    double *wte, *wpe, *out, *dout;
} EncoderCase;

static double encoder_scalar(void* ctx) {
    EncoderCase* e = (EncoderCase*)ctx;
    ref_encoder_forward(e->out, e->tokens, e->wte, e->wpe, e->B, e->T, e->C);
    return dot(e->dout, e->out, (size_t)e->B * e->T * e->C);
}

static void test_encoder(TestRng* rng) {
    enum { B = 2, T = 3, C = 4, V = 5 };
    const int tokens[B * T] = {1, 3, 1, 4, 1, 0};  // token 1 repeats: its gradient must accumulate
    double *wte = test_alloc(V * C), *wpe = test_alloc(T * C), *out = test_alloc(B * T * C);
    double *dout = test_alloc(B * T * C), *dwte = test_alloc(V * C), *dwpe = test_alloc(T * C);
    test_fill_normal(rng, wte, V * C, 1.0);
    test_fill_normal(rng, wpe, T * C, 1.0);
    test_fill_normal(rng, dout, B * T * C, 1.0);

    ref_encoder_forward(out, tokens, wte, wpe, B, T, C);
    double max_diff = 0.0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double want = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
                max_diff = fmax(max_diff, fabs(out[(b * T + t) * C + c] - want));
            }
    test_report("encoder_forward_known_rows", max_diff == 0.0, "max difference %.3e", max_diff);

    ref_encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    EncoderCase e = {B, T, C, tokens, wte, wpe, out, dout};
    check_gradient("encoder_backward_dwte", encoder_scalar, &e, wte, dwte, V * C);
    check_gradient("encoder_backward_dwpe", encoder_scalar, &e, wpe, dwpe, T * C);
    free(wte); free(wpe); free(out); free(dout); free(dwte); free(dwpe);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

typedef struct {
    int N, C;
    double *inp, *weight, *bias, *out, *mean, *rstd, *dout;
} LayerNormCase;

static double layernorm_scalar(void* ctx) {
    LayerNormCase* l = (LayerNormCase*)ctx;
    ref_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->weight, l->bias, l->N, l->C);
    return dot(l->dout, l->out, (size_t)l->N * l->C);
}

static void test_layernorm(TestRng* rng) {
    enum { N = 6, C = 10 };
    double *inp = test_alloc(N * C), *weight = test_alloc(C), *bias = test_alloc(C), *out = test_alloc(N * C);
    double *mean = test_alloc(N), *rstd = test_alloc(N), *dout = test_alloc(N * C);
    double *dinp = test_alloc(N * C), *dweight = test_alloc(C), *dbias = test_alloc(C);
    for (int i = 0; i < N * C; i++) inp[i] = 3.0 + 2.0 * test_rng_normal(rng);  // off-centre rows
    for (int c = 0; c < C; c++) weight[c] = 1.0 + 0.5 * test_rng_normal(rng);
    test_fill_normal(rng, bias, C, 0.5);
    test_fill_normal(rng, dout, N * C, 1.0);

    // Forward: (out − bias) / weight must have zero mean and unit (biased) variance per row,
    // up to the eps under the square root.
    ref_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    double worst = 0.0;
    for (int n = 0; n < N; n++) {
        double m = 0.0, v = 0.0, var_inp = 0.0, m_inp = 0.0;
        for (int c = 0; c < C; c++) m_inp += inp[n * C + c] / C;
        for (int c = 0; c < C; c++) var_inp += (inp[n * C + c] - m_inp) * (inp[n * C + c] - m_inp) / C;
        for (int c = 0; c < C; c++) m += (out[n * C + c] - bias[c]) / weight[c] / C;
        for (int c = 0; c < C; c++) {
            double z = (out[n * C + c] - bias[c]) / weight[c] - m;
            v += z * z / C;
        }
        worst = fmax(worst, fabs(m));
        worst = fmax(worst, fabs(v - var_inp / (var_inp + 1e-5)));
        worst = fmax(worst, fabs(mean[n] - m_inp));
    }
    test_report("layernorm_forward_normalizes_rows", worst < 1e-12, "worst deviation %.3e", worst);

    ref_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    LayerNormCase l = {N, C, inp, weight, bias, out, mean, rstd, dout};
    check_gradient("layernorm_backward_dinp", layernorm_scalar, &l, inp, dinp, N * C);
    check_gradient("layernorm_backward_dweight", layernorm_scalar, &l, weight, dweight, C);
    check_gradient("layernorm_backward_dbias", layernorm_scalar, &l, bias, dbias, C);
    free(inp); free(weight); free(bias); free(out); free(mean); free(rstd);
    free(dout); free(dinp); free(dweight); free(dbias);
}

// ---------------------------------------------------------------------------------------------
// Linear layer

typedef struct {
    int N, IC, OC;
    double *inp, *weight, *bias, *out, *dout;
} MatmulCase;

static double matmul_scalar(void* ctx) {
    MatmulCase* m = (MatmulCase*)ctx;
    ref_matmul_forward(m->out, m->inp, m->weight, m->bias, m->N, m->IC, m->OC);
    return dot(m->dout, m->out, (size_t)m->N * m->OC);
}

static void test_matmul(TestRng* rng) {
    {   // Forward on a case worked by hand: out = inp · weightᵀ + bias.
        const double inp[2 * 2] = {1, 2, 3, 4};
        const double weight[3 * 2] = {1, 0, 0, 1, 1, 1};
        const double bias[3] = {0.5, -1, 2};
        const double want[2 * 3] = {1.5, 1, 5, 3.5, 3, 9};
        double out[2 * 3];
        ref_matmul_forward(out, inp, weight, bias, 2, 2, 3);
        double err = test_rel_error(out, want, 6);
        test_report("matmul_forward_known_values", err == 0.0, "relative error %.3e", err);
    }
    enum { N = 5, IC = 7, OC = 6 };
    double *inp = test_alloc(N * IC), *weight = test_alloc(OC * IC), *bias = test_alloc(OC);
    double *out = test_alloc(N * OC), *dout = test_alloc(N * OC);
    double *dinp = test_alloc(N * IC), *dweight = test_alloc(OC * IC), *dbias = test_alloc(OC);
    test_fill_normal(rng, inp, N * IC, 1.0);
    test_fill_normal(rng, weight, OC * IC, 1.0);
    test_fill_normal(rng, bias, OC, 1.0);
    test_fill_normal(rng, dout, N * OC, 1.0);
    ref_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    MatmulCase m = {N, IC, OC, inp, weight, bias, out, dout};
    check_gradient("matmul_backward_dinp", matmul_scalar, &m, inp, dinp, N * IC);
    check_gradient("matmul_backward_dweight", matmul_scalar, &m, weight, dweight, OC * IC);
    check_gradient("matmul_backward_dbias", matmul_scalar, &m, bias, dbias, OC);
    free(inp); free(weight); free(bias); free(out); free(dout); free(dinp); free(dweight); free(dbias);
}

// ---------------------------------------------------------------------------------------------
// GELU

typedef struct {
    size_t n;
    double *inp, *out, *dout;
} GeluCase;

static double gelu_scalar(void* ctx) {
    GeluCase* g = (GeluCase*)ctx;
    ref_gelu_forward(g->out, g->inp, g->n);
    return dot(g->dout, g->out, g->n);
}

static void test_gelu(TestRng* rng) {
    {   // Known values of 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))).
        const double x[5] = {0.0, 1.0, -1.0, 2.5, -3.0};
        const double want[5] = {0.0, 0.8411919906082768, -0.15880800939172324, 2.484915733910001,
                                -0.0036373920817729943};
        double out[5];
        ref_gelu_forward(out, x, 5);
        double err = test_rel_error(out, want, 5);
        test_report("gelu_forward_known_values", err < 1e-15, "relative error %.3e", err);
    }
    enum { N = 50 };
    double *inp = test_alloc(N), *out = test_alloc(N), *dout = test_alloc(N), *dinp = test_alloc(N);
    for (int i = 0; i < N; i++) inp[i] = test_rng_uniform(rng, -4.0, 4.0);
    test_fill_normal(rng, dout, N, 1.0);
    ref_gelu_backward(dinp, dout, inp, N);
    GeluCase g = {N, inp, out, dout};
    check_gradient("gelu_backward_dinp", gelu_scalar, &g, inp, dinp, N);
    free(inp); free(out); free(dout); free(dinp);
}

// ---------------------------------------------------------------------------------------------
// Attention

typedef struct {
    int B, T, NH, NKV, HD, causal;
    double *qkv, *out, *lse, *dout;
} AttentionCase;

static double attention_scalar(void* ctx) {
    AttentionCase* a = (AttentionCase*)ctx;
    ref_attention_forward(a->out, a->lse, a->qkv, a->B, a->T, a->NH, a->NKV, a->HD, a->causal);
    return dot(a->dout, a->out, (size_t)a->B * a->T * a->NH * a->HD);
}

// Finite differences of Σ dout ∘ out over every element of qkv (B, T, NH + 2·NKV, HD).
static void test_attention_backward(TestRng* rng, int B, int T, int NH, int NKV, int HD, int causal,
                                    const char* name) {
    size_t n_qkv = (size_t)B * T * (NH + 2 * NKV) * HD, n_out = (size_t)B * T * NH * HD;
    double *qkv = test_alloc(n_qkv), *out = test_alloc(n_out), *lse = test_alloc((size_t)B * NH * T);
    double *dout = test_alloc(n_out), *dqkv = test_alloc(n_qkv);
    test_fill_normal(rng, qkv, n_qkv, 1.0);
    test_fill_normal(rng, dout, n_out, 1.0);
    ref_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, causal);
    ref_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, causal);
    AttentionCase a = {B, T, NH, NKV, HD, causal, qkv, out, lse, dout};
    check_gradient(name, attention_scalar, &a, qkv, dqkv, n_qkv);
    free(qkv); free(out); free(lse); free(dout); free(dqkv);
}

// Grouped-query attention is multi-head attention with each K/V head repeated for its NH / NKV query
// heads: the same out and lse, and dK, dV the sums of the repeated heads' gradients.
static void test_attention_gqa_is_repeated_kv(TestRng* rng, int NKV, int causal, const char* name) {
    enum { B = 2, T = 7, NH = 4, HD = 5 };
    const int G = NH / NKV, W = NH + 2 * NKV;
    size_t n_gqa = (size_t)B * T * W * HD, n_mha = (size_t)B * T * 3 * NH * HD, n_out = (size_t)B * T * NH * HD;
    double *gqa = test_alloc(n_gqa), *mha = test_alloc(n_mha), *dout = test_alloc(n_out);
    double *out_g = test_alloc(n_out), *out_m = test_alloc(n_out);
    double *lse_g = test_alloc((size_t)B * NH * T), *lse_m = test_alloc((size_t)B * NH * T);
    double *dgqa = test_alloc(n_gqa), *dmha = test_alloc(n_mha), *dsum = test_alloc(n_gqa);
    test_fill_normal(rng, gqa, n_gqa, 1.0);
    test_fill_normal(rng, dout, n_out, 1.0);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)  // the MHA copy: head h of k and v is K/V head h / G
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HD; d++) {
                mha[(bt * 3 * NH + h) * HD + d] = gqa[(bt * W + h) * HD + d];
                mha[(bt * 3 * NH + NH + h) * HD + d] = gqa[(bt * W + NH + h / G) * HD + d];
                mha[(bt * 3 * NH + 2 * NH + h) * HD + d] = gqa[(bt * W + NH + NKV + h / G) * HD + d];
            }
    ref_attention_forward(out_g, lse_g, gqa, B, T, NH, NKV, HD, causal);
    ref_attention_forward(out_m, lse_m, mha, B, T, NH, NH, HD, causal);
    ref_attention_backward(dgqa, dout, gqa, out_g, lse_g, B, T, NH, NKV, HD, causal);
    ref_attention_backward(dmha, dout, mha, out_m, lse_m, B, T, NH, NH, HD, causal);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)  // dQ as is; dK, dV summed over each group
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HD; d++) {
                dsum[(bt * W + h) * HD + d] = dmha[(bt * 3 * NH + h) * HD + d];
                dsum[(bt * W + NH + h / G) * HD + d] += dmha[(bt * 3 * NH + NH + h) * HD + d];
                dsum[(bt * W + NH + NKV + h / G) * HD + d] += dmha[(bt * 3 * NH + 2 * NH + h) * HD + d];
            }
    double err = fmax(test_rel_error(out_g, out_m, n_out), test_rel_error(lse_g, lse_m, (size_t)B * NH * T));
    err = fmax(err, test_rel_error(dgqa, dsum, n_gqa));
    test_report(name, err < 1e-12, "relative deviation %.3e from MHA with repeated K/V heads", err);
    free(gqa); free(mha); free(dout); free(out_g); free(out_m); free(lse_g); free(lse_m);
    free(dgqa); free(dmha); free(dsum);
}

static void test_attention_forward(TestRng* rng) {
    enum { B = 2, T = 6, NH = 3, HD = 5 };
    size_t n_qkv = (size_t)B * T * 3 * NH * HD, n_out = (size_t)B * T * NH * HD;
    double *qkv = test_alloc(n_qkv), *out = test_alloc(n_out), *lse = test_alloc(B * NH * T);
    double scale = 1.0 / sqrt((double)HD);
#define Q(b, t, h, d) qkv[((((size_t)(b) * T + (t)) * 3 + 0) * NH + (h)) * HD + (d)]
#define K(b, t, h, d) qkv[((((size_t)(b) * T + (t)) * 3 + 1) * NH + (h)) * HD + (d)]
#define V(b, t, h, d) qkv[((((size_t)(b) * T + (t)) * 3 + 2) * NH + (h)) * HD + (d)]
#define O(b, t, h, d) out[(((size_t)(b) * T + (t)) * NH + (h)) * HD + (d)]
#define LSE(b, h, t) lse[((size_t)(b) * NH + (h)) * T + (t)]

    // Causal: query 0 sees only key 0, so its output is v_0 and its lse is q_0·k_0/√HD.
    test_fill_normal(rng, qkv, n_qkv, 1.0);
    ref_attention_forward(out, lse, qkv, B, T, NH, NH, HD, 1);
    double worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            double s = 0.0;
            for (int d = 0; d < HD; d++) {
                worst = fmax(worst, fabs(O(b, 0, h, d) - V(b, 0, h, d)));
                s += Q(b, 0, h, d) * K(b, 0, h, d);
            }
            worst = fmax(worst, fabs(LSE(b, h, 0) - s * scale));
        }
    test_report("attention_forward_causal_first_row", worst < 1e-12, "worst deviation %.3e", worst);

    // The lse must normalize every row: Σ_j exp(q_i·k_j/√HD − lse_i) = 1 over the visible keys.
    for (int causal = 0; causal <= 1; causal++) {
        worst = 0.0;
        ref_attention_forward(out, lse, qkv, B, T, NH, NH, HD, causal);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < T; i++) {
                    double total = 0.0;
                    for (int j = 0; j < (causal ? i + 1 : T); j++) {
                        double s = 0.0;
                        for (int d = 0; d < HD; d++) s += Q(b, i, h, d) * K(b, j, h, d);
                        total += exp(s * scale - LSE(b, h, i));
                    }
                    worst = fmax(worst, fabs(total - 1.0));
                }
        test_report(causal ? "attention_forward_lse_normalizes_causal" : "attention_forward_lse_normalizes",
                    worst < 1e-12, "worst |Σp − 1| %.3e", worst);
    }

    // Non-causal with every key equal: uniform weights, so out_i = mean of v and lse = s + log T.
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HD; d++) K(b, t, h, d) = K(b, 0, h, d);
    ref_attention_forward(out, lse, qkv, B, T, NH, NH, HD, 0);
    worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                double s = 0.0;
                for (int d = 0; d < HD; d++) {
                    double mean_v = 0.0;
                    for (int j = 0; j < T; j++) mean_v += V(b, j, h, d) / T;
                    worst = fmax(worst, fabs(O(b, i, h, d) - mean_v));
                    s += Q(b, i, h, d) * K(b, 0, h, d);
                }
                worst = fmax(worst, fabs(LSE(b, h, i) - (s * scale + log((double)T))));
            }
    test_report("attention_forward_equal_keys_average_values", worst < 1e-12, "worst deviation %.3e", worst);
#undef Q
#undef K
#undef V
#undef O
#undef LSE
    free(qkv); free(out); free(lse);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

typedef struct {
    int N, V, Vp;
    const int* targets;
    double *logits, *losses, *dlosses;
} CrossEntropyCase;

static double crossentropy_scalar(void* ctx) {
    CrossEntropyCase* c = (CrossEntropyCase*)ctx;
    ref_crossentropy_forward(c->losses, c->logits, c->targets, c->N, c->V, c->Vp);
    return dot(c->dlosses, c->losses, (size_t)c->N);
}

static void test_crossentropy(TestRng* rng) {
    enum { N = 4, V = 7, Vp = 9 };
    const int targets[N] = {0, 6, 3, 3};
    double *logits = test_alloc(N * Vp), *losses = test_alloc(N), *dlosses = test_alloc(N);
    double *dlogits = test_alloc(N * Vp);

    // Equal logits over the real vocab give log V, whatever sits in the padding columns.
    for (int n = 0; n < N; n++)
        for (int v = 0; v < Vp; v++) logits[n * Vp + v] = v < V ? 0.25 : 1000.0;
    double mean = ref_crossentropy_forward(losses, logits, targets, N, V, Vp);
    test_report("crossentropy_forward_uniform_is_log_vocab", fabs(mean - log((double)V)) < 1e-12,
                "mean loss %.15f, want log(%d) = %.15f", mean, V, log((double)V));

    // Backward: each row's loss weighted by its own upstream gradient (one call per row, as the
    // API takes one dloss for all rows).
    test_fill_normal(rng, logits, N * Vp, 2.0);
    test_fill_normal(rng, dlosses, N, 1.0);
    for (int n = 0; n < N; n++)
        ref_crossentropy_backward(dlogits + n * Vp, logits + n * Vp, targets + n, dlosses[n], 1, V, Vp);
    CrossEntropyCase c = {N, V, Vp, targets, logits, losses, dlosses};
    check_gradient("crossentropy_backward_dlogits", crossentropy_scalar, &c, logits, dlogits, N * Vp);
    double padding = 0.0;
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) padding = fmax(padding, fabs(dlogits[n * Vp + v]));
    test_report("crossentropy_backward_padding_is_zero", padding == 0.0, "max |dlogit| in padding %.3e", padding);
    free(logits); free(losses); free(dlosses); free(dlogits);
}

// ---------------------------------------------------------------------------------------------
// AdamW (no backward: checked against closed forms)

static void test_adamw(TestRng* rng) {
    enum { N = 16 };
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    double p[N], p0[N], g[N], m[N], v[N];
    for (int i = 0; i < N; i++) {
        p0[i] = p[i] = test_rng_normal(rng);
        g[i] = test_rng_normal(rng);
        m[i] = v[i] = 0.0;
    }
    // With a constant gradient the bias-corrected moments are exactly g and g² at every step, so
    // each step moves p by −lr·(g/(|g| + eps) + wd·p).
    double worst = 0.0;
    for (int step = 1; step <= 3; step++) {
        double want[N];
        for (int i = 0; i < N; i++) want[i] = p[i] - lr * (g[i] / (fabs(g[i]) + eps) + wd * p[i]);
        ref_adamw_step(p, g, m, v, N, lr, b1, b2, eps, wd, step);
        for (int i = 0; i < N; i++) worst = fmax(worst, fabs(p[i] - want[i]));
    }
    test_report("adamw_constant_gradient_closed_form", worst < 1e-14, "worst deviation %.3e", worst);

    // Moments after two steps with gradients g then 2g: m = (1−b1)(b1·g + 2g), v = (1−b2)(b2·g² + 4g²).
    for (int i = 0; i < N; i++) { p[i] = p0[i]; m[i] = v[i] = 0.0; }
    double g2[N];
    for (int i = 0; i < N; i++) g2[i] = 2.0 * g[i];
    ref_adamw_step(p, g, m, v, N, lr, b1, b2, eps, wd, 1);
    ref_adamw_step(p, g2, m, v, N, lr, b1, b2, eps, wd, 2);
    worst = 0.0;
    for (int i = 0; i < N; i++) {
        worst = fmax(worst, fabs(m[i] - (1 - b1) * (b1 * g[i] + 2 * g[i])));
        worst = fmax(worst, fabs(v[i] - (1 - b2) * (b2 * g[i] * g[i] + 4 * g[i] * g[i])));
    }
    test_report("adamw_moments_two_steps", worst < 1e-14, "worst deviation %.3e", worst);

    // Minimizes a quadratic: 300 steps on f(p) = ½‖p − target‖² with no weight decay.
    double target[N];
    for (int i = 0; i < N; i++) { target[i] = test_rng_normal(rng); p[i] = p0[i]; m[i] = v[i] = 0.0; }
    for (int step = 1; step <= 300; step++) {
        for (int i = 0; i < N; i++) g[i] = p[i] - target[i];
        ref_adamw_step(p, g, m, v, N, 0.05, b1, b2, eps, 0.0, step);
    }
    double dist = test_rel_error(p, target, N);
    test_report("adamw_minimizes_quadratic", dist < 1e-2, "relative distance to optimum %.3e", dist);
}

// ---------------------------------------------------------------------------------------------
// Whole model

typedef struct {
    CpuGPT* model;
    const int *inputs, *targets;
} ModelCase;

static double model_loss(void* ctx) {
    ModelCase* m = (ModelCase*)ctx;
    return cpu_gpt_forward(m->model, m->inputs, m->targets);
}

// A tiny config: L2, h64, 4 heads (head dim 16) with kv_heads key/value heads, T16, vocab 60 padded to 64.
static GPTConfig tiny_config(int kv_heads) {
    GPTConfig c = {2, 64, 4, kv_heads, 60, 64, 16};
    return c;
}

static void fill_tokens(TestRng* rng, int* tokens, int n, int vocab) {
    for (int i = 0; i < n; i++) tokens[i] = (int)(test_rng_next(rng) % (uint64_t)vocab);
}

// Random parameters large enough that every path (attention, GELU curvature, LayerNorm
// weights) carries gradient; LayerNorm weights near 1.
static void fill_params(TestRng* rng, CpuGPT* model, double weight_scale) {
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        int is_ln_weight = GPT_PARAMS[t].init == INIT_ONES;
        for (size_t i = 0; i < model->param_sizes[t]; i++)
            model->param_tensors[t][i] = (is_ln_weight ? 1.0 : 0.0) + weight_scale * test_rng_normal(rng);
    }
}

// Per model (test_model): the init loss, causality, one gradient per parameter tensor, the vocab padding.
#define MODEL_CASES (3 + NUM_PARAM_TENSORS)

// The name of case k of a model whose names start with prefix ("model" or "model_gqa").
static void model_case_name(char* buf, size_t size, const char* prefix, int k) {
    if (k == 0) snprintf(buf, size, "%s_forward_init_loss_near_log_vocab", prefix);
    else if (k == 1) snprintf(buf, size, "%s_forward_is_causal", prefix);
    else if (k < 2 + NUM_PARAM_TENSORS) snprintf(buf, size, "%s_backward_d%s", prefix, GPT_PARAMS[k - 2].name);
    else snprintf(buf, size, "%s_backward_vocab_padding_is_zero", prefix);
}

// Cases from k on fail with `why` (the model could not be built or run), so every case still reports.
static void fail_model_cases(const char* prefix, int k, const char* why) {
    char name[96];
    for (; k < MODEL_CASES; k++) {
        model_case_name(name, sizeof(name), prefix, k);
        test_fail(name, "%s", why);
    }
}

// Causality: changing the last input token changes no logit before it (case 1).
static void check_model_causal(CpuGPT* model, int* inputs, const int* targets, int T, const char* name) {
    size_t row = (size_t)model->config.padded_vocab_size, n_logits = (size_t)model->B * T * row;
    double* before = test_alloc(n_logits);
    cpu_gpt_forward(model, inputs, targets);
    memcpy(before, model->logits, n_logits * sizeof(double));
    int saved = inputs[T - 1];
    inputs[T - 1] = (saved + 1) % model->config.vocab_size;
    cpu_gpt_forward(model, inputs, targets);
    inputs[T - 1] = saved;
    double earlier = 0.0, last = 0.0;
    for (size_t i = 0; i < (size_t)(T - 1) * row; i++) earlier = fmax(earlier, fabs(model->logits[i] - before[i]));
    for (size_t i = (size_t)(T - 1) * row; i < (size_t)T * row; i++)
        last = fmax(last, fabs(model->logits[i] - before[i]));
    test_report(name, earlier == 0.0 && last > 0.0,
                "max change before the edited position %.3e (want 0), at it %.3e (want > 0)", earlier, last);
    free(before);
}

// prefix: "model" (multi-head) or "model_gqa" (2 key/value heads for 4 heads), the test names' start.
static void test_model(TestRng* rng, int kv_heads, const char* prefix) {
    enum { B = 2, T = 16 };
    GPTConfig cfg = tiny_config(kv_heads);
    char name[96];
    CpuGPT model;
    if (cpu_gpt_create(&model, cfg, B, T) != 0) {
        fail_model_cases(prefix, 0, "cpu_gpt_create: out of memory");
        return;
    }
    int inputs[B * T], targets[B * T];
    fill_tokens(rng, inputs, B * T, cfg.vocab_size);
    fill_tokens(rng, targets, B * T, cfg.vocab_size);
    ModelCase mc = {&model, inputs, targets};

    // At GPT-2's init scale the logits are near zero, so the loss is near log V.
    fill_params(rng, &model, 0.02);
    double loss = cpu_gpt_forward(&model, inputs, targets);
    model_case_name(name, sizeof(name), prefix, 0);
    test_report(name, fabs(loss - log((double)cfg.vocab_size)) < 0.05,
                "loss %.4f, log V = %.4f", loss, log((double)cfg.vocab_size));
    fill_params(rng, &model, 0.3);
    model_case_name(name, sizeof(name), prefix, 1);
    check_model_causal(&model, inputs, targets, T, name);

    // Backward against finite differences on a sample of every parameter tensor.
    cpu_gpt_forward(&model, inputs, targets);
    if (cpu_gpt_backward(&model, inputs, targets) != 0) {
        fail_model_cases(prefix, 2, "cpu_gpt_backward: out of memory");
        cpu_gpt_destroy(&model);
        return;
    }
    enum { SAMPLES = 12 };
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        double analytic[SAMPLES], numeric[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) {
            size_t i = (size_t)(test_rng_next(rng) % model.param_sizes[t]);
            analytic[s] = model.grad_tensors[t][i];
            finite_differences(&numeric[s], model_loss, &mc, &model.param_tensors[t][i], 1);
        }
        model_case_name(name, sizeof(name), prefix, 2 + t);
        double err = test_rel_error(analytic, numeric, SAMPLES);
        test_report(name, err <= FD_TOLERANCE, "relative error %.3e > %.0e on %d sampled elements", err,
                    FD_TOLERANCE, SAMPLES);
    }
    // Rows of wte past the real vocab are neither inputs nor targets: their gradient is exactly 0.
    double padding = 0.0;
    for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < model.param_sizes[0]; i++)
        padding = fmax(padding, fabs(model.grad_tensors[0][i]));
    model_case_name(name, sizeof(name), prefix, MODEL_CASES - 1);
    test_report(name, padding == 0.0, "max |grad| %.3e", padding);
    cpu_gpt_destroy(&model);
}

// Finite differences of every qkv element, on odd shapes: causal or not, T = 1, GQA and MQA.
static const struct {
    const char* name;
    int B, T, NH, NKV, HD, causal;
} ATTENTION_BACKWARD[] = {
    {"attention_backward_noncausal", 2, 5, 2, 2, 3, 0},
    {"attention_backward_causal", 2, 5, 2, 2, 3, 1},
    {"attention_backward_causal_T1", 1, 1, 2, 2, 4, 1},
    {"attention_backward_causal_T7_HD8", 1, 7, 1, 1, 8, 1},
    {"attention_backward_gqa_causal_NH4_NKV2", 2, 5, 4, 2, 3, 1},
    {"attention_backward_mqa_noncausal_NH3_NKV1", 2, 5, 3, 1, 3, 0},
};

static const struct {
    const char* name;
    int NKV, causal;
} ATTENTION_GQA[] = {
    {"attention_gqa_NKV2_is_mha_with_repeated_kv_causal", 2, 1},
    {"attention_mqa_NKV1_is_mha_with_repeated_kv", 1, 0},
};

// kv_heads of the tiny model, and the start of its cases' names.
static const struct {
    int kv_heads;
    const char* prefix;
} MODELS[] = {{4, "model"}, {2, "model_gqa"}};

static void test_attention_backward_shapes(TestRng* rng) {
    for (size_t i = 0; i < COUNT(ATTENTION_BACKWARD); i++) {
        const int B = ATTENTION_BACKWARD[i].B, T = ATTENTION_BACKWARD[i].T, NH = ATTENTION_BACKWARD[i].NH;
        test_attention_backward(rng, B, T, NH, ATTENTION_BACKWARD[i].NKV, ATTENTION_BACKWARD[i].HD,
                                ATTENTION_BACKWARD[i].causal, ATTENTION_BACKWARD[i].name);
    }
}

static void test_attention_gqa(TestRng* rng) {
    for (size_t i = 0; i < COUNT(ATTENTION_GQA); i++)
        test_attention_gqa_is_repeated_kv(rng, ATTENTION_GQA[i].NKV, ATTENTION_GQA[i].causal, ATTENTION_GQA[i].name);
}

static void test_models(TestRng* rng) {
    for (size_t i = 0; i < COUNT(MODELS); i++) test_model(rng, MODELS[i].kv_heads, MODELS[i].prefix);
}

// Every group in the order it runs, with the number of cases it reports (the fixed ones counted from
// their test_report and check_gradient calls), so the PLAN line follows the code.
static const struct {
    void (*run)(TestRng* rng);
    int cases;
} GROUPS[] = {
    {test_encoder, 3},
    {test_layernorm, 4},
    {test_matmul, 4},
    {test_gelu, 2},
    {test_attention_forward, 4},
    {test_attention_backward_shapes, (int)COUNT(ATTENTION_BACKWARD)},
    {test_attention_gqa, (int)COUNT(ATTENTION_GQA)},
    {test_crossentropy, 3},
    {test_adamw, 3},
    {test_models, (int)COUNT(MODELS) * MODEL_CASES},
};

int main(void) {
    test_begin();
    int cases = 0;
    for (size_t i = 0; i < COUNT(GROUPS); i++) cases += GROUPS[i].cases;
    test_plan(cases);
    TestRng rng = {20240520u};
    for (size_t i = 0; i < COUNT(GROUPS); i++) GROUPS[i].run(&rng);
    return test_end();
}
