// encoder.cuh: token + position embedding, forward and backward.
//
//   forward   out (B, T, C) = wte[tokens[b, t]] + wpe[pos(t)]       bf16, summed in fp32, one rounding
//   backward  dwte (Vp, C) += Σ over (b, t) with tokens[b, t] = v of dout[b, t]   (row v of dwte)
//             dwpe (maxT, C) += Σ_b dout[b, t]                       (row pos(t) of dwpe)
// pos(t) = t, or positions[t] with the _at variants: positions (T) int32 on the GPU, the same for every
// sequence, distinct and < maxT (context parallelism: a rank's T rows are the zigzag share of a longer
// sequence, layers/context_parallel/zigzag.h). Distinct positions keep dwpe's rows one thread's each.
// tokens (B, T) int32 in [0, Vp) (not checked on the GPU: the data loader checks token ids);
// wte (Vp, C), wpe (maxT >= T, C), dout (B, T, C), all bf16. N = B·T rows.
// C must be a multiple of 8 (every hidden size is a multiple of 64) and every pointer 16-byte
// aligned: rows move as 16-byte vectors of 8 bf16. Both are checked, with a clear error.
//
// The backward ADDS into dwte and dwpe (the LM head, tied to wte, adds its gradient there too), and
// is deterministic: bit-identical run to run, with no floating-point atomics. Every sum is
// accumulated in fp32 in a fixed order and added to the bf16 gradient with one rounding:
// - dwpe: one thread per (t, 8 channels) sums dout over b = 0 .. B−1 in order.
// - dwte: the positions are grouped by token id on the GPU (no host work, no synchronization): a
//   stable radix sort (CUB) of the pairs (token, position) makes each token's positions one run of
//   the sorted list, in increasing position order. The sorted list is cut into chunks of
//   ENCODER_BWD_CHUNK entries; one thread per (chunk, 8 channels) walks its chunk in order and sums
//   each run's piece inside the chunk. A run that lies wholly inside one chunk is added to dwte
//   straight away; a run that crosses chunk boundaries leaves its pieces in fp32 scratch (at most
//   two per chunk: slot 0 for the run the chunk starts in, slot 1 for the run it ends in), and a
//   second kernel adds each such run's pieces in chunk order, then to dwte. Work per thread is
//   bounded by the chunk length however often a token repeats (an <|endoftext|>-heavy batch).
// Scratch: encoder_backward_scratch_bytes(N, C, Vp) bytes (3·N ints for the sort, 2 fp32 rows of C
// per chunk, and CUB's temporary storage); it may hold anything on entry.
#ifndef ENCODER_CUH
#define ENCODER_CUH

#include <cub/device/device_radix_sort.cuh>

#include "layers/model/layer_common.cuh"

#define ENCODER_THREADS 256
#define ENCODER_BWD_CHUNK 32  // sorted positions per thread in the dwte backward

// ---- forward ---------------------------------------------------------------------------------------

// One thread per 8 channels of one row: out[row, c..c+7] = wte[tok, c..] + wpe[t, c..].
static __global__ void __launch_bounds__(ENCODER_THREADS)
    encoder_forward_kernel(__nv_bfloat16* __restrict__ out, const int* __restrict__ tokens,
                           const __nv_bfloat16* __restrict__ wte, const __nv_bfloat16* __restrict__ wpe,
                           const int* __restrict__ positions, int T, int C, size_t total_vecs) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total_vecs) return;
    const int vecs = C / 8;
    size_t row = i / vecs;
    int c = (int)(i % vecs) * 8;
    int t = (int)(row % T);
    if (positions) t = positions[t];
    int tok = tokens[row];
    float a[8], b[8];
    bf16x8_unpack(a, load16(wte + (size_t)tok * C + c));
    bf16x8_unpack(b, load16(wpe + (size_t)t * C + c));
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] += b[k];
    store16(out + row * C + c, bf16x8_pack(a));
}

