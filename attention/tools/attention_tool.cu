// attention_tool.cu: runs one attention backend's forward and backward on one shape, with bf16
// inputs read from raw files and every output written to raw files, so that an external reference
// (scripts/check_attention.py, PyTorch in fp64) can check any backend on any shape.
//
// Files (raw little-endian, row-major, no header):
//   inputs   DIR/q.bin, dout.bin                 bf16 (B, T, NH, HD)
//            DIR/k.bin, v.bin                    bf16 (B, T, NKV, HD)   (--kv-heads NKV, default NH)
//   outputs  DIR/out.bin                         bf16 (B, T, NH, HD)
//            DIR/lse.bin                         fp32 (B, NH, T)   natural log of Σ_j exp(S[i, j])
//            DIR/dq.bin                          bf16 (B, T, NH, HD)
//            DIR/dk.bin, dv.bin                  bf16 (B, T, NKV, HD)
// On the GPU, --layout packed places q, k, v in one activation qkv (B, T, NH + 2·NKV, HD) and the
// gradients in one dqkv of the same shape, as the trainer does (strided pointers, stride
// (NH + 2·NKV)·HD); --layout plain uses separate tensors (strides NH·HD and NKV·HD). out is
// (B, T, NH, HD) in both.
// Every output, `saved` and `workspace` are filled with NaN before the run, so an element a backend
// never writes (or scratch it reads before writing) shows up as NaN in the files.
#include <cublas_v2.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/attention.h"
#include "attention/common/cuda_check.h"

// ---------------------------------------------------------------------------------------------
// Options

typedef enum { LAYOUT_PACKED = 0, LAYOUT_PLAIN = 1 } Layout;

typedef struct {
    const char* backend_name;
    AttentionBackend backend;
    int B, T, NH, HD;
    int NKV;  // key/value heads; 0 until parsed: NH
    int causal;
    Layout layout;
    const char* in_dir;
    const char* out_dir;
} ToolOptions;

static void print_usage(FILE* out) {
    fprintf(out,
            "usage: build/attention_tool --backend NAME --batch B --seq-len T --heads NH --head-dim HD\n"
            "                            --in DIR --out DIR [--kv-heads NKV] [--causal | --no-causal]\n"
            "                            [--layout packed|plain]\n"
            "\n"
            "Runs one attention backend's forward and then its backward on bf16 inputs read from files\n"
            "and writes every output to files, for checking against an external reference\n"
            "(scripts/check_attention.py). Softmax scale 1/sqrt(HD); see attention/attention.h.\n"
            "\n"
            "options\n"
            "      --backend NAME     naive | flash1 | flash2 | naive-recompute\n"
            "      --batch B          batch size\n"
            "      --seq-len T        sequence length\n"
            "      --heads NH         number of (query) heads\n"
            "      --kv-heads NKV     number of key/value heads, a divisor of NH (default NH: multi-head;\n"
            "                         1: multi-query; else grouped-query, NH/NKV query heads per K/V head)\n"
            "      --head-dim HD      head dimension\n"
            "      --causal           mask key j > query i (the default)\n"
            "      --no-causal        full attention\n"
            "      --layout L         how the inputs sit in GPU memory (default packed):\n"
            "                           packed: q, k, v inside one (B, T, NH + 2*NKV, HD) buffer and dq, dk,\n"
            "                                   dv inside another, row stride (NH + 2*NKV)*HD, as in the trainer\n"
            "                           plain:  separate tensors, q (B, T, NH, HD) at stride NH*HD and k, v\n"
            "                                   (B, T, NKV, HD) at NKV*HD\n"
            "                         The files are the same in both layouts.\n"
            "      --in DIR           folder with the inputs\n"
            "      --out DIR          folder for the outputs (made if missing; files are replaced)\n"
            "  -h, --help             show this help\n"
            "\n"
            "files: raw little-endian values, row-major, no header\n"
            "  DIR_in/q.bin, dout.bin                bf16 (B, T, NH, HD): element (b, t, h, d) at index\n"
            "                                        ((b*T + t)*NH + h)*HD + d; B*T*NH*HD*2 bytes each\n"
            "  DIR_in/k.bin, v.bin                   bf16 (B, T, NKV, HD), the same with NKV heads\n"
            "  DIR_out/out.bin                       bf16 (B, T, NH, HD), the attention output\n"
            "  DIR_out/lse.bin                       fp32 (B, NH, T): element (b, h, t) at index (b*NH + h)*T + t,\n"
            "                                        log-sum-exp (natural log) of the scaled scores of row t\n"
            "  DIR_out/dq.bin                        bf16 (B, T, NH, HD), the gradient of q for dout\n"
            "  DIR_out/dk.bin, dv.bin                bf16 (B, T, NKV, HD), the gradients of k and v (summed\n"
            "                                        over each K/V head's query heads)\n"
            "Outputs are written to NAME.tmp and renamed, so a file is never half written. Outputs and the\n"
            "backend's scratch memory are filled with NaN before the run: an element never written is NaN.\n"
            "\n"
            "exit status: 0 done; 1 the backend rejects the shape, an input file has the wrong size, or a\n"
            "CUDA error; 2 bad command line\n");
}

