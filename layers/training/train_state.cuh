// train_state.cuh: the training state between the GPU and files: saving and loading checkpoints
// (data/checkpoint.h's format) for an exact resume, checking that a checkpoint belongs to this run,
// finding the one to resume, the llm.c weight files (data/model_file.h) that --init-from reads
// and --dump-grads writes, and the weights alone of either (--generate, --eval-only).
//
// What a checkpoint holds (in this order): the model's bf16 weights (all num_params), then the
// optimizer's fp32 master weights, AdamW m and v over the optimizer's range (all of them, or with
// ZeRO-1 this rank's shard; layers/optimizer/optimizer.cuh), then, from a --precision fp8 run, the FP8
// scales (gpt_fp8.cuh's delayed-scaling states, the same in every rank's file). Bytes move through a
// pinned host staging buffer of TRAIN_STATE_STAGING_BYTES, a piece at a time.
//
// Precision across a resume: an fp8 run resuming an fp8 checkpoint takes its FP8 scales (an exact
// resume); a bf16 run resuming an fp8 checkpoint reads them (for the checksum) and leaves them, with a
// note; an fp8 run resuming a bf16 checkpoint (no FP8 section) starts its scales afresh, with a note.
//
// Errors: a checkpoint or weight file that cannot be used stops the program with a message that
// names the file and what to change (exit 2 for a file of another run or model, 1 for an unreadable
// or corrupt one); a checkpoint that cannot be written is reported and returns -1, so the run goes on.
#ifndef TRAIN_STATE_CUH
#define TRAIN_STATE_CUH

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "layers/cuda_common.h"
#include "layers/model/gpt_model.cuh"
#include "layers/optimizer/optimizer.cuh"
#include "data/checkpoint.h"
#include "data/model_file.h"

#define TRAIN_STATE_STAGING_BYTES ((size_t)64 << 20)

// ---- checking a checkpoint against this run -------------------------------------------------------

// Exits (status 2) when the checkpoint at `path` belongs to a run that this one cannot continue:
// another model, batch shape, data order or training data. Differences in the schedule (steps, lr,
// warmup, ...) are allowed and printed, so a run can be extended or its learning rate changed.
static void train_state_check_compatible(const CheckpointHeader* saved, const CheckpointHeader* now,
                                         const char* path) {
    struct { const char* what; long long saved, now; const char* flags; } must[] = {
        {"layers", saved->num_layers, now->num_layers, "--model / --layers"},
        {"hidden size", saved->channels, now->channels, "--model / --hidden"},
        {"heads", saved->num_heads, now->num_heads, "--model / --heads"},
        {"key/value heads", checkpoint_kv_heads(saved), checkpoint_kv_heads(now), "--kv-heads"},
        {"vocab", saved->vocab_size, now->vocab_size, "(the build's vocab)"},
        {"padded vocab", saved->padded_vocab_size, now->padded_vocab_size, "(the build's vocab)"},
        {"sequence length", saved->seq_len, now->seq_len, "--seq-len"},
        {"positions", saved->max_seq_len, now->max_seq_len, "--seq-len"},
        {"batch size", saved->batch_size, now->batch_size, "--batch-size"},
        {"tokens per step", saved->total_batch_tokens, now->total_batch_tokens, "--total-batch-tokens"},
        {"data-parallel ranks (GPUs / --context-parallel)", checkpoint_data_ranks(saved), checkpoint_data_ranks(now),
         "the launcher, --context-parallel"},
        {"shuffle", saved->shuffle, now->shuffle, "--shuffle"},
        {"seed", (long long)saved->seed, (long long)now->seed, "--seed"},
        {"training tokens", saved->train_tokens, now->train_tokens, "--train-data"},
        {"training shards", saved->train_shards, now->train_shards, "--train-data"},
        {"parameters", saved->num_params, now->num_params, "--model"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++) {
        if (must[i].saved == must[i].now) continue;
        if (!bad) fprintf(stderr, "error: cannot resume from %s: it was saved by another run:\n", path);
        fprintf(stderr, "  %s: %lld in the checkpoint, %lld in this run (%s)\n", must[i].what, must[i].saved,
                must[i].now, must[i].flags);
        bad = 1;
    }
    if (bad) {
        fprintf(stderr, "hint: resume with the same model, batch and data flags as the run that saved it\n");
        exit(2);
    }
    struct { const char* flag; double saved, now; } may[] = {
        {"--max-steps", (double)saved->max_steps, (double)now->max_steps},
        {"--warmup-steps", (double)saved->warmup_steps, (double)now->warmup_steps},
        {"--lr", saved->lr, now->lr},
        {"--min-lr-fraction", saved->min_lr_fraction, now->min_lr_fraction},
        {"--weight-decay", saved->weight_decay, now->weight_decay},
        {"--grad-clip", saved->grad_clip, now->grad_clip},
    };
    for (size_t i = 0; i < sizeof(may) / sizeof(may[0]); i++)
        if (may[i].saved != may[i].now)
            printf("note         %s is %g, the checkpoint's run had %g: the schedule continues with %g\n",
                   may[i].flag, may[i].now, may[i].saved, may[i].now);
}

// Exits (status 2) when a checkpoint saved on saved->world_size GPUs with --zero saved->zero_stage
// cannot be resumed by this rank of `world` GPUs with --zero `zero` (shard of `shard` elements).
// Unsharded state resumes on any number of GPUs that reads the data the same way (the data-parallel
// ranks, train_state_check_compatible: --context-parallel may differ); sharded state on as many GPUs.
static void train_state_check_sharding(const CheckpointHeader* saved, const char* path, int world, int zero,
                                       int rank, size_t shard) {
    if (saved->zero_stage == zero &&
        (!zero || (saved->world_size == world && saved->rank == rank && saved->shard_size == (int64_t)shard)))
        return;
    fprintf(stderr, "error: cannot resume from %s: it was saved by %d GPU(s) with --zero %d (rank %d), this run "
                    "has %d GPU(s) with --zero %d (rank %d); a checkpoint resumes with the same --zero, and one of "
                    "--zero 1 on the same number of GPUs\n",
            path, (int)saved->world_size, (int)saved->zero_stage, (int)saved->rank, world, zero, rank);
    if (saved->world_size > 1)
        fprintf(stderr, "hint: resume with mpirun -np %d ./train_gpt ... --zero %d (or %d processes of another "
                        "launcher)\n", (int)saved->world_size, (int)saved->zero_stage, (int)saved->world_size);
    else
        fprintf(stderr, "hint: resume with one process: ./train_gpt ... (no launcher, no --zero)\n");
    exit(2);
}

// Reads and checks a checkpoint's header (magic, version, size); exits with the reason otherwise.
static CheckpointHeader train_state_read_header(const char* path) {
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: --resume: %s\n", err);
        exit(2);
    }
    CheckpointHeader h = r.header;
    checkpoint_reader_close(&r);
    return h;
}

