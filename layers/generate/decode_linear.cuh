// decode_linear.cuh: the linear layers of a decode step for up to 16 rows, at the rate the GPU reads
// their weights.
//
//   y (M, OC) = epilogue( a (M, IC) · w (OC, IC)ᵀ + bias )          1 ≤ M ≤ DECODE_LINEAR_MAX_ROWS
//     a        = x, or LayerNorm(x)·ln_w + ln_b rounded to bf16: the values layernorm_forward writes,
//                bit for bit (the same per-lane order of the mean and of the squared deviations)
//     epilogue = the fp32 sum + bias (OC, or NULL), then GELU, or + residual (M, OC); one rounding
//     kv       = optionally, the columns of K and V of row m = b·Tq + t also go to the KV cache at
//                position starts[b] + t (the QKV projection appends the step's keys and values)
//   y must not overlap x (blocks read all of x while others write y); residual may be y itself.
//
// Why not cuBLASLt: at M ≤ 16 the product is a read of w (2·OC·IC bytes) with at most 16 multiply-adds
// per weight; what decides its time is how fast the weights stream and how little each launch costs.
// A decode step is four such products per layer, 8 to 35 MB each on GPT3-1.3B: a few microseconds
// apiece, so the launch, the ramp and the tail of every kernel matter as much as its steady rate
// (build/bench_decode_linear measures both paths against the copy rate). Here:
//  - one wave of blocks of DL_WARPS warps; each block takes a run of whole tiles of 8 output features
//    and its warps split IC; each warp runs mma.sync m16n8k16 with A = the M rows of a (zeros past M)
//    and B = the tile's 8 rows of w. A lane loads 16 contiguous bytes of one w row per 32 k and reads
//    the same 8 k of its rows of a; inside the two mma of those 32 k the k order is permuted the same
//    way for A and B, so the dot products are unchanged;
//  - a lane keeps two groups of DL_GROUP steps of w in flight (DL_GROUP_DEEP where the tiles are few),
//    two register buffers used in turn, so no copy waits for a load, across the ends of tiles: a
//    group's buffer is refilled as soon as it has been multiplied, before the tile's barrier, so the
//    weights stream without a break;
//  - a sits in shared memory when it is small, and a LayerNorm's a (normalized once per block) when
//    it fits; else it is read per step (from L1 after a block's first tile);
//  - the warps' partial sums of a tile meet in shared memory in warp order: bit-identical run to run;
//    one barrier per tile, the partials of consecutive tiles in two halves (the warps wait on each
//    other less: ncu put 35% of the QKV product's stalls at these barriers, layers/PERF_NOTES.md 37);
//  - programmatic dependent launch (sm_90): a block first loads its first two groups of weights, which
//    no earlier kernel writes, and only then waits for the previous kernel (griddepcontrol.wait)
//    before it reads x; it lets the next kernel launch as soon as it starts
//    (griddepcontrol.launch_dependents): its blocks take the slots this kernel's blocks free and load
//    their weights while this kernel's last bytes arrive.
// Every kernel launched this way waits for its predecessor before it reads or writes activations, so
// the stream's order holds for everything but the weight reads (attention/common/dependent_launch.cuh).
#ifndef DECODE_LINEAR_CUH
#define DECODE_LINEAR_CUH

#include "attention/common/dependent_launch.cuh"
#include "attention/common/kernel_trace.cuh"
#include "layers/model/gelu.cuh"
#include "layers/model/layernorm.cuh"

#define DECODE_LINEAR_MAX_ROWS 16
#define DL_WARPS 8    // warps per block, splitting IC
#define DL_FEATURES 8 // output features per block (one n8 tile)
#define DL_GROUP 4        // steps of 32 k of w per group; each lane has two groups in flight
#define DL_GROUP_DEEP 8   // the same where the tiles are few: fewer blocks, more bytes in flight each
// Blocks an SM must hold of each kernel (its launch bounds): three of the plain kernel at up to 8 rows
// (80 registers; allowed more, it fits two per SM and the products' chain took 2.3% longer,
// layers/PERF_NOTES.md 40), two of the others, whose groups of 8 steps (or rows g + 8) need more registers.
#define DL_BLOCKS_PER_SM(TWO_ROW_TILES, G) ((!(TWO_ROW_TILES) && (G) == DL_GROUP) ? 3 : 2)
#define DL_A_PAD 32   // bf16 after each staged row of A: rows g and g + 1 fall in other banks
#define DL_A_STAGED_SMALL_BYTES (32 << 10)  // A goes to shared memory when it is this small,
#define DL_A_STAGED_MAX_BYTES (100 << 10)   // and a LayerNorm's A when it fits in this

