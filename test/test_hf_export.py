"""test_hf_export.py: scripts/export_hf.py, scripts/import_hf.py and scripts/plot_log.py (run from the repo root).

The scripts run as subprocesses, as a user runs them, on small random models written here. What is checked:
  - export -> import gives back the same file, bit for bit: an fp32 model file through an fp32 export, a bf16
    one through a bf16 export, a checkpoint's bf16 weights (--dtype bf16) and its fp32 master weights
    (--dtype fp32, also gathered from the rank files of a ZeRO-1 step); vocab padding rows are dropped on the
    way out and come back as zeros; fp32 -> bf16 rounds to nearest even (checked against a rounding written
    here);
  - the files themselves, read with the safetensors package (not our reader): names, dtypes, GPT-2's Conv1D
    layout of each matrix against our tensors, no lm_head, "format": "pt" metadata; config.json's fields;
  - what the exported weights compute: a numpy GPT-2 forward written the way transformers' GPT2LMHeadModel
    computes (Conv1D x @ W + b, q/k/v split from c_attn's columns, tied head), run on the exported
    safetensors, against the fp64 C reference model ($BUILD/libcpu_gpt.so) on the original file;
  - import of a folder as others write it (safetensors package, no "transformer." prefix, attention-mask
    buffers, lm_head equal to wte, fp16 values);
  - refusals with their reasons: unknown header fields (a kv-heads field of grouped-query attention), other
    format versions, bad magic, truncation, hidden not a multiple of heads, non-finite weights, a missing
    ZeRO-1 rank file; on import: head dims train_gpt lacks, another activation, an untied head, missing and
    misshapen tensors, pytorch_model.bin-only folders, another vocabulary;
  - the tokenizer files: vocab.json and merges.txt encode text exactly as tiktoken's r50k_base does (a BPE
    written here from GPT-2's published algorithm), offline from the shared data folder's BPE ranks
    (test/harness.py; skipped without them);
  - plot_log.py draws a PNG with something on it from small logs, and fails clearly on bad input;
  - with transformers and PyTorch installed (not in CI: skipped otherwise): GPT2LMHeadModel.from_pretrained
    loads the export and its logits match our PyTorch reference model, and AutoTokenizer loads the tokenizer.
"""
import ctypes
import dataclasses
import functools
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
BUILD = os.environ.get("BUILD", "build")
V, VP = 50257, 50304
MODEL_MAGIC, CKPT_MAGIC = 20240326, b"GPTCKPT\0"
CKPT_FORMAT = "<8sii6i4iqQqiiqqqqqqddddqQiiqq"  # data/checkpoint.h, written out here independently

sys.path.insert(0, SCRIPTS)
WORK = tempfile.TemporaryDirectory(prefix="test_hf_export_")  # removed at exit
RNG = np.random.default_rng()


def need(module):
    """Imports a module of scripts/requirements.txt: a failure under CI (which installs them), a skip elsewhere."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            raise AssertionError(f"{module} is not importable, but scripts/requirements.txt lists it")
        raise harness.Skip(f"{module} is not installed (pip install -r scripts/requirements.txt)")


def need_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as err:
        if os.environ.get("CI"):  # CI installs test/requirements.txt, so a skip there would hide a broken setup
            raise AssertionError(f"{err.name} is not importable, but test/requirements.txt lists it")
        raise harness.Skip(f"needs PyTorch and transformers ({err.name} is not installed; "
                           "pip install -r test/requirements.txt)")
    return torch, transformers


def path(*names):
    return os.path.join(WORK.name, *names)


def run(script, *args):
    """Runs scripts/<script>; returns (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *map(str, args)], capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def run_ok(script, *args):
    rc, out, err = run(script, *args)
    assert rc == 0, f"{script} exit {rc}: {err.strip()[-800:]}"
    return out


def expect_refusal(script, args, *phrases):
    rc, out, err = run(script, *args)
    assert rc == 1, f"{script} {' '.join(map(str, args))}: exit {rc}, expected 1; stderr: {err.strip()[-400:]}"
    assert "Traceback" not in err, f"{script}: a traceback instead of a message: {err.strip()[-600:]}"
    for phrase in phrases:
        assert phrase in err, f"{script}: {phrase!r} not in the message: {err.strip()}"


# ---- our files, written here from the formats' definitions ------------------------------------------

def shapes(L, C, maxT, Vp=VP):
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C), (L, C), (L, C),
            (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def rne_bf16(x):
    """fp32 -> bf16 bits, round to nearest, ties to even: picks the nearer of the two bf16 neighbours."""
    bits = np.asarray(x, dtype="<f4").view("<u4")
    lo = bits & np.uint32(0xFFFF0000)
    hi = lo + np.uint32(0x10000)
    x64 = np.asarray(x, dtype=np.float64)
    d_lo = np.abs(x64 - lo.view("<f4").astype(np.float64))
    d_hi = np.abs(hi.view("<f4").astype(np.float64) - x64)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (((lo >> 16) & 1) == 1))
    return np.where(pick_hi, hi, lo).astype(np.uint32) >> 16


def random_tensors(L, C, maxT, scale=0.5):
    """fp32 tensors with wte's padding rows zero (so that an export -> import round trip is the identity)."""
    out = [(RNG.standard_normal(s) * scale).astype(np.float32) for s in shapes(L, C, maxT)]
    out[0][V:] = 0
    return out


