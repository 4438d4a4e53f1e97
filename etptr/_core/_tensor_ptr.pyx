"""TensorPtr: ExecuTorch tensor metadata over owned or aliased memory.

Mirrors ExecuTorch ``extension/tensor/tensor_ptr.h``: the ``make_tensor_ptr``
overload set, alias views, ``clone_tensor_ptr`` with casts,
``resize_tensor_ptr`` and ``clone_tensor_ptr_to`` between host and device.
Sizes, dim_order and strides live in C arrays inside the tensor; strides are
in elements and always follow from sizes and dim_order, as ExecuTorch
computes them.
"""
cimport cython
cimport numpy as cnp
from cpython.buffer cimport (
    PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer)
from cpython.long cimport PyLong_AsVoidPtr, PyLong_FromVoidPtr
from cpython.number cimport PyNumber_Index
from libc.stdint cimport INT64_MAX, int64_t, uint8_t, uintptr_t
from libc.string cimport memcpy, memset

import warnings
from collections.abc import Mapping

import numpy as np

from etptr._core._device cimport Device, c_device, c_make_device
from etptr._core._device_allocator cimport c_get_allocator
from etptr._core._error cimport raise_error
from etptr._core._scalar_type cimport (
    c_can_cast, c_castable, c_element_size, c_numpy_dtype, c_scalar_type)

from enum import IntEnum

from etptr._core._device import DeviceType
from etptr._core._error import Error, EtWarning
from etptr._core._scalar_type import ScalarType

cnp.import_array()


class TensorShapeDynamism(IntEnum):
    """ExecuTorch ``TensorShapeDynamism``: whether and how a tensor may be resized."""
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


_DYNAMISMS = tuple(TensorShapeDynamism)
_SCALAR_TYPES = tuple(ScalarType)
_DEVICE_TYPES = tuple(DeviceType)
_pytype = type
cdef object _MISSING = object()
cdef Device _CPU = c_make_device(0, 0)

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


cdef inline str _tname(object x):
    return _pytype(x).__name__


# ------------------------------------------------------------------ metadata

cdef int64_t _int_arg(object v, str argname, int pos) except? -1:
    """One element of a sizes/strides/dim_order sequence, as int64."""
    if isinstance(v, bool):
        raise_error(Error.InvalidType, f"{argname}[{pos}]={v!r} is a bool; expected an int")
    try:
        v = PyNumber_Index(v)
    except TypeError:
        raise_error(Error.InvalidType,
                    f"{argname}[{pos}]={v!r} of type {_tname(v)} is not an integer")
    if not (-INT64_MAX - 1 <= v <= INT64_MAX):
        raise_error(Error.InvalidArgument, f"{argname}[{pos}]={v} does not fit int64")
    return <int64_t>v


cdef int _int_seq(object seq, int64_t* out, str argname) except -2:
    """Read a sequence of ints into ``out`` (at most 16); return its length, -1 for None."""
    cdef Py_ssize_t n, i
    if seq is None:
        return -1
    if isinstance(seq, (str, bytes, Mapping)) or not hasattr(seq, "__len__") or \
            not hasattr(seq, "__getitem__") or (isinstance(seq, np.ndarray) and seq.ndim != 1):
        raise_error(Error.InvalidType,
                    f"{argname} must be a sequence of ints, got {seq!r} of type {_tname(seq)}")
    try:
        n = len(seq)
    except TypeError:  # e.g. a 0-dim ndarray has __len__ but no length
        n = -1
    if n < 0:
        raise_error(Error.InvalidType,
                    f"{argname} must be a sequence of ints, got {seq!r} of type {_tname(seq)}")
    if n > kTensorDimensionLimit:
        raise_error(Error.InvalidArgument,
                    f"{argname} has {n} entries; ExecuTorch tensors have at most "
                    f"{kTensorDimensionLimit} dims (kTensorDimensionLimit)")
    for i in range(n):
        try:
            item = seq[i]
        except LookupError:  # a mapping, or a __len__ that overstates
            raise_error(Error.InvalidType,
                        f"{argname} must be a sequence of ints, got {seq!r} of type {_tname(seq)}")
        out[i] = _int_arg(item, argname, i)
    return n


cdef int _dim_order_to_strides(const sizes_t* sizes, const dim_order_t* dim_order,
                               int dim, strides_t* strides) except -1:
    """ExecuTorch dim_order_to_stride, with int64 overflow checks."""
    cdef int i
    cdef int64_t s, m
    if dim == 0:
        return 0
    strides[dim_order[dim - 1]] = 1
    for i in range(dim - 2, -1, -1):
        s = strides[dim_order[i + 1]]
        m = sizes[dim_order[i + 1]]
        if m == 0:
            strides[dim_order[i]] = s
        else:
            if s > INT64_MAX // m:
                raise_error(Error.InvalidArgument,
                            f"sizes: the stride of dim {dim_order[i]} overflows int64")
            strides[dim_order[i]] = s * m
    return 0


@cython.final
cdef class Metadata:
    """Validated (sizes, dim_order, strides); internal."""

    def __init__(self):
        raise TypeError("Metadata is internal")


cdef int _check_sizes(Metadata m) except -1:
    cdef int i
    cdef int64_t numel = 1
    cdef bint zero = False
    for i in range(m.dim):
        if m.sizes[i] < 0:
            raise_error(Error.InvalidArgument, f"sizes[{i}]={m.sizes[i]} is negative")
        if m.sizes[i] == 0:
            zero = True
    # overflow check on the product of the non-zero sizes
    for i in range(m.dim):
        if m.sizes[i] == 0:
            continue
        if numel > INT64_MAX // m.sizes[i]:
            raise_error(Error.InvalidArgument,
                        f"sizes={_tuple64(m.sizes, m.dim)}: the element count overflows int64")
        numel *= m.sizes[i]
    m.numel = 0 if zero else numel
    return 0


cdef tuple _tuple64(const int64_t* a, int n):
    return tuple([a[i] for i in range(n)])


cdef tuple _tuple8(const dim_order_t* a, int n):
    return tuple([a[i] for i in range(n)])


cdef int _order_from_strides(const int64_t* strides, int dim, dim_order_t* order) noexcept:
    """Dims sorted by decreasing stride; equal strides keep ascending dim index (stable)."""
    cdef int i, j
    cdef dim_order_t d
    for i in range(dim):
        order[i] = i
    for i in range(1, dim):
        d = order[i]
        j = i - 1
        while j >= 0 and strides[order[j]] < strides[d]:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = d
    return 0


