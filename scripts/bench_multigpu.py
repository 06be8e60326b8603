"""bench_multigpu.py: multi-GPU checks and the data-parallel benchmark of ./train_gpt (GPU machine).

Called by scripts/run_multigpu_on_gpu.sh; Python standard library only (plus scripts/train_runs.py,
results_common.py).

  compare A.jsonl B.jsonl --tol X [--steps FIRST-LAST] [--name NAME]
      per-step losses of two train_gpt logs: prints max |Δloss| (and step 1's), PASS/FAIL against X;
      exit 1 on FAIL.
  bench --out-dir DIR [--gpus 2,4] [--zero 0,1] [--steps 6] [--skip 2] [--no-torch] [--results scripts/results]
      GPT3-1.3B at seq 2048, micro batch 8 per GPU, --tokens-per-gpu (131072) per GPU per step (8
      micro steps each: the work per GPU stays the same at every GPU count): train_gpt on one GPU and
      on each N of --gpus (default: all the machine lists) with each ZeRO stage of --zero (default 0,1:
      without and with ZeRO-1; --zero 1 alone saves a run per N when only ZeRO-1 is wanted), and PyTorch +
      torch.compile (scripts/torch_gpt.py bench) on one GPU and data parallel under torchrun
      (DistributedDataParallel) on each N, all in the same run. train_gpt's one-GPU run goes on every
      GPU the largest N uses at once (one process per GPU, CUDA_VISIBLE_DEVICES): under a power cap the
      GPUs of one machine run at different speeds, and a synchronous data-parallel step goes at the pace
      of the slowest. train_gpt's ranks are processes with torchrun-style variables, each one's peak GPU
      memory polled by its pid (train_runs.MemoryPoller). Writes scripts/results/multigpu_<gpu>.json and
      .md: tokens/s, TFLOP/s per GPU (median of the steps after the warm-up), the per-GPU ratio to the
      same implementation's one-GPU run on GPU 0 (x 1 GPU) and, for train_gpt, to the slowest of its
      one-GPU runs on the N GPUs (x slowest), train_gpt's exposed communication per step
      (comm_exposed_ms of its log) and peak memory; PASS/FAIL lines for train_gpt's ratio to GPU 0's
      one-GPU run against --min-ratio (0.99), PyTorch's beside it.
"""
import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402
import torch_gpt as tg  # noqa: E402  (the FLOPs formula; PyTorch itself runs in the child)
import train_runs  # noqa: E402

REPO = train_runs.REPO_ROOT


def losses(path):
    return {r["step"]: r["loss"] for r in train_runs.read_step_records(path)}


def compare(args):
    a, b = losses(args.a), losses(args.b)
    first, last = (int(x) for x in args.steps.split("-")) if args.steps else (1, max(a) if a else 0)
    steps = [s for s in range(first, last + 1)]
    missing = [s for s in steps if s not in a or s not in b]
    if missing or not steps:
        print(f"FAIL {args.name}: steps missing from the logs: {missing[:10]} ({args.a}: {len(a)} steps, "
              f"{args.b}: {len(b)} steps)")
        return 1
    deltas = {s: abs(a[s] - b[s]) for s in steps}
    worst = max(deltas, key=deltas.get)
    identical = all(a[s] == b[s] for s in steps)
    ok = deltas[worst] <= args.tol
    print(f"{'PASS' if ok else 'FAIL'} {args.name}: steps {first}-{last}, max |dloss| {deltas[worst]:.2e} at step "
          f"{worst} ({a[worst]:.6f} vs {b[worst]:.6f}), first step {deltas[first]:.2e}, tolerance {args.tol:g}"
          f"{', bit-identical' if identical else ''}; losses {a[first]:.4f} -> {a[last]:.4f}")
    return 0 if ok else 1


# ---- benchmark ---------------------------------------------------------------------------------

MODEL, SEQ, MICRO = "gpt3-1.3b", 2048, 8


def visible_gpus():
    """How many GPUs nvidia-smi lists (0 without it)."""
    rows = results_common.nvidia_smi(["--query-gpu=index"])
    return len(rows) if rows else 0


def median_of(records, field, skip):
    values = [r[field] for r in records[skip:] if isinstance(r.get(field), (int, float))]
    return round(statistics.median(values), 3) if values else None


