#!/usr/bin/env python3
"""bench_generate.py: generation speed of `train_gpt --generate` against Hugging Face transformers, in one run.

Run on a GPU machine with PyTorch and transformers, from the repository root, after `make train_gpt`:
    python3 scripts/bench_generate.py                                   # the whole grid (long: see below)
    python3 scripts/bench_generate.py --models gpt2-124m --batches 1,16 --prompts 16
    python3 scripts/bench_generate.py --out build/bench_generate --tokens 256
    python3 scripts/bench_generate.py --models gpt3-1.3b --batches 1,4 --prompts 16 \
        --baseline ./train_gpt_main --no-hf            # a change against another build, same call

Rows: every --models x --prompts x --batches (default gpt2-124m, gpt3-1.3b, gpt3-2.7b x 16, 2048 x 1, 4,
16, 64), --tokens new tokens per sequence (256), greedy. For each model:
 1. random GPT-2-init weights (numpy, --seed) are written as a bf16 llm.c model file with
    max(--prompts) + --tokens positions (GPT-3's 2048 rows of wpe would not hold a 2048-token prompt and
    its continuation), and exported with scripts/export_hf.py to a Hugging Face GPT-2 folder: both sides
    compute with the same bf16 values (kept in --out and reused when they are there);
 2. ours: `./train_gpt --generate TOKENS --init-from W --prompt-tokens FILE --num-samples B
    --temperature 0` per row; its "speed" line gives the prefill time, the steady time per step (GPU time
    of the replayed CUDA-graph steps, tokens 3..TOKENS) and the wall time of all new tokens, its
    "memory" line what it took;
 3. Hugging Face: GPT2LMHeadModel.from_pretrained(folder, bf16, SDPA attention) and `generate` with
    cache_implementation="static" (transformers then compiles the decoding forward with torch.compile,
    mode reduce-overhead, CUDA graphs), greedy, min_new_tokens = max_new_tokens so that no row stops
    early. Per row, after one untimed run of each length: ms per token = (t(TOKENS) - t(1)) / (TOKENS - 1),
    wall clock around `generate` with the GPU synchronized: the prefill and the first token cancel;
 4. the bounds: the copy rate of a 1 GiB device-to-device copy (bytes read + written, median with the
    L2 flushed, results_common.median_gpu_ms), measured in the same run; weight-read bound = the bf16
    weights a step reads (every parameter but the unused rows of wpe) / that rate; the "+KV" bound adds
    the K and V a step reads at the mean cache length (prompt + TOKENS/2).
With --baseline B (another build of train_gpt), every row also runs B, the two in turns, --rounds times
each (default 3; after one untimed run of the one that goes last), so that both see the same machine
state: the table adds B's median ms per token, ours / B as a speed ratio, and whether every run of both
printed the same tokens (greedy: a change meant to keep the arithmetic must keep them). --no-hf skips
Hugging Face (PyTorch is still used for the copy rate).
The table, printed last, gives ms per token and tokens/s (medians over --rounds), ours / theirs as a speed
ratio (> 1: ours faster), and the fraction of the weight-read bound ours reaches. The log (bench_generate.log),
the records (bench_generate.json, written after every row) and each command's output are in --out.
Time: the whole grid compiles transformers' forward once per row (tens of seconds each) and generates
64 x 2048-token prompts on the 2.7B model; restrict it with --models/--batches/--prompts.

Exit 0 when every row ran, 1 when one failed (recorded, the others still run), 2 on a usage error or when
PyTorch or transformers is missing.
"""
import argparse
import hashlib
import importlib
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402
from results_common import (Report, balanced_orders, binary_build, copy_gbps, parse_list, run_metadata,  # noqa: E402
                            text_table, write_json)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("gpt2-124m", "gpt3-1.3b", "gpt3-2.7b")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"))
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--batches", default="1,4,16,64", help="sequences generated together, a comma list")
    ap.add_argument("--prompts", default="16,2048", help="prompt lengths, a comma list")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per sequence (at least 3)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "build", "bench_generate"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per train_gpt run")
    ap.add_argument("--baseline", help="another train_gpt build, run in turns with ours on every row")
    ap.add_argument("--rounds", type=int, help="runs of each build per row (default 3 with --baseline, else 1)")
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face transformers")
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.baseline else 1
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.baseline:
        if not os.path.isfile(args.baseline):
            ap.error(f"--baseline: no file {args.baseline}")
        args.baseline = os.path.abspath(args.baseline)  # the runs start in the repository root
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in tg.NAMED_SHAPES:
            ap.error(f"--models: unknown model {m!r} (known: {', '.join(tg.NAMED_SHAPES)})")
    try:
        args.batches = parse_list(args.batches, int)
        args.prompts = parse_list(args.prompts, int)
    except ValueError as e:
        ap.error(str(e))
    if not args.models or not args.batches or not args.prompts:
        ap.error("--models, --batches and --prompts need at least one value each")
    if min(args.batches) < 1 or min(args.prompts) < 1:
        ap.error("--batches and --prompts must be positive")
    if args.tokens < 3:
        ap.error("--tokens must be at least 3 (the steady time is over tokens 3..N)")
    return args


