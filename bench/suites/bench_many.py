"""Many tensors at once (pytest-benchmark); skipped without CuPy and a GPU.

    python -m pytest bench/suites/bench_many.py --benchmark-only [--benchmark-json=out.json]

4096 tensors of 16 KiB and the 290 tensors of a Qwen2.5-0.5B-shaped checkpoint (viewed
in a page-cached file), up and down: etptr per tensor, batched
(``clone_tensor_ptrs_to``), into existing tensors (``h2d_copy`` / ``d2h_copy``), and the
``cupy.asarray`` / ``get()`` loops; the checkpoint load itself; 4-byte copies into
existing tensors against ``cupy.ndarray.set()`` / ``get(out=)``. Every timed call ends
with a device synchronisation; ``extra_info`` records bytes and GB/s of the median.
"""
import numpy as np
import pytest

KiB = 1 << 10


def _cupy():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


cupy = _cupy()
pytestmark = pytest.mark.skipif(cupy is None, reason="needs CuPy and a CUDA device")

if cupy is not None:
    import etptr
    import etptr.cuda


def _record(benchmark, nbytes):
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 3)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 255, 16 * KiB, dtype=np.uint8) for _ in range(4096)]
    return arrays, [etptr.make_tensor_ptr(a) for a in arrays]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from etptr.bench import _model_shapes
    path = _model_shapes.write_layout("qwen2.5-0.5b", tmp_path_factory.mktemp("qwen"))
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    views = list(etptr.load_safetensors(path, "cpu").values())
    return path, views


def _sync():
    cupy.cuda.Device(0).synchronize()


@pytest.mark.benchmark(group="4096x16KiB H2D")
@pytest.mark.parametrize("how", ["etptr_per_tensor", "etptr_batched", "etptr_h2d_copy", "cupy_loop"])
def test_small_h2d(benchmark, small, how):
    arrays, tensors = small
    outs = [etptr.empty([16 * KiB], etptr.ScalarType.Byte, device="cuda:0") for _ in tensors]
    fn = {
        "etptr_per_tensor": lambda: [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in tensors],
        "etptr_batched": lambda: etptr.clone_tensor_ptrs_to(tensors, "cuda:0"),
        "etptr_h2d_copy": lambda: etptr.h2d_copy(tensors, outs),
        "cupy_loop": lambda: [cupy.asarray(a) for a in arrays],
    }[how]
    benchmark.pedantic(lambda: (fn(), _sync()), rounds=7, warmup_rounds=1)
    _record(benchmark, 4096 * 16 * KiB)


@pytest.mark.benchmark(group="4096x16KiB D2H")
@pytest.mark.parametrize("how", ["etptr_per_tensor", "etptr_batched", "etptr_d2h_copy", "cupy_loop"])
def test_small_d2h(benchmark, small, how):
    arrays, tensors = small
    dev = [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in tensors]
    pins = [etptr.empty([16 * KiB], etptr.ScalarType.Byte, pinned=True) for _ in tensors]
    cdev = [cupy.asarray(a) for a in arrays]
    fn = {
        "etptr_per_tensor": lambda: [etptr.clone_tensor_ptr_to(d, "cpu") for d in dev],
        "etptr_batched": lambda: etptr.clone_tensor_ptrs_to(dev, "cpu"),
        "etptr_d2h_copy": lambda: etptr.d2h_copy(dev, pins),
        "cupy_loop": lambda: [d.get() for d in cdev],
    }[how]
    benchmark.pedantic(lambda: (fn(), _sync()), rounds=7, warmup_rounds=1)
    _record(benchmark, 4096 * 16 * KiB)


@pytest.mark.benchmark(group="Qwen2.5-0.5B 290 tensors H2D")
@pytest.mark.parametrize("how", ["etptr_per_tensor", "etptr_batched", "load_safetensors"])
def test_qwen_h2d(benchmark, qwen, how):
    path, views = qwen
    fn = {
        "etptr_per_tensor": lambda: [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in views],
        "etptr_batched": lambda: etptr.clone_tensor_ptrs_to(views, "cuda:0"),
        "load_safetensors": lambda: etptr.load_safetensors(path, "cuda:0"),
    }[how]
    benchmark.pedantic(lambda: (fn(), _sync()), rounds=5, warmup_rounds=1)
    _record(benchmark, sum(v.nbytes for v in views))


@pytest.mark.benchmark(group="4-byte copy into an existing tensor")
@pytest.mark.parametrize("how", ["etptr_h2d_copy", "cupy_set", "etptr_d2h_copy", "cupy_get_out"])
def test_tiny(benchmark, how):
    tiny = np.array([1.5], np.float32)
    src = etptr.make_tensor_ptr(tiny)
    dev = etptr.clone_tensor_ptr_to(src, "cuda:0")
    pin = etptr.empty([1], pinned=True)
    cdev = cupy.asarray(tiny)
    out = np.frombuffer(cupy.cuda.alloc_pinned_memory(4), np.float32, 1)
    benchmark({
        "etptr_h2d_copy": lambda: etptr.h2d_copy(src, dev),
        "cupy_set": lambda: cdev.set(tiny),
        "etptr_d2h_copy": lambda: etptr.d2h_copy(dev, pin),
        "cupy_get_out": lambda: cdev.get(out=out),
    }[how])
    _record(benchmark, 4)
