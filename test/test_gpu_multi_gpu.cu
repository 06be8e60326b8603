// test_gpu_multi_gpu.cu: layers/multi_gpu/multi_gpu.cuh through real NCCL communicators.
// On one GPU, a communicator of one rank:
//   - the non-blocking communicator comes up (ncclCommInitRankConfig, blocking = 0, ncclInProgress
//     waited for by the watchdog) and multi_gpu_sum goes through the watched wait;
//   - multi_gpu_norm_and_loss: the global norm of random bf16 gradients against an fp64 sum on the
//     host, the loss, and the stop flag riding in the same all-reduce (0 and 1); outputs poisoned;
//   - the watchdog fires: in a child process, a kernel holds the all-reduce back past --nccl-timeout
//     3 s: the child prints the one line (step, collective, suspect), aborts the communicator and
//     exits 1 (the kernel is let go 5 s in, as NCCL's abort ends its own stuck kernels).
// On W ranks (W = the largest power of two <= the GPUs, at most 16), one forked process per GPU
// meeting through the file rendezvous; each check has a planted error it must reject:
//   - known values: rank r contributes r + 1 in every gradient element of two model layouts (one
//     with odd tensor and slice sizes), through the backward hook's buckets with --zero 0 (every
//     element) and 1 (the rank's shard): each is the exact mean (W + 1) / 2 (read back into poisoned
//     buffers), the padding untouched; multi_gpu_sum of r + 1 is W (W + 1) / 2. Planted: the last
//     rank drops one element's contribution: exactly that element is off, on every rank;
//   - ZeRO-1 = ZeRO 0 bit for bit: two AdamW steps (clipping, weight decay) as train_gpt drives them,
//     reduce to the owners + shard AdamW + all-gather against all-reduce + full AdamW, from the same
//     weights and gradients whose sums are exact in any order: the bf16 weights and the shard's fp32
//     master weights equal, every rank ends with the same weights (hash). Planted: the last rank adds
//     one ulp to one weight of its shard before the all-gather: exactly one weight differs everywhere;
//   - stop: only the last rank passes stop = 1 to multi_gpu_norm_and_loss: every rank sees it (and
//     the mean loss, the norm); then nobody does: every rank sees 0 (a flag kept per rank, or stuck
//     at 1, fails one of the two rounds);
//   - a late bucket: the first bucket's gradients are written 100 ms late on every rank (and the last
//     bucket's on the last rank), over stale values: every element is the mean on every rank.
//     Planted: that bucket's hook called before its late write: it differs, and nothing else does.
//   - owner order (--deterministic): ZeRO 0 reduces to the owners and broadcasts, from gradients whose
//     sums round (so the order of the ranks shows from 3 ranks on): every gradient bit for bit what
//     ZeRO-1's reduce followed by the owners' broadcast gives, the same on every rank (a failure also
//     gives the plain all-reduce's count of differing elements, which is not checked: with 2 ranks it
//     adds in the same order).
// Every case is skipped without a GPU, and in a build without NCCL; the W-rank cases with fewer than
// 2 GPUs. NCCL_NVLS_ENABLE=0 unless set otherwise.
#include <cuda_bf16.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layers/multi_gpu/multi_gpu.cuh"
#include "layers/optimizer/optimizer.cuh"
#include "test/forked_ranks.h"
#include "test/test_harness.h"

// The first three run on one GPU; the others on W ranks, one forked process per GPU (MR_FIRST on).
enum { C_WATCHDOG, C_SUM, C_NORM,
       C_ALL_REDUCE, C_PLANT_LOST, C_ZERO1, C_PLANT_ULP, C_STOP, C_LATE, C_PLANT_EARLY_HOOK, C_GATHER,
       C_PLANT_UNWAITED, C_OWNER_ORDER };
#define MR_FIRST C_ALL_REDUCE
static const char* CASES[] = {"multi_gpu_watchdog_fires_on_a_collective_that_never_completes",
                              "multi_gpu_nonblocking_communicator_and_watched_sum",
                              "multi_gpu_norm_loss_and_stop_flag_in_one_all_reduce",
                              "multi_gpu_ranks_all_reduce_known_values_exactly",
                              "multi_gpu_planted_lost_contribution_is_caught",
                              "multi_gpu_zero1_step_equals_zero0_step_bit_for_bit",
                              "multi_gpu_planted_one_ulp_in_a_zero1_shard_is_caught",
                              "multi_gpu_stop_flag_of_the_last_rank_reaches_every_rank",
                              "multi_gpu_late_bucket_reaches_the_reduction_on_every_rank",
                              "multi_gpu_planted_hook_before_the_late_write_is_caught",
                              "multi_gpu_zero1_gather_overlapped_each_layer_there_when_the_forward_reads_it",
                              "multi_gpu_planted_read_without_the_forward_wait_is_caught",
                              "multi_gpu_deterministic_zero0_sums_the_gradients_as_zero1_bit_for_bit"};
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