def require_torch_and_transformers(hf=True):
    """Exits 2 with what to install when PyTorch (or, with hf, transformers) is missing."""
    missing = []
    for name in ("torch", "transformers") if hf else ("torch",):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"error: bench_generate.py needs {' and '.join(missing)} (the Hugging Face side and the copy "
              f"rate): pip install -r test/requirements.txt", file=sys.stderr)
        sys.exit(2)


SPEED = re.compile(r"prefill (\d+) x (\d+) tokens in ([\d.]+) ms; (\d+) x (\d+) new tokens in ([\d.]+) s: "
                   r"(\d+) tokens/s .*?, ([\d.]+) ms per step(?:; steady ([\d.]+) ms per step, (\d+) tokens/s)?")
MEMORY = re.compile(r"grew by ([\d.]+) MiB")


def parse_train_gpt_output(text):
    """The numbers of `train_gpt --generate`'s speed and memory lines: a dict, or None without a speed line."""
    m = next((SPEED.search(line) for line in text.splitlines() if line.startswith("speed") and SPEED.search(line)),
             None)
    if not m:
        return None
    B, M = int(m.group(4)), int(m.group(5))
    r = {"prefill_ms": float(m.group(3)), "wall_ms_per_token": float(m.group(6)) * 1e3 / M,
         "wall_tokens_per_s": float(m.group(7)), "B": B, "tokens": M}
    r["ms_per_token"] = float(m.group(9)) if m.group(9) else r["wall_ms_per_token"]
    r["tokens_per_s"] = B * 1e3 / r["ms_per_token"]
    mem = next((MEMORY.search(line) for line in text.splitlines() if line.startswith("memory") and
                MEMORY.search(line)), None)
    r["memory_mib"] = float(mem.group(1)) if mem else None
    return r


def weight_read_bytes(cfg):
    """bf16 bytes one decode step reads: every parameter but wpe's rows other than the step's own."""
    wpe = cfg.max_seq_len * cfg.channels
    return 2 * (tg.num_params(cfg) - wpe + cfg.channels)


def kv_read_bytes(cfg, B, length):
    """bf16 bytes of K and V one decode step reads from a cache of `length` positions per sequence."""
    return 2 * 2 * B * length * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim


def model_files(args, name, report):
    """The model's config, bf16 model file and Hugging Face folder (made once, kept in --out)."""
    positions = int(math.ceil((max(args.prompts) + args.tokens) / 64.0) * 64)
    cfg = tg.gpt_config(name, seq_len=positions)
    tag = f"{name}_p{positions}_seed{args.seed}"
    weights = os.path.join(args.out, f"{tag}.bin")
    hf_dir = os.path.join(args.out, f"{tag}_hf")
    if not os.path.exists(weights):
        report(f"{name}: writing random weights ({tg.num_params(cfg) / 1e9:.2f} B parameters) to {weights}")
        tg.write_model_file(weights, cfg, tg.gpt2_init_numpy(cfg, args.seed), dtype="bf16")
    if not args.no_hf and not os.path.exists(os.path.join(hf_dir, "config.json")):
        cmd = [sys.executable, os.path.join(REPO_ROOT, "scripts", "export_hf.py"), weights, hf_dir, "--dtype", "bf16"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            report(f"{name}: export_hf.py failed: {r.stderr.strip()}")
            sys.exit(1)
    return cfg, weights, hf_dir


def tokens_digest(text):
    """A digest of the generated tokens (train_gpt's "tokens" lines, one per sample)."""
    lines = [line.split(None, 1)[-1].strip() for line in text.splitlines() if line.startswith("tokens ")]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12] if lines else None


