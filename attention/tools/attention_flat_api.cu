// attention_flat_api.cu: the attention interface (attention.h) as extern "C" functions that take only
// plain arguments (a backend name, ints, longs and raw pointers), so Python can call the backends
// through ctypes without mirroring any struct. Built into build/libattention.so; used by
// scripts/bench_attention.py.
//
// Tensors and strides follow attention.h exactly (strides count bf16 elements, not bytes):
//   q            bf16 (B, T, NH, HD), row (b, t) at ptr + (b*T + t)*qkv_stride
//   k, v         bf16 (B, T, NKV, HD), row (b, t) at ptr + (b*T + t)*kv_stride (NKV key/value heads,
//                NH % NKV == 0; NKV = NH is multi-head); packed QKV (B, T, NH + 2*NKV, HD):
//                k = q + NH*HD, v = q + (NH + NKV)*HD, qkv_stride = kv_stride = (NH + 2*NKV)*HD
//   out, dout    bf16 (B, T, NH, HD), row stride out_stride
//   lse          fp32 (B, NH, T), contiguous
//   dq           bf16 like q at dqkv_stride; dk, dv like k, v at dkv_stride (packed dQKV like q, k, v)
//   saved        attention_flat_saved_bytes bytes, kept from a forward to its backward
//   workspace    attention_flat_workspace_bytes bytes of scratch for one call
//   stream       a cudaStream_t (NULL: the legacy default stream)
// Every function returns 0 (or a byte count) on success and -1 on a bad backend name or a shape
// the backend rejects; attention_flat_last_error() then says why (per thread). CUDA and cuBLAS
// errors inside a backend exit the process with a message, as everywhere in this project.
#include <cublas_v2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"

#define MAX_DEVICES 64

static thread_local char g_last_error[1024];

// cuBLAS handles for the naive backend, made on first use, one per device, never destroyed.
static pthread_mutex_t g_cublas_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t g_cublas[MAX_DEVICES];

static int fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
    va_end(ap);
    return -1;
}

// Parses the name and checks the shape; 0 on success, -1 with g_last_error set.
static int resolve(const char* name, int B, int T, int NH, int NKV, int HD, int causal, AttentionBackend* backend,
                   AttentionShape* shape) {
    if (!name || attention_backend_from_name(name, backend) != 0)
        return fail("unknown attention backend \"%s\"; expected naive, flash1, flash2 or naive-recompute", name ? name : "(null)");
    shape->B = B, shape->T = T, shape->NH = NH, shape->NKV = NKV, shape->HD = HD, shape->causal = causal ? 1 : 0;
    char why[512];
    if (attention_check(*backend, shape, why, sizeof(why)) != 0) return fail("%s", why);
    return 0;
}

// The context for the current device: its cuBLAS handle (naive backend only).
static int context_for(AttentionBackend backend, cudaStream_t stream, AttentionContext* ctx) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fail("cudaGetDevice failed: %s; is a GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES)?",
                    cudaGetErrorString(err));
    }
    if (device < 0 || device >= MAX_DEVICES)
        return fail("device %d is beyond the %d this library handles", device, MAX_DEVICES);
    pthread_mutex_lock(&g_cublas_lock);
    if (attention_uses_cublas(backend) && g_cublas[device] == NULL) {
        cublasStatus_t status = cublasCreate(&g_cublas[device]);
        if (status != CUBLAS_STATUS_SUCCESS) {
            g_cublas[device] = NULL;
            pthread_mutex_unlock(&g_cublas_lock);
            return fail("cublasCreate failed on device %d: %s; check that the GPU has free memory", device,
                        cublasGetStatusString(status));
        }
    }
    ctx->cublas = attention_uses_cublas(backend) ? g_cublas[device] : NULL;
    pthread_mutex_unlock(&g_cublas_lock);
    if (ctx->cublas) {
        cublasStatus_t status = cublasSetStream(ctx->cublas, stream);
        if (status != CUBLAS_STATUS_SUCCESS)
            return fail("cublasSetStream failed: %s", cublasGetStatusString(status));
    }
    return 0;
}

