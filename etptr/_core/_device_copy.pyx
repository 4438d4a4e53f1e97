"""Host<->device copies of tensors: ``clone_tensor_ptr_to`` and its seed names, copies
into existing tensors (ExecuTorch's ``et_copy`` ops), and their batched forms.

Registry-generic: every copy goes through the :class:`DeviceAllocator`
registered for the device type (the CUDA allocator takes the copy engine's
fast paths, and moves a batch as a few large transfers). A device tensor's
memory is always read and written through the allocator that owns it. Each
function checks every argument and takes a snapshot of each source's layout
and data address before any user code (an allocator written in Python) runs
and before any byte moves, builds its results from the snapshots, and frees
what it took when a step fails.
"""
cimport cython
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc

from etptr._core._codes cimport (
    DEFAULT_ALIGNMENT_BYTES, DEVICE_ALIGNMENT_BYTES, DEVICE_CPU, align_up)
from etptr._core._device cimport Device, c_device, c_make_device
from etptr._core._device_allocator cimport (
    BATCH_DEVICE_ONE_ALLOCATION, BATCH_HOST_ALLOCATED, BATCH_HOST_ONE_ALLOCATION, BATCH_PADDED,
    DeviceAllocator, c_allocator_for)
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport Metadata, c_nbytes, c_tuple64, c_tuple8
from etptr._core._storage cimport (
    Storage, c_check_alive, c_device_storage, c_export_storage, c_host_storage)
from etptr._core._tensor_ptr cimport (
    TensorPtr, c_copy_layout, c_cpu, c_new_tensor, c_set_memory, c_snapshot, c_tensor_arg)

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


cdef Storage _landing(DeviceAllocator alloc, int64_t nbytes, int index, bint pinned):
    """Host memory a device -> host clone lands in: the allocator's ``allocate_host``
    memory (page-locked, for CUDA) with ``pinned``, when it gives some, else pageable."""
    cdef Storage s
    host = alloc.c_allocate_host(nbytes, index) if pinned and nbytes else None
    if host is None:
        return c_host_storage(nbytes)
    s = c_export_storage(host, nbytes, True, f"{c_type_name(alloc)}.allocate_host")
    s.c_host_of = alloc
    return s


cdef int _facts(list devs, list hosts, DeviceAllocator alloc) except -1:
    """What the batch layer may know without asking the driver (the BATCH_ flags): the
    tensors of ``devs`` (the device sides) share one allocation of ``alloc``; those of
    ``hosts`` share one allocation; every host side is ``alloc``'s allocate_host memory.
    Tensors of 0 bytes are not in the lists."""
    cdef int facts = BATCH_DEVICE_ONE_ALLOCATION | BATCH_HOST_ONE_ALLOCATION | \
        BATCH_HOST_ALLOCATED
    cdef Storage first = (<TensorPtr>devs[0]).c_storage
    cdef Storage s
    cdef TensorPtr t
    if first.c_allocator is not alloc:
        facts &= ~BATCH_DEVICE_ONE_ALLOCATION
    for t in devs:
        if t.c_storage is not first:
            facts &= ~BATCH_DEVICE_ONE_ALLOCATION
            break
    first = (<TensorPtr>hosts[0]).c_storage
    for t in hosts:
        s = t.c_storage
        if s is not first:
            facts &= ~BATCH_HOST_ONE_ALLOCATION
        if s.c_host_of is not alloc:
            facts &= ~BATCH_HOST_ALLOCATED
    return facts


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
    if (src_dev.c_type == DEVICE_CPU) == (dst.c_type == DEVICE_CPU):
        raise_error(Error.NotSupported,
                    f"clone_tensor_ptr_to copies between the host and a device; {src_dev} -> "
                    f"{dst} is not supported" + (" (use clone_tensor_ptr for CPU copies)"
                                                 if dst.c_type == DEVICE_CPU else ""))
    if data == 0 and nbytes > 0:
        raise_error(Error.InvalidArgument,
                    "tensor has null data: there is nothing to copy (made with data=None)")
    c_check_alive(src.c_storage, "clone_tensor_ptr_to")
    if dst.c_type != DEVICE_CPU:
        alloc = c_allocator_for(dst.c_type, dst.c_index, "device")
        index = alloc.c_resolve_index(dst.c_index)
        s = c_device_storage(alloc, nbytes, index, DEFAULT_ALIGNMENT_BYTES,
                               stream if nbytes else None)
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
    s = _landing(alloc, nbytes, index, pinned)
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
    if d.c_type == DEVICE_CPU:
        raise_error(Error.NotSupported,
                    f"device={d}: clone_tensor_ptr_to_device copies to a device, not the CPU")
    return c_clone_to(src, d, None, True)


