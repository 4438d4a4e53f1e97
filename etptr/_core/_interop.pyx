"""Import of other libraries' tensors: DLPack and the CUDA Array Interface.

:func:`from_dlpack` takes any DLPack producer (an object with ``__dlpack__``
and ``__dlpack_device__``: NumPy arrays, CuPy arrays, torch tensors, another
TensorPtr) and returns a :class:`TensorPtr` over the same memory, without
copying. :func:`from_cuda_array_interface` does the same for objects that
expose ``__cuda_array_interface__`` (version 3). The importer mirrors what
ExecuTorch's ``make_tensor_ptr`` does with a raw pointer and a deleter: the
producer's managed tensor is the owner, and its deleter runs exactly once,
when the last TensorPtr over it dies.
"""
cimport cython
from cpython.number cimport PyNumber_Index
from cpython.pycapsule cimport (
    PyCapsule_CheckExact, PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_IsValid,
    PyCapsule_SetName)
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t
from libc.string cimport memcpy

import numpy as np

from etptr._core._codes cimport DEVICE_CPU
from etptr._core._dlpack cimport (
    DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION, DLManagedTensor, DLManagedTensorVersioned, DLTensor, kDLBfloat,
    kDLBool, kDLComplex, kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged, kDLFloat,
    kDLFloat8_e4m3fn, kDLFloat8_e4m3fnuz, kDLFloat8_e5m2, kDLFloat8_e5m2fnuz, kDLInt,
    kDLROCMHost, kDLUInt)
from etptr._core._args cimport c_int_arg, c_type_name
from etptr._core._device cimport Device, c_device, c_make_device
from etptr._core._device_allocator cimport DeviceAllocator, c_allocator_for
from etptr._core._device_copy cimport c_clone_to
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport Metadata, c_metadata, c_nbytes
from etptr._core._scalar_type cimport c_element_size
from etptr._core._storage cimport Storage, c_host_storage, c_storage
from etptr._core._tensor_ptr cimport TensorPtr, c_new_tensor
from etptr._core._types cimport kTensorDimensionLimit

from etptr._core._error import Error, InvalidArgumentError
from etptr._core._make_tensor_ptr import clone_tensor_ptr
from etptr._core._scalar_type import ScalarType, scalar_type_from_numpy

_SCALAR_TYPES = tuple(ScalarType)
cdef Device _CPU = c_make_device(0, 0)
cdef int _DYNAMIC_BOUND = 1

_DL_DEVICE_NAMES = {
    1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
    13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon", 17: "kDLMAIA",
}


# ------------------------------------------------------------------ the owner

@cython.final
@cython.no_gc
cdef class _DLPackOwner:
    """Holds a consumed DLPack managed tensor; calls its deleter once, when it dies."""
    cdef void* c_managed
    cdef bint c_versioned

    def __cinit__(self):
        self.c_managed = NULL
        self.c_versioned = False

    def __init__(self):
        raise TypeError("_DLPackOwner is internal")

    def __dealloc__(self):
        cdef void* m = self.c_managed
        cdef DLManagedTensorVersioned* vm
        cdef DLManagedTensor* lm
        self.c_managed = NULL  # cleared first: the deleter runs exactly once
        if m == NULL:
            return
        if self.c_versioned:
            vm = <DLManagedTensorVersioned*>m
            if vm.deleter != NULL:
                vm.deleter(vm)
        else:
            lm = <DLManagedTensor*>m
            if lm.deleter != NULL:
                lm.deleter(lm)


# ------------------------------------------------------------------ mappings

