// dev probe: does any cuBLASLt algorithm besides id 39 accept the DGELU epilogue?
// 1) every algo id's epilogue capability mask; 2) the DEFAULT epilogue's heuristic algos checked
// (cublasLtMatmulAlgoCheck) and timed under DGELU / GELU_AUX_BIAS descs; 3) DGELU heuristics
// under variants of the desc. Outputs compared to the heuristic's own DGELU result.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("cuda %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
#define BK(x) do { cublasStatus_t s = (x); if (s) { printf("cublas %d line %d\n", (int)s, __LINE__); exit(1);} } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 2.0f);
    }
}
__global__ void diff(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, float* out) {
    float m = 0, s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]); m = fmaxf(m, fabsf(x - y)); s = fmaxf(s, fabsf(y));
    }
    atomicMax((int*)&out[0], __float_as_int(m)); atomicMax((int*)&out[1], __float_as_int(s));
}
cublasLtHandle_t lt; void* ws; size_t wsb = 64 << 20;
__nv_bfloat16 *A, *B, *D, *REF, *AUX, *BIAS; float* dev2;
const char* ename(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU ? "DGELU" : e == CUBLASLT_EPILOGUE_DEFAULT ? "DEFAULT" :
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "GELU_AUX_BIAS" : e == CUBLASLT_EPILOGUE_DGELU_BGRAD ? "DGELU_BGRAD" : "?";
}
struct Prob { cublasLtMatmulDesc_t desc; cublasLtMatrixLayout_t la, lb, ld; int m, n, k; };
Prob make(cublasLtEpilogue_t epi, int m, int n, int k, int variant) {
    Prob p; p.m = m; p.n = n; p.k = k;
    BK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU_BGRAD)
        BK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &BIAS, sizeof(BIAS)));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        int64_t ld = m;
        BK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &AUX, sizeof(AUX)));
        BK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        if (variant == 1) { cudaDataType_t t = CUDA_R_16BF;
            BK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof(t))); }
        if (variant == 2) { int32_t fast = 1;  // fast accumulation mode is fp8 only; harmless otherwise
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)); }
    }
    BK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, m, k, m));
    BK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, k, n, k));
    BK(cublasLtMatrixLayoutCreate(&p.ld, CUDA_R_16BF, m, n, m));
    return p;
}
int heur(Prob& p, cublasLtMatmulHeuristicResult_t* res, int want) {
    cublasLtMatmulPreference_t pref; BK(cublasLtMatmulPreferenceCreate(&pref));
    BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.la, p.lb, p.ld, p.ld, pref, want, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    return st ? -(int)st : found;
}
int algo_id(const cublasLtMatmulAlgo_t* a) { int32_t id = -1; size_t got; cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got); return id; }
float run_ms(Prob& p, const cublasLtMatmulAlgo_t* algo, int reps) {
    float alpha = 1, beta = 0;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    if (cublasLtMatmul(lt, p.desc, &alpha, A, p.la, B, p.lb, &beta, D, p.ld, D, p.ld, algo, ws, wsb, 0)) return -1;
    cudaEventRecord(e0);
    for (int r = 0; r < reps; r++) cublasLtMatmul(lt, p.desc, &alpha, A, p.la, B, p.lb, &beta, D, p.ld, D, p.ld, algo, ws, wsb, 0);
    cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1);
    return ms / reps;
}
void check_vs_ref(Prob& p, float* maxdiff, float* maxref) {
    float zero[2] = {0, 0}; CK(cudaMemcpy(dev2, zero, 8, cudaMemcpyHostToDevice));
    diff<<<1024, 256>>>(D, REF, (size_t)p.m * p.n, dev2); float h[2]; CK(cudaMemcpy(h, dev2, 8, cudaMemcpyDeviceToHost));
    *maxdiff = h[0]; *maxref = h[1];
}
void forced(const char* name, cublasLtEpilogue_t epi, int m, int n, int k) {
    Prob ref = make(epi, m, n, k, 0);
    cublasLtMatmulHeuristicResult_t r0[16]; int f0 = heur(ref, r0, 16);
    if (f0 <= 0) { printf("%s %s: no heuristic (%d)\n", name, ename(epi), f0); return; }
    float t0 = run_ms(ref, &r0[0].algo, 20);
    CK(cudaMemcpy(REF, D, (size_t)m * n * 2, cudaMemcpyDeviceToDevice));
    printf("%s %s m %d n %d k %d: heuristic #0 id %d %.3f ms %.0f TFLOP/s (reference output)\n", name, ename(epi), m, n, k,
           algo_id(&r0[0].algo), t0, 2.0 * m * n * k / t0 / 1e9);
    Prob plain = make(CUBLASLT_EPILOGUE_DEFAULT, m, n, k, 0);
    cublasLtMatmulHeuristicResult_t r1[32]; int f1 = heur(plain, r1, 32);
    for (int i = 0; i < f1; i++) {
        cublasLtMatmulHeuristicResult_t chk; cublasStatus_t s = cublasLtMatmulAlgoCheck(lt, ref.desc, ref.la, ref.lb, ref.ld, ref.ld, &r1[i].algo, &chk);
        float tp = run_ms(plain, &r1[i].algo, 10);
        if (s) { printf("  DEFAULT algo #%2d id %d (%.0f TFLOP/s plain): check under %s -> status %d\n", i, algo_id(&r1[i].algo), 2.0 * m * n * k / tp / 1e9, ename(epi), (int)s); continue; }
        CK(cudaMemset(D, 0xff, (size_t)m * n * 2));
        float t = run_ms(ref, &r1[i].algo, 20); float md, mr; check_vs_ref(ref, &md, &mr);
        printf("  DEFAULT algo #%2d id %d (%.0f TFLOP/s plain): ACCEPTED under %s: %.3f ms %.0f TFLOP/s, max|diff| %.3g of max %.3g\n",
               i, algo_id(&r1[i].algo), 2.0 * m * n * k / tp / 1e9, ename(epi), t, 2.0 * m * n * k / t / 1e9, md, mr);
    }
}
void variants(const char* name, cublasLtEpilogue_t epi, int m, int n, int k) {
    for (int v = 0; v < 3; v++) {
        Prob p = make(epi, m, n, k, v);
        cublasLtMatmulHeuristicResult_t r[32]; int f = heur(p, r, 32);
        printf("%s %s variant %d: found %d ids:", name, ename(epi), v, f);
        for (int i = 0; i < f; i++) printf(" %d", algo_id(&r[i].algo));
        printf("\n");
    }
}
int main() {
    BK(cublasLtCreate(&lt)); printf("cuBLASLt version %zu (cudart %d)\n", cublasLtGetVersion(), CUDART_VERSION);
    int ids[512]; int n = 0;
    BK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 512, ids, &n));
    printf("algo ids (bf16, fp32 compute): %d\n", n);
    for (int i = 0; i < n; i++) {
        cublasLtMatmulAlgo_t algo; cublasStatus_t s = cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, ids[i], &algo);
        uint32_t mask = 0; size_t got = 0;
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_EPILOGUE_MASK, &mask, sizeof(mask), &got);
        printf("  id %3d init %d epilogue mask 0x%05x DGELU %d GELU_AUX %d DGELU_BGRAD %d\n", ids[i], (int)s, mask,
               (mask & CUBLASLT_EPILOGUE_DGELU) == CUBLASLT_EPILOGUE_DGELU, (mask & CUBLASLT_EPILOGUE_GELU_AUX) == CUBLASLT_EPILOGUE_GELU_AUX,
               (mask & CUBLASLT_EPILOGUE_DGELU_BGRAD) == CUBLASLT_EPILOGUE_DGELU_BGRAD);
    }
    CK(cudaMalloc(&ws, wsb)); CK(cudaMalloc(&dev2, 8));
    size_t big = (size_t)16384 * 10240;
    CK(cudaMalloc(&A, big * 2)); CK(cudaMalloc(&B, big * 2)); CK(cudaMalloc(&D, big * 2)); CK(cudaMalloc(&REF, big * 2));
    CK(cudaMalloc(&AUX, big * 2)); CK(cudaMalloc(&BIAS, 65536 * 2));
    fill<<<1024, 256>>>(A, big, 1); fill<<<1024, 256>>>(B, big, 2); fill<<<1024, 256>>>(AUX, big, 4); fill<<<64, 256>>>(BIAS, 65536, 5);
    CK(cudaDeviceSynchronize());
    const int N = 16384, C = 2048;
    variants("fcproj dinp", CUBLASLT_EPILOGUE_DGELU, 4 * C, N, C);
    variants("fcproj dinp", CUBLASLT_EPILOGUE_DGELU_BGRAD, 4 * C, N, C);
    forced("fcproj dinp", CUBLASLT_EPILOGUE_DGELU, 4 * C, N, C);
    forced("fcproj dinpT", CUBLASLT_EPILOGUE_DGELU, N, 4 * C, C);
    forced("fc fwdT", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, N, 4 * C, C);
    forced("2.7b dinp", CUBLASLT_EPILOGUE_DGELU, 4 * 2560, N, 2560);
    return 0;
}
