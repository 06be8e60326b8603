// flash2_forward_hopper.cuh: the flash2 forward (Algorithm 1 of the paper) on Hopper's warpgroup
// tensor-core product (wgmma, sm_90a), head dims 64, 80, 96 and 128. Same inputs, outputs and algorithm
// as flash2_forward_kernel.cuh; the products are wgmma instead of mma.sync:
//
// One thread block per (query block of 128 rows, b·NH + h): two warpgroups, each owning 64 query
// rows (no split-K), looping over key/value blocks of BLOCK_N rows (double-buffered, cp.async):
//   S = Q Kᵀ        wgmma, both operands from shared memory (Q and K K-major)
//   online softmax  in registers (row max, P = exp2(S·scale_log2 − max), running sum, O rescale)
//   O += P V        wgmma, A = P from registers, B = V (MN-major)
// O is divided by the running sum once at the end (deferred normalization); O and LSE only.
#ifndef FLASH2_FORWARD_HOPPER_CUH
#define FLASH2_FORWARD_HOPPER_CUH

#include "flash2_forward_kernel.cuh"
#include "wgmma.cuh"

template <int HD, int BLOCK_N>
struct Flash2ForwardHopperConfig {
    static constexpr int WARPGROUPS = 2, THREADS = 128 * WARPGROUPS;
    static constexpr int BLOCK_M = 64 * WARPGROUPS;  // query rows per block, 64 per warpgroup
    typedef WgTile<BLOCK_M, HD> QTile;
    typedef WgTile<BLOCK_N, HD> KvTile;
    static constexpr size_t SMEM_BYTES =
        1024 /* alignment slack */ + (size_t)(QTile::ELEMS + 4 * KvTile::ELEMS) * sizeof(__nv_bfloat16);
    static_assert(HD == 64 || HD == 80 || HD == 96 || HD == 128, "wgmma forward: head dims 64, 80, 96, 128");
    static_assert(BLOCK_N == 64 || BLOCK_N == 128, "wgmma forward: key blocks of 64 or 128");
};

