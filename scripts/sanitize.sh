#!/usr/bin/env bash
# sanitize.sh: compute-sanitizer's four tools over every kernel family, on small odd shapes. On a GPU
# machine, after `make build/sanitize_kernels` (or `make all`):
#
#   bash scripts/sanitize.sh [LOG_DIR]      (default build/sanitize)
#
# Tools: memcheck (out-of-bounds and misaligned accesses, bad API calls), synccheck (barrier misuse),
# initcheck (reads of device memory nothing wrote) and racecheck (shared-memory hazards), plus a
# plain run without a sanitizer (does the family work at all). Families: build/sanitize_kernels
# --families (layers, matmul, model, generate, decode, naive, flash1, flash2), and flash2 twice more as
# the tests run it: flash2-long (FLASH2_FORWARD_LONG_T=1: the Hopper forward's long-sequence tile shape
# at these lengths; forward only, the backward is flash2's) and flash2-mma-sync (FLASH2_MMA_SYNC=1: the
# mma.sync kernels on Hopper). Attention at T = 17 (one partial block) and 301 (several key blocks:
# the TMA rings wrap, flash1 has two key blocks); racecheck, the slowest, at 301 only; naive at 17
# and 129. What each family calls, and why its memory is filled as it is, is at the top of
# test/sanitize_kernels.cu.
#
# Output: for each run (tool, family), one line with its verdict, errors (compute-sanitizer's own
# summary: the total, though the tool prints only the first 100 reports, --print-limit), cases,
# kernels, exit status and seconds (wall time, SANITIZE_JOBS runs sharing the GPU); then one line per
# kernel that ran (its launches, counted inside the program: a kernel is listed only if it was
# launched, and its case then finished); then, where there were errors, the distinct printed reports
# (what, where) with their counts, and how many more were not printed. Errors are counted per run: a
# report names the function it was found in, often an inlined helper rather than the kernel. cuBLAS
# and cuBLASLt kernels (matmul, model, generate, naive) run under the tools too, but launch inside
# those libraries, so they are not listed. Last, a table of errors per family and tool. Everything
# printed is also in LOG_DIR/summary.txt; each run's whole output (the sanitizer's reports with
# backtraces) in LOG_DIR/<family>_<tool>.log. Exits non-zero when any run found an error, failed a
# case, timed out or was not run.
#
# Nothing is suppressed: every kernel, ours and the libraries', runs under every tool with the tool's
# defaults (--error-exitcode aside). For initcheck the driver fills every input and leaves outputs,
# scratch and workspaces unwritten, except what the top of test/sanitize_kernels.cu names: flash2's
# tile counter (read unzeroed by design) and outputs that only TMA stores write (cuBLASLt's Hopper
# GEMMs, flash2's Hopper forward), which initcheck does not see written. A report inside
# cuBLAS/cuBLASLt names the library's kernel and fails the run too (SANITIZE_EXTRA_ARGS can exclude
# kernels by name for a rerun, visibly: the options are printed with the results).
#
# Settings (environment): SANITIZE_TOOLS (default "plain memcheck synccheck initcheck racecheck"),
# SANITIZE_FAMILIES (default all eleven), SANITIZE_JOBS (runs at once on the one GPU, default 4),
# SANITIZE_BUDGET_S (no run starts later than this many seconds after the start, and none runs past it;
# default 420), SANITIZE_RUN_LIMIT_S (one run's limit, default 300), SANITIZE_EXTRA_ARGS (more
# compute-sanitizer options for every run), COMPUTE_SANITIZER (the tool's path).
set -uo pipefail

