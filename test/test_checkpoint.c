// test_checkpoint.c: tests of data/checkpoint.h (training checkpoints) and data/model_file.h
// (llm.c weight files) on files written here, with random contents fresh each run.
//
// Round trips must give back every byte and header field; a flipped payload byte must fail the
// checksum; truncated, padded or foreign files must be refused at open with the reason; a save
// leaves no temporary file and an aborted one leaves nothing; the newest checkpoint is found by
// step, and pruning keeps exactly the newest N. The FP8-scales section (header.fp8_state_bytes) is
// part of the payload: it round-trips (plain and ZeRO-1), the checksum covers it, a file that lacks
// it and a negative or huge size are refused at open, and a file without one (0, as every older
// file) reads as before. The checksum does not cover the header, so each of open's header checks
// (sizes, step, ZeRO-1 shard, heads) gets a file that only that check can refuse; the checksum's
// value for fixed bytes is pinned (it is part of the on-disk format). Model files: each header check
// likewise, and the value widths (4 bytes fp32, 2 bf16) that fix the file size.
#define _POSIX_C_SOURCE 200809L  // mkdtemp, opendir, unlink under -std=c11

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/checkpoint.h"
#include "data/model_file.h"
#include "test/test_harness.h"

#define ERR_LEN (CHECKPOINT_PATH_MAX + 512)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
// An FP8-scales section as a 3-layer fp8 model saves it: 3 layers x 4 linears x 3 roles x 112 bytes.
#define FP8_TEST_BYTES (3 * 4 * 3 * 112)
// Where fp8_state_bytes lies in the file (scripts/hf_gpt2.py reads it there: the header's last int32).
#define FP8_FIELD_AT 212
typedef char fp8_field_at_212[offsetof(CheckpointHeader, fp8_state_bytes) == FP8_FIELD_AT ? 1 : -1];

static char g_dir[256];
static TestRng g_rng;

static int count_files(const char* dir, const char* prefix) {
    DIR* d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static void remove_all(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* e;
    char path[CHECKPOINT_PATH_MAX + 300];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static void fill_random(unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)test_rng_next(&g_rng);
}

static CheckpointHeader random_header(int64_t step, int64_t num_params) {
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.num_layers = 2 + (int)(test_rng_next(&g_rng) % 5);
    h.channels = 64;
    h.num_heads = 1;
    h.vocab_size = 50257;
    h.padded_vocab_size = 50304;
    h.max_seq_len = 1 + (int)(test_rng_next(&g_rng) % 1000);
    h.batch_size = 4;
    h.seq_len = h.max_seq_len;
    h.world_size = 1;
    h.total_batch_tokens = (int64_t)h.batch_size * h.seq_len * 3;
    h.seed = test_rng_next(&g_rng);
    h.train_tokens = (int64_t)(test_rng_next(&g_rng) >> 20);
    h.train_shards = 3;
    h.step = step;
    h.data_epoch = 2;
    h.data_shard_index = 1;
    h.data_chunk_index = (int64_t)(test_rng_next(&g_rng) % 77);
    h.max_steps = 1000;
    h.lr = 3e-4;
    h.min_lr_fraction = 0.1;
    h.weight_decay = 0.1;
    h.grad_clip = 1.0;
    h.num_params = num_params;
    return h;
}

// Writes a checkpoint of `payload` in pieces of random size; returns 0 on success.
static int save(const char* dir, CheckpointHeader h, const unsigned char* payload, char* err) {
    CheckpointWriter w;
    if (checkpoint_writer_open(&w, dir, h.step, err, ERR_LEN) != 0) return -1;
    size_t total = (size_t)checkpoint_header_payload_bytes(&h), done = 0;  // the FP8 section too
    while (done < total) {
        size_t n = 1 + (size_t)(test_rng_next(&g_rng) % 4099);
        if (n > total - done) n = total - done;
        if (checkpoint_writer_append(&w, payload + done, n, err, ERR_LEN) != 0) return -1;
        done += n;
    }
    return checkpoint_writer_commit(&w, h, err, ERR_LEN);
}

// Reads a checkpoint back whole; returns 0 when open, read and checksum all succeed.
static int load(const char* path, CheckpointHeader* h, unsigned char* payload, size_t cap, char* err) {
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, ERR_LEN) != 0) return -1;
    *h = r.header;
    size_t total = (size_t)checkpoint_header_payload_bytes(&r.header);
    if (total > cap) {
        checkpoint_reader_close(&r);
        snprintf(err, ERR_LEN, "payload larger than expected");
        return -1;
    }
    size_t done = 0;
    while (done < total) {
        size_t n = 1 + (size_t)(test_rng_next(&g_rng) % 5003);
        if (n > total - done) n = total - done;
        if (checkpoint_reader_read(&r, payload + done, n, err, ERR_LEN) != 0) {
            checkpoint_reader_close(&r);
            return -1;
        }
        done += n;
    }
    return checkpoint_reader_finish(&r, err, ERR_LEN);
}

static void test_hash_pieces_and_sensitivity(void) {
    const char* name = "checkpoint_hash_piece_sizes_and_single_bit_flips";
    unsigned char data[10007];
    fill_random(data, sizeof(data));
    CheckpointHash whole;
    checkpoint_hash_init(&whole);
    checkpoint_hash_update(&whole, data, sizeof(data));
    const uint64_t want = checkpoint_hash_final(&whole);
    for (int trial = 0; trial < 20; trial++) {
        CheckpointHash h;
        checkpoint_hash_init(&h);
        for (size_t done = 0; done < sizeof(data);) {
            size_t n = (size_t)(test_rng_next(&g_rng) % 23);
            if (n > sizeof(data) - done) n = sizeof(data) - done;
            checkpoint_hash_update(&h, data + done, n);
            done += n;
        }
        if (checkpoint_hash_final(&h) != want) {
            test_fail(name, "hash depends on how the bytes are split (trial %d)", trial);
            return;
        }
    }
    for (int trial = 0; trial < 200; trial++) {
        size_t byte = (size_t)(test_rng_next(&g_rng) % sizeof(data));
        int bit = (int)(test_rng_next(&g_rng) % 8);
        data[byte] ^= (unsigned char)(1u << bit);
        CheckpointHash h;
        checkpoint_hash_init(&h);
        checkpoint_hash_update(&h, data, sizeof(data));
        data[byte] ^= (unsigned char)(1u << bit);
        if (checkpoint_hash_final(&h) == want) {
            test_fail(name, "flipping bit %d of byte %zu leaves the hash unchanged", bit, byte);
            return;
        }
    }
    CheckpointHash longer;  // one more zero byte must change the hash too
    checkpoint_hash_init(&longer);
    checkpoint_hash_update(&longer, data, sizeof(data));
    checkpoint_hash_update(&longer, "\0", 1);
    test_report(name, checkpoint_hash_final(&longer) != want, "a trailing zero byte leaves the hash unchanged");
}

