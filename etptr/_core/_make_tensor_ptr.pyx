"""The ``make_tensor_ptr`` overload set, ``clone_tensor_ptr`` and ``resize_tensor_ptr``.

Mirrors the host functions of ExecuTorch ``extension/tensor/tensor_ptr.h``:
which overload runs is picked by what ``data`` is (an address, bytes, a list of
numbers, a buffer, a TensorPtr to view). Every function reads its arguments
once and takes a snapshot of a source tensor's layout before any user code
(an ``__index__``, a buffer exporter) can run, and builds its result from
that snapshot.
"""
cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.number cimport PyNumber_Index
from libc.stdint cimport INT64_MAX, int64_t, uintptr_t
from libc.string cimport memcpy

import numpy as np

from etptr._core._codes cimport DEVICE_CPU, DYNAMISM_STATIC, TYPE_BYTE, TYPE_FLOAT
from etptr._core._args cimport c_type_name
from etptr._core._device cimport Device, c_device
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport (
    Metadata, c_check_sizes, c_dim_order_to_strides, c_fill_metadata, c_fill_strides, c_metadata,
    c_nbytes, c_new_metadata, c_read_ints, c_tuple64)
from etptr._core._scalar_type cimport c_can_cast, c_castable, c_element_size, c_numpy_dtype
from etptr._core._storage cimport Storage, c_check_alive, c_storage
from etptr._core._types cimport dim_order_t, kTensorDimensionLimit, sizes_t, strides_t
from etptr._core._tensor_ptr cimport (
    TensorPtr, c_cpu, c_dynamism_arg, c_host_empty, c_new_tensor, c_snapshot, c_tensor_arg,
    c_type_arg)

from etptr._core._error import Error
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorShapeDynamism

cnp.import_array()

_SCALAR_TYPES = tuple(ScalarType)
class _NotGiven:
    """The default of arguments whose absence picks an overload (``None`` is a value)."""
    __slots__ = ()

    def __repr__(self):
        return "<not given>"


cdef object _MISSING = _NotGiven()

# numpy type number -> ScalarType code, for the ndarray fast path (-1: ask the slow path).
cdef int[64] _NPY_TO_ST
for _i in range(64):
    _NPY_TO_ST[_i] = -1
_NPY_TO_ST[<int>cnp.NPY_UINT8] = 0
_NPY_TO_ST[<int>cnp.NPY_INT8] = 1
_NPY_TO_ST[<int>cnp.NPY_INT16] = 2
_NPY_TO_ST[<int>cnp.NPY_INT32] = 3
_NPY_TO_ST[<int>cnp.NPY_INT64] = 4
_NPY_TO_ST[<int>cnp.NPY_FLOAT16] = 5
_NPY_TO_ST[<int>cnp.NPY_FLOAT32] = 6
_NPY_TO_ST[<int>cnp.NPY_FLOAT64] = 7
_NPY_TO_ST[<int>cnp.NPY_COMPLEX64] = 9
_NPY_TO_ST[<int>cnp.NPY_COMPLEX128] = 10
_NPY_TO_ST[<int>cnp.NPY_BOOL] = 11
_NPY_TO_ST[<int>cnp.NPY_UINT16] = 27
_NPY_TO_ST[<int>cnp.NPY_UINT32] = 28
_NPY_TO_ST[<int>cnp.NPY_UINT64] = 29


cdef inline str _type_name(int t):
    return _SCALAR_TYPES[t].name


# ------------------------------------------------------------------ data conversion

cdef int _kind_of(object v) except -2:
    """The ScalarType a list element deduces to: Bool, Long, Float, or -1 (not a number)."""
    cdef object tv = type(v)
    if tv is float:
        return 6
    if tv is int:
        return 4
    if tv is bool or isinstance(v, np.bool_):
        return 11
    if isinstance(v, np.timedelta64):     # an np.integer, but a duration, not a number
        return -1
    if isinstance(v, int) or isinstance(v, np.integer):
        return 4
    if isinstance(v, float) or isinstance(v, np.floating):
        return 6
    return -1


