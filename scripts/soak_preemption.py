#!/usr/bin/env python3
"""soak_preemption.py: a run interrupted again and again ends exactly where an uninterrupted one does.

On a GPU machine, from the repository root, after `make train` (Tiny Shakespeare):

  1. the reference: ./train_gpt for --steps steps of gpt2-124m, without interruption;
  2. the soak: the same command with --checkpoint-dir DIR --checkpoint-every 100 --resume auto,
     interrupted --interruptions times at random moments by SIGTERM or kill -9 (both kinds at least
     once) and each time relaunched by exactly the same command, until it finishes.
The moments: a random step of the run (sorted, so that every launch makes progress) plus a random
0-1.5 s, so a signal may land in a step, in a validation or in a checkpoint save. A SIGTERM must
end the launch with exit 75 after saving the step it was in; a kill -9 loses the steps since the
last checkpoint, which the next launch does again (and removes the temporary file of a save it
cut short). Both runs use --attn naive, whose kernels are deterministic, so the soak must log
exactly the losses of the reference at every step (the last record of each step counts: steps
done again after a kill -9 are logged twice) and the same validation losses.

Prints what happened at every interruption and the comparison, writes them to OUT/soak_report.txt
(OUT/*.out: each launch's output), and exits 0 when the soak ends with the reference's step count
and losses. About 3-5 minutes on an H100 at the defaults (two runs of 2000 steps of 4 x 1024
tokens, 20 checkpoints of 1.7 GB).

    python3 scripts/soak_preemption.py [--steps 2000] [--interruptions 5] [--seed N] [--out DIR]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_common  # noqa: E402

REPO = results_common.REPO_ROOT
TRAIN_GPT = os.path.join(REPO, "train_gpt")
EXIT_STOPPED = 75  # layers/multi_gpu/stop_signal.h


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--interruptions", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--val-every", type=int, default=500)
    p.add_argument("--seed", type=int, default=None, help="seed of the interruption moments (default: random)")
    p.add_argument("--out", default=os.path.join(REPO, "build", "soak_preemption"))
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    return args


class Launch:
    """One ./train_gpt process whose output goes to a file while a thread tracks its last step."""

    def __init__(self, command, out_path):
        self.out_path, self.last_step, self.lines = out_path, 0, []
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.out_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                self.lines.append(line.rstrip("\n"))
                if line.startswith("step ") and "| loss" in line:
                    self.last_step = int(line.split()[1].split("/")[0])

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.thread.join(timeout=10)
        return rc

    def find(self, prefix):
        return [line for line in self.lines if line.startswith(prefix)]


def read_log(path):
    """{step: loss} and {step: val_loss} of a --log-file, the last record of each step counting."""
    losses, vals = {}, {}
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # the torn last line of a killed launch
                continue
            if "loss" in rec:
                losses[rec["step"]] = rec["loss"]
            elif "val_loss" in rec:
                vals[rec["step"]] = rec["val_loss"]
    return losses, vals


def interrupt_plan(args, rng):
    """[(step, delay_s, signal)]: sorted random steps, at least one SIGTERM and one kill -9."""
    steps = sorted(rng.sample(range(args.checkpoint_every // 2, args.steps - args.checkpoint_every), args.interruptions))
    kinds = [signal.SIGTERM, signal.SIGKILL] + [rng.choice((signal.SIGTERM, signal.SIGKILL))
                                                for _ in range(args.interruptions - 2)]
    rng.shuffle(kinds)
    return [(s, rng.uniform(0.0, 1.5), k) for s, k in zip(steps, kinds)]


def interrupted_run(args, command, report):
    """Launches `command`, interrupts it as planned, relaunches it; returns True when all went as it should."""
    ok = True
    plan = interrupt_plan(args, random.Random(args.seed))
    for i, (target, delay, sig) in enumerate(plan + [(None, 0.0, None)]):
        launch = Launch(command, os.path.join(args.out, f"soak_launch{i + 1}.out"))
        if target is not None:
            while launch.proc.poll() is None and launch.last_step < target:
                time.sleep(0.01)
            time.sleep(delay)
            at = launch.last_step
            launch.proc.send_signal(sig)
        rc = launch.wait(args.timeout)
        resumed = launch.find("resume ")
        notes = [line for line in launch.find("note ") if "temporary file" in line]
        stopped = launch.find("stopped ")
        what = "ran to the end" if sig is None else \
            f"{signal.Signals(sig).name} at step {at} + {delay:.2f} s"
        report(f"launch {i + 1}: {resumed[0][13:] if resumed else 'no resume line'}")
        for note in notes:
            report(f"          {note[13:]}")
        report(f"          {what}; exit {rc}; last step logged {launch.last_step}"
               + (f"; {stopped[0][13:]}" if stopped else ""))
        want = 0 if sig is None else EXIT_STOPPED if sig == signal.SIGTERM else -signal.SIGKILL
        if rc != want:
            report(f"          FAIL: exit {rc}, want {want}")
            ok = False
    return ok


def main():
    args = parse_args()
    if not os.path.exists(TRAIN_GPT):
        sys.exit("soak_preemption.py: error: ./train_gpt not found; build it with `make train`")
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    lines = []

    def report(line=""):
        print(line, flush=True)
        lines.append(line)

    meta = results_common.run_metadata(TRAIN_GPT)
    report(f"# soak_preemption.py on {meta['device']}, {meta['date']}, commit {meta['commit']}, train_gpt built from "
           f"{meta['build']}")
    report(f"# {meta['command']}; interruption seed {args.seed}")
    base = [TRAIN_GPT, "--model", "gpt2-124m", "--attn", "naive", "--batch-size", str(args.batch_size), "--seq-len",
            str(args.seq_len), "--max-steps", str(args.steps), "--val-every", str(args.val_every),
            "--sample-tokens", "0"]
    ref_log, soak_log = os.path.join(args.out, "reference.jsonl"), os.path.join(args.out, "soak.jsonl")
    reference = base + ["--checkpoint-dir", "none", "--log-file", ref_log]
    report("$ " + " ".join(reference))
    start = time.time()
    rc = Launch(reference, os.path.join(args.out, "reference.out")).wait(args.timeout)
    report(f"reference: exit {rc}, {time.time() - start:.0f} s")
    soak = base + ["--checkpoint-dir", os.path.join(args.out, "ck"), "--checkpoint-every", str(args.checkpoint_every),
                   "--resume", "auto", "--log-file", soak_log]
    report("$ " + " ".join(soak) + "   (every launch)")
    start = time.time()
    ok = rc == 0 and interrupted_run(args, soak, report)
    report(f"soak: {time.time() - start:.0f} s")
    ref_losses, ref_vals = read_log(ref_log)
    losses, vals = read_log(soak_log) if os.path.exists(soak_log) else ({}, {})
    differ = [s for s in ref_losses if losses.get(s) != ref_losses[s]]
    val_differ = [s for s in ref_vals if vals.get(s) != ref_vals[s]]
    last = max(losses) if losses else 0
    report(f"steps: reference {max(ref_losses) if ref_losses else 0}, soak {last}; losses that differ: {len(differ)}"
           + (f" (first at step {differ[0]}: {ref_losses[differ[0]]} vs {losses.get(differ[0])})" if differ else ""))
    report(f"final loss: reference {ref_losses.get(args.steps)}, soak {losses.get(args.steps)}; validation losses "
           f"{sorted(ref_vals.items())} vs {sorted(vals.items())}")
    ok = ok and not differ and not val_differ and last == args.steps and len(ref_losses) == args.steps
    report(f"{'PASS' if ok else 'FAIL'} soak_preemption: {args.interruptions} interruptions, the same "
           f"{'losses and step count' if ok else '? (see above)'} as the uninterrupted run")
    with open(os.path.join(args.out, "soak_report.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
