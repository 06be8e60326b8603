// train_gpt.cu: GPT training in C/CUDA around our own FlashAttention kernels.
//
// main() reads the options, makes the plan (model, batch, data, resume; every bad input stops here
// with a message, before any GPU work), prints it, and runs it: on one GPU, or data parallel on
// several (one process per GPU, launched by mpirun, srun or torchrun-style environment variables;
// layers/multi_gpu/launcher.h, layers/multi_gpu/multi_gpu.cuh; optional ZeRO-1 optimizer sharding).
// The training step (train() below) is a recipe: next batch → forward and backward over the micro
// steps (gradients reduced over the GPUs as the backward goes) → global gradient norm → clip and
// AdamW → log, validate, evaluate, checkpoint.
//
// Where the rest lives:
//   data/gpt_config.h                  the shape, the table of parameter tensors, FLOPs
//   data/dataloader.h                  token shards
//   layers/model/gpt_model.cuh         the model on the GPU: parameters, activations, forward, backward
//   layers/optimizer/optimizer.cuh     fp32 master weights, AdamW, clipping, the ZeRO-1 shard, GPT-2 init
//   layers/training/train_state.cuh    checkpoints (format: data/checkpoint.h) and llm.c weight files
//   layers/training/eval_multiple_choice.cuh  --eval-data: HellaSwag-style accuracy (format: data/eval_file.h)
//   layers/multi_gpu/multi_gpu.cuh     NCCL, the gradient all-reduce, the watchdog
//   layers/generate/gpt_generate.cuh   --generate and the samples after training (KV cache: gpt_decode.cuh)
//   attention/attention.h              the attention backends (--attn)
//
// Sections, top to bottom: options, plan, training, generation, main.
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_profiler_api.h>

#include "attention/attention.h"
#include "layers/training/batch_upload.h"
#include "data/checkpoint.h"
#include "data/dataloader.h"
#include "layers/training/eval_multiple_choice.cuh"
#include "layers/training/train_state.cuh"
#include "layers/context_parallel/context_parallel.cuh"
#include "layers/context_parallel/zigzag.h"
#include "layers/cuda_common.h"
#include "data/gpt_config.h"
#include "data/model_file.h"
#include "layers/generate/gpt_generate.cuh"
#include "layers/model/gpt_model.cuh"
#include "layers/multi_gpu/launcher.h"
#include "layers/multi_gpu/multi_gpu.cuh"
#include "layers/optimizer/optimizer.cuh"
#include "layers/multi_gpu/stop_signal.h"

// The commit this binary was built from ("-dirty": with uncommitted changes) and the GPU targets it was
// compiled for: build/build_info.c, which the Makefile writes. The plan and --version print it, so a
// log names the binary that made it, not only the tree it ran in.
extern "C" const char train_gpt_build[];

// ---------------------------------------------------------------------------------------------
// Options: each flag is one row of OPTIONS below (its field, default, help); getopt_long parses
// them and --help prints the same rows, so the two cannot drift apart.

typedef struct {
    const char* model;            // a name from gpt_config.h
    int model_given;              // --model was on the command line (not the default)
    int layers, hidden, heads;    // overrides of the named shape; 0 = keep
    int kv_heads;                 // key/value heads (grouped-query attention); 0 = the number of heads
    AttentionBackend attn;
    int deterministic;            // flash2: dQ added in a fixed order (bit-identical reruns)
    RecomputeMode recompute;      // what the backward recomputes instead of keeping (layers/model/gpt_model.cuh)
    GPTPrecision precision;       // the blocks' linear layers in bf16 or FP8 (layers/model/gpt_fp8.cuh)
    Fp8Recipe fp8_recipe;         // how FP8 activation and gradient scales are chosen
    const char* train_data;       // shard path or glob
    const char* val_data;         // shard path or glob; "" = no validation
    int shuffle;
    uint64_t seed;
    int batch_size;               // B, sequences per micro step per GPU
    int seq_len;                  // T
    long long total_batch_tokens; // tokens per optimizer step; 0 = B·T·GPUs (no accumulation)
    long long max_steps;          // optimizer steps of the schedule; 0 = one pass over the training data
    double lr, min_lr_fraction;   // peak learning rate; the cosine ends at lr · min_lr_fraction
    long long warmup_steps;
    double weight_decay;          // on 2-D weights only
    double grad_clip;             // global-norm clip; 0 = off
    long long val_every;          // steps between validation losses; 0 = only at the end
    long long val_batches;        // micro batches per validation (0 = the whole validation set)
    const char* log_file;         // JSON lines, one per step; NULL = none
    int plan_only;
    const char* checkpoint_dir;   // NULL = the default (runs/<model>, or with --resume the resumed file's
                                  // directory); --checkpoint-dir none leaves it NULL and sets no_checkpoints
    int no_checkpoints;           // --checkpoint-dir none
    long long checkpoint_every;   // steps between checkpoints; the last step is always saved
    int keep_checkpoints;         // newest checkpoints kept in checkpoint_dir; 0 = all
    const char* resume;           // a checkpoint file, or a directory (its newest); NULL = fresh run
    const char* init_from;        // llm.c model file with the initial weights; NULL = GPT-2 init
    const char* dump_grads;       // write the first step's gradients here (llm.c format, bf16)
    int zero;                     // 1: ZeRO-1, optimizer state and master weights sharded over the GPUs
    int context_parallel;         // N: GPUs sharing every sequence (layers/context_parallel/context_parallel.cuh)
    double rendezvous_timeout;    // seconds a rank waits for the others at the start (multi-GPU)
    const char* rendezvous;       // "tcp" (MASTER_ADDR:MASTER_PORT) or "file:PATH"
    double nccl_timeout;          // seconds the watchdog waits for a collective before aborting
    double peak_tflops;           // 0 = look up by GPU name
    int generate;                 // --generate M: continue the prompt by M tokens instead of training; 0 = train
    const char* prompt_tokens;    // a comma list of token ids or a file of them; NULL = <|endoftext|>
    int num_samples;              // sequences generated together
    double temperature;           // 0 = greedy
    int top_k;                    // 0 = all tokens
    long long sample_every;       // print a sample every N training steps too; 0 = only after the last
    int sample_tokens;            // tokens per sample during training; 0 = no samples
    const char* tokenizer;        // llm.c token table; NULL = gpt2_tokenizer.bin beside the training shards
    const char* eval_data;        // multiple-choice eval file (data/eval_file.h); NULL = none
    long long eval_every;         // steps between evaluations; 0 = only after the last step
    long long eval_examples;      // the first N examples; 0 = all
    int eval_only;                // score --eval-data with the given weights and exit
} Options;

typedef enum {
    OPT_SECTION,  // a heading of --help (help is its title)
    OPT_TEXT,     // a paragraph of --help, printed as it is
    OPT_STRING, OPT_INT, OPT_LONG, OPT_SEED, OPT_DOUBLE, OPT_FLAG, OPT_ATTN, OPT_RECOMPUTE, OPT_PRECISION,
    OPT_FP8_RECIPE, OPT_ZERO, OPT_HELP, OPT_VERSION
} OptionKind;

typedef struct {
    const char* name;    // the long flag without "--"
    char short_name;     // 0: none
    OptionKind kind;
    size_t field;        // offsetof(Options, ...)
    const char* value;   // the default, parsed as if given on the command line; NULL: zero
    const char* arg;     // the argument's name in --help; NULL: no argument
    long long min, max;  // OPT_INT, OPT_LONG: the range; OPT_DOUBLE: min
    const char* help;    // NULL: an alias, not listed
} OptionSpec;

