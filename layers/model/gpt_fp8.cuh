// gpt_fp8.cuh: --precision fp8, the four linear layers of every block (qkv, attention projection,
// fc, fc projection) on FP8 tensor cores: their FP8 weights, the scales of every FP8 tensor, and the
// forward and backward of one linear layer. The model (gpt_model.cuh) calls these in place of the
// bf16 GEMMs; the LM head, embeddings, LayerNorms, attention and the optimizer stay bf16 / fp32.
//
// A linear layer y (N, OC) = x (N, IC) · Wᵀ + b in fp8:
//   forward   x → x8 (N, IC) E4M3 and x8ᵀ (IC, N), one cast-transpose pass (x8ᵀ kept for the
//             backward, x8 a scratch); y = x8 · W8ᵀ (+ b) (+ residual), fp32 accumulation, bf16 out
//   backward  dy → dy8 (N, OC) E5M2 and dy8ᵀ (OC, N), one pass; dx = dy8 · W8 (from W8ᵀ);
//             dW += dy8ᵀ · x8ᵀ (the bf16 gradient, accumulated)
// Hopper's FP8 GEMMs take only operands whose reduction dimension is contiguous (matmul_fp8.cuh),
// hence the transposed copies. The casts fold in the work next to them, so no bf16 tensor is written
// only to be cast: qkv's and fc's input casts compute the LayerNorm output from its input and row
// statistics (FP8_OP_LAYERNORM), the fc projection's applies GELU to fch (FP8_OP_GELU), and the fc
// layer's dy cast applies GELU' and sums the columns for the fc bias gradient (FP8_OP_DGELU).
// E4M3 holds weights and activations (precision); E5M2 holds gradients (range: their amax moves
// over more binades during training), as in Transformer Engine's "hybrid" format.
//
// Scales (fp8_scaling.cuh), one state per (layer, linear, role x / W / dy):
//   weights     current scaling, once per optimizer step: an amax pass over W, then the cast of W
//               and Wᵀ (gpt_fp8_cast_weights). The weights change only in the optimizer.
//   x and dy    FP8_RECIPE_DELAYED (default): each cast uses the scale made from the amax history of
//               earlier steps and records its own amax in the same pass; gpt_fp8_begin_step folds
//               them into the history once per step. The first step has no history: it uses
//               current scaling (an amax pass before each cast), so it never casts blind.
//               FP8_RECIPE_CURRENT: an amax pass before every cast (one more read of each tensor).
// Values beyond a scale's range saturate to ±max (never inf) and are counted per state
// (gpt_fp8_saturated); a NaN makes its amax NaN, which the update counts as non-finite.
#ifndef GPT_FP8_CUH
#define GPT_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_common.h"
#include "layers/model/fp8_cast.cuh"
#include "layers/model/fp8_scaling.cuh"
#include "layers/model/matmul.cuh"
#include "layers/model/matmul_fp8.cuh"

typedef enum { FP8_RECIPE_DELAYED = 0, FP8_RECIPE_CURRENT = 1 } Fp8Recipe;
#define NUM_FP8_RECIPES 2
static const char* const FP8_RECIPE_NAMES[NUM_FP8_RECIPES] = {"delayed", "current"};

// 0 and *recipe set for "delayed" or "current"; -1 otherwise.
static inline int fp8_recipe_from_name(const char* name, Fp8Recipe* recipe) {
    const int i = layer_name_index(name, FP8_RECIPE_NAMES, NUM_FP8_RECIPES);
    if (i >= 0) *recipe = (Fp8Recipe)i;
    return i >= 0 ? 0 : -1;
}

// The linear layers of a block and the FP8 tensors of each.
typedef enum { GPT_LIN_QKV = 0, GPT_LIN_ATTPROJ = 1, GPT_LIN_FC = 2, GPT_LIN_FCPROJ = 3, GPT_LINEARS = 4 } GPTLinear;
typedef enum { FP8_ROLE_X = 0, FP8_ROLE_W = 1, FP8_ROLE_DY = 2, FP8_ROLES = 3 } Fp8Role;

#define GPT_FP8_MARGIN 0  // scales map the amax to the format's max (no headroom), as Transformer Engine
#define GPT_FP8_POW2 0    // scales are not rounded to powers of two
#define GPT_FP8_FAST_ACCUM_FORWARD 1  // the forward GEMMs skip the periodic fp32 promotion (matmul_fp8.cuh)

