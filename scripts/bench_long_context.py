#!/usr/bin/env python3
"""bench_long_context.py: training at long sequence lengths on one GPU, train_gpt with each --recompute mode
against PyTorch + torch.compile with activation checkpointing per block, in the same run.

Runs, each a process of its own, batch 1 (one sequence per optimizer step), in the order given:
  train_gpt  ./train_gpt --model M --seq-len T --batch-size 1 --recompute R --max-steps S --train-data D
                         --val-data "" --log-file L            (R: none, selective, full)
  torch      python3 scripts/torch_gpt.py bench --model M --seq-len T --batch-size 1 --steps S
                         --checkpoint-blocks --compile model --sdpa flash
             the PyTorch reference of bench_train.py (fp32 parameters under bf16 autocast, fused AdamW,
             torch.compile of the whole model, SDPA's FlashAttention-2 backend) with each block under
             torch.utils.checkpoint (non-reentrant): it keeps each block's input and reruns the block's
             forward in the backward, as train_gpt's --recompute full does.
Default grid: gpt3-1.3b at 16k, 32k, 64k and 128k, gpt3-2.7b at 32k and 64k; every train_gpt mode and torch
at each. A mode that does not fit is refused by train_gpt before it allocates anything (exit 1 within
seconds, "out of GPU memory ... --recompute X would fit"): its record says "oom" with that message.
--runs picks any list instead: IMPL:MODEL:SEQ[:MODE[:cpN]] (MODE for train_gpt), e.g.
    train_gpt:gpt3-1.3b:65536:full,torch:gpt3-1.3b:65536
cpN (train_gpt only): the sequence split over N GPUs with --context-parallel N, N processes with torchrun-style
variables (GPUs 0 .. N-1); its TFLOP/s are per GPU (the sequence's FLOPs / N), its "vs 1 GPU" is that over the
one-GPU train_gpt record of the same model, length and mode from the same commit (ideal scaling: 1.00), and it
records the exposed communication per step: "ring", the compute stream's waits for the ring attention's K/V and
dK/dV, and "comm", its waits for the gradient all-reduce (JSONL ring_exposed_ms, comm_exposed_ms; medians).

Method: the step time is the median over the --timed steps after --warmup steps (train_gpt: its JSONL "ms",
CUDA events around the step; torch: wall time between torch.cuda.synchronize() calls; its first step includes
torch.compile). TFLOP/s per GPU by the FlashAttention-2 paper's formula, 6·s·P + 12·L·h·s² per sequence
(model FLOPs: recomputation is not counted). Hardware TFLOP/s count what the kernels execute (causal
attention's unmasked half, the recomputation): train_gpt's own "hw_tflops_per_gpu"; for torch the same count
with every block's forward rerun by checkpointing (torch_gpt.executed_flops_per_sequence). Peak memory: the child's GPU memory polled by nvidia-smi (train_runs.MemoryPoller; the whole GPU's
where the pid is not listed). Losses of every step are recorded (they fall over the steps).

Writes <results-dir>/long_context_<gpu>.json (records: impl, model, seqlen, recompute, tflops_per_gpu,
hw_tflops_per_gpu, peak_gib, step_ms, losses, status, note, command, log; with the device, date, commit and
command) and long_context_<gpu>.md, rewritten after every run; records of an earlier file of the same device
are kept unless measured again (same impl, model, seqlen, recompute), so several invocations (each under a
time limit) build one table. Logs of the children go to --out. Exits 1 when a run failed other than by
running out of memory.

Usage (repository root, GPU machine, after `make train_gpt`; torch needs PyTorch):
    python3 scripts/bench_long_context.py                                   # the whole grid (long)
    python3 scripts/bench_long_context.py --runs train_gpt:gpt3-1.3b:32768:none,train_gpt:gpt3-1.3b:32768:full
"""
import argparse
import json
import os
import re
import shlex
import statistics
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train  # noqa: E402  (memory, throughput, data, paths and header of a record, as bench_train's)
import results_common  # noqa: E402
import torch_gpt as tg  # noqa: E402  (configs, FLOPs, the random shard; PyTorch runs in the child)
import train_runs  # noqa: E402

REPO_ROOT = results_common.REPO_ROOT
MODES = ("none", "selective", "full")
TORCH_RECOMPUTE = "blocks"  # the torch record's "recompute": checkpointing per block
GRID = [("gpt3-1.3b", 16384), ("gpt3-1.3b", 32768), ("gpt3-1.3b", 65536), ("gpt3-1.3b", 131072),
        ("gpt3-2.7b", 32768), ("gpt3-2.7b", 65536)]
