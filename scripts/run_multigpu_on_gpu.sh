#!/usr/bin/env bash
# run_multigpu_on_gpu.sh: the multi-GPU checks and benchmark on a machine with 2 or more GPUs, from
# the repository root, with ./train_gpt built elsewhere (`make train_gpt`) and the Tiny Shakespeare
# shards in data/tinyshakespeare/ (`make train` makes them).
#
#   bash scripts/run_multigpu_on_gpu.sh [OUTDIR]        (default build/multigpu_run)
#   NGPU=4 bash scripts/run_multigpu_on_gpu.sh ...      (the world size; default: nvidia-smi -L's GPUs)
#
# Every multi-GPU run uses all NGPU GPUs (W = NGPU ranks); each fault is done to the LAST rank.
#   (a) equivalence: GPT-2 124M, -t 256, TOK tokens per step (8192 where W divides 8), 20 steps.
#       1 GPU -b 4 accumulating TOK/1024 micro steps vs W GPUs -b 4 (TOK/1024/W each), with and
#       without --zero 1, first with --deterministic --attn naive (the forward is bit-identical per
#       micro batch and the GEMMs take fixed algorithms, so only the order of sums differs), then with
#       the default flash2:
#       (i)   step 1's loss (computed before any update: it depends only on the fp32 order in which
#             the micro batches' mean losses are combined) within a bound derived from that order:
#             one rounding per product and per sum of either path, each at most half an fp32 ulp of
#             the loss, plus 1e-6 for the logs' 6 decimals;
#       (ii)  ZeRO-1 against ZeRO 0: bit-identical losses and gradient norms at every step (as logged:
#             6 decimals), at any W: with --deterministic, ZeRO 0 reduces each bucket to the shards'
#             owners as ZeRO-1 does and then broadcasts it, so both add every gradient element in
#             the same order (an all-reduce adds 3 or more ranks in another order than a reduce);
#       (iii) the deterministic runs: W GPUs vs 1 GPU, where only the order of the gradient sum (bf16
#             partial sums per rank, then the cross-rank mean) and of the loss mean differs, at the
#             bound of (iv) at every step;
#       (iv)  the bound of later steps is MEASURED here: 1-GPU runs that differ from the -b 4 run only
#             in how the same tokens' gradients are grouped (-b 8, -b 2 and -b 1, accumulating TOK/2048,
#             TOK/512 and TOK/256 micro steps); at step s the W-GPU run may differ from the 1-GPU -b 4
#             run by at most DRIFT_FACTOR (2) times the largest difference of any of them from it up
#             to step s, plus the fp32 bound of (i) at step s's loss (every logged loss combines the
#             micro batches' means in the two orders of (i)), plus (DRIFT_FACTOR + 1)·1e-6 for the
#             logs' 6 decimals (each logged value is off by up to 5e-7). Why 2: the W-GPU run and
#             the references all regroup the same sum of the -b 4 run's micro-batch gradients,
#             replacing its TOK/1024 - 1 sequential bf16 roundings by fewer or more (-b 8: TOK/2048 -
#             1; -b 1: TOK/256 - 1; W GPUs: TOK/1024/W - 1 per rank plus W - 1 across ranks), so
#             the differences are of one size; the factor 2 leaves room for the cross-rank roundings
#             and for one trajectory separating faster than another. Why three references: a
#             regrouping's difference is one draw of a chaotic quantity (at the loss spike near
#             step 8 it swings by 2x between regroupings); against one draw, a second draw of the
#             same size exceeds twice it 30% of the time (two half-normal draws), against the
#             largest of three 7%. The flash2 runs get their own flash2 references.
#   (b) resume with --zero 1: 20 steps saving at 10 and 20, then a run resumed from step 10's
#       per-rank files: steps 11-20 bit-identical (naive attention is deterministic); a 1-GPU resume
#       of those files must be refused
#   (c) torchrun-style environment launch; wrong launches (the last rank says another world size; the
#       last rank never starts) must fail with a clear message within the rendezvous timeout
#   (d) GPT3-1.3B seq 2048 micro batch 8, 131072 tokens per GPU per step (scripts/bench_multigpu.py
#       --gpus W): per-GPU TFLOP/s, exposed communication and peak memory, train_gpt alone on each GPU
#       (at once) vs W GPUs with and without --zero 1, PyTorch + torch.compile on 1 GPU and under
#       torchrun DDP on W; fails below 0.99 of one GPU per GPU; results written to
#       scripts/results/multigpu_<gpu>.json and .md. BENCH=0 skips it.
#   (e) never hang: kill -9 of the last rank mid-run -> every other rank exits 1 within
#       --nccl-timeout, rank 0 naming it; the last rank frozen (SIGSTOP) -> rank 0's watchdog fires
#       after --nccl-timeout, every other rank exits 1; SIGTERM to the last rank only -> every rank saves the same step and exits
#       75, and the resumed run gives bit for bit the losses of an uninterrupted one; the file
#       rendezvous (--rendezvous file:PATH) trains
# A self-check first feeds the comparisons planted logs (one ulp of ZeRO-1 difference, a drift 3x
# the reference, a step-1 loss off by 1e-4) that each must reject.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 in every process). Multi-GPU runs use mpirun when it
# is installed (Open MPI; --allow-run-as-root), else W processes with RANK/WORLD_SIZE variables.
# Full logs in OUTDIR; one line per check as it runs (PASS/FAIL name: what was measured, the bound),
# the summary and a table of every check last. Exits non-zero when a check failed.
set -uo pipefail
OUT=${1:-build/multigpu_run}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export NCCL_NVLS_ENABLE=0
PYTHON=${PYTHON:-python3}
SUMMARY="$OUT/summary.txt"
CHECKS="$OUT/checks.tsv"
: >"$SUMMARY"
: >"$CHECKS"
START=$(date +%s)
note() { echo "$*" | tee -a "$SUMMARY"; }
status=0
# result NAME OK DETAIL: one check's line (PASS/FAIL NAME: DETAIL) and its row of the final table
result() {
    local word=PASS
    [ "$2" -eq 1 ] || { word=FAIL; status=1; }
    note "$word $1: $3"
    printf '%s\t%s\t%s\n' "$1" "$word" "$3" >>"$CHECKS"
}

NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
if ! [[ "$NGPU" =~ ^[0-9]+$ ]] || [ "$NGPU" -lt 2 ]; then
    echo "error: these checks need 2 or more GPUs; nvidia-smi -L lists ${NGPU:-none} (set NGPU=N to override)" >&2
    exit 1
fi
W=$NGPU
LAST=$((W - 1))
WW=$(printf '%02d' "$W")

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; echo "NGPU=$NGPU"; nvidia-smi; nvidia-smi topo -m
  command -v mpirun && mpirun --version; } >"$OUT/environment.txt" 2>&1

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
    echo "mpirun is not Open MPI: multi-GPU runs use torchrun-style variables" | tee -a "$OUT/environment.txt"
    MPIRUN=""
fi
note "$W GPUs (NGPU=$NGPU), launcher: ${MPIRUN:-torchrun-style environment variables (no Open MPI mpirun here)}"
PORT=$((29500 + RANDOM % 2000))
# shellcheck source=scripts/train_gpt_launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_gpt_launch.sh"  # launch_one, launch_ranks
# runw TAG ARGS...: train_gpt on W GPUs (mpirun, else torchrun-style variables); output in OUT/TAG.out
runw() {
    local tag=$1
    shift
    PORT=$((PORT + 1))
    if [ -n "$MPIRUN" ]; then
        echo "\$ mpirun -np $W ./train_gpt $*" >"$OUT/$tag.out"
        timeout 300 "$MPIRUN" --allow-run-as-root -np "$W" --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            -x MASTER_PORT=$PORT ./train_gpt "$@" >>"$OUT/$tag.out" 2>&1
    else
        launch_ranks "$W" "$tag" "$@"
    fi
}
check() {  # check TAG RC: a run's exit status (a row only when it failed)
    if [ "$2" -ne 0 ]; then
        result "run_$1" 0 "exit $2; last lines of $OUT/$1.out: $(tail -n 3 "$OUT/$1.out" | tr '\n' ' ' | cut -c1-300)"
    fi
}

