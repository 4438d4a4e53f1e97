#!/usr/bin/env bash
# The GPU checks behind bench/results/: build, run tests/cuda (with a 10 s load
# test), then the benchmarks and tools named. Each step's output goes to
# OUTDIR/<step>.txt and its last lines to OUTDIR/summary.txt. The steps run in the
# repository root (found from this script's place), whatever the current directory.
#
#     bash bench/tools/gpu_checks.sh OUTDIR [STEP ...]
#
# STEP (default: build tests sweep many layouts bench_many):
#   build       pip install --no-build-isolation --no-deps -e .
#   inplace     setup.py build_ext --inplace (faster; etptr is then imported from the checkout)
#   tests       pytest tests/cuda
#   sweep       etptr-bench --sweep (no torch), with a plot
#   torch_sweep etptr-bench --sweep with torch's series
#   many        etptr-bench --many (4096 small tensors, Qwen2.5-0.5B's tensors)
#   layouts     etptr-bench --layout for all-minilm-l6-v2, qwen2.5-0.5b and qwen2.5-1.5b (the
#               main job on files of those shapes: load_safetensors, save_safetensors, safetensors)
#   minilm      the same for all-minilm-l6-v2 alone
#   main        the main job on Qwen2.5-1.5B's shapes written to the disk's file system: loads,
#               saves there and on /dev/shm (--tmpfs), then the fresh-process table
#   llama       the 16 GB layout (bench/tools/llama_layout.py, 4 shards) in /dev/shm: the main
#               job on its index (saves on /dev/shm only, fresh processes warm)
#   checkpoint  etptr-bench on the installed all-MiniLM-L6-v2 checkpoint
#   bench_many  the pytest-benchmark suite bench/suites/bench_many.py
#   suites      every pytest-benchmark suite (bench/suites), its JSON summarised by
#               bench/tools/summarize.py into suites_summary.txt
#   sweep_copy  bench/tools/sweep_copy.py: the sweep that chose the copy configuration's defaults
#   two_gpu     bench/tools/two_gpu_upload.py: uploads to two GPUs at once against one alone
#   costs       bench/tools/probe_call_costs.py: a 4-byte copy's cost at each layer, beside CuPy's
#   probe_load  bench/tools/probe_load.py: load_safetensors of Qwen2.5-0.5B's shapes step by step
#   probe_load_minilm  bench/tools/probe_load.py all-minilm-l6-v2: the small checkpoint's load
#   timeline    bench/tools/probe_timeline.py: pipelined copies chunk by chunk (the engine's trace)
#   tuning      bench/tools/try_tuning.py $TUNING (default: ramp_first=0,8MiB, the upload ramp
#               off and on): standard copies under other values of the engine's settings, in turns
#   probe_io    bench/tools/probe_file_io.c: file -> pinned slots -> GPU, device -> new file,
#               and 4-byte copies at the driver level
#   tiny        bench/tools/probe_tiny.c: the ways a 4-byte copy can be made (DMA, stream write,
#               kernel; stream sync or a flag the host spins on)
#   fresh       etptr-bench --fresh on Qwen2.5-1.5B's shapes written to the disk's file system
#               (the system's temporary directory): each loader's first load in a fresh
#               process, page cache warm, cold and half full, beside the disk's cold read rate
#   fresh_shm   the same on /dev/shm (warm only: tmpfs cannot be made cold)
#   tp          etptr-bench --tp on Qwen2.5-1.5B's shapes: every rank's share for 2, 4, 8 ranks
#   gather      bench/tools/probe_slice_gather.py --device cuda: a slice's runs read one by one
#               or as their span, /dev/shm warm and the disk cold
#   topo        the machine's CPUs, NUMA nodes and the GPU's place among them
set -u
out=${1:?usage: bash bench/tools/gpu_checks.sh OUTDIR [STEP ...]}
shift
steps=${*:-build tests sweep many layouts bench_many}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.." || exit 1
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
        sweep_copy) run sweep_copy 300 $py bench/tools/sweep_copy.py ;;
        two_gpu) run two_gpu 200 $py bench/tools/two_gpu_upload.py ;;
        many) run many 300 $py -m etptr.bench --many --no-progress --json "$out/many.json" ;;
        layouts)
            for name in all-minilm-l6-v2 qwen2.5-0.5b qwen2.5-1.5b; do
                run "layout_$name" 300 $py -m etptr.bench --layout "$name" --no-progress \
                    --json "$out/layout_$name.json"
            done ;;
        minilm) run layout_all-minilm-l6-v2 300 $py -m etptr.bench --layout all-minilm-l6-v2 \
                    --no-progress --json "$out/layout_all-minilm-l6-v2.json" ;;
        main) run main 600 $py -m etptr.bench --layout qwen2.5-1.5b --tmpfs --no-progress \
                  --json "$out/main.json" ;;
        llama) run llama_write 300 $py bench/tools/llama_layout.py /dev/shm/llama
               run llama 600 $py -m etptr.bench /dev/shm/llama/model.safetensors.index.json \
                   --dir /dev/shm --repeats 2 --warmup 1 --save-repeats 1 --no-progress --json "$out/llama.json"
               rm -rf /dev/shm/llama ;;
        bench_many) run bench_many 300 $py -m pytest -q -p no:cacheprovider bench/suites/bench_many.py \
                        --benchmark-only --benchmark-columns=median,ops ;;
        suites) run suites 600 $py -m pytest -q -p no:cacheprovider bench/suites --benchmark-only \
                    --benchmark-columns=median,ops --benchmark-json="$out/suites.json" &&
                $py bench/tools/summarize.py "$out/suites.json" "$out/suites_summary.txt" > /dev/null ;;
        probe_io) cc -O2 -pthread bench/tools/probe_file_io.c -ldl -o "$out/probe_file_io" &&
                  run probe_io 200 "$out/probe_file_io" /dev/shm 1024 15 ;;
        tiny) cc -O2 bench/tools/probe_tiny.c -ldl -o "$out/probe_tiny" &&
              run tiny 120 "$out/probe_tiny" ;;
        costs) run costs 120 $py bench/tools/probe_call_costs.py ;;
        probe_load) run probe_load 200 $py bench/tools/probe_load.py ;;
        probe_load_minilm) run probe_load_minilm 200 $py bench/tools/probe_load.py all-minilm-l6-v2 ;;
        timeline) run timeline 200 $py bench/tools/probe_timeline.py /dev/shm ;;
        tuning) run tuning 600 $py bench/tools/try_tuning.py --dir /dev/shm \
                    ${TUNING:-ramp_first=0,8MiB} ;;
        topo) run topo 60 bash -c 'lscpu; numactl -H; nvidia-smi topo -m;
                  cat /sys/bus/pci/devices/*/numa_node | sort | uniq -c;
                  nvidia-smi -q | grep -i -A3 "bus id\|numa"; cat /proc/meminfo | head -5' ;;
        checkpoint) run checkpoint 200 $py -m etptr.bench --no-progress ;;
        fresh) run fresh 600 $py -m etptr.bench --fresh --layout qwen2.5-1.5b --no-progress \
                   --json "$out/fresh.json" ;;
        fresh_shm) run fresh_shm 300 $py -m etptr.bench --fresh --layout qwen2.5-1.5b \
                       --dir /dev/shm --cache warm --no-progress --json "$out/fresh_shm.json" ;;
        tp) run tp 300 $py -m etptr.bench --tp --layout qwen2.5-1.5b --no-progress \
                --json "$out/tp.json" ;;
        gather) run gather 300 $py bench/tools/probe_slice_gather.py --dir /dev/shm --device cuda
                run gather_cold 300 $py bench/tools/probe_slice_gather.py --cold --device cuda ;;
        *) echo "unknown step $step" | tee -a "$out/summary.txt" ;;
    esac
done
