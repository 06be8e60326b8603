// test_gpu_attention.cu: every attention backend (naive, flash1, flash2) against the fp64 CPU
// reference (test/cpu_reference.h), through the public interface attention.h, so all backends are
// tested the same way.
// Includes, of the attention library, only:
//   attention/attention.h  every case goes through it; flash2's switches and kernel family
//       (attention_flash2_settings, attention_flash2_uses_wgmma) name some cases and decide which
//       run deterministic;
//   attention/flash2/sm90/flash2_backward_order.h  host code only: the launch order of flash2's
//       Hopper backward, which a CPU case checks (no output shows it);
// and besides them layers/cuda_common.h (CUDA_CHECK, CUBLAS_CHECK) and the tests' reference and
// harness (test/cpu_reference.h, test/gpu_test_util.h, test/test_harness.h).
//
//   build/test_gpu_attention [BACKEND...]   GPU cases of the named backends only (default: all)
//
// Cases: head dims 64, 80, 96, 128; causal and full; T in {1, 17, 64, 127, 1000} (B = 2, NH = 3 up
// to T = 127; B = 1, NH = 2 at T = 1000, so the fp64 reference stays fast), and T = 2048 at head
// dim 128 with one head (flash2's forward has a second tile shape from there: flash2_tiles.h), plus
// T = 200 with B = 2, NH = 70 (more tiles than multiprocessors: the persistent forward's walk); q,
// k, v uniform in [−s, s) for s = 1 and s = 8 (logits up to ~±100, past where exp overflows in fp32
// without the max subtraction), dout uniform in [−1, 1). q, k, v and dq, dk, dv live in packed (B,
// T, 3, NH, HD) buffers (stride 3·NH·HD) in every case, and additionally in plain separate (B, T,
// NH, HD) tensors (stride NH·HD) for s = 1, T = 127. Fresh inputs every run: the seed comes from
// the clock unless TEST_SEED is set, and is printed. Inputs are rounded to bf16 on the host and the
// reference is computed from exactly those values.
//
// Each case runs the forward, then the backward, and checks (bounds and their reasons: TOL_* below;
// every error is printed for every case):
// - forward: out (B, T, NH, HD) against ref_attention_forward (computed once per input set, shared by
//   the backends and layouts) as ‖x − ref‖/‖ref‖, and lse (B, NH, T) as its largest error in nats
//   over 1 + the rms of the reference LSE (fp32 errs in proportion to the scores' size, which the
//   LSE's rms stands for; a norm-relative bound would let an offset of 1e-2·LSE pass);
// - backward on its own inputs: dq, dk, dv against ref_attention_backward given q, k, v, dout and
//   the out and lse this backend's forward produced. The backward is a function of those
//   (attention.h: dS = P ∘ (dP − rowsum(dO ∘ O))), so this bound can be as tight as the kernels'
//   own bf16 arithmetic;
// - backward against the true gradients: dq, dk, dv against the fp64 backward from the fp64 out and
//   lse (computed once per input set). This catches a forward LSE the backward agrees with but the
//   reference does not (every gradient scaled by e^−offset), which the check above is blind to. Its
//   bound is looser: the bf16 rounding of O enters D = rowsum(dO ∘ O), which near one-hot rows
//   (s = 8) cancels against dP;
// - gradients as ‖x − ref‖/‖ref‖. Where the reference is (nearly) zero (T = 1: a softmax over one
//   key has zero gradient for q and k) the denominator is floored at an rms of 1e-3, i.e.
//   ‖x − ref‖ / max(‖ref‖, 1e-3·√n), and the error is marked with *;
// - where the backend sums dq's columns (AttentionArgs.dq_colsum: flash2 on Hopper), those sums
//   against the fp64 column sums of the dq the call wrote ("dQsum"), written over poison at even T
//   and added to nonzero starting values at odd T, guards untouched;
// - flash2's fp32 copy of O (AttentionArgs.out_f32), from a second forward into a poisoned buffer:
//   every value rounds to the bf16 out of the first forward bit for bit, out and lse are unchanged,
//   the guards stay poison (so its error against fp64 is out's, within half a bf16 ulp);
// - outputs are poisoned with NaN (0xFF bytes) before every run, as are saved and workspace, and
//   every output element must be written: in the packed layout the q, k and v slots of dqkv tile
//   the buffer, so every element of it must be written; around every output region a guard of
//   poison must stay untouched; the backward must leave q, k, v, dout, out and lse as they were.
// Planted errors (attention_planted_*): the checks above run on corrupted copies of one case's
// results (hd 64, causal, T = 1000, s = 1, packed; flash2 when selected, else the first backend
// named) and must reject each: lse + 1e-3 nats; out × (1 + 2·TOL_OUT); dq, dk, dv × (1 + 2·TOL_GRAD);
// lse + 0.07 nats with gradients the backward would make from it (× e^−0.07, the reference given
// that lse agreeing), rejected by the true gradients.
// flash1 keeps O, m and ℓ in the workspace between key blocks of 256 or 512 keys, and its backward
// adds dQ there per key block of 128: T = 1000 is the case with several key blocks (T ≤ 127 has one).
// Grouped-query attention (NKV key/value heads, attention.h): the cases above are multi-head (NKV =
// NH); a second sweep runs, at s = 1, every head dim and both masks: NH = 16 with NKV in {1, 2, 4 =
// NH/4} at T = 1 and 17 (and NKV = 16 = NH at T = 17), NH = 8 with NKV in {1, 2 = NH/4, 8} at T = 127
// (both layouts; plain: k and v (B, T, NKV, HD)), and NH = 4 with NKV in {1, 2} at T = 300 (several
// key and query blocks per head; the fp64 reference of T = 1000 with several heads would take minutes).
// The reference is the same fp64 attention with NKV heads (cpu_reference.h), whose dK and dV sum over
// each group's query heads. Case names carry _nhH_nkvK.
// One more case replays flash2's causal forward from a CUDA graph (its tile counter's epoch is then
// the captured one, so the capture zeroes the counter): every replay bit-identical to a direct call.
// CPU-only cases (the dispatcher's checks, names and sizes) run everywhere. Every GPU case is listed
// before any runs (the PLAN line counts them) and reported: as SKIP where no GPU is found, where
// ATTENTION_TEST_SEQ_LENS leaves it out, and (flash2's _deterministic cases) where flash2 runs its
// mma.sync kernels, which are not deterministic.
#include <cuda_bf16.h>
#include <time.h>
#include <unistd.h>

#include "attention/attention.h"
#include "attention/flash2/sm90/flash2_backward_order.h"
#include "layers/cuda_common.h"
#include "test/cpu_reference.h"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

static const int HEAD_DIMS[] = {64, 80, 96, 128};
static const int SEQ_LENS[] = {1, 17, 64, 127, 1000};

// ATTENTION_TEST_SEQ_LENS=17,300 runs the multi-head sweep at those sequence lengths only (a quick
// run of a few shapes, e.g. under a debugger); the deterministic cases need 127 or more. Every other
// case is still listed, as SKIP, so the PLAN counts the default cases plus the list's new lengths.
static int g_list_lens[8];
static size_t g_num_list_lens = 0;
static int g_lens_listed = 0;  // 1: ATTENTION_TEST_SEQ_LENS is set

static void pick_seq_lens(void) {
    const char* list = getenv("ATTENTION_TEST_SEQ_LENS");
    if (!list || !list[0]) return;
    g_lens_listed = 1;
    for (const char* p = list; *p && g_num_list_lens < COUNT(g_list_lens);) {
        char* end;
        const long T = strtol(p, &end, 10);
        if (end == p || T < 1) {
            fprintf(stderr, "ATTENTION_TEST_SEQ_LENS: expected sequence lengths like 17,300, got \"%s\"\n", list);
            exit(2);
        }
        g_list_lens[g_num_list_lens++] = (int)T;
        p = *end == ',' ? end + 1 : end;
    }
}

static int in_list(const int* lens, size_t n, int T) {
    for (size_t i = 0; i < n; i++)
        if (lens[i] == T) return 1;
    return 0;
}

// Why a set of length T does not run under ATTENTION_TEST_SEQ_LENS (NULL: it runs); multi_head: the
// set belongs to the multi-head sweep, the only one the list runs.
static const char* seq_len_skip(int T, int multi_head) {
    if (!g_lens_listed) return NULL;
    if (!in_list(g_list_lens, g_num_list_lens, T)) return "not in ATTENTION_TEST_SEQ_LENS";
    return multi_head ? NULL : "ATTENTION_TEST_SEQ_LENS runs the multi-head sweep only";
}

static const double INPUT_SCALES[] = {1.0, 8.0};
static const AttentionBackend BACKENDS[] = {ATTN_NAIVE, ATTN_FLASH1, ATTN_FLASH2, ATTN_NAIVE_RECOMPUTE};
static const AttentionBackend FLASH_BACKENDS[] = {ATTN_FLASH1, ATTN_FLASH2};

// Bounds, each set from the error a correct kernel makes, measured over the ~6400 cases of every
// backend logged on H100s (scripts/results/*tests*.log), or simulated where it is the reference's:
// O: bf16 rounding of O (at most 2^-9 relative) and of P before P·V; measured <= 2.5e-3 (median 2.0e-3).
#define TOL_OUT 5e-3
// LSE: max |lse − ref| / (1 + rms ref). fp32 scores, exp, log and a sum over up to T keys err by a few
// fp32 ulps (6e-8) of the scores' size; measured <= 2.8e-7 as ‖x − ref‖/‖ref‖. In nats the bound is
// 7e-5 at T = 1000, s = 1 (rms LSE ~6) and 8e-4 at s = 8 (~75), so an offset of 1e-3 nats fails.
#define TOL_LSE 1e-5
// dQ, dK, dV on their own inputs: bf16 rounding of the gradients and of P and dS in the kernels'
// matmuls; measured <= 3.9e-3 (median 2.3e-3).
#define TOL_GRAD 1e-2
// dQ, dK, dV against the true gradients: the own-input error plus what bf16 O's rounding does through
// D = rowsum(dO ∘ O). The fp64 backward fed bf16(out) is off by <= 2.3e-3 at s = 1 and, near one-hot
// rows where D cancels dP, <= 1.6e-2 at s = 8 (1200 and 2400 simulated input sets); with the own-input
// 3.9e-3 added, the bounds are 2x (s = 1) and 3x (s = 8) the worst.
static double tol_true_grad(double scale) { return scale > 1.0 ? 5e-2 : 1e-2; }
// dQsum: bf16 rounding of each column sum (the kernel sums in fp32); measured <= 1.9e-3.
#define TOL_COLSUM 5e-3
#define ABS_FLOOR 1e-3  // rms below which a reference counts as zero (see the top comment)
#define GUARD 128       // elements of poison before and after every output region (256 or 512 bytes)

