// make_seeds.c: writes the fuzzers' seed corpus, small VALID files of each format, so fuzzing starts
// from the real formats: test/fuzz/corpus/<target>/valid_*. Checkpoints and model-file headers come from
// the project's own writers (data/checkpoint.h, data/model_file.h). `make fuzz-seeds` runs it; the
// output is committed, and `make fuzz` checks that every valid_* file still parses.
//   usage: make_seeds CORPUS_DIR
#define _DEFAULT_SOURCE  // mkdtemp under -std=c11

#include "data/checkpoint.h"
#include "data/dataloader.h"
#include "data/model_file.h"
#include "data/tokenizer.h"

static const char* g_corpus;

static FILE* open_seed(const char* target, const char* name) {
    char path[CHECKPOINT_PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", g_corpus, target);
    mkdir(path, 0777);
    snprintf(path, sizeof(path), "%s/%s/%s", g_corpus, target, name);
    FILE* f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    return f;
}

static void close_seed(FILE* f) {
    if (fclose(f) != 0) {
        perror("make_seeds: write");
        exit(1);
    }
}

// A shard of n tokens (enough for a batch of both fuzz settings).
static void write_shard(const char* name, int32_t n) {
    FILE* f = open_seed("shard", name);
    int32_t header[SHARD_HEADER_INTS] = {SHARD_MAGIC, SHARD_VERSION, n};
    fwrite(header, sizeof(header), 1, f);
    for (int32_t i = 0; i < n; i++) {
        const uint16_t t = (uint16_t)((i * 7919 + 464) % 50257);
        fwrite(&t, 2, 1, f);
    }
    close_seed(f);
}

// A token table of `count` tokens "t0", "t1", ... (version 2 with its end-of-text field, or version 1).
static void write_tokenizer(const char* name, uint32_t version, uint32_t count) {
    FILE* f = open_seed("tokenizer", name);
    uint32_t header[TOKENIZER_HEADER_INTS] = {TOKENIZER_MAGIC, version, count, version == 2 ? count - 1 : 0};
    fwrite(header, sizeof(header), 1, f);
    for (uint32_t i = 0; i < count; i++) {
        char tok[16];
        const int len = snprintf(tok, sizeof(tok), i == count - 1 ? "<|endoftext|>" : " t%u", i);
        const unsigned char l = (unsigned char)len;
        fwrite(&l, 1, 1, f);
        fwrite(tok, 1, (size_t)len, f);
    }
    close_seed(f);
}

// A tiny model (L1 C4 NH2 NKV kv V5 Vp8 maxT3) with values of `version`.
static void write_model_file(const char* name, int version, int kv) {
    const GPTConfig c = {1, 4, 2, kv, 5, 8, 3};
    FILE* f = open_seed("model_file", name);
    if (model_file_write_header(f, &c, version) != 0) exit(1);
    const size_t n = gpt_num_params(&c);
    for (size_t i = 0; i < n; i++) {
        const float v = (float)(i % 17) * 0.125f - 1.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        const uint16_t half = (uint16_t)(bits >> 16);
        if (version == MODEL_FILE_FP32) fwrite(&v, 4, 1, f);
        else fwrite(&half, 2, 1, f);
    }
    close_seed(f);
}

// A checkpoint of a tiny model through CheckpointWriter: whole (world 0) or rank `rank` of a ZeRO-1 run
// of `world` ranks, with num_params parameters and an FP8-scales section of fp8_bytes (0: none).
static void write_checkpoint(const char* name, int64_t num_params, int rank, int world, int fp8_bytes) {
    char dir[CHECKPOINT_PATH_MAX], err[CHECKPOINT_PATH_MAX + 256], path[CHECKPOINT_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/checkpoint", g_corpus);
    mkdir(dir, 0777);
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.num_layers = 1, h.channels = 4, h.num_heads = 2, h.num_kv_heads = 1, h.vocab_size = 5;
    h.padded_vocab_size = 8, h.max_seq_len = 3, h.batch_size = 1, h.seq_len = 3, h.world_size = world ? world : 1;
    h.total_batch_tokens = 3, h.seed = 1337, h.train_tokens = 64, h.train_shards = 1, h.step = 7;
    h.max_steps = 10, h.warmup_steps = 2, h.lr = 6e-4, h.min_lr_fraction = 0.1, h.weight_decay = 0.1, h.grad_clip = 1.0;
    h.num_params = num_params;
    h.fp8_state_bytes = fp8_bytes;
    if (world > 0) {
        h.zero_stage = 1, h.rank = rank;
        h.shard_size = (num_params + world - 1) / world, h.shard_offset = (int64_t)rank * h.shard_size;
    }
    CheckpointWriter w;
    unsigned char payload[4096];
    const size_t bytes = (size_t)checkpoint_header_payload_bytes(&h);
    for (size_t i = 0; i < bytes; i++) payload[i] = (unsigned char)(i * 31 + 7);
    if (bytes > sizeof(payload) || checkpoint_writer_open_rank(&w, dir, h.step, rank, world, err, sizeof(err)) != 0 ||
        checkpoint_writer_append(&w, payload, bytes, err, sizeof(err)) != 0 ||
        checkpoint_writer_commit(&w, h, err, sizeof(err)) != 0) {
        fprintf(stderr, "make_seeds: %s\n", err);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (rename(w.final_path, path) != 0) {
        perror(path);
        exit(1);
    }
}

// An eval file of two examples (4 and 2 completions), as data/README.md lays it out.
static void write_eval_file(const char* name) {
    static const uint16_t words[] = {65535, 36, 0, 2, 4, 3, 464, 3290, 318, 1, 11, 2, 12, 13, 1, 14, 1, 15,
                                     65535, 26, 1, 0, 2, 2, 50, 51, 1, 52, 2, 53, 54};
    int32_t header[256] = {20240522, 1, 2, 36};
    FILE* f = open_seed("eval_file", name);
    fwrite(header, sizeof(header), 1, f);
    fwrite(words, sizeof(words), 1, f);
    close_seed(f);
}

static void write_text(const char* target, const char* name, const char* text) {
    FILE* f = open_seed(target, name);
    fputs(text, f);
    close_seed(f);
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    g_corpus = argv[1];
    mkdir(g_corpus, 0777);
    write_shard("valid_64_tokens.bin", 64);
    write_checkpoint("valid_plain.ckpt", 24, 0, 0, 0);
    write_checkpoint("valid_zero1_rank1of2.ckpt", 23, 1, 2, 0);
    write_checkpoint("valid_fp8.ckpt", 24, 0, 0, 1344);  // one layer's FP8 scales (4 linears x 3 roles x 112 bytes)
    write_model_file("valid_fp32.bin", MODEL_FILE_FP32, 2);
    write_model_file("valid_bf16_gqa.bin", MODEL_FILE_BF16, 1);
    write_tokenizer("valid_v2.bin", 2, 6);
    write_tokenizer("valid_v1.bin", 1, 4);
    write_text("prompt_tokens", "valid_list.txt", "464,3290,318");
    write_text("prompt_tokens", "valid_lines.txt", "464 3290\n318,\t11\n");
    write_eval_file("valid_two_examples.bin");
    return 0;
}
