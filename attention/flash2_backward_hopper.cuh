// flash2_backward_hopper.cuh: the flash2 backward (Algorithm 2 of the paper) on Hopper's warpgroup
// tensor-core product (wgmma, sm_90a), head dims 64, 80, 96 and 128. Same algorithm, inputs, outputs and
// workspace as flash2_backward_kernel.cuh (whose preprocess and dq-convert kernels it shares); only
// the main kernel differs:
//
// One thread block per (key block of 128 keys, b·NH + h), two warpgroups of 4 warps, each owning
// 64 keys for the whole loop over query blocks of BLOCK_M rows (double-buffered with cp.async):
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ         wgmma, both operands from shared memory (64 keys × BLOCK_M)
//   Pᵀ = exp2(Sᵀ·scale_log2 − LSE·log2 e), dSᵀ = Pᵀ ∘ (dPᵀ − D)     in registers
//   dV += Pᵀ dO, dK += dSᵀ Q        wgmma, A = Pᵀ / dSᵀ from registers, B = dO / Q (MN-major)
//   dSᵀ → shared memory; dQ_block = dS K (BLOCK_M × HD) as one product per warpgroup (split by
//   queries at BLOCK_M 128, else by columns), added into dq_accum with fp32 vector atomics.
// With DEFER_DQ the dQ product of step m is issued at the start of step m+1, after that step's
// only barrier, together with Sᵀ and dPᵀ (dSᵀ is then double-buffered); without it, step m has a
// second barrier before its own dQ product.
//
// Why Hopper's instruction: with mma.sync every warp reads its B operands from shared memory
// through ldmatrix into registers, and in this backward that traffic is as busy as the tensor
// cores (attention/PERF_NOTES.md); wgmma reads B (and A) from shared memory itself.
#ifndef FLASH2_BACKWARD_HOPPER_CUH
#define FLASH2_BACKWARD_HOPPER_CUH

#include <type_traits>

#include "flash2_backward_kernel.cuh"
#include "wgmma.cuh"

template <int HD, int BLOCK_M, bool DEFER_DQ>
struct Flash2BackwardHopperConfig {
    static constexpr int WARPGROUPS = 2, THREADS = 128 * WARPGROUPS;
    static constexpr int BLOCK_N = 64 * WARPGROUPS;  // keys per block, 64 per warpgroup
    typedef WgTile<BLOCK_N, HD> KvTile;
    typedef WgTile<BLOCK_M, HD> QoTile;
    typedef WgTile<BLOCK_N, BLOCK_M> DsTile;  // dSᵀ (keys × queries)
    static constexpr int DS_BUFFERS = DEFER_DQ ? 2 : 1;
    static constexpr size_t SMEM_BYTES =
        1024 /* alignment slack */ +
        (size_t)(2 * KvTile::ELEMS + 4 * QoTile::ELEMS + DS_BUFFERS * DsTile::ELEMS) * sizeof(__nv_bfloat16) +
        4 * BLOCK_M * sizeof(float);
    // dQ_block = dS K is BLOCK_M × HD, one 64 × DQ_N product per warpgroup: at BLOCK_M 128
    // (head dim 64) warpgroup w takes queries 64w..64w+63, all columns; at BLOCK_M 64 it takes
    // columns DQ_COL0·w.. : 64 + 64 at head dim 128; 48 + 48 at 96; at 80, columns 0-47 and 32-79
    // (a product's columns must be whole 16-column sub-tiles), of which the second adds 48-79 only.
    static_assert(BLOCK_M == 64 || (BLOCK_M == 128 && HD == 64), "wgmma backward: BLOCK_M 128 at head dim 64, else 64");
    static_assert(HD == 64 || HD == 80 || HD == 96 || HD == 128, "wgmma backward: head dims 64, 80, 96, 128");
    static constexpr int DQ_M_SPLIT = BLOCK_M == 128;
    static constexpr int DQ_N = DQ_M_SPLIT ? HD : HD == 128 ? 64 : 48;
    static constexpr int DQ_COL0 = DQ_M_SPLIT ? 0 : HD - DQ_N;  // first column of warpgroup 1's product
    static constexpr int DQ_SKIP = DQ_M_SPLIT ? 0 : 2 * DQ_N - HD;  // its leading columns warpgroup 0 adds
};