# losscheck MODE NAME ARGS...: compares train_gpt JSON-lines logs ({"step", "loss", "grad_norm"}), prints
# one line "PASS|FAIL NAME: ..." and exits 1 on FAIL. Modes:
#   exact A B [FIRST LAST]            every step's loss and grad_norm equal as logged
#   step1 A B TERMS                   |loss_1(A) - loss_1(B)| <= TERMS · half an fp32 ulp of the loss + 1e-6
#   drift A B FACTOR TERMS REF R1 [R2 ...]  |A - B|(s) <= FACTOR · max_j max_{s' <= s} |REF - Rj|(s')
#                                     + TERMS · half an fp32 ulp of step s's loss + (FACTOR + 1)·1e-6
losscheck_py() {
    $PYTHON - "$@" <<'PY'
import json, math, sys

mode, name, args = sys.argv[1], sys.argv[2], sys.argv[3:]

def load(path):
    recs = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:  # blank, or the torn last line of a killed run
                    continue
                if "loss" in r:
                    recs[r["step"]] = r
    except OSError:
        pass
    return recs

def steps_of(logs, first=1, last=None):
    last = last if last is not None else max(max(l) if l else 0 for l in logs)
    steps = list(range(first, last + 1))
    missing = [s for s in steps if any(s not in l for l in logs)]
    if missing or not steps:
        sizes = ", ".join(f"{len(l)} steps" for l in logs)
        print(f"FAIL {name}: steps missing from the logs: {missing[:10]} ({sizes})")
        sys.exit(1)
    return steps

def half_ulp_of(*x):  # half an fp32 ulp at the largest |x| (a bound on each rounding of a sum up to it)
    _, e = math.frexp(max(abs(v) for v in x) * (1 + 1e-6))
    return 2.0 ** (e - 25)  # |x| in [2^(e-1), 2^e): fp32 ulp 2^(e-24)

def finish(ok, text):
    print(f"{'PASS' if ok else 'FAIL'} {name}: {text}")
    sys.exit(0 if ok else 1)

if mode == "exact":
    a, b = load(args[0]), load(args[1])
    first, last = (int(args[2]), int(args[3])) if len(args) > 3 else (1, None)
    steps = steps_of([a, b], first, last)
    differ = [s for s in steps if a[s]["loss"] != b[s]["loss"] or a[s].get("grad_norm") != b[s].get("grad_norm")]
    worst = max(steps, key=lambda s: abs(a[s]["loss"] - b[s]["loss"]))
    text = (f"steps {steps[0]}-{steps[-1]}: " + ("bit-identical losses and grad norms" if not differ else
            f"{len(differ)} steps differ, the first {differ[0]} (loss {a[differ[0]]['loss']:.6f} vs "
            f"{b[differ[0]]['loss']:.6f}, grad norm {a[differ[0]].get('grad_norm')} vs {b[differ[0]].get('grad_norm')}), "
            f"max |dloss| {abs(a[worst]['loss'] - b[worst]['loss']):.2e} at step {worst}"))
    finish(not differ, text)
elif mode == "step1":
    a, b = load(args[0]), load(args[1])
    steps_of([a, b], 1, 1)
    la, lb, terms = a[1]["loss"], b[1]["loss"], int(args[2])
    half_ulp = half_ulp_of(la, lb)
    bound = terms * half_ulp + 1e-6
    finish(abs(la - lb) <= bound, f"step 1 loss {la:.6f} vs {lb:.6f}, |d| {abs(la - lb):.2e}, bound {bound:.2e} "
           f"({terms} fp32 roundings x {half_ulp:.2e} + 1e-6 for the logs' 6 decimals)")
elif mode == "drift":
    a, b = load(args[0]), load(args[1])
    factor, terms = float(args[2]), int(args[3])
    ref, others = load(args[4]), [load(p) for p in args[5:]]
    steps = steps_of([a, b, ref] + others)
    slack = (factor + 1) * 1e-6
    env, worst, rows, bad = 0.0, None, [], []
    for s in steps:
        env = max([env] + [abs(ref[s]["loss"] - r[s]["loss"]) for r in others])
        fp32 = terms * half_ulp_of(a[s]["loss"], b[s]["loss"])
        d, bound = abs(a[s]["loss"] - b[s]["loss"]), factor * env + fp32 + slack
        rows.append((s, d, bound, env, fp32))
        if d > bound:
            bad.append(s)
        if worst is None or d / bound > worst[1] / worst[2]:
            worst = rows[-1]
    s, d, bound, env_s, fp32 = worst
    text = (f"steps 1-{steps[-1]}, {len(bad)} over the bound; tightest at step {s}: |dloss| {d:.2e} vs bound "
            f"{bound:.2e} = {factor:g} x measured reorder drift {env_s:.2e} + fp32 {fp32:.1e} + {slack:.0e}; max "
            f"|dloss| {max(r[1] for r in rows):.2e}, reference drift at the end {env:.2e}")
    if bad:
        text += "; over at steps " + ", ".join(str(x) for x in bad[:10])
    finish(not bad, text)
else:
    print(f"FAIL {name}: unknown mode {mode}")
    sys.exit(1)
PY
}
losscheck() {  # losscheck MODE NAME ARGS...: losscheck_py's line becomes a check's line and row
    local line
    line=$(losscheck_py "$@" 2>&1 | tail -n 1)
    result "$2" "$([[ "$line" == PASS* ]] && echo 1 || echo 0)" "${line#* "$2": }"
}

