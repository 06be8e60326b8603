// test_gpu_decode.cu: the split-KV decoding attention (attention/decode.h) against an fp64
// CPU reference, through its public interface only.
//
//   build/test_gpu_decode
//
// Input sets (B = 2 sequences of lengths L and max(Tq, (L+1)/2), so every launch has sequences of
// different lengths, and splits that hold no key of the shorter one):
// - every head dim 64, 80, 96, 128 × multi-head (NH = NKV = 2), GQA (8:2) and MQA (32:1) × L in
//   {1, 17, 1000, 65537}, one query token, inputs uniform in [−1, 1);
// - GQA 8:2 at L = 1000 with inputs in [−6, 6) (logits up to ~±400: near one-hot softmax rows);
// - several query tokens (causal among themselves): Tq = 4 at 8:2 and 8:1 (16 and 32 rows per K/V
//   head), Tq = 12 at 4:1 (48 rows), Tq = 16 at 2:2 and at 16:2 (128 rows: two row groups), L in
//   {17, 1000}, head dims 80 and 128.
// Each set runs with one split, with the automatic count (decode_num_splits; the detail line says
// how many), with many (one per 64-key tile plus 3 empty ones, at most DECODE_MAX_SPLITS), all three
// with the host's max_length, and with max_length 0 (the lengths only on the GPU, as in a decode step
// captured in a CUDA graph: the splits planned for Tmax, each sequence's keys split by its own length).
// Lengths far below the capacity (GQA 8:2, Tmax 8192, lengths 17/9 and 1000/500, Tq 1 and 4, head
// dims 64 and 128): the max_length-0 launch against fp64, the launch with the host's max_length and
// the same split count against fp64, and the two bit for bit (most splits hold no key there).
//
// Every run: q sits in a packed (B, Tq, NH + 2·NKV, HD) buffer (row stride (NH + 2·NKV)·HD, as the
// model's QKV activation) whose K/V slots are NaN; the cache is (B, Tmax, NKV, HD) with Tmax = L + 7
// and NaN at every position ≥ the sequence's length (a read past the length shows); out, lse and the
// workspace are poisoned with NaN before the run, and a guard of poison before and after out and lse
// must stay untouched. Checks: ‖out − ref‖/‖ref‖ ≤ 1e-2 (bf16), |lse − ref| ≤ 1e-3·max(1, |ref|), all
// finite. Fresh random inputs every run (seed printed; TEST_SEED repeats it). CPU cases (argument
// checks, the split heuristic) run everywhere; GPU cases are SKIP where no GPU is found.
// decode_cache_append (kv_cache.cu): new rows taken from packed QKV rows land bit for bit at each
// sequence's start position, and nothing else of the poisoned cache changes (also when an append
// would run past Tmax: those rows are dropped).
#include <cuda_bf16.h>
#include <math.h>

#include "attention/decode.h"
#include "layers/cuda_common.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

#define OUT_TOLERANCE 1e-2
#define LSE_TOLERANCE 1e-3
#define GUARD 128  // poison elements before and after out and lse
#define BATCH 2

typedef struct {
    int HD, NH, NKV, Tq, L;
    double scale;
    int Tmax;  // 0: L + 7
} InputCase;

static const int HEAD_DIMS[] = {64, 80, 96, 128};
static const int LENGTHS[] = {1, 17, 1000, 65537};
// (NH, NKV): MHA, GQA, MQA. Query rows per K/V head G·Tq pick the rows per block: 16 (1 m-tile),
// 32 (2), 64 (4), more (row groups of 64); MQA 32:1 has 32.
static const int HEADS[][2] = {{2, 2}, {8, 2}, {32, 1}};
// (NH, NKV, Tq): 16, 32, 48 (4 m-tiles, the last empty), 16 (MHA) and 128 (two row groups) rows.
static const int MULTI_QUERY[][3] = {{8, 2, 4}, {8, 1, 4}, {4, 1, 12}, {2, 2, 16}, {16, 2, 16}};