#define FIELD(f) offsetof(Options, f)
#define SECTION(title) {NULL, 0, OPT_SECTION, 0, NULL, NULL, 0, 0, title}
#define TEXT(text) {NULL, 0, OPT_TEXT, 0, NULL, NULL, 0, 0, text}
static const OptionSpec OPTIONS[] = {
    SECTION("model"),
    {"model", 'm', OPT_STRING, FIELD(model), "gpt2-124m", "NAME", 0, 0,
     "gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, gpt3-1.3b, gpt3-2.7b, gpt3-2.7b-d128"},
    {"layers", 0, OPT_INT, FIELD(layers), NULL, "N", 1, 1000, "override the number of layers"},
    {"hidden", 0, OPT_INT, FIELD(hidden), NULL, "N", 1, 1 << 16, "override the hidden size"},
    {"heads", 0, OPT_INT, FIELD(heads), NULL, "N", 1, 1024,
     "override the number of heads (head dim = hidden / heads must be 64, 80, 96 or 128)"},
    {"kv-heads", 0, OPT_INT, FIELD(kv_heads), NULL, "N", 1, 1024,
     "key/value heads, a divisor of the heads (default: the heads, multi-head attention; 1: multi-query; "
     "else grouped-query attention: heads / N query heads share each key/value head)"},
    {"attn", 'a', OPT_ATTN, FIELD(attn), "flash2", "BACKEND", 0, 0,
     "naive | flash1 | flash2, or naive-recompute: naive that recomputes S and P in the backward (long T)"},
    {"deterministic", 0, OPT_FLAG, FIELD(deterministic), NULL, NULL, 0, 0,
     "flash2 adds dQ in a fixed order, so that a rerun gives the same gradients bit for bit (its Hopper "
     "kernels; slower, most with causal attention; naive and flash1 are deterministic anyway); GEMMs then "
     "take cuBLASLt's first algorithm, as with naive and flash1, not the fastest timed at start-up; on several GPUs "
     "--zero 0 reduces the gradients as --zero 1 does (to each shard's owner, then broadcast), so both give the same "
     "bits"},
    {"recompute", 0, OPT_RECOMPUTE, FIELD(recompute), "none", "MODE", 0, 0,
     "none | selective | full: activation recomputation for long sequences. selective keeps the GEMM outputs "
     "and recomputes LayerNorms and GELU (and naive attention's forward) in the backward; full keeps only each "
     "block's input and reruns the block's forward in its backward (about a third more compute). The plan "
     "shows the activation memory of each"},
    {"precision", 0, OPT_PRECISION, FIELD(precision), "bf16", "P", 0, 0,
     "bf16 | fp8: fp8 runs the four linear layers of every block (qkv, attention projection, fc, fc projection) "
     "forward and backward on FP8 tensor cores (Hopper or newer; E4M3 weights and activations, E5M2 gradients, "
     "per-tensor scales); the LM head, embeddings, LayerNorms, attention and the optimizer stay bf16/fp32. "
     "Faster, at a small cost in loss (README)"},
    {"fp8-recipe", 0, OPT_FP8_RECIPE, FIELD(fp8_recipe), "delayed", "R", 0, 0,
     "delayed | current: with --precision fp8, how activation and gradient scales are chosen: delayed from the "
     "amax of the last 16 steps, recorded by the casts themselves; current from each tensor's own amax, one more "
     "pass over it"},
    SECTION("data"),
    {"train-data", 'i', OPT_STRING, FIELD(train_data), "data/tinyshakespeare/tinyshakespeare_train_*.bin",
     "PATTERN", 0, 0, "training shards, a path or a glob"},
    {"val-data", 'j', OPT_STRING, FIELD(val_data), "data/tinyshakespeare/tinyshakespeare_val_*.bin", "PATTERN", 0,
     0, "validation shards; \"\" for none"},
    {"shuffle", 0, OPT_FLAG, FIELD(shuffle), NULL, NULL, 0, 0, "shuffle shard and batch order every epoch"},
    {"seed", 0, OPT_SEED, FIELD(seed), "1337", "N", 0, INT64_MAX,
     "seed for shuffling, the initialization and sampling"},
    SECTION("batch"),
    {"batch-size", 'b', OPT_INT, FIELD(batch_size), "4", "N", 1, 1 << 20, "sequences per micro step per GPU"},
    {"seq-len", 't', OPT_INT, FIELD(seq_len), "1024", "N", 1, 1 << 20, "tokens per sequence"},
    {"total-batch-tokens", 'd', OPT_LONG, FIELD(total_batch_tokens), NULL, "N", 1, INT64_MAX,
     "tokens per optimizer step, a multiple of batch-size * seq-len (* GPUs); default: batch-size * seq-len "
     "(* GPUs), no accumulation"},
    {"max-steps", 'x', OPT_LONG, FIELD(max_steps), NULL, "N", 1, INT64_MAX,
     "optimizer steps of the run and its LR schedule (default: one pass over the training data); --steps is "
     "the same flag"},
    {"steps", 0, OPT_LONG, FIELD(max_steps), NULL, "N", 1, INT64_MAX, NULL},
    SECTION("optimizer"),
    {"lr", 0, OPT_DOUBLE, FIELD(lr), "3e-4", "X", 0, 0, "peak learning rate"},
    {"min-lr-fraction", 0, OPT_DOUBLE, FIELD(min_lr_fraction), "0.1", "X", 0, 0,
     "the cosine decays to lr * X at the last step"},
    {"warmup-steps", 0, OPT_LONG, FIELD(warmup_steps), "0", "N", 0, INT64_MAX, "linear warmup steps"},
    {"weight-decay", 0, OPT_DOUBLE, FIELD(weight_decay), "0.1", "X", 0, 0, "AdamW weight decay on 2-D weights"},
    {"grad-clip", 0, OPT_DOUBLE, FIELD(grad_clip), "1.0", "X", 0, 0, "clip the global gradient norm to X; 0 = off"},
    SECTION("logging"),
    {"val-every", 0, OPT_LONG, FIELD(val_every), "0", "N", 0, INT64_MAX,
     "validation loss every N steps; 0: at the end only"},
    {"val-batches", 0, OPT_LONG, FIELD(val_batches), "20", "N", 0, INT64_MAX, "micro batches per validation, 0 = all"},
    {"log-file", 0, OPT_STRING, FIELD(log_file), NULL, "PATH", 0, 0, "also write each step as a JSON line to PATH"},
    {"plan-only", 0, OPT_FLAG, FIELD(plan_only), NULL, NULL, 0, 0, "print the plan and exit without training"},
    SECTION("evaluation (multiple choice, llm.c's HellaSwag format: data/README.md)"),
    {"eval-data", 0, OPT_STRING, FIELD(eval_data), NULL, "FILE", 0, 0,
     "a multiple-choice eval file (scripts/prepare_hellaswag.py writes HellaSwag's): accuracy every --eval-every "
     "steps and after the last, each GPU scoring its share of the examples"},
    {"eval-every", 0, OPT_LONG, FIELD(eval_every), "0", "N", 0, INT64_MAX, "evaluate every N steps; 0: after the last "
     "step only"},
    {"eval-examples", 0, OPT_LONG, FIELD(eval_examples), "0", "N", 0, 65535, "score the first N examples; 0: all"},
    {"eval-only", 0, OPT_FLAG, FIELD(eval_only), NULL, NULL, 0, 0,
     "score --eval-data with the weights of --resume CKPT or --init-from FILE (an llm.c model file, or a Hugging Face "
     "GPT-2 through scripts/import_hf.py) on one GPU, B rows of min(--seq-len, the model's positions) at a time, and "
     "exit; --log-file gets one JSON line per example (its completions' mean losses and the choice)"},
    SECTION("checkpoints (format: data/README.md)"),
    {"checkpoint-dir", 0, OPT_STRING, FIELD(checkpoint_dir), NULL, "DIR", 0, 0,
     "save DIR/step_XXXXXXXX.ckpt (weights, optimizer, step, data position); DIR must not hold another run's "
     "checkpoints. Default: runs/MODEL, or the first of runs/MODEL-2, -3, ... that holds no run (with --resume: "
     "the resumed checkpoint's directory); none: no checkpoints"},
    {"checkpoint-every", 0, OPT_LONG, FIELD(checkpoint_every), "0", "N", 0, INT64_MAX,
     "save every N steps; 0: only after the last step"},
    {"keep-checkpoints", 0, OPT_INT, FIELD(keep_checkpoints), "2", "N", 0, 1 << 30,
     "keep the N newest checkpoints, 0 = all"},
    {"resume", 0, OPT_STRING, FIELD(resume), NULL, "PATH", 0, 0,
     "continue from a checkpoint file, or the newest in a directory; the next steps give the same losses as an "
     "uninterrupted run. auto: the newest in --checkpoint-dir if there is one, else start fresh (for job "
     "scripts that relaunch the same command)"},
    SECTION("weights"),
    {"init-from", 0, OPT_STRING, FIELD(init_from), NULL, "PATH", 0, 0,
     "start from weights in llm.c's model file format (fp32 or bf16) instead of the GPT-2 initialization"},
    {"dump-grads", 0, OPT_STRING, FIELD(dump_grads), NULL, "PATH", 0, 0,
     "write the gradients of the run's first step (mean over its tokens, before clipping) as a bf16 llm.c model "
     "file"},
    SECTION("multi-GPU (one process per GPU; gradients averaged over NCCL while the backward runs)"),
    {"zero", 0, OPT_ZERO, FIELD(zero), "0", "N", 0, 0,
     "0: every GPU keeps the whole optimizer state; 1: ZeRO-1, fp32 master weights and AdamW moments sharded "
     "over the GPUs"},
    {"context-parallel", 0, OPT_INT, FIELD(context_parallel), "1", "N", 1, 1024,
     "N GPUs share every sequence, each holding T/N of its tokens (the zigzag split: chunks c and 2N-1-c of 2N); "
     "attention runs around a ring of the N GPUs, everything else on the local tokens. The GPUs must be a "
     "multiple of N (data parallel over GPUs / N groups) and --seq-len a multiple of 2N; flash2 only, not yet "
     "with --precision fp8 or --eval-data. Composes with --zero 1 (the optimizer state sharded over all the "
     "GPUs) and --recompute. A checkpoint without --zero 1 resumes with any N of the same GPUs / N"},
    {"rendezvous-timeout", 0, OPT_DOUBLE, FIELD(rendezvous_timeout), "120", "S", 1, 0,
     "seconds the ranks wait for each other at the start"},
    {"rendezvous", 0, OPT_STRING, FIELD(rendezvous), "tcp", "HOW", 0, 0,
     "tcp: rank 0 hands NCCL's id to the others at MASTER_ADDR:MASTER_PORT; file:PATH: through files at PATH on a "
     "filesystem every rank shares (for nodes that cannot reach each other's ports; no heartbeat then)"},
    {"nccl-timeout", 0, OPT_DOUBLE, FIELD(nccl_timeout), "300", "S", 1, 0,
     "the watchdog: when a collective has not completed after S seconds (or NCCL reports an error, or a rank's "
     "process ended), every rank prints the step, the collective and the suspected rank, aborts NCCL and exits 1"},
    TEXT("  launchers (the rank and world size come from the environment, first match wins):\n"
         "    torchrun style  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT\n"
         "    mpirun          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (Open MPI)\n"
         "    srun            SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID\n"
         "  Rank 0 hands NCCL's id to the others over TCP at MASTER_ADDR:MASTER_PORT (default\n"
         "  127.0.0.1:29500: one node; on several nodes set MASTER_ADDR to rank 0's host), or through\n"
         "  files with --rendezvous file:PATH. Each process uses GPU LOCAL_RANK. -b is per GPU;\n"
         "  --total-batch-tokens is global (B*T*GPUs*accumulation). A stop signal to any rank stops\n"
         "  every rank after the same step.\n"
         "    mpirun -np 2 -x NCCL_NVLS_ENABLE=0 ./train_gpt --zero 1 ...\n"
         "    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=29500 ./train_gpt ...   (one per GPU)\n"
         "    srun --ntasks-per-node=8 --gpus-per-node=8 ./train_gpt ...\n"),
    SECTION("generation (layers/generate/gpt_generate.cuh)"),
    {"generate", 0, OPT_INT, FIELD(generate), NULL, "M", 1, 1 << 20,
     "instead of training, continue the prompt by M tokens with a KV cache, from --resume CKPT or --init-from "
     "FILE (the model's shape comes from that file; only the weights and the cache are allocated), and print "
     "the text, tokens/s, ms per step and the memory taken"},
    {"prompt-tokens", 0, OPT_STRING, FIELD(prompt_tokens), NULL, "LIST", 0, 0,
     "the prompt as token ids: a comma list (464,3290) or a file of ids (scripts/encode_prompt.py writes one "
     "from text); default: <|endoftext|>"},
    {"num-samples", 0, OPT_INT, FIELD(num_samples), "1", "N", 1, 4096, "sequences generated together (a batch)"},
    {"temperature", 0, OPT_DOUBLE, FIELD(temperature), "1.0", "X", 0, 0,
     "sampling temperature; 0 = greedy (the most likely token)"},
    {"top-k", 0, OPT_INT, FIELD(top_k), "0", "N", 0, 1 << 20, "sample among the N most likely tokens; 0 = all"},
    {"sample-every", 0, OPT_LONG, FIELD(sample_every), "0", "N", 0, INT64_MAX,
     "while training, print a sample from <|endoftext|> every N steps as well as after the last; 0 = only after "
     "the last"},
    {"sample-tokens", 0, OPT_INT, FIELD(sample_tokens), "64", "M", 0, 1 << 20,
     "tokens per sample during training (at most --seq-len); 0 = no samples"},
    {"tokenizer", 0, OPT_STRING, FIELD(tokenizer), NULL, "PATH", 0, 0,
     "GPT-2 token table (llm.c's gpt2_tokenizer.bin format) to print text; default: gpt2_tokenizer.bin beside "
     "the training shards, else token ids are printed"},
    SECTION("throughput"),
    {"peak-tflops", 0, OPT_DOUBLE, FIELD(peak_tflops), NULL, "X", 0, 0,
     "dense bf16 peak for MFU (default: by GPU name; H100/H200 SXM 989.4, A100 312)"},
    {"help", 'h', OPT_HELP, 0, NULL, NULL, 0, 0, "show this help"},
    {"version", 0, OPT_VERSION, 0, NULL, NULL, 0, 0, "print the commit this binary was built from and its GPU targets"},
};
#define NUM_OPTIONS ((int)(sizeof(OPTIONS) / sizeof(OPTIONS[0])))
#define HELP_COLUMN 30
#define HELP_WIDTH 96

// Prints `text` from column HELP_COLUMN (the cursor is at `column`), wrapped at HELP_WIDTH.
static void print_wrapped(FILE* out, const char* text, int column) {
    while (*text) {
        fprintf(out, "%*s", column < HELP_COLUMN ? HELP_COLUMN - column : 0, "");
        int len = (int)strlen(text);
        if (len > HELP_WIDTH - HELP_COLUMN) {  // break at the last space that fits
            len = HELP_WIDTH - HELP_COLUMN;
            while (len > 0 && text[len] != ' ') len--;
            if (len == 0) len = (int)strlen(text);
        }
        fprintf(out, "%.*s\n", len, text);
        text += len;
        while (*text == ' ') text++;
        column = 0;
    }
}

static void print_usage(FILE* out) {
    fprintf(out, "usage: ./train_gpt [options]\n\n"
                 "Trains a GPT on token shards (llm.c format) and reports tokens/s, TFLOP/s per GPU and MFU.\n"
                 "It checks the options and the data, prints the plan, and trains on one GPU, or data parallel\n"
                 "on several GPUs and nodes with one process per GPU (see multi-GPU below).\n\n");
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptionSpec* o = &OPTIONS[i];
        if (o->kind == OPT_SECTION) fprintf(out, "%s\n", o->help);
        if (o->kind == OPT_TEXT) fprintf(out, "%s", o->help);
        if (o->kind == OPT_SECTION || o->kind == OPT_TEXT || !o->help) continue;
        char flag[64];
        int n = o->short_name ? snprintf(flag, sizeof(flag), "  -%c, --%s", o->short_name, o->name)
                              : snprintf(flag, sizeof(flag), "      --%s", o->name);
        if (o->arg) snprintf(flag + n, sizeof(flag) - (size_t)n, " %s", o->arg);
        fprintf(out, "%s", flag);
        char help[512];
        snprintf(help, sizeof(help), o->value ? "%s (default %s)" : "%s", o->help, o->value);
        print_wrapped(out, help, (int)strlen(flag));
    }
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

// Sets the option's field from `text` (a command-line argument or the default); exits (2) when bad.
static void set_option(Options* opt, const OptionSpec* o, const char* text) {
    char flag[64];
    snprintf(flag, sizeof(flag), "--%s", o->name);
    char* field = (char*)opt + o->field;
    switch (o->kind) {
        case OPT_STRING: *(const char**)field = text; break;
        case OPT_INT: *(int*)field = (int)parse_int(flag, text, o->min, o->max); break;
        case OPT_LONG: *(long long*)field = parse_int(flag, text, o->min, o->max); break;
        case OPT_SEED: *(uint64_t*)field = (uint64_t)parse_int(flag, text, o->min, o->max); break;
        case OPT_DOUBLE: *(double*)field = parse_double(flag, text, (double)o->min); break;
        case OPT_FLAG: *(int*)field = 1; break;
        case OPT_ATTN:
            if (attention_backend_from_name(text, (AttentionBackend*)field) != 0) {
                fprintf(stderr, "error: --attn expects naive, flash1, flash2 or naive-recompute, got \"%s\"\n", text);
                exit(2);
            }
            break;
        case OPT_RECOMPUTE:
            if (gpt_recompute_from_name(text, (RecomputeMode*)field) != 0) {
                fprintf(stderr, "error: --recompute expects none, selective or full, got \"%s\"\n", text);
                exit(2);
            }
            break;
        case OPT_PRECISION:
            if (gpt_precision_from_name(text, (GPTPrecision*)field) != 0) {
                fprintf(stderr, "error: --precision expects bf16 or fp8, got \"%s\"\n", text);
                exit(2);
            }
            break;
        case OPT_FP8_RECIPE:
            if (fp8_recipe_from_name(text, (Fp8Recipe*)field) != 0) {
                fprintf(stderr, "error: --fp8-recipe expects delayed or current, got \"%s\"\n", text);
                exit(2);
            }
            break;
        case OPT_ZERO:
            if (strcmp(text, "0") != 0 && strcmp(text, "1") != 0) {
                fprintf(stderr, "error: --zero expects 0 (no sharding) or 1 (ZeRO-1: optimizer state and master "
                                "weights sharded over the GPUs), got \"%s\"\n", text);
                exit(2);
            }
            *(int*)field = text[0] - '0';
            break;
        default: break;
    }
}

static int resume_auto(const Options* opt) { return opt->resume && strcmp(opt->resume, "auto") == 0; }

// Tokens per sample: --sample-tokens, at most the model's positions for the default sample after the
// last step (--sample-every asks for the exact count: more than --seq-len is an error there).
static int sample_tokens(const Options* opt) {
    return opt->sample_tokens < opt->seq_len ? opt->sample_tokens : opt->seq_len;
}