LOG_DIR=${1:-build/sanitize}
BIN=build/sanitize_kernels
TOOLS=${SANITIZE_TOOLS:-plain memcheck synccheck initcheck racecheck}
FAMILIES=${SANITIZE_FAMILIES:-layers matmul model generate decode fp8 naive flash1 flash2 flash2-long flash2-mma-sync}
JOBS=${SANITIZE_JOBS:-4}
[ "$JOBS" -ge 1 ] 2>/dev/null || JOBS=1
BUDGET=${SANITIZE_BUDGET_S:-420}
RUN_LIMIT=${SANITIZE_RUN_LIMIT_S:-300}
EXTRA=${SANITIZE_EXTRA_ARGS:-}
SUMMARY=$LOG_DIR/summary.txt

find_sanitizer() {
    local c
    for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
        "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
        if [ -n "$c" ] && [ -x "$c" ]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

# The command line of one run, as words on one line: [VAR=value ...] driver arguments. flash1 and
# flash2 at 17 and 301 keys (racecheck: 301), naive at 17 and 129.
run_args() {  # family tool
    local lens="17,301"
    [ "$2" = racecheck ] && lens=301
    case $1 in
        naive) echo "naive --seq-lens 17,129" ;;
        flash1 | flash2) echo "$1 --seq-lens $lens" ;;
        flash2-long) echo "FLASH2_FORWARD_LONG_T=1 flash2 --seq-lens $lens --forward-only" ;;
        flash2-mma-sync) echo "FLASH2_MMA_SYNC=1 flash2 --seq-lens $lens" ;;
        *) echo "$1" ;;
    esac
}

# compute-sanitizer's options for a tool (none for the plain run).
tool_opts() {
    case $1 in
        plain) ;;
        *) echo "--tool $1 --error-exitcode 99 $EXTRA" ;;
    esac
}

# One run, in the background: its log, and "rc seconds" in LOG_DIR/.status/<family>_<tool>.
run_one() {  # tool family limit_s
    local tool=$1 family=$2 limit=$3 word
    local -a envs=() cmd=("$BIN")
    for word in $(run_args "$family" "$tool"); do
        if [[ $word == *=* ]]; then envs+=("$word"); else cmd+=("$word"); fi
    done
    if [ "$tool" != plain ]; then
        local -a opts
        read -r -a opts <<<"$(tool_opts "$tool")"
        cmd=("$SAN" "${opts[@]}" "${cmd[@]}")
    fi
    local log=$LOG_DIR/${family}_$tool.log t0=$SECONDS rc
    {
        echo "\$ ${envs[*]+${envs[*]} }${cmd[*]}   (limit $limit s)"
        env ${envs[@]+"${envs[@]}"} timeout -k 10 "$limit" "${cmd[@]}"
    } >"$log" 2>&1
    rc=$?
    echo "$rc $((SECONDS - t0))" >"$LOG_DIR/.status/${family}_$tool"
    printf '[%3d s] %-9s %-15s exit %d after %d s\n' "$((SECONDS - START))" "$tool" "$family" "$rc" "$((SECONDS - t0))"
}

# The words of $2 (a preferred order) that are in $1, then the rest of $1.
ordered() {  # selected preferred
    local w out=""
    for w in $2; do [[ " $1 " == *" $w "* ]] && out="$out $w"; done
    for w in $1; do [[ " $out " == *" $w "* ]] || out="$out $w"; done
    echo "$out"
}

# Every (tool, family), up to JOBS at once: the plain runs first (a family that fails without a
# sanitizer fails early), then the slowest tools and families, so the queue ends on short runs. A run
# that would start past the budget is not started; a running one stops at it.
run_all() {
    local tool family left
    for tool in $(ordered "$TOOLS" "plain racecheck initcheck memcheck synccheck"); do
        for family in $(ordered "$FAMILIES" "flash2 flash2-mma-sync model flash1 generate matmul naive flash2-long"); do
            while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
            left=$((BUDGET - (SECONDS - START)))
            if [ "$left" -lt 20 ]; then
                echo "skipped 0" >"$LOG_DIR/.status/${family}_$tool"
                printf '[%3d s] %-9s %-15s not started: the budget of %d s is spent\n' "$((SECONDS - START))" \
                    "$tool" "$family" "$BUDGET"
                continue
            fi
            run_one "$tool" "$family" "$((left < RUN_LIMIT ? left : RUN_LIMIT))" &
        done
    done
    wait
}

