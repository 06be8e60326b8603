// dev probe: cuBLASLt algorithm configurations beyond the heuristic's for the two GELU-epilogue
// GEMMs (GPT3-1.3B, 16384 tokens, the trainer's descriptors): for algo ids 66 (nvjet) and 39
// (xmma), every tile x stages x custom-option x cluster-shape x swizzle combination that
// cublasLtMatmulAlgoCheck accepts is timed (best of 2 x 5 runs); the best 8 are printed.
#include "layers/matmul_lt.cuh"
#include <vector>
#include <algorithm>
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.2f);
    }
}
struct Timed { float ms; cublasLtMatmulAlgo_t algo; };
static std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t* a, cublasLtMatmulAlgoCapAttributes_t attr) {
    size_t bytes = 0;
    cublasLtMatmulAlgoCapGetAttribute(a, attr, NULL, 0, &bytes);
    std::vector<uint32_t> v(bytes / 4);
    if (bytes) cublasLtMatmulAlgoCapGetAttribute(a, attr, v.data(), bytes, &bytes);
    if (v.empty()) v.push_back(0);
    return v;
}
static void explore(MatmulContext* ctx, MatmulLtGemm* g, int id) {
    MatmulLtDescs x; matmul_lt_descs_create(g, &x);
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(ctx->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, id, &base)) return;
    std::vector<uint32_t> tiles = cap_list(&base, CUBLASLT_ALGO_CAP_TILE_IDS), stages = cap_list(&base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    int32_t custom_max = 0, swz = 0; size_t got;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof(custom_max), &got);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz, sizeof(swz), &got);
    const uint32_t clusters[] = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};  // cublasLtClusterShape_t values
    printf("%s %s id %d: %zu tiles, %zu stages, custom max %d, swizzle %d\n", g->what, matmul_epilogue_name(g->epilogue), id,
           tiles.size(), stages.size(), custom_max, swz);
    std::vector<Timed> ok; long checked = 0;
    const double flops = 2.0 * g->m * g->n * g->k;
    for (uint32_t t : tiles) for (uint32_t s : stages) for (int c = 0; c <= std::min(custom_max, 3); c++)
    for (uint32_t cl : clusters) for (uint32_t sw = 0; sw <= (swz ? 1u : 0u); sw++) {
        cublasLtMatmulAlgo_t a = base;
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof(t));
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &s, sizeof(s));
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c, sizeof(c));
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof(cl)) && cl != 0) continue;
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof(sw));
        if (ok.size() >= 1500) break;
        cublasLtMatmulHeuristicResult_t r; checked++;
        if (cublasLtMatmulAlgoCheck(ctx->lt, x.desc, x.a, x.b, x.d, x.d, &a, &r)) continue;
        if (r.workspaceSize > ctx->workspace_bytes) continue;
        Timed tm; tm.algo = a; tm.ms = 1e9f;
        if (matmul_lt_launch(ctx, g, &x, &a)) { (void)cudaGetLastError(); continue; }
        for (int rep = 0; rep < 2; rep++) {
            CUDA_CHECK(cudaEventRecord(ctx->events[0], ctx->stream));
            for (int i = 0; i < 5; i++) matmul_lt_launch(ctx, g, &x, &a);
            CUDA_CHECK(cudaEventRecord(ctx->events[1], ctx->stream)); CUDA_CHECK(cudaEventSynchronize(ctx->events[1]));
            float ms; cudaEventElapsedTime(&ms, ctx->events[0], ctx->events[1]); tm.ms = std::min(tm.ms, ms / 5);
        }
        ok.push_back(tm);
    }
    std::sort(ok.begin(), ok.end(), [](const Timed& p, const Timed& q) { return p.ms < q.ms; });
    printf("  %ld combinations checked, %zu accepted and timed\n", checked, ok.size());
    for (size_t i = 0; i < ok.size() && i < 8; i++) {
        char d[128]; matmul_algo_describe(&ok[i].algo, d, sizeof(d));
        int32_t c = 0, sw = 0; cublasLtMatmulAlgoConfigGetAttribute(&ok[i].algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c, sizeof(c), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&ok[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof(sw), &got);
        printf("  %6.1f TFLOP/s  %s custom %d swizzle %d\n", flops / ok[i].ms / 1e9, d, c, sw);
    }
    fflush(stdout);
    matmul_lt_descs_destroy(&x);
}
static void heuristic_row(MatmulContext* ctx, MatmulLtGemm* g) {
    MatmulLtDescs x; matmul_lt_descs_create(g, &x);
    cublasLtMatmulHeuristicResult_t res[MATMUL_TUNE_CANDIDATES]; float ms[MATMUL_TUNE_CANDIDATES];
    int n = matmul_lt_heuristic(ctx, g, &x, res, MATMUL_TUNE_CANDIDATES);
    int pick = matmul_lt_tune(ctx, g, &x, res, n, ms);
    char d[128]; matmul_algo_describe(&res[pick].algo, d, sizeof(d));
    printf("%s %s: the trainer's start-up choice %.1f TFLOP/s (%s)\n", g->what, matmul_epilogue_name(g->epilogue),
           2.0 * g->m * g->n * g->k / ms[pick] / 1e9, d);
    matmul_lt_descs_destroy(&x);
}
int main() {
    cudaStream_t s; CUDA_CHECK(cudaStreamCreate(&s));
    MatmulContext ctx; matmul_context_create(&ctx, s);
    const int64_t T = 16384, C = 2048, H = 4 * C;
    __nv_bfloat16 *A, *B, *D, *AUX, *BIAS;
    CUDA_CHECK(cudaMalloc(&A, T * C * 2)); CUDA_CHECK(cudaMalloc(&B, H * C * 2)); CUDA_CHECK(cudaMalloc(&D, T * H * 2));
    CUDA_CHECK(cudaMalloc(&AUX, T * H * 2)); CUDA_CHECK(cudaMalloc(&BIAS, H * 2));
    fill<<<1024, 256>>>(A, T * C, 1); fill<<<1024, 256>>>(B, H * C, 2); fill<<<1024, 256>>>(AUX, T * H, 4); fill<<<64, 256>>>(BIAS, H, 5);
    CUDA_CHECK(cudaDeviceSynchronize());
    MatmulLtGemm fwd = matmul_lt_plain("fc fwd", CUBLAS_OP_T, CUBLAS_OP_N, H, T, C, B, C, A, C, D, H, 0.0f);
    fwd.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; fwd.bias = BIAS; fwd.aux = AUX; fwd.aux_ld = H;
    MatmulLtGemm bwd = matmul_lt_plain("fcproj dinp", CUBLAS_OP_N, CUBLAS_OP_N, H, T, C, B, H, A, C, D, H, 0.0f);
    bwd.epilogue = CUBLASLT_EPILOGUE_DGELU; bwd.aux = AUX; bwd.aux_ld = H;
    heuristic_row(&ctx, &fwd); explore(&ctx, &fwd, 66);
    heuristic_row(&ctx, &bwd); explore(&ctx, &bwd, 39); explore(&ctx, &bwd, 66);
    return 0;
}
