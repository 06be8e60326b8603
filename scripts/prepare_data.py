#!/usr/bin/env python3
"""prepare_data.py: tokenize text into token shards for train_gpt, streaming, on several processes.

Text is encoded with tiktoken's GPT-2 encoding (r50k_base). Every document is preceded
by the end-of-text token 50256; inside a document, a literal "<|endoftext|>" string is
ordinary text (encode_ordinary). The token stream is written as shards in llm.c's format
(see shard_format.py), each as soon as it is full, so memory stays at a few shards whatever
the size of the corpus:

    <out-dir>/<name>_val_000000.bin, ...         the validation documents, cut every --shard-tokens tokens
    <out-dir>/<name>_train_000000.bin, ...       the other documents, cut every --shard-tokens tokens
    <out-dir>/<name>_manifest.json               progress (after every shard) and the final summary
    <out-dir>/gpt2_tokenizer.bin                 the token table, for printing samples (below)

Inputs (--input, any mix): text files (one document each, or one per blank-line-separated paragraph
with --paragraph-docs); folders, searched recursively for files ending in --ext; globs ('**' recurses);
JSONL files (*.jsonl: one JSON object per line, the document in --jsonl-field); Parquet files
(*.parquet, through pyarrow: the document in --parquet-column). --hf-dataset NAME streams a Hugging
Face dataset instead (needs the `datasets` package and a network).

Validation split (--val-split): "drawn" (the default, except for Tiny Shakespeare) sends document i to
val when a hash of (i, --seed) falls below --val-fraction, so val is spread over the whole corpus,
holds about that fraction of the tokens, and depends neither on --workers nor on the shard size.
"leading" sends the fewest leading documents that hold >= --val-fraction of all tokens (it reads the
input twice); it is the default for Tiny Shakespeare (no --input, or --name tinyshakespeare), so its
shards stay the ones the tests and the README's numbers were made with.

A run that stops (Ctrl-C, an error, a killed machine) is continued by running the same command again:
the manifest records the finished shards and where the next ones start, so they are not redone.
Different arguments in a folder with an unfinished run are refused; --fresh starts over.

The token table is llm.c's tokenizer file, so llm.c's own gpt2_tokenizer.bin works as well: a header
of 256 little-endian uint32 ([0] magic 20240328, [1] version 2, [2] vocab size 50257, [3] the
end-of-text token 50256, the rest 0), then for every token id in order one uint8 length (1..255)
and that many bytes, the token's bytes as tiktoken decodes them (pieces of UTF-8 characters
included). data/tokenizer.h reads it.

Examples:
    python scripts/prepare_data.py                       # Tiny Shakespeare (downloaded if online)
    TIKTOKEN_CACHE_DIR=OFFLINE/tiktoken_cache \\
    python scripts/prepare_data.py --input OFFLINE/tinyshakespeare.txt --paragraph-docs   # offline copies
    python scripts/prepare_data.py --input a.txt b.txt --paragraph-docs --name mydata --val-fraction 0.05
    python scripts/prepare_data.py --input 'corpus/**/*.jsonl' --name web --jsonl-field text
    python scripts/prepare_data.py --input shards/ --ext parquet --name fw
    python scripts/prepare_data.py --hf-dataset HuggingFaceFW/fineweb-edu --hf-config sample-10BT --name fw
"""
import argparse
import glob
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections import deque

try:
    import numpy as np
    import tiktoken
except ImportError as err:  # tell the user how to get the venv instead of a traceback
    sys.exit(f"prepare_data.py: error: {err.name} is missing; install with "
             f"`pip install -r scripts/requirements.txt` (or run `make venv`)")

from shard_format import MAX_SHARD_TOKENS, ShardError, write_shard

EOT = 50256  # <|endoftext|> in r50k_base
TOKENIZER_FILE = "gpt2_tokenizer.bin"
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
ENCODING = "r50k_base"
MANIFEST_VERSION = 1
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
PARAGRAPH_END = re.compile(r"(\r?\n\r?\n)")  # a blank line (LF or CRLF) ends a paragraph
PARAGRAPH_END_MAX = 4  # the longest separator: a match is decided by at most this many characters
# Text files with --paragraph-docs are read 16 MB at a time; documents go to the workers in batches
# of about 1M characters. The environment can make both smaller (the tests do, to see several).
READ_BYTES = int(os.environ.get("PREPARE_DATA_READ_BYTES") or 1 << 24)
BATCH_CHARS = int(os.environ.get("PREPARE_DATA_BATCH_CHARS") or 1 << 20)
DEFAULT_EXT = "txt,text,md,jsonl,parquet"
STOP_HOOK = "PREPARE_DATA_STOP_AFTER_SHARDS"  # tests: stop (as if killed) after writing N shards


