#!/usr/bin/env python3
"""table1.py: reproduce Table 1 of the FlashAttention-2 paper with train_gpt.

Table 1 is end-to-end training throughput (TFLOP/s per GPU) of GPT3-1.3B and GPT3-2.7B at 2k and
8k context without FlashAttention, with FlashAttention and with FlashAttention-2. Here the three
columns are `--attn naive`, `--attn flash1` and `--attn flash2` of the same trainer, so everything
but attention is the same code. The paper's models: GPT3-1.3B = L24 h2048 16 heads (d128),
GPT3-2.7B = L32 h2560 32 heads (d80) (`gpt3-1.3b`, `gpt3-2.7b`).

Setup as the paper's, per GPU: micro batch 8 (1.3B at 2k), 4 (1.3B at 8k), 4 (2.7B at 2k and 8k),
and gradient accumulation to --batch-tokens per GPU and step (default 131072: the paper's ~1M
global batch over its 8 GPUs). A cell whose micro batch does not fit in GPU memory is rerun with
half the micro batch (same tokens per step, more accumulation) until it fits; the table marks each
such cell with the micro batch it used. If naive attention does not fit even at micro batch 1 (it
stores B·heads·T² probabilities per layer), the cell is run with `naive-recompute` (the same
standard attention, recomputing S and P in the backward instead of storing P) when train_gpt has
it, and marked so.

FP8 (opt-in: `--precision bf16,fp8`, or `--precision fp8` for that column alone): one more column,
`--attn flash2 --precision fp8` (the block GEMMs in FP8; attention stays bf16), with its speedup over
the bf16 FlashAttention-2 cell. The paper has no such column. Records carry "precision" (older ones,
without it, are bf16).

Throughput: each run takes --steps optimizer steps; the median step time after the first --skip
steps counts. TFLOP/s per GPU use the paper's formula, 6·s·P + 12·L·h·s² per sequence, as
train_gpt reports it; MFU is against the GPU's dense bf16 peak.

Several GPUs: `--gpus N` runs every cell data parallel on N GPUs of this machine (one process per
GPU, torchrun-style variables, `--zero 1`, --batch-tokens per GPU, so N times that per step), as
the paper ran it on 8, writes table1_<N>x<gpu>.json and .md, and compares each cell's per-GPU
TFLOP/s with the single-GPU table of the same GPU (table1_<gpu>.json) where there is one.

Writes <out-dir>/table1_<gpu>.json (records: model, seqlen, attn, precision, micro_batch, gpus,
tokens_per_s, tflops_per_gpu, mfu, peak_mem_gb, note; plus device, date, commit, command) and .md,
merging with an existing file (a record is replaced by a new one of the same model, seqlen, attn and
precision), so the twelve cells can be measured in several calls. Prints the table in the paper's layout last.

Usage (repository root, after `make train_gpt` and `make train` for the data):
    python3 scripts/table1.py                                   # all 12 cells
    python3 scripts/table1.py --configs 1.3b-2k,1.3b-8k --attn flash2,flash1
    python3 scripts/table1.py --gpus 8                          # data parallel on 8 GPUs, ZeRO-1
    python3 scripts/table1.py --precision bf16,fp8              # and the FlashAttention-2 FP8 column
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402
import train_runs  # noqa: E402

# (name, model, seqlen, the paper's micro batch, the paper's A100 TFLOP/s: naive, flash1, flash2)
CONFIGS = [
    ("1.3b-2k", "gpt3-1.3b", 2048, 8, (142, 189, 196)),
    ("1.3b-8k", "gpt3-1.3b", 8192, 4, (72, 170, 220)),
    ("2.7b-2k", "gpt3-2.7b", 2048, 4, (149, 189, 205)),
    ("2.7b-8k", "gpt3-2.7b", 8192, 4, (80, 175, 225)),
]
ATTNS = ("naive", "flash1", "flash2")
PRECISIONS = ("bf16", "fp8")
FP8_CELL = ("flash2", "fp8")  # the FP8 column: train_gpt --attn flash2 --precision fp8
COLUMNS = [(a, "bf16") for a in ATTNS] + [FP8_CELL]  # (attn, precision) of the table's columns, in order
PAPER_GPU = "8×A100 80GB"
PAPER_SPEEDUP_MIN = {2048: 1.38, 8192: 2.8}  # the paper's flash2 / naive speedups, the bar to reach


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS),
                   help="comma-separated subset of " + ", ".join(c[0] for c in CONFIGS))
    p.add_argument("--attn", default=",".join(ATTNS), help="comma-separated subset of naive, flash1, flash2")
    p.add_argument("--precision", default="bf16",
                   help="comma-separated: bf16 (the --attn columns), fp8 (one more column: flash2 with train_gpt "
                        "--precision fp8) (default bf16)")
    p.add_argument("--batch-tokens", type=int, default=131072, help="tokens per GPU per optimizer step")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of this machine, data parallel with --zero 1 (default 1)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    p.add_argument("--skip", type=int, default=1, help="warm-up steps not timed")
    p.add_argument("--train-data", default="data/tinyshakespeare/tinyshakespeare_train_*.bin")
    p.add_argument("--out-dir", default=os.path.join(train_runs.REPO_ROOT, "scripts", "results"))
    p.add_argument("--log-dir", default=None, help="where the runs' logs go (default: a temporary folder)")
    p.add_argument("--timeout", type=int, default=540, help="seconds per train_gpt run")
    args = p.parse_args(argv)
    names = {c[0] for c in CONFIGS}
    args.configs = [c for c in args.configs.split(",") if c]
    args.attn = [a for a in args.attn.split(",") if a]
    args.precision = [x for x in args.precision.split(",") if x]
    bad = ([c for c in args.configs if c not in names] + [a for a in args.attn if a not in ATTNS]
           + [x for x in args.precision if x not in PRECISIONS])
    if bad:
        p.error(f"unknown config, backend or precision: {', '.join(bad)}")
    if not args.precision:
        p.error("--precision takes bf16, fp8")
    if args.gpus < 1:
        p.error("--gpus must be at least 1")
    if args.steps <= args.skip:
        p.error("--steps must exceed --skip")
    return args


def train_gpt_has_backend(name):
    """Whether this train_gpt accepts --attn name (asked through --help)."""
    run = train_runs.subprocess.run([train_runs.TRAIN_GPT, "--help"], capture_output=True, text=True)
    return name in run.stdout


def cell_key(r):
    """(model, seqlen, attn, precision) of a record; records from before --precision are bf16."""
    return r["model"], r["seqlen"], r["attn"], r.get("precision", "bf16")


def measure_cell(args, model, seqlen, micro, attn, log_dir, precision="bf16"):
    """Runs one cell, halving the micro batch on out-of-memory; returns its record."""
    attempts = []
    backends = [attn] + (["naive-recompute"] if attn == "naive" and train_gpt_has_backend("naive-recompute") else [])
    suffix = "" if precision == "bf16" else f"_{precision}"
    for backend in backends:
        mb = micro
        while mb >= 1:
            log = os.path.join(log_dir, f"{model}_{seqlen}_{backend}{suffix}_mb{mb}.jsonl")
            cell_args = ["--model", model, "--attn", backend, "--seq-len", seqlen, "--batch-size", mb,
                         "--total-batch-tokens", args.batch_tokens * args.gpus, "--max-steps", args.steps,
                         "--train-data", args.train_data, "--val-data", ""]
            if precision != "bf16":  # bf16 is train_gpt's default: the bf16 cells run as before --precision
                cell_args += ["--precision", precision]
            if args.gpus == 1:
                run = train_runs.run_train_gpt(cell_args, log, timeout_s=args.timeout)
                with open(log + ".out", "w") as f:
                    f.write(run.stdout + "\n--- stderr ---\n" + run.stderr)
            else:  # each rank's output in <log>.rank<r>.out
                run = train_runs.run_train_gpt_ranks(cell_args + ["--zero", 1], log, args.gpus, timeout_s=args.timeout)
            summary = train_runs.steady_state(run.records, args.skip) if run.returncode == 0 else None
            if summary:
                notes = []
                if mb != micro:
                    notes.append(f"micro batch {mb}: {micro} did not fit")
                if backend != attn:
                    notes.append("naive-recompute: P recomputed in the backward (storing it does not fit)")
                return {"model": model, "seqlen": seqlen, "attn": attn, "precision": precision, "backend": backend,
                        "micro_batch": mb,
                        "paper_micro_batch": micro, "gpus": args.gpus, "zero": int(args.gpus > 1),
                        "tokens_per_s": summary["tokens_per_s"],
                        "tflops_per_gpu": summary["tflops_per_gpu"], "mfu": summary["mfu"], "ms": summary["ms"],
                        "steps_timed": summary["steps_timed"], "peak_mem_gb": run.peak_mem_mib / 1024.0,
                        "batch_tokens": args.batch_tokens, "note": "; ".join(notes)}
            last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
            attempts.append(f"{backend} micro {mb}: exit {run.returncode}: {last}")
            print(f"  -> {attempts[-1]}", flush=True)
            if not run.out_of_memory:
                break  # another failure: halving will not help
            if mb % 2 or mb == 1:
                break
            mb //= 2
    return {"model": model, "seqlen": seqlen, "attn": attn, "precision": precision, "micro_batch": None,
            "paper_micro_batch": micro,
            "gpus": args.gpus, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None, "peak_mem_gb": None,
            "batch_tokens": args.batch_tokens, "note": "failed: " + " | ".join(attempts)}


def load_existing(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def cell_text(rec):
    if rec is None:
        return "–"
    if rec.get("tflops_per_gpu") is None:
        return "failed"
    text = f"{rec['tflops_per_gpu']:.0f}"
    if rec.get("micro_batch") != rec.get("paper_micro_batch"):
        text += f" (mb {rec['micro_batch']})"
    if rec.get("backend", rec["attn"]) != rec["attn"]:
        text += " (recompute)"
    return text


def ratio(a, b):
    if not a or not b or a.get("tflops_per_gpu") is None or b.get("tflops_per_gpu") is None:
        return None
    return a["tflops_per_gpu"] / b["tflops_per_gpu"]


def attn_label(r):
    """The attn of a record, with its precision where that is not bf16: "flash2 fp8"."""
    return r["attn"] + ("" if r.get("precision", "bf16") == "bf16" else f" {r['precision']}")


def markdown(result, single=None):
    """The table in the paper's layout (with the FP8 column where an fp8 cell was measured), then every
    cell; `single`: the 1-GPU result of the same GPU, for the per-GPU scaling of a multi-GPU table."""
    by_key = {cell_key(r): r for r in result["records"]}
    fp8 = any(r.get("precision", "bf16") == "fp8" for r in result["records"])
    gpus = result.get("gpus", 1)
    where = "1 GPU" if gpus == 1 else f"{gpus} GPUs, data parallel, ZeRO-1"
    lines = [f"# Table 1 of the FlashAttention-2 paper, reproduced on {result['device']} ({where})", "",
             "End-to-end training throughput, TFLOP/s per GPU (6·s·P + 12·L·h·s² per sequence), ours and, in",
             f"brackets, the paper's ({PAPER_GPU}). Speedups: ours (paper's)."
             + (" FA2 FP8: `--attn flash2 --precision fp8` (the paper has none)." if fp8 else ""), "",
             "| Model | Without FlashAttention | FlashAttention | FlashAttention-2 | FA2 / without | FA2 / FA1 |"
             + (" FA2 FP8 | FP8 / FA2 |" if fp8 else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if fp8 else "")]
    for name, model, seqlen, micro, paper in CONFIGS:
        recs = [by_key.get((model, seqlen) + column) for column in COLUMNS]
        if not any(recs):
            continue
        cells = [f"{cell_text(r)} ({p})" for r, p in zip(recs[:3], paper)]  # the paper's three columns
        s_naive, s_fa1 = ratio(recs[2], recs[0]), ratio(recs[2], recs[1])
        fmt = lambda s: "–" if s is None else f"{s:.2f}×"  # noqa: E731
        label = f"GPT3-{model.split('-')[1].upper()} {seqlen // 1024}k"
        lines.append(f"| {label} | {' | '.join(cells)} | {fmt(s_naive)} ({paper[2] / paper[0]:.2f}×) | "
                     f"{fmt(s_fa1)} ({paper[2] / paper[1]:.2f}×) |"
                     + (f" {cell_text(recs[3])} | {fmt(ratio(recs[3], recs[2]))} |" if fp8 else ""))
    one = {cell_key(r): r for r in (single or {}).get("records", [])}
    scaling = gpus > 1 and bool(one)
    lines += ["", "MFU and memory of each cell" + (" (x 1 GPU: per-GPU TFLOP/s over the 1-GPU table's):" if scaling
                                                   else ":"), "",
              "| model | seqlen | attn | micro batch | tokens/s | TFLOP/s per GPU | MFU | peak GB per GPU |"
              + (" x 1 GPU |" if scaling else "") + " note |",
              "|---|---|---|---|---|---|---|---|---|" + ("---|" if scaling else "")]
    def note(r):  # cells merged from an earlier run name the commit they were measured at
        older = r.get("commit") and r.get("commit") != result.get("commit")
        return "; ".join(x for x in (r["note"], f"measured at {r['commit']}" if older else "") if x)

    for r in result["records"]:
        if r.get("tflops_per_gpu") is None:
            lines.append(f"| {r['model']} | {r['seqlen']} | {attn_label(r)} | – | – | – | – | – |"
                         + (" – |" if scaling else "") + f" {note(r)} |")
            continue
        cells = (f"| {r['model']} | {r['seqlen']} | {attn_label(r)} | {r['micro_batch']} | {r['tokens_per_s']:.0f} | "
                 f"{r['tflops_per_gpu']:.1f} | {100 * r['mfu']:.1f}% | {r['peak_mem_gb']:.1f} |")
        if scaling:
            s = ratio(r, one.get(cell_key(r)))
            cells += " – |" if s is None else f" {s:.2f}× |"
        lines.append(cells + f" {note(r)} |")
    lines += ["", f"Device: {result['device']}; date {result['date']}; commit {result['commit']}; "
              f"{result['batch_tokens']} tokens per GPU per step.", "", f"Command: `{result['command']}`", ""]
    if scaling:
        lines[-1:-1] = [f"1-GPU table: commit {single.get('commit')}, {single.get('date')}.", ""]
    return "\n".join(lines)


def main():
    args = parse_args()
    meta = results_common.run_metadata(train_runs.TRAIN_GPT)
    slug = results_common.gpu_slug(meta["device"])
    tag = slug if args.gpus == 1 else f"{args.gpus}x{slug}"
    json_path = os.path.join(args.out_dir, f"table1_{tag}.json")
    md_path = os.path.join(args.out_dir, f"table1_{tag}.md")
    single = load_existing(os.path.join(args.out_dir, f"table1_{slug}.json")) if args.gpus > 1 else None
    result = load_existing(json_path) or {"records": []}
    result.update(meta)
    result["batch_tokens"] = args.batch_tokens
    result["gpus"] = args.gpus
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="table1_")
    os.makedirs(log_dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    cells = ([(a, "bf16") for a in args.attn if "bf16" in args.precision]
             + ([FP8_CELL] if "fp8" in args.precision else []))
    order = {(c[1], c[2]) + column: i * len(COLUMNS) + j
             for i, c in enumerate(CONFIGS) for j, column in enumerate(COLUMNS)}
    for name, model, seqlen, micro, _ in CONFIGS:
        if name not in args.configs:
            continue
        for attn, precision in cells:
            print(f"== {model} seq {seqlen} attn {attn}{'' if precision == 'bf16' else ' ' + precision} "
                  f"(paper micro batch {micro})", flush=True)
            rec = measure_cell(args, model, seqlen, micro, attn, log_dir, precision)
            rec["commit"] = meta["commit"]
            result["records"] = [r for r in result["records"] if cell_key(r) != cell_key(rec)] + [rec]
            result["records"].sort(key=lambda r: order.get(cell_key(r), 99))
            results_common.write_json(json_path, result)  # after every cell, so a crash keeps what was measured
            results_common.write_text(md_path, markdown(result, single))
            if rec["tflops_per_gpu"] is not None:
                print(f"  {rec['tflops_per_gpu']:.1f} TFLOP/s, {rec['tokens_per_s']:.0f} tok/s, MFU "
                      f"{100 * rec['mfu']:.1f}%, micro batch {rec['micro_batch']}, peak {rec['peak_mem_gb']:.1f} GB",
                      flush=True)
    print()
    print(markdown(result, single))
    print(f"wrote {json_path} and {md_path}; logs in {log_dir}")


if __name__ == "__main__":
    main()
