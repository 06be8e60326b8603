"""test_tokenizer.py: the token table scripts/prepare_data.py writes, read by the C decoder
(data/tokenizer.h through build/test_tokenizer --dump / --decode), against tiktoken's GPT-2 encoding.

Offline: the BPE ranks come from the shared data folder (test/harness.py: $SHARED_DATA_DIR, the
Makefile's SHARED_DATA, default ../shared/data), as in test_prepare_data.py. Checks, without the
ranks: a small table written by the script's writer from a stand-in encoding reads back byte for
byte, ids outside the vocabulary decode to a marker, a token the format cannot hold is refused and a
bad table is refused by the C tool with a message. With the ranks: the header; every one of the
50,257 tokens decodes to tiktoken's bytes for it; llm.c's version-1 layout (no end-of-text field)
reads too. With the ranks and Tiny Shakespeare: a long mixed-Unicode text (Tiny Shakespeare with
accented Latin, Greek, Cyrillic, CJK, emoji, combining marks and control characters spliced in),
encoded by tiktoken, decodes back to its exact UTF-8 bytes.
"""
import contextlib
import io
import os
import struct
import subprocess
import sys
import tempfile

import harness  # first: points TIKTOKEN_CACHE_DIR at the shared ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(REPO, BUILD, "test_tokenizer")
SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")
SHAKESPEARE = harness.SHAKESPEARE
_tmp = tempfile.TemporaryDirectory(prefix="test_tokenizer_")
MIXED = ("Ça va? Ελληνικά, русский текст, 日本語のテキスト, 中文字符, 한국어, emoji 🚀🧪👩‍👩‍👧, "
         "e\u0301 (combining), tabs\tand\r\nCRLF, zero\u200bwidth, \x00\x07 control, «quotes» — dash… ")


def need_tool():
    if not os.path.exists(TOOL):
        raise harness.Skip(f"{TOOL} not built (make {BUILD}/test_tokenizer)")


def need_ranks():
    harness.need_ranks()
    need_tool()


