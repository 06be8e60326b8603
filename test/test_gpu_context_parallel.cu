// test_gpu_context_parallel.cu: attention over a context-parallel group of N ranks
// (layers/context_parallel/ring_attention.cuh: the zigzag split, K/V around a ring of NCCL send/recv,
// flash2 on every block, partial outputs merged by their LSE in fp32) against flash2 on the whole
// sequence on one GPU.
//
// For N = 1, 2 and 4 (N forked processes, one per GPU, meeting through the file rendezvous of
// layers/multi_gpu/launcher.h on a non-blocking NCCL communicator, as train_gpt's), each rank:
//   - runs flash2 forward and backward on the whole sequence (T tokens) from the same seeded inputs
//     (drawn once in the parent, before the fork), and measures its error against the fp64 reference
//     (test/cpu_reference.h, also computed once in the parent): e_X for X = out, lse, dq, dk, dv;
//   - runs the ring's forward and backward on its T/N tokens (the zigzag scatter of the same inputs),
//     into outputs poisoned with NaN first, so an element never written fails;
//   - compares its out, lse, dq, dk, dv with flash2's at the same global positions.
// Bound: ‖ring − flash2‖/‖flash2‖ <= 3·e_X (lse: its largest error in nats over 1 + the rms of the
// LSE, as test_gpu_attention measures it, <= 3·e_lse + 2N·2^-20). Why: the ring's blocks are the same
// flash2 kernels on parts of the keys, so their arithmetic errs as flash2's (<= e_X against fp64);
// attention.h gives each block's partial output (backward: partial dq, dk, dv) in bf16, one more
// rounding of the size flash2's own final rounding, before the fp32 merge: the ring's error against
// fp64 is <= 2·e_X, and with flash2's own e_X the two differ by <= 3·e_X (triangle inequality). The
// LSE merge adds fp32 log/exp roundings, a few ulps of an LSE below 10 per merged block (at most 2N
// blocks per row): 2N·2^-20. Every error and bound is printed.
// Shapes (T the same for every N, so one fp64 reference serves all; chunks of T/(2N) tokens are no
// multiple of flash2's tiles): multi-head hd 64 causal and not (B 2, NH 4, T 600: chunks of 300, 150,
// 75), GQA NH 8 / NKV 2 hd 128 causal (B 1, T 456), MQA NH 8 / NKV 1 hd 80 not causal (B 2, T 200: 25
// tokens a chunk at N = 4). Packed (B, T, NH + 2·NKV, HD) q/k/v and dq/dk/dv for the first two, plain
// separate tensors for the others.
// Planted errors, on the first shape: the last rank's two chunks swapped in its inputs, and the last
// rank leaving out one block (its late query chunk against the early key chunk at the last ring step,
// visible at every N): each of out, lse, dq, dk, dv must fail its bound on some rank.
// One case needs no GPU: a length that is not a multiple of 2N is refused, before any GPU work, with a
// message that says what to use (ring_attention_create in a forked process).
// Skipped, and counted: every case in a build without NCCL, the N-rank cases with fewer than N GPUs.
// NCCL_NVLS_ENABLE=0 unless set otherwise. TEST_SEED repeats a run's inputs.
#include <cuda_bf16.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "attention/attention.h"
#include "layers/context_parallel/zigzag.h"
#include "test/cpu_reference.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"
#ifndef TRAIN_GPT_NO_NCCL
#include "layers/context_parallel/ring_attention.cuh"
#include "layers/multi_gpu/launcher.h"
#include "test/forked_ranks.h"
#endif

typedef struct {
    const char* name;
    int B, T, NH, NKV, HD, causal, packed;
} CpConfig;

static const CpConfig CONFIGS[] = {{"mha_hd64_causal", 2, 600, 4, 4, 64, 1, 1},
                                   {"mha_hd64_full", 2, 600, 4, 4, 64, 0, 1},
                                   {"gqa_nh8_nkv2_hd128_causal", 1, 456, 8, 2, 128, 1, 0},
                                   {"mqa_nh8_nkv1_hd80_full", 2, 200, 8, 1, 80, 0, 0}};
