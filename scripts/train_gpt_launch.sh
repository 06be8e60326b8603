# train_gpt_launch.sh: how the GPU check scripts start ./train_gpt (sourced by run_multigpu_on_gpu.sh and
# check_context_parallel_on_gpu.sh; not run on its own). Both write into $OUT and take a fresh port from
# $PORT for each multi-process launch; LAUNCH_TIMEOUT (seconds, default 300) bounds every process.
#
#   launch_one TAG ARGS...       ./train_gpt ARGS on GPU 0, no launcher; its output in $OUT/TAG.out
#   launch_ranks N TAG ARGS...   N processes with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
#                                MASTER_ADDR, MASTER_PORT), one per GPU; rank r's output in $OUT/TAG.rank<r>.out,
#                                all of them appended to $OUT/TAG.out; returns the last non-zero exit status

launch_one() {
    local tag=$1
    shift
    echo "\$ ./train_gpt $*" >"$OUT/$tag.out"
    CUDA_VISIBLE_DEVICES=0 timeout "${LAUNCH_TIMEOUT:-300}" ./train_gpt "$@" >>"$OUT/$tag.out" 2>&1
}

launch_ranks() {
    local n=$1 tag=$2 rc=0 pids=() r p
    shift 2
    PORT=$((PORT + 1))
    echo "\$ RANK=0..$((n - 1)) WORLD_SIZE=$n LOCAL_RANK=.. MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT ./train_gpt $*" \
        >"$OUT/$tag.out"
    for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
            timeout "${LAUNCH_TIMEOUT:-300}" ./train_gpt "$@" >"$OUT/$tag.rank$r.out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    cat "$OUT/$tag".rank*.out >>"$OUT/$tag.out"
    return $rc
}
