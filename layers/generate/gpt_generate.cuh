// gpt_generate.cuh: text generation on top of the cached decoder (layers/generate/gpt_decode.cuh): sampling,
// the generation loop, the samples printed during training (--sample-every) and the whole
// `./train_gpt --generate M` run (weights from a checkpoint or an llm.c model file, prefill of the
// prompt, batched sampling of --num-samples sequences, the text and tokens/s).
//
// Sampling runs on the host from the (B, Vp) bf16 logits copied back after each step (B·Vp·2 bytes,
// 100 KB per sequence): temperature 0 is greedy (the first of the largest logits); otherwise
// softmax(logits / temperature) over the V real tokens, or over the top_k largest when top_k > 0,
// drawn with a splitmix64 generator seeded by --seed: the same seed, model and prompt give the same
// tokens (the GPU work is deterministic, layers/model/matmul.cuh and the decode kernel sum in fixed orders).
#ifndef GPT_GENERATE_CUH
#define GPT_GENERATE_CUH

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <time.h>

#include "data/prompt_tokens.h"
#include "data/tokenizer.h"
#include "layers/training/train_state.cuh"
#include "layers/generate/gpt_decode.cuh"

// ---- sampling ---------------------------------------------------------------------------------------

typedef struct {
    double temperature;  // 0: greedy
    int top_k;           // 0: all V tokens
    uint64_t state;      // splitmix64
    float* values;       // (V) scratch
    int* heap;           // (V) scratch: the indices of the top-k min-heap
} Sampler;

static void sampler_create(Sampler* s, double temperature, int top_k, uint64_t seed, int V) {
    s->temperature = temperature, s->top_k = top_k, s->state = seed;
    s->values = (float*)malloc((size_t)V * sizeof(float));
    s->heap = (int*)malloc((size_t)V * sizeof(int));
    if (!s->values || !s->heap) {
        fprintf(stderr, "error: out of host memory for sampling\n");
        exit(1);
    }
}

static void sampler_destroy(Sampler* s) {
    free(s->values);
    free(s->heap);
    s->values = NULL, s->heap = NULL;
}

