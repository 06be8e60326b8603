// context_parallel.cuh: the trainer's side of context parallelism (--context-parallel N): the group of
// N ranks that shares every sequence, its communicator, the ring attention hooked into the model, and
// each rank's zigzag share of every micro batch.
//
// Ranks. World W = D·N: rank r = d·N + c is place c of context group d (D data-parallel groups). Each
// group reads the sequences of data-parallel rank d of D (the loader opened as on D GPUs); each of its
// ranks keeps its zigzag share of every sequence (zigzag.h: chunks c and 2N−1−c of 2N), T/N tokens of
// the inputs and of the targets (B, T/N), and the global position of each local row (T/N), which the
// model's position embedding reads (GPTModel.positions). Everything but attention then runs on the
// local (B, T/N) rows; attention goes around the group's ring (ring_attention.cuh) through the
// model's attention hook (GPTModel.attention), with the layer's own q, k, v in the packed qkv.
//
// Communicators. The world's (multi_gpu.cuh) keeps the gradients: every rank holds the whole
// parameters and averages them over all W ranks. The group's is split from it (ncclCommSplit, color
// d, key c: its rank is c) and carries only the ring's K/V and dK/dV, on the ring's own stream.
//
// Loss scaling. A rank's loss is the mean over its B·T/N local tokens (the trainer's grad_scale is
// 1/(B·(T/N)·accumulation)). Its gradient holds the terms of its own tokens' losses through every
// parameter, including the terms that reach its K/V from the other ranks' queries (the ring's
// backward brings every rank's dK/dV terms home). Summed over the N ranks of a group that is the
// gradient of N × the group's mean loss over its B·T tokens; the world's average over D·N ranks then
// divides by D·N: the gradient of the mean over all D·B·T tokens, the N = 1 run's on the same global
// batch. The logged loss: every rank's local mean, averaged over W (equal token counts: the mean
// over all tokens).
//
// ZeRO-1 shards the optimizer state over all W ranks, as without context parallelism (the world's
// communicator). Not here yet: --precision fp8 and --eval-data with N > 1 (the trainer refuses them).
#ifndef CONTEXT_PARALLEL_CUH
#define CONTEXT_PARALLEL_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/context_parallel/zigzag.h"
#include "layers/model/gpt_model.cuh"
#include "layers/multi_gpu/multi_gpu.cuh"

#ifdef TRAIN_GPT_NO_NCCL
// One GPU only (see multi_gpu.cuh): the plan refuses N > 1 before any of these could run.
typedef struct {
    int size, rank;
    int *inputs, *targets;
} ContextParallel;

static void context_parallel_create(ContextParallel*, MultiGpu*, int, GPTModel*, int) { multi_gpu_unavailable(); }
static void context_parallel_share(ContextParallel*, const int*, const int*) { multi_gpu_unavailable(); }
static void context_parallel_destroy(ContextParallel*) {}
static double context_parallel_exposed_ms(ContextParallel*) { return 0.0; }
static size_t context_parallel_memory_bytes(const GPTConfig*, int, int, int) { return 0; }

#else  // NCCL

#include "layers/context_parallel/ring_attention.cuh"

typedef struct {
    int size, rank;         // N, and this rank's place c in its group
    int B, T;               // the micro batch: B sequences of T tokens (whole; T/N local)
    ncclComm_t comm;        // the group's (split from the world's)
    RingAttention ring;     // its buffers serve every layer, one after another on the model's stream
    int* positions;         // device (T/N): the global position of each local row
    int *inputs, *targets;  // host (B, T/N): this rank's share of the current micro batch
} ContextParallel;

// GPU memory the ring attention takes for a micro batch of B sequences of T tokens over N ranks (0: N = 1).
static size_t context_parallel_memory_bytes(const GPTConfig* config, int B, int T, int N) {
    if (N <= 1) return 0;
    const AttentionShape whole = gpt_attention_shape(config, B, T);
    return ring_attention_memory_bytes(&whole, N);
}

// The model's attention hook (GPTModel.attention): the layer's local q, k, v around the group's ring.
static void context_parallel_attention(void* user, const AttentionArgs* a, int backward, cudaStream_t stream) {
    ContextParallel* cp = (ContextParallel*)user;
    if (backward) ring_attention_backward(&cp->ring, a, stream);
    else ring_attention_forward(&cp->ring, a, stream);
}

