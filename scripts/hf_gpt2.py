"""hf_gpt2.py: what scripts/export_hf.py and scripts/import_hf.py share (numpy only; no PyTorch).

Our weights and Hugging Face's GPT-2
  train_gpt's model is GPT-2's architecture, so `transformers.GPT2LMHeadModel` holds it exactly. The
  16 tensors of data/gpt_config.h map to GPT-2's names as below (l = layer; per-layer tensors of ours
  are stacked over L). Our linear weights are (out, in), row-major (nn.Linear); GPT-2's are Conv1D,
  (in, out): each of the four matrices is transposed. Our qkv output is (3, NH, HD), q then k then v,
  which is the order GPT-2 splits c_attn's output in.
      wte (Vp, C)            transformer.wte.weight (V, C)         the first V rows; the LM head is tied
      wpe (maxT, C)          transformer.wpe.weight (maxT, C)
      ln1w, ln1b (L, C)      transformer.h.l.ln_1.weight, .bias (C)
      qkvw (L, 3C, C)        transformer.h.l.attn.c_attn.weight (C, 3C)     transposed
      qkvb (L, 3C)           transformer.h.l.attn.c_attn.bias (3C)
      attprojw (L, C, C)     transformer.h.l.attn.c_proj.weight (C, C)      transposed
      attprojb (L, C)        transformer.h.l.attn.c_proj.bias (C)
      ln2w, ln2b (L, C)      transformer.h.l.ln_2.weight, .bias (C)
      fcw (L, 4C, C)         transformer.h.l.mlp.c_fc.weight (C, 4C)        transposed
      fcb (L, 4C)            transformer.h.l.mlp.c_fc.bias (4C)
      fcprojw (L, C, 4C)     transformer.h.l.mlp.c_proj.weight (4C, C)      transposed
      fcprojb (L, C)         transformer.h.l.mlp.c_proj.bias (C)
      lnfw, lnfb (C)         transformer.ln_f.weight, .bias (C)
  The config: GELU tanh ("gelu_new"), LayerNorm eps 1e-5, MLP 4C (n_inner None), biases, tied LM head,
  attention scaled by 1/sqrt(HD) and nothing else; no dropout (train_gpt trains without it).

Our files (read here without PyTorch; tensors are memory-mapped, not loaded whole)
  llm.c model file (data/model_file.h): 256 int32 (magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V,
    L, NH, C, Vp, the rest zero), then the 16 tensors.
  checkpoint (data/checkpoint.h): a 1024-byte header (CHECKPOINT_STRUCT_FORMAT), then the bf16 weights
    (the ones train_gpt computes with), then the fp32 master weights, AdamW m and v, then an optional
    section of FP8 scales (header field fp8_state_bytes, 0: none; a --precision fp8 run's, not read here).
    ZeRO-1 runs save one file per rank holding all bf16 weights but only the rank's shard of the master
    weights. The header's payload checksum is not verified here (train_gpt does it on --resume); the file
    size is.
  Values keep their bits: bf16 as uint16 bit patterns, fp32 as float32; conversion between the two
  happens only when asked (fp32 -> bf16 rounds to nearest even, as train_gpt does; bf16 -> fp32 is exact).

safetensors
  The format is an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
  "data_offsets": [begin, end]}, "__metadata__": {...}}), then the tensors' bytes. It is written and read
  here directly: safetensors' numpy API has no bf16 type (numpy has none), and its lower-level API
  differs between versions. test/test_hf_export.py checks the files with the safetensors package.
"""
import dataclasses
import json
import os
import struct
import tempfile

import numpy as np

# ---------------------------------------------------------------------------------------------
# The model's shapes (data/gpt_config.h). scripts/torch_gpt.py has the same definitions, but it imports
# PyTorch when that is installed, seconds per call on a GPU machine; test/test_hf_export.py checks that the
# two agree.

