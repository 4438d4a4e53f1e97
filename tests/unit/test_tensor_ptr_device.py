"""etptr._core._tensor_ptr: clones to and from a device (HostDeviceAllocator) and interop."""
import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import Device, DeviceType
from etptr import ScalarType as ST
from etptr import TensorShapeDynamism as Dyn

from _helpers import run_isolated

BOUND = Dyn.DYNAMIC_BOUND


def mem(t, dtype):
    """A copy of the tensor's storage, read straight from data_ptr."""
    return np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=dtype)


def f32(n):
    return np.arange(n, dtype=np.float32)


# ================================================================== the overload set

# ================================================================== device clones

class TestCloneToDevice:
    def test_counters_and_arguments(self, host_alloc):
        cpu = etptr.make_tensor_ptr([2, 3], [float(i) for i in range(6)], dim_order=[1, 0],
                                    dynamism=Dyn.STATIC)
        d = etptr.clone_tensor_ptr_to(cpu, Device("cuda:3"))
        assert (host_alloc.allocate_count, host_alloc.h2d_count) == (1, 1)
        assert (host_alloc.last_allocate_size, host_alloc.last_allocate_index) == (24, 3)
        assert (host_alloc.last_h2d_dst, host_alloc.last_h2d_src, host_alloc.last_h2d_size,
                host_alloc.last_h2d_index) == (d.data_ptr, cpu.data_ptr, 24, 3)
        assert d.data_ptr == host_alloc.last_allocate_ptr
        assert (d.sizes, d.dim_order, d.strides, d.scalar_type, d.shape_dynamism, d.device) == \
            ((2, 3), (1, 0), (1, 2), ST.Float, Dyn.STATIC, Device("cuda:3"))
        assert host_alloc.live_bytes == 24
        back = etptr.clone_tensor_ptr_to(d, "cpu")
        assert (host_alloc.d2h_count, host_alloc.last_d2h_src, host_alloc.last_d2h_dst,
                host_alloc.last_d2h_size, host_alloc.last_d2h_index) == \
            (1, d.data_ptr, back.data_ptr, 24, 3)
        assert back.device == Device("cpu")
        np.testing.assert_array_equal(back.numpy(), cpu.numpy())
        del d
        gc.collect()
        assert (host_alloc.deallocate_count, host_alloc.last_deallocate_index, host_alloc.live_bytes) == (1, 3, 0)
        assert back.numpy()[1, 2] == 5.0  # the host copy outlives the device tensor

    def test_device_spellings(self, host_alloc):
        cpu = etptr.make_tensor_ptr([1.0])
        for spec, idx in (("cuda", 0), (DeviceType.CUDA, 0), ("cuda:-1", 0), (Device("cuda:9"), 9)):
            assert etptr.clone_tensor_ptr_to(cpu, spec).device == Device(DeviceType.CUDA, idx)

    def test_zero_size(self, host_alloc):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([0, 4], None), "cuda")
        assert d.sizes == (0, 4) and host_alloc.h2d_count == 0 and host_alloc.allocate_count == 1
        back = etptr.clone_tensor_ptr_to(d, "cpu")
        assert back.sizes == (0, 4) and host_alloc.d2h_count == 0

    def test_direction_errors(self, host_alloc):
        cpu = etptr.make_tensor_ptr([1.0])
        with pytest.raises(etptr.NotSupportedError) as info:
            etptr.clone_tensor_ptr_to(cpu, "cpu")
        assert "cpu -> cpu" in str(info.value) and "clone_tensor_ptr" in str(info.value)
        d = etptr.clone_tensor_ptr_to(cpu, "cuda:0")
        with pytest.raises(etptr.NotSupportedError) as info:
            etptr.clone_tensor_ptr_to(d, "cuda:1")
        assert "cuda:0 -> cuda:1" in str(info.value)
        with pytest.raises(etptr.NotSupportedError):
            etptr.clone_tensor_ptr_to_device(cpu, "cpu")
        with pytest.raises(etptr.NotSupportedError):
            etptr.clone_tensor_ptr_to_cpu(cpu)
        assert host_alloc.allocate_count == 1

    def test_null_source_checked_before_allocating(self, host_alloc):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([2], None), "cuda")
        assert str(info.value).startswith("tensor has null data")
        assert host_alloc.allocate_count == 0
        with pytest.raises(etptr.InvalidTypeError, match="tensor must be an etptr.TensorPtr"):
            etptr.clone_tensor_ptr_to(None, "cuda")
        with pytest.raises(etptr.InvalidTypeError, match="got 5"):
            etptr.clone_tensor_ptr_to(5, "cuda")

    def test_missing_allocator(self):
        from etptr._core._device_allocator import _replace_allocator
        prev = _replace_allocator(DeviceType.CUDA, None)
        try:
            with pytest.raises(etptr.NotFoundError) as info:
                etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda:2")
            assert str(info.value).startswith("device=cuda:2")
            labelled = etptr.make_tensor_ptr([1], 64, device="cuda")
            with pytest.raises(etptr.NotFoundError) as info:
                etptr.clone_tensor_ptr_to(labelled, "cpu")
            assert str(info.value).startswith("tensor.device=cuda:0")
        finally:
            _replace_allocator(DeviceType.CUDA, prev)

    def test_allocation_failure_propagates(self, host_alloc):
        host_alloc.fail_after = 0
        with pytest.raises(etptr.MemoryAllocationError):
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
        assert (host_alloc.h2d_count, host_alloc.live_bytes) == (0, 0)

    def test_failing_h2d_frees_the_allocation(self, py_alloc):
        boom = KeyError("h2d failed")
        py_alloc.h2d_error = boom
        with pytest.raises(KeyError) as info:
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda:1")
        assert info.value is boom  # propagates unchanged
        (_n, idx, _al), = py_alloc.named("allocate")
        (ptr, _src, _n, _idx), = py_alloc.named("h2d")
        assert idx == 1
        assert py_alloc.named("deallocate") == [(ptr, idx)]
        assert py_alloc.live == {}

    def test_failing_d2h_propagates_and_leaks_nothing(self, py_alloc):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda")
        py_alloc.d2h_error = OSError("d2h failed")
        with pytest.raises(OSError, match="d2h failed"):
            etptr.clone_tensor_ptr_to(d, "cpu")
        assert len(py_alloc.live) == 1
        del d
        gc.collect()
        assert py_alloc.live == {}

    @pytest.mark.parametrize("result, cls, fragment", [
        (lambda p: float(p), etptr.InvalidTypeError, "of type float; expected an int address"),
        (lambda p: None, etptr.InvalidTypeError, "returned None"),
        (lambda p: str(p), etptr.InvalidTypeError, "of type str"),
        (lambda p: True, etptr.InvalidTypeError, "of type bool"),
        (lambda p: 0, etptr.MemoryAllocationError, "returned a null address for 8 bytes"),
        (lambda p: -p, etptr.InvalidArgumentError, "not an address"),
        (lambda p: 1 << 64, etptr.InvalidArgumentError, "not an address"),
    ])
    def test_allocate_returning_garbage(self, py_alloc, result, cls, fragment):
        py_alloc.allocate_result = result
        with pytest.raises(cls) as info:
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda")
        assert str(info.value).startswith("PyAllocator.allocate returned")
        assert fragment in str(info.value)
        assert py_alloc.named("h2d") == []
        with pytest.raises(cls):
            etptr.empty([2], device="cuda")

    @pytest.mark.parametrize("resolved, cls, fragment", [
        (-1, etptr.InvalidArgumentError, "returned -1; expected a device index in 0..127"),
        (128, etptr.InvalidArgumentError, "returned 128"),
        (1 << 40, etptr.InvalidArgumentError, f"returned {1 << 40}"),
        ("0", etptr.InvalidTypeError, "returned '0' of type str"),
        (0.0, etptr.InvalidTypeError, "of type float"),
        (True, etptr.InvalidTypeError, "of type bool"),
    ])
    def test_resolve_index_returning_garbage(self, py_alloc, resolved, cls, fragment):
        # Regression: the result went unchecked into Device (an index of 500 was accepted;
        # 2**40 raised a bare OverflowError, "0" a bare TypeError).
        py_alloc.resolved = resolved
        for make in (lambda: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda:-1"),
                     lambda: etptr.empty([1], device="cuda:-1")):
            with pytest.raises(cls) as info:
                make()
            assert str(info.value).startswith("PyAllocator.resolve_index(-1) returned ")
            assert fragment in str(info.value)
        assert py_alloc.named("allocate") == [] and py_alloc.live == {}

    def test_deallocate_raising_at_teardown_warns(self, py_alloc):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
        py_alloc.dealloc_error = OSError("free failed")
        with pytest.warns(etptr.EtWarning, match=r"PyAllocator.deallocate raised during teardown: OSError\('free failed'\)"):
            del d
            gc.collect()
        assert len(py_alloc.named("deallocate")) == 1

    def test_allocate_host_hook(self, py_alloc):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0, 3.0]), "cuda:2")
        blocks = []

        def host(n):
            b = bytearray(n + 5)
            blocks.append(b)
            return b
        py_alloc.host_buffer = host
        back = etptr.clone_tensor_ptr_to_cpu(d)
        assert py_alloc.named("allocate_host") == [(12, 2)]
        assert back.numpy().tolist() == [1.0, 2.0, 3.0]
        assert bytes(blocks[0][:12]) == np.array([1.0, 2.0, 3.0], np.float32).tobytes()

    @pytest.mark.parametrize("host, cls, fragment", [
        (lambda n: bytes(n), etptr.InvalidArgumentError, "read-only or non-contiguous buffer (bytes)"),
        (lambda n: bytearray(n - 1), etptr.InvalidArgumentError, "a buffer of 11 bytes; 12 are needed"),
        (lambda n: 42, etptr.InvalidTypeError, "buffer protocol"),
    ])
    def test_allocate_host_bad_buffers(self, py_alloc, host, cls, fragment):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0, 3.0]), "cuda")
        py_alloc.host_buffer = host
        with pytest.raises(cls) as info:
            etptr.clone_tensor_ptr_to(d, "cpu")
        assert fragment in str(info.value)
        assert py_alloc.named("d2h") == []

    @pytest.mark.parametrize("host", [
        "np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (n,), (0,))",
        "np.zeros(n, np.uint8)[::-1]",
        "np.zeros(2 * n, np.uint8)[::2]",
    ], ids=["zero-stride", "reversed", "gapped"])
    def test_allocate_host_must_be_contiguous(self, host):
        # Regression: only the logical size of the buffer was checked, and the device->host
        # copy wrote nbytes contiguous bytes from its first element: a heap overflow.
        proc = run_isolated(f"""
            import numpy as np, etptr
            from etptr.testing import use_allocator
            from _helpers import PyAllocator
            alloc = PyAllocator()
            with use_allocator(alloc):
                d = etptr.clone_tensor_ptr_to(etptr.zeros([1 << 14]), "cuda")
                alloc.host_buffer = lambda n: {host}
                try:
                    etptr.clone_tensor_ptr_to(d, "cpu")
                except etptr.InvalidArgumentError as e:
                    print(type(e).__name__, str(e))
                print("d2h calls", len(alloc.named("d2h")))
        """)
        assert proc.returncode == 0, proc.stderr
        first, second = proc.stdout.splitlines()
        assert first.startswith("InvalidArgumentError PyAllocator.allocate_host returned a "
                                "read-only or non-contiguous buffer (ndarray)")
        assert second == "d2h calls 0"

    def test_labelled_memory_not_from_the_allocator(self, host_alloc):
        buf = f32(4)
        labelled = etptr.make_tensor_ptr([4], buf.ctypes.data, device="cuda")
        with pytest.raises(etptr.InvalidArgumentError, match="not inside a block"):
            etptr.clone_tensor_ptr_to(labelled, "cpu")

    def test_seed_names(self, host_alloc):
        cpu = etptr.make_tensor_ptr([2], [1, 2])
        d = etptr.clone_tensor_ptr_to_device(cpu)
        assert d.device == Device("cuda:0")
        d3 = etptr.clone_tensor_ptr_to_device(cpu, DeviceType.CUDA, device_index=3)
        assert d3.device == Device("cuda:3")
        with pytest.raises(etptr.InvalidArgumentError):
            etptr.clone_tensor_ptr_to_device(cpu, "cuda", device_index=200)
        with pytest.raises(etptr.InvalidTypeError):
            etptr.clone_tensor_ptr_to_device(cpu, "cuda", device_index="1")
        assert etptr.clone_tensor_ptr_to_cpu(d3).numpy().tolist() == [1, 2]

    def test_device_tensor_refuses_host_views(self, host_alloc):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
        for fn in (d.numpy, lambda: np.asarray(d)):
            with pytest.raises(etptr.NotSupportedError) as info:
                fn()
            assert "clone_tensor_ptr_to_cpu" in str(info.value)


