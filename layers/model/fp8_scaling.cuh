// fp8_scaling.cuh: the per-tensor scales of the FP8 casts (fp8_cast.cuh), kept on the GPU so that
// choosing them never waits for the host.
//
// One Fp8ScaleState per FP8 tensor (an activation, a weight, a gradient of one linear layer):
//   scale      stored byte = fp8(x · scale)                    (the casts read it)
//   scale_inv  1 / scale, what the GEMMs multiply by           (matmul_fp8.cuh's Fp8Operand)
//   amax       max |x| of this step's casts of the tensor      (the casts' atomicMax target)
//   history    the amaxes of the last FP8_AMAX_HISTORY steps, newest first
//
// Delayed scaling (the default recipe): a step casts with the scale made from the amax history of
// the steps before it, and its casts record their amax; fp8_delayed_update, once per step for all
// tensors in one launch, then pushes amax into the history, resets it to +0 and sets
//   scale = fp8_max / max(history) / 2^margin
// so the cast needs no pass of its own over the tensor. A sudden outlier saturates (to ±fp8_max,
// never overflows) until the history has seen it, one step later. New states start at scale 1.
// Current scaling (for comparison): fp8_current_scale takes the tensor's own amax in a separate pass
// just before the cast and sets the scale from it alone: always in range, one more read of the tensor.
//
// pow2 rounds the scale down to a power of two: x · scale and decode · scale_inv are then exact
// (no rounding of their own), at the price of up to one binade of headroom. margin (≥ 0) leaves
// 2^margin of headroom above the amax. An amax of 0 (nothing cast yet), or one that would make the
// scale 0, infinite or subnormal, keeps the previous scale; a NaN or inf amax (the step's values
// were not finite, so its loss is too) is left out of the history and counted in `nonfinite`.
#ifndef FP8_SCALING_CUH
#define FP8_SCALING_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "layers/cuda_common.h"
#include "layers/model/fp8_cast.cuh"
#include "layers/model/layer_common.cuh"

#define FP8_AMAX_HISTORY 16  // steps of amax a delayed scale remembers
#define FP8_UPDATE_THREADS 128

// 16-byte aligned, scale_inv first and a size that is a multiple of 16 bytes: cuBLASLt refuses
// (NOT_SUPPORTED, on H100 with cuBLASLt 13.1) an operand scale pointer that is only 4-byte aligned,
// and scale_inv is what the GEMMs read, so every state of an array keeps it on a 16-byte boundary.
typedef struct __align__(16) {
    float scale_inv;                  // 1 / scale
    float scale;                      // stored = fp8(x · scale)
    float amax;                       // max |x| of the casts since the last update (+0 after it)
    float fp8_max;                    // 448 (E4M3) or 57344 (E5M2)
    float history[FP8_AMAX_HISTORY];  // newest first; 0 where no step has been seen yet
    int nonfinite;                    // updates that met a NaN or inf amax
    int updates;                      // updates so far
    unsigned long long saturated;     // values the casts clipped to ±fp8_max since the state was made
    float amax_current;               // current scaling: the amax of the one tensor about to be cast
    int unused[3];
} Fp8ScaleState;
static_assert(sizeof(Fp8ScaleState) == 112 && sizeof(Fp8ScaleState) % 16 == 0,
              "Fp8ScaleState: keep scale_inv 16-byte aligned in arrays");

// The scale that maps amax to fp8_max / 2^margin (rounded down to a power of two when pow2), or
// previous when there is none to take (see the top). The same bits on the host and the device:
// one IEEE division and exact power-of-two steps.
static __host__ __device__ inline float fp8_scale_for_amax(float amax, float fp8_max, int margin, int pow2,
                                                           float previous) {
    if (!(amax > 0.0f) || !isfinite(amax)) return previous;
    float s = ldexpf(fp8_max / amax, -margin);
    if (pow2 && s > 0.0f && isfinite(s)) {
        int e = 0;
        frexpf(s, &e);  // s = f · 2^e, f in [0.5, 1)
        s = ldexpf(1.0f, e - 1);
    }
    if (!(s >= FLT_MIN) || !isfinite(s)) return previous;
    return s;
}

