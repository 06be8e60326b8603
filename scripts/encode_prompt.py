#!/usr/bin/env python3
"""encode_prompt.py: a text prompt as GPT-2 token ids for `train_gpt --generate M --prompt-tokens ...`.

The text is encoded with tiktoken's GPT-2 encoding (r50k_base), as scripts/prepare_data.py encodes the
training data (encode_ordinary: a literal "<|endoftext|>" is text). With --eot the prompt starts with
the end-of-text token 50256, as every document of the training data does.

    python scripts/encode_prompt.py "To be, or not to be"            # prints 2514,307,11,393,407,284,307
    python scripts/encode_prompt.py --eot --out prompt.txt "ROMEO:"  # writes the ids to prompt.txt
    ./train_gpt --generate 64 --resume ckpt --prompt-tokens prompt.txt
    ./train_gpt --generate 64 --resume ckpt --prompt-tokens $(python scripts/encode_prompt.py "ROMEO:")

Offline, set TIKTOKEN_CACHE_DIR to a folder holding the r50k_base ranks (`make` does when
../shared/data/tiktoken_cache exists). Exit 0, or 1 with a message when tiktoken cannot load the
encoding; 2 on a usage error (argparse).
"""
import argparse
import sys

ENCODING = "r50k_base"
EOT = 50256


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text", nargs="?", help="the prompt text (default: read from --file or stdin)")
    ap.add_argument("--file", help="read the prompt text from this file (UTF-8)")
    ap.add_argument("--eot", action="store_true", help="start with <|endoftext|> (50256)")
    ap.add_argument("--out", help="write the comma-separated ids to this file instead of printing them")
    args = ap.parse_args(argv)
    if args.text is not None and args.file:
        ap.error("give the text or --file, not both")
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = args.text if args.text is not None else sys.stdin.read()
    try:
        import tiktoken
        enc = tiktoken.get_encoding(ENCODING)
    except Exception as err:  # missing module, no network, bad cache: the same advice
        sys.exit(f"encode_prompt.py: error: tiktoken cannot load {ENCODING} ({type(err).__name__}: {err}); "
                 f"pip install tiktoken, and offline set TIKTOKEN_CACHE_DIR to a folder holding its ranks")
    ids = ([EOT] if args.eot else []) + enc.encode_ordinary(text)
    if not ids:
        sys.exit("encode_prompt.py: error: the prompt is empty; give some text or --eot")
    line = ",".join(str(i) for i in ids)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
        print(f"{len(ids)} tokens written to {args.out}", file=sys.stderr)
    else:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
