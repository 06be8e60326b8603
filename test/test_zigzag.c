// test_zigzag.c: the zigzag split of context parallelism (layers/context_parallel/zigzag.h) on the CPU:
// the length check and its message, who holds which chunk, the position maps both ways, the block
// kinds against the causal mask position by position (and that no offset between query and key
// positions is needed), the balance of causal work over the ranks, the ring's order, and the
// scatter/gather helpers, and the trainer's share of a batch (--context-parallel: inputs, targets and the
// position embedding's positions scattered separately must stay aligned). The checks that could pass
// vacuously are shown to reject a planted fault: a classifier that calls a diagonal block full, one
// that ignores the mask, a contiguous split's unbalanced work, a chunk order swapped in the scatter.
#include <stdint.h>
#include <stdlib.h>

#include "layers/context_parallel/zigzag.h"
#include "test/test_harness.h"

#define MAX_WORLD 16

static const char* CASES[] = {"zigzag_check_accepts_multiples_of_2n",
                              "zigzag_check_rejects_other_lengths_with_a_message",
                              "zigzag_rank_i_holds_chunks_i_and_2n_minus_1_minus_i_each_once",
                              "zigzag_positions_map_both_ways_one_to_one",
                              "zigzag_local_order_is_the_global_order_on_every_rank",
                              "zigzag_block_kinds_match_the_causal_mask_without_offset",
                              "zigzag_planted_wrong_block_kinds_are_rejected",
                              "zigzag_causal_work_is_the_same_on_every_rank",
                              "zigzag_ring_brings_every_rank_its_kv_once_and_dkv_home",
                              "zigzag_scatter_gather_round_trip_and_planted_swap",
                              "zigzag_trainer_share_keeps_inputs_targets_and_positions_aligned"};
#define NUM_CASES ((int)(sizeof(CASES) / sizeof(CASES[0])))

static void test_check_accepts(void) {
    char why[512] = "";
    int ok = 1;
    for (int N = 1; N <= MAX_WORLD && ok; N++)
        for (long k = 1; k <= 7 && ok; k++)
            if (zigzag_check(2L * N * k, N, why, sizeof(why)) != 0) {
                ok = 0;
                test_fail(CASES[0], "N %d, T %ld rejected: %s", N, 2L * N * k, why);
            }
    if (ok) test_pass(CASES[0]);
}

