#!/usr/bin/env python3
"""torch_gpt.py: the PyTorch reference of our GPT, and what the checks and benchmarks share with train_gpt.

Shared helpers (numpy only; usable without PyTorch):
  configs      the named shapes of data/gpt_config.h, overrides, parameter shapes and counts, and the
               FLOPs formula of the FlashAttention-2 paper's Table 1 (6·s·P + 12·L·h·s² per sequence,
               P all parameters)
  model files  GPT-2's initialization (gpt2_init_numpy), and llm.c's format, which `train_gpt --init-from PATH` reads and `--dump-grads PATH` writes:
               a header of 256 little-endian int32, [0] = 20240326 (magic), [1] = 3 (fp32 values) or
               5 (bf16 values), [2] = maxT, [3] = V (50257), [4] = L, [5] = NH, [6] = C, [7] = Vp (50304),
               [8] = NKV (key/value heads; 0 = NH, multi-head, as llm.c's files), the rest 0; then the
               16 tensors of gpt_config.h back to back, in its order
  batches      micro batches exactly as data/dataloader.h serves them to one process without shuffling
  schedule     train_gpt.cu's learning_rate(): linear warmup, then cosine down to lr·min_lr_fraction

The model (needs PyTorch): GPT-2/3 style, token + learned position embeddings, pre-LayerNorm blocks
(eps 1e-5), causal attention through F.scaled_dot_product_attention, MLP 4h with GELU (tanh), biases
everywhere, final LayerNorm, LM head tied to the token embedding (no bias), no dropout. The vocab is
padded to Vp: logits over all Vp rows are computed, the loss uses the first V columns only, as ours.
Each block keeps its own nn.Linear / nn.LayerNorm (the usual PyTorch model, fast under torch.compile);
stacked_tensors() and load_stacked_() convert to and from the 16 stacked tensors of gpt_config.h.
The qkv output (B, T, (NH + 2·NKV)·HD) is viewed as (B, T, NH + 2·NKV, HD): q = the first NH heads, k the
next NKV, v the last NKV ((B, T, 3, NH, HD) for multi-head); grouped-query attention (NKV < NH) runs
SDPA with enable_gqa=True (query head h reads K/V head h // (NH / NKV), as train_gpt).

The optimizer mirrors train_gpt: AdamW (β1 0.9, β2 0.95, eps 1e-8, decoupled weight decay on the 2-D
tensors wte, wpe, qkvw, attprojw, fcw, fcprojw only), global-norm clipping (clip_grad_norm_, the same
min(1, max_norm / (norm + 1e-6)) factor as layers/optimizer/global_norm.cuh), and gradient accumulation with each
micro step's mean loss divided by the number of micro steps.

Command line: the PyTorch side of scripts/bench_train.py, the reference a PyTorch user would run (fp32
parameters, bf16 autocast, fused AdamW, torch.compile, SDPA with one backend forced), timing whole
optimizer steps:
    python3 scripts/torch_gpt.py bench --model gpt3-1.3b --seq-len 2048 --batch-size 8 \\
        --total-batch-tokens 131072 --steps 6 --result-json build/torch_bench.json
It prints one line per step and writes a JSON result (status "ok", "oom" or "error"; the time of every
step, the first one including torch.compile; losses; peak memory) even when the run fails; exit 0 when
ok, 3 when out of GPU memory, 1 on another error. Under torchrun (`torchrun --nproc-per-node N
scripts/torch_gpt.py bench ...`) it trains data parallel, as a PyTorch user would: DistributedDataParallel
(NCCL; gloo on the CPU), each rank reading its slice of every chunk as train_gpt's ranks do, the micro
steps before the last under no_sync, --total-batch-tokens global, TFLOP/s per GPU; rank 0 prints and
writes the result.
`--fp8` trains the four linear layers of every block (qkv, attproj, fc, fcproj) in float8 with torchao
(`pip install torchao`): convert_to_float8_training with the tensorwise recipe (dynamic per-tensor
scales, e4m3 inputs and weights, e5m2 output gradients, cuBLAS FP8 GEMMs), applied before torch.compile,
under the same bf16 autocast; the LM head (tied to wte), the embeddings and the LayerNorms stay as they
are, and so does a layer with a dimension that is not a multiple of 16 (cuBLAS's FP8 GEMMs need that).
The PyTorch side of `bench_train.py --precision fp8`.
"""
import argparse
import contextlib
import dataclasses
import glob
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_format  # noqa: E402  (scripts/shard_format.py: the token-shard reader and writer)

try:
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
    from torch import nn
    _Module = nn.Module
