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


def run(*args, env=None, timeout=300):
    """Runs prepare_data.py; returns (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=timeout)
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
    assert names == ["gpt2_tokenizer.bin", "tinyshakespeare_manifest.json",  # progress and summary
                     "tinyshakespeare_train_000000.bin", "tinyshakespeare_val_000000.bin"], names
    names.remove("tinyshakespeare_manifest.json")  # its own case: test_summary_and_manifest
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
    run_ok("--input", *paths, "--out-dir", folder, "--val-fraction", 0.2,  # name defaults to doc0
           "--val-split", "leading")  # the drawn split (the default here) has its own cases
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


def check_error(tag, args, words, timeout=300):
    """The script must exit non-zero, say something containing every word, print no
    traceback and write no shard."""
    folder = new_dir(tag)
    rc, out, err = run(*args, "--out-dir", folder, timeout=timeout)
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
    check_error("binary", ["--input", path], [path, "UTF-8", "offset 3", "line 1"])


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


# ---- corpora of any size: input kinds, workers, continuing, memory, bad input ----------------------

def make_docs(n, tag="doc"):
    """n documents of varied length and some non-ASCII text, the same on every call."""
    words = ["the", "river", "Fluß", "日本語", "naïve", "ends", "<|endoftext|>", "42", "tokens", "café"]
    return [f"{tag} {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(5 + (i * 13) % 60)) + "\n"
            for i in range(n)]


def expected_tokens(docs):
    enc = encoding()
    out = []
    for d in docs:
        out.append(EOT)
        out.extend(enc.encode_ordinary(d))
    return np.asarray(out, dtype=np.uint16)


def bins(folder):
    """{file name: bytes} of every .bin file in folder."""
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n.endswith(".bin")}


def run_env(args, **env):
    return run(*args, env=dict(os.environ, **{k: str(v) for k, v in env.items()}))


def write_jsonl(path, docs, field="text"):
    import json
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, field: d}) + "\n")


def check_stream(folder, name, docs):
    tokens, n_val = stream(folder, name)
    assert n_val == 0, f"{n_val} val tokens with --val-fraction 0"
    want = expected_tokens(docs)
    assert np.array_equal(tokens, want), f"{len(tokens)} tokens, expected {len(want)} (or they differ)"


def test_input_folder_recursive():
    harness.need_ranks()
    src = new_dir("folder_in")
    docs = make_docs(6)
    # nested folders, sorted by path; a hidden file and a file with another ending are left out
    paths = ["a/0.txt", "a/b/1.txt", "a/b/2.md", "c/3.txt", "c/d/e/4.txt", "z5.txt"]
    for rel, d in zip(paths, docs):
        os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
        open(os.path.join(src, rel), "w", encoding="utf-8").write(d)
    open(os.path.join(src, "a", ".hidden.txt"), "w").write("hidden\n")
    open(os.path.join(src, "a", "skip.bin"), "wb").write(b"\xff\xfe")
    out = new_dir("folder_out")
    run_ok("--input", src, "--out-dir", out, "--name", "f", "--val-fraction", 0)
    check_stream(out, "f", docs)
    only_txt = new_dir("folder_ext")
    run_ok("--input", src, "--out-dir", only_txt, "--name", "f", "--val-fraction", 0, "--ext", "txt")
    check_stream(only_txt, "f", docs[:2] + docs[3:])


def test_input_glob_and_paragraphs():
    harness.need_ranks()
    src = new_dir("glob_in")
    docs = make_docs(9)
    for k in range(3):  # three files of three paragraphs each, in a sub-folder
        os.makedirs(os.path.join(src, "sub"), exist_ok=True)
        open(os.path.join(src, "sub", f"part{k}.txt"), "w", encoding="utf-8").write(
            "\n".join(docs[3 * k:3 * k + 3]))  # each doc ends in "\n": "\n\n" separates them
    open(os.path.join(src, "sub", "notes.md"), "w").write("not matched by the glob\n")
    out = new_dir("glob_out")
    run_ok("--input", os.path.join(src, "**", "*.txt"), "--paragraph-docs", "--out-dir", out, "--name", "g",
           "--val-fraction", 0)
    want = []
    for k in range(3):
        want += paragraphs("\n".join(docs[3 * k:3 * k + 3]))
    assert len(want) == 9
    check_stream(out, "g", want)
    rc, _, err = run("--input", os.path.join(src, "*.nothing"), "--out-dir", new_dir("glob_none"))
    assert rc == 1 and "no file matches" in err and "Traceback" not in err, err


def test_input_jsonl():
    harness.need_ranks()
    src = new_dir("jsonl_in")
    docs = make_docs(50)
    write_jsonl(os.path.join(src, "a.jsonl"), docs[:20], field="body")
    with open(os.path.join(src, "b.jsonl"), "w", encoding="utf-8") as f:  # blank lines are skipped
        import json
        for d in docs[20:]:
            f.write(json.dumps({"body": d}) + "\n\n")
    out = new_dir("jsonl_out")
    run_ok("--input", os.path.join(src, "a.jsonl"), os.path.join(src, "b.jsonl"), "--jsonl-field", "body",
           "--out-dir", out, "--val-fraction", 0)
    check_stream(out, "a", docs)  # the name defaults to the first input's stem


def test_input_parquet():
    harness.need_ranks()
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise harness.Skip("pyarrow is not installed (scripts/requirements.txt lists it)")
    src = new_dir("parquet_in")
    docs = make_docs(3000)
    table = pyarrow.table({"id": list(range(len(docs))), "content": docs})
    pq.write_table(table, os.path.join(src, "p.parquet"), row_group_size=700)
    out = new_dir("parquet_out")
    run_ok("--input", src, "--parquet-column", "content", "--out-dir", out, "--name", "p", "--val-fraction", 0)
    check_stream(out, "p", docs)


def test_drawn_split_spread_over_the_corpus():
    harness.need_ranks()
    src = new_dir("drawn_in")
    docs = make_docs(2000)
    write_jsonl(os.path.join(src, "d.jsonl"), docs)
    out = new_dir("drawn_out")
    log = run_ok("--input", os.path.join(src, "d.jsonl"), "--out-dir", out, "--val-fraction", 0.1)
    val = np.concatenate([read_raw(p)[1] for p in shards(out, "d", "val")])
    train = np.concatenate([read_raw(p)[1] for p in shards(out, "d", "train")])
    enc = encoding()

    def split_docs(tokens):
        bounds = list(np.flatnonzero(tokens == EOT)) + [len(tokens)]
        return [enc.decode(tokens[bounds[k] + 1:bounds[k + 1]].tolist()) for k in range(len(bounds) - 1)]

    # the literal "<|endoftext|>" is ordinary text, so EOT only ever starts a document
    v, t = split_docs(val), split_docs(train)
    assert len(v) + len(t) == len(docs), f"{len(v)} + {len(t)} documents, expected {len(docs)}"
    index = {d: i for i, d in enumerate(docs)}
    vi, ti = [index[d] for d in v], [index[d] for d in t]
    assert vi == sorted(vi) and ti == sorted(ti), "documents are out of order within a split"
    assert sorted(vi + ti) == list(range(len(docs))), "documents lost or repeated"
    frac = len(val) / (len(val) + len(train))
    assert 0.07 < frac < 0.13, f"val holds {frac:.3f} of the tokens, expected about 0.1"
    assert vi[0] < 200 and vi[-1] > 1800, f"val is not spread over the corpus: documents {vi[0]}..{vi[-1]}"
    assert f"({100 * frac:.1f}%" in log, f"the actual fraction {frac:.3f} is not reported:\n{log}"
    again = new_dir("drawn_again")  # other shard size: the same split
    run_ok("--input", os.path.join(src, "d.jsonl"), "--out-dir", again, "--shard-tokens", 3000)
    tokens, n_val = stream(again, "d")
    assert n_val == len(val) and np.array_equal(tokens, np.concatenate([val, train])), "split depends on shard size"
    other = new_dir("drawn_seed")
    run_ok("--input", os.path.join(src, "d.jsonl"), "--out-dir", other, "--seed", 7)
    assert stream(other, "d")[1] != n_val, "--seed does not change the drawn split"


def test_one_and_four_workers_write_the_same_shards():
    harness.need_ranks()
    src = new_dir("workers_in")
    write_jsonl(os.path.join(src, "w.jsonl"), make_docs(3000))
    results = {}
    for workers in (1, 4):
        out = new_dir(f"workers{workers}")
        rc, log, err = run_env(["--input", os.path.join(src, "w.jsonl"), "--out-dir", out, "--workers", workers,
                                "--shard-tokens", 20000], PREPARE_DATA_BATCH_CHARS=5000)
        assert rc == 0, err
        assert f"on {workers} worker(s)" in log, log
        results[workers] = bins(out)
    assert len([n for n in results[1] if "_train_" in n]) >= 3, f"too few shards: {sorted(results[1])}"
    assert results[1] == results[4], "1 and 4 workers wrote different shards"


def interrupted_then_continued(args, stop_after, **env):
    """Runs args stopped after `stop_after` shards, then again; returns (folder, stopped stderr, log)."""
    out = new_dir("stopped")
    rc, _, err = run_env([*args, "--out-dir", out], PREPARE_DATA_STOP_AFTER_SHARDS=stop_after, **env)
    assert rc == 3 and "run the same command again" in err, f"exit {rc}: {err}"
    done = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in bins(out)}
    assert len(done) == stop_after, f"{sorted(done)} after stopping at {stop_after} shards"
    for name in done:
        read_raw(os.path.join(out, name))  # a complete, valid shard
    rc, log, err = run_env([*args, "--out-dir", out], **env)
    assert rc == 0, err
    assert "continuing the run" in log, log
    for name, mtime in done.items():  # finished shards are not written again
        assert os.stat(os.path.join(out, name)).st_mtime_ns == mtime, f"{name} was written again"
    return out, err, log


def test_interrupted_run_continues_to_the_same_shards():
    harness.need_ranks()
    src = new_dir("resume_in")
    write_jsonl(os.path.join(src, "r.jsonl"), make_docs(3000))
    args = ["--input", os.path.join(src, "r.jsonl"), "--shard-tokens", 15000, "--val-fraction", 0.2,
            "--workers", 2]
    whole = new_dir("resume_whole")
    rc, _, err = run_env([*args, "--out-dir", whole], PREPARE_DATA_BATCH_CHARS=4000)
    assert rc == 0, err
    want = bins(whole)
    assert len(want) >= 8, f"too few shards to stop in the middle: {sorted(want)}"
    for stop_after in (1, 3):
        out, _, _ = interrupted_then_continued(args, stop_after, PREPARE_DATA_BATCH_CHARS=4000)
        assert bins(out) == want, f"stopped after {stop_after} shards and continued: other shards"


def test_interrupted_leading_split_continues():
    need_shakespeare_and_ranks()
    folder, _ = shakespeare_run()
    small = new_dir("leading_whole")
    args = ["--input", SHAKESPEARE, "--paragraph-docs", "--shard-tokens", 20000]
    run_ok(*args, "--out-dir", small)
    want = bins(small)
    out, _, _ = interrupted_then_continued(args, 4, PREPARE_DATA_BATCH_CHARS=30000)
    assert bins(out) == want, "the continued leading split wrote other shards"


def test_changed_arguments_refused_then_fresh():
    harness.need_ranks()
    src = new_dir("changed_in")
    write_jsonl(os.path.join(src, "c.jsonl"), make_docs(1500))
    out = new_dir("changed_out")
    args = ["--input", os.path.join(src, "c.jsonl"), "--shard-tokens", 10000, "--out-dir", out]
    rc, _, err = run_env(args, PREPARE_DATA_STOP_AFTER_SHARDS=1)
    assert rc == 3, err
    rc, _, err = run(*args, "--val-fraction", 0.3)
    assert rc == 1 and "--out-dir" in err and "--fresh" in err and "Traceback" not in err, err
    rc, log, err = run(*args, "--val-fraction", 0.3, "--fresh")
    assert rc == 0 and "continuing" not in log, err
    whole = new_dir("changed_whole")
    run_ok("--input", os.path.join(src, "c.jsonl"), "--shard-tokens", 10000, "--out-dir", whole, "--val-fraction", 0.3)
    assert bins(out) == bins(whole), "--fresh did not start over"


def test_summary_and_manifest():
    harness.need_ranks()
    import json
    src = new_dir("summary_in")
    write_jsonl(os.path.join(src, "s.jsonl"), make_docs(500))
    out = new_dir("summary_out")
    log = run_ok("--input", os.path.join(src, "s.jsonl"), "--out-dir", out, "--shard-tokens", 5000, "--workers", 2)
    m = json.load(open(os.path.join(out, "s_manifest.json")))
    summ = m["summary"]
    tokens, n_val = stream(out, "s")
    assert m["complete"] and summ["documents"] == 500 and summ["tokens"] == len(tokens), summ
    assert summ["val_tokens"] == n_val and summ["train_tokens"] == len(tokens) - n_val, summ
    assert summ["val_shards"] == len(shards(out, "s", "val")) and summ["train_shards"] == len(shards(out, "s", "train"))
    assert summ["tokens_per_s"] > 0 and summ["tokens_per_s_per_worker"] > 0 and summ["workers"] == 2, summ
    for words in ("500 documents", f"{len(tokens):,} tokens", "tokens/s on 2 worker(s)", "per worker"):
        assert words in log, f"summary lacks {words!r}:\n{log}"


def peak_rss_mb(args, **env):
    """Peak RSS (MB) of prepare_data.py run in one process (--workers 1) through resource.getrusage."""
    code = ("import os, resource, runpy, sys; sys.argv = sys.argv[1:]\n"
            "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", code, SCRIPT, *map(str, args), "--workers", "1"], capture_output=True,
                       text=True, env=dict(os.environ, **{k: str(v) for k, v in env.items()}), timeout=600)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split("PEAK_KB")[-1]) / 1024


def test_memory_bounded_on_a_large_input():
    harness.need_ranks()
    src = new_dir("memory_in")
    small, large = os.path.join(src, "small.txt"), os.path.join(src, "large.txt")
    paras = "".join(d + "\n" for d in make_docs(400))  # ~100 KB of paragraphs
    for path, copies in ((small, 30), (large, 300)):  # ~3 MB (the baseline: every buffer used) and ~30 MB
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(copies):
                f.write(paras)
    size_mb = os.path.getsize(large) / 2**20
    env = dict(PREPARE_DATA_READ_BYTES=1 << 20, PREPARE_DATA_BATCH_CHARS=1 << 18)
    args = ["--paragraph-docs", "--shard-tokens", 100_000, "--name", "m"]
    base = peak_rss_mb(["--input", small, "--out-dir", new_dir("memory_small"), *args], **env)
    peak = peak_rss_mb(["--input", large, "--out-dir", new_dir("memory_large"), *args], **env)
    # Measured here: +5 MB streaming; the old whole-corpus version +500 MB (text, then tokens as ints).
    assert peak - base < 0.5 * size_mb, f"peak RSS {peak:.0f} MB on {size_mb:.0f} MB of text, {base:.0f} MB on 3 MB"


def test_error_unreadable_file():
    import socket
    folder = new_dir("unreadable_in")
    path = os.path.join(folder, "sock.txt")  # open() fails on a socket, even for root (unlike chmod 000)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    try:
        check_error("unreadable", ["--input", path], [path, "cannot read"])
    finally:
        sock.close()


def test_error_not_utf8_names_line_and_offset():
    path = os.path.join(new_dir("binary_para"), "para.txt")
    good = ("a line of text\n" * 200 + "\n") * 5  # 15,005 bytes, 1,005 lines
    open(path, "wb").write(good.encode() + b"ok \xc3\x28 bad\n")
    env = dict(os.environ, PREPARE_DATA_READ_BYTES="4096")  # the bad byte is in a later piece
    rc, _, err = run("--input", path, "--paragraph-docs", "--out-dir", new_dir("binary_para_out"), env=env)
    want = f"offset {len(good) + 3}, line {good.count(chr(10)) + 1}"
    assert rc == 1 and path in err and want in err and "Traceback" not in err, f"want {want!r}: {err!r}"


def test_error_jsonl_not_json():
    path = os.path.join(new_dir("badjson_in"), "bad.jsonl")
    open(path, "w").write('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken\n')
    check_error("badjson", ["--input", path], [f"{path}:3", "not a JSON line"])


def test_error_jsonl_missing_field():
    path = os.path.join(new_dir("nofield_in"), "nofield.jsonl")
    open(path, "w").write('{"text": "fine"}\n{"body": "no text field"}\n')
    check_error("nofield", ["--input", path], [f"{path}:2", "'text'", "--jsonl-field"])


def test_error_parquet_missing_column():
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise harness.Skip("pyarrow is not installed (scripts/requirements.txt lists it)")
    path = os.path.join(new_dir("nocol_in"), "nocol.parquet")
    pq.write_table(pyarrow.table({"body": ["a", "b"]}), path)
    check_error("nocol", ["--input", path], [path, "'text'", "--parquet-column"])


def test_error_later_input_keeps_written_shards_valid():
    harness.need_ranks()
    src = new_dir("later_in")
    write_jsonl(os.path.join(src, "a.jsonl"), make_docs(2000))
    open(os.path.join(src, "b.jsonl"), "w").write('{"text": "fine"}\nnot json\n')
    out = new_dir("later_out")
    rc, _, err = run_env(["--input", src, "--out-dir", out, "--name", "l", "--shard-tokens", 20000, "--val-fraction", 0],
                         PREPARE_DATA_BATCH_CHARS=5000)  # the bad line is read after the first shards are written
    bad = os.path.join(src, "b.jsonl")
    assert rc == 1 and f"{bad}:2" in err and "Traceback" not in err, err
    written = shards(out, "l", "train")
    assert written, "no shard was written before the bad input"
    for p in written:
        header, tokens = read_raw(p)
        assert len(tokens) == 20000, f"{p}: {len(tokens)} tokens, not a full shard"
    left = [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert not left, f"temporary files left: {left}"


def test_error_hf_dataset_without_datasets_or_network():
    rc, _, err = run("--hf-dataset", "no-such-user/no-such-dataset-for-this-test", "--out-dir", new_dir("hf"))
    assert rc == 1 and "Traceback" not in err, f"exit {rc}: {err}"
    assert "`datasets`" in err or "online" in err, err


# ---- cases added from mutation testing (each names the mistake it catches) ------------------------------

def random_docs(rng, n, tag="doc"):
    """n fresh documents of random words (some non-ASCII, a literal <|endoftext|>), 3..40 words each."""
    words = ["the", "river", "Fluß", "日本語", "naïve", "ends", "<|endoftext|>", "42", "tokens", "café", "\t", "x"]
    return [f"{tag} {i}: " + " ".join(words[int(k)] for k in rng.integers(0, len(words), size=int(rng.integers(3, 41))))
            + "\n" for i in range(n)]


def limited_file_size(nbytes):
    """A preexec_fn: the child's files cannot grow past nbytes, as on a full disk (a write fails with EFBIG;
    Python ignores SIGXFSZ)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return limit


