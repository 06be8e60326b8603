#!/usr/bin/env bash
# run_tests.sh: runs every test program and sums up their cases.
# Called by `make test` from the repository root, after everything is built.
#
# Each test program prints `PLAN n` (how many cases it runs with these arguments), then one line
# per case: `PASS name`, `FAIL name: why` or `SKIP name: why`, and ends with `END p passed, f failed,
# s skipped` (test/test_harness.h, test/harness.py). GPU programs skip their cases themselves when
# no GPU is found, so a program's PLAN is the same on every machine. The attention test runs a second
# and a third time with FLASH2_MMA_SYNC=1 / FLASH2_FORWARD_LONG_T=1, so that on Hopper flash2's
# mma.sync kernels and its long-sequence forward are tested too.
#
# A program counts as one more failure when it breaks the protocol: it exits non-zero without a
# FAIL line (a crash), runs no case, prints no PLAN line, reports another number of cases than it
# planned, or prints no END line (it stopped on the way). Counts that cannot shrink: each command's
# PLAN must equal its line in test/case_counts.txt (a case that silently stops running is noticed;
# an intended change updates the file), and every line there must name a command of the list below.
# The comparison is left out for the attention test while ATTENTION_TEST_SEQ_LENS is set (it picks
# other sequence lengths, so another number of cases).
#
# Output, per program: `== PROGRAM: P passed, F failed, S skipped`, then each FAIL line whole, each
# broken rule as `   FAIL NAME: why`, and the path of the program's full log ($BUILD/test_logs/NAME.log,
# which also holds the PASS lines), then its skips as one line per distinct reason with a count
# (`   SKIP x2553: no CUDA GPU found`). Ends with `N passed, N failed, N skipped` (CI reads that
# line); exits 1 when anything failed.
# TEST_ONLY / TEST_EXCLUDE (bash regular expressions, matched against each command) run a part of the
# list, e.g. to run the attention tests beside the others on one GPU; a filter that leaves no
# program to run, or is not a valid regular expression, is a failure.
# For the runner's own tests (test/test_scripts.py) only: TEST_PROGRAMS (commands, one a line) replaces
# the list, TEST_CASE_COUNTS (a file) replaces test/case_counts.txt.
set -u
export BUILD=${BUILD:-build}
PYTHON=${PYTHON:-.venv/bin/python}
CASE_COUNTS=${TEST_CASE_COUNTS:-test/case_counts.txt}

tests=(
    "$BUILD/test_cpu_reference"
    "$PYTHON test/test_cpu_gpt_numpy.py"
    "$BUILD/test_gpt_config"
    "$BUILD/test_dataloader"
    "$BUILD/test_checkpoint"
    "$BUILD/test_launcher"
    "$BUILD/test_stop_signal"
    "$BUILD/test_tokenizer"
    "$BUILD/test_prompt_tokens"
    "$BUILD/test_watchdog"
    "$BUILD/test_eval_file"
    "$BUILD/test_zigzag"
    "$PYTHON test/test_prepare_data.py"
    "$PYTHON test/test_prepare_hellaswag.py"
    "$PYTHON test/test_tokenizer.py"
    "$PYTHON test/test_hf_export.py"
    "$PYTHON test/test_train_gpt_cli.py"
    "$PYTHON test/test_eval.py"
    "$PYTHON test/test_scripts.py"
    "$PYTHON test/test_layout.py"
    "$BUILD/test_gpu_build"
    "$BUILD/test_gpu_attention"
    "env FLASH2_MMA_SYNC=1 $BUILD/test_gpu_attention flash2"
    "env FLASH2_FORWARD_LONG_T=1 $BUILD/test_gpu_attention flash2"
    "$BUILD/test_gpu_matmul"
    "$BUILD/test_gpu_fp8"
    "$BUILD/test_gpu_layers"
    "$BUILD/test_gpu_gpt"
    "$BUILD/test_gpu_recompute"
    "$BUILD/test_gpu_decode"
    "$BUILD/test_gpu_decode_linear"
    "$BUILD/test_gpu_multi_gpu"
    "$BUILD/test_gpu_context_parallel"
    "$BUILD/test_gpu_generate"
)
if [ -n "${TEST_PROGRAMS:-}" ]; then mapfile -t tests < <(grep -v '^ *$' <<<"$TEST_PROGRAMS"); fi
END_LINE='^END [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$'  # what test_end() prints

# A command's name, for its log and its line in case_counts.txt: the program's (or script's) name and
# its arguments, e.g. test_gpu_attention_flash2 or test_tokenizer.py (beside the C test_tokenizer).
log_name() {
    local name
    name=$(echo "${1#"$PYTHON "}" | sed 's/^env [^ ]* //; s|[^ ]*/||; s/ /_/g')
    case "$1" in env\ FLASH2_MMA_SYNC=1*) name="${name}_mma_sync" ;; esac
    echo "$name"
}

