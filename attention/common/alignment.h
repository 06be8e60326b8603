// alignment.h: the alignment the tile kernels of flash1 and flash2 need of every tensor they are
// handed, checked on the host before a launch. cp.async and TMA move rows in 16-byte pieces, so each
// pointer must be 16-byte aligned and each row stride a multiple of 8 bf16 values.
#ifndef ATTENTION_ALIGNMENT_H
#define ATTENTION_ALIGNMENT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/attention.h"

// Exits with a message naming `backend` and the tensor unless ptr and stride are as above.
static inline void attention_require_aligned(const char* backend, const void* ptr, long stride, const char* what) {
    if ((uintptr_t)ptr % 16 == 0 && stride % 8 == 0) return;
    fprintf(stderr,
            "error: %s needs %s 16-byte aligned with a row stride that is a multiple of 8 values (pointer %p, "
            "stride %ld); allocate tensors with cudaMalloc and use head dims that are multiples of 8\n",
            backend, what, ptr, stride);
    exit(EXIT_FAILURE);
}

// Every tensor a forward reads or writes (q, k, v, out, the workspace).
static inline void attention_require_forward_aligned(const char* backend, const AttentionArgs* a) {
    attention_require_aligned(backend, a->q, a->qkv_stride, "q");
    attention_require_aligned(backend, a->k, attention_kv_stride(a), "k");
    attention_require_aligned(backend, a->v, attention_kv_stride(a), "v");
    attention_require_aligned(backend, a->out, a->out_stride, "out");
    attention_require_aligned(backend, a->workspace, 8, "the workspace");
}

// Every tensor a backward reads or writes (q, k, v, out, dout, dq, dk, dv, the workspace).
static inline void attention_require_backward_aligned(const char* backend, const AttentionArgs* a) {
    attention_require_aligned(backend, a->q, a->qkv_stride, "q");
    attention_require_aligned(backend, a->k, attention_kv_stride(a), "k");
    attention_require_aligned(backend, a->v, attention_kv_stride(a), "v");
    attention_require_aligned(backend, a->out, a->out_stride, "out");
    attention_require_aligned(backend, a->dout, a->out_stride, "dout");
    attention_require_aligned(backend, a->dq, a->dqkv_stride, "dq");
    attention_require_aligned(backend, a->dk, attention_dkv_stride(a), "dk");
    attention_require_aligned(backend, a->dv, attention_dkv_stride(a), "dv");
    attention_require_aligned(backend, a->workspace, 8, "the workspace");
}

#endif  // ATTENTION_ALIGNMENT_H
