// ring_attention.cuh: softmax attention over a context-parallel group of N ranks, each holding T/N
// tokens of every sequence (the zigzag split, layers/context_parallel/zigzag.h), with flash2 on every
// block and K/V passed around a ring with NCCL send/recv.
//
// Tensors are each rank's local ones, in the model's layout and strides (attention/attention.h):
//   q (B, T/N, NH, HD) at qkv_stride; k, v (B, T/N, NKV, HD) at kv_stride; out, dout (B, T/N, NH, HD)
//   at out_stride; lse (B, NH, T/N) fp32; dq like q at dqkv_stride, dk and dv like k at dkv_stride.
// Local position p < C = T/(2N) is global position rank·C + p, p >= C is (2N−1−rank)·C + p − C. The
// results equal attention over the whole sequence (T tokens, causal or not, GQA) at those positions:
// out and lse in the forward, dq, dk, dv (overwritten) in the backward.
//
// Forward. The rank's two query chunks meet every rank's two K/V chunks: N ring steps; at step s the
// rank holds rank (rank − s) mod N's K and V (step 0: its own) while the next block travels on the
// communication stream (double buffer; see ring_pass). Each (query chunk, key chunk) pair is one
// flash2 call on C queries and C keys, by zigzag_block: full (causal = 0), diagonal (causal = 1) or
// skipped. No offset between query and key positions is needed: a full block has every key before
// every query, a diagonal block's keys and queries are the same chunk, so its local causal mask (key
// index <= query index inside the chunk) is the global one; chunks never overlap partly. Each call
// gives a partial output O_s normalized over its keys and their LSE L_s; O_s comes in fp32
// (AttentionArgs.out_f32) and they merge in fp32 into a running output and LSE per query row
// (ring_merge_kernel), rounded to bf16 once at the end, as one flash2 call over the whole sequence
// rounds its output once.
//
// Backward. With the global out and lse (from the forward) D = rowsum(dO ∘ O) and P = exp(S − lse)
// are the whole sequence's, so every block's flash2 backward on its (query chunk, key chunk) gives
// exactly that block's terms of dQ, dK and dV. The ring runs again: K/V travel as in the forward,
// and with them an fp32 dK/dV buffer: at each step a rank adds its blocks' dK/dV to the buffer
// that arrived with (for) those K/V and passes it on; after N passes it is back at its owner with
// every rank's terms. dQ stays local in fp32. Why travel rather than a second pass (a reduce-scatter
// of every rank's dK/dV for every owner after the loop): the same bytes move, but travelling needs 2
// fp32 buffers instead of N, and its transfers overlap the next step's compute (the step's own
// terms are summed in a separate buffer first, so compute never waits for the incoming dK/dV). Only
// the last pass, home, is exposed. The partial dq, dk, dv of each block are bf16 (attention.h: the
// backward has no fp32 outputs), so each block's terms are rounded once before their fp32 sum.
//
// Streams: everything is enqueued on the caller's stream and the module's communication stream,
// ordered by events; the host never waits for data (except to sum the timed waits, ring_wait: at
// ring_attention_exposed_ms, and once every RING_TIMED_WAITS waits). On a non-blocking communicator
// (what layers/multi_gpu/multi_gpu.cuh makes), ncclGroupEnd may answer ncclInProgress: NCCL then requires
// waiting until the group is enqueued (ncclCommGetAsyncError), which happens here (host side only).
// The communicator is the context-parallel group's (rank = this rank's index in it), used by nothing
// else concurrently; N = 1 needs none (NULL).
#ifndef RING_ATTENTION_CUH
#define RING_ATTENTION_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "layers/context_parallel/ring_attention_kernels.cuh"
#include "layers/context_parallel/zigzag.h"
#include "layers/cuda_common.h"
#include "layers/multi_gpu/nccl_check.h"