cdef int _deduce_list_type(list values) except -1:
    """Float for floats, Long for ints, Bool for bools, Float for empty or mixed."""
    cdef int kind = -1, k
    cdef Py_ssize_t i
    for i in range(len(values)):
        k = _kind_of(values[i])
        if k == -1:
            v = values[i]
            raise_error(Error.InvalidType,
                        f"data[{i}]={v!r:.80} of type {c_type_name(v)} is not a number "
                        f"(data must be a flat list of ints, floats or bools)")
        if kind == -1:
            kind = k
        elif kind != k:
            kind = 6
    return 6 if kind == -1 else kind


cdef object _values_array(list values, int deduced):
    """The Python values as a NumPy array of the deduced type's widest host form."""
    cdef Py_ssize_t i
    if deduced == 11:
        return np.array(values, dtype=np.bool_)
    if deduced == 4:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            for i in range(len(values)):
                v = values[i]
                if not (-(1 << 63) <= v < (1 << 63)):
                    raise_error(Error.InvalidArgument,
                                f"data[{i}]={v} does not fit int64 (ScalarType.Long)")
            raise
    try:
        with np.errstate(over="raise"):
            arr = np.array(values, dtype=np.float64)
    except (OverflowError, FloatingPointError):
        for i in range(len(values)):
            try:
                with np.errstate(over="raise"):
                    np.array([values[i]], dtype=np.float64)
            except (OverflowError, FloatingPointError):
                raise_error(Error.InvalidArgument,
                            f"data[{i}]={values[i]} does not fit a double (the list is deduced "
                            f"as ScalarType.Float)")
        raise
    return arr


cdef object _cast_array(object arr, int type):
    """``arr`` converted element-wise to scalar type ``type`` (a C-style cast)."""
    dtype = c_numpy_dtype(type)
    if arr.dtype == dtype:
        return arr
    # no `return` inside the with block: a failing __exit__ would leak the result
    with np.errstate(all="ignore"):
        out = arr.astype(dtype)
    return out


cdef TensorPtr _from_host_array(Metadata meta, object arr, int type, int dynamism):
    """A tensor owning a copy of the contiguous array ``arr`` (already of ``type``)."""
    cdef TensorPtr t = c_host_empty(meta, type, dynamism)
    cdef int64_t nbytes = t.c_nbytes()
    cdef cnp.ndarray a = np.ascontiguousarray(arr)
    if nbytes:
        memcpy(t.c_data, cnp.PyArray_DATA(a), nbytes)
    return t


cdef int _cast_target(int deduced, int target) except -1:
    """Refuse what ExecuTorch's list overload refuses: a cast canCast forbids
    (InvalidTypeError) or a target outside its switch (NotSupportedError)."""
    if not c_can_cast(deduced, target):
        raise_error(Error.InvalidType,
                    f"type=ScalarType.{_type_name(target)}: cannot cast data deduced "
                    f"as ScalarType.{_type_name(deduced)} to it (canCast refuses)")
    if target != deduced and not c_castable(target):
        raise_error(Error.NotSupported,
                    f"type=ScalarType.{_type_name(target)}: the list overload converts to "
                    f"the real, Half, BFloat16, Bool and unsigned types only (ExecuTorch's "
                    f"ET_FORALL_REALHBBF16_AND_UINT_TYPES)")
    return 0


