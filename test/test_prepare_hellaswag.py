"""test_prepare_hellaswag.py: tests of scripts/prepare_hellaswag.py (run from the repo root).

Runs the script as a subprocess on the hand-written fixture test/data/hellaswag_tiny.jsonl (invented
sentences in HellaSwag's JSONL layout) and on bad inputs made here, offline. The cases that tokenize
need the shared tiktoken cache of the GPT-2 BPE ranks (test/harness.py: $SHARED_DATA_DIR) and skip
without it; the error cases and the reader's checks need neither and always run. The file's header and
first example are also parsed here with numpy, independently of the script's read_eval_file().
"""
import functools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import harness  # first: points TIKTOKEN_CACHE_DIR at the shared ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "prepare_hellaswag.py")
FIXTURE = os.path.join(REPO, "test", "data", "hellaswag_tiny.jsonl")
MAGIC, VERSION, START = 20240522, 1, 65535

sys.path.insert(0, os.path.join(REPO, "scripts"))
import prepare_hellaswag as ph  # noqa: E402

_tmp = tempfile.TemporaryDirectory(prefix="test_prepare_hellaswag_")  # removed at exit


@functools.lru_cache(maxsize=None)
def encoding():
    import tiktoken
    return tiktoken.get_encoding("r50k_base")