# ---- self-check: the comparisons reject planted differences ------------------------------------------
note "== self-check of the comparisons on planted logs"
mkdir -p "$OUT/selfcheck"
$PYTHON - "$OUT/selfcheck" <<'PY'
import json, os, sys
d = sys.argv[1]
def write(name, losses, norms=None):
    with open(os.path.join(d, name), "w") as f:
        for i, l in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": round(l, 6), "grad_norm": (norms or [1.0] * len(losses))[i]}) + "\n")
base = [10.960760 - 0.2 * i for i in range(10)]
write("a.jsonl", base)
write("ulp.jsonl", base[:5] + [base[5] + 1e-6] + base[6:])           # one step off by one logged ulp
write("ref.jsonl", [l + 1e-3 * i for i, l in enumerate(base)])       # reference drift 1e-3 per step
write("drift3x.jsonl", [l + 3e-3 * i for i, l in enumerate(base)])   # 3x the reference drift
write("drift1x.jsonl", [l - 1e-3 * i for i, l in enumerate(base)])   # 1x: within 2x
write("step1.jsonl", [base[0] + 1e-4] + base[1:])                     # step 1 off by 1e-4
PY
SC="$OUT/selfcheck"
planted() {  # planted NAME WANT(PASS|FAIL) ARGS...: the comparison must give WANT
    local name=$1 want=$2 line
    shift 2
    line=$(losscheck_py "$@" 2>&1 | tail -n 1)
    result "selfcheck_$name" "$([[ "$line" == "$want"* ]] && echo 1 || echo 0)" "want $want, got: $line"
}
planted exact_rejects_one_logged_ulp FAIL exact planted "$SC/a.jsonl" "$SC/ulp.jsonl"
planted exact_accepts_a_copy PASS exact planted "$SC/a.jsonl" "$SC/a.jsonl"
planted drift_rejects_3x_the_reference FAIL drift planted "$SC/a.jsonl" "$SC/drift3x.jsonl" 2 20 "$SC/a.jsonl" \
    "$SC/ref.jsonl" "$SC/a.jsonl"
planted drift_accepts_1x_the_reference PASS drift planted "$SC/a.jsonl" "$SC/drift1x.jsonl" 2 20 "$SC/a.jsonl" \
    "$SC/ref.jsonl" "$SC/a.jsonl"
planted drift_takes_the_largest_reference PASS drift planted "$SC/a.jsonl" "$SC/drift3x.jsonl" 2 20 "$SC/a.jsonl" \
    "$SC/a.jsonl" "$SC/drift3x.jsonl"
planted step1_rejects_1e-4 FAIL step1 planted "$SC/a.jsonl" "$SC/step1.jsonl" 20

