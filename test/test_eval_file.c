// test_eval_file.c: the multiple-choice eval file reader, its rows and its choice (data/eval_file.h).
//
// Cases: a file of examples with 1 to 16 completions of random tokens, written here word by word as
// data/README.md lays it out, read back token for token; the rows the model scores (inputs, targets,
// the completion's span, padding) with and without a context cut to fit T, checked against the row
// built independently here; the choice by mean and by sum (they differ, ties go to the first);
// eval_check_fits (the longest completion over every completion, refused one position short, and
// the count of cut contexts against one counted here at every T); every kind of bad file refused
// with a message naming the file and what is wrong: missing, short header, bad magic, unknown
// version, no examples or more than 65535, a missing delimiter, a file ending inside an example's
// first words, an example longer than the file, of an odd byte length or shorter than its own
// header, an index out of order, a label past the completions, no completions or more than 16, an
// empty context or completion, a completion running past its example, a token past the vocabulary,
// words left in an example, words after the last example, a file cut short.
#define _GNU_SOURCE  // mkdtemp
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/eval_file.h"
#include "test/test_harness.h"

#define VOCAB 50257
#define EXAMPLES 40
static char g_dir[] = "/tmp/test_eval_file_XXXXXX";

typedef struct {
    int label, k, ctx_len, len[EVAL_MAX_COMPLETIONS];
    uint16_t ctx[64], comp[EVAL_MAX_COMPLETIONS][24];
} Example;

static Example g_examples[EXAMPLES];

static void make_examples(TestRng* rng) {
    for (int i = 0; i < EXAMPLES; i++) {
        Example* e = &g_examples[i];
        e->k = i < 16 ? i + 1 : 4;  // 1 .. 16 completions, then HellaSwag's 4
        e->label = (int)(test_rng_next(rng) % (uint64_t)e->k);
        e->ctx_len = 1 + (int)(test_rng_next(rng) % 64);
        for (int j = 0; j < e->ctx_len; j++) e->ctx[j] = (uint16_t)(test_rng_next(rng) % VOCAB);
        for (int c = 0; c < e->k; c++) {
            e->len[c] = 1 + (int)(test_rng_next(rng) % 24);
            for (int j = 0; j < e->len[c]; j++) e->comp[c][j] = (uint16_t)(test_rng_next(rng) % VOCAB);
        }
    }
}

// Example i's words as the format has them.
static int example_words(const Example* e, int index, uint16_t* w) {
    int n = 0;
    w[n++] = EVAL_DELIMITER, w[n++] = 0, w[n++] = (uint16_t)index, w[n++] = (uint16_t)e->label;
    w[n++] = (uint16_t)e->k, w[n++] = (uint16_t)e->ctx_len;
    for (int j = 0; j < e->ctx_len; j++) w[n++] = e->ctx[j];
    for (int c = 0; c < e->k; c++) {
        w[n++] = (uint16_t)e->len[c];
        for (int j = 0; j < e->len[c]; j++) w[n++] = e->comp[c][j];
    }
    w[1] = (uint16_t)(2 * n);
    return n;
}

// The whole file in memory: header (n examples) and the first n examples' words; returns its words.
static size_t file_words(int n, int32_t* header, uint16_t* body) {
    memset(header, 0, 1024);
    header[0] = EVAL_MAGIC, header[1] = EVAL_VERSION, header[2] = n;
    size_t at = 0;
    for (int i = 0; i < n; i++) at += (size_t)example_words(&g_examples[i], i, body + at);
    return at;
}

static const char* write_file(const char* name, const int32_t* header, size_t header_bytes, const uint16_t* body,
                              size_t words) {
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE* f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    fwrite(header, 1, header_bytes, f);
    fwrite(body, 2, words, f);
    fclose(f);
    return path;
}

static uint16_t g_body[EXAMPLES * 600];
static int32_t g_header[256];

static void case_reads_back(void) {
    const size_t words = file_words(EXAMPLES, g_header, g_body);
    const char* path = write_file("good.bin", g_header, 1024, g_body, words);
    EvalFile ef;
    if (eval_file_open(&ef, path, VOCAB) != 0) {
        test_fail("eval_file_reads_back_every_token", "%s", ef.error);
        return;
    }
    int bad = ef.num_examples != EXAMPLES;
    for (int i = 0; i < EXAMPLES && !bad; i++) {
        const Example* e = &g_examples[i];
        const EvalExample* x = &ef.examples[i];
        bad |= x->label != e->label || x->num_completions != e->k || x->context_len != e->ctx_len ||
               memcmp(x->context, e->ctx, 2 * (size_t)e->ctx_len) != 0;
        for (int c = 0; c < e->k && !bad; c++)
            bad |= x->completion_len[c] != e->len[c] || memcmp(x->completion[c], e->comp[c], 2 * (size_t)e->len[c]);
    }
    test_report("eval_file_reads_back_every_token", !bad, "an example differs from what was written");
    eval_file_close(&ef);
}

