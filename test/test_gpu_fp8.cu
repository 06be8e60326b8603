// test_gpu_fp8.cu: the FP8 pieces of `--precision fp8`: the casts (layers/model/fp8_cast.cuh), the
// per-tensor scales (layers/model/fp8_scaling.cuh) and the FP8 GEMMs of a linear layer
// (layers/model/matmul_fp8.cuh), against host references.
//
// The host reference of FP8 (host_fp8_encode / host_fp8_decode) is written here from the formats'
// definitions, in double: round to nearest even, subnormals, saturation to ±448 (E4M3) / ±57344
// (E5M2) for anything larger (±inf included), NaN to NaN. CPU cases check it on known values, on
// every code (decode then encode gives the code back) and against cuda_fp8.h's own host conversion.
//
// Casts (bit-exact: a device byte must equal the host's encoding of fp32(x · scale); two NaNs
// match whatever their codes):
// - every one of the 65536 bf16 bit patterns (NaN, inf, subnormals, both zeros) at several scales,
//   plain and cast-transposed, both formats; amax must come out NaN (the input holds NaNs);
// - random normal tensors (N, C) with N in {1, 37, 64, 65, 100, 1000, 2049, 4096}, C from 16 to
//   8192 (multiples of 16, not of the 128-channel tile), scale 1.25·max/amax so the largest values
//   saturate: plain E4M3, cast-transpose E4M3 and E5M2, and each output of the cast-transpose alone;
//   out_t must be the transpose of out; amax exact (the largest |x|, bit for bit);
// - outputs are poisoned with 0xFF (a NaN in both formats, never the cast of a finite value) before
//   each run, with a guard of poison before and after that must stay untouched;
// - fp8_amax alone: exact, and accumulating (max with the value already there).
// Cast-transposes with an op (fp8_cast_transpose_op; the section "cast-transposes with an op" says how
// each check is bounded and what it rejects):
// - FP8_OP_GELU (E4M3, and E5M2) and FP8_OP_DGELU (E5M2, and E4M3) on 1000 × 2064 and 77 × 144, and
//   FP8_OP_COPY on 1000 × 2064, 77 × 144 and 65 × 16 (N not a multiple of the 64-row tile, C not of the
//   128-channel tile): out and out_t against the host's x = op(inp) in double, cast at 1.25·max/max|x|;
//   bit-exact for COPY, and for GELU/GELU' within a bound on the device's fp32 error (tanhf's 2 ulp and
//   one rounding per operation: either code where x·scale lies that close to a rounding boundary); the
//   amax (exact for COPY, within the bound otherwise); the column sums of colsum_partial (per 64-row
//   tile, against fp64 sums, |error| ≤ ΣE + γ_63·Σ|x|), a poisoned buffer with guards before and after
//   (nothing written beyond C); the saturated count (added to a preset; exact for COPY, between the
//   certain and the possible counts otherwise), also at 4·max/max|x| (many saturate) and at half of
//   max/max|x| (none may);
// - out alone and out_t alone (the other left poisoned); amax only (out = out_t = NULL, scale NULL:
//   COPY's amax bit-exact, GELU's within the bound, nothing written) and amax with column sums (GELU');
// - planted (CPU): the same checks on host data, where two fp32 emulations of the device pass and
//   twelve planted errors (a byte one code off in out or out_t, an unwritten byte, a written guard,
//   out_t not transposed, a column sum short one row, unwritten or written beyond C, the wrong op,
//   the amax 2^-10 off, the saturated count one off either way) must each be rejected.
// Scales: the delayed update over 40 steps (zeros, a spike that must leave the history after 16
// updates, NaN and inf amaxes) against a host model of the documented rule, bit for bit, with and
// without margin and power-of-two rounding; current scaling (amax pass into amax_current, scale, cast);
// current scaling with the state's amax preset above, below the tensor's and NaN: amax_current =
// max |x|, the scale from it alone, amax = max(preset, amax_current) (NaN kept), the saturated count
// and history untouched; a cast that records its amax into a state, then the update, then a cast with
// the new scale.
// GEMMs (need FP8 tensor cores: sm_89 or newer), for (N, IC, OC) in {(16, 16, 16), (48, 80, 32),
// (256, 512, 384), (1040, 2064, 784), (512, 2048, 8192), (512, 8192, 2048)}: forward with and
// without fast accumulation and with bias, dinp with an E5M2 and an E4M3 gradient, dweight with an
// E5M2 gradient, overwriting and accumulating into random bf16 values. Operands are quantized on
// the host (scale = max/amax) and the reference is fp64 over exactly the decoded FP8 values times
// their inverse scales. Each output element y must satisfy
//   |y − ref| ≤ 2^-8·|ref| + c·Σ_k |a_k·b_k|
// where 2^-8·|ref| is the final rounding to bf16 (8 significant bits) and c·Σ|a·b| bounds the
// accumulation: the tensor cores add FP8 products into partial sums kept to about 14 bits, and
// cuBLASLt promotes them to fp32 every few k-steps unless fast accumulation is on:
//   c = 2^-9 without fast accumulation (a few 2^-14 roundings per promotion, plus fp32's own
//            K·2^-24 ≤ 2^-11 for K ≤ 8192),
//   c = 2^-12·⌈K/32⌉ with it (one 2^-13 rounding per 32-deep tensor-core step, never promoted);
// and the whole output ‖y − ref‖/‖ref‖ ≤ 2^-7 (2^-4 with fast accumulation, whose rounding errors
// all lean the same way), since a wrong scale moves every element alike. Every element must be
// written (finite: the poison is bf16 NaN), the guards untouched. Where the reference would be slow
// a random subset of rows (always the first and the last) is compared; poison and guards are
// checked everywhere.
// Planted errors: on (256, 512, 384), an inverse scale off by 2 and the sign of the largest byte of
// an operand flipped must each fail the same checks that the true output passes.
// Also: reruns give the same bits; and the pipeline of a layer: bf16 x, W, dy cast-transposed on the
// device with current scaling, then the three GEMMs from those bytes.
// Fresh inputs every run (TEST_SEED repeats one). Without a GPU every case but the CPU ones is
// reported as SKIP; without FP8 tensor cores (an A100) the GEMM cases are.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stddef.h>

#include "layers/model/fp8_cast.cuh"
#include "layers/model/fp8_scaling.cuh"
#include "layers/model/matmul_fp8.cuh"
#include "test/gpu_test_util.h"
#include "test/test_harness.h"

#define GUARD 256             // poisoned bytes (casts) or bf16 elements (GEMMs) before and after every output
#define REF_BUDGET 1.5e8      // multiply-adds of a GEMM reference beyond which a subset of rows is checked
#define MIN_ROWS 8
#define TOL_NORM 0x1p-7       // ‖y − ref‖/‖ref‖ without fast accumulation
#define TOL_NORM_FAST 0x1p-4  // with it
#define ACC_PRECISE 0x1p-9    // c of the elementwise bound without fast accumulation
#define ACC_FAST_STEP 0x1p-12 // c = this · ⌈K/32⌉ with it
#define BF16_ROUNDING 0x1p-8

// ---- the host FP8 reference -----------------------------------------------------------------------------

typedef struct {
    int mbits, bias, emin;  // mantissa bits, exponent bias, exponent of the smallest normal
    double max;             // largest finite value
    uint8_t max_code;       // its code (positive)
} HostFp8Spec;

static HostFp8Spec host_fp8_spec(Fp8Format f) {
    if (f == FP8_E5M2) return (HostFp8Spec){2, 15, -14, 57344.0, 0x7B};
    return (HostFp8Spec){3, 7, -6, 448.0, 0x7E};
}

static int host_fp8_is_nan(uint8_t b, Fp8Format f) {
    return f == FP8_E5M2 ? (b & 0x7F) > 0x7C : (b & 0x7F) == 0x7F;
}

// x rounded to nearest even into format f, saturating (satfinite); NaN → 0x7F.
static uint8_t host_fp8_encode(double x, Fp8Format f) {
    const HostFp8Spec sp = host_fp8_spec(f);
    if (isnan(x)) return 0x7F;
    const uint8_t sign = signbit(x) ? 0x80 : 0x00;
    const double a = fabs(x);
    if (a >= sp.max) return sign | sp.max_code;
    int e = 0;
    frexp(a, &e);  // a in [2^(e-1), 2^e)
    int E = (a == 0.0 || e - 1 < sp.emin) ? sp.emin : e - 1;
    const double quantum = ldexp(1.0, E - sp.mbits);  // the spacing of E's binade (subnormals: of emin's)
    const double n = nearbyint(a / quantum);          // exact division; nearbyint rounds half to even
    const double v = n * quantum;
    if (v > sp.max) return sign | sp.max_code;
    if (v == 0.0) return sign;
    frexp(v, &e);
    E = e - 1;
    if (E < sp.emin) return sign | (uint8_t)n;  // subnormal: exponent field 0
    const int mant = (int)(ldexp(v, sp.mbits - E) - ldexp(1.0, sp.mbits));
    return sign | (uint8_t)((E + sp.bias) << sp.mbits) | (uint8_t)mant;
}

static double host_fp8_decode(uint8_t b, Fp8Format f) {
    const HostFp8Spec sp = host_fp8_spec(f);
    if (host_fp8_is_nan(b, f)) return NAN;
    const double sign = (b & 0x80) ? -1.0 : 1.0;
    const int field = (b & 0x7F) >> sp.mbits, mant = b & ((1 << sp.mbits) - 1);
    if (f == FP8_E5M2 && field == 31) return sign * INFINITY;
    if (field == 0) return sign * ldexp(mant, sp.emin - sp.mbits);
    return sign * ldexp(1.0 + ldexp(mant, -sp.mbits), field - sp.bias);
}

// What the device cast makes of bf16 x at scale s: fp32(x · s), then encoded.
static uint8_t host_cast(uint16_t x, float s, Fp8Format f) {
    const float v = test_bf16_to_float(x) * s;
    return host_fp8_encode((double)v, f);
}

static int fp8_same(uint8_t a, uint8_t b, Fp8Format f) {
    return a == b || (host_fp8_is_nan(a, f) && host_fp8_is_nan(b, f));
}

// max |x| of bf16 values as the cast kernels compute it: the largest sign-cleared bit pattern.
static float host_amax(const uint16_t* x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) m = (x[i] & 0x7FFFu) > m ? (x[i] & 0x7FFFu) : m;
    return test_bf16_to_float((uint16_t)m);
}

static int float_same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof(a)) == 0 || (isnan(a) && isnan(b));
}

// ---- the cases' list ------------------------------------------------------------------------------------

typedef enum { NEED_CPU = 0, NEED_GPU = 1, NEED_FP8_GEMM = 2 } Need;

typedef struct Case Case;
typedef void (*CaseFn)(const Case* c);
struct Case {
    char name[128];
    Need need;
    CaseFn run;
    int p[6];  // the case's parameters (what they mean is up to run)
};

#define MAX_CASES 160
static Case g_cases[MAX_CASES];
static int g_num_cases = 0;
static uint64_t g_seed = 0;
static cudaStream_t g_stream;
static MatmulContext g_ctx;

static Case* add_case(Need need, CaseFn run, int p0, int p1, int p2, int p3, const char* fmt, ...) {
    if (g_num_cases >= MAX_CASES) {
        fprintf(stderr, "test_gpu_fp8: more than %d cases; raise MAX_CASES\n", MAX_CASES);
        exit(2);
    }
    Case* c = &g_cases[g_num_cases++];
    memset(c, 0, sizeof(*c));
    c->need = need, c->run = run;
    c->p[0] = p0, c->p[1] = p1, c->p[2] = p2, c->p[3] = p3;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof(c->name), fmt, ap);
    va_end(ap);
    return c;
}

// A case's own random numbers: the run's seed and the case's place in the list.
static TestRng case_rng(const Case* c) {
    TestRng rng = {g_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(c - g_cases + 1))};
    return rng;
}

static void upload(void* d, const void* h, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, g_stream));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

static void download(void* h, const void* d, size_t bytes, const char* name) {
    sync_or_die(g_stream, name, "kernel");
    CUDA_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, g_stream));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

static void* poisoned(size_t bytes) {
    void* d = device_alloc(bytes);
    CUDA_CHECK(cudaMemsetAsync(d, 0xFF, bytes, g_stream));
    return d;
}

// ---- CPU cases --------------------------------------------------------------------------------------------

