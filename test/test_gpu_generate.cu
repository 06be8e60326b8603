// test_gpu_generate.cu: generation (layers/generate/gpt_decode.cuh, layers/generate/gpt_generate.cuh): the cached decode
// against the full forward, reproducible sampling, the sampler and the token table reader.
//
// A tiny GPT (L = 2, C = 128, NH = 2 so HD = 64, V = 200 padded to Vp = 256, maxT = 160) with GPT-2-like
// random bf16 weights (as test_gpu_gpt.cu draws them), B = 3 sequences of T = 151 random tokens (odd,
// three 64-key tiles of cache). References on the same weights and tokens: the fp64 CPU model
// (test/cpu_gpt.h) and the GPU training forward (gpt_model_forward, flash2), both over the whole
// sequence: the logits at position t depend on tokens 0..t only (causal), so they are the logits the
// cached decode must give after it has been fed tokens 0..t.
// Cases (relative errors ‖x − ref‖/‖ref‖ over the (B, Vp) logits of each step, all printed):
//   decode_after_prefill_*   prefill of P = 5 tokens (gpt_decoder_prefill, flash2), then decode steps
//                            of Tq = 1, 3, 16, 7, 2, 16, 1, ... new tokens per sequence up to T; after
//                            the prefill and after every step the logits match the references
//                            at the sequences' last position (≤ 2e-2), with the decode attention's own
//                            choice of splits and with 3 forced splits; the activations and the cache
//                            are poisoned (NaN) first, so an unwritten or wrongly read entry fails
//   decode_from_empty_cache  the same from an empty cache (the training samples' path): steps of
//                            Tq = 4, 1, 1, 9, ... from position 0
//   generation_repeats       gpt_generate_tokens with temperature 1, top-k 20 and a fixed seed gives
//                            the same tokens twice; another seed gives other tokens; temperature 0
//                            gives the argmax of each step's logits
// CPU cases (run everywhere): the sampler (greedy, top-k 1, the distribution of 20000 draws against the
// softmax, top-k excluding the rest, the same seed the same draws; the token table is test_tokenizer's).
// The seed comes from the clock unless TEST_SEED is set, and is printed.
#include <cuda_bf16.h>

#include "layers/generate/gpt_generate.cuh"
#include "test/cpu_gpt.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

#define TOL_LOGITS 2e-2

typedef struct {
    GPTConfig config;
    int B, T;
    size_t num_params;
    uint16_t* params_bf16;
    double* params;     // the same values, fp64
    int* tokens;        // (B, T)
    double* ref_cpu;    // (B, T, Vp) fp64 logits
    double* ref_gpu;    // (B, T, Vp) the GPU training forward's logits
} Problem;

