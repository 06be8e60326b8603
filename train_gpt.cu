// train_gpt.cu: GPT training in C/CUDA around our own FlashAttention kernels.
//
// Stage of this file: the command line, the model configuration, the data check and the
// training plan. The kernels and the training loop land in later changes; until then
// `./train_gpt` validates everything it is given, prints what it would run, and exits.
//
// Sections, top to bottom: options, model configuration, data, plan, main.
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataloader.h"
#include "layers/cuda_common.h"
#include "layers/gpt_config.h"

// ---------------------------------------------------------------------------------------------
// Options

typedef enum { ATTN_NAIVE, ATTN_FLASH1, ATTN_FLASH2 } AttentionBackend;
static const char* ATTENTION_BACKEND_NAMES[] = {"naive", "flash1", "flash2"};

typedef struct {
    const char* model;            // a name from gpt_config.h
    int layers, hidden, heads;    // overrides of the named shape; 0 = keep
    const char* train_data;       // shard path or glob
    const char* val_data;         // shard path or glob; "" = no validation
    int batch_size;               // B, sequences per micro step per GPU
    int seq_len;                  // T
    long long total_batch_tokens; // tokens per optimizer step; 0 = B·T (no accumulation)
    long long steps;              // optimizer steps; 0 = one pass over the training data
    AttentionBackend attn;
    uint64_t seed;
    int shuffle;
    double peak_tflops;           // 0 = look up by GPU name
} Options;

