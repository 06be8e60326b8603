// flash2_params.h: the parameter structs of flash2's forward and backward kernels, which both kernel
// families take (the mma.sync kernels of sm80/ and the Hopper kernels of sm90/).
#ifndef FLASH2_PARAMS_H
#define FLASH2_PARAMS_H

#include <cuda_bf16.h>

typedef struct {
    const __nv_bfloat16 *q, *k, *v;
    __nv_bfloat16* out;
    float* out_f32;  // NULL, or O in fp32 too (AttentionArgs.out_f32), at out_stride
    float* lse;
    long qkv_stride, kv_stride, out_stride;
    int T, NH, NKV;
    float scale_log2;  // softmax scale · log2(e): exp(x·scale) = exp2(x·scale_log2)
    int B;             // the persistent Hopper kernel walks all B·NH heads itself
    // Hopper, persistent: 8 bytes of scratch (8-byte aligned, any content) from which the blocks take
    // their next tile in turn, or NULL for a fixed round-robin (uniform non-causal tiles need no
    // more). The launch gives each call its own tile_epoch, which the word holds beside the count of
    // tiles taken, so it needs no zeroing before the call (flash2_forward_hopper.cuh).
    unsigned long long* tile_counter;
    unsigned tile_epoch;
} Flash2ForwardParams;

typedef struct {
    const __nv_bfloat16 *q, *k, *v, *out, *dout;
    const float* lse;
    __nv_bfloat16 *dq, *dk, *dv;
    float* dq_accum;  // (B, NH, T, HD); the Hopper kernels lay out their own workspace from here
    float* d_rows;    // (B, NH, lse_rows): D = rowsum(dO ∘ O)
    float* lse_log2;  // (B, NH, lse_rows): lse · log2(e), so that P = exp2(S·scale_log2 − lse_log2)
    long qkv_stride, kv_stride, out_stride, dqkv_stride, dkv_stride;
    int T, NH, NKV;
    int lse_rows;  // rows per head of d_rows and lse_log2 (every caller passes T)
    float scale, scale_log2;
    __nv_bfloat16* dq_colsum;  // NULL, or (NH·HD) (+)= Σ_{b,t} dq (AttentionArgs.dq_colsum; Hopper only)
    int dq_colsum_accumulate;
} Flash2BackwardParams;

#endif  // FLASH2_PARAMS_H