def test_write_shard_refuses_what_uint16_cannot_hold():
    from shard_format import ShardError, write_shard
    # Tokens are stored as uint16: 65536 or -1 would wrap silently to another token (0 or 65535), so they
    # are refused, as is an empty shard (the header count must be > 0); both ends of the range are kept.
    rng = np.random.default_rng()
    folder = new_dir("refuse")
    path = os.path.join(folder, "x.bin")
    good = rng.integers(0, 2**16, size=int(rng.integers(2, 500)))
    good[:2] = (0, 2**16 - 1)
    for bad, word in ((np.append(good, 2**16), "uint16"), (np.append(good, -1), "uint16"),
                      (np.array([], dtype=np.int64), "1 to")):
        try:
            write_shard(path, bad)
        except ShardError as err:
            assert word in str(err) and path in str(err), f"message: {err}"
        else:
            raise AssertionError(f"write_shard accepted {bad.size} tokens from {bad.min(initial=0)} to "
                                 f"{bad.max(initial=0)}")
        assert os.listdir(folder) == [], f"a refused shard left {os.listdir(folder)}"
    write_shard(path, good)
    assert read_raw(path)[1].tolist() == good.tolist(), "tokens 0..65535 do not read back as written"


def test_read_shard_refuses_short_and_empty_files():
    from shard_format import ShardError, read_shard
    # A file shorter than the header is refused by its size (not an IndexError on the missing ints, which
    # make_continuation_eval.py would show as a traceback), and a header counting 0 tokens is not a shard.
    folder = new_dir("short")
    head = np.zeros(256, dtype="<i4")
    head[:3] = (MAGIC, VERSION, 1)
    cases = {"empty": (b"", "shorter than"), "two_ints": (head[:2].tobytes(), "shorter than"),
             "no_count": (head[:3].tobytes()[:10], "shorter than"), "one_short": (head.tobytes()[:-4], "shorter than")}
    for count in (0, -1):
        head[2] = count
        cases[f"count{count}"] = (head.tobytes(), f"token count {count}")
    for name, (data, word) in cases.items():
        path = os.path.join(folder, name + ".bin")
        open(path, "wb").write(data)
        try:
            read_shard(path)
        except ShardError as err:
            assert word in str(err) and path in str(err), f"{name}: message {err}"
        else:
            raise AssertionError(f"{name}: read_shard accepted a {len(data)}-byte file")


