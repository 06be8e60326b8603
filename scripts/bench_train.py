#!/usr/bin/env python3
"""bench_train.py: end-to-end training speed and memory of train_gpt against PyTorch, in one run.

For each config, in this order and in processes of their own:
  train_gpt  ./train_gpt --model M --attn flash2 --batch-size b --seq-len T --total-batch-tokens N
                         --max-steps S --train-data D --val-data "" --log-file L
  torch      python3 scripts/torch_gpt.py bench ... : the PyTorch reference, the same architecture
             (scripts/torch_gpt.py), fp32 parameters under bf16 autocast, fused AdamW, torch.compile of the
             whole model, SDPA with the FlashAttention-2 backend forced (sdpa_kernel(FLASH_ATTENTION)),
             the same micro batch, sequence length, gradient accumulation, schedule and clipping: what a
             PyTorch user would run.
Configs (the FlashAttention-2 paper's Table 1 on one GPU; any MODEL:SEQ:MICRO works too):
  1.3b-2k  gpt3-1.3b       seq 2048, micro 8        2.7b-2k  gpt3-2.7b-d128  seq 2048, micro 4
  1.3b-8k  gpt3-1.3b       seq 8192, micro 2        2.7b-8k  gpt3-2.7b-d128  seq 8192, micro 1
  (2.7b-d80-2k: gpt3-2.7b, 32 heads of 80, seq 2048, micro 4, on request)
Each optimizer step takes --total-batch-tokens (default 131072: the paper's ~1M-token global batch over
8 GPUs, i.e. 8 micro steps of 1.3B at 2k, micro 8). --kv-heads N gives both sides grouped-query attention
with N key/value heads (train_gpt --kv-heads N; PyTorch SDPA with enable_gqa); records carry kv_heads
(0: multi-head) and the table names the model gpt3-1.3b/kv4.
--precision bf16,fp8 runs each implementation in each precision (default bf16 only), in the order
train_gpt bf16, torch bf16, train_gpt fp8, torch fp8 per config:
  fp8         train_gpt --precision fp8 (the block GEMMs in FP8); torch_gpt.py bench --fp8: torchao's float8
              training (tensorwise recipe: dynamic per-tensor scales, cuBLAS FP8 GEMMs) of the blocks' four
              linear layers, before torch.compile, under the same bf16 autocast (needs torchao on the GPU
              machine: pip install torchao). Records carry "precision"; the speed and joules-per-step ratios
              of the precision table are against train_gpt bf16 of the same shape measured by the same
              invocation. MFU stays against the dense bf16 peak.

Method, the same for both:
  time        a whole optimizer step (all micro steps, clipping, AdamW): train_gpt's JSONL "ms" (CUDA
              events around the step), PyTorch's wall time from one torch.cuda.synchronize() to the next;
              the median over the --timed steps after --warmup steps (the first includes torch.compile)
  throughput  tokens/s = N / step time; TFLOP/s per GPU = (6·s·P + 12·L·h·s²) · N/s / step time (the
              FlashAttention-2 paper's formula, as train_gpt reports it; P all parameters, padded wte and
              wpe included); MFU against --peak-tflops (default by GPU name, results_common.peak_tflops:
              H100/H200 SXM 989.4; an unknown GPU counts as 989.4)
  memory      the peak of the child process's GPU memory, polled every 0.2 s with `nvidia-smi
              --query-compute-apps=pid,used_memory` (train_runs.MemoryPoller); where nvidia-smi does not
              list the child's pid (a container's own pid namespace), the whole GPU's used memory instead
              ("mem_source" says which)
  data        --train-data (default: Tiny Shakespeare, `make train`); a random-token shard when no file
              matches (the speed does not depend on the tokens)
  power       with nvidia-ml-py installed (scripts/requirements.txt), over the timed steps (from the log
              line of the last warm-up step to the last step's): the board's mean power from its energy
              counter, the mean SM clock and the share of 50 ms samples in which the power cap held the
              clocks back (scripts/power_poller.py); joules per step = that power x the step time. A run
              at the power limit (700 W on an H100 SXM) is as fast as its joules per step allow, so there
              the speed ratio of two trainers is close to the inverse ratio of their joules per step.
A PyTorch or train_gpt failure (out of memory, a crash, a time-out) becomes a record with its status and
the last lines of its output; the other configs still run.

Writes <results-dir>/train_<gpu>.json (records: impl, precision, model, seqlen, micro_batch, attn, tokens_per_s,
tflops_per_gpu, mfu, peak_mem_gb, power_w, sm_mhz, power_capped, joules_per_step, ... with the device,
date, commit and command) and .md (the table with the bf16 train_gpt/torch ratios of TFLOP/s and memory,
the power table where power was measured, and where an fp8 run is there, a table of every (impl,
precision) with its ratios to train_gpt bf16), rewritten after every run. Records of an existing file of
the same device are kept unless this run measures the same (impl, precision, model, seqlen, micro_batch,
attn): several invocations with different --configs build one table. Logs of the children go to --out.
Prints the table last; exits 1 when a run failed.

Usage (from the repository root on a GPU machine, after `make train_gpt`):
    python3 scripts/bench_train.py                               # the four configs (~10-12 min on an H100)
    python3 scripts/bench_train.py --configs 1.3b-2k,1.3b-8k     # then --configs 2.7b-2k,2.7b-8k: one table
    python3 scripts/bench_train.py --configs gpt2-124m:1024:8 --total-batch-tokens 32768 --impls torch
    python3 scripts/bench_train.py --configs 1.3b-2k,2.7b-2k --precision bf16,fp8   # + FP8 and torchao float8
On the lent device machine (10 minutes a call, results only from $OUT), e.g.:
    cp scripts/results/train_h100.json $OUT/ 2>/dev/null; GIT_COMMIT=<sha> python3 scripts/bench_train.py \\
        --configs 1.3b-2k,1.3b-8k --results-dir $OUT --out build/bench_train; tar czf $OUT/logs.tgz build/bench_train
    (with --precision bf16,fp8 a config takes four runs: one config a call; torchao offline: a wheel fetched
    elsewhere with `pip download --no-deps torchao`, installed there with `pip install --no-deps <wheel>`)
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402  (device, commit, peak, results files)
import shard_format  # noqa: E402
import torch_gpt as tg  # noqa: E402  (configs, FLOPs, the random shard; PyTorch itself runs in the child)
import train_runs  # noqa: E402  (running a child, its memory, its log)
from power_poller import PowerPoller  # noqa: E402  (power, clock and energy of the timed steps)

REPO_ROOT = results_common.REPO_ROOT
CONFIGS = {  # name: (model, seq len, micro batch)
    "1.3b-2k": ("gpt3-1.3b", 2048, 8), "1.3b-8k": ("gpt3-1.3b", 8192, 2),
    "2.7b-2k": ("gpt3-2.7b-d128", 2048, 4), "2.7b-8k": ("gpt3-2.7b-d128", 8192, 1),
    "2.7b-d80-2k": ("gpt3-2.7b", 2048, 4),
}
DEFAULT_CONFIGS = "1.3b-2k,1.3b-8k,2.7b-2k,2.7b-8k"
IMPLS = ("train_gpt", "torch")
PRECISIONS = ("bf16", "fp8")  # fp8: train_gpt --precision fp8; torch: torchao float8 of the blocks' linears
RECORD_KEY = ("impl", "precision", "model", "seqlen", "micro_batch", "attn", "kv_heads")  # kv_heads 0: multi-head
KEY_DEFAULTS = {"kv_heads": 0, "precision": "bf16"}  # what records from before each key was added measured
DEFAULT_DATA = "data/tinyshakespeare/tinyshakespeare_train_*.bin"


def add_run_options(p, name, warmup, timed, timeout, results):
    """The options bench_train.py and bench_long_context.py share: steps, backend, peak, data, binaries,
    time limit and where logs (build/NAME) and results (RESULTS_<gpu>.json and .md) go."""
    p.add_argument("--warmup", type=int, default=warmup, help=f"optimizer steps not timed (default {warmup})")
    p.add_argument("--timed", type=int, default=timed, help=f"optimizer steps timed, median (default {timed})")
    p.add_argument("--attn", default="flash2", help="train_gpt's backend (default flash2)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak for MFU (default: by GPU name)")
    p.add_argument("--train-data", default=DEFAULT_DATA, help=f"token shards (default {DEFAULT_DATA})")
    p.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"), help="the binary (default ./train_gpt)")
    p.add_argument("--python", default=sys.executable, help="Python for the PyTorch child (default this one)")
    p.add_argument("--timeout", type=float, default=timeout,
                   help=f"seconds per run before it is stopped (default {timeout:g})")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "build", name),
                   help=f"logs of every run (default build/{name})")
    p.add_argument("--results-dir", default=os.path.join(REPO_ROOT, "scripts", "results"),
                   help=f"where {results}_<gpu>.json and .md go (default scripts/results)")
    p.add_argument("--fresh", action="store_true", help="do not keep the records of an existing results file")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="End-to-end training speed and memory: train_gpt vs PyTorch.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Usage" + __doc__.split("Usage", 1)[1])
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated: {', '.join(CONFIGS)} or MODEL:SEQ:MICRO (default {DEFAULT_CONFIGS})")
    p.add_argument("--impls", default="train_gpt,torch", help="comma-separated: train_gpt, torch (default train_gpt,torch)")
    p.add_argument("--precision", default="bf16",
                   help="comma-separated: bf16, fp8; each impl runs in each (fp8: train_gpt --precision fp8, torch + "
                        "torchao float8; include bf16 for the ratios to train_gpt bf16) (default bf16)")
    p.add_argument("--total-batch-tokens", type=int, default=131072, help="tokens per optimizer step (default 131072)")
    add_run_options(p, "bench_train", warmup=2, timed=4, timeout=900, results="train")
    p.add_argument("--kv-heads", type=int, default=0,
                   help="key/value heads of every config (grouped-query attention; default 0: the heads)")
    p.add_argument("--sdpa", default="flash", choices=tg.SDPA_BACKENDS, help="PyTorch's SDPA backend (default flash)")
    p.add_argument("--compile", default="model", choices=("model", "blocks", "none"),
                   help="PyTorch: torch.compile the whole model (default), each block, or nothing")
    p.add_argument("--torch-device", default="cuda", help=argparse.SUPPRESS)  # cpu: to test this script
    args = p.parse_args(argv)
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    if not args.impls or any(i not in IMPLS for i in args.impls):
        p.error(f"--impls takes {', '.join(IMPLS)}")
    args.precision = list(dict.fromkeys(x.strip() for x in args.precision.split(",") if x.strip()))
    if not args.precision or any(x not in PRECISIONS for x in args.precision):
        p.error(f"--precision takes {', '.join(PRECISIONS)}")
    if args.warmup < 0 or args.timed < 1:
        p.error("--warmup must be >= 0 and --timed >= 1")
    try:
        args.configs = [parse_config(c) for c in args.configs.split(",") if c.strip()]
    except ValueError as err:
        p.error(str(err))
    for name, model, seqlen, micro in args.configs:
        if args.total_batch_tokens % (seqlen * micro):
            p.error(f"{name}: --total-batch-tokens {args.total_batch_tokens} is not a multiple of "
                    f"seq {seqlen} x micro {micro} = {seqlen * micro}")
    return args


def parse_config(text):
    """(name, model, seqlen, micro batch) of a name in CONFIGS or of MODEL:SEQ:MICRO."""
    text = text.strip()
    if text in CONFIGS:
        return (text,) + CONFIGS[text]
    parts = text.split(":")
    if len(parts) == 3 and parts[0] in tg.NAMED_SHAPES and parts[1].isdigit() and parts[2].isdigit():
        return (text, parts[0], int(parts[1]), int(parts[2]))
    raise ValueError(f"unknown config {text!r}: use one of {', '.join(CONFIGS)} or MODEL:SEQ:MICRO with MODEL "
                     f"one of {', '.join(tg.NAMED_SHAPES)}")


# ---------------------------------------------------------------------------------------------
# Children: run by train_runs.run_child (output in a log file, peak GPU memory polled by nvidia-smi;
# this process never touches CUDA, so it holds no GPU memory itself)

def log_tail(path, lines=4):
    """The last non-empty lines of a child's log (not its "$ command" line), joined with " / "."""
    try:
        with open(path, errors="replace") as f:
            text = [line.rstrip() for line in f if line.strip() and not line.startswith("$ ")]
    except OSError:
        return ""
    return " / ".join(text[-lines:])[-600:]