VOCAB_SIZE = 50257
VOCAB_PAD_MULTIPLE = 128
MODEL_MAGIC = 20240326
MODEL_VERSION_FP32, MODEL_VERSION_BF16 = 3, 5
MODEL_HEADER_INTS = 256
PARAM_NAMES = ("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb")
NAMED_SHAPES = {  # name: (layers, hidden, heads), as NAMED_GPT_SHAPES in data/gpt_config.h
    "gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16), "gpt2-774m": (36, 1280, 20),
    "gpt2-1558m": (48, 1600, 25), "gpt3-1.3b": (24, 2048, 16), "gpt3-2.7b": (32, 2560, 32),
    "gpt3-2.7b-d128": (32, 2560, 20),
}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    num_layers: int          # L
    channels: int            # C
    num_heads: int           # NH; head dim = C / NH
    max_seq_len: int         # maxT, rows of wpe
    vocab_size: int = VOCAB_SIZE
    padded_vocab_size: int = (VOCAB_SIZE + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE
    num_kv_heads: int = 0    # key/value heads: always NH here (GPT-2 has no grouped-query attention); 0 given: NH

    def __post_init__(self):
        if not self.num_kv_heads:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"{self.num_kv_heads} key/value heads for {self.num_heads} heads: the GPT-2 format has "
                             "one key/value head per head (no grouped-query attention)")