// The checksum is part of the on-disk format: every saved checkpoint stores it, so its value for given
// bytes must never change (a change would make every existing checkpoint fail to load). The golden
// value, of the bytes 0..12 (a whole word and a 5-byte tail), was computed once from this code.
static void test_hash_golden(void) {
    const char* name = "checkpoint_hash_pins_the_on_disk_format";
    unsigned char bytes[13];
    for (int i = 0; i < 13; i++) bytes[i] = (unsigned char)i;
    CheckpointHash h;
    checkpoint_hash_init(&h);
    checkpoint_hash_update(&h, bytes, sizeof(bytes));
    const uint64_t got = checkpoint_hash_final(&h);
    // a lone random byte, with and without a zero after it: the same zero-padded word, so only the
    // byte count folded in at the end tells them apart
    unsigned char one[2] = {(unsigned char)test_rng_next(&g_rng), 0};
    CheckpointHash a, b;
    checkpoint_hash_init(&a);
    checkpoint_hash_update(&a, one, 1);
    checkpoint_hash_init(&b);
    checkpoint_hash_update(&b, one, 2);
    const int differ = checkpoint_hash_final(&a) != checkpoint_hash_final(&b);
    test_report(name, got == 0x64aec3700156e38eull && differ,
                "hash of bytes 0..12 is 0x%016llx (want 0x64aec3700156e38e); byte %d and byte %d + zero %s",
                (unsigned long long)got, one[0], one[0], differ ? "differ" : "hash the same");
}

static void test_round_trip(void) {
    const char* name = "checkpoint_round_trip_keeps_every_byte_and_field";
    char err[ERR_LEN];
    const int64_t num_params = 1000 + (int64_t)(test_rng_next(&g_rng) % 3000);
    const size_t bytes = (size_t)checkpoint_payload_bytes(num_params);
    unsigned char* payload = (unsigned char*)malloc(bytes);
    unsigned char* back = (unsigned char*)malloc(bytes);
    fill_random(payload, bytes);
    memset(back, 0xAB, bytes);
    CheckpointHeader h = random_header(42, num_params), got;
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path(path, sizeof(path), g_dir, 42);
    if (save(g_dir, h, payload, err) != 0) test_fail(name, "save: %s", err);
    else if (load(path, &got, back, bytes, err) != 0) test_fail(name, "load: %s", err);
    else if (memcmp(payload, back, bytes) != 0) test_fail(name, "payload differs after the round trip");
    else if (got.step != 42 || got.num_layers != h.num_layers || got.seed != h.seed || got.lr != h.lr ||
             got.data_chunk_index != h.data_chunk_index || got.train_tokens != h.train_tokens ||
             got.num_params != num_params || got.version != CHECKPOINT_VERSION)
        test_fail(name, "a header field differs after the round trip");
    else if (count_files(g_dir, ".step_") != 0) test_fail(name, "a temporary file is left behind");
    else test_pass(name);
    remove_all(g_dir);
    free(payload);
    free(back);
}

// Writes a good checkpoint (with an FP8-scales section of fp8_bytes, 0: none), damages it with
// `damage`, and expects `phase` ("open" or "finish") to fail with an error containing `word`.
static void expect_refused(const char* name, void (*damage)(const char* path), const char* phase, const char* word,
                           int fp8_bytes) {
    char err[ERR_LEN] = "";
    const int64_t num_params = 777;
    CheckpointHeader h = random_header(7, num_params);
    h.fp8_state_bytes = fp8_bytes;
    const size_t bytes = (size_t)checkpoint_header_payload_bytes(&h);
    unsigned char* payload = (unsigned char*)malloc(bytes);
    fill_random(payload, bytes);
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path(path, sizeof(path), g_dir, 7);
    if (save(g_dir, h, payload, err) != 0) {
        test_fail(name, "save: %s", err);
    } else {
        damage(path);
        CheckpointReader r;
        int opened = checkpoint_reader_open(&r, path, err, ERR_LEN) == 0;
        if (opened) {
            // what the (damaged) header says, as train_gpt reads it; more than was written: not read
            const size_t claimed = (size_t)checkpoint_header_payload_bytes(&r.header);
            int read_ok = claimed <= bytes && checkpoint_reader_read(&r, payload, claimed, err, ERR_LEN) == 0;
            if (claimed > bytes) snprintf(err, ERR_LEN, "opened, claiming %zu payload bytes", claimed);
            int finished = read_ok && checkpoint_reader_finish(&r, err, ERR_LEN) == 0;
            checkpoint_reader_close(&r);
            if (finished) test_fail(name, "the damaged checkpoint was accepted");
            else if (strcmp(phase, "finish") != 0) test_fail(name, "refused only after reading: %s", err);
            else test_report(name, strstr(err, word) != NULL && strstr(err, path) != NULL, "error lacks %s: %s", word, err);
        } else {
            if (strcmp(phase, "open") != 0) test_fail(name, "refused at open, expected later: %s", err);
            else test_report(name, strstr(err, word) != NULL && strstr(err, path) != NULL, "error lacks %s: %s", word, err);
        }
    }
    remove_all(g_dir);
    free(payload);
}

static void flip_payload_byte(const char* path) {  // in the four arrays
    FILE* f = fopen(path, "r+b");
    long at = CHECKPOINT_HEADER_BYTES + (long)(test_rng_next(&g_rng) % checkpoint_payload_bytes(777));
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}
// Cuts the file to `bytes`; a failure here is the test's own, so it stops the run with the reason
// (a file left whole would make the refusal cases below fail for the wrong reason).
static void truncate_or_exit(const char* path, off_t bytes) {
    if (truncate(path, bytes) != 0) {
        fprintf(stderr, "test_checkpoint: cannot truncate %s: %s\n", path, strerror(errno));
        exit(1);
    }
}
static void truncate_file(const char* path) { truncate_or_exit(path, CHECKPOINT_HEADER_BYTES + 100); }
// The FP8 damages: the file of expect_refused has 777 parameters (and FP8_TEST_BYTES of section, or none).
static const off_t ARRAYS_END = CHECKPOINT_HEADER_BYTES + 777 * 14;
static void flip_fp8_section_byte(const char* path) {
    FILE* f = fopen(path, "r+b");
    long at = (long)ARRAYS_END + (long)(test_rng_next(&g_rng) % FP8_TEST_BYTES);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}
