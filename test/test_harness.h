// test_harness.h: the few helpers every C/CUDA test binary shares.
//
// Protocol (read by test/run_tests.sh): each test case prints exactly one line
//   PASS <name>            the case ran and met its bound
//   FAIL <name>: <why>     the case ran and did not
//   SKIP <name>: <why>     the case could not run here (e.g. no GPU)
// framed by two lines the runner also checks:
//   PLAN <n>               first: how many cases this run will report, for its arguments
//                          (test_plan, before any case; computed from the same lists the cases
//                          are made from, so a case that stops being reported is noticed)
//   END <p> passed, <f> failed, <s> skipped    last (test_end): the program reached its end
// and the binary exits non-zero when any case failed. Output is line-buffered
// so a crash still leaves every earlier line behind.
#ifndef TEST_HARNESS_H
#define TEST_HARNESS_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_test_failures = 0, g_test_passes = 0, g_test_skips = 0;

static inline void test_begin(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

// States how many cases this run reports (the PLAN line); call once, before the first case.
static inline void test_plan(int num_cases) { printf("PLAN %d\n", num_cases); }

static inline void test_pass(const char* name) {
    printf("PASS %s\n", name);
    g_test_passes++;
}

static inline void test_vfail(const char* name, const char* fmt, va_list ap) {
    printf("FAIL %s: ", name);
    vprintf(fmt, ap);
    printf("\n");
    g_test_failures++;
}

static inline void test_fail(const char* name, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    test_vfail(name, fmt, ap);
    va_end(ap);
}

static inline void test_skip(const char* name, const char* why) {
    printf("SKIP %s: %s\n", name, why);
    g_test_skips++;
}

// Reports a case as passed when ok, failed with the formatted reason otherwise.
static inline void test_report(const char* name, int ok, const char* fmt, ...) {
    if (ok) { test_pass(name); return; }
    va_list ap;
    va_start(ap, fmt);
    test_vfail(name, fmt, ap);
    va_end(ap);
}

// Prints the END line and returns the exit status: 1 when any case failed.
static inline int test_end(void) {
    printf("END %d passed, %d failed, %d skipped\n", g_test_passes, g_test_failures, g_test_skips);
    return g_test_failures == 0 ? 0 : 1;
}

// Deterministic random numbers (splitmix64), so a failure can be replayed with the same seed.
typedef struct { uint64_t state; } TestRng;

static inline uint64_t test_rng_next(TestRng* rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [lo, hi).
static inline double test_rng_uniform(TestRng* rng, double lo, double hi) {
    return lo + (hi - lo) * (double)(test_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller).
static inline double test_rng_normal(TestRng* rng) {
    double u1 = test_rng_uniform(rng, 1e-300, 1.0), u2 = test_rng_uniform(rng, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline void test_fill_normal(TestRng* rng, double* x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rng_normal(rng);
}

// ||a - b|| / ||b|| over n elements; NaN anywhere gives NaN, which fails every `<=` bound.
static inline double test_rel_error(const double* a, const double* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static inline double* test_alloc(size_t n) {
    double* p = (double*)calloc(n ? n : 1, sizeof(double));
    if (!p) { fprintf(stderr, "test: out of host memory (%zu doubles)\n", n); exit(2); }
    return p;
}

// bf16 on the host, bit-exact with CUDA's __float2bfloat16 (round to nearest, ties to even), so
// tests can build bf16 inputs and references without CUDA's headers.
static inline uint16_t test_float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) return (uint16_t)((bits >> 16) | 0x0040u);  // quiet NaN
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float test_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

// Appends "; <message>" (or the first message) to a case's list of problems.
static inline void add_problem(char* buf, size_t size, const char* fmt, ...) {
    size_t used = strlen(buf);
    if (used + 3 >= size) return;
    if (used) {
        strcat(buf, "; ");
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, size - used, fmt, ap);
    va_end(ap);
}

#endif  // TEST_HARNESS_H
