#!/usr/bin/env bash
# run_attention_on_gpu.sh: on a GPU machine with PyTorch, after `make all` (here or elsewhere):
# the attention tests, the PyTorch cross-check on large shapes, and the attention benchmark.
#
#   bash scripts/run_attention_on_gpu.sh [LOG_DIR] [bench flags...]
#
# Set GIT_COMMIT to the commit being run where the copy's git metadata is stale.
# Writes LOG_DIR/test_gpu_attention.log, LOG_DIR/check_attention.log, LOG_DIR/bench_attention.log
# and the benchmark's scripts/results/attention_<gpu>.{json,md}. Prints a short summary last.
set -uo pipefail
LOG_DIR=${1:-build/gpu_attention}
shift || true
mkdir -p "$LOG_DIR"
{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; } \
    >"$LOG_DIR/environment.txt" 2>&1

build/test_gpu_attention >"$LOG_DIR/test_gpu_attention.log" 2>&1
test_rc=$?
python3 scripts/check_attention.py --log "$LOG_DIR/check_attention_table.txt" >"$LOG_DIR/check_attention.log" 2>&1
check_rc=$?
python3 scripts/bench_attention.py "$@" >"$LOG_DIR/bench_attention.log" 2>&1
bench_rc=$?

echo "== test_gpu_attention (exit $test_rc): $(grep -c '^PASS ' "$LOG_DIR/test_gpu_attention.log") passed, $(grep -c '^FAIL ' "$LOG_DIR/test_gpu_attention.log") failed, $(grep -c '^SKIP ' "$LOG_DIR/test_gpu_attention.log") skipped"
grep '^FAIL ' "$LOG_DIR/test_gpu_attention.log" | head -20
echo "== check_attention (exit $check_rc)"
tail -n 25 "$LOG_DIR/check_attention.log"
echo "== bench_attention (exit $bench_rc)"
tail -n 60 "$LOG_DIR/bench_attention.log"
