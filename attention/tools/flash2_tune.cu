// flash2_tune.cu: times candidate block shapes of the flash2 forward and backward kernels on the
// attention benchmark grid (hidden 2048, batch·seqlen = 16k tokens, bf16 random inputs), so the
// choice in flash2_forward.cu / flash2_backward.cu rests on measurements. Not part of the trainer.
//
//   make build/flash2_tune && build/flash2_tune [--runs N] [--seqlens 512,2048,8192] [--head-dims 64,128]
//                                               [--pass forward|backward|both] [--causal 0|1|both] [--chosen]
//
// --chosen times only the reference and the shapes flash2_tiles.h gives the library: an A/B of two
// builds then takes seconds, where the whole candidate list takes minutes.
//
// Each candidate's outputs are compared with the first candidate's (relative error ≤ 1e-2), so a
// fast but broken shape is reported as WRONG rather than chosen; the outputs are poisoned (NaN)
// before each candidate, so one that leaves elements unwritten is WRONG too. Prints TFLOP/s (FA2 paper count:
// fwd 4·B·T²·HD·NH, halved when causal; bwd 2.5× that), median of --runs timed runs.
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "attention/flash2/flash2_params.h"
#include "attention/flash2/flash2_tiles.h"
#include "attention/flash2/sm80/flash2_backward_kernel.cuh"
#include "attention/flash2/sm80/flash2_forward_kernel.cuh"
#include "attention/flash2/sm90/flash2_backward_hopper.cuh"
#include "attention/flash2/sm90/flash2_forward_hopper.cuh"

typedef void (*ForwardLaunch)(const Flash2ForwardParams*, int, cudaStream_t);
typedef void (*BackwardLaunch)(const Flash2BackwardParams*, int, cudaStream_t);

typedef struct {
    const char* name;
    int hd;
    ForwardLaunch launch[2];  // [causal]
    int block_n, consumers, persistent, storer;  // ws kernels: their tile shape and launch; 0 otherwise
} ForwardCandidate;
typedef struct {
    const char* name;
    int hd;
    BackwardLaunch launch[2];
    int block_m, dk_from_smem, schedule;  // ws kernels: query block, dK operand, product order; 0 otherwise
} BackwardCandidate;

#define FWD(HD, BM, BN, NW, MB) \
    {"fwd BM" #BM " BN" #BN " W" #NW " min" #MB, HD, \
     {launch_forward<HD, BM, BN, NW, MB, false>, launch_forward<HD, BM, BN, NW, MB, true>}, 0, 0, 0, 0}
#define BWD(HD, BM, NW, MB) \
    {"bwd BM" #BM " BN" #NW "x16 W" #NW " min" #MB, HD, \
     {launch_backward<HD, BM, NW, MB, false>, launch_backward<HD, BM, NW, MB, true>}, 0, 0, 0}

// The first candidate of each head dim is the mma.sync kernel, the reference the others are checked
// against; "ws" are the warp-specialized TMA kernels of Hopper (flash2_forward_hopper.cuh,
// flash2_backward_hopper.cuh); a '*' marks the shape flash2_tiles.h gives the library.
#define FWD_WS_S(HD, BN, CONSUMERS, PERSISTENT, STORER, SUFFIX) \
    {"fwd ws BM" #CONSUMERS "x64 BN" #BN " pers" #PERSISTENT SUFFIX, HD, \
     {launch_forward_ws<HD, BN, CONSUMERS, false, PERSISTENT, STORER>, \
      launch_forward_ws<HD, BN, CONSUMERS, true, PERSISTENT, STORER>}, \
     BN, CONSUMERS, PERSISTENT, STORER}
