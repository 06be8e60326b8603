"""train_runs.py: run ./train_gpt as a benchmark child and read back what it measured.

Shared by scripts/table1.py, scripts/bench_train.py and scripts/bench_multigpu.py. Numpy and PyTorch are not needed.

run_train_gpt(args, log_path) runs `./train_gpt args --log-file log_path`, polls nvidia-smi for the
child's GPU memory while it runs, and returns a TrainRun: the exit status, the output, the per-step
JSON records of the log, the peak memory, and whether it ran out of GPU memory.
run_train_gpt_ranks(args, log_path, world) does the same for one process per GPU (data parallel).
steady_state(records, skip) summarizes the steps after the first `skip` (warm-up: cuBLASLt
heuristics, first-touch allocation) by their median step time.
run_metadata(command) gives the device, date, commit and command every results file records.
"""
import dataclasses
import datetime
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_GPT = os.path.join(REPO_ROOT, "train_gpt")


@dataclasses.dataclass
class TrainRun:
    command: list
    returncode: int
    stdout: str
    stderr: str
    records: list           # the log's step records ({"step", "loss", "ms", "tokens_per_s", ...})
    peak_mem_mib: float     # largest GPU memory of the child seen by nvidia-smi (0 when unknown)
    out_of_memory: bool     # train_gpt said the GPU ran out of memory
    seconds: float


def _query_memory(pid):
    """MiB the process `pid` holds on the GPU, or None when nvidia-smi cannot tell."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


def poll_peak_memory(proc, interval_s=0.2):
    """Starts a thread that records the child's peak GPU memory (MiB) into the returned dict's "peak"."""
    peak = {"peak": 0.0}

    def loop():
        while proc.poll() is None:
            mib = _query_memory(proc.pid)
            if mib is not None and mib > peak["peak"]:
                peak["peak"] = mib
            time.sleep(interval_s)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    peak["thread"] = thread
    return peak


def read_step_records(path):
    """The step records ({"step", "loss", ...}) of a train_gpt JSON-lines log; validation lines skipped."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "loss" in r]


def run_train_gpt(args, log_path, timeout_s=600, env=None, echo=True):
    """Runs ./train_gpt with `args` plus --log-file log_path; never raises on the child's failure."""
    command = [TRAIN_GPT, *[str(a) for a in args], "--log-file", log_path]
    if os.path.exists(log_path):
        os.remove(log_path)
    if echo:
        print("$ " + " ".join(shlex.quote(c) for c in command), flush=True)
    start = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            env=env)
    peak = poll_peak_memory(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {timeout_s} s)"
    peak["thread"].join(timeout=5)
    return TrainRun(command=command, returncode=proc.returncode, stdout=stdout, stderr=stderr,
                    records=read_step_records(log_path), peak_mem_mib=peak["peak"],
                    out_of_memory="out of GPU memory" in stderr or "out of memory" in stderr.lower(),
                    seconds=time.time() - start)


def run_train_gpt_ranks(args, log_path, world, timeout_s=600, out_prefix=None, echo=True):
    """Runs `world` ./train_gpt processes, one per GPU, with torchrun-style variables (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT) and NCCL_NVLS_ENABLE=0; rank 0 writes --log-file log_path. Each
    rank's output goes to <out_prefix>.rank<r>.out (default: beside the log). Returns a TrainRun:
    the first non-zero exit status, rank 0's output, every rank's last lines as stderr, records of
    rank 0's log, and the largest peak memory of any rank (peak_mem_mib_per_rank lists them all).
    world 1 runs one process on GPU 0 without the variables."""
    out_prefix = out_prefix or (log_path[:-6] if log_path.endswith(".jsonl") else log_path)
    port = 29500 + random.randrange(2000)
    if os.path.exists(log_path):
        os.remove(log_path)
    procs, peaks, out_paths = [], [], []
    start = time.time()
    for rank in range(world):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        else:
            env.update(CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0"))
        command = [TRAIN_GPT, *[str(a) for a in args]] + (["--log-file", log_path] if rank == 0 else [])
        if rank == 0 and echo:
            print("$ " + (f"RANK=0..{world - 1} WORLD_SIZE={world} " if world > 1 else "") +
                  " ".join(shlex.quote(c) for c in command), flush=True)
        out_paths.append(f"{out_prefix}.rank{rank}.out")
        with open(out_paths[-1], "w") as out:
            procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env))
        peaks.append(poll_peak_memory(procs[-1]))
    deadline = time.time() + timeout_s
    codes, killed = [], False
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            killed = True
            for q in procs:
                q.kill()
            codes.append(p.wait())
    for peak in peaks:
        peak["thread"].join(timeout=5)
    outputs = []
    for path in out_paths:
        with open(path) as f:
            outputs.append(f.read())
    stderr = "\n".join(f"[rank {r}] " + "\n".join(o.strip().splitlines()[-3:]) for r, o in enumerate(outputs))
    if killed:
        stderr += f"\n(killed after {timeout_s} s)"
    run = TrainRun(command=[TRAIN_GPT, *[str(a) for a in args]], returncode=next((c for c in codes if c), 0),
                   stdout=outputs[0], stderr=stderr, records=read_step_records(log_path),
                   peak_mem_mib=max(pk["peak"] for pk in peaks),
                   out_of_memory=any("out of gpu memory" in o.lower() or "out of memory" in o.lower() for o in outputs),
                   seconds=time.time() - start)
    run.peak_mem_mib_per_rank = [pk["peak"] for pk in peaks]
    return run


def steady_state(records, skip):
    """Median ms, tokens/s, TFLOP/s and MFU over the steps after the first `skip`, or None."""
    timed = records[skip:]
    if not timed:
        return None
    ms = statistics.median(r["ms"] for r in timed)
    ref = timed[0]  # tokens, FLOPs and peak per step are the same every step: scale by time
    return {"ms": ms, "steps_timed": len(timed),
            "tokens_per_s": ref["tokens_per_s"] * ref["ms"] / ms,
            "tflops_per_gpu": ref["tflops_per_gpu"] * ref["ms"] / ms,
            "mfu": ref["mfu"] * ref["ms"] / ms}


def git_commit():
    """GIT_COMMIT from the environment (a copied tree's git metadata may be stale), else git rev-parse."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout
        return out.splitlines()[0].strip() if out.strip() else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def gpu_slug(name):
    """A short file-name tag for a GPU: h100, h200, a100, else the name's letters and digits."""
    lower = name.lower()
    for tag in ("h200", "h100", "a100", "b200"):
        if tag in lower:
            return tag
    return "".join(c for c in lower if c.isalnum())[:16] or "gpu"


def run_metadata():
    return {"device": gpu_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(), "command": " ".join(shlex.quote(a) for a in ["python3"] + sys.argv)}
