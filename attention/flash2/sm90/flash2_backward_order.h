// flash2_backward_order.h: the order in which the blocks of flash2's Hopper backward
// (flash2_backward_hopper.cuh) start, one block per (key block, (b, K/V head) pair). Host code only,
// no kernels (backward_block_at also runs in the kernel, which maps its block index through it), so
// that test/test_gpu_attention.cu checks the order on the CPU.
//
// The pairs go in chunks of `chunk` pairs, the last `tail` pairs as one chunk of their own; within a
// chunk, key block 0 of each pair, then key block 1, ... (chunk 1: each pair's key blocks side by
// side). Either way key block n−1 of a pair starts before key block n (the deterministic mode's
// waits rely on it). Why these chunks and tails: attention/PERF_NOTES.md (the backward launch order).
#ifndef FLASH2_BACKWARD_ORDER_H
#define FLASH2_BACKWARD_ORDER_H

#include <cuda_runtime.h>  // __host__ __device__

// Whether `count` pairs' Q and dO (G·T·HD·4 bytes each) take at most 3/4 of the l2_bytes of L2.
static inline bool backward_pairs_fit_l2(int count, int NH, int NKV, long T, int HD, long l2_bytes) {
    return (long)count * (NH / NKV) * T * HD * 4 <= l2_bytes / 4 * 3;
}

// Chunk 1 unless causal with grouped-query attention: there a pair's first key blocks are few and
// long (they see every query block of G heads), and larger chunks start them first instead of
// leaving some for the end. A chunk's pairs stream their Q and dO at once, so the chunk is the
// largest that divides the pairs (no short last chunk) and whose Q and dO fit in L2. Multi-head
// keeps chunk 1 (its blocks are short); only its last pairs form a chunk (backward_order_tail).
static inline int backward_order_chunk(bool causal, int NH, int NKV, int pairs, long T, int HD, long l2_bytes) {
    if (!causal || NKV == NH) return 1;
    int chunk = 1;
    for (int c = 2; c <= pairs && backward_pairs_fit_l2(c, NH, NKV, T, HD, l2_bytes); c++)
        if (pairs % c == 0) chunk = c;
    return chunk;
}

// The tail: causal with chunk 1, the last pairs' longest key blocks would start last, when the other
// SMs are about to finish; the last pairs, enough for two waves of blocks on sm_count SMs (their Q
// and dO within L2), form one chunk instead, so that their longest key blocks start first. None
// where one pair's key blocks fill half the GPU or more: there is no tail to shorten.
static inline int backward_order_tail(bool causal, int chunk, int NH, int NKV, int pairs, int key_blocks, long T,
                                      int HD, int sm_count, long l2_bytes) {
    if (!causal || chunk > 1 || 2 * key_blocks >= sm_count) return 0;
    int tail = (2 * sm_count + key_blocks - 1) / key_blocks;
    if (tail > pairs) tail = pairs;
    while (tail > 1 && !backward_pairs_fit_l2(tail, NH, NKV, T, HD, l2_bytes)) tail--;
    return tail;
}

// The index-th block to start in that order: its key block and its (b, K/V head) pair.
__host__ __device__ __forceinline__ void backward_block_at(int index, int chunk, int tail, int key_blocks, int pairs,
                                                           int& n_block, int& pair) {
    const int lead = pairs - tail, lead_blocks = lead * key_blocks;  // the pairs before the tail
    int first, size, r;
    if (index < lead_blocks) {
        const int chunk_blocks = chunk * key_blocks;
        first = index / chunk_blocks * chunk;
        r = index % chunk_blocks;
        size = lead - first < chunk ? lead - first : chunk;  // the last chunk may be smaller
    } else {
        first = lead;
        r = index - lead_blocks;
        size = tail;
    }
    n_block = r / size;
    pair = first + r % size;
}

#endif  // FLASH2_BACKWARD_ORDER_H