static void usage_error(const char* fmt, const char* arg) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n");
    print_usage(stderr);
    exit(2);
}

// Parses a whole decimal integer in [min, max]; exits 2 with a message naming the flag otherwise.
static int parse_int(const char* flag, const char* text, long min, long max) {
    char* end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
        fprintf(stderr, "error: %s expects a whole number in [%ld, %ld], got \"%s\"\n\n", flag, min, max, text);
        print_usage(stderr);
        exit(2);
    }
    return (int)value;
}

static ToolOptions parse_options(int argc, char** argv) {
    ToolOptions opt = {NULL, ATTN_FLASH2, 0, 0, 0, 0, 0, 1, LAYOUT_PACKED, NULL, NULL};
    enum { OPT_BACKEND = 1000, OPT_BATCH, OPT_SEQ, OPT_HEADS, OPT_HD, OPT_CAUSAL, OPT_NO_CAUSAL, OPT_LAYOUT,
           OPT_IN, OPT_OUT, OPT_KV_HEADS };
    static const struct option long_options[] = {
        {"backend", required_argument, 0, OPT_BACKEND}, {"batch", required_argument, 0, OPT_BATCH},
        {"seq-len", required_argument, 0, OPT_SEQ},     {"heads", required_argument, 0, OPT_HEADS},
        {"head-dim", required_argument, 0, OPT_HD},     {"causal", no_argument, 0, OPT_CAUSAL},
        {"no-causal", no_argument, 0, OPT_NO_CAUSAL},   {"layout", required_argument, 0, OPT_LAYOUT},
        {"in", required_argument, 0, OPT_IN},           {"out", required_argument, 0, OPT_OUT},
        {"kv-heads", required_argument, 0, OPT_KV_HEADS}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        switch (c) {
            case OPT_BACKEND:
                opt.backend_name = optarg;
                if (attention_backend_from_name(optarg, &opt.backend) != 0)
                    usage_error("--backend expects naive, flash1, flash2 or naive-recompute, got \"%s\"", optarg);
                break;
            case OPT_BATCH: opt.B = parse_int("--batch", optarg, 1, 1L << 20); break;
            case OPT_SEQ: opt.T = parse_int("--seq-len", optarg, 1, 1L << 24); break;
            case OPT_HEADS: opt.NH = parse_int("--heads", optarg, 1, 1L << 16); break;
            case OPT_HD: opt.HD = parse_int("--head-dim", optarg, 1, 1L << 16); break;
            case OPT_KV_HEADS: opt.NKV = parse_int("--kv-heads", optarg, 1, 1L << 16); break;
            case OPT_CAUSAL: opt.causal = 1; break;
            case OPT_NO_CAUSAL: opt.causal = 0; break;
            case OPT_LAYOUT:
                if (strcmp(optarg, "packed") == 0) opt.layout = LAYOUT_PACKED;
                else if (strcmp(optarg, "plain") == 0) opt.layout = LAYOUT_PLAIN;
                else usage_error("--layout expects packed or plain, got \"%s\"", optarg);
                break;
            case OPT_IN: opt.in_dir = optarg; break;
            case OPT_OUT: opt.out_dir = optarg; break;
            case 'h': print_usage(stdout); exit(0);
            default: fprintf(stderr, "run build/attention_tool --help for the options\n"); exit(2);
        }
    }
    if (optind < argc) usage_error("unexpected argument \"%s\"", argv[optind]);
    if (!opt.backend_name) usage_error("%s is required", "--backend");
    if (!opt.B) usage_error("%s is required", "--batch");
    if (!opt.T) usage_error("%s is required", "--seq-len");
    if (!opt.NH) usage_error("%s is required", "--heads");
    if (!opt.HD) usage_error("%s is required", "--head-dim");
    if (!opt.in_dir) usage_error("%s is required", "--in");
    if (!opt.out_dir) usage_error("%s is required", "--out");
    if (!opt.NKV) opt.NKV = opt.NH;
    return opt;
}