typedef struct {
    AttentionShape global;  // the whole sequence (T tokens)
    AttentionShape block;   // one (query chunk, key chunk) call: T = C, causal set per call
    int rank, world;
    ncclComm_t comm;            // the context-parallel group; NULL when world == 1
    cudaStream_t comm_stream;   // the ring's transfers
    cudaEvent_t go;             // compute -> comm: buffers ready to send / free to receive into
    cudaEvent_t kv_arrived, dkv_arrived;  // comm -> compute: the next K/V, the incoming dK/dV
    int deterministic;          // passed to flash2's backward (AttentionArgs.deterministic)
    // the compute stream's waits for the ring, each between a pair of timed events (ring_wait), summed
    // by ring_attention_exposed_ms: the communication the overlap did not hide
    cudaEvent_t *reached, *passed;  // (RING_TIMED_WAITS) each
    int waits;                  // pairs recorded since the last sum
    double waited_ms;           // summed early when the pairs ran out
    int test_drop_block;        // tests only: block step·4 + q chunk·2 + k chunk is left out; -1 in use
    void* memory;               // everything below, one allocation
    // chunk-major (2, B, C, ...) copies (ring_attention_kernels.cuh): q, and in the backward out, dout
    __nv_bfloat16 *q, *o, *dout;
    __nv_bfloat16* kv[2];       // the ring's K/V: (2, B, C, 2, NKV, HD), K then V of each token
    __nv_bfloat16 *part_o;      // one call's out or dq (B, C, NH, HD)
    float* part_o_f32;          // one call's out in fp32 (B, C, NH, HD), what the merge reads
    __nv_bfloat16 *part_kv;     // one call's dk, dv (B, C, 2, NKV, HD)
    float* part_lse;            // one call's LSE (B, NH, C)
    float* acc_o;               // (2, B, C, NH, HD): forward the running output, backward dQ
    float* acc_lse;             // (2, B, NH, C): forward the running LSE, backward the global LSE
    float* dkv[2];              // the travelling dK/dV (2, B, C, 2, NKV, HD)
    float* dkv_step;            // this step's dK/dV terms, same shape
    void* attn_workspace;       // flash2's workspace for one call
} RingAttention;

// Timed waits held before they are summed: several micro steps of a large model (a layer's forward
// waits N−1 times, its backward 2N−1 times); more are summed on the way (a host wait on old events).
#define RING_TIMED_WAITS 8192

static inline void ring_nccl_check(ncclResult_t r, const char* file, int line) {
    if (r != ncclInProgress) nccl_check(r, file, line);  // in progress: settled by ring_group_end
}
#define RING_NCCL_CHECK(call) ring_nccl_check((call), __FILE__, __LINE__)

// 0 when N ranks can run attention of `global` (T tokens) this way; else -1 and what to change.
static int ring_attention_check(const AttentionShape* global, int world, char* why, size_t why_size) {
    if (zigzag_check(global->T, world, why, why_size) != 0) return -1;
    AttentionShape block = *global;
    block.T = global->T / (2 * world);
    char inner[384];
    if (attention_check(ATTN_FLASH2, &block, inner, sizeof(inner)) != 0) {
        snprintf(why, why_size, "ring attention runs flash2 on chunks of %d tokens: %s", block.T, inner);
        return -1;
    }
    return 0;
}

// Lays the buffers out from base (NULL: only counts); returns the bytes.
static size_t ring_layout(RingAttention* ra, char* base) {
    const AttentionShape* s = &ra->block;
    const size_t qn = (size_t)2 * s->B * s->T * s->NH * s->HD, kvn = (size_t)2 * s->B * s->T * 2 * s->NKV * s->HD;
    const size_t ln = (size_t)2 * s->B * s->NH * s->T;
    AttentionShape full = *s;
    full.causal = 0;
    size_t ws = attention_workspace_bytes(ATTN_FLASH2, &full);
    full.causal = 1;
    if (attention_workspace_bytes(ATTN_FLASH2, &full) > ws) ws = attention_workspace_bytes(ATTN_FLASH2, &full);
    struct { void** at; size_t bytes; } parts[] = {
        {(void**)&ra->q, qn * 2}, {(void**)&ra->o, qn * 2}, {(void**)&ra->dout, qn * 2},
        {(void**)&ra->kv[0], kvn * 2}, {(void**)&ra->kv[1], kvn * 2}, {(void**)&ra->part_o, qn},
        {(void**)&ra->part_o_f32, qn * 2},
        {(void**)&ra->part_kv, kvn}, {(void**)&ra->part_lse, ln * 2}, {(void**)&ra->acc_o, qn * 4},
        {(void**)&ra->acc_lse, ln * 4}, {(void**)&ra->dkv[0], kvn * 4}, {(void**)&ra->dkv[1], kvn * 4},
        {(void**)&ra->dkv_step, kvn * 4}, {&ra->attn_workspace, ws}};
    size_t at = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (base) *parts[i].at = base + at;
        at += (parts[i].bytes + 255) / 256 * 256;  // 256-byte aligned, as cudaMalloc's own
    }
    return at;
}

