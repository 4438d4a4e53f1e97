"""Probe: how finely each slot's fill is cut among the copy threads. A fill is cut in
P pieces per thread: with P = 1 every thread takes one equal piece and the chunk
waits for the slowest; with more, threads that finish early take the rest (drains
into tensors stay at one piece per thread). Cases: the loader's reads alone (``pread`` of a file's data in
16 MiB jobs into one pinned buffer, no DMA), load_safetensors, batched clones and
single pageable copies. GB/s, median of 9 after 2 warm-up passes; files in /dev/shm;
default settings (S=16 MiB, K=3, T=16).

    python bench/probe_pieces.py
"""
import os
import tempfile

import cupy
import numpy as np

import etptr
from etptr._core import _host_copy
from etptr.bench._layouts import LAYOUTS, write_layout
from etptr.checkpoint import read_plan
from etptr.cuda import _copy_engine, get_copy_config

from _timing import gbps as rate, pinned_line_gbps

MiB = 1 << 20
PIECES = [1, 2, 4, 8]


def reads(path, limit):
    """The loader's reads alone: the file's data section (up to ``limit`` bytes) in
    16 MiB jobs into one pinned buffer; returns (call, bytes)."""
    f = read_plan(path).files[0]
    n = min(f.data_size, limit)
    buf = cupy.cuda.alloc_pinned_memory(16 * MiB)
    threads = get_copy_config()["threads"]

    def run():
        fd = os.open(path, os.O_RDONLY)
        try:
            for off in range(0, n, 16 * MiB):
                m = min(16 * MiB, n - off)
                _host_copy.parallel_read(fd, [(buf.ptr, f.data_offset + off, m)], threads,
                                         _copy_engine._get_fill_pieces())
        finally:
            os.close(fd)
    run.buf = buf
    return run, n


def main():
    d = tempfile.mkdtemp(dir="/dev/shm")
    rng = np.random.default_rng(0)
    small = [etptr.make_tensor_ptr(a) for a in rng.integers(0, 255, (4096, 16384), dtype=np.uint8)]
    mini_path = write_layout("all-minilm-l6-v2", d)
    qwen_path = write_layout("qwen2.5-0.5b", d)
    mini = list(etptr.load_safetensors(mini_path, "cpu").values())
    mini_dev = etptr.clone_tensor_ptrs_to(mini, "cuda:0")
    n_mini = LAYOUTS["all-minilm-l6-v2"].nbytes
    n_qwen = LAYOUTS["qwen2.5-0.5b"].nbytes
    big = etptr.make_tensor_ptr(rng.integers(0, 255, 256 * MiB, dtype=np.uint8))
    big_dev = etptr.clone_tensor_ptr_to(big, "cuda:0")
    mid = etptr.make_tensor_ptr(rng.integers(0, 255, 64 * MiB, dtype=np.uint8))
    read_mini, rn_mini = reads(mini_path, 1 << 40)
    read_qwen, rn_qwen = reads(qwen_path, 256 * MiB)
    cases = [
        ("reads only, MiniLM file", read_mini, rn_mini),
        ("reads only, Qwen0.5B 256 MiB", read_qwen, rn_qwen),
        ("load MiniLM file", lambda: etptr.load_safetensors(mini_path, "cuda:0", progress=False),
         n_mini),
        ("load Qwen0.5B file", lambda: etptr.load_safetensors(qwen_path, "cuda:0",
                                                              progress=False), n_qwen),
        ("clone MiniLM 104 up", lambda: etptr.clone_tensor_ptrs_to(mini, "cuda:0"), n_mini),
        ("clone MiniLM 104 down", lambda: etptr.clone_tensor_ptrs_to(mini_dev, "cpu"), n_mini),
        ("clone 4096 x 16 KiB up", lambda: etptr.clone_tensor_ptrs_to(small, "cuda:0"),
         64 * MiB),
        ("one 64 MiB up", lambda: etptr.clone_tensor_ptr_to(mid, "cuda:0"), 64 * MiB),
        ("one 256 MiB up", lambda: etptr.clone_tensor_ptr_to(big, "cuda:0"), 256 * MiB),
        ("one 256 MiB down, pageable", lambda: etptr.clone_tensor_ptr_to(
            big_dev, "cpu", pinned=False), 256 * MiB),
    ]
    saved = _copy_engine._get_fill_pieces()
    print("GB/s, median of 9; P = pieces per copy thread in each job")
    print(f"{'case':30s}" + "".join(f"     P={p}" for p in PIECES))
    try:
        for label, fn, n in cases:
            row = []
            for p in PIECES:
                _copy_engine._set_fill_pieces(p)
                row.append(rate(fn, n))
            print(f"{label:30s}" + "".join(f"  {x:7.1f}" for x in row))
    finally:
        _copy_engine._set_fill_pieces(saved)
    print(f"line (pinned 256 MiB): {pinned_line_gbps():.1f} GB/s")


if __name__ == "__main__":
    main()