// ---------------------------------------------------------------------------------------------
// Files

static void path_join(char* path, size_t size, const char* dir, const char* name) {
    int n = snprintf(path, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size) {
        fprintf(stderr, "error: path %s/%s is too long\n", dir, name);
        exit(1);
    }
}

// Reads exactly `bytes` bytes from DIR/name into `dst`; exits 1 naming the file otherwise.
static void read_input(const char* dir, const char* name, void* dst, size_t bytes, int heads, const ToolOptions* opt) {
    char path[4096];
    path_join(path, sizeof(path), dir, name);
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "error: cannot open input %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if ((size_t)st.st_size != bytes) {
        fprintf(stderr,
                "error: input %s has %lld bytes, expected %zu (bf16 (B, T, %s, HD) = (%d, %d, %d, %d)); "
                "check --batch --seq-len --heads --kv-heads --head-dim against the file\n",
                path, (long long)st.st_size, bytes, heads == opt->NH ? "NH" : "NKV", opt->B, opt->T, heads, opt->HD);
        exit(1);
    }
    FILE* f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open input %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (fread(dst, 1, bytes, f) != bytes) {
        fprintf(stderr, "error: could not read %zu bytes from %s\n", bytes, path);
        exit(1);
    }
    fclose(f);
}

// Writes `bytes` bytes to DIR/name.tmp, then renames it to DIR/name; exits 1 naming the file on error.
static void write_output(const char* dir, const char* name, const void* src, size_t bytes) {
    char path[4096], tmp[4096];
    path_join(path, sizeof(path), dir, name);
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        fprintf(stderr, "error: path %s.tmp is too long\n", path);
        exit(1);
    }
    FILE* f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "error: cannot create %s: %s\n", tmp, strerror(errno));
        exit(1);
    }
    if (fwrite(src, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "error: could not write %zu bytes to %s (disk full?)\n", bytes, tmp);
        remove(tmp);
        exit(1);
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "error: cannot rename %s to %s: %s\n", tmp, path, strerror(errno));
        remove(tmp);
        exit(1);
    }
}

static void make_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            fprintf(stderr, "error: --out %s exists and is not a folder\n", dir);
            exit(1);
        }
        return;
    }
    if (mkdir(dir, 0777) != 0) {
        fprintf(stderr, "error: cannot make the output folder %s: %s (does its parent exist?)\n", dir,
                strerror(errno));
        exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// GPU memory

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// cudaMalloc that names the buffer and the flags to change when the GPU is out of memory.
// Returns NULL for 0 bytes.
static void* device_alloc(const char* what, size_t bytes, const ToolOptions* opt) {
    if (bytes == 0) return NULL;
    void* ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fprintf(stderr,
                "error: out of GPU memory allocating %s (%.2f GiB; %.2f GiB free of %.2f GiB) for backend %s, "
                "B=%d T=%d NH=%d HD=%d; lower --batch or --seq-len%s\n",
                what, gib((double)bytes), gib((double)free_bytes), gib((double)total_bytes), opt->backend_name,
                opt->B, opt->T, opt->NH, opt->HD,
                opt->backend == ATTN_NAIVE ? ", or use --backend flash1 or flash2 (naive keeps (B, NH, T, T) scores)" : "");
        exit(1);
    }
    ATTN_CUDA_CHECK(err);
    // 0xFF bytes are NaN both as bf16 (0xFFFF) and as fp32 (0xFFFFFFFF): poison everything we allocate.
    ATTN_CUDA_CHECK(cudaMemset(ptr, 0xFF, bytes));
    return ptr;
}

// Copies `rows` rows of `row_elems` bf16 values between buffers whose rows are `dst_stride` and
// `src_stride` elements apart (a strided view of the packed buffer, or a plain tensor).
static void copy_rows(void* dst, long dst_stride, const void* src, long src_stride, size_t rows, size_t row_elems,
                      cudaMemcpyKind kind) {
    const size_t e = sizeof(__nv_bfloat16);
    ATTN_CUDA_CHECK(cudaMemcpy2D(dst, (size_t)dst_stride * e, src, (size_t)src_stride * e, row_elems * e, rows, kind));
}

// ---------------------------------------------------------------------------------------------
// One run