def param_shapes(cfg):
    """[(name, shape)] of the 16 tensors in gpt_config.h's order; linear weights are (out, in)."""
    L, C, Vp, maxT = cfg.num_layers, cfg.channels, cfg.padded_vocab_size, cfg.max_seq_len
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def fp32_to_bf16_bits(x):
    """fp32 values -> bf16 bit patterns (uint16), rounded to nearest even, as train_gpt rounds."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def bf16_bits_to_fp32(bits):
    """bf16 bit patterns (uint16) -> fp32 values (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


LAYERNORM_EPS = 1e-5
EOT_TOKEN = 50256
SUPPORTED_HEAD_DIMS = (64, 80, 96, 128)  # data/gpt_config.h: what train_gpt's attention kernels are built for
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # transformers' names of GELU's tanh approximation

CHECKPOINT_MAGIC = b"GPTCKPT\0"
CHECKPOINT_VERSION = 1
CHECKPOINT_HEADER_BYTES = 1024
CHECKPOINT_STRUCT_FORMAT = "<8sii6i4iqQqiiqqqqqqddddqQiiqqiiii"  # data/checkpoint.h's CheckpointHeader
CHECKPOINT_FIELDS = ("magic", "version", "header_bytes", "num_layers", "channels", "num_heads", "vocab_size",
                     "padded_vocab_size", "max_seq_len", "batch_size", "seq_len", "world_size", "shuffle",
                     "total_batch_tokens", "seed", "train_tokens", "train_shards", "attention_backend", "step",
                     "data_epoch", "data_shard_index", "data_chunk_index", "max_steps", "warmup_steps", "lr",
                     "min_lr_fraction", "weight_decay", "grad_clip", "num_params", "payload_checksum",
                     "zero_stage", "rank", "shard_offset", "shard_size", "num_kv_heads", "fp8_state_bytes",
                     "context_parallel", "unused")
CHECKPOINT_KNOWN_BYTES = struct.calcsize(CHECKPOINT_STRUCT_FORMAT)  # 224; the rest of the header is zero
CHECKPOINT_KV_HEADS_BYTE = 208  # num_kv_heads: 0 (older files) or num_heads for a multi-head model
CHECKPOINT_MAX_FP8_STATE_BYTES = 64 << 20  # data/checkpoint.h: the largest FP8-scales section a header may claim

DTYPES = ("fp32", "bf16")
SAFETENSORS_CODES = {"fp32": "F32", "bf16": "BF16"}
SAFETENSORS_READ = {"F32": ("<f4", "fp32"), "BF16": ("<u2", "bf16"), "F16": ("<f2", "fp16")}

UPDATE_HINT = "a newer train_gpt wrote it; update scripts/hf_gpt2.py for the new format"


class FormatError(ValueError):
    """A file or folder that cannot be converted; the message names it, the problem and what to do."""


@dataclasses.dataclass
class Weights:
    """The 16 tensors of data/gpt_config.h in their shapes: float32 arrays (dtype "fp32") or bf16 bit
    patterns as uint16 arrays (dtype "bf16"); possibly read-only memory maps."""
    cfg: GPTConfig
    dtype: str
    tensors: list
    source: str  # what they were read from, for messages


def convert(array, src, dst):
    """float32 <-> bf16 bits (uint16); fp32 -> bf16 rounds to nearest even, bf16 -> fp32 is exact."""
    if src == dst:
        return np.asarray(array)
    if (src, dst) == ("fp32", "bf16"):
        return fp32_to_bf16_bits(array).reshape(np.shape(array))
    if (src, dst) == ("bf16", "fp32"):
        return bf16_bits_to_fp32(array).reshape(np.shape(array))
    raise ValueError(f"cannot convert {src} to {dst}")


def nonfinite_count(array, dtype):
    """How many values of a float array (fp32, fp16) or of bf16 bits are inf or NaN."""
    a = np.asarray(array)
    if dtype == "bf16":
        return int(np.count_nonzero((a & 0x7F80) == 0x7F80))
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def check_finite(weights):
    for name, t in zip(PARAM_NAMES, weights.tensors):
        bad = nonfinite_count(t, weights.dtype)
        if bad:
            raise FormatError(f"{weights.source}: tensor {name} holds {bad} non-finite value(s) (inf or NaN); "
                              "export an earlier checkpoint")


def refuse_grouped_query(path, where, kv_heads, heads):
    """Refuses a model with grouped-query attention: kv_heads (0 = heads, as older files) other than heads."""
    if kv_heads in (0, heads):
        return
    raise FormatError(f"{path}: {where} is {kv_heads}: the model has {kv_heads} key/value heads for {heads} heads "
                      "(grouped-query attention), but the Hugging Face GPT-2 format (GPT2LMHeadModel) has one "
                      "key/value head per head and cannot hold it; only models trained with --kv-heads equal to "
                      "--heads (the default) can be exported")


def describe(cfg):
    return (f"L{cfg.num_layers} C{cfg.channels} NH{cfg.num_heads} (head dim {cfg.channels // cfg.num_heads}), "
            f"vocab {cfg.vocab_size} (padded {cfg.padded_vocab_size}), {cfg.max_seq_len} positions")


def check_shape(cfg, where):
    """The checks any of our files must pass to be a GPT-2."""
    if min(cfg.num_layers, cfg.channels, cfg.num_heads, cfg.max_seq_len, cfg.vocab_size) < 1:
        raise FormatError(f"{where}: corrupt header (a size below 1): {cfg}")
    if cfg.channels % cfg.num_heads:
        raise FormatError(f"{where}: hidden size {cfg.channels} is not a multiple of {cfg.num_heads} heads; "
                          "GPT-2 cannot express this model")
    if cfg.padded_vocab_size < cfg.vocab_size:
        raise FormatError(f"{where}: padded vocab {cfg.padded_vocab_size} is smaller than vocab {cfg.vocab_size}: "
                          "corrupt header")


# ---------------------------------------------------------------------------------------------
# Our files

def _file_size(path, what):
    if not os.path.exists(path):
        raise FormatError(f"{path}: no such file; give the path of {what}")
    if os.path.isdir(path):
        raise FormatError(f"{path}: is a folder; give the path of {what}")
    return os.path.getsize(path)


def _split_tensors(path, cfg, dtype, offset):
    """The 16 tensors stored back to back from byte `offset` of path, memory-mapped."""
    item = "<f4" if dtype == "fp32" else "<u2"
    tensors = []
    for _, shape in param_shapes(cfg):
        n = int(np.prod(shape))
        tensors.append(np.memmap(path, dtype=item, mode="r", offset=offset, shape=shape))
        offset += n * np.dtype(item).itemsize
    return tensors


def read_model_file(path):
    """An llm.c model file (data/model_file.h) -> Weights in the file's dtype."""
    size = _file_size(path, "an llm.c model file")
    if size < 4 * MODEL_HEADER_INTS:
        raise FormatError(f"{path}: {size} bytes, shorter than the model file's 1024-byte header")
    h = np.fromfile(path, dtype="<i4", count=MODEL_HEADER_INTS)
    if h[0] != MODEL_MAGIC:
        raise FormatError(f"{path}: magic {h[0]}, not {MODEL_MAGIC}: not an llm.c model file")
    versions = {MODEL_VERSION_FP32: "fp32", MODEL_VERSION_BF16: "bf16"}
    if int(h[1]) not in versions:
        raise FormatError(f"{path}: version {h[1]}; this script reads {MODEL_VERSION_FP32} (fp32) and "
                          f"{MODEL_VERSION_BF16} (bf16): {UPDATE_HINT}")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    cfg = GPTConfig(L, C, NH, maxT, V, Vp)
    refuse_grouped_query(path, "header int 8", int(h[8]), NH)
    extra = np.flatnonzero(h[9:])
    if extra.size:
        # llm.c's header has 8 fields and ours one more (key/value heads); a later one describes a model
        # this script cannot map without knowing it.
        first = 9 + int(extra[0])
        raise FormatError(f"{path}: header int {first} is {h[first]}, but the header has only 9 fields (the rest "
                          f"zero): {UPDATE_HINT}")
    check_shape(cfg, path)
    dtype = versions[int(h[1])]
    want = 4 * MODEL_HEADER_INTS + (4 if dtype == "fp32" else 2) * sum(int(np.prod(s)) for _, s in param_shapes(cfg))
    if size != want:
        raise FormatError(f"{path}: {size} bytes, but its header ({dtype}, {describe(cfg)}) needs {want}: "
                          "truncated or corrupt")
    return Weights(cfg, dtype, _split_tensors(path, cfg, dtype, 4 * MODEL_HEADER_INTS), path)


def write_model_file(path, weights):
    """Writes Weights as an llm.c model file of weights.dtype (version 3 or 5); temporary name, then renamed."""
    cfg = weights.cfg
    header = np.zeros(MODEL_HEADER_INTS, dtype="<i4")
    header[:8] = (MODEL_MAGIC, MODEL_VERSION_FP32 if weights.dtype == "fp32" else MODEL_VERSION_BF16,
                  cfg.max_seq_len, cfg.vocab_size, cfg.num_layers, cfg.num_heads, cfg.channels, cfg.padded_vocab_size)
    item = "<f4" if weights.dtype == "fp32" else "<u2"

    def write(f):
        f.write(header.tobytes())
        for (name, shape), t in zip(param_shapes(cfg), weights.tensors):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, the config needs {shape} (a bug)")
            f.write(np.ascontiguousarray(t, dtype=item).tobytes())
    atomic_write(path, write)


def read_checkpoint_header(path):
    """The header of a train_gpt checkpoint as a dict (CHECKPOINT_FIELDS), after checking it."""
    size = _file_size(path, "a train_gpt checkpoint")
    with open(path, "rb") as f:
        block = f.read(CHECKPOINT_HEADER_BYTES)
    if len(block) < CHECKPOINT_HEADER_BYTES or block[:8] != CHECKPOINT_MAGIC:
        raise FormatError(f"{path}: not a train_gpt checkpoint (bad magic or shorter than the 1024-byte header)")
    h = dict(zip(CHECKPOINT_FIELDS, struct.unpack_from(CHECKPOINT_STRUCT_FORMAT, block)))
    if h["version"] != CHECKPOINT_VERSION or h["header_bytes"] != CHECKPOINT_HEADER_BYTES:
        raise FormatError(f"{path}: checkpoint format version {h['version']} (header {h['header_bytes']} bytes); "
                          f"this script reads version {CHECKPOINT_VERSION}: {UPDATE_HINT}")
    extra = [i for i, b in enumerate(block[CHECKPOINT_KNOWN_BYTES:]) if b]
    if extra:
        raise FormatError(f"{path}: header byte {CHECKPOINT_KNOWN_BYTES + extra[0]} is set, past the fields this "
                          f"script knows (bytes 0-{CHECKPOINT_KNOWN_BYTES - 1}): {UPDATE_HINT}")
    refuse_grouped_query(path, f"header byte {CHECKPOINT_KV_HEADS_BYTE} (num_kv_heads)", h["num_kv_heads"],
                         h["num_heads"])
    cfg = GPTConfig(h["num_layers"], h["channels"], h["num_heads"], h["max_seq_len"], h["vocab_size"],
                    h["padded_vocab_size"])
    check_shape(cfg, path)
    P = sum(int(np.prod(s)) for _, s in param_shapes(cfg))
    if h["num_params"] != P:
        raise FormatError(f"{path}: the header says {h['num_params']} parameters, its model ({describe(cfg)}) "
                          f"has {P}: corrupt header")
    if h["zero_stage"] not in (0, 1):
        raise FormatError(f"{path}: ZeRO stage {h['zero_stage']}; this script reads 0 and 1: {UPDATE_HINT}")
    state = h["shard_size"] if h["zero_stage"] else P
    if h["zero_stage"] and not (0 <= h["rank"] < h["world_size"] and h["shard_size"] > 0 and
                                h["shard_offset"] == h["rank"] * h["shard_size"] and
                                h["shard_size"] * h["world_size"] >= P):
        raise FormatError(f"{path}: corrupt header (ZeRO-1 rank {h['rank']} of {h['world_size']}, shard "
                          f"{h['shard_offset']} + {h['shard_size']})")
    fp8 = h["fp8_state_bytes"]  # the FP8-scales section after the four arrays (0: none)
    if not 0 <= fp8 <= CHECKPOINT_MAX_FP8_STATE_BYTES:
        raise FormatError(f"{path}: corrupt header (fp8_state_bytes {fp8}: an FP8-scales section must be 0 to "
                          f"{CHECKPOINT_MAX_FP8_STATE_BYTES} bytes)")
    want = CHECKPOINT_HEADER_BYTES + 2 * P + 12 * state + fp8
    if size != want:
        section = f" (the payload and a {fp8}-byte FP8-scales section)" if fp8 else ""
        raise FormatError(f"{path}: {size} bytes, but its header says {want}{section}: truncated or corrupt")
    h["cfg"] = cfg
    return h


def rank_file(path, rank, world):
    """The file of `rank` of the sharded step that `path` (any rank's file) belongs to."""
    folder, base = os.path.split(path)
    step = base.split(".")[0]  # step_XXXXXXXX
    return os.path.join(folder, f"{step}.rank{rank:02d}of{world:02d}.ckpt")


def read_checkpoint(path, dtype):
    """A checkpoint -> Weights. dtype "bf16": the bf16 weights train_gpt computes with; "fp32": the fp32
    master weights (of a ZeRO-1 step: gathered from every rank's file, which must all be there)."""
    h = read_checkpoint_header(path)
    cfg = h["cfg"]
    if dtype == "bf16":
        return Weights(cfg, "bf16", _split_tensors(path, cfg, "bf16", CHECKPOINT_HEADER_BYTES), path)
    P = h["num_params"]
    if not h["zero_stage"]:
        master = np.memmap(path, dtype="<f4", mode="r", offset=CHECKPOINT_HEADER_BYTES + 2 * P, shape=(P,))
    else:
        parts = []
        for r in range(h["world_size"]):
            other = rank_file(path, r, h["world_size"])
            if not os.path.exists(other):
                raise FormatError(f"{path}: a ZeRO-1 checkpoint of {h['world_size']} GPUs keeps the fp32 master "
                                  f"weights split over its files, and {other} is missing; copy every rank's file "
                                  "next to it, or export the bf16 weights (--dtype bf16), which every file holds")
            o = read_checkpoint_header(other)
            if (o["step"], o["rank"], o["world_size"], o["shard_size"], o["num_params"]) != \
                    (h["step"], r, h["world_size"], h["shard_size"], P):
                raise FormatError(f"{other}: not rank {r} of the step-{h['step']} checkpoint {path} belongs to")
            parts.append(np.memmap(other, dtype="<f4", mode="r", offset=CHECKPOINT_HEADER_BYTES + 2 * P,
                                   shape=(h["shard_size"],)))
        master = np.concatenate(parts)[:P]
    tensors, at = [], 0
    for _, shape in param_shapes(cfg):
        n = int(np.prod(shape))
        tensors.append(master[at:at + n].reshape(shape))
        at += n
    what = "master weights" + (f" of {h['world_size']} rank files" if h["zero_stage"] else "")
    return Weights(cfg, "fp32", tensors, f"{path} ({what})")


def newest_checkpoint(folder):
    """The newest complete step's file in a checkpoint folder (rank 0's for a ZeRO-1 step), as --resume DIR."""
    steps = {}
    for name in os.listdir(folder):
        parts = name.split(".")
        if not (name.startswith("step_") and name.endswith(".ckpt") and parts[0][5:].isdigit()):
            continue
        step = int(parts[0][5:])
        if len(parts) == 2:
            steps[step] = os.path.join(folder, name)
        elif len(parts) == 3 and parts[1].startswith("rank") and "of" in parts[1]:
            r, w = parts[1][4:].split("of", 1)
            if r.isdigit() and w.isdigit() and int(r) == 0 and \
                    all(os.path.exists(rank_file(os.path.join(folder, name), k, int(w))) for k in range(int(w))):
                steps.setdefault(step, os.path.join(folder, name))
    if not steps:
        raise FormatError(f"{folder}: no step_*.ckpt checkpoint in this folder; give a checkpoint file, a folder "
                          "of them (--checkpoint-dir) or an llm.c model file")
    return steps[max(steps)]


def read_source(path, dtype):
    """Weights from a checkpoint (file or folder: its newest step) or an llm.c model file, in `dtype`:
    a checkpoint gives its bf16 weights for bf16 and its fp32 master weights for fp32; a model file's
    values are converted when its dtype differs."""
    if os.path.isdir(path):
        path = newest_checkpoint(path)
    _file_size(path, "a train_gpt checkpoint or an llm.c model file")
    with open(path, "rb") as f:
        head = f.read(8)
    if head == CHECKPOINT_MAGIC:
        return read_checkpoint(path, dtype)
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] == MODEL_MAGIC:
        w = read_model_file(path)
        check_finite(w)  # before rounding: rounding could hide a NaN
        if w.dtype != dtype:
            w = Weights(w.cfg, dtype, [convert(t, w.dtype, dtype) for t in w.tensors], f"{path} ({w.dtype})")
        return w
    raise FormatError(f"{path}: neither a train_gpt checkpoint (magic GPTCKPT) nor an llm.c model file "
                      f"(magic {MODEL_MAGIC})")


