"""Probe: how the copy engine's slot size (S), slot count (K) and threads (T) change
the uploads that are neither tiny nor huge: a batched clone of 4096 tensors of 16 KiB
(64 MiB), of all-MiniLM-L6-v2's 104 fp32 tensors (91 MB), and load_safetensors of
both layouts' files (pread into the slots) and of Qwen2.5-0.5B's (0.99 GB).
GB/s, median of 9 after 2 warm-up passes; files in /dev/shm.

    python bench/probe_slots.py
"""
import statistics
import tempfile
import time

import cupy
import numpy as np

import etptr
from etptr.bench._layouts import LAYOUTS, write_layout
from etptr.cuda import copy_config

MiB = 1 << 20


def rate(fn, nbytes, reps=9, warmup=2):
    times = []
    for i in range(warmup + reps):
        cupy.cuda.Device(0).synchronize()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def main():
    d = tempfile.mkdtemp(dir="/dev/shm")
    small = [etptr.make_tensor_ptr(a) for a in
             np.random.default_rng(0).integers(0, 255, (4096, 16384), dtype=np.uint8)]
    mini_path = write_layout("all-minilm-l6-v2", d)
    qwen_path = write_layout("qwen2.5-0.5b", d)
    mini = list(etptr.load_safetensors(mini_path, "cpu").values())
    sizes = {"4096x16K": 64 * MiB, "minilm": LAYOUTS["all-minilm-l6-v2"].nbytes,
             "qwen0.5b": LAYOUTS["qwen2.5-0.5b"].nbytes}
    cases = [
        ("clone 4096 x 16 KiB", lambda: etptr.clone_tensor_ptrs_to(small, "cuda:0"),
         sizes["4096x16K"]),
        ("clone MiniLM 104", lambda: etptr.clone_tensor_ptrs_to(mini, "cuda:0"), sizes["minilm"]),
        ("load MiniLM file", lambda: etptr.load_safetensors(mini_path, "cuda:0", progress=False),
         sizes["minilm"]),
        ("load Qwen0.5B file", lambda: etptr.load_safetensors(qwen_path, "cuda:0",
                                                              progress=False), sizes["qwen0.5b"]),
    ]
    configs = [dict(slot_bytes=s * MiB, slots=k, threads=t)
               for s, k, t in [(16, 3, 16), (4, 3, 16), (8, 3, 16), (32, 3, 16), (4, 6, 16),
                               (8, 4, 16), (16, 4, 16), (16, 3, 12), (16, 3, 8)]]
    print("GB/s, median of 9; S = slot MiB, K = slots, T = threads")
    print(f"{'case':22s}" + "".join(f"  S{c['slot_bytes'] // MiB:>2d} K{c['slots']} T{c['threads']:<2d}"
                                   for c in configs))
    for label, fn, n in cases:
        row = []
        for c in configs:
            with copy_config(**c):
                row.append(rate(fn, n))
        print(f"{label:22s}" + "".join(f"  {r:11.1f}" for r in row))
    b = cupy.cuda.alloc_pinned_memory(256 * MiB)
    m = cupy.cuda.alloc(256 * MiB)
    line = rate(lambda: (m.copy_from_host_async(b.ptr, 256 * MiB),
                         cupy.cuda.Device(0).synchronize()), 256 * MiB)
    print(f"line (pinned 256 MiB): {line:.1f} GB/s")
    # 4 bytes into existing tensors: us per call, 5000 calls then one sync
    tiny = np.array([1.5], np.float32)
    src = etptr.make_tensor_ptr(tiny)
    dev = etptr.clone_tensor_ptr_to(src, "cuda:0")
    pin = etptr.empty([1], pinned=True)
    cdev = cupy.asarray(tiny)
    cpin = np.frombuffer(cupy.cuda.alloc_pinned_memory(4), np.float32, 1)
    cur = cupy.cuda.get_current_stream()
    own = cupy.cuda.Stream(non_blocking=True)
    for label, fn in [("h2d_copy", lambda: etptr.h2d_copy(src, dev)),
                      ("h2d_copy(stream=current)", lambda: etptr.h2d_copy(src, dev, stream=cur)),
                      ("h2d_copy(stream=own)", lambda: etptr.h2d_copy(src, dev, stream=own)),
                      ("ndarray.set()", lambda: cdev.set(tiny)),
                      ("d2h_copy", lambda: etptr.d2h_copy(dev, pin)),
                      ("ndarray.get(out=pinned)", lambda: cdev.get(out=cpin))]:
        best = []
        for _ in range(5):
            cupy.cuda.Device(0).synchronize()
            t0 = time.perf_counter()
            for _ in range(5000):
                fn()
            cupy.cuda.Device(0).synchronize()
            best.append((time.perf_counter() - t0) / 5000 * 1e6)
        print(f"4 bytes {label:26s} {statistics.median(best):6.2f} us")


if __name__ == "__main__":
    main()
