"""etptr._core._scalar_type: element sizes, canCast, and the NumPy dtype mapping."""
import ml_dtypes
import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST

from _helpers import run_isolated

# An independent model of ExecuTorch's canCast (scalar_type_util.h), written by name
# from the three predicates it combines.
COMPLEX = {"ComplexHalf", "ComplexFloat", "ComplexDouble"}              # isComplexType
FLOATING = {"Half", "Float", "Double", "BFloat16"}                      # isFloatingType
INTEGRAL = {"Byte", "Char", "Short", "Int", "Long"}                     # isIntegralType(t, false)
NAMES = ["Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "ComplexHalf",
         "ComplexFloat", "ComplexDouble", "Bool", "QInt8", "QUInt8", "QInt32", "BFloat16",
         "QUInt4x2", "QUInt2x4", "Bits1x8", "Bits2x4", "Bits4x2", "Bits8", "Bits16",
         "Float8_e5m2", "Float8_e4m3fn", "Float8_e5m2fnuz", "Float8_e4m3fnuz", "UInt16",
         "UInt32", "UInt64"]


def model_can_cast(a, b):
    """canCast on names: refuse complex -> non-complex, floating -> integral, non-Bool -> Bool."""
    complex_to_real = a in COMPLEX and b not in COMPLEX
    float_to_int = a in FLOATING and b in INTEGRAL
    to_bool = a != "Bool" and b == "Bool"
    return not (complex_to_real or float_to_int or to_bool)


NUMPY = {
    ST.Byte: np.uint8, ST.Char: np.int8, ST.Short: np.int16, ST.Int: np.int32,
    ST.Long: np.int64, ST.Half: np.float16, ST.Float: np.float32, ST.Double: np.float64,
    ST.ComplexFloat: np.complex64, ST.ComplexDouble: np.complex128, ST.Bool: np.bool_,
    ST.UInt16: np.uint16, ST.UInt32: np.uint32, ST.UInt64: np.uint64,
    ST.BFloat16: ml_dtypes.bfloat16, ST.Float8_e5m2: ml_dtypes.float8_e5m2,
    ST.Float8_e4m3fn: ml_dtypes.float8_e4m3fn, ST.Float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    ST.Float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
}
NO_NUMPY = [t for t in ST if t not in NUMPY]


def test_thirty_scalar_types():
    assert len(ST) == 30
    assert [int(t) for t in ST] == list(range(30))


def test_can_cast_whole_table_matches_executorch_rules():
    assert [t.name for t in ST] == NAMES  # the model's codes are ExecuTorch's
    got = {(a, b): etptr.can_cast(code_a, code_b)
           for code_a, a in enumerate(NAMES) for code_b, b in enumerate(NAMES)}
    assert all(type(v) is bool for v in got.values())
    want = {(a, b): model_can_cast(a, b) for a in NAMES for b in NAMES}
    assert len(got) == 900
    assert {k for k in got if got[k] != want[k]} == set()
    assert sum(want.values()) == 900 - 29 - 3 * 27 - 4 * 5 + 3  # the three rules overlap thrice


@pytest.mark.parametrize("src", [ST.Float8_e5m2, ST.Float8_e4m3fn, ST.Float8_e5m2fnuz,
                                 ST.Float8_e4m3fnuz], ids=lambda t: t.name)
def test_float8_is_not_floating_for_can_cast(src):
    # Regression: the Float8 types were treated as floating and refused integral targets.
    for dst in (ST.Byte, ST.Char, ST.Short, ST.Int, ST.Long):
        assert etptr.can_cast(src, dst) is True
    assert etptr.can_cast(src, ST.Bool) is False
    assert etptr.can_cast(ST.Byte, src) is True