def test_write_shard_failure_keeps_the_previous_shard():
    # A write that fails half way (disk full) leaves the shard that was there, and no temporary file: the
    # data goes to a temporary name renamed at the end. A finished shard gets the usual 0666 & ~umask mode
    # (the temporary file starts 0600: a shard only its owner could read).
    folder = new_dir("keep")
    path = os.path.join(folder, "x_train_000000.bin")
    from shard_format import write_shard
    before = np.random.default_rng().integers(0, 2**16, size=100)
    write_shard(path, before)
    umask = os.umask(0)
    os.umask(umask)
    mode = os.stat(path).st_mode & 0o777
    assert mode == 0o666 & ~umask, f"mode {mode:o}, want {0o666 & ~umask:o} (umask {umask:o})"
    old = open(path, "rb").read()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; from shard_format import write_shard; "
            "write_shard(sys.argv[2], np.arange(5000))")
    p = subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "scripts"), path], capture_output=True,
                       text=True, timeout=60, preexec_fn=limited_file_size(4096))  # the new shard needs 11024
    assert p.returncode != 0 and "File too large" in p.stderr, f"exit {p.returncode}: {p.stderr.strip()}"
    assert open(path, "rb").read() == old, "the failed write changed or removed the previous shard"
    assert os.listdir(folder) == ["x_train_000000.bin"], f"left {sorted(os.listdir(folder))}"


