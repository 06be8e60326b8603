#!/usr/bin/env python3
"""check_generate_vs_torch.py: greedy generation of `train_gpt --generate` against PyTorch's on the same weights.

Run on a GPU machine with PyTorch, from the repository root, after `make train_gpt`:
    python3 scripts/check_generate_vs_torch.py                     # gpt2-124m shape, 4 prompts x 64 tokens
    python3 scripts/check_generate_vs_torch.py --kv-heads 4        # the same with grouped-query attention
    python3 scripts/check_generate_vs_torch.py --tokens 128 --out build/check_generate

What it does:
 1. draws random weights of the model's shape (GPT-2 init: normal 0.02, residual projections 0.02/sqrt(2L),
    LayerNorm gains 1, biases 0; with --wte-sigma S > 0 each row of wte is scaled by exp(N(0, S)), see
    below) from --seed and writes them as a bf16 llm.c model file; the PyTorch model (scripts/torch_gpt.py)
    loads the same bf16 values and runs in fp32 (TF32 off), so both sides start from identical weights;
 2. for each of --prompts random prompts of --prompt-len tokens runs
      ./train_gpt --generate M --init-from W --prompt-tokens IDS --num-samples S --temperature 0
    (prefill through the training forward, then the KV-cache decode) and reads the S generated sequences;
 3. PyTorch generates greedily by full recompute (the whole sequence through the model for every token);
 4. checks, per prompt:
      (a) the S sequences of one greedy batch are identical;
      (b) token for token against PyTorch's greedy sequence: the number of equal tokens before the first
          difference is reported (the "exact" column);
      (c) every one of our tokens is PyTorch's most likely next token after our own prefix, or within
          the tie tolerance of it (teacher forcing on our sequence: one PyTorch forward gives the logits
          at every step).
    PASS when (a) and (c) hold for every prompt and step; (b) is the strict comparison, reported.

Why (c) and not only (b): our logits are bf16 (the LM-head GEMM rounds them) and PyTorch's are fp32.
Between the two largest logits of a random model the gap is often below one bf16 step at their size
(2^-6 at logits of 2 to 4): both are then the same bf16 number and the first index wins, or the
activations' rounding moves one past the other. One such near-tie changes every later token, so a
free-running comparison measures luck as much as correctness. A wrong cache position, a missing K/V
row or a wrong head split moves the logits by O(1) and fails (c) at once. The tolerance is --tie-ulps
bf16 steps at the size of PyTorch's largest logit (default 3: about 0.05 at logits of 2 to 4).
--wte-sigma (default 1.0) gives the random model peaked, less Gaussian next-token distributions (rows of
wte with very different norms), so that near-ties are rarer and the exact column is long; 0 keeps plain
GPT-2 init.

Exit 0 when every check passes, 1 otherwise (2 on a usage error). With --out DIR the report
(check_generate_vs_torch.log), the weights and the commands' output are kept there.
"""
import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402
from results_common import Report  # noqa: E402  (prints lines and writes them to the log as they come)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"))
    ap.add_argument("--model", default="gpt2-124m")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default 0 = the heads: multi-head)")
    ap.add_argument("--positions", type=int, default=256, help="rows of wpe (the model's positions)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (at least 64 for the check)")
    ap.add_argument("--num-samples", type=int, default=2, help="sequences per train_gpt run (one greedy batch)")
    ap.add_argument("--attn", default="flash2", help="train_gpt's --attn for the prefill")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--wte-sigma", type=float, default=1.0)
    ap.add_argument("--tie-ulps", type=float, default=3.0)
    ap.add_argument("--out", help="keep everything in this folder")
    args = ap.parse_args()
    if args.prompt_len + args.tokens - 1 > args.positions:
        ap.error("--prompt-len + --tokens - 1 must be at most --positions")
    return args


