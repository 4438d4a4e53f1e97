"""etptr._core._tensor_ptr_maker: for_blob, from_blob and every allocating maker."""
import ctypes
import gc
import inspect

import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import Device, DeviceType
from etptr import ScalarType as ST
from etptr import TensorShapeDynamism as Dyn


def host_values(t):
    """A device or host tensor's elements, as a flat float64 list (through a clone for devices)."""
    if not t.device.is_cpu():
        t = etptr.clone_tensor_ptr_to_cpu(t)
    return np.asarray(t.numpy()).astype(np.float64).ravel(order="K").tolist()


# ------------------------------------------------------------------ for_blob / from_blob

def test_for_blob_setters_chain_and_mutate():
    buf = np.zeros(6, dtype=np.int32)
    seen = []
    m = etptr.for_blob(buf.ctypes.data, [2, 3])
    assert isinstance(m, etptr.TensorPtrMaker)
    for name, arg in (("type", ST.Int), ("dim_order", [1, 0]), ("strides", [1, 2]),
                      ("dynamism", Dyn.STATIC), ("deleter", seen.append), ("device", "cuda:2")):
        assert getattr(m, name)(arg) is m
    t = m.make_tensor_ptr()
    assert (t.sizes, t.dim_order, t.strides, t.scalar_type, t.shape_dynamism, t.device) == \
        ((2, 3), (1, 0), (1, 2), ST.Int, Dyn.STATIC, Device("cuda:2"))
    assert t.data_ptr == buf.ctypes.data
    del t
    gc.collect()
    assert seen == [buf.ctypes.data]


def test_for_blob_builds_independent_tensors():
    buf = np.arange(4, dtype=np.float32)
    m = etptr.for_blob(buf.ctypes.data, [4])
    a = m.make_tensor_ptr()
    b = m.dim_order([0]).make_tensor_ptr()
    assert a is not b and a.data_ptr == b.data_ptr == buf.ctypes.data
    etptr.resize_tensor_ptr(a, [2])
    assert (a.sizes, b.sizes) == ((2,), (4,))


def test_for_blob_copies_sequences():
    buf = np.zeros(6, dtype=np.float32)
    sizes, order, strides = [2, 3], [0, 1], [3, 1]
    m = etptr.for_blob(buf.ctypes.data, sizes).dim_order(order).strides(strides)
    sizes[0] = order[0] = strides[0] = 99
    t = m.make_tensor_ptr()
    assert (t.sizes, t.dim_order, t.strides) == ((2, 3), (0, 1), (3, 1))


def test_for_blob_over_a_buffer_keeps_it_alive():
    t = etptr.for_blob(np.arange(4.0), [2, 2], ST.Double).make_tensor_ptr()
    gc.collect()
    assert t.numpy().tolist() == [[0.0, 1.0], [2.0, 3.0]]


@pytest.mark.parametrize("setup, cls, fragment", [
    (lambda m: m.type("x"), etptr.InvalidArgumentError, "type='x' is not a ScalarType name"),
    (lambda m: m.type(1.5), etptr.InvalidTypeError, "type must be"),
    (lambda m: m.type(40), etptr.InvalidArgumentError, "type=40"),
    (lambda m: m.dim_order([1, 1]), etptr.InvalidArgumentError, "dim_order=(1, 1)"),
    (lambda m: m.strides([1, 1]), etptr.InvalidArgumentError, "strides=(1, 1)"),
    (lambda m: m.dynamism(5), etptr.InvalidArgumentError, "dynamism=5"),
    (lambda m: m.deleter(3), etptr.InvalidTypeError, "deleter=3"),
    (lambda m: m.device("npu"), etptr.InvalidArgumentError, "device='npu'"),
])
def test_for_blob_errors_surface_at_make(setup, cls, fragment):
    buf = np.zeros(4, dtype=np.float32)
    seen = []
    m = etptr.for_blob(buf.ctypes.data, [2, 2]).deleter(seen.append)
    setup(m)
    with pytest.raises(cls) as info:
        m.make_tensor_ptr()
    assert fragment in str(info.value)
    gc.collect()
    assert seen == []


@pytest.mark.parametrize("setup, argname", [
    (lambda addr: etptr.for_blob(addr, 4), "sizes"),
    (lambda addr: etptr.for_blob(addr, [4]).dim_order(0), "dim_order"),
    (lambda addr: etptr.for_blob(addr, [4]).strides(1), "strides"),
    (lambda addr: etptr.for_blob(addr, [4]).strides(1.5), "strides"),
])
def test_for_blob_non_sequences(setup, argname):
    # Regression: list() on these let a bare TypeError escape.
    buf = np.zeros(4, dtype=np.float32)
    with pytest.raises(etptr.InvalidTypeError) as info:
        setup(buf.ctypes.data)
    assert str(info.value).startswith(f"{argname} must be a sequence of ints, got ")


