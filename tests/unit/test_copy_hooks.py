"""CPU tests of the copy path's wiring: stream/pinned hooks, makers' pinned=,
copy settings, pinned-pool size classes, lazy CuPy import, and the CUDA suite
run against the fake GPU (tests/fakes/fakecuda.c for libcuda, tests/fakes/fakecupy.py for CuPy).
None of these needs a GPU."""
import ctypes
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import etptr
from etptr import DeviceType
from etptr._core._device_allocator import _replace_allocator
from etptr.testing import HostDeviceAllocator, use_allocator

HERE = pathlib.Path(__file__).resolve().parent
# the etptr under test (compiled in place or installed): children import the same one,
# from a neutral working directory so that an uncompiled checkout cannot shadow it
SITE = str(pathlib.Path(etptr.__file__).resolve().parent.parent)


class StreamAllocator(etptr.DeviceAllocator):
    """Host memory posing as a device; takes the ``stream`` keyword and a pinned hook."""

    device_type = DeviceType.CUDA

    def __init__(self):
        self.blocks = {}
        self.calls = []
        self.host_blocks = 0

    def allocate(self, nbytes, index, alignment=8, *, stream=None):
        b = ctypes.create_string_buffer(max(nbytes, 1))
        self.blocks[ctypes.addressof(b)] = b
        self.calls.append(("allocate", stream))
        return ctypes.addressof(b)

    def deallocate(self, ptr, index):
        self.blocks.pop(ptr)

    def copy_host_to_device(self, dst, src, nbytes, index, *, stream=None):
        self.calls.append(("h2d", stream))
        ctypes.memmove(dst, src, nbytes)

    def copy_device_to_host(self, dst, src, nbytes, index, **kwargs):
        self.calls.append(("d2h", kwargs.get("stream")))
        ctypes.memmove(dst, src, nbytes)

    def allocate_host(self, nbytes, index):
        self.host_blocks += 1
        return bytearray(nbytes)


def test_stream_is_passed_to_allocators_that_take_it():
    a = StreamAllocator()
    with use_allocator(a):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda", stream=5)
        h = etptr.clone_tensor_ptr_to(d, "cpu", stream=5)
    assert a.calls == [("allocate", 5), ("h2d", 5), ("d2h", 5)]
    assert list(h.numpy()) == [1.0, 2.0]
    assert a.host_blocks == 1


def test_default_call_passes_no_keywords():
    a = StreamAllocator()
    with use_allocator(a):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
        etptr.clone_tensor_ptr_to(d, "cpu")
    assert a.calls == [("allocate", None), ("h2d", None), ("d2h", None)]


def test_allocators_without_stream_keyword_copy_synchronously():
    a = HostDeviceAllocator()
    with use_allocator(a):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([3, 4]), "cuda", stream=object())
        h = etptr.clone_tensor_ptr_to(d, "cpu", stream=object())
    assert list(h.numpy()) == [3, 4]
    assert (a.h2d_count, a.d2h_count) == (1, 1)


def test_pinned_false_skips_allocate_host():
    a = StreamAllocator()
    with use_allocator(a):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1, 2, 3]), "cuda")
        h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
        assert a.host_blocks == 0
        h2 = etptr.clone_tensor_ptr_to(d, "cpu")
        assert a.host_blocks == 1
    assert list(h.numpy()) == list(h2.numpy()) == [1, 2, 3]


def test_allocate_host_must_give_a_large_writable_buffer():
    class Small(StreamAllocator):
        def allocate_host(self, nbytes, index):
            return bytearray(1)

    class ReadOnly(StreamAllocator):
        def allocate_host(self, nbytes, index):
            return bytes(nbytes)

    for cls, match in ((Small, "buffer of 1 bytes"), (ReadOnly, "read-only")):
        with use_allocator(cls()):
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda")
            with pytest.raises(etptr.InvalidArgumentError, match=match):
                etptr.clone_tensor_ptr_to(d, "cpu")