def run_ours(args, weights, prompt_file, B, P, tag, binary=None):
    cmd = [binary or args.train_gpt, "--generate", str(args.tokens), "--init-from", weights, "--prompt-tokens",
           prompt_file, "--num-samples", str(B), "--temperature", "0"]
    log = os.path.join(args.out, f"train_gpt_{tag}.log")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=args.timeout, cwd=REPO_ROOT)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = f"timeout after {args.timeout} s"
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n" + out)
    parsed = parse_train_gpt_output(out) if rc == 0 else None
    if parsed is None:
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["(no output)"]
        return {"error": f"exit {rc}: {last[0]} (log {log})"}
    parsed["tokens_digest"] = tokens_digest(out)
    return parsed


def time_binaries(args, binaries, weights, prompt_file, B, P, tag):
    """Every build's --rounds runs of one row, in turns (results_common.balanced_orders; before them one
    untimed run of the build that goes last, so that the first timed run also follows another): a list per
    build of run_ours' results, in the order of `binaries`."""
    orders = balanced_orders(len(binaries))
    runs = [[] for _ in binaries]
    if len(binaries) > 1:
        run_ours(args, weights, prompt_file, B, P, f"{tag}_warmup", binaries[orders[-1][-1]])
    for r in range(args.rounds):
        for i in orders[r % len(orders)]:
            label = "ours" if i == 0 else "baseline" if i == 1 else f"build{i}"
            runs[i].append(run_ours(args, weights, prompt_file, B, P, f"{tag}_{label}_r{r + 1}", binaries[i]))
    return runs


def summarize_runs(runs):
    """One build's runs of a row as one result: the first run's numbers with the median ms per token (and
    its tokens/s), each run's ms per token; the first error when a run failed."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return dict(failed[0])
    ms = [r["ms_per_token"] for r in runs]
    out = dict(runs[0], ms_per_token=statistics.median(ms), runs_ms=ms)
    out["tokens_per_s"] = out["B"] * 1e3 / out["ms_per_token"]
    return out


def same_tokens(*builds):
    """Whether every run of every build printed the same tokens (None when a run failed or printed none)."""
    digests = [r.get("tokens_digest") for runs in builds for r in runs]
    return None if not digests or None in digests else len(set(digests)) == 1


def copy_rate():
    """The copy rate (results_common.copy_gbps, as bench_decode.py measures it), the L2 flushed."""
    import torch
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gbps = copy_gbps(flush, 100, 500, 5, 200)
    del flush
    return gbps


def hf_load(hf_dir):
    import torch
    import transformers
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.to("cuda").eval()


def hf_generate_s(model, ids, new_tokens):
    """Wall seconds of one greedy `generate` of new_tokens with the static cache."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", pad_token_id=0)
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return time.perf_counter() - t0


def run_hf(model, prompt, B, M):
    """ms per token of transformers' generate: (t(M) - t(1)) / (M - 1), medians of 3 after a warm-up each."""
    import torch
    ids = torch.tensor([prompt] * B, device="cuda")
    try:
        for n in (1, M):
            hf_generate_s(model, ids, n)  # compiles (the decoding forward for M)
        t1 = statistics.median(hf_generate_s(model, ids, 1) for _ in range(3))
        tm = statistics.median(hf_generate_s(model, ids, M) for _ in range(3))
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {"error": f"out of memory: {str(e).splitlines()[0]}"}
    ms = (tm - t1) * 1e3 / (M - 1)
    return {"ms_per_token": ms, "tokens_per_s": B * 1e3 / ms, "prefill_ms": t1 * 1e3}


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def speed_ratio(ours, other):
    """other's ms per token over ours (> 1: ours faster), as "1.23x", or "-" without both."""
    if "ms_per_token" not in ours or "ms_per_token" not in other:
        return "-"
    return f"{other['ms_per_token'] / ours['ms_per_token']:.2f}x"


def table(records):
    with_baseline = any("baseline" in r for r in records)
    header = ["model", "prompt", "batch", "ours ms/tok", "ours tok/s", "HF ms/tok", "HF tok/s", "ours/HF"]
    header += ["base ms/tok", "ours/base", "same tokens"] if with_baseline else []
    header += ["weight bound ms", "of bound", "+KV bound ms", "ours prefill ms", "ours MiB"]
    rows = []
    for r in records:
        o, h, b = r.get("ours", {}), r.get("hf", {}), r.get("baseline", {})
        of_bound = r["weight_bound_ms"] / o["ms_per_token"] if "ms_per_token" in o else None
        row = [r["model"], str(r["prompt"]), str(r["batch"]), fmt(o.get("ms_per_token"), ".3f"),
               fmt(o.get("tokens_per_s"), ".0f"), fmt(h.get("ms_per_token"), ".3f"), fmt(h.get("tokens_per_s"), ".0f"),
               speed_ratio(o, h)]
        if with_baseline:
            same = r.get("same_tokens")
            row += [fmt(b.get("ms_per_token"), ".3f"), speed_ratio(o, b), {True: "yes", False: "NO"}.get(same, "-")]
        row += [fmt(r["weight_bound_ms"], ".3f"), fmt(of_bound and 100 * of_bound, ".0f") + ("%" if of_bound else ""),
                fmt(r["kv_bound_ms"], ".3f"), fmt(o.get("prefill_ms"), ".1f"), fmt(o.get("memory_mib"), ".0f")]
        rows.append(row)
    return text_table(header, rows, left=(0,))