static void host_known_values_case(const Case* c) {
    char bad[512] = "";
    const struct { double x; Fp8Format f; uint8_t code; } known[] = {
        {1.0, FP8_E4M3, 0x38},     {448.0, FP8_E4M3, 0x7E},   {464.0, FP8_E4M3, 0x7E},   {1e9, FP8_E4M3, 0x7E},
        {-INFINITY, FP8_E4M3, 0xFE}, {0x1p-9, FP8_E4M3, 0x01}, {0x1p-10, FP8_E4M3, 0x00}, {0x1.8p-10, FP8_E4M3, 0x01},
        {0x1.8p-9, FP8_E4M3, 0x02}, {0x1.Fp-7, FP8_E4M3, 0x08}, {-0.0, FP8_E4M3, 0x80},   {1.0625, FP8_E4M3, 0x38},
        {1.1875, FP8_E4M3, 0x3A},  {1.0, FP8_E5M2, 0x3C},     {57344.0, FP8_E5M2, 0x7B}, {61440.0, FP8_E5M2, 0x7B},
        {INFINITY, FP8_E5M2, 0x7B}, {0x1p-16, FP8_E5M2, 0x01}, {0x1p-17, FP8_E5M2, 0x00}, {1.125, FP8_E5M2, 0x3C},
        {1.375, FP8_E5M2, 0x3E},   {-2.0, FP8_E5M2, 0xC0},
    };
    for (size_t i = 0; i < COUNT(known); i++) {
        const uint8_t got = host_fp8_encode(known[i].x, known[i].f);
        if (got != known[i].code)
            add_problem(bad, sizeof(bad), "%s(%a) = 0x%02X, expected 0x%02X", fp8_format_name(known[i].f), known[i].x,
                        got, known[i].code);
    }
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < 256; b++) {
            const double v = host_fp8_decode((uint8_t)b, (Fp8Format)f);
            if (isnan(v) || isinf(v)) continue;
            if (host_fp8_encode(v, (Fp8Format)f) != b)
                add_problem(bad, sizeof(bad), "%s code 0x%02X decodes to %a, which encodes to 0x%02X",
                            fp8_format_name((Fp8Format)f), b, v, host_fp8_encode(v, (Fp8Format)f));
        }
    if (!isnan(host_fp8_decode(host_fp8_encode(NAN, FP8_E4M3), FP8_E4M3)) ||
        !isnan(host_fp8_decode(host_fp8_encode(NAN, FP8_E5M2), FP8_E5M2)))
        add_problem(bad, sizeof(bad), "NaN does not stay NaN");
    test_report(c->name, bad[0] == 0, "%s", bad);
}

static const float EXHAUSTIVE_SCALES[] = {1.0f, 0x1p-7f, 37.25f, 3.0e-3f, 1.0e4f, 1.3e-36f};

// Every bf16 pattern at every scale above, against cuda_fp8.h's host conversion (an independent
// implementation: __nv_cvt_float_to_fp8 off the device).
static void host_vs_cuda_fp8_case(const Case* c) {
    char bad[512] = "";
    long mismatches = 0;
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < COUNT(EXHAUSTIVE_SCALES); s++)
            for (uint32_t x = 0; x < 65536; x++) {
                const float v = test_bf16_to_float((uint16_t)x) * EXHAUSTIVE_SCALES[s];
                const uint8_t theirs = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f ? __NV_E5M2 : __NV_E4M3);
                const uint8_t ours = host_cast((uint16_t)x, EXHAUSTIVE_SCALES[s], (Fp8Format)f);
                if (!fp8_same(ours, theirs, (Fp8Format)f) && mismatches++ < 4)
                    add_problem(bad, sizeof(bad), "%s of bf16 0x%04X · %g: ours 0x%02X, cuda_fp8.h 0x%02X",
                                fp8_format_name((Fp8Format)f), x, EXHAUSTIVE_SCALES[s], ours, theirs);
            }
    test_report(c->name, mismatches == 0, "%ld mismatches: %s", mismatches, bad);
}

static void size_checks_case(const Case* c) {
    char bad[512] = "", why[400];
    const int cast_bad[][2] = {{0, 16}, {4, 8}, {4, 24}, {4, 0}};
    for (size_t i = 0; i < COUNT(cast_bad); i++)
        if (fp8_check_cast(cast_bad[i][0], cast_bad[i][1], why, sizeof(why)) == 0)
            add_problem(bad, sizeof(bad), "fp8_check_cast accepted N=%d C=%d", cast_bad[i][0], cast_bad[i][1]);
    if (fp8_check_cast(4, 24, why, sizeof(why)) == 0 || !strstr(why, "multiple of 16"))
        add_problem(bad, sizeof(bad), "fp8_check_cast's message does not say 'multiple of 16': %s", why);
    if (fp8_check_cast(1, 16, why, sizeof(why)) != 0 || fp8_check_cast(37, 2064, why, sizeof(why)) != 0)
        add_problem(bad, sizeof(bad), "fp8_check_cast refused a valid size: %s", why);
    const int gemm_bad[][3] = {{8, 16, 16}, {16, 24, 16}, {16, 16, 40}, {0, 16, 16}};
    for (size_t i = 0; i < COUNT(gemm_bad); i++)
        if (matmul_fp8_check_sizes(gemm_bad[i][0], gemm_bad[i][1], gemm_bad[i][2], why, sizeof(why)) == 0)
            add_problem(bad, sizeof(bad), "matmul_fp8_check_sizes accepted %d %d %d", gemm_bad[i][0], gemm_bad[i][1],
                        gemm_bad[i][2]);
    if (matmul_fp8_check_sizes(16384, 2048, 8192, why, sizeof(why)) != 0)
        add_problem(bad, sizeof(bad), "matmul_fp8_check_sizes refused 16384 2048 8192: %s", why);
    test_report(c->name, bad[0] == 0, "%s", bad);
}

static void scale_formula_case(const Case* c) {
    char bad[512] = "";
    const struct { float amax, fmax; int margin, pow2; float prev, want; } cases[] = {
        {448.0f, 448.0f, 0, 0, 7.0f, 1.0f},          {1.0f, 448.0f, 0, 0, 7.0f, 448.0f},
        {1.0f, 448.0f, 1, 0, 7.0f, 224.0f},          {1.0f, 448.0f, 0, 1, 7.0f, 256.0f},
        {3.0f, 57344.0f, 2, 1, 7.0f, 4096.0f},       {0.0f, 448.0f, 0, 0, 7.0f, 7.0f},
        {NAN, 448.0f, 0, 0, 7.0f, 7.0f},             {INFINITY, 448.0f, 0, 0, 7.0f, 7.0f},
        {1e-38f, 448.0f, 0, 0, 7.0f, 7.0f},          {3e38f, 448.0f, 0, 0, 7.0f, 448.0f / 3e38f},
    };
    for (size_t i = 0; i < COUNT(cases); i++) {
        const float got = fp8_scale_for_amax(cases[i].amax, cases[i].fmax, cases[i].margin, cases[i].pow2, cases[i].prev);
        if (!float_same_bits(got, cases[i].want))
            add_problem(bad, sizeof(bad), "amax %g max %g margin %d pow2 %d: %a, expected %a", cases[i].amax,
                        cases[i].fmax, cases[i].margin, cases[i].pow2, got, cases[i].want);
    }
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// ---- casts ----------------------------------------------------------------------------------------------

typedef enum { CAST_PLAIN = 0, CAST_BOTH = 1, CAST_ROWS_ONLY = 2, CAST_T_ONLY = 3 } CastKind;
static const char* CAST_KIND_NAMES[] = {"cast", "cast_transpose", "cast_transpose_rows_only", "cast_transpose_t_only"};

// Compares n device bytes (read at got[GUARD..]) with want (or the transposed want when transposed,
// want being (N, C)); the guards must still be poison.
static void compare_cast_bytes(const uint8_t* got, const uint8_t* want, int N, int C, int transposed, Fp8Format f,
                               const char* what, char* bad, size_t bad_size) {
    const size_t n = (size_t)N * C;
    if (changed_poison_bytes(got, GUARD) || changed_poison_bytes(got + GUARD + n, GUARD))
        add_problem(bad, bad_size, "%s: the guard around the output was written", what);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t j = transposed ? (i % N) * C + i / N : i;  // out_t[c][r] = out[r][c]
        if (!fp8_same(got[GUARD + i], want[j], f) && wrong++ == 0) first = i;
    }
    if (wrong) {
        const size_t j = transposed ? (first % N) * C + first / N : first;
        add_problem(bad, bad_size, "%s: %zu of %zu bytes wrong, first at %zu: 0x%02X, expected 0x%02X%s", what, wrong,
                    n, first, got[GUARD + first], want[j], got[GUARD + first] == 0xFF ? " (never written)" : "");
    }
}

// One cast of inp (N, C) at scale on the device (outputs poisoned), checked against the host.
static void run_and_check_cast(const uint16_t* inp, int N, int C, Fp8Format f, CastKind kind, float scale,
                               const char* name, char* bad, size_t bad_size) {
    const size_t n = (size_t)N * C;
    __nv_bfloat16* d_inp = (__nv_bfloat16*)device_alloc(n * 2);
    uint8_t* d_out = (uint8_t*)poisoned(n + 2 * GUARD);
    uint8_t* d_out_t = (uint8_t*)poisoned(n + 2 * GUARD);
    float* d_f = (float*)device_alloc(2 * sizeof(float));  // scale, amax
    const float init[2] = {scale, 0.0f};
    upload(d_inp, inp, n * 2);
    upload(d_f, init, sizeof(init));
    uint8_t* out = kind == CAST_T_ONLY ? NULL : d_out + GUARD;
    uint8_t* out_t = kind == CAST_PLAIN || kind == CAST_ROWS_ONLY ? NULL : d_out_t + GUARD;
    if (kind == CAST_PLAIN) fp8_cast(out, d_inp, N, C, f, d_f, d_f + 1, g_stream);
    else fp8_cast_transpose(out, out_t, d_inp, N, C, f, d_f, d_f + 1, g_stream);
    uint8_t* got = (uint8_t*)host_alloc(n + 2 * GUARD);
    uint8_t* want = (uint8_t*)host_alloc(n);
    for (size_t i = 0; i < n; i++) want[i] = host_cast(inp[i], scale, f);
    float res[2];
    download(res, d_f, sizeof(res), name);
    if (!float_same_bits(res[1], host_amax(inp, n)))
        add_problem(bad, bad_size, "scale %g: amax %a, expected %a", scale, res[1], host_amax(inp, n));
    char what[64];
    download(got, d_out, n + 2 * GUARD, name);
    snprintf(what, sizeof(what), "scale %g out", scale);
    if (out) compare_cast_bytes(got, want, N, C, 0, f, what, bad, bad_size);
    else if (changed_poison_bytes(got, n + 2 * GUARD)) add_problem(bad, bad_size, "out was written though NULL");
    download(got, d_out_t, n + 2 * GUARD, name);
    snprintf(what, sizeof(what), "scale %g out_t", scale);
    if (out_t) compare_cast_bytes(got, want, N, C, 1, f, what, bad, bad_size);
    else if (changed_poison_bytes(got, n + 2 * GUARD)) add_problem(bad, bad_size, "out_t was written (not asked for)");
    free(got), free(want);
    CUDA_CHECK(cudaFree(d_inp)), CUDA_CHECK(cudaFree(d_out)), CUDA_CHECK(cudaFree(d_out_t)), CUDA_CHECK(cudaFree(d_f));
}

// p: format, kind. Every bf16 bit pattern as (4096, 16), at every scale of EXHAUSTIVE_SCALES.
static void cast_exhaustive_case(const Case* c) {
    char bad[1024] = "";
    uint16_t* inp = (uint16_t*)host_alloc(65536 * 2);
    for (uint32_t x = 0; x < 65536; x++) inp[x] = (uint16_t)x;
    for (size_t s = 0; s < COUNT(EXHAUSTIVE_SCALES); s++)
        run_and_check_cast(inp, 4096, 16, (Fp8Format)c->p[0], (CastKind)c->p[1], EXHAUSTIVE_SCALES[s], c->name, bad,
                           sizeof(bad));
    free(inp);
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// n bf16 values ~ normal(0, 1), with ±7.5 planted (outliers that set the amax).
static uint16_t* random_bf16(TestRng* rng, size_t n, double sigma) {
    uint16_t* x = (uint16_t*)host_alloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = test_float_to_bf16((float)(sigma * test_rng_normal(rng)));
    x[test_rng_next(rng) % n] = test_float_to_bf16((float)(7.5 * sigma));
    x[test_rng_next(rng) % n] = test_float_to_bf16((float)(-7.5 * sigma));
    return x;
}

// p: N, C, format, kind. Scale 1.25·max/amax: the largest values saturate.
static void cast_random_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = c->p[0], C = c->p[1];
    const Fp8Format f = (Fp8Format)c->p[2];
    uint16_t* inp = random_bf16(&rng, (size_t)N * C, 1.0);
    const float scale = 1.25f * fp8_format_max(f) / host_amax(inp, (size_t)N * C);
    run_and_check_cast(inp, N, C, f, (CastKind)c->p[3], scale, c->name, bad, sizeof(bad));
    free(inp);
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// p: N, C. fp8_amax from 0, then again with a smaller and with a larger tensor (it accumulates).
static void amax_case(const Case* c) {
    char bad[512] = "";
    TestRng rng = case_rng(c);
    const int N = c->p[0], C = c->p[1];
    const size_t n = (size_t)N * C;
    uint16_t* x = random_bf16(&rng, n, 1.0);
    const float sigmas[3] = {1.0f, 0.5f, 4.0f};  // amax after each: a, a, 4a
    __nv_bfloat16* d_x = (__nv_bfloat16*)device_alloc(n * 2);
    float* d_amax = (float*)device_alloc(sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(d_amax, 0, sizeof(float), g_stream));
    float want = 0.0f;
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) x[i] = test_float_to_bf16((float)(sigmas[k] * test_rng_normal(&rng)));
        x[test_rng_next(&rng) % n] = test_float_to_bf16(-7.5f * sigmas[k]);
        const float m = host_amax(x, n);
        want = m > want ? m : want;
        upload(d_x, x, n * 2);
        fp8_amax(d_amax, d_x, N, C, g_stream);
        float got = 0.0f;
        download(&got, d_amax, sizeof(got), c->name);
        if (!float_same_bits(got, want)) add_problem(bad, sizeof(bad), "call %d: amax %a, expected %a", k, got, want);
    }
    free(x);
    CUDA_CHECK(cudaFree(d_x)), CUDA_CHECK(cudaFree(d_amax));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// ---- cast-transposes with an op: GELU, GELU', column sums, the saturated count -----------------------------