// Where the QKV projection's K and V columns also go: the KV cache of one layer (B, Tmax, width).
typedef struct {
    __nv_bfloat16 *k, *v;  // NULL: no append
    const int* starts;     // (B) the first new position of each sequence
    int Tq, Tmax;          // rows per sequence in the step; positions the cache holds (the caller keeps
                           // starts[b] + Tq ≤ Tmax: gpt_decoder_count stops a step that would pass it)
    int k_col, v_col;      // first K and V column of a row of y
    int width;             // columns of each: NKV·HD
} DecodeLinearKV;

// What surrounds the product. Every pointer may be NULL but ln_w/ln_b go together.
typedef struct {
    const __nv_bfloat16 *ln_w, *ln_b;  // (IC) LayerNorm of x's rows first
    const __nv_bfloat16* bias;         // (OC)
    const __nv_bfloat16* residual;     // (M, OC) added after the bias (may be y itself)
    int gelu;                          // GELU after the bias (not with a residual)
    DecodeLinearKV kv;
} DecodeLinearOps;

// ---- device ---------------------------------------------------------------------------------------

// 16 bytes of w, read once per step: not kept in L1.
static __device__ __forceinline__ uint4 dl_load_weights(const __nv_bfloat16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// c (16x8 fp32) += a (16x16 bf16, row) · b (16x8 bf16, col). Not volatile: it has no effect beyond c,
// so the compiler may order it freely against the (volatile) weight loads.
static __device__ __forceinline__ void dl_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Mean and rstd of rows warp, warp + DL_WARPS, ... of x (M, IC) into shared memory, in
// layernorm_forward's order: lane i sums its vectors i, i + 32, ... in turn, then the warp's sum.
static __device__ void dl_row_statistics(float* mean, float* rstd, const __nv_bfloat16* __restrict__ x, int M,
                                         int IC) {
    const int lane = threadIdx.x % 32, vecs = IC / 8;
    for (int row = threadIdx.x / 32; row < M; row += DL_WARPS) {
        const __nv_bfloat16* xr = x + (size_t)row * IC;
        float sum = 0.0f, sq = 0.0f, f[8];
        for (int v = lane; v < vecs; v += 32) {
            bf16x8_unpack(f, load16(xr + v * 8));
#pragma unroll
            for (int k = 0; k < 8; k++) sum += f[k];
        }
        const float m = layer_warp_sum(sum) / (float)IC;
        for (int v = lane; v < vecs; v += 32) {
            bf16x8_unpack(f, load16(xr + v * 8));
#pragma unroll
            for (int k = 0; k < 8; k++) sq += (f[k] - m) * (f[k] - m);
        }
        const float s = rsqrtf(layer_warp_sum(sq) / (float)IC + LAYERNORM_EPS);
        if (lane == 0) mean[row] = m, rstd[row] = s;
    }
}

// 8 values of row `row` at column k of a: x, or its LayerNorm rounded to bf16; zeros past M.
static __device__ __forceinline__ uint4 dl_load_a(const __nv_bfloat16* __restrict__ x, const DecodeLinearOps& ops,
                                                  const float* mean, const float* rstd, int row, int M, int IC, int k) {
    if (row >= M) return make_uint4(0u, 0u, 0u, 0u);
    const uint4 v = load16(x + (size_t)row * IC + k);
    if (!ops.ln_w) return v;
    return layernorm_chunk(v, load16(ops.ln_w + k), load16(ops.ln_b + k), mean[row], rstd[row]);
}

// The 32 k of one step: lane (g, t) holds k 8t .. 8t+7 of a's rows g and g+8 and of w's row g. Words
// 0, 1 of each feed the first mma (as k 2t, 2t+1 and 2t+8, 2t+9 of its 16), words 2, 3 the second.
// The two mma add into separate accumulators (c[0..3], c[4..7]; summed at the tile's end): one chain
// would make every mma wait for the one before, and a group's reload waits for its last mma.
static __device__ __forceinline__ void dl_step(float c[8], uint4 lo, uint4 hi, uint4 w) {
    dl_mma(c, lo.x, hi.x, lo.y, hi.y, w.x, w.y);
    dl_mma(c + 4, lo.z, hi.z, lo.w, hi.w, w.z, w.w);
}

// The epilogue of one output (row, feature o) from its fp32 sum.
static __device__ __forceinline__ void dl_finish(__nv_bfloat16* y, const DecodeLinearOps& ops, float acc, int row,
                                                 int o, int OC) {
    if (ops.bias) acc += __bfloat162float(ops.bias[o]);
    if (ops.gelu) acc = gelu_f32(acc);
    if (ops.residual) acc += __bfloat162float(ops.residual[(size_t)row * OC + o]);
    const __nv_bfloat16 out = __float2bfloat16(acc);
    y[(size_t)row * OC + o] = out;
    const DecodeLinearKV& kv = ops.kv;
    if (!kv.k) return;
    const int b = row / kv.Tq, pos = kv.starts[b] + row % kv.Tq;
    const size_t at = ((size_t)b * kv.Tmax + pos) * kv.width;
    if (o >= kv.k_col && o < kv.k_col + kv.width) kv.k[at + o - kv.k_col] = out;
    if (o >= kv.v_col && o < kv.v_col + kv.width) kv.v[at + o - kv.v_col] = out;
}

// What one block does: its tiles of 8 features, this warp's share of the 32-k steps of IC.
typedef struct {
    int tile0, tiles;       // tiles tile0 .. tile0 + tiles − 1 (features 8·tile ..)
    int begin, end;         // this warp's steps of 32 k
    int groups;             // groups of G steps per tile, the same for every warp
    int M, IC, OC;
    const __nv_bfloat16* a; // A's rows: the staged copy in shared memory (stride a_stride) or x itself
    int a_stride, a_staged;
} DLWork;

// Loads item i of the block's stream (tile tile0 + i / groups, its group i % groups) of this lane's
// row of w: the steps of that group below `end`. Past the last item: nothing.
template <int G>
static __device__ __forceinline__ void dl_load_item(uint4 buf[G], const DLWork& k,
                                                    const __nv_bfloat16* __restrict__ w, int i) {
    if (i >= k.tiles * k.groups) return;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int tile = k.tile0 + i / k.groups, step = k.begin + (i % k.groups) * G;
    const __nv_bfloat16* row = w + (size_t)(tile * DL_FEATURES + g) * k.IC + 8 * t;
#pragma unroll
    for (int u = 0; u < G; u++)
        if (step + u < k.end) buf[u] = dl_load_weights(row + (size_t)(step + u) * 32);
}

// 8 values of A's row `row` at column k: from the staged copy, or x (normalized here); zeros past M.
static __device__ __forceinline__ uint4 dl_a(const DLWork& k, const DecodeLinearOps& ops, const float* mean,
                                             const float* rstd, int row, int col) {
    if (row >= k.M) return make_uint4(0u, 0u, 0u, 0u);
    if (k.a_staged) return *(const uint4*)(k.a + (size_t)row * k.a_stride + col);
    return dl_load_a(k.a, ops, mean, rstd, row, k.M, k.IC, col);
}

// The mma of item i's steps from buf into c.
template <bool TWO_ROW_TILES, int G>
static __device__ __forceinline__ void dl_multiply_item(float c[8], const uint4 buf[G], const DLWork& k,
                                                        const DecodeLinearOps& ops, const float* mean,
                                                        const float* rstd, int i) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int step = k.begin + (i % k.groups) * G;
#pragma unroll
    for (int u = 0; u < G; u++) {
        if (step + u >= k.end) break;
        const int col = (step + u) * 32 + 8 * t;
        const uint4 lo = dl_a(k, ops, mean, rstd, g, col);
        const uint4 hi = TWO_ROW_TILES ? dl_a(k, ops, mean, rstd, g + 8, col) : make_uint4(0u, 0u, 0u, 0u);
        dl_step(c, lo, hi, buf[u]);
    }
}