def clone_tensor_ptr_to_cpu(tensor):
    """Copy a device tensor to the CPU. See :func:`clone_tensor_ptr_to` for the errors raised.
    """
    return c_clone_to(c_tensor_arg(tensor, "tensor"), c_cpu(), None, True)


# ------------------------------------------------------------------ batches



@cython.final
cdef class _Pieces:
    """The C arrays of a batch: piece i moves n[i] bytes from src[i] to dst[i]."""
    cdef uintptr_t* dst
    cdef uintptr_t* src
    cdef int64_t* n
    cdef int64_t count

    def __dealloc__(self):
        free(self.dst)
        free(self.src)
        free(self.n)


cdef _Pieces _pieces(int64_t count):
    cdef _Pieces p = _Pieces.__new__(_Pieces)
    cdef int64_t k = count if count > 0 else 1
    p.dst = <uintptr_t*>malloc(k * sizeof(uintptr_t))
    p.src = <uintptr_t*>malloc(k * sizeof(uintptr_t))
    p.n = <int64_t*>malloc(k * sizeof(int64_t))
    if p.dst == NULL or p.src == NULL or p.n == NULL:
        raise MemoryError()
    return p


cdef str _arg(bint out, Py_ssize_t i, bint batch):
    """The name of a pair's source (``out`` False) or out: ``src``, or ``src[i]`` in a batch."""
    name = "out" if out else "src"
    return f"{name}[{i}]" if batch else name


cdef list _tensor_list(object seq, str name):
    """The tensors of a sequence argument, read once and checked to be TensorPtrs."""
    cdef list items
    cdef Py_ssize_t i
    if isinstance(seq, TensorPtr) or isinstance(seq, str) or isinstance(seq, bytes) or \
            not hasattr(seq, "__len__"):
        raise_error(Error.InvalidType,
                    f"{name} must be a sequence of etptr.TensorPtr, got {seq!r:.80} of type "
                    f"{c_type_name(seq)}")
    items = list(seq)
    for i in range(len(items)):
        if not isinstance(items[i], TensorPtr):     # (the name is made only for the error)
            c_tensor_arg(items[i], f"{name}[{i}]")
    return items


cdef bint _same_sizes(TensorPtr a, TensorPtr b) noexcept:
    cdef int d
    if a.c_dim != b.c_dim:
        return False
    for d in range(a.c_dim):
        if a.c_sizes[d] != b.c_sizes[d]:
            return False
    return True


cdef bint _same_dim_order(TensorPtr a, TensorPtr b) noexcept:
    cdef int d
    for d in range(a.c_dim):
        if a.c_dim_order[d] != b.c_dim_order[d]:
            return False
    return True