def write_model_file(p, L, C, NH, maxT, tensors, bf16=False, extra_header=None):
    header = np.zeros(256, dtype="<i4")
    header[:8] = (MODEL_MAGIC, 5 if bf16 else 3, maxT, V, L, NH, C, VP)
    for i, value in (extra_header or {}).items():
        header[i] = value
    with open(p, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write((rne_bf16(t).astype("<u2") if bf16 else t.astype("<f4")).tobytes())
    return p


def read_model_tensors(p):
    """(header ints, [16 arrays]: float32 or uint16 bits) of a model file, parsed here."""
    raw = open(p, "rb").read()
    h = np.frombuffer(raw[:1024], dtype="<i4")
    maxT, _, L, _, C, Vp = (int(x) for x in h[2:8])
    dt = "<f4" if h[1] == 3 else "<u2"
    out, at = [], 1024
    for s in shapes(L, C, maxT, Vp):
        n = int(np.prod(s))
        out.append(np.frombuffer(raw, dtype=dt, count=n, offset=at).reshape(s))
        at += n * np.dtype(dt).itemsize
    assert at == len(raw), f"{p}: {len(raw)} bytes, the header needs {at}"
    return h, out


def write_checkpoint(p, L, C, NH, maxT, params_bits, master, zero=None, step=7, header_tail=b"", version=1, fp8=0):
    """A checkpoint as data/checkpoint.h lays it out: header, bf16 params, then master, m, v (fp32);
    zero=(rank, world, shard): a ZeRO-1 rank file holding master[rank*shard:(rank+1)*shard] (zero-padded);
    fp8: bytes of an FP8-scales section after v (header bytes 212-215, fp8_state_bytes; random bytes)."""
    P = int(sum(np.prod(s) for s in shapes(L, C, maxT)))
    stage, rank, world, shard = (1, zero[0], zero[1], zero[2]) if zero else (0, 0, 1, 0)
    fields = [CKPT_MAGIC, version, 1024, L, C, NH, V, VP, maxT, 4, maxT, world, 0, 4 * maxT, 1337, 10**6, 1, 2, step,
              0, 0, 3, 100, 0, 3e-4, 0.1, 0.1, 1.0, P, 0, stage, rank, rank * shard, shard]
    block = struct.pack(CKPT_FORMAT, *fields) + (header_tail or (struct.pack("<ii", 0, fp8) if fp8 else b""))
    block += b"\0" * (1024 - len(block))
    flat = np.concatenate([m.ravel() for m in master]).astype("<f4")
    if zero:
        flat = np.concatenate([flat, np.zeros(world * shard - P, dtype="<f4")])[rank * shard:(rank + 1) * shard]
    with open(p, "wb") as f:
        f.write(block)
        f.write(np.concatenate([b.ravel() for b in params_bits]).astype("<u2").tobytes())
        for scale in (1.0, 1e-3, 1e-6):  # master, adam_m, adam_v
            f.write((flat * np.float32(scale)).astype("<f4").tobytes())
        f.write(RNG.integers(0, 256, fp8, dtype=np.uint8).tobytes())
    return p


def checkpoint_state(L, C, maxT):
    """(bf16 params, fp32 master) that differ, as a run's do (the bf16 weights are not just master rounded);
    wte's padding rows hold values too, as in a run (they are initialized like the rest of wte)."""
    master = random_tensors(L, C, maxT)
    master[0][V:] = RNG.standard_normal(master[0][V:].shape)
    params = [rne_bf16(m + np.float32(1e-2) * RNG.standard_normal(m.shape).astype(np.float32)) for m in master]
    return params, master


def assert_same_weights(back, want, what):
    """back (a model file's tensors) holds want's values, wte's padding rows as zeros."""
    for i, (b, w) in enumerate(zip(back, want)):
        bits = "<u4" if b.dtype.itemsize == 4 else "<u2"  # bits, so that -0.0 != 0.0
        b, w = b.view(bits), np.ascontiguousarray(w).view(bits)
        if i == 0:
            assert not b[V:].any(), "wte's padding rows did not come back as zeros"
            b, w = b[:V], w[:V]
        assert np.array_equal(b, w), f"tensor {i}: not {what}"


# ---- the safetensors files, read with the safetensors package ----------------------------------------

def read_with_safetensors(p):
    """{name: (dtype code, shape, numpy array)} through the safetensors package; BF16 as uint16 bits from
    the raw bytes (numpy has no bf16), plus the metadata."""
    st = need("safetensors")
    with open(p, "rb") as f:
        data = f.read()
    out = {name: (info["dtype"], tuple(info["shape"]),
                  np.frombuffer(bytes(info["data"]), dtype={"F32": "<f4", "BF16": "<u2"}[info["dtype"]])
                  .reshape(info["shape"])) for name, info in st.deserialize(data)}
    with st.safe_open(p, framework="np") as f:
        metadata = f.metadata()
        assert sorted(f.keys()) == sorted(out), "safe_open and deserialize disagree on the names"
        for name in f.keys():
            if out[name][0] == "F32":
                assert np.array_equal(f.get_tensor(name), out[name][2]), name
    return out, metadata


def hf_names(L):
    names = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"]
    for l in range(L):
        names += [f"transformer.h.{l}.{n}" for n in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
            "mlp.c_proj.bias")]
    return names


