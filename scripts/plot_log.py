#!/usr/bin/env python3
"""plot_log.py: train_gpt's --log-file JSON lines -> one PNG of the run(s).

    python scripts/plot_log.py train_log.jsonl                        # writes train_log.png
    python scripts/plot_log.py a.jsonl b.jsonl --label flash2 --label naive -o compare.png

Four panels against the optimizer step, each run in its own colour in every panel:
  loss              training loss (line) and validation loss (dashed, dots)
  learning rate
  gradient norm     before clipping, log scale
  throughput        TFLOP/s per GPU; a right-hand MFU axis when every run used the same peak. Each run's
                    first logged step is left out of this panel (warm-up: cuBLASLt heuristics, first use
                    of memory) and the legend gives each run's median.
  eval accuracy     a fifth panel when a log has --eval-data records: acc_norm (line) and acc (dotted)
The log holds one record per step, {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s",
"tflops_per_gpu", "mfu"} (mfu a fraction), {"step", "val_loss"} after each validation and {"step",
"eval_acc_norm", "eval_acc", "eval_examples"} after each multiple-choice evaluation; other fields
are ignored. A resumed run appends to its log: when a step appears twice, the later record wins. Lines that
are not JSON (the last line of a killed run) are skipped with a note. --smooth X draws an exponential
moving average of the training loss (X in [0, 1), e.g. 0.9) over the raw curve, drawn faint.
Needs matplotlib (scripts/requirements.txt); exit 0 when written, 1 on an error.
"""
import argparse
import json
import os
import statistics
import sys

STEP_FIELDS = ("loss", "lr", "grad_norm", "tflops_per_gpu", "mfu")


class LogError(ValueError):
    """A log that cannot be plotted; the message names the file and what is wrong."""


def parse_args(argv):
    p = argparse.ArgumentParser(description="Plot train_gpt --log-file JSONL logs (loss, val loss, lr, grad norm, "
                                            "TFLOP/s and MFU against step) into one PNG.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("logs", nargs="+", help="JSONL files written by ./train_gpt --log-file")
    p.add_argument("-o", "--out", help="the PNG to write (default: the first log's name with .png)")
    p.add_argument("--label", action="append", dest="labels",
                   help="legend name of a run, once per log in their order (default: the file names)")
    p.add_argument("--title", help="title over the panels (default: the log names)")
    p.add_argument("--smooth", type=float, default=0.0,
                   help="EMA weight for the training loss in [0, 1) (default 0: raw)")
    p.add_argument("--dpi", type=int, default=110, help="resolution (default 110)")
    args = p.parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        p.error("--smooth must be in [0, 1)")
    if args.labels is not None and len(args.labels) != len(args.logs):
        p.error(f"--label is given {len(args.labels)} times for {len(args.logs)} logs; give one per log")
    if args.out is None:
        args.out = os.path.splitext(args.logs[0])[0] + ".png"
    return args


def read_log(path):
    """(steps {step: record}, vals {step: val_loss}, evals {step: record}, skipped lines) of one log; the
    later record of a step wins."""
    if not os.path.isfile(path):
        raise LogError(f"{path}: no such file; give the file train_gpt's --log-file wrote")
    steps, vals, evals, skipped = {}, {}, {}, 0
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError):
                skipped += 1
                continue
            if not isinstance(record, dict):
                skipped += 1
            elif "val_loss" in record:
                vals[step] = float(record["val_loss"])
            elif "eval_acc_norm" in record:
                evals[step] = record
            elif "loss" in record:
                steps[step] = record
            else:
                skipped += 1
    if not steps and not vals:
        raise LogError(f"{path}: no step records ({{\"step\": ..., \"loss\": ...}}); is it a log of train_gpt "
                       "--log-file?")
    return steps, vals, evals, skipped


def series(steps, field, skip_first=False):
    """(x, y) of a field over the sorted steps that have a finite number for it."""
    xs, ys = [], []
    keys = sorted(steps)[1 if skip_first else 0:]
    for s in keys:
        v = steps[s].get(field)
        if isinstance(v, (int, float)) and v == v and abs(v) != float("inf"):
            xs.append(s)
            ys.append(float(v))
    return xs, ys


def ema(values, weight):
    """Exponential moving average, started at the first value."""
    out, avg = [], None
    for v in values:
        avg = v if avg is None else weight * avg + (1 - weight) * v
        out.append(avg)
    return out


def common_peak(runs):
    """The peak TFLOP/s every run's MFU was computed against (tflops / mfu), or None when they differ."""
    peaks = []
    for run in runs:
        for r in run["steps"].values():
            t, m = r.get("tflops_per_gpu"), r.get("mfu")
            if isinstance(t, (int, float)) and isinstance(m, (int, float)) and m > 0 and t > 0:
                peaks.append(t / m)
    if not peaks:
        return None
    mid = statistics.median(peaks)
    # the log rounds tflops to 2 decimals and mfu to 4: the ratio scatters by a fraction of a percent
    return mid if all(abs(p - mid) <= 0.02 * mid for p in peaks) else None