cdef int _check_pair(TensorPtr src, TensorPtr out, Py_ssize_t i, bint batch, bint h2d) except -1:
    """ExecuTorch's _h2d_copy / _d2h_copy checks, and etptr's stricter layout ones. Per
    pair of a batch this is a few comparisons: an argument's name (``_arg``) is made
    only for the error that names it."""
    if h2d and src.c_device.c_type != DEVICE_CPU:
        raise_error(Error.InvalidArgument, f"{_arg(False, i, batch)}.device={src.c_device}: "
                                           f"h2d_copy copies from the CPU")
    if h2d and out.c_device.c_type == DEVICE_CPU:
        raise_error(Error.InvalidArgument, f"{_arg(True, i, batch)}.device=cpu: h2d_copy "
                                           f"copies to a device tensor")
    if not h2d and src.c_device.c_type == DEVICE_CPU:
        raise_error(Error.InvalidArgument, f"{_arg(False, i, batch)}.device=cpu: d2h_copy "
                                           f"copies from a device tensor")
    if not h2d and out.c_device.c_type != DEVICE_CPU:
        raise_error(Error.InvalidArgument, f"{_arg(True, i, batch)}.device={out.c_device}: "
                                           f"d2h_copy copies to the CPU")
    if not _same_sizes(src, out):
        raise_error(Error.InvalidArgument,
                    f"{_arg(True, i, batch)}.sizes={c_tuple64(out.c_sizes, out.c_dim)} differ "
                    f"from {_arg(False, i, batch)}.sizes={c_tuple64(src.c_sizes, src.c_dim)}")
    if src.c_type != out.c_type:
        raise_error(Error.InvalidArgument,
                    f"{_arg(True, i, batch)}.scalar_type={out.scalar_type.name} differs from "
                    f"{_arg(False, i, batch)}.scalar_type={src.scalar_type.name}")
    if not _same_dim_order(src, out):
        raise_error(Error.InvalidArgument,
                    f"{_arg(True, i, batch)}.dim_order={c_tuple8(out.c_dim_order, out.c_dim)} "
                    f"differs from {_arg(False, i, batch)}.dim_order="
                    f"{c_tuple8(src.c_dim_order, src.c_dim)}")
    if src.c_numel and (src.c_data == NULL or out.c_data == NULL):
        raise_error(Error.InvalidArgument, f"{_arg(src.c_data != NULL, i, batch)} has null "
                                           f"data (made with data=None)")
    if out.c_readonly:
        raise_error(Error.InvalidArgument, f"{_arg(True, i, batch)} is read-only")
    if src.c_storage.c_released:
        c_check_alive(src.c_storage, _arg(False, i, batch))
    if out.c_storage.c_released:
        c_check_alive(out.c_storage, _arg(True, i, batch))
    return 0


cdef DeviceAllocator _pair_allocator(TensorPtr src, TensorPtr out, bint h2d, int* index):
    """The allocator (and device index) that owns the device side of a pair."""
    return _owner_allocator(out if h2d else src, index)


cdef object _copy_into(object src, object out, object stream, bint h2d):
    """h2d_copy / d2h_copy: one pair, or sequences of pairs."""
    cdef list srcs, outs
    cdef Py_ssize_t i, count
    cdef TensorPtr a, b, dev_t, first_dev = None
    cdef DeviceAllocator alloc = None, found
    cdef int index = 0, index_i
    cdef _Pieces p
    cdef int64_t k = 0, nbytes
    cdef int facts
    cdef list moving_dev, moving_host
    if isinstance(src, TensorPtr):
        # one pair: no lists, no arrays
        a = <TensorPtr>src
        b = c_tensor_arg(out, "out")
        _check_pair(a, b, 0, False, h2d)
        nbytes = c_nbytes(a.c_numel, a.c_type)
        if nbytes:
            alloc = _pair_allocator(a, b, h2d, &index)
            if h2d:
                alloc.c_copy_h2d(<uintptr_t>b.c_data, <uintptr_t>a.c_data, nbytes, index, stream)
            else:
                alloc.c_copy_d2h(<uintptr_t>b.c_data, <uintptr_t>a.c_data, nbytes, index, stream)
        return out
    if isinstance(out, TensorPtr):
        raise_error(Error.InvalidType,
                    f"out is one TensorPtr but src is a {c_type_name(src)}: a batch takes a "
                    f"sequence of outs, one per source")
    srcs = _tensor_list(src, "src")
    outs = _tensor_list(out, "out")
    if len(srcs) != len(outs):
        raise_error(Error.InvalidArgument,
                    f"src has {len(srcs)} tensors but out has {len(outs)}")
    count = len(srcs)
    p = _pieces(count)
    moving_dev = []
    moving_host = []
    for i in range(count):           # every check before any user code or byte moves
        a = <TensorPtr>srcs[i]
        b = <TensorPtr>outs[i]
        _check_pair(a, b, i, True, h2d)
        nbytes = c_nbytes(a.c_numel, a.c_type)
        if nbytes == 0:
            continue
        dev_t = b if h2d else a
        if first_dev is None:
            first_dev = dev_t
        elif dev_t.c_device is not first_dev.c_device and dev_t.c_device != first_dev.c_device:
            raise_error(Error.InvalidArgument,
                        f"{'out' if h2d else 'src'}[{i}].device={dev_t.c_device}: a batch "
                        f"copies to or from one device")
        if alloc is None or dev_t.c_storage.c_allocator is not alloc:
            found = _owner_allocator(dev_t, &index_i)
            if alloc is None:
                alloc, index = found, index_i
            elif found is not alloc or index_i != index:
                raise_error(Error.InvalidArgument,
                            f"{'out' if h2d else 'src'}[{i}].device={dev_t.c_device}: its "
                            f"memory belongs to another allocator or device than the batch's")
        elif dev_t.c_storage.c_index != index:
            raise_error(Error.InvalidArgument,
                        f"{'out' if h2d else 'src'}[{i}].device={dev_t.c_device}: its memory "
                        f"is on another device than the batch's")
        p.dst[k] = <uintptr_t>b.c_data
        p.src[k] = <uintptr_t>a.c_data
        p.n[k] = nbytes
        k += 1
        moving_dev.append(dev_t)
        moving_host.append(a if h2d else b)
    p.count = k
    if k:
        facts = _facts(moving_dev, moving_host, alloc)
        if h2d:
            alloc.c_copy_h2d_batch(p.dst, p.src, p.n, k, index, stream, facts)
        else:
            alloc.c_copy_d2h_batch(p.dst, p.src, p.n, k, index, stream, facts)
    return outs


