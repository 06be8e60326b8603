// Experiment: where a forward tile's time goes at short lengths. clock64 stamps per (block, tile,
// consumer warpgroup) from the FLASH2_FORWARD_TRACE hooks; prints mean intervals in clocks.
#define FLASH2_FORWARD_TRACE 1
#include <stdio.h>
#include <vector>
#include <algorithm>
#include "attention/flash2_forward_hopper.cuh"

__global__ void fill(__nv_bfloat16* x, size_t n, unsigned long long seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; z ^= z >> 31;
    x[i] = __float2bfloat16(((float)(z >> 40) / (float)(1ull << 24)) * 2.f - 1.f);
}

typedef void (*Launch)(const Flash2ForwardParams*, int, cudaStream_t);

static void run(const char* name, Launch launch, int hd, int T, int hidden, int causal, int consumers) {
    const int NH = hidden / hd, B = 16384 / T;
    const size_t n = (size_t)B * T * NH * hd;
    __nv_bfloat16 *qkv, *out; float* lse; int* work;
    CUDA_CHECK(cudaMalloc(&qkv, 3 * n * 2)); CUDA_CHECK(cudaMalloc(&out, n * 2));
    CUDA_CHECK(cudaMalloc(&lse, (size_t)B * NH * T * 4)); CUDA_CHECK(cudaMalloc(&work, 64));
    fill<<<(unsigned)((3 * n + 255) / 256), 256>>>(qkv, 3 * n, 1);
    const long stride = 3L * NH * hd;
    Flash2ForwardParams p = {qkv, qkv + NH * hd, qkv + 2 * NH * hd, out, lse, stride, stride, (long)NH * hd, T, NH, NH,
                             1.4426950408889634f / sqrtf((float)hd), B, causal ? work : NULL};
    for (int i = 0; i < 5; i++) launch(&p, B, 0);
    std::vector<unsigned long long> zero(132 * 256 * 4 * 16, 0), tr(132 * 256 * 4 * 16);
    CUDA_CHECK(cudaMemcpyToSymbol(g_fwd_trace, zero.data(), zero.size() * 8));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a); launch(&p, B, 0); cudaEventRecord(b); CUDA_CHECK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    CUDA_CHECK(cudaMemcpyFromSymbol(tr.data(), g_fwd_trace, tr.size() * 8));
    // per consumer tile: intervals; per producer tile: Q issue vs consumer arrival
    double sum[8] = {0}; long cnt = 0; double gap = 0; long gcnt = 0; double qlead = 0, qlat = 0; long qcnt = 0;
    double ex[9] = {0}; long excnt = 0, lcnt = 0;
    double per_block = 0; long pbcnt = 0; double live_sum = 0; double span_sum = 0; long blocks_used = 0;
    for (int blk = 0; blk < 132; blk++) {
        int tiles = 0;
        for (int it = 0; it < 256; it++) {
            const unsigned long long* w0 = &tr[((blk * 256 + it) * 4 + 0) * 16];
            if (!w0[6]) break;
            tiles++;
        }
        if (!tiles) continue;
        blocks_used++;
        span_sum += tr[((blk * 256 + tiles - 1) * 4 + 0) * 16 + 6] - tr[((blk * 256) * 4 + 0) * 16 + 0];
        for (int it = 0; it < tiles; it++)
            for (int cw = 0; cw < consumers; cw++) {
                const unsigned long long* e = &tr[((blk * 256 + it) * 4 + cw) * 16];
                const long live = (long)e[7];
                sum[0] += e[1] - e[0];  // wait for Q
                if (live > 0) {
                    sum[1] += e[2] - e[1];  // wait for the first K (and skipped blocks)
                    sum[2] += e[3] - e[2];  // first S: issue to done
                    sum[3] += e[4] - e[3];  // the rest of the block loop
                    if (live > 1) { per_block += (double)(e[4] - e[3]) / (live - 1); pbcnt++; }
                    sum[4] += e[5] - e[4];  // last PV
                    sum[5] += e[6] - e[5];  // epilogue
                    ex[0] += e[8] - e[5]; ex[1] += e[9] - e[8]; ex[2] += e[10] - e[9]; ex[3] += e[6] - e[10]; excnt++;
                    // first loop block: from S0 done (3) to its data (11), turn (12), S (13), softmax (14), PV (15)
                    if (live > 1) {
                        ex[4] += e[11] - e[3]; ex[5] += e[12] - e[11]; ex[6] += e[13] - e[12]; ex[7] += e[14] - e[13];
                        ex[8] += (double)e[15] - (double)e[12]; lcnt++;
                    }
                } else sum[6] += e[6] - e[1];
                live_sum += live;
                cnt++;
                if (it + 1 < tiles) { gap += tr[((blk * 256 + it + 1) * 4 + cw) * 16 + 0] - e[6]; gcnt++; }
                if (cw == 0) {
                    const unsigned long long* pq = &tr[((blk * 256 + it) * 4 + 3) * 16];
                    qlead += (double)e[0] - (double)pq[0];  // >0: Q issued before the consumers looked
                    qlat += (double)e[1] - (double)pq[0];
                    qcnt++;
                }
            }
    }
    printf("%-26s %7.1f us  tiles/blk %5.1f  live %4.2f | qwait %6.0f  kwait %6.0f  S0 %6.0f  "
           "loop %6.0f (%5.0f/blk)  lastPV %5.0f  epi %5.0f  dead %5.0f  gap %5.0f | "
           "Qissue->cons %6.0f  Qissue->ready %6.0f | span %7.0f clk/blk\n",
           name, ms * 1e3, (double)cnt / consumers / blocks_used, live_sum / cnt, sum[0] / cnt, sum[1] / cnt,
           sum[2] / cnt, sum[3] / cnt, per_block / (pbcnt ? pbcnt : 1), sum[4] / cnt, sum[5] / cnt, sum[6] / cnt,
           gap / (gcnt ? gcnt : 1), qlead / qcnt, qlat / qcnt, span_sum / blocks_used);
    printf("    epi: to smem %5.0f  barrier %5.0f  tma issue(t0) %5.0f  rest %5.0f | block1: S0done->data %5.0f  "
           "turn %5.0f  issue->S %5.0f  softmax %5.0f  turn->PVdone %5.0f\n",
           ex[0] / excnt, ex[1] / excnt, ex[2] / excnt, ex[3] / excnt, ex[4] / lcnt, ex[5] / lcnt, ex[6] / lcnt,
           ex[7] / lcnt, ex[8] / lcnt);
    cudaFree(qkv); cudaFree(out); cudaFree(lse); cudaFree(work);
}

