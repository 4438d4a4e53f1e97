"""Probe: the copy threads' fills of pinned slots, as an upload makes them and alone.

Inside an upload of MiniLM's 91 MB, a 4 MiB slot's fill takes about 190 us, against
55-65 us when the same 4 MiB are read again and again alone (bench/results/
h200_probe_timeline.txt). This walks the file (or a host buffer) the way an upload
does, chunk after chunk into a ring of pinned slots, and times it three ways: the
same chunk again and again, the walk alone, and the walk while a DMA from other
page-locked memory runs on another stream (what an upload's DMA does beside its
fills). The DMA's own rate during the walk is printed beside it. File reads go
straight into the slot, or through each thread's bounce buffer copied out with
streaming stores (``parallel_read(stream=True)``, buffers of
``_host_copy._set_read_bounce`` bytes). Then uploads and loads of files from 91 MB
to 0.99 GB are timed both ways in turns (``_copy_engine._set_file_streaming_max``).

    python bench/probe_fill.py [DIR]      (default DIR: /dev/shm)
"""
import os
import shutil
import sys
import tempfile

import numpy as np
from _timing import file_uploader, in_turns, median_seconds, pinned_line_gbps, say, write_log

import etptr
from etptr._core import _host_copy
from etptr._core._host_copy import parallel_copy, parallel_read
from etptr.bench._layouts import write_layout
from etptr.checkpoint._host import open_checked
from etptr.checkpoint._plan import read_plan
from etptr.cuda import _copy_engine

RING = 96 << 20          # the engine's default slots: 6 x 16 MiB
THREADS = 16
PIECES = 8
BOUNCES = (128 << 10, 256 << 10, 512 << 10)
SIZES_MB = (128, 256, 512)     # synthetic files between MiniLM's and Qwen2.5-0.5B's


def walker(fill, n, chunk, ring_ptr):
    """A call that fills ``n`` bytes chunk by chunk into the ring's slots."""
    slots = max(1, RING // chunk)

    def walk():
        off, i = 0, 0
        while off < n:
            m = min(chunk, n - off)
            fill(ring_ptr + (i % slots) * chunk, off, m)
            off += m
            i += 1
    return walk


def under_dma(fn, cupy, dev, pinned, n_dma):
    """(seconds of ``fn``, GB/s of the DMA) while 256 MiB DMAs from ``pinned`` run."""
    import time
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(n_dma):
        cupy.cuda.runtime.memcpyAsync(dev.ptr, pinned.ptr, 256 << 20, 1, stream.ptr)
    end.record(stream)
    time.sleep(0.002)                       # the DMA is under way
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    busy = not end.done
    end.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, end)
    return t, n_dma * (256 << 20) / ms / 1e6, busy


def paired(path, f, line):
    """The file's upload alone and its load, with the slots filled by straight reads
    and through the bounce buffers, in turns (15 rounds): median us and x line."""
    from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
    lay = layout_file(f, DEVICE_ALIGNMENT)
    buf = etptr.DeviceMemoryBuffer.create(lay.nbytes, "cuda:0", alignment=DEVICE_ALIGNMENT)
    cases = {"upload": file_uploader(f, buf),
             "load_safetensors": lambda: etptr.load_safetensors(path, "cuda:0", progress=False)}
    modes = {"straight": 0, "bounce": 1 << 62}
    cells = []
    for fn in cases.values():
        for t in in_turns(fn, _copy_engine._set_file_streaming_max, modes,
                          _copy_engine._get_file_streaming_max()).values():
            cells.append(f"{t * 1e6:7.0f} ({f.data_size / t / 1e9 / line:.2f})")
    say(f"  {f.data_size / 1e6:7.1f} MB  " + "  ".join(cells))
    del buf


def memory_paired(where="/dev/shm"):
    """Uploads from host memory (h2d_copy of one range, and the batched clone of MiniLM's
    104 views of a mapped file) with slots filled by streaming stores or memcpy, in turns
    (15 rounds): median us and x line, by size."""
    line = pinned_line_gbps(reps=7, warmup=1)
    default = _copy_engine._get_streaming_max()
    say(f"\nuploads from memory, slots filled with streaming stores or memcpy, in turns; "
        f"median us of 15 rounds (x line {line:.1f} GB/s); the default streams up to "
        f"{default >> 20} MiB")
    say("                       streaming stores  memcpy")
    d = tempfile.mkdtemp(dir=where)
    try:
        path = write_layout("all-minilm-l6-v2", d)
        views = list(etptr.load_safetensors(path, "cpu").values())
        n_views = sum(v.nbytes for v in views)
        cases = [(f"{n_views / 1e6:.0f} MB, 104 views", n_views,
                  lambda: etptr.clone_tensor_ptrs_to(views, "cuda:0"))]
        for mb in (64, 91, 128, 256):
            n = mb * 1_000_000
            host = etptr.make_tensor_ptr(np.ones(n, np.uint8))
            out = etptr.empty([n], type=etptr.ScalarType.Byte, device="cuda:0")
            cases.append((f"{mb} MB, h2d_copy", n,
                          lambda host=host, out=out: etptr.h2d_copy(host, out)))
        modes = {"stream": 1 << 62, "memcpy": 0}
        for name, n, fn in cases:
            medians = in_turns(fn, _copy_engine._set_streaming_max, modes, default)
            say(f"  {name:20s} " + "   ".join(f"{t * 1e6:7.0f} ({n / t / 1e9 / line:.2f})"
                                             for t in medians.values()))
    finally:
        shutil.rmtree(d)