static void cut_fp8_section(const char* path) { truncate_or_exit(path, ARRAYS_END + FP8_TEST_BYTES / 2); }
// Sets fp8_state_bytes and sizes the file to match it, so that only the range check can refuse it.
static void set_fp8_state_bytes(const char* path, int32_t value) {
    FILE* f = fopen(path, "r+b");
    fseek(f, FP8_FIELD_AT, SEEK_SET);
    fwrite(&value, 4, 1, f);
    fclose(f);
    truncate_or_exit(path, ARRAYS_END + value);  // larger: a sparse file, nothing written
}
static void negative_fp8_state_bytes(const char* path) { set_fp8_state_bytes(path, -56); }
static void huge_fp8_state_bytes(const char* path) {
    set_fp8_state_bytes(path, (int32_t)CHECKPOINT_MAX_FP8_STATE_BYTES + 8);
}
// --context-parallel 2 in the header of a file of one GPU (world_size 1): N must divide the GPUs.
static void context_parallel_not_dividing_world(const char* path) {
    FILE* f = fopen(path, "r+b");
    const int32_t n = 2;
    fseek(f, (long)offsetof(CheckpointHeader, context_parallel), SEEK_SET);
    fwrite(&n, 4, 1, f);
    fclose(f);
}
static void append_byte(const char* path) {
    FILE* f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
}
static void break_magic(const char* path) {
    FILE* f = fopen(path, "r+b");
    fputc('X', f);
    fclose(f);
}
static void bump_version(const char* path) {
    FILE* f = fopen(path, "r+b");
    int32_t v = CHECKPOINT_VERSION + 1;
    fseek(f, 8, SEEK_SET);
    fwrite(&v, 4, 1, f);
    fclose(f);
}

// Header fields set in place. The payload checksum does not cover the header, so only open's header
// checks stand between such a file and a resume.
static void patch_i32(const char* path, size_t at, int32_t value) {
    FILE* f = fopen(path, "r+b");
    fseek(f, (long)at, SEEK_SET);
    fwrite(&value, 4, 1, f);
    fclose(f);
}
static void patch_i64(const char* path, size_t at, int64_t value) {
    FILE* f = fopen(path, "r+b");
    fseek(f, (long)at, SEEK_SET);
    fwrite(&value, 8, 1, f);
    fclose(f);
}
// A header of another size is another format, even with this version number.
static void header_bytes_2048(const char* path) { patch_i32(path, offsetof(CheckpointHeader, header_bytes), 2048); }
static void negative_step(const char* path) { patch_i64(path, offsetof(CheckpointHeader, step), -1); }
// num_params 0 with the file cut to the bare header, so that the size check agrees with it.
static void zero_params(const char* path) {
    patch_i64(path, offsetof(CheckpointHeader, num_params), 0);
    truncate_or_exit(path, CHECKPOINT_HEADER_BYTES);
}
// One past the limit: a larger claim could overflow the int64 sizes computed from it.
static void too_many_params(const char* path) {
    patch_i64(path, offsetof(CheckpointHeader, num_params), CHECKPOINT_MAX_PARAMS + 1);
}
static void zero_world_size(const char* path) { patch_i32(path, offsetof(CheckpointHeader, world_size), 0); }
// 4 query heads cannot share 3 key/value heads.
static void kv_heads_not_dividing(const char* path) {
    patch_i32(path, offsetof(CheckpointHeader, num_heads), 4);
    patch_i32(path, offsetof(CheckpointHeader, num_kv_heads), 3);
}
// Makes the 777-parameter file one rank's file of a 2-rank ZeRO-1 step with this shard, cut to the
// size such a header claims, so that only the shard checks can refuse it (rank 1, offset 777, shard
// 777 would be a valid one).
static void make_sharded(const char* path, int32_t rank, int64_t shard_offset, int64_t shard_size) {
    patch_i32(path, offsetof(CheckpointHeader, zero_stage), 1);
    patch_i32(path, offsetof(CheckpointHeader, world_size), 2);
    patch_i32(path, offsetof(CheckpointHeader, rank), rank);
    patch_i64(path, offsetof(CheckpointHeader, shard_offset), shard_offset);
    patch_i64(path, offsetof(CheckpointHeader, shard_size), shard_size);
    truncate_or_exit(path, CHECKPOINT_HEADER_BYTES + 777 * 2 + shard_size * 12);
}
static void rank_equal_to_world(const char* path) { make_sharded(path, 2, 2 * 777, 777); }
static void shard_offset_of_rank_0(const char* path) { make_sharded(path, 1, 0, 777); }
// 2 x 388 = 776 elements cannot hold 777 parameters (389 could).
static void shards_too_small(const char* path) { make_sharded(path, 1, 388, 388); }

// Finishing after reading only part of the payload is the caller's bug, told as such (not as a
// corrupt file, which would send the user to an older checkpoint for nothing).
static void test_finish_after_part(void) {
    const char* name = "checkpoint_finish_before_the_whole_payload_is_a_bug";
    char err[ERR_LEN] = "", path[CHECKPOINT_PATH_MAX];
    const int64_t num_params = 100 + (int64_t)(test_rng_next(&g_rng) % 900);
    CheckpointHeader h = random_header(8, num_params);
    const size_t bytes = (size_t)checkpoint_payload_bytes(num_params);
    unsigned char* payload = (unsigned char*)malloc(bytes);
    fill_random(payload, bytes);
    checkpoint_path(path, sizeof(path), g_dir, 8);
    const size_t part = 1 + (size_t)(test_rng_next(&g_rng) % (bytes - 1));  // at least 1 byte short
    CheckpointReader r;
    int ok = save(g_dir, h, payload, err) == 0 && checkpoint_reader_open(&r, path, err, ERR_LEN) == 0;
    if (ok) {
        ok = checkpoint_reader_read(&r, payload, part, err, ERR_LEN) == 0 &&
             checkpoint_reader_finish(&r, err, ERR_LEN) != 0 && strstr(err, "only part of the payload") != NULL;
        checkpoint_reader_close(&r);
    }
    test_report(name, ok, "read %zu of %zu bytes: %s", part, bytes, err);
    remove_all(g_dir);
    free(payload);
}

