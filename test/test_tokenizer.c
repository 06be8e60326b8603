// test_tokenizer.c: the GPT-2 token table reader (data/tokenizer.h).
//
//   build/test_tokenizer                 the cases below (PASS/FAIL lines)
//   build/test_tokenizer --dump FILE     every token's bytes, one line per id, in hex (test_tokenizer.py
//                                        compares them with tiktoken's)
//   build/test_tokenizer --decode FILE   token ids from stdin (whitespace-separated) as text on stdout
//
// Cases: tables written here (versions 1 and 2, tokens that are pieces of one UTF-8 character) read
// back byte for byte, and decoded sequences; version 1's implied end-of-text token; every kind of bad
// file is refused with a message that names the file and the specific problem: missing, short header,
// bad magic, unknown version (0 and 3), vocab size 0 or past the maximum, end-of-text token past the
// vocab, a zero length, truncated inside a token, bytes after the last token.
#define _GNU_SOURCE  // open_memstream, truncate, mkdtemp
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "test/test_harness.h"

static char g_dir[] = "/tmp/test_tokenizer_XXXXXX";

typedef struct {
    const char* bytes;
    unsigned char len;
} Tok;

// Writes a table of `n` tokens with the header words given; returns its path (static buffer).
static const char* write_table(const char* name, uint32_t magic, uint32_t version, uint32_t vocab, uint32_t eot,
                               const Tok* toks, int n, const char* tail, size_t tail_len) {
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE* f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    uint32_t header[256] = {0};
    header[0] = magic, header[1] = version, header[2] = vocab, header[3] = eot;
    fwrite(header, sizeof(header), 1, f);
    for (int i = 0; i < n; i++) {
        fwrite(&toks[i].len, 1, 1, f);
        fwrite(toks[i].bytes, 1, toks[i].len, f);
    }
    if (tail_len) fwrite(tail, 1, tail_len, f);
    fclose(f);
    return path;
}

// "€" is E2 82 AC: split over two tokens, as byte-level BPE may.
static const Tok TOKS[] = {{"a", 1}, {"\xe2\x82", 2}, {"\xac b", 3}, {"<|endoftext|>", 13}};

static void case_reads_back(uint32_t version) {
    char name[64];
    snprintf(name, sizeof(name), "tokenizer_reads_version_%u", version);
    const char* path = write_table("good.bin", TOKENIZER_MAGIC, version, 4, version == 2 ? 3 : 0, TOKS, 4, NULL, 0);
    Tokenizer tok;
    if (tokenizer_load(&tok, path) != 0) { test_fail(name, "%s", tok.error); return; }
    int ok = tok.vocab_size == 4 && tok.eot_token == 3;
    for (uint32_t i = 0; i < 4; i++) {
        size_t len;
        const unsigned char* b = tokenizer_token_bytes(&tok, i, &len);
        ok &= b && len == TOKS[i].len && memcmp(b, TOKS[i].bytes, len) == 0;
    }
    size_t len = 7;
    ok &= tokenizer_token_bytes(&tok, 4, &len) == NULL && len == 0;
    // Decoding: the bytes back to back; a bad id is named.
    const int seq[] = {0, 1, 2, 3, 0, 9};
    char* text = NULL;
    size_t size = 0;
    FILE* mem = open_memstream(&text, &size);
    const size_t written = tokenizer_write(&tok, seq, 6, mem);
    fclose(mem);
    const char* want = "a\xe2\x82\xac b<|endoftext|>a<|bad token 9|>";
    ok &= written == strlen(want) && size == strlen(want) && memcmp(text, want, size) == 0;
    test_report(name, ok, "tokens or decoded text differ (decoded %zu bytes: \"%.*s\")", size, (int)size, text);
    free(text);
    tokenizer_free(&tok);
}

// Version 1 has no end-of-text field: 50256 (GPT-2's) when the vocab holds it, else the last id.
// V = 50300 (a padded vocab) tells the two apart; 50257 and 50256 pin the boundary. Word [3],
// which version 2 reads, is 7 here and must be ignored.
static const uint32_t V1_VOCABS[] = {50300, 50257, 50256};
static const uint32_t V1_EOTS[] = {50256, 50256, 50255};

static void case_version_1_eot(size_t k) {
    char name[64];
    snprintf(name, sizeof(name), "tokenizer_version_1_eot_vocab_%u", V1_VOCABS[k]);
    static unsigned char byte_values[256];
    static Tok toks[50300];  // the largest of V1_VOCABS
    for (int i = 0; i < 256; i++) byte_values[i] = (unsigned char)i;
    for (uint32_t i = 0; i < V1_VOCABS[k]; i++) toks[i] = (Tok){(const char*)&byte_values[i % 256], 1};
    const char* path = write_table("v1_eot.bin", TOKENIZER_MAGIC, 1, V1_VOCABS[k], 7, toks, (int)V1_VOCABS[k], NULL, 0);
    Tokenizer tok;
    if (tokenizer_load(&tok, path) != 0) { test_fail(name, "%s", tok.error); return; }
    test_report(name, tok.vocab_size == V1_VOCABS[k] && tok.eot_token == V1_EOTS[k], "vocab %u, eot %u (want %u)",
                tok.vocab_size, tok.eot_token, V1_EOTS[k]);
    tokenizer_free(&tok);
}

