"""test_train_gpt_cli.py: ./train_gpt's command line, data checks and plan, run as a user would.

Run from the repository root after `make train_gpt`. The cases marked GPU skip when
`nvidia-smi -L` lists no GPU.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import harness  # noqa: E402
from shard_format import write_shard  # noqa: E402

TRAIN_GPT = os.path.join(ROOT, "train_gpt")
WORK = tempfile.mkdtemp(prefix="train_gpt_cli_")
RNG = np.random.default_rng()
TRAIN_TOKENS = RNG.integers(0, 50257, size=3 * 4 * 64 + 1, dtype=np.int64)  # fresh each run
write_shard(os.path.join(WORK, "good_train_000000.bin"), TRAIN_TOKENS)
write_shard(os.path.join(WORK, "good_val_000000.bin"), RNG.integers(0, 50257, size=1000))
GOOD = ["--train-data", os.path.join(WORK, "good_train_*.bin"), "--val-data", os.path.join(WORK, "good_val_*.bin"),
        "--batch-size", "4", "--seq-len", "64"]


def run(*args):
    return subprocess.run([TRAIN_GPT, *args], capture_output=True, text=True, timeout=120)


def gpu_listed():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return listed.returncode == 0 and "GPU" in listed.stdout


def expect_error(result, code, *words):
    assert result.returncode == code, f"exit {result.returncode}, want {code}; stderr: {result.stderr.strip()}"
    for word in words:
        assert word in result.stderr, f"stderr lacks {word!r}: {result.stderr.strip()}"


def test_help_lists_flags():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--attn", "--model", "--train-data", "--batch-size", "--seq-len", "--peak-tflops", "--lr",
                 "--warmup-steps", "--weight-decay", "--grad-clip", "--val-every", "--log-file", "--plan-only"):
        assert flag in r.stdout, f"--help lacks {flag}"
    assert "checkpoints" in r.stdout and "not in this build" in r.stdout, "--help must say what is missing"


def test_plan_on_good_data():
    r = run(*GOOD, "--model", "gpt2-124m")
    assert r.returncode == 0, r.stderr
    # 124,475,904 parameters at seq 1024 (llm.c's count); at seq 64 wpe has 64 rows instead of 1024.
    want_params = 124475904 - (1024 - 64) * 768
    assert f"parameters   {want_params} " in r.stdout, r.stdout
    first = " ".join(str(t) for t in TRAIN_TOKENS[:4])
    targets = " ".join(str(t) for t in TRAIN_TOKENS[1:5])
    assert f"first batch  {first} ... (targets {targets} ...)" in r.stdout, r.stdout
    assert "3 micro batches per epoch" in r.stdout, r.stdout  # 3·4·64+1 tokens = 3 batches of 4×64
    assert "attention    flash2" in r.stdout, r.stdout


def test_plan_flops_and_accumulation():
    r = run(*GOOD, "--model", "gpt3-1.3b", "--total-batch-tokens", str(4 * 64 * 8), "--attn", "naive")
    assert r.returncode == 0, r.stderr
    assert "8 micro steps per optimizer step = 2048 tokens" in r.stdout, r.stdout
    assert "attention    naive" in r.stdout, r.stdout
    params = int(r.stdout.split("parameters   ")[1].split()[0])
    flops = (6 * 64 * params + 12 * 24 * 2048 * 64 * 64) * 32 / 1e12  # 32 sequences per step
    assert f"model FLOPs  {flops:.3f} TFLOP" in r.stdout, (flops, r.stdout)


def test_unknown_flag():
    expect_error(run("--no-such-flag"), 2, "--help")


def test_bad_values():
    expect_error(run(*GOOD, "--attn", "flash3"), 2, "naive, flash1 or flash2")
    expect_error(run(*GOOD, "--batch-size", "0"), 2, "--batch-size")
    expect_error(run(*GOOD, "--seq-len", "12x"), 2, "--seq-len")
    expect_error(run(*GOOD, "--model", "gpt5"), 2, "unknown model", "gpt2-124m")
    expect_error(run(*GOOD, "--total-batch-tokens", "1000"), 2, "not a multiple")
    expect_error(run(*GOOD, "extra"), 2, "unexpected argument")


def test_unsupported_head_dim():
    expect_error(run(*GOOD, "--heads", "16"), 2, "head dim 48", "64, 80, 96 and 128")


def test_missing_data():
    pattern = os.path.join(WORK, "absent_*.bin")
    expect_error(run("--train-data", pattern, "--val-data", ""), 1, pattern)


def test_corrupt_shard():
    path = os.path.join(WORK, "corrupt.bin")
    write_shard(path, RNG.integers(0, 50257, size=1000))
    with open(path, "r+b") as f:
        f.write(np.array([12345], dtype="<i4").tobytes())  # overwrite the magic
    expect_error(run("--train-data", path, "--val-data", "", "--batch-size", "1", "--seq-len", "8"), 1, path,
                 "magic")


def test_token_out_of_range():
    path = os.path.join(WORK, "big_token.bin")
    write_shard(path, np.full(100, 50257))  # one past the GPT-2 vocab
    expect_error(run("--train-data", path, "--val-data", "", "--batch-size", "1", "--seq-len", "8"), 1, path)


def test_gpu_plan_reports_device_and_peak():
    if not gpu_listed():
        raise harness.Skip("no GPU listed by nvidia-smi")
    r = run(*GOOD, "--plan-only")
    assert r.returncode == 0, r.stderr
    assert "gpu          none found" not in r.stdout, "nvidia-smi lists a GPU but train_gpt found none"
    assert "mfu peak" in r.stdout, r.stdout
    assert not any(line.startswith("step ") for line in r.stdout.splitlines()), "--plan-only must not train"
    r = run(*GOOD, "--plan-only", "--peak-tflops", "123.5")
    assert "mfu peak     123.5 TFLOP/s dense bf16 (from --peak-tflops)" in r.stdout, r.stdout


def test_gpu_trains_and_logs_every_step():
    if not gpu_listed():
        raise harness.Skip("no GPU listed by nvidia-smi")
    log = os.path.join(WORK, "train_log.jsonl")
    r = run(*GOOD, "--model", "gpt2-124m", "--layers", "2", "--log-file", log)
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ") and "| loss" in line]
    assert len(steps) == 3, r.stdout  # 3 micro batches of 4 x 64 in the training shard: one epoch
    for word in ("tok/s", "TFLOP/s", "MFU", "norm", "lr"):
        assert word in steps[0], steps[0]
    assert "val loss" in r.stdout, r.stdout
    with open(log) as f:
        records = [json.loads(line) for line in f]
    losses = [rec["loss"] for rec in records if "loss" in rec]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), records
    assert 9.0 < losses[0] < 12.0, f"first loss {losses[0]}: a fresh GPT-2 starts near ln(50257) = 10.8"
    assert any("val_loss" in rec for rec in records), records


def test_gpu_model_too_large_is_a_clear_error():
    if not gpu_listed():
        raise harness.Skip("no GPU listed by nvidia-smi")
    # 200 layers of hidden 8192 is about 161 B parameters: 2.4 TiB of model state.
    r = run(*GOOD, "--layers", "200", "--hidden", "8192", "--heads", "64")
    expect_error(r, 1, "model state needs", "GiB free")


if __name__ == "__main__":
    try:
        harness.run_module(globals())
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