except ImportError:  # configs, model files, batches and the schedule need numpy only
    torch = F = nn = None
    _Module = object

# ---------------------------------------------------------------------------------------------
# Configs (data/gpt_config.h)

VOCAB_SIZE = 50257
VOCAB_PAD_MULTIPLE = 128
PADDED_VOCAB_SIZE = (VOCAB_SIZE + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE  # 50304
LAYERNORM_EPS = 1e-5

NAMED_SHAPES = {  # name: (layers, hidden, heads), as NAMED_GPT_SHAPES in data/gpt_config.h
    "gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16), "gpt2-774m": (36, 1280, 20),
    "gpt2-1558m": (48, 1600, 25), "gpt3-1.3b": (24, 2048, 16), "gpt3-2.7b": (32, 2560, 32),
    "gpt3-2.7b-d128": (32, 2560, 20),
}

PARAM_NAMES = ("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb")
DECAYED = ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw")  # weight decay only on these (2-D weights)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    num_layers: int          # L
    channels: int            # C
    num_heads: int           # NH; head dim = C / NH
    max_seq_len: int         # maxT, rows of wpe (train_gpt sizes it to --seq-len)
    vocab_size: int = VOCAB_SIZE
    padded_vocab_size: int = PADDED_VOCAB_SIZE
    num_kv_heads: int = 0    # NKV key/value heads, a divisor of NH (0 given: NH, multi-head)

    def __post_init__(self):
        if not self.num_kv_heads:
            object.__setattr__(self, "num_kv_heads", self.num_heads)

    @property
    def head_dim(self):
        return self.channels // self.num_heads

    @property
    def qkv_features(self):
        """Outputs of the QKV projection: (NH + 2·NKV)·HD (3C for multi-head)."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def gpt_config(model="gpt2-124m", layers=0, hidden=0, heads=0, seq_len=1024, kv_heads=0):
    """The config train_gpt builds from --model, --layers/--hidden/--heads/--kv-heads (0 = keep; kv heads
    default to the heads) and --seq-len."""
    if model not in NAMED_SHAPES:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(NAMED_SHAPES)}")
    L, C, NH = NAMED_SHAPES[model]
    cfg = GPTConfig(layers or L, hidden or C, heads or NH, seq_len, num_kv_heads=kv_heads)
    if min(cfg.num_layers, cfg.channels, cfg.num_heads, cfg.max_seq_len) < 1 or cfg.channels % cfg.num_heads:
        raise ValueError(f"bad shape: {cfg} (hidden must be a multiple of heads; all >= 1)")
    if cfg.num_kv_heads < 1 or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"bad shape: {cfg.num_kv_heads} key/value heads do not divide {cfg.num_heads} heads; "
                         f"choose --kv-heads that divides --heads")
    return cfg


def param_shapes(cfg):
    """[(name, shape)] of the 16 tensors in gpt_config.h's order; Linear weights are (out, in)."""
    L, C, Vp, maxT, QKV = cfg.num_layers, cfg.channels, cfg.padded_vocab_size, cfg.max_seq_len, cfg.qkv_features
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, QKV, C)), ("qkvb", (L, QKV)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def num_params(cfg):
    """All parameters, padded wte and wpe included (gpt_num_params)."""
    return sum(math.prod(shape) for _, shape in param_shapes(cfg))


def flops_per_sequence(cfg, seq_len):
    """Model FLOPs of forward + backward on one sequence: 6·s·P + 12·L·h·s² (the FlashAttention-2 paper's Table 1);
    grouped-query attention changes only P (every query head still attends over all s keys)."""
    s = float(seq_len)
    return 6.0 * s * num_params(cfg) + 12.0 * cfg.num_layers * cfg.channels * s * s


def executed_flops_per_sequence(cfg, seq_len, recompute_blocks=False):
    """The FLOPs the kernels execute on one sequence (train_gpt's "hw" count, gpt_executed_flops): 6·s per
    weight of the four GEMMs of every block and of the LM head, causal flash attention over its s(s+1)/2
    unmasked pairs (forward 2 products, backward 5: S is recomputed), and, with recompute_blocks, every
    block's forward once more (its GEMMs and its attention forward)."""
    s, C, L = float(seq_len), float(cfg.channels), float(cfg.num_layers)
    qkv = C + 2.0 * C * cfg.num_kv_heads / cfg.num_heads
    pairs = s * (s + 1.0) / 2.0
    flops = 6.0 * s * (L * C * (qkv + 9.0 * C) + cfg.padded_vocab_size * C) + L * 14.0 * C * pairs
    if recompute_blocks:
        flops += L * (2.0 * s * C * (qkv + 9.0 * C) + 4.0 * C * pairs)
    return flops


# ---------------------------------------------------------------------------------------------
# Model files (llm.c's format)

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32, MODEL_VERSION_BF16 = 3, 5
MODEL_HEADER_INTS = 256


class ModelFileError(ValueError):
    """A model file that is not what it should be; the message names the file and the problem."""


def fp32_to_bf16_bits(x):
    """fp32 values -> bf16 bit patterns (uint16), rounded to nearest even, as train_gpt rounds."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def bf16_bits_to_fp32(bits):
    """bf16 bit patterns (uint16) -> fp32 values (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def gpt2_init_numpy(cfg, seed, wte_sigma=0.0):
    """GPT-2's initialization in numpy (fp32), the 16 tensors in write_model_file's order: weights
    N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)), LayerNorm gains 1, biases 0; with
    wte_sigma > 0 each row of wte is scaled by exp(N(0, wte_sigma)) (rows of unequal norm)."""
    rng = np.random.default_rng(seed)
    residual = 0.02 / math.sqrt(2 * cfg.num_layers)
    out = []
    for name, shape in param_shapes(cfg):
        if name in ("ln1w", "ln2w", "lnfw"):
            t = np.ones(shape, np.float32)
        elif name.endswith("b"):
            t = np.zeros(shape, np.float32)
        else:
            std = residual if name in ("attprojw", "fcprojw") else 0.02
            t = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if name == "wte" and wte_sigma > 0:
            t *= np.exp(rng.normal(0.0, wte_sigma, size=(shape[0], 1))).astype(np.float32)
        out.append(t)
    return out


def write_model_file(path, cfg, tensors, dtype="fp32"):
    """Writes the 16 tensors (numpy arrays, gpt_config.h's order and shapes) with the header.

    dtype "fp32" (version 3) or "bf16" (version 5). Written to a temporary name and renamed.
    """
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, not {dtype!r}")
    shapes = param_shapes(cfg)
    if len(tensors) != len(shapes):
        raise ValueError(f"{len(tensors)} tensors given, the model has {len(shapes)}")
    for (name, shape), t in zip(shapes, tensors):
        if tuple(np.shape(t)) != shape:
            raise ValueError(f"{name}: shape {tuple(np.shape(t))}, the config needs {shape}")
    header = np.zeros(MODEL_HEADER_INTS, dtype="<i4")
    header[:9] = (MODEL_MAGIC, MODEL_VERSION_FP32 if dtype == "fp32" else MODEL_VERSION_BF16, cfg.max_seq_len,
                  cfg.vocab_size, cfg.num_layers, cfg.num_heads, cfg.channels, cfg.padded_vocab_size,
                  0 if cfg.num_kv_heads == cfg.num_heads else cfg.num_kv_heads)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            for t in tensors:
                data = np.asarray(t, dtype=np.float32)
                f.write((data.astype("<f4") if dtype == "fp32" else fp32_to_bf16_bits(data)).tobytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_model_file(path):
    """Reads a model file. Returns (cfg, dtype "fp32"/"bf16", [16 float32 numpy arrays, shaped])."""
    size = os.path.getsize(path)
    if size < 4 * MODEL_HEADER_INTS:
        raise ModelFileError(f"{path}: {size} bytes, shorter than the {4 * MODEL_HEADER_INTS}-byte header")
    header = np.fromfile(path, dtype="<i4", count=MODEL_HEADER_INTS)
    if header[0] != MODEL_MAGIC:
        raise ModelFileError(f"{path}: bad magic {header[0]} (expected {MODEL_MAGIC}): not a model file")
    versions = {MODEL_VERSION_FP32: "fp32", MODEL_VERSION_BF16: "bf16"}
    if int(header[1]) not in versions:
        raise ModelFileError(f"{path}: version {header[1]} (expected {MODEL_VERSION_FP32} = fp32 or "
                             f"{MODEL_VERSION_BF16} = bf16)")
    dtype = versions[int(header[1])]
    maxT, V, L, NH, C, Vp, NKV = (int(x) for x in header[2:9])
    if min(maxT, V, L, NH, C, Vp) < 1 or C % NH or Vp < V or NKV < 0 or NH % (NKV or NH):
        raise ModelFileError(f"{path}: bad shape in the header: maxT {maxT}, V {V}, L {L}, NH {NH}, C {C}, Vp {Vp}, "
                             f"NKV {NKV}")
    cfg = GPTConfig(L, C, NH, maxT, V, Vp, num_kv_heads=NKV)  # NKV 0 (llm.c, older files): NH
    itemsize = 4 if dtype == "fp32" else 2
    expected = 4 * MODEL_HEADER_INTS + itemsize * num_params(cfg)
    if size != expected:
        raise ModelFileError(f"{path}: {size} bytes, but its header ({dtype}, L {L}, C {C}, maxT {maxT}, Vp {Vp}) "
                             f"needs {expected}")
    tensors, offset = [], 4 * MODEL_HEADER_INTS
    for _, shape in param_shapes(cfg):
        n = math.prod(shape)
        raw = np.fromfile(path, dtype="<f4" if dtype == "fp32" else "<u2", count=n, offset=offset)
        tensors.append((raw.astype(np.float32) if dtype == "fp32" else bf16_bits_to_fp32(raw)).reshape(shape))
        offset += n * itemsize
    return cfg, dtype, tensors


# ---------------------------------------------------------------------------------------------
# Batches (data/dataloader.h, one process, no shuffle)

def shard_paths(pattern):
    """The files a --train-data value names: a plain path, or a glob's matches sorted by name."""
    if not any(ch in pattern for ch in "*?["):
        return [pattern]
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"{pattern}: no file matches this pattern")
    return paths


class Batches:
    """Micro batches (inputs, targets), each (B, T) int64, in the order train_gpt's loader serves them.

    A shard of N tokens is cut into floor((N - 1) / (B·T·world)) chunks (shards with none are skipped);
    rank r of `world` reads the B·T slice at offset (c·world + r)·B·T of chunk c, inputs[b][t] = tok[off +
    b·T + t] and targets = the token after each (train_gpt's data parallel loader). Chunks go in order,
    shard after shard (sorted by name), and wrap to the first after the last. One shard is in memory at
    a time.
    """

    def __init__(self, pattern, B, T, vocab_size=VOCAB_SIZE, rank=0, world=1):
        self.B, self.T, self.vocab_size, self.rank, self.world = B, T, vocab_size, rank, world
        self.shards = []  # (path, chunks)
        for path in shard_paths(pattern):
            n = int(shard_format.read_header(path)[2])
            if (n - 1) // (B * T * world) > 0:
                self.shards.append((path, (n - 1) // (B * T * world)))
        if not self.shards:
            raise ValueError(f"{pattern}: no shard holds B*T*world+1 = {B * T * world + 1} tokens; lower B or T")
        self.shard, self.chunk, self.loaded, self.tokens = 0, 0, None, None

    def batches_per_epoch(self):
        return sum(chunks for _, chunks in self.shards)

    def next(self):
        path, chunks = self.shards[self.shard]
        if self.loaded != path:
            self.tokens = shard_format.read_shard(path)
            if self.tokens.size and int(self.tokens.max()) >= self.vocab_size:
                raise ValueError(f"{path}: token {int(self.tokens.max())} out of range (vocab {self.vocab_size})")
            self.loaded = path
        bt = self.B * self.T
        start = (self.chunk * self.world + self.rank) * bt  # rank r: its B·T slice of each chunk of B·T·world
        window = self.tokens[start: start + bt + 1].astype(np.int64)
        inputs, targets = window[:-1].reshape(self.B, self.T), window[1:].reshape(self.B, self.T)
        self.chunk += 1
        if self.chunk == chunks:
            self.chunk, self.shard = 0, (self.shard + 1) % len(self.shards)
        return inputs, targets


def write_random_shard(path, num_tokens, seed=0, vocab_size=VOCAB_SIZE):
    """A shard of uniformly random tokens (for timing when no real data is there)."""
    rng = np.random.default_rng(seed)
    shard_format.write_shard(path, rng.integers(0, vocab_size, num_tokens, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# Learning-rate schedule (train_gpt.cu's learning_rate)

def learning_rate(step, steps, lr, warmup_steps=0, min_lr_fraction=0.1):
    """Step counts from 1: lr·step/warmup while step <= warmup, then cosine from lr to lr·min_lr_fraction
    at the last step: min_lr + 0.5·(lr − min_lr)·(1 + cos(π·(step − warmup)/(steps − warmup)))."""
    if step <= warmup_steps:
        return lr * step / warmup_steps
    if steps <= warmup_steps:
        return lr
    progress = (step - warmup_steps) / (steps - warmup_steps)
    min_lr = lr * min_lr_fraction
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------
# The model (PyTorch)

def require_torch():
    if torch is None:
        sys.exit("torch_gpt.py: error: PyTorch is not installed; the model needs it (the file formats, "
                 "batches and configs do not)")


class Block(_Module):
    """Pre-LayerNorm transformer block: x += attproj(attention(LN1(x))); x += fcproj(GELU(fc(LN2(x))))."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg.channels
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.ln1 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.qkv = nn.Linear(C, cfg.qkv_features)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        NH, NKV = self.num_heads, self.num_kv_heads
        qkv = self.qkv(self.ln1(x)).view(B, T, NH + 2 * NKV, C // NH)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([NH, NKV, NKV], dim=2))  # (B, NH or NKV, T, HD)
        if NKV == NH:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(HD)
        else:  # query head h reads K/V head h // (NH / NKV)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.attproj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(_Module):
    """forward(inputs (B, T) int64) -> logits (B, T, Vp); forward(inputs, targets) -> mean loss over the
    first V logit columns (the padded rows of wte only ever see zero gradient from the loss)."""

    def __init__(self, cfg):
        require_torch()
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.channels)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.lnf = nn.LayerNorm(cfg.channels, eps=LAYERNORM_EPS)
        self.checkpoint_blocks = False  # activation checkpointing: keep each block's input, rerun it in backward

    def forward(self, inputs, targets=None):
        T = inputs.shape[1]
        x = self.wte(inputs) + self.wpe(torch.arange(T, device=inputs.device))
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied LM head, no bias: (B, T, Vp)
        if targets is None:
            return logits
        V = self.cfg.vocab_size
        real = logits[..., :V].reshape(-1, V)
        if real.dtype in (torch.bfloat16, torch.float16):  # the softmax in fp32, as ours
            real = real.float()
        return F.cross_entropy(real, targets.reshape(-1))


# (name in PARAM_NAMES, block submodule, attribute) of the per-layer tensors, stacked over L.
_LAYER_PARAMS = (("ln1w", "ln1", "weight"), ("ln1b", "ln1", "bias"), ("qkvw", "qkv", "weight"),
                 ("qkvb", "qkv", "bias"), ("attprojw", "attproj", "weight"), ("attprojb", "attproj", "bias"),
                 ("ln2w", "ln2", "weight"), ("ln2b", "ln2", "bias"), ("fcw", "fc", "weight"), ("fcb", "fc", "bias"),
                 ("fcprojw", "fcproj", "weight"), ("fcprojb", "fcproj", "bias"))


_UNSTACKED = ("wte", "wpe", "lnfw", "lnfb")  # the tensors that are not per layer


def _model_params(model):
    """[(name, [parameters])] in PARAM_NAMES order: one parameter, or one per layer for stacked names."""
    out = [("wte", [model.wte.weight]), ("wpe", [model.wpe.weight])]
    out += [(name, [getattr(getattr(b, sub), attr) for b in model.blocks]) for name, sub, attr in _LAYER_PARAMS]
    return out + [("lnfw", [model.lnf.weight]), ("lnfb", [model.lnf.bias])]


def stacked_tensors(model, grads=False):
    """The 16 tensors of gpt_config.h (copies; per-layer ones stacked to (L, ...)) of the parameters or,
    with grads=True, of their gradients (zeros where a parameter has none)."""
    out = []
    for name, params in _model_params(model):
        values = [(p.grad if p.grad is not None else torch.zeros_like(p)) if grads else p for p in params]
        values = [v.detach() for v in values]
        out.append(values[0].clone() if name in _UNSTACKED else torch.stack(values))
    return out


def load_stacked_(model, tensors):
    """Copies the 16 tensors (torch or numpy, gpt_config.h's shapes) into the model's parameters."""
    with torch.no_grad():
        for (name, params), value in zip(_model_params(model), tensors):
            value = value if torch.is_tensor(value) else torch.from_numpy(np.ascontiguousarray(value))
            if name in _UNSTACKED:
                params[0].copy_(value)
            else:
                for layer, p in enumerate(params):
                    p.copy_(value[layer])


def gpt2_init_(model, seed):
    """GPT-2 init, as train_gpt's: weights N(0, 0.02), the residual projections (attproj, fcproj)
    N(0, 0.02/√(2L)), biases 0, LayerNorm weights 1. Drawn from `seed` on the model's device (the same
    seed gives other values on the CPU than on a GPU)."""
    residual_std = 0.02 / math.sqrt(2 * model.cfg.num_layers)
    gen = torch.Generator(device=model.wte.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, params in _model_params(model):
            for p in params:
                if name in ("ln1w", "ln2w", "lnfw"):
                    p.fill_(1.0)
                elif name.endswith("b"):
                    p.zero_()
                else:
                    p.normal_(0.0, residual_std if name in ("attprojw", "fcprojw") else 0.02, generator=gen)


def make_adamw(model, lr, weight_decay, fused=False):
    """AdamW as train_gpt's: β 0.9/0.95, eps 1e-8, decay on the 2-D tensors (wte, wpe, the four matrices
    of each block) and none on biases and LayerNorm."""
    decayed = {id(p) for name, params in _model_params(model) if name in DECAYED for p in params}
    decay = [p for p in model.parameters() if id(p) in decayed]
    no_decay = [p for p in model.parameters() if id(p) not in decayed]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def to_device(array, device):
    """A host batch on the device; pinned and asynchronous on CUDA, as a training loop does it."""
    t = torch.from_numpy(array)
    return t.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else t.to(device)


def train_step(model, optimizer, batches, accum, lr, grad_clip, device, autocast_dtype=None, before_clip=None,
               no_sync=None):
    """One optimizer step as train_gpt's: `accum` micro batches, each loss / accum backpropagated,
    global-norm clipping to grad_clip (0 = off: the norm is still computed), AdamW at `lr`.

    model is the module called for the loss (maybe compiled); optimizer holds the parameters.
    before_clip(): called after the last backward, before clipping (to read the step's raw gradients).
    no_sync(): with DistributedDataParallel, its no_sync context: the micro steps before the last only
    accumulate, the last one's backward all-reduces the gradients (in DDP's buckets, overlapped).
    Returns (mean loss, gradient norm before clipping) as device tensors: no host synchronization.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum = None
    for micro in range(accum):
        inputs, targets = batches.next()
        inputs, targets = to_device(inputs, device), to_device(targets, device)
        sync = no_sync() if no_sync is not None and micro < accum - 1 else contextlib.nullcontext()
        with sync:
            with torch.autocast(torch.device(device).type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = model(inputs, targets)
            (loss / accum).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    if before_clip is not None:
        before_clip()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss_sum / accum, norm


# ---------------------------------------------------------------------------------------------
# bench: the PyTorch reference, timed (run by scripts/bench_train.py in a process of its own)

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")


def sdpa_context(name):
    """sdpa_kernel forcing one SDPA backend: a shape it cannot run fails instead of falling back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])


# The block linear layers --fp8 converts (the LM head is F.linear on wte: there is no nn.Linear to convert)
FLOAT8_LINEARS = ("qkv", "attproj", "fc", "fcproj")
TORCHAO_HINT = "pip install torchao (0.10 or newer, the release built for this torch version)"


class MissingDependency(RuntimeError):
    """A package an option needs is not installed; the message says how to install it."""


def float8_api():
    """(Float8LinearConfig, convert_to_float8_training) of torchao, or MissingDependency saying how to get it."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:
        raise MissingDependency(f"--fp8 needs torchao's float8 training, which does not import here ({err}); "
                                f"install it with: {TORCHAO_HINT}") from err
    return Float8LinearConfig, convert_to_float8_training


def float8_filter(module, fqn):
    """Whether convert_to_float8_training swaps this module: the four linear layers of a block
    (blocks.<i>.qkv/attproj/fc/fcproj), when both their dimensions are multiples of 16 (the FP8 GEMMs'
    requirement; torchao would fail on the others)."""
    parts = fqn.split(".")
    return (isinstance(module, nn.Linear) and len(parts) == 3 and parts[0] == "blocks"
            and parts[2] in FLOAT8_LINEARS and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert_to_float8_(model, emulate=False):
    """Swaps the blocks' linear layers (float8_filter) for torchao's Float8Linear, tensorwise recipe (the
    default config where from_recipe_name is missing or does not know the name: the same recipe, dynamic
    per-tensor scales). The parameters stay the same tensors. emulate: float8 casts without FP8 GEMMs
    (CPU, to test the script). Returns the names of the swapped layers."""
    Float8LinearConfig, convert = float8_api()
    try:
        config = Float8LinearConfig.from_recipe_name("tensorwise")
    except (AttributeError, AssertionError, ValueError):  # a torchao before the recipe names
        config = Float8LinearConfig()
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    swapped = [name for name, module in model.named_modules() if float8_filter(module, name)]
    convert(model, module_filter_fn=float8_filter, config=config)
    return swapped


def distributed_setup(device):
    """Under torchrun (WORLD_SIZE > 1): joins the process group (NCCL on GPUs, gloo on the CPU) and returns
    (rank, world, device), the device cuda:LOCAL_RANK on GPUs; else (0, 1, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, device
    import torch.distributed as dist
    cuda = torch.device(device).type == "cuda"
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def wrap_data_parallel(model, world, device):
    """DistributedDataParallel around the model when world > 1 (gradients all-reduced in buckets during
    the last micro step's backward), else None."""
    if world <= 1:
        return None
    from torch.nn.parallel import DistributedDataParallel
    cuda = torch.device(device).type == "cuda"
    return DistributedDataParallel(model, device_ids=[torch.device(device).index] if cuda else None)


def global_mean(value, world):
    """The mean over the ranks of a device scalar (itself on one process)."""
    if world <= 1:
        return value
    import torch.distributed as dist
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / world


def bench(args):
    """Trains `args.steps` optimizer steps and returns the result record (see the module doc); under
    torchrun, data parallel over the ranks (DistributedDataParallel; the record is rank 0's)."""
    if args.fp8:
        float8_api()  # before building anything: a missing torchao fails at once, with how to install it
    rank, world, device = distributed_setup(args.device)
    cfg = gpt_config(args.model, args.layers, args.hidden, args.heads, args.seq_len, args.kv_heads)
    tokens_per_micro = args.batch_size * args.seq_len * world
    total = args.total_batch_tokens or tokens_per_micro
    if total % tokens_per_micro:
        raise ValueError(f"--total-batch-tokens {total} is not a multiple of batch-size * seq-len * ranks = "
                         f"{tokens_per_micro}")
    accum = total // tokens_per_micro
    log = print if rank == 0 else (lambda *a, **k: None)
    result = {"status": "running", "model": args.model, "params": num_params(cfg), "seqlen": args.seq_len,
              "micro_batch": args.batch_size, "grad_accum": accum, "total_batch_tokens": total, "world": world,
              "sdpa": args.sdpa, "compile": args.compile, "checkpoint_blocks": args.checkpoint_blocks,
              "torch": torch.__version__, "step_ms": [], "losses": []}
    if args.fp8:
        import torchao
        result.update(fp8="torchao float8 tensorwise", torchao=getattr(torchao, "__version__", "unknown"))
    if torch.device(device).type == "cuda":
        result["device"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls (none under autocast) as PyTorch users run them
        torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__}, {result.get('device', device)}: {args.model} L{cfg.num_layers} "
          f"C{cfg.channels} NH{cfg.num_heads} NKV{cfg.num_kv_heads} ({num_params(cfg)} params), "
          f"B {args.batch_size} x T {args.seq_len}{f' x {world} ranks (DDP)' if world > 1 else ''}, "
          f"{accum} micro steps per step, SDPA {args.sdpa}, compile {args.compile}"
          f"{', checkpointing every block' if args.checkpoint_blocks else ''}"
          f"{', torchao float8 (tensorwise) ' + result['torchao'] if args.fp8 else ''}", flush=True)

    with torch.device(device):  # built on the device: no slow CPU init of billions of parameters
        model = GPT(cfg)
    gpt2_init_(model, args.seed)
    model.checkpoint_blocks = args.checkpoint_blocks
    if args.fp8:  # before torch.compile, which then fuses the float8 casts and scales
        swapped = convert_to_float8_(model, emulate=torch.device(device).type != "cuda")
        result["fp8_linears"] = len(swapped)
        log(f"float8: {len(swapped)} of {4 * cfg.num_layers} block linear layers swapped"
              + ("" if len(swapped) == 4 * cfg.num_layers else " (the rest have a dimension not a multiple of 16)"),
              flush=True)
    optimizer = make_adamw(model, args.lr, args.weight_decay, fused=torch.device(device).type == "cuda")
    ddp = wrap_data_parallel(model, world, device)
    if args.compile == "model":
        runner = torch.compile(ddp or model, dynamic=False)
    else:
        runner = ddp or model
        if args.compile == "blocks":  # regional compilation: one compiled block reused by every layer
            for block in model.blocks:
                block.compile(dynamic=False)
    batches = Batches(args.train_data, args.batch_size, args.seq_len, rank=rank, world=world)
    autocast = None if args.dtype == "fp32" else torch.bfloat16
    with sdpa_context(args.sdpa):
        for step in range(1, args.steps + 1):
            lr = learning_rate(step, args.steps, args.lr, args.warmup_steps, args.min_lr_fraction)
            start = time.perf_counter()
            loss, norm = train_step(runner, optimizer, batches, accum, lr, args.grad_clip, device, autocast,
                                    no_sync=ddp.no_sync if ddp is not None else None)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            loss, norm = float(global_mean(loss, world)), float(norm)  # after the timing: the log's all-reduce
            result["step_ms"].append(ms)
            result["losses"].append(loss)
            seconds = ms / 1e3
            tflops = flops_per_sequence(cfg, args.seq_len) * (total / args.seq_len) / world / seconds / 1e12  # per GPU
            log(f"step {step:5d}/{args.steps} | loss {loss:.4f} | lr {lr:.2e} | norm {norm:.3f} | {ms:.1f} ms | "
                f"{total / seconds:.0f} tok/s | {tflops:.1f} TFLOP/s", flush=True)
    if torch.device(device).type == "cuda":
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    result["status"] = "ok"
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()
    return result


def is_oom(err):
    """True for a CUDA out-of-memory error, also when torch.compile wraps it in its own exception."""
    while err is not None:
        if (torch is not None and isinstance(err, torch.cuda.OutOfMemoryError)) or "out of memory" in str(err).lower():
            return True
        err = err.__cause__ or err.__context__
    return False


def main(argv=None):
    parser = argparse.ArgumentParser(description="The PyTorch reference GPT (see the module doc).",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time optimizer steps of the PyTorch reference")
    b.add_argument("--model", default="gpt2-124m", choices=sorted(NAMED_SHAPES))
    b.add_argument("--layers", type=int, default=0, help="override the number of layers (0 = the model's)")
    b.add_argument("--hidden", type=int, default=0, help="override the hidden size (0 = the model's)")
    b.add_argument("--heads", type=int, default=0, help="override the number of heads (0 = the model's)")
    b.add_argument("--kv-heads", type=int, default=0,
                   help="key/value heads (grouped-query attention; 0 = the number of heads)")
    b.add_argument("--batch-size", type=int, default=4, help="micro batch, sequences (default 4)")
    b.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (default 1024)")
    b.add_argument("--total-batch-tokens", type=int, default=0,
                   help="tokens per optimizer step, a multiple of B*T (default B*T: no accumulation)")
    b.add_argument("--steps", type=int, default=6, help="optimizer steps (default 6)")
    b.add_argument("--train-data", default="data/tinyshakespeare/tinyshakespeare_train_*.bin",
                   help="token shards, a path or a glob")
    b.add_argument("--lr", type=float, default=3e-4)
    b.add_argument("--warmup-steps", type=int, default=0, help="learning-rate warmup steps (default 0)")
    b.add_argument("--min-lr-fraction", type=float, default=0.1)
    b.add_argument("--weight-decay", type=float, default=0.1)
    b.add_argument("--grad-clip", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=1337, help="seed of the GPT-2 init (default 1337)")
    b.add_argument("--sdpa", default="flash", choices=SDPA_BACKENDS, help="SDPA backend, forced (default flash)")
    b.add_argument("--compile", default="model", choices=("model", "blocks", "none"),
                   help="torch.compile the whole model (default), each block, or nothing")
    b.add_argument("--checkpoint-blocks", action="store_true",
                   help="activation checkpointing per block (torch.utils.checkpoint, non-reentrant): keep each "
                        "block's input and recompute the block in the backward")
    b.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"),
                   help="bf16: fp32 parameters under bf16 autocast (default); fp32: no autocast")
    b.add_argument("--fp8", action="store_true",
                   help="torchao float8 training (tensorwise recipe) of the blocks' linear layers, under the bf16 "
                        f"autocast (needs torchao: {TORCHAO_HINT})")
    b.add_argument("--device", default="cuda", help="torch device (default cuda; cpu only to test the script)")
    b.add_argument("--result-json", help="write the result record here (also when the run fails)")
    args = parser.parse_args(argv)
    require_torch()
    if args.fp8 and args.dtype != "bf16":
        parser.error("--fp8 runs under the bf16 autocast: use it with --dtype bf16")

    try:
        result, code = bench(args), 0
    except Exception as err:  # noqa: BLE001 - every failure becomes a result record for the caller
        oom = is_oom(err)
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        result = {"status": "oom" if oom else "error", "model": args.model, "seqlen": args.seq_len,
                  "micro_batch": args.batch_size, "message": f"{type(err).__name__}: {first_line}"[:500]}
        if torch is not None and torch.cuda.is_available():
            result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        if not isinstance(err, MissingDependency):  # its message says all; a traceback would bury it
            traceback.print_exc()
        print(f"torch_gpt.py: {'out of GPU memory' if oom else 'error'}: {result['message']}", file=sys.stderr)
        code = 3 if oom else 1
    if args.result_json and int(os.environ.get("RANK", "0")) == 0:  # under torchrun: rank 0's record
        with open(args.result_json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