static void case_refused(const char* name, const char* path, const char* word) {
    Tokenizer tok;
    const int rc = tokenizer_load(&tok, path);
    test_report(name, rc == -1 && strstr(tok.error, path) && strstr(tok.error, word),
                "rc %d, message \"%s\" (wants the path and \"%s\")", rc, tok.error, word);
}

// The named cases of bad_file_cases, one refusal each. Each word is part of the specific message and
// of no path: without a check, the file fails later, for another reason, and that message names the
// file too.
#define BAD_FILE_CASES 12

static void bad_file_cases(void) {
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/none.bin", g_dir);
    case_refused("tokenizer_refuses_missing_file", missing, "cannot open");
    case_refused("tokenizer_refuses_bad_magic", write_table("magic.bin", 20240520, 2, 4, 3, TOKS, 4, NULL, 0),
                 "bad magic 20240520");
    case_refused("tokenizer_refuses_version_3", write_table("v3.bin", TOKENIZER_MAGIC, 3, 4, 3, TOKS, 4, NULL, 0),
                 "version 3;");
    // Version 0 is below the range, not above it: read as version 1 it would load.
    case_refused("tokenizer_refuses_version_0", write_table("v0.bin", TOKENIZER_MAGIC, 0, 4, 3, TOKS, 4, NULL, 0),
                 "version 0;");
    // Vocab size 0 with end-of-text 0 would also fail the end-of-text check ("... below the vocab size 0"),
    // so only the range message shows the size check itself.
    case_refused("tokenizer_refuses_vocab_0", write_table("vocab0.bin", TOKENIZER_MAGIC, 2, 0, 0, TOKS, 0, NULL, 0),
                 "vocab size 0 is outside 1 .. 1048576");
    // One past TOKENIZER_MAX_VOCAB: unchecked, it would read on and report the file truncated.
    case_refused("tokenizer_refuses_vocab_over_max",
                 write_table("vocab_max.bin", TOKENIZER_MAGIC, 2, (1u << 20) + 1, 3, TOKS, 4, NULL, 0),
                 "vocab size 1048577 is outside 1 .. 1048576");
    case_refused("tokenizer_refuses_eot_past_vocab",
                 write_table("eot.bin", TOKENIZER_MAGIC, 2, 4, 4, TOKS, 4, NULL, 0), "end-of-text");
    const Tok zero[] = {{"a", 1}, {"", 0}};
    case_refused("tokenizer_refuses_zero_length", write_table("zero.bin", TOKENIZER_MAGIC, 2, 2, 0, zero, 2, NULL, 0),
                 "length 0");
    case_refused("tokenizer_refuses_truncated", write_table("short.bin", TOKENIZER_MAGIC, 2, 5, 3, TOKS, 4, "\x05" "ab", 3),
                 "truncated");
    case_refused("tokenizer_refuses_missing_tokens",
                 write_table("few.bin", TOKENIZER_MAGIC, 2, 6, 3, TOKS, 4, NULL, 0), "truncated");
    case_refused("tokenizer_refuses_trailing_bytes",
                 write_table("tail.bin", TOKENIZER_MAGIC, 2, 4, 3, TOKS, 4, "xy", 2), "after");
    // 100 bytes: the start of a good header (magic, version, V, eot) and no more. A check that only
    // refuses an empty read goes on with a half-read header and fails later with another message.
    const char* cut = write_table("cut.bin", TOKENIZER_MAGIC, 2, 4, 3, TOKS, 0, NULL, 0);
    if (truncate(cut, 100) != 0) perror(cut);
    case_refused("tokenizer_refuses_short_header", cut, "shorter than the 1024-byte header");
}

static int dump(const char* path) {
    Tokenizer tok;
    if (tokenizer_load(&tok, path) != 0) { fprintf(stderr, "%s\n", tok.error); return 1; }
    for (uint32_t i = 0; i < tok.vocab_size; i++) {
        size_t len;
        const unsigned char* b = tokenizer_token_bytes(&tok, i, &len);
        for (size_t j = 0; j < len; j++) printf("%02x", b[j]);
        putchar('\n');
    }
    tokenizer_free(&tok);
    return 0;
}

static int decode(const char* path) {
    Tokenizer tok;
    if (tokenizer_load(&tok, path) != 0) { fprintf(stderr, "%s\n", tok.error); return 1; }
    int id;
    while (scanf("%d", &id) == 1) tokenizer_write(&tok, &id, 1, stdout);
    tokenizer_free(&tok);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) return dump(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--decode") == 0) return decode(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--dump FILE | --decode FILE]\n", argv[0]);
        return 2;
    }
    test_begin();
    const uint32_t versions[] = {2, 1};  // the table layouts read back
    const size_t num_v1 = sizeof(V1_VOCABS) / sizeof(V1_VOCABS[0]);
    test_plan((int)(sizeof(versions) / sizeof(versions[0]) + num_v1) + BAD_FILE_CASES);
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) case_reads_back(versions[i]);
    for (size_t k = 0; k < num_v1; k++) case_version_1_eot(k);
    bad_file_cases();
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_end();
}
