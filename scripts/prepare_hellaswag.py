"""prepare_hellaswag.py: HellaSwag (JSONL) to a multiple-choice eval file, llm.c's layout.

Reads HellaSwag's published JSONL (one example a line: "ctx", or "ctx_a" and "ctx_b"; "endings", 4
strings; "label", the index of the right ending; "ind" and the other fields are not needed), from
--input, or downloaded from rowanz/hellaswag on GitHub (the validation split) when no --input is given.
Tokenizes with tiktoken's GPT-2 encoding (r50k_base): the context as the tokens of ctx, each
completion as the tokens of " " + ending, and writes one binary file that llm.c's eval loader reads as
it is (the file below, data/README.md "Multiple-choice eval files"):

- a header of 256 int32: [0] magic 20240522, [1] version 1, [2] the number of examples N,
  [3] the longest example in bytes; the rest zero;
- then the N examples, each a stream of uint16:
  65535 (the start delimiter), the example's length in bytes (these 2 words and all below),
  its index (0 .. N-1, its position in the file), its label, the number of completions (4),
  the context's token count and tokens, then for each completion its token count and tokens.

The completion with the lowest mean loss over its own tokens is the model's answer (llm.c's C eval:
length-normalized accuracy, acc_norm); the plain accuracy takes the lowest summed loss instead.

    .venv/bin/python scripts/prepare_hellaswag.py                         # downloads the val split
    .venv/bin/python scripts/prepare_hellaswag.py --input hellaswag_val.jsonl -o data/hellaswag/val.bin

Offline: --input a local copy, and TIKTOKEN_CACHE_DIR at a folder holding tiktoken's cached ranks.
Bad input (not JSON, a missing field, not 4 endings, a label out of range, an empty context, an
example too long for the format) stops with one line naming the file and line; the output file is
written under a temporary name and renamed, so it is never left half written.
read_eval_file() parses such a file back and checks it (the tests use it).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare_data  # noqa: E402  (the tokenizer, downloads and messages shared with it)
from prepare_data import Fail, download, show  # noqa: E402

MAGIC, VERSION = 20240522, 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
START = 65535  # <START_EXAMPLE>
NUM_COMPLETIONS = 4
MAX_EXAMPLES = 65535  # the index is a uint16 (llm.c: fewer than 2**16 examples)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO_ROOT, "data", "hellaswag", "hellaswag_val.bin")
# The tests point this at an unreachable address to see the offline message.
HELLASWAG_URL = (os.environ.get("PREPARE_HELLASWAG_URL")
                 or "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl")


class EvalFormatError(ValueError):
    """read_eval_file(): the file does not hold a valid eval file."""


# ---- reading HellaSwag's JSONL ------------------------------------------------------------------

def parse_example(obj, where):
    """(context, endings, label) of one JSON line; Fail naming `where` (file:line) when it is not one."""
    if not isinstance(obj, dict):
        raise Fail(f"{where}: not a JSON object")
    if "ctx" in obj:
        ctx = obj["ctx"]
        if not isinstance(ctx, str):
            raise Fail(f'{where}: field "ctx" is not a string')
    elif "ctx_a" in obj and "ctx_b" in obj:
        a, b = obj["ctx_a"], obj["ctx_b"]
        if not isinstance(a, str) or not isinstance(b, str):
            raise Fail(f'{where}: field "ctx_a" or "ctx_b" is not a string')
        ctx = a + " " + b if b else a  # how HellaSwag builds "ctx"
    else:
        raise Fail(f'{where}: missing field "ctx" (or "ctx_a" and "ctx_b")')
    if not ctx.strip():
        raise Fail(f"{where}: the context is empty")
    if "endings" not in obj:
        raise Fail(f'{where}: missing field "endings"')
    endings = obj["endings"]
    if not isinstance(endings, list) or not all(isinstance(e, str) for e in endings):
        raise Fail(f'{where}: field "endings" is not a list of strings')
    if len(endings) != NUM_COMPLETIONS:
        raise Fail(f'{where}: "endings" has {len(endings)} strings, not {NUM_COMPLETIONS}')
    if "label" not in obj:
        raise Fail(f'{where}: missing field "label"')
    label = obj["label"]
    if isinstance(label, str) and label.strip().lstrip("-").isdigit():
        label = int(label)  # some copies store it as a string
    if isinstance(label, bool) or not isinstance(label, int):
        raise Fail(f'{where}: field "label" is not an integer ({label!r})')
    if not 0 <= label < NUM_COMPLETIONS:
        raise Fail(f'{where}: "label" {label} is out of range 0..{NUM_COMPLETIONS - 1}')
    return ctx, endings, label


def read_jsonl(path):
    """The examples of a HellaSwag JSONL file as [(context, endings, label, line number)]."""
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except OSError as err:
        raise Fail(f"{show(path)}: cannot read ({err.strerror or err})")
    examples = []
    for lineno, raw in enumerate(raw_lines, start=1):
        where = f"{show(path)}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise Fail(f"{where}: not UTF-8 (byte {err.start} of the line)")
        if not line.strip():
            continue  # blank lines (the trailing newline) are skipped
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise Fail(f"{where}: not JSON ({err.msg}, column {err.colno})")
        examples.append(parse_example(obj, where) + (lineno,))
    if not examples:
        raise Fail(f"{show(path)}: holds no example")
    if len(examples) > MAX_EXAMPLES:
        raise Fail(f"{show(path)}: {len(examples)} examples, more than the format's {MAX_EXAMPLES}")
    return examples


def download_hellaswag(dest):
    download(HELLASWAG_URL, dest, "pass --input PATH with a local copy of hellaswag_val.jsonl")


# ---- tokenizing ---------------------------------------------------------------------------------

def get_encoding():
    enc = prepare_data.get_encoding()  # its messages: tiktoken missing, or its ranks offline
    assert enc.n_vocab <= START, "r50k_base no longer fits uint16 below the delimiter"
    return enc


def tokenize(enc, examples):
    """[(context tokens, [completion tokens] x4, label, line number)]; a literal <|endoftext|> is text."""
    out = []
    for ctx, endings, label, lineno in examples:
        ctx_tokens = enc.encode(ctx, disallowed_special=())
        ends = [enc.encode(" " + e, disallowed_special=()) for e in endings]
        out.append((ctx_tokens, ends, label, lineno))
    return out


# ---- the eval file ------------------------------------------------------------------------------

def example_stream(index, label, ctx_tokens, completions, where="example"):
    """One example's uint16 words (the layout in the module docstring)."""
    words = [START, 0, index, label, len(completions), len(ctx_tokens), *ctx_tokens]
    for toks in completions:
        words.append(len(toks))
        words.extend(toks)
    nbytes = 2 * len(words)
    if nbytes > 0xFFFF:
        raise Fail(f"{where}: {nbytes} bytes ({len(words)} words), longer than the format's 65535")
    if not ctx_tokens or any(len(t) == 0 for t in completions):
        raise Fail(f"{where}: an empty context or completion")
    if any(not 0 <= t < START for toks in (ctx_tokens, *completions) for t in toks):
        raise Fail(f"{where}: a token outside 0..{START - 1}")
    words[1] = nbytes
    return words


