// eval_file.h: multiple-choice evaluation files (llm.c's layout, written by scripts/prepare_hellaswag.py;
// format in data/README.md), and the rows the model scores them in.
//
// File: a header of 256 int32 ([0] = 20240522, [1] = 1, [2] = N examples, [3] = the longest example in
// bytes), then N examples of uint16 words: 65535, the example's bytes, its index, the label, the
// number of completions K, the context's length and tokens, then each completion's length and tokens.
// eval_file_open reads and checks all of it (every delimiter, index, length, label, token id, and
// that the file ends where the last example does); a bad file gives one line in ef->error naming the
// file, the example and its byte offset.
//
// Rows: each completion of an example is scored in a row of its own, the context followed by the
// completion, as a sequence of the model's T positions: inputs = row[0 .. n-2], targets =
// row[1 .. n-1] (n = context + completion tokens, n - 1 <= T); the completion's tokens are the
// targets from the context's last position on, span [start, start + len). A context too long for
// T keeps its last tokens (the ones next to the completion); a completion longer than T is refused
// when the file is opened. Positions after a row's end are padded with <|endoftext|> and not scored.
// The answer: the completion with the lowest mean loss over its tokens (llm.c's choice, the
// length-normalized accuracy, acc_norm), and the one with the lowest summed loss (acc); ties go to
// the first.
//
// Plain C11 that also compiles as C++ (nvcc); never prints, never exits.
#ifndef EVAL_FILE_H
#define EVAL_FILE_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_MAGIC 20240522
#define EVAL_VERSION 1
#define EVAL_HEADER_BYTES 1024
#define EVAL_DELIMITER 65535
#define EVAL_MAX_COMPLETIONS 16
#define EVAL_PAD_TOKEN 50256  // <|endoftext|>

typedef struct {
    int label, num_completions;
    int context_len;
    const uint16_t* context;
    int completion_len[EVAL_MAX_COMPLETIONS];
    const uint16_t* completion[EVAL_MAX_COMPLETIONS];
} EvalExample;

typedef struct {
    uint16_t* words;  // the file's examples, as read
    EvalExample* examples;
    int num_examples;
    int longest_completion;
    char path[512];
    char error[1024];
} EvalFile;

// Where a row's completion is scored: targets [start, start + len) of its row.
typedef struct {
    int example, completion, start, len;
} EvalRowSpan;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int eval_fail(EvalFile* ef, const char* fmt, ...) {
    char what[400];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof(what), fmt, args);
    va_end(args);
    snprintf(ef->error, sizeof(ef->error), "%s: %s", ef->path, what);
    return -1;
}

// Reads the whole file into ef->words (the header apart). Returns -1 with ef->error on failure.
static inline int eval_read_words(EvalFile* ef, size_t* num_words, int header[256]) {
    FILE* f = fopen(ef->path, "rb");
    if (!f) {
        snprintf(ef->error, sizeof(ef->error), "%s: cannot open: %s", ef->path, strerror(errno));
        return -1;
    }
    const size_t got = fread(header, 4, 256, f);
    if (got != 256) {
        fclose(f);
        return eval_fail(ef, "shorter (%zu int32) than the 256-int32 header", got);
    }
    long long file_bytes = -1;
    if (fseek(f, 0, SEEK_END) == 0) file_bytes = ftell(f);
    const long long body = file_bytes - EVAL_HEADER_BYTES;
    if (body < 0 || body % 2 != 0 || fseek(f, EVAL_HEADER_BYTES, SEEK_SET) != 0) {
        fclose(f);
        return eval_fail(ef, "%lld bytes: not a 1024-byte header and whole uint16 words", file_bytes);
    }
    *num_words = (size_t)(body / 2);
    ef->words = (uint16_t*)malloc(*num_words * 2 + 2);
    const size_t read = ef->words ? fread(ef->words, 2, *num_words, f) : 0;
    fclose(f);
    if (read != *num_words) return eval_fail(ef, "read %zu of %zu words", read, *num_words);
    return 0;
}

// Checks the header's magic, version and counts.
static inline int eval_check_header(EvalFile* ef, const int header[256]) {
    if (header[0] != EVAL_MAGIC)
        return eval_fail(ef, "magic %d, not %d: not an eval file (scripts/prepare_hellaswag.py writes them)",
                         header[0], EVAL_MAGIC);
    if (header[1] != EVAL_VERSION) return eval_fail(ef, "version %d, this reader knows %d", header[1], EVAL_VERSION);
    if (header[2] < 1 || header[2] > 65535)
        return eval_fail(ef, "the header gives %d examples (1 .. 65535)", header[2]);
    return 0;
}