cdef int _scalar_type_of(uint8_t code, uint8_t bits, uint16_t lanes) except -1:
    """ScalarType code of a DLPack data type; raises for types ExecuTorch lacks."""
    cdef int t = -1
    if lanes != 1:
        raise_error(Error.NotSupported,
                    f"DLPack dtype (code={code}, bits={bits}, lanes={lanes}) has {lanes} "
                    f"lanes; ExecuTorch tensors hold one value per element (lanes=1)")
    if code == kDLInt:
        t = 1 if bits == 8 else 2 if bits == 16 else 3 if bits == 32 else 4 if bits == 64 else -1
    elif code == kDLUInt:
        t = 0 if bits == 8 else 27 if bits == 16 else 28 if bits == 32 else 29 if bits == 64 else -1
    elif code == kDLFloat:
        t = 5 if bits == 16 else 6 if bits == 32 else 7 if bits == 64 else -1
    elif code == kDLBfloat:
        t = 15 if bits == 16 else -1
    elif code == kDLComplex:
        t = 8 if bits == 32 else 9 if bits == 64 else 10 if bits == 128 else -1
    elif code == kDLBool:
        t = 11 if bits == 8 else -1
    elif code == kDLFloat8_e5m2:
        t = 23 if bits == 8 else -1
    elif code == kDLFloat8_e4m3fn:
        t = 24 if bits == 8 else -1
    elif code == kDLFloat8_e5m2fnuz:
        t = 25 if bits == 8 else -1
    elif code == kDLFloat8_e4m3fnuz:
        t = 26 if bits == 8 else -1
    if t < 0:
        raise_error(Error.InvalidType,
                    f"DLPack dtype (code={code}, bits={bits}, lanes={lanes}) has no ExecuTorch "
                    f"ScalarType")
    return t


cdef Device _device_from_dl(object device_type, object device_id, str what):
    """etptr Device of a DLPack (device_type, device_id) pair."""
    cdef int64_t dt = 0, di = 0
    try:
        dt = PyNumber_Index(device_type)
        di = PyNumber_Index(device_id)
    except (TypeError, OverflowError):
        raise_error(Error.InvalidType,
                    f"{what}=({device_type!r}, {device_id!r}) is not a DLPack "
                    f"(device_type, device_id) pair of ints")
    if dt == kDLCPU or dt == kDLCUDAHost or dt == kDLROCMHost:
        # page-locked host memory is host memory: numpy() and the CPU paths read it
        return _CPU
    if dt == kDLCUDA or dt == kDLCUDAManaged:
        if not 0 <= di <= 127:
            raise_error(Error.InvalidArgument,
                        f"{what}=({dt}, {di}): device id {di} is outside ExecuTorch's "
                        f"DeviceIndex (int8, 0..127)")
        return c_make_device(1, di)
    raise_error(Error.NotSupported,
                f"{what}=({dt}, {di}): DLPack device type "
                f"{_DL_DEVICE_NAMES.get(dt, 'unknown')} is not supported; etptr tensors "
                f"live on the CPU or on CUDA devices")


cdef tuple _dl_pair(Device d):
    if d.c_type == DEVICE_CPU:
        return (<int>kDLCPU, 0)
    return (<int>kDLCUDA, d.c_index)


cdef Device _resolve(Device d):
    """A concrete device for ``d``: index -1 asks the device type's allocator."""
    cdef DeviceAllocator alloc
    if d.c_type == DEVICE_CPU or d.c_index >= 0:
        return d
    alloc = c_allocator_for(d.c_type, d.c_index, "device")
    return c_make_device(d.c_type, alloc.c_resolve_index(-1))


# ------------------------------------------------------------------ strided copies

cdef void _strided_copy(char* dst, const char* src, int ndim, const int64_t* shape,
                        const int64_t* bstrides, int64_t itemsize, int64_t numel) noexcept nogil:
    """Copy ``numel`` elements laid out by byte strides into contiguous (C order) ``dst``."""
    cdef int64_t idx[kTensorDimensionLimit]
    cdef int64_t k
    cdef int d
    cdef const char* p = src
    for d in range(ndim):
        idx[d] = 0
    for k in range(numel):
        memcpy(dst + k * itemsize, p, itemsize)
        d = ndim - 1
        while d >= 0:
            idx[d] += 1
            p += bstrides[d]
            if idx[d] < shape[d]:
                break
            p -= bstrides[d] * shape[d]
            idx[d] = 0
            d -= 1


