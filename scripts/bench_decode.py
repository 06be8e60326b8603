#!/usr/bin/env python3
"""bench_decode.py: time our decoding attention against PyTorch in the same process.

One new query token per sequence against a full KV cache of T keys, bf16, softmax scale 1/sqrt(HD).
Implementations:
  ours             attention/decode/flash2_decode.cu through build/libdecode.so (ctypes), split-KV with the
                   number of splits it picks; cache (B, T, NKV, HD), as the model keeps it
  torch-flash      F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION)
  torch-efficient  the same under EFFICIENT_ATTENTION
  torch-cudnn      the same under CUDNN_ATTENTION
                   (SDPA gets q (B, NH, 1, HD) and contiguous k, v (B, NKV, T, HD), its own layout,
                   with enable_gqa=True when NKV < NH)
  naive            matmul, softmax, matmul in PyTorch (the FlashAttention-2 paper's decoding baseline):
                   K and V repeated to NH heads with repeat_interleave for GQA/MQA (timed), scores
                   and softmax in fp32, P in bf16
Grid: batch 1, 8, 64 x cache 1k, 8k, 32k, 128k x MHA 32 heads, GQA 32:8, MQA 32:1, head dim 128
(points whose cache does not fit are skipped, and said so).

Method (as bench_attention.py, that of triton.testing.do_bench): L2 flushed (256 MiB zeroed) before every
run, each run timed by its own CUDA events, about --rep-ms of runs after --warmup-ms of warm-up, median.
GB/s = bytes of K and V read once (B*T*NKV*HD*2*2) / time. The device-to-device copy bandwidth
(bytes read + written, torch copy_ of 1 GiB) is measured in the same run, and "% of copy" is ours
against it. Every implementation's output is compared with the first SDPA backend that ran
(relative error <= --check-tolerance, else the point is WRONG). PyTorch's backends share one cache;
ours gets its own with the same values, each allocated right after torch.cuda.empty_cache() (the
speed of a cache this size depends measurably on where it lands: the same kernel on the same point
ran 0.83x and 1.0x cuDNN's speed depending on what the run had allocated before).

Writes <out-dir>/decode_<gpu>.json (header: device, date, commit, command, torch, cuda, copy_gbps;
records: impl, B, T, NH, NKV, HD, us, gbps, status, note) and decode_<gpu>.md, rewritten after every
point, and prints the table last.

Usage (from the repository root, after `make build/libdecode.so`):
    python3 scripts/bench_decode.py
    python3 scripts/bench_decode.py --batches 1 --lengths 8k,32k --layouts 32:8,32:1
"""
import argparse
import ctypes
import datetime
import gc
import os
import shlex
import sys
import warnings

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as err:
    sys.exit(f"bench_decode.py: error: {err}; run this on a GPU machine with PyTorch >= 2.5")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
from results_common import (L2_FLUSH_BYTES, MIN_REPS, Skip, copy_gbps, git_commit, gpu_slug,  # noqa: E402
                            length_label, median_gpu_ms, parse_list, rel_error, write_json, write_text)

TORCH_IMPLS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
               "torch-cudnn": SDPBackend.CUDNN_ATTENTION}
ALL_IMPLS = ("ours",) + tuple(TORCH_IMPLS) + ("naive",)
MAX_REPS = 2000  # most timed runs of a measurement (L2_FLUSH_BYTES, MIN_REPS: results_common's)


def load_library(path):
    if not os.path.exists(path):
        sys.exit(f"bench_decode.py: error: {path} not found; build it with `make build/libdecode.so`")
    lib = ctypes.CDLL(path)
    i, n, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    lib.decode_flat_last_error.restype = ctypes.c_char_p
    lib.decode_flat_num_splits.restype = i
    lib.decode_flat_num_splits.argtypes = [i] * 7
    lib.decode_flat_workspace_bytes.restype = n
    lib.decode_flat_workspace_bytes.argtypes = [i] * 8
    lib.decode_flat_forward.restype = i
    # B, Tq, NH, NKV, HD, Tmax, max_length, num_splits, q, q_stride, k, v, lengths, out, out_stride, lse,
    # workspace, stream
    lib.decode_flat_forward.argtypes = [i] * 8 + [p, n, p, p, p, p, n, p, p, p]
    return lib


def measure_us(fn, flush, warmup_ms, rep_ms):
    """Median microseconds of fn() (see the method above; results_common.median_gpu_ms)."""
    return 1000.0 * median_gpu_ms(fn, flush, warmup_ms, rep_ms, MIN_REPS, MAX_REPS)


