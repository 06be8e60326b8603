// qkv_bias.cuh: the gradient of the qkv projection's bias, (NH + 2·NKV)·HD values in q | k | v order,
// without a pass over all of dqkv (N, (NH + 2·NKV)·HD). Attention softmax(q·kᵀ/√HD)·v makes two of
// its three parts exact functions of gradients the backward already has:
//   q part (NH·HD)   (+)= the column sums of dqkv's q columns (matmul_column_sums: NH of the
//                        NH + 2·NKV heads' bytes), or nothing here where the attention backward
//                        added them from the dq tiles it wrote (AttentionArgs.dq_colsum);
//   k part (NKV·HD)   = 0. b_k adds q·b_k to every logit of a query row, and softmax is unchanged by
//                        adding one value to a whole row, so the loss does not depend on b_k;
//   v part (NKV·HD)   = Σ_t d(atty)[t] summed over the query heads of each K/V head's group. Every row
//                        of P sums to one, so b_v adds b_v to every row of the attention output atty.
//                        With y = atty·Wᵀ + b the attention projection, Σ_t d(atty)[t] = (Σ_t dy[t])·W
//                        = dbias_proj·W: a (1, C)·(C, C) product of the projection's bias gradient
//                        (the same column-sum pass, rows weighted by dbias_proj).
//                        That gradient holds the sum over every micro batch so far (it is accumulated
//                        in place), so the v part is written as the sum so far too, not added.
// The old way, the column sums of all of dqkv, costs a pass over 3× the q part's bytes (GPT3-1.3B at
// 8 × 2048: 201 MB per layer); the products and sums here differ from it only by rounding.
#ifndef QKV_BIAS_CUH
#define QKV_BIAS_CUH

#include "layers/model/matmul.cuh"

// dk_bias (NKV·HD) = 0; dv_bias[g·HD + d] = Σ_{h = g·G .. g·G + G − 1} datty_sum[h·HD + d], G = NH / NKV
// (query head h reads K/V head h / G).
static __global__ void qkv_bias_kv_kernel(__nv_bfloat16* dk_bias, __nv_bfloat16* dv_bias,
                                          const __nv_bfloat16* datty_sum, int NH, int NKV, int HD) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= NKV * HD) return;
    const int group = NH / NKV, g = j / HD, d = j % HD;
    float sum = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) sum += __bfloat162float(datty_sum[h * HD + d]);
    dk_bias[j] = __float2bfloat16(0.0f);
    dv_bias[j] = __float2bfloat16(sum);
}

// dqkv_bias ((NH + 2·NKV)·HD) from dqkv (N, (NH + 2·NKV)·HD) and the attention projection's bias
// gradient dproj_bias (C = NH·HD, summed over the micro batches so far) and weight proj_weight (C, C):
// see the top of the file; the q part is added to when accumulate, and left as it is when q_done
// (the attention backward added it: AttentionArgs.dq_colsum). datty_sum: C bf16 values of device
// scratch; scratch: matmul_dbias_scratch_bytes(max(N, C), C) bytes. Runs on mm->stream.
static void qkv_bias_backward(MatmulContext* mm, __nv_bfloat16* dqkv_bias, const __nv_bfloat16* dqkv,
                              const __nv_bfloat16* dproj_bias, const __nv_bfloat16* proj_weight,
                              __nv_bfloat16* datty_sum, void* scratch, int N, int NH, int NKV, int HD,
                              int accumulate, int q_done) {
    const int C = NH * HD, KV = NKV * HD;
    if (!q_done) matmul_column_sums(mm, dqkv_bias, scratch, dqkv, NULL, (long)(C + 2 * KV), N, C, accumulate);
    // datty_sum (C) = dproj_bias (C) · proj_weight (C, C): the projection's rows weighted and summed
    matmul_column_sums(mm, datty_sum, scratch, proj_weight, dproj_bias, C, C, C, 0);
    qkv_bias_kv_kernel<<<(KV + 255) / 256, 256, 0, mm->stream>>>(dqkv_bias + C, dqkv_bias + C + KV, datty_sum, NH,
                                                                  NKV, HD);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // QKV_BIAS_CUH
