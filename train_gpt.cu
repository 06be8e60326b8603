// train_gpt.cu: GPT training in C/CUDA around our own FlashAttention kernels.
//
// Checks the options and the data, prints the training plan, then trains on one GPU, or data
// parallel on several (one process per GPU, launched by mpirun, srun or torchrun-style environment
// variables; layers/launcher.h, layers/multi_gpu.cuh; optional ZeRO-1 optimizer sharding): micro
// steps accumulated to the total batch, global-norm clipping, AdamW on fp32 master weights with
// warmup + cosine learning rate, validation loss every --val-every steps, and a log line per step
// (loss, lr, grad norm, ms, tokens/s, TFLOP/s, MFU), also written as JSON lines to --log-file;
// checkpoints every --checkpoint-every steps that --resume continues exactly.
// The model itself (parameters, activations, forward, backward) is layers/gpt_model.cuh; the file
// formats are data/checkpoint.h (training state) and data/model_file.h (llm.c weights).
//
// Sections, top to bottom: options, model configuration, data, initialization, checkpoints and
// weight files, training, main.
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attention/attention.h"
#include "data/checkpoint.h"
#include "data/dataloader.h"
#include "data/model_file.h"
#include "layers/adamw.cuh"
#include "layers/cuda_common.h"
#include "layers/global_norm.cuh"
#include "layers/init_weights.cuh"
#include "layers/gpt_config.h"
#include "layers/gpt_model.cuh"
#include "layers/launcher.h"
#include "layers/multi_gpu.cuh"

// ---------------------------------------------------------------------------------------------
// Options

typedef struct {
    const char* model;            // a name from gpt_config.h
    int layers, hidden, heads;    // overrides of the named shape; 0 = keep
    const char* train_data;       // shard path or glob
    const char* val_data;         // shard path or glob; "" = no validation
    int batch_size;               // B, sequences per micro step per GPU
    int seq_len;                  // T
    long long total_batch_tokens; // tokens per optimizer step; 0 = B·T (no accumulation)
    long long max_steps;          // optimizer steps of the schedule; 0 = one pass over the training data
    AttentionBackend attn;
    uint64_t seed;
    int shuffle;
    double peak_tflops;           // 0 = look up by GPU name
    double lr, min_lr_fraction;   // peak learning rate; the cosine ends at lr · min_lr_fraction
    long long warmup_steps;
    double weight_decay;          // on 2-D weights only
    double grad_clip;             // global-norm clip; 0 = off
    long long val_every;          // steps between validation losses; 0 = only at the end
    long long val_batches;        // micro batches per validation (0 = the whole validation set)
    const char* log_file;         // JSON lines, one per step; NULL = none
    const char* checkpoint_dir;   // NULL = no checkpoints (with --resume: the resumed file's directory)
    long long checkpoint_every;   // steps between checkpoints; the last step is always saved
    int keep_checkpoints;         // newest checkpoints kept in checkpoint_dir; 0 = all
    const char* resume;           // a checkpoint file, or a directory (its newest); NULL = fresh run
    const char* init_from;        // llm.c model file with the initial weights; NULL = GPT-2 init
    const char* dump_grads;       // write the first step's gradients here (llm.c format, bf16)
    int plan_only;
    int zero;                     // 1: ZeRO-1, optimizer state and master weights sharded over the GPUs
    double rendezvous_timeout;    // seconds a rank waits for the others at the start (multi-GPU)
} Options;

static void print_usage(FILE* out) {
    fprintf(out,
            "usage: ./train_gpt [options]\n"
            "\n"
            "Trains a GPT on token shards (llm.c format) and reports tokens/s, TFLOP/s per GPU and MFU.\n"
            "It checks the options and the data, prints the plan, and trains on one GPU, or data parallel\n"
            "on several GPUs and nodes with one process per GPU (see multi-GPU below).\n"
            "\n"
            "model\n"
            "  -m, --model NAME            gpt2-124m (default), gpt2-350m, gpt2-774m, gpt2-1558m,\n"
            "                              gpt3-1.3b, gpt3-2.7b, gpt3-2.7b-d128\n"
            "      --layers N              override the number of layers\n"
            "      --hidden N              override the hidden size\n"
            "      --heads N               override the number of heads (head dim = hidden / heads\n"
            "                              must be 64, 80, 96 or 128)\n"
            "  -a, --attn BACKEND          naive | flash1 | flash2 (default flash2), or naive-recompute:\n"
            "                              naive that recomputes S and P in the backward (long T)\n"
            "data\n"
            "  -i, --train-data PATTERN    training shards, a path or a glob\n"
            "                              (default data/tinyshakespeare/tinyshakespeare_train_*.bin)\n"
            "  -j, --val-data PATTERN      validation shards (default data/tinyshakespeare/\n"
            "                              tinyshakespeare_val_*.bin); \"\" for none\n"
            "      --shuffle               shuffle shard and batch order every epoch\n"
            "      --seed N                seed for shuffling (default 1337)\n"
            "batch\n"
            "  -b, --batch-size N          sequences per micro step per GPU (default 4)\n"
            "  -t, --seq-len N             tokens per sequence (default 1024)\n"
            "  -d, --total-batch-tokens N  tokens per optimizer step, a multiple of batch-size * seq-len\n"
            "                              (* GPUs); default: batch-size * seq-len (* GPUs), no accumulation\n"
            "  -x, --max-steps N           optimizer steps of the run and its LR schedule (default: one\n"
            "                              pass over the training data); --steps is the same flag\n"
            "optimizer\n"
            "      --lr X                  peak learning rate (default 3e-4)\n"
            "      --min-lr-fraction X     the cosine decays to lr * X at the last step (default 0.1)\n"
            "      --warmup-steps N        linear warmup steps (default 0)\n"
            "      --weight-decay X        AdamW weight decay on 2-D weights (default 0.1)\n"
            "      --grad-clip X           clip the global gradient norm to X; 0 = off (default 1.0)\n"
            "logging\n"
            "      --val-every N           validation loss every N steps (default 0: at the end only)\n"
            "      --val-batches N         micro batches per validation, 0 = all (default 20)\n"
            "      --log-file PATH         also write each step as a JSON line to PATH\n"
            "      --plan-only             print the plan and exit without training\n"
            "checkpoints (format: README.md)\n"
            "      --checkpoint-dir DIR    save DIR/step_XXXXXXXX.ckpt (weights, optimizer, step, data\n"
            "                              position); DIR must not hold another run's checkpoints\n"
            "      --checkpoint-every N    save every N steps (default 0: only after the last step)\n"
            "      --keep-checkpoints N    keep the N newest checkpoints, 0 = all (default 2)\n"
            "      --resume PATH           continue from a checkpoint file, or the newest in a directory;\n"
            "                              the next steps give the same losses as an uninterrupted run\n"
            "weights\n"
            "      --init-from PATH        start from weights in llm.c's model file format (fp32 or bf16)\n"
            "                              instead of the GPT-2 initialization\n"
            "      --dump-grads PATH       write the gradients of the run's first step (mean over its\n"
            "                              tokens, before clipping) as a bf16 llm.c model file\n"
            "multi-GPU (one process per GPU; gradients averaged over NCCL while the backward runs)\n"
            "      --zero N                0 (default): every GPU keeps the whole optimizer state; 1: ZeRO-1,\n"
            "                              fp32 master weights and AdamW moments sharded over the GPUs\n"
            "      --rendezvous-timeout S  seconds the ranks wait for each other at the start (default 120)\n"
            "  launchers (the rank and world size come from the environment, first match wins):\n"
            "    torchrun style  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT\n"
            "    mpirun          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (Open MPI)\n"
            "    srun            SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID\n"
            "  Rank 0 hands NCCL's id to the others over TCP at MASTER_ADDR:MASTER_PORT (default\n"
            "  127.0.0.1:29500: one node; on several nodes set MASTER_ADDR to rank 0's host). Each process\n"
            "  uses GPU LOCAL_RANK. -b is per GPU; --total-batch-tokens is global (B*T*GPUs*accumulation).\n"
            "    mpirun -np 2 -x NCCL_NVLS_ENABLE=0 ./train_gpt --zero 1 ...\n"
            "    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=29500 ./train_gpt ...   (one per GPU)\n"
            "    srun --ntasks-per-node=8 --gpus-per-node=8 ./train_gpt ...\n"
            "throughput\n"
            "      --peak-tflops X         dense bf16 peak for MFU (default: by GPU name; H100/H200 SXM\n"
            "                              989.4, A100 312)\n"
            "  -h, --help                  show this help\n");
}

