"""make_continuation_eval.py: a multiple-choice eval file from held-out token shards, for any corpus.

Where no benchmark fits the corpus (code, a language HellaSwag does not cover, a private domain), the
held-out shards that prepare_data.py wrote can still say whether the model learns: each example is a
--context-tokens window of the validation text, and the question is which of --choices spans of
--completion-tokens continues it: the one that does, or one of the others, drawn from elsewhere in the
same shards. A model that has learned the corpus picks the real continuation far more often than
1 / --choices. The file has llm.c's eval layout (data/README.md), so the trainer scores it as it does
HellaSwag:

    .venv/bin/python scripts/make_continuation_eval.py --val-data 'data/code/code_val_*.bin' \\
        --output data/code/continuation_val.bin
    ./train_gpt ... --eval-data data/code/continuation_val.bin --eval-every 250

Windows are drawn with --seed over all the shards' tokens (a window may span the <|endoftext|> between
two documents, as training batches do); the right answer's position among the choices is drawn too. Bad input (no shard matched, a corrupt shard, too few tokens for the
examples asked) stops with one line saying what to change.
"""
import argparse
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_data import Fail  # noqa: E402
from prepare_hellaswag import write_eval_file  # noqa: E402
from shard_format import read_shard  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--val-data", required=True, help="held-out token shards, a path or a glob")
    p.add_argument("--output", required=True, help="the eval file to write")
    p.add_argument("--examples", type=int, default=2000, help="examples (default 2000, at most 65535)")
    p.add_argument("--context-tokens", type=int, default=96, help="tokens of context (default 96)")
    p.add_argument("--completion-tokens", type=int, default=16, help="tokens per choice (default 16)")
    p.add_argument("--choices", type=int, default=4, help="choices per example, 2 to 16 (default 4)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the draws (default 1337)")
    return p.parse_args(argv)


def check_args(args):
    if not 1 <= args.examples <= 65535:
        raise Fail(f"--examples {args.examples}: the format holds 1 to 65535")
    if not 2 <= args.choices <= 16:
        raise Fail(f"--choices {args.choices}: 2 to 16")
    if args.context_tokens < 1 or args.completion_tokens < 1:
        raise Fail("--context-tokens and --completion-tokens must be at least 1")


def load_tokens(pattern):
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise Fail(f"--val-data {pattern}: no file matches (prepare_data.py writes NAME_val_*.bin)")
    try:
        return np.concatenate([read_shard(p) for p in paths]), len(paths)
    except (ValueError, OSError) as err:
        raise Fail(f"--val-data: {err}") from err


def make_examples(tokens, args):
    """[(context, [choices], label)]: window i's continuation is the choice at a drawn label."""
    window, span = args.context_tokens + args.completion_tokens, args.completion_tokens
    if len(tokens) < 2 * window * args.choices:
        raise Fail(f"{len(tokens)} held-out tokens are too few for windows of {window} tokens and "
                   f"{args.choices} choices; lower --context-tokens / --completion-tokens or use more data")
    rng = np.random.default_rng(args.seed)
    out = []
    for _ in range(args.examples):
        start = int(rng.integers(0, len(tokens) - window + 1))
        context = tokens[start:start + args.context_tokens].tolist()
        right = tokens[start + args.context_tokens:start + window].tolist()
        others = []
        while len(others) < args.choices - 1:  # spans that do not overlap the window
            at = int(rng.integers(0, len(tokens) - span + 1))
            if at + span <= start or at >= start + window:
                others.append(tokens[at:at + span].tolist())
        label = int(rng.integers(0, args.choices))
        out.append((context, others[:label] + [right] + others[label:], label))
    return out


def main(argv=None):
    args = parse_args(argv)
    try:
        check_args(args)
        tokens, shards = load_tokens(args.val_data)
        examples = make_examples(tokens, args)
        size, _ = write_eval_file(args.output, examples)
    except Fail as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {len(examples)} examples of {args.context_tokens} context tokens and "
          f"{args.choices} choices of {args.completion_tokens} tokens, from {len(tokens):,} tokens in {shards} "
          f"shard(s) ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
