// fuzz_checkpoint.c: libFuzzer target for training checkpoints (data/checkpoint.h): the input is one
// checkpoint file (1024-byte header, then the payload: bf16 weights and three fp32 arrays, whole or
// one rank's ZeRO-1 shard, then the optional FP8-scales section of header.fp8_state_bytes).
//
// Reads it as train_gpt --resume does: checkpoint_reader_open checks the header and the size, the
// payload is read in staging pieces in train_gpt's order (weights, master, adam_m, adam_v, the FP8
// section) and checkpoint_reader_finish checks the checksum. A refusal must leave a message. The
// file's first bytes also go, as a name, to the step_*.ckpt name parser that --resume DIR relies on.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/checkpoint.h"
#include "test/fuzz/fuzz_util.h"

#define FUZZ_ERR_LEN (CHECKPOINT_PATH_MAX + 256)
#define FUZZ_STAGING 4096  // small, so a payload is read in several pieces

// Reads `bytes` of payload in staging pieces; 0 when all were read.
static int read_part(CheckpointReader* r, int64_t bytes, char* err) {
    static unsigned char staging[FUZZ_STAGING];
    for (int64_t done = 0; done < bytes; done += FUZZ_STAGING) {
        const size_t n = (size_t)(bytes - done < FUZZ_STAGING ? bytes - done : FUZZ_STAGING);
        if (checkpoint_reader_read(r, staging, n, err, FUZZ_ERR_LEN) != 0) return -1;
    }
    return 0;
}

static void read_checkpoint(const char* path) {
    char err[FUZZ_ERR_LEN] = "";
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, sizeof(err)) != 0) {
        if (!err[0] || r.file) abort();  // a refusal says why and leaves nothing open
        fuzz_expect_valid(0, "checkpoint_reader_open", err);
        return;
    }
    const CheckpointHeader h = r.header;
    const int64_t state = checkpoint_state_elements(&h);
    int ok = read_part(&r, h.num_params * 2, err) == 0;
    for (int k = 0; k < 3 && ok; k++) ok = read_part(&r, state * 4, err) == 0;
    if (h.fp8_state_bytes < 0 || h.fp8_state_bytes > CHECKPOINT_MAX_FP8_STATE_BYTES) abort();  // open refuses these
    ok = ok && read_part(&r, h.fp8_state_bytes, err) == 0;
    if (!ok) {
        fuzz_expect_valid(0, "checkpoint_reader_read", err);
        checkpoint_reader_close(&r);
        return;
    }
    if (checkpoint_reader_finish(&r, err, sizeof(err)) != 0) fuzz_expect_valid(0, "checkpoint_reader_finish", err);
    checkpoint_reader_close(&r);
}

// The input's first bytes as a directory entry's name.
static void parse_name(const uint8_t* data, size_t size) {
    char name[64];
    const size_t n = size < sizeof(name) - 1 ? size : sizeof(name) - 1;
    memcpy(name, data, n);
    name[n] = '\0';
    int rank = 0, world = 0;
    const int64_t step = checkpoint_parse_name(name, &rank, &world);
    if (step >= 0 && (world < 0 || (world > 0 && (rank < 0 || rank >= world)))) abort();
    char out[CHECKPOINT_PATH_MAX];
    checkpoint_rank_file(out, sizeof(out), name, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    read_checkpoint(fuzz_temp_file(data, size, "checkpoint"));
    parse_name(data, size);
    return 0;
}