// Bytes of GPU memory ring_attention_create allocates for `global` over `world` ranks.
static size_t ring_attention_memory_bytes(const AttentionShape* global, int world) {
    RingAttention ra;
    memset(&ra, 0, sizeof(ra));
    ra.block = *global;
    ra.block.T = global->T / (2 * world);
    return ring_layout(&ra, NULL);
}

// Sets up attention of `global` over `world` ranks, this one `rank`, on the current GPU. Exits with
// a message (before any GPU work) when ring_attention_check rejects the shape.
static void ring_attention_create(RingAttention* ra, const AttentionShape* global, int world, int rank,
                                  ncclComm_t comm) {
    char why[512];
    if (ring_attention_check(global, world, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: %s\n", why);
        exit(EXIT_FAILURE);
    }
    if (world > 1 && !comm) {
        fprintf(stderr, "error: ring attention over %d ranks needs their NCCL communicator (a bug)\n", world);
        exit(EXIT_FAILURE);
    }
    memset(ra, 0, sizeof(*ra));
    ra->global = *global, ra->block = *global;
    ra->block.T = global->T / (2 * world);
    ra->rank = rank, ra->world = world, ra->comm = comm, ra->test_drop_block = -1;
    const size_t bytes = ring_layout(ra, NULL);
    cuda_malloc_or_explain(&ra->memory, bytes, "ring attention's buffers",
                           "lower the batch size, or spread the sequence over more GPUs");
    ring_layout(ra, (char*)ra->memory);
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&ra->comm_stream, cudaStreamNonBlocking, greatest));
    cudaEvent_t* events[] = {&ra->go, &ra->kv_arrived, &ra->dkv_arrived};
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++)
        CUDA_CHECK(cudaEventCreateWithFlags(events[i], cudaEventDisableTiming));
    ra->reached = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * RING_TIMED_WAITS);
    ra->passed = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * RING_TIMED_WAITS);
    if (!ra->reached || !ra->passed) {
        fprintf(stderr, "error: out of host memory for ring attention's events\n");
        exit(EXIT_FAILURE);
    }
    for (int i = 0; i < RING_TIMED_WAITS; i++) {
        CUDA_CHECK(cudaEventCreate(&ra->reached[i]));
        CUDA_CHECK(cudaEventCreate(&ra->passed[i]));
    }
}

static void ring_attention_destroy(RingAttention* ra) {
    CUDA_CHECK(cudaStreamSynchronize(ra->comm_stream));
    cudaEvent_t events[] = {ra->go, ra->kv_arrived, ra->dkv_arrived};
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) CUDA_CHECK(cudaEventDestroy(events[i]));
    for (int i = 0; i < RING_TIMED_WAITS; i++) {
        CUDA_CHECK(cudaEventDestroy(ra->reached[i]));
        CUDA_CHECK(cudaEventDestroy(ra->passed[i]));
    }
    free(ra->reached), free(ra->passed);
    CUDA_CHECK(cudaStreamDestroy(ra->comm_stream));
    CUDA_CHECK(cudaFree(ra->memory));
    memset(ra, 0, sizeof(*ra));
}

// ---- the ring ---------------------------------------------------------------------------------------

// ncclGroupEnd, waiting (host side) until a non-blocking communicator has enqueued the group.
static void ring_group_end(RingAttention* ra) {
    ncclResult_t r = ncclGroupEnd();
    while (r == ncclInProgress) RING_NCCL_CHECK(ncclCommGetAsyncError(ra->comm, &r));
    RING_NCCL_CHECK(r);
}

// Sends `bytes` at `send` to the next rank and receives as many from the previous one into `recv`, on
// the communication stream once `stream` has done everything enqueued so far (the event `go`: what
// is sent is complete, what is received into is no longer read); `done` follows the transfer.
static void ring_pass(RingAttention* ra, const void* send, void* recv, size_t bytes, cudaEvent_t done,
                      cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(ra->go, stream));
    CUDA_CHECK(cudaStreamWaitEvent(ra->comm_stream, ra->go, 0));
    RING_NCCL_CHECK(ncclGroupStart());
    RING_NCCL_CHECK(ncclSend(send, bytes, ncclChar, zigzag_ring_next(ra->rank, ra->world), ra->comm, ra->comm_stream));
    RING_NCCL_CHECK(ncclRecv(recv, bytes, ncclChar, zigzag_ring_prev(ra->rank, ra->world), ra->comm, ra->comm_stream));
    ring_group_end(ra);
    CUDA_CHECK(cudaEventRecord(done, ra->comm_stream));
}

