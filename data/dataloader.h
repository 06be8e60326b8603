// dataloader.h: reads token shards and serves (B, T) batches of inputs and next-token targets.
//
// File format (llm.c's; written by scripts/prepare_data.py, read back by scripts/shard_format.py):
//   header  256 int32, little-endian: [0] = 20240520 (magic), [1] = 1 (version: uint16 tokens),
//           [2] = N, the number of tokens (N > 0); the rest is zero
//   body    N uint16 tokens, little-endian
//   so a shard is exactly 1024 + 2 N bytes.
//
// Shards: `pattern` is one path or a glob (matches sorted by name). dataloader_open checks every
// shard's header and size; a shard's tokens are read whole, and checked to be < vocab_size, when
// the shard is first needed (one shard is in memory at a time).
//
// Batches and ranks (as llm.c): `world` processes share the stream. A shard is cut into
// floor((N - 1) / (B T world)) chunks of B T world tokens; a shard too small for one chunk is
// skipped. In chunk c, rank r reads the B T + 1 tokens from off = c B T world + r B T:
//   inputs[b][t] = tok[off + b T + t],   targets[b][t] = tok[off + b T + t + 1],
// i.e. row b is the (T + 1)-token window starting at off + b T. The "+ 1" is why a chunk needs
// one token beyond its B T world: the last target.
//
// Epochs: after the last chunk of the last shard the epoch counter increments and the stream
// wraps. With shuffle on, every epoch permutes the shard order and each shard's chunk order
// with a PRNG seeded from (seed, epoch, shard) only, so every rank and every run agrees, and a
// saved DataLoaderState (epoch, position in the shard order, position in the chunk order)
// restores the exact stream in a new loader opened on the same files with the same settings.
//
// Errors: fallible calls return -1 and leave one line in dl->error that names the file and the
// problem. The loader never prints, never exits and never reads outside a buffer.
// Assumes a little-endian host (x86-64, aarch64), as llm.c does.
//
// Plain C11 that also compiles as C++ (nvcc): static inline functions, explicit casts.
// Usage:
//   DataLoader dl;
//   if (dataloader_open(&dl, "data/x/x_train_*.bin", B, T, rank, world, 50257, 1, 1337) != 0)
//       { fprintf(stderr, "%s\n", dl.error); exit(1); }
//   if (dataloader_next_batch(&dl) != 0) { ... dl.error ... }   // then use dl.inputs, dl.targets
//   dataloader_close(&dl);
#ifndef DATALOADER_H
#define DATALOADER_H

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

// The position of the next batch; restorable with dataloader_set_state.
typedef struct {
    int64_t epoch;        // passes over the data completed so far
    int64_t shard_index;  // position in this epoch's shard order (counting only shards that are used)
    int64_t chunk_index;  // position in that shard's chunk order
} DataLoaderState;

typedef struct {
    int B, T;               // micro batch and sequence length
    int rank, world;        // this process and the number of processes sharing the stream
    int vocab_size;         // every token must be < vocab_size
    int shuffle; uint64_t seed;
    int num_shards; char** shard_paths; int64_t* shard_tokens; int64_t total_tokens;
    int num_used_shards;    // shards with at least one chunk; the others are skipped
    int32_t* inputs;        // (B, T) tokens of the current batch
    int32_t* targets;       // (B, T) the next token of each input
    char error[1024];       // why the last call failed: names the file and the problem

    // Internal: the fields below belong to the loader.
    int is_open;
    int64_t epoch, shard_pos, chunk_pos;  // DataLoaderState of the next batch
    int64_t chunk_tokens;     // B T world: tokens one step takes from the stream
    int64_t* shard_chunks;    // (num_shards) chunks per shard; 0 = skipped
    int64_t chunks_per_epoch; // sum of shard_chunks = batches per epoch for every rank
    int32_t* shard_order;     // (num_used_shards) file indices in the order of epoch order_epoch
    int64_t order_epoch;      // -1: shard_order not computed yet
    int32_t* chunk_order;     // (max_chunks) with shuffle: chunk order of one (epoch, shard)
    int64_t chunk_order_epoch; int chunk_order_shard;  // which one; epoch -1: none yet
    uint16_t* tokens;         // the loaded shard, capacity max_tokens
    int64_t max_tokens;       // tokens of the largest used shard
    int loaded_shard;         // file index of the shard in `tokens`; -1: none
} DataLoader;

