// checkpoint.h: the training checkpoint file: what a run needs to continue exactly where it stopped.
//
// File layout (little-endian), one file per saved step, DIR/step_XXXXXXXX.ckpt:
//   header   CHECKPOINT_HEADER_BYTES (1024): CheckpointHeader below, zero-padded
//   payload  four arrays of num_params elements, in gpt_config.h's parameter order:
//            params bf16 (the model's weights), master fp32, adam_m fp32, adam_v fp32
//   fp8      header.fp8_state_bytes (0: none) of an optional FP8-scales section: the delayed-scaling
//            states of a --precision fp8 run (amax histories and scales, layers/model/gpt_fp8.cuh's
//            f->states as they lie in device memory), so that its resume continues exactly. Files of
//            bf16 runs and of builds before fp8 have 0 there (the field was `reserved`, always zero),
//            so they stay valid and the header's layout and size are unchanged.
// ZeRO-1 runs (zero_stage 1, optimizer state sharded over world_size ranks) save one file per rank
// and step, DIR/step_XXXXXXXX.rankRRofWW.ckpt: the same header with zero_stage, rank and the
// shard (shard_offset, shard_size elements of the flat parameter vector padded to world_size ·
// shard_size), and the payload params bf16 (num_params, all of them), then master, adam_m, adam_v
// fp32 (shard_size each, this rank's shard), then the whole FP8-scales section (every rank's file
// holds the same one: the states are replicated). A step counts as saved only when all WW files exist.
// The header's payload_checksum (checkpoint_hash over the payload bytes, the FP8 section included)
// catches a corrupt or partly copied file; the file size must be exactly header + payload + section.
//
// Writing is crash-safe: the payload streams to DIR/.step_XXXXXXXX.ckpt.tmp, the header goes in
// last, the file is fsync'ed and only then renamed to its final name (rename is atomic on POSIX
// file systems), so DIR never holds a half-written step_*.ckpt. A crash leaves at most a .tmp file,
// which the next save of that step replaces and checkpoint_remove_temporaries removes (train_gpt
// calls it when a run starts).
//
// Plain C11 that also compiles as C++ (nvcc). Fallible calls return -1 with one line in `err` that
// names the file and the problem; nothing here prints or exits.
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECKPOINT_MAGIC "GPTCKPT"  // 8 bytes with the terminating zero
#define CHECKPOINT_VERSION 1
#define CHECKPOINT_HEADER_BYTES 1024
#define CHECKPOINT_PATH_MAX 4096
// The most parameters (and sharded state elements, all ranks together) a header may claim: far above
// any model, and low enough that no size computed from a header overflows int64 (a corrupt header is
// refused with a message, found by test/fuzz/fuzz_checkpoint.c).
#define CHECKPOINT_MAX_PARAMS ((int64_t)1 << 48)
// The largest FP8-scales section a header may claim (64 MiB: 1344 bytes per layer today, so far above
// any model); a negative or larger fp8_state_bytes is refused as a corrupt header.
#define CHECKPOINT_MAX_FP8_STATE_BYTES ((int64_t)64 << 20)

typedef struct {
    char magic[8];              // CHECKPOINT_MAGIC
    int32_t version;            // CHECKPOINT_VERSION
    int32_t header_bytes;       // CHECKPOINT_HEADER_BYTES
    // the model: must match to resume
    int32_t num_layers, channels, num_heads, vocab_size, padded_vocab_size, max_seq_len;
    // the data stream: must match to resume (the data position is only meaningful with them)
    int32_t batch_size, seq_len, world_size, shuffle;
    int64_t total_batch_tokens;  // tokens per optimizer step
    uint64_t seed;               // data-order seed (and the init seed of the run)
    int64_t train_tokens;        // tokens in the training shards, a cheap check for "the same data"
    int32_t train_shards;
    int32_t attention_backend;   // AttentionBackend of the run that saved (informational)
    // where the run stands
    int64_t step;                // optimizer steps completed
    int64_t data_epoch, data_shard_index, data_chunk_index;  // DataLoaderState of the next batch
    // the schedule the run was started with (a resume with other values is allowed, and told)
    int64_t max_steps, warmup_steps;
    double lr, min_lr_fraction, weight_decay, grad_clip;
    // the payload
    int64_t num_params;
    uint64_t payload_checksum;
    // ZeRO-1 (zero in files of unsharded runs and of older builds)
    int32_t zero_stage, rank;          // 1: master/adam_m/adam_v hold only this rank's shard
    int64_t shard_offset, shard_size;  // the shard: elements [shard_offset, shard_offset + shard_size)
    // grouped-query attention (zero in files of older builds: those models have num_kv_heads = num_heads;
    // checkpoint_kv_heads reads it that way)
    int32_t num_kv_heads;
    // bytes of the FP8-scales section after the four payload arrays (0: none; was `reserved`, always 0)
    int32_t fp8_state_bytes;
    // --context-parallel N of the run: its world_size GPUs read the data as world_size / N data-parallel
    // ranks, what the data position depends on (0 in files of older builds: N = 1). Then 4 zero bytes, so
    // that the size stays a multiple of 8 (inside the zero-padded header, so older files stay valid).
    int32_t context_parallel;
    int32_t unused;
} CheckpointHeader;

