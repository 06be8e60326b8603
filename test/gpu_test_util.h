// gpu_test_util.h: small helpers every GPU test program shares (built by nvcc as C++).
#ifndef GPU_TEST_UTIL_H
#define GPU_TEST_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// The seed of a run's random inputs: $TEST_SEED when set (to repeat a run), else fresh from the
// clock and the process id, so every run draws new inputs. Tests print it.
static inline uint64_t pick_seed(void) {
    const char* env = getenv("TEST_SEED");
    if (env && *env) return strtoull(env, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
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

#endif  // GPU_TEST_UTIL_H
