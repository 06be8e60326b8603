// flash2_backward.cu: picks the flash2 backward kernel (Hopper's wgmma or mma.sync) and its block
// shapes per head dim and launches it (the kernels and what they compute: flash2_backward_hopper.cuh,
// flash2_backward_kernel.cuh).
#include <stdio.h>
#include <stdlib.h>

#include "backends.h"
#include "flash2_backward_hopper.cuh"
#include "flash2_backward_kernel.cuh"

void flash2_require_aligned(const void* ptr, long stride, const char* what);  // flash2_forward.cu

// ---- block shapes per head dim ----------------------------------------------------------------
// (query rows per step, warps (16 keys each), blocks per SM), measured with build/flash2_tune
// (attention/flash2_tune.cu; results in attention/PERF_NOTES.md).
template <bool CAUSAL>
static void dispatch_backward(const Flash2BackwardParams* p, int B, int HD, cudaStream_t stream) {
    if (flash2_use_wgmma()) {  // Hopper: flash2_backward_hopper.cuh
        switch (HD) {
            case 64: launch_backward_hopper<64, 128, true, CAUSAL>(p, B, stream); break;
            case 80: launch_backward_hopper<80, 64, true, CAUSAL>(p, B, stream); break;
            case 96: launch_backward_hopper<96, 64, true, CAUSAL>(p, B, stream); break;
            case 128: launch_backward_hopper<128, 64, true, CAUSAL>(p, B, stream); break;
        }
        return;
    }
    switch (HD) {
        case 64: launch_backward<64, 128, 8, 1, CAUSAL>(p, B, stream); break;
        case 80: launch_backward<80, 64, 8, 1, CAUSAL>(p, B, stream); break;
        case 96: launch_backward<96, 64, 8, 1, CAUSAL>(p, B, stream); break;
        case 128: launch_backward<128, 64, 8, 1, CAUSAL>(p, B, stream); break;
    }
}

size_t flash2_attention_workspace_bytes(const AttentionShape* s) {
    const size_t rows = (size_t)s->B * s->NH * s->T;
    return rows * s->HD * sizeof(float) + 2 * rows * sizeof(float);  // dq_accum, D, LSE·log2 e
}

void flash2_attention_backward(const AttentionArgs* args, cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    flash2_require_aligned(args->q, args->qkv_stride, "q");
    flash2_require_aligned(args->k, args->qkv_stride, "k");
    flash2_require_aligned(args->v, args->qkv_stride, "v");
    flash2_require_aligned(args->out, args->out_stride, "out");
    flash2_require_aligned(args->dout, args->out_stride, "dout");
    flash2_require_aligned(args->dq, args->dqkv_stride, "dq");
    flash2_require_aligned(args->dk, args->dqkv_stride, "dk");
    flash2_require_aligned(args->dv, args->dqkv_stride, "dv");
    flash2_require_aligned(args->workspace, 8, "the workspace");
    Flash2BackwardParams p;
    p.q = args->q;
    p.k = args->k;
    p.v = args->v;
    p.out = args->out;
    p.dout = args->dout;
    p.lse = args->lse;
    p.dq = args->dq;
    p.dk = args->dk;
    p.dv = args->dv;
    const size_t rows = (size_t)s->B * s->NH * s->T;
    p.dq_accum = (float*)args->workspace;
    p.d_rows = p.dq_accum + rows * s->HD;
    p.lse_log2 = p.d_rows + rows;
    p.qkv_stride = args->qkv_stride;
    p.out_stride = args->out_stride;
    p.dqkv_stride = args->dqkv_stride;
    p.T = s->T;
    p.NH = s->NH;
    p.scale = 1.f / sqrtf((float)s->HD);
    p.scale_log2 = p.scale * FLASH2_LOG2E;
    if (s->causal) dispatch_backward<true>(&p, s->B, s->HD, stream);
    else dispatch_backward<false>(&p, s->B, s->HD, stream);
}