// The layout has no padding (every int64 sits at a multiple of 8), so the bytes are the same on
// every LP64 compiler; scripts read it with struct format CHECKPOINT_STRUCT_FORMAT (data/README.md).
typedef char checkpoint_header_fits[sizeof(CheckpointHeader) == 224 ? 1 : -1];
// the last four: num_kv_heads, fp8_state_bytes, context_parallel, unused
#define CHECKPOINT_STRUCT_FORMAT "<8sii6i4iqQqiiqqqqqqddddqQiiqqiiii"

// The run's --context-parallel N (1 in a file from before context parallelism).
static inline int32_t checkpoint_context_parallel(const CheckpointHeader* h) {
    return h->context_parallel > 0 ? h->context_parallel : 1;
}

// The data-parallel ranks that read the data: world_size / N.
static inline int32_t checkpoint_data_ranks(const CheckpointHeader* h) {
    return h->world_size / checkpoint_context_parallel(h);
}

// The model's key/value heads: num_kv_heads, or num_heads in a file from before grouped-query attention.
static inline int32_t checkpoint_kv_heads(const CheckpointHeader* h) {
    return h->num_kv_heads ? h->num_kv_heads : h->num_heads;
}


static inline int64_t checkpoint_payload_bytes(int64_t num_params) { return num_params * (2 + 4 + 4 + 4); }

// Elements of master, adam_m and adam_v in the file: all parameters, or the rank's shard (ZeRO-1).
static inline int64_t checkpoint_state_elements(const CheckpointHeader* h) {
    return h->zero_stage > 0 ? h->shard_size : h->num_params;
}

// The payload of a file with header h: bf16 weights (num_params) + three fp32 state arrays + the
// FP8-scales section (fp8_state_bytes, 0 when there is none). Everything the checksum covers.
static inline int64_t checkpoint_header_payload_bytes(const CheckpointHeader* h) {
    return h->num_params * 2 + checkpoint_state_elements(h) * 12 + (int64_t)h->fp8_state_bytes;
}

// ---- checksum: FNV-1a style over 8-byte little-endian words, fed in pieces of any size ----------

typedef struct {
    uint64_t hash;
    unsigned char pending[8];
    int num_pending;
    uint64_t total_bytes;
} CheckpointHash;

static inline void checkpoint_hash_init(CheckpointHash* h) {
    memset(h, 0, sizeof(*h));
    h->hash = 0xcbf29ce484222325ull;
}

static inline void checkpoint_hash_word(CheckpointHash* h, uint64_t word) {
    h->hash = (h->hash ^ word) * 0x100000001b3ull;
    h->hash ^= h->hash >> 29;  // FNV's multiply only moves bits up; fold the high bits back down
}

static inline void checkpoint_hash_update(CheckpointHash* h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    h->total_bytes += n;
    while (n > 0 && h->num_pending > 0) {  // complete a word started by an earlier piece
        h->pending[h->num_pending++] = *p++;
        n--;
        if (h->num_pending == 8) {
            uint64_t w;
            memcpy(&w, h->pending, 8);
            checkpoint_hash_word(h, w);
            h->num_pending = 0;
        }
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        checkpoint_hash_word(h, w);
    }
    for (; n > 0; n--) h->pending[h->num_pending++] = *p++;
}

static inline uint64_t checkpoint_hash_final(const CheckpointHash* h) {
    CheckpointHash copy = *h;
    uint64_t w = 0;
    memcpy(&w, copy.pending, (size_t)copy.num_pending);  // the tail, zero-padded
    checkpoint_hash_word(&copy, w);
    checkpoint_hash_word(&copy, copy.total_bytes);     // so trailing zero bytes still count
    return copy.hash;
}