// nkv: 2 (multi-head) or 1 (multi-query: both query heads share one K/V head).
static void problem_make(Problem* pb, uint64_t seed, int nkv) {
    GPTConfig c;
    c.num_layers = 2, c.channels = 128, c.num_heads = 2, c.num_kv_heads = nkv, c.vocab_size = 200;
    c.padded_vocab_size = gpt_round_up(c.vocab_size, VOCAB_PAD_MULTIPLE), c.max_seq_len = 160;
    pb->config = c;
    pb->B = 3, pb->T = 151;
    size_t sizes[NUM_PARAM_TENSORS];
    gpt_param_sizes(sizes, &c);
    pb->num_params = gpt_num_params(&c);
    pb->params = test_alloc(pb->num_params);
    pb->params_bf16 = (uint16_t*)calloc(pb->num_params, sizeof(uint16_t));
    TestRng rng = {seed};
    const double proj_scale = 0.02 / sqrt(2.0 * c.num_layers);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        double* x = pb->params + offset;
        const int ln_weight = GPT_PARAMS[i].init == INIT_ONES;
        const int ln_bias = i == GPT_LN1B || i == GPT_LN2B || i == GPT_LNFB;
        // larger weights than GPT-2's init so that attention is far from uniform (it must matter)
        const double scale = (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? proj_scale
                             : ln_weight                             ? 0.1
                             : ln_bias                               ? 0.05
                             : i == GPT_QKVW                         ? 0.08
                                                                     : 0.02;
        test_fill_normal(&rng, x, sizes[i], scale);
        for (size_t j = 0; j < sizes[i]; j++) {
            if (ln_weight) x[j] += 1.0;
            const uint16_t h = test_float_to_bf16((float)x[j]);
            pb->params_bf16[offset + j] = h;
            x[j] = test_bf16_to_float(h);
        }
        offset += sizes[i];
    }
    const int BT = pb->B * pb->T;
    pb->tokens = (int*)calloc(BT, sizeof(int));
    for (int i = 0; i < BT; i++) pb->tokens[i] = (int)(test_rng_next(&rng) % (uint64_t)c.vocab_size);

    // fp64 reference over the whole sequences
    const size_t n_logits = (size_t)BT * c.padded_vocab_size;
    pb->ref_cpu = test_alloc(n_logits);
    CpuGPT cpu;
    if (cpu_gpt_create(&cpu, c, pb->B, pb->T) != 0) {
        fprintf(stderr, "test: out of host memory for the CPU model\n");
        exit(2);
    }
    memcpy(cpu.params, pb->params, pb->num_params * sizeof(double));
    cpu_gpt_forward(&cpu, pb->tokens, pb->tokens);
    memcpy(pb->ref_cpu, cpu.logits, n_logits * sizeof(double));
    cpu_gpt_destroy(&cpu);
}

static void problem_free(Problem* pb) {
    free(pb->params), free(pb->params_bf16), free(pb->tokens), free(pb->ref_cpu), free(pb->ref_gpu);
}