cdef int _fill_metadata(Metadata m, object dim_order, object strides,
                        const int64_t* given_strides, int nstrides) except -1:
    """Validate dim_order / strides against m.sizes and compute m.strides."""
    cdef int64_t order64[kTensorDimensionLimit]
    cdef int64_t sbuf[kTensorDimensionLimit]
    cdef bint seen[kTensorDimensionLimit]
    cdef int norder, i
    norder = _int_seq(dim_order, order64, "dim_order")
    if given_strides == NULL:
        nstrides = _int_seq(strides, sbuf, "strides")
        given_strides = sbuf
    if norder > 0 and norder != m.dim:
        raise_error(Error.InvalidArgument,
                    f"dim_order={tuple(dim_order)!r} has {norder} entries but sizes has "
                    f"{m.dim}; it must be empty or match")
    if nstrides > 0 and nstrides != m.dim:
        raise_error(Error.InvalidArgument,
                    f"strides={_tuple64(given_strides, nstrides)!r} has {nstrides} entries but "
                    f"sizes has {m.dim}; it must be empty or match")
    if norder > 0:
        for i in range(m.dim):
            seen[i] = False
        for i in range(m.dim):
            if order64[i] < 0 or order64[i] >= m.dim or seen[order64[i]]:
                raise_error(Error.InvalidArgument,
                            f"dim_order={_tuple64(order64, norder)!r} is not a permutation "
                            f"of 0..{m.dim - 1}")
            seen[order64[i]] = True
            m.dim_order[i] = <dim_order_t>order64[i]
    elif nstrides > 0:
        _order_from_strides(given_strides, m.dim, m.dim_order)
    else:
        for i in range(m.dim):
            m.dim_order[i] = i
    _dim_order_to_strides(m.sizes, m.dim_order, m.dim, m.strides)
    if nstrides > 0:
        for i in range(m.dim):
            if given_strides[i] != m.strides[i] and m.sizes[i] != 1:
                raise_error(Error.InvalidArgument,
                            f"strides={_tuple64(given_strides, nstrides)!r} disagree with "
                            f"dim_order={_tuple8(m.dim_order, m.dim)!r}: strides[{i}] is "
                            f"{given_strides[i]} but sizes {_tuple64(m.sizes, m.dim)!r} in that "
                            f"order need {m.strides[i]} (only a size-1 dim may differ)")
    return 0


cdef Metadata c_metadata(object sizes, object dim_order, object strides):
    """Validate sizes, dim_order and strides (ExecuTorch's make_tensor_ptr checks)."""
    cdef Metadata m = Metadata.__new__(Metadata)
    if sizes is None:
        raise_error(Error.InvalidArgument, "sizes must be a sequence of ints, got None")
    m.dim = _int_seq(sizes, m.sizes, "sizes")
    _check_sizes(m)
    _fill_metadata(m, dim_order, strides, NULL, 0)
    return m


cdef int c_dynamism_arg(object dynamism) except -1:
    if isinstance(dynamism, bool) or not isinstance(dynamism, (int, np.integer)):
        raise_error(Error.InvalidType,
                    f"dynamism must be an etptr.TensorShapeDynamism, got {dynamism!r}")
    if not 0 <= dynamism <= 2:
        raise_error(Error.InvalidArgument,
                    f"dynamism={dynamism!r} is not a TensorShapeDynamism code (0..2)")
    return dynamism


cdef TensorPtr c_tensor_arg(object t, str argname):
    """``t`` as a TensorPtr, or InvalidTypeError naming ``argname``."""
    if not isinstance(t, TensorPtr):
        raise_error(Error.InvalidType,
                    f"{argname} must be an etptr.TensorPtr, got {t!r:.80} of type {_tname(t)}")
    return <TensorPtr>t


cdef int c_type_arg(object t, int default) except -1:
    if t is None:
        return default
    return c_scalar_type(t, "type")


# ------------------------------------------------------------------ the tensor

cdef void _write_unraisable(object exc) noexcept:
    # A noexcept function that raises hands the exception to sys.unraisablehook.
    raise exc


cdef void _warn_teardown(str what, object exc) noexcept:
    """Report a failure during teardown as an EtWarning (it cannot be raised).

    When warnings are errors (``-W error``), the warning itself goes to
    ``sys.unraisablehook`` instead of vanishing.
    """
    try:
        warnings.warn(f"etptr: {what} raised during teardown: {exc!r}", EtWarning, stacklevel=2)
    except BaseException as raised:
        _write_unraisable(raised)


