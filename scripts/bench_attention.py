#!/usr/bin/env python3
"""bench_attention.py: time our attention backends against PyTorch SDPA in the same process.

Our backends are called through build/libattention.so (ctypes, attention/tools/attention_flat_api.cu);
PyTorch's are scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION) ("torch-flash",
FlashAttention-2) and sdpa_kernel(CUDNN_ATTENTION) ("torch-cudnn"). Everyone gets the trainer's layout:
one packed bf16 activation qkv (B, T, NH + 2*NKV, HD) of random normal values (NKV = NH: (B, T, 3, NH, HD)).
Ours reads it through strided pointers (q = qkv, k = qkv + NH*HD, v = qkv + (NH + NKV)*HD, row stride
(NH + 2*NKV)*HD) and writes the gradients into a packed dqkv; PyTorch gets q, k, v = the NH, NKV and NKV
heads of qkv, each .transpose(1, 2), i.e. strided (B, heads, T, HD) views, as a GPT model does.

Grouped-query attention: --kv-heads 4 gives every point NKV = 4 key/value heads (PyTorch: SDPA with
enable_gqa=True); a list (--kv-heads 4,0) runs each value, 0 meaning NKV = NH (multi-head), and adds
rows of flash2 GQA / flash2 multi-head at the same shape. Every record has its kv_heads; the files are
attention_<gpu>_gqa.* unless --tag says otherwise. FLOPs count the query heads (the same as multi-head).

Grid (the FlashAttention-2 paper's): hidden 2048, head dim 64 and 128 (heads =
2048 / head dim), causal and not, seqlen 512 ... 16k with batch = 16384 / seqlen.

Method, the same for every implementation (that of triton.testing.do_bench): the L2 cache is flushed
(a 256 MiB buffer is zeroed) before every run, each run is timed by its own pair of CUDA events,
runs repeat for about --rep-ms after --warmup-ms of warm-up, and the median counts. With --rounds N
each implementation is timed N times at a point, taking turns with the others, and the median of the N
counts: a long run's clocks follow the GPU's power draw, which one implementation's timing can catch at a
low and another's not. The rounds run back to back in orders that put each implementation right after
every other equally often, across the rounds' boundaries too (results_common.balanced_orders; fully with
N a multiple of the implementations' count less one), since a timing also depends on what ran just
before it; the first round's first implementation follows an untimed run of the cycle's last one.
  forward   one forward call in training mode (ours writes out and the LSE; PyTorch's inputs
            require grad, so it saves what its backward needs)
  backward  ours: one backward call (after a forward, so out and LSE are valid);
            PyTorch: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) on an output
            computed once, i.e. SDPA's backward alone; the copy of dq, dk, dv into a packed dqkv
            that a GPT's unbind would add is not timed (ours writes the packed dqkv directly)
  fwd+bwd   the sum of the forward and backward medians
FLOPs as in the FA2 paper: fwd = 4·B·T²·HD·NH, halved when causal; bwd = 2.5·fwd; fwd+bwd = 3.5·fwd.

Before timing, every implementation's out, dq, dk and dv are compared with torch-flash's (relative
error ‖x − ref‖/‖ref‖ ≤ --check-tolerance, no NaN); a point that fails is shown as WRONG.

Writes <out-dir>/attention_<gpu>[_<tag>].json (every record; rewritten after every point, so a crash
keeps what was measured) and .md (the tables, command and commit), and prints the tables last.

Usage (from the repository root, after `make build/libattention.so`):
    python3 scripts/bench_attention.py                                  # the whole grid
    python3 scripts/bench_attention.py --hdims 128 --causal 1 --seqlens 2k,8k
    python3 scripts/bench_attention.py --hdims 64,128 --rounds 6     # the grid, each point timed 6 times in turns
    python3 scripts/bench_attention.py --impls flash2,naive,torch-flash --tag naive
    python3 scripts/bench_attention.py --impls flash1,flash2 --seqlens 2k,8k --tag flash1   # FA1 vs FA2
"""
import argparse
import contextlib
import ctypes
import datetime
import gc
import math
import os
import shlex
import statistics
import sys
import warnings

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as err:
    sys.exit(f"bench_attention.py: error: {err}; run this on a GPU machine with PyTorch >= 2.3")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
