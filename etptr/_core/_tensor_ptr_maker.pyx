"""Maker functions: ExecuTorch ``extension/tensor/tensor_ptr_maker.h``.

``for_blob`` (a builder) and ``from_blob`` wrap existing memory; ``empty*``,
``full*``, ``zeros*``, ``ones*``, ``scalar_tensor``, ``rand*``, ``randn*`` and
``randint*`` allocate. Every function takes ``device=``: a device result is
allocated through the registered :class:`DeviceAllocator` (and, for the
filled makers, filled on the host and copied up). ``pinned=True`` takes the
host memory they allocate (the result for ``device="cpu"``, the staging
buffer of a filled device result) from the CUDA allocator's page-locked pool
(``allocate_host``), so that clones to the GPU go in one DMA; without a CUDA
allocator it raises ``NotFoundError``.

Every ``type`` argument takes a :class:`ScalarType`, its int code, its name
(``"BFloat16"``) or a NumPy dtype (``numpy.float16``, ``numpy.dtype("int32")``,
``ml_dtypes.bfloat16``); a name that is not a ScalarType's raises
``InvalidArgumentError`` listing close names, a dtype without a ScalarType
``InvalidTypeError``.
"""
cimport cython
from libc.string cimport memset

import math

import numpy as np

from etptr._core._codes cimport (
    DEVICE_CPU, TYPE_BFLOAT16, TYPE_FLOAT, TYPE_HALF, TYPE_INT, TYPE_UINT64)
from etptr._core._device cimport Device, c_device
from etptr._core._error cimport raise_error
from etptr._core._device_copy cimport c_clone_to
from etptr._core._metadata cimport Metadata, c_metadata
from etptr._core._scalar_type cimport c_castable, c_numpy_dtype
from etptr._core._tensor_ptr cimport (
    TensorPtr, c_device_empty, c_dynamism_arg, c_host_empty, c_host_empty_pinned,
    c_storage_array, c_tensor_arg, c_type_arg)

from etptr._core._error import Error
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorShapeDynamism

_BOUND = TensorShapeDynamism.DYNAMIC_BOUND
cdef object _rng = None        # made on first use: numpy.random costs an import ~10 ms


cdef object _generator():
    global _rng
    if _rng is None:
        _rng = np.random.default_rng()
    return _rng


def manual_seed(seed):
    """Seed the generator behind ``rand*``, ``randn*`` and ``randint*``.
    """
    global _rng
    try:
        _rng = np.random.default_rng(seed)
    except TypeError as exc:
        raise_error(Error.InvalidType, f"seed={seed!r} is not an int: {exc}")
    except ValueError as exc:
        raise_error(Error.InvalidArgument, f"seed={seed!r}: {exc}")


cdef object _snapshot(object seq, str argname):
    """A list copy of a list or tuple, so that later changes by the caller do not
    reach the builder; None stays None; other sequences are kept for
    make_tensor_ptr to validate; a non-sequence raises InvalidTypeError now."""
    if seq is None:
        return None
    if isinstance(seq, (list, tuple)):
        return list(seq)
    if (isinstance(seq, (str, bytes, dict)) or not hasattr(seq, "__len__")
            or not hasattr(seq, "__getitem__")):
        raise_error(Error.InvalidType,
                    f"{argname} must be a sequence of ints, got {seq!r:.80} of type "
                    f"{seq.__class__.__name__}")
    return seq


