"""etptr._core._tensor_ptr: alias views, clone_tensor_ptr with casts, resize_tensor_ptr."""
import ctypes
import gc
import itertools

import numpy as np
import pytest

import etptr
from etptr import Device, DeviceType
from etptr import ScalarType as ST
from etptr import TensorShapeDynamism as Dyn

BOUND = Dyn.DYNAMIC_BOUND


def mem(t, dtype):
    """A copy of the tensor's storage, read straight from data_ptr."""
    return np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=dtype)


def f32(n):
    return np.arange(n, dtype=np.float32)


# ================================================================== the overload set

# ================================================================== views

class TestViews:
    def src(self, **kw):
        return etptr.make_tensor_ptr([2, 3], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], **kw)

    def test_alias_shares_everything(self):
        s = self.src(dim_order=[1, 0], dynamism=Dyn.DYNAMIC_UNBOUND)
        v = etptr.make_tensor_ptr(s)
        assert v is not s
        assert (v.sizes, v.dim_order, v.strides, v.scalar_type, v.shape_dynamism, v.device,
                v.data_ptr) == (s.sizes, s.dim_order, s.strides, s.scalar_type,
                                s.shape_dynamism, s.device, s.data_ptr)

    def test_empty_sizes_reuse_source(self):
        s = self.src()
        assert etptr.make_tensor_ptr(s, []).sizes == (2, 3)
        assert etptr.make_tensor_ptr(s, None).sizes == (2, 3)

    def test_same_rank_reshape_keeps_dim_order_and_recomputes_strides(self):
        s = self.src(dim_order=[1, 0])
        v = etptr.make_tensor_ptr(s, [3, 2])
        assert (v.dim_order, v.strides) == ((1, 0), (1, 3))

    def test_rank_change_uses_default_dim_order(self):
        s = self.src(dim_order=[1, 0])
        v = etptr.make_tensor_ptr(s, [6])
        assert (v.dim_order, v.strides) == ((0,), (1,))
        assert v.numpy().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]

    def test_overrides(self):
        s = self.src()
        v = etptr.make_tensor_ptr(s, [3, 2], dim_order=[1, 0])
        assert (v.dim_order, v.strides) == ((1, 0), (1, 3))
        w = etptr.make_tensor_ptr(s, strides=[1, 2])
        assert (w.dim_order, w.strides) == ((1, 0), (1, 2))
        assert w.numpy().tolist() == [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]

    def test_smaller_view(self):
        s = self.src()
        v = etptr.make_tensor_ptr(s, [2, 2])
        assert v.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]
        assert etptr.make_tensor_ptr(s, [0]).numel() == 0

    def test_view_writes_through(self):
        s = self.src()
        etptr.make_tensor_ptr(s, [6]).numpy()[5] = 60.0
        assert s.numpy()[1, 2] == 60.0

    def test_view_resizes_alone(self):
        s = self.src(dynamism=Dyn.DYNAMIC_BOUND)
        v = etptr.make_tensor_ptr(s, [3, 2])
        etptr.resize_tensor_ptr(v, [2, 2])
        assert (v.sizes, s.sizes) == ((2, 2), (2, 3))
        with pytest.raises(etptr.NotSupportedError):
            etptr.resize_tensor_ptr(v, [3, 3])

    def test_view_of_view_of_view(self):
        s = self.src()
        v1 = etptr.make_tensor_ptr(s, [6])
        v2 = etptr.make_tensor_ptr(v1, [3, 2])
        v3 = etptr.make_tensor_ptr(v2, [2, 3], dim_order=[1, 0])
        del s, v1, v2
        gc.collect()
        assert v3.numpy().tolist() == [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]

    def test_view_after_resize_is_bounded_by_the_current_size(self):
        s = self.src()
        etptr.resize_tensor_ptr(s, [1, 3])
        with pytest.raises(etptr.InvalidArgumentError) as info:
            etptr.make_tensor_ptr(s, [6])
        assert "more than the source's 3" in str(info.value)
        assert etptr.make_tensor_ptr(s, [3]).numpy().tolist() == [1.0, 2.0, 3.0]

    def test_view_of_null_data(self):
        s = etptr.make_tensor_ptr([4], None, type=ST.Int)
        v = etptr.make_tensor_ptr(s, [2, 2])
        assert (v.data_ptr, v.scalar_type) == (0, ST.Int)

    def test_view_of_a_scalar(self):
        s = etptr.make_tensor_ptr(5.0)
        v = etptr.make_tensor_ptr(s, [1, 1])
        assert v.numpy().tolist() == [[5.0]] and v.shape_dynamism is Dyn.STATIC
        etptr.resize_tensor_ptr(v, [1, 1])
        with pytest.raises(etptr.NotSupportedError):
            etptr.resize_tensor_ptr(v, [1, 0])

    def test_view_device_label(self, host_alloc):
        d = etptr.clone_tensor_ptr_to(self.src(), "cuda:1")
        v = etptr.make_tensor_ptr(d, [6])
        assert v.device == Device("cuda:1") and v.data_ptr == d.data_ptr
        w = etptr.make_tensor_ptr(d, device="cuda:2")
        assert w.device == Device("cuda:2")
        assert host_alloc.allocate_count == 1

    def test_view_relabels_to_cpu_and_none_inherits(self):
        # Regression: an explicit device="cpu" was taken for the default and ignored.
        s = etptr.make_tensor_ptr([4], 4096, device="cuda:1")
        assert etptr.make_tensor_ptr(s, device="cpu").device == Device("cpu")
        assert etptr.make_tensor_ptr(s, device=DeviceType.CPU).device == Device("cpu")
        assert etptr.make_tensor_ptr(s, device=None).device == Device("cuda:1")
        assert etptr.make_tensor_ptr(s, [2, 2]).device == Device("cuda:1")
        with pytest.raises(etptr.InvalidTypeError):
            etptr.make_tensor_ptr(s, device=np.array([1, 2]))

    def test_view_deleter_must_be_callable(self):
        # Regression: a non-callable deleter was accepted for views and failed at teardown.
        s = self.src()
        for bad in (5, "free", [print]):
            with pytest.raises(etptr.InvalidTypeError) as info:
                etptr.make_tensor_ptr(s, [6], deleter=bad)
            assert str(info.value) == f"deleter={bad!r} is not callable"

    @pytest.mark.parametrize("sizes, kwargs, cls, fragment", [
        ([7], {}, etptr.InvalidArgumentError, "sizes=(7,) hold 7 elements, more than the source's 6"),
        ([-1, 6], {}, etptr.InvalidArgumentError, "sizes[0]=-1 is negative"),
        ([1] * 17, {}, etptr.InvalidArgumentError, "sizes has 17 entries"),
        (6, {}, etptr.InvalidTypeError, "sizes must be a sequence"),
        ([2.0, 3.0], {}, etptr.InvalidTypeError, "sizes[0]=2.0"),
        (None, {"type": ST.Int}, etptr.InvalidArgumentError, "type: the alias overload"),
        (None, {"strides": [1, 1]}, etptr.InvalidArgumentError, "strides=(1, 1) disagree"),
        (None, {"dim_order": [0, 0]}, etptr.InvalidArgumentError, "dim_order=(0, 0) is not a permutation"),
        (None, {"dim_order": [0]}, etptr.InvalidArgumentError, "dim_order=(0,) has 1 entries"),
        (None, {"device": "xpu"}, etptr.InvalidArgumentError, "device='xpu'"),
        (None, {"dynamism": 7}, etptr.InvalidArgumentError, "dynamism=7"),
    ])
    def test_view_errors(self, sizes, kwargs, cls, fragment):
        s = self.src()
        with pytest.raises(cls) as info:
            etptr.make_tensor_ptr(s, sizes, **kwargs)
        assert fragment in str(info.value)
        assert s.sizes == (2, 3)