# ---------------------------------------------------------------------------------------------
# One run of each implementation

def run_tag(name, impl, precision):
    """The file name stem of a run's logs: <config>_<impl>, with _fp8 for fp8 runs."""
    return f"{name.replace(':', '_')}_{impl}" + ("" if precision == "bf16" else f"_{precision}")


def base_record(impl, args, name, model, seqlen, micro, cmd, log_path, precision="bf16"):
    return {"impl": impl, "precision": precision, "config": name, "model": model, "seqlen": seqlen,
            "micro_batch": micro, "kv_heads": args.kv_heads,
            "attn": args.attn if impl == "train_gpt" else f"sdpa-{args.sdpa}",
            "grad_accum": args.total_batch_tokens // (seqlen * micro), "total_batch_tokens": args.total_batch_tokens,
            "status": "ok", "note": "", "step_ms": None, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None,
            "peak_mem_gb": None, "mem_source": None, "gpu_mem_gb": None, "step_ms_all": [], "wall_s": None,
            "power_w": None, "sm_mhz": None, "power_capped": None, "joules_per_step": None, "power_note": None,
            "command": shlex.join(cmd), "log": os.path.relpath(log_path, REPO_ROOT)}


def record_memory(record, poller, field):
    """record[field]: the child's peak GPU memory in GiB (the whole GPU's where nvidia-smi does not list its
    pid), and record["mem_source"] saying which."""
    if poller.process_mib is not None:
        record[field], record["mem_source"] = poller.process_mib / 1024, "process"
    elif poller.gpu_mib is not None:
        record[field], record["mem_source"] = poller.gpu_mib / 1024, "whole GPU"