//
// fp8_cast_transpose_op computes x from its input in fp32 (FP8_OP_COPY: x = inp; FP8_OP_GELU:
// x = gelu(inp); FP8_OP_DGELU: x = inp · gelu'(aux)) and casts x · scale. For COPY x is exact and every
// check is bit-exact, as above. For GELU and GELU' the device's fp32 x cannot be reproduced on the host
// bit for bit: its tanhf is CUDA's (within 2 ulp), not the C library's, and nvcc contracts a·b + c into
// fused multiply-adds where it chooses (x + 0.044715·x³, 1 − th², the two terms of GELU'). Nor is "one
// ulp of the host's fp32 x" a sound tolerance: where th is near −1 (inp ≲ −3), 1 + th has lost its
// leading bits and one ulp of th is many ulps of GELU(inp) (tiny in absolute terms); GELU' adds terms of
// either sign. So the host computes x in double (with the device's fp32 constants) together with a
// running first-order bound E on the device's error: u = 2^-24 for every rounded operation (a fused one
// rounds less), 2 ulp for tanhf (the CUDA math library's documented bound), each propagated through the
// steps that follow (host_gelu_tanh, host_gelu, host_gelu_grad), and the whole doubled to cover the
// second-order terms. E is some ulps of |x| (about 8 for GELU(inp > 0), up to some 10^2 for GELU' of
// |aux| ≈ 6), far below an FP8 step (2^-3 of the value in E4M3, 2^-2 in E5M2), except where x is tiny
// beside inp (GELU of inp ≲ −3: E ≈ 2^-23·|inp| absolute); the checks still pin down every byte but the
// few that sit on a rounding boundary:
// - a byte must lie (by value) between the codes of x·scale − W and x·scale + W, W = scale·(E +
//   2u·(|x| + E)) (the device's fp32 product x·scale rounds too): one code, except where x·scale is
//   within W of a rounding boundary, where either neighbour is accepted (about 0.1% of the elements for
//   GELU, 0.3% for GELU', mostly tiny values such as GELU(inp ≲ −3); the case prints how many).
//   An unwritten byte (poison 0xFF, a NaN) is never accepted;
// - the amax must lie in [max(|x| − E), max(|x| + E)] (a window of some ulps: one ulp of the host's
//   fp32 x would not be sound, as above; bit-exact for COPY);
// - the saturated count must lie between the counts of |x|·scale − W > max and |x|·scale + W > max
//   (exact for COPY: the host counts fp32 |x|·scale > max as the device does). The device's count
//   starts at SAT_PRESET, so a cast that overwrites instead of adding fails too;
// - column sums: the device sums a tile's ≤ 64 rows in fp32 in an order of its choosing, and any order
//   of summing n terms errs by at most γ_(n−1)·Σ|terms| (Higham, Accuracy and Stability of Numerical
//   Algorithms, §4.2; γ_k = k·u/(1 − k·u), γ_63 ≈ 3.8e-6), so each partial must satisfy
//   |partial − Σx| ≤ ΣE + γ_63·Σ(|x| + E), Σx in double over the host's x. A row left out, another
//   column's or tile's sum, an unwritten entry (NaN poison) or the op not applied exceed this by orders
//   of magnitude. The partial buffer has poisoned guards before and after it: a partial for a channel
//   ≥ C of the last tile row (C not a multiple of 128) would land in the guard after it.
// planted_cast_op_checks_* run these checks on the host: two fp32 emulations of the device (the C
// library's tanhf, sums in row order; with and without fused multiply-adds) must pass, and each planted
// error (one byte one code off, a byte unwritten, a guard written, out_t not transposed, a column sum
// short one row or unwritten or one written beyond C, the wrong op, the amax 2^-10 off, the count one
// off either way) must be rejected.

#define U32 0x1p-24         // fp32's unit roundoff
#define OP_ERR_SAFETY 2.0   // the first-order bounds below, doubled for the second-order terms
#define SAT_PRESET 5ull     // the saturated count before a cast (it must add to it)
#define OP_TINY 0x1p-148    // an absolute floor per operation: fp32's subnormal spacing, twice

// The spacing of fp32 numbers at |t| (its ulp), of the binade above when t is just below a power of two.
static double host_ulp32(double t) {
    int e = 0;
    frexp(fabs(t) * (1.0 + 0x1p-20), &e);  // |t| in [2^(e−1), 2^e): ulp 2^(e−24)
    return fmax(ldexp(1.0, e - 24), 0x1p-149);
}

// t = tanh(k·(x + c·x³)) in double (k, c the device's fp32 constants); *et bounds |device fp32 t − t|.
static double host_gelu_tanh(float x, double* et) {
    const double c = (double)0.044715f, k = (double)GELU_SCALING_FACTOR, xd = x;
    const double cube = c * xd * xd * xd, e_cube = 3 * U32 * fabs(cube) + 3 * OP_TINY;  // three products
    const double in = xd + cube, e_in = e_cube + U32 * fabs(in) + OP_TINY;  // x, cube of one sign: no cancellation
    const double a = k * in, e_a = k * e_in + U32 * fabs(a) + OP_TINY;
    const double t = tanh(a);
    // the argument's error through tanh' = 1 − t², and tanhf's own 2 ulp
    *et = (1.0 - t * t) * e_a + 2.0 * host_ulp32(t);
    return t;
}

// gelu(x) = 0.5·x·(1 + t) in double; *err bounds |device gelu_f32(x) − gelu(x)|.
static double host_gelu(float x, double* err) {
    double et;
    const double t = host_gelu_tanh(x, &et);
    const double p = 1.0 + t, e_p = et + U32 * fabs(p);
    const double h = 0.5 * (double)x, g = h * p;  // 0.5f·x: exact
    *err = OP_ERR_SAFETY * (fabs(h) * e_p + U32 * fabs(g) + OP_TINY);
    return g;
}

// gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 − t²)·k·(1 + 3c·x²) in double; *err bounds the device's error
// (first order, not doubled: the caller doubles the product it goes into).
static double host_gelu_grad(float x, double* err) {
    double et;
    const double t = host_gelu_tanh(x, &et), xd = x, k = (double)GELU_SCALING_FACTOR;
    const double c3 = (double)(3.0f * 0.044715f);  // the device's constant: folded (or computed) in fp32
    const double s2 = 1.0 - t * t, e_s2 = 2 * fabs(t) * et + U32 * t * t + U32 * fabs(s2) + 2 * OP_TINY;
    const double A = 0.5 * (1.0 + t), e_A = 0.5 * (et + U32 * fabs(1.0 + t));
    const double q = 1.0 + c3 * xd * xd, e_q = 2 * U32 * c3 * xd * xd + U32 * q + 2 * OP_TINY;
    const double m = 0.5 * fabs(xd) * k;  // |0.5f·x·k|: 0.5f·x exact, then · s2 · k · q, three roundings
    const double B = 0.5 * xd * s2 * k * q;
    const double e_B = m * q * e_s2 + m * fabs(s2) * e_q + 3 * U32 * fabs(B) + 3 * OP_TINY;
    const double gg = A + B;
    *err = e_A + e_B + U32 * fabs(gg) + OP_TINY;
    return gg;
}

// x of one element (inp, aux bf16) in double; *err bounds |the device's fp32 x − x| (0 for COPY: exact).
static double host_op_x(Fp8CastOp op, uint16_t inp, uint16_t aux, double* err) {
    const double v = test_bf16_to_float(inp);
    if (op == FP8_OP_GELU) return host_gelu(test_bf16_to_float(inp), err);
    if (op == FP8_OP_DGELU) {
        double e_gg;
        const double gg = host_gelu_grad(test_bf16_to_float(aux), &e_gg), x = v * gg;
        *err = OP_ERR_SAFETY * (fabs(v) * e_gg + U32 * fabs(x) + OP_TINY);
        return x;
    }
    *err = 0.0;
    return v;
}

// The device's formulas (gelu.cuh) evaluated in fp32 on the host, as other fp32 evaluations that the
// device's may be (another tanhf; fused: with fused multiply-adds wherever nvcc may contract), for the
// planted cases' "truth".
static float host_gelu_f32(float x, int fused) {
    const float cube = 0.044715f * x * x * x;
    const float in = fused ? fmaf(0.044715f * x * x, x, x) : x + cube;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * in));
}

static float host_gelu_grad_f32(float x, int fused) {
    const float cube = 0.044715f * x * x * x;
    const float th = tanhf(GELU_SCALING_FACTOR * (fused ? fmaf(0.044715f * x * x, x, x) : x + cube));
    const float sech2 = fused ? fmaf(-th, th, 1.0f) : 1.0f - th * th;
    if (fused)
        return fmaf(0.5f * x * sech2 * GELU_SCALING_FACTOR, fmaf(3.0f * 0.044715f * x, x, 1.0f), 0.5f * (1.0f + th));
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

static float host_op_x_f32(Fp8CastOp op, uint16_t inp, uint16_t aux, int fused) {
    const float v = test_bf16_to_float(inp);
    if (op == FP8_OP_GELU) return host_gelu_f32(v, fused);
    if (op == FP8_OP_DGELU) return v * host_gelu_grad_f32(test_bf16_to_float(aux), fused);
    return v;
}

static const char* op_name(Fp8CastOp op) { return op == FP8_OP_GELU ? "gelu" : op == FP8_OP_DGELU ? "dgelu" : "copy"; }

// What a cast_op case asks of the cast besides the amax (always asked for).
enum { W_OUT = 1, W_OUT_T = 2, W_COLSUM = 4, W_SATURATED = 8, W_ALL = 15 };

// The host's side of one cast-transpose with an op: x and its bound, and what the device may write.
typedef struct {
    int N, C, tiles;
    Fp8Format f;
    Fp8CastOp op;
    const uint16_t *inp, *aux;        // (N, C) bf16; aux NULL unless DGELU
    float scale;                      // 0 until op_ref_set_scale
    double* x;                        // (N, C) in double
    double* err;                      // (N, C): bound on |device x − x|
    double amax_x;                    // max |x|
    double amax_lo, amax_hi;          // the device's amax must lie in [lo, hi] (COPY: the exact host_amax)
    double *colsum, *colsum_bound;    // (tiles, C): Σx over each tile's rows, and the bound above
    uint8_t *lo, *hi;                 // (N, C): a device byte lies between these codes (by value)
    size_t ambiguous;                 // elements whose lo and hi differ (a rounding boundary within W)
    unsigned long long sat_lo, sat_hi;
} OpRef;

static void op_ref_make(OpRef* r, int N, int C, Fp8Format f, Fp8CastOp op, const uint16_t* inp, const uint16_t* aux) {
    const size_t n = (size_t)N * C;
    memset(r, 0, sizeof(*r));
    r->N = N, r->C = C, r->tiles = fp8_colsum_tiles(N), r->f = f, r->op = op, r->inp = inp, r->aux = aux;
    r->x = test_alloc(n), r->err = test_alloc(n);
    r->colsum = test_alloc((size_t)r->tiles * C), r->colsum_bound = test_alloc((size_t)r->tiles * C);
    r->lo = (uint8_t*)host_alloc(n), r->hi = (uint8_t*)host_alloc(n);
    const double gamma = 63 * U32 / (1 - 63 * U32);  // γ_63: 64 terms, any order
    for (int row = 0; row < N; row++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)row * C + c, t = (size_t)(row / FP8_CT_ROWS) * C + c;
            double e;
            const double x = host_op_x(op, inp[i], aux ? aux[i] : 0, &e);
            r->x[i] = x, r->err[i] = e;
            r->amax_x = fmax(r->amax_x, fabs(x));
            r->amax_lo = fmax(r->amax_lo, fabs(x) - e);
            r->amax_hi = fmax(r->amax_hi, fabs(x) + e);
            r->colsum[t] += x;
            r->colsum_bound[t] += e + gamma * (fabs(x) + e);
        }
    if (op == FP8_OP_COPY) r->amax_lo = r->amax_hi = host_amax(inp, n);
}

// The bytes and the saturated count the device may give at scale.
static void op_ref_set_scale(OpRef* r, float scale) {
    const size_t n = (size_t)r->N * r->C;
    const float fmax = fp8_format_max(r->f);
    r->scale = scale, r->ambiguous = 0, r->sat_lo = r->sat_hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (r->op == FP8_OP_COPY) {  // exact: fp32 x·scale, as the device
            r->lo[i] = r->hi[i] = host_cast(r->inp[i], scale, r->f);
            const unsigned long long s = fabsf(test_bf16_to_float(r->inp[i])) * scale > fmax;
            r->sat_lo += s, r->sat_hi += s;
            continue;
        }
        const double xs = r->x[i] * scale, w = scale * (r->err[i] + 2 * U32 * (fabs(r->x[i]) + r->err[i]));
        r->lo[i] = host_fp8_encode(xs - w, r->f), r->hi[i] = host_fp8_encode(xs + w, r->f);
        r->ambiguous += r->lo[i] != r->hi[i];
        r->sat_lo += fabs(xs) - w > fmax, r->sat_hi += fabs(xs) + w > fmax;
    }
}

static void op_ref_free(OpRef* r) {
    free(r->x), free(r->err), free(r->colsum), free(r->colsum_bound), free(r->lo), free(r->hi);
}

// What the device wrote, downloaded (or made on the host by the planted cases).
typedef struct {
    uint8_t *out, *out_t;          // GUARD + N·C + GUARD bytes each
    float* partial;                // GUARD + tiles·C + GUARD floats
    float amax;
    unsigned long long saturated;  // what the cast added to the count
} OpGot;