// Sums the recorded waits into waited_ms (a host wait for the last of them) and starts over.
static void ring_sum_waits(RingAttention* ra) {
    if (ra->waits == 0) return;
    CUDA_CHECK(cudaEventSynchronize(ra->passed[ra->waits - 1]));
    for (int i = 0; i < ra->waits; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ra->reached[i], ra->passed[i]));
        ra->waited_ms += ms;
    }
    ra->waits = 0;
}

// `stream` waits for `arrived` (a transfer of the communication stream), between a pair of timed
// events: how long it stood is the ring's exposed time.
static void ring_wait(RingAttention* ra, cudaEvent_t arrived, cudaStream_t stream) {
    if (ra->waits == RING_TIMED_WAITS) ring_sum_waits(ra);
    CUDA_CHECK(cudaEventRecord(ra->reached[ra->waits], stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, arrived, 0));
    CUDA_CHECK(cudaEventRecord(ra->passed[ra->waits], stream));
    ra->waits++;
}

// Milliseconds the compute stream stood waiting for the ring since the last call (after the stream
// has passed those waits: waits for them on the host otherwise).
static double ring_attention_exposed_ms(RingAttention* ra) {
    ring_sum_waits(ra);
    const double ms = ra->waited_ms;
    ra->waited_ms = 0.0;
    return ms;
}

static size_t ring_q_elems(const RingAttention* ra) {  // one chunk of q, out or dout: (B, C, NH, HD)
    return (size_t)ra->block.B * ra->block.T * ra->block.NH * ra->block.HD;
}
static size_t ring_kv_elems(const RingAttention* ra) {  // one chunk of K and V: (B, C, 2, NKV, HD)
    return (size_t)ra->block.B * ra->block.T * 2 * ra->block.NKV * ra->block.HD;
}
static size_t ring_lse_elems(const RingAttention* ra) {  // one chunk's LSE: (B, NH, C)
    return (size_t)ra->block.B * ra->block.NH * ra->block.T;
}

// The block of local query chunk qc against key chunk kc of the K/V in `kv` (held at ring step
// `step`): skipped, or its flash2 arguments (q, k, v, shape, workspace; the caller adds the rest).
static int ring_block(const RingAttention* ra, int step, int qc, const __nv_bfloat16* kv, int kc, AttentionArgs* a) {
    const int src = zigzag_ring_source(ra->rank, step, ra->world);
    const ZigzagBlock kind = zigzag_block(zigzag_chunk_of(ra->rank, qc, ra->world),
                                          zigzag_chunk_of(src, kc, ra->world), ra->global.causal);
    if (kind == ZIGZAG_SKIP || ra->test_drop_block == step * 4 + qc * 2 + kc) return 0;
    const AttentionShape* s = &ra->block;
    memset(a, 0, sizeof(*a));
    a->shape = *s;
    a->shape.causal = kind == ZIGZAG_DIAGONAL;
    a->q = ra->q + qc * ring_q_elems(ra);
    a->qkv_stride = (long)s->NH * s->HD;
    a->k = kv + kc * ring_kv_elems(ra);
    a->v = a->k + (size_t)s->NKV * s->HD;
    a->kv_stride = 2L * s->NKV * s->HD;
    a->workspace = ra->attn_workspace;
    a->deterministic = ra->deterministic;
    return 1;
}

// Exits with a message when the caller's local arguments do not have the local shape.
static void ring_check_args(const RingAttention* ra, const AttentionArgs* a) {
    const AttentionShape* g = &ra->global;
    const AttentionShape* s = &a->shape;
    if (s->B == g->B && s->T == g->T / ra->world && s->NH == g->NH && s->HD == g->HD && s->causal == g->causal &&
        s->NKV == g->NKV)
        return;
    fprintf(stderr, "error: ring attention set up for B %d, T %d / %d ranks = %d, NH %d, HD %d, causal %d, NKV %d was "
                    "called with B %d, T %d, NH %d, HD %d, causal %d, NKV %d (the local shape; a bug)\n",
            g->B, g->T, ra->world, g->T / ra->world, g->NH, g->HD, g->causal, g->NKV, s->B, s->T, s->NH, s->HD,
            s->causal, s->NKV);
    exit(EXIT_FAILURE);
}

