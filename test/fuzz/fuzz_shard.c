// fuzz_shard.c: libFuzzer target for the token shard reader (data/dataloader.h): the input is one
// shard file (256-int32 header: magic 20240520, version 1, token count; then uint16 tokens).
//
// Opens it as train_gpt does, under two settings (one rank, in order; rank 1 of 2, shuffled), then
// serves batches across an epoch boundary and restores saved positions, good and bad. A refusal
// must leave a message; a served batch must hold only tokens below the vocab size.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/dataloader.h"
#include "test/fuzz/fuzz_util.h"

#define FUZZ_VOCAB 50257

static void check_batch(const DataLoader* dl) {
    for (int64_t i = 0; i < (int64_t)dl->B * dl->T; i++) {
        if (dl->inputs[i] < 0 || dl->inputs[i] >= FUZZ_VOCAB || dl->targets[i] < 0 || dl->targets[i] >= FUZZ_VOCAB) {
            fprintf(stderr, "fuzz_shard: batch token out of range at %lld\n", (long long)i);
            abort();
        }
    }
}

static void run_loader(const char* path, int B, int T, int rank, int world, int shuffle) {
    DataLoader dl;
    if (dataloader_open(&dl, path, B, T, rank, world, FUZZ_VOCAB, shuffle, 1337) != 0) {
        if (!dl.error[0]) abort();  // a refusal must say why
        fuzz_expect_valid(0, "dataloader_open", dl.error);
        return;
    }
    const int64_t per_epoch = dataloader_batches_per_epoch(&dl);
    const int64_t steps = per_epoch + 2 < 8 ? per_epoch + 2 : 8;  // past the epoch's end when it is short
    for (int64_t i = 0; i < steps; i++) {
        if (dataloader_next_batch(&dl) != 0) {
            if (!dl.error[0]) abort();
            fuzz_expect_valid(0, "dataloader_next_batch", dl.error);
            break;
        }
        check_batch(&dl);
    }
    DataLoaderState st = dataloader_get_state(&dl);
    if (dataloader_set_state(&dl, st) != 0) fuzz_expect_valid(0, "dataloader_set_state", dl.error);
    DataLoaderState bad = {st.epoch, st.shard_index, per_epoch + 1};  // beyond every shard's chunks
    if (dataloader_set_state(&dl, bad) == 0) abort();
    dataloader_reset(&dl);
    if (dataloader_next_batch(&dl) == 0) check_batch(&dl);
    dataloader_close(&dl);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_temp_file(data, size, "shard");
    run_loader(path, 1, 4, 0, 1, 0);
    run_loader(path, 2, 3, 1, 2, 1);
    return 0;
}
