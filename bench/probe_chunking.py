"""How mid-size pageable copies should be cut into chunks.

    python bench/probe_chunking.py [OUTFILE]

For pageable uploads and downloads (into pageable memory) of 512 KiB - 128 MiB,
times clone_tensor_ptr_to (median of 9, GB/s) under several ways of cutting a copy
shorter than K slots: one chunk per slot ("1 x slot"), or about N chunks of at least
M bytes. The engine's choice (etptr/_core/_staging.pyx, _TARGET_CHUNKS and _MIN_CHUNK)
comes from this table; bench/results/ keeps a run.
"""
import sys

import numpy as np

MiB = 1 << 20
from _timing import median_seconds, say, write_log


def median_s(fn, reps=9, warmup=2):
    return median_seconds(fn, reps, warmup)


def main(argv):
    import cupy
    import etptr
    import etptr.cuda
    from etptr._core import _host_copy
    from etptr.cuda import _copy_engine, _driver

    cupy.cuda.Device(0).use()
    saved = _copy_engine._get_chunking()
    ways = [("1 x slot", 1, 1 << 40), ("2 x >=1M", 2, MiB), ("4 x >=1M", 4, MiB),
            ("4 x >=512K", 4, MiB // 2), ("8 x >=1M", 8, MiB)]
    sizes = [MiB // 2, MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB]
    say(f"# chunking probe, {_driver._driver_calls()}, config {etptr.cuda.get_copy_config()}")
    pool = etptr.cuda.get_pinned_host_pool()
    threads = etptr.cuda.get_copy_config()["threads"]
    say("\n## pieces of a pageable upload, per size (us, median of 9): host copies into a")
    say("## page-locked block by T threads (memcpy or streaming stores), then one DMA of it")
    say("size        T=1 memcpy  T=all memcpy  T=all stream  memcpy+DMA  stream+DMA  copy_h2d  clone")
    alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    for n in sizes:
        a = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
        t = etptr.make_tensor_ptr(a)
        blk = pool.malloc(n, 0)
        dbuf = cupy.empty(n, np.uint8)
        s = cupy.cuda.Stream(non_blocking=False)

        def fill_dma(stream):
            _host_copy.parallel_copy(blk.ptr, a.ctypes.data, n, threads, stream)
            cupy.cuda.runtime.memcpyAsync(dbuf.data.ptr, blk.ptr, n, 1, s.ptr)
            s.synchronize()

        row = [median_s(lambda: _host_copy.parallel_copy(blk.ptr, a.ctypes.data, n, 1)),
               median_s(lambda: _host_copy.parallel_copy(blk.ptr, a.ctypes.data, n, threads)),
               median_s(lambda: _host_copy.parallel_copy(blk.ptr, a.ctypes.data, n, threads, True)),
               median_s(lambda: fill_dma(False)),
               median_s(lambda: fill_dma(True)),
               median_s(lambda: alloc.copy_host_to_device(dbuf.data.ptr, a.ctypes.data, n, 0)),
               median_s(lambda: etptr.clone_tensor_ptr_to(t, "cuda"))]
        say(f"{n // 1024:6d} KiB" + "".join(f"{r * 1e6:12.1f}" for r in row))
        del blk
    for stream in (True, False):
        _copy_engine._set_streaming_stores(stream)
        say(f"\n## H2D, upload slots filled with {'streaming stores' if stream else 'memcpy'} (GB/s)")
        say("size      " + "".join(f"{w[0]:>12s}" for w in ways))
        for n in sizes:
            a = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
            t = etptr.make_tensor_ptr(a)
            row = []
            for _, target, minimum in ways:
                _copy_engine._set_chunking(target, minimum)
                row.append(n / median_s(lambda: etptr.clone_tensor_ptr_to(t, "cuda")) / 1e9)
            best = max(range(len(ways)), key=lambda i: row[i])
            say(f"{n // 1024:6d} KiB" + "".join(f"{r:12.1f}" for r in row)
                + f"   best: {ways[best][0]}")
    _copy_engine._set_streaming_stores(True)
    for direction in ("D2H pageable",):
        say(f"\n## {direction} (GB/s)")
        say("size      " + "".join(f"{w[0]:>12s}" for w in ways))
        for n in sizes:
            a = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
            t = etptr.make_tensor_ptr(a)
            d = etptr.clone_tensor_ptr_to(t, "cuda")
            row = []
            for _, target, minimum in ways:
                _copy_engine._set_chunking(target, minimum)
                if direction == "H2D":
                    s = median_s(lambda: etptr.clone_tensor_ptr_to(t, "cuda"))
                else:
                    s = median_s(lambda: etptr.clone_tensor_ptr_to(d, "cpu", pinned=False))
                row.append(n / s / 1e9)
            best = max(range(len(ways)), key=lambda i: row[i])
            say(f"{n // 1024:6d} KiB" + "".join(f"{r:12.1f}" for r in row)
                + f"   best: {ways[best][0]}")
    _copy_engine._set_chunking(*saved)
    if argv:
        write_log(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