// Exits (2) on generation flags that cannot work: --generate needs weights and does not train;
// --prompt-tokens and --num-samples need --generate; samples during training fit the positions.
// (--temperature, --top-k and --sample-tokens without a use are ignored, as their defaults are.)
static void check_generation_options(const Options* opt) {
    if (!isfinite(opt->temperature)) {
        fprintf(stderr, "error: --temperature must be a finite number >= 0 (0 = greedy)\n");
        exit(2);
    }
    if (opt->generate) {
        if ((!opt->resume && !opt->init_from) || resume_auto(opt)) {
            fprintf(stderr, "error: --generate needs the weights: --resume CKPT (a checkpoint file or directory) or "
                            "--init-from FILE (an llm.c model file)\n");
            exit(2);
        }
        if (opt->resume && opt->init_from) {
            fprintf(stderr, "error: --resume and --init-from both set the weights; give one of them\n");
            exit(2);
        }
        if (opt->sample_every) {
            fprintf(stderr, "error: --sample-every prints samples while training; --generate does not train\n");
            exit(2);
        }
        return;
    }
    if (opt->sample_every && opt->sample_tokens == 0) {
        fprintf(stderr, "error: --sample-every needs --sample-tokens of at least 1 (0 turns samples off)\n");
        exit(2);
    }
    if (opt->sample_every && opt->sample_tokens > opt->seq_len) {
        fprintf(stderr, "error: --sample-tokens %d is more than the model's %d positions (--seq-len); sample at most "
                        "%d tokens\n", opt->sample_tokens, opt->seq_len, opt->seq_len);
        exit(2);
    }
    if (opt->prompt_tokens || opt->num_samples != 1) {
        fprintf(stderr, "error: --%s is for --generate M (continue a prompt by M tokens)\n",
                opt->prompt_tokens ? "prompt-tokens" : "num-samples");
        exit(2);
    }
}

// Exits (2) on evaluation flags that cannot work: --eval-only needs the file and the weights; the
// other --eval flags need the file.
static void check_eval_options(const Options* opt) {
    if (opt->eval_only && !opt->eval_data) {
        fprintf(stderr, "error: --eval-only needs --eval-data FILE (scripts/prepare_hellaswag.py writes one)\n");
        exit(2);
    }
    if (opt->eval_only && ((!opt->resume && !opt->init_from) || resume_auto(opt))) {
        fprintf(stderr, "error: --eval-only needs the weights: --resume CKPT (a checkpoint file or directory) or "
                        "--init-from FILE (an llm.c model file)\n");
        exit(2);
    }
    if (opt->eval_only && opt->generate) {
        fprintf(stderr, "error: --eval-only and --generate are two different runs; give one of them\n");
        exit(2);
    }
    if (!opt->eval_data && (opt->eval_every || opt->eval_examples)) {
        fprintf(stderr, "error: --%s needs --eval-data FILE\n", opt->eval_every ? "eval-every" : "eval-examples");
        exit(2);
    }
    if (opt->eval_data && opt->generate) {
        fprintf(stderr, "error: --eval-data scores a model while training or with --eval-only; --generate does not "
                        "use it\n");
        exit(2);
    }
}

// Exits (2) on combinations of flags that cannot work together.
static void check_option_combinations(const Options* opt) {
    if (resume_auto(opt) && !opt->checkpoint_dir) {
        fprintf(stderr, "error: --resume auto needs --checkpoint-dir DIR, where it looks for the newest checkpoint\n");
        exit(2);
    }
    if (opt->resume && opt->init_from && !resume_auto(opt)) {
        fprintf(stderr, "error: --resume and --init-from both set the weights; give one of them\n");
        exit(2);
    }
    if (opt->checkpoint_every > 0 && !opt->checkpoint_dir && !opt->resume) {
        fprintf(stderr, "error: --checkpoint-every needs --checkpoint-dir DIR\n");
        exit(2);
    }
    check_eval_options(opt);
    if (!opt->eval_only) check_generation_options(opt);
    if (opt->context_parallel > 1 && (opt->generate || opt->eval_only)) {
        fprintf(stderr, "error: --context-parallel is for training; --%s runs on one GPU: leave it out\n",
                opt->generate ? "generate" : "eval-only");
        exit(2);
    }
}

static Options parse_options(int argc, char** argv) {
    Options opt;
    memset(&opt, 0, sizeof(opt));
    static struct option long_options[NUM_OPTIONS + 1];
    char short_options[2 * NUM_OPTIONS + 1] = "";
    int n = 0;
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptionSpec* o = &OPTIONS[i];
        if (!o->name) continue;
        if (o->value) set_option(&opt, o, o->value);
        struct option lo = {o->name, o->arg ? required_argument : no_argument, NULL, 1000 + i};
        long_options[n++] = lo;
        if (o->short_name) {
            const char letters[3] = {o->short_name, (char)(o->arg ? ':' : '\0'), '\0'};
            strcat(short_options, letters);
        }
    }
    int c;
    while ((c = getopt_long(argc, argv, short_options, long_options, NULL)) != -1) {
        int index = c - 1000;
        for (int i = 0; i < NUM_OPTIONS && c < 1000; i++)
            if (OPTIONS[i].name && OPTIONS[i].short_name == c) index = i;
        if (index < 0 || index >= NUM_OPTIONS) {
            fprintf(stderr, "run ./train_gpt --help for the options\n");
            exit(2);
        }
        if (OPTIONS[index].kind == OPT_HELP) {
            print_usage(stdout);
            exit(0);
        }
        if (OPTIONS[index].kind == OPT_VERSION) {
            printf("train_gpt %s\n", train_gpt_build);
            exit(0);
        }
        set_option(&opt, &OPTIONS[index], optarg);
        if (OPTIONS[index].field == FIELD(model) && OPTIONS[index].kind == OPT_STRING) opt.model_given = 1;
    }
    if (optind < argc) {
        fprintf(stderr, "error: unexpected argument \"%s\"; run ./train_gpt --help for the options\n", argv[optind]);
        exit(2);
    }
    if (opt.checkpoint_dir && strcmp(opt.checkpoint_dir, "none") == 0) {
        opt.checkpoint_dir = NULL;
        opt.no_checkpoints = 1;
    }
    check_option_combinations(&opt);
    return opt;
}

// ---------------------------------------------------------------------------------------------
// Plan: everything the run needs, checked and worked out before any GPU work, then printed.

// The data as the plan saw it: its size and the first batch, read to check the first shard.
typedef struct {
    int num_shards;
    long long total_tokens;
    int first_inputs[4], first_targets[4];
} DataSummary;

typedef struct {
    const Options* opt;
    LaunchInfo launch;               // which process of how many (layers/multi_gpu/launcher.h)
    int rank, world;
    int cp;                          // --context-parallel N: ranks sharing every sequence (1: none)
    int dp_rank, dp_world;           // this rank's data-parallel group d and their number D = world / N
    GPTConfig config;
    char model_name[64];               // the named shape the config is, else "layersL-hiddenC-headsH"
    DataSummary train, val;            // what the plan found in the data (the trainer opens its own loaders)
    int have_val;
    long long tokens_per_micro_step;  // B·T, per GPU
    long long accumulation_steps, total_batch_tokens, steps, micro_batches_per_epoch;
    size_t num_params, padded_params;  // padded: split evenly over the GPUs (layers/optimizer/optimizer.cuh)
    size_t state_offset, state_elems;  // the optimizer state's part of the flat parameters (ZeRO-1: a shard)
    CheckpointHeader header;           // this run's description; step and data position are set when saving
    char resume_path[CHECKPOINT_PATH_MAX];  // "" = a fresh run
    int resume_auto_fresh;                  // --resume auto found no checkpoint
    char resume_dir[CHECKPOINT_PATH_MAX];
    const char* checkpoint_dir;        // NULL: no checkpoints
    char default_checkpoint_dir[CHECKPOINT_PATH_MAX];  // runs/<model>[-N], when no directory was given
    const char* rendezvous_file;       // --rendezvous file:PATH's PATH; NULL: TCP
    long long start_step;              // the first step this run takes: 1, or the checkpoint's step + 1
    DataLoaderState start_data;        // the data position of start_step
    double flops_per_step, state_bytes, peak_tflops;
    double act_bytes[NUM_RECOMPUTE_MODES];  // activations per GPU of each --recompute mode (plan estimate)
    double act_bytes_other[NUM_RECOMPUTE_MODES];  // the same in the other --precision (printed for fp8)
    double recompute_flops_per_step;       // per GPU: what recomputation adds (hardware FLOPs, not model FLOPs)
    double executed_flops_per_step;        // per GPU: what the kernels execute, recomputation included ("hw")
    const char* recompute_what;            // the GEMM and attention work it repeats, for the plan
    double fp8_values_per_step;            // per GPU: values the FP8 casts write per step (--precision fp8)
    int device;
    GpuInfo gpu;
    EvalFile eval;           // --eval-data, checked (num_examples 0: none)
    int eval_truncated;      // its examples whose context keeps only its end at T positions
} Plan;

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// --context-parallel N: the world as D = world / N data-parallel groups of N ranks, rank r = d·N + c
// (layers/context_parallel/context_parallel.cuh); N = 1: D = world. Exits (2) on what cannot work, or
// does not work with it yet, saying what to do instead.
static void plan_context_parallel(Plan* p, const Options* opt) {
    const int N = opt->context_parallel;
    p->cp = N, p->dp_world = p->world / N, p->dp_rank = p->rank / N;
    if (N == 1) return;
    const char* instead = NULL;
    char why[512];
    if (p->world % N != 0) {
        fprintf(stderr, "error: --context-parallel %d splits every sequence over %d GPUs, so the number of GPUs "
                        "must be a multiple of %d; the launcher (%s) started %d process(es): launch %d (or another "
                        "multiple of %d), or give --context-parallel a divisor of %d\n", N, N, N, p->launch.source,
                p->world, N * (p->world / N + 1), N, p->world);
        exit(2);
    }
    if (zigzag_check(opt->seq_len, N, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: --seq-len %d with --context-parallel %d: %s\n", opt->seq_len, N, why);
        exit(2);
    }
    if (opt->attn != ATTN_FLASH2)
        instead = "--context-parallel runs flash2 on every block of its ring: use --attn flash2 (the default)";
    else if (opt->precision == PRECISION_FP8)
        instead = "--context-parallel with --precision fp8 is not supported yet: use --precision bf16";
    else if (opt->eval_data)
        instead = "--eval-data with --context-parallel is not supported yet: train without it, then score the "
                  "checkpoint on one GPU with --eval-only --resume DIR --eval-data FILE";
    if (instead) {
        fprintf(stderr, "error: %s\n", instead);
        exit(2);
    }
}

// Which process of how many (mpirun, srun, torchrun-style variables; none: the only one). Ranks
// other than 0 print only errors.
static void plan_launch(Plan* p, Options* opt) {
    char err[512];
    if (launcher_detect(&p->launch, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: launcher environment: %s\n", err);
        exit(2);
    }
    p->rank = p->launch.rank, p->world = p->launch.world;
    if (launcher_parse_method(opt->rendezvous, &p->rendezvous_file, err, sizeof(err)) < 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(2);
    }
    if (p->rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "error: rank %d cannot silence its output: %s\n", p->rank, strerror(errno));
        exit(1);
    }
    if (p->world == 1 && opt->zero) {
        printf("note         --zero 1 on one GPU has nothing to shard: running without it\n");
        opt->zero = 0;
    }
    if (opt->zero && opt->dump_grads) {
        fprintf(stderr, "error: --dump-grads needs the whole gradient on one GPU; run it without --zero 1\n");
        exit(2);
    }
    plan_context_parallel(p, opt);
    if (p->world > 1 && !MULTI_GPU_AVAILABLE) {
        fprintf(stderr, "error: the launcher (%s) started %d processes, but this train_gpt was built without NCCL "
                        "and trains on one GPU only; install NCCL and rebuild (make train_gpt says whether it "
                        "finds NCCL), or run one process\n", p->launch.source, p->world);
        exit(2);
    }
}

// The shape in --init-from's model file, so a run from a file needs no --model/--layers/--hidden/--heads.
static void shape_from_model_file(const Options* opt, GPTConfig* config) {
    const GPTConfig file = train_state_model_file_config(opt->init_from);
    config->num_layers = file.num_layers, config->channels = file.channels;
    config->num_heads = file.num_heads, config->num_kv_heads = file.num_kv_heads;
}

static GPTConfig plan_config(const Options* opt) {
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
    config.num_kv_heads = opt->kv_heads ? opt->kv_heads : config.num_heads;
    // a shape given on the command line must match the file instead (train_state_open_model_file checks)
    const int shape_given = opt->model_given || opt->layers || opt->hidden || opt->heads || opt->kv_heads;
    if (opt->init_from && !opt->resume && !shape_given) shape_from_model_file(opt, &config);
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

// The model's name in the plan and in runs/: the named shape it is, else its layers, hidden size and heads.
static void plan_model_name(Plan* p) {
    const GPTConfig* c = &p->config;
    for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++) {
        const NamedGPTShape* s = &NAMED_GPT_SHAPES[i];
        if (s->num_layers == c->num_layers && s->channels == c->channels && s->num_heads == c->num_heads) {
            snprintf(p->model_name, sizeof(p->model_name), "%s", s->name);
            return;
        }
    }
    snprintf(p->model_name, sizeof(p->model_name), "layers%d-hidden%d-heads%d", c->num_layers, c->channels,
             c->num_heads);
}

// Micro steps per optimizer step: the total batch over B·T·GPUs, which must divide it.
static void plan_batch(Plan* p) {
    const Options* opt = p->opt;
    const int B = opt->batch_size, T = opt->seq_len;
    p->tokens_per_micro_step = (long long)B * T / p->cp;  // per GPU: its share of B sequences
    const long long global_micro = p->tokens_per_micro_step * p->world;  // B·T·D: N GPUs share each B·T
    p->total_batch_tokens = opt->total_batch_tokens ? opt->total_batch_tokens : global_micro;
    if (p->total_batch_tokens % global_micro != 0) {
        if (p->cp > 1)
            fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len * context "
                            "groups (GPUs / --context-parallel) = %d * %d * %d = %lld\n", p->total_batch_tokens, B,
                    T, p->dp_world, global_micro);
        else if (p->world == 1)
            fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len = %lld\n",
                    p->total_batch_tokens, p->tokens_per_micro_step);
        else
            fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len * GPUs = "
                            "%d * %d * %d = %lld\n", p->total_batch_tokens, B, T, p->world, global_micro);
        exit(2);
    }
    p->accumulation_steps = p->total_batch_tokens / global_micro;
    char why[512];
    if (opt->precision == PRECISION_FP8 &&
        gpt_fp8_check(B * T, p->config.channels, (int)gpt_qkv_features(&p->config), why, sizeof(why)) != 0) {
        fprintf(stderr, "error: --precision fp8 cannot run this shape: %s\n", why);
        exit(2);
    }
}