// ---- several ranks: one forked process per GPU -------------------------------------------------------
// The parent never touches CUDA before it forks (the one-GPU cases come after), so each child starts
// CUDA on its own GPU. The ranks meet through the file rendezvous in a fresh directory (no port to
// collide with another run) and write one line per case to DIR/rankR.txt: "CASE OK HASH TEXT"; the
// parent passes a case when every rank said OK and every nonzero HASH agrees, and names the first
// rank that did not otherwise (or that ended without a line: its stderr is in the log above).
// W is the largest power of two <= the GPUs (at most 16): then ncclAvg's 1/W is exact in bf16, and
// the values below sum exactly in any order, so "exact" holds whatever order NCCL adds the ranks in.
#define MR_MAX_WORLD FORKED_MAX_WORLD
#define MR_LATE_NS (100ull * 1000000ull)  // how long a late bucket's gradients are held back

typedef struct {
    int rank, world;
    MultiGpu* mg;
    cudaStream_t stream;
    FILE* out;  // the lines for the parent
} Rank;

typedef struct {
    size_t checked, bad, first;  // elements compared, those that differ, the first of them
    float first_value;           // its value
} MrCheck;

// Model shapes (layers, hidden, positions, padded vocab): a small one, and one whose tensors and
// per-layer slices have sizes that are no power of two (80, 240, 320, 37 x 80) and whose shards
// end inside tensors.
static const int MR_TINY[4] = {2, 64, 64, 256};
static const int MR_ODD[4] = {3, 80, 37, 128};

static __global__ void mr_fill_kernel(__nv_bfloat16* x, size_t n, float value) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(value);
}

static __global__ void mr_spin_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

static __global__ void mr_bump_kernel(unsigned short* bits) { *bits += 1; }  // one bf16 ulp up

static void mr_fill(__nv_bfloat16* x, size_t n, float value, cudaStream_t stream) {
    mr_fill_kernel<<<256, 256, 0, stream>>>(x, n, value);
    CUDA_CHECK(cudaGetLastError());
}

static void mr_result(const Rank* R, int c, int ok, unsigned long long hash, const char* fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    for (char* p = text; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(R->out, "%d %d %016llx %s\n", c, ok ? 1 : 0, hash, text);
    fflush(R->out);
}

// A model with only its bf16 parameters and gradients (all that multi_gpu.cuh and optimizer.cuh
// read), laid out as gpt_model_create does for `world` ranks.
static void mr_model_create(GPTModel* m, const int shape[4], int world, cudaStream_t stream) {
    memset(m, 0, sizeof(*m));
    const GPTConfig c = {shape[0], shape[1], 1, 1, shape[3], shape[3], shape[2]};
    m->config = c;
    m->L = c.num_layers, m->C = c.channels, m->NH = m->NKV = 1, m->HD = m->C;
    m->V = m->Vp = c.padded_vocab_size, m->maxT = c.max_seq_len, m->QKV = (int)gpt_qkv_features(&c);
    m->stream = stream;
    gpt_model_alloc_params(m, optimizer_pad_multiple(world));
}

// Layer l's slices of the per-layer tensors, or (l = -1) the other tensors: what one hook call reduces.
static void mr_fill_bucket(GPTModel* m, int l, float value) {
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const int per_layer = GPT_PARAMS[i].per_layer;
        if (per_layer != (l >= 0)) continue;
        const size_t n = per_layer ? m->param_sizes[i] / (size_t)m->L : m->param_sizes[i];
        mr_fill(m->grads + m->param_offsets[i] + (per_layer ? (size_t)l * n : 0), n, value, m->stream);
    }
}

static int mr_in_bucket(const GPTModel* m, int l, size_t e) {
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const int per_layer = GPT_PARAMS[i].per_layer;
        if (per_layer != (l >= 0)) continue;
        const size_t n = per_layer ? m->param_sizes[i] / (size_t)m->L : m->param_sizes[i];
        const size_t at = m->param_offsets[i] + (per_layer ? (size_t)l * n : 0);
        if (e >= at && e < at + n) return 1;
    }
    return 0;
}

// What gpt_model_backward does with the hook, every layer's gradients already final: layers L-1 .. 0,
// then -1 (wte, wpe, lnfw, lnfb).
static void mr_backward_hooks(MultiGpu* mg, GPTModel* m) {
    multi_gpu_arm_hook(mg, m, 1);
    for (int l = m->L - 1; l >= -1; l--) m->grads_ready(m->grads_ready_user, l);
    multi_gpu_arm_hook(mg, m, 0);
}