typedef struct {
    Fp8Recipe recipe;
    int L;
    int in_features[GPT_LINEARS], out_features[GPT_LINEARS];  // IC, OC of each linear layer
    Fp8ScaleState* states;   // (L, GPT_LINEARS, FP8_ROLES), device
    uint8_t* weights;        // per layer, per linear: W8 (OC, IC) then W8ᵀ (IC, OC), E4M3
    size_t weight_offsets[GPT_LINEARS];  // bytes into a layer's weights
    size_t layer_weight_bytes;
    // scratch of the activation allocation (the model sets these): x8 (N, 4C), dy8 (N, 4C), dy8ᵀ (4C, N),
    // the dbias column sums (fp8_colsum_tiles(N), 4C) fp32
    uint8_t *x8, *dy8, *dy8_t;
    float* colsum;
    int weights_stale;        // the bf16 weights may have changed since the last cast
    unsigned char* seen;      // host, per state: an update has folded its amax into its history
    unsigned char* pending;   // host, per state: cast since the last update
    int amax_pending;         // some state was cast since the last update
    cudaStream_t stream;
} GPTFp8;

// Bytes of the FP8 weights and their transposed copies: 2 bytes per parameter of the four linear
// layers (qkv QKV·C, attproj C², fc and fcproj 4C² each, per layer).
static inline size_t gpt_fp8_weight_bytes(int L, int C, int QKV) {
    return 2 * (size_t)L * (size_t)C * ((size_t)QKV + 9 * (size_t)C);
}

static inline size_t gpt_fp8_state_bytes(int L) {
    return (size_t)L * GPT_LINEARS * FP8_ROLES * sizeof(Fp8ScaleState);
}

static inline Fp8Format gpt_fp8_role_format(Fp8Role role) { return role == FP8_ROLE_DY ? FP8_E5M2 : FP8_E4M3; }

// 0 when a model of hidden size C, QKV features and N = B·T rows can run its linear layers in fp8;
// otherwise -1 and why (every GEMM dimension must be a multiple of 16).
static inline int gpt_fp8_check(int N, int C, int QKV, char* why, size_t why_size) {
    if (N % 16 != 0) {
        snprintf(why, why_size,
                 "batch size x sequence length = %d tokens per micro batch is not a multiple of 16, which cuBLASLt's "
                 "FP8 GEMMs need; choose --batch-size and --seq-len so that it is, or use --precision bf16", N);
        return -1;
    }
    if (C % 16 != 0 || QKV % 16 != 0) {
        snprintf(why, why_size,
                 "hidden size %d (qkv features %d) is not a multiple of 16, which cuBLASLt's FP8 GEMMs need; choose "
                 "--hidden (and --heads, --kv-heads) so that both are, or use --precision bf16", C, QKV);
        return -1;
    }
    return 0;
}

static inline Fp8ScaleState* gpt_fp8_state(const GPTFp8* f, int l, GPTLinear lin, Fp8Role role) {
    return f->states + ((size_t)l * GPT_LINEARS + lin) * FP8_ROLES + role;
}

// Layer l's FP8 weight of linear lin as a GEMM operand: W8 (OC, IC), or W8ᵀ (IC, OC) when transposed.
static inline Fp8Operand gpt_fp8_weight(const GPTFp8* f, int l, GPTLinear lin, int transposed) {
    const uint8_t* w = f->weights + (size_t)l * f->layer_weight_bytes + f->weight_offsets[lin];
    if (transposed) w += (size_t)f->in_features[lin] * f->out_features[lin];
    return fp8_operand(w, FP8_E4M3, &gpt_fp8_state(f, l, lin, FP8_ROLE_W)->scale_inv);
}

