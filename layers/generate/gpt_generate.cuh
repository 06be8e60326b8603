// gpt_generate.cuh: text generation on top of the decoder (gpt_decode.cuh, gpt_prefill.cuh) and the
// token loop (gpt_generator.cuh: one CUDA graph per token, the draw on the GPU, gpt_sample.cuh): the
// samples printed during training (--sample-every) and the whole `./train_gpt --generate M` run
// (weights from a checkpoint or an llm.c model file into an inference-only model, prefill of the
// prompt, batched sampling of --num-samples sequences, the text, the speed and the memory taken).
//
// Sampling: temperature 0 is greedy (the first of the largest logits); otherwise softmax(logits /
// temperature) over the V real tokens, or over the top_k largest when top_k > 0, drawn with a
// counter-based generator keyed by --seed: the same seed, model and prompt give the same tokens (the
// GPU work is deterministic: layers/model/matmul.cuh with fixed GEMM choices and the decode kernels
// sum in fixed orders).
#ifndef GPT_GENERATE_CUH
#define GPT_GENERATE_CUH

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <time.h>

#include "data/prompt_tokens.h"
#include "data/tokenizer.h"
#include "layers/training/train_state.cuh"
#include "layers/generate/gpt_generator.cuh"
#include "layers/generate/gpt_inference_model.cuh"
#include "layers/generate/gpt_prefill.cuh"

static double generate_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Prints tokens as text, leaving out control bytes other than newline and tab (a stray one would
// garble a terminal); ids where there is no token table, "<id>" for one outside it.
static void gpt_print_tokens(const Tokenizer* tok, const int* tokens, int n, FILE* f) {
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const unsigned char* b = tok && tok->vocab_size && tokens[i] >= 0
                                     ? tokenizer_token_bytes(tok, (uint32_t)tokens[i], &len) : NULL;
        if (!tok || !tok->vocab_size) fprintf(f, "%s%d", i ? " " : "", tokens[i]);
        else if (!b) fprintf(f, "<%d>", tokens[i]);
        else
            for (size_t k = 0; k < len; k++)
                if (b[k] >= 32 || b[k] == '\n' || b[k] == '\t') fputc(b[k], f);
    }
}

// ---- samples during training (--sample-every) -------------------------------------------------------

// One sequence, from <|endoftext|> at position 0, on the trainer's model (its weights now), with a
// decoder of its own (a cache of `tokens` positions), as llm.c prints during training. The graph of
// the step is captured at the first sample and replayed by every later one.
typedef struct {
    GPTDecoder decoder;
    GPTGenerator generator;
    int* tokens;  // (M)
    int M;
} TrainingSampler;

static void training_sampler_create(TrainingSampler* t, GPTModel* model, int M, double temperature, int top_k,
                                    uint64_t seed) {
    memset(t, 0, sizeof(*t));
    t->M = M;
    if (gpt_decoder_create(&t->decoder, model, 1, M, 1) != 0) exit(1);
    gpt_generator_create(&t->generator, &t->decoder, temperature, top_k, seed);
    t->tokens = (int*)malloc((size_t)M * sizeof(int));
}

static void training_sampler_destroy(TrainingSampler* t) {
    gpt_generator_destroy(&t->generator);
    gpt_decoder_destroy(&t->decoder);
    free(t->tokens);
}

// Prints "sample  <text>" of M tokens after `step`. The random counters go on from sample to sample
// (the whole run is reproducible from --seed).
static void training_sample(TrainingSampler* t, const Tokenizer* tok, long long step) {
    const int eot = GPT2_EOT_TOKEN;
    gpt_decoder_reset(&t->decoder);
    gpt_decoder_step(&t->decoder, &eot, 1);
    gpt_generate_tokens(&t->generator, t->M, t->tokens, NULL, NULL);
    printf("sample       after step %lld (%d tokens from <|endoftext|>):\n", step, t->M);
    printf("---\n");
    gpt_print_tokens(tok, t->tokens, t->M, stdout);
    printf("\n---\n");
}

// ---- command-line helpers -------------------------------------------------------------------------------