// ---- finding checkpoints ----------------------------------------------------------------------------

// The checkpoint --resume names: PATH itself, or the newest step_*.ckpt when PATH is a directory.
// Fills `path` and `dir` (where it lies; CHECKPOINT_PATH_MAX each); exits with a message when there
// is none.
static void train_state_find(const char* resume, char* path, char* dir) {
    struct stat st;
    if (stat(resume, &st) != 0) {
        fprintf(stderr, "error: --resume %s: %s\n", resume, strerror(errno));
        exit(2);
    }
    char err[CHECKPOINT_PATH_MAX + 256];
    if (S_ISDIR(st.st_mode)) {
        int64_t step = 0;
        const int found = checkpoint_find_latest(resume, path, CHECKPOINT_PATH_MAX, &step, err, sizeof(err));
        if (found <= 0) {
            fprintf(stderr, "error: --resume %s: %s\n", resume, found < 0 ? err : "no step_*.ckpt checkpoint in it");
            exit(2);
        }
        snprintf(dir, CHECKPOINT_PATH_MAX, "%s", resume);
    } else {
        snprintf(path, CHECKPOINT_PATH_MAX, "%s", resume);
        snprintf(dir, CHECKPOINT_PATH_MAX, "%s", resume);
        char* slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, CHECKPOINT_PATH_MAX, ".");
    }
}

// A fresh run must not write its step_*.ckpt over another run's: exits when `dir` already holds
// checkpoints, unless it is the directory of the checkpoint being resumed (`resume_dir`).
static void train_state_refuse_foreign(const char* dir, const char* resume_dir) {
    char latest[CHECKPOINT_PATH_MAX + 64], err[CHECKPOINT_PATH_MAX + 256];
    int64_t step = 0;
    const int found = checkpoint_find_latest(dir, latest, sizeof(latest), &step, err, sizeof(err));
    if (found < 0) {
        fprintf(stderr, "error: --checkpoint-dir: %s\n", err);
        exit(2);
    }
    if (found == 0) return;
    if (resume_dir) {
        char a[PATH_MAX], b[PATH_MAX];
        if (realpath(dir, a) && realpath(resume_dir, b) && strcmp(a, b) == 0) return;
    }
    fprintf(stderr, "error: --checkpoint-dir %s already holds checkpoints of a run (the newest is step %lld); pass "
                    "--resume %s to continue it, or choose an empty directory\n", dir, (long long)step, dir);
    exit(2);
}

