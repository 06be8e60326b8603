// multi_gpu.cuh: data-parallel training over NCCL, one process per GPU, with optional ZeRO-1.
//
// Setup: launcher.h says who this process is (rank, world, local rank) from mpirun / srun / torchrun
// environment variables; multi_gpu_init picks the GPU (local rank), rank 0 makes NCCL's unique id,
// launcher_rendezvous hands it to every rank over TCP (MASTER_ADDR:MASTER_PORT), and every rank
// joins the communicator. World 1 never comes here: the single-GPU path has no NCCL at all.
//
// The flat parameter vector (the model's params / grads allocations, num_params padded with zeros
// to P' = world · S, S a multiple of 1024: layers/optimizer.cuh) is cut into world contiguous
// shards: rank r owns elements [r·S, (r+1)·S).
//
// Gradients: on the last micro step of an optimizer step the model's backward hook
// (GPTModel.grads_ready) calls multi_gpu_grads_ready for each layer as soon as its gradients are
// final; it records an event on the compute stream, the communication stream waits for it and
// reduces that layer's slices of the per-layer tensors (gpt_config.h's table; not contiguous: the
// layout is per tensor, all layers together) in one NCCL group, while the backward goes on with the
// layers below. The last bucket (l = −1) holds the other tensors: wte, wpe, lnfw, lnfb. Earlier
// micro steps only accumulate (as DDP's no_sync).
//   --zero 0: ncclAllReduce(avg) in place: every rank ends with the mean gradient (bf16).
//   --zero 1: ncclReduce(avg) of each slice's intersection with each rank's shard to that rank
//             (a reduce-scatter over the non-contiguous slices): only the owned shard is valid.
// multi_gpu_wait_grads makes the compute stream wait for the communication stream before the norm.
// The norm: every rank sums the squares of its shard (global_norm_squared), one all-reduce of
// (Σ g², loss) gives the global norm and the mean loss on every rank. ZeRO-1's AdamW updates only
// the shard (the caller), then multi_gpu_all_gather_params gathers the bf16 weights in place.
#ifndef MULTI_GPU_CUH
#define MULTI_GPU_CUH

#ifdef TRAIN_GPT_NO_NCCL
// A build without NCCL (the Makefile found none, or make NCCL=0): one GPU only. MultiGpu and the calls
// exist so the trainer compiles unchanged; the plan refuses a launch of several processes
// (MULTI_GPU_AVAILABLE), so none of these runs.
#include <stdio.h>
#include <stdlib.h>

#include "gpt_model.cuh"
#include "launcher.h"

#define MULTI_GPU_AVAILABLE 0

typedef struct {
    int rank, world, zero;
    float* scalars;
} MultiGpu;

static void multi_gpu_unavailable(void) {
    fprintf(stderr, "error: this train_gpt was built without NCCL: it trains on one GPU only\n");
    exit(2);
}
static void multi_gpu_init(MultiGpu*, const LaunchInfo*, int, int, uint64_t, double) { multi_gpu_unavailable(); }
static void multi_gpu_attach(MultiGpu*, const GPTModel*) { multi_gpu_unavailable(); }
static void multi_gpu_arm_hook(MultiGpu*, GPTModel*, int) { multi_gpu_unavailable(); }
static void multi_gpu_wait_grads(MultiGpu*, cudaStream_t) { multi_gpu_unavailable(); }
static void multi_gpu_norm_and_loss(MultiGpu*, float*, double, float*, float*, cudaStream_t) { multi_gpu_unavailable(); }
static void multi_gpu_all_gather_params(MultiGpu*, __nv_bfloat16*, cudaStream_t) { multi_gpu_unavailable(); }
static double multi_gpu_sum(MultiGpu*, double, cudaStream_t) {
    multi_gpu_unavailable();
    return 0.0;
}
static void multi_gpu_destroy(MultiGpu*) {}

#else  // NCCL

#define MULTI_GPU_AVAILABLE 1

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.h"
#include "global_norm.cuh"
#include "gpt_model.cuh"
#include "launcher.h"