// After a tile's last item: the warps' sums meet in `partial` in warp order and the first 8·M
// threads finish an output each. Every thread of the block calls it (one barrier): consecutive tiles
// use the two halves of the partials in turn, so a tile's writes never meet the reads of the tile before
// it (a thread writes a half again only after the barrier of the tile between, which every reader of
// that half has passed).
static __device__ void dl_finish_tile(float c[8], float (*partials)[16][DL_FEATURES], __nv_bfloat16* y,
                                      const DecodeLinearOps& ops, const DLWork& k, int tile) {
    float(*partial)[16][DL_FEATURES] = partials + (tile % 2) * DL_WARPS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    partial[warp][g][2 * t] = c[0] + c[4], partial[warp][g][2 * t + 1] = c[1] + c[5];
    partial[warp][g + 8][2 * t] = c[2] + c[6], partial[warp][g + 8][2 * t + 1] = c[3] + c[7];
#pragma unroll
    for (int i = 0; i < 8; i++) c[i] = 0.0f;
    __syncthreads();
    const int row = threadIdx.x / DL_FEATURES, f = threadIdx.x % DL_FEATURES;
    if (row < k.M) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < DL_WARPS; i++) acc += partial[i][row][f];
        dl_finish(y, ops, acc, row, tile * DL_FEATURES + f, k.OC);
    }
}

