// test_gpt_config.c: model shapes, parameter counts, config checks and FLOP accounting.
//
// Cases: the named shapes' parameter counts (against llm.c's and Hugging Face's published ones and a
// formula written here) and their (layers, hidden, heads) against the GPT-2 and GPT-3 releases; the
// parameter table's order, stacking, weight decay and initialization against llm.c's/GPT-2's rules;
// every kind of config refused with its message (a zero count, heads that do not divide, a head dim
// no kernel is built for, kv heads, a padded vocab below the vocab), and exactly the four head dims
// accepted; rounding up to the pad multiple; grouped-query counts; the FLOPs formula; the peak table.
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

// Every named shape's (layers, hidden, heads) as published: GPT-2's from OpenAI's released models
// (n_layer, n_embd, n_head of 124M, 355M, 774M, 1558M); GPT-3's from the GPT-3 paper's Table 2.1,
// where 2.7B has 32 layers, hidden 2560 and 32 heads of 80. Two are this repository's choices:
// gpt3-2.7b-d128 (the header's) is 2.7B with 20 heads of 128; gpt3-1.3b keeps the table's head dim of
// 128, so 16 heads (its 24 heads of 128 do not make hidden 2048), as scripts/hf_gpt2.py has it too.
static void named_shape_published_case(void) {
    static const NamedGPTShape PUBLISHED[] = {
        {"gpt2-124m", 12, 768, 12},  {"gpt2-350m", 24, 1024, 16}, {"gpt2-774m", 36, 1280, 20},
        {"gpt2-1558m", 48, 1600, 25}, {"gpt3-1.3b", 24, 2048, 16}, {"gpt3-2.7b", 32, 2560, 32},
        {"gpt3-2.7b-d128", 32, 2560, 20},
    };
    char bad[512] = "";
    if (NUM_NAMED_GPT_SHAPES != (int)COUNT(PUBLISHED))  // a new shape gets its published row here
        add_problem(bad, sizeof(bad), "%d named shapes, %d here", NUM_NAMED_GPT_SHAPES, (int)COUNT(PUBLISHED));
    for (size_t i = 0; i < COUNT(PUBLISHED); i++) {
        const NamedGPTShape *p = &PUBLISHED[i], *s = gpt_find_named_shape(p->name);
        if (!s || s->num_layers != p->num_layers || s->channels != p->channels || s->num_heads != p->num_heads)
            add_problem(bad, sizeof(bad), "%s: (%d, %d, %d), published (%d, %d, %d)", p->name, s ? s->num_layers : 0,
                   s ? s->channels : 0, s ? s->num_heads : 0, p->num_layers, p->channels, p->num_heads);
    }
    case_report("named_shapes_are_the_published_ones", !bad[0], "%s", bad);
}