// The device's bf16 x[0, n) into host bits, the host buffer poisoned (NaN) first.
static void mr_download(uint16_t* host, const __nv_bfloat16* x, size_t n, cudaStream_t stream) {
    memset(host, 0xFF, n * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpyAsync(host, x, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

static MrCheck mr_check_value(const uint16_t* host, size_t a, size_t b, float want) {
    const uint16_t bits = test_float_to_bf16(want);
    MrCheck c = {0, 0, 0, 0.0f};
    for (size_t i = a; i < b; i++, c.checked++) {
        if (host[i] == bits) continue;
        if (c.bad++ == 0) c.first = i, c.first_value = test_bf16_to_float(host[i]);
    }
    return c;
}

// Case 1's run: rank r contributes r + 1 in every gradient element (the padding 0), the hook reduces
// every bucket (zero 0: all-reduce; zero 1: to the shard owners); compared to the mean (W + 1) / 2
// in every element (zero 1: this rank's shard). victim >= 0: the last rank contributes 0 there.
static MrCheck mr_reduce_known_values(Rank* R, const int shape[4], int zero, long long victim) {
    GPTModel m;
    mr_model_create(&m, shape, R->world, R->stream);
    mr_fill(m.grads, m.num_params, (float)(R->rank + 1), R->stream);
    if (victim >= 0 && R->rank == R->world - 1) mr_fill(m.grads + victim, 1, 0.0f, R->stream);
    R->mg->zero = zero;
    multi_gpu_attach(R->mg, &m);
    mr_backward_hooks(R->mg, &m);
    multi_gpu_wait_grads(R->mg, R->stream);
    uint16_t* host = (uint16_t*)malloc(m.num_params_padded * sizeof(uint16_t));
    mr_download(host, m.grads, m.num_params_padded, R->stream);
    size_t a = 0, b = m.num_params;
    if (zero) {
        a = R->mg->shard_offset;
        b = a + R->mg->shard_size < m.num_params ? a + R->mg->shard_size : m.num_params;
        if (a > b) a = b;
    }
    MrCheck c = mr_check_value(host, a, b, 0.5f * (float)(R->world + 1));
    const MrCheck pad = mr_check_value(host, m.num_params, m.num_params_padded, 0.0f);  // never reduced
    if (pad.bad && !c.bad) c = pad;
    free(host);
    gpt_model_destroy(&m);
    return c;
}

// Case 1: known values through every bucket of two shapes, zero 0 and 1, and multi_gpu_sum's fp32.
// Planted (the next case): the last rank loses one element's contribution; exactly that element
// must come out (W - 1) / 2 instead of (W + 1) / 2, on every rank (zero 0: each holds every element).
static void mr_case_all_reduce(Rank* R) {
    char why[400] = "";
    int ok = 1;
    for (int s = 0; s < 2 && ok; s++)
        for (int zero = 0; zero <= 1 && ok; zero++) {
            const MrCheck c = mr_reduce_known_values(R, s ? MR_ODD : MR_TINY, zero, -1);
            if (c.bad) {
                ok = 0;
                snprintf(why, sizeof(why), "%s shape, zero %d: %zu of %zu elements are not %g, the first at %zu: %g",
                         s ? "odd" : "tiny", zero, c.bad, c.checked, 0.5 * (R->world + 1), c.first, c.first_value);
            }
        }
    const double sum = multi_gpu_sum(R->mg, R->rank + 1.0, R->stream, "test sum of rank + 1");
    const double want = 0.5 * R->world * (R->world + 1);
    if (ok && sum != want) ok = 0, snprintf(why, sizeof(why), "multi_gpu_sum of rank + 1: %.9g, want %g", sum, want);
    mr_result(R, C_ALL_REDUCE, ok, 0, "%s", why);

    const long long victim = 12293;  // inside wte (the last bucket) of the tiny shape
    const MrCheck p = mr_reduce_known_values(R, MR_TINY, 0, victim);
    const int caught = p.bad == 1 && p.first == (size_t)victim && p.first_value == 0.5f * (float)(R->world - 1);
    mr_result(R, C_PLANT_LOST, caught, 0,
              "planted: %zu elements differ (want exactly 1, at %lld: %g), first at %zu: %g",
              p.bad, victim, 0.5 * (R->world - 1), p.first, p.first_value);
}

static uint64_t mr_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Rank `rank`'s gradient of step `step`: k · 2^-e, k in [-15, 15] drawn per rank, e in [8, 14] the
// same on every rank; the padding 0. Any partial sum of up to 16 ranks' k is an integer below 256,
// exact in bf16's 8 bits, and so is its product with 1/W: every reduction order gives the same bits.
static void mr_exact_grads(uint16_t* g, size_t n, size_t padded, int rank, int step) {
    for (size_t i = 0; i < padded; i++) {
        if (i >= n) {
            g[i] = 0;
            continue;
        }
        const uint64_t h = mr_mix(((uint64_t)step << 40) ^ i);
        const int e = 8 + (int)(h % 7);
        const int k = (int)(mr_mix(h ^ ((uint64_t)(rank + 1) << 56)) % 31) - 15;
        g[i] = test_float_to_bf16(ldexpf((float)k, -e));
    }
}

static uint64_t mr_hash(const uint16_t* x, size_t n) { return launcher_hash(0, x, n * sizeof(uint16_t)); }

// Two optimizer steps as train_gpt drives them: gradients in, the hook's buckets, the norm (and
// loss, stop) all-reduce, clipping + AdamW on this rank's range (optimizer_update), ZeRO-1's
// all-gather. Out: the bf16 weights (num_params) and the fp32 master weights of this rank's range, at
// their flat index (master_out: num_params). plant: before the last all-gather, the last rank adds
// one bf16 ulp to one weight of its shard.
static void mr_zero_steps(Rank* R, GPTModel* m, int zero, int plant, uint16_t* params_out, float* master_out) {
    MultiGpu* mg = R->mg;
    size_t padded, offset, elems;
    optimizer_range(m->num_params, R->world, R->rank, zero, &padded, &offset, &elems);
    Optimizer opt;
    optimizer_create(&opt, offset, elems, 0.1f, 1.0f);
    optimizer_init_gpt2(&opt, m, 1234);
    mg->zero = zero;
    multi_gpu_attach(mg, m);
    uint16_t* g = (uint16_t*)malloc(padded * sizeof(uint16_t));
    for (int step = 1; step <= 2; step++) {
        mr_exact_grads(g, m->num_params, padded, R->rank, step);
        CUDA_CHECK(cudaMemcpyAsync(m->grads, g, padded * sizeof(uint16_t), cudaMemcpyHostToDevice, R->stream));
        mr_backward_hooks(mg, m);
        multi_gpu_wait_grads(mg, R->stream);
        float norm = 0.0f, loss = 0.0f;
        int stop = 0;
        multi_gpu_norm_and_loss(mg, opt.norm_scratch, 1.0, 0, &norm, &loss, &stop, R->stream);
        optimizer_update(&opt, m, mg->scalars, 1e-3, step);
        if (plant && zero && step == 2 && R->rank == R->world - 1 && offset + 5 < m->num_params)
            mr_bump_kernel<<<1, 1, 0, R->stream>>>((unsigned short*)(m->params + offset + 5));
        if (zero) multi_gpu_all_gather_params(mg, R->stream);
    }
    multi_gpu_wait_params(mg, R->stream);
    free(g);
    mr_download(params_out, m->params, m->num_params, R->stream);
    for (size_t i = 0; i < m->num_params; i++) master_out[i] = NAN;
    const size_t keep = offset >= m->num_params ? 0 : elems < m->num_params - offset ? elems : m->num_params - offset;
    CUDA_CHECK(cudaMemcpy(master_out + offset, opt.master, keep * sizeof(float), cudaMemcpyDeviceToHost));
    optimizer_destroy(&opt);
}

// Case 2: ZeRO-1 (reduce to the owners, AdamW on the shard, all-gather) against ZeRO 0 (all-reduce,
// AdamW on everything) from the same weights and gradients, two steps with clipping and weight
// decay on the odd shape (shards end inside tensors): the bf16 weights bit for bit, and the fp32
// master weights of this rank's shard. The weights' hash goes to the parent, which checks that every
// rank holds the same. Planted (the next case): the last rank's one-ulp change to one weight of its
// shard before the all-gather must show on every rank as exactly one differing weight.
static void mr_case_zero1(Rank* R) {
    GPTModel m;
    mr_model_create(&m, MR_ODD, R->world, R->stream);
    const size_t n = m.num_params;
    uint16_t* p0 = (uint16_t*)malloc(n * sizeof(uint16_t));
    uint16_t* p1 = (uint16_t*)malloc(n * sizeof(uint16_t));
    float* m0 = (float*)malloc(n * sizeof(float));
    float* m1 = (float*)malloc(n * sizeof(float));
    mr_zero_steps(R, &m, 0, 0, p0, m0);
    mr_zero_steps(R, &m, 1, 0, p1, m1);
    size_t bad_p = 0, bad_m = 0, first_p = 0, first_m = 0, shard = 0, changed = 0;
    for (size_t i = 0; i < n; i++) {
        if (p0[i] != p1[i] && bad_p++ == 0) first_p = i;
        if (p1[i] != test_float_to_bf16(0.0f)) changed++;
        if (isnan(m1[i])) continue;  // not this rank's shard
        shard++;
        if (memcmp(&m0[i], &m1[i], sizeof(float)) != 0 && bad_m++ == 0) first_m = i;
    }
    mr_result(R, C_ZERO1, bad_p == 0 && bad_m == 0 && shard > 0 && changed > 0, mr_hash(p1, n),
              "%zu of %zu bf16 weights differ (first at %zu: %04x vs %04x), %zu of the shard's %zu master weights "
              "(first at %zu: %.9g vs %.9g)", bad_p, n, first_p, p0[first_p], p1[first_p], bad_m, shard, first_m,
              m0[first_m], m1[first_m]);
    mr_zero_steps(R, &m, 1, 1, p1, m1);
    bad_p = 0;
    for (size_t i = 0; i < n; i++)
        if (p0[i] != p1[i] && bad_p++ == 0) first_p = i;
    mr_result(R, C_PLANT_ULP, bad_p == 1, 0,
              "planted: %zu weights differ from ZeRO 0's (want exactly 1), the first at %zu",
              bad_p, first_p);
    free(p0), free(p1), free(m0), free(m1);
    gpt_model_destroy(&m);
}

// Case 3: only the last rank got a stop signal: every rank's multi_gpu_norm_and_loss says stop, with
// the mean loss of rank + 1 ((W + 1) / 2, exact in fp32) and the norm of gradients that are 1/4 in
// every element on every rank (the shards' sums of squares are exact). Then no rank stops: every
// rank must say 0. Rejected plants: a flag that stays on its own rank (not in the all-reduce) fails
// the first round on ranks 0 .. W-2; a flag stuck at 1 (or a max over stale values) fails the second.
static void mr_case_stop(Rank* R) {
    GPTModel m;
    mr_model_create(&m, MR_TINY, R->world, R->stream);
    mr_fill(m.grads, m.num_params, 0.25f, R->stream);
    R->mg->zero = 0;
    multi_gpu_attach(R->mg, &m);
    float* scratch;
    CUDA_CHECK(cudaMalloc(&scratch, global_norm_scratch_bytes()));
    const float want_loss = 0.5f * (float)(R->world + 1), want_norm = sqrtf(0.0625f * (float)m.num_params);
    int ok = 1;
    char why[400] = "";
    for (int round = 0; round < 2 && ok; round++) {
        CUDA_CHECK(cudaEventRecord(R->mg->done, R->mg->comm_stream));  // what the hook's last bucket records
        const int stop = round == 0 && R->rank == R->world - 1;
        float norm = NAN, loss = NAN;
        int any = -1;
        multi_gpu_norm_and_loss(R->mg, scratch, R->rank + 1.0, stop, &norm, &loss, &any, R->stream);
        if (any != (round == 0) || loss != want_loss || fabsf(norm - want_norm) > 1e-6f * want_norm) {
            ok = 0;
            snprintf(why, sizeof(why),
                     "round %d (%s): stop seen %d (want %d), loss %.9g (want %g), norm %.9g (want %.9g)",
                     round, round ? "no rank stops" : "the last rank stops", any, round == 0, loss, want_loss, norm,
                     want_norm);
        }
    }
    mr_result(R, C_STOP, ok, 0, "%s", why);
    CUDA_CHECK(cudaFree(scratch));
    gpt_model_destroy(&m);
}

// Case 4's run: a backward whose buckets write rank + 1 over stale gradients (1000) and call the
// hook, each in turn; layer L-1's bucket (the first) is written only after MR_LATE_NS of spinning
// on every rank, and the last bucket (-1) on the last rank too (a slow rank). Every element must be
// the mean (W + 1) / 2 on every rank: the reduction waited for the late writes. plant: layer L-1's
// hook is called before its late write (the event then covers nothing): that bucket must differ.
static MrCheck mr_late_bucket(Rank* R, int plant, GPTModel* m, uint16_t* host) {
    mr_fill(m->grads, m->num_params, 1000.0f, R->stream);
    R->mg->zero = 0;
    multi_gpu_attach(R->mg, m);
    multi_gpu_sum(R->mg, 0.0, R->stream, "test barrier");  // the ranks start the backward together
    multi_gpu_arm_hook(R->mg, m, 1);
    for (int l = m->L - 1; l >= -1; l--) {
        const int late = l == m->L - 1 || (l == -1 && R->rank == R->world - 1);
        if (plant && l == m->L - 1) m->grads_ready(m->grads_ready_user, l);
        if (late) mr_spin_kernel<<<1, 1, 0, R->stream>>>(MR_LATE_NS);
        mr_fill_bucket(m, l, (float)(R->rank + 1));
        if (!(plant && l == m->L - 1)) m->grads_ready(m->grads_ready_user, l);
    }
    multi_gpu_arm_hook(R->mg, m, 0);
    multi_gpu_wait_grads(R->mg, R->stream);
    mr_download(host, m->grads, m->num_params, R->stream);
    return mr_check_value(host, 0, m->num_params, 0.5f * (float)(R->world + 1));
}

// Case 4 and its plant (see mr_late_bucket). The plant must differ somewhere, and only inside the
// bucket whose hook came early.
static void mr_case_late(Rank* R) {
    GPTModel m;
    mr_model_create(&m, MR_TINY, R->world, R->stream);
    uint16_t* host = (uint16_t*)malloc(m.num_params * sizeof(uint16_t));
    const MrCheck c = mr_late_bucket(R, 0, &m, host);
    mr_result(R, C_LATE, c.bad == 0 && c.checked == m.num_params, 0,
              "%zu of %zu elements are not %g, the first at %zu: %g (1000: stale, never reduced; %d: this rank's own)",
              c.bad, c.checked, 0.5 * (R->world + 1), c.first, c.first_value, R->rank + 1);
    const MrCheck p = mr_late_bucket(R, 1, &m, host);
    const uint16_t want = test_float_to_bf16(0.5f * (float)(R->world + 1));
    size_t outside = 0;
    for (size_t i = 0; i < m.num_params; i++) outside += host[i] != want && !mr_in_bucket(&m, m.L - 1, i);
    free(host);
    mr_result(R, C_PLANT_EARLY_HOOK, p.bad > 0 && outside == 0, 0,
              "planted: %zu elements differ, %zu of them outside layer %d's bucket (want some, none outside)", p.bad,
              outside, m.L - 1);
    gpt_model_destroy(&m);
}

// Case 5's run: a ZeRO-1 all-gather whose transfers start MR_LATE_NS late (the communication stream
// spins first), then a "forward" that, layer by layer (-1 first), calls the model's params_needed
// hook and copies that layer's bucket of the weights to `snap` on the compute stream. Before, every
// rank's weights are stale (-1) except its own shard, which holds its rank + 1 (the optimizer's
// output). Every copied element must be its owner's rank + 1. Then a second all-gather is enqueued
// before the first one's stalls are read (as a training step's does): multi_gpu_exposed_ms must still
// report the first forward's wait, at least half of MR_LATE_NS. plant: the embeddings' bucket is
// copied without the hook: it must come out stale (the transfer had not begun), and nothing else may
// differ.
static MrCheck mr_overlapped_gather(Rank* R, int plant, GPTModel* m, uint16_t* host, size_t* outside,
                                    double* stalled_ms) {
    MultiGpu* mg = R->mg;
    mg->zero = 1;
    multi_gpu_attach(mg, m);
    const size_t S = mg->shard_size;
    mr_fill(m->params, m->num_params_padded, -1.0f, R->stream);
    mr_fill(m->params + mg->shard_offset, S, (float)(R->rank + 1), R->stream);
    __nv_bfloat16* snap;
    CUDA_CHECK(cudaMalloc(&snap, m->num_params * sizeof(__nv_bfloat16)));
    mr_fill(snap, m->num_params, -2.0f, R->stream);  // poisoned: an element never copied fails
    multi_gpu_sum(mg, 0.0, R->stream, "test barrier");
    mr_spin_kernel<<<1, 1, 0, mg->comm_stream>>>(MR_LATE_NS);
    multi_gpu_all_gather_params(mg, R->stream);
    for (int l = -1; l < m->L; l++) {
        if (!(plant && l == -1)) m->params_needed(m->params_needed_user, l);
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            const int per_layer = GPT_PARAMS[i].per_layer;
            if (per_layer != (l >= 0)) continue;
            const size_t n = per_layer ? m->param_sizes[i] / (size_t)m->L : m->param_sizes[i];
            const size_t at = m->param_offsets[i] + (per_layer ? (size_t)l * n : 0);
            CUDA_CHECK(cudaMemcpyAsync(snap + at, m->params + at, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice,
                                       R->stream));
        }
    }
    multi_gpu_all_gather_params(mg, R->stream);
    mr_download(host, snap, m->num_params, R->stream);
    *stalled_ms = multi_gpu_exposed_ms(mg);
    multi_gpu_wait_params(mg, R->stream);
    CUDA_CHECK(cudaStreamSynchronize(R->stream));
    CUDA_CHECK(cudaFree(snap));
    MrCheck c = {0, 0, 0, 0.0f};
    *outside = 0;
    for (size_t i = 0; i < m->num_params; i++) {
        c.checked++;
        if (host[i] == test_float_to_bf16((float)(i / S + 1))) continue;
        if (c.bad++ == 0) c.first = i, c.first_value = test_bf16_to_float(host[i]);
        *outside += !mr_in_bucket(m, -1, i);
    }
    return c;
}

// Case 5 and its plant (see mr_overlapped_gather).
static void mr_case_gather(Rank* R) {
    GPTModel m;
    mr_model_create(&m, MR_ODD, R->world, R->stream);
    uint16_t* host = (uint16_t*)malloc(m.num_params * sizeof(uint16_t));
    size_t outside = 0;
    double stalled = 0.0, least = 0.5 * MR_LATE_NS / 1e6;
    const MrCheck c = mr_overlapped_gather(R, 0, &m, host, &outside, &stalled);
    mr_result(R, C_GATHER, c.bad == 0 && c.checked == m.num_params && stalled >= least, 0,
              "%zu of %zu weights read are not their owner's rank + 1, the first at %zu: %g (-1: read before it "
              "arrived, -2: never read); the forward's stall measured %.1f ms (want >= %.0f)", c.bad, c.checked,
              c.first, c.first_value, stalled, least);
    const MrCheck p = mr_overlapped_gather(R, 1, &m, host, &outside, &stalled);
    mr_result(R, C_PLANT_UNWAITED, p.bad > 0 && outside == 0, 0,
              "planted: %zu weights read stale, %zu of them outside the embeddings' bucket (want some, none outside)",
              p.bad, outside);
    free(host);
    gpt_model_destroy(&m);
}

// Rank r's gradients of 8 significant bits over 2^-6 .. 2^6: their bf16 sums round, so the order in which
// the ranks are added shows in the last bit.
static void mr_inexact_grads(uint16_t* g, size_t n, size_t padded, int rank) {
    for (size_t i = 0; i < padded; i++) {
        const uint64_t h = mr_mix(((uint64_t)(rank + 1) << 48) ^ i);
        const float v = ldexpf((float)((int)(h % 255) - 127) / 127.0f, (int)((h >> 20) % 13) - 6);
        g[i] = i < n ? test_float_to_bf16(v) : 0;
    }
}

// The reduced gradients (num_params, into out) of one stage: 0 ZeRO 0 all-reduce, 1 ZeRO 0 in owner
// order, 2 ZeRO-1's reduce followed by the owners' broadcast of the gradients.
static void mr_reduce_stage(Rank* R, GPTModel* m, const uint16_t* g, int stage, uint16_t* out) {
    R->mg->zero = stage == 2, R->mg->owner_order = stage == 1;
    multi_gpu_attach(R->mg, m);
    CUDA_CHECK(cudaMemcpyAsync(m->grads, g, m->num_params_padded * sizeof(uint16_t), cudaMemcpyHostToDevice,
                               R->stream));
    mr_backward_hooks(R->mg, m);
    multi_gpu_wait_grads(R->mg, R->stream);
    if (stage == 2) {
        for (int l = -1; l < m->L; l++) multi_gpu_bucket(R->mg, MG_GATHER, m->grads, l);
        CUDA_CHECK(cudaStreamSynchronize(R->mg->comm_stream));
    }
    mr_download(out, m->grads, m->num_params, R->stream);
    R->mg->owner_order = 0;
}

static size_t mr_count_differing(const uint16_t* a, const uint16_t* b, size_t n, size_t* first) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && bad++ == 0) *first = i;
    return bad;
}

