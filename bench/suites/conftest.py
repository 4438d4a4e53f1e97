"""Shared fixtures for the pytest-benchmark suites (``pytest bench --benchmark-only``).

Setup stays outside the timed call; throughput is recorded in
``benchmark.extra_info`` under the keys that ``summarize.py`` reads, as the suites'
own helpers write them: ``"bytes"`` (per call) and ``"GB/s"`` (1e9 bytes/s, of the
median round).
GPU suites take ``cuda``, which skips without CuPy or a CUDA device.
"""
import types

import pytest

GB = 1e9


@pytest.fixture
def throughput(benchmark):
    """``record(nbytes)``: call after the benchmark ran to store bytes per call and GB/s."""

    def record(nbytes):
        benchmark.extra_info["bytes"] = int(nbytes)
        stats = getattr(benchmark, "stats", None)
        if stats is not None and stats.stats.median > 0:
            benchmark.extra_info["GB/s"] = round(nbytes / stats.stats.median / GB, 3)

    return record


@pytest.fixture
def torch_module():
    """torch, or a skip when it is not importable (for side-by-side comparisons)."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="session")
def cuda():
    """``namespace(cupy, index, device, sync)`` for device 0; skips without CuPy or a device.

    ``sync()`` is ``cudaDeviceSynchronize``; call it inside the timed function
    so asynchronous work is counted. ``device`` is the etptr device string.
    """
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver or no device
        pytest.skip(f"CuPy finds no CUDA device ({exc})")
    if count < 1:
        pytest.skip("CuPy finds no CUDA device")
    device = cupy.cuda.Device(0)
    return types.SimpleNamespace(cupy=cupy, index=0, device="cuda:0", sync=device.synchronize)
