// multi_gpu.cuh: data-parallel training over NCCL, one process per GPU, with optional ZeRO-1.
//
// Setup: launcher.h says who this process is (rank, world, local rank) from mpirun / srun / torchrun
// environment variables; multi_gpu_init picks the GPU (local rank), rank 0 makes NCCL's unique id,
// launcher_rendezvous_keep hands it to every rank over TCP (MASTER_ADDR:MASTER_PORT, the sockets
// kept as the heartbeat, layers/multi_gpu/heartbeat.h) or through a shared file (--rendezvous file:PATH), and
// every rank joins the communicator. World 1 never comes here: the single-GPU path has no NCCL at all.
//
// The watchdog (layers/multi_gpu/watchdog.h): the communicator is non-blocking (ncclConfig_t.blocking = 0), so
// no NCCL call can hang the host; a call that answers ncclInProgress is waited for. Every point where
// the host waits for collectives (the step's gradient reduction and (norm, loss, stop) all-reduce,
// ZeRO-1's all-gather, multi_gpu_sum) records a CUDA event after them and polls it (cudaEventQuery)
// together with ncclCommGetAsyncError and the heartbeat, up to --nccl-timeout seconds. On a timeout,
// an async error or a dead peer, every rank prints one line (step, collective, suspected rank),
// aborts the communicator (ncclCommAbort, which also ends NCCL's kernels) and exits with status 1.
//
// The flat parameter vector (the model's params / grads allocations, num_params padded with zeros
// to P' = world · S, S a multiple of 1024: layers/optimizer/optimizer.cuh) is cut into world contiguous
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
//   --zero 0 --deterministic (owner_order): ZeRO-1's reduce, then each owner broadcasts its part, so
//             that the two stages sum every element in the same order and train bit for bit alike.
//             (With 3 or more ranks an all-reduce and a reduce to one rank add in different orders.)
// multi_gpu_wait_grads makes the compute stream wait for the communication stream before the norm.
// The norm: every rank sums the squares of its shard (global_norm_squared), one all-reduce of
// (Σ g², loss, stop) gives the global norm, the mean loss and whether any rank got a stop signal
// (SIGTERM on one rank stops every rank after the same step) on every rank. ZeRO-1's AdamW updates only
// the shard (the caller), then multi_gpu_all_gather_params sends the bf16 weights to every rank in
// place, layer by layer on the communication stream, while the next step's forward runs: before each
// layer the forward waits only for that layer's bucket (GPTModel.params_needed).
#ifndef MULTI_GPU_CUH
#define MULTI_GPU_CUH

#ifdef TRAIN_GPT_NO_NCCL
// A build without NCCL (the Makefile found none, or make NCCL=0): one GPU only. MultiGpu and the calls
// exist so the trainer compiles unchanged; the plan refuses a launch of several processes
// (MULTI_GPU_AVAILABLE), so none of these runs.
#include <stdio.h>
#include <stdlib.h>

#include "layers/model/gpt_model.cuh"
#include "layers/multi_gpu/launcher.h"

#define MULTI_GPU_AVAILABLE 0

typedef struct {
    int rank, world, zero, owner_order;
    float* scalars;
} MultiGpu;

static void multi_gpu_unavailable(void) {
    fprintf(stderr, "error: this train_gpt was built without NCCL: it trains on one GPU only\n");
    exit(2);
}
static void multi_gpu_init(MultiGpu*, const LaunchInfo*, int, int, uint64_t, double, const char*, double) {
    multi_gpu_unavailable();
}
static void multi_gpu_set_step(MultiGpu*, long long) {}
static void multi_gpu_attach(MultiGpu*, GPTModel*) { multi_gpu_unavailable(); }
static void multi_gpu_arm_hook(MultiGpu*, GPTModel*, int) { multi_gpu_unavailable(); }
static void multi_gpu_wait_grads(MultiGpu*, cudaStream_t) { multi_gpu_unavailable(); }
static void multi_gpu_norm_and_loss(MultiGpu*, float*, double, int, float*, float*, int*, cudaStream_t) {
    multi_gpu_unavailable();
}
static void multi_gpu_all_gather_params(MultiGpu*, cudaStream_t) { multi_gpu_unavailable(); }
static void multi_gpu_wait_params(MultiGpu*, cudaStream_t) {}
static void multi_gpu_watch_stream(MultiGpu*, cudaStream_t, const char*) {}
static double multi_gpu_sum(MultiGpu*, double, cudaStream_t, const char*) {
    multi_gpu_unavailable();
    return 0.0;
}
static double multi_gpu_exposed_ms(MultiGpu*) { return 0.0; }
static void multi_gpu_destroy(MultiGpu*) {}