static size_t op_partial_floats(const OpRef* r) { return (size_t)r->tiles * r->C + 2 * GUARD; }

static OpGot op_got_alloc(const OpRef* r) {
    const size_t n = (size_t)r->N * r->C;
    OpGot g;
    g.out = (uint8_t*)host_alloc(n + 2 * GUARD), g.out_t = (uint8_t*)host_alloc(n + 2 * GUARD);
    g.partial = (float*)host_alloc(op_partial_floats(r) * sizeof(float));
    memset(g.out, 0xFF, n + 2 * GUARD), memset(g.out_t, 0xFF, n + 2 * GUARD);
    memset(g.partial, 0xFF, op_partial_floats(r) * sizeof(float));
    g.amax = 0.0f, g.saturated = 0;
    return g;
}

static OpGot op_got_copy(const OpRef* r, const OpGot* from) {
    const size_t n = (size_t)r->N * r->C;
    OpGot g = op_got_alloc(r);
    memcpy(g.out, from->out, n + 2 * GUARD), memcpy(g.out_t, from->out_t, n + 2 * GUARD);
    memcpy(g.partial, from->partial, op_partial_floats(r) * sizeof(float));
    g.amax = from->amax, g.saturated = from->saturated;
    return g;
}

static void op_got_free(OpGot* g) { free(g->out), free(g->out_t), free(g->partial); }

static int code_between(uint8_t b, uint8_t lo, uint8_t hi, Fp8Format f) {
    if (b == lo || b == hi) return 1;
    const double v = host_fp8_decode(b, f);  // NaN (poison) compares false
    return host_fp8_decode(lo, f) <= v && v <= host_fp8_decode(hi, f);
}

// got (GUARD + N·C + GUARD bytes, out or, transposed, out_t) against r's codes; guards untouched.
static void compare_op_bytes(const OpRef* r, const uint8_t* got, int transposed, const char* what, char* bad,
                             size_t bad_size) {
    const int N = r->N, C = r->C;
    const size_t n = (size_t)N * C;
    if (changed_poison_bytes(got, GUARD) || changed_poison_bytes(got + GUARD + n, GUARD))
        add_problem(bad, bad_size, "%s: the guard around it was written", what);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t at = transposed ? (i % C) * N + i / C : i;  // element i = (i / C, i % C)
        if (!code_between(got[GUARD + at], r->lo[i], r->hi[i], r->f) && wrong++ == 0) first = i;
    }
    if (wrong) {
        const size_t at = transposed ? (first % C) * N + first / C : first;
        add_problem(bad, bad_size, "%s: %zu of %zu bytes wrong, first (%zu, %zu): 0x%02X, expected 0x%02X..0x%02X "
                    "(x·scale %.9g)%s", what, wrong, n, first / C, first % C, got[GUARD + at], r->lo[first],
                    r->hi[first], r->x[first] * r->scale, got[GUARD + at] == 0xFF ? " (never written)" : "");
    }
}

// Everything the cast wrote against r (r's scale set when what asks for bytes or the count): the
// outputs asked for, the others untouched, the column sums, the amax and the count.
static void op_check(const OpRef* r, int what, const OpGot* g, char* bad, size_t bad_size) {
    const size_t n = (size_t)r->N * r->C, parts = (size_t)r->tiles * r->C;
    if (what & W_OUT) compare_op_bytes(r, g->out, 0, "out", bad, bad_size);
    else if (changed_poison_bytes(g->out, n + 2 * GUARD)) add_problem(bad, bad_size, "out was written (not asked for)");
    if (what & W_OUT_T) compare_op_bytes(r, g->out_t, 1, "out_t", bad, bad_size);
    else if (changed_poison_bytes(g->out_t, n + 2 * GUARD))
        add_problem(bad, bad_size, "out_t was written (not asked for)");
    if (what & W_COLSUM) {
        if (changed_poison_bytes(g->partial, GUARD * sizeof(float)) ||
            changed_poison_bytes(g->partial + GUARD + parts, GUARD * sizeof(float)))
            add_problem(bad, bad_size, "the guard around colsum_partial was written (a partial beyond its %d x %d)",
                        r->tiles, r->C);
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < parts; i++)
            if (!(fabs((double)g->partial[GUARD + i] - r->colsum[i]) <= r->colsum_bound[i]) && wrong++ == 0) first = i;
        if (wrong)
            add_problem(bad, bad_size, "%zu of %zu column sums wrong, first tile %zu channel %zu: %.9g, expected "
                        "%.9g ± %.3g%s", wrong, parts, first / r->C, first % r->C, g->partial[GUARD + first],
                        r->colsum[first], r->colsum_bound[first],
                        isnan(g->partial[GUARD + first]) ? " (never written)" : "");
    } else if (changed_poison_bytes(g->partial, op_partial_floats(r) * sizeof(float))) {
        add_problem(bad, bad_size, "colsum_partial was written (not asked for)");
    }
    if (r->amax_lo == r->amax_hi ? !float_same_bits(g->amax, (float)r->amax_lo)
                                 : !(r->amax_lo <= g->amax && g->amax <= r->amax_hi))
        add_problem(bad, bad_size, "amax %a, expected %a..%a", g->amax, r->amax_lo, r->amax_hi);
    const unsigned long long lo = (what & W_SATURATED) ? r->sat_lo : 0, hi = (what & W_SATURATED) ? r->sat_hi : 0;
    if (g->saturated < lo || g->saturated > hi)
        add_problem(bad, bad_size, "saturated count grew by %llu, expected %llu..%llu", g->saturated, lo, hi);
}

// The inputs of an op's cast: inp (and aux for DGELU: inp the gradient, aux GELU's input).
static void op_inputs(TestRng* rng, Fp8CastOp op, size_t n, uint16_t** inp, uint16_t** aux) {
    *inp = random_bf16(rng, n, op == FP8_OP_DGELU ? 1e-2 : 1.5);
    *aux = op == FP8_OP_DGELU ? random_bf16(rng, n, 1.5) : NULL;
}

typedef enum { SCALE_SATURATE = 0, SCALE_HALF = 1, SCALE_4X = 2, SCALE_NONE = 3 } OpScale;
static const float OP_SCALE_FACTOR[] = {1.25f, 0.5f, 4.0f, 0.0f};  // scale = factor · max / max |x|
static const char* OP_SCALE_NAMES[] = {"", "_scale_half_none_saturate", "_scale_4x_many_saturate", ""};

// p: N, C, format, op, what (W_ flags), scale (OpScale; SCALE_NONE: scale NULL, nothing but the amax
// and the column sums asked for). One fp8_cast_transpose_op on the device, checked by op_check.
static void cast_op_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = c->p[0], C = c->p[1], what = c->p[4];
    const Fp8Format f = (Fp8Format)c->p[2];
    const Fp8CastOp op = (Fp8CastOp)c->p[3];
    const OpScale sk = (OpScale)c->p[5];
    const size_t n = (size_t)N * C;
    uint16_t *inp, *aux;
    op_inputs(&rng, op, n, &inp, &aux);
    OpRef r;
    op_ref_make(&r, N, C, f, op, inp, aux);
    const float scale = sk == SCALE_NONE ? 0.0f : OP_SCALE_FACTOR[sk] * fp8_format_max(f) / (float)r.amax_x;
    if (sk != SCALE_NONE) op_ref_set_scale(&r, scale);
    if (sk == SCALE_HALF && r.sat_hi != 0)
        add_problem(bad, sizeof(bad), "the host expects %llu saturated at half the scale (should be 0)", r.sat_hi);

    __nv_bfloat16* d_inp = (__nv_bfloat16*)device_alloc(n * 2);
    __nv_bfloat16* d_aux = aux ? (__nv_bfloat16*)device_alloc(n * 2) : NULL;
    uint8_t* d_out = (uint8_t*)poisoned(n + 2 * GUARD);
    uint8_t* d_out_t = (uint8_t*)poisoned(n + 2 * GUARD);
    float* d_part = (float*)poisoned(op_partial_floats(&r) * sizeof(float));
    float* d_f = (float*)device_alloc(2 * sizeof(float));  // scale, amax
    unsigned long long* d_sat = (unsigned long long*)device_alloc(sizeof(unsigned long long));
    const float init[2] = {scale, 0.0f};
    const unsigned long long preset = SAT_PRESET;
    upload(d_inp, inp, n * 2);
    if (aux) upload(d_aux, aux, n * 2);
    upload(d_f, init, sizeof(init));
    upload(d_sat, &preset, sizeof(preset));
    Fp8CastArgs a;
    memset(&a, 0, sizeof(a));
    a.out = (what & W_OUT) ? d_out + GUARD : NULL;
    a.out_t = (what & W_OUT_T) ? d_out_t + GUARD : NULL;
    a.inp = d_inp, a.aux = d_aux, a.N = N, a.C = C, a.format = f, a.op = op;
    a.scale = sk == SCALE_NONE ? NULL : d_f;
    a.amax = d_f + 1;
    a.saturated = (what & W_SATURATED) ? d_sat : NULL;
    a.colsum_partial = (what & W_COLSUM) ? d_part + GUARD : NULL;
    fp8_cast_transpose_op(&a, g_stream);

    OpGot g = op_got_alloc(&r);
    float res[2];
    unsigned long long sat = 0;
    download(res, d_f, sizeof(res), c->name);
    download(&sat, d_sat, sizeof(sat), c->name);
    download(g.out, d_out, n + 2 * GUARD, c->name);
    download(g.out_t, d_out_t, n + 2 * GUARD, c->name);
    download(g.partial, d_part, op_partial_floats(&r) * sizeof(float), c->name);
    g.amax = res[1], g.saturated = sat - SAT_PRESET;  // an overwrite below the preset wraps: rejected
    op_check(&r, what, &g, bad, sizeof(bad));
    printf("  %s: %zu of %zu elements within the device/host bound of a rounding boundary (either code taken); "
           "amax %a in [%a, %a]; saturated %llu (host %llu..%llu)\n", c->name, r.ambiguous, n, g.amax, r.amax_lo,
           r.amax_hi, g.saturated, r.sat_lo, r.sat_hi);
    op_got_free(&g), op_ref_free(&r), free(inp), free(aux);
    CUDA_CHECK(cudaFree(d_inp)), CUDA_CHECK(cudaFree(d_out)), CUDA_CHECK(cudaFree(d_out_t));
    CUDA_CHECK(cudaFree(d_part)), CUDA_CHECK(cudaFree(d_f)), CUDA_CHECK(cudaFree(d_sat));
    if (d_aux) CUDA_CHECK(cudaFree(d_aux));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// What a cast of r's inputs with op would write, emulated in fp32 on the host at r's scale (column
// sums in row order), with fused multiply-adds or without.
static OpGot op_emulate(const OpRef* r, Fp8CastOp op, int fused) {
    OpGot g = op_got_alloc(r);
    const int N = r->N, C = r->C;
    const float fmax = fp8_format_max(r->f);
    uint32_t m = 0;
    for (size_t i = 0; i < (size_t)r->tiles * C; i++) g.partial[GUARD + i] = 0.0f;
    for (int row = 0; row < N; row++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)row * C + c;
            const float x = host_op_x_f32(op, r->inp[i], r->aux ? r->aux[i] : 0, fused), xs = x * r->scale;
            g.out[GUARD + i] = g.out_t[GUARD + (size_t)c * N + row] = host_fp8_encode(xs, r->f);
            g.partial[GUARD + (size_t)(row / FP8_CT_ROWS) * C + c] += x;
            g.saturated += fabsf(x) * r->scale > fmax;
            uint32_t bits;
            memcpy(&bits, &x, sizeof(bits));
            m = (bits & 0x7FFFFFFFu) > m ? (bits & 0x7FFFFFFFu) : m;
        }
    memcpy(&g.amax, &m, sizeof(m));
    return g;
}

#define NUM_OP_PLANTS 12
static const char* OP_PLANT_NAMES[NUM_OP_PLANTS] = {
    "an out byte one code off", "an out_t byte one code off", "an out byte never written",
    "the guard after out written", "out_t not transposed", "a column sum short one row",
    "a column sum of the last tile never written", "a partial written beyond C (the guard)", "the wrong op",
    "the amax 2^-10 too large", "the saturated count one too high", "the saturated count one too low"};

// Plants error k into g (a copy of the truth).
static void op_plant(const OpRef* r, int k, OpGot* g) {
    const int N = r->N, C = r->C;
    const size_t n = (size_t)N * C;
    size_t i = n / 3;  // an element whose byte is a single code, not the largest (room for the next code)
    while (i < n && (r->lo[i] != r->hi[i] || (r->lo[i] & 0x7F) >= host_fp8_spec(r->f).max_code)) i++;
    const size_t e = i < n ? i : 0;
    const uint8_t next = (uint8_t)(r->lo[e] + 1);  // one code larger in magnitude, same sign
    const size_t e_t = (e % C) * N + e / C;
    if (k == 0) g->out[GUARD + e] = next;
    if (k == 1) g->out_t[GUARD + e_t] = next;
    if (k == 2) g->out[GUARD + n / 2] = 0xFF;
    if (k == 3) g->out[GUARD + n] = 0x00;
    if (k == 4) memcpy(g->out_t + GUARD, g->out + GUARD, n);
    if (k == 5) {  // channel C − 1 (in the last, partial tile of channels) of tile 0 without its largest row
        int best = 0;
        for (int row = 1; row < N && row < FP8_CT_ROWS; row++)
            if (fabs(r->x[(size_t)row * C + C - 1]) > fabs(r->x[(size_t)best * C + C - 1])) best = row;
        g->partial[GUARD + C - 1] -= host_op_x_f32(r->op, r->inp[(size_t)best * C + C - 1],
                                                   r->aux ? r->aux[(size_t)best * C + C - 1] : 0, 0);
    }
    if (k == 6) memset(&g->partial[GUARD + (size_t)(r->tiles - 1) * C + C - 1], 0xFF, sizeof(float));
    if (k == 7) g->partial[GUARD + (size_t)r->tiles * C] = 0.0f;
    if (k == 8) {
        op_got_free(g);
        *g = op_emulate(r, r->op == FP8_OP_COPY ? FP8_OP_GELU : FP8_OP_COPY, 0);
    }
    if (k == 9) g->amax *= 1.0f + 0x1p-10f;
    if (k == 10) g->saturated = r->sat_hi + 1;
    if (k == 11) g->saturated = r->sat_lo - 1;  // sat_lo ≥ 1 (checked by the case)
}