def test_maker_cannot_be_built_directly():
    with pytest.raises(TypeError, match="for_blob"):
        etptr.TensorPtrMaker()


def test_from_blob():
    buf = np.arange(8, dtype=np.int16)
    t = etptr.from_blob(buf.ctypes.data, [2, 4], ST.Short, strides=[4, 1], dynamism=Dyn.STATIC)
    assert t.numpy().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.shape_dynamism is Dyn.STATIC
    f = etptr.from_blob(buf.ctypes.data, [2])
    assert f.scalar_type is ST.Float  # the C++ default type
    a = etptr.from_blob(buf, [4, 2], type=ST.Short, dim_order=[1, 0])
    assert a.strides == (1, 4) and a.data_ptr == buf.ctypes.data
    with pytest.raises(etptr.InvalidArgumentError):
        etptr.from_blob(buf, [100], type=ST.Short)


def test_maker_signatures_follow_cpp_order():
    params = {name: list(inspect.signature(getattr(etptr, name)).parameters)
              for name in ("full", "randint", "from_blob", "empty_strided", "full_like", "randint_like")}
    assert params["full"][:3] == ["sizes", "fill_value", "type"]
    assert params["randint"][:4] == ["low", "high", "sizes", "type"]
    assert params["from_blob"][:3] == ["data", "sizes", "type"]
    assert params["empty_strided"][:3] == ["sizes", "strides", "type"]
    assert params["full_like"][:3] == ["other", "fill_value", "type"]
    assert params["randint_like"][:3] == ["other", "low", "high"]
    for name in ("empty", "zeros", "ones", "rand", "randn", "full", "randint", "empty_like"):
        assert inspect.signature(getattr(etptr, name)).parameters["device"].kind is \
            inspect.Parameter.KEYWORD_ONLY


# ------------------------------------------------------------------ allocating makers on the host

@pytest.mark.parametrize("stype", [ST.Float, ST.Double, ST.Long, ST.Byte, ST.Bool, ST.QInt8,
                                   ST.ComplexHalf, ST.Bits16])
def test_empty_any_type(stype):
    t = etptr.empty([3, 4], stype)
    assert (t.sizes, t.strides, t.scalar_type, t.nbytes) == ((3, 4), (4, 1), stype,
                                                            12 * etptr.element_size(stype))
    assert t.data_ptr != 0 and t.readonly is False
    ctypes.memset(t.data_ptr, 0x5A, t.nbytes)  # the memory is really there
    assert ctypes.string_at(t.data_ptr, t.nbytes) == b"\x5a" * t.nbytes


def test_empty_strided_and_zero_size():
    t = etptr.empty_strided([2, 3, 4], [1, 8, 2])
    assert (t.dim_order, t.strides) == ((1, 2, 0), (1, 8, 2))
    z = etptr.empty([0, 3])
    assert (z.numel(), z.nbytes) == (0, 0) and z.data_ptr != 0
    s = etptr.empty([])
    assert (s.sizes, s.numel(), s.shape_dynamism) == ((), 1, Dyn.STATIC)


INF = float("inf")
F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("value, stype, expected", [
    (7, ST.Float, 7.0), (2.5, ST.Double, 2.5), (-3, ST.Int, -3), (1 << 40, ST.Long, 1 << 40),
    (3, ST.Half, 3.0), (1.5, ST.BFloat16, 1.5), (True, ST.Bool, True), (False, ST.Bool, False),
    (np.True_, ST.Bool, True), (2, ST.Bool, True), (-7, ST.Bool, True), (0, ST.Bool, False),
    (255, ST.Byte, 255), (0, ST.Byte, 0), (-128, ST.Char, -128), (127, ST.Char, 127),
    (-32768, ST.Short, -32768), (-(1 << 31), ST.Int, -(1 << 31)), ((1 << 63) - 1, ST.Long, (1 << 63) - 1),
    (65535, ST.UInt16, 65535), ((1 << 32) - 1, ST.UInt32, (1 << 32) - 1),
    ((1 << 63) - 1, ST.UInt64, (1 << 63) - 1),
    # UInt64: extract_scalar's range check compares in unsigned arithmetic, so -1 wraps
    (-1, ST.UInt64, (1 << 64) - 1), (-(1 << 63), ST.UInt64, 1 << 63),
    (np.float32(0.5), ST.Float, 0.5), (np.int8(-2), ST.Long, -2), (np.uint16(7), ST.Byte, 7),
    (INF, ST.Half, INF), (-INF, ST.Float, -INF), (INF, ST.BFloat16, INF), (-INF, ST.Double, -INF),
    (65504.0, ST.Half, 65504.0), (-65504.0, ST.Half, -65504.0), (F32_MAX, ST.Float, F32_MAX),
    (1e300, ST.Double, 1e300), (-1e308, ST.Double, -1e308), (3.3895313892515355e38, ST.BFloat16,
                                                             3.3895313892515355e38),
    # an int into a floating type is converted through double, with no range check
    (70000, ST.Half, INF), (-70000, ST.Half, -INF), (1 << 62, ST.Float, float(1 << 62)),
    ((1 << 63) - 1, ST.BFloat16, 9.223372036854775808e18), (3, ST.Double, 3.0),
])
def test_full_values(value, stype, expected):
    t = etptr.full([2, 2], value, type=stype)
    assert t.scalar_type is stype
    got = t.numpy()
    if stype is ST.BFloat16:
        got = got.astype(np.float64)
    assert got.tolist() == [[expected] * 2] * 2
    assert etptr.scalar_tensor(value, type=stype).numpy().astype(got.dtype).tolist() == expected


