// gpt_generator.cuh: drawing tokens one by one without host round trips. Each token after the first
// is one decode step (gpt_decode.cuh) and one draw (gpt_sample.cuh), captured once as a CUDA graph
// and replayed per token: the step reads its input token (written by the previous draw), the cache
// lengths (advanced by the step) and the random counters (advanced by the draw) from device memory,
// so one capture serves every position. The drawn tokens go to a ring on the GPU, (GEN_RING_ROWS, B),
// and from there to pinned host memory every GEN_CHUNK tokens (an asynchronous copy and an event):
// the host waits for a chunk while the GPU works on the next one, never once per token.
//
// The first token is drawn from the logits the decoder holds (after a prefill or a step); the second
// comes from an uncaptured step (it makes the GEMMs' one-time choices and the kernels' attribute
// settings, which must not happen during a capture); the graph is captured then, kept while the
// decoder, the settings and the stream stay, and replayed from the third token on.
// GPT_GENERATE_GRAPH=0 in the environment runs every step uncaptured (the same launches one by one).
#ifndef GPT_GENERATOR_CUH
#define GPT_GENERATOR_CUH

#include "layers/generate/gpt_decode.cuh"
#include "layers/generate/gpt_sample.cuh"
#include "layers/generate/decode_trace.cuh"

#define GEN_CHUNK 32                 // tokens per copy to the host
#define GEN_RING_ROWS (2 * GEN_CHUNK)  // the ring holds the chunk being copied and the one being drawn

typedef struct {
    GPTDecoder* dec;  // borrowed
    GenSampling sampling;
    unsigned long long* counters;  // (B) on the GPU: tokens drawn per sequence (random counter, ring row)
    unsigned long long drawn;      // the same on the host (every sequence draws every time)
    int* ring;                     // (GEN_RING_ROWS, B) on the GPU
    int* ring_host;                // pinned (GEN_RING_ROWS, B)
    cudaEvent_t copied[2];         // a chunk's copy to ring_host is done (one per half of the ring)
    int use_graph;                 // 0: every step uncaptured
    cudaGraphExec_t graph;         // the captured step + draw, or NULL
    GenSampling graph_sampling;    // the settings captured in it
    cudaEvent_t steady[2];         // around tokens 2 .. M−1 of the last gpt_generate_tokens
    float steady_ms;               // their time (0 when M < 3): the replayed steps alone
    int steady_steps;              // M − 2
} GPTGenerator;

// A chunk of drawn tokens as they arrive: tokens (n, B) row-major (token `first + i` of sequence b at
// i·B + b). Returns nothing; may print.
typedef void (*GenChunkFn)(void* user, const int* tokens, int first, int n, int B);

