#!/usr/bin/env bash
# run_multigpu_on_gpu.sh: the multi-GPU checks and benchmark on a machine with 2 GPUs, from the
# repository root, with ./train_gpt built elsewhere (`make train_gpt`) and the Tiny Shakespeare
# shards in data/tinyshakespeare/ (`make train` makes them).
#
#   bash scripts/run_multigpu_on_gpu.sh [OUTDIR]        (default build/multigpu_run)
#
#   (a) equivalence: GPT-2 124M, -b 4 -t 256, 8192 tokens per step, 20 steps: 1 GPU accumulating 8
#       micro steps vs 2 GPUs (4 each) without and with --zero 1; max |dloss| per step
#   (b) resume with --zero 1: 20 steps saving at 10 and 20, then a run resumed from step 10's
#       per-rank files: steps 11-20 must match; a 1-GPU resume of those files must be refused
#   (c) torchrun-style environment launch; wrong launches (world sizes disagree, a missing rank)
#       must fail with a clear message within the rendezvous timeout
#   (d) GPT3-1.3B seq 2048 micro batch 8, 131072 tokens per step: per-GPU TFLOP/s, exposed communication
#       and peak memory, 1 GPU vs 2 GPUs with and without --zero 1, and PyTorch + torch.compile on 1 GPU
#       and under torchrun DDP on 2 (scripts/bench_multigpu.py --gpus 2; it fails below 0.99 of one GPU
#       per GPU), results written to scripts/results/multigpu_<gpu>.json and .md
#   (e) never hang: kill -9 of rank 1 mid-run -> rank 0 exits 1 within --nccl-timeout naming rank 1;
#       rank 1 frozen (SIGSTOP) -> rank 0's watchdog fires after --nccl-timeout; SIGTERM to rank 1
#       only -> both ranks save the same step and exit 75, and the resumed run gives the losses of an
#       uninterrupted one; the file rendezvous (--rendezvous file:PATH) trains
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 in every process). Two-GPU runs use mpirun when it
# is installed (Open MPI; --allow-run-as-root), else two processes with RANK/WORLD_SIZE variables.
# Full logs in OUTDIR; the summary is printed last. Exits non-zero when a check failed.
set -uo pipefail
OUT=${1:-build/multigpu_run}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export NCCL_NVLS_ENABLE=0
PYTHON=${PYTHON:-python3}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$(date +%s)
note() { echo "$*" | tee -a "$SUMMARY"; }

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; nvidia-smi; nvidia-smi topo -m; command -v mpirun && mpirun --version; } \
    >"$OUT/environment.txt" 2>&1