@cython.no_gc_clear
cdef class TensorPtr:
    """A tensor: ExecuTorch metadata over memory it owns or keeps alive.

    Build one with :func:`make_tensor_ptr` or a maker function such as
    :func:`etptr.empty`; the constructor is not public. Mirrors ExecuTorch's
    ``TensorPtr`` (``std::shared_ptr<Tensor>``): Python references play the
    part of the shared pointer, and the memory is released (deleter called,
    device memory freed) when the last reference and view are gone.
    """

    def __cinit__(self):
        self.c_data = NULL
        self.c_dim = 0
        self.c_numel = 1
        self.c_device = _CPU
        self.c_alloc_index = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("TensorPtr cannot be built directly: use etptr.make_tensor_ptr or a maker "
                        "function such as etptr.empty")

    def __del__(self):
        # tp_finalize, not tp_dealloc: when a reference cycle (e.g. owner -> tensor ->
        # bound-method deleter -> owner) is collected, finalizers run before the
        # collector clears anything, so the deleter still sees the objects it needs.
        cdef void* data = self.c_data
        deleter = self.c_deleter
        alloc = self.c_allocator
        self.c_deleter = None
        self.c_allocator = None
        self.c_data = NULL
        if deleter is not None:
            try:
                deleter(PyLong_FromVoidPtr(data))
            except BaseException as exc:
                _warn_teardown("a TensorPtr deleter", exc)
        if alloc is not None and data != NULL:
            try:
                alloc.deallocate(PyLong_FromVoidPtr(data), self.c_alloc_index)
            except BaseException as exc:
                _warn_teardown(f"{_tname(alloc)}.deallocate", exc)

    cdef int64_t c_nbytes(self) noexcept nogil:
        return self.c_numel * c_element_size(self.c_type)

    # -------------------------------------------------------------- metadata
    @property
    def sizes(self):
        """Sizes, a tuple of ``dim()`` ints (elements per dim)."""
        return _tuple64(self.c_sizes, self.c_dim)

    @property
    def dim_order(self):
        """Dim order, a tuple of ``dim()`` ints: dims from outermost to innermost in memory."""
        return _tuple8(self.c_dim_order, self.c_dim)

    @property
    def strides(self):
        """Strides, a tuple of ``dim()`` ints, in elements (not bytes)."""
        return _tuple64(self.c_strides, self.c_dim)

    @property
    def scalar_type(self):
        """The element :class:`ScalarType`."""
        return _SCALAR_TYPES[self.c_type]

    @property
    def shape_dynamism(self):
        """The :class:`TensorShapeDynamism`."""
        return _DYNAMISMS[self.c_dynamism]

    @property
    def device(self):
        """The :class:`Device` the data lives on."""
        return self.c_device

    @property
    def data_ptr(self):
        """Address of the first element (int); 0 for null data."""
        return <uintptr_t>self.c_data

    @property
    def nbytes(self):
        """Size of the data in bytes: ``numel() * element_size()``."""
        return self.c_numel * c_element_size(self.c_type)

    @property
    def readonly(self):
        """True when the memory came from a read-only buffer."""
        return bool(self.c_readonly)

    def dim(self):
        """Number of dims (0 for a scalar tensor)."""
        return self.c_dim

    def numel(self):
        """Number of elements (1 for a 0-dim tensor)."""
        return self.c_numel

    def element_size(self):
        """Size of one element in bytes."""
        return c_element_size(self.c_type)

    def size(self, d):
        """Size of dim ``d``; a negative ``d`` counts from the end.

        Raises
        ------
        InvalidArgumentError
            ``d`` is out of range.
        """
        cdef Py_ssize_t i
        try:
            i = PyNumber_Index(d)
        except (TypeError, OverflowError):
            raise_error(Error.InvalidArgument, f"d={d!r} is not a dim index")
        if i < 0:
            i += self.c_dim
        if i < 0 or i >= self.c_dim:
            raise_error(Error.InvalidArgument,
                        f"d={d!r} is out of range for a tensor of {self.c_dim} dims")
        return self.c_sizes[i]

    def __repr__(self):
        return (f"TensorPtr(sizes={self.sizes}, dim_order={self.dim_order}, "
                f"strides={self.strides}, scalar_type={_SCALAR_TYPES[self.c_type].name}, "
                f"shape_dynamism={_DYNAMISMS[self.c_dynamism].name}, device='{self.c_device}', "
                f"data_ptr=0x{<uintptr_t>self.c_data:x})")

    def __reduce__(self):
        raise TypeError("TensorPtr cannot be pickled: it aliases memory by address; "
                        "pickle tensor.numpy() instead")

    # -------------------------------------------------------------- interop
    def numpy(self):
        """A zero-copy NumPy view of a CPU tensor, with its sizes and strides.

        The view keeps the tensor alive. It is writable unless the tensor's
        memory came from a read-only buffer. BFloat16 and Float8 views use
        ``ml_dtypes`` dtypes.

        Raises
        ------
        NotSupportedError
            The tensor lives on a device (use ``clone_tensor_ptr_to_cpu``
            first), or its scalar type has no NumPy dtype.
        InvalidArgumentError
            The tensor has null data and at least one element.
        """
        if self.c_device.c_type != 0:
            raise_error(Error.NotSupported,
                        f"numpy() needs a CPU tensor, this one is on {self.c_device}: "
                        f"copy it with etptr.clone_tensor_ptr_to_cpu(tensor) first")
        dtype = c_numpy_dtype(self.c_type)
        if self.c_data == NULL:
            if self.c_numel != 0:
                raise_error(Error.InvalidArgument,
                            "numpy(): the tensor has null data (made with data=None); give it "
                            "memory first, e.g. etptr.empty(sizes, type) or "
                            "make_tensor_ptr(sizes, buffer)")
            return np.empty(self.sizes, dtype=dtype)
        region = _host_region(self, self.c_nbytes())
        itemsize = c_element_size(self.c_type)
        return np.ndarray(self.sizes, dtype=dtype, buffer=region,
                          strides=tuple([self.c_strides[i] * itemsize for i in range(self.c_dim)]))

    def __array__(self, dtype=None, copy=None):
        """NumPy's array protocol: :meth:`numpy` (zero-copy), cast to ``dtype`` or
        copied when asked.

        Raises
        ------
        ValueError
            ``copy=False`` with a ``dtype`` that needs a copy.
        NotSupportedError
            As :meth:`numpy`: the tensor lives on a device, or its scalar type
            has no NumPy dtype.
        """
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("__array__: a dtype change needs a copy, but copy=False")
            return a.astype(dtype)
        if copy:
            return a.copy()
        return a

    @property
    def __cuda_array_interface__(self):
        """CUDA Array Interface (version 3) of a CUDA tensor.

        Raises ``AttributeError`` for a tensor that is not on a CUDA device.
        """
        if self.c_device.c_type != 1:
            raise AttributeError("__cuda_array_interface__ exists only for CUDA tensors; "
                                 f"this one is on {self.c_device}")
        itemsize = c_element_size(self.c_type)
        try:
            typestr = c_numpy_dtype(self.c_type).str
        except Exception:
            typestr = f"|V{itemsize}"
        return {
            "shape": self.sizes,
            "typestr": typestr,
            "data": (<uintptr_t>self.c_data, bool(self.c_readonly)),
            "strides": tuple([self.c_strides[i] * itemsize for i in range(self.c_dim)]),
            "version": 3,
            "stream": None,
        }

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the tensor as a DLPack capsule (zero-copy unless ``copy=True``).

        A versioned (DLPack 1.x) capsule when ``max_version`` allows it, with
        the read-only flag for read-only memory; a legacy capsule otherwise.
        Device tensors made by etptr are complete when their clone returns,
        so ``stream`` needs no synchronisation.

        Raises
        ------
        BufferError
            The scalar type has no DLPack code, the data is null, ``dl_device``
            is another device, ``copy=True`` for a device tensor, or a legacy
            capsule is asked for read-only memory.
        """
        return _to_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        """``(kDLCPU=1, 0)`` for CPU tensors, ``(kDLCUDA=2, index)`` for CUDA tensors.
        """
        return _dlpack_device(self)


include "_dlpack.pxi"


@cython.final
cdef class _HostRegion:
    """A flat byte buffer over a CPU tensor's memory; keeps the tensor alive."""
    cdef TensorPtr tensor
    cdef Py_ssize_t nbytes

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.tensor.c_data, self.nbytes,
                          self.tensor.c_readonly, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef _HostRegion _host_region(TensorPtr t, int64_t nbytes):
    cdef _HostRegion r = _HostRegion.__new__(_HostRegion)
    r.tensor = t
    r.nbytes = nbytes
    return r


cdef object c_storage_array(TensorPtr t):
    """The tensor's storage as a flat, writable-if-allowed NumPy array of its dtype."""
    dtype = c_numpy_dtype(t.c_type)
    if t.c_data == NULL or t.c_numel == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(_host_region(t, t.c_nbytes()), dtype=dtype)


# ------------------------------------------------------------------ construction helpers

cdef TensorPtr c_new_tensor(Metadata meta, int type, int dynamism, Device device):
    cdef TensorPtr t = TensorPtr.__new__(TensorPtr)
    memcpy(t.c_sizes, meta.sizes, meta.dim * sizeof(sizes_t))
    memcpy(t.c_dim_order, meta.dim_order, meta.dim * sizeof(dim_order_t))
    memcpy(t.c_strides, meta.strides, meta.dim * sizeof(strides_t))
    t.c_dim = meta.dim
    t.c_numel = meta.numel
    t.c_numel_bound = meta.numel
    t.c_type = type
    t.c_dynamism = 0 if meta.dim == 0 else dynamism
    t.c_device = device
    return t


