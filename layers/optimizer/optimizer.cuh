// optimizer.cuh: the optimizer: fp32 master weights and AdamW moments, their ZeRO-1 shard, the GPT-2
// initialization, global-norm clipping and the AdamW step, tensor by tensor as gpt_config.h's
// parameter table says (its init rule; weight decay on the 2-D weights only).
//
// The state covers the elements [offset, offset + elems) of the model's flat parameter vector
// (num_params elements, padded with zeros to a multiple of OPTIMIZER_SHARD_ALIGN · world so it
// splits evenly over the GPUs): all of them, or with ZeRO-1 rank r's shard [r·S, (r+1)·S),
// S = padded / world. A tensor that crosses a shard boundary is updated in two parts, each by the
// rank that owns it (optimizer_overlap).
//   master, m, v  (elems) fp32 each, in the parameter order
// One step: optimizer_update clips (scale = min(1, clip / norm), computed and read on the GPU: no host
// sync) and runs AdamW (layers/optimizer/adamw.cuh, β 0.9/0.95, ε 1e-8, bias-corrected) on every tensor's part
// of the range. The gradient norm comes from optimizer_grad_norm on one GPU, or from
// layers/multi_gpu/multi_gpu.cuh (an all-reduce of every rank's shard) on several.
#ifndef OPTIMIZER_CUH
#define OPTIMIZER_CUH

#include "layers/optimizer/adamw.cuh"
#include "layers/cuda_common.h"
#include "layers/optimizer/global_norm.cuh"
#include "data/gpt_config.h"
#include "layers/model/gpt_model.cuh"
#include "layers/model/init_weights.cuh"

#define OPTIMIZER_SHARD_ALIGN 1024  // elements; a shard's size S is a multiple of it
#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f

typedef struct {
    float *master, *m, *v;     // (elems) each: fp32 master weights and the AdamW moments
    size_t offset, elems;      // the range of the flat parameter vector they cover
    float weight_decay;        // on the tensors the table marks
    float grad_clip;           // global-norm clip, 0 = off
    float *norm, *clip_scale;  // device scalars: the gradient norm (one GPU) and min(1, clip / norm)
    float* norm_scratch;       // global_norm_scratch_bytes()
} Optimizer;

// The parameter allocations are padded to a multiple of this (world 1: no padding).
static inline size_t optimizer_pad_multiple(int world) {
    return world > 1 ? (size_t)world * OPTIMIZER_SHARD_ALIGN : 1;
}

// The elements the state of `rank` covers: all num_params, or with zero = 1 its shard of the padded
// vector. Fills the padded size too.
static inline void optimizer_range(size_t num_params, int world, int rank, int zero, size_t* padded,
                                   size_t* offset, size_t* elems) {
    const size_t multiple = optimizer_pad_multiple(world);
    *padded = (num_params + multiple - 1) / multiple * multiple;
    const size_t shard = *padded / (size_t)world;
    *offset = zero ? (size_t)rank * shard : 0;
    *elems = zero ? shard : num_params;
}

// The part [*a, *b) of the flat elements [at, at + n) (a tensor) that lies in the state's range;
// returns 0 when they do not meet.
static inline int optimizer_overlap(const Optimizer* o, size_t at, size_t n, size_t* a, size_t* b) {
    *a = at > o->offset ? at : o->offset;
    *b = at + n < o->offset + o->elems ? at + n : o->offset + o->elems;
    return *a < *b;
}

// Allocates the state (zeroed: ZeRO-1's padding past the last tensor stays 0) and the scalars.
static void optimizer_create(Optimizer* o, size_t offset, size_t elems, float weight_decay, float grad_clip) {
    memset(o, 0, sizeof(*o));
    o->offset = offset, o->elems = elems;
    o->weight_decay = weight_decay, o->grad_clip = grad_clip;
    const char* hint = "the fp32 master weights and AdamW moments take 12 bytes per parameter; use a smaller "
                       "model, or lower --batch-size or --seq-len to leave room for them";
    cuda_malloc_or_explain((void**)&o->master, elems * sizeof(float), "the fp32 master weights", hint);
    cuda_malloc_or_explain((void**)&o->m, elems * sizeof(float), "the AdamW first moments", hint);
    cuda_malloc_or_explain((void**)&o->v, elems * sizeof(float), "the AdamW second moments", hint);
    CUDA_CHECK(cudaMemset(o->master, 0, elems * sizeof(float)));
    CUDA_CHECK(cudaMemset(o->m, 0, elems * sizeof(float)));
    CUDA_CHECK(cudaMemset(o->v, 0, elems * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&o->norm, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&o->clip_scale, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&o->norm_scratch, global_norm_scratch_bytes()));
}

