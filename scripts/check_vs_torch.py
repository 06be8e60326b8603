#!/usr/bin/env python3
"""check_vs_torch.py: train_gpt against an fp32 PyTorch model on the same weights and batches.

Run on a GPU machine with PyTorch, from the repository root, after `make train_gpt`:
    python3 scripts/check_vs_torch.py                       # naive and flash2, gpt2-124m shape with 2 layers
    python3 scripts/check_vs_torch.py --attn flash2 --layers 4 --heads 6 --out build/check_vs_torch

What it does:
 1. builds the model in PyTorch (scripts/torch_gpt.py), GPT-2 init from --seed, and writes its weights as an
    fp32 model file (llm.c's format); writes one token shard: the first tokens of the Tiny Shakespeare
    training shard when it is there (`make train` makes it), else random tokens from a skewed distribution
    (so the loss can fall);
 2. trains the PyTorch model in fp32 (fp32 weights and math, TF32 off, SDPA's math backend) for --steps
    AdamW steps on the batches train_gpt's loader serves, with train_gpt's schedule, clipping and
    accumulation, keeping the gradients of step 1 (before clipping); then the same in bf16 autocast
    ("torch-bf16"), to show how far PyTorch's own bf16 training is from fp32 on the same data (it sets
    the loss-curve bound of a step where it is far off: see Tolerances);
 3. for each backend of --attn runs
      ./train_gpt --init-from W --dump-grads G --train-data SHARD --val-data "" --batch-size B --seq-len T
                  --total-batch-tokens B*T*ACCUM --max-steps S --lr ... --log-file L.jsonl --attn X (+ shape)
    and compares with the fp32 reference:
      (a) the loss of step 1                          |ours − ref| / ref            ≤ --loss-tol  (2e-3)
      (b) each of the 16 gradient tensors of step 1   ‖ours − ref‖ / ‖ref‖          ≤ --grad-tol  (3e-2)
          and the gradient norm of step 1             |ours − ref| / ref            ≤ --grad-tol
      (c) the loss of every step                      |ours − ref|                  ≤ --curve-tol (see below)
      (d) the learning rate of every step (log)       |ours − ref| / ref            ≤ 1e-5
 4. prints the tables and a PASS/FAIL line per check; exits 1 when anything fails (2 on a usage error).
    With --out DIR everything is kept there: check_vs_torch.log (the report), the weights, the shard, the
    logs and gradient dumps of train_gpt; without it they go to a temporary folder that is removed.

Tolerances. Ours keeps bf16 weights, activations and gradients with fp32 accumulation; the reference is
fp32 throughout and starts from the unrounded fp32 weights. bf16's unit roundoff is 2^-8 ≈ 3.9e-3: each
weight is rounded once, each activation and gradient on the way is rounded again, and independent roundings
add up in quadrature, so a correct trainer lands near 0.5-1e-2 per gradient tensor (test_gpu_gpt measures
~5e-3 against an fp64 model on the same bf16 weights; the torch-bf16 column shows the same scale here). A
wiring or scaling error (heads split wrongly, a transposed weight, a missing bias, a wrong loss scale with
accumulation) moves a tensor by O(1). 3e-2 leaves a 3-6x margin, as test_gpu_gpt's bound. The step-1 loss
averages the per-token rounding noise over B*T*ACCUM tokens, hence the tighter 2e-3 (0.02 nats at 10.9).
The loss curve: after step 1 the two trainings drift apart by the compounding of that noise through the
AdamW updates (the first updates are ±lr per weight whatever the gradient's size, so noise in small
gradients flips updates); at lr 1e-3 over 20 steps that drift stays within a few 0.01 nats, hence
--curve-tol 0.1 nats absolute (about 1% of the loss), which a missing bias correction, a wrong clip, a
wrong schedule or wrong batches exceeds within a few steps. One batch can be far more sensitive than the
rest: on a loss spike (fp32 7.0 -> 10.0 -> 7.0 on one batch of the --kv-heads 4 run) every bf16 training
lands tenths of a nat from fp32, PyTorch's own included. So where torch-bf16 ran, a step's bound is the
larger of --curve-tol and CURVE_BF16_FACTOR (2) times torch-bf16's own distance from fp32 at that step: we
must stay as close to fp32 as PyTorch's bf16 training is, within a factor of two, which the errors above
still exceed at once (they move every step, not one).
"""
import argparse
import contextlib
import glob
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_format  # noqa: E402
import torch_gpt as tg  # noqa: E402
from results_common import Report  # noqa: E402  (prints lines and keeps them for the log file)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_SHAKESPEARE = os.path.join(REPO_ROOT, "data", "tinyshakespeare", "tinyshakespeare_train_*.bin")
LR_TOL = 1e-5  # the JSONL log prints lr with 7 significant digits
CURVE_BF16_FACTOR = 2.0  # a step's loss may be this many times as far from fp32 as torch-bf16's


