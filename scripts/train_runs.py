"""train_runs.py: run ./train_gpt as a benchmark child and read back what it measured.

Shared by scripts/table1.py, scripts/bench_train.py and scripts/bench_multigpu.py. Numpy and PyTorch are
not needed.

run_train_gpt(args, log_path) runs `./train_gpt args --log-file log_path`, polls nvidia-smi for the
child's GPU memory while it runs, and returns a TrainRun: the exit status, the output, the per-step
JSON records of the log, the peak memory, and whether it ran out of GPU memory.
run_train_gpt_ranks(args, log_path, world) does the same for one process per GPU (data parallel).
Both add --checkpoint-dir none (unless args give --checkpoint-dir or --resume) and --sample-tokens 0
(unless args give --sample-every): train_gpt's default checkpoint and sample after the last step have
no place in a benchmark (quiet_flags).
steady_state(records, skip) summarizes the steps after the first `skip` (warm-up: cuBLASLt
heuristics, first-touch allocation) by their median step time.
run_child(command, log_path, timeout_s, env) runs any child (train_gpt or the PyTorch reference) with its
output in a log file while a MemoryPoller records its peak GPU memory.
The device, date, commit and results files: scripts/results_common.py.
"""
import dataclasses
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402

REPO_ROOT = results_common.REPO_ROOT
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


class MemoryPoller:
    """Peak GPU memory of one process, polled every `interval` seconds on a thread: the process's own
    (nvidia-smi --query-compute-apps; None where nvidia-smi never lists its pid, e.g. in a container's
    pid namespace) and the whole GPU's (--query-gpu=memory.used; None without nvidia-smi), in MiB."""

    def __init__(self, pid, interval=0.2):
        self.pid, self.interval = str(pid), interval
        self.process_mib = None
        self.gpu_mib = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            apps = results_common.nvidia_smi(["--query-compute-apps=pid,used_memory"])
            for row in apps or []:
                if len(row) == 2 and row[0] == self.pid and row[1].isdigit():
                    self.process_mib = max(self.process_mib or 0, int(row[1]))
            gpu = results_common.nvidia_smi(["--query-gpu=memory.used", "-i", results_common.gpu_index()])
            if gpu and gpu[0][0].isdigit():
                self.gpu_mib = max(self.gpu_mib or 0, int(gpu[0][0]))
            if self._stop.wait(self.interval):
                return

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_child(command, log_path, timeout_s, env=None):
    """Runs `command` from the repository root with its output (after a "$ command" line) in log_path,
    polling its GPU memory. Returns (exit status or "timeout", wall seconds, the stopped MemoryPoller)."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
        poller = MemoryPoller(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        finally:
            poller.stop()
    return rc, time.monotonic() - start, poller


def read_step_records(path):
    """The step records ({"step", "loss", ...}) of a train_gpt JSON-lines log; validation lines skipped."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # blank, or the torn last line of a killed run
                continue
    return [r for r in records if "loss" in r]


def quiet_flags(args):
    """The flags that turn off train_gpt's default checkpoint after the last step (runs/<model>, GBs) and its
    sample after the last step, unless `args` ask for checkpoints (--checkpoint-dir, --resume) or samples
    (--sample-every) themselves."""
    given = {str(a).split("=", 1)[0] for a in args}
    flags = []
    if not given & {"--checkpoint-dir", "--resume"}:
        flags += ["--checkpoint-dir", "none"]
    if "--sample-every" not in given:
        flags += ["--sample-tokens", "0"]
    return flags


def run_train_gpt(args, log_path, timeout_s=600, env=None, echo=True):
    """Runs ./train_gpt with `args` (plus quiet_flags) plus --log-file log_path; never raises on the child's
    failure."""
    args = [*args, *quiet_flags(args)]
    command = [TRAIN_GPT, *[str(a) for a in args], "--log-file", log_path]
    if os.path.exists(log_path):
        os.remove(log_path)
    if echo:
        print("$ " + " ".join(shlex.quote(c) for c in command), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            env=env)
    poller = MemoryPoller(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {timeout_s} s)"
    poller.stop()
    return TrainRun(command=command, returncode=proc.returncode, stdout=stdout, stderr=stderr,
                    records=read_step_records(log_path), peak_mem_mib=poller.process_mib or 0.0,
                    out_of_memory="out of GPU memory" in stderr or "out of memory" in stderr.lower(),
                    seconds=time.monotonic() - start)


def free_port():
    """A TCP port no process listens on now (the kernel's pick for port 0), for a rendezvous: a fixed or
    random one may be another run's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_train_gpt_ranks(args, log_path, world, timeout_s=600, out_prefix=None, echo=True, env=None, binary=None):
    """Runs `world` ./train_gpt processes, one per GPU, with torchrun-style variables (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT) and NCCL_NVLS_ENABLE=0; rank 0 writes --log-file log_path. Each
    rank's output goes to <out_prefix>.rank<r>.out (default: beside the log). Returns a TrainRun:
    the first non-zero exit status, rank 0's output, every rank's last lines as stderr, records of
    rank 0's log, and the largest peak memory of any rank (peak_mem_mib_per_rank lists them all).
    world 1 runs one process on GPU 0 (or CUDA_VISIBLE_DEVICES of `env`) without the variables. `env`:
    variables added to every process's environment. quiet_flags are added to args. `binary`: the program
    (default ./train_gpt)."""
    args = [*args, *quiet_flags(args)]
    binary = binary or TRAIN_GPT
    out_prefix = out_prefix or (log_path[:-6] if log_path.endswith(".jsonl") else log_path)
    port = free_port()
    if os.path.exists(log_path):
        os.remove(log_path)
    procs, pollers, out_paths = [], [], []
    start = time.monotonic()
    extra = env or {}
    for rank in range(world):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", **extra)
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        else:
            env.update(CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0"))
        command = [binary, *[str(a) for a in args]] + (["--log-file", log_path] if rank == 0 else [])
        if rank == 0 and echo:
            print("$ " + (f"RANK=0..{world - 1} WORLD_SIZE={world} " if world > 1 else "") +
                  " ".join(shlex.quote(c) for c in command), flush=True)
        out_paths.append(f"{out_prefix}.rank{rank}.out")
        with open(out_paths[-1], "w") as out:
            procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env))
        pollers.append(MemoryPoller(procs[-1].pid))
    deadline = time.monotonic() + timeout_s
    codes, killed = [], False
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            killed = True
            for q in procs:
                q.kill()
            codes.append(p.wait())
    for poller in pollers:
        poller.stop()
    outputs = []
    for path in out_paths:
        with open(path) as f:
            outputs.append(f.read())
    stderr = "\n".join(f"[rank {r}] " + "\n".join(o.strip().splitlines()[-3:]) for r, o in enumerate(outputs))
    if killed:
        stderr += f"\n(killed after {timeout_s} s)"
    run = TrainRun(command=[binary, *[str(a) for a in args]], returncode=next((c for c in codes if c), 0),
                   stdout=outputs[0], stderr=stderr, records=read_step_records(log_path),
                   peak_mem_mib=max(pl.process_mib or 0.0 for pl in pollers),
                   out_of_memory=any("out of gpu memory" in o.lower() or "out of memory" in o.lower() for o in outputs),
                   seconds=time.monotonic() - start)
    run.peak_mem_mib_per_rank = [pl.process_mib or 0.0 for pl in pollers]
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
