#!/usr/bin/env bash
# run_fuzz.sh: runs the libFuzzer targets of test/fuzz/ for a fixed time each (make fuzz calls it).
#   usage: bash test/fuzz/run_fuzz.sh SECONDS BUILD_DIR TARGET...
# For each TARGET: the committed valid_* seeds must parse (FUZZ_EXPECT_VALID=1), then BUILD_DIR/fuzz_TARGET
# fuzzes for SECONDS from a scratch copy of test/fuzz/corpus/TARGET (the committed corpus is never
# modified; regression inputs in it run first). Any crash, sanitizer report, leak or timeout fails:
# the input is kept as BUILD_DIR/fuzz_artifacts/TARGET/crash-* and the report is printed. The full
# libFuzzer output is in BUILD_DIR/fuzz_logs/TARGET.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=$1 build=$2
shift 2
failed=()
for t in "$@"; do
    bin=$build/fuzz_$t corpus=test/fuzz/corpus/$t work=$build/fuzz_work/$t art=$build/fuzz_artifacts/$t
    log=$build/fuzz_logs/$t.log
    rm -rf "$work" "$art"
    mkdir -p "$work" "$art" "$build/fuzz_logs"
    cp "$corpus"/* "$work"/
    if ! FUZZ_EXPECT_VALID=1 "$bin" "$corpus"/valid_* >"$log" 2>&1; then
        echo "fuzz_$t: FAILED: a committed valid_* seed no longer parses (make fuzz-seeds rewrites them):"
        grep -E "^fuzz:|ERROR" "$log" | head -n 5
        failed+=("$t")
        continue
    fi
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art/" "$work" >>"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -E "^#[0-9]+" "$log" | tail -n 1 | grep -oE "cov: [0-9]+ ft: [0-9]+")
    if [ "$rc" -ne 0 ]; then
        echo "fuzz_$t: FAILED (libFuzzer exit $rc) after ${runs:-?} runs; the report (all of it in $log):"
        grep -A 40 -E "ERROR: |runtime error|==[0-9]+==" "$log" | head -n 60
        ls "$art" 2>/dev/null | sed "s|^|  input kept: $art/|"
        failed+=("$t")
    else
        echo "fuzz_$t: ok: ${runs:-?} runs in ${seconds} s (${speed:-?} exec/s), ${cov:-cov ?}"
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzz: all $# targets ran ${seconds} s each without a crash"