def run(*args, env=None):
    """Runs prepare_hellaswag.py; returns (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def new_dir(tag):
    return tempfile.mkdtemp(prefix=tag + "_", dir=_tmp.name)


def fixture_lines():
    with open(FIXTURE, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def fixture_file():
    """The fixture prepared once: (path of the eval file, stdout)."""
    harness.need_ranks()
    out = os.path.join(new_dir("fixture"), "tiny.bin")
    rc, stdout, err = run("--input", FIXTURE, "--output", out)
    assert rc == 0, f"exit {rc}: {err.strip()}"
    return out, stdout


def context_of(obj):
    if "ctx" in obj:
        return obj["ctx"]
    return obj["ctx_a"] + (" " + obj["ctx_b"] if obj["ctx_b"] else "")


def test_round_trip_fixture():
    path, _ = fixture_file()
    enc = encoding()
    got = ph.read_eval_file(path)
    want = fixture_lines()
    assert 3 <= len(want) <= 5, "the fixture should hold 3-5 examples"
    assert got["num_examples"] == len(want), f"{got['num_examples']} examples, want {len(want)}"
    for i, (ex, obj) in enumerate(zip(got["examples"], want)):
        assert ex["index"] == i, f"example {i}: index {ex['index']}"
        assert ex["label"] == obj["label"], f"example {i}: label {ex['label']}, want {obj['label']}"
        ctx = enc.encode(context_of(obj), disallowed_special=())
        assert ex["context"] == ctx, f"example {i}: context tokens differ"
        ends = [enc.encode(" " + e, disallowed_special=()) for e in obj["endings"]]
        assert ex["completions"] == ends, f"example {i}: completion tokens differ"
        assert enc.decode(ex["completions"][obj["label"]]) == " " + obj["endings"][obj["label"]]


def test_ctx_a_ctx_b_and_endoftext_text():
    path, _ = fixture_file()
    enc = encoding()
    exs = ph.read_eval_file(path)["examples"]
    # line 1 has ctx and ctx_a/ctx_b (ctx wins, and equals them joined); line 4 only ctx_a with empty ctx_b
    assert enc.decode(exs[0]["context"]) == "A woman pours flour into a large bowl. she"
    assert enc.decode(exs[2]["context"]) == "A child sits on the steps holding one untied shoe."
    # a literal <|endoftext|> in the text is ordinary text, not the special token 50256
    assert 50256 not in exs[3]["context"] and "<|endoftext|>" in enc.decode(exs[3]["context"])


def test_header_fields_and_size():
    path, _ = fixture_file()
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    words = np.frombuffer(raw[1024:], dtype="<u2")
    n = len(fixture_lines())
    assert header[0] == MAGIC and header[1] == VERSION, f"magic {header[0]}, version {header[1]}"
    assert header[2] == n, f"header count {header[2]}, want {n}"
    assert not header[4:].any(), "header ints 4..255 not zero"
    # walk the examples by their byte counts (no reader of the script involved)
    pos, sizes = 0, []
    for i in range(n):
        assert words[pos] == START and words[pos + 2] == i, f"example {i}: {words[pos:pos + 3]}"
        sizes.append(int(words[pos + 1]))
        pos += int(words[pos + 1]) // 2
    assert pos == len(words), "bytes after the last example"
    assert header[3] == max(sizes), f"longest {header[3]}, want {max(sizes)}"
    assert len(raw) == 1024 + sum(sizes)


def test_first_example_words():
    path, _ = fixture_file()
    enc = encoding()
    obj = fixture_lines()[0]
    words = np.frombuffer(open(path, "rb").read()[1024:], dtype="<u2")
    ctx = enc.encode(obj["ctx"])
    ends = [enc.encode(" " + e) for e in obj["endings"]]
    want = [START, 0, 0, obj["label"], 4, len(ctx), *ctx]
    for e in ends:
        want += [len(e), *e]
    want[1] = 2 * len(want)
    assert words[:len(want)].tolist() == want, "first example's words differ from the layout"


def test_summary_printed():
    path, out = fixture_file()
    size = os.path.getsize(path)
    assert f"{len(fixture_lines())} examples" in out, out
    assert "tokens" in out and f"{size:,} bytes" in out, out


def check_error(tag, lines, words):
    """Writes lines (strings, or bytes written as they are) as a JSONL file, runs the script on it; it
    must fail with one line naming the file and line and holding every one of words, and leave no output
    (nor its temporary)."""
    d = new_dir(tag)
    src = os.path.join(d, "bad.jsonl")
    with open(src, "wb") as f:
        f.write(b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8") for x in lines) + b"\n")
    out = os.path.join(d, "out.bin")
    rc, stdout, err = run("--input", src, "--output", out)
    msg = err.strip()
    assert rc == 1, f"{tag}: exit {rc}, stderr {msg!r}"
    assert "\n" not in msg and "Traceback" not in msg, f"{tag}: not one line: {msg!r}"
    assert "bad.jsonl:" in msg, f"{tag}: the message names no file and line: {msg!r}"
    for w in words:
        assert w in msg, f"{tag}: {w!r} not in {msg!r}"
    assert os.listdir(d) == ["bad.jsonl"], f"{tag}: left {sorted(os.listdir(d))}"


GOOD = {"ctx": "A cat sits by the door. It", "endings": ["a", "b", "c", "d"], "label": 1, "ind": 1}


def line(**changes):
    obj = {k: v for k, v in GOOD.items() if k not in changes or changes[k] is not None}
    obj.update({k: v for k, v in changes.items() if v is not None})
    return json.dumps(obj)


def without(field):
    return json.dumps({k: v for k, v in GOOD.items() if k != field})


def test_error_not_json():
    check_error("not_json", [line(), "{not json"], ["bad.jsonl:2", "not JSON"])
    check_error("not_object", [line(), line(), "[1, 2]"], ["bad.jsonl:3", "not a JSON object"])


def test_error_missing_field():
    check_error("no_ctx", [without("ctx")], ["bad.jsonl:1", '"ctx"'])
    only_a = {k: v for k, v in GOOD.items() if k != "ctx"}
    only_a["ctx_a"] = "A cat sits by the door."
    check_error("no_ctx_b", [json.dumps(only_a)], ["bad.jsonl:1", 'missing field "ctx"'])
    check_error("no_endings", [line(), without("endings")], ["bad.jsonl:2", '"endings"'])
    check_error("no_label", [line(), line(), without("label")], ["bad.jsonl:3", '"label"'])


def test_error_not_four_endings():
    check_error("three", [line(endings=["a", "b", "c"])], ["bad.jsonl:1", "3 strings, not 4"])
    check_error("five", [line(), line(endings=list("abcde"))], ["bad.jsonl:2", "5 strings, not 4"])
    check_error("not_strings", [line(endings=["a", "b", "c", 4])], ["bad.jsonl:1", "not a list of strings"])


def test_error_label_out_of_range():
    check_error("label4", [line(label=4)], ["bad.jsonl:1", "out of range"])
    check_error("label_neg", [line(), line(label=-1)], ["bad.jsonl:2", "out of range"])
    check_error("label_text", [line(label="x")], ["bad.jsonl:1", "not an integer"])
    check_error("label_bool", [line(label=True)], ["bad.jsonl:1", "not an integer"])


def test_error_empty_context_and_empty_file():
    check_error("empty_ctx", [line(ctx="  ")], ["bad.jsonl:1", "context is empty"])
    check_error("empty_file", [""], ["bad.jsonl:", "no example"])


def test_error_not_utf8():
    # a line that is not UTF-8 is an error naming its line, not a line skipped (an example lost unseen)
    check_error("not_utf8", [line(), line(ctx="A cat sits by the door.").encode() + b"\xff\xfe"],
                ["bad.jsonl:2", "not UTF-8"])


def test_error_keeps_an_existing_output():
    d = new_dir("keep")
    out = os.path.join(d, "out.bin")
    open(out, "wb").write(b"previous")
    src = os.path.join(d, "bad.jsonl")
    open(src, "w").write(line(label=9) + "\n")
    rc, _, err = run("--input", src, "--output", out)
    assert rc == 1 and open(out, "rb").read() == b"previous", f"exit {rc}: {err.strip()}"
    assert not os.path.exists(out + ".tmp")


def test_error_offline_without_input():
    d = new_dir("offline")
    env = dict(os.environ, PREPARE_HELLASWAG_URL="http://127.0.0.1:9/hellaswag_val.jsonl")
    rc, _, err = run("--output", os.path.join(d, "val.bin"), env=env)
    msg = err.strip().splitlines()[-1] if err.strip() else ""
    assert rc == 1, f"exit {rc}: {err.strip()}"
    assert "offline" in msg and "--input" in msg and "Traceback" not in err, f"message: {err.strip()!r}"
    assert not os.path.exists(os.path.join(d, "val.bin"))


def random_words(rng, n):
    words = ["the", "dog", "runs", "across", "a", "field", "café", "naïve", "ends", "It", "then", "42", "-"]
    return " ".join(words[int(k)] for k in rng.integers(0, len(words), size=n))


def test_ctx_a_and_ctx_b_joined_with_a_space():
    harness.need_ranks()
    # without "ctx", the context is ctx_a + " " + ctx_b, as HellaSwag builds "ctx" (the fixture only has
    # ctx_a with an empty ctx_b); labels stored as strings are read as integers. Fresh examples every run.
    rng = np.random.default_rng()
    objs = []
    for i in range(6):
        a, b = random_words(rng, int(rng.integers(3, 12))) + ".", random_words(rng, int(rng.integers(1, 4)))
        label = int(rng.integers(0, 4))
        objs.append({"ctx_a": a, "ctx_b": b, "label": str(label) if i % 2 else label,
                     "endings": [random_words(rng, int(rng.integers(1, 8))) for _ in range(4)]})
    d = new_dir("ctx_ab")
    src, out = os.path.join(d, "ab.jsonl"), os.path.join(d, "ab.bin")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(o) + "\n" for o in objs)
    rc, _, err = run("--input", src, "--output", out)
    assert rc == 0, f"exit {rc}: {err.strip()}"
    enc = encoding()
    for i, (ex, obj) in enumerate(zip(ph.read_eval_file(out)["examples"], objs)):
        want = enc.encode(obj["ctx_a"] + " " + obj["ctx_b"])
        assert ex["context"] == want, f"example {i}: context {enc.decode(ex['context'])!r}"
        assert ex["label"] == int(obj["label"]), f"example {i}: label {ex['label']}, want {obj['label']}"


def limited_file_size(nbytes):
    """A preexec_fn: files the child writes cannot grow past nbytes, as on a full disk (the write fails
    with EFBIG; Python ignores SIGXFSZ)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return limit


