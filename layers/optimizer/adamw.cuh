// adamw.cuh: one AdamW step over one parameter tensor (or any slice of the flat parameter array),
// n elements (size_t: up to billions).
//
//   g = grad · grad_scale · (*grad_scale_device, when given)      grads (n) bf16, math in fp32
//   m = β1·m + (1 − β1)·g;   v = β2·v + (1 − β2)·g²                 m, v (n) fp32, updated in place
//   master −= lr · ( (m / (1 − β1^step)) / (√(v / (1 − β2^step)) + eps) + weight_decay·master )
//   params = bf16(master)                                         master (n) fp32, params (n) bf16
// The same formula as ref_adamw_step (test/cpu_reference.h): decoupled weight decay, bias-corrected
// moments, step counting from 1. weight_decay is per tensor (0 for biases, LayerNorm and, in GPT-2
// practice, nothing else): the caller runs one adamw_update per tensor slice with that tensor's value.
// grad_scale multiplies the gradient first (global-norm clipping: max_norm / norm when the norm is
// larger); grad_scale_device (NULL for none) is a device fp32 scalar multiplied in as well, so the
// clip factor computed on the GPU (global_norm_clip_scale in global_norm.cuh) needs no host sync.
// The bf16 copy is rounded to nearest from the fp32 master weights.
// Vectors of 8 (16-byte bf16, 2×16-byte fp32 accesses) when every pointer is 16-byte aligned; any n.
#ifndef ADAMW_CUH
#define ADAMW_CUH

#include <math.h>

#include "layers/model/layer_common.cuh"

#define ADAMW_THREADS 256
#define ADAMW_BLOCKS_PER_SM 8

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1, bias_correction2;  // 1 − β1^step, 1 − β2^step
    float grad_scale;
} AdamWArgs;

static __device__ __forceinline__ void adamw_element(float* p, float* m, float* v, float g, const AdamWArgs* a) {
    *m = a->beta1 * *m + (1.0f - a->beta1) * g;
    *v = a->beta2 * *v + (1.0f - a->beta2) * g * g;
    const float m_hat = *m / a->bias_correction1, v_hat = *v / a->bias_correction2;
    *p -= a->lr * (m_hat / (sqrtf(v_hat) + a->eps) + a->weight_decay * *p);
}

// Grid-stride over chunks of 8 elements; vector: every pointer 16-byte aligned.
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(float* __restrict__ master, __nv_bfloat16* __restrict__ params,
                 const __nv_bfloat16* __restrict__ grads, float* __restrict__ m, float* __restrict__ v, size_t n,
                 AdamWArgs a, const float* __restrict__ grad_scale_device, int vector) {
    if (grad_scale_device) a.grad_scale *= *grad_scale_device;
    const size_t chunks = (n + 7) / 8;
    for (size_t chunk = (size_t)blockIdx.x * blockDim.x + threadIdx.x; chunk < chunks;
         chunk += (size_t)gridDim.x * blockDim.x) {
        const size_t i0 = chunk * 8;
        if (vector && i0 + 8 <= n) {
            float g[8], p[8], mm[8], vv[8];
            bf16x8_unpack(g, load16_stream(grads + i0));
            f32x8_load_stream(p, master + i0);
            f32x8_load_stream(mm, m + i0);
            f32x8_load_stream(vv, v + i0);
#pragma unroll
            for (int k = 0; k < 8; k++) adamw_element(&p[k], &mm[k], &vv[k], g[k] * a.grad_scale, &a);
            f32x8_store_stream(master + i0, p);
            f32x8_store_stream(m + i0, mm);
            f32x8_store_stream(v + i0, vv);
            store16(params + i0, bf16x8_pack(p));
        } else {
            for (size_t i = i0; i < n && i < i0 + 8; i++) {
                float p = master[i], mi = m[i], vi = v[i];
                adamw_element(&p, &mi, &vi, __bfloat162float(grads[i]) * a.grad_scale, &a);
                master[i] = p;
                m[i] = mi;
                v[i] = vi;
                params[i] = __float2bfloat16(p);
            }
        }
    }
}

// One AdamW step over n elements of one tensor (pointers to its slice of each array); see the top of
// the file. step >= 1.
static void adamw_update(float* master, __nv_bfloat16* params, const __nv_bfloat16* grads, float* m, float* v,
                         size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                         float grad_scale, const float* grad_scale_device, cudaStream_t stream) {
    LAYER_REQUIRE(step >= 1, "adamw_update: step = %d, steps count from 1", step);
    if (n == 0) return;
    AdamWArgs a;
    a.lr = lr;
    a.beta1 = beta1;
    a.beta2 = beta2;
    a.eps = eps;
    a.weight_decay = weight_decay;
    a.bias_correction1 = (float)(1.0 - pow((double)beta1, (double)step));
    a.bias_correction2 = (float)(1.0 - pow((double)beta2, (double)step));
    a.grad_scale = grad_scale;
    const int vector = layer_is_aligned16(master) && layer_is_aligned16(params) && layer_is_aligned16(grads) &&
                       layer_is_aligned16(m) && layer_is_aligned16(v);
    size_t blocks = layer_ceil_div(layer_ceil_div(n, 8), ADAMW_THREADS);
    const size_t max_blocks = (size_t)layer_num_sms() * ADAMW_BLOCKS_PER_SM;
    if (blocks > max_blocks) blocks = max_blocks;
    adamw_kernel<<<(unsigned)blocks, ADAMW_THREADS, 0, stream>>>(master, params, grads, m, v, n, a, grad_scale_device,
                                                                 vector);
    CUDA_CHECK(cudaGetLastError());
}

#endif  // ADAMW_CUH