// Whether `path` is a file whose first KiB is printable text (a corpus given where token shards belong).
static int looks_like_text(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char head[1024];
    const size_t n = fread(head, 1, sizeof(head), f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (head[i] < 0x20 && head[i] != '\n' && head[i] != '\r' && head[i] != '\t') return 0;
    return n > 0;
}

// Opens a loader over `pattern` or exits with the loader's message (which names the file) and a hint.
// Each of the D data-parallel groups (D = world without --context-parallel) reads its own B·T slice of
// every chunk of B·T·D tokens; the N ranks of a group read the same one and keep their share of it.
static void open_data_or_exit(DataLoader* loader, const char* what, const char* pattern, const Plan* p) {
    const Options* opt = p->opt;
    if (dataloader_open(loader, pattern, opt->batch_size, opt->seq_len, p->dp_rank, p->dp_world, GPT2_VOCAB_SIZE,
                        opt->shuffle, opt->seed) == 0)
        return;
    fprintf(stderr, "error: %s data: %s\n", what, loader->error);
    if (strstr(pattern, "data/tinyshakespeare/") == pattern)
        fprintf(stderr, "hint: `make train` prepares the default dataset (scripts/prepare_data.py)\n");
    else if (looks_like_text(pattern))
        fprintf(stderr, "hint: %s is text; train_gpt reads token shards: tokenize it first with\n"
                        "  python scripts/prepare_data.py --input %s --name NAME\n"
                        "then train with --train-data 'data/NAME/NAME_train_*.bin' "
                        "--val-data 'data/NAME/NAME_val_*.bin'\n", pattern, pattern);
    exit(1);
}

static void next_batch_or_exit(DataLoader* loader, const char* what) {
    if (dataloader_next_batch(loader) != 0) {
        fprintf(stderr, "error: %s data: %s\n", what, loader->error);
        exit(1);
    }
}

// Opens `pattern` (exits on bad data), notes its size and, when `first_batch`, reads the first batch so
// a bad token range in the first shard is reported before any GPU work; closes it again.
static void summarize_data(DataSummary* s, const char* what, const char* pattern, int first_batch, const Plan* p,
                           long long* batches_per_epoch) {
    static DataLoader loader;
    open_data_or_exit(&loader, what, pattern, p);
    s->num_shards = loader.num_shards, s->total_tokens = (long long)loader.total_tokens;
    if (batches_per_epoch) *batches_per_epoch = dataloader_batches_per_epoch(&loader);
    if (first_batch) {
        next_batch_or_exit(&loader, what);
        for (int i = 0; i < 4; i++) s->first_inputs[i] = loader.inputs[i], s->first_targets[i] = loader.targets[i];
    }
    dataloader_close(&loader);
}

// Opens and checks a multiple-choice eval file for rows of T positions; exits (1: unreadable or
// corrupt, 2: a completion longer than T) with what to do. Returns how many examples keep only the
// end of their context.
static int open_eval_or_exit(EvalFile* ef, const char* path, int T) {
    if (eval_file_open(ef, path, GPT2_VOCAB_SIZE) != 0) {
        fprintf(stderr, "error: eval data: %s\nhint: scripts/prepare_hellaswag.py writes eval files (data/README.md "
                        "has the format)\n", ef->error);
        exit(1);
    }
    const int truncated = eval_check_fits(ef, T);
    if (truncated < 0) {
        fprintf(stderr, "error: eval data %s: a completion of %d tokens does not fit %d positions; raise --seq-len\n",
                path, ef->longest_completion, T);
        exit(2);
    }
    return truncated;
}

// Checks the data and sets the number of steps (default: one pass over the training data).
static void plan_data(Plan* p) {
    const Options* opt = p->opt;
    summarize_data(&p->train, "training", opt->train_data, 1, p, &p->micro_batches_per_epoch);
    p->have_val = opt->val_data[0] != '\0';
    if (p->have_val) summarize_data(&p->val, "validation", opt->val_data, 0, p, NULL);
    if (opt->eval_data) p->eval_truncated = open_eval_or_exit(&p->eval, opt->eval_data, opt->seq_len);
    p->steps = opt->max_steps ? opt->max_steps
                              : (p->micro_batches_per_epoch + p->accumulation_steps - 1) / p->accumulation_steps;
}

// What the model is built for: the micro batch, the backend, recomputation, determinism. GEMM
// algorithms timed at start-up may differ between processes: not where reruns must give the same
// bits (--deterministic, and the backends whose own kernels are deterministic).
static GPTModelOptions model_options(const Plan* p, RecomputeMode recompute, cudaStream_t stream) {
    const Options* opt = p->opt;
    // --context-parallel N: the model runs each GPU's T/N rows of every sequence
    GPTModelOptions o = gpt_model_options(opt->batch_size, opt->seq_len / p->cp, opt->attn, stream);
    o.recompute = recompute;
    o.deterministic_attention = opt->deterministic;
    o.tune_gemms = !opt->deterministic && opt->attn == ATTN_FLASH2;
    o.pad_multiple = optimizer_pad_multiple(p->world);
    o.precision = opt->precision;
    o.fp8_recipe = opt->fp8_recipe;
    return o;
}

// Values the FP8 casts write per optimizer step and GPU, the denominator of the saturated fraction:
// per micro step and layer the inputs of the four linear layers (7·N·C; again under --recompute
// full) and their output gradients (N·(QKV + 6C)); per step the weights (C·(QKV + 9C) per layer).
static double fp8_values_per_step(const Plan* p) {
    const GPTConfig* c = &p->config;
    const double N = (double)p->tokens_per_micro_step, C = c->channels, L = c->num_layers;
    const double QKV = (double)gpt_qkv_features(c), inputs = 7.0 * N * C;
    const double micro = L * (inputs * (p->opt->recompute == RECOMPUTE_FULL ? 2.0 : 1.0) + N * (QKV + 6.0 * C));
    return micro * (double)p->accumulation_steps + L * C * (QKV + 9.0 * C);
}

// The activation memory of each --recompute mode (from the config alone, before any CUDA call: an
// estimate within a few MiB of scratch) and the FLOPs the chosen mode adds per optimizer step and GPU.
static void plan_activations(Plan* p) {
    const Options* opt = p->opt;
    for (int r = 0; r < NUM_RECOMPUTE_MODES; r++) {
        GPTModelOptions o = model_options(p, (RecomputeMode)r, 0);
        p->act_bytes[r] = (double)gpt_activation_bytes(&p->config, &o, 0);
        o.precision = opt->precision == PRECISION_FP8 ? PRECISION_BF16 : PRECISION_FP8;
        p->act_bytes_other[r] = (double)gpt_activation_bytes(&p->config, &o, 0);
    }
    // The work of whole sequences, shared by the N GPUs of a context group (N = 1: this GPU's model):
    // its GEMMs run T/N rows each, and its ring 1/N of each sequence's attention (the zigzag balances it)
    static GPTMemoryPlan memory;
    GPTModelOptions o = model_options(p, opt->recompute, 0);
    o.T = opt->seq_len;
    gpt_memory_plan(&memory, &p->config, &o, 0);
    const double share = (double)p->accumulation_steps / p->cp;
    p->recompute_flops_per_step = gpt_recompute_flops(&p->config, &o, &memory) * share;
    p->executed_flops_per_step = gpt_executed_flops(&p->config, &o, &memory) * share;
    p->fp8_values_per_step = opt->precision == PRECISION_FP8 ? fp8_values_per_step(p) : 0.0;
    p->recompute_what = opt->recompute == RECOMPUTE_FULL ? "each block's forward again in its backward, "
                        : opt->recompute == RECOMPUTE_SELECTIVE && memory.att_saved_bytes > 0
                            ? "the attention forward (its T^2 part) again in the backward, "
                            : "";
}

// The checkpoint header fields that describe this run, and the optimizer state's range.
static void plan_state(Plan* p) {
    const Options* opt = p->opt;
    const GPTConfig* c = &p->config;
    CheckpointHeader* h = &p->header;
    memset(h, 0, sizeof(*h));
    h->num_layers = c->num_layers, h->channels = c->channels, h->num_heads = c->num_heads;
    h->num_kv_heads = c->num_kv_heads;
    h->vocab_size = c->vocab_size, h->padded_vocab_size = c->padded_vocab_size, h->max_seq_len = c->max_seq_len;
    // the data position depends on the data-parallel ranks, world / N: an unsharded checkpoint of N
    // context-parallel GPUs resumes with N = 1 on world / N GPUs (ZeRO-1's shards need the same world)
    h->batch_size = opt->batch_size, h->seq_len = opt->seq_len, h->world_size = p->world, h->shuffle = opt->shuffle;
    h->context_parallel = p->cp;
    h->total_batch_tokens = p->total_batch_tokens;
    h->seed = opt->seed;
    h->train_tokens = p->train.total_tokens, h->train_shards = p->train.num_shards;
    h->attention_backend = (int32_t)opt->attn;
    h->fp8_state_bytes = opt->precision == PRECISION_FP8 ? (int32_t)gpt_fp8_state_bytes(c->num_layers) : 0;
    h->max_steps = p->steps, h->warmup_steps = opt->warmup_steps;
    h->lr = opt->lr, h->min_lr_fraction = opt->min_lr_fraction;
    h->weight_decay = opt->weight_decay, h->grad_clip = opt->grad_clip;
    p->num_params = gpt_num_params(c);
    h->num_params = (int64_t)p->num_params;
    optimizer_range(p->num_params, p->world, p->rank, opt->zero, &p->padded_params, &p->state_offset,
                    &p->state_elems);
    if (opt->zero) {
        h->zero_stage = 1, h->rank = p->rank;
        h->shard_offset = (int64_t)p->state_offset, h->shard_size = (int64_t)p->state_elems;
    }
    // Per GPU: bf16 weights and gradients, fp32 master weights and two AdamW moments (ZeRO-1: the shard's).
    p->state_bytes = p->world == 1 ? (double)p->num_params * (2 + 2 + 4 + 4 + 4)
                                   : (double)p->padded_params * (2 + 2) + (double)p->state_elems * (4 + 4 + 4);
    if (opt->precision == PRECISION_FP8)  // the FP8 weights, both layouts, and their scales
        p->state_bytes += (double)gpt_fp8_weight_bytes(c->num_layers, c->channels, (int)gpt_qkv_features(c)) +
                          (double)gpt_fp8_state_bytes(c->num_layers);
    p->flops_per_step = gpt_flops_per_sequence(c, opt->seq_len) * (double)(p->total_batch_tokens / opt->seq_len);
    plan_activations(p);
}

// --resume auto: the newest complete checkpoint in --checkpoint-dir, into `found`; 0 when there is none.
static int find_auto_resume(const Plan* p, char* found) {
    char err[CHECKPOINT_PATH_MAX + 256];
    int64_t step = 0;
    const int r = checkpoint_find_latest(p->opt->checkpoint_dir, found, CHECKPOINT_PATH_MAX, &step, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "error: --resume auto: %s\n", err);
        exit(2);
    }
    return r;
}