// Case: ZeRO 0 in owner order against ZeRO-1's reduce + broadcast, from inexact gradients.
static void mr_case_owner_order(Rank* R) {
    GPTModel m;
    mr_model_create(&m, MR_ODD, R->world, R->stream);
    const size_t n = m.num_params;
    uint16_t* g = (uint16_t*)malloc(m.num_params_padded * sizeof(uint16_t));
    uint16_t* out[3];
    mr_inexact_grads(g, n, m.num_params_padded, R->rank);
    for (int stage = 0; stage < 3; stage++) {
        out[stage] = (uint16_t*)malloc(n * sizeof(uint16_t));
        mr_reduce_stage(R, &m, g, stage, out[stage]);
    }
    size_t first = 0, plain_first = 0;
    const size_t bad = mr_count_differing(out[1], out[2], n, &first);
    const size_t plain = mr_count_differing(out[0], out[2], n, &plain_first);
    mr_result(R, C_OWNER_ORDER, bad == 0, mr_hash(out[1], n),
              "%zu of %zu gradients differ from ZeRO-1's (first at %zu: %04x vs %04x); the plain all-reduce: %zu differ",
              bad, n, first, out[1][first], out[2][first], plain);
    for (int stage = 0; stage < 3; stage++) free(out[stage]);
    free(g);
    gpt_model_destroy(&m);
}

