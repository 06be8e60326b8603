// model_file.h: GPT weights in llm.c's model file format, so weights move between train_gpt,
// llm.c and PyTorch (scripts/torch_gpt.py reads and writes the same files).
//
// File layout (little-endian):
//   header  256 int32: [0] = 20240326 (magic), [1] = 3 (fp32 values) or 5 (bf16 values),
//           [2] = maxT, [3] = V (real vocab), [4] = L, [5] = NH, [6] = C, [7] = Vp (padded vocab),
//           [8] = NKV (key/value heads of grouped-query attention; 0 means NKV = NH, as in llm.c's
//           files and ours from before GQA, and is what a multi-head model writes); the rest zero
//   body    the 16 tensors of gpt_config.h back to back, in its order and shapes, with maxT rows of
//           wpe, so exactly 1024 + gpt_num_params(config with max_seq_len = maxT) × (4 or 2) bytes.
// train_gpt reads these with --init-from (a file with more positions than --seq-len gives the first
// seq-len rows of wpe) and writes one with --dump-grads (the gradients of a step, bf16).
//
// Plain C11 that also compiles as C++ (nvcc). Fallible calls return -1 with one line in `err`.
#ifndef MODEL_FILE_H
#define MODEL_FILE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "data/gpt_config.h"

#define MODEL_FILE_MAGIC 20240326
#define MODEL_FILE_FP32 3
#define MODEL_FILE_BF16 5
#define MODEL_FILE_HEADER_INTS 256

typedef struct {
    FILE* file;
    int version;              // MODEL_FILE_FP32 or MODEL_FILE_BF16
    GPTConfig config;         // as stored: max_seq_len = the file's maxT
    size_t sizes[NUM_PARAM_TENSORS];
} ModelFile;

static inline int model_file_bytes_per_value(int version) { return version == MODEL_FILE_FP32 ? 4 : 2; }

// The values of a model of config `c` (NH >= 1, 0 < NKV <= NH), counted in double from gpt_config.h's
// table, so a header of absurd sizes is caught before the exact size_t count could wrap around.
static inline double model_file_values_estimate(const GPTConfig* c) {
    const double Vp = c->padded_vocab_size, C = c->channels, L = c->num_layers, maxT = c->max_seq_len;
    const double QKV = ((double)c->num_heads + 2.0 * c->num_kv_heads) * (double)(c->channels / c->num_heads);
    double total = 0;
#define MODEL_FILE_VALUES(id, name, rows, cols, stacked, init, decay) \
    total += (stacked == GPT_PER_LAYER ? L : 1) * (double)(rows) * (double)(cols);
    GPT_PARAM_TENSORS(MODEL_FILE_VALUES)
#undef MODEL_FILE_VALUES
    return total;
}

// The most values a header may describe: far above any model, and low enough that the file size
// computed from it fits a long long exactly (test/fuzz/fuzz_model_file.c found the overflow).
#define MODEL_FILE_MAX_VALUES 4503599627370496.0  // 2^52

