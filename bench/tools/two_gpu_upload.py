"""Concurrent pageable uploads to two GPUs from two threads, against one GPU alone.

Each GPU has its own copy stream and pinned slots, and every call runs under its
device's context, so two threads uploading to two GPUs should each keep their own
PCIe link busy. Prints the aggregate GB/s of both GPUs together and its ratio to one
GPU's GB/s (2.0 would be perfect scaling).

    python bench/tools/two_gpu_upload.py [--size-mib 1024] [--repeats 5] [--threads-per-copy N]
                                   [--slot-mib N]

Needs CuPy and at least two CUDA devices.
"""
import argparse
import statistics
import sys
import threading
import time

import numpy as np

import etptr
import etptr.cuda


def upload_seconds(tensor, device, repeats):
    """Median wall time of ``repeats`` synchronous uploads of ``tensor`` to ``device``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = etptr.clone_tensor_ptr_to(tensor, device)
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def raw_pinned_seconds(cupy, nbytes, devices, repeats):
    """Median wall time of one cudaMemcpyAsync of ``nbytes`` from page-locked host memory
    to each of ``devices`` at once (each on its own stream): the links' ceiling."""
    bufs = []
    for d in devices:
        with cupy.cuda.Device(d):
            host = cupy.cuda.alloc_pinned_memory(nbytes)
            dev = cupy.cuda.alloc(nbytes)
            bufs.append((d, host, dev, cupy.cuda.Stream(non_blocking=True)))
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for d, host, dev, stream in bufs:
            with cupy.cuda.Device(d):
                cupy.cuda.runtime.memcpyAsync(dev.ptr, host.ptr, nbytes, 1, stream.ptr)
        for d, _host, _dev, stream in bufs:
            with cupy.cuda.Device(d):
                stream.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def host_copy_seconds(sources, pinned, threads, repeats):
    """Median wall time of the staging copy alone: each source copied into its own
    page-locked block by ``threads`` threads, all sources at once from one Python
    thread each (the host side of the pipeline, without DMA)."""
    from etptr._core import _host_copy
    barrier = threading.Barrier(len(sources))
    times = []

    def copy(i):
        barrier.wait()
        _host_copy.parallel_copy(pinned[i].ptr, sources[i].data_ptr, sources[i].nbytes, threads)

    for _ in range(repeats + 1):
        ts = [threading.Thread(target=copy, args=(i,)) for i in range(len(sources))]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024, help="bytes per upload, in MiB")
    p.add_argument("--repeats", type=int, default=5, help="timed uploads per measurement")
    p.add_argument("--threads-per-copy", type=int, default=None,
                   help="host threads each copy may use (default: the engine's setting)")
    p.add_argument("--slot-mib", type=int, default=None,
                   help="pinned slot size in MiB (default: the engine's setting)")
    args = p.parse_args(argv)

    import cupy
    ndev = cupy.cuda.runtime.getDeviceCount()
    if ndev < 2:
        print(f"two_gpu_upload: needs two CUDA devices, found {ndev}")
        return 0
    if args.threads_per_copy:
        etptr.cuda.set_copy_config(threads=args.threads_per_copy)
    if args.slot_mib:
        etptr.cuda.set_copy_config(slot_bytes=args.slot_mib << 20)
    nbytes = args.size_mib << 20
    sources = [etptr.make_tensor_ptr(np.random.default_rng(i).integers(
        0, 255, nbytes, dtype=np.uint8)) for i in range(2)]
    for i in range(2):  # warm both devices: contexts, pools, streams
        upload_seconds(sources[i], f"cuda:{i}", 1)

    one = upload_seconds(sources[0], "cuda:0", args.repeats)
    results = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        barrier.wait()
        results[i] = upload_seconds(sources[i], f"cuda:{i}", args.repeats)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start

    pool = etptr.cuda.get_pinned_host_pool()
    pinned = [pool.malloc(nbytes, i) for i in range(2)]
    t = etptr.cuda.get_copy_config()["threads"]
    host_one = nbytes / host_copy_seconds(sources[:1], pinned, t, args.repeats) / 1e9
    host_two = 2 * nbytes / host_copy_seconds(sources, pinned, t, args.repeats) / 1e9
    del pinned
    raw_one = nbytes / raw_pinned_seconds(cupy, nbytes, [0], args.repeats) / 1e9
    raw_two = 2 * nbytes / raw_pinned_seconds(cupy, nbytes, [0, 1], args.repeats) / 1e9
    one_gbps = nbytes / one / 1e9
    both_gbps = 2 * nbytes * args.repeats / wall / 1e9
    cfg = etptr.cuda.get_copy_config()
    print(f"pageable upload of {args.size_mib} MiB, median of {args.repeats}, copy config {cfg}")
    print(f"  one GPU (cuda:0) alone          : {one_gbps:6.1f} GB/s")
    print("  per GPU, both at once           : "
          + ", ".join(f"cuda:{i} {nbytes / results[i] / 1e9:.1f} GB/s" for i in range(2)))
    print(f"  two GPUs together (aggregate)   : {both_gbps:6.1f} GB/s")
    print(f"  aggregate / one GPU             : {both_gbps / one_gbps:6.2f}x")
    print(f"  raw pinned DMA, cuda:0 alone    : {raw_one:6.1f} GB/s")
    print(f"  raw pinned DMA, both at once    : {raw_two:6.1f} GB/s aggregate "
          f"({raw_two / raw_one:.2f}x one GPU: the ceiling of the links and host)")
    print(f"  host staging copy, one alone    : {host_one:6.1f} GB/s ({t} threads, pageable -> "
          f"page-locked, no DMA)")
    print(f"  host staging copy, two at once  : {host_two:6.1f} GB/s aggregate "
          f"({host_two / host_one:.2f}x one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
