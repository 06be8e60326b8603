// test_dataloader.c: tests of data/dataloader.h on shard files it writes itself.
//
// Good shards hold known random tokens, and every expected batch is computed here straight
// from those arrays (row b of rank r in chunk c is tok[c*B*T*world + r*B*T + b*T ...]), so the
// loader is compared with the format's definition, not with itself. Bad shards (truncated,
// trailing bytes, wrong magic or version, zero tokens, shorter than the header, a token out of
// range, also the last one, which only the final target uses) must each give -1 and an error
// naming the file and the problem.
// Build (as the Makefile does):
//   gcc -std=c11 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined -I.
//       -o build/test_dataloader test/test_dataloader.c -lm
#define _POSIX_C_SOURCE 200809L  // mkdtemp, opendir, unlink, rmdir under -std=c11

#include <dirent.h>
#include <unistd.h>

#include "data/dataloader.h"
#include "test/test_harness.h"

#define VOCAB 50257
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define WHY_LEN 2400  // room for two loader errors: keeps -Wformat-truncation quiet

static char g_dir[256];  // the temp folder every file of this run goes in

typedef struct {
    char path[512];
    uint16_t* tok;
    int64_t n;
} Shard;

// Writes a shard with any header and any number of tokens (for bad files, they may disagree)
// plus `extra` zero bytes after them.
static int write_shard_raw(const char* path, int32_t magic, int32_t version, int32_t count,
                           const uint16_t* tok, int64_t ntok, int extra) {
    FILE* f = fopen(path, "wb");
    if (!f) return -1;
    int32_t header[SHARD_HEADER_INTS] = {0};
    header[0] = magic; header[1] = version; header[2] = count;
    int ok = fwrite(header, sizeof(header), 1, f) == 1;
    if (ntok > 0) ok = ok && fwrite(tok, sizeof(uint16_t), (size_t)ntok, f) == (size_t)ntok;
    for (int i = 0; i < extra; i++) ok = ok && fputc(0, f) != EOF;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void make_path(char* out, size_t cap, const char* name) { snprintf(out, cap, "%s/%s", g_dir, name); }

// A good shard of n random tokens < VOCAB, seeded so that every shard differs.
static Shard make_shard(const char* name, int64_t n, uint64_t seed) {
    Shard s;
    make_path(s.path, sizeof(s.path), name);
    s.n = n;
    s.tok = (uint16_t*)malloc((size_t)n * sizeof(uint16_t));
    TestRng rng = {seed};
    for (int64_t i = 0; i < n; i++) s.tok[i] = (uint16_t)(test_rng_next(&rng) % VOCAB);
    if (write_shard_raw(s.path, SHARD_MAGIC, SHARD_VERSION, (int32_t)n, s.tok, n, 0) != 0) {
        fprintf(stderr, "cannot write %s\n", s.path);
        exit(2);
    }
    return s;
}

static void free_shard(Shard* s) { free(s->tok); s->tok = NULL; unlink(s->path); }

// 1 when the loader's current batch is the B*T inputs from tok[off] and targets from tok[off+1].
static int batch_is(const DataLoader* dl, const uint16_t* tok, int64_t off) {
    for (int64_t i = 0; i < (int64_t)dl->B * dl->T; i++)
        if (dl->inputs[i] != tok[off + i] || dl->targets[i] != tok[off + i + 1]) return 0;
    return 1;
}

static int64_t chunks_of(int64_t n, int B, int T, int world) { return (n - 1) / ((int64_t)B * T * world); }

// Which (shard, chunk) of `shards` the current batch is (a unique match: the tokens are random);
// returns shard * 1000000 + chunk, or -1 when it matches none.
static int64_t identify(const DataLoader* dl, const Shard* shards, int ns) {
    int64_t ct = (int64_t)dl->B * dl->T * dl->world;
    for (int s = 0; s < ns; s++)
        for (int64_t c = 0; c < chunks_of(shards[s].n, dl->B, dl->T, dl->world); c++)
            if (batch_is(dl, shards[s].tok, c * ct + (int64_t)dl->rank * dl->B * dl->T)) return s * 1000000 + c;
    return -1;
}

static void remove_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

// ---------------------------------------------------------------------------------------------

static void test_single_shard_batches_and_epoch_wrap(void) {
    const char* name = "single_shard_batches_and_epoch_wrap";
    Shard s = make_shard("single.bin", 1000, 1);
    DataLoader dl;
    if (dataloader_open(&dl, s.path, 2, 8, 0, 1, VOCAB, 0, 0) != 0) {
        test_fail(name, "open: %s", dl.error); free_shard(&s); return;
    }
    int64_t expect_chunks = 999 / 16;  // 62: the last chunk needs one token for its last target
    int ok = dataloader_batches_per_epoch(&dl) == expect_chunks && dl.total_tokens == 1000 &&
             dl.num_shards == 1 && dl.num_used_shards == 1;
    int64_t bad_at = -1;
    for (int64_t k = 0; ok && k < 2 * expect_chunks + 3; k++) {  // two epochs and a bit
        if (dataloader_next_batch(&dl) != 0 || !batch_is(&dl, s.tok, (k % expect_chunks) * 16)) { bad_at = k; ok = 0; }
        // the epoch counter turns exactly after batches_per_epoch batches
        int64_t want_epoch = (k + 1) / expect_chunks;
        if (ok && dataloader_get_state(&dl).epoch != want_epoch) { bad_at = k; ok = 0; }
    }
    test_report(name, ok, "batches_per_epoch %lld (want %lld), first wrong batch %lld: %s",
                (long long)dataloader_batches_per_epoch(&dl), (long long)expect_chunks, (long long)bad_at, dl.error);
    dataloader_close(&dl);
    dataloader_close(&dl);  // closing twice is harmless
    free_shard(&s);
}

static void test_reset_restarts_epoch_zero(void) {
    const char* name = "reset_restarts_epoch_zero";
    Shard s = make_shard("reset.bin", 300, 2);
    DataLoader dl;
    int ok = dataloader_open(&dl, s.path, 1, 16, 0, 1, VOCAB, 1, 7) == 0;
    int32_t first[16];
    ok = ok && dataloader_next_batch(&dl) == 0;
    if (ok) memcpy(first, dl.inputs, sizeof(first));
    for (int k = 0; ok && k < 25; k++) ok = dataloader_next_batch(&dl) == 0;  // into epoch 1
    ok = ok && dataloader_get_state(&dl).epoch == 1;
    dataloader_reset(&dl);
    DataLoaderState st = dataloader_get_state(&dl);
    ok = ok && st.epoch == 0 && st.shard_index == 0 && st.chunk_index == 0;
    ok = ok && dataloader_next_batch(&dl) == 0 && memcmp(first, dl.inputs, sizeof(first)) == 0;
    test_report(name, ok, "after reset the first batch differs from the first batch of epoch 0 (%s)", dl.error);
    dataloader_close(&dl);
    free_shard(&s);
}

// Glob order, skipping of a shard too small for one chunk, and exact shard boundaries.
static void test_glob_order_and_skipping(void) {
    const char* name = "glob_order_and_skipping";
    const int B = 2, T = 8;
    // Written out of name order; the loader must serve them in name order.
    Shard s2 = make_shard("multi_000002.bin", 5 * 16 + 1, 12);  // exactly 5 chunks: uses its last token
    Shard s0 = make_shard("multi_000000.bin", 100, 10);          // 6 chunks, 3 tokens left over
    Shard s1 = make_shard("multi_000001.bin", 16, 11);           // 16 < B*T+1: skipped
    Shard other = make_shard("other_000000.bin", 100, 13);       // not matched by the glob
    char pattern[512];
    make_path(pattern, sizeof(pattern), "multi_*.bin");
    DataLoader dl;
    int ok = dataloader_open(&dl, pattern, B, T, 0, 1, VOCAB, 0, 0) == 0;
    if (!ok) { test_fail(name, "open: %s", dl.error); goto done; }
    ok = dl.num_shards == 3 && dl.num_used_shards == 2 && dl.total_tokens == 100 + 16 + 81 &&
         strcmp(dl.shard_paths[0], s0.path) == 0 && strcmp(dl.shard_paths[2], s2.path) == 0 &&
         dataloader_batches_per_epoch(&dl) == 11;
    if (!ok) { test_fail(name, "num_shards %d, used %d, total %lld, batches_per_epoch %lld", dl.num_shards,
                         dl.num_used_shards, (long long)dl.total_tokens, (long long)dataloader_batches_per_epoch(&dl)); goto done; }
    for (int epoch = 0; ok && epoch < 2; epoch++) {
        for (int c = 0; ok && c < 6; c++) ok = dataloader_next_batch(&dl) == 0 && batch_is(&dl, s0.tok, c * 16);
        for (int c = 0; ok && c < 5; c++) ok = dataloader_next_batch(&dl) == 0 && batch_is(&dl, s2.tok, c * 16);
    }
    test_report(name, ok, "batches are not shard 0's chunks then shard 2's, twice (%s)", dl.error);
done:
    dataloader_close(&dl);
    free_shard(&s0); free_shard(&s1); free_shard(&s2); free_shard(&other);
}

// '?' and '[...]' are glob patterns too, not literal names: brk_[0-9].bin is brk_0 and brk_1 (in
// name order), brk_?.bin also brk_x.
static void test_glob_brackets_and_question_mark(void) {
    const char* name = "glob_brackets_and_question_mark";
    Shard sh[3] = {make_shard("brk_0.bin", 17, 14), make_shard("brk_1.bin", 17, 15), make_shard("brk_x.bin", 17, 16)};
    const char* patterns[2] = {"brk_[0-9].bin", "brk_?.bin"};
    const int want_shards[2] = {2, 3};
    char why[WHY_LEN] = "";
    int ok = 1;
    for (int k = 0; ok && k < 2; k++) {
        char pattern[512];
        make_path(pattern, sizeof(pattern), patterns[k]);
        DataLoader dl;
        if (dataloader_open(&dl, pattern, 2, 8, 0, 1, VOCAB, 0, 0) != 0) {
            snprintf(why, sizeof(why), "%s: open: %s", patterns[k], dl.error); ok = 0;
        } else if (dl.num_shards != want_shards[k] || strcmp(dl.shard_paths[0], sh[0].path) != 0 ||
                   strcmp(dl.shard_paths[1], sh[1].path) != 0) {
            snprintf(why, sizeof(why), "%s: %d shards (want %d), first %s", patterns[k], dl.num_shards,
                     want_shards[k], dl.shard_paths[0]); ok = 0;
        } else {
            // one chunk per shard: the batches are brk_0's, then brk_1's
            ok = dataloader_next_batch(&dl) == 0 && batch_is(&dl, sh[0].tok, 0) &&
                 dataloader_next_batch(&dl) == 0 && batch_is(&dl, sh[1].tok, 0);
            if (!ok) snprintf(why, sizeof(why), "%s: batches not brk_0's then brk_1's (%s)", patterns[k], dl.error);
        }
        dataloader_close(&dl);
    }
    test_report(name, ok, "%s", why);
    for (int s = 0; s < 3; s++) free_shard(&sh[s]);
}

// World 2: per chunk, rank 0 and rank 1 together read exactly the chunk's tokens, rank 0 first.
static void test_rank_split(void) {
    const char* name = "rank_split";
    const int B = 2, T = 4, W = 2;  // chunk = 16 tokens, 8 per rank
    Shard s = make_shard("ranks.bin", 16 * 7 + 5, 20);
    DataLoader r0, r1;
    int ok0 = dataloader_open(&r0, s.path, B, T, 0, W, VOCAB, 0, 0) == 0;
    int ok1 = dataloader_open(&r1, s.path, B, T, 1, W, VOCAB, 0, 0) == 0;
    int ok = ok0 && ok1 && dataloader_batches_per_epoch(&r0) == 7 && dataloader_batches_per_epoch(&r1) == 7;
    int64_t bad = -1;
    for (int64_t c = 0; ok && c < 7; c++) {
        ok = dataloader_next_batch(&r0) == 0 && dataloader_next_batch(&r1) == 0;
        // concatenated, the two ranks' inputs are the 16 chunk tokens; targets shifted by one
        for (int i = 0; ok && i < 16; i++) {
            int32_t in = i < 8 ? r0.inputs[i] : r1.inputs[i - 8];
            int32_t tg = i < 8 ? r0.targets[i] : r1.targets[i - 8];
            if (in != s.tok[c * 16 + i] || tg != s.tok[c * 16 + i + 1]) { ok = 0; bad = c; }
        }
    }
    test_report(name, ok, "ranks do not tile chunk %lld exactly (open: %s / %s)", (long long)bad,
                ok0 ? "ok" : r0.error, ok1 ? "ok" : r1.error);
    dataloader_close(&r0); dataloader_close(&r1);
    free_shard(&s);
}

// Shuffled epochs: each a permutation of all (shard, chunk) pairs, chunks of one shard together,
// different from file order, different per epoch and per seed, identical for the same seed.
static void test_shuffle(void) {
    const char* name = "shuffle";
    const int B = 1, T = 8, E = 3;  // 3 epochs
    Shard sh[4] = {make_shard("shuf_000000.bin", 8 * 9 + 1, 30), make_shard("shuf_000001.bin", 8 * 4 + 3, 31),
                   make_shard("shuf_000002.bin", 8 * 12 + 1, 32), make_shard("shuf_000003.bin", 8 * 6 + 7, 33)};
    enum { N = 9 + 4 + 12 + 6 };
    char pattern[512];
    make_path(pattern, sizeof(pattern), "shuf_*.bin");
    int64_t seq[3][E * N];  // identified batches for seed 42, seed 42 again, seed 43
    uint64_t seeds[3] = {42, 42, 43};
    char why[WHY_LEN] = "";
    int ok = 1;
    for (int run = 0; ok && run < 3; run++) {
        DataLoader dl;
        if (dataloader_open(&dl, pattern, B, T, 0, 1, VOCAB, 1, seeds[run]) != 0 || dataloader_batches_per_epoch(&dl) != N) {
            snprintf(why, sizeof(why), "open or batches_per_epoch: %s", dl.error);
            ok = 0;
        }
        for (int k = 0; ok && k < E * N; k++) {
            if (dataloader_next_batch(&dl) != 0) { snprintf(why, sizeof(why), "next_batch: %s", dl.error); ok = 0; break; }
            seq[run][k] = identify(&dl, sh, 4);
            if (seq[run][k] < 0) { snprintf(why, sizeof(why), "batch %d is no chunk of the data", k); ok = 0; }
        }
        dataloader_close(&dl);
    }
    // Over 3 epochs, a shard order other than 0,1,2,3 and chunks out of order within a shard are
    // all but certain (a sorted run of 12 chunks has odds 1/12!); their absence means no shuffle.
    int shard_order_moved = 0, chunk_order_moved = 0;
    for (int e = 0; ok && e < E; e++) {
        int seen[4][12] = {{0}};
        int64_t* ep = seq[0] + e * N;
        int shards_changed = 0, order[4] = {-1, -1, -1, -1};
        for (int k = 0; k < N; k++) {
            int s = (int)(ep[k] / 1000000), c = (int)(ep[k] % 1000000);
            seen[s][c]++;
            if (k > 0 && s != ep[k - 1] / 1000000) shards_changed++;
            else if (k > 0 && ep[k] < ep[k - 1]) chunk_order_moved = 1;
            if (shards_changed < 4) order[shards_changed] = s;
        }
        for (int i = 0; i < 4; i++) if (order[i] != i) shard_order_moved = 1;
        for (int s = 0; s < 4; s++)
            for (int c = 0; c < (int)chunks_of(sh[s].n, B, T, 1); c++)
                if (seen[s][c] != 1) { snprintf(why, sizeof(why), "epoch %d serves shard %d chunk %d %d times", e, s, c, seen[s][c]); ok = 0; }
        if (ok && shards_changed != 3) { snprintf(why, sizeof(why), "epoch %d interleaves shards (%d changes)", e, shards_changed); ok = 0; }
    }
    if (ok && !shard_order_moved) { snprintf(why, sizeof(why), "shard order is never shuffled"); ok = 0; }
    if (ok && !chunk_order_moved) { snprintf(why, sizeof(why), "chunks within a shard are never shuffled"); ok = 0; }
    if (ok && memcmp(seq[0], seq[0] + N, sizeof(int64_t) * N) == 0) { snprintf(why, sizeof(why), "epochs 0 and 1 in the same order"); ok = 0; }
    if (ok && memcmp(seq[0], seq[1], sizeof(seq[0])) != 0) { snprintf(why, sizeof(why), "the same seed gave another order"); ok = 0; }
    if (ok && memcmp(seq[0], seq[2], sizeof(seq[0])) == 0) { snprintf(why, sizeof(why), "seeds 42 and 43 gave the same order"); ok = 0; }
    // Each shard's chunk order is drawn anew every epoch (not only the shard order).
    int64_t first_of_shard2[E];
    for (int e = 0; e < E; e++)
        for (int k = 0; k < N; k++)
            if (seq[0][e * N + k] / 1000000 == 2) { first_of_shard2[e] = seq[0][e * N + k]; break; }
    if (ok && first_of_shard2[0] == first_of_shard2[1] && first_of_shard2[1] == first_of_shard2[2]) {
        snprintf(why, sizeof(why), "shard 2 starts with the same chunk in every epoch: chunk order not redrawn"); ok = 0;
    }
    // The order is a pure function of (seed, epoch, shard): pinned here, so that a change to the
    // PRNG, which would break resuming older checkpoints exactly, does not go unnoticed.
    const int64_t golden[8] = {1000003, 1000002, 1000000, 1000001, 2000000, 2000002, 2000007, 2000010};
    if (ok && memcmp(seq[0], golden, sizeof(golden)) != 0) {
        snprintf(why, sizeof(why), "seed 42 order changed: starts %lld %lld %lld %lld", (long long)seq[0][0],
                 (long long)seq[0][1], (long long)seq[0][2], (long long)seq[0][3]); ok = 0;
    }
    test_report(name, ok, "%s", why);
    for (int s = 0; s < 4; s++) free_shard(&sh[s]);
}

// The shard order itself is drawn anew every epoch (test_shuffle's epochs differ already through
// their chunk orders). 8 shards of one chunk each, so a batch names its shard; a correct loader
// gives 3 equal epoch orders with probability (1/8!)^2 = 6e-10, a loader that ignores the epoch
// always does.
static void test_shuffle_shard_order_per_epoch(void) {
    const char* name = "shuffle_shard_order_per_epoch";
    enum { S = 8, E = 3 };
    Shard sh[S];
    for (int s = 0; s < S; s++) {
        char file[64];
        snprintf(file, sizeof(file), "order_%06d.bin", s);
        sh[s] = make_shard(file, 9 + s, 70 + (uint64_t)s);  // 9..16 tokens: one chunk at B*T = 8
    }
    char pattern[512], why[WHY_LEN] = "";
    make_path(pattern, sizeof(pattern), "order_*.bin");
    int order[E][S];
    DataLoader dl;
    int ok = dataloader_open(&dl, pattern, 1, 8, 0, 1, VOCAB, 1, 2024) == 0 && dataloader_batches_per_epoch(&dl) == S;
    if (!ok) snprintf(why, sizeof(why), "open or batches_per_epoch: %s", dl.error);
    for (int e = 0; ok && e < E; e++) {
        int seen[S] = {0};
        for (int k = 0; ok && k < S; k++) {
            int64_t id = dataloader_next_batch(&dl) == 0 ? identify(&dl, sh, S) : -1;
            if (id < 0 || seen[id / 1000000]++) {
                snprintf(why, sizeof(why), "epoch %d batch %d: not a shard unseen this epoch (%s)", e, k, dl.error);
                ok = 0;
            } else {
                order[e][k] = (int)(id / 1000000);
            }
        }
    }
    if (ok && memcmp(order[0], order[1], sizeof(order[0])) == 0 && memcmp(order[1], order[2], sizeof(order[0])) == 0) {
        snprintf(why, sizeof(why), "the same shard order in all %d epochs: starts %d %d %d", E, order[0][0], order[0][1],
                 order[0][2]);
        ok = 0;
    }
    test_report(name, ok, "%s", why);
    dataloader_close(&dl);
    for (int s = 0; s < S; s++) free_shard(&sh[s]);
}

// A new loader given a saved state serves exactly what the old one would have served next,
// from many starting points (mid-shard, shard and epoch boundaries), with and without shuffle.
static void test_state_restore(void) {
    const char* name = "state_restore";
    const int B = 2, T = 4, W = 2;  // 16 tokens per chunk
    Shard sh[3] = {make_shard("state_000000.bin", 16 * 5 + 1, 40), make_shard("state_000001.bin", 16 * 3 + 9, 41),
                   make_shard("state_000002.bin", 16 * 4 + 2, 42)};
    const int per_epoch = 12, follow = 30;
    char pattern[512], why[WHY_LEN] = "";
    make_path(pattern, sizeof(pattern), "state_*.bin");
    int ok = 1;
    for (int shuffle = 0; ok && shuffle <= 1; shuffle++) {
        for (int start = 0; ok && start <= 2 * per_epoch + 1; start += 1) {
            DataLoader a, b;
            int oa = dataloader_open(&a, pattern, B, T, 1, W, VOCAB, shuffle, 1234);
            int ob = dataloader_open(&b, pattern, B, T, 1, W, VOCAB, shuffle, 1234);
            if (oa || ob) { snprintf(why, sizeof(why), "open: %s %s", a.error, b.error); ok = 0; }
            for (int k = 0; ok && k < start; k++) ok = dataloader_next_batch(&a) == 0;
            DataLoaderState st = dataloader_get_state(&a);
            if (ok && dataloader_set_state(&b, st) != 0) { snprintf(why, sizeof(why), "set_state: %s", b.error); ok = 0; }
            for (int k = 0; ok && k < follow; k++) {
                if (dataloader_next_batch(&a) != 0 || dataloader_next_batch(&b) != 0) { ok = 0; break; }
                if (memcmp(a.inputs, b.inputs, sizeof(int32_t) * B * T) != 0 ||
                    memcmp(a.targets, b.targets, sizeof(int32_t) * B * T) != 0) {
                    snprintf(why, sizeof(why), "shuffle %d, saved after %d batches (epoch %lld shard %lld chunk %lld): "
                             "batch %d after restore differs", shuffle, start, (long long)st.epoch,
                             (long long)st.shard_index, (long long)st.chunk_index, k);
                    ok = 0;
                }
            }
            if (ok && a.epoch != b.epoch) { snprintf(why, sizeof(why), "epochs differ"); ok = 0; }
            dataloader_close(&a); dataloader_close(&b);
        }
    }
    // Out-of-range states are refused and leave the position alone. {0, 0, 5}: no shard here has
    // more than 5 chunks; the negative indices would index the shard or chunk order at -1.
    DataLoader c;
    if (ok && dataloader_open(&c, pattern, B, T, 0, W, VOCAB, 1, 1) == 0) {
        const DataLoaderState bad[] = {{0, 3, 0}, {0, 0, 5}, {-1, 0, 0}, {0, -1, 0}, {0, 0, -1}};
        for (size_t i = 0; ok && i < COUNT(bad); i++) {
            int r = dataloader_set_state(&c, bad[i]);
            DataLoaderState now = dataloader_get_state(&c);
            if (r != -1 || !strstr(c.error, "out of range") || now.shard_index != 0 || now.chunk_index != 0 || now.epoch != 0) {
                snprintf(why, sizeof(why), "bad state {%lld, %lld, %lld} accepted (rc %d) or position moved: %s",
                         (long long)bad[i].epoch, (long long)bad[i].shard_index, (long long)bad[i].chunk_index, r, c.error);
                ok = 0;
            }
        }
        dataloader_close(&c);
    } else if (ok) { snprintf(why, sizeof(why), "open: %s", c.error); ok = 0; }
    test_report(name, ok, "%s", why);
    for (int s = 0; s < 3; s++) free_shard(&sh[s]);
}

// The exact bound of chunk_index, shard by shard (test_state_restore's bad states, shuffled, only
// probe a count no shard reaches): unshuffled, shard_index i is file i, so {e, i, chunks_i - 1}
// must serve file i's last chunk and move on to the next shard or epoch, while {e, i, chunks_i},
// one past the end, must be refused without moving the position.
static void test_state_chunk_bounds(void) {
    const char* name = "state_chunk_bounds";
    const int B = 2, T = 4, W = 2, R = 1;  // 16 tokens per chunk; rank 1 reads the second 8
    const int64_t chunks[3] = {5, 3, 4};
    Shard sh[3] = {make_shard("bound_000000.bin", 16 * 5 + 1, 60), make_shard("bound_000001.bin", 16 * 3 + 15, 61),
                   make_shard("bound_000002.bin", 16 * 4 + 7, 62)};
    char pattern[512], why[WHY_LEN] = "";
    make_path(pattern, sizeof(pattern), "bound_*.bin");
    DataLoader dl;
    int ok = dataloader_open(&dl, pattern, B, T, R, W, VOCAB, 0, 0) == 0;
    if (!ok) snprintf(why, sizeof(why), "open: %s", dl.error);
    for (int64_t e = 0; ok && e < 2; e++) {
        for (int i = 0; ok && i < 3; i++) {
            DataLoaderState past = {e, i, chunks[i]}, last = {e, i, chunks[i] - 1};
            DataLoaderState before = dataloader_get_state(&dl);
            int rp = dataloader_set_state(&dl, past);
            DataLoaderState now = dataloader_get_state(&dl);
            if (rp != -1 || !strstr(dl.error, "chunk_index") || now.epoch != before.epoch ||
                now.shard_index != before.shard_index || now.chunk_index != before.chunk_index) {
                snprintf(why, sizeof(why), "state {%lld, %d, %lld} (one past the last chunk) accepted (rc %d) or "
                         "position moved: %s", (long long)e, i, (long long)chunks[i], rp, dl.error);
                ok = 0; break;
            }
            int rl = dataloader_set_state(&dl, last);
            if (rl != 0 || dataloader_next_batch(&dl) != 0 ||
                !batch_is(&dl, sh[i].tok, (chunks[i] - 1) * 16 + R * B * T)) {
                snprintf(why, sizeof(why), "state {%lld, %d, %lld} (the last chunk) refused (rc %d) or served "
                         "another batch: %s", (long long)e, i, (long long)chunks[i] - 1, rl, dl.error);
                ok = 0; break;
            }
            now = dataloader_get_state(&dl);
            DataLoaderState want = {i < 2 ? e : e + 1, i < 2 ? i + 1 : 0, 0};
            if (now.epoch != want.epoch || now.shard_index != want.shard_index || now.chunk_index != 0) {
                snprintf(why, sizeof(why), "after the last chunk of shard %d: state {%lld, %lld, %lld}", i,
                         (long long)now.epoch, (long long)now.shard_index, (long long)now.chunk_index);
                ok = 0;
            }
        }
    }
    test_report(name, ok, "%s", why);
    dataloader_close(&dl);
    for (int s = 0; s < 3; s++) free_shard(&sh[s]);
}

// ---------------------------------------------------------------------------------------------
// Bad files: open (or the first batch, for a token out of range) gives -1 and an error that
// names the file and contains `word`.

static void expect_error(const char* name, const char* pattern, const char* path_in_msg, const char* word,
                         int fail_at_batch, int B, int T) {
    DataLoader dl;
    int rc = dataloader_open(&dl, pattern, B, T, 0, 1, VOCAB, 0, 0);
    int when = 0;  // 0: at open, 1: at the first batch
    if (rc == 0) { when = 1; rc = dataloader_next_batch(&dl); }
    int ok = rc == -1 && when == fail_at_batch && strstr(dl.error, path_in_msg) && strstr(dl.error, word);
    // a failed loader rejects further use without crashing
    const int reused = rc == -1 && when == 0 && dataloader_next_batch(&dl) != -1;
    test_report(name, ok && !reused, "rc %d at %s, error \"%s\" (want \"%s\" and \"%s\")%s", rc,
                when ? "next_batch" : "open", dl.error, path_in_msg, word,
                reused ? "; next_batch on the failed loader did not fail" : "");
    dataloader_close(&dl);
}

// Shards whose header and size disagree, or whose header is wrong, and the word their error holds.
static const struct {
    const char* file;
    int32_t magic, version, count;
    int64_t ntok;
    int extra;
    const char* word;
} BAD_HEADERS[] = {
    {"truncated.bin", SHARD_MAGIC, SHARD_VERSION, 100, 99, 0, "truncated"},
    {"truncated_odd.bin", SHARD_MAGIC, SHARD_VERSION, 100, 99, 1, "truncated"},
    {"trailing.bin", SHARD_MAGIC, SHARD_VERSION, 100, 100, 3, "trailing bytes"},
    {"magic.bin", 20240521, SHARD_VERSION, 100, 100, 0, "magic"},
    {"version.bin", SHARD_MAGIC, 2, 100, 100, 0, "version"},
    {"zero.bin", SHARD_MAGIC, SHARD_VERSION, 0, 0, 0, "count"},
    {"negative.bin", SHARD_MAGIC, SHARD_VERSION, -5, 0, 0, "count"},
};
// test_bad_files: one case per BAD_HEADERS entry, then these named ones: shorter than the header, token
// out of range (mid-shard, and the last token), missing file, no glob match, too small, a bad shard
// among good ones, bad settings, B*T*world too large.
#define BAD_FILE_CASES ((int)COUNT(BAD_HEADERS) + 9)

static void test_bad_files(void) {
    uint16_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = (uint16_t)(i * 97 % VOCAB);
    char p[512];
    for (size_t i = 0; i < COUNT(BAD_HEADERS); i++) {
        make_path(p, sizeof(p), BAD_HEADERS[i].file);
        write_shard_raw(p, BAD_HEADERS[i].magic, BAD_HEADERS[i].version, BAD_HEADERS[i].count, tok,
                        BAD_HEADERS[i].ntok, BAD_HEADERS[i].extra);
        char name[64];
        snprintf(name, sizeof(name), "bad_file_%s", BAD_HEADERS[i].file);
        name[strlen(name) - 4] = '\0';  // drop ".bin"
        expect_error(name, p, p, BAD_HEADERS[i].word, 0, 2, 8);
        unlink(p);
    }

    make_path(p, sizeof(p), "short.bin");  // 100 bytes: not even a header
    FILE* f = fopen(p, "wb");
    for (int i = 0; f && i < 100; i++) fputc(1, f);
    if (f) fclose(f);
    expect_error("bad_file_shorter_than_header", p, p, "header", 0, 2, 8);
    unlink(p);

    make_path(p, sizeof(p), "vocab.bin");  // header fine; token 150 is 50257: found when loaded
    uint16_t t2[200];
    memcpy(t2, tok, sizeof(t2));
    t2[150] = VOCAB;
    write_shard_raw(p, SHARD_MAGIC, SHARD_VERSION, 200, t2, 200, 0);
    expect_error("bad_file_token_out_of_range", p, p, "token 50257 at index 150 is out of range", 1, 2, 8);
    unlink(p);

    // 81 = 5 * B*T + 1 tokens: the last one is read only as the last chunk's final target, so a
    // range check that stops one short would hand 50257 to the model.
    make_path(p, sizeof(p), "vocab_last.bin");
    t2[150] = tok[150];
    t2[80] = VOCAB;
    write_shard_raw(p, SHARD_MAGIC, SHARD_VERSION, 81, t2, 81, 0);
    expect_error("bad_file_last_token_out_of_range", p, p, "token 50257 at index 80 is out of range", 1, 2, 8);
    unlink(p);

    make_path(p, sizeof(p), "missing.bin");
    expect_error("bad_file_missing", p, p, "No such file", 0, 2, 8);

    make_path(p, sizeof(p), "nomatch_*.bin");
    expect_error("bad_glob_no_match", p, p, "no file matches", 0, 2, 8);

    make_path(p, sizeof(p), "small.bin");  // 16 tokens < B*T+1 = 17
    write_shard_raw(p, SHARD_MAGIC, SHARD_VERSION, 16, tok, 16, 0);
    expect_error("bad_data_too_small", p, p, "B*T*world+1 = 17", 0, 2, 8);
    unlink(p);

    // One bad shard among good ones: the error names the bad one.
    char good0[512], bad1[512], pattern[512];
    make_path(good0, sizeof(good0), "mix_000000.bin");
    make_path(bad1, sizeof(bad1), "mix_000001.bin");
    make_path(pattern, sizeof(pattern), "mix_*.bin");
    write_shard_raw(good0, SHARD_MAGIC, SHARD_VERSION, 200, tok, 200, 0);
    write_shard_raw(bad1, SHARD_MAGIC, SHARD_VERSION, 200, tok, 150, 0);
    expect_error("bad_file_among_good_ones", pattern, bad1, "truncated", 0, 2, 8);
    unlink(good0); unlink(bad1);

    DataLoader dl;  // bad settings
    make_path(p, sizeof(p), "settings.bin");
    write_shard_raw(p, SHARD_MAGIC, SHARD_VERSION, 200, tok, 200, 0);
    int r1 = dataloader_open(&dl, p, 2, 8, 2, 2, VOCAB, 0, 0);  // rank 2 of world 2
    int r2 = dataloader_open(&dl, p, 0, 8, 0, 1, VOCAB, 0, 0);  // B = 0
    test_report("bad_settings", r1 == -1 && r2 == -1 && strstr(dl.error, "B 0"), "rc %d %d: %s", r1, r2, dl.error);
    dataloader_close(&dl);
    // B*T*world = 4 (2^31 - 1)^2 > INT64_MAX: unchecked, chunk_tokens would wrap negative.
    int r3 = dataloader_open(&dl, p, INT_MAX, INT_MAX, 0, 4, VOCAB, 0, 0);
    test_report("bad_settings_too_large", r3 == -1 && strstr(dl.error, "too large"), "rc %d: %s", r3, dl.error);
    dataloader_close(&dl);
    unlink(p);
}

// A shard that is fine at open but changes before it is loaded: next_batch fails cleanly,
// names the shard and keeps the position. Cut short (size no longer matches the header), or
// rewritten as a valid but shorter shard (its chunks, counted at open, no longer fit).
static const char* const CHANGE_KINDS[] = {"truncated", "changed"};

static void test_shard_changed_after_open(void) {
    for (int kind = 0; kind < (int)COUNT(CHANGE_KINDS); kind++) {
        char name[64];
        snprintf(name, sizeof(name), "shard_%s_after_open", CHANGE_KINDS[kind]);
        Shard a = make_shard("changed_000000.bin", 100, 50), b = make_shard("changed_000001.bin", 100, 51);
        char pattern[512];
        make_path(pattern, sizeof(pattern), "changed_*.bin");
        DataLoader dl;
        int ok = dataloader_open(&dl, pattern, 2, 8, 0, 1, VOCAB, 0, 0) == 0;
        write_shard_raw(b.path, SHARD_MAGIC, SHARD_VERSION, kind == 0 ? 100 : 60, b.tok, 60, 0);
        for (int k = 0; ok && k < 6; k++) ok = dataloader_next_batch(&dl) == 0;  // shard 0 is fine
        DataLoaderState before = dataloader_get_state(&dl);
        int rc = ok ? dataloader_next_batch(&dl) : 0;
        DataLoaderState after = dataloader_get_state(&dl);
        ok = ok && rc == -1 && strstr(dl.error, b.path) && strstr(dl.error, CHANGE_KINDS[kind]) &&
             before.shard_index == after.shard_index && before.chunk_index == after.chunk_index;
        test_report(name, ok, "rc %d, error \"%s\"", rc, dl.error);
        dataloader_close(&dl);
        free_shard(&a); free_shard(&b);
    }
}

// A shard that fails its range check has already overwritten the token buffer, so the loader must
// forget the shard it held: restoring a position in that earlier shard has to read it again, not
// serve the failed shard's tokens. The bad token is the failed shard's last one (see
// bad_file_last_token_out_of_range).
static void test_failed_load_then_restore(void) {
    const char* name = "failed_load_then_restore";
    Shard a = make_shard("reload_000000.bin", 2 * 16 + 1, 80), b = make_shard("reload_000001.bin", 2 * 16 + 1, 81);
    b.tok[b.n - 1] = VOCAB;
    write_shard_raw(b.path, SHARD_MAGIC, SHARD_VERSION, (int32_t)b.n, b.tok, b.n, 0);
    char pattern[512], why[WHY_LEN] = "";
    make_path(pattern, sizeof(pattern), "reload_*.bin");
    DataLoader dl;
    int ok = dataloader_open(&dl, pattern, 2, 8, 0, 1, VOCAB, 0, 0) == 0;
    for (int k = 0; ok && k < 2; k++) ok = dataloader_next_batch(&dl) == 0;  // shard a, both chunks
    if (!ok) snprintf(why, sizeof(why), "open or shard a: %s", dl.error);
    if (ok && (dataloader_next_batch(&dl) != -1 || !strstr(dl.error, b.path) || !strstr(dl.error, "index 32"))) {
        snprintf(why, sizeof(why), "shard b with token 50257 at index 32 loaded: \"%s\"", dl.error); ok = 0;
    }
    const DataLoaderState start = {0, 0, 0};
    if (ok && (dataloader_set_state(&dl, start) != 0 || dataloader_next_batch(&dl) != 0 || !batch_is(&dl, a.tok, 0))) {
        snprintf(why, sizeof(why), "after the failed load, state {0, 0, 0} does not serve shard a's first chunk (%s)",
                 dl.error);
        ok = 0;
    }
    test_report(name, ok, "%s", why);
    dataloader_close(&dl);
    free_shard(&a); free_shard(&b);
}

// Every group in the order it runs, with the number of cases it reports.
static const struct {
    void (*run)(void);
    int cases;
} GROUPS[] = {
    {test_single_shard_batches_and_epoch_wrap, 1},
    {test_reset_restarts_epoch_zero, 1},
    {test_glob_order_and_skipping, 1},
    {test_glob_brackets_and_question_mark, 1},
    {test_rank_split, 1},
    {test_shuffle, 1},
    {test_shuffle_shard_order_per_epoch, 1},
    {test_state_restore, 1},
    {test_state_chunk_bounds, 1},
    {test_bad_files, BAD_FILE_CASES},
    {test_shard_changed_after_open, (int)COUNT(CHANGE_KINDS)},
    {test_failed_load_then_restore, 1},
};

int main(void) {
    test_begin();
    int cases = 0;
    for (size_t i = 0; i < COUNT(GROUPS); i++) cases += GROUPS[i].cases;
    test_plan(cases);
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_dataloader_XXXXXX");
    if (!mkdtemp(g_dir)) { test_fail("setup", "mkdtemp: %s", strerror(errno)); return test_end(); }
    for (size_t i = 0; i < COUNT(GROUPS); i++) GROUPS[i].run();
    remove_dir(g_dir);
    return test_end();
}