#define NUM_CONFIGS ((int)COUNT(CONFIGS))
static const int WORLDS[] = {1, 2, 4};
#define NUM_WORLDS ((int)COUNT(WORLDS))
enum { PLANT_NONE, PLANT_SWAP, PLANT_DROP };
#define RUNS_PER_WORLD (NUM_CONFIGS + 2)  // the shapes, then the two plants on shape 0
#define NUM_CASES (1 + NUM_WORLDS * RUNS_PER_WORLD)
#define NUM_QUANTITIES 5
#define MAX_WORLD 4

static char g_names[NUM_CASES][160];

static void make_case_names(void) {
    snprintf(g_names[0], sizeof(g_names[0]), "cp_length_not_a_multiple_of_2n_is_refused_with_a_message");
    for (int w = 0; w < NUM_WORLDS; w++)
        for (int k = 0; k < RUNS_PER_WORLD; k++) {
            char* name = g_names[1 + w * RUNS_PER_WORLD + k];
            if (k < NUM_CONFIGS)
                snprintf(name, sizeof(g_names[0]), "cp%d_ring_equals_flash2_whole_sequence_%s", WORLDS[w],
                         CONFIGS[k].name);
            else
                snprintf(name, sizeof(g_names[0]), "cp%d_planted_%s_on_the_last_rank_is_caught", WORLDS[w],
                         k == NUM_CONFIGS ? "swapped_chunks" : "dropped_block");
        }
}

#ifndef TRAIN_GPT_NO_NCCL
static const char* QUANTITIES[NUM_QUANTITIES] = {"out", "lse", "dq", "dk", "dv"};

// ---- the problems: inputs and the fp64 reference, made in the parent before any fork ------------------
typedef struct {
    CpConfig c;
    int F;                                // heads per token in the packed layout: NH + 2·NKV
    uint16_t *qkv, *dout;                 // bf16 bits: (B, T, F, HD), (B, T, NH, HD)
    double *ref_out, *ref_lse, *ref_dqkv; // fp64: (B, T, NH, HD), (B, NH, T), (B, T, F, HD)
} CpProblem;

static CpProblem g_problems[NUM_CONFIGS];

static void make_problem(CpProblem* p, const CpConfig* c, TestRng* rng) {
    p->c = *c;
    p->F = c->NH + 2 * c->NKV;
    const size_t nqkv = (size_t)c->B * c->T * p->F * c->HD, nout = (size_t)c->B * c->T * c->NH * c->HD;
    p->qkv = (uint16_t*)host_alloc(nqkv * 2);
    p->dout = (uint16_t*)host_alloc(nout * 2);
    double* qkv = test_alloc(nqkv);
    double* dout = test_alloc(nout);
    for (size_t i = 0; i < nqkv; i++) {
        p->qkv[i] = test_float_to_bf16((float)test_rng_normal(rng));
        qkv[i] = test_bf16_to_float(p->qkv[i]);
    }
    for (size_t i = 0; i < nout; i++) {
        p->dout[i] = test_float_to_bf16((float)test_rng_uniform(rng, -1.0, 1.0));
        dout[i] = test_bf16_to_float(p->dout[i]);
    }
    p->ref_out = test_alloc(nout);
    p->ref_lse = test_alloc((size_t)c->B * c->NH * c->T);
    p->ref_dqkv = test_alloc(nqkv);  // zeroed: the reference backward adds
    ref_attention_forward(p->ref_out, p->ref_lse, qkv, c->B, c->T, c->NH, c->NKV, c->HD, c->causal);
    ref_attention_backward(p->ref_dqkv, dout, qkv, p->ref_out, p->ref_lse, c->B, c->T, c->NH, c->NKV, c->HD,
                           c->causal);
    free(qkv);
    free(dout);
}

// ---- errors ---------------------------------------------------------------------------------------------

// Heads [first, first + count) of every row of a packed (rows, F, HD) tensor: (rows, count, HD).
static double* slot_of_double(const double* x, size_t rows, int F, int HD, int first, int count) {
    double* out = test_alloc(rows * count * HD);
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < count * HD; i++) out[r * count * HD + i] = x[(r * F + first) * HD + i];
    return out;
}