def test_leading_split_at_exactly_the_fraction():
    harness.need_ranks()
    # --val-split leading: the fewest leading documents that hold >= the fraction of the tokens. The corpus
    # is `copies` copies of a block of fresh documents and the fraction 1/copies, so the first block holds
    # exactly the fraction: val is that block and no more, also when the block is one document and the cut
    # falls exactly where the last document starts (which must not be refused as "train empty").
    rng = np.random.default_rng()
    for n_block, copies in ((1, 2), (int(rng.integers(2, 6)), 4)):
        block = random_docs(rng, n_block)
        docs = block * copies
        src, out = new_dir("exact_in"), new_dir("exact_out")
        write_jsonl(os.path.join(src, "e.jsonl"), docs)
        run_ok("--input", os.path.join(src, "e.jsonl"), "--out-dir", out, "--val-split", "leading",
               "--val-fraction", 1 / copies)
        tokens, n_val = stream(out, "e")
        assert np.array_equal(tokens, expected_tokens(docs)), "the stream differs from the documents"
        want = len(expected_tokens(block))
        assert n_val == want, f"{n_block} x {copies} documents: {n_val} val tokens, want the first block's {want}"


def test_error_out_of_range_numbers():
    # refused before any work: a negative fraction (it would silently mean no val), --shard-tokens 0 (a
    # shard that never fills: the run would loop for ever), --workers 0 (a division by zero at the end)
    for tag, flag, value in (("negfrac", "--val-fraction", -0.1), ("zeroshard", "--shard-tokens", 0),
                             ("zeroworkers", "--workers", 0)):
        check_error(tag, ["--input", small_text(), "--paragraph-docs", flag, value], [flag], timeout=60)


