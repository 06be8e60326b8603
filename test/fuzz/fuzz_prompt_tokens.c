// fuzz_prompt_tokens.c: libFuzzer target for the prompt of train_gpt --generate --prompt-tokens
// (data/prompt_tokens.h): the input is a prompt file (token ids separated by commas or white space).
//
// prompt_tokens_parse gets the file's path; when the input, up to its first zero byte, has the form of
// a command-line list (digits, commas, spaces), it also gets the input itself as the argument. Either
// gives ids in 0 .. INT32_MAX or a refusal with a message.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/prompt_tokens.h"
#include "test/fuzz/fuzz_util.h"

static void parse(const char* text, const char* what) {
    char err[4096 + 512] = "";
    int n = -1;
    int* ids = prompt_tokens_parse(text, &n, err, sizeof(err));
    if (!ids) {
        if (!err[0]) abort();  // a refusal says why
        fuzz_expect_valid(0, what, err);
        return;
    }
    if (n < 1) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0) abort();
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    parse(fuzz_temp_file(data, size, "prompt_tokens"), "prompt_tokens_parse (file)");
    const size_t len = strnlen((const char*)data, size);
    char* text = (char*)malloc(len + 1);
    if (!text) return 0;
    memcpy(text, data, len);
    text[len] = '\0';
    if (text[0] && strspn(text, "0123456789, ") == len) parse(text, "prompt_tokens_parse (list)");
    free(text);
    return 0;
}
