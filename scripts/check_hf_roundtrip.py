#!/usr/bin/env python3
"""check_hf_roundtrip.py: train_gpt's models in and out of Hugging Face transformers, on a GPU machine.

Run from the repository root on a machine with a GPU, PyTorch and transformers (no network needed), after
`make train_gpt` and with the Tiny Shakespeare shards (`make dataset`):
    python3 scripts/check_hf_roundtrip.py --out build/check_hf
    python3 scripts/check_hf_roundtrip.py --checkpoint run/step_00005000.ckpt   # a checkpoint of yours
For --tokenizer checks offline, set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's r50k_base ranks.

(a) export: a trained gpt2-124m -> scripts/export_hf.py -> GPT2LMHeadModel.from_pretrained
    1. trains gpt2-124m for --steps steps on --train-data with ./train_gpt and keeps its last checkpoint
       (or takes --checkpoint); exports its bf16 weights (the ones train_gpt computes with) with --tokenizer;
    2. imports the export back (scripts/import_hf.py): the bf16 bits must equal the checkpoint's;
    3. on one batch of --val-data (B x T tokens as train_gpt's loader serves them), compares
         transformers' logits (fp32 on the exported weights)  with  our PyTorch reference model
         (scripts/torch_gpt.py, fp32) on the imported file: ||hf - ref|| / ||ref|| <= --logit-tol, and
         transformers' mean loss  with  train_gpt's loss on the same batch and weights: |diff| / loss <= --loss-tol.
       train_gpt's loss is the step-1 loss of `./train_gpt --init-from FILE --train-data BATCH --max-steps 1
       --lr 0` (the forward before any update) and its validation loss on the same batch after that step
       (lr 0: the weights do not move). train_gpt computes in bf16 (fp32 accumulation), transformers here in
       fp32: --loss-tol (1e-2) is a bf16 bound; the table also shows transformers' own bf16 loss for scale.
       A wrong transpose, head split or untied head moves the loss by whole nats.
    4. the tokenizer files load with AutoTokenizer and encode text as tiktoken does (when tiktoken is here).
(b) import: a random GPT2LMHeadModel -> save_pretrained -> scripts/import_hf.py -> ./train_gpt --init-from
    1. builds GPT2LMHeadModel (gpt2-124m's width, --random-layers layers, 1024 positions) with weights drawn
       so that attention is not uniform and the logits are sharp (random LayerNorm and bias values too),
       saves it with save_pretrained;
    2. imports it as fp32 and exports that again: transformers must load the same tensors, bit for bit;
    3. imports it as bf16 (what train_gpt trains with) and makes the batch: B sequences of T tokens sampled
       from the model itself, so that a model wired differently would find them unlikely;
    4. compares on that batch, on the bf16-rounded weights: transformers' logits with the reference model on
       the imported file (--logit-tol), and transformers' loss with train_gpt's (--seq-len T < 1024 positions:
       train_gpt takes the first T rows of wpe) (--loss-tol).
Prints a table and a PASS/FAIL line per check, then PASS or FAIL; exit 0 when everything passed, 1 otherwise.
With --out DIR every file is kept there (check_hf_roundtrip.log is the report); otherwise a temporary folder
is used and removed.
"""
import argparse
import glob
import inspect
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never look for a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_hf  # noqa: E402
import hf_gpt2  # noqa: E402
import import_hf  # noqa: E402
import results_common  # noqa: E402
import shard_format  # noqa: E402
import train_runs  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO_ROOT, "data", "tinyshakespeare", "tinyshakespeare_{}_*.bin")
V = hf_gpt2.VOCAB_SIZE
DEVICE = "cuda"  # --device


