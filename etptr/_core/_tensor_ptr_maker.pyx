"""Maker functions: ExecuTorch ``extension/tensor/tensor_ptr_maker.h``.

``for_blob`` (a builder) and ``from_blob`` wrap existing memory; ``empty*``,
``full*``, ``zeros*``, ``ones*``, ``scalar_tensor``, ``rand*``, ``randn*`` and
``randint*`` allocate. Every function takes ``device=``: a device result is
allocated through the registered :class:`DeviceAllocator` (and, for the
filled makers, filled on the host and copied up).
"""
cimport cython
from libc.string cimport memset

import numpy as np

from etptr._core._device cimport Device, c_device
from etptr._core._error cimport raise_error
from etptr._core._tensor_ptr cimport (
    Metadata, TensorPtr, c_device_empty, c_dynamism_arg, c_host_empty, c_metadata,
    c_storage_array, c_tensor_arg, c_type_arg, clone_tensor_ptr_to)

from etptr._core._error import Error
from etptr._core._tensor_ptr import TensorShapeDynamism, make_tensor_ptr

_BOUND = TensorShapeDynamism.DYNAMIC_BOUND
cdef object _rng = np.random.default_rng()


def manual_seed(seed):
    """manual_seed(seed) -> None
    --

    Seed the generator behind ``rand*``, ``randn*`` and ``randint*``.
    """
    global _rng
    _rng = np.random.default_rng(seed)


cdef object _snapshot(object seq):
    """A copy of a list or tuple (later changes by the caller do not reach the builder);
    anything else as it is, for make_tensor_ptr to validate."""
    return list(seq) if isinstance(seq, (list, tuple)) else seq


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

    def __init__(self):
        raise TypeError("use etptr.for_blob(data, sizes, type) to get a TensorPtrMaker")

    def type(self, type):
        """type(type) -> TensorPtrMaker: set the ScalarType."""
        self._type = type
        return self

    def dim_order(self, dim_order):
        """dim_order(dim_order) -> TensorPtrMaker: set the dim order (sequence of int, length ndim)."""
        self._dim_order = _snapshot(dim_order)
        return self

    def strides(self, strides):
        """strides(strides) -> TensorPtrMaker: set the strides (sequence of int, in elements)."""
        self._strides = _snapshot(strides)
        return self

    def dynamism(self, dynamism):
        """dynamism(dynamism) -> TensorPtrMaker: set the TensorShapeDynamism."""
        self._dynamism = dynamism
        return self

    def deleter(self, deleter):
        """deleter(deleter) -> TensorPtrMaker: set ``deleter(address)``, run once when the tensor dies."""
        self._deleter = deleter
        return self

    def device(self, device):
        """device(device) -> TensorPtrMaker: label the memory as living on ``device``."""
        self._device = device
        return self

    def make_tensor_ptr(self):
        """make_tensor_ptr() -> TensorPtr
        --

        Build the tensor. Raises what :func:`etptr.make_tensor_ptr` raises.
        """
        return make_tensor_ptr(self._sizes, self._data, self._dim_order, self._strides,
                               self._type, self._dynamism, self._deleter, self._device)


def for_blob(data, sizes, type=6):
    """for_blob(data, sizes, type=ScalarType.Float) -> TensorPtrMaker
    --

    A builder for a tensor over existing memory (ExecuTorch ``for_blob``).

    Parameters
    ----------
    data : int address, None, or a buffer (kept alive)
    sizes : sequence of int, length ndim
    type : ScalarType
    """
    cdef TensorPtrMaker m = TensorPtrMaker.__new__(TensorPtrMaker)
    m._data = data
    m._sizes = _snapshot(sizes)
    m._type = type
    m._dynamism = _BOUND
    m._device = "cpu"
    return m


def from_blob(data, sizes, type=6, *, dim_order=None, strides=None,
              dynamism=_BOUND, deleter=None, device="cpu"):
    """from_blob(data, sizes, type=ScalarType.Float, *, dim_order=None, strides=None, dynamism=DYNAMIC_BOUND, deleter=None, device="cpu") -> TensorPtr
    --

    A tensor aliasing existing memory (ExecuTorch ``from_blob``).

    ``data`` is an int address (not owned; ``deleter(address)`` runs once when
    the tensor dies) or a buffer (aliased and kept alive). ``device`` labels
    where the memory lives. Raises what :func:`etptr.make_tensor_ptr` raises.
    """
    return make_tensor_ptr(sizes, data, dim_order, strides, type, dynamism, deleter, device)


cdef TensorPtr _empty(Metadata meta, int type, int dyn, Device device):
    if device.c_type == 0:
        return c_host_empty(meta, type, dyn)
    return c_device_empty(meta, type, dyn, device)


