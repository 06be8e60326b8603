// gpt_sample.cuh: the next token of each sequence drawn on the GPU from its logits, in one kernel
// launch that also feeds the token to the next decode step and into the token ring: nothing goes to
// the host, so it is captured in the decode step's CUDA graph (gpt_generator.cuh).
//
//   logits    (B, Vp) bf16 on the GPU, the V real tokens first (padding never drawn)
//   counters  (B) uint64 on the GPU: tokens drawn so far per sequence; the draw's random number and
//             its slot in the ring come from it, and it is advanced by the kernel
//   next      (B) int32: the drawn token (the next step's input, d->tokens)
//   ring      (ring_rows, B) int32: the drawn token also at row counters[b] % ring_rows
//
// Rules (one definition, which test/test_gpu_generate.cu's host reference repeats):
//   temperature 0: greedy, the first index of the largest logit (NaN counts as −∞).
//   otherwise the candidates are all V tokens (top_k 0 or ≥ V) or the top_k largest (ties at the
//   k-th value broken by the lower index), weight w_i = exp((x_i − max)/temperature), and the token is
//   the first candidate in index order whose running sum of weights passes u·Σw, with
//   u = gen_uniform(seed, b, counters[b]) in [0, 1) (the last candidate if rounding leaves u·Σw past
//   the sum). top_k = 1 is greedy for every seed.
// Random numbers: counter-based (splitmix64 of a per-sequence state at the counter), so a draw
// depends only on (seed, sequence, how many tokens it drew before): the same seed repeats, in
// graphs or not, at any batch size.
//
// How it runs: one block of GEN_SAMPLE_THREADS per sequence. Warp w owns a contiguous slice of the
// row, read in rows of 32 tokens (lane l takes the l-th token of each row, coalesced). The row is read
// from L2 (it was just written by the LM head): once for the maximum and its index, twice more for
// top-k's threshold (a radix select on the 16-bit bf16 keys: the high byte's histogram, then the low
// byte's among the tokens of the chosen high byte) and once for the ties at the threshold, once for
// the weights; then the one warp whose slice holds u·Σw reads its slice again to find the token.
// Every sum runs in a fixed order: the same logits, seed and counter give the same token every time.
#ifndef GPT_SAMPLE_CUH
#define GPT_SAMPLE_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "attention/common/kernel_trace.cuh"
#include "layers/cuda_common.h"

#define GEN_SAMPLE_THREADS 1024
#define GEN_SAMPLE_WARPS (GEN_SAMPLE_THREADS / 32)

// ---- random numbers (host and device) --------------------------------------------------------------

static __host__ __device__ inline uint64_t gen_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) (24 bits) for draw `counter` of sequence b: splitmix64's counter-th output from
// the sequence's own state, itself mixed from the seed and b.
static __host__ __device__ inline float gen_uniform(uint64_t seed, int b, uint64_t counter) {
    const uint64_t state = gen_mix64(seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(b + 1)));
    const uint64_t z = gen_mix64(state + 0x9E3779B97F4A7C15ull * (counter + 1));
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// The 16-bit key of a bf16 value that orders like the value (NaN is given −∞'s key, −0 +0's: keys
// are equal exactly when the values compare equal).
static __host__ __device__ inline unsigned gen_key(uint16_t bits) {
    if ((bits & 0x7FFFu) > 0x7F80u) bits = 0xFF80u;  // NaN → −∞
    if (bits == 0x8000u) bits = 0;                   // −0 → +0
    return (bits & 0x8000u) ? (~bits & 0xFFFFu) : (bits | 0x8000u);
}

typedef struct {
    float inv_temperature;  // 0: greedy
    int top_k;              // 0 or ≥ V: all tokens
    uint64_t seed;
} GenSampling;

// ---- the kernel's pieces -------------------------------------------------------------------------

struct GenSampleShared {
    float best_value[GEN_SAMPLE_WARPS];
    int best_index[GEN_SAMPLE_WARPS];
    unsigned hist[256];
    unsigned warp_count[GEN_SAMPLE_WARPS];  // ties at the threshold per warp, then their exclusive prefix
    float warp_sum[GEN_SAMPLE_WARPS];
    float max_value;
    int argmax;
    unsigned threshold, above, need_eq;  // the k-th key, tokens above it, ties at it to take
    int chosen;
};

static __device__ inline float gen_value(uint16_t bits) {
    if ((bits & 0x7FFFu) > 0x7F80u) return -INFINITY;
    return __uint_as_float((unsigned)bits << 16);
}