int main() {
    printf("clocks per warpgroup and tile, means (SM clock ~1.75 GHz)\n");
    run("d96 causal 512 BN96x3", launch_forward_ws<96, 96, 3, true>, 96, 512, 3072, 1, 3);
    run("d96 causal 1k BN96x3", launch_forward_ws<96, 96, 3, true>, 96, 1024, 3072, 1, 3);
    run("d96 causal 8k BN96x3", launch_forward_ws<96, 96, 3, true>, 96, 8192, 3072, 1, 3);
    run("d96 full 512 BN128x3", launch_forward_ws<96, 128, 3, false>, 96, 512, 3072, 0, 3);
    run("d96 full 8k BN128x3", launch_forward_ws<96, 128, 3, false>, 96, 8192, 3072, 0, 3);
    run("d128 full 512 BN128x2", launch_forward_ws<128, 128, 2, false>, 128, 512, 2048, 0, 2);
    run("d128 full 8k BN128x3", launch_forward_ws<128, 128, 3, false>, 128, 8192, 2048, 0, 3);
    run("d128 causal 512 BN128x2", launch_forward_ws<128, 128, 2, true>, 128, 512, 2048, 1, 2);
    run("d64 full 1k BN128x3", launch_forward_ws<64, 128, 3, false>, 64, 1024, 2048, 0, 3);
    run("d64 full 8k BN128x3", launch_forward_ws<64, 128, 3, false>, 64, 8192, 2048, 0, 3);
    return 0;
}