// Allocates the weights and states of L layers of hidden size C with QKV qkv features (the
// out-of-memory error says what to change); states start at scale 1, no history.
static void gpt_fp8_create(GPTFp8* f, int L, int C, int QKV, Fp8Recipe recipe, cudaStream_t stream) {
    memset(f, 0, sizeof(*f));
    f->recipe = recipe, f->L = L, f->stream = stream;
    const int in[GPT_LINEARS] = {C, C, C, 4 * C}, out[GPT_LINEARS] = {QKV, C, 4 * C, C};
    size_t offset = 0;
    for (int i = 0; i < GPT_LINEARS; i++) {
        f->in_features[i] = in[i], f->out_features[i] = out[i];
        f->weight_offsets[i] = offset;
        offset += 2 * (size_t)in[i] * out[i];  // both are multiples of 16: every copy stays 256-byte aligned
    }
    f->layer_weight_bytes = offset;
    const char* hint = "use --precision bf16 or a smaller model (--model, --layers, --hidden)";
    cuda_malloc_or_explain((void**)&f->weights, gpt_fp8_weight_bytes(L, C, QKV), "the FP8 weights", hint);
    cuda_malloc_or_explain((void**)&f->states, gpt_fp8_state_bytes(L), "the FP8 scales", hint);
    const int count = L * GPT_LINEARS * FP8_ROLES;
    Fp8Format* formats = (Fp8Format*)malloc((size_t)count * sizeof(Fp8Format));
    LAYER_REQUIRE(formats != NULL, "gpt_fp8_create: out of host memory");
    for (int i = 0; i < count; i++) formats[i] = gpt_fp8_role_format((Fp8Role)(i % FP8_ROLES));
    fp8_scale_states_init(f->states, formats, count, stream);
    free(formats);
    f->seen = (unsigned char*)calloc((size_t)count, 1);
    f->pending = (unsigned char*)calloc((size_t)count, 1);
    LAYER_REQUIRE(f->seen && f->pending, "gpt_fp8_create: out of host memory");
    f->weights_stale = 1;
}

static void gpt_fp8_destroy(GPTFp8* f) {
    if (f->weights) CUDA_CHECK(cudaFree(f->weights));
    if (f->states) CUDA_CHECK(cudaFree(f->states));
    free(f->seen);
    free(f->pending);
    memset(f, 0, sizeof(*f));
}

// Casts the bf16 weights of the four linear layers (w[lin]: (L, OC, IC) stacked) to W8 and W8ᵀ,
// each with its own current scale. Once per optimizer step (the forward calls it when stale).
static void gpt_fp8_cast_weights(GPTFp8* f, const __nv_bfloat16* const w[GPT_LINEARS]) {
    for (int l = 0; l < f->L; l++) {
        for (int lin = 0; lin < GPT_LINEARS; lin++) {
            const int OC = f->out_features[lin], IC = f->in_features[lin];
            const __nv_bfloat16* src = w[lin] + (size_t)l * OC * IC;
            Fp8ScaleState* st = gpt_fp8_state(f, l, (GPTLinear)lin, FP8_ROLE_W);
            fp8_current_scale(st, src, OC, IC, GPT_FP8_MARGIN, GPT_FP8_POW2, f->stream);
            uint8_t* w8 = (uint8_t*)gpt_fp8_weight(f, l, (GPTLinear)lin, 0).data;
            uint8_t* w8_t = (uint8_t*)gpt_fp8_weight(f, l, (GPTLinear)lin, 1).data;
            Fp8CastArgs a;
            memset(&a, 0, sizeof(a));
            a.out = w8, a.out_t = w8_t, a.inp = src, a.N = OC, a.C = IC, a.format = FP8_E4M3, a.op = FP8_OP_COPY;
            a.scale = &st->scale, a.saturated = &st->saturated;
            fp8_cast_transpose_op(&a, f->stream);
        }
    }
    f->weights_stale = 0;
}

// Casts a (whose outputs, input, op and column sums the caller set) with the scale of state (l,
// lin, role): delayed scaling records its amax in the same pass; current scaling (or a state
// without history) runs an amax pass first.
static void gpt_fp8_cast(GPTFp8* f, Fp8CastArgs* a, int l, GPTLinear lin, Fp8Role role) {
    const size_t i = ((size_t)l * GPT_LINEARS + lin) * FP8_ROLES + role;
    Fp8ScaleState* st = f->states + i;
    a->format = gpt_fp8_role_format(role);
    a->saturated = &st->saturated;
    a->scale = &st->scale;
    if (f->recipe == FP8_RECIPE_CURRENT || !f->seen[i]) {
        Fp8CastArgs pass = *a;  // amax only: no outputs, no column sums, no count
        pass.out = pass.out_t = NULL, pass.colsum_partial = NULL, pass.saturated = NULL, pass.scale = NULL;
        pass.amax = &st->amax_current;
        CUDA_CHECK(cudaMemsetAsync(&st->amax_current, 0, sizeof(float), f->stream));
        fp8_cast_transpose_op(&pass, f->stream);
        fp8_current_scale_finish(st, GPT_FP8_MARGIN, GPT_FP8_POW2, f->stream);
        a->amax = NULL;  // the finish folded amax_current into amax
    } else {
        a->amax = &st->amax;
    }
    fp8_cast_transpose_op(a, f->stream);
    f->pending[i] = 1;
    f->amax_pending = 1;
}

