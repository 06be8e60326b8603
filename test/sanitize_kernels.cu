// sanitize_kernels.cu: every kernel family of the trainer, each called through its own host API on
// small odd shapes, for scripts/sanitize.sh to run under compute-sanitizer (memcheck, racecheck,
// synccheck, initcheck). It checks no results (the GPU tests do that); it makes the kernels run once
// in every configuration worth checking, and says which ran.
//
//   build/sanitize_kernels FAMILY [--seq-lens 17,301] [--forward-only]
//   build/sanitize_kernels --families          (the families, one per line)
//   build/sanitize_kernels --check             (exit 0 when there is a GPU to run them on, else 1)
//
// Families: layers (encoder, LayerNorm, GELU, cross-entropy, AdamW, global norm, weight init),
// matmul (matmul.cuh's GEMM paths under each fusion, their kernels, the qkv bias gradient), model
// (gpt_model.cuh's training step, forward and backward, every --recompute mode and the chunked LM head,
// and the optimizer), generate (prefill, cached decode steps, sampling), decode (the decoding attention
// and the KV-cache append), naive (naive and naive-recompute), flash1, flash2 (its switches
// FLASH2_FORWARD_LONG_T and FLASH2_MMA_SYNC come from the environment, as in the library).
// --seq-lens sets the attention families' sequence lengths; --forward-only skips their backward.
//
// Output, one line each, for the script to read: "case NAME: ok" after every call (the stream is
// synchronized and checked; a failure prints "case NAME: FAILED ..." and exits 1), then at exit
// "kernel LAUNCHES FAILED NAME" per kernel and "done FAMILY: ..." (or "incomplete FAMILY: ...").
// Launches are counted by wrapping the CUDA runtime's launch entry points at link time (the Makefile
// passes -Xlinker --wrap=...): every kernel launched by code compiled into this program (the layers,
// the attention library, CUB) is seen with its result, so a listed kernel was really enqueued, and a
// case that ended "ok" saw it finish. cuBLAS and cuBLASLt launch their kernels inside the libraries,
// so those run under the sanitizer too but are not listed.
//
// Memory, for initcheck (which reports reads of device memory nothing wrote): every input a call
// reads is filled, including what an API says may hold anything (the logits' padding columns);
// outputs, scratch and workspaces are left as cudaMalloc gives them, so a kernel that reads them
// before writing them is reported. Memory an API says is never read stays unwritten on purpose: the
// KV cache past each sequence's length, and the K/V columns of the packed rows decode reads q from.
// Two exceptions. By design of the code under test, flash2's causal forward on Hopper reads its tile
// counter (8 bytes at the start of the workspace) without a zeroing pass (flash2_forward_hopper.cuh:
// any old value works), so that word is filled before every such call (in the model, before its
// first forward). By a limit of the tool, memory written by TMA stores (cp.async.bulk.tensor) stays
// "uninitialized" to initcheck, so every later ordinary read of it is reported although the data is
// there: cuBLASLt's Hopper GEMMs store D that way, flash2's Hopper forward stores out that way, and
// flash2's Hopper backward writes its fp32 dQ accumulator (the start of its workspace) by bulk copies
// (cp.async.bulk from shared memory). Such outputs are filled before the call that writes them (see
// fill_tma_output); nothing else is.
#include <cuda_bf16.h>
#include <cxxabi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/decode.h"
#include "layers/cuda_common.h"
#include "layers/generate/gpt_generate.cuh"
#include "layers/model/gelu.cuh"
#include "layers/model/fp8_scaling.cuh"
#include "layers/model/matmul_fp8.cuh"
#include "layers/optimizer/optimizer.cuh"

// ---- launches, counted at the runtime's entry points ------------------------------------------------

#define MAX_KERNEL_KEYS 512

typedef struct {
    const void* key;  // what the launch named the kernel by: its host stub or its cudaKernel_t
    long launches, failed;
} LaunchCount;

static LaunchCount g_launch_counts[MAX_KERNEL_KEYS];
static int g_num_launch_keys;
static long g_uncounted;            // launches past MAX_KERNEL_KEYS distinct kernels
static __thread int g_launch_depth;  // a runtime entry point that calls another counts once

static void record_launch(const void* key, cudaError_t err) {
    for (int i = 0; i < g_num_launch_keys; i++)
        if (g_launch_counts[i].key == key) {
            g_launch_counts[i].launches++;
            g_launch_counts[i].failed += err != cudaSuccess;
            return;
        }
    if (g_num_launch_keys == MAX_KERNEL_KEYS) {
        g_uncounted++;
        return;
    }
    LaunchCount c = {key, 1, err != cudaSuccess};
    g_launch_counts[g_num_launch_keys++] = c;
}

// A weak real entry point left unresolved by the link: nothing could run, so say so and stop.
static void missing_entry_point(const char* name) {
    fprintf(stderr, "sanitize_kernels: the CUDA runtime linked into this program has no %s; rebuild it with "
                    "the Makefile's rule (make build/sanitize_kernels)\n", name);
    exit(3);
}

// The entry points: kernel<<<...>>> (CUDA 12.x and 13: __cudaLaunchKernel with a cudaKernel_t; older:
// cudaLaunchKernel), cudaLaunchKernel called directly, and cudaLaunchKernelEx (cudaLaunchKernelExC).
// The real ones are weak, so a toolkit whose runtime lacks one still links (nothing calls it there).
extern "C" {
cudaError_t __real_cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) __attribute__((weak));
cudaError_t __real___cudaLaunchKernel(void*, dim3, dim3, void**, size_t, cudaStream_t) __attribute__((weak));
cudaError_t __real_cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) __attribute__((weak));

cudaError_t __wrap_cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t smem,
                                    cudaStream_t stream) {
    if (!__real_cudaLaunchKernel) missing_entry_point("cudaLaunchKernel");
    const int outer = g_launch_depth++ == 0;
    const cudaError_t err = __real_cudaLaunchKernel(func, grid, block, args, smem, stream);
    g_launch_depth--;
    if (outer) record_launch(func, err);
    return err;
}

cudaError_t __wrap___cudaLaunchKernel(void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                      cudaStream_t stream) {
    if (!__real___cudaLaunchKernel) missing_entry_point("__cudaLaunchKernel");
    const int outer = g_launch_depth++ == 0;
    const cudaError_t err = __real___cudaLaunchKernel(kernel, grid, block, args, smem, stream);
    g_launch_depth--;
    if (outer) record_launch(kernel, err);
    return err;
}

cudaError_t __wrap_cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
    if (!__real_cudaLaunchKernelExC) missing_entry_point("cudaLaunchKernelExC");
    const int outer = g_launch_depth++ == 0;
    const cudaError_t err = __real_cudaLaunchKernelExC(config, func, args);
    g_launch_depth--;
    if (outer) record_launch(func, err);
    return err;
}
}

// ---- kernel names ------------------------------------------------------------------------------------

// Removes every occurrence of the span from `start` up to and including the next `end` in s.
static void strip_spans(char* s, const char* start, const char* end) {
    char* p;
    while ((p = strstr(s, start)) != NULL) {
        char* q = strstr(p, end);
        if (!q) return;
        memmove(p, q + strlen(end), strlen(q + strlen(end)) + 1);
    }
}

// Cuts the parameter list "(...)" off the end of a demangled name (template arguments may hold
// parentheses too, so the match is found from the end).
static void strip_parameters(char* s) {
    size_t n = strlen(s);
    if (n == 0 || s[n - 1] != ')') return;
    int depth = 0;
    for (size_t i = n; i-- > 0;) {
        depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
        if (depth == 0) {
            s[i] = '\0';
            return;
        }
    }
}

// Long template argument lists (CUB's policies) become <...>, so a name fits on a line.
static void shorten_templates(char* s, size_t limit) {
    char* open = strchr(s, '<');
    if (strlen(s) <= limit || !open) return;
    int depth = 0;
    for (char* p = open; *p; p++) {
        depth += *p == '<' ? 1 : *p == '>' ? -1 : 0;
        if (depth == 0) {
            memmove(open + 5, p + 1, strlen(p + 1) + 1);
            memcpy(open, "<...>", 5);
            return;
        }
    }
}