extern "C" {

// The message of the last call on this thread that returned -1 ("" when none has).
const char* attention_flat_last_error(void) { return g_last_error; }

// Bytes of `saved` the backend needs for the shape (0 when none); -1 on error.
long attention_flat_saved_bytes(const char* backend, int B, int T, int NH, int NKV, int HD, int causal) {
    AttentionBackend b;
    AttentionShape s;
    if (resolve(backend, B, T, NH, NKV, HD, causal, &b, &s) != 0) return -1;
    return (long)attention_saved_bytes(b, &s);
}

// Bytes of `workspace` the backend needs for the shape (0 when none); -1 on error.
long attention_flat_workspace_bytes(const char* backend, int B, int T, int NH, int NKV, int HD, int causal) {
    AttentionBackend b;
    AttentionShape s;
    if (resolve(backend, B, T, NH, NKV, HD, causal, &b, &s) != 0) return -1;
    return (long)attention_workspace_bytes(b, &s);
}

// Enqueues the forward pass on `stream`: out (B, T, NH, HD) and lse (B, NH, T). 0 on success.
int attention_flat_forward(const char* backend, int B, int T, int NH, int NKV, int HD, int causal, const void* q,
                           const void* k, const void* v, long qkv_stride, long kv_stride, void* out, long out_stride,
                           void* lse, void* saved, void* workspace, void* stream) {
    AttentionBackend b;
    AttentionArgs args;
    AttentionContext ctx;
    memset(&args, 0, sizeof(args));
    if (resolve(backend, B, T, NH, NKV, HD, causal, &b, &args.shape) != 0) return -1;
    if (context_for(b, (cudaStream_t)stream, &ctx) != 0) return -1;
    args.q = (const __nv_bfloat16*)q, args.k = (const __nv_bfloat16*)k, args.v = (const __nv_bfloat16*)v;
    args.qkv_stride = qkv_stride, args.kv_stride = kv_stride;
    args.out = (__nv_bfloat16*)out, args.out_stride = out_stride;
    args.lse = (float*)lse;
    args.saved = saved, args.workspace = workspace;
    attention_forward(b, &ctx, &args, (cudaStream_t)stream);
    return 0;
}

// Enqueues the backward pass on `stream`: dq, dk, dv (overwritten, not accumulated) from dout and
// the q, k, v, out, lse and saved that the forward of the same shape left. 0 on success.
int attention_flat_backward(const char* backend, int B, int T, int NH, int NKV, int HD, int causal, const void* q,
                            const void* k, const void* v, long qkv_stride, long kv_stride, const void* out,
                            long out_stride, const void* lse, const void* dout, void* dq, void* dk, void* dv,
                            long dqkv_stride, long dkv_stride, void* saved, void* workspace, void* stream) {
    AttentionBackend b;
    AttentionArgs args;
    AttentionContext ctx;
    memset(&args, 0, sizeof(args));
    if (resolve(backend, B, T, NH, NKV, HD, causal, &b, &args.shape) != 0) return -1;
    if (context_for(b, (cudaStream_t)stream, &ctx) != 0) return -1;
    args.q = (const __nv_bfloat16*)q, args.k = (const __nv_bfloat16*)k, args.v = (const __nv_bfloat16*)v;
    args.qkv_stride = qkv_stride, args.kv_stride = kv_stride;
    args.out = (__nv_bfloat16*)out, args.out_stride = out_stride;  // read only in the backward
    args.lse = (float*)lse;                                        // read only in the backward
    args.dout = (const __nv_bfloat16*)dout;
    args.dq = (__nv_bfloat16*)dq, args.dk = (__nv_bfloat16*)dk, args.dv = (__nv_bfloat16*)dv;
    args.dqkv_stride = dqkv_stride, args.dkv_stride = dkv_stride;
    args.saved = saved, args.workspace = workspace;
    attention_backward(b, &ctx, &args, (cudaStream_t)stream);
    return 0;
}

}  // extern "C"
