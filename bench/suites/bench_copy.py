"""Host<->device copy benchmarks (pytest-benchmark); skipped without CuPy and a GPU.

    python -m pytest bench/suites/bench_copy.py --benchmark-only [--benchmark-json=out.json]

(``bench/tools/sweep_copy.py`` is the sweep that chose the copy engine's defaults.)

Each timed call is synchronous (etptr clones return complete; the CuPy and raw
baselines synchronise inside the timed function). ``extra_info`` records the
bytes moved and GB/s (from the median). Groups put etptr next to its
baselines: one raw ``cudaMemcpyAsync`` from/to page-locked memory (the line
rate), ``cupy.asarray`` and ``cupy.ndarray.get``.
"""
import gc

import numpy as np
import pytest

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
SIZES = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB]


def _cupy():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:
        return None


cupy = _cupy()
pytestmark = pytest.mark.skipif(cupy is None, reason="needs CuPy and a CUDA device")

if cupy is not None:
    import etptr
    import etptr.cuda


def _ids(n):
    return f"{n // GiB}GiB" if n >= GiB else f"{n // MiB}MiB" if n >= MiB else f"{n // KiB}KiB"


def _run(benchmark, fn, nbytes):
    """Time ``fn`` (few rounds for big copies), then record bytes and GB/s."""
    if nbytes >= 256 * MiB:
        benchmark.pedantic(fn, rounds=7 if nbytes < GiB else 5, warmup_rounds=1, iterations=1)
    else:
        benchmark(fn)
    med = benchmark.stats.stats.median
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["GB/s"] = round(nbytes / med / 1e9, 3)
    benchmark.extra_info["copy_config"] = etptr.cuda.get_copy_config()


@pytest.fixture(scope="module")
def data():
    return {}


def _host(data, n):
    if ("host", n) not in data:
        data.clear()
        gc.collect()
        data[("host", n)] = np.full(n, 7, np.uint8)
    return data[("host", n)]


def _pinned(data, n):
    if ("pinned", n) not in data:
        block = etptr.cuda.get_pinned_host_pool().malloc(n, 0)
        np.frombuffer(block, np.uint8)[:] = _host(data, n)
        data[("pinned", n)] = block
    return data[("pinned", n)]


def _device(data, n):
    if ("device", n) not in data:
        data[("device", n)] = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(_host(data, n)),
                                                        "cuda")
    return data[("device", n)]


# ------------------------------------------------------------------ host -> device

@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_h2d_pageable_etptr(benchmark, data, nbytes):
    benchmark.group = f"h2d-{_ids(nbytes)}"
    t = etptr.make_tensor_ptr(_host(data, nbytes))
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(t, "cuda"), nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_h2d_pinned_etptr(benchmark, data, nbytes):
    benchmark.group = f"h2d-{_ids(nbytes)}"
    t = etptr.make_tensor_ptr([nbytes], _pinned(data, nbytes), type=etptr.ScalarType.Byte)
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(t, "cuda"), nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_h2d_pageable_cupy_asarray(benchmark, data, nbytes):
    benchmark.group = f"h2d-{_ids(nbytes)}"
    a = _host(data, nbytes)

    def fn():
        cupy.asarray(a)
        cupy.cuda.get_current_stream().synchronize()
    _run(benchmark, fn, nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_h2d_pinned_raw_memcpy_async(benchmark, data, nbytes):
    benchmark.group = f"h2d-{_ids(nbytes)}"
    src = _pinned(data, nbytes)
    dst = cupy.empty(nbytes, np.uint8)
    s = cupy.cuda.Stream()

    def fn():
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, nbytes, 1, s.ptr)
        s.synchronize()
    _run(benchmark, fn, nbytes)


# ------------------------------------------------------------------ device -> host

@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_d2h_pinned_result_etptr(benchmark, data, nbytes):
    benchmark.group = f"d2h-{_ids(nbytes)}"
    d = _device(data, nbytes)
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(d, "cpu"), nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_d2h_pageable_result_etptr(benchmark, data, nbytes):
    benchmark.group = f"d2h-{_ids(nbytes)}"
    d = _device(data, nbytes)
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(d, "cpu", pinned=False), nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_d2h_cupy_get(benchmark, data, nbytes):
    benchmark.group = f"d2h-{_ids(nbytes)}"
    c = cupy.asarray(_device(data, nbytes))
    _run(benchmark, c.get, nbytes)


@pytest.mark.parametrize("nbytes", SIZES, ids=_ids)
def test_d2h_pinned_raw_memcpy_async(benchmark, data, nbytes):
    benchmark.group = f"d2h-{_ids(nbytes)}"
    dst = _pinned(data, nbytes)
    src = _device(data, nbytes)
    s = cupy.cuda.Stream()

    def fn():
        cupy.cuda.runtime.memcpyAsync(dst.ptr, src.data_ptr, nbytes, 2, s.ptr)
        s.synchronize()
    _run(benchmark, fn, nbytes)


# ------------------------------------------------------------------ tiny tensors

def test_tiny_up_etptr(benchmark):
    benchmark.group = "tiny-4B-up"
    t = etptr.make_tensor_ptr(np.ones(1, np.float32))
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(t, "cuda"), 4)


def test_tiny_up_cupy_asarray(benchmark):
    benchmark.group = "tiny-4B-up"
    a = np.ones(1, np.float32)

    def fn():
        cupy.asarray(a)
        cupy.cuda.get_current_stream().synchronize()
    _run(benchmark, fn, 4)


def test_tiny_down_etptr(benchmark):
    benchmark.group = "tiny-4B-down"
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.ones(1, np.float32)), "cuda")
    _run(benchmark, lambda: etptr.clone_tensor_ptr_to(d, "cpu"), 4)


def test_tiny_down_cupy_get(benchmark):
    benchmark.group = "tiny-4B-down"
    c = cupy.ones(1, np.float32)
    _run(benchmark, c.get, 4)


# ------------------------------------------------------------------ pinned pool

def test_pool_hit(benchmark):
    benchmark.group = "pinned-pool"
    pool = etptr.cuda.get_pinned_host_pool()
    pool.malloc(MiB, 0)            # cached after this
    _run(benchmark, lambda: pool.malloc(MiB, 0), MiB)


def test_pool_miss(benchmark):
    benchmark.group = "pinned-pool"
    pool = etptr.cuda.PinnedHostPool(max_cached_bytes=0)      # caches nothing: every call pins
    _run(benchmark, lambda: pool.malloc(MiB, 0), MiB)