# ---- (a) equivalence ------------------------------------------------------------------------------
TOK=8192  # tokens per step: a multiple of -b 4 x 256 x W (the W-GPU runs) and of -b 8 x 256 (a reference)
while [ $((TOK % (1024 * W))) -ne 0 ] || [ $((TOK % 2048)) -ne 0 ]; do TOK=$((TOK + 2048)); done
ACC1=$((TOK / 1024)) ACCW=$((TOK / 1024 / W))
DRIFT_FACTOR=2
# fp32 roundings between step 1's losses: either path multiplies each micro batch's mean by its weight
# and adds it (1-GPU: 2 x ACC1), W GPUs also add the ranks' means and scale (2 x ACCW + W)
STEP1_TERMS=$((2 * ACC1 + 2 * ACCW + W))
note "== (a) $W GPUs vs 1 GPU accumulating to the same global batch (gpt2-124m, $TOK tokens/step, 20 steps;" \
     "1 GPU: $ACC1 micro steps of -b 4, or $((TOK / 2048)) of -b 8, $((TOK / 512)) of -b 2, $((TOK / 256)) of -b 1;" \
     "$W GPUs: $ACCW of -b 4 each)"
SMALL=(--model gpt2-124m -t 256 --total-batch-tokens "$TOK" --max-steps 20 --lr 6e-4 --warmup-steps 5
       --val-data "" --checkpoint-dir none --sample-tokens 0)
for kind in det flash2; do
    EXTRA=(--attn flash2)
    [ "$kind" = det ] && EXTRA=(--deterministic --attn naive)
    launch_one "${kind}_1gpu_b4" "${SMALL[@]}" "${EXTRA[@]}" -b 4 --log-file "$OUT/${kind}_1gpu_b4.jsonl"
    check "${kind}_1gpu_b4" $?
    for b in 8 2 1; do
        launch_one "${kind}_1gpu_b$b" "${SMALL[@]}" "${EXTRA[@]}" -b $b --log-file "$OUT/${kind}_1gpu_b$b.jsonl"
        check "${kind}_1gpu_b$b" $?
    done
    runw "${kind}_${W}gpu" "${SMALL[@]}" "${EXTRA[@]}" -b 4 --log-file "$OUT/${kind}_${W}gpu.jsonl"; check "${kind}_${W}gpu" $?
    runw "${kind}_${W}gpu_zero1" "${SMALL[@]}" "${EXTRA[@]}" -b 4 --zero 1 --log-file "$OUT/${kind}_${W}gpu_zero1.jsonl"
    check "${kind}_${W}gpu_zero1" $?
done
D="$OUT/det"
F="$OUT/flash2"
# (i)
losscheck step1 "det_step1_loss_${W}gpu_vs_1gpu" "${D}_1gpu_b4.jsonl" "${D}_${W}gpu.jsonl" "$STEP1_TERMS"
losscheck step1 "det_step1_loss_${W}gpu_zero1_vs_1gpu" "${D}_1gpu_b4.jsonl" "${D}_${W}gpu_zero1.jsonl" "$STEP1_TERMS"
# (ii)
losscheck exact "det_zero1_vs_zero0_bit_identical_${W}gpu" "${D}_${W}gpu.jsonl" "${D}_${W}gpu_zero1.jsonl"
# (iii) with the bound of (iv)
# the references of (iv): the -b 4 run, then its three regroupings
DREFS=("${D}_1gpu_b"{4,8,2,1}.jsonl)
FREFS=("${F}_1gpu_b"{4,8,2,1}.jsonl)
losscheck drift "det_drift_${W}gpu_vs_1gpu" "${D}_1gpu_b4.jsonl" "${D}_${W}gpu.jsonl" "$DRIFT_FACTOR" "$STEP1_TERMS" \
    "${DREFS[@]}"
losscheck drift "det_drift_${W}gpu_zero1_vs_1gpu" "${D}_1gpu_b4.jsonl" "${D}_${W}gpu_zero1.jsonl" "$DRIFT_FACTOR" \
    "$STEP1_TERMS" "${DREFS[@]}"
# the default attention (flash2), against its own measured references
losscheck drift "flash2_drift_${W}gpu_vs_1gpu" "${F}_1gpu_b4.jsonl" "${F}_${W}gpu.jsonl" "$DRIFT_FACTOR" \
    "$STEP1_TERMS" "${FREFS[@]}"
losscheck drift "flash2_drift_${W}gpu_zero1_vs_1gpu" "${F}_1gpu_b4.jsonl" "${F}_${W}gpu_zero1.jsonl" "$DRIFT_FACTOR" \
    "$STEP1_TERMS" "${FREFS[@]}"