// ---- saving and loading -----------------------------------------------------------------------------

// Streams `bytes` of device memory at `src` into the checkpoint being written.
static int train_state_write_device(CheckpointWriter* w, const void* src, size_t bytes, void* staging, char* err,
                                    size_t err_len) {
    for (size_t done = 0; done < bytes; done += TRAIN_STATE_STAGING_BYTES) {
        const size_t n = bytes - done < TRAIN_STATE_STAGING_BYTES ? bytes - done : TRAIN_STATE_STAGING_BYTES;
        CUDA_CHECK(cudaMemcpy(staging, (const char*)src + done, n, cudaMemcpyDeviceToHost));
        if (checkpoint_writer_append(w, staging, n, err, err_len) != 0) return -1;
    }
    return 0;
}

// Says why a checkpoint was not saved, how many bytes it needs and how many are free in `dir`.
static void train_state_report_failed_save(const char* dir, const CheckpointHeader* header, int rank,
                                           const char* why) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    const long long bytes = CHECKPOINT_HEADER_BYTES + (long long)checkpoint_header_payload_bytes(header);
    char space[128] = "";
    struct statvfs fs;
    if (statvfs(dir, &fs) == 0)
        snprintf(space, sizeof(space), ", %.2f GiB are free there", (double)fs.f_bavail * (double)fs.f_frsize / GiB);
    fprintf(stderr, "warning: rank %d: checkpoint at step %lld not saved: %s; the file needs %lld bytes (%.2f GiB)%s; "
                    "the run goes on\n", rank, (long long)header->step, why, bytes, bytes / GiB, space);
}