// p: format, op. op_check on host data (77 × 144: both tiles ragged): the fp32 emulation must pass,
// each of the planted errors must be rejected.
static void planted_cast_op_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = 77, C = 144;
    const Fp8Format f = (Fp8Format)c->p[0];
    const Fp8CastOp op = (Fp8CastOp)c->p[1];
    uint16_t *inp, *aux;
    op_inputs(&rng, op, (size_t)N * C, &inp, &aux);
    OpRef r;
    op_ref_make(&r, N, C, f, op, inp, aux);
    op_ref_set_scale(&r, 1.25f * fp8_format_max(f) / (float)r.amax_x);
    if (r.sat_lo < 1) add_problem(bad, sizeof(bad), "the host expects no certain saturation (needs one)");
    char why[512] = "";
    OpGot fused = op_emulate(&r, op, 1);
    op_check(&r, W_ALL, &fused, why, sizeof(why));
    if (why[0]) add_problem(bad, sizeof(bad), "the fp32 emulation with fused multiply-adds was rejected: %s", why);
    op_got_free(&fused);
    OpGot truth = op_emulate(&r, op, 0);
    why[0] = 0;
    op_check(&r, W_ALL, &truth, why, sizeof(why));
    if (why[0]) add_problem(bad, sizeof(bad), "the fp32 emulation was rejected: %s", why);
    for (int k = 0; k < NUM_OP_PLANTS; k++) {
        OpGot g = op_got_copy(&r, &truth);
        op_plant(&r, k, &g);
        why[0] = 0;
        op_check(&r, W_ALL, &g, why, sizeof(why));
        if (!why[0]) add_problem(bad, sizeof(bad), "planted '%s' was not rejected", OP_PLANT_NAMES[k]);
        op_got_free(&g);
    }
    printf("  %s: the emulations pass (%zu of %zu elements near a boundary); %d planted errors rejected\n", c->name,
           r.ambiguous, (size_t)N * C, bad[0] ? -1 : NUM_OP_PLANTS);
    op_got_free(&truth), op_ref_free(&r), free(inp), free(aux);
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// ---- scales -----------------------------------------------------------------------------------------------

// The documented delayed update, on the host (the model the kernel is held to).
static void host_delayed_update(Fp8ScaleState* st, int margin, int pow2) {
    if (isfinite(st->amax)) {
        memmove(st->history + 1, st->history, (FP8_AMAX_HISTORY - 1) * sizeof(float));
        st->history[0] = st->amax;
    } else {
        st->nonfinite++;
    }
    st->amax = 0.0f;
    float m = 0.0f;
    for (int h = 0; h < FP8_AMAX_HISTORY; h++) m = st->history[h] > m ? st->history[h] : m;
    st->scale = fp8_scale_for_amax(m, st->fp8_max, margin, pow2, st->scale);
    st->scale_inv = 1.0f / st->scale;
    st->updates++;
}

static void compare_states(const Fp8ScaleState* got, const Fp8ScaleState* want, int step, int i, char* bad,
                           size_t bad_size) {
    int same = float_same_bits(got->scale, want->scale) && float_same_bits(got->scale_inv, want->scale_inv) &&
               float_same_bits(got->amax, want->amax) && got->nonfinite == want->nonfinite &&
               got->updates == want->updates;
    for (int h = 0; h < FP8_AMAX_HISTORY; h++) same = same && float_same_bits(got->history[h], want->history[h]);
    if (!same)
        add_problem(bad, bad_size, "step %d state %d: scale %a (expected %a), amax %a, history[0] %a (expected %a), "
                    "nonfinite %d (expected %d)", step, i, got->scale, want->scale, got->amax, got->history[0],
                    want->history[0], got->nonfinite, want->nonfinite);
}

// The amax state i records before update `step`: none for 3 steps, then log-normal around a base,
// a spike (×1000) into state 0 at step 10, NaN into state 1 at 20, inf into state 2 at 25.
static float planted_amax(TestRng* rng, int step, int i) {
    static const float base[3] = {1.0f, 1e-3f, 50.0f};
    if (step < 3) return 0.0f;
    if (i == 1 && step == 20) return NAN;
    if (i == 2 && step == 25) return INFINITY;
    const float a = base[i] * (float)exp(0.5 * test_rng_normal(rng));
    return i == 0 && step == 10 ? 1000.0f * a : a;
}

// p: margin, pow2. Three states (E4M3, E5M2, E4M3), 40 updates against host_delayed_update; state
// 0's spike must set its scale for exactly 16 updates.
static void delayed_update_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int margin = c->p[0], pow2 = c->p[1], steps = 40;
    const Fp8Format formats[3] = {FP8_E4M3, FP8_E5M2, FP8_E4M3};
    Fp8ScaleState* d = (Fp8ScaleState*)device_alloc(3 * sizeof(Fp8ScaleState));
    fp8_scale_states_init(d, formats, 3, g_stream);
    Fp8ScaleState want[3], got[3];
    download(want, d, sizeof(want), c->name);
    float spike_scale = 0.0f;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < 3; i++) {
            want[i].amax = planted_amax(&rng, step, i);
            upload(&d[i].amax, &want[i].amax, sizeof(float));
            host_delayed_update(&want[i], margin, pow2);
        }
        fp8_delayed_update(d, 3, margin, pow2, g_stream);
        download(got, d, sizeof(got), c->name);
        for (int i = 0; i < 3; i++) compare_states(&got[i], &want[i], step, i, bad, sizeof(bad));
        if (step == 10) spike_scale = got[0].scale;
        const int spike_held = step >= 10 && step < 10 + FP8_AMAX_HISTORY;
        if (step >= 10 && (got[0].scale == spike_scale) != spike_held)
            add_problem(bad, sizeof(bad), "step %d: the spike %s the scale", step, spike_held ? "no longer sets" : "still sets");
        if (bad[0]) break;
    }
    if (!bad[0] && (got[1].nonfinite != 1 || got[2].nonfinite != 1))
        add_problem(bad, sizeof(bad), "nonfinite counts %d, %d; expected 1, 1", got[1].nonfinite, got[2].nonfinite);
    CUDA_CHECK(cudaFree(d));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// p: format, margin, pow2. fp8_current_scale of a tensor, then the cast with its scale.
static void current_scale_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = 1000, C = 2064, margin = c->p[1], pow2 = c->p[2];
    const Fp8Format f = (Fp8Format)c->p[0];
    const size_t n = (size_t)N * C;
    uint16_t* x = random_bf16(&rng, n, 0.02);
    __nv_bfloat16* d_x = (__nv_bfloat16*)device_alloc(n * 2);
    uint8_t* d_out = (uint8_t*)poisoned(n);
    Fp8ScaleState* d_st = (Fp8ScaleState*)device_alloc(sizeof(Fp8ScaleState));
    fp8_scale_states_init(d_st, &f, 1, g_stream);
    upload(d_x, x, n * 2);
    fp8_current_scale(d_st, d_x, N, C, margin, pow2, g_stream);
    fp8_cast(d_out, d_x, N, C, f, &d_st->scale, NULL, g_stream);
    Fp8ScaleState st;
    uint8_t* got = (uint8_t*)host_alloc(n);
    download(&st, d_st, sizeof(st), c->name);
    download(got, d_out, n, c->name);
    const float amax = host_amax(x, n), scale = fp8_scale_for_amax(amax, fp8_format_max(f), margin, pow2, 1.0f);
    if (!float_same_bits(st.amax, amax) || !float_same_bits(st.amax_current, amax))
        add_problem(bad, sizeof(bad), "amax %a, amax_current %a, expected %a", st.amax, st.amax_current, amax);
    if (!float_same_bits(st.scale, scale) || !float_same_bits(st.scale_inv, 1.0f / scale))
        add_problem(bad, sizeof(bad), "scale %a / inverse %a, expected %a / %a", st.scale, st.scale_inv, scale, 1.0f / scale);
    double top = 0.0;
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        wrong += !fp8_same(got[i], host_cast(x[i], scale, f), f);
        top = fmax(top, fabs(host_fp8_decode(got[i], f)));
    }
    const double ceiling = ldexp(fp8_format_max(f), -margin);
    if (wrong) add_problem(bad, sizeof(bad), "%zu of %zu bytes differ from the host's cast", wrong, n);
    if (!(top <= ceiling && (pow2 ? top >= ceiling / 2 : top == ceiling)))
        add_problem(bad, sizeof(bad), "largest stored value %g; expected %s%g", top, pow2 ? "in [max/2, max] of " : "", ceiling);
    free(x), free(got);
    CUDA_CHECK(cudaFree(d_x)), CUDA_CHECK(cudaFree(d_out)), CUDA_CHECK(cudaFree(d_st));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// p: preset (0: the state's amax above the tensor's, 1: below it, 2: NaN). fp8_current_scale must
// set amax_current = max |x| (preset stale at 12345), the scale from amax_current alone, and amax =
// max(preset, amax_current) with NaN kept; the count and the history untouched. Rejects: amax_current
// not written (stays 12345); the old behaviour, amax overwritten by the tensor's (preset above); amax
// not updated (preset below); the scale taken from max(amax, amax_current) (preset above: 448/preset);
// a fmaxf that drops the NaN (preset NaN); a write over the saturated count or the history.
static void current_scale_preset_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = 77, C = 2064, preset_kind = c->p[0];
    const Fp8Format f = FP8_E4M3;
    const size_t n = (size_t)N * C;
    uint16_t* x = random_bf16(&rng, n, 0.02);
    const float amax = host_amax(x, n);
    const float preset = preset_kind == 0 ? 4.0f * amax : preset_kind == 1 ? 0.25f * amax : NAN;
    __nv_bfloat16* d_x = (__nv_bfloat16*)device_alloc(n * 2);
    Fp8ScaleState* d_st = (Fp8ScaleState*)device_alloc(sizeof(Fp8ScaleState));
    fp8_scale_states_init(d_st, &f, 1, g_stream);
    Fp8ScaleState st, before;
    download(&before, d_st, sizeof(before), c->name);
    before.amax = preset, before.amax_current = 12345.0f, before.saturated = 7, before.history[0] = 3.0f;
    upload(d_st, &before, sizeof(before));
    upload(d_x, x, n * 2);
    fp8_current_scale(d_st, d_x, N, C, 0, 0, g_stream);
    download(&st, d_st, sizeof(st), c->name);
    const float scale = fp8_scale_for_amax(amax, fp8_format_max(f), 0, 0, 1.0f);
    const float want_amax = preset_kind == 0 ? preset : preset_kind == 1 ? amax : NAN;
    if (!float_same_bits(st.amax_current, amax))
        add_problem(bad, sizeof(bad), "amax_current %a, expected %a", st.amax_current, amax);
    if (!float_same_bits(st.amax, want_amax))
        add_problem(bad, sizeof(bad), "amax %a, expected %a (preset %a)", st.amax, want_amax, preset);
    if (!float_same_bits(st.scale, scale) || !float_same_bits(st.scale_inv, 1.0f / scale))
        add_problem(bad, sizeof(bad), "scale %a / inverse %a, expected %a / %a (from amax_current alone)", st.scale,
                    st.scale_inv, scale, 1.0f / scale);
    if (st.saturated != 7 || !float_same_bits(st.history[0], 3.0f) || st.updates != before.updates ||
        st.nonfinite != before.nonfinite)
        add_problem(bad, sizeof(bad), "saturated %llu (expected 7), history[0] %g (expected 3), updates %d, "
                    "nonfinite %d: changed", st.saturated, st.history[0], st.updates, st.nonfinite);
    free(x);
    CUDA_CHECK(cudaFree(d_x)), CUDA_CHECK(cudaFree(d_st));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// Casts x (N, C) with the state's scale, recording into its amax; checks the bytes against the host
// at the scale the state held, and returns the host amax.
static float cast_with_state(Fp8ScaleState* d_st, const uint16_t* x, __nv_bfloat16* d_x, uint8_t* d_out, int N, int C,
                             const char* name, char* bad, size_t bad_size) {
    const size_t n = (size_t)N * C;
    Fp8ScaleState before;
    download(&before, d_st, sizeof(before), name);
    upload(d_x, x, n * 2);
    fp8_cast_transpose(d_out, NULL, d_x, N, C, FP8_E4M3, &d_st->scale, &d_st->amax, g_stream);
    uint8_t* got = (uint8_t*)host_alloc(n);
    download(got, d_out, n, name);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += !fp8_same(got[i], host_cast(x[i], before.scale, FP8_E4M3), FP8_E4M3);
    if (wrong) add_problem(bad, bad_size, "%zu bytes differ from the host's cast at scale %g", wrong, before.scale);
    free(got);
    return host_amax(x, n);
}