RECORD_KEY = ("impl", "model", "seqlen", "recompute", "context_parallel", "zero")
KEY_DEFAULTS = {"context_parallel": 1, "zero": 0}  # records of files from before --context-parallel


def default_runs():
    runs = []
    for model, seqlen in GRID:
        runs += [("train_gpt", model, seqlen, mode, 1) for mode in MODES]
        runs += [("torch", model, seqlen, TORCH_RECOMPUTE, 1)]
    return runs


def parse_runs(text):
    runs = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        parts = item.split(":")
        ok = len(parts) in (3, 4, 5) and parts[0] in ("train_gpt", "torch") and parts[1] in tg.NAMED_SHAPES \
            and parts[2].isdigit()
        if ok and parts[0] == "train_gpt":
            ok = len(parts) in (4, 5) and parts[3] in MODES
            ok = ok and (len(parts) == 4 or re.fullmatch(r"cp[1-9][0-9]*", parts[4]) is not None)
        if ok and parts[0] == "torch":
            ok = len(parts) == 3
        if not ok:
            raise ValueError(f"bad run {item!r}: train_gpt:MODEL:SEQ:MODE[:cpN] (MODE in {', '.join(MODES)}, N the "
                             f"GPUs of --context-parallel) or torch:MODEL:SEQ, MODEL in {', '.join(tg.NAMED_SHAPES)}")
        cp = int(parts[4][2:]) if len(parts) == 5 else 1
        runs.append((parts[0], parts[1], int(parts[2]), parts[3] if parts[0] == "train_gpt" else TORCH_RECOMPUTE, cp))
    return runs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Long-context training: train_gpt --recompute vs PyTorch with "
                                "activation checkpointing.", formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Usage" + __doc__.split("Usage", 1)[1])
    p.add_argument("--runs", default="", help="IMPL:MODEL:SEQ[:MODE],... (default: the whole grid)")
    bench_train.add_run_options(p, "bench_long_context", warmup=1, timed=3, timeout=300, results="long_context")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate of both (default 3e-4)")
    p.add_argument("--zero", type=int, choices=(0, 1), default=0,
                   help="train_gpt's --zero for the cpN runs (1: the optimizer state sharded over the N GPUs, what "
                        "a large model needs to fit; default 0)")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="linear warmup steps of both (default 0; e.g. 10 for a falling loss over the first steps)")
    args = p.parse_args(argv)
    try:
        args.runs = parse_runs(args.runs) if args.runs else default_runs()
    except ValueError as err:
        p.error(str(err))
    if args.warmup < 0 or args.timed < 1:
        p.error("--warmup must be >= 0 and --timed >= 1")
    return args


def failure_note(path):
    """What a failed child said: its "error:" and "hint:" lines (train_gpt writes them to unbuffered stderr,
    before its buffered plan) or an out-of-memory line, else the last lines of its log; and whether it ran
    out of GPU memory."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("$ ")]
    except OSError:
        lines = []
    said = [ln for ln in lines if ln.startswith(("error:", "hint:")) or re.search(r"out of (gpu )?memory", ln, re.I)]
    text = " / ".join(said[-3:] if said else lines[-3:])[-600:]
    return text, bool(re.search(r"out of (gpu )?memory|cudaErrorMemoryAllocation", text, re.IGNORECASE))


def torch_hw_flops_per_sequence(cfg, seqlen):
    """What the kernels execute with per-block checkpointing, which reruns every block's forward."""
    return tg.executed_flops_per_sequence(cfg, seqlen, recompute_blocks=True)


def train_gpt_command(args, model, seqlen, mode, cp, data):
    cmd = [args.train_gpt, "--model", model, "--attn", args.attn, "--batch-size", "1", "--seq-len", str(seqlen),
           "--recompute", mode, "--max-steps", str(args.warmup + args.timed), "--train-data", data, "--val-data", "",
           "--lr", repr(args.lr), "--warmup-steps", str(args.warmup_steps), "--checkpoint-dir", "none",
           "--sample-tokens", "0"]
    if cp > 1:
        cmd += ["--context-parallel", str(cp), "--zero", str(args.zero)]
    if args.peak_tflops:
        cmd += ["--peak-tflops", repr(args.peak_tflops)]
    return cmd


