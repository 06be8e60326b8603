// test_gpt_config.c: model shapes, parameter counts, config checks and FLOP accounting.
#include "data/gpt_config.h"
#include "test/test_harness.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

// Every case is reported through case_report; main runs them twice, first only counting them (for
// the PLAN line), so the count comes from the same calls.
static int g_counting = 0, g_num_cases = 0;

static void case_report(const char* name, int ok, const char* fmt, ...) {
    if (g_counting) {
        g_num_cases++;
        return;
    }
    if (ok) {
        test_pass(name);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    test_vfail(name, fmt, ap);
    va_end(ap);
}

static GPTConfig named_config(const char* name, int T) {
    const NamedGPTShape* s = gpt_find_named_shape(name);
    GPTConfig c = {s->num_layers, s->channels, s->num_heads, s->num_heads, GPT2_VOCAB_SIZE,
                   gpt_round_up(GPT2_VOCAB_SIZE, VOCAB_PAD_MULTIPLE), T};
    return c;
}

// The parameter count of gpt_config.h's layout, written out here: the token table (Vp rows: the padding
// rows are parameters too; tied, so no separate LM head), the position table (maxT rows), per layer
// two LayerNorms (2·2C), the QKV projection (C·QKV + QKV, QKV = (NH + 2·NKV)·HD), the attention
// projection (C² + C) and the MLP (C·4C + 4C + 4C·C + C), and the final LayerNorm (2C). Multi-head
// (QKV = 3C): Vp·C + maxT·C + L·(12C² + 13C) + 2C.
static unsigned long long formula_params(const GPTConfig* c) {
    const unsigned long long C = c->channels, L = c->num_layers, HD = C / c->num_heads;
    const unsigned long long QKV = ((unsigned long long)c->num_heads + 2ull * c->num_kv_heads) * HD;
    const unsigned long long layer = 4 * C + C * QKV + QKV + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C;
    return (unsigned long long)c->padded_vocab_size * C + (unsigned long long)c->max_seq_len * C + L * layer + 2 * C;
}

// Named shapes: every one's parameter count by the formula above (multi-head and multi-query, T 1024 and
// 2048), the GPT-2 ones against published counts, GPT-3 1.3B's exactly, and every named shape passes
// the check.
static void named_shape_cases(void) {
    char err[512];
    GPTConfig gpt2 = named_config("gpt2-124m", 1024);
    case_report("padded_vocab_is_50304", gpt2.padded_vocab_size == 50304, "got %d", gpt2.padded_vocab_size);
    // llm.c reports 124,475,904 parameters for GPT-2 124M (vocab padded to 50304, T 1024).
    size_t n = gpt_num_params(&gpt2);
    case_report("gpt2_124m_param_count", n == 124475904u, "got %zu, llm.c reports 124475904", n);
    // Hugging Face's GPT-2 models (vocab 50257 unpadded, tied LM head, T 1024) count 124,439,808,
    // 354,823,168, 774,030,080 and 1,557,611,200 parameters: the same layout without the 47 padding rows.
    static const struct {
        const char* name;
        unsigned long long params;
    } HF_GPT2[] = {{"gpt2-124m", 124439808ull}, {"gpt2-350m", 354823168ull}, {"gpt2-774m", 774030080ull},
                   {"gpt2-1558m", 1557611200ull}};
    char bad[512] = "";
    for (size_t i = 0; i < COUNT(HF_GPT2); i++) {
        GPTConfig c = named_config(HF_GPT2[i].name, 1024);
        c.padded_vocab_size = c.vocab_size;
        if (gpt_num_params(&c) != HF_GPT2[i].params)
            snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), "%s: %zu, published %llu; ", HF_GPT2[i].name,
                     gpt_num_params(&c), HF_GPT2[i].params);
    }
    case_report("gpt2_param_counts_match_hugging_face_unpadded", !bad[0], "%s", bad);
    // GPT-3 1.3B at 2k context: 50304·2048 + 2048·2048 + 24·(12·2048² + 13·2048) + 2·2048.
    GPTConfig gpt3 = named_config("gpt3-1.3b", 2048);
    n = gpt_num_params(&gpt3);
    case_report("gpt3_1_3b_param_count", n == 1315819520u, "got %zu, want 1315819520", n);
    bad[0] = 0;
    for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++)
        for (int t = 1024; t <= 2048; t *= 2)
            for (int multi_query = 0; multi_query <= 1; multi_query++) {
                GPTConfig c = named_config(NAMED_GPT_SHAPES[i].name, t);
                if (multi_query) c.num_kv_heads = 1;
                if (gpt_num_params(&c) != formula_params(&c))
                    snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                             "%s at T %d, %d kv heads: %zu, formula %llu; ", NAMED_GPT_SHAPES[i].name, t,
                             c.num_kv_heads, gpt_num_params(&c), formula_params(&c));
            }
    case_report("named_shape_param_counts_match_the_formula", !bad[0], "%s", bad);
    int all_named_ok = 1;
    for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++) {
        GPTConfig c = named_config(NAMED_GPT_SHAPES[i].name, 1024);
        if (gpt_config_check(&c, err, sizeof(err)) != 0) {
            all_named_ok = 0;
            if (!g_counting) printf("  %s: %s\n", NAMED_GPT_SHAPES[i].name, err);
        }
    }
    case_report("named_shapes_pass_check", all_named_ok, "a named shape was rejected");
    case_report("unknown_shape_not_found", gpt_find_named_shape("gpt5") == NULL, "found a shape named gpt5");
    GPTConfig d80 = named_config("gpt3-2.7b", 2048), d128 = named_config("gpt3-2.7b-d128", 2048);
    case_report("gpt3_2_7b_head_dims", d80.channels / d80.num_heads == 80 && d128.channels / d128.num_heads == 128,
                "head dims %d and %d", d80.channels / d80.num_heads, d128.channels / d128.num_heads);
}