line=$(losscheck_py exact flash2_zero1_vs_zero0 "${F}_${W}gpu.jsonl" "${F}_${W}gpu_zero1.jsonl" 2>&1 | tail -n 1)
note "    (info, not a check: flash2's backward is not deterministic) flash2 ZeRO-1 vs ZeRO 0: ${line#* flash2_zero1_vs_zero0: }"
grep -h "^gpus\|model state" "${D}_${W}gpu_zero1.out" | head -2 | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- (b) resume with --zero 1 -----------------------------------------------------------------------
note "== (b) resume with --zero 1 on $W GPUs (naive attention: deterministic)"
CK="$OUT/ck_zero1"
CK2="$OUT/ck_zero1_resumed"
rm -rf "$CK" "$CK2"
RES=(--model gpt2-124m -b 4 -t 256 --total-batch-tokens "$TOK" --max-steps 20 --lr 6e-4 --attn naive --val-data ""
     --zero 1 --sample-tokens 0)
runw resume_full "${RES[@]}" --checkpoint-dir "$CK" --checkpoint-every 10 --keep-checkpoints 0 \
    --log-file "$OUT/resume_full.jsonl"; check resume_full $?
ls "$CK" | sed 's/^/    /' | tee -a "$SUMMARY"
runw resume_from10 "${RES[@]}" --resume "$CK/step_00000010.rank00of$WW.ckpt" --checkpoint-dir "$CK2" \
    --log-file "$OUT/resume_from10.jsonl"; check resume_from10 $?
losscheck exact resume_zero1_steps_11_20_bit_identical "$OUT/resume_full.jsonl" "$OUT/resume_from10.jsonl" 11 20
CUDA_VISIBLE_DEVICES=0 timeout 60 ./train_gpt "${RES[@]}" --resume "$CK" >"$OUT/resume_refused.out" 2>&1
rc=$?
result resume_on_1_gpu_is_refused "$([ $rc -eq 2 ] && grep -q "saved by $W GPU(s) with --zero 1" "$OUT/resume_refused.out" \
    && echo 1 || echo 0)" "exit $rc: $(grep -m1 error "$OUT/resume_refused.out" | cut -c1-160)"

# ---- (c) launchers ----------------------------------------------------------------------------------
note "== (c) torchrun-style launch and wrong launches"
QUICK=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 5 --val-data "" --checkpoint-dir none --sample-tokens 0)
launch_ranks "$W" torchrun_env "${QUICK[@]}" --log-file "$OUT/torchrun_env.jsonl"
rc=$?
result torchrun_env_launch "$([ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$OUT/torchrun_env.jsonl" 2>/dev/null)" = 5 ] &&
    grep -q "launcher: torchrun env" "$OUT/torchrun_env.rank0.out" && echo 1 || echo 0)" \
    "exit $rc, 5 steps wanted; $(grep -m1 '^gpus' "$OUT/torchrun_env.rank0.out" | cut -c1-120)"
PORT=$((PORT + 1))
t0=$(date +%s)
RANK=0 WORLD_SIZE=$W LOCAL_RANK=0 MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" --rendezvous-timeout 20 \
    >"$OUT/wrong_world.rank0.out" 2>&1 &
p0=$!
RANK=$LAST WORLD_SIZE=$((W + 1)) LOCAL_RANK=$LAST MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" \
    --rendezvous-timeout 20 >"$OUT/wrong_world.rank$LAST.out" 2>&1
rc1=$?
wait $p0
rc0=$?
secs=$(($(date +%s) - t0))
want="rank $LAST says world size $((W + 1)), rank 0 says $W"
result wrong_world_size_fails_clearly "$([ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && [ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] &&
    grep -q "$want" "$OUT/wrong_world.rank0.out" && grep -q "$want" "$OUT/wrong_world.rank$LAST.out" && echo 1 || echo 0)" \
    "exits $rc0/$rc1 in ${secs} s: $(grep -m1 error "$OUT/wrong_world.rank$LAST.out" | cut -c1-170)"
