#!/usr/bin/env python3
"""check_attention.py: check our attention backends against an fp64 PyTorch reference, on any shape.

For every shape and backend this script makes fresh random bf16 inputs, writes them to a temporary
folder, runs build/attention_tool on them (one forward and one backward, outputs poisoned with NaN
beforehand), reads the outputs back and compares them with a reference computed in fp64 by PyTorch
on the GPU from the very same bf16 values:

    S = Q Kᵀ / √HD (keys j > query i set to -inf when causal),  LSE = logsumexp(S),
    O = softmax(S) V,  and dQ, dK, dV from torch.autograd for the upstream gradient dO.

It prints one row per (shape, backend, layout) with the relative error ‖x − ref‖ / ‖ref‖ of out, lse,
dq, dk and dv and the number of NaN/Inf elements (NaN = an element the backend never wrote), and
exits 1 when any error is above --tolerance, any element is not finite, or the tool failed.

Needs a GPU machine with PyTorch, and the tool built first (`make build/attention_tool`).

Usage (from the repository root):
    python3 scripts/check_attention.py                                  # default shapes, every backend
    python3 scripts/check_attention.py --backends flash2 --layout both
    python3 scripts/check_attention.py --shapes "1,1000,16,80,1;2,4096,32,64,0" --seed 7
    python3 scripts/check_attention.py --input-scale 4 --log build/check_attention.log

A shape is "B,T,NH,HD,causal[,NKV]" (batch, sequence length, heads, head dim, 1 causal / 0 not, and
optionally the key/value heads of grouped-query attention, a divisor of NH; default NH); several are
separated by ";". With NKV < NH, k and v (and dk, dv) have NKV heads, query head h reads K/V head
h // (NH / NKV), and the reference's dK, dV sum over each group's query heads. The seed is printed so
that any failure can be rerun exactly with --seed.
"""
import argparse
import datetime
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
except ImportError:
    sys.exit("check_attention.py: error: PyTorch is missing; run this on a GPU machine with torch installed")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TOOL = os.path.join(REPO_ROOT, "build", "attention_tool")
DEFAULT_LIB = os.path.join(REPO_ROOT, "build", "libattention.so")

# Small and odd shapes first (T = 1, T not a multiple of any block, every head dim, both masks),
# then the large ones that the paper's benchmark grid uses.
DEFAULT_SHAPES = ";".join([
    "1,1,1,64,1", "1,1,2,128,0", "2,3,2,64,1", "1,17,3,80,0", "2,63,4,96,1", "3,65,2,128,1",
    "2,128,4,64,0", "2,129,4,64,1", "1,255,8,80,1", "2,257,8,128,0", "1,1000,16,80,1", "1,1000,16,96,0",
    "4,1024,16,64,1", "2,2048,16,128,1", "1,8192,16,128,1", "2,4096,32,64,0",
    # grouped-query and multi-query attention
    "2,127,8,80,1,2", "1,1000,16,96,0,4", "2,2048,16,128,1,4", "1,4096,32,64,1,1",
])
OUTPUTS = ("out", "lse", "dq", "dk", "dv")
# Elements of one (heads, T, T) fp64 score block in the reference; autograd keeps about six of
# them alive at once, so 2**27 elements (1 GiB each) keeps the reference under ~8 GiB of GPU memory.
REF_CHUNK_ELEMS = 1 << 27


def parse_shapes(text):
    """Parses "B,T,NH,HD,causal[,NKV];..." into a list of (B, T, NH, HD, causal, NKV) tuples of ints."""
    shapes = []
    for item in text.replace(" ", "").split(";"):
        if not item:
            continue
        parts = item.split(",")
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            values = ()
        if len(values) == 5:
            values += (values[2],)  # NKV = NH: multi-head
        if len(values) != 6 or min(values[:4]) < 1 or values[4] not in (0, 1) or values[5] < 1 or \
                values[2] % values[5]:
            raise argparse.ArgumentTypeError(
                f'bad shape "{item}": expected B,T,NH,HD,causal[,NKV] with positive sizes, causal 0 or 1 and '
                f'NKV dividing NH')
        shapes.append(values)
    if not shapes:
        raise argparse.ArgumentTypeError("--shapes is empty")
    return shapes


def shape_label(shape):
    """A shape as the user types it: "B,T,NH,HD,causal,NKV"."""
    return ",".join(str(x) for x in shape)


def write_bf16(tensor, path):
    """Writes a bf16 torch tensor as raw little-endian bf16 in row-major order."""
    tensor.contiguous().view(torch.int16).cpu().numpy().astype("<i2", copy=False).tofile(path)