def test_pinned_makers_use_allocate_host():
    a = StreamAllocator()
    with use_allocator(a):
        t = etptr.zeros([4, 4], pinned=True)
        assert a.host_blocks == 1 and t.device.is_cpu() and not t.numpy().any()
        f = etptr.full([3], 2.0, pinned=True, device="cuda")     # staging buffer from the hook
        assert a.host_blocks == 2 and f.device.type == DeviceType.CUDA
        e = etptr.empty_like(t, pinned=True)
        assert a.host_blocks == 3 and e.sizes == (4, 4)
        r = etptr.rand([5], pinned=True)
        assert a.host_blocks == 4 and r.numpy().shape == (5,)


def test_pinned_without_cuda_allocator_raises():
    prev = _replace_allocator(DeviceType.CUDA, None)
    try:
        with pytest.raises(etptr.NotFoundError, match="pinned=True"):
            etptr.empty([3], pinned=True)
    finally:
        _replace_allocator(DeviceType.CUDA, prev)
    with use_allocator(HostDeviceAllocator()):
        with pytest.raises(etptr.NotSupportedError, match="allocate_host"):
            etptr.ones([3], pinned=True)


# ------------------------------------------------------------------ settings and size classes

def test_copy_config_process_wide_and_per_thread():
    from etptr.cuda import copy_config, get_copy_config, set_copy_config
    before = get_copy_config()
    try:
        set_copy_config(threads=3, slot_bytes=1 << 20)
        assert get_copy_config()["threads"] == 3
        with copy_config(slots=5):
            assert get_copy_config() == dict(before, threads=3, slot_bytes=1 << 20, slots=5)
            with copy_config(threads=1):
                assert get_copy_config()["threads"] == 1
                assert get_copy_config()["slots"] == 5
            assert get_copy_config()["threads"] == 3
        assert get_copy_config()["slots"] == before["slots"]
    finally:
        set_copy_config(**{k: before[k] for k in ("threads", "slot_bytes", "slots")},
                        small_copy_bytes=before["small_copy_bytes"])
    assert get_copy_config() == before


def test_a_copy_config_block_is_seen_by_its_own_thread_only():
    import threading

    from etptr.cuda import copy_config, get_copy_config
    before = get_copy_config()
    seen = {}

    def other(key, open_block):
        seen[key + " before"] = get_copy_config()       # a thread that never opened a block
        if open_block:
            with copy_config(slots=7):
                seen[key + " inside"] = get_copy_config()
        seen[key + " after"] = get_copy_config()

    with copy_config(threads=1):
        t = threading.Thread(target=other, args=("fresh", False))
        t.start()
        t.join()
        t = threading.Thread(target=other, args=("own", True))
        t.start()
        t.join()
        assert get_copy_config() == dict(before, threads=1)
    assert seen["fresh before"] == seen["fresh after"] == before
    assert seen["own before"] == seen["own after"] == before
    assert seen["own inside"] == dict(before, slots=7)
    assert get_copy_config() == before


def test_copy_config_blocks_left_out_of_order_leave_nothing_behind():
    from etptr.cuda import copy_config, get_copy_config
    before = get_copy_config()

    def block(**kw):
        with copy_config(**kw):
            yield get_copy_config()
            yield get_copy_config()

    a, b = block(slot_bytes=8192), block(slots=5)
    assert next(a)["slot_bytes"] == 8192
    assert next(b) == dict(before, slot_bytes=8192, slots=5)
    a.close()                                   # A ends first, B is still open
    assert get_copy_config() == dict(before, slots=5)
    b.close()
    assert get_copy_config() == before


def test_a_copy_config_block_left_in_another_thread_is_refused():
    import threading

    from etptr.cuda import copy_config, get_copy_config
    before = get_copy_config()

    def block():
        with copy_config(slots=6):
            yield

    g = block()
    next(g)
    errors = []

    def close():
        try:
            g.close()
        except etptr.InvalidStateError as exc:
            errors.append(exc)

    t = threading.Thread(target=close)
    t.start()
    t.join()
    assert len(errors) == 1 and "not open in this thread or task" in str(errors[0])
    assert get_copy_config() == dict(before, slots=6)    # it stays where it began


def test_copy_config_in_asyncio_tasks_is_per_task():
    import asyncio

    from etptr.cuda import copy_config, get_copy_config
    seen = {}

    async def task(slots):
        with copy_config(slots=slots):
            await asyncio.sleep(0)
            seen[slots] = get_copy_config()["slots"]
            await asyncio.sleep(0)

    async def both():
        await asyncio.gather(task(4), task(9))

    asyncio.run(both())
    assert seen == {4: 4, 9: 9}