#define FWD_WS(HD, BN, CONSUMERS, PERSISTENT) FWD_WS_S(HD, BN, CONSUMERS, PERSISTENT, false, "")
#define FWD_WS_STORER(HD, BN, CONSUMERS) FWD_WS_S(HD, BN, CONSUMERS, 1, true, " storer")
static const ForwardCandidate FORWARD[] = {
    FWD(64, 128, 64, 4, 2),  FWD_WS(64, 128, 3, 1),  FWD_WS(64, 128, 3, 0),  FWD_WS(64, 128, 2, 1),
    FWD_WS_STORER(64, 128, 3),
    FWD(80, 128, 64, 4, 2),  FWD_WS(80, 128, 2, 1),  FWD_WS(80, 128, 2, 0),  FWD_WS(80, 176, 2, 1),
    FWD_WS(80, 96, 3, 1),    FWD_WS(80, 128, 3, 1),
    FWD(96, 128, 64, 4, 2),  FWD_WS(96, 128, 2, 1),  FWD_WS(96, 128, 2, 0),  FWD_WS(96, 176, 2, 1),
    FWD_WS(96, 96, 3, 1),    FWD_WS(96, 128, 3, 1),  FWD_WS_STORER(96, 128, 3),
    FWD(128, 128, 64, 4, 2), FWD_WS(128, 128, 2, 1), FWD_WS(128, 128, 2, 0), FWD_WS(128, 176, 2, 1),
    FWD_WS(128, 128, 3, 1),  FWD_WS_STORER(128, 128, 2), FWD_WS_STORER(128, 128, 3),
};
// SCHED: 0, 1 (BWD_DQ_FIRST), 2 (BWD_PINGPONG), 3 (both): flash2_tiles.h
#define BWD_WS(HD, BM, DET, DK_SMEM, SCHED) \
    {"bwd ws BM" #BM " dK " DK_SMEM " sched" #SCHED DET, HD, \
     {launch_backward_ws<HD, BM, false, (sizeof(DET) > 1), (sizeof(DK_SMEM) > 5), SCHED>, \
      launch_backward_ws<HD, BM, true, (sizeof(DET) > 1), (sizeof(DK_SMEM) > 5), SCHED>}, BM, (sizeof(DK_SMEM) > 5), SCHED}
#define BWD_WS_ALL(HD, BM) \
    BWD_WS(HD, BM, "", "regs", 0), BWD_WS(HD, BM, "", "regs", 1), BWD_WS(HD, BM, "", "regs", 2), \
    BWD_WS(HD, BM, "", "regs", 3), BWD_WS(HD, BM, "", "shared", 0), BWD_WS(HD, BM, "", "shared", 1), \
    BWD_WS(HD, BM, "", "shared", 3)
#define BWD_WS_SOME(HD, BM) BWD_WS(HD, BM, "", "regs", 0), BWD_WS(HD, BM, "", "regs", 1), BWD_WS(HD, BM, "", "regs", 3)
// The deterministic mode as the library runs it (flash2_tiles.h's choice per head dim).
static const BackwardCandidate BACKWARD[] = {
    BWD(64, 128, 8, 1),  BWD_WS_ALL(64, 128),  BWD_WS(64, 128, " determ.", "shared", 1),
    BWD(80, 64, 8, 1),   BWD_WS_SOME(80, 64),  BWD_WS(80, 64, " determ.", "regs", 0),
    BWD(96, 64, 8, 1),   BWD_WS_SOME(96, 64),  BWD_WS(96, 64, " determ.", "regs", 1),
    // d128 without "dK shared sched0": ptxas injects a warpgroup wait into its causal kernel (C7519),
    // the build's only one; the library runs schedule 1 there (flash2_tiles.h)
    BWD(128, 64, 8, 1),  BWD_WS_SOME(128, 64),  BWD_WS(128, 64, "", "regs", 2),  BWD_WS(128, 64, "", "shared", 1),
    BWD_WS(128, 64, "", "shared", 3),  BWD_WS(128, 64, " determ.", "shared", 1),
};

// FLASH2_FORWARD_LONG_T=N (N > 0), as the library reads it (attention.cu); 0 when unset. The tuner
// builds the kernels without the library, so it reads the switch itself.
static int forward_long_t_override(void) {
    static int override_t = -1;
    if (override_t < 0) {
        const char* env = getenv("FLASH2_FORWARD_LONG_T");
        override_t = env && env[0] ? atoi(env) : 0;
        if (override_t < 0) override_t = 0;
    }
    return override_t;
}