typedef enum { LAYOUT_PACKED = 0, LAYOUT_PLAIN = 1 } Layout;
static const char* LAYOUT_NAMES[] = {"packed", "plain"};

// The plain layout is tested for these inputs only.
static int plain_layout_case(int T, double scale) { return T == 127 && scale == 1.0; }

// FLASH2_MMA_SYNC=1 makes flash2 use its mma.sync kernels on Hopper too, FLASH2_FORWARD_LONG_T=1 its
// forward's long-sequence shape at every length (attention.h, AttentionFlash2Settings); the case
// names say so, since run_tests.sh runs flash2 those ways too.
static const char* backend_label(AttentionBackend backend) {
    const AttentionFlash2Settings flash2 = attention_flash2_settings();
    if (backend == ATTN_FLASH2 && flash2.mma_sync_forced) return "flash2-mma-sync";
    if (backend == ATTN_FLASH2 && flash2.forward_long_t > 0) return "flash2-long";
    return attention_backend_name(backend);
}

// Multi-head names are as before GQA; grouped-query ones add _nhH_nkvK.
static void case_name(char* buf, size_t size, AttentionBackend backend, const AttentionShape* s, double scale,
                      Layout layout, int deterministic) {
    char heads[32] = "";
    if (s->NKV != s->NH) snprintf(heads, sizeof(heads), "_nh%d_nkv%d", s->NH, s->NKV);
    snprintf(buf, size, "attention_%s_hd%d_%s_T%d_scale%g%s_%s%s", backend_label(backend), s->HD,
             s->causal ? "causal" : "full", s->T, scale, heads, LAYOUT_NAMES[layout],
             deterministic ? "_deterministic" : "");
}

// flash2's deterministic backward (AttentionArgs.deterministic; its Hopper kernels) is tested, on
// top of the plain runs, where the key blocks are several (T = 1000) and in the plain layout case
// (any T >= 127, for the shapes ATTENTION_TEST_SEQ_LENS picks).
// Listed everywhere; where flash2 runs its mma.sync kernels (not deterministic) they are SKIPped.
static int g_flash2_deterministic = 1;  // 0 where flash2 runs its mma.sync kernels
static int deterministic_case(AttentionBackend backend, int T, double scale) {
    return backend == ATTN_FLASH2 && scale == 1.0 && T >= 127;
}

// ---- inputs and the reference ----------------------------------------------------------------------

typedef struct {
    AttentionShape shape;
    double scale;
    size_t n;             // B·T·NH·HD, elements of one of q, out, dout
    size_t n_kv;          // B·T·NKV·HD, elements of one of k, v
    size_t n_qkv;         // n + 2·n_kv
    size_t n_lse;         // B·NH·T
    uint16_t* qkv_bits;   // (B, T, NH + 2·NKV, HD) bf16
    uint16_t* dout_bits;  // (B, T, NH, HD) bf16
    double *qkv, *dout;   // the same values
    double *ref_out, *ref_lse;
    double* ref_dqkv;     // (B, T, NH + 2·NKV, HD) the true gradients: the backward from ref_out, ref_lse
} InputSet;

static InputSet make_inputs(int B, int T, int NH, int NKV, int HD, int causal, double scale, uint64_t seed) {
    InputSet in;
    memset(&in, 0, sizeof(in));
    in.shape.B = B;
    in.shape.T = T;
    in.shape.NH = NH;
    in.shape.NKV = NKV;
    in.shape.HD = HD;
    in.shape.causal = causal;
    in.scale = scale;
    in.n = (size_t)B * T * NH * HD;
    in.n_kv = (size_t)B * T * NKV * HD;
    in.n_qkv = in.n + 2 * in.n_kv;
    in.n_lse = (size_t)B * NH * T;
    in.qkv_bits = (uint16_t*)malloc(in.n_qkv * sizeof(uint16_t));
    in.dout_bits = (uint16_t*)malloc(in.n * sizeof(uint16_t));
    if (!in.qkv_bits || !in.dout_bits) {
        fprintf(stderr, "test: out of host memory\n");
        exit(2);
    }
    in.qkv = test_alloc(in.n_qkv);
    in.dout = test_alloc(in.n);
    in.ref_out = test_alloc(in.n);
    in.ref_lse = test_alloc(in.n_lse);
    in.ref_dqkv = test_alloc(in.n_qkv);  // zeroed: the reference backward adds into it
    TestRng rng = {seed};
    for (size_t i = 0; i < in.n_qkv; i++) {
        in.qkv_bits[i] = test_float_to_bf16((float)test_rng_uniform(&rng, -scale, scale));
        in.qkv[i] = test_bf16_to_float(in.qkv_bits[i]);
    }
    for (size_t i = 0; i < in.n; i++) {
        in.dout_bits[i] = test_float_to_bf16((float)test_rng_uniform(&rng, -1.0, 1.0));
        in.dout[i] = test_bf16_to_float(in.dout_bits[i]);
    }
    ref_attention_forward(in.ref_out, in.ref_lse, in.qkv, B, T, NH, NKV, HD, causal);
    return in;
}

// The true gradients (ref_dqkv, zero until then), which the graph case does without.
static void add_true_gradients(InputSet* in) {
    const AttentionShape* s = &in->shape;
    ref_attention_backward(in->ref_dqkv, in->dout, in->qkv, in->ref_out, in->ref_lse, s->B, s->T, s->NH, s->NKV,
                           s->HD, s->causal);
}

static void free_inputs(InputSet* in) {
    free(in->qkv_bits);
    free(in->dout_bits);
    free(in->qkv);
    free(in->dout);
    free(in->ref_out);
    free(in->ref_lse);
    free(in->ref_dqkv);
}

// ---- checks ------------------------------------------------------------------------------------------

// ‖x − ref‖ / max(‖ref‖, ABS_FLOOR·√n) over n elements; *floored says whether the floor was used.
// NaN anywhere gives NaN, which fails every `<=` bound.
static double floored_rel_error(const double* x, const double* ref, size_t n, int* floored) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    double floor2 = ABS_FLOOR * ABS_FLOOR * (double)n;
    *floored = den < floor2;
    return sqrt(num / (den < floor2 ? floor2 : den));
}

// The LSE's error: max over rows of |lse − ref|, in nats, over 1 + the rms of ref (TOL_LSE says why).
// NaN anywhere gives NaN.
static double lse_error(const double* lse, const double* ref, size_t n) {
    double worst = 0.0, sum2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs(lse[i] - ref[i]);
        if (!(d <= worst)) worst = d;  // NaN sticks
        sum2 += ref[i] * ref[i];
    }
    return worst / (1.0 + sqrt(sum2 / (double)(n ? n : 1)));
}

static int f32_bits_is_finite(uint32_t u) { return (u & 0x7F800000u) != 0x7F800000u; }

// Element offset of row (b, t, h) for a tensor with rows at `stride` (attention.h's layout rule).
static size_t row_offset(const AttentionShape* s, int b, int t, int h, long stride) {
    return ((size_t)b * s->T + t) * (size_t)stride + (size_t)h * s->HD;
}

// Slot `which` (0 q, 1 k, 2 v) of a token's row in the packed (B, T, NH + 2·NKV, HD) layout: its
// heads (NH for q, NKV for k and v) and their first value's offset within the row.
static int slot_heads(const AttentionShape* s, int which) { return which == 0 ? s->NH : s->NKV; }
static size_t slot_start(const AttentionShape* s, int which) {
    return (size_t)(which == 0 ? 0 : which == 1 ? s->NH : s->NH + s->NKV) * s->HD;
}
static long packed_row(const AttentionShape* s) { return (long)(s->NH + 2 * s->NKV) * s->HD; }

// Copies slot `which` of a tensor whose rows (b, t, h) lie at `base` + row_offset(stride) into the
// same slot of a packed (B, T, NH + 2·NKV, HD) array of doubles.
static void gather_bf16(double* dst, int which, const uint16_t* base, long stride, const AttentionShape* s) {
    for (int b = 0; b < s->B; b++)
        for (int t = 0; t < s->T; t++)
            for (int h = 0; h < slot_heads(s, which); h++) {
                const uint16_t* src = base + row_offset(s, b, t, h, stride);
                size_t d0 = row_offset(s, b, t, h, packed_row(s)) + slot_start(s, which);
                for (int d = 0; d < s->HD; d++) dst[d0 + d] = test_bf16_to_float(src[d]);
            }
}

// Relative error of slot `which` (0 q, 1 k, 2 v) of two packed (B, T, NH + 2·NKV, HD) arrays.
static double slot_error(const double* x, const double* ref, int which, const AttentionShape* s, int* floored) {
    size_t row = (size_t)slot_heads(s, which) * s->HD, n = (size_t)s->B * s->T * row;
    double* a = test_alloc(n);
    double* r = test_alloc(n);
    size_t i = 0, at = slot_start(s, which), w = (size_t)packed_row(s);
    for (size_t bt = 0; bt < (size_t)s->B * s->T; bt++)
        for (size_t e = 0; e < row; e++, i++) {
            a[i] = x[bt * w + at + e];
            r[i] = ref[bt * w + at + e];
        }
    double err = floored_rel_error(a, r, n, floored);
    free(a);
    free(r);
    return err;
}

