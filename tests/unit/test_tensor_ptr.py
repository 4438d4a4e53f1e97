"""etptr._core._tensor_ptr: make_tensor_ptr's overload set and the metadata it builds."""
import array
import ctypes
import gc
import math

import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import Device
from etptr import ScalarType as ST
from etptr import TensorShapeDynamism as Dyn

BOUND = Dyn.DYNAMIC_BOUND


def mem(t, dtype):
    """A copy of the tensor's storage, read straight from data_ptr."""
    return np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=dtype)


def f32(n):
    return np.arange(n, dtype=np.float32)


# ================================================================== the overload set

class TestRawAddress:
    def test_aliases_and_defaults(self):
        buf = f32(6)
        t = etptr.make_tensor_ptr([2, 3], buf.ctypes.data)
        assert t.data_ptr == buf.ctypes.data
        assert (t.sizes, t.dim_order, t.strides) == ((2, 3), (0, 1), (3, 1))
        assert t.scalar_type is ST.Float
        assert t.shape_dynamism is BOUND
        assert t.device == Device("cpu")
        assert (t.dim(), t.numel(), t.nbytes, t.element_size()) == (2, 6, 24, 4)
        assert t.readonly is False
        buf[4] = 40.0
        assert t.numpy()[1, 1] == 40.0

    def test_numpy_integer_address(self):
        buf = f32(2)
        t = etptr.make_tensor_ptr([2], np.uint64(buf.ctypes.data))
        assert t.data_ptr == buf.ctypes.data

    def test_null_data(self):
        t = etptr.make_tensor_ptr([3, 4], None, type=ST.Double)
        assert t.data_ptr == 0
        assert (t.numel(), t.nbytes) == (12, 96)

    def test_extreme_but_valid_addresses_are_only_labels(self):
        t = etptr.make_tensor_ptr([1], (1 << 64) - 1)
        assert t.data_ptr == (1 << 64) - 1

    def test_device_only_labels(self, host_alloc):
        buf = f32(4)
        t = etptr.make_tensor_ptr([4], buf.ctypes.data, device="cuda:3")
        assert t.device == Device("cuda:3")
        assert t.data_ptr == buf.ctypes.data
        assert host_alloc.allocate_count == 0 and host_alloc.h2d_count == 0

    def test_deleter_receives_the_address_once(self):
        buf = f32(4)
        seen = []
        t = etptr.make_tensor_ptr([4], buf.ctypes.data, deleter=seen.append)
        gc.collect()
        assert seen == []
        del t
        assert seen == [buf.ctypes.data]
        gc.collect()
        assert seen == [buf.ctypes.data]

    def test_deleter_on_null_data_gets_zero(self):
        seen = []
        t = etptr.make_tensor_ptr([4], None, deleter=seen.append)
        del t
        assert seen == [0]

    @pytest.mark.parametrize("dyn", list(Dyn))
    def test_dynamism(self, dyn):
        assert etptr.make_tensor_ptr([2], None, dynamism=dyn).shape_dynamism is dyn
        assert etptr.make_tensor_ptr([], None, dynamism=dyn).shape_dynamism is Dyn.STATIC


class TestBytes:
    def test_copies(self):
        payload = bytes(range(8))
        t = etptr.make_tensor_ptr([2, 2], payload, type=ST.Short)
        assert t.scalar_type is ST.Short
        assert mem(t, np.uint8).tobytes() == payload
        assert t.numpy().tolist() == np.frombuffer(payload, np.int16).reshape(2, 2).tolist()
        t.numpy()[0, 0] = 7  # its own copy: writable, and the bytes object is untouched
        assert payload == bytes(range(8))

    def test_types_without_numpy_dtype(self):
        t = etptr.make_tensor_ptr([3], b"abc", type=ST.QUInt8)
        assert mem(t, np.uint8).tobytes() == b"abc"
        with pytest.raises(etptr.NotSupportedError):
            t.numpy()

    @pytest.mark.parametrize("n", [0, 7, 9])
    def test_length_must_match(self, n):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([2], bytes(n))
        assert f"data holds {n} bytes" in str(info.value)
        assert "need exactly 8" in str(info.value)

    def test_empty(self):
        t = etptr.make_tensor_ptr([0, 3], b"")
        assert (t.numel(), t.nbytes) == (0, 0) and t.data_ptr != 0