// Rejected configs name the problem and the fix.
static void rejected_config_cases(void) {
    char err[512];
    const GPTConfig gpt2 = named_config("gpt2-124m", 1024);
    GPTConfig bad = gpt2;
    bad.num_heads = 16;  // 768 / 16 = 48
    int rc = gpt_config_check(&bad, err, sizeof(err));
    case_report("head_dim_48_rejected", rc != 0 && strstr(err, "head dim 48") && strstr(err, "--heads"),
                "rc %d, message \"%s\"", rc, err);
    bad.num_heads = 7;  // 768 not divisible by 7
    rc = gpt_config_check(&bad, err, sizeof(err));
    case_report("indivisible_heads_rejected", rc != 0 && strstr(err, "not divisible"), "rc %d, message \"%s\"", rc,
                err);
    bad = gpt2;
    bad.num_layers = 0;
    rc = gpt_config_check(&bad, err, sizeof(err));
    case_report("zero_layers_rejected", rc != 0, "rc %d", rc);
    bad = gpt2;
    bad.num_kv_heads = 5;  // 12 heads
    rc = gpt_config_check(&bad, err, sizeof(err));
    case_report("kv_heads_not_dividing_heads_rejected", rc != 0 && strstr(err, "--kv-heads"), "rc %d, message \"%s\"",
                rc, err);
    bad.num_kv_heads = 0;
    rc = gpt_config_check(&bad, err, sizeof(err));
    case_report("zero_kv_heads_rejected", rc != 0 && strstr(err, "--kv-heads"), "rc %d, message \"%s\"", rc, err);
}

// Grouped-query attention shrinks only the QKV projection: C × (NH + 2·NKV)·HD weights and
// (NH + 2·NKV)·HD biases per layer, instead of C × 3C and 3C.
static void gqa_param_count_case(void) {
    char err[512];
    const GPTConfig gpt3 = named_config("gpt3-1.3b", 2048);
    int gqa_ok = 1;
    for (int kv = 1; kv <= 16; kv *= 2) {
        GPTConfig g = gpt3;
        g.num_kv_heads = kv;
        const size_t qkv = (size_t)(16 + 2 * kv) * 128, mha_qkv = 3 * 2048;
        const size_t want = gpt_num_params(&gpt3) - 24 * (mha_qkv - qkv) * (2048 + 1);
        if (gpt_config_check(&g, err, sizeof(err)) != 0 || gpt_num_params(&g) != want || gpt_qkv_features(&g) != qkv) {
            if (!g_counting)
                printf("  kv heads %d: %zu params (want %zu), qkv features %zu (want %zu)\n", kv, gpt_num_params(&g),
                       want, gpt_qkv_features(&g), qkv);
            gqa_ok = 0;
        }
    }
    case_report("gqa_param_counts_gpt3_1_3b", gqa_ok, "wrong parameter count with --kv-heads");
}

// FLOPs: 6·s·P + 12·L·h·s², worked by hand for a small config.
static void flop_cases(void) {
    GPTConfig tiny = {2, 64, 1, 1, 100, 128, 16};
    // P = 128·64 + 16·64 + 2·(12·64² + 13·64) + 2·64 = 8192 + 1024 + 99968 + 128 = 109312
    case_report("tiny_param_count", gpt_num_params(&tiny) == 109312u, "got %zu", gpt_num_params(&tiny));
    double flops = gpt_flops_per_sequence(&tiny, 16), want = 6.0 * 16 * 109312 + 12.0 * 2 * 64 * 16 * 16;
    case_report("flops_per_sequence_formula", flops == want, "got %.0f, want %.0f", flops, want);
    // With GQA only P changes: 4 heads of 16, 2 K/V heads: QKV (4 + 4)·16 = 128 features instead of
    // 192, i.e. 2·(64·64 + 64) fewer parameters; the attention term stays 12·L·h·s² with h = C.
    GPTConfig tiny_gqa = {2, 64, 4, 2, 100, 128, 16};
    const double p_gqa = 109312.0 - 2 * (64 * 64 + 64);
    flops = gpt_flops_per_sequence(&tiny_gqa, 16), want = 6.0 * 16 * p_gqa + 12.0 * 2 * 64 * 16 * 16;
    case_report("flops_per_sequence_formula_gqa", flops == want, "got %.0f, want %.0f", flops, want);
}

// Peaks: the dense bf16 datasheet numbers (SXM parts; scripts/results_common.py has the same table).
static void peak_cases(void) {
    case_report("peak_h100_sxm", gpu_peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4, "wrong peak");
    case_report("peak_h200", gpu_peak_bf16_tflops("NVIDIA H200") == 989.4, "wrong peak");
    case_report("peak_a100", gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0, "wrong peak");
    case_report("peak_unknown_is_zero", gpu_peak_bf16_tflops("NVIDIA GeForce RTX 4090") == 0.0, "wrong peak");
}

static void all_cases(void) {
    named_shape_cases();
    rejected_config_cases();
    gqa_param_count_case();
    flop_cases();
    peak_cases();
}

int main(void) {
    test_begin();
    g_counting = 1;
    all_cases();
    g_counting = 0;
    test_plan(g_num_cases);
    all_cases();
    return test_end();
}