def record_throughput(record, step_ms, warmup, timed, cfg, sequences_per_step, peak):
    """record's step_ms (the median of the timed steps after `warmup`), tflops_per_gpu (FA2 paper's
    formula, sequences_per_step sequences of record["seqlen"] tokens) and mfu (against peak); with fewer
    than `timed` timed steps, status "error" instead. Returns whether the numbers were filled in."""
    if len(step_ms[warmup:]) < timed:
        record["status"], record["note"] = "error", f"only {len(step_ms)} of {warmup + timed} steps ran"
        return False
    ms = statistics.median(step_ms[warmup:])
    record["step_ms"] = ms
    record["tflops_per_gpu"] = tg.flops_per_sequence(cfg, record["seqlen"]) * sequences_per_step / (ms / 1e3) / 1e12
    record["mfu"] = record["tflops_per_gpu"] / peak
    return True


def is_train_gpt_step(line):
    return '"loss":' in line  # a JSONL step record (validation records have "val_loss")


def is_torch_step(line):
    return line.startswith("step ") and "| loss" in line  # torch_gpt.py's "step     3/6 | loss ..." lines


def record_power(record, power, warmup):
    """record's power_w, sm_mhz, power_capped and joules_per_step over the timed steps (PowerPoller); left
    None where they were not measured, with the reason in power_note."""
    power.stop()
    if not record["step_ms"]:  # the run failed: nothing to measure over
        return
    measured = power.timed_steps(warmup, record["step_ms"])
    if measured:
        record.update(measured)
    else:
        record["power_note"] = power.error or "power not measured: too few samples in the timed steps"