class TestLists:
    @pytest.mark.parametrize("values, stype", [
        ([1.5, 2.5], ST.Float),
        ([1, 2], ST.Long),
        ([True, False], ST.Bool),
        ([1, 2.5], ST.Float),
        ([True, 2], ST.Float),
        ([], ST.Float),
        ([np.int8(3), np.uint16(4)], ST.Long),
        ([np.float16(1.0)], ST.Float),
        ([np.True_], ST.Bool),
    ])
    def test_deduction(self, values, stype):
        t = etptr.make_tensor_ptr(values)
        assert t.scalar_type is stype
        assert t.sizes == (len(values),)
        expected = np.array([v.item() if isinstance(v, np.generic) else v for v in values],
                            dtype=etptr.scalar_type_to_numpy(stype))
        assert t.numpy().tolist() == expected.tolist()

    def test_tuple_and_sizes(self):
        t = etptr.make_tensor_ptr([2, 2], (1, 2, 3, 4))
        assert t.numpy().tolist() == [[1, 2], [3, 4]]

    @pytest.mark.parametrize("stype", [ST.Byte, ST.Char, ST.Short, ST.Int, ST.Long, ST.Half,
                                       ST.Float, ST.Double, ST.BFloat16, ST.UInt16, ST.UInt32,
                                       ST.UInt64])
    def test_long_list_casts(self, stype):
        values = [0, 1, 2, 100]
        t = etptr.make_tensor_ptr(values, type=stype)
        assert t.scalar_type is stype
        expected = np.array(values, dtype=np.int64).astype(etptr.scalar_type_to_numpy(stype))
        np.testing.assert_array_equal(t.numpy(), expected)

    def test_int64_limits(self):
        t = etptr.make_tensor_ptr([-(1 << 63), (1 << 63) - 1])
        assert t.numpy().tolist() == [-(1 << 63), (1 << 63) - 1]

    @pytest.mark.parametrize("bad, index", [([1, 1 << 63], 1), ([-(1 << 63) - 1], 0), ([1 << 100, 2], 0)])
    def test_ints_outside_int64(self, bad, index):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(bad)
        assert f"data[{index}]={bad[index]}" in str(info.value)
        assert "int64" in str(info.value)

    def test_c_style_wrap_when_narrowing_ints(self):
        t = etptr.make_tensor_ptr([300, -1], type=ST.Byte)
        assert t.numpy().tolist() == [44, 255]

    @pytest.mark.parametrize("values, stype", [
        ([1.5], ST.Int), ([1.5], ST.Long), ([1.5], ST.Byte), ([1], ST.Bool), ([1.5], ST.Bool),
    ])
    def test_refused_casts(self, values, stype):
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.make_tensor_ptr(values, type=stype)
        assert f"type=ScalarType.{stype.name}" in str(info.value)
        assert "canCast" in str(info.value)

    @pytest.mark.parametrize("values, fragment", [
        ([[1], [2]], "data[0]=[1]"),
        (["a"], "data[0]='a'"),
        ([1, None], "data[1]=None"),
        ([1j], "data[0]=1j"),
        ([np.str_("x")], "data[0]="),
        ([b"x"], "data[0]=b'x'"),
    ])
    def test_non_numbers(self, values, fragment):
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.make_tensor_ptr([len(values)], values)
        assert fragment in str(info.value)

    def test_ints_beyond_double_in_a_float_list(self):
        # Regression: a bare OverflowError escaped from the conversion to double.
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([1.5, 1 << 1100])
        assert str(info.value).startswith(f"data[1]={1 << 1100} does not fit a double")
        assert etptr.make_tensor_ptr([1.5, 1 << 70]).numpy().tolist() == [1.5, float(np.float32(2.0 ** 70))]

    def test_length_must_equal_numel(self):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([2, 3], [1.0] * 5)
        assert "data has 5 values" in str(info.value) and "needs 6" in str(info.value)

    def test_copy_is_independent(self):
        values = [1, 2, 3]
        t = etptr.make_tensor_ptr(values)
        values[0] = 9
        assert t.numpy().tolist() == [1, 2, 3]

    def test_nan_and_inf_survive_float_types(self):
        t = etptr.make_tensor_ptr([float("nan"), float("inf"), -float("inf")], type=ST.Half)
        v = t.numpy()
        assert math.isnan(v[0]) and v[1] == np.inf and v[2] == -np.inf

    def test_deleter_refused_for_copies(self):
        for data in ([1.0], b"abcd", 3.0):
            with pytest.raises(etptr.InvalidArgumentError) as info:
                etptr.make_tensor_ptr([1], data, deleter=print) if not isinstance(data, float) \
                    else etptr.make_tensor_ptr(data, deleter=print)
            assert str(info.value).startswith("deleter")

    def test_list_to_device(self, host_alloc):
        t = etptr.make_tensor_ptr([2], [1.0, 2.0], device="cuda:2")
        assert t.device == Device("cuda:2")
        assert (host_alloc.allocate_count, host_alloc.h2d_count, host_alloc.last_h2d_size) == (1, 1, 8)
        assert etptr.clone_tensor_ptr_to_cpu(t).numpy().tolist() == [1.0, 2.0]


