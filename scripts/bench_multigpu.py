"""bench_multigpu.py: multi-GPU checks and the data-parallel benchmark of ./train_gpt (GPU machine).

Called by scripts/run_multigpu_on_gpu.sh; Python standard library only (plus scripts/train_runs.py,
results_common.py).

  compare A.jsonl B.jsonl --tol X [--steps FIRST-LAST] [--name NAME]
      per-step losses of two train_gpt logs: prints max |Δloss| (and step 1's), PASS/FAIL against X;
      exit 1 on FAIL.
  bench --out-dir DIR [--steps 6] [--skip 2] [--results scripts/results]
      GPT3-1.3B at seq 2048, micro batch 8, 131072 tokens per step: one GPU (accumulating 8
      micro steps), two GPUs (4 each) without and with --zero 1, in the same run. Two-GPU runs are
      two processes with torchrun-style variables, so each one's peak GPU memory is polled by its pid
      (train_runs.MemoryPoller). Writes scripts/results/multigpu_<gpu>.json and .md: tokens/s,
      TFLOP/s and MFU per GPU (median of the steps after the warm-up), peak memory per rank, and the
      ratios 2 GPUs / 1 GPU.
"""
import argparse
import json
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402
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

def bench(args):
    os.makedirs(args.out_dir, exist_ok=True)
    common = ["--model", "gpt3-1.3b", "--seq-len", "2048", "--batch-size", "8", "--total-batch-tokens", "131072",
              "--max-steps", str(args.steps), "--val-data", "", "--train-data", args.train_data]
    configs = [(1, 0), (2, 0), (2, 1)]
    records = []
    for world, zero in configs:
        tag = f"bench_gpt3-1.3b_{world}gpu_zero{zero}"
        log = os.path.join(args.out_dir, f"{tag}.jsonl")
        run = train_runs.run_train_gpt_ranks(common + ["--zero", str(zero)] if world > 1 else common, log, world,
                                             args.timeout)
        codes, peaks, steps = [run.returncode], run.peak_mem_mib_per_rank, run.records
        summary = train_runs.steady_state(steps, args.skip)
        rec = {"gpus": world, "zero": zero, "model": "gpt3-1.3b", "seqlen": 2048, "micro_batch": 8,
               "total_batch_tokens": 131072, "accumulation_steps": 131072 // (8 * 2048 * world),
               "returncodes": codes, "steps_logged": len(steps),
               "peak_mem_gb": [round(p / 1024, 2) for p in peaks], "log": os.path.relpath(log, REPO)}
        if summary and all(c == 0 for c in codes):
            rec.update(ms=round(summary["ms"], 1), tokens_per_s=round(summary["tokens_per_s"], 1),
                       tflops_per_gpu=round(summary["tflops_per_gpu"], 2), mfu=round(summary["mfu"], 4),
                       steps_timed=summary["steps_timed"])
        else:
            rec["error"] = f"exit codes {codes}; see {args.out_dir}/{tag}.rank*.out"
        print(json.dumps(rec), flush=True)
        records.append(rec)
    base = records[0]
    for rec in records[1:]:
        if "tflops_per_gpu" in rec and "tflops_per_gpu" in base:
            rec["tflops_per_gpu_ratio_vs_1gpu"] = round(rec["tflops_per_gpu"] / base["tflops_per_gpu"], 4)
        if rec["peak_mem_gb"] and base["peak_mem_gb"] and base["peak_mem_gb"][0] > 0:
            rec["peak_mem_ratio_vs_1gpu"] = round(max(rec["peak_mem_gb"]) / base["peak_mem_gb"][0], 4)
    meta = results_common.run_metadata()
    slug = results_common.gpu_slug(meta["device"])
    result = dict(meta, what="data-parallel train_gpt: GPT3-1.3B seq 2048, micro batch 8, 131072 tokens per step; "
                  "1 GPU vs 2 GPUs (NCCL, NCCL_NVLS_ENABLE=0), without and with --zero 1; median of the steps "
                  f"after {args.skip} warm-up steps; peak memory per rank from nvidia-smi", records=records)
    os.makedirs(args.results, exist_ok=True)
    json_path = os.path.join(args.results, f"multigpu_{slug}.json")
    results_common.write_json(json_path, result)
    lines = [f"# Data-parallel train_gpt on {meta['device']}", "",
             f"{meta['date']}, commit {meta['commit']}: `{meta['command']}`", "",
             "GPT3-1.3B, seq 2048, micro batch 8 per GPU, 131072 tokens per optimizer step, flash2, "
             f"median of steps {args.skip + 1}-{args.steps}. TFLOP/s and MFU per GPU.", "",
             "| GPUs | ZeRO | accum | tokens/s | TFLOP/s per GPU | MFU | x 1 GPU per GPU | peak GiB per rank | mem x 1 GPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['gpus']} | {r['zero']} | {r['accumulation_steps']} | {r.get('tokens_per_s', 'n/a')} | "
                     f"{r.get('tflops_per_gpu', 'n/a')} | {r.get('mfu', 'n/a')} | "
                     f"{r.get('tflops_per_gpu_ratio_vs_1gpu', '1' if r is base else 'n/a')} | "
                     f"{', '.join(str(m) for m in r['peak_mem_gb'])} | "
                     f"{r.get('peak_mem_ratio_vs_1gpu', '1' if r is base else 'n/a')} |")
    results_common.write_text(json_path[:-5] + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines[6:]))
    print(f"wrote {json_path} and {json_path[:-5]}.md")
    ok = all("tflops_per_gpu" in r for r in records)
    for r in records[1:]:
        ratio = r.get("tflops_per_gpu_ratio_vs_1gpu", 0)
        print(f"{'PASS' if ratio >= 0.95 else 'FAIL'} bench_{r['gpus']}gpu_zero{r['zero']}_per_gpu_tflops_ratio "
              f"{ratio} (want >= 0.95)")
        ok = ok and ratio >= 0.95
    return 0 if ok else 1


def main():
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
    b.add_argument("--steps", type=int, default=6)
    b.add_argument("--skip", type=int, default=2)
    b.add_argument("--timeout", type=int, default=240)
    b.add_argument("--train-data", default="data/tinyshakespeare/tinyshakespeare_train_*.bin")
    b.add_argument("--results", default=os.path.join(REPO, "scripts", "results"))
    args = ap.parse_args()
    sys.exit(compare(args) if args.cmd == "compare" else bench(args))


if __name__ == "__main__":
    main()