cdef TensorPtr _filled(Metadata meta, int type, int dyn, Device device, object fill):
    """A host tensor filled by ``fill(flat storage array)``, then placed on ``device``."""
    cdef TensorPtr t = c_host_empty(meta, type, dyn)
    if t.c_numel:
        fill(c_storage_array(t))
    if device.c_type == 0:
        return t
    return clone_tensor_ptr_to(t, device)


cdef object _fill_value(object value, int type, str argname):
    # ExecuTorch's Scalar: a bool, an int64 or a double
    if isinstance(value, (bool, float, np.bool_, np.floating)):
        return value
    if isinstance(value, (int, np.integer)):
        if not -(1 << 63) <= value <= (1 << 63) - 1:
            raise_error(Error.InvalidArgument,
                        f"{argname}={value!r} does not fit int64 (an ExecuTorch Scalar)")
        return value
    raise_error(Error.InvalidType,
                f"{argname}={value!r} of type {value.__class__.__name__} is not a real number")


def _fill_with(value):
    def fill(a):
        with np.errstate(all="ignore"):
            a[...] = np.asarray(value).astype(a.dtype)
    return fill


def _fill_uniform(a):
    with np.errstate(all="ignore"):
        a[...] = _rng.random(a.shape).astype(a.dtype)


def _fill_normal(a):
    with np.errstate(all="ignore"):
        a[...] = _rng.standard_normal(a.shape).astype(a.dtype)


def _fill_ints(low, high):
    def fill(a):
        with np.errstate(all="ignore"):
            a[...] = _rng.integers(low, high, a.shape, dtype=np.int64).astype(a.dtype)
    return fill


cdef _check_range(object low, object high):
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise_error(Error.InvalidType, f"{name}={v!r} must be an int")
    if not -(1 << 63) <= low < high <= (1 << 63) - 1:
        raise_error(Error.InvalidArgument,
                    f"low={low}, high={high}: need low < high, both within int64")


cdef Metadata _meta(sizes, strides):
    return c_metadata(sizes, None, strides)


# ------------------------------------------------------------------ empty

def empty(sizes, type=6, dynamism=_BOUND, *, device="cpu"):
    """empty(sizes, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    An uninitialised, contiguous tensor (ExecuTorch ``empty``).

    Parameters
    ----------
    sizes : sequence of int, length ndim
    type : ScalarType
    device : Device or str; a device tensor is allocated through the registry

    Raises
    ------
    InvalidArgumentError
        Bad sizes. NotFoundError: no allocator for ``device``.
    MemoryAllocationError
        The memory could not be allocated.
    """
    return _empty(_meta(sizes, None), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                  c_device(device, "device"))


def empty_strided(sizes, strides, type=6, dynamism=_BOUND, *, device="cpu"):
    """empty_strided(sizes, strides, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    An uninitialised tensor with the layout ``strides`` (in elements) describe
    (ExecuTorch ``empty_strided``). The strides must follow from some
    dim_order, as in :func:`make_tensor_ptr`; else ``InvalidArgumentError``.
    """
    return _empty(_meta(sizes, strides), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                  c_device(device, "device"))