#else  // NCCL

#define MULTI_GPU_AVAILABLE 1

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "layers/cuda_common.h"
#include "layers/optimizer/global_norm.cuh"
#include "layers/model/gpt_model.cuh"
#include "layers/multi_gpu/heartbeat.h"
#include "layers/multi_gpu/launcher.h"
#include "layers/multi_gpu/nccl_check.h"
#include "layers/multi_gpu/watchdog.h"


enum { MG_WAIT_EVENTS, MG_WAIT_COMM };  // what a watched wait polls

typedef struct {
    int rank, world, device, zero;
    int owner_order;            // zero 0: reduce as ZeRO-1 does, then broadcast (--deterministic; see above)
    ncclComm_t comm;
    cudaStream_t comm_stream;   // gradient reduction, overlapped with the backward
    cudaEvent_t ready, done;    // compute -> comm (a layer's gradients), comm -> compute (all reduced)
    cudaEvent_t scalars_done;   // after the (norm, loss, stop) all-reduce and its copy to the host
    // timing of what the compute stream waits for (multi_gpu_exposed_ms): the wait for the last
    // gradient bucket (from wait_start to done) and the (norm, loss, stop) all-reduce (between its pair
    // of events on the compute stream); ZeRO-1's stalls below
    cudaEvent_t wait_start, scalars_start, scalars_end;
    // ZeRO-1's all-gather, bucket by bucket on the communication stream (k = 0: wte, wpe, lnfw, lnfb;
    // k = l + 1: layer l), waited for by the next forward layer by layer (multi_gpu_params_needed)
    int buckets;                // L + 1
    cudaEvent_t updated;        // compute -> comm: the optimizer has written this rank's shard
    // Two sets of events, one per all-gather in turn: a step's gather records its set while the stalls
    // its forward had on the last gather's set are still to be read (multi_gpu_exposed_ms).
    int set;                    // the set of the last all-gather: its events are [set·buckets, +buckets)
    cudaEvent_t* gathered;      // (2·buckets) comm -> compute, timed: bucket k is everywhere
    cudaEvent_t* reached;       // (2·buckets) timed, on the compute stream where it began to wait for bucket k
    int* waited;                // (2·buckets) 1: the compute stream waited for that bucket since the last
                                // multi_gpu_exposed_ms (its stall counts there)
    int next_bucket;            // the first bucket the compute stream has not waited for; buckets: none pending
    cudaEvent_t finished;       // after the other watched collectives (all-gather, multi_gpu_sum)
    float* scalars;             // (3) device: Σ g², the loss and the stop flag for one all-reduce
    float* pinned;              // (3) host, pinned: with pageable memory cudaMemcpyAsync would wait for
                                // the stream on the host, where a hung collective would hang it too
    size_t shard_offset, shard_size;  // this rank's elements of the padded flat parameter vector
    GPTModel* model;            // for the hooks
    // the watchdog
    Watchdog wd;
    WatchdogPeer* peers;        // (world)
    Heartbeat hb;
    int have_heartbeat;         // TCP rendezvous: yes; file rendezvous: no channel
    int wait_kind;              // MG_WAIT_*
    ncclComm_t wait_comm;       // MG_WAIT_COMM polls this communicator when set (a split's child), else comm
    cudaEvent_t wait_events[2];
    int num_wait_events;
} MultiGpu;