// The sizes of one run: (b, t) rows, values per row of q (NH·HD) and of k or v (NKV·HD), and bytes.
typedef struct {
    size_t rows;          // (b, t) pairs
    size_t row_elems;     // one token's (NH, HD) values
    size_t kv_elems;      // one token's (NKV, HD) values of k or v
    size_t tensor_bytes;  // (B, T, NH, HD) bf16
    size_t kv_bytes;      // (B, T, NKV, HD) bf16
    size_t lse_bytes;     // (B, NH, T) fp32
} ToolSizes;

static ToolSizes tool_sizes(const ToolOptions* opt) {
    ToolSizes z;
    z.rows = (size_t)opt->B * opt->T;
    z.row_elems = (size_t)opt->NH * opt->HD;
    z.kv_elems = (size_t)opt->NKV * opt->HD;
    z.tensor_bytes = z.rows * z.row_elems * sizeof(__nv_bfloat16);
    z.kv_bytes = z.rows * z.kv_elems * sizeof(__nv_bfloat16);
    z.lse_bytes = (size_t)opt->B * opt->NH * opt->T * sizeof(float);
    return z;
}

// The shape of the options; exits 1 with the backend's reason when it cannot run it.
static AttentionShape checked_shape(const ToolOptions* opt) {
    AttentionShape shape;
    memset(&shape, 0, sizeof(shape));
    shape.B = opt->B, shape.T = opt->T, shape.NH = opt->NH, shape.NKV = opt->NKV, shape.HD = opt->HD;
    shape.causal = opt->causal;
    char why[512];
    if (attention_check(opt->backend, &shape, why, sizeof(why)) != 0) {
        fprintf(stderr, "error: %s\n", why);
        exit(1);
    }
    return shape;
}

static const char* INPUT_NAMES[4] = {"q.bin", "k.bin", "v.bin", "dout.bin"};

// q, k, v and dout from the input folder into host memory (host_in[i] for INPUT_NAMES[i]).
static void read_inputs(const ToolOptions* opt, const ToolSizes* z, void* host_in[4]) {
    const int input_heads[4] = {opt->NH, opt->NKV, opt->NKV, opt->NH};
    for (int i = 0; i < 4; i++) {
        const size_t bytes = input_heads[i] == opt->NH ? z->tensor_bytes : z->kv_bytes;
        host_in[i] = malloc(bytes);
        if (!host_in[i]) {
            fprintf(stderr, "error: out of host memory reading %s (%zu bytes)\n", INPUT_NAMES[i], bytes);
            exit(1);
        }
        read_input(opt->in_dir, INPUT_NAMES[i], host_in[i], bytes, input_heads[i], opt);
    }
}

// GPU 0's properties; exits 1 when there is no GPU.
static cudaDeviceProp require_gpu(void) {
    int device_count = 0;
    cudaDeviceProp gpu;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0 ||
        cudaGetDeviceProperties(&gpu, 0) != cudaSuccess) {
        fprintf(stderr, "error: no CUDA GPU found; attention_tool needs one (check nvidia-smi)\n");
        exit(1);
    }
    return gpu;
}

// The run's device memory. packed: q, k, v inside one qkv and dq, dk, dv inside one dqkv, both
// (B, T, NH + 2·NKV, HD); plain: q, dq (B, T, NH, HD) and k, v, dk, dv (B, T, NKV, HD).
typedef struct {
    __nv_bfloat16 *q, *k, *v, *dq, *dk, *dv, *out, *dout;
    float* lse;
    void *saved, *workspace;
    size_t saved_bytes, workspace_bytes;
    long plain_stride, plain_kv_stride;  // NH·HD, NKV·HD: the files' row strides (and out's)
    long qkv_stride, kv_stride;          // the row strides of q, dq and of k, v, dk, dv on the GPU
} ToolBuffers;