// out (B, T, C) = wte[tokens] + wpe[positions[t]] (positions NULL: wpe[t]); see the top of the file.
static void encoder_forward_at(__nv_bfloat16* out, const int* tokens, const int* positions, const __nv_bfloat16* wte,
                               const __nv_bfloat16* wpe, int B, int T, int C, cudaStream_t stream) {
    LAYER_REQUIRE(B >= 1 && T >= 1 && C >= 8 && C % 8 == 0,
                  "encoder_forward: B = %d, T = %d, C = %d: need B, T >= 1 and C a multiple of 8", B, T, C);
    LAYER_REQUIRE(layer_is_aligned16(out) && layer_is_aligned16(wte) && layer_is_aligned16(wpe),
                  "encoder_forward: out, wte and wpe must be 16-byte aligned");
    size_t total_vecs = (size_t)B * T * (C / 8);
    unsigned grid = (unsigned)layer_ceil_div(total_vecs, ENCODER_THREADS);
    encoder_forward_kernel<<<grid, ENCODER_THREADS, 0, stream>>>(out, tokens, wte, wpe, positions, T, C, total_vecs);
    CUDA_CHECK(cudaGetLastError());
}

// out (B, T, C) = wte[tokens] + wpe[t]; see the top of the file.
static void encoder_forward(__nv_bfloat16* out, const int* tokens, const __nv_bfloat16* wte, const __nv_bfloat16* wpe,
                            int B, int T, int C, cudaStream_t stream) {
    encoder_forward_at(out, tokens, NULL, wte, wpe, B, T, C, stream);
}

// ---- backward: dwpe ----------------------------------------------------------------------------------

// One thread per (t, 8 channels): dwpe[pos(t)] += Σ_b dout[b, t], b in increasing order.
static __global__ void __launch_bounds__(ENCODER_THREADS)
    encoder_backward_wpe_kernel(__nv_bfloat16* __restrict__ dwpe, const __nv_bfloat16* __restrict__ dout,
                                const int* __restrict__ positions, int B, int T, int C) {
    const int vecs = C / 8;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * vecs) return;
    int t = (int)(i / vecs), c = (int)(i % vecs) * 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = 0; b < B; b++) {
        float d[8];
        bf16x8_unpack(d, load16(dout + ((size_t)b * T + t) * C + c));
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += d[k];
    }
    float g[8];
    __nv_bfloat16* p = dwpe + (size_t)(positions ? positions[t] : t) * C + c;
    bf16x8_unpack(g, load16(p));
#pragma unroll
    for (int k = 0; k < 8; k++) g[k] += acc[k];
    store16(p, bf16x8_pack(g));
}

// ---- backward: dwte ----------------------------------------------------------------------------------

static __global__ void encoder_iota_kernel(int* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i;
}

// dst[c..c+7] (bf16) += acc, one rounding.
static __device__ __forceinline__ void encoder_add_row8(__nv_bfloat16* dst, const float acc[8]) {
    float g[8];
    bf16x8_unpack(g, load16(dst));
#pragma unroll
    for (int k = 0; k < 8; k++) g[k] += acc[k];
    store16(dst, bf16x8_pack(g));
}

// One thread per (chunk, 8 channels). tok_sorted, pos_sorted (N): the (token, position) pairs
// sorted stably by token. partials (num_chunks, 2, C) fp32. See the top of the file.
static __global__ void __launch_bounds__(ENCODER_THREADS)
    encoder_backward_wte_chunks_kernel(__nv_bfloat16* __restrict__ dwte, float* __restrict__ partials,
                                       const __nv_bfloat16* __restrict__ dout, const unsigned* __restrict__ tok_sorted,
                                       const int* __restrict__ pos_sorted, int N, int C, int num_chunks) {
    const int vecs = C / 8;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)num_chunks * vecs) return;
    const int chunk = (int)(i / vecs), c = (int)(i % vecs) * 8;
    const int lo = chunk * ENCODER_BWD_CHUNK, hi = min(lo + ENCODER_BWD_CHUNK, N);
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int piece_start = lo;
    // Batches of 4 positions: their dout rows are loaded together, then summed in order.
    for (int j0 = lo; j0 < hi; j0 += 4) {
        uint4 d[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (j0 + k < hi) d[k] = load16(dout + (size_t)pos_sorted[j0 + k] * C + c);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int j = j0 + k;
            if (j >= hi) break;
            float f[8];
            bf16x8_unpack(f, d[k]);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] += f[e];
            const unsigned tok = tok_sorted[j];
            const int ends = j + 1 == N || tok_sorted[j + 1] != tok;
            if (!ends && j + 1 < hi) continue;  // the run goes on inside this chunk
            // The piece [piece_start, j] of token tok's run ends here (the run ends, or the chunk).
            const int starts = piece_start == 0 || tok_sorted[piece_start - 1] != tok;
            if (starts && ends) {
                encoder_add_row8(dwte + (size_t)tok * C + c, acc);
            } else {
                float* p = partials + ((size_t)chunk * 2 + (piece_start == lo ? 0 : 1)) * C + c;
                *(float4*)p = make_float4(acc[0], acc[1], acc[2], acc[3]);
                *(float4*)(p + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] = 0.0f;
            piece_start = j + 1;
        }
    }
}

