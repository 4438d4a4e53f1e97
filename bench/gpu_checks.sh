#!/usr/bin/env bash
# The GPU checks behind bench/results/: build in place, run tests/cuda (with a
# 10 s load test), then the sweep, the small-copy probe, the two-GPU upload and the
# checkpoint benchmark. Each step's output goes to OUTDIR/<step>.txt.
#
#     bash bench/gpu_checks.sh OUTDIR [STEP ...]
#
# STEP: build tests sweep probe chunking sweep_copy two_gpu checkpoint torch_sweep (default: all but
# chunking, sweep_copy and torch_sweep). The checkpoint step reads .ckpt/*.safetensors (bench/reshard.py makes
# one shard of the default checkpoint).
set -u
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR [STEP ...]}
shift
steps=${*:-build tests sweep probe two_gpu checkpoint}
mkdir -p "$out"
py=${PYTHON:-python3}

run() {   # run NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
    tail -n 3 "$out/$name.txt" | sed 's/^/    /' | tee -a "$out/summary.txt"
}

for step in $steps; do
    case $step in
        build) run build 300 $py -m pip install --no-build-isolation --no-deps -e . ;;
        tests) ETPTR_LOAD_SECONDS=10 run tests 300 $py -m pytest -q -s -p no:cacheprovider tests/cuda ;;
        sweep) run sweep 300 $py -m etptr.bench --sweep --no-torch --repeats 5 --plot "$out/sweep.png" ;;
        torch_sweep) run torch_sweep 300 $py -m etptr.bench --sweep --repeats 5 ;;
        probe) run probe 200 $py bench/probe_small.py ;;
        chunking) run chunking 300 $py bench/probe_chunking.py ;;
        sweep_copy) run sweep_copy 300 $py bench/sweep_copy.py ;;
        two_gpu) run two_gpu 200 $py bench/two_gpu_upload.py ;;
        checkpoint) run checkpoint 200 $py -m etptr.bench .ckpt/*.safetensors ;;
        *) echo "unknown step $step" | tee -a "$out/summary.txt" ;;
    esac
done