@pytest.mark.parametrize("stype", [ST.Half, ST.Float, ST.Double, ST.BFloat16])
def test_full_nan_fills_floating_types(stype):
    assert np.isnan(etptr.full([3], float("nan"), type=stype).numpy().astype(np.float64)).all()
    assert np.isnan(etptr.full([1], np.float16("nan"), type=stype).numpy().astype(np.float64)).all()


def test_full_half_and_bfloat16_convert_from_float32():
    # Half(float) and BFloat16(float): the double is rounded to float first, as in C++
    v = 1.0 + 2.0 ** -11 + 2.0 ** -40   # rounds up in one step, to 1 (a tie) through float32
    assert etptr.full([1], v, type=ST.Half).numpy().tolist() == [1.0]
    assert float(np.float16(v)) == 1.0 + 2.0 ** -10
    w = 1.0 + 2.0 ** -8 + 2.0 ** -40
    assert etptr.full([1], w, type=ST.BFloat16).numpy().astype(float).tolist() == [1.0]


@pytest.mark.parametrize("value, stype, fragment", [
    # a float or a bool into an integral type
    (3.5, ST.Int, "fill_value=3.5 cannot fill a ScalarType.Int tensor"),
    (3.0, ST.Long, "fill_value=3.0 cannot fill a ScalarType.Long tensor"),
    (1.5, ST.UInt16, "takes only an int (not a float) for an integral type"),
    (0.0, ST.Byte, "(not a float)"), (np.float32(2), ST.UInt64, "(not a float)"),
    (True, ST.Int, "fill_value=True cannot fill a ScalarType.Int tensor"),
    (np.True_, ST.Byte, "(not a bool)"), (False, ST.UInt64, "(not a bool)"),
    # a float into Bool, a bool into a floating type
    (0.0, ST.Bool, "fill_value=0.0 cannot fill a ScalarType.Bool tensor"),
    (np.float16(1), ST.Bool, "takes only a bool or an int for Bool"),
    (True, ST.Float, "fill_value=True cannot fill a ScalarType.Float tensor"),
    (False, ST.Half, "(not a bool) for a floating type"), (np.True_, ST.BFloat16, "(not a bool)"),
    # an int outside an integral type's range
    (300, ST.Byte, "fill_value=300 is outside the range of ScalarType.Byte (0..255)"),
    (-1, ST.Byte, "fill_value=-1 is outside the range of ScalarType.Byte (0..255)"),
    (70000, ST.Short, "fill_value=70000 is outside the range of ScalarType.Short (-32768..32767)"),
    (128, ST.Char, "(-128..127)"), (-129, ST.Char, "(-128..127)"), (1 << 31, ST.Int, "ScalarType.Int"),
    (-1, ST.UInt16, "ScalarType.UInt16 (0..65535)"), (65536, ST.UInt16, "(0..65535)"),
    (-1, ST.UInt32, "ScalarType.UInt32 (0..4294967295)"), (1 << 32, ST.UInt32, "(0..4294967295)"),
    (np.int64(-5), ST.Byte, "fill_value=np.int64(-5) is outside"),
    # a finite float outside a floating type's range
    (1e300, ST.Float, "fill_value=1e+300 is outside the range of ScalarType.Float"),
    (1e10, ST.Half, "fill_value=10000000000.0 is outside the range of ScalarType.Half"),
    (65505.0, ST.Half, "up to +-65504.0"), (-65520.0, ST.Half, "ScalarType.Half"),
    (3.5e38, ST.Float, "ScalarType.Float"), (-1e39, ST.BFloat16, "ScalarType.BFloat16"),
    (np.float64(1e39), ST.BFloat16, "fill_value=np.float64(1e+39) is outside"),
])
def test_full_refuses_what_extract_scalar_refuses(value, stype, fragment, host_alloc):
    # Regression: these were cast silently (3.5 -> 3, 300 -> 44, 1e300 -> inf, True -> 1).
    other = etptr.zeros([2], type=stype)
    for make in (lambda: etptr.full([2], value, type=stype),
                 lambda: etptr.full_strided([2], [1], value, type=stype),
                 lambda: etptr.full_like(other, value),
                 lambda: etptr.scalar_tensor(value, type=stype),
                 lambda: etptr.full([2], value, type=stype, device="cuda")):
        with pytest.raises(etptr.InvalidArgumentError) as info:
            make()
        assert fragment in str(info.value)
        assert str(info.value).startswith("fill_value=")
    assert host_alloc.allocate_count == 0  # refused before anything was allocated


