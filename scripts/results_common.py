"""results_common.py: what every benchmark script records about a run, and how it writes results.

Used by scripts/train_runs.py, bench_train.py, bench_long_context.py, bench_multigpu.py, table1.py,
soak_preemption.py, bench_attention.py, bench_decode.py, check_vs_torch.py, check_hf_roundtrip.py and
check_generate_vs_torch.py (and test/test_scripts.py). Standard library only; the GPU helpers at the end
import PyTorch when called.

  gpu_name()          the GPU the children use (first of CUDA_VISIBLE_DEVICES), by nvidia-smi
  gpu_slug(name)      a short tag for file names: "NVIDIA H100 80GB HBM3" -> "h100"
  peak_tflops(name)   dense bf16 peak by GPU name, the same table as data/gpt_config.h's
                      gpu_peak_bf16_tflops (test/test_scripts.py checks that they agree); 0 when unknown
  git_commit()        $GIT_COMMIT, else git rev-parse HEAD (+ "-dirty" with uncommitted changes)
  binary_build(path)  what a train_gpt binary was built from (its --version)
  run_metadata(binary)
                      {device, date, commit, command}: what every results file records; with the
                      train_gpt binary a run uses, also build: what that binary was built from
  write_text(path, text), write_json(path, obj)
                      written to path.tmp and renamed, so a crash never leaves half a results file
  load_previous(json_path, device, fresh)
                      the records of an existing results file of the same device (a warning otherwise)
  merge(records, new, key_fields, defaults)
                      records with `new` in place of the record of the same key
  text_table(header, rows, left)
                      fixed-width columns for the terminal
  runs_and_notes(records, notes, notes_title)
                      the markdown lines listing the runs (date, commit, command) and the notes
  length_label(n)     512, 1k, 2k, ...: sequence and cache lengths in tables
  parse_list(text, convert)
                      comma-separated values, "8k" meaning 8192
  balanced_orders(n)  orders of n items for rounds run back to back, in which each item follows every
                      other equally often, across the rounds' boundaries too (rounds of timings taken
                      in turns: the GPU's clocks follow what ran just before)
  Report(path)        prints lines, keeps them (.lines) and, given a path, writes each to that file
  Skip                the exception for a point a benchmark cannot run
  L2_FLUSH_BYTES, MIN_REPS
                      the GPU benchmarks' L2 flush buffer and fewest timed runs
  median_gpu_ms(fn, flush, warmup_ms, rep_ms, min_reps, max_reps), copy_gbps(...): the copy-rate ceiling
                      the GPU benchmarks' one timing method (PyTorch)
  rel_error(x, ref)   ||x - ref|| / ||ref|| in fp32, NaN when x is not finite (PyTorch)
"""
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvidia_smi(query):
    """Rows (lists of fields) of an nvidia-smi csv query; None when nvidia-smi is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[field.strip() for field in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def gpu_index():
    """The GPU the children use: the first of CUDA_VISIBLE_DEVICES when it is a plain index, else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return first if first.isdigit() else "0"


def gpu_name():
    rows = nvidia_smi(["--query-gpu=name", "-i", gpu_index()])
    return rows[0][0] if rows else "unknown GPU"


def gpu_slug(name):
    """A short name for the GPU: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB" -> "a100"."""
    tokens = re.split(r"[^a-z0-9]+", name.lower().replace("nvidia", ""))
    for token in tokens:
        if re.fullmatch(r"[a-z]+\d+[a-z]*", token):
            return token
    return "-".join(t for t in tokens if t) or "gpu"


def peak_tflops(name):
    """Dense bf16 tensor-core peak in TFLOP/s by CUDA device name (SXM parts; PCIe and NVL run lower
    clocks), as data/gpt_config.h's gpu_peak_bf16_tflops; 0.0 when the name is not known."""
    if "H100" in name or "H200" in name:
        return 756.0 if "PCIe" in name else 835.0 if "NVL" in name else 989.4
    return 312.0 if "A100" in name else 0.0


def git_commit():
    """$GIT_COMMIT when set (a copy of the tree whose git metadata is stale, as on a lent GPU machine);
    else git rev-parse HEAD, with "-dirty" when tracked files have changes; "unknown" without git."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout.strip()
        return head + ("-dirty" if status else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def binary_build(path):
    """What a train_gpt binary says it was built from (`path --version`: its commit, "-dirty" with
    uncommitted changes, and its GPU targets); "unknown" for a build older than --version or one that
    does not run. The tree's commit (git_commit) need not be the binary's: a binary can be carried in."""
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    out = r.stdout.strip()
    return out[len("train_gpt "):] if r.returncode == 0 and out.startswith("train_gpt ") else "unknown"


def run_metadata(binary=None):
    """The device, date (UTC), commit and command line that every results file records, and with
    `binary` (a train_gpt the run uses) what that binary was built from."""
    meta = {"device": gpu_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(), "command": shlex.join(["python3"] + sys.argv)}
    if binary:
        meta["build"] = binary_build(binary)
    return meta


def write_text(path, text):
    """Writes text to path through path.tmp and a rename (the directory is made if needed)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=1) + "\n")


