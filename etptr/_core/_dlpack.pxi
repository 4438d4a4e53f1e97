# DLPack export of TensorPtr (included by _tensor_ptr.pyx). The struct
# declarations live in _dlpack.pxd, shared with the importer in _interop.pyx.
from cpython.pycapsule cimport (
    PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New)
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdlib cimport free, malloc

from etptr._core._dlpack cimport (
    DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION, DLManagedTensor, DLManagedTensorVersioned, DLTensor, kDLBfloat,
    kDLBool, kDLComplex, kDLCPU, kDLCUDA, kDLFloat, kDLFloat8_e4m3fn, kDLFloat8_e4m3fnuz,
    kDLFloat8_e5m2, kDLFloat8_e5m2fnuz, kDLInt, kDLUInt)


# ScalarType code -> (DLPack type code, bits); code 255 = no DLPack equivalent.
cdef uint8_t[30] _DL_CODE = [
    kDLUInt, kDLInt, kDLInt, kDLInt, kDLInt, kDLFloat, kDLFloat, kDLFloat,
    kDLComplex, kDLComplex, kDLComplex, kDLBool, 255, 255, 255, kDLBfloat,
    255, 255, 255, 255, 255, 255, 255, kDLFloat8_e5m2, kDLFloat8_e4m3fn,
    kDLFloat8_e5m2fnuz, kDLFloat8_e4m3fnuz, kDLUInt, kDLUInt, kDLUInt]


cdef struct _DLContext:
    PyObject* owner           # the exported TensorPtr (a strong reference)
    int64_t shape[kTensorDimensionLimit]
    int64_t strides[kTensorDimensionLimit]


cdef void _release_ctx(void* ctx) noexcept nogil:
    if ctx == NULL:
        return
    with gil:
        Py_DECREF(<object>(<_DLContext*>ctx).owner)
    free(ctx)


cdef void _dl_deleter(DLManagedTensor* m) noexcept nogil:
    if m == NULL:
        return
    _release_ctx(m.manager_ctx)
    free(m)


cdef void _dl_deleter_versioned(DLManagedTensorVersioned* m) noexcept nogil:
    if m == NULL:
        return
    _release_ctx(m.manager_ctx)
    free(m)


cdef void _capsule_destructor(object capsule) noexcept:
    # Runs when the capsule dies; a consumer that took the tensor renamed it.
    cdef DLManagedTensor* m
    if PyCapsule_IsValid(capsule, b"dltensor"):
        m = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        if m != NULL and m.deleter != NULL:
            m.deleter(m)


cdef void _capsule_destructor_versioned(object capsule) noexcept:
    cdef DLManagedTensorVersioned* m
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        m = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if m != NULL and m.deleter != NULL:
            m.deleter(m)


cdef tuple _dlpack_device(TensorPtr t):
    if t.c_device.c_type == DEVICE_CPU:
        return (kDLCPU, 0)
    return (kDLCUDA, t.c_device.c_index)


cdef int _fill_dltensor(DLTensor* dl, _DLContext* ctx, TensorPtr t, uintptr_t address) except -1:
    cdef int i
    cdef uint8_t code = _DL_CODE[t.c_type]
    for i in range(t.c_dim):
        ctx.shape[i] = t.c_sizes[i]
        ctx.strides[i] = t.c_strides[i]
    dl.data = <void*>address
    dl.device.device_type = kDLCPU if t.c_device.c_type == DEVICE_CPU else kDLCUDA
    dl.device.device_id = 0 if t.c_device.c_type == DEVICE_CPU else t.c_device.c_index
    dl.ndim = t.c_dim
    dl.dtype.code = code
    dl.dtype.bits = <uint8_t>(8 * c_element_size(t.c_type)) if code != kDLBool else 8
    dl.dtype.lanes = 1
    dl.shape = ctx.shape
    dl.strides = ctx.strides
    dl.byte_offset = 0
    return 0


