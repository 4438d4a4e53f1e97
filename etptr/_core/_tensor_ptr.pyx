"""TensorPtr: ExecuTorch tensor metadata over memory it owns or keeps alive.

Mirrors ExecuTorch ``extension/tensor/tensor_ptr.h``'s ``TensorPtr``
(``std::shared_ptr<Tensor>``): sizes, dim_order and strides live in C arrays
inside the tensor (strides in elements, always as ExecuTorch computes them
from sizes and dim_order); the memory lives in a :class:`Storage` that the
tensor shares with its views. This module holds the class, its interop
exports (NumPy, the CUDA Array Interface, DLPack) and the helpers that build
tensors; the ``make_tensor_ptr`` overloads, clones and resizes live in
``_make_tensor_ptr``, the host<->device copies in ``_device_copy``.
"""
cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int64_t, uint8_t, uintptr_t
from libc.string cimport memcpy

import numpy as np

from etptr._core._codes cimport DEFAULT_ALIGNMENT_BYTES, DEVICE_CPU, DEVICE_CUDA
from etptr._core._args cimport c_int_arg, c_type_name
from etptr._core._device cimport Device, c_make_device
from etptr._core._device_allocator cimport DeviceAllocator, c_allocator_for
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport Metadata, c_new_metadata, c_nbytes, c_tuple64, c_tuple8
from etptr._core._scalar_type cimport c_element_size, c_numpy_dtype, c_scalar_type
from etptr._core._storage cimport (
    Storage, c_check_alive, c_device_storage, c_host_storage, c_pinned_storage)

from etptr._core._device import DeviceType
from etptr._core._error import Error, EtError, NamedIntEnum
from etptr._core._scalar_type import ScalarType

cnp.import_array()


class TensorShapeDynamism(NamedIntEnum):
    """ExecuTorch ``TensorShapeDynamism``: whether and how a tensor may be resized."""
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


_DYNAMISMS = tuple(TensorShapeDynamism)
_SCALAR_TYPES = tuple(ScalarType)
cdef Device _CPU = c_make_device(0, 0)


cdef Device c_cpu():
    return _CPU


# ------------------------------------------------------------------ argument checks

cdef int c_dynamism_arg(object dynamism) except -1:
    if isinstance(dynamism, bool) or not hasattr(type(dynamism), "__index__"):
        raise_error(Error.InvalidType,
                    f"dynamism must be an etptr.TensorShapeDynamism, got {dynamism!r:.80}")
    return <int>c_int_arg(dynamism, "dynamism", 0, 2)


cdef TensorPtr c_tensor_arg(object t, str argname):
    """``t`` as a TensorPtr, or InvalidTypeError naming ``argname``."""
    if not isinstance(t, TensorPtr):
        raise_error(Error.InvalidType,
                    f"{argname} must be an etptr.TensorPtr, got {t!r:.80} of type {c_type_name(t)}"
                    + _hint_for(t))
    return <TensorPtr>t


cdef str _hint_for(object t):
    """Where a foreign tensor given for a TensorPtr should go."""
    if hasattr(t, "__dlpack__"):
        return "; import it with etptr.from_dlpack(x) first"
    if hasattr(t, "__cuda_array_interface__"):
        return "; import it with etptr.from_cuda_array_interface(x) first"
    if hasattr(t, "__array_interface__") or hasattr(t, "__buffer__"):
        return "; wrap it with etptr.make_tensor_ptr(x) first"
    return ""


cdef int c_type_arg(object t, int default) except -1:
    if t is None:
        return default
    return c_scalar_type(t, "type")


# ------------------------------------------------------------------ the tensor