# ================================================================== clone_tensor_ptr

CASTABLE = [ST.Byte, ST.Char, ST.Short, ST.Int, ST.Long, ST.Half, ST.Float, ST.Double,
            ST.Bool, ST.BFloat16, ST.UInt16, ST.UInt32, ST.UInt64]


def _source(stype):
    """A 2x3 tensor of ``stype`` with values every castable type can hold."""
    if stype is ST.Bool:
        values = [True, False, True, True, False, False]
        arr = np.array(values, dtype=np.bool_)
    elif stype in (ST.Half, ST.Float, ST.Double, ST.BFloat16):
        arr = np.array([0.0, 1.0, 2.75, 100.5, 7.25, 127.0]).astype(etptr.scalar_type_to_numpy(stype))
    else:
        arr = np.array([0, 1, 2, 100, 7, 127]).astype(etptr.scalar_type_to_numpy(stype))
    return etptr.make_tensor_ptr([2, 3], arr, dim_order=[1, 0])


@pytest.mark.parametrize("src_t, dst_t", list(itertools.product(CASTABLE, CASTABLE)),
                         ids=lambda t: t.name)
def test_clone_cast_every_pair(src_t, dst_t):
    src = _source(src_t)
    if not etptr.can_cast(src_t, dst_t):
        with pytest.raises(etptr.InvalidTypeError) as info:
            etptr.clone_tensor_ptr(src, type=dst_t)
        assert f"ScalarType.{dst_t.name}" in str(info.value)
        return
    out = etptr.clone_tensor_ptr(src, type=dst_t)
    assert out.scalar_type is dst_t
    assert (out.sizes, out.dim_order, out.strides, out.shape_dynamism) == \
        (src.sizes, src.dim_order, src.strides, src.shape_dynamism)
    assert out.data_ptr != src.data_ptr
    expected = mem(src, etptr.scalar_type_to_numpy(src_t)).astype(etptr.scalar_type_to_numpy(dst_t))
    got = mem(out, etptr.scalar_type_to_numpy(dst_t))
    assert got.tobytes() == expected.tobytes()