cdef int _span_overflow(DLTensor* dl, int i) except -1:
    raise_error(Error.InvalidArgument,
                f"DLPack strides={tuple([dl.strides[k] for k in range(dl.ndim)])} for "
                f"shape={tuple([dl.shape[k] for k in range(dl.ndim)])}: the bytes dim {i} "
                f"spans overflow int64")


cdef TensorPtr _contiguous_copy(DLTensor* dl, Metadata meta, int type, const char* base):
    """A C-contiguous host copy of a CPU DLTensor whose strides no dim_order describes."""
    cdef int64_t itemsize = c_element_size(type)
    cdef int64_t bstrides[kTensorDimensionLimit]
    cdef int64_t nbytes = meta.numel * itemsize
    cdef int64_t lo = 0, hi = 0, mag, ext      # bytes the elements reach below / above base
    cdef int i
    cdef TensorPtr t
    for i in range(dl.ndim):
        if dl.strides[i] > INT64_MAX // itemsize or dl.strides[i] < -(INT64_MAX // itemsize):
            raise_error(Error.InvalidArgument,
                        f"DLPack strides[{i}]={dl.strides[i]} overflows int64 in bytes")
        bstrides[i] = dl.strides[i] * itemsize
        # the span the copy walks, |stride| * (size - 1) per dim, must fit int64 and the
        # address space: the walk below adds the strides to a pointer
        mag = bstrides[i] if bstrides[i] >= 0 else -bstrides[i]
        if meta.sizes[i] > 1 and mag:
            if meta.sizes[i] - 1 > INT64_MAX // mag:
                _span_overflow(dl, i)
            ext = mag * (meta.sizes[i] - 1)
            if bstrides[i] > 0:
                if hi > INT64_MAX - itemsize - ext:
                    _span_overflow(dl, i)
                hi += ext
            else:
                if lo > INT64_MAX - ext:
                    _span_overflow(dl, i)
                lo += ext
    if <uintptr_t>base < <uintptr_t>lo or \
            <uintptr_t>base + <uintptr_t>(hi + itemsize) < <uintptr_t>base:
        raise_error(Error.InvalidArgument,
                    f"DLPack data=0x{<uintptr_t>base:x} with strides "
                    f"{tuple([dl.strides[i] for i in range(dl.ndim)])} reaches outside the "
                    f"address space")
    cdef Storage s = c_host_storage(nbytes)
    t = c_new_tensor(meta, type, _DYNAMIC_BOUND, _CPU, s, s.c_ptr, False)
    with nogil:
        _strided_copy(<char*>t.c_data, base, dl.ndim, meta.sizes, bstrides, itemsize,
                      meta.numel)
    return t


# ------------------------------------------------------------------ capsule import

cdef str _capsule_name(object capsule):
    cdef const char* name = PyCapsule_GetName(capsule)
    return "<unnamed>" if name == NULL else (<bytes>name).decode("utf-8", "replace")