@cython.final
@cython.no_gc_clear
@cython.freelist(1024)
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

    def __init__(self, *args, **kwargs):
        raise TypeError("TensorPtr cannot be built directly: use etptr.make_tensor_ptr or a maker "
                        "function such as etptr.empty")

    cdef int64_t c_nbytes(self) noexcept nogil:
        return self.c_numel * c_element_size(self.c_type)

    # -------------------------------------------------------------- metadata
    @property
    def sizes(self):
        """Sizes, a tuple of ``dim()`` ints (elements per dim)."""
        return c_tuple64(self.c_sizes, self.c_dim)

    @property
    def dim_order(self):
        """Dim order, a tuple of ``dim()`` ints: dims from outermost to innermost in memory."""
        return c_tuple8(self.c_dim_order, self.c_dim)

    @property
    def strides(self):
        """Strides, a tuple of ``dim()`` ints, in elements (not bytes)."""
        return c_tuple64(self.c_strides, self.c_dim)

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

    # NumPy's and torch's spellings, as aliases of ExecuTorch's names
    @property
    def shape(self):
        """The sizes, as NumPy and torch call them: an alias of :attr:`sizes`."""
        return c_tuple64(self.c_sizes, self.c_dim)

    @property
    def ndim(self):
        """The number of dims, as NumPy calls it: an alias of :meth:`dim`."""
        return self.c_dim

    @property
    def dtype(self):
        """The NumPy dtype of the elements (:func:`etptr.scalar_type_to_numpy` of
        :attr:`scalar_type`; BFloat16 and Float8 through ``ml_dtypes``), or None for a
        scalar type NumPy has no dtype for (ComplexHalf, the quantized and bits types)."""
        try:
            return c_numpy_dtype(self.c_type)
        except EtError:
            return None

    def __len__(self):
        """The size of the first dim, as for a NumPy array; a 0-dim tensor has no len()
        (TypeError)."""
        if self.c_dim == 0:
            raise TypeError("len() of a 0-dim TensorPtr")
        return self.c_sizes[0]

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

    def __copy__(self):
        raise TypeError("copy.copy(TensorPtr): for a view of the same memory use "
                        "etptr.make_tensor_ptr(tensor); for a copy of the data use "
                        "etptr.clone_tensor_ptr(tensor)")

    def __deepcopy__(self, memo):
        raise TypeError("copy.deepcopy(TensorPtr): copy the data with etptr.clone_tensor_ptr(tensor) "
                        "(CPU) or etptr.clone_tensor_ptr_to(tensor, device)")

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
        InvalidStateError
            The tensor's memory was released (see :class:`Storage`).
        """
        if self.c_device.c_type != DEVICE_CPU:
            raise_error(Error.NotSupported,
                        f"numpy() needs a CPU tensor, this one is on {self.c_device}: "
                        f"copy it with etptr.clone_tensor_ptr_to_cpu(tensor) first")
        c_check_alive(self.c_storage, "numpy()")
        dtype = c_numpy_dtype(self.c_type)
        if self.c_data == NULL:
            if self.c_numel != 0:
                raise_error(Error.InvalidArgument,
                            "numpy(): the tensor has null data (made with data=None); give it "
                            "memory first, e.g. etptr.empty(sizes, type) or "
                            "make_tensor_ptr(sizes, buffer)")
            return _zero_size_array(self, dtype)
        if self.c_numel == 0:
            a = _zero_size_array(self, dtype)
            if self.c_readonly:
                a.flags.writeable = False
            return a
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

        Raises ``AttributeError`` for a tensor that is not on a CUDA device. A
        zero-size tensor reports a valid device address of its device (CuPy
        refuses a null one), never read.
        """
        if self.c_device.c_type != DEVICE_CUDA:
            raise AttributeError("__cuda_array_interface__ exists only for CUDA tensors; "
                                 f"this one is on {self.c_device}")
        c_check_alive(self.c_storage, "__cuda_array_interface__")
        itemsize = c_element_size(self.c_type)
        try:
            typestr = c_numpy_dtype(self.c_type).str
        except Exception:
            typestr = f"|V{itemsize}"
        return {
            "shape": self.sizes,
            "typestr": typestr,
            "data": (_export_address(self), bool(self.c_readonly)),
            "strides": tuple([self.c_strides[i] * itemsize for i in range(self.c_dim)]),
            "version": 3,
            "stream": None,
        }

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the tensor as a DLPack capsule (zero-copy unless ``copy=True``).

        A versioned (DLPack 1.x) capsule when ``max_version`` allows it, with
        the read-only flag for read-only memory; a legacy capsule otherwise.
        Device tensors made by etptr's synchronous copies are complete when
        the copy returns, so ``stream`` needs no synchronisation (after a
        ``stream=`` copy, synchronise that stream before exporting).

        Raises
        ------
        BufferError
            The scalar type has no DLPack code, the data is null, ``dl_device``
            is another device (or not a (device_type, device_id) pair),
            ``copy=True`` for a device tensor, ``stream=0`` for a CUDA tensor
            (ambiguous, refused by the DLPack protocol), or a legacy capsule
            is asked for read-only memory.
        """
        return _to_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        """``(kDLCPU=1, 0)`` for CPU tensors, ``(kDLCUDA=2, index)`` for CUDA tensors.
        """
        return _dlpack_device(self)


cdef object _zero_size_array(TensorPtr t, object dtype):
    """An empty NumPy array with ``t``'s sizes. ExecuTorch allows a zero-size tensor whose
    other sizes multiply past what NumPy can shape (e.g. (0, 2**62) of Float, after a
    resize): NumPy refuses those, and so does this, as an etptr error."""
    try:
        return np.empty(t.sizes, dtype=dtype)
    except ValueError as exc:
        raise_error(Error.NotSupported,
                    f"numpy(): NumPy cannot shape a zero-size array of sizes={t.sizes} and dtype "
                    f"{dtype} ({exc})")


cdef uintptr_t _export_address(TensorPtr t) except? 0:
    """The address exports report: the data, or for a zero-size CUDA tensor without
    data a valid address on its device (consumers such as CuPy refuse null)."""
    if t.c_data != NULL or t.c_numel != 0 or t.c_device.c_type != DEVICE_CUDA or \
            t.c_device.c_index < 0:
        return <uintptr_t>t.c_data
    try:
        from etptr.cuda._driver import zero_size_address
        return zero_size_address(t.c_device.c_index)
    except Exception:          # no CUDA here: the label is all there is
        return 0


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
    """The tensor's elements as a flat NumPy array of its dtype over its memory
    (``numel()`` elements from the first one; contiguous tensors only)."""
    dtype = c_numpy_dtype(t.c_type)
    if t.c_data == NULL or t.c_numel == 0:
        return np.empty(0, dtype=dtype)
    c_check_alive(t.c_storage, "reading the tensor")
    return np.frombuffer(_host_region(t, t.c_nbytes()), dtype=dtype)


# ------------------------------------------------------------------ construction helpers

cdef TensorPtr c_new_tensor(Metadata meta, int type, int dynamism, Device device,
                            Storage storage, uintptr_t data, bint readonly):
    """A tensor with ``meta``'s layout over ``data`` (inside ``storage``)."""
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
    t.c_storage = storage
    t.c_data = <void*>data
    t.c_readonly = readonly
    return t