// ---- the watchdog's view of NCCL and CUDA (layers/multi_gpu/watchdog.h) ------------------------------------

static double mg_now(void*) { return launcher_now(); }
static void mg_pause(void*, double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {0, (long)(seconds * 1e9)};
    nanosleep(&ts, NULL);
}
static int mg_done(void* user) {
    MultiGpu* mg = (MultiGpu*)user;
    if (mg->wait_kind == MG_WAIT_COMM) {
        ncclResult_t state = ncclSuccess;
        return ncclCommGetAsyncError(mg->wait_comm ? mg->wait_comm : mg->comm, &state) != ncclSuccess ||
               state != ncclInProgress;
    }
    for (int i = 0; i < mg->num_wait_events; i++) {
        const cudaError_t e = cudaEventQuery(mg->wait_events[i]);
        if (e == cudaErrorNotReady) return 0;
        CUDA_CHECK(e);
    }
    return 1;
}
static int mg_async_error(void* user, char* text, size_t len) {
    MultiGpu* mg = (MultiGpu*)user;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(mg->comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess || state == ncclInProgress) return 0;
    const char* last = ncclGetLastError(mg->comm);
    snprintf(text, len, "%s%s%s", ncclGetErrorString(state), last && *last ? ": " : "", last ? last : "");
    return 1;
}
static void mg_arrive(void* user, long long seq) { heartbeat_arrive(&((MultiGpu*)user)->hb, seq); }
static void mg_peers(void* user, WatchdogPeer* peers, WatchdogVerdict* v) { heartbeat_poll(&((MultiGpu*)user)->hb, peers, v); }
static void mg_announce(void* user, const WatchdogVerdict* v) { heartbeat_announce(&((MultiGpu*)user)->hb, v); }
// The step's wait covers two events: name the one still pending.
static const char* mg_which(void* user, const char* given) {
    MultiGpu* mg = (MultiGpu*)user;
    if (mg->wait_kind == MG_WAIT_EVENTS && mg->num_wait_events == 2 && cudaEventQuery(mg->wait_events[0]) == cudaErrorNotReady)
        return mg->zero ? "gradient reduce to the shard owners (ZeRO-1, the backward's buckets)"
                        : "gradient all-reduce (the backward's buckets)";
    return given;
}

// Waits as the watchdog does (see the top); on failure: the line, ncclCommAbort, exit(1).
static void multi_gpu_watch(MultiGpu* mg, const char* collective, int counted) {
    WatchdogOps ops = {mg, mg_now, mg_pause, mg_done, mg_async_error, NULL, NULL, NULL, mg_which};
    if (mg->have_heartbeat) ops.arrive = mg_arrive, ops.peers = mg_peers, ops.announce = mg_announce;
    if (watchdog_wait_counted(&mg->wd, &ops, collective, counted) == WATCHDOG_OK) return;
    fprintf(stderr, "%s\n", mg->wd.line);
    fflush(stderr);
    alarm(60);  // should the abort itself hang, SIGALRM ends the process
    ncclCommAbort(mg->comm);
    exit(1);
}

// The host waits for everything enqueued on `stream` so far (watched).
static void multi_gpu_watch_stream(MultiGpu* mg, cudaStream_t stream, const char* collective) {
    CUDA_CHECK(cudaEventRecord(mg->finished, stream));
    mg->wait_kind = MG_WAIT_EVENTS, mg->wait_events[0] = mg->finished, mg->num_wait_events = 1;
    multi_gpu_watch(mg, collective, 1);
}