PORT=$((PORT + 1))
t0=$(date +%s)
pids=()
for ((r = 0; r < LAST; r++)); do  # every rank but the last
    RANK=$r WORLD_SIZE=$W LOCAL_RANK=$r MASTER_PORT=$PORT timeout 120 ./train_gpt "${QUICK[@]}" --rendezvous-timeout 5 \
        >"$OUT/missing_rank.rank$r.out" 2>&1 &
    pids+=($!)
done
rcs=()
for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
secs=$(($(date +%s) - t0))
ok=1
for c in "${rcs[@]}"; do { [ "$c" -eq 0 ] || [ "$c" -eq 124 ]; } && ok=0; done
grep -q "only $LAST of $W ranks.*missing ranks: $LAST;" "$OUT/missing_rank.rank0.out" || ok=0
result missing_last_rank_times_out_clearly "$ok" \
    "exits ${rcs[*]} in ${secs} s: $(grep -m1 error "$OUT/missing_rank.rank0.out" | cut -c1-170)"

# ---- (e) never hang -------------------------------------------------------------------------------
note "== (e) watchdog, coordinated SIGTERM, file rendezvous (faults done to the last rank, $LAST)"
LONG=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 100000 --val-data "" --nccl-timeout 20 --checkpoint-dir none
      --sample-tokens 0)
# startw TAG ARGS...: W ranks in the background (no timeout wrapper: PIDS[r] is train_gpt itself)
startw() {
    local tag=$1 r
    shift
    PORT=$((PORT + 1))
    PIDS=()
    for ((r = 0; r < W; r++)); do
        RANK=$r WORLD_SIZE=$W LOCAL_RANK=$r MASTER_PORT=$PORT ./train_gpt "$@" >"$OUT/$tag.rank$r.out" 2>&1 &
        PIDS+=($!)
    done
}
wait_steps() {  # wait_steps FILE N: until rank 0 printed step N (at most 120 s)
    for _ in $(seq 240); do grep -q "^step *$2/" "$1" 2>/dev/null && return 0; sleep 0.5; done
    return 1
}
wait_exit() {  # wait_exit PID SECONDS: its exit status, or 124 (then killed) when it is still running
    for _ in $(seq $((2 * $2))); do kill -0 "$1" 2>/dev/null || { wait "$1"; return $?; }; sleep 0.5; done
    kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 124
}
# survivors SECONDS: waits for ranks 0 .. W-2; RCS their exit statuses, SECS the time taken
survivors() {
    local t0 r
    t0=$(date +%s)
    RCS=()
    for ((r = 0; r < LAST; r++)); do wait_exit "${PIDS[$r]}" "$1"; RCS+=($?); done
    SECS=$(($(date +%s) - t0))
}
all_exit_1() { local c; for c in "${RCS[@]}"; do [ "$c" -eq 1 ] || return 1; done; }
startw kill9 "${LONG[@]}"
wait_steps "$OUT/kill9.rank0.out" 5
kill -9 "${PIDS[$LAST]}"
survivors 60
wait "${PIDS[$LAST]}" 2>/dev/null
result "kill9_rank${LAST}_every_rank_exits_naming_it" "$(all_exit_1 &&
    grep -q "NCCL watchdog: rank 0 of $W, step .*suspected rank: $LAST (its process ended" "$OUT/kill9.rank0.out" &&
    echo 1 || echo 0)" "exits ${RCS[*]} in ${SECS} s: $(grep -m1 'NCCL watchdog' "$OUT/kill9.rank0.out" | cut -c1-200)"
startw frozen "${LONG[@]}"
wait_steps "$OUT/frozen.rank0.out" 5
kill -STOP "${PIDS[$LAST]}"
survivors 60
kill -9 "${PIDS[$LAST]}"
wait "${PIDS[$LAST]}" 2>/dev/null
result "frozen_rank${LAST}_watchdog_fires_after_the_timeout" "$(all_exit_1 && [ "$SECS" -ge 15 ] &&
    grep -q "NCCL watchdog: rank 0 of $W, step .*did not complete within 20 s" "$OUT/frozen.rank0.out" && echo 1 || echo 0)" \
    "exits ${RCS[*]} in ${SECS} s: $(grep -m1 'NCCL watchdog' "$OUT/frozen.rank0.out" | cut -c1-220)"