def h2d_copy(src, out, *, stream=None):
    """Copy CPU tensors into existing device tensors (ExecuTorch's ``et_copy::_h2d_copy.out``).

    Nothing is allocated on the device. ``src`` and ``out`` are one TensorPtr
    each, or two sequences of the same length (a batch, moved as few large
    transfers: small tensors are packed into pinned slots by the copy threads,
    one DMA per slot, and scattered on the device by a kernel).

    Parameters
    ----------
    src : TensorPtr on the CPU, or a sequence of them
    out : TensorPtr on a device, or a sequence of them on one device; each with
        the same sizes, scalar type and dim_order as its source
    stream : CUDA stream, optional
        None: complete on return. A stream: queued on it (as for
        :func:`clone_tensor_ptr_to`): a pageable source has been read on return.

    Returns
    -------
    ``out`` (the list of outs for a batch)

    Raises
    ------
    InvalidArgumentError
        A pair whose devices, sizes, scalar type or dim_order do not fit (the
        message names the index and the field), null data, a read-only out,
        outs on more than one device; all checked before any byte moves.
    InvalidTypeError
        Something that is not a TensorPtr.

    Notes
    -----
    Only the outs' bytes are written: outs that are views of one allocation
    leave the bytes between them as they were. When a copy fails part way
    through a batch, the outs before the failure may hold their new data and
    the others their old; no memory is kept.
    """
    return _copy_into(src, out, stream, True)


def d2h_copy(src, out, *, stream=None):
    """Copy device tensors into existing CPU tensors (ExecuTorch's ``et_copy::_d2h_copy.out``).

    The mirror of :func:`h2d_copy`; a batch's small tensors are gathered on the
    device by a kernel, come down in one DMA and are scattered by the copy
    threads. Into page-locked outs a copy on a ``stream`` may still run on
    return: synchronise the stream before reading them. As for
    :func:`h2d_copy`, only the outs' bytes are written.

    Raises
    ------
    InvalidArgumentError, InvalidTypeError
        As :func:`h2d_copy`.
    """
    return _copy_into(src, out, stream, False)


