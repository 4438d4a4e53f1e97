"""Host<->device copies of tensors: ``clone_tensor_ptr_to`` and its seed names.

Registry-generic: every copy goes through the :class:`DeviceAllocator`
registered for the device type (the CUDA allocator takes the copy engine's
fast paths). A device tensor's memory is always read through the allocator
that owns it. Each function takes a snapshot of the source's layout and data
address before any user code (an allocator written in Python) runs, builds
its result from the snapshot, and frees what it took when a step fails.
"""
from libc.stdint cimport int64_t, uintptr_t

from etptr._core._device cimport Device, c_device, c_make_device
from etptr._core._device_allocator cimport DeviceAllocator, c_allocator_for
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport Metadata, c_nbytes
from etptr._core._storage cimport (
    Storage, c_check_alive, c_device_storage, c_export_storage, c_host_storage)
from etptr._core._tensor_ptr cimport TensorPtr, c_cpu, c_new_tensor, c_snapshot, c_tensor_arg

from etptr._core._args cimport c_type_name
from etptr._core._error import Error


cdef int _fail_after_taking(Storage s, BaseException exc) except -1:
    """``exc`` ended a copy after ``s`` was taken: free ``s`` now and raise ``exc``, with a
    failure of the free chained to it."""
    try:
        s.c_free_now()
    except BaseException as cleanup:
        raise exc from cleanup
    raise exc


cdef DeviceAllocator _owner_allocator(TensorPtr t, int* index):
    """The allocator that reads ``t``'s device memory and the device index to use: the
    one that allocated it, else the one registered for its device type."""
    cdef Storage s = t.c_storage
    cdef DeviceAllocator alloc
    if s.c_allocator is not None:
        index[0] = s.c_index
        return s.c_allocator
    alloc = c_allocator_for(t.c_device.c_type, t.c_device.c_index, "tensor.device")
    index[0] = alloc.c_resolve_index(t.c_device.c_index)
    return alloc


cdef TensorPtr c_clone_to(TensorPtr src, Device dst, object stream, bint pinned):
    """clone_tensor_ptr_to: CPU -> device or device -> CPU."""
    cdef Metadata meta = c_snapshot(src)          # before any user code runs
    cdef uintptr_t data = <uintptr_t>src.c_data
    cdef int type = src.c_type
    cdef int dynamism = src.c_dynamism
    cdef Device src_dev = src.c_device
    cdef int64_t nbytes = c_nbytes(meta.numel, type)
    cdef DeviceAllocator alloc
    cdef Storage s
    cdef TensorPtr out
    cdef int index
    if (src_dev.c_type == 0) == (dst.c_type == 0):
        raise_error(Error.NotSupported,
                    f"clone_tensor_ptr_to copies between the host and a device; {src_dev} -> "
                    f"{dst} is not supported" + (" (use clone_tensor_ptr for CPU copies)"
                                                 if dst.c_type == 0 else ""))
    if data == 0 and nbytes > 0:
        raise_error(Error.InvalidArgument,
                    "tensor has null data: there is nothing to copy (made with data=None)")
    c_check_alive(src.c_storage, "clone_tensor_ptr_to")
    if dst.c_type != 0:
        alloc = c_allocator_for(dst.c_type, dst.c_index, "device")
        index = alloc.c_resolve_index(dst.c_index)
        s = c_device_storage(alloc, nbytes, index, 8, stream if nbytes else None)
        out = c_new_tensor(meta, type, dynamism, c_make_device(dst.c_type, index), s,
                           s.c_ptr, False)
        if nbytes:
            try:
                alloc.c_copy_h2d(s.c_ptr, data, nbytes, index, stream)
            except BaseException as exc:
                out = None
                _fail_after_taking(s, exc)
        return out
    alloc = _owner_allocator(src, &index)
    host = alloc.c_allocate_host(nbytes, index) if pinned else None
    if host is None:
        s = c_host_storage(nbytes)
    else:
        s = c_export_storage(host, nbytes, True, f"{c_type_name(alloc)}.allocate_host")
        host = None
    out = c_new_tensor(meta, type, dynamism, c_cpu(), s, s.c_ptr, False)
    if nbytes:
        alloc.c_copy_d2h(s.c_ptr, data, nbytes, index, stream)
    return out


def clone_tensor_ptr_to(tensor, device, *, stream=None, pinned=True):
    """Copy ``tensor`` between the host and a device (ExecuTorch ``clone_tensor_ptr_to``).

    CPU -> device goes through the allocator registered for the device type;
    device -> CPU through the allocator that owns the source's memory. The
    result keeps sizes, dim_order, strides, scalar type and dynamism, owns its
    memory and frees it through the allocator when its last reference dies. A
    clone to device index -1 gets the index actually used.

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
    return c_clone_to(c_tensor_arg(tensor, "tensor"), c_device(device, "device"), stream, pinned)


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
    return c_clone_to(src, d, None, True)


def clone_tensor_ptr_to_cpu(tensor):
    """Copy a device tensor to the CPU. See :func:`clone_tensor_ptr_to` for the errors raised.
    """
    return c_clone_to(c_tensor_arg(tensor, "tensor"), c_cpu(), None, True)