// Whether `name` is one of the space-separated words of `list`.
static int named_in(const char* name, const char* list) {
    const size_t n = strlen(name);
    for (const char* p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

// The parameter table against the rules it encodes, written here by name: llm.c's storage order (its
// files and checkpoints depend on it); one copy of the embeddings and the final LayerNorm, one per
// layer of the rest; AdamW's weight decay on the 2-D weights only (GPT-2/llm.c: no biases, no
// LayerNorm); GPT-2's initialization: N(0, 0.02/sqrt(2L)) for the two projections that add into the
// residual stream, ones for the LayerNorm gains, zeros for every bias, N(0, 0.02) for the rest.
static void param_table_cases(void) {
    static const char* const LLM_C_ORDER[] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw",    "qkvb",
                                              "attprojw", "attprojb", "ln2w", "ln2b", "fcw",     "fcb",
                                              "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
    char order[512] = "", stacking[256] = "", decay[256] = "", init[256] = "";
    if (NUM_PARAM_TENSORS != (int)COUNT(LLM_C_ORDER))
        add_problem(order, sizeof(order), "%d tensors, want %d", NUM_PARAM_TENSORS, (int)COUNT(LLM_C_ORDER));
    for (int i = 0; i < NUM_PARAM_TENSORS && i < (int)COUNT(LLM_C_ORDER); i++) {
        const GPTParamSpec* p = &GPT_PARAMS[i];
        if (strcmp(p->name, LLM_C_ORDER[i]) != 0)
            add_problem(order, sizeof(order), "%d: %s, want %s", i, p->name, LLM_C_ORDER[i]);
        const int per_layer = !named_in(p->name, "wte wpe lnfw lnfb");
        if (p->per_layer != per_layer) add_problem(stacking, sizeof(stacking), "%s: %d", p->name, p->per_layer);
        const int decays = named_in(p->name, "wte wpe qkvw attprojw fcw fcprojw");
        if (p->weight_decay != decays) add_problem(decay, sizeof(decay), "%s: %d", p->name, p->weight_decay);
        const GPTParamInit want = named_in(p->name, "attprojw fcprojw")  ? INIT_NORMAL_RESIDUAL
                                  : named_in(p->name, "ln1w ln2w lnfw") ? INIT_ONES
                                  : p->name[strlen(p->name) - 1] == 'b' ? INIT_ZEROS
                                                                        : INIT_NORMAL;
        if (p->init != want) add_problem(init, sizeof(init), "%s: %d, want %d", p->name, (int)p->init, (int)want);
    }
    case_report("param_table_llm_c_order", !order[0], "%s", order);
    case_report("param_table_per_layer_all_but_embeddings_and_final_layernorm", !stacking[0], "%s", stacking);
    case_report("param_table_weight_decay_on_2d_weights_only", !decay[0], "%s", decay);
    case_report("param_table_gpt2_init", !init[0], "%s", init);
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

// gpt_config_check with err emptied first, so a failure shows this call's message, not an earlier one.
static int check_fresh(const GPTConfig* c, char* err, size_t len) {
    err[0] = '\0';
    return gpt_config_check(c, err, len);
}

// A zero head count or sequence length is refused before anything divides by the heads or sizes wpe;
// a padded vocab below the vocab is refused (the LM head needs a row per token), one equal to it is
// fine (Hugging Face's unpadded models).
static void rejected_count_cases(void) {
    char err[512] = "";
    const GPTConfig gpt2 = named_config("gpt2-124m", 1024);
    GPTConfig bad = gpt2;
    bad.num_heads = 0;
    int rc = check_fresh(&bad, err, sizeof(err));
    case_report("zero_heads_rejected", rc == -1 && strstr(err, "heads (0)"), "rc %d, message \"%s\"", rc, err);
    bad = gpt2;
    bad.max_seq_len = 0;
    rc = check_fresh(&bad, err, sizeof(err));
    case_report("zero_sequence_length_rejected", rc == -1 && strstr(err, "sequence length (0)"),
                "rc %d, message \"%s\"", rc, err);
    bad = gpt2;
    bad.padded_vocab_size = 50000;
    rc = check_fresh(&bad, err, sizeof(err));
    case_report("padded_vocab_below_vocab_rejected",
                rc == -1 && strstr(err, "padded vocab 50000 is smaller than vocab 50257"), "rc %d, message \"%s\"", rc,
                err);
    bad.padded_vocab_size = bad.vocab_size;
    rc = check_fresh(&bad, err, sizeof(err));
    case_report("padded_vocab_equal_to_vocab_accepted", rc == 0, "rc %d, message \"%s\"", rc, err);
}

// Every head dim 1 .. 256 (8 heads, hidden 8·HD): accepted exactly for 64, 80, 96 and 128, the ones the
// attention kernels are built for (so hidden 768 with 8 heads of 96 is accepted, 896 with 8 of 112 not).
static void head_dim_sweep_case(void) {
    char err[512], bad[512] = "";
    for (int hd = 1; hd <= 256; hd++) {
        const GPTConfig c = {2, 8 * hd, 8, 8, GPT2_VOCAB_SIZE, 50304, 64};
        const int want = hd == 64 || hd == 80 || hd == 96 || hd == 128, rc = gpt_config_check(&c, err, sizeof(err));
        if ((rc == 0) != want) add_problem(bad, sizeof(bad), "head dim %d: rc %d", hd, rc);
    }
    case_report("only_head_dims_64_80_96_128_accepted", !bad[0], "%s", bad);
}

// gpt_round_up gives the smallest multiple at or above x (a multiple stays itself); the vocab pads to
// 128 as scripts/hf_gpt2.py and scripts/torch_gpt.py do (VOCAB_PAD_MULTIPLE there too).
static void round_up_cases(void) {
    static const int MULTIPLES[] = {1, 3, 64, 128};
    char bad[512] = "";
    for (size_t m = 0; m < COUNT(MULTIPLES); m++)
        for (int x = 0; x <= 1000; x++) {
            const int k = MULTIPLES[m], r = gpt_round_up(x, k);
            if (r % k != 0 || r < x || r >= x + k) add_problem(bad, sizeof(bad), "round_up(%d, %d) = %d", x, k, r);
        }
    case_report("round_up_gives_the_next_multiple", !bad[0], "%s", bad);
    case_report("vocab_pad_multiple_is_the_scripts_128", VOCAB_PAD_MULTIPLE == 128 &&
                gpt_round_up(50305, VOCAB_PAD_MULTIPLE) == 50432, "VOCAB_PAD_MULTIPLE %d", VOCAB_PAD_MULTIPLE);
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
    // PCIe and NVL parts: the dense half of NVIDIA's H100 datasheet figures with sparsity (1,513 and
    // 1,671 TFLOP/s), 756 and 835 as the header and scripts/results_common.py list them.
    case_report("peak_h100_pcie", gpu_peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0, "wrong peak");
    case_report("peak_h100_nvl", gpu_peak_bf16_tflops("NVIDIA H100 NVL") == 835.0, "wrong peak");
    case_report("peak_a100", gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0, "wrong peak");
    case_report("peak_unknown_is_zero", gpu_peak_bf16_tflops("NVIDIA GeForce RTX 4090") == 0.0, "wrong peak");
}

static void all_cases(void) {
    named_shape_cases();
    named_shape_published_case();
    param_table_cases();
    rejected_config_cases();
    rejected_count_cases();
    head_dim_sweep_case();
    round_up_cases();
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
