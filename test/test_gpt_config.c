// test_gpt_config.c: model shapes, parameter counts, config checks and FLOP accounting.
#include "data/gpt_config.h"
#include "test/test_harness.h"

static GPTConfig named_config(const char* name, int T) {
    const NamedGPTShape* s = gpt_find_named_shape(name);
    GPTConfig c = {s->num_layers, s->channels, s->num_heads, s->num_heads, GPT2_VOCAB_SIZE,
                   gpt_round_up(GPT2_VOCAB_SIZE, VOCAB_PAD_MULTIPLE), T};
    return c;
}

// Named shapes: GPT-2 124M's and GPT-3 1.3B's parameter counts, every named shape passes the check.
static void named_shape_cases(void) {
    char err[512];
    // llm.c reports 124,475,904 parameters for GPT-2 124M (vocab padded to 50304, T 1024).
    GPTConfig gpt2 = named_config("gpt2-124m", 1024);
    test_report("padded_vocab_is_50304", gpt2.padded_vocab_size == 50304, "got %d", gpt2.padded_vocab_size);
    size_t n = gpt_num_params(&gpt2);
    test_report("gpt2_124m_param_count", n == 124475904u, "got %zu, llm.c reports 124475904", n);

    // GPT-3 1.3B at 2k context lands at 1.3B + embeddings, and every named shape passes the check.
    GPTConfig gpt3 = named_config("gpt3-1.3b", 2048);
    n = gpt_num_params(&gpt3);
    test_report("gpt3_1_3b_param_count", n > 1.30e9 && n < 1.45e9, "got %zu", n);
    int all_named_ok = 1;
    for (int i = 0; i < NUM_NAMED_GPT_SHAPES; i++) {
        GPTConfig c = named_config(NAMED_GPT_SHAPES[i].name, 1024);
        if (gpt_config_check(&c, err, sizeof(err)) != 0) {
            all_named_ok = 0;
            printf("  %s: %s\n", NAMED_GPT_SHAPES[i].name, err);
        }
    }
    test_report("named_shapes_pass_check", all_named_ok, "a named shape was rejected");
    test_report("unknown_shape_not_found", gpt_find_named_shape("gpt5") == NULL, "found a shape named gpt5");
    GPTConfig d80 = named_config("gpt3-2.7b", 2048), d128 = named_config("gpt3-2.7b-d128", 2048);
    test_report("gpt3_2_7b_head_dims", d80.channels / d80.num_heads == 80 && d128.channels / d128.num_heads == 128,
                "head dims %d and %d", d80.channels / d80.num_heads, d128.channels / d128.num_heads);
}

// Rejected configs name the problem and the fix.
static void rejected_config_cases(void) {
    char err[512];
    const GPTConfig gpt2 = named_config("gpt2-124m", 1024);
    GPTConfig bad = gpt2;
    bad.num_heads = 16;  // 768 / 16 = 48
    int rc = gpt_config_check(&bad, err, sizeof(err));
    test_report("head_dim_48_rejected", rc != 0 && strstr(err, "head dim 48") && strstr(err, "--heads"),
                "rc %d, message \"%s\"", rc, err);
    bad.num_heads = 7;  // 768 not divisible by 7
    rc = gpt_config_check(&bad, err, sizeof(err));
    test_report("indivisible_heads_rejected", rc != 0 && strstr(err, "not divisible"), "rc %d, message \"%s\"", rc,
                err);
    bad = gpt2;
    bad.num_layers = 0;
    rc = gpt_config_check(&bad, err, sizeof(err));
    test_report("zero_layers_rejected", rc != 0, "rc %d", rc);
    bad = gpt2;
    bad.num_kv_heads = 5;  // 12 heads
    rc = gpt_config_check(&bad, err, sizeof(err));
    test_report("kv_heads_not_dividing_heads_rejected", rc != 0 && strstr(err, "--kv-heads"), "rc %d, message \"%s\"",
                rc, err);
    bad.num_kv_heads = 0;
    rc = gpt_config_check(&bad, err, sizeof(err));
    test_report("zero_kv_heads_rejected", rc != 0 && strstr(err, "--kv-heads"), "rc %d, message \"%s\"", rc, err);
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
            printf("  kv heads %d: %zu params (want %zu), qkv features %zu (want %zu)\n", kv, gpt_num_params(&g),
                   want, gpt_qkv_features(&g), qkv);
            gqa_ok = 0;
        }
    }
    test_report("gqa_param_counts_gpt3_1_3b", gqa_ok, "wrong parameter count with --kv-heads");
}

// FLOPs: 6·s·P + 12·L·h·s², worked by hand for a small config.
static void flop_cases(void) {
    GPTConfig tiny = {2, 64, 1, 1, 100, 128, 16};
    // P = 128·64 + 16·64 + 2·(12·64² + 13·64) + 2·64 = 8192 + 1024 + 99968 + 128 = 109312
    test_report("tiny_param_count", gpt_num_params(&tiny) == 109312u, "got %zu", gpt_num_params(&tiny));
    double flops = gpt_flops_per_sequence(&tiny, 16), want = 6.0 * 16 * 109312 + 12.0 * 2 * 64 * 16 * 16;
    test_report("flops_per_sequence_formula", flops == want, "got %.0f, want %.0f", flops, want);
    // With GQA only P changes: 4 heads of 16, 2 K/V heads: QKV (4 + 4)·16 = 128 features instead of
    // 192, i.e. 2·(64·64 + 64) fewer parameters; the attention term stays 12·L·h·s² with h = C.
    GPTConfig tiny_gqa = {2, 64, 4, 2, 100, 128, 16};
    const double p_gqa = 109312.0 - 2 * (64 * 64 + 64);
    flops = gpt_flops_per_sequence(&tiny_gqa, 16), want = 6.0 * 16 * p_gqa + 12.0 * 2 * 64 * 16 * 16;
    test_report("flops_per_sequence_formula_gqa", flops == want, "got %.0f, want %.0f", flops, want);
}

// Peaks: the dense bf16 datasheet numbers (SXM parts; scripts/results_common.py has the same table).
static void peak_cases(void) {
    test_report("peak_h100_sxm", gpu_peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4, "wrong peak");
    test_report("peak_h200", gpu_peak_bf16_tflops("NVIDIA H200") == 989.4, "wrong peak");
    test_report("peak_a100", gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0, "wrong peak");
    test_report("peak_unknown_is_zero", gpu_peak_bf16_tflops("NVIDIA GeForce RTX 4090") == 0.0, "wrong peak");
}

int main(void) {
    test_begin();
    named_shape_cases();
    rejected_config_cases();
    gqa_param_count_case();
    flop_cases();
    peak_cases();
    return test_end();
}