def run_ours(args, world, zero, gpu=None):
    """train_gpt on `world` GPUs (torchrun-style variables; world 1: on GPU `gpu`, default 0), its
    steady state and exposed communication."""
    common = ["--model", MODEL, "--seq-len", str(SEQ), "--batch-size", str(MICRO), "--total-batch-tokens",
              str(args.tokens_per_gpu * world), "--max-steps", str(args.steps), "--val-data", "", "--train-data",
              args.train_data]
    tag = f"bench_{MODEL}_train_gpt_{world}gpu_zero{zero}" + (f"_gpu{gpu}" if gpu is not None else "")
    log = os.path.join(args.out_dir, f"{tag}.jsonl")
    env = {"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else None
    run = train_runs.run_train_gpt_ranks(common + (["--zero", str(zero)] if world > 1 else []), log, world,
                                         args.timeout, env=env)
    rec = {"impl": "train_gpt", "gpus": world, "zero": zero, "gpu": gpu if gpu is not None else 0,
           "returncode": run.returncode,
           "steps_logged": len(run.records), "peak_mem_gb": [round(m / 1024, 2) for m in run.peak_mem_mib_per_rank],
           "log": os.path.relpath(log, REPO)}
    summary = train_runs.steady_state(run.records, args.skip)
    if summary and run.returncode == 0:
        rec.update(ms=round(summary["ms"], 1), tokens_per_s=round(summary["tokens_per_s"], 1),
                   tflops_per_gpu=round(summary["tflops_per_gpu"], 2), mfu=round(summary["mfu"], 4))
        if world > 1:
            rec["comm_exposed_ms"] = median_of(run.records, "comm_exposed_ms", args.skip)
    else:
        rec["error"] = f"exit {run.returncode}; see {args.out_dir}/{tag}.rank*.out"
    return rec


def run_ours_each_gpu(args, n):
    """train_gpt's one-GPU run on GPUs 0 .. n-1 at once, one process each."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda g: run_ours(args, 1, 0, gpu=g), range(n)))


def run_torch(args, world):
    """PyTorch + torch.compile (scripts/torch_gpt.py bench), DistributedDataParallel under torchrun."""
    tag = f"bench_{MODEL}_torch_{world}gpu"
    result, out = os.path.join(args.out_dir, f"{tag}.json"), os.path.join(args.out_dir, f"{tag}.out")
    launch = [args.python] if world == 1 else [args.python, "-m", "torch.distributed.run", "--nproc-per-node",
                                                str(world), "--master-port", str(29500 + random.randrange(2000))]
    cmd = launch + [os.path.join(REPO, "scripts", "torch_gpt.py"), "bench", "--model", MODEL, "--seq-len", str(SEQ),
                    "--batch-size", str(MICRO), "--total-batch-tokens", str(args.tokens_per_gpu * world),
                    "--steps", str(args.steps),
                    "--train-data", args.train_data, "--result-json", result]
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    with open(out, "w") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = -1
    rec = {"impl": "torch", "gpus": world, "zero": 0, "returncode": code, "log": os.path.relpath(out, REPO)}
    try:
        with open(result) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {}
    timed = res.get("step_ms", [])[args.skip:]
    if code == 0 and res.get("status") == "ok" and timed:
        ms = statistics.median(timed)
        tokens = args.tokens_per_gpu * world
        flops = tg.flops_per_sequence(tg.gpt_config(MODEL, seq_len=SEQ), SEQ) * (tokens / SEQ)
        rec.update(ms=round(ms, 1), tokens_per_s=round(tokens / (ms / 1e3), 1),
                   tflops_per_gpu=round(flops / world / (ms / 1e3) / 1e12, 2), torch=res.get("torch"))
    else:
        rec["error"] = f"exit {code}, status {res.get('status')}: {res.get('message', '')}; see {out}"
    return rec


def add_ratios(records):
    """Each record's per-GPU TFLOP/s over its implementation's one-GPU record on GPU 0 of the same run, and
    for several GPUs over the slowest one-GPU record among the GPUs it used (where there is one per GPU)."""
    singles = [r for r in records if r["gpus"] == 1 and "tflops_per_gpu" in r]
    base = {r["impl"]: r for r in singles if r.get("gpu", 0) == 0}
    for r in records:
        b = base.get(r["impl"])
        if b and "tflops_per_gpu" in r:
            r["per_gpu_vs_1gpu"] = round(r["tflops_per_gpu"] / b["tflops_per_gpu"], 4)
        used = [s for s in singles if s["impl"] == r["impl"] and s.get("gpu", 0) < r["gpus"]]
        if r["gpus"] > 1 and "tflops_per_gpu" in r and len(used) == r["gpus"]:
            r["per_gpu_vs_slowest_1gpu"] = round(r["tflops_per_gpu"] / min(s["tflops_per_gpu"] for s in used), 4)


def write_results(args, records):
    meta = results_common.run_metadata(train_runs.TRAIN_GPT)
    slug = results_common.gpu_slug(meta["device"])
    result = dict(meta, what=f"data-parallel training, {MODEL} seq {SEQ}, micro batch {MICRO} per GPU, "
                  f"{args.tokens_per_gpu} tokens per GPU per step: train_gpt (NCCL, ZeRO 0 and 1) and PyTorch + torch.compile (DDP under torchrun) "
                  f"on 1 GPU and on {', '.join(map(str, args.gpus))}, the same run; median of the steps after "
                  f"{args.skip} warm-up steps", records=records)
    json_path = os.path.join(args.results, f"multigpu_{slug}.json")
    os.makedirs(args.results, exist_ok=True)
    results_common.write_json(json_path, result)
    lines = [f"# Data-parallel training on {meta['device']}", "", f"{meta['date']}, commit {meta['commit']}: "
             f"`{meta['command']}`", "", f"{MODEL}, seq {SEQ}, micro batch {MICRO} per GPU, {args.tokens_per_gpu} "
             f"tokens per GPU per optimizer step (accumulation), flash2 / SDPA flash; median of steps "
             f"{args.skip + 1}-{args.steps}. TFLOP/s per GPU; x 1 GPU: against the same implementation's one-GPU "
             "run on GPU 0; x slowest: against the slowest of train_gpt's one-GPU runs on the GPUs used (run at "
             "once, one per GPU); comm: the ms per step train_gpt's compute stream waited on communication.", "",
             "| impl | GPUs | GPU | ZeRO | tokens/s | TFLOP/s per GPU | x 1 GPU | x slowest | comm exposed ms | "
             "peak GiB per rank |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        where = r.get("gpu", 0) if r["gpus"] == 1 else "all"
        lines.append(f"| {r['impl']} | {r['gpus']} | {where} | {r['zero']} | {r.get('tokens_per_s', 'n/a')} | "
                     f"{r.get('tflops_per_gpu', r.get('error', 'n/a'))} | {r.get('per_gpu_vs_1gpu', 'n/a')} | "
                     f"{r.get('per_gpu_vs_slowest_1gpu', '-')} | {r.get('comm_exposed_ms', '-')} | "
                     f"{', '.join(str(m) for m in r.get('peak_mem_gb', [])) or '-'} |")
    results_common.write_text(json_path[:-5] + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines[6:]))
    print(f"wrote {json_path} and {json_path[:-5]}.md")


def bench(args):
    os.makedirs(args.out_dir, exist_ok=True)
    if args.train_gpt:
        train_runs.TRAIN_GPT = args.train_gpt
    if not args.gpus:
        n = visible_gpus()
        args.gpus = [n] if n >= 2 else [2]
    records = run_ours_each_gpu(args, max(args.gpus))
    for n in args.gpus:
        records += [run_ours(args, n, zero) for zero in args.zero]
    if args.torch:
        records += [run_torch(args, 1)] + [run_torch(args, n) for n in args.gpus]
    add_ratios(records)
    for r in records:
        print(json.dumps(r), flush=True)
    write_results(args, records)
    ok = all("tflops_per_gpu" in r for r in records)
    for r in records:
        if r["impl"] == "train_gpt" and r["gpus"] > 1:
            ratio = r.get("per_gpu_vs_1gpu", 0)
            torch_ratio = next((t.get("per_gpu_vs_1gpu") for t in records if t["impl"] == "torch"
                                and t["gpus"] == r["gpus"]), None)
            print(f"{'PASS' if ratio >= args.min_ratio else 'FAIL'} bench_{r['gpus']}gpu_zero{r['zero']}: per-GPU "
                  f"TFLOP/s {ratio} of one GPU (want >= {args.min_ratio}; PyTorch DDP: {torch_ratio}), "
                  f"{r.get('per_gpu_vs_slowest_1gpu')} of the slowest GPU alone, comm exposed "
                  f"{r.get('comm_exposed_ms')} ms per step")
            ok = ok and ratio >= args.min_ratio
    return 0 if ok else 1


def zero_stages(text):
    """--zero's value: a comma-separated list of 0 and 1."""
    stages = [x for x in text.split(",") if x]
    if not stages or any(x not in ("0", "1") for x in stages):
        raise argparse.ArgumentTypeError(f"{text!r}: give ZeRO stages 0 and/or 1, comma-separated (e.g. 1 or 0,1)")
    return [int(x) for x in stages]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--steps", default="")
    c.add_argument("--name", default="losses")
    b = sub.add_parser("bench")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--gpus", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="GPU counts to run besides one, e.g. 2,4 (default: every GPU the machine lists)")
    b.add_argument("--zero", type=zero_stages, default=[0, 1],
                   help="ZeRO stages of train_gpt's multi-GPU runs, e.g. 1 or 0,1 (default 0,1)")
    b.add_argument("--steps", type=int, default=6)
    b.add_argument("--tokens-per-gpu", type=int, default=131072, help="tokens per GPU per optimizer step")
    b.add_argument("--skip", type=int, default=2)
    b.add_argument("--timeout", type=int, default=240)
    b.add_argument("--train-data", default="data/tinyshakespeare/tinyshakespeare_train_*.bin")
    b.add_argument("--results", default=os.path.join(REPO, "scripts", "results"))
    b.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch DDP side")
    b.add_argument("--python", default=sys.executable, help="the Python that runs torch_gpt.py (default: this one)")
    b.add_argument("--train-gpt", default=None, help="the train_gpt binary (default: ./train_gpt)")
    b.add_argument("--min-ratio", type=float, default=0.99,
                   help="per-GPU TFLOP/s of train_gpt on N GPUs over one GPU to pass (default 0.99)")
    args = ap.parse_args(argv)
    return compare(args) if args.cmd == "compare" else bench(args)


if __name__ == "__main__":
    sys.exit(main())