// Whether a candidate is the shape flash2_tiles.h picks (ws kernels only).
template <int HD, bool CAUSAL>
static bool forward_chosen(const ForwardCandidate& c, int T) {
    typedef Flash2ForwardTiles<HD, CAUSAL> Tiles;
    // as the launcher (flash2_forward.cu) picks it, FLASH2_FORWARD_LONG_T included
    const int consumers =
        flash2_forward_long_shape(Tiles::LONG_T, T, forward_long_t_override()) ? Tiles::LONG_CONSUMERS : Tiles::CONSUMERS;
    return c.block_n == Tiles::BLOCK_N && c.consumers == consumers && c.persistent == 1 &&  // the library launches persistent
           c.storer == (int)Tiles::STORER;
}
template <int HD>
static bool forward_chosen(const ForwardCandidate& c, int causal, int T) {
    return causal ? forward_chosen<HD, true>(c, T) : forward_chosen<HD, false>(c, T);
}
static bool forward_is_chosen(const ForwardCandidate& c, int causal, int T) {
    if (!c.consumers) return false;
    switch (c.hd) {
        case 64: return forward_chosen<64>(c, causal, T);
        case 80: return forward_chosen<80>(c, causal, T);
        case 96: return forward_chosen<96>(c, causal, T);
        default: return forward_chosen<128>(c, causal, T);
    }
}
template <int HD>
static bool backward_chosen(const BackwardCandidate& c, int causal) {
    typedef Flash2BackwardTiles<HD, true> Causal;
    typedef Flash2BackwardTiles<HD, false> Full;
    if (causal)
        return c.block_m == Causal::BLOCK_M && c.dk_from_smem == (int)Causal::DK_FROM_SMEM && c.schedule == Causal::SCHEDULE;
    return c.block_m == Full::BLOCK_M && c.dk_from_smem == (int)Full::DK_FROM_SMEM && c.schedule == Full::SCHEDULE;
}
static bool backward_is_chosen(const BackwardCandidate& c, int causal) {
    if (!c.block_m || strstr(c.name, "determ")) return false;
    switch (c.hd) {
        case 64: return backward_chosen<64>(c, causal);
        case 80: return backward_chosen<80>(c, causal);
        case 96: return backward_chosen<96>(c, causal);
        default: return backward_chosen<128>(c, causal);
    }
}

static float median_ms(std::vector<float>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

__global__ void fill_random_bf16(__nv_bfloat16* x, size_t n, unsigned long long seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(((float)(z >> 40) / (float)(1ull << 24)) * 2.f - 1.f);
}

static double rel_error_bf16(const __nv_bfloat16* a_dev, const __nv_bfloat16* b_dev, size_t n) {
    std::vector<__nv_bfloat16> a(n), b(n);
    ATTN_CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * 2, cudaMemcpyDeviceToHost));
    ATTN_CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
        if (!isfinite(x)) return INFINITY;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

template <typename F>
static float time_ms(F&& run, int runs, cudaStream_t stream) {
    cudaEvent_t start, stop;
    ATTN_CUDA_CHECK(cudaEventCreate(&start));
    ATTN_CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) run();
    std::vector<float> times;
    for (int i = 0; i < runs; i++) {
        ATTN_CUDA_CHECK(cudaEventRecord(start, stream));
        run();
        ATTN_CUDA_CHECK(cudaEventRecord(stop, stream));
        ATTN_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms;
        ATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    ATTN_CUDA_CHECK(cudaEventDestroy(start));
    ATTN_CUDA_CHECK(cudaEventDestroy(stop));
    return median_ms(times);
}

typedef struct {
    int runs, time_forward, time_backward, chosen_only;
    std::vector<int> seqlens, head_dims, masks;  // masks: 0 non-causal, 1 causal
} TuneOptions;