// The kernel's name as the source spells it: demangled, without return type, parameters, or nvcc's
// per-file namespace for static kernels (_INTERNAL_<hash>_..::).
static void kernel_name(const void* key, char* out, size_t size) {
    const char* mangled = NULL;
    if (cudaFuncGetName(&mangled, key) != cudaSuccess || !mangled) {
        cudaGetLastError();
        snprintf(out, size, "(kernel %p, name unknown)", key);
        return;
    }
    static char full[16384];  // CUB's demangled names run to a few thousand characters
    int status = 0;
    char* demangled = abi::__cxa_demangle(mangled, NULL, NULL, &status);
    snprintf(full, sizeof(full), "%s", demangled && status == 0 ? demangled : mangled);
    free(demangled);
    char* s = strncmp(full, "void ", 5) == 0 ? full + 5 : full;
    strip_spans(s, "_INTERNAL_", "::");
    strip_spans(s, "(anonymous namespace)", "::");
    strip_parameters(s);
    shorten_templates(s, 100);
    snprintf(out, size, "%s", s);
}

// ---- the report at exit ------------------------------------------------------------------------------

static const char* g_family = "";
static int g_cases;        // cases that ended ok
static int g_finished;     // 1 once the family ran to its end
static int g_uses_cublas;  // the family calls cuBLAS or cuBLASLt (their kernels are not counted)

// Prints "kernel LAUNCHES FAILED NAME" per kernel (keys of one name merged) and the last line; once,
// from main or, when something exits early, from atexit.
static void report_launches(void) {
    static char names[MAX_KERNEL_KEYS][320];
    static int reported = 0;
    if (reported++) return;
    long total = 0;
    for (int i = 0; i < g_num_launch_keys; i++) kernel_name(g_launch_counts[i].key, names[i], sizeof(names[i]));
    int kernels = 0;
    for (int i = 0; i < g_num_launch_keys; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = strcmp(names[i], names[j]) != 0;
        if (!first) continue;
        long launches = 0, failed = 0;
        for (int j = i; j < g_num_launch_keys; j++) {
            if (strcmp(names[i], names[j]) != 0) continue;
            launches += g_launch_counts[j].launches;
            failed += g_launch_counts[j].failed;
        }
        printf("kernel %ld %ld %s\n", launches, failed, names[i]);
        kernels++;
        total += launches;
    }
    printf("%s %s: %d cases ok, %d kernels, %ld launches%s%s\n", g_finished ? "done" : "incomplete", g_family,
           g_cases, kernels, total + g_uncounted, g_uncounted ? " (some past the table, not named)" : "",
           g_uses_cublas ? "; plus cuBLAS/cuBLASLt's own kernels (not listed)" : "");
    fflush(stdout);
}

// ---- device memory and inputs ------------------------------------------------------------------------

#define MAX_ALLOCS 1024

static cudaStream_t g_stream;
static void* g_allocs[MAX_ALLOCS];
static int g_num_allocs;
static uint64_t g_rng = 0x5A17C0DEull;  // fixed: the inputs need values, not variety

// cudaMalloc'ed and left as it is (uninitialized for initcheck); freed by dev_free_all.
static void* dev_alloc(size_t bytes) {
    if (g_num_allocs == MAX_ALLOCS) {
        fprintf(stderr, "sanitize_kernels: more than %d allocations in one case\n", MAX_ALLOCS);
        exit(2);
    }
    void* p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    g_allocs[g_num_allocs++] = p;
    return p;
}

static void dev_free_all(void) {
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    for (int i = 0; i < g_num_allocs; i++) CUDA_CHECK(cudaFree(g_allocs[i]));
    g_num_allocs = 0;
}

static uint64_t rng_next(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [lo, hi).
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * 0x1p-24); }

static void upload(void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
}

static __nv_bfloat16* bf16_uninit(size_t n) { return (__nv_bfloat16*)dev_alloc(n * sizeof(__nv_bfloat16)); }
static float* f32_uninit(size_t n) { return (float*)dev_alloc(n * sizeof(float)); }

// n bf16 values uniform in [-scale, scale), on the GPU.
static __nv_bfloat16* bf16_random(size_t n, float scale) {
    __nv_bfloat16* host = (__nv_bfloat16*)malloc(n * sizeof(__nv_bfloat16) + 1);
    for (size_t i = 0; i < n; i++) host[i] = __float2bfloat16(rng_uniform(-scale, scale));
    __nv_bfloat16* d = bf16_uninit(n);
    upload(d, host, n * sizeof(__nv_bfloat16));  // pageable: staged before the call returns
    free(host);
    return d;
}

static float* f32_random(size_t n, float lo, float hi) {
    float* host = (float*)malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) host[i] = rng_uniform(lo, hi);
    float* d = f32_uninit(n);
    upload(d, host, n * sizeof(float));
    free(host);
    return d;
}

// ---- memory that TMA stores write --------------------------------------------------------------------
//
// initcheck marks memory initialized at ordinary stores and memset/memcpy, but not at TMA stores
// (cp.async.bulk.tensor, whose bytes the tensor map decides). In the first run every initcheck report
// was an ordinary read of such memory, of rows the store had written: cuBLASLt's epilogue kernel,
// gelu_forward and the dbias reduction reading GEMM outputs (matmul: 33·72 + 4488/8 + 33·72/8 = 3234
// first reads, the error count exactly), LayerNorm reading residual2/residual3 (model, generate),
// flash2's backward prepare reading out (flash2; clean with FLASH2_MMA_SYNC=1, whose forward stores
// out with ordinary stores). The tool cannot judge such memory either way (a part the store missed
// reads as uninitialized as the part it wrote), so it is filled before the call that writes it; the
// GPU tests check the values those stores write.

static int g_gemm_stores_by_tma;  // cuBLASLt's GEMMs store D by TMA: Hopper (sm_90) and newer

static void fill_tma_output(void* p, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream)); }

// n bf16 that a cuBLASLt GEMM writes and a later kernel reads.
static __nv_bfloat16* bf16_gemm_output(size_t n) {
    __nv_bfloat16* d = bf16_uninit(n);
    if (g_gemm_stores_by_tma) fill_tma_output(d, n * sizeof(__nv_bfloat16));
    return d;
}

// Whether the backend's forward stores out by TMA (flash2's Hopper kernels; FLASH2_MMA_SYNC=1 not).
static int attn_out_stored_by_tma(AttentionBackend be) { return be == ATTN_FLASH2 && attention_flash2_uses_wgmma(); }

static int* ints_upload(const int* host, size_t n) {
    int* d = (int*)dev_alloc(n * sizeof(int));
    upload(d, host, n * sizeof(int));
    return d;
}

// n token ids below V on the GPU: `repeat` of every five the same id (long runs of one token, as
// an <|endoftext|>-heavy batch has), 0 and V − 1 among them.
static int* tokens_random(size_t n, int V, int repeat) {
    int* host = (int*)malloc(n * sizeof(int) + 1);
    for (size_t i = 0; i < n; i++) host[i] = (int)(i % 5) < repeat ? 7 % V : (int)(rng_next() % (uint64_t)V);
    host[0] = 0;
    host[n - 1] = V - 1;
    int* d = ints_upload(host, n);
    free(host);
    return d;
}

// ---- cases ---------------------------------------------------------------------------------------------

// Ends a case: waits for the stream and checks it; prints "case NAME: ok", or FAILED and exits.
static void case_end(const char* fmt, ...) {
    char name[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    cudaError_t err = cudaStreamSynchronize(g_stream);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
        printf("case %s: FAILED: %s (%s)\n", name, cudaGetErrorString(err), cudaGetErrorName(err));
        exit(1);
    }
    printf("case %s: ok\n", name);
    g_cases++;
}

typedef struct {
    int seq_lens[8];
    int num_seq_lens;
    int forward_only;
} Options;

// ---- layers ------------------------------------------------------------------------------------------

