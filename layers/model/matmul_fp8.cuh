// matmul_fp8.cuh: the three GEMMs of a linear layer y = x · Wᵀ (+ b) on FP8 tensor cores, through
// cuBLASLt (sm_89 or newer; an H100 is sm_90): FP8 operands with per-tensor scales, fp32
// accumulation, bf16 output. The operands come from fp8_cast.cuh, their scales from fp8_scaling.cuh.
//
//   out = scale_inv_a · scale_inv_b · (A · B) (+ bias) (+ out when accumulating), rounded to bf16
// where A and B hold the stored FP8 bytes and each Fp8Operand's scale_inv is a device fp32 scalar
// (cuBLASLt's A/B_SCALE_POINTER): the tensor is decode(byte) · scale_inv.
//
// Tensors, row-major as in matmul.cuh (weights in nn.Linear's (out, in) layout):
//   forward  out (N, OC)      = inp (N, IC) · weight (OC, IC)ᵀ + bias (OC)   inp, weight: as cast
//   dinp     dinp (N, IC)     = dout (N, OC) · weight (OC, IC)              needs weight_t (IC, OC)
//   dweight  dweight (OC, IC) (+)= dout (N, OC)ᵀ · inp (N, IC)             needs dout_t (OC, N), inp_t (IC, N)
// Why the transposed copies: on Hopper cuBLASLt's FP8 GEMMs exist only for op(A) = T, op(B) = N,
// i.e. both operands stored with the reduction dimension contiguous. In column-major terms:
//   forward  outᶜ (OC, N)      = weightᶜᵀ · inpᶜ      A = weight (OC, IC): k = IC contiguous; B = inp (N, IC)
//   dinp     dinpᶜ (IC, N)     = weight_tᶜᵀ · doutᶜ   A = weight_t (IC, OC): k = OC contiguous; B = dout (N, OC)
//   dweight  dweightᶜ (IC, OC) = inp_tᶜᵀ · dout_tᶜ    A = inp_t (IC, N): k = N contiguous; B = dout_t (OC, N)
// so a training step casts x, W and dy each to both layouts (fp8_cast_transpose, one pass each).
// Sizes: N, IC, OC multiples of 16 (cuBLASLt's FP8 kernels need every dimension and leading
// dimension to be a multiple of 16 bytes); pointers 16-byte aligned.
//
// Formats: E4M3 for weights and activations; dout may be E5M2 (gradients need range more than
// precision), in which case the other operand must be E4M3 (cuBLASLt has no E5M2 × E5M2).
// Accumulation: fp32. CUBLASLT_MATMUL_DESC_FAST_ACCUM skips the periodic promotion of the tensor
// cores' partial sums (kept to about 14 bits) into fp32: faster, and its error grows with K. The
// forward takes it as an argument (1 is Transformer Engine's choice: K = IC is short and the
// result is rounded to bf16 anyway); the backward GEMMs never use it, since their errors feed the
// weights, and the weight gradient reduces over all N tokens.
// The output's amax (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER) is not taken: D is bf16, and the kernel
// that later casts a tensor to FP8 records its amax in the same pass.
// Algorithms: as for the bf16 GEMMs (matmul_lt.cuh): chosen once per shape and cached in the
// MatmulContext (timed when ctx->tune), on its workspace and stream.
#ifndef MATMUL_FP8_CUH
#define MATMUL_FP8_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "layers/cuda_common.h"
#include "layers/model/fp8_cast.cuh"
#include "layers/model/matmul.cuh"
#include "layers/model/matmul_lt.cuh"

// An FP8 tensor as a GEMM reads it: its bytes (layout per function), format and inverse scale.
typedef struct {
    const uint8_t* data;
    Fp8Format format;
    const float* scale_inv;  // device fp32: the tensor is decode(byte) · *scale_inv
} Fp8Operand;

static inline Fp8Operand fp8_operand(const uint8_t* data, Fp8Format format, const float* scale_inv) {
    Fp8Operand op;
    op.data = data;
    op.format = format;
    op.scale_inv = scale_inv;
    return op;
}

