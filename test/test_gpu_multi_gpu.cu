// test_gpu_multi_gpu.cu: layers/multi_gpu/multi_gpu.cuh on ONE GPU, through a real NCCL communicator of one
// rank (what a single-GPU machine allows; the two-GPU checks are scripts/run_multigpu_on_gpu.sh):
//   - the non-blocking communicator comes up (ncclCommInitRankConfig, blocking = 0, ncclInProgress
//     waited for by the watchdog) and multi_gpu_sum goes through the watched wait;
//   - multi_gpu_norm_and_loss: the global norm of random bf16 gradients against an fp64 sum on the
//     host, the loss, and the stop flag riding in the same all-reduce (0 and 1); outputs poisoned;
//   - the watchdog fires: in a child process, a kernel holds the all-reduce back past --nccl-timeout
//     3 s: the child prints the one line (step, collective, suspect), aborts the communicator and
//     exits 1 (the kernel is let go 5 s in, as NCCL's abort ends its own stuck kernels).
// Every case is skipped without a GPU, and in a build without NCCL.
#include <cuda_bf16.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layers/multi_gpu/multi_gpu.cuh"
#include "test/test_harness.h"

static const char* CASES[] = {"multi_gpu_watchdog_fires_on_a_collective_that_never_completes",
                              "multi_gpu_nonblocking_communicator_and_watched_sum",
                              "multi_gpu_norm_loss_and_stop_flag_in_one_all_reduce"};
#define NUM_CASES ((int)(sizeof(CASES) / sizeof(CASES[0])))

#if MULTI_GPU_AVAILABLE
// Holds the stream until *flag is set or `ns` nanoseconds passed (a stand-in for a peer that never
// arrives; the cap ends it even if the process's abort path failed).
static __global__ void hold_stream_kernel(const volatile int* flag, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (!*flag && now - start < ns);
}

static LaunchInfo one_rank(void) {
    LaunchInfo li;
    memset(&li, 0, sizeof(li));
    li.rank = 0, li.world = 1, li.local_rank = 0, li.source = "test";
    snprintf(li.master_addr, sizeof(li.master_addr), "127.0.0.1");
    li.master_port = 29500;
    return li;
}

// The kernel standing in for a stuck peer is let go 5 s in (after the 3 s deadline), as ncclCommAbort
// ends NCCL's own stuck kernels: else the abort and the exit wait for it (the cap, 20 s; seen on an
// H100). Had the watchdog not fired by then, the all-reduce would complete and the child exit 0.
static void* release_hold(void* flag) {
    struct timespec ts = {5, 0};
    nanosleep(&ts, NULL);
    *(volatile int*)flag = 1;
    return NULL;
}

// The child: 77 = no GPU; otherwise it should die in multi_gpu_watch with exit 1.
static void watchdog_child(int err_fd) {
    dup2(err_fd, STDERR_FILENO);
    alarm(60);
    if (!gpu_info(0).found) _exit(77);
    CUDA_CHECK(cudaSetDevice(0));
    static MultiGpu mg;
    const LaunchInfo li = one_rank();
    multi_gpu_init(&mg, &li, 0, 0, 1, 10.0, NULL, 3.0);
    multi_gpu_set_step(&mg, 17);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int* flag;
    CUDA_CHECK(cudaMallocHost(&flag, sizeof(int)));
    *flag = 0;
    hold_stream_kernel<<<1, 1, 0, stream>>>(flag, 20ull * 1000000000ull);
    pthread_t releaser;
    pthread_create(&releaser, NULL, release_hold, (void*)flag);
    multi_gpu_sum(&mg, 1.0, stream, "test all-reduce");  // must not return
    _exit(0);
}