// (value, index) max with the lower index on ties, over the block; every thread gets it in sh.
static __device__ void gen_block_argmax(float v, int i, GenSampleShared* sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
    }
    if (lane == 0) sh->best_value[warp] = v, sh->best_index[warp] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        float bv = sh->best_value[0];
        int bi = sh->best_index[0];
        for (int w = 1; w < GEN_SAMPLE_WARPS; w++)
            if (sh->best_value[w] > bv || (sh->best_value[w] == bv && sh->best_index[w] < bi))
                bv = sh->best_value[w], bi = sh->best_index[w];
        sh->max_value = bv, sh->argmax = bi;
    }
    __syncthreads();
}

// Thread 0: the bin of the histogram (from the top) where the count reaches k; *above = the count of
// the bins above it.
static __device__ void gen_find_bin(const unsigned* hist, unsigned k, unsigned* bin, unsigned* above) {
    unsigned sum = 0;
    for (int h = 255; h >= 0; h--) {
        if (sum + hist[h] >= k) {
            *bin = (unsigned)h, *above = sum;
            return;
        }
        sum += hist[h];
    }
    *bin = 0, *above = sum;
}

// The top-k threshold: sh->threshold = the k-th largest key, sh->above = the tokens above it,
// sh->need_eq = how many of the tokens at it (the first by index) are candidates.
static __device__ void gen_top_k_threshold(const uint16_t* row, int begin, int end, unsigned k, GenSampleShared* sh) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh->hist[i] = 0;
    __syncthreads();
    for (int i = begin + threadIdx.x % 32; i < end; i += 32) atomicAdd(&sh->hist[gen_key(row[i]) >> 8], 1u);
    __syncthreads();
    __shared__ unsigned high, above_high;
    if (threadIdx.x == 0) gen_find_bin(sh->hist, k, &high, &above_high);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh->hist[i] = 0;
    __syncthreads();
    for (int i = begin + threadIdx.x % 32; i < end; i += 32) {
        const unsigned key = gen_key(row[i]);
        if ((key >> 8) == high) atomicAdd(&sh->hist[key & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned low, above_low;
        gen_find_bin(sh->hist, k - above_high, &low, &above_low);
        sh->threshold = (high << 8) | low;
        sh->above = above_high + above_low;
        sh->need_eq = k - sh->above;
    }
    __syncthreads();
}

// Ties at the threshold per warp's slice, then their exclusive prefix over the warps (index order).
static __device__ void gen_count_ties(const uint16_t* row, int begin, int end, GenSampleShared* sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned count = 0;
    for (int base = begin; base < end; base += 32) {
        const int i = base + lane;
        const bool eq = i < end && gen_key(row[i]) == sh->threshold;
        count += __popc(__ballot_sync(0xffffffffu, eq));
    }
    if (lane == 0) sh->warp_count[warp] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned run = 0;
        for (int w = 0; w < GEN_SAMPLE_WARPS; w++) {
            const unsigned c = sh->warp_count[w];
            sh->warp_count[w] = run, run += c;
        }
    }
    __syncthreads();
}

// The weight of each of the warp's 32 tokens of the row at `base` (0 for non-candidates); *ties runs
// over the ties at the threshold seen so far in index order (the first need_eq of them are candidates).
static __device__ inline float gen_weight(const uint16_t* row, int base, int end, int lane, float inv_t,
                                          const GenSampleShared* sh, bool top_k, unsigned* ties) {
    const int i = base + lane;
    const uint16_t bits = i < end ? row[i] : (uint16_t)0xFF80u;
    const unsigned key = gen_key(bits);
    bool take = i < end;
    if (top_k) {
        const bool eq = take && key == sh->threshold;
        const unsigned mask = __ballot_sync(0xffffffffu, eq);
        const unsigned rank = *ties + __popc(mask & ((1u << lane) - 1u));
        take = take && (key > sh->threshold || (eq && rank < sh->need_eq));
        *ties += __popc(mask);
    }
    return take ? __expf((gen_value(bits) - sh->max_value) * inv_t) : 0.0f;
}

// Inclusive prefix sum over the warp's lanes.
static __device__ inline float gen_warp_scan(float x) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const float y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// ---- the kernel -----------------------------------------------------------------------------------