from results_common import (L2_FLUSH_BYTES, MIN_REPS, Skip, balanced_orders, git_commit, gpu_slug,  # noqa: E402
                            length_label as seqlen_label, median_gpu_ms, parse_list, rel_error, write_json,
                            write_text)
OUR_IMPLS = ("naive", "flash1", "flash2")
TORCH_IMPLS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}
REFERENCE_ORDER = ("torch-flash", "torch-cudnn")  # the first that runs is the correctness reference
PASSES = ("fwd", "bwd", "fwd+bwd")
MAX_REPS = 1000  # most timed runs of a measurement (L2_FLUSH_BYTES, MIN_REPS: results_common's)


# ---------------------------------------------------------------------------------------------
# Our backends through ctypes

def load_library(path):
    """Loads libattention.so and declares the argument types of its flat C functions."""
    if not os.path.exists(path):
        sys.exit(f"bench_attention.py: error: {path} not found; build it with `make build/libattention.so`")
    lib = ctypes.CDLL(path)
    i, n, p, s = ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_char_p
    shape = [s, i, i, i, i, i, i]  # backend, B, T, NH, NKV, HD, causal
    lib.attention_flat_last_error.restype = s
    lib.attention_flat_last_error.argtypes = []
    for fn in (lib.attention_flat_saved_bytes, lib.attention_flat_workspace_bytes):
        fn.restype = n
        fn.argtypes = shape
    lib.attention_flat_forward.restype = i
    # q, k, v, qkv_stride, kv_stride, out, out_stride, lse, saved, workspace, stream
    lib.attention_flat_forward.argtypes = shape + [p, p, p, n, n, p, n, p, p, p, p]
    lib.attention_flat_backward.restype = i
    # q, k, v, qkv_stride, kv_stride, out, out_stride, lse, dout, dq, dk, dv, dqkv_stride, dkv_stride, saved,
    # workspace, stream
    lib.attention_flat_backward.argtypes = shape + [p, p, p, n, n, p, n, p, p, p, p, p, n, n, p, p, p]
    return lib


def last_error(lib):
    """The library's message for the last call that returned -1."""
    return lib.attention_flat_last_error().decode(errors="replace")


def our_runner(lib, impl, qkv, dout, causal):
    """Sets up our backend `impl` on the packed qkv (B, T, NH + 2·NKV, HD) and dout (B, T, NH, HD).

    Returns (forward, backward, results): two functions that enqueue one call each on the current
    stream, and one that returns out, dq (B, T, NH, HD) and dk, dv (B, T, NKV, HD) views. Raises Skip
    when the backend rejects the shape or its memory does not fit.
    """
    B, T, W, HD = qkv.shape
    NH = dout.shape[2]
    NKV = (W - NH) // 2
    name = impl.encode()
    dims = (name, B, T, NH, NKV, HD, int(causal))
    saved_bytes = lib.attention_flat_saved_bytes(*dims)
    workspace_bytes = lib.attention_flat_workspace_bytes(*dims)
    if saved_bytes < 0 or workspace_bytes < 0:
        raise Skip(f"rejected: {last_error(lib)}")
    free = torch.cuda.mem_get_info()[0]
    if saved_bytes + workspace_bytes > 0.9 * free:
        raise Skip(f"needs {(saved_bytes + workspace_bytes) / 2**30:.1f} GiB of saved + workspace memory, "
                   f"{free / 2**30:.1f} GiB free")
    out = torch.empty((B, T, NH, HD), dtype=torch.bfloat16, device=qkv.device)
    lse = torch.empty((B, NH, T), dtype=torch.float32, device=qkv.device)
    dqkv = torch.empty_like(qkv)
    saved = torch.empty(saved_bytes, dtype=torch.uint8, device=qkv.device) if saved_bytes else None
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=qkv.device) if workspace_bytes else None

    row, stride = NH * HD, W * HD  # elements of one token's q, and of its packed row
    at = [0, NH * HD * qkv.element_size(), (NH + NKV) * HD * qkv.element_size()]  # bytes to q, k, v
    q, k, v = (qkv.data_ptr() + a for a in at)
    dq, dk, dv = (dqkv.data_ptr() + a for a in at)
    saved_ptr = saved.data_ptr() if saved is not None else None
    workspace_ptr = workspace.data_ptr() if workspace is not None else None
    stream = torch.cuda.current_stream().cuda_stream

    def forward():
        if lib.attention_flat_forward(*dims, q, k, v, stride, stride, out.data_ptr(), row, lse.data_ptr(),
                                      saved_ptr, workspace_ptr, stream) != 0:
            raise Skip(f"forward failed: {last_error(lib)}")

    def backward():
        if lib.attention_flat_backward(*dims, q, k, v, stride, stride, out.data_ptr(), row, lse.data_ptr(),
                                       dout.data_ptr(), dq, dk, dv, stride, stride, saved_ptr, workspace_ptr,
                                       stream) != 0:
            raise Skip(f"backward failed: {last_error(lib)}")

    def results():
        return out, dqkv[:, :, :NH], dqkv[:, :, NH:NH + NKV], dqkv[:, :, NH + NKV:]

    # The closures keep out, lse, dqkv, saved and workspace alive for as long as the runner lives.
    forward.buffers = (out, lse, dqkv, saved, workspace)
    return forward, backward, results