static void test_watchdog_fires(void) {
    int fds[2];
    if (pipe(fds) != 0) exit(1);
    const double t0 = launcher_now();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        watchdog_child(fds[1]);
    }
    close(fds[1]);
    char err[4096] = "";
    size_t got = 0;
    ssize_t k;
    while (got + 1 < sizeof(err) && (k = read(fds[0], err + got, sizeof(err) - 1 - got)) > 0) got += (size_t)k;
    err[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const double secs = launcher_now() - t0;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 77) {
        test_skip(CASES[0], "no CUDA GPU found");
        return;
    }
    test_report(CASES[0], code == 1 && secs >= 3.0 && secs < 15.0 &&
                    strstr(err, "error: NCCL watchdog: rank 0 of 1, step 17, test all-reduce: did not complete within "
                                "3 s (--nccl-timeout); suspected rank: unknown (every rank arrived"),
                "exit %d after %.1f s; stderr: %s", code, secs, err);
}

static void test_in_process(void) {
    if (!gpu_info(0).found) {
        test_skip(CASES[1], "no CUDA GPU found");
        test_skip(CASES[2], "no CUDA GPU found");
        return;
    }
    CUDA_CHECK(cudaSetDevice(0));
    static MultiGpu mg;
    const LaunchInfo li = one_rank();
    multi_gpu_init(&mg, &li, 0, 0, 1, 10.0, NULL, 30.0);
    ncclResult_t state = ncclInternalError;
    NCCL_CHECK(ncclCommGetAsyncError(mg.comm, &state));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    const double sum = multi_gpu_sum(&mg, 2.5, stream, "test sum");
    test_report(CASES[1], state == ncclSuccess && sum == 2.5 && mg.wd.seq == 2,
                "communicator state %d, sum %g (want 2.5), watched collectives %lld (want 2: set-up, sum)", (int)state,
                sum, mg.wd.seq);

    // A stand-in model: multi_gpu_norm_and_loss reads only grads and the shard.
    const size_t n = 3 * 1024 + 1024;  // a padded parameter count
    static GPTModel model;
    memset(&model, 0, sizeof(model));
    __nv_bfloat16* host = (__nv_bfloat16*)malloc(n * sizeof(__nv_bfloat16));
    TestRng rng = {(uint64_t)time(NULL)};
    double want = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float x = (float)((double)(test_rng_next(&rng) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 0.01f;
        host[i] = __float2bfloat16(x);
        const double b = (double)__bfloat162float(host[i]);
        want += b * b;
    }
    want = sqrt(want);
    CUDA_CHECK(cudaMalloc(&model.grads, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMemcpy(model.grads, host, n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    model.num_params_padded = n;
    model.L = 1;
    multi_gpu_attach(&mg, &model);
    float* scratch;
    CUDA_CHECK(cudaMalloc(&scratch, global_norm_scratch_bytes()));
    int ok = 1;
    char why[512] = "";
    for (int stop = 0; stop <= 1 && ok; stop++) {
        CUDA_CHECK(cudaEventRecord(mg.done, mg.comm_stream));  // what the backward hook's last bucket records
        float norm = NAN, loss = NAN;
        int stop_any = -1;
        multi_gpu_norm_and_loss(&mg, scratch, 1.25, stop, &norm, &loss, &stop_any, stream);
        const double rel = fabs(norm - want) / want;
        if (!(rel < 1e-5) || loss != 1.25f || stop_any != stop) {
            ok = 0;
            snprintf(why, sizeof(why), "stop %d: norm %.7g vs fp64 %.7g (rel %.2e), loss %g (want 1.25), stop_any %d",
                     stop, norm, want, rel, loss, stop_any);
        }
    }
    test_report(CASES[2], ok, "%s", why);
    CUDA_CHECK(cudaFree(scratch));
    CUDA_CHECK(cudaFree(model.grads));
    free(host);
    CUDA_CHECK(cudaStreamDestroy(stream));
    multi_gpu_destroy(&mg);
}
#endif

int main(void) {
    test_begin();
    test_plan(NUM_CASES);
#if MULTI_GPU_AVAILABLE
    signal(SIGPIPE, SIG_IGN);
    test_watchdog_fires();  // first: the child forks before this process touches CUDA
    test_in_process();
#else
    for (int i = 0; i < NUM_CASES; i++) test_skip(CASES[i], "built without NCCL");
#endif
    return test_end();
}