def run_train_gpt(args, weights, prompt, work, tag, report):
    cmd = [args.train_gpt, "--generate", str(args.tokens), "--init-from", weights, "--prompt-tokens",
           ",".join(str(t) for t in prompt), "--num-samples", str(args.num_samples), "--temperature", "0",
           "--attn", args.attn]  # its "tokens" lines give the ids (the text needs no token table)
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600, cwd=REPO_ROOT)
    with open(os.path.join(work, f"train_gpt_{tag}.log"), "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        report(f"train_gpt failed (exit {r.returncode}):\n{r.stderr.strip()}")
        sys.exit(1)
    seqs = [[int(x) for x in line.split()[1:]] for line in r.stdout.splitlines() if line.startswith("tokens ")]
    speed = [line for line in r.stdout.splitlines() if line.startswith("speed")]
    return seqs, (speed[0] if speed else "")


def bf16_ulp(x):
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def main():
    args = parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = args.out or tempfile.mkdtemp(prefix="check_generate_")
    os.makedirs(work, exist_ok=True)
    with Report(os.path.join(work, "check_generate_vs_torch.log")) as report:
        return check(args, work, report)


def check(args, work, report):
    """Our greedy generation against PyTorch's on --prompts random prompts; returns the exit status."""
    import torch
    dev = "cuda"
    cfg = tg.gpt_config(args.model, args.layers, args.hidden, args.heads, args.positions, args.kv_heads)
    report(f"model {args.model}: L{cfg.num_layers} C{cfg.channels} NH{cfg.num_heads} NKV{cfg.num_kv_heads} (HD {cfg.head_dim}), "
           f"{args.positions} positions; seed {args.seed}, wte row sigma {args.wte_sigma}; {args.prompts} prompts of "
           f"{args.prompt_len} tokens, {args.tokens} new tokens each, {args.num_samples} samples per run; "
           f"attn {args.attn}; tie tolerance {args.tie_ulps} bf16 steps")
    weights = os.path.join(work, "weights_bf16.bin")
    tg.write_model_file(weights, cfg, tg.gpt2_init_numpy(cfg, args.seed, args.wte_sigma), dtype="bf16")
    _, _, tensors = tg.read_model_file(weights)  # the bf16 values, as fp32
    model = tg.GPT(cfg).to(dev)
    tg.load_stacked_(model, tensors)
    model.eval()
    V = cfg.vocab_size
    rng = np.random.default_rng(args.seed + 1)
    failures = 0
    report(f"{'prompt':>6} {'exact':>6} {'argmax':>7} {'ties':>5} {'worst deficit':>14}  speed")
    for p in range(args.prompts):
        prompt = [int(t) for t in rng.integers(0, V, size=args.prompt_len)]
        seqs, speed = run_train_gpt(args, weights, prompt, work, f"prompt{p}", report)
        if len(seqs) != args.num_samples or any(len(s) != args.tokens for s in seqs):
            report(f"prompt {p}: FAIL: train_gpt printed {len(seqs)} sequences of lengths {[len(s) for s in seqs]}")
            failures += 1
            continue
        if any(s != seqs[0] for s in seqs):
            report(f"prompt {p}: FAIL: the {args.num_samples} greedy samples of one batch differ")
            failures += 1
        ours = seqs[0]
        with torch.no_grad():
            # (b) PyTorch's own greedy sequence, full recompute per token
            seq = list(prompt)
            for _ in range(args.tokens):
                logits = model(torch.tensor([seq], device=dev))[0, -1, :V]
                seq.append(int(torch.argmax(logits)))
            theirs = seq[len(prompt):]
            exact = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), args.tokens)
            # (c) teacher forcing on our sequence: the logits before each of our tokens
            full = torch.tensor([prompt + ours[:-1]], device=dev)
            logits = model(full)[0, len(prompt) - 1:, :V].double().cpu().numpy()  # (tokens, V)
        worst, not_argmax, bad = 0.0, 0, []
        for i, tok in enumerate(ours):
            top = float(logits[i].max())
            deficit = top - float(logits[i][tok])
            tol = args.tie_ulps * bf16_ulp(top)
            worst = max(worst, deficit)
            if deficit > 0:
                not_argmax += 1
            if deficit > tol:
                bad.append((i, tok, int(logits[i].argmax()), deficit, tol))
        report(f"{p:>6} {exact:>6} {args.tokens - not_argmax:>7} {not_argmax:>5} {worst:>14.4g}  {speed}")
        if bad:
            failures += 1
            for i, tok, arg, deficit, tol in bad[:5]:
                report(f"prompt {p}: FAIL: step {i}: our token {tok} is {deficit:.4g} below PyTorch's best {arg} "
                       f"(tolerance {tol:.3g})")
    report("columns: exact = tokens equal to PyTorch's free-running greedy before the first difference; argmax = "
           "our tokens that are PyTorch's argmax after our prefix; ties = the others (all within the tolerance "
           "unless a FAIL line says so); worst deficit = the largest gap (logits) between PyTorch's best and ours")
    report("PASS" if failures == 0 else f"FAIL ({failures} prompt(s))")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