// A delayed-scaling round trip: cast (scale 1) → update → cast with the new scale → update.
static void delayed_loop_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = 256, C = 768;
    const Fp8Format f = FP8_E4M3;
    __nv_bfloat16* d_x = (__nv_bfloat16*)device_alloc((size_t)N * C * 2);
    uint8_t* d_out = (uint8_t*)device_alloc((size_t)N * C);
    Fp8ScaleState* d_st = (Fp8ScaleState*)device_alloc(sizeof(Fp8ScaleState));
    fp8_scale_states_init(d_st, &f, 1, g_stream);
    float amax[2];
    for (int k = 0; k < 2; k++) {
        uint16_t* x = random_bf16(&rng, (size_t)N * C, k ? 3.0 : 1.0);
        amax[k] = cast_with_state(d_st, x, d_x, d_out, N, C, c->name, bad, sizeof(bad));
        Fp8ScaleState st;
        download(&st, d_st, sizeof(st), c->name);
        if (!float_same_bits(st.amax, amax[k])) add_problem(bad, sizeof(bad), "cast %d recorded amax %a, expected %a", k, st.amax, amax[k]);
        fp8_delayed_update(d_st, 1, 0, 0, g_stream);
        download(&st, d_st, sizeof(st), c->name);
        const float m = k ? fmaxf(amax[0], amax[1]) : amax[0];
        if (!float_same_bits(st.scale, 448.0f / m) || st.amax != 0.0f || !float_same_bits(st.history[0], amax[k]))
            add_problem(bad, sizeof(bad), "after update %d: scale %a (expected %a), amax %g, history[0] %a", k, st.scale,
                        448.0f / m, st.amax, st.history[0]);
        free(x);
    }
    CUDA_CHECK(cudaFree(d_x)), CUDA_CHECK(cudaFree(d_out)), CUDA_CHECK(cudaFree(d_st));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// ---- GEMMs ----------------------------------------------------------------------------------------------

// An FP8 tensor (rows, cols) made on the host: its bytes in both layouts and the decoded values
// (unscaled: exact in float); the tensor is dec · scale_inv.
typedef struct {
    int rows, cols;
    Fp8Format format;
    float scale_inv;
    uint8_t *bytes, *bytes_t;  // (rows, cols) and (cols, rows)
    float *dec, *dec_t;
    uint8_t *d_bytes, *d_bytes_t;  // on the device
    float* d_scale_inv;
} HostFp8;

// Normal values of standard deviation sigma, quantized with scale max/amax (the largest maps to max).
static void host_fp8_make(HostFp8* t, int rows, int cols, Fp8Format f, double sigma, TestRng* rng) {
    const size_t n = (size_t)rows * cols;
    double* x = test_alloc(n);
    double amax = 0.0;
    for (size_t i = 0; i < n; i++) {
        x[i] = sigma * test_rng_normal(rng);
        amax = fmax(amax, fabs(x[i]));
    }
    const float scale = (float)(fp8_format_max(f) / amax);
    t->rows = rows, t->cols = cols, t->format = f, t->scale_inv = 1.0f / scale;
    t->bytes = (uint8_t*)host_alloc(n), t->bytes_t = (uint8_t*)host_alloc(n);
    t->dec = (float*)host_alloc(n * sizeof(float)), t->dec_t = (float*)host_alloc(n * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * cols + c, j = (size_t)c * rows + r;
            t->bytes[i] = t->bytes_t[j] = host_fp8_encode(x[i] * scale, f);
            t->dec[i] = t->dec_t[j] = (float)host_fp8_decode(t->bytes[i], f);
        }
    free(x);
    t->d_bytes = (uint8_t*)device_alloc(n), t->d_bytes_t = (uint8_t*)device_alloc(n);
    t->d_scale_inv = (float*)device_alloc(sizeof(float));
    upload(t->d_bytes, t->bytes, n);
    upload(t->d_bytes_t, t->bytes_t, n);
    upload(t->d_scale_inv, &t->scale_inv, sizeof(float));
}

static void host_fp8_free(HostFp8* t) {
    free(t->bytes), free(t->bytes_t), free(t->dec), free(t->dec_t);
    CUDA_CHECK(cudaFree(t->d_bytes)), CUDA_CHECK(cudaFree(t->d_bytes_t)), CUDA_CHECK(cudaFree(t->d_scale_inv));
}

// One GEMM's reference, as the checks see it: out (R, Cc) = sp · sq · P (R, K) · Q (Cc, K)ᵀ + extra,
// extra = bias[c] (bias (Cc)) or base[r][c] (base (R, Cc)), either NULL.
typedef struct {
    int R, Cc, K;
    const float *P, *Q;
    double sp, sq;
    const uint16_t* bias;
    const uint16_t* base;
    int fast_accum;
} GemmRef;

typedef struct {
    double rel;          // ‖y − ref‖/‖ref‖ over the checked rows
    double worst;        // max over checked elements of |y − ref| / bound
    long violations;     // elements over their bound
    long checked, nonfinite;
    int guards_written;
} GemmCheck;

// Checks out (GUARD + R·Cc + GUARD bf16, as downloaded) against g (see the top of the file).
static GemmCheck check_gemm(const uint16_t* out, const GemmRef* g, TestRng* rng) {
    GemmCheck k = {0.0, 0.0, 0, 0, 0, 0};
    const size_t n = (size_t)g->R * g->Cc;
    k.guards_written = changed_poison_bytes(out, GUARD * 2) || changed_poison_bytes(out + GUARD + n, GUARD * 2);
    for (size_t i = 0; i < n; i++) k.nonfinite += !bf16_is_finite(out[GUARD + i]);
    const double c_acc = g->fast_accum ? ACC_FAST_STEP * ((g->K + 31) / 32) : ACC_PRECISE;
    const double cost = (double)g->Cc * g->K;
    int rows = g->R;
    if ((double)g->R * cost > REF_BUDGET) rows = (int)fmax(MIN_ROWS, REF_BUDGET / cost);
    double num = 0.0, den = 0.0;
    for (int t = 0; t < rows; t++) {
        const int r = rows == g->R ? t : t == 0 ? 0 : t == 1 ? g->R - 1 : (int)(test_rng_next(rng) % g->R);
        for (int c = 0; c < g->Cc; c++) {
            double acc = 0.0, mag = 0.0;
            const float *p = g->P + (size_t)r * g->K, *q = g->Q + (size_t)c * g->K;
            for (int i = 0; i < g->K; i++) {
                const double prod = (double)p[i] * (double)q[i];
                acc += prod;
                mag += fabs(prod);
            }
            double ref = acc * g->sp * g->sq;
            mag *= g->sp * g->sq;
            const double extra = g->bias ? test_bf16_to_float(g->bias[c])
                                 : g->base ? test_bf16_to_float(g->base[(size_t)r * g->Cc + c]) : 0.0;
            ref += extra;
            mag += fabs(extra);
            const double y = test_bf16_to_float(out[GUARD + (size_t)r * g->Cc + c]);
            const double err = fabs(y - ref), bound = BF16_ROUNDING * fabs(ref) + c_acc * mag + 1e-30;
            k.violations += !(err <= bound);
            k.worst = fmax(k.worst, isnan(err) ? INFINITY : err / bound);
            num += (y - ref) * (y - ref);
            den += ref * ref;
            k.checked++;
        }
    }
    k.rel = den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
    return k;
}

static int gemm_check_ok(const GemmCheck* k, int fast_accum) {
    return k->violations == 0 && k->rel <= (fast_accum ? TOL_NORM_FAST : TOL_NORM) && k->nonfinite == 0 &&
           !k->guards_written;
}

static void describe_check(const GemmCheck* k, int fast_accum, char* bad, size_t bad_size) {
    if (k->guards_written) add_problem(bad, bad_size, "the guard around the output was written");
    if (k->nonfinite) add_problem(bad, bad_size, "%ld elements not finite (unwritten: poison)", k->nonfinite);
    if (k->violations)
        add_problem(bad, bad_size, "%ld of %ld elements over their bound (worst %.3g× its bound)", k->violations,
                    k->checked, k->worst);
    if (!(k->rel <= (fast_accum ? TOL_NORM_FAST : TOL_NORM)))
        add_problem(bad, bad_size, "||y - ref||/||ref|| = %.3g > %.3g", k->rel, fast_accum ? TOL_NORM_FAST : TOL_NORM);
}

typedef struct {
    int N, IC, OC;
} GemmShape;
static const GemmShape GEMM_SHAPES[] = {{16, 16, 16},     {48, 80, 32},     {256, 512, 384},
                                        {1040, 2064, 784}, {512, 2048, 8192}, {512, 8192, 2048}};
#define PLANT_SHAPE 2  // (256, 512, 384)
#define RERUN_SHAPE 3

typedef enum {
    V_FWD_FAST, V_FWD, V_FWD_BIAS, V_DINP_E5M2, V_DINP_E4M3, V_DWEIGHT, V_DWEIGHT_ACC, NUM_VARIANTS
} GemmVariant;
static const char* VARIANT_NAMES[NUM_VARIANTS] = {"forward_fast_accum", "forward",   "forward_bias_fast_accum",
                                                  "dinp_e5m2",          "dinp_e4m3", "dweight_e5m2",
                                                  "dweight_e5m2_accumulate"};

static int variant_fast(GemmVariant v) { return v == V_FWD_FAST || v == V_FWD_BIAS; }

// One shape's operands, made at its first case and kept for the next ones.
typedef struct {
    int shape;                // index into GEMM_SHAPES; -1: none yet
    HostFp8 x, w, dy, dy4;    // x (N, IC), w (OC, IC) E4M3; dy (N, OC) E5M2, dy4 the same in E4M3
    uint16_t *bias, *base;    // bias (OC); base (OC, IC): dweight's starting values when accumulating
    __nv_bfloat16 *d_bias, *d_base;
    uint16_t* d_out;          // GUARD + the largest output + GUARD
    size_t out_elems;
} GemmData;
static GemmData g_gd;  // shape -1 from main on

static void gemm_data_free(GemmData* gd) {
    if (gd->shape < 0) return;
    host_fp8_free(&gd->x), host_fp8_free(&gd->w), host_fp8_free(&gd->dy), host_fp8_free(&gd->dy4);
    free(gd->bias), free(gd->base);
    CUDA_CHECK(cudaFree(gd->d_bias)), CUDA_CHECK(cudaFree(gd->d_base)), CUDA_CHECK(cudaFree(gd->d_out));
    gd->shape = -1;
}

static GemmData* gemm_data(int shape) {
    if (g_gd.shape == shape) return &g_gd;
    gemm_data_free(&g_gd);
    const GemmShape s = GEMM_SHAPES[shape];
    TestRng rng = {g_seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(shape + 1))};
    GemmData* gd = &g_gd;
    host_fp8_make(&gd->x, s.N, s.IC, FP8_E4M3, 1.0, &rng);
    host_fp8_make(&gd->w, s.OC, s.IC, FP8_E4M3, 0.02, &rng);
    host_fp8_make(&gd->dy, s.N, s.OC, FP8_E5M2, 1e-3, &rng);
    host_fp8_make(&gd->dy4, s.N, s.OC, FP8_E4M3, 1e-3, &rng);
    const double out_sd = 0.02 * sqrt((double)s.IC), dw_sd = 1e-3 * sqrt((double)s.N);  // of out and dweight
    gd->bias = (uint16_t*)host_alloc((size_t)s.OC * 2);
    for (int i = 0; i < s.OC; i++) gd->bias[i] = test_float_to_bf16((float)(out_sd * test_rng_normal(&rng)));
    gd->base = (uint16_t*)host_alloc((size_t)s.OC * s.IC * 2);
    for (size_t i = 0; i < (size_t)s.OC * s.IC; i++)
        gd->base[i] = test_float_to_bf16((float)(dw_sd * test_rng_normal(&rng)));
    gd->d_bias = (__nv_bfloat16*)device_alloc((size_t)s.OC * 2);
    gd->d_base = (__nv_bfloat16*)device_alloc((size_t)s.OC * s.IC * 2);
    upload(gd->d_bias, gd->bias, (size_t)s.OC * 2);
    upload(gd->d_base, gd->base, (size_t)s.OC * s.IC * 2);
    const size_t a = (size_t)s.N * s.OC, b = (size_t)s.N * s.IC, c = (size_t)s.OC * s.IC;
    gd->out_elems = a > b ? (a > c ? a : c) : (b > c ? b : c);
    gd->d_out = (uint16_t*)device_alloc((gd->out_elems + 2 * GUARD) * 2);
    gd->shape = shape;
    return gd;
}

