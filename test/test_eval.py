"""test_eval.py: the multiple-choice evaluation of ./train_gpt (--eval-data, --eval-every, --eval-only).

Run from the repository root after `make train_gpt`. Without a GPU the plan and the flag checks run;
the GPU cases skip when `nvidia-smi -L` lists no GPU.

The GPU cases score a file of random examples (2 to 6 completions each, contexts that must be cut to
fit T = 32) with a small random model written as an llm.c model file, and compare every completion's
mean loss with an fp64 reference of the same scoring: test_cpu_gpt_numpy.py's numpy GPT on the same
bf16 weights, rows built here from data/README.md's description (not from train_gpt's code).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import harness  # noqa: E402
from harness import expect_error, gpu_listed  # noqa: E402
from prepare_hellaswag import read_eval_file, write_eval_file  # noqa: E402
from shard_format import write_shard  # noqa: E402
from test_cpu_gpt_numpy import numpy_forward, param_shapes  # noqa: E402

TRAIN_GPT = os.path.join(ROOT, "train_gpt")
WORK = tempfile.mkdtemp(prefix="test_eval_")
RNG = np.random.default_rng()  # fresh examples and weights every run
V, VP, EOT = 50257, 50304, 50256
L, C, NH, MAX_T = 2, 128, 2, 32  # head dim 64: every attention backend runs it
CONFIG = (L, C, NH, V, VP, MAX_T, NH)


def run(*args, timeout=300):
    return subprocess.run([TRAIN_GPT, *args], capture_output=True, text=True, errors="replace", timeout=timeout)


def random_examples(n, max_ctx=40):
    """n examples (context, [completions], label): 2..6 completions of 1..8 tokens, contexts of 1..max_ctx."""
    out = []
    for _ in range(n):
        k = int(RNG.integers(2, 7))
        ctx = RNG.integers(0, V, size=int(RNG.integers(1, max_ctx + 1))).tolist()
        comps = [RNG.integers(0, V, size=int(RNG.integers(1, 9))).tolist() for _ in range(k)]
        out.append((ctx, comps, int(RNG.integers(0, k))))
    return out


def write_examples(name, examples):
    path = os.path.join(WORK, name)
    write_eval_file(path, examples)
    return path


SHARD = os.path.join(WORK, "train_000000.bin")
write_shard(SHARD, RNG.integers(0, V, size=4 * MAX_T * 4 + 1))
PLAN = ["--plan-only", "--train-data", SHARD, "--val-data", "", "--checkpoint-dir", "none", "--seq-len", "32"]


# ---- without a GPU: the plan, the flags, bad files -------------------------------------------------------

def cut_at(examples, T):
    """How many examples keep only the end of their context in rows of T positions: a row holds the
    context and the completion but its last token (that one is only a target)."""
    return sum(any(len(ctx) + len(c) - 1 > T for c in comps) for ctx, comps, _ in examples)


def test_plan_reads_the_file_prepare_hellaswag_writes():
    examples = random_examples(7)
    examples[0] = ([7] * 40, [[8]], 0)  # always one to cut: random contexts alone fit T = 32 in ~8% of runs
    path = write_examples("plan.bin", examples)
    r = run(*PLAN, "--eval-data", path, "--eval-every", "5", "--max-steps", "10")
    assert r.returncode == 0, r.stderr
    assert f"eval data    {path}: 7 of 7 examples" in r.stdout, r.stdout
    assert "before the first, every 5 steps and after the last" in r.stdout, r.stdout
    r = run(*PLAN, "--eval-data", path, "--eval-examples", "3")
    assert r.returncode == 0 and f"{path}: 3 of 7 examples" in r.stdout, r.stdout + r.stderr
    cut = f"; {cut_at(examples, MAX_T)} keep only the end of their context at {MAX_T} positions"
    assert "after the last step" in r.stdout and cut in r.stdout, r.stdout


def test_eval_flags_that_cannot_work_are_refused():
    path = write_examples("flags.bin", random_examples(2))
    expect_error(run("--eval-only"), 2, "--eval-only needs --eval-data FILE")
    expect_error(run("--eval-only", "--eval-data", path), 2, "--eval-only needs the weights")
    expect_error(run("--eval-only", "--eval-data", path, "--resume", "auto", "--checkpoint-dir", WORK), 2,
                 "--eval-only needs the weights")
    expect_error(run("--eval-every", "3"), 2, "--eval-every needs --eval-data FILE")
    expect_error(run("--eval-examples", "3"), 2, "--eval-examples needs --eval-data FILE")
    expect_error(run("--generate", "4", "--init-from", "x.bin", "--eval-data", path), 2, "--generate does not use it")


def test_a_completion_longer_than_the_positions_is_refused_at_the_plan():
    path = write_examples("long.bin", [([1, 2], [[5] * 20, [6]], 0)])
    expect_error(run(*PLAN, "--eval-data", path, "--seq-len", "16"), 2,
                 f"eval data {path}: a completion of 20 tokens does not fit 16 positions; raise --seq-len")


def test_a_corrupt_file_is_named_before_any_gpu_work():
    path = write_examples("cut.bin", random_examples(5))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 6)
    r = run(*PLAN, "--eval-data", path)
    expect_error(r, 1, f"error: eval data: {path}: example 4 at byte", "does not fit the file",
                 "scripts/prepare_hellaswag.py writes eval files")
    assert "gpus " not in r.stdout, "the plan went on to the GPU"
    with open(path, "r+b") as f:
        f.write(np.array([1], dtype="<i4").tobytes())
    expect_error(run(*PLAN, "--eval-data", path), 1, f"{path}: magic 1, not 20240522")


def continuation_eval(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_continuation_eval.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_continuation_eval_from_held_out_shards():
    tokens = RNG.integers(0, V, size=5000)  # distinct windows: a span is found at one place only
    write_shard(os.path.join(WORK, "held_val_000000.bin"), tokens[:3000])
    write_shard(os.path.join(WORK, "held_val_000001.bin"), tokens[3000:])
    out = os.path.join(WORK, "cont.bin")
    r = continuation_eval("--val-data", os.path.join(WORK, "held_val_*.bin"), "--output", out, "--examples", "50",
                          "--context-tokens", "20", "--completion-tokens", "5", "--choices", "3")
    assert r.returncode == 0 and "50 examples" in r.stdout and "2 shard(s)" in r.stdout, r.stdout + r.stderr
    text = " ".join(map(str, tokens.tolist())) + " "
    examples, labels = read_eval_file(out)["examples"], []
    for ex in examples:
        assert len(ex["context"]) == 20 and [len(c) for c in ex["completions"]] == [5, 5, 5], ex
        for i, comp in enumerate(ex["completions"]):  # only the label's choice continues the context
            continues = " ".join(map(str, ex["context"] + comp)) + " " in text
            assert continues == (i == ex["label"]), (ex, i)
        labels.append(ex["label"])
    assert len(set(labels)) == 3, f"the right answer is always at one of {set(labels)}"
    again = os.path.join(WORK, "cont2.bin")
    continuation_eval("--val-data", os.path.join(WORK, "held_val_*.bin"), "--output", again, "--examples", "50",
                      "--context-tokens", "20", "--completion-tokens", "5", "--choices", "3")
    assert open(out, "rb").read() == open(again, "rb").read(), "the same seed gave another file"
    r = run(*PLAN, "--eval-data", out)
    assert r.returncode == 0 and "50 of 50 examples" in r.stdout, r.stdout + r.stderr


def test_continuation_eval_bad_input_says_what_to_change():
    out = os.path.join(WORK, "never.bin")
    r = continuation_eval("--val-data", os.path.join(WORK, "none_*.bin"), "--output", out)
    assert r.returncode == 1 and "no file matches" in r.stderr, r.stderr
    write_shard(os.path.join(WORK, "small_val_000000.bin"), RNG.integers(0, V, size=300))
    r = continuation_eval("--val-data", os.path.join(WORK, "small_val_*.bin"), "--output", out)
    assert r.returncode == 1 and "300 held-out tokens are too few" in r.stderr, r.stderr
    r = continuation_eval("--val-data", os.path.join(WORK, "small_val_*.bin"), "--output", out, "--choices", "17")
    assert r.returncode == 1 and "--choices 17" in r.stderr, r.stderr
    with open(os.path.join(WORK, "small_val_000000.bin"), "r+b") as f:
        f.truncate(1500)
    r = continuation_eval("--val-data", os.path.join(WORK, "small_val_*.bin"), "--output", out)
    assert r.returncode == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(out), "a failed run left a file"


def test_continuation_eval_refuses_settings_that_make_no_eval():
    # --examples 0 would write a file of no examples (which the trainer refuses), --choices 1 an eval whose
    # one choice is always right, 0 context or completion tokens empty examples: each is refused by its name
    write_shard(os.path.join(WORK, "flags_val_000000.bin"), RNG.integers(0, V, size=2000))
    out = os.path.join(WORK, "flags_never.bin")
    for flag, value in (("--examples", "0"), ("--choices", "1"), ("--context-tokens", "0"),
                        ("--completion-tokens", "0")):
        r = continuation_eval("--val-data", os.path.join(WORK, "flags_val_*.bin"), "--output", out, flag, value)
        assert r.returncode == 1 and flag in r.stderr and "Traceback" not in r.stderr, (flag, r.stderr)
        assert not os.path.exists(out), f"{flag} {value} left a file"


def test_continuation_eval_windows_on_a_short_stream():
    # As few tokens as the script takes (2 * window * choices = 12, up to 3 more), all distinct, so that
    # every span's place in the stream is known: over 2000 examples every window is drawn, the last one
    # included, and none runs past the end; the wrong choice never overlaps the window (it could be the
    # right continuation); the shards are read in name order (windows cross their boundaries).
    n = int(RNG.integers(12, 16))
    tokens = RNG.permutation(V)[:n]
    cuts = sorted(RNG.choice(np.arange(1, n), size=2, replace=False).tolist())
    for k, part in enumerate(np.split(tokens, cuts)):
        write_shard(os.path.join(WORK, f"short_val_{k:06d}.bin"), part)
    where = {int(t): i for i, t in enumerate(tokens)}
    files = []
    for seed in ("1337", "7"):
        out = os.path.join(WORK, f"short_{seed}.bin")
        r = continuation_eval("--val-data", os.path.join(WORK, "short_val_*.bin"), "--output", out, "--examples",
                              "2000", "--context-tokens", "2", "--completion-tokens", "1", "--choices", "2",
                              "--seed", seed)
        assert r.returncode == 0 and "3 shard(s)" in r.stdout, r.stdout + r.stderr
        files.append(open(out, "rb").read())
    starts = set()
    for ex in read_eval_file(out)["examples"]:
        ctx, comps, label = ex["context"], ex["completions"], ex["label"]
        assert len(ctx) == 2 and [len(c) for c in comps] == [1, 1], ex
        s = where[ctx[0]]
        assert tokens[s:s + 3].tolist() == ctx + comps[label], f"not a window of the stream in order: {ex}"
        other = where[comps[1 - label][0]]
        assert other + 1 <= s or other >= s + 3, f"the wrong choice at {other} overlaps the window at {s}: {ex}"
        starts.add(s)
    assert starts == set(range(n - 2)), f"windows drawn at {sorted(starts)} of 0..{n - 3}"
    assert files[0] != files[1], "--seed 7 gave the same file as --seed 1337"


# ---- on a GPU: the scores against an fp64 reference --------------------------------------------------

def bf16_round(x):
    """x rounded to bf16 (to nearest even), as float64; and the bf16 bits."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64), bits