def torch_command(args, model, seqlen, data, result_path):
    return [args.python, os.path.join("scripts", "torch_gpt.py"), "bench", "--model", model, "--batch-size", "1",
            "--seq-len", str(seqlen), "--steps", str(args.warmup + args.timed), "--train-data", data, "--sdpa",
            "flash", "--compile", "model", "--checkpoint-blocks", "--result-json", result_path, "--lr",
            repr(args.lr), "--warmup-steps", str(args.warmup_steps)]


def run_ranks(cmd, cp, log_path, result_path, timeout):
    """cmd as `cp` processes, one per GPU (torchrun-style variables), rank 0 with --log-file result_path;
    rank r's output in <log>.rank<r>.out, rank 0's also in log_path. Returns (exit status or "timeout",
    wall seconds, the largest peak memory of any rank as MemoryPoller's fields)."""
    prefix = log_path[:-len(".log")]
    run = train_runs.run_train_gpt_ranks(cmd[1:], result_path, cp, timeout, out_prefix=prefix, echo=False,
                                         binary=cmd[0])
    with open(log_path, "w") as f:
        f.write(f"$ RANK=0..{cp - 1} WORLD_SIZE={cp} {shlex.join(cmd)}\n{run.stdout}\n{run.stderr}\n")
    rc = "timeout" if "(killed after" in run.stderr else run.returncode
    peak = types.SimpleNamespace(process_mib=max(run.peak_mem_mib_per_rank) or None, gpu_mib=None)
    return rc, run.seconds, peak


def exposed_ms(steps_done, field, skip):
    """The median of a JSONL field over the timed steps (None when absent)."""
    values = [float(r[field]) for r in steps_done[skip:] if field in r]
    return round(statistics.median(values), 2) if values else None