def bench_model(args, name, meta, gbps, records, report):
    """Every row of one model: ours (and --baseline) first, in separate processes, then transformers in this
    process (unless --no-hf). Each row rewrites bench_generate.json (meta: the run's header)."""
    import torch
    cfg, weights, hf_dir = model_files(args, name, report)
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    for P in args.prompts:
        prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, size=P)]
        prompt_file = os.path.join(args.out, f"prompt_{P}.txt")
        with open(prompt_file, "w") as f:
            f.write(",".join(map(str, prompt)) + "\n")
        for B in args.batches:
            tag = f"{name}_p{P}_b{B}"
            length = P + args.tokens / 2
            rec = {"model": name, "prompt": P, "batch": B, "tokens": args.tokens,
                   "weight_bound_ms": weight_read_bytes(cfg) / (gbps * 1e9) * 1e3,
                   "kv_bound_ms": (weight_read_bytes(cfg) + kv_read_bytes(cfg, B, length)) / (gbps * 1e9) * 1e3}
            builds = [args.train_gpt] + ([args.baseline] if args.baseline else [])
            runs = time_binaries(args, builds, weights, prompt_file, B, P, tag)
            rec["ours"] = summarize_runs(runs[0])
            report(f"{tag}: ours {json.dumps(rec['ours'])}")
            if args.baseline:
                rec["baseline"], rec["same_tokens"] = summarize_runs(runs[1]), same_tokens(*runs)
                report(f"{tag}: baseline {json.dumps(rec['baseline'])}; same tokens: {rec['same_tokens']}")
            rows.append((rec, prompt))
    model = None if args.no_hf else hf_load(hf_dir)
    for rec, prompt in rows:
        if model is not None:
            rec["hf"] = run_hf(model, prompt, rec["batch"], args.tokens)
            report(f"{rec['model']}_p{rec['prompt']}_b{rec['batch']}: HF {json.dumps(rec['hf'])}")
        records.append(rec)
        write_json(os.path.join(args.out, "bench_generate.json"), {**meta, "copy_gbps": gbps, "records": records})
    del model
    torch.cuda.empty_cache()


def main(argv=None):
    args = parse_args(argv)
    require_torch_and_transformers(hf=not args.no_hf)
    import torch
    if not torch.cuda.is_available():
        print("error: bench_generate.py needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    with Report(os.path.join(args.out, "bench_generate.log")) as report:
        meta = run_metadata(args.train_gpt)
        if args.baseline:
            meta["baseline_build"] = binary_build(args.baseline)
        hf_version = "not used" if args.no_hf else __import__("transformers").__version__
        report(f"device {meta['device']}, commit {meta['commit']}, {meta['date']}; torch {torch.__version__}, "
               f"transformers {hf_version}")
        report(f"ours: {args.train_gpt}, built from {meta['build']}" +
               (f"; baseline: {args.baseline}, built from {meta['baseline_build']}" if args.baseline else ""))
        report("$ " + " ".join(shlex.quote(a) for a in sys.argv))
        gbps = copy_rate()
        report(f"copy rate {gbps:.0f} GB/s (1 GiB device-to-device, read + written)")
        records = []
        for name in args.models:
            bench_model(args, name, meta, gbps, records, report)
        report("")
        report(f"greedy, {args.tokens} new tokens per sequence; ms per token: ours the steady CUDA-graph steps (GPU "
               f"time, median of {args.rounds} run(s)), HF (t({args.tokens}) - t(1)) / {args.tokens - 1} (wall); "
               f"ours/HF > 1: ours faster; of bound: the weight-read bound over ours")
        if args.baseline:
            report(f"base: {args.baseline}, run in turns with ours; same tokens: every run of both printed the same")
        report(table(records))
        failed = [r for r in records if any("error" in r.get(k, {}) for k in ("ours", "hf", "baseline"))]
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