// Row (context cut to its last `ctx` tokens, then completion c), built independently of eval_fill_row.
static int check_row(const EvalFile* ef, int e, int c, int T, char* why, size_t len) {
    int inputs[96], targets[96];
    for (int t = 0; t < T; t++) inputs[t] = targets[t] = -7;  // poison: an unwritten position fails
    const EvalRowSpan s = eval_fill_row(ef, e, c, T, inputs, targets);
    const Example* x = &g_examples[e];
    const int ctx = x->ctx_len + x->len[c] - 1 <= T ? x->ctx_len : T + 1 - x->len[c];
    int row[128], n = 0;
    for (int j = x->ctx_len - ctx; j < x->ctx_len; j++) row[n++] = x->ctx[j];
    for (int j = 0; j < x->len[c]; j++) row[n++] = x->comp[c][j];
    if (s.example != e || s.completion != c || s.start != ctx - 1 || s.len != x->len[c])
        return snprintf(why, len, "example %d/%d: span (%d, %d), want (%d, %d)", e, c, s.start, s.len, ctx - 1,
                        x->len[c]);
    for (int t = 0; t < T; t++) {
        const int in = t < n ? row[t] : EVAL_PAD_TOKEN, tg = t + 1 < n ? row[t + 1] : EVAL_PAD_TOKEN;
        if (inputs[t] != in || targets[t] != tg)
            return snprintf(why, len, "example %d/%d position %d: (%d, %d), want (%d, %d)", e, c, t, inputs[t],
                            targets[t], in, tg);
    }
    for (int j = 0; j < s.len; j++)  // the scored targets are the completion's tokens
        if (targets[s.start + j] != x->comp[c][j]) return snprintf(why, len, "span target %d", j);
    return 0;
}

static void case_rows(int T, const char* name) {
    EvalFile ef;
    const size_t words = file_words(EXAMPLES, g_header, g_body);
    if (eval_file_open(&ef, write_file("rows.bin", g_header, 1024, g_body, words), VOCAB) != 0) {
        test_fail(name, "%s", ef.error);
        return;
    }
    char why[256] = "";
    int cut = 0;
    for (int e = 0; e < EXAMPLES && !why[0]; e++)
        for (int c = 0; c < g_examples[e].k && !why[0]; c++) {
            check_row(&ef, e, c, T, why, sizeof(why));
            cut += g_examples[e].ctx_len + g_examples[e].len[c] - 1 > T;
        }
    // at T = 24 most rows need their context cut (contexts up to 64 tokens): the case covers it
    if (!why[0] && T < 64 && cut == 0) snprintf(why, sizeof(why), "no row was cut at T = %d", T);
    test_report(name, !why[0], "%s", why);
    eval_file_close(&ef);
}

static void case_choice(void) {
    EvalExample ex;
    memset(&ex, 0, sizeof(ex));
    ex.num_completions = 4;
    const int len[4] = {1, 10, 2, 10};
    for (int c = 0; c < 4; c++) ex.completion_len[c] = len[c];
    const double sums[4] = {3.0, 20.0, 2.5, 20.0};  // means 3, 2, 1.25, 2: by mean 2, by sum 2
    const double sums2[4] = {3.0, 20.0, 4.0, 20.0};  // means 3, 2, 2, 2: by mean the first 2.0 (1); by sum 0
    int m1, s1, m2, s2;
    eval_choose(&ex, sums, &m1, &s1);
    eval_choose(&ex, sums2, &m2, &s2);
    test_report("eval_choose_by_mean_and_by_sum_ties_to_the_first", m1 == 2 && s1 == 2 && m2 == 1 && s2 == 0,
                "got (%d, %d) and (%d, %d), want (2, 2) and (1, 0)", m1, s1, m2, s2);
}

// The examples with a row longer than T (context + completion - 1 positions: a row's last token is
// only a target), counted here independently of eval_check_fits.
static int count_cut(int T) {
    int cut = 0;
    for (int e = 0; e < EXAMPLES; e++) {
        int any = 0;
        for (int c = 0; c < g_examples[e].k; c++) any |= g_examples[e].ctx_len + g_examples[e].len[c] - 1 > T;
        cut += any;
    }
    return cut;
}