static ToolBuffers alloc_buffers(const ToolOptions* opt, const AttentionShape* shape, const ToolSizes* z) {
    ToolBuffers d;
    d.plain_stride = (long)z->row_elems, d.plain_kv_stride = (long)z->kv_elems;
    const long packed_stride = (long)(z->row_elems + 2 * z->kv_elems);
    d.qkv_stride = opt->layout == LAYOUT_PACKED ? packed_stride : d.plain_stride;
    d.kv_stride = opt->layout == LAYOUT_PACKED ? packed_stride : d.plain_kv_stride;
    if (opt->layout == LAYOUT_PACKED) {
        const size_t packed_bytes = z->tensor_bytes + 2 * z->kv_bytes;
        __nv_bfloat16* qkv = (__nv_bfloat16*)device_alloc("qkv (B, T, NH + 2*NKV, HD)", packed_bytes, opt);
        __nv_bfloat16* dqkv = (__nv_bfloat16*)device_alloc("dqkv (B, T, NH + 2*NKV, HD)", packed_bytes, opt);
        d.q = qkv, d.k = qkv + z->row_elems, d.v = qkv + z->row_elems + z->kv_elems;
        d.dq = dqkv, d.dk = dqkv + z->row_elems, d.dv = dqkv + z->row_elems + z->kv_elems;
    } else {
        d.q = (__nv_bfloat16*)device_alloc("q", z->tensor_bytes, opt);
        d.k = (__nv_bfloat16*)device_alloc("k", z->kv_bytes, opt);
        d.v = (__nv_bfloat16*)device_alloc("v", z->kv_bytes, opt);
        d.dq = (__nv_bfloat16*)device_alloc("dq", z->tensor_bytes, opt);
        d.dk = (__nv_bfloat16*)device_alloc("dk", z->kv_bytes, opt);
        d.dv = (__nv_bfloat16*)device_alloc("dv", z->kv_bytes, opt);
    }
    d.out = (__nv_bfloat16*)device_alloc("out", z->tensor_bytes, opt);
    d.dout = (__nv_bfloat16*)device_alloc("dout", z->tensor_bytes, opt);
    d.lse = (float*)device_alloc("lse", z->lse_bytes, opt);
    d.saved_bytes = attention_saved_bytes(opt->backend, shape);
    d.workspace_bytes = attention_workspace_bytes(opt->backend, shape);
    d.saved = device_alloc("the backend's saved memory", d.saved_bytes, opt);
    d.workspace = device_alloc("the backend's workspace", d.workspace_bytes, opt);
    return d;
}

static void free_buffers(const ToolOptions* opt, ToolBuffers* d) {
    if (opt->layout == LAYOUT_PACKED) {
        ATTN_CUDA_CHECK(cudaFree(d->q));
        ATTN_CUDA_CHECK(cudaFree(d->dq));
    } else {
        __nv_bfloat16* bufs[6] = {d->q, d->k, d->v, d->dq, d->dk, d->dv};
        for (int i = 0; i < 6; i++) ATTN_CUDA_CHECK(cudaFree(bufs[i]));
    }
    ATTN_CUDA_CHECK(cudaFree(d->out));
    ATTN_CUDA_CHECK(cudaFree(d->dout));
    ATTN_CUDA_CHECK(cudaFree(d->lse));
    if (d->saved) ATTN_CUDA_CHECK(cudaFree(d->saved));
    if (d->workspace) ATTN_CUDA_CHECK(cudaFree(d->workspace));
}

// The inputs from host memory (as in the files) to their places on the GPU.
static void upload_inputs(const ToolBuffers* d, const ToolSizes* z, void* const host_in[4]) {
    copy_rows(d->q, d->qkv_stride, host_in[0], d->plain_stride, z->rows, z->row_elems, cudaMemcpyHostToDevice);
    copy_rows(d->k, d->kv_stride, host_in[1], d->plain_kv_stride, z->rows, z->kv_elems, cudaMemcpyHostToDevice);
    copy_rows(d->v, d->kv_stride, host_in[2], d->plain_kv_stride, z->rows, z->kv_elems, cudaMemcpyHostToDevice);
    copy_rows(d->dout, d->plain_stride, host_in[3], d->plain_stride, z->rows, z->row_elems, cudaMemcpyHostToDevice);
}

static AttentionArgs make_args(const AttentionShape* shape, const ToolBuffers* d) {
    AttentionArgs args;
    memset(&args, 0, sizeof(args));
    args.shape = *shape;
    args.q = d->q, args.k = d->k, args.v = d->v, args.qkv_stride = d->qkv_stride, args.kv_stride = d->kv_stride;
    args.out = d->out, args.out_stride = d->plain_stride, args.lse = d->lse;
    args.dout = d->dout;
    args.dq = d->dq, args.dk = d->dk, args.dv = d->dv, args.dqkv_stride = d->qkv_stride, args.dkv_stride = d->kv_stride;
    args.saved = d->saved, args.workspace = d->workspace;
    return args;
}