def test_shapes_agree_with_torch_gpt():
    import hf_gpt2
    import torch_gpt
    for L, C, NH, T in ((12, 768, 12, 1024), (2, 128, 2, 64)):
        assert hf_gpt2.param_shapes(hf_gpt2.GPTConfig(L, C, NH, T)) == \
            torch_gpt.param_shapes(torch_gpt.GPTConfig(L, C, NH, T)), "hf_gpt2.param_shapes differs from torch_gpt's"
    assert hf_gpt2.PARAM_NAMES == torch_gpt.PARAM_NAMES and hf_gpt2.NAMED_SHAPES == torch_gpt.NAMED_SHAPES
    assert dataclasses.astuple(hf_gpt2.GPTConfig(1, 64, 1, 8)) == dataclasses.astuple(torch_gpt.GPTConfig(1, 64, 1, 8))
    x = RNG.standard_normal(10000).astype(np.float32)
    assert np.array_equal(hf_gpt2.fp32_to_bf16_bits(x), torch_gpt.fp32_to_bf16_bits(x))


# ---- round trips --------------------------------------------------------------------------------------

def test_round_trip_fp32_model_file_is_bit_exact():
    L, C, NH, maxT = 2, 128, 2, 64
    src = write_model_file(path("rt32.bin"), L, C, NH, maxT, random_tensors(L, C, maxT))
    run_ok("export_hf.py", src, path("rt32_hf"), "--dtype", "fp32")
    run_ok("import_hf.py", path("rt32_hf"), path("rt32_back.bin"))
    a, b = open(src, "rb").read(), open(path("rt32_back.bin"), "rb").read()
    assert a == b, f"the fp32 round trip changed the file ({len(a)} vs {len(b)} bytes)"


def test_round_trip_bf16_model_file_is_bit_exact():
    L, C, NH, maxT = 2, 128, 2, 64
    src = write_model_file(path("rt16.bin"), L, C, NH, maxT, random_tensors(L, C, maxT), bf16=True)
    run_ok("export_hf.py", src, path("rt16_hf"), "--dtype", "bf16")
    run_ok("import_hf.py", path("rt16_hf"), path("rt16_back.bin"))  # default: the folder's dtype, bf16
    h, _ = read_model_tensors(path("rt16_back.bin"))
    assert h[1] == 5, f"version {h[1]}: a bf16 folder should come back as a bf16 (version 5) file"
    assert open(src, "rb").read() == open(path("rt16_back.bin"), "rb").read(), "the bf16 round trip changed the file"


def test_padding_rows_dropped_and_restored_as_zeros():
    L, C, NH, maxT = 1, 64, 1, 16
    tensors = random_tensors(L, C, maxT)
    tensors[0][V:] = 7.0  # padding rows hold something: it must not leave, and comes back as zeros
    src = write_model_file(path("pad.bin"), L, C, NH, maxT, tensors)
    run_ok("export_hf.py", src, path("pad_hf"), "--dtype", "fp32")
    files, _ = read_with_safetensors(path("pad_hf", "model.safetensors"))
    wte = files["transformer.wte.weight"][2]
    assert wte.shape == (V, C), f"wte exported as {wte.shape}, expected ({V}, {C})"
    assert np.array_equal(wte, tensors[0][:V])
    run_ok("import_hf.py", path("pad_hf"), path("pad_back.bin"))
    h, back = read_model_tensors(path("pad_back.bin"))
    assert h[7] == VP and back[0].shape == (VP, C), f"padded vocab {h[7]}, wte {back[0].shape}"
    assert not back[0][V:].any(), "the padding rows did not come back as zeros"
    assert np.array_equal(back[0][:V], tensors[0][:V])


def test_fp32_to_bf16_export_rounds_to_nearest_even():
    L, C, NH, maxT = 1, 64, 1, 16
    tensors = random_tensors(L, C, maxT)
    # exact ties between two bf16 values, both parities, and values past them
    tensors[14][:8] = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F808001, 0x3F80FFFF, 0x40490FDB,
                                0x00008000, 0x3F7F8000], dtype="<u4").view("<f4")
    src = write_model_file(path("rne.bin"), L, C, NH, maxT, tensors)
    run_ok("export_hf.py", src, path("rne_hf"), "--dtype", "bf16")
    files, _ = read_with_safetensors(path("rne_hf", "model.safetensors"))
    assert files["transformer.ln_f.weight"][0] == "BF16"
    for name, ours in (("transformer.ln_f.weight", tensors[14]), ("transformer.wpe.weight", tensors[1]),
                       ("transformer.h.0.attn.c_attn.weight", tensors[4][0].T)):
        got = files[name][2]
        want = rne_bf16(np.ascontiguousarray(ours)).astype(np.uint16)
        bad = np.flatnonzero(got.ravel() != want.ravel())
        assert bad.size == 0, f"{name}: {bad.size} values not rounded to nearest even, first at {bad[0]}"


