#!/usr/bin/env python3
"""profile_step.py: where one training step's GPU time goes, by kernel and by layer kind, against the
ceilings of this GPU measured in the same run.

On a GPU machine with Nsight Compute (ncu), from the repository root, after `make train_gpt build/gpu_ceilings`:
    python3 scripts/profile_step.py --model gpt3-1.3b --seq-len 2048 --batch-size 8 --out build/profile
What it runs:
  1. build/gpu_ceilings: an 8192³ bf16 GEMM through cuBLASLt (TFLOP/s) and a device-to-device copy
     (GB/s, bytes read + written), the ceilings below;
  2. ./train_gpt for --step steps of one micro batch each (--total-batch-tokens = batch × seq), with
     TRAIN_GPT_PROFILE_STEP=--step, under `ncu --profile-from-start off`: only that step's kernels are
     profiled (the first steps choose the GEMM algorithms), one metric pass: gpu__time_duration and the
     DRAM bytes of each kernel, clocks and caches left as they are (--clock-control none --cache-control
     none), so each kernel runs as in a normal run but alone on an idle GPU: at higher clocks than
     in a real step, where back-to-back GEMMs hold the GPU at its power limit;
  3. the same command without ncu (--step + 2 steps), for the step time from train_gpt's log; the
     kernel sum is printed as a share of it (the rest: the lower clocks of a real step, launch gaps and
     host waits; on an H100 nearly all of it is the clocks, see layers/PERF_NOTES.md).
Prints (and writes to --out: profile.txt, kernels.csv, profile.json):
  - kernels by name: launches, time, share of the step's kernel time;
  - layer kinds (GEMM, attention forward / backward, LayerNorm, cross-entropy, AdamW, ...): share, and
    achieved TFLOP/s (GEMMs: the model's linear-layer FLOPs; attention: causal FLOPs, forward 2·B·T²·C per
    layer, backward 2.5 times that) or GB/s (DRAM bytes measured) with the fraction of the ceiling;
  - the GEMMs by role (qkv, attproj, fc, fcproj, LM head × forward, dinp, dweight) when the order of the
    GEMM launches is the model's (cuBLASLt's bias-gradient and split-K kernels and the matmul layer's
    GELU and dbias kernels count for the GEMM they directly follow);
  - the shares projected to --accum micro steps per optimizer step (default: 131072 tokens per step, as
    bench_train.py): the micro-step kernels times --accum, the optimizer's once.
"""
import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_runs  # noqa: E402  (quiet_flags)

# Model shapes: layers, hidden, heads (as train_gpt's named configs); vocab padded as gpt_config.h.
MODELS = {"gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16), "gpt2-774m": (36, 1280, 20),
          "gpt2-1558m": (48, 1600, 25), "gpt3-1.3b": (24, 2048, 16), "gpt3-2.7b": (32, 2560, 32),
          "gpt3-2.7b-d128": (32, 2560, 20)}
VOCAB_PADDED = 50304