// Each damage of a good checkpoint (with an FP8 section of fp8_bytes, or none), the phase that must
// refuse it and a word of the error.
static const struct {
    const char* name;
    void (*damage)(const char* path);
    const char* phase;
    const char* word;
    int fp8_bytes;
} REFUSALS[] = {
    {"checkpoint_flipped_payload_byte_fails_the_checksum", flip_payload_byte, "finish", "checksum", 0},
    {"checkpoint_truncated_is_refused_at_open", truncate_file, "open", "truncated", 0},
    {"checkpoint_extra_byte_is_refused_at_open", append_byte, "open", "truncated or corrupt", 0},
    {"checkpoint_bad_magic_is_refused_at_open", break_magic, "open", "not a train_gpt checkpoint", 0},
    {"checkpoint_newer_version_is_refused_at_open", bump_version, "open", "version", 0},
    {"checkpoint_fp8_section_flipped_byte_fails_the_checksum", flip_fp8_section_byte, "finish", "checksum",
     FP8_TEST_BYTES},
    {"checkpoint_fp8_section_cut_short_is_refused_at_open", cut_fp8_section, "open", "FP8-scales section",
     FP8_TEST_BYTES},
    {"checkpoint_negative_fp8_state_bytes_is_refused_at_open", negative_fp8_state_bytes, "open",
     "corrupt header (fp8_state_bytes -56", 0},
    {"checkpoint_huge_fp8_state_bytes_is_refused_at_open", huge_fp8_state_bytes, "open",
     "corrupt header (fp8_state_bytes 67108872", 0},
    {"checkpoint_context_parallel_not_dividing_the_gpus_is_refused_at_open", context_parallel_not_dividing_world,
     "open", "context_parallel does not divide world_size", 0},
    {"checkpoint_other_header_size_is_refused_at_open", header_bytes_2048, "open", "version", 0},
    {"checkpoint_negative_step_is_refused_at_open", negative_step, "open", "num_params or step out of range", 0},
    {"checkpoint_zero_params_is_refused_at_open", zero_params, "open", "num_params or step out of range", 0},
    {"checkpoint_too_many_params_is_refused_at_open", too_many_params, "open", "num_params or step out of range", 0},
    {"checkpoint_zero_world_size_is_refused_at_open", zero_world_size, "open",
     "context_parallel does not divide world_size", 0},
    {"checkpoint_kv_heads_not_dividing_heads_is_refused_at_open", kv_heads_not_dividing, "open",
     "num_kv_heads does not divide num_heads", 0},
    {"checkpoint_sharded_rank_equal_to_world_is_refused_at_open", rank_equal_to_world, "open",
     "zero_stage, rank or shard out of range", 0},
    {"checkpoint_sharded_wrong_shard_offset_is_refused_at_open", shard_offset_of_rank_0, "open",
     "zero_stage, rank or shard out of range", 0},
    {"checkpoint_sharded_shards_too_small_is_refused_at_open", shards_too_small, "open",
     "zero_stage, rank or shard out of range", 0},
};

static void test_refusals(void) {
    for (size_t i = 0; i < COUNT(REFUSALS); i++)
        expect_refused(REFUSALS[i].name, REFUSALS[i].damage, REFUSALS[i].phase, REFUSALS[i].word,
                       REFUSALS[i].fp8_bytes);
}

// The size of the file at `path`, or -1.
static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// The FP8-scales section round-trips: its bytes (and the arrays') come back with the checksum passing
// and the file exactly header + arrays + section; the same for one rank's file of a ZeRO-1 step
// (every rank's file holds the whole section).
static void test_fp8_section_round_trips(void) {
    const char* name = "checkpoint_fp8_section_round_trip_keeps_every_byte";
    char err[ERR_LEN] = "", path[CHECKPOINT_PATH_MAX];
    const int64_t num_params = 500 + (int64_t)(test_rng_next(&g_rng) % 2000);
    CheckpointHeader h = random_header(12, num_params), got;
    h.fp8_state_bytes = FP8_TEST_BYTES;
    const size_t bytes = (size_t)checkpoint_header_payload_bytes(&h);
    unsigned char* payload = (unsigned char*)malloc(bytes);
    unsigned char* back = (unsigned char*)malloc(bytes);
    fill_random(payload, bytes);
    memset(back, 0xAB, bytes);
    checkpoint_path(path, sizeof(path), g_dir, 12);
    const long want_size = CHECKPOINT_HEADER_BYTES + (long)num_params * 14 + FP8_TEST_BYTES;
    if (bytes != (size_t)num_params * 14 + FP8_TEST_BYTES)
        test_fail(name, "payload bytes %zu leave out the section", bytes);
    else if (save(g_dir, h, payload, err) != 0) test_fail(name, "save: %s", err);
    else if (file_size(path) != want_size) test_fail(name, "file is %ld bytes, want %ld", file_size(path), want_size);
    else if (load(path, &got, back, bytes, err) != 0) test_fail(name, "load: %s", err);
    else if (got.fp8_state_bytes != FP8_TEST_BYTES)
        test_fail(name, "fp8_state_bytes %d after the round trip", got.fp8_state_bytes);
    else if (memcmp(payload, back, bytes) != 0) test_fail(name, "payload or section differs after the round trip");
    else test_pass(name);
    remove_all(g_dir);

    name = "checkpoint_fp8_section_sharded_round_trip";  // rank 0 of 3: params (all), 3 x shard, section
    h = random_header(40, 101);
    h.world_size = 3, h.zero_stage = 1, h.rank = 0, h.shard_size = 40, h.shard_offset = 0;
    h.fp8_state_bytes = FP8_TEST_BYTES;
    const size_t sharded = (size_t)checkpoint_header_payload_bytes(&h);
    CheckpointWriter w;
    CheckpointReader r;
    memset(back, 0xAB, bytes);
    char p[CHECKPOINT_PATH_MAX];
    checkpoint_path_rank(p, sizeof(p), g_dir, 40, 0, 3);
    int ok = sharded == 101 * 2 + 40 * 12 + FP8_TEST_BYTES && sharded <= bytes &&
             checkpoint_writer_open_rank(&w, g_dir, 40, 0, 3, err, ERR_LEN) == 0 &&
             checkpoint_writer_append(&w, payload, sharded, err, ERR_LEN) == 0 &&
             checkpoint_writer_commit(&w, h, err, ERR_LEN) == 0 &&
             file_size(p) == CHECKPOINT_HEADER_BYTES + (long)sharded &&
             checkpoint_reader_open(&r, p, err, ERR_LEN) == 0;
    if (ok) {
        ok = r.header.fp8_state_bytes == FP8_TEST_BYTES &&
             checkpoint_reader_read(&r, back, sharded, err, ERR_LEN) == 0 &&
             checkpoint_reader_finish(&r, err, ERR_LEN) == 0 && memcmp(back, payload, sharded) == 0;
        checkpoint_reader_close(&r);
    }
    test_report(name, ok, "payload %zu bytes (want %d), file %ld bytes: %s", sharded,
                101 * 2 + 40 * 12 + FP8_TEST_BYTES, file_size(p), err);
    remove_all(g_dir);
    free(payload);
    free(back);
}

// A file without an FP8 section (0, what bf16 runs and every build before the section write) holds
// zeros in the field's bytes, is exactly header + arrays, and reads as before.
static void test_fp8_section_absent(void) {
    const char* name = "checkpoint_without_fp8_section_reads_as_before";
    char err[ERR_LEN] = "", path[CHECKPOINT_PATH_MAX];
    const int64_t num_params = 500 + (int64_t)(test_rng_next(&g_rng) % 2000);
    CheckpointHeader h = random_header(13, num_params), got;
    const size_t plain = (size_t)checkpoint_payload_bytes(num_params);
    unsigned char* payload = (unsigned char*)malloc(plain);
    unsigned char* back = (unsigned char*)malloc(plain);
    fill_random(payload, plain);
    memset(back, 0xAB, plain);
    checkpoint_path(path, sizeof(path), g_dir, 13);
    unsigned char field[4] = {1, 1, 1, 1};
    int ok = save(g_dir, h, payload, err) == 0;
    FILE* f = ok ? fopen(path, "rb") : NULL;
    if (f) {
        ok = fseek(f, FP8_FIELD_AT, SEEK_SET) == 0 && fread(field, 1, 4, f) == 4;
        fclose(f);
    }
    ok = ok && field[0] == 0 && field[1] == 0 && field[2] == 0 && field[3] == 0 &&
         file_size(path) == CHECKPOINT_HEADER_BYTES + (long)plain &&
         (size_t)checkpoint_header_payload_bytes(&h) == plain && load(path, &got, back, plain, err) == 0 &&
         got.fp8_state_bytes == 0 && memcmp(payload, back, plain) == 0;
    test_report(name, ok, "bytes %d-%d: %d %d %d %d (zeros expected), file %ld bytes (want %ld): %s", FP8_FIELD_AT,
                FP8_FIELD_AT + 3, field[0], field[1], field[2], field[3], file_size(path),
                (long)(CHECKPOINT_HEADER_BYTES + plain), err);
    remove_all(g_dir);
    free(payload);
    free(back);
}