// ---- names ----------------------------------------------------------------------------------------

static inline void checkpoint_path(char* out, size_t out_len, const char* dir, int64_t step) {
    snprintf(out, out_len, "%s/step_%08lld.ckpt", dir, (long long)step);
}

// DIR/step_XXXXXXXX.rankRRofWW.ckpt, rank's file of a sharded (ZeRO-1) step; world <= 0: the plain name.
static inline void checkpoint_path_rank(char* out, size_t out_len, const char* dir, int64_t step, int rank,
                                        int world) {
    if (world <= 0) checkpoint_path(out, out_len, dir, step);
    else snprintf(out, out_len, "%s/step_%08lld.rank%02dof%02d.ckpt", dir, (long long)step, rank, world);
}

static inline const char* checkpoint_parse_digits(const char* p, int64_t* value) {
    int64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (v > (INT64_MAX - 9) / 10) return NULL;
        v = v * 10 + (*p - '0');
    }
    *value = v;
    return digits ? p : NULL;
}

// Parses "step_XXXXXXXX.ckpt" (rank = -1, world = 0) or "step_XXXXXXXX.rankRRofWW.ckpt" (digits
// only, RR < WW); returns the step or -1.
static inline int64_t checkpoint_parse_name(const char* name, int* rank, int* world) {
    *rank = -1, *world = 0;
    if (strncmp(name, "step_", 5) != 0) return -1;
    int64_t step = 0, r = 0, w = 0;
    const char* p = checkpoint_parse_digits(name + 5, &step);
    if (!p) return -1;
    if (strcmp(p, ".ckpt") == 0) return step;
    if (strncmp(p, ".rank", 5) != 0 || !(p = checkpoint_parse_digits(p + 5, &r)) || strncmp(p, "of", 2) != 0 ||
        !(p = checkpoint_parse_digits(p + 2, &w)) || strcmp(p, ".ckpt") != 0 || w < 1 || w > 1 << 20 || r >= w)
        return -1;
    *rank = (int)r, *world = (int)w;
    return step;
}

// The step of a checkpoint file name (plain or one rank's), or -1.
static inline int64_t checkpoint_step_of_name(const char* name) {
    int rank, world;
    return checkpoint_parse_name(name, &rank, &world);
}

// Whether every rank's file of a sharded step exists in DIR.
static inline int checkpoint_step_complete(const char* dir, int64_t step, int world) {
    char path[CHECKPOINT_PATH_MAX];
    struct stat st;
    for (int r = 0; r < world; r++) {
        checkpoint_path_rank(path, sizeof(path), dir, step, r, world);
        if (stat(path, &st) != 0) return 0;
    }
    return 1;
}

// `path` with its rank part set to `rank` (a sharded file name), into out; other names unchanged.
static inline void checkpoint_rank_file(char* out, size_t out_len, const char* path, int rank) {
    const char* slash = strrchr(path, '/');
    const char* base = slash ? slash + 1 : path;
    int r, w;
    int64_t step = checkpoint_parse_name(base, &r, &w);
    if (step < 0 || w == 0) {
        snprintf(out, out_len, "%s", path);
        return;
    }
    snprintf(out, out_len, "%.*sstep_%08lld.rank%02dof%02d.ckpt", (int)(base - path), path, (long long)step, rank,
             w);
}

// The highest complete step of DIR's checkpoints (a step_*.ckpt file, or all WW files of a sharded
// step), its path in `path` (rank 0's file for a sharded step); 0 when DIR has none (or does not
// exist), 1 when found, -1 when DIR cannot be read.
static inline int checkpoint_find_latest(const char* dir, char* path, size_t path_len, int64_t* step,
                                         char* err, size_t err_len) {
    DIR* d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        snprintf(err, err_len, "%s: cannot list the checkpoint directory: %s", dir, strerror(errno));
        return -1;
    }
    int64_t best = -1;
    int best_world = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int rank, world;
        int64_t s = checkpoint_parse_name(e->d_name, &rank, &world);
        if (s <= best || (s >= 0 && world > 0 && !checkpoint_step_complete(dir, s, world))) continue;
        best = s, best_world = world;
    }
    closedir(d);
    if (best < 0) return 0;
    *step = best;
    checkpoint_path_rank(path, path_len, dir, best, 0, best_world);
    return 1;
}

