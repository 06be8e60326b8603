// zigzag.h: the zigzag split of context parallelism, in plain C (no CUDA, no NCCL), so that CI tests
// it on the CPU (test/test_zigzag.c) and the host side of the ring attention uses the same functions.
//
// N ranks share a sequence of T tokens. It is cut into 2N chunks of C = T / (2N) tokens; rank i
// holds chunks i and 2N-1-i, in that order: its local positions [0, C) are global positions
// [i·C, (i+1)·C) and its local positions [C, 2C) are global [(2N-1-i)·C, (2N-i)·C). Under the causal
// mask every rank then does the same work: one early chunk (few keys before it) and one late chunk
// (many), i + (2N-1-i) = 2N-1 chunks of keys before its two chunks on every rank.
//
// Blocks. Attention of a query chunk against a key chunk is, under the causal mask, one of:
//   ZIGZAG_FULL      every key precedes every query (key chunk < query chunk): no mask;
//   ZIGZAG_DIAGONAL  the same chunk: the usual causal mask inside it;
//   ZIGZAG_SKIP      every key follows every query (key chunk > query chunk): nothing to compute.
// Without the causal mask every block is ZIGZAG_FULL. Chunks have one size and start at multiples of
// it, so a block is never partly masked in any other way, and a diagonal block's mask compares local
// positions inside the chunk exactly as the global ones (both offset by the chunk's start): no
// offset between query and key positions is ever needed.
//
// The ring: at step s (0 <= s < N) rank i holds the K/V of rank (i - s) mod N; it received them from
// rank i-1 and passes them on to rank i+1.
//
// Layout helpers for the tests and for data (token ids, targets): a full tensor (outer, T, row) is
// scattered into a rank's local (outer, T/N, row), rows of row_bytes contiguous bytes, and gathered
// back. For activations (B, T, NH, HD): outer = B, row = NH·HD elements; for an LSE (B, NH, T):
// outer = B·NH, row = one float.
#ifndef ZIGZAG_H
#define ZIGZAG_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef enum { ZIGZAG_SKIP = 0, ZIGZAG_DIAGONAL = 1, ZIGZAG_FULL = 2 } ZigzagBlock;

// 0 when N ranks can split sequences of T tokens (world >= 1, T a positive multiple of 2N); else -1
// and a message in `why` that says what to change.
static inline int zigzag_check(long T, int world, char* why, size_t why_size) {
    if (world < 1) {
        snprintf(why, why_size, "context parallelism needs 1 or more ranks, not %d", world);
        return -1;
    }
    const long chunks = 2L * world;
    if (T >= chunks && T % chunks == 0) return 0;
    const long below = T / chunks * chunks, above = below > 0 ? below + chunks : chunks;
    if (below > 0)
        snprintf(why, why_size, "context parallelism over %d ranks cuts every sequence into %ld chunks (rank i holds "
                 "chunks i and %ld-i), so the sequence length must be a multiple of %ld; %ld is not: use %ld or %ld",
                 world, chunks, chunks - 1, chunks, T, below, above);
    else
        snprintf(why, why_size, "context parallelism over %d ranks cuts every sequence into %ld chunks (rank i holds "
                 "chunks i and %ld-i), so the sequence length must be a multiple of %ld; %ld is not: use %ld",
                 world, chunks, chunks - 1, chunks, T, above);
    return -1;
}

// The global chunk (0 .. 2N-1) that rank `rank` holds as its local chunk 0 (early) or 1 (late).
static inline int zigzag_chunk_of(int rank, int local_chunk, int world) {
    return local_chunk == 0 ? rank : 2 * world - 1 - rank;
}

// Who holds global chunk `chunk`, and as which of its two local chunks.
static inline void zigzag_owner(int chunk, int world, int* rank, int* local_chunk) {
    *local_chunk = chunk >= world;
    *rank = chunk < world ? chunk : 2 * world - 1 - chunk;
}

// The global position of rank `rank`'s local position p (0 <= p < T/N).
static inline long zigzag_global_position(long p, int rank, long T, int world) {
    const long C = T / (2L * world);
    const int local_chunk = p >= C;
    return (long)zigzag_chunk_of(rank, local_chunk, world) * C + (p - local_chunk * C);
}

// The local position of global position g (0 <= g < T), and its rank.
static inline long zigzag_local_position(long g, long T, int world, int* rank) {
    const long C = T / (2L * world);
    int local_chunk = 0;
    zigzag_owner((int)(g / C), world, rank, &local_chunk);
    return local_chunk * C + g % C;
}

// positions (T/N) = the global position of each of rank `rank`'s local positions: what the model's
// position embedding reads for its local rows (GPTModel.positions). T must pass zigzag_check.
static inline void zigzag_positions(int* positions, long T, int rank, int world) {
    for (long p = 0; p < T / world; p++) positions[p] = (int)zigzag_global_position(p, rank, T, world);
}

// The block of query chunk q_chunk against key chunk k_chunk (global chunk indices); see the top.
static inline ZigzagBlock zigzag_block(int q_chunk, int k_chunk, int causal) {
    if (!causal || k_chunk < q_chunk) return ZIGZAG_FULL;
    return k_chunk == q_chunk ? ZIGZAG_DIAGONAL : ZIGZAG_SKIP;
}

// The query-key pairs a block of chunks of C tokens computes (its share of the work).
static inline long zigzag_block_pairs(ZigzagBlock block, long C) {
    return block == ZIGZAG_FULL ? C * C : block == ZIGZAG_DIAGONAL ? C * (C + 1) / 2 : 0;
}

// Whose K/V rank `rank` holds at ring step `step` (0: its own).
static inline int zigzag_ring_source(int rank, int step, int world) { return ((rank - step) % world + world) % world; }
static inline int zigzag_ring_next(int rank, int world) { return (rank + 1) % world; }
static inline int zigzag_ring_prev(int rank, int world) { return (rank + world - 1) % world; }

// Copies between full (outer, T, row) and rank's local (outer, T/N, row), chunk by chunk: to the
// local rows (to_local = 1) or back to their places in full (0). T must pass zigzag_check.
static inline void zigzag_copy(void* local, void* full, long outer, long T, size_t row_bytes, int rank, int world,
                               int to_local) {
    const long C = T / (2L * world);
    const size_t chunk_bytes = (size_t)C * row_bytes;
    for (long o = 0; o < outer; o++)
        for (int lc = 0; lc < 2; lc++) {
            char* l = (char*)local + ((size_t)o * 2 + lc) * chunk_bytes;
            char* f = (char*)full + (size_t)o * T * row_bytes + (size_t)zigzag_chunk_of(rank, lc, world) * chunk_bytes;
            memcpy(to_local ? l : f, to_local ? f : l, chunk_bytes);
        }
}

// full -> rank's local rows.
static inline void zigzag_scatter(void* local, const void* full, long outer, long T, size_t row_bytes, int rank,
                                  int world) {
    zigzag_copy(local, (void*)full, outer, T, row_bytes, rank, world, 1);
}

// rank's local rows -> their places in full; the other rows of full stay as they are.
static inline void zigzag_gather(void* full, const void* local, long outer, long T, size_t row_bytes, int rank,
                                 int world) {
    zigzag_copy((void*)local, full, outer, T, row_bytes, rank, world, 0);
}

#endif  // ZIGZAG_H