# The error count in a run's log: compute-sanitizer's summary line ("?" when it has none).
sanitizer_errors() {  # tool log
    local line
    if [ "$1" = racecheck ]; then
        line=$(grep -a 'RACECHECK SUMMARY' "$2" | tail -1)
        # "N hazards displayed (E errors, W warnings)": a warning is a hazard too
        [ -n "$line" ] && echo "$line" | sed -E 's/.*\(([0-9]+) errors?, ([0-9]+) warnings?\).*/\1 \2/' |
            awk 'NF == 2 { print $1 + $2; next } { print "?" }' && return
    else
        # "ERROR SUMMARY: N errors" is the total; past --print-limit a second line follows, "ERROR
        # SUMMARY: M errors were not printed ...", whose M counts only the unprinted ones
        line=$(grep -a -E 'ERROR SUMMARY: [0-9]+ errors?$' "$2" | tail -1)
        [ -n "$line" ] && echo "$line" | sed -E 's/.*ERROR SUMMARY: ([0-9]+) errors?$/\1/' &&
            return
    fi
    echo "?"
}

# The distinct reports of a log, most frequent first: a report's first line with the first "at ..."
# or "and ..." line after it (where it was found; racecheck's second access).
report_kinds() {  # log
    awk '
        function flush() { if (head != "") count[head]++; head = "" }
        /^========= [^ ]/ {
            flush()
            line = substr($0, 11)
            if (line !~ /^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application)/)
                head = line
            next
        }
        /^=========     (at|and) / && head != "" {
            line = $0
            sub(/^=========     /, "", line)
            head = head " | " line
            flush()
        }
        END {
            flush()
            for (k in count) printf "%6d x  %s\n", count[k], substr(k, 1, 240)
        }
    ' "$1" | sort -rn | head -8
}

# One run's lines: its verdict line, a line per kernel, and (failed runs) its distinct reports. Sets
# VERDICT and CELL (the table's entry).
report_run() {  # tool family
    local tool=$1 family=$2 log=$LOG_DIR/${2}_$1.log rc secs
    read -r rc secs <"$LOG_DIR/.status/${family}_$tool" 2>/dev/null || rc=skipped
    if [ "$rc" = skipped ]; then
        VERDICT=FAIL CELL="not run"
        printf '%-9s %-15s FAIL: not run (the budget of %d s was spent)\n' "$tool" "$family" "$BUDGET"
        return
    fi
    local errors=- ok failed done_line launch_failures why="" timed_out=0
    [ "$tool" != plain ] && errors=$(sanitizer_errors "$tool" "$log")
    ok=$(grep -ac '^case .*: ok$' "$log")
    failed=$(grep -a -m1 '^case .*: FAILED' "$log")
    done_line=$(grep -a -m1 -E '^(done|incomplete) ' "$log")
    launch_failures=$(awk '$1 == "kernel" { s += $3 } END { print s + 0 }' "$log")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then timed_out=1 why="$why; timed out"; fi
    [ "$errors" != 0 ] && [ "$errors" != - ] && why="$why; $errors errors"
    [ "$rc" != 0 ] && why="$why; exit $rc"
    [ -n "$failed" ] && why="$why; ${failed#case }"
    [[ $done_line == done* ]] || why="$why; did not finish"
    [ "$launch_failures" != 0 ] && why="$why; $launch_failures launches failed"
    [ "$ok" = 0 ] && why="$why; no case ran"
    if [ -z "$why" ]; then
        VERDICT=PASS CELL=0
        [ "$tool" = plain ] && CELL=ok
    else
        VERDICT=FAIL CELL="$errors"
        [ "$CELL" = 0 ] || [ "$CELL" = - ] && CELL=fail
        [ "$timed_out" = 1 ] && CELL=timeout
    fi
    local listed
    listed=$(echo "${done_line:-no kernel list}" | sed -E 's/^(done|incomplete) [^:]*: [0-9]+ cases ok, //')
    printf '%-9s %-15s %s: %s errors, %s cases ok, %s; exit %s, %s s%s\n' "$tool" "$family" "$VERDICT" "$errors" \
        "$ok" "$listed" "$rc" "$secs" "${why:+ [${why#; }]}"
    awk -v t="$tool" -v f="$family" '$1 == "kernel" {
        name = $0
        sub(/^kernel [0-9]+ [0-9]+ /, "", name)
        plural = ($2 == 1) ? "  " : "es"
        failed = ($3 > 0) ? (" (" $3 " failed)") : ""
        printf "%-9s %-15s   %5d launch%s%s  %s\n", t, f, $2, plural, failed, name
    }' "$log"
    [ "$VERDICT" = FAIL ] || return 0
    local prefix unprinted
    prefix=$(printf '%-9s %-15s ! ' "$tool" "$family")
    report_kinds "$log" | sed "s/^/$prefix/"
    # the kinds are those of the printed reports only: say how many more there were
    unprinted=$(grep -a -o -E 'ERROR SUMMARY: [0-9]+ errors? (was|were) not printed' "$log" | tail -1 |
        grep -o -E '[0-9]+')
    [ -n "$unprinted" ] &&
        echo "$prefix(and $unprinted more not printed: SANITIZE_EXTRA_ARGS=\"--print-limit 0\" prints all)"
    return 0
}

