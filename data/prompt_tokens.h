// prompt_tokens.h: the prompt of `train_gpt --generate` (--prompt-tokens): token ids from a comma list
// on the command line ("464,3290") or, when the argument is not one, from a file of ids separated by
// commas or white space (scripts/encode_prompt.py writes one from text).
//
// A list is the argument itself when it holds only digits, commas and spaces; anything else names a
// file. An id is a whole number 0 .. INT32_MAX (the caller checks it against the vocab).
//
// Errors: prompt_tokens_parse returns NULL with one line in `err` that names the argument and the
// problem; nothing here prints or exits (train_gpt prints it and exits 2). Plain C11 that also
// compiles as C++ (nvcc). test/fuzz/fuzz_prompt_tokens.c fuzzes it.
#ifndef PROMPT_TOKENS_H
#define PROMPT_TOKENS_H

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The whole of file `path`, NUL-terminated, malloc'ed; NULL with err set when it cannot be opened (or
// memory runs out). A read error ends the text where it happened, as end of file does.
static inline char* prompt_tokens_read_file(const char* path, char* err, size_t err_len) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "--prompt-tokens %s: neither a comma list of token ids nor a readable file (%s); "
                               "scripts/encode_prompt.py writes one from text", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, got;
    char* content = (char*)malloc(cap + 1);
    while (content && (got = fread(content + len, 1, cap - len, f)) > 0) {
        if ((len += got) == cap) {
            char* grown = (char*)realloc(content, (cap *= 2) + 1);
            if (!grown) free(content);
            content = grown;
        }
    }
    fclose(f);
    if (!content) {
        snprintf(err, err_len, "--prompt-tokens %s: out of memory reading the file", path);
        return NULL;
    }
    content[len] = '\0';
    return content;
}

// The ids in `content` (separated by commas or white space) into a malloc'ed array of *n; NULL with err
// set at the first word that is not an id, or when there is none. `label` names the source in messages
// ("" for a list on the command line, else the file), `text` is the argument as given.
static inline int* prompt_tokens_scan(const char* content, const char* label, const char* text, int* n, char* err,
                                      size_t err_len) {
    int cap = 256, count = 0;
    int* ids = (int*)malloc((size_t)cap * sizeof(int));
    for (const char* p = content; ids && *p;) {
        if (*p == ',' || isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        char* end = NULL;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && !isspace((unsigned char)*end))) {
            snprintf(err, err_len, "--prompt-tokens%s%s: \"%.20s\" is not a token id (whole numbers separated by "
                                   "commas or spaces)", label[0] ? " " : "", label, p);
            free(ids);
            return NULL;
        }
        if (count == cap) {
            int* grown = cap < INT32_MAX / 2 ? (int*)realloc(ids, (size_t)(cap *= 2) * sizeof(int)) : NULL;
            if (!grown) free(ids);
            ids = grown;
            if (!ids) break;
        }
        ids[count++] = (int)v;
        p = end;
    }
    if (!ids) {
        snprintf(err, err_len, "--prompt-tokens %s: out of memory for the token ids", text);
        return NULL;
    }
    if (count == 0) {
        snprintf(err, err_len, "--prompt-tokens %s holds no token ids", text);
        free(ids);
        return NULL;
    }
    *n = count;
    return ids;
}

// Token ids from `text`: a comma list ("464,3290") or, when it is not one, a file of ids. Returns *n ids
// in a malloc'ed array, or NULL with the reason in err (one line, without "error: ").
static inline int* prompt_tokens_parse(const char* text, int* n, char* err, size_t err_len) {
    const int is_list = text[0] != '\0' && strspn(text, "0123456789, ") == strlen(text);
    if (is_list) return prompt_tokens_scan(text, "", text, n, err, err_len);
    char* content = prompt_tokens_read_file(text, err, err_len);
    if (!content) return NULL;
    int* ids = prompt_tokens_scan(content, text, text, n, err, err_len);
    free(content);
    return ids;
}

#endif  // PROMPT_TOKENS_H