def test_full_disk_stops_cleanly_and_the_run_continues():
    harness.need_ranks()
    # A full disk (a file-size limit: a write fails with EFBIG) stops the run with one line and status 1, not
    # a traceback or 0, and leaves the shards and the manifest written before it whole: the same command then
    # continues to the shards of a run that never failed. The limit lets 100-token shards (1224 bytes)
    # through but not the manifest once it lists enough of them.
    src = new_dir("full_in")
    write_jsonl(os.path.join(src, "f.jsonl"), random_docs(np.random.default_rng(), 400))
    args = ["--input", os.path.join(src, "f.jsonl"), "--shard-tokens", 100, "--workers", 1]
    whole, out = new_dir("full_whole"), new_dir("full_out")
    run_ok(*args, "--out-dir", whole)
    want = bins(whole)
    p = subprocess.run([sys.executable, SCRIPT, *map(str, args), "--out-dir", out], capture_output=True, text=True,
                       timeout=300, preexec_fn=limited_file_size(2048))
    msg = p.stderr.strip()
    assert p.returncode == 1, f"exit {p.returncode}: {msg}"
    assert "Traceback" not in msg and "\n" not in msg and "prepare_data.py: error:" in msg, msg
    done = bins(out)
    assert 0 < len(done) < len(want), f"{len(done)} of {len(want)} files before the disk filled"
    for name in done:
        read_raw(os.path.join(out, name))  # whole, valid shards
    rc, log, err = run(*args, "--out-dir", out)
    assert rc == 0 and "continuing the run" in log, f"exit {rc}: {err.strip()}"
    assert bins(out) == want, "the continued run wrote other shards than a run that never failed"
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")], f"left {sorted(os.listdir(out))}"


