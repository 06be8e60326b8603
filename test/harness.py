"""harness.py: the PASS/FAIL/SKIP line protocol of test/run_tests.sh, for Python tests.

A test module defines functions named test_*; run_module() calls each in file order.
A function passes by returning, fails by raising (AssertionError or any other error),
and skips by raising Skip("why"). Each function is one case: the PLAN line states their number
first, the END line closes the run (test/test_harness.h describes the protocol).

Offline data: the folder $SHARED_DATA_DIR (`make test` sets it from the Makefile's SHARED_DATA, default
../shared/data beside the checkout; the same default when a test runs alone) holds tinyshakespeare.txt
and tiktoken_cache/ (tiktoken's cache of the GPT-2 BPE ranks). need_shakespeare() and need_ranks()
skip a case, naming the missing path, when it is not there; importing this module points tiktoken
at the shared ranks (TIKTOKEN_CACHE_DIR) when they are there, so the tests run offline.
"""
import os
import subprocess
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA_DIR = os.environ.get("SHARED_DATA_DIR") or os.path.join(REPO, "..", "shared", "data")
SHAKESPEARE = os.path.join(SHARED_DATA_DIR, "tinyshakespeare.txt")
TIKTOKEN_CACHE = os.path.join(SHARED_DATA_DIR, "tiktoken_cache")
# tiktoken's cache names a file by the sha1 of the URL it downloads r50k_base (GPT-2's ranks) from.
RANKS = os.path.join(TIKTOKEN_CACHE, "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4")
if os.path.isfile(RANKS):
    os.environ["TIKTOKEN_CACHE_DIR"] = TIKTOKEN_CACHE  # over any other cache: the tests run offline


class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


def _need(path, what, where):
    if not os.path.isfile(path):
        raise Skip(f"needs {what}, not found {where} (the shared data folder: make SHARED_DATA=DIR, "
                   f"or SHARED_DATA_DIR=DIR for a test run alone)")


def need_shakespeare():
    """Skips the case unless the shared data folder holds tinyshakespeare.txt."""
    _need(SHAKESPEARE, "Tiny Shakespeare", f"at {SHAKESPEARE}")


def need_ranks():
    """Skips the case unless the shared data folder holds the GPT-2 BPE ranks (tiktoken_cache/)."""
    _need(RANKS, "the GPT-2 BPE ranks", f"in {TIKTOKEN_CACHE}/")


def gpu_listed():
    """Whether nvidia-smi lists a GPU (the GPU cases of the Python tests skip otherwise)."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def expect_error(result, code, *words):
    """A finished subprocess exited with `code` and its stderr names every one of `words`."""
    assert result.returncode == code, f"exit {result.returncode}, want {code}; stderr: {result.stderr.strip()}"
    for word in words:
        assert word in result.stderr, f"stderr lacks {word!r}: {result.stderr.strip()}"


def run_module(namespace):
    cases = [(name, fn) for name, fn in list(namespace.items()) if name.startswith("test_") and callable(fn)]
    print(f"PLAN {len(cases)}", flush=True)
    failures = passes = skips = 0
    for name, fn in cases:
        try:
            fn()
        except Skip as why:
            print(f"SKIP {name}: {why}", flush=True)
            skips += 1
            continue
        except Exception as err:  # a failing case must not stop the others
            failures += 1
            detail = str(err).strip().replace("\n", " | ") or type(err).__name__
            print(f"FAIL {name}: {detail}", flush=True)
            traceback.print_exc(file=sys.stdout)
            continue
        print(f"PASS {name}", flush=True)
        passes += 1
    print(f"END {passes} passed, {failures} failed, {skips} skipped", flush=True)
    sys.exit(1 if failures else 0)