CKT="$OUT/ck_sigterm"
rm -rf "$CKT"
TERM_RUN=(--model gpt2-124m --layers 2 -b 4 -t 256 --max-steps 1000 --val-data "" --attn naive --zero 1 --lr 6e-4
          --sample-tokens 0)
runw sigterm_ref "${TERM_RUN[@]}" --checkpoint-dir none --log-file "$OUT/sigterm_ref.jsonl"; check sigterm_ref $?
startw sigterm "${TERM_RUN[@]}" --checkpoint-dir "$CKT" --log-file "$OUT/sigterm.jsonl"
wait_steps "$OUT/sigterm.rank0.out" 20  # then SIGTERM well before step 1000
kill -TERM "${PIDS[$LAST]}"
rcs=()
for ((r = 0; r < W; r++)); do wait_exit "${PIDS[$r]}" 120; rcs+=($?); done
s0=$(grep -o "after step [0-9]*" "$OUT/sigterm.rank0.out" | head -1)
ok=1
for ((r = 0; r < W; r++)); do
    [ "${rcs[$r]}" -eq 75 ] || ok=0
    files=("$CKT"/step_*.rank"$(printf '%02d' "$r")"of"$WW".ckpt)
    [ ${#files[@]} -eq 1 ] && [ -f "${files[0]}" ] || ok=0
done
if [ -z "$s0" ] || ! grep -q "a stop signal on another rank" "$OUT/sigterm.rank0.out"; then ok=0; fi
result "sigterm_to_rank${LAST}_only_every_rank_saves_the_same_step" "$ok" \
    "exits ${rcs[*]} ($s0); files: $(ls "$CKT" 2>/dev/null | tr '\n' ' ')"
runw sigterm_resumed "${TERM_RUN[@]}" --checkpoint-dir "$CKT" --resume auto --log-file "$OUT/sigterm.jsonl"
check sigterm_resumed $?
losscheck exact sigterm_resume_matches_uninterrupted_bit_for_bit "$OUT/sigterm_ref.jsonl" "$OUT/sigterm.jsonl"
rm -f "$OUT/rdzv_file"*
launch_ranks "$W" file_rendezvous "${QUICK[@]}" --rendezvous "file:$OUT/rdzv_file" \
    --log-file "$OUT/file_rendezvous.jsonl"
rc=$?
result file_rendezvous_trains "$([ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$OUT/file_rendezvous.jsonl" 2>/dev/null)" = 5 ] &&
    grep -q "rendezvous file" "$OUT/file_rendezvous.rank0.out" && echo 1 || echo 0)" "exit $rc, 5 steps wanted"

# ---- (d) benchmark ----------------------------------------------------------------------------------
if [ "${BENCH:-1}" = 0 ]; then
    note "== (d) the benchmark skipped (BENCH=0)"
else
    note "== (d) GPT3-1.3B seq 2048, micro batch 8, 131072 tokens per GPU per step: per-GPU throughput and memory"
    $PYTHON scripts/bench_multigpu.py bench --out-dir "$OUT" --gpus "$NGPU" --steps 6 --skip 2 2>&1 | tee "$OUT/bench.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || grep -qE "^FAIL " "$OUT/bench.txt" ||
        result bench_runs 0 "scripts/bench_multigpu.py exited $rc, see $OUT/bench.txt"
    [ "$rc" -eq 0 ] || status=1
    grep -E "^\| " "$OUT/bench.txt" >>"$SUMMARY"
    while read -r word name rest; do
        printf '%s\t%s\t%s\n' "$name" "$word" "$rest" >>"$CHECKS"
        echo "$word $name $rest" >>"$SUMMARY"
    done < <(grep -E "^(PASS|FAIL) " "$OUT/bench.txt")
fi

echo
echo "================ summary ($(($(date +%s) - START)) s; $W GPUs; logs in $OUT) ================"
cat "$SUMMARY"
echo
printf '%-60s %-4s %s\n' "check" "" "measured / bound"
while IFS=$'\t' read -r name word detail; do
    printf '%-60s %-4s %s\n' "$name" "$word" "$(echo "$detail" | cut -c1-150)"
done <"$CHECKS"
echo "$(grep -c $'\tPASS\t' "$CHECKS") passed, $(grep -c $'\tFAIL\t' "$CHECKS") failed"
exit $status
