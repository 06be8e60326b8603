// fuzz_model_file.c: libFuzzer target for llm.c model files (data/model_file.h): the input is one
// weights file (256-int32 header: magic 20240326, version 3 fp32 or 5 bf16, maxT, V, L, NH, C, Vp, NKV;
// then the 16 tensors of gpt_config.h).
//
// Reads it as train_gpt --init-from and --generate do: model_file_open checks the header and the size,
// the config it gives goes through gpt_config_check and gpt_num_params, and the tensors are read in
// order with model_file_read_tensor, at most a bounded prefix of each (the rest skipped, as a run with
// fewer positions than the file's reads wpe). A refusal must leave a message.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/model_file.h"
#include "test/fuzz/fuzz_util.h"

#define FUZZ_MAX_VALUES (1 << 14)

static void read_tensors(ModelFile* m, char* err, size_t err_len) {
    static float values[FUZZ_MAX_VALUES];  // room for fp32 or bf16 values
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t count = m->sizes[i] < FUZZ_MAX_VALUES ? m->sizes[i] : FUZZ_MAX_VALUES;
        if (i == GPT_WPE) count /= 2;  // the first rows only, as a shorter --seq-len reads
        if (model_file_read_tensor(m, i, values, count, err, err_len) != 0) {
            if (!err[0]) abort();
            fuzz_expect_valid(0, "model_file_read_tensor", err);
            return;
        }
    }
    if (fgetc(m->file) != EOF) fuzz_expect_valid(0, "model_file_read_tensor", "bytes left after the last tensor");
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_temp_file(data, size, "model_file");
    char err[512] = "";
    ModelFile m;
    if (model_file_open(&m, path, err, sizeof(err)) != 0) {
        if (!err[0] || m.file) abort();  // a refusal says why and leaves nothing open
        fuzz_expect_valid(0, "model_file_open", err);
        return 0;
    }
    char why[512];
    if (gpt_config_check(&m.config, why, sizeof(why)) == 0) (void)gpt_num_params(&m.config);
    read_tensors(&m, err, sizeof(err));
    model_file_close(&m);
    return 0;
}