// Joins the context group of this rank of mg (a collective of every world rank), sets up the ring
// for the model's micro batch of sequences of T tokens (the model runs T/N of them) and hooks both
// into the model: its attention and its positions. Exits with a message when the shape cannot be split.
static void context_parallel_create(ContextParallel* cp, MultiGpu* mg, int size, GPTModel* m, int T) {
    memset(cp, 0, sizeof(*cp));
    cp->size = size, cp->rank = mg->rank % size, cp->B = m->B, cp->T = T;
    if (m->T * size != T) {
        fprintf(stderr, "error: context parallelism over %d ranks: the model runs %d rows per sequence, not %d / %d "
                        "(a bug)\n", size, m->T, T, size);
        exit(EXIT_FAILURE);
    }
    multi_gpu_split(mg, mg->rank / size, cp->rank, &cp->comm,
                    "the context-parallel group's communicator (ncclCommSplit)");
    const AttentionShape whole = gpt_attention_shape(&m->config, m->B, T);
    ring_attention_create(&cp->ring, &whole, size, cp->rank, cp->comm);
    cp->ring.deterministic = m->deterministic_attention;
    int* host = (int*)malloc(sizeof(int) * (size_t)m->T);
    cp->inputs = (int*)malloc(sizeof(int) * (size_t)m->B * m->T);
    cp->targets = (int*)malloc(sizeof(int) * (size_t)m->B * m->T);
    if (!host || !cp->inputs || !cp->targets) {
        fprintf(stderr, "error: out of host memory for the context-parallel token share\n");
        exit(EXIT_FAILURE);
    }
    zigzag_positions(host, T, cp->rank, size);
    CUDA_CHECK(cudaMalloc(&cp->positions, sizeof(int) * (size_t)m->T));
    CUDA_CHECK(cudaMemcpy(cp->positions, host, sizeof(int) * (size_t)m->T, cudaMemcpyHostToDevice));
    free(host);
    m->attention = context_parallel_attention, m->attention_user = cp;
    m->positions = cp->positions;
    m->att_sums_dq = 0;  // the ring does not add dq's column sums: qkv_bias_backward makes the q bias gradient
    printf("context      rank %d of its group of %d: chunks %d and %d of %d (%d tokens each); ring attention buffers "
           "%.1f MiB per GPU\n", cp->rank, size, cp->rank, 2 * size - 1 - cp->rank, 2 * size, T / (2 * size),
           context_parallel_memory_bytes(&m->config, m->B, T, size) / (1024.0 * 1024.0));
}

// This rank's share of a micro batch: inputs, targets (B, T) host -> cp->inputs, cp->targets (B, T/N).
static void context_parallel_share(ContextParallel* cp, const int* inputs, const int* targets) {
    zigzag_scatter(cp->inputs, inputs, cp->B, cp->T, sizeof(int), cp->rank, cp->size);
    zigzag_scatter(cp->targets, targets, cp->B, cp->T, sizeof(int), cp->rank, cp->size);
}

// Milliseconds the model's stream stood waiting for the ring's transfers since the last call (read
// after the step's host wait).
static double context_parallel_exposed_ms(ContextParallel* cp) {
    return cp->size > 1 ? ring_attention_exposed_ms(&cp->ring) : 0.0;
}

// Frees the ring and leaves the group (before multi_gpu_destroy; the same on every rank).
static void context_parallel_destroy(ContextParallel* cp) {
    if (!cp->comm) return;
    ring_attention_destroy(&cp->ring);
    ncclResult_t state = ncclCommFinalize(cp->comm);
    while (state == ncclInProgress) RING_NCCL_CHECK(ncclCommGetAsyncError(cp->comm, &state));
    RING_NCCL_CHECK(state);
    RING_NCCL_CHECK(ncclCommDestroy(cp->comm));
    CUDA_CHECK(cudaFree(cp->positions));
    free(cp->inputs), free(cp->targets);
    memset(cp, 0, sizeof(*cp));
}

#endif  // NCCL
#endif  // CONTEXT_PARALLEL_CUH