def test_failed_split_leaves_no_shards():
    harness.need_ranks()
    # A drawn split that draws no document for val fails at the end, after train shards were written: they
    # are removed with the manifest, or a later glob of <name>_train_*.bin would take them as a dataset.
    # (--seed 3: under the default seed 0 the hash of document 0 is 0, so it is drawn at any fraction.)
    src = new_dir("nodraw_in")
    write_jsonl(os.path.join(src, "n.jsonl"), random_docs(np.random.default_rng(), 300))
    folder = new_dir("nodraw_out")
    rc, _, err = run("--input", os.path.join(src, "n.jsonl"), "--out-dir", folder, "--shard-tokens", 500,
                     "--val-fraction", 1e-9, "--seed", 3)
    assert rc == 1 and "val would be empty" in err and "Traceback" not in err, f"exit {rc}: {err.strip()}"
    assert os.listdir(folder) == [], f"a failed run left {sorted(os.listdir(folder))}"


def test_continuing_refuses_other_shard_tokens_or_a_missing_shard():
    harness.need_ranks()
    # The manifest of a stopped run decides what continues it: another --shard-tokens (or --seed) would mix
    # shards of two sizes (or two splits), and a listed shard that was deleted would leave a hole; all three
    # are refused with the way out (--fresh), not continued.
    src = new_dir("refuse_in")
    write_jsonl(os.path.join(src, "r.jsonl"), random_docs(np.random.default_rng(), 1500))
    out = new_dir("refuse_out")
    args = ["--input", os.path.join(src, "r.jsonl"), "--out-dir", out, "--val-fraction", 0.2]
    rc, _, err = run_env([*args, "--shard-tokens", 3000], PREPARE_DATA_STOP_AFTER_SHARDS=2)
    assert rc == 3, f"exit {rc}: {err.strip()}"
    for changed in (["--shard-tokens", 2000], ["--shard-tokens", 3000, "--seed", 5]):
        rc, _, err = run(*args, *changed)
        assert rc == 1 and "other arguments" in err and "--fresh" in err, f"{changed}: exit {rc}: {err.strip()}"
    victim = sorted(n for n in bins(out) if "_000000" in n)[0]
    os.remove(os.path.join(out, victim))
    rc, _, err = run(*args, "--shard-tokens", 3000)
    assert rc == 1 and victim in err and "missing" in err and "--fresh" in err, f"exit {rc}: {err.strip()}"