cdef TensorPtr c_like_tensor(TensorPtr src, int type):
    """A data-less tensor with ``src``'s metadata, scalar type ``type``."""
    cdef TensorPtr t = TensorPtr.__new__(TensorPtr)
    memcpy(t.c_sizes, src.c_sizes, src.c_dim * sizeof(sizes_t))
    memcpy(t.c_dim_order, src.c_dim_order, src.c_dim * sizeof(dim_order_t))
    memcpy(t.c_strides, src.c_strides, src.c_dim * sizeof(strides_t))
    t.c_dim = src.c_dim
    t.c_numel = src.c_numel
    t.c_numel_bound = src.c_numel
    t.c_type = type
    t.c_dynamism = src.c_dynamism
    t.c_device = src.c_device
    return t


cdef int c_set_data(TensorPtr t, int64_t address, object owner, bint readonly) except -1:
    t.c_data = <void*><uintptr_t>address
    t.c_owner = owner
    t.c_readonly = readonly
    return 0


cdef object _host_bytes(int64_t nbytes):
    """Owned, uninitialised host memory of ``nbytes`` bytes (a NumPy byte array)."""
    try:
        return np.empty(max(nbytes, 1), dtype=np.uint8)
    except MemoryError:
        raise_error(Error.MemoryAllocationFailed,
                    f"could not allocate {nbytes} bytes of host memory")


cdef TensorPtr c_host_empty(Metadata meta, int type, int dynamism):
    cdef int64_t esize = c_element_size(type)
    if meta.numel > INT64_MAX // esize:
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    buf = _host_bytes(meta.numel * esize)
    cdef TensorPtr t = c_new_tensor(meta, type, dynamism, _CPU)
    c_set_data(t, (<cnp.ndarray>buf).ctypes.data, buf, False)
    return t


cdef str _why_no_allocator(int device_type):
    """The reason the built-in allocator of ``device_type`` did not register, as a suffix."""
    if device_type != 1:
        return "; register one with etptr.register_device_allocator"
    try:
        from etptr.cuda import unavailable_reason
        why = unavailable_reason()
    except Exception:
        why = None
    if why:
        return f" ({why}); or register your own with etptr.register_device_allocator"
    return (" (the CUDA allocator needs CuPy and a CUDA device: pip install 'etptr[cuda13]' "
            "or 'etptr[cuda12]'); or register your own with etptr.register_device_allocator")


cdef object _allocator_for(Device device, str argname):
    alloc = c_get_allocator(device.c_type)
    if alloc is None:
        raise_error(Error.NotFound,
                    f"{argname}={device}: no DeviceAllocator is registered for "
                    f"DeviceType.{_DEVICE_TYPES[device.c_type].name}"
                    + _why_no_allocator(device.c_type))
    return alloc


cdef int64_t _address_from(object ptr, str what, int64_t nbytes) except? -1:
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)):
        raise_error(Error.InvalidType,
                    f"{what} returned {ptr!r} of type {_tname(ptr)}; expected an int address")
    if ptr < 0 or ptr > <uintptr_t>-1:
        raise_error(Error.InvalidArgument, f"{what} returned {ptr!r}, not an address")
    if ptr == 0 and nbytes > 0:
        raise_error(Error.MemoryAllocationFailed, f"{what} returned a null address for {nbytes} bytes")
    return <int64_t><uintptr_t>ptr


cdef int _resolved_index(object alloc, int index) except -2:
    """``alloc.resolve_index(index)``, checked to be a concrete device index (0..127)."""
    r = alloc.resolve_index(index)
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
        raise_error(Error.InvalidType,
                    f"{_tname(alloc)}.resolve_index({index}) returned {r!r} of type {_tname(r)}; "
                    f"expected an int device index")
    if not 0 <= r <= 127:
        raise_error(Error.InvalidArgument,
                    f"{_tname(alloc)}.resolve_index({index}) returned {r}; expected a device "
                    f"index in 0..127")
    return r


cdef TensorPtr c_device_empty(Metadata meta, int type, int dynamism, Device device):
    """Uninitialised device memory for ``meta``, freed through the device's allocator."""
    cdef int64_t esize = c_element_size(type)
    cdef int64_t nbytes, address
    if meta.numel > INT64_MAX // esize:
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    nbytes = meta.numel * esize
    alloc = _allocator_for(device, "device")
    index = _resolved_index(alloc, device.c_index)
    ptr = alloc.allocate(nbytes, index, 8)
    try:
        address = _address_from(ptr, f"{_tname(alloc)}.allocate", nbytes)
        t = c_new_tensor(meta, type, dynamism, c_make_device(device.c_type, index))
    except BaseException:
        if isinstance(ptr, int) and ptr:
            alloc.deallocate(ptr, index)
        raise
    c_set_data(t, address, None, False)
    t.c_allocator = alloc
    t.c_alloc_index = index
    return t


# ------------------------------------------------------------------ data conversion

cdef int _deduce_list_type(object values) except -1:
    """Float for floats, Long for ints, Bool for bools, Float for empty or mixed."""
    cdef int kind = -1, k
    cdef Py_ssize_t i = 0
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            k = 11
        elif isinstance(v, np.timedelta64):     # an np.integer, but a duration, not a number
            k = -1
        elif isinstance(v, (int, np.integer)):
            k = 4
        elif isinstance(v, (float, np.floating)):
            k = 6
        else:
            k = -1
        if k == -1:
            raise_error(Error.InvalidType,
                        f"data[{i}]={v!r} of type {_tname(v)} is not a number "
                        f"(data must be a flat list of ints, floats or bools)")
        if kind == -1:
            kind = k
        elif kind != k:
            kind = 6
        i += 1
    return 6 if kind == -1 else kind


cdef object _values_array(object values, int deduced):
    """The Python values as a NumPy array of the deduced type's widest host form."""
    if deduced == 11:
        return np.array(values, dtype=np.bool_)
    if deduced == 4:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            for i, v in enumerate(values):
                if not (-(1 << 63) <= v < (1 << 63)):
                    raise_error(Error.InvalidArgument,
                                f"data[{i}]={v} does not fit int64 (ScalarType.Long)")
            raise
    try:
        with np.errstate(over="raise"):
            return np.array(values, dtype=np.float64)
    except (OverflowError, FloatingPointError):
        for i, v in enumerate(values):
            try:
                with np.errstate(over="raise"):
                    np.array([v], dtype=np.float64)
            except (OverflowError, FloatingPointError):
                raise_error(Error.InvalidArgument,
                            f"data[{i}]={v} does not fit a double (the list is deduced as "
                            f"ScalarType.Float)")
        raise


