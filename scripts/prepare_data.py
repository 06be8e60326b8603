#!/usr/bin/env python3
"""prepare_data.py: tokenize text into token shards for train_gpt.

Text is encoded with tiktoken's GPT-2 encoding (r50k_base). Every document is preceded
by the end-of-text token 50256; inside a document, a literal "<|endoftext|>" string is
ordinary text (encode_ordinary). The token stream is written as shards in llm.c's format
(see shard_format.py):

    <out-dir>/<name>_val_000000.bin              the first documents, >= --val-fraction of all tokens
    <out-dir>/<name>_train_000000.bin, ...       the rest, cut every --shard-tokens tokens
    <out-dir>/gpt2_tokenizer.bin                 the token table, for printing samples (below)

The token table is llm.c's tokenizer file, so llm.c's own gpt2_tokenizer.bin works as well: a header
of 256 little-endian uint32 ([0] magic 20240328, [1] version 2, [2] vocab size 50257, [3] the
end-of-text token 50256, the rest 0), then for every token id in order one uint8 length (1..255)
and that many bytes, the token's bytes as tiktoken decodes them (pieces of UTF-8 characters
included). data/tokenizer.h reads it.

Examples:
    python scripts/prepare_data.py                       # Tiny Shakespeare (downloaded if online)
    TIKTOKEN_CACHE_DIR=OFFLINE/tiktoken_cache \\
    python scripts/prepare_data.py --input OFFLINE/tinyshakespeare.txt --paragraph-docs   # offline copies
    python scripts/prepare_data.py --input a.txt b.txt --name mydata --val-fraction 0.05

Everything is held in memory (the text plus 2 bytes per token); fine up to a few GB of text.
"""
import argparse
import itertools
import os
import re
import sys
import urllib.error
import urllib.request

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
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
PARAGRAPH_END = re.compile(r"(\r?\n\r?\n)")  # a blank line (LF or CRLF) ends a paragraph


class Fail(Exception):
    """An expected error: printed as one line, exit status 1."""


def show(path):
    """A path as the user would type it: relative to the current folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def split_paragraphs(text):
    """Splits text so that every blank line ends a document, as llm.c does for Tiny Shakespeare.

    The separator stays with the document before it, so "".join(result) == text exactly.
    """
    pieces = PARAGRAPH_END.split(text)  # [doc, sep, doc, sep, ..., doc]
    docs = [pieces[i] + (pieces[i + 1] if i + 1 < len(pieces) else "") for i in range(0, len(pieces), 2)]
    return [d for d in docs if d]  # text ending in a blank line would give an empty last document


def read_text(path):
    try:
        # newline="" keeps the text byte-exact (no CRLF translation), so decoding gives it back.
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise Fail(f"input file not found: {path}")
    except IsADirectoryError:
        raise Fail(f"input is a folder, not a text file: {path}")
    except UnicodeDecodeError as err:
        raise Fail(f"{path} is not UTF-8 text (bad byte at offset {err.start})")
    except OSError as err:
        raise Fail(f"cannot read {path}: {err.strerror or err}")


def download_shakespeare(dest):
    print(f"downloading Tiny Shakespeare to {show(dest)}")
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=20) as resp:
            data = resp.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise Fail(f"could not download {SHAKESPEARE_URL} ({reason}); this machine seems offline: "
                   f"pass --input PATH --paragraph-docs with a local copy of Tiny Shakespeare, "
                   f"or save it as {show(dest)}")
    tmp = dest + ".download"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)


def load_documents(args):
    """Returns the list of documents (strings) the arguments ask for."""
    if args.input is None:  # default dataset: Tiny Shakespeare, one document per paragraph
        path = os.path.join(args.out_dir, "input.txt")
        if not os.path.exists(path):
            make_out_dir(args.out_dir)
            download_shakespeare(path)
        return split_paragraphs(read_text(path))
    docs = []
    for path in args.input:
        text = read_text(path)
        if args.paragraph_docs:
            docs.extend(split_paragraphs(text))
        elif text:  # an empty file is no document
            docs.append(text)
    return docs


def get_encoding():
    try:
        enc = tiktoken.get_encoding(ENCODING)
    except Exception as err:  # network errors, hash mismatch, missing plugin: all mean the same here
        raise Fail(f"tiktoken cannot load {ENCODING} ({type(err).__name__}). Offline, set "
                   f"TIKTOKEN_CACHE_DIR to a folder holding the {ENCODING} ranks, as tiktoken caches them "
                   f"(`make SHARED_DATA=DIR` uses DIR/tiktoken_cache)")
    assert enc.eot_token == EOT and enc.n_vocab <= 2**16, "r50k_base no longer fits uint16 shards"
    return enc


def tokenize(docs, enc, batch_chars=1 << 24):
    """Returns (tokens, doc_lens): the uint16 stream [EOT, doc0..., EOT, doc1..., ...] and each
    document's length in tokens, its EOT included. Encodes in batches of ~16M characters."""
    streams, lens = [], []
    start = 0
    while start < len(docs):
        end, chars = start, 0
        while end < len(docs) and (end == start or chars + len(docs[end]) <= batch_chars):
            chars += len(docs[end])
            end += 1
        toks = enc.encode_ordinary_batch(docs[start:end])
        n = [len(t) + 1 for t in toks]
        flat = itertools.chain.from_iterable(itertools.chain((EOT,), t) for t in toks)
        streams.append(np.fromiter(flat, dtype=np.uint16, count=sum(n)))
        lens.extend(n)
        start = end
    return np.concatenate(streams), np.asarray(lens, dtype=np.int64)


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


