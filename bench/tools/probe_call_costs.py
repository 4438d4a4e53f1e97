"""Probe: what one 4-byte copy costs at each layer, in us per call.

    python bench/tools/probe_call_costs.py

Rows: CuPy's current-stream lookup (which every default-stream copy makes), the
allocator's raw copies (``copy_host_to_device`` / ``copy_device_to_host``),
``h2d_copy`` / ``d2h_copy`` of TensorPtrs (synchronous and queued on the current
stream), and CuPy's ``set()`` / ``get(out=)`` beside them; median of 9 rounds of 2000
calls, the rows in turns.
"""
import time

import cupy
import numpy as np

import etptr
from etptr.cuda import CudaAllocator

CALLS = 2000


def per_call(rows):
    """{name: median us per call}: every row timed once per round, in turns."""
    for fn in rows.values():
        for _ in range(200):
            fn()
    times = {name: [] for name in rows}
    for _ in range(9):
        for name, fn in rows.items():
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fn()
            cupy.cuda.get_current_stream().synchronize()
            times[name].append((time.perf_counter() - t0) / CALLS * 1e6)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def main():
    alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA) or CudaAllocator()
    h = etptr.make_tensor_ptr(np.array([1.5], np.float32))
    d = etptr.clone_tensor_ptr_to(h, "cuda:0")
    hp = etptr.clone_tensor_ptr_to(d, "cpu")
    cur = cupy.cuda.get_current_stream()
    a = cupy.asarray(np.array([1.5], np.float32))
    host = cupy.cuda.alloc_pinned_memory(4)
    out = np.frombuffer(host, np.float32, 1)
    src = np.array([2.5], np.float32)
    rows = {
        "cupy.cuda.get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
        "allocator.copy_host_to_device (4 B)": lambda: alloc.copy_host_to_device(
            d.data_ptr, h.data_ptr, 4, 0),
        "allocator.copy_device_to_host (4 B, page-locked)": lambda: alloc.copy_device_to_host(
            hp.data_ptr, d.data_ptr, 4, 0),
        "h2d_copy(src, out)": lambda: etptr.h2d_copy(h, d),
        "h2d_copy(src, out, stream=current)": lambda: etptr.h2d_copy(h, d, stream=cur),
        "d2h_copy(src, out) into page-locked": lambda: etptr.d2h_copy(d, hp),
        "cupy ndarray.set()": lambda: a.set(src),
        "cupy ndarray.get(out=pinned)": lambda: a.get(out=out),
    }
    for name, us in per_call(rows).items():
        print(f"  {name:50s} {us:6.2f} us")


if __name__ == "__main__":
    main()
