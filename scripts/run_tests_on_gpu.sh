#!/usr/bin/env bash
# run_tests_on_gpu.sh: the whole test suite on a GPU machine that has no network, with the
# build made on another machine (`make all`) and that machine's python3 (numpy, tiktoken).
# `make test` would try to make .venv from PyPI; this calls the same runner without it.
#
#   bash scripts/run_tests_on_gpu.sh [LOG_DIR]     (from the repository root)
#
# Writes LOG_DIR/environment.txt, LOG_DIR/test_log.txt (the runner's summary), LOG_DIR/test_logs/
# (each program's full output, every case's line) and LOG_DIR/plans.txt (train_gpt's plan for the
# paper's configurations on the default dataset). Exits non-zero when a test failed.
set -uo pipefail
LOG_DIR=${1:-build/gpu_run}
mkdir -p "$LOG_DIR"
export BUILD=build PYTHON=${PYTHON:-python3}

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; nvidia-smi; nvcc --version; $PYTHON --version; } \
    >"$LOG_DIR/environment.txt" 2>&1

# C tests are built with the sanitizers; where this machine lacks their runtime, rebuild without.
for t in test_cpu_reference test_gpt_config test_dataloader test_checkpoint test_launcher test_stop_signal test_tokenizer test_watchdog \
    test_eval_file test_prompt_tokens test_zigzag; do
    if ldd "build/$t" | grep -q "not found"; then
        echo "rebuilding build/$t without sanitizers (their runtime is missing here)" | tee -a "$LOG_DIR/environment.txt"
        rm -f "build/$t" build/*.o
        make --no-print-directory TEST_CFLAGS="-std=c11 -O2 -g -Wall -Wextra -I." "build/$t" >>"$LOG_DIR/environment.txt" 2>&1
    fi
done

bash test/run_tests.sh 2>&1 | tee "$LOG_DIR/test_log.txt"
status=${PIPESTATUS[0]}
mkdir -p "$LOG_DIR/test_logs" && cp -p build/test_logs/*.log "$LOG_DIR/test_logs/" 2>/dev/null

{
    for args in "--model gpt3-1.3b -t 2048 -b 8" "--model gpt3-1.3b -t 8192 -b 2" \
                "--model gpt3-2.7b -t 2048 -b 4" "--model gpt3-2.7b-d128 -t 8192 -b 1"; do
        echo "\$ ./train_gpt $args"
        ./train_gpt --plan-only --checkpoint-dir none --sample-tokens 0 $args
        echo "(exit $?)"
    done
} >"$LOG_DIR/plans.txt" 2>&1
exit "$status"