template <int HD, int BLOCK_M, bool DEFER_DQ, bool CAUSAL>
__global__ void __launch_bounds__(256, 1) flash2_backward_hopper_kernel(Flash2BackwardParams p) {
#if WGMMA_AVAILABLE
    typedef Flash2BackwardHopperConfig<HD, BLOCK_M, DEFER_DQ> C;
    typedef typename C::KvTile KvTile;
    typedef typename C::QoTile QoTile;
    typedef typename C::DsTile DsTile;
    constexpr int BLOCK_N = C::BLOCK_N;
    extern __shared__ __align__(1024) __nv_bfloat16 smem_raw[];
    // wgmma's swizzle needs 1024-byte aligned tiles; the dynamic base is not promised to be.
    const uint32_t raw_addr = smem_address(smem_raw);
    __nv_bfloat16* smem = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr) / 2;
    __nv_bfloat16* k_tile = smem;                         // (BLOCK_N, HD)
    __nv_bfloat16* v_tile = k_tile + KvTile::ELEMS;       // (BLOCK_N, HD)
    __nv_bfloat16* q_tiles = v_tile + KvTile::ELEMS;      // 2 × (BLOCK_M, HD)
    __nv_bfloat16* do_tiles = q_tiles + 2 * QoTile::ELEMS; // 2 × (BLOCK_M, HD)
    __nv_bfloat16* ds_tiles = do_tiles + 2 * QoTile::ELEMS; // DS_BUFFERS × (BLOCK_N, BLOCK_M): dSᵀ
    float* lse_tiles = (float*)(ds_tiles + C::DS_BUFFERS * DsTile::ELEMS);  // 2 × BLOCK_M, log2 units
    float* d_tiles = lse_tiles + 2 * BLOCK_M;                                // 2 × BLOCK_M

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wg = warp / 4, g = lane / 4, t4 = lane % 4;
    const int row_in_wg = (warp % 4) * 16 + g;  // this thread's accumulator rows: row_in_wg, +8
    const int n_block = blockIdx.x, n0 = n_block * BLOCK_N;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH;
    const int T = p.T;
    const long qkv_offset = (long)b * T * p.qkv_stride + (long)h * HD;
    const long out_offset = (long)b * T * p.out_stride + (long)h * HD;
    const float* lse_head = p.lse_log2 + (long)bh * T;
    const float* d_head = p.d_rows + (long)bh * T;
    float* dq_head = p.dq_accum + (long)bh * T * HD;

    const int m_begin = CAUSAL ? n0 / BLOCK_M : 0;
    const int m_end = (T + BLOCK_M - 1) / BLOCK_M;

    auto load_query_block = [&](int m, int buf) {
        const int m0 = m * BLOCK_M;
        load_wg_tile_async<BLOCK_M, HD, C::THREADS>(q_tiles + buf * QoTile::ELEMS,
                                                    p.q + qkv_offset + (long)m0 * p.qkv_stride, p.qkv_stride, T - m0);
        load_wg_tile_async<BLOCK_M, HD, C::THREADS>(do_tiles + buf * QoTile::ELEMS,
                                                    p.dout + out_offset + (long)m0 * p.out_stride, p.out_stride,
                                                    T - m0);
        for (int i = threadIdx.x; i < BLOCK_M; i += C::THREADS) {  // rows past the end: 0, masked below
            const bool valid = m0 + i < T;
            cp_async_4(lse_tiles + buf * BLOCK_M + i, valid ? lse_head + m0 + i : lse_head, valid ? 4 : 0);
            cp_async_4(d_tiles + buf * BLOCK_M + i, valid ? d_head + m0 + i : d_head, valid ? 4 : 0);
        }
    };

    load_wg_tile_async<BLOCK_N, HD, C::THREADS>(k_tile, p.k + qkv_offset + (long)n0 * p.qkv_stride, p.qkv_stride,
                                                T - n0);
    load_wg_tile_async<BLOCK_N, HD, C::THREADS>(v_tile, p.v + qkv_offset + (long)n0 * p.qkv_stride, p.qkv_stride,
                                                T - n0);
    load_query_block(m_begin, 0);
    cp_async_commit();

    float acc_dk[HD / 2], acc_dv[HD / 2];  // 64 keys × HD per warpgroup
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc_dk[i] = acc_dv[i] = 0.f;

    const uint32_t k_addr = smem_address(k_tile), v_addr = smem_address(v_tile);
    const uint32_t q_addr0 = smem_address(q_tiles), do_addr0 = smem_address(do_tiles);
    const uint32_t ds_addr0 = smem_address(ds_tiles);
    const uint32_t wg_rows = KvTile::row_offset(wg * 64);  // this warpgroup's 64 key rows within a K/V sub-tile
    const int dq_row0 = C::DQ_M_SPLIT ? wg * 64 : 0, dq_col0 = wg * C::DQ_COL0;
    constexpr int DQ_N = C::DQ_N;

    // dQ_block(mq) = dS K from dSᵀ buffer dbuf: this warpgroup's 64 × DQ_N part. A = dS (queries ×
    // keys) is MN-major in dSᵀ; B = K (keys × HD) is MN-major in the K tile. Issued, not waited for.
    auto issue_dq = [&](float (&acc_dq)[DQ_N / 2], int dbuf) {
        const uint32_t a0 = ds_addr0 + dbuf * DsTile::ELEMS * 2 + (dq_row0 / 64) * DsTile::SUB_BYTES;
        const uint32_t b0 = k_addr + (dq_col0 / KvTile::SUB_COLS) * KvTile::SUB_BYTES;
#pragma unroll
        for (int ks = 0; ks < BLOCK_N / 16; ks++)
            wgmma_ss<DQ_N, 1, 1>(acc_dq, DsTile::mn_major(a0 + DsTile::mn_step(ks)),
                                 KvTile::mn_major(b0 + KvTile::mn_step(ks)), ks > 0);
    };
    auto add_dq = [&](const float (&acc_dq)[DQ_N / 2], int mq) {
        const int first_nt = wg == 1 ? C::DQ_SKIP / 8 : 0;  // columns warpgroup 0 also computed
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int qi = mq * BLOCK_M + dq_row0 + row_in_wg + 8 * half;
            if (qi < T) {
                float* dst = dq_head + (long)qi * HD + dq_col0 + 2 * t4;
#pragma unroll
                for (int nt = 0; nt < DQ_N / 8; nt++)
                    if (nt >= first_nt)
                        atomic_add_f32x2(dst + nt * 8, acc_dq[4 * nt + 2 * half], acc_dq[4 * nt + 2 * half + 1]);
            }
        }
    };

    // One step: query block m. FIRST (a compile-time tag) has no dQ product of a previous step to
    // issue; peeling it keeps every wgmma on a path the whole warpgroup takes unconditionally.
    auto step = [&](int m, auto first_tag) {
        constexpr bool FIRST = decltype(first_tag)::value;
        const int m0 = m * BLOCK_M, buf = (m - m_begin) & 1;
        const int dbuf = DEFER_DQ ? buf : 0;
        const uint32_t q_addr = q_addr0 + buf * QoTile::ELEMS * 2, do_addr = do_addr0 + buf * QoTile::ELEMS * 2;
        const float* lse_tile = lse_tiles + buf * BLOCK_M;
        const float* d_tile = d_tiles + buf * BLOCK_M;
        cp_async_wait<0>();   // block m (and K, V) have landed
        fence_proxy_async();  // ... and are visible to wgmma, as is this thread's dSᵀ of step m-1
        __syncthreads();      // every warp has left step m-1: the other buffers are free
        if (m + 1 < m_end) load_query_block(m + 1, buf ^ 1);
        cp_async_commit();

        float acc_dq[DQ_N / 2];
        wgmma_fence();
        if constexpr (DEFER_DQ && !FIRST) {
            issue_dq(acc_dq, dbuf ^ 1);
            wgmma_commit();
        }
        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: 64 keys × BLOCK_M queries per warpgroup, k = HD
        float s[BLOCK_M / 2], dp[BLOCK_M / 2];
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_M, 0, 0>(s, KvTile::k_major(k_addr + wg_rows + KvTile::k_step(ks)),
                                    QoTile::k_major(q_addr + QoTile::k_step(ks)), ks > 0);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
            wgmma_ss<BLOCK_M, 0, 0>(dp, KvTile::k_major(v_addr + wg_rows + KvTile::k_step(ks)),
                                    QoTile::k_major(do_addr + QoTile::k_step(ks)), ks > 0);
        wgmma_commit();
        if constexpr (DEFER_DQ && !FIRST) {
            wgmma_wait<1>();
            wgmma_fence_registers(acc_dq);
            add_dq(acc_dq, m - 1);
        }
        wgmma_wait<0>();
        wgmma_fence_registers(s);
        wgmma_fence_registers(dp);

        // Pᵀ and dSᵀ, packed to bf16 A fragments (k = queries 16·kq..16·kq+15)
        const bool needs_mask = m0 + BLOCK_M > T || n0 + BLOCK_N > T || (CAUSAL && n0 + BLOCK_N - 1 > m0);
        uint32_t pa[BLOCK_M / 16][4], dsa[BLOCK_M / 16][4];
#pragma unroll
        for (int nt = 0; nt < BLOCK_M / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = n0 + wg * 64 + row_in_wg + (e >= 2 ? 8 : 0);
                const int qi = nt * 8 + 2 * t4 + (e & 1);
                float pe = fast_exp2(fmaf(s[4 * nt + e], p.scale_log2, -lse_tile[qi]));
                if (needs_mask && (key >= T || m0 + qi >= T || (CAUSAL && key > m0 + qi))) pe = 0.f;
                s[4 * nt + e] = pe;
                dp[4 * nt + e] = pe * (dp[4 * nt + e] - d_tile[qi]);
            }
#pragma unroll
        for (int kq = 0; kq < BLOCK_M / 16; kq++) {
            accumulators_to_a(pa[kq], &s[8 * kq], &s[8 * kq + 4]);
            accumulators_to_a(dsa[kq], &dp[8 * kq], &dp[8 * kq + 4]);
        }

        // dSᵀ (bf16) to shared memory for the dQ product, before the wgmma that reads dsa from
        // registers is issued (so no instruction touches its operands while it runs). The A fragment
        // a[0..3] holds (row, 2t), (row+8, 2t), (row, 2t+8), (row+8, 2t+8) of queries 16·kq...
        __nv_bfloat16* ds_tile = ds_tiles + dbuf * DsTile::ELEMS;
        const int ds_row = wg * 64 + row_in_wg;
#pragma unroll
        for (int kq = 0; kq < BLOCK_M / 16; kq++) {
            *(uint32_t*)(ds_tile + DsTile::index(ds_row, 2 * kq) + 2 * t4) = dsa[kq][0];
            *(uint32_t*)(ds_tile + DsTile::index(ds_row + 8, 2 * kq) + 2 * t4) = dsa[kq][1];
            *(uint32_t*)(ds_tile + DsTile::index(ds_row, 2 * kq + 1) + 2 * t4) = dsa[kq][2];
            *(uint32_t*)(ds_tile + DsTile::index(ds_row + 8, 2 * kq + 1) + 2 * t4) = dsa[kq][3];
        }

        // dV += Pᵀ dO and dK += dSᵀ Q: B = dO, Q (queries × HD), MN-major
        wgmma_fence();
#pragma unroll
        for (int kq = 0; kq < BLOCK_M / 16; kq++)
            wgmma_rs<HD, 1>(acc_dv, pa[kq], QoTile::mn_major(do_addr + QoTile::mn_step(kq)), 1);
#pragma unroll
        for (int kq = 0; kq < BLOCK_M / 16; kq++)
            wgmma_rs<HD, 1>(acc_dk, dsa[kq], QoTile::mn_major(q_addr + QoTile::mn_step(kq)), 1);
        wgmma_commit();
        if constexpr (!DEFER_DQ) {
            fence_proxy_async();
            __syncthreads();  // all of dSᵀ is in shared memory
            wgmma_fence();
            issue_dq(acc_dq, 0);
            wgmma_commit();
        }
        wgmma_wait<0>();
        wgmma_fence_registers(acc_dv);
        wgmma_fence_registers(acc_dk);
        if constexpr (!DEFER_DQ) {
            wgmma_fence_registers(acc_dq);
            add_dq(acc_dq, m);
        }
    };
    step(m_begin, std::true_type());
    for (int m = m_begin + 1; m < m_end; m++) step(m, std::false_type());
    if constexpr (DEFER_DQ) {
        fence_proxy_async();
        __syncthreads();  // the last dSᵀ is in shared memory
        float acc_dq[DQ_N / 2];
        wgmma_fence();
        issue_dq(acc_dq, (m_end - 1 - m_begin) & 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_registers(acc_dq);
        add_dq(acc_dq, m_end - 1);
    }

    // dK·scale and dV straight from the accumulators (once per block: 4-byte stores suffice)
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int key = n0 + wg * 64 + row_in_wg + 8 * half;
        if (key < T) {
            const long offset = ((long)b * T + key) * p.dqkv_stride + (long)h * HD + 2 * t4;
#pragma unroll
            for (int nt = 0; nt < HD / 8; nt++) {
                *(uint32_t*)(p.dk + offset + nt * 8) =
                    pack_bf16(acc_dk[4 * nt + 2 * half] * p.scale, acc_dk[4 * nt + 2 * half + 1] * p.scale);
                *(uint32_t*)(p.dv + offset + nt * 8) = pack_bf16(acc_dv[4 * nt + 2 * half], acc_dv[4 * nt + 2 * half + 1]);
            }
        }
    }
#else
    __trap();  // built for a GPU without wgmma; the host never launches it there
#endif
}

template <int HD, int BLOCK_M, bool DEFER_DQ, bool CAUSAL>
static inline void launch_backward_hopper(const Flash2BackwardParams* p, int B, cudaStream_t stream) {
    typedef Flash2BackwardHopperConfig<HD, BLOCK_M, DEFER_DQ> C;
    launch_backward_preprocess<HD>(p, B, stream);

    launch_with_smem<Flash2BackwardParams, flash2_backward_hopper_kernel<HD, BLOCK_M, DEFER_DQ, CAUSAL>>(
        dim3((p->T + C::BLOCK_N - 1) / C::BLOCK_N, B * p->NH), C::THREADS, C::SMEM_BYTES, stream, *p);

    launch_backward_convert_dq<HD>(p, B, stream);
}

#endif  // FLASH2_BACKWARD_HOPPER_CUH