UNFILLABLE = [t for t in ST if t not in (ST.Byte, ST.Char, ST.Short, ST.Int, ST.Long, ST.Half,
                                          ST.Float, ST.Double, ST.Bool, ST.BFloat16, ST.UInt16,
                                          ST.UInt32, ST.UInt64)]


@pytest.mark.parametrize("stype", UNFILLABLE, ids=lambda t: t.name)
def test_filling_makers_refuse_types_executorch_does_not_fill(stype, host_alloc):
    # ExecuTorch's full_strided and random_strided abort for types outside
    # ET_SWITCH_REALHBBF16_AND_UINT_TYPES; zeros and ones are full(0) and full(1).
    assert len(UNFILLABLE) == 17
    other = etptr.empty([2], stype)
    for make in (lambda: etptr.full([2], 1, type=stype), lambda: etptr.full_like(other, 0),
                 lambda: etptr.scalar_tensor(0, type=stype), lambda: etptr.zeros([2], type=stype),
                 lambda: etptr.zeros_like(other), lambda: etptr.ones([2], type=stype),
                 lambda: etptr.ones_like(other), lambda: etptr.rand([2], type=stype),
                 lambda: etptr.rand_like(other), lambda: etptr.randn([2], type=stype),
                 lambda: etptr.randint(0, 2, [2], type=stype),
                 lambda: etptr.randint_like(other, 0, 2),
                 lambda: etptr.zeros([2], type=stype, device="cuda")):
        with pytest.raises(etptr.NotSupportedError) as info:
            make()
        msg = str(info.value)
        assert msg.startswith(f"type=ScalarType.{stype.name} cannot be filled")
        assert "empty()" in msg
    assert host_alloc.allocate_count == 0
    assert etptr.empty([2], stype).scalar_type is stype


def test_full_strided_zeros_ones_scalar():
    f = etptr.full_strided([2, 3], [1, 2], 4, type=ST.Short)
    assert (f.dim_order, f.numpy().tolist()) == ((1, 0), [[4] * 3] * 2)
    assert etptr.zeros([3], type=ST.Double).numpy().tolist() == [0.0] * 3
    assert etptr.ones([2], type=ST.Bool).numpy().tolist() == [True, True]
    assert etptr.ones([2], type=ST.BFloat16).numpy().astype(float).tolist() == [1.0, 1.0]
    assert etptr.ones([2], type=ST.UInt64).numpy().tolist() == [1, 1]
    assert etptr.zeros([2], type=ST.Bool).numpy().tolist() == [False, False]
    assert etptr.zeros([2], type=ST.Half).numpy().tobytes() == b"\0" * 4
    s = etptr.scalar_tensor(4, type=ST.Int)
    assert (s.sizes, s.shape_dynamism, s.numpy()[()]) == ((), Dyn.STATIC, 4)


def test_rand_and_randn():
    etptr.manual_seed(1234)
    r = etptr.rand([1000]).numpy()
    assert r.dtype == np.float32 and r.min() >= 0.0 and r.max() < 1.0
    assert len(np.unique(r)) > 900
    n = etptr.randn([2000], type=ST.Double).numpy()
    assert abs(n.mean()) < 0.2 and 0.8 < n.std() < 1.2
    assert etptr.rand([8], type=ST.Int).numpy().tolist() == [0] * 8  # [0, 1) cast to int
    rs = etptr.rand_strided([3, 4], [1, 3])
    assert rs.dim_order == (1, 0) and rs.numel() == 12
    ns = etptr.randn_strided([3, 4], [4, 1], type=ST.BFloat16)
    assert ns.scalar_type is ST.BFloat16