def parse_args():
    p = argparse.ArgumentParser(description="Check train_gpt's loss, gradients and training against PyTorch.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--attn", default="naive,flash2", help="backends to check, comma-separated (default naive,flash2)")
    p.add_argument("--model", default="gpt2-124m", choices=sorted(tg.NAMED_SHAPES), help="shape (default gpt2-124m)")
    p.add_argument("--layers", type=int, default=2, help="layers (default 2; 0 = the model's)")
    p.add_argument("--hidden", type=int, default=0, help="hidden size (default 0 = the model's)")
    p.add_argument("--heads", type=int, default=0, help="heads (default 0 = the model's)")
    p.add_argument("--kv-heads", type=int, default=0,
                   help="key/value heads, grouped-query attention (default 0 = the heads: multi-head)")
    p.add_argument("--batch-size", type=int, default=4, help="micro batch B (default 4)")
    p.add_argument("--seq-len", type=int, default=256, help="T (default 256)")
    p.add_argument("--grad-accum", type=int, default=2, help="micro steps per optimizer step (default 2)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps compared (default 20)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup-steps", type=int, default=5, help="(default 5)")
    p.add_argument("--min-lr-fraction", type=float, default=0.1, help="(default 0.1)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="(default 0.1)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="(default 1.0)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the GPT-2 init (default 1337)")
    p.add_argument("--data", default=TINY_SHAKESPEARE,
                   help="where the tokens come from (default: the Tiny Shakespeare training shard; random "
                        "tokens when no file matches)")
    p.add_argument("--grad-tol", type=float, default=3e-2, help="gradient tensors and norm (default 3e-2)")
    p.add_argument("--loss-tol", type=float, default=2e-3, help="step-1 loss, relative (default 2e-3)")
    p.add_argument("--curve-tol", type=float, default=0.1, help="per-step loss, absolute nats (default 0.1)")
    p.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"), help="the binary (default ./train_gpt)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per train_gpt run (default 600)")
    p.add_argument("--device", default="cuda", help="torch device of the reference (default cuda)")
    p.add_argument("--skip-torch-bf16", action="store_true",
                   help="skip PyTorch's bf16 autocast training (shown for scale only; slow on a CPU)")
    p.add_argument("--out", help="keep every file and the report (check_vs_torch.log) in this folder")
    args = p.parse_args()
    args.attn = [a.strip() for a in args.attn.split(",") if a.strip()]
    if not args.attn:
        p.error("--attn names no backend")
    if min(args.batch_size, args.seq_len, args.grad_accum, args.steps) < 1:
        p.error("--batch-size, --seq-len, --grad-accum and --steps must be >= 1")
    try:
        args.cfg = tg.gpt_config(args.model, args.layers, args.hidden, args.heads, args.seq_len, args.kv_heads)
    except ValueError as err:
        p.error(str(err))
    return args


# ---------------------------------------------------------------------------------------------
# Inputs: weights and data

def write_check_shard(path, args, report):
    """One shard with the tokens the run needs (steps · accum · B · T + 1): real text when there is some."""
    needed = args.steps * args.grad_accum * args.batch_size * args.seq_len + 1
    paths = sorted(glob.glob(args.data)) if any(c in args.data for c in "*?[") else \
        ([args.data] if os.path.exists(args.data) else [])
    if paths:
        tokens = np.concatenate([shard_format.read_shard(p) for p in paths])[:needed]
        what = f"the first {tokens.size} tokens of {args.data}"
        if tokens.size < needed:
            what += f" (fewer than the {needed} of {args.steps} steps: the loader wraps, and so do the batches here)"
    else:
        # Random, but skewed (Zipf over 2000 token ids), so there is something to learn in 20 steps.
        rng = np.random.default_rng(args.seed)
        ids = rng.choice(tg.VOCAB_SIZE, 2000, replace=False)
        weights = 1.0 / np.arange(1, 2001)
        tokens = ids[rng.choice(2000, needed, p=weights / weights.sum())]
        what = f"{needed} random tokens (Zipf over 2000 ids; no file matches {args.data})"
    shard_format.write_shard(path, tokens)
    report(f"data         {what}")