// N = 65 positions: three chunks of the dwte backward (ENCODER_BWD_CHUNK 32), the repeated token's run
// crossing their boundaries (the spans kernel); V odd, Vp = V rounded up to 8.
static void layers_encoder(void) {
    const int B = 5, T = 13, C = 72, V = 97, Vp = 104, maxT = 15, N = B * T;
    const int* tokens = tokens_random(N, V, 4);
    const __nv_bfloat16* wte = bf16_random((size_t)Vp * C, 1.0f);
    const __nv_bfloat16* wpe = bf16_random((size_t)maxT * C, 1.0f);
    encoder_forward(bf16_uninit((size_t)N * C), tokens, wte, wpe, B, T, C, g_stream);
    case_end("encoder_forward_B%d_T%d_C%d", B, T, C);
    const size_t scratch_bytes = encoder_backward_scratch_bytes(N, C, Vp);
    encoder_backward(bf16_random((size_t)Vp * C, 1.0f), bf16_random((size_t)maxT * C, 1.0f), dev_alloc(scratch_bytes),
                     scratch_bytes, bf16_random((size_t)N * C, 1.0f), tokens, B, T, C, Vp, g_stream);
    case_end("encoder_backward_B%d_T%d_C%d_Vp%d", B, T, C, Vp);
    dev_free_all();
}

// One (N, C): the forward (statistics saved, and not), the backward with and without dinp_sum.
static void layers_layernorm(int N, int C) {
    const size_t n = (size_t)N * C;
    const __nv_bfloat16* inp = bf16_random(n, 2.0f);
    const __nv_bfloat16* weight = bf16_random(C, 1.0f);
    const __nv_bfloat16* bias = bf16_random(C, 1.0f);
    float *mean = f32_uninit(N), *rstd = f32_uninit(N);
    layernorm_forward(bf16_uninit(n), NULL, NULL, inp, weight, bias, N, C, g_stream);
    case_end("layernorm_forward_N%d_C%d_no_stats", N, C);
    layernorm_forward(bf16_uninit(n), mean, rstd, inp, weight, bias, N, C, g_stream);
    case_end("layernorm_forward_N%d_C%d", N, C);
    const size_t scratch_bytes = layernorm_backward_scratch_bytes(N, C);
    float* scratch = (float*)dev_alloc(scratch_bytes);
    const __nv_bfloat16* dout = bf16_random(n, 1.0f);
    for (int with_sum = 0; with_sum <= 1; with_sum++) {
        // dinp, dweight, dbias and dinp_sum are added into: inputs too
        layernorm_backward(bf16_random(n, 1.0f), bf16_random(C, 1.0f), bf16_random(C, 1.0f),
                           with_sum ? bf16_random(C, 1.0f) : NULL, scratch, scratch_bytes, dout, inp, weight, mean,
                           rstd, N, C, g_stream);
        case_end("layernorm_backward_N%d_C%d%s", N, C, with_sum ? "_dinp_sum" : "");
    }
    dev_free_all();
}

// n = 1001 (a ragged last vector), then 999 from the second element (unaligned: the scalar path).
static void layers_gelu(void) {
    const size_t n = 1001;
    const __nv_bfloat16* inp = bf16_random(n, 4.0f);
    __nv_bfloat16* out = bf16_uninit(n);
    __nv_bfloat16* dinp = bf16_uninit(n);
    __nv_bfloat16* dout = bf16_random(n, 1.0f);
    gelu_forward(out, inp, n, g_stream);
    case_end("gelu_forward_n%zu", n);
    gelu_backward(dinp, dout, inp, n, g_stream);
    case_end("gelu_backward_n%zu", n);
    gelu_forward(out + 1, inp + 1, n - 2, g_stream);
    case_end("gelu_forward_n%zu_unaligned", n - 2);
    gelu_backward(dinp + 1, dout + 1, inp + 1, n - 2, g_stream);
    case_end("gelu_backward_n%zu_unaligned", n - 2);
    gelu_backward(dout, dout, inp, n, g_stream);
    case_end("gelu_backward_n%zu_in_place", n);
    dev_free_all();
}

// V odd (the last vector of a row is part vocabulary, part padding); padding filled, as the contract
// lets it hold anything.
static void layers_crossentropy(void) {
    const int N = 33, V = 97, Vp = 104;
    __nv_bfloat16* logits = bf16_random((size_t)N * Vp, 8.0f);
    const int* targets = tokens_random(N, V, 0);
    float* losses = f32_uninit(N);
    crossentropy_forward(losses, logits, targets, N, V, Vp, g_stream);
    case_end("crossentropy_forward_N%d_V%d_Vp%d", N, V, Vp);
    crossentropy_forward_backward(losses, logits, targets, 1.0f / N, N, V, Vp, g_stream);
    case_end("crossentropy_forward_backward_N%d_V%d_Vp%d", N, V, Vp);
    dev_free_all();
}

// The vector path with a device clip scale and weight decay, then an unaligned slice (scalar path).
static void layers_adamw(void) {
    const size_t n = 1001;
    float* master = f32_random(n, -1.0f, 1.0f);
    float* m = f32_random(n, -0.1f, 0.1f);
    float* v = f32_random(n, 0.0f, 0.01f);
    const __nv_bfloat16* grads = bf16_random(n, 1.0f);
    __nv_bfloat16* params = bf16_uninit(n);  // written from the master weights, never read
    const float* scale = f32_random(1, 0.5f, 0.5f);
    adamw_update(master, params, grads, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f, scale, g_stream);
    case_end("adamw_n%zu", n);
    adamw_update(master + 1, params + 1, grads + 1, m + 1, v + 1, n - 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f,
                 NULL, g_stream);
    case_end("adamw_n%zu_unaligned", n - 2);
    dev_free_all();
}

static void layers_global_norm(void) {
    const size_t n = 1001;
    const __nv_bfloat16* x = bf16_random(n, 1.0f);
    float* out = f32_uninit(2);
    float* scratch = (float*)dev_alloc(global_norm_scratch_bytes());
    global_norm(out, scratch, x, n, g_stream);
    case_end("global_norm_n%zu", n);
    global_norm_squared(out + 1, scratch, x + 1, n - 2, g_stream);
    case_end("global_norm_squared_n%zu_unaligned", n - 2);
    global_norm_clip_scale(f32_uninit(1), out, 1.0f, g_stream);
    case_end("global_norm_clip_scale");
    dev_free_all();
}

static void layers_init_weights(void) {
    const size_t n = 1001;
    init_weights(f32_uninit(n), bf16_uninit(n), n, 17, 0.02f, 0.0f, 42, 3, g_stream);
    case_end("init_weights_normal_n%zu", n);
    init_weights(NULL, bf16_uninit(n), n, 0, 0.0f, 1.0f, 42, 4, g_stream);
    case_end("init_weights_constant_n%zu", n);
    dev_free_all();
}

// LayerNorm at C = 72 (the forward's smallest instance), 1032 (vectors per lane 6) and 4104 (the
// backward's two vectors per thread, the forward's largest instance).
static void family_layers(const Options* o) {
    (void)o;
    layers_encoder();
    layers_layernorm(65, 72);
    layers_layernorm(33, 1032);
    layers_layernorm(5, 4104);
    layers_gelu();
    layers_crossentropy();
    layers_adamw();
    layers_global_norm();
    layers_init_weights();
}

// ---- matmul --------------------------------------------------------------------------------------------

static const char* FUSION_NAMES[] = {"epilogues", "kernels", "auto"};  // MatmulFusion order

#define MM_N 33
#define MM_IC 72
#define MM_OC 136