@pytest.mark.parametrize("stype, shape, largest", [
    # 1e4 BFloat16 samples and 1e5 Half samples: rounding straight to the narrow type would
    # reach 1.0 about 20 times (every draw within epsilon/4 of 1 rounds up to it)
    (ST.BFloat16, [100, 100], 1 - 2 ** -8), (ST.Half, [1000, 100], 1 - 2 ** -11),
])
@pytest.mark.parametrize("like", [False, True])
def test_rand_half_and_bfloat16_stay_below_one(stype, shape, largest, like):
    # ExecuTorch's rand_strided lowers the upper bound to 1 - epsilon/2 of the type.
    etptr.manual_seed(2024)
    t = etptr.rand_like(etptr.empty(shape, stype)) if like else etptr.rand(shape, type=stype)
    v = t.numpy().astype(np.float64)
    assert t.scalar_type is stype
    assert v.min() >= 0.0 and v.max() < 1.0
    assert v.max() <= largest              # the largest value of the type below one
    assert (v == largest).any()             # and it is reached
    assert 0.45 < v.mean() < 0.55


def test_rand_and_randn_draw_32_bit_floats():
    # ExecuTorch draws float (not double) samples and casts them to the tensor's type.
    etptr.manual_seed(5)
    for fn in (etptr.rand, etptr.randn):
        v = fn([1000], type=ST.Double).numpy()
        assert (v.astype(np.float32).astype(np.float64) == v).all()


@pytest.mark.parametrize("seed, cls", [
    ("x", etptr.InvalidTypeError), (1.5, etptr.InvalidTypeError), (-1, etptr.InvalidArgumentError),
])
def test_manual_seed_bad_seeds(seed, cls):
    # Regression: NumPy's TypeError / ValueError escaped.
    etptr.manual_seed(5)
    first = etptr.rand([3]).numpy().tolist()
    etptr.manual_seed(5)
    with pytest.raises(cls) as info:
        etptr.manual_seed(seed)
    assert str(info.value).startswith(f"seed={seed!r}")
    assert etptr.rand([3]).numpy().tolist() == first  # the generator was left alone


def test_manual_seed_accepts_none_and_numpy_ints():
    etptr.manual_seed(np.uint32(3))
    a = etptr.rand([2]).numpy().tolist()
    etptr.manual_seed(3)
    assert etptr.rand([2]).numpy().tolist() == a
    etptr.manual_seed(None)
    assert etptr.rand([2]).numel() == 2


def test_manual_seed_reproduces():
    etptr.manual_seed(7)
    a = [etptr.rand([5]).numpy().tolist(), etptr.randint(0, 100, [5]).numpy().tolist()]
    etptr.manual_seed(7)
    b = [etptr.rand([5]).numpy().tolist(), etptr.randint(0, 100, [5]).numpy().tolist()]
    assert a == b
    etptr.manual_seed(8)
    assert etptr.rand([5]).numpy().tolist() != a[0]


@pytest.mark.parametrize("low, high, stype", [
    (0, 3, ST.Int), (-5, 5, ST.Long), (10, 20, ST.Short), (0, 2, ST.Bool), (-(1 << 63), (1 << 63) - 1, ST.Long),
    (250, 256, ST.Byte), (0, 1000, ST.Double), (np.int8(-3), np.uint16(3), ST.Char),
])
def test_randint_ranges(low, high, stype):
    etptr.manual_seed(99)
    t = etptr.randint(low, high, [4000], type=stype)
    v = t.numpy()
    assert t.scalar_type is stype
    if stype is ST.Bool:
        assert set(v.tolist()) == {False, True}
    elif high - low <= 10:
        assert set(v.astype(np.int64).tolist()) == set(range(int(low), int(high)))
    else:
        assert v.min() >= low and v.max() < high


def test_randint_strided_and_default_type():
    t = etptr.randint_strided(1, 2, [2, 3], [1, 2])
    assert (t.scalar_type, t.dim_order, t.numpy().tolist()) == (ST.Int, (1, 0), [[1] * 3] * 2)
    assert etptr.randint(0, 1, [3]).numpy().tolist() == [0, 0, 0]


@pytest.mark.parametrize("low, high, cls, fragment", [
    (5, 5, etptr.InvalidArgumentError, "need low < high"),
    (6, 5, etptr.InvalidArgumentError, "need low < high"),
    (0, 1 << 63, etptr.InvalidArgumentError, "within int64"),
    (-(1 << 63) - 1, 0, etptr.InvalidArgumentError, "within int64"),
    (0.0, 5, etptr.InvalidTypeError, "low=0.0 must be an int"),
    (0, "5", etptr.InvalidTypeError, "high='5' must be an int"),
    (False, 5, etptr.InvalidTypeError, "low=False"),
    (None, 5, etptr.InvalidTypeError, "low=None"),
])
def test_randint_bad_bounds(low, high, cls, fragment):
    with pytest.raises(cls) as info:
        etptr.randint(low, high, [2])
    assert fragment in str(info.value)
    other = etptr.zeros([2])
    with pytest.raises(cls):
        etptr.randint_like(other, low, high)
    with pytest.raises(cls):
        etptr.randint_strided(low, high, [2], [1])


