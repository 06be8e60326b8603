#!/usr/bin/env bash
# run_tests.sh: runs every test program and sums up their cases.
# Called by `make test` from the repository root, after everything is built.
#
# Each test program prints one line per case: `PASS name`, `FAIL name: why` or
# `SKIP name: why` (test/test_harness.h, test/harness.py). GPU programs skip
# their cases themselves when no GPU is found. A program that exits non-zero
# without a FAIL line (a crash) counts as one failure, and so does one that
# runs no case at all. The attention test runs a second and a third time with
# FLASH2_MMA_SYNC=1 / FLASH2_FORWARD_LONG_T=1, so that on Hopper flash2's mma.sync
# kernels and its long-sequence forward are tested too.
#
# Output, per program: `== PROGRAM: P passed, F failed, S skipped`, then each FAIL line
# whole and the path of the program's full log ($BUILD/test_logs/NAME.log, which also
# holds the PASS lines), then its skips as one line per distinct reason with a count
# (`   SKIP x2553: no CUDA GPU found`). Ends with `N passed, N failed, N skipped`
# (CI reads that line); exits 1 when anything failed.
# TEST_ONLY / TEST_EXCLUDE (bash regular expressions, matched against each command) run a part of the
# list, e.g. to run the attention tests beside the others on one GPU; a filter that leaves no
# program to run, or is not a valid regular expression, is a failure.
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
passed=0; failed=0; skipped=0; programs=0
filters=""
for var in TEST_ONLY TEST_EXCLUDE; do
    [ -z "${!var:-}" ] && continue
    filters+=" $var='${!var}'"
    [[ "" =~ ${!var} ]]
    if [ $? -eq 2 ]; then
        echo "FAIL $var='${!var}' is not a valid (bash, extended) regular expression"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
done
for cmd in "${tests[@]}"; do
    [[ -n "${TEST_ONLY:-}" && ! "$cmd" =~ $TEST_ONLY ]] && continue
    [[ -n "${TEST_EXCLUDE:-}" && "$cmd" =~ $TEST_EXCLUDE ]] && continue
    programs=$((programs + 1))
    # log name: the program's (or script's) name and its arguments, e.g. test_gpu_attention_flash2
    name=$(echo "${cmd#"$PYTHON "}" | sed 's/^env [^ ]* //; s|[^ ]*/||; s/\.py//; s/ /_/g')
    case "$cmd" in env\ FLASH2_MMA_SYNC=1*) name="${name}_mma_sync" ;; esac
    log="$BUILD/test_logs/$name.log"
    $cmd >"$log" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    note=()
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        note=("   FAIL $name: exited with status $rc without reporting a failed case; last lines of $log:")
        while IFS= read -r line; do note+=("      $line"); done < <(tail -n 5 "$log")
        f=1
    elif [ $((p + f + s)) -eq 0 ]; then
        note=("   FAIL $name: ran no test case; see $log")
        f=1
    fi
    echo "== $cmd: $p passed, $f failed, $s skipped"
    if grep -q '^FAIL ' "$log"; then
        grep '^FAIL ' "$log" | sed 's/^/   /'
        echo "   (full log: $log)"
    fi
    [ ${#note[@]} -gt 0 ] && printf '%s\n' "${note[@]}"
    # skips: one line per distinct reason (the text after "SKIP name: "), in order of first appearance
    grep '^SKIP ' "$log" | sed 's/^SKIP [^:]*$/(no reason given)/; s/^SKIP [^:]*: \{0,1\}//' |
        awk '{ if (!($0 in n)) order[k++] = $0; n[$0]++ }
             END { for (i = 0; i < k; i++) printf "   SKIP x%d: %s\n", n[order[i]], order[i] }'
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done
if [ "$programs" -eq 0 ]; then
    echo "FAIL no test program left to run by${filters:- an empty list}; they are matched against these commands:"
    printf '   %s\n' "${tests[@]}"
    failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