// Token ids from `text`: a comma list ("464,3290") or, when it is not one, a file of ids separated by
// commas or white space (data/prompt_tokens.h). *n ids into a malloc'ed array; exits (2) with the reason
// when unusable.
static int* generate_parse_prompt(const char* text, int* n) {
    const size_t err_len = strlen(text) + 512;  // the messages quote the argument whole
    char* err = (char*)malloc(err_len);
    int* ids = err ? prompt_tokens_parse(text, n, err, err_len) : NULL;
    if (!ids) {
        fprintf(stderr, "error: %s\n", err ? err : "out of memory");
        exit(2);
    }
    free(err);
    return ids;
}

// The token table to print text with: `path` (--tokenizer; exits (2) when unreadable), else
// TOKENIZER_FILE_NAME in the folder of the training shards' pattern (when it is there). Returns 1
// when loaded, 0 when there is none (token ids are printed; a note says how to get text).
static int generate_open_tokenizer(Tokenizer* t, const char* path, const char* shard_pattern) {
    char guess[1024];
    if (path) {
        if (tokenizer_load(t, path) != 0) {
            fprintf(stderr, "error: --tokenizer: %s\n", t->error);
            exit(2);
        }
        return 1;
    }
    const char* slash = strrchr(shard_pattern, '/');
    snprintf(guess, sizeof(guess), "%.*s%s", slash ? (int)(slash - shard_pattern + 1) : 0, shard_pattern,
             TOKENIZER_FILE_NAME);
    if (tokenizer_load(t, guess) == 0) return 1;
    printf("note         no token table at %s: samples are printed as token ids (give --tokenizer PATH, llm.c's "
           "gpt2_tokenizer.bin format)\n", guess);
    return 0;
}

// ---- ./train_gpt --generate M ---------------------------------------------------------------------------

typedef struct {
    int tokens;                // M new tokens per sequence
    int num_samples;           // B
    const int* prompt;         // prompt tokens (a single <|endoftext|> when none was given)
    int prompt_len;
    double temperature;
    int top_k;
    uint64_t seed;
    const char* resume;        // a checkpoint file or directory, or NULL
    const char* init_from;     // an llm.c model file, or NULL
    AttentionBackend attn;     // of the prefill
    const char* tokenizer;     // the token table (--tokenizer), or NULL: the one beside the shards, if any
    const char* shard_pattern; // the training shards' pattern
} GenerateRun;

// Prints the model and what will be generated; returns 2 after an error when the prompt does not fit
// the model's positions or holds a token the model does not have, else 0.
static int generate_check_and_describe(const GenerateRun* g, const GPTConfig* config, const char* path) {
    const int P = g->prompt_len, M = g->tokens, positions = P + M - 1;
    printf("model        from %s: %d layers, hidden %d, %d heads of %d, vocab %d padded to %d, %d positions\n", path,
           config->num_layers, config->channels, config->num_heads, config->channels / config->num_heads,
           config->vocab_size, config->padded_vocab_size, config->max_seq_len);
    if (positions > config->max_seq_len) {
        fprintf(stderr, "error: a prompt of %d tokens and %d new tokens need %d positions; the model has %d: generate "
                        "at most %d tokens or shorten the prompt\n", P, M, positions, config->max_seq_len,
                config->max_seq_len - P + 1);
        return 2;
    }
    for (int i = 0; i < P; i++)
        if (g->prompt[i] < 0 || g->prompt[i] >= config->vocab_size) {
            fprintf(stderr, "error: prompt token %d (the %d-th) is not a token id of this model (0 .. %d)\n",
                    g->prompt[i], i + 1, config->vocab_size - 1);
            return 2;
        }
    char how[128] = "greedy (temperature 0)";
    if (g->temperature > 0)
        snprintf(how, sizeof(how), "temperature %g, %s%d, seed %llu", g->temperature,
                 g->top_k ? "top-k " : "all tokens", g->top_k ? g->top_k : config->vocab_size,
                 (unsigned long long)g->seed);
    printf("generate     %d sample(s) x %d tokens after a prompt of %d tokens; %s; prefill with %s\n", g->num_samples,
           M, P, how, attention_backend_name(g->attn));
    return 0;
}