def test_clone_without_cast_is_a_byte_copy_for_any_type():
    for stype in ST:
        n = 3 * etptr.element_size(stype)
        src = etptr.make_tensor_ptr([3], bytes(range(n)), type=stype)
        out = etptr.clone_tensor_ptr(src)
        assert out.scalar_type is stype and out.data_ptr != src.data_ptr
        assert ctypes.string_at(out.data_ptr, n) == bytes(range(n))


@pytest.mark.parametrize("src_t, dst_t", [
    (ST.ComplexFloat, ST.ComplexDouble), (ST.Float, ST.ComplexFloat), (ST.Long, ST.QInt8),
    (ST.Float, ST.Float8_e4m3fn), (ST.Byte, ST.Bits8),
])
def test_clone_cast_outside_the_supported_set(src_t, dst_t):
    src = etptr.make_tensor_ptr([2], bytes(2 * etptr.element_size(src_t)), type=src_t)
    with pytest.raises(etptr.NotSupportedError) as info:
        etptr.clone_tensor_ptr(src, type=dst_t)
    assert "clone_tensor_ptr cannot cast" in str(info.value)


def test_clone_float_special_values_to_unsigned_do_not_crash():
    src = etptr.make_tensor_ptr([np.nan, np.inf, -np.inf, 1e30, -5.0], type=ST.Double)
    for dst in (ST.UInt16, ST.UInt32, ST.UInt64, ST.Half, ST.BFloat16, ST.Float):
        out = etptr.clone_tensor_ptr(src, type=dst)
        assert out.numel() == 5 and out.scalar_type is dst
    half = etptr.clone_tensor_ptr(src, type=ST.Half).numpy()
    assert np.isnan(half[0]) and half[1] == np.inf and half[3] == np.inf


def test_clone_of_null_data():
    src = etptr.make_tensor_ptr([2, 2], None, type=ST.QInt8, dynamism=Dyn.STATIC)
    out = etptr.clone_tensor_ptr(src, type=ST.Bool)  # no can_cast check for null data
    assert (out.data_ptr, out.scalar_type, out.sizes, out.shape_dynamism) == (0, ST.Bool, (2, 2), Dyn.STATIC)


def test_clone_of_read_only_and_view():
    a = np.arange(6.0)
    a.flags.writeable = False
    src = etptr.make_tensor_ptr(a)
    out = etptr.clone_tensor_ptr(etptr.make_tensor_ptr(src, [2, 3]))
    assert out.readonly is False and out.sizes == (2, 3)
    out.numpy()[0, 0] = -1
    assert a[0] == 0 and out.numpy().ravel().tolist() == [-1, 1, 2, 3, 4, 5]


def test_clone_is_bounded_by_the_current_size():
    src = etptr.make_tensor_ptr([2, 3], [1.0] * 6)
    etptr.resize_tensor_ptr(src, [1, 3])
    out = etptr.clone_tensor_ptr(src)
    assert (out.sizes, out.nbytes) == ((1, 3), 12)
    with pytest.raises(etptr.NotSupportedError):
        etptr.resize_tensor_ptr(out, [2, 3])


def test_clone_of_device_tensor_refused(host_alloc):
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
    with pytest.raises(etptr.NotSupportedError) as info:
        etptr.clone_tensor_ptr(d)
    assert "clone_tensor_ptr_to" in str(info.value)