cdef tuple _dl_device_arg(object dl_device):
    """``dl_device`` as a (device_type, device_id) pair of ints, or BufferError."""
    if not isinstance(dl_device, tuple) or len(dl_device) != 2:
        raise BufferError(f"dl_device={dl_device!r:.80} is not a (device_type, device_id) tuple")
    try:
        return (PyNumber_Index(dl_device[0]), PyNumber_Index(dl_device[1]))
    except TypeError:
        raise BufferError(f"dl_device={dl_device!r:.80} is not a (device_type, device_id) "
                          f"tuple of ints")


cdef object _to_dlpack(TensorPtr t, object stream, object max_version, object dl_device,
                       object copy):
    cdef bint versioned = False
    cdef bint copied = False
    cdef uintptr_t address
    cdef _DLContext* ctx
    cdef DLManagedTensor* legacy
    cdef DLManagedTensorVersioned* vm
    if _DL_CODE[t.c_type] == 255:
        raise BufferError(f"ScalarType.{_SCALAR_TYPES[t.c_type].name} has no DLPack data type")
    if dl_device is not None and _dl_device_arg(dl_device) != _dlpack_device(t):
        raise BufferError(f"dl_device={tuple(dl_device)!r}: the tensor is on {t.c_device} "
                          f"{_dlpack_device(t)}; copy it with clone_tensor_ptr_to first")
    if t.c_device.c_type == DEVICE_CUDA and stream is not None and not isinstance(stream, bool):
        try:
            if PyNumber_Index(stream) == 0:
                raise BufferError("stream=0 is ambiguous for CUDA and refused by the DLPack "
                                  "protocol: pass 1 (legacy default stream), 2 (per-thread "
                                  "default stream) or a stream handle")
        except TypeError:
            pass                  # a stream object: nothing to wait for (see the docstring)
    if max_version is not None:
        try:
            versioned = int(max_version[0]) >= 1
        except (TypeError, IndexError, ValueError):
            raise BufferError(f"max_version={max_version!r} is not a (major, minor) tuple")
    c_check_alive(t.c_storage, "__dlpack__")
    if copy:
        if t.c_device.c_type != DEVICE_CPU:
            raise BufferError("copy=True is supported for CPU tensors only; "
                              "use clone_tensor_ptr_to for device copies")
        from etptr._core._make_tensor_ptr import clone_tensor_ptr
        t = clone_tensor_ptr(t)
        copied = True
    if t.c_data == NULL and t.c_numel != 0:
        raise BufferError("the tensor has null data (made with data=None)")
    if not versioned and t.c_readonly:
        raise BufferError("the tensor's memory is read-only, which a legacy (pre-1.0) DLPack "
                          "capsule cannot express; ask for max_version=(1, 0) or copy it")
    address = _export_address(t)
    ctx = <_DLContext*>malloc(sizeof(_DLContext))
    if ctx == NULL:
        raise MemoryError()
    ctx.owner = <PyObject*>t
    Py_INCREF(t)
    if versioned:
        vm = <DLManagedTensorVersioned*>malloc(sizeof(DLManagedTensorVersioned))
        if vm == NULL:
            _release_ctx(ctx)
            raise MemoryError()
        vm.version.major = DLPACK_MAJOR_VERSION
        vm.version.minor = DLPACK_MINOR_VERSION
        vm.manager_ctx = ctx
        vm.deleter = _dl_deleter_versioned
        vm.flags = (DLPACK_FLAG_BITMASK_READ_ONLY if t.c_readonly else 0) | \
                   (DLPACK_FLAG_BITMASK_IS_COPIED if copied else 0)
        _fill_dltensor(&vm.dl_tensor, ctx, t, address)
        try:
            return PyCapsule_New(vm, b"dltensor_versioned", _capsule_destructor_versioned)
        except BaseException:
            _dl_deleter_versioned(vm)
            raise
    legacy = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
    if legacy == NULL:
        _release_ctx(ctx)
        raise MemoryError()
    legacy.manager_ctx = ctx
    legacy.deleter = _dl_deleter
    _fill_dltensor(&legacy.dl_tensor, ctx, t, address)
    try:
        return PyCapsule_New(legacy, b"dltensor", _capsule_destructor)
    except BaseException:
        _dl_deleter(legacy)
        raise