# ---------------------------------------------------------------------------------------------
# The PyTorch reference

def torch_training(args, init, shard, mode):
    """Trains from the weights `init` for args.steps steps. mode "fp32": fp32 weights and math, TF32 off,
    SDPA math backend; "bf16": bf16 autocast with PyTorch's default SDPA choice.
    Returns {"losses", "norms", "lrs": per step, "grads": the 16 step-1 gradients (numpy fp32)}."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    model = tg.GPT(args.cfg)
    tg.load_stacked_(model, init)
    model.to(args.device)
    optimizer = tg.make_adamw(model, args.lr, args.weight_decay)
    batches = tg.Batches(shard, args.batch_size, args.seq_len)
    out = {"losses": [], "norms": [], "lrs": [], "grads": None}

    def keep_grads():
        if out["grads"] is None:
            out["grads"] = [g.float().cpu().numpy() for g in tg.stacked_tensors(model, grads=True)]

    with tg.sdpa_context("math") if mode == "fp32" else contextlib.nullcontext():
        for step in range(1, args.steps + 1):
            lr = tg.learning_rate(step, args.steps, args.lr, args.warmup_steps, args.min_lr_fraction)
            loss, norm = tg.train_step(model, optimizer, batches, args.grad_accum, lr, args.grad_clip, args.device,
                                       autocast_dtype=None if mode == "fp32" else torch.bfloat16,
                                       before_clip=keep_grads if step == 1 else None)
            out["losses"].append(float(loss))
            out["norms"].append(float(norm))
            out["lrs"].append(lr)
    return out


# ---------------------------------------------------------------------------------------------
# train_gpt

def train_gpt_command(args, attn, init_path, shard, grads_path, log_path):
    cmd = [args.train_gpt, "--init-from", init_path, "--dump-grads", grads_path, "--train-data", shard,
           "--val-data", "", "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
           "--total-batch-tokens", str(args.batch_size * args.seq_len * args.grad_accum),
           "--max-steps", str(args.steps), "--lr", repr(args.lr), "--warmup-steps", str(args.warmup_steps),
           "--min-lr-fraction", repr(args.min_lr_fraction), "--weight-decay", repr(args.weight_decay),
           "--grad-clip", repr(args.grad_clip), "--log-file", log_path, "--attn", attn, "--model", args.model,
           "--checkpoint-dir", "none", "--sample-tokens", "0"]
    for flag, value in (("--layers", args.layers), ("--hidden", args.hidden), ("--heads", args.heads),
                        ("--kv-heads", args.kv_heads)):
        if value:
            cmd += [flag, str(value)]
    return cmd


def read_step_log(path):
    """The per-step records of a train_gpt JSONL log ({"step", "loss", "lr", "grad_norm", ...}), by step;
    validation lines ({"step", "val_loss"}) are skipped."""
    steps = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                if "val_loss" not in record and "loss" in record:
                    steps[int(record["step"])] = record
    return steps


def run_train_gpt(args, attn, init_path, shard, work, report):
    """Runs train_gpt with one backend. Returns {"losses", "norms", "lrs", "grads", "grads_dtype"} or
    {"error": why}; its output goes to work/train_gpt_<attn>.log."""
    grads_path = os.path.join(work, f"grads_{attn}.bin")
    log_path = os.path.join(work, f"train_gpt_{attn}.jsonl")
    out_path = os.path.join(work, f"train_gpt_{attn}.log")
    for stale in (grads_path, log_path):
        if os.path.exists(stale):
            os.unlink(stale)
    cmd = train_gpt_command(args, attn, init_path, shard, grads_path, log_path)
    report(f"$ {shlex.join(cmd)}")
    try:
        with open(out_path, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout,
                                cwd=REPO_ROOT).returncode
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.timeout:g} s (see {out_path})"}
    except OSError as err:
        return {"error": f"cannot run {args.train_gpt}: {err}"}
    if rc != 0:
        with open(out_path, errors="replace") as f:
            tail = [line.rstrip() for line in f if line.strip()][-3:]
        return {"error": f"exit {rc}: " + " / ".join(tail)}
    try:
        steps = read_step_log(log_path)
        cfg, dtype, grads = tg.read_model_file(grads_path)
    except (OSError, ValueError) as err:
        return {"error": str(err)}
    if cfg != args.cfg:
        return {"error": f"{grads_path}: header says {cfg}, the run was {args.cfg}"}
    missing = [s for s in range(1, args.steps + 1) if s not in steps]
    if missing:
        return {"error": f"{log_path}: no record for step(s) {missing[:5]}"}
    return {"losses": [steps[s]["loss"] for s in range(1, args.steps + 1)],
            "norms": [steps[s].get("grad_norm", float("nan")) for s in range(1, args.steps + 1)],
            "lrs": [steps[s].get("lr", float("nan")) for s in range(1, args.steps + 1)],
            "grads": grads, "grads_dtype": dtype}


# ---------------------------------------------------------------------------------------------
# Comparison

def rel_error(x, ref):
    """‖x − ref‖ / ‖ref‖ in fp64; inf when x is not finite."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        return math.inf
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / denom) if denom > 0 else float(np.linalg.norm(x))


