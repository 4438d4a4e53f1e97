"""Probe: 4- and 8-byte copies into existing tensors by each of the engine's small-copy
paths (``_small_copy._set_tiny_paths``), next to CuPy's.

    python bench/probe_small_copies.py [OUTFILE]

Paths: uploads of 4 and 8 bytes as stream writes or through the tiny slots; small
synchronous copies waited for by the fence or by stream synchronisation. Rows:
h2d_copy (synchronous: landed on return), h2d_copy(stream=current) (queued, as
ndarray.set() leaves a pageable upload), d2h_copy into a page-locked out; cupy's
ndarray.set() and ndarray.get(out=pinned). Microseconds per call, median of 7 rounds
of 3000 calls, the paths in turns each round.
"""
import statistics
import sys
import time

import numpy as np
from _timing import say, write_log

import etptr
from etptr.cuda import _small_copy

PATHS = {"writes+fence": dict(writes=True, fence=True),
         "slots+fence": dict(writes=False, fence=True),
         "writes+sync": dict(writes=True, fence=False),
         "slots+sync (before)": dict(writes=False, fence=False)}


def per_call_us(fn, n=3000):
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv):
    import cupy as cp
    cur = cp.cuda.get_current_stream()
    etptr.clone_tensor_ptr_to(etptr.full([1], 1.0), "cuda:0")      # loads the driver
    say(f"stream writes available: {_small_copy._stream_writes_available()}; "
        f"default paths: {_small_copy._get_tiny_paths()}")
    for nbytes in (4, 8):
        host = np.arange(nbytes // 4, dtype=np.float32) + 1.5
        src = etptr.make_tensor_ptr(host)
        dev = etptr.clone_tensor_ptr_to(src, "cuda:0")
        pin = etptr.clone_tensor_ptr_to(dev, "cpu")           # page-locked
        cdev = cp.asarray(host)
        cpin = np.frombuffer(cp.cuda.alloc_pinned_memory(nbytes), np.float32, nbytes // 4)
        rows = {"h2d_copy": lambda: etptr.h2d_copy(src, dev),
                "h2d_copy(stream=current)": lambda: etptr.h2d_copy(src, dev, stream=cur),
                "d2h_copy into page-locked": lambda: etptr.d2h_copy(dev, pin)}
        times = {(p, r): [] for p in PATHS for r in rows}
        peers = {"ndarray.set()": [], "ndarray.get(out=pinned)": []}
        before = _small_copy._get_tiny_paths()
        try:
            for _ in range(7):
                for p, kw in PATHS.items():
                    _small_copy._set_tiny_paths(**kw)
                    for r, fn in rows.items():
                        times[p, r].append(per_call_us(fn))
                        cur.synchronize()
                _small_copy._set_tiny_paths(**before)
                peers["ndarray.set()"].append(per_call_us(lambda: cdev.set(host)))
                peers["ndarray.get(out=pinned)"].append(per_call_us(lambda: cdev.get(out=cpin)))
        finally:
            _small_copy._set_tiny_paths(**before)
        assert etptr.clone_tensor_ptr_to(dev, "cpu").numpy().tolist() == host.tolist()
        med = {k: statistics.median(v) for k, v in times.items()}
        pmed = {k: statistics.median(v) for k, v in peers.items()}
        say(f"## {nbytes} bytes, us per call (ratio to cupy's)")
        say(f"  {'path':22s}" + "".join(f"{r:>30s}" for r in rows))
        for p in PATHS:
            cells = []
            for r in rows:
                peer = pmed["ndarray.get(out=pinned)" if r.startswith("d2h") else "ndarray.set()"]
                cells.append(f"{med[p, r]:6.2f} ({med[p, r] / peer:4.2f})")
            say(f"  {p:22s}" + "".join(f"{c:>30s}" for c in cells))
        say("  cupy: " + ", ".join(f"{k} {v:.2f}" for k, v in pmed.items()))
    if len(argv) > 1:
        write_log(argv[1])


if __name__ == "__main__":
    main(sys.argv)