// Variant v's two operands (in the order of its matmul_fp8 function's arguments) and reference.
static void variant_setup(GemmVariant v, const GemmShape* s, const GemmData* gd, Fp8Operand op[2], GemmRef* ref) {
    memset(ref, 0, sizeof(*ref));
    ref->fast_accum = variant_fast(v);
    const HostFp8 *p, *q;
    if (v <= V_FWD_BIAS) {  // out (N, OC) = x (N, IC) · w (OC, IC)ᵀ
        p = &gd->x, q = &gd->w;
        op[0] = fp8_operand(gd->x.d_bytes, FP8_E4M3, gd->x.d_scale_inv);
        op[1] = fp8_operand(gd->w.d_bytes, FP8_E4M3, gd->w.d_scale_inv);
        ref->R = s->N, ref->Cc = s->OC, ref->K = s->IC, ref->P = p->dec, ref->Q = q->dec;
        ref->bias = v == V_FWD_BIAS ? gd->bias : NULL;
    } else if (v <= V_DINP_E4M3) {  // dinp (N, IC) = dy (N, OC) · w_t (IC, OC)ᵀ
        p = v == V_DINP_E5M2 ? &gd->dy : &gd->dy4, q = &gd->w;
        op[0] = fp8_operand(p->d_bytes, p->format, p->d_scale_inv);
        op[1] = fp8_operand(gd->w.d_bytes_t, FP8_E4M3, gd->w.d_scale_inv);
        ref->R = s->N, ref->Cc = s->IC, ref->K = s->OC, ref->P = p->dec, ref->Q = q->dec_t;
    } else {  // dweight (OC, IC) = dy_t (OC, N) · x_t (IC, N)ᵀ
        p = &gd->dy, q = &gd->x;
        op[0] = fp8_operand(gd->dy.d_bytes_t, FP8_E5M2, gd->dy.d_scale_inv);
        op[1] = fp8_operand(gd->x.d_bytes_t, FP8_E4M3, gd->x.d_scale_inv);
        ref->R = s->OC, ref->Cc = s->IC, ref->K = s->N, ref->P = p->dec_t, ref->Q = q->dec_t;
        ref->base = v == V_DWEIGHT_ACC ? gd->base : NULL;
    }
    ref->sp = p->scale_inv, ref->sq = q->scale_inv;
}

// Runs v on op into the poisoned output (the accumulating dweight starting from base) and
// downloads it into host (GUARD + R·Cc + GUARD bf16).
static void run_variant(GemmVariant v, const GemmShape* s, const GemmData* gd, const Fp8Operand op[2],
                        const GemmRef* ref, uint16_t* host, const char* name) {
    const size_t n = (size_t)ref->R * ref->Cc;
    CUDA_CHECK(cudaMemsetAsync(gd->d_out, 0xFF, (gd->out_elems + 2 * GUARD) * 2, g_stream));
    __nv_bfloat16* out = (__nv_bfloat16*)(gd->d_out + GUARD);
    if (v == V_DWEIGHT_ACC)
        CUDA_CHECK(cudaMemcpyAsync(out, gd->d_base, n * 2, cudaMemcpyDeviceToDevice, g_stream));
    if (v <= V_FWD_BIAS)
        matmul_fp8_forward(&g_ctx, out, op[0], op[1], v == V_FWD_BIAS ? gd->d_bias : NULL, s->N, s->IC, s->OC,
                           variant_fast(v));
    else if (v <= V_DINP_E4M3)
        matmul_fp8_backward_dinp(&g_ctx, out, op[0], op[1], s->N, s->IC, s->OC);
    else
        matmul_fp8_backward_dweight(&g_ctx, out, op[0], op[1], s->N, s->IC, s->OC, v == V_DWEIGHT_ACC);
    download(host, gd->d_out, (n + 2 * GUARD) * 2, name);
}

// p: shape, variant.
static void gemm_case(const Case* c) {
    const GemmShape* s = &GEMM_SHAPES[c->p[0]];
    const GemmVariant v = (GemmVariant)c->p[1];
    GemmData* gd = gemm_data(c->p[0]);
    TestRng rng = case_rng(c);
    Fp8Operand op[2];
    GemmRef ref;
    variant_setup(v, s, gd, op, &ref);
    uint16_t* out = (uint16_t*)host_alloc((gd->out_elems + 2 * GUARD) * 2);
    run_variant(v, s, gd, op, &ref, out, c->name);
    const GemmCheck k = check_gemm(out, &ref, &rng);
    printf("  %s: ||y - ref||/||ref|| %.2e, worst element %.2f of its bound (%ld checked)\n", c->name, k.rel, k.worst,
           k.checked);
    char bad[512] = "";
    describe_check(&k, ref.fast_accum, bad, sizeof(bad));
    free(out);
    test_report(c->name, gemm_check_ok(&k, ref.fast_accum), "%s", bad);
}

// The index of the largest |value| among n FP8 bytes.
static size_t largest_byte(const uint8_t* b, size_t n, Fp8Format f) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (fabs(host_fp8_decode(b[i], f)) > fabs(host_fp8_decode(b[best], f))) best = i;
    return best;
}

// The size in bytes of operand `which` of variant v.
static size_t operand_bytes(GemmVariant v, int which, const GemmShape* s) {
    if (v <= V_FWD_BIAS) return which ? (size_t)s->OC * s->IC : (size_t)s->N * s->IC;    // inp, weight
    if (v <= V_DINP_E4M3) return which ? (size_t)s->IC * s->OC : (size_t)s->N * s->OC;  // dout, weight_t
    return which ? (size_t)s->IC * s->N : (size_t)s->OC * s->N;                          // dout_t, inp_t
}

// p: variant, which operand (0, 1), plant (0: its inverse scale doubled, 1: the sign of its largest
// byte flipped). The true output must pass and the planted one fail.
static void planted_case(const Case* c) {
    const GemmShape* s = &GEMM_SHAPES[PLANT_SHAPE];
    const GemmVariant v = (GemmVariant)c->p[0];
    const int which = c->p[1], plant = c->p[2];
    GemmData* gd = gemm_data(PLANT_SHAPE);
    TestRng rng = case_rng(c);
    Fp8Operand op[2];
    GemmRef ref;
    variant_setup(v, s, gd, op, &ref);
    uint16_t* out = (uint16_t*)host_alloc((gd->out_elems + 2 * GUARD) * 2);
    run_variant(v, s, gd, op, &ref, out, c->name);
    const GemmCheck truth = check_gemm(out, &ref, &rng);
    const size_t bytes = operand_bytes(v, which, s);
    float* d_scale = (float*)device_alloc(sizeof(float));
    uint8_t* d_bytes = (uint8_t*)device_alloc(bytes);
    uint8_t* h = (uint8_t*)host_alloc(bytes);
    CUDA_CHECK(cudaMemcpy(h, op[which].data, bytes, cudaMemcpyDeviceToHost));
    if (plant == 0) {
        float twice = 0.0f;
        CUDA_CHECK(cudaMemcpy(&twice, op[which].scale_inv, sizeof(float), cudaMemcpyDeviceToHost));
        twice *= 2.0f;
        upload(d_scale, &twice, sizeof(float));
        op[which].scale_inv = d_scale;
    } else {
        h[largest_byte(h, bytes, op[which].format)] ^= 0x80;
        upload(d_bytes, h, bytes);
        op[which].data = d_bytes;
    }
    run_variant(v, s, gd, op, &ref, out, c->name);
    const GemmCheck planted = check_gemm(out, &ref, &rng);
    printf("  %s: true output %.2e (worst %.2f of bound), planted %.2e (worst %.2f, %ld elements over)\n", c->name,
           truth.rel, truth.worst, planted.rel, planted.worst, planted.violations);
    char bad[512] = "";
    if (!gemm_check_ok(&truth, ref.fast_accum)) describe_check(&truth, ref.fast_accum, bad, sizeof(bad));
    if (gemm_check_ok(&planted, ref.fast_accum)) add_problem(bad, sizeof(bad), "the planted error passed the checks");
    free(out), free(h);
    CUDA_CHECK(cudaFree(d_scale)), CUDA_CHECK(cudaFree(d_bytes));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// Forward (fast accumulation) and dweight run twice give the same bits.
static void rerun_case(const Case* c) {
    const GemmShape* s = &GEMM_SHAPES[RERUN_SHAPE];
    GemmData* gd = gemm_data(RERUN_SHAPE);
    const size_t bytes = (gd->out_elems + 2 * GUARD) * 2;
    uint16_t *first = (uint16_t*)host_alloc(bytes), *second = (uint16_t*)host_alloc(bytes);
    char bad[256] = "";
    const GemmVariant vs[2] = {V_FWD_FAST, V_DWEIGHT};
    for (int i = 0; i < 2; i++) {
        Fp8Operand op[2];
        GemmRef ref;
        variant_setup(vs[i], s, gd, op, &ref);
        run_variant(vs[i], s, gd, op, &ref, first, c->name);
        run_variant(vs[i], s, gd, op, &ref, second, c->name);
        if (memcmp(first, second, bytes) != 0) add_problem(bad, sizeof(bad), "%s differs between runs", VARIANT_NAMES[vs[i]]);
    }
    free(first), free(second);
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// A layer's tensor in the pipeline: bf16 on the device, its state, its FP8 copies (downloaded).
typedef struct {
    int rows, cols;
    Fp8Format format;
    uint16_t* h;                  // bf16 (rows, cols)
    __nv_bfloat16* d;
    uint8_t *d8, *d8t;            // (rows, cols), (cols, rows)
    uint8_t *h8, *h8t;
    float *dec, *dec_t;
    Fp8ScaleState st;
} PipeTensor;

static PipeTensor pipe_tensor(int rows, int cols, Fp8Format format) {
    PipeTensor t;
    memset(&t, 0, sizeof(t));
    t.rows = rows, t.cols = cols, t.format = format;
    return t;
}

// Makes t on the device, scales it (current scaling) and cast-transposes it with that scale.
static void pipe_cast(PipeTensor* t, Fp8ScaleState* d_st, TestRng* rng, double sigma) {
    const size_t n = (size_t)t->rows * t->cols;
    t->h = random_bf16(rng, n, sigma);
    t->d = (__nv_bfloat16*)device_alloc(n * 2);
    t->d8 = (uint8_t*)poisoned(n), t->d8t = (uint8_t*)poisoned(n);
    upload(t->d, t->h, n * 2);
    fp8_scale_states_init(d_st, &t->format, 1, g_stream);
    fp8_current_scale(d_st, t->d, t->rows, t->cols, 0, 0, g_stream);
    fp8_cast_transpose(t->d8, t->d8t, t->d, t->rows, t->cols, t->format, &d_st->scale, NULL, g_stream);
}

// Downloads t's copies and state; checks the bytes against the host's cast; decodes them.
static void pipe_fetch(PipeTensor* t, const Fp8ScaleState* d_st, const char* name, char* bad, size_t bad_size) {
    const size_t n = (size_t)t->rows * t->cols;
    t->h8 = (uint8_t*)host_alloc(n), t->h8t = (uint8_t*)host_alloc(n);
    t->dec = (float*)host_alloc(n * sizeof(float)), t->dec_t = (float*)host_alloc(n * sizeof(float));
    download(&t->st, d_st, sizeof(t->st), name);
    download(t->h8, t->d8, n, name);
    download(t->h8t, t->d8t, n, name);
    size_t wrong = 0;
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++) {
            const size_t i = (size_t)r * t->cols + c, j = (size_t)c * t->rows + r;
            const uint8_t want = host_cast(t->h[i], t->st.scale, t->format);
            wrong += !fp8_same(t->h8[i], want, t->format) + !fp8_same(t->h8t[j], want, t->format);
            t->dec[i] = (float)host_fp8_decode(t->h8[i], t->format);
            t->dec_t[j] = (float)host_fp8_decode(t->h8t[j], t->format);
        }
    if (wrong) add_problem(bad, bad_size, "%zu cast bytes wrong in a %dx%d tensor", wrong, t->rows, t->cols);
}

static void pipe_free(PipeTensor* t) {
    free(t->h), free(t->h8), free(t->h8t), free(t->dec), free(t->dec_t);
    CUDA_CHECK(cudaFree(t->d)), CUDA_CHECK(cudaFree(t->d8)), CUDA_CHECK(cudaFree(t->d8t));
}

// Checks one of the pipeline's outputs (R, Cc) = P · Qᵀ against the reference.
static void pipe_check(const char* what, const uint16_t* d_out, int R, int Cc, int K, const PipeTensor* p,
                       const float* P, const PipeTensor* q, const float* Q, int fast, TestRng* rng, const char* name,
                       char* bad, size_t bad_size) {
    const size_t n = (size_t)R * Cc;
    uint16_t* out = (uint16_t*)host_alloc((n + 2 * GUARD) * 2);
    download(out, d_out, (n + 2 * GUARD) * 2, name);
    const GemmRef ref = {R, Cc, K, P, Q, p->st.scale_inv, q->st.scale_inv, NULL, NULL, fast};
    const GemmCheck k = check_gemm(out, &ref, rng);
    printf("  %s %s: ||y - ref||/||ref|| %.2e, worst element %.2f of its bound\n", name, what, k.rel, k.worst);
    if (!gemm_check_ok(&k, fast)) {
        add_problem(bad, bad_size, "%s:", what);
        describe_check(&k, fast, bad, bad_size);
    }
    free(out);
}

// A linear layer's FP8 step as the trainer will run it: x (N, IC), w (OC, IC), dy (N, OC) in bf16,
// each scaled and cast-transposed on the device, then the three GEMMs from those bytes.
static void pipeline_case(const Case* c) {
    char bad[1024] = "";
    TestRng rng = case_rng(c);
    const int N = 512, IC = 1024, OC = 3072;
    PipeTensor x = pipe_tensor(N, IC, FP8_E4M3), w = pipe_tensor(OC, IC, FP8_E4M3), dy = pipe_tensor(N, OC, FP8_E5M2);
    Fp8ScaleState* d_st = (Fp8ScaleState*)device_alloc(3 * sizeof(Fp8ScaleState));
    pipe_cast(&x, d_st, &rng, 1.0), pipe_cast(&w, d_st + 1, &rng, 0.02), pipe_cast(&dy, d_st + 2, &rng, 1e-3);
    const size_t outs[3] = {(size_t)N * OC, (size_t)N * IC, (size_t)OC * IC};
    uint16_t* d_out[3];
    for (int i = 0; i < 3; i++) d_out[i] = (uint16_t*)poisoned((outs[i] + 2 * GUARD) * 2);
    const Fp8Operand x8 = fp8_operand(x.d8, x.format, &d_st[0].scale_inv), x8t = fp8_operand(x.d8t, x.format, &d_st[0].scale_inv);
    const Fp8Operand w8 = fp8_operand(w.d8, w.format, &d_st[1].scale_inv), w8t = fp8_operand(w.d8t, w.format, &d_st[1].scale_inv);
    const Fp8Operand dy8 = fp8_operand(dy.d8, dy.format, &d_st[2].scale_inv), dy8t = fp8_operand(dy.d8t, dy.format, &d_st[2].scale_inv);
    matmul_fp8_forward(&g_ctx, (__nv_bfloat16*)(d_out[0] + GUARD), x8, w8, NULL, N, IC, OC, 1);
    matmul_fp8_backward_dinp(&g_ctx, (__nv_bfloat16*)(d_out[1] + GUARD), dy8, w8t, N, IC, OC);
    matmul_fp8_backward_dweight(&g_ctx, (__nv_bfloat16*)(d_out[2] + GUARD), dy8t, x8t, N, IC, OC, 0);
    pipe_fetch(&x, d_st, c->name, bad, sizeof(bad));
    pipe_fetch(&w, d_st + 1, c->name, bad, sizeof(bad));
    pipe_fetch(&dy, d_st + 2, c->name, bad, sizeof(bad));
    pipe_check("forward", d_out[0], N, OC, IC, &x, x.dec, &w, w.dec, 1, &rng, c->name, bad, sizeof(bad));
    pipe_check("dinp", d_out[1], N, IC, OC, &dy, dy.dec, &w, w.dec_t, 0, &rng, c->name, bad, sizeof(bad));
    pipe_check("dweight", d_out[2], OC, IC, N, &dy, dy.dec_t, &x, x.dec_t, 0, &rng, c->name, bad, sizeof(bad));
    pipe_free(&x), pipe_free(&w), pipe_free(&dy);
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaFree(d_out[i]));
    CUDA_CHECK(cudaFree(d_st));
    test_report(c->name, bad[0] == 0, "%s", bad);
}

