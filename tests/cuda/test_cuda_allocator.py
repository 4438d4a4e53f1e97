"""CudaAllocator over CuPy: allocation, round trips, makers, interop, errors."""
import ctypes
import gc

import numpy as np
import pytest

import etptr
from etptr import DeviceType, ScalarType

CUDA = DeviceType.CUDA


def _bytes(t):
    return ctypes.string_at(t.data_ptr, t.nbytes) if t.nbytes else b""


def _random_bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# ------------------------------------------------------------------ registration

def test_registered_allocator_is_cuda_allocator(alloc):
    from etptr.cuda import CudaAllocator
    assert isinstance(alloc, CudaAllocator)
    assert alloc.device_type == CUDA
    assert etptr.get_device_allocator(CUDA) is alloc


def test_autoregister_keeps_an_existing_allocator(alloc):
    from etptr.cuda import _autoregister
    _autoregister()
    assert etptr.get_device_allocator(CUDA) is alloc


# ------------------------------------------------------------------ allocate / deallocate

def test_allocate_deallocate_accounts_in_cupy_pool(alloc, device_used):
    base = device_used()
    ptr = alloc.allocate(1 << 20, 0)
    assert ptr != 0 and ptr % 256 == 0
    assert device_used() >= base + (1 << 20)
    alloc.deallocate(ptr, 0)
    assert device_used() == base


def test_allocate_zero_bytes_is_null(alloc):
    assert alloc.allocate(0, 0) == 0
    alloc.deallocate(0, 0)


@pytest.mark.parametrize("alignment", [1, 2, 8, 64, 256])
def test_allocate_alignment_up_to_256(alloc, alignment):
    ptr = alloc.allocate(100, 0, alignment)
    try:
        assert ptr % alignment == 0
    finally:
        alloc.deallocate(ptr, 0)


@pytest.mark.parametrize("alignment", [0, 3, 24, 100])
def test_allocate_alignment_not_power_of_two(alloc, alignment):
    with pytest.raises(etptr.InvalidArgumentError, match=f"alignment={alignment}"):
        alloc.allocate(16, 0, alignment)


def test_allocate_alignment_past_cudamalloc_guarantee(alloc):
    with pytest.raises(etptr.NotSupportedError, match="alignment=512"):
        alloc.allocate(16, 0, 512)


def test_bad_device_index(alloc, ndev):
    with pytest.raises(etptr.InvalidArgumentError, match="index=-2"):
        alloc.allocate(16, -2)
    with pytest.raises(etptr.InvalidArgumentError, match=f"index={ndev}"):
        alloc.allocate(16, ndev)
    with pytest.raises(etptr.InvalidTypeError):
        alloc.allocate(16, "0")


def test_deallocate_unknown_pointer(alloc):
    ptr = alloc.allocate(64, 0)
    alloc.deallocate(ptr, 0)
    with pytest.raises(etptr.InvalidArgumentError, match=hex(ptr)):
        alloc.deallocate(ptr, 0)
    with pytest.raises(etptr.InvalidArgumentError):
        alloc.deallocate(12345, 0)


def test_allocation_larger_than_device(alloc, device_used):
    base = device_used()
    with pytest.raises(etptr.MemoryAllocationError, match=r"nbytes=1125899906842624 on cuda:0"):
        alloc.allocate(1 << 50, 0)
    assert device_used() == base
    with pytest.raises(etptr.MemoryAllocationError):
        etptr.empty([1 << 40, 1024], ScalarType.Byte, device="cuda")
    assert device_used() == base


def test_resolve_index_current_device(alloc, cp):
    assert alloc.resolve_index(-1) == cp.cuda.runtime.getDevice()
    assert alloc.resolve_index(0) == 0
    ptr = alloc.allocate(32, -1)
    alloc.deallocate(ptr, -1)


# ------------------------------------------------------------------ round trips

def _scalar_types():
    return [st for st in ScalarType if etptr.element_size(st) > 0]


@pytest.mark.parametrize("st", _scalar_types(), ids=lambda st: st.name)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
def test_round_trip_every_scalar_type_bit_exact(st, pinned):
    sizes = [3, 5]
    payload = _random_bytes(15 * etptr.element_size(st), seed=int(st))
    t = etptr.make_tensor_ptr(sizes, payload, type=st)
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    assert d.device == etptr.Device(CUDA, 0)
    assert d.scalar_type == st and d.sizes == (3, 5) and d.strides == (5, 1)
    h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
    assert h.device.is_cpu()
    assert h.scalar_type == st and h.sizes == t.sizes and h.dim_order == t.dim_order
    assert _bytes(h) == payload