class Fail(Exception):
    """An expected error: printed as one line, exit status 1."""


class StopHook(Exception):
    """The test hook STOP_HOOK asked the run to stop."""


def show(path):
    """A path as the user would type it: relative to the current folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# ---- reading documents ------------------------------------------------------------------------

def split_paragraphs(text):
    """Splits text so that every blank line ends a document, as llm.c does for Tiny Shakespeare.

    The separator stays with the document before it, so "".join(result) == text exactly.
    """
    pieces = PARAGRAPH_END.split(text)  # [doc, sep, doc, sep, ..., doc]
    docs = [pieces[i] + (pieces[i + 1] if i + 1 < len(pieces) else "") for i in range(0, len(pieces), 2)]
    return [d for d in docs if d]  # text ending in a blank line would give an empty last document


def open_input(path):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise Fail(f"input file not found: {path}")
    except IsADirectoryError:
        raise Fail(f"input is a folder, not a text file: {path}")
    except OSError as err:
        raise Fail(f"cannot read {path}: {err.strerror or err}")


def read_bytes(f, path, n=-1):
    try:
        return f.read(n)
    except OSError as err:
        raise Fail(f"cannot read {path}: {err.strerror or err}")


def decode(data, path, base_offset=0, base_line=1):
    """UTF-8 bytes to text; invalid bytes name the file, the byte offset and the line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = base_line + data.count(b"\n", 0, err.start)
        raise Fail(f"{path} is not UTF-8 text (bad byte at offset {base_offset + err.start}, line {line})")


def text_segments(path):
    """The text of a file in pieces of about READ_BYTES, each cut after a newline (a newline byte is
    never inside a multi-byte UTF-8 character), so that a bad byte's offset is exact."""
    with open_input(path) as f:
        carry, offset, line = b"", 0, 1
        while True:
            block = read_bytes(f, path, READ_BYTES)
            data = carry + block
            if not block:
                if data:
                    yield decode(data, path, offset, line)
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            piece, carry = data[:cut], data[cut:]
            yield decode(piece, path, offset, line)
            offset += len(piece)
            line += piece.count(b"\n")


def paragraph_docs(path):
    """The paragraphs of a text file, streamed: the same documents as split_paragraphs(whole text)."""
    text = ""
    for piece in text_segments(path):
        text += piece
        start = 0
        for m in PARAGRAPH_END.finditer(text):
            if m.start() > len(text) - PARAGRAPH_END_MAX:
                break  # a match this close to the end could read differently with more text
            yield text[start:m.end()]
            start = m.end()
        text = text[start:]
    yield from split_paragraphs(text)  # the end of the file decides the separators held back near it


def whole_file_doc(path):
    with open_input(path) as f:
        text = decode(read_bytes(f, path), path)
    if text:  # an empty file is no document
        yield text


def jsonl_docs(path, field):
    with open_input(path) as f:
        offset = 0
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise Fail(f"{path} is not UTF-8 text (bad byte at offset {offset + err.start}, line {number})")
            offset += len(raw)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as err:
                raise Fail(f"{path}:{number}: not a JSON line ({getattr(err, 'msg', err)})")
            if not isinstance(obj, dict) or field not in obj:
                raise Fail(f"{path}:{number}: no field {field!r} (set the field with --jsonl-field)")
            text = obj[field]
            if not isinstance(text, str):
                raise Fail(f"{path}:{number}: field {field!r} is {type(text).__name__}, not a string")
            if text:
                yield text