def finish_record(record, step_ms, args, cfg, peak, poller, wall_s, power):
    """Fills in throughput (median of the timed steps), memory and power."""
    record["wall_s"] = round(wall_s, 1)
    record["step_ms_all"] = [round(ms, 3) for ms in step_ms]
    record_memory(record, poller, "peak_mem_gb")
    if poller.gpu_mib is not None:
        record["gpu_mem_gb"] = poller.gpu_mib / 1024
    if record["status"] == "ok" and record_throughput(record, step_ms, args.warmup, args.timed, cfg,
                                                      args.total_batch_tokens / record["seqlen"], peak):
        record["tokens_per_s"] = args.total_batch_tokens / (record["step_ms"] / 1e3)
    record_power(record, power, args.warmup)
    return record


def run_train_gpt(args, name, model, seqlen, micro, data, peak, precision="bf16"):
    steps = args.warmup + args.timed
    tag = run_tag(name, "train_gpt", precision)
    log_path, jsonl = os.path.join(args.out, tag + ".log"), os.path.join(args.out, tag + ".jsonl")
    cmd = [args.train_gpt, "--model", model, "--attn", args.attn, "--batch-size", str(micro), "--seq-len",
           str(seqlen), "--total-batch-tokens", str(args.total_batch_tokens), "--max-steps", str(steps),
           "--train-data", data, "--val-data", "", "--log-file", jsonl, "--checkpoint-dir", "none",
           "--sample-tokens", "0"]
    if args.peak_tflops:
        cmd += ["--peak-tflops", repr(args.peak_tflops)]
    if args.kv_heads:
        cmd += ["--kv-heads", str(args.kv_heads)]
    if precision != "bf16":  # bf16 is train_gpt's default: its command line stays as before --precision
        cmd += ["--precision", precision]
    record = base_record("train_gpt", args, name, model, seqlen, micro, cmd, log_path, precision)
    if os.path.exists(jsonl):
        os.unlink(jsonl)
    power = PowerPoller(results_common.gpu_index(), jsonl, is_train_gpt_step)
    rc, wall, poller = train_runs.run_child(cmd, log_path, args.timeout)
    step_ms = [float(rec["ms"]) for rec in train_runs.read_step_records(jsonl)]
    if rc != 0:
        text = log_tail(log_path)
        oom = re.search(r"out of (gpu )?memory|GiB free|cudaErrorMemoryAllocation", text, re.IGNORECASE)
        record["status"] = "timeout" if rc == "timeout" else "oom" if oom else "error"
        record["note"] = (f"stopped after {args.timeout:g} s" if rc == "timeout" else f"exit {rc}") + f": {text}"
    cfg = tg.gpt_config(model, seq_len=seqlen, kv_heads=args.kv_heads)
    return finish_record(record, step_ms, args, cfg, peak, poller, wall, power)