static void gpt_generator_create(GPTGenerator* g, GPTDecoder* dec, double temperature, int top_k, uint64_t seed) {
    memset(g, 0, sizeof(*g));
    g->dec = dec;
    g->sampling = gen_sampling(temperature, top_k, seed);
    const size_t B = dec->B;
    CUDA_CHECK(cudaMalloc((void**)&g->counters, B * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemsetAsync(g->counters, 0, B * sizeof(unsigned long long), dec->model->stream));
    CUDA_CHECK(cudaMalloc((void**)&g->ring, GEN_RING_ROWS * B * sizeof(int)));
    CUDA_CHECK(cudaMallocHost((void**)&g->ring_host, GEN_RING_ROWS * B * sizeof(int)));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventCreateWithFlags(&g->copied[i], cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventCreate(&g->steady[i]));
    const char* env = getenv("GPT_GENERATE_GRAPH");
    // the legacy default stream cannot be captured
    g->use_graph = dec->model->stream != NULL && !(env && strcmp(env, "0") == 0);
}

static void gpt_generator_destroy(GPTGenerator* g) {
    if (g->graph) CUDA_CHECK(cudaGraphExecDestroy(g->graph));
    for (int i = 0; i < 2; i++) {
        if (g->copied[i]) CUDA_CHECK(cudaEventDestroy(g->copied[i]));
        if (g->steady[i]) CUDA_CHECK(cudaEventDestroy(g->steady[i]));
    }
    if (g->ring_host) CUDA_CHECK(cudaFreeHost(g->ring_host));
    if (g->ring) CUDA_CHECK(cudaFree(g->ring));
    if (g->counters) CUDA_CHECK(cudaFree(g->counters));
    memset(g, 0, sizeof(*g));
}

// New settings; the random counters start again at 0 when `restart` (the same seed then repeats its
// draws), else they go on (the samples during training: every sample draws new numbers).
static void gpt_generator_set(GPTGenerator* g, double temperature, int top_k, uint64_t seed, int restart) {
    g->sampling = gen_sampling(temperature, top_k, seed);
    if (restart) {
        CUDA_CHECK(cudaMemsetAsync(g->counters, 0, (size_t)g->dec->B * sizeof(unsigned long long),
                                   g->dec->model->stream));
        g->drawn = 0;
    }
}

// The draw from d->logits into d->tokens and the ring.
static void gpt_generator_draw(GPTGenerator* g) {
    const GPTDecoder* d = g->dec;
    gen_sample(d->logits, d->B, d->model->Vp, d->model->V, g->sampling, g->counters, d->tokens, g->ring,
               GEN_RING_ROWS, d->model->stream);
}

// Captures one step on the previous draw and the next draw into g->graph.
static void gpt_generator_capture(GPTGenerator* g) {
    cudaStream_t s = g->dec->model->stream;
    if (g->graph) CUDA_CHECK(cudaGraphExecDestroy(g->graph));
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    gpt_decoder_forward_tokens(g->dec, 1);
    gpt_generator_draw(g);
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&g->graph, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    g->graph_sampling = g->sampling;
}

// Whether g->graph holds the step with the current settings.
static int gpt_generator_graph_ready(const GPTGenerator* g) {
    return g->graph && memcmp(&g->graph_sampling, &g->sampling, sizeof(g->sampling)) == 0;
}

// Before token 2: the capture, when the graph is used and not ready (after token 1's uncaptured step).
static void gpt_generator_step_prepare(GPTGenerator* g) {
    if (g->use_graph && !gpt_generator_graph_ready(g)) gpt_generator_capture(g);
}

// Token i ≥ 1: a step on token i − 1 and the draw of token i: uncaptured while the graph is not
// ready (token 1 makes the one-time choices), replayed from the graph after.
static void gpt_generator_step(GPTGenerator* g) {
    GPTDecoder* d = g->dec;
    gpt_decoder_count(d, 0, d->B, 1);
    if (!g->use_graph || !gpt_generator_graph_ready(g)) {
        gpt_decoder_forward_tokens(d, 1);
        gpt_generator_draw(g);
        return;
    }
    decode_trace_replay(d->model->stream, 1);  // nothing unless built with -DKERNEL_TRACE
    CUDA_CHECK(cudaGraphLaunch(g->graph, d->model->stream));
    decode_trace_replay(d->model->stream, 0);
}

// Copies ring rows of tokens [first, first + n) (within one half of the ring) to the host; the event
// of that half says when they are there.
static void gpt_generator_copy_chunk(GPTGenerator* g, unsigned long long first, int n) {
    const size_t B = g->dec->B, row = (size_t)(first % GEN_RING_ROWS);
    CUDA_CHECK(cudaMemcpyAsync(g->ring_host + row * B, g->ring + row * B, (size_t)n * B * sizeof(int),
                               cudaMemcpyDeviceToHost, g->dec->model->stream));
    CUDA_CHECK(cudaEventRecord(g->copied[row / GEN_CHUNK], g->dec->model->stream));
}

// Waits for a chunk's copy and hands its tokens to out (B, M) and to `fn` (when not NULL).
static void gpt_generator_deliver(GPTGenerator* g, unsigned long long first, int n, int first_i, int M, int* out,
                                  GenChunkFn fn, void* user) {
    const int B = g->dec->B;
    const size_t row = (size_t)(first % GEN_RING_ROWS);
    CUDA_CHECK(cudaEventSynchronize(g->copied[row / GEN_CHUNK]));
    const int* tokens = g->ring_host + row * B;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < B; b++) out[(size_t)b * M + first_i + i] = tokens[(size_t)i * B + b];
    if (fn) fn(user, tokens, first_i, n, B);
}

// Draws M tokens per sequence into out (B, M) on the host: the first from the logits the decoder
// holds (after a prefill or a step), each further one after a decode step on the previous. fn (may
// be NULL) sees every GEN_CHUNK tokens as soon as they are on the host. Returns when all are there,
// with g->steady_ms the GPU time of tokens 2 .. M−1 (the replayed steps, after the capture).
static void gpt_generate_tokens(GPTGenerator* g, int M, int* out, GenChunkFn fn, void* user) {
    cudaStream_t s = g->dec->model->stream;
    unsigned long long pending_first = 0;
    int pending_n = 0, pending_i = 0, chunk_i = 0;
    // chunks are aligned to the ring's halves: a chunk ends where the counter reaches a multiple of GEN_CHUNK
    for (int i = 0; i < M; i++) {
        if (i == 0) gpt_generator_draw(g);
        else {
            if (i == 2) gpt_generator_step_prepare(g), CUDA_CHECK(cudaEventRecord(g->steady[0], s));
            gpt_generator_step(g);
        }
        if (i == M - 1 && M > 2) CUDA_CHECK(cudaEventRecord(g->steady[1], s));
        g->drawn++;
        if (g->drawn % GEN_CHUNK != 0 && i != M - 1) continue;
        const int n = i + 1 - chunk_i;
        gpt_generator_copy_chunk(g, g->drawn - n, n);
        if (pending_n) gpt_generator_deliver(g, pending_first, pending_n, pending_i, M, out, fn, user);
        pending_first = g->drawn - n, pending_n = n, pending_i = chunk_i;
        chunk_i = i + 1;
    }
    if (pending_n) gpt_generator_deliver(g, pending_first, pending_n, pending_i, M, out, fn, user);
    g->steady_ms = 0.0f, g->steady_steps = M > 2 ? M - 2 : 0;
    if (M > 2) CUDA_CHECK(cudaEventElapsedTime(&g->steady_ms, g->steady[0], g->steady[1]));
}

#endif  // GPT_GENERATOR_CUH
