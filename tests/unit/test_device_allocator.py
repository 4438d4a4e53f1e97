"""etptr._core._device_allocator: the DeviceAllocator interface, the registry, and etptr.testing."""
import threading

import numpy as np
import pytest

import etptr
from etptr import DeviceType
from etptr._core._device_allocator import _replace_allocator
from etptr.testing import HostDeviceAllocator, use_allocator

from _helpers import PyAllocator, cuda_available, run_isolated


@pytest.fixture
def empty_cuda_slot():
    """No CUDA allocator registered during the test."""
    prev = _replace_allocator(DeviceType.CUDA, None)
    yield
    _replace_allocator(DeviceType.CUDA, prev)


# ------------------------------------------------------------------ the interface

@pytest.mark.parametrize("method, args", [
    ("allocate", (16, 0)),
    ("deallocate", (0, 0)),
    ("copy_host_to_device", (1, 2, 3, 0)),
    ("copy_device_to_host", (1, 2, 3, 0)),
])
def test_base_methods_must_be_overridden(method, args):
    base = etptr.DeviceAllocator()
    with pytest.raises(etptr.NotSupportedError) as info:
        getattr(base, method)(*args)
    assert f"DeviceAllocator.{method} must be implemented" in str(info.value)


def test_base_device_type_must_be_overridden():
    with pytest.raises(etptr.NotSupportedError) as info:
        etptr.DeviceAllocator().device_type
    assert "device_type" in str(info.value)


def test_base_hooks():
    base = etptr.DeviceAllocator()
    assert base.resolve_index(-1) == 0
    assert base.resolve_index(3) == 3
    assert base.allocate_host(64, 0) is None
    assert etptr.DEFAULT_ALIGNMENT == 8


def test_subclass_error_names_the_subclass():
    class Half(etptr.DeviceAllocator):
        device_type = DeviceType.CUDA
    with pytest.raises(etptr.NotSupportedError) as info:
        Half().allocate(8, 0)
    assert "Half.allocate" in str(info.value)


# ------------------------------------------------------------------ registry

def test_registry_singleton_cannot_be_constructed():
    reg = etptr.DeviceAllocatorRegistry.instance()
    assert reg is etptr.DeviceAllocatorRegistry.instance()
    with pytest.raises(TypeError):
        etptr.DeviceAllocatorRegistry()


def test_register_then_lookup(empty_cuda_slot):
    a = HostDeviceAllocator()
    assert etptr.get_device_allocator(DeviceType.CUDA) is None
    assert etptr.register_device_allocator(a) is None
    assert etptr.get_device_allocator(DeviceType.CUDA) is a
    assert etptr.get_device_allocator(1) is a
    assert etptr.DeviceAllocatorRegistry.instance().get_allocator(DeviceType.CUDA) is a
    assert etptr.get_device_allocator(DeviceType.CPU) is None


def test_double_registration_is_invalid_state(empty_cuda_slot):
    first, second = HostDeviceAllocator(), PyAllocator()
    etptr.DeviceAllocatorRegistry.instance().register_allocator(first)
    with pytest.raises(etptr.InvalidStateError) as info:
        etptr.register_device_allocator(second)
    assert info.value.error is etptr.Error.InvalidState
    assert "already registered" in str(info.value)
    assert "HostDeviceAllocator" in str(info.value)
    with pytest.raises(etptr.InvalidStateError):
        etptr.register_device_allocator(first)  # the same object twice, too
    assert etptr.get_device_allocator(DeviceType.CUDA) is first


@pytest.mark.parametrize("bad, cls, fragment", [
    (7, etptr.InvalidArgumentError, "device_type=7 is not a DeviceType code"),
    (-1, etptr.InvalidArgumentError, "device_type=-1 is not a DeviceType code"),
    ("tpu", etptr.InvalidArgumentError, "device_type='tpu' is not a device"),
    (None, etptr.InvalidTypeError, "device_type must be an etptr.DeviceType, got None"),
    (1.0, etptr.InvalidTypeError, "got 1.0"),
    (True, etptr.InvalidTypeError, "got True"),
    (b"cuda", etptr.InvalidTypeError, "got b'cuda'"),
])
def test_lookup_with_a_bad_device_type(bad, cls, fragment):
    # Regression: these raised a bare ValueError from the DeviceType enum.
    for lookup in (etptr.get_device_allocator, etptr.DeviceAllocatorRegistry.instance().get_allocator):
        with pytest.raises(cls) as info:
            lookup(bad)
        assert fragment in str(info.value)