def run_torch(args, name, model, seqlen, micro, data, peak, precision="bf16"):
    steps = args.warmup + args.timed
    tag = run_tag(name, "torch", precision)
    log_path, result_path = os.path.join(args.out, tag + ".log"), os.path.join(args.out, tag + ".json")
    cmd = [args.python, os.path.join("scripts", "torch_gpt.py"), "bench", "--model", model, "--batch-size",
           str(micro), "--seq-len", str(seqlen), "--total-batch-tokens", str(args.total_batch_tokens),
           "--steps", str(steps), "--train-data", data, "--sdpa", args.sdpa, "--compile", args.compile,
           "--result-json", result_path]
    if args.torch_device != "cuda":
        cmd += ["--device", args.torch_device]
    if args.kv_heads:
        cmd += ["--kv-heads", str(args.kv_heads)]
    if precision == "fp8":
        cmd += ["--fp8"]
    record = base_record("torch", args, name, model, seqlen, micro, cmd, log_path, precision)
    if os.path.exists(result_path):
        os.unlink(result_path)
    power = PowerPoller(results_common.gpu_index(), log_path, is_torch_step)
    rc, wall, poller = train_runs.run_child(cmd, log_path, args.timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    result = {}
    try:
        with open(result_path) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError):
        pass
    step_ms = result.get("step_ms", [])
    if rc == "timeout":
        record["status"], record["note"] = "timeout", f"stopped after {args.timeout:g} s: {log_tail(log_path)}"
    elif rc != 0 or result.get("status") != "ok":
        record["status"] = result["status"] if result.get("status") in ("oom", "error") else "error"
        record["note"] = f"exit {rc}: " + (result.get("message") or log_tail(log_path))
    for key in ("torch", "torchao", "fp8_linears", "peak_reserved_gib", "peak_allocated_gib"):
        if key in result:
            record[key] = result[key]
    cfg = tg.gpt_config(model, seq_len=seqlen, kv_heads=args.kv_heads)
    return finish_record(record, step_ms, args, cfg, peak, poller, wall, power)


# ---------------------------------------------------------------------------------------------
# Results: merge, JSON, markdown, the printed table

def merge(records, new):
    """records with `new` in place of a record of the same RECORD_KEY (KEY_DEFAULTS in records from before
    grouped-query attention and --precision), or appended."""
    return results_common.merge(records, new, RECORD_KEY, KEY_DEFAULTS)


def precision_of(r):
    """A record's precision; records from before --precision are bf16."""
    return r.get("precision", "bf16")


def run_label(r):
    """impl, with the precision where it is not bf16: "train_gpt", "torch fp8"."""
    return r["impl"] + ("" if precision_of(r) == "bf16" else f" {precision_of(r)}")


def shape_groups(records):
    """[((model, seqlen, micro_batch), {(impl, precision): record})] in CONFIGS' order."""
    order = {shape: i for i, shape in enumerate(CONFIGS.values())}
    groups = {}
    for r in records:
        model = r["model"] + (f"/kv{r['kv_heads']}" if r.get("kv_heads") else "")
        groups.setdefault((model, r["seqlen"], r["micro_batch"]), {})[r["impl"], precision_of(r)] = r
    return [(key, groups[key]) for key in sorted(groups, key=lambda k: (order.get(k, len(order)), k))]


def grouped(records):
    """[((model, seqlen, micro_batch), train_gpt's bf16 record or None, torch's or None)] in CONFIGS' order,
    shapes with a bf16 run only."""
    return [(key, runs.get(("train_gpt", "bf16")), runs.get(("torch", "bf16")))
            for key, runs in shape_groups(records) if ("train_gpt", "bf16") in runs or ("torch", "bf16") in runs]


def shape_cells(key, accum):
    model, seqlen, micro = key
    return [model, f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen), f"{micro} x {accum}"]