cdef object _cast_array(object arr, int type):
    """``arr`` converted element-wise to scalar type ``type`` (a C-style cast)."""
    dtype = c_numpy_dtype(type)
    if arr.dtype == dtype:
        return arr
    with np.errstate(all="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return arr.astype(dtype)


cdef TensorPtr _from_host_array(Metadata meta, object arr, int type, int dynamism):
    """A tensor owning a copy of the contiguous array ``arr`` (already of ``type``)."""
    cdef TensorPtr t = c_host_empty(meta, type, dynamism)
    cdef int64_t nbytes = t.c_nbytes()
    cdef cnp.ndarray a = np.ascontiguousarray(arr)
    if nbytes:
        memcpy(t.c_data, cnp.PyArray_DATA(a), nbytes)
    return t


cdef TensorPtr _from_values(object sizes, object values, object dim_order, object strides,
                            object type, int dynamism):
    """The std::vector<T> overload: copy (and cast) a flat list of numbers."""
    cdef int deduced = _deduce_list_type(values)
    cdef int target = c_type_arg(type, deduced)
    cdef Metadata meta
    if sizes is None:
        sizes = (len(values),)
    meta = c_metadata(sizes, dim_order, strides)
    if len(values) != meta.numel:
        raise_error(Error.InvalidArgument,
                    f"data has {len(values)} values but sizes={_tuple64(meta.sizes, meta.dim)} "
                    f"needs {meta.numel}")
    if not c_can_cast(deduced, target):
        raise_error(Error.InvalidType,
                    f"type=ScalarType.{_SCALAR_TYPES[target].name}: cannot cast data deduced "
                    f"as ScalarType.{_SCALAR_TYPES[deduced].name} to it (canCast refuses)")
    arr = _values_array(values, deduced)
    return _from_host_array(meta, _cast_array(arr, target), target, dynamism)


cdef TensorPtr _from_bytes(object sizes, bytes data, object dim_order, object strides,
                           object type, int dynamism):
    """The std::vector<uint8_t> overload: copy raw bytes."""
    cdef int target = c_type_arg(type, 6)
    cdef Metadata meta = c_metadata(sizes, dim_order, strides)
    cdef int64_t need
    cdef TensorPtr t
    if meta.numel > INT64_MAX // c_element_size(target):
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    need = meta.numel * c_element_size(target)
    if len(data) != need:
        raise_error(Error.InvalidArgument,
                    f"data holds {len(data)} bytes but sizes={_tuple64(meta.sizes, meta.dim)} of "
                    f"ScalarType.{_SCALAR_TYPES[target].name} need exactly {need}")
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
    cdef Metadata m = Metadata.__new__(Metadata)
    cdef int ndim = cnp.PyArray_NDIM(arr), i
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp* bstrides = cnp.PyArray_STRIDES(arr)
    cdef int64_t itemsize = cnp.PyArray_ITEMSIZE(arr)
    cdef int64_t estrides[kTensorDimensionLimit]
    cdef int type = _array_type(arr)
    cdef TensorPtr t
    if ndim > kTensorDimensionLimit:
        raise_error(Error.InvalidArgument,
                    f"data has {ndim} dims; ExecuTorch tensors have at most {kTensorDimensionLimit}")
    m.dim = ndim
    for i in range(ndim):
        m.sizes[i] = shape[i]
    _check_sizes(m)
    if m.numel == 0:
        _fill_metadata(m, None, None, NULL, 0)
    else:
        for i in range(ndim):
            if bstrides[i] % itemsize != 0:
                raise_error(Error.InvalidArgument,
                            f"data: byte strides {(<object>arr).strides} are not multiples of the item "
                            f"size {itemsize}; copy it first with numpy.ascontiguousarray(data)")
            estrides[i] = bstrides[i] // itemsize
        try:
            _fill_metadata(m, None, None, estrides, ndim)
        except Exception as exc:
            raise_error(Error.InvalidArgument,
                        f"data: the array's strides {tuple([estrides[i] for i in range(ndim)])} "
                        f"(elements) are not described by any dim_order (negative, broadcast or "
                        f"gapped strides); copy it first with numpy.ascontiguousarray(data)")
    t = c_new_tensor(m, type, dynamism, _CPU)
    c_set_data(t, <int64_t><uintptr_t>cnp.PyArray_DATA(arr), arr,
               not cnp.PyArray_ISWRITEABLE(arr))
    return t


cdef cnp.ndarray _buffer_array(object data):
    """An ndarray sharing ``data``'s memory through the buffer protocol."""
    if isinstance(data, np.ndarray):
        return data
    try:
        mv = memoryview(data)
    except TypeError:
        raise_error(Error.InvalidType,
                    f"data of type {_tname(data)} is not an address, bytes, a list of numbers "
                    f"or an object with the buffer protocol")
    except (ValueError, BufferError) as exc:  # e.g. a released memoryview
        raise_error(Error.InvalidArgument, f"data of type {_tname(data)}: {exc}")
    try:
        return np.asarray(mv)
    except Exception:
        pass
    if not mv.c_contiguous:
        raise_error(Error.InvalidArgument,
                    f"data: the buffer (format {mv.format!r}) is not contiguous; copy it first")
    return np.frombuffer(mv.cast("B"), dtype=np.uint8)


cdef TensorPtr _alias_buffer(object sizes, object data, object dim_order, object strides,
                             object type, int dynamism, object deleter, Device device):
    """The raw void* overload with an owner: alias a buffer's memory, keep it alive."""
    cdef cnp.ndarray arr = _buffer_array(data)
    cdef int target
    cdef Metadata meta
    cdef int64_t need, have
    cdef TensorPtr t
    if arr.dtype.hasobject:
        # its memory is PyObject pointers: writing through a tensor would corrupt them
        raise_error(Error.InvalidType,
                    f"data: an array of dtype {arr.dtype} holds Python objects, which a "
                    f"tensor cannot alias; convert it to a numeric dtype first")
    if not (cnp.PyArray_IS_C_CONTIGUOUS(arr) or cnp.PyArray_IS_F_CONTIGUOUS(arr)):
        raise_error(Error.InvalidArgument,
                    f"data: the buffer is not contiguous (strides {(<object>arr).strides}); with explicit "
                    f"sizes it must be one block: copy it with numpy.ascontiguousarray(data)")
    target = _array_type(arr) if type is None else c_type_arg(type, 0)
    meta = c_metadata(sizes, dim_order, strides)
    if meta.numel > INT64_MAX // c_element_size(target):
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    need = meta.numel * c_element_size(target)
    have = cnp.PyArray_NBYTES(arr)
    if have < need:
        raise_error(Error.InvalidArgument,
                    f"data holds {have} bytes but sizes={_tuple64(meta.sizes, meta.dim)} of "
                    f"ScalarType.{_SCALAR_TYPES[target].name} span {need}")
    t = c_new_tensor(meta, target, dynamism, device)
    c_set_data(t, <int64_t><uintptr_t>cnp.PyArray_DATA(arr), arr,
               not cnp.PyArray_ISWRITEABLE(arr))
    t.c_deleter = deleter
    return t


cdef TensorPtr _alias_address(object sizes, object data, object dim_order, object strides,
                              object type, int dynamism, object deleter, Device device):
    """The raw void* overload: alias an address; ``deleter(address)`` runs once at the end."""
    cdef int target = c_type_arg(type, 6)
    cdef Metadata meta
    cdef TensorPtr t
    cdef uintptr_t address = 0
    if data is not None:
        if data < 0 or data > <uintptr_t>-1:
            raise_error(Error.InvalidArgument, f"data={data!r} is not a valid address")
        address = <uintptr_t>data
    meta = c_metadata(sizes, dim_order, strides)
    if meta.numel > INT64_MAX // c_element_size(target):
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    t = c_new_tensor(meta, target, dynamism, device)
    t.c_data = <void*>address
    t.c_deleter = deleter
    return t


cdef TensorPtr _view(TensorPtr src, object sizes, object dim_order, object strides,
                     object deleter, object device):
    """The alias overload: a view of ``src``'s storage with optional new metadata."""
    cdef Metadata m = Metadata.__new__(Metadata)
    cdef TensorPtr t
    cdef bint same_shape
    cdef int i
    m.dim = _int_seq(sizes, m.sizes, "sizes")
    if m.dim <= 0:
        # None or empty: reuse the source's sizes
        m.dim = src.c_dim
        memcpy(m.sizes, src.c_sizes, src.c_dim * sizeof(sizes_t))
    _check_sizes(m)
    if m.numel > src.c_numel:
        raise_error(Error.InvalidArgument,
                    f"sizes={_tuple64(m.sizes, m.dim)} hold {m.numel} elements, more than the "
                    f"source's {src.c_numel}; a view may not be larger than its source")
    same_shape = m.dim == src.c_dim
    if same_shape:
        for i in range(m.dim):
            if m.sizes[i] != src.c_sizes[i]:
                same_shape = False
                break
    # ExecuTorch's reuse rules: keep the source's dim_order when the rank matches
    # and nothing is overridden; keep its strides when the shape is unchanged.
    if dim_order is None and strides is None:
        if m.dim == src.c_dim:
            dim_order = _tuple8(src.c_dim_order, src.c_dim)
            if same_shape:
                strides = _tuple64(src.c_strides, src.c_dim)
    _fill_metadata(m, dim_order, strides, NULL, 0)
    t = c_new_tensor(m, src.c_type, src.c_dynamism,
                     src.c_device if device is None else c_device(device, "device"))
    c_set_data(t, <int64_t><uintptr_t>src.c_data, src, src.c_readonly)
    t.c_deleter = deleter
    return t


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
    sharing ``tensor``'s memory and keeping it alive.

    Parameters
    ----------
    sizes : sequence of int, length ndim (at most 16)
    data : see above
    dim_order : sequence of int, length ndim, a permutation; empty = ``0..ndim-1``
        or, with ``strides``, the dims by decreasing stride
    strides : sequence of int, in elements; checked against the strides that
        sizes and dim_order give (only size-1 dims may differ)
    type : ScalarType
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
    NotFoundError
        No allocator is registered for ``device``.
    """
    cdef int dyn = c_dynamism_arg(dynamism)
    cdef Device dev
    if deleter is not None and not callable(deleter):
        raise_error(Error.InvalidType, f"deleter={deleter!r} is not callable")
    if isinstance(sizes, TensorPtr):
        if type is not None:
            raise_error(Error.InvalidArgument,
                        "type: the alias overload keeps the source's scalar type; cast with "
                        "etptr.clone_tensor_ptr(tensor, type=...)")
        # device: omitted or None inherits the source's; anything else relabels
        return _view(<TensorPtr>sizes, None if data is _MISSING else data, dim_order, strides,
                     deleter, None if device is _MISSING else device)
    dev = _CPU if device is _MISSING else c_device(device, "device")
    if data is _MISSING:
        # short forms: the first argument is the data
        data = sizes
        if isinstance(data, np.ndarray):
            if deleter is not None or dim_order is not None or strides is not None:
                raise_error(Error.InvalidArgument,
                            "make_tensor_ptr(ndarray) takes its layout from the array; pass "
                            "sizes and the array to give dim_order or strides")
            if type is not None and c_type_arg(type, 0) != _array_type(data):
                return _place(_from_values_array(data, c_type_arg(type, 0), dyn), dev)
            if dev.c_type != 0:
                raise_error(Error.InvalidArgument,
                            f"device={dev}: make_tensor_ptr(ndarray) aliases host memory; copy "
                            f"it with etptr.clone_tensor_ptr_to(tensor, '{dev}')")
            return _alias_ndarray(<cnp.ndarray>data, dyn)
        if isinstance(data, (list, tuple)):
            _no_deleter(deleter)
            return _place(_from_values(None, data, dim_order, strides, type, dyn), dev)
        if isinstance(data, (bool, int, float, np.generic)):
            _no_deleter(deleter)
            c_metadata((), dim_order, strides)  # a 0-dim tensor: both must be empty
            if isinstance(data, np.generic):
                return _place(_from_values_array(np.asarray(data), c_type_arg(
                    type, _array_type(np.asarray(data))), dyn), dev)
            return _place(_from_values((), [data], None, None, type, dyn), dev)
        raise_error(Error.InvalidType,
                    f"make_tensor_ptr({_tname(data)}): the one-argument form takes a list of "
                    f"numbers, a number, a numpy array or a TensorPtr")
    if data is None or (isinstance(data, (int, np.integer)) and not isinstance(data, (bool, np.bool_))):
        return _alias_address(sizes, data, dim_order, strides, type, dyn, deleter, dev)
    if isinstance(data, bytes):
        _no_deleter(deleter)
        return _place(_from_bytes(sizes, data, dim_order, strides, type, dyn), dev)
    if isinstance(data, (list, tuple)):
        _no_deleter(deleter)
        return _place(_from_values(sizes, data, dim_order, strides, type, dyn), dev)
    if isinstance(data, TensorPtr):
        raise_error(Error.InvalidType,
                    "data is a TensorPtr: for a view call make_tensor_ptr(tensor, sizes)")
    return _alias_buffer(sizes, data, dim_order, strides, type, dyn, deleter, dev)


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
                    f"type=ScalarType.{_SCALAR_TYPES[target].name}: cannot cast "
                    f"ScalarType.{_SCALAR_TYPES[src].name} data to it (canCast refuses)")
    meta = c_metadata(arr.shape, None, None)
    return _from_host_array(meta, _cast_array(np.ascontiguousarray(arr), target), target, dynamism)


cdef TensorPtr _place(TensorPtr t, Device device):
    if device.c_type == 0:
        return t
    return c_clone_tensor_ptr_to(t, device, None, True)


def clone_tensor_ptr(tensor, type=None):
    """Deep copy of a CPU tensor with the same metadata, optionally cast.

    Mirrors ExecuTorch ``clone_tensor_ptr``. A cast converts each element as a
    C cast would (floats truncate towards zero, out-of-range integers wrap);
    casting copies support Byte, Char, Short, Int, Long, Half, Float, Double,
    Bool, BFloat16, UInt16, UInt32 and UInt64. Null data clones to null data
    of the requested type.

    Raises
    ------
    InvalidTypeError
        ``can_cast(tensor.scalar_type, type)`` is False.
    NotSupportedError
        The tensor is on a device (use ``clone_tensor_ptr_to``), or a cast
        involves a type outside the list above.
    """
    return _clone_tensor_ptr(c_tensor_arg(tensor, "tensor"), type)


cdef TensorPtr _clone_tensor_ptr(TensorPtr src, object type):
    cdef int target = c_type_arg(type, src.c_type)
    cdef TensorPtr out
    if src.c_device.c_type != 0:
        raise_error(Error.NotSupported,
                    f"clone_tensor_ptr copies CPU tensors; this one is on {src.c_device}: "
                    f"use etptr.clone_tensor_ptr_to(tensor, device)")
    if src.c_data == NULL:
        out = c_like_tensor(src, target)
        out.c_device = _CPU
        return out
    if target != src.c_type:
        if not c_can_cast(src.c_type, target):
            raise_error(Error.InvalidType,
                        f"type=ScalarType.{_SCALAR_TYPES[target].name}: cannot cast "
                        f"ScalarType.{_SCALAR_TYPES[src.c_type].name} to it (canCast refuses)")
        for t_ in (src.c_type, target):
            if not c_castable(t_):
                raise_error(Error.NotSupported,
                            f"clone_tensor_ptr cannot cast ScalarType.{_SCALAR_TYPES[t_].name}: "
                            f"casting copies support the REALHBBF16 and unsigned types only")
    out = c_like_tensor(src, target)
    buf = _host_bytes(out.c_nbytes())
    c_set_data(out, (<cnp.ndarray>buf).ctypes.data, buf, False)
    out.c_device = _CPU
    if target == src.c_type:
        with nogil:
            memcpy(out.c_data, src.c_data, out.c_nbytes())
    elif out.c_numel:
        c_storage_array(out)[...] = _cast_array(c_storage_array(src), target)
    return out


def resize_tensor_ptr(tensor, sizes):
    """Resize ``tensor`` in place with ExecuTorch's rules (``resize_tensor_ptr``).

    The rank may not change; a STATIC tensor may not change its sizes;
    DYNAMIC_BOUND and DYNAMIC_UNBOUND tensors may hold at most the element
    count they were created with. Strides are recomputed from the dim_order.
    A refusal leaves the tensor unchanged.

    Parameters
    ----------
    sizes : sequence of int, length ``tensor.dim()``

    Raises
    ------
    NotSupportedError
        A rank change, a STATIC size change, or more elements than the bound.
    InvalidArgumentError
        Negative or overflowing sizes.
    """
    _resize_tensor_ptr(c_tensor_arg(tensor, "tensor"), sizes)


cdef _resize_tensor_ptr(TensorPtr src, object sizes):
    cdef Metadata m = Metadata.__new__(Metadata)
    cdef int i
    cdef bint same = True
    m.dim = _int_seq(sizes, m.sizes, "sizes")
    if m.dim < 0:
        raise_error(Error.InvalidArgument, "sizes must be a sequence of ints, got None")
    _check_sizes(m)
    if m.dim != src.c_dim:
        raise_error(Error.NotSupported,
                    f"sizes={_tuple64(m.sizes, m.dim)} has {m.dim} dims but the tensor has "
                    f"{src.c_dim}; resize cannot change the rank")
    for i in range(m.dim):
        if m.sizes[i] != src.c_sizes[i]:
            same = False
    if same:
        return None
    if src.c_dynamism == 0:
        raise_error(Error.NotSupported,
                    f"sizes={_tuple64(m.sizes, m.dim)}: the tensor is STATIC and its sizes "
                    f"{src.sizes} cannot change")
    if m.numel > src.c_numel_bound:
        raise_error(Error.NotSupported,
                    f"sizes={_tuple64(m.sizes, m.dim)} hold {m.numel} elements, more than the "
                    f"{src.c_numel_bound} the tensor was created with")
    memcpy(m.dim_order, src.c_dim_order, m.dim * sizeof(dim_order_t))
    _dim_order_to_strides(m.sizes, m.dim_order, m.dim, m.strides)
    memcpy(src.c_sizes, m.sizes, m.dim * sizeof(sizes_t))
    memcpy(src.c_strides, m.strides, m.dim * sizeof(strides_t))
    src.c_numel = m.numel
    return None


cdef dict _kw_support = {}


cdef bint _takes_keyword(object alloc, str method, str keyword) except -1:
    """Whether ``type(alloc).method`` accepts ``keyword`` (or ``**kwargs``); cached per type."""
    key = (type(alloc), method, keyword)
    found = _kw_support.get(key)
    if found is None:
        import inspect
        try:
            params = inspect.signature(getattr(type(alloc), method)).parameters
            found = keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError, AttributeError):
            found = False
        _kw_support[key] = found
    return found


cdef int64_t _writable_address(object host, int64_t nbytes, str what) except? -1:
    """Address of ``host``'s writable buffer of at least ``nbytes`` bytes."""
    cdef Py_buffer view
    cdef int64_t address
    try:
        PyObject_GetBuffer(host, &view, PyBUF_WRITABLE)
    except TypeError as exc:
        raise_error(Error.InvalidType,
                    f"{what} returned {_tname(host)}, not an object with the buffer protocol")
    except (BufferError, ValueError) as exc:
        raise_error(Error.InvalidArgument,
                    f"{what} returned a read-only or non-contiguous buffer ({_tname(host)}): {exc}")
    try:
        if view.len < nbytes:
            raise_error(Error.InvalidArgument,
                        f"{what} returned a buffer of {view.len} bytes; {nbytes} are needed")
        address = <int64_t><uintptr_t>view.buf
    finally:
        PyBuffer_Release(&view)
    return address


cdef TensorPtr c_host_empty_pinned(Metadata meta, int type, int dynamism):
    """Uninitialised page-locked host memory for ``meta``, from the CUDA allocator's pool."""
    cdef int64_t esize = c_element_size(type)
    cdef int64_t nbytes
    cdef TensorPtr t
    if meta.numel > INT64_MAX // esize:
        raise_error(Error.InvalidArgument, "sizes: the byte count overflows int64")
    nbytes = meta.numel * esize
    alloc = c_get_allocator(1)
    if alloc is None:
        raise_error(Error.NotFound,
                    "pinned=True: page-locked memory comes from the CUDA DeviceAllocator, and "
                    "none is registered (install CuPy, or etptr.register_device_allocator your own)")
    host = alloc.allocate_host(nbytes, -1)
    if host is None:
        if nbytes:
            raise_error(Error.NotSupported,
                        f"pinned=True: {_tname(alloc)}.allocate_host gives no page-locked memory")
        return c_host_empty(meta, type, dynamism)
    t = c_new_tensor(meta, type, dynamism, _CPU)
    c_set_data(t, _writable_address(host, nbytes, f"{_tname(alloc)}.allocate_host"), host, False)
    return t


def clone_tensor_ptr_to(tensor, device, *, stream=None, pinned=True):
    """Copy ``tensor`` between the host and a device (ExecuTorch ``clone_tensor_ptr_to``).

    CPU -> device goes through the allocator registered for the device type;
    device -> CPU through the source device's allocator. The result keeps
    sizes, dim_order, strides, scalar type and dynamism, owns its memory and
    frees it through the allocator when its last reference dies. A clone to
    device index -1 gets the index actually used.

    Parameters
    ----------
    tensor : TensorPtr
    device : Device, DeviceType or str ("cpu", "cuda", "cuda:N")
    stream : CUDA stream, optional
        None (the default): synchronous, the result is complete on return.
        A stream (an int handle, a CuPy or PyTorch stream, or any object with
        ``__cuda_stream__``) of the device involved: the copy is queued on it
        and may still run on return. Until that stream is synchronized the
        caller must not read a CPU result, must not use a device result from
        another stream, and must not write to or free a page-locked source
        (a pageable source has been read when the call returns). Dropping the
        result early is safe. Allocators whose ``allocate``/``copy_*``
        methods take no ``stream`` keyword copy synchronously instead.
    pinned : bool
        Device -> CPU only: True (the default) puts the result in page-locked
        memory from the allocator's ``allocate_host`` hook (one DMA at line
        rate; the memory goes back to its pool when the result dies); False
        gives pageable memory. Ignored for CPU -> device.

    Raises
    ------
    NotSupportedError
        CPU -> CPU or device -> device.
    InvalidArgumentError
        The source has null data (and at least one byte), checked before anything is allocated.
    NotFoundError
        No allocator is registered for the device type.
    MemoryAllocationError
        The allocator could not allocate.
    """
    return c_clone_tensor_ptr_to(c_tensor_arg(tensor, "tensor"), device, stream, pinned)


cdef TensorPtr c_clone_tensor_ptr_to(TensorPtr tensor, object device, object stream, bint pinned):
    if tensor is None:
        raise_error(Error.InvalidArgument, "tensor must be a TensorPtr, got None")
    cdef Device dst = c_device(device, "device")
    cdef Device src_dev = tensor.c_device
    cdef int64_t nbytes = tensor.c_nbytes()
    cdef int64_t address
    cdef TensorPtr out
    cdef bint use_stream = False
    if (src_dev.c_type == 0) == (dst.c_type == 0):
        raise_error(Error.NotSupported,
                    f"clone_tensor_ptr_to copies between the host and a device; {src_dev} -> "
                    f"{dst} is not supported" + (" (use clone_tensor_ptr for CPU copies)"
                                                 if dst.c_type == 0 else ""))
    if tensor.c_data == NULL and nbytes > 0:
        raise_error(Error.InvalidArgument,
                    "tensor has null data: there is nothing to copy (made with data=None)")
    if dst.c_type != 0:
        alloc = _allocator_for(dst, "device")
        index = _resolved_index(alloc, dst.c_index)
        if stream is not None and nbytes:
            use_stream = _takes_keyword(alloc, "copy_host_to_device", "stream")
        if use_stream and _takes_keyword(alloc, "allocate", "stream"):
            ptr = alloc.allocate(nbytes, index, 8, stream=stream)
        else:
            ptr = alloc.allocate(nbytes, index, 8)
        try:
            address = _address_from(ptr, f"{_tname(alloc)}.allocate", nbytes)
            out = c_like_tensor(tensor, tensor.c_type)
            out.c_device = c_make_device(dst.c_type, index)
            if nbytes:
                if use_stream:
                    alloc.copy_host_to_device(ptr, <uintptr_t>tensor.c_data, nbytes, index,
                                              stream=stream)
                else:
                    alloc.copy_host_to_device(ptr, <uintptr_t>tensor.c_data, nbytes, index)
        except BaseException:
            if isinstance(ptr, (int, np.integer)) and ptr:
                alloc.deallocate(ptr, index)
            raise
        c_set_data(out, address, None, False)
        out.c_allocator = alloc
        out.c_alloc_index = index
        return out
    alloc = _allocator_for(src_dev, "tensor.device")
    index = tensor.c_alloc_index if tensor.c_allocator is alloc else src_dev.c_index
    host = alloc.allocate_host(nbytes, index) if pinned else None
    if host is None:
        host = _host_bytes(nbytes)
    address = _writable_address(host, nbytes, f"{_tname(alloc)}.allocate_host")
    out = c_like_tensor(tensor, tensor.c_type)
    out.c_device = _CPU
    c_set_data(out, address, host, False)
    if nbytes:
        if stream is not None and _takes_keyword(alloc, "copy_device_to_host", "stream"):
            alloc.copy_device_to_host(<uintptr_t>out.c_data, <uintptr_t>tensor.c_data, nbytes,
                                      index, stream=stream)
        else:
            alloc.copy_device_to_host(<uintptr_t>out.c_data, <uintptr_t>tensor.c_data, nbytes,
                                      index)
    return out


def clone_tensor_ptr_to_device(tensor, device="cuda", device_index=None):
    """Copy a CPU tensor to a device; ``device_index``, when given, replaces the
    device's index. See :func:`clone_tensor_ptr_to` for the errors raised.
    """
    cdef TensorPtr src = c_tensor_arg(tensor, "tensor")
    cdef Device d = c_device(device, "device")
    if device_index is not None:
        d = Device(d.type, device_index)
    if d.c_type == 0:
        raise_error(Error.NotSupported,
                    f"device={d}: clone_tensor_ptr_to_device copies to a device, not the CPU")
    return c_clone_tensor_ptr_to(src, d, None, True)


def clone_tensor_ptr_to_cpu(tensor):
    """Copy a device tensor to the CPU. See :func:`clone_tensor_ptr_to` for the errors raised.
    """
    return c_clone_tensor_ptr_to(c_tensor_arg(tensor, "tensor"), _CPU, None, True)
