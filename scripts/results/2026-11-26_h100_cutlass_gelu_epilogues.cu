// dev probe: CUTLASS 3 (sm90 TMA warp-specialized, ping-pong and cooperative) GEMMs with the GELU
// epilogues fused through its epilogue visitor, against cuBLASLt's (the trainer's descriptors,
// layers/matmul_lt.cuh) on GPT3-1.3B's MLP shapes at 16384 tokens: burst and sustained (1 s at
// the power limit) TFLOP/s, and the outputs compared with cuBLASLt's.
#include <dlfcn.h>
#include <unistd.h>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "layers/matmul_lt.cuh"
using namespace cute;
using bf16 = cutlass::bfloat16_t;

template <class Tile, class Cluster, class KernelSched, class EpiSched, class LayoutB, class Fusion, class ElementC>
struct GemmOf {
    using LayoutA = cutlass::layout::RowMajor;
    using LayoutD = cutlass::layout::RowMajor;
    using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
        float, float, ElementC, LayoutD, 8, bf16, LayoutD, 8, EpiSched, Fusion>::CollectiveOp;
    using Main = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, LayoutA, 8, bf16, LayoutB, 8, float, Tile, Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
        KernelSched>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using RM = cutlass::layout::RowMajor;
using CM = cutlass::layout::ColumnMajor;
using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EPP = cutlass::epilogue::TmaWarpSpecialized;
using ECO = cutlass::epilogue::TmaWarpSpecializedCooperative;
using T128 = Shape<_128, _128, _64>;
using T256 = Shape<_256, _128, _64>;
using C21 = Shape<_2, _1, _1>;
using C12 = Shape<_1, _2, _1>;
using FPlain = cutlass::epilogue::fusion::LinearCombination<bf16, float, void>;
using FBias = cutlass::epilogue::fusion::LinCombPerColBias<bf16, float, bf16, void>;
using FGelu = cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<RM, cutlass::epilogue::thread::GELU_taylor, bf16, float, bf16, bf16, void>;
using FDGelu = cutlass::epilogue::fusion::LinCombDeEltAct<RM, cutlass::epilogue::thread::dGELU, bf16, float, bf16, void>;

// forward: pre (M tokens, N = 4C) = inp (M, K) · W (N, K)ᵀ [+ bias]; W row-major = B column-major
using FwdBiasPP = GemmOf<T128, C21, PP, EPP, CM, FBias, void>::Gemm;
using FwdGeluPP = GemmOf<T128, C21, PP, EPP, CM, FGelu, void>::Gemm;
using FwdGeluCO = GemmOf<T256, C21, CO, ECO, CM, FGelu, void>::Gemm;
// backward: dg (M, N = 4C) = dout (M, K = C) · Wproj (K, N) row-major; then dGELU with aux = pre
using BwdPlainPP = GemmOf<T128, C21, PP, EPP, RM, FPlain, void>::Gemm;
using BwdDGeluPP = GemmOf<T128, C21, PP, EPP, RM, FDGelu, void>::Gemm;
using BwdDGeluCO = GemmOf<T256, C21, CO, ECO, RM, FDGelu, void>::Gemm;

static void* g_ws; static size_t g_ws_bytes = 64 << 20; static cudaStream_t g_s;
struct Bufs { bf16 *A, *B, *D, *aux, *bias; };

template <class Gemm>
static typename Gemm::Arguments make_args(int M, int N, int K, Bufs b, bool gelu_fwd, bool dgelu, bool bias) {
    using SA = typename Gemm::GemmKernel::StrideA; using SB = typename Gemm::GemmKernel::StrideB;
    using SC = typename Gemm::GemmKernel::StrideC; using SD = typename Gemm::GemmKernel::StrideD;
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {M, N, K, 1};
    args.mainloop.ptr_A = b.A; args.mainloop.dA = cutlass::make_cute_packed_stride(SA{}, make_shape(M, K, 1));
    args.mainloop.ptr_B = b.B; args.mainloop.dB = cutlass::make_cute_packed_stride(SB{}, make_shape(N, K, 1));
    args.epilogue.ptr_C = nullptr; args.epilogue.dC = cutlass::make_cute_packed_stride(SC{}, make_shape(M, N, 1));
    args.epilogue.ptr_D = b.D; args.epilogue.dD = cutlass::make_cute_packed_stride(SD{}, make_shape(M, N, 1));
    auto& f = args.epilogue.thread;
    f.alpha = 1.0f; f.beta = 0.0f;
    if constexpr (requires { f.bias_ptr; }) if (bias || gelu_fwd) f.bias_ptr = b.bias;
    if constexpr (requires { f.aux_ptr; }) {
        f.aux_ptr = b.aux;
        f.dAux = cutlass::make_cute_packed_stride(decltype(f.dAux){}, make_shape(M, N, 1));
    }
    (void)dgelu;
    return args;
}

template <class Gemm>
static float run(Gemm& gemm, int reps) {
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0, g_s);
    for (int i = 0; i < reps; i++) if (gemm.run(g_s) != cutlass::Status::kSuccess) { printf("run failed\n"); exit(1); }
    cudaEventRecord(e1, g_s); CUDA_CHECK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1); return ms / reps;
}
static float sustained(float (*fn)(void*, int), void* ctx, double window_s, float est_ms) {
    const int warm = (int)(window_s * 0.25e3 / est_ms) + 1, runs = (int)(window_s * 0.75e3 / est_ms) + 1;
    fn(ctx, warm);
    return fn(ctx, runs);
}
template <class Gemm> struct CutlassCase {
    Gemm gemm;
    static float go(void* p, int reps) { return run(((CutlassCase*)p)->gemm, reps); }
};
struct LtCase {
    MatmulContext* ctx; MatmulLtGemm g; MatmulLtDescs x; cublasLtMatmulAlgo_t algo;
    static float go(void* p, int reps) {
        LtCase* c = (LtCase*)p;
        CUDA_CHECK(cudaEventRecord(c->ctx->events[0], g_s));
        for (int i = 0; i < reps; i++) CUBLAS_CHECK(matmul_lt_launch(c->ctx, &c->g, &c->x, &c->algo));
        CUDA_CHECK(cudaEventRecord(c->ctx->events[1], g_s)); CUDA_CHECK(cudaEventSynchronize(c->ctx->events[1]));
        float ms; cudaEventElapsedTime(&ms, c->ctx->events[0], c->ctx->events[1]); return ms / reps;
    }
};
__global__ void fill(bf16* p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = bf16(((h & 0xFFFF) / 65536.0f - 0.5f) * scale);
    }
}
__global__ void reldiff(const bf16* a, const bf16* b, size_t n, float* out) {
    float m = 0, s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = float(a[i]), y = float(b[i]); m = fmaxf(m, fabsf(x - y)); s = fmaxf(s, fabsf(y));
        if (x != x) m = 1e30f;
    }
    atomicMax((int*)&out[0], __float_as_int(m)); atomicMax((int*)&out[1], __float_as_int(s));
}
static void compare(const char* what, const bf16* a, const bf16* b, size_t n) {
    float* d; CUDA_CHECK(cudaMalloc(&d, 8)); CUDA_CHECK(cudaMemset(d, 0, 8));
    reldiff<<<1024, 256>>>(a, b, n, d); float h[2]; CUDA_CHECK(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
    printf("    %s: max|diff| %.3g of max|ref| %.3g\n", what, h[0], h[1]); cudaFree(d);
}

template <class Gemm>
static void cutlass_row(const char* name, int M, int N, int K, Bufs b, bool gelu_fwd, bool dgelu, bool bias, double window,
                        int rounds, const bf16* refD, const bf16* refAux, bf16* poison_aux) {
    auto* c = new CutlassCase<Gemm>();
    auto args = make_args<Gemm>(M, N, K, b, gelu_fwd, dgelu, bias);
    if (c->gemm.can_implement(args) != cutlass::Status::kSuccess) { printf("%-34s cannot implement\n", name); return; }
    if (Gemm::get_workspace_size(args) > g_ws_bytes) { printf("%-34s workspace too large\n", name); return; }
    if (c->gemm.initialize(args, g_ws, g_s) != cutlass::Status::kSuccess) { printf("%-34s init failed\n", name); return; }
    CUDA_CHECK(cudaMemsetAsync(b.D, 0xff, (size_t)M * N * 2, g_s));  // poison: NaN
    if (gelu_fwd) CUDA_CHECK(cudaMemsetAsync(poison_aux, 0xff, (size_t)M * N * 2, g_s));
    run(c->gemm, 1);
    CUDA_CHECK(cudaStreamSynchronize(g_s));
    float burst = 1e9, sus = 0;
    for (int r = 0; r < 2; r++) burst = fminf(burst, run(c->gemm, 3));
    for (int r = 0; r < rounds; r++) sus += sustained(CutlassCase<Gemm>::go, c, window, burst) / rounds;
    const double fl = 2.0 * M * N * K;
    printf("%-34s burst %6.1f  sustained %6.1f TFLOP/s  (%.3f ms)\n", name, fl / burst / 1e9, fl / sus / 1e9, sus);
    if (refD) {
        CUDA_CHECK(cudaMemsetAsync(b.D, 0xff, (size_t)M * N * 2, g_s));
        if (gelu_fwd) CUDA_CHECK(cudaMemsetAsync(poison_aux, 0xff, (size_t)M * N * 2, g_s));
        run(c->gemm, 1);
        compare("D vs cuBLASLt", b.D, refD, (size_t)M * N);
        if (gelu_fwd && refAux) compare("aux (pre) vs cuBLASLt", poison_aux, refAux, (size_t)M * N);
    }
    fflush(stdout);
}

static void lt_row(const char* name, MatmulContext* ctx, MatmulLtGemm g, double window, int rounds) {
    LtCase c; c.ctx = ctx; c.g = g; matmul_lt_descs_create(&c.g, &c.x);
    cublasLtMatmulHeuristicResult_t res[MATMUL_TUNE_CANDIDATES]; float ms[MATMUL_TUNE_CANDIDATES];
    const int count = matmul_lt_heuristic(ctx, &c.g, &c.x, res, MATMUL_TUNE_CANDIDATES);
    const int pick = matmul_lt_tune(ctx, &c.g, &c.x, res, count, ms);
    c.algo = res[pick].algo;
    float sus = 0;
    for (int r = 0; r < rounds; r++) sus += sustained(LtCase::go, &c, window, ms[pick]) / rounds;
    const double fl = 2.0 * g.m * g.n * g.k;
    printf("%-34s burst %6.1f  sustained %6.1f TFLOP/s  (%.3f ms)\n", name, fl / ms[pick] / 1e9, fl / sus / 1e9, sus);
    LtCase::go(&c, 1);
    fflush(stdout);
}

int main(int argc, char** argv) {
    const double window = argc > 1 ? atof(argv[1]) : 1.0;
    const int rounds = argc > 2 ? atoi(argv[2]) : 2;
    CUDA_CHECK(cudaStreamCreate(&g_s)); CUDA_CHECK(cudaMalloc(&g_ws, g_ws_bytes));
    MatmulContext ctx; matmul_context_create(&ctx, g_s);
    const int M = 16384, C = 2048, N = 4 * C;
    size_t big = (size_t)M * N;
    bf16 *A, *W, *D, *aux, *bias, *refD, *refAux, *aux2;
    CUDA_CHECK(cudaMalloc(&A, (size_t)M * C * 2)); CUDA_CHECK(cudaMalloc(&W, (size_t)N * C * 2));
    CUDA_CHECK(cudaMalloc(&D, big * 2)); CUDA_CHECK(cudaMalloc(&aux, big * 2)); CUDA_CHECK(cudaMalloc(&aux2, big * 2));
    CUDA_CHECK(cudaMalloc(&refD, big * 2)); CUDA_CHECK(cudaMalloc(&refAux, big * 2)); CUDA_CHECK(cudaMalloc(&bias, N * 2));
    fill<<<1024, 256>>>(A, (size_t)M * C, 1, 2.0f); fill<<<1024, 256>>>(W, (size_t)N * C, 2, 0.1f);
    fill<<<64, 256>>>(bias, N, 5, 1.0f); fill<<<1024, 256>>>(aux, big, 4, 6.0f);
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("cuBLASLt %zu; window %.2f s x %d rounds; M %d N %d K %d\n", cublasLtGetVersion(), window, rounds, M, N, C);
    // forward, cuBLASLt as the trainer calls it: column-major m = N (features), n = M (tokens)
    printf("## fc forward: pre = inp · Wᵀ + b, GELU\n");
    MatmulLtGemm g = matmul_lt_plain("fc fwd", CUBLAS_OP_T, CUBLAS_OP_N, N, M, C, W, C, A, C, D, N, 0.0f);
    g.epilogue = CUBLASLT_EPILOGUE_BIAS; g.bias = bias;
    lt_row("cuBLASLt BIAS", &ctx, g, window, rounds);
    g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; g.aux = refAux; g.aux_ld = N;
    lt_row("cuBLASLt GELU_AUX_BIAS", &ctx, g, window, rounds);
    CUDA_CHECK(cudaMemcpy(refD, D, big * 2, cudaMemcpyDeviceToDevice));
    Bufs bf = {A, W, D, aux2, bias};
    cutlass_row<FwdBiasPP>("CUTLASS ping-pong 128x128 bias", M, N, C, bf, false, false, true, window, rounds, NULL, NULL, aux2);
    cutlass_row<FwdGeluPP>("CUTLASS ping-pong 128x128 GELU aux", M, N, C, bf, true, false, true, window, rounds, refD, refAux, aux2);
    cutlass_row<FwdGeluCO>("CUTLASS cooperative 256x128 GELU aux", M, N, C, bf, true, false, true, window, rounds, refD, refAux, aux2);
    // backward: dg = dout (M, C) · Wproj (C, N) row-major; cuBLASLt column-major m = N, n = M, op N N
    printf("## fcproj dinp: dpre = dGELU(dout · Wproj, pre)\n");
    g = matmul_lt_plain("fcproj dinp", CUBLAS_OP_N, CUBLAS_OP_N, N, M, C, W, N, A, C, D, N, 0.0f);
    lt_row("cuBLASLt DEFAULT", &ctx, g, window, rounds);
    g.epilogue = CUBLASLT_EPILOGUE_DGELU; g.aux = aux; g.aux_ld = N;
    lt_row("cuBLASLt DGELU", &ctx, g, window, rounds);
    CUDA_CHECK(cudaMemcpy(refD, D, big * 2, cudaMemcpyDeviceToDevice));
    Bufs bb = {A, W, D, aux, bias};
    cutlass_row<BwdPlainPP>("CUTLASS ping-pong 128x128 plain", M, N, C, bb, false, false, false, window, rounds, NULL, NULL, aux2);
    cutlass_row<BwdDGeluPP>("CUTLASS ping-pong 128x128 dGELU", M, N, C, bb, false, true, false, window, rounds, refD, NULL, aux2);
    cutlass_row<BwdDGeluCO>("CUTLASS cooperative 256x128 dGELU", M, N, C, bb, false, true, false, window, rounds, refD, NULL, aux2);
    return 0;
}