def run_one(args, impl, model, seqlen, mode, cp, data, peak):
    tag = f"{model}_{seqlen}_{impl}_{mode}" + (f"_cp{cp}" if cp > 1 else "")
    log_path = os.path.join(args.out, tag + ".log")
    result_path = os.path.join(args.out, tag + (".jsonl" if impl == "train_gpt" else ".json"))
    if os.path.exists(result_path):
        os.unlink(result_path)
    if impl == "train_gpt":
        cmd = train_gpt_command(args, model, seqlen, mode, cp, data)
    else:
        cmd = torch_command(args, model, seqlen, data, result_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if cp > 1:
        rc, wall, poller = run_ranks(cmd, cp, log_path, result_path, args.timeout)
    else:
        cmd += ["--log-file", result_path] if impl == "train_gpt" else []
        rc, wall, poller = train_runs.run_child(cmd, log_path, args.timeout, env=env)
    hw_ratio, torch_version, steps_done = None, None, []
    if impl == "train_gpt":
        steps_done = train_runs.read_step_records(result_path)
        step_ms, losses = [float(r["ms"]) for r in steps_done], [float(r["loss"]) for r in steps_done]
        last = next((r for r in reversed(steps_done) if r.get("tflops_per_gpu")), None)
        if last is not None:  # train_gpt's hardware FLOPs (recomputation included) over its model FLOPs
            hw_ratio = float(last.get("hw_tflops_per_gpu", last["tflops_per_gpu"])) / float(last["tflops_per_gpu"])
        failed = rc != 0
    else:
        try:
            with open(result_path) as f:
                result = json.load(f)
        except (OSError, json.JSONDecodeError):
            result = {}
        step_ms, losses = result.get("step_ms", []), result.get("losses", [])
        torch_version = result.get("torch")
        failed = rc != 0 or result.get("status") != "ok"
    record = {"impl": impl, "model": model, "seqlen": seqlen, "recompute": mode, "context_parallel": cp,
              "zero": args.zero if cp > 1 else 0,
              "status": "ok", "note": "", "step_ms": None, "tflops_per_gpu": None, "hw_tflops_per_gpu": None,
              "mfu": None, "peak_gib": None, "mem_source": None, "losses": losses,
              "step_ms_all": [round(ms, 3) for ms in step_ms], "wall_s": round(wall, 1),
              "command": (f"RANK=0..{cp - 1} WORLD_SIZE={cp} " if cp > 1 else "") + shlex.join(cmd),
              "log": os.path.relpath(log_path, REPO_ROOT)}
    if impl == "torch":
        record["torch"] = torch_version
    if cp > 1:
        record["ring_exposed_ms"] = exposed_ms(steps_done, "ring_exposed_ms", args.warmup)
        record["comm_exposed_ms"] = exposed_ms(steps_done, "comm_exposed_ms", args.warmup)
    bench_train.record_memory(record, poller, "peak_gib")
    if failed:
        text, oom = failure_note(log_path)
        record["status"] = "timeout" if rc == "timeout" else "oom" if oom else "error"
        record["note"] = (f"stopped after {args.timeout:g} s" if rc == "timeout" else f"exit {rc}") + f": {text}"
        return record
    cfg = tg.gpt_config(model, seq_len=seqlen)
    if bench_train.record_throughput(record, step_ms, args.warmup, args.timed, cfg, 1 / cp, peak):  # batch 1
        if hw_ratio is None:
            hw_ratio = torch_hw_flops_per_sequence(cfg, seqlen) / tg.flops_per_sequence(cfg, seqlen)
        record["hw_tflops_per_gpu"] = record["tflops_per_gpu"] * hw_ratio
    return record


HEADER = ["model", "seq", "impl", "recompute", "GPUs", "ms/step", "TFLOP/s", "hw TFLOP/s", "MFU", "peak GiB",
          "vs torch", "vs 1 GPU", "exposed ms", "losses"]


def same_run_tflops(records, impl, cp):
    """TFLOP/s per GPU of ok records of `impl` with context_parallel `cp`, by (model, seqlen, recompute, commit)
    (recompute left out for torch, which has one mode)."""
    return {(r["model"], r["seqlen"], r["recompute"] if impl == "train_gpt" else None, r.get("commit")):
            r["tflops_per_gpu"] for r in records
            if r["impl"] == impl and r.get("context_parallel", 1) == cp and r["status"] == "ok"}


def table_rows(records):
    """One row per record, sorted by model, seqlen, impl, mode and GPUs; "vs torch": TFLOP/s per GPU over
    torch's at the same model and length, "vs 1 GPU": a --context-parallel record's TFLOP/s per GPU over the
    one-GPU train_gpt record of the same model, length and mode; both only against records of the same commit
    (one device session: a ratio needs the same run). "exposed ms": ring / gradient communication per step."""
    order = {m: i for i, m in enumerate(MODES + (TORCH_RECOMPUTE,))}
    torch_tflops, one_gpu = same_run_tflops(records, "torch", 1), same_run_tflops(records, "train_gpt", 1)
    rows = []
    for r in sorted(records, key=lambda r: (r["model"], r["seqlen"], r["impl"] != "train_gpt",
                                            order.get(r["recompute"], 9), r.get("context_parallel", 1))):
        seq = f"{r['seqlen'] // 1024}k" if r["seqlen"] % 1024 == 0 else str(r["seqlen"])
        mode = "checkpoint per block" if r["impl"] == "torch" else r["recompute"]
        cp = r.get("context_parallel", 1)
        gpus = (f"{cp} (cp" + (", zero 1)" if r.get("zero") else ")")) if cp > 1 else "1"
        if r["status"] != "ok":
            mem = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else "-"
            rows.append([r["model"], seq, r["impl"], mode, gpus, r["status"].upper()] + ["-"] * 3 + [mem] +
                        ["-"] * 4)
            continue
        base = torch_tflops.get((r["model"], r["seqlen"], None, r.get("commit")))
        ratio = f"{r['tflops_per_gpu'] / base:.2f}x" if base and r["impl"] == "train_gpt" else "-"
        single = one_gpu.get((r["model"], r["seqlen"], r["recompute"], r.get("commit"))) if cp > 1 else None
        scaling = f"{r['tflops_per_gpu'] / single:.2f}x" if single else "-"
        exposed = f"{r.get('ring_exposed_ms')} / {r.get('comm_exposed_ms')}" if cp > 1 else "-"
        losses = " ".join(f"{x:.3f}" for x in r["losses"])
        rows.append([r["model"], seq, r["impl"], mode, gpus, f"{r['step_ms']:.0f}", f"{r['tflops_per_gpu']:.0f}",
                     f"{r['hw_tflops_per_gpu']:.0f}", f"{100 * r['mfu']:.1f}%",
                     f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-", ratio, scaling, exposed, losses])
    return rows


def text_table(rows):
    """The rows in fixed-width columns (model, impl, recompute and losses left-aligned)."""
    return results_common.text_table(HEADER, rows, left=(0, 2, 3, 13))


def notes(records):
    return [f"{r['impl']} {r['model']} seq {r['seqlen']} --recompute {r['recompute']}: {r['status']}: {r['note']}"
            for r in records if r["status"] != "ok" or r["note"]]


def write_results(meta, records, json_path, md_path, attn="flash2"):
    results_common.write_json(json_path, {**meta, "records": records})
    md = [f"# Long-context training on {meta['device']}", "",
          f"Batch 1, one sequence per optimizer step. train_gpt (`--attn {attn}`) with each `--recompute` mode "
          "that fits, against the PyTorch reference (`scripts/torch_gpt.py bench --checkpoint-blocks`: bf16 "
          "autocast, fused AdamW, torch.compile, SDPA FlashAttention-2, torch.utils.checkpoint per block), "
          "measured in the same run on the same GPU (\"vs torch\": ours over torch's TFLOP/s at the same model and "
          "length, from the same commit and device session).", "",
          f"- method: {meta['method']}", f"- FLOPs: {meta['flops']}", f"- memory: {meta['memory']}", "",
          "| " + " | ".join(HEADER) + " |", "|---|---|---|---|" + "---:|" * (len(HEADER) - 5) + "---|"]
    md += ["| " + " | ".join(r) + " |" for r in table_rows(records)]
    md += results_common.runs_and_notes(records, notes(records),
                                        "Notes (a status other than ok: the run did not finish):")
    results_common.write_text(md_path, "\n".join(md) + "\n")


def main(argv=None):
    args = parse_args(argv)
    if any(run[0] == "train_gpt" for run in args.runs) and not os.path.exists(args.train_gpt):
        sys.exit(f"bench_long_context.py: error: {args.train_gpt} not found; build it with `make train_gpt`")
    os.makedirs(args.out, exist_ok=True)
    device = results_common.gpu_name()
    peak = bench_train.peak_for(args.peak_tflops, device)
    longest = max(run[2] for run in args.runs)  # batch 1: a step reads T + 1 tokens of one shard
    data = bench_train.training_data(args.train_data, args.out, 2 * longest + 1, need=longest + 1)
    json_path, md_path = bench_train.results_paths(args.results_dir, "long_context", device)
    meta = bench_train.run_meta(device, peak, argv, args.train_gpt)
    now, commit, command = meta["date"], meta["commit"], meta["command"]
    meta.update({
            "method": f"median time of an optimizer step (batch 1) over {args.timed} steps after {args.warmup} "
                      "untimed ones (train_gpt: its JSONL ms; torch: wall time between torch.cuda.synchronize()); "
                      f"lr {args.lr:g}, {args.warmup_steps} warmup steps",
            "flops": "TFLOP/s: 6*s*P + 12*L*h*s^2 per sequence (model FLOPs, MFU against "
                     f"{peak:g}); hw TFLOP/s: the FLOPs the kernels execute, causal attention's unmasked half and the "
                     "recomputation (train_gpt's hw_tflops_per_gpu; torch: torch_gpt.executed_flops_per_sequence "
                     "with every block's forward rerun)",
            "memory": "peak GPU memory of the process (nvidia-smi, polled every 0.2 s), GiB"})
    records = results_common.load_previous(json_path, device, args.fresh)
    print(f"{device}; commit {commit}; {args.warmup} + {args.timed} steps per run; logs in {args.out}", flush=True)
    failed = 0
    for impl, model, seqlen, mode, cp in args.runs:
        record = run_one(args, impl, model, seqlen, mode, cp, data, peak)
        record.update(date=now, commit=commit, bench_command=command, data=os.path.relpath(data, REPO_ROOT))
        failed += record["status"] not in ("ok", "oom")
        records = results_common.merge(records, record, RECORD_KEY, KEY_DEFAULTS)
        write_results(meta, records, json_path, md_path, args.attn)
        what = f"{model} {seqlen:6d} {impl:9} {mode:9}" + (f" cp{cp}" if cp > 1 else "")
        if record["status"] == "ok":
            exposed = f"  ring {record['ring_exposed_ms']} ms  comm {record['comm_exposed_ms']} ms" if cp > 1 else ""
            print(f"{what} {record['step_ms']:9.1f} ms  {record['tflops_per_gpu']:6.1f} TFLOP/s  hw "
                  f"{record['hw_tflops_per_gpu']:6.1f}  peak {record['peak_gib'] or 0:.1f} GiB{exposed}  losses "
                  f"{' '.join(f'{x:.3f}' for x in record['losses'])}", flush=True)
        else:
            print(f"{what} {record['status'].upper()}: {record['note'][:300]}", flush=True)
    print()
    print(f"wrote {os.path.relpath(json_path)} and {os.path.relpath(md_path)}")
    print(text_table(table_rows(records)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