static inline float __uint_as_float_host(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

// Uniform in [0, 1) with 53 random bits.
static double sampler_uniform(Sampler* s) {
    uint64_t z = (s->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

// Restores the min-heap property (by values[heap[.]]) below position i of a heap of n.
static void sampler_sift_down(const float* values, int* heap, int n, int i) {
    for (;;) {
        int smallest = i, l = 2 * i + 1, r = l + 1;
        if (l < n && values[heap[l]] < values[heap[smallest]]) smallest = l;
        if (r < n && values[heap[r]] < values[heap[smallest]]) smallest = r;
        if (smallest == i) return;
        const int tmp = heap[i];
        heap[i] = heap[smallest], heap[smallest] = tmp;
        i = smallest;
    }
}

// The next token from one sequence's logits (bf16 bits, the V real tokens first).
static int sampler_pick(Sampler* s, const uint16_t* logits, int V) {
    float* x = s->values;
    int best = 0;
    float top = -INFINITY;  // the running maximum in a register (x[best] would be reloaded)
    for (int i = 0; i < V; i++) {
        const float v = __uint_as_float_host((uint32_t)logits[i] << 16);
        x[i] = v;
        if (v > top) top = v, best = i;
    }
    if (s->temperature <= 0.0) return best;
    const float inv_t = (float)(1.0 / s->temperature);
    double sum = 0.0;
    if (s->top_k > 0 && s->top_k < V) {
        // the top_k largest by a min-heap of k (O(V log k)), then their weights in x[idx[i]]
        const int n = s->top_k;
        int* idx = s->heap;
        for (int i = 0; i < n; i++) idx[i] = i;
        for (int i = n / 2 - 1; i >= 0; i--) sampler_sift_down(x, idx, n, i);
        float least = x[idx[0]];  // the heap's smallest
        for (int i = n; i < V; i++)
            if (x[i] > least) idx[0] = i, sampler_sift_down(x, idx, n, 0), least = x[idx[0]];
        for (int i = 0; i < n; i++) sum += (x[idx[i]] = expf((x[idx[i]] - top) * inv_t));
        const double u = sampler_uniform(s) * sum;
        double cum = 0.0;
        for (int i = 0; i < n; i++)
            if (u < (cum += x[idx[i]])) return idx[i];
        return best;  // rounding left u at the very end
    }
    // all V tokens: softmax((x − max) / temperature), then the inverse of its cumulative sum
    for (int i = 0; i < V; i++) sum += (x[i] = expf((x[i] - top) * inv_t));
    const double u = sampler_uniform(s) * sum;
    double cum = 0.0;
    for (int i = 0; i < V; i++)
        if (u < (cum += x[i])) return i;
    return best;
}

// ---- the generation loop ------------------------------------------------------------------------------

static double generate_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


// Draws M tokens per sequence: the first from the logits the decoder holds (after a prefill or a
// step), each further one after a decode step on the previous. out (B, M) on the host. logits_host:
// pinned (B, Vp) uint16. Returns the seconds spent sampling on the host.
static double gpt_generate_tokens(GPTDecoder* d, Sampler* s, int M, int* out, uint16_t* logits_host) {
    const int B = d->B, V = d->model->V, Vp = d->model->Vp;
    int* next = (int*)malloc((size_t)B * sizeof(int));
    double sampling = 0.0;
    for (int i = 0; i < M; i++) {
        if (i > 0) gpt_decoder_step(d, next, 1);
        CUDA_CHECK(cudaMemcpyAsync(logits_host, d->logits, (size_t)B * Vp * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                                   d->model->stream));
        CUDA_CHECK(cudaStreamSynchronize(d->model->stream));
        const double t0 = generate_seconds();
        for (int b = 0; b < B; b++) next[b] = out[(size_t)b * M + i] = sampler_pick(s, logits_host + (size_t)b * Vp, V);
        sampling += generate_seconds() - t0;
    }
    free(next);
    return sampling;
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
// decoder of its own (a cache of `tokens` positions), as llm.c prints during training.
typedef struct {
    GPTDecoder decoder;
    Sampler sampler;
    uint16_t* logits_host;  // pinned (1, Vp)
    int* tokens;            // (M)
    int M;
} TrainingSampler;

static void training_sampler_create(TrainingSampler* t, GPTModel* model, int M, double temperature, int top_k,
                                    uint64_t seed) {
    memset(t, 0, sizeof(*t));
    t->M = M;
    if (gpt_decoder_create(&t->decoder, model, 1, M, 1) != 0) exit(1);
    sampler_create(&t->sampler, temperature, top_k, seed, model->V);
    CUDA_CHECK(cudaMallocHost((void**)&t->logits_host, (size_t)model->Vp * sizeof(uint16_t)));
    t->tokens = (int*)malloc((size_t)M * sizeof(int));
}

static void training_sampler_destroy(TrainingSampler* t) {
    gpt_decoder_destroy(&t->decoder);
    sampler_destroy(&t->sampler);
    CUDA_CHECK(cudaFreeHost(t->logits_host));
    free(t->tokens);
}

// Prints "sample  <text>" of M tokens after `step`. The sampler's generator goes on from sample to
// sample (the whole run is reproducible from --seed).
static void training_sample(TrainingSampler* t, const Tokenizer* tok, long long step) {
    const int eot = GPT2_EOT_TOKEN;
    gpt_decoder_reset(&t->decoder);
    gpt_decoder_step(&t->decoder, &eot, 1);
    gpt_generate_tokens(&t->decoder, &t->sampler, t->M, t->tokens, t->logits_host);
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

// Each sample as text (or token ids without a token table) and its token ids.
static void generate_print_samples(const GenerateRun* g, const Tokenizer* tok, const int* out) {
    const int B = g->num_samples, P = g->prompt_len, M = g->tokens;
    for (int b = 0; b < B; b++) {
        printf("--- sample %d/%d\n", b + 1, B);
        gpt_print_tokens(tok, g->prompt, P, stdout);
        printf("%s", tok ? "" : " |");
        gpt_print_tokens(tok, out + (size_t)b * M, M, stdout);
        printf("\n");
        printf("tokens      ");
        for (int i = 0; i < M; i++) printf(" %d", out[(size_t)b * M + i]);
        printf("\n");
    }
    printf("---\n");
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

// Prefills the prompts, generates M tokens per sample into `out` (B, M), prints the samples and the speed.
static void generate_and_report(const GenerateRun* g, GPTDecoder* dec, const Tokenizer* tok, int vocab_size,
                                int padded_vocab_size, cudaStream_t stream) {
    const int B = g->num_samples, P = g->prompt_len, M = g->tokens;
    int* inputs = generate_upload_prompts(g);
    Sampler sampler;
    sampler_create(&sampler, g->temperature, g->top_k, g->seed, vocab_size);
    uint16_t* logits_host = NULL;
    CUDA_CHECK(cudaMallocHost((void**)&logits_host, (size_t)B * padded_vocab_size * sizeof(uint16_t)));
    int* out = (int*)malloc((size_t)B * M * sizeof(int));
    CUDA_CHECK(cudaDeviceSynchronize());

    const double t0 = generate_seconds();
    gpt_decoder_prefill(dec, inputs);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double t1 = generate_seconds();
    const double sampling = gpt_generate_tokens(dec, &sampler, M, out, logits_host);
    const double decode_s = generate_seconds() - t1;

    generate_print_samples(g, tok, out);
    printf("speed        prefill %d x %d tokens in %.1f ms; %d x %d new tokens in %.3f s: %.0f tokens/s (%.0f per "
           "sequence), %.2f ms per step, of which %.2f ms sampling on the host\n", B, P, (t1 - t0) * 1e3, B, M,
           decode_s, B * M / decode_s, M / decode_s, decode_s / M * 1e3, sampling / M * 1e3);
    free(out);
    CUDA_CHECK(cudaFreeHost(logits_host));
    sampler_destroy(&sampler);
    CUDA_CHECK(cudaFree(inputs));
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
    GPTModel model;
    const GPTModelOptions options = gpt_model_options(g->num_samples, g->prompt_len, g->attn, stream);
    if (gpt_model_create(&model, &config, &options) != 0) return 1;
    train_state_load_weights(path, g->init_from != NULL, &model);
    GPTDecoder dec;
    if (gpt_decoder_create(&dec, &model, g->num_samples, g->prompt_len + g->tokens - 1, 1) != 0) return 1;
    generate_and_report(g, &dec, tok, config.vocab_size, config.padded_vocab_size, stream);
    if (tok) tokenizer_free(&table);
    gpt_decoder_destroy(&dec);
    gpt_model_destroy(&model);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

#endif  // GPT_GENERATE_CUH
