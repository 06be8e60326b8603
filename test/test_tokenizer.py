"""test_tokenizer.py: the token table scripts/prepare_data.py writes, read by the C decoder
(data/tokenizer.h through build/test_tokenizer --dump / --decode), against tiktoken's GPT-2 encoding.

Offline: the BPE ranks come from the shared data folder ($SHARED_DATA_DIR, default ../shared/data),
as in test_prepare_data.py. Checks: the header; every one of the 50,257 tokens decodes to
tiktoken's bytes for it; a long mixed-Unicode text (Tiny Shakespeare with accented Latin, Greek,
Cyrillic, CJK, emoji, combining marks and control characters spliced in), encoded by tiktoken,
decodes back to its exact UTF-8 bytes; llm.c's version-1 layout (no end-of-text field) reads too.
"""
import os
import struct
import subprocess
import sys
import tempfile

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(REPO, BUILD, "test_tokenizer")
SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")
SHARED = os.environ.get("SHARED_DATA_DIR", os.path.join(REPO, "..", "shared", "data"))
SHAKESPEARE = os.path.join(SHARED, "tinyshakespeare.txt")
if os.path.isdir(SHARED):
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.join(SHARED, "tiktoken_cache")
_tmp = tempfile.TemporaryDirectory(prefix="test_tokenizer_")
MIXED = ("Ça va? Ελληνικά, русский текст, 日本語のテキスト, 中文字符, 한국어, emoji 🚀🧪👩‍👩‍👧, "
         "e\u0301 (combining), tabs\tand\r\nCRLF, zero\u200bwidth, \x00\x07 control, «quotes» — dash… ")


def need_shared():
    if not os.path.isfile(SHAKESPEARE):
        raise harness.Skip(f"shared data not found at {SHARED} (set SHARED_DATA_DIR)")
    if not os.path.exists(TOOL):
        raise harness.Skip(f"{TOOL} not built (make {BUILD}/test_tokenizer)")


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
    need_shared()
    with open(table(), "rb") as f:
        header = struct.unpack("<256I", f.read(1024))
    assert header[:4] == (20240328, 2, 50257, 50256), f"header starts {header[:4]}"
    assert not any(header[4:]), "header words 4..255 are not zero"


def test_every_token_decodes_to_tiktoken_bytes():
    need_shared()
    p = subprocess.run([TOOL, "--dump", table()], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = p.stdout.decode().split("\n")[:-1]
    enc = encoding()
    assert len(lines) == enc.n_vocab == 50257, f"{len(lines)} tokens dumped"
    bad = [i for i, line in enumerate(lines) if bytes.fromhex(line) != enc.decode_single_token_bytes(i)]
    assert not bad, f"{len(bad)} tokens differ, first {bad[:5]}"


def test_mixed_unicode_text_round_trips():
    need_shared()
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
    need_shared()
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