# ================================================================== interop

class TestInterop:
    def test_numpy_view(self):
        t = etptr.make_tensor_ptr([2, 3], [float(i) for i in range(6)], dim_order=[1, 0])
        v = t.numpy()
        assert v.ctypes.data == t.data_ptr
        assert v.strides == (4, 8) and v.dtype == np.float32
        assert v.flags.writeable
        v[1, 2] = 50.0
        assert mem(t, np.float32)[5] == 50.0
        assert v.base is not None

    def test_numpy_of_null_data(self):
        assert etptr.make_tensor_ptr([0, 2], None).numpy().shape == (0, 2)
        with pytest.raises(etptr.InvalidArgumentError, match="null data"):
            etptr.make_tensor_ptr([2], None).numpy()

    def test_numpy_dtypes(self):
        bf = etptr.make_tensor_ptr([2], [1.5, -2.0], type=ST.BFloat16).numpy()
        assert bf.dtype == ml_dtypes.bfloat16 and bf.astype(np.float32).tolist() == [1.5, -2.0]
        with pytest.raises(etptr.NotSupportedError):
            etptr.make_tensor_ptr([2], b"ab", type=ST.QInt8).numpy()

    def test_array_protocol(self):
        t = etptr.make_tensor_ptr([2], [1.5, 2.5])
        a = np.asarray(t)
        assert a.ctypes.data == t.data_ptr
        assert np.asarray(t, dtype=np.float64).tolist() == [1.5, 2.5]
        c = np.array(t, copy=True)
        c[0] = 0
        assert t.numpy()[0] == 1.5
        with pytest.raises(ValueError):
            np.asarray(t, dtype=np.int32, copy=False)

    class _Legacy:
        """A producer that only speaks the pre-1.0 protocol (no max_version)."""

        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    class _Versioned(_Legacy):
        def __dlpack__(self, stream=None, **kw):
            return self.t.__dlpack__(stream=stream, max_version=(1, 1))

    @pytest.mark.parametrize("wrap", [lambda t: t, _Legacy, _Versioned], ids=["native", "legacy", "versioned"])
    def test_from_dlpack(self, wrap):
        t = etptr.make_tensor_ptr([2, 3], [float(i) for i in range(6)], dim_order=[1, 0])
        a = np.from_dlpack(wrap(t))
        assert a.ctypes.data == t.data_ptr
        assert a.shape == (2, 3) and a.strides == (4, 8)
        t.numpy()[0, 1] = 42.0  # numpy marks legacy imports read-only, so write through etptr
        assert a[0, 1] == 42.0
        del t
        gc.collect()
        assert a[0, 1] == 42.0  # the capsule keeps the tensor alive

    @pytest.mark.parametrize("stype, values", [
        (ST.Bool, [True, False]), (ST.UInt64, [1, 2]), (ST.Char, [-1, 3]), (ST.Half, [0.5, 2.0]),
        (ST.ComplexDouble, [1.0, 2.0]),
    ])
    def test_dlpack_types(self, stype, values):
        t = etptr.make_tensor_ptr(np.array(values, dtype=etptr.scalar_type_to_numpy(stype)))
        a = np.from_dlpack(t)
        assert a.dtype == etptr.scalar_type_to_numpy(stype)
        assert a.tolist() == t.numpy().tolist()

    def test_dlpack_read_only(self):
        a = np.arange(3.0)
        a.flags.writeable = False
        t = etptr.make_tensor_ptr(a)
        b = np.from_dlpack(self._Versioned(t))
        assert b.flags.writeable is False and b.tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="read-only"):
            t.__dlpack__()
        c = np.from_dlpack(t, copy=True)
        assert c.flags.writeable and c.ctypes.data != t.data_ptr

    def test_dlpack_device_and_errors(self):
        t = etptr.make_tensor_ptr([2], [1.0, 2.0])
        assert t.__dlpack_device__() == (1, 0)
        assert etptr.make_tensor_ptr([1], 64, device="cuda:3").__dlpack_device__() == (2, 3)
        with pytest.raises(BufferError, match="dl_device"):
            t.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="max_version"):
            t.__dlpack__(max_version="x")
        with pytest.raises(BufferError, match="no DLPack data type"):
            etptr.make_tensor_ptr([2], b"ab", type=ST.QInt8).__dlpack__()
        with pytest.raises(BufferError, match="null data"):
            etptr.make_tensor_ptr([2], None).__dlpack__()
        assert np.from_dlpack(etptr.make_tensor_ptr([0, 3], None)).shape == (0, 3)
        assert np.from_dlpack(etptr.make_tensor_ptr(2.5)).shape == ()

    def test_unconsumed_capsules_release_the_tensor(self):
        import sys
        t = etptr.make_tensor_ptr([2], [1.0, 2.0])
        before = sys.getrefcount(t)
        caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
        assert sys.getrefcount(t) == before + 2
        del caps
        gc.collect()
        assert sys.getrefcount(t) == before

    def test_cuda_array_interface(self):
        t = etptr.make_tensor_ptr([2, 3], 4096, dim_order=[1, 0], device="cuda:1", type=ST.Short)
        assert t.__cuda_array_interface__ == {
            "shape": (2, 3), "typestr": "<i2", "data": (4096, False), "strides": (2, 4),
            "version": 3, "stream": None}
        q = etptr.make_tensor_ptr([2], 4096, device="cuda", type=ST.QInt8)
        assert q.__cuda_array_interface__["typestr"] == "|V1"
        cpu = etptr.make_tensor_ptr([1.0])
        assert not hasattr(cpu, "__cuda_array_interface__")


def test_numpy_spellings_alias_executorchs_names():
    t = etptr.zeros([2, 3, 4], type="BFloat16")
    assert t.shape == t.sizes == (2, 3, 4) and t.ndim == t.dim() == 3 and len(t) == 2
    assert t.dtype == etptr.scalar_type_to_numpy(etptr.ScalarType.BFloat16)
    assert t.nbytes == 48
    s = etptr.scalar_tensor(2.0)
    assert s.shape == () and s.ndim == 0 and s.dtype == np.float32
    with pytest.raises(TypeError, match="len.. of a 0-dim TensorPtr"):
        len(s)
    assert etptr.empty([1], type=etptr.ScalarType.QInt8).dtype is None   # NumPy has none
