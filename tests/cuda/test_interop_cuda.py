"""DLPack and CUDA Array Interface with CuPy and torch on a CUDA device, both directions.

Skipped without a CUDA device; the CuPy tests skip without CuPy, the torch
tests without torch. Device->host checks go through the registered CUDA
allocator, or a small CuPy-backed one installed for the test.
"""
import gc
import sys

import numpy as np
import pytest

import etptr
from etptr import ScalarType
from etptr.testing import use_allocator

from _helpers import NUMPY_TYPES

pytestmark = pytest.mark.cuda



def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA driver missing or unusable
        pytest.skip(f"no usable CUDA device: {exc}")
    return cupy


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


class CupyTestAllocator(etptr.DeviceAllocator):
    """Device memory from CuPy's pool, synchronous copies through cudaMemcpy."""

    def __init__(self, cupy):
        super().__init__()
        self.cupy = cupy
        self.blocks = {}

    @property
    def device_type(self):
        return etptr.DeviceType.CUDA

    def resolve_index(self, index):
        return self.cupy.cuda.runtime.getDevice() if index == -1 else index

    def allocate(self, nbytes, index, alignment=8):
        with self.cupy.cuda.Device(index):
            mem = self.cupy.cuda.alloc(max(int(nbytes), 1))
        self.blocks[mem.ptr] = mem
        return mem.ptr

    def deallocate(self, ptr, index):
        self.blocks.pop(ptr, None)

    def copy_host_to_device(self, dst, src, nbytes, index):
        rt = self.cupy.cuda.runtime
        with self.cupy.cuda.Device(index):
            rt.memcpy(dst, src, nbytes, rt.memcpyHostToDevice)

    def copy_device_to_host(self, dst, src, nbytes, index):
        rt = self.cupy.cuda.runtime
        with self.cupy.cuda.Device(index):
            rt.memcpy(dst, src, nbytes, rt.memcpyDeviceToHost)


@pytest.fixture
def cupy():
    return _cupy()


@pytest.fixture
def torch():
    return _torch()


@pytest.fixture
def cuda_alloc():
    """The registered CUDA allocator, or a CuPy-backed one for the test."""
    found = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    if found is not None:
        yield found
        return
    alloc = CupyTestAllocator(_cupy())
    with use_allocator(alloc):
        yield alloc
    gc.collect()


def to_host(t):
    """A NumPy copy of a (device) TensorPtr, through clone_tensor_ptr_to."""
    return etptr.clone_tensor_ptr_to(t, "cpu").numpy() if not t.device.is_cpu() else t.numpy()


