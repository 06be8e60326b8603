// attention.cu: the dispatcher behind attention.h: names, shape checks, memory sizes, the forward
// and backward calls routed to the backend the user picked, and flash2's switches, the one place the
// library reads the environment.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/backends.h"

static const char* BACKEND_NAMES[] = {"naive", "flash1", "flash2", "naive-recompute"};

// FLASH2_MMA_SYNC and FLASH2_FORWARD_LONG_T (attention.h).
static AttentionFlash2Settings read_flash2_settings(void) {
    AttentionFlash2Settings settings;
    const char* force = getenv("FLASH2_MMA_SYNC");
    settings.mma_sync_forced = force && force[0] != '\0' && strcmp(force, "0") != 0;
    const char* long_t = getenv("FLASH2_FORWARD_LONG_T");
    settings.forward_long_t = long_t && long_t[0] ? atoi(long_t) : 0;
    if (settings.forward_long_t < 0) settings.forward_long_t = 0;
    return settings;
}

// The settings, read on the first call that needs them (once per process, also with several threads).
static const AttentionFlash2Settings* flash2_settings(void) {
    static const AttentionFlash2Settings settings = read_flash2_settings();
    return &settings;
}

AttentionFlash2Settings attention_flash2_settings(void) { return *flash2_settings(); }

int attention_flash2_uses_wgmma(void) { return flash2_use_wgmma(flash2_settings()); }

const char* attention_backend_name(AttentionBackend backend) {
    if ((int)backend < 0 || (int)backend >= NUM_ATTENTION_BACKENDS) return NULL;
    return BACKEND_NAMES[backend];
}

int attention_backend_from_name(const char* name, AttentionBackend* backend) {
    for (int i = 0; i < NUM_ATTENTION_BACKENDS; i++) {
        if (strcmp(name, BACKEND_NAMES[i]) == 0) {
            *backend = (AttentionBackend)i;
            return 0;
        }
    }
    return -1;
}

int attention_check(AttentionBackend backend, const AttentionShape* s, char* why, size_t why_size) {
    if (s->B < 1 || s->T < 1 || s->NH < 1 || s->HD < 1) {
        snprintf(why, why_size, "attention shape B=%d T=%d NH=%d HD=%d: every size must be at least 1", s->B,
                 s->T, s->NH, s->HD);
        return -1;
    }
    if (s->NKV < 1 || s->NKV > s->NH || s->NH % s->NKV != 0) {
        snprintf(why, why_size,
                 "attention shape NH=%d NKV=%d: the number of key/value heads NKV must divide the number of query "
                 "heads NH (NKV = NH for multi-head attention, 1 for multi-query); change --kv-heads",
                 s->NH, s->NKV);
        return -1;
    }
    switch (backend) {
        case ATTN_NAIVE:
        case ATTN_NAIVE_RECOMPUTE:
            if (s->HD % 8 != 0 || s->HD > 256) {
                snprintf(why, why_size,
                         "the naive backend supports head dims that are multiples of 8 up to 256, not %d; "
                         "change --heads so that hidden/heads is one",
                         s->HD);
                return -1;
            }
            return 0;
        case ATTN_FLASH2:
            if ((long)s->B * s->NH > 65535) {  // one block row per (b, h): the grid's y limit
                snprintf(why, why_size,
                         "the flash2 backend runs at most 65535 (batch, head) pairs in one call, not B·NH = %ld; "
                         "lower the batch size",
                         (long)s->B * s->NH);
                return -1;
            }
            if (!flash2_supports_head_dim(s->HD)) {
                snprintf(why, why_size,
                         "the flash2 backend supports head dims 64, 80, 96 and 128, not %d; change --heads "
                         "so that hidden/heads is one of them, or use --attn naive",
                         s->HD);
                return -1;
            }
            return 0;
        case ATTN_FLASH1:
            if ((long)s->B * s->NH > 2147483647L) {  // one thread block per (b, h): the grid's x limit
                snprintf(why, why_size,
                         "the flash1 backend runs at most 2^31-1 (batch, head) pairs in one call, not B·NH = %ld; "
                         "lower the batch size",
                         (long)s->B * s->NH);
                return -1;
            }
            if (!flash2_supports_head_dim(s->HD)) {  // the same kernels' tile shapes as flash2
                snprintf(why, why_size,
                         "the flash1 backend supports head dims 64, 80, 96 and 128, not %d; change --heads "
                         "so that hidden/heads is one of them, or use --attn naive",
                         s->HD);
                return -1;
            }
            return 0;
    }
    snprintf(why, why_size, "unknown attention backend %d", (int)backend);
    return -1;
}