def test_lookup_accepts_numpy_integers(host_alloc):
    assert etptr.get_device_allocator(np.int8(1)) is host_alloc


class _NoType(etptr.DeviceAllocator):
    pass


class _StrType(etptr.DeviceAllocator):
    device_type = "tpu"


class _BadCode(etptr.DeviceAllocator):
    device_type = 7


class _Raising(etptr.DeviceAllocator):
    @property
    def device_type(self):
        raise KeyError("no type")


@pytest.mark.parametrize("obj, cls, fragment", [
    (None, etptr.InvalidTypeError, "got NoneType"),
    (object(), etptr.InvalidTypeError, "got object"),
    (HostDeviceAllocator, etptr.InvalidTypeError, "got type"),  # the class, not an instance
    ("cuda", etptr.InvalidTypeError, "got str"),
    (_NoType(), etptr.InvalidArgumentError, "alloc.device_type could not be read"),
    (_StrType(), etptr.InvalidArgumentError, "alloc.device_type='tpu' is not a DeviceType"),
    (_BadCode(), etptr.InvalidArgumentError, "alloc.device_type=7 is not a DeviceType"),
    (_Raising(), etptr.InvalidArgumentError, "KeyError"),
    (HostDeviceAllocator(DeviceType.CPU), etptr.InvalidArgumentError, "CPU"),
])
def test_bad_registrations(obj, cls, fragment, empty_cuda_slot):
    with pytest.raises(cls) as info:
        etptr.register_device_allocator(obj)
    assert str(info.value).startswith("alloc")
    assert fragment in str(info.value)
    assert etptr.get_device_allocator(DeviceType.CUDA) is None
    assert etptr.get_device_allocator(DeviceType.CPU) is None


@pytest.mark.thread_unsafe
def test_registration_from_many_threads(empty_cuda_slot):
    n = 16
    allocs = [HostDeviceAllocator() for _ in range(n)]
    barrier = threading.Barrier(n)
    outcome = [None] * n
    seen = [None] * n

    def worker(i):
        barrier.wait()
        try:
            etptr.register_device_allocator(allocs[i])
            outcome[i] = "ok"
        except etptr.InvalidStateError:
            outcome[i] = "refused"
        seen[i] = etptr.get_device_allocator(DeviceType.CUDA)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert outcome.count("ok") == 1
    assert outcome.count("refused") == n - 1
    winner = allocs[outcome.index("ok")]
    assert etptr.get_device_allocator(DeviceType.CUDA) is winner
    assert all(s is winner for s in seen)  # every thread saw the one registration


@pytest.mark.thread_unsafe
def test_lookups_race_with_replacement(empty_cuda_slot):
    a, b = HostDeviceAllocator(), HostDeviceAllocator()
    stop = threading.Event()
    seen = set()

    def reader():
        while not stop.is_set():
            seen.add(id(etptr.get_device_allocator(DeviceType.CUDA)))

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for th in readers:
        th.start()
    for i in range(2000):
        _replace_allocator(DeviceType.CUDA, a if i % 2 else b)
    stop.set()
    for th in readers:
        th.join()
    assert seen <= {id(None), id(a), id(b)}