cdef TensorPtr _from_values(object sizes, object data, object dim_order, object strides,
                            object type, int dynamism):
    """The std::vector<T> overload: copy (and cast) a flat list of numbers."""
    cdef list values = list(data)         # read once; everything below uses this copy
    cdef int deduced = _deduce_list_type(values)
    cdef int target = c_type_arg(type, deduced)
    cdef Metadata meta
    if sizes is None:
        sizes = (len(values),)
    meta = c_metadata(sizes, dim_order, strides)
    if len(values) != meta.numel:
        raise_error(Error.InvalidArgument,
                    f"data has {len(values)} values but sizes={c_tuple64(meta.sizes, meta.dim)} "
                    f"needs {meta.numel}")
    _cast_target(deduced, target)
    return _from_host_array(meta, _cast_array(_values_array(values, deduced), target), target,
                            dynamism)


cdef TensorPtr _from_bytes(object sizes, bytes data, object dim_order, object strides,
                           object type, int dynamism):
    """The std::vector<uint8_t> overload: copy raw bytes."""
    cdef int target = c_type_arg(type, TYPE_FLOAT)
    cdef Metadata meta = c_metadata(sizes, dim_order, strides)
    cdef int64_t need = c_nbytes(meta.numel, target)
    cdef TensorPtr t
    if len(data) != need:
        raise_error(Error.InvalidArgument,
                    f"data holds {len(data)} bytes but sizes={c_tuple64(meta.sizes, meta.dim)} of "
                    f"ScalarType.{_type_name(target)} need exactly {need}")
    t = c_host_empty(meta, target, dynamism)
    if need:
        memcpy(t.c_data, <const char*>data, need)
    return t


cdef int _array_type(cnp.ndarray arr) except -1:
    cdef int num = cnp.PyArray_TYPE(arr)
    if 0 <= num < 64 and _NPY_TO_ST[num] >= 0 and cnp.PyArray_ISNOTSWAPPED(arr):
        return _NPY_TO_ST[num]
    from etptr._core._scalar_type import scalar_type_from_numpy
    return scalar_type_from_numpy(arr.dtype)


cdef TensorPtr _alias_ndarray(cnp.ndarray arr, int dynamism):
    """make_tensor_ptr(ndarray): alias the array with its own shape and strides."""
    cdef Metadata m = c_new_metadata()
    cdef int ndim = cnp.PyArray_NDIM(arr), i
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp* bstrides = cnp.PyArray_STRIDES(arr)
    cdef int64_t itemsize = cnp.PyArray_ITEMSIZE(arr)
    cdef int64_t estrides[kTensorDimensionLimit]
    cdef int type = _array_type(arr)
    cdef uintptr_t data = <uintptr_t>cnp.PyArray_DATA(arr)
    if ndim > kTensorDimensionLimit:
        raise_error(Error.InvalidArgument,
                    f"data has {ndim} dims; ExecuTorch tensors have at most {kTensorDimensionLimit}")
    m.dim = ndim
    for i in range(ndim):
        m.sizes[i] = shape[i]
    c_check_sizes(m)
    if m.numel == 0:
        c_fill_strides(m, NULL, 0)
    else:
        for i in range(ndim):
            if bstrides[i] % itemsize != 0:
                raise_error(Error.InvalidArgument,
                            f"data: byte strides {(<object>arr).strides} are not multiples of the "
                            f"item size {itemsize}; copy it first with numpy.ascontiguousarray(data)")
            estrides[i] = bstrides[i] // itemsize
        try:
            c_fill_strides(m, estrides, ndim)
        except Exception:
            raise_error(Error.InvalidArgument,
                        f"data: the array's strides {c_tuple64(estrides, ndim)} (elements) are "
                        f"not described by any dim_order (negative, broadcast or gapped "
                        f"strides); copy it first with numpy.ascontiguousarray(data)")
    return c_new_tensor(m, type, dynamism, c_cpu(),
                        c_storage(data, cnp.PyArray_NBYTES(arr), arr, None), data,
                        not cnp.PyArray_ISWRITEABLE(arr))