def test_every_shard_but_the_last_holds_shard_tokens():
    harness.need_ranks()
    # Documents reach the splits in batches (here about one document each), so a batch often ends a token or
    # two short of a full shard; shards are still cut at exactly --shard-tokens, the last of each split fewer.
    rng = np.random.default_rng()
    src, out = new_dir("sizes_in"), new_dir("sizes_out")
    docs = random_docs(rng, 200)
    write_jsonl(os.path.join(src, "z.jsonl"), docs)
    size = int(rng.integers(5, 40))
    rc, _, err = run_env(["--input", os.path.join(src, "z.jsonl"), "--out-dir", out, "--shard-tokens", size,
                          "--val-fraction", 0.3, "--workers", 1], PREPARE_DATA_BATCH_CHARS=1)
    assert rc == 0, err
    total = 0
    for split in ("val", "train"):
        sizes = [len(read_raw(p)[1]) for p in shards(out, "z", split)]
        assert sizes and sizes[:-1] == [size] * (len(sizes) - 1) and 1 <= sizes[-1] <= size, \
            f"--shard-tokens {size}: {split} shards of {sizes}"
        total += sum(sizes)
    assert total == len(expected_tokens(docs)), f"{total} tokens, want {len(expected_tokens(docs))}"


def blank_line_documents(text):
    """The documents of --paragraph-docs, by lines (not the script's regex): a document ends after a blank
    line, "\\n" or "\\r\\n", that follows another line of the same document."""
    lines, start = [], 0
    while start < len(text):
        i = text.find("\n", start)
        end = len(text) if i < 0 else i + 1
        lines.append(text[start:end])
        start = end
    docs, cur = [], []
    for ln in lines:
        cur.append(ln)
        if len(cur) > 1 and ln in ("\n", "\r\n"):
            docs.append("".join(cur))
            cur = []
    return docs + (["".join(cur)] if cur else [])


