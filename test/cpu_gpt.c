// cpu_gpt.c: fp64 GPT forward and backward on the CPU (see cpu_gpt.h).
//
// Block l (pre-LayerNorm), with residual = encoded for l = 0, else residual3[l-1]:
//   ln1 = LN(residual);  qkv = ln1·qkvwᵀ + qkvb;  atty = causal_attention(qkv)
//   residual2 = residual + atty·attprojwᵀ + attprojb
//   ln2 = LN(residual2); fch = ln2·fcwᵀ + fcb;  fch_gelu = GELU(fch)
//   residual3 = residual2 + fch_gelu·fcprojwᵀ + fcprojb
// then lnf = LN(residual3[L-1]), logits = lnf·wteᵀ (tied LM head, no bias), mean cross-entropy.
#include "test/cpu_gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test/cpu_reference.h"

// Parameter tensor indices, in gpt_config.h's order.
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };

static double* alloc_zeroed(size_t n, int* failed) {
    double* p = (double*)calloc(n ? n : 1, sizeof(double));
    if (!p) *failed = 1;
    return p;
}

int cpu_gpt_create(CpuGPT* model, GPTConfig config, int B, int T) {
    memset(model, 0, sizeof(*model));
    if (T > config.max_seq_len) return -1;
    model->config = config;
    model->B = B;
    model->T = T;
    gpt_param_sizes(model->param_sizes, &config);
    model->num_params = gpt_num_params(&config);

    int failed = 0;
    model->params = alloc_zeroed(model->num_params, &failed);
    model->grads = alloc_zeroed(model->num_params, &failed);
    if (failed) { cpu_gpt_destroy(model); return -1; }
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        model->param_tensors[i] = model->params + offset;
        model->grad_tensors[i] = model->grads + offset;
        offset += model->param_sizes[i];
    }

    size_t L = (size_t)config.num_layers, C = (size_t)config.channels, NH = (size_t)config.num_heads;
    size_t BT = (size_t)B * T, Vp = (size_t)config.padded_vocab_size, QKV = gpt_qkv_features(&config);
    model->encoded = alloc_zeroed(BT * C, &failed);
    model->ln1 = alloc_zeroed(L * BT * C, &failed);
    model->ln1_mean = alloc_zeroed(L * BT, &failed);
    model->ln1_rstd = alloc_zeroed(L * BT, &failed);
    model->qkv = alloc_zeroed(L * BT * QKV, &failed);  // (L, B, T, NH + 2·NKV, HD)
    model->atty = alloc_zeroed(L * BT * C, &failed);
    model->att_lse = alloc_zeroed(L * NH * BT, &failed);
    model->residual2 = alloc_zeroed(L * BT * C, &failed);
    model->ln2 = alloc_zeroed(L * BT * C, &failed);
    model->ln2_mean = alloc_zeroed(L * BT, &failed);
    model->ln2_rstd = alloc_zeroed(L * BT, &failed);
    model->fch = alloc_zeroed(L * BT * 4 * C, &failed);
    model->fch_gelu = alloc_zeroed(L * BT * 4 * C, &failed);
    model->residual3 = alloc_zeroed(L * BT * C, &failed);
    model->lnf = alloc_zeroed(BT * C, &failed);
    model->lnf_mean = alloc_zeroed(BT, &failed);
    model->lnf_rstd = alloc_zeroed(BT, &failed);
    model->logits = alloc_zeroed(BT * Vp, &failed);
    model->losses = alloc_zeroed(BT, &failed);
    if (failed) { cpu_gpt_destroy(model); return -1; }
    return 0;
}

void cpu_gpt_destroy(CpuGPT* model) {
    double* buffers[] = {model->params,    model->grads,     model->encoded,  model->ln1,      model->ln1_mean,
                         model->ln1_rstd,  model->qkv,       model->atty,     model->att_lse,  model->residual2,
                         model->ln2,       model->ln2_mean,  model->ln2_rstd, model->fch,      model->fch_gelu,
                         model->residual3, model->lnf,       model->lnf_mean, model->lnf_rstd, model->logits,
                         model->losses};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) free(buffers[i]);
    memset(model, 0, sizeof(*model));
}