@pytest.mark.parametrize("stype", list(ST), ids=lambda t: t.name)
def test_str_is_executorch_to_string(stype):
    # Regression: str() gave the code ("6") on Python 3.11+ and "ScalarType.Float" before;
    # ExecuTorch's toString(ScalarType) gives the enumerator's name.
    assert str(stype) == f"{stype}" == format(stype) == NAMES[stype]
    assert f"{stype:d}" == str(int(stype)) and f"{stype:>20}" == NAMES[stype].rjust(20)
    assert f"{stype!r}" == f"<ScalarType.{NAMES[stype]}: {int(stype)}>"


def test_can_cast_accepts_plain_and_numpy_ints():
    assert etptr.can_cast(3, 6) is True
    assert etptr.can_cast(np.int64(6), np.uint8(3)) is False


@pytest.mark.parametrize("stype", list(NUMPY), ids=lambda t: t.name)
def test_numpy_round_trip(stype):
    dt = etptr.scalar_type_to_numpy(stype)
    assert dt == np.dtype(NUMPY[stype])
    assert isinstance(dt, np.dtype)
    assert etptr.scalar_type_from_numpy(dt) is stype
    assert dt.itemsize == etptr.element_size(stype)


@pytest.mark.parametrize("stype", NO_NUMPY, ids=lambda t: t.name)
def test_types_without_numpy_dtype(stype):
    with pytest.raises(etptr.NotSupportedError) as info:
        etptr.scalar_type_to_numpy(stype)
    assert stype.name in str(info.value)


@pytest.mark.parametrize("spelling, stype", [
    ("float32", ST.Float), ("f8", ST.Double), ("<i2", ST.Short), (np.int8, ST.Char),
    ("bool", ST.Bool), (np.dtype("uint32"), ST.UInt32), ("bfloat16", ST.BFloat16),
    ("complex64", ST.ComplexFloat), (float, ST.Double), (bool, ST.Bool),
])
def test_from_numpy_accepts_dtype_spellings(spelling, stype):
    assert etptr.scalar_type_from_numpy(spelling) is stype