// A's M rows into shared memory (stride IC + DL_A_PAD): x, or LayerNorm(x) rounded to bf16.
static __device__ void dl_stage_a(__nv_bfloat16* a, const __nv_bfloat16* __restrict__ x, const DecodeLinearOps& ops,
                                  const float* mean, const float* rstd, int M, int IC) {
    const int vecs = IC / 8;
    for (int v = threadIdx.x; v < M * vecs; v += blockDim.x) {
        const int row = v / vecs, col = (v % vecs) * 8;
        *(uint4*)(a + (size_t)row * (IC + DL_A_PAD) + col) = dl_load_a(x, ops, mean, rstd, row, M, IC, col);
    }
}

// The block's share of the work: a run of whole tiles (the grid is one wave: see decode_linear), and
// this warp's steps; the number of groups is the largest warp's, so every warp meets the same barriers.
static __device__ DLWork dl_work(int M, int IC, int OC, int tiles_per_block, int G) {
    DLWork k;
    const int warp = threadIdx.x / 32, steps = IC / 32, tiles = OC / DL_FEATURES;
    k.tile0 = blockIdx.x * tiles_per_block;
    k.tiles = min(tiles_per_block, tiles - k.tile0);
    k.begin = warp * steps / DL_WARPS, k.end = (warp + 1) * steps / DL_WARPS;
    k.groups = ((steps + DL_WARPS - 1) / DL_WARPS + G - 1) / G;
    k.M = M, k.IC = IC, k.OC = OC;
    return k;
}

