"""Latency probe for small copies and the source-memory effect on big uploads.

    PYTHONPATH=. python bench/probe_small.py [OUTFILE]

Times (median, microseconds) the CUDA primitives a 4-byte copy can use
(cudaMemcpyAsync + cudaStreamSynchronize on a blocking stream, on the legacy
stream, cudaMemcpy), the pieces of an etptr clone (pool block, device
allocation, one copy call), and whole 4-byte clones next to cupy.asarray /
ndarray.get. Then 256 MiB uploads from host arrays
filled in different ways, alternated, to see whether the source's history
changes the rate. bench/results/h200x2_probe_small.txt keeps a run.
"""
import statistics
import sys

import numpy as np

from _timing import median_seconds, say, write_log


def med_us(fn, reps=3000, warmup=100):
    return median_seconds(fn, reps, warmup) * 1e6


def main(argv):
    import cupy
    import etptr
    import etptr.cuda
    from etptr.cuda import _driver
    say(f"copy engine's CUDA calls: {_driver._driver_calls()}")

    rt = cupy.cuda.runtime
    drv = cupy.cuda.driver
    cupy.cuda.Device(0).use()
    alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    pool = etptr.cuda.get_pinned_host_pool()
    s = cupy.cuda.Stream(non_blocking=False)
    dbuf = cupy.zeros(1024, np.uint8)
    pin = pool.malloc(4096, 0)
    page = np.zeros(4096, np.uint8)
    d, p, g = dbuf.data.ptr, pin.ptr, page.ctypes.data

    say("## primitives (us)")
    rows = {
        "getDevice": rt.getDevice,
        "ctxGetCurrent": drv.ctxGetCurrent,
        "get_current_stream": cupy.cuda.get_current_stream,
        "h2d pinned async+sync": lambda: (rt.memcpyAsync(d, p, 4, 1, s.ptr), rt.streamSynchronize(s.ptr)),
        "h2d pinned legacy async+sync": lambda: (rt.memcpyAsync(d, p, 4, 1, 0), rt.streamSynchronize(0)),
        "h2d pinned cudaMemcpy": lambda: rt.memcpy(d, p, 4, 1),
        "h2d pageable async+sync": lambda: (rt.memcpyAsync(d, g, 4, 1, s.ptr), rt.streamSynchronize(s.ptr)),
        "h2d pageable cudaMemcpy": lambda: rt.memcpy(d, g, 4, 1),
        "h2d pageable cudaMemcpy+sync": lambda: (rt.memcpy(d, g, 4, 1), rt.streamSynchronize(0)),
        "d2h pinned async+sync": lambda: (rt.memcpyAsync(p, d, 4, 2, s.ptr), rt.streamSynchronize(s.ptr)),
        "d2h pinned legacy async+sync": lambda: (rt.memcpyAsync(p, d, 4, 2, 0), rt.streamSynchronize(0)),
        "d2h pinned cudaMemcpy": lambda: rt.memcpy(p, d, 4, 2),
        "d2h pageable cudaMemcpy": lambda: rt.memcpy(g, d, 4, 2),
    }
    for k, f in rows.items():
        say(f"{k:32s} {med_us(f):7.2f}")

    say("\n## etptr pieces (us)")
    pieces = {
        "pool.malloc(4) + free": lambda: pool.malloc(4, 0),
        "allocate(4) + deallocate": lambda: alloc.deallocate(alloc.allocate(4, 0), 0),
    }
    pieces["copy_device_to_host pinned"] = lambda: alloc.copy_device_to_host(p, d, 4, 0)
    pieces["copy_device_to_host pageable"] = lambda: alloc.copy_device_to_host(g, d, 4, 0)
    pieces["copy_host_to_device pageable"] = lambda: alloc.copy_host_to_device(d, g, 4, 0)
    for k, f in pieces.items():
        say(f"{k:40s} {med_us(f):7.2f}")

    say("\n## 4-byte clones (us)")
    four = etptr.make_tensor_ptr(np.ones(1, np.float32))
    four_d = etptr.clone_tensor_ptr_to(four, "cuda")
    four_np = np.ones(1, np.float32)
    four_c = cupy.ones(1, np.float32)

    def c_up():
        cupy.asarray(four_np)
        cupy.cuda.get_current_stream().synchronize()

    base_up = med_us(c_up)
    base_down = med_us(four_c.get)
    say(f"cupy.asarray+sync {base_up:.2f}  ndarray.get {base_down:.2f}")
    up = med_us(lambda: etptr.clone_tensor_ptr_to(four, "cuda"))
    down = med_us(lambda: etptr.clone_tensor_ptr_to(four_d, "cpu"))
    say(f"etptr: up {up:.2f} ({up / base_up:.2f}x asarray)  "
        f"down {down:.2f} ({down / base_down:.2f}x get)")

    say("\n## 256 MiB uploads by how the source was filled (GB/s, median of 5, 3 rounds)")
    n = 256 << 20
    sources = {
        "rng.integers": np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8),
        "np.full(7)": np.full(n, 7, np.uint8),
        "np.ones": np.ones(n, np.uint8),
        "arange%251": (np.arange(n, dtype=np.uint32) % 251).astype(np.uint8),
    }
    tensors = {k: etptr.make_tensor_ptr(v) for k, v in sources.items()}
    for rnd in range(3):
        row = []
        for k, t in tensors.items():
            us = statistics.median(
                [med_us(lambda: etptr.clone_tensor_ptr_to(t, "cuda"), reps=1, warmup=0)
                 for _ in range(6)][1:])
            row.append(f"{k}={n / us / 1e3:6.2f}")
        say(f"round {rnd}: " + "  ".join(row))
    for k, v in sources.items():
        say(f"{k}: address % 4096 = {v.ctypes.data % 4096}")
    if argv:
        write_log(argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