class TestBuffers:
    def test_ndarray_with_sizes_aliases(self):
        a = np.arange(6, dtype=np.int16)
        t = etptr.make_tensor_ptr([3, 2], a)
        assert t.data_ptr == a.ctypes.data and t.scalar_type is ST.Short
        t.numpy()[2, 1] = 99
        assert a[5] == 99

    def test_type_reinterprets(self):
        a = np.zeros(4, dtype=np.uint8)
        t = etptr.make_tensor_ptr([1], a, type=ST.Float)
        t.numpy()[0] = 1.0
        assert a.tobytes() == np.float32(1.0).tobytes()

    def test_buffer_may_be_larger(self):
        a = f32(10)
        t = etptr.make_tensor_ptr([2, 2], a)
        assert t.numpy().tolist() == [[0, 1], [2, 3]]

    def test_fortran_order_counts_as_one_block(self):
        a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
        t = etptr.make_tensor_ptr([6], a)
        assert t.numpy().tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]

    def test_too_small(self):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([5], f32(4))
        assert "data holds 16 bytes" in str(info.value) and "span 20" in str(info.value)

    def test_non_contiguous(self):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([3], f32(6)[::2])
        assert str(info.value).startswith("data: the buffer is not contiguous")
        assert "ascontiguousarray" in str(info.value)

    @pytest.mark.parametrize("make, stype, values", [
        (lambda: bytearray(b"\x01\x02"), ST.Byte, [1, 2]),
        (lambda: array.array("i", [5, -6]), ST.Int, [5, -6]),
        (lambda: (ctypes.c_double * 2)(1.5, 2.5), ST.Double, [1.5, 2.5]),
        (lambda: memoryview(np.array([7, 8], dtype=np.uint16)), ST.UInt16, [7, 8]),
        (lambda: np.array([1, 0], dtype=np.bool_), ST.Bool, [True, False]),
        (lambda: np.ones(2, dtype=ml_dtypes.bfloat16), ST.BFloat16, [1.0, 1.0]),
    ])
    def test_buffer_kinds(self, make, stype, values):
        owner = make()
        t = etptr.make_tensor_ptr([2], owner)
        assert t.scalar_type is stype
        assert [float(x) if stype is ST.BFloat16 else x for x in t.numpy().tolist()] == values
        assert t.readonly is False

    def test_owner_is_kept_alive_and_cannot_be_resized(self):
        raw = bytearray(8)
        t = etptr.make_tensor_ptr([2], raw, type=ST.Float)
        with pytest.raises(BufferError):
            raw.extend(b"x" * 64)  # an exported buffer cannot move under the tensor
        del raw
        gc.collect()
        t.numpy()[:] = [1.0, 2.0]
        assert t.numpy().tolist() == [1.0, 2.0]

    @pytest.mark.parametrize("make", [
        lambda: b"\x00" * 8,
        lambda: memoryview(b"\x00" * 8),
        lambda: np.frombuffer(b"\x00" * 8, dtype=np.uint8),
    ])
    def test_read_only_buffers(self, make):
        owner = make()
        if isinstance(owner, bytes):
            t = etptr.make_tensor_ptr(np.frombuffer(owner, np.uint8))  # short form aliases
        else:
            t = etptr.make_tensor_ptr([8], owner)
        assert t.readonly is True
        v = t.numpy()
        assert v.flags.writeable is False
        with pytest.raises(ValueError):
            v[0] = 1
        assert etptr.make_tensor_ptr(t, [2, 4]).readonly is True

    @pytest.mark.parametrize("data, fragment", [
        (3.5, "data of type float"),
        ("abcd", "data of type str"),
        (True, "data of type bool"),
        ({}, "data of type dict"),
        (object(), "data of type object"),
    ])
    def test_unsupported_data(self, data, fragment):
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.make_tensor_ptr([1], data)
        assert str(info.value).startswith(fragment)

    @pytest.mark.parametrize("dtype", [object, [("a", "i8"), ("b", "O")]], ids=["object", "struct-with-object"])
    def test_object_arrays_are_never_aliased(self, dtype):
        # Regression: with type= the array's PyObject pointers were aliased as Long, and
        # writing through the tensor corrupted them (segfault on teardown).
        a = np.zeros(2, dtype=dtype)
        for kwargs in ({"type": ST.Long}, {"type": ST.Byte}, {}):
            with pytest.raises(etptr.InvalidTypeError) as info:
                etptr.make_tensor_ptr([2], a, **kwargs)
            assert str(info.value).startswith("data: an array of dtype")
            assert "Python objects" in str(info.value)

    def test_released_memoryview(self):
        # Regression: memoryview()'s ValueError escaped.
        mv = memoryview(bytearray(8))
        mv.release()
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([8], mv)
        assert str(info.value).startswith("data of type memoryview: ")

    def test_non_contiguous_buffer_of_unknown_format(self):
        # Regression: the byte-view fallback let memoryview.cast's TypeError escape.
        class Rec(ctypes.Structure):
            _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_char)]
        mv = memoryview((Rec * 4)())[::2]
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr([2], mv)
        # NumPy reads the structure's format on some Pythons (3.13): then the strided array
        # is refused; elsewhere the byte-view fallback refuses the buffer itself
        assert str(info.value).startswith("data: the buffer ")
        assert "is not contiguous" in str(info.value)
        whole = etptr.make_tensor_ptr([16], (Rec * 4)())  # contiguous: aliased as bytes
        assert whole.scalar_type is ST.Byte

    def test_tensor_as_data_points_to_the_alias_overload(self):
        src = etptr.make_tensor_ptr([1.0])
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.make_tensor_ptr([1], src)
        assert "make_tensor_ptr(tensor, sizes)" in str(info.value)

    @pytest.mark.parametrize("dtype", [">f4", "O", "U2", "M8[s]", "i4,f4", np.longdouble])
    def test_arrays_without_scalar_type(self, dtype):
        with pytest.raises(etptr.InvalidTypeError):
            etptr.make_tensor_ptr(np.zeros(2, dtype=dtype))
        with pytest.raises(etptr.InvalidTypeError):
            etptr.make_tensor_ptr([2], np.zeros(2, dtype=dtype))


