#!/usr/bin/env bash
# check_context_parallel_on_gpu.sh: --context-parallel N against one GPU on the same batch, on a machine
# with N or more GPUs (never in CI), from the repository root with ./train_gpt built (`make train_gpt`)
# and the Tiny Shakespeare shards in data/tinyshakespeare/ (`make train` makes them).
#
#   [CP=N] bash scripts/check_context_parallel_on_gpu.sh [OUTDIR]   (N: 2 (default) or 4; default OUTDIR
#                                                                     build/context_parallel_run)
#
# Runs (gpt2-124m, -b 4 -t 1024, 4096 tokens per step, --deterministic, 20 steps, the same GPT-2
# initialization from --seed on every run, so the same weights and the same 4 sequences at every step):
#   one    1 GPU, flash2                                  the reference
#   naive  1 GPU, --attn naive                            other attention kernels on the same math: the
#   flash1 1 GPU, --attn flash1                            references of what a different rounding of
#   mma    1 GPU, flash2 with FLASH2_MMA_SYNC=1            attention alone does (see "att" below)
#   dp     N GPUs data parallel, -b 4/N each              the same 4 sequences (rank r reads rows of 4r/N..)
#   cp     N GPUs, --context-parallel N, -b 4             each GPU 1024/N tokens of every sequence
#   resume 1 GPU, no --context-parallel, from cp's checkpoint of step 10, steps 11-20
#   z1     as cp, with --zero 1 (the optimizer state sharded over the N GPUs)
#   z1res  as z1, resumed from z1's per-rank checkpoint of step 10, steps 11-20
# Checks (a line each, PASS/FAIL name: measured vs bound; exit 1 when one fails):
#   (1) step 1's gradients (--dump-grads: rank 0's, after the all-reduce), tensor by tensor, and loss:
#       |cp - one| <= 3 att + 2 |dp - one| + floor (L2 norms per tensor; |.| for the loss), where
#       att = max(|naive - one|, |flash1 - one|, |mma - one|).
#       Why: cp differs from one by (a) the ring attention, within 3x flash2's own error of one call
#       (test_gpu_context_parallel's bound, layers/context_parallel/README.md), of which att is this
#       run's measure: the largest of three draws, since one draw of a scalar like the loss can be near
#       zero by chance (with one draw, a second as large as the first over 3 happens ~20% of the time;
##       at step 1 the naive run's loss was 3.3e-5 off and the ring's 1.2e-4), and (b) the gradient
#       summed over N ranks in bf16, as dp's is (factor 2:
#       room for the partial sums differing by rank). Floor: 2e-6 for the loss (the log's 6 decimals),
#       1e-3 x |one| per tensor (about one bf16 rounding of a sum of two halves, 2^-9, with room).
#       Planted faults each must be rejected: the wpe gradient with its 2nd and 3rd chunks of rows
#       swapped (positions mixed up: the embedding read t instead of the global position), and the
#       whole gradient twice too large (the loss scaled by N instead of the mean).
#   (2) the 20 steps' losses: |cp - one|(s) <= 3 max_{s'<=s} att + 2 max_{s'<=s} |dp - one| + 2e-6.
#   (3) a checkpoint of cp resumes on one GPU without --context-parallel (exit 0) and its steps 11-20
#       are within the bound of (2) of cp's own steps 11-20.
#   (4) z1's 20 losses equal cp's bit for bit (as printed, 6 decimals): --deterministic ZeRO 0 sums the
#       gradients in ZeRO-1's order (layers/multi_gpu/multi_gpu.cuh), so sharding changes nothing.
#   (5) z1res's steps 11-20 equal z1's bit for bit (a sharded checkpoint resumes exactly).
set -uo pipefail
OUT=${1:-build/context_parallel_run}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export NCCL_NVLS_ENABLE=0
PYTHON=${PYTHON:-python3}
status=0
CP=${CP:-2}
if [ "$CP" != 2 ] && [ "$CP" != 4 ]; then
    echo "error: CP=$CP: this check runs --context-parallel 2 or 4 (4 sequences split over the data-parallel ranks)" >&2
    exit 2
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${NGPU:-0}" -lt "$CP" ]; then
    echo "error: CP=$CP needs $CP GPUs; nvidia-smi -L lists ${NGPU:-none}" >&2
    exit 1
fi
if [ ! -f data/tinyshakespeare/tinyshakespeare_train_000000.bin ]; then
    echo "error: data/tinyshakespeare/ has no shards; run \`make train\` (or scripts/prepare_data.py) first" >&2
    exit 1