def parquet_docs(path, column):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise Fail(f"reading {path} needs pyarrow; install it with `pip install pyarrow` "
                   f"(or `pip install -r scripts/requirements.txt`)")
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise Fail(f"input file not found: {path}")
    except Exception as err:  # pyarrow raises its own types for a file that is not Parquet
        raise Fail(f"cannot read {path} as Parquet ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
    names = pf.schema_arrow.names
    if column not in names:
        raise Fail(f"{path}: no column {column!r} (it has {', '.join(names)}; set it with --parquet-column)")
    row = 0
    for batch in pf.iter_batches(columns=[column], batch_size=1024):
        for text in batch.column(0).to_pylist():
            row += 1
            if text is None:
                continue
            if isinstance(text, bytes):
                text = decode(text, f"{path} row {row}")
            if not isinstance(text, str):
                raise Fail(f"{path}: row {row} of column {column!r} is {type(text).__name__}, not text")
            if text:
                yield text


def hf_docs(args):
    try:
        import datasets  # only here: the other inputs never need it
    except ImportError:
        raise Fail("--hf-dataset needs the `datasets` package (`pip install datasets`); or download the "
                   "dataset's Parquet/JSONL files and pass them with --input")
    try:
        ds = datasets.load_dataset(args.hf_dataset, args.hf_config, split=args.hf_split, streaming=True)
        rows = iter(ds)
        first = next(rows, None)
    except Exception as err:  # offline, a wrong name, a changed dataset: one line, not a traceback
        raise Fail(f"cannot stream Hugging Face dataset {args.hf_dataset!r} ({type(err).__name__}: "
                   f"{str(err).splitlines()[0] if str(err) else ''}); is this machine online? Offline, pass "
                   f"local files with --input")
    number = 0
    while first is not None:
        number += 1
        if args.hf_field not in first:
            raise Fail(f"{args.hf_dataset} row {number}: no field {args.hf_field!r} (set it with --hf-field)")
        if first[args.hf_field]:
            yield first[args.hf_field]
        first = next(rows, None)


def input_kind(path):
    lower = path.lower()
    if lower.endswith(".jsonl"):
        return "jsonl"
    if lower.endswith(".parquet"):
        return "parquet"
    return "text"


def resolve_inputs(items, exts):
    """Expands folders (recursively, files ending in one of exts, hidden ones skipped) and globs into
    a sorted list of files; a named file is taken whatever its extension."""
    files = []
    for item in items:
        if os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in names
                          if not n.startswith(".") and n.lower().endswith(exts)]
            if not found:
                raise Fail(f"folder {item} holds no file ending in {', '.join(exts)} (set them with --ext)")
            files += sorted(found)
        elif os.path.exists(item) or not glob.has_magic(item):
            if not os.path.exists(item):
                raise Fail(f"input file not found: {item}")
            files.append(item)
        else:
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not found:
                raise Fail(f"no file matches {item}")
            files += found
    return files


def documents(args, files):
    """All documents of the input, in order, streamed."""
    if args.hf_dataset:
        yield from hf_docs(args)
        return
    for path in files:
        kind = input_kind(path)
        if kind == "jsonl":
            yield from jsonl_docs(path, args.jsonl_field)
        elif kind == "parquet":
            yield from parquet_docs(path, args.parquet_column)
        elif args.paragraph_docs:
            yield from paragraph_docs(path)
        else:
            yield from whole_file_doc(path)


def download(url, dest, offline_hint):
    """Saves url's bytes at dest (through a temporary name); Fail with offline_hint when it cannot."""
    print(f"downloading {url} to {show(dest)}")
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            data = resp.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise Fail(f"could not download {url} ({reason}); this machine seems offline: {offline_hint}")
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = dest + ".download"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)


def download_shakespeare(dest):
    download(SHAKESPEARE_URL, dest, f"pass --input PATH --paragraph-docs with a local copy of Tiny Shakespeare, "
             f"or save it as {show(dest)}")


# ---- tokenizing -------------------------------------------------------------------------------

def get_encoding():
    try:
        enc = tiktoken.get_encoding(ENCODING)
    except Exception as err:  # network errors, hash mismatch, missing plugin: all mean the same here
        raise Fail(f"tiktoken cannot load {ENCODING} ({type(err).__name__}). Offline, set "
                   f"TIKTOKEN_CACHE_DIR to a folder holding the {ENCODING} ranks, as tiktoken caches them "
                   f"(`make SHARED_DATA=DIR` uses DIR/tiktoken_cache)")
    assert enc.eot_token == EOT and enc.n_vocab <= 2**16, "r50k_base no longer fits uint16 shards"
    return enc