cdef cnp.ndarray _buffer_array(object data):
    """An ndarray sharing ``data``'s memory through the buffer protocol (holding its export)."""
    if isinstance(data, np.ndarray):
        return data
    try:
        mv = memoryview(data)
    except TypeError:
        raise_error(Error.InvalidType,
                    f"data of type {c_type_name(data)} is not an address, bytes, a list of "
                    f"numbers or an object with the buffer protocol" + _foreign_hint(data))
    except (ValueError, BufferError) as exc:  # e.g. a released memoryview
        raise_error(Error.InvalidArgument, f"data of type {c_type_name(data)}: {exc}")
    try:
        arr = np.asarray(mv)
    except Exception:         # a format NumPy cannot read (or warns about): bytes below
        arr = None
    # A structure format has no ScalarType: its bytes, as where NumPy cannot read the
    # format (NumPy 2.4 reads ctypes structures that older versions refused).
    if arr is not None and arr.dtype.names is None:
        return arr
    if not mv.c_contiguous:
        raise_error(Error.InvalidArgument,
                    f"data: the buffer (format {mv.format!r}) is not contiguous; copy it first")
    return np.frombuffer(mv.cast("B"), dtype=np.uint8)


cdef str _foreign_hint(object data):
    if hasattr(data, "__dlpack__"):
        return "; for a torch, CuPy or JAX tensor use etptr.from_dlpack(x)"
    if hasattr(data, "__cuda_array_interface__"):
        return "; for device arrays use etptr.from_cuda_array_interface(x)"
    return ""


cdef TensorPtr _alias_buffer(object sizes, object data, object dim_order, object strides,
                             object type, int dynamism, object deleter, Device device):
    """The raw void* overload with an owner: alias a buffer's memory, keep it alive."""
    cdef cnp.ndarray arr = _buffer_array(data)
    cdef int target
    cdef Metadata meta
    cdef int64_t need, have
    cdef uintptr_t address
    if arr.dtype.hasobject:
        # its memory is PyObject pointers: writing through a tensor would corrupt them
        raise_error(Error.InvalidType,
                    f"data: an array of dtype {arr.dtype} holds Python objects, which a "
                    f"tensor cannot alias; convert it to a numeric dtype first")
    if not (cnp.PyArray_IS_C_CONTIGUOUS(arr) or cnp.PyArray_IS_F_CONTIGUOUS(arr)):
        raise_error(Error.InvalidArgument,
                    f"data: the buffer is not contiguous (strides {(<object>arr).strides}); with "
                    f"explicit sizes it must be one block: copy it with numpy.ascontiguousarray(data)")
    target = _array_type(arr) if type is None else c_type_arg(type, TYPE_BYTE)
    meta = c_metadata(sizes, dim_order, strides)
    need = c_nbytes(meta.numel, target)
    have = cnp.PyArray_NBYTES(arr)
    if have < need:
        raise_error(Error.InvalidArgument,
                    f"data holds {have} bytes but sizes={c_tuple64(meta.sizes, meta.dim)} of "
                    f"ScalarType.{_type_name(target)} span {need}")
    address = <uintptr_t>cnp.PyArray_DATA(arr)
    return c_new_tensor(meta, target, dynamism, device, c_storage(address, have, arr, deleter),
                        address, not cnp.PyArray_ISWRITEABLE(arr))


cdef TensorPtr _alias_address(object sizes, object data, object dim_order, object strides,
                              object type, int dynamism, object deleter, Device device):
    """The raw void* overload: alias an address; ``deleter(address)`` runs once at the end."""
    cdef int target = c_type_arg(type, TYPE_FLOAT)
    cdef Metadata meta
    cdef uintptr_t address = 0
    if data is not None:
        value = PyNumber_Index(data)
        if value < 0 or value > <uintptr_t>-1:
            raise_error(Error.InvalidArgument, f"data={data!r} is not a valid address")
        address = <uintptr_t>value
    meta = c_metadata(sizes, dim_order, strides)
    c_nbytes(meta.numel, target)
    return c_new_tensor(meta, target, dynamism, device, c_storage(address, -1, None, deleter),
                        address, False)