double cpu_gpt_forward(CpuGPT* model, const int* inputs, const int* targets) {
    const GPTConfig* cfg = &model->config;
    int B = model->B, T = model->T, C = cfg->channels, NH = cfg->num_heads, HD = C / NH, NKV = cfg->num_kv_heads;
    int N = B * T, QKV = (int)gpt_qkv_features(cfg);
    size_t NC = (size_t)N * C;
    double** p = model->param_tensors;

    ref_encoder_forward(model->encoded, inputs, p[WTE], p[WPE], B, T, C);
    for (int l = 0; l < cfg->num_layers; l++) {
        const double* residual = l == 0 ? model->encoded : model->residual3 + (size_t)(l - 1) * NC;
        double* ln1 = model->ln1 + l * NC;
        double* qkv = model->qkv + (size_t)l * N * QKV;
        double* atty = model->atty + l * NC;
        double* residual2 = model->residual2 + l * NC;
        double* ln2 = model->ln2 + l * NC;
        double* fch = model->fch + l * 4 * NC;
        double* fch_gelu = model->fch_gelu + l * 4 * NC;
        double* residual3 = model->residual3 + l * NC;
        size_t lC = (size_t)l * C;

        ref_layernorm_forward(ln1, model->ln1_mean + (size_t)l * N, model->ln1_rstd + (size_t)l * N, residual,
                              p[LN1W] + lC, p[LN1B] + lC, N, C);
        ref_matmul_forward(qkv, ln1, p[QKVW] + (size_t)l * QKV * C, p[QKVB] + (size_t)l * QKV, N, C, QKV);
        ref_attention_forward(atty, model->att_lse + (size_t)l * N * NH, qkv, B, T, NH, NKV, HD, 1);
        ref_matmul_forward(residual2, atty, p[ATTPROJW] + lC * C, p[ATTPROJB] + lC, N, C, C);
        for (size_t i = 0; i < NC; i++) residual2[i] += residual[i];
        ref_layernorm_forward(ln2, model->ln2_mean + (size_t)l * N, model->ln2_rstd + (size_t)l * N, residual2,
                              p[LN2W] + lC, p[LN2B] + lC, N, C);
        ref_matmul_forward(fch, ln2, p[FCW] + lC * 4 * C, p[FCB] + lC * 4, N, C, 4 * C);
        ref_gelu_forward(fch_gelu, fch, 4 * NC);
        ref_matmul_forward(residual3, fch_gelu, p[FCPROJW] + lC * 4 * C, p[FCPROJB] + lC, N, 4 * C, C);
        for (size_t i = 0; i < NC; i++) residual3[i] += residual2[i];
    }
    const double* final_residual = model->residual3 + (size_t)(cfg->num_layers - 1) * NC;
    ref_layernorm_forward(model->lnf, model->lnf_mean, model->lnf_rstd, final_residual, p[LNFW], p[LNFB], N, C);
    ref_matmul_forward(model->logits, model->lnf, p[WTE], NULL, N, C, cfg->padded_vocab_size);
    return ref_crossentropy_forward(model->losses, model->logits, targets, N, cfg->vocab_size,
                                    cfg->padded_vocab_size);
}

