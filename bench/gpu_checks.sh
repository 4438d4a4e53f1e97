#!/usr/bin/env bash
# The GPU checks behind bench/results/: build in place, run tests/cuda (with a
# 10 s load test), then the benchmarks. Each step's output goes to OUTDIR/<step>.txt
# and a one-paragraph summary of each to OUTDIR/summary.txt.
#
#     bash bench/gpu_checks.sh OUTDIR [STEP ...]
#
# STEP (default: build tests sweep many layouts bench_many):
#   build       pip install --no-build-isolation --no-deps -e .
#   inplace     setup.py build_ext --inplace (faster; etptr is then imported from the checkout)
#   tests       pytest tests/cuda
#   sweep       etptr-bench --sweep (no torch), with a plot
#   torch_sweep etptr-bench --sweep with torch's series
#   many        etptr-bench --many (4096 small tensors, Qwen2.5-0.5B's tensors)
#   layouts     etptr-bench --layout for all-minilm-l6-v2, qwen2.5-0.5b and qwen2.5-1.5b (the main job on
#               files of those shapes: load_safetensors, save_safetensors, safetensors)
#   minilm      the same for all-minilm-l6-v2 alone
#   bench_many  pytest-benchmark suite bench/bench_many.py
#   checkpoint  etptr-bench on the installed all-MiniLM-L6-v2 checkpoint
#   probe chunking sweep_copy two_gpu   the probes behind the engine's defaults
#   probe_io    bench/probe_file_io.c: file -> pinned slots -> GPU, device -> new file,
#               and 4-byte copies at the driver level
#   tiny        bench/probe_tiny.c: the ways a 4-byte copy can be made (DMA, stream write,
#               kernel; stream sync or a flag the host spins on)
#   small       bench/probe_small_copies.py: 4- and 8-byte copies by each small-copy path
#   ramp_down   bench/probe_ramp_down.py: uploads ending with halving chunks, paired
#   costs       bench/probe_call_costs.py: a 4-byte copy's cost at each layer, beside CuPy's
#   ring        bench/probe_ring.py: uploads through rings of fewer, smaller slots (cache-resident?)
#   scattered   bench/probe_scattered.py: batched h2d_copy into separate tensors, one pipeline or not
#   probe_load  bench/probe_load.py: load_safetensors step by step
#   pool_cap    bench/probe_pool_cap.py: batched downloads larger than the pool's cache
#   slots       bench/probe_slots.py: slot size, slot count and threads on mid-size
#               batches and file loads; 4-byte copies into existing tensors
#   pieces      bench/probe_pieces.py: how finely each slot's fill is cut among the threads
#   probe_load_minilm  bench/probe_load.py all-minilm-l6-v2: the small checkpoint's load
#   timeline    bench/probe_timeline.py: pipelined copies chunk by chunk (the engine's trace)
#   fill        bench/probe_fill.py: slot fills as an upload walks the file, alone and beside a DMA
#   topo        the machine's CPUs, NUMA nodes and the GPU's place among them
set -u
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR [STEP ...]}
shift
steps=${*:-build tests sweep many layouts bench_many}
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
        inplace) run inplace 300 $py setup.py -q build_ext --inplace --parallel 16
                 export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ;;
        tests) ETPTR_LOAD_SECONDS=10 run tests 300 $py -m pytest -q -s -p no:cacheprovider tests/cuda ;;
        sweep) run sweep 300 $py -m etptr.bench --sweep --no-torch --repeats 5 --plot "$out/sweep.png" ;;
        torch_sweep) run torch_sweep 300 $py -m etptr.bench --sweep --repeats 5 ;;
        probe) run probe 200 $py bench/probe_small.py ;;
        chunking) run chunking 300 $py bench/probe_chunking.py ;;
        sweep_copy) run sweep_copy 300 $py bench/sweep_copy.py ;;
        two_gpu) run two_gpu 200 $py bench/two_gpu_upload.py ;;
        many) run many 300 $py -m etptr.bench --many --no-progress --json "$out/many.json" ;;
        layouts)
            for name in all-minilm-l6-v2 qwen2.5-0.5b qwen2.5-1.5b; do
                run "layout_$name" 300 $py -m etptr.bench --layout "$name" --no-progress \
                    --json "$out/layout_$name.json"
            done ;;
        minilm) run layout_all-minilm-l6-v2 300 $py -m etptr.bench --layout all-minilm-l6-v2 \
                    --no-progress --json "$out/layout_all-minilm-l6-v2.json" ;;
        bench_many) run bench_many 300 $py -m pytest -q -p no:cacheprovider bench/bench_many.py \
                        --benchmark-only --benchmark-columns=median,ops ;;
        probe_io) cc -O2 -pthread bench/probe_file_io.c -ldl -o "$out/probe_file_io" &&
                  run probe_io 200 "$out/probe_file_io" /dev/shm 1024 15 ;;
        tiny) cc -O2 bench/probe_tiny.c -ldl -o "$out/probe_tiny" &&
              run tiny 120 "$out/probe_tiny" ;;
        small) run small 200 $py bench/probe_small_copies.py ;;
        ramp_down) run ramp_down 300 $py bench/probe_ramp_down.py /dev/shm ;;
        costs) run costs 120 $py bench/probe_call_costs.py ;;
        ring) run ring 300 $py bench/probe_ring.py /dev/shm ;;
        scattered) run scattered 300 $py bench/probe_scattered.py /dev/shm ;;
        probe_load) run probe_load 200 $py bench/probe_load.py ;;
        pool_cap) run pool_cap 200 $py bench/probe_pool_cap.py ;;
        slots) run slots 300 $py bench/probe_slots.py ;;
        pieces) run pieces 300 $py bench/probe_pieces.py ;;
        probe_load_minilm) run probe_load_minilm 200 $py bench/probe_load.py all-minilm-l6-v2 ;;
        timeline) run timeline 200 $py bench/probe_timeline.py /dev/shm ;;
        fill) run fill 200 $py bench/probe_fill.py /dev/shm ;;
        topo) run topo 60 bash -c 'lscpu; numactl -H; nvidia-smi topo -m;
                  cat /sys/bus/pci/devices/*/numa_node | sort | uniq -c;
                  nvidia-smi -q | grep -i -A3 "bus id\|numa"; cat /proc/meminfo | head -5' ;;
        checkpoint) run checkpoint 200 $py -m etptr.bench --no-progress ;;
        *) echo "unknown step $step" | tee -a "$out/summary.txt" ;;
    esac
done