// All input sets, in the order they run; returns how many (at most `max`).
static int list_cases(InputCase* cases, int max) {
    int n = 0;
    for (size_t h = 0; h < COUNT(HEAD_DIMS); h++)
        for (size_t k = 0; k < COUNT(HEADS); k++)
            for (size_t l = 0; l < COUNT(LENGTHS); l++)
                if (n < max) cases[n++] = (InputCase){HEAD_DIMS[h], HEADS[k][0], HEADS[k][1], 1, LENGTHS[l], 1.0, 0};
    for (size_t h = 0; h < COUNT(HEAD_DIMS); h++)
        if (n < max) cases[n++] = (InputCase){HEAD_DIMS[h], 8, 2, 1, 1000, 6.0, 0};
    const int multi_hd[] = {80, 128}, multi_len[] = {17, 1000};
    for (int h = 0; h < 2; h++)
        for (size_t m = 0; m < COUNT(MULTI_QUERY); m++)
            for (int l = 0; l < 2; l++)
                if (n < max)
                    cases[n++] = (InputCase){multi_hd[h], MULTI_QUERY[m][0], MULTI_QUERY[m][1], MULTI_QUERY[m][2],
                                             multi_len[l], 1.0, 0};
    return n;
}

static int sequence_length(const InputCase* c, int b) {
    if (b == 0) return c->L;
    const int half = (c->L + 1) / 2;
    return half > c->Tq ? half : c->Tq;
}

static DecodeShape shape_of(const InputCase* c) {
    DecodeShape s = {BATCH, c->Tq, c->NH, c->NKV, c->HD, c->Tmax ? c->Tmax : c->L + 7};
    return s;
}

