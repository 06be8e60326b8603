// flash2_tune.cu: times candidate block shapes of the flash2 forward and backward kernels on the
// attention benchmark grid (hidden 2048, batch·seqlen = 16k tokens, bf16 random inputs), so the
// choice in flash2_forward.cu / flash2_backward.cu rests on measurements. Not part of the trainer.
//
//   make build/flash2_tune && build/flash2_tune [--runs N] [--seqlens 512,2048,8192] [--head-dims 64,128]
//                                               [--pass forward|backward|both]
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

#include "flash2_backward_hopper.cuh"
#include "flash2_backward_kernel.cuh"
#include "flash2_forward_hopper.cuh"
#include "flash2_forward_kernel.cuh"
#include "flash2_tiles.h"

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

// Whether a candidate is the shape flash2_tiles.h picks (ws kernels only).
template <int HD, bool CAUSAL>
static bool forward_chosen(const ForwardCandidate& c, int T) {
    typedef Flash2ForwardTiles<HD, CAUSAL> Tiles;
    const int consumers = Tiles::LONG_T > 0 && T >= Tiles::LONG_T ? Tiles::LONG_CONSUMERS : Tiles::CONSUMERS;
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
    CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * 2, cudaMemcpyDeviceToHost));
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
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) run();
    std::vector<float> times;
    for (int i = 0; i < runs; i++) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        run();
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median_ms(times);
}

