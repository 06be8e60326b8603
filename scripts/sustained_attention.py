#!/usr/bin/env python3
"""sustained_attention.py: attention under sustained load, with the GPU's power and clocks beside it.

bench_attention.py times each point for ~50 ms; a long point's result then depends on how hot and how
close to its power limit the GPU was at that moment. This script runs one pass (forward or backward) of
each implementation back to back for --seconds, in windows of --window-ms each timed by CUDA events,
while a thread samples the GPU's power draw, SM clock and temperature (nvidia-smi, every 100 ms). The
implementations take turns for --rounds rounds, with --rest seconds of idle GPU before each run, in
orders where each runs right after every other equally often, across the rounds' boundaries too
(results_common.balanced_orders; the idle rest before each run already weakens what ran before).

Per run it prints TFLOP/s in the first window and over the last half, the mean power and SM clock over
the last half, and the energy per PFLOP there (joules): at the power limit, the implementation that
spends fewer joules per FLOP keeps the higher clock.

Usage (from the repository root on a GPU machine, after `make build/libattention.so`):
    python3 scripts/sustained_attention.py --hdim 128 --seqlen 8192 --causal 0 --pass fwd
    python3 scripts/sustained_attention.py --impls flash2,torch-cudnn --seconds 5 --rounds 3 --pass bwd
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (set_up_and_check, backend_context, point_flops)
from results_common import balanced_orders  # noqa: E402
import torch  # noqa: E402


class GpuSampler:
    """nvidia-smi samples (time.monotonic(), watts, SM MHz, °C) every 100 ms, in a thread, until stop()."""

    def __init__(self, index):
        self.samples, self.lock = [], threading.Lock()
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", str(index), "--query-gpu=power.draw,clocks.sm,temperature.gpu",
             "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                watts, mhz, celsius = (float(x) for x in line.split(","))
            except ValueError:
                continue  # "[N/A]" or a partial line
            with self.lock:
                self.samples.append((time.monotonic(), watts, mhz, celsius))

    def between(self, start, end):
        with self.lock:
            return [s for s in self.samples if start <= s[0] <= end]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_windows(fn, seconds, window_ms):
    """[(start, end, ms per call)] for back-to-back calls of fn over `seconds`, in windows of ~window_ms."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    calls = max(1, int(window_ms / max((time.perf_counter() - t0) / 3 * 1e3, 1e-3)))
    windows, begin = [], time.monotonic()
    while time.monotonic() - begin < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        w0 = time.monotonic()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        windows.append((w0, time.monotonic(), start.elapsed_time(end) / calls))
    return windows


def summarize(impl, windows, sampler, flops):
    """One result dict for a run: first-window and last-half TFLOP/s, power, clock, joules per PFLOP."""
    half = windows[len(windows) // 2:]
    ms = statistics.median(w[2] for w in half)
    samples = sampler.between(half[0][0], half[-1][1])
    watts = statistics.mean(s[1] for s in samples) if samples else float("nan")
    mhz = statistics.mean(s[2] for s in samples) if samples else float("nan")
    celsius = max(s[3] for s in samples) if samples else float("nan")
    tflops = flops / (ms * 1e-3) / 1e12
    return {"impl": impl, "first_tflops": flops / (windows[0][2] * 1e-3) / 1e12, "tflops": tflops,
            "watts": watts, "mhz": mhz, "max_celsius": celsius, "joules_per_pflop": watts / tflops * 1e3,
            "windows": len(windows)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Usage" + __doc__.split("Usage", 1)[1])
    p.add_argument("--impls", default="flash2,torch-cudnn", help="comma-separated (default flash2,torch-cudnn)")
    p.add_argument("--hdim", type=int, default=128, help="head dim (default 128)")
    p.add_argument("--seqlen", type=int, default=8192, help="sequence length (default 8192)")
    p.add_argument("--causal", type=int, choices=(0, 1), default=0, help="1: causal mask (default 0)")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head dim (default 2048)")
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen (default 16384)")
    p.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd")
    p.add_argument("--seconds", type=float, default=4.0, help="length of each run (default 4)")
    p.add_argument("--window-ms", type=float, default=100.0, help="timed window (default 100)")
    p.add_argument("--rounds", type=int, default=2, help="runs per implementation, taken in turns (default 2)")
    p.add_argument("--rest", type=float, default=3.0, help="idle seconds before each run (default 3)")
    p.add_argument("--lib", default=os.path.join(ba.REPO_ROOT, "build", "libattention.so"),
                   help="our library (default build/libattention.so)")
    args = p.parse_args()
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    known = ba.OUR_IMPLS + tuple(ba.TORCH_IMPLS)
    bad = [f"unknown --impls {i} (known: {', '.join(known)})" for i in args.impls if i not in known]
    bad += [what for what, ok in (("--seqlen must divide --tokens", args.tokens % args.seqlen == 0),
                                 ("--hdim must divide --hidden", args.hidden % args.hdim == 0),
                                 ("--seconds, --rounds and --window-ms must be positive",
                                  args.seconds > 0 and args.rounds > 0 and args.window_ms > 0)) if not ok]
    if bad:
        p.error("; ".join(bad))
    return args


def main():
    args = parse_args()
    impls = args.impls
    B, NH = args.tokens // args.seqlen, args.hidden // args.hdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn((B, args.seqlen, 3 * NH, args.hdim), generator=gen, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn((B, args.seqlen, NH, args.hdim), generator=gen, device="cuda", dtype=torch.bfloat16)
    lib = ba.load_library(args.lib) if any(i in ba.OUR_IMPLS for i in impls) else None
    runners = {}
    for impl in impls:  # bench_attention's set-up: one forward and backward each, unchecked (no reference)
        record = {"note": ""}
        runners[impl] = ba.set_up_and_check(impl, lib, qkv, dout, args.causal, (None, None), args, record)
        if runners[impl] is None:
            sys.exit(f"sustained_attention.py: error: {impl} cannot run this shape: {record['note']}")
    flops = ba.point_flops(B, args.seqlen, NH, args.hdim, args.causal) * (2.5 if args.which == "bwd" else 1.0)
    print(f"{torch.cuda.get_device_name()}: hd{args.hdim} {'causal' if args.causal else 'non-causal'} "
          f"T={args.seqlen} B={B} NH={NH} {args.which}, {args.seconds:g} s runs after {args.rest:g} s idle")
    print(f"{'impl':12} {'round':>5} {'first':>7} {'TFLOP/s':>8} {'W':>6} {'SM MHz':>7} {'max C':>6} {'J/PFLOP':>8}")
    try:
        sampler = GpuSampler(torch.cuda.current_device())
    except FileNotFoundError:
        sys.exit("sustained_attention.py: error: nvidia-smi not found; it samples the GPU's power and clocks")
    try:
        orders = balanced_orders(len(impls))  # each right after every other, across rounds too
        for rnd in range(args.rounds):
            for impl in (impls[i] for i in orders[rnd % len(orders)]):
                forward, backward = runners[impl]
                time.sleep(args.rest)
                with ba.backend_context(impl):
                    windows = run_windows(forward if args.which == "fwd" else backward, args.seconds, args.window_ms)
                r = summarize(impl, windows, sampler, flops)
                print(f"{impl:12} {rnd:5d} {r['first_tflops']:7.1f} {r['tflops']:8.1f} {r['watts']:6.0f} "
                      f"{r['mhz']:7.0f} {r['max_celsius']:6.0f} {r['joules_per_pflop']:8.0f}", flush=True)
    finally:
        sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
