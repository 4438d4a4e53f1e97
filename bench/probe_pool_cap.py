"""Probe: batched device->host clones of a working set larger than the pinned pool's
cache cap. Each pass clones Qwen2.5-1.5B's 338 bf16 tensors (3.09 GB) from the GPU
into page-locked results and drops them; with the cap under the working set, every
pass pins and unpins the part that did not fit.

    python bench/probe_pool_cap.py [CAP_GiB ...]     (default: 2 8)
"""
import statistics
import sys
import time

import cupy

import etptr
import etptr.cuda
from etptr.bench._layouts import LAYOUTS


def main(caps):
    layout = LAYOUTS["qwen2.5-1.5b"]
    dev = [etptr.empty(list(shape), type=etptr.ScalarType.BFloat16, device="cuda:0")
           for _, shape in layout.shapes]
    nbytes = sum(t.nbytes for t in dev)
    pool = etptr.cuda.get_pinned_host_pool()
    print(f"{len(dev)} tensors, {nbytes / 1e9:.2f} GB, device->host, clone_tensor_ptrs_to")
    for cap in caps:
        pool.empty_cache()
        pool.max_cached_bytes = int(cap * (1 << 30))
        times = []
        for _ in range(6):
            cupy.cuda.Device(0).synchronize()
            t0 = time.perf_counter()
            out = etptr.clone_tensor_ptrs_to(dev, "cpu")
            times.append(time.perf_counter() - t0)
            del out
        st = pool.stats()
        med = statistics.median(times[1:])
        print(f"  cap {cap:5.1f} GiB: {nbytes / med / 1e9:6.1f} GB/s median of 5 "
              f"(first pass {nbytes / times[0] / 1e9:.1f}); misses {st['misses']}, "
              f"evictions {st['evictions']}")


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [2.0, 8.0])