@cython.final
cdef class TensorPtrMaker:
    """Builder returned by :func:`for_blob` (ExecuTorch ``TensorPtrMaker``).

    Each setter updates the builder in place and returns it, so calls chain:
    ``for_blob(addr, [2, 3], ScalarType.Float).strides([3, 1]).make_tensor_ptr()``.
    """
    cdef object _data
    cdef object _sizes
    cdef object _type
    cdef object _dim_order
    cdef object _strides
    cdef object _dynamism
    cdef object _deleter
    cdef object _device
    cdef bint _deleter_taken      # a tensor was made with _deleter: it runs once, for that one

    def __init__(self):
        raise TypeError("use etptr.for_blob(data, sizes, type) to get a TensorPtrMaker")

    def type(self, type):
        """type(type) -> TensorPtrMaker: set the ScalarType (a ScalarType, code, name or NumPy dtype)."""
        self._type = type
        return self

    def dim_order(self, dim_order):
        """dim_order(dim_order) -> TensorPtrMaker: set the dim order (sequence of int, length ndim)."""
        self._dim_order = _snapshot(dim_order, "dim_order")
        return self

    def strides(self, strides):
        """strides(strides) -> TensorPtrMaker: set the strides (sequence of int, in elements)."""
        self._strides = _snapshot(strides, "strides")
        return self

    def dynamism(self, dynamism):
        """dynamism(dynamism) -> TensorPtrMaker: set the TensorShapeDynamism."""
        self._dynamism = dynamism
        return self

    def deleter(self, deleter):
        """deleter(deleter) -> TensorPtrMaker: set ``deleter(address)``, run once when the tensor dies."""
        self._deleter = deleter
        self._deleter_taken = False
        return self

    def device(self, device):
        """device(device) -> TensorPtrMaker: label the memory as living on ``device``."""
        self._device = device
        return self

    def make_tensor_ptr(self):
        """Build the tensor. Raises what :func:`etptr.make_tensor_ptr` raises.

        A builder with a deleter makes one tensor: the deleter goes to it and runs
        once, when it dies (ExecuTorch's ``make_tensor_ptr() &&`` consumes the
        builder). A second call raises :class:`InvalidStateError` instead of
        handing the same deleter to a second tensor, which would run it twice
        (a double free). A builder without a deleter makes any number of tensors.
        """
        if self._deleter_taken:
            raise_error(Error.InvalidState,
                        "make_tensor_ptr(): this for_blob builder's deleter went to the tensor it "
                        "made first and runs once, when that tensor dies; a second tensor would "
                        "run it again. Make views of the first tensor with "
                        "etptr.make_tensor_ptr(tensor, sizes), or set another .deleter()")
        t = make_tensor_ptr(self._sizes, self._data, self._dim_order, self._strides,
                            self._type, self._dynamism, self._deleter, self._device)
        if self._deleter is not None:
            self._deleter_taken = True
        return t


def for_blob(data, sizes, type=ScalarType.Float):
    """A builder for a tensor over existing memory (ExecuTorch ``for_blob``).

    Parameters
    ----------
    data : int address, None, or a buffer (kept alive)
    sizes : sequence of int, length ndim
    type : ScalarType, int code, ScalarType name or NumPy dtype
    """
    cdef TensorPtrMaker m = TensorPtrMaker.__new__(TensorPtrMaker)
    m._data = data
    m._sizes = _snapshot(sizes, "sizes")
    m._type = type
    m._dynamism = _BOUND
    m._device = "cpu"
    return m


def from_blob(data, sizes, type=ScalarType.Float, *, dim_order=None, strides=None,
              dynamism=_BOUND, deleter=None, device="cpu"):
    """A tensor aliasing existing memory (ExecuTorch ``from_blob``).

    ``data`` is an int address (not owned; ``deleter(address)`` runs once when
    the tensor dies) or a buffer (aliased and kept alive). ``device`` labels
    where the memory lives. Raises what :func:`etptr.make_tensor_ptr` raises.
    """
    return make_tensor_ptr(sizes, data, dim_order, strides, type, dynamism, deleter, device)


cdef TensorPtr _host(Metadata meta, int type, int dyn, bint pinned):
    if pinned:
        return c_host_empty_pinned(meta, type, dyn)
    return c_host_empty(meta, type, dyn)


cdef TensorPtr _empty(Metadata meta, int type, int dyn, Device device, bint pinned):
    if device.c_type == DEVICE_CPU:
        return _host(meta, type, dyn, pinned)
    return c_device_empty(meta, type, dyn, device)


cdef int _check_fillable(int type) except -1:
    # ExecuTorch's full_strided and random_strided switch over
    # ET_SWITCH_REALHBBF16_AND_UINT_TYPES and abort on any other type.
    if not c_castable(type):
        raise_error(Error.NotSupported,
                    f"type=ScalarType.{_SCALAR_TYPES[type].name} cannot be filled: ExecuTorch's "
                    f"full, zeros, ones, rand, randn and randint fill only {_FILLABLE_NAMES}; "
                    f"empty() makes a tensor of any type")
    return 0