def table_rows(records):
    """One row per (model, seqlen, micro_batch): train_gpt and torch side by side, with ratios ours/torch.
    A failed run shows its status (OOM, ERROR, TIMEOUT) instead of numbers; ratios need both runs ok."""
    rows = []
    for key, ours, theirs in grouped(records):
        both_ok = ours is not None and theirs is not None and ours["status"] == theirs["status"] == "ok"

        def cells(field, form):
            return ["-" if r is None else r["status"].upper() if r["status"] != "ok" else form(r[field])
                    for r in (ours, theirs)]

        def ratio(field):
            return f"{ours[field] / theirs[field]:.2f}x" if both_ok and ours[field] and theirs[field] else "-"

        mem = cells("peak_mem_gb", lambda v: "-" if v is None else f"{v:.1f}")
        rows.append([*shape_cells(key, (ours or theirs)["grad_accum"]),
                     *cells("tflops_per_gpu", lambda v: f"{v:.0f}"), ratio("tflops_per_gpu"),
                     *cells("mfu", lambda v: f"{100 * v:.1f}%"), *cells("tokens_per_s", lambda v: f"{v:.0f}"),
                     *mem, ratio("peak_mem_gb")])
    return rows


POWER_HEADER = ["model", "seq", "micro x accum", "ours W", "torch W", "ours SM MHz", "torch SM MHz", "ours J/step",
                "torch J/step", "torch J / ours J", "power-capped ours / torch"]


def power_rows(records):
    """One row per shape where a run's power was measured: mean board power, SM clock and joules per step
    over the timed steps, and the share of samples the power cap held the clocks."""
    rows = []
    for key, ours, theirs in grouped(records):
        runs = [r if r is not None and r.get("power_w") else None for r in (ours, theirs)]
        if runs == [None, None]:
            continue

        def cells(field, form):
            return ["-" if r is None else form(r[field]) for r in runs]

        ratio = f"{runs[1]['joules_per_step'] / runs[0]['joules_per_step']:.2f}x" if None not in runs else "-"
        rows.append([*shape_cells(key, (ours or theirs)["grad_accum"]), *cells("power_w", lambda v: f"{v:.0f}"),
                     *cells("sm_mhz", lambda v: f"{v:.0f}"), *cells("joules_per_step", lambda v: f"{v:.0f}"), ratio,
                     " / ".join(cells("power_capped", lambda v: f"{100 * v:.0f}%"))])
    return rows


HEADER = ["model", "seq", "micro x accum", "ours TFLOP/s", "torch TFLOP/s", "ours/torch", "ours MFU", "torch MFU",
          "ours tok/s", "torch tok/s", "ours GiB", "torch GiB", "mem ours/torch"]


def text_table(rows):
    """The rows in fixed-width columns for the terminal (model left-aligned, numbers right-aligned)."""
    return results_common.text_table(HEADER, rows)


PRECISION_HEADER = ["model", "seq", "micro x accum", "impl", "precision", "TFLOP/s", "MFU", "tok/s", "GiB", "W",
                    "J/step", "power-capped", "speed / train_gpt bf16", "J/step / train_gpt bf16"]
PRECISION_NOTE = ("Every implementation in every precision: fp8 = `train_gpt --precision fp8`, and for torch "
                  "torchao's float8 training (`torch_gpt.py bench --fp8`: convert_to_float8_training, tensorwise "
                  "recipe, of the blocks' qkv, attproj, fc and fcproj, before torch.compile, under bf16 autocast). "
                  "Speed (tokens/s) and joules per step against train_gpt bf16 of the same shape measured by the "
                  "same invocation ('-' where it has none); MFU against the dense bf16 peak.")


def has_precisions(records):
    """Whether any record ran in another precision than bf16 (then the precision table is shown)."""
    return any(precision_of(r) != "bf16" for r in records)


def invocation(r):
    """What tells one bench_train.py invocation from another in its records: its start time and command."""
    return r.get("date"), r.get("bench_command")


