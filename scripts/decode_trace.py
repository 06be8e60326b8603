#!/usr/bin/env python3
"""Where a decode step's time goes, from the per-block trace of `make build/train_gpt_trace`.

    GPT_TRACE_FILE=/tmp/t.csv build/train_gpt_trace --generate 256 --init-from model.bin --num-samples 1 ...
    python3 scripts/decode_trace.py /tmp/t.csv

The trace holds one record per block of each traced kernel of a few replayed steps (tag, block, SM;
when it started, when its wait for the previous kernel returned, when its thread 0 finished;
layers/generate/decode_trace.cuh). Kernel instances: the records sorted by that wait's return, runs of
one tag (a programmatic dependent launch returns from its wait only after the kernel before it ended,
so two kernels' records never interleave there). Steps: from one `advance` kernel to the next. The
LM head (cuBLASLt) is not traced: it is the wait before the draw.

Per kind, over the steps: what it adds to the step (its last block's end minus the previous
instance's), the wait from the previous instance's end to its own first wait's return (launch and
dependency latency), its first-ready-to-last-end time, the ramp (median minus first ready) and the
drain (last minus median end). Then one layer of the middle step on a time line.

The records cost time (about 9% of a GPT3-1.3B step): read the trace for attribution; measure a change
with scripts/bench_generate.py --baseline on the ordinary build.
"""
import argparse
import csv
import statistics
import sys

KINDS = {"A": "advance", "E": "embed", "Q": "qkv", "S": "attn split", "C": "attn combine", "P": "proj",
         "F": "fc", "R": "fc proj", "N": "LNf", "D": "draw"}
ORDER = "AEQSCPFRND"


def read_records(path):
    """The trace's rows: tag ('s', an empty split, counts as 'S'), start, ready and end in ns."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or set(rows[0]) != {"tag", "block", "smid", "aux", "start", "ready", "end"}:
        raise SystemExit(f"error: {path}: not a decode trace (expected the header tag,block,smid,aux,start,ready,end)")
    out = []
    for r in rows:
        tag = "S" if r["tag"] == "s" else r["tag"]
        if tag not in KINDS:
            raise SystemExit(f"error: {path}: unknown kernel tag {r['tag']!r}")
        out.append({"tag": tag, "start": int(r["start"]), "ready": int(r["ready"]), "end": int(r["end"])})
    return out


def kernel_instances(records):
    """Runs of one tag in the order of the wait's return, each with its first/median/last times."""
    groups = []
    for r in sorted(records, key=lambda r: (r["ready"], r["start"])):
        if groups and groups[-1][0] == r["tag"]:
            groups[-1][1].append(r)
        else:
            groups.append((r["tag"], [r]))
    return [{"tag": tag, "blocks": len(rs), "first_start": min(r["start"] for r in rs),
             "first_ready": min(r["ready"] for r in rs), "median_ready": statistics.median(r["ready"] for r in rs),
             "median_end": statistics.median(r["end"] for r in rs), "last_end": max(r["end"] for r in rs)}
            for tag, rs in groups]


def split_steps(instances):
    """Steps: each from an `advance` instance to the one before the next (a partial first step too)."""
    steps = []
    for i in instances:
        if i["tag"] == "A" or not steps:
            steps.append([])
        steps[-1].append(i)
    return steps


def kind_summary(steps):
    """Per kind: instances per step, µs added per step, and per-instance means (µs) of the wait,
    first-ready-to-last-end, ramp and drain."""
    per = {}
    for st in steps:
        for a, b in zip(st, st[1:]):
            d = per.setdefault(b["tag"], {"adds": [], "wait": [], "busy": [], "ramp": [], "drain": []})
            d["adds"].append(b["last_end"] - a["last_end"])
            d["wait"].append(b["first_ready"] - a["last_end"])
            d["busy"].append(b["last_end"] - b["first_ready"])
            d["ramp"].append(b["median_ready"] - b["first_ready"])
            d["drain"].append(b["last_end"] - b["median_end"])
    n = len(steps)
    return {tag: {"count": len(d["adds"]) / n, "adds_us": sum(d["adds"]) / n / 1e3,
                  **{k: statistics.mean(v) / 1e3 for k, v in d.items() if k != "adds"}}
            for tag, d in per.items()}


def print_report(steps, summary, out=sys.stdout):
    for st in steps:
        print(f"step: {(st[-1]['last_end'] - st[0]['first_start']) / 1e3:.1f} us, {len(st)} kernels", file=out)
    print(f"\nper kind: us added per step (mean of {len(steps)} steps); per instance, means in us", file=out)
    print(f"{'kind':13s} {'count':>5s} {'adds':>8s} {'wait':>6s} {'ready..end':>10s} {'ramp':>6s} {'drain':>6s}",
          file=out)
    for tag in ORDER:
        if tag in summary:
            s = summary[tag]
            print(f"{KINDS[tag]:13s} {s['count']:5.0f} {s['adds_us']:8.1f} {s['wait']:6.2f} {s['busy']:10.2f} "
                  f"{s['ramp']:6.2f} {s['drain']:6.2f}", file=out)
    print(f"{'total':13s} {'':5s} {sum(s['adds_us'] for s in summary.values()):8.1f}   "
          "(the draw's wait is the LM head)", file=out)
    st = steps[len(steps) // 2]
    qs = [k for k, i in enumerate(st) if i["tag"] == "Q"]
    if len(qs) >= 2:
        k0, k1 = qs[len(qs) // 2 - 1], qs[len(qs) // 2]
        base = st[k0]["first_ready"]
        print("\none layer of the middle step, us from its qkv's first ready: first start, first ready, "
              "median end, last end", file=out)
        for i in st[k0:k1 + 1]:
            print(f"  {KINDS[i['tag']]:13s} {(i['first_start'] - base) / 1e3:8.2f} {(i['first_ready'] - base) / 1e3:8.2f}"
                  f" {(i['median_end'] - base) / 1e3:8.2f} {(i['last_end'] - base) / 1e3:8.2f}  blocks {i['blocks']}",
                  file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace", help="the CSV written through GPT_TRACE_FILE")
    args = ap.parse_args(argv)
    try:
        records = read_records(args.trace)
    except OSError as e:
        raise SystemExit(f"error: {args.trace}: {e.strerror}")
    steps = split_steps(kernel_instances(records))
    print(f"{len(records)} block records, {sum(len(s) for s in steps)} kernel instances, {len(steps)} steps")
    print_report(steps, kind_summary(steps))


if __name__ == "__main__":
    main()
