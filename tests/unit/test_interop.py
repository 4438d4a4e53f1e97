"""DLPack and CUDA Array Interface import (etptr.from_dlpack, etptr.from_cuda_array_interface).

Nothing here needs a GPU: device paths use etptr.testing.HostDeviceAllocator,
and the DLPack edges real producers never show (byte offsets, NULL strides,
unknown type codes, DLPack 2.x) come from a ctypes-built producer.
"""
import gc
import sys
import textwrap
import types
import weakref

import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import ScalarType
from etptr.testing import HostDeviceAllocator, use_allocator

from _dlpack_ctypes import HandMadeProducer, host_buffer
from _helpers import NUMPY_TYPES

# NUMPY_TYPES (from _helpers): every scalar type NumPy has that ExecuTorch has too.
# ...and the ones ml_dtypes adds.
ML_TYPES = [
    (ml_dtypes.bfloat16, ScalarType.BFloat16),
    (ml_dtypes.float8_e5m2, ScalarType.Float8_e5m2),
    (ml_dtypes.float8_e4m3fn, ScalarType.Float8_e4m3fn),
    (ml_dtypes.float8_e5m2fnuz, ScalarType.Float8_e5m2fnuz),
    (ml_dtypes.float8_e4m3fnuz, ScalarType.Float8_e4m3fnuz),
]


def sample(dtype, shape=(3, 4)):
    n = int(np.prod(shape))
    if np.dtype(dtype) == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    vals = (np.arange(n) % 7 - 2).astype(np.float64) * 0.5
    if np.dtype(dtype).kind in "ui":
        vals = np.arange(n) % 100
    a = vals.astype(dtype).reshape(shape)
    if np.dtype(dtype).kind == "c":
        a = a + (1j * vals.reshape(shape)).astype(dtype)
    return a


class Wrap:
    """A producer whose __dlpack__ hands out another object's capsule."""

    def __init__(self, inner, device=None, dlpack=None):
        self.inner = inner
        self.device = device
        self.dlpack = dlpack
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if self.dlpack is not None:
            return self.dlpack(**kw)
        return self.inner.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device if self.device is not None else self.inner.__dlpack_device__()