def write_random_model(path):
    """A model file (bf16) of CONFIG with random weights; returns the weights as float64 (bf16 values).
    The token embedding's scale (0.3) spreads the logits over several nats, so completions differ."""
    parts = []
    for i, shape in enumerate(param_shapes(CONFIG)):
        if i in (2, 8, 14):  # LayerNorm weights near 1
            parts.append(1.0 + 0.1 * RNG.standard_normal(shape))
        else:
            parts.append((0.3 if i == 0 else 0.02) * RNG.standard_normal(shape))
    values, bits = bf16_round(np.concatenate([p.ravel() for p in parts]))
    header = np.zeros(256, dtype="<i4")
    header[:9] = [20240326, 5, MAX_T, V, L, NH, C, VP, 0]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(bits.astype("<u2").tobytes())
    return values


def reference_rows(examples, T, shift=0):
    """Every completion's row (inputs, targets (T,), span start, length), built from the format's
    description: the context's last tokens that fit, then the completion, <|endoftext|> after it.
    shift moves the scored span (a planted error)."""
    rows = []
    for ctx, comps, _ in examples:
        for comp in comps:
            keep = ctx[max(0, len(ctx) + len(comp) - 1 - T):]
            row = (keep + comp + [EOT] * (T + 1))[:T + 1]
            rows.append((np.array(row[:T]), np.array(row[1:T + 1]), len(keep) - 1 + shift, len(comp)))
    return rows