def test_write_failure_keeps_the_previous_output():
    harness.need_ranks()
    # a write that fails half way (disk full) must leave the previous eval file as it was and no temporary
    # beside it, and say so in one line: the file is written under a temporary name and renamed
    d = new_dir("full")
    out = os.path.join(d, "val.bin")
    open(out, "wb").write(b"previous")
    p = subprocess.run([sys.executable, SCRIPT, "--input", FIXTURE, "--output", out], capture_output=True,
                       text=True, timeout=120, preexec_fn=limited_file_size(1100))  # the fixture needs > 1100
    msg = p.stderr.strip()
    assert p.returncode == 1, f"exit {p.returncode}: {msg!r}"
    assert "\n" not in msg and "Traceback" not in msg and "prepare_hellaswag.py: error:" in msg, msg
    assert open(out, "rb").read() == b"previous", "the previous output was overwritten or removed"
    assert os.listdir(d) == ["val.bin"], f"left {sorted(os.listdir(d))}"


# ---- the reader, on files from the script's writer with made-up tokens (no tiktoken needed) ----------

STAND_IN = [([10, 11, 12], [[1], [2, 3], [4, 5, 6], [7]], 2),
            ([20], [[21, 22], [23], [24], [25, 26, 27, 28]], 0),
            ([30, 31], [[50256], [0], [33], [34]], 3)]