def prepare_data():
    """scripts/prepare_data.py as a module (its writer, without running it)."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import prepare_data as module
    return module


class StandInEncoding:
    """What write_tokenizer() reads of a tiktoken encoding, for a few tokens, without the BPE ranks."""

    def __init__(self, tokens, eot):
        self.tokens, self.n_vocab, self.eot_token = tokens, len(tokens), eot

    def decode_single_token_bytes(self, token):
        return self.tokens[token]


# "€" (E2 82 AC) split over two tokens, a NUL byte, the longest token the format holds, end-of-text.
STAND_IN = [b"Hello", b" \xe2\x82", b"\xac!", b"\x00", bytes(range(1, 256)), b"<|endoftext|>"]


def write_stand_in(name, tokens, eot):
    path = os.path.join(_tmp.name, name)
    with contextlib.redirect_stdout(io.StringIO()):  # its "wrote ..." line
        prepare_data().write_tokenizer(path, StandInEncoding(tokens, eot))
    return path


def test_writer_and_c_reader_agree_without_the_ranks():
    need_tool()
    path = write_stand_in("stand_in.bin", STAND_IN, 5)
    with open(path, "rb") as f:
        header = struct.unpack("<256I", f.read(1024))
    assert header[:4] == (20240328, 2, 6, 5) and not any(header[4:]), f"header starts {header[:4]}"
    p = subprocess.run([TOOL, "--dump", path], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert [bytes.fromhex(line) for line in p.stdout.decode().split("\n")[:-1]] == STAND_IN, p.stdout
    p = subprocess.run([TOOL, "--decode", path], input=b"0 1 2 3 5 6 -1", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    want = b"Hello \xe2\x82\xac!\x00<|endoftext|><|bad token 6|><|bad token -1|>"
    assert p.stdout == want, f"decoded {p.stdout!r}, want {want!r}"


def test_writer_refuses_a_token_the_format_cannot_hold():
    prep = prepare_data()
    for bad, size in ((b"", 0), (b"x" * 256, 256)):
        name = f"refused_{size}.bin"
        try:
            write_stand_in(name, [b"a", bad, b"<|endoftext|>"], 2)
        except prep.Fail as err:
            assert f"token 1 has {size} bytes" in str(err), f"message: {err}"
        else:
            raise AssertionError(f"write_tokenizer wrote a table holding a token of {size} bytes")
        left = [f for f in os.listdir(_tmp.name) if f.startswith(name)]
        assert not left, f"a refused table left {left}"


def test_c_tool_refuses_a_bad_table():
    need_tool()
    path = os.path.join(_tmp.name, "garbage.bin")
    with open(path, "wb") as f:
        f.write(b"not a token table")
    for args in (["--dump", path], ["--decode", path], ["--decode", path + ".missing"]):
        p = subprocess.run([TOOL, *args], input=b"1 2", capture_output=True, timeout=60)
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and not p.stdout and args[1] in err, (args, p.returncode, p.stdout, err)


_table = {}


def table():
    """Runs prepare_data.py once on a small mixed text; returns the path of its gpt2_tokenizer.bin."""
    if "path" not in _table:
        src = os.path.join(_tmp.name, "mixed.txt")
        with open(src, "w", encoding="utf-8", newline="") as f:
            f.write(MIXED * 20)
        out = os.path.join(_tmp.name, "out")
        p = subprocess.run([sys.executable, SCRIPT, "--input", src, "--out-dir", out, "--val-fraction", "0"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"prepare_data.py exit {p.returncode}: {p.stderr.strip()}"
        _table["path"] = os.path.join(out, "gpt2_tokenizer.bin")
    return _table["path"]


def encoding():
    import tiktoken
    return tiktoken.get_encoding("r50k_base")


def test_header():
    need_ranks()
    with open(table(), "rb") as f:
        header = struct.unpack("<256I", f.read(1024))
    assert header[:4] == (20240328, 2, 50257, 50256), f"header starts {header[:4]}"
    assert not any(header[4:]), "header words 4..255 are not zero"


def test_every_token_decodes_to_tiktoken_bytes():
    need_ranks()
    p = subprocess.run([TOOL, "--dump", table()], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = p.stdout.decode().split("\n")[:-1]
    enc = encoding()
    assert len(lines) == enc.n_vocab == 50257, f"{len(lines)} tokens dumped"
    bad = [i for i, line in enumerate(lines) if bytes.fromhex(line) != enc.decode_single_token_bytes(i)]
    assert not bad, f"{len(bad)} tokens differ, first {bad[:5]}"


def test_mixed_unicode_text_round_trips():
    need_ranks()
    harness.need_shakespeare()
    with open(SHAKESPEARE, encoding="utf-8", newline="") as f:
        text = f.read()
    pieces = [text[i:i + 5000] + MIXED for i in range(0, len(text), 5000)]
    text = "".join(pieces) + "<|endoftext|>"
    enc = encoding()
    ids = enc.encode(text, allowed_special={"<|endoftext|>"})
    p = subprocess.run([TOOL, "--decode", table()], input=" ".join(map(str, ids)).encode(), capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    want = text.encode("utf-8")
    assert p.stdout == want, (f"decoded {len(p.stdout)} bytes, want {len(want)}; first difference at byte "
                              f"{next((i for i, (a, b) in enumerate(zip(p.stdout, want)) if a != b), None)}")


def test_llmc_version_1_layout():
    need_ranks()
    with open(table(), "rb") as f:
        data = bytearray(f.read())
    data[4:8] = struct.pack("<I", 1)
    data[12:16] = struct.pack("<I", 0)  # version 1 files have no end-of-text field
    path = os.path.join(_tmp.name, "v1.bin")
    with open(path, "wb") as f:
        f.write(data)
    p = subprocess.run([TOOL, "--decode", path], input=b"15496 11 995 50256", capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"Hello, world<|endoftext|>", (p.returncode, p.stdout, p.stderr)


harness.run_module(globals())