// An NCCL call on the non-blocking communicator: ncclInProgress means "still being set up": wait for it
// (wait_now) or leave it to ncclGroupEnd (calls inside a group). Other errors exit as NCCL_CHECK does.
static void nccl_call(MultiGpu* mg, ncclResult_t r, int wait_now, const char* what, const char* file, int line) {
    if (r == ncclInProgress) {
        if (!wait_now) return;
        mg->wait_kind = MG_WAIT_COMM;
        multi_gpu_watch(mg, what, 0);  // only this rank waits: not a numbered collective
        char error[512];
        if (mg_async_error(mg, error, sizeof(error))) {
            fprintf(stderr, "error: NCCL failed at %s:%d (%s): %s\n", file, line, what, error);
            ncclCommAbort(mg->comm);
            exit(1);
        }
        return;
    }
    nccl_check(r, file, line);
}
#define NCCL_ENQUEUE(mg, call, what) nccl_call((mg), (call), 1, (what), __FILE__, __LINE__)
#define NCCL_IN_GROUP(mg, call) nccl_call((mg), (call), 0, "", __FILE__, __LINE__)

// The step number for the watchdog's messages.
static void multi_gpu_set_step(MultiGpu* mg, long long step) { mg->wd.step = step; }

// Joins the run's communicator on GPU `device` (already cudaSetDevice'd). `tag` hashes the options
// every rank must share; rendezvous_file: NULL for TCP, else the shared file's path. Exits with a
// message when the rendezvous or NCCL fails; the set-up is watched with nccl_timeout_s.
static void multi_gpu_init(MultiGpu* mg, const LaunchInfo* li, int device, int zero, uint64_t tag,
                           double timeout_s, const char* rendezvous_file, double nccl_timeout_s) {
    memset(mg, 0, sizeof(*mg));
    mg->rank = li->rank, mg->world = li->world, mg->device = device, mg->zero = zero;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (mg->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    char err[2048];
    int* sockets = (int*)malloc(sizeof(int) * (size_t)mg->world);
    for (int r = 0; r < mg->world; r++) sockets[r] = -1;
    if (launcher_rendezvous_keep(li, rendezvous_file, tag, &id, sizeof(id), timeout_s, sockets, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: rank %d of %d (%s): %s\n", mg->rank, mg->world, li->source, err);
        exit(1);
    }
    mg->peers = (WatchdogPeer*)calloc((size_t)mg->world, sizeof(WatchdogPeer));
    watchdog_init(&mg->wd, mg->rank, mg->world, nccl_timeout_s, mg->peers);
    heartbeat_init(&mg->hb, mg->rank, mg->world, sockets);
    mg->have_heartbeat = rendezvous_file == NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // no NCCL call may block the host: the watchdog waits instead
    const ncclResult_t r = ncclCommInitRankConfig(&mg->comm, mg->world, id, mg->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, __FILE__, __LINE__);
    mg->wait_kind = MG_WAIT_COMM;
    multi_gpu_watch(mg, "communicator set-up (ncclCommInitRankConfig)", 1);  // every rank: numbered
    char error[512];
    if (mg_async_error(mg, error, sizeof(error))) {
        fprintf(stderr, "error: rank %d of %d: NCCL could not set up the communicator: %s\nhint: rerun with "
                        "NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see which rank and transport failed\n",
                mg->rank, mg->world, error);
        exit(1);
    }
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&mg->comm_stream, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&mg->done));  // timed: the end of the gradient reduction
    cudaEvent_t* timed[] = {&mg->wait_start, &mg->scalars_start, &mg->scalars_end};
    for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++) CUDA_CHECK(cudaEventCreate(timed[i]));
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->scalars_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->finished, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&mg->scalars, 3 * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&mg->pinned, 3 * sizeof(float)));
}

static void multi_gpu_params_needed(void* user, int layer);

static void multi_gpu_free_buckets(MultiGpu* mg) {
    for (int k = 0; k < 2 * mg->buckets; k++) {
        CUDA_CHECK(cudaEventDestroy(mg->gathered[k]));
        CUDA_CHECK(cudaEventDestroy(mg->reached[k]));
    }
    if (mg->buckets) CUDA_CHECK(cudaEventDestroy(mg->updated));
    free(mg->gathered), free(mg->reached), free(mg->waited);
    mg->gathered = mg->reached = NULL, mg->waited = NULL, mg->buckets = 0;
}