// Sample b's header line and its prompt as text (or token ids without a token table).
static void generate_print_sample_start(const GenerateRun* g, const Tokenizer* tok, int b) {
    printf("--- sample %d/%d\n", b + 1, g->num_samples);
    gpt_print_tokens(tok, g->prompt, g->prompt_len, stdout);
    printf("%s", tok ? "" : " |");
}

// Sample b's token ids.
static void generate_print_sample_ids(const GenerateRun* g, const int* out, int b) {
    const int M = g->tokens;
    printf("tokens      ");
    for (int i = 0; i < M; i++) printf(" %d", out[(size_t)b * M + i]);
    printf("\n");
}

// Each sample as text and its token ids; one sample was already printed as its tokens came
// (streamed): only its ids are left.
static void generate_print_samples(const GenerateRun* g, const Tokenizer* tok, const int* out, int streamed) {
    const int B = g->num_samples, M = g->tokens;
    for (int b = 0; b < B; b++) {
        if (!streamed) {
            generate_print_sample_start(g, tok, b);
            gpt_print_tokens(tok, out + (size_t)b * M, M, stdout);
            printf("\n");
        }
        generate_print_sample_ids(g, out, b);
    }
    printf("---\n");
}

// Streams one sequence's text as its chunks of tokens arrive (--num-samples 1).
typedef struct {
    const Tokenizer* tok;
    int printed;  // tokens printed so far (ids are separated by spaces)
} GenerateStream;

static void generate_stream_chunk(void* user, const int* tokens, int first, int n, int B) {
    GenerateStream* st = (GenerateStream*)user;
    (void)first, (void)B;  // B is 1: tokens (n, 1) are the sequence's
    if (!st->tok && st->printed) printf(" ");
    gpt_print_tokens(st->tok, tokens, n, stdout);
    st->printed += n;
    fflush(stdout);
}