static int* upload_ints(const int* host, size_t n) {
    int* d = (int*)device_alloc(n * sizeof(int));
    CUDA_CHECK(cudaMemcpy(d, host, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

// A GPU model of the problem's weights sized (B, T).
static void model_make(GPTModel* m, const Problem* pb, int T, cudaStream_t stream) {
    const GPTModelOptions options = gpt_model_options(pb->B, T, ATTN_FLASH2, stream);
    if (gpt_model_create(m, &pb->config, &options) != 0) {
        fprintf(stderr, "test: gpt_model_create failed\n");
        exit(2);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(m->params, pb->params_bf16, pb->num_params * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(m->acts_memory, 0xFF, m->memory.act_bytes));
}

static void download_logits(double* out, const __nv_bfloat16* dev, size_t n) {
    uint16_t* h = (uint16_t*)host_alloc(n * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(h, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) out[i] = test_bf16_to_float(h[i]);
    free(h);
}

// The GPU training forward's logits over the whole sequences, into pb->ref_gpu.
static void gpu_full_forward(Problem* pb, cudaStream_t stream) {
    GPTModel m;
    model_make(&m, pb, pb->T, stream);
    int* d_tokens = upload_ints(pb->tokens, (size_t)pb->B * pb->T);
    gpt_model_forward(&m, d_tokens, d_tokens);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const size_t n = (size_t)pb->B * pb->T * pb->config.padded_vocab_size;
    pb->ref_gpu = test_alloc(n);
    download_logits(pb->ref_gpu, m.logits, n);
    CUDA_CHECK(cudaFree(d_tokens));
    gpt_model_destroy(&m);
}

// The decoder's (B, Vp) logits against both references at position `pos` of every sequence; returns
// the larger error, and adds a problem when it is over the bound or not finite.
static double check_step(const Problem* pb, const GPTDecoder* d, int pos, char* problems, size_t size,
                         double* worst_gpu) {
    const int B = pb->B, T = pb->T, Vp = pb->config.padded_vocab_size;
    double* got = test_alloc((size_t)B * Vp);
    double* ref_cpu = test_alloc((size_t)B * Vp);
    double* ref_gpu = test_alloc((size_t)B * Vp);
    download_logits(got, d->logits, (size_t)B * Vp);
    for (int b = 0; b < B; b++) {
        memcpy(ref_cpu + (size_t)b * Vp, pb->ref_cpu + ((size_t)b * T + pos) * Vp, Vp * sizeof(double));
        memcpy(ref_gpu + (size_t)b * Vp, pb->ref_gpu + ((size_t)b * T + pos) * Vp, Vp * sizeof(double));
    }
    const double e_cpu = test_rel_error(got, ref_cpu, (size_t)B * Vp);
    const double e_gpu = test_rel_error(got, ref_gpu, (size_t)B * Vp);
    if (!(e_cpu <= TOL_LOGITS) || !(e_gpu <= TOL_LOGITS))
        add_problem(problems, size, "position %d: rel err %.3e vs fp64, %.3e vs the GPU forward (> %.0e)", pos, e_cpu,
                    e_gpu, TOL_LOGITS);
    if (e_gpu > *worst_gpu || e_gpu != e_gpu) *worst_gpu = e_gpu;
    free(got), free(ref_cpu), free(ref_gpu);
    return e_cpu;
}

static void poison_decoder(GPTDecoder* d) {
    const KVCache* c = &d->cache;
    const size_t cache_bytes = (size_t)c->L * kv_cache_layer_elems(c) * sizeof(__nv_bfloat16);
    CUDA_CHECK(cudaMemset(c->k, 0xFF, cache_bytes));
    CUDA_CHECK(cudaMemset(c->v, 0xFF, cache_bytes));
    CUDA_CHECK(cudaMemset(d->x, 0xFF, (size_t)d->B * d->max_tq * d->model->C * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMemset(d->logits, 0xFF, (size_t)d->B * d->model->Vp * sizeof(__nv_bfloat16)));
}

// Feeds tokens [start, T) of every sequence in steps of the sizes in `steps` (cycled), checking
// every step. Returns the largest error against the fp64 model.
static double decode_rest(const Problem* pb, GPTDecoder* d, int start, const int* steps, int num_steps,
                          char* problems, size_t size, double* worst_gpu, int* count) {
    const int B = pb->B, T = pb->T;
    int* chunk = (int*)host_alloc((size_t)B * DECODE_MAX_QUERY_TOKENS * sizeof(int));
    double worst = 0.0;
    for (int pos = start, i = 0; pos < T; i++) {
        int tq = steps[i % num_steps];
        if (tq > T - pos) tq = T - pos;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < tq; t++) chunk[b * tq + t] = pb->tokens[(size_t)b * T + pos + t];
        gpt_decoder_step(d, chunk, tq);
        pos += tq;
        const double e = check_step(pb, d, pos - 1, problems, size, worst_gpu);
        if (e > worst || e != e) worst = e;
        (*count)++;
    }
    free(chunk);
    return worst;
}

// ---- the GPU cases: per K/V head count, the case names in the order they run -------------------------

static const int NKV[] = {2, 1};  // multi-head, then multi-query
#define GPU_CASES_PER_NKV 4

static void gpu_case_name(char* buf, size_t size, int nkv, int k) {
    if (k < 2)
        snprintf(buf, size, "decode_after_prefill_L2_C128_NH2_NKV%d_B3_T151_%s", nkv,
                 k == 0 ? "auto_splits" : "3_splits");
    else if (k == 2)
        snprintf(buf, size, "decode_from_empty_cache_L2_C128_NH2_NKV%d_B3_T151", nkv);
    else
        snprintf(buf, size, "generation_repeats_with_a_seed_NKV%d_B3_P7_M60", nkv);
}

static void decode_after_prefill_case(const Problem* pb, int splits, cudaStream_t stream) {
    char name[128];
    gpu_case_name(name, sizeof(name), pb->config.num_kv_heads, splits ? 1 : 0);
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    const int P = 5;
    GPTModel m;
    model_make(&m, pb, P, stream);
    GPTDecoder d;
    if (gpt_decoder_create(&d, &m, pb->B, pb->T, DECODE_MAX_QUERY_TOKENS) != 0) {
        test_fail(name, "gpt_decoder_create failed (see above)");
        g_running_case[0] = 0;  // reported: the exit report must not count it again
        gpt_model_destroy(&m);
        return;
    }
    d.splits_override = splits;
    poison_decoder(&d);
    int* prompt = (int*)host_alloc((size_t)pb->B * P * sizeof(int));
    for (int b = 0; b < pb->B; b++) memcpy(prompt + b * P, pb->tokens + (size_t)b * pb->T, P * sizeof(int));
    int* d_prompt = upload_ints(prompt, (size_t)pb->B * P);
    char problems[2048] = "";
    double worst_gpu = 0.0;
    gpt_decoder_prefill(&d, d_prompt);
    sync_or_die(stream, name, "prefill");
    double worst = check_step(pb, &d, P - 1, problems, sizeof(problems), &worst_gpu);
    const int steps[] = {1, 3, 16, 7, 2, 16, 1, 5, 11};
    int count = 1;
    const double e = decode_rest(pb, &d, P, steps, (int)COUNT(steps), problems, sizeof(problems), &worst_gpu, &count);
    sync_or_die(stream, name, "decode steps");
    if (e > worst || e != e) worst = e;
    printf("  %s: %d checks, largest rel err %.3e vs fp64, %.3e vs the GPU forward\n", name, count, worst, worst_gpu);
    test_report(name, problems[0] == 0, "%s", problems);
    g_running_case[0] = 0;
    CUDA_CHECK(cudaFree(d_prompt));
    free(prompt);
    gpt_decoder_destroy(&d);
    gpt_model_destroy(&m);
}

static void decode_from_empty_case(const Problem* pb, cudaStream_t stream) {
    char name[128];
    gpu_case_name(name, sizeof(name), pb->config.num_kv_heads, 2);
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    GPTModel m;
    model_make(&m, pb, 1, stream);
    GPTDecoder d;
    if (gpt_decoder_create(&d, &m, pb->B, pb->T, DECODE_MAX_QUERY_TOKENS) != 0) {
        test_fail(name, "gpt_decoder_create failed (see above)");
        g_running_case[0] = 0;  // reported: the exit report must not count it again
        gpt_model_destroy(&m);
        return;
    }
    poison_decoder(&d);
    char problems[2048] = "";
    double worst_gpu = 0.0;
    int count = 0;
    const int steps[] = {4, 1, 1, 9, 16, 3};
    const double worst = decode_rest(pb, &d, 0, steps, (int)COUNT(steps), problems, sizeof(problems), &worst_gpu,
                                     &count);
    sync_or_die(stream, name, "decode steps");
    printf("  %s: %d checks, largest rel err %.3e vs fp64, %.3e vs the GPU forward\n", name, count, worst, worst_gpu);
    test_report(name, problems[0] == 0, "%s", problems);
    g_running_case[0] = 0;
    gpt_decoder_destroy(&d);
    gpt_model_destroy(&m);
}

// Prefill of P tokens, then M tokens per sequence with the sampler.
static void generate_once(const Problem* pb, GPTDecoder* d, const int* d_prompt, double temperature, int top_k,
                          uint64_t seed, int M, int* out, uint16_t* logits_host) {
    Sampler s;
    sampler_create(&s, temperature, top_k, seed, pb->config.vocab_size);
    gpt_decoder_reset(d);
    gpt_decoder_prefill(d, d_prompt);
    gpt_generate_tokens(d, &s, M, out, logits_host);
    sampler_destroy(&s);
}

static void generation_repeats_case(const Problem* pb, uint64_t seed, cudaStream_t stream) {
    char name[128];
    gpu_case_name(name, sizeof(name), pb->config.num_kv_heads, 3);
    snprintf(g_running_case, sizeof(g_running_case), "%s", name);
    const int P = 7, M = 60, B = pb->B, Vp = pb->config.padded_vocab_size;
    GPTModel m;
    model_make(&m, pb, P, stream);
    GPTDecoder d;
    if (gpt_decoder_create(&d, &m, B, P + M - 1, 1) != 0) {
        test_fail(name, "gpt_decoder_create failed (see above)");
        g_running_case[0] = 0;  // reported: the exit report must not count it again
        gpt_model_destroy(&m);
        return;
    }
    int* prompt = (int*)host_alloc((size_t)B * P * sizeof(int));
    for (int b = 0; b < B; b++) memcpy(prompt + b * P, pb->tokens + (size_t)b * pb->T, P * sizeof(int));
    int* d_prompt = upload_ints(prompt, (size_t)B * P);
    uint16_t* logits_host = NULL;
    CUDA_CHECK(cudaMallocHost((void**)&logits_host, (size_t)B * Vp * sizeof(uint16_t)));
    int *a = (int*)host_alloc((size_t)B * M * sizeof(int)), *b2 = (int*)host_alloc((size_t)B * M * sizeof(int)),
        *c = (int*)host_alloc((size_t)B * M * sizeof(int));
    generate_once(pb, &d, d_prompt, 1.0, 20, seed, M, a, logits_host);
    generate_once(pb, &d, d_prompt, 1.0, 20, seed, M, b2, logits_host);
    generate_once(pb, &d, d_prompt, 1.0, 20, seed ^ 0x5555u, M, c, logits_host);
    char problems[1024] = "";
    if (memcmp(a, b2, (size_t)B * M * sizeof(int)) != 0) add_problem(problems, sizeof(problems), "two runs with seed %llu differ", (unsigned long long)seed);
    if (memcmp(a, c, (size_t)B * M * sizeof(int)) == 0) add_problem(problems, sizeof(problems), "another seed gave the same tokens");
    int bad_range = 0;
    for (int i = 0; i < B * M; i++) bad_range += a[i] < 0 || a[i] >= pb->config.vocab_size;
    if (bad_range) add_problem(problems, sizeof(problems), "%d tokens outside [0, V)", bad_range);
    // greedy: every token is the argmax of the logits after the previous one
    Sampler greedy;
    sampler_create(&greedy, 0.0, 0, seed, pb->config.vocab_size);
    gpt_decoder_reset(&d);
    gpt_decoder_prefill(&d, d_prompt);
    int mismatches = 0, next[16];
    for (int i = 0; i < 8; i++) {
        if (i > 0) gpt_decoder_step(&d, next, 1);
        CUDA_CHECK(cudaMemcpy(logits_host, d.logits, (size_t)B * Vp * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        for (int s = 0; s < B; s++) {
            const uint16_t* row = logits_host + (size_t)s * Vp;
            int arg = 0;
            for (int v = 1; v < pb->config.vocab_size; v++)
                if (test_bf16_to_float(row[v]) > test_bf16_to_float(row[arg])) arg = v;
            next[s] = sampler_pick(&greedy, row, pb->config.vocab_size);
            mismatches += next[s] != arg;
        }
    }
    if (mismatches) add_problem(problems, sizeof(problems), "greedy picked %d tokens that are not the argmax", mismatches);
    sync_or_die(stream, name, "generation");
    printf("  %s: first tokens of sequence 0:", name);
    for (int i = 0; i < 12; i++) printf(" %d", a[i]);
    printf("\n");
    test_report(name, problems[0] == 0, "%s", problems);
    g_running_case[0] = 0;
    sampler_destroy(&greedy);
    free(a), free(b2), free(c), free(prompt);
    CUDA_CHECK(cudaFreeHost(logits_host));
    CUDA_CHECK(cudaFree(d_prompt));
    gpt_decoder_destroy(&d);
    gpt_model_destroy(&m);
}

// ---- CPU cases ----------------------------------------------------------------------------------------

// The named cases of sampler_cases.
#define SAMPLER_CASES 3

static void sampler_cases(uint64_t seed) {
    const int V = 5;
    uint16_t logits[V];
    const double p[V] = {0.5, 0.25, 0.125, 0.0625, 0.0625};
    for (int i = 0; i < V; i++) logits[i] = test_float_to_bf16((float)log(p[i]) + 3.0f);  // softmax is p
    Sampler s;
    sampler_create(&s, 0.0, 0, seed, V);
    int ok = sampler_pick(&s, logits, V) == 0;
    sampler_destroy(&s);
    sampler_create(&s, 1.0, 1, seed, V);
    for (int i = 0; i < 100; i++) ok &= sampler_pick(&s, logits, V) == 0;
    sampler_destroy(&s);
    test_report("sampler_greedy_and_top_k_1_pick_the_largest", ok, "a draw was not token 0");

    // 20000 draws at temperature 1: frequencies within 0.015 of p (about 5 standard deviations)
    const int n = 20000;
    int counts[V] = {0}, counts2[V] = {0};
    sampler_create(&s, 1.0, 0, seed, V);
    for (int i = 0; i < n; i++) counts[sampler_pick(&s, logits, V)]++;
    sampler_destroy(&s);
    char problems[512] = "";
    for (int i = 0; i < V; i++)
        if (fabs(counts[i] / (double)n - p[i]) > 0.015)
            add_problem(problems, sizeof(problems), "token %d drawn %.4f of the time, want %.4f", i, counts[i] / (double)n, p[i]);
    test_report("sampler_draws_follow_the_softmax", problems[0] == 0, "%s", problems);

    // top-k 2: only tokens 0 and 1, in the ratio 2:1; the same seed draws the same sequence
    problems[0] = 0;
    sampler_create(&s, 1.0, 2, seed, V);
    for (int i = 0; i < n; i++) counts2[sampler_pick(&s, logits, V)]++;
    sampler_destroy(&s);
    if (counts2[2] + counts2[3] + counts2[4]) add_problem(problems, sizeof(problems), "top-k 2 drew tokens outside the top 2");
    if (fabs(counts2[0] / (double)n - 2.0 / 3.0) > 0.015) add_problem(problems, sizeof(problems), "top-k 2: token 0 drawn %.4f of the time, want 0.6667", counts2[0] / (double)n);
    Sampler s1, s2;
    sampler_create(&s1, 0.7, 3, seed, V);
    sampler_create(&s2, 0.7, 3, seed, V);
    for (int i = 0; i < 1000; i++)
        if (sampler_pick(&s1, logits, V) != sampler_pick(&s2, logits, V)) {
            add_problem(problems, sizeof(problems), "the same seed gave another draw at %d", i);
            break;
        }
    sampler_destroy(&s1), sampler_destroy(&s2);
    test_report("sampler_top_k_and_seed", problems[0] == 0, "%s", problems);
}

int main(void) {
    test_begin();
    test_plan(SAMPLER_CASES + (int)COUNT(NKV) * GPU_CASES_PER_NKV);  // the same without a GPU: skipped there
    atexit(report_exit_during_case);
    const uint64_t seed = pick_and_print_seed();
    sampler_cases(seed);

    const GpuInfo gpu = gpu_info(0);
    const char* skip_why = gpu_skip_reason(&gpu, "the model");
    if (skip_why) {
        char name[128];
        for (size_t i = 0; i < COUNT(NKV); i++)
            for (int k = 0; k < GPU_CASES_PER_NKV; k++) {
                gpu_case_name(name, sizeof(name), NKV[i], k);
                test_skip(name, skip_why);
            }
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs; bound: logits rel err %.0e per step\n", gpu.name, gpu.major, gpu.minor,
           gpu.num_sms, TOL_LOGITS);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    for (size_t i = 0; i < COUNT(NKV); i++) {  // the GPU_CASES_PER_NKV cases, in gpu_case_name's order
        Problem pb;
        memset(&pb, 0, sizeof(pb));
        problem_make(&pb, seed, NKV[i]);
        gpu_full_forward(&pb, stream);
        decode_after_prefill_case(&pb, 0, stream);
        decode_after_prefill_case(&pb, 3, stream);
        decode_from_empty_case(&pb, stream);
        generation_repeats_case(&pb, seed, stream);
        problem_free(&pb);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return test_end();
}