// Writes this rank's checkpoint file of header.step into `dir` (temporary name, then rename; ZeRO-1:
// DIR/step_XXXXXXXX.rankRRofWW.ckpt). Returns 0, or -1 after a warning that names the file, the
// problem and the bytes needed (the previous checkpoints are untouched and the run can go on).
// A --precision fp8 model also writes its FP8 scales (header.fp8_state_bytes of them, after adam_v).
static int train_state_save(const char* dir, CheckpointHeader header, const GPTModel* model, const Optimizer* o,
                            void* staging, int rank) {
    CUDA_CHECK(cudaDeviceSynchronize());
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointWriter w;
    const size_t n = model->num_params, e = o->elems;
    const size_t fp8_bytes = model->precision == PRECISION_FP8 ? gpt_fp8_state_bytes(model->L) : 0;
    header.fp8_state_bytes = (int32_t)fp8_bytes;  // before anything: the failure report counts it too
    const int world = header.zero_stage > 0 ? header.world_size : 0;
    if (checkpoint_writer_open_rank(&w, dir, header.step, header.rank, world, err, sizeof(err)) != 0 ||
        train_state_write_device(&w, model->params, n * sizeof(__nv_bfloat16), staging, err, sizeof(err)) != 0 ||
        train_state_write_device(&w, o->master, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
        train_state_write_device(&w, o->m, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
        train_state_write_device(&w, o->v, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
        (fp8_bytes && train_state_write_device(&w, model->fp8.states, fp8_bytes, staging, err, sizeof(err)) != 0) ||
        checkpoint_writer_commit(&w, header, err, sizeof(err)) != 0) {
        train_state_report_failed_save(dir, &header, rank, err);
        return -1;
    }
    return 0;
}

// Reads `bytes` of the payload through the host staging buffer into device memory at dst, or drops
// them when dst is NULL (they still count in the checksum).
static void train_state_read_device(CheckpointReader* r, void* dst, size_t bytes, void* staging) {
    char err[CHECKPOINT_PATH_MAX + 256];
    for (size_t done = 0; done < bytes; done += TRAIN_STATE_STAGING_BYTES) {
        const size_t n = bytes - done < TRAIN_STATE_STAGING_BYTES ? bytes - done : TRAIN_STATE_STAGING_BYTES;
        if (checkpoint_reader_read(r, staging, n, err, sizeof(err)) != 0) {
            fprintf(stderr, "error: %s\n", err);
            exit(1);
        }
        if (dst) CUDA_CHECK(cudaMemcpy((char*)dst + done, staging, n, cudaMemcpyHostToDevice));
    }
}

// Loads weights and optimizer state from a checkpoint whose header the plan has already checked
// (train_state_check_compatible, train_state_check_sharding); then its FP8 scales, when it has them
// and this model runs in fp8 with states of the same size (otherwise they are read, for the checksum,
// and left, with a note). The scales take effect only after the checksum has passed.
static void train_state_load(const char* path, GPTModel* model, const Optimizer* o, void* staging) {
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    const size_t n = model->num_params, e = o->elems;
    train_state_read_device(&r, model->params, n * sizeof(__nv_bfloat16), staging);
    train_state_read_device(&r, o->master, e * sizeof(float), staging);
    train_state_read_device(&r, o->m, e * sizeof(float), staging);
    train_state_read_device(&r, o->v, e * sizeof(float), staging);
    const int fp8 = model->precision == PRECISION_FP8;
    const size_t saved = (size_t)r.header.fp8_state_bytes;  // 0 to CHECKPOINT_MAX_FP8_STATE_BYTES (checked at open)
    const size_t want = fp8 ? gpt_fp8_state_bytes(model->L) : 0;
    char unused[256] = "";  // why the file's FP8 scales are not used
    if (saved > 0 && fp8 && saved == want) {
        train_state_read_device(&r, model->fp8.states, saved, staging);
    } else if (saved > 0) {
        train_state_read_device(&r, NULL, saved, staging);
        if (!fp8)
            snprintf(unused, sizeof(unused), "this run is --precision bf16; the checkpoint's run was fp8");
        else
            snprintf(unused, sizeof(unused), "%zu bytes of them in the file, this build's %d layers need %zu: saved "
                     "by a build with another FP8 scale layout; they start from the first step's amaxes",
                     saved, model->L, want);
    }
    if (checkpoint_reader_finish(&r, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    if (saved > 0 && fp8 && saved == want) gpt_fp8_states_loaded(&model->fp8);
    else if (unused[0]) printf("note: the checkpoint's FP8 scales are not used (%s)\n", unused);
    else if (fp8)
        printf("note: resuming in fp8 from a bf16 checkpoint: FP8 scales start from the first step's amaxes\n");
}

// ---- llm.c weight files -----------------------------------------------------------------------------

// The config stored in an llm.c model file (max_seq_len: the file's positions); exits with the reason
// when the file cannot be read.
static GPTConfig train_state_model_file_config(const char* path) {
    ModelFile file;
    char err[CHECKPOINT_PATH_MAX + 256];
    if (model_file_open(&file, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: --init-from: %s\n", err);
        exit(1);
    }
    const GPTConfig config = file.config;
    model_file_close(&file);
    return config;
}

// Opens an llm.c model file and checks that it holds this model (the same shape, at least T
// positions); exits with a message otherwise.
static void train_state_open_model_file(ModelFile* file, const char* path, const GPTConfig* config) {
    char err[CHECKPOINT_PATH_MAX + 256];
    if (model_file_open(file, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: --init-from: %s\n", err);
        exit(1);
    }
    const GPTConfig* f = &file->config;
    if (f->num_layers != config->num_layers || f->channels != config->channels || f->num_heads != config->num_heads ||
        f->num_kv_heads != config->num_kv_heads || f->vocab_size != config->vocab_size || f->padded_vocab_size != config->padded_vocab_size ||
        f->max_seq_len < config->max_seq_len) {
        fprintf(stderr,
                "error: --init-from %s holds a model of %d layers, hidden %d, %d heads (%d key/value heads), vocab "
                "%d padded to %d, %d positions; this run needs %d layers, hidden %d, %d heads (%d key/value heads), "
                "vocab %d padded to %d, >= %d positions (set --model/--layers/--hidden/--heads/--kv-heads to match; "
                "--seq-len at most the file's positions)\n",
                path, f->num_layers, f->channels, f->num_heads, f->num_kv_heads, f->vocab_size, f->padded_vocab_size,
                f->max_seq_len, config->num_layers, config->channels, config->num_heads, config->num_kv_heads,
                config->vocab_size, config->padded_vocab_size, config->max_seq_len);
        exit(2);
    }
}

static float train_state_bf16_to_float(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

// fp32 -> bf16 bits, round to nearest even (inputs are finite).
static uint16_t train_state_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Converts one tensor read from a model file (fp32 values or bf16 bits) into both forms; exits on a
// non-finite value.
static void train_state_convert_tensor(const ModelFile* file, float* values, uint16_t* bits, size_t n,
                                       const char* path, int tensor) {
    for (size_t j = 0; j < n; j++) {
        if (file->version == MODEL_FILE_FP32) bits[j] = train_state_float_to_bf16(values[j]);
        else values[j] = train_state_bf16_to_float(bits[j]);
        if (!isfinite(values[j])) {
            fprintf(stderr, "error: --init-from %s: tensor %s holds a non-finite value at %zu\n", path,
                    GPT_PARAMS[tensor].name, j);
            exit(1);
        }
    }
}

// Loads --init-from weights into the model's bf16 weights and the optimizer's fp32 master copy (its range).
static void train_state_load_model_file(const char* path, GPTModel* model, const Optimizer* o) {
    ModelFile file;
    train_state_open_model_file(&file, path, &model->config);
    size_t largest = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (model->param_sizes[i] > largest) largest = model->param_sizes[i];
    float* values = (float*)malloc(largest * sizeof(float));
    uint16_t* bits = (uint16_t*)malloc(largest * sizeof(uint16_t));
    if (!values || !bits) {
        fprintf(stderr, "error: out of host memory loading %s\n", path);
        exit(1);
    }
    char err[CHECKPOINT_PATH_MAX + 256];
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const size_t n = model->param_sizes[i];  // wpe: the first maxT rows of the file's
        void* raw = file.version == MODEL_FILE_FP32 ? (void*)values : (void*)bits;
        if (model_file_read_tensor(&file, i, raw, n, err, sizeof(err)) != 0) {
            fprintf(stderr, "error: --init-from %s: %s\n", path, err);
            exit(1);
        }
        train_state_convert_tensor(&file, values, bits, n, path, i);
        optimizer_upload_master(o, model->param_offsets[i], values, n);
        CUDA_CHECK(cudaMemcpy(model->param_tensors[i], bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
    model_file_close(&file);
    free(values);
    free(bits);
}

// Writes the model's bf16 gradients as an llm.c model file (version 5) at `path`.
static void train_state_dump_gradients(const char* path, const GPTModel* model) {
    const size_t bytes = model->num_params * sizeof(__nv_bfloat16);
    void* host = malloc(bytes);
    FILE* f = fopen(path, "wb");
    if (!host || !f) {
        fprintf(stderr, "error: --dump-grads: cannot write %s: %s\n", path, host ? strerror(errno) : "out of memory");
        exit(1);
    }
    CUDA_CHECK(cudaMemcpy(host, model->grads, bytes, cudaMemcpyDeviceToHost));
    if (model_file_write_header(f, &model->config, MODEL_FILE_BF16) != 0 || fwrite(host, 1, bytes, f) != bytes ||
        fclose(f) != 0) {
        fprintf(stderr, "error: --dump-grads: cannot write %s (disk full?)\n", path);
        exit(1);
    }
    free(host);
    printf("gradients    of this run's first step written to %s\n", path);
}

// ---- weights alone (--generate, --eval-only) -----------------------------------------------------------

// The model's shape from a checkpoint (`resume`: a file or a directory, its newest) or else an llm.c
// model file (`init_from`); the file used goes into `path`. Exits (2) with the reason when unusable.
static GPTConfig train_state_weights_config(const char* resume, const char* init_from, char* path,
                                            size_t path_size) {
    GPTConfig c;
    memset(&c, 0, sizeof(c));
    if (resume) {
        char found[CHECKPOINT_PATH_MAX], dir[CHECKPOINT_PATH_MAX];
        train_state_find(resume, found, dir);
        snprintf(path, path_size, "%s", found);
        const CheckpointHeader h = train_state_read_header(path);
        c.num_layers = h.num_layers, c.channels = h.channels, c.num_heads = h.num_heads;
        c.num_kv_heads = checkpoint_kv_heads(&h);
        c.vocab_size = h.vocab_size, c.padded_vocab_size = h.padded_vocab_size, c.max_seq_len = h.max_seq_len;
    } else {
        c = train_state_model_file_config(init_from);
        snprintf(path, path_size, "%s", init_from);
    }
    char err[512];
    if (gpt_config_check(&c, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s: %s\n", path, err);
        exit(2);
    }
    return c;
}

// The bf16 weights into model->params: from an llm.c model file (`is_model_file`), or the first part
// of a checkpoint's payload (the optimizer state is neither needed nor read, so no checksum).
static void train_state_load_weights(const char* path, int is_model_file, GPTModel* m) {
    if (is_model_file) {
        Optimizer none;  // no master weights to fill
        memset(&none, 0, sizeof(none));
        train_state_load_model_file(path, m, &none);
        return;
    }
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    void* staging = NULL;
    CUDA_CHECK(cudaMallocHost(&staging, TRAIN_STATE_STAGING_BYTES));
    train_state_read_device(&r, m->params, m->num_params * sizeof(__nv_bfloat16), staging);
    checkpoint_reader_close(&r);
    CUDA_CHECK(cudaFreeHost(staging));
}

#endif  // TRAIN_STATE_CUH