// One thread per (chunk, 8 channels): if a run starts in this chunk and goes on past its end, adds
// the run's pieces (this chunk's, then slot 0 of each following chunk it covers) into dwte.
static __global__ void __launch_bounds__(ENCODER_THREADS)
    encoder_backward_wte_spans_kernel(__nv_bfloat16* __restrict__ dwte, const float* __restrict__ partials,
                                      const unsigned* __restrict__ tok_sorted, int N, int C, int num_chunks) {
    const int vecs = C / 8;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)num_chunks * vecs) return;
    const int chunk = (int)(i / vecs), c = (int)(i % vecs) * 8;
    const int lo = chunk * ENCODER_BWD_CHUNK, hi = min(lo + ENCODER_BWD_CHUNK, N);
    if (hi == N) return;
    const unsigned tok = tok_sorted[hi - 1];
    if (tok_sorted[hi] != tok) return;  // the chunk's last run ends inside it
    const int first_same = tok_sorted[lo] == tok;
    if (first_same && lo > 0 && tok_sorted[lo - 1] == tok) return;  // the run started in an earlier chunk
    float acc[8];
    const float* p = partials + ((size_t)chunk * 2 + (first_same ? 0 : 1)) * C + c;
    float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    acc[0] = a.x, acc[1] = a.y, acc[2] = a.z, acc[3] = a.w, acc[4] = b.x, acc[5] = b.y, acc[6] = b.z, acc[7] = b.w;
    for (int k = chunk + 1; k < num_chunks; k++) {
        p = partials + (size_t)k * 2 * C + c;
        a = *(const float4*)p;
        b = *(const float4*)(p + 4);
        acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
        acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
        const int hk = min((k + 1) * ENCODER_BWD_CHUNK, N);
        if (hk == N || tok_sorted[hk] != tok) break;
    }
    encoder_add_row8(dwte + (size_t)tok * C + c, acc);
}

// Bits of the sort key: the smallest b with 2^b >= Vp.
static int encoder_sort_bits(int Vp) {
    int bits = 1;
    while (bits < 31 && (1u << bits) < (unsigned)Vp) bits++;
    return bits;
}

static size_t encoder_sort_temp_bytes(int N, int Vp) {
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, bytes, (const unsigned*)NULL, (unsigned*)NULL, (const int*)NULL,
                                               (int*)NULL, N, 0, encoder_sort_bits(Vp), (cudaStream_t)0));
    return bytes;
}

// Scratch of encoder_backward for N = B·T positions, C channels, Vp token ids. Asks CUB for the
// sort's temporary storage, so it needs a CUDA device.
static size_t encoder_backward_scratch_bytes(int N, int C, int Vp) {
    size_t num_chunks = layer_ceil_div((size_t)N, ENCODER_BWD_CHUNK);
    return 3 * layer_align256((size_t)N * sizeof(int)) + layer_align256(num_chunks * 2 * (size_t)C * sizeof(float)) +
           layer_align256(encoder_sort_temp_bytes(N, Vp));
}