@pytest.mark.skipif(cuda_available(), reason="CuPy and a device are present")
def test_lazy_cuda_lookup_without_cupy_is_none():
    proc = run_isolated("""
        import sys
        import etptr
        assert "cupy" not in sys.modules
        print(etptr.get_device_allocator(etptr.DeviceType.CUDA))
        print(etptr.get_device_allocator(etptr.DeviceType.CUDA))
        try:
            etptr.empty([2], device="cuda")
        except etptr.NotFoundError as e:
            print("NotFound", "device=cuda:0" in str(e))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["None", "None", "NotFound True"]


# ------------------------------------------------------------------ etptr.testing

def test_host_device_allocator_counts_and_records():
    a = HostDeviceAllocator()
    assert a.device_type is DeviceType.CUDA
    p = a.allocate(100, 3, 64)
    assert p % 64 == 0
    assert (a.allocate_count, a.last_allocate_size, a.last_allocate_index,
            a.last_allocate_ptr) == (1, 100, 3, p)
    assert a.live_bytes == 100
    src = np.arange(100, dtype=np.uint8)
    a.copy_host_to_device(p, src.ctypes.data, 100, 3)
    assert (a.h2d_count, a.last_h2d_dst, a.last_h2d_src, a.last_h2d_size,
            a.last_h2d_index) == (1, p, src.ctypes.data, 100, 3)
    out = np.zeros(100, dtype=np.uint8)
    a.copy_device_to_host(out.ctypes.data, p, 100, 3)
    assert (a.d2h_count, a.last_d2h_dst, a.last_d2h_src, a.last_d2h_size,
            a.last_d2h_index) == (1, out.ctypes.data, p, 100, 3)
    np.testing.assert_array_equal(out, src)
    a.deallocate(p, 3)
    assert (a.deallocate_count, a.last_deallocate_ptr, a.last_deallocate_index) == (1, p, 3)
    assert a.live_bytes == 0


def test_host_device_allocator_checks_its_callers():
    a = HostDeviceAllocator()
    p = a.allocate(16, 0)
    with pytest.raises(etptr.InvalidArgumentError, match="dst="):
        a.copy_host_to_device(p + 8, np.zeros(16, np.uint8).ctypes.data, 16, 0)
    with pytest.raises(etptr.InvalidArgumentError, match="src="):
        a.copy_device_to_host(np.zeros(32, np.uint8).ctypes.data, p, 32, 0)
    with pytest.raises(etptr.InvalidArgumentError, match="was not allocated"):
        a.deallocate(p + 1, 0)
    with pytest.raises(etptr.InvalidArgumentError, match="alignment=3"):
        a.allocate(8, 0, 3)
    with pytest.raises(etptr.InvalidArgumentError, match="nbytes=-1"):
        a.allocate(-1, 0)
    a.deallocate(0, 0)  # a no-op, but counted
    assert a.deallocate_count == 2 and a.live_bytes == 16


def test_host_device_allocator_argument_types():
    with pytest.raises(etptr.InvalidTypeError, match="device_type must be"):
        HostDeviceAllocator("cuda")
    with pytest.raises(etptr.InvalidArgumentError, match="device_type=5"):
        HostDeviceAllocator(5)
    a = HostDeviceAllocator(np.int64(1))
    assert a.device_type is DeviceType.CUDA
    assert a.allocate(np.uint32(8), np.int8(0)) == a.last_allocate_ptr
    for args in (("8", 0), (8.5, 0), (8, 0, 8.0), (True, 0)):
        with pytest.raises(etptr.InvalidTypeError, match="is not an int"):
            a.allocate(*args)
    assert a.allocate_count == 1


def test_fail_after():
    a = HostDeviceAllocator()
    a.fail_after = 1
    a.allocate(8, 0)
    with pytest.raises(etptr.MemoryAllocationError) as info:
        a.allocate(8, 0)
    assert info.value.error is etptr.Error.MemoryAllocationFailed
    assert a.allocate_count == 1


def test_use_allocator_restores_after_an_exception(empty_cuda_slot):
    a = HostDeviceAllocator()
    with pytest.raises(KeyError):
        with use_allocator(a) as got:
            assert got is a
            assert etptr.get_device_allocator(DeviceType.CUDA) is a
            raise KeyError("inside")
    assert etptr.get_device_allocator(DeviceType.CUDA) is None


@pytest.mark.parametrize("bad", [None, object(), HostDeviceAllocator], ids=repr)
def test_use_allocator_needs_an_allocator(bad):
    # Regression: None gave a bare AttributeError.
    before = etptr.get_device_allocator(DeviceType.CUDA)
    with pytest.raises(etptr.InvalidTypeError) as info:
        with use_allocator(bad):
            pass
    assert str(info.value).startswith("alloc must be an etptr.DeviceAllocator, got ")
    assert etptr.get_device_allocator(DeviceType.CUDA) is before


def test_use_allocator_for_another_device_type_slot():
    a = HostDeviceAllocator(DeviceType.CPU)  # allowed through the test helper
    with use_allocator(a):
        assert etptr.get_device_allocator(DeviceType.CPU) is a
    assert etptr.get_device_allocator(DeviceType.CPU) is None


def test_python_subclass_drives_a_clone(py_alloc):
    t = etptr.make_tensor_ptr([3], [1.0, 2.0, 3.0])
    d = etptr.clone_tensor_ptr_to(t, "cuda:-1")
    assert d.device == etptr.Device("cuda:0")  # the base resolve_index maps -1 to 0
    assert py_alloc.named("allocate") == [(12, 0, 8)]
    py_alloc.resolved = 5
    d5 = etptr.clone_tensor_ptr_to(t, "cuda:-1")
    assert d5.device == etptr.Device("cuda:5")
    assert py_alloc.named("allocate")[-1] == (12, 5, 8)
    back = etptr.clone_tensor_ptr_to(d5, "cpu")
    assert py_alloc.named("d2h")[-1][1:] == (d5.data_ptr, 12, 5)
    assert back.numpy().tolist() == [1.0, 2.0, 3.0]
    del d, d5
    import gc
    gc.collect()
    assert py_alloc.live == {}
    assert sorted(c[1] for c in py_alloc.named("deallocate")) == [0, 5]


def test_an_address_off_the_alignment_asked_for_is_refused_and_given_back(py_alloc):
    py_alloc.allocate_result = lambda ptr: ptr + 1
    t = etptr.make_tensor_ptr([3], [1.0, 2.0, 3.0])
    with pytest.raises(etptr.MemoryAllocationError, match=r"PyAllocator\.allocate returned "
                                                           r"0x[0-9a-f]+ for 12 bytes.*alignment=8"):
        etptr.clone_tensor_ptr_to(t, "cuda")
    (freed,) = py_alloc.named("deallocate")
    assert freed[0] % 8 == 1               # the address it returned went back to it
    py_alloc.allocate_result = None
    assert etptr.clone_tensor_ptr_to(t, "cuda").nbytes == 12
    # a deallocate that raises then is named in the error, and chained to it
    py_alloc.allocate_result = lambda ptr: ptr + 1
    py_alloc.dealloc_error = RuntimeError("dealloc failed")
    with pytest.raises(etptr.MemoryAllocationError, match="alignment=8.*dealloc failed") as info:
        etptr.clone_tensor_ptr_to(t, "cuda")
    assert isinstance(info.value.__context__, RuntimeError)
    py_alloc.dealloc_error = py_alloc.allocate_result = None


@pytest.mark.cuda
def test_cuda_allocator_registers_itself_on_first_lookup():
    proc = run_isolated("""
        import etptr
        a = etptr.get_device_allocator(etptr.DeviceType.CUDA)
        print(type(a).__name__, a.device_type == etptr.DeviceType.CUDA,
              a is etptr.get_device_allocator(etptr.DeviceType.CUDA))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["CudaAllocator", "True", "True"]



def test_lookup_accepts_device_spellings(host_alloc):
    for spelling in ("cuda", "cuda:1", etptr.Device("cuda", 3), DeviceType.CUDA, 1):
        assert etptr.get_device_allocator(spelling) is host_alloc
        assert etptr.DeviceAllocatorRegistry.instance().get_allocator(spelling) is host_alloc
    assert etptr.get_device_allocator("cpu") is None


def test_first_lookups_from_many_threads_wait_for_the_builtin_registration(monkeypatch):
    # Regression: while one thread registered the built-in CUDA allocator, the other
    # first lookups saw "already tried" and got None (NotFoundError in a clone).
    import threading
    import time

    import etptr.cuda
    from etptr._core import _device_allocator as da

    installed = HostDeviceAllocator(DeviceType.CUDA)

    def slow_autoregister():
        time.sleep(0.2)
        etptr.register_device_allocator(installed)

    prev = da._replace_allocator(DeviceType.CUDA, None)
    monkeypatch.setattr(etptr.cuda, "_autoregister", slow_autoregister)
    da._forget_autoload(DeviceType.CUDA)
    seen = []
    try:
        threads = [threading.Thread(target=lambda: seen.append(
            etptr.get_device_allocator(DeviceType.CUDA))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        da._replace_allocator(DeviceType.CUDA, prev)
    assert len(seen) == 8
    assert all(a is installed for a in seen), seen


# ------------------------------------------------------------------ copy_file_to_device

def _file_of(tmp_path, n, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    return path, data


def _device_bytes(alloc, ptr, n):
    out = np.zeros(n, np.uint8)
    alloc.copy_device_to_host(out.ctypes.data, ptr, n, 0)
    return out


def test_the_generic_file_upload_moves_every_piece(tmp_path, host_alloc):
    n = (64 << 20) + 12345                          # past one staging group
    path, data = _file_of(tmp_path, n)
    dst = host_alloc.allocate(n + 8192, 0)
    fill = np.full(n + 8192, 0xEE, np.uint8)
    host_alloc.copy_host_to_device(dst, fill.ctypes.data, fill.nbytes, 0)
    pieces = [(0, 0, 100), (100, 4096, 0), (100, 4096, n - 100 - 7), (n - 7, n + 5000, 7)]
    seen, queued = [], []
    with open(path, "rb") as f:
        host_alloc.copy_file_to_device(dst, f.fileno(), pieces, 0, progress=seen.append,
                                       on_queued=lambda: queued.append(seen[:]))
    got = _device_bytes(host_alloc, dst, n + 8192)
    assert np.array_equal(got[:100], data[:100])
    assert np.array_equal(got[4096:4096 + n - 107], data[100:n - 7])
    assert np.array_equal(got[n + 5000:n + 5007], data[n - 7:])
    assert (got[100:4096] == 0xEE).all()            # the generic path writes only the pieces
    assert seen == sorted(seen) and seen[-1] == n and len(seen) == 2
    assert queued == [seen]                         # once, after every byte was read
    host_alloc.deallocate(dst, 0)


def test_the_generic_file_upload_reports_a_short_file_and_bad_arguments(tmp_path, host_alloc):
    path, _ = _file_of(tmp_path, 1000)
    dst = host_alloc.allocate(4096, 0)
    with open(path, "rb") as f:
        with pytest.raises(EOFError, match="file ended"):
            host_alloc.copy_file_to_device(dst, f.fileno(), [(900, 0, 200)], 0)
        with pytest.raises(etptr.InvalidArgumentError, match=r"pieces\[1\].dst_offset=10"):
            host_alloc.copy_file_to_device(dst, f.fileno(), [(0, 0, 64), (0, 10, 4)], 0)
        with pytest.raises(etptr.InvalidArgumentError, match=r"pieces\[0\]=.*expected"):
            host_alloc.copy_file_to_device(dst, f.fileno(), [(0, 0)], 0)
        with pytest.raises(etptr.InvalidArgumentError, match="progress"):
            host_alloc.copy_file_to_device(dst, f.fileno(), [(0, 0, 4)], 0, progress=5)
        with pytest.raises(etptr.InvalidArgumentError, match="dst must not be null"):
            host_alloc.copy_file_to_device(0, f.fileno(), [(0, 0, 4)], 0)
    with pytest.raises(OSError) as info:
        host_alloc.copy_file_to_device(dst, 1 << 29, [(0, 0, 4)], 0)
    assert info.value.errno == 9                     # EBADF
    host_alloc.deallocate(dst, 0)
    assert host_alloc.live_bytes == 0


def test_a_python_allocator_may_override_the_file_upload(tmp_path, empty_cuda_slot):
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({"a": etptr.full([300], 2.5), "b": etptr.ones([7], type="Int")}, path)
    calls = []

    class Own(HostDeviceAllocator):
        def copy_file_to_device(self, dst, fd, pieces, index, *, progress=None,
                                on_queued=None):
            calls.append(list(pieces))
            super().copy_file_to_device(dst, fd, pieces, index, progress=progress,
                                        on_queued=on_queued)

    with use_allocator(Own()):
        out = etptr.load_safetensors(path, "cuda", progress=False)
        assert etptr.clone_tensor_ptr_to_cpu(out["a"]).numpy().tolist() == [2.5] * 300
        assert etptr.clone_tensor_ptr_to_cpu(out["b"]).numpy().tolist() == [1] * 7
    assert len(calls) == 1                           # one call per file


def test_import_etptr_imports_no_cuda_module():
    proc = run_isolated("""
        import os, sys, tempfile
        import etptr
        assert not [m for m in sys.modules if m.startswith("etptr.cuda")], sys.modules
        from etptr.testing import HostDeviceAllocator, use_allocator
        path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        etptr.save_safetensors({"w": etptr.ones([4])}, path)
        with use_allocator(HostDeviceAllocator()):
            etptr.load_safetensors(path, "cuda")
            etptr.save_safetensors(etptr.load_safetensors(path, "cuda"), path)
        print(sorted(m for m in sys.modules if m.startswith("etptr.cuda")))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