@pytest.mark.parametrize("value, fragment", [
    ("1", "fill_value='1' of type str"), (None, "fill_value=None"), (1j, "fill_value=1j"),
    ([1], "fill_value=[1]"), (np.array([1.0]), "fill_value=array"),
])
def test_full_bad_fill_values(value, fragment):
    with pytest.raises(etptr.InvalidTypeError) as info:
        etptr.full([2], value)
    assert fragment in str(info.value)
    with pytest.raises(etptr.InvalidTypeError):
        etptr.full_like(etptr.zeros([2]), value)


@pytest.mark.parametrize("value, cls, fragment", [
    (np.str_("a"), etptr.InvalidTypeError, "of type str_ is not a real number"),
    (np.complex64(1 + 1j), etptr.InvalidTypeError, "of type complex64"),
    (np.datetime64("2020"), etptr.InvalidTypeError, "of type datetime64"),
    (np.timedelta64(3, "s"), etptr.InvalidTypeError, "of type timedelta64 is not a real number"),
    (np.timedelta64(-2, "D"), etptr.InvalidTypeError, "of type timedelta64 is not a real number"),
    (1 << 63, etptr.InvalidArgumentError, f"fill_value={1 << 63} does not fit int64"),
    (-(1 << 63) - 1, etptr.InvalidArgumentError, "does not fit int64"),
    (1 << 1100, etptr.InvalidArgumentError, "does not fit int64"),
    (np.uint64((1 << 64) - 1), etptr.InvalidArgumentError, "does not fit int64"),
])
def test_full_fill_values_executorch_scalar_cannot_hold(value, cls, fragment):
    # Regression: these gave a bare ValueError, a ComplexWarning, a silent wrap to -1,
    # an OverflowError, or (datetime64) a filled tensor.
    for make in (lambda: etptr.full([2], value, type=ST.Long),
                 lambda: etptr.full_like(etptr.zeros([2]), value),
                 lambda: etptr.full_strided([2], [1], value, type=ST.Double)):
        with pytest.raises(cls) as info:
            make()
        assert fragment in str(info.value)


def test_full_int64_limits():
    assert etptr.full([1], (1 << 63) - 1, type=ST.Long).numpy().tolist() == [(1 << 63) - 1]
    assert etptr.full([1], -(1 << 63), type=ST.Long).numpy().tolist() == [-(1 << 63)]
    assert etptr.full([1], 1e300, type=ST.Double).numpy().tolist() == [1e300]


@pytest.mark.parametrize("maker", [etptr.empty, etptr.zeros, etptr.ones, etptr.rand, etptr.randn,
                                   lambda s, **k: etptr.full(s, 1, **k),
                                   lambda s, **k: etptr.randint(0, 2, s, **k)],
                         ids=["empty", "zeros", "ones", "rand", "randn", "full", "randint"])
@pytest.mark.parametrize("sizes, kwargs, cls, fragment", [
    ([-1], {}, etptr.InvalidArgumentError, "sizes[0]=-1"),
    ([1] * 17, {}, etptr.InvalidArgumentError, "17 entries"),
    ([1 << 62], {"type": ST.Double}, etptr.InvalidArgumentError, "byte count overflows"),
    (None, {}, etptr.InvalidArgumentError, "sizes must be a sequence"),
    ("22", {}, etptr.InvalidTypeError, "sizes must be a sequence"),
    ([2], {"type": "flaot"}, etptr.InvalidArgumentError, "type='flaot' is not a ScalarType name"),
    ([2], {"type": 1.5}, etptr.InvalidTypeError, "type must be"),
    ([2], {"type": 31}, etptr.InvalidArgumentError, "type=31"),
    ([2], {"dynamism": 4}, etptr.InvalidArgumentError, "dynamism=4"),
    ([2], {"device": "npu"}, etptr.InvalidArgumentError, "device='npu'"),
    ([2], {"device": None}, etptr.InvalidTypeError, "device must be"),
])
def test_maker_bad_arguments(maker, sizes, kwargs, cls, fragment):
    with pytest.raises(cls) as info:
        maker(sizes, **kwargs)
    assert fragment in str(info.value)


def test_huge_host_allocation_is_a_memory_error():
    with pytest.raises(etptr.MemoryAllocationError) as info:
        etptr.empty([1 << 50], type=ST.Byte)
    assert "could not allocate 1125899906842624 bytes" in str(info.value)
    with pytest.raises(etptr.MemoryAllocationError):
        etptr.zeros([1 << 24, 1 << 26], type=ST.Bool)


