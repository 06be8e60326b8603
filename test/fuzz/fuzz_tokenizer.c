// fuzz_tokenizer.c: libFuzzer target for the token table (data/tokenizer.h): the input is one
// gpt2_tokenizer.bin (256-uint32 header: magic 20240328, version 1 or 2, V, end-of-text token; then V
// length-prefixed tokens).
//
// Loads it with tokenizer_load as train_gpt's samples do, then looks up and writes every token (and ids
// outside the vocab) as gpt_print_tokens does. A refusal must leave a message; a loaded table's tokens
// must lie inside its bytes.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/tokenizer.h"
#include "test/fuzz/fuzz_util.h"

static void use_table(const Tokenizer* tok, size_t file_size) {
    size_t total = 0;
    for (uint32_t i = 0; i < tok->vocab_size; i++) {
        size_t len = 0;
        const unsigned char* b = tokenizer_token_bytes(tok, i, &len);
        if (!b || len < 1 || len > 255) abort();
        total += len;
    }
    if (total + tok->vocab_size + TOKENIZER_HEADER_INTS * 4 != file_size || tok->eot_token >= tok->vocab_size) abort();
    size_t len = 1;
    if (tokenizer_token_bytes(tok, tok->vocab_size, &len) != NULL || len != 0) abort();
    FILE* sink = fopen("/dev/null", "wb");
    if (!sink) abort();
    const int ids[] = {0, (int)tok->eot_token, (int)tok->vocab_size - 1, (int)tok->vocab_size, -1, 2147483647};
    tokenizer_write(tok, ids, sizeof(ids) / sizeof(ids[0]), sink);
    fclose(sink);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Tokenizer tok;
    if (tokenizer_load(&tok, fuzz_temp_file(data, size, "tokenizer")) != 0) {
        if (!tok.error[0] || tok.offsets || tok.bytes) abort();  // a refusal says why and keeps no memory
        fuzz_expect_valid(0, "tokenizer_load", tok.error);
        return 0;
    }
    use_table(&tok, size);
    tokenizer_free(&tok);
    return 0;
}