@pytest.mark.parametrize("np_dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_round_trip_ml_dtypes_arrays(np_dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = np.dtype(getattr(ml_dtypes, np_dtype))
    a = np.random.default_rng(1).standard_normal((4, 7)).astype(dt)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert h.numpy().dtype == dt
    assert h.numpy().tobytes() == a.tobytes()


def test_zero_dim_round_trip():
    t = etptr.make_tensor_ptr(3.25)
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    assert d.sizes == () and d.numel() == 1 and d.data_ptr != 0
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert h.sizes == () and float(h.numpy()) == 3.25


@pytest.mark.parametrize("sizes", [[0], [4, 0, 3], [0, 0]])
def test_empty_tensor_round_trip(sizes):
    t = etptr.empty(sizes)
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    assert d.sizes == tuple(sizes) and d.nbytes == 0 and d.device.type == CUDA
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert h.sizes == tuple(sizes) and h.numpy().shape == tuple(sizes)


def test_non_default_dim_order_round_trip():
    payload = _random_bytes(2 * 3 * 4 * 4, seed=7)
    t = etptr.make_tensor_ptr([2, 3, 4], payload, dim_order=[2, 0, 1], type=ScalarType.Float)
    assert t.strides == (3, 1, 6)
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    assert d.dim_order == (2, 0, 1) and d.strides == (3, 1, 6)
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert h.dim_order == (2, 0, 1) and h.strides == (3, 1, 6)
    assert _bytes(h) == payload


def test_dynamism_kept():
    t = etptr.make_tensor_ptr([1.0, 2.0], dynamism=etptr.TensorShapeDynamism.DYNAMIC_UNBOUND)
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    assert d.shape_dynamism == etptr.TensorShapeDynamism.DYNAMIC_UNBOUND


@pytest.mark.parametrize("spec", [etptr.Device(CUDA, -1), "cuda:0", "cuda", CUDA])
def test_device_index_minus_one_and_zero(spec, cp):
    t = etptr.make_tensor_ptr([1, 2, 3])
    d = etptr.clone_tensor_ptr_to(t, spec)
    assert d.device.index == cp.cuda.runtime.getDevice() == 0
    h = etptr.clone_tensor_ptr_to_cpu(d)
    assert list(h.numpy()) == [1, 2, 3]


def test_clone_to_device_seed_name():
    t = etptr.make_tensor_ptr([5.0])
    d = etptr.clone_tensor_ptr_to_device(t, "cuda", device_index=0)
    assert d.device == etptr.Device(CUDA, 0)


# ------------------------------------------------------------------ makers

@pytest.mark.parametrize("make, expect", [
    (lambda: etptr.full([3, 2], 2.5, device="cuda"), np.full((3, 2), 2.5, np.float32)),
    (lambda: etptr.zeros([4], ScalarType.Int, device="cuda"), np.zeros(4, np.int32)),
    (lambda: etptr.ones([2, 2], ScalarType.Double, device="cuda"), np.ones((2, 2))),
    (lambda: etptr.scalar_tensor(7, ScalarType.Long, device="cuda"), np.array(7, np.int64)),
])
def test_makers_on_cuda(make, expect):
    d = make()
    assert d.device.type == CUDA
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    np.testing.assert_array_equal(h.numpy(), expect)


def test_empty_and_random_makers_on_cuda():
    e = etptr.empty([16, 16], device="cuda")
    assert e.device == etptr.Device(CUDA, 0) and e.data_ptr != 0
    r = etptr.rand([1000], device="cuda")
    v = etptr.clone_tensor_ptr_to(r, "cpu").numpy()
    assert ((v >= 0) & (v < 1)).all() and v.std() > 0
    i = etptr.randint(3, 9, [500], device="cuda")
    v = etptr.clone_tensor_ptr_to(i, "cpu").numpy()
    assert v.min() >= 3 and v.max() < 9
    like = etptr.zeros_like(r)
    assert like.device.type == CUDA


def test_device_tensor_numpy_names_clone():
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
    with pytest.raises(etptr.NotSupportedError, match="clone_tensor_ptr_to_cpu"):
        d.numpy()


# ------------------------------------------------------------------ interop with CuPy

def test_cuda_array_interface_zero_copy(real_cupy):
    cupy = real_cupy
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    c = cupy.asarray(d)
    assert c.data.ptr == d.data_ptr
    assert c.shape == (4, 6) and c.dtype == np.float32
    np.testing.assert_array_equal(c.get(), a)
    c[0, 0] = 100          # same memory
    assert etptr.clone_tensor_ptr_to(d, "cpu").numpy()[0, 0] == 100


def test_dlpack_zero_copy(real_cupy):
    cupy = real_cupy
    a = np.arange(10, dtype=np.int64)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    assert d.__dlpack_device__() == (2, 0)
    c = cupy.from_dlpack(d)
    assert c.data.ptr == d.data_ptr
    np.testing.assert_array_equal(c.get(), a)
    del d
    gc.collect()
    np.testing.assert_array_equal(c.get(), a)   # the capsule keeps the memory alive


def test_dlpack_non_default_dim_order(real_cupy):
    cupy = real_cupy
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = etptr.make_tensor_ptr(np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0))
    d = etptr.clone_tensor_ptr_to(t, "cuda")
    c = cupy.from_dlpack(d)
    np.testing.assert_array_equal(c.get(), a)


def test_cuda_tensor_computes_with_cupy(real_cupy):
    cupy = real_cupy
    d = etptr.full([1000], 3.0, device="cuda")
    assert float(cupy.asarray(d).sum()) == 3000.0


# ------------------------------------------------------------------ memory returns

def test_device_memory_returns_to_baseline(device_used):
    base = device_used()
    src = etptr.make_tensor_ptr(np.ones((256, 1024), np.float32))
    kept = [etptr.clone_tensor_ptr_to(src, "cuda") for _ in range(10)]
    assert device_used() >= base + 10 * src.nbytes
    back = [etptr.clone_tensor_ptr_to(d, "cpu") for d in kept]
    del kept, back
    assert device_used() == base


def test_views_keep_device_memory_alive(device_used):
    base = device_used()
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.arange(12.0)), "cuda")
    v = etptr.make_tensor_ptr(d, [3, 4])
    del d
    gc.collect()
    assert device_used() > base
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to(v, "cpu").numpy().ravel(),
                                  np.arange(12.0))
    del v
    assert device_used() == base
