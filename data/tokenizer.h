// tokenizer.h: the GPT-2 decoder: token ids to the bytes of text, for printing samples.
//
// File format (llm.c's tokenizer file; written by scripts/prepare_data.py beside the shards as
// gpt2_tokenizer.bin, and llm.c's own file reads the same):
//   header  256 uint32, little-endian: [0] = 20240328 (magic), [1] = version (1 or 2), [2] = V, the
//           number of tokens, [3] = the end-of-text token (version 2; version 1 files have none and
//           50256 is assumed); the rest is zero
//   body    for each token id 0 .. V-1: one uint8 length L (1..255), then L bytes
// A token's bytes may be part of a UTF-8 character (GPT-2's byte-level BPE): the bytes of a token
// sequence, concatenated, are the text.
//
// Errors: tokenizer_load returns -1 and leaves one line in tok->error that names the file, the
// problem and what to do. Plain C11 that also compiles as C++ (nvcc).
// Usage:
//   Tokenizer tok;
//   if (tokenizer_load(&tok, "data/tinyshakespeare/gpt2_tokenizer.bin") != 0) { puts(tok.error); ... }
//   size_t n; const unsigned char* bytes = tokenizer_token_bytes(&tok, 464, &n);
//   tokenizer_write(&tok, tokens, count, stdout);
//   tokenizer_free(&tok);
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_MAX_VOCAB (1 << 20)
#define TOKENIZER_V1_EOT 50256
#define TOKENIZER_FILE_NAME "gpt2_tokenizer.bin"  // its name beside the shards

typedef struct {
    uint32_t vocab_size;
    uint32_t eot_token;
    uint32_t* offsets;     // (vocab_size + 1): token i's bytes are bytes[offsets[i] .. offsets[i + 1])
    unsigned char* bytes;  // every token's bytes, back to back
    char error[512];
} Tokenizer;

static inline int tokenizer_fail_(Tokenizer* tok, FILE* f, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tok->error, sizeof(tok->error), fmt, ap);
    va_end(ap);
    if (f) fclose(f);
    free(tok->offsets);
    free(tok->bytes);
    tok->offsets = NULL;
    tok->bytes = NULL;
    return -1;
}

#define TOKENIZER_REMAKE "; write a new one with scripts/prepare_data.py (it puts gpt2_tokenizer.bin beside the shards)"

// Reads the token table at `path`; 0 on success, -1 with tok->error set.
static inline int tokenizer_load(Tokenizer* tok, const char* path) {
    memset(tok, 0, sizeof(*tok));
    FILE* f = fopen(path, "rb");
    if (!f) return tokenizer_fail_(tok, NULL, "cannot open token table %s: %s" TOKENIZER_REMAKE, path, strerror(errno));
    uint32_t header[TOKENIZER_HEADER_INTS];
    if (fread(header, sizeof(uint32_t), TOKENIZER_HEADER_INTS, f) != TOKENIZER_HEADER_INTS)
        return tokenizer_fail_(tok, f, "%s: shorter than the 1024-byte header of a token table" TOKENIZER_REMAKE, path);
    if (header[0] != TOKENIZER_MAGIC)
        return tokenizer_fail_(tok, f, "%s: bad magic %u (a token table starts with %u); is it a token table?", path,
                               header[0], TOKENIZER_MAGIC);
    if (header[1] != 1 && header[1] != 2)
        return tokenizer_fail_(tok, f, "%s: token table version %u; this program reads versions 1 and 2", path,
                               header[1]);
    const uint32_t V = header[2];
    if (V < 1 || V > TOKENIZER_MAX_VOCAB)
        return tokenizer_fail_(tok, f, "%s: vocab size %u is outside 1 .. %d" TOKENIZER_REMAKE, path, V,
                               TOKENIZER_MAX_VOCAB);
    // Version 1 has no end-of-text field: GPT-2's 50256 (the last id of a smaller vocab).
    const uint32_t eot = header[1] == 2 ? header[3] : V > TOKENIZER_V1_EOT ? TOKENIZER_V1_EOT : V - 1;
    if (eot >= V)
        return tokenizer_fail_(tok, f, "%s: end-of-text token %u is not below the vocab size %u" TOKENIZER_REMAKE, path,
                               eot, V);
    tok->vocab_size = V;
    tok->eot_token = eot;
    // The body is at most the rest of the file: V lengths and the bytes.
    long body = -1;
    if (fseek(f, 0, SEEK_END) == 0) body = ftell(f) - (long)sizeof(header);
    if (body < 0 || fseek(f, (long)sizeof(header), SEEK_SET) != 0)
        return tokenizer_fail_(tok, f, "%s: cannot find its size (not a regular file?)", path);
    tok->offsets = (uint32_t*)malloc(((size_t)V + 1) * sizeof(uint32_t));
    tok->bytes = (unsigned char*)malloc(body > 0 ? (size_t)body : 1);
    if (!tok->offsets || !tok->bytes) return tokenizer_fail_(tok, f, "%s: out of memory for %u tokens", path, V);
    uint32_t used = 0;
    for (uint32_t i = 0; i < V; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || len == 0 || (long)used + len > body ||
            fread(tok->bytes + used, 1, len, f) != len)
            return tokenizer_fail_(tok, f,
                                   feof(f) || (len && (long)used + len > body)
                                       ? "%s: ends inside token %u of %u (truncated)" TOKENIZER_REMAKE
                                           : "%s: token %u of %u has length 0 or cannot be read" TOKENIZER_REMAKE,
                                   path, i, V);
        tok->offsets[i] = used;
        used += len;
    }
    tok->offsets[V] = used;
    if (fgetc(f) != EOF)
        return tokenizer_fail_(tok, f, "%s: has bytes after its %u tokens" TOKENIZER_REMAKE, path, V);
    fclose(f);
    return 0;
}

// The bytes of `token` and their count in *len; NULL (and *len = 0) for an id outside the vocab.
static inline const unsigned char* tokenizer_token_bytes(const Tokenizer* tok, uint32_t token, size_t* len) {
    if (token >= tok->vocab_size) {
        *len = 0;
        return NULL;
    }
    *len = tok->offsets[token + 1] - tok->offsets[token];
    return tok->bytes + tok->offsets[token];
}

// Writes the text of `count` tokens to `out`: their bytes back to back; an id outside the vocab
// becomes "<|bad token N|>". Returns the bytes written.
static inline size_t tokenizer_write(const Tokenizer* tok, const int* tokens, size_t count, FILE* out) {
    size_t written = 0;
    for (size_t i = 0; i < count; i++) {
        size_t len;
        const unsigned char* b = tokens[i] >= 0 ? tokenizer_token_bytes(tok, (uint32_t)tokens[i], &len) : NULL;
        if (b) {
            written += fwrite(b, 1, len, out);
        } else {
            const int n = fprintf(out, "<|bad token %d|>", tokens[i]);
            written += n > 0 ? (size_t)n : 0;
        }
    }
    return written;
}

static inline void tokenizer_free(Tokenizer* tok) {
    free(tok->offsets);
    free(tok->bytes);
    tok->offsets = NULL;
    tok->bytes = NULL;
}

#endif  // TOKENIZER_H