// The start of an optimizer step (before its first forward): the last step's amaxes join the
// histories and set this step's delayed scales; the weights are cast again before the next forward.
static void gpt_fp8_begin_step(GPTFp8* f) {
    if (f->amax_pending) {
        const int count = f->L * GPT_LINEARS * FP8_ROLES;
        fp8_delayed_update(f->states, count, GPT_FP8_MARGIN, GPT_FP8_POW2, f->stream);
        for (int i = 0; i < count; i++) f->seen[i] |= f->pending[i], f->pending[i] = 0;
        f->amax_pending = 0;
    }
    f->weights_stale = 1;
}

// A linear layer's input as its cast reads it: x (N, IC) bf16 (FP8_OP_COPY), GELU(x) with x = fch
// (FP8_OP_GELU), or a LayerNorm's output from its input x and statistics (gpt_fp8_ln_input).
static inline Fp8CastArgs gpt_fp8_input(const __nv_bfloat16* x, Fp8CastOp op) {
    Fp8CastArgs a;
    memset(&a, 0, sizeof(a));
    a.inp = x, a.op = op;
    return a;
}

static inline Fp8CastArgs gpt_fp8_ln_input(const __nv_bfloat16* x, const float* mean, const float* rstd,
                                           const __nv_bfloat16* weight, const __nv_bfloat16* bias) {
    Fp8CastArgs a = gpt_fp8_input(x, FP8_OP_LAYERNORM);
    a.mean = mean, a.rstd = rstd, a.ln_weight = weight, a.ln_bias = bias;
    return a;
}

// The input cast of layer l's linear lin: the input `in` (N rows) to x8 (N, IC) (NULL: not written)
// and x8ᵀ (IC, N) in x_t, kept for the backward.
static void gpt_fp8_cast_input(GPTFp8* f, int l, GPTLinear lin, Fp8CastArgs in, uint8_t* x8, uint8_t* x_t, int N) {
    in.out = x8, in.out_t = x_t, in.N = N, in.C = f->in_features[lin];
    gpt_fp8_cast(f, &in, l, lin, FP8_ROLE_X);
}

// y (N, OC) = x8 · W8ᵀ + bias (+ residual, when not NULL) for layer l's linear lin, its input cast
// as gpt_fp8_cast_input says (x8 into the scratch f->x8).
static void gpt_fp8_linear_forward(GPTFp8* f, MatmulContext* mm, int l, GPTLinear lin, __nv_bfloat16* y,
                                   const __nv_bfloat16* residual, const __nv_bfloat16* bias, Fp8CastArgs in,
                                   uint8_t* x_t, int N) {
    const int IC = f->in_features[lin], OC = f->out_features[lin];
    gpt_fp8_cast_input(f, l, lin, in, f->x8, x_t, N);
    const Fp8Operand x8 = fp8_operand(f->x8, FP8_E4M3, &gpt_fp8_state(f, l, lin, FP8_ROLE_X)->scale_inv);
    const Fp8Operand w8 = gpt_fp8_weight(f, l, lin, 0);
    if (residual)
        matmul_fp8_forward_residual(mm, y, residual, x8, w8, bias, N, IC, OC, GPT_FP8_FAST_ACCUM_FORWARD);
    else
        matmul_fp8_forward(mm, y, x8, w8, bias, N, IC, OC, GPT_FP8_FAST_ACCUM_FORWARD);
}