// The forward paths: bias, GELU (epilogue or kernel), the residual added in the epilogue (out apart
// from the residual, and in place).
static void matmul_forward_cases(MatmulContext* ctx, const char* fusion, const __nv_bfloat16* inp,
                                 const __nv_bfloat16* weight, const __nv_bfloat16* bias) {
    const size_t n_out = (size_t)MM_N * MM_OC;
    matmul_forward(ctx, bf16_uninit(n_out), inp, weight, bias, MM_N, MM_IC, MM_OC, NULL);
    case_end("matmul_%s_forward_bias (%s)", fusion, ctx->last_forward);
    matmul_forward(ctx, bf16_uninit(n_out), inp, weight, NULL, MM_N, MM_IC, MM_OC, NULL);
    case_end("matmul_%s_forward (%s)", fusion, ctx->last_forward);
    // gelu_pre: the GEMM's D, which the GELU kernel then reads
    matmul_forward(ctx, bf16_uninit(n_out), inp, weight, bias, MM_N, MM_IC, MM_OC, bf16_gemm_output(n_out));
    case_end("matmul_%s_forward_gelu (%s)", fusion, ctx->last_forward);
    __nv_bfloat16* residual = bf16_random(n_out, 1.0f);
    matmul_forward_residual(ctx, bf16_uninit(n_out), residual, inp, weight, bias, MM_N, MM_IC, MM_OC);
    case_end("matmul_%s_forward_residual (%s)", fusion, ctx->last_forward);
    matmul_forward_residual(ctx, residual, residual, inp, weight, NULL, MM_N, MM_IC, MM_OC);
    case_end("matmul_%s_forward_residual_in_place (%s)", fusion, ctx->last_forward);
}

// The backward paths: dinp, dweight and dbias written then accumulated; dweight alone; dGELU with
// and without the previous layer's bias gradient (dbias_pre), written then accumulated.
static void matmul_backward_cases(MatmulContext* ctx, const char* fusion, const __nv_bfloat16* inp,
                                  const __nv_bfloat16* weight) {
    const __nv_bfloat16* dout = bf16_random((size_t)MM_N * MM_OC, 1.0f);
    const __nv_bfloat16* gelu_pre = bf16_random((size_t)MM_N * MM_IC, 2.0f);  // inp = GELU(gelu_pre) in a model
    // overwritten by a GEMM, then read by cuBLASLt's DGELU_BGRAD epilogue kernel or the dbias reduction
    __nv_bfloat16* dinp = bf16_gemm_output((size_t)MM_N * MM_IC);
    __nv_bfloat16* dweight = bf16_gemm_output((size_t)MM_OC * MM_IC);  // written by the first call, then added to
    __nv_bfloat16* dbias = bf16_uninit(MM_OC);
    __nv_bfloat16* dbias_pre = bf16_uninit(MM_IC);
    void* scratch = dev_alloc(matmul_dbias_scratch_bytes(MM_N, MM_OC > MM_IC ? MM_OC : MM_IC));
    for (int acc = 0; acc <= 1; acc++) {
        matmul_backward(ctx, dinp, dweight, dbias, dout, inp, weight, MM_N, MM_IC, MM_OC, NULL, acc, scratch);
        case_end("matmul_%s_backward%s (dinp %s, dbias %s)", fusion, acc ? "_accumulate" : "", ctx->last_dinp,
                 ctx->last_dbias);
    }
    matmul_backward(ctx, NULL, dweight, NULL, dout, inp, weight, MM_N, MM_IC, MM_OC, NULL, 1, NULL);
    case_end("matmul_%s_backward_dweight_only", fusion);
    for (int acc = 0; acc <= 1; acc++) {
        matmul_backward_dgelu_dbias(ctx, dinp, dweight, dbias, dout, inp, weight, MM_N, MM_IC, MM_OC, gelu_pre, acc,
                                    scratch, dbias_pre);
        case_end("matmul_%s_backward_dgelu_dbias_pre%s (dinp %s, dbias_pre %s)", fusion, acc ? "_accumulate" : "",
                 ctx->last_dinp, ctx->last_dbias_pre);
    }
    matmul_backward(ctx, dinp, dweight, dbias, dout, inp, weight, MM_N, MM_IC, MM_OC, gelu_pre, 1, scratch);
    case_end("matmul_%s_backward_dgelu (dinp %s)", fusion, ctx->last_dinp);
}

// Column sums of part of a wider gradient (ld > OC), weighted rows and plain; then the qkv bias
// gradient (grouped-query: 4 query heads, 2 K/V heads), written and then added to with q done.
static void matmul_column_sum_cases(MatmulContext* ctx) {
    const long ld = MM_OC + 16;
    const __nv_bfloat16* wide = bf16_random((size_t)MM_N * ld, 1.0f);
    __nv_bfloat16* sums = bf16_uninit(MM_OC);
    void* scratch = dev_alloc(matmul_dbias_scratch_bytes(MM_N, MM_OC));
    matmul_column_sums(ctx, sums, scratch, wide, bf16_random(MM_N, 1.0f), ld, MM_N, MM_OC, 0);
    case_end("matmul_column_sums_weighted_ld%ld", ld);
    matmul_column_sums(ctx, sums, scratch, wide, NULL, ld, MM_N, MM_OC, 1);
    case_end("matmul_column_sums_accumulate_ld%ld", ld);
    const int NH = 4, NKV = 2, HD = 64, C = NH * HD, QKV = (NH + 2 * NKV) * HD;
    const __nv_bfloat16* dqkv = bf16_random((size_t)MM_N * QKV, 1.0f);
    const __nv_bfloat16* dproj_bias = bf16_random(C, 1.0f);
    const __nv_bfloat16* proj_weight = bf16_random((size_t)C * C, 0.1f);
    __nv_bfloat16* dqkv_bias = bf16_uninit(QKV);
    void* qkv_scratch = dev_alloc(matmul_dbias_scratch_bytes(MM_N > C ? MM_N : C, C));
    for (int again = 0; again <= 1; again++) {
        qkv_bias_backward(ctx, dqkv_bias, dqkv, dproj_bias, proj_weight, bf16_uninit(C), qkv_scratch, MM_N, NH, NKV,
                          HD, again, again);
        case_end("qkv_bias_backward_nh%d_nkv%d%s", NH, NKV, again ? "_accumulate_q_done" : "");
    }
}

// Every fusion: the cuBLASLt epilogues, this file's kernels (GELU, dGELU, the dbias reduction), and
// the automatic choice untimed (ctx->tune = 0: fixed choices, as with --deterministic).
static void family_matmul(const Options* o) {
    (void)o;
    g_uses_cublas = 1;
    const MatmulFusion fusions[] = {MATMUL_FUSE_EPILOGUES, MATMUL_FUSE_NONE, MATMUL_FUSE_AUTO};
    for (int f = 0; f < 3; f++) {
        MatmulContext ctx;
        matmul_context_create(&ctx, g_stream);
        ctx.fusion = fusions[f];
        const __nv_bfloat16* inp = bf16_random((size_t)MM_N * MM_IC, 1.0f);
        const __nv_bfloat16* weight = bf16_random((size_t)MM_OC * MM_IC, 0.1f);
        const __nv_bfloat16* bias = bf16_random(MM_OC, 1.0f);
        matmul_forward_cases(&ctx, FUSION_NAMES[fusions[f]], inp, weight, bias);
        matmul_backward_cases(&ctx, FUSION_NAMES[fusions[f]], inp, weight);
        if (fusions[f] == MATMUL_FUSE_AUTO) matmul_column_sum_cases(&ctx);
        dev_free_all();
        matmul_context_destroy(&ctx);
    }
}

// ---- model: a training step of the whole GPT ----------------------------------------------------------

typedef struct {
    const char* name;
    AttentionBackend backend;
    RecomputeMode recompute;
    int lm_head_rows;  // 0: one chunk; 16: three chunks of the 34 rows
    int deterministic;
} ModelRun;

