// dev probe: which cuBLASLt kernels (speed) exist for DGELU / GELU_AUX_BIAS per transpose combination
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("cuda %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
#define BK(x) do { cublasStatus_t s = (x); if (s) { printf("cublas %d line %d\n", (int)s, __LINE__); exit(1);} } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.1f);
    }
}
cublasLtHandle_t lt; void* ws; size_t wsb = 64 << 20;
__nv_bfloat16 *A, *B, *D, *AUX, *BIAS;
void probe(const char* name, cublasLtEpilogue_t epi, int m, int n, int k, int ta, int tb) {
    cublasLtMatmulDesc_t desc; BK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &BIAS, sizeof(BIAS)));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        int64_t ld = m;
        BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &AUX, sizeof(AUX)));
        BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, ta ? k : m));
    BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, tb ? n : k));
    BK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m));
    cublasLtMatmulPreference_t pref; BK(cublasLtMatmulPreferenceCreate(&pref));
    BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res[16]; int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, res, &found);
    float alpha = 1, beta = 0; float best = 1e9; int besti = -1, bestid = -1, ids[16];
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; st == 0 && i < found; i++) {
        size_t got; int32_t id = 0; cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got); ids[i] = id;
        if (cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[i].algo, ws, wsb, 0)) continue;
        cudaEventRecord(e0);
        for (int r = 0; r < 20; r++) cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[i].algo, ws, wsb, 0);
        cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 20;
        if (ms < best) best = ms, besti = i, bestid = id;
    }
    printf("%-14s %-14s m%6d n%6d k%5d op%c%c  found %2d (st %d)", name,
           epi == CUBLASLT_EPILOGUE_DGELU ? "DGELU" : epi == CUBLASLT_EPILOGUE_DEFAULT ? "DEFAULT" : "GELU_AUX_BIAS", m, n, k,
           ta ? 'T' : 'N', tb ? 'T' : 'N', found, (int)st);
    if (besti >= 0) printf("  best #%d id %d: %.3f ms %.0f TFLOP/s  ids:", besti, bestid, best, 2.0 * m * n * k / best / 1e9);
    for (int i = 0; st == 0 && i < found; i++) printf(" %d", ids[i]);
    printf("\n");
    cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld); cublasLtMatmulDescDestroy(desc);
}
int main() {
    BK(cublasLtCreate(&lt)); CK(cudaMalloc(&ws, wsb));
    size_t big = (size_t)16384 * 8192;
    CK(cudaMalloc(&A, big * 2)); CK(cudaMalloc(&B, big * 2)); CK(cudaMalloc(&D, big * 2)); CK(cudaMalloc(&AUX, big * 2)); CK(cudaMalloc(&BIAS, 65536 * 2));
    fill<<<1024, 256>>>(A, big, 1); fill<<<1024, 256>>>(B, big, 2); fill<<<1024, 256>>>(D, big, 3); fill<<<1024, 256>>>(AUX, big, 4); fill<<<64, 256>>>(BIAS, 65536, 5);
    CK(cudaDeviceSynchronize());
    const int N = 16384, C = 2048;
    for (int rep = 0; rep < 2; rep++) {
        // fcproj dinp: D (4C, N) col-major = dinp row-major (N, 4C); k = C
        for (int ta = 0; ta < 2; ta++) for (int tb = 0; tb < 2; tb++) {
            probe("fcproj dinp", CUBLASLT_EPILOGUE_DGELU, 4 * C, N, C, ta, tb);
            probe("fcproj dinp", CUBLASLT_EPILOGUE_DEFAULT, 4 * C, N, C, ta, tb);
            probe("fcproj dinpT", CUBLASLT_EPILOGUE_DGELU, N, 4 * C, C, ta, tb);
        }
        for (int ta = 0; ta < 2; ta++) for (int tb = 0; tb < 2; tb++) {
            probe("fc fwd", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 4 * C, N, C, ta, tb);
            probe("fc fwdT", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, N, 4 * C, C, ta, tb);
        }
        probe("fc fwd", CUBLASLT_EPILOGUE_DEFAULT, 4 * C, N, C, 1, 0);
        // 2.7B: C = 2560
        probe("2.7b dinp", CUBLASLT_EPILOGUE_DGELU, 4 * 2560, N, 2560, 0, 0);
        probe("2.7b dinp", CUBLASLT_EPILOGUE_DEFAULT, 4 * 2560, N, 2560, 0, 0);
    }
    return 0;
}