// grid: ceil(OC / 8 / tiles_per_block) blocks of DL_WARPS warps; dynamic shared memory: A's rows
// when a_staged (M·(IC + DL_A_PAD) bf16). Each block streams its tiles' weights with two groups of G
// steps per lane in flight (buffers b0 and b1 in turn, no register copies that would wait for a load).
template <bool TWO_ROW_TILES, int G>  // M > 8: a's rows g + 8 are real; G: steps of 32 k per group
static __global__ void __launch_bounds__(DL_WARPS * 32, DL_BLOCKS_PER_SM(TWO_ROW_TILES, G))
    decode_linear_kernel(__nv_bfloat16* y, const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                         DecodeLinearOps ops, int M, int IC, int OC, int tiles_per_block, int a_staged) {
    __shared__ float partial[2 * DL_WARPS][16][DL_FEATURES];  // two halves, tiles in turn
    __shared__ float mean[DECODE_LINEAR_MAX_ROWS], rstd[DECODE_LINEAR_MAX_ROWS];
    extern __shared__ __align__(16) unsigned char a_smem[];
    KernelTraceStamp trace = kernel_trace_begin();
    allow_dependent_launch();
    DLWork k = dl_work(M, IC, OC, tiles_per_block, G);
    uint4 b0[G], b1[G];
    dl_load_item<G>(b0, k, w, 0);  // weights: no earlier kernel writes them
    dl_load_item<G>(b1, k, w, 1);
    wait_for_prerequisite_grid();
    kernel_trace_ready(&trace);
    if (ops.ln_w) dl_row_statistics(mean, rstd, x, M, IC);
    __syncthreads();
    k.a_staged = a_staged, k.a = x, k.a_stride = IC;
    if (a_staged) {
        dl_stage_a((__nv_bfloat16*)a_smem, x, ops, mean, rstd, M, IC);
        k.a = (const __nv_bfloat16*)a_smem, k.a_stride = IC + DL_A_PAD;
        __syncthreads();
    }
    float c[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int items = k.tiles * k.groups;
    for (int i = 0; i < items; i += 2) {
        dl_multiply_item<TWO_ROW_TILES, G>(c, b0, k, ops, mean, rstd, i);
        dl_load_item<G>(b0, k, w, i + 2);  // before the tile's barrier: the stream does not wait for it
        if (i % k.groups == k.groups - 1) dl_finish_tile(c, partial, y, ops, k, k.tile0 + i / k.groups);
        if (i + 1 >= items) break;
        dl_multiply_item<TWO_ROW_TILES, G>(c, b1, k, ops, mean, rstd, i + 1);
        dl_load_item<G>(b1, k, w, i + 3);
        if ((i + 1) % k.groups == k.groups - 1) dl_finish_tile(c, partial, y, ops, k, k.tile0 + (i + 1) / k.groups);
    }
    kernel_trace_end(&trace, ops.kv.k ? 'Q' : ops.gelu ? 'F' : IC > OC ? 'R' : 'P', (unsigned)M);
}

// ---- host -----------------------------------------------------------------------------------------

// Whether decode_linear runs this shape: 1 ≤ M ≤ 16 rows, IC a multiple of 32 (a lane's 16-byte
// vectors in 32-k steps), OC a multiple of 8 (a tile's features).
static int decode_linear_supported(int M, int IC, int OC) {
    return M >= 1 && M <= DECODE_LINEAR_MAX_ROWS && IC >= 32 && IC % 32 == 0 && OC >= 8 && OC % 8 == 0;
}

// The most dynamic shared memory a staged A may take on this GPU: DL_A_STAGED_MAX_BYTES, less where a
// block may not opt in to that much beside the kernel's static 8.3 KB (99 KB per block on sm_86/89).
static size_t decode_linear_staged_max_bytes(void) {
    static size_t most = 0;
    if (!most) {
        int device = 0, optin = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        // the kernel's static shared memory: the two halves of the partials, the rows' mean and rstd
        const size_t fixed = sizeof(float) * (2 * DL_WARPS * 16 * DL_FEATURES + 2 * DECODE_LINEAR_MAX_ROWS);
        const size_t room = (size_t)optin - fixed;
        most = room < (size_t)DL_A_STAGED_MAX_BYTES ? room : (size_t)DL_A_STAGED_MAX_BYTES;
    }
    return most;
}

typedef void (*DLKernel)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, DecodeLinearOps, int, int, int,
                         int, int);

// The kernel for M rows and `tiles` tiles: deep groups where the tiles are few (under two per SM: each
// block then streams one tile's whole IC, and more bytes in flight per lane keep the rate up).
static DLKernel decode_linear_pick(int M, int tiles, int sms, int* index) {
    const int deep = tiles < 2 * sms;
    *index = (M > 8) * 2 + deep;
    const DLKernel kernels[4] = {decode_linear_kernel<false, DL_GROUP>, decode_linear_kernel<false, DL_GROUP_DEEP>,
                                 decode_linear_kernel<true, DL_GROUP>, decode_linear_kernel<true, DL_GROUP_DEEP>};
    return kernels[*index];
}

