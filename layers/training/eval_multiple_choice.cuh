// eval_multiple_choice.cuh: scores a multiple-choice eval file (data/eval_file.h: HellaSwag and the
// like) with the model, llm.c's way: every completion after its context in a row of its own, the
// model's per-token losses over the completion's tokens summed, and the completion with the lowest
// mean loss is the answer (acc_norm; the lowest sum: acc).
//
// The rows go through the model's own forward, B rows of T positions at a time (the micro batch it
// was built for, so no memory beyond training's), and only the (B, T) fp32 losses come back to the
// host. With several GPUs each rank scores examples rank, rank + world, ...; the caller sums the
// counts (an all-reduce), so the accuracy is that of the whole file.
#ifndef EVAL_MULTIPLE_CHOICE_CUH
#define EVAL_MULTIPLE_CHOICE_CUH

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "data/eval_file.h"
#include "layers/cuda_common.h"
#include "layers/model/gpt_model.cuh"

typedef struct {
    long long examples, correct_by_mean, correct_by_sum;  // this rank's
    double seconds;
} EvalScore;

// The host side of one pass: the batch being filled and the example being scored.
typedef struct {
    const EvalFile* file;
    GPTModel* model;
    int *inputs_dev, *targets_dev;  // (B, T) on the GPU
    int *inputs, *targets;          // (B, T) host
    float* losses;                  // (B, T) host, pinned
    EvalRowSpan* spans;             // B: the rows filled so far
    int rows;
    double loss_sum[EVAL_MAX_COMPLETIONS];  // the current example's completions
    FILE* detail;                   // one JSON line per example, or NULL
    EvalScore* score;
} EvalPass;

// The completion's loss: the sum of its tokens' losses in the row.
static double eval_span_loss(const float* row_losses, const EvalRowSpan* s) {
    double sum = 0.0;
    for (int t = s->start; t < s->start + s->len; t++) sum += row_losses[t];
    return sum;
}

// Counts example e once all its completions are scored (and writes its detail line).
static void eval_finish_example(EvalPass* ps, int e) {
    const EvalExample* ex = &ps->file->examples[e];
    int by_mean, by_sum;
    eval_choose(ex, ps->loss_sum, &by_mean, &by_sum);
    ps->score->examples++;
    ps->score->correct_by_mean += by_mean == ex->label;
    ps->score->correct_by_sum += by_sum == ex->label;
    if (!ps->detail) return;
    fprintf(ps->detail, "{\"example\": %d, \"label\": %d, \"pred_norm\": %d, \"pred\": %d, \"loss_mean\": [", e,
            ex->label, by_mean, by_sum);
    for (int c = 0; c < ex->num_completions; c++)
        fprintf(ps->detail, "%s%.6f", c ? ", " : "", ps->loss_sum[c] / ex->completion_len[c]);
    fprintf(ps->detail, "], \"tokens\": [");
    for (int c = 0; c < ex->num_completions; c++) fprintf(ps->detail, "%s%d", c ? ", " : "", ex->completion_len[c]);
    fprintf(ps->detail, "]}\n");
}

// Runs the forward over the filled rows (the rest padded) and scores them in order.
static void eval_flush(EvalPass* ps) {
    if (ps->rows == 0) return;
    GPTModel* m = ps->model;
    const int B = m->B, T = m->T;
    for (int i = ps->rows * T; i < B * T; i++) ps->inputs[i] = ps->targets[i] = EVAL_PAD_TOKEN;
    CUDA_CHECK(cudaMemcpyAsync(ps->inputs_dev, ps->inputs, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice,
                               m->stream));
    CUDA_CHECK(cudaMemcpyAsync(ps->targets_dev, ps->targets, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice,
                               m->stream));
    gpt_model_forward(m, ps->inputs_dev, ps->targets_dev);
    CUDA_CHECK(cudaMemcpyAsync(ps->losses, m->losses, (size_t)B * T * sizeof(float), cudaMemcpyDeviceToHost,
                               m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    for (int r = 0; r < ps->rows; r++) {
        const EvalRowSpan* s = &ps->spans[r];
        ps->loss_sum[s->completion] = eval_span_loss(ps->losses + (size_t)r * T, s);
        if (s->completion == ps->file->examples[s->example].num_completions - 1) eval_finish_example(ps, s->example);
    }
    ps->rows = 0;
}

// Scores this rank's share of the first `limit` examples (0: all) into *score; the model's B, T set
// the rows per forward and their length (a completion longer than T was refused by the caller,
// eval_check_fits in data/eval_file.h). `detail`: one JSON line per example, or NULL.
static void eval_multiple_choice(const EvalFile* file, GPTModel* model, int* inputs_dev, int* targets_dev, int rank,
                                 int world, int limit, FILE* detail, EvalScore* score) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memset(score, 0, sizeof(*score));
    const int B = model->B, T = model->T, n = limit > 0 && limit < file->num_examples ? limit : file->num_examples;
    EvalPass ps;
    memset(&ps, 0, sizeof(ps));
    ps.file = file, ps.model = model, ps.inputs_dev = inputs_dev, ps.targets_dev = targets_dev;
    ps.detail = detail, ps.score = score;
    CUDA_CHECK(cudaMallocHost(&ps.inputs, (size_t)B * T * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&ps.targets, (size_t)B * T * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&ps.losses, (size_t)B * T * sizeof(float)));
    ps.spans = (EvalRowSpan*)malloc((size_t)B * sizeof(EvalRowSpan));
    for (int e = rank; e < n; e += world)
        for (int c = 0; c < file->examples[e].num_completions; c++) {
            const size_t at = (size_t)ps.rows * T;
            ps.spans[ps.rows++] = eval_fill_row(file, e, c, T, ps.inputs + at, ps.targets + at);
            if (ps.rows == B) eval_flush(&ps);
        }
    eval_flush(&ps);
    CUDA_CHECK(cudaFreeHost(ps.inputs));
    CUDA_CHECK(cudaFreeHost(ps.targets));
    CUDA_CHECK(cudaFreeHost(ps.losses));
    free(ps.spans);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    score->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

#endif  // EVAL_MULTIPLE_CHOICE_CUH