def clone_tensor_ptrs_to(tensors, device, *, stream=None, pinned=True):
    """The batched :func:`clone_tensor_ptr_to`: every tensor copied to ``device``.

    Results come in order, each as if cloned alone (same sizes, dim_order,
    strides, scalar type, dynamism). They share one allocation: a
    device allocation through the registry for CPU -> device, one host block (page-locked
    with ``pinned=True``) for device -> CPU, each result starting at a 256-byte
    multiple (the bytes between results hold unspecified values); the memory goes
    back when the last of them dies. The batch moves as a few large transfers. An
    empty sequence gives ``[]``.

    Parameters
    ----------
    tensors : sequence of TensorPtr, all on the CPU, or all on one device
    device : Device, DeviceType or str
    stream, pinned : as for :func:`clone_tensor_ptr_to`

    Raises
    ------
    InvalidArgumentError
        A tensor with null data, or tensors on more than one device (the
        message names the index), before anything is allocated.
    NotSupportedError
        CPU -> CPU or device -> device.
    NotFoundError, MemoryAllocationError
        As :func:`clone_tensor_ptr_to`; nothing is kept after a failure.
    """
    cdef Device dst = c_device(device, "device")
    cdef list items = _tensor_list(tensors, "tensors")
    cdef Py_ssize_t count = len(items), i
    cdef list results = []
    cdef TensorPtr t, r, first
    cdef int64_t total = 0, nbytes, k = 0
    cdef int64_t* offsets
    cdef _Pieces p
    cdef DeviceAllocator alloc
    cdef int index
    cdef Storage s
    cdef list moved, made
    cdef bint h2d = dst.c_type != DEVICE_CPU
    cdef Device where = dst if h2d else c_cpu()
    if count == 0:
        return []
    first = items[0]
    p = _pieces(count)
    offsets = <int64_t*>malloc(count * sizeof(int64_t))
    if offsets == NULL:
        raise MemoryError()
    try:
        for i in range(count):       # checks and snapshots before any user code runs
            t = <TensorPtr>items[i]
            if (t.c_device.c_type == DEVICE_CPU) != h2d:
                raise_error(Error.NotSupported,
                            f"tensors[{i}].device={t.c_device}: clone_tensor_ptrs_to copies "
                            f"between the host and a device, not {t.c_device} -> {dst}")
            if t.c_device is not first.c_device and t.c_device != first.c_device:
                raise_error(Error.InvalidArgument,
                            f"tensors[{i}].device={t.c_device}: a batch comes from one device "
                            f"(tensors[0] is on {first.c_device})")
            nbytes = c_nbytes(t.c_numel, t.c_type)
            if t.c_data == NULL and nbytes > 0:
                raise_error(Error.InvalidArgument,
                            f"tensors[{i}] has null data: there is nothing to copy")
            if t.c_storage.c_released:
                c_check_alive(t.c_storage, f"tensors[{i}]")
            results.append(c_copy_layout(t, t.c_type, where))
            offsets[i] = total
            if nbytes:
                p.src[k] = <uintptr_t>t.c_data
                p.n[k] = nbytes
                k += 1
            total += align_up(nbytes, DEVICE_ALIGNMENT_BYTES)
        p.count = k
        if h2d:
            alloc = c_allocator_for(dst.c_type, dst.c_index, "device")
            index = alloc.c_resolve_index(dst.c_index)
            s = c_device_storage(alloc, total, index, DEVICE_ALIGNMENT_BYTES,
                                   stream if total else None)
            if index != dst.c_index:
                where = c_make_device(dst.c_type, index)
                for i in range(count):
                    (<TensorPtr>results[i]).c_device = where
        else:
            alloc = _owner_allocator(first, &index)
            for i in range(1, count):
                t = <TensorPtr>items[i]
                if t.c_numel and t.c_storage.c_allocator is not None and \
                        (t.c_storage.c_allocator is not alloc or t.c_storage.c_index != index):
                    raise_error(Error.InvalidArgument,
                                f"tensors[{i}]: its memory belongs to another allocator or "
                                f"device than tensors[0]'s")
            s = _landing(alloc, total, index, pinned)
        k = 0
        moved = []
        made = []
        for i in range(count):
            r = <TensorPtr>results[i]
            c_set_memory(r, s, s.c_ptr + <uintptr_t>offsets[i], False)
            if r.c_numel:
                p.dst[k] = s.c_ptr + <uintptr_t>offsets[i]
                k += 1
                moved.append(items[i])
                made.append(r)
        try:
            if k:
                # the results' padding (up to the next 256-byte multiple) is ours
                if h2d:
                    alloc.c_copy_h2d_batch(p.dst, p.src, p.n, k, index, stream,
                                           BATCH_PADDED | _facts(made, moved, alloc))
                else:
                    alloc.c_copy_d2h_batch(p.dst, p.src, p.n, k, index, stream,
                                           BATCH_PADDED | _facts(moved, made, alloc))
        except BaseException as exc:
            results = None
            _fail_after_taking(s, exc)
    finally:
        free(offsets)
    return results