def stand_in_file(tag):
    path = os.path.join(new_dir(tag), "s.bin")
    ph.write_eval_file(path, STAND_IN)
    return path


def expect_reject(path, words):
    try:
        ph.read_eval_file(path)
    except ph.EvalFormatError as err:
        for w in words:
            assert w in str(err), f"{w!r} not in {str(err)!r}"
        return
    raise AssertionError(f"{path}: accepted, expected a rejection with {words}")


def patched(path, offset, value, dtype):
    """A copy of path with one value overwritten at byte offset."""
    raw = bytearray(open(path, "rb").read())
    b = np.array([value], dtype=dtype).tobytes()
    raw[offset:offset + len(b)] = b
    out = path + f".{offset}.bin"
    open(out, "wb").write(raw)
    return out


def test_writer_reader_round_trip():
    path = stand_in_file("rt")
    got = ph.read_eval_file(path)
    assert got["num_examples"] == 3
    for i, (ex, (ctx, ends, label)) in enumerate(zip(got["examples"], STAND_IN)):
        assert (ex["index"], ex["label"], ex["context"], ex["completions"]) == (i, label, ctx, ends)
    # example 0: 6 fixed words + 3 context tokens + 4 counts + 7 completion tokens = 20 words (the longest)
    assert got["longest_bytes"] == 2 * 20 and os.path.getsize(path) == 1024 + 2 * (20 + 19 + 16)


def test_reader_rejects_bad_delimiter():
    path = stand_in_file("delim")
    second = 1024 + 2 * 20  # example 0 is 20 words
    expect_reject(patched(path, second, 65534, "<u2"), ["example 1", "delimiter 65534"])
    expect_reject(patched(path, 1024, 0, "<u2"), ["example 0", "delimiter 0"])