// --resume: the checkpoint (this rank's file of a ZeRO-1 step), checked against this run; the
// first step and its data position.
static void plan_resume(Plan* p) {
    const Options* opt = p->opt;
    p->start_step = 1;
    if (!opt->resume) return;
    char newest[CHECKPOINT_PATH_MAX], found[CHECKPOINT_PATH_MAX];
    if (resume_auto(opt) && !find_auto_resume(p, newest)) {
        p->resume_auto_fresh = 1;
        return;
    }
    train_state_find(resume_auto(opt) ? newest : opt->resume, found, p->resume_dir);
    checkpoint_rank_file(p->resume_path, sizeof(p->resume_path), found, p->rank);
    CheckpointHeader saved = train_state_read_header(p->resume_path);
    train_state_check_sharding(&saved, p->resume_path, p->world, opt->zero, p->rank, p->state_elems);
    train_state_check_compatible(&saved, &p->header, p->resume_path);
    if (saved.step >= p->steps && resume_auto(opt)) {  // a relaunch of a finished run: nothing left to do
        printf("resume       auto: %s is at step %lld, the last step of this run: nothing to do\n", p->resume_path,
               (long long)saved.step);
        exit(0);
    }
    if (saved.step >= p->steps) {
        fprintf(stderr, "error: %s is at step %lld and this run ends at step %lld: nothing to do; raise "
                        "--max-steps to train further\n", p->resume_path, (long long)saved.step, p->steps);
        exit(2);
    }
    p->start_step = saved.step + 1;
    p->start_data.epoch = saved.data_epoch;
    p->start_data.shard_index = saved.data_shard_index;
    p->start_data.chunk_index = saved.data_chunk_index;
    static DataLoader train;  // the saved data position must exist in this data
    open_data_or_exit(&train, "training", opt->train_data, p);
    if (dataloader_set_state(&train, p->start_data) != 0) {
        fprintf(stderr, "error: cannot resume from %s: %s\n", p->resume_path, train.error);
        exit(2);
    }
    dataloader_close(&train);
}

// A fresh run's own checkpoint directory, when none was given: runs/<model>, or the first of
// runs/<model>-2, -3, ... that holds no checkpoint, so a second run never mixes with the first. Every
// rank finds the same one (nothing is written before all ranks have joined).
static void choose_default_checkpoint_dir(Plan* p) {
    char err[CHECKPOINT_PATH_MAX + 256], latest[CHECKPOINT_PATH_MAX + 64];
    for (int n = 1; n < 10000; n++) {
        char* dir = p->default_checkpoint_dir;
        if (n == 1) snprintf(dir, CHECKPOINT_PATH_MAX, "runs/%s", p->model_name);
        else snprintf(dir, CHECKPOINT_PATH_MAX, "runs/%s-%d", p->model_name, n);
        int64_t step = 0;
        const int found = checkpoint_find_latest(dir, latest, sizeof(latest), &step, err, sizeof(err));
        if (found < 0) {
            fprintf(stderr, "error: the default checkpoint directory: %s; give --checkpoint-dir DIR (or none)\n", err);
            exit(2);
        }
        if (found == 0) {  // empty or not there yet (made before the first save)
            p->checkpoint_dir = dir;
            return;
        }
    }
    fprintf(stderr, "error: runs/%s-2 ... -9999 all hold checkpoints; give --checkpoint-dir DIR (or none)\n",
            p->model_name);
    exit(2);
}

// Where checkpoints go (--checkpoint-dir, the resumed checkpoint's directory, else a fresh run's own
// under runs/), and the --init-from file checked now, before any GPU work.
static void plan_files(Plan* p) {
    const Options* opt = p->opt;
    p->checkpoint_dir = opt->checkpoint_dir ? opt->checkpoint_dir : (p->resume_path[0] ? p->resume_dir : NULL);
    if (opt->no_checkpoints) p->checkpoint_dir = NULL;
    else if (!opt->checkpoint_dir && !opt->resume) choose_default_checkpoint_dir(p);
    if (opt->checkpoint_dir) train_state_refuse_foreign(opt->checkpoint_dir, p->resume_path[0] ? p->resume_dir : NULL);
    if (opt->init_from) {
        ModelFile file;
        train_state_open_model_file(&file, opt->init_from, &p->config);
        model_file_close(&file);
    }
    if (opt->sample_tokens > 0 && opt->tokenizer) {  // the samples' token table, checked now (loaded later)
        Tokenizer table;
        generate_open_tokenizer(&table, opt->tokenizer, opt->train_data);
        tokenizer_free(&table);
    }
}

static void make_plan(Plan* p, Options* opt) {
    memset(p, 0, sizeof(*p));
    p->opt = opt;
    plan_launch(p, opt);
    p->config = plan_config(opt);
    plan_model_name(p);
    plan_batch(p);
    plan_data(p);
    plan_state(p);
    plan_resume(p);
    plan_files(p);
}

// How many examples of how many are scored, and how many keep only the end of their context.
static void describe_eval(const EvalFile* ef, long long limit, int truncated, int T, char* out, size_t len) {
    const long long n = limit > 0 && limit < ef->num_examples ? limit : ef->num_examples;
    char cut[128] = "";
    if (truncated) snprintf(cut, sizeof(cut), "; %d keep only the end of their context at %d positions", truncated, T);
    snprintf(out, len, "%s: %lld of %d examples (lowest mean loss over the completion's tokens = the answer)%s",
             ef->path, n, ef->num_examples, cut);
}

static void print_plan_eval(const Plan* p) {
    char what[1024], when[96] = "after the last step";
    describe_eval(&p->eval, p->opt->eval_examples, p->eval_truncated, p->opt->seq_len, what, sizeof(what));
    if (p->opt->eval_every > 0)
        snprintf(when, sizeof(when), "%severy %lld steps and after the last", p->start_step == 1 ? "before the first, " : "",
                 p->opt->eval_every);
    printf("eval data    %s; %s%s\n", what, when, p->world > 1 ? ", each GPU scoring its share" : "");
}

// The lines about the model, the batch and the data.
static void print_plan_model(const Plan* p) {
    const Options* opt = p->opt;
    const GPTConfig* c = &p->config;
    const int B = opt->batch_size, T = opt->seq_len;
    char kv[64] = "";  // multi-head models print as before
    if (c->num_kv_heads != c->num_heads) snprintf(kv, sizeof(kv), " (%d key/value heads)", c->num_kv_heads);
    printf("model        %s: %d layers, hidden %d, %d heads of %d%s, vocab %d padded to %d, seq %d\n", p->model_name,
           c->num_layers, c->channels, c->num_heads, c->channels / c->num_heads, kv, c->vocab_size,
           c->padded_vocab_size, T);
    printf("parameters   %zu (%.3f B)\n", p->num_params, p->num_params / 1e9);
    printf("attention    %s%s\n", attention_backend_name(opt->attn), opt->deterministic ? ", deterministic" : "");
    if (p->cp > 1)
        printf("batch        %d x %d = %lld tokens per micro step per context group of %d GPUs (%d tokens of each "
               "sequence per GPU) x %d group(s), %lld micro steps per optimizer step = %lld tokens\n", B, T,
               (long long)B * T, p->cp, T / p->cp, p->dp_world, p->accumulation_steps, p->total_batch_tokens);
    else if (p->world == 1)
        printf("batch        %d x %d = %lld tokens per micro step, %lld micro steps per optimizer step = %lld tokens\n",
               B, T, p->tokens_per_micro_step, p->accumulation_steps, p->total_batch_tokens);
    else
        printf("batch        %d x %d = %lld tokens per micro step per GPU x %d GPUs, %lld micro steps per optimizer "
               "step = %lld tokens\n", B, T, p->tokens_per_micro_step, p->world, p->accumulation_steps,
               p->total_batch_tokens);
    printf("train data   %s: %d shard(s), %lld tokens, %lld micro batches per epoch%s%s\n", opt->train_data,
           p->train.num_shards, p->train.total_tokens, p->micro_batches_per_epoch,
           p->cp > 1      ? " (of B*T*groups tokens, each context group reads its part)"
           : p->world > 1 ? " (of B*T*GPUs tokens, each GPU reads its part)"
                          : "",
           opt->shuffle ? ", shuffled" : "");
    if (p->cp > 1)
        printf("context      --context-parallel %d: every sequence over %d GPUs, %d chunks of %d tokens (GPU c of a "
               "group holds chunks c and %d-c); attention around their ring (flash2 per block), the rest on local "
               "tokens; gradients averaged over all %d GPUs\n", p->cp, p->cp, 2 * p->cp, T / (2 * p->cp),
               2 * p->cp - 1, p->world);
    if (p->have_val)
        printf("val data     %s: %d shard(s), %lld tokens\n", opt->val_data, p->val.num_shards, p->val.total_tokens);
    else
        printf("val data     none\n");
    if (p->eval.num_examples) print_plan_eval(p);
    const int* in = p->train.first_inputs;
    const int* tg = p->train.first_targets;
    printf("first batch  %d %d %d %d ... (targets %d %d %d %d ...)\n", in[0], in[1], in[2], in[3], tg[0], tg[1],
           tg[2], tg[3]);
}

// The lines about the schedule, where the weights come from, checkpoints, FLOPs and memory.
static void print_plan_run(const Plan* p) {
    const Options* opt = p->opt;
    printf("steps        %lld\n", p->steps);
    if (p->resume_path[0])
        printf("resume       %s: %lld steps done, continues at step %lld (data epoch %lld, shard %lld, chunk %lld)%s\n",
               p->resume_path, p->start_step - 1, p->start_step, (long long)p->start_data.epoch,
               (long long)p->start_data.shard_index, (long long)p->start_data.chunk_index,
               resume_auto(opt) ? " (--resume auto)" : "");
    if (p->resume_auto_fresh)
        printf("resume       auto: no checkpoint in %s yet: a fresh run\n", opt->checkpoint_dir);
    if (!p->resume_path[0])
        printf("init         %s\n",
               opt->init_from ? opt->init_from : "GPT-2 (normal 0.02, residual projections / sqrt(2L))");
    if (p->checkpoint_dir) {
        char every[64] = "";
        if (opt->checkpoint_every > 0) snprintf(every, sizeof(every), "every %lld steps and ", opt->checkpoint_every);
        char keep[64] = "keeping all";
        if (opt->keep_checkpoints > 0) snprintf(keep, sizeof(keep), "keeping the %d newest", opt->keep_checkpoints);
        printf("checkpoints  %safter the last step into %s, %s (%.2f GiB each%s)\n", every, p->checkpoint_dir, keep,
               gib((double)CHECKPOINT_HEADER_BYTES + (double)checkpoint_header_payload_bytes(&p->header)),
               opt->zero ? ", one file per GPU: step_XXXXXXXX.rankRRofWW.ckpt" : "");
    } else {
        printf("checkpoints  none (--checkpoint-dir DIR to save them)\n");
    }
    if (opt->sample_every > 0)
        printf("samples      every %lld steps and after the last: %d tokens from <|endoftext|>, temperature %g, top-k "
               "%d (0: all), seed %llu\n", opt->sample_every, opt->sample_tokens, opt->temperature, opt->top_k,
               (unsigned long long)opt->seed);
    else if (opt->sample_tokens > 0)
        printf("samples      after the last step: %d tokens from <|endoftext|>, temperature %g, top-k %d (0: all), "
               "seed %llu (--sample-every N: more; --sample-tokens 0: none)\n", sample_tokens(opt), opt->temperature,
               opt->top_k, (unsigned long long)opt->seed);
    printf("model FLOPs  %.3f TFLOP per optimizer step (6*s*P + 12*L*h*s^2 per sequence: the paper's count, for "
           "TFLOP/s and MFU)\n", p->flops_per_step / 1e12);
    const int flash = opt->attn == ATTN_FLASH1 || opt->attn == ATTN_FLASH2;
    printf("hw FLOPs     %.3f TFLOP per optimizer step per GPU: what the kernels execute (%s%s), for hw TFLOP/s\n",
           p->executed_flops_per_step / 1e12,
           flash ? "attention skips the masked half" : "naive attention multiplies all T x T scores",
           p->recompute_flops_per_step > 0 ? ", recomputation included" : "");
    printf("model state  %.2f GiB%s (bf16 weights + grads, fp32 master + AdamW moments%s%s); activations extra\n",
           gib(p->state_bytes), p->world > 1 ? " per GPU" : "",
           opt->zero ? ", the last three sharded over the GPUs" : "",
           opt->precision == PRECISION_FP8 ? ", FP8 weights in both layouts" : "");
    if (opt->precision == PRECISION_FP8)
        printf("precision    fp8: the blocks' linear layers on FP8 tensor cores (E4M3 weights and activations, E5M2 "
               "gradients), %s scaling; TFLOP/s and MFU keep the bf16 peak\n", FP8_RECIPE_NAMES[opt->fp8_recipe]);
    printf("activations  none %.2f GiB, selective %.2f GiB, full %.2f GiB (--recompute; a %d x %d micro batch%s); "
           "this run: %s\n", gib(p->act_bytes[RECOMPUTE_NONE]), gib(p->act_bytes[RECOMPUTE_SELECTIVE]),
           gib(p->act_bytes[RECOMPUTE_FULL]), opt->batch_size, opt->seq_len / p->cp, p->world > 1 ? ", per GPU" : "",
           RECOMPUTE_NAMES[opt->recompute]);
    if (opt->precision == PRECISION_FP8)  // what fp8's FP8 copies of the blocks' inputs save, or cost
        printf("             with --precision bf16: none %.2f GiB, selective %.2f GiB, full %.2f GiB\n",
               gib(p->act_bytes_other[RECOMPUTE_NONE]), gib(p->act_bytes_other[RECOMPUTE_SELECTIVE]),
               gib(p->act_bytes_other[RECOMPUTE_FULL]));
    if (p->recompute_flops_per_step > 0)
        printf("recompute    %.3f TFLOP per optimizer step per GPU (%s%s): hardware FLOPs, not model FLOPs; the "
               "log shows both\n", p->recompute_flops_per_step / 1e12, p->recompute_what,
               "the LM head's logits of all chunks but the last");
}

// Room left for what is allocated besides the model state and the activations (cuBLASLt workspace,
// token arrays, optimizer scratch, the CUDA libraries' own allocations).
#define MEMORY_MARGIN_BYTES (512.0 * 1024 * 1024)