# Everything: each tool's runs in family order, then the table.
print_report() {
    local tool family fails=0 runs=0
    declare -A cells
    local commit version
    commit=${GIT_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo '?')}
    version=$("$SAN" --version 2>/dev/null | grep -i -m1 version)
    echo "# scripts/sanitize.sh $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
    echo "# $DEVICE"
    echo "# $version; $JOBS runs at once, budget $BUDGET s, extra options: ${EXTRA:-none}"
    for tool in $TOOLS; do
        echo
        echo "== $tool"
        for family in $FAMILIES; do
            report_run "$tool" "$family"
            cells[$tool/$family]=$CELL
            runs=$((runs + 1))
            [ "$VERDICT" = PASS ] || fails=$((fails + 1))
        done
    done
    echo
    echo "errors per family and tool (0: clean; logs in $LOG_DIR/<family>_<tool>.log)"
    printf '%-16s' family
    for tool in $TOOLS; do printf ' %-10s' "$tool"; done
    echo
    for family in $FAMILIES; do
        printf '%-16s' "$family"
        for tool in $TOOLS; do printf ' %-10s' "${cells[$tool/$family]}"; done
        echo
    done
    if [ "$fails" = 0 ]; then echo "all clean: $runs runs in $((SECONDS - START)) s"
    else echo "FAILED: $fails of $runs runs (see above and the logs)"; fi
    return $((fails > 0))
}

START=$SECONDS
mkdir -p "$LOG_DIR/.status"
rm -f "$LOG_DIR"/.status/* "$LOG_DIR"/*_{plain,memcheck,synccheck,initcheck,racecheck}.log
if [ ! -x "$BIN" ]; then
    echo "sanitize.sh: $BIN is missing; build it first: make build/sanitize_kernels" >&2
    exit 1
fi
if ! SAN=$(find_sanitizer); then
    echo "sanitize.sh: compute-sanitizer not found (it comes with the CUDA toolkit); put it on PATH or set" \
        "COMPUTE_SANITIZER" >&2
    exit 1
fi
if ! DEVICE=$("$BIN" --check); then
    echo "sanitize.sh: $DEVICE" >&2
    exit 1
fi
echo "sanitize.sh: $DEVICE; $SAN; tools: $TOOLS; $JOBS runs at once, budget $BUDGET s; logs in $LOG_DIR"
run_all
print_report >"$SUMMARY"
status=$?
cat "$SUMMARY"
exit $status