// One rank: its GPU, the communicator (file rendezvous in dir), the cases in order, a clean end.
static void mr_child(int rank, int world, const char* dir) {
    Rank R = {rank, world, NULL, NULL, forked_rank_begin(rank, dir)};
    char rendezvous[FORKED_PATH_MAX];
    snprintf(rendezvous, sizeof(rendezvous), "%s/rendezvous", dir);
    static MultiGpu mg;
    const LaunchInfo li = forked_launch_info(rank, world);
    multi_gpu_init(&mg, &li, rank, 0, 0x6d756c7469ull, 60.0, rendezvous, 120.0);
    R.mg = &mg;
    CUDA_CHECK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
    mr_case_all_reduce(&R);
    mr_case_zero1(&R);
    mr_case_stop(&R);
    mr_case_late(&R);
    mr_case_gather(&R);
    mr_case_owner_order(&R);
    CUDA_CHECK(cudaStreamDestroy(R.stream));
    multi_gpu_destroy(&mg);
    fclose(R.out);
    _exit(0);
}

// Rank r's line for case c: 1 (ok, hash, text filled) or 0 when it wrote none.
static int mr_read_line(const char* dir, int r, int c, int* ok, unsigned long long* hash, char* text, size_t len) {
    char path[FORKED_PATH_MAX], line[1024];
    forked_rank_path(path, sizeof(path), dir, r);
    FILE* f = fopen(path, "r");
    int found = 0, index = -1, n = 0;
    while (f && !found && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%d %d %llx %n", &index, ok, hash, &n) < 3 || index != c) continue;
        found = 1;
        snprintf(text, len, "%s", line + n);
        text[strcspn(text, "\n")] = '\0';
    }
    if (f) fclose(f);
    return found;
}