// The prompt, once per sample, on the GPU: (B, P) int32.
static int* generate_upload_prompts(const GenerateRun* g) {
    const size_t B = (size_t)g->num_samples, P = (size_t)g->prompt_len;
    int* host = (int*)malloc(B * P * sizeof(int));
    for (size_t b = 0; b < B; b++) memcpy(host + b * P, g->prompt, P * sizeof(int));
    int* inputs = NULL;
    CUDA_CHECK(cudaMalloc((void**)&inputs, B * P * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(inputs, host, B * P * sizeof(int), cudaMemcpyHostToDevice));
    free(host);
    return inputs;
}

// Bytes of GPU memory in use now (all processes; the difference of two readings is what this run took).
static size_t generate_gpu_used(void) {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
}

// What the generation holds on the GPU, by part, and what the GPU says it took (used_before: the
// reading before the model was made; the peak is while the prefill's buffers exist).
static void generate_print_memory(const GPTModel* m, const GPTDecoder* d, size_t prefill_bytes, size_t used_before,
                                  size_t used_peak) {
    const double MiB = 1024.0 * 1024.0;
    const size_t weights = m->num_params * sizeof(__nv_bfloat16);
    printf("memory       weights %.1f MiB, KV cache %.1f MiB (%d x %d positions), decode activations %.1f MiB, "
           "prefill %.1f MiB (freed after the prompt); the GPU's memory in use grew by %.1f MiB at the peak "
           "(cuBLASLt's workspace and the kernels' code included); no gradients, optimizer state or training "
           "activations\n", weights / MiB, gpt_decoder_cache_bytes(d) / MiB, d->B, d->cache.Tmax,
           (d->acts_bytes + d->workspace_bytes) / MiB, prefill_bytes / MiB,
           used_peak > used_before ? (used_peak - used_before) / MiB : 0.0);
}

typedef struct {
    double prefill_s, decode_s;  // host clock, each up to its last result on the host
    float steady_ms;             // GPU time of the replayed steps (tokens 2 .. M−1)
    int steady_steps;
    size_t prefill_bytes, used_peak;
} GenerateTimes;

// Prefills the prompts and generates M tokens per sample into out (B, M), streaming sample 1's text
// when it is the only one. Returns the times.
static GenerateTimes generate_tokens_timed(const GenerateRun* g, GPTDecoder* dec, const Tokenizer* tok, int* out) {
    GenerateTimes t;
    memset(&t, 0, sizeof(t));
    cudaStream_t stream = dec->model->stream;
    int* inputs = generate_upload_prompts(g);
    GPTGenerator gen;
    gpt_generator_create(&gen, dec, g->temperature, g->top_k, g->seed);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double t0 = generate_seconds();
    gpt_decoder_prefill(dec, inputs, g->prompt_len);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double t1 = generate_seconds();
    t.prefill_s = t1 - t0;
    t.prefill_bytes = dec->prefill_bytes;
    t.used_peak = generate_gpu_used();
    gpt_decoder_release_prefill(dec);
    const double t2 = generate_seconds();
    GenerateStream st = {tok, 0};
    const int streamed = g->num_samples == 1;
    if (streamed) generate_print_sample_start(g, tok, 0), fflush(stdout);
    gpt_generate_tokens(&gen, g->tokens, out, streamed ? generate_stream_chunk : NULL, &st);
    t.decode_s = generate_seconds() - t2;
    if (streamed) printf("\n");
    t.steady_ms = gen.steady_ms, t.steady_steps = gen.steady_steps;
    printf("decode       %s\n", gen.use_graph ? "one CUDA graph per token (GPT_GENERATE_GRAPH=0: uncaptured)"
                                               : "uncaptured steps (GPT_GENERATE_GRAPH=0 or the default stream)");
    gpt_generator_destroy(&gen);
    CUDA_CHECK(cudaFree(inputs));
    return t;
}

// Generates, then prints the samples, the speed and the memory.
static void generate_and_report(const GenerateRun* g, GPTDecoder* dec, const Tokenizer* tok, size_t used_before) {
    const int B = g->num_samples, P = g->prompt_len, M = g->tokens;
    int* out = (int*)malloc((size_t)B * M * sizeof(int));
    const GenerateTimes t = generate_tokens_timed(g, dec, tok, out);
    generate_print_samples(g, tok, out, B == 1);
    char steady[160] = "";
    if (t.steady_steps > 0)
        snprintf(steady, sizeof(steady), "; steady %.3f ms per step, %.0f tokens/s (tokens 3..%d, GPU time)",
                 t.steady_ms / t.steady_steps, B * t.steady_steps / (t.steady_ms * 1e-3), M);
    printf("speed        prefill %d x %d tokens in %.1f ms; %d x %d new tokens in %.3f s: %.0f tokens/s (%.0f per "
           "sequence), %.3f ms per step%s\n", B, P, t.prefill_s * 1e3, B, M, t.decode_s, B * M / t.decode_s,
           M / t.decode_s, t.decode_s / M * 1e3, steady);
    generate_print_memory(dec->model, dec, t.prefill_bytes, used_before, t.used_peak);
    free(out);
}

// The whole --generate run; returns the exit status.
static int generate_run(const GenerateRun* g) {
    char path[CHECKPOINT_PATH_MAX];
    const GPTConfig config = train_state_weights_config(g->resume, g->init_from, path, sizeof(path));
    const int status = generate_check_and_describe(g, &config, path);
    if (status != 0) return status;
    Tokenizer table;
    const Tokenizer* tok = generate_open_tokenizer(&table, g->tokenizer, g->shard_pattern) ? &table : NULL;
    const GpuInfo gpu = gpu_info(0);
    if (!gpu.found) {
        fprintf(stderr,
                "error: no CUDA GPU found: generation needs an NVIDIA GPU of compute capability 8.0 or newer\n");
        return 1;
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    const size_t used_before = generate_gpu_used();
    GPTModel model;
    if (gpt_inference_model_create(&model, &config, g->attn, stream) != 0) return 1;
    train_state_load_weights(path, g->init_from != NULL, &model);
    GPTDecoder dec;
    if (gpt_decoder_create(&dec, &model, g->num_samples, g->prompt_len + g->tokens - 1, 1) != 0) return 1;
    generate_and_report(g, &dec, tok, used_before);
    if (tok) tokenizer_free(&table);
    gpt_decoder_destroy(&dec);
    gpt_model_destroy(&model);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

#endif  // GPT_GENERATE_CUH
