#!/usr/bin/env python3
"""import_hf.py: a Hugging Face GPT-2 folder -> an llm.c model file for `./train_gpt --init-from`.

    python scripts/import_hf.py HF_DIR OUT.bin [--dtype fp32|bf16]
    ./train_gpt --init-from OUT.bin --model gpt2-124m ...      (the command it prints for the model's shape)

HF_DIR is a folder with config.json and model.safetensors (or model.safetensors.index.json and its shards):
one written by scripts/export_hf.py, by `save_pretrained`, or a downloaded GPT-2 (e.g. the hub's "gpt2",
the 124M model; in the Hugging Face cache it is models--gpt2/snapshots/<hash>/). Tensor names with or
without GPT2LMHeadModel's "transformer." prefix are read; the attention-mask buffers of old files
(attn.bias, attn.masked_bias) are skipped; an lm_head.weight must equal wte (the head is tied).

The file gets the 16 tensors of data/gpt_config.h: GPT-2's Conv1D (in, out) matrices transposed to our
(out, in), the per-layer tensors stacked, wte padded from 50257 to 50304 rows with zeros, wpe with all
n_positions rows (train_gpt takes the first --seq-len of them). --dtype: fp32 or bf16; default the
folder's (bf16 for bf16 weights, else fp32; F16 is widened exactly); fp32 -> bf16 rounds to nearest even.
An export by scripts/export_hf.py comes back with the same bits.

Refused, with the reason: anything train_gpt's model cannot run: another architecture (model_type), a
head dim its attention kernels are not built for (64, 80, 96, 128), another vocabulary, an MLP other
than 4 x n_embd, an activation other than GELU tanh, another LayerNorm eps, attention scaling other than
1/sqrt(head dim), an untied LM head; and missing, extra or misshapen tensors, non-finite values,
pytorch_model.bin-only folders. Needs numpy only; exit 0 when written, 1 on an error.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402
from hf_gpt2 import FormatError  # noqa: E402

BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers some GPT-2 files carry; not weights


def parse_args(argv):
    p = argparse.ArgumentParser(description="Import a Hugging Face GPT-2 folder as an llm.c model file for "
                                            "train_gpt --init-from.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("hf_dir", help="folder with config.json and model.safetensors")
    p.add_argument("out", help="the llm.c model file to write")
    p.add_argument("--dtype", choices=hf_gpt2.DTYPES, default=None,
                   help="values of the file (default: the folder's: bf16 for bf16 weights, else fp32)")
    return p.parse_args(argv)


def gpt2_tensors(raw, config, where):
    """{GPT-2 name without prefix: (dtype, array)}: buffers skipped, lm_head checked against wte."""
    tensors = {}
    for name, value in raw.items():
        short = name[len(hf_gpt2.PREFIX):] if name.startswith(hf_gpt2.PREFIX) else name
        if short.endswith(BUFFERS):
            continue
        if short in tensors:
            raise FormatError(f"{where}: tensor {short} appears twice (with and without the \"transformer.\" prefix)")
        tensors[short] = value
    head = tensors.pop("lm_head.weight", None)
    if head is not None and "wte.weight" in tensors:
        wte = tensors["wte.weight"]
        if head[1].shape != wte[1].shape or not np.array_equal(to_fp32(*head), to_fp32(*wte)):
            raise FormatError(f"{where}: lm_head.weight differs from wte.weight; train_gpt ties its LM head to the "
                              "token embedding, so it cannot hold this model")
    elif head is not None or config.get("tie_word_embeddings", True) is False:
        raise FormatError(f"{where}: the LM head is not tied to wte (tie_word_embeddings false); train_gpt ties them")
    return tensors


def to_fp32(dtype, array):
    if dtype == "bf16":
        return hf_gpt2.convert(array, "bf16", "fp32")
    return np.asarray(array, dtype=np.float32)


def to_dtype(dtype, array, out):
    """An HF array in our dtype `out` (bf16 bits kept as they are when both are bf16)."""
    if dtype == out:
        return np.asarray(array)
    return hf_gpt2.convert(to_fp32(dtype, array), "fp32", out) if out == "bf16" else to_fp32(dtype, array)


def import_folder(hf_dir, out, dtype=None, log=print):
    """Writes the model file; returns its Weights."""
    config, raw = hf_gpt2.read_hf_folder(hf_dir)
    cfg = hf_gpt2.cfg_from_hf_config(config, os.path.join(hf_dir, "config.json"))
    tensors = gpt2_tensors(raw, config, hf_dir)
    dtypes = {d for d, _ in tensors.values()}
    out_dtype = dtype or ("bf16" if dtypes == {"bf16"} else "fp32")
    # Build the plan with a Weights of placeholders to get each GPT-2 tensor's place in ours.
    shapes = hf_gpt2.param_shapes(cfg)
    placeholder = hf_gpt2.Weights(cfg, out_dtype, [np.empty(0)] * len(shapes), hf_dir)
    plan = hf_gpt2.hf_tensor_plan(placeholder)
    expected = {name[len(hf_gpt2.PREFIX):] for name, _, _, _ in plan}
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected)
    if missing or extra:
        parts = ([f"missing {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")] if missing else []) + \
                ([f"not part of GPT-2 {', '.join(extra[:6])}" + (" ..." if len(extra) > 6 else "")] if extra else [])
        raise FormatError(f"{hf_dir}: the tensors do not match GPT2LMHeadModel with this config.json "
                          f"({hf_gpt2.describe(cfg)}): " + "; ".join(parts))
    item = np.float32 if out_dtype == "fp32" else np.uint16
    ours = [np.zeros(shape, dtype=item) for _, shape in shapes]  # wte's padding rows stay zero
    for name, i, layer, transposed in plan:
        short = name[len(hf_gpt2.PREFIX):]
        src_dtype, array = tensors[short]
        target = ours[i][layer] if layer is not None else ours[i]
        if hf_gpt2.PARAM_NAMES[i] == "wte":
            target = target[:cfg.vocab_size]
        want = tuple(reversed(target.shape)) if transposed else tuple(target.shape)
        if tuple(array.shape) != want:
            raise FormatError(f"{hf_dir}: tensor {short} has shape {tuple(array.shape)}; config.json "
                              f"({hf_gpt2.describe(cfg)}) needs {want}")
        bad = hf_gpt2.nonfinite_count(array, src_dtype)
        if bad:
            raise FormatError(f"{hf_dir}: tensor {short} holds {bad} non-finite value(s) (inf or NaN)")
        value = to_dtype(src_dtype, array, out_dtype)
        target[...] = value.T if transposed else value
    weights = hf_gpt2.Weights(cfg, out_dtype, ours, hf_dir)
    hf_gpt2.check_finite(weights)
    hf_gpt2.write_model_file(out, weights)
    log(f"read     {hf_dir}: GPT-2 {hf_gpt2.describe(cfg)}, {'/'.join(sorted(dtypes))} weights")
    log(f"wrote    {out}: llm.c model file, {out_dtype}, wte padded to {cfg.padded_vocab_size} rows with zeros")
    return weights


def train_gpt_flags(cfg):
    """The train_gpt flags for this shape: a named model, or gpt2-124m with overrides."""
    for name, shape in hf_gpt2.NAMED_SHAPES.items():
        if shape == (cfg.num_layers, cfg.channels, cfg.num_heads):
            return f"--model {name}"
    return f"--layers {cfg.num_layers} --hidden {cfg.channels} --heads {cfg.num_heads}"


def main(argv=None):
    args = parse_args(argv)
    try:
        weights = import_folder(args.hf_dir, args.out, args.dtype)
    except (FormatError, OSError) as err:
        print(f"import_hf.py: error: {err}", file=sys.stderr)
        return 1
    cfg = weights.cfg
    print(f"train with ./train_gpt --init-from {args.out} {train_gpt_flags(cfg)} --seq-len N  "
          f"(N <= {cfg.max_seq_len})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