def synthetic(d, mb):
    """A safetensors file of ``mb`` MB in 16 MB float32 tensors."""
    from safetensors.numpy import save_file
    path = os.path.join(d, f"synthetic-{mb}.safetensors")
    n = 4_000_000
    save_file({f"t{i}": np.full(n, i, np.float32) for i in range(mb // 16)}, path)
    return path


def main(where):
    import cupy
    default_bounce = _host_copy._get_read_bounce()
    ring = cupy.cuda.alloc_pinned_memory(RING)
    other = cupy.cuda.alloc_pinned_memory(256 << 20)
    dev = cupy.cuda.alloc(256 << 20)
    d = tempfile.mkdtemp(dir=where)
    try:
        path = write_layout("all-minilm-l6-v2", d)
        f = read_plan(path).files[0]
        base = f.data_offset
        n = f.data_size
        src = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
        fd = open_checked(f)
        try:
            def bounced(nbytes):
                def fill(dst, off, m):
                    _host_copy._set_read_bounce(nbytes)
                    try:
                        parallel_read(fd, [(dst, base + off, m)], THREADS, PIECES, True)
                    finally:
                        _host_copy._set_read_bounce(default_bounce)
                return fill

            sources = {"file": lambda dst, off, m: parallel_read(fd, [(dst, base + off, m)],
                                                                 THREADS, PIECES)}
            sources.update({f"file, via {b >> 10} KiB": bounced(b) for b in BOUNCES})
            sources["memory"] = lambda dst, off, m: parallel_copy(dst, src.ctypes.data + off, m,
                                                                  THREADS, True, PIECES)
            say(f"fills of MiniLM's {n / 1e6:.1f} MB, {THREADS} threads, {PIECES} pieces per "
                f"thread, into a {RING >> 20} MiB ring: us per chunk (GB/s)")
            say("  source              chunk    same chunk     walk alone    walk beside a DMA  "
                "(DMA GB/s)")
            for name, fill in sources.items():
                for mib in (2, 4, 8, 16):
                    chunk = mib << 20
                    nchunks = -(-n // chunk)
                    same = median_seconds(lambda: fill(ring.ptr, 0, chunk), 51, 3)
                    walk = walker(fill, n, chunk, ring.ptr)
                    alone = median_seconds(walk, 9, 2) / nchunks
                    rows = [under_dma(walk, cupy, dev, other, 12) for _ in range(7)]
                    rows.sort()
                    t, dma, busy = rows[len(rows) // 2]
                    beside = t / nchunks
                    say(f"  {name:18s} {mib:3d} MiB  {same * 1e6:5.0f} ({chunk / same / 1e9:5.1f})"
                        f"  {alone * 1e6:5.0f} ({chunk / alone / 1e9:5.1f})"
                        f"  {beside * 1e6:5.0f} ({chunk / beside / 1e9:5.1f})   ({dma:.1f}"
                        f"{'' if busy else ', DMA ended first'})")
        finally:
            os.close(fd)
        t = median_seconds(lambda: (cupy.cuda.runtime.memcpyAsync(dev.ptr, other.ptr, 256 << 20,
                                                                  1, 0),
                                    cupy.cuda.runtime.deviceSynchronize()), 7, 2)
        say(f"the DMA alone, 256 MiB: {(256 << 20) / t / 1e9:.1f} GB/s")
        dev = other = ring = None     # give their memory back before the loads
        line = pinned_line_gbps(reps=7, warmup=1)
        say(f"\nuploads and loads by size, slots filled straight or through {default_bounce >> 10}"
            f" KiB bounce buffers, in turns; median us of 15 rounds (x line {line:.1f} GB/s); "
            f"the default bounces up to {_copy_engine._get_file_streaming_max() >> 20} MiB")
        say("               upload straight   upload bounce     load straight     load bounce")
        paired(path, f, line)
        for mb in SIZES_MB:
            p = synthetic(d, mb)
            paired(p, read_plan(p).files[0], line)
            os.unlink(p)
        path = write_layout("qwen2.5-0.5b", d)
        paired(path, read_plan(path).files[0], line)
    finally:
        shutil.rmtree(d)
    memory_paired(where)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/shm")
    if len(sys.argv) > 2:
        write_log(sys.argv[2])