def test_reader_rejects_truncated_file():
    path = stand_in_file("trunc")
    raw = open(path, "rb").read()
    for cut in (len(raw) - 2, len(raw) - 20, 1024 + 2, 1000):
        short = path + f".cut{cut}"
        open(short, "wb").write(raw[:cut])
        expect_reject(short, ["truncated"] if cut > 1024 else ["shorter than"])
    longer = path + ".long"
    open(longer, "wb").write(raw + b"\0\0")
    expect_reject(longer, ["after the last"])


def test_reader_rejects_bad_header_and_fields():
    path = stand_in_file("hdr")
    expect_reject(patched(path, 0, 20240520, "<i4"), ["bad magic 20240520"])
    expect_reject(patched(path, 4, 2, "<i4"), ["version 2"])
    expect_reject(patched(path, 8, 4, "<i4"), ["truncated"])  # 4 examples claimed, 3 there
    expect_reject(patched(path, 12, 99, "<i4"), ["longest"])
    expect_reject(patched(path, 1024 + 4, 1, "<u2"), ["index 1, not 0"])
    expect_reject(patched(path, 1024 + 6, 4, "<u2"), ["label 4"])
    expect_reject(patched(path, 1024 + 2, 38, "<u2"), ["example 0", "does not fit its 38 bytes"])  # 2 short
    expect_reject(patched(path, 1024 + 2, 42, "<u2"), ["example 0", "left over"])  # 2 over
    expect_reject(patched(path, 1024 + 10, 30, "<u2"), ["context of 30 tokens"])


def test_reader_rejects_stray_words():
    # words the layout does not allow anywhere: a set header int past [3], a last odd byte, the delimiter
    # 65535 as a context or completion token (a reader that resynchronizes on it would split the example)
    path = stand_in_file("stray")
    expect_reject(patched(path, 4 * 4, 1, "<i4"), ["header ints 4..255"])
    expect_reject(patched(path, 4 * 255, 7, "<i4"), ["header ints 4..255"])
    odd = path + ".odd"
    open(odd, "wb").write(open(path, "rb").read() + b"\0")
    expect_reject(odd, ["odd number of bytes"])
    expect_reject(patched(path, 1024 + 2 * 6, START, "<u2"), ["example 0", "delimiter"])  # first context token
    expect_reject(patched(path, 1024 + 2 * 20 + 2 * 8, START, "<u2"), ["example 1", "delimiter"])  # a completion's


def test_writer_example_size_limit():
    # the length word is a uint16: an example of 65534 bytes (the largest even size) is written and read
    # back; one of 65536 is refused. 4 one-token completions take 14 words beside the context.
    d = new_dir("limit")
    path = os.path.join(d, "x.bin")
    size, longest = ph.write_eval_file(path, [([1] * (32767 - 14), [[1], [2], [3], [4]], 3)])
    assert longest == 65534 and size == 1024 + 65534, (size, longest)
    got = ph.read_eval_file(path)["examples"][0]
    assert len(got["context"]) == 32767 - 14 and got["completions"][3] == [4], "the largest example differs"
    try:
        ph.write_eval_file(path, [([1] * (32768 - 14), [[1], [2], [3], [4]], 0)])
    except ph.Fail as err:
        assert "65536 bytes" in str(err), str(err)
    else:
        raise AssertionError("an example of 65536 bytes was written")


def test_writer_refuses_what_the_format_cannot_hold():
    d = new_dir("refuse")
    for bad, words in [([([1] * 40000, [[1], [2], [3], [4]], 0)], ["longer than"]),
                       ([([], [[1], [2], [3], [4]], 0)], ["empty"]),
                       ([([1], [[1], [65535], [3], [4]], 0)], ["token outside"])]:
        try:
            ph.write_eval_file(os.path.join(d, "x.bin"), bad)
        except ph.Fail as err:
            assert all(w in str(err) for w in words), str(err)
        else:
            raise AssertionError(f"accepted {words}")
    assert os.listdir(d) == [], f"left {os.listdir(d)}"


if __name__ == "__main__":
    harness.run_module(globals())
