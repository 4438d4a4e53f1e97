"""Probe: the timeline of pipelined copies, chunk by chunk, from the copy engine's
trace (``_tuning.tune(trace=True)``, ``_tuning.take_trace()``): when each chunk's slot
was free ("waited"),
when the copy threads had filled (or drained) it ("copied"), when its DMA was
queued, and when the copy was complete. A slot's wait ends when the DMA of the
chunk K before it has completed, so the waits show the DMA's progress.

    python bench/tools/probe_timeline.py [DIR]      (default DIR: /dev/shm)

For each case the sample with the median total of 9 is printed whole, then the
sums: the start-up (begin -> first DMA queued), the fills' rate, and the DMA's
rate over the span from the first DMA queued to the end (what the link did while
the fills ran beside it). The MiniLM-shaped file's upload also runs under other copy
configurations and fill pieces (summaries), beside its file read and its DMA alone and
the copy threads' fills alone by size; each case then runs under six ramps of the first
chunks (``ramp_first`` / ``ramp_growth``, at every size). A second argument names an
output file for the report.
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import etptr
from etptr.bench._model_shapes import write_layout
from etptr.checkpoint import _load as ckpt_load
from etptr.checkpoint._file import open_checked
from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
from etptr.checkpoint._plan import read_plan
from etptr.cuda import _tuning, copy_config

from _probes import conditions, file_uploader, median_seconds, pinned_line_gbps, say, write_log


def traced(fn, reps=9):
    """(median total in s, that sample's trace) of ``fn`` after 2 warm-up calls."""
    fn()
    fn()
    runs = []
    for _ in range(reps):
        with _tuning.tuned(trace=True):
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
        runs.append((t, _tuning.take_trace()))
    runs.sort(key=lambda r: r[0])
    return runs[len(runs) // 2]


def report(name, nbytes, fn, line, verbose=True):
    total, trace = traced(fn)
    if not trace:
        say(f"{name}: no pipelined copy ran")
        return
    t0 = trace[0][2]
    steps = {}
    for what, i, ns in trace:
        steps.setdefault(what, {})[i] = (ns - t0) / 1e3      # us since begin
    chunk = next(iter(steps["slots"]))                         # the slots' mark holds the chunk size
    q = steps["queued"]
    first_q = min(q.values())
    end = (trace[-1][2] - t0) / 1e3
    say(f"\n{name}: {nbytes / 1e6:.1f} MB in {len(q)} chunks of {chunk / 2**20:g} MiB, "
        f"call {total * 1e6:.0f} us ({nbytes / total / 1e9:.1f} GB/s, {nbytes / total / 1e9 / line:.2f}"
        f" x line)")
    say(f"  begin -> slots {steps['slots'][chunk]:.0f} us; -> first DMA queued {first_q:.0f} us; "
        f"last queued -> last step {end - max(q.values()):.0f} us; traced span {end:.0f} us")
    copies = [steps["copied"][i] - steps["waited"][i] for i in sorted(steps["copied"])]
    say(f"  host copies: {statistics.median(copies):.0f} us median per chunk "
        f"({chunk / statistics.median(copies) / 1e3:.1f} GB/s), min {min(copies):.0f}, "
        f"max {max(copies):.0f}")
    if "synced" in steps:
        say(f"  DMA over first-queued -> complete: {nbytes / (end - first_q) / 1e3:.1f} GB/s "
            f"(line {line:.1f}); ideal call at line: {nbytes / line / 1e3:.0f} us")
    if verbose:
        say("  chunk  waited  copied  queued  (us since begin)")
        for i in sorted(q):
            w = steps["waited"].get(i)
            c = steps["copied"].get(i)
            say(f"  {i:5d} {w if w is not None else float('nan'):7.0f} "
                f"{c if c is not None else float('nan'):7.0f} {q[i]:7.0f}")


def variants(f, lay, buf, upload, line):
    """The same file upload with other engine settings (summaries only), and its two
    halves alone: the file read into pinned memory, and the DMA from pinned memory."""
    import cupy
    from etptr._core._host_copy import parallel_read
    for kw in (dict(threads=8), dict(threads=12), dict(threads=14),
               dict(slot_bytes=8 << 20, slots=6), dict(slot_bytes=4 << 20, slots=12),
               dict(slot_bytes=32 << 20, slots=3)):
        with copy_config(**kw):
            report(f"file upload (pread), {kw}", f.nbytes, upload, line, False)
    for pieces in (1, 2):
        with _tuning.tuned(fill_pieces=pieces):
            report(f"file upload (pread), {pieces} fill pieces per thread", f.nbytes, upload,
                   line, False)
    n = f.nbytes
    pinned = cupy.cuda.alloc_pinned_memory(lay.nbytes)
    with open_checked(f) as opened:
        fd = opened.fileno()
        segs = [(pinned.ptr + r.buffer_offset, r.file_offset, r.nbytes) for r in lay.runs]
        for threads in (8, 16):
            s = median_seconds(lambda: parallel_read(fd, segs, threads), 9)
            say(f"\nthe file read into pinned memory alone, {threads} threads: "
                f"{s * 1e6:.0f} us ({n / s / 1e9:.1f} GB/s)")
    dev = buf.data_ptr
    stream = cupy.cuda.Stream(non_blocking=False)

    def dma(chunk):
        for off in range(0, n, chunk):
            cupy.cuda.runtime.memcpyAsync(dev + off, pinned.ptr + off, min(chunk, n - off), 1,
                                          stream.ptr)
        stream.synchronize()

    for chunk in (n, 16 << 20, 4 << 20):
        s = median_seconds(lambda: dma(chunk), 9)
        say(f"DMA alone from pinned memory in {-(-n // chunk)} copies: {s * 1e6:.0f} us "
            f"({n / s / 1e9:.1f} GB/s)")


RAMPS = ((0, 150), (8 << 20, 150), (6 << 20, 140), (4 << 20, 150), (4 << 20, 200),
         (2 << 20, 200))


def ramps(cases, line):
    """Each case under each ramp of chunk sizes at the start of uploads: call time (the
    median of 9) and when the first DMA was queued."""
    say("\nramp (first chunk MiB, growth %): call us (GB/s, x line), first DMA queued us")
    for name, nbytes, fn in cases:
        cells = []
        for first, growth in RAMPS:
            with _tuning.tuned(ramp_first=first, ramp_growth=growth, ramp_max=1 << 40):
                total, trace = traced(fn)
            q = [ns for what, _, ns in trace if what == "queued"]
            first_q = (min(q) - trace[0][2]) / 1e3 if q else float("nan")
            cells.append(f"{first >> 20}/{growth}: {total * 1e6:.0f} ({nbytes / total / 1e9:.1f}, "
                         f"{nbytes / total / 1e9 / line:.2f}) {first_q:.0f}")
        say(f"  {name}: " + " | ".join(cells))


def fills(fd, lay, line):
    """The copy threads alone, back to back (awake): one job per call into pinned memory,
    from the file (pread) and from memory (non-temporal stores), by size."""
    import cupy
    from etptr._core._host_copy import parallel_copy, parallel_read
    pinned = cupy.cuda.alloc_pinned_memory(16 << 20)
    src = np.random.default_rng(1).integers(0, 255, 16 << 20, dtype=np.uint8)
    start = lay.runs[0].file_offset
    say("\nfills alone, 16 threads, 8 pieces per thread: us per call (GB/s)")
    for mib in (1, 2, 4, 8, 16):
        n = mib << 20
        r = median_seconds(lambda: parallel_read(fd, [(pinned.ptr, start, n)], 16), 51)
        c = median_seconds(lambda: parallel_copy(pinned.ptr, src.ctypes.data, n, 16,
                                                 nontemporal=True, pieces=8), 51)
        say(f"  {mib:2d} MiB: file {r * 1e6:6.0f} ({n / r / 1e9:5.1f})   memory {c * 1e6:6.0f} "
            f"({n / c / 1e9:5.1f})")


def one_layout(layout, d, line, verbose):
    """Every case of one layout's checkpoint, written to ``d`` and removed at the end."""
    path = write_layout(layout, d)
    try:
        f = read_plan(path).files[0]
        lay = layout_file(f, DEVICE_ALIGNMENT)
        buf = etptr.DeviceMemoryBuffer.create(lay.nbytes, "cuda:0", alignment=DEVICE_ALIGNMENT)
        upload = file_uploader(f, buf)
        report(f"file upload (pread), {layout}", f.nbytes, upload, line, verbose)
        if verbose:
            variants(f, lay, buf, upload, line)
            with open_checked(f) as opened:
                fills(opened.fileno(), lay, line)
        report(f"load_safetensors, {layout}", f.nbytes,
               lambda: etptr.load_safetensors(path, "cuda:0", progress=False), line, False)
        overlap = ckpt_load.EARLY_UPLOAD_MAX
        ckpt_load.EARLY_UPLOAD_MAX = 0
        try:
            report(f"load_safetensors, {layout}, header checked before the upload",
                   f.nbytes, lambda: etptr.load_safetensors(path, "cuda:0", progress=False),
                   line, False)
        finally:
            ckpt_load.EARLY_UPLOAD_MAX = overlap
        host = np.random.default_rng(0).integers(0, 255, f.nbytes, dtype=np.uint8)
        src = etptr.make_tensor_ptr([f.nbytes], host, type=etptr.ScalarType.Byte)
        out = buf.tensor(0, [f.nbytes], etptr.ScalarType.Byte)
        report(f"h2d_copy from memory, {f.nbytes / 1e6:.0f} MB", f.nbytes,
               lambda: etptr.h2d_copy(src, out), line, verbose)
        report(f"d2h_copy into memory, {f.nbytes / 1e6:.0f} MB", f.nbytes,
               lambda: etptr.d2h_copy(out, src), line, verbose)
        views = list(etptr.load_safetensors(path, "cpu").values())
        cases = [("file upload", f.nbytes, upload),
                 ("load_safetensors", f.nbytes,
                  lambda: etptr.load_safetensors(path, "cuda:0", progress=False)),
                 ("h2d_copy from memory", f.nbytes, lambda: etptr.h2d_copy(src, out)),
                 ("clone_tensor_ptrs_to of the file's views", f.nbytes,
                  lambda: etptr.clone_tensor_ptrs_to(views, "cuda:0"))]
        if verbose:
            small = [etptr.make_tensor_ptr(a) for a in
                     np.random.default_rng(2).integers(0, 255, (4096, 16384), dtype=np.uint8)]
            cases.append(("clone_tensor_ptrs_to of 4096 x 16 KiB", 4096 * 16384,
                          lambda: etptr.clone_tensor_ptrs_to(small, "cuda:0")))
        ramps(cases, line)
    finally:
        os.unlink(path)


def main(where):
    line = pinned_line_gbps(reps=7, warmup=1)
    say(f"line (pinned 256 MiB): {line:.1f} GB/s; {conditions()}")
    d = tempfile.mkdtemp(dir=where)
    try:
        for layout, verbose in (("all-minilm-l6-v2", True), ("qwen2.5-0.5b", False)):
            one_layout(layout, d, line, verbose)
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/shm")
    if len(sys.argv) > 2:
        write_log(sys.argv[2])