// Parses example i at words[*at], advancing *at; checks it against the file's remaining words.
static inline int eval_parse_example(EvalFile* ef, size_t* at, size_t num_words, int i, int vocab) {
    const uint16_t* w = ef->words + *at;
    const long long offset = EVAL_HEADER_BYTES + 2 * (long long)*at, left = (long long)(num_words - *at);
    if (left < 6 || w[0] != EVAL_DELIMITER)
        return eval_fail(ef, "example %d at byte %lld: no start delimiter 65535 (file cut short or corrupt)", i,
                         offset);
    const int words = w[1] / 2, k = w[4];
    if (w[1] % 2 || words > left || words < 6)
        return eval_fail(ef, "example %d at byte %lld: its length, %d bytes, does not fit the file", i, offset, w[1]);
    if (w[2] != i) return eval_fail(ef, "example %d at byte %lld: index %d (examples out of order)", i, offset, w[2]);
    if (k < 1 || k > EVAL_MAX_COMPLETIONS || w[3] >= k)
        return eval_fail(ef, "example %d: %d completions (1 .. 16) with label %d", i, k, w[3]);
    EvalExample* e = &ef->examples[i];
    e->label = w[3], e->num_completions = k;
    int pos = 5;
    for (int part = -1; part < k; part++) {
        const int n = pos < words ? w[pos] : 0;
        char name[32] = "the context";
        if (part >= 0) snprintf(name, sizeof(name), "completion %d", part);
        if (n < 1 || pos + 1 + n > words)
            return eval_fail(ef, "example %d: %s has length %d%s", i, name, n, n < 1 ? "" : ", past the example");
        for (int j = 0; j < n; j++)
            if (w[pos + 1 + j] >= vocab)
                return eval_fail(ef, "example %d: token %d is not below the vocabulary size %d", i,
                                 w[pos + 1 + j], vocab);
        if (part < 0) e->context_len = n, e->context = w + pos + 1;
        else e->completion_len[part] = n, e->completion[part] = w + pos + 1;
        pos += 1 + n;
    }
    if (pos != words) return eval_fail(ef, "example %d: %d words of its %d unused", i, words - pos, words);
    *at += (size_t)words;
    return 0;
}

static inline void eval_file_close(EvalFile* ef) {
    free(ef->words);
    free(ef->examples);
    ef->words = NULL, ef->examples = NULL, ef->num_examples = 0;
}

// Opens and checks `path` (token ids below `vocab`). Returns 0, or -1 with ef->error.
static inline int eval_file_open(EvalFile* ef, const char* path, int vocab) {
    memset(ef, 0, sizeof(*ef));
    snprintf(ef->path, sizeof(ef->path), "%s", path);
    int header[256];
    size_t num_words = 0, at = 0;
    if (eval_read_words(ef, &num_words, header) != 0 || eval_check_header(ef, header) != 0) {
        eval_file_close(ef);
        return -1;
    }
    ef->num_examples = header[2];
    ef->examples = (EvalExample*)calloc((size_t)ef->num_examples, sizeof(EvalExample));
    for (int i = 0; i < ef->num_examples; i++) {
        if (eval_parse_example(ef, &at, num_words, i, vocab) != 0) {
            eval_file_close(ef);
            return -1;
        }
        const EvalExample* e = &ef->examples[i];
        for (int c = 0; c < e->num_completions; c++)
            if (e->completion_len[c] > ef->longest_completion) ef->longest_completion = e->completion_len[c];
    }
    if (at != num_words) {
        eval_fail(ef, "%zu words after the last of the header's %d examples (a wrong count, or two files joined)",
                  num_words - at, ef->num_examples);
        eval_file_close(ef);
        return -1;
    }
    return 0;
}

// Writes row `row` of a (rows, T) batch: completion c of example e after as much of the context as
// fits; returns its scored span. The completion must fit: completion_len <= T.
static inline EvalRowSpan eval_fill_row(const EvalFile* ef, int e, int c, int T, int* inputs, int* targets) {
    const EvalExample* ex = &ef->examples[e];
    const int len = ex->completion_len[c];
    int ctx = ex->context_len;
    if (ctx + len - 1 > T) ctx = T + 1 - len;  // the context's last tokens
    const uint16_t* context = ex->context + (ex->context_len - ctx);
    for (int t = 0; t < T; t++) {
        const int i = t, j = t + 1;  // row token i is the input, token j its target
        inputs[t] = i < ctx ? context[i] : (i - ctx < len ? ex->completion[c][i - ctx] : EVAL_PAD_TOKEN);
        targets[t] = j < ctx ? context[j] : (j - ctx < len ? ex->completion[c][j - ctx] : EVAL_PAD_TOKEN);
    }
    EvalRowSpan span = {e, c, ctx - 1, len};
    return span;
}

// The answers of one example from its completions' summed losses: *by_mean (lowest mean loss per
// token, acc_norm) and *by_sum (lowest sum, acc).
static inline void eval_choose(const EvalExample* ex, const double* loss_sum, int* by_mean, int* by_sum) {
    *by_mean = 0, *by_sum = 0;
    for (int c = 1; c < ex->num_completions; c++) {
        if (loss_sum[c] / ex->completion_len[c] < loss_sum[*by_mean] / ex->completion_len[*by_mean]) *by_mean = c;
        if (loss_sum[c] < loss_sum[*by_sum]) *by_sum = c;
    }
}

// How many examples keep only the last part of their context in rows of T positions; -1 when a
// completion is longer than T (it cannot be scored at all).
static inline int eval_check_fits(const EvalFile* file, int T) {
    if (file->longest_completion > T) return -1;
    int truncated = 0;
    for (int e = 0; e < file->num_examples; e++) {
        const EvalExample* ex = &file->examples[e];
        for (int c = 0; c < ex->num_completions; c++)
            if (ex->context_len + ex->completion_len[c] - 1 > T) {
                truncated++;
                break;
            }
    }
    return truncated;
}

#endif  // EVAL_FILE_H