# libnccl.so.2: the toolkit's, or the one in PyTorch's nvidia-nccl wheel.
if ldd ./train_gpt | grep -q "libnccl.so.2 => not found"; then
    NCCL_DIR=$($PYTHON -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
    export LD_LIBRARY_PATH="$NCCL_DIR:${LD_LIBRARY_PATH:-}"
    echo "libnccl from $NCCL_DIR" >>"$OUT/environment.txt"
fi
if ldd ./train_gpt | grep -q "not found"; then
    ldd ./train_gpt | grep "not found"
    echo "error: ./train_gpt misses libraries (above); set LD_LIBRARY_PATH" >&2
    exit 1
fi
DATA=data/tinyshakespeare
SHARED_DATA=${SHARED_DATA:-../shared/data}  # offline copies (the Makefile's SHARED_DATA)
if [ ! -f "$DATA/tinyshakespeare_val_000000.bin" ] && [ -f "$SHARED_DATA/tinyshakespeare.txt" ]; then
    TIKTOKEN_CACHE_DIR=$(cd "$SHARED_DATA/tiktoken_cache" 2>/dev/null && pwd) \
        $PYTHON scripts/prepare_data.py --input "$SHARED_DATA/tinyshakespeare.txt" --paragraph-docs \
        --name tinyshakespeare >"$OUT/prepare_data.txt" 2>&1
fi
if [ ! -f "$DATA/tinyshakespeare_val_000000.bin" ]; then
    echo "error: $DATA/ has no shards; run \`make train\` (or scripts/prepare_data.py) first" >&2
    exit 1
fi

export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
MPIRUN=$(command -v mpirun || true)
if [ -n "$MPIRUN" ] && ! "$MPIRUN" --version 2>&1 | grep -q "Open MPI"; then
    echo "mpirun is not Open MPI: two-GPU runs use torchrun-style variables" | tee -a "$OUT/environment.txt"
    MPIRUN=""
fi
note "two-GPU launcher: ${MPIRUN:-torchrun-style environment variables (no Open MPI mpirun here)}"
PORT=$((29500 + RANDOM % 2000))
# run2 TAG ARGS...: train_gpt on 2 GPUs (mpirun, else torchrun-style variables); output in OUT/TAG.out
run2() {
    local tag=$1
    shift
    PORT=$((PORT + 1))
    if [ -n "$MPIRUN" ]; then
        echo "\$ mpirun -np 2 ./train_gpt $*" >"$OUT/$tag.out"
        timeout 300 "$MPIRUN" --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            -x MASTER_PORT=$PORT ./train_gpt "$@" >>"$OUT/$tag.out" 2>&1
    else
        env_launch 2 "$tag" "$@"
    fi
}
# env_launch N TAG ARGS...: N background processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*
env_launch() {
    local n=$1 tag=$2 rc=0 pids=()
    shift 2
    PORT=$((PORT + 1))
    echo "\$ RANK=0..$((n - 1)) WORLD_SIZE=$n LOCAL_RANK=.. MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT ./train_gpt $*" \
        >"$OUT/$tag.out"
    for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout 300 ./train_gpt "$@" \
            >"$OUT/$tag.rank$r.out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    cat "$OUT/$tag".rank*.out >>"$OUT/$tag.out"
    return $rc
}
run1() {  # run1 TAG ARGS...: one GPU, no launcher
    local tag=$1
    shift
    echo "\$ ./train_gpt $*" >"$OUT/$tag.out"
    CUDA_VISIBLE_DEVICES=0 timeout 300 ./train_gpt "$@" >>"$OUT/$tag.out" 2>&1
}
status=0
check() {  # check NAME RC: record a run's exit status
    if [ "$2" -ne 0 ]; then
        note "FAIL $1: exit $2; last lines of $OUT/$1.out:"
        tail -n 8 "$OUT/$1.out" | sed 's/^/    /' | tee -a "$SUMMARY"
        status=1
    fi
}
compare() { $PYTHON scripts/bench_multigpu.py compare "$@" | tee -a "$SUMMARY"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1; }

# ---- (a) equivalence ------------------------------------------------------------------------------
note "== (a) 2 GPUs vs 1 GPU accumulating to the same global batch (gpt2-124m, 8192 tokens/step, 20 steps)"
SMALL=(--model gpt2-124m -b 4 -t 256 --total-batch-tokens 8192 --max-steps 20 --lr 6e-4 --warmup-steps 5
       --val-batches 20 --checkpoint-dir none --sample-tokens 0)
run1 eq_1gpu "${SMALL[@]}" --log-file "$OUT/eq_1gpu.jsonl"; check eq_1gpu $?
run2 eq_2gpu "${SMALL[@]}" --log-file "$OUT/eq_2gpu.jsonl"; check eq_2gpu $?
run2 eq_2gpu_zero1 "${SMALL[@]}" --zero 1 --log-file "$OUT/eq_2gpu_zero1.jsonl"; check eq_2gpu_zero1 $?
# bf16 gradients are summed in another order (4+4 micro steps then a cross-GPU mean vs 8 in a row):
# step 1 (same weights) agrees to float rounding; later steps drift slightly through AdamW.
compare "$OUT/eq_1gpu.jsonl" "$OUT/eq_2gpu.jsonl" --tol 2e-2 --name equivalence_2gpu_vs_1gpu
compare "$OUT/eq_1gpu.jsonl" "$OUT/eq_2gpu_zero1.jsonl" --tol 2e-2 --name equivalence_2gpu_zero1_vs_1gpu
compare "$OUT/eq_2gpu.jsonl" "$OUT/eq_2gpu_zero1.jsonl" --tol 2e-2 --name equivalence_zero1_vs_zero0
compare "$OUT/eq_1gpu.jsonl" "$OUT/eq_2gpu.jsonl" --steps 1-1 --tol 1e-3 --name equivalence_step1_2gpu_vs_1gpu
grep -h "val loss" "$OUT/eq_1gpu.out" "$OUT/eq_2gpu.out" "$OUT/eq_2gpu_zero1.out" | sed 's/^/    /' | tee -a "$SUMMARY"
grep -h "^gpus\|model state" "$OUT/eq_2gpu_zero1.out" | head -2 | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- (b) resume with --zero 1 -----------------------------------------------------------------------
note "== (b) resume with --zero 1 (naive attention: deterministic)"
CK="$OUT/ck_zero1"
CK2="$OUT/ck_zero1_resumed"
rm -rf "$CK" "$CK2"
RES=(--model gpt2-124m -b 4 -t 256 --total-batch-tokens 8192 --max-steps 20 --lr 6e-4 --attn naive --val-data ""
     --zero 1 --sample-tokens 0)
run2 resume_full "${RES[@]}" --checkpoint-dir "$CK" --checkpoint-every 10 --keep-checkpoints 0 \
    --log-file "$OUT/resume_full.jsonl"; check resume_full $?
ls "$CK" | sed 's/^/    /' | tee -a "$SUMMARY"
run2 resume_from10 "${RES[@]}" --resume "$CK/step_00000010.rank00of02.ckpt" --checkpoint-dir "$CK2" \
    --log-file "$OUT/resume_from10.jsonl"; check resume_from10 $?
compare "$OUT/resume_full.jsonl" "$OUT/resume_from10.jsonl" --steps 11-20 --tol 2e-3 --name resume_zero1_steps_11_20
CUDA_VISIBLE_DEVICES=0 timeout 60 ./train_gpt "${RES[@]}" --resume "$CK" >"$OUT/resume_refused.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "saved by 2 GPU(s) with --zero 1" "$OUT/resume_refused.out"; then
    note "PASS resume_on_1_gpu_is_refused: $(grep -m1 error "$OUT/resume_refused.out" | cut -c1-160)"
else
    note "FAIL resume_on_1_gpu_is_refused: exit $rc, see $OUT/resume_refused.out"; status=1
fi

# ---- (c) launchers ----------------------------------------------------------------------------------
note "== (c) torchrun-style launch and wrong launches"
QUICK=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 5 --val-data "" --checkpoint-dir none --sample-tokens 0)
env_launch 2 torchrun_env "${QUICK[@]}" --log-file "$OUT/torchrun_env.jsonl"
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$OUT/torchrun_env.jsonl" 2>/dev/null)" = 5 ] &&
   grep -q "launcher: torchrun env" "$OUT/torchrun_env.rank0.out"; then
    note "PASS torchrun_env_launch: 5 steps, $(grep -m1 '^gpus' "$OUT/torchrun_env.rank0.out")"