def test_checkpoint_exports_bf16_weights_and_fp32_master():
    L, C, NH, maxT = 2, 64, 1, 32
    params, master = checkpoint_state(L, C, maxT)
    folder = path("ckpts")
    os.makedirs(folder)
    write_checkpoint(os.path.join(folder, "step_00000003.ckpt"), L, C, NH, maxT, params, master, step=3)
    params2, master2 = checkpoint_state(L, C, maxT)
    # the newest step is an fp8 run's: its FP8-scales section (L x 4 x 3 x 112 bytes) follows adam_v
    write_checkpoint(os.path.join(folder, "step_00000010.ckpt"), L, C, NH, maxT, params2, master2, step=10,
                     fp8=L * 4 * 3 * 112)
    # a folder: its newest step, as --resume DIR
    run_ok("export_hf.py", folder, path("ck16_hf"))  # default --dtype bf16
    run_ok("import_hf.py", path("ck16_hf"), path("ck16.bin"))
    h, back = read_model_tensors(path("ck16.bin"))
    assert h[1] == 5, f"version {h[1]}: a bf16 export should import as bf16"
    assert_same_weights(back, [p.astype(np.uint16) for p in params2], "the checkpoint's bf16 weights")
    run_ok("export_hf.py", os.path.join(folder, "step_00000003.ckpt"), path("ck32_hf"), "--dtype", "fp32")
    run_ok("import_hf.py", path("ck32_hf"), path("ck32.bin"))
    h, back = read_model_tensors(path("ck32.bin"))
    assert h[1] == 3
    assert_same_weights(back, master, "the checkpoint's fp32 master weights")
    run_ok("export_hf.py", os.path.join(folder, "step_00000010.ckpt"), path("ck32fp8_hf"), "--dtype", "fp32")
    run_ok("import_hf.py", path("ck32fp8_hf"), path("ck32fp8.bin"))
    assert_same_weights(read_model_tensors(path("ck32fp8.bin"))[1], master2,
                        "the fp32 master weights of a checkpoint with an FP8 section")