@pytest.mark.parametrize("bad, cls, fragment", [
    (">f4", etptr.InvalidTypeError, "native byte order"),
    (">i8", etptr.InvalidTypeError, "native byte order"),
    ("O", etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    ("U3", etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    ("M8[s]", etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    ("i4,f4", etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    (np.longdouble, etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    (ml_dtypes.int4, etptr.InvalidTypeError, "has no ExecuTorch ScalarType"),
    (object(), etptr.InvalidTypeError, "dtype="),
])
def test_from_numpy_refuses(bad, cls, fragment):
    with pytest.raises(cls) as info:
        etptr.scalar_type_from_numpy(bad)
    assert fragment in str(info.value)


@pytest.mark.parametrize("fn, args, argname", [
    (etptr.element_size, (6.0,), "t"),
    (etptr.element_size, (True,), "t"),
    (etptr.element_size, (np.True_,), "t"),
    (etptr.element_size, (None,), "t"),
    (etptr.element_size, (b"Float",), "t"),
    (etptr.element_size, (float,), "t"),
    (etptr.can_cast, ([6], ST.Int), "from_t"),
    (etptr.can_cast, (ST.Int, object()), "to_t"),
    (etptr.scalar_type_to_numpy, (np.array([1.0]),), "t"),
])
def test_bad_scalar_type_arguments_are_type_errors(fn, args, argname):
    with pytest.raises(etptr.InvalidTypeError) as info:
        fn(*args)
    msg = str(info.value)
    assert msg.startswith(argname + " must be an etptr.ScalarType, an int code, a ScalarType name")
    assert "NumPy dtype" in msg


# Every spelling of a scalar type: (spelling, the ScalarType it means).
SPELLINGS = [
    (ST.BFloat16, ST.BFloat16), (15, ST.BFloat16), (np.int64(15), ST.BFloat16),
    (np.uint8(3), ST.Int), ("BFloat16", ST.BFloat16), ("Float8_e4m3fnuz", ST.Float8_e4m3fnuz),
    ("QInt8", ST.QInt8), ("Bits16", ST.Bits16), ("UInt64", ST.UInt64), (np.str_("Half"), ST.Half),
    (np.float16, ST.Half), (np.dtype("int32"), ST.Int), (np.dtype(np.float32), ST.Float),
    (np.bool_, ST.Bool), (np.complex128, ST.ComplexDouble), (np.dtype("<u2"), ST.UInt16),
    (ml_dtypes.bfloat16, ST.BFloat16), (np.dtype(ml_dtypes.float8_e5m2), ST.Float8_e5m2),
    (ml_dtypes.float8_e4m3fn, ST.Float8_e4m3fn),
]


@pytest.mark.parametrize("spelling, stype", SPELLINGS, ids=repr)
def test_every_type_argument_takes_names_and_dtypes(spelling, stype):
    # Regression: only a ScalarType or an int code was accepted.
    assert etptr.element_size(spelling) == etptr.element_size(stype)
    assert etptr.can_cast(spelling, ST.Bool) is (stype == ST.Bool)
    assert etptr.can_cast(ST.Bool, spelling) is True
    assert etptr.can_cast(spelling, spelling) is True
    if stype in NUMPY:
        assert etptr.scalar_type_to_numpy(spelling) == np.dtype(NUMPY[stype])
    t = etptr.empty([2, 3], type=spelling)
    assert t.scalar_type is stype and type(t.scalar_type) is ST
    assert etptr.make_tensor_ptr([2], None, type=spelling).scalar_type is stype
    assert etptr.for_blob(None, [2]).type(spelling).make_tensor_ptr().scalar_type is stype


@pytest.mark.parametrize("name, close", [
    ("bfloat_16", ["BFloat16"]), ("Floot", ["Float"]), ("FLOAT8_E5M2", ["Float8_e5m2"]),
    ("Flaot", ["Float"]), ("UInt8", ["QUInt8"]), ("Bits4", ["Bits4x2"]),
    (np.str_("Flaot"), ["Float"]),
])
def test_unknown_names_list_close_names(name, close):
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.element_size(name)
    msg = str(info.value)
    assert msg.startswith(f"t={str(name)!r} is not a ScalarType name; close names: ")
    listed = msg.split("close names: ")[1].split(" (")[0].split(", ")
    assert set(close) <= set(listed) and len(listed) <= 4
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.zeros([2], type=name)
    assert str(info.value).startswith(f"type={str(name)!r} is not a ScalarType name")


def test_unknown_names_without_close_names_list_them_all():
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.can_cast(ST.Float, "xyzzy")
    msg = str(info.value)
    assert msg.startswith("to_t='xyzzy' is not a ScalarType name; the names are Byte, Char,")
    assert all(t.name in msg for t in ST)


@pytest.mark.parametrize("spelling, stype", [
    ("float16", ST.Half), ("float32", ST.Float), ("float64", ST.Double), ("bfloat16", ST.BFloat16),
    ("int8", ST.Char), ("uint8", ST.Byte), ("int16", ST.Short), ("int32", ST.Int),
    ("int64", ST.Long), ("uint16", ST.UInt16), ("uint32", ST.UInt32), ("uint64", ST.UInt64),
    ("bool", ST.Bool), ("float8_e4m3fn", ST.Float8_e4m3fn), ("float8_e5m2", ST.Float8_e5m2),
    ("half", ST.Half), ("double", ST.Double), ("long", ST.Long), ("short", ST.Short),
    ("F64", ST.Double), ("F32", ST.Float), ("F16", ST.Half), ("BF16", ST.BFloat16),
    ("I64", ST.Long), ("I32", ST.Int), ("I16", ST.Short), ("I8", ST.Char), ("U8", ST.Byte),
    ("U16", ST.UInt16), ("U32", ST.UInt32), ("U64", ST.UInt64), ("BOOL", ST.Bool),
    ("F8_E4M3", ST.Float8_e4m3fn), ("F8_E5M2", ST.Float8_e5m2),
])
def test_numpy_and_safetensors_spellings_are_read(spelling, stype):
    assert etptr.empty([2], type=spelling).scalar_type is stype
    assert etptr.element_size(spelling) == etptr.element_size(stype)


def test_torch_dtypes_are_read_without_importing_torch():
    torch = pytest.importorskip("torch")
    pairs = {torch.float16: ST.Half, torch.bfloat16: ST.BFloat16, torch.float32: ST.Float,
             torch.int64: ST.Long, torch.uint8: ST.Byte, torch.bool: ST.Bool,
             torch.float8_e4m3fn: ST.Float8_e4m3fn}
    for dtype, stype in pairs.items():
        assert etptr.empty([1], type=dtype).scalar_type is stype, dtype
    with pytest.raises(etptr.InvalidTypeError, match="torch.quint8 has no etptr ScalarType"):
        etptr.empty([1], type=torch.quint8)


@pytest.mark.parametrize("name, meanings", [
    ("float", "Float is 32-bit .* NumPy's 'float' is float64"),
    ("int", "Int is 32-bit .* NumPy's 'int' is int64"),
    ("byte", "Byte is unsigned .* NumPy's 'byte' is signed"),
    ("char", "Char is an 8-bit integer .* NumPy's 'char' is a byte string"),
])
def test_a_name_that_means_two_things_is_refused(name, meanings):
    with pytest.raises(etptr.InvalidArgumentError, match=f"type={name!r} means two things: "
                                                           f"ExecuTorch's {meanings}"):
        etptr.empty([1], type=name)


@pytest.mark.parametrize("bad, fragment", [
    (np.dtype(">f4"), "t=dtype('>f4') is not in native byte order"),
    (np.longdouble, "t=dtype('float128') has no ExecuTorch ScalarType"),
    (np.dtype("U3"), "t=dtype('<U3') has no ExecuTorch ScalarType"),
    (np.object_, "has no ExecuTorch ScalarType"),
    (ml_dtypes.int4, "t=dtype(int4) has no ExecuTorch ScalarType"),
    (np.floating, "t=<class 'numpy.floating'> is not a NumPy dtype"),
])
def test_dtypes_without_a_scalar_type_are_type_errors(bad, fragment):
    with pytest.raises(etptr.InvalidTypeError) as info:
        etptr.element_size(bad)
    assert fragment in str(info.value)
    with pytest.raises(etptr.InvalidTypeError) as info:
        etptr.rand([2], type=bad)
    assert str(info.value).startswith("type=")


@pytest.mark.parametrize("code", [-1, 30, 255, 1 << 70, -(1 << 70)])
def test_out_of_range_codes_are_invalid_arguments(code):
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.element_size(code)
    assert f"t={code}" in str(info.value)
    with pytest.raises(etptr.InvalidArgumentError) as info:
        etptr.can_cast(ST.Float, code)
    assert f"to_t={code}" in str(info.value)


def test_element_size_is_in_bytes():
    assert etptr.element_size(ST.ComplexDouble) == 16
    assert etptr.element_size(ST.Bits16) == 2
    assert etptr.element_size(ST.QUInt4x2) == 1
    assert etptr.element_size(np.int64(7)) == 8


def test_ml_dtypes_map_in_a_fresh_interpreter():
    # Regression: float8_e5m2 (kind "f", not "V") was refused until something else had
    # made etptr load ml_dtypes, so the answer depended on call order. It goes first here.
    proc = run_isolated("""
        import ml_dtypes, numpy as np, etptr
        for name in ("float8_e5m2", "bfloat16", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz"):
            dt = getattr(ml_dtypes, name)
            print(etptr.scalar_type_from_numpy(dt).name,
                  etptr.make_tensor_ptr(np.zeros(3, dt)).scalar_type.name)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "Float8_e5m2 Float8_e5m2", "BFloat16 BFloat16", "Float8_e4m3fn Float8_e4m3fn",
        "Float8_e5m2fnuz Float8_e5m2fnuz", "Float8_e4m3fnuz Float8_e4m3fnuz"]