def parse_args():
    p = argparse.ArgumentParser(description="Check Hugging Face export and import against transformers and "
                                            "train_gpt on a GPU.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--train-gpt", default=os.path.join(REPO_ROOT, "train_gpt"), help="the binary (default ./train_gpt)")
    p.add_argument("--train-data", default=DATA.format("train"), help="shards for (a)'s training run")
    p.add_argument("--val-data", default=DATA.format("val"), help="shards for (a)'s batch (its first B x T + 1 tokens)")
    p.add_argument("--checkpoint", help="(a): export this checkpoint (file or folder) instead of training one")
    p.add_argument("--steps", type=int, default=60, help="(a): training steps of gpt2-124m (default 60)")
    p.add_argument("--batch-size", type=int, default=4, help="B of the training run and of the batches (default 4)")
    p.add_argument("--seq-len", type=int, default=1024, help="(a): T of the training run and batch (default 1024)")
    p.add_argument("--attn", default="flash2", help="train_gpt's attention backend (default flash2)")
    p.add_argument("--random-layers", type=int, default=4, help="(b): layers of the random model (default 4)")
    p.add_argument("--random-seq-len", type=int, default=256, help="(b): T of its batch (default 256)")
    p.add_argument("--seed", type=int, default=1234, help="(b): seed of the random model and its batch")
    p.add_argument("--loss-tol", type=float, default=1e-2, help="train_gpt vs transformers loss, relative (1e-2)")
    p.add_argument("--logit-tol", type=float, default=1e-4,
                   help="transformers vs the PyTorch reference, ||diff|| / ||ref|| of the logits (1e-4)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per train_gpt run (default 300)")
    p.add_argument("--device", default="cuda", help="torch device of transformers and the reference (default cuda; "
                   "cpu only to try the script)")
    p.add_argument("--out", help="keep every file and the report (check_hf_roundtrip.log) in this folder")
    args = p.parse_args()
    if min(args.steps, args.batch_size, args.seq_len, args.random_layers, args.random_seq_len) < 1:
        p.error("--steps, --batch-size, --seq-len, --random-layers and --random-seq-len must be >= 1")
    if args.random_seq_len > 1024:
        p.error("--random-seq-len must be <= 1024 (the random model's positions)")
    return args


class Report(results_common.Report):
    """Prints lines, keeps them for the log (results_common.Report), and collects the checks."""

    def __init__(self):
        super().__init__()
        self.failures, self.rows = [], []

    def check(self, name, ok, value, bound):
        self.rows.append((name, value, bound, "PASS" if ok else "FAIL"))
        self(f"{'PASS' if ok else 'FAIL'} {name}: {value} (bound {bound})")
        if not ok:
            self.failures.append(name)

    def info(self, name, value):
        self.rows.append((name, value, "", "info"))
        self(f"     {name}: {value}")

    def table(self):
        width = max(len(r[0]) for r in self.rows)
        self()
        self(f"{'check':{width}}  {'value':44}  {'bound':10}  result")
        for name, value, bound, result in self.rows:
            self(f"{name:{width}}  {value:44}  {bound:10}  {result}")