cdef TensorPtr _view(TensorPtr src, object sizes, object dim_order, object strides,
                     object deleter, object device):
    """The alias overload: a view of ``src``'s storage with optional new metadata."""
    cdef Metadata base = c_snapshot(src)          # before any user code runs
    cdef uintptr_t data = <uintptr_t>src.c_data
    cdef Metadata m = c_new_metadata()
    cdef Storage storage = src.c_storage
    cdef Device dev = src.c_device
    cdef bint same_shape
    cdef int i
    m.dim = c_read_ints(sizes, m.sizes, "sizes")
    if m.dim <= 0:
        # None or empty: reuse the source's sizes
        m.dim = base.dim
        memcpy(m.sizes, base.sizes, base.dim * sizeof(sizes_t))
    c_check_sizes(m)
    if m.numel > base.numel:
        raise_error(Error.InvalidArgument,
                    f"sizes={c_tuple64(m.sizes, m.dim)} hold {m.numel} elements, more than the "
                    f"source's {base.numel}; a view may not be larger than its source")
    same_shape = m.dim == base.dim
    if same_shape:
        for i in range(m.dim):
            if m.sizes[i] != base.sizes[i]:
                same_shape = False
                break
    # ExecuTorch's reuse rules: keep the source's dim_order when the rank matches
    # and nothing is overridden; keep its strides when the shape is unchanged.
    if dim_order is None and strides is None and m.dim == base.dim:
        memcpy(m.dim_order, base.dim_order, m.dim * sizeof(dim_order_t))
        if same_shape:
            memcpy(m.strides, base.strides, m.dim * sizeof(strides_t))
        else:
            c_dim_order_to_strides(m.sizes, m.dim_order, m.dim, m.strides)
    else:
        c_fill_metadata(m, dim_order, strides)
    if device is not None:
        dev = c_device(device, "device")
    if deleter is not None:
        # the view's own deleter runs when the view dies; the source stays alive until then
        storage = c_storage(data, -1, src, deleter)
    return c_new_tensor(m, src.c_type, src.c_dynamism, dev, storage, data, src.c_readonly)


# ------------------------------------------------------------------ public functions