static inline cudaDataType_t fp8_cuda_type(Fp8Format f) { return f == FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

// 0 when N, IC, OC are usable by the FP8 GEMMs; otherwise -1 and a message in why.
static inline int matmul_fp8_check_sizes(int N, int IC, int OC, char* why, size_t why_size) {
    const int bad_n = N < 16 || N % 16 != 0, bad_ic = IC < 16 || IC % 16 != 0, bad_oc = OC < 16 || OC % 16 != 0;
    if (!bad_n && !bad_ic && !bad_oc) return 0;
    snprintf(why, why_size,
             "%s = %d (N = %d, IC = %d, OC = %d) is not a positive multiple of 16; cuBLASLt's FP8 GEMMs need every "
             "dimension to be a multiple of 16 (16 bytes of FP8): choose hidden sizes and batch size × sequence "
             "length that are multiples of 16, or use bf16",
             bad_n ? "N" : bad_ic ? "IC" : "OC", bad_n ? N : bad_ic ? IC : OC, N, IC, OC);
    return -1;
}

static inline void matmul_fp8_require(const char* fn, int N, int IC, int OC, const void* out, Fp8Operand a,
                                      Fp8Operand b) {
    char why[384];
    if (matmul_fp8_check_sizes(N, IC, OC, why, sizeof(why)) != 0) matmul_die(fn, why);
    matmul_require_pointer(fn, "out", out);
    matmul_require_pointer(fn, "the first FP8 operand", a.data);
    matmul_require_pointer(fn, "the second FP8 operand", b.data);
    if (!a.scale_inv || !b.scale_inv) matmul_die(fn, "every FP8 operand needs its scale_inv (a device fp32 scalar)");
    if (((uintptr_t)a.scale_inv | (uintptr_t)b.scale_inv) % 16 != 0)
        matmul_die(fn, "an FP8 operand's scale_inv is not 16-byte aligned, which cuBLASLt refuses; keep it in its own "
                       "allocation or in an Fp8ScaleState (fp8_scaling.cuh)");
    if (a.format == FP8_E5M2 && b.format == FP8_E5M2)
        matmul_die(fn, "both operands are E5M2; cuBLASLt multiplies E5M2 only by E4M3: cast weights and activations "
                       "to E4M3");
}

// Column-major D (m, n, ld m) = a_scale · b_scale · Aᵀ · B (+ bias (m)) (+ D when accumulate)
// (+ residual (m, n, ld m) when given): A stored (k, m) ld k, B stored (k, n) ld k, both FP8; D,
// residual bf16. The GEMMs below are this.
static inline void matmul_fp8_gemm(MatmulContext* ctx, const char* what, int64_t m, int64_t n, int64_t k,
                                   Fp8Operand a, Fp8Operand b, __nv_bfloat16* D, const __nv_bfloat16* residual,
                                   const __nv_bfloat16* bias, int accumulate, int fast_accum) {
    MatmulLtGemm g = matmul_lt_plain(what, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, a.data, k, b.data, k, D, m,
                                     accumulate || residual ? 1.0f : 0.0f);
    if (residual && residual != D) g.C = residual;
    g.a_type = fp8_cuda_type(a.format);
    g.b_type = fp8_cuda_type(b.format);
    g.a_scale = a.scale_inv;
    g.b_scale = b.scale_inv;
    g.fast_accum = fast_accum;
    if (bias) {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;  // bias of D's type (bf16), one per row of Dᶜ (m = OC)
        g.bias = bias;
    }
    matmul_lt_gemm(ctx, &g, 0);
}

// out (N, OC) = inp (N, IC) · weight (OC, IC)ᵀ + bias (OC) (NULL: none); inp and weight E4M3 as
// cast (row-major, no transposed copy); fast_accum as in the header. Runs on ctx->stream.
static inline void matmul_fp8_forward(MatmulContext* ctx, __nv_bfloat16* out, Fp8Operand inp, Fp8Operand weight,
                                      const __nv_bfloat16* bias, int N, int IC, int OC, int fast_accum) {
    const char* fn = "matmul_fp8_forward";
    matmul_fp8_require(fn, N, IC, OC, out, weight, inp);
    if (bias) matmul_require_pointer(fn, "bias", bias);
    // outᶜ (OC, N) = weightᶜᵀ (OC, IC) · inpᶜ (IC, N): m = OC, n = N, k = IC
    matmul_fp8_gemm(ctx, "matmul_fp8_forward (out = inp·weightᵀ)", OC, N, IC, weight, inp, out, NULL, bias, 0,
                    fast_accum);
}

// out (N, OC) = residual (N, OC) + inp · weightᵀ + bias: matmul_fp8_forward with the residual add in
// the epilogue (cuBLASLt's C), as matmul_forward_residual does in bf16. out must not overlap
// residual unless it is residual itself.
static inline void matmul_fp8_forward_residual(MatmulContext* ctx, __nv_bfloat16* out, const __nv_bfloat16* residual,
                                               Fp8Operand inp, Fp8Operand weight, const __nv_bfloat16* bias, int N,
                                               int IC, int OC, int fast_accum) {
    const char* fn = "matmul_fp8_forward_residual";
    matmul_fp8_require(fn, N, IC, OC, out, weight, inp);
    matmul_require_pointer(fn, "residual", residual);
    if (bias) matmul_require_pointer(fn, "bias", bias);
    const size_t bytes = (size_t)N * OC * sizeof(__nv_bfloat16);
    const char *o = (const char*)out, *r = (const char*)residual;
    if (o != r && o < r + bytes && r < o + bytes) matmul_die(fn, "out overlaps residual without being it");
    matmul_fp8_gemm(ctx, "matmul_fp8_forward_residual (out = residual + inp·weightᵀ)", OC, N, IC, weight, inp, out,
                    residual, bias, 0, fast_accum);
}

// dinp (N, IC) = dout (N, OC) · weight (OC, IC), from dout (N, OC) (E4M3 or E5M2) and weight_t
// (IC, OC) (E4M3, the transposed copy of the weight). Overwrites dinp. Runs on ctx->stream.
static inline void matmul_fp8_backward_dinp(MatmulContext* ctx, __nv_bfloat16* dinp, Fp8Operand dout,
                                            Fp8Operand weight_t, int N, int IC, int OC) {
    matmul_fp8_require("matmul_fp8_backward_dinp", N, IC, OC, dinp, weight_t, dout);
    // dinpᶜ (IC, N) = weight_tᶜᵀ (IC, OC) · doutᶜ (OC, N): m = IC, n = N, k = OC
    matmul_fp8_gemm(ctx, "matmul_fp8_backward (dinp = dout·weight)", IC, N, OC, weight_t, dout, dinp, NULL, NULL, 0,
                    0);
}

// dweight (OC, IC) = doutᵀ · inp (+= when accumulate), from dout_t (OC, N) (E4M3 or E5M2) and inp_t
// (IC, N) (E4M3), the transposed copies of dout (N, OC) and inp (N, IC). Runs on ctx->stream.
static inline void matmul_fp8_backward_dweight(MatmulContext* ctx, __nv_bfloat16* dweight, Fp8Operand dout_t,
                                               Fp8Operand inp_t, int N, int IC, int OC, int accumulate) {
    matmul_fp8_require("matmul_fp8_backward_dweight", N, IC, OC, dweight, inp_t, dout_t);
    // dweightᶜ (IC, OC) = inp_tᶜᵀ (IC, N) · dout_tᶜ (N, OC): m = IC, n = OC, k = N
    matmul_fp8_gemm(ctx, "matmul_fp8_backward (dweight = doutᵀ·inp)", IC, OC, N, inp_t, dout_t, dweight, NULL, NULL,
                    accumulate, 0);
}

#endif  // MATMUL_FP8_CUH