def run_train_gpt(args, flags, work, tag, report):
    """Runs ./train_gpt with flags and --log-file; returns {step: record} and {step: val_loss}."""
    log_path, out_path = os.path.join(work, f"{tag}.jsonl"), os.path.join(work, f"{tag}.log")
    if os.path.exists(log_path):
        os.remove(log_path)
    cmd = [args.train_gpt, *flags, *train_runs.quiet_flags(flags), "--attn", args.attn, "--log-file", log_path]
    report(f"$ {shlex.join(cmd)}")
    start = time.time()
    with open(out_path, "w") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout,
                                cwd=REPO_ROOT).returncode
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"train_gpt gave no result within {args.timeout:g} s (see {out_path})")
    if rc != 0:
        with open(out_path, errors="replace") as f:
            tail = [line.rstrip() for line in f if line.strip()][-4:]
        raise RuntimeError(f"train_gpt exited {rc}: " + " / ".join(tail))
    steps, vals = {}, {}
    with open(log_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if "val_loss" in r:
                    vals[int(r["step"])] = float(r["val_loss"])
                elif "loss" in r:
                    steps[int(r["step"])] = r
    report(f"     ({time.time() - start:.1f} s; output in {out_path})")
    return steps, vals


def forward_loss_of_train_gpt(args, model_file, cfg, window, B, T, work, tag, report):
    """train_gpt's loss on the batch `window` (B*T+1 tokens): (step-1 loss, validation loss after an lr-0 step)."""
    shard = os.path.join(work, f"{tag}_batch.bin")
    shard_format.write_shard(shard, window)
    flags = [*import_hf.train_gpt_flags(cfg).split(), "--init-from", model_file, "--train-data", shard,
             "--val-data", shard, "--val-batches", "1", "--batch-size", str(B), "--seq-len", str(T),
             "--max-steps", "1", "--lr", "0", "--warmup-steps", "0"]
    steps, vals = run_train_gpt(args, flags, work, f"{tag}_forward", report)
    if 1 not in steps or 1 not in vals:
        raise RuntimeError(f"train_gpt's log has no step-1 loss or validation loss ({tag})")
    return float(steps[1]["loss"]), vals[1]


def torch_setup():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


def hf_logits(model, inputs):
    import torch
    with torch.no_grad():
        return model(torch.from_numpy(inputs).to(DEVICE)).logits.float()


def mean_loss(logits, targets):
    import torch
    import torch.nn.functional as F
    t = torch.from_numpy(targets).to(DEVICE)
    return F.cross_entropy(logits[..., :V].reshape(-1, V).float(), t.reshape(-1)).item()


def reference_logits(model_file, inputs):
    """Logits (B, T, V) of scripts/torch_gpt.py's model in fp32 on an llm.c model file."""
    import torch
    import torch_gpt as tg
    cfg, _, tensors = tg.read_model_file(model_file)
    model = tg.GPT(cfg)
    tg.load_stacked_(model, tensors)
    model = model.to(DEVICE).eval()
    with tg.sdpa_context("math"), torch.no_grad():
        return model(torch.from_numpy(inputs).to(DEVICE))[..., :V].float()


def rel_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def compare_losses(report, what, hf_loss, ours, hf_bf16_loss, args):
    step1, val = ours
    for name, value in (("step-1 loss", step1), ("val loss after an lr-0 step", val)):
        err = abs(value - hf_loss) / abs(hf_loss)
        report.check(f"{what} loss: train_gpt {name} vs transformers fp32", err <= args.loss_tol,
                     f"{value:.5f} vs {hf_loss:.5f} (rel {err:.1e})", f"{args.loss_tol:g}")
    if hf_bf16_loss is not None:
        report.info(f"{what} loss: transformers in bf16, for scale",
                    f"{hf_bf16_loss:.5f} (rel {abs(hf_bf16_loss - hf_loss) / abs(hf_loss):.1e})")


def first_batch(pattern, B, T):
    """The B*T+1 tokens of the first batch train_gpt's loader serves from pattern, and (inputs, targets)."""
    import torch_gpt as tg
    inputs, targets = tg.Batches(pattern, B, T).next()
    window = np.append(inputs.ravel(), targets.ravel()[-1])
    return window, inputs, targets


# ---------------------------------------------------------------------------------------------
# (a) export

def check_export(args, work, report):
    torch = torch_setup()
    import transformers
    report()
    report("(a) export: a trained gpt2-124m -> export_hf.py -> transformers")
    if args.checkpoint:
        checkpoint = hf_gpt2.newest_checkpoint(args.checkpoint) if os.path.isdir(args.checkpoint) else args.checkpoint
    else:
        ckpt_dir = os.path.join(work, "train_ckpt")
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # this script's own folder: a rerun starts afresh
        steps, _ = run_train_gpt(args, ["--model", "gpt2-124m", "--train-data", args.train_data, "--val-data", "",
                                        "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
                                        "--max-steps", str(args.steps), "--checkpoint-dir", ckpt_dir],
                                 work, "train", report)
        report.info("(a) training", f"loss {steps[min(steps)]['loss']:.3f} at step {min(steps)}, "
                                f"{steps[max(steps)]['loss']:.3f} at step {max(steps)}")
        checkpoint = hf_gpt2.newest_checkpoint(ckpt_dir)
    ckpt = hf_gpt2.read_checkpoint(checkpoint, "bf16")
    cfg = ckpt.cfg
    T = min(args.seq_len, cfg.max_seq_len)
    folder = os.path.join(work, "hf_trained")
    start = time.time()
    try:
        export_hf.export(checkpoint, folder, "bf16", tokenizer=True, log=report)
        tokenizer = True
    except hf_gpt2.FormatError as err:
        if "tiktoken" not in str(err):
            raise
        report(f"note: no tokenizer files ({err}); exporting without them")
        export_hf.export(checkpoint, folder, "bf16", tokenizer=False, log=report)
        tokenizer = False
    report.info("(a) export time", f"{time.time() - start:.1f} s")

    # 2. the export imported back: the checkpoint's bf16 bits
    model_file = os.path.join(work, "trained_bf16.bin")
    back = import_hf.import_folder(folder, model_file, "bf16", log=report)
    differ = sum(int(np.count_nonzero(np.asarray(b)[:V] != np.asarray(o)[:V])) if name == "wte" else
                 int(np.count_nonzero(np.asarray(b) != np.asarray(o)))
                 for name, b, o in zip(hf_gpt2.PARAM_NAMES, back.tensors, ckpt.tensors))
    report.check("(a) checkpoint -> export -> import: bf16 weights", differ == 0, f"{differ} values differ", "0")

    # 3. one batch: transformers vs the reference model vs train_gpt
    window, inputs, targets = first_batch(args.val_data, args.batch_size, T)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).to(device=DEVICE, dtype=torch.float32).eval()
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    report.check("(a) transformers: LM head tied to wte", tied, str(tied), "True")
    logits = hf_logits(model, inputs)
    hf_loss = mean_loss(logits, targets)
    ref = reference_logits(model_file, inputs)
    err = rel_error(logits, ref)
    report.check("(a) logits: transformers vs reference model", err <= args.logit_tol,
                 f"rel {err:.1e}, max |diff| {(logits - ref).abs().max().item():.1e}", f"{args.logit_tol:g}")
    if tokenizer:
        greedy_sample(model, folder, report)
    hf_bf16_loss = mean_loss(hf_logits(model.to(torch.bfloat16), inputs), targets)
    del model
    ours = forward_loss_of_train_gpt(args, model_file, cfg, window, args.batch_size, T, work, "trained", report)
    compare_losses(report, "(a)", hf_loss, ours, hf_bf16_loss, args)

    # 4. the tokenizer
    if tokenizer:
        check_tokenizer(folder, window, report)
    else:
        report.info("(a) tokenizer", "skipped: no tokenizer files (set TIKTOKEN_CACHE_DIR)")