// Deletes DIR's checkpoints of steps other than the `keep` newest steps (every rank's file of a
// sharded step; keep <= 0: keeps all).
static inline void checkpoint_prune(const char* dir, int keep) {
    if (keep <= 0) return;
    DIR* d = opendir(dir);
    if (!d) return;
    int64_t* steps = NULL;  // the distinct steps, newest first
    int n = 0, cap = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = checkpoint_step_of_name(e->d_name);
        int known = s < 0;
        for (int i = 0; i < n && !known; i++) known = steps[i] == s;
        if (known) continue;
        if (n == cap) {
            int64_t* grown = (int64_t*)realloc(steps, sizeof(int64_t) * (size_t)(cap = cap ? 2 * cap : 16));
            if (!grown) break;
            steps = grown;
        }
        int at = n++;
        for (; at > 0 && steps[at - 1] < s; at--) steps[at] = steps[at - 1];
        steps[at] = s;
    }
    closedir(d);
    if (n > keep && (d = opendir(dir)) != NULL) {
        const int64_t newest_pruned = steps[keep];
        while ((e = readdir(d)) != NULL) {
            int64_t s = checkpoint_step_of_name(e->d_name);
            if (s < 0 || s > newest_pruned) continue;
            char path[CHECKPOINT_PATH_MAX];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            remove(path);
        }
        closedir(d);
    }
    free(steps);
}

// Removes the temporary files a killed save leaves in DIR (regular files .step_*.ckpt.tmp, any rank's);
// their names go to `removed` (comma-separated, cut to fit). Returns how many were removed, or -1
// when DIR cannot be read (a DIR that does not exist has none).
static inline int checkpoint_remove_temporaries(const char* dir, char* removed, size_t removed_len) {
    if (removed_len) removed[0] = '\0';
    DIR* d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    int count = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        const size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, ".step_", 6) != 0 || len < 15 || strcmp(e->d_name + len - 9, ".ckpt.tmp") != 0)
            continue;
        char path[CHECKPOINT_PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || unlink(path) != 0) continue;
        const size_t used = strlen(removed);
        if (used + 2 < removed_len) snprintf(removed + used, removed_len - used, "%s%s", count ? ", " : "", e->d_name);
        count++;
    }
    closedir(d);
    return count;
}

// Creates DIR and any missing parent folder (as mkdir -p); 0 when it exists as a directory after.
static inline int checkpoint_make_dir(const char* dir, char* err, size_t err_len) {
    char parent[CHECKPOINT_PATH_MAX];  // its parents first, as mkdir -p (runs/<model>: runs/ too)
    snprintf(parent, sizeof(parent), "%s", dir);
    for (char* slash = strchr(parent + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(parent, 0777) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "%s: cannot create the checkpoint directory: %s: %s", dir, parent, strerror(errno));
            return -1;
        }
        *slash = '/';
    }
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        snprintf(err, err_len, "%s: exists and is not a directory; choose another --checkpoint-dir", dir);
        return -1;
    }
    snprintf(err, err_len, "%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
    return -1;
}

// ---- writing ---------------------------------------------------------------------------------------

typedef struct {
    FILE* file;
    char tmp_path[CHECKPOINT_PATH_MAX], final_path[CHECKPOINT_PATH_MAX], dir[CHECKPOINT_PATH_MAX];
    CheckpointHash hash;
} CheckpointWriter;

static inline int checkpoint_write_fail(CheckpointWriter* w, char* err, size_t err_len, const char* what) {
    snprintf(err, err_len, "%s: %s: %s (the previous checkpoints are untouched)", w->tmp_path, what,
             strerror(errno));
    if (w->file) fclose(w->file);
    w->file = NULL;
    unlink(w->tmp_path);  // a file only: never a directory that happens to have the name
    return -1;
}