def load_previous(json_path, device, fresh):
    """Records of an existing results file of the same device (none with --fresh or another device)."""
    if fresh or not os.path.exists(json_path):
        return []
    try:
        with open(json_path) as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        print(f"warning: {json_path} unreadable ({err}); starting a new file", flush=True)
        return []
    if old.get("device") != device:
        print(f"warning: {json_path} is of {old.get('device')!r}, not {device!r}; starting a new file", flush=True)
        return []
    return old.get("records", [])


def merge(records, new, key_fields, defaults=None):
    """records with `new` in place of a record of the same key_fields values (or appended); defaults gives
    the value of a field that older records lack."""
    defaults = defaults or {}

    def key(r):
        return tuple(r.get(k, defaults.get(k)) for k in key_fields)

    return [r for r in records if key(r) != key(new)] + [new]


def text_table(header, rows, left=(0,)):
    """The rows in fixed-width columns for the terminal: columns in `left` left-aligned, the others right."""
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header)] + [line(r) for r in rows])


def runs_and_notes(records, notes, notes_title="Notes:"):
    """Markdown lines: the runs the records came from (date, commit, command), then the notes if any."""
    runs = sorted({(r.get("date", ""), r.get("commit", ""), r.get("bench_command", "")) for r in records})
    md = ["", "Runs (date, commit, command):", ""] + [f"- {d}, `{c}`: `{cmd}`" for d, c, cmd in runs]
    if notes:
        md += ["", notes_title, ""] + [f"- {n}" for n in notes]
    return md


def length_label(n):
    """512, 1k, 2k, ... as in the FlashAttention-2 paper's tables."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def parse_list(text, convert):
    """Comma-separated values; "1k" means 1024 for integers."""
    values = []
    for item in text.split(","):
        item = item.strip().lower()
        if item:
            values.append(convert(item[:-1]) * 1024 if item.endswith("k") else convert(item))
    return values


def balanced_orders(n):
    """Orders of range(n) for rounds that run back to back: read as one cycle (the last round's last item
    followed by the first round's first), every item comes right after every other exactly once, and never
    right after itself. n − 1 orders of n items for n >= 2 ([[0]] for 1, [] for 0). Rounds of timings taken
    in turns use them, since a timing depends on what the GPU ran just before it. A rotated order (0 1 2,
    1 2 0, 2 0 1) keeps every item behind the same neighbour; a Williams design (each order balanced
    within itself) still leaves the rounds' boundaries unbalanced: run back to back with three items, one
    item followed the slowest one in half of the rounds and another in a third. The rounds' first item
    follows whatever ran before them: the caller runs the cycle's last item once first, untimed."""
    if n < 1:
        return []
    if n == 1:
        return [[0]]
    total, seq = n * (n - 1), list(range(n))
    used = {(a, a + 1) for a in range(n - 1)}

    def extend():  # depth-first: the next item, not yet in its round, along an unused (before, after) pair
        if len(seq) == total:
            return (seq[-1], seq[0]) not in used
        in_round = set(seq[len(seq) - len(seq) % n:])
        for after in range(n):
            pair = (seq[-1], after)
            if after in in_round or after == seq[-1] or pair in used:
                continue
            seq.append(after)
            used.add(pair)
            if extend():
                return True
            seq.pop()
            used.discard(pair)
        return False

    if not extend():
        raise ValueError(f"balanced_orders: no serially balanced rounds for {n} items")
    return [seq[i:i + n] for i in range(0, total, n)]


class Report:
    """Prints lines and keeps them (.lines); given a path, also writes each line to that file as it comes
    (flushed, so a crash keeps them). close() or a with block closes the file."""

    def __init__(self, path=None):
        self.lines = []
        self.f = open(path, "w") if path else None

    def __call__(self, line=""):
        print(line, flush=True)
        self.lines.append(line)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()
            self.f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# GPU benchmarks (PyTorch, imported when called)

class Skip(Exception):
    """A point an implementation cannot run (rejected shape, not enough memory); the message says why."""


L2_FLUSH_BYTES = 256 * 1024 * 1024  # zeroed before every timed run: larger than any GPU's L2
MIN_REPS = 5  # fewest timed runs of a measurement


def rel_error(x, ref):
    """||x - ref|| / ||ref|| in fp32; NaN when x has a NaN or Inf."""
    import torch
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("nan")
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref))


def copy_gbps(flush, warmup_ms, rep_ms, min_reps, max_reps):
    """Device-to-device copy rate of a 1 GiB buffer (torch copy_), bytes read + written per second / 1e9,
    timed as median_gpu_ms: the bandwidth ceiling the decoding benchmarks compare against."""
    import torch
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = median_gpu_ms(lambda: dst.copy_(src), flush, warmup_ms, rep_ms, min_reps, max_reps)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * (1 << 30) / (ms * 1e-3) / 1e9


def median_gpu_ms(fn, flush, warmup_ms, rep_ms, min_reps, max_reps):
    """Median milliseconds of fn() over about rep_ms of runs (min_reps to max_reps), each timed by its own
    CUDA events, with the L2 cache flushed (flush.zero_(), a buffer larger than L2) before every run and
    about warmup_ms of untimed runs first. The benchmarks' one timing method (PyTorch on a GPU)."""
    import statistics

    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)  # ms per run, flush included (as do_bench)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = min(max_reps, max(min_reps, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