def make_tensor_ptr(sizes, data=_MISSING, dim_order=None, strides=None, type=None,
                    dynamism=TensorShapeDynamism.DYNAMIC_BOUND, deleter=None, device=_MISSING):
    """Make a tensor: ExecuTorch's ``make_tensor_ptr`` overload set, picked by ``data``.

    =================================  ===================================================
    ``data``                           behaviour
    =================================  ===================================================
    ``int`` address or ``None``        aliases the address; ``type`` defaults to Float;
                                       ``deleter(address)`` runs once when the last
                                       reference dies; ``device`` only labels the memory
    ``bytes``                          copies; ``len(data)`` must be numel*element_size
    list/tuple of numbers              copies; deduces Float/Long/Bool, casts to ``type``
                                       when ``can_cast`` allows; ``len(data) == numel``
    other buffer (ndarray, memoryview) aliases without copying and keeps it alive; type
                                       from the buffer's format
    =================================  ===================================================

    Short forms: ``make_tensor_ptr(list)`` (1-D), ``make_tensor_ptr(number)``
    (0-dim), ``make_tensor_ptr(ndarray)`` (alias with the array's own shape
    and strides). Alias overload: ``make_tensor_ptr(tensor, sizes=None, *,
    dim_order=None, strides=None, deleter=None, device=None)`` returns a view
    sharing ``tensor``'s memory and keeping it alive. Tensors of other
    libraries (torch, CuPy, JAX) come in through :func:`etptr.from_dlpack`.

    Parameters
    ----------
    sizes : sequence of int, length ndim (at most 16)
    data : see above
    dim_order : sequence of int, length ndim, a permutation; empty = ``0..ndim-1``
        or, with ``strides``, the dims by decreasing stride
    strides : sequence of int, in elements; checked against the strides that
        sizes and dim_order give (only size-1 dims may differ)
    type : ScalarType, a NumPy dtype or a ScalarType name
    dynamism : TensorShapeDynamism (a 0-dim tensor is always STATIC)
    deleter : callable(int) or None
    device : Device, DeviceType or str. A copying overload places the copy on
        that device through its allocator; an aliasing overload only labels.

    Raises
    ------
    InvalidArgumentError
        Negative or overflowing sizes, more than 16 dims, a dim_order that is
        not a permutation, strides that disagree with it, data of the wrong
        length, a buffer too small, a view larger than its source.
    InvalidTypeError
        A refused cast, or data of an unsupported Python type.
    NotSupportedError
        A list cast to a type the list overload does not convert to.
    NotFoundError
        No allocator is registered for ``device``.
    """
    cdef int dyn = c_dynamism_arg(dynamism)
    cdef Device dev
    if deleter is not None and not callable(deleter):
        raise_error(Error.InvalidType, f"deleter={deleter!r:.80} is not callable")
    if isinstance(sizes, TensorPtr):
        if type is not None:
            raise_error(Error.InvalidArgument,
                        "type: the alias overload keeps the source's scalar type; cast with "
                        "etptr.clone_tensor_ptr(tensor, type=...)")
        # device: omitted or None inherits the source's; anything else relabels
        return _view(<TensorPtr>sizes, None if data is _MISSING else data, dim_order, strides,
                     deleter, None if device is _MISSING else device)
    dev = c_cpu() if device is _MISSING else c_device(device, "device")
    if data is _MISSING:
        return _short_form(sizes, dim_order, strides, type, dyn, deleter, dev)
    if data is None or (_is_int(data) and not isinstance(data, np.bool_)):
        return _alias_address(sizes, data, dim_order, strides, type, dyn, deleter, dev)
    if isinstance(data, bytes):
        _no_deleter(deleter)
        return _place(_from_bytes(sizes, data, dim_order, strides, type, dyn), dev)
    if isinstance(data, list) or isinstance(data, tuple):
        _no_deleter(deleter)
        return _place(_from_values(sizes, data, dim_order, strides, type, dyn), dev)
    if isinstance(data, TensorPtr):
        raise_error(Error.InvalidType,
                    "data is a TensorPtr: for a view call make_tensor_ptr(tensor, sizes)")
    return _alias_buffer(sizes, data, dim_order, strides, type, dyn, deleter, dev)


cdef bint _is_int(object v) except -1:
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, np.integer)


cdef TensorPtr _short_form(object data, object dim_order, object strides, object type, int dyn,
                           object deleter, Device dev):
    """make_tensor_ptr(data): the first argument is the data."""
    if isinstance(data, np.ndarray):
        if deleter is not None or dim_order is not None or strides is not None:
            raise_error(Error.InvalidArgument,
                        "make_tensor_ptr(ndarray) takes its layout from the array; pass "
                        "sizes and the array to give dim_order or strides")
        if type is not None and c_type_arg(type, TYPE_BYTE) != _array_type(data):
            return _place(_from_values_array(data, c_type_arg(type, TYPE_BYTE), dyn), dev)
        if dev.c_type != DEVICE_CPU:
            raise_error(Error.InvalidArgument,
                        f"device={dev}: make_tensor_ptr(ndarray) aliases host memory; copy "
                        f"it with etptr.clone_tensor_ptr_to(tensor, '{dev}')")
        return _alias_ndarray(<cnp.ndarray>data, dyn)
    if isinstance(data, list) or isinstance(data, tuple):
        _no_deleter(deleter)
        return _place(_from_values(None, data, dim_order, strides, type, dyn), dev)
    if _kind_of(data) != -1 or isinstance(data, np.generic):
        _no_deleter(deleter)
        c_metadata((), dim_order, strides)  # a 0-dim tensor: both must be empty
        if isinstance(data, np.generic):
            arr = np.asarray(data)
            return _place(_from_values_array(arr, c_type_arg(type, _array_type(arr)), dyn), dev)
        return _place(_from_values((), [data], None, None, type, dyn), dev)
    raise_error(Error.InvalidType,
                f"make_tensor_ptr({c_type_name(data)}): the one-argument form takes a list of "
                f"numbers, a number, a numpy array or a TensorPtr" + _foreign_hint(data))