class TestShortForms:
    @pytest.mark.parametrize("value, stype, readback", [
        (3.25, ST.Float, 3.25), (-7, ST.Long, -7), (True, ST.Bool, True),
        (np.float16(1.5), ST.Half, 1.5), (np.uint32(9), ST.UInt32, 9),
        (np.complex64(1 + 2j), ST.ComplexFloat, 1 + 2j),
    ])
    def test_numbers_are_0_dim(self, value, stype, readback):
        t = etptr.make_tensor_ptr(value)
        assert (t.sizes, t.strides, t.dim_order, t.numel(), t.dim()) == ((), (), (), 1, 0)
        assert t.scalar_type is stype
        assert t.shape_dynamism is Dyn.STATIC
        assert t.numpy()[()] == readback

    @pytest.mark.parametrize("value", [2.0, 7, np.float32(1.5)])
    def test_numbers_refuse_layout_arguments(self, value):
        # Regression: dim_order and strides were silently dropped for the 0-dim forms.
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(value, dim_order=[0])
        assert str(info.value).startswith("dim_order=(0,) has 1 entries but sizes has 0")
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(value, strides=[1])
        assert str(info.value).startswith("strides=(1,) has 1 entries but sizes has 0")
        assert etptr.make_tensor_ptr(value, dim_order=[], strides=()).sizes == ()

    def test_number_with_type(self):
        t = etptr.make_tensor_ptr(3, type=ST.Half)
        assert t.scalar_type is ST.Half and t.numpy()[()] == 3.0
        with pytest.raises(etptr.InvalidTypeError):
            etptr.make_tensor_ptr(2.5, type=ST.Int)
        with pytest.raises(etptr.InvalidArgumentError):
            etptr.make_tensor_ptr(1 << 64)

    def test_ndarray_alias_keeps_layout(self):
        base = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
        arr = base.transpose(2, 0, 1)
        t = etptr.make_tensor_ptr(arr)
        assert t.sizes == (4, 2, 3)
        assert t.dim_order == (1, 2, 0)
        assert t.strides == (1, 12, 4)
        assert t.data_ptr == base.ctypes.data
        np.testing.assert_array_equal(t.numpy(), arr)

    def test_ndarray_size_one_dims_may_have_any_stride(self):
        base = np.arange(4.0)
        arr = np.lib.stride_tricks.as_strided(base, (1, 4), (8000, 8))
        t = etptr.make_tensor_ptr(arr)
        assert t.strides == (4, 1)
        assert t.numpy().tolist() == [[0.0, 1.0, 2.0, 3.0]]
        single = np.arange(5.0)[3:2:-1]  # one element, negative stride
        assert etptr.make_tensor_ptr(single).numpy().tolist() == [3.0]

    @pytest.mark.parametrize("arr", [
        np.arange(10.0)[::2],
        np.arange(10.0)[::-1],
        np.broadcast_to(np.arange(3.0), (4, 3)),
        np.arange(12.0).reshape(3, 4)[:, :2],
        np.lib.stride_tricks.as_strided(np.zeros(10), (3,), (3,)),
    ], ids=["step2", "reversed", "broadcast", "gapped", "unaligned-stride"])
    def test_arrays_no_dim_order_describes(self, arr):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(arr)
        assert str(info.value).startswith("data")
        assert "copy it first" in str(info.value)

    @pytest.mark.parametrize("shape, strides", [((0, 3), (7, 5)), ((2, 0), (-8, 0)), ((0,), (0,))])
    def test_zero_size_arrays_get_default_dim_order(self, shape, strides):
        arr = np.lib.stride_tricks.as_strided(np.zeros(1), shape, strides)
        t = etptr.make_tensor_ptr(arr)
        assert t.sizes == shape
        assert t.dim_order == tuple(range(len(shape)))
        assert t.numel() == 0 and t.numpy().shape == shape

    def test_0_dim_array(self):
        t = etptr.make_tensor_ptr(np.array(7, dtype=np.int16))
        assert (t.sizes, t.scalar_type, t.shape_dynamism) == ((), ST.Short, Dyn.STATIC)
        assert t.numpy()[()] == 7

    def test_ndarray_with_other_type_copies(self):
        a = np.arange(4)[::2]
        t = etptr.make_tensor_ptr(a, type=ST.Double)
        assert t.data_ptr != a.ctypes.data
        assert t.numpy().tolist() == [0.0, 2.0]
        with pytest.raises(etptr.InvalidTypeError):
            etptr.make_tensor_ptr(np.arange(2.0), type=ST.Int)

    def test_ndarray_layout_arguments_refused(self):
        for kw in ({"dim_order": [0]}, {"strides": [1]}, {"deleter": print}):
            with pytest.raises(etptr.InvalidArgumentError):
                etptr.make_tensor_ptr(np.zeros(2), **kw)

    def test_ndarray_to_device_refused(self, host_alloc):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(np.zeros(2, np.float32), device="cuda")
        assert "clone_tensor_ptr_to" in str(info.value)
        assert host_alloc.allocate_count == 0

    @pytest.mark.parametrize("value", [None, "abc", b"abc", 1j, {1: 2}, bytearray(2)])
    def test_other_single_arguments(self, value):
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.make_tensor_ptr(value)
        assert "one-argument form" in str(info.value)

    def test_17_dim_array(self):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(np.zeros([1] * 17))
        assert "17 dims" in str(info.value)