// The three split settings: 1, automatic (0), and one per tile + 3 (capped).
static int many_splits(const InputCase* c) {
    const int tiles = (c->L + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    return tiles + 3 < DECODE_MAX_SPLITS ? tiles + 3 : DECODE_MAX_SPLITS;
}

static void case_name(char* buf, size_t size, const InputCase* c, const char* splits) {
    char tmax[32] = "";
    if (c->Tmax) snprintf(tmax, sizeof(tmax), "_tmax%d", c->Tmax);
    snprintf(buf, size, "decode_hd%d_nh%d_nkv%d_tq%d_len%d%s_scale%g_splits_%s", c->HD, c->NH, c->NKV, c->Tq, c->L,
             tmax, c->scale, splits);
}

// ---- inputs and the fp64 reference ---------------------------------------------------------------

typedef struct {
    InputCase c;
    DecodeShape s;
    long q_stride;               // (NH + 2·NKV)·HD
    uint16_t *q_bits, *k_bits, *v_bits;  // q (B, Tq, q_stride), cache (B, Tmax, NKV, HD)
    double *ref_out, *ref_lse;   // (B, Tq, NH, HD), (B, NH, Tq)
    int lengths[BATCH];
} InputSet;

static const uint16_t BF16_NAN = 0xFFFFu;

static InputSet make_inputs(const InputCase* c, uint64_t seed) {
    InputSet in;
    memset(&in, 0, sizeof(in));
    in.c = *c;
    in.s = shape_of(c);
    const DecodeShape* s = &in.s;
    in.q_stride = (long)(s->NH + 2 * s->NKV) * s->HD;
    const size_t nq = (size_t)BATCH * s->Tq * in.q_stride, nkv = (size_t)BATCH * s->Tmax * s->NKV * s->HD;
    in.q_bits = (uint16_t*)host_alloc(nq * 2);
    in.k_bits = (uint16_t*)host_alloc(nkv * 2);
    in.v_bits = (uint16_t*)host_alloc(nkv * 2);
    TestRng rng = {seed};
    for (size_t i = 0; i < nq; i++)
        in.q_bits[i] = (long)(i % in.q_stride) < (long)s->NH * s->HD
                           ? test_float_to_bf16((float)test_rng_uniform(&rng, -c->scale, c->scale))
                           : BF16_NAN;  // the K/V slots of the packed row: never read
    for (int b = 0; b < BATCH; b++) {
        in.lengths[b] = sequence_length(c, b);
        for (int t = 0; t < s->Tmax; t++)
            for (int e = 0; e < s->NKV * s->HD; e++) {
                const size_t i = ((size_t)b * s->Tmax + t) * s->NKV * s->HD + e;
                const int live = t < in.lengths[b];
                in.k_bits[i] = live ? test_float_to_bf16((float)test_rng_uniform(&rng, -c->scale, c->scale)) : BF16_NAN;
                in.v_bits[i] = live ? test_float_to_bf16((float)test_rng_uniform(&rng, -c->scale, c->scale)) : BF16_NAN;
            }
    }
    // Reference: query t of sequence b sits at position L_b − Tq + t and sees keys 0 .. L_b − Tq + t.
    const int G = s->NH / s->NKV, HD = s->HD;
    in.ref_out = test_alloc((size_t)BATCH * s->Tq * s->NH * HD);
    in.ref_lse = test_alloc((size_t)BATCH * s->NH * s->Tq);
    double* scores = test_alloc((size_t)s->Tmax);
    double* q = test_alloc((size_t)HD);
    double* acc = test_alloc((size_t)HD);
    for (int b = 0; b < BATCH; b++)
        for (int t = 0; t < s->Tq; t++)
            for (int h = 0; h < s->NH; h++) {
                const int kvh = h / G, keys = in.lengths[b] - s->Tq + t + 1;
                for (int d = 0; d < HD; d++)
                    q[d] = test_bf16_to_float(in.q_bits[((size_t)b * s->Tq + t) * in.q_stride + (size_t)h * HD + d]);
                double mx = -INFINITY;
                for (int j = 0; j < keys; j++) {
                    const uint16_t* k = in.k_bits + (((size_t)b * s->Tmax + j) * s->NKV + kvh) * HD;
                    double dot = 0.0;
                    for (int d = 0; d < HD; d++) dot += q[d] * test_bf16_to_float(k[d]);
                    scores[j] = dot / sqrt((double)HD);
                    if (scores[j] > mx) mx = scores[j];
                }
                double sum = 0.0;
                for (int d = 0; d < HD; d++) acc[d] = 0.0;
                for (int j = 0; j < keys; j++) {
                    const double p = exp(scores[j] - mx);
                    const uint16_t* v = in.v_bits + (((size_t)b * s->Tmax + j) * s->NKV + kvh) * HD;
                    sum += p;
                    for (int d = 0; d < HD; d++) acc[d] += p * test_bf16_to_float(v[d]);
                }
                double* out = in.ref_out + (((size_t)b * s->Tq + t) * s->NH + h) * HD;
                for (int d = 0; d < HD; d++) out[d] = acc[d] / sum;
                in.ref_lse[((size_t)b * s->NH + h) * s->Tq + t] = mx + log(sum);
            }
    free(scores);
    free(q);
    free(acc);
    return in;
}

static void free_inputs(InputSet* in) {
    free(in->q_bits);
    free(in->k_bits);
    free(in->v_bits);
    free(in->ref_out);
    free(in->ref_lse);
}

// ---- one GPU run -------------------------------------------------------------------------------------

typedef struct {
    __nv_bfloat16 *q, *k, *v, *out_buf;
    float* lse_buf;
    int* lengths;
    size_t n_out, n_lse;
} Device;

static Device upload(const InputSet* in) {
    const DecodeShape* s = &in->s;
    Device d;
    const size_t nq = (size_t)BATCH * s->Tq * in->q_stride, nkv = (size_t)BATCH * s->Tmax * s->NKV * s->HD;
    d.n_out = (size_t)BATCH * s->Tq * s->NH * s->HD;
    d.n_lse = (size_t)BATCH * s->NH * s->Tq;
    d.q = (__nv_bfloat16*)device_alloc(nq * 2);
    d.k = (__nv_bfloat16*)device_alloc(nkv * 2);
    d.v = (__nv_bfloat16*)device_alloc(nkv * 2);
    d.out_buf = (__nv_bfloat16*)device_alloc((d.n_out + 2 * GUARD) * 2);
    d.lse_buf = (float*)device_alloc((d.n_lse + 2 * GUARD) * 4);
    d.lengths = (int*)device_alloc(BATCH * sizeof(int));
    CUDA_CHECK(cudaMemcpy(d.q, in->q_bits, nq * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d.k, in->k_bits, nkv * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d.v, in->v_bits, nkv * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d.lengths, in->lengths, sizeof(in->lengths), cudaMemcpyHostToDevice));
    return d;
}

static void free_device(Device* d) {
    CUDA_CHECK(cudaFree(d->q));
    CUDA_CHECK(cudaFree(d->k));
    CUDA_CHECK(cudaFree(d->v));
    CUDA_CHECK(cudaFree(d->out_buf));
    CUDA_CHECK(cudaFree(d->lse_buf));
    CUDA_CHECK(cudaFree(d->lengths));
}

static int guard_intact(const unsigned char* p, size_t bytes) { return changed_poison_bytes(p, bytes) == 0; }

// Runs the decode with `num_splits` (0: automatic) and max_length (0: not known on the host, the
// splits planned for Tmax) and checks it; `name` is the case. With kept, *kept receives out's bits
// (malloc'ed; NULL when the run was rejected).
static void run_case(const InputSet* in, Device* d, int num_splits, int max_length, const char* name,
                     cudaStream_t stream, uint16_t** kept) {
    const DecodeShape* s = &in->s;
    const int splits = num_splits > 0 ? num_splits : decode_num_splits(s, max_length ? max_length : s->Tmax);
    if (kept) *kept = NULL;
    const size_t ws_bytes = decode_workspace_bytes(s, splits);
    void* workspace = device_alloc(ws_bytes);
    // The poison goes in on the launch's stream, and the device is idle before the launch: `stream` is
    // non-blocking, so a cudaMemset (legacy stream) or the inputs' upload could otherwise still be
    // running under the kernel and overwrite what it wrote (NaN out or lse where the kernel is right).
    if (ws_bytes) CUDA_CHECK(cudaMemsetAsync(workspace, 0xFF, ws_bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(d->out_buf, 0xFF, (d->n_out + 2 * GUARD) * 2, stream));
    CUDA_CHECK(cudaMemsetAsync(d->lse_buf, 0xFF, (d->n_lse + 2 * GUARD) * 4, stream));
    CUDA_CHECK(cudaDeviceSynchronize());

    DecodeArgs a;
    memset(&a, 0, sizeof(a));
    a.shape = *s;
    a.q = d->q, a.q_stride = in->q_stride;
    a.k_cache = d->k, a.v_cache = d->v;
    a.lengths = d->lengths, a.max_length = max_length;
    a.out = d->out_buf + GUARD, a.out_stride = (long)s->NH * s->HD;
    a.lse = d->lse_buf + GUARD;
    a.num_splits = num_splits;
    a.workspace = workspace;
    char why[512];
    if (decode_check_args(&a, why, sizeof(why)) != 0) {
        test_fail(name, "rejected: %s", why);
        CUDA_CHECK(cudaFree(workspace));
        return;
    }
    decode_attention(&a, stream);
    sync_or_die(stream, name, "decode attention");

    uint16_t* out = (uint16_t*)host_alloc((d->n_out + 2 * GUARD) * 2);
    float* lse = (float*)host_alloc((d->n_lse + 2 * GUARD) * 4);
    CUDA_CHECK(cudaMemcpy(out, d->out_buf, (d->n_out + 2 * GUARD) * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(lse, d->lse_buf, (d->n_lse + 2 * GUARD) * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(workspace));

    char problems[1024] = "";
    double* x = test_alloc(d->n_out);
    size_t not_finite = 0;
    for (size_t i = 0; i < d->n_out; i++) {
        not_finite += !bf16_is_finite(out[GUARD + i]);
        x[i] = test_bf16_to_float(out[GUARD + i]);
    }
    const double out_err = test_rel_error(x, in->ref_out, d->n_out);
    double lse_err = 0.0;
    size_t lse_not_finite = 0;
    for (size_t i = 0; i < d->n_lse; i++) {
        const double r = in->ref_lse[i], e = fabs((double)lse[GUARD + i] - r) / (fabs(r) > 1.0 ? fabs(r) : 1.0);
        lse_not_finite += !isfinite(lse[GUARD + i]);
        if (!isnan(lse_err) && !(e <= lse_err)) lse_err = e;  // NaN sticks (a later finite e must not clear it)
    }
    if (not_finite) add_problem(problems, sizeof(problems), "%zu of %zu out elements not finite (unwritten?)",
                                not_finite, d->n_out);
    if (lse_not_finite) add_problem(problems, sizeof(problems), "%zu lse not finite", lse_not_finite);
    if (!(out_err <= OUT_TOLERANCE)) add_problem(problems, sizeof(problems), "out error %.3e", out_err);
    if (!(lse_err <= LSE_TOLERANCE)) add_problem(problems, sizeof(problems), "lse error %.3e", lse_err);
    if (!guard_intact((unsigned char*)out, GUARD * 2) || !guard_intact((unsigned char*)(out + GUARD + d->n_out), GUARD * 2))
        add_problem(problems, sizeof(problems), "wrote outside out");
    if (!guard_intact((unsigned char*)lse, GUARD * 4) || !guard_intact((unsigned char*)(lse + GUARD + d->n_lse), GUARD * 4))
        add_problem(problems, sizeof(problems), "wrote outside lse");
    printf("  %s: splits %d, out error %.2e, lse error %.2e\n", name, splits, out_err, lse_err);
    test_report(name, problems[0] == 0, "%s", problems);
    free(x);
    free(lse);
    if (kept) {
        *kept = (uint16_t*)host_alloc(d->n_out * 2);
        memcpy(*kept, out + GUARD, d->n_out * 2);
    }
    free(out);
}

// ---- CPU cases ---------------------------------------------------------------------------------------

// Shapes (and lengths, splits) decode_check must refuse.
static const struct {
    const char* name;
    DecodeShape s;
    int max_length, splits;
} BAD_SHAPES[] = {
    {"decode_check_rejects_head_dim_72", {2, 1, 8, 2, 72, 100}, 100, 0},
    {"decode_check_rejects_heads_not_multiple", {2, 1, 6, 4, 128, 100}, 100, 0},
    {"decode_check_rejects_17_query_tokens", {2, 17, 8, 2, 128, 100}, 100, 0},
    {"decode_check_rejects_length_over_capacity", {2, 1, 8, 2, 128, 100}, 101, 0},
    {"decode_check_rejects_length_under_query_tokens", {2, 4, 8, 2, 128, 100}, 3, 0},
    {"decode_check_rejects_too_many_splits", {2, 1, 8, 2, 128, 100}, 100, DECODE_MAX_SPLITS + 1},
};
// cpu_cases: one per BAD_SHAPES entry, the two accepted shapes and the five named split heuristic cases.
#define CPU_CASES ((int)COUNT(BAD_SHAPES) + 2 + 5)

static void cpu_cases(void) {
    char why[512];
    DecodeShape ok = {2, 1, 8, 2, 128, 100};
    test_report("decode_check_accepts_gqa", decode_check(&ok, 100, 0, why, sizeof(why)) == 0, "%s", why);
    test_report("decode_check_accepts_a_length_unknown_on_the_host", decode_check(&ok, 0, 0, why, sizeof(why)) == 0,
                "%s", why);
    for (size_t i = 0; i < COUNT(BAD_SHAPES); i++) {
        why[0] = 0;
        const int rc = decode_check(&BAD_SHAPES[i].s, BAD_SHAPES[i].max_length, BAD_SHAPES[i].splits, why, sizeof(why));
        test_report(BAD_SHAPES[i].name, rc == -1 && why[0], "accepted (rc %d)", rc);
    }
    // The split heuristic: full GPU → 1; a lone block → many, never more than the tiles or the cap.
    const int full = decode_splits_for(264, 32768, 264), lone = decode_splits_for(1, 32768, 264);
    const int short_one = decode_splits_for(1, 100, 264), huge = decode_splits_for(1, 1 << 20, 264);
    test_report("decode_splits_for_full_gpu_is_1", full == 1, "got %d", full);
    test_report("decode_splits_for_one_block_fills_gpu", lone >= 200 && lone <= DECODE_MAX_SPLITS, "got %d", lone);
    test_report("decode_splits_for_at_most_one_per_tile", short_one == 2, "got %d for 100 keys", short_one);
    test_report("decode_splits_for_capped", huge <= DECODE_MAX_SPLITS && huge > 1, "got %d", huge);
    const int half = decode_splits_for(64, 8192, 264);
    test_report("decode_splits_for_half_gpu", half * 64 >= 0.85 * 264 && half * 64 <= 264, "got %d for 64 blocks", half);
}

// ---- the cache append ----------------------------------------------------------------------------

static void append_case(int HD, int Tn, const int start[BATCH], int Tmax, uint64_t seed) {
    char name[160];
    snprintf(name, sizeof(name), "decode_cache_append_hd%d_tn%d_start%d_%d_tmax%d", HD, Tn, start[0], start[1], Tmax);
    const int NH = 4, NKV = 2, B = BATCH;
    const long stride = (long)(NH + 2 * NKV) * HD, row = (long)NKV * HD;
    const size_t n_src = (size_t)B * Tn * stride, n_cache = (size_t)B * Tmax * row;
    uint16_t* src = (uint16_t*)host_alloc(n_src * 2);
    TestRng rng = {seed};
    for (size_t i = 0; i < n_src; i++) src[i] = (uint16_t)(test_rng_next(&rng) & 0x7F7Fu);  // finite bf16
    uint16_t *d_src = (uint16_t*)device_alloc(n_src * 2), *d_k = (uint16_t*)device_alloc((n_cache + 2 * GUARD) * 2),
             *d_v = (uint16_t*)device_alloc((n_cache + 2 * GUARD) * 2);
    int* d_start = (int*)device_alloc(B * sizeof(int));
    CUDA_CHECK(cudaMemcpy(d_src, src, n_src * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_start, start, B * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_k, 0xFF, (n_cache + 2 * GUARD) * 2));
    CUDA_CHECK(cudaMemset(d_v, 0xFF, (n_cache + 2 * GUARD) * 2));
    const __nv_bfloat16* qkv = (const __nv_bfloat16*)d_src;
    decode_cache_append(qkv + NH * HD, qkv + (NH + NKV) * HD, stride, B, Tn, NKV, HD, d_start,
                        (__nv_bfloat16*)(d_k + GUARD), (__nv_bfloat16*)(d_v + GUARD), Tmax, 0);
    sync_or_die(0, name, "cache append");
    uint16_t* k = (uint16_t*)host_alloc((n_cache + 2 * GUARD) * 2);
    uint16_t* v = (uint16_t*)host_alloc((n_cache + 2 * GUARD) * 2);
    CUDA_CHECK(cudaMemcpy(k, d_k, (n_cache + 2 * GUARD) * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v, d_v, (n_cache + 2 * GUARD) * 2, cudaMemcpyDeviceToHost));
    size_t wrong = 0, touched = 0;
    for (int b = 0; b < B; b++)
        for (int pos = 0; pos < Tmax; pos++) {
            const int t = pos - start[b];
            const size_t at = GUARD + ((size_t)b * Tmax + pos) * row;
            for (long e = 0; e < row; e++) {
                if (t >= 0 && t < Tn) {
                    const size_t from = ((size_t)b * Tn + t) * stride + e;
                    wrong += k[at + e] != src[from + NH * HD] || v[at + e] != src[from + (NH + NKV) * HD];
                } else {
                    touched += k[at + e] != 0xFFFFu || v[at + e] != 0xFFFFu;
                }
            }
        }
    const int guards = guard_intact((unsigned char*)k, GUARD * 2) && guard_intact((unsigned char*)v, GUARD * 2) &&
                       guard_intact((unsigned char*)(k + GUARD + n_cache), GUARD * 2) &&
                       guard_intact((unsigned char*)(v + GUARD + n_cache), GUARD * 2);
    test_report(name, wrong == 0 && touched == 0 && guards,
                "%zu appended values differ, %zu other cache values changed, guards %s", wrong, touched,
                guards ? "intact" : "overwritten");
    free(src);
    free(k);
    free(v);
    CUDA_CHECK(cudaFree(d_src));
    CUDA_CHECK(cudaFree(d_k));
    CUDA_CHECK(cudaFree(d_v));
    CUDA_CHECK(cudaFree(d_start));
}

// The cache append's grid: head dims × new tokens per sequence × start positions.
static const int APPEND_HDS[] = {64, 128}, APPEND_TNS[] = {1, 3, 17};
static const int APPEND_STARTS[][BATCH] = {{0, 0}, {5, 0}, {30, 37}};  // the last runs past Tmax = 40 for Tn > 3
#define APPEND_CASES ((int)(COUNT(APPEND_HDS) * COUNT(APPEND_TNS) * COUNT(APPEND_STARTS)))

static void append_cases(const char* skip_why, uint64_t seed) {
    for (size_t h = 0; h < COUNT(APPEND_HDS); h++)
        for (size_t t = 0; t < COUNT(APPEND_TNS); t++)
            for (size_t s = 0; s < COUNT(APPEND_STARTS); s++) {
                const int HD = APPEND_HDS[h], Tn = APPEND_TNS[t];
                if (!skip_why) {
                    append_case(HD, Tn, APPEND_STARTS[s], 40, seed + 977 * (h * 9 + t * 3 + s));
                } else {
                    char name[160];
                    snprintf(name, sizeof(name), "decode_cache_append_hd%d_tn%d_start%d_%d_tmax%d", HD, Tn,
                             APPEND_STARTS[s][0], APPEND_STARTS[s][1], 40);
                    test_skip(name, skip_why);
                }
            }
}

// ---- lengths far below the cache's capacity -------------------------------------------------------

// GQA 8:2 in a cache of 8192 positions holding 17 (9) or 1000 (500) keys: the launch planned for the
// capacity (max_length 0, as in a captured decode step) leaves most splits without keys.
static const int FAR_HDS[] = {64, 128}, FAR_TQS[] = {1, 4}, FAR_LENGTHS[] = {17, 1000};
#define FAR_TMAX 8192
#define FAR_SETS ((int)(COUNT(FAR_HDS) * COUNT(FAR_TQS) * COUNT(FAR_LENGTHS)))
#define FAR_CASES_PER_SET 3  // unknown_length, host_length_same_splits, and their bits equal

static InputCase far_case(int i) {
    const int h = i / 4, t = (i / 2) % 2, l = i % 2;
    return (InputCase){FAR_HDS[h], 8, 2, FAR_TQS[t], FAR_LENGTHS[l], 1.0, FAR_TMAX};
}

static void far_names(char names[FAR_CASES_PER_SET][160], const InputCase* c) {
    case_name(names[0], 160, c, "unknown_length");
    case_name(names[1], 160, c, "host_length_same_splits");
    case_name(names[2], 160, c, "unknown_length_equals_host_length_bits");
}

// The launch with max_length 0 against fp64, the launch with the host's max_length and the same
// splits against fp64, and the two bit for bit (each sequence's keys are split by its own length).
static void far_cases(uint64_t seed, const char* skip_why, cudaStream_t stream) {
    for (int i = 0; i < FAR_SETS; i++) {
        const InputCase c = far_case(i);
        char names[FAR_CASES_PER_SET][160];
        far_names(names, &c);
        if (skip_why) {
            for (int k = 0; k < FAR_CASES_PER_SET; k++) test_skip(names[k], skip_why);
            continue;
        }
        InputSet in = make_inputs(&c, seed ^ (0xC2B2AE3D27D4EB4Full * (uint64_t)(i + 1)));
        Device d = upload(&in);
        const int splits = decode_num_splits(&in.s, FAR_TMAX);
        uint16_t *unknown = NULL, *host = NULL;
        snprintf(g_running_case, sizeof(g_running_case), "%s", names[0]);
        run_case(&in, &d, 0, 0, names[0], stream, &unknown);
        snprintf(g_running_case, sizeof(g_running_case), "%s", names[1]);
        run_case(&in, &d, splits, c.L, names[1], stream, &host);
        g_running_case[0] = 0;
        const int equal = unknown && host && memcmp(unknown, host, d.n_out * 2) == 0;
        test_report(names[2], equal, "the two launches (%d splits) differ", splits);
        free(unknown), free(host);
        free_device(&d);
        free_inputs(&in);
    }
}

// ---- main --------------------------------------------------------------------------------------------

// The settings every input set runs with: one split, automatic, many (each with the host's
// max_length), and automatic with max_length 0 (planned for Tmax; the lengths only on the GPU).
#define SPLIT_SETTINGS 4
static const char* SETTING_LABELS[SPLIT_SETTINGS] = {"1", "auto", "many", "unknown_length"};

int main(void) {
    test_begin();
    InputCase cases[160];
    const int n = list_cases(cases, (int)COUNT(cases));
    test_plan(CPU_CASES + n * SPLIT_SETTINGS + FAR_SETS * FAR_CASES_PER_SET + APPEND_CASES);  // same without a GPU
    const uint64_t seed = pick_and_print_seed();
    cpu_cases();

    GpuInfo gpu = gpu_info(0);
    const char* skip_why = gpu_skip_reason(&gpu, "the decode kernels");
    char name[200];
    if (skip_why) {
        for (int i = 0; i < n; i++)
            for (int k = 0; k < SPLIT_SETTINGS; k++) {
                case_name(name, sizeof(name), &cases[i], SETTING_LABELS[k]);
                test_skip(name, skip_why);
            }
        far_cases(seed, skip_why, 0);
        append_cases(skip_why, seed);
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    atexit(report_exit_during_case);
    for (int i = 0; i < n; i++) {
        InputSet in = make_inputs(&cases[i], seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
        Device d = upload(&in);
        const int splits[SPLIT_SETTINGS] = {1, 0, many_splits(&cases[i]), 0};
        const int lengths[SPLIT_SETTINGS] = {cases[i].L, cases[i].L, cases[i].L, 0};
        for (int k = 0; k < SPLIT_SETTINGS; k++) {
            case_name(g_running_case, sizeof(g_running_case), &cases[i], SETTING_LABELS[k]);
            snprintf(name, sizeof(name), "%s", g_running_case);
            run_case(&in, &d, splits[k], lengths[k], name, stream, NULL);
            g_running_case[0] = 0;
        }
        free_device(&d);
        free_inputs(&in);
    }
    far_cases(seed, NULL, stream);
    append_cases(NULL, seed);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return test_end();
}
