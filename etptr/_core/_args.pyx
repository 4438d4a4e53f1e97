"""Reading integer arguments: the one validator every etptr function uses.

An integer argument is read exactly once (``__index__`` is called once, so a
user type cannot answer differently to a second question), a ``bool`` is
refused, and a value outside the allowed range raises an error that names the
argument and the value. Sequence elements name their position
(``sizes[2]=-1``).
"""
from cpython.number cimport PyNumber_Index
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t

from etptr._core._error cimport raise_error

import numpy as np

from etptr._core._error import Error

_pytype = type


cdef str c_type_name(object x):
    """The name of ``x``'s type, for messages."""
    return _pytype(x).__name__


cdef inline str _label(str argname, Py_ssize_t pos):
    return argname if pos < 0 else f"{argname}[{pos}]"


cdef int64_t c_int_arg(object v, str argname, int64_t lo, int64_t hi,
                       Py_ssize_t pos=-1) except? -1:
    """``v`` as an int64 within ``lo..hi``.

    Raises InvalidTypeError for a bool or a non-integer (naming ``argname``, or
    ``argname[pos]`` when ``pos >= 0``) and InvalidArgumentError for a value
    out of range. Any other exception raised by ``v.__index__`` (a
    KeyboardInterrupt among them) propagates unchanged.
    """
    cdef int64_t i
    if _pytype(v) is int:
        i_obj = v
    else:
        if isinstance(v, bool) or isinstance(v, np.bool_):
            raise_error(Error.InvalidType,
                        f"{_label(argname, pos)}={v!r} is a bool; expected an int")
        try:
            i_obj = PyNumber_Index(v)
        except TypeError:
            raise_error(Error.InvalidType,
                        f"{_label(argname, pos)}={v!r:.80} of type {c_type_name(v)} is not an int")
    if not (lo <= i_obj <= hi):
        if lo == INT64_MIN and hi == INT64_MAX:
            raise_error(Error.InvalidArgument,
                        f"{_label(argname, pos)}={i_obj} does not fit int64")
        raise_error(Error.InvalidArgument,
                    f"{_label(argname, pos)}={i_obj}: must be within {_bound(lo)}..{_bound(hi)}")
    i = i_obj
    return i


cdef str _bound(int64_t b):
    """A range bound as people write it: 2**40 rather than 1099511627776."""
    if b == INT64_MAX:
        return "2**63-1"
    if b == INT64_MIN:
        return "-2**63"
    if b > 65536 and (b & (b - 1)) == 0:
        return f"2**{(<object>b).bit_length() - 1}"
    return str(b)


cdef int64_t c_count_arg(object v, str argname) except -1:
    """A non-negative int64 (a byte count, an element count): ``c_int_arg(v, argname, 0, 2**63-1)``."""
    return c_int_arg(v, argname, 0, INT64_MAX)


cdef int64_t c_result_int(object v, str what, str expected, str out_of_range, int64_t lo,
                          int64_t hi) except? -1:
    """What user code ``what`` returned, checked to be an int in ``lo..hi``:
    InvalidTypeError "``what`` returned ... of type ...; expected ``expected``", or
    InvalidArgumentError "``what`` returned ``v````out_of_range``"."""
    if isinstance(v, bool) or not (isinstance(v, int) or hasattr(_pytype(v), "__index__")):
        raise_error(Error.InvalidType,
                    f"{what} returned {v!r:.80} of type {c_type_name(v)}; expected {expected}")
    i = PyNumber_Index(v)
    if not (lo <= i <= hi):
        raise_error(Error.InvalidArgument, f"{what} returned {i!r}{out_of_range}")
    return i