def test_crlf_blank_lines_end_paragraphs():
    harness.need_ranks()
    # A text file from Windows ends its lines in "\r\n": its blank lines end paragraphs as "\n\n" does (else
    # the whole file is one document). Lines end in either, at random; the file is read 64 bytes at a time,
    # so separators fall across the pieces. The file ends in a blank line and one more character, which the
    # reader holds back until the end of the file ("a\n\nb" is two documents, as split_paragraphs says).
    rng = np.random.default_rng()
    nl = lambda: "\r\n" if rng.random() < 0.5 else "\n"  # noqa: E731
    text = ""
    for i, doc in enumerate(random_docs(rng, 40)):
        text += "".join(doc[:-1] + f" line {k}" + nl() for k in range(int(rng.integers(1, 4))))
        text += "".join(nl() for _ in range(0 if i == 39 else int(rng.integers(1, 3))))
    text = text.rstrip("\r\n") + "\n\nX"  # a blank line in the last 3 characters
    path = os.path.join(new_dir("crlf_in"), "crlf.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    docs = blank_line_documents(text)
    assert len(docs) >= 40 and "".join(docs) == text, "the test's own split is wrong"
    out = new_dir("crlf_out")
    rc, _, err = run_env(["--input", path, "--paragraph-docs", "--out-dir", out, "--val-fraction", 0],
                         PREPARE_DATA_READ_BYTES=64)
    assert rc == 0, err
    check_stream(out, "crlf", docs)


def test_empty_documents_are_skipped():
    harness.need_ranks()
    # An empty text file and an empty JSONL "text" are no documents: each would add a lone <|endoftext|>
    rng = np.random.default_rng()
    docs = random_docs(rng, 6)
    src = new_dir("empty_in")
    open(os.path.join(src, "a.txt"), "w", encoding="utf-8").write(docs[0])
    open(os.path.join(src, "b.txt"), "w").close()
    with open(os.path.join(src, "c.jsonl"), "w", encoding="utf-8") as f:
        import json
        for d in ["", *docs[1:4], "", "", *docs[4:], ""]:
            f.write(json.dumps({"text": d}) + "\n")
    out = new_dir("empty_out")
    run_ok("--input", src, "--out-dir", out, "--name", "e", "--val-fraction", 0)
    check_stream(out, "e", docs)


harness.run_module(globals())