def read_raw(path, dtype, shape):
    """Reads a raw file of `dtype` ("bf16" or "f32") as an fp64 numpy array of `shape`."""
    count = int(np.prod(shape))
    if dtype == "bf16":
        bits = np.fromfile(path, dtype="<u2")
        if bits.size != count:
            raise ValueError(f"{path} has {bits.size} bf16 values, expected {count}")
        values = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.fromfile(path, dtype="<f4")
        if values.size != count:
            raise ValueError(f"{path} has {values.size} fp32 values, expected {count}")
    return values.astype(np.float64).reshape(shape)


def make_inputs(shape, seed, scale, device):
    """Fresh random bf16 q, k, v (normal × scale) and dout (normal) on `device`: q, dout (B, T, NH, HD),
    k, v (B, T, NKV, HD)."""
    B, T, NH, HD, _, NKV = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs = {}
    for name in ("q", "k", "v", "dout"):
        x = torch.randn((B, T, NKV if name in ("k", "v") else NH, HD), generator=gen, device=device,
                        dtype=torch.float32)
        if name != "dout":
            x = x * scale
        inputs[name] = x.to(torch.bfloat16)
    return inputs


def reference(inputs, causal, device):
    """fp64 reference for bf16 inputs (q (B, T, NH, HD), k, v (B, T, NKV, HD)) on `device`.

    Returns numpy fp64 arrays: out, dq (B, T, NH, HD), dk, dv (B, T, NKV, HD) and lse (B, NH, T). The
    attention of every (batch, K/V head) group is independent, so the work is done a few groups at a
    time to bound memory; each K/V head is repeated for its G = NH / NKV query heads inside the graph,
    so autograd sums dK and dV over the group.
    """
    B, T, NH, HD = inputs["q"].shape
    NKV = inputs["k"].shape[2]
    G = NH // NKV
    ref = {name: np.empty((B, T, NH, HD)) for name in ("out", "dq")}
    ref.update({name: np.empty((B, T, NKV, HD)) for name in ("dk", "dv")})
    ref["lse"] = np.empty((B, NH, T))
    groups_per_chunk = max(1, min(NKV, REF_CHUNK_ELEMS // (T * T * G)))
    mask = torch.triu(torch.ones((T, T), dtype=torch.bool, device=device), diagonal=1) if causal else None
    scale = 1.0 / math.sqrt(HD)
    for b in range(B):
        for g0 in range(0, NKV, groups_per_chunk):
            g1 = min(NKV, g0 + groups_per_chunk)
            h0, h1 = g0 * G, g1 * G
            # (heads, T, HD) fp64 leaves, exact copies of the bf16 values
            q, dout = (inputs[n][b, :, h0:h1].to(torch.float64).transpose(0, 1).contiguous() for n in ("q", "dout"))
            k, v = (inputs[n][b, :, g0:g1].to(torch.float64).transpose(0, 1).contiguous() for n in ("k", "v"))
            for x in (q, k, v):
                x.requires_grad_(True)
            k_heads, v_heads = (x.repeat_interleave(G, dim=0) for x in (k, v))  # K/V head of each query head
            s = torch.matmul(q, k_heads.transpose(-1, -2)) * scale  # (heads, T, T)
            if causal:
                s = s.masked_fill(mask, float("-inf"))
            lse = torch.logsumexp(s, dim=-1)  # (heads, T)
            out = torch.matmul(torch.softmax(s, dim=-1), v_heads)  # (heads, T, HD)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
            for name, value in (("out", out), ("dq", dq)):
                ref[name][b, :, h0:h1] = value.detach().transpose(0, 1).cpu().numpy()
            for name, value in (("dk", dk), ("dv", dv)):
                ref[name][b, :, g0:g1] = value.detach().transpose(0, 1).cpu().numpy()
            ref["lse"][b, h0:h1] = lse.detach().cpu().numpy()
            del q, k, v, k_heads, v_heads, dout, s, lse, out, dq, dk, dv
    return ref


def backend_memory_bytes(lib_path, backend, shape):
    """Bytes of saved + workspace memory `backend` needs for `shape`.

    Asks build/libattention.so when it is there; otherwise estimates the naive backend's need as
    fp32 scores plus bf16 probabilities, (B, NH, T, T) each, and the flash backends' as 0.
    Returns None when the library says the backend rejects the shape (the tool will say why).
    """
    B, T, NH, HD, causal, NKV = shape
    if os.path.exists(lib_path):
        import ctypes
        lib = ctypes.CDLL(lib_path)
        args = (backend.encode(), B, T, NH, NKV, HD, causal)
        for fn in (lib.attention_flat_saved_bytes, lib.attention_flat_workspace_bytes):
            fn.restype = ctypes.c_long
            fn.argtypes = [ctypes.c_char_p] + [ctypes.c_int] * 6
        saved = lib.attention_flat_saved_bytes(*args)
        workspace = lib.attention_flat_workspace_bytes(*args)
        if saved < 0 or workspace < 0:
            return None
        return saved + workspace
    return B * NH * T * T * 6 if backend == "naive" else 0


def run_tool(tool, backend, shape, layout, in_dir, out_dir):
    """Runs the attention tool once. Returns (ok, message): the tool's summary line or its error lines."""
    B, T, NH, HD, causal, NKV = shape
    cmd = [tool, "--backend", backend, "--batch", str(B), "--seq-len", str(T), "--heads", str(NH),
           "--kv-heads", str(NKV), "--head-dim", str(HD), "--causal" if causal else "--no-causal", "--layout", layout,
           "--in", in_dir, "--out", out_dir]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return False, "the tool ran for more than 900 s"
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(("error", "hint"))] or lines[-3:]
        return False, f"exit {proc.returncode}: " + " / ".join(errors)
    return True, proc.stdout.strip()


def rel_error(x, ref, floor):
    """‖x − ref‖ / max(‖ref‖, floor·√n), and whether the floor was used.

    The floor keeps a reference that is zero up to rounding (dq and dk when T = 1, where dS = 0)
    from turning the kernel's rounding noise into a huge relative error.
    """
    ref_norm = float(np.linalg.norm(ref))
    floor_norm = floor * math.sqrt(ref.size)
    denom = max(ref_norm, floor_norm)
    if denom == 0.0:
        return 0.0, True
    return float(np.linalg.norm(x - ref)) / denom, ref_norm < floor_norm


def compare(out_dir, shape, ref, floor):
    """Reads the tool's outputs; returns ({output: (error, floored)}, {output: non-finite count})."""
    B, T, NH, HD, _, NKV = shape
    errors, nonfinite = {}, {}
    for name in OUTPUTS:
        if name == "lse":
            x = read_raw(os.path.join(out_dir, "lse.bin"), "f32", (B, NH, T))
        else:
            x = read_raw(os.path.join(out_dir, name + ".bin"), "bf16", (B, T, NKV if name in ("dk", "dv") else NH, HD))
        bad = int(np.count_nonzero(~np.isfinite(x)))
        nonfinite[name] = bad
        errors[name] = (float("nan"), False) if bad else rel_error(x, ref[name], floor)
    return errors, nonfinite


def format_row(cells, widths):
    """Left-aligns the first three cells and right-aligns the rest in columns of `widths`."""
    return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


HEADER = ["shape B,T,NH,HD,c,NKV", "backend", "layout", "out", "lse", "dq", "dk", "dv", "nan/inf", "result"]
WIDTHS = [22, 7, 6, 9, 9, 9, 9, 9, 8, 6]


def result_row(shape, backend, layout, errors=None, nonfinite=None, status="", note=""):
    """One table row as a list of strings; errors above the tolerance are marked by the caller's status."""
    cells = [shape_label(shape), backend, layout]
    for name in OUTPUTS:
        if errors is None:
            cells.append("-")
        else:
            err, floored = errors[name]
            cells.append("nan" if math.isnan(err) else f"{err:.1e}" + ("*" if floored else ""))
    cells.append("-" if nonfinite is None else str(sum(nonfinite.values())))
    cells.append(status)
    line = format_row(cells, WIDTHS)
    return line + (f"  {note}" if note else "")


def main():
    parser = argparse.ArgumentParser(
        description="Check attention backends (build/attention_tool) against an fp64 PyTorch reference.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="Usage" + __doc__.split("Usage", 1)[1])
    parser.add_argument("--shapes", type=parse_shapes, default=DEFAULT_SHAPES,
                        help=f'shapes "B,T,NH,HD,causal[,NKV];..." (default: {DEFAULT_SHAPES})')
    parser.add_argument("--backends", default="naive,flash1,flash2",
                        help="comma-separated backends (default naive,flash1,flash2)")
    parser.add_argument("--layout", choices=["packed", "plain", "both"], default="packed",
                        help="packed: q, k, v inside one (B, T, NH + 2*NKV, HD) buffer as in the trainer (default); "
                             "plain: separate tensors; both")
    parser.add_argument("--input-scale", type=float, default=1.0,
                        help="q, k and v are normal × this (default 1; larger makes the softmax sharper)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="largest relative error that passes (1e-2)")
    parser.add_argument("--zero-floor", type=float, default=1e-3,
                        help="RMS below which a reference counts as zero: errors are divided by "
                             "max(‖ref‖, floor·√n) and marked * when the floor was used (default 1e-3)")
    parser.add_argument("--tool", default=DEFAULT_TOOL, help="the attention tool (default build/attention_tool)")
    parser.add_argument("--lib", default=DEFAULT_LIB,
                        help="build/libattention.so, asked for the naive backend's memory need when present")
    parser.add_argument("--log", help="also write the table to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder with inputs and outputs")
    parser.add_argument("--verbose", action="store_true", help="print the tool's summary line for every run")
    args = parser.parse_args()

    backends = [b for b in args.backends.split(",") if b]
    layouts = ["packed", "plain"] if args.layout == "both" else [args.layout]
    if not os.access(args.tool, os.X_OK):
        sys.exit(f"check_attention.py: error: {args.tool} not found or not executable; "
                 f"build it with `make build/attention_tool`")
    if not torch.cuda.is_available():
        sys.exit("check_attention.py: error: no CUDA GPU visible to PyTorch; run this on a GPU machine")
    device = torch.device("cuda")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF

    header_lines = [
        f"check_attention.py on {torch.cuda.get_device_name()} at "
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        "command: " + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        f"seed {seed} (rerun with --seed {seed}); input scale {args.input_scale}; tolerance {args.tolerance}; "
        f"backends {','.join(backends)}; layouts {','.join(layouts)}",
        "errors: ‖x − ref‖/‖ref‖ against fp64 PyTorch on the same bf16 inputs; "
        f"* = reference RMS below {args.zero_floor}, error divided by that floor instead",
        "",
        format_row(HEADER, WIDTHS),
    ]
    print("\n".join(header_lines), flush=True)

    work_dir = tempfile.mkdtemp(prefix="check_attention_")
    rows, failed, passed, skipped = [], 0, 0, 0
    try:
        for index, shape in enumerate(args.shapes):
            B, T, NH, HD, causal, _ = shape
            in_dir = os.path.join(work_dir, f"shape{index}_in")
            os.makedirs(in_dir)
            inputs = make_inputs(shape, seed + index, args.input_scale, device)
            for name, tensor in inputs.items():
                write_bf16(tensor, os.path.join(in_dir, name + ".bin"))
            ref = reference(inputs, causal, device)
            del inputs
            torch.cuda.empty_cache()  # leave the GPU to the tool
            tensor_bytes = B * T * NH * HD * 2
            for backend in backends:
                for layout in layouts:
                    need = backend_memory_bytes(args.lib, backend, shape)
                    free = torch.cuda.mem_get_info()[0]
                    if need is not None and need + 12 * tensor_bytes > 0.9 * free:
                        line = result_row(shape, backend, layout, status="skip",
                                          note=f"needs {need / 2**30:.1f} GiB of saved + workspace memory, "
                                               f"{free / 2**30:.1f} GiB free (naive stores (B, NH, T, T))")
                        skipped += 1
                    else:
                        out_dir = os.path.join(work_dir, f"shape{index}_{backend}_{layout}")
                        ok, message = run_tool(args.tool, backend, shape, layout, in_dir, out_dir)
                        if not ok:
                            line = result_row(shape, backend, layout, status="FAIL", note="tool " + message)
                            failed += 1
                        else:
                            errors, nonfinite = compare(out_dir, shape, ref, args.zero_floor)
                            bad = [n for n in OUTPUTS if nonfinite[n] or not errors[n][0] <= args.tolerance]
                            note = ("above tolerance or not finite: " + ", ".join(bad)) if bad else ""
                            line = result_row(shape, backend, layout, errors, nonfinite,
                                              "FAIL" if bad else "ok", note)
                            failed += bool(bad)
                            passed += not bad
                            if args.verbose:
                                line += "\n    " + message
                        if not args.keep:
                            shutil.rmtree(out_dir, ignore_errors=True)
                    rows.append(line)
                    print(line, flush=True)
            if not args.keep:
                shutil.rmtree(in_dir, ignore_errors=True)
    finally:
        if args.keep:
            print(f"inputs and outputs kept in {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)

    summary = f"{passed} passed, {failed} failed, {skipped} skipped (tolerance {args.tolerance}, seed {seed})"
    if args.log:
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
        with open(args.log, "w") as f:
            f.write("\n".join(header_lines + rows + ["", summary]) + "\n")
    print()
    print(format_row(HEADER, WIDTHS))
    print("\n".join(rows))
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