// Exits (1) before any allocation when the model state, this mode's activations and the ring attention's
// buffers (--context-parallel) cannot fit the free memory, naming the --recompute mode that would (exact
// sizes: the GPU is set).
static void check_activations_fit(const Plan* p) {
    const Options* opt = p->opt;
    const double ring = (double)context_parallel_memory_bytes(&p->config, opt->batch_size, opt->seq_len, p->cp);
    const double free_bytes = (double)p->gpu.free_bytes - ring;
    double need[NUM_RECOMPUTE_MODES];
    for (int r = 0; r < NUM_RECOMPUTE_MODES; r++) {
        const GPTModelOptions o = model_options(p, (RecomputeMode)r, 0);
        need[r] = (double)gpt_activation_bytes(&p->config, &o, 1);
    }
    if (p->state_bytes + need[opt->recompute] + MEMORY_MARGIN_BYTES <= free_bytes) return;
    fprintf(stderr, "error: out of GPU memory: the activations of a %d x %d micro batch need %.2f GiB with --recompute "
                    "%s, and the model state %.2f GiB; %.2f GiB are free%s\n", opt->batch_size, opt->seq_len / p->cp,
            gib(need[opt->recompute]), RECOMPUTE_NAMES[opt->recompute], gib(p->state_bytes), gib(free_bytes),
            ring > 0 ? " besides the ring attention's buffers" : "");
    int fits = -1;
    for (int r = opt->recompute + 1; r < NUM_RECOMPUTE_MODES && fits < 0; r++)
        if (p->state_bytes + need[r] + MEMORY_MARGIN_BYTES <= free_bytes) fits = r;
    if (fits >= 0)
        fprintf(stderr, "hint: --recompute %s would fit (its activations need %.2f GiB); or lower --batch-size "
                        "(--total-batch-tokens keeps the tokens per step through accumulation) or --seq-len\n",
                RECOMPUTE_NAMES[fits], gib(need[fits]));
    else
        fprintf(stderr, "hint: no --recompute mode fits (full needs %.2f GiB); lower --batch-size "
                        "(--total-batch-tokens keeps the tokens per step through accumulation) or --seq-len, or use "
                        "a smaller model\n", gib(need[RECOMPUTE_FULL]));
    exit(1);
}

// Each process uses GPU LOCAL_RANK (else its rank) of those it sees, set before any other CUDA work;
// prints what it found and the MFU peak; exits when the model state cannot fit.
static void plan_gpu(Plan* p) {
    const Options* opt = p->opt;
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess) {
        cudaGetLastError();
        device_count = 0;
    }
    if (device_count > 0) p->device = (p->launch.local_rank >= 0 ? p->launch.local_rank : p->rank) % device_count;
    p->gpu = gpu_info(p->device);
    printf("build        %s\n", train_gpt_build);
    printf("gpus         %d (launcher: %s), zero %d", p->world, p->launch.source, opt->zero);
    if (p->cp > 1) printf(", context parallel %d (%d data-parallel group(s))", p->cp, p->dp_world);
    if (p->world > 1)
        if (p->rendezvous_file)
            printf(", rank 0 on GPU %d; rendezvous file %s, timeout %g s; NCCL watchdog %g s; TFLOP/s and MFU are per "
                   "GPU", p->device, p->rendezvous_file, opt->rendezvous_timeout, opt->nccl_timeout);
        else
            printf(", rank 0 on GPU %d; rendezvous %s:%d, timeout %g s; NCCL watchdog %g s; TFLOP/s and MFU are per "
                   "GPU", p->device, p->launch.master_addr, p->launch.master_port, opt->rendezvous_timeout,
                   opt->nccl_timeout);
    printf("\n");
    if (!p->gpu.found) {
        printf("gpu          none found\n");
        return;
    }
    const GpuInfo* g = &p->gpu;
    p->peak_tflops = opt->peak_tflops > 0 ? opt->peak_tflops : gpu_peak_bf16_tflops(g->name);
    printf("gpu          %s, sm_%d%d, %d SMs, %.1f GiB free of %.1f GiB\n", g->name, g->major, g->minor, g->num_sms,
           gib((double)g->free_bytes), gib((double)g->total_bytes));
    if (p->peak_tflops > 0)
        printf("mfu peak     %.1f TFLOP/s dense bf16 (%s)\n", p->peak_tflops,
               opt->peak_tflops > 0 ? "from --peak-tflops" : "by GPU name");
    else
        printf("mfu peak     unknown for this GPU: pass --peak-tflops to report MFU\n");
    if (p->state_bytes > (double)g->free_bytes) {
        fprintf(stderr, "error: the model state needs %.2f GiB but the GPU has %.2f GiB free; use a smaller model "
                        "(--model, --layers, --hidden) or more GPUs with optimizer sharding (--zero 1)\n",
                gib(p->state_bytes), gib((double)g->free_bytes));
        exit(1);
    }
    if (!opt->plan_only) check_activations_fit(p);
}

// ---------------------------------------------------------------------------------------------
// Training

// What a run holds on the GPU, and its log.
typedef struct {
    GPTModel model;
    Optimizer optimizer;
    DataLoader train, val;   // val: when the plan has validation data
    MultiGpu* mg;            // NULL on one GPU
    ContextParallel cp;      // --context-parallel N > 1: the group, its ring, this GPU's share (cp.size 0: none)
    cudaStream_t stream;     // the model's; everything runs on it
    cudaEvent_t start, stop; // around each step
    int *inputs, *targets;   // device (B, T) int32: the current micro batch
    BatchUpload upload;      // the host's micro batches into inputs, targets, without a host wait
    float* step_loss;        // device: the step's mean loss, summed over its micro steps
    void* staging;           // pinned host memory for checkpoints (NULL: none needed)
    FILE* log;               // --log-file (rank 0)
    char last_checkpoint[CHECKPOINT_PATH_MAX + 64];
    long long last_checkpoint_step;
    int stop_any;              // several GPUs: some rank got a stop signal (this step's all-reduce says)
    // for the ETA and the summary: this launch's steps
    double started;            // wall clock (s) when the first step began
    long long steps_done;
    double step_seconds;       // the steps' own time (their events), for the mean TFLOP/s
    double comm_exposed_ms;    // several GPUs: the steps' time waiting on communication, summed
    double ring_exposed_ms;    // --context-parallel: the steps' time waiting on the ring's transfers, summed
    double best_val;           // the lowest validation loss, at best_val_step (0: none yet)
    long long best_val_step;
    long long profile_step;    // TRAIN_GPT_PROFILE_STEP: cudaProfilerStart/Stop around this step (0: none)
    TrainingSampler* sampler;  // rank 0 unless --sample-tokens 0, else NULL
    Tokenizer tokenizer;       // for the samples' text (vocab_size 0: none, ids are printed)
    unsigned long long fp8_saturated;  // --precision fp8: saturated values counted up to the last step line
    double eval_acc_norm, eval_acc, best_eval;  // the last evaluation's accuracies; the best acc_norm,
    long long eval_step, best_eval_step;        // at best_eval_step (-1: none yet)
} Trainer;

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// "45s", "12m05s", "3h07m".
static const char* format_duration(double seconds, char* buf, size_t len) {
    const long long s = (long long)(seconds + 0.5);
    if (s < 60) snprintf(buf, len, "%llds", s);
    else if (s < 3600) snprintf(buf, len, "%lldm%02llds", s / 60, s % 60);
    else snprintf(buf, len, "%lldh%02lldm", s / 3600, s / 60 % 60);
    return buf;
}

// Linear warmup to opt->lr, then cosine decay to lr · min_lr_fraction at the last step. step from 1.
static double learning_rate(const Options* opt, long long step, long long steps) {
    if (step <= opt->warmup_steps) return opt->lr * (double)step / (double)opt->warmup_steps;
    if (steps <= opt->warmup_steps) return opt->lr;
    const double progress = (double)(step - opt->warmup_steps) / (double)(steps - opt->warmup_steps);
    const double min_lr = opt->lr * opt->min_lr_fraction;
    return min_lr + 0.5 * (opt->lr - min_lr) * (1.0 + cos(3.141592653589793 * progress));
}

// Sends the loader's current batch (inputs, targets (B, T) int32; --context-parallel: this GPU's share,
// (B, T/N)) to the GPU in the model stream's order (after the previous micro step's backward, which
// reads the tokens again); no host wait.
static void upload_batch(Trainer* t, const DataLoader* loader) {
    if (t->cp.size > 1) {
        context_parallel_share(&t->cp, loader->inputs, loader->targets);
        batch_upload_send(&t->upload, t->cp.inputs, t->cp.targets, t->inputs, t->targets, t->stream);
        return;
    }
    batch_upload_send(&t->upload, loader->inputs, loader->targets, t->inputs, t->targets, t->stream);
}

// The weights to start from: the checkpoint, the --init-from file, or the GPT-2 initialization;
// then the data position of the first step.
static void load_weights(Plan* p, Trainer* t) {
    const Options* opt = p->opt;
    if (p->resume_path[0]) {
        train_state_load(p->resume_path, &t->model, &t->optimizer, t->staging);
        printf("resumed      from %s: %lld steps done\n", p->resume_path, p->start_step - 1);
        snprintf(t->last_checkpoint, sizeof(t->last_checkpoint), "%s", p->resume_path);
        t->last_checkpoint_step = p->start_step - 1;
    } else if (opt->init_from) {
        train_state_load_model_file(opt->init_from, &t->model, &t->optimizer);
        printf("weights      from %s\n", opt->init_from);
    } else {
        optimizer_init_gpt2(&t->optimizer, &t->model, opt->seed);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    if (dataloader_set_state(&t->train, p->start_data) != 0) {
        fprintf(stderr, "error: training data: %s\n", t->train.error);
        exit(1);
    }
}

static void trainer_create(Trainer* t, Plan* p, MultiGpu* mg) {
    const Options* opt = p->opt;
    memset(t, 0, sizeof(*t));
    t->last_checkpoint_step = -1;
    t->eval_step = t->best_eval_step = -1;
    const char* profile_step = getenv("TRAIN_GPT_PROFILE_STEP");  // for a profiler started with profiling off
    t->profile_step = profile_step ? atoll(profile_step) : 0;
    CUDA_CHECK(cudaStreamCreate(&t->stream));
    const GPTModelOptions model = model_options(p, opt->recompute, t->stream);
    if (gpt_model_create(&t->model, &p->config, &model) != 0) exit(1);
    gpt_model_print_memory(&t->model, stdout);
    t->mg = mg;
    if (mg) multi_gpu_attach(mg, &t->model);
    if (p->cp > 1) context_parallel_create(&t->cp, mg, p->cp, &t->model, opt->seq_len);
    optimizer_create(&t->optimizer, p->state_offset, p->state_elems, (float)opt->weight_decay, (float)opt->grad_clip);
    CUDA_CHECK(cudaMalloc(&t->inputs, p->tokens_per_micro_step * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&t->targets, p->tokens_per_micro_step * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&t->step_loss, sizeof(float)));
    batch_upload_create(&t->upload, (size_t)p->tokens_per_micro_step);
    open_data_or_exit(&t->train, "training", opt->train_data, p);
    if (p->have_val) open_data_or_exit(&t->val, "validation", opt->val_data, p);
    if (p->checkpoint_dir || p->resume_path[0]) CUDA_CHECK(cudaMallocHost(&t->staging, TRAIN_STATE_STAGING_BYTES));
    load_weights(p, t);
    if (opt->log_file && p->rank == 0) {
        t->log = fopen(opt->log_file, p->resume_path[0] ? "a" : "w");  // a resumed run continues its log
        if (!t->log) {
            fprintf(stderr, "error: cannot write the log file %s: %s\n", opt->log_file, strerror(errno));
            exit(1);
        }
    }
    CUDA_CHECK(cudaEventCreate(&t->start));
    CUDA_CHECK(cudaEventCreate(&t->stop));
    if (opt->sample_tokens > 0 && p->rank == 0) {
        static TrainingSampler sampler;
        generate_open_tokenizer(&t->tokenizer, opt->tokenizer, opt->train_data);
        training_sampler_create(&sampler, &t->model, sample_tokens(opt), opt->temperature, opt->top_k, opt->seed);
        t->sampler = &sampler;
    }
}

static void trainer_destroy(Trainer* t, const Plan* p) {
    if (t->log) fclose(t->log);
    dataloader_close(&t->train);
    if (p->have_val) dataloader_close(&t->val);
    if (t->sampler) training_sampler_destroy(t->sampler);
    tokenizer_free(&t->tokenizer);
    CUDA_CHECK(cudaEventDestroy(t->start));
    CUDA_CHECK(cudaEventDestroy(t->stop));
    optimizer_destroy(&t->optimizer);
    CUDA_CHECK(cudaFree(t->inputs));
    CUDA_CHECK(cudaFree(t->targets));
    CUDA_CHECK(cudaFree(t->step_loss));
    batch_upload_destroy(&t->upload);
    if (t->staging) CUDA_CHECK(cudaFreeHost(t->staging));
    context_parallel_destroy(&t->cp);
    gpt_model_destroy(&t->model);
    CUDA_CHECK(cudaStreamDestroy(t->stream));
}

// Forward and backward over the step's micro batches, the gradients accumulated (mean over the
// step's tokens); several GPUs: the last micro step's backward reduces each layer's gradients as it
// goes. The host waits on the GPU once, for the loss at the end, so it queues the next micro step
// while the GPU runs this one. Returns this rank's mean loss.
static double forward_backward(Plan* p, Trainer* t) {
    // each micro step's loss gradient is scaled to the mean over the whole step's tokens
    const float grad_scale = 1.0f / (float)((double)p->tokens_per_micro_step * p->accumulation_steps);
    gpt_model_zero_grad(&t->model);
    for (long long micro = 0; micro < p->accumulation_steps; micro++) {
        next_batch_or_exit(&t->train, "training");
        upload_batch(t, &t->train);
        gpt_model_forward_train(&t->model, t->inputs, t->targets, grad_scale);
        gpt_model_add_mean_loss(&t->model, t->step_loss, 1.0f / (float)p->accumulation_steps, micro == 0);
        if (t->mg) multi_gpu_arm_hook(t->mg, &t->model, micro == p->accumulation_steps - 1);
        gpt_model_backward(&t->model, grad_scale);
    }
    // ZeRO-1: the forward waited for the last step's all-gather; should a rank have died in it, the
    // watchdog, not a plain read, must be the one to wait. The same for context parallelism's ring.
    if (t->mg && t->mg->zero)
        multi_gpu_watch_stream(t->mg, t->stream, "ZeRO-1 all-gather of the weights (the forward waits for it)");
    if (t->cp.size > 1)
        multi_gpu_watch_stream(t->mg, t->stream, "the context-parallel ring attention (K/V and dK/dV send/recv)");
    return cuda_read_float(t->step_loss, t->stream);
}

// The global gradient norm (on the host; the device copy is norm_device()); several GPUs: also the
// mean loss over all ranks, in *loss, and whether any rank got a stop signal (t->stop_any).
static float gradient_norm(Trainer* t, double* loss) {
    if (!t->mg) return optimizer_grad_norm(&t->optimizer, &t->model);
    multi_gpu_wait_grads(t->mg, t->stream);
    float norm = 0.0f, mean_loss = 0.0f;
    multi_gpu_norm_and_loss(t->mg, t->optimizer.norm_scratch, *loss, stop_signal_received() != 0, &norm, &mean_loss,
                            &t->stop_any, t->stream);
    *loss = mean_loss;
    return norm;
}

static const float* norm_device(const Trainer* t) { return t->mg ? t->mg->scalars : t->optimizer.norm; }

// Milliseconds since the step's start event (waits for the step to finish).
static float step_ms(Trainer* t) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventRecord(t->stop, t->stream));
    CUDA_CHECK(cudaEventSynchronize(t->stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t->start, t->stop));
    return ms;
}