// The writer refuses (as a bug, leaving no file) a header whose fp8_state_bytes does not match what
// was appended, or is out of range.
static void test_fp8_section_commit_checks(void) {
    const char* name = "checkpoint_commit_refuses_a_wrong_fp8_state_bytes";
    char err[ERR_LEN] = "";
    const int64_t num_params = 1000;
    const size_t plain = (size_t)checkpoint_payload_bytes(num_params);
    unsigned char* payload = (unsigned char*)malloc(plain + FP8_TEST_BYTES);
    fill_random(payload, plain + FP8_TEST_BYTES);
    const int32_t wrong[] = {FP8_TEST_BYTES, -(int32_t)FP8_TEST_BYTES, (int32_t)CHECKPOINT_MAX_FP8_STATE_BYTES + 1};
    int ok = 1;
    for (size_t i = 0; i < COUNT(wrong) && ok; i++) {
        CheckpointHeader h = random_header(14, num_params);
        h.fp8_state_bytes = wrong[i];
        // a section claimed but not written; a negative size with as many bytes fewer appended (the sizes
        // agree: only the range check refuses it); a size over the limit
        const size_t n = i == 0 ? plain : i == 1 ? plain - FP8_TEST_BYTES : plain + FP8_TEST_BYTES;
        CheckpointWriter w;
        err[0] = '\0';
        ok = checkpoint_writer_open(&w, g_dir, 14, err, ERR_LEN) == 0 &&
             checkpoint_writer_append(&w, payload, n, err, ERR_LEN) == 0 &&
             checkpoint_writer_commit(&w, h, err, ERR_LEN) != 0 &&
             strstr(err, i == 0 ? "payload size does not match" : "fp8_state_bytes out of range") != NULL &&
             count_files(g_dir, "") == 2;  // nothing left behind
        if (!ok) snprintf(err + strlen(err), ERR_LEN - strlen(err), " (fp8_state_bytes %d)", (int)wrong[i]);
    }
    test_report(name, ok, "a header whose fp8_state_bytes does not match the payload was committed or left a file: %s",
                err);
    remove_all(g_dir);
    free(payload);
}

static void test_latest_and_prune(void) {
    const char* name = "checkpoint_find_latest_and_prune_keep_the_newest";
    char err[ERR_LEN], path[CHECKPOINT_PATH_MAX];
    int64_t step = -1;
    if (checkpoint_find_latest(g_dir, path, sizeof(path), &step, err, sizeof(err)) != 0) {
        test_fail(name, "an empty directory reports a checkpoint");
        return;
    }
    const int64_t steps[] = {5, 100, 20, 9, 1000};
    const int64_t num_params = 10;
    unsigned char payload[140];
    fill_random(payload, sizeof(payload));
    for (int i = 0; i < 5; i++)
        if (save(g_dir, random_header(steps[i], num_params), payload, err) != 0) {
            test_fail(name, "save: %s", err);
            return;
        }
    char other[CHECKPOINT_PATH_MAX + 64];  // names that are not checkpoints must be ignored
    snprintf(other, sizeof(other), "%s/.step_00099999.ckpt.tmp", g_dir);
    FILE* f = fopen(other, "wb");
    if (f) fclose(f);
    snprintf(other, sizeof(other), "%s/step_99999.ckpt.bak", g_dir);
    f = fopen(other, "wb");
    if (f) fclose(f);
    char want[CHECKPOINT_PATH_MAX];
    checkpoint_path(want, sizeof(want), g_dir, 1000);
    int found = checkpoint_find_latest(g_dir, path, sizeof(path), &step, err, sizeof(err));
    if (found != 1 || step != 1000 || strcmp(path, want) != 0) {
        test_fail(name, "found %d, step %lld, path %s (want step 1000)", found, (long long)step, path);
        return;
    }
    checkpoint_prune(g_dir, 2);
    CheckpointHeader h;
    unsigned char back[140];
    char p100[CHECKPOINT_PATH_MAX], p20[CHECKPOINT_PATH_MAX];
    checkpoint_path(p100, sizeof(p100), g_dir, 100);
    checkpoint_path(p20, sizeof(p20), g_dir, 20);
    int ok = count_files(g_dir, "step_") == 3  // the two newest and the .bak decoy
             && load(want, &h, back, sizeof(back), err) == 0 && load(p100, &h, back, sizeof(back), err) == 0 &&
             access(p20, F_OK) != 0;
    test_report(name, ok, "after pruning to 2: %d step_ files; newest two loadable and step 20 gone expected",
                count_files(g_dir, "step_"));
    remove_all(g_dir);
}

static void test_names(void) {
    const char* name = "checkpoint_step_of_name_accepts_only_step_digits_ckpt";
    int ok = checkpoint_step_of_name("step_00000012.ckpt") == 12 && checkpoint_step_of_name("step_7.ckpt") == 7 &&
             checkpoint_step_of_name(".step_00000012.ckpt.tmp") == -1 &&
             checkpoint_step_of_name("step_00000012.ckpt.tmp") == -1 && checkpoint_step_of_name("step_.ckpt") == -1 &&
             checkpoint_step_of_name("step_12a.ckpt") == -1 && checkpoint_step_of_name("model.bin") == -1;
    test_report(name, ok, "a name was misread");
}

// Digits past int64 are refused, not wrapped into some other step (or rank); the largest steps that
// fit still parse.
static void test_name_digit_overflow(void) {
    const char* name = "checkpoint_step_of_name_refuses_digits_past_int64";
    const int64_t big = (int64_t)1000000000000000000 + (int64_t)(test_rng_next(&g_rng) % 1000000);
    char fits[64];
    snprintf(fits, sizeof(fits), "step_%lld.ckpt", (long long)big);
    int r = 0, w = 0;
    const int64_t huge = checkpoint_step_of_name("step_99999999999999999999.ckpt");
    const int64_t huge_rank = checkpoint_parse_name("step_1.rank99999999999999999999of02.ckpt", &r, &w);
    const int64_t got = checkpoint_step_of_name(fits);
    test_report(name, huge == -1 && huge_rank == -1 && got == big,
                "20 nines: %lld, rank of 20 nines: %lld, %s: %lld", (long long)huge, (long long)huge_rank, fits,
                (long long)got);
}

