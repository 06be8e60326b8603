// fuzz_eval_file.c: libFuzzer target for the multiple-choice eval files of --eval-data
// (data/eval_file.h): eval_file_open on the input, then what the trainer does with an opened file:
// eval_check_fits and the scored rows of every completion at two lengths (T = 8 cuts most contexts,
// T = 300 none), each row's span inside the row and its targets the completion's tokens, and the
// choice on made-up losses.
#define _DEFAULT_SOURCE  // mkstemps, ftruncate, pwrite under -std=c11

#include "data/eval_file.h"
#include "test/fuzz/fuzz_util.h"

static void check_rows(const EvalFile* ef, int T) {
    int inputs[300], targets[300];
    for (int e = 0; e < ef->num_examples; e++) {
        const EvalExample* ex = &ef->examples[e];
        double losses[EVAL_MAX_COMPLETIONS];
        for (int c = 0; c < ex->num_completions; c++) {
            losses[c] = (double)((e * 7 + c * 3) % 5);
            if (ex->completion_len[c] > T) continue;  // the trainer refuses the file at this T
            const EvalRowSpan s = eval_fill_row(ef, e, c, T, inputs, targets);
            if (s.start < 0 || s.start + s.len > T || s.len != ex->completion_len[c]) abort();
            for (int j = 0; j < s.len; j++)
                if (targets[s.start + j] != ex->completion[c][j]) abort();
        }
        int by_mean = -1, by_sum = -1;
        eval_choose(ex, losses, &by_mean, &by_sum);
        if (by_mean < 0 || by_mean >= ex->num_completions || by_sum < 0 || by_sum >= ex->num_completions) abort();
    }
}

// The trainer's fit check, written again from its definition.
static void check_fits(const EvalFile* ef, int T) {
    int longest = 0;
    for (int e = 0; e < ef->num_examples; e++)
        for (int c = 0; c < ef->examples[e].num_completions; c++)
            if (ef->examples[e].completion_len[c] > longest) longest = ef->examples[e].completion_len[c];
    if ((longest > T) != (eval_check_fits(ef, T) < 0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    EvalFile ef;
    if (eval_file_open(&ef, fuzz_temp_file(data, size, "eval_file"), 50257) != 0) {
        if (!ef.error[0] || ef.examples || ef.words) abort();  // a refusal says why and holds nothing
        fuzz_expect_valid(0, "eval_file_open", ef.error);
        return 0;
    }
    if (ef.num_examples < 1) abort();
    check_fits(&ef, 8);
    check_rows(&ef, 8);
    check_rows(&ef, 300);
    eval_file_close(&ef);
    return 0;
}