def val_split(doc_lens, fraction):
    """Number of leading documents that make up the validation split: the fewest whose
    tokens are at least `fraction` of all tokens (0 when fraction is 0)."""
    if fraction == 0:
        return 0
    cum = np.cumsum(doc_lens)
    return int(np.searchsorted(cum, fraction * cum[-1], side="left")) + 1


def write_split(out_dir, name, split, tokens, shard_tokens):
    paths = []
    for i, start in enumerate(range(0, len(tokens), shard_tokens)):
        path = os.path.join(out_dir, f"{name}_{split}_{i:06d}.bin")
        part = tokens[start:start + shard_tokens]
        write_shard(path, part)
        print(f"wrote {show(path)}: {len(part):,} tokens")
        paths.append(path)
    return paths


def remove_stale_shards(out_dir, name, keep):
    """Deletes shards of this dataset left by an earlier run (e.g. with a smaller --shard-tokens),
    which a glob like <name>_train_*.bin would otherwise pick up."""
    ours = re.compile(re.escape(name) + r"_(train|val)_\d{6}\.bin")
    keep = {os.path.abspath(p) for p in keep}
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        if ours.fullmatch(entry) and os.path.abspath(path) not in keep:
            os.remove(path)
            print(f"removed stale {show(path)}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--input", nargs="+", metavar="FILE",
                   help="local UTF-8 text files (default: Tiny Shakespeare); each file is one document")
    p.add_argument("--paragraph-docs", action="store_true",
                   help="split each input file into documents at blank lines")
    p.add_argument("--name", help="dataset name used in file names "
                   "(default: tinyshakespeare, or the stem of the first input file)")
    p.add_argument("--out-dir", help="output folder (default: data/<name> in the repository)")
    p.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                   help="leading documents go to val until it holds >= F of all tokens; "
                        "0 = no val shard (default 0.1)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                   help="at most N tokens per shard file (default 100,000,000)")
    args = p.parse_args(argv)
    if not 0.0 <= args.val_fraction < 1.0:  # also rejects nan
        p.error(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        p.error(f"--shard-tokens must be in [1, {MAX_SHARD_TOKENS}] (the header count is an int32), "
                f"got {args.shard_tokens}")
    if args.name is None:
        args.name = "tinyshakespeare" if args.input is None else \
            os.path.splitext(os.path.basename(args.input[0]))[0]
    if not args.name or "/" in args.name or args.name in (".", ".."):
        p.error(f"--name must be a plain file-name part, got {args.name!r}")
    if args.out_dir is None:
        args.out_dir = os.path.join(REPO_ROOT, "data", args.name)
    return args


def make_out_dir(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise Fail(f"cannot create output folder {path}: {err.strerror or err}")


def run(args):
    docs = load_documents(args)
    if not docs:
        raise Fail("the input holds no text")
    enc = get_encoding()
    tokens, doc_lens = tokenize(docs, enc)
    n_val_docs = val_split(doc_lens, args.val_fraction)
    n_val = int(doc_lens[:n_val_docs].sum())
    if n_val_docs == len(docs):
        raise Fail(f"--val-fraction {args.val_fraction} would put all {len(docs)} document(s) in val and "
                   f"leave train empty; use --paragraph-docs, more input files, or --val-fraction 0")

    make_out_dir(args.out_dir)  # only now, so that a failed run leaves no empty folder behind
    written = write_split(args.out_dir, args.name, "val", tokens[:n_val], args.shard_tokens)
    written += write_split(args.out_dir, args.name, "train", tokens[n_val:], args.shard_tokens)
    remove_stale_shards(args.out_dir, args.name, written)
    write_tokenizer(os.path.join(args.out_dir, TOKENIZER_FILE), enc)
    total = len(tokens)
    print(f"{len(docs):,} documents, {total:,} tokens: val {n_val:,} ({100.0 * n_val / total:.1f}%, "
          f"{n_val_docs:,} documents), train {total - n_val:,}")


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (Fail, ShardError) as err:
        print(f"prepare_data.py: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # disk full, permissions, ... while writing
        print(f"prepare_data.py: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("prepare_data.py: interrupted; no partial shard was left under a real name", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