// One block per sequence (see the top of the file).
static __global__ void __launch_bounds__(GEN_SAMPLE_THREADS)
    gen_sample_kernel(const __nv_bfloat16* __restrict__ logits, int Vp, int V, GenSampling g,
                      unsigned long long* counters, int* next, int* ring, int ring_rows, int B) {
    __shared__ GenSampleShared sh;
    KernelTraceStamp trace = kernel_trace_begin();
    const int b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint16_t* row = (const uint16_t*)(logits + (size_t)b * Vp);
    const int slice = (V + 32 * GEN_SAMPLE_WARPS - 1) / (32 * GEN_SAMPLE_WARPS) * 32;  // tokens per warp
    const int begin = min(V, warp * slice), end = min(V, begin + slice);
    float best = -INFINITY;
    int best_i = V;  // no token yet
    for (int i = begin + lane; i < end; i += 32) {
        const float v = gen_value(row[i]);
        if (v > best || best_i == V) best = v, best_i = i;
    }
    gen_block_argmax(best, best_i, &sh);
    const bool top_k = g.top_k > 0 && g.top_k < V;
    if (g.inv_temperature > 0.0f) {  // (top-k 1 goes this way too: its one candidate is the argmax)
        if (top_k) {
            gen_top_k_threshold(row, begin, end, (unsigned)g.top_k, &sh);
            gen_count_ties(row, begin, end, &sh);
        }
        // the weights' sum per warp, in the order the search below adds them
        unsigned ties = top_k ? sh.warp_count[warp] : 0;
        float sum = 0.0f;
        for (int base = begin; base < end; base += 32)
            sum += __shfl_sync(0xffffffffu, gen_warp_scan(gen_weight(row, base, end, lane, g.inv_temperature, &sh,
                                                                     top_k, &ties)), 31);
        if (lane == 0) sh.warp_sum[warp] = sum;
        __syncthreads();
        const unsigned long long c = counters[b];
        // the warp whose slice holds u·Σw: thread 0 walks the warps' sums in order
        if (threadIdx.x == 0) {
            float total = 0.0f;
            for (int w = 0; w < GEN_SAMPLE_WARPS; w++) total += sh.warp_sum[w];
            const float target = gen_uniform(g.seed, b, c) * total;
            float run = 0.0f;
            int w_pick = -1;
            for (int w = 0; w < GEN_SAMPLE_WARPS; w++) {
                if (sh.warp_sum[w] > 0.0f) w_pick = w;
                if (sh.warp_sum[w] > 0.0f && target < run + sh.warp_sum[w]) break;
                run += sh.warp_sum[w];
            }
            sh.best_value[0] = target - run;  // what is left to pass inside the chosen warp's slice
            sh.chosen = w_pick;
        }
        __syncthreads();
        if (warp == sh.chosen) {
            const float left = sh.best_value[0];
            unsigned ties2 = top_k ? sh.warp_count[warp] : 0;
            float run = 0.0f;
            int pick = -1, last = -1;
            for (int base = begin; base < end && pick < 0; base += 32) {
                const float w = gen_weight(row, base, end, lane, g.inv_temperature, &sh, top_k, &ties2);
                const float cum = run + gen_warp_scan(w);
                const unsigned passed = __ballot_sync(0xffffffffu, w > 0.0f && left < cum);
                const unsigned any = __ballot_sync(0xffffffffu, w > 0.0f);
                if (passed) pick = base + __ffs(passed) - 1;
                if (any) last = base + 31 - __clz(any);
                run = __shfl_sync(0xffffffffu, cum, 31);
            }
            // rounding past the end: the last candidate (none: all weights NaN, the argmax stays)
            if (lane == 0 && (pick >= 0 || last >= 0)) sh.argmax = pick >= 0 ? pick : last;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const unsigned long long c = counters[b];
        const int token = sh.argmax;
        next[b] = token;
        ring[(size_t)(c % (unsigned long long)ring_rows) * B + b] = token;
        counters[b] = c + 1;
    }
    kernel_trace_end(&trace, 'D', 0);
}

// Draws the next token of each of B sequences (see the top of the file) on `stream`.
static void gen_sample(const __nv_bfloat16* logits, int B, int Vp, int V, GenSampling g, unsigned long long* counters,
                       int* next, int* ring, int ring_rows, cudaStream_t stream) {
    gen_sample_kernel<<<B, GEN_SAMPLE_THREADS, 0, stream>>>(logits, Vp, V, g, counters, next, ring, ring_rows, B);
    CUDA_CHECK(cudaGetLastError());
}

// The sampling settings of a temperature (0: greedy), top-k (0: all) and seed.
static GenSampling gen_sampling(double temperature, int top_k, uint64_t seed) {
    GenSampling g;
    g.inv_temperature = temperature > 0.0 ? (float)(1.0 / temperature) : 0.0f;
    g.top_k = top_k;
    g.seed = seed;
    return g;
}

#endif  // GPT_SAMPLE_CUH