// Blocks of kernel `index` with `smem` dynamic bytes to launch at once: the SMs × the blocks an SM
// holds (one wave: leaving slots free for the next kernel's early blocks was slower at every row count,
// layers/PERF_NOTES.md 34). The occupancy is asked once per kernel and size of staged A.
static int decode_linear_wave(DLKernel kernel, int index, size_t smem, int sms) {
    enum { CACHED = 32 };
    static int raised[4] = {0, 0, 0, 0}, cached_index[CACHED], cached_per_sm[CACHED], count = 0;
    static size_t cached_smem[CACHED];
    for (int i = 0; i < count; i++)
        if (cached_index[i] == index && cached_smem[i] == smem) return cached_per_sm[i] * sms;
    if (!raised[index]) {  // once per kernel: allow A's rows in shared memory
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)decode_linear_staged_max_bytes()));
        raised[index] = 1;
    }
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, DL_WARPS * 32, smem));
    if (per_sm < 1) per_sm = 1;
    if (count < CACHED) cached_index[count] = index, cached_smem[count] = smem, cached_per_sm[count++] = per_sm;
    return per_sm * sms;
}

// y (M, OC) = ops' epilogue of (x or LN(x)) · wᵀ (see the top of the file), on `stream`, launched as a
// programmatic dependent of the stream's previous kernel where the GPU has it. One wave of blocks, each
// a run of whole tiles (ceil(tiles / wave) of them, so that no block has more than one tile more than
// another). A goes to shared memory when it is small (DL_A_STAGED_SMALL_BYTES) or, normalized once, for
// a LayerNorm when it fits in DL_A_STAGED_MAX_BYTES (less on GPUs with less shared memory per block);
// otherwise it is read (and normalized) per step.
static void decode_linear(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w,
                          const DecodeLinearOps* ops, int M, int IC, int OC, cudaStream_t stream) {
    LAYER_REQUIRE(decode_linear_supported(M, IC, OC), "decode_linear: M = %d, IC = %d, OC = %d: need 1 <= M <= %d, "
                  "IC a multiple of 32, OC a multiple of 8", M, IC, OC, DECODE_LINEAR_MAX_ROWS);
    LAYER_REQUIRE(layer_is_aligned16(x) && layer_is_aligned16(w) && (!ops->ln_w || (layer_is_aligned16(ops->ln_w) &&
                  layer_is_aligned16(ops->ln_b))), "decode_linear: x, w and the LayerNorm's weights must be 16-byte "
                  "aligned");
    LAYER_REQUIRE(!(ops->gelu && ops->residual) && !ops->ln_w == !ops->ln_b, "decode_linear: GELU with a residual, "
                  "or a LayerNorm weight without its bias");
    const char *yb = (const char*)y, *xb = (const char*)x;  // other blocks still read x while one writes y
    LAYER_REQUIRE(yb + (size_t)M * OC * 2 <= xb || xb + (size_t)M * IC * 2 <= yb, "decode_linear: y overlaps x");
    static int sms = 0;
    if (!sms) sms = layer_num_sms();
    const int tiles = OC / DL_FEATURES;
    int index;
    const DLKernel kernel = decode_linear_pick(M, tiles, sms, &index);
    const size_t a_bytes = (size_t)M * (IC + DL_A_PAD) * sizeof(__nv_bfloat16);
    const int a_staged =
        a_bytes <= DL_A_STAGED_SMALL_BYTES || (ops->ln_w && a_bytes <= decode_linear_staged_max_bytes());
    const size_t smem = a_staged ? a_bytes : 0;
    const int wave = decode_linear_wave(kernel, index, smem, sms), per_block = (tiles + wave - 1) / wave;
    const unsigned grid = (unsigned)((tiles + per_block - 1) / per_block);
    CUDA_CHECK(launch_dependent(kernel, dim3(grid), DL_WARPS * 32, smem, stream, y, x, w, *ops, M, IC, OC, per_block,
                                a_staged));
}

#endif  // DECODE_LINEAR_CUH