// Parses a whole decimal integer in [min, max]; exits with a message naming the flag otherwise.
static long long parse_int(const char* flag, const char* text, long long min, long long max) {
    char* end = NULL;
    long long value = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || value < min || value > max) {
        fprintf(stderr, "error: %s expects a whole number in [%lld, %lld], got \"%s\"\n", flag, min, max, text);
        exit(2);
    }
    return value;
}

static double parse_double(const char* flag, const char* text, double min) {
    char* end = NULL;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= min)) {
        fprintf(stderr, "error: %s expects a number >= %g, got \"%s\"\n", flag, min, text);
        exit(2);
    }
    return value;
}

static Options parse_options(int argc, char** argv) {
    Options opt = {"gpt2-124m", 0, 0, 0,
                   "data/tinyshakespeare/tinyshakespeare_train_*.bin",
                   "data/tinyshakespeare/tinyshakespeare_val_*.bin",
                   4, 1024, 0, 0, ATTN_FLASH2, 1337, 0, 0.0,
                   3e-4, 0.1, 0, 0.1, 1.0, 0, 20, NULL, NULL, 0, 2, NULL, NULL, NULL, 0, 0, 120.0};
    enum { OPT_LAYERS = 1000, OPT_HIDDEN, OPT_HEADS, OPT_SEED, OPT_SHUFFLE, OPT_PEAK, OPT_LR, OPT_MIN_LR, OPT_WARMUP,
           OPT_WD, OPT_CLIP, OPT_VAL_EVERY, OPT_VAL_BATCHES, OPT_LOG_FILE, OPT_PLAN_ONLY, OPT_CKPT_DIR, OPT_CKPT_EVERY,
           OPT_KEEP_CKPT, OPT_RESUME, OPT_INIT_FROM, OPT_DUMP_GRADS, OPT_ZERO, OPT_RDV_TIMEOUT };
    static const struct option long_options[] = {
        {"model", required_argument, 0, 'm'},       {"layers", required_argument, 0, OPT_LAYERS},
        {"hidden", required_argument, 0, OPT_HIDDEN}, {"heads", required_argument, 0, OPT_HEADS},
        {"attn", required_argument, 0, 'a'},        {"train-data", required_argument, 0, 'i'},
        {"val-data", required_argument, 0, 'j'},    {"shuffle", no_argument, 0, OPT_SHUFFLE},
        {"seed", required_argument, 0, OPT_SEED},   {"batch-size", required_argument, 0, 'b'},
        {"seq-len", required_argument, 0, 't'},     {"total-batch-tokens", required_argument, 0, 'd'},
        {"max-steps", required_argument, 0, 'x'},   {"steps", required_argument, 0, 'x'},
        {"peak-tflops", required_argument, 0, OPT_PEAK},
        {"lr", required_argument, 0, OPT_LR},       {"min-lr-fraction", required_argument, 0, OPT_MIN_LR},
        {"warmup-steps", required_argument, 0, OPT_WARMUP}, {"weight-decay", required_argument, 0, OPT_WD},
        {"grad-clip", required_argument, 0, OPT_CLIP}, {"val-every", required_argument, 0, OPT_VAL_EVERY},
        {"val-batches", required_argument, 0, OPT_VAL_BATCHES}, {"log-file", required_argument, 0, OPT_LOG_FILE},
        {"plan-only", no_argument, 0, OPT_PLAN_ONLY}, {"checkpoint-dir", required_argument, 0, OPT_CKPT_DIR},
        {"checkpoint-every", required_argument, 0, OPT_CKPT_EVERY},
        {"keep-checkpoints", required_argument, 0, OPT_KEEP_CKPT}, {"resume", required_argument, 0, OPT_RESUME},
        {"init-from", required_argument, 0, OPT_INIT_FROM}, {"dump-grads", required_argument, 0, OPT_DUMP_GRADS},
        {"zero", required_argument, 0, OPT_ZERO},   {"rendezvous-timeout", required_argument, 0, OPT_RDV_TIMEOUT},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:a:i:j:b:t:d:x:h", long_options, NULL)) != -1) {
        switch (c) {
            case 'm': opt.model = optarg; break;
            case OPT_LAYERS: opt.layers = (int)parse_int("--layers", optarg, 1, 1000); break;
            case OPT_HIDDEN: opt.hidden = (int)parse_int("--hidden", optarg, 1, 1 << 16); break;
            case OPT_HEADS: opt.heads = (int)parse_int("--heads", optarg, 1, 1024); break;
            case 'a':
                if (attention_backend_from_name(optarg, &opt.attn) != 0) {
                    fprintf(stderr, "error: --attn expects naive, flash1, flash2 or naive-recompute, got \"%s\"\n", optarg);
                    exit(2);
                }
                break;
            case 'i': opt.train_data = optarg; break;
            case 'j': opt.val_data = optarg; break;
            case OPT_SHUFFLE: opt.shuffle = 1; break;
            case OPT_SEED: opt.seed = (uint64_t)parse_int("--seed", optarg, 0, INT64_MAX); break;
            case 'b': opt.batch_size = (int)parse_int("--batch-size", optarg, 1, 1 << 20); break;
            case 't': opt.seq_len = (int)parse_int("--seq-len", optarg, 1, 1 << 20); break;
            case 'd': opt.total_batch_tokens = parse_int("--total-batch-tokens", optarg, 1, INT64_MAX); break;
            case 'x': opt.max_steps = parse_int("--max-steps", optarg, 1, INT64_MAX); break;
            case OPT_PEAK: opt.peak_tflops = parse_double("--peak-tflops", optarg, 0.0); break;
            case OPT_LR: opt.lr = parse_double("--lr", optarg, 0.0); break;
            case OPT_MIN_LR: opt.min_lr_fraction = parse_double("--min-lr-fraction", optarg, 0.0); break;
            case OPT_WARMUP: opt.warmup_steps = parse_int("--warmup-steps", optarg, 0, INT64_MAX); break;
            case OPT_WD: opt.weight_decay = parse_double("--weight-decay", optarg, 0.0); break;
            case OPT_CLIP: opt.grad_clip = parse_double("--grad-clip", optarg, 0.0); break;
            case OPT_VAL_EVERY: opt.val_every = parse_int("--val-every", optarg, 0, INT64_MAX); break;
            case OPT_VAL_BATCHES: opt.val_batches = parse_int("--val-batches", optarg, 0, INT64_MAX); break;
            case OPT_LOG_FILE: opt.log_file = optarg; break;
            case OPT_PLAN_ONLY: opt.plan_only = 1; break;
            case OPT_CKPT_DIR: opt.checkpoint_dir = optarg; break;
            case OPT_CKPT_EVERY: opt.checkpoint_every = parse_int("--checkpoint-every", optarg, 0, INT64_MAX); break;
            case OPT_KEEP_CKPT: opt.keep_checkpoints = (int)parse_int("--keep-checkpoints", optarg, 0, 1 << 30); break;
            case OPT_RESUME: opt.resume = optarg; break;
            case OPT_INIT_FROM: opt.init_from = optarg; break;
            case OPT_DUMP_GRADS: opt.dump_grads = optarg; break;
            case OPT_ZERO:
                if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0) {
                    fprintf(stderr, "error: --zero expects 0 (no sharding) or 1 (ZeRO-1: optimizer state and master "
                                    "weights sharded over the GPUs), got \"%s\"\n", optarg);
                    exit(2);
                }
                opt.zero = optarg[0] - '0';
                break;
            case OPT_RDV_TIMEOUT: opt.rendezvous_timeout = parse_double("--rendezvous-timeout", optarg, 1.0); break;
            case 'h': print_usage(stdout); exit(0);
            default: fprintf(stderr, "run ./train_gpt --help for the options\n"); exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "error: unexpected argument \"%s\"; run ./train_gpt --help for the options\n", argv[optind]);
        exit(2);
    }
    if (opt.resume && opt.init_from) {
        fprintf(stderr, "error: --resume and --init-from both set the weights; give one of them\n");
        exit(2);
    }
    if (opt.checkpoint_every > 0 && !opt.checkpoint_dir && !opt.resume) {
        fprintf(stderr, "error: --checkpoint-every needs --checkpoint-dir DIR\n");
        exit(2);
    }
    return opt;
}