// --precision fp8: the fraction of this step's cast values that saturated (clipped to the format's
// largest value), 0 when none did or in bf16.
static double fp8_saturated_fraction(const Plan* p, Trainer* t) {
    if (p->opt->precision != PRECISION_FP8) return 0.0;
    const unsigned long long total = gpt_fp8_saturated(&t->model.fp8), step = total - t->fp8_saturated;
    t->fp8_saturated = total;
    return (double)step / p->fp8_values_per_step;
}

// The step line, and its JSON line in --log-file. The ETA: this launch's wall time per step so far
// (validation and checkpoints included) times the steps left.
static void log_step(const Plan* p, Trainer* t, long long step, double loss, double lr, float grad_norm, float ms) {
    const double seconds = ms / 1e3;
    const double tokens_per_s = (double)p->total_batch_tokens / seconds;
    const double tflops = p->flops_per_step / p->world / seconds / 1e12;  // per GPU
    const double hw_tflops = p->executed_flops_per_step / seconds / 1e12;
    const double mfu = p->peak_tflops > 0 ? 100.0 * tflops / p->peak_tflops : 0.0;
    t->steps_done++;
    t->step_seconds += seconds;
    char eta[32];
    format_duration((wall_seconds() - t->started) / (double)t->steps_done * (double)(p->steps - step), eta,
                    sizeof(eta));
    const double saturated = fp8_saturated_fraction(p, t);
    const double comm = t->mg ? multi_gpu_exposed_ms(t->mg) : 0.0;
    const double ring = t->cp.size > 1 ? context_parallel_exposed_ms(&t->cp) : 0.0;
    t->comm_exposed_ms += comm, t->ring_exposed_ms += ring;
    char extra[128] = "";
    if (t->mg) snprintf(extra, sizeof(extra), " | comm %.2f ms", comm);
    if (t->cp.size > 1) snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), " | ring %.2f ms", ring);
    if (saturated > 0.0) snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), " | fp8 saturated %.2e", saturated);
    printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | %.1f TFLOP/s | MFU %.1f%% | "
           "hw %.1f TFLOP/s%s | ETA %s\n", step, p->steps, loss, lr, grad_norm, ms, tokens_per_s, tflops, mfu,
           hw_tflops, extra, eta);
    extra[0] = '\0';
    if (t->mg) snprintf(extra, sizeof(extra), ", \"comm_exposed_ms\": %.3f", comm);
    if (t->cp.size > 1)
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), ", \"ring_exposed_ms\": %.3f", ring);
    if (saturated > 0.0) snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), ", \"fp8_saturated\": %.3e", saturated);
    if (t->log)
        fprintf(t->log,
                "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.3f, "
                "\"tokens_per_s\": %.1f, \"tflops_per_gpu\": %.2f, \"mfu\": %.4f, \"hw_tflops_per_gpu\": %.2f%s}\n",
                step, loss, lr, grad_norm, ms, tokens_per_s, tflops, mfu / 100.0, hw_tflops, extra);
}

// Mean loss over --val-batches validation micro batches (0 or more than there are: all of them).
// With several GPUs the batches are split over the data-parallel groups (each reads its part of every
// chunk; --context-parallel: each GPU of a group its share of the same sequences) and the mean is over
// all of them (every rank's mean over as many tokens). Printed and logged.
static void validate(Plan* p, Trainer* t, long long step) {
    DataLoader* val = &t->val;
    const long long available = dataloader_batches_per_epoch(val);  // chunks: one micro batch per rank each
    const long long batches = p->opt->val_batches, per_rank = (batches + p->dp_world - 1) / p->dp_world;
    const long long n = (batches == 0 || per_rank > available) ? available : per_rank;
    dataloader_reset(val);
    double sum = 0.0;
    for (long long i = 0; i < n; i++) {
        next_batch_or_exit(val, "validation");
        upload_batch(t, val);
        gpt_model_forward(&t->model, t->inputs, t->targets);
        sum += gpt_model_mean_loss(&t->model);
    }
    double loss = sum / (double)n;
    if (t->mg) loss = multi_gpu_sum(t->mg, loss, t->stream, "validation loss all-reduce") / p->world;
    printf("step %5lld/%lld | val loss %.4f\n", step, p->steps, loss);
    if (t->best_val_step == 0 || loss < t->best_val) t->best_val = loss, t->best_val_step = step;
    if (t->log) fprintf(t->log, "{\"step\": %lld, \"val_loss\": %.6f}\n", step, loss);
}

// Scores --eval-data with the current weights, each rank its share of the examples; prints and logs
// the accuracy over all of them.
static void evaluate(Plan* p, Trainer* t, long long step) {
    EvalScore score;
    eval_multiple_choice(&p->eval, &t->model, t->inputs, t->targets, p->rank, p->world, (int)p->opt->eval_examples,
                         NULL, &score);
    double n = (double)score.examples, by_mean = (double)score.correct_by_mean, by_sum = (double)score.correct_by_sum;
    if (t->mg) {
        n = multi_gpu_sum(t->mg, n, t->stream, "eval examples all-reduce");
        by_mean = multi_gpu_sum(t->mg, by_mean, t->stream, "eval acc_norm all-reduce");
        by_sum = multi_gpu_sum(t->mg, by_sum, t->stream, "eval acc all-reduce");
    }
    t->eval_acc_norm = by_mean / n, t->eval_acc = by_sum / n, t->eval_step = step;
    if (t->best_eval_step < 0 || t->eval_acc_norm > t->best_eval) t->best_eval = t->eval_acc_norm, t->best_eval_step = step;
    printf("step %5lld/%lld | eval acc_norm %.4f | acc %.4f | %.0f examples in %.1f s\n", step, p->steps,
           t->eval_acc_norm, t->eval_acc, n, score.seconds);
    if (t->log)
        fprintf(t->log, "{\"step\": %lld, \"eval_acc_norm\": %.6f, \"eval_acc\": %.6f, \"eval_examples\": %.0f}\n",
                step, t->eval_acc_norm, t->eval_acc, n);
}

// Before the first step of a fresh run (with --eval-every), every --eval-every steps, after the last.
static int eval_due(const Plan* p, long long step) {
    const long long every = p->opt->eval_every;
    return p->eval.num_examples && ((every > 0 && step % every == 0) || step == p->steps);
}

static int validation_due(const Plan* p, long long step) {
    return p->have_val && ((p->opt->val_every > 0 && step % p->opt->val_every == 0) || step == p->steps);
}

static int sample_due(const Plan* p, const Trainer* t, long long step) {
    const long long every = p->opt->sample_every;
    return t->sampler && ((every > 0 && step % every == 0) || step == p->steps);
}

// Samples from the model (--sample-every), once ZeRO-1's weights are all there: the decoder reads them
// without the forward's per-layer waits.
static void sample(Trainer* t, long long step) {
    if (t->mg) multi_gpu_wait_params(t->mg, t->stream);
    training_sample(t->sampler, &t->tokenizer, step);
}

static int checkpoint_due(const Plan* p, long long step) {
    return p->checkpoint_dir &&
           ((p->opt->checkpoint_every > 0 && step % p->opt->checkpoint_every == 0) || step == p->steps);
}