cdef TensorPtr _filled(Metadata meta, int type, int dyn, Device device, object fill, bint pinned):
    """A host tensor filled by ``fill(flat storage array)``, then placed on ``device``."""
    _check_fillable(type)
    cdef TensorPtr t = _host(meta, type, dyn, pinned)
    if t.c_numel:
        fill(c_storage_array(t))
    if device.c_type == DEVICE_CPU:
        return t
    return c_clone_to(t, device, None, True)


cdef object _fill_value(object value, str argname):
    """``value`` as an ExecuTorch ``Scalar``: ``(kind, payload)`` with kind "bool",
    "int" (an int64) or "float" (a double)."""
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return ("bool", bool(value))
    if isinstance(value, np.timedelta64) or isinstance(value, np.datetime64):   # numpy.integer subclasses
        raise_error(Error.InvalidType,
                    f"{argname}={value!r} of type {value.__class__.__name__} is not a real number")
    if isinstance(value, float) or isinstance(value, np.floating):
        return ("float", float(value))
    if isinstance(value, int) or isinstance(value, np.integer):
        if not -(1 << 63) <= value <= (1 << 63) - 1:
            raise_error(Error.InvalidArgument,
                        f"{argname}={value!r} does not fit int64 (an ExecuTorch Scalar)")
        return ("int", int(value))
    raise_error(Error.InvalidType,
                f"{argname}={value!r} of type {value.__class__.__name__} is not a real number")


# The value ranges extract_scalar checks, per fillable type.
_INT_RANGE = {0: (0, 255), 1: (-128, 127), 2: (-(1 << 15), (1 << 15) - 1),
              3: (-(1 << 31), (1 << 31) - 1), 4: (-(1 << 63), (1 << 63) - 1),
              27: (0, (1 << 16) - 1), 28: (0, (1 << 32) - 1)}
_FLOAT_MAX = {5: 65504.0, 6: float.fromhex("0x1.fffffep+127"),
              7: float.fromhex("0x1.fffffffffffffp+1023"), 15: float.fromhex("0x1.fep+127")}
_SCALAR_TYPES = tuple(ScalarType)
_FILLABLE_NAMES = ", ".join(t.name for t in ScalarType if c_castable(t))


cdef object _extract(object scalar, object original, int type, str argname):
    """The fill element for ``type``, or an error, as ExecuTorch's ``extract_scalar`` decides.

    ``scalar`` is ``_fill_value``'s (kind, payload); ``original`` is what the
    caller passed, for messages. Returns a NumPy scalar of the type's dtype.
    """
    kind, v = scalar
    st = _SCALAR_TYPES[type]
    dtype = c_numpy_dtype(type)
    if type == 11:                                       # bool: an int or a bool
        if kind == "float":
            raise_error(Error.InvalidArgument,
                        f"{argname}={original!r} cannot fill a ScalarType.Bool tensor: "
                        f"ExecuTorch's extract_scalar takes only a bool or an int for Bool")
        return np.bool_(v)
    if type in _FLOAT_MAX:                               # Half, Float, Double, BFloat16
        if kind == "bool":
            raise_error(Error.InvalidArgument,
                        f"{argname}={original!r} cannot fill a ScalarType.{st.name} tensor: "
                        f"ExecuTorch's extract_scalar takes only a float or an int (not a bool) "
                        f"for a floating type")
        v = float(v)                                     # an int64 goes through double
        if kind == "float" and math.isfinite(v) and abs(v) > _FLOAT_MAX[type]:
            raise_error(Error.InvalidArgument,
                        f"{argname}={original!r} is outside the range of ScalarType.{st.name} "
                        f"(finite values up to +-{_FLOAT_MAX[type]!r}; inf and nan are accepted)")
        with np.errstate(over="ignore"):
            if type == TYPE_HALF or type == TYPE_BFLOAT16:       # from a float32
                return np.float32(v).astype(dtype)
            return np.float64(v).astype(dtype)
    # Byte, Char, Short, Int, Long, UInt16, UInt32, UInt64: an int (not a bool or float)
    if kind != "int":
        raise_error(Error.InvalidArgument,
                    f"{argname}={original!r} cannot fill a ScalarType.{st.name} tensor: "
                    f"ExecuTorch's extract_scalar takes only an int (not a {kind}) for an "
                    f"integral type")
    if type == TYPE_UINT64:
        # extract_scalar compares the int64 with uint64 limits in unsigned arithmetic, so
        # no int64 is out of range: a negative value wraps modulo 2**64
        return np.uint64(v % (1 << 64))
    lo, hi = _INT_RANGE[type]
    if not lo <= v <= hi:
        raise_error(Error.InvalidArgument,
                    f"{argname}={original!r} is outside the range of ScalarType.{st.name} "
                    f"({lo}..{hi})")
    return dtype.type(v)