// eval_check_fits on the random file: the longest completion is the longest of every completion, and
// one position short of it the file is refused (-1); from there up to the longest row, at every T, the
// count of examples whose context is cut equals count_cut's. The range holds each example's longest
// row: there it fits exactly, so a count of context + completion positions would be one too many.
static void case_check_fits(void) {
    const char* name = "eval_check_fits_counts_cut_contexts";
    EvalFile ef;
    const size_t words = file_words(EXAMPLES, g_header, g_body);
    if (eval_file_open(&ef, write_file("fits.bin", g_header, 1024, g_body, words), VOCAB) != 0) {
        test_fail(name, "%s", ef.error);
        return;
    }
    int longest = 0, longest_row = 0;
    for (int e = 0; e < EXAMPLES; e++)
        for (int c = 0; c < g_examples[e].k; c++) {
            const int len = g_examples[e].len[c], row = g_examples[e].ctx_len + len - 1;
            longest = len > longest ? len : longest;
            longest_row = row > longest_row ? row : longest_row;
        }
    char why[256] = "";
    const int short_by_one = eval_check_fits(&ef, longest - 1);
    if (ef.longest_completion != longest || short_by_one != -1)
        snprintf(why, sizeof(why), "longest completion %d, want %d; at T = %d: %d, want -1", ef.longest_completion,
                 longest, longest - 1, short_by_one);
    for (int T = longest; T <= longest_row && !why[0]; T++) {
        const int got = eval_check_fits(&ef, T), want = count_cut(T);
        if (got != want) snprintf(why, sizeof(why), "at T = %d: %d examples cut, want %d", T, got, want);
    }
    test_report(name, !why[0], "%s", why);
    eval_file_close(&ef);
}

// One example whose long completion is not the first (2 then 20 tokens, context 3): the longest is 20,
// so T = 16 and T = 19 are refused; at T = 20 and 21 its rows (3 + 20 - 1 = 22 positions) need the
// context cut, one example; at T = 22 they fit exactly, none.
static void case_check_fits_later_completion(TestRng* rng) {
    const char* name = "eval_check_fits_longest_is_not_the_first_completion";
    Example x;
    memset(&x, 0, sizeof(x));
    x.k = 2, x.label = 1, x.ctx_len = 3, x.len[0] = 2, x.len[1] = 20;
    for (int j = 0; j < 3; j++) x.ctx[j] = (uint16_t)(test_rng_next(rng) % VOCAB);
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < x.len[c]; j++) x.comp[c][j] = (uint16_t)(test_rng_next(rng) % VOCAB);
    memset(g_header, 0, 1024);
    g_header[0] = EVAL_MAGIC, g_header[1] = EVAL_VERSION, g_header[2] = 1;
    const int words = example_words(&x, 0, g_body);
    EvalFile ef;
    if (eval_file_open(&ef, write_file("later.bin", g_header, 1024, g_body, (size_t)words), VOCAB) != 0) {
        test_fail(name, "%s", ef.error);
        return;
    }
    static const int T[5] = {16, 19, 20, 21, 22}, WANT[5] = {-1, -1, 1, 1, 0};
    char why[256] = "";
    if (ef.longest_completion != 20)
        snprintf(why, sizeof(why), "longest completion %d, want 20", ef.longest_completion);
    for (int i = 0; i < 5 && !why[0]; i++)
        if (eval_check_fits(&ef, T[i]) != WANT[i])
            snprintf(why, sizeof(why), "at T = %d: %d, want %d", T[i], eval_check_fits(&ef, T[i]), WANT[i]);
    test_report(name, !why[0], "%s", why);
    eval_file_close(&ef);
}

// ---- bad files --------------------------------------------------------------------------------------

typedef struct {
    const char* name;
    const char* want;  // in the error, after the file's path; a %d is write_bad's number
} BadCase;