// ---------------------------------------------------------------------------------------------
// Model configuration

static GPTConfig build_config(const Options* opt) {
    const NamedGPTShape* shape = gpt_find_named_shape(opt->model);
    if (!shape) {
        fprintf(stderr, "error: unknown model \"%s\"; known:", opt->model);
        for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++) fprintf(stderr, " %s", NAMED_GPT_SHAPES[i].name);
        fprintf(stderr, " (or override with --layers --hidden --heads)\n");
        exit(2);
    }
    GPTConfig config;
    config.num_layers = opt->layers ? opt->layers : shape->num_layers;
    config.channels = opt->hidden ? opt->hidden : shape->channels;
    config.num_heads = opt->heads ? opt->heads : shape->num_heads;
    config.vocab_size = GPT2_VOCAB_SIZE;
    config.padded_vocab_size = gpt_round_up(GPT2_VOCAB_SIZE, VOCAB_PAD_MULTIPLE);
    config.max_seq_len = opt->seq_len;
    char err[512];
    if (gpt_config_check(&config, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(2);
    }
    return config;
}

// ---------------------------------------------------------------------------------------------
// Data

// Opens a loader over `pattern` or exits with the loader's message (which names the file).
// Each of `world` ranks reads its own B·T slice of every chunk of B·T·world tokens.
static void open_data_or_exit(DataLoader* loader, const char* what, const char* pattern, const Options* opt, int rank,
                              int world) {
    if (dataloader_open(loader, pattern, opt->batch_size, opt->seq_len, rank, world, GPT2_VOCAB_SIZE, opt->shuffle,
                        opt->seed) != 0) {
        fprintf(stderr, "error: %s data: %s\n", what, loader->error);
        if (strstr(pattern, "data/tinyshakespeare/") == pattern)
            fprintf(stderr, "hint: `make train` prepares the default dataset (scripts/prepare_data.py)\n");
        exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Initialization

// What a run keeps on the GPU besides the model: fp32 master weights and the two AdamW moments, for
// the elements [offset, offset + elems) of the flat parameter vector: all of them, or with ZeRO-1
// this rank's shard.
typedef struct {
    float *master, *adam_m, *adam_v;  // (elems) each, in the parameter order
    size_t offset, elems;
} OptimizerState;

// The part [*a, *b) of the flat elements [at, at + n) (a tensor) that lies in the state's range;
// returns 0 when they do not meet.
static int state_overlap(const OptimizerState* st, size_t at, size_t n, size_t* a, size_t* b) {
    *a = at > st->offset ? at : st->offset;
    *b = at + n < st->offset + st->elems ? at + n : st->offset + st->elems;
    return *a < *b;
}

// Copies the part of tensor values (n, at flat offset `at`) that lies in the state's range to master.
static void upload_master(const OptimizerState* st, size_t at, const float* values, size_t n) {
    size_t a, b;
    if (state_overlap(st, at, n, &a, &b))
        CUDA_CHECK(cudaMemcpy(st->master + (a - st->offset), values + (a - at), (b - a) * sizeof(float),
                              cudaMemcpyHostToDevice));
}

// GPT-2 initialization from `seed` (layers/init_weights.cuh, on the GPU): weights N(0, 0.02), the
// residual projections (attprojw, fcprojw) N(0, 0.02/√(2L)), LayerNorm weights 1, biases 0. Writes
// the fp32 master weights (the state's range) and the model's bf16 copy (all); the draws are
// counter-based, so every rank gets the same values and a shard those of the whole tensor.
static void init_parameters(GPTModel* model, const OptimizerState* st, uint64_t seed) {
    const float residual_std = 0.02f / sqrtf(2.0f * model->L);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const int is_ln_weight = i == GPT_LN1W || i == GPT_LN2W || i == GPT_LNFW;
        const int is_bias = i == GPT_LN1B || i == GPT_QKVB || i == GPT_ATTPROJB || i == GPT_LN2B || i == GPT_FCB ||
                            i == GPT_FCPROJB || i == GPT_LNFB;
        const float std = is_ln_weight || is_bias ? 0.0f : (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? residual_std : 0.02f;
        const float constant = is_ln_weight ? 1.0f : 0.0f;
        const size_t at = model->param_offsets[i], n = model->param_sizes[i];
        init_weights(NULL, model->param_tensors[i], n, 0, std, constant, seed, i, model->stream);
        size_t a, b;
        if (state_overlap(st, at, n, &a, &b)) init_weights(st->master + (a - st->offset), NULL, b - a, a - at, std, constant, seed, i, model->stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
}

// Weight decay applies to the 2-D weights: embeddings and the four matrices of each block.
static int decays(int tensor) {
    return tensor == GPT_WTE || tensor == GPT_WPE || tensor == GPT_QKVW || tensor == GPT_ATTPROJW ||
           tensor == GPT_FCW || tensor == GPT_FCPROJW;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints and weight files

// Host staging buffer for moving state between the GPU and files in pieces.
#define STAGING_BYTES ((size_t)64 << 20)

// The header fields that describe this run (the step and data position are filled in when saving).
static CheckpointHeader run_header(const Options* opt, const GPTConfig* config, long long max_steps,
                                   long long total_batch_tokens, const DataLoader* train_loader, int world) {
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.num_layers = config->num_layers;
    h.channels = config->channels;
    h.num_heads = config->num_heads;
    h.vocab_size = config->vocab_size;
    h.padded_vocab_size = config->padded_vocab_size;
    h.max_seq_len = config->max_seq_len;
    h.batch_size = opt->batch_size;
    h.seq_len = opt->seq_len;
    h.world_size = world;
    h.shuffle = opt->shuffle;
    h.total_batch_tokens = total_batch_tokens;
    h.seed = opt->seed;
    h.train_tokens = train_loader->total_tokens;
    h.train_shards = train_loader->num_shards;
    h.attention_backend = (int32_t)opt->attn;
    h.max_steps = max_steps;
    h.warmup_steps = opt->warmup_steps;
    h.lr = opt->lr;
    h.min_lr_fraction = opt->min_lr_fraction;
    h.weight_decay = opt->weight_decay;
    h.grad_clip = opt->grad_clip;
    h.num_params = (int64_t)gpt_num_params(config);
    return h;
}

// Exits (status 2) when the checkpoint at `path` belongs to a run that this one cannot continue:
// another model, batch shape, data order or training data. Differences in the schedule (steps, lr,
// warmup, ...) are allowed and printed, so a run can be extended or its learning rate changed.
static void check_resume_compatible(const CheckpointHeader* saved, const CheckpointHeader* now, const char* path) {
    struct { const char* what; long long saved, now; const char* flags; } must[] = {
        {"layers", saved->num_layers, now->num_layers, "--model / --layers"},
        {"hidden size", saved->channels, now->channels, "--model / --hidden"},
        {"heads", saved->num_heads, now->num_heads, "--model / --heads"},
        {"vocab", saved->vocab_size, now->vocab_size, "(the build's vocab)"},
        {"padded vocab", saved->padded_vocab_size, now->padded_vocab_size, "(the build's vocab)"},
        {"sequence length", saved->seq_len, now->seq_len, "--seq-len"},
        {"positions", saved->max_seq_len, now->max_seq_len, "--seq-len"},
        {"batch size", saved->batch_size, now->batch_size, "--batch-size"},
        {"tokens per step", saved->total_batch_tokens, now->total_batch_tokens, "--total-batch-tokens"},
        {"GPUs", saved->world_size, now->world_size, "the launcher"},
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

// Streams `bytes` of device memory at `src` into the checkpoint being written.
static int write_device_bytes(CheckpointWriter* w, const void* src, size_t bytes, void* staging, char* err,
                              size_t err_len) {
    for (size_t done = 0; done < bytes; done += STAGING_BYTES) {
        const size_t n = bytes - done < STAGING_BYTES ? bytes - done : STAGING_BYTES;
        CUDA_CHECK(cudaMemcpy(staging, (const char*)src + done, n, cudaMemcpyDeviceToHost));
        if (checkpoint_writer_append(w, staging, n, err, err_len) != 0) return -1;
    }
    return 0;
}

// Saves the state after `header->step` steps as DIR/step_XXXXXXXX.ckpt (temporary name, then
// rename) and prunes old ones. A failure to write is reported and the run goes on: the previous
// checkpoints are untouched. Returns 0 when saved (its path in saved_path).
// Several GPUs (mg): without ZeRO rank 0 writes the file (every rank holds the same state); with
// ZeRO-1 every rank writes its own DIR/step_XXXXXXXX.rankRRofWW.ckpt (full bf16 weights, its shard
// of master/m/v). All ranks then agree (an all-reduce, also a barrier) that every file is in place
// before rank 0 prunes.
static int save_checkpoint(const char* dir, int keep, CheckpointHeader header, const GPTModel* model,
                           const OptimizerState* opt_state, void* staging, MultiGpu* mg, int rank, char* saved_path,
                           size_t saved_len) {
    CUDA_CHECK(cudaDeviceSynchronize());
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointWriter w;
    const size_t n = model->num_params, e = opt_state->elems;
    const int sharded = header.zero_stage > 0, writes = sharded || rank == 0;
    int failed = 0;
    if (writes && (checkpoint_writer_open_rank(&w, dir, header.step, header.rank, sharded ? header.world_size : 0,
                                               err, sizeof(err)) != 0 ||
                   write_device_bytes(&w, model->params, n * sizeof(__nv_bfloat16), staging, err, sizeof(err)) != 0 ||
                   write_device_bytes(&w, opt_state->master, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
                   write_device_bytes(&w, opt_state->adam_m, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
                   write_device_bytes(&w, opt_state->adam_v, e * sizeof(float), staging, err, sizeof(err)) != 0 ||
                   checkpoint_writer_commit(&w, header, err, sizeof(err)) != 0)) {
        fprintf(stderr, "warning: rank %d: checkpoint at step %lld not saved: %s\n", rank, (long long)header.step, err);
        failed = 1;
    }
    if (mg && multi_gpu_sum(mg, failed, model->stream) > 0) {
        if (!failed && rank == 0)
            fprintf(stderr, "warning: checkpoint at step %lld not saved by every rank (see their warnings); the "
                            "previous checkpoints are kept\n", (long long)header.step);
        return -1;
    }
    if (failed) return -1;
    if (rank == 0) checkpoint_prune(dir, keep);
    checkpoint_path_rank(saved_path, saved_len, dir, header.step, header.rank, sharded ? header.world_size : 0);
    return 0;
}

static void read_device_bytes(CheckpointReader* r, void* dst, size_t bytes, void* staging) {
    char err[CHECKPOINT_PATH_MAX + 256];
    for (size_t done = 0; done < bytes; done += STAGING_BYTES) {
        const size_t n = bytes - done < STAGING_BYTES ? bytes - done : STAGING_BYTES;
        if (checkpoint_reader_read(r, staging, n, err, sizeof(err)) != 0) {
            fprintf(stderr, "error: %s\n", err);
            exit(1);
        }
        CUDA_CHECK(cudaMemcpy((char*)dst + done, staging, n, cudaMemcpyHostToDevice));
    }
}

// Loads weights and optimizer state from a checkpoint whose header main() has already checked.
static void load_checkpoint(const char* path, GPTModel* model, const OptimizerState* opt_state, void* staging) {
    char err[CHECKPOINT_PATH_MAX + 256];
    CheckpointReader r;
    if (checkpoint_reader_open(&r, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    const size_t n = model->num_params, e = opt_state->elems;  // main() checked the file's shard against e
    read_device_bytes(&r, model->params, n * sizeof(__nv_bfloat16), staging);
    read_device_bytes(&r, opt_state->master, e * sizeof(float), staging);
    read_device_bytes(&r, opt_state->adam_m, e * sizeof(float), staging);
    read_device_bytes(&r, opt_state->adam_v, e * sizeof(float), staging);
    if (checkpoint_reader_finish(&r, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
}

// Opens an llm.c model file and checks that it holds this model (the same shape, at least T
// positions); exits with a message otherwise.
static void open_model_file_or_exit(ModelFile* file, const char* path, const GPTConfig* config) {
    char err[CHECKPOINT_PATH_MAX + 256];
    if (model_file_open(file, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: --init-from: %s\n", err);
        exit(1);
    }
    const GPTConfig* f = &file->config;
    if (f->num_layers != config->num_layers || f->channels != config->channels || f->num_heads != config->num_heads ||
        f->vocab_size != config->vocab_size || f->padded_vocab_size != config->padded_vocab_size ||
        f->max_seq_len < config->max_seq_len) {
        fprintf(stderr,
                "error: --init-from %s holds a model of %d layers, hidden %d, %d heads, vocab %d padded to %d, %d "
                "positions; this run needs %d layers, hidden %d, %d heads, vocab %d padded to %d, >= %d positions "
                "(set --model/--layers/--hidden/--heads to match; --seq-len at most the file's positions)\n",
                path, f->num_layers, f->channels, f->num_heads, f->vocab_size, f->padded_vocab_size, f->max_seq_len,
                config->num_layers, config->channels, config->num_heads, config->vocab_size,
                config->padded_vocab_size, config->max_seq_len);
        exit(2);
    }
}

static float bf16_bits_to_float(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

// fp32 -> bf16 bits, round to nearest even (inputs are finite).
static uint16_t float_to_bf16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Loads --init-from weights into the fp32 master copy (the state's range) and the model's bf16 weights.
static void load_model_file(const char* path, GPTModel* model, const OptimizerState* st) {
    ModelFile file;
    open_model_file_or_exit(&file, path, &model->config);
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
        for (size_t j = 0; j < n; j++) {
            if (file.version == MODEL_FILE_FP32) bits[j] = float_to_bf16_bits(values[j]);
            else values[j] = bf16_bits_to_float(bits[j]);
            if (!isfinite(values[j])) {
                fprintf(stderr, "error: --init-from %s: tensor %s holds a non-finite value at %zu\n", path,
                        GPT_PARAM_NAMES[i], j);
                exit(1);
            }
        }
        upload_master(st, model->param_offsets[i], values, n);
        CUDA_CHECK(cudaMemcpy(model->param_tensors[i], bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
    model_file_close(&file);
    free(values);
    free(bits);
}

// Writes the model's bf16 gradients as an llm.c model file (version 5) at `path`.
static void dump_gradients(const char* path, const GPTModel* model) {
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

// The checkpoint --resume names: PATH itself, or the newest step_*.ckpt when PATH is a directory.
// Fills `path` and `dir` (where it lies); exits with a message when there is none.
static const char* find_resume_checkpoint(const char* resume, char* path, char* dir) {
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
    return path;
}

// Reads and checks a checkpoint's header (magic, version, size); exits with the reason otherwise.
static CheckpointHeader read_checkpoint_header(const char* path) {
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

// A fresh run must not write its step_*.ckpt over another run's: exits when `dir` already holds
// checkpoints, unless it is the directory of the checkpoint being resumed (`resume_dir`).
static void refuse_foreign_checkpoints(const char* dir, const char* resume_dir) {
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

// ---------------------------------------------------------------------------------------------
// Training

// Linear warmup to opt->lr, then cosine decay to lr · min_lr_fraction at the last step. step from 1.
static double learning_rate(const Options* opt, long long step, long long steps) {
    if (step <= opt->warmup_steps) return opt->lr * (double)step / (double)opt->warmup_steps;
    if (steps <= opt->warmup_steps) return opt->lr;
    const double progress = (double)(step - opt->warmup_steps) / (double)(steps - opt->warmup_steps);
    const double min_lr = opt->lr * opt->min_lr_fraction;
    return min_lr + 0.5 * (opt->lr - min_lr) * (1.0 + cos(3.141592653589793 * progress));
}

// Copies the loader's current batch (inputs, targets (B, T) int32) to the GPU. cudaMemcpy runs on
// the legacy default stream, which the model's blocking stream (cudaStreamCreate) waits for and is
// waited for by: the previous micro-step's backward, which reads the tokens again, is done first.
static void upload_batch(const DataLoader* loader, int* inputs_dev, int* targets_dev, size_t tokens) {
    CUDA_CHECK(cudaMemcpy(inputs_dev, loader->inputs, tokens * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(targets_dev, loader->targets, tokens * sizeof(int), cudaMemcpyHostToDevice));
}

static void next_batch_or_exit(DataLoader* loader, const char* what) {
    if (dataloader_next_batch(loader) != 0) {
        fprintf(stderr, "error: %s data: %s\n", what, loader->error);
        exit(1);
    }
}

// Mean loss over `batches` validation micro batches (0 or more than there are: all of them). With
// several GPUs (mg) the batches are split over the ranks (each reads its part of every chunk) and
// the mean is over all of them.
static double validation_loss(GPTModel* model, DataLoader* val, long long batches, int* inputs_dev,
                              int* targets_dev, MultiGpu* mg) {
    const long long available = dataloader_batches_per_epoch(val);  // chunks: one micro batch per rank each
    const int world = mg ? mg->world : 1;
    const long long per_rank = (batches + world - 1) / world;
    const long long n = (batches == 0 || per_rank > available) ? available : per_rank;
    dataloader_reset(val);
    double sum = 0.0;
    for (long long i = 0; i < n; i++) {
        next_batch_or_exit(val, "validation");
        upload_batch(val, inputs_dev, targets_dev, (size_t)model->B * model->T);
        gpt_model_forward(model, inputs_dev, targets_dev);
        sum += gpt_model_mean_loss(model);
    }
    if (mg) return multi_gpu_sum(mg, sum / (double)n, model->stream) / world;
    return sum / (double)n;
}

typedef struct {
    long long steps, accumulation_steps, total_batch_tokens;
    double flops_per_step, peak_tflops;
    CheckpointHeader header;     // this run's description; step and data position are set when saving
    const char* checkpoint_dir;  // NULL: no checkpoints
    const char* resume_path;     // a checkpoint whose header main() checked, or NULL
    long long start_step;        // the first step this run takes: 1, or the checkpoint's step + 1
    DataLoaderState start_data;  // the data position of start_step
    int rank, world;             // this process and the number of GPUs
    size_t pad_multiple;         // the model's parameter allocations are padded to a multiple of this
    size_t state_offset, state_elems;  // the optimizer state's part of the flat parameters (ZeRO-1: the shard)
    MultiGpu* mg;                // NULL on one GPU
} TrainPlan;

// Saves the state after `step` steps, with the data position of the next step; returns 0 when saved.
static int save_state(const Options* opt, const TrainPlan* plan, long long step, DataLoaderState data,
                      const GPTModel* model, const OptimizerState* state, void* staging, char* saved_path,
                      size_t saved_len) {
    CheckpointHeader header = plan->header;
    header.step = step;
    header.data_epoch = data.epoch;
    header.data_shard_index = data.shard_index;
    header.data_chunk_index = data.chunk_index;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (save_checkpoint(plan->checkpoint_dir, opt->keep_checkpoints, header, model, state, staging, plan->mg,
                        plan->rank, saved_path, saved_len) != 0)
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("checkpoint   %s (%.1f s)\n", saved_path, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}

static void train(const Options* opt, const GPTConfig* config, const TrainPlan* plan, DataLoader* train_loader,
                  DataLoader* val_loader) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    GPTModel model;
    if (gpt_model_create_padded(&model, *config, opt->batch_size, opt->seq_len, opt->attn, stream,
                                plan->pad_multiple) != 0)
        exit(1);
    gpt_model_print_memory(&model, stdout);
    MultiGpu* mg = plan->mg;
    if (mg) multi_gpu_attach(mg, &model);
    OptimizerState state;
    state.offset = plan->state_offset;
    state.elems = plan->state_elems;
    const size_t n = state.elems;
    float *norm, *clip_scale, *norm_scratch;
    int *inputs_dev, *targets_dev;
    void* staging = NULL;
    const size_t tokens = (size_t)opt->batch_size * opt->seq_len;
    const char* state_hint = "the fp32 master weights and AdamW moments take 12 bytes per parameter; use a smaller "
                             "model, or lower --batch-size or --seq-len to leave room for them";
    cuda_malloc_or_explain((void**)&state.master, n * sizeof(float), "the fp32 master weights", state_hint);
    cuda_malloc_or_explain((void**)&state.adam_m, n * sizeof(float), "the AdamW first moments", state_hint);
    cuda_malloc_or_explain((void**)&state.adam_v, n * sizeof(float), "the AdamW second moments", state_hint);
    CUDA_CHECK(cudaMemset(state.master, 0, n * sizeof(float)));  // ZeRO-1: the last shard's padding stays 0
    CUDA_CHECK(cudaMemset(state.adam_m, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(state.adam_v, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&norm, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&clip_scale, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&norm_scratch, global_norm_scratch_bytes()));
    CUDA_CHECK(cudaMalloc(&inputs_dev, tokens * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&targets_dev, tokens * sizeof(int)));
    if (plan->checkpoint_dir || plan->resume_path) CUDA_CHECK(cudaMallocHost(&staging, STAGING_BYTES));
    if (plan->resume_path) {
        load_checkpoint(plan->resume_path, &model, &state, staging);
        printf("resumed      from %s: %lld steps done\n", plan->resume_path, plan->start_step - 1);
    } else if (opt->init_from) {
        load_model_file(opt->init_from, &model, &state);
        printf("weights      from %s\n", opt->init_from);
    } else {
        init_parameters(&model, &state, opt->seed);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    // The plan read one batch to check the data; start from the first step's position.
    if (dataloader_set_state(train_loader, plan->start_data) != 0) {
        fprintf(stderr, "error: training data: %s\n", train_loader->error);
        exit(1);
    }

    FILE* log = NULL;
    if (opt->log_file && plan->rank == 0) {
        log = fopen(opt->log_file, plan->resume_path ? "a" : "w");  // a resumed run continues its log
        if (!log) {
            fprintf(stderr, "error: cannot write the log file %s: %s\n", opt->log_file, strerror(errno));
            exit(1);
        }
    }
    char last_checkpoint[CHECKPOINT_PATH_MAX + 64] = "";
    long long last_checkpoint_step = -1;
    if (plan->resume_path) {
        snprintf(last_checkpoint, sizeof(last_checkpoint), "%s", plan->resume_path);
        last_checkpoint_step = plan->start_step - 1;
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    const int have_val = val_loader != NULL;
    for (long long step = plan->start_step; step <= plan->steps; step++) {
        const DataLoaderState step_data = dataloader_get_state(train_loader);
        CUDA_CHECK(cudaEventRecord(start, stream));
        gpt_model_zero_grad(&model);
        double loss = 0.0;
        for (long long micro = 0; micro < plan->accumulation_steps; micro++) {
            next_batch_or_exit(train_loader, "training");
            upload_batch(train_loader, inputs_dev, targets_dev, tokens);
            gpt_model_forward(&model, inputs_dev, targets_dev);
            // several GPUs: the last micro step's backward reduces each layer's gradients as it goes
            if (mg) multi_gpu_arm_hook(mg, &model, micro == plan->accumulation_steps - 1);
            gpt_model_backward(&model, 1.0f / (float)((double)tokens * plan->accumulation_steps));
            loss += gpt_model_mean_loss(&model) / (double)plan->accumulation_steps;
        }
        float grad_norm = 0.0f;
        const float* norm_dev = norm;
        if (mg) {  // the global norm and the mean loss over all ranks
            multi_gpu_wait_grads(mg, stream);
            float mean_loss = 0.0f;
            multi_gpu_norm_and_loss(mg, norm_scratch, loss, &grad_norm, &mean_loss, stream);
            loss = mean_loss;
            norm_dev = mg->scalars;
        } else {
            global_norm(norm, norm_scratch, model.grads, model.num_params, stream);
            CUDA_CHECK(cudaMemcpyAsync(&grad_norm, norm, sizeof(float), cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));  // check before the update, so the state stays good
        }
        if (opt->dump_grads && step == plan->start_step && plan->rank == 0) dump_gradients(opt->dump_grads, &model);
        if (!isfinite(loss) || !isfinite(grad_norm)) {
            fprintf(stderr, "error: the %s is %g at step %lld; the weights were not updated\n",
                    isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? grad_norm : loss, step);
            if (plan->checkpoint_dir && last_checkpoint_step != step - 1)
                save_state(opt, plan, step - 1, step_data, &model, &state, staging, last_checkpoint,
                           sizeof(last_checkpoint));
            if (last_checkpoint[0])
                fprintf(stderr, "the last good checkpoint is %s; resume from it (--resume) with a lower --lr or "
                                "more --warmup-steps\n", last_checkpoint);
            else
                fprintf(stderr, "hint: lower --lr or raise --warmup-steps (and save checkpoints with "
                                "--checkpoint-dir to resume from the last good step)\n");
            exit(1);
        }
        const float* scale = NULL;
        if (opt->grad_clip > 0) {
            global_norm_clip_scale(clip_scale, norm_dev, (float)opt->grad_clip, stream);
            scale = clip_scale;
        }
        const double lr = learning_rate(opt, step, plan->steps);
        // AdamW on each tensor's part of the state's range (all of it; with ZeRO-1 the rank's shard)
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            size_t a, b;
            if (!state_overlap(&state, model.param_offsets[i], model.param_sizes[i], &a, &b)) continue;
            const size_t at = a - state.offset;
            adamw_update(state.master + at, model.params + a, model.grads + a, state.adam_m + at, state.adam_v + at,
                         b - a, (float)lr, 0.9f, 0.95f, 1e-8f, decays(i) ? (float)opt->weight_decay : 0.0f, (int)step,
                         1.0f, scale, stream);
        }
        if (mg && mg->zero) multi_gpu_all_gather_params(mg, model.params, stream);  // every rank's new shard
        CUDA_CHECK(cudaEventRecord(stop, stream));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        const double seconds = ms / 1e3;
        const double tokens_per_s = (double)plan->total_batch_tokens / seconds;
        const double tflops = plan->flops_per_step / plan->world / seconds / 1e12;  // per GPU
        const double mfu = plan->peak_tflops > 0 ? 100.0 * tflops / plan->peak_tflops : 0.0;
        printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | %.1f TFLOP/s | MFU %.1f%%\n",
               step, plan->steps, loss, lr, grad_norm, ms, tokens_per_s, tflops, mfu);
        if (log)
            fprintf(log,
                    "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.3f, "
                    "\"tokens_per_s\": %.1f, \"tflops_per_gpu\": %.2f, \"mfu\": %.4f}\n",
                    step, loss, lr, grad_norm, ms, tokens_per_s, tflops, mfu / 100.0);
        if (have_val && ((opt->val_every > 0 && step % opt->val_every == 0) || step == plan->steps)) {
            const double val = validation_loss(&model, val_loader, opt->val_batches, inputs_dev, targets_dev, mg);
            printf("step %5lld/%lld | val loss %.4f\n", step, plan->steps, val);
            if (log) fprintf(log, "{\"step\": %lld, \"val_loss\": %.6f}\n", step, val);
        }
        if (log) fflush(log);
        if (plan->checkpoint_dir &&
            ((opt->checkpoint_every > 0 && step % opt->checkpoint_every == 0) || step == plan->steps) &&
            save_state(opt, plan, step, dataloader_get_state(train_loader), &model, &state, staging,
                       last_checkpoint, sizeof(last_checkpoint)) == 0)
            last_checkpoint_step = step;
        fflush(stdout);
    }
    if (log) fclose(log);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree(state.master));
    CUDA_CHECK(cudaFree(state.adam_m));
    CUDA_CHECK(cudaFree(state.adam_v));
    CUDA_CHECK(cudaFree(norm));
    CUDA_CHECK(cudaFree(clip_scale));
    CUDA_CHECK(cudaFree(norm_scratch));
    CUDA_CHECK(cudaFree(inputs_dev));
    CUDA_CHECK(cudaFree(targets_dev));
    if (staging) CUDA_CHECK(cudaFreeHost(staging));
    gpt_model_destroy(&model);
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------
// Plan and main

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

int main(int argc, char** argv) {
    Options opt = parse_options(argc, argv);
    // Which process of how many (mpirun, srun, torchrun-style variables; none: the only one).
    LaunchInfo launch;
    char launch_err[512];
    if (launcher_detect(&launch, launch_err, sizeof(launch_err)) != 0) {
        fprintf(stderr, "error: launcher environment: %s\n", launch_err);
        exit(2);
    }
    const int rank = launch.rank, world = launch.world;
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) {  // rank 0 prints and logs; the others print errors
        fprintf(stderr, "error: rank %d cannot silence its output: %s\n", rank, strerror(errno));
        exit(1);
    }
    if (world == 1 && opt.zero) {
        printf("note         --zero 1 on one GPU has nothing to shard: running without it\n");
        opt.zero = 0;
    }
    if (opt.zero && opt.dump_grads) {
        fprintf(stderr, "error: --dump-grads needs the whole gradient on one GPU; run it without --zero 1\n");
        exit(2);
    }
    GPTConfig config = build_config(&opt);
    const int B = opt.batch_size, T = opt.seq_len;
    const long long tokens_per_micro_step = (long long)B * T;
    const long long tokens_per_global_micro_step = tokens_per_micro_step * world;
    long long total_batch_tokens = opt.total_batch_tokens ? opt.total_batch_tokens : tokens_per_global_micro_step;
    if (total_batch_tokens % tokens_per_global_micro_step != 0) {
        if (world == 1)
            fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len = %lld\n",
                    total_batch_tokens, tokens_per_micro_step);
        else
            fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len * GPUs = "
                            "%d * %d * %d = %lld\n", total_batch_tokens, B, T, world, tokens_per_global_micro_step);
        exit(2);
    }
    const long long accumulation_steps = total_batch_tokens / tokens_per_global_micro_step;

    DataLoader train_loader, val_loader;
    open_data_or_exit(&train_loader, "training", opt.train_data, &opt, rank, world);
    const int have_val = opt.val_data[0] != '\0';
    if (have_val) open_data_or_exit(&val_loader, "validation", opt.val_data, &opt, rank, world);
    // Read the first batch now so a bad token range in the first shard is reported before any GPU work.
    if (dataloader_next_batch(&train_loader) != 0) {
        fprintf(stderr, "error: training data: %s\n", train_loader.error);
        exit(1);
    }
    const long long micro_batches_per_epoch = dataloader_batches_per_epoch(&train_loader);
    const long long steps =
        opt.max_steps ? opt.max_steps : (micro_batches_per_epoch + accumulation_steps - 1) / accumulation_steps;
    TrainPlan plan;
    memset(&plan, 0, sizeof(plan));
    plan.header = run_header(&opt, &config, steps, total_batch_tokens, &train_loader, world);
    plan.start_step = 1;
    plan.rank = rank, plan.world = world;
    // The flat parameter vector, padded to split evenly over the GPUs; the optimizer state covers all
    // of it, or with ZeRO-1 this rank's shard of S elements.
    const size_t num_params = gpt_num_params(&config);
    plan.pad_multiple = multi_gpu_pad_multiple(world);
    const size_t padded_params = (num_params + plan.pad_multiple - 1) / plan.pad_multiple * plan.pad_multiple;
    const size_t shard = padded_params / (size_t)world;
    plan.state_offset = opt.zero ? (size_t)rank * shard : 0;
    plan.state_elems = opt.zero ? shard : num_params;
    if (opt.zero) {
        plan.header.zero_stage = 1;
        plan.header.rank = rank;
        plan.header.shard_offset = (int64_t)plan.state_offset;
        plan.header.shard_size = (int64_t)shard;
    }
    static char resume_path[CHECKPOINT_PATH_MAX], resume_dir[CHECKPOINT_PATH_MAX];
    if (opt.resume) {
        static char found_path[CHECKPOINT_PATH_MAX];
        find_resume_checkpoint(opt.resume, found_path, resume_dir);
        checkpoint_rank_file(resume_path, sizeof(resume_path), found_path, rank);  // this rank's file of a ZeRO-1 step
        plan.resume_path = resume_path;
        CheckpointHeader saved = read_checkpoint_header(plan.resume_path);
        if (saved.world_size != world || saved.zero_stage != opt.zero ||
            (opt.zero && (saved.rank != rank || saved.shard_size != (int64_t)shard))) {
            fprintf(stderr, "error: cannot resume from %s: it was saved by %d GPU(s) with --zero %d (rank %d), this run "
                            "has %d GPU(s) with --zero %d (rank %d); a checkpoint resumes on the same number of GPUs "
                            "with the same --zero\n",
                    plan.resume_path, (int)saved.world_size, (int)saved.zero_stage, (int)saved.rank, world, opt.zero,
                    rank);
            if (saved.world_size > 1)
                fprintf(stderr, "hint: resume with mpirun -np %d ./train_gpt ... --zero %d (or %d processes of another "
                                "launcher)\n", (int)saved.world_size, (int)saved.zero_stage, (int)saved.world_size);
            else
                fprintf(stderr, "hint: resume with one process: ./train_gpt ... (no launcher, no --zero)\n");
            exit(2);
        }
        check_resume_compatible(&saved, &plan.header, plan.resume_path);
        if (saved.step >= steps) {
            fprintf(stderr, "error: %s is at step %lld and this run ends at step %lld: nothing to do; raise "
                            "--max-steps to train further\n", plan.resume_path, (long long)saved.step, steps);
            exit(2);
        }
        plan.start_step = saved.step + 1;
        plan.start_data.epoch = saved.data_epoch;
        plan.start_data.shard_index = saved.data_shard_index;
        plan.start_data.chunk_index = saved.data_chunk_index;
        if (dataloader_set_state(&train_loader, plan.start_data) != 0) {
            fprintf(stderr, "error: cannot resume from %s: %s\n", plan.resume_path, train_loader.error);
            exit(2);
        }
    }
    plan.checkpoint_dir = opt.checkpoint_dir ? opt.checkpoint_dir : (opt.resume ? resume_dir : NULL);
    if (opt.checkpoint_dir) refuse_foreign_checkpoints(opt.checkpoint_dir, opt.resume ? resume_dir : NULL);
    if (opt.init_from) {  // check the file now, before any GPU work
        ModelFile file;
        open_model_file_or_exit(&file, opt.init_from, &config);
        model_file_close(&file);
    }

    // Model state per GPU: bf16 weights and gradients, fp32 master weights and two AdamW moments
    // (ZeRO-1: only the shard's).
    const double state_bytes = world == 1 ? (double)num_params * (2 + 2 + 4 + 4 + 4)
                                          : (double)padded_params * (2 + 2) + (double)plan.state_elems * (4 + 4 + 4);
    const double flops_per_step = gpt_flops_per_sequence(&config, T) * (double)(total_batch_tokens / T);

    printf("model        %s: %d layers, hidden %d, %d heads of %d, vocab %d padded to %d, seq %d\n", opt.model,
           config.num_layers, config.channels, config.num_heads, config.channels / config.num_heads,
           config.vocab_size, config.padded_vocab_size, T);
    printf("parameters   %zu (%.3f B)\n", num_params, num_params / 1e9);
    printf("attention    %s\n", attention_backend_name(opt.attn));
    if (world == 1)
        printf("batch        %d x %d = %lld tokens per micro step, %lld micro steps per optimizer step = %lld tokens\n",
               B, T, tokens_per_micro_step, accumulation_steps, total_batch_tokens);
    else
        printf("batch        %d x %d = %lld tokens per micro step per GPU x %d GPUs, %lld micro steps per optimizer "
               "step = %lld tokens\n", B, T, tokens_per_micro_step, world, accumulation_steps, total_batch_tokens);
    printf("train data   %s: %d shard(s), %lld tokens, %lld micro batches per epoch%s%s\n", opt.train_data,
           train_loader.num_shards, (long long)train_loader.total_tokens, micro_batches_per_epoch,
           world > 1 ? " (of B*T*GPUs tokens, each GPU reads its part)" : "", opt.shuffle ? ", shuffled" : "");
    if (have_val)
        printf("val data     %s: %d shard(s), %lld tokens\n", opt.val_data, val_loader.num_shards,
               (long long)val_loader.total_tokens);
    else
        printf("val data     none\n");
    printf("first batch  %d %d %d %d ... (targets %d %d %d %d ...)\n", train_loader.inputs[0], train_loader.inputs[1],
           train_loader.inputs[2], train_loader.inputs[3], train_loader.targets[0], train_loader.targets[1],
           train_loader.targets[2], train_loader.targets[3]);
    printf("steps        %lld\n", steps);
    if (plan.resume_path)
        printf("resume       %s: %lld steps done, continues at step %lld (data epoch %lld, shard %lld, chunk %lld)\n",
               plan.resume_path, plan.start_step - 1, plan.start_step, (long long)plan.start_data.epoch,
               (long long)plan.start_data.shard_index, (long long)plan.start_data.chunk_index);
    else
        printf("init         %s\n", opt.init_from ? opt.init_from : "GPT-2 (normal 0.02, residual projections / sqrt(2L))");
    if (plan.checkpoint_dir) {
        char every[64] = "";
        if (opt.checkpoint_every > 0) snprintf(every, sizeof(every), "every %lld steps and ", opt.checkpoint_every);
        char keep[64] = "keeping all";
        if (opt.keep_checkpoints > 0) snprintf(keep, sizeof(keep), "keeping the %d newest", opt.keep_checkpoints);
        printf("checkpoints  %safter the last step into %s, %s (%.2f GiB each%s)\n", every, plan.checkpoint_dir, keep,
               gib((double)CHECKPOINT_HEADER_BYTES + (double)checkpoint_header_payload_bytes(&plan.header)),
               opt.zero ? ", one file per GPU: step_XXXXXXXX.rankRRofWW.ckpt" : "");
    } else {
        printf("checkpoints  none (--checkpoint-dir DIR to save them)\n");
    }
    printf("model FLOPs  %.3f TFLOP per optimizer step (6*s*P + 12*L*h*s^2 per sequence)\n", flops_per_step / 1e12);
    printf("model state  %.2f GiB%s (bf16 weights + grads, fp32 master + AdamW moments%s); activations extra\n",
           gib(state_bytes), world > 1 ? " per GPU" : "", opt.zero ? ", the last three sharded over the GPUs" : "");

    // Each process uses GPU LOCAL_RANK (else its rank) of those it sees; set before any other CUDA work.
    int device = 0, device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess) {
        cudaGetLastError();
        device_count = 0;
    }
    if (device_count > 0) device = (launch.local_rank >= 0 ? launch.local_rank : rank) % device_count;
    GpuInfo gpu = gpu_info(device);
    printf("gpus         %d (launcher: %s), zero %d", world, launch.source, opt.zero);
    if (world > 1)
        printf(", rank 0 on GPU %d; rendezvous %s:%d, timeout %g s; TFLOP/s and MFU are per GPU", device,
               launch.master_addr, launch.master_port, opt.rendezvous_timeout);
    printf("\n");
    double peak = 0.0;
    if (!gpu.found) {
        printf("gpu          none found: plan only\n");
    } else {
        peak = opt.peak_tflops > 0 ? opt.peak_tflops : gpu_peak_bf16_tflops(gpu.name);
        printf("gpu          %s, sm_%d%d, %d SMs, %.1f GiB free of %.1f GiB\n", gpu.name, gpu.major, gpu.minor,
               gpu.num_sms, gib((double)gpu.free_bytes), gib((double)gpu.total_bytes));
        if (peak > 0)
            printf("mfu peak     %.1f TFLOP/s dense bf16 (%s)\n", peak,
                   opt.peak_tflops > 0 ? "from --peak-tflops" : "by GPU name");
        else
            printf("mfu peak     unknown for this GPU: pass --peak-tflops to report MFU\n");
        if (state_bytes > (double)gpu.free_bytes) {
            fprintf(stderr,
                    "error: the model state needs %.2f GiB but the GPU has %.2f GiB free; use a smaller model "
                    "(--model, --layers, --hidden) or more GPUs with optimizer sharding (--zero 1)\n",
                    gib(state_bytes), gib((double)gpu.free_bytes));
            exit(1);
        }
    }
    if (gpu.found && !opt.plan_only) {
        plan.steps = steps;
        plan.accumulation_steps = accumulation_steps;
        plan.total_batch_tokens = total_batch_tokens;
        plan.flops_per_step = flops_per_step;
        plan.peak_tflops = peak;
        char err[CHECKPOINT_PATH_MAX + 256];
        if (plan.checkpoint_dir && checkpoint_make_dir(plan.checkpoint_dir, err, sizeof(err)) != 0) {
            fprintf(stderr, "error: %s\n", err);
            exit(1);
        }
        static MultiGpu mg;
        if (world > 1) {
            // Every rank must run the same model, batch, data and schedule: the rendezvous compares a hash.
            CheckpointHeader same = plan.header;
            same.rank = 0, same.shard_offset = 0;
            uint64_t tag = launcher_hash(0, &same, sizeof(same));
            tag = launcher_hash(tag, &steps, sizeof(steps));
            multi_gpu_init(&mg, &launch, device, opt.zero, tag, opt.rendezvous_timeout);
            plan.mg = &mg;
        }
        train(&opt, &config, &plan, &train_loader, have_val ? &val_loader : NULL);
        if (world > 1) multi_gpu_destroy(&mg);
    }

    dataloader_close(&train_loader);
    if (have_val) dataloader_close(&val_loader);
    return 0;
}
