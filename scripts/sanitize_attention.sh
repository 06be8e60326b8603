#!/usr/bin/env bash
# sanitize_attention.sh: flash2's kernels under compute-sanitizer on small odd shapes, through the
# attention test (build/test_gpu_attention, every head dim, causal and not, both layouts, the
# deterministic backward too): memcheck (out-of-bounds and misaligned accesses, leaks), racecheck
# (shared-memory hazards between threads) and synccheck (barrier misuse). On a GPU machine, after
# `make all`:
#
#   bash scripts/sanitize_attention.sh [LOG_DIR]      (default build/sanitize)
#
# T = 17 (one partial block) and 300 (several key blocks: the TMA rings wrap, dQ gets several
# additions) for memcheck and synccheck; racecheck, the slowest, at 300. Writes LOG_DIR/<tool>.log
# and prints one line per tool; exits non-zero when a tool reported an error or a case failed.
set -uo pipefail
LOG_DIR=${1:-build/sanitize}
mkdir -p "$LOG_DIR"
status=0
run_tool() {  # tool, sequence lengths
    local tool=$1 lens=$2
    ATTENTION_TEST_SEQ_LENS=$lens compute-sanitizer --tool "$tool" --error-exitcode 99 \
        build/test_gpu_attention flash2 >"$LOG_DIR/$tool.log" 2>&1
    local rc=$?
    local passed failed summary
    passed=$(grep -c '^PASS attention_flash2' "$LOG_DIR/$tool.log")
    failed=$(grep -c '^FAIL' "$LOG_DIR/$tool.log")
    summary=$(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$LOG_DIR/$tool.log" || echo "no summary")
    echo "$tool (T = $lens): exit $rc, $passed flash2 cases passed, $failed failed; $summary"
    [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] || status=1
}
run_tool memcheck 17,300
run_tool synccheck 17,300
run_tool racecheck 300
exit $status