// One grid point's inputs, outputs and workspace (bf16 random q, k, v and dO; outputs poisoned per
// candidate), and the parameters of both passes over them.
typedef struct {
    int hd, causal, T, B, NH;
    size_t n;  // elements of one of q, k, v, out: B·T·NH·HD
    __nv_bfloat16 *qkv, *out, *out_first, *dout, *dqkv, *dqkv_first;
    float *lse, *work;
    Flash2ForwardParams fp;
    Flash2BackwardParams bp;
    double fwd_flops;
} TunePoint;

static TunePoint make_point(int hd, int causal, int T) {
    const int tokens = 16384, hidden = hd == 80 ? 2560 : 2048;  // GPT3-2.7B has 32 heads of 80; the others the grid's 2048
    TunePoint pt;
    pt.hd = hd;
    pt.causal = causal;
    pt.T = T;
    pt.NH = hidden / hd;
    pt.B = tokens / T;
    pt.n = (size_t)pt.B * T * pt.NH * hd;
    const size_t n = pt.n;
    ATTN_CUDA_CHECK(cudaMalloc(&pt.qkv, 3 * n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.dqkv, 3 * n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.dqkv_first, 3 * n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.out, n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.out_first, n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.dout, n * 2));
    ATTN_CUDA_CHECK(cudaMalloc(&pt.lse, (size_t)pt.B * pt.NH * T * 4));
    // room for either kernel family's workspace (flash2_backward.cu takes the larger)
    const size_t work_bytes = 2 * n * 4 + 2 * (size_t)pt.B * pt.NH * (T + 128) * 4 + (size_t)pt.B * pt.NH * (T / 64 + 2) * 4;
    ATTN_CUDA_CHECK(cudaMalloc(&pt.work, work_bytes));
    fill_random_bf16<<<(unsigned)((3 * n + 255) / 256), 256>>>(pt.qkv, 3 * n, 1);
    fill_random_bf16<<<(unsigned)((n + 255) / 256), 256>>>(pt.dout, n, 2);
    const long stride = 3L * pt.NH * hd, row = (long)pt.NH * hd;
    Flash2ForwardParams& fp = pt.fp;
    memset(&fp, 0, sizeof(fp));
    fp.q = pt.qkv;
    fp.k = pt.qkv + row;
    fp.v = pt.qkv + 2 * row;
    fp.out = pt.out;
    fp.lse = pt.lse;
    fp.qkv_stride = fp.kv_stride = stride;
    fp.out_stride = row;
    fp.T = T;
    fp.NH = fp.NKV = pt.NH;  // multi-head
    fp.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    fp.B = pt.B;
    fp.tile_counter = causal ? (unsigned long long*)pt.work : NULL;  // as flash2_forward.cu
    Flash2BackwardParams& bp = pt.bp;
    memset(&bp, 0, sizeof(bp));
    bp.q = fp.q;
    bp.k = fp.k;
    bp.v = fp.v;
    bp.out = pt.out;
    bp.dout = pt.dout;
    bp.lse = pt.lse;
    bp.dq = pt.dqkv;
    bp.dk = pt.dqkv + row;
    bp.dv = pt.dqkv + 2 * row;
    bp.dq_accum = pt.work;
    bp.d_rows = pt.work + n;
    bp.lse_log2 = bp.d_rows + (size_t)pt.B * pt.NH * T;
    bp.qkv_stride = bp.kv_stride = bp.dqkv_stride = bp.dkv_stride = stride;
    bp.out_stride = row;
    bp.T = T;
    bp.NH = bp.NKV = pt.NH;
    bp.lse_rows = T;
    bp.scale = 1.f / sqrtf((float)hd);
    bp.scale_log2 = bp.scale * 1.4426950408889634f;
    pt.fwd_flops = 4.0 * pt.B * (double)T * T * hd * pt.NH / (causal ? 2 : 1);
    return pt;
}