static const BadCase BAD[] = {
    {"eval_file_missing", "cannot open"},
    {"eval_file_short_header", "shorter (25 int32) than the 256-int32 header"},
    {"eval_file_bad_magic", "magic 1234, not 20240522"},
    {"eval_file_unknown_version", "version 2, this reader knows 1"},
    {"eval_file_no_examples", "the header gives 0 examples"},
    {"eval_file_more_than_65535_examples", "the header gives 65536 examples (1 .. 65535)"},
    {"eval_file_missing_delimiter", "example 0 at byte 1024: no start delimiter"},
    {"eval_file_ends_inside_an_example_header", "example 40 at byte %d: no start delimiter"},
    {"eval_file_example_longer_than_the_file", "example 0 at byte 1024: its length, 60000 bytes, does not fit"},
    {"eval_file_example_odd_byte_length", "example 0 at byte 1024: its length, %d bytes, does not fit"},
    {"eval_file_example_shorter_than_its_header", "example 0 at byte 1024: its length, 10 bytes, does not fit"},
    {"eval_file_index_out_of_order", "example 0 at byte 1024: index 5"},
    {"eval_file_label_past_the_completions", "example 0: 1 completions (1 .. 16) with label 1"},
    {"eval_file_no_completions", "example 0: 0 completions"},
    {"eval_file_seventeen_completions", "example 0: 17 completions"},
    {"eval_file_empty_context", "example 0: the context has length 0"},
    {"eval_file_empty_completion", "example 0: completion 0 has length 0"},
    {"eval_file_completion_past_the_example", "example 0: completion 0 has length %d, past the example"},
    {"eval_file_token_past_the_vocabulary", "example 0: token 50257 is not below the vocabulary size 50257"},
    {"eval_file_words_left_in_an_example", "example 0: 1 words of its"},
    {"eval_file_words_after_the_last_example", "3 words after the last of the header's 40 examples"},
    {"eval_file_cut_short", "does not fit the file"},
    {"eval_file_odd_size", "not a 1024-byte header and whole uint16 words"},
};
#define BAD_CASES ((int)(sizeof(BAD) / sizeof(BAD[0])))

// Writes the good file with bad case i's change; returns its path, and in *arg the number its message
// holds where BAD[i].want has a %d.
static const char* write_bad(int i, size_t words, int* arg) {
    uint16_t* b = g_body;
    const int ctx = g_examples[0].ctx_len;  // example 0 has one completion, its length word at 6 + ctx
    switch (i) {
        case 0: return "/nonexistent/eval.bin";
        case 1: return write_file("bad.bin", g_header, 100, b, 0);
        case 2: g_header[0] = 1234; break;
        case 3: g_header[1] = 2; break;
        case 4: g_header[2] = 0; break;
        case 5: g_header[2] = 65536; break;  // the count is a uint16 index: 65535 at most
        case 6: b[0] = 1; break;
        case 7:  // one example more in the header; the file ends 3 words into its 6-word start
            g_header[2] = EXAMPLES + 1, *arg = EVAL_HEADER_BYTES + 2 * (int)words;
            b[words] = EVAL_DELIMITER, b[words + 1] = 12, b[words + 2] = EXAMPLES, words += 3;
            break;
        case 8: b[1] = 60000; break;
        case 9: *arg = ++b[1]; break;  // the same whole words, and one byte more
        case 10: b[1] = 10; break;  // 5 words: the delimiter to K, no context length
        case 11: b[2] = 5; break;
        case 12: b[3] = 1; break;
        case 13: b[4] = 0; break;
        case 14: b[4] = 17; break;
        case 15: b[5] = 0; break;
        case 16: b[6 + ctx] = 0; break;
        case 17: *arg = ++b[6 + ctx]; break;  // its last token would be example 1's delimiter
        case 18: b[6] = VOCAB; break;
        case 19:  // one more word inside example 0, counted in its length
            memmove(b + b[1] / 2 + 1, b + b[1] / 2, (words - b[1] / 2) * 2);
            b[b[1] / 2] = 7, b[1] += 2, words++;
            break;
        case 20: b[words] = b[words + 1] = b[words + 2] = 9, words += 3; break;
        case 21: words -= 3; break;
        case 22: break;  // one byte more, added by the caller
    }
    return write_file("bad.bin", g_header, 1024, b, words);
}

static void bad_file_cases(void) {
    for (int i = 0; i < BAD_CASES; i++) {
        const size_t words = file_words(EXAMPLES, g_header, g_body);
        int arg = 0;
        const char* path = write_bad(i, words, &arg);
        if (i == BAD_CASES - 1) {  // the good file and one byte more
            FILE* f = fopen(path, "ab");
            fputc(0, f);
            fclose(f);
        }
        char want[160];
        snprintf(want, sizeof(want), BAD[i].want, arg);
        EvalFile ef;
        const int status = eval_file_open(&ef, path, VOCAB);
        const int named = strncmp(ef.error, path, strlen(path)) == 0;
        test_report(BAD[i].name, status == -1 && named && strstr(ef.error, want) && !ef.examples,
                    "status %d, error \"%s\", want \"%s: ...%s...\"", status, ef.error, path, want);
        if (status == 0) eval_file_close(&ef);
    }
}

int main(void) {
    test_begin();
    test_plan(6 + BAD_CASES);
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    TestRng rng = {0x5eed0000ull ^ (uint64_t)getpid()};  // fresh tokens every run
    make_examples(&rng);
    case_reads_back();
    case_rows(96, "eval_rows_whole_context");
    case_rows(24, "eval_rows_context_cut_to_fit");
    case_choice();
    case_check_fits();
    case_check_fits_later_completion(&rng);
    bad_file_cases();
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_end();
}