// Starts DIR/.step_XXXXXXXX.ckpt.tmp (or .step_XXXXXXXX.rankRRofWW.ckpt.tmp, world > 0: one rank's
// file of a sharded step) with a blank header; the payload follows with _append.
static inline int checkpoint_writer_open_rank(CheckpointWriter* w, const char* dir, int64_t step, int rank,
                                              int world, char* err, size_t err_len) {
    memset(w, 0, sizeof(*w));
    snprintf(w->dir, sizeof(w->dir), "%s", dir);
    checkpoint_path_rank(w->final_path, sizeof(w->final_path), dir, step, rank, world);
    const char* base = strrchr(w->final_path, '/') + 1;
    snprintf(w->tmp_path, sizeof(w->tmp_path), "%s/.%s.tmp", dir, base);
    checkpoint_hash_init(&w->hash);
    w->file = fopen(w->tmp_path, "wb");
    if (!w->file) return checkpoint_write_fail(w, err, err_len, "cannot create");
    static const char zeros[CHECKPOINT_HEADER_BYTES] = {0};
    if (fwrite(zeros, 1, sizeof(zeros), w->file) != sizeof(zeros))
        return checkpoint_write_fail(w, err, err_len, "cannot write");
    return 0;
}

static inline int checkpoint_writer_open(CheckpointWriter* w, const char* dir, int64_t step, char* err,
                                         size_t err_len) {
    return checkpoint_writer_open_rank(w, dir, step, 0, 0, err, err_len);
}

static inline int checkpoint_writer_append(CheckpointWriter* w, const void* data, size_t n, char* err,
                                           size_t err_len) {
    checkpoint_hash_update(&w->hash, data, n);
    if (fwrite(data, 1, n, w->file) != n) return checkpoint_write_fail(w, err, err_len, "cannot write (disk full?)");
    return 0;
}

// Writes the header (with the payload's checksum), flushes to disk and renames into place.
static inline int checkpoint_writer_commit(CheckpointWriter* w, CheckpointHeader header, char* err,
                                           size_t err_len) {
    memcpy(header.magic, CHECKPOINT_MAGIC, 8);
    header.version = CHECKPOINT_VERSION;
    header.header_bytes = CHECKPOINT_HEADER_BYTES;
    header.payload_checksum = checkpoint_hash_final(&w->hash);
    if (header.fp8_state_bytes < 0 || header.fp8_state_bytes > CHECKPOINT_MAX_FP8_STATE_BYTES) {
        errno = EINVAL;
        return checkpoint_write_fail(w, err, err_len, "fp8_state_bytes out of range (a bug)");
    }
    if ((int64_t)w->hash.total_bytes != checkpoint_header_payload_bytes(&header)) {
        errno = EINVAL;
        return checkpoint_write_fail(w, err, err_len, "payload size does not match num_params (a bug)");
    }
    unsigned char block[CHECKPOINT_HEADER_BYTES] = {0};
    memcpy(block, &header, sizeof(header));
    if (fseek(w->file, 0, SEEK_SET) != 0 || fwrite(block, 1, sizeof(block), w->file) != sizeof(block))
        return checkpoint_write_fail(w, err, err_len, "cannot write the header");
    if (fflush(w->file) != 0 || fsync(fileno(w->file)) != 0)
        return checkpoint_write_fail(w, err, err_len, "cannot flush to disk (disk full?)");
    if (fclose(w->file) != 0) {
        w->file = NULL;
        return checkpoint_write_fail(w, err, err_len, "cannot close");
    }
    w->file = NULL;
    if (rename(w->tmp_path, w->final_path) != 0) return checkpoint_write_fail(w, err, err_len, "cannot rename");
    int dir_fd = open(w->dir, O_RDONLY);  // make the rename itself durable
    if (dir_fd >= 0) {
        fsync(dir_fd);
        close(dir_fd);
    }
    return 0;
}

static inline void checkpoint_writer_abort(CheckpointWriter* w) {
    if (w->file) fclose(w->file);
    w->file = NULL;
    unlink(w->tmp_path);
}

// ---- reading ---------------------------------------------------------------------------------------

typedef struct {
    FILE* file;
    char path[CHECKPOINT_PATH_MAX];
    CheckpointHeader header;
    CheckpointHash hash;
} CheckpointReader;