cdef TensorPtr _import_capsule(object capsule, Device expect, bint copy):
    """Consume a DLPack capsule and return a TensorPtr over its memory.

    ``expect`` (or None) is the device the producer said the data is on.
    ``copy``: the result must own a copy: unless the producer says it copied
    (DLPack's IS_COPIED flag), etptr copies (host data on the host, device data
    through the host); strides that no dim_order describes are then copied to
    C-contiguous layout (host data) instead of refused. Nothing is consumed
    until every check has passed: on any error the capsule keeps its name, and
    its own destructor runs the producer's deleter.
    """
    cdef DLManagedTensorVersioned* vm = NULL
    cdef DLManagedTensor* lm = NULL
    cdef DLTensor* dl = NULL
    cdef uint64_t flags = 0
    cdef int type, i
    cdef int64_t numel, esize
    cdef uintptr_t address
    cdef bint strides_ok = True
    cdef Metadata meta
    cdef Device dev
    cdef _DLPackOwner owner
    cdef TensorPtr t
    if not PyCapsule_CheckExact(capsule):
        raise_error(Error.InvalidType,
                    f"__dlpack__ returned {c_type_name(capsule)}, not a PyCapsule")
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        vm = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if vm.version.major > DLPACK_MAJOR_VERSION:
            raise_error(Error.NotSupported,
                        f"the producer's DLPack capsule is version {vm.version.major}."
                        f"{vm.version.minor}; etptr reads DLPack {DLPACK_MAJOR_VERSION}.x")
        dl = &vm.dl_tensor
        flags = vm.flags
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        lm = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        dl = &lm.dl_tensor
    else:
        name = _capsule_name(capsule)
        if name.startswith("used_"):
            raise_error(Error.InvalidArgument,
                        f"the DLPack capsule is named {name!r}: it was consumed already "
                        f"(a capsule can be imported once; call __dlpack__ again)")
        raise_error(Error.InvalidType,
                    f"the capsule is named {name!r}, not 'dltensor_versioned' or 'dltensor'")

    # ---- validate everything while the producer still owns the capsule
    if dl.ndim < 0 or dl.ndim > kTensorDimensionLimit:
        raise_error(Error.InvalidArgument,
                    f"DLPack ndim={dl.ndim}: ExecuTorch tensors have 0..{kTensorDimensionLimit} "
                    f"dims (kTensorDimensionLimit)")
    if dl.ndim > 0 and dl.shape == NULL:
        raise_error(Error.InvalidArgument, f"DLPack shape is NULL for ndim={dl.ndim}")
    type = _scalar_type_of(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes)
    dev = _device_from_dl(dl.device.device_type, dl.device.device_id, "DLTensor.device")
    if expect is not None and dev != expect:
        raise_error(Error.InvalidArgument,
                    f"the producer's __dlpack_device__ says {expect} but its DLPack capsule "
                    f"holds data on {dev}")
    shape = tuple([dl.shape[i] for i in range(dl.ndim)])
    meta = c_metadata(shape, None, None)      # sizes: negative / overflow checks
    numel = meta.numel
    esize = c_element_size(type)
    if numel > INT64_MAX // esize:
        raise_error(Error.InvalidArgument,
                    f"DLPack shape={shape}: the byte count overflows int64")
    if dl.strides != NULL and numel > 0:      # NULL strides: C-contiguous (DLPack < 1.0 rule)
        strides = tuple([dl.strides[i] for i in range(dl.ndim)])
        try:
            meta = c_metadata(shape, None, strides)
        except InvalidArgumentError:
            strides_ok = False
        if not strides_ok:
            if not copy or dev.c_type != DEVICE_CPU:
                raise_error(Error.InvalidArgument,
                            f"DLPack strides={strides} (elements) for shape={shape} are not "
                            f"described by any dim_order (negative, broadcast or gapped "
                            f"strides); " + (
                                "from_dlpack(x, copy=True) makes a contiguous copy, or make "
                                "it contiguous in the producing library first (e.g. "
                                "x.contiguous() or numpy.ascontiguousarray(x))"
                                if dev.c_type == DEVICE_CPU else
                                "make it contiguous in the producing library first (e.g. "
                                "cupy.ascontiguousarray(x) or x.contiguous())"))
    if dl.data == NULL and numel > 0:
        raise_error(Error.InvalidArgument,
                    f"DLPack data is NULL for shape={shape} ({numel} elements)")
    if dl.byte_offset > <uint64_t>INT64_MAX or \
            (dl.data != NULL and <uintptr_t>dl.data + <uintptr_t>dl.byte_offset < <uintptr_t>dl.data):
        raise_error(Error.InvalidArgument,
                    f"DLPack byte_offset={dl.byte_offset} overflows the address space")
    address = 0 if dl.data == NULL else <uintptr_t>dl.data + <uintptr_t>dl.byte_offset
    copied = (flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0

    # ---- consume: from here on the owner runs the producer's deleter exactly once
    owner = _DLPackOwner.__new__(_DLPackOwner)
    if vm != NULL:
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        owner.c_managed = vm
        owner.c_versioned = True
    else:
        PyCapsule_SetName(capsule, b"used_dltensor")
        owner.c_managed = lm
        owner.c_versioned = False
    if not strides_ok:
        return _contiguous_copy(dl, meta, type, <const char*>address)
    t = c_new_tensor(meta, type, _DYNAMIC_BOUND, dev,
                     c_storage(address, c_nbytes(numel, type), owner, None), address,
                     (flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0)
    if copy and not copied:
        if dev.c_type == DEVICE_CPU:
            return clone_tensor_ptr(t)
        return c_clone_to(c_clone_to(t, _CPU, None, True), dev, None, True)
    return t


cdef TensorPtr _consume(object capsule_box, Device expect, bint copy):
    """:func:`_import_capsule` of ``capsule_box[0]``, then the box is emptied. When the
    import fails, the capsule is dropped before the error is raised again: its
    destructor (the producer's, perhaps Python code) runs with no exception pending."""
    cdef TensorPtr t = None
    error = None
    try:
        t = _import_capsule(capsule_box[0], expect, copy)
    except BaseException as exc:
        error = exc
    capsule_box[0] = None
    if error is not None:
        raise error
    return t


cdef object _dlpack_call(object obj, dict kwargs):
    """``obj.__dlpack__(**kwargs)``; a producer's BufferError becomes NotSupportedError."""
    try:
        return obj.__dlpack__(**kwargs)
    except BufferError as exc:
        raise_error(Error.NotSupported,
                    f"{c_type_name(obj)}.__dlpack__({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                    f"refused: {exc}")


cdef object _request(object obj, object dl_device, object copy):
    """Ask the producer for a capsule: versioned first, legacy when it refuses the keywords."""
    cdef dict kwargs = {"max_version": (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)}
    if dl_device is not None:
        kwargs["dl_device"] = dl_device
    if copy is not None:
        kwargs["copy"] = copy
    try:
        return _dlpack_call(obj, kwargs)
    except TypeError:
        pass
    if dl_device is not None or copy is not None:
        # a DLPack 1.0 producer that knows max_version but not these keywords
        try:
            return _dlpack_call(obj, {"max_version": kwargs["max_version"]})
        except TypeError:
            pass
    # a legacy (pre-1.0) producer: no keywords at all
    return _dlpack_call(obj, {})


def from_dlpack(obj, *, device=None, copy=None):
    """A TensorPtr over the memory of a DLPack producer, without copying.

    ``obj`` is anything with ``__dlpack__`` and ``__dlpack_device__`` (a
    NumPy array on the CPU, a CuPy array or torch tensor on CUDA, another
    TensorPtr) or a DLPack ``PyCapsule`` itself. etptr asks for a versioned
    capsule (``max_version=(1, 1)``) and falls back to a legacy one when the
    producer refuses the keyword (``TypeError``). The capsule is consumed
    (renamed ``used_dltensor*``); the producer's managed tensor is kept alive
    by the result and its deleter runs exactly once, when the last TensorPtr
    over it dies, or at once when the import fails after consuming.

    The result has the producer's sizes (DLPack shape), its strides (in
    elements; NULL strides mean C-contiguous), the dim_order those strides
    describe, data at ``data + byte_offset``, and the ScalarType of the DLPack
    dtype (int/uint 8-64, float 16-64, bfloat16, complex 32-128, bool, the
    four Float8 types ExecuTorch has). A read-only DLPack tensor gives a
    read-only TensorPtr. ``kDLCPU`` and page-locked host memory
    (``kDLCUDAHost``) are ``cpu``; ``kDLCUDA`` and ``kDLCUDAManaged`` device
    ``N`` are ``cuda:N``. Shape dynamism is DYNAMIC_BOUND (STATIC for 0-dim).

    Parameters
    ----------
    obj : DLPack producer or PyCapsule
    device : Device, DeviceType or str, optional
        Where the result must live. Another device than the producer's is
        asked of the producer (``dl_device``); when it cannot, the data is
        imported where it is and copied with :func:`clone_tensor_ptr_to`
        through the registered DeviceAllocator.
    copy : bool, optional
        True: the result owns a copy (the producer's, or a host copy etptr
        makes; a CPU tensor whose strides no dim_order describes is copied to
        C-contiguous layout). False: never copy (an error where a copy would
        be needed). None: copy only to change device.

    Raises
    ------
    InvalidTypeError
        ``obj`` is no DLPack producer, the capsule is not a DLPack capsule, or
        the DLPack dtype has no ScalarType (an unknown type code or width).
    InvalidArgumentError
        Strides that no dim_order describes (the message says how to copy),
        a capsule consumed already, more than 16 dims, NULL data with
        elements, a device index outside int8, ``copy=False`` with a change
        of device.
    NotSupportedError
        The producer refused the export (its ``BufferError``), vector lanes,
        a device type etptr does not have, a capsule of DLPack 2.x or newer,
        ``copy=True`` for device data the producer did not copy.
    NotFoundError
        A change of device needs an allocator that is not registered.

    Notes
    -----
    Mirrors ExecuTorch ``make_tensor_ptr`` over a raw pointer with a deleter;
    the array API's ``from_dlpack`` protocol. No ``stream`` is passed:
    the producer makes CUDA data ready on the legacy default stream.
    Exceptions other than ``BufferError`` and ``TypeError`` raised by the
    producer's ``__dlpack__`` propagate unchanged.
    """
    cdef Device want = None
    cdef Device src = None
    cdef TensorPtr t
    cdef list box
    if copy is not None and not isinstance(copy, bool):
        raise_error(Error.InvalidType, f"copy={copy!r} must be True, False or None")
    if device is not None:
        want = _resolve(c_device(device, "device"))
    if PyCapsule_CheckExact(obj):
        # the caller holds the capsule: nothing of it is dropped here
        t = _import_capsule(obj, None, copy is True)
        return _moved(t, want, copy)
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise_error(Error.InvalidType,
                    f"obj of type {c_type_name(obj)} is not a DLPack producer (it needs "
                    f"__dlpack__ and __dlpack_device__); for buffers use "
                    f"etptr.make_tensor_ptr, for __cuda_array_interface__ "
                    f"etptr.from_cuda_array_interface")
    pair = obj.__dlpack_device__()
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise_error(Error.InvalidType,
                    f"{c_type_name(obj)}.__dlpack_device__() returned {pair!r:.80}, not a "
                    f"(device_type, device_id) tuple")
    src = _device_from_dl(pair[0], pair[1], f"{c_type_name(obj)}.__dlpack_device__()")
    if want is not None and want != src:
        if copy is False:
            raise_error(Error.InvalidArgument,
                        f"device={want}: the data is on {src}, and copy=False forbids the "
                        f"copy a change of device needs")
        box = [None]
        try:
            box[0] = _request(obj, _dl_pair(want), copy)
        except (NotImplementedError, ValueError):
            box[0] = None         # the producer cannot move it: import where it is, copy below
        if box[0] is not None:
            return _moved(_consume(box, None, False), want, copy)
        box[0] = _request(obj, None, None)
        return _moved(_consume(box, src, False), want, copy)
    box = [_request(obj, None, copy)]
    return _consume(box, src, copy is True)


cdef TensorPtr _moved(TensorPtr t, Device want, object copy):
    """``t`` on ``want`` (None: where it is); a change of device copies through the
    registered allocator (refused with ``copy=False``)."""
    if want is None or t.c_device == want:
        return t
    if copy is False:
        raise_error(Error.InvalidArgument,
                    f"device={want}: the data is on {t.c_device}, and copy=False forbids the "
                    f"copy a change of device needs")
    return c_clone_to(t, want, None, True)


# ------------------------------------------------------------------ CUDA Array Interface

cdef object _cuda_driver(str what):
    """etptr's CUDA driver layer, or NotSupportedError naming ``what`` when CUDA support
    (CuPy) is missing."""
    try:
        from etptr.cuda import _driver
        _driver._cupy()
    except ImportError as exc:
        raise_error(Error.NotSupported,
                    f"from_cuda_array_interface: {what} needs CuPy (pip install etptr[cuda13] "
                    f"or [cuda12]): {exc}")
    except NotImplementedError as exc:
        raise_error(Error.NotSupported, f"from_cuda_array_interface: {what}: {exc}")
    return _driver


cdef Device _cuda_pointer_device(uintptr_t ptr):
    """The device owning ``ptr``, asked of the CUDA driver."""
    driver = _cuda_driver(f"finding the device that owns 0x{ptr:x} (or pass device= to name it)")
    if ptr == 0:
        # no memory to ask about (a zero-size array): the current device
        return c_make_device(1, driver.current_device())
    kind, dev = driver.pointer_device(ptr)
    if kind == "host":       # page-locked host memory
        return _CPU
    if not 0 <= dev <= 127:
        raise_error(Error.InvalidArgument,
                    f"data=0x{ptr:x} is on CUDA device {dev}, outside ExecuTorch's "
                    f"DeviceIndex (int8)")
    return c_make_device(1, dev)


cdef _sync_stream(object stream):
    _cuda_driver(f"waiting for stream={stream!r}").synchronize_stream(stream)


cdef int64_t _cai_int(object v, str argname) except? -1:
    return c_int_arg(v, argname, INT64_MIN, INT64_MAX)


def from_cuda_array_interface(obj, *, device=None):
    """A TensorPtr over the memory ``obj.__cuda_array_interface__`` describes.

    Reads the CUDA Array Interface (version 3): ``shape``, ``typestr`` (a
    NumPy type string, native byte order), ``data`` (address, read-only
    flag), ``strides`` (bytes; None or absent means C-contiguous) and
    ``stream`` (when given, etptr waits for it before returning). No copy is
    made; the result keeps ``obj`` alive. The interface has no device field:
    the device that owns the address is asked of the CUDA runtime
    (``cudaPointerGetAttributes`` through CuPy), never assumed; page-locked
    host memory gives a CPU tensor. A zero-size array with a null address is
    labelled with the current device.

    Parameters
    ----------
    obj : object with ``__cuda_array_interface__``
    device : Device or str, optional
        The device that owns the memory, when the caller knows it; skips the
        runtime query (and so works without CuPy).

    Raises
    ------
    InvalidTypeError
        ``obj`` has no ``__cuda_array_interface__``, a field has the wrong
        Python type, or ``typestr`` has no ExecuTorch ScalarType.
    InvalidArgumentError
        Negative or overflowing shape, byte strides that are not multiples
        of the item size or that no dim_order describes (the message says how
        to copy), a null address with elements, ``stream=0``, an address the
        CUDA runtime does not know.
    NotSupportedError
        A ``mask``, an interface version above 3, or no CuPy to find the
        device (pass ``device=``) or to wait for ``stream``.

    Notes
    -----
    Mirrors ExecuTorch ``make_tensor_ptr`` over a raw device pointer, with
    the producer as the owner. Dynamism is DYNAMIC_BOUND (STATIC for 0-dim).
    """
    cdef Device dev
    cdef Metadata meta
    cdef TensorPtr t
    cdef int type, i
    cdef int64_t itemsize, ptr, nb
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise_error(Error.InvalidType,
                    f"obj of type {c_type_name(obj)} has no __cuda_array_interface__")
    if not isinstance(cai, dict):
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__ is a {c_type_name(cai)}, not a dict")
    version = cai.get("version", 0)
    if _cai_int(version, "__cuda_array_interface__['version']") > 3:
        raise_error(Error.NotSupported,
                    f"__cuda_array_interface__ version {version}: etptr reads versions up to 3")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            raise_error(Error.InvalidArgument, f"__cuda_array_interface__ has no {key!r} field")
    if cai.get("mask") is not None:
        raise_error(Error.NotSupported,
                    "__cuda_array_interface__ has a mask: masked arrays are not supported")
    shape = cai["shape"]
    if not isinstance(shape, (tuple, list)):
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__['shape']={shape!r} is not a tuple of ints")
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__['typestr']={typestr!r} is not a str")
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__['typestr']={typestr!r} is not a type string")
    type = scalar_type_from_numpy(dtype)
    itemsize = c_element_size(type)
    data = cai["data"]
    if not isinstance(data, tuple) or len(data) != 2:
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__['data']={data!r} is not an (address, read_only) tuple")
    ptr = _cai_int(data[0], "__cuda_array_interface__['data'][0]")
    if ptr < 0:
        raise_error(Error.InvalidArgument,
                    f"__cuda_array_interface__['data'][0]={data[0]!r} is not an address")
    meta = c_metadata(shape, None, None)
    if meta.numel > INT64_MAX // itemsize:
        raise_error(Error.InvalidArgument,
                    f"__cuda_array_interface__ shape={tuple(shape)}: the byte count overflows int64")
    strides = cai.get("strides")
    if strides is not None and meta.numel > 0:
        if not isinstance(strides, (tuple, list)) or len(strides) != meta.dim:
            raise_error(Error.InvalidArgument,
                        f"__cuda_array_interface__['strides']={strides!r} is not a tuple of "
                        f"{meta.dim} ints")
        estrides = []
        for i in range(meta.dim):
            nb = _cai_int(strides[i], f"__cuda_array_interface__['strides'][{i}]")
            if nb % itemsize != 0:
                raise_error(Error.InvalidArgument,
                            f"__cuda_array_interface__ strides={tuple(strides)} (bytes) are not "
                            f"multiples of the item size {itemsize}; make it contiguous first "
                            f"(e.g. cupy.ascontiguousarray(x))")
            estrides.append(nb // itemsize)
        try:
            meta = c_metadata(shape, None, estrides)
        except InvalidArgumentError:
            raise_error(Error.InvalidArgument,
                        f"__cuda_array_interface__ strides={tuple(strides)} (bytes) for "
                        f"shape={tuple(shape)} are not described by any dim_order (negative, "
                        f"broadcast or gapped strides); make it contiguous first (e.g. "
                        f"cupy.ascontiguousarray(x) or x.contiguous())")
    if ptr == 0 and meta.numel > 0:
        raise_error(Error.InvalidArgument,
                    f"__cuda_array_interface__ data address is null for shape={tuple(shape)}")
    readonly = data[1]
    # one isinstance per class: Cython does not check a tuple's PyObject_IsInstance for
    # errors, and an interrupt raised inside it would be lost
    if not (isinstance(readonly, bool) or isinstance(readonly, np.bool_)):
        raise_error(Error.InvalidType,
                    f"__cuda_array_interface__['data'][1]={readonly!r} is not a bool")
    stream = cai.get("stream")
    if stream is not None:
        if _cai_int(stream, "__cuda_array_interface__['stream']") == 0:
            raise_error(Error.InvalidArgument,
                        "__cuda_array_interface__['stream']=0 is ambiguous and not allowed "
                        "(use 1 for the legacy default stream, 2 for per-thread)")
    if device is not None:
        dev = c_device(device, "device")
    else:
        dev = _cuda_pointer_device(<uintptr_t>ptr)
    if stream is not None:
        _sync_stream(stream)
    return c_new_tensor(meta, type, _DYNAMIC_BOUND, dev,
                        c_storage(<uintptr_t>ptr, c_nbytes(meta.numel, type), obj, None),
                        <uintptr_t>ptr, bool(readonly))