static void optimizer_destroy(Optimizer* o) {
    float* buffers[] = {o->master, o->m, o->v, o->norm, o->clip_scale, o->norm_scratch};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++)
        if (buffers[i]) CUDA_CHECK(cudaFree(buffers[i]));
    memset(o, 0, sizeof(*o));
}

// GPT-2 initialization from `seed` (layers/model/init_weights.cuh) by the table's rule per tensor: N(0, 0.02),
// the residual projections N(0, 0.02/√(2L)), LayerNorm gains 1, biases 0. Writes the model's bf16
// weights (all) and the master weights (the state's range); the draws are counter-based, so every
// rank gets the same values and a shard those of the whole tensor.
static void optimizer_init_gpt2(const Optimizer* o, GPTModel* model, uint64_t seed) {
    const float residual_std = 0.02f / sqrtf(2.0f * model->L);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const GPTParamInit init = GPT_PARAMS[i].init;
        const float std = init == INIT_NORMAL ? 0.02f : init == INIT_NORMAL_RESIDUAL ? residual_std : 0.0f;
        const float constant = init == INIT_ONES ? 1.0f : 0.0f;
        const size_t at = model->param_offsets[i], n = model->param_sizes[i];
        init_weights(NULL, model->param_tensors[i], n, 0, std, constant, seed, i, model->stream);
        size_t a, b;
        if (optimizer_overlap(o, at, n, &a, &b))
            init_weights(o->master + (a - o->offset), NULL, b - a, a - at, std, constant, seed, i, model->stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
}

// Copies the part of a tensor's fp32 values (n, at flat offset `at`, on the host) that lies in the
// state's range into the master weights.
static void optimizer_upload_master(const Optimizer* o, size_t at, const float* values, size_t n) {
    size_t a, b;
    if (optimizer_overlap(o, at, n, &a, &b))
        CUDA_CHECK(cudaMemcpy(o->master + (a - o->offset), values + (a - at), (b - a) * sizeof(float),
                              cudaMemcpyHostToDevice));
}

// One GPU: the global norm of all the model's gradients, on the device (o->norm) and returned to the
// host (synchronizes, so a non-finite norm is seen before the update).
static float optimizer_grad_norm(const Optimizer* o, const GPTModel* model) {
    global_norm(o->norm, o->norm_scratch, model->grads, model->num_params, model->stream);
    return cuda_read_float(o->norm, model->stream);
}

// One AdamW step (step counts from 1) at learning rate lr on the state's range, the gradients first
// scaled by min(1, grad_clip / *norm_device) when clipping is on; writes the new bf16 weights of
// the range into the model (ZeRO-1: the caller gathers the other shards).
static void optimizer_update(const Optimizer* o, GPTModel* model, const float* norm_device, double lr, long long step) {
    const float* scale = NULL;
    if (o->grad_clip > 0) {
        global_norm_clip_scale(o->clip_scale, norm_device, o->grad_clip, model->stream);
        scale = o->clip_scale;
    }
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t a, b;
        if (!optimizer_overlap(o, model->param_offsets[i], model->param_sizes[i], &a, &b)) continue;
        const size_t at = a - o->offset;
        const float decay = GPT_PARAMS[i].weight_decay ? o->weight_decay : 0.0f;
        adamw_update(o->master + at, model->params + a, model->grads + a, o->m + at, o->v + at, b - a, (float)lr,
                     ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, decay, (int)step, 1.0f, scale, model->stream);
    }
}

#endif  // OPTIMIZER_CUH