def write_eval_file(path, examples, where_prefix="example"):
    """Writes examples [(context tokens, [completion tokens], label[, line number])] to path, through
    path.tmp and a rename; returns (file size, longest example bytes)."""
    if len(examples) > MAX_EXAMPLES:
        raise Fail(f"{len(examples)} examples, more than the format's {MAX_EXAMPLES}")
    streams = []
    for i, ex in enumerate(examples):
        ctx_tokens, completions, label = ex[0], ex[1], ex[2]
        where = f"{where_prefix}:{ex[3]}" if len(ex) > 3 else f"{where_prefix} {i}"
        streams.append(example_stream(i, label, ctx_tokens, completions, where))
    longest = max((2 * len(s) for s in streams), default=0)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2], header[3] = MAGIC, VERSION, len(streams), longest
    body = np.array([w for s in streams for w in s], dtype="<u2")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(body.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return HEADER_BYTES + body.nbytes, longest


def read_eval_file(path):
    """Parses an eval file; returns {"num_examples", "longest_bytes", "examples": [{"index", "label",
    "context": [tokens], "completions": [[tokens], ...]}]}. Raises EvalFormatError naming the file and
    the byte offset on anything the layout does not allow."""
    with open(path, "rb") as f:
        raw = f.read()
    name = show(path)
    if len(raw) < HEADER_BYTES:
        raise EvalFormatError(f"{name}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC:
        raise EvalFormatError(f"{name}: bad magic {header[0]} (an eval file has {MAGIC})")
    if header[1] != VERSION:
        raise EvalFormatError(f"{name}: version {header[1]}, not {VERSION}")
    n, longest = int(header[2]), int(header[3])
    if not 0 < n <= MAX_EXAMPLES:
        raise EvalFormatError(f"{name}: {n} examples in the header")
    if (len(raw) - HEADER_BYTES) % 2:
        raise EvalFormatError(f"{name}: an odd number of bytes after the header")
    words = np.frombuffer(raw[HEADER_BYTES:], dtype="<u2")
    pos, examples, seen_longest = 0, [], 0
    for i in range(n):
        at = f"{name}: example {i} (byte {HEADER_BYTES + 2 * pos})"
        if pos + 3 > len(words):
            raise EvalFormatError(f"{at}: the file ends before the example (truncated)")
        if words[pos] != START:
            raise EvalFormatError(f"{at}: delimiter {words[pos]}, not {START}")
        nbytes, index = int(words[pos + 1]), int(words[pos + 2])
        if index != i:
            raise EvalFormatError(f"{at}: index {index}, not {i}")
        if nbytes % 2 or nbytes < 2 * 6:
            raise EvalFormatError(f"{at}: length {nbytes} bytes is not possible")
        end = pos + nbytes // 2
        if end > len(words):
            raise EvalFormatError(f"{at}: {nbytes} bytes, the file ends before them (truncated)")
        ex = words[pos:end]
        label, num_completions, ctx_len = int(ex[3]), int(ex[4]), int(ex[5])
        if num_completions == 0 or not 0 <= label < num_completions:
            raise EvalFormatError(f"{at}: label {label} of {num_completions} completions")
        q = 6 + ctx_len
        if ctx_len == 0 or q > len(ex):
            raise EvalFormatError(f"{at}: context of {ctx_len} tokens does not fit its {nbytes} bytes")
        context = ex[6:q].tolist()
        completions = []
        for c in range(num_completions):
            if q >= len(ex):
                raise EvalFormatError(f"{at}: completion {c} lies past the example's {nbytes} bytes")
            m = int(ex[q])
            if m == 0 or q + 1 + m > len(ex):
                raise EvalFormatError(f"{at}: completion {c} of {m} tokens does not fit its {nbytes} bytes")
            completions.append(ex[q + 1:q + 1 + m].tolist())
            q += 1 + m
        if q != len(ex):
            raise EvalFormatError(f"{at}: {2 * (len(ex) - q)} bytes left over after the completions")
        if any(t == START for t in context) or any(t == START for c in completions for t in c):
            raise EvalFormatError(f"{at}: a token equal to the delimiter {START}")
        examples.append({"index": index, "label": label, "context": context, "completions": completions})
        seen_longest = max(seen_longest, nbytes)
        pos = end
    if pos != len(words):
        raise EvalFormatError(f"{name}: {2 * (len(words) - pos)} bytes after the last of {n} examples")
    if longest != seen_longest:
        raise EvalFormatError(f"{name}: header says the longest example is {longest} bytes, it is {seen_longest}")
    if np.any(header[4:]):
        raise EvalFormatError(f"{name}: header ints 4..255 are not zero")
    return {"num_examples": n, "longest_bytes": longest, "examples": examples}


# ---- the command --------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", help="a local HellaSwag JSONL file (default: download the val split from "
                                   "rowanz/hellaswag, kept beside the output as hellaswag_val.jsonl)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                   help=f"the eval file to write (default: {show(DEFAULT_OUTPUT)})")
    return p.parse_args(argv)


def run(args):
    output = os.path.abspath(args.output)
    path = args.input
    if path is None:
        path = os.path.join(os.path.dirname(output), "hellaswag_val.jsonl")
        if not os.path.isfile(path):
            download_hellaswag(path)
    examples = read_jsonl(path)  # all input checks before the tokenizer is needed
    enc = get_encoding()
    tokenized = tokenize(enc, examples)
    size, longest = write_eval_file(output, tokenized, where_prefix=show(path))
    ctx_tokens = sum(len(t[0]) for t in tokenized)
    end_tokens = sum(len(e) for t in tokenized for e in t[1])
    print(f"{len(tokenized):,} examples, {ctx_tokens + end_tokens:,} tokens (context {ctx_tokens:,}, "
          f"completions {end_tokens:,}), longest example {longest:,} bytes")
    print(f"wrote {show(output)} ({size:,} bytes)")


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (Fail, OSError) as err:  # OSError: disk full, permissions, ... while writing
        print(f"prepare_hellaswag.py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