@pytest.mark.parametrize("kw, match", [
    ({"threads": 0}, "threads=0"), ({"slot_bytes": 100}, "slot_bytes=100"),
    ({"slots": 0}, "slots=0"), ({"small_copy_bytes": -1}, "small_copy_bytes=-1"),
])
def test_copy_config_rejects_bad_values(kw, match):
    from etptr.cuda import copy_config, set_copy_config
    with pytest.raises(etptr.InvalidArgumentError, match=match):
        set_copy_config(**kw)
    with pytest.raises(etptr.InvalidArgumentError, match=match):
        with copy_config(**kw):
            pass
    with pytest.raises(etptr.InvalidTypeError):
        set_copy_config(threads=2.5)


def test_size_classes_bound_waste():
    from etptr.cuda import size_class
    rng = np.random.default_rng(0)
    sizes = list(range(0, 70000, 97)) + [int(x) for x in rng.integers(1, 1 << 34, 2000)]
    sizes += [(1 << k) + d for k in range(12, 40) for d in (-1, 0, 1)]
    for n in sizes:
        c = size_class(n)
        assert c >= max(n, 1)
        assert c % 4096 == 0
        assert c - n <= max(n / 8, 4096), (n, c)
    assert size_class(1 << 30) == 1 << 30
    assert size_class((1 << 30) + 1) == (1 << 30) + (1 << 27)   # not 2 GiB
    classes = {size_class(n) for n in range((1 << 20) + 1, (1 << 21) + 1, 4096)}
    assert len(classes) == 8                                      # eight per power of two


def test_pool_cap_validation():
    from etptr.cuda import PinnedHostPool
    p = PinnedHostPool(max_cached_bytes=1 << 20)
    assert p.max_cached_bytes == 1 << 20
    assert p.stats()["in_use_bytes"] == 0 and p.stats()["cached_bytes"] == 0
    with pytest.raises(etptr.InvalidArgumentError, match="max_cached_bytes=-1"):
        PinnedHostPool(max_cached_bytes=-1)
    with pytest.raises(TypeError):
        etptr.cuda.PinnedBlock()


# ------------------------------------------------------------------ processes

def _env(**extra):
    path = os.pathsep.join(p for p in (SITE, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def _run(code, tmp_path, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(tmp_path), env=_env(**env), timeout=300)


def test_import_etptr_never_imports_cupy(tmp_path):
    out = _run("import sys, etptr, etptr.cuda, etptr.testing\n"
               "t = etptr.zeros([2]); etptr.cuda.get_copy_config()\n"
               "print('cupy' in sys.modules)", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cuda_suite_against_fake_cupy(tmp_path):
    """tests/cuda run against host memory standing in for the GPU (copy engine logic),
    through the stand-in libcuda built here."""
    import _fake_libcuda
    if not sys.platform.startswith("linux"):
        pytest.skip("the fake driver is a Linux shared library")
    libcuda = _fake_libcuda.build(str(tmp_path))
    if libcuda is None:
        pytest.skip("no C compiler to build the fake libcuda (tests/fakes/fakecuda.c)")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE.parent / "cuda")],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=600,
        env=_env(ETPTR_FAKE_CUPY="1", ETPTR_FAKE_LIBCUDA=libcuda))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout


def test_copy_config_from_environment(tmp_path):
    code = "import etptr.cuda; print(sorted(etptr.cuda.get_copy_config().items()))"
    out = _run(code, tmp_path, ETPTR_COPY_CONFIG="threads=3, slot_bytes=0x100000,slots=5")
    assert out.returncode == 0, out.stderr
    assert "('slot_bytes', 1048576)" in out.stdout and "('slots', 5)" in out.stdout
    assert "('threads', 3)" in out.stdout
    bad = _run("import warnings; warnings.simplefilter('always')\n" + code, tmp_path,
               ETPTR_COPY_CONFIG="threads=zero")
    assert bad.returncode == 0 and "ignoring ETPTR_COPY_CONFIG" in bad.stderr