_worker_enc = None


def _worker_init():
    global _worker_enc
    _worker_enc = tiktoken.get_encoding(ENCODING)


def encode_batch(batch):
    """(indices, texts) -> (indices, lengths, tokens): each document's tokens preceded by EOT, all
    concatenated as uint16; lengths count the EOT."""
    indices, texts = batch
    encode = _worker_enc.encode_ordinary  # (encode_ordinary_batch costs a thread-pool future per document)
    toks = [encode(t) for t in texts]
    lens = np.fromiter((len(t) + 1 for t in toks), dtype=np.int64, count=len(toks))
    flat = np.empty(int(lens.sum()), dtype=np.uint16)
    pos = 0
    for t in toks:
        flat[pos] = EOT
        flat[pos + 1:pos + 1 + len(t)] = t
        pos += len(t) + 1
    return indices, lens, flat


def batches(docs, start=0):
    """Groups (index, text) of the documents from index `start` on into batches of ~BATCH_CHARS."""
    indices, texts, chars = [], [], 0
    for i, text in enumerate(docs):
        if i < start:
            continue
        indices.append(i)
        texts.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield indices, texts
            indices, texts, chars = [], [], 0
    if indices:
        yield indices, texts


class Counter:
    """Counts every document it passes and its characters, skipped ones included."""

    def __init__(self, docs):
        self.docs, self.n, self.chars = docs, 0, 0

    def __iter__(self):
        for d in self.docs:
            self.n += 1
            self.chars += len(d)
            yield d


