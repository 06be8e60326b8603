"""test_prepare_data.py: tests of scripts/prepare_data.py (run from the repo root).

Runs the script as a subprocess into temporary folders, offline. The cases on Tiny Shakespeare need
the shared data folder's copy of it and its tiktoken cache of the GPT-2 BPE ranks; the cases that
tokenize need the ranks; the error cases and the shard format's checks need neither and always run
(test/harness.py: $SHARED_DATA_DIR, the Makefile's SHARED_DATA, default ../shared/data).
Shard headers are parsed here independently of scripts/shard_format.py, and documents are
split here independently of the script, so that a bug in either shows up as a mismatch.
"""
import functools
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

import harness  # first: points TIKTOKEN_CACHE_DIR at the shared ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")
SHAKESPEARE = harness.SHAKESPEARE
EOT = 50256
VOCAB = 50257
MAGIC, VERSION = 20240520, 1

sys.path.insert(0, os.path.join(REPO, "scripts"))
_tmp = tempfile.TemporaryDirectory(prefix="test_prepare_data_")  # removed at exit


def need_shakespeare_and_ranks():
    harness.need_shakespeare()
    harness.need_ranks()


@functools.lru_cache(maxsize=None)
def encoding():
    import tiktoken
    return tiktoken.get_encoding("r50k_base")