# ------------------------------------------------------------------ *_like

LIKE = {
    "empty_like": lambda o, **k: etptr.empty_like(o, **k),
    "zeros_like": lambda o, **k: etptr.zeros_like(o, **k),
    "ones_like": lambda o, **k: etptr.ones_like(o, **k),
    "full_like": lambda o, **k: etptr.full_like(o, 3, **k),
    "rand_like": lambda o, **k: etptr.rand_like(o, **k),
    "randn_like": lambda o, **k: etptr.randn_like(o, **k),
    "randint_like": lambda o, **k: etptr.randint_like(o, 3, 4, **k),
}


@pytest.mark.parametrize("name", list(LIKE))
def test_like_defaults(name):
    other = etptr.make_tensor_ptr([2, 3, 4], None, dim_order=[2, 0, 1], type=ST.Double,
                                  dynamism=Dyn.STATIC)
    t = LIKE[name](other)
    assert (t.sizes, t.dim_order, t.strides, t.scalar_type, t.device) == \
        (other.sizes, other.dim_order, other.strides, ST.Double, other.device)
    assert t.shape_dynamism is Dyn.DYNAMIC_BOUND  # dynamism is a parameter of its own
    assert t.data_ptr not in (0, other.data_ptr)
    values = t.numpy()
    if name in ("zeros_like", "ones_like", "full_like", "randint_like"):
        assert set(values.ravel().tolist()) == {{"zeros_like": 0.0, "ones_like": 1.0}.get(name, 3.0)}
    t2 = LIKE[name](other, type=ST.Float, dynamism=Dyn.DYNAMIC_UNBOUND)
    assert (t2.scalar_type, t2.shape_dynamism, t2.strides) == (ST.Float, Dyn.DYNAMIC_UNBOUND, other.strides)


@pytest.mark.parametrize("name", list(LIKE))
@pytest.mark.parametrize("sizes, dim_order", [([0, 3], [1, 0]), ([1, 3], [1, 0]), ([2, 1, 0], [2, 0, 1])])
def test_like_keeps_dim_order_where_strides_cannot_tell(name, sizes, dim_order):
    # Regression: the dim order was inferred back from other's strides, which loses it
    # for size-0/1 dims; for a zero-size permuted tensor that raised InvalidArgumentError.
    other = etptr.make_tensor_ptr(sizes, None, dim_order=dim_order)
    t = LIKE[name](other)
    assert (t.sizes, t.dim_order, t.strides) == (other.sizes, other.dim_order, other.strides)


@pytest.mark.parametrize("name", list(LIKE))
@pytest.mark.parametrize("bad", [None, [1.0, 2.0], np.zeros(2)], ids=repr)
def test_like_needs_a_tensor(name, bad):
    # Regression: Cython's argument check raised a plain TypeError.
    with pytest.raises(etptr.InvalidTypeError) as info:
        LIKE[name](bad)
    assert str(info.value).startswith(f"other must be an etptr.TensorPtr, got {bad!r}")


@pytest.mark.parametrize("name", list(LIKE))
def test_like_on_a_device(name, host_alloc):
    other = etptr.zeros([2, 2], device="cuda:1")
    before = host_alloc.allocate_count
    t = LIKE[name](other)
    assert t.device == Device("cuda:1")
    assert host_alloc.allocate_count == before + 1
    assert host_alloc.last_allocate_index == 1 and host_alloc.last_allocate_size == 16
    cpu = LIKE[name](other, device="cpu")
    assert cpu.device.is_cpu()
    if name == "ones_like":
        assert host_values(t) == [1.0] * 4


# ------------------------------------------------------------------ device=

@pytest.mark.parametrize("maker, expected", [
    (lambda **k: etptr.zeros([2, 3], **k), [0.0] * 6),
    (lambda **k: etptr.ones([2, 3], **k), [1.0] * 6),
    (lambda **k: etptr.full([2, 3], 2.5, **k), [2.5] * 6),
    (lambda **k: etptr.full_strided([2, 3], [1, 2], 4, **k), [4.0] * 6),
    (lambda **k: etptr.scalar_tensor(9, **k), [9.0]),
    (lambda **k: etptr.randint(5, 6, [2, 3], **k), [5.0] * 6),
    (lambda **k: etptr.rand([2, 3], **k), None),
    (lambda **k: etptr.randn([2, 3], **k), None),
    (lambda **k: etptr.empty([2, 3], **k), None),
    (lambda **k: etptr.empty_strided([2, 3], [1, 2], **k), None),
])
def test_makers_on_a_device(maker, expected, host_alloc):
    t = maker(device="cuda:2")
    assert t.device == Device("cuda:2")
    assert host_alloc.allocate_count == 1 and host_alloc.last_allocate_index == 2
    assert host_alloc.live_bytes == t.nbytes
    if expected is not None:
        assert host_values(t) == expected
    del t
    gc.collect()
    assert host_alloc.live_bytes == 0 and host_alloc.deallocate_count == 1