fi
if ldd ./train_gpt | grep -q "libnccl.so.2 => not found"; then  # the one in PyTorch's nvidia-nccl wheel
    NCCL_DIR=$($PYTHON -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
    export LD_LIBRARY_PATH="$NCCL_DIR:${LD_LIBRARY_PATH:-}"
fi
{ date -u; git log -1 --format='commit %H %s'; nvidia-smi; } >"$OUT/environment.txt" 2>&1
PORT=$((29500 + RANDOM % 2000))

# shellcheck source=scripts/train_gpt_launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_gpt_launch.sh"  # launch_one, launch_ranks
LAUNCH_TIMEOUT=600
ran() {  # ran TAG RC: a failed run is a failed check
    if [ "$2" -ne 0 ]; then
        echo "FAIL run_$1: exit $2; see $OUT/$1.out: $(tail -n 3 "$OUT/$1.out" | tr '\n' ' ' | cut -c1-300)"
        status=1
    fi
}

COMMON=(--model gpt2-124m -t 1024 --total-batch-tokens 4096 --max-steps 20 --lr 6e-4 --warmup-steps 5
        --deterministic --val-data "" --sample-tokens 0)
launch_one one "${COMMON[@]}" -b 4 --checkpoint-dir none --dump-grads "$OUT/one.grads" --log-file "$OUT/one.jsonl"
ran one $?
launch_one naive "${COMMON[@]}" -b 4 --attn naive --checkpoint-dir none --dump-grads "$OUT/naive.grads" \
    --log-file "$OUT/naive.jsonl"
ran naive $?
launch_one flash1 "${COMMON[@]}" -b 4 --attn flash1 --checkpoint-dir none --dump-grads "$OUT/flash1.grads" \
    --log-file "$OUT/flash1.jsonl"
ran flash1 $?
FLASH2_MMA_SYNC=1 launch_one mma "${COMMON[@]}" -b 4 --checkpoint-dir none --dump-grads "$OUT/mma.grads" \
    --log-file "$OUT/mma.jsonl"
ran mma $?
launch_ranks "$CP" dp "${COMMON[@]}" -b $((4 / CP)) --checkpoint-dir none --dump-grads "$OUT/dp.grads" \
    --log-file "$OUT/dp.jsonl"
ran dp $?
rm -rf "$OUT/cp_ckpt"
launch_ranks "$CP" cp "${COMMON[@]}" -b 4 --context-parallel "$CP" --checkpoint-dir "$OUT/cp_ckpt" \
    --checkpoint-every 10 --keep-checkpoints 0 --dump-grads "$OUT/cp.grads" --log-file "$OUT/cp.jsonl"
ran cp $?
launch_one resume "${COMMON[@]}" -b 4 --resume "$OUT/cp_ckpt/step_00000010.ckpt" --checkpoint-dir none \
    --log-file "$OUT/resume.jsonl"
ran resume $?
rm -rf "$OUT/z1_ckpt"
launch_ranks "$CP" z1 "${COMMON[@]}" -b 4 --context-parallel "$CP" --zero 1 --checkpoint-dir "$OUT/z1_ckpt" \
    --checkpoint-every 10 --keep-checkpoints 0 --log-file "$OUT/z1.jsonl"
ran z1 $?
launch_ranks "$CP" z1res "${COMMON[@]}" -b 4 --context-parallel "$CP" --zero 1 --checkpoint-dir none \
    --resume "$OUT/z1_ckpt/$(printf 'step_00000010.rank00of%02d.ckpt' "$CP")" --log-file "$OUT/z1res.jsonl"
ran z1res $?

$PYTHON - "$OUT" <<'PY' || status=1
import json, os, sys
import numpy as np

out = sys.argv[1]
failed = False

def result(name, ok, text):
    global failed
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {text}", flush=True)

def losses(tag):
    recs = {}
    with open(os.path.join(out, tag + ".jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                recs[r["step"]] = r["loss"]
    return recs

def grads(tag):
    """The 16 gradient tensors of an llm.c bf16 model file (--dump-grads), as float64, by name."""
    path = os.path.join(out, tag + ".grads")
    h = np.fromfile(path, dtype="<i4", count=256)
    maxT, L, NH, C, Vp = int(h[2]), int(h[4]), int(h[5]), int(h[6]), int(h[7])
    NKV = int(h[8]) or NH
    QKV = (NH + 2 * NKV) * (C // NH)
    sizes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * QKV * C),
             ("qkvb", L * QKV), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
             ("fcw", L * 4 * C * C), ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C),
             ("lnfw", C), ("lnfb", C)]
    bits = np.fromfile(path, dtype="<u2", offset=1024)
    assert bits.size == sum(n for _, n in sizes), (path, bits.size)
    g = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    res, at = {}, 0
    for name, n in sizes:
        res[name] = g[at:at + n]
        at += n
    res["_maxT_C"] = (maxT, C)
    return res

ATT_REFS = ("naive", "flash1", "mma")


def grads_within(cp, one, refs, dp):
    """Per tensor: (name, |cp - one|, bound, ok); refs: the attention references' gradients."""
    rows = []
    for name in one:
        if name.startswith("_"):
            continue
        d = np.linalg.norm(cp[name] - one[name])
        att = max(np.linalg.norm(r[name] - one[name]) for r in refs)
        bound = 3 * att + 2 * np.linalg.norm(dp[name] - one[name]) + 1e-3 * np.linalg.norm(one[name])
        rows.append((name, d, bound, d <= bound))
    return rows

# (1) step 1
try:
    one, dp, cp = grads("one"), grads("dp"), grads("cp")
    refs = [grads(t) for t in ATT_REFS]
    rows = grads_within(cp, one, refs, dp)
    worst = max(rows, key=lambda r: r[1] / r[2] if r[2] > 0 else float("inf"))
    bad = [r[0] for r in rows if not r[3]]
    result("cp_step1_gradients", not bad,
           f"16 tensors, {len(bad)} over the bound {bad}; tightest {worst[0]}: |cp-one| {worst[1]:.3e} vs bound "
           f"{worst[2]:.3e} (3 att + 2|dp-one| + 1e-3|one|)")
    maxT, C = cp["_maxT_C"]
    q = maxT // 4
    planted = dict(cp)
    wpe = cp["wpe"].reshape(maxT, C).copy()
    wpe[q:2 * q], wpe[2 * q:3 * q] = cp["wpe"].reshape(maxT, C)[2 * q:3 * q], cp["wpe"].reshape(maxT, C)[q:2 * q]
    planted["wpe"] = wpe.reshape(-1)
    caught = not all(r[3] for r in grads_within(planted, one, refs, dp))
    result("cp_planted_positions_swap_rejected", caught, "dwpe with rows of chunks 1 and 2 swapped")
    doubled = {k: (v * 2 if not k.startswith("_") else v) for k, v in cp.items()}
    caught = not all(r[3] for r in grads_within(doubled, one, refs, dp))
    result("cp_planted_double_gradient_rejected", caught, "every gradient x2 (the loss scaled by N)")
except (OSError, AssertionError, ValueError) as e:
    result("cp_step1_gradients", False, f"cannot read the gradient files: {e}")

def drift(a, b, refs_l, ref_dp, first, last):
    """Steps first..last where |a - b| exceeds 3 (running max of att) + 2 (running max of |dp - one|)."""
    env_a = env_d = 0.0
    worst, bad = None, []
    for s in range(first, last + 1):
        env_a = max([env_a] + [abs(r[s] - one_l[s]) for r in refs_l])
        env_d = max(env_d, abs(ref_dp[s] - one_l[s]))
        d, bound = abs(a[s] - b[s]), 3 * env_a + 2 * env_d + 2e-6
        if d > bound:
            bad.append(s)
        if worst is None or d - bound > worst[1] - worst[2]:
            worst = (s, d, bound)
    return bad, worst

try:
    one_l, dp_l, cp_l = losses("one"), losses("dp"), losses("cp")
    refs_l = [losses(t) for t in ATT_REFS]
    att1 = {t: abs(r[1] - one_l[1]) for t, r in zip(ATT_REFS, refs_l)}
    print("step 1 loss, |reference - one|: " + ", ".join(f"{t} {v:.2e}" for t, v in att1.items()) +
          f", dp {abs(dp_l[1] - one_l[1]):.2e}", flush=True)
    d1 = abs(cp_l[1] - one_l[1])
    b1 = 3 * max(att1.values()) + 2 * abs(dp_l[1] - one_l[1]) + 2e-6
    result("cp_step1_loss", d1 <= b1, f"{cp_l[1]:.6f} vs {one_l[1]:.6f}: |d| {d1:.2e}, bound {b1:.2e}")
    # (2)
    bad, (s, d, bound) = drift(cp_l, one_l, refs_l, dp_l, 1, 20)
    result("cp_20_steps_drift", not bad, f"{len(bad)} steps over; tightest step {s}: |d| {d:.2e} vs bound {bound:.2e}")
    # (3)
    res_l = losses("resume")
    bad, (s, d, bound) = drift(res_l, cp_l, refs_l, dp_l, 11, 20)
    result("cp_checkpoint_resumes_on_one_gpu", not bad,
           f"steps 11-20 of the 1-GPU resume vs cp's: {len(bad)} over; tightest step {s}: |d| {d:.2e} vs {bound:.2e}")
    # (4), (5)
    z1_l, z1res_l = losses("z1"), losses("z1res")
    diff = [s for s in range(1, 21) if z1_l[s] != cp_l[s]]
    result("cp_zero1_equals_zero0_bit_for_bit", not diff, f"20 steps, {len(diff)} differ {diff[:5]}")
    diff = [s for s in range(11, 21) if z1res_l[s] != z1_l[s]]
    result("cp_zero1_resume_bit_identical", not diff, f"steps 11-20, {len(diff)} differ {diff[:5]}")
except (OSError, KeyError, ValueError) as e:
    result("cp_losses", False, f"a log is missing or short: {e!r}")
sys.exit(1 if failed else 0)
PY
echo "logs in $OUT; $([ $status -eq 0 ] && echo 'all checks passed' || echo 'some checks FAILED')"
exit $status