// One case over the ranks' lines; codes: each rank's exit status.
static void mr_report(int c, const char* dir, int world, const int* codes) {
    char why[1200] = "", text[1024] = "";
    unsigned long long first_hash = 0;
    int ok = 1;
    for (int r = 0; r < world && ok; r++) {
        int rank_ok = 0;
        unsigned long long hash = 0;
        if (!mr_read_line(dir, r, c, &rank_ok, &hash, text, sizeof(text))) {
            ok = 0;
            snprintf(why, sizeof(why), "rank %d of %d reported nothing (exit status %d; its stderr is above)", r, world,
                     codes[r]);
        } else if (!rank_ok) {
            ok = 0;
            snprintf(why, sizeof(why), "rank %d of %d: %s", r, world, text);
        } else if (r == 0) {
            first_hash = hash;
        } else if (hash != first_hash) {
            ok = 0;
            snprintf(why, sizeof(why), "ranks 0 and %d of %d end with other weights (hash %016llx vs %016llx)", r,
                     world, first_hash, hash);
        }
    }
    for (int r = 0; r < world && ok; r++)
        if (codes[r] != 0)
            ok = 0, snprintf(why, sizeof(why), "rank %d of %d exited with status %d", r, world, codes[r]);
    test_report(CASES[c], ok, "%s", why);
}

