// flash2_backward.cu: picks the flash2 backward kernel and its tiles per head dim and launches it: on
// Hopper the warp-specialized TMA kernel of flash2_backward_hopper.cuh (tiles and dK operand from
// flash2_tiles.h; deterministic when AttentionArgs.deterministic), elsewhere the mma.sync kernel of
// flash2_backward_kernel.cuh.
#include <stdio.h>
#include <stdlib.h>

#include "attention/backends.h"
#include "attention/common/alignment.h"
#include "attention/flash2/flash2_params.h"
#include "attention/flash2/flash2_tiles.h"
#include "attention/flash2/sm80/flash2_backward_kernel.cuh"
#include "attention/flash2/sm90/flash2_backward_hopper.cuh"

template <int HD, bool CAUSAL>
static void launch_backward_hopper_tiles(const Flash2BackwardParams* p, int B, int deterministic,
                                         cudaStream_t stream) {
    typedef Flash2BackwardTiles<HD, CAUSAL> Tiles;
    if (deterministic) launch_backward_ws<HD, Tiles::BLOCK_M, CAUSAL, true, Tiles::DK_FROM_SMEM, Tiles::SCHEDULE>(p, B, stream);
    else launch_backward_ws<HD, Tiles::BLOCK_M, CAUSAL, false, Tiles::DK_FROM_SMEM, Tiles::SCHEDULE>(p, B, stream);
}

// mma.sync shapes: (query rows per step, warps (16 keys each), blocks per SM), the fastest
// build/flash2_tune found (attention/tools/flash2_tune.cu; results in attention/PERF_NOTES.md).
template <bool CAUSAL>
static void dispatch_backward(const Flash2BackwardParams* p, int B, int HD, int deterministic,
                              const AttentionFlash2Settings* settings, cudaStream_t stream) {
    if (flash2_use_wgmma(settings)) {  // Hopper: the warp-specialized TMA kernel, tiles from flash2_tiles.h
        switch (HD) {
            case 64: launch_backward_hopper_tiles<64, CAUSAL>(p, B, deterministic, stream); break;
            case 80: launch_backward_hopper_tiles<80, CAUSAL>(p, B, deterministic, stream); break;
            case 96: launch_backward_hopper_tiles<96, CAUSAL>(p, B, deterministic, stream); break;
            case 128: launch_backward_hopper_tiles<128, CAUSAL>(p, B, deterministic, stream); break;
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

template <int HD>
static size_t hopper_workspace_bytes(const AttentionShape* s) {
    return flash2_backward_ws_workspace_bytes_for<HD, Flash2BackwardTiles<HD, true>::BLOCK_M>(s->B, s->NH, s->T);
}

// The larger of the two kernels' layouts, so that the same workspace serves either (and the
// caller need not know which runs): mma.sync's dq_accum (B, NH, T, HD), D and LSE·log2 e; the
// Hopper kernel's (flash2_backward_hopper.cuh). The causal Hopper forward keeps its tile counter in
// the first 4 bytes of the same workspace (the calls never overlap).
size_t flash2_attention_workspace_bytes(const AttentionShape* s) {
    const size_t rows = (size_t)s->B * s->NH * s->T;
    const size_t mma_sync = rows * s->HD * sizeof(float) + 2 * rows * sizeof(float);
    size_t hopper = 0;
    switch (s->HD) {
        case 64: hopper = hopper_workspace_bytes<64>(s); break;
        case 80: hopper = hopper_workspace_bytes<80>(s); break;
        case 96: hopper = hopper_workspace_bytes<96>(s); break;
        case 128: hopper = hopper_workspace_bytes<128>(s); break;
    }
    return mma_sync > hopper ? mma_sync : hopper;
}

int flash2_sums_dq_columns(const AttentionShape* s, const AttentionFlash2Settings* settings) {
    return flash2_use_wgmma(settings) && flash2_supports_head_dim(s->HD);
}

void flash2_attention_backward(const AttentionArgs* args, const AttentionFlash2Settings* settings,
                               cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    attention_require_backward_aligned("flash2", args);
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
    p.kv_stride = attention_kv_stride(args);
    p.out_stride = args->out_stride;
    p.dqkv_stride = args->dqkv_stride;
    p.dkv_stride = attention_dkv_stride(args);
    p.T = s->T;
    p.NH = s->NH;
    p.NKV = s->NKV;
    p.lse_rows = s->T;
    p.scale = 1.f / sqrtf((float)s->HD);
    p.scale_log2 = p.scale * FLASH2_LOG2E;
    p.dq_colsum = args->dq_colsum;  // attention_backward has checked flash2_sums_dq_columns
    p.dq_colsum_accumulate = args->dq_colsum_accumulate;
    if (s->causal) dispatch_backward<true>(&p, s->B, s->HD, args->deterministic, settings, stream);
    else dispatch_backward<false>(&p, s->B, s->HD, args->deterministic, settings, stream);
}