static void free_point(TunePoint& pt) {
    ATTN_CUDA_CHECK(cudaFree(pt.qkv));
    ATTN_CUDA_CHECK(cudaFree(pt.dqkv));
    ATTN_CUDA_CHECK(cudaFree(pt.dqkv_first));
    ATTN_CUDA_CHECK(cudaFree(pt.out));
    ATTN_CUDA_CHECK(cudaFree(pt.out_first));
    ATTN_CUDA_CHECK(cudaFree(pt.dout));
    ATTN_CUDA_CHECK(cudaFree(pt.lse));
    ATTN_CUDA_CHECK(cudaFree(pt.work));
}

// One result line; the first candidate (the mma.sync kernel) is the reference, error 0.
static void print_result(const char* name, bool chosen, const TunePoint& pt, double tflops, double err) {
    printf("%-30s%s %4d %6d %6d  %7.1f  %.1e %s\n", name, chosen ? "*" : " ", pt.hd, pt.causal, pt.T, tflops, err,
           !(err <= 1e-2) ? "WRONG" : "");
}

// Every forward candidate of the point's head dim (with --chosen, the reference and the library's
// shape only), outputs checked against the first's.
static void tune_forward(TunePoint& pt, const TuneOptions& opt, cudaStream_t stream) {
    bool first = true;
    for (const ForwardCandidate& cand : FORWARD) {
        const bool chosen = forward_is_chosen(cand, pt.causal, pt.T);
        if (cand.hd != pt.hd || (opt.chosen_only && !first && !chosen)) continue;
        ATTN_CUDA_CHECK(cudaMemset(pt.out, 0xFF, pt.n * 2));  // poisoned: an element no run writes stays NaN
        const float ms = time_ms([&] { cand.launch[pt.causal](&pt.fp, pt.B, stream); }, opt.runs, stream);
        ATTN_CUDA_CHECK(cudaDeviceSynchronize());
        double err = 0;
        if (first) ATTN_CUDA_CHECK(cudaMemcpy(pt.out_first, pt.out, pt.n * 2, cudaMemcpyDeviceToDevice));
        else err = rel_error_bf16(pt.out, pt.out_first, pt.n);
        print_result(cand.name, chosen, pt, pt.fwd_flops / ms / 1e9, err);
        first = false;
    }
}

// The same for the backward, after the first forward candidate has made out and lse.
static void tune_backward(TunePoint& pt, const TuneOptions& opt, cudaStream_t stream) {
    for (const ForwardCandidate& cand : FORWARD)
        if (cand.hd == pt.hd) {
            cand.launch[pt.causal](&pt.fp, pt.B, stream);
            break;
        }
    bool first = true;
    for (const BackwardCandidate& cand : BACKWARD) {
        const bool chosen = backward_is_chosen(cand, pt.causal);
        if (cand.hd != pt.hd || (opt.chosen_only && !first && !chosen)) continue;
        ATTN_CUDA_CHECK(cudaMemset(pt.dqkv, 0xFF, 3 * pt.n * 2));  // poisoned, as the forward's out
        const float ms = time_ms([&] { cand.launch[pt.causal](&pt.bp, pt.B, stream); }, opt.runs, stream);
        ATTN_CUDA_CHECK(cudaDeviceSynchronize());
        double err = 0;
        if (first) ATTN_CUDA_CHECK(cudaMemcpy(pt.dqkv_first, pt.dqkv, 3 * pt.n * 2, cudaMemcpyDeviceToDevice));
        else err = rel_error_bf16(pt.dqkv, pt.dqkv_first, 3 * pt.n);
        print_result(cand.name, chosen, pt, 2.5 * pt.fwd_flops / ms / 1e9, err);
        first = false;
    }
}

static std::vector<int> parse_int_list(const char* text) {
    std::vector<int> list;
    std::vector<char> copy(text, text + strlen(text) + 1);
    for (char* tok = strtok(copy.data(), ","); tok; tok = strtok(NULL, ",")) list.push_back(atoi(tok));
    return list;
}