// Saves the state after `step` steps with the data position `data` of the next one, then keeps the
// --keep-checkpoints newest. One GPU, or several without ZeRO: rank 0 writes the file (every rank
// holds the same state); ZeRO-1: every rank writes its own. The ranks agree (an all-reduce, also a
// barrier) that every file is in place before rank 0 prunes. A failed write is reported and the run
// goes on (the previous checkpoints stay). Returns 0 when saved.
static int save_checkpoint(const Plan* p, Trainer* t, long long step, DataLoaderState data) {
    if (t->mg) multi_gpu_wait_params(t->mg, t->stream);  // ZeRO-1: the weights written are all there
    CheckpointHeader h = p->header;
    h.step = step;
    h.data_epoch = data.epoch, h.data_shard_index = data.shard_index, h.data_chunk_index = data.chunk_index;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const int sharded = h.zero_stage > 0;
    int failed = 0;
    if (sharded || p->rank == 0)
        failed = train_state_save(p->checkpoint_dir, h, &t->model, &t->optimizer, t->staging, p->rank) != 0;
    if (t->mg && multi_gpu_sum(t->mg, failed, t->stream, "all-reduce of the checkpoint's outcome") > 0) {
        if (!failed && p->rank == 0)
            fprintf(stderr, "warning: checkpoint at step %lld not saved by every rank (see their warnings); the "
                            "previous checkpoints are kept\n", step);
        return -1;
    }
    if (failed) return -1;
    if (p->rank == 0) checkpoint_prune(p->checkpoint_dir, p->opt->keep_checkpoints);
    checkpoint_path_rank(t->last_checkpoint, sizeof(t->last_checkpoint), p->checkpoint_dir, step, h.rank,
                         sharded ? h.world_size : 0);
    t->last_checkpoint_step = step;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("checkpoint   %s (%.1f s)\n", t->last_checkpoint, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}

// A non-finite loss or gradient norm: the weights are not updated; the state after the previous step
// is saved (if not saved yet), the message names it, and the run stops (exit 1).
static void stop_non_finite(const Plan* p, Trainer* t, long long step, DataLoaderState step_data, double loss,
                            float grad_norm) {
    fprintf(stderr, "error: the %s is %g at step %lld; the weights were not updated\n",
            isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? grad_norm : loss, step);
    char what[160];
    if (p->opt->precision == PRECISION_FP8 && gpt_fp8_first_nonfinite(&t->model.fp8, what, sizeof(what)))
        fprintf(stderr, "note: the first FP8 tensor of this step with a non-finite amax: %s; --precision bf16 "
                        "tells whether FP8 is the cause\n", what);
    if (p->checkpoint_dir && t->last_checkpoint_step != step - 1) save_checkpoint(p, t, step - 1, step_data);
    if (t->last_checkpoint[0])
        fprintf(stderr, "the last good checkpoint is %s; resume from it (--resume) with a lower --lr or more "
                        "--warmup-steps\n", t->last_checkpoint);
    else
        fprintf(stderr, "hint: lower --lr or raise --warmup-steps (and save checkpoints with --checkpoint-dir to "
                        "resume from the last good step)\n");
    if (t->mg) multi_gpu_destroy(t->mg);  // every rank stops here (the norm and loss are global)
    exit(1);
}

// What this launch did: wall time, tokens, mean TFLOP/s and MFU, the best validation loss and the
// last checkpoint.
static void print_summary(const Plan* p, const Trainer* t, long long last_step) {
    char wall[32], mfu[64] = "MFU unknown (pass --peak-tflops)";
    format_duration(wall_seconds() - t->started, wall, sizeof(wall));
    const double tflops = t->steps_done ? p->flops_per_step / p->world * (double)t->steps_done / t->step_seconds / 1e12
                                        : 0.0;
    if (p->peak_tflops > 0) snprintf(mfu, sizeof(mfu), "MFU %.1f%%", 100.0 * tflops / p->peak_tflops);
    printf("summary      steps %lld-%lld of %lld in %s (wall), %lld tokens; mean %.1f TFLOP/s per GPU, %s (over "
           "the steps' own time)\n", last_step - t->steps_done + 1, last_step, p->steps, wall,
           t->steps_done * p->total_batch_tokens, tflops, mfu);
    if (t->steps_done)
        printf("             hardware %.1f TFLOP/s per GPU (the FLOPs the kernels execute%s)\n",
               p->executed_flops_per_step * (double)t->steps_done / t->step_seconds / 1e12,
               p->recompute_flops_per_step > 0 ? ", recomputation included" : "");
    if (t->steps_done && t->mg)
        printf("             communication exposed %.2f ms per step, %.2f%% of the steps' time (the compute stream's "
               "waits: last gradient buckets, the norm all-reduce%s)\n", t->comm_exposed_ms / (double)t->steps_done,
               100.0 * t->comm_exposed_ms / 1e3 / t->step_seconds,
               p->opt->zero ? ", the forward's waits for ZeRO-1's weights" : "");
    if (t->steps_done && t->cp.size > 1)
        printf("             ring attention exposed %.2f ms per step, %.2f%% of the steps' time (the compute stream's "
               "waits for K/V and dK/dV from the group)\n", t->ring_exposed_ms / (double)t->steps_done,
               100.0 * t->ring_exposed_ms / 1e3 / t->step_seconds);
    if (t->best_val_step > 0) printf("             best val loss %.4f at step %lld\n", t->best_val, t->best_val_step);
    else printf("             no validation loss measured\n");
    if (t->eval_step >= 0)
        printf("             eval acc_norm %.4f, acc %.4f at step %lld; best acc_norm %.4f at step %lld\n",
               t->eval_acc_norm, t->eval_acc, t->eval_step, t->best_eval, t->best_eval_step);
    if (t->last_checkpoint[0])
        printf("             last checkpoint %s\nnext         sample from it: ./train_gpt --generate 256 --resume %s; "
               "train on: add --resume %s --max-steps N\n", t->last_checkpoint, p->checkpoint_dir, p->checkpoint_dir);
    else
        printf("             no checkpoint saved\n");
}

// Whether a stop signal reached this process or, with several GPUs, any rank: the flag rode in this
// step's (norm, loss, stop) all-reduce, so every rank sees the same answer after the same step, at
// no extra cost.
static int stop_requested(const Trainer* t) { return t->mg ? t->stop_any : stop_signal_received() != 0; }

// After a stop signal: saves the state after `step` (unless this step is saved already), says how to
// continue, and exits with EXIT_STOPPED; when nothing could be saved, with 128 + the signal's number.
static void stop_on_signal(const Plan* p, Trainer* t, long long step) {
    const int sig = stop_signal_received() ? stop_signal_received() : SIGTERM;  // 0: another rank's signal
    const char* by = stop_signal_received() ? stop_signal_name(sig) : "a stop signal on another rank";
    int saved = t->last_checkpoint_step == step;
    if (!saved && p->checkpoint_dir) saved = save_checkpoint(p, t, step, dataloader_get_state(&t->train)) == 0;
    print_summary(p, t, step);
    fflush(stdout);
    context_parallel_destroy(&t->cp);     // the group's communicator, before the world's
    if (t->mg) multi_gpu_destroy(t->mg);  // every rank stops after this step: a clean end
    if (saved) {
        printf("stopped      by %s after step %lld of %lld, saved in %s; to continue, run the same command with "
               "--resume auto (or --resume %s)\n", by, step, p->steps, t->last_checkpoint, p->checkpoint_dir);
        exit(EXIT_STOPPED);
    }
    fprintf(stderr, "stopped: by %s after step %lld of %lld; nothing could be saved (%s)\n", by, step, p->steps,
            p->checkpoint_dir ? "the checkpoint could not be written, see above" : "no --checkpoint-dir");
    exit(128 + sig);
}

// The training loop: each optimizer step as a recipe of calls.
static void train(Plan* p, Trainer* t) {
    const Options* opt = p->opt;
    if (p->start_step == 1 && opt->eval_every > 0 && eval_due(p, 0)) evaluate(p, t, 0);
    t->started = wall_seconds();
    for (long long step = p->start_step; step <= p->steps; step++) {
        const DataLoaderState step_data = dataloader_get_state(&t->train);  // for a rescue checkpoint
        if (t->mg) multi_gpu_set_step(t->mg, step);                         // for the watchdog's message
        if (step == t->profile_step) CUDA_CHECK(cudaProfilerStart());       // scripts/profile_step.py
        CUDA_CHECK(cudaEventRecord(t->start, t->stream));
        double loss = forward_backward(p, t);                               // over the micro steps
        const float grad_norm = gradient_norm(t, &loss);                    // several GPUs: the mean loss too
        if (opt->dump_grads && step == p->start_step && p->rank == 0)
            train_state_dump_gradients(opt->dump_grads, &t->model);
        if (!isfinite(loss) || !isfinite(grad_norm)) stop_non_finite(p, t, step, step_data, loss, grad_norm);
        const double lr = learning_rate(opt, step, p->steps);
        optimizer_update(&t->optimizer, &t->model, norm_device(t), lr, step);  // clip, AdamW
        if (t->mg && t->mg->zero) multi_gpu_all_gather_params(t->mg, t->stream);  // under the next forward
        log_step(p, t, step, loss, lr, grad_norm, step_ms(t));
        if (step == t->profile_step) CUDA_CHECK(cudaProfilerStop());
        if (validation_due(p, step)) validate(p, t, step);
        if (eval_due(p, step)) evaluate(p, t, step);
        if (sample_due(p, t, step)) sample(t, step);
        if (t->log) fflush(t->log);
        if (checkpoint_due(p, step)) save_checkpoint(p, t, step, dataloader_get_state(&t->train));
        if (step < p->steps && stop_requested(t)) stop_on_signal(p, t, step);  // SIGTERM, SIGINT, SIGUSR1
        fflush(stdout);
    }
    print_summary(p, t, p->steps);
}

// Several GPUs: joins the NCCL communicator. Every rank must run the same model, batch, data and
// schedule: the rendezvous compares a hash of them.
static void join_gpus(const Plan* p, MultiGpu* mg) {
    CheckpointHeader same = p->header;
    same.rank = 0, same.shard_offset = 0;
    uint64_t tag = launcher_hash(0, &same, sizeof(same));
    tag = launcher_hash(tag, &p->steps, sizeof(p->steps));
    tag = launcher_hash(tag, &p->cp, sizeof(p->cp));  // every rank must split the sequences the same way
    multi_gpu_init(mg, &p->launch, p->device, p->opt->zero, tag, p->opt->rendezvous_timeout, p->rendezvous_file,
                   p->opt->nccl_timeout);
    mg->owner_order = p->opt->deterministic;  // --zero 0 and 1 then sum the gradients alike, bit for bit
}

// A save cut short (kill -9, a lost node) leaves DIR/.step_*.ckpt.tmp behind: removed, with a note.
static void remove_leftover_temporaries(const char* dir) {
    char removed[1024];
    const int n = checkpoint_remove_temporaries(dir, removed, sizeof(removed));
    if (n > 0)
        printf("note         removed %d temporary file(s) of an interrupted checkpoint save from %s: %s\n", n, dir,
               removed);
}

static void run(Plan* p) {
    char err[CHECKPOINT_PATH_MAX + 256];
    if (p->checkpoint_dir && checkpoint_make_dir(p->checkpoint_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    if (p->checkpoint_dir && p->rank == 0) remove_leftover_temporaries(p->checkpoint_dir);
    static MultiGpu mg;
    if (p->world > 1) join_gpus(p, &mg);
    static Trainer trainer;
    trainer_create(&trainer, p, p->world > 1 ? &mg : NULL);
    train(p, &trainer);
    trainer_destroy(&trainer, p);
    eval_file_close(&p->eval);
    if (p->world > 1) multi_gpu_destroy(&mg);
}

// ---------------------------------------------------------------------------------------------
// Generation: --generate M continues a prompt (layers/generate/gpt_generate.cuh) instead of training.

static int generate(const Options* opt) {
    GenerateRun g;
    memset(&g, 0, sizeof(g));
    static const int eot = GPT2_EOT_TOKEN;
    int* prompt = opt->prompt_tokens ? generate_parse_prompt(opt->prompt_tokens, &g.prompt_len) : NULL;
    g.prompt = prompt ? prompt : &eot;
    g.prompt_len = prompt ? g.prompt_len : 1;
    g.tokens = opt->generate, g.num_samples = opt->num_samples;
    g.temperature = opt->temperature, g.top_k = opt->top_k, g.seed = opt->seed;
    g.resume = opt->resume, g.init_from = opt->init_from, g.attn = opt->attn;
    g.tokenizer = opt->tokenizer, g.shard_pattern = opt->train_data;
    const int status = generate_run(&g);
    free(prompt);
    return status;
}

// ---------------------------------------------------------------------------------------------
// Evaluation alone: --eval-only scores --eval-data with a checkpoint's or model file's weights.

// The model --eval-only scores with: built for --batch-size rows of T positions, the file's weights.
static GPTModel* eval_only_model(const Options* opt, const GPTConfig* config, int T, const char* path,
                                 cudaStream_t stream) {
    static GPTModel model;
    const GPTModelOptions o = gpt_model_options(opt->batch_size, T, opt->attn, stream);
    if (gpt_model_create(&model, config, &o) != 0) exit(1);
    train_state_load_weights(path, opt->resume == NULL, &model);
    return &model;
}

// One JSON line per example into --log-file, then the totals; the result on stdout.
static int evaluate_only(const Options* opt) {
    LaunchInfo launch;
    char err[512], path[CHECKPOINT_PATH_MAX], what[1024];
    if (launcher_detect(&launch, err, sizeof(err)) == 0 && launch.world > 1) {
        fprintf(stderr, "error: --eval-only runs on one GPU; the launcher (%s) started %d processes\n", launch.source,
                launch.world);
        return 2;
    }
    const GPTConfig config = train_state_weights_config(opt->resume, opt->init_from, path, sizeof(path));
    const int T = opt->seq_len < config.max_seq_len ? opt->seq_len : config.max_seq_len;
    static EvalFile ef;
    const int truncated = open_eval_or_exit(&ef, opt->eval_data, T);
    describe_eval(&ef, opt->eval_examples, truncated, T, what, sizeof(what));
    printf("model        from %s: %d layers, hidden %d, %d heads, %d positions; bf16, %s attention\n", path,
           config.num_layers, config.channels, config.num_heads, config.max_seq_len, attention_backend_name(opt->attn));
    printf("eval data    %s; rows of %d positions, %d per forward (--batch-size)\n", what, T, opt->batch_size);
    if (!gpu_info(0).found) {
        fprintf(stderr, "error: no CUDA GPU found: evaluation needs an NVIDIA GPU of compute capability 8.0 or newer\n");
        return 1;
    }
    FILE* detail = opt->log_file ? fopen(opt->log_file, "w") : NULL;
    if (opt->log_file && !detail) {
        fprintf(stderr, "error: cannot write the log file %s: %s\n", opt->log_file, strerror(errno));
        return 1;
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    GPTModel* model = eval_only_model(opt, &config, T, path, stream);
    int *inputs, *targets;
    CUDA_CHECK(cudaMalloc(&inputs, (size_t)model->B * T * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&targets, (size_t)model->B * T * sizeof(int)));
    EvalScore sc;
    eval_multiple_choice(&ef, model, inputs, targets, 0, 1, (int)opt->eval_examples, detail, &sc);
    const double acc_norm = (double)sc.correct_by_mean / sc.examples, acc = (double)sc.correct_by_sum / sc.examples;
    printf("eval         acc_norm %.4f (%lld/%lld), acc %.4f (%lld/%lld); %.1f s, %.0f examples/s\n", acc_norm,
           sc.correct_by_mean, sc.examples, acc, sc.correct_by_sum, sc.examples, sc.seconds, sc.examples / sc.seconds);
    if (detail) {
        fprintf(detail, "{\"eval_acc_norm\": %.6f, \"eval_acc\": %.6f, \"eval_examples\": %lld}\n", acc_norm, acc,
                sc.examples);
        fclose(detail);
    }
    CUDA_CHECK(cudaFree(inputs));
    CUDA_CHECK(cudaFree(targets));
    gpt_model_destroy(model);
    CUDA_CHECK(cudaStreamDestroy(stream));
    eval_file_close(&ef);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// main: options → plan (printed) → run

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // whole lines, so piped output keeps its order with stderr's errors
    if (stop_signal_install() != 0) {  // from the start: a signal during set-up stops after the first step
        fprintf(stderr, "error: cannot install the signal handlers: %s\n", strerror(errno));
        exit(1);
    }
    Options opt = parse_options(argc, argv);
    if (opt.generate) return generate(&opt);
    if (opt.eval_only) return evaluate_only(&opt);
    static Plan plan;
    make_plan(&plan, &opt);
    print_plan_model(&plan);
    print_plan_run(&plan);
    plan_gpu(&plan);
    if (!plan.gpu.found && !opt.plan_only) {
        fprintf(stderr, "error: no CUDA GPU found: the plan above is checked, but training needs an NVIDIA GPU of "
                        "compute capability 8.0 or newer (check nvidia-smi and CUDA_VISIBLE_DEVICES); --plan-only "
                        "prints the plan alone\n");
        exit(1);
    }
    if (!opt.plan_only) run(&plan);
    return 0;
}