cdef _no_deleter(object deleter):
    if deleter is not None:
        raise_error(Error.InvalidArgument,
                    "deleter: a copying overload (list, number, bytes) owns its memory; only "
                    "the address and buffer overloads take a deleter")


cdef TensorPtr _from_values_array(object arr, int target, int dynamism):
    """ndarray or NumPy scalar converted to ``target`` (std::vector<T> overload semantics)."""
    cdef int src = _array_type(arr)
    if not c_can_cast(src, target):
        raise_error(Error.InvalidType,
                    f"type=ScalarType.{_type_name(target)}: cannot cast "
                    f"ScalarType.{_type_name(src)} data to it (canCast refuses)")
    meta = c_metadata(arr.shape, None, None)
    return _from_host_array(meta, _cast_array(np.ascontiguousarray(arr), target), target, dynamism)


cdef TensorPtr _place(TensorPtr t, Device device):
    if device.c_type == DEVICE_CPU:
        return t
    from etptr._core._device_copy import clone_tensor_ptr_to
    return clone_tensor_ptr_to(t, device)


def clone_tensor_ptr(tensor, type=None):
    """Deep copy of a CPU tensor with the same metadata, optionally cast.

    Mirrors ExecuTorch ``clone_tensor_ptr``. A cast converts each element as a
    C cast would (into a narrower float type by rounding, out-of-range values
    becoming inf; into a narrower integer type by wrapping); the casts that
    ExecuTorch's canCast refuses, float to integer among them, raise. Casting
    copies support Byte, Char, Short, Int, Long, Half, Float, Double,
    Bool, BFloat16, UInt16, UInt32 and UInt64. Null data clones to null data
    of the requested type.

    Parameters
    ----------
    tensor : TensorPtr on the CPU
    type : ScalarType, a NumPy dtype or a ScalarType name; None keeps the type

    Raises
    ------
    InvalidTypeError
        ``can_cast(tensor.scalar_type, type)`` is False.
    NotSupportedError
        The tensor is on a device (use ``clone_tensor_ptr_to``), or a cast
        involves a type outside the list above.
    """
    cdef TensorPtr src = c_tensor_arg(tensor, "tensor")
    cdef int target = c_type_arg(type, src.c_type)
    return c_clone_host(src, target)


cdef TensorPtr c_clone_host(TensorPtr src, int target):
    cdef Metadata meta = c_snapshot(src)
    cdef uintptr_t data = <uintptr_t>src.c_data
    cdef int source_type = src.c_type
    cdef TensorPtr out
    cdef int64_t nbytes
    if src.c_device.c_type != DEVICE_CPU:
        raise_error(Error.NotSupported,
                    f"clone_tensor_ptr copies CPU tensors; this one is on {src.c_device}: "
                    f"use etptr.clone_tensor_ptr_to(tensor, device)")
    if data == 0:
        return c_new_tensor(meta, target, src.c_dynamism, c_cpu(), c_storage(0, -1, None, None),
                            0, False)
    if target != source_type:
        if not c_can_cast(source_type, target):
            raise_error(Error.InvalidType,
                        f"type=ScalarType.{_type_name(target)}: cannot cast "
                        f"ScalarType.{_type_name(source_type)} to it (canCast refuses)")
        for t_ in (source_type, target):
            if not c_castable(t_):
                raise_error(Error.NotSupported,
                            f"clone_tensor_ptr cannot cast ScalarType.{_type_name(t_)}: "
                            f"casting copies support the REALHBBF16 and unsigned types only")
    c_check_alive(src.c_storage, "clone_tensor_ptr")
    out = c_host_empty(meta, target, src.c_dynamism)
    if target == source_type:
        nbytes = out.c_nbytes()
        with nogil:
            memcpy(out.c_data, <const void*>data, nbytes)
    elif meta.numel:
        flat_src = np.frombuffer(_region(src, data, c_nbytes(meta.numel, source_type)),
                                 dtype=c_numpy_dtype(source_type))
        flat_out = np.frombuffer(_region(out, <uintptr_t>out.c_data, out.c_nbytes()),
                                 dtype=c_numpy_dtype(target))
        flat_out[...] = _cast_array(flat_src, target)
    return out