def precision_rows(records):
    """One row per (shape, impl, precision): train_gpt bf16, train_gpt fp8, torch bf16, torch fp8, with speed
    and joules per step over train_gpt bf16's, where that run is ok and from the same invocation."""
    rows = []
    for key, runs in shape_groups(records):
        base = runs.get(("train_gpt", "bf16"))
        for impl in IMPLS:
            for precision in PRECISIONS:
                r = runs.get((impl, precision))
                if r is None:
                    continue
                ok = r["status"] == "ok"
                same_run = ok and base is not None and base["status"] == "ok" and invocation(base) == invocation(r)

                def cell(field, form):
                    return form(r[field]) if ok and r.get(field) is not None else "-"

                def ratio(field):
                    return f"{r[field] / base[field]:.2f}x" if same_run and r.get(field) and base.get(field) else "-"

                rows.append([*shape_cells(key, r["grad_accum"]), impl, precision,
                             cell("tflops_per_gpu", lambda v: f"{v:.0f}") if ok else r["status"].upper(),
                             cell("mfu", lambda v: f"{100 * v:.1f}%"), cell("tokens_per_s", lambda v: f"{v:.0f}"),
                             cell("peak_mem_gb", lambda v: f"{v:.1f}"), cell("power_w", lambda v: f"{v:.0f}"),
                             cell("joules_per_step", lambda v: f"{v:.0f}"),
                             cell("power_capped", lambda v: f"{100 * v:.0f}%"),
                             ratio("tokens_per_s"), ratio("joules_per_step")])
    return rows


def notes(records):
    return [f"{run_label(r)} {r['model']} seq {r['seqlen']} micro {r['micro_batch']}: {r['status']}: {r['note']}"
            for r in records if r["status"] != "ok" or r["note"]]


def write_results(meta, records, json_path, md_path, attn="flash2"):
    """The JSON (every record) and the markdown table, each through a .tmp file and a rename."""
    results_common.write_json(json_path, {**meta, "records": records})
    md = [f"# End-to-end training benchmark on {meta['device']}", "",
          f"train_gpt (`--attn {attn}`) against the PyTorch reference (`scripts/torch_gpt.py`: "
          "bf16 autocast, fused AdamW, torch.compile, SDPA FlashAttention-2 backend), measured in the same run "
          "on the same GPU.", "",
          f"- method: {meta['method']}", f"- FLOPs: {meta['flops']}", f"- memory: {meta['memory']}", "",
          "| " + " | ".join(HEADER) + " |", "|---|---|---|" + "---:|" * (len(HEADER) - 3)]
    md += ["| " + " | ".join(r) + " |" for r in table_rows(records)]
    power = power_rows(records)
    if power:
        md += ["", "Power over the timed steps (NVML: the board's energy counter, SM clock samples every 50 ms, "
               "and the share of them in which the software power cap held the clocks back):", "",
               "| " + " | ".join(POWER_HEADER) + " |", "|---|---|---|" + "---:|" * (len(POWER_HEADER) - 3)]
        md += ["| " + " | ".join(r) + " |" for r in power]
    if has_precisions(records):
        md += ["", PRECISION_NOTE, "",
               "| " + " | ".join(PRECISION_HEADER) + " |",
               "|---|---|---|---|---|" + "---:|" * (len(PRECISION_HEADER) - 5)]
        md += ["| " + " | ".join(r) + " |" for r in precision_rows(records)]
    md += results_common.runs_and_notes(records, notes(records))
    results_common.write_text(md_path, "\n".join(md) + "\n")


def summary_line(r, width=9):
    """A run's line on the terminal; width: of the impl label ("train_gpt fp8" needs 13)."""
    where = f"{r['config']:14} {run_label(r):{width}}"
    if r["status"] != "ok":
        return f"{where} {r['status'].upper()}: {r['note']}"
    mem = f"{r['peak_mem_gb']:.1f} GiB ({r['mem_source']})" if r["peak_mem_gb"] is not None else "memory not measured"
    power = (f"{r['power_w']:.0f} W, SM {r['sm_mhz']:.0f} MHz, {r['joules_per_step']:.0f} J/step, power-capped "
             f"{100 * r['power_capped']:.0f}%" if r.get("power_w") else r.get("power_note") or "power not measured")
    return (f"{where} {r['step_ms']:9.1f} ms/step  {r['tokens_per_s']:9.0f} tok/s  {r['tflops_per_gpu']:6.1f} TFLOP/s  "
            f"MFU {100 * r['mfu']:4.1f}%  peak {mem}  {power}  (wall {r['wall_s']:.0f} s)")


def peak_for(peak_tflops, device):
    """--peak-tflops, else the GPU's by name; an unknown GPU: MFU against an H100's 989.4."""
    return peak_tflops or results_common.peak_tflops(device) or 989.4


def training_data(pattern, out_dir, tokens, need=1):
    """pattern when it names token shards, one of which holds `need` tokens (what train_gpt needs in one
    shard for a step: B*T*GPUs + 1); else a shard of `tokens` random tokens written in out_dir (the speed
    does not depend on the tokens)."""
    try:
        largest = max(int(shard_format.read_header(p)[2]) for p in tg.shard_paths(pattern))
        if largest >= need:
            return pattern
        why = f"the largest shard of {pattern} holds {largest} tokens, a step needs {need}"
    except (FileNotFoundError, OSError, shard_format.ShardError) as err:
        why = f"{pattern}: {err}"
    data = os.path.join(out_dir, f"random_tokens_{tokens}.bin")
    tg.write_random_shard(data, tokens, seed=0)
    print(f"{why}: timing on {tokens} random tokens ({data})", flush=True)
    return data


