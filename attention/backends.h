// backends.h: what each attention backend provides to the dispatcher in attention.cu.
// Users call the interface in attention.h; only attention.cu calls these.
#ifndef ATTENTION_BACKENDS_H
#define ATTENTION_BACKENDS_H

#include "attention/attention.h"

// naive (attention_naive.cu): S and P materialized with cuBLAS strided-batched GEMMs.
size_t naive_attention_saved_bytes(const AttentionShape* shape);
size_t naive_attention_workspace_bytes(const AttentionShape* shape);
void naive_attention_forward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream);
void naive_attention_backward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream);
// naive-recompute: nothing saved; the backward recomputes S and P (workspace B·NH·T²·6 bytes).
size_t naive_recompute_attention_workspace_bytes(const AttentionShape* shape);
void naive_recompute_attention_forward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream);
void naive_recompute_attention_backward(const AttentionContext* ctx, const AttentionArgs* args, cudaStream_t stream);

// flash1 (flash1_forward.cu, flash1_backward.cu): FlashAttention-1 on mma.sync tensor cores, one
// thread block per (batch, head); the head dims of flash2.
size_t flash1_attention_workspace_bytes(const AttentionShape* shape);
void flash1_attention_forward(const AttentionArgs* args, cudaStream_t stream);
void flash1_attention_backward(const AttentionArgs* args, cudaStream_t stream);

// flash2 (flash2_forward.cu, flash2_backward.cu): FlashAttention-2, on wgmma (Hopper kernels) when
// flash2_use_wgmma(), else on mma.sync tensor cores. The dispatcher passes the switches it read from
// the environment (AttentionFlash2Settings, attention.h): mma_sync_forced keeps Hopper on mma.sync,
// forward_long_t moves the length from which the Hopper forward takes its long-sequence tile shape.
int flash2_supports_head_dim(int head_dim);
int flash2_use_wgmma(const AttentionFlash2Settings* settings);
size_t flash2_attention_workspace_bytes(const AttentionShape* shape);
// 1 where the Hopper backward runs: its dQ pass sums dq's columns (AttentionArgs.dq_colsum).
int flash2_sums_dq_columns(const AttentionShape* shape, const AttentionFlash2Settings* settings);
void flash2_attention_forward(const AttentionArgs* args, const AttentionFlash2Settings* settings,
                              cudaStream_t stream);
void flash2_attention_backward(const AttentionArgs* args, const AttentionFlash2Settings* settings,
                               cudaStream_t stream);

#endif  // ATTENTION_BACKENDS_H