static void print_usage(FILE* out) {
    fprintf(out,
            "usage: ./train_gpt [options]\n"
            "\n"
            "Trains a GPT on token shards (llm.c format) and reports tokens/s, TFLOP/s per GPU and MFU.\n"
            "This build checks the options and the data and prints the training plan; the kernels\n"
            "and the training loop are not in it yet.\n"
            "\n"
            "model\n"
            "  -m, --model NAME            gpt2-124m (default), gpt2-350m, gpt2-774m, gpt2-1558m,\n"
            "                              gpt3-1.3b, gpt3-2.7b, gpt3-2.7b-d128\n"
            "      --layers N              override the number of layers\n"
            "      --hidden N              override the hidden size\n"
            "      --heads N               override the number of heads (head dim = hidden / heads\n"
            "                              must be 64, 80, 96 or 128)\n"
            "  -a, --attn BACKEND          naive | flash1 | flash2 (default flash2)\n"
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
            "                              (default: batch-size * seq-len, no accumulation)\n"
            "  -x, --steps N               optimizer steps (default: one pass over the training data)\n"
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
                   4, 1024, 0, 0, ATTN_FLASH2, 1337, 0, 0.0};
    enum { OPT_LAYERS = 1000, OPT_HIDDEN, OPT_HEADS, OPT_SEED, OPT_SHUFFLE, OPT_PEAK };
    static const struct option long_options[] = {
        {"model", required_argument, 0, 'm'},       {"layers", required_argument, 0, OPT_LAYERS},
        {"hidden", required_argument, 0, OPT_HIDDEN}, {"heads", required_argument, 0, OPT_HEADS},
        {"attn", required_argument, 0, 'a'},        {"train-data", required_argument, 0, 'i'},
        {"val-data", required_argument, 0, 'j'},    {"shuffle", no_argument, 0, OPT_SHUFFLE},
        {"seed", required_argument, 0, OPT_SEED},   {"batch-size", required_argument, 0, 'b'},
        {"seq-len", required_argument, 0, 't'},     {"total-batch-tokens", required_argument, 0, 'd'},
        {"steps", required_argument, 0, 'x'},       {"peak-tflops", required_argument, 0, OPT_PEAK},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:a:i:j:b:t:d:x:h", long_options, NULL)) != -1) {
        switch (c) {
            case 'm': opt.model = optarg; break;
            case OPT_LAYERS: opt.layers = (int)parse_int("--layers", optarg, 1, 1000); break;
            case OPT_HIDDEN: opt.hidden = (int)parse_int("--hidden", optarg, 1, 1 << 16); break;
            case OPT_HEADS: opt.heads = (int)parse_int("--heads", optarg, 1, 1024); break;
            case 'a': {
                int found = -1;
                for (int k = 0; k < 3; k++)
                    if (strcmp(optarg, ATTENTION_BACKEND_NAMES[k]) == 0) found = k;
                if (found < 0) {
                    fprintf(stderr, "error: --attn expects naive, flash1 or flash2, got \"%s\"\n", optarg);
                    exit(2);
                }
                opt.attn = (AttentionBackend)found;
                break;
            }
            case 'i': opt.train_data = optarg; break;
            case 'j': opt.val_data = optarg; break;
            case OPT_SHUFFLE: opt.shuffle = 1; break;
            case OPT_SEED: opt.seed = (uint64_t)parse_int("--seed", optarg, 0, INT64_MAX); break;
            case 'b': opt.batch_size = (int)parse_int("--batch-size", optarg, 1, 1 << 20); break;
            case 't': opt.seq_len = (int)parse_int("--seq-len", optarg, 1, 1 << 20); break;
            case 'd': opt.total_batch_tokens = parse_int("--total-batch-tokens", optarg, 1, INT64_MAX); break;
            case 'x': opt.steps = parse_int("--steps", optarg, 1, INT64_MAX); break;
            case OPT_PEAK: opt.peak_tflops = parse_double("--peak-tflops", optarg, 0.0); break;
            case 'h': print_usage(stdout); exit(0);
            default: fprintf(stderr, "run ./train_gpt --help for the options\n"); exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "error: unexpected argument \"%s\"; run ./train_gpt --help for the options\n", argv[optind]);
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
static void open_data_or_exit(DataLoader* loader, const char* what, const char* pattern, const Options* opt) {
    if (dataloader_open(loader, pattern, opt->batch_size, opt->seq_len, 0, 1, GPT2_VOCAB_SIZE, opt->shuffle,
                        opt->seed) != 0) {
        fprintf(stderr, "error: %s data: %s\n", what, loader->error);
        if (strstr(pattern, "data/tinyshakespeare/") == pattern)
            fprintf(stderr, "hint: `make train` prepares the default dataset (scripts/prepare_data.py)\n");
        exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Plan

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

int main(int argc, char** argv) {
    Options opt = parse_options(argc, argv);
    GPTConfig config = build_config(&opt);
    const int B = opt.batch_size, T = opt.seq_len;
    const long long tokens_per_micro_step = (long long)B * T;
    long long total_batch_tokens = opt.total_batch_tokens ? opt.total_batch_tokens : tokens_per_micro_step;
    if (total_batch_tokens % tokens_per_micro_step != 0) {
        fprintf(stderr, "error: --total-batch-tokens %lld is not a multiple of batch-size * seq-len = %lld\n",
                total_batch_tokens, tokens_per_micro_step);
        exit(2);
    }
    const long long accumulation_steps = total_batch_tokens / tokens_per_micro_step;

    DataLoader train_loader, val_loader;
    open_data_or_exit(&train_loader, "training", opt.train_data, &opt);
    const int have_val = opt.val_data[0] != '\0';
    if (have_val) open_data_or_exit(&val_loader, "validation", opt.val_data, &opt);
    // Read the first batch now so a bad token range in the first shard is reported before any GPU work.
    if (dataloader_next_batch(&train_loader) != 0) {
        fprintf(stderr, "error: training data: %s\n", train_loader.error);
        exit(1);
    }
    const long long micro_batches_per_epoch = dataloader_batches_per_epoch(&train_loader);
    const long long steps = opt.steps ? opt.steps : (micro_batches_per_epoch + accumulation_steps - 1) / accumulation_steps;

    const size_t num_params = gpt_num_params(&config);
    // Model state: bf16 weights and gradients, fp32 master weights and two AdamW moments.
    const double state_bytes = (double)num_params * (2 + 2 + 4 + 4 + 4);
    const double flops_per_step = gpt_flops_per_sequence(&config, T) * (double)(total_batch_tokens / T);

    printf("model        %s: %d layers, hidden %d, %d heads of %d, vocab %d padded to %d, seq %d\n", opt.model,
           config.num_layers, config.channels, config.num_heads, config.channels / config.num_heads,
           config.vocab_size, config.padded_vocab_size, T);
    printf("parameters   %zu (%.3f B)\n", num_params, num_params / 1e9);
    printf("attention    %s\n", ATTENTION_BACKEND_NAMES[opt.attn]);
    printf("batch        %d x %d = %lld tokens per micro step, %lld micro steps per optimizer step = %lld tokens\n",
           B, T, tokens_per_micro_step, accumulation_steps, total_batch_tokens);
    printf("train data   %s: %d shard(s), %lld tokens, %lld micro batches per epoch%s\n", opt.train_data,
           train_loader.num_shards, (long long)train_loader.total_tokens, micro_batches_per_epoch,
           opt.shuffle ? ", shuffled" : "");
    if (have_val)
        printf("val data     %s: %d shard(s), %lld tokens\n", opt.val_data, val_loader.num_shards,
               (long long)val_loader.total_tokens);
    else
        printf("val data     none\n");
    printf("first batch  %d %d %d %d ... (targets %d %d %d %d ...)\n", train_loader.inputs[0], train_loader.inputs[1],
           train_loader.inputs[2], train_loader.inputs[3], train_loader.targets[0], train_loader.targets[1],
           train_loader.targets[2], train_loader.targets[3]);
    printf("steps        %lld\n", steps);
    printf("model FLOPs  %.3f TFLOP per optimizer step (6*s*P + 12*L*h*s^2 per sequence)\n", flops_per_step / 1e12);
    printf("model state  %.2f GiB (bf16 weights + grads, fp32 master + AdamW moments); activations extra\n",
           gib(state_bytes));

    GpuInfo gpu = gpu_info(0);
    if (!gpu.found) {
        printf("gpu          none found: plan only\n");
    } else {
        double peak = opt.peak_tflops > 0 ? opt.peak_tflops : gpu_peak_bf16_tflops(gpu.name);
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
                    "(--model, --layers, --hidden) or more GPUs with optimizer sharding\n",
                    gib(state_bytes), gib((double)gpu.free_bytes));
            exit(1);
        }
    }
    printf("status       plan only: the training loop is not implemented in this build\n");

    dataloader_close(&train_loader);
    if (have_val) dataloader_close(&val_loader);
    return 0;
}
