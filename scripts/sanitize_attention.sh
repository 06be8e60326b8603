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
# additions) for memcheck and synccheck; racecheck, the slowest, at 300. Then each tool once more
# with FLASH2_FORWARD_LONG_T=1, so that the forward's long-sequence shape (flash2_tiles.h: three
# warpgroups at head dim 128, normally from 2048 keys) runs at these lengths too. Writes
# LOG_DIR/<tool>.log (and <tool>_long.log) and prints one line per run; exits non-zero when a tool
# reported an error or a case failed.
set -uo pipefail
LOG_DIR=${1:-build/sanitize}
mkdir -p "$LOG_DIR"
status=0
run_tool() {  # tool, sequence lengths, [FLASH2_FORWARD_LONG_T]
    local tool=$1 lens=$2 long_t=${3:-} log="$LOG_DIR/$1${3:+_long}.log"
    FLASH2_FORWARD_LONG_T=$long_t ATTENTION_TEST_SEQ_LENS=$lens compute-sanitizer --tool "$tool" \
        --error-exitcode 99 build/test_gpu_attention flash2 >"$log" 2>&1
    local rc=$?
    local passed failed summary
    passed=$(grep -c '^PASS attention_flash2' "$log")
    failed=$(grep -c '^FAIL' "$log")
    summary=$(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$log" || echo "no summary")
    echo "$tool (T = $lens${long_t:+, FLASH2_FORWARD_LONG_T=$long_t}): exit $rc, $passed flash2 cases passed, $failed failed; $summary"
    [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] || status=1
}
run_tool memcheck 17,300
run_tool synccheck 17,300
run_tool racecheck 300
run_tool memcheck 17,300 1
run_tool synccheck 17,300 1
run_tool racecheck 300 1
exit $status