// The model's activations that only TMA stores write, filled once (see "memory that TMA stores
// write"): the GEMM outputs (qkv, residual2, fch and fch_gelu, residual3, logits; dln and dwide in the
// backward) and, from flash2's Hopper forward, atty, and the scratch (flash2's dQ accumulator). LayerNorm, encoder, loss and scratch memory,
// which this repository's kernels write with ordinary stores, stays unwritten.
static void model_fill_tma_outputs(GPTModel* m) {
    static const int gemm_outputs[] = {GPT_ACT_qkv,       GPT_ACT_residual2, GPT_ACT_fch, GPT_ACT_fch_gelu,
                                       GPT_ACT_residual3, GPT_ACT_logits,    GPT_ACT_dln, GPT_ACT_dwide};
    const GPTActTensor* t = m->memory.act_table;
    for (size_t i = 0; i < sizeof(gemm_outputs) / sizeof(gemm_outputs[0]) && g_gemm_stores_by_tma; i++)
        fill_tma_output((char*)m->acts_memory + t[gemm_outputs[i]].offset, t[gemm_outputs[i]].bytes);
    if (attn_out_stored_by_tma(m->backend)) {
        fill_tma_output((char*)m->acts_memory + t[GPT_ACT_atty].offset, t[GPT_ACT_atty].bytes);
        // the shared scratch holds flash2's backward workspace, whose dQ accumulator bulk copies write;
        // this fills the other layers' scratch too, which the layers and matmul families check unfilled
        fill_tma_output(m->scratch, m->memory.scratch_bytes);
    }
}

// A model of `config` for (B, T) with GPT-2 initialized weights (init_weights on the GPU) and its
// optimizer (master weights and moments).
static void model_make(GPTModel* m, Optimizer* opt, const GPTConfig* config, const GPTModelOptions* options) {
    if (gpt_model_create(m, config, options) != 0) {
        printf("case %s gpt_model_create: FAILED (see the error above)\n", g_family);
        exit(1);
    }
    optimizer_create(opt, 0, m->num_params, 0.1f, 1.0f);
    optimizer_init_gpt2(opt, m, 1234);
    // the attention workspace is the model's shared scratch: flash2's tile counter word, read unzeroed
    // by design (see the top of the file), is filled before the first forward; later ones find it written
    model_fill_tma_outputs(m);
    if (m->backend == ATTN_FLASH2) CUDA_CHECK(cudaMemsetAsync(m->scratch, 0xFF, 8, g_stream));
}

// Two micro steps (gradients added up), clipping and AdamW, then a validation forward whose mean loss
// is added on the GPU, as train_gpt runs them.
static void model_step(const ModelRun* r) {
    GPTConfig config;  // head dim 80, one K/V head (multi-query), odd vocab padded to a multiple of 8
    config.num_layers = 2, config.channels = 160, config.num_heads = 2, config.num_kv_heads = 1;
    config.vocab_size = 201, config.padded_vocab_size = 208, config.max_seq_len = 33;
    const int B = 2, T = 17, N = B * T;
    GPTModelOptions options = gpt_model_options(B, T, r->backend, g_stream);
    options.recompute = r->recompute, options.lm_head_rows = r->lm_head_rows;
    options.deterministic_attention = r->deterministic;
    GPTModel m;
    Optimizer opt;
    model_make(&m, &opt, &config, &options);
    case_end("model_%s_create_and_init", r->name);
    const int* inputs = tokens_random(N, config.vocab_size, 2);
    const int* targets = tokens_random(N, config.vocab_size, 1);
    const float grad_scale = 1.0f / (2.0f * N);
    gpt_model_zero_grad(&m);
    for (int micro = 0; micro < 2; micro++) {
        gpt_model_forward_train(&m, inputs, targets, grad_scale);
        case_end("model_%s_forward_train_%d", r->name, micro);
        gpt_model_backward(&m, grad_scale);
        case_end("model_%s_backward_%d", r->name, micro);
    }
    optimizer_grad_norm(&opt, &m);
    optimizer_update(&opt, &m, opt.norm, 1e-3, 1);
    case_end("model_%s_optimizer_step", r->name);
    float* loss_sum = f32_uninit(1);
    gpt_model_forward(&m, inputs, targets);
    gpt_model_add_mean_loss(&m, loss_sum, 0.5f, 1);
    gpt_model_add_mean_loss(&m, loss_sum, 0.5f, 0);
    case_end("model_%s_validation_forward", r->name);
    dev_free_all();
    optimizer_destroy(&opt);
    gpt_model_destroy(&m);
}

static void family_model(const Options* o) {
    (void)o;
    g_uses_cublas = 1;
    const ModelRun runs[] = {
        {"flash2_recompute_none", ATTN_FLASH2, RECOMPUTE_NONE, 0, 0},
        {"flash2_recompute_selective_head16", ATTN_FLASH2, RECOMPUTE_SELECTIVE, 16, 0},
        {"flash2_recompute_full_head16_deterministic", ATTN_FLASH2, RECOMPUTE_FULL, 16, 1},
        {"naive_recompute_selective", ATTN_NAIVE, RECOMPUTE_SELECTIVE, 0, 0},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) model_step(&runs[i]);
}

// ---- generate: prefill, cached decode steps, sampling ---------------------------------------------------

static void generate_steps(GPTDecoder* d, int V) {
    int tokens[3 * 16];
    for (int i = 0; i < 3 * 16; i++) tokens[i] = (int)(rng_next() % (uint64_t)V);
    const int steps[] = {1, 3, 16};
    for (int i = 0; i < 3; i++) {
        gpt_decoder_step(d, tokens, steps[i]);
        case_end("generate_step_Tq%d_length%d", steps[i], d->cache.max_length);
    }
    d->splits_override = 3;
    gpt_decoder_step(d, tokens, 1);
    case_end("generate_step_Tq1_3_splits_length%d", d->cache.max_length);
    d->splits_override = 0;
}

// gpt_generate_tokens as --generate runs it: top-k sampling on the GPU (the first token from the
// held logits, the second after an uncaptured step, the third from the captured graph), then greedy.
static void generate_sampling(GPTDecoder* d) {
    int out[3 * 3];
    GPTGenerator g;
    gpt_generator_create(&g, d, 1.0, 20, 11);
    gpt_generate_tokens(&g, 3, out, NULL, NULL);
    case_end("generate_tokens_top_k20");
    gpt_generator_set(&g, 0.0, 0, 11, 1);
    gpt_generate_tokens(&g, 2, out, NULL, NULL);
    case_end("generate_tokens_greedy");
    gpt_generator_destroy(&g);
}

// The decoder's activations that only a GEMM writes (see "memory that TMA stores write"): qkv (read by
// the cache append and the decode attention), r2 (LayerNorm), fch and fch_gelu, and the logits (copied
// to the host by the sampler). x is written by the embedding kernel before its GEMM writes it.
static void decoder_fill_tma_outputs(const GPTDecoder* d) {
    if (!g_gemm_stores_by_tma) return;
    const size_t N = (size_t)d->B * d->max_tq, C = d->model->C, bf = sizeof(__nv_bfloat16);
    fill_tma_output(d->qkv, N * d->qkv_layout.row * bf);
    fill_tma_output(d->r2, N * C * bf);
    fill_tma_output(d->fch, N * 4 * C * bf);
    fill_tma_output(d->fch_gelu, N * 4 * C * bf);
    fill_tma_output(d->logits, (size_t)d->B * d->model->Vp * bf);
}

// A 2-layer GPT (head dim 64, one K/V head for two query heads), 3 sequences: prefill of 5 tokens (a
// layer at a time in the decoder's buffers, flash2), decode steps of 1, 3 and 16 tokens (own and forced
// splits), sampling, and the training samples' path from an empty cache.
static void family_generate(const Options* o) {
    (void)o;
    g_uses_cublas = 1;
    GPTConfig config;
    config.num_layers = 2, config.channels = 128, config.num_heads = 2, config.num_kv_heads = 1;
    config.vocab_size = 201, config.padded_vocab_size = 208, config.max_seq_len = 48;
    const int B = 3, P = 5;
    const GPTModelOptions options = gpt_model_options(B, P, ATTN_FLASH2, g_stream);
    GPTModel m;
    Optimizer opt;
    model_make(&m, &opt, &config, &options);
    GPTDecoder d;
    if (gpt_decoder_create(&d, &m, B, 40, DECODE_MAX_QUERY_TOKENS) != 0) exit(1);
    decoder_fill_tma_outputs(&d);
    gpt_prefill_buffers(&d, B, P);  // the prefill's buffers, made now so that their GEMM outputs are filled
    if (g_gemm_stores_by_tma) fill_tma_output(d.prefill_memory, d.prefill_bytes);
    gpt_decoder_prefill(&d, tokens_random((size_t)B * P, config.vocab_size, 1), P);
    case_end("generate_prefill_B%d_P%d", B, P);
    generate_steps(&d, config.vocab_size);
    generate_sampling(&d);
    gpt_decoder_reset(&d);
    const int first[3] = {GPT2_EOT_TOKEN % config.vocab_size, 1, 2};
    gpt_decoder_step(&d, first, 1);
    case_end("generate_step_from_empty_cache");
    dev_free_all();
    gpt_decoder_destroy(&d);
    optimizer_destroy(&opt);
    gpt_model_destroy(&m);
}