// Sets the shards from the model's padded parameter count, makes the all-gather's per-bucket events
// and installs the forward's wait for the weights (multi_gpu_params_needed: a no-op until a ZeRO-1
// all-gather is pending). The gradient hook is multi_gpu_arm_hook's.
static void multi_gpu_attach(MultiGpu* mg, GPTModel* model) {
    multi_gpu_free_buckets(mg);
    mg->model = model;
    mg->shard_size = model->num_params_padded / (size_t)mg->world;
    mg->shard_offset = (size_t)mg->rank * mg->shard_size;
    mg->buckets = model->L + 1;
    mg->gathered = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * 2 * (size_t)mg->buckets);
    mg->reached = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * 2 * (size_t)mg->buckets);
    mg->waited = (int*)calloc(2 * (size_t)mg->buckets, sizeof(int));
    for (int k = 0; k < 2 * mg->buckets; k++) {
        CUDA_CHECK(cudaEventCreate(&mg->gathered[k]));
        CUDA_CHECK(cudaEventCreate(&mg->reached[k]));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&mg->updated, cudaEventDisableTiming));
    mg->next_bucket = mg->buckets;  // nothing pending
    model->params_needed = multi_gpu_params_needed;
    model->params_needed_user = mg;
}

typedef enum { MG_REDUCE, MG_GATHER } MgBucketOp;

// MG_REDUCE: the mean over ranks of buf[off, off + n), everywhere (sharded 0: all-reduce) or only in the
// shards that own it (sharded 1: ncclReduce to each owner). MG_GATHER (sharded 1): each owner's part of
// buf[off, off + n) broadcast to every rank, the mirror of the reduce. Calls inside the caller's NCCL group.
static void multi_gpu_range(MultiGpu* mg, MgBucketOp op, int sharded, __nv_bfloat16* buf, size_t off, size_t n) {
    if (!sharded) {
        NCCL_IN_GROUP(mg, ncclAllReduce(buf + off, buf + off, n, ncclBfloat16, ncclAvg, mg->comm, mg->comm_stream));
        return;
    }
    const size_t S = mg->shard_size;
    for (int q = (int)(off / S); q < mg->world && (size_t)q * S < off + n; q++) {
        const size_t a = off > (size_t)q * S ? off : (size_t)q * S;
        const size_t b = off + n < (size_t)(q + 1) * S ? off + n : (size_t)(q + 1) * S;
        if (a >= b) continue;
        if (op == MG_REDUCE)
            NCCL_IN_GROUP(mg, ncclReduce(buf + a, buf + a, b - a, ncclBfloat16, ncclAvg, q, mg->comm, mg->comm_stream));
        else
            NCCL_IN_GROUP(mg, ncclBroadcast(buf + a, buf + a, b - a, ncclBfloat16, q, mg->comm, mg->comm_stream));
    }
}

// One NCCL group on the communication stream over one bucket of buf (the model's grads or params
// layout): layer l's slices of the per-layer tensors (gpt_config.h's table; not contiguous), or for
// l = -1 the other tensors: wte, wpe, lnfw, lnfb. `what` names it in an error.
static void multi_gpu_bucket_group(MultiGpu* mg, MgBucketOp op, int sharded, __nv_bfloat16* buf, int layer,
                                   const char* what) {
    const GPTModel* m = mg->model;
    NCCL_IN_GROUP(mg, ncclGroupStart());
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const int per_layer = GPT_PARAMS[i].per_layer;
        if (per_layer != (layer >= 0)) continue;
        const size_t n = per_layer ? m->param_sizes[i] / (size_t)m->L : m->param_sizes[i];
        multi_gpu_range(mg, op, sharded, buf, m->param_offsets[i] + (per_layer ? (size_t)layer * n : 0), n);
    }
    NCCL_ENQUEUE(mg, ncclGroupEnd(), what);
}

