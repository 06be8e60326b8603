// cpu_reference.c: fp64 forward and backward of every GPT layer (see cpu_reference.h for the
// shapes and the += convention of the backward functions). Written for clarity, not speed.
#include "test/cpu_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_encoder_forward(double* out, const int* tokens, const double* wte, const double* wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            double* o = out + ((size_t)b * T + t) * C;
            const double* tok_row = wte + (size_t)tokens[b * T + t] * C;
            const double* pos_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok_row[c] + pos_row[c];
        }
    }
}

void ref_encoder_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const double* d = dout + ((size_t)b * T + t) * C;
            double* dtok = dwte + (size_t)tokens[b * T + t] * C;
            double* dpos = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dtok[c] += d[c];
                dpos[c] += d[c];
            }
        }
    }
}

#define LAYERNORM_EPS 1e-5

void ref_layernorm_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                           const double* bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double* x = inp + (size_t)n * C;
        double m = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;  // biased variance, as PyTorch's LayerNorm
        double s = 1.0 / sqrt(var + LAYERNORM_EPS);
        double* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void ref_layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                            const double* weight, const double* mean, const double* rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double* x = inp + (size_t)n * C;
        const double* d = dout + (size_t)n * C;
        // With xhat = (x - mean)·rstd and g = dout·weight:
        // dx = rstd · (g − mean(g) − xhat · mean(g·xhat)).
        double g_mean = 0.0, g_xhat_mean = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            double g = d[c] * weight[c];
            g_mean += g;
            g_xhat_mean += g * xhat;
            dweight[c] += d[c] * xhat;
            dbias[c] += d[c];
        }
        g_mean /= C;
        g_xhat_mean /= C;
        double* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            dx[c] += rstd[n] * (d[c] * weight[c] - g_mean - xhat * g_xhat_mean);
        }
    }
}

void ref_matmul_forward(double* out, const double* inp, const double* weight, const double* bias, int N, int IC,
                        int OC) {
    for (int n = 0; n < N; n++) {
        const double* x = inp + (size_t)n * IC;
        for (int o = 0; o < OC; o++) {
            const double* w = weight + (size_t)o * IC;
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++) acc += x[i] * w[i];
            out[(size_t)n * OC + o] = acc;
        }
    }
}

void ref_matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                         const double* weight, int N, int IC, int OC) {
    for (int n = 0; n < N; n++) {
        const double* d = dout + (size_t)n * OC;
        const double* x = inp + (size_t)n * IC;
        double* dx = dinp + (size_t)n * IC;
        for (int o = 0; o < OC; o++) {
            const double* w = weight + (size_t)o * IC;
            double* dw = dweight + (size_t)o * IC;
            for (int i = 0; i < IC; i++) {
                dx[i] += d[o] * w[i];   // dinp = dout · weight
                dw[i] += d[o] * x[i];   // dweight = doutᵀ · inp
            }
            if (dbias) dbias[o] += d[o];
        }
    }
}

#define GELU_SCALE 0.7978845608028654  // sqrt(2/pi)

void ref_gelu_forward(double* out, const double* inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(GELU_SCALE * (x + 0.044715 * x * x * x)));
    }
}

void ref_gelu_backward(double* dinp, const double* dout, const double* inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        double u = GELU_SCALE * (x + 0.044715 * x * x * x);
        double th = tanh(u);
        double du_dx = GELU_SCALE * (1.0 + 3.0 * 0.044715 * x * x);
        double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du_dx;
        dinp[i] += grad * dout[i];
    }
}

// Offsets into the packed qkv (B, T, 3, NH, HD) and into (B, T, NH, HD) tensors.
// Row of head h of q (which 0), K/V head h of k (1) or v (2) in qkv (B, T, NH + 2·NKV, HD).
static size_t qkv_offset(int b, int t, int which, int h, int T, int NH, int NKV, int HD) {
    const int head = which == 0 ? h : which == 1 ? NH + h : NH + NKV + h;
    return (((size_t)b * T + t) * (NH + 2 * NKV) + head) * HD;
}
static size_t bthd_offset(int b, int t, int h, int T, int NH, int HD) {
    return (((size_t)b * T + t) * NH + h) * HD;
}