// The rank's q and its own K and V into the chunk-major buffers (ring_attention_kernels.cuh).
static void ring_load_qkv(RingAttention* ra, const AttentionArgs* a, cudaStream_t stream) {
    const AttentionShape* s = &ra->block;
    const int qw = s->NH * s->HD, kw = s->NKV * s->HD;
    const long kvs = attention_kv_stride(a);
    ring_load_rows(ra->q, qw, a->q, a->qkv_stride, qw, s->B, s->T, stream);
    ring_load_rows(ra->kv[0], 2L * kw, a->k, kvs, kw, s->B, s->T, stream);
    ring_load_rows(ra->kv[0] + kw, 2L * kw, a->v, kvs, kw, s->B, s->T, stream);
}

// ---- forward and backward -----------------------------------------------------------------------

// One step's blocks: each flash2 forward's partial result merged into its query chunk's running one.
static void ring_forward_step(RingAttention* ra, int step, const __nv_bfloat16* kv, cudaStream_t stream) {
    const AttentionShape* s = &ra->block;
    const AttentionContext ctx = {NULL};
    for (int qc = 0; qc < 2; qc++)
        for (int kc = 0; kc < 2; kc++) {
            AttentionArgs a;
            if (!ring_block(ra, step, qc, kv, kc, &a)) continue;
            a.out = ra->part_o, a.out_f32 = ra->part_o_f32, a.out_stride = (long)s->NH * s->HD;
            a.lse = ra->part_lse;
            attention_forward(ATTN_FLASH2, &ctx, &a, stream);
            ring_merge(ra->acc_o + qc * ring_q_elems(ra), ra->acc_lse + qc * ring_lse_elems(ra), ra->part_o_f32,
                       ra->part_lse, s->B, s->T, s->NH, s->HD, stream);
        }
}

// Forward: a (local q, k, v) -> a->out, a->lse (see the top). Enqueued on `stream`.
static void ring_attention_forward(RingAttention* ra, const AttentionArgs* a, cudaStream_t stream) {
    ring_check_args(ra, a);
    const AttentionShape* s = &ra->block;
    ring_load_qkv(ra, a, stream);
    CUDA_CHECK(cudaMemsetAsync(ra->acc_o, 0, 2 * ring_q_elems(ra) * sizeof(float), stream));
    ring_fill_f32(ra->acc_lse, 2 * ring_lse_elems(ra), -INFINITY, stream);
    for (int step = 0; step < ra->world; step++) {
        const int cur = step % 2;
        if (step + 1 < ra->world)  // the next step's K/V travel while this step computes
            ring_pass(ra, ra->kv[cur], ra->kv[1 - cur], ring_kv_elems(ra) * 2 * sizeof(__nv_bfloat16),
                      ra->kv_arrived, stream);
        ring_forward_step(ra, step, ra->kv[cur], stream);
        if (step + 1 < ra->world) ring_wait(ra, ra->kv_arrived, stream);
    }
    ring_store(a->out, a->out_stride, ra->acc_o, (long)s->NH * s->HD, s->NH * s->HD, s->B, s->T, stream);
    ring_lse_rows(ra->acc_lse, a->lse, s->B, s->NH, s->T, 0, stream);
}