def greedy_sample(model, folder, report):
    """transformers' greedy continuation of a prompt with the exported model and tokenizer (shown, not checked)."""
    import transformers
    try:
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        ids = tok("ROMEO:", return_tensors="pt")["input_ids"].to(DEVICE)
        out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=hf_gpt2.EOT_TOKEN)
        report.info("(a) transformers' greedy sample", repr(tok.decode(out[0]))[:120])
    except Exception as err:  # noqa: BLE001 - informational only
        report.info("(a) transformers' greedy sample", f"not made: {type(err).__name__}: {err}"[:120])


def check_tokenizer(folder, window, report):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    try:
        import tiktoken
        enc = tiktoken.get_encoding("r50k_base")
    except Exception as err:  # noqa: BLE001 - an optional comparison
        report.info("(a) tokenizer", f"loads ({type(tok).__name__}); not compared: tiktoken unavailable ({err})")
        return
    text = enc.decode([int(t) for t in window if t != hf_gpt2.EOT_TOKEN])
    want = enc.encode_ordinary(text)
    got = tok(text)["input_ids"]
    report.check("(a) tokenizer: AutoTokenizer vs tiktoken r50k_base", got == want,
                 f"{'equal' if got == want else 'differ'} on {len(want)} tokens", "equal")


# ---------------------------------------------------------------------------------------------
# (b) import

def random_gpt2(args):
    """GPT2LMHeadModel of gpt2-124m's width with weights that make attention and logits informative."""
    torch = torch_setup()
    import transformers
    config = transformers.GPT2Config(n_layer=args.random_layers, n_embd=768, n_head=12, n_positions=1024,
                                     vocab_size=V, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(args.seed)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wte.weight"):
                p.normal_(0.0, 0.1)      # logits of std ~3: a peaked next-token distribution
            elif name.endswith("wpe.weight"):
                p.normal_(0.0, 0.1)
            elif name.endswith("c_attn.weight"):
                p.normal_(0.0, 0.06)     # q.k / 8 of order 1: attention far from uniform
            elif ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
    return model.eval()


def sample_batch(model, B, T, seed):
    """B sequences of T tokens sampled from the model (a random first token each), as a shard window."""
    import torch
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    seqs = torch.randint(0, V, (B, 1), device=DEVICE, generator=gen)
    with torch.no_grad():
        while seqs.shape[1] < T:
            probs = torch.softmax(model(seqs).logits[:, -1].float(), dim=-1)
            seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], dim=1)
    window = np.append(seqs.cpu().numpy().ravel(), hf_gpt2.EOT_TOKEN)
    return window, window[:-1].reshape(B, T), window[1:].reshape(B, T)