int main(int argc, char** argv) {
    // A line at a time even into a file or pipe, so a run stopped by a time limit keeps what it timed.
    setvbuf(stdout, NULL, _IOLBF, 0);
    int runs = 20;
    bool time_forward = true, time_backward = true;
    std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384}, head_dims = {64, 80, 96, 128};
    static struct option options[] = {{"runs", required_argument, 0, 'r'}, {"seqlens", required_argument, 0, 's'},
                                      {"head-dims", required_argument, 0, 'd'}, {"pass", required_argument, 0, 'p'},
                                      {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "r:s:d:p:h", options, NULL)) != -1) {
        if (c == 'r') runs = atoi(optarg);
        else if (c == 'p') {
            if (strcmp(optarg, "forward") && strcmp(optarg, "backward") && strcmp(optarg, "both")) {
                fprintf(stderr, "error: --pass %s: expected forward, backward or both\n", optarg);
                return 2;
            }
            time_forward = strcmp(optarg, "backward") != 0;
            time_backward = strcmp(optarg, "forward") != 0;
        }
        else if (c == 's' || c == 'd') {
            std::vector<int>& list = c == 's' ? seqlens : head_dims;
            list.clear();
            for (char* tok = strtok(optarg, ","); tok; tok = strtok(NULL, ",")) list.push_back(atoi(tok));
        } else {
            printf("usage: %s [--runs N] [--seqlens 512,2048,...] [--head-dims 64,80,96,128] "
                   "[--pass forward|backward|both]\n",
                   argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    const int tokens = 16384;
    cudaStream_t stream = 0;
    printf("%-30s %4s %6s %6s  %s\n", "candidate", "hd", "causal", "T", "TFLOP/s (rel. error vs first)");
    for (int hd : head_dims) {
        if (hd != 64 && hd != 80 && hd != 96 && hd != 128) {
            printf("head dim %d: flash2 has no kernel for it (64, 80, 96, 128)\n", hd);
            return 2;
        }
        const int hidden = hd == 80 ? 2560 : 2048;  // GPT3-2.7B has 32 heads of 80; the others the grid's 2048
        for (int causal = 0; causal < 2; causal++) {
            for (int T : seqlens) {
                const int NH = hidden / hd, B = tokens / T;
                const size_t n = (size_t)B * T * NH * hd;
                __nv_bfloat16 *qkv, *out, *out_first, *dout, *dqkv, *dqkv_first;
                float *lse, *work;
                CUDA_CHECK(cudaMalloc(&qkv, 3 * n * 2));
                CUDA_CHECK(cudaMalloc(&dqkv, 3 * n * 2));
                CUDA_CHECK(cudaMalloc(&dqkv_first, 3 * n * 2));
                CUDA_CHECK(cudaMalloc(&out, n * 2));
                CUDA_CHECK(cudaMalloc(&out_first, n * 2));
                CUDA_CHECK(cudaMalloc(&dout, n * 2));
                CUDA_CHECK(cudaMalloc(&lse, (size_t)B * NH * T * 4));
                // room for either kernel family's workspace (flash2_backward.cu takes the larger)
                const size_t work_bytes = 2 * n * 4 + 2 * (size_t)B * NH * (T + 128) * 4 + (size_t)B * NH * (T / 64 + 2) * 4;
                CUDA_CHECK(cudaMalloc(&work, work_bytes));
                fill_random_bf16<<<(unsigned)((3 * n + 255) / 256), 256>>>(qkv, 3 * n, 1);
                fill_random_bf16<<<(unsigned)((n + 255) / 256), 256>>>(dout, n, 2);
                const long stride = 3L * NH * hd;
                Flash2ForwardParams fp = {qkv,    qkv + NH * hd, qkv + 2 * NH * hd,
                                          out,    lse,           stride,
                                          stride, (long)NH * hd, T,
                                          NH,     NH,            1.4426950408889634f / sqrtf((float)hd),
                                          B,      causal ? (unsigned long long*)work : NULL, 0};  // multi-head: NKV = NH; the
                                                                                 // tile counter as flash2_forward.cu
                Flash2BackwardParams bp;
                bp.q = fp.q;
                bp.k = fp.k;
                bp.v = fp.v;
                bp.out = out;
                bp.dout = dout;
                bp.lse = lse;
                bp.dq = dqkv;
                bp.dk = dqkv + NH * hd;
                bp.dv = dqkv + 2 * NH * hd;
                bp.dq_accum = work;
                bp.d_rows = work + n;
                bp.lse_log2 = bp.d_rows + (size_t)B * NH * T;
                bp.qkv_stride = stride;
                bp.kv_stride = stride;
                bp.out_stride = (long)NH * hd;
                bp.dqkv_stride = stride;
                bp.dkv_stride = stride;
                bp.T = T;
                bp.NH = NH;
                bp.NKV = NH;
                bp.lse_rows = T;
                bp.scale = 1.f / sqrtf((float)hd);
                bp.scale_log2 = bp.scale * 1.4426950408889634f;
                const double fwd_flops = 4.0 * B * (double)T * T * hd * NH / (causal ? 2 : 1);

                bool first = true;
                for (const ForwardCandidate& cand : FORWARD) {
                    if (cand.hd != hd || !time_forward) continue;
                    CUDA_CHECK(cudaMemset(out, 0xFF, n * 2));  // poisoned: an element no run writes stays NaN
                    float ms = time_ms([&] { cand.launch[causal](&fp, B, stream); }, runs, stream);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    double err = 0;
                    if (first) CUDA_CHECK(cudaMemcpy(out_first, out, n * 2, cudaMemcpyDeviceToDevice));
                    else err = rel_error_bf16(out, out_first, n);
                    printf("%-30s%s %4d %6d %6d  %7.1f  %.1e %s\n", cand.name, forward_is_chosen(cand, causal, T) ? "*" : " ",
                           hd, causal, T, fwd_flops / ms / 1e9, err, !(err <= 1e-2) ? "WRONG" : "");
                    first = false;
                }
                // The backward needs the forward's out and lse: restore the first candidate's.
                for (const ForwardCandidate& cand : FORWARD)
                    if (cand.hd == hd) {
                        cand.launch[causal](&fp, B, stream);
                        break;
                    }
                first = true;
                for (const BackwardCandidate& cand : BACKWARD) {
                    if (cand.hd != hd || !time_backward) continue;
                    CUDA_CHECK(cudaMemset(dqkv, 0xFF, 3 * n * 2));  // poisoned, as the forward's out
                    float ms = time_ms([&] { cand.launch[causal](&bp, B, stream); }, runs, stream);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    double err = 0;
                    if (first) CUDA_CHECK(cudaMemcpy(dqkv_first, dqkv, 3 * n * 2, cudaMemcpyDeviceToDevice));
                    else err = rel_error_bf16(dqkv, dqkv_first, 3 * n);
                    printf("%-30s%s %4d %6d %6d  %7.1f  %.1e %s\n", cand.name, backward_is_chosen(cand, causal) ? "*" : " ", hd,
                           causal, T, 2.5 * fwd_flops / ms / 1e9, err, !(err <= 1e-2) ? "WRONG" : "");
                    first = false;
                }
                fflush(stdout);
                CUDA_CHECK(cudaFree(qkv));
                CUDA_CHECK(cudaFree(dqkv));
                CUDA_CHECK(cudaFree(dqkv_first));
                CUDA_CHECK(cudaFree(out));
                CUDA_CHECK(cudaFree(out_first));
                CUDA_CHECK(cudaFree(dout));
                CUDA_CHECK(cudaFree(lse));
                CUDA_CHECK(cudaFree(work));
            }
        }
    }
    return 0;
}