// ‖x − ref‖ / ‖ref‖ of the q, k and v slots of two packed (rows, F, HD) gradients; into err[0..2].
static void slot_errors(double err[3], const double* x, const double* ref, size_t rows, const CpProblem* p) {
    const int first[3] = {0, p->c.NH, p->c.NH + p->c.NKV}, count[3] = {p->c.NH, p->c.NKV, p->c.NKV};
    for (int s = 0; s < 3; s++) {
        double* a = slot_of_double(x, rows, p->F, p->c.HD, first[s], count[s]);
        double* b = slot_of_double(ref, rows, p->F, p->c.HD, first[s], count[s]);
        err[s] = test_rel_error(a, b, rows * count[s] * p->c.HD);
        free(a), free(b);
    }
}

static double* bf16_to_doubles(const uint16_t* x, size_t n) {
    double* out = test_alloc(n);
    for (size_t i = 0; i < n; i++) out[i] = test_bf16_to_float(x[i]);
    return out;
}

// The largest error of an LSE in nats over 1 + the rms of the reference (test_gpu_attention's
// measure); NaN when any element is NaN.
static double lse_error(const float* x, const double* ref, size_t n) {
    double worst = 0.0, sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - ref[i]);
        if (isnan(d)) return NAN;
        if (d > worst) worst = d;
        sq += ref[i] * ref[i];
    }
    return worst / (1.0 + sqrt(sq / (double)(n ? n : 1)));
}

// The five errors of (out bf16, lse, dqkv bf16 packed) against doubles of the same shapes.
static void all_errors(double err[NUM_QUANTITIES], const uint16_t* out, const float* lse, const uint16_t* dqkv,
                       const double* ref_out, const double* ref_lse, const double* ref_dqkv, long T,
                       const CpProblem* p) {
    const CpConfig* c = &p->c;
    const size_t rows = (size_t)c->B * T, nout = rows * c->NH * c->HD;
    double* o = bf16_to_doubles(out, nout);
    err[0] = test_rel_error(o, ref_out, nout);
    free(o);
    err[1] = lse_error(lse, ref_lse, (size_t)c->B * c->NH * T);
    double* g = bf16_to_doubles(dqkv, rows * p->F * c->HD);
    slot_errors(err + 2, g, ref_dqkv, rows, p);
    free(g);
}

// ---- one rank's run ------------------------------------------------------------------------------------
typedef struct {
    int rank, world;
    ncclComm_t comm;  // NULL for one rank
    cudaStream_t stream;
    FILE* out;        // the lines for the parent
} Rank;

typedef struct {
    uint16_t* out;   // (B, T', NH, HD) bf16
    float* lse;      // (B, NH, T')
    uint16_t* dqkv;  // (B, T', F, HD) bf16, packed whatever the layout the GPU used
} CpResult;

static void result_alloc(CpResult* r, const CpProblem* p, long T) {
    const size_t rows = (size_t)p->c.B * T;
    r->out = (uint16_t*)host_alloc(rows * p->c.NH * p->c.HD * 2);
    r->lse = (float*)host_alloc((size_t)p->c.B * p->c.NH * T * 4);
    r->dqkv = (uint16_t*)host_alloc(rows * p->F * p->c.HD * 2);
}

static void result_free(CpResult* r) { free(r->out), free(r->lse), free(r->dqkv); }

static void upload(void* d, const void* h, size_t bytes) { CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice)); }
static void download(void* h, const void* d, size_t bytes) { CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost)); }

