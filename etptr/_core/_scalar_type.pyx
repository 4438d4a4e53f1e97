"""ExecuTorch scalar types: codes, element sizes, ``canCast`` and the NumPy mapping.

Mirrors ``runtime/core/exec_aten/util/scalar_type_util.h``.
"""
import numpy as np

from etptr._core._error cimport raise_error
from etptr._core._error import Error, NamedIntEnum


class ScalarType(NamedIntEnum):
    """ExecuTorch ``ScalarType`` with ExecuTorch's own codes.

    ``str()`` gives the name ExecuTorch's ``toString(ScalarType)`` gives
    (``"Float"``); ``int()`` gives the code (6).
    """
    Byte = 0
    Char = 1
    Short = 2
    Int = 3
    Long = 4
    Half = 5
    Float = 6
    Double = 7
    ComplexHalf = 8
    ComplexFloat = 9
    ComplexDouble = 10
    Bool = 11
    QInt8 = 12
    QUInt8 = 13
    QInt32 = 14
    BFloat16 = 15
    QUInt4x2 = 16
    QUInt2x4 = 17
    Bits1x8 = 18
    Bits2x4 = 19
    Bits4x2 = 20
    Bits8 = 21
    Bits16 = 22
    Float8_e5m2 = 23
    Float8_e4m3fn = 24
    Float8_e5m2fnuz = 25
    Float8_e4m3fnuz = 26
    UInt16 = 27
    UInt32 = 28
    UInt64 = 29


# sizeof the C type behind each code, in bytes.
cdef int64_t[30] _ELEMENT_SIZE = [
    1, 1, 2, 4, 8, 2, 4, 8, 4, 8, 16, 1, 1, 1, 4, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 4, 8]

# Members of ExecuTorch's ET_FORALL_REALHBBF16_AND_UINT_TYPES: the types a casting copy supports.
cdef bint[30] _CASTABLE = [
    1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]

_SCALAR_TYPES = tuple(ScalarType)


cdef inline bint c_valid_scalar_type(int t) noexcept nogil:
    return 0 <= t < kNumScalarTypes


cdef inline int64_t c_element_size(int t) noexcept nogil:
    return _ELEMENT_SIZE[t] if c_valid_scalar_type(t) else -1


cdef bint c_castable(int t) noexcept nogil:
    return c_valid_scalar_type(t) and _CASTABLE[t]


cdef inline bint _is_complex(int t) noexcept nogil:
    return t == 8 or t == 9 or t == 10


cdef inline bint _is_floating(int t) noexcept nogil:
    # isFloatingType: Half, Float, Double and BFloat16 only (the Float8 types are not
    # floating there, so canCast lets them reach the integral types).
    return t == 5 or t == 6 or t == 7 or t == 15


cdef inline bint _is_integral(int t) noexcept nogil:
    # isIntegralType(t, includeBool=false): Byte, Char, Short, Int, Long only.
    return 0 <= t <= 4


cdef bint c_can_cast(int src, int dst) noexcept nogil:
    # ExecuTorch canCast: complex -> non-complex refused; floating -> integral
    # refused; non-Bool -> Bool refused.
    if _is_complex(src) and not _is_complex(dst):
        return False
    if _is_floating(src) and _is_integral(dst):
        return False
    if src != 11 and dst == 11:
        return False
    return True


_BY_NAME = {t.name: t for t in ScalarType}
_SPELLINGS = ("an etptr.ScalarType, an int code, a ScalarType name such as 'BFloat16', a "
              "NumPy name such as 'float16', a safetensors code such as 'F16', a NumPy dtype "
              "such as numpy.float16 or a torch dtype such as torch.float16")
# safetensors' dtype codes (the format's names)
_BY_CODE = {"F64": ScalarType.Double, "F32": ScalarType.Float, "F16": ScalarType.Half,
            "BF16": ScalarType.BFloat16, "I64": ScalarType.Long, "I32": ScalarType.Int,
            "I16": ScalarType.Short, "I8": ScalarType.Char, "U8": ScalarType.Byte,
            "U16": ScalarType.UInt16, "U32": ScalarType.UInt32, "U64": ScalarType.UInt64,
            "BOOL": ScalarType.Bool, "F8_E4M3": ScalarType.Float8_e4m3fn,
            "F8_E5M2": ScalarType.Float8_e5m2}
# Lower-case spellings that are one type to ExecuTorch (its capitalised name) and another to
# NumPy: they mean two things, so neither is read.
_TWO_MEANINGS = {
    "float": "ExecuTorch's Float is 32-bit (ScalarType.Float, 'float32'); NumPy's 'float' is "
             "float64 (ScalarType.Double, 'float64')",
    "int": "ExecuTorch's Int is 32-bit (ScalarType.Int, 'int32'); NumPy's 'int' is int64 "
           "(ScalarType.Long, 'int64')",
    "byte": "ExecuTorch's Byte is unsigned (ScalarType.Byte, 'uint8'); NumPy's 'byte' is "
            "signed (ScalarType.Char, 'int8')",
    "char": "ExecuTorch's Char is an 8-bit integer (ScalarType.Char, 'int8'); NumPy's 'char' "
            "is a byte string",
}


