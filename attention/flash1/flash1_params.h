// flash1_params.h: the parameter structs of flash1's forward (flash1_forward.cu) and backward
// (flash1_backward.cu) kernels.
#ifndef FLASH1_PARAMS_H
#define FLASH1_PARAMS_H

#include <cuda_bf16.h>

typedef struct {
    const __nv_bfloat16 *q, *k, *v;
    __nv_bfloat16* out;
    float* lse;
    float* o_accum;  // (B, NH, T, HD): O of the key blocks seen so far, normalized
    float* row_max;  // (B, NH, T): m, in units of S·scale_log2
    float* row_sum;  // (B, NH, T): ℓ
    long qkv_stride, kv_stride, out_stride;
    int T, NH, NKV;
    float scale_log2;  // softmax scale · log2(e): exp(x·scale) = exp2(x·scale_log2)
} Flash1ForwardParams;

typedef struct {
    const __nv_bfloat16 *q, *k, *v, *out, *dout;
    const float* lse;
    __nv_bfloat16 *dq, *dk, *dv;
    float* dq_accum;  // (B, NH, T, HD)
    long qkv_stride, kv_stride, out_stride, dqkv_stride, dkv_stride;
    int T, NH, NKV;
    float scale, scale_log2;
} Flash1BackwardParams;

#endif  // FLASH1_PARAMS_H