# ================================================================== metadata validation

def test_16_dims_is_the_limit():
    t = etptr.make_tensor_ptr([1] * 16, None, dim_order=list(range(15, -1, -1)))
    assert t.dim() == 16 and t.dim_order == tuple(range(15, -1, -1))


@pytest.mark.parametrize("kwargs, cls, fragment", [
    ({"sizes": [-1, 2]}, etptr.InvalidArgumentError, "sizes[0]=-1 is negative"),
    ({"sizes": [2, -5]}, etptr.InvalidArgumentError, "sizes[1]=-5 is negative"),
    ({"sizes": [1 << 63]}, etptr.InvalidArgumentError, "sizes[0]=9223372036854775808 does not fit int64"),
    ({"sizes": [-(1 << 64)]}, etptr.InvalidArgumentError, "does not fit int64"),
    ({"sizes": [1 << 32, 1 << 32]}, etptr.InvalidArgumentError, "the element count overflows int64"),
    ({"sizes": [0, 1 << 62, 1 << 62]}, etptr.InvalidArgumentError, "overflows int64"),
    ({"sizes": [1 << 62], "type": ST.Float}, etptr.InvalidArgumentError, "the byte count overflows int64"),
    ({"sizes": [1] * 17}, etptr.InvalidArgumentError, "sizes has 17 entries"),
    ({"sizes": None}, etptr.InvalidArgumentError, "sizes must be a sequence"),
    ({"sizes": 3}, etptr.InvalidTypeError, "sizes must be a sequence of ints, got 3"),
    ({"sizes": "23"}, etptr.InvalidTypeError, "sizes must be a sequence of ints, got '23'"),
    ({"sizes": {2}}, etptr.InvalidTypeError, "sizes must be a sequence of ints"),
    ({"sizes": (i for i in [2])}, etptr.InvalidTypeError, "sizes must be a sequence of ints"),
    ({"sizes": [2.0]}, etptr.InvalidTypeError, "sizes[0]=2.0"),
    ({"sizes": [None]}, etptr.InvalidTypeError, "sizes[0]=None"),
    ({"sizes": ["2"]}, etptr.InvalidTypeError, "sizes[0]='2'"),
    ({"sizes": [[2]]}, etptr.InvalidTypeError, "sizes[0]=[2]"),
    ({"sizes": [True]}, etptr.InvalidTypeError, "sizes[0]=True is a bool"),
    ({"sizes": [np.True_]}, etptr.InvalidTypeError, "sizes[0]="),
    ({"sizes": [np.float64(2)]}, etptr.InvalidTypeError, "sizes[0]="),
    ({"sizes": [2, 3], "dim_order": [0]}, etptr.InvalidArgumentError, "dim_order=(0,) has 1 entries but sizes has 2"),
    ({"sizes": [2, 3], "dim_order": [0, 1, 2]}, etptr.InvalidArgumentError, "dim_order=(0, 1, 2) has 3 entries"),
    ({"sizes": [2, 3], "dim_order": [0, 0]}, etptr.InvalidArgumentError, "dim_order=(0, 0) is not a permutation of 0..1"),
    ({"sizes": [2, 3], "dim_order": [-1, 0]}, etptr.InvalidArgumentError, "dim_order=(-1, 0) is not a permutation"),
    ({"sizes": [2, 3], "dim_order": [2, 1]}, etptr.InvalidArgumentError, "dim_order=(2, 1) is not a permutation"),
    ({"sizes": [2, 3], "dim_order": [256, 0]}, etptr.InvalidArgumentError, "is not a permutation"),
    ({"sizes": [2, 3], "dim_order": [1 << 70, 0]}, etptr.InvalidArgumentError, "dim_order[0]="),
    ({"sizes": [2, 3], "dim_order": list(range(17))}, etptr.InvalidArgumentError, "dim_order has 17 entries"),
    ({"sizes": [2, 3], "dim_order": "01"}, etptr.InvalidTypeError, "dim_order must be a sequence"),
    ({"sizes": [2, 3], "dim_order": 1}, etptr.InvalidTypeError, "dim_order must be a sequence"),
    ({"sizes": [2, 3], "dim_order": [1.0, 0.0]}, etptr.InvalidTypeError, "dim_order[0]=1.0"),
    ({"sizes": [2, 3], "strides": [1]}, etptr.InvalidArgumentError, "strides=(1,) has 1 entries but sizes has 2"),
    ({"sizes": [2, 3], "strides": [1, 1]}, etptr.InvalidArgumentError, "strides=(1, 1) disagree with dim_order=(0, 1)"),
    ({"sizes": [2, 3], "strides": [-3, -1]}, etptr.InvalidArgumentError, "strides=(-3, -1) disagree"),
    ({"sizes": [2, 3], "strides": [0, 0]}, etptr.InvalidArgumentError, "strides=(0, 0) disagree"),
    ({"sizes": [2, 3], "strides": [1 << 64, 1]}, etptr.InvalidArgumentError, "strides[0]="),
    ({"sizes": [2, 3], "strides": [3.0, 1.0]}, etptr.InvalidTypeError, "strides[0]=3.0"),
    ({"sizes": [2, 3], "dim_order": [1, 0], "strides": [3, 1]}, etptr.InvalidArgumentError,
     "strides=(3, 1) disagree with dim_order=(1, 0): strides[0] is 3"),
    ({"sizes": [0, 3], "strides": [7, 5]}, etptr.InvalidArgumentError, "strides=(7, 5) disagree"),
    ({"sizes": [2], "type": 30}, etptr.InvalidArgumentError, "type=30 is not a ScalarType code"),
    ({"sizes": [2], "type": -1}, etptr.InvalidArgumentError, "type=-1"),
    ({"sizes": [2], "type": "Floot"}, etptr.InvalidArgumentError, "close names: Float"),
    ({"sizes": [2], "type": np.dtype("U3")}, etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    ({"sizes": [2], "type": True}, etptr.InvalidTypeError, "type must be an etptr.ScalarType"),
    ({"sizes": [2], "dynamism": 3}, etptr.InvalidArgumentError, "dynamism=3"),
    ({"sizes": [2], "dynamism": None}, etptr.InvalidTypeError, "dynamism must be"),
    ({"sizes": [2], "dynamism": "STATIC"}, etptr.InvalidTypeError, "dynamism must be"),
    ({"sizes": [2], "deleter": 5}, etptr.InvalidTypeError, "deleter=5 is not callable"),
    ({"sizes": [2], "device": "cuda:128"}, etptr.InvalidArgumentError, "device: device index 128"),
])
def test_raw_metadata_errors(kwargs, cls, fragment):
    sizes = kwargs.pop("sizes")
    with pytest.raises(cls) as info:
        etptr.make_tensor_ptr(sizes, None, **kwargs)
    assert type(info.value) is cls
    assert fragment in str(info.value)


@pytest.mark.parametrize("data, fragment", [
    (-1, "data=-1 is not a valid address"),
    (1 << 64, "data=18446744073709551616 is not a valid address"),
    (np.int64(-8), "is not a valid address"),
])
def test_addresses_out_of_range(data, fragment):
    seen = []
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.make_tensor_ptr([2], data, deleter=seen.append)
    assert fragment in str(info.value)
    gc.collect()
    assert seen == []


class _Overstated(list):
    def __len__(self):
        return 3


@pytest.mark.parametrize("argname", ["sizes", "dim_order", "strides"])
@pytest.mark.parametrize("bad", [np.array(2), {"a": 1}, _Overstated([2])], ids=["0-dim-array", "dict", "bad-len"])
def test_sequences_that_are_not_sequences(argname, bad):
    # Regression: these let a bare TypeError, KeyError or IndexError escape.
    kwargs = {"sizes": [2]}
    kwargs[argname] = bad
    with pytest.raises(etptr.InvalidTypeError) as info:
        etptr.make_tensor_ptr(kwargs.pop("sizes"), None, **kwargs)
    assert str(info.value).startswith(f"{argname} must be a sequence of ints, got ")


def test_numpy_integer_sizes_and_sequences():
    t = etptr.make_tensor_ptr(np.array([2, 3]), None, dim_order=(np.int8(1), np.uint8(0)),
                              strides=[np.int64(1), np.int32(2)])
    assert (t.sizes, t.dim_order, t.strides) == ((2, 3), (1, 0), (1, 2))
    assert all(type(x) is int for x in t.sizes + t.dim_order + t.strides)


def test_empty_dim_order_and_strides_mean_default():
    t = etptr.make_tensor_ptr([2, 3], None, dim_order=[], strides=[])
    assert (t.dim_order, t.strides) == ((0, 1), (3, 1))


@pytest.mark.parametrize("sizes, strides, order", [
    ([3, 4], [1, 3], (1, 0)),
    ([2, 1, 3], [3, 3, 1], (0, 1, 2)),          # equal strides: stable, ascending dim index
    ([1, 1], [1, 1], (0, 1)),
    ([2, 1, 3], [1, 1, 2], (2, 0, 1)),
    ([4, 1], [1, 100], (1, 0)),                 # a size-1 dim may carry any stride
])
def test_dim_order_inferred_from_strides(sizes, strides, order):
    t = etptr.make_tensor_ptr(sizes, None, strides=strides)
    assert t.dim_order == order


def test_size_one_strides_are_normalised():
    t = etptr.make_tensor_ptr([1, 3], None, strides=[-3, 1])  # order inferred from the strides
    assert (t.dim_order, t.strides) == ((1, 0), (1, 1))
    t = etptr.make_tensor_ptr([1, 3], None, dim_order=[0, 1], strides=[-3, 1])
    assert (t.dim_order, t.strides) == ((0, 1), (3, 1))
    t = etptr.make_tensor_ptr([2, 1], None, dim_order=[0, 1], strides=[1, 12345])
    assert t.strides == (1, 1)


def test_zero_sizes_keep_the_carried_stride():
    t = etptr.make_tensor_ptr([3, 0, 2], None)
    assert t.strides == (2, 2, 1) and t.numel() == 0
    assert etptr.make_tensor_ptr([2, 0], None, strides=[1, 1]).strides == (1, 1)


def test_metadata_copied_not_referenced():
    sizes, order = [2, 3], [1, 0]
    t = etptr.make_tensor_ptr(sizes, None, dim_order=order)
    sizes[0], order[0] = 100, 0
    assert (t.sizes, t.dim_order) == ((2, 3), (1, 0))


def test_size_accessor():
    t = etptr.make_tensor_ptr([2, 3, 4], None)
    assert [t.size(d) for d in (0, 1, 2, -1, -2, -3, np.int64(1))] == [2, 3, 4, 4, 3, 2, 3]
    for bad, fragment in ((3, "d=3 is out of range"), (-4, "d=-4"), (1 << 70, "not a dim index"),
                          ("0", "d='0' is not a dim index"), (1.0, "not a dim index")):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            t.size(bad)
        assert fragment in str(info.value)
    with pytest.raises(etptr.InvalidArgumentError):
        etptr.make_tensor_ptr(1.0).size(0)


def test_tensor_cannot_be_built_or_pickled():
    with pytest.raises(TypeError, match="make_tensor_ptr"):
        etptr.TensorPtr()
    import pickle
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(etptr.make_tensor_ptr([1.0]))


@pytest.mark.parametrize("call", [
    lambda x: etptr.clone_tensor_ptr(x),
    lambda x: etptr.clone_tensor_ptr(x, type=ST.Float),
    lambda x: etptr.resize_tensor_ptr(x, [1]),
    lambda x: etptr.clone_tensor_ptr_to_device(x),
    lambda x: etptr.clone_tensor_ptr_to_cpu(x),
], ids=["clone", "clone-cast", "resize", "to_device", "to_cpu"])
@pytest.mark.parametrize("bad", [None, 5, np.zeros(2), [1.0], "t"], ids=repr)
def test_tensor_arguments_must_be_tensors(call, bad, host_alloc):
    # Regression: Cython's argument check raised a plain TypeError, not an etptr error.
    with pytest.raises(etptr.InvalidTypeError) as info:
        call(bad)
    assert str(info.value).startswith(f"tensor must be an etptr.TensorPtr, got {bad!r}")
    assert host_alloc.allocate_count == 0


def test_repr():
    buf = f32(6)
    t = etptr.make_tensor_ptr([2, 3], buf.ctypes.data, dim_order=[1, 0], type=ST.Float,
                              dynamism=Dyn.STATIC, device="cuda:1")
    assert repr(t) == (f"TensorPtr(sizes=(2, 3), dim_order=(1, 0), strides=(1, 2), "
                       f"scalar_type=Float, shape_dynamism=STATIC, device='cuda:1', "
                       f"data_ptr=0x{buf.ctypes.data:x})")


def test_properties_are_read_only():
    t = etptr.make_tensor_ptr([2], [1.0, 2.0])
    for name in ("sizes", "dim_order", "strides", "scalar_type", "shape_dynamism", "device",
                 "data_ptr", "nbytes", "readonly"):
        with pytest.raises(AttributeError):
            setattr(t, name, getattr(t, name))