// ---- main ---------------------------------------------------------------------------------------------

static const int CAST_SHAPES[][2] = {{1, 16},    {37, 48},     {64, 128},    {65, 144},
                                     {100, 2064}, {1000, 2048}, {2049, 2560}, {4096, 8192}};

static void make_cast_cases(void) {
    for (int f = 0; f < 2; f++)
        for (int kind = 0; kind < 2; kind++)
            add_case(NEED_GPU, cast_exhaustive_case, f, kind, 0, 0, "%s_all_bf16_%s", CAST_KIND_NAMES[kind],
                     fp8_format_name((Fp8Format)f));
    for (size_t i = 0; i < COUNT(CAST_SHAPES); i++) {
        const int N = CAST_SHAPES[i][0], C = CAST_SHAPES[i][1];
        add_case(NEED_GPU, cast_random_case, N, C, FP8_E4M3, CAST_PLAIN, "cast_e4m3_%dx%d", N, C);
        add_case(NEED_GPU, cast_random_case, N, C, FP8_E4M3, CAST_BOTH, "cast_transpose_e4m3_%dx%d", N, C);
        add_case(NEED_GPU, cast_random_case, N, C, FP8_E5M2, CAST_BOTH, "cast_transpose_e5m2_%dx%d", N, C);
    }
    add_case(NEED_GPU, cast_random_case, 37, 48, FP8_E4M3, CAST_T_ONLY, "cast_transpose_t_only_e4m3_37x48");
    add_case(NEED_GPU, cast_random_case, 1000, 2048, FP8_E5M2, CAST_ROWS_ONLY, "cast_transpose_rows_only_e5m2_1000x2048");
    const int amax_shapes[][2] = {{1, 16}, {1000, 2064}, {4096, 8192}};
    for (size_t i = 0; i < COUNT(amax_shapes); i++)
        add_case(NEED_GPU, amax_case, amax_shapes[i][0], amax_shapes[i][1], 0, 0, "amax_accumulates_%dx%d",
                 amax_shapes[i][0], amax_shapes[i][1]);
}

static void add_cast_op_case(int N, int C, Fp8Format f, Fp8CastOp op, int what, OpScale sk) {
    const char* outputs = what == 0 ? "_amax_only"
                          : what == W_COLSUM ? "_amax_colsum_only"
                          : (what & (W_OUT | W_OUT_T)) == W_OUT ? "_rows_only"
                          : (what & (W_OUT | W_OUT_T)) == W_OUT_T ? "_t_only" : "";
    Case* c = sk == SCALE_NONE
                  ? add_case(NEED_GPU, cast_op_case, N, C, f, op, "cast_op_%s%s_%dx%d", op_name(op), outputs, N, C)
                  : add_case(NEED_GPU, cast_op_case, N, C, f, op, "cast_op_%s_%s%s_%dx%d%s", op_name(op),
                             fp8_format_name(f), outputs, N, C, OP_SCALE_NAMES[sk]);
    c->p[4] = what, c->p[5] = sk;
}

// fp8_cast_transpose_op: GELU (E4M3, as the fc projection's input) and GELU' (E5M2, as the fc
// layer's gradient), each also in the other format, and COPY; N not a multiple of the 64-row tile, C
// not of the 128-channel tile.
static void make_cast_op_cases(void) {
    const struct { int N, C; Fp8Format f; Fp8CastOp op; int what; OpScale sk; } cases[] = {
        {1000, 2064, FP8_E4M3, FP8_OP_GELU, W_ALL, SCALE_SATURATE},
        {77, 144, FP8_E4M3, FP8_OP_GELU, W_ALL, SCALE_SATURATE},
        {77, 144, FP8_E5M2, FP8_OP_GELU, W_ALL, SCALE_SATURATE},
        {1000, 2064, FP8_E5M2, FP8_OP_DGELU, W_ALL, SCALE_SATURATE},
        {77, 144, FP8_E5M2, FP8_OP_DGELU, W_ALL, SCALE_SATURATE},
        {77, 144, FP8_E4M3, FP8_OP_DGELU, W_ALL, SCALE_SATURATE},
        {1000, 2064, FP8_E4M3, FP8_OP_COPY, W_ALL, SCALE_SATURATE},
        {77, 144, FP8_E5M2, FP8_OP_COPY, W_ALL, SCALE_SATURATE},
        {65, 16, FP8_E4M3, FP8_OP_COPY, W_ALL, SCALE_SATURATE},
        {1000, 2064, FP8_E4M3, FP8_OP_COPY, W_ALL, SCALE_4X},
        {1000, 2064, FP8_E5M2, FP8_OP_DGELU, W_ALL, SCALE_4X},
        {1000, 2064, FP8_E4M3, FP8_OP_COPY, W_ALL, SCALE_HALF},
        {77, 144, FP8_E4M3, FP8_OP_GELU, W_ALL, SCALE_HALF},
        {77, 144, FP8_E5M2, FP8_OP_DGELU, W_ALL, SCALE_HALF},
        {77, 144, FP8_E5M2, FP8_OP_DGELU, W_OUT | W_COLSUM | W_SATURATED, SCALE_SATURATE},
        {77, 144, FP8_E4M3, FP8_OP_GELU, W_OUT_T | W_SATURATED, SCALE_SATURATE},
        {1000, 2064, FP8_E4M3, FP8_OP_COPY, 0, SCALE_NONE},
        {1000, 2064, FP8_E4M3, FP8_OP_GELU, 0, SCALE_NONE},
        {1000, 2064, FP8_E5M2, FP8_OP_DGELU, W_COLSUM, SCALE_NONE},
    };
    for (size_t i = 0; i < COUNT(cases); i++)
        add_cast_op_case(cases[i].N, cases[i].C, cases[i].f, cases[i].op, cases[i].what, cases[i].sk);
}

static void make_cases(void) {
    add_case(NEED_CPU, host_known_values_case, 0, 0, 0, 0, "host_fp8_reference_known_values_and_every_code");
    add_case(NEED_CPU, host_vs_cuda_fp8_case, 0, 0, 0, 0, "host_fp8_reference_agrees_with_cuda_fp8_h");
    add_case(NEED_CPU, size_checks_case, 0, 0, 0, 0, "size_checks_need_multiples_of_16");
    add_case(NEED_CPU, scale_formula_case, 0, 0, 0, 0, "scale_for_amax_formula");
    add_case(NEED_CPU, planted_cast_op_case, FP8_E4M3, FP8_OP_COPY, 0, 0, "planted_cast_op_checks_reject_copy_e4m3");
    add_case(NEED_CPU, planted_cast_op_case, FP8_E4M3, FP8_OP_GELU, 0, 0, "planted_cast_op_checks_reject_gelu_e4m3");
    add_case(NEED_CPU, planted_cast_op_case, FP8_E5M2, FP8_OP_DGELU, 0, 0, "planted_cast_op_checks_reject_dgelu_e5m2");
    make_cast_cases();
    make_cast_op_cases();
    add_case(NEED_GPU, delayed_update_case, 0, 0, 0, 0, "delayed_update_40_steps");
    add_case(NEED_GPU, delayed_update_case, 1, 1, 0, 0, "delayed_update_40_steps_margin1_pow2");
    add_case(NEED_GPU, current_scale_case, FP8_E4M3, 0, 0, 0, "current_scaling_e4m3");
    add_case(NEED_GPU, current_scale_case, FP8_E5M2, 1, 1, 0, "current_scaling_e5m2_margin1_pow2");
    add_case(NEED_GPU, current_scale_preset_case, 0, 0, 0, 0, "current_scaling_amax_current_preset_amax_larger");
    add_case(NEED_GPU, current_scale_preset_case, 1, 0, 0, 0, "current_scaling_amax_current_preset_amax_smaller");
    add_case(NEED_GPU, current_scale_preset_case, 2, 0, 0, 0, "current_scaling_amax_current_preset_amax_nan");
    add_case(NEED_GPU, delayed_loop_case, 0, 0, 0, 0, "delayed_scaling_cast_update_cast");
    for (int s = 0; s < (int)COUNT(GEMM_SHAPES); s++)
        for (int v = 0; v < NUM_VARIANTS; v++)
            add_case(NEED_FP8_GEMM, gemm_case, s, v, 0, 0, "gemm_%s_%dx%dx%d", VARIANT_NAMES[v], GEMM_SHAPES[s].N,
                     GEMM_SHAPES[s].IC, GEMM_SHAPES[s].OC);
    add_case(NEED_FP8_GEMM, planted_case, V_FWD_FAST, 1, 0, 0, "planted_weight_scale_x2_rejected_forward_fast_accum");
    add_case(NEED_FP8_GEMM, planted_case, V_FWD_FAST, 1, 1, 0, "planted_weight_sign_flip_rejected_forward_fast_accum");
    add_case(NEED_FP8_GEMM, planted_case, V_DWEIGHT, 0, 0, 0, "planted_dout_scale_x2_rejected_dweight");
    add_case(NEED_FP8_GEMM, planted_case, V_DINP_E5M2, 1, 1, 0, "planted_weight_t_sign_flip_rejected_dinp");
    add_case(NEED_FP8_GEMM, rerun_case, 0, 0, 0, 0, "gemm_rerun_same_bits");
    add_case(NEED_FP8_GEMM, pipeline_case, 0, 0, 0, 0, "linear_layer_pipeline_512x1024x3072");
}

int main(void) {
    test_begin();
    make_cases();
    test_plan(g_num_cases);
    g_gd.shape = -1;
    g_seed = pick_and_print_seed();
    GpuInfo gpu = gpu_info(0);
    const char* no_gpu = gpu_skip_reason(&gpu, "the FP8 casts");
    const char* no_fp8 = no_gpu;
    char why[160];
    if (!no_gpu && (gpu.major * 10 + gpu.minor) < 89) {
        snprintf(why, sizeof(why), "FP8 tensor cores need compute capability 8.9 or newer (this GPU: %d.%d)", gpu.major,
                 gpu.minor);
        no_fp8 = why;
    }
    if (!no_gpu) {
        printf("device: %s, sm_%d%d, %d SMs; cuBLASLt version %zu\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms,
               cublasLtGetVersion());
        CUDA_CHECK(cudaStreamCreate(&g_stream));  // blocking: ordered after legacy-stream copies
        matmul_context_create(&g_ctx, g_stream);  // tune 0: the heuristic's first algorithm
        atexit(report_exit_during_case);
    }
    for (int i = 0; i < g_num_cases; i++) {
        const Case* c = &g_cases[i];
        const char* skip = c->need == NEED_GPU ? no_gpu : c->need == NEED_FP8_GEMM ? no_fp8 : NULL;
        if (skip) {
            test_skip(c->name, skip);
            continue;
        }
        snprintf(g_running_case, sizeof(g_running_case), "%.127s", c->name);
        c->run(c);
        g_running_case[0] = 0;
    }
    if (!no_gpu) {
        gemm_data_free(&g_gd);
        matmul_context_destroy(&g_ctx);
        CUDA_CHECK(cudaStreamDestroy(g_stream));
    }
    return test_end();
}