// Lengths that are not positive multiples of 2N, and a world of 0: rejected with a message naming the
// multiple and the nearest good lengths.
static void test_check_rejects(void) {
    char why[512] = "", problems[1024] = "";
    struct { long T; int world; const char* want[3]; } bad[] = {
        {401, 2, {"multiple of 4", "401 is not", "use 400 or 404"}},
        {100, 8, {"multiple of 16", "100 is not", "use 96 or 112"}},
        {6, 4, {"multiple of 8", "6 is not", "use 8"}},
        {12, 4, {"multiple of 8", "12 is not", "use 8 or 16"}},  // a multiple of N but not of 2N: C would be 1.5
        {0, 1, {"multiple of 2", "0 is not", "use 2"}},
        {-4, 2, {"multiple of 4", "-4 is not", "use 4"}},
        {64, 0, {"1 or more ranks", "not 0", ""}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        const int r = zigzag_check(bad[i].T, bad[i].world, why, sizeof(why));
        int has = r == -1;
        for (int k = 0; k < 3; k++) has = has && strstr(why, bad[i].want[k]);
        if (!has && strlen(problems) < 600)
            snprintf(problems + strlen(problems), sizeof(problems) - strlen(problems), "T %ld, N %d: %d \"%s\"; ",
                     bad[i].T, bad[i].world, r, why);
    }
    test_report(CASES[1], problems[0] == '\0', "%s", problems);
}

static void test_chunks(void) {
    for (int N = 1; N <= MAX_WORLD; N++) {
        int held[2 * MAX_WORLD] = {0};
        for (int r = 0; r < N; r++)
            for (int lc = 0; lc < 2; lc++) {
                const int c = zigzag_chunk_of(r, lc, N);
                int owner = -1, owner_lc = -1;
                zigzag_owner(c, N, &owner, &owner_lc);
                if (c != (lc ? 2 * N - 1 - r : r) || owner != r || owner_lc != lc) {
                    test_fail(CASES[2], "N %d: rank %d local chunk %d is chunk %d, owned by rank %d as %d", N, r, lc,
                              c, owner, owner_lc);
                    return;
                }
                if (c >= 0 && c < 2 * N) held[c]++;
            }
        for (int c = 0; c < 2 * N; c++)
            if (held[c] != 1) {
                test_fail(CASES[2], "N %d: chunk %d is held %d times", N, c, held[c]);
                return;
            }
    }
    test_pass(CASES[2]);
}

// Every (T, N) below: local -> global -> local is the identity, and the global positions of all ranks
// cover [0, T) once each.
static void test_positions(void) {
    static unsigned char seen[2 * MAX_WORLD * 5];
    for (int N = 1; N <= MAX_WORLD; N++)
        for (long k = 1; k <= 5; k += 2) {
            const long T = 2L * N * k;
            memset(seen, 0, (size_t)T);
            for (int r = 0; r < N; r++)
                for (long p = 0; p < T / N; p++) {
                    const long g = zigzag_global_position(p, r, T, N);
                    int back_rank = -1;
                    const long back = g >= 0 && g < T ? zigzag_local_position(g, T, N, &back_rank) : -1;
                    if (back != p || back_rank != r || seen[g]++) {
                        test_fail(CASES[3], "N %d, T %ld: rank %d local %ld -> global %ld -> rank %d local %ld%s", N, T,
                                  r, p, g, back_rank, back, g >= 0 && g < T && seen[g] > 1 ? " (seen twice)" : "");
                        return;
                    }
                }
        }
    test_pass(CASES[3]);
}

// Within a rank, later local positions are later global positions (the early chunk comes first), so
// a rank's own block is plain causal attention over its 2C local tokens.
static void test_local_order(void) {
    for (int N = 1; N <= MAX_WORLD; N++) {
        const long T = 2L * N * 3;
        for (int r = 0; r < N; r++)
            for (long p = 1; p < T / N; p++)
                if (zigzag_global_position(p, r, T, N) <= zigzag_global_position(p - 1, r, T, N)) {
                    test_fail(CASES[4], "N %d, rank %d: local %ld is global %ld, local %ld global %ld", N, r, p - 1,
                              zigzag_global_position(p - 1, r, T, N), p, zigzag_global_position(p, r, T, N));
                    return;
                }
    }
    test_pass(CASES[4]);
}

typedef ZigzagBlock (*Classifier)(int q_chunk, int k_chunk, int causal);

// Problems (0: none) of a classifier against the mask, position by position, for chunks of C tokens:
// FULL blocks see every key, SKIP blocks none, DIAGONAL ones exactly the local causal mask
// (key <= query inside the chunk, no offset). Describes the first problem in why.
static int block_problems(Classifier classify, int N, long C, int causal, char* why, size_t len) {
    for (int qc = 0; qc < 2 * N; qc++)
        for (int kc = 0; kc < 2 * N; kc++) {
            const ZigzagBlock b = classify(qc, kc, causal);
            for (long i = 0; i < C; i++)
                for (long j = 0; j < C; j++) {
                    const long qi = qc * C + i, kj = kc * C + j;
                    const int visible = !causal || kj <= qi;
                    const int computed = b == ZIGZAG_FULL || (b == ZIGZAG_DIAGONAL && j <= i);
                    if (visible != computed) {
                        snprintf(why, len, "N %d, causal %d: chunks q %d k %d called %d, but query %ld %s key %ld",
                                 N, causal, qc, kc, (int)b, qi, visible ? "sees" : "does not see", kj);
                        return 1;
                    }
                }
        }
    return 0;
}

static void test_block_kinds(void) {
    char why[256];
    for (int N = 1; N <= 8; N++)
        for (int causal = 0; causal <= 1; causal++)
            if (block_problems(zigzag_block, N, 3, causal, why, sizeof(why))) {
                test_fail(CASES[5], "%s", why);
                return;
            }
    test_pass(CASES[5]);
}

static ZigzagBlock planted_diagonal_as_full(int q, int k, int causal) {
    return causal && k > q ? ZIGZAG_SKIP : ZIGZAG_FULL;
}
static ZigzagBlock planted_mask_ignored(int q, int k, int causal) { return zigzag_block(q, k, !causal); }
static ZigzagBlock planted_off_by_one(int q, int k, int causal) { return zigzag_block(q, k + 1, causal); }

static void test_planted_block_kinds(void) {
    char why[256];
    const Classifier planted[] = {planted_diagonal_as_full, planted_mask_ignored, planted_off_by_one};
    for (size_t p = 0; p < sizeof(planted) / sizeof(planted[0]); p++) {
        int caught = 0;
        for (int causal = 0; causal <= 1; causal++) caught |= block_problems(planted[p], 2, 3, causal, why, sizeof(why));
        if (!caught) {
            test_fail(CASES[6], "planted classifier %zu passed the mask check", p);
            return;
        }
    }
    test_pass(CASES[6]);
}

// The causal pairs a rank computes over the ring's N steps, with its chunks given by chunk_of.
static long rank_work(int r, int N, long C, int (*chunk_of)(int, int, int)) {
    long work = 0;
    for (int s = 0; s < N; s++) {
        const int src = zigzag_ring_source(r, s, N);
        for (int qc = 0; qc < 2; qc++)
            for (int kc = 0; kc < 2; kc++)
                work += zigzag_block_pairs(zigzag_block(chunk_of(r, qc, N), chunk_of(src, kc, N), 1), C);
    }
    return work;
}

static int contiguous_chunk_of(int rank, int local_chunk, int world) { (void)world; return 2 * rank + local_chunk; }

// Every rank computes exactly 1/N of the causal pairs T(T+1)/2; a contiguous split (rank i holding
// chunks 2i and 2i+1) does not, for N >= 2 (the check can fail).
static void test_balance(void) {
    const long C = 5;
    for (int N = 1; N <= MAX_WORLD; N++) {
        const long T = 2L * N * C, total = T * (T + 1) / 2;
        long sum = 0;
        for (int r = 0; r < N; r++) {
            const long w = rank_work(r, N, C, zigzag_chunk_of);
            sum += w;
            if (w != rank_work(0, N, C, zigzag_chunk_of)) {
                test_fail(CASES[7], "N %d: rank %d computes %ld pairs, rank 0 %ld", N, r, w,
                          rank_work(0, N, C, zigzag_chunk_of));
                return;
            }
        }
        const int unbalanced =
            N == 1 || rank_work(0, N, C, contiguous_chunk_of) != rank_work(N - 1, N, C, contiguous_chunk_of);
        if (sum != total || !unbalanced) {
            test_fail(CASES[7], "N %d: the ranks compute %ld pairs in all (want %ld); contiguous split balanced: %d", N,
                      sum, total, !unbalanced);
            return;
        }
    }
    test_pass(CASES[7]);
}

// Over N steps each rank holds every rank's K/V once; what rank r holds at step s+1 is what rank r-1
// held at step s (it came from there); a dK/dV buffer passed on after every step (N times) is back at
// its owner.
static void test_ring(void) {
    for (int N = 1; N <= MAX_WORLD; N++)
        for (int r = 0; r < N; r++) {
            int seen[MAX_WORLD] = {0};
            for (int s = 0; s < N; s++) {
                const int src = zigzag_ring_source(r, s, N);
                const int from_prev = s == 0 || src == zigzag_ring_source(zigzag_ring_prev(r, N), s - 1, N);
                if (src < 0 || src >= N || seen[src]++ || !from_prev || (s == 0 && src != r)) {
                    test_fail(CASES[8], "N %d: rank %d holds rank %d's K/V at step %d", N, r, src, s);
                    return;
                }
            }
            int at = r;  // the rank holding the dK/dV of step 0's K/V (rank r's own)
            for (int s = 0; s < N; s++) at = zigzag_ring_next(at, N);
            if (at != r) {
                test_fail(CASES[8], "N %d: rank %d's dK/dV ends at rank %d after %d passes", N, r, at, N);
                return;
            }
        }
    test_pass(CASES[8]);
}

// Each row of a full (outer, T, 3 bytes) tensor holds (o, t): every rank's local rows after the
// scatter are its positions' rows, the gathers of all ranks rebuild the tensor, and a rank whose two
// chunks were swapped is caught by the same row check.
static void test_scatter_gather(void) {
    const int N = 3;
    const long outer = 2, T = 2L * N * 4, Tl = T / N;
    unsigned char full[2 * 24 * 3], back[2 * 24 * 3], local[2 * 8 * 3];
    for (long o = 0; o < outer; o++)
        for (long t = 0; t < T; t++) {
            unsigned char* row = full + (o * T + t) * 3;
            row[0] = (unsigned char)o, row[1] = (unsigned char)t, row[2] = 0xA5;
        }
    memset(back, 0, sizeof(back));
    int bad = 0, caught = 1;
    for (int r = 0; r < N; r++) {
        zigzag_scatter(local, full, outer, T, 3, r, N);
        for (long o = 0; o < outer; o++)
            for (long p = 0; p < Tl; p++)
                bad += local[(o * Tl + p) * 3] != o || local[(o * Tl + p) * 3 + 1] != zigzag_global_position(p, r, T, N);
        zigzag_gather(back, local, outer, T, 3, r, N);
        unsigned char swapped[sizeof(local)];  // the planted fault: the rank's chunks in the other order
        for (long o = 0; o < outer; o++)
            for (int h = 0; h < 2; h++)
                memcpy(swapped + (o * Tl + h * Tl / 2) * 3, local + (o * Tl + (1 - h) * Tl / 2) * 3, (size_t)Tl / 2 * 3);
        int seen = 0;
        for (long p = 0; p < Tl; p++) seen += swapped[p * 3 + 1] != zigzag_global_position(p, r, T, N);
        caught = caught && seen > 0;
    }
    test_report(CASES[9], bad == 0 && memcmp(back, full, sizeof(full)) == 0 && caught,
                "%d rows misplaced, round trip %s, planted swap caught %d", bad,
                memcmp(back, full, sizeof(full)) ? "differs" : "equal", caught);
}

// The trainer's share of a batch (train_gpt.cu, layers/context_parallel/context_parallel.cuh): inputs
// (B, T) and targets (B, T) (the next token of each) are scattered each on its own and the model reads
// wpe[positions[p]] for local row p. Every rank's rows must pair input g with target g + 1 and with
// position g, for every global position g exactly once over the group. The planted fault: positions
// left as the local index p (the encoder's default), which only rank 0's first chunk survives.
static int share_bad_rows(const int* in, const int* tg, const int* pos, long B, long T, int N, int* seen) {
    int bad = 0;
    for (long b = 0; b < B; b++)
        for (long p = 0; p < T / N; p++) {
            const long g = pos[p], i = b * (T / N) + p;
            bad += g < 0 || g >= T || in[i] != b * 1000 + g || tg[i] != b * 1000 + g + 1;
            if (g >= 0 && g < T && b == 0) seen[g]++;
        }
    return bad;
}

static void test_trainer_share(void) {
    enum { B = 2, T = 48 };
    int inputs[B * T], targets[B * T], in[B * T], tg[B * T], pos[T], local_p[T], seen[T], seen_planted[T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) inputs[b * T + t] = b * 1000 + t, targets[b * T + t] = b * 1000 + t + 1;
    int bad = 0, once = 1, caught = 1;
    for (int N = 1; N <= 4; N++) {
        memset(seen, 0, sizeof(seen));
        memset(seen_planted, 0, sizeof(seen_planted));
        int planted_bad = 0;
        for (int r = 0; r < N; r++) {
            zigzag_scatter(in, inputs, B, T, sizeof(int), r, N);
            zigzag_scatter(tg, targets, B, T, sizeof(int), r, N);
            zigzag_positions(pos, T, r, N);
            for (int p = 0; p < T / N; p++) local_p[p] = p;
            bad += share_bad_rows(in, tg, pos, B, T, N, seen);
            planted_bad += share_bad_rows(in, tg, local_p, B, T, N, seen_planted);
        }
        for (int g = 0; g < T; g++) once = once && seen[g] == 1;
        if (N > 1) caught = caught && planted_bad > 0;
    }
    test_report(CASES[10], bad == 0 && once && caught,
                "%d rows misaligned, every position once %d, planted local positions caught %d", bad, once, caught);
}

int main(void) {
    test_begin();
    test_plan(NUM_CASES);
    test_check_accepts();
    test_check_rejects();
    test_chunks();
    test_positions();
    test_local_order();
    test_block_kinds();
    test_planted_block_kinds();
    test_balance();
    test_ring();
    test_scatter_gather();
    test_trainer_share();
    return test_end();
}