// Opens PATH and checks its header and size against itself; the caller compares model->config
// with the run's config and then reads the tensors in order with model_file_read_tensor.
static inline int model_file_open(ModelFile* m, const char* path, char* err, size_t err_len) {
    memset(m, 0, sizeof(*m));
    m->file = fopen(path, "rb");
    if (!m->file) {
        snprintf(err, err_len, "%s: cannot open the weights file: %s", path, strerror(errno));
        return -1;
    }
    int32_t h[MODEL_FILE_HEADER_INTS];
    const char* why = NULL;
    char detail[256];
    if (fread(h, sizeof(int32_t), MODEL_FILE_HEADER_INTS, m->file) != MODEL_FILE_HEADER_INTS || h[0] != MODEL_FILE_MAGIC) {
        why = "not a model file (expected llm.c's format: magic 20240326 in a 1024-byte header)";
    } else if (h[1] != MODEL_FILE_FP32 && h[1] != MODEL_FILE_BF16) {
        snprintf(detail, sizeof(detail), "version %d is not 3 (fp32) or 5 (bf16)", (int)h[1]);
        why = detail;
    } else {
        m->version = h[1];
        m->config.max_seq_len = h[2];
        m->config.vocab_size = h[3];
        m->config.num_layers = h[4];
        m->config.num_heads = h[5];
        m->config.channels = h[6];
        m->config.padded_vocab_size = h[7];
        m->config.num_kv_heads = h[8] ? h[8] : h[5];
        if (h[2] < 1 || h[3] < 1 || h[4] < 1 || h[5] < 1 || h[6] < 1 || h[7] < h[3] || h[6] % h[5] != 0) {
            why = "corrupt header (a size is out of range)";
        } else if (h[8] < 0 || h[8] > h[5] || h[5] % m->config.num_kv_heads != 0) {
            snprintf(detail, sizeof(detail), "corrupt header: %d key/value heads do not divide %d heads", (int)h[8],
                     (int)h[5]);
            why = detail;
        } else if (model_file_values_estimate(&m->config) > MODEL_FILE_MAX_VALUES) {
            why = "corrupt header (its sizes give a model of more than 2^52 values)";
        } else {
            gpt_param_sizes(m->sizes, &m->config);
            long long want = MODEL_FILE_HEADER_INTS * 4;
            for (int i = 0; i < NUM_PARAM_TENSORS; i++)
                want += (long long)m->sizes[i] * model_file_bytes_per_value(m->version);
            long size = -1;
            if (fseek(m->file, 0, SEEK_END) == 0) size = ftell(m->file);
            if (size != (long)want) {
                snprintf(detail, sizeof(detail), "file is %ld bytes but its header (L%d C%d NH%d NKV%d Vp%d maxT%d, %s) "
                         "says %lld: truncated or corrupt", size, h[4], h[6], h[5], m->config.num_kv_heads, h[7], h[2],
                         m->version == MODEL_FILE_FP32 ? "fp32" : "bf16", want);
                why = detail;
            } else if (fseek(m->file, MODEL_FILE_HEADER_INTS * 4, SEEK_SET) != 0) {
                why = "cannot seek";
            }
        }
    }
    if (why) {
        snprintf(err, err_len, "%s: %s", path, why);
        fclose(m->file);
        m->file = NULL;
        return -1;
    }
    return 0;
}

// Reads the next tensor's first `count` values (count <= its size; the rest is skipped), raw
// (4 or 2 bytes each, per m->version) into dst.
static inline int model_file_read_tensor(ModelFile* m, int tensor, void* dst, size_t count, char* err,
                                         size_t err_len) {
    const size_t bytes = (size_t)model_file_bytes_per_value(m->version);
    if (fread(dst, bytes, count, m->file) != count ||
        (count < m->sizes[tensor] && fseek(m->file, (long)((m->sizes[tensor] - count) * bytes), SEEK_CUR) != 0)) {
        snprintf(err, err_len, "cannot read tensor %d of the weights file: %s", tensor,
                 ferror(m->file) ? strerror(errno) : "unexpected end of file");
        return -1;
    }
    return 0;
}

static inline void model_file_close(ModelFile* m) {
    if (m->file) fclose(m->file);
    m->file = NULL;
}

// Writes the header of a file for `config` with values of `version`; the tensors follow with fwrite.
static inline int model_file_write_header(FILE* f, const GPTConfig* config, int version) {
    int32_t h[MODEL_FILE_HEADER_INTS] = {0};
    h[0] = MODEL_FILE_MAGIC;
    h[1] = version;
    h[2] = config->max_seq_len;
    h[3] = config->vocab_size;
    h[4] = config->num_layers;
    h[5] = config->num_heads;
    h[6] = config->channels;
    h[7] = config->padded_vocab_size;
    h[8] = config->num_kv_heads == config->num_heads ? 0 : config->num_kv_heads;
    return fwrite(h, sizeof(int32_t), MODEL_FILE_HEADER_INTS, f) == MODEL_FILE_HEADER_INTS ? 0 : -1;
}

#endif  // MODEL_FILE_H
