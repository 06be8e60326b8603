// test_prompt_tokens.c: the prompt of train_gpt --generate --prompt-tokens (data/prompt_tokens.h).
//
// Cases: comma lists on the command line and files of ids separated by commas and white space read
// back id for id; ids up to INT32_MAX accepted (the vocab is the caller's check, gpt_generate.cuh's);
// more ids than the parser's first array (256) and a file longer than its reader's first buffer
// (64 KiB), fresh random ids every run, read back whole (the binary has ASan: a buffer that does not
// grow is a heap overflow, not a silent pass); refused with a message that quotes the bad word, or
// says there is none: an id past INT32_MAX or past long, a list of only separators, an empty file,
// words, negative or decimal numbers in a file, a missing file, an empty argument.
#define _GNU_SOURCE  // mkdtemp
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/prompt_tokens.h"
#include "test/test_harness.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static char g_dir[] = "/tmp/test_prompt_tokens_XXXXXX";

// Writes `text` to a file of the test's folder; returns its path (static buffer).
static const char* write_text(const char* name, const char* text) {
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE* f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return path;
}

typedef struct {
    const char* name;
    const char* text;  // the argument, or with is_file the file's content (then the argument is its path)
    int is_file, n, ids[4];
} Accepted;

static const Accepted ACCEPTED[] = {
    {"prompt_list_of_ids", "464,3290,318", 0, 3, {464, 3290, 318}},
    {"prompt_list_commas_and_spaces_anywhere", " 464, 3290 ,,318  11,", 0, 4, {464, 3290, 318, 11}},
    {"prompt_list_ids_up_to_int32_max", "0,50257,2147483647", 0, 3, {0, 50257, 2147483647}},
    {"prompt_file_white_space_and_commas", "464 3290\n318,\t11\r\n", 1, 4, {464, 3290, 318, 11}},
};

typedef struct {
    const char* name;
    const char* text;  // as in Accepted
    int is_file;
    const char* want;  // in the message
} Refused;

static const Refused REFUSED[] = {
    {"prompt_id_past_int32_max_refused", "4294967297", 0, "--prompt-tokens: \"4294967297\" is not a token id"},
    {"prompt_id_int32_max_plus_one_refused", "464,2147483648", 0, "\"2147483648\" is not a token id"},
    {"prompt_id_past_long_refused", "1,99999999999999999999", 0, "\"99999999999999999999\" is not a token id"},
    {"prompt_only_a_comma_refused", ",", 0, "--prompt-tokens , holds no token ids"},
    {"prompt_only_separators_refused", " , ,", 0, "holds no token ids"},
    {"prompt_empty_file_refused", "", 1, "holds no token ids"},
    {"prompt_file_word_refused", "464 abc 3", 1, "\"abc 3\" is not a token id"},
    {"prompt_file_digits_then_letters_refused", "464 12x", 1, "\"12x\" is not a token id"},
    {"prompt_file_negative_refused", "464,-5", 1, "\"-5\" is not a token id"},
    {"prompt_file_decimal_refused", "3.5", 1, "\"3.5\" is not a token id"},
    {"prompt_file_id_past_int32_max_refused", "1 4294967297", 1, "\"4294967297\" is not a token id"},
    {"prompt_missing_file_refused", "/nonexistent/prompt.txt", 0,
     "/nonexistent/prompt.txt: neither a comma list of token ids nor a readable file"},
    {"prompt_empty_argument_refused", "", 0, "neither a comma list of token ids nor a readable file"},
};

static void accepted_cases(void) {
    for (size_t i = 0; i < COUNT(ACCEPTED); i++) {
        const Accepted* a = &ACCEPTED[i];
        const char* arg = a->is_file ? write_text("accepted.txt", a->text) : a->text;
        char err[512] = "";
        int n = -1;
        int* ids = prompt_tokens_parse(arg, &n, err, sizeof(err));
        int ok = ids && n == a->n;
        for (int j = 0; ok && j < n; j++) ok = ids[j] == a->ids[j];
        test_report(a->name, ok, "got %d ids (want %d), first %d; message \"%s\"", ids ? n : -1, a->n,
                    ids && n > 0 ? ids[0] : -1, err);
        free(ids);
    }
}

// Each refusal returns NULL with a message quoting the bad word (or saying there is none); a file's
// message names the file.
static void refused_cases(void) {
    for (size_t i = 0; i < COUNT(REFUSED); i++) {
        const Refused* r = &REFUSED[i];
        const char* arg = r->is_file ? write_text("refused.txt", r->text) : r->text;
        char err[512] = "";
        int n = -1;
        int* ids = prompt_tokens_parse(arg, &n, err, sizeof(err));
        const int named = !r->is_file || strstr(err, arg) != NULL;
        test_report(r->name, !ids && strstr(err, r->want) && named, "%s %d ids; message \"%s\", want \"...%s...\"%s",
                    ids ? "accepted" : "refused", ids ? n : 0, err, r->want, named ? "" : " naming the file");
        free(ids);
    }
}

// n random ids, separated by commas and spaces (a list: the argument itself), or with newlines and
// tabs as well (a file: the argument is its path); parsed, every id must come back in order.
static void case_many_ids(TestRng* rng, int n, int as_file, const char* name) {
    static const char* const SEPARATORS[] = {",", " ", ", ", "  ,", "\n", "\t", " \r\n"};
    const size_t kinds = as_file ? COUNT(SEPARATORS) : 4;
    int* want = (int*)malloc((size_t)n * sizeof(int));
    char* text = (char*)malloc((size_t)n * 16 + 1);
    if (!want || !text) { fprintf(stderr, "out of memory\n"); exit(2); }
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        want[i] = (int)(test_rng_next(rng) % 100000);
        const char* sep = i + 1 < n ? SEPARATORS[test_rng_next(rng) % kinds] : "";
        len += (size_t)sprintf(text + len, "%d%s", want[i], sep);
    }
    const char* arg = as_file ? write_text("many.txt", text) : text;
    char err[512] = "";
    int got = -1;
    int* ids = prompt_tokens_parse(arg, &got, err, sizeof(err));
    int first_bad = -1;
    for (int i = 0; ids && got == n && i < n && first_bad < 0; i++)
        if (ids[i] != want[i]) first_bad = i;
    test_report(name, ids && got == n && first_bad < 0, "%zu bytes: %d ids of %d, first differing at %d; message \"%s\"",
                len, ids ? got : -1, n, first_bad, err);
    free(ids);
    free(text);
    free(want);
}

int main(void) {
    test_begin();
    test_plan((int)(COUNT(ACCEPTED) + COUNT(REFUSED)) + 3);  // and the three case_many_ids below
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    TestRng rng = {0x9a0e0000ull ^ (uint64_t)getpid()};  // fresh ids every run
    accepted_cases();
    refused_cases();
    case_many_ids(&rng, 300, 0, "prompt_list_of_300_ids_past_the_first_array");
    case_many_ids(&rng, 1000, 0, "prompt_list_of_1000_ids");
    // about 30000 · 6.6 bytes, some 200 KB: the file reader's first 64 KiB buffer grows twice
    case_many_ids(&rng, 30000, 1, "prompt_file_of_30000_ids_past_the_first_read_buffer");
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_end();
}