// ---- decode: the decoding attention and the KV-cache append ---------------------------------------------

typedef struct {
    int HD, NH, NKV, Tq;
    int lengths[3];  // per sequence, >= Tq
    int splits;      // 0: decode_num_splits
    int with_lse;
} DecodeCase;

#define DECODE_B 3
#define DECODE_TMAX 160

// Sequence b's cache holds lengths[b] positions, appended by decode_cache_append from packed K|V rows;
// the positions past it stay unwritten (decode.h: never read).
static void decode_fill_cache(const DecodeCase* c, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
    const long kv = (long)c->NKV * c->HD;
    const __nv_bfloat16* rows = bf16_random((size_t)DECODE_TMAX * 2 * kv, 1.0f);
    const int zero = 0;
    const int* start = ints_upload(&zero, 1);
    for (int b = 0; b < DECODE_B; b++)
        decode_cache_append(rows, rows + kv, 2 * kv, 1, c->lengths[b], c->NKV, c->HD, start,
                            k_cache + (size_t)b * DECODE_TMAX * kv, v_cache + (size_t)b * DECODE_TMAX * kv, DECODE_TMAX,
                            g_stream);
}

// q from packed (NH + 2·NKV)·HD rows as the model's qkv holds them: only the q columns are written.
static const __nv_bfloat16* decode_q(const DecodeCase* c, long row) {
    const size_t rows = (size_t)DECODE_B * c->Tq, q_cols = (size_t)c->NH * c->HD;
    __nv_bfloat16* host = (__nv_bfloat16*)malloc(rows * q_cols * sizeof(__nv_bfloat16));
    for (size_t i = 0; i < rows * q_cols; i++) host[i] = __float2bfloat16(rng_uniform(-2.0f, 2.0f));
    __nv_bfloat16* q = bf16_uninit(rows * row);
    CUDA_CHECK(cudaMemcpy2DAsync(q, row * sizeof(__nv_bfloat16), host, q_cols * sizeof(__nv_bfloat16),
                                 q_cols * sizeof(__nv_bfloat16), rows, cudaMemcpyHostToDevice, g_stream));
    free(host);
    return q;
}

static void decode_run(const DecodeCase* c) {
    DecodeArgs a;
    memset(&a, 0, sizeof(a));
    a.shape.B = DECODE_B, a.shape.Tq = c->Tq, a.shape.NH = c->NH, a.shape.NKV = c->NKV, a.shape.HD = c->HD;
    a.shape.Tmax = DECODE_TMAX;
    const size_t cache = (size_t)DECODE_B * DECODE_TMAX * c->NKV * c->HD;
    __nv_bfloat16 *k_cache = bf16_uninit(cache), *v_cache = bf16_uninit(cache);
    decode_fill_cache(c, k_cache, v_cache);
    case_end("decode_cache_append_hd%d_nkv%d_lengths_%d_%d_%d", c->HD, c->NKV, c->lengths[0], c->lengths[1],
             c->lengths[2]);
    a.q_stride = (long)(c->NH + 2 * c->NKV) * c->HD;
    a.q = decode_q(c, a.q_stride);
    a.k_cache = k_cache, a.v_cache = v_cache;
    a.lengths = ints_upload(c->lengths, DECODE_B);
    for (int b = 0; b < DECODE_B; b++) a.max_length = c->lengths[b] > a.max_length ? c->lengths[b] : a.max_length;
    a.out_stride = (long)c->NH * c->HD;
    a.out = bf16_uninit((size_t)DECODE_B * c->Tq * a.out_stride);
    a.lse = c->with_lse ? f32_uninit((size_t)DECODE_B * c->NH * c->Tq) : NULL;
    a.num_splits = c->splits;
    const int splits = c->splits ? c->splits : decode_num_splits(&a.shape, a.max_length);
    const size_t ws = decode_workspace_bytes(&a.shape, splits);
    a.workspace = ws ? dev_alloc(ws) : NULL;
    char why[512];
    if (decode_check_args(&a, why, sizeof(why)) != 0) {
        printf("case decode_hd%d: FAILED: decode_check_args: %s\n", c->HD, why);
        exit(1);
    }
    decode_attention(&a, g_stream);
    case_end("decode_hd%d_nh%d_nkv%d_Tq%d_max_length%d_splits%d%s", c->HD, c->NH, c->NKV, c->Tq, a.max_length, splits,
             c->with_lse ? "_lse" : "");
    dev_free_all();
}

// Every head dim; one new token (grouped-query, automatic splits, a sequence of one key), three
// (multi-query, 3 splits: the short sequence's extra splits hold no keys) and sixteen (multi-head,
// one split, a full cache).
static void family_decode(const Options* o) {
    (void)o;
    const int head_dims[] = {64, 80, 96, 128};
    for (int h = 0; h < 4; h++) {
        const int HD = head_dims[h];
        const DecodeCase cases[] = {
            {HD, 4, 2, 1, {1, 70, 133}, 0, 1},
            {HD, 4, 1, 3, {3, 64, 129}, 3, 0},
            {HD, 4, 4, 16, {16, 65, DECODE_TMAX}, 1, 1},
        };
        for (int i = 0; i < 3; i++) decode_run(&cases[i]);
    }
}

// ---- attention: naive, naive-recompute, flash1, flash2 -------------------------------------------------

typedef struct {
    int B, T, NH, NKV, HD, causal;
    int plain;  // 0: the packed qkv activation (B, T, NH + 2·NKV, HD), as the model; 1: separate q, k, v
} AttnCase;

static const char* attn_case_name(AttentionBackend be, const AttnCase* c, char* buf, size_t size) {
    snprintf(buf, size, "%s_hd%d_%s_T%d_B%d_nh%d_nkv%d_%s", attention_backend_name(be), c->HD,
             c->causal ? "causal" : "full", c->T, c->B, c->NH, c->NKV, c->plain ? "plain" : "packed");
    return buf;
}

// q, k, v (filled) and the strides of the layout; dq, dk, dv the same way when `grads` (left unwritten).
static void attn_inputs(AttentionArgs* a, const AttnCase* c) {
    const size_t rows = (size_t)c->B * c->T;
    if (!c->plain) {
        a->qkv_stride = (long)(c->NH + 2 * c->NKV) * c->HD;
        a->kv_stride = 0;
        const __nv_bfloat16* qkv = bf16_random(rows * a->qkv_stride, 2.0f);
        a->q = qkv, a->k = qkv + (size_t)c->NH * c->HD, a->v = qkv + (size_t)(c->NH + c->NKV) * c->HD;
    } else {
        a->qkv_stride = (long)c->NH * c->HD;
        a->kv_stride = (long)c->NKV * c->HD;
        a->q = bf16_random(rows * a->qkv_stride, 2.0f);
        a->k = bf16_random(rows * a->kv_stride, 2.0f);
        a->v = bf16_random(rows * a->kv_stride, 2.0f);
    }
    a->out_stride = (long)c->NH * c->HD;
    a->out = bf16_uninit(rows * a->out_stride);
    a->lse = f32_uninit(rows * c->NH);
}