// flash2 forward and backward on the whole sequence, packed layout: the comparison's reference.
static void flash_whole(const CpProblem* p, cudaStream_t stream, CpResult* r) {
    const CpConfig* c = &p->c;
    const size_t rows = (size_t)c->B * c->T, nqkv = rows * p->F * c->HD, nout = rows * c->NH * c->HD;
    const size_t nlse = (size_t)c->B * c->NH * c->T;
    __nv_bfloat16* qkv = (__nv_bfloat16*)device_alloc(nqkv * 2);
    __nv_bfloat16* dqkv = (__nv_bfloat16*)device_alloc(nqkv * 2);
    __nv_bfloat16* out = (__nv_bfloat16*)device_alloc(nout * 2);
    __nv_bfloat16* dout = (__nv_bfloat16*)device_alloc(nout * 2);
    float* lse = (float*)device_alloc(nlse * 4);
    upload(qkv, p->qkv, nqkv * 2);
    upload(dout, p->dout, nout * 2);
    const AttentionShape s = {c->B, c->T, c->NH, c->HD, c->causal, c->NKV};
    void* ws = device_alloc(attention_workspace_bytes(ATTN_FLASH2, &s));
    AttentionArgs a;
    memset(&a, 0, sizeof(a));
    a.shape = s;
    a.q = qkv, a.k = qkv + c->NH * c->HD, a.v = qkv + (c->NH + c->NKV) * c->HD, a.qkv_stride = (long)p->F * c->HD;
    a.out = out, a.out_stride = (long)c->NH * c->HD, a.lse = lse, a.dout = dout, a.workspace = ws;
    a.dq = dqkv, a.dk = dqkv + c->NH * c->HD, a.dv = dqkv + (c->NH + c->NKV) * c->HD, a.dqkv_stride = a.qkv_stride;
    const AttentionContext ctx = {NULL};
    attention_forward(ATTN_FLASH2, &ctx, &a, stream);
    attention_backward(ATTN_FLASH2, &ctx, &a, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    download(r->out, out, nout * 2);
    download(r->lse, lse, nlse * 4);
    download(r->dqkv, dqkv, nqkv * 2);
    void* all[] = {qkv, dqkv, out, dout, lse, ws};
    for (size_t i = 0; i < COUNT(all); i++) CUDA_CHECK(cudaFree(all[i]));
}

// Swaps the two chunks (halves) of every outer row of a local (outer, Tl, row) tensor: the plant.
static void swap_chunks(void* x, long outer, long Tl, size_t row_bytes) {
    const size_t half = (size_t)Tl / 2 * row_bytes;
    char* tmp = (char*)host_alloc(half);
    for (long o = 0; o < outer; o++) {
        char* a = (char*)x + (size_t)o * Tl * row_bytes;
        memcpy(tmp, a, half), memcpy(a, a + half, half), memcpy(a + half, tmp, half);
    }
    free(tmp);
}

// Heads [first, first + count) of packed (rows, F, HD) bf16 <-> a plain (rows, count, HD) tensor.
static void plain_slot(uint16_t* plain, uint16_t* packed, size_t rows, int F, int HD, int first, int count,
                       int to_plain) {
    for (size_t r = 0; r < rows; r++) {
        uint16_t* a = plain + r * count * HD;
        uint16_t* b = packed + (r * F + first) * HD;
        memcpy(to_plain ? a : b, to_plain ? b : a, (size_t)count * HD * 2);
    }
}

// The device tensors of one ring run, in the shape's layout (packed or plain); args point at them.
typedef struct {
    void* mem[10];
    int n;
    AttentionArgs a;
} RingIo;

static void* io_alloc(RingIo* io, size_t bytes, const void* from) {
    void* d = device_alloc(bytes);
    if (from) upload(d, from, bytes);
    else CUDA_CHECK(cudaMemset(d, 0xFF, bytes));  // outputs: NaN until written
    io->mem[io->n++] = d;
    return d;
}

// q, k, v (from qkv, packed local) and dq, dk, dv in the shape's layout.
static void io_qkv(RingIo* io, const CpProblem* p, size_t rows, uint16_t* qkv) {
    const CpConfig* c = &p->c;
    AttentionArgs* a = &io->a;
    const int qw = c->NH * c->HD, kw = c->NKV * c->HD;
    if (c->packed) {
        __nv_bfloat16* x = (__nv_bfloat16*)io_alloc(io, rows * p->F * c->HD * 2, qkv);
        __nv_bfloat16* dx = (__nv_bfloat16*)io_alloc(io, rows * p->F * c->HD * 2, NULL);
        a->q = x, a->k = x + qw, a->v = x + qw + kw, a->qkv_stride = (long)p->F * c->HD;
        a->dq = dx, a->dk = dx + qw, a->dv = dx + qw + kw, a->dqkv_stride = a->qkv_stride;
        return;
    }
    uint16_t* tmp = (uint16_t*)host_alloc(rows * qw * 2);
    const __nv_bfloat16* in[3];
    const int first[3] = {0, c->NH, c->NH + c->NKV}, count[3] = {c->NH, c->NKV, c->NKV};
    for (int s = 0; s < 3; s++) {
        plain_slot(tmp, qkv, rows, p->F, c->HD, first[s], count[s], 1);
        in[s] = (const __nv_bfloat16*)io_alloc(io, rows * count[s] * c->HD * 2, tmp);
    }
    free(tmp);
    a->q = in[0], a->k = in[1], a->v = in[2], a->qkv_stride = qw, a->kv_stride = kw;
    a->dq = (__nv_bfloat16*)io_alloc(io, rows * qw * 2, NULL), a->dqkv_stride = qw;
    a->dk = (__nv_bfloat16*)io_alloc(io, rows * kw * 2, NULL), a->dkv_stride = kw;
    a->dv = (__nv_bfloat16*)io_alloc(io, rows * kw * 2, NULL);
}

static void io_make(RingIo* io, const CpProblem* p, long Tl, uint16_t* qkv, const uint16_t* dout) {
    const CpConfig* c = &p->c;
    const size_t rows = (size_t)c->B * Tl;
    memset(io, 0, sizeof(*io));
    const AttentionShape local = {c->B, (int)Tl, c->NH, c->HD, c->causal, c->NKV};
    io->a.shape = local;
    io_qkv(io, p, rows, qkv);
    io->a.out = (__nv_bfloat16*)io_alloc(io, rows * c->NH * c->HD * 2, NULL);
    io->a.out_stride = (long)c->NH * c->HD;
    io->a.dout = (const __nv_bfloat16*)io_alloc(io, rows * c->NH * c->HD * 2, dout);
    io->a.lse = (float*)io_alloc(io, (size_t)c->B * c->NH * Tl * 4, NULL);
}

static void io_download(const RingIo* io, const CpProblem* p, long Tl, CpResult* r) {
    const CpConfig* c = &p->c;
    const size_t rows = (size_t)c->B * Tl;
    download(r->out, io->a.out, rows * c->NH * c->HD * 2);
    download(r->lse, io->a.lse, (size_t)c->B * c->NH * Tl * 4);
    if (c->packed) {
        download(r->dqkv, io->a.dq, rows * p->F * c->HD * 2);
        return;
    }
    uint16_t* tmp = (uint16_t*)host_alloc(rows * c->NH * c->HD * 2);
    const void* d[3] = {io->a.dq, io->a.dk, io->a.dv};
    const int first[3] = {0, c->NH, c->NH + c->NKV}, count[3] = {c->NH, c->NKV, c->NKV};
    for (int s = 0; s < 3; s++) {
        download(tmp, d[s], rows * count[s] * c->HD * 2);
        plain_slot(tmp, r->dqkv, rows, p->F, c->HD, first[s], count[s], 0);
    }
    free(tmp);
}

// The ring's forward and backward on this rank's T/N tokens of the problem; plant as in the top.
static void ring_run(const Rank* R, const CpProblem* p, int plant, CpResult* r) {
    const CpConfig* c = &p->c;
    const long Tl = c->T / R->world;
    uint16_t* qkv = (uint16_t*)host_alloc((size_t)c->B * Tl * p->F * c->HD * 2);
    uint16_t* dout = (uint16_t*)host_alloc((size_t)c->B * Tl * c->NH * c->HD * 2);
    zigzag_scatter(qkv, p->qkv, c->B, c->T, (size_t)p->F * c->HD * 2, R->rank, R->world);
    zigzag_scatter(dout, p->dout, c->B, c->T, (size_t)c->NH * c->HD * 2, R->rank, R->world);
    const int last = R->rank == R->world - 1;
    if (plant == PLANT_SWAP && last) {
        swap_chunks(qkv, c->B, Tl, (size_t)p->F * c->HD * 2);
        swap_chunks(dout, c->B, Tl, (size_t)c->NH * c->HD * 2);
    }
    RingIo io;
    io_make(&io, p, Tl, qkv, dout);
    const AttentionShape global = {c->B, c->T, c->NH, c->HD, c->causal, c->NKV};
    RingAttention ra;
    ring_attention_create(&ra, &global, R->world, R->rank, R->comm);
    // the late query chunk (1) against the early key chunk (0) at the last step: visible at every N
    if (plant == PLANT_DROP && last) ra.test_drop_block = (R->world - 1) * 4 + 1 * 2 + 0;
    ring_attention_forward(&ra, &io.a, R->stream);
    ring_attention_backward(&ra, &io.a, R->stream);
    CUDA_CHECK(cudaStreamSynchronize(R->stream));  // a failure exits this rank: the parent reports it
    io_download(&io, p, Tl, r);
    ring_attention_destroy(&ra);
    for (int i = 0; i < io.n; i++) CUDA_CHECK(cudaFree(io.mem[i]));
    free(qkv), free(dout);
}

// flash2's whole-sequence results at this rank's positions, as doubles for all_errors.
static void flash_at_rank(const CpResult* whole, const CpProblem* p, const Rank* R, double** out, double** lse,
                          double** dqkv) {
    const CpConfig* c = &p->c;
    const long Tl = c->T / R->world;
    CpResult mine;
    result_alloc(&mine, p, Tl);
    zigzag_scatter(mine.out, whole->out, c->B, c->T, (size_t)c->NH * c->HD * 2, R->rank, R->world);
    zigzag_scatter(mine.lse, whole->lse, (long)c->B * c->NH, c->T, sizeof(float), R->rank, R->world);
    zigzag_scatter(mine.dqkv, whole->dqkv, c->B, c->T, (size_t)p->F * c->HD * 2, R->rank, R->world);
    const size_t rows = (size_t)c->B * Tl, nlse = (size_t)c->B * c->NH * Tl;
    *out = bf16_to_doubles(mine.out, rows * c->NH * c->HD);
    *dqkv = bf16_to_doubles(mine.dqkv, rows * p->F * c->HD);
    *lse = test_alloc(nlse);
    for (size_t i = 0; i < nlse; i++) (*lse)[i] = mine.lse[i];
    result_free(&mine);
}

// Run k (a shape, or a plant on shape 0) on this rank: one line "k err[5] bound[5]" for the parent.
static void rank_case(const Rank* R, int k) {
    const CpProblem* p = &g_problems[k < NUM_CONFIGS ? k : 0];
    const int plant = k < NUM_CONFIGS ? PLANT_NONE : k == NUM_CONFIGS ? PLANT_SWAP : PLANT_DROP;
    CpResult whole, ring;
    result_alloc(&whole, p, p->c.T);
    result_alloc(&ring, p, p->c.T / R->world);
    flash_whole(p, R->stream, &whole);
    double e_flash[NUM_QUANTITIES], e_ring[NUM_QUANTITIES], bound[NUM_QUANTITIES];
    all_errors(e_flash, whole.out, whole.lse, whole.dqkv, p->ref_out, p->ref_lse, p->ref_dqkv, p->c.T, p);
    ring_run(R, p, plant, &ring);
    double *out, *lse, *dqkv;
    flash_at_rank(&whole, p, R, &out, &lse, &dqkv);
    all_errors(e_ring, ring.out, ring.lse, ring.dqkv, out, lse, dqkv, p->c.T / R->world, p);
    for (int q = 0; q < NUM_QUANTITIES; q++) bound[q] = 3.0 * e_flash[q];
    bound[1] += 2.0 * R->world * ldexp(1.0, -20);
    fprintf(R->out, "%d", k);
    for (int q = 0; q < NUM_QUANTITIES; q++) fprintf(R->out, " %.6e", e_ring[q]);
    for (int q = 0; q < NUM_QUANTITIES; q++) fprintf(R->out, " %.6e", bound[q]);
    fprintf(R->out, "\n");
    fflush(R->out);
    free(out), free(lse), free(dqkv);
    result_free(&whole), result_free(&ring);
}

// ---- the ranks: forked processes, one per GPU ----------------------------------------------------------
// The parent never starts CUDA (it counts GPUs in a child), so each rank starts it on its own GPU.

// The group's communicator through the file rendezvous in dir; non-blocking, as train_gpt's.
static ncclComm_t make_comm(int rank, int world, const char* dir) {
    if (world == 1) return NULL;
    const LaunchInfo li = forked_launch_info(rank, world);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (rank == 0) RING_NCCL_CHECK(ncclGetUniqueId(&id));
    char path[4200], err[2048];
    snprintf(path, sizeof(path), "%s/rendezvous", dir);
    if (launcher_rendezvous_keep(&li, path, 0x636f6e74657874ull + world, &id, sizeof(id), 60.0, NULL, err,
                                 sizeof(err)) != 0) {
        fprintf(stderr, "error: rank %d of %d: %s\n", rank, world, err);
        _exit(3);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    while (r == ncclInProgress) {
        usleep(1000);
        RING_NCCL_CHECK(ncclCommGetAsyncError(comm, &r));
    }
    RING_NCCL_CHECK(r);
    return comm;
}

static void close_comm(ncclComm_t comm) {
    ncclResult_t r = ncclCommFinalize(comm);
    while (r == ncclInProgress) RING_NCCL_CHECK(ncclCommGetAsyncError(comm, &r));
    RING_NCCL_CHECK(r);
    RING_NCCL_CHECK(ncclCommDestroy(comm));
}

static void rank_main(int rank, int world, const char* dir) {
    Rank R = {rank, world, NULL, NULL, forked_rank_begin(rank, dir)};
    R.comm = make_comm(rank, world, dir);
    CUDA_CHECK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
    for (int k = 0; k < RUNS_PER_WORLD; k++) rank_case(&R, k);
    CUDA_CHECK(cudaStreamDestroy(R.stream));
    if (R.comm) close_comm(R.comm);
    fclose(R.out);
    _exit(0);
}

// Rank r's line for run k: 1 and its errors and bounds, or 0 when it wrote none.
static int read_line(const char* dir, int r, int k, double err[NUM_QUANTITIES], double bound[NUM_QUANTITIES]) {
    char path[FORKED_PATH_MAX], line[1024];
    forked_rank_path(path, sizeof(path), dir, r);
    FILE* f = fopen(path, "r");
    int found = 0, index = -1;
    while (f && !found && fgets(line, sizeof(line), f)) {
        const int n = sscanf(line, "%d %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &index, &err[0], &err[1], &err[2],
                             &err[3], &err[4], &bound[0], &bound[1], &bound[2], &bound[3], &bound[4]);
        found = n == 11 && index == k;
    }
    if (f) fclose(f);
    return found;
}

// Run k's case from the ranks' lines: a shape passes when every quantity is within its bound on
// every rank; a plant when every quantity fails its bound on some rank (NaN fails every bound).
static void report_run(int w, int k, const char* dir, const int* codes) {
    const int world = WORLDS[w], planted = k >= NUM_CONFIGS;
    const char* name = g_names[1 + w * RUNS_PER_WORLD + k];
    double err[MAX_WORLD][NUM_QUANTITIES], bound[MAX_WORLD][NUM_QUANTITIES];
    for (int r = 0; r < world; r++)
        if (!read_line(dir, r, k, err[r], bound[r]) || (!planted && codes[r] != 0)) {
            test_fail(name, "rank %d of %d reported nothing or exited with status %d (its stderr is above)", r, world,
                      codes[r]);
            return;
        }
    char why[1024] = "", info[512] = "";
    for (int q = 0; q < NUM_QUANTITIES; q++) {
        int worst = 0, failed = 0;
        double worst_ratio = -1.0;  // err / bound; NaN (an unwritten element) is the worst and stays so
        for (int r = 0; r < world; r++) {
            const double ratio = err[r][q] / bound[r][q];
            failed += !(err[r][q] <= bound[r][q]);
            if (!isnan(worst_ratio) && (isnan(ratio) || ratio > worst_ratio)) worst = r, worst_ratio = ratio;
        }
        snprintf(info + strlen(info), sizeof(info) - strlen(info), " %s %.3g (bound %.3g)", QUANTITIES[q],
                 err[worst][q], bound[worst][q]);
        if (!planted && failed)
            add_problem(why, sizeof(why), "rank %d: %s error %.4g > bound %.4g (3 x flash2's own error against fp64%s)",
                        worst, QUANTITIES[q], err[worst][q], bound[worst][q], q == 1 ? " + 2N x 2^-20" : "");
        if (planted && !failed)
            add_problem(why, sizeof(why), "planted: %s stayed within its bound on every rank (worst %.4g <= %.4g)",
                        QUANTITIES[q], err[worst][q], bound[worst][q]);
    }
    printf("# %s: worst rank:%s\n", name, info);
    test_report(name, why[0] == '\0', "%s", why);
}

// The cases of N = WORLDS[w] ranks: forked, one per GPU; skipped with fewer GPUs.
static void run_world(int w, int gpus) {
    const int world = WORLDS[w];
    char why[128];
    snprintf(why, sizeof(why), gpus == 0 ? "no CUDA GPU (of compute capability 8.0 or newer) found"
                                         : "needs %d GPUs, found %d", world, gpus);
    char dir[] = "/tmp/test_gpu_context_parallel.XXXXXX";
    if (gpus < world || !mkdtemp(dir)) {
        for (int k = 0; k < RUNS_PER_WORLD; k++)
            if (gpus < world) test_skip(g_names[1 + w * RUNS_PER_WORLD + k], why);
            else test_fail(g_names[1 + w * RUNS_PER_WORLD + k], "cannot make a directory in /tmp");
        return;
    }
    int codes[MAX_WORLD];
    forked_run(world, dir, rank_main, codes);
    for (int k = 0; k < RUNS_PER_WORLD; k++) report_run(w, k, dir, codes);
    forked_remove_dir(dir);
}

// Case 0, no GPU needed: T = 601 over 2 ranks (not a multiple of 4) is refused by ring_attention_create
// before any GPU work (a forked process: it exits), with a message naming the lengths to use; T = 600
// passes ring_attention_check.
static void test_refuses_bad_length(void) {
    int fds[2];
    if (pipe(fds) != 0) exit(1);
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        alarm(60);
        char why[512];
        const AttentionShape good = {1, 600, 4, 64, 1, 4}, bad = {1, 601, 4, 64, 1, 4};
        if (ring_attention_check(&good, 2, why, sizeof(why)) != 0) _exit(5);
        RingAttention ra;
        ring_attention_create(&ra, &bad, 2, 0, NULL);  // must exit
        _exit(0);
    }
    close(fds[1]);
    char err[2048] = "";
    size_t got = 0;
    ssize_t n;
    while (got + 1 < sizeof(err) && (n = read(fds[0], err + got, sizeof(err) - 1 - got)) > 0) got += (size_t)n;
    err[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    test_report(g_names[0], code == EXIT_FAILURE && strstr(err, "multiple of 4") && strstr(err, "601 is not") &&
                                strstr(err, "use 600 or 604"),
                "exit status %d (5: T = 600 was refused too), stderr: %s", code, err);
}
#endif  // TRAIN_GPT_NO_NCCL

int main(void) {
    test_begin();
    make_case_names();
    test_plan(NUM_CASES);
#ifdef TRAIN_GPT_NO_NCCL
    for (int i = 0; i < NUM_CASES; i++) test_skip(g_names[i], "built without NCCL");
#else
    signal(SIGPIPE, SIG_IGN);
    const int gpus = forked_count_gpus(8);  // in a child: this process starts CUDA never
    if (gpus > 0) {  // the inputs and the fp64 reference, before the ranks fork
        TestRng rng = {pick_and_print_seed()};
        for (int i = 0; i < NUM_CONFIGS; i++) make_problem(&g_problems[i], &CONFIGS[i], &rng);
    }
    for (int w = 0; w < NUM_WORLDS; w++) run_world(w, gpus);
    test_refuses_bad_length();
#endif
    return test_end();
}