def reference_mean_losses(params, examples, T, shift=0):
    """fp64 mean loss of every completion (a list per example), and the largest |logit| seen."""
    rows, means, biggest = reference_rows(examples, T, shift), [], 0.0
    for i in range(0, len(rows), 4):
        chunk = rows[i:i + 4]
        inputs = np.stack([r[0] for r in chunk])
        _, logits = numpy_forward(CONFIG, params, inputs, np.stack([r[1] for r in chunk]))
        logits = logits[..., :V]
        biggest = max(biggest, float(np.abs(logits).max()))
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        for b, (_, targets, start, n) in enumerate(chunk):
            pos = np.minimum(np.arange(start, start + n), T - 1)  # a shifted span stays in the row
            means.append(float(-logp[b, pos, targets[pos]].mean()))
    out, at = [], 0
    for _, comps, _ in examples:
        out.append(means[at:at + len(comps)])
        at += len(comps)
    return out, biggest


def read_detail(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    return [x for x in lines if "example" in x], lines[-1]


def loss_tolerance(biggest):
    """The GPU's logits are bf16 (8 bits of mantissa) from bf16 activations: a token's loss (log-sum-exp
    minus the target's logit) is off by at most about 2 logit roundings, 2 * 2^-8 * max|logit|; twice that
    covers the activations' own rounding upstream."""
    return 4 * 2.0 ** -8 * biggest


def clear_answers(ref, tol):
    """The examples whose lowest reference mean loss beats the next by more than 2·tol: not near-ties, so
    the GPU must choose as the reference does. Their indices and reference answers."""
    out = []
    for i, ref_x in enumerate(ref):
        order = np.argsort(ref_x, kind="stable")
        if ref_x[order[1]] - ref_x[order[0]] > 2 * tol:
            out.append((i, int(order[0])))
    return out


def test_gpu_eval_only_matches_the_fp64_reference():
    if not gpu_listed():
        raise harness.Skip("no GPU listed by nvidia-smi")
    model, examples = os.path.join(WORK, "model.bin"), random_examples(24)
    params = write_random_model(model)
    ref, biggest = reference_mean_losses(params, examples, MAX_T)
    while len(clear_answers(ref, loss_tolerance(biggest))) < 6:  # a few runs in 1000 draw fewer: draw more
        examples += random_examples(8)
        ref, biggest = reference_mean_losses(params, examples, MAX_T)
    tol = loss_tolerance(biggest)
    data, detail = write_examples("ref.bin", examples), os.path.join(WORK, "detail.jsonl")
    # 4 rows per forward: examples of 2..6 completions straddle forwards
    r = run("--eval-only", "--init-from", model, "--eval-data", data, "--batch-size", "4", "--log-file", detail)
    assert r.returncode == 0, r.stderr
    assert "rows of 32 positions, 4 per forward" in r.stdout, r.stdout
    got, total = read_detail(detail)
    worst = max(abs(g - w) for x, ref_x in zip(got, ref) for g, w in zip(x["loss_mean"], ref_x))
    print(f"worst mean-loss error {worst:.4g} nats, bound {tol:.4g} (largest |logit| {biggest:.1f})")
    assert worst <= tol, f"mean loss off by {worst:.4g} > {tol:.4g}"
    shifted, _ = reference_mean_losses(params, examples, MAX_T, shift=1)  # planted: the span one token late
    planted = max(abs(g - w) for x, ref_x in zip(got, shifted) for g, w in zip(x["loss_mean"], ref_x))
    assert planted > tol, f"a span one token late passes the bound ({planted:.4g} <= {tol:.4g})"
    for i, answer in clear_answers(ref, tol):  # at least 6 (drawn so above), so this check always bites
        assert got[i]["pred_norm"] == answer, (i, got[i], ref[i])
    correct = sum(x["pred_norm"] == x["label"] for x in got)
    # the totals line prints 6 decimals
    assert total["eval_examples"] == len(examples) and abs(total["eval_acc_norm"] - correct / len(examples)) < 6e-7, \
        (total, correct)
    assert f"acc_norm {correct / len(examples):.4f} ({correct}/{len(examples)})" in r.stdout, r.stdout


def test_gpu_training_evaluates_as_eval_only_does():
    if not gpu_listed():
        raise harness.Skip("no GPU listed by nvidia-smi")
    model, examples = os.path.join(WORK, "model_train.bin"), random_examples(30)
    write_random_model(model)
    data, detail, log = (write_examples("train_eval.bin", examples), os.path.join(WORK, "d.jsonl"),
                         os.path.join(WORK, "train_eval.jsonl"))
    args = ["--init-from", model, "--eval-data", data, "--batch-size", "4", "--seq-len", "32", "--attn", "flash2",
            "--deterministic"]
    r = run("--eval-only", *args, "--log-file", detail)
    assert r.returncode == 0, r.stderr
    _, want = read_detail(detail)
    # lr 0: the weights stay as loaded, so every evaluation (before step 1, after steps 1 and 2) scores as
    # --eval-only does, bit for bit (the same kernels; GEMM algorithms fixed by --deterministic)
    r = run(*args, "--train-data", SHARD, "--val-data", "", "--checkpoint-dir", "none", "--max-steps", "2",
            "--eval-every", "1", "--lr", "0", "--log-file", log)
    assert r.returncode == 0, r.stderr
    with open(log) as f:
        evals = [x for x in map(json.loads, f) if "eval_acc_norm" in x]
    assert [x["step"] for x in evals] == [0, 1, 2], evals
    for x in evals:
        assert (x["eval_acc_norm"], x["eval_acc"], x["eval_examples"]) == \
               (want["eval_acc_norm"], want["eval_acc"], want["eval_examples"]), (x, want)
    assert "| eval acc_norm" in r.stdout and "eval acc_norm" in r.stdout.split("summary")[-1], r.stdout


if __name__ == "__main__":
    harness.run_module(globals())
