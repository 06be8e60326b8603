// classifier.cuh: fused softmax cross-entropy over the LM head's logits, forward and backward in
// one kernel, without materializing the probabilities.
//
//   logits (N, Vp) bf16, N = B·T rows; columns 0..V−1 are the vocabulary, V..Vp−1 padding (ignored,
//   whatever they hold). targets (N) int32 in [0, V) (not checked on the GPU: the loader checks ids).
//   losses (N) fp32: losses[n] = logsumexp(logits[n, :V]) − logits[n, targets[n]]
//   training: logits OVERWRITTEN in place with dlogits = dloss·(softmax(logits[n, :V]) − onehot(target)),
//             bf16, padding columns set to 0. dloss is the gradient of the objective with respect to
//             each row's loss: 1/(N·grad_accum_steps) for the mean over a step's tokens.
//   validation: crossentropy_forward only writes losses; logits are left as they are.
// One block per row. Pass 1 reads the row once with 16-byte loads and keeps an online (max, sum of
// exp(x − max)) per thread, merged over the block in a fixed order; pass 2 (training) reads the row
// again (from L2: a row is Vp·2 ≈ 100 KB) and writes dlogits over it. fp32 math, exp2 with the
// log2(e) factor folded in. Vp must be a multiple of 8 and logits 16-byte aligned (checked).
#ifndef CLASSIFIER_CUH
#define CLASSIFIER_CUH

#include "layers/model/layer_common.cuh"

#define CE_THREADS 512
#define CE_UNROLL 4
#define CE_LOG2E 1.4426950408889634f

// Merges the online-softmax pair (m2, s2) into (m, s): m the max, s = Σ exp(x − m). Symmetric in its
// two pairs (so xor-butterfly merges leave every lane with the same bits).
static __device__ __forceinline__ void ce_merge(float* m, float* s, float m2, float s2) {
    float mn = fmaxf(*m, m2);
    if (mn == -INFINITY) return;  // both empty
    *s = *s * exp2f((*m - mn) * CE_LOG2E) + s2 * exp2f((m2 - mn) * CE_LOG2E);
    *m = mn;
}

// Folds the 8 values of f into (m, s).
static __device__ __forceinline__ void ce_accumulate8(float* m, float* s, const float f[8]) {
    float vmax = f[0];
#pragma unroll
    for (int k = 1; k < 8; k++) vmax = fmaxf(vmax, f[k]);
    if (vmax > *m) {
        *s *= exp2f((*m - vmax) * CE_LOG2E);  // 0 when m was −inf
        *m = vmax;
    }
    const float ms = *m * CE_LOG2E;
#pragma unroll
    for (int k = 0; k < 8; k++) *s += exp2f(fmaf(f[k], CE_LOG2E, -ms));
}

// write_dlogits = 0: losses only (logits not written).
static __global__ void __launch_bounds__(CE_THREADS)
    crossentropy_kernel(float* __restrict__ losses, __nv_bfloat16* __restrict__ logits, const int* __restrict__ targets,
                        float dloss, int V, int Vp, int write_dlogits) {
    __shared__ float shared_m[CE_THREADS / 32], shared_s[CE_THREADS / 32];
    const int row = blockIdx.x;
    __nv_bfloat16* x = logits + (size_t)row * Vp;
    const int target = targets[row];
    const int real_vecs = (V + 7) / 8;  // vectors holding a real column (the last may hold padding too)
    float m = -INFINITY, s = 0.0f;
    for (int v0 = threadIdx.x; v0 < real_vecs; v0 += CE_UNROLL * CE_THREADS) {
        uint4 u[CE_UNROLL];
#pragma unroll
        for (int k = 0; k < CE_UNROLL; k++) {
            const int v = v0 + k * CE_THREADS;
            if (v < real_vecs) u[k] = load16(x + (size_t)v * 8);
        }
#pragma unroll
        for (int k = 0; k < CE_UNROLL; k++) {
            const int v = v0 + k * CE_THREADS;
            if (v < real_vecs) {
                float f[8];
                bf16x8_unpack(f, u[k]);
                if (v * 8 + 8 > V) {
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (v * 8 + e >= V) f[e] = -INFINITY;
                }
                ce_accumulate8(&m, &s, f);
            }
        }
    }
    // Block merge: xor butterflies in each warp, then warp results in warp order.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, offset), s2 = __shfl_xor_sync(0xFFFFFFFFu, s, offset);
        ce_merge(&m, &s, m2, s2);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    // The target's logit, read before the barrier that precedes pass 2's overwrite.
    const float x_target = threadIdx.x == 0 ? __bfloat162float(x[target]) : 0.0f;
    __syncthreads();
    m = shared_m[0];
    s = shared_s[0];
    for (int w = 1; w < CE_THREADS / 32; w++) ce_merge(&m, &s, shared_m[w], shared_s[w]);
    if (threadIdx.x == 0) losses[row] = m + logf(s) - x_target;
    if (!write_dlogits) return;

    // Pass 2: dlogits = dloss·(exp(x − m)/s − [col == target]), 0 in padding columns.
    const float ms = m * CE_LOG2E, scale = dloss / s;
    const int vecs = Vp / 8;
    for (int v = threadIdx.x; v < vecs; v += CE_THREADS) {
        float f[8];
        __nv_bfloat16* p = x + (size_t)v * 8;
        if (v < real_vecs) {
            bf16x8_unpack(f, load16_stream(p));
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int col = v * 8 + e;
                float g = scale * exp2f(fmaf(f[e], CE_LOG2E, -ms));
                if (col == target) g -= dloss;
                f[e] = col < V ? g : 0.0f;
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = 0.0f;
        }
        store16(p, bf16x8_pack(f));
    }
}

static void crossentropy_check(const char* who, const void* logits, int N, int V, int Vp) {
    LAYER_REQUIRE(N >= 1 && V >= 1 && V <= Vp && Vp % 8 == 0,
                  "%s: N = %d, V = %d, Vp = %d: need N, V >= 1, V <= Vp and Vp a multiple of 8 (the padded vocab "
                  "is a multiple of 128)",
                  who, N, V, Vp);
    LAYER_REQUIRE(layer_is_aligned16(logits), "%s: logits must be 16-byte aligned", who);
}

// Training: losses (N) = the per-row cross-entropy, and logits (N, Vp) overwritten with dlogits =
// dloss·(softmax − onehot(targets)) (padding columns 0). See the top of the file.
static void crossentropy_forward_backward(float* losses, __nv_bfloat16* logits, const int* targets, float dloss,
                                          int N, int V, int Vp, cudaStream_t stream) {
    crossentropy_check("crossentropy_forward_backward", logits, N, V, Vp);
    crossentropy_kernel<<<N, CE_THREADS, 0, stream>>>(losses, logits, targets, dloss, V, Vp, 1);
    CUDA_CHECK(cudaGetLastError());
}

// Validation: losses (N) only; logits (N, Vp) are read, not written.
static void crossentropy_forward(float* losses, const __nv_bfloat16* logits, const int* targets, int N, int V, int Vp,
                                 cudaStream_t stream) {
    crossentropy_check("crossentropy_forward", logits, N, V, Vp);
    crossentropy_kernel<<<N, CE_THREADS, 0, stream>>>(losses, (__nv_bfloat16*)logits, targets, 0.0f, V, Vp, 0);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // CLASSIFIER_CUH