cdef object _fill_with_value(object scalar, object fill_value, int type, str argname):
    """The fill function for ``full*``: checks the type, then extracts the value."""
    _check_fillable(type)
    element = _extract(scalar, fill_value, type, argname)

    def fill(a):
        a.fill(element)
    return fill


cdef object _uniform_fill(int type):
    # ExecuTorch's rand_strided draws floats from [0, upper) and casts them; for Half and
    # BFloat16, upper is 1 - epsilon/2 of that type, so that rounding never reaches 1.0.
    if type == TYPE_HALF:
        upper = np.float32(1.0 - 2.0 ** -11)             # Half: epsilon 2**-10
    elif type == TYPE_BFLOAT16:
        upper = np.float32(1.0 - 2.0 ** -8)              # BFloat16: epsilon 2**-7
    else:
        upper = None

    def fill(a):
        x = _generator().random(a.shape, dtype=np.float32)
        if upper is not None:
            x *= upper
        with np.errstate(all="ignore"):
            a[...] = x.astype(a.dtype)
    return fill


def _fill_normal(a):
    # ExecuTorch's randn_strided draws float (32-bit) normals and casts them
    with np.errstate(all="ignore"):
        a[...] = _generator().standard_normal(a.shape, dtype=np.float32).astype(a.dtype)


def _fill_ints(low, high):
    def fill(a):
        with np.errstate(all="ignore"):
            a[...] = _generator().integers(low, high, a.shape, dtype=np.int64).astype(a.dtype)
    return fill


cdef _check_range(object low, object high):
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, np.integer)):
            raise_error(Error.InvalidType, f"{name}={v!r} must be an int")
    if not -(1 << 63) <= low < high <= (1 << 63) - 1:
        raise_error(Error.InvalidArgument,
                    f"low={low}, high={high}: need low < high, both within int64")


cdef Metadata _meta(sizes, strides):
    return c_metadata(sizes, None, strides)


cdef Metadata _like_meta(TensorPtr src):
    # src's sizes with src's dim_order: inferring the order back from its strides
    # loses it where sizes are 0 or 1 (and then refuses a zero-size permuted tensor)
    return c_metadata(src.sizes, src.dim_order, None)


# ------------------------------------------------------------------ empty

def empty(sizes, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """An uninitialised, contiguous tensor (ExecuTorch ``empty``).

    Parameters
    ----------
    sizes : sequence of int, length ndim
    type : ScalarType, int code, ScalarType name or NumPy dtype
    device : Device or str; a device tensor is allocated through the registry
    pinned : bool; a CPU tensor in page-locked memory from the CUDA
        allocator's pool (``allocate_host``), returned to the pool when it dies

    Raises
    ------
    InvalidArgumentError
        Bad sizes. NotFoundError: no allocator for ``device`` (or, with
        ``pinned=True``, no CUDA allocator).
    MemoryAllocationError
        The memory could not be allocated.
    """
    return _empty(_meta(sizes, None), c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism),
                  c_device(device, "device"), pinned)


def empty_strided(sizes, strides, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """An uninitialised tensor with the layout ``strides`` (in elements) describe
    (ExecuTorch ``empty_strided``). The strides must follow from some
    dim_order, as in :func:`make_tensor_ptr`; else ``InvalidArgumentError``.
    """
    return _empty(_meta(sizes, strides), c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism),
                  c_device(device, "device"), pinned)