// ---- kernels -----------------------------------------------------------------------------------------

// One thread per state: the delayed-scaling update of the top.
static __global__ void fp8_delayed_update_kernel(Fp8ScaleState* states, int count, int margin, int pow2) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Fp8ScaleState* st = &states[i];
    const float amax = st->amax;
    if (isfinite(amax)) {
        for (int h = FP8_AMAX_HISTORY - 1; h > 0; h--) st->history[h] = st->history[h - 1];
        st->history[0] = amax;
    } else {
        st->nonfinite++;
    }
    st->amax = 0.0f;
    float m = 0.0f;
    for (int h = 0; h < FP8_AMAX_HISTORY; h++) m = fmaxf(m, st->history[h]);
    st->scale = fp8_scale_for_amax(m, st->fp8_max, margin, pow2, st->scale);
    st->scale_inv = 1.0f / st->scale;
    st->updates++;
}

// Current scaling's last step: the scale from amax_current alone; amax (for the history) takes its
// max with it, NaN included (compared as bits, see fp8_cast.cuh).
static __global__ void fp8_current_scale_kernel(Fp8ScaleState* st, int margin, int pow2) {
    const float amax = st->amax_current;
    st->scale = fp8_scale_for_amax(amax, st->fp8_max, margin, pow2, st->scale);
    st->scale_inv = 1.0f / st->scale;
    st->amax = __uint_as_float(max(__float_as_uint(st->amax), __float_as_uint(amax)));
}

// ---- host --------------------------------------------------------------------------------------------

// Sets count device states to scale 1, no history, each for its format (formats[i]). Synchronous
// (start-up only).
static inline void fp8_scale_states_init(Fp8ScaleState* states, const Fp8Format* formats, int count,
                                         cudaStream_t stream) {
    Fp8ScaleState* host = (Fp8ScaleState*)calloc(count > 0 ? count : 1, sizeof(Fp8ScaleState));
    LAYER_REQUIRE(host != NULL, "fp8_scale_states_init: out of host memory");
    for (int i = 0; i < count; i++) {
        host[i].scale = host[i].scale_inv = 1.0f;
        host[i].fp8_max = fp8_format_max(formats[i]);
    }
    CUDA_CHECK(cudaMemcpyAsync(states, host, (size_t)count * sizeof(Fp8ScaleState), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    free(host);
}

// Delayed scaling, once per step after all casts of the step: every state's amax joins its history
// and the next step's scales are set (see the top). One launch for all states.
static inline void fp8_delayed_update(Fp8ScaleState* states, int count, int margin, int pow2, cudaStream_t stream) {
    LAYER_REQUIRE(margin >= 0 && margin < 32, "fp8_delayed_update: margin %d is outside 0..31", margin);
    if (count <= 0) return;
    const int blocks = (count + FP8_UPDATE_THREADS - 1) / FP8_UPDATE_THREADS;
    fp8_delayed_update_kernel<<<blocks, FP8_UPDATE_THREADS, 0, stream>>>(states, count, margin, pow2);
    CUDA_CHECK(cudaGetLastError());
}

// The scale of current scaling, once state->amax_current holds the tensor's amax: see the kernel.
static inline void fp8_current_scale_finish(Fp8ScaleState* state, int margin, int pow2, cudaStream_t stream) {
    LAYER_REQUIRE(margin >= 0 && margin < 32, "fp8_current_scale: margin %d is outside 0..31", margin);
    fp8_current_scale_kernel<<<1, 1, 0, stream>>>(state, margin, pow2);
    CUDA_CHECK(cudaGetLastError());
}

// Current scaling of inp (N, C): state->amax_current = max |inp|, the scale from it alone, and
// state->amax = max(amax, amax_current); the cast that follows uses &state->scale (and may pass
// NULL for its amax).
static inline void fp8_current_scale(Fp8ScaleState* state, const __nv_bfloat16* inp, int N, int C, int margin,
                                     int pow2, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(&state->amax_current, 0, sizeof(float), stream));
    fp8_amax(&state->amax_current, inp, N, C, stream);
    fp8_current_scale_finish(state, margin, pow2, stream);
}

#endif  // FP8_SCALING_CUH