// ZeRO-1: one file per rank (names, round trip of a shard's payload), a step counts only when every
// rank's file exists, and pruning removes whole steps (all ranks' files).
static void touch(const char* dir, const char* name) {
    char path[CHECKPOINT_PATH_MAX + 300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE* f = fopen(path, "wb");
    if (f) fclose(f);
}

static void test_sharded(void) {
    int r = 0, w = 0;
    int ok = checkpoint_parse_name("step_00000012.rank01of02.ckpt", &r, &w) == 12 && r == 1 && w == 2 &&
             checkpoint_parse_name("step_00000012.ckpt", &r, &w) == 12 && r == -1 && w == 0 &&
             checkpoint_step_of_name("step_00000012.rank02of02.ckpt") == -1 &&
             checkpoint_step_of_name("step_00000012.rank01of.ckpt") == -1 &&
             checkpoint_step_of_name(".step_00000012.rank00of02.ckpt.tmp") == -1;
    char p[CHECKPOINT_PATH_MAX];
    checkpoint_rank_file(p, sizeof(p), "dir/step_00000012.rank00of02.ckpt", 1);
    ok = ok && strcmp(p, "dir/step_00000012.rank01of02.ckpt") == 0;
    checkpoint_rank_file(p, sizeof(p), "step_00000012.ckpt", 1);
    ok = ok && strcmp(p, "step_00000012.ckpt") == 0;
    test_report("checkpoint_sharded_names", ok, "a sharded name was misread or misbuilt (%s)", p);

    // round trip of rank 1's file of 2: params (num_params) + 3 x shard
    const char* name = "checkpoint_sharded_round_trip";
    char err[ERR_LEN];
    CheckpointHeader h = random_header(30, 101);
    h.world_size = 2, h.zero_stage = 1, h.rank = 1, h.shard_size = 64, h.shard_offset = 64;
    const size_t bytes = (size_t)checkpoint_header_payload_bytes(&h);
    unsigned char payload[101 * 2 + 64 * 12], back[sizeof(payload)];
    fill_random(payload, sizeof(payload));
    CheckpointWriter cw;
    CheckpointReader cr;
    ok = bytes == sizeof(payload) && checkpoint_writer_open_rank(&cw, g_dir, 30, 1, 2, err, ERR_LEN) == 0 &&
         checkpoint_writer_append(&cw, payload, bytes, err, ERR_LEN) == 0 &&
         checkpoint_writer_commit(&cw, h, err, ERR_LEN) == 0;
    checkpoint_path_rank(p, sizeof(p), g_dir, 30, 1, 2);
    ok = ok && checkpoint_reader_open(&cr, p, err, ERR_LEN) == 0 && cr.header.zero_stage == 1 &&
         cr.header.rank == 1 && cr.header.shard_size == 64 && checkpoint_reader_read(&cr, back, bytes, err, ERR_LEN) == 0 &&
         checkpoint_reader_finish(&cr, err, ERR_LEN) == 0 && memcmp(back, payload, bytes) == 0;
    test_report(name, ok, "%s", err);

    // rank 0's file of step 30 is missing: the newest complete step is 20
    name = "checkpoint_sharded_latest_needs_every_rank_and_prune_removes_whole_steps";
    touch(g_dir, "step_00000010.rank00of02.ckpt");
    touch(g_dir, "step_00000010.rank01of02.ckpt");
    touch(g_dir, "step_00000020.rank00of02.ckpt");
    touch(g_dir, "step_00000020.rank01of02.ckpt");
    int64_t step = -1;
    char want[CHECKPOINT_PATH_MAX];
    checkpoint_path_rank(want, sizeof(want), g_dir, 20, 0, 2);
    int found = checkpoint_find_latest(g_dir, p, sizeof(p), &step, err, sizeof(err));
    ok = found == 1 && step == 20 && strcmp(p, want) == 0;
    touch(g_dir, "step_00000030.rank00of02.ckpt");
    found = checkpoint_find_latest(g_dir, p, sizeof(p), &step, err, sizeof(err));
    ok = ok && found == 1 && step == 30;
    checkpoint_prune(g_dir, 2);  // keeps steps 30 and 20, removes both files of step 10
    ok = ok && count_files(g_dir, "step_00000010") == 0 && count_files(g_dir, "step_00000020") == 2 &&
         count_files(g_dir, "step_00000030") == 2;
    test_report(name, ok, "found %d step %lld path %s; files of 10/20/30: %d %d %d", found, (long long)step, p,
                count_files(g_dir, "step_00000010"), count_files(g_dir, "step_00000020"),
                count_files(g_dir, "step_00000030"));
    remove_all(g_dir);
}

static void test_abort_leaves_nothing(void) {
    const char* name = "checkpoint_abort_leaves_no_file";
    char err[ERR_LEN];
    CheckpointWriter w;
    const int opened = checkpoint_writer_open(&w, g_dir, 3, err, sizeof(err)) == 0;
    if (opened) {
        checkpoint_writer_append(&w, "abc", 3, err, sizeof(err));
        checkpoint_writer_abort(&w);
    }
    test_report(name, opened && count_files(g_dir, "") == 2, "open %s; files left: %d (only . and .. expected)",
                opened ? "ok" : err, count_files(g_dir, ""));
    char missing[sizeof(g_dir) + 32];  // a path that fits the writer's names, so gcc sees no truncation
    snprintf(missing, sizeof(missing), "%s/no/such/dir", g_dir);
    test_report("checkpoint_unwritable_dir_is_an_error_naming_it",
                checkpoint_writer_open(&w, missing, 3, err, sizeof(err)) != 0 && strstr(err, missing) != NULL,
                "err: %s", err);
}

// A killed save leaves .step_*.ckpt.tmp files: they are removed (every rank's, regular files only),
// named, and nothing else in the directory is touched.
static void test_remove_temporaries(void) {
    const char* name = "checkpoint_leftover_temporaries_are_removed";
    touch(g_dir, "step_00000010.ckpt");
    touch(g_dir, ".step_00000020.ckpt.tmp");
    touch(g_dir, ".step_00000020.rank01of02.ckpt.tmp");
    touch(g_dir, "notes.tmp");
    touch(g_dir, ".stepX_00000020.ckpt.tmp");  // not ours: the prefix is all of ".step_"
    char blocker[CHECKPOINT_PATH_MAX + 64], removed[512];
    snprintf(blocker, sizeof(blocker), "%s/.step_00000030.ckpt.tmp", g_dir);  // a directory: left alone
    mkdir(blocker, 0777);
    int n = checkpoint_remove_temporaries(g_dir, removed, sizeof(removed));
    int ok = n == 2 && count_files(g_dir, ".step_00000020") == 0 && count_files(g_dir, "step_00000010.ckpt") == 1 &&
             count_files(g_dir, "notes.tmp") == 1 && count_files(g_dir, ".step_00000030") == 1 &&
             count_files(g_dir, ".stepX_00000020.ckpt.tmp") == 1 &&
             strstr(removed, ".step_00000020.ckpt.tmp") && strstr(removed, ".step_00000020.rank01of02.ckpt.tmp");
    char missing[CHECKPOINT_PATH_MAX + 32];
    snprintf(missing, sizeof(missing), "%s/absent", g_dir);
    ok = ok && checkpoint_remove_temporaries(missing, removed, sizeof(removed)) == 0;
    test_report(name, ok, "removed %d (%s)", n, removed);
    rmdir(blocker);
    remove_all(g_dir);
}

// checkpoint_make_dir makes missing parents (the default runs/<model>), accepts an existing directory
// and refuses a path whose parent is a file, naming it.
static void test_make_dir_with_parents(void) {
    const char* name = "checkpoint_make_dir_makes_missing_parents";
    char nested[CHECKPOINT_PATH_MAX], runs[CHECKPOINT_PATH_MAX], blocked[CHECKPOINT_PATH_MAX];
    char err[2 * CHECKPOINT_PATH_MAX + 256];  // room for both paths the error may name
    snprintf(runs, sizeof(runs), "%s/runs", g_dir);
    snprintf(nested, sizeof(nested), "%s/runs/gpt2-124m", g_dir);
    struct stat st;
    int ok = checkpoint_make_dir(nested, err, sizeof(err)) == 0 && stat(nested, &st) == 0 && S_ISDIR(st.st_mode);
    ok = ok && checkpoint_make_dir(nested, err, sizeof(err)) == 0;  // already there: fine
    touch(runs, "file");
    snprintf(blocked, sizeof(blocked), "%s/runs/file/sub", g_dir);
    const int refused = checkpoint_make_dir(blocked, err, sizeof(err)) != 0 && strstr(err, blocked) != NULL;
    test_report(name, ok && refused, "made: %d, refused under a file: %d (%s)", ok, refused, err);
    remove_all(runs);
    rmdir(nested);
    remove_all(runs);
    rmdir(runs);
}

// A tiny model file written by hand (the format's definition), read back through model_file.h.
// kv_heads: 2 (multi-head, header slot 8 written as 0 as in llm.c's files) or 1 (multi-query).
static void test_model_file(int kv_heads, const char* name) {
    GPTConfig c = {2, 16, 2, kv_heads, 50, 64, 8};
    size_t sizes[NUM_PARAM_TENSORS], total = 0;
    gpt_param_sizes(sizes, &c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) total += sizes[i];
    char path[CHECKPOINT_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/model.bin", g_dir);
    int ok = 1;
    char why[ERR_LEN] = "";
    for (int version = MODEL_FILE_FP32; ok && version <= MODEL_FILE_BF16; version += 2) {
        const size_t bpv = (size_t)model_file_bytes_per_value(version);
        unsigned char* values = (unsigned char*)malloc(total * bpv);
        fill_random(values, total * bpv);
        FILE* f = fopen(path, "wb");
        ok = model_file_write_header(f, &c, version) == 0 && fwrite(values, bpv, total, f) == total;
        fclose(f);
        int32_t slot8 = -1;  // header int 8: NKV, or 0 for a multi-head model (llm.c's files have 0 there)
        f = fopen(path, "rb");
        if (ok && (fseek(f, 8 * 4, SEEK_SET) != 0 || fread(&slot8, 4, 1, f) != 1 || slot8 != (kv_heads == 2 ? 0 : kv_heads))) {
            ok = 0;
            snprintf(why, sizeof(why), "header int 8 is %d", (int)slot8);
        }
        fclose(f);
        ModelFile m;
        if (ok && model_file_open(&m, path, why, sizeof(why)) != 0) ok = 0;
        if (ok) {
            ok = m.version == version && m.config.num_layers == 2 && m.config.channels == 16 &&
                 m.config.num_heads == 2 && m.config.vocab_size == 50 && m.config.padded_vocab_size == 64 &&
                 m.config.max_seq_len == 8 && m.config.num_kv_heads == kv_heads;
            if (!ok) snprintf(why, sizeof(why), "header fields differ");
            size_t offset = 0;
            unsigned char* back = (unsigned char*)malloc(total * bpv);
            for (int i = 0; ok && i < NUM_PARAM_TENSORS; i++) {
                // wpe (tensor 1): read only the first 5 of 8 rows, as train_gpt does for a shorter --seq-len
                size_t count = i == 1 ? 5 * 16 : sizes[i];
                if (model_file_read_tensor(&m, i, back, count, why, sizeof(why)) != 0) ok = 0;
                else if (memcmp(back, values + offset * bpv, count * bpv) != 0) {
                    ok = 0;
                    snprintf(why, sizeof(why), "tensor %d differs (version %d)", i, version);
                }
                offset += sizes[i];
            }
            free(back);
            model_file_close(&m);
        }
        free(values);
    }
    test_report(name, ok, "%s", why);
    truncate_or_exit(path, 1024 + 100);
    ModelFile m;
    int refused = model_file_open(&m, path, why, sizeof(why)) != 0;
    test_report("model_file_truncated_is_refused_with_the_reason", refused && strstr(why, "truncated") && strstr(why, path),
                "err: %s", why);
    FILE* f = fopen(path, "wb");
    fwrite("not a model at all", 1, 18, f);
    fclose(f);
    refused = model_file_open(&m, path, why, sizeof(why)) != 0;
    test_report("model_file_foreign_file_is_refused", refused && strstr(why, "magic"), "err: %s", why);
    remove_all(g_dir);
}

// Writes a model file of config `c`: the header (version), then `values` random values of `bpv` bytes
// and `extra` bytes more; 0 on success.
static int write_model_file(const char* path, const GPTConfig* c, int version, size_t values, size_t bpv,
                            size_t extra) {
    unsigned char* body = (unsigned char*)malloc(values * bpv + extra + 1);
    fill_random(body, values * bpv + extra);
    FILE* f = fopen(path, "wb");
    int ok = f && model_file_write_header(f, c, version) == 0 &&
             fwrite(body, 1, values * bpv + extra, f) == values * bpv + extra;
    if (f) ok = fclose(f) == 0 && ok;
    free(body);
    return ok ? 0 : -1;
}

static size_t model_values(const GPTConfig* c) {
    size_t sizes[NUM_PARAM_TENSORS], total = 0;
    gpt_param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) total += sizes[i];
    return total;
}

// The format fixes the value sizes: 1024 + 4 bytes a value for version 3 (fp32), + 2 for version 5
// (bf16), as llm.c and scripts/torch_gpt.py write them; a file of the other width is refused.
static void test_model_file_value_bytes(void) {
    const char* name = "model_file_values_are_4_bytes_fp32_and_2_bytes_bf16";
    const int layers = 1 + (int)(test_rng_next(&g_rng) % 3);
    GPTConfig c = {layers, 16, 2, 2, 50, 64, 8};
    const size_t total = model_values(&c);
    char path[CHECKPOINT_PATH_MAX + 32], why[ERR_LEN] = "";
    snprintf(path, sizeof(path), "%s/model.bin", g_dir);
    int ok = 1;
    for (int version = MODEL_FILE_FP32; ok && version <= MODEL_FILE_BF16; version += 2) {
        const size_t bpv = version == MODEL_FILE_FP32 ? 4 : 2, other = 6 - bpv;
        ModelFile m = {0};
        ok = write_model_file(path, &c, version, total, bpv, 0) == 0 && file_size(path) == (long)(1024 + bpv * total) &&
             model_file_open(&m, path, why, sizeof(why)) == 0;
        model_file_close(&m);
        ok = ok && write_model_file(path, &c, version, total, other, 0) == 0 &&
             model_file_open(&m, path, why, sizeof(why)) != 0 && strstr(why, "truncated or corrupt") != NULL;
        if (!ok) snprintf(why + strlen(why), sizeof(why) - strlen(why), " (version %d)", version);
    }
    test_report(name, ok, "%s", why);
    remove_all(g_dir);
}

// Each model file whose header open must refuse, with the body sized to what the header claims
// (so only the header check can refuse it), header int `slot` then set to `value` (slot -1: none),
// and a word of the error.
static const struct {
    const char* name;
    GPTConfig config;  // L, C, NH, NKV, V, Vp, maxT
    int version;
    int slot;
    int32_t value;
    int header_only;  // the body would not fit a disk: the header alone
    size_t extra;     // bytes after the body
    const char* word;
} MODEL_REFUSALS[] = {
    // 1024 bytes and more, so that only the magic tells it is not a model file
    {"model_file_wrong_magic_is_refused", {2, 16, 2, 2, 50, 64, 8}, MODEL_FILE_BF16, 0, MODEL_FILE_MAGIC + 1, 0, 0,
     "not a model file"},
    {"model_file_version_4_is_refused", {2, 16, 2, 2, 50, 64, 8}, MODEL_FILE_BF16, 1, 4, 0, 0, "version 4"},
    {"model_file_padded_vocab_below_vocab_is_refused", {2, 16, 2, 2, 64, 50, 8}, MODEL_FILE_FP32, -1, 0, 0, 0,
     "a size is out of range"},
    {"model_file_channels_not_a_multiple_of_heads_is_refused", {2, 18, 4, 4, 50, 64, 8}, MODEL_FILE_FP32, -1, 0, 0,
     0, "a size is out of range"},
    {"model_file_zero_positions_is_refused", {2, 16, 2, 2, 50, 64, 0}, MODEL_FILE_BF16, -1, 0, 0, 0,
     "a size is out of range"},
    {"model_file_kv_heads_not_dividing_heads_is_refused", {2, 16, 4, 3, 50, 64, 8}, MODEL_FILE_FP32, -1, 0, 0, 0,
     "3 key/value heads do not divide 4 heads"},
    // 2^20 layers of 4 x 2^16 x 2^16 MLP weights: 2^54 values
    {"model_file_more_than_2_52_values_is_refused", {1 << 20, 1 << 16, 1, 1, 50, 64, 8}, MODEL_FILE_BF16, -1, 0, 1,
     0, "more than 2^52 values"},
    {"model_file_extra_byte_is_refused", {2, 16, 2, 2, 50, 64, 8}, MODEL_FILE_FP32, -1, 0, 0, 1,
     "truncated or corrupt"},
};

static void test_model_file_refusals(void) {
    char path[CHECKPOINT_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/model.bin", g_dir);
    for (size_t i = 0; i < COUNT(MODEL_REFUSALS); i++) {
        const GPTConfig* c = &MODEL_REFUSALS[i].config;
        const size_t bpv = MODEL_REFUSALS[i].version == MODEL_FILE_FP32 ? 4 : 2;
        const size_t values = MODEL_REFUSALS[i].header_only ? 0 : model_values(c);
        char why[ERR_LEN] = "";
        if (write_model_file(path, c, MODEL_REFUSALS[i].version, values, bpv, MODEL_REFUSALS[i].extra) != 0) {
            test_fail(MODEL_REFUSALS[i].name, "cannot write %s", path);
            continue;
        }
        if (MODEL_REFUSALS[i].slot >= 0) {
            FILE* f = fopen(path, "r+b");
            fseek(f, 4L * MODEL_REFUSALS[i].slot, SEEK_SET);
            fwrite(&MODEL_REFUSALS[i].value, 4, 1, f);
            fclose(f);
        }
        ModelFile m;
        const int refused = model_file_open(&m, path, why, sizeof(why)) != 0;
        if (!refused) model_file_close(&m);
        test_report(MODEL_REFUSALS[i].name, refused && strstr(why, MODEL_REFUSALS[i].word) && strstr(why, path),
                    "%s (want an error with \"%s\")", refused ? why : "accepted", MODEL_REFUSALS[i].word);
    }
    remove_all(g_dir);
}

// kv_heads of the model file, and its round trip's case name (test_model_file also reports a
// truncated and a foreign file: 3 cases each).
static const struct {
    int kv_heads;
    const char* name;
} MODEL_FILES[] = {{2, "model_file_round_trip_fp32_and_bf16"}, {1, "model_file_round_trip_fp32_and_bf16_multi_query"}};

static void test_model_files(void) {
    for (size_t i = 0; i < COUNT(MODEL_FILES); i++) test_model_file(MODEL_FILES[i].kv_heads, MODEL_FILES[i].name);
}

// Every group in the order it runs, with the number of cases it reports.
static const struct {
    void (*run)(void);
    int cases;
} GROUPS[] = {
    {test_hash_pieces_and_sensitivity, 1},
    {test_hash_golden, 1},
    {test_round_trip, 1},
    {test_refusals, (int)COUNT(REFUSALS)},
    {test_finish_after_part, 1},
    {test_fp8_section_round_trips, 2},
    {test_fp8_section_absent, 1},
    {test_fp8_section_commit_checks, 1},
    {test_latest_and_prune, 1},
    {test_names, 1},
    {test_name_digit_overflow, 1},
    {test_sharded, 3},
    {test_abort_leaves_nothing, 2},
    {test_remove_temporaries, 1},
    {test_make_dir_with_parents, 1},
    {test_model_files, 3 * (int)COUNT(MODEL_FILES)},
    {test_model_file_value_bytes, 1},
    {test_model_file_refusals, (int)COUNT(MODEL_REFUSALS)},
};

int main(void) {
    test_begin();
    int cases = 0;
    for (size_t i = 0; i < COUNT(GROUPS); i++) cases += GROUPS[i].cases;
    test_plan(cases);
    g_rng.state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("seed %llu\n", (unsigned long long)g_rng.state);
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_checkpoint_XXXXXX");
    if (!mkdtemp(g_dir)) {
        test_fail("setup", "mkdtemp: %s", strerror(errno));
        return test_end();
    }
    for (size_t i = 0; i < COUNT(GROUPS); i++) GROUPS[i].run();
    rmdir(g_dir);
    return test_end();
}