static void print_usage(const char* argv0) {
    printf("usage: %s [--runs N] [--seqlens 512,2048,...] [--head-dims 64,80,96,128] "
           "[--pass forward|backward|both] [--causal 0|1|both] [--chosen]\n"
           "  --chosen  time only the reference and the shapes the library runs (marked '*')\n",
           argv0);
}

// 0 when the options are usable, else the exit status (2: a bad option, 1 printed help: 0).
static int parse_options(int argc, char** argv, TuneOptions* opt) {
    opt->runs = 20;
    opt->time_forward = opt->time_backward = 1;
    opt->chosen_only = 0;
    opt->seqlens = {512, 1024, 2048, 4096, 8192, 16384};
    opt->head_dims = {64, 80, 96, 128};
    opt->masks = {0, 1};
    static struct option options[] = {{"runs", required_argument, 0, 'r'},   {"seqlens", required_argument, 0, 's'},
                                      {"head-dims", required_argument, 0, 'd'}, {"pass", required_argument, 0, 'p'},
                                      {"causal", required_argument, 0, 'c'},    {"chosen", no_argument, 0, 'C'},
                                      {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "r:s:d:p:c:Ch", options, NULL)) != -1) {
        if (c == 'r') opt->runs = atoi(optarg);
        else if (c == 's') opt->seqlens = parse_int_list(optarg);
        else if (c == 'd') opt->head_dims = parse_int_list(optarg);
        else if (c == 'C') opt->chosen_only = 1;
        else if (c == 'p' && (!strcmp(optarg, "forward") || !strcmp(optarg, "backward") || !strcmp(optarg, "both"))) {
            opt->time_forward = strcmp(optarg, "backward") != 0;
            opt->time_backward = strcmp(optarg, "forward") != 0;
        } else if (c == 'c' && (!strcmp(optarg, "0") || !strcmp(optarg, "1") || !strcmp(optarg, "both"))) {
            opt->masks = !strcmp(optarg, "both") ? std::vector<int>{0, 1} : std::vector<int>{atoi(optarg)};
        } else if (c == 'p' || c == 'c') {
            fprintf(stderr, "error: --%s %s: expected %s\n", c == 'p' ? "pass" : "causal", optarg,
                    c == 'p' ? "forward, backward or both" : "0, 1 or both");
            return 2;
        } else {
            print_usage(argv[0]);
            return c == 'h' ? 1 : 2;
        }
    }
    if (opt->runs < 1) {
        fprintf(stderr, "error: --runs %d: expected at least 1\n", opt->runs);
        return 2;
    }
    for (int hd : opt->head_dims)
        if (hd != 64 && hd != 80 && hd != 96 && hd != 128) {
            fprintf(stderr, "error: head dim %d: flash2 has no kernel for it (64, 80, 96, 128)\n", hd);
            return 2;
        }
    for (int T : opt->seqlens)
        if (T < 1 || T > 16384) {
            fprintf(stderr, "error: sequence length %d: expected 1 to 16384 (a point has 16384 tokens)\n", T);
            return 2;
        }
    return 0;
}

int main(int argc, char** argv) {
    // A line at a time even into a file or pipe, so a run stopped by a time limit keeps what it timed.
    setvbuf(stdout, NULL, _IOLBF, 0);
    TuneOptions opt;
    const int status = parse_options(argc, argv, &opt);
    if (status) return status == 1 ? 0 : status;
    cudaStream_t stream = 0;
    printf("%-30s %4s %6s %6s  %s\n", "candidate", "hd", "causal", "T", "TFLOP/s (rel. error vs first)");
    for (int hd : opt.head_dims)
        for (int causal : opt.masks)
            for (int T : opt.seqlens) {
                TunePoint pt = make_point(hd, causal, T);
                if (opt.time_forward) tune_forward(pt, opt, stream);
                if (opt.time_backward) tune_backward(pt, opt, stream);
                free_point(pt);
            }
    return 0;
}