def values(dtype, shape=(3, 5)):
    n = int(np.prod(shape))
    if np.dtype(dtype) == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    a = (np.arange(n) % 11).astype(dtype).reshape(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * a
    return a


# ------------------------------------------------------------------ CuPy

@pytest.mark.parametrize("dtype,st", NUMPY_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_cupy_to_etptr_zero_copy(cupy, cuda_alloc, dtype, st):
    host = values(dtype)
    x = cupy.asarray(host)
    t = etptr.from_dlpack(x)
    assert t.scalar_type == st
    assert t.device == etptr.Device(etptr.DeviceType.CUDA, x.device.id)
    assert t.data_ptr == x.data.ptr
    assert t.sizes == x.shape and t.strides == tuple(s // x.itemsize for s in x.strides)
    np.testing.assert_array_equal(to_host(t), host)


@pytest.mark.parametrize("dtype,st", NUMPY_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_etptr_to_cupy_zero_copy(cupy, cuda_alloc, dtype, st):
    host = values(dtype)
    t = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(host), "cuda")
    y = cupy.from_dlpack(t)
    assert y.data.ptr == t.data_ptr and y.dtype == host.dtype
    np.testing.assert_array_equal(cupy.asnumpy(y), host)
    z = cupy.asarray(t)                    # through __cuda_array_interface__
    assert z.data.ptr == t.data_ptr
    np.testing.assert_array_equal(cupy.asnumpy(z), host)


def test_cupy_layouts(cupy, cuda_alloc):
    x = cupy.arange(24, dtype=cupy.float32).reshape(2, 3, 4)
    t = etptr.from_dlpack(x.transpose(2, 0, 1))
    assert t.dim_order == (1, 2, 0) and t.data_ptr == x.data.ptr
    np.testing.assert_array_equal(to_host(t), cupy.asnumpy(x.transpose(2, 0, 1)))
    f = cupy.asfortranarray(x)
    assert etptr.from_dlpack(f).dim_order == (2, 1, 0)
    e = etptr.from_dlpack(cupy.empty((0, 4), dtype=cupy.float64))
    assert e.numel() == 0 and e.sizes == (0, 4)


def test_cupy_odd_strides(cupy, cuda_alloc):
    x = cupy.arange(20, dtype=cupy.float32).reshape(4, 5)[:, ::2]
    with pytest.raises(etptr.InvalidArgumentError, match="contiguous"):
        etptr.from_dlpack(x)
    try:
        x.__dlpack__(max_version=(1, 1), copy=True)
    except TypeError:
        pytest.skip("this CuPy's __dlpack__ has no copy keyword")
    except BufferError:
        # this CuPy copies only to the CPU; etptr reports the producer's refusal
        with pytest.raises(etptr.NotSupportedError):
            etptr.from_dlpack(x, copy=True)
        return
    t = etptr.from_dlpack(x, copy=True)
    assert t.data_ptr != x.data.ptr
    np.testing.assert_array_equal(to_host(t), cupy.asnumpy(x))


def test_cupy_producer_released_once(cupy, cuda_alloc):
    x = cupy.arange(10, dtype=cupy.int32)
    before = sys.getrefcount(x)
    t = etptr.from_dlpack(x)
    assert sys.getrefcount(x) > before
    v = etptr.make_tensor_ptr(t, [5])
    del t
    gc.collect()
    assert sys.getrefcount(x) > before
    del v
    gc.collect()
    assert sys.getrefcount(x) == before


def test_cupy_to_cpu_device(cupy, cuda_alloc):
    x = cupy.arange(6, dtype=cupy.float64)
    t = etptr.from_dlpack(x, device="cpu")
    assert t.device == etptr.Device("cpu")
    np.testing.assert_array_equal(t.numpy(), np.arange(6.0))


def test_numpy_to_cuda_device(cupy, cuda_alloc):
    a = np.arange(6, dtype=np.float32)
    t = etptr.from_dlpack(a, device="cuda")
    assert t.device.type == etptr.DeviceType.CUDA
    np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(t)), a)


def test_cupy_cuda_array_interface(cupy):
    x = cupy.arange(12, dtype=cupy.float16).reshape(3, 4)
    t = etptr.from_cuda_array_interface(x)
    assert t.device == etptr.Device(etptr.DeviceType.CUDA, x.device.id)
    assert t.data_ptr == x.data.ptr and t.scalar_type == ScalarType.Half
    assert t.sizes == (3, 4) and t.strides == (4, 1)
    before = sys.getrefcount(x)
    del t
    gc.collect()
    assert sys.getrefcount(x) == before - 1          # the tensor held x itself
    with pytest.raises(etptr.InvalidArgumentError, match="contiguous"):
        etptr.from_cuda_array_interface(x[:, ::2])


def test_cuda_array_interface_finds_the_owning_device(cupy):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    with cupy.cuda.Device(1):
        x = cupy.arange(4, dtype=cupy.float32)
    with cupy.cuda.Device(0):
        # the current device is 0; the interface has no device field; etptr asks
        assert etptr.from_cuda_array_interface(x).device == etptr.Device("cuda:1")
        assert etptr.from_dlpack(x).device == etptr.Device("cuda:1")


def test_cuda_array_interface_pinned_host_memory(cupy):
    mem = cupy.cuda.alloc_pinned_memory(64)
    host = np.frombuffer(mem, dtype=np.float32, count=16)
    host[:] = np.arange(16)

    class Pinned:
        __cuda_array_interface__ = dict(shape=(16,), typestr="<f4", data=(mem.ptr, False),
                                        version=3, strides=None)

    t = etptr.from_cuda_array_interface(Pinned())
    assert t.device == etptr.Device("cpu")
    np.testing.assert_array_equal(t.numpy(), np.arange(16, dtype=np.float32))


# ------------------------------------------------------------------ torch

TORCH_TYPES = [
    ("uint8", ScalarType.Byte), ("int8", ScalarType.Char), ("int16", ScalarType.Short),
    ("int32", ScalarType.Int), ("int64", ScalarType.Long), ("float16", ScalarType.Half),
    ("float32", ScalarType.Float), ("float64", ScalarType.Double),
    ("complex64", ScalarType.ComplexFloat), ("complex128", ScalarType.ComplexDouble),
    ("bool", ScalarType.Bool), ("bfloat16", ScalarType.BFloat16),
    ("uint16", ScalarType.UInt16), ("uint32", ScalarType.UInt32), ("uint64", ScalarType.UInt64),
    ("float8_e5m2", ScalarType.Float8_e5m2), ("float8_e4m3fn", ScalarType.Float8_e4m3fn),
    ("float8_e5m2fnuz", ScalarType.Float8_e5m2fnuz),
    ("float8_e4m3fnuz", ScalarType.Float8_e4m3fnuz),
]


def torch_values(torch, name, device):
    dt = getattr(torch, name, None)
    if dt is None:
        pytest.skip(f"this torch has no {name}")
    base = torch.arange(15, device=device).reshape(3, 5) % 7
    if name == "bool":
        return base == 0
    try:
        return base.to(torch.float32).to(dt)
    except (RuntimeError, TypeError) as exc:
        pytest.skip(f"torch cannot make {name} here: {exc}")


def raw_bytes(torch, x):
    """The bytes of a (CPU or CUDA) torch tensor, as a NumPy uint8 array."""
    return x.contiguous().cpu().view(torch.uint8).numpy()


@pytest.mark.parametrize("name,st", TORCH_TYPES, ids=[n for n, _ in TORCH_TYPES])
def test_torch_to_etptr_zero_copy(torch, cuda_alloc, name, st):
    x = torch_values(torch, name, "cuda")
    try:
        x.__dlpack__()
    except (RuntimeError, TypeError, BufferError) as exc:
        pytest.skip(f"torch does not export {name} through DLPack: {exc}")
    t = etptr.from_dlpack(x)
    assert t.scalar_type == st
    assert t.device == etptr.Device(etptr.DeviceType.CUDA, x.device.index)
    assert t.data_ptr == x.data_ptr()
    assert t.sizes == tuple(x.shape) and t.strides == tuple(x.stride())
    host = etptr.clone_tensor_ptr_to(t, "cpu")
    np.testing.assert_array_equal(host.numpy().view(np.uint8).reshape(-1),
                                  raw_bytes(torch, x).reshape(-1))


@pytest.mark.parametrize("name,st", TORCH_TYPES, ids=[n for n, _ in TORCH_TYPES])
def test_etptr_to_torch_zero_copy(torch, cuda_alloc, name, st):
    x = torch_values(torch, name, "cpu")
    try:
        x.__dlpack__()
        torch.from_dlpack(etptr.make_tensor_ptr([1], bytes(etptr.element_size(st)), type=st))
    except (RuntimeError, TypeError, BufferError) as exc:
        pytest.skip(f"torch does not exchange {name} through DLPack: {exc}")
    src = etptr.from_dlpack(x)                          # CPU, zero-copy
    assert src.data_ptr == x.data_ptr()
    t = etptr.clone_tensor_ptr_to(src, "cuda")
    y = torch.from_dlpack(t)
    assert y.device.type == "cuda" and y.data_ptr() == t.data_ptr
    assert y.dtype == x.dtype and tuple(y.shape) == tuple(x.shape)
    np.testing.assert_array_equal(raw_bytes(torch, y), raw_bytes(torch, x))


def test_torch_layouts_and_strides(torch, cuda_alloc):
    x = torch.arange(24, device="cuda", dtype=torch.float32).reshape(2, 3, 4)
    t = etptr.from_dlpack(x.permute(2, 0, 1))
    assert t.dim_order == (1, 2, 0) and t.data_ptr == x.data_ptr()
    with pytest.raises(etptr.InvalidArgumentError, match="contiguous"):
        etptr.from_dlpack(x[:, :, ::2])
    with pytest.raises(etptr.InvalidArgumentError, match="contiguous"):
        etptr.from_dlpack(torch.zeros(4, device="cuda").expand(3, 4))
    # byte offsets: a slice that starts inside the storage
    s = x[1]
    t = etptr.from_dlpack(s)
    assert t.data_ptr == s.data_ptr() == x.data_ptr() + 12 * 4
    np.testing.assert_array_equal(to_host(t), s.cpu().numpy())


def test_torch_memory_released_once(torch, cuda_alloc):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    x = torch.ones(1 << 20, device="cuda")
    t = etptr.from_dlpack(x)
    del x
    gc.collect()
    assert torch.cuda.memory_allocated() >= base + (4 << 20)     # held through the capsule
    del t
    gc.collect()
    assert torch.cuda.memory_allocated() == base


def test_torch_cuda_array_interface(torch):
    x = torch.arange(12, device="cuda", dtype=torch.int32).reshape(3, 4)
    try:
        t = etptr.from_cuda_array_interface(x)
    except etptr.NotSupportedError as exc:
        pytest.skip(f"needs CuPy to find the device: {exc}")
    assert t.device == etptr.Device(etptr.DeviceType.CUDA, x.device.index)
    assert t.data_ptr == x.data_ptr() and t.scalar_type == ScalarType.Int
    assert t.strides == (4, 1)


def test_torch_cpu_round_trip(torch):
    x = torch.arange(6, dtype=torch.float64)
    t = etptr.from_dlpack(x)
    assert t.device == etptr.Device("cpu") and t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    y[0] = 42.0
    assert x[0].item() == 42.0