def empty_like(other, type=None, dynamism=_BOUND, *, device=None):
    """empty_like(other, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    An uninitialised tensor with ``other``'s sizes and strides; ``type`` and
    ``device`` default to ``other``'s (ExecuTorch ``empty_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _empty(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                  c_dynamism_arg(dynamism),
                  o.c_device if device is None else c_device(device, "device"))


# ------------------------------------------------------------------ full / zeros / ones

def full(sizes, fill_value, type=6, dynamism=_BOUND, *, device="cpu"):
    """full(sizes, fill_value, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    A contiguous tensor with every element ``fill_value`` cast to ``type``
    (ExecuTorch ``full``).

    Raises
    ------
    InvalidTypeError
        ``fill_value`` is not a real number.
    NotSupportedError
        ``type`` has no host representation to fill (quantized, bits, ComplexHalf).
    """
    return full_strided(sizes, None, fill_value, type, dynamism, device=device)


def full_strided(sizes, strides, fill_value, type=6, dynamism=_BOUND, *, device="cpu"):
    """full_strided(sizes, strides, fill_value, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    :func:`full` with the layout ``strides`` (in elements) describe (ExecuTorch ``full_strided``).
    """
    value = _fill_value(fill_value, 0, "fill_value")
    return _filled(_meta(sizes, strides), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_with(value))


def full_like(other, fill_value, type=None, dynamism=_BOUND, *, device=None):
    """full_like(other, fill_value, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`full` with ``other``'s sizes and strides; ``type`` and ``device``
    default to ``other``'s (ExecuTorch ``full_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    value = _fill_value(fill_value, 0, "fill_value")
    return _filled(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_with(value))


def scalar_tensor(value, type=6, dynamism=_BOUND, *, device="cpu"):
    """scalar_tensor(value, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    A 0-dim tensor holding ``value`` cast to ``type`` (ExecuTorch ``scalar_tensor``).
    """
    return full((), value, type, dynamism, device=device)


def zeros(sizes, type=6, dynamism=_BOUND, *, device="cpu"):
    """zeros(sizes, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    A contiguous tensor of zero bytes (ExecuTorch ``zeros``); works for every scalar type.
    """
    return _zeros(_meta(sizes, None), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                  c_device(device, "device"))


def zeros_like(other, type=None, dynamism=_BOUND, *, device=None):
    """zeros_like(other, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`zeros` with ``other``'s sizes and strides (ExecuTorch ``zeros_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _zeros(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                  c_dynamism_arg(dynamism),
                  o.c_device if device is None else c_device(device, "device"))


cdef TensorPtr _zeros(Metadata meta, int type, int dyn, Device device):
    cdef TensorPtr t = c_host_empty(meta, type, dyn)
    if t.c_numel:
        memset(t.c_data, 0, t.c_nbytes())
    if device.c_type == 0:
        return t
    return clone_tensor_ptr_to(t, device)


def ones(sizes, type=6, dynamism=_BOUND, *, device="cpu"):
    """ones(sizes, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    A contiguous tensor of ones (ExecuTorch ``ones``).
    """
    return full_strided(sizes, None, 1, type, dynamism, device=device)


def ones_like(other, type=None, dynamism=_BOUND, *, device=None):
    """ones_like(other, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`ones` with ``other``'s sizes and strides (ExecuTorch ``ones_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return full_like(other, 1, type, dynamism, device=device)


# ------------------------------------------------------------------ random

def rand(sizes, type=6, dynamism=_BOUND, *, device="cpu"):
    """rand(sizes, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    Uniform samples in [0, 1) cast to ``type`` (ExecuTorch ``rand``; an
    integral type therefore gives zeros).
    """
    return _filled(_meta(sizes, None), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_uniform)


def rand_strided(sizes, strides, type=6, dynamism=_BOUND, *, device="cpu"):
    """rand_strided(sizes, strides, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    :func:`rand` with the layout ``strides`` describe (ExecuTorch ``rand_strided``).
    """
    return _filled(_meta(sizes, strides), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_uniform)


def rand_like(other, type=None, dynamism=_BOUND, *, device=None):
    """rand_like(other, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`rand` with ``other``'s sizes and strides (ExecuTorch ``rand_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _filled(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_uniform)


def randn(sizes, type=6, dynamism=_BOUND, *, device="cpu"):
    """randn(sizes, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    Standard normal samples cast to ``type`` (ExecuTorch ``randn``).
    """
    return _filled(_meta(sizes, None), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_normal)


def randn_strided(sizes, strides, type=6, dynamism=_BOUND, *, device="cpu"):
    """randn_strided(sizes, strides, type=ScalarType.Float, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    :func:`randn` with the layout ``strides`` describe (ExecuTorch ``randn_strided``).
    """
    return _filled(_meta(sizes, strides), c_type_arg(type, 6), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_normal)


def randn_like(other, type=None, dynamism=_BOUND, *, device=None):
    """randn_like(other, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`randn` with ``other``'s sizes and strides (ExecuTorch ``randn_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    return _filled(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_normal)


def randint(low, high, sizes, type=3, dynamism=_BOUND, *, device="cpu"):
    """randint(low, high, sizes, type=ScalarType.Int, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    Integers drawn uniformly from [low, high) cast to ``type`` (ExecuTorch ``randint``).

    Raises
    ------
    InvalidArgumentError
        ``low >= high`` or a bound outside int64.
    """
    _check_range(low, high)
    return _filled(_meta(sizes, None), c_type_arg(type, 3), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_ints(low, high))


def randint_strided(low, high, sizes, strides, type=3, dynamism=_BOUND, *, device="cpu"):
    """randint_strided(low, high, sizes, strides, type=ScalarType.Int, dynamism=DYNAMIC_BOUND, *, device="cpu") -> TensorPtr
    --

    :func:`randint` with the layout ``strides`` describe (ExecuTorch ``randint_strided``).
    """
    _check_range(low, high)
    return _filled(_meta(sizes, strides), c_type_arg(type, 3), c_dynamism_arg(dynamism),
                   c_device(device, "device"), _fill_ints(low, high))


def randint_like(other, low, high, type=None, dynamism=_BOUND, *, device=None):
    """randint_like(other, low, high, type=None, dynamism=DYNAMIC_BOUND, *, device=None) -> TensorPtr
    --

    :func:`randint` with ``other``'s sizes and strides (ExecuTorch ``randint_like``).
    """
    cdef TensorPtr o = c_tensor_arg(other, "other")
    _check_range(low, high)
    return _filled(_meta(o.sizes, o.strides), c_type_arg(type, o.c_type),
                   c_dynamism_arg(dynamism),
                   o.c_device if device is None else c_device(device, "device"),
                   _fill_ints(low, high))