else
    note "FAIL torchrun_env_launch: exit $rc, see $OUT/torchrun_env.out"; status=1
fi
PORT=$((PORT + 1))
t0=$(date +%s)
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" --rendezvous-timeout 20 \
    >"$OUT/wrong_world.rank0.out" 2>&1 &
p0=$!
RANK=1 WORLD_SIZE=3 LOCAL_RANK=1 MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" --rendezvous-timeout 20 \
    >"$OUT/wrong_world.rank1.out" 2>&1
rc1=$?
wait $p0
rc0=$?
secs=$(($(date +%s) - t0))
if [ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && [ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] &&
   grep -q "says world size 3, rank 0 says 2" "$OUT/wrong_world.rank0.out" &&
   grep -q "says world size 3, rank 0 says 2" "$OUT/wrong_world.rank1.out"; then
    note "PASS wrong_world_size_fails_clearly in ${secs} s: $(grep -m1 error "$OUT/wrong_world.rank1.out" | cut -c1-170)"
else
    note "FAIL wrong_world_size_fails_clearly: exits $rc0/$rc1 after ${secs} s, see $OUT/wrong_world.rank*.out"; status=1
fi
PORT=$((PORT + 1))
t0=$(date +%s)
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" --rendezvous-timeout 5 \
    >"$OUT/missing_rank.out" 2>&1
rc=$?
secs=$(($(date +%s) - t0))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "only 1 of 2 ranks" "$OUT/missing_rank.out"; then
    note "PASS missing_rank_times_out_clearly in ${secs} s: $(grep -m1 error "$OUT/missing_rank.out" | cut -c1-170)"
else
    note "FAIL missing_rank_times_out_clearly: exit $rc after ${secs} s, see $OUT/missing_rank.out"; status=1
fi

# ---- (e) never hang -------------------------------------------------------------------------------
note "== (e) watchdog, coordinated SIGTERM, file rendezvous"
LONG=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 100000 --val-data "" --nccl-timeout 20 --checkpoint-dir none
      --sample-tokens 0)
# start2 TAG ARGS...: two ranks in the background (no timeout wrapper: $P0/$P1 are train_gpt itself)
start2() {
    local tag=$1
    shift
    PORT=$((PORT + 1))
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$PORT ./train_gpt "$@" >"$OUT/$tag.rank0.out" 2>&1 &
    P0=$!
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=$PORT ./train_gpt "$@" >"$OUT/$tag.rank1.out" 2>&1 &
    P1=$!
}
wait_steps() {  # wait_steps FILE N: until rank 0 printed step N (at most 120 s)
    for _ in $(seq 240); do grep -q "^step *$2/" "$1" 2>/dev/null && return 0; sleep 0.5; done
    return 1
}
wait_exit() {  # wait_exit PID SECONDS: its exit status, or 124 (then killed) when it is still running
    for _ in $(seq $((2 * $2))); do kill -0 "$1" 2>/dev/null || { wait "$1"; return $?; }; sleep 0.5; done
    kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 124
}
start2 kill9 "${LONG[@]}"
wait_steps "$OUT/kill9.rank0.out" 5
kill -9 $P1
t0=$(date +%s)
wait_exit $P0 60
rc=$?
secs=$(($(date +%s) - t0))
wait $P1 2>/dev/null
if [ $rc -eq 1 ] && grep -q "NCCL watchdog: rank 0 of 2, step .*suspected rank: 1 (its process ended" "$OUT/kill9.rank0.out"; then
    note "PASS kill9_rank1_rank0_exits_naming_it in ${secs} s: $(grep -m1 'NCCL watchdog' "$OUT/kill9.rank0.out" | cut -c1-200)"