#if defined(__GNUC__)
#define DL_PRINTF_LIKE __attribute__((format(printf, 2, 3)))
#else
#define DL_PRINTF_LIKE
#endif

static inline int dl_fail(DataLoader* dl, const char* fmt, ...) DL_PRINTF_LIKE;
static inline int dl_fail(DataLoader* dl, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dl->error, sizeof(dl->error), fmt, ap);
    va_end(ap);
    return -1;
}

// splitmix64: a tiny, well-mixed PRNG; the same sequence on every machine and compiler.
static inline uint64_t dl_splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A PRNG state derived from (seed, epoch, stream) alone, so any position can be recomputed.
static inline uint64_t dl_rng_state(uint64_t seed, int64_t epoch, uint64_t stream) {
    uint64_t s = seed;
    uint64_t h = dl_splitmix64(&s);
    s = h ^ (uint64_t)epoch;
    h = dl_splitmix64(&s);
    s = h ^ stream;
    return dl_splitmix64(&s);
}

// Fisher-Yates shuffle. The modulo bias is below n / 2^64: irrelevant for data order.
static inline void dl_permute(int32_t* a, int64_t n, uint64_t rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(dl_splitmix64(&rng) % (uint64_t)(i + 1));
        int32_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

static inline char* dl_strdup(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = (char*)malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

// Opens a shard and checks its header and size. On success returns the open file, positioned
// at the first token, and the token count; on failure NULL with dl->error set.
static inline FILE* dl_open_shard(DataLoader* dl, const char* path, int64_t* count) {
    FILE* f = fopen(path, "rb");
    if (!f) { dl_fail(dl, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    int32_t header[SHARD_HEADER_INTS];
    size_t got = fread(header, 1, sizeof(header), f);
    if (got != sizeof(header)) {
        if (ferror(f)) dl_fail(dl, "%s: cannot read: %s", path, strerror(errno));
        else dl_fail(dl, "%s: only %zu bytes, shorter than the %d-byte header: not a token shard",
                     path, got, SHARD_HEADER_BYTES);
        fclose(f);
        return NULL;
    }
    if (header[0] != SHARD_MAGIC) {
        dl_fail(dl, "%s: bad magic number %d (expected %d): not a token shard", path,
                (int)header[0], SHARD_MAGIC);
        fclose(f);
        return NULL;
    }
    if (header[1] != SHARD_VERSION) {
        dl_fail(dl, "%s: unsupported version %d (expected %d: uint16 tokens)", path,
                (int)header[1], SHARD_VERSION);
        fclose(f);
        return NULL;
    }
    if (header[2] <= 0) {
        dl_fail(dl, "%s: header token count is %d (must be > 0)", path, (int)header[2]);
        fclose(f);
        return NULL;
    }
    int64_t n = header[2];
    int64_t expected = SHARD_HEADER_BYTES + 2 * n;
    long size = -1;  // long is 64-bit on the LP64 systems this targets
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, SHARD_HEADER_BYTES, SEEK_SET) != 0) {
        dl_fail(dl, "%s: cannot determine the file size: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    if ((int64_t)size != expected) {
        dl_fail(dl, "%s: %s: file size is %lld bytes, but the header says %lld tokens = %lld bytes",
                path, (int64_t)size < expected ? "truncated" : "trailing bytes",
                (long long)size, (long long)n, (long long)expected);
        fclose(f);
        return NULL;
    }
    *count = n;
    return f;
}

// Reads shard `s` whole into dl->tokens (unless it is already there) and range-checks it.
static inline int dl_load_shard(DataLoader* dl, int s) {
    if (dl->loaded_shard == s) return 0;
    dl->loaded_shard = -1;  // the buffer is about to be overwritten
    const char* path = dl->shard_paths[s];
    int64_t n = 0;
    FILE* f = dl_open_shard(dl, path, &n);
    if (!f) return -1;
    if (n != dl->shard_tokens[s]) {
        fclose(f);
        return dl_fail(dl, "%s: changed since the loader opened it (%lld tokens then, %lld now)",
                       path, (long long)dl->shard_tokens[s], (long long)n);
    }
    if (!dl->tokens) {
        dl->tokens = (uint16_t*)malloc((size_t)dl->max_tokens * sizeof(uint16_t));
        if (!dl->tokens) {
            fclose(f);
            return dl_fail(dl, "%s: out of memory for %lld tokens", path, (long long)dl->max_tokens);
        }
    }
    size_t got = fread(dl->tokens, sizeof(uint16_t), (size_t)n, f);
    int read_error = ferror(f);
    fclose(f);
    if (got != (size_t)n) {
        return dl_fail(dl, "%s: %s after %zu of %lld tokens", path,
                       read_error ? strerror(errno) : "truncated while reading", got, (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        if ((int)dl->tokens[i] >= dl->vocab_size) {
            return dl_fail(dl, "%s: token %d at index %lld is out of range (vocab_size %d)",
                           path, (int)dl->tokens[i], (long long)i, dl->vocab_size);
        }
    }
    dl->loaded_shard = s;
    return 0;
}

// Makes dl->shard_order the shard order of `epoch`: used shards in file order, or permuted.
static inline void dl_prepare_shard_order(DataLoader* dl, int64_t epoch) {
    if (dl->order_epoch == epoch) return;
    int k = 0;
    for (int s = 0; s < dl->num_shards; s++)
        if (dl->shard_chunks[s] > 0) dl->shard_order[k++] = s;
    if (dl->shuffle) dl_permute(dl->shard_order, k, dl_rng_state(dl->seed, epoch, UINT64_MAX));
    dl->order_epoch = epoch;
}

// The chunk of shard `s` served at position `pos` of its chunk order in `epoch`.
static inline int64_t dl_chunk_at(DataLoader* dl, int64_t epoch, int s, int64_t pos) {
    if (!dl->shuffle) return pos;
    if (dl->chunk_order_epoch != epoch || dl->chunk_order_shard != s) {
        int64_t n = dl->shard_chunks[s];
        for (int64_t i = 0; i < n; i++) dl->chunk_order[i] = (int32_t)i;
        dl_permute(dl->chunk_order, n, dl_rng_state(dl->seed, epoch, (uint64_t)s));
        dl->chunk_order_epoch = epoch;
        dl->chunk_order_shard = s;
    }
    return dl->chunk_order[pos];
}

static inline void dataloader_close(DataLoader* dl) {
    if (dl->shard_paths)
        for (int i = 0; i < dl->num_shards; i++) free(dl->shard_paths[i]);
    free(dl->shard_paths);
    free(dl->shard_tokens);
    free(dl->shard_chunks);
    free(dl->shard_order);
    free(dl->chunk_order);
    free(dl->tokens);
    free(dl->inputs);
    free(dl->targets);
    memset(dl, 0, sizeof(*dl));
    dl->loaded_shard = -1;
}

// Collects the paths `pattern` names into dl->shard_paths (sorted).
static inline int dl_find_shards(DataLoader* dl, const char* pattern) {
    if (!strpbrk(pattern, "*?[")) {  // a plain path: a missing file is reported by name when opened
        dl->shard_paths = (char**)calloc(1, sizeof(char*));
        if (!dl->shard_paths || !(dl->shard_paths[0] = dl_strdup(pattern)))
            return dl_fail(dl, "out of memory");
        dl->num_shards = 1;
        return 0;
    }
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);  // glob sorts its matches
    if (rc == GLOB_NOMATCH) { globfree(&g); return dl_fail(dl, "%s: no file matches this pattern", pattern); }
    if (rc != 0) { globfree(&g); return dl_fail(dl, "%s: cannot list the matching files (glob error %d)", pattern, rc); }
    if (g.gl_pathc > (size_t)INT_MAX) { globfree(&g); return dl_fail(dl, "%s: too many files", pattern); }
    dl->shard_paths = (char**)calloc(g.gl_pathc, sizeof(char*));
    if (!dl->shard_paths) { globfree(&g); return dl_fail(dl, "out of memory"); }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        dl->shard_paths[i] = dl_strdup(g.gl_pathv[i]);
        dl->num_shards = (int)i + 1;  // so that close frees what was copied
        if (!dl->shard_paths[i]) { globfree(&g); return dl_fail(dl, "out of memory"); }
    }
    globfree(&g);
    return 0;
}

static inline int dl_open_impl(DataLoader* dl, const char* pattern) {
    if (dl->B <= 0 || dl->T <= 0 || dl->world <= 0 || dl->rank < 0 || dl->rank >= dl->world || dl->vocab_size <= 0)
        return dl_fail(dl, "bad loader settings: B %d, T %d, rank %d, world %d, vocab_size %d "
                       "(need B, T, world, vocab_size > 0 and 0 <= rank < world)",
                       dl->B, dl->T, dl->rank, dl->world, dl->vocab_size);
    int64_t bt = (int64_t)dl->B * dl->T;  // < 2^62: no overflow
    if (bt > (INT64_MAX - 1) / dl->world) return dl_fail(dl, "B * T * world is too large");
    dl->chunk_tokens = bt * dl->world;
    if (!pattern || !*pattern) return dl_fail(dl, "no data file given (empty pattern)");
    if (dl_find_shards(dl, pattern) != 0) return -1;

    dl->shard_tokens = (int64_t*)calloc((size_t)dl->num_shards, sizeof(int64_t));
    dl->shard_chunks = (int64_t*)calloc((size_t)dl->num_shards, sizeof(int64_t));
    if (!dl->shard_tokens || !dl->shard_chunks) return dl_fail(dl, "out of memory");
    int64_t max_chunks = 0, largest = 0;
    for (int s = 0; s < dl->num_shards; s++) {
        int64_t n = 0;
        FILE* f = dl_open_shard(dl, dl->shard_paths[s], &n);
        if (!f) return -1;
        fclose(f);
        dl->shard_tokens[s] = n;
        dl->shard_chunks[s] = (n - 1) / dl->chunk_tokens;  // -1: the last chunk needs one more target
        dl->total_tokens += n;
        if (n > largest) largest = n;
        if (dl->shard_chunks[s] > 0) {
            dl->num_used_shards++;
            dl->chunks_per_epoch += dl->shard_chunks[s];
            if (dl->shard_chunks[s] > max_chunks) max_chunks = dl->shard_chunks[s];
            if (n > dl->max_tokens) dl->max_tokens = n;
        }
    }
    if (dl->num_used_shards == 0)
        return dl_fail(dl, "%s: too little data: %lld tokens in %d shard(s), the largest %lld, but one "
                       "step needs B*T*world+1 = %lld tokens in one shard; lower B or T",
                       pattern, (long long)dl->total_tokens, dl->num_shards, (long long)largest,
                       (long long)dl->chunk_tokens + 1);

    dl->shard_order = (int32_t*)malloc((size_t)dl->num_used_shards * sizeof(int32_t));
    if (dl->shuffle) dl->chunk_order = (int32_t*)malloc((size_t)max_chunks * sizeof(int32_t));
    dl->inputs = (int32_t*)malloc((size_t)bt * sizeof(int32_t));
    dl->targets = (int32_t*)malloc((size_t)bt * sizeof(int32_t));
    if (!dl->shard_order || (dl->shuffle && !dl->chunk_order) || !dl->inputs || !dl->targets)
        return dl_fail(dl, "out of memory for a batch of B*T = %lld tokens", (long long)bt);
    return 0;
}

static inline int dataloader_open(DataLoader* dl, const char* pattern, int B, int T, int rank, int world,
                                  int vocab_size, int shuffle, uint64_t seed) {
    memset(dl, 0, sizeof(*dl));
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world;
    dl->vocab_size = vocab_size; dl->shuffle = shuffle ? 1 : 0; dl->seed = seed;
    dl->order_epoch = -1; dl->chunk_order_epoch = -1; dl->loaded_shard = -1;
    if (dl_open_impl(dl, pattern) != 0) {
        char why[sizeof(dl->error)];
        memcpy(why, dl->error, sizeof(why));
        dataloader_close(dl);  // leaves a zeroed loader that every call rejects safely
        memcpy(dl->error, why, sizeof(why));
        return -1;
    }
    dl->is_open = 1;
    return 0;
}

static inline int dataloader_next_batch(DataLoader* dl) {
    if (!dl->is_open) return dl_fail(dl, "dataloader_next_batch: the loader is not open");
    dl_prepare_shard_order(dl, dl->epoch);
    int s = dl->shard_order[dl->shard_pos];
    int64_t chunk = dl_chunk_at(dl, dl->epoch, s, dl->chunk_pos);
    if (dl_load_shard(dl, s) != 0) return -1;  // position unchanged: the caller may report and stop
    int64_t bt = (int64_t)dl->B * dl->T;
    const uint16_t* tok = dl->tokens + chunk * dl->chunk_tokens + (int64_t)dl->rank * bt;
    for (int64_t i = 0; i < bt; i++) {
        dl->inputs[i] = tok[i];
        dl->targets[i] = tok[i + 1];
    }
    // Advance to the next batch's position, wrapping into the next shard and epoch.
    if (++dl->chunk_pos == dl->shard_chunks[s]) {
        dl->chunk_pos = 0;
        if (++dl->shard_pos == dl->num_used_shards) {
            dl->shard_pos = 0;
            dl->epoch++;
        }
    }
    return 0;
}

static inline void dataloader_reset(DataLoader* dl) {
    dl->epoch = 0; dl->shard_pos = 0; dl->chunk_pos = 0;
}

static inline DataLoaderState dataloader_get_state(const DataLoader* dl) {
    DataLoaderState s;
    s.epoch = dl->epoch; s.shard_index = dl->shard_pos; s.chunk_index = dl->chunk_pos;
    return s;
}

static inline int dataloader_set_state(DataLoader* dl, DataLoaderState st) {
    if (!dl->is_open) return dl_fail(dl, "dataloader_set_state: the loader is not open");
    if (st.epoch < 0 || st.shard_index < 0 || st.shard_index >= dl->num_used_shards)
        return dl_fail(dl, "data state out of range: epoch %lld, shard_index %lld (this data has %d "
                       "used shards); was it saved with other data files or B, T, world?",
                       (long long)st.epoch, (long long)st.shard_index, dl->num_used_shards);
    dl_prepare_shard_order(dl, st.epoch);
    int s = dl->shard_order[st.shard_index];
    if (st.chunk_index < 0 || st.chunk_index >= dl->shard_chunks[s])
        return dl_fail(dl, "data state out of range: chunk_index %lld, but %s holds %lld chunks at "
                       "B*T*world = %lld; was it saved with other data files or B, T, world?",
                       (long long)st.chunk_index, dl->shard_paths[s], (long long)dl->shard_chunks[s],
                       (long long)dl->chunk_tokens);
    dl->epoch = st.epoch; dl->shard_pos = st.shard_index; dl->chunk_pos = st.chunk_index;
    return 0;
}

static inline int64_t dataloader_batches_per_epoch(const DataLoader* dl) { return dl->chunks_per_epoch; }

#endif  // DATALOADER_H
