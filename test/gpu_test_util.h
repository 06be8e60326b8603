// gpu_test_util.h: the helpers every GPU test program shares (built by nvcc as C++): the seed of
// the random inputs, whether there is a GPU to test on, host and device allocation, poison checks,
// and naming the running case when a failed CUDA call ends the program.
#ifndef GPU_TEST_UTIL_H
#define GPU_TEST_UTIL_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "layers/cuda_common.h"
#include "test/test_harness.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

// The seed of a run's random inputs: $TEST_SEED when set (to repeat a run), else fresh from the
// clock and the process id, so every run draws new inputs. Tests print it (print_seed).
static inline uint64_t pick_seed(void) {
    const char* env = getenv("TEST_SEED");
    if (env && *env) return strtoull(env, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
}

static inline uint64_t pick_and_print_seed(void) {
    const uint64_t seed = pick_seed();
    printf("seed %llu (rerun with TEST_SEED=%llu to repeat these inputs)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

// Why the GPU cases cannot run here (NULL: they can): no GPU, or one older than sm_80 (bf16).
// `what` names what needs sm_80, e.g. "the attention kernels".
static inline const char* gpu_skip_reason(const GpuInfo* gpu, const char* what) {
    static char why[256];
    if (!gpu->found) return "no CUDA GPU found";
    if (gpu->major >= 8) return NULL;
    snprintf(why, sizeof(why), "%s need compute capability 8.0 or newer (bf16)", what);
    return why;
}

// The case running now, so that an exit from inside the code under test (a failed CUDA call) still
// names it: set it before a case, clear it after, and atexit(report_exit_during_case).
static char g_running_case[160] __attribute__((unused));

static inline void report_exit_during_case(void) {
    if (g_running_case[0])
        printf("FAIL %s: the program exited while running this case; see the error above\n", g_running_case);
}

// Waits for `stream` (NULL: the whole device). A failed kernel leaves the CUDA context unusable, so
// the case fails and the program ends there (later cases could not run).
static inline void sync_or_die(cudaStream_t stream, const char* name, const char* what) {
    cudaError_t err = stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize();
    if (err == cudaSuccess) return;
    g_running_case[0] = 0;
    test_fail(name, "the %s failed on the GPU: %s (%s); rerun under compute-sanitizer to find the bad access", what,
              cudaGetErrorString(err), cudaGetErrorName(err));
    exit(test_end());
}

static inline void* host_alloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

// cudaMalloc of `bytes`; NULL for 0 bytes.
static inline void* device_alloc(size_t bytes) {
    void* p = NULL;
    if (bytes) CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
}

static inline int bf16_is_finite(uint16_t h) { return (h & 0x7F80u) != 0x7F80u; }

// Bytes in [p, p + nbytes) that are no longer the poison 0xFF.
static inline size_t changed_poison_bytes(const void* p, size_t nbytes) {
    const unsigned char* c = (const unsigned char*)p;
    size_t changed = 0;
    for (size_t i = 0; i < nbytes; i++) changed += c[i] != 0xFFu;
    return changed;
}

// The planted-loss cases of a model test (CPU only): a model test's loss check must reject the loss of
// all-zero logits (ln V, what an unwritten or zeroed logits buffer gives) and losses off by twice its
// bound, both ways. rejects(problem, loss) runs the test's own check: 1 when it rejects loss. Reports
// PLANTED_LOSS_CASES cases, named <prefix>_planted_loss_...
#define PLANTED_LOSS_CASES 2
typedef int (*LossCheck)(const void* problem, double loss);

static inline void planted_loss_cases(const char* prefix, const void* problem, LossCheck rejects, double ref_loss,
                                      double tol, int vocab_size) {
    const char* what[PLANTED_LOSS_CASES] = {"of_all_zero_logits", "off_by_twice_the_bound"};
    const double planted[PLANTED_LOSS_CASES][2] = {{log((double)vocab_size)}, {ref_loss + 2 * tol, ref_loss - 2 * tol}};
    const int num_planted[PLANTED_LOSS_CASES] = {1, 2};
    for (int p = 0; p < PLANTED_LOSS_CASES; p++) {
        char name[160], missed[512] = "";
        snprintf(name, sizeof(name), "%s_planted_loss_%s_rejected", prefix, what[p]);
        if (!isfinite(ref_loss)) add_problem(missed, sizeof(missed), "the CPU reference failed (out of memory?)");
        for (int k = 0; k < num_planted[p] && !missed[0]; k++) {
            const int rejected = rejects(problem, planted[p][k]);
            printf("  %s: %.6f against the reference's %.6f: %s\n", name, planted[p][k], ref_loss,
                   rejected ? "rejected" : "PASSES");
            if (!rejected)
                add_problem(missed, sizeof(missed), "loss %.6f passed (reference %.6f, bound %.0e nats)", planted[p][k],
                            ref_loss, tol);
        }
        test_report(name, !missed[0], "%s", missed);
    }
}

#endif  // GPU_TEST_UTIL_H
