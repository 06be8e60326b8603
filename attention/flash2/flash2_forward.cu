// flash2_forward.cu: picks the flash2 forward kernel and its tiles per head dim and launches it: on
// Hopper (compute capability 9.x) the warp-specialized TMA kernel of flash2_forward_hopper.cuh, its
// tiles from flash2_tiles.h; elsewhere the mma.sync kernel of flash2_forward_kernel.cuh, shapes below.
#include <stdio.h>
#include <stdlib.h>

#include "attention/backends.h"
#include "attention/common/alignment.h"
#include "attention/flash2/flash2_params.h"
#include "attention/flash2/flash2_tiles.h"
#include "attention/flash2/sm80/flash2_forward_kernel.cuh"
#include "attention/flash2/sm90/flash2_forward_hopper.cuh"

// Other GPUs, or settings->mma_sync_forced (FLASH2_MMA_SYNC, to test or time them on Hopper), use
// the mma.sync kernels; so does a Hopper GPU whose code in this binary was built without sm_90a
// (e.g. GPU_ARCH="80 90"): wgmma, TMA's kernels and setmaxnreg exist only there, and the Hopper
// kernels would trap. A one-thread probe kernel tells which code runs here. mma.sync block shapes:
// (query rows, key rows, warps, blocks per SM the registers allow), the fastest build/flash2_tune
// found (attention/PERF_NOTES.md).
__global__ void flash2_wgmma_probe(int* built) { *built = WGMMA_AVAILABLE; }

static int wgmma_built_for_this_gpu(void) {
    int *built_dev, built = 0;
    ATTN_CUDA_CHECK(cudaMalloc(&built_dev, sizeof(int)));
    flash2_wgmma_probe<<<1, 1>>>(built_dev);
    ATTN_CUDA_CHECK(cudaGetLastError());
    ATTN_CUDA_CHECK(cudaMemcpy(&built, built_dev, sizeof(int), cudaMemcpyDeviceToHost));
    ATTN_CUDA_CHECK(cudaFree(built_dev));
    return built;
}

// Whether the current GPU runs the Hopper kernels, asked once (one device per process: the trainer
// runs one process per GPU); not asked at all while the mma.sync kernels are forced.
int flash2_use_wgmma(const AttentionFlash2Settings* settings) {
    static int use = -1;
    if (settings->mma_sync_forced) return 0;
    if (use < 0) {
        int device = 0, major = 0;
        ATTN_CUDA_CHECK(cudaGetDevice(&device));
        ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        use = major == 9;
        if (use && !wgmma_built_for_this_gpu()) {
            fprintf(stderr, "flash2: this binary has no sm_90a code, so flash2 runs its mma.sync kernels on this "
                            "Hopper GPU; rebuild with GPU_ARCH including 90a (make GPU_ARCH=\"80 90a\") for the "
                            "faster wgmma kernels\n");
            use = 0;
        }
    }
    return use;
}

// long_t: AttentionFlash2Settings.forward_long_t (flash2_forward_long_shape).
template <int HD, bool CAUSAL>
static void launch_forward_hopper_tiles(const Flash2ForwardParams* p, int B, int long_t, cudaStream_t stream) {
    typedef Flash2ForwardTiles<HD, CAUSAL> Tiles;
    if constexpr (Tiles::LONG_T > 0) {
        if (flash2_forward_long_shape(Tiles::LONG_T, p->T, long_t)) {
            launch_forward_ws<HD, Tiles::BLOCK_N, Tiles::LONG_CONSUMERS, CAUSAL, true, Tiles::STORER>(p, B, stream);
            return;
        }
    }
    launch_forward_ws<HD, Tiles::BLOCK_N, Tiles::CONSUMERS, CAUSAL, true, Tiles::STORER>(p, B, stream);
}

template <bool CAUSAL>
static void dispatch_forward(const Flash2ForwardParams* p, int B, int HD, const AttentionFlash2Settings* settings,
                             cudaStream_t stream) {
    if (flash2_use_wgmma(settings)) {  // Hopper: the warp-specialized TMA kernel, tiles from flash2_tiles.h
        const int long_t = settings->forward_long_t;
        switch (HD) {
            case 64: launch_forward_hopper_tiles<64, CAUSAL>(p, B, long_t, stream); break;
            case 80: launch_forward_hopper_tiles<80, CAUSAL>(p, B, long_t, stream); break;
            case 96: launch_forward_hopper_tiles<96, CAUSAL>(p, B, long_t, stream); break;
            case 128: launch_forward_hopper_tiles<128, CAUSAL>(p, B, long_t, stream); break;
        }
        return;
    }
    switch (HD) {
        case 64: launch_forward<64, 128, 64, 4, 2, CAUSAL>(p, B, stream); break;
        case 80: launch_forward<80, 128, 64, 4, 2, CAUSAL>(p, B, stream); break;
        case 96: launch_forward<96, 128, 64, 4, 2, CAUSAL>(p, B, stream); break;
        case 128: launch_forward<128, 128, 64, 4, 2, CAUSAL>(p, B, stream); break;
    }
}

int flash2_supports_head_dim(int head_dim) {
    return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

void flash2_attention_forward(const AttentionArgs* args, const AttentionFlash2Settings* settings,
                              cudaStream_t stream) {
    const AttentionShape* s = &args->shape;
    attention_require_forward_aligned("flash2", args);
    Flash2ForwardParams p;
    p.q = args->q;
    p.k = args->k;
    p.v = args->v;
    p.out = args->out;
    p.out_f32 = args->out_f32;
    p.lse = args->lse;
    p.qkv_stride = args->qkv_stride;
    p.kv_stride = attention_kv_stride(args);
    p.out_stride = args->out_stride;
    p.T = s->T;
    p.NH = s->NH;
    p.NKV = s->NKV;
    p.scale_log2 = FLASH2_LOG2E / sqrtf((float)s->HD);
    // the causal Hopper forward's tile order: 8 bytes of the workspace (a 64-bit atomic needs them aligned)
    if (s->causal && args->workspace && (uintptr_t)args->workspace % 8 != 0) {
        fprintf(stderr, "error: flash2 needs the attention workspace 8-byte aligned (got %p); allocate it with "
                        "cudaMalloc\n", args->workspace);
        exit(EXIT_FAILURE);
    }
    p.tile_counter = s->causal ? (unsigned long long*)args->workspace : NULL;
    p.tile_epoch = 0;  // the launch sets it
    if (s->causal) dispatch_forward<true>(&p, s->B, s->HD, settings, stream);
    else dispatch_forward<false>(&p, s->B, s->HD, settings, stream);
}
