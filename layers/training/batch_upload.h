// batch_upload.h: micro batches from the host data loader to the GPU without making the GPU wait.
// Each batch is copied into one of two pinned host slots and sent with cudaMemcpyAsync on the
// training stream, so the host reads and sends the next micro batch while the GPU still runs the
// current one (a plain cudaMemcpy from pageable memory would wait for the stream to drain). A slot is
// refilled only once its previous copy has finished (an event), so the host stays at most two
// batches ahead. The device buffers are written in stream order, after the kernels that read them.
#ifndef BATCH_UPLOAD_H
#define BATCH_UPLOAD_H

#include <stdint.h>
#include <string.h>

#include "layers/cuda_common.h"

typedef struct {
    int32_t* slots[2];        // pinned (2, tokens) each: the inputs, then the targets
    cudaEvent_t copied[2];    // recorded after each slot's last copy
    size_t tokens;            // per micro batch (B·T)
    int next;                 // the slot to fill next
} BatchUpload;

static void batch_upload_create(BatchUpload* u, size_t tokens) {
    memset(u, 0, sizeof(*u));
    u->tokens = tokens;
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMallocHost((void**)&u->slots[i], 2 * tokens * sizeof(int32_t)));
        CUDA_CHECK(cudaEventCreateWithFlags(&u->copied[i], cudaEventDisableTiming));
    }
}

static void batch_upload_destroy(BatchUpload* u) {
    for (int i = 0; i < 2; i++) {
        if (u->slots[i]) CUDA_CHECK(cudaFreeHost(u->slots[i]));
        if (u->copied[i]) CUDA_CHECK(cudaEventDestroy(u->copied[i]));
    }
    memset(u, 0, sizeof(*u));
}

// inputs_dev, targets_dev (tokens) int32 = inputs, targets, in `stream`'s order; returns at once
// unless the slot's copy of two batches ago is still pending.
static void batch_upload_send(BatchUpload* u, const int32_t* inputs, const int32_t* targets, int32_t* inputs_dev,
                              int32_t* targets_dev, cudaStream_t stream) {
    const size_t bytes = u->tokens * sizeof(int32_t);
    int32_t* slot = u->slots[u->next];
    CUDA_CHECK(cudaEventSynchronize(u->copied[u->next]));  // never recorded: returns at once
    memcpy(slot, inputs, bytes);
    memcpy(slot + u->tokens, targets, bytes);
    CUDA_CHECK(cudaMemcpyAsync(inputs_dev, slot, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(targets_dev, slot + u->tokens, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaEventRecord(u->copied[u->next], stream));
    u->next ^= 1;
}

#endif  // BATCH_UPLOAD_H