def test_zero1_checkpoint_master_gathered_from_rank_files():
    L, C, NH, maxT = 1, 64, 1, 16
    params, master = checkpoint_state(L, C, maxT)
    P = int(sum(np.prod(s) for s in shapes(L, C, maxT)))
    world, shard = 3, -(-P // (3 * 1024)) * 1024
    folder = path("zero1")
    os.makedirs(folder)
    files = [write_checkpoint(os.path.join(folder, f"step_00000005.rank{r:02d}of03.ckpt"), L, C, NH, maxT, params,
                              master, zero=(r, world, shard), step=5) for r in range(world)]
    run_ok("export_hf.py", files[1], path("z_hf"), "--dtype", "fp32")  # any rank's file names the step
    run_ok("import_hf.py", path("z_hf"), path("z.bin"))
    _, back = read_model_tensors(path("z.bin"))
    assert_same_weights(back, master, f"the master weights gathered from the {world} rank files")
    run_ok("export_hf.py", folder, path("z16_hf"))  # bf16 from the folder: every file holds all of them
    os.remove(files[2])
    expect_refusal("export_hf.py", (files[0], path("z_hf2"), "--dtype", "fp32"), "rank02of03", "missing",
                   "--dtype bf16")
    run_ok("export_hf.py", files[0], path("z16b_hf"), "--dtype", "bf16")


# ---- the exported folder ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def exported_small():
    """(L, C, NH, maxT, fp32 tensors, folder) of one fp32 export, shared by the checks of its files."""
    L, C, NH, maxT = 2, 128, 2, 48
    tensors = random_tensors(L, C, maxT, scale=0.3)
    src = write_model_file(path("small.bin"), L, C, NH, maxT, tensors)
    run_ok("export_hf.py", src, path("small_hf"), "--dtype", "fp32")
    return L, C, NH, maxT, tensors, path("small_hf")


def test_safetensors_names_layouts_and_metadata():
    L, C, NH, maxT, t, folder = exported_small()
    files, metadata = read_with_safetensors(os.path.join(folder, "model.safetensors"))
    assert metadata == {"format": "pt"}, f"metadata {metadata}: transformers needs {{'format': 'pt'}}"
    assert sorted(files) == sorted(hf_names(L)), f"names differ: {sorted(set(files) ^ set(hf_names(L)))[:6]}"
    assert "lm_head.weight" not in files
    assert all(code == "F32" for code, _, _ in files.values())
    get = lambda name: files[name][2]  # noqa: E731
    assert np.array_equal(get("transformer.wpe.weight"), t[1])
    for l in range(L):
        h = f"transformer.h.{l}."
        # GPT-2's Conv1D computes x @ W: W[i, o] is our (out, in) weight's [o, i]
        for name, ours in (("attn.c_attn.weight", t[4][l]), ("attn.c_proj.weight", t[6][l]),
                           ("mlp.c_fc.weight", t[10][l]), ("mlp.c_proj.weight", t[12][l])):
            w = get(h + name)
            assert w.shape == ours.shape[::-1], f"{h + name}: {w.shape}, Conv1D's (in, out) is {ours.shape[::-1]}"
            o, i = RNG.integers(ours.shape[0]), RNG.integers(ours.shape[1])
            assert w[i, o] == ours[o, i] and np.array_equal(w, ours.T), f"{h + name}: not our weight transposed"
        for name, ours in (("ln_1.weight", t[2]), ("ln_1.bias", t[3]), ("attn.c_attn.bias", t[5]),
                           ("attn.c_proj.bias", t[7]), ("ln_2.weight", t[8]), ("ln_2.bias", t[9]),
                           ("mlp.c_fc.bias", t[11]), ("mlp.c_proj.bias", t[13])):
            assert np.array_equal(get(h + name), ours[l]), h + name
    assert np.array_equal(get("transformer.ln_f.weight"), t[14]) and np.array_equal(get("transformer.ln_f.bias"), t[15])


def test_config_json_describes_gpt2():
    L, C, NH, maxT, _, folder = exported_small()
    config = json.load(open(os.path.join(folder, "config.json")))
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_embd": C, "n_head": NH,
            "n_positions": maxT, "vocab_size": V, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"}
    wrong = {k: (config.get(k, "<missing>"), v) for k, v in want.items() if config.get(k, "<missing>") != v}
    assert not wrong, f"config.json (got, want): {wrong}"


def gpt2_forward_hf_convention(files, L, NH, tokens):
    """Logits (T, V) of GPT2LMHeadModel's forward written as transformers computes it, in fp64, on the
    tensors of an exported model.safetensors (names and Conv1D layouts as GPT-2's)."""
    w = lambda name: files[name][2].astype(np.float64)  # noqa: E731
    T = len(tokens)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w(p + ".weight") + w(p + ".bias")

    def conv1d(x, p):
        return x @ w(p + ".weight") + w(p + ".bias")

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    h = w("transformer.wte.weight")[tokens] + w("transformer.wpe.weight")[:T]
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = f"transformer.h.{l}."
        q, k, v = np.split(conv1d(ln(h, p + "ln_1"), p + "attn.c_attn"), 3, axis=-1)
        heads = lambda x: x.reshape(T, NH, -1).transpose(1, 0, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        s[:, mask] = -np.inf
        a = np.exp(s - s.max(-1, keepdims=True))
        y = (a / a.sum(-1, keepdims=True)) @ v
        h = h + conv1d(y.transpose(1, 0, 2).reshape(T, -1), p + "attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(h, "transformer.ln_f") @ w("transformer.wte.weight").T  # tied LM head


def test_exported_weights_compute_our_model():
    lib_path = os.path.join(ROOT, BUILD, "libcpu_gpt.so")
    if not os.path.exists(lib_path):
        raise harness.Skip(f"{lib_path} is not built (make {BUILD}/libcpu_gpt.so)")
    L, C, NH, maxT, t, folder = exported_small()
    files, _ = read_with_safetensors(os.path.join(folder, "model.safetensors"))
    T = 40
    tokens = RNG.integers(0, V, size=T + 1)
    hf_logits = gpt2_forward_hf_convention(files, L, NH, tokens[:T])
    lib = ctypes.CDLL(lib_path)
    lib.cpu_gpt_forward_backward.restype = ctypes.c_double
    config = np.array([L, C, NH, V, VP, maxT, NH], dtype=np.int32)  # the last: key/value heads (GPT-2: NH)
    params = np.concatenate([x.ravel() for x in t]).astype(np.float64)
    inputs = np.ascontiguousarray(tokens[:T].reshape(1, T), dtype=np.int32)
    targets = np.ascontiguousarray(tokens[1:].reshape(1, T), dtype=np.int32)
    logits = np.empty((1, T, VP), dtype=np.float64)
    ptr = lambda a, ty: a.ctypes.data_as(ctypes.POINTER(ty))  # noqa: E731
    lib.cpu_gpt_forward_backward(ptr(config, ctypes.c_int), 1, T, ptr(params, ctypes.c_double),
                                 ptr(inputs, ctypes.c_int), ptr(targets, ctypes.c_int), ptr(logits, ctypes.c_double),
                                 None)
    ref = logits[0, :, :V]
    err = np.abs(hf_logits - ref).max() / np.abs(ref).max()
    assert err < 1e-9, f"GPT-2's forward on the export differs from our C reference: max rel error {err:.2e}"


def test_import_reads_folders_written_by_others():
    st = need("safetensors")
    import safetensors.numpy  # noqa: F401  (the package's own writer)
    L, C, NH, maxT = 1, 64, 1, 24
    t = random_tensors(L, C, maxT)
    f16 = [x.astype(np.float16) for x in t]  # values exact in fp16, so the import must keep them exactly
    t = [x.astype(np.float32) for x in f16]
    tensors = {"wte.weight": f16[0][:V], "wpe.weight": f16[1], "ln_f.weight": f16[14], "ln_f.bias": f16[15],
               "lm_head.weight": f16[0][:V].copy(), "h.0.attn.bias": np.ones((1, 1, maxT, maxT), np.float16),
               "h.0.attn.masked_bias": np.array(-1e4, dtype=np.float16)}
    for name, i, transposed in (("ln_1.weight", 2, 0), ("ln_1.bias", 3, 0), ("attn.c_attn.weight", 4, 1),
                                ("attn.c_attn.bias", 5, 0), ("attn.c_proj.weight", 6, 1), ("attn.c_proj.bias", 7, 0),
                                ("ln_2.weight", 8, 0), ("ln_2.bias", 9, 0), ("mlp.c_fc.weight", 10, 1),
                                ("mlp.c_fc.bias", 11, 0), ("mlp.c_proj.weight", 12, 1), ("mlp.c_proj.bias", 13, 0)):
        tensors[f"h.0.{name}"] = np.ascontiguousarray(f16[i][0].T if transposed else f16[i][0])
    folder = path("hub_style")
    os.makedirs(folder)
    st.numpy.save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    json.dump({"model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": NH, "n_positions": maxT, "vocab_size": V,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
              open(os.path.join(folder, "config.json"), "w"))
    import hf_gpt2
    read = hf_gpt2.read_safetensors(os.path.join(folder, "model.safetensors"))
    assert read["h.0.attn.masked_bias"][0] == "fp16" and float(read["h.0.attn.masked_bias"][1]) == -1e4
    assert np.array_equal(read["h.0.attn.c_attn.weight"][1], tensors["h.0.attn.c_attn.weight"])
    out = run_ok("import_hf.py", folder, path("hub_style.bin"))
    assert "--layers 1 --hidden 64 --heads 1" in out, f"no train_gpt command for the shape in: {out}"
    h, back = read_model_tensors(path("hub_style.bin"))
    assert h[1] == 3, f"version {h[1]}: fp16 weights should import as fp32 by default"
    for i, (b, x) in enumerate(zip(back, t)):
        assert np.array_equal(b, x), f"tensor {i} differs"
    run_ok("import_hf.py", folder, path("hub_style16.bin"), "--dtype", "bf16")
    _, back16 = read_model_tensors(path("hub_style16.bin"))
    assert np.array_equal(back16[4], rne_bf16(t[4]).astype(np.uint16)), "--dtype bf16: qkvw not rounded to nearest"


# ---- refusals ---------------------------------------------------------------------------------------------

def test_export_refuses_what_gpt2_cannot_express_or_is_damaged():
    L, C, NH, maxT = 1, 128, 2, 16
    t = random_tensors(L, C, maxT)
    out = path("refused_hf")
    gqa = write_model_file(path("gqa.bin"), L, C, NH, maxT, t, extra_header={8: 1})
    expect_refusal("export_hf.py", (gqa, out), "header int 8", "grouped-query", "key/value heads")
    params, master = checkpoint_state(L, C, maxT)
    ck = write_checkpoint(path("kv.ckpt"), L, C, NH, maxT, params, master, header_tail=struct.pack("<i", 1))
    expect_refusal("export_hf.py", (ck, out), "byte 208", "grouped-query")
    ck2 = write_checkpoint(path("v2.ckpt"), L, C, NH, maxT, params, master, version=2)
    expect_refusal("export_hf.py", (ck2, out), "version 2")
    fp8 = write_checkpoint(path("fp8.ckpt"), L, C, NH, maxT, params, master, fp8=1344)
    os.truncate(fp8, os.path.getsize(fp8) - 1344)  # the header claims an FP8 section the file lacks
    expect_refusal("export_hf.py", (fp8, out), "1344-byte FP8-scales section", "truncated")
    neg = write_checkpoint(path("fp8neg.ckpt"), L, C, NH, maxT, params, master, header_tail=struct.pack("<ii", 0, -8))
    os.truncate(neg, os.path.getsize(neg) - 8)  # the size agrees with the claim: only the range check refuses it
    expect_refusal("export_hf.py", (neg, out), "fp8_state_bytes -8", "corrupt header")
    odd = write_model_file(path("odd.bin"), L, 96, 5, maxT, random_tensors(L, 96, maxT))
    expect_refusal("export_hf.py", (odd, out), "not a multiple of 5 heads")
    short = path("short.bin")
    open(short, "wb").write(open(write_model_file(path("full.bin"), L, C, NH, maxT, t), "rb").read()[:-10])
    expect_refusal("export_hf.py", (short, out), "truncated")
    junk = path("junk.bin")
    open(junk, "wb").write(b"\x01" * 4096)
    expect_refusal("export_hf.py", (junk, out), "neither a train_gpt checkpoint")
    expect_refusal("export_hf.py", (path("absent.bin"), out), "no such file")
    t_nan = [x.copy() for x in t]
    t_nan[6][0, 3, 5] = np.nan
    expect_refusal("export_hf.py", (write_model_file(path("nan.bin"), L, C, NH, maxT, t_nan), out),
                   "attprojw", "non-finite")
    expect_refusal("export_hf.py", (path("full.bin"), path("full.bin")), "not a folder")
    assert not os.path.exists(os.path.join(out, "model.safetensors")), "a refused export left a model behind"


def hf_folder(name, config_changes=None, drop=None, reshape=None, extra=None, untie=False, poison=None):
    """A small GPT-2 folder from an export, then damaged as asked."""
    L, C, NH, maxT = 1, 64, 1, 16
    src = write_model_file(path(name + ".bin"), L, C, NH, maxT, random_tensors(L, C, maxT))
    folder = path(name)
    run_ok("export_hf.py", src, folder, "--dtype", "fp32")
    st = need("safetensors")
    import safetensors.numpy  # noqa: F401
    tensors = {k: v[2].copy() for k, v in read_with_safetensors(os.path.join(folder, "model.safetensors"))[0].items()}
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape].T.copy()
    if extra:
        tensors[extra] = np.zeros(3, np.float32)
    if poison:
        tensors[poison].ravel()[5] = np.inf
    if untie:
        tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + np.float32(1)
    st.numpy.save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(folder, "config.json")))
    config.update(config_changes or {})
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    return folder


def test_import_refuses_what_train_gpt_cannot_run():
    out = path("refused.bin")
    expect_refusal("import_hf.py", (hf_folder("hd32", {"n_head": 2}), out), "head dim 32", "64, 80, 96, 128")
    expect_refusal("import_hf.py", (hf_folder("erf", {"activation_function": "gelu"}), out), "activation_function")
    expect_refusal("import_hf.py", (hf_folder("inner", {"n_inner": 100}), out), "n_inner 100")
    expect_refusal("import_hf.py", (hf_folder("eps", {"layer_norm_epsilon": 1e-6}), out), "layer_norm_epsilon")
    expect_refusal("import_hf.py", (hf_folder("vocab", {"vocab_size": 50000}), out), "vocab_size 50000")
    expect_refusal("import_hf.py", (hf_folder("llama", {"model_type": "llama"}), out), "model_type 'llama'")
    expect_refusal("import_hf.py", (hf_folder("untied", untie=True), out), "lm_head.weight differs")
    expect_refusal("import_hf.py", (hf_folder("notie", {"tie_word_embeddings": False}), out), "not tied")
    expect_refusal("import_hf.py", (hf_folder("missing", drop="transformer.h.0.mlp.c_fc.bias"), out),
                   "missing h.0.mlp.c_fc.bias")
    expect_refusal("import_hf.py", (hf_folder("extra", extra="score.weight"), out), "not part of GPT-2 score.weight")
    expect_refusal("import_hf.py", (hf_folder("shape", reshape="transformer.h.0.attn.c_attn.weight"), out),
                   "h.0.attn.c_attn.weight has shape (192, 64)", "needs (64, 192)")
    expect_refusal("import_hf.py", (hf_folder("inf", poison="transformer.h.0.mlp.c_proj.weight"), out),
                   "h.0.mlp.c_proj.weight holds 1 non-finite")
    pickle_only = path("pickle_only")
    os.makedirs(pickle_only)
    json.dump({"model_type": "gpt2"}, open(os.path.join(pickle_only, "config.json"), "w"))
    open(os.path.join(pickle_only, "pytorch_model.bin"), "wb").write(b"x")
    expect_refusal("import_hf.py", (pickle_only, out), "pytorch_model.bin", "save_pretrained")
    expect_refusal("import_hf.py", (path("no_such_folder"), out), "no such folder")
    assert not os.path.exists(out), "a refused import left a file behind"


# ---- tokenizer ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def tokenizer_folder():
    harness.need_ranks()
    L, C, NH, maxT = 1, 64, 1, 16
    src = write_model_file(path("tok.bin"), L, C, NH, maxT, random_tensors(L, C, maxT))
    run_ok("export_hf.py", src, path("tok_hf"), "--tokenizer")
    return path("tok_hf")


def gpt2_bpe_encoder(folder):
    """encode(text) -> ids from vocab.json and merges.txt, by GPT-2's published algorithm (encoder.py)."""
    import regex
    vocab = json.load(open(os.path.join(folder, "vocab.json"), encoding="utf-8"))
    lines = open(os.path.join(folder, "merges.txt"), encoding="utf-8").read().split("\n")
    assert lines[0].startswith("#version"), f"merges.txt starts {lines[0]!r}"
    ranks = {tuple(m.split()): i for i, m in enumerate(lines[1:-1])}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_encoder = dict(zip(bs, map(chr, cs)))
    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    @functools.lru_cache(maxsize=None)
    def bpe(token):
        word = tuple(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        return word

    def encode(text):
        ids = []
        for piece in pat.findall(text):
            ids += [vocab[t] for t in bpe("".join(byte_encoder[b] for b in piece.encode("utf-8")))]
        return ids
    return vocab, len(lines) - 2, encode


def sample_text():
    text = "Hello world! It's 2024: naïve café, Привет, 日本語, emoji 🤖🚀, tabs\tand  spaces\n\n\nend  "
    if os.path.exists(harness.SHAKESPEARE):  # more text when the shared data folder has it
        text += open(harness.SHAKESPEARE, encoding="utf-8").read()[:20000]
    return text


def test_tokenizer_files_encode_as_tiktoken():
    folder = tokenizer_folder()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.exists(os.path.join(folder, name)), f"--tokenizer did not write {name}"
    vocab, num_merges, encode = gpt2_bpe_encoder(folder)
    assert len(vocab) == V and sorted(vocab.values()) == list(range(V)), "vocab.json is not ids 0..50256"
    assert vocab["<|endoftext|>"] == 50256 and num_merges == 50000, (vocab.get("<|endoftext|>"), num_merges)
    config = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    assert config["eos_token"] == "<|endoftext|>" and config["model_max_length"] == 16, config
    import tiktoken
    want = tiktoken.get_encoding("r50k_base").encode_ordinary(sample_text())
    got = encode(sample_text())
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, f"encodings differ at token {first} ({len(got)} vs {len(want)} tokens)"


def test_tokenizer_refused_for_another_vocab():
    L, C, NH, maxT = 1, 64, 1, 16
    p = write_model_file(path("v.bin"), L, C, NH, maxT, random_tensors(L, C, maxT))
    raw = bytearray(open(p, "rb").read())
    raw[12:16] = struct.pack("<i", 50000)  # vocab 50000, still padded to 50304
    open(p, "wb").write(bytes(raw))
    expect_refusal("export_hf.py", (p, path("v_hf"), "--tokenizer"), "GPT-2's tokenizer has 50257")


# ---- transformers (skipped where it is not installed, as in CI) --------------------------------------------

def test_transformers_loads_the_export():
    torch, transformers = need_torch_transformers()
    import torch_gpt as tg
    L, C, NH, maxT, t, folder = exported_small()
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "the LM head is not tied"
    ref = tg.GPT(tg.GPTConfig(L, C, NH, maxT))
    tg.load_stacked_(ref, t)
    x = torch.from_numpy(RNG.integers(0, V, size=(2, maxT)))
    with torch.no_grad():
        a, b = model(x).logits, ref.eval()(x)[..., :V]
    err = ((a - b).abs().max() / b.abs().max()).item()
    # Two fp32 implementations of the same model (transformers' GPT2 and torch_gpt.py) round in
    # different orders; over ~5M logits of fresh random weights the largest gap reached 1.5e-5 of the
    # largest logit in one of nine H100-host runs (2026-11-25). A wrong name, layout or transpose in
    # the export moves the logits by O(1).
    assert err < 1e-4, f"transformers' logits differ from our PyTorch model's: max rel error {err:.2e}"


def test_transformers_loads_the_tokenizer():
    torch, transformers = need_torch_transformers()
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    import tiktoken
    text = sample_text()
    assert tok(text)["input_ids"] == tiktoken.get_encoding("r50k_base").encode_ordinary(text)
    assert tok.eos_token_id == 50256


# ---- plot_log.py ----------------------------------------------------------------------------------------

def write_log(p, steps, val_every, peak=989.4, broken_tail=False):
    with open(p, "w") as f:
        for s in range(1, steps + 1):
            tflops = 300.0 + 5 * np.sin(s)
            f.write(json.dumps({"step": s, "loss": 11 * np.exp(-s / 20) + 3, "lr": 3e-4 * min(1, s / 5),
                                "grad_norm": 5 / s + 0.5, "ms": 11.0, "tokens_per_s": 37e4,
                                "tflops_per_gpu": round(tflops, 2), "mfu": round(tflops / peak, 4)}) + "\n")
            if s % val_every == 0:
                f.write(json.dumps({"step": s, "val_loss": 11 * np.exp(-s / 20) + 3.2}) + "\n")
        if broken_tail:
            f.write('{"step": 41, "loss": 3.')
    return p


def test_plot_log_draws_a_png():
    need("matplotlib")
    import matplotlib.image
    a = write_log(path("run_a.jsonl"), 40, 10, broken_tail=True)
    b = write_log(path("run_b.jsonl"), 25, 5, peak=312.0)
    png = path("runs.png")
    rc, out, err = run("plot_log.py", a, b, "--label", "run a", "--label", "b, peak 312", "-o", png, "--smooth", "0.8")
    assert rc == 0, f"exit {rc}: {err.strip()}"
    assert "skipped 1 line" in err, f"the broken last line was not reported: {err!r}"
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    image = matplotlib.image.imread(png)
    assert width > 500 and height > 400 and image.shape[:2] == (height, width), (width, height, image.shape)
    colored = np.abs(image[..., 0] - image[..., 2]) > 0.2  # the curves are coloured; axes and text are grey
    assert colored.mean() > 0.002, f"the plot looks empty ({100 * colored.mean():.3f}% coloured pixels)"
    one = path("single.png")
    run_ok("plot_log.py", a, "-o", one)
    assert os.path.getsize(one) > 10000
    # --eval-data records add a fifth panel (the figure grows by a row)
    evals = path("run_eval.jsonl")
    with open(evals, "w") as f:
        for step in range(0, 41, 10):
            f.write(json.dumps({"step": step, "loss": 5.0 - step / 20}) + "\n")
            f.write(json.dumps({"step": step, "eval_acc_norm": 0.25 + step / 200, "eval_acc": 0.25,
                                "eval_examples": 100}) + "\n")
    with_evals = path("evals.png")
    run_ok("plot_log.py", evals, "-o", with_evals)
    heights = [struct.unpack(">II", open(x, "rb").read()[16:24])[1] for x in (one, with_evals)]
    assert heights[1] > 1.3 * heights[0], f"no eval panel: heights {heights}"


def test_plot_log_refuses_bad_input():
    need("matplotlib")
    expect_refusal("plot_log.py", (path("nothing.jsonl"),), "no such file")
    empty = path("empty.jsonl")
    open(empty, "w").write("not json\n{}\n")
    expect_refusal("plot_log.py", (empty, "-o", path("empty.png")), "no step records")
    rc, _, err = run("plot_log.py", empty, empty, "--label", "one")
    assert rc == 2 and "--label is given 1 times for 2 logs" in err, (rc, err)


if __name__ == "__main__":
    harness.run_module(globals())
