"""harness.py: the PASS/FAIL/SKIP line protocol of test/run_tests.sh, for Python tests.

A test module defines functions named test_*; run_module() calls each in file order.
A function passes by returning, fails by raising (AssertionError or any other error),
and skips by raising Skip("why").
"""
import sys
import traceback


class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


def run_module(namespace):
    failures = 0
    for name, fn in list(namespace.items()):
        if not (name.startswith("test_") and callable(fn)):
            continue
        try:
            fn()
        except Skip as why:
            print(f"SKIP {name}: {why}", flush=True)
            continue
        except Exception as err:  # a failing case must not stop the others
            failures += 1
            detail = str(err).strip().replace("\n", " | ") or type(err).__name__
            print(f"FAIL {name}: {detail}", flush=True)
            traceback.print_exc(file=sys.stdout)
            continue
        print(f"PASS {name}", flush=True)
    sys.exit(1 if failures else 0)