# ---------------------------------------------------------------------------------------------
# PyTorch SDPA

def torch_runner(impl, qkv, dout, causal):
    """Sets up PyTorch SDPA with one backend on q, k, v = the NH, NKV, NKV heads of qkv as (B, heads, T, HD)
    views (enable_gqa=True when NKV < NH).

    Returns (forward, backward, results) like our_runner; they must run inside sdpa_kernel(backend)
    (see backend_context). Raises Skip when that backend cannot run the shape.
    """
    NH = dout.shape[2]
    NKV = (qkv.shape[2] - NH) // 2
    leaf = qkv.detach().requires_grad_(True)
    q, k, v = (x.transpose(1, 2) for x in leaf.split([NH, NKV, NKV], dim=2))  # strided views
    dout_t = dout.transpose(1, 2)  # (B, NH, T, HD) view of (B, T, NH, HD)
    gqa = {"enable_gqa": True} if NKV != NH else {}
    try:
        with backend_context(impl), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns at length about why a backend does not apply
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), **gqa)
            grads = torch.autograd.grad(out, (q, k, v), dout_t, retain_graph=True)
    except RuntimeError as err:
        raise Skip(f"rejected: {str(err).splitlines()[0]}")

    def forward():
        F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), **gqa)

    def backward():
        torch.autograd.grad(out, (q, k, v), dout_t, retain_graph=True)

    def results():
        return (out.transpose(1, 2),) + tuple(g.transpose(1, 2) for g in grads)

    return forward, backward, results


def backend_context(impl):
    """sdpa_kernel(backend) for a PyTorch implementation; a no-op context for ours."""
    return sdpa_kernel([TORCH_IMPLS[impl]]) if impl in TORCH_IMPLS else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# Timing and checking

def measure_ms(fn, flush, warmup_ms, rep_ms):
    """Median milliseconds of fn(), L2 flushed before every run (results_common.median_gpu_ms)."""
    return median_gpu_ms(fn, flush, warmup_ms, rep_ms, MIN_REPS, MAX_REPS)


def rel_errors(results, reference):
    """{"out"/"dq"/"dk"/"dv": ‖x − ref‖/‖ref‖} in fp32; NaN when x has a NaN or Inf."""
    return {name: rel_error(x, ref) for name, x, ref in zip(("out", "dq", "dk", "dv"), results, reference)}


def point_flops(B, T, NH, HD, causal):
    """Forward FLOPs as in the FA2 paper: 4·B·T²·HD·NH, halved when causal."""
    flops = 4.0 * B * T * T * HD * NH
    return flops / 2 if causal else flops