// One step's blocks: each flash2 backward's dq added to its query chunk's dQ, its dk and dv to this
// step's dK/dV terms (dkv_step: the first block of a key chunk writes them, a chunk no block met is
// zeroed).
static void ring_backward_step(RingAttention* ra, int step, const __nv_bfloat16* kv, cudaStream_t stream) {
    const AttentionShape* s = &ra->block;
    const AttentionContext ctx = {NULL};
    int written[2] = {0, 0};
    for (int qc = 0; qc < 2; qc++)
        for (int kc = 0; kc < 2; kc++) {
            AttentionArgs a;
            if (!ring_block(ra, step, qc, kv, kc, &a)) continue;
            a.out = ra->o + qc * ring_q_elems(ra), a.out_stride = (long)s->NH * s->HD;
            a.lse = ra->acc_lse + qc * ring_lse_elems(ra);
            a.dout = ra->dout + qc * ring_q_elems(ra);
            a.dq = ra->part_o, a.dqkv_stride = (long)s->NH * s->HD;
            a.dk = ra->part_kv, a.dv = ra->part_kv + (size_t)s->NKV * s->HD, a.dkv_stride = 2L * s->NKV * s->HD;
            attention_backward(ATTN_FLASH2, &ctx, &a, stream);
            ring_add_bf16(ra->acc_o + qc * ring_q_elems(ra), ra->part_o, ring_q_elems(ra), 1, stream);
            ring_add_bf16(ra->dkv_step + kc * ring_kv_elems(ra), ra->part_kv, ring_kv_elems(ra), written[kc], stream);
            written[kc] = 1;
        }
    for (int kc = 0; kc < 2; kc++)
        if (!written[kc])
            CUDA_CHECK(cudaMemsetAsync(ra->dkv_step + kc * ring_kv_elems(ra), 0, ring_kv_elems(ra) * sizeof(float),
                                       stream));
}

// The step's terms into the dK/dV buffer that came with this step's K/V (none at step 0), passed on.
static void ring_pass_dkv(RingAttention* ra, int step, cudaStream_t stream) {
    const int cur = step % 2;
    const size_t n = 2 * ring_kv_elems(ra);
    if (step > 0) ring_wait(ra, ra->dkv_arrived, stream);
    ring_sum_f32(ra->dkv[cur], ra->dkv_step, n, step > 0, stream);
    ring_pass(ra, ra->dkv[cur], ra->dkv[1 - cur], n * sizeof(float), ra->dkv_arrived, stream);
}

// The rank's q, out, dout, lse and own K and V into the chunk-major buffers; dQ zeroed.
static void ring_load_backward(RingAttention* ra, const AttentionArgs* a, cudaStream_t stream) {
    const AttentionShape* s = &ra->block;
    const int qw = s->NH * s->HD;
    ring_load_qkv(ra, a, stream);
    ring_load_rows(ra->o, qw, a->out, a->out_stride, qw, s->B, s->T, stream);
    ring_load_rows(ra->dout, qw, a->dout, a->out_stride, qw, s->B, s->T, stream);
    ring_lse_rows(ra->acc_lse, a->lse, s->B, s->NH, s->T, 1, stream);
    CUDA_CHECK(cudaMemsetAsync(ra->acc_o, 0, 2 * ring_q_elems(ra) * sizeof(float), stream));
}

// Backward: a (local q, k, v, out, lse, dout) -> a->dq, a->dk, a->dv (see the top). On `stream`.
static void ring_attention_backward(RingAttention* ra, const AttentionArgs* a, cudaStream_t stream) {
    ring_check_args(ra, a);
    const AttentionShape* s = &ra->block;
    ring_load_backward(ra, a, stream);
    for (int step = 0; step < ra->world; step++) {
        const int cur = step % 2;
        if (step + 1 < ra->world)
            ring_pass(ra, ra->kv[cur], ra->kv[1 - cur], ring_kv_elems(ra) * 2 * sizeof(__nv_bfloat16),
                      ra->kv_arrived, stream);
        ring_backward_step(ra, step, ra->kv[cur], stream);
        if (ra->world > 1) ring_pass_dkv(ra, step, stream);
        if (step + 1 < ra->world) ring_wait(ra, ra->kv_arrived, stream);
    }
    // After N passes the buffer in dkv[N % 2] is this rank's (world 1: the step's terms are all).
    const float* dkv = ra->world > 1 ? ra->dkv[ra->world % 2] : ra->dkv_step;
    if (ra->world > 1) ring_wait(ra, ra->dkv_arrived, stream);
    const int qw = s->NH * s->HD, kw = s->NKV * s->HD;
    const long dkvs = attention_dkv_stride(a);
    ring_store(a->dq, a->dqkv_stride, ra->acc_o, qw, qw, s->B, s->T, stream);
    ring_store(a->dk, dkvs, dkv, 2L * kw, kw, s->B, s->T, stream);
    ring_store(a->dv, dkvs, dkv + kw, 2L * kw, kw, s->B, s->T, stream);
}

#endif  // RING_ATTENTION_CUH