def test_clone_bad_type_argument():
    src = etptr.make_tensor_ptr([1.0])
    with pytest.raises(etptr.InvalidTypeError):
        etptr.clone_tensor_ptr(src, type="Int")
    with pytest.raises(etptr.InvalidArgumentError):
        etptr.clone_tensor_ptr(src, type=99)


# ================================================================== resize_tensor_ptr

class TestResize:
    def test_bound_and_strides(self):
        t = etptr.make_tensor_ptr([2, 3, 4], None, dim_order=[2, 0, 1])
        assert etptr.resize_tensor_ptr(t, [4, 3, 2]) is None
        assert (t.sizes, t.dim_order, t.strides, t.numel(), t.nbytes) == \
            ((4, 3, 2), (2, 0, 1), (3, 1, 12), 24, 96)
        etptr.resize_tensor_ptr(t, [1, 1, 1])
        assert t.numel() == 1
        etptr.resize_tensor_ptr(t, [2, 3, 4])  # back up to the creation bound
        assert t.numel() == 24

    def test_unbound_is_treated_as_bound(self):
        t = etptr.make_tensor_ptr([2, 2], None, dynamism=Dyn.DYNAMIC_UNBOUND)
        with pytest.raises(etptr.NotSupportedError) as info:
            etptr.resize_tensor_ptr(t, [2, 3])
        assert "more than the 4 the tensor was created with" in str(info.value)

    def test_static(self):
        t = etptr.make_tensor_ptr([2, 3], None, dynamism=Dyn.STATIC)
        assert etptr.resize_tensor_ptr(t, (2, 3)) is None  # same sizes: allowed
        with pytest.raises(etptr.NotSupportedError) as info:
            etptr.resize_tensor_ptr(t, [3, 2])
        assert "STATIC" in str(info.value)
        with pytest.raises(etptr.NotSupportedError):
            etptr.resize_tensor_ptr(t, [1, 1])

    def test_rank_change(self):
        t = etptr.make_tensor_ptr([2, 3], None)
        with pytest.raises(etptr.NotSupportedError) as info:
            etptr.resize_tensor_ptr(t, [6])
        assert "cannot change the rank" in str(info.value)

    def test_scalar(self):
        t = etptr.make_tensor_ptr(2.0)
        assert etptr.resize_tensor_ptr(t, []) is None
        assert t.sizes == () and t.numel() == 1
        with pytest.raises(etptr.NotSupportedError):
            etptr.resize_tensor_ptr(t, [1])

    def test_zero_then_back(self):
        t = etptr.make_tensor_ptr([2, 3], [float(i) for i in range(6)])
        etptr.resize_tensor_ptr(t, [0, 3])
        assert (t.numel(), t.nbytes, t.numpy().shape) == (0, 0, (0, 3))
        etptr.resize_tensor_ptr(t, [3, 2])
        assert t.numpy().tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]

    @pytest.mark.parametrize("sizes, cls, fragment", [
        ([-1, 3], etptr.InvalidArgumentError, "sizes[0]=-1 is negative"),
        ([1 << 40, 1 << 40], etptr.InvalidArgumentError, "overflows int64"),
        ([1 << 64, 1], etptr.InvalidArgumentError, "does not fit int64"),
        (None, etptr.InvalidArgumentError, "sizes must be a sequence"),
        ("ab", etptr.InvalidTypeError, "sizes must be a sequence"),
        ([2.0, 3], etptr.InvalidTypeError, "sizes[0]=2.0"),
        ([True, 3], etptr.InvalidTypeError, "sizes[0]=True"),
        ([1] * 17, etptr.InvalidArgumentError, "17 entries"),
        ([3, 3], etptr.NotSupportedError, "hold 9 elements"),
    ])
    def test_refusals_leave_the_tensor_unchanged(self, sizes, cls, fragment):
        t = etptr.make_tensor_ptr([2, 3], None, dim_order=[1, 0])
        with pytest.raises(cls) as info:
            etptr.resize_tensor_ptr(t, sizes)
        assert fragment in str(info.value)
        assert (t.sizes, t.dim_order, t.strides, t.numel()) == ((2, 3), (1, 0), (1, 2), 6)

    def test_handles_and_numpy_views(self):
        t = etptr.make_tensor_ptr([2, 3], [float(i) for i in range(6)])
        old = t.numpy()
        etptr.resize_tensor_ptr(t, [3, 2])
        assert old.shape == (2, 3)  # an existing numpy view keeps its own shape
        assert t.numpy().shape == (3, 2)
        assert old.ctypes.data == t.numpy().ctypes.data