// Opens PATH and checks its header and size; the payload follows with _read, in order.
static inline int checkpoint_reader_open(CheckpointReader* r, const char* path, char* err, size_t err_len) {
    memset(r, 0, sizeof(*r));
    snprintf(r->path, sizeof(r->path), "%s", path);
    checkpoint_hash_init(&r->hash);
    r->file = fopen(path, "rb");
    if (!r->file) {
        snprintf(err, err_len, "%s: cannot open the checkpoint: %s", path, strerror(errno));
        return -1;
    }
    unsigned char block[CHECKPOINT_HEADER_BYTES];
    size_t got = fread(block, 1, sizeof(block), r->file);
    memcpy(&r->header, block, sizeof(r->header));
    const CheckpointHeader* h = &r->header;
    const char* why = NULL;
    char detail[256] = "";
    if (got != sizeof(block) || memcmp(h->magic, CHECKPOINT_MAGIC, 8) != 0) {
        why = "not a train_gpt checkpoint (bad magic or shorter than the header)";
    } else if (h->version != CHECKPOINT_VERSION || h->header_bytes != CHECKPOINT_HEADER_BYTES) {
        snprintf(detail, sizeof(detail), "checkpoint format version %d, this build reads version %d",
                 (int)h->version, CHECKPOINT_VERSION);
        why = detail;
    } else if (h->num_params <= 0 || h->num_params > CHECKPOINT_MAX_PARAMS || h->step < 0) {
        why = "corrupt header (num_params or step out of range)";
    } else if (h->zero_stage < 0 || h->zero_stage > 1 ||
               (h->zero_stage == 1 && (h->world_size < 1 || h->rank < 0 || h->rank >= h->world_size ||
                                       h->shard_size <= 0 || h->shard_size > CHECKPOINT_MAX_PARAMS / h->world_size ||
                                       h->shard_offset != (int64_t)h->rank * h->shard_size ||
                                       h->shard_size * h->world_size < h->num_params))) {
        why = "corrupt header (zero_stage, rank or shard out of range)";
    } else if (h->context_parallel < 0 || h->world_size < 1 || h->world_size % checkpoint_context_parallel(h) != 0) {
        why = "corrupt header (context_parallel does not divide world_size)";
    } else if (h->num_kv_heads < 0 || h->num_heads < 1 || h->num_heads % checkpoint_kv_heads(h) != 0) {
        why = "corrupt header (num_kv_heads does not divide num_heads)";
    } else if (h->fp8_state_bytes < 0 || h->fp8_state_bytes > CHECKPOINT_MAX_FP8_STATE_BYTES) {
        snprintf(detail, sizeof(detail),
                 "corrupt header (fp8_state_bytes %d: an FP8-scales section must be 0 to %lld bytes)",
                 (int)h->fp8_state_bytes, (long long)CHECKPOINT_MAX_FP8_STATE_BYTES);
        why = detail;
    } else {
        long size = -1;
        if (fseek(r->file, 0, SEEK_END) == 0) size = ftell(r->file);
        const int64_t want = CHECKPOINT_HEADER_BYTES + checkpoint_header_payload_bytes(h);
        if (size != (long)want) {
            char section[96] = "";
            if (h->fp8_state_bytes > 0)
                snprintf(section, sizeof(section), " (the payload and a %d-byte FP8-scales section)",
                         (int)h->fp8_state_bytes);
            snprintf(detail, sizeof(detail), "file is %ld bytes but its header says %lld%s: truncated or corrupt",
                     size, (long long)want, section);
            why = detail;
        } else if (fseek(r->file, CHECKPOINT_HEADER_BYTES, SEEK_SET) != 0) {
            why = "cannot seek";
        }
    }
    if (why) {
        snprintf(err, err_len, "%s: %s", path, why);
        fclose(r->file);
        r->file = NULL;
        return -1;
    }
    return 0;
}

static inline int checkpoint_reader_read(CheckpointReader* r, void* data, size_t n, char* err, size_t err_len) {
    if (fread(data, 1, n, r->file) != n) {
        snprintf(err, err_len, "%s: cannot read the payload: %s", r->path,
                 ferror(r->file) ? strerror(errno) : "unexpected end of file");
        return -1;
    }
    checkpoint_hash_update(&r->hash, data, n);
    return 0;
}

// Closes and checks the checksum over everything read (call after reading the whole payload).
static inline int checkpoint_reader_finish(CheckpointReader* r, char* err, size_t err_len) {
    fclose(r->file);
    r->file = NULL;
    if ((int64_t)r->hash.total_bytes != checkpoint_header_payload_bytes(&r->header)) {
        snprintf(err, err_len, "%s: only part of the payload was read (a bug)", r->path);
        return -1;
    }
    if (checkpoint_hash_final(&r->hash) != r->header.payload_checksum) {
        snprintf(err, err_len, "%s: checksum mismatch: the file is corrupt; resume from an earlier checkpoint",
                 r->path);
        return -1;
    }
    return 0;
}

static inline void checkpoint_reader_close(CheckpointReader* r) {
    if (r->file) fclose(r->file);
    r->file = NULL;
}

#endif  // CHECKPOINT_H