int cpu_gpt_backward(CpuGPT* model, const int* inputs, const int* targets) {
    const GPTConfig* cfg = &model->config;
    int B = model->B, T = model->T, C = cfg->channels, NH = cfg->num_heads, HD = C / NH, NKV = cfg->num_kv_heads;
    int N = B * T, Vp = cfg->padded_vocab_size, QKV = (int)gpt_qkv_features(cfg);
    size_t NC = (size_t)N * C;
    double** p = model->param_tensors;
    double** g = model->grad_tensors;
    memset(model->grads, 0, model->num_params * sizeof(double));

    // Scratch gradients of activations, reused by every layer.
    double* dlogits = (double*)calloc((size_t)N * Vp, sizeof(double));
    double* dresidual = (double*)calloc(NC, sizeof(double));   // d loss / d (current residual stream)
    double* dresidual2 = (double*)calloc(NC, sizeof(double));
    double* dln = (double*)calloc(NC, sizeof(double));
    double* datty = (double*)calloc(NC, sizeof(double));
    double* dqkv = (double*)calloc((size_t)N * QKV, sizeof(double));
    double* dfch = (double*)calloc(4 * NC, sizeof(double));
    double* dfch_gelu = (double*)calloc(4 * NC, sizeof(double));
    int out_of_memory = !dlogits || !dresidual || !dresidual2 || !dln || !datty || !dqkv || !dfch || !dfch_gelu;
    if (out_of_memory) goto done;

    ref_crossentropy_backward(dlogits, model->logits, targets, 1.0 / N, N, cfg->vocab_size, Vp);
    ref_matmul_backward(dln, g[WTE], NULL, dlogits, model->lnf, p[WTE], N, C, Vp);
    const double* final_residual = model->residual3 + (size_t)(cfg->num_layers - 1) * NC;
    ref_layernorm_backward(dresidual, g[LNFW], g[LNFB], dln, final_residual, p[LNFW], model->lnf_mean,
                           model->lnf_rstd, N, C);

    for (int l = cfg->num_layers - 1; l >= 0; l--) {
        const double* residual = l == 0 ? model->encoded : model->residual3 + (size_t)(l - 1) * NC;
        size_t lC = (size_t)l * C;
        // Here dresidual holds d loss / d residual3[l]. The MLP branch: residual3 = residual2 + MLP(residual2).
        memset(dfch_gelu, 0, 4 * NC * sizeof(double));
        memset(dfch, 0, 4 * NC * sizeof(double));
        memset(dln, 0, NC * sizeof(double));
        memcpy(dresidual2, dresidual, NC * sizeof(double));
        ref_matmul_backward(dfch_gelu, g[FCPROJW] + lC * 4 * C, g[FCPROJB] + lC, dresidual,
                            model->fch_gelu + l * 4 * NC, p[FCPROJW] + lC * 4 * C, N, 4 * C, C);
        ref_gelu_backward(dfch, dfch_gelu, model->fch + l * 4 * NC, 4 * NC);
        ref_matmul_backward(dln, g[FCW] + lC * 4 * C, g[FCB] + lC * 4, dfch, model->ln2 + l * NC,
                            p[FCW] + lC * 4 * C, N, C, 4 * C);
        ref_layernorm_backward(dresidual2, g[LN2W] + lC, g[LN2B] + lC, dln, model->residual2 + l * NC,
                               p[LN2W] + lC, model->ln2_mean + (size_t)l * N, model->ln2_rstd + (size_t)l * N, N,
                               C);

        // The attention branch: residual2 = residual + Attn(residual).
        memset(datty, 0, NC * sizeof(double));
        memset(dqkv, 0, (size_t)N * QKV * sizeof(double));
        memset(dln, 0, NC * sizeof(double));
        memcpy(dresidual, dresidual2, NC * sizeof(double));
        ref_matmul_backward(datty, g[ATTPROJW] + lC * C, g[ATTPROJB] + lC, dresidual2, model->atty + l * NC,
                            p[ATTPROJW] + lC * C, N, C, C);
        ref_attention_backward(dqkv, datty, model->qkv + (size_t)l * N * QKV, model->atty + l * NC,
                               model->att_lse + (size_t)l * N * NH, B, T, NH, NKV, HD, 1);
        ref_matmul_backward(dln, g[QKVW] + (size_t)l * QKV * C, g[QKVB] + (size_t)l * QKV, dqkv, model->ln1 + l * NC,
                            p[QKVW] + (size_t)l * QKV * C, N, C, QKV);
        ref_layernorm_backward(dresidual, g[LN1W] + lC, g[LN1B] + lC, dln, residual, p[LN1W] + lC,
                               model->ln1_mean + (size_t)l * N, model->ln1_rstd + (size_t)l * N, N, C);
    }
    ref_encoder_backward(g[WTE], g[WPE], dresidual, inputs, B, T, C);

done:
    free(dlogits); free(dresidual); free(dresidual2); free(dln);
    free(datty); free(dqkv); free(dfch); free(dfch_gelu);
    return out_of_memory ? -1 : 0;
}

double cpu_gpt_forward_backward(const int config[7], int B, int T, const double* params, const int* inputs,
                                const int* targets, double* logits, double* grads) {
    GPTConfig c;
    c.num_layers = config[0], c.channels = config[1], c.num_heads = config[2], c.vocab_size = config[3];
    c.padded_vocab_size = config[4], c.max_seq_len = config[5], c.num_kv_heads = config[6];
    if (c.num_heads < 1 || c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0) return NAN;  // NKV: a divisor of NH
    CpuGPT model;
    if (cpu_gpt_create(&model, c, B, T) != 0) return NAN;
    memcpy(model.params, params, model.num_params * sizeof(double));
    double loss = cpu_gpt_forward(&model, inputs, targets);
    memcpy(logits, model.logits, (size_t)B * T * c.padded_vocab_size * sizeof(double));
    if (grads) {
        if (cpu_gpt_backward(&model, inputs, targets) != 0) loss = NAN;
        memcpy(grads, model.grads, model.num_params * sizeof(double));
    }
    cpu_gpt_destroy(&model);
    return loss;
}

int cpu_gpt_likely_targets(const int config[7], int B, int T, const double* params, const int* inputs, int* targets) {
    const int V = config[3], Vp = config[4], N = B * T;
    double* logits = (double*)malloc((size_t)N * Vp * sizeof(double));
    int* any = (int*)calloc((size_t)N, sizeof(int));  // targets for the forward's loss, which is not used
    int rc = -1;
    if (logits && any && !isnan(cpu_gpt_forward_backward(config, B, T, params, inputs, any, logits, NULL))) {
        for (int n = 0; n < N; n++) {
            const double* row = logits + (size_t)n * Vp;
            int best = 0;
            for (int v = 1; v < V; v++) best = row[v] > row[best] ? v : best;
            targets[n] = best;
        }
        rc = 0;
    }
    free(logits);
    free(any);
    return rc;
}