def check_import(args, work, report):
    torch = torch_setup()
    import transformers
    report()
    report(f"(b) import: a random GPT2LMHeadModel (L{args.random_layers} C768 NH12, 1024 positions) -> "
           "save_pretrained -> import_hf.py -> train_gpt")
    model = random_gpt2(args)
    folder = os.path.join(work, "hf_random")
    kwargs = {"safe_serialization": True} if "safe_serialization" in \
        inspect.signature(model.save_pretrained).parameters else {}
    model.save_pretrained(folder, **kwargs)
    report(f"     saved {folder}: {sorted(os.listdir(folder))}")

    # 2. fp32 import, export again: the same tensors
    fp32_file = os.path.join(work, "random_fp32.bin")
    import_hf.import_folder(folder, fp32_file, "fp32", log=report)
    again = os.path.join(work, "hf_random_again")
    export_hf.export(fp32_file, again, "fp32", log=report)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(again).to(torch.float32)
    a, b = model.state_dict(), reloaded.state_dict()
    keys = [k for k in a if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    same = [k for k in keys if k in b and torch.equal(a[k], b[k])]
    report.check("(b) save_pretrained -> import fp32 -> export fp32 -> from_pretrained", len(same) == len(keys),
                 f"{len(same)} of {len(keys)} tensors bit-identical", "all")
    del reloaded

    # 3. bf16 import; the batch sampled from the model
    bf16_file = os.path.join(work, "random_bf16.bin")
    weights = import_hf.import_folder(folder, bf16_file, "bf16", log=report)
    model = model.to(DEVICE)
    T = args.random_seq_len
    window, inputs, targets = sample_batch(model, args.batch_size, T, args.seed)
    # 4. the same bf16-rounded weights in transformers
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    logits = hf_logits(model, inputs)
    hf_loss = mean_loss(logits, targets)
    report.info("(b) batch: B x T tokens sampled from the model", f"{args.batch_size} x {T}, loss {hf_loss:.4f} "
                                                                  f"(uniform: {math.log(V):.4f})")
    ref = reference_logits(bf16_file, inputs)
    err = rel_error(logits, ref)
    report.check("(b) logits: transformers vs reference model on the import", err <= args.logit_tol,
                 f"rel {err:.1e}, max |diff| {(logits - ref).abs().max().item():.1e}", f"{args.logit_tol:g}")
    hf_bf16_loss = mean_loss(hf_logits(model.to(torch.bfloat16), inputs), targets)
    del model
    ours = forward_loss_of_train_gpt(args, bf16_file, weights.cfg, window, args.batch_size, T, work, "random", report)
    compare_losses(report, "(b)", hf_loss, ours, hf_bf16_loss, args)


def main():
    args = parse_args()
    try:
        import torch
        import transformers
    except ImportError as err:
        sys.exit(f"check_hf_roundtrip.py: error: {err}; run this on a GPU machine with PyTorch and transformers")
    global DEVICE
    DEVICE = args.device
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("check_hf_roundtrip.py: error: no CUDA GPU visible to PyTorch")
    if not os.path.exists(args.train_gpt):
        sys.exit(f"check_hf_roundtrip.py: error: {args.train_gpt} not found; build it with `make train_gpt`")
    for flag, pattern in (("--val-data", args.val_data),) + ((("--train-data", args.train_data),)
                                                              if not args.checkpoint else ()):
        if not glob.glob(pattern):
            sys.exit(f"check_hf_roundtrip.py: error: {flag} {pattern}: no such shard; run `make dataset` (Tiny "
                     "Shakespeare) or give another")
    work = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="check_hf_roundtrip_")
    os.makedirs(work, exist_ok=True)
    report = Report()
    start = time.time()
    try:
        report(f"check_hf_roundtrip: {shlex.join([os.path.basename(sys.executable)] + sys.argv)}")
        device = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else DEVICE
        report(f"torch {torch.__version__}, transformers {transformers.__version__}, {device}; "
               f"train_gpt {args.train_gpt}, attention {args.attn}")
        for part in (check_export, check_import):
            try:
                part(args, work, report)
            except Exception as err:  # noqa: BLE001 - a part that breaks is one failed check; the other still runs
                report("".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip())
                report.check(f"{part.__name__} ran to the end", False, f"{type(err).__name__}: {err}"[:300], "no error")
        report.table()
        report()
        verdict = "FAIL" if report.failures else "PASS"
        report(f"{verdict}: {len(report.rows) - sum(r[3] == 'info' for r in report.rows) - len(report.failures)} "
               f"checks passed, {len(report.failures)} failed ({time.time() - start:.0f} s)")
    finally:
        if args.out:
            with open(os.path.join(work, "check_hf_roundtrip.log"), "w") as f:
                f.write("\n".join(report.lines) + "\n")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