// MIN_BLOCKS 2 caps registers at 128 so that two blocks share an SM: one's softmax then overlaps
// the other's products.
template <int HD, int BLOCK_N, int MIN_BLOCKS, bool CAUSAL>
__global__ void __launch_bounds__(256, MIN_BLOCKS) flash2_forward_hopper_kernel(Flash2ForwardParams p) {
#if WGMMA_AVAILABLE
    typedef Flash2ForwardHopperConfig<HD, BLOCK_N> C;
    typedef typename C::QTile QTile;
    typedef typename C::KvTile KvTile;
    constexpr int BLOCK_M = C::BLOCK_M;
    extern __shared__ __align__(1024) __nv_bfloat16 smem_raw[];
    const uint32_t raw_addr = smem_address(smem_raw);  // wgmma's swizzle needs 1024-byte aligned tiles
    __nv_bfloat16* q_tile = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr) / 2;  // (BLOCK_M, HD)
    __nv_bfloat16* k_tiles = q_tile + QTile::ELEMS;                                      // 2 × (BLOCK_N, HD)
    __nv_bfloat16* v_tiles = k_tiles + 2 * KvTile::ELEMS;                                // 2 × (BLOCK_N, HD)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wg = warp / 4, g = lane / 4, t4 = lane % 4;
    const int row_in_wg = (warp % 4) * 16 + g;  // this thread's rows: row_in_wg and row_in_wg + 8
    // Heaviest causal query blocks (the last ones) go first, so the short ones fill the tail.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH;
    const int T = p.T;
    const long batch_offset = (long)b * T * p.qkv_stride + (long)h * HD;
    const __nv_bfloat16* k_base = p.k + batch_offset;
    const __nv_bfloat16* v_base = p.v + batch_offset;

    const int key_end = CAUSAL ? min(T, m0 + BLOCK_M) : T;
    const int n_blocks = (key_end + BLOCK_N - 1) / BLOCK_N;

    auto load_kv_block = [&](int n) {
        const long offset = (long)n * BLOCK_N * p.qkv_stride;
        load_wg_tile_async<BLOCK_N, HD, C::THREADS>(k_tiles + (n & 1) * KvTile::ELEMS, k_base + offset, p.qkv_stride,
                                                    T - n * BLOCK_N);
        load_wg_tile_async<BLOCK_N, HD, C::THREADS>(v_tiles + (n & 1) * KvTile::ELEMS, v_base + offset, p.qkv_stride,
                                                    T - n * BLOCK_N);
    };
    load_wg_tile_async<BLOCK_M, HD, C::THREADS>(q_tile, p.q + batch_offset + (long)m0 * p.qkv_stride, p.qkv_stride,
                                                T - m0);
    load_kv_block(0);
    cp_async_commit();

    float acc_o[HD / 2];
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows row_in_wg, +8
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc_o[i] = 0.f;
    const uint32_t q_addr = smem_address(q_tile) + QTile::row_offset(wg * 64);  // this warpgroup's 64 rows
    const uint32_t k_addr0 = smem_address(k_tiles), v_addr0 = smem_address(v_tiles);

    for (int n = 0; n < n_blocks; n++) {
        const int n0 = n * BLOCK_N;
        const uint32_t k_addr = k_addr0 + (n & 1) * KvTile::ELEMS * 2, v_addr = v_addr0 + (n & 1) * KvTile::ELEMS * 2;
        cp_async_wait<0>();   // Q, K_n and V_n have landed
        fence_proxy_async();  // ... and are visible to wgmma
        __syncthreads();      // every warp has left step n-1: the other buffers are free
        if (n + 1 < n_blocks) load_kv_block(n + 1);
        cp_async_commit();

        // S = Q Kᵀ: 64 rows × BLOCK_N keys per warpgroup, k = HD
        float s[BLOCK_N / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_N, 0, 0>(s, QTile::k_major(q_addr + QTile::k_step(ks)),
                                    KvTile::k_major(k_addr + KvTile::k_step(ks)), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_registers(s);

        // Mask keys past the end of the sequence and, on diagonal blocks, keys after the query.
        const bool needs_mask = n0 + BLOCK_N > T || (CAUSAL && n0 + BLOCK_N - 1 > m0);
        if (needs_mask) {
#pragma unroll
            for (int nt = 0; nt < BLOCK_N / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = m0 + wg * 64 + row_in_wg + (e >= 2 ? 8 : 0);
                    const int col = n0 + nt * 8 + 2 * t4 + (e & 1);
                    if (col >= T || (CAUSAL && col > row)) s[4 * nt + e] = -INFINITY;
                }
        }

        // Online softmax (as in flash2_forward_kernel.cuh): new row max, P, running sum, O rescale.
        float rescale[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BLOCK_N / 8; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float new_max = fmaxf(row_max[half], mx * p.scale_log2);
            // A row with every key masked so far keeps max −∞: subtract 0 so exp2 gives 0, not NaN.
            const float base = new_max == -INFINITY ? 0.f : new_max;
            rescale[half] = fast_exp2(row_max[half] - base);
            row_max[half] = new_max;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BLOCK_N / 8; nt++)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; e++) {
                    s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], p.scale_log2, -base));
                    sum += s[4 * nt + e];
                }
            row_sum[half] = row_sum[half] * rescale[half] + sum;  // per-thread partial sum
        }
        if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < HD / 2; i++) acc_o[i] *= rescale[(i % 4) / 2];
        }
        uint32_t pa[BLOCK_N / 16][4];
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) accumulators_to_a(pa[kk], &s[8 * kk], &s[8 * kk + 4]);

        // O += P V: B = V (keys × HD), MN-major
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++)
            wgmma_rs<HD, 1>(acc_o, pa[kk], KvTile::mn_major(v_addr + KvTile::mn_step(kk)), 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_registers(acc_o);
    }
    cp_async_wait<0>();

    // Epilogue: O /= ℓ, LSE = (m + log2 ℓ)·ln 2. Each warpgroup writes its rows of O into its own
    // rows of the Q tile (its last S product has finished reading them), then stores them with
    // 16-byte writes.
    float* lse_row = p.lse + (long)bh * T;
    const int wg_row0 = m0 + wg * 64;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float sum = row_sum[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int row = wg * 64 + row_in_wg + 8 * half;
        if (t4 == 0 && m0 + row < T) lse_row[m0 + row] = (row_max[half] + __log2f(sum)) * FLASH2_LN2;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
            *(uint32_t*)(q_tile + QTile::index(row, nt) + 2 * t4) =
                pack_bf16(acc_o[4 * nt + 2 * half] * inv, acc_o[4 * nt + 2 * half + 1] * inv);
    }
    // This warpgroup's 4 warps only (barrier 0 is __syncthreads'; immediate ids keep the count low).
    if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else asm volatile("bar.sync 2, 128;\n" ::: "memory");
    const int tid = threadIdx.x % 128;
    for (int i = tid; i < 64 * (HD / 8); i += 128) {
        const int row = i / (HD / 8), chunk = i % (HD / 8);
        if (wg_row0 + row < T)
            *(uint4*)(p.out + ((long)b * T + wg_row0 + row) * p.out_stride + (long)h * HD + chunk * 8) =
                *(const uint4*)(q_tile + QTile::index(wg * 64 + row, chunk));
    }
#else
    __trap();  // built for a GPU without wgmma; the host never launches it there
#endif
}

template <int HD, int BLOCK_N, int MIN_BLOCKS, bool CAUSAL>
static inline void launch_forward_hopper(const Flash2ForwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2ForwardHopperConfig<HD, BLOCK_N> C;
    launch_with_smem<Flash2ForwardParams, flash2_forward_hopper_kernel<HD, BLOCK_N, MIN_BLOCKS, CAUSAL>>(
        dim3((p->T + C::BLOCK_M - 1) / C::BLOCK_M, B * p->NH), C::THREADS, C::SMEM_BYTES, stream, *p);
}

#endif  // FLASH2_FORWARD_HOPPER_CUH