cdef object c_scalar_type(object t, str argname):
    """``t`` as a ScalarType member.

    Accepts a ScalarType, an int code (0..29), a ScalarType name (``"BFloat16"``),
    or a NumPy dtype or scalar type (``np.dtype("int32")``, ``np.float16``,
    ``ml_dtypes.bfloat16``). Every ``type=`` argument comes through here.
    """
    cdef long code
    if type(t) is ScalarType:
        return t
    if ((isinstance(t, int) or isinstance(t, np.integer))
            and not (isinstance(t, bool) or isinstance(t, np.bool_))):
        code = t if -1 <= t <= 1000 else -1
        if not c_valid_scalar_type(code):
            raise_error(Error.InvalidArgument, f"{argname}={t!r} is not a ScalarType code (0..29)")
        return _SCALAR_TYPES[code]
    if isinstance(t, str):
        st = _BY_NAME.get(t)
        if st is None:
            st = _from_spelling(str(t), argname)   # str(): a numpy.str_ is a str subclass
        return st
    if type(t).__name__ == "dtype" and type(t).__module__ == "torch":
        # torch.float16 and the like, read by name without importing torch
        return _from_spelling(str(t).rpartition(".")[2], argname, str(t))
    if isinstance(t, np.dtype) or (isinstance(t, type) and issubclass(t, np.generic)):
        try:
            dt = np.dtype(t)
        except Exception as exc:  # abstract scalar types such as numpy.floating
            raise_error(Error.InvalidType, f"{argname}={t!r} is not a NumPy dtype: {exc}")
        return _from_dtype(dt, argname)
    hint = ""
    if t is float or t is int or t is bool or t is complex:
        hint = f" (for NumPy's {np.dtype(t)} pass numpy.{np.dtype(t)})"
    raise_error(Error.InvalidType,
                f"{argname} must be {_SPELLINGS}, got {t!r:.80} of type {type(t).__name__}{hint}")


cdef object _from_spelling(str name, str argname, str shown=None):
    """A scalar type named the way safetensors (``"BF16"``) or NumPy (``"bfloat16"``,
    ``"int64"``) names it; a name that means two things, or none, is refused."""
    cdef object dt
    st = _BY_CODE.get(name)
    if st is not None:
        return st
    why = _TWO_MEANINGS.get(name)
    if why is not None:
        raise_error(Error.InvalidArgument,
                    f"{argname}={name!r} means two things: {why}; pass one of those")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        _load_ml_dtypes()
    try:
        dt = np.dtype(name)
    except Exception:
        dt = None
    if dt is not None and dt.isnative:
        st = _FROM_NUMPY.get(dt)
        if st is not None:
            return st
    if shown is not None:
        raise_error(Error.InvalidType, f"{argname}={shown} has no etptr ScalarType")
    _unknown_name(name, argname)


cdef int _unknown_name(str name, str argname) except -1:
    import difflib
    names = list(_BY_NAME)
    folded = {n.lower(): n for n in names}
    close = [folded[name.lower()]] if name.lower() in folded else []
    for match in difflib.get_close_matches(name.lower(), list(folded), n=4, cutoff=0.6):
        if folded[match] not in close:
            close.append(folded[match])
    msg = f"{argname}={name!r} is not a ScalarType name"
    msg += (f"; close names: {', '.join(close[:4])}" if close
            else f"; the names are {', '.join(names)}")
    try:
        dt = np.dtype(name)
    except Exception:
        dt = None
    if dt is not None:
        st = _FROM_NUMPY.get(dt)
        if st is None:
            _load_ml_dtypes()
            st = _FROM_NUMPY.get(dt)
        if st is not None:
            msg += f" (NumPy's {name!r} is ScalarType.{st.name}: pass numpy.dtype({name!r}) for it)"
    raise_error(Error.InvalidArgument, msg)


def element_size(t):
    """Size in bytes of one element of scalar type ``t``.

    Mirrors ExecuTorch ``elementSize(ScalarType)``.

    Parameters
    ----------
    t : ScalarType, int code, ScalarType name (``"BFloat16"``) or NumPy dtype

    Returns
    -------
    int
        bytes

    Raises
    ------
    InvalidTypeError
        ``t`` is none of those spellings, or a dtype with no ScalarType.
    InvalidArgumentError
        ``t`` is an int outside ExecuTorch's codes or an unknown name (the
        message lists close names).
    """
    return c_element_size(c_scalar_type(t, "t"))