// Exits with file, line, NCCL's message and what to check when an NCCL call fails.
static inline void nccl_check(ncclResult_t r, const char* file, int line) {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(NULL);
    fprintf(stderr, "error: NCCL call failed at %s:%d: %s%s%s\n", file, line, ncclGetErrorString(r),
            last && *last ? ": " : "", last ? last : "");
    const char* hint = "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see which rank and transport "
                       "failed";
    switch (r) {
        case ncclUnhandledCudaError:
            hint = "a CUDA call inside NCCL failed: check that every rank sees its own GPU (LOCAL_RANK, "
                   "CUDA_VISIBLE_DEVICES) and rerun with NCCL_DEBUG=INFO";
            break;
        case ncclSystemError:
            hint = "a system call (sockets, shared memory) failed: check /dev/shm space and the network interface "
                   "(NCCL_SOCKET_IFNAME), and rerun with NCCL_DEBUG=INFO";
            break;
        case ncclRemoteError:
            hint = "another rank failed or exited: look at its error first";
            break;
        case ncclInvalidArgument:
        case ncclInvalidUsage:
            hint = "NCCL was called wrongly (a bug in train_gpt, or ranks disagree on sizes): report it with the "
                   "command lines of every rank";
            break;
        default: break;
    }
    fprintf(stderr, "hint: %s\n", hint);
    exit(EXIT_FAILURE);
}
#define NCCL_CHECK(call) nccl_check((call), __FILE__, __LINE__)

typedef struct {
    int rank, world, device, zero;
    ncclComm_t comm;
    cudaStream_t comm_stream;   // gradient reduction, overlapped with the backward
    cudaEvent_t ready, done;    // compute -> comm (a layer's gradients), comm -> compute (all reduced)
    float* scalars;             // (2) device: Σ g² and the loss for one all-reduce; also the barrier's
    size_t shard_offset, shard_size;  // this rank's elements of the padded flat parameter vector
    const GPTModel* model;      // for the backward hook
} MultiGpu;

// Joins the run's communicator on GPU `device` (already cudaSetDevice'd). `tag` hashes the options
// every rank must share. Exits with a message when the rendezvous or NCCL fails.
static void multi_gpu_init(MultiGpu* mg, const LaunchInfo* li, int device, int zero, uint64_t tag,
                           double timeout_s) {
    memset(mg, 0, sizeof(*mg));
    mg->rank = li->rank, mg->world = li->world, mg->device = device, mg->zero = zero;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (mg->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    char err[2048];
    if (launcher_rendezvous(li, tag, &id, sizeof(id), timeout_s, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: rank %d of %d (%s): %s\n", mg->rank, mg->world, li->source, err);
        exit(1);
    }
    NCCL_CHECK(ncclCommInitRank(&mg->comm, mg->world, id, mg->rank));
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&mg->comm_stream, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&mg->scalars, 2 * sizeof(float)));
}

// Sets the shards from the model's padded parameter count and installs nothing yet (see
// multi_gpu_arm_hook).
static void multi_gpu_attach(MultiGpu* mg, const GPTModel* model) {
    mg->model = model;
    mg->shard_size = model->num_params_padded / (size_t)mg->world;
    mg->shard_offset = (size_t)mg->rank * mg->shard_size;
}

// Reduces grads[off, off + n) (mean over ranks): everywhere (zero 0) or to the owners (zero 1).
static void multi_gpu_reduce_range(MultiGpu* mg, __nv_bfloat16* grads, size_t off, size_t n) {
    if (!mg->zero) {
        NCCL_CHECK(ncclAllReduce(grads + off, grads + off, n, ncclBfloat16, ncclAvg, mg->comm, mg->comm_stream));
        return;
    }
    const size_t S = mg->shard_size;
    for (int q = (int)(off / S); q < mg->world && (size_t)q * S < off + n; q++) {
        const size_t a = off > (size_t)q * S ? off : (size_t)q * S;
        const size_t b = off + n < (size_t)(q + 1) * S ? off + n : (size_t)(q + 1) * S;
        if (a < b)
            NCCL_CHECK(ncclReduce(grads + a, grads + a, b - a, ncclBfloat16, ncclAvg, q, mg->comm, mg->comm_stream));
    }
}