def atomic_write(path, write):
    """Calls write(file) on a temporary file next to path, then renames it to path."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# Hugging Face's GPT-2: names, layouts, config

# (ours, GPT-2's name within block l, transposed) for the per-layer tensors
LAYER_MAP = (("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
             ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
             ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
             ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
             ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
             ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False))
PREFIX = "transformer."  # GPT2LMHeadModel's names (GPT2Model's, as in the hub's gpt2, have none)


def hf_tensor_plan(weights):
    """[(GPT-2 name, our tensor index, layer or None, transposed)] in the order the export writes them."""
    index = {name: i for i, name in enumerate(PARAM_NAMES)}
    plan = [("wte.weight", index["wte"], None, False), ("wpe.weight", index["wpe"], None, False)]
    for layer in range(weights.cfg.num_layers):
        plan += [(f"h.{layer}.{hf}", index[ours], layer, t) for ours, hf, t in LAYER_MAP]
    plan += [("ln_f.weight", index["lnfw"], None, False), ("ln_f.bias", index["lnfb"], None, False)]
    return [(PREFIX + name, i, layer, t) for name, i, layer, t in plan]


def hf_tensor(weights, i, layer, transposed):
    """One GPT-2 tensor from ours: the layer's slice, transposed where GPT-2 is Conv1D, wte cut to V rows."""
    t = weights.tensors[i]
    if layer is not None:
        t = t[layer]
    if PARAM_NAMES[i] == "wte":
        t = t[:weights.cfg.vocab_size]
    return np.ascontiguousarray(t.T if transposed else t)


