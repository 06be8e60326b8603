#!/usr/bin/env bash
# run_tests.sh: runs every test program and sums up their cases.
# Called by `make test` from the repository root, after everything is built.
#
# Each test program prints one line per case: `PASS name`, `FAIL name: why` or
# `SKIP name: why` (test/test_harness.h, test/harness.py). GPU programs skip
# their cases themselves when no GPU is found. A program that exits non-zero
# without a FAIL line (a crash) counts as one failure, and so does one that
# runs no case at all. Full output of each program: $BUILD/test_logs/. The attention test runs a
# second time with FLASH2_MMA_SYNC=1, so that on Hopper flash2's mma.sync kernels are tested too.
# Ends with `N passed, N failed, N skipped`; exits 1 when anything failed.
# TEST_ONLY / TEST_EXCLUDE (bash regular expressions, matched against each command) run a part of the
# list, e.g. to run the attention tests beside the others on one GPU.
set -u
export BUILD=${BUILD:-build}
PYTHON=${PYTHON:-.venv/bin/python}

tests=(
    "$BUILD/test_cpu_reference"
    "$PYTHON test/test_cpu_gpt_numpy.py"
    "$BUILD/test_gpt_config"
    "$BUILD/test_dataloader"
    "$BUILD/test_checkpoint"
    "$BUILD/test_launcher"
    "$BUILD/test_stop_signal"
    "$BUILD/test_tokenizer"
    "$BUILD/test_watchdog"
    "$PYTHON test/test_prepare_data.py"
    "$PYTHON test/test_tokenizer.py"
    "$PYTHON test/test_hf_export.py"
    "$PYTHON test/test_train_gpt_cli.py"
    "$PYTHON test/test_scripts.py"
    "$PYTHON test/test_layout.py"
    "$BUILD/test_gpu_build"
    "$BUILD/test_gpu_attention"
    "env FLASH2_MMA_SYNC=1 $BUILD/test_gpu_attention flash2"
    "env FLASH2_FORWARD_LONG_T=1 $BUILD/test_gpu_attention flash2"
    "$BUILD/test_gpu_matmul"
    "$BUILD/test_gpu_layers"
    "$BUILD/test_gpu_gpt"
    "$BUILD/test_gpu_recompute"
    "$BUILD/test_gpu_decode"
    "$BUILD/test_gpu_multi_gpu"
    "$BUILD/test_gpu_generate"
)

mkdir -p "$BUILD/test_logs"
passed=0; failed=0; skipped=0
for cmd in "${tests[@]}"; do
    [[ -n "${TEST_ONLY:-}" && ! "$cmd" =~ $TEST_ONLY ]] && continue
    [[ -n "${TEST_EXCLUDE:-}" && "$cmd" =~ $TEST_EXCLUDE ]] && continue
    # log name: the program's (or script's) name and its arguments, e.g. test_gpu_attention_flash2
    name=$(echo "${cmd#"$PYTHON "}" | sed 's/^env [^ ]* //; s|[^ ]*/||; s/\.py//; s/ /_/g')
    case "$cmd" in env\ FLASH2_MMA_SYNC=1*) name="${name}_mma_sync" ;; esac
    log="$BUILD/test_logs/$name.log"
    echo "== $cmd"
    $cmd >"$log" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$log" | sed 's/^/   /'
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "   FAIL $name: exited with status $rc without reporting a failed case; last lines of $log:"
        tail -n 5 "$log" | sed 's/^/      /'
        f=1
    elif [ $((p + f + s)) -eq 0 ]; then
        echo "   FAIL $name: ran no test case; see $log"
        f=1
    elif [ "$f" -gt 0 ]; then
        echo "   (details: $log)"
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