int attention_uses_cublas(AttentionBackend backend) {
    return backend == ATTN_NAIVE || backend == ATTN_NAIVE_RECOMPUTE;
}

size_t attention_saved_bytes(AttentionBackend backend, const AttentionShape* shape) {
    return backend == ATTN_NAIVE ? naive_attention_saved_bytes(shape) : 0;
}

double attention_executed_flops(AttentionBackend backend, const AttentionShape* shape, int backward) {
    const double T = shape->T, heads = (double)shape->B * shape->NH, HD = shape->HD;
    const int flash = backend == ATTN_FLASH1 || backend == ATTN_FLASH2;
    // Query-key pairs a kernel multiplies: flash visits only keys j <= i under the causal mask (the
    // diagonal tiles' masked corners are counted as skipped, so this never overstates the work).
    const double pairs = flash && shape->causal ? T * (T + 1.0) / 2.0 : T * T;
    // Products of 2·HD FLOPs per pair: forward S = Q Kᵀ and O = P V; backward dV = Pᵀ dO, dP = dO Vᵀ,
    // dQ = dS K, dK = dSᵀ Q, plus S again where P is not kept.
    const double products = !backward ? 2.0 : backend == ATTN_NAIVE ? 4.0 : 5.0;
    return products * 2.0 * HD * pairs * heads;
}

size_t attention_workspace_bytes(AttentionBackend backend, const AttentionShape* shape) {
    switch (backend) {
        case ATTN_NAIVE: return naive_attention_workspace_bytes(shape);
        case ATTN_NAIVE_RECOMPUTE: return naive_recompute_attention_workspace_bytes(shape);
        case ATTN_FLASH1: return flash1_attention_workspace_bytes(shape);
        case ATTN_FLASH2: return flash2_attention_workspace_bytes(shape);
        default: return 0;
    }
}

static void unsupported(AttentionBackend backend, const AttentionShape* shape) {
    char why[256];
    if (attention_check(backend, shape, why, sizeof(why)) != 0) fprintf(stderr, "error: %s\n", why);
    else fprintf(stderr, "error: attention backend %d has no implementation\n", (int)backend);
    exit(EXIT_FAILURE);
}

int attention_writes_fp32_out(AttentionBackend backend) { return backend == ATTN_FLASH2; }

void attention_forward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                       cudaStream_t stream) {
    if (args->out_f32 && !attention_writes_fp32_out(backend)) {
        fprintf(stderr, "error: attention backend %s cannot write O in fp32 (AttentionArgs.out_f32); use flash2, or "
                        "leave out_f32 NULL and read the bf16 out\n",
                attention_backend_name(backend) ? attention_backend_name(backend) : "(unknown)");
        exit(EXIT_FAILURE);
    }
    switch (backend) {
        case ATTN_NAIVE: naive_attention_forward(ctx, args, stream); return;
        case ATTN_NAIVE_RECOMPUTE: naive_recompute_attention_forward(ctx, args, stream); return;
        case ATTN_FLASH1: flash1_attention_forward(args, stream); return;
        case ATTN_FLASH2: flash2_attention_forward(args, flash2_settings(), stream); return;
        default: unsupported(backend, &args->shape);
    }
}

int attention_sums_dq_columns(AttentionBackend backend, const AttentionShape* shape) {
    return backend == ATTN_FLASH2 && flash2_sums_dq_columns(shape, flash2_settings());
}

void attention_backward(AttentionBackend backend, const AttentionContext* ctx, const AttentionArgs* args,
                        cudaStream_t stream) {
    if (args->dq_colsum && !attention_sums_dq_columns(backend, &args->shape)) {
        fprintf(stderr,
                "error: attention backend %s cannot sum dq's columns here (AttentionArgs.dq_colsum); ask "
                "attention_sums_dq_columns first and sum them outside where it says 0\n",
                attention_backend_name(backend) ? attention_backend_name(backend) : "(unknown)");
        exit(EXIT_FAILURE);
    }
    switch (backend) {
        case ATTN_NAIVE: naive_attention_backward(ctx, args, stream); return;
        case ATTN_NAIVE_RECOMPUTE: naive_recompute_attention_backward(ctx, args, stream); return;
        case ATTN_FLASH1: flash1_attention_backward(args, stream); return;
        case ATTN_FLASH2: flash2_attention_backward(args, flash2_settings(), stream); return;
        default: unsupported(backend, &args->shape);
    }
}