void ref_attention_forward(double* out, double* lse, const double* qkv, int B, int T, int NH, int NKV, int HD,
                           int causal) {
    double scale = 1.0 / sqrt((double)HD);
    double* scores = (double*)malloc((size_t)T * sizeof(double));  // one row of S, then of P
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV);  // the K/V head of query head h
            for (int i = 0; i < T; i++) {
                const double* q = qkv + qkv_offset(b, i, 0, h, T, NH, NKV, HD);
                int num_keys = causal ? i + 1 : T;
                double row_max = -INFINITY;
                for (int j = 0; j < num_keys; j++) {
                    const double* k = qkv + qkv_offset(b, j, 1, g, T, NH, NKV, HD);
                    double s = 0.0;
                    for (int d = 0; d < HD; d++) s += q[d] * k[d];
                    scores[j] = s * scale;
                    if (scores[j] > row_max) row_max = scores[j];
                }
                double row_sum = 0.0;
                for (int j = 0; j < num_keys; j++) {
                    scores[j] = exp(scores[j] - row_max);
                    row_sum += scores[j];
                }
                double* o = out + bthd_offset(b, i, h, T, NH, HD);
                for (int d = 0; d < HD; d++) o[d] = 0.0;
                for (int j = 0; j < num_keys; j++) {
                    const double* v = qkv + qkv_offset(b, j, 2, g, T, NH, NKV, HD);
                    double p = scores[j] / row_sum;
                    for (int d = 0; d < HD; d++) o[d] += p * v[d];
                }
                lse[((size_t)b * NH + h) * T + i] = row_max + log(row_sum);
            }
        }
    }
    free(scores);
}

void ref_attention_backward(double* dqkv, const double* dout, const double* qkv, const double* out,
                            const double* lse, int B, int T, int NH, int NKV, int HD, int causal) {
    double scale = 1.0 / sqrt((double)HD);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV);  // dK, dV of K/V head g sum over its query heads
            for (int i = 0; i < T; i++) {
                const double* q = qkv + qkv_offset(b, i, 0, h, T, NH, NKV, HD);
                const double* o = out + bthd_offset(b, i, h, T, NH, HD);
                const double* dO = dout + bthd_offset(b, i, h, T, NH, HD);
                double* dq = dqkv + qkv_offset(b, i, 0, h, T, NH, NKV, HD);
                double row_lse = lse[((size_t)b * NH + h) * T + i];
                // D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij, the softmax backward's correction term.
                double D = 0.0;
                for (int d = 0; d < HD; d++) D += dO[d] * o[d];
                int num_keys = causal ? i + 1 : T;
                for (int j = 0; j < num_keys; j++) {
                    const double* k = qkv + qkv_offset(b, j, 1, g, T, NH, NKV, HD);
                    const double* v = qkv + qkv_offset(b, j, 2, g, T, NH, NKV, HD);
                    double* dk = dqkv + qkv_offset(b, j, 1, g, T, NH, NKV, HD);
                    double* dv = dqkv + qkv_offset(b, j, 2, g, T, NH, NKV, HD);
                    double s = 0.0, dp = 0.0;
                    for (int d = 0; d < HD; d++) {
                        s += q[d] * k[d];
                        dp += dO[d] * v[d];
                    }
                    double p = exp(s * scale - row_lse);
                    double ds = p * (dp - D);  // dS = P ∘ (dP − D)
                    for (int d = 0; d < HD; d++) {
                        dv[d] += p * dO[d];
                        dq[d] += scale * ds * k[d];
                        dk[d] += scale * ds * q[d];
                    }
                }
            }
        }
    }
}

double ref_crossentropy_forward(double* losses, const double* logits, const int* targets, int N, int V, int Vp) {
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        const double* row = logits + (size_t)n * Vp;
        double row_max = -INFINITY;
        for (int v = 0; v < V; v++) row_max = row[v] > row_max ? row[v] : row_max;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp(row[v] - row_max);
        losses[n] = row_max + log(sum) - row[targets[n]];  // −log softmax(row)[target]
        total += losses[n];
    }
    return total / N;
}

void ref_crossentropy_backward(double* dlogits, const double* logits, const int* targets, double dloss, int N,
                               int V, int Vp) {
    for (int n = 0; n < N; n++) {
        const double* row = logits + (size_t)n * Vp;
        double* drow = dlogits + (size_t)n * Vp;
        double row_max = -INFINITY;
        for (int v = 0; v < V; v++) row_max = row[v] > row_max ? row[v] : row_max;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp(row[v] - row_max);
        for (int v = 0; v < V; v++) {
            double prob = exp(row[v] - row_max) / sum;
            drow[v] += dloss * (prob - (v == targets[n] ? 1.0 : 0.0));
        }
    }
}

void ref_adamw_step(double* params, const double* grads, double* m, double* v, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step) {
    double m_correction = 1.0 - pow(beta1, step), v_correction = 1.0 - pow(beta2, step);
    for (size_t i = 0; i < n; i++) {
        m[i] = beta1 * m[i] + (1.0 - beta1) * grads[i];
        v[i] = beta2 * v[i] + (1.0 - beta2) * grads[i] * grads[i];
        double m_hat = m[i] / m_correction, v_hat = v[i] / v_correction;
        params[i] -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * params[i]);
    }
}