// The backward hook: layer l's gradient slices (l = -1: wte, wpe, lnfw, lnfb) are final on the
// compute stream; reduce them on the communication stream.
static void multi_gpu_grads_ready(void* user, int layer) {
    MultiGpu* mg = (MultiGpu*)user;
    const GPTModel* m = mg->model;
    CUDA_CHECK(cudaEventRecord(mg->ready, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(mg->comm_stream, mg->ready, 0));
    NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {  // per-layer tensors: layer l's slice; the others at l = -1
        const int per_layer = GPT_PARAMS[i].per_layer;
        if (per_layer != (layer >= 0)) continue;
        const size_t n = per_layer ? m->param_sizes[i] / (size_t)m->L : m->param_sizes[i];
        multi_gpu_reduce_range(mg, m->grads, m->param_offsets[i] + (per_layer ? (size_t)layer * n : 0), n);
    }
    NCCL_CHECK(ncclGroupEnd());
    if (layer < 0) CUDA_CHECK(cudaEventRecord(mg->done, mg->comm_stream));
}

// Installs (on = 1) or removes the hook: on only for the backward of a step's last micro step.
static void multi_gpu_arm_hook(MultiGpu* mg, GPTModel* m, int on) {
    m->grads_ready = on ? multi_gpu_grads_ready : NULL;
    m->grads_ready_user = on ? (void*)mg : NULL;
}

// The compute stream waits until every gradient bucket of this step is reduced.
static void multi_gpu_wait_grads(MultiGpu* mg, cudaStream_t stream) {
    CUDA_CHECK(cudaStreamWaitEvent(stream, mg->done, 0));
}

static __global__ void multi_gpu_finish_kernel(float* scalars, float inv_world) {
    scalars[0] = sqrtf(scalars[0]);
    scalars[1] *= inv_world;
}

// After multi_gpu_wait_grads: scalars[0] = the global gradient norm (device; feed it to
// global_norm_clip_scale), scalars[1] = the mean of every rank's `loss`; both also copied to host.
static void multi_gpu_norm_and_loss(MultiGpu* mg, float* norm_scratch, double loss, float* host_norm,
                                    float* host_loss, cudaStream_t stream) {
    global_norm_squared(mg->scalars, norm_scratch, mg->model->grads + mg->shard_offset, mg->shard_size, stream);
    const float l = (float)loss;
    CUDA_CHECK(cudaMemcpyAsync(mg->scalars + 1, &l, sizeof(float), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllReduce(mg->scalars, mg->scalars, 2, ncclFloat, ncclSum, mg->comm, stream));
    multi_gpu_finish_kernel<<<1, 1, 0, stream>>>(mg->scalars, 1.0f / (float)mg->world);
    CUDA_CHECK(cudaGetLastError());
    float back[2];
    CUDA_CHECK(cudaMemcpyAsync(back, mg->scalars, sizeof(back), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    *host_norm = back[0];
    *host_loss = back[1];
}

// ZeRO-1: every rank's updated shard of the bf16 weights to every rank (in place).
static void multi_gpu_all_gather_params(MultiGpu* mg, __nv_bfloat16* params, cudaStream_t stream) {
    NCCL_CHECK(ncclAllGather(params + mg->shard_offset, params, mg->shard_size, ncclBfloat16, mg->comm, stream));
}

// The sum over ranks of `x` (blocking; also a barrier).
static double multi_gpu_sum(MultiGpu* mg, double x, cudaStream_t stream) {
    float v = (float)x;
    CUDA_CHECK(cudaMemcpyAsync(mg->scalars, &v, sizeof(float), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllReduce(mg->scalars, mg->scalars, 1, ncclFloat, ncclSum, mg->comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(&v, mg->scalars, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return v;
}

static void multi_gpu_destroy(MultiGpu* mg) {
    if (!mg->comm) return;
    CUDA_CHECK(cudaStreamSynchronize(mg->comm_stream));
    NCCL_CHECK(ncclCommDestroy(mg->comm));
    CUDA_CHECK(cudaStreamDestroy(mg->comm_stream));
    CUDA_CHECK(cudaEventDestroy(mg->ready));
    CUDA_CHECK(cudaEventDestroy(mg->done));
    CUDA_CHECK(cudaFree(mg->scalars));
    mg->comm = NULL;
}

#endif  // NCCL
#endif  // MULTI_GPU_CUH