else
    note "FAIL kill9_rank1_rank0_exits_naming_it: exit $rc after ${secs} s, see $OUT/kill9.rank0.out"; status=1
fi
start2 frozen "${LONG[@]}"
wait_steps "$OUT/frozen.rank0.out" 5
kill -STOP $P1
t0=$(date +%s)
wait_exit $P0 60
rc=$?
secs=$(($(date +%s) - t0))
kill -9 $P1; wait $P1 2>/dev/null
if [ $rc -eq 1 ] && [ $secs -ge 15 ] && grep -q "NCCL watchdog: rank 0 of 2, step .*did not complete within 20 s" "$OUT/frozen.rank0.out"; then
    note "PASS frozen_rank1_watchdog_fires_after_the_timeout in ${secs} s: $(grep -m1 'NCCL watchdog' "$OUT/frozen.rank0.out" | cut -c1-220)"
else
    note "FAIL frozen_rank1_watchdog_fires_after_the_timeout: exit $rc after ${secs} s, see $OUT/frozen.rank0.out"; status=1
fi
CKT="$OUT/ck_sigterm"
rm -rf "$CKT"
TERM_RUN=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 1000 --val-data "" --attn naive --zero 1 --lr 6e-4
          --sample-tokens 0)
run2 sigterm_ref "${TERM_RUN[@]}" --checkpoint-dir none --log-file "$OUT/sigterm_ref.jsonl"; check sigterm_ref $?
start2 sigterm "${TERM_RUN[@]}" --checkpoint-dir "$CKT" --log-file "$OUT/sigterm.jsonl"
wait_steps "$OUT/sigterm.rank0.out" 20  # then SIGTERM well before step 1000
kill -TERM $P1
wait_exit $P0 120; rc0=$?
wait_exit $P1 120; rc1=$?
s0=$(grep -o "after step [0-9]*" "$OUT/sigterm.rank0.out" | head -1)
s1=$(ls "$CKT" 2>/dev/null | grep -c "rank01of02")
if [ $rc0 -eq 75 ] && [ $rc1 -eq 75 ] && [ -n "$s0" ] && grep -q "a stop signal on another rank" "$OUT/sigterm.rank0.out" &&
   [ "$(ls "$CKT" | grep -c rank00of02)" = 1 ] && [ "$s1" = 1 ]; then
    note "PASS sigterm_to_rank1_only_both_save_the_same_step: both exit 75 $s0; $(ls "$CKT" | tr '\n' ' ')"
else
    note "FAIL sigterm_to_rank1_only_both_save_the_same_step: exits $rc0/$rc1 ($s0), files: $(ls "$CKT" | tr '\n' ' ')"; status=1
fi
run2 sigterm_resumed "${TERM_RUN[@]}" --checkpoint-dir "$CKT" --resume auto --log-file "$OUT/sigterm.jsonl"
check sigterm_resumed $?
compare "$OUT/sigterm_ref.jsonl" "$OUT/sigterm.jsonl" --tol 2e-3 --name sigterm_resume_matches_uninterrupted
rm -f "$OUT/rdzv_file"*
PORT=$((PORT + 1))
env_launch 2 file_rendezvous "${QUICK[@]}" --rendezvous "file:$OUT/rdzv_file" --log-file "$OUT/file_rendezvous.jsonl"
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$OUT/file_rendezvous.jsonl" 2>/dev/null)" = 5 ] &&
   grep -q "rendezvous file" "$OUT/file_rendezvous.rank0.out"; then
    note "PASS file_rendezvous_trains: 5 steps"
else
    note "FAIL file_rendezvous_trains: exit $rc, see $OUT/file_rendezvous.out"; status=1
fi

# ---- (d) benchmark ----------------------------------------------------------------------------------
note "== (d) GPT3-1.3B seq 2048, micro batch 8, 131072 tokens/step: per-GPU throughput and memory"
$PYTHON scripts/bench_multigpu.py bench --out-dir "$OUT" --gpus 2 --steps 6 --skip 2 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
grep -E "^\| |^PASS|^FAIL" "$OUT/bench.txt" >>"$SUMMARY"

echo
echo "================ summary ($(($(date +%s) - START)) s; logs in $OUT) ================"
cat "$SUMMARY"
exit $status