def torch_runner(impl, q, k, v):
    """q (B, NH, 1, HD), k and v (B, NKV, T, HD) contiguous. Returns (run, result)."""
    gqa = k.shape[1] != q.shape[1]
    if impl == "naive":
        NH, HD = q.shape[1], q.shape[3]
        G = NH // k.shape[1]
        scale = HD ** -0.5

        def run():
            kk = k.repeat_interleave(G, dim=1) if G > 1 else k
            vv = v.repeat_interleave(G, dim=1) if G > 1 else v
            s = torch.matmul(q, kk.transpose(-1, -2)).float() * scale
            return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), vv)
    else:
        def run():
            with sdpa_kernel([TORCH_IMPLS[impl]]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    try:
        out = run()
        torch.cuda.synchronize()
    except RuntimeError as err:  # the backend rejects the shape, or out of memory
        raise Skip(f"rejected: {str(err).splitlines()[0][:160]}")
    return run, out


def our_runner(lib, q, k, v, lengths):
    """q (B, 1, NH, HD), k and v (B, T, NKV, HD). Returns (run, out, splits)."""
    B, _, NH, HD = q.shape
    T, NKV = k.shape[1], k.shape[2]
    dims = (B, 1, NH, NKV, HD, T, T)
    splits = lib.decode_flat_num_splits(*dims)
    ws_bytes = lib.decode_flat_workspace_bytes(*dims, 0)
    if splits < 0 or ws_bytes < 0:
        raise Skip(f"rejected: {lib.decode_flat_last_error().decode()}")
    out = torch.empty_like(q)
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    args = dims + (0, q.data_ptr(), NH * HD, k.data_ptr(), v.data_ptr(), lengths.data_ptr(), out.data_ptr(),
                   NH * HD, None, ws.data_ptr(), stream)

    def run():
        if lib.decode_flat_forward(*args) != 0:
            raise Skip(f"failed: {lib.decode_flat_last_error().decode()}")
    run.keep = (ws, q, k, v, lengths)  # the pointers in args stay valid while run lives
    return run, out, splits


def make_cache(B, T, NKV, HD, seed, ours):
    """K or V of random normal values, the same values in either layout: sequence b is drawn from its
    own generator (seed, b). PyTorch's layout (B, NKV, T, HD) or ours (B, T, NKV, HD)."""
    x = torch.empty((B, T, NKV, HD) if ours else (B, NKV, T, HD), dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cuda")
    for b in range(B):
        gen.manual_seed(seed * 1_000_003 + b)
        seq = torch.randn((NKV, T, HD), generator=gen, device="cuda", dtype=torch.bfloat16)
        x[b].copy_(seq.transpose(0, 1) if ours else seq)
    return x


def time_impl(impl, make_runner, reference, kv_bytes, base, args, flush):
    """Checks and times one implementation; returns (record, its output)."""
    record = dict(impl=impl, **base, us=None, gbps=None, status="ok", note="")
    out = None
    try:
        run, out, extra = make_runner()
        record.update(extra)
        if reference is None and impl in TORCH_IMPLS:
            record["note"] = "reference"
        elif reference is not None:
            err = rel_error(out, reference)
            record["error"] = err
            # naive rounds the scores to bf16 (its matmul's output type): over 128k keys that alone
            # reaches ~2.3e-2 (measured), so it gets 5e-2
            if not err <= (max(args.check_tolerance, 5e-2) if impl == "naive" else args.check_tolerance):
                record["status"], record["note"] = "wrong", f"WRONG: error {err:.1e} vs the first SDPA backend"
        record["us"] = measure_us(run, flush, args.warmup_ms, args.rep_ms)
        record["gbps"] = kv_bytes / (record["us"] * 1e-6) / 1e9
        out = out.clone()
    except Skip as why:
        record["status"], record["note"], out = "skipped", str(why), None
    except torch.cuda.OutOfMemoryError:
        record["status"], record["note"], out = "skipped", "out of GPU memory", None
    print(progress_line(record), flush=True)
    return record, out


def release():
    gc.collect()
    torch.cuda.empty_cache()


def run_point(lib, impls, B, T, NH, NKV, HD, args, flush):
    """Checks and times every implementation at one point; returns its records.

    PyTorch's backends share one cache in their layout; then it is freed (and the allocator's cache
    emptied) and ours gets a cache of the same values in its layout, allocated the same way: each
    layout is allocated right after torch.cuda.empty_cache(), so neither inherits the other's placement.
    """
    kv_bytes = B * T * NKV * HD * 2 * 2
    base = dict(B=B, T=T, NH=NH, NKV=NKV, HD=HD)
    free = torch.cuda.mem_get_info()[0]
    if kv_bytes > 0.85 * free:
        return [dict(impl=i, **base, us=None, gbps=None, status="skipped",
                     note=f"K+V {kv_bytes / 2**30:.1f} GiB do not fit in {free / 2**30:.1f} GiB free") for i in impls]
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn((B, NH, 1, HD), generator=gen, device="cuda", dtype=torch.bfloat16)
    records, reference = [], None
    torch_impls = [i for i in impls if i != "ours"]
    if torch_impls:
        k = make_cache(B, T, NKV, HD, 2 * args.seed, ours=False)
        v = make_cache(B, T, NKV, HD, 2 * args.seed + 1, ours=False)
        for impl in torch_impls:
            def runner(impl=impl):
                run, out = torch_runner(impl, q, k, v)
                return run, out, {}
            record, out = time_impl(impl, runner, reference, kv_bytes, base, args, flush)
            if reference is None and out is not None and impl in TORCH_IMPLS:
                reference = out
            records.append(record)
            release()
        del k, v
        release()
    if "ours" in impls:
        k = make_cache(B, T, NKV, HD, 2 * args.seed, ours=True)
        v = make_cache(B, T, NKV, HD, 2 * args.seed + 1, ours=True)
        lengths = torch.full((B,), T, dtype=torch.int32, device="cuda")

        def runner():
            run, out, splits = our_runner(lib, q.transpose(1, 2).contiguous(), k, v, lengths)
            run()
            torch.cuda.synchronize()
            return run, out.transpose(1, 2), {"splits": splits}  # out as PyTorch's (B, NH, 1, HD)
        record, _ = time_impl("ours", runner, reference, kv_bytes, base, args, flush)
        records.append(record)
        del k, v
    del q, reference
    release()
    return records


def layout_name(NH, NKV):
    return f"MHA {NH}" if NH == NKV else f"MQA {NH}:1" if NKV == 1 else f"GQA {NH}:{NKV}"


def progress_line(r):
    where = f"{layout_name(r['NH'], r['NKV']):10} B={r['B']:<3} T={length_label(r['T']):5}"
    if r["status"] == "skipped":
        return f"{where} {r['impl']:16} skipped: {r['note']}"
    extra = f"  splits {r['splits']}" if "splits" in r else ""
    extra += f"  error {r['error']:.1e}" if "error" in r else ""
    return f"{where} {r['impl']:16} {r['us']:9.1f} us {r['gbps']:7.0f} GB/s{extra}  {r['note']}"


def table(records, impls, copy):
    """Markdown rows: one per (layout, B, T)."""
    keys = []
    for r in records:
        key = (r["NH"], r["NKV"], r["B"], r["T"])
        if key not in keys:
            keys.append(key)
    torch_impls = [i for i in impls if i in TORCH_IMPLS]
    head = (["layout", "B", "T", "K+V MB"] + [f"{i} µs" for i in impls] +
            ["best SDPA / ours", "naive / ours", "ours GB/s", "ours % of copy", "splits"])
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|" + "---:|" * (len(impls) + 5)]
    for key in keys:
        by_impl = {r["impl"]: r for r in records if (r["NH"], r["NKV"], r["B"], r["T"]) == key}
        NH, NKV, B, T = key
        cells = [layout_name(NH, NKV), str(B), length_label(T), f"{B * T * NKV * by_impl[next(iter(by_impl))]['HD'] * 4 / 1e6:.0f}"]

        def us(impl):
            r = by_impl.get(impl)
            return r["us"] if r and r["status"] == "ok" else None
        for impl in impls:
            r = by_impl.get(impl)
            cells.append("skip" if not r or r["status"] == "skipped" else "WRONG" if r["status"] == "wrong"
                         else f"{r['us']:.1f}")
        ours = us("ours")
        best = min([u for u in (us(i) for i in torch_impls) if u], default=None)
        cells.append(f"{best / ours:.2f}x" if ours and best else "-")
        cells.append(f"{us('naive') / ours:.1f}x" if ours and us("naive") else "-")
        o = by_impl.get("ours")
        cells.append(f"{o['gbps']:.0f}" if ours else "-")
        cells.append(f"{100 * o['gbps'] / copy:.0f}%" if ours else "-")
        cells.append(str(o.get("splits", "-")) if o else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_results(meta, records, impls, json_path, md_path, complete):
    write_json(json_path, {**meta, "complete": complete, "records": records})
    md = [f"# Decoding attention on {meta['device']}", "",
          f"- date: {meta['date']}", f"- commit: `{meta['commit']}`", f"- command: `{meta['command']}`",
          f"- torch {meta['torch']}, CUDA {meta['cuda']}", f"- method: {meta['method']}",
          f"- device-to-device copy in the same run: {meta['copy_gbps']:.0f} GB/s (read + written)", ""]
    if not complete:
        md += ["**Incomplete: the run stopped before the end of the grid.**", ""]
    md += table(records, impls, meta["copy_gbps"]) + [""]
    notes = [f"{r['impl']} {layout_name(r['NH'], r['NKV'])} B={r['B']} T={length_label(r['T'])}: {r['note']}"
             for r in records if r["status"] != "ok"]
    if notes:
        md += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    write_text(md_path, "\n".join(md))
    return md


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Usage" + __doc__.split("Usage", 1)[1])
    parser.add_argument("--impls", default=",".join(ALL_IMPLS), help="comma-separated (default: all of "
                        + ", ".join(ALL_IMPLS) + ")")
    parser.add_argument("--batches", default="1,8,64", help="batch sizes (default 1,8,64)")
    parser.add_argument("--lengths", default="1k,8k,32k,128k", help="cache lengths (default 1k,8k,32k,128k)")
    parser.add_argument("--layouts", default="32:32,32:8,32:1", help="NH:NKV pairs (default 32:32,32:8,32:1)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--warmup-ms", type=float, default=10.0, help="warm-up per measurement (default 10)")
    parser.add_argument("--rep-ms", type=float, default=40.0, help="timed runs per measurement (default 40)")
    parser.add_argument("--check-tolerance", type=float, default=2e-2,
                        help="largest relative error vs the first SDPA backend (default 2e-2; naive, whose "
                             "scores are rounded to bf16, at least 5e-2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lib", default=os.path.join(REPO_ROOT, "build", "libdecode.so"),
                        help="our library (default build/libdecode.so)")
    parser.add_argument("--out-dir", default=os.path.join(REPO_ROOT, "scripts", "results"),
                        help="where the .json and .md go (default scripts/results)")
    args = parser.parse_args()
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in impls if i not in ALL_IMPLS]
    if unknown:
        parser.error(f"unknown --impls {','.join(unknown)}; known: {', '.join(ALL_IMPLS)}")
    try:
        batches, lengths = parse_list(args.batches, int), parse_list(args.lengths, int)
        layouts = [tuple(int(x) for x in pair.split(":")) for pair in args.layouts.split(",") if pair.strip()]
    except ValueError as err:
        parser.error(f"--batches, --lengths take numbers like 8 or 32k, --layouts pairs like 32:8 ({err})")
    if any(len(p) != 2 or p[1] < 1 or p[0] % p[1] for p in layouts):
        parser.error("--layouts: NH:NKV with NH a multiple of NKV")
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py: error: no CUDA GPU visible to PyTorch")
    lib = load_library(args.lib) if "ours" in impls else None

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    device = torch.cuda.get_device_name()
    slug = gpu_slug(device)
    json_path = os.path.join(args.out_dir, f"decode_{slug}.json")
    md_path = os.path.join(args.out_dir, f"decode_{slug}.md")
    meta = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": (f"CUDA events per run, L2 flushed before each, median over ~{args.rep_ms:g} ms after "
                   f"{args.warmup_ms:g} ms warm-up; one query token; GB/s = K and V bytes read once / time"),
        "copy_gbps": copy_gbps(flush, args.warmup_ms, args.rep_ms, MIN_REPS, MAX_REPS),
    }
    print(f"{device}: device-to-device copy {meta['copy_gbps']:.0f} GB/s (read + written)", flush=True)
    records = []
    for NH, NKV in layouts:
        for B in batches:
            for T in lengths:
                records += run_point(lib, impls, B, T, NH, NKV, args.head_dim, args, flush)
                write_results(meta, records, impls, json_path, md_path, complete=False)
    md = write_results(meta, records, impls, json_path, md_path, complete=True)
    print("\n".join(md))
    wrong = [r for r in records if r["status"] == "wrong"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