class LegacyProducer:
    """A pre-1.0 producer: __dlpack__ takes only ``stream``."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


# ------------------------------------------------------------------ NumPy round trips

@pytest.mark.parametrize("dtype,st", NUMPY_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_numpy_to_etptr_zero_copy(dtype, st):
    a = sample(dtype)
    t = etptr.from_dlpack(a)
    assert t.scalar_type == st
    assert t.sizes == (3, 4) and t.strides == (4, 1) and t.dim_order == (0, 1)
    assert t.data_ptr == a.ctypes.data
    assert t.device == etptr.Device("cpu")
    assert not t.readonly
    np.testing.assert_array_equal(t.numpy(), a)
    # the same memory: a write through the tensor shows in the array
    t.numpy()[0, 0] = a[1, 1]
    assert a[0, 0] == a[1, 1]


@pytest.mark.parametrize("dtype,st", NUMPY_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_etptr_to_numpy_zero_copy(dtype, st):
    a = sample(dtype)
    t = etptr.make_tensor_ptr(a.copy())
    b = np.from_dlpack(t)
    assert b.dtype == np.dtype(dtype)
    assert b.ctypes.data == t.data_ptr
    np.testing.assert_array_equal(b, a)
    # and back again: still the same memory
    t2 = etptr.from_dlpack(b)
    assert t2.data_ptr == t.data_ptr and t2.scalar_type == st


@pytest.mark.parametrize("dtype,st", ML_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_ml_dtypes_round_trip_through_etptr_capsules(dtype, st):
    # NumPy's own DLPack refused ml_dtypes arrays before 2.4, so these go
    # ndarray -> make_tensor_ptr -> DLPack capsule -> from_dlpack -> numpy().
    a = sample(dtype)
    src = etptr.make_tensor_ptr(a)
    t = etptr.from_dlpack(src)
    assert t.scalar_type == st
    assert t.data_ptr == a.ctypes.data
    out = t.numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.view(np.uint8), a.view(np.uint8))
    # NumPy before 2.4 refuses to export them (etptr reports that as NotSupportedError);
    # NumPy 2.4 exports them, and the tensor aliases the array with the same type
    try:
        direct = etptr.from_dlpack(a)
    except etptr.NotSupportedError as exc:
        assert "__dlpack__" in str(exc)
    else:
        assert direct.scalar_type == st and direct.data_ptr == a.ctypes.data


@pytest.mark.parametrize("dtype,st", ML_TYPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_ml_dtypes_codes_through_hand_made_capsule(dtype, st):
    # DLPack codes written by hand (kDLBfloat=4, kDLFloat8_*=10..13) map to the ScalarTypes.
    code = {ScalarType.BFloat16: 4, ScalarType.Float8_e4m3fn: 10, ScalarType.Float8_e4m3fnuz: 11,
            ScalarType.Float8_e5m2: 12, ScalarType.Float8_e5m2fnuz: 13}[st]
    a = sample(dtype, (5,))
    p = HandMadeProducer(a, [5], code=code, bits=8 * a.itemsize)
    t = etptr.from_dlpack(p)
    assert t.scalar_type == st
    np.testing.assert_array_equal(t.numpy().view(np.uint8), a.view(np.uint8))
    del t
    assert p.settle() == 1


def test_complex_half_round_trip():
    raw = np.arange(8, dtype=np.uint8)
    src = etptr.make_tensor_ptr([2], raw, type=ScalarType.ComplexHalf)
    t = etptr.from_dlpack(src)
    assert t.scalar_type == ScalarType.ComplexHalf and t.data_ptr == raw.ctypes.data


@pytest.mark.parametrize("make", [
    lambda: np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)),
    lambda: np.arange(24.0).reshape(2, 3, 4).transpose(2, 0, 1),
    lambda: np.arange(6.0).reshape(1, 6, 1),
    lambda: np.array(3.5),
    lambda: np.zeros((0, 3)),
    lambda: np.zeros((4, 0, 3))[::2, :, ::-1],
    lambda: np.arange(12.0).reshape(3, 4)[1:],
], ids=["fortran", "permuted", "size1", "0dim", "empty", "empty-odd-strides", "offset-rows"])
def test_numpy_layouts(make):
    a = make()
    t = etptr.from_dlpack(a)
    assert t.sizes == a.shape
    if a.size:
        assert t.data_ptr == a.ctypes.data
        assert t.strides == tuple(s // a.itemsize for s in a.strides) or 1 in a.shape
        np.testing.assert_array_equal(t.numpy(), a)
    else:
        assert t.numel() == 0
        assert t.dim_order == tuple(range(a.ndim))
    if a.ndim == 0:
        assert t.shape_dynamism == etptr.TensorShapeDynamism.STATIC


@pytest.mark.parametrize("make", [
    lambda: np.arange(12.0)[::2],
    lambda: np.arange(12.0).reshape(3, 4)[:, ::-1],
    lambda: np.broadcast_to(np.arange(4.0), (3, 4)),
    lambda: np.arange(24.0).reshape(4, 6)[:, 1:4],
], ids=["gapped", "negative", "broadcast", "sliced-columns"])
def test_odd_strides_raise_or_copy(make):
    a = make()
    with pytest.raises(etptr.InvalidArgumentError, match="copy=True"):
        etptr.from_dlpack(a)
    t = etptr.from_dlpack(a, copy=True)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.data_ptr != a.ctypes.data
    assert not t.readonly


@pytest.mark.parametrize("make", [
    lambda: np.arange(12.0)[::2],
    lambda: np.arange(12.0).reshape(3, 4)[:, ::-1],
    lambda: np.arange(24.0).reshape(2, 3, 4).transpose(1, 2, 0)[:, ::-2],
], ids=["gapped", "negative", "3d"])
def test_etptr_strided_copy_for_legacy_producer(make):
    # a legacy producer cannot copy: etptr copies into C-contiguous memory itself
    a = make()
    p = LegacyProducer(a)
    refs = sys.getrefcount(a)
    t = etptr.from_dlpack(p, copy=True)
    assert p.calls == 1          # only the keyword-free (legacy) request got through
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.strides == tuple(int(np.prod(a.shape[i + 1:])) for i in range(a.ndim))
    assert t.data_ptr != a.ctypes.data
    # the producer's deleter already ran: its capsule no longer holds a
    assert sys.getrefcount(a) == refs


def test_copy_true_gives_a_private_copy():
    a = np.arange(6, dtype=np.int32)
    t = etptr.from_dlpack(a, copy=True)
    assert t.data_ptr != a.ctypes.data
    a[0] = 99
    assert t.numpy()[0] == 0


def test_copy_true_legacy_producer_copies_in_etptr():
    a = np.arange(6, dtype=np.int32)
    t = etptr.from_dlpack(LegacyProducer(a), copy=True)
    assert t.data_ptr != a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a)


def test_copy_false_is_zero_copy():
    a = np.arange(6, dtype=np.int32)
    assert etptr.from_dlpack(a, copy=False).data_ptr == a.ctypes.data


def test_copy_must_be_bool():
    with pytest.raises(etptr.InvalidTypeError, match="copy"):
        etptr.from_dlpack(np.zeros(3), copy=1)


def test_read_only_array_gives_read_only_tensor():
    a = np.arange(6.0)
    a.flags.writeable = False
    t = etptr.from_dlpack(a)
    assert t.readonly
    assert t.data_ptr == a.ctypes.data
    view = t.numpy()
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1.0
    # a copy is writable
    c = etptr.from_dlpack(a, copy=True)
    assert not c.readonly and c.numpy().flags.writeable


def test_read_only_legacy_producer_refuses():
    # a legacy capsule cannot say read-only, so NumPy refuses it; etptr reports that
    a = np.arange(6.0)
    a.flags.writeable = False
    with pytest.raises(etptr.NotSupportedError, match="readonly"):
        etptr.from_dlpack(LegacyProducer(a))


# ------------------------------------------------------------------ lifetimes and deleters

def test_producer_kept_alive_and_released_once():
    a = np.arange(10.0)
    before = sys.getrefcount(a)
    t = etptr.from_dlpack(a)
    assert sys.getrefcount(a) == before + 1       # NumPy's managed tensor holds a
    v = etptr.make_tensor_ptr(t, [5])             # a view keeps the import alive
    del t
    gc.collect()
    assert sys.getrefcount(a) == before + 1
    del v
    gc.collect()
    assert sys.getrefcount(a) == before           # deleter ran once, not twice


def test_deleter_exactly_once_through_etptr_export():
    calls = []
    raw = np.arange(4, dtype=np.float32)
    src = etptr.make_tensor_ptr([4], raw.ctypes.data, deleter=calls.append)
    t = etptr.from_dlpack(src)
    del src
    gc.collect()
    assert calls == []
    np.testing.assert_array_equal(t.numpy(), raw)
    del t
    gc.collect()
    assert calls == [raw.ctypes.data]


def test_hand_made_deleter_once_on_success():
    a = host_buffer(range(6))
    p = HandMadeProducer(a, [2, 3])
    t = etptr.from_dlpack(p)
    assert p.requests == [{"max_version": (1, 1)}]
    assert p.deleted == 0
    del t
    gc.collect()
    assert p.settle() == 1


def test_capsule_consumed_once():
    a = np.arange(3.0)
    cap = a.__dlpack__(max_version=(1, 1))
    t = etptr.from_dlpack(cap)
    with pytest.raises(etptr.InvalidArgumentError, match="consumed"):
        etptr.from_dlpack(cap)
    with pytest.raises(etptr.InvalidArgumentError, match="consumed"):
        etptr.from_dlpack(Wrap(a, dlpack=lambda **kw: cap))
    np.testing.assert_array_equal(t.numpy(), a)


def test_legacy_capsule_accepted_directly():
    a = np.arange(3.0)
    t = etptr.from_dlpack(a.__dlpack__())
    assert t.data_ptr == a.ctypes.data


def test_legacy_fallback_on_type_error():
    a = np.arange(5, dtype=np.int16)
    p = LegacyProducer(a)
    t = etptr.from_dlpack(p)
    assert p.calls == 1          # the versioned request failed on its keyword
    assert t.data_ptr == a.ctypes.data and t.scalar_type == ScalarType.Short


def test_hand_made_legacy_producer():
    a = host_buffer(range(4))
    p = HandMadeProducer(a, [4], legacy=True)
    t = etptr.from_dlpack(p)
    assert p.requests == [{"max_version": (1, 1)}, {}]
    np.testing.assert_array_equal(t.numpy(), a)
    del t
    assert p.settle() == 1


# ------------------------------------------------------------------ DLPack edges (hand-made)

def test_byte_offset_honoured():
    a = host_buffer(range(10))
    p = HandMadeProducer(a, [4], byte_offset=3 * 4)
    t = etptr.from_dlpack(p)
    assert t.data_ptr == a.ctypes.data + 12
    np.testing.assert_array_equal(t.numpy(), [3, 4, 5, 6])


def test_byte_offset_with_strided_copy():
    a = host_buffer(range(12))
    p = HandMadeProducer(a, [3], strides=[-2], byte_offset=10 * 4, legacy=True)
    with pytest.raises(etptr.InvalidArgumentError, match="copy=True"):
        etptr.from_dlpack(p)
    t = etptr.from_dlpack(p, copy=True)
    np.testing.assert_array_equal(t.numpy(), [10, 8, 6])
    assert p.deleted == 1       # the copied capsule, at once
    assert p.settle() == 2      # and the refused one, by its producer


def test_null_strides_mean_c_contiguous():
    a = host_buffer(range(24))
    t = etptr.from_dlpack(HandMadeProducer(a, [2, 3, 4], strides=None))
    assert t.strides == (12, 4, 1) and t.dim_order == (0, 1, 2)
    np.testing.assert_array_equal(t.numpy(), a.reshape(2, 3, 4))


def test_explicit_strides_give_dim_order():
    a = host_buffer(range(6))
    t = etptr.from_dlpack(HandMadeProducer(a, [2, 3], strides=[1, 2]))
    assert t.dim_order == (1, 0) and t.strides == (1, 2)
    np.testing.assert_array_equal(t.numpy(), a.reshape(3, 2).T)


def test_size_one_dims_may_have_any_stride():
    a = host_buffer(range(3))
    t = etptr.from_dlpack(HandMadeProducer(a, [1, 3], strides=[12345, 1]))
    assert t.sizes == (1, 3)
    np.testing.assert_array_equal(t.numpy(), a.reshape(1, 3))


def test_zero_size_with_null_data():
    p = HandMadeProducer(None, [0, 4], strides=[7, -3], data=0)
    t = etptr.from_dlpack(p)
    assert t.data_ptr == 0 and t.numel() == 0 and t.sizes == (0, 4)
    assert t.numpy().shape == (0, 4)
    del t
    assert p.settle() == 1


def test_null_data_with_elements_refused_and_freed():
    p = HandMadeProducer(None, [3], data=0)
    with pytest.raises(etptr.InvalidArgumentError, match="NULL"):
        etptr.from_dlpack(p)
    gc.collect()
    assert p.settle() == 1


def test_read_only_flag():
    a = host_buffer(range(3))
    t = etptr.from_dlpack(HandMadeProducer(a, [3], flags=1))
    assert t.readonly and not t.numpy().flags.writeable


def test_cuda_host_memory_is_cpu():
    a = host_buffer(range(3))
    t = etptr.from_dlpack(HandMadeProducer(a, [3], device=(3, 0)))   # kDLCUDAHost
    assert t.device == etptr.Device("cpu")
    np.testing.assert_array_equal(t.numpy(), a)


def test_cuda_device_labels():
    a = host_buffer(range(3))
    t = etptr.from_dlpack(HandMadeProducer(a, [3], device=(2, 5)))    # kDLCUDA
    assert t.device == etptr.Device("cuda:5")
    t = etptr.from_dlpack(HandMadeProducer(a, [3], device=(13, 1)))   # kDLCUDAManaged
    assert t.device == etptr.Device("cuda:1")
    with pytest.raises(etptr.NotSupportedError, match="numpy"):
        t.numpy()


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(code=3, bits=64), etptr.InvalidTypeError, "no ExecuTorch ScalarType"),
    (dict(code=200, bits=32), etptr.InvalidTypeError, "code=200"),
    (dict(code=2, bits=24), etptr.InvalidTypeError, "bits=24"),
    (dict(code=0, bits=4), etptr.InvalidTypeError, "bits=4"),
    (dict(code=6, bits=1), etptr.InvalidTypeError, "bits=1"),
    (dict(code=17, bits=4), etptr.InvalidTypeError, "code=17"),
    (dict(code=2, bits=32, lanes=4), etptr.NotSupportedError, "lanes"),
    (dict(device=(10, 0)), etptr.NotSupportedError, "kDLROCM"),
    (dict(device=(99, 0)), etptr.NotSupportedError, "unknown"),
    (dict(device=(2, 300)), etptr.InvalidArgumentError, "int8"),
    (dict(version=(2, 0)), etptr.NotSupportedError, "version 2.0"),
    (dict(ndim=17), etptr.InvalidArgumentError, "ndim=17"),
    (dict(ndim=-1), etptr.InvalidArgumentError, "ndim=-1"),
    (dict(null_shape=True), etptr.InvalidArgumentError, "shape is NULL"),
    (dict(dlpack_device=(2, 0)), etptr.InvalidArgumentError, "__dlpack_device__"),
], ids=lambda x: str(x) if not isinstance(x, dict) else "-".join(f"{k}{v}" for k, v in x.items()))
def test_bad_capsules_raise_and_free_once(kwargs, exc, match):
    a = host_buffer(range(8))
    p = HandMadeProducer(a, [8], **kwargs)
    with pytest.raises(exc, match=match):
        etptr.from_dlpack(p)
    if "dlpack_device" not in kwargs:
        # the capsule itself, without the producer's __dlpack_device__ in front
        with pytest.raises(exc, match=match):
            etptr.from_dlpack(p.capsule())
    gc.collect()
    # every capsule handed out is freed once, by its producer: none was consumed
    handed_out = len(p._capsules)
    assert handed_out >= 1
    assert p.settle() == handed_out


def test_negative_shape_refused():
    a = host_buffer(range(8))
    p = HandMadeProducer(a, [-2, 4])
    with pytest.raises(etptr.InvalidArgumentError, match="negative"):
        etptr.from_dlpack(p)
    gc.collect()
    assert p.settle() == 1


def test_overflowing_shape_refused():
    a = host_buffer(range(8))
    p = HandMadeProducer(a, [2**40, 2**40])
    with pytest.raises(etptr.InvalidArgumentError, match="overflow"):
        etptr.from_dlpack(p)


def test_huge_byte_offset_refused():
    a = host_buffer(range(8))
    with pytest.raises(etptr.InvalidArgumentError, match="byte_offset"):
        etptr.from_dlpack(HandMadeProducer(a, [1], byte_offset=2**64 - 8))


# ------------------------------------------------------------------ producers that misbehave

def test_not_a_producer():
    with pytest.raises(etptr.InvalidTypeError, match="DLPack producer"):
        etptr.from_dlpack([1, 2, 3])
    with pytest.raises(etptr.InvalidTypeError, match="DLPack producer"):
        etptr.from_dlpack(memoryview(b"abc"))


def test_producer_returns_non_capsule():
    with pytest.raises(etptr.InvalidTypeError, match="not a PyCapsule"):
        etptr.from_dlpack(Wrap(np.zeros(2), dlpack=lambda **kw: 42))


def test_foreign_capsule_refused():
    import datetime
    cap = datetime.datetime_CAPI
    with pytest.raises(etptr.InvalidTypeError, match="datetime"):
        etptr.from_dlpack(cap)


def test_producer_buffer_error_becomes_not_supported():
    def refuse(**kw):
        raise BufferError("cannot export")
    with pytest.raises(etptr.NotSupportedError, match="cannot export") as info:
        etptr.from_dlpack(Wrap(np.zeros(2), dlpack=refuse))
    assert isinstance(info.value.__cause__ or info.value.__context__, BufferError)


def test_producer_other_errors_propagate():
    def boom(**kw):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        etptr.from_dlpack(Wrap(np.zeros(2), dlpack=boom))


def test_bad_dlpack_device():
    with pytest.raises(etptr.InvalidTypeError, match="__dlpack_device__"):
        etptr.from_dlpack(Wrap(np.zeros(2), device="cpu"))
    with pytest.raises(etptr.InvalidTypeError, match="pair of ints"):
        etptr.from_dlpack(Wrap(np.zeros(2), device=("a", 0)))


def test_capsule_of_another_object_on_another_device():
    # the wrapper claims CUDA but hands out a CPU array's capsule
    a = np.arange(4.0)
    before = sys.getrefcount(a)
    with pytest.raises(etptr.InvalidArgumentError, match="says cuda:0"):
        etptr.from_dlpack(Wrap(a, device=(2, 0)))
    gc.collect()
    assert sys.getrefcount(a) == before           # the refused capsule was freed


def test_capsule_of_another_object_same_device():
    a, b = np.arange(4.0), np.arange(4.0) + 10
    w = Wrap(a, dlpack=b.__dlpack__)
    t = etptr.from_dlpack(w)
    assert t.data_ptr == b.ctypes.data
    assert w.calls == [{"max_version": (1, 1)}]


# ------------------------------------------------------------------ devices

@pytest.fixture
def host_alloc():
    alloc = HostDeviceAllocator(etptr.DeviceType.CUDA)
    with use_allocator(alloc):
        yield alloc
    gc.collect()


def test_device_tensor_import_is_zero_copy(host_alloc):
    src = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0, 3.0]), "cuda")
    t = etptr.from_dlpack(src)
    assert t.device == etptr.Device("cuda:0") and t.data_ptr == src.data_ptr
    del src
    gc.collect()
    assert host_alloc.live_bytes == 12          # kept alive through the capsule
    del t
    gc.collect()
    assert host_alloc.live_bytes == 0


def test_device_argument_moves_to_device(host_alloc):
    a = np.arange(6, dtype=np.float32)
    t = etptr.from_dlpack(a, device="cuda")
    assert t.device == etptr.Device("cuda:0")
    assert host_alloc.h2d_count == 1 and host_alloc.last_h2d_src == a.ctypes.data
    back = etptr.clone_tensor_ptr_to(t, "cpu")
    np.testing.assert_array_equal(back.numpy(), a)
    del t, back
    gc.collect()
    assert host_alloc.live_bytes == 0


def test_device_argument_moves_to_cpu(host_alloc):
    dev = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1, 2, 3]), "cuda")
    t = etptr.from_dlpack(dev, device="cpu")
    assert t.device == etptr.Device("cpu") and host_alloc.d2h_count == 1
    np.testing.assert_array_equal(t.numpy(), [1, 2, 3])


def test_device_index_minus_one_resolves(host_alloc):
    t = etptr.from_dlpack(np.zeros(2), device="cuda:-1")
    assert t.device == etptr.Device("cuda:0")


def test_device_change_with_copy_false_refused(host_alloc):
    with pytest.raises(etptr.InvalidArgumentError, match="copy=False"):
        etptr.from_dlpack(np.zeros(2), device="cuda", copy=False)
    assert host_alloc.allocate_count == 0


def test_device_change_without_allocator():
    if etptr.get_device_allocator(etptr.DeviceType.CUDA) is not None:
        pytest.skip("a CUDA allocator is registered on this machine")
    with pytest.raises(etptr.NotFoundError):
        etptr.from_dlpack(np.zeros(2), device="cuda")


def test_bad_device_argument():
    with pytest.raises(etptr.InvalidArgumentError, match="device"):
        etptr.from_dlpack(np.zeros(2), device="tpu")


def test_device_copy_true_not_copied_by_producer(host_alloc):
    dev = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1, 2, 3]), "cuda")
    with pytest.raises(etptr.NotSupportedError, match="copy=True"):
        etptr.from_dlpack(dev, copy=True)


# ------------------------------------------------------------------ CUDA Array Interface

class CAI:
    """An object exposing a hand-written __cuda_array_interface__ over host memory."""

    def __init__(self, buf, **fields):
        self.buf = buf
        self.__cuda_array_interface__ = dict(
            shape=buf.shape, typestr=buf.dtype.str, data=(buf.ctypes.data, False),
            strides=None, version=3)
        self.__cuda_array_interface__.update(fields)


def test_cai_basic_keeps_owner_alive():
    buf = np.arange(12, dtype=np.int32).reshape(3, 4)
    obj = CAI(buf)
    ref = weakref.ref(obj)
    t = etptr.from_cuda_array_interface(obj, device="cuda:1")
    assert t.device == etptr.Device("cuda:1")
    assert (t.sizes, t.strides, t.scalar_type) == ((3, 4), (4, 1), ScalarType.Int)
    assert t.data_ptr == buf.ctypes.data and not t.readonly
    del obj
    gc.collect()
    assert ref() is not None
    del t
    gc.collect()
    assert ref() is None


def test_cai_strides_and_readonly():
    buf = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = etptr.from_cuda_array_interface(
        CAI(buf, shape=(4, 3), strides=(8, 32), data=(buf.ctypes.data, True)), device="cuda")
    assert t.strides == (1, 4) and t.dim_order == (1, 0) and t.readonly


def test_cai_round_trip_of_etptr_tensor(host_alloc):
    src = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.arange(6.0).reshape(2, 3)), "cuda")
    t = etptr.from_cuda_array_interface(src, device=src.device)
    assert (t.sizes, t.strides, t.data_ptr, t.scalar_type) == (
        src.sizes, src.strides, src.data_ptr, src.scalar_type)
    back = etptr.clone_tensor_ptr_to(t, "cpu")
    np.testing.assert_array_equal(back.numpy(), np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("fields,exc,match", [
    (dict(strides=(8, 16)), etptr.InvalidArgumentError, "dim_order"),
    (dict(strides=(6, 1)), etptr.InvalidArgumentError, "multiples"),
    (dict(strides=(8,)), etptr.InvalidArgumentError, "tuple of 2"),
    (dict(strides=(32, -8)), etptr.InvalidArgumentError, "ascontiguousarray"),
    (dict(typestr=">f8"), etptr.InvalidTypeError, "byte order"),
    (dict(typestr="<V2"), etptr.InvalidTypeError, "ScalarType"),
    (dict(typestr="zz"), etptr.InvalidTypeError, "type string"),
    (dict(typestr=8), etptr.InvalidTypeError, "typestr"),
    (dict(shape=(-1, 4)), etptr.InvalidArgumentError, "negative"),
    (dict(shape="34"), etptr.InvalidTypeError, "shape"),
    (dict(data=(0, False)), etptr.InvalidArgumentError, "null"),
    (dict(data=(-5, False)), etptr.InvalidArgumentError, "address"),
    (dict(data=[1, False]), etptr.InvalidTypeError, "data"),
    (dict(data=(1.5, False)), etptr.InvalidTypeError, "data"),
    (dict(data=(16, "no")), etptr.InvalidTypeError, "bool"),
    (dict(mask=object()), etptr.NotSupportedError, "mask"),
    (dict(version=4), etptr.NotSupportedError, "version"),
    (dict(stream=0), etptr.InvalidArgumentError, "stream"),
], ids=lambda x: str(x) if not isinstance(x, dict) else "-".join(f"{k}{v}" for k, v in x.items()))
def test_cai_bad_fields(fields, exc, match):
    buf = np.zeros((4, 4))
    obj = CAI(buf, **fields)
    if "shape" not in fields and "strides" in fields:
        obj.__cuda_array_interface__["shape"] = (4, 4)
    with pytest.raises(exc, match=match):
        etptr.from_cuda_array_interface(obj, device="cuda")


def test_cai_missing_fields_and_objects():
    with pytest.raises(etptr.InvalidTypeError, match="__cuda_array_interface__"):
        etptr.from_cuda_array_interface(np.zeros(3))
    obj = CAI(np.zeros(3))
    del obj.__cuda_array_interface__["typestr"]
    with pytest.raises(etptr.InvalidArgumentError, match="typestr"):
        etptr.from_cuda_array_interface(obj, device="cuda")
    obj.__cuda_array_interface__ = [1, 2]
    with pytest.raises(etptr.InvalidTypeError, match="dict"):
        etptr.from_cuda_array_interface(obj, device="cuda")


def test_cai_zero_size_null_pointer():
    t = etptr.from_cuda_array_interface(CAI(np.zeros((0, 3)), data=(0, False)), device="cuda")
    assert t.data_ptr == 0 and t.sizes == (0, 3)


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """tests/fakes/fakecuda.c built (a stand-in for libcuda), or skip without a C compiler."""
    import _fake_libcuda
    if not sys.platform.startswith("linux"):
        pytest.skip("the fake driver is a Linux shared library")
    path = _fake_libcuda.build(str(tmp_path_factory.mktemp("fakecuda")))
    if path is None:
        pytest.skip("no C compiler to build the fake libcuda")
    return path


def _run_fake_cupy(path, body):
    """Run ``body`` in a process of its own, with etptr's CUDA layer over a host-memory
    stand-in for CuPy (over the stand-in libcuda at ``path``) whose runtime records the
    queries etptr makes of it: ``table`` (address -> what pointerGetAttributes answers),
    ``calls()`` (what etptr asked of the runtime and the driver's synchronisations, in
    order) and ``CAI`` at hand."""
    import _fake_libcuda
    _fake_libcuda.run(path, textwrap.dedent("""
        from etptr.cuda import _driver

        class CAI:
            def __init__(self, buf, **fields):
                self.buf = buf
                self.__cuda_array_interface__ = dict(
                    shape=buf.shape, typestr=buf.dtype.str, data=(buf.ctypes.data, False),
                    strides=None, version=3)
                self.__cuda_array_interface__.update(fields)

        class Attrs:
            def __init__(self, type, device):
                self.type, self.device = type, device

        table = {}
        asked = []                  # the runtime's calls; each is a mark in the driver's log
        cupy = F.make_cupy(ndev=3)
        rt = cupy.cuda.runtime

        def pointerGetAttributes(ptr):
            asked.append(("pointerGetAttributes", ptr))
            F.mark()
            if ptr not in table:
                raise rt.CUDARuntimeError(1, "cudaErrorInvalidValue")
            return table[ptr]

        def getDevice():
            asked.append(("getDevice",))
            F.mark()
            return 2

        def calls():
            python = iter(asked)
            return [next(python) if c.what == "mark" else ("streamSynchronize", c.stream)
                    for c in F.calls if c.what in ("mark", "stream_sync")]

        rt.pointerGetAttributes = pointerGetAttributes
        rt.getDevice = getDevice
        _driver._use_backend(cupy)
        F.log()
    """) + textwrap.dedent(body))


def test_cai_device_asked_of_the_runtime(fake_driver):
    _run_fake_cupy(fake_driver, """
        buf = np.zeros(4, dtype=np.float32)
        table[buf.ctypes.data] = Attrs(2, 3)                 # device memory on GPU 3
        t = etptr.from_cuda_array_interface(CAI(buf, stream=7))
        assert t.device == etptr.Device("cuda:3")
        assert calls() == [("pointerGetAttributes", buf.ctypes.data), ("streamSynchronize", 7)]
        table[buf.ctypes.data] = Attrs(3, 1)                 # managed
        assert etptr.from_cuda_array_interface(CAI(buf)).device == etptr.Device("cuda:1")
        table[buf.ctypes.data] = Attrs(1, 0)                 # page-locked host memory
        assert etptr.from_cuda_array_interface(CAI(buf)).device == etptr.Device("cpu")
        table[buf.ctypes.data] = Attrs(0, -2)                # unregistered host memory
        try:
            etptr.from_cuda_array_interface(CAI(buf))
            raise AssertionError("no error")
        except etptr.InvalidArgumentError as exc:
            assert "not CUDA memory" in str(exc), exc
        del table[buf.ctypes.data]
        try:
            etptr.from_cuda_array_interface(CAI(buf))
            raise AssertionError("no error")
        except etptr.InvalidArgumentError as exc:
            assert "does not know" in str(exc), exc
    """)


def test_cai_null_pointer_uses_current_device(fake_driver):
    _run_fake_cupy(fake_driver, """
        t = etptr.from_cuda_array_interface(CAI(np.zeros(0), data=(0, False)))
        assert t.device == etptr.Device("cuda:2") and calls() == [("getDevice",)]
    """)


def test_cai_without_cupy_needs_device(monkeypatch):
    from etptr.cuda import _driver
    _driver._use_backend(None)
    monkeypatch.setitem(sys.modules, "cupy", None)      # import cupy -> ImportError
    with pytest.raises(etptr.NotSupportedError, match="device="):
        etptr.from_cuda_array_interface(CAI(np.zeros(2)))
    with pytest.raises(etptr.NotSupportedError, match="stream"):
        etptr.from_cuda_array_interface(CAI(np.zeros(2), stream=1), device="cuda")


def test_public_names():
    assert "from_dlpack" in etptr.__all__ and "from_cuda_array_interface" in etptr.__all__
    assert etptr.from_dlpack.__doc__ and etptr.from_cuda_array_interface.__doc__