static void attn_grads(AttentionArgs* a, const AttnCase* c) {
    const size_t rows = (size_t)c->B * c->T;
    a->dout = bf16_random(rows * a->out_stride, 1.0f);
    a->dqkv_stride = a->qkv_stride;
    a->dkv_stride = a->kv_stride;
    if (!c->plain) {
        __nv_bfloat16* dqkv = bf16_uninit(rows * a->qkv_stride);  // the backward writes every element
        a->dq = dqkv, a->dk = dqkv + (size_t)c->NH * c->HD, a->dv = dqkv + (size_t)(c->NH + c->NKV) * c->HD;
    } else {
        a->dq = bf16_uninit(rows * a->qkv_stride);
        a->dk = bf16_uninit(rows * a->kv_stride);
        a->dv = bf16_uninit(rows * a->kv_stride);
    }
}

// The backward; flash2 on Hopper also sums dq's columns (added to at causal, written at full) and,
// from 128 keys (several key blocks), runs once more deterministic.
static void attn_backward(AttentionBackend be, const AttentionContext* ctx, AttentionArgs* a, const AttnCase* c,
                          const char* name) {
    attn_grads(a, c);
    if (attention_sums_dq_columns(be, &a->shape)) {
        const size_t n = (size_t)c->NH * c->HD;
        a->dq_colsum = c->causal ? bf16_random(n, 1.0f) : bf16_uninit(n);
        a->dq_colsum_accumulate = c->causal;
    }
    // flash2's Hopper backward stores dq_accum by bulk copies (see "memory that TMA stores write")
    if (attn_out_stored_by_tma(be) && a->workspace)
        fill_tma_output(a->workspace, attention_workspace_bytes(be, &a->shape));
    attention_backward(be, ctx, a, g_stream);
    case_end("%s_backward%s", name, a->dq_colsum ? "_dq_colsum" : "");
    if (be == ATTN_FLASH2 && attention_flash2_uses_wgmma() && c->T >= 128) {
        a->deterministic = 1;
        attention_backward(be, ctx, a, g_stream);
        case_end("%s_backward_deterministic", name);
        a->deterministic = 0;
    }
}

static void attn_run(AttentionBackend be, const AttentionContext* ctx, const AttnCase* c, int forward_only) {
    char name[160];
    attn_case_name(be, c, name, sizeof(name));
    AttentionArgs a;
    memset(&a, 0, sizeof(a));
    AttentionShape shape = {c->B, c->T, c->NH, c->HD, c->causal, c->NKV};
    a.shape = shape;
    char why[512];
    if (attention_check(be, &shape, why, sizeof(why)) != 0) {
        printf("case %s: FAILED: attention_check: %s\n", name, why);
        exit(1);
    }
    attn_inputs(&a, c);
    const size_t saved = attention_saved_bytes(be, &shape), ws = attention_workspace_bytes(be, &shape);
    a.saved = saved ? dev_alloc(saved) : NULL;
    a.workspace = ws ? dev_alloc(ws) : NULL;
    // flash2's causal forward reads its tile counter word unzeroed, by design (see the top of the file)
    if (be == ATTN_FLASH2 && c->causal && a.workspace) CUDA_CHECK(cudaMemsetAsync(a.workspace, 0xFF, 8, g_stream));
    // out stored by TMA, then read by the backward's prepare pass (see "memory that TMA stores write")
    if (attn_out_stored_by_tma(be)) fill_tma_output(a.out, (size_t)c->B * c->T * a.out_stride * sizeof(__nv_bfloat16));
    attention_forward(be, ctx, &a, g_stream);
    case_end("%s_forward", name);
    if (!forward_only) attn_backward(be, ctx, &a, c, name);
    dev_free_all();
}

// Per sequence length: every head dim, causal and full, multi-head in the packed layout (B = 2, 3 heads
// below 128 keys; B = 1, 2 heads from there). Then at the last length: grouped-query in the plain
// layout, and 67 heads (more tiles than an H100 has SMs: flash2's persistent forward walks several);
// at the first: multi-query.
static void attention_cases(const AttentionBackend* backends, int num_backends, const int* head_dims, int num_hd,
                            const AttentionContext* ctx, const Options* o) {
    for (int t = 0; t < o->num_seq_lens; t++)
        for (int h = 0; h < num_hd; h++)
            for (int causal = 1; causal >= 0; causal--) {
                const int T = o->seq_lens[t], B = T < 128 ? 2 : 1, NH = T < 128 ? 3 : 2;
                const AttnCase c = {B, T, NH, NH, head_dims[h], causal, 0};
                for (int b = 0; b < num_backends; b++) attn_run(backends[b], ctx, &c, o->forward_only);
            }
    const int first = o->seq_lens[0], last = o->seq_lens[o->num_seq_lens - 1];
    const AttnCase extra[] = {
        {1, last, 4, 2, head_dims[0], 1, 1},
        {1, last, 67, 67, head_dims[0], 1, 0},
        {2, first, 4, 1, head_dims[num_hd - 1], 0, 0},
    };
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < num_backends; b++) attn_run(backends[b], ctx, &extra[i], o->forward_only);
}

static void family_naive(const Options* o) {
    g_uses_cublas = 1;
    AttentionContext ctx;
    CUBLAS_CHECK(cublasCreate(&ctx.cublas));
    const AttentionBackend backends[] = {ATTN_NAIVE, ATTN_NAIVE_RECOMPUTE};
    const int head_dims[] = {64, 72};  // naive takes any multiple of 8
    attention_cases(backends, 2, head_dims, 2, &ctx, o);
    CUBLAS_CHECK(cublasDestroy(ctx.cublas));
}

static const int FLASH_HEAD_DIMS[] = {64, 80, 96, 128};

static void family_flash1(const Options* o) {
    AttentionContext ctx = {NULL};
    const AttentionBackend backend = ATTN_FLASH1;
    attention_cases(&backend, 1, FLASH_HEAD_DIMS, 4, &ctx, o);
}

// Which kernels run follows FLASH2_MMA_SYNC and FLASH2_FORWARD_LONG_T (attention.h), said in the header.
static void family_flash2(const Options* o) {
    const AttentionFlash2Settings s = attention_flash2_settings();
    printf("flash2: %s kernels (FLASH2_MMA_SYNC %s), FLASH2_FORWARD_LONG_T %d\n",
           attention_flash2_uses_wgmma() ? "Hopper (wgmma)" : "mma.sync", s.mma_sync_forced ? "set" : "unset",
           s.forward_long_t);
    AttentionContext ctx = {NULL};
    const AttentionBackend backend = ATTN_FLASH2;
    attention_cases(&backend, 1, FLASH_HEAD_DIMS, 4, &ctx, o);
}

// ---- main ------------------------------------------------------------------------------------------------

// ---- fp8: the casts, the scale updates and the FP8 GEMMs ----------------------------------------------

// A scale state for each operand; the delayed update then runs over all of them, as once per step.
static Fp8ScaleState* fp8_states(int count) {
    Fp8ScaleState* states = (Fp8ScaleState*)dev_alloc((size_t)count * sizeof(Fp8ScaleState));
    Fp8Format formats[3] = {FP8_E4M3, FP8_E4M3, FP8_E5M2};
    fp8_scale_states_init(states, formats, count, g_stream);
    return states;
}

