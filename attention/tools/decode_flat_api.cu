// decode_flat_api.cu: the decoding attention (decode.h) as extern "C" functions of plain
// arguments (ints, longs and raw pointers), so Python can call it through ctypes without mirroring a
// struct. Built into build/libdecode.so; used by scripts/bench_decode.py.
//
// Tensors (contiguous unless a stride is given; strides count bf16 elements):
//   q        bf16 (B, Tq, NH, HD), row (b, t) at q + (b*Tq + t)*q_stride
//   k, v     bf16 (B, Tmax, NKV, HD), the cache
//   lengths  int32 (B) on the GPU, keys in the cache per sequence (Tq <= lengths[b] <= max_length)
//   out      bf16 (B, Tq, NH, HD), row stride out_stride
//   lse      fp32 (B, NH, Tq), or NULL
//   workspace  decode_flat_workspace_bytes(...) bytes for the same shape and num_splits
// num_splits 0 lets the library choose (decode_flat_num_splits says what it picks). Every function
// returns 0 (or a count) on success and -1 on a shape it rejects; decode_flat_last_error() says why.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "attention/decode.h"

static thread_local char g_last_error[1024];

static int resolve(int B, int Tq, int NH, int NKV, int HD, int Tmax, int max_length, int num_splits,
                   DecodeShape* shape) {
    shape->B = B, shape->Tq = Tq, shape->NH = NH, shape->NKV = NKV, shape->HD = HD, shape->Tmax = Tmax;
    return decode_check(shape, max_length, num_splits, g_last_error, sizeof(g_last_error));
}

extern "C" {

const char* decode_flat_last_error(void) { return g_last_error; }

// The splits a call with num_splits = 0 runs with on the current GPU; -1 on a bad shape.
int decode_flat_num_splits(int B, int Tq, int NH, int NKV, int HD, int Tmax, int max_length) {
    DecodeShape s;
    if (resolve(B, Tq, NH, NKV, HD, Tmax, max_length, 0, &s) != 0) return -1;
    return decode_num_splits(&s, max_length);
}

// Workspace bytes for num_splits (0: the automatic choice); -1 on a bad shape.
long decode_flat_workspace_bytes(int B, int Tq, int NH, int NKV, int HD, int Tmax, int max_length, int num_splits) {
    DecodeShape s;
    if (resolve(B, Tq, NH, NKV, HD, Tmax, max_length, num_splits, &s) != 0) return -1;
    return (long)decode_workspace_bytes(&s, num_splits > 0 ? num_splits : decode_num_splits(&s, max_length));
}

// Enqueues the decode attention on `stream` (a cudaStream_t; NULL: the legacy default stream).
int decode_flat_forward(int B, int Tq, int NH, int NKV, int HD, int Tmax, int max_length, int num_splits,
                        const void* q, long q_stride, const void* k, const void* v, const int* lengths, void* out,
                        long out_stride, void* lse, void* workspace, void* stream) {
    DecodeArgs a;
    memset(&a, 0, sizeof(a));
    if (resolve(B, Tq, NH, NKV, HD, Tmax, max_length, num_splits, &a.shape) != 0) return -1;
    a.q = (const __nv_bfloat16*)q, a.q_stride = q_stride;
    a.k_cache = (const __nv_bfloat16*)k, a.v_cache = (const __nv_bfloat16*)v;
    a.lengths = lengths, a.max_length = max_length;
    a.out = (__nv_bfloat16*)out, a.out_stride = out_stride;
    a.lse = (float*)lse;
    a.num_splits = num_splits;
    a.workspace = workspace;
    if (decode_check_args(&a, g_last_error, sizeof(g_last_error)) != 0) return -1;
    decode_attention(&a, (cudaStream_t)stream);
    return 0;
}

}  // extern "C"