def results_paths(results_dir, prefix, device):
    """<results_dir>/<prefix>_<gpu>.json and .md."""
    base = os.path.join(results_dir, f"{prefix}_{results_common.gpu_slug(device)}")
    return base + ".json", base + ".md"


def run_meta(device, peak, argv=None, train_gpt=None):
    """{device, date (ISO, UTC), commit, command, peak_tflops}: the header of a results file; argv the
    arguments when main() is called with them (sys.argv otherwise); with train_gpt (the binary the run
    uses), also build: what that binary was built from."""
    meta = {"device": device, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": results_common.git_commit(),
            "command": shlex.join(["python3"] + (sys.argv if argv is None else [sys.argv[0], *argv])),
            "peak_tflops": peak}
    if train_gpt:
        meta["build"] = results_common.binary_build(train_gpt)
    return meta


def main(argv=None):
    args = parse_args(argv)
    if "train_gpt" in args.impls and not os.path.exists(args.train_gpt):
        sys.exit(f"bench_train.py: error: {args.train_gpt} not found; build it with `make train_gpt`")
    os.makedirs(args.out, exist_ok=True)
    device = results_common.gpu_name()
    peak = peak_for(args.peak_tflops, device)
    data = training_data(args.train_data, args.out, max(2 * args.total_batch_tokens + 1, 1 << 20))
    json_path, md_path = results_paths(args.results_dir, "train", device)
    meta = run_meta(device, peak, argv, args.train_gpt)
    now, commit, command = meta["date"], meta["commit"], meta["command"]
    meta.update({
            "method": f"median time of a whole optimizer step over {args.timed} steps after {args.warmup} "
                      "untimed ones (train_gpt: its JSONL ms; torch: wall time between torch.cuda.synchronize() calls)",
            "flops": "6*s*P + 12*L*h*s^2 per sequence of s tokens, P all parameters (padded wte and wpe included); "
                     f"MFU against {peak:g} TFLOP/s",
            "memory": "peak GPU memory of the process (nvidia-smi --query-compute-apps, polled every 0.2 s; "
                      "'whole GPU' where the pid is not listed), GiB",
            "power": "over the timed steps: the board's mean power (NVML energy counter), the mean SM clock and the "
                     "share of 50 ms samples held back by the software power cap; J/step = power x step time"})
    records = results_common.load_previous(json_path, device, args.fresh)
    print(f"{device}; MFU peak {peak:g} TFLOP/s; commit {commit}; {args.total_batch_tokens} tokens per step, "
          f"{args.warmup} + {args.timed} steps; logs in {args.out}", flush=True)

    failed = 0
    for name, model, seqlen, micro in args.configs:
        for impl, precision in [(i, x) for x in args.precision for i in args.impls]:  # bf16 pair, then fp8 pair
            runner = run_train_gpt if impl == "train_gpt" else run_torch
            record = runner(args, name, model, seqlen, micro, data, peak, precision)
            record.update(date=now, commit=commit, bench_command=command, data=os.path.relpath(data, REPO_ROOT))
            failed += record["status"] != "ok"
            records = merge(records, record)
            write_results(meta, records, json_path, md_path, args.attn)
            print(summary_line(record, 9 if args.precision == ["bf16"] else 13), flush=True)

    print()
    for n in notes(records):
        print("note: " + n)
    print(f"wrote {os.path.relpath(json_path)} and {os.path.relpath(md_path)}")
    print(f"{device}: TFLOP/s per GPU (6*s*P + 12*L*h*s^2), MFU of {peak:g}, peak GPU memory in GiB; "
          "ours = train_gpt, torch = PyTorch + torch.compile + SDPA flash")
    print(text_table(table_rows(records)))
    power = power_rows(records)
    if power:
        print("\npower over the timed steps (NVML):")
        print(results_common.text_table(POWER_HEADER, power))
    if has_precisions(records):
        print("\nevery impl and precision (fp8: train_gpt --precision fp8, torch + torchao float8 tensorwise); "
              "ratios to train_gpt bf16 of the same invocation:")
        print(results_common.text_table(PRECISION_HEADER, precision_rows(records), left=(0, 3, 4)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