def run_point(impls, lib, hdim, causal, seqlen, kv_heads, args, flush):
    """Checks and times every implementation on one grid point (kv_heads 0: NH). Returns a list of records.

    Every implementation is set up and checked first; then --rounds rounds time each one's forward and
    backward in turn (results_common.balanced_orders), and a record keeps the median over the rounds."""
    B, NH = args.tokens // seqlen, args.hidden // hdim
    NKV = kv_heads or NH
    base = {"hdim": hdim, "causal": bool(causal), "seqlen": seqlen, "batch": B, "heads": NH, "kv_heads": NKV}
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    qkv = torch.randn((B, seqlen, NH + 2 * NKV, hdim), generator=gen, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn((B, seqlen, NH, hdim), generator=gen, device="cuda", dtype=torch.bfloat16)
    reference = reference_results(qkv, dout, causal)
    records, runners = [], {}
    for impl in impls:
        record = dict(impl=impl, **base, fwd_tflops=None, bwd_tflops=None, fwdbwd_tflops=None, fwd_ms=None,
                      bwd_ms=None, status="ok", note="", check=None)
        runners[impl] = set_up_and_check(impl, lib, qkv, dout, causal, reference, args, record)
        records.append(record)
    del reference
    times, failed = time_rounds(runners, flush, args)
    fwd_flops = point_flops(B, seqlen, NH, hdim, causal)
    for record in records:
        if record["impl"] in failed:
            record["status"], record["note"] = "skipped", failed[record["impl"]]
        else:
            finish_record(record, times.get(record["impl"], []), fwd_flops)
        print(progress_line(record), flush=True)
    del runners, qkv, dout
    gc.collect()
    torch.cuda.empty_cache()
    return records


def reference_results(qkv, dout, causal):
    """(impl, (out, dq, dk, dv)) of the correctness reference: torch-flash (torch-cudnn where flash cannot
    run); (None, None) when no PyTorch backend runs the point."""
    for impl in REFERENCE_ORDER:
        try:
            _, _, results = torch_runner(impl, qkv, dout, causal)
            return impl, tuple(r.detach().clone() for r in results())
        except Skip:
            continue
    return None, None


def set_up_and_check(impl, lib, qkv, dout, causal, reference, args, record):
    """The (forward, backward) of impl after one checked call of each, or None (record says why)."""
    reference_impl, expected = reference
    try:
        with backend_context(impl):
            forward, backward, results = (our_runner(lib, impl, qkv, dout, causal) if impl in OUR_IMPLS
                                          else torch_runner(impl, qkv, dout, causal))
            forward()
            backward()
            torch.cuda.synchronize()
        if expected is None:
            record["note"] = "not checked: no PyTorch backend ran as a reference"
        elif impl != reference_impl:
            errors = rel_errors(results(), expected)
            record["check"] = {"against": reference_impl, **errors}
            bad = [n for n, e in errors.items() if not e <= args.check_tolerance]
            if bad:
                record["status"] = "wrong"
                record["note"] = f"WRONG vs {reference_impl}: " + ", ".join(f"{n} {errors[n]:.1e}" for n in bad)
        return forward, backward
    except Skip as why:
        record["status"], record["note"] = "skipped", str(why)
    except torch.cuda.OutOfMemoryError:
        record["status"], record["note"] = "skipped", "out of GPU memory"
    except RuntimeError as err:  # a PyTorch backend that fails past its own checks
        record["status"], record["note"] = "skipped", f"failed: {str(err).splitlines()[0]}"
    return None


def time_rounds(runners, flush, args):
    """({impl: [(fwd_ms, bwd_ms) per round]}, {impl: why it failed}): the implementations take turns in
    the orders of balanced_orders, so that each is timed right after every other equally often, the
    rounds' boundaries included (the GPU's clocks follow its recent load: with a rotated order each one
    ran, within a round, always after the same other one). With several rounds the cycle's last
    implementation first runs once untimed, so that the first timing follows it as it does in the cycle.
    One that fails while timed (out of memory, a backend error) drops out."""
    ready = [impl for impl, runner in runners.items() if runner]
    times, failed = {impl: [] for impl in ready}, {}
    orders = balanced_orders(len(ready))
    timed = [(rnd, ready[i]) for rnd in range(args.rounds if ready else 0) for i in orders[rnd % len(orders)]]
    if args.rounds > 1 and timed:
        timed.insert(0, (None, ready[orders[-1][-1]]))
    for rnd, impl in timed:
        if impl in failed:
            continue
        forward, backward = runners[impl]
        try:
            with backend_context(impl):
                pair = (measure_ms(forward, flush, args.warmup_ms, args.rep_ms),
                        measure_ms(backward, flush, args.warmup_ms, args.rep_ms))
            if rnd is not None:
                times[impl].append(pair)
        except torch.cuda.OutOfMemoryError:
            failed[impl] = "out of GPU memory while timed"
        except RuntimeError as err:
            failed[impl] = f"failed while timed: {str(err).splitlines()[0]}"
    return times, failed


def finish_record(record, times, fwd_flops):
    """The medians over the rounds, and TFLOP/s from them; every round's times where there were several."""
    if not times:
        return
    record["fwd_ms"] = statistics.median(f for f, _ in times)
    record["bwd_ms"] = statistics.median(b for _, b in times)
    if len(times) > 1:
        record["rounds_ms"] = [list(t) for t in times]
    record["fwd_tflops"] = fwd_flops / (record["fwd_ms"] * 1e-3) / 1e12
    record["bwd_tflops"] = 2.5 * fwd_flops / (record["bwd_ms"] * 1e-3) / 1e12
    record["fwdbwd_tflops"] = 3.5 * fwd_flops / ((record["fwd_ms"] + record["bwd_ms"]) * 1e-3) / 1e12


def progress_line(r):
    """One line per measured (implementation, point) while the benchmark runs."""
    where = (f"hd{r['hdim']} {'causal' if r['causal'] else 'full'} T={r['seqlen']} B={r['batch']}"
             f" NKV={r['kv_heads']}")
    if r["status"] == "skipped":
        return f"{where:28} {r['impl']:12} skipped: {r['note']}"
    text = (f"{where:28} {r['impl']:12} fwd {r['fwd_ms']:8.3f} ms {r['fwd_tflops']:6.1f}  "
            f"bwd {r['bwd_ms']:8.3f} ms {r['bwd_tflops']:6.1f}  fwd+bwd {r['fwdbwd_tflops']:6.1f} TFLOP/s")
    if r["check"]:
        text += "  check " + " ".join(f"{n} {r['check'][n]:.1e}" for n in ("out", "dq", "dk", "dv"))
    return text + (f"  {r['note']}" if r["note"] else "")


# ---------------------------------------------------------------------------------------------
# Tables and files

PASS_KEYS = {"fwd": "fwd_tflops", "bwd": "bwd_tflops", "fwd+bwd": "fwdbwd_tflops"}


def ratio_rows(label, num, den, impl_num, impl_den, seqlens):
    """One row per pass: TFLOP/s of impl_num in num over impl_den's in den ({(impl, seqlen): record}) at every
    seqlen, "-" where either did not run ok."""
    rows = []
    for p in PASSES:
        cells = []
        for t in seqlens:
            a, b = num.get((impl_num, t)), den.get((impl_den, t))
            ok = a and b and a["status"] == "ok" and b["status"] == "ok"
            cells.append(f"{a[PASS_KEYS[p]] / b[PASS_KEYS[p]]:.2f}x" if ok else "-")
        rows.append([f"{label} {p}"] + cells)
    return rows


def table_rows(records, impls, hdim, causal, seqlens, nkv, nh):
    """Rows [label, cell per seqlen] of TFLOP/s for one (hdim, causal, NKV), then ratio rows (flash2/flash1,
    ours/torch, and for GQA ours against ours multi-head, NKV = nh, where that ran)."""
    def of(kv):
        return {(r["impl"], r["seqlen"]): r for r in records
                if r["hdim"] == hdim and r["causal"] == bool(causal) and r["kv_heads"] == kv}
    by_key = of(nkv)
    mha = of(nh) if nkv != nh else {}
    rows = []
    for impl in impls:
        for p in PASSES:
            cells = []
            for t in seqlens:
                r = by_key.get((impl, t))
                if r is None or r["status"] == "skipped":
                    cells.append("skip")
                elif r["status"] == "wrong":
                    cells.append("WRONG")
                else:
                    cells.append(f"{r[PASS_KEYS[p]]:.0f}")
            rows.append([f"{impl} {p}"] + cells)
    # flash2 against flash1 (the FA2 paper's comparison), then ours against each PyTorch backend
    pairs = [("flash2", "flash1")] if "flash1" in impls and "flash2" in impls else []
    pairs += [(ours, theirs) for ours in impls if ours in OUR_IMPLS for theirs in impls if theirs in TORCH_IMPLS]
    for ours, theirs in pairs:
        rows += ratio_rows(f"{ours}/{theirs}", by_key, by_key, ours, theirs, seqlens)
    for ours in (i for i in impls if i in OUR_IMPLS and mha):
        rows += ratio_rows(f"{ours} gqa/mha", by_key, mha, ours, ours, seqlens)
    return rows


def table_title(hdim, causal, hidden, tokens, nkv):
    """"head dim 128, causal (NH 16, NKV 4, batch x seqlen = 16384)" for one table."""
    return (f"head dim {hdim}, {'causal' if causal else 'non-causal'} "
            f"(NH {hidden // hdim}, NKV {nkv}, batch x seqlen = {tokens})")


def text_table(title, rows, seqlens):
    """A fixed-width table for the terminal."""
    width = max(24, max(len(r[0]) for r in rows) + 1)
    lines = [f"{title}: TFLOP/s", "impl / pass".ljust(width) + "".join(f"{seqlen_label(t):>8}" for t in seqlens)]
    lines += [r[0].ljust(width) + "".join(f"{c:>8}" for c in r[1:]) for r in rows]
    return "\n".join(lines)


def markdown_table(title, rows, seqlens):
    """The same table in markdown."""
    lines = [f"### {title}: TFLOP/s", "", "| impl / pass | " + " | ".join(seqlen_label(t) for t in seqlens) + " |",
             "|---|" + "---:|" * len(seqlens)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def no_nan(value):
    """The value with every NaN float replaced by None, so the JSON stays standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return value


def write_results(meta, records, tables, notes, json_path, md_path, complete):
    """Writes the JSON records and the markdown tables (each through a .tmp file and a rename)."""
    write_json(json_path, no_nan({**meta, "complete": complete, "records": records}))
    md = [f"# Attention benchmark on {meta['device']}", "",
          f"- date: {meta['date']}", f"- commit: `{meta['commit']}`", f"- command: `{meta['command']}`",
          f"- torch {meta['torch']}, CUDA {meta['cuda']}", f"- method: {meta['method']}",
          f"- FLOPs: {meta['flops']}", ""]
    if not complete:
        md += ["**Incomplete: the run stopped before the end of the grid.**", ""]
    for title, rows, seqlens in tables:
        md += [markdown_table(title, rows, seqlens), ""]
    if notes:
        md += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
    write_text(md_path, "\n".join(md))


def build_tables(records, impls, hdims, causals, seqlens, args):
    """[(title, rows, seqlens)] for every (hdim, causal, NKV) that has records."""
    tables = []
    for hdim in hdims:
        for causal in causals:
            for kv in args.kv_heads:
                nkv = kv or args.hidden // hdim
                if any(r["hdim"] == hdim and r["causal"] == bool(causal) and r["kv_heads"] == nkv for r in records):
                    tables.append((table_title(hdim, causal, args.hidden, args.tokens, nkv),
                                   table_rows(records, impls, hdim, causal, seqlens, nkv, args.hidden // hdim),
                                   seqlens))
    return tables


def build_notes(records):
    """One line per skipped or wrong point."""
    return [f"{r['impl']} hd{r['hdim']} {'causal' if r['causal'] else 'non-causal'} T={r['seqlen']} "
            f"NKV={r['kv_heads']}: "
            f"{r['status']}: {r['note']}" for r in records if r["status"] != "ok" or r["note"]]


# ---------------------------------------------------------------------------------------------
# main

def main():
    parser = argparse.ArgumentParser(
        description="Time our attention backends against PyTorch SDPA (flash, cuDNN) in the same process.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="Usage" + __doc__.split("Usage", 1)[1])
    parser.add_argument("--impls", default="flash2,torch-flash,torch-cudnn",
                        help="comma-separated: " + ", ".join(OUR_IMPLS + tuple(TORCH_IMPLS)) +
                             " (default flash2,torch-flash,torch-cudnn)")
    parser.add_argument("--hdims", default="64,128", help="head dims (default 64,128)")
    parser.add_argument("--seqlens", default="512,1k,2k,4k,8k,16k", help="sequence lengths (default 512,1k,...,16k)")
    parser.add_argument("--causal", choices=["both", "1", "0"], default="both", help="mask (default both)")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head dim (default 2048)")
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen (default 16384)")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up per measurement (default 25)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed runs per measurement (default 100)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="timings per implementation and point, taken in turns; the median counts (default 1)")
    parser.add_argument("--check-tolerance", type=float, default=1e-2,
                        help="largest relative error vs torch-flash before a point is WRONG (default 1e-2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--lib", default=os.path.join(REPO_ROOT, "build", "libattention.so"),
                        help="our library (default build/libattention.so)")
    parser.add_argument("--out-dir", default=os.path.join(REPO_ROOT, "scripts", "results"),
                        help="where the .json and .md go (default scripts/results)")
    parser.add_argument("--kv-heads", default="0",
                        help="key/value heads, comma-separated; 0 = NH, multi-head (default 0); e.g. 4,0 times "
                             "GQA with 4 and multi-head at the same shapes")
    parser.add_argument("--tag", default=None,
                        help="appended to the file names: attention_<gpu>_<tag>.json (default: none, or gqa "
                             "when --kv-heads names a value other than 0)")
    args = parser.parse_args()
    try:
        args.kv_heads = parse_list(args.kv_heads, int)
    except ValueError as err:
        parser.error(f"--kv-heads takes comma-separated whole numbers: {err}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    if args.tag is None:
        args.tag = "gqa" if any(args.kv_heads) else ""

    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in impls if i not in OUR_IMPLS and i not in TORCH_IMPLS]
    if unknown:
        parser.error(f"unknown --impls {','.join(unknown)}; known: {', '.join(OUR_IMPLS + tuple(TORCH_IMPLS))}")
    try:
        hdims, seqlens = parse_list(args.hdims, int), parse_list(args.seqlens, int)
    except ValueError as err:
        parser.error(f"--hdims and --seqlens take comma-separated whole numbers: {err}")
    bad = [f"seqlen {t}" for t in seqlens if t < 1 or args.tokens % t] + \
          [f"head dim {d}" for d in hdims if d < 1 or args.hidden % d] + \
          [f"--kv-heads {kv} with head dim {d} (NH {args.hidden // d})" for d in hdims if d >= 1 and not args.hidden % d
           for kv in args.kv_heads if kv < 0 or (kv and (args.hidden // d) % kv)]
    if bad:
        parser.error(f"{', '.join(bad)}: seqlens must divide --tokens {args.tokens}, head dims --hidden "
                     f"{args.hidden}, and key/value heads the heads")
    causals = [1, 0] if args.causal == "both" else [int(args.causal)]
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py: error: no CUDA GPU visible to PyTorch")
    lib = load_library(args.lib) if any(i in OUR_IMPLS for i in impls) else None

    device = torch.cuda.get_device_name()
    suffix = f"_{args.tag}" if args.tag else ""
    json_path = os.path.join(args.out_dir, f"attention_{gpu_slug(device)}{suffix}.json")
    md_path = os.path.join(args.out_dir, f"attention_{gpu_slug(device)}{suffix}.md")
    meta = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": (f"CUDA events per run, L2 flushed before each, median over ~{args.rep_ms:g} ms after "
                   f"{args.warmup_ms:g} ms warm-up" +
                   (f", the median of {args.rounds} such timings taken in turns with the other implementations"
                    " (each right after every other equally often, across rounds too)"
                    if args.rounds > 1 else "") + "; fwd+bwd = fwd median + bwd median; torch bwd = "
                   "autograd.grad of SDPA's output w.r.t. the q, k, v views (SDPA backward alone)"),
        "flops": "fwd = 4*B*T^2*HD*NH (halved when causal), bwd = 2.5*fwd, fwd+bwd = 3.5*fwd (NH query heads, "
                 "whatever NKV)",
        "kv_heads": args.kv_heads,
    }
    print(f"{device}, torch {torch.__version__}, commit {meta['commit']}", flush=True)
    print(f"method: {meta['method']}", flush=True)

    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    records = []
    for hdim in hdims:
        for causal in causals:
            for seqlen in seqlens:
                for kv in args.kv_heads:
                    records += run_point(impls, lib, hdim, causal, seqlen, kv, args, flush)
                write_results(meta, records, build_tables(records, impls, hdims, causals, seqlens, args),
                              build_notes(records), json_path, md_path, complete=False)

    tables = build_tables(records, impls, hdims, causals, seqlens, args)
    notes = build_notes(records)
    write_results(meta, records, tables, notes, json_path, md_path, complete=True)

    print()
    for note in notes:
        print("note: " + note)
    print(f"wrote {os.path.relpath(json_path)} and {os.path.relpath(md_path)}")
    print("TFLOP/s; fwd+bwd = sum of the fwd and bwd medians; WRONG = output differs from torch-flash; "
          "ratios = flash2 / flash1 and ours / torch")
    for title, rows, cols in tables:
        print()
        print(text_table(title, rows, cols))
    wrong = sum(r["status"] == "wrong" for r in records)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