def plot_evals(runs, ax, colors):
    """acc_norm (line) and acc (dotted) of each run's evaluations, against the step."""
    for k, run in enumerate(runs):
        if not run["evals"]:
            continue
        c, xs = colors[k % len(colors)], sorted(run["evals"])
        norm = [run["evals"][s]["eval_acc_norm"] for s in xs]
        ax.plot(xs, norm, "o-", color=c, markersize=4, linewidth=1.4,
                label=f"{run['label']} acc_norm (last {norm[-1]:.3f})")
        ax.plot(xs, [run["evals"][s].get("eval_acc", float("nan")) for s in xs], "o:", color=c, markersize=3,
                linewidth=1.0, alpha=0.7, label=f"{run['label']} acc")
    ax.set_title("multiple-choice eval (--eval-data)")
    ax.set_ylabel("accuracy")


def plot(runs, out, title, smooth, dpi):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_evals = any(run["evals"] for run in runs)
    fig, axes = plt.subplots(3 if with_evals else 2, 2, figsize=(13, 12.5 if with_evals else 8.5))
    (ax_loss, ax_lr), (ax_norm, ax_tput) = axes[0], axes[1]
    if with_evals:
        plot_evals(runs, axes[2][0], colors=plt.rcParams["axes.prop_cycle"].by_key()["color"])
        axes[2][1].axis("off")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, run in enumerate(runs):
        c, label = colors[k % len(colors)], run["label"]
        x, y = series(run["steps"], "loss")
        if x:
            if smooth > 0:
                ax_loss.plot(x, y, color=c, alpha=0.25, linewidth=1)
                ax_loss.plot(x, ema(y, smooth), color=c, linewidth=1.6, label=f"{label} train (EMA {smooth:g})")
            else:
                ax_loss.plot(x, y, color=c, linewidth=1.4, label=f"{label} train")
        if run["vals"]:
            vx = sorted(run["vals"])
            ax_loss.plot(vx, [run["vals"][s] for s in vx], "o--", color=c, markersize=4, linewidth=1.2,
                         markeredgecolor="black", zorder=3,  # above the training curve, which is noisier
                         label=f"{label} val (last {run['vals'][vx[-1]]:.3f})")
        x, y = series(run["steps"], "lr")
        if x:
            ax_lr.plot(x, y, color=c, linewidth=1.4, label=label)
        x, y = series(run["steps"], "grad_norm")
        if x:
            ax_norm.plot(x, y, color=c, linewidth=1.2, label=label)
        x, y = series(run["steps"], "tflops_per_gpu", skip_first=True)
        if x:
            _, m = series(run["steps"], "mfu", skip_first=True)
            note = f"median {statistics.median(y):.0f} TFLOP/s"
            if m and max(m) > 0:
                note += f", MFU {100 * statistics.median(m):.1f}%"
            ax_tput.plot(x, y, color=c, linewidth=1.2, label=f"{label} ({note})")

    ax_loss.set_title("loss")
    ax_loss.set_ylabel("cross-entropy (nats)")
    ax_lr.set_title("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_norm.set_title("gradient norm (before clipping)")
    norms = [v for r in runs for v in series(r["steps"], "grad_norm")[1]]
    if norms and min(norms) > 0:
        ax_norm.set_yscale("log")
    ax_tput.set_title("throughput per GPU (first step of each run left out)")
    ax_tput.set_ylabel("TFLOP/s")
    tops = [max(series(r["steps"], "tflops_per_gpu", skip_first=True)[1] or [0]) for r in runs]
    if max(tops) > 0:
        ax_tput.set_ylim(0, 1.12 * max(tops))  # from zero: the curve's wiggles at their true size
    peak = common_peak(runs)
    if peak:
        sec = ax_tput.secondary_yaxis("right", functions=(lambda t: 100 * t / peak, lambda m: m * peak / 100))
        sec.set_ylabel(f"MFU (%) of {peak:.1f} TFLOP/s")
    for ax in axes.flat:
        if not ax.axison:
            continue
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_log.py: error: matplotlib is missing; install with `pip install -r scripts/requirements.txt` "
              "(or run `make venv`)", file=sys.stderr)
        return 1
    runs = []
    try:
        for i, path in enumerate(args.logs):
            steps, vals, evals, skipped = read_log(path)
            if skipped:
                print(f"note: {path}: skipped {skipped} line(s) that are not train_gpt log records", file=sys.stderr)
            label = args.labels[i] if args.labels else os.path.splitext(os.path.basename(path))[0]
            runs.append({"label": label, "steps": steps, "vals": vals, "evals": evals})
        title = args.title or ", ".join(r["label"] for r in runs)
        plot(runs, args.out, title, args.smooth, args.dpi)
    except (LogError, OSError) as err:
        print(f"plot_log.py: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {len(runs)} run(s), " +
          ", ".join(f"{r['label']} {len(r['steps'])} steps" for r in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
