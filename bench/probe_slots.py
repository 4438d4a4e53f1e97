"""Probe: how the copy engine's slot size (S), slot count (K) and threads (T) change
the uploads that are neither tiny nor huge: a batched clone of 4096 tensors of 16 KiB
(64 MiB), of all-MiniLM-L6-v2's 104 fp32 tensors (91 MB), and load_safetensors of
both layouts' files (pread into the slots) and of Qwen2.5-0.5B's (0.99 GB).
GB/s, median of 9 after 2 warm-up passes; files in /dev/shm. (4-byte copies into
existing tensors are timed by ``etptr-bench --many``.)

    python bench/probe_slots.py
"""
import tempfile

import numpy as np

import etptr
from etptr.bench._layouts import LAYOUTS, write_layout
from etptr.cuda import copy_config

from _timing import gbps as rate, pinned_line_gbps

MiB = 1 << 20


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
    print(f"line (pinned 256 MiB): {pinned_line_gbps():.1f} GB/s")


if __name__ == "__main__":
    main()