# Layer kind of a kernel, by its name: the first pattern that matches (case-insensitive).
KINDS = [
    ("fp8 casts", r"fp8_cast|fp8_amax"),  # --precision fp8: the casts (with GELU, dGELU, dbias sums folded in)
    ("fp8 scales", r"fp8_delayed|fp8_current"),
    ("gemm bias-grad (cuBLASLt)", r"bgrad"),
    ("gemm split-K reduce (cuBLASLt)", r"splitkreduce|reduce_kernel.*cublas"),
    ("gemm", r"gemm|gemv|xmma|nvjet|cutlass|cublas"),
    ("matmul dbias/dGELU kernels", r"matmul_dbias|qkv_bias"),
    ("attention backward", r"backward.*(flash|attention)|(flash|attention).*backward|preprocess|dq_convert|convert_dq"),
    ("attention forward", r"flash|attention"),
    ("layernorm", r"layernorm"),
    ("gelu", r"gelu"),
    ("cross-entropy", r"crossentropy|cross_entropy|classifier"),
    ("adamw", r"adamw"),
    ("global norm", r"global_norm|norm_clip|clip_scale"),
    ("encoder", r"encoder"),
    ("mean loss", r"mean_loss"),
]
OPTIMIZER_KINDS = ("adamw", "global norm")
EPILOGUE_KINDS = ("matmul dbias/dGELU kernels", "gelu")  # the matmul layer's own kernels after a GEMM
MEMORY_KINDS = ("fp8 casts", "matmul dbias/dGELU kernels", "layernorm", "gelu", "cross-entropy", "adamw", "global norm",
                "encoder", "gemm bias-grad (cuBLASLt)", "gemm split-K reduce (cuBLASLt)")


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"))
    p.add_argument("--ceilings", default=os.path.join(REPO_ROOT, "build", "gpu_ceilings"))
    p.add_argument("--ceilings-file", default="",
                   help="gpu_ceilings' output saved earlier in the same session, instead of running it again")
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--model", default="gpt3-1.3b", choices=sorted(MODELS))
    p.add_argument("-t", "--seq-len", type=int, default=2048)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("--attn", default="flash2")
    p.add_argument("--step", type=int, default=2, help="the step profiled (the ones before choose algorithms)")
    p.add_argument("--accum", type=int, default=0,
                   help="micro steps per optimizer step for the projected shares (default: 131072 tokens)")
    p.add_argument("--train-data", default=os.path.join(REPO_ROOT, "data", "tinyshakespeare",
                                                         "tinyshakespeare_train_*.bin"))
    p.add_argument("--extra", default="", help="more train_gpt flags, one string")
    p.add_argument("--no-timing", action="store_true", help="skip the run without ncu (step time)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "build", "profile"))
    p.add_argument("--label", default="", help="a name for this profile in the output")
    return p.parse_args()


def run(cmd, timeout, env=None, log=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if log:
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"profile_step.py: error: {' '.join(cmd)} exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def ceilings(args):
    if args.ceilings_file:
        out = open(args.ceilings_file).read()
    else:
        out = run([args.ceilings], 120, log=os.path.join(args.out, "ceilings.log"))
    values = dict(line.split(None, 1) for line in out.splitlines() if " " in line)
    return float(values["gemm_tflops"]), float(values["copy_gbs"]), values.get("device", "?").strip()


def train_command(args, steps, log_file=None):
    tokens = args.batch_size * args.seq_len
    cmd = [args.train_gpt, "--model", args.model, "--attn", args.attn, "-b", str(args.batch_size), "-t",
           str(args.seq_len), "--total-batch-tokens", str(tokens), "--max-steps", str(steps), "--train-data",
           args.train_data, "--val-data", ""]
    if log_file:
        cmd += ["--log-file", log_file]
    extra = args.extra.split()
    return cmd + train_runs.quiet_flags(extra) + extra


def profile_kernels(args):
    """[(name, ms, dram bytes or None)] of the profiled step, in launch order."""
    report = os.path.join(args.out, "step")
    env = dict(os.environ, TRAIN_GPT_PROFILE_STEP=str(args.step))
    cmd = [args.ncu, "--profile-from-start", "off", "--metrics",
           "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum", "--clock-control", "none",
           "--cache-control", "none", "-f", "-o", report] + train_command(args, args.step)
    run(cmd, args.timeout, env=env, log=os.path.join(args.out, "ncu_run.log"))
    raw = run([args.ncu, "-i", report + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"], 300)
    rows = list(csv.reader(io.StringIO(raw[raw.index('"ID"'):])))
    head = rows[0]
    col = {name: head.index(name) for name in head}
    kernels = []
    for row in rows[1:]:
        if len(row) != len(head) or not row[col["ID"]].strip().isdigit():
            continue  # the units row
        def number(metric):
            try:
                return float(row[col[metric]].replace(",", ""))
            except (KeyError, ValueError):
                return None
        ns = number("gpu__time_duration.sum")
        rd, wr = number("dram__bytes_read.sum"), number("dram__bytes_write.sum")
        kernels.append((row[col["Kernel Name"]], ns / 1e6 if ns else 0.0, rd + wr if rd is not None and wr is not None
                        else None))
    if not kernels:
        sys.exit("profile_step.py: error: ncu profiled no kernel (did train_gpt reach the step?)")
    return kernels


def step_time_ms(args):
    log = os.path.join(args.out, "timing.jsonl")
    steps = args.step + 2
    run(train_command(args, steps, log), args.timeout, log=os.path.join(args.out, "timing_run.log"))
    ms = [json.loads(line)["ms"] for line in open(log) if '"ms"' in line]
    return sorted(ms[args.step - 1:])[len(ms[args.step - 1:]) // 2] if ms else None


def gemm_roles(L, C, Vp, N):
    """The model's GEMMs in launch order: (role, FLOPs)."""
    fwd = [("qkv", 3 * C * C), ("attproj", C * C), ("fc", 4 * C * C), ("fcproj", 4 * C * C)]
    roles = []
    for _ in range(L):
        roles += [(f"{name} forward", 2 * N * w) for name, w in fwd]
    roles += [("lm head forward", 2 * N * C * Vp), ("lm head dinp", 2 * N * C * Vp), ("lm head dweight", 2 * N * C * Vp)]
    for _ in range(L):
        for name, w in reversed(fwd):
            roles += [(f"{name} dinp", 2 * N * w), (f"{name} dweight", 2 * N * w)]
    return roles


def gemm_launches_of(kernels):
    """[name, ms] per GEMM launch, in order, each with the helper kernels right after it (cuBLASLt's
    bias-gradient and split-K kernels, the matmul layer's GELU and dbias kernels). Those kernels join
    only a GEMM they directly follow: the qkv bias gradient's column sums come after the attention
    backward (layers/model/qkv_bias.cuh) and belong to no GEMM."""
    launches, joinable = [], False
    for name, ms, _ in kernels:
        kind = kind_of(name)
        if kind == "gemm":
            launches.append([name, ms])
            joinable = True
        elif kind.startswith("gemm ") or kind in EPILOGUE_KINDS:
            if joinable:
                launches[-1][1] += ms
        else:
            joinable = False
    return launches


def shorten(name, width=90):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    L, C, NH = MODELS[args.model]
    N, T, B = args.batch_size * args.seq_len, args.seq_len, args.batch_size
    accum = args.accum or max(1, 131072 // N)
    gemm_peak, copy_gbs, device = ceilings(args)
    kernels = profile_kernels(args)
    step_ms = None if args.no_timing else step_time_ms(args)

    total = sum(ms for _, ms, _ in kernels)
    by_name = {}
    for name, ms, nbytes in kernels:
        e = by_name.setdefault(name, [0, 0.0, 0.0, kind_of(name)])
        e[0] += 1
        e[1] += ms
        e[2] += nbytes or 0.0
    by_kind = {}
    for name, (count, ms, nbytes, kind) in by_name.items():
        e = by_kind.setdefault(kind, [0, 0.0, 0.0])
        e[0] += count
        e[1] += ms
        e[2] += nbytes

    # FLOPs of the step: the linear layers (forward, dinp, dweight) and attention (causal).
    linear_flops = 3 * 2 * N * (12 * L * C * C + C * VOCAB_PADDED)
    att_fwd_flops = L * 2 * B * T * T * C
    gemm_kinds = [k for k in by_kind if k.startswith("gemm") or k in EPILOGUE_KINDS]
    gemm_ms = sum(by_kind[k][1] for k in gemm_kinds)

    lines = []
    out = lines.append
    label = f" [{args.label}]" if args.label else ""
    out(f"profile_step{label}: {device}; {args.model} micro batch {B} x {T} ({N} tokens), attention {args.attn}, "
        f"step {args.step} of one micro step")
    out(f"ceilings (same run): GEMM 8192^3 bf16 {gemm_peak:.0f} TFLOP/s, device-to-device copy {copy_gbs:.0f} GB/s")
    busy = f", {100 * total / step_ms:.1f}% of the step's {step_ms:.1f} ms without ncu" if step_ms else ""
    out(f"kernel time {total:.2f} ms in {len(kernels)} launches{busy}")
    out("")
    out(f"{'kernel':90s} {'n':>5s} {'ms':>9s} {'share':>7s}  kind")
    for name, (count, ms, nbytes, kind) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        if ms / total < 0.001:
            continue
        out(f"{shorten(name):90s} {count:5d} {ms:9.3f} {100 * ms / total:6.2f}%  {kind}")
    out("")
    out(f"{'layer kind':32s} {'n':>5s} {'ms':>9s} {'share':>7s} {'x' + str(accum) + ' share':>11s}  achieved")
    proj_total = sum(ms * (1 if k in OPTIMIZER_KINDS else accum) for k, (_, ms, _) in by_kind.items())
    for kind, (count, ms, nbytes) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        proj = ms * (1 if kind in OPTIMIZER_KINDS else accum) / proj_total
        rate = ""
        if kind in MEMORY_KINDS and nbytes and ms > 0:
            gbs = nbytes / (ms * 1e-3) / 1e9
            rate = f"{gbs:7.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of copy)"
        elif kind == "attention forward" and ms > 0:
            rate = f"{att_fwd_flops / (ms * 1e-3) / 1e12:7.0f} TFLOP/s (causal FLOPs)"
        elif kind == "attention backward" and ms > 0:
            rate = f"{2.5 * att_fwd_flops / (ms * 1e-3) / 1e12:7.0f} TFLOP/s (causal FLOPs)"
        out(f"{kind:32s} {count:5d} {ms:9.3f} {100 * ms / total:6.2f}% {100 * proj:10.2f}%  {rate}")
    tf = linear_flops / (gemm_ms * 1e-3) / 1e12 if gemm_ms else 0
    out(f"{'GEMMs and their epilogue kernels':32s} {'':5s} {gemm_ms:9.3f} {100 * gemm_ms / total:6.2f}% {'':11s}  "
        f"{tf:7.0f} TFLOP/s ({100 * tf / gemm_peak:.0f}% of the 8192^3 GEMM)")

    # GEMMs by role: the model's GEMM launches in order, with their helper kernels.
    roles = gemm_roles(L, C, VOCAB_PADDED, N)
    gemm_launches = gemm_launches_of(kernels)
    role_rows = {}
    if len(gemm_launches) == len(roles):
        for (role, flops), (name, ms) in zip(roles, gemm_launches):
            e = role_rows.setdefault(role, [0, 0.0, 0.0, set()])
            e[0] += 1
            e[1] += ms
            e[2] += flops
            e[3].add(name)
        out("")
        out(f"{'GEMM role':20s} {'n':>4s} {'ms':>9s} {'share':>7s} {'TFLOP/s':>8s} {'of peak':>8s}  kernel(s)")
        for role, (count, ms, flops, names) in role_rows.items():
            tfr = flops / (ms * 1e-3) / 1e12 if ms else 0
            out(f"{role:20s} {count:4d} {ms:9.3f} {100 * ms / total:6.2f}% {tfr:8.0f} {100 * tfr / gemm_peak:7.0f}%  "
                f"{shorten(' | '.join(sorted(names)), 120)}")
    else:
        out(f"(GEMMs by role skipped: {len(gemm_launches)} GEMM launches, the model's order has {len(roles)})")

    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "profile.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "kernels.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "kernel", "ms", "dram_bytes", "kind"])
        for i, (name, ms, nbytes) in enumerate(kernels):
            w.writerow([i, name, f"{ms:.6f}", "" if nbytes is None else int(nbytes), kind_of(name)])
    with open(os.path.join(args.out, "profile.json"), "w") as f:
        json.dump({"label": args.label, "device": device, "model": args.model, "batch": B, "seq_len": T,
                   "gemm_ceiling_tflops": gemm_peak, "copy_ceiling_gbs": copy_gbs, "kernel_ms": total,
                   "step_ms_without_ncu": step_ms, "accum_projected": accum,
                   "by_kind": {k: {"launches": v[0], "ms": v[1], "dram_bytes": v[2]} for k, v in by_kind.items()},
                   "by_role": {k: {"launches": v[0], "ms": v[1], "flops": v[2]} for k, v in role_rows.items()}},
                  f, indent=1)


if __name__ == "__main__":
    main()