// One bucket's reduce or gather. ZeRO 0 in owner order: ZeRO-1's reduce, then the owners' broadcast in
// a second group (inside one group the broadcast could read a part before its reduce wrote it).
static void multi_gpu_bucket(MultiGpu* mg, MgBucketOp op, __nv_bfloat16* buf, int layer) {
    const int owner_order = !mg->zero && mg->owner_order;
    multi_gpu_bucket_group(mg, op, mg->zero || owner_order, buf, layer,
                           op == MG_REDUCE ? "enqueueing the gradient reduction (ncclGroupEnd)"
                                           : "enqueueing the ZeRO-1 all-gather of the weights (ncclGroupEnd)");
    if (op == MG_REDUCE && owner_order)
        multi_gpu_bucket_group(mg, MG_GATHER, 1, buf, layer,
                               "enqueueing the owners' broadcast of the gradients (ncclGroupEnd)");
}

// The backward hook: layer l's gradient slices (l = -1: wte, wpe, lnfw, lnfb) are final on the
// compute stream; reduce them on the communication stream.
static void multi_gpu_grads_ready(void* user, int layer) {
    MultiGpu* mg = (MultiGpu*)user;
    CUDA_CHECK(cudaEventRecord(mg->ready, mg->model->stream));
    CUDA_CHECK(cudaStreamWaitEvent(mg->comm_stream, mg->ready, 0));
    multi_gpu_bucket(mg, MG_REDUCE, mg->model->grads, layer);
    if (layer < 0) CUDA_CHECK(cudaEventRecord(mg->done, mg->comm_stream));
}

// Installs (on = 1) or removes the hook: on only for the backward of a step's last micro step.
static void multi_gpu_arm_hook(MultiGpu* mg, GPTModel* m, int on) {
    m->grads_ready = on ? multi_gpu_grads_ready : NULL;
    m->grads_ready_user = on ? (void*)mg : NULL;
}

static void multi_gpu_wait_params(MultiGpu* mg, cudaStream_t stream);

// The compute stream waits until every gradient bucket of this step is reduced, and for a ZeRO-1
// all-gather still pending (none after a forward): the optimizer must not rewrite a shard still sent.
static void multi_gpu_wait_grads(MultiGpu* mg, cudaStream_t stream) {
    multi_gpu_wait_params(mg, stream);
    CUDA_CHECK(cudaEventRecord(mg->wait_start, stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, mg->done, 0));
}

static __global__ void multi_gpu_finish_kernel(float* scalars, float inv_world) {
    scalars[0] = sqrtf(scalars[0]);
    scalars[1] *= inv_world;
}

// After multi_gpu_wait_grads: scalars[0] = the global gradient norm (device; feed it to
// global_norm_clip_scale), scalars[1] = the mean of every rank's `loss`; both also copied to host.
// `stop`: this rank got a stop signal; *host_stop: some rank did (the flag rides in the same
// all-reduce, so every rank sees it after the same step at no extra cost). The host's wait for the
// step's collectives (gradients and this all-reduce) is the watchdog's.
static void multi_gpu_norm_and_loss(MultiGpu* mg, float* norm_scratch, double loss, int stop, float* host_norm,
                                    float* host_loss, int* host_stop, cudaStream_t stream) {
    global_norm_squared(mg->scalars, norm_scratch, mg->model->grads + mg->shard_offset, mg->shard_size, stream);
    CUDA_CHECK(cudaEventRecord(mg->scalars_start, stream));
    float* host = mg->pinned;
    host[0] = 0.0f, host[1] = (float)loss, host[2] = stop ? 1.0f : 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(mg->scalars + 1, host + 1, 2 * sizeof(float), cudaMemcpyHostToDevice, stream));
    NCCL_ENQUEUE(mg, ncclAllReduce(mg->scalars, mg->scalars, 3, ncclFloat, ncclSum, mg->comm, stream),
                 "enqueueing the (norm, loss, stop) all-reduce");
    CUDA_CHECK(cudaEventRecord(mg->scalars_end, stream));
    multi_gpu_finish_kernel<<<1, 1, 0, stream>>>(mg->scalars, 1.0f / (float)mg->world);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(host, mg->scalars, 3 * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaEventRecord(mg->scalars_done, stream));
    mg->wait_kind = MG_WAIT_EVENTS, mg->num_wait_events = 2;
    mg->wait_events[0] = mg->done, mg->wait_events[1] = mg->scalars_done;
    multi_gpu_watch(mg, "(grad norm, loss, stop) all-reduce", 1);
    *host_norm = host[0];
    *host_loss = host[1];
    *host_stop = host[2] > 0.0f;
}