// dwte (Vp, C) += and dwpe (maxT, C) += the gradients from dout (B, T, C); see the top of the file.
// tokens (B, T) on the GPU, in [0, Vp); positions (T) as in encoder_forward_at, or NULL.
// scratch: scratch_bytes >= encoder_backward_scratch_bytes.
static void encoder_backward_at(__nv_bfloat16* dwte, __nv_bfloat16* dwpe, void* scratch, size_t scratch_bytes,
                                const __nv_bfloat16* dout, const int* tokens, const int* positions, int B, int T,
                                int C, int Vp, cudaStream_t stream) {
    LAYER_REQUIRE(B >= 1 && T >= 1 && C >= 8 && C % 8 == 0 && Vp >= 1,
                  "encoder_backward: B = %d, T = %d, C = %d, Vp = %d: need B, T, Vp >= 1 and C a multiple of 8", B, T,
                  C, Vp);
    LAYER_REQUIRE((size_t)B * T <= (size_t)INT32_MAX / 2, "encoder_backward: B·T = %zu positions is too many",
                  (size_t)B * T);
    LAYER_REQUIRE(layer_is_aligned16(dwte) && layer_is_aligned16(dwpe) && layer_is_aligned16(dout) &&
                      layer_is_aligned16(scratch),
                  "encoder_backward: dwte, dwpe, dout and scratch must be 16-byte aligned");
    const int N = B * T;
    const size_t need = encoder_backward_scratch_bytes(N, C, Vp);
    LAYER_REQUIRE(scratch_bytes >= need,
                  "encoder_backward: scratch of %zu bytes, need %zu (encoder_backward_scratch_bytes(%d, %d, %d))",
                  scratch_bytes, need, N, C, Vp);
    const int num_chunks = (int)layer_ceil_div((size_t)N, ENCODER_BWD_CHUNK);
    char* s = (char*)scratch;
    int* rows = (int*)s;  // 0 .. N-1, the sort's values
    s += layer_align256((size_t)N * sizeof(int));
    unsigned* tok_sorted = (unsigned*)s;
    s += layer_align256((size_t)N * sizeof(int));
    int* pos_sorted = (int*)s;
    s += layer_align256((size_t)N * sizeof(int));
    float* partials = (float*)s;
    s += layer_align256((size_t)num_chunks * 2 * C * sizeof(float));
    size_t sort_bytes = need - (size_t)(s - (char*)scratch);

    const int vecs = C / 8;
    encoder_backward_wpe_kernel<<<(unsigned)layer_ceil_div((size_t)T * vecs, ENCODER_THREADS), ENCODER_THREADS, 0,
                                  stream>>>(dwpe, dout, positions, B, T, C);
    CUDA_CHECK(cudaGetLastError());

    encoder_iota_kernel<<<(unsigned)layer_ceil_div((size_t)N, ENCODER_THREADS), ENCODER_THREADS, 0, stream>>>(
        rows, N);
    CUDA_CHECK(cudaGetLastError());
    // Stable: equal tokens keep increasing positions, so the sorted order is a function of tokens alone.
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s, sort_bytes, (const unsigned*)tokens, tok_sorted, rows,
                                               pos_sorted, N, 0, encoder_sort_bits(Vp), stream));

    const unsigned grid = (unsigned)layer_ceil_div((size_t)num_chunks * vecs, ENCODER_THREADS);
    encoder_backward_wte_chunks_kernel<<<grid, ENCODER_THREADS, 0, stream>>>(dwte, partials, dout, tok_sorted,
                                                                             pos_sorted, N, C, num_chunks);
    CUDA_CHECK(cudaGetLastError());
    encoder_backward_wte_spans_kernel<<<grid, ENCODER_THREADS, 0, stream>>>(dwte, partials, tok_sorted, N, C,
                                                                            num_chunks);
    CUDA_CHECK(cudaGetLastError());
}

// encoder_backward_at with row t at position t.
static void encoder_backward(__nv_bfloat16* dwte, __nv_bfloat16* dwpe, void* scratch, size_t scratch_bytes,
                             const __nv_bfloat16* dout, const int* tokens, int B, int T, int C, int Vp,
                             cudaStream_t stream) {
    encoder_backward_at(dwte, dwpe, scratch, scratch_bytes, dout, tokens, NULL, B, T, C, Vp, stream);
}

#endif  // ENCODER_CUH