# The committed counts: "NAME COUNT" lines; '#' starts a comment.
declare -A planned_count=()
if [ -r "$CASE_COUNTS" ]; then
    while read -r key value _; do
        [ -n "$key" ] && planned_count[$key]=$value
    done < <(sed 's/#.*//' "$CASE_COUNTS")
fi

# Prints the problems of one program's run, one a line (nothing when it kept the protocol).
# Arguments: name, log, exit status, passed, failed, skipped.
protocol_problems() {
    local name=$1 log=$2 rc=$3 p=$4 f=$5 s=$6 plans plan early ends
    read -r plans plan early ends < <(awk '
        /^PLAN [0-9]+$/ { if (!n++) v = $2; next }
        /^(PASS|FAIL|SKIP) / { if (!n) early++ }
        $0 ~ end_line { e++ }
        END { printf "%d %s %d %d\n", n, (n ? v : "-"), early, e }' end_line="$END_LINE" "$log")
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && echo "exited with status $rc without reporting a failed case"
    [ $((p + f + s)) -eq 0 ] && echo "ran no test case"
    if [ "$plans" -eq 0 ]; then
        echo "printed no PLAN line (the number of cases it runs, first: test_plan() in C)"
    elif [ "$plans" -gt 1 ]; then
        echo "printed $plans PLAN lines (one, before its first case)"
    elif [ "$early" -gt 0 ]; then
        echo "reported $early cases before its PLAN line"
    fi
    if [ "$plans" -ge 1 ] && [ $((p + f + s)) -ne "$plan" ]; then
        echo "reported $((p + f + s)) cases of the $plan it planned"
    fi
    [ "$ends" -eq 0 ] && echo "printed no END line: it stopped before its end (a crash, or an exit on the way)"
    [ "$plans" -ge 1 ] && count_problem "$name" "$plan"
}

# The committed count of `name` against the PLAN it stated (left out where ATTENTION_TEST_SEQ_LENS
# changes the attention test's cases).
count_problem() {
    local name=$1 plan=$2 want=${planned_count[$1]:-}
    [[ -n "${ATTENTION_TEST_SEQ_LENS:-}" && "$name" == test_gpu_attention* ]] && return
    if [ -z "$want" ]; then
        echo "planned $plan cases and $CASE_COUNTS has no line for it: add \"$name $plan\" if that is intended"
    elif [ "$want" != "$plan" ]; then
        echo "planned $plan cases, $CASE_COUNTS says $want: update $CASE_COUNTS if the change is intended"
    fi
}

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
# Names are unique, and every committed count belongs to a command of the list (a command dropped
# from it drops its cases).
declare -A listed=()
for cmd in "${tests[@]}"; do
    name=$(log_name "$cmd")
    if [ -n "${listed[$name]:-}" ]; then
        echo "FAIL two commands of the list are named $name: their logs and counts would mix"
        failed=$((failed + 1))
    fi
    listed[$name]=1
done
for key in "${!planned_count[@]}"; do
    [ -n "${listed[$key]:-}" ] && continue
    echo "FAIL $CASE_COUNTS lists $key, which no command of the list runs: remove it if that is intended"
    failed=$((failed + 1))
done
for cmd in "${tests[@]}"; do
    [[ -n "${TEST_ONLY:-}" && ! "$cmd" =~ $TEST_ONLY ]] && continue
    [[ -n "${TEST_EXCLUDE:-}" && "$cmd" =~ $TEST_EXCLUDE ]] && continue
    programs=$((programs + 1))
    name=$(log_name "$cmd")
    log="$BUILD/test_logs/$name.log"
    $cmd >"$log" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    mapfile -t problems < <(protocol_problems "$name" "$log" "$rc" "$p" "$f" "$s")
    # a crash or a program that stopped on the way: its last lines say where
    stopped=0
    if { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; } || ! grep -Eq "$END_LINE" "$log"; then stopped=1; fi
    [ ${#problems[@]} -gt 0 ] && f=$((f + 1))
    echo "== $cmd: $p passed, $f failed, $s skipped"
    grep '^FAIL ' "$log" | sed 's/^/   /'
    for problem in "${problems[@]}"; do echo "   FAIL $name: $problem"; done
    [ "$f" -gt 0 ] && echo "   (full log: $log)"
    if [ "$stopped" -eq 1 ]; then
        echo "   its last lines (exit status $rc):"
        tail -n 5 "$log" | sed 's/^/      /'
    fi
    # skips: one line per distinct reason (the text after "SKIP name: "), in order of first appearance
    grep '^SKIP ' "$log" | sed 's/^SKIP [^:]*$/(no reason given)/; s/^SKIP [^:]*: \{0,1\}//' |
        awk '{ if (!($0 in n)) order[k++] = $0; n[$0]++ }
             END { for (i = 0; i < k; i++) printf "   SKIP x%d: %s\n", n[order[i]], order[i] }'
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done
if [ "$programs" -eq 0 ]; then
    echo "FAIL no test program left to run by${filters:- an empty list}; they are matched against these commands:"
    printf '   %s\n' "${tests[@]}"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