def fmt(e):
    return f"{e:.2e}" if math.isfinite(e) else "nan/inf"


def curve_bounds(curve_tol, yard, ref):
    """Per step: curve_tol, or CURVE_BF16_FACTOR times torch-bf16's distance from fp32 where that is larger."""
    if not yard:
        return [curve_tol] * len(ref["losses"])
    return [max(curve_tol, CURVE_BF16_FACTOR * abs(y - x)) if math.isfinite(y) else curve_tol
            for y, x in zip(yard["losses"], ref["losses"])]


def compare(args, ref, yard, results, report):
    """Prints the tables; returns the failures (strings). yard (torch-bf16, maybe None) is not checked; it
    widens a step's loss bound where it is itself far from fp32 (curve_bounds)."""
    failures = [f"{a}: train_gpt failed: {r['error']}" for a, r in results.items() if "error" in r]
    ours = {a: r for a, r in results.items() if "error" not in r}
    columns = ([("torch-bf16", yard)] if yard else []) + list(ours.items())
    heading = " ".join(f"{name:>11}" for name, _ in columns)

    report()
    report(f"(b) step-1 gradients: ||x - ref|| / ||ref|| against PyTorch fp32, bound {args.grad_tol:g}" +
           (" (torch-bf16: PyTorch's bf16 autocast, for scale)" if yard else ""))
    report(f"{'tensor':10} {'shape':>18} {'||ref||':>10} {heading}")
    for i, (name, shape) in enumerate(tg.param_shapes(args.cfg)):
        cells = []
        for col, r in columns:
            e = rel_error(r["grads"][i], ref["grads"][i])
            bad = col in ours and not e <= args.grad_tol
            cells.append(fmt(e) + (" !" if bad else ""))
            if bad:
                failures.append(f"{col}: d{name} rel err {fmt(e)} > {args.grad_tol:g}")
        report(f"{name:10} {str(shape):>18} {np.linalg.norm(ref['grads'][i]):10.3e} " +
               " ".join(f"{c:>11}" for c in cells))
    cells = []
    for col, r in columns:
        e = abs(r["norms"][0] - ref["norms"][0]) / ref["norms"][0]
        cells.append(fmt(e))
        if col in ours and not e <= args.grad_tol:
            failures.append(f"{col}: step-1 gradient norm {r['norms'][0]:.4f} vs {ref['norms'][0]:.4f}")
    report(f"{'grad norm':10} {'':>18} {ref['norms'][0]:10.3e} " + " ".join(f"{c:>11}" for c in cells))
    for a, r in ours.items():
        if r["grads_dtype"] != "bf16":
            report(f"note: {a}'s gradient dump is {r['grads_dtype']} (version 3), not bf16 (version 5)")

    report()
    report(f"(a) step-1 loss, bound {args.loss_tol:g} relative; (c) loss per step, bound {args.curve_tol:g} "
           f"nats" + (f" or {CURVE_BF16_FACTOR:g} x torch-bf16's |loss - ref| where larger" if yard else "") +
           f"; (d) lr per step, bound {LR_TOL:g} relative")
    report(f"{'step':>4} {'lr':>10} {'fp32 ref':>9} {heading}   loss - ref: " + " ".join(
        f"{name:>10}" for name, _ in columns))
    for s in range(args.steps):
        report(f"{s + 1:4d} {ref['lrs'][s]:10.3e} {ref['losses'][s]:9.4f} " +
               " ".join(f"{r['losses'][s]:11.4f}" for _, r in columns) + "               " +
               " ".join(f"{r['losses'][s] - ref['losses'][s]:+10.4f}" for _, r in columns))
    for col, r in columns:
        loss_err = abs(r["losses"][0] - ref["losses"][0]) / ref["losses"][0]
        diffs = [abs(x - y) if math.isfinite(x) else math.inf for x, y in zip(r["losses"], ref["losses"])]
        worst = int(np.argmax(diffs))
        bounds = curve_bounds(args.curve_tol, yard, ref)
        over = [s for s in range(args.steps) if not diffs[s] <= bounds[s]]
        bad_lr = [s for s in range(args.steps) if col in ours and
                  not abs(r["lrs"][s] - ref["lrs"][s]) <= LR_TOL * max(abs(ref["lrs"][s]), 1e-30)]
        report(f"{col}: step-1 loss rel err {fmt(loss_err)}; largest |loss - ref| {diffs[worst]:.4f} at step "
               f"{worst + 1}" + (f"; lr {'differs' if bad_lr else 'matches'} at every step" if col in ours else ""))
        if col not in ours:
            continue
        if not loss_err <= args.loss_tol:
            failures.append(f"{col}: step-1 loss {r['losses'][0]:.6f} vs {ref['losses'][0]:.6f} "
                            f"(rel {fmt(loss_err)} > {args.loss_tol:g})")
        for s in over[:1]:
            failures.append(f"{col}: loss at step {s + 1} {r['losses'][s]:.4f} vs {ref['losses'][s]:.4f} "
                            f"(|diff| {diffs[s]:.4f} > {bounds[s]:.4f}; {len(over)} steps over their bound)")
        if bad_lr:
            s = bad_lr[0]
            failures.append(f"{col}: lr at step {s + 1} is {r['lrs'][s]:.6e}, the schedule says {ref['lrs'][s]:.6e} "
                            f"({len(bad_lr)} steps differ)")
    fell = ref["losses"][0] - ref["losses"][-1]
    if fell < 0.5:
        report(f"note: the reference loss fell only {fell:.3f} in {args.steps} steps; the curve check means "
               "little (raise --lr or --steps)")
    return failures


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as err:
        sys.exit(f"check_vs_torch.py: error: {err}; run this on a GPU machine with PyTorch")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("check_vs_torch.py: error: no CUDA GPU visible to PyTorch")
    if not os.path.exists(args.train_gpt):
        sys.exit(f"check_vs_torch.py: error: {args.train_gpt} not found; build it with `make train_gpt`")
    work = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="check_vs_torch_")
    os.makedirs(work, exist_ok=True)
    report = Report()
    cfg = args.cfg
    failures = ["did not finish"]
    try:
        report(f"check_vs_torch: {shlex.join([os.path.basename(sys.executable)] + sys.argv)}")
        report(f"model        {args.model}: L{cfg.num_layers} C{cfg.channels} NH{cfg.num_heads} NKV{cfg.num_kv_heads} "
               f"(head dim {cfg.head_dim}), maxT = T = {args.seq_len}, {tg.num_params(cfg)} parameters")
        report(f"batch        B {args.batch_size} x T {args.seq_len} x {args.grad_accum} micro steps; "
               f"{args.steps} steps, lr {args.lr:g} (warmup {args.warmup_steps}, cosine to x{args.min_lr_fraction:g}), "
               f"weight decay {args.weight_decay:g}, clip {args.grad_clip:g}")
        device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
        report(f"reference    PyTorch {torch.__version__} on {device_name}")

        model = tg.GPT(cfg)
        tg.gpt2_init_(model, args.seed)  # on the CPU: the same weights on every machine
        init = [t.numpy().copy() for t in tg.stacked_tensors(model)]
        del model
        init_path, shard = os.path.join(work, "init_fp32.bin"), os.path.join(work, "train.bin")
        tg.write_model_file(init_path, cfg, init, "fp32")
        write_check_shard(shard, args, report)

        ref = torch_training(args, init, shard, "fp32")
        yard = None if args.skip_torch_bf16 else torch_training(args, init, shard, "bf16")
        report(f"fp32 reference: loss {ref['losses'][0]:.4f} at step 1, {ref['losses'][-1]:.4f} at step {args.steps}")
        results = {attn: run_train_gpt(args, attn, init_path, shard, work, report) for attn in args.attn}
        failures = compare(args, ref, yard, results, report)

        report()
        for f in failures:
            report(f"FAIL {f}")
        verdict = "FAIL" if failures else "PASS"
        report(f"{verdict}: {', '.join(args.attn)} against PyTorch fp32 "
               f"({len(failures)} failure{'s' if len(failures) != 1 else ''})")
    finally:
        if args.out:
            with open(os.path.join(work, "check_vs_torch.log"), "w") as f:
                f.write("\n".join(report.lines) + "\n")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