// The backward of layer l's linear lin: dy (N, OC) bf16 cast here to dy8 and dy8ᵀ (op FP8_OP_COPY,
// or FP8_OP_DGELU with aux = fch: dy is then d(GELU output) and the cast takes GELU'), then
//   dx (N, IC) = dy8 · W8 (overwritten), dweight (OC, IC) += dy8ᵀ · x8ᵀ (x_t from the forward),
//   dbias (OC) += column sums of the cast values (NULL: none; from the cast's pass).
static void gpt_fp8_linear_backward(GPTFp8* f, MatmulContext* mm, int l, GPTLinear lin, __nv_bfloat16* dx,
                                    __nv_bfloat16* dweight, __nv_bfloat16* dbias, const __nv_bfloat16* dy,
                                    Fp8CastOp op, const __nv_bfloat16* aux, const uint8_t* x_t, int N) {
    const int IC = f->in_features[lin], OC = f->out_features[lin];
    Fp8CastArgs a;
    memset(&a, 0, sizeof(a));
    a.out = f->dy8, a.out_t = f->dy8_t, a.inp = dy, a.aux = aux, a.N = N, a.C = OC, a.op = op;
    a.colsum_partial = dbias ? f->colsum : NULL;
    gpt_fp8_cast(f, &a, l, lin, FP8_ROLE_DY);
    if (dbias) {
        matmul_dbias_finish_kernel<<<(OC + 255) / 256, 256, 0, f->stream>>>(dbias, f->colsum, fp8_colsum_tiles(N), OC, 1);
        CUDA_CHECK(cudaGetLastError());
    }
    const float* dy_scale_inv = &gpt_fp8_state(f, l, lin, FP8_ROLE_DY)->scale_inv;
    const float* x_scale_inv = &gpt_fp8_state(f, l, lin, FP8_ROLE_X)->scale_inv;
    matmul_fp8_backward_dinp(mm, dx, fp8_operand(f->dy8, FP8_E5M2, dy_scale_inv), gpt_fp8_weight(f, l, lin, 1), N, IC,
                             OC);
    matmul_fp8_backward_dweight(mm, dweight, fp8_operand(f->dy8_t, FP8_E5M2, dy_scale_inv),
                                fp8_operand(x_t, FP8_E4M3, x_scale_inv), N, IC, OC, 1);
}

// A host copy of every state (malloc'ed; the caller frees it), after the stream's work so far.
static Fp8ScaleState* gpt_fp8_download_states(const GPTFp8* f) {
    const size_t bytes = gpt_fp8_state_bytes(f->L);
    Fp8ScaleState* host = (Fp8ScaleState*)malloc(bytes);
    LAYER_REQUIRE(host != NULL, "gpt_fp8: out of host memory for the %zu bytes of FP8 scales", bytes);
    CUDA_CHECK(cudaMemcpyAsync(host, f->states, bytes, cudaMemcpyDeviceToHost, f->stream));
    CUDA_CHECK(cudaStreamSynchronize(f->stream));
    return host;
}

// After states were loaded into f->states (a checkpoint of an fp8 run, saved after its optimizer
// step): which states have a history (delayed scales) and which hold amaxes the next step folds in,
// as they stood in the run that saved them, so that it continues as if never stopped.
static void gpt_fp8_states_loaded(GPTFp8* f) {
    const int count = f->L * GPT_LINEARS * FP8_ROLES;
    Fp8ScaleState* host = gpt_fp8_download_states(f);
    f->amax_pending = 0;
    for (int i = 0; i < count; i++) {
        float m = 0.0f;
        for (int h = 0; h < FP8_AMAX_HISTORY; h++) m = fmaxf(m, host[i].history[h]);
        f->seen[i] = m > 0.0f;
        f->pending[i] = host[i].amax != 0.0f;  // NaN too: the update counts it
        f->amax_pending |= f->pending[i];
    }
    free(host);
    f->weights_stale = 1;
}

// Reads the states (waits for the stream); 1 and "layer l's <linear> <tensor>" in what when the amax
// of some tensor cast since the last update is NaN or inf (the first in layer order), else 0.
static int gpt_fp8_first_nonfinite(const GPTFp8* f, char* what, size_t size) {
    static const char* const LINEAR_NAMES[GPT_LINEARS] = {"qkv", "attention projection", "fc", "fc projection"};
    static const char* const ROLE_NAMES[FP8_ROLES] = {"input", "weight", "output gradient"};
    const int count = f->L * GPT_LINEARS * FP8_ROLES;
    Fp8ScaleState* host = gpt_fp8_download_states(f);
    int found = 0;
    for (int i = 0; i < count && !found; i++) {
        if (isfinite(host[i].amax)) continue;
        snprintf(what, size, "layer %d's %s %s (amax %g)", i / (GPT_LINEARS * FP8_ROLES),
                 LINEAR_NAMES[i / FP8_ROLES % GPT_LINEARS], ROLE_NAMES[i % FP8_ROLES], host[i].amax);
        found = 1;
    }
    free(host);
    return found;
}

// Values clipped to ±max by every cast since the model was made (waits for the stream).
static unsigned long long gpt_fp8_saturated(const GPTFp8* f) {
    const int count = f->L * GPT_LINEARS * FP8_ROLES;
    Fp8ScaleState* host = gpt_fp8_download_states(f);
    unsigned long long total = 0;
    for (int i = 0; i < count; i++) total += host[i].saturated;
    free(host);
    return total;
}

#endif  // GPT_FP8_CUH