cdef TensorPtr c_copy_layout(TensorPtr src, int type, Device device):
    """A tensor with ``src``'s layout now (sizes, dim_order, strides, dynamism) and no
    memory yet: the snapshot a copy is built from, taken before any user code runs.
    The caller gives it memory with :func:`c_set_memory` before anyone sees it."""
    cdef TensorPtr t = TensorPtr.__new__(TensorPtr)
    memcpy(t.c_sizes, src.c_sizes, src.c_dim * sizeof(sizes_t))
    memcpy(t.c_dim_order, src.c_dim_order, src.c_dim * sizeof(dim_order_t))
    memcpy(t.c_strides, src.c_strides, src.c_dim * sizeof(strides_t))
    t.c_dim = src.c_dim
    t.c_numel = src.c_numel
    t.c_numel_bound = src.c_numel
    t.c_type = type
    t.c_dynamism = src.c_dynamism
    t.c_device = device
    return t


cdef void c_set_memory(TensorPtr t, Storage storage, uintptr_t data, bint readonly) noexcept:
    t.c_storage = storage
    t.c_data = <void*>data
    t.c_readonly = readonly


cdef Metadata c_snapshot(TensorPtr t):
    """The tensor's layout now: what a copy is built from, read before any user code runs."""
    cdef Metadata m = c_new_metadata()
    memcpy(m.sizes, t.c_sizes, t.c_dim * sizeof(sizes_t))
    memcpy(m.dim_order, t.c_dim_order, t.c_dim * sizeof(dim_order_t))
    memcpy(m.strides, t.c_strides, t.c_dim * sizeof(strides_t))
    m.dim = t.c_dim
    m.numel = t.c_numel
    return m


cdef TensorPtr c_host_empty(Metadata meta, int type, int dynamism):
    """Uninitialised host memory for ``meta``."""
    cdef Storage s = c_host_storage(c_nbytes(meta.numel, type))
    return c_new_tensor(meta, type, dynamism, _CPU, s, s.c_ptr, False)


cdef TensorPtr c_host_empty_pinned(Metadata meta, int type, int dynamism):
    """Uninitialised page-locked host memory for ``meta``, from the CUDA allocator's pool."""
    cdef Storage s = c_pinned_storage(c_nbytes(meta.numel, type), -1)
    return c_new_tensor(meta, type, dynamism, _CPU, s, s.c_ptr, False)


cdef TensorPtr c_device_empty(Metadata meta, int type, int dynamism, Device device):
    """Uninitialised device memory for ``meta``, freed through the device's allocator."""
    cdef int64_t nbytes = c_nbytes(meta.numel, type)
    cdef DeviceAllocator alloc = c_allocator_for(device.c_type, device.c_index, "device")
    cdef int index = alloc.c_resolve_index(device.c_index)
    cdef Storage s = c_device_storage(alloc, nbytes, index, DEFAULT_ALIGNMENT_BYTES, None)
    return c_new_tensor(meta, type, dynamism, c_make_device(device.c_type, index), s,
                        s.c_ptr, False)