def run(*args, env=None):
    """Runs prepare_data.py; returns (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def run_ok(*args):
    rc, out, err = run(*args)
    assert rc == 0, f"exit {rc}: {err.strip()}"
    return out


def new_dir(tag):
    return tempfile.mkdtemp(prefix=tag + "_", dir=_tmp.name)


def read_raw(path):
    """(header ints, tokens) of a shard, parsed here without shard_format.py; checks the size."""
    raw = open(path, "rb").read()
    assert len(raw) >= 1024, f"{path}: {len(raw)} bytes, shorter than the header"
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == MAGIC, f"{path}: magic {header[0]}"
    assert header[1] == VERSION, f"{path}: version {header[1]}"
    assert len(raw) == 1024 + 2 * int(header[2]), f"{path}: {len(raw)} bytes for count {header[2]}"
    return header, np.frombuffer(raw[1024:], dtype="<u2")


def shards(folder, name, split):
    return sorted(glob.glob(os.path.join(folder, f"{name}_{split}_*.bin")))


def stream(folder, name):
    """All tokens, val shards then train shards, plus the number of val tokens."""
    val = [read_raw(p)[1] for p in shards(folder, name, "val")]
    train = [read_raw(p)[1] for p in shards(folder, name, "train")]
    n_val = sum(len(v) for v in val)
    return np.concatenate(val + train), n_val


def paragraphs(text):
    """Documents as llm.c makes them: every "\\n\\n" ends one (written without the script's regex)."""
    docs, start = [], 0
    while True:
        i = text.find("\n\n", start)
        if i < 0:
            docs.append(text[start:])
            return [d for d in docs if d]
        docs.append(text[start:i + 2])
        start = i + 2


@functools.lru_cache(maxsize=None)
def shakespeare_run():
    """Tiny Shakespeare with paragraph documents, prepared once for several cases."""
    folder = new_dir("shakespeare")
    out = run_ok("--input", SHAKESPEARE, "--paragraph-docs", "--out-dir", folder)
    return folder, out


def test_shakespeare_headers():
    need_shakespeare_and_ranks()
    folder, out = shakespeare_run()
    names = sorted(os.listdir(folder))
    assert names == ["gpt2_tokenizer.bin", "tinyshakespeare_train_000000.bin", "tinyshakespeare_val_000000.bin"], names
    names.remove("gpt2_tokenizer.bin")  # its own test: test_tokenizer.py
    for name in names:
        header, tokens = read_raw(os.path.join(folder, name))
        assert header[2] == len(tokens) > 0, f"{name}: count {header[2]}"
        assert not header[3:].any(), f"{name}: header ints 3..255 are not zero"
        assert f"{name}: {len(tokens):,} tokens" in out, f"no line for {name} in output:\n{out}"


def test_shakespeare_round_trip_and_documents():
    need_shakespeare_and_ranks()
    folder, _ = shakespeare_run()
    text = open(SHAKESPEARE, encoding="utf-8", newline="").read()
    docs = paragraphs(text)
    tokens, _ = stream(folder, "tinyshakespeare")
    assert tokens[0] == EOT, f"first token {tokens[0]}, not EOT"
    eots = np.flatnonzero(tokens == EOT)
    assert len(eots) == len(docs), f"{len(eots)} EOT tokens for {len(docs)} documents"
    enc = encoding()
    bounds = list(eots) + [len(tokens)]
    for i, doc in enumerate(docs):  # every EOT is followed by exactly the next document
        got = enc.decode(tokens[bounds[i] + 1:bounds[i + 1]].tolist())
        assert got == doc, f"document {i}: decoded {got[:60]!r}, expected {doc[:60]!r}"
    whole = enc.decode(tokens[tokens != EOT].tolist())
    assert whole == text, "decoding all shards without EOT does not give the original text"


def test_shakespeare_val_split_at_document_boundary():
    need_shakespeare_and_ranks()
    folder, _ = shakespeare_run()
    tokens, n_val = stream(folder, "tinyshakespeare")
    _, train = read_raw(shards(folder, "tinyshakespeare", "train")[0])
    assert train[0] == EOT, "train does not start at a document (first token is not EOT)"
    total = len(tokens)
    assert n_val >= 0.1 * total, f"val holds {n_val}/{total} tokens, less than 10%"
    last_val_doc = np.flatnonzero(tokens[:n_val] == EOT)[-1]
    assert last_val_doc < 0.1 * total, "val holds more documents than it needs to reach 10%"
    assert n_val / total < 0.11, f"val fraction {n_val / total:.4f}"


def test_shakespeare_tokens_in_vocab():
    need_shakespeare_and_ranks()
    folder, _ = shakespeare_run()
    tokens, _ = stream(folder, "tinyshakespeare")
    assert tokens.max() < VOCAB, f"token {tokens.max()} >= {VOCAB}"


def test_small_shards_concatenate_to_the_same_stream():
    need_shakespeare_and_ranks()
    folder, _ = shakespeare_run()
    whole, n_val_whole = stream(folder, "tinyshakespeare")
    small = new_dir("small")
    run_ok("--input", SHAKESPEARE, "--paragraph-docs", "--out-dir", small, "--shard-tokens", 20000)
    tokens, n_val = stream(small, "tinyshakespeare")
    assert n_val == n_val_whole and np.array_equal(tokens, whole), "sharded stream differs"
    for split, n in (("val", n_val), ("train", len(whole) - n_val)):
        paths = shards(small, "tinyshakespeare", split)
        sizes = [len(read_raw(p)[1]) for p in paths]
        expect = [20000] * (n // 20000) + ([n % 20000] if n % 20000 else [])
        assert sizes == expect, f"{split} shard sizes {sizes}, expected {expect}"
        assert [os.path.basename(p)[-10:-4] for p in paths] == [f"{i:06d}" for i in range(len(paths))]


def test_rerun_removes_stale_shards():
    need_shakespeare_and_ranks()
    folder = new_dir("rerun")
    run_ok("--input", SHAKESPEARE, "--paragraph-docs", "--out-dir", folder, "--shard-tokens", 100000)
    assert len(shards(folder, "tinyshakespeare", "train")) == 4
    run_ok("--input", SHAKESPEARE, "--paragraph-docs", "--out-dir", folder, "--val-fraction", 0)
    left = sorted(f for f in os.listdir(folder) if f.endswith(".bin"))
    assert left == ["gpt2_tokenizer.bin", "tinyshakespeare_train_000000.bin"], f"files left: {left}"


def test_literal_endoftext_is_ordinary_text():
    harness.need_ranks()
    folder = new_dir("literal")
    text = "Before <|endoftext|> after.\n"
    path = os.path.join(folder, "lit.txt")
    open(path, "w").write(text)
    run_ok("--input", path, "--out-dir", folder, "--val-fraction", 0)
    assert shards(folder, "lit", "val") == [], "--val-fraction 0 wrote a val shard"
    _, tokens = read_raw(os.path.join(folder, "lit_train_000000.bin"))
    assert tokens.tolist() == [EOT] + encoding().encode_ordinary(text), f"tokens {tokens.tolist()}"
    assert int((tokens == EOT).sum()) == 1, "the literal <|endoftext|> became the special token"
    assert encoding().decode(tokens[1:].tolist()) == text


def test_files_are_documents():
    harness.need_ranks()
    folder = new_dir("files")
    texts = ["First file.\n\nStill the first.\n", "Second file, a bit longer than the first one.\n"]
    paths = []
    for i, t in enumerate(texts):
        paths.append(os.path.join(folder, f"doc{i}.txt"))
        open(paths[-1], "w").write(t)
    run_ok("--input", *paths, "--out-dir", folder, "--val-fraction", 0.2)  # name defaults to doc0
    enc = encoding()
    _, val = read_raw(os.path.join(folder, "doc0_val_000000.bin"))
    _, train = read_raw(os.path.join(folder, "doc0_train_000000.bin"))
    assert val.tolist() == [EOT] + enc.encode_ordinary(texts[0]), "val is not exactly the first file"
    assert train.tolist() == [EOT] + enc.encode_ordinary(texts[1]), "train is not exactly the second file"


def small_text():
    """A small UTF-8 text file of two paragraphs, for the cases that need no shared data."""
    path = os.path.join(new_dir("small_in"), "small.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("First paragraph.\n\nSecond paragraph.\n")
    return path


def check_error(tag, args, words):
    """The script must exit non-zero, say something containing every word, print no
    traceback and write no shard."""
    folder = new_dir(tag)
    rc, out, err = run(*args, "--out-dir", folder)
    assert rc != 0, f"exit 0 for {args}"
    assert "Traceback" not in err, f"traceback instead of a message:\n{err}"
    for word in words:
        assert word in err, f"message does not mention {word!r}: {err.strip()!r}"
    written = glob.glob(os.path.join(folder, "*.bin"))
    assert not written, f"wrote {written} despite the error"
    return err


def test_error_missing_input():
    check_error("missing", ["--input", "/nonexistent/nothing_here.txt"], ["/nonexistent/nothing_here.txt"])


def test_error_single_document_with_val_fraction():
    harness.need_ranks()
    path = os.path.join(new_dir("single_in"), "one.txt")
    open(path, "w").write("only one document here\n")
    check_error("single", ["--input", path], ["--paragraph-docs", "--val-fraction 0"])


def test_error_bad_val_fraction():
    check_error("badfrac", ["--input", small_text(), "--val-fraction", 1.5], ["--val-fraction"])


def test_error_shard_tokens_over_int32():
    check_error("bigshard", ["--input", small_text(), "--shard-tokens", 2**31], ["--shard-tokens"])


def test_error_not_utf8():
    path = os.path.join(new_dir("binary_in"), "bin.txt")
    open(path, "wb").write(b"abc\xff\xfe")
    check_error("binary", ["--input", path], [path, "UTF-8"])


def test_error_offline_without_tiktoken_cache():
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=new_dir("empty_cache"))
    folder = new_dir("nocache")
    rc, _, err = run("--input", small_text(), "--paragraph-docs", "--out-dir", folder, env=env)
    if rc == 0:
        raise harness.Skip("online: tiktoken downloaded the ranks, so the offline message cannot be seen")
    assert "TIKTOKEN_CACHE_DIR" in err and "Traceback" not in err, f"message: {err.strip()!r}"


def test_error_offline_default_dataset():
    folder = new_dir("nodownload")
    rc, _, err = run("--out-dir", folder)
    if rc == 0:
        raise harness.Skip("online: Tiny Shakespeare was downloaded")
    assert "offline" in err and "--input" in err and "Traceback" not in err, f"message: {err.strip()!r}"
    assert not os.path.exists(os.path.join(folder, "input.txt")), "left a partial input.txt"


def test_read_shard_checks_the_file():
    from shard_format import ShardError, read_shard, write_shard
    folder = new_dir("format")
    path = os.path.join(folder, "x.bin")
    tokens = np.arange(1000, dtype=np.uint16)
    write_shard(path, tokens)
    assert np.array_equal(read_shard(path), tokens), "read_shard does not give back what was written"
    raw = open(path, "rb").read()
    bad = {"truncated": raw[:-2], "trailing": raw + b"\0\0", "magic": b"\1" + raw[1:],
           "version": raw[:4] + b"\2" + raw[5:], "header": raw[:100]}
    for word, data in bad.items():
        open(path, "wb").write(data)
        try:
            read_shard(path)
        except ShardError as err:
            assert word in str(err) and path in str(err), f"message for {word}: {err}"
        else:
            raise AssertionError(f"read_shard accepted a file with a bad {word}")


harness.run_module(globals())