def can_cast(from_t, to_t):
    """Whether a value of ``from_t`` may be cast to ``to_t``.

    Mirrors ExecuTorch ``canCast``, which refuses three things and allows every
    other pair:

    * complex (ComplexHalf, ComplexFloat, ComplexDouble) -> non-complex;
    * floating (``isFloatingType``: Half, Float, Double, BFloat16) -> integral
      (``isIntegralType(t, false)``: Byte, Char, Short, Int, Long);
    * any type but Bool -> Bool.

    The Float8 types are not floating for the second rule and UInt16/32/64 are
    not integral for it, so ``can_cast(Float8_e5m2, Byte)`` and
    ``can_cast(Float, UInt32)`` are True.

    Parameters
    ----------
    from_t, to_t : ScalarType, int code, ScalarType name or NumPy dtype

    Returns
    -------
    bool

    Raises
    ------
    InvalidTypeError
        An argument is none of those spellings, or a dtype with no ScalarType.
    InvalidArgumentError
        An argument is an int outside ExecuTorch's codes or an unknown name.
    """
    return bool(c_can_cast(c_scalar_type(from_t, "from_t"), c_scalar_type(to_t, "to_t")))


_TO_NUMPY = {
    0: np.dtype(np.uint8), 1: np.dtype(np.int8), 2: np.dtype(np.int16),
    3: np.dtype(np.int32), 4: np.dtype(np.int64), 5: np.dtype(np.float16),
    6: np.dtype(np.float32), 7: np.dtype(np.float64), 9: np.dtype(np.complex64),
    10: np.dtype(np.complex128), 11: np.dtype(np.bool_), 27: np.dtype(np.uint16),
    28: np.dtype(np.uint32), 29: np.dtype(np.uint64),
}
_ML_DTYPES_NAMES = {15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn",
                    25: "float8_e5m2fnuz", 26: "float8_e4m3fnuz"}
_FROM_NUMPY = {dt: ScalarType(code) for code, dt in _TO_NUMPY.items()}
_ml_loaded = False


cdef _load_ml_dtypes():
    global _ml_loaded
    if _ml_loaded:
        return
    try:
        import ml_dtypes
    except ImportError:
        return
    for code, name in _ML_DTYPES_NAMES.items():
        dt = getattr(ml_dtypes, name, None)
        if dt is not None:
            _TO_NUMPY[code] = np.dtype(dt)
            _FROM_NUMPY[np.dtype(dt)] = ScalarType(code)
    _ml_loaded = True


cdef object c_numpy_dtype(int t):
    dt = _TO_NUMPY.get(t)
    if dt is None and t in _ML_DTYPES_NAMES:
        _load_ml_dtypes()
        dt = _TO_NUMPY.get(t)
        if dt is None:
            raise_error(Error.NotSupported,
                        f"ScalarType.{ScalarType(t).name} needs the ml_dtypes package "
                        f"for a NumPy dtype: pip install ml_dtypes")
    if dt is None:
        raise_error(Error.NotSupported,
                    f"ScalarType.{ScalarType(t).name} has no NumPy dtype")
    return dt


def scalar_type_to_numpy(t):
    """The NumPy dtype holding elements of scalar type ``t``.

    The NumPy side of ExecuTorch's ``ScalarTypeToCppType``: each type maps to
    the dtype of its C type; BFloat16 and the Float8 types map to ``ml_dtypes``
    dtypes.

    Parameters
    ----------
    t : ScalarType, int code, ScalarType name or NumPy dtype

    Returns
    -------
    numpy.dtype

    Raises
    ------
    InvalidTypeError, InvalidArgumentError
        ``t`` is not a scalar type (as for :func:`element_size`).
    NotSupportedError
        ``t`` has no NumPy dtype (ComplexHalf, quantized and bits types), or
        needs ``ml_dtypes`` and it is not installed.
    """
    return c_numpy_dtype(c_scalar_type(t, "t"))


def scalar_type_from_numpy(dtype):
    """The ScalarType of NumPy dtype ``dtype`` (anything ``numpy.dtype()`` accepts).

    Mirrors ExecuTorch ``CppTypeToScalarType``.

    Raises
    ------
    InvalidTypeError
        ``dtype`` is not a dtype or has no ExecuTorch scalar type.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise_error(Error.InvalidType, f"dtype={dtype!r} is not a NumPy dtype: {exc}")
    return _from_dtype(dt, "dtype")


cdef object _from_dtype(object dt, str argname):
    """The ScalarType of the numpy.dtype ``dt``, or InvalidTypeError naming ``argname``."""
    st = _FROM_NUMPY.get(dt)
    if st is None:
        # ml_dtypes' types are not all kind "V" (float8_e5m2 is "f"): try it for any miss
        _load_ml_dtypes()
        st = _FROM_NUMPY.get(dt)
    if st is None:
        st = _FROM_NUMPY.get(dt.newbyteorder("=")) if dt.isnative is False else None
        if st is not None:
            raise_error(Error.InvalidType,
                        f"{argname}={dt!r} is not in native byte order; use the native dtype "
                        f"(convert arrays with astype first)")
        raise_error(Error.InvalidType, f"{argname}={dt!r} has no ExecuTorch ScalarType")
    return st