// ---- one GPU case ------------------------------------------------------------------------------------

// Device memory of one case. Output regions sit between guards of GUARD elements:
//   out:  [guard | out (B, T, NH, HD) | guard],  lse: [guard | lse (B, NH, T) | guard]
//   dqkv packed: [guard | dqkv (B, T, NH + 2·NKV, HD) | guard]
//   dqkv plain:  [guard | dq | guard | dk | guard | dv | guard], dq (B, T, NH, HD), dk, dv (B, T, NKV, HD)
// q, k, v: one buffer, packed (B, T, NH + 2·NKV, HD) or plain q | k | v.
typedef struct {
    __nv_bfloat16 *qkv, *dout, *out_buf, *dqkv_buf;
    float* lse_buf;
    void *saved, *workspace;
    size_t qkv_elems, out_buf_elems, lse_buf_elems, dqkv_buf_elems, saved_bytes, workspace_bytes;
    size_t dq_at, dk_at, dv_at;  // element offsets of dq, dk, dv in dqkv_buf
    // dq's column sums (AttentionArgs.dq_colsum) where the backend makes them: [guard | NH·HD | guard]
    __nv_bfloat16* colsum_buf;
    uint16_t* colsum_start;  // (NH·HD) the starting values when accumulating (odd T)
    AttentionArgs args;
} CaseBuffers;