// The multi-rank cases: W = the largest power of two <= the GPUs (at most MR_MAX_WORLD) forked
// ranks; skipped with fewer than 2 GPUs.
static void test_multi_rank(int gpus) {
    if (gpus < 2) {
        for (int c = MR_FIRST; c < NUM_CASES; c++)
            test_skip(CASES[c], gpus == 0 ? "no CUDA GPU found" : "needs 2 or more GPUs, found 1");
        return;
    }
    int world = 1;
    while (world * 2 <= gpus && world * 2 <= MR_MAX_WORLD) world *= 2;
    printf("# %d GPUs: %d ranks, one process each\n", gpus, world);
    char dir[] = "/tmp/test_gpu_multi_gpu.XXXXXX";
    if (!mkdtemp(dir)) {
        for (int c = MR_FIRST; c < NUM_CASES; c++) test_fail(CASES[c], "cannot make a directory in /tmp");
        return;
    }
    int codes[FORKED_MAX_WORLD];
    forked_run(world, dir, mr_child, codes);
    for (int c = MR_FIRST; c < NUM_CASES; c++) mr_report(c, dir, world, codes);
    forked_remove_dir(dir);
}
#endif

int main(void) {
    test_begin();
    test_plan(NUM_CASES);
#if MULTI_GPU_AVAILABLE
    signal(SIGPIPE, SIG_IGN);
    const int gpus = forked_count_gpus(0);  // in a child: this process starts CUDA only after its forks
    test_watchdog_fires();
    test_multi_rank(gpus);
    test_in_process();
#else
    for (int i = 0; i < NUM_CASES; i++) test_skip(CASES[i], "built without NCCL");
#endif
    return test_end();
}