// ZeRO-1, after the optimizer wrote this rank's shard of the bf16 weights on `stream`: every shard to
// every rank (in place), bucket by bucket in the order the next forward reads them (the embeddings,
// then layer 0, 1, ...), on the communication stream. Nothing waits here: the next forward waits for
// each layer's bucket as it reaches it (multi_gpu_params_needed), so the transfer hides behind the
// layers before; whatever else reads the weights first calls multi_gpu_wait_params. A hung transfer
// is caught by the host's next watched wait, which follows a forward (multi_gpu_watch_stream).
static void multi_gpu_all_gather_params(MultiGpu* mg, cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(mg->updated, stream));
    CUDA_CHECK(cudaStreamWaitEvent(mg->comm_stream, mg->updated, 0));
    mg->set ^= 1;
    const int first = mg->set * mg->buckets;
    for (int k = 0; k < mg->buckets; k++) {
        multi_gpu_bucket(mg, MG_GATHER, mg->model->params, k - 1);
        CUDA_CHECK(cudaEventRecord(mg->gathered[first + k], mg->comm_stream));
        mg->waited[first + k] = 0;  // a stall never read (no multi_gpu_exposed_ms since) is dropped
    }
    mg->next_bucket = 0;
}

// `stream` waits until bucket k (and so every bucket before it: one stream sends them in order) is
// gathered; the time it reached the wait is recorded for multi_gpu_exposed_ms.
static void multi_gpu_wait_bucket(MultiGpu* mg, int k, cudaStream_t stream) {
    if (k < mg->next_bucket) return;
    mg->next_bucket = k + 1;
    k += mg->set * mg->buckets;
    CUDA_CHECK(cudaEventRecord(mg->reached[k], stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, mg->gathered[k], 0));
    mg->waited[k] = 1;
}

// The model's forward hook (GPTModel.params_needed): the forward is about to read layer l's weights
// (l = -1: the embeddings and lnf; l = L: all of them, for the FP8 casts).
static void multi_gpu_params_needed(void* user, int layer) {
    MultiGpu* mg = (MultiGpu*)user;
    if (mg->next_bucket >= mg->buckets) return;  // nothing pending
    multi_gpu_wait_bucket(mg, layer + 1 < mg->buckets ? layer + 1 : mg->buckets - 1, mg->model->stream);
}

// `stream` waits for the whole pending all-gather, if any: before anything but the training forward
// reads the weights (validation, evaluation, samples, a checkpoint).
static void multi_gpu_wait_params(MultiGpu* mg, cudaStream_t stream) {
    if (mg->next_bucket < mg->buckets) multi_gpu_wait_bucket(mg, mg->buckets - 1, stream);
}