static CaseBuffers case_alloc(const InputSet* in, AttentionBackend backend, Layout layout,
                              const uint16_t* qkv_upload) {
    const AttentionShape* s = &in->shape;
    const long row = (long)s->NH * s->HD, kv_row = (long)s->NKV * s->HD, packed = packed_row(s);
    CaseBuffers c;
    memset(&c, 0, sizeof(c));
    c.qkv_elems = in->n_qkv;
    c.out_buf_elems = in->n + 2 * GUARD;
    c.lse_buf_elems = in->n_lse + 2 * GUARD;
    c.dqkv_buf_elems = layout == LAYOUT_PACKED ? in->n_qkv + 2 * GUARD : in->n_qkv + 4 * GUARD;
    c.saved_bytes = attention_saved_bytes(backend, s);
    c.workspace_bytes = attention_workspace_bytes(backend, s);
    c.qkv = (__nv_bfloat16*)device_alloc(c.qkv_elems * sizeof(uint16_t));
    c.dout = (__nv_bfloat16*)device_alloc(in->n * sizeof(uint16_t));
    c.out_buf = (__nv_bfloat16*)device_alloc(c.out_buf_elems * sizeof(uint16_t));
    c.lse_buf = (float*)device_alloc(c.lse_buf_elems * sizeof(float));
    c.dqkv_buf = (__nv_bfloat16*)device_alloc(c.dqkv_buf_elems * sizeof(uint16_t));
    c.saved = device_alloc(c.saved_bytes);
    c.workspace = device_alloc(c.workspace_bytes);
    CUDA_CHECK(cudaMemcpy(c.qkv, qkv_upload, c.qkv_elems * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(c.dout, in->dout_bits, in->n * sizeof(uint16_t), cudaMemcpyHostToDevice));

    AttentionArgs* a = &c.args;
    a->shape = *s;
    if (layout == LAYOUT_PACKED) {  // one stride for all (kv_stride, dkv_stride 0: the same)
        a->q = c.qkv;
        a->k = c.qkv + row;
        a->v = c.qkv + row + kv_row;
        a->qkv_stride = packed;
        c.dq_at = GUARD;
        c.dk_at = GUARD + row;
        c.dv_at = GUARD + row + kv_row;
        a->dqkv_stride = packed;
    } else {
        a->q = c.qkv;
        a->k = c.qkv + in->n;
        a->v = c.qkv + in->n + in->n_kv;
        a->qkv_stride = row;
        a->kv_stride = kv_row;
        c.dq_at = GUARD;
        c.dk_at = 2 * GUARD + in->n;
        c.dv_at = 3 * GUARD + in->n + in->n_kv;
        a->dqkv_stride = row;
        a->dkv_stride = kv_row;
    }
    a->out = c.out_buf + GUARD;
    a->out_stride = row;
    a->lse = c.lse_buf + GUARD;
    a->dout = c.dout;
    a->dq = c.dqkv_buf + c.dq_at;
    a->dk = c.dqkv_buf + c.dk_at;
    a->dv = c.dqkv_buf + c.dv_at;
    a->saved = c.saved;
    a->workspace = c.workspace;
    if (attention_sums_dq_columns(backend, s)) {  // "=" at even T, "+=" onto nonzero values at odd T
        const size_t cols = (size_t)s->NH * s->HD;
        c.colsum_buf = (__nv_bfloat16*)device_alloc((cols + 2 * GUARD) * sizeof(uint16_t));
        c.colsum_start = (uint16_t*)malloc(cols * sizeof(uint16_t));
        for (size_t i = 0; i < cols; i++) c.colsum_start[i] = test_float_to_bf16(0.25f * (float)((int)(i % 7) - 3));
        a->dq_colsum = c.colsum_buf + GUARD;
        a->dq_colsum_accumulate = s->T % 2;
    }
    return c;
}

// Poisons dq_colsum and its guards, then uploads the starting values when accumulating.
static void colsum_reset(const CaseBuffers* c) {
    if (!c->colsum_buf) return;
    const size_t cols = (size_t)c->args.shape.NH * c->args.shape.HD;
    CUDA_CHECK(cudaMemset(c->colsum_buf, 0xFF, (cols + 2 * GUARD) * sizeof(uint16_t)));
    if (c->args.dq_colsum_accumulate)
        CUDA_CHECK(cudaMemcpy(c->colsum_buf + GUARD, c->colsum_start, cols * sizeof(uint16_t), cudaMemcpyHostToDevice));
}

// dq_colsum against the fp64 column sums of the dq this backward wrote (dqkv_host, dq at dq_at)
// plus the starting values; guards untouched, every value written. Returns the relative error.
static double colsum_check(const CaseBuffers* c, const uint16_t* colsum_host, const uint16_t* dqkv_host,
                           char* problems, size_t size) {
    const AttentionShape* s = &c->args.shape;
    const size_t cols = (size_t)s->NH * s->HD;
    double* ref = test_alloc(cols);
    double* gpu = test_alloc(cols);
    for (size_t bt = 0; bt < (size_t)s->B * s->T; bt++)
        for (size_t o = 0; o < cols; o++) ref[o] += test_bf16_to_float(dqkv_host[c->dq_at + bt * c->args.dqkv_stride + o]);
    size_t bad = 0;
    for (size_t o = 0; o < cols; o++) {
        if (c->args.dq_colsum_accumulate) ref[o] += test_bf16_to_float(c->colsum_start[o]);
        bad += !bf16_is_finite(colsum_host[GUARD + o]);
        gpu[o] = test_bf16_to_float(colsum_host[GUARD + o]);
    }
    if (bad) add_problem(problems, size, "%zu of %zu dq_colsum values non-finite or unwritten", bad, cols);
    if (changed_poison_bytes(colsum_host, GUARD * 2) || changed_poison_bytes(colsum_host + GUARD + cols, GUARD * 2))
        add_problem(problems, size, "backward wrote outside dq_colsum");
    int floored = 0;
    const double err = floored_rel_error(gpu, ref, cols, &floored);
    if (!(err <= TOL_COLSUM)) add_problem(problems, size, "dq_colsum relative error %.3e > %.0e", err, TOL_COLSUM);
    free(ref);
    free(gpu);
    return err;
}

// dq_colsum's buffer and its guards, copied to the host (NULL when the case has none).
static uint16_t* colsum_fetch(const CaseBuffers* c) {
    if (!c->colsum_buf) return NULL;
    const size_t elems = (size_t)c->args.shape.NH * c->args.shape.HD + 2 * GUARD;
    uint16_t* host = (uint16_t*)malloc(elems * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(host, c->colsum_buf, elems * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return host;
}

static void case_free(CaseBuffers* c) {
    CUDA_CHECK(cudaFree(c->qkv));
    CUDA_CHECK(cudaFree(c->dout));
    CUDA_CHECK(cudaFree(c->out_buf));
    CUDA_CHECK(cudaFree(c->lse_buf));
    CUDA_CHECK(cudaFree(c->dqkv_buf));
    if (c->saved) CUDA_CHECK(cudaFree(c->saved));
    if (c->workspace) CUDA_CHECK(cudaFree(c->workspace));
    if (c->colsum_buf) CUDA_CHECK(cudaFree(c->colsum_buf));
    free(c->colsum_start);
}

// q, k, v as uploaded: the packed bits as they are, or (plain layout) q | k | v one after the other
// in a new buffer, which the caller frees.
static uint16_t* qkv_for_upload(const InputSet* in, Layout layout) {
    if (layout != LAYOUT_PLAIN) return in->qkv_bits;
    const AttentionShape* s = &in->shape;
    const long packed = packed_row(s);
    uint16_t* upload = (uint16_t*)malloc(in->n_qkv * sizeof(uint16_t));
    const size_t plain_at[3] = {0, in->n, in->n + in->n_kv};
    for (size_t bt = 0; bt < (size_t)s->B * s->T; bt++)
        for (int w = 0; w < 3; w++) {
            const size_t slot_row = (size_t)slot_heads(s, w) * s->HD;
            memcpy(upload + plain_at[w] + bt * slot_row, in->qkv_bits + bt * packed + slot_start(s, w),
                   slot_row * sizeof(uint16_t));
        }
    return upload;
}

// What a case's forward left: out and lse with their guards as copied back, the same values as
// doubles (no guards), and how many of each were non-finite or unwritten.
typedef struct {
    uint16_t* out_host;  // out_buf_elems
    uint32_t* lse_host;  // lse_buf_elems
    double *out, *lse;   // n, n_lse
    size_t bad_out, bad_lse;
} ForwardResult;

// The forward on poisoned outputs, saved and workspace: every value of out and lse written, no guard
// touched.
static ForwardResult run_forward(const CaseBuffers* c, const InputSet* in, AttentionBackend backend,
                                 const AttentionContext* ctx, cudaStream_t stream, const char* name, char* problems,
                                 size_t size) {
    const size_t n = in->n, n_lse = in->n_lse;
    // poison on the default stream, then wait: the kernels run on a non-blocking stream
    CUDA_CHECK(cudaMemset(c->out_buf, 0xFF, c->out_buf_elems * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemset(c->lse_buf, 0xFF, c->lse_buf_elems * sizeof(float)));
    if (c->saved) CUDA_CHECK(cudaMemset(c->saved, 0xFF, c->saved_bytes));
    if (c->workspace) CUDA_CHECK(cudaMemset(c->workspace, 0xFF, c->workspace_bytes));
    CUDA_CHECK(cudaDeviceSynchronize());
    attention_forward(backend, ctx, &c->args, stream);
    sync_or_die(stream, name, "forward");

    ForwardResult f;
    f.out_host = (uint16_t*)malloc(c->out_buf_elems * sizeof(uint16_t));
    f.lse_host = (uint32_t*)malloc(c->lse_buf_elems * sizeof(uint32_t));
    CUDA_CHECK(cudaMemcpy(f.out_host, c->out_buf, c->out_buf_elems * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(f.lse_host, c->lse_buf, c->lse_buf_elems * sizeof(float), cudaMemcpyDeviceToHost));
    f.bad_out = f.bad_lse = 0;
    for (size_t i = 0; i < n; i++) f.bad_out += !bf16_is_finite(f.out_host[GUARD + i]);
    for (size_t i = 0; i < n_lse; i++) f.bad_lse += !f32_bits_is_finite(f.lse_host[GUARD + i]);
    if (f.bad_out) add_problem(problems, size, "%zu of %zu out elements non-finite or unwritten", f.bad_out, n);
    if (f.bad_lse) add_problem(problems, size, "%zu of %zu lse values non-finite or unwritten", f.bad_lse, n_lse);
    if (changed_poison_bytes(f.out_host, GUARD * 2) || changed_poison_bytes(f.out_host + GUARD + n, GUARD * 2))
        add_problem(problems, size, "forward wrote outside out");
    if (changed_poison_bytes(f.lse_host, GUARD * 4) || changed_poison_bytes(f.lse_host + GUARD + n_lse, GUARD * 4))
        add_problem(problems, size, "forward wrote outside lse");
    f.out = test_alloc(n);
    f.lse = test_alloc(n_lse);
    for (size_t i = 0; i < n; i++) f.out[i] = test_bf16_to_float(f.out_host[GUARD + i]);
    for (size_t i = 0; i < n_lse; i++) {
        float x;
        memcpy(&x, &f.lse_host[GUARD + i], sizeof(x));
        f.lse[i] = x;
    }
    return f;
}

static void forward_result_free(ForwardResult* f) {
    free(f->out_host);
    free(f->lse_host);
    free(f->out);
    free(f->lse);
}

// The backward on a poisoned dqkv buffer, workspace and dq_colsum (`what` names the run if it fails).
// Returns dqkv_buf as copied back, and in *colsum_host dq_colsum's buffer (NULL where the case has
// none); the caller frees both.
static uint16_t* run_backward(const CaseBuffers* c, AttentionBackend backend, const AttentionContext* ctx,
                              cudaStream_t stream, const char* name, const char* what, uint16_t** colsum_host) {
    CUDA_CHECK(cudaMemset(c->dqkv_buf, 0xFF, c->dqkv_buf_elems * sizeof(uint16_t)));
    if (c->workspace) CUDA_CHECK(cudaMemset(c->workspace, 0xFF, c->workspace_bytes));
    colsum_reset(c);
    CUDA_CHECK(cudaDeviceSynchronize());
    attention_backward(backend, ctx, &c->args, stream);
    sync_or_die(stream, name, what);
    *colsum_host = colsum_fetch(c);
    uint16_t* dqkv_host = (uint16_t*)malloc(c->dqkv_buf_elems * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(dqkv_host, c->dqkv_buf, c->dqkv_buf_elems * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return dqkv_host;
}

static const char* SLOT_NAMES[3] = {"dq", "dk", "dv"};

// Every element of dq, dk and dv written and no guard touched. In the packed layout the q, k and v
// slots tile the buffer, so every element of it must have been written.
static void check_dqkv_written(const CaseBuffers* c, const InputSet* in, Layout layout, const uint16_t* dqkv_host,
                               char* problems, size_t size) {
    const AttentionShape* s = &in->shape;
    const size_t n_qkv = in->n_qkv;
    if (layout == LAYOUT_PACKED) {
        const long packed = packed_row(s);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n_qkv; i++)
            if (!bf16_is_finite(dqkv_host[GUARD + i]) && bad++ == 0) first = i;
        if (bad) {
            const size_t e = first % packed, bt = first / packed, head = e / s->HD;
            const int w = head < (size_t)s->NH ? 0 : head < (size_t)(s->NH + s->NKV) ? 1 : 2;
            add_problem(problems, size,
                        "%zu of %zu elements of the packed dqkv buffer non-finite or unwritten, the first in %s at "
                        "b=%zu t=%zu h=%zu d=%zu",
                        bad, n_qkv, SLOT_NAMES[w], bt / s->T, bt % s->T, (e - slot_start(s, w)) / s->HD, e % s->HD);
        }
        if (changed_poison_bytes(dqkv_host, GUARD * 2) || changed_poison_bytes(dqkv_host + GUARD + n_qkv, GUARD * 2))
            add_problem(problems, size, "backward wrote outside the packed dqkv buffer");
        return;
    }
    const size_t slot_at[3] = {c->dq_at, c->dk_at, c->dv_at};
    const size_t slot_n[3] = {in->n, in->n_kv, in->n_kv};
    for (int w = 0; w < 3; w++) {
        size_t bad = 0;
        for (size_t i = 0; i < slot_n[w]; i++) bad += !bf16_is_finite(dqkv_host[slot_at[w] + i]);
        if (bad)
            add_problem(problems, size, "%zu of %zu %s elements non-finite or unwritten", bad, slot_n[w],
                        SLOT_NAMES[w]);
        if (changed_poison_bytes(dqkv_host + slot_at[w] - GUARD, GUARD * 2))
            add_problem(problems, size, "backward wrote into the guard before %s", SLOT_NAMES[w]);
    }
    if (changed_poison_bytes(dqkv_host + c->dv_at + in->n_kv, GUARD * 2))
        add_problem(problems, size, "backward wrote into the guard after dv");
}

// Deterministic mode: a second backward, on freshly poisoned outputs and workspace, is bit-identical
// to the first (dqkv_host, colsum_host).
static void check_rerun_identical(const CaseBuffers* c, AttentionBackend backend, const AttentionContext* ctx,
                                  cudaStream_t stream, const char* name, const uint16_t* dqkv_host,
                                  const uint16_t* colsum_host, char* problems, size_t size) {
    uint16_t* colsum_again = NULL;
    uint16_t* again = run_backward(c, backend, ctx, stream, name, "second backward", &colsum_again);
    size_t differ = 0;
    for (size_t i = 0; i < c->dqkv_buf_elems; i++) differ += again[i] != dqkv_host[i];
    if (differ)
        add_problem(problems, size, "two deterministic backward runs differ in %zu of %zu values", differ,
                    c->dqkv_buf_elems);
    const size_t colsum_bytes = ((size_t)c->args.shape.NH * c->args.shape.HD + 2 * GUARD) * 2;
    if (colsum_again && memcmp(colsum_again, colsum_host, colsum_bytes) != 0)
        add_problem(problems, size, "two deterministic backward runs differ in dq_colsum");
    free(colsum_again);
    free(again);
}

// The backward's inputs must be as they were: q, k, v as uploaded, dout, and out and lse (guards
// included) as the forward left them.
static void check_inputs_unchanged(const CaseBuffers* c, const InputSet* in, const uint16_t* qkv_upload,
                                   const ForwardResult* f, char* problems, size_t size) {
    const size_t n = in->n, n_qkv = in->n_qkv;
    uint16_t* out_after = (uint16_t*)malloc(c->out_buf_elems * sizeof(uint16_t));
    uint32_t* lse_after = (uint32_t*)malloc(c->lse_buf_elems * sizeof(uint32_t));
    uint16_t* qkv_after = (uint16_t*)malloc(n_qkv * sizeof(uint16_t));
    uint16_t* dout_after = (uint16_t*)malloc(n * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(out_after, c->out_buf, c->out_buf_elems * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(lse_after, c->lse_buf, c->lse_buf_elems * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(qkv_after, c->qkv, n_qkv * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(dout_after, c->dout, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    if (memcmp(out_after, f->out_host, c->out_buf_elems * sizeof(uint16_t)) != 0)
        add_problem(problems, size, "backward changed out or its guards");
    if (memcmp(lse_after, f->lse_host, c->lse_buf_elems * sizeof(uint32_t)) != 0)
        add_problem(problems, size, "backward changed lse or its guards");
    if (memcmp(qkv_after, qkv_upload, n_qkv * sizeof(uint16_t)) != 0) add_problem(problems, size, "q, k or v changed");
    if (memcmp(dout_after, in->dout_bits, n * sizeof(uint16_t)) != 0) add_problem(problems, size, "dout changed");
    free(out_after);
    free(lse_after);
    free(qkv_after);
    free(dout_after);
}

// ---- errors and their bounds -------------------------------------------------------------------------

// What a case produced, as doubles whatever its layout, and the reference backward given its own out
// and lse.
typedef struct {
    double *out, *lse;     // (B, T, NH, HD), (B, NH, T)
    double* dqkv;          // (B, T, NH + 2·NKV, HD) packed
    double* own_ref_dqkv;  // (B, T, NH + 2·NKV, HD) ref_attention_backward given out and lse
} CaseValues;

// The errors a case is checked by (top comment), in print order.
enum { ERR_O, ERR_LSE, ERR_DQ, ERR_DK, ERR_DV, ERR_TRUE_DQ, ERR_TRUE_DK, ERR_TRUE_DV, NUM_ERRS };
static const char* ERR_NAMES[NUM_ERRS] = {"O", "LSE", "dQ", "dK", "dV", "true dQ", "true dK", "true dV"};

static double error_bound(int e, double scale) {
    if (e == ERR_O) return TOL_OUT;
    if (e == ERR_LSE) return TOL_LSE;
    return e <= ERR_DV ? TOL_GRAD : tol_true_grad(scale);
}

// The forward's out and lse and the backward's dq, dk, dv (dqkv_host, in this case's layout) as
// doubles, and the reference backward given that out and lse.
static CaseValues case_values(const CaseBuffers* c, const InputSet* in, const ForwardResult* f,
                              const uint16_t* dqkv_host) {
    const AttentionShape* s = &in->shape;
    const AttentionArgs* a = &c->args;
    CaseValues v;
    v.out = test_alloc(in->n);
    v.lse = test_alloc(in->n_lse);
    memcpy(v.out, f->out, in->n * sizeof(double));
    memcpy(v.lse, f->lse, in->n_lse * sizeof(double));
    v.dqkv = test_alloc(in->n_qkv);
    const size_t slot_at[3] = {c->dq_at, c->dk_at, c->dv_at};
    const long slot_stride[3] = {a->dqkv_stride, attention_dkv_stride(a), attention_dkv_stride(a)};
    for (int w = 0; w < 3; w++) gather_bf16(v.dqkv, w, dqkv_host + slot_at[w], slot_stride[w], s);
    v.own_ref_dqkv = test_alloc(in->n_qkv);  // zeroed: the reference backward adds into it
    ref_attention_backward(v.own_ref_dqkv, in->dout, in->qkv, v.out, v.lse, s->B, s->T, s->NH, s->NKV, s->HD,
                           s->causal);
    return v;
}

static CaseValues values_copy(const InputSet* in, const CaseValues* v) {
    CaseValues w;
    w.out = test_alloc(in->n);
    w.lse = test_alloc(in->n_lse);
    w.dqkv = test_alloc(in->n_qkv);
    w.own_ref_dqkv = test_alloc(in->n_qkv);
    memcpy(w.out, v->out, in->n * sizeof(double));
    memcpy(w.lse, v->lse, in->n_lse * sizeof(double));
    memcpy(w.dqkv, v->dqkv, in->n_qkv * sizeof(double));
    memcpy(w.own_ref_dqkv, v->own_ref_dqkv, in->n_qkv * sizeof(double));
    return w;
}

static void values_free(CaseValues* v) {
    free(v->out);
    free(v->lse);
    free(v->dqkv);
    free(v->own_ref_dqkv);
    memset(v, 0, sizeof(*v));
}

// Every error of v against the input set's references (err, floored: NUM_ERRS each).
static void value_errors(const InputSet* in, const CaseValues* v, double* err, int* floored) {
    err[ERR_O] = floored_rel_error(v->out, in->ref_out, in->n, &floored[ERR_O]);
    err[ERR_LSE] = lse_error(v->lse, in->ref_lse, in->n_lse);
    floored[ERR_LSE] = 0;
    for (int w = 0; w < 3; w++) {
        err[ERR_DQ + w] = slot_error(v->dqkv, v->own_ref_dqkv, w, &in->shape, &floored[ERR_DQ + w]);
        err[ERR_TRUE_DQ + w] = slot_error(v->dqkv, in->ref_dqkv, w, &in->shape, &floored[ERR_TRUE_DQ + w]);
    }
}

// Prints the case's line of errors (and dq_colsum's, checked here where the case has one) and reports
// the case with every problem found.
static void report_case(const char* name, const InputSet* in, const CaseBuffers* c, const CaseValues* v,
                        const ForwardResult* f, const uint16_t* dqkv_host, const uint16_t* colsum_host,
                        char* problems, size_t size) {
    double err[NUM_ERRS];
    int floored[NUM_ERRS];
    value_errors(in, v, err, floored);
    char line[512];
    int at = snprintf(line, sizeof(line), "%s:", name);
    for (int e = 0; e < NUM_ERRS; e++)
        at += snprintf(line + at, sizeof(line) - at, "%s %s %.2e%s", e == ERR_TRUE_DQ ? " |" : "", ERR_NAMES[e],
                       err[e], floored[e] ? "*" : "");
    if (colsum_host)
        snprintf(line + at, sizeof(line) - at, " | dQsum%s %.2e", c->args.dq_colsum_accumulate ? "+=" : "",
                 colsum_check(c, colsum_host, dqkv_host, problems, size));
    printf("%s\n", line);
    for (int e = 0; e < NUM_ERRS; e++)
        if (!(err[e] <= error_bound(e, in->scale)))
            add_problem(problems, size, "%s error %.3e > %.0e", ERR_NAMES[e], err[e], error_bound(e, in->scale));
    if (f->bad_out || f->bad_lse)
        add_problem(problems, size, "(the backward reference used this forward's non-finite out/lse)");
    test_report(name, problems[0] == 0, "%s", problems);
}

// Where the backend writes O in fp32 too (AttentionArgs.out_f32): the forward again with out_f32 into a
// poisoned buffer. Every fp32 value must round (to nearest even) to the bf16 out of the first forward,
// bit for bit; out and lse must come out as that forward's (the fp32 copy changes nothing else); the
// guards around out_f32 stay poison. f: the first forward's result.
static void check_fp32_out(CaseBuffers* c, const InputSet* in, AttentionBackend backend, const AttentionContext* ctx,
                           cudaStream_t stream, const char* name, const ForwardResult* f, char* problems,
                           size_t size) {
    const size_t n = in->n, buf_elems = n + 2 * GUARD;
    float* buf = (float*)device_alloc(buf_elems * sizeof(float));
    CUDA_CHECK(cudaMemset(buf, 0xFF, buf_elems * sizeof(float)));
    c->args.out_f32 = buf + GUARD;
    char ignored[256] = "";  // the second forward's own checks repeat the first's
    ForwardResult again = run_forward(c, in, backend, ctx, stream, name, ignored, sizeof(ignored));
    c->args.out_f32 = NULL;
    uint32_t* host = (uint32_t*)malloc(buf_elems * sizeof(uint32_t));
    CUDA_CHECK(cudaMemcpy(host, buf, buf_elems * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, &host[GUARD + i], sizeof(x));
        if ((!f32_bits_is_finite(host[GUARD + i]) || test_float_to_bf16(x) != f->out_host[GUARD + i]) && bad++ == 0)
            first = i;
    }
    if (bad) add_problem(problems, size, "out_f32: %zu of %zu values unwritten or not rounding to out (first at %zu)",
                         bad, n, first);
    if (memcmp(again.out_host, f->out_host, c->out_buf_elems * sizeof(uint16_t)) != 0 ||
        memcmp(again.lse_host, f->lse_host, c->lse_buf_elems * sizeof(float)) != 0)
        add_problem(problems, size, "out_f32: out or lse differ from the forward without it");
    if (changed_poison_bytes(host, GUARD * 4) || changed_poison_bytes(host + GUARD + n, GUARD * 4))
        add_problem(problems, size, "forward wrote outside out_f32");
    free(host);
    forward_result_free(&again);
    CUDA_CHECK(cudaFree(buf));
}

// One case: the forward, then the backward (the top comment lists the checks). keep: where not NULL,
// receives the case's values (for the planted errors), which the caller frees.
static void run_case(const InputSet* in, AttentionBackend backend, Layout layout, int deterministic,
                     const AttentionContext* ctx, cudaStream_t stream, const char* name, CaseValues* keep) {
    char why[256];
    if (attention_check(backend, &in->shape, why, sizeof(why)) != 0) {
        test_fail(name, "attention_check refused the shape: %s", why);
        return;
    }
    uint16_t* qkv_upload = qkv_for_upload(in, layout);
    CaseBuffers c = case_alloc(in, backend, layout, qkv_upload);
    c.args.deterministic = deterministic;
    char problems[1024] = "";

    ForwardResult f = run_forward(&c, in, backend, ctx, stream, name, problems, sizeof(problems));
    uint16_t* colsum_host = NULL;
    uint16_t* dqkv_host = run_backward(&c, backend, ctx, stream, name, "backward", &colsum_host);
    check_dqkv_written(&c, in, layout, dqkv_host, problems, sizeof(problems));
    if (deterministic)
        check_rerun_identical(&c, backend, ctx, stream, name, dqkv_host, colsum_host, problems, sizeof(problems));
    check_inputs_unchanged(&c, in, qkv_upload, &f, problems, sizeof(problems));
    if (attention_writes_fp32_out(backend))
        check_fp32_out(&c, in, backend, ctx, stream, name, &f, problems, sizeof(problems));
    CaseValues v = case_values(&c, in, &f, dqkv_host);
    report_case(name, in, &c, &v, &f, dqkv_host, colsum_host, problems, sizeof(problems));
    if (keep) *keep = v;
    else values_free(&v);

    free(dqkv_host);
    free(colsum_host);
    forward_result_free(&f);
    if (qkv_upload != in->qkv_bits) free(qkv_upload);
    case_free(&c);
}

// ---- planted errors ----------------------------------------------------------------------------------

// Each corrupts a copy of one case's values; the checks must then reject it (top comment).
typedef enum { PLANT_LSE_OFFSET, PLANT_OUT_SCALE, PLANT_GRAD_SCALE, PLANT_CONSISTENT_LSE_OFFSET, NUM_PLANTS } Plant;
static const char* PLANT_NAMES[NUM_PLANTS] = {
    "attention_planted_lse_offset_1e-3_nats_rejected",
    "attention_planted_out_scaled_by_twice_its_bound_rejected",
    "attention_planted_gradients_scaled_by_twice_their_bound_rejected",
    "attention_planted_lse_offset_0_07_nats_with_its_backward_rejected_by_true_gradients",
};
#define PLANT_LSE_NATS 1e-3
#define PLANT_CONSISTENT_LSE_NATS 0.07  // what the old 1e-2 relative LSE bound let through at T = 1000

// Corrupts w, a copy of a case's values, as plant p does; marks in target the errors that must then
// exceed their bounds.
static void plant_corrupt(Plant p, const InputSet* in, CaseValues* w, int* target) {
    const AttentionShape* s = &in->shape;
    if (p == PLANT_LSE_OFFSET) {
        for (size_t i = 0; i < in->n_lse; i++) w->lse[i] += PLANT_LSE_NATS;
        target[ERR_LSE] = 1;
    } else if (p == PLANT_OUT_SCALE) {
        for (size_t i = 0; i < in->n; i++) w->out[i] *= 1.0 + 2.0 * TOL_OUT;
        target[ERR_O] = 1;
    } else if (p == PLANT_GRAD_SCALE) {
        for (size_t i = 0; i < in->n_qkv; i++) w->dqkv[i] *= 1.0 + 2.0 * TOL_GRAD;
        target[ERR_DQ] = target[ERR_DK] = target[ERR_DV] = 1;
    } else {
        // A forward LSE off by δ and a backward that uses it: P = exp(S − lse), and so every gradient, is
        // scaled by e^−δ, and the reference given that LSE agrees; only the true gradients can tell.
        for (size_t i = 0; i < in->n_lse; i++) w->lse[i] += PLANT_CONSISTENT_LSE_NATS;
        for (size_t i = 0; i < in->n_qkv; i++) w->dqkv[i] *= exp(-PLANT_CONSISTENT_LSE_NATS);
        memset(w->own_ref_dqkv, 0, in->n_qkv * sizeof(double));
        ref_attention_backward(w->own_ref_dqkv, in->dout, in->qkv, w->out, w->lse, s->B, s->T, s->NH, s->NKV, s->HD,
                               s->causal);
        target[ERR_TRUE_DQ] = target[ERR_TRUE_DK] = target[ERR_TRUE_DV] = 1;
    }
}

// Plant p on a copy of v, the values of the case named `source`: the targeted errors are within their
// bounds before and over them after; prints every error before -> after (! marks the targets).
static void plant_case(Plant p, const InputSet* in, const CaseValues* v, const char* source) {
    CaseValues w = values_copy(in, v);
    int target[NUM_ERRS] = {0}, floored[NUM_ERRS];
    double before[NUM_ERRS], after[NUM_ERRS];
    plant_corrupt(p, in, &w, target);
    value_errors(in, v, before, floored);
    value_errors(in, &w, after, floored);
    char line[1024], why[512] = "";
    int at = snprintf(line, sizeof(line), "%s (on %s):", PLANT_NAMES[p], source);
    for (int e = 0; e < NUM_ERRS; e++) {
        const double bound = error_bound(e, in->scale);
        at += snprintf(line + at, sizeof(line) - at, " %s%s %.2e -> %.2e", target[e] ? "!" : "", ERR_NAMES[e],
                       before[e], after[e]);
        if (!target[e]) continue;
        if (!(before[e] <= bound))
            add_problem(why, sizeof(why), "uncorrupted %s %.3e is over its bound %.0e already", ERR_NAMES[e], before[e],
                        bound);
        if (after[e] <= bound)
            add_problem(why, sizeof(why), "corrupted %s %.3e within its bound %.0e: not rejected", ERR_NAMES[e],
                        after[e], bound);
    }
    printf("%s\n", line);
    test_report(PLANT_NAMES[p], !why[0], "%s", why);
    values_free(&w);
}

// ---- CPU-only cases ----------------------------------------------------------------------------------

static AttentionShape shape_of(int B, int T, int NH, int HD, int causal) {
    AttentionShape s;
    s.B = B;
    s.T = T;
    s.NH = NH;
    s.NKV = NH;
    s.HD = HD;
    s.causal = causal;
    return s;
}

// The Hopper backward's launch order (backward_block_at): every (key block, pair) exactly once, and
// within each chunk of pairs key block n of every pair before key block n + 1 of any (longest first
// when causal), for chunks of 1 (key-block major), a few with a smaller last one, all pairs, and
// chunks of 1 ending in a tail chunk (backward_order_tail) of several, of all and of one pair.
static void launch_order_case(void) {
    const char* name = "flash2_backward_launch_order_covers_every_block_once";
    // chunk, tail (the last pairs' own chunk; 0: none), key blocks, pairs
    static const int SHAPES[][4] = {{1, 0, 16, 32}, {9, 0, 16, 256}, {5, 0, 32, 16}, {17, 0, 8, 40}, {32, 0, 16, 32},
                                    {3, 0, 7, 2},   {1, 17, 16, 128}, {1, 3, 64, 3}, {1, 1, 5, 9},   {4, 4, 8, 16}};
    char why[160] = "";
    for (size_t i = 0; i < COUNT(SHAPES) && !why[0]; i++) {
        const int chunk = SHAPES[i][0], tail = SHAPES[i][1], key_blocks = SHAPES[i][2], pairs = SHAPES[i][3];
        static int seen[128 * 256];
        memset(seen, 0, sizeof(seen));
        int prev_n = -1, prev_chunk = -1;
        for (int index = 0; index < key_blocks * pairs && !why[0]; index++) {
            int n = -1, pair = -1;
            backward_block_at(index, chunk, tail, key_blocks, pairs, n, pair);
            const int this_chunk = pair >= pairs - tail ? -2 : pair / chunk;  // the tail's pairs: one chunk
            if (n < 0 || n >= key_blocks || pair < 0 || pair >= pairs || seen[n * pairs + pair]++)
                snprintf(why, sizeof(why), "chunk %d, tail %d, %d key blocks, %d pairs: block %d is (%d, %d), out of range or twice",
                         chunk, tail, key_blocks, pairs, index, n, pair);
            else if (this_chunk == prev_chunk && n < prev_n)
                snprintf(why, sizeof(why), "chunk %d, tail %d: block %d has key block %d after %d in the same chunk", chunk,
                         tail, index, n, prev_n);
            prev_n = n, prev_chunk = this_chunk;
        }
    }
    test_report(name, !why[0], "%s", why);
}

// flash1 and flash2 refuse head dim 72 with a message naming the ones they take, and take 64, 80,
// 96 and 128.
static void head_dim_cases(void) {
    char why[256];
    for (size_t f = 0; f < COUNT(FLASH_BACKENDS); f++) {
        const AttentionBackend backend = FLASH_BACKENDS[f];
        char name[96];
        snprintf(name, sizeof(name), "attention_check_%s_rejects_head_dim_72", attention_backend_name(backend));
        AttentionShape s = shape_of(2, 64, 4, 72, 1);
        why[0] = 0;
        int rc = attention_check(backend, &s, why, sizeof(why));
        int names_dims = strstr(why, "64") && strstr(why, "80") && strstr(why, "96") && strstr(why, "128");
        test_report(name, rc != 0 && names_dims, "returned %d with message \"%s\" (want -1 and a message naming 64, 80, 96 and 128)",
                    rc, why);

        snprintf(name, sizeof(name), "attention_check_%s_accepts_head_dims_64_80_96_128", attention_backend_name(backend));
        char bad[256] = "";
        for (size_t i = 0; i < COUNT(HEAD_DIMS); i++) {
            AttentionShape ok = shape_of(2, 1000, 3, HEAD_DIMS[i], 1);
            if (attention_check(backend, &ok, why, sizeof(why)) != 0)
                add_problem(bad, sizeof(bad), "head dim %d refused: %s", HEAD_DIMS[i], why);
        }
        test_report(name, bad[0] == 0, "%s", bad);
    }
}

// NKV must divide NH (and be at least 1); the message names --kv-heads.
static void kv_heads_case(void) {
    const char* name = "attention_check_rejects_bad_kv_heads";
    char why[256];
    char bad[512] = "";
    const int nkv_bad[3] = {0, 3, 16};  // NH = 8
    for (size_t i = 0; i < COUNT(BACKENDS); i++)
        for (int k = 0; k < 3; k++) {
            AttentionShape s = shape_of(2, 64, 8, 64, 1);
            s.NKV = nkv_bad[k];
            why[0] = 0;
            if (attention_check(BACKENDS[i], &s, why, sizeof(why)) == 0 || !strstr(why, "--kv-heads"))
                add_problem(bad, sizeof(bad), "%s NKV=%d: accepted or message \"%s\"",
                            attention_backend_name(BACKENDS[i]), nkv_bad[k], why);
        }
    for (size_t i = 0; i < COUNT(BACKENDS); i++)
        for (int nkv = 1; nkv <= 8; nkv *= 2) {
            AttentionShape s = shape_of(2, 64, 8, 64, 1);
            s.NKV = nkv;
            if (attention_check(BACKENDS[i], &s, why, sizeof(why)) != 0)
                add_problem(bad, sizeof(bad), "%s NKV=%d refused: %s", attention_backend_name(BACKENDS[i]), nkv, why);
        }
    test_report(name, bad[0] == 0, "%s", bad);
}

static void seq_len_zero_case(void) {
    const char* name = "attention_check_rejects_T0";
    char why[256];
    char bad[256] = "";
    for (size_t i = 0; i < COUNT(BACKENDS); i++) {
        AttentionShape s = shape_of(2, 0, 3, 64, 1);
        if (attention_check(BACKENDS[i], &s, why, sizeof(why)) == 0)
            add_problem(bad, sizeof(bad), "%s accepted T=0", attention_backend_name(BACKENDS[i]));
    }
    test_report(name, bad[0] == 0, "%s", bad);
}

// Only flash2 (its Hopper backward) sums dq's columns; the others must never claim to.
static void dq_columns_case(void) {
    const char* name = "attention_sums_dq_columns_only_flash2";
    char bad[256] = "";
    const AttentionBackend others[] = {ATTN_NAIVE, ATTN_NAIVE_RECOMPUTE, ATTN_FLASH1};
    const AttentionShape s = shape_of(2, 64, 4, 128, 1);
    for (size_t i = 0; i < COUNT(others); i++)
        if (attention_sums_dq_columns(others[i], &s))
            add_problem(bad, sizeof(bad), "%s says it sums them", attention_backend_name(others[i]));
    test_report(name, bad[0] == 0, "%s", bad);
}

static void backend_names_case(void) {
    const char* name = "attention_backend_names_round_trip";
    char bad[256] = "";
    const char* names[] = {"naive", "flash1", "flash2", "naive-recompute"};
    for (size_t i = 0; i < COUNT(names); i++) {
        AttentionBackend backend;
        if (attention_backend_from_name(names[i], &backend) != 0) {
            add_problem(bad, sizeof(bad), "\"%s\" not recognized", names[i]);
            continue;
        }
        const char* back = attention_backend_name(backend);
        if (!back || strcmp(back, names[i]) != 0)
            add_problem(bad, sizeof(bad), "\"%s\" came back as \"%s\"", names[i], back ? back : "(null)");
    }
    AttentionBackend unused = ATTN_NAIVE;
    if (attention_backend_from_name("flash3", &unused) == 0) add_problem(bad, sizeof(bad), "\"flash3\" accepted");
    test_report(name, bad[0] == 0, "%s", bad);
}

// The saved and workspace sizes at T = 16384, computed in size_t throughout: 8·16·16384² elements
// overflow 32 bits many times over.
static void memory_size_cases(void) {
    const AttentionShape s = shape_of(8, 16384, 16, 128, 1);
    const unsigned long long elems = 8ull * 16ull * 16384ull * 16384ull, rows = 8ull * 16ull * 16384ull;
    {
        const char* name = "attention_naive_memory_sizes_at_T16384";
        size_t saved = attention_saved_bytes(ATTN_NAIVE, &s), work = attention_workspace_bytes(ATTN_NAIVE, &s);
        test_report(name, saved == elems * 2 && work == elems * 4, "saved %zu bytes (want %llu), workspace %zu (want %llu)",
                    saved, elems * 2, work, elems * 4);
    }
    {
        // naive-recompute saves nothing; its workspace holds S or dP (fp32) and P or dS (bf16) at once.
        const char* name = "attention_naive_recompute_memory_sizes_at_T16384";
        size_t saved = attention_saved_bytes(ATTN_NAIVE_RECOMPUTE, &s);
        size_t work = attention_workspace_bytes(ATTN_NAIVE_RECOMPUTE, &s);
        test_report(name, saved == 0 && work == elems * 6, "saved %zu bytes (want 0), workspace %zu (want %llu)",
                    saved, work, elems * 6);
    }
    {
        // flash1 keeps O (B, NH, T, HD), m and ℓ (B, NH, T) in fp32 between key blocks (the backward's
        // dQ accumulator (B, NH, T, HD) fits in the same bytes) and nothing from forward to backward:
        // linear in T, with no T² term.
        const char* name = "attention_flash1_memory_sizes_at_T16384";
        size_t saved = attention_saved_bytes(ATTN_FLASH1, &s), work = attention_workspace_bytes(ATTN_FLASH1, &s);
        unsigned long long want = rows * 128ull * 4ull + rows * 2ull * 4ull;
        test_report(name, saved == 0 && work == want, "saved %zu bytes (want 0), workspace %zu (want %llu)", saved,
                    work, want);
    }
}

// The CPU-only cases (the dispatcher's checks, names and sizes, and flash2's launch order: no GPU
// needed) and how many each reports.
typedef struct {
    void (*run)(void);
    int num_cases;
} CpuCase;
static const CpuCase CPU_CASES[] = {
    {launch_order_case, 1}, {head_dim_cases, 2 * (int)COUNT(FLASH_BACKENDS)},
    {kv_heads_case, 1},     {seq_len_zero_case, 1},
    {dq_columns_case, 1},   {backend_names_case, 1},
    {memory_size_cases, 3},
};

// ---- the list of GPU cases ---------------------------------------------------------------------------

// Batch and heads per T: several (b, h) pairs, but few at T = 1000 so the fp64 reference stays quick.
static void batch_heads(int T, int* B, int* NH) {
    *B = T <= 127 ? 2 : 1;
    *NH = T <= 127 ? 3 : 2;
}

// One input set: the shape (B, T, NH, NKV, HD, causal), the input scale, and why its cases do not run
// (NULL: they run).
typedef struct {
    AttentionShape shape;
    double scale;
    const char* skip;
} SetSpec;

static void add_set(SetSpec* sets, size_t max, size_t* count, AttentionShape shape, double scale, int multi_head) {
    if (*count < max) sets[*count] = (SetSpec){shape, scale, seq_len_skip(shape.T, multi_head)};
    (*count)++;
}

// The multi-head sweep's lengths: SEQ_LENS, then those of ATTENTION_TEST_SEQ_LENS it lacks.
static size_t multi_head_lens(int* lens) {
    size_t n = 0;
    for (size_t t = 0; t < COUNT(SEQ_LENS); t++) lens[n++] = SEQ_LENS[t];
    for (size_t t = 0; t < g_num_list_lens; t++)
        if (!in_list(lens, n, g_list_lens[t])) lens[n++] = g_list_lens[t];
    return n;
}

// Every input set, multi-head sweep first, then the grouped-query sweep and the two single shapes (top
// comment); returns the count.
static size_t list_sets(SetSpec* sets, size_t max) {
    size_t count = 0;
    int lens[COUNT(SEQ_LENS) + COUNT(g_list_lens)];
    const size_t num_lens = multi_head_lens(lens);
    for (size_t h = 0; h < COUNT(HEAD_DIMS); h++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t t = 0; t < num_lens; t++)
                for (size_t sc = 0; sc < COUNT(INPUT_SCALES); sc++) {
                    int B, NH;
                    batch_heads(lens[t], &B, &NH);
                    add_set(sets, max, &count, shape_of(B, lens[t], NH, HEAD_DIMS[h], causal), INPUT_SCALES[sc], 1);
                }
    // (T, B, NH, NKV): NKV in {1, 2, NH/4, NH}
    static const int GQA[][4] = {{1, 2, 16, 1},  {1, 2, 16, 2},  {1, 2, 16, 4},  {17, 2, 16, 1}, {17, 2, 16, 2},
                                 {17, 2, 16, 4}, {17, 2, 16, 16}, {127, 1, 8, 1}, {127, 1, 8, 2}, {127, 1, 8, 8},
                                 {300, 1, 4, 1}, {300, 1, 4, 2}};
    for (size_t h = 0; h < COUNT(HEAD_DIMS); h++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t g = 0; g < COUNT(GQA); g++) {
                AttentionShape s = shape_of(GQA[g][1], GQA[g][0], GQA[g][2], HEAD_DIMS[h], causal);
                s.NKV = GQA[g][3];
                add_set(sets, max, &count, s, 1.0, 0);
            }
    // T = 200 over 2 × 70 heads: more query tiles than a GPU has multiprocessors, so flash2's
    // persistent forward walks several tiles per block (its rings and Q buffers across tiles), with
    // a last query block that is partial or, for a warpgroup, wholly past T.
    for (size_t h = 0; h < COUNT(HEAD_DIMS); h++)
        for (int causal = 0; causal <= 1; causal++)
            add_set(sets, max, &count, shape_of(2, 200, 70, HEAD_DIMS[h], causal), 1.0, 0);
    // T = 2048 at head dim 128, one head: flash2's forward takes its long-sequence shape there
    // (flash2_tiles.h, LONG_T), both masks and scales.
    for (int causal = 0; causal <= 1; causal++)
        for (size_t sc = 0; sc < COUNT(INPUT_SCALES); sc++)
            add_set(sets, max, &count, shape_of(1, 2048, 1, 128, causal), INPUT_SCALES[sc], 0);
    return count;
}

// The plain layout is tested for these sets only (as before GQA: T = 127, s = 1).
static int plain_set(const SetSpec* set) { return plain_layout_case(set->shape.T, set->scale); }

static int g_selected[COUNT(BACKENDS)];  // 1: the backend is selected (select_backends)

// One GPU case: its input set, backend, layout and mode, and why it does not run here (NULL: it runs).
typedef struct {
    size_t set, backend;  // indices into the sets and BACKENDS
    Layout layout;
    int deterministic;
    const char* skip;
} CaseSpec;

static const char* NOT_DETERMINISTIC = "flash2 runs its mma.sync kernels here, which are not deterministic";

// Every GPU case but the graph one, in run order (sets, layouts, selected backends, then the
// deterministic variant); returns the count. The same list makes the PLAN, the skips and the runs.
static size_t list_cases(const SetSpec* sets, size_t num_sets, CaseSpec* cases, size_t max) {
    size_t count = 0;
    for (size_t i = 0; i < num_sets; i++)
        for (int layout = 0; layout <= plain_set(&sets[i]); layout++)
            for (size_t be = 0; be < COUNT(BACKENDS); be++) {
                if (!g_selected[be]) continue;
                for (int det = 0; det <= deterministic_case(BACKENDS[be], sets[i].shape.T, sets[i].scale); det++) {
                    const char* skip = sets[i].skip;
                    if (!skip && det && !g_flash2_deterministic) skip = NOT_DETERMINISTIC;
                    if (count < max) cases[count] = (CaseSpec){i, be, (Layout)layout, det, skip};
                    count++;
                }
            }
    return count;
}

static void spec_name(char* buf, size_t size, const SetSpec* sets, const CaseSpec* c) {
    case_name(buf, size, BACKENDS[c->backend], &sets[c->set].shape, sets[c->set].scale, c->layout, c->deterministic);
}

// The case whose values the planted errors corrupt: hd 64, causal, T = 1000, s = 1, packed, flash2
// when selected, else the first backend selected. Always in the list.
static size_t plant_source(const SetSpec* sets, const CaseSpec* cases, size_t num_cases) {
    size_t backend = COUNT(BACKENDS);
    for (size_t be = 0; be < COUNT(BACKENDS); be++)
        if (g_selected[be] && (backend == COUNT(BACKENDS) || BACKENDS[be] == ATTN_FLASH2)) backend = be;
    for (size_t k = 0; k < num_cases; k++) {
        const AttentionShape* s = &sets[cases[k].set].shape;
        if (cases[k].backend == backend && s->HD == 64 && s->causal && s->T == 1000 && s->NKV == s->NH &&
            sets[cases[k].set].scale == 1.0 && cases[k].layout == LAYOUT_PACKED && !cases[k].deterministic)
            return k;
    }
    fprintf(stderr, "test: the planted errors' source case is not in the list\n");
    exit(2);
}

// flash2's causal forward captured in a CUDA graph and replayed: the persistent Hopper kernel takes
// its tiles from a counter in the workspace, which each launch claims with a new epoch; a graph
// replays one epoch, so the capture must zero the counter inside the graph. Every replay must write
// the same output as a direct call, bit for bit (each tile is computed the same wherever it runs),
// into an output poisoned before each replay. T = 200 over 2 × 70 heads: more tiles than SMs.
static const char* GRAPH_CASE = "attention_flash2_causal_forward_replayed_from_a_cuda_graph";

static void graph_replay_case(const AttentionContext* ctx, cudaStream_t stream, uint64_t seed) {
    const char* name = GRAPH_CASE;
    InputSet in = make_inputs(2, 200, 70, 70, 64, 1, 1.0, seed);
    CaseBuffers c = case_alloc(&in, ATTN_FLASH2, LAYOUT_PACKED, in.qkv_bits);
    uint16_t* direct = (uint16_t*)malloc(in.n * sizeof(uint16_t));
    uint16_t* replayed = (uint16_t*)malloc(in.n * sizeof(uint16_t));
    attention_forward(ATTN_FLASH2, ctx, &c.args, stream);
    CUDA_CHECK(cudaMemcpyAsync(direct, c.args.out, in.n * 2, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    attention_forward(ATTN_FLASH2, ctx, &c.args, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    char why[160] = "";
    for (int replay = 0; replay < 3 && !why[0]; replay++) {
        CUDA_CHECK(cudaMemsetAsync(c.args.out, 0xFF, in.n * 2, stream));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaMemcpyAsync(replayed, c.args.out, in.n * 2, cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        size_t differ = 0;
        for (size_t i = 0; i < in.n; i++) differ += replayed[i] != direct[i];
        if (differ) snprintf(why, sizeof(why), "replay %d: %zu of %zu outputs differ from the direct call", replay, differ, in.n);
    }
    test_report(name, !why[0], "%s", why);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    free(direct);
    free(replayed);
    case_free(&c);
    free_inputs(&in);
}

// Marks the backends named on the command line (all when none); exits 2 on an unknown name.
static void select_backends(int argc, char** argv) {
    for (size_t be = 0; be < COUNT(BACKENDS); be++) g_selected[be] = argc < 2;
    for (int i = 1; i < argc; i++) {
        AttentionBackend backend = ATTN_NAIVE;
        const int known = attention_backend_from_name(argv[i], &backend) == 0;
        size_t be = 0;
        while (known && be < COUNT(BACKENDS) && BACKENDS[be] != backend) be++;
        if (!known || be == COUNT(BACKENDS)) {
            fprintf(stderr, "usage: %s [naive|flash1|flash2|naive-recompute ...]: unknown backend \"%s\"\n", argv[0], argv[i]);
            exit(2);
        }
        g_selected[be] = 1;
    }
}

// The graph case is listed with flash2 selected; it runs at its T = 200 unless ATTENTION_TEST_SEQ_LENS
// leaves that out.
static int graph_case_listed(void) {
    for (size_t be = 0; be < COUNT(BACKENDS); be++)
        if (BACKENDS[be] == ATTN_FLASH2) return g_selected[be];
    return 0;
}

// ---- main --------------------------------------------------------------------------------------------

// Runs the listed GPU cases in order (SKIP where they say why not), making each set's inputs and
// references once, and the planted errors right after their source case. Returns 1 when the planted
// errors ran.
static int run_cases(const SetSpec* sets, const CaseSpec* cases, size_t num_cases, size_t source,
                     const AttentionContext* ctx, cudaStream_t stream, uint64_t seed) {
    InputSet in;
    size_t made = (size_t)-1;  // the set `in` holds
    int planted = 0;
    for (size_t k = 0; k < num_cases; k++) {
        const CaseSpec* c = &cases[k];
        char name[160];
        spec_name(name, sizeof(name), sets, c);
        if (c->skip) {
            test_skip(name, c->skip);
            continue;
        }
        if (made != c->set) {
            if (made != (size_t)-1) free_inputs(&in);
            const AttentionShape* sh = &sets[c->set].shape;
            // One generator per input set, so a set's inputs depend only on the seed and its place.
            in = make_inputs(sh->B, sh->T, sh->NH, sh->NKV, sh->HD, sh->causal, sets[c->set].scale,
                             seed + 0x9E3779B97F4A7C15ull * (c->set + 1));
            add_true_gradients(&in);
            made = c->set;
        }
        CaseValues kept;
        memset(&kept, 0, sizeof(kept));
        snprintf(g_running_case, sizeof(g_running_case), "%s", name);
        run_case(&in, BACKENDS[c->backend], c->layout, c->deterministic, ctx, stream, name,
                 k == source ? &kept : NULL);
        g_running_case[0] = 0;
        if (k != source) continue;
        for (int p = 0; p < NUM_PLANTS; p++) {
            if (kept.out) plant_case((Plant)p, &in, &kept, name);
            else test_fail(PLANT_NAMES[p], "their source case %s produced no values (see its FAIL line)", name);
        }
        values_free(&kept);
        planted = 1;
    }
    if (made != (size_t)-1) free_inputs(&in);
    return planted;
}

// Reports every GPU case as SKIP for `why`.
static void skip_all(const SetSpec* sets, const CaseSpec* cases, size_t num_cases, const char* why) {
    char name[160];
    for (size_t k = 0; k < num_cases; k++) {
        spec_name(name, sizeof(name), sets, &cases[k]);
        test_skip(name, why);
    }
    if (graph_case_listed()) test_skip(GRAPH_CASE, why);
    for (int p = 0; p < NUM_PLANTS; p++) test_skip(PLANT_NAMES[p], why);
}

static void run_gpu_cases(const SetSpec* sets, const CaseSpec* cases, size_t num_cases, uint64_t seed) {
    printf("errors: O and gradients ||x - ref|| / ||ref|| (* marks a (near-)zero reference, divided by %.0e * "
           "sqrt(n) instead); LSE max |lse - ref| / (1 + rms ref); true: against the fp64 backward from the fp64 "
           "out and lse. Bounds: O %.0e, LSE %.0e, dQ dK dV %.0e, true %.0e at s = 1 and %.0e at s = 8, dQsum %.0e\n",
           ABS_FLOOR, TOL_OUT, TOL_LSE, TOL_GRAD, tol_true_grad(1.0), tol_true_grad(8.0), TOL_COLSUM);
    AttentionContext ctx;
    CUBLAS_CHECK(cublasCreate(&ctx.cublas));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    atexit(report_exit_during_case);
    const size_t source = plant_source(sets, cases, num_cases);
    if (!run_cases(sets, cases, num_cases, source, &ctx, stream, seed))  // their source case was skipped
        for (int p = 0; p < NUM_PLANTS; p++)
            test_skip(PLANT_NAMES[p], cases[source].skip ? cases[source].skip : "their source case did not run");
    if (graph_case_listed()) {
        const char* skip = seq_len_skip(200, 0);
        if (skip) test_skip(GRAPH_CASE, skip);
        else graph_replay_case(&ctx, stream, seed);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUBLAS_CHECK(cublasDestroy(ctx.cublas));
}

int main(int argc, char** argv) {
    test_begin();
    select_backends(argc, argv);
    pick_seq_lens();
    uint64_t seed = pick_and_print_seed();
    GpuInfo gpu = gpu_info(0);
    const char* no_gpu = gpu_skip_reason(&gpu, "the attention kernels");
    if (!no_gpu) g_flash2_deterministic = attention_flash2_uses_wgmma();

    static SetSpec sets[1024];
    static CaseSpec cases[8192];
    const size_t num_sets = list_sets(sets, COUNT(sets));
    const size_t num_cases = num_sets > COUNT(sets) ? 0 : list_cases(sets, num_sets, cases, COUNT(cases));
    if (num_sets > COUNT(sets) || num_cases > COUNT(cases)) {
        fprintf(stderr, "test: %zu input sets and %zu cases, more than this test holds\n", num_sets, num_cases);
        return 2;
    }
    int num_cpu_cases = 0;
    for (size_t i = 0; i < COUNT(CPU_CASES); i++) num_cpu_cases += CPU_CASES[i].num_cases;
    test_plan(num_cpu_cases + (int)num_cases + graph_case_listed() + NUM_PLANTS);

    for (size_t i = 0; i < COUNT(CPU_CASES); i++) CPU_CASES[i].run();
    if (no_gpu) {
        skip_all(sets, cases, num_cases, no_gpu);
        return test_end();
    }
    printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
    run_gpu_cases(sets, cases, num_cases, seed);
    return test_end();
}