// The casts on an odd row count (N = 33: a partial tile, the transposed copy written byte by byte)
// and the three GEMMs of a linear layer at N = 48, IC = 64, OC = 80 (multiples of 16, as cuBLASLt's
// FP8 GEMMs need), x and W in E4M3, dy in E5M2.
static void family_fp8(const Options* o) {
    (void)o;
    g_uses_cublas = 1;
    Fp8ScaleState* st = fp8_states(3);  // x, W, dy
    const int odd_n = 33, N = 48, IC = 64, OC = 80;
    const __nv_bfloat16* odd = bf16_random((size_t)odd_n * IC, 4.0f);
    CUDA_CHECK(cudaMemsetAsync(&st[0].amax, 0, sizeof(float), g_stream));
    fp8_cast((uint8_t*)dev_alloc((size_t)odd_n * IC), odd, odd_n, IC, FP8_E4M3, &st[0].scale, &st[0].amax, g_stream);
    case_end("fp8_cast_e4m3_n%d_c%d", odd_n, IC);
    fp8_cast_transpose((uint8_t*)dev_alloc((size_t)odd_n * IC), (uint8_t*)dev_alloc((size_t)odd_n * IC), odd, odd_n,
                       IC, FP8_E5M2, &st[2].scale, &st[2].amax, g_stream);
    case_end("fp8_cast_transpose_e5m2_n%d_c%d", odd_n, IC);
    fp8_current_scale(&st[1], odd, odd_n, IC, 0, 0, g_stream);
    case_end("fp8_current_scale_n%d_c%d", odd_n, IC);
    fp8_delayed_update(st, 3, 0, 0, g_stream);
    case_end("fp8_delayed_update_3_states");
    uint8_t *x = (uint8_t*)dev_alloc((size_t)N * IC), *x_t = (uint8_t*)dev_alloc((size_t)N * IC);
    uint8_t *w = (uint8_t*)dev_alloc((size_t)OC * IC), *w_t = (uint8_t*)dev_alloc((size_t)OC * IC);
    uint8_t *dy = (uint8_t*)dev_alloc((size_t)N * OC), *dy_t = (uint8_t*)dev_alloc((size_t)N * OC);
    fp8_cast_transpose(x, x_t, bf16_random((size_t)N * IC, 1.0f), N, IC, FP8_E4M3, &st[0].scale, &st[0].amax, g_stream);
    fp8_cast_transpose(w, w_t, bf16_random((size_t)OC * IC, 0.1f), OC, IC, FP8_E4M3, &st[1].scale, NULL, g_stream);
    fp8_cast_transpose(dy, dy_t, bf16_random((size_t)N * OC, 1.0f), N, OC, FP8_E5M2, &st[2].scale, NULL, g_stream);
    case_end("fp8_cast_transpose_operands_n%d", N);
    MatmulContext ctx;
    matmul_context_create(&ctx, g_stream);
    const Fp8Operand fx = fp8_operand(x, FP8_E4M3, &st[0].scale_inv), fw = fp8_operand(w, FP8_E4M3, &st[1].scale_inv);
    matmul_fp8_forward(&ctx, bf16_uninit((size_t)N * OC), fx, fw, bf16_random(OC, 1.0f), N, IC, OC, 1);
    case_end("matmul_fp8_forward_bias_fast_accum");
    matmul_fp8_backward_dinp(&ctx, bf16_uninit((size_t)N * IC), fp8_operand(dy, FP8_E5M2, &st[2].scale_inv),
                             fp8_operand(w_t, FP8_E4M3, &st[1].scale_inv), N, IC, OC);
    case_end("matmul_fp8_backward_dinp_e5m2");
    __nv_bfloat16* dweight = bf16_random((size_t)OC * IC, 0.1f);
    matmul_fp8_backward_dweight(&ctx, dweight, fp8_operand(dy_t, FP8_E5M2, &st[2].scale_inv),
                                fp8_operand(x_t, FP8_E4M3, &st[0].scale_inv), N, IC, OC, 1);
    case_end("matmul_fp8_backward_dweight_accumulate");
    dev_free_all();
    matmul_context_destroy(&ctx);
}

typedef struct {
    const char* name;
    void (*run)(const Options*);
    const char* what;
} Family;

static const Family FAMILIES[] = {
    {"layers", family_layers, "encoder, LayerNorm, GELU, cross-entropy, AdamW, global norm, weight init"},
    {"matmul", family_matmul, "matmul.cuh's forward and backward paths under each fusion, column sums, qkv bias"},
    {"model", family_model, "gpt_model.cuh's training step (every --recompute mode, chunked LM head) and AdamW"},
    {"generate", family_generate, "prefill, cached decode steps, sampling (gpt_decode.cuh, gpt_generate.cuh)"},
    {"decode", family_decode, "the decoding attention (splits, GQA, several tokens) and the KV-cache append"},
    {"naive", family_naive, "naive and naive-recompute attention, forward and backward"},
    {"flash1", family_flash1, "flash1 attention, forward and backward"},
    {"fp8", family_fp8, "FP8 casts (plain, transposed, amax), scale updates and the FP8 GEMMs of a linear layer"},
    {"flash2", family_flash2, "flash2 attention, forward and backward (deterministic, dq column sums)"},
};
#define NUM_FAMILIES ((int)(sizeof(FAMILIES) / sizeof(FAMILIES[0])))

static int usage(void) {
    fprintf(stderr, "usage: sanitize_kernels FAMILY [--seq-lens 17,301] [--forward-only]\n"
                    "       sanitize_kernels --families | --check\nfamilies:");
    for (int i = 0; i < NUM_FAMILIES; i++) fprintf(stderr, " %s", FAMILIES[i].name);
    fprintf(stderr, "\n");
    return 2;
}

// "17,301" into o->seq_lens; 0 on success.
static int parse_seq_lens(const char* list, Options* o) {
    o->num_seq_lens = 0;
    for (const char* p = list; *p;) {
        char* end;
        const long T = strtol(p, &end, 10);
        if (end == p || T < 1 || T > 4096 || o->num_seq_lens == 8 || (*end && *end != ',')) return -1;
        o->seq_lens[o->num_seq_lens++] = (int)T;
        p = *end == ',' ? end + 1 : end;
    }
    return o->num_seq_lens > 0 ? 0 : -1;
}

// The family to run (NULL after printing why not), options filled.
static const Family* parse_args(int argc, char** argv, Options* o) {
    memset(o, 0, sizeof(*o));
    o->seq_lens[0] = 17, o->seq_lens[1] = 301, o->num_seq_lens = 2;
    const Family* family = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--forward-only") == 0) {
            o->forward_only = 1;
        } else if (strcmp(argv[i], "--seq-lens") == 0 && i + 1 < argc) {
            if (parse_seq_lens(argv[++i], o) != 0) {
                fprintf(stderr, "sanitize_kernels: --seq-lens wants lengths like 17,301, got \"%s\"\n", argv[i]);
                return NULL;
            }
        } else if (!family) {
            for (int f = 0; f < NUM_FAMILIES; f++)
                if (strcmp(argv[i], FAMILIES[f].name) == 0) family = &FAMILIES[f];
            if (!family) {
                fprintf(stderr, "sanitize_kernels: unknown family \"%s\"\n", argv[i]);
                return NULL;
            }
        } else {
            return NULL;
        }
    }
    return family;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // one line at a time, in order with the sanitizer's reports
    if (argc == 2 && strcmp(argv[1], "--families") == 0) {
        for (int f = 0; f < NUM_FAMILIES; f++) printf("%-9s %s\n", FAMILIES[f].name, FAMILIES[f].what);
        return 0;
    }
    const int check = argc == 2 && strcmp(argv[1], "--check") == 0;
    Options o;
    const Family* family = check ? NULL : parse_args(argc, argv, &o);
    if (!family && !check) return usage();
    const GpuInfo gpu = gpu_info(0);
    g_gemm_stores_by_tma = gpu.major >= 9;
    if (!gpu.found || gpu.major < 8) {
        printf("sanitize_kernels %s: %s; nothing to run\n", check ? "--check" : family->name,
               gpu.found ? "the kernels need compute capability 8.0 or newer (bf16)" : "no CUDA GPU found");
        return check ? 1 : 0;
    }
    if (check) {
        printf("device: %s, sm_%d%d, %d SMs\n", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
        return 0;
    }
    g_family = family->name;
    printf("family %s: %s\n", family->name, family->what);
    printf("device: %s, sm_%d%d, %d SMs; attention sequence lengths", gpu.name, gpu.major, gpu.minor, gpu.num_sms);
    for (int i = 0; i < o.num_seq_lens; i++) printf("%s%d", i ? "," : " ", o.seq_lens[i]);
    printf("%s\n", o.forward_only ? ", forward only" : "");
    CUDA_CHECK(cudaStreamCreate(&g_stream));  // blocking, as train_gpt's: ordered with the legacy stream
    // An exit from inside the code under test still lists what ran; registered after the runtime's own
    // teardown (CUDA is initialized by now), so it runs before it.
    atexit(report_launches);
    family->run(&o);
    CUDA_CHECK(cudaStreamDestroy(g_stream));
    g_finished = 1;
    report_launches();
    return 0;
}