def encoded(batch_iter, workers):
    """Encodes the batches in order on `workers` processes, at most 2 per worker in flight (unlike
    Pool.imap, which reads its whole input ahead and so would hold the whole corpus)."""
    if workers <= 1:
        _worker_init()
        for b in batch_iter:
            yield encode_batch(b)
        return
    import multiprocessing
    with multiprocessing.Pool(workers, initializer=_worker_init) as pool:
        pending = deque()
        for b in batch_iter:
            pending.append(pool.apply_async(encode_batch, (b,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def drawn_to_val(indices, seed, fraction):
    """Which of the documents `indices` go to val in the drawn split: those whose hash of (index, seed)
    (splitmix64's mixer) is below fraction as a 53-bit fraction. Numpy uint64 arithmetic wraps."""
    z = np.asarray(indices, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z ^= np.uint64((seed * 0xD1B54A32D192ED03) % 2**64)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) < fraction * 2.0**53


# ---- writing shards ---------------------------------------------------------------------------

class Split:
    """One split's shards: a buffer of --shard-tokens tokens, written as a shard when full."""

    def __init__(self, name, out_dir, dataset, shard_tokens, state=None):
        self.name, self.out_dir, self.dataset, self.size = name, out_dir, dataset, shard_tokens
        self.buf = np.empty(0, dtype=np.uint16)  # grown on demand, up to shard_tokens
        self.fill = 0
        state = state or {}
        self.files = list(state.get("files", []))
        self.tokens_done = int(state.get("tokens", 0))  # tokens in finished shards
        self.start = list(state.get("start", [0, 0]))  # (document, token offset) of the first unwritten token

    def state(self):
        return {"files": self.files, "tokens": self.tokens_done, "start": self.start}

    @property
    def tokens(self):
        return self.tokens_done + self.fill

    def add(self, indices, heads, lens, flat, on_shard):
        """Appends pieces of documents (their indices, the offset of each piece in its document, the
        pieces' lengths, their concatenated tokens); writes every shard that fills."""
        pos, n = 0, len(flat)
        starts = None
        while pos < n:
            take = min(n - pos, self.size - self.fill)
            if self.fill + take > len(self.buf):
                grown = np.empty(min(self.size, max(2 * len(self.buf), self.fill + take)), dtype=np.uint16)
                grown[:self.fill] = self.buf[:self.fill]
                self.buf = grown
            self.buf[self.fill:self.fill + take] = flat[pos:pos + take]
            self.fill += take
            pos += take
            if self.fill == self.size:
                if starts is None:
                    starts = np.concatenate(([0], np.cumsum(lens)))
                k = int(np.searchsorted(starts, pos, side="right")) - 1
                if k >= len(indices):  # the cut is at the end of the last document
                    k = len(indices) - 1
                self.flush((int(indices[k]), int(heads[k] + pos - starts[k])))
                on_shard()

    def flush(self, next_start):
        if self.fill == 0:
            return
        path = os.path.join(self.out_dir, f"{self.dataset}_{self.name}_{len(self.files):06d}.bin")
        write_shard(path, self.buf[:self.fill])
        self.files.append(os.path.basename(path))
        self.tokens_done += self.fill
        print_line(f"wrote {show(path)}: {self.fill:,} tokens")
        self.fill = 0
        self.start = list(next_start)


_bar = None


def print_line(msg):
    if _bar is not None:
        _bar.write(msg)
    else:
        print(msg, flush=True)


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def write_tokenizer(path, enc):
    """Writes the token table (format in the module docstring) to path, through path.tmp and a rename."""
    n = enc.n_vocab
    header = np.zeros(256, dtype="<u4")
    header[:4] = (TOKENIZER_MAGIC, TOKENIZER_VERSION, n, enc.eot_token)
    parts = [header.tobytes()]
    for token in range(n):
        data = enc.decode_single_token_bytes(token)
        if not 1 <= len(data) <= 255:
            raise Fail(f"token {token} has {len(data)} bytes; the token table holds 1 to 255 per token")
        parts.append(bytes((len(data),)) + data)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.replace(tmp, path)
    print(f"wrote {show(path)}: {n:,} tokens")


def remove_stale_shards(out_dir, name, keep):
    """Deletes shards of this dataset left by an earlier run (e.g. with a smaller --shard-tokens),
    which a glob like <name>_train_*.bin would otherwise pick up."""
    ours = re.compile(re.escape(name) + r"_(train|val)_\d{6}\.bin")
    keep = set(keep)
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        if ours.fullmatch(entry) and entry not in keep:
            os.remove(path)
            print(f"removed stale {show(path)}")


# ---- the run ----------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--input", nargs="+", metavar="PATH",
                   help="text/JSONL/Parquet files, folders or globs (default: Tiny Shakespeare); "
                        "a text file is one document")
    p.add_argument("--ext", default=DEFAULT_EXT, metavar="E,E",
                   help=f"file endings taken from folders (default {DEFAULT_EXT}; e.g. py for source code)")
    p.add_argument("--paragraph-docs", action="store_true",
                   help="split each text file into documents at blank lines")
    p.add_argument("--jsonl-field", default="text", metavar="F", help="JSONL: the document's field (default text)")
    p.add_argument("--parquet-column", default="text", metavar="C",
                   help="Parquet: the document's column (default text)")
    p.add_argument("--hf-dataset", metavar="NAME", help="stream a Hugging Face dataset (needs `datasets`, online)")
    p.add_argument("--hf-config", metavar="C", help="its configuration (subset), if any")
    p.add_argument("--hf-split", default="train", metavar="S", help="its split (default train)")
    p.add_argument("--hf-field", default="text", metavar="F", help="its text field (default text)")
    p.add_argument("--name", help="dataset name used in file names "
                   "(default: tinyshakespeare, or the stem of the first input)")
    p.add_argument("--out-dir", help="output folder (default: data/<name> in the repository)")
    p.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                   help="about F of all tokens go to val; 0 = no val shard (default 0.1)")
    p.add_argument("--val-split", choices=("drawn", "leading"),
                   help="drawn: documents drawn by a hash of (index, --seed); leading: the first documents "
                        "(default: leading for Tiny Shakespeare, drawn otherwise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn split (default 0)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                   help="tokens per shard file, the last of each split fewer (default 100,000,000)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                   help=f"tokenizing processes (default: all cores, {os.cpu_count()})")
    p.add_argument("--fresh", action="store_true", help="start over, ignoring an unfinished run in --out-dir")
    args = p.parse_args(argv)
    if not 0.0 <= args.val_fraction < 1.0:  # also rejects nan
        p.error(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        p.error(f"--shard-tokens must be in [1, {MAX_SHARD_TOKENS}] (the header count is an int32), "
                f"got {args.shard_tokens}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.hf_dataset and args.input:
        p.error("--hf-dataset and --input cannot be used together")
    if args.name is None:
        if args.hf_dataset:
            args.name = args.hf_dataset.rstrip("/").split("/")[-1]
        elif args.input is None:
            args.name = "tinyshakespeare"
        else:
            first = args.input[0].rstrip("/")
            args.name = os.path.splitext(os.path.basename(first))[0] if not glob.has_magic(first) else ""
            args.name = args.name or "data"
    if not args.name or "/" in args.name or args.name in (".", ".."):
        p.error(f"--name must be a plain file-name part, got {args.name!r}")
    if args.val_split is None:
        args.val_split = "leading" if args.name == "tinyshakespeare" and not args.hf_dataset else "drawn"
    args.exts = tuple("." + e.strip().lstrip(".").lower() for e in args.ext.split(",") if e.strip())
    if args.out_dir is None:
        args.out_dir = os.path.join(REPO_ROOT, "data", args.name)
    return args


def make_out_dir(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise Fail(f"cannot create output folder {path}: {err.strerror or err}")


def fingerprint(args, files):
    """What decides the output: a continued run must have the same (--workers does not matter)."""
    inputs = []
    for path in files:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = None
        inputs.append([os.path.abspath(path), size])
    return {"inputs": inputs, "hf": [args.hf_dataset, args.hf_config, args.hf_split, args.hf_field],
            "paragraph_docs": args.paragraph_docs, "jsonl_field": args.jsonl_field,
            "parquet_column": args.parquet_column, "name": args.name, "val_fraction": args.val_fraction,
            "val_split": args.val_split, "seed": args.seed, "shard_tokens": args.shard_tokens,
            "encoding": ENCODING}


def load_manifest(path, fp, fresh):
    """The state of an unfinished run with the same arguments, or None to start afresh."""
    if fresh or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise Fail(f"cannot read {path} ({err}); pass --fresh to start over")
    if manifest.get("complete"):
        return None  # a finished run: this one starts over (its stale shards are removed at the end)
    if manifest.get("version") != MANIFEST_VERSION or manifest.get("args") != fp:
        raise Fail(f"{show(path)} is an unfinished run with other arguments; run the same command again "
                   f"to continue it, or use a new --out-dir, or pass --fresh to start over")
    for split in ("val", "train"):
        for name in manifest["splits"][split]["files"]:
            if not os.path.exists(os.path.join(os.path.dirname(path), name)):
                raise Fail(f"{show(path)} lists {name}, which is missing; pass --fresh to start over")
    return manifest


def count_tokens(args, files, workers):
    """For the leading split: (documents, tokens, where the last document starts)."""
    docs = Counter(documents(args, files))
    total, last_start = 0, 0
    for _, lens, _ in encoded(batches(docs), workers):
        last_start = total + int(lens[:-1].sum())
        total += int(lens.sum())
    return docs.n, total, last_start


def run(args):
    global _bar
    t0 = time.time()
    if args.input is None and not args.hf_dataset:  # default dataset: Tiny Shakespeare, one document per paragraph
        path = os.path.join(args.out_dir, "input.txt")
        if not os.path.exists(path):
            make_out_dir(args.out_dir)
            download_shakespeare(path)
        files, args.paragraph_docs = [path], True
    else:
        files = resolve_inputs(args.input or [], args.exts)
    fp = fingerprint(args, files)
    manifest_path = os.path.join(args.out_dir, f"{args.name}_manifest.json")
    manifest = load_manifest(manifest_path, fp, args.fresh)
    fraction = args.val_fraction
    # The first batch is read before the encoding is loaded, so that a bad first input is reported
    # as such even where the BPE ranks are missing.
    first_batch = next(batches(documents(args, files)), None)
    if first_batch is None:
        raise Fail("the input holds no text")
    del first_batch
    enc = get_encoding()

    leading_cut = None  # leading split: document i goes to val when the tokens before it < leading_cut
    if args.val_split == "leading" and fraction > 0:
        n_docs, total, last_start = count_tokens(args, files, args.workers)
        if n_docs == 0:
            raise Fail("the input holds no text")
        leading_cut = fraction * total
        if last_start < leading_cut:
            raise Fail(f"--val-fraction {fraction} would put all {n_docs} document(s) in val and leave train "
                       f"empty; use --paragraph-docs, more input files, or --val-fraction 0")

    make_out_dir(args.out_dir)  # only now, so that a failed run leaves no empty folder behind
    if args.fresh and os.path.exists(manifest_path):
        os.remove(manifest_path)  # so that stopping before the first shard does not bring the old run back
    state = manifest or {}
    splits = {s: Split(s, args.out_dir, args.name, args.shard_tokens, state.get("splits", {}).get(s))
              for s in ("val", "train")}
    if fraction == 0:
        splits["val"].start = list(splits["train"].start)  # val receives nothing
    resume_doc = min(sp.start[0] for sp in splits.values())
    tokens_before = int(state.get("tokens_before", {}).get(str(resume_doc), 0)) if manifest else 0
    if manifest:
        print(f"continuing the run in {show(manifest_path)}: {sum(len(s.files) for s in splits.values())} "
              f"shard(s) done, from document {resume_doc:,}")
    stop_after = int(os.environ.get(STOP_HOOK, "0") or 0)
    written_now = [0]
    cum = {"doc": resume_doc, "tokens": tokens_before}  # tokens before document cum["doc"]

    def checkpoint():
        starts = {s: sp.start for s, sp in splits.items()}
        need = {str(d) for d, _ in starts.values()}
        write_json(manifest_path, {"version": MANIFEST_VERSION, "complete": False, "args": fp,
                                   "splits": {s: sp.state() for s, sp in splits.items()},
                                   "tokens_before": {k: v for k, v in cum_at.items() if k in need}})
        written_now[0] += 1
        if stop_after and written_now[0] >= stop_after:
            raise StopHook(f"stopped after {written_now[0]} shard(s) ({STOP_HOOK})")

    cum_at = dict(state.get("tokens_before", {})) if manifest else {"0": 0}

    def needed(batch_iter):
        """Drops the documents that finished shards hold (read, but not tokenized again)."""
        for indices, texts in batch_iter:
            if leading_cut is None and indices[0] < max(sp.start[0] for sp in splits.values()):
                to_val = drawn_to_val(indices, args.seed, fraction) if fraction > 0 else \
                    np.zeros(len(indices), dtype=bool)
                keep = [j for j, i in enumerate(indices)
                        if i >= splits["val" if to_val[j] else "train"].start[0]]
                if len(keep) < len(indices):
                    indices, texts = [indices[j] for j in keep], [texts[j] for j in keep]
            if indices:
                yield indices, texts

    docs = Counter(documents(args, files))
    try:
        from tqdm import tqdm
        # progress in characters read against the input's size: an ETA for text and JSONL
        sized = not args.hf_dataset and all(input_kind(f) != "parquet" for f in files)
        _bar = tqdm(total=sum(os.path.getsize(f) for f in files) if sized else None, unit="B", unit_scale=True,
                    disable=None, dynamic_ncols=True, smoothing=0.1)
    except ImportError:
        _bar = None
    new_tokens, t_tok = 0, time.time()
    try:
        for indices, lens, flat in encoded(needed(batches(docs, resume_doc)), args.workers):
            offsets = np.concatenate(([0], np.cumsum(lens)))
            # which split each document goes to
            if leading_cut is not None:
                if indices[0] != cum["doc"]:
                    raise AssertionError("leading split needs every document")
                before = cum["tokens"] + offsets[:-1]
                to_val = before < leading_cut
                for j, i in enumerate(indices):  # remember the token count before every document that
                    cum_at[str(i)] = int(before[j])  # starts a pending buffer (pruned when saved)
                if len(cum_at) > 100_000:
                    keep_keys = {str(sp.start[0]) for sp in splits.values()}
                    cum_at = {k: v for k, v in cum_at.items() if k in keep_keys or int(k) >= indices[0]}
                cum["doc"], cum["tokens"] = indices[-1] + 1, cum["tokens"] + int(offsets[-1])
            elif fraction == 0:
                to_val = np.zeros(len(indices), dtype=bool)
            else:
                to_val = drawn_to_val(indices, args.seed, fraction)
            for name, mask in (("val", to_val), ("train", ~to_val)):
                if not mask.any():
                    continue
                sp = splits[name]
                sel = np.flatnonzero(mask)
                idx = [indices[j] for j in sel]
                # skip what finished shards already hold: earlier documents, and the head of the one they cut
                first, skip = sp.start
                if idx[0] >= first and (idx[0] > first or skip == 0):  # the usual case: all of them
                    if len(sel) == len(indices):
                        sp.add(indices, np.zeros(len(sel), dtype=np.int64), lens, flat, checkpoint)
                    else:
                        pieces = [flat[offsets[j]:offsets[j + 1]] for j in sel]
                        sp.add(idx, np.zeros(len(sel), dtype=np.int64), lens[sel], np.concatenate(pieces),
                               checkpoint)
                else:
                    parts, heads, lens_s, idx_s = [], [], [], []
                    for j, i in zip(sel, idx):
                        if i < first:
                            continue
                        head = skip if i == first else 0
                        a, b = offsets[j] + head, offsets[j + 1]
                        if b > a:
                            parts.append(flat[a:b])
                            heads.append(head)
                            lens_s.append(b - a)
                            idx_s.append(i)
                    if parts:
                        sp.add(idx_s, np.asarray(heads), np.asarray(lens_s), np.concatenate(parts), checkpoint)
            if leading_cut is not None and not to_val[-1] and splits["val"].fill:
                splits["val"].flush((int(indices[-1]), 0))  # val is complete: no later document goes there
                checkpoint()
            new_tokens += len(flat)
            if _bar is not None:
                rate = new_tokens / max(time.time() - t_tok, 1e-9)
                _bar.set_postfix_str(f"{docs.n:,} docs, {new_tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)
                _bar.update(docs.chars - _bar.n)
    finally:
        if _bar is not None:
            _bar.close()
            _bar = None

    n_docs = docs.n
    if n_docs == 0:
        raise Fail("the input holds no text")
    val, train = splits["val"], splits["train"]
    if fraction > 0 and (val.tokens == 0 or train.tokens == 0):
        for sp in splits.values():  # nothing usable: leave no shards of this run behind
            for name in sp.files:
                os.remove(os.path.join(args.out_dir, name))
        if os.path.exists(manifest_path):
            os.remove(manifest_path)
        which = "val" if val.tokens == 0 else "train"
        raise Fail(f"--val-fraction {fraction} drew {'none' if which == 'val' else 'all'} of the "
                   f"{n_docs} document(s) for val, so {which} would be empty; use --paragraph-docs, more "
                   f"documents, --val-split leading, or --val-fraction 0")
    val.flush((n_docs, 0))
    train.flush((n_docs, 0))
    remove_stale_shards(args.out_dir, args.name, val.files + train.files)
    write_tokenizer(os.path.join(args.out_dir, TOKENIZER_FILE), enc)
    seconds = time.time() - t0
    total = val.tokens + train.tokens
    summary = {"documents": n_docs, "tokens": total, "val_tokens": val.tokens, "train_tokens": train.tokens,
               "val_fraction": val.tokens / total, "val_shards": len(val.files),
               "train_shards": len(train.files), "val_split": args.val_split, "workers": args.workers,
               "seconds": round(seconds, 3), "tokens_this_run": new_tokens,
               "tokens_per_s": round(new_tokens / max(seconds, 1e-9)),
               "tokens_per_s_per_worker": round(new_tokens / max(seconds, 1e-9) / args.workers)}
    write_json(manifest_path, {"version": MANIFEST_VERSION, "complete": True, "args": fp,
                               "splits": {s: sp.state() for s, sp in splits.items()}, "summary": summary})
    print(f"{n_docs:,} documents, {total:,} tokens: val {val.tokens:,} ({100.0 * val.tokens / total:.1f}%, "
          f"{len(val.files)} shard(s), {args.val_split}), train {train.tokens:,} ({len(train.files)} shard(s))")
    print(f"{seconds:.1f} s, {summary['tokens_per_s']:,} tokens/s on {args.workers} worker(s) "
          f"({summary['tokens_per_s_per_worker']:,} tokens/s per worker)")


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (Fail, ShardError) as err:
        print(f"prepare_data.py: error: {err}", file=sys.stderr)
        return 1
    except StopHook as err:
        print(f"prepare_data.py: {err}; run the same command again to continue", file=sys.stderr)
        return 3
    except OSError as err:  # disk full, permissions, ... while writing
        print(f"prepare_data.py: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("prepare_data.py: interrupted; the shards written so far are complete, and running the same "
              "command again continues from them", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