def test_device_maker_allocation_failure(host_alloc):
    host_alloc.fail_after = 0
    for maker in (lambda: etptr.empty([2], device="cuda"), lambda: etptr.ones([2], device="cuda")):
        with pytest.raises(etptr.MemoryAllocationError):
            maker()
    assert host_alloc.live_bytes == 0 and host_alloc.h2d_count == 0


def test_device_index_minus_one_resolves(py_alloc):
    py_alloc.resolved = 3
    t = etptr.empty([2], device="cuda:-1")
    assert t.device == Device("cuda:3")
    assert py_alloc.named("allocate") == [(8, 3, 8)]
    del t
    gc.collect()
    assert [c[1] for c in py_alloc.named("deallocate")] == [3]


def test_device_makers_without_allocator():
    from etptr._core._device_allocator import _replace_allocator
    prev = _replace_allocator(DeviceType.CUDA, None)
    try:
        for maker in (etptr.empty, etptr.zeros, etptr.rand):
            with pytest.raises(etptr.NotFoundError, match="device=cuda:0"):
                maker([2], device="cuda")
    finally:
        _replace_allocator(DeviceType.CUDA, prev)


def test_bfloat16_makers_match_ml_dtypes():
    t = etptr.full([3], 1.1, type=ST.BFloat16)
    assert t.numpy().tolist() == np.full(3, 1.1).astype(ml_dtypes.bfloat16).tolist()


@pytest.mark.parametrize("spelling, stype", [
    ("Half", ST.Half), (np.float16, ST.Half), (np.dtype("int32"), ST.Int),
    (ml_dtypes.bfloat16, ST.BFloat16), ("UInt16", ST.UInt16), (np.dtype("float64"), ST.Double),
], ids=repr)
def test_makers_take_every_scalar_type_spelling(spelling, stype):
    # Regression: type= took only a ScalarType or an int code.
    other = etptr.zeros([2, 3])
    made = [
        etptr.empty([2], spelling), etptr.empty_strided([2], [1], type=spelling),
        etptr.empty_like(other, spelling), etptr.full([2], 1, type=spelling),
        etptr.full_strided([2], [1], 1, type=spelling), etptr.full_like(other, 1, type=spelling),
        etptr.scalar_tensor(1, type=spelling), etptr.zeros([2], type=spelling),
        etptr.zeros_like(other, type=spelling), etptr.ones([2], type=spelling),
        etptr.ones_like(other, type=spelling), etptr.rand([2], type=spelling),
        etptr.rand_strided([2], [1], type=spelling), etptr.rand_like(other, type=spelling),
        etptr.randn([2], type=spelling), etptr.randn_strided([2], [1], type=spelling),
        etptr.randn_like(other, type=spelling), etptr.randint(0, 2, [2], type=spelling),
        etptr.randint_strided(0, 2, [2], [1], type=spelling),
        etptr.randint_like(other, 0, 2, type=spelling),
        etptr.from_blob(np.zeros(16, np.uint8), [2], spelling),
        etptr.for_blob(np.zeros(16, np.uint8), [2], spelling).make_tensor_ptr(),
        etptr.for_blob(None, [2]).type(spelling).make_tensor_ptr(),
    ]
    assert [t.scalar_type for t in made] == [stype] * len(made)
    assert all(type(t.scalar_type) is ST for t in made)
    assert etptr.ones([2], type=spelling).numpy().astype(np.float64).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("bad, cls, fragment", [
    ("hlaf", etptr.InvalidArgumentError, "type='hlaf' is not a ScalarType name; close names: Half"),
    ("float", etptr.InvalidArgumentError, "type='float' means two things"),
    (np.longdouble, etptr.InvalidTypeError, "type=dtype('float128') has no ExecuTorch ScalarType"),
    (float, etptr.InvalidTypeError, "type must be an etptr.ScalarType"),
    (1.5, etptr.InvalidTypeError, "got 1.5 of type float"),
])
def test_makers_refuse_bad_type_spellings(bad, cls, fragment):
    for make in (lambda: etptr.zeros([2], type=bad), lambda: etptr.full([2], 1, type=bad),
                 lambda: etptr.rand_like(etptr.zeros([2]), type=bad),
                 lambda: etptr.for_blob(None, [2], bad).make_tensor_ptr()):
        with pytest.raises(cls) as info:
            make()
        assert fragment in str(info.value)
