// tokenizer.h: the GPT-2 decoder (token ids -> bytes) for printing samples, reading a token table in
// llm.c's tokenizer file format, so llm.c's gpt2_tokenizer.bin works as it is.
//
// File layout (little-endian):
//   header  256 uint32: [0] = 20240328 (magic), [1] = version 1 or 2, [2] = number of tokens V,
//           [3] = the end-of-text token (version 2; version 1 files mean 50256); the rest zero
//   body    V records: a uint8 length n (1..255), then the token's n bytes
// A token's bytes are raw bytes, not necessarily whole UTF-8 characters: printing the bytes of
// consecutive tokens one after another gives the text.
//
// Plain C11 that also compiles as C++ (nvcc). tokenizer_open returns -1 with one line in `err`.
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_FILE_NAME "gpt2_tokenizer.bin"  // beside the shards

typedef struct {
    int vocab_size;
    int eot_token;
    unsigned char* bytes;  // every token's bytes back to back
    uint32_t* offsets;     // (vocab_size + 1): token i is bytes[offsets[i] .. offsets[i + 1])
} Tokenizer;

static inline void tokenizer_free(Tokenizer* t) {
    free(t->bytes);
    free(t->offsets);
    memset(t, 0, sizeof(*t));
}

static inline int tokenizer_open(Tokenizer* t, const char* path, char* err, size_t err_len) {
    memset(t, 0, sizeof(*t));
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open the token table: %s", path, strerror(errno));
        return -1;
    }
    uint32_t h[TOKENIZER_HEADER_INTS];
    const char* why = NULL;
    if (fread(h, sizeof(uint32_t), TOKENIZER_HEADER_INTS, f) != TOKENIZER_HEADER_INTS || h[0] != TOKENIZER_MAGIC)
        why = "not a token table (expected llm.c's tokenizer format: magic 20240328 in a 1024-byte header)";
    else if (h[1] != 1 && h[1] != 2)
        why = "unknown version (expected 1 or 2)";
    else if (h[2] < 1 || h[2] > (1u << 24))
        why = "bad token count in the header";
    if (!why) {
        t->vocab_size = (int)h[2];
        t->eot_token = h[1] == 2 ? (int)h[3] : 50256;
        t->offsets = (uint32_t*)malloc(((size_t)t->vocab_size + 1) * sizeof(uint32_t));
        t->bytes = (unsigned char*)malloc((size_t)t->vocab_size * 255);
        if (!t->offsets || !t->bytes) why = "out of host memory";
    }
    uint32_t used = 0;
    for (int i = 0; !why && i < t->vocab_size; i++) {
        unsigned char n = 0;
        t->offsets[i] = used;
        if (fread(&n, 1, 1, f) != 1 || n == 0 || fread(t->bytes + used, 1, n, f) != n)
            why = "truncated or corrupt (a token record is missing or empty)";
        used += n;
    }
    if (!why) t->offsets[t->vocab_size] = used;
    if (!why && fgetc(f) != EOF) why = "longer than its header says (trailing bytes)";
    fclose(f);
    if (why) {
        snprintf(err, err_len, "%s: %s", path, why);
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

// Token `id`'s bytes and their count; NULL (and 0) for an id outside the table.
static inline const unsigned char* tokenizer_decode(const Tokenizer* t, int id, int* n) {
    if (id < 0 || id >= t->vocab_size) {
        *n = 0;
        return NULL;
    }
    *n = (int)(t->offsets[id + 1] - t->offsets[id]);
    return t->bytes + t->offsets[id];
}

// Writes token `id` to `out`: its bytes, except control bytes other than newline and tab (a single
// stray byte would garble a terminal); ids outside the table as "<id>".
static inline void tokenizer_print(const Tokenizer* t, int id, FILE* out) {
    int n = 0;
    const unsigned char* b = tokenizer_decode(t, id, &n);
    if (!b) {
        fprintf(out, "<%d>", id);
        return;
    }
    for (int i = 0; i < n; i++)
        if (b[i] >= 32 || b[i] == '\n' || b[i] == '\t') fputc(b[i], out);
}

#endif  // TOKENIZER_H