def hf_config(cfg, dtype):
    """config.json of GPT2LMHeadModel for cfg."""
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_ctx": cfg.max_seq_len,
        "n_embd": cfg.channels,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYERNORM_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype],
    }
    if cfg.vocab_size > EOT_TOKEN:
        config["bos_token_id"] = config["eos_token_id"] = EOT_TOKEN
    return config


def padded_vocab(vocab_size):
    return (vocab_size + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE


def cfg_from_hf_config(config, where):
    """Our GPTConfig from a GPT-2 config.json, or FormatError naming what train_gpt's model cannot do."""
    def get(key, default=None):
        return config.get(key, default)

    if get("model_type") != "gpt2":
        raise FormatError(f"{where}: model_type {get('model_type')!r}; only GPT-2 models (model_type \"gpt2\") "
                          "have train_gpt's architecture")
    try:
        L, C, NH = int(get("n_layer")), int(get("n_embd")), int(get("n_head"))
        maxT, V = int(get("n_positions")), int(get("vocab_size"))
    except (TypeError, ValueError):
        raise FormatError(f"{where}: n_layer, n_embd, n_head, n_positions and vocab_size must all be integers")
    problems = []
    if min(L, C, NH, maxT, V) < 1 or C % NH:
        problems.append(f"bad shape (n_layer {L}, n_embd {C}, n_head {NH}, n_positions {maxT}, vocab {V})")
    elif C // NH not in SUPPORTED_HEAD_DIMS:
        problems.append(f"head dim {C // NH} (n_embd {C} / n_head {NH}): train_gpt's attention kernels are built "
                        f"for head dims {', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    if V != VOCAB_SIZE:
        problems.append(f"vocab_size {V}: train_gpt trains with GPT-2's {VOCAB_SIZE} tokens")
    if get("n_inner") not in (None, 4 * C):
        problems.append(f"n_inner {get('n_inner')}: train_gpt's MLP is 4 x n_embd = {4 * C}")
    if get("activation_function", "gelu_new") not in TANH_GELUS:
        problems.append(f"activation_function {get('activation_function')!r}: train_gpt uses GELU's tanh "
                        f"approximation ({', '.join(TANH_GELUS)})")
    if abs(float(get("layer_norm_epsilon", LAYERNORM_EPS)) - LAYERNORM_EPS) > 1e-12:
        problems.append(f"layer_norm_epsilon {get('layer_norm_epsilon')}: train_gpt's LayerNorm uses {LAYERNORM_EPS}")
    if not get("scale_attn_weights", True) or get("scale_attn_by_inverse_layer_idx", False):
        problems.append("attention scaling other than 1/sqrt(head dim) (scale_attn_weights false or "
                        "scale_attn_by_inverse_layer_idx true)")
    if get("add_cross_attention", False):
        problems.append("cross-attention layers (add_cross_attention)")
    if problems:
        raise FormatError(f"{where}: train_gpt's model cannot hold this GPT-2: " + "; ".join(problems))
    return GPTConfig(L, C, NH, maxT, V, padded_vocab(V))


# ---------------------------------------------------------------------------------------------
# safetensors

def write_safetensors(path, entries, metadata):
    """entries: [(name, dtype "fp32"/"bf16", shape, make)] where make() returns the array (float32 or bf16
    bits) of that shape; written in order, one array in memory at a time. metadata: {str: str}."""
    header, offset = {}, 0
    for name, dtype, shape, _ in entries:
        nbytes = int(np.prod(shape)) * (4 if dtype == "fp32" else 2)
        header[name] = {"dtype": SAFETENSORS_CODES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned

    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, make in entries:
            a = np.asarray(make())
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, planned {shape} (a bug)")
            f.write(np.ascontiguousarray(a, dtype="<f4" if dtype == "fp32" else "<u2").tobytes())
    atomic_write(path, write)


def read_safetensors(path):
    """{name: (dtype "fp32"/"bf16"/"fp16", array memory-mapped from the file)}; bf16 as uint16 bits."""
    size = _file_size(path, "a .safetensors file")
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 2 <= n <= min(size - 8, 100 << 20):
            raise FormatError(f"{path}: not a safetensors file (header length {n} in a {size}-byte file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise FormatError(f"{path}: not a safetensors file (its header is not JSON: {err})")
    out, data_start = {}, 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        code, shape, (begin, end) = info.get("dtype"), tuple(info.get("shape", ())), info.get("data_offsets", (0, -1))
        if code not in SAFETENSORS_READ:
            raise FormatError(f"{path}: tensor {name} is {code}; this script reads F32, BF16 and F16")
        item, dtype = SAFETENSORS_READ[code]
        if end - begin != int(np.prod(shape)) * np.dtype(item).itemsize or begin < 0 or data_start + end > size:
            raise FormatError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not fit shape {shape} {code} "
                              f"or the file ({size} bytes): truncated or corrupt")
        if begin == end:  # an empty tensor: nothing to map
            out[name] = (dtype, np.zeros(shape, dtype=item))
        else:
            count = int(np.prod(shape))
            out[name] = (dtype, np.memmap(path, dtype=item, mode="r", offset=data_start + begin,
                                          shape=(count,)).reshape(shape))
    return out


def read_hf_folder(folder):
    """(config dict, {name: (dtype, array)}) of a Hugging Face model folder: config.json and
    model.safetensors, or the shards named by model.safetensors.index.json."""
    if not os.path.isdir(folder):
        raise FormatError(f"{folder}: no such folder; give a Hugging Face model folder (config.json + "
                          "model.safetensors), e.g. one written by save_pretrained or export_hf.py")
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(config_path):
        raise FormatError(f"{folder}: no config.json; give a Hugging Face model folder")
    with open(config_path) as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as err:
            raise FormatError(f"{config_path}: not JSON: {err}")
    single, index = os.path.join(folder, "model.safetensors"), os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(single):
        return config, read_safetensors(single)
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f).get("weight_map", {}).values()))
        tensors = {}
        for name in files:
            tensors.update(read_safetensors(os.path.join(folder, name)))
        return config, tensors
    if any(os.path.exists(os.path.join(folder, n)) for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise FormatError(f"{folder}: has only pytorch_model.bin (a pickle, which needs PyTorch); convert it once with "
                          "transformers: GPT2LMHeadModel.from_pretrained(folder).save_pretrained(out, "
                          "safe_serialization=True), and import that folder")
    raise FormatError(f"{folder}: no model.safetensors or model.safetensors.index.json")


# ---------------------------------------------------------------------------------------------
# GPT-2's tokenizer files, made from the BPE ranks tiktoken uses (r50k_base = GPT-2's tokens)

def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters (its vocab.json and merges.txt spell
    tokens with these)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def merge_parts(ranks, token, max_rank):
    """Byte-level BPE of `token` using only merges of rank < max_rank: the parts it ends as."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def gpt2_vocab_and_merges(ranks):
    """vocab {token text: id} and merges [(left text, right text)] in rank order, from {bytes: rank}.

    A token of rank r was made by merging two tokens; BPE restricted to merges below r splits it into
    exactly those two (the way transformers converts tiktoken files). GPT-2's ids are the ranks."""
    chars = bytes_to_unicode()
    spell = lambda b: "".join(chars[x] for x in b)  # noqa: E731
    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[spell(token)] = rank
        if len(token) > 1:
            parts = merge_parts(ranks, token, rank)
            if len(parts) != 2:
                raise FormatError(f"token {rank} ({token!r}) is not one merge of two earlier tokens: the BPE ranks "
                                  "are not GPT-2's")
            merges.append((spell(parts[0]), spell(parts[1])))
    return vocab, merges


def gpt2_ranks():
    """tiktoken's r50k_base ranks ({bytes: id}, 50256 of them) after checking they are GPT-2's."""
    try:
        import tiktoken
    except ImportError:
        raise FormatError("tiktoken is missing; install with `pip install -r scripts/requirements.txt`")
    try:
        enc = tiktoken.get_encoding("r50k_base")
    except Exception as err:  # noqa: BLE001 - offline without a cache: tiktoken's own error is a network one
        raise FormatError(f"cannot load tiktoken's r50k_base ranks ({type(err).__name__}: {err}); offline, set "
                          "TIKTOKEN_CACHE_DIR to a folder holding them (the Makefile does when they are there)")
    ranks = enc._mergeable_ranks  # tiktoken's README uses this attribute to extend encodings
    if len(ranks) != EOT_TOKEN or sorted(ranks.values()) != list(range(EOT_TOKEN)) or \
            enc.eot_token != EOT_TOKEN or enc.n_vocab != VOCAB_SIZE:
        raise FormatError("tiktoken's r50k_base is not GPT-2's 50257-token encoding")
    return ranks


def write_tokenizer_files(folder, model_max_length):
    """vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json of GPT-2's tokenizer
    (GPT2Tokenizer / GPT2TokenizerFast) into folder; returns the names written."""
    vocab, merges = gpt2_vocab_and_merges(gpt2_ranks())
    eot = "<|endoftext|>"
    vocab[eot] = EOT_TOKEN
    special = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length, "add_prefix_space": False,
        "add_bos_token": False, "errors": "replace", "clean_up_tokenization_spaces": False, **special,
        "added_tokens_decoder": {str(EOT_TOKEN): {"content": eot, "lstrip": False, "normalized": True,
                                                  "rstrip": False, "single_word": False, "special": True}},
    }
    files = {
        "vocab.json": json.dumps(vocab, ensure_ascii=False, separators=(",", ":")),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }
    for name, text in files.items():
        atomic_write(os.path.join(folder, name), lambda f, text=text: f.write(text.encode("utf-8")))
    return list(files)