@cython.final
cdef class _Bytes:
    """A flat writable byte buffer over ``nbytes`` at ``address``, keeping ``owner`` alive."""
    cdef object owner
    cdef uintptr_t address
    cdef Py_ssize_t nbytes

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.address, self.nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef _Bytes _region(object owner, uintptr_t address, int64_t nbytes):
    cdef _Bytes r = _Bytes.__new__(_Bytes)
    r.owner = owner
    r.address = address
    r.nbytes = nbytes
    return r


def resize_tensor_ptr(tensor, sizes):
    """Resize ``tensor`` in place with ExecuTorch's rules (``resize_tensor_ptr``).

    The rank may not change; a STATIC tensor may not change its sizes;
    DYNAMIC_BOUND and DYNAMIC_UNBOUND tensors may hold at most the element
    count they were created with. Strides are recomputed from the dim_order.
    A refusal leaves the tensor unchanged.

    Parameters
    ----------
    tensor : TensorPtr
    sizes : sequence of int, length ``tensor.dim()``

    Raises
    ------
    NotSupportedError
        A rank change, a STATIC size change, or more elements than the bound.
    InvalidArgumentError
        Negative or overflowing sizes.
    """
    cdef TensorPtr src = c_tensor_arg(tensor, "tensor")
    cdef Metadata m = c_new_metadata()
    cdef int i
    cdef bint same = True
    m.dim = c_read_ints(sizes, m.sizes, "sizes")
    if m.dim < 0:
        raise_error(Error.InvalidArgument, "sizes must be a sequence of ints, got None")
    c_check_sizes(m)
    # from here on no user code runs: the checks and the update see one state of the tensor
    if m.dim != src.c_dim:
        raise_error(Error.NotSupported,
                    f"sizes={c_tuple64(m.sizes, m.dim)} has {m.dim} dims but the tensor has "
                    f"{src.c_dim}; resize cannot change the rank")
    for i in range(m.dim):
        if m.sizes[i] != src.c_sizes[i]:
            same = False
    if same:
        return None
    if src.c_dynamism == DYNAMISM_STATIC:
        raise_error(Error.NotSupported,
                    f"sizes={c_tuple64(m.sizes, m.dim)}: the tensor is STATIC and its sizes "
                    f"{src.sizes} cannot change")
    if m.numel > src.c_numel_bound:
        raise_error(Error.NotSupported,
                    f"sizes={c_tuple64(m.sizes, m.dim)} hold {m.numel} elements, more than the "
                    f"{src.c_numel_bound} the tensor was created with")
    memcpy(m.dim_order, src.c_dim_order, m.dim * sizeof(dim_order_t))
    c_dim_order_to_strides(m.sizes, m.dim_order, m.dim, m.strides)
    memcpy(src.c_sizes, m.sizes, m.dim * sizeof(sizes_t))
    memcpy(src.c_strides, m.strides, m.dim * sizeof(strides_t))
    src.c_numel = m.numel
    return None