// One cold run of each pass (the first launch included), timed: the times are a sanity check, not a
// benchmark; scripts/bench_attention.py measures speed.
static void run_passes(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                       cudaStream_t stream, float* fwd_ms, float* bwd_ms) {
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) ATTN_CUDA_CHECK(cudaEventCreate(&ev[i]));
    ATTN_CUDA_CHECK(cudaEventRecord(ev[0], stream));
    attention_forward(backend, ctx, args, stream);
    ATTN_CUDA_CHECK(cudaGetLastError());
    ATTN_CUDA_CHECK(cudaEventRecord(ev[1], stream));
    attention_backward(backend, ctx, args, stream);
    ATTN_CUDA_CHECK(cudaGetLastError());
    ATTN_CUDA_CHECK(cudaEventRecord(ev[2], stream));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
    *fwd_ms = *bwd_ms = 0.0f;
    ATTN_CUDA_CHECK(cudaEventElapsedTime(fwd_ms, ev[0], ev[1]));
    ATTN_CUDA_CHECK(cudaEventElapsedTime(bwd_ms, ev[1], ev[2]));
    for (int i = 0; i < 3; i++) ATTN_CUDA_CHECK(cudaEventDestroy(ev[i]));
}

// The outputs back to the host as (B, T, NH, HD) / (B, NH, T) and out to the files.
static void write_outputs(const ToolOptions* opt, const ToolBuffers* d, const ToolSizes* z) {
    void* host_out = malloc(z->tensor_bytes > z->lse_bytes ? z->tensor_bytes : z->lse_bytes);
    if (!host_out) {
        fprintf(stderr, "error: out of host memory for the outputs (%zu bytes)\n", z->tensor_bytes);
        exit(1);
    }
    const struct { const char* name; const __nv_bfloat16* ptr; long stride; size_t elems; } tensors[4] = {
        {"out.bin", d->out, d->plain_stride, z->row_elems}, {"dq.bin", d->dq, d->qkv_stride, z->row_elems},
        {"dk.bin", d->dk, d->kv_stride, z->kv_elems}, {"dv.bin", d->dv, d->kv_stride, z->kv_elems}};
    for (int i = 0; i < 4; i++) {
        copy_rows(host_out, (long)tensors[i].elems, tensors[i].ptr, tensors[i].stride, z->rows, tensors[i].elems,
                  cudaMemcpyDeviceToHost);
        write_output(opt->out_dir, tensors[i].name, host_out, z->rows * tensors[i].elems * sizeof(__nv_bfloat16));
    }
    ATTN_CUDA_CHECK(cudaMemcpy(host_out, d->lse, z->lse_bytes, cudaMemcpyDeviceToHost));
    write_output(opt->out_dir, "lse.bin", host_out, z->lse_bytes);
    free(host_out);
}

// ---------------------------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    ToolOptions opt = parse_options(argc, argv);
    const AttentionShape shape = checked_shape(&opt);
    const ToolSizes z = tool_sizes(&opt);

    // Inputs first: a wrong file is reported before any GPU work.
    void* host_in[4];
    read_inputs(&opt, &z, host_in);
    make_dir(opt.out_dir);
    const cudaDeviceProp gpu = require_gpu();

    ToolBuffers d = alloc_buffers(&opt, &shape, &z);
    upload_inputs(&d, &z, host_in);
    cudaStream_t stream;
    ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t cublas;
    ATTN_CUBLAS_CHECK(cublasCreate(&cublas));
    ATTN_CUBLAS_CHECK(cublasSetStream(cublas, stream));
    AttentionContext ctx = {cublas};
    const AttentionArgs args = make_args(&shape, &d);

    float fwd_ms, bwd_ms;
    run_passes(opt.backend, &ctx, &args, stream, &fwd_ms, &bwd_ms);
    write_outputs(&opt, &d, &z);
    printf("attention_tool: %s B=%d T=%d NH=%d NKV=%d HD=%d %s layout=%s on %s: forward %.3f ms, backward %.3f ms "
           "(one cold run each), saved %.1f MiB, workspace %.1f MiB -> %s/{out,lse,dq,dk,dv}.bin\n",
           opt.backend_name, opt.B, opt.T, opt.NH, opt.NKV, opt.HD, opt.causal ? "causal" : "non-causal",
           opt.layout == LAYOUT_PACKED ? "packed" : "plain", gpu.name, fwd_ms, bwd_ms,
           d.saved_bytes / (1024.0 * 1024.0), d.workspace_bytes / (1024.0 * 1024.0), opt.out_dir);

    ATTN_CUBLAS_CHECK(cublasDestroy(cublas));
    ATTN_CUDA_CHECK(cudaStreamDestroy(stream));
    free_buffers(&opt, &d);
    for (int i = 0; i < 4; i++) free(host_in[i]);
    return 0;
}