// Milliseconds the compute stream waited on communication since the last call (call after the step
// has finished): the gradient buckets still reducing when the backward ended (0 when they were done
// before), the (norm, loss, stop) all-reduce, and with ZeRO-1 the forward's stalls on buckets of the
// all-gather not yet there when it reached them.
static double multi_gpu_exposed_ms(MultiGpu* mg) {
    float wait = 0.0f, scalars = 0.0f, stalls = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&wait, mg->wait_start, mg->done));  // negative: done before the wait
    CUDA_CHECK(cudaEventElapsedTime(&scalars, mg->scalars_start, mg->scalars_end));
    for (int k = 0; k < 2 * mg->buckets; k++) {
        if (!mg->waited[k]) continue;
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, mg->reached[k], mg->gathered[k]));
        if (ms > 0.0f) stalls += ms;
        mg->waited[k] = 0;
    }
    return (wait > 0.0f ? wait : 0.0f) + scalars + stalls;
}

// A sub-communicator of the ranks that pass the same `color`, ordered by `key` (ncclCommSplit, a
// collective of every rank), non-blocking as the world's; its set-up is waited for by the watchdog.
// `what` names it in the messages. The caller finalizes and destroys it before multi_gpu_destroy.
static void multi_gpu_split(MultiGpu* mg, int color, int key, ncclComm_t* out, const char* what) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // as the world's: the watchdog waits, never an NCCL call
    *out = NULL;
    const ncclResult_t r = ncclCommSplit(mg->comm, color, key, out, &config);
    if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, __FILE__, __LINE__);
    mg->wait_kind = MG_WAIT_COMM, mg->wait_comm = *out;
    multi_gpu_watch(mg, what, 1);  // every rank splits: numbered
    mg->wait_comm = NULL;
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(*out, &state));
    if (state != ncclSuccess) {
        fprintf(stderr, "error: rank %d of %d: NCCL could not set up %s: %s\nhint: rerun with NCCL_DEBUG=INFO to see "
                        "which rank and transport failed\n", mg->rank, mg->world, what, ncclGetErrorString(state));
        exit(1);
    }
}

// The sum over ranks of `x` (blocking, watched; also a barrier). `what` names it for the watchdog.
static double multi_gpu_sum(MultiGpu* mg, double x, cudaStream_t stream, const char* what) {
    mg->pinned[0] = (float)x;
    CUDA_CHECK(cudaMemcpyAsync(mg->scalars, mg->pinned, sizeof(float), cudaMemcpyHostToDevice, stream));
    NCCL_ENQUEUE(mg, ncclAllReduce(mg->scalars, mg->scalars, 1, ncclFloat, ncclSum, mg->comm, stream), what);
    CUDA_CHECK(cudaMemcpyAsync(mg->pinned, mg->scalars, sizeof(float), cudaMemcpyDeviceToHost, stream));
    multi_gpu_watch_stream(mg, stream, what);
    return mg->pinned[0];
}

// A clean end, the same on every rank: tells the heartbeat (the closing sockets are no failure),
// finalizes and frees the communicator.
static void multi_gpu_destroy(MultiGpu* mg) {
    if (!mg->comm) return;
    CUDA_CHECK(cudaStreamSynchronize(mg->comm_stream));
    heartbeat_goodbye(&mg->hb);
    NCCL_ENQUEUE(mg, ncclCommFinalize(mg->comm), "communicator shutdown (ncclCommFinalize)");
    NCCL_CHECK(ncclCommDestroy(mg->comm));
    heartbeat_close(&mg->hb);
    free(mg->peers);
    CUDA_CHECK(cudaStreamDestroy(mg->comm_stream));
    CUDA_CHECK(cudaEventDestroy(mg->ready));
    CUDA_CHECK(cudaEventDestroy(mg->done));
    CUDA_CHECK(cudaEventDestroy(mg->scalars_done));
    CUDA_CHECK(cudaEventDestroy(mg->finished));
    multi_gpu_free_buckets(mg);
    cudaEvent_t timed[] = {mg->wait_start, mg->scalars_start, mg->scalars_end};
    for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++) CUDA_CHECK(cudaEventDestroy(timed[i]));
    CUDA_CHECK(cudaFree(mg->scalars));
    CUDA_CHECK(cudaFreeHost(mg->pinned));
    mg->comm = NULL;
}

#endif  // NCCL
#endif  // MULTI_GPU_CUH