def empty_like(other, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """An uninitialised tensor with ``other``'s sizes and strides; ``type`` and
    ``device`` default to ``other``'s (ExecuTorch ``empty_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _empty(_like_meta(o), c_type_arg(type, o.c_type),
                  c_dynamism_arg(dynamism),
                  o.c_device if device is None else c_device(device, "device"), pinned)


# ------------------------------------------------------------------ full / zeros / ones

def full(sizes, fill_value, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """A contiguous tensor with every element ``fill_value`` (ExecuTorch ``full``).

    Parameters
    ----------
    sizes : sequence of int, length ndim
    fill_value : bool, int or float (Python or NumPy), ExecuTorch's ``Scalar``
    type : ScalarType, int code, ScalarType name or NumPy dtype, default Float
    dynamism : TensorShapeDynamism
    device : Device or str; a device tensor is filled on the host and copied up
    pinned : bool; the host memory from the CUDA allocator's page-locked pool

    Raises
    ------
    InvalidTypeError
        ``fill_value`` is not a real number.
    InvalidArgumentError
        ``fill_value`` does not fit ``type`` by ExecuTorch's ``extract_scalar``
        (see Notes), or does not fit int64; bad sizes.
    NotSupportedError
        ``type`` is not one ExecuTorch's ``full_strided`` fills: Byte, Char,
        Short, Int, Long, Half, Float, Double, Bool, BFloat16, UInt16, UInt32,
        UInt64 (complex, quantized, bits and Float8 types are refused).

    Notes
    -----
    ``fill_value`` is an ExecuTorch ``Scalar`` (a bool, an int64 or a double)
    and is extracted as ``extract_scalar`` in ``tensor_ptr_maker.cpp`` does:

    * integral types (Byte, Char, Short, Int, Long, UInt16, UInt32, UInt64)
      take an int within the type's range; a float or a bool is refused.
      UInt64 is the exception to the range check: ExecuTorch compares in
      unsigned arithmetic, so a negative int wraps modulo 2**64;
    * floating types (Half, Float, Double, BFloat16) take a float whose value,
      if finite, is within the type's range (inf and nan are accepted), or any
      int (converted through double, so a large one may become inf); a bool is
      refused. Half and BFloat16 are converted from the value as a 32-bit float;
    * Bool takes a bool, or an int (nonzero is True); a float is refused.
    """
    return full_strided(sizes, None, fill_value, type, dynamism, device=device, pinned=pinned)


def full_strided(sizes, strides, fill_value, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """:func:`full` with the layout ``strides`` (in elements) describe (ExecuTorch ``full_strided``).

    Raises what :func:`full` raises; strides that no dim_order describes raise
    ``InvalidArgumentError``.
    """
    scalar = _fill_value(fill_value, "fill_value")
    cdef Metadata meta = _meta(sizes, strides)
    cdef int t = c_type_arg(type, TYPE_FLOAT)
    return _filled(meta, t, c_dynamism_arg(dynamism), c_device(device, "device"),
                   _fill_with_value(scalar, fill_value, t, "fill_value"), pinned)


def full_like(other, fill_value, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`full` with ``other``'s sizes and strides; ``type`` and ``device``
    default to ``other``'s (ExecuTorch ``full_like``).

    Raises what :func:`full` raises, and ``InvalidTypeError`` when ``other`` is
    not a TensorPtr.
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    scalar = _fill_value(fill_value, "fill_value")
    cdef int t = c_type_arg(type, o.c_type)
    return _filled(_like_meta(o), t, c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_with_value(scalar, fill_value, t, "fill_value"), pinned)


def scalar_tensor(value, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """A 0-dim tensor holding ``value`` (ExecuTorch ``scalar_tensor``).

    ``value`` is extracted as :func:`full` extracts ``fill_value`` (and errors
    name it ``fill_value``, as ExecuTorch's ``full`` does); a 0-dim tensor is
    STATIC whatever ``dynamism`` says.
    """
    return full((), value, type, dynamism, device=device, pinned=pinned)


def zeros(sizes, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """A contiguous tensor of zeros (ExecuTorch ``zeros``, which is ``full(sizes, 0)``).

    Raises
    ------
    NotSupportedError
        ``type`` is not one :func:`full` fills (complex, quantized, bits and
        Float8 types); :func:`empty` makes those.
    """
    return _zeros(_meta(sizes, None), c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism),
                  c_device(device, "device"), pinned)


def zeros_like(other, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`zeros` with ``other``'s sizes and strides (ExecuTorch ``zeros_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _zeros(_like_meta(o), c_type_arg(type, o.c_type),
                  c_dynamism_arg(dynamism),
                  o.c_device if device is None else c_device(device, "device"), pinned)


cdef TensorPtr _zeros(Metadata meta, int type, int dyn, Device device, bint pinned):
    # full(sizes, 0): every fillable type's zero is all zero bytes
    _check_fillable(type)
    cdef TensorPtr t = _host(meta, type, dyn, pinned)
    if t.c_numel:
        memset(t.c_data, 0, t.c_nbytes())
    if device.c_type == DEVICE_CPU:
        return t
    return c_clone_to(t, device, None, True)


def ones(sizes, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """A contiguous tensor of ones (ExecuTorch ``ones``, which is ``full(sizes, 1)``).

    Raises what :func:`full` raises for the int 1 (so Bool gives True).
    """
    return full_strided(sizes, None, 1, type, dynamism, device=device, pinned=pinned)


def ones_like(other, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`ones` with ``other``'s sizes and strides (ExecuTorch ``ones_like``).
    """
    return full_like(other, 1, type, dynamism, device=device, pinned=pinned)


# ------------------------------------------------------------------ random

def rand(sizes, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """Uniform samples in [0, 1) cast to ``type`` (ExecuTorch ``rand``; an
    integral type therefore gives zeros, Bool gives True but for exact zeros).

    Samples are 32-bit floats, as ExecuTorch draws them. For Half and
    BFloat16 they are drawn from [0, 1 - epsilon/2) of that type (ExecuTorch
    lowers the bound the same way), so rounding to the narrow type never
    gives 1.0.

    Raises
    ------
    NotSupportedError
        ``type`` is not one ExecuTorch fills (see :func:`full`).
    InvalidArgumentError
        Bad sizes.
    """
    cdef Metadata meta = _meta(sizes, None)
    cdef int t = c_type_arg(type, TYPE_FLOAT)
    return _filled(meta, t, c_dynamism_arg(dynamism), c_device(device, "device"),
                   _uniform_fill(t), pinned)


def rand_strided(sizes, strides, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """:func:`rand` with the layout ``strides`` describe (ExecuTorch ``rand_strided``).
    """
    cdef Metadata meta = _meta(sizes, strides)
    cdef int t = c_type_arg(type, TYPE_FLOAT)
    return _filled(meta, t, c_dynamism_arg(dynamism), c_device(device, "device"),
                   _uniform_fill(t), pinned)


def rand_like(other, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`rand` with ``other``'s sizes and strides (ExecuTorch ``rand_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    cdef int t = c_type_arg(type, o.c_type)
    return _filled(_like_meta(o), t, c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _uniform_fill(t), pinned)


def randn(sizes, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """Standard normal samples cast to ``type`` (ExecuTorch ``randn``).

    Raises what :func:`rand` raises.
    """
    return _filled(_meta(sizes, None), c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_normal, pinned)


def randn_strided(sizes, strides, type=ScalarType.Float, dynamism=_BOUND, *, device="cpu", pinned=False):
    """:func:`randn` with the layout ``strides`` describe (ExecuTorch ``randn_strided``).
    """
    return _filled(_meta(sizes, strides), c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_normal, pinned)


def randn_like(other, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`randn` with ``other``'s sizes and strides (ExecuTorch ``randn_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _filled(_like_meta(o), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_normal, pinned)


def randint(low, high, sizes, type=ScalarType.Int, dynamism=_BOUND, *, device="cpu", pinned=False):
    """Integers drawn uniformly from [low, high) cast to ``type`` (ExecuTorch ``randint``).

    Raises
    ------
    InvalidArgumentError
        ``low >= high`` or a bound outside int64.
    InvalidTypeError
        A bound is not an int.
    NotSupportedError
        ``type`` is not one ExecuTorch fills (see :func:`full`).
    """
    _check_range(low, high)
    return _filled(_meta(sizes, None), c_type_arg(type, TYPE_INT), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_ints(low, high), pinned)


def randint_strided(low, high, sizes, strides, type=ScalarType.Int, dynamism=_BOUND, *, device="cpu", pinned=False):
    """:func:`randint` with the layout ``strides`` describe (ExecuTorch ``randint_strided``).
    """
    _check_range(low, high)
    return _filled(_meta(sizes, strides), c_type_arg(type, TYPE_INT), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_ints(low, high), pinned)


def randint_like(other, low, high, type=None, dynamism=_BOUND, *, device=None, pinned=False):
    """:func:`randint` with ``other``'s sizes and strides (ExecuTorch ``randint_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    _check_range(low, high)
    return _filled(_like_meta(o), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_ints(low, high), pinned)
