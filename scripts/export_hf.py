#!/usr/bin/env python3
"""export_hf.py: a train_gpt checkpoint or an llm.c model file -> a Hugging Face GPT-2 folder.

    python scripts/export_hf.py CHECKPOINT_OR_MODEL_FILE OUT_DIR [--dtype bf16|fp32] [--tokenizer]

The source is a checkpoint file (step_XXXXXXXX.ckpt, or any rank's file of a ZeRO-1 step), a checkpoint
folder (its newest complete step, as `--resume DIR`), or an llm.c model file (fp32 or bf16). OUT_DIR gets
  config.json          GPT2LMHeadModel's config (n_layer, n_embd, n_head, n_positions = the model's
                       positions, vocab 50257, GELU tanh, LayerNorm eps 1e-5, tied LM head, no dropout)
  model.safetensors    the weights in --dtype, named as GPT2LMHeadModel's, the Conv1D matrices transposed
                       to GPT-2's (in, out) layout, the vocab padding rows of wte (50257..50303) dropped; the
                       LM head is wte (tied), so it is not stored
and with --tokenizer GPT-2's tokenizer files (vocab.json, merges.txt, tokenizer_config.json,
special_tokens_map.json), made offline from tiktoken's r50k_base ranks (TIKTOKEN_CACHE_DIR).
Then, with PyTorch and transformers:
    model = transformers.GPT2LMHeadModel.from_pretrained(OUT_DIR)
    tokenizer = transformers.AutoTokenizer.from_pretrained(OUT_DIR)   # with --tokenizer

Which weights: from a checkpoint, --dtype bf16 (default) writes the bf16 weights train_gpt computes with,
bit for bit; --dtype fp32 writes the fp32 master weights (a ZeRO-1 step needs every rank's file for these).
From a model file, its values, rounded to nearest even for bf16 from fp32, or widened exactly for fp32 from
bf16. scripts/import_hf.py turns the folder back into a model file with the same bits (wte's padding rows,
never used by the model, come back as zeros).

Refused, with the reason: models with grouped-query attention (--kv-heads below --heads: GPT-2's format
has one key/value head per head and cannot express them), files with header fields this script does not
know (a newer format), damaged or truncated
files, non-finite weights, and --tokenizer for a vocabulary other than GPT-2's. Needs numpy only (and
tiktoken for --tokenizer); exit 0 when written, 1 on an error.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402
from hf_gpt2 import FormatError  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description="Export a train_gpt checkpoint or llm.c model file as a Hugging Face "
                                            "GPT-2 folder (GPT2LMHeadModel).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("source", help="a checkpoint file, a checkpoint folder (its newest step) or an llm.c model file")
    p.add_argument("out_dir", help="the folder to write (made if missing; our files in it are replaced)")
    p.add_argument("--dtype", choices=hf_gpt2.DTYPES, default="bf16",
                   help="bf16 (default): a checkpoint's bf16 weights; fp32: a checkpoint's fp32 master weights")
    p.add_argument("--tokenizer", action="store_true", help="also write GPT-2's tokenizer files (offline, tiktoken)")
    return p.parse_args(argv)


def export(source, out_dir, dtype, tokenizer=False, log=print):
    """Writes out_dir; returns the Weights exported."""
    weights = hf_gpt2.read_source(source, dtype)
    hf_gpt2.check_finite(weights)
    cfg = weights.cfg
    if tokenizer and cfg.vocab_size != hf_gpt2.VOCAB_SIZE:
        raise FormatError(f"{source}: vocab {cfg.vocab_size}: GPT-2's tokenizer has {hf_gpt2.VOCAB_SIZE} tokens; "
                          "export without --tokenizer")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FormatError(f"{out_dir}: exists and is not a folder; choose another output folder")
    os.makedirs(out_dir, exist_ok=True)
    plan = hf_gpt2.hf_tensor_plan(weights)
    entries = []
    for name, i, layer, transposed in plan:
        shape = weights.tensors[i].shape[1:] if layer is not None else weights.tensors[i].shape
        if hf_gpt2.PARAM_NAMES[i] == "wte":
            shape = (cfg.vocab_size,) + tuple(shape[1:])
        shape = tuple(reversed(shape)) if transposed else tuple(shape)
        entries.append((name, dtype, shape,
                        lambda i=i, layer=layer, t=transposed: hf_gpt2.hf_tensor(weights, i, layer, t)))
    hf_gpt2.write_safetensors(os.path.join(out_dir, "model.safetensors"), entries, {"format": "pt"})
    config = hf_gpt2.hf_config(cfg, dtype)
    hf_gpt2.atomic_write(os.path.join(out_dir, "config.json"),
                         lambda f: f.write((json.dumps(config, indent=2) + "\n").encode()))
    count = sum(int(np.prod(shape)) for _, _, shape, _ in entries)
    log(f"read     {weights.source}: {hf_gpt2.describe(cfg)}")
    log(f"wrote    {os.path.join(out_dir, 'model.safetensors')}: {len(entries)} tensors, {count:,} parameters, "
        f"{dtype} (wte cut from {cfg.padded_vocab_size} to {cfg.vocab_size} rows; the LM head is tied to it)")
    log(f"wrote    {os.path.join(out_dir, 'config.json')}: GPT2LMHeadModel, n_layer {cfg.num_layers}, "
        f"n_embd {cfg.channels}, n_head {cfg.num_heads}, n_positions {cfg.max_seq_len}")
    if tokenizer:
        names = hf_gpt2.write_tokenizer_files(out_dir, cfg.max_seq_len)
        log(f"wrote    {', '.join(names)} (GPT-2's tokenizer, from tiktoken's r50k_base ranks)")
    return weights


def main(argv=None):
    args = parse_args(argv)
    try:
        export(args.source, args.out_dir, args.dtype, args.tokenizer)
    except (FormatError, OSError) as err:
        print(f"export_hf.py: error: {err}", file=sys.stderr)
        return 1
    print(f"load with transformers.GPT2LMHeadModel.from_pretrained({args.out_dir!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
