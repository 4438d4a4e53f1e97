"""CudaAllocator: the DeviceAllocator for DeviceType.CUDA, over CuPy.

Mirrors ExecuTorch's ``CudaAllocator`` (``extension/cuda/cuda_allocator.h``):
device memory comes from CuPy's memory pool (so CuPy's pool figures show
it), and copies go through etptr's pinned staging engine
(:mod:`etptr._core._staging`). CuPy is imported on first use, never when this
module is imported.

In a child made by ``os.fork()`` after CUDA was initialised, every method
that would call CUDA raises :class:`~etptr.InvalidStateError`, and
:meth:`CudaAllocator.deallocate` forgets the parent's memory without freeing
it, so that inherited tensors die quietly.
"""
cimport cython
from libc.stdint cimport INT64_MAX, int64_t, uintptr_t

from etptr._core._device_allocator cimport DeviceAllocator
from etptr._core._error cimport raise_error
from cpython.ref cimport Py_INCREF

from etptr._core._staging cimport (
    CopyConfig, c_check_usable, c_config, c_copy, c_cupy, c_default_pool,
    DeviceGuard, c_current_device, c_enter_device, c_exit_device, c_forked,
    c_stream_handle)

from etptr._core._device import DeviceType
from etptr._core._device_allocator import DEFAULT_ALIGNMENT
from etptr._core._error import Error

# cudaMalloc guarantees this alignment (CUDA programming guide); CuPy's pool
# hands out 512-byte multiples inside such allocations.
CUDA_MALLOC_ALIGNMENT = 256


cdef int64_t _count(object v, str argname) except -1:
    if type(v) is int and 0 <= <object>v <= INT64_MAX:
        return v
    if isinstance(v, bool):
        raise_error(Error.InvalidType, f"{argname}={v!r} must be an int")
    try:
        i = v.__index__()
    except (AttributeError, TypeError):
        raise_error(Error.InvalidType,
                    f"{argname}={v!r} of type {type(v).__name__} must be an int")
    if i < 0 or i > INT64_MAX:
        raise_error(Error.InvalidArgument, f"{argname}={i}: must be within 0..2**63-1")
    return i


cdef uintptr_t _address(object v, str argname) except? 0:
    cdef int64_t a = _count(v, argname)
    if a == 0:
        raise_error(Error.InvalidArgument, f"{argname}=0: a null address")
    return <uintptr_t>a


cdef class _StreamRef:
    """A raw stream handle speaking the CUDA stream protocol (for CuPy's from_external)."""
    cdef object handle

    def __cuda_stream__(self):
        return (0, self.handle)


cdef object _cupy_stream(object cp, object stream):
    """``stream`` as a CuPy stream object, to make it current while allocating."""
    cdef _StreamRef ref
    if isinstance(stream, cp.cuda.Stream) or type(stream).__name__ == "ExternalStream":
        return stream
    ref = _StreamRef.__new__(_StreamRef)
    ref.handle = c_stream_handle(stream)
    return cp.cuda.Stream.from_external(ref)


@cython.final
cdef class CudaAllocator(DeviceAllocator):
    """CudaAllocator()

    The :class:`~etptr.DeviceAllocator` for ``DeviceType.CUDA`` (ExecuTorch
    ``CudaAllocator``), backed by CuPy.

    Device memory comes from CuPy's memory pool under the named device, so
    ``cupy.get_default_memory_pool()`` accounts for it. Copies run through the
    pinned staging engine: a pageable host source is staged through pinned
    slots by several threads while the previous slot's DMA runs, a
    page-locked one goes in one DMA. Every call runs with its device current
    and restores the caller's device afterwards. Registered automatically the
    first time CUDA's allocator is looked up, when CuPy imports and a device
    exists.

    In a process created by ``os.fork()`` after CUDA was initialised, the
    methods raise :class:`~etptr.InvalidStateError` (use the 'spawn' start
    method), except :meth:`deallocate`, which forgets the parent's memory
    without calling CUDA.

    Examples
    --------
    >>> import etptr                                    # doctest: +SKIP
    >>> a = etptr.get_device_allocator(etptr.DeviceType.CUDA)  # doctest: +SKIP
    >>> ptr = a.allocate(1024, 0)                      # doctest: +SKIP
    >>> a.deallocate(ptr, 0)                           # doctest: +SKIP
    """
    cdef dict c_blocks      # device address -> CuPy MemoryPointer
    cdef int c_ndev         # device count, -1 until read

    def __cinit__(self):
        self.c_blocks = {}
        self.c_ndev = -1

    @property
    def device_type(self):
        """``DeviceType.CUDA``."""
        return DeviceType.CUDA

    # -------------------------------------------------------------- helpers
    cdef int c_index(self, object index) except -2:
        """A validated device index: -1 (current) or 0..device count-1."""
        if type(index) is int and 0 <= <object>index < self.c_ndev:
            return <int>index
        if isinstance(index, bool):
            raise_error(Error.InvalidType, f"index={index!r} must be an int")
        try:
            i = index.__index__()
        except (AttributeError, TypeError):
            raise_error(Error.InvalidType,
                        f"index={index!r} of type {type(index).__name__} must be an int")
        if i < -1:
            raise_error(Error.InvalidArgument,
                        f"index={i}: invalid CUDA device index (must be >= -1)")
        if i == -1:
            return -1
        if self.c_ndev < 0:
            self.c_ndev = c_cupy().cuda.runtime.getDeviceCount()
        if i >= self.c_ndev:
            raise_error(Error.InvalidArgument,
                        f"index={i}: there are {self.c_ndev} CUDA device(s)")
        return <int>i

    cdef int c_copy(self, bint h2d, object dst, object src, object nbytes, object index,
                    object stream, object threads, object slot_bytes, object slots,
                    object small_copy_bytes) except -1:
        """copy_host_to_device (``h2d``) / copy_device_to_host: check, then copy."""
        cdef CopyConfig cfg
        cdef int64_t n = _count(nbytes, "nbytes")
        cdef int dev
        c_check_usable("CudaAllocator.copy_host_to_device" if h2d
                       else "CudaAllocator.copy_device_to_host")
        dev = self.c_device(index)
        c_config(&cfg, threads, slot_bytes, slots, small_copy_bytes)
        if n == 0:
            return 0
        c_copy(_address(dst, "dst"), _address(src, "src"), n, dev, stream, &cfg, h2d)
        return 0

    cdef int c_device(self, object index) except -1:
        """The concrete device ``index`` stands for (-1: the current one)."""
        cdef int i = self.c_index(index)
        if i == -1:
            return c_current_device()
        return i

    # -------------------------------------------------------------- DeviceAllocator
    def resolve_index(self, index):
        """The device ``index`` stands for: -1 becomes the current CUDA device.

        Raises
        ------
        InvalidArgumentError
            ``index < -1`` or past the last device.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        c_check_usable("CudaAllocator.resolve_index")
        return self.c_device(index)

    def allocate(self, nbytes, index, alignment=DEFAULT_ALIGNMENT, *, stream=None):
        """Allocate ``nbytes`` bytes on CUDA device ``index`` from CuPy's memory
        pool and return the device address (0 for ``nbytes == 0``).

        Parameters
        ----------
        nbytes : int, size in bytes
        index : int, device index (-1 = current device)
        alignment : int, power of two, bytes (at most 256, cudaMalloc's guarantee)
        stream : CUDA stream, optional
            Made current while allocating, so CuPy's stream-ordered pool
            associates the memory with it.

        Raises
        ------
        InvalidArgumentError
            ``alignment`` is not a power of two, ``index < -1`` or past the last device.
        NotSupportedError
            ``alignment > 256``.
        MemoryAllocationError
            The device has not got ``nbytes`` bytes free.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        cdef int64_t n = _count(nbytes, "nbytes")
        cdef int64_t a = _count(alignment, "alignment")
        cdef int dev
        cdef DeviceGuard guard
        c_check_usable("CudaAllocator.allocate")
        if a == 0 or (a & (a - 1)) != 0:
            raise_error(Error.InvalidArgument,
                        f"alignment={a}: must be a power of two")
        if a > CUDA_MALLOC_ALIGNMENT:
            raise_error(Error.NotSupported,
                        f"alignment={a} exceeds cudaMalloc's guaranteed alignment of "
                        f"{CUDA_MALLOC_ALIGNMENT} bytes; stricter alignment is not supported")
        dev = self.c_device(index)
        if n == 0:
            return 0
        cp = c_cupy()
        mem = None
        c_enter_device(dev, &guard)
        try:
            try:
                if stream is None:
                    mem = cp.cuda.memory.alloc(n)
                else:
                    with _cupy_stream(cp, stream):
                        mem = cp.cuda.memory.alloc(n)
            except (cp.cuda.memory.OutOfMemoryError, cp.cuda.runtime.CUDARuntimeError,
                    MemoryError) as exc:
                raise_error(Error.MemoryAllocationFailed,
                            f"could not allocate nbytes={n} on cuda:{dev}: {exc}")
        finally:
            c_exit_device(&guard)
        ptr = mem.ptr
        if ptr % a:
            mem = None
            raise_error(Error.MemoryAllocationFailed,
                        f"CuPy returned {ptr:#x}, not aligned to alignment={a} bytes")
        self.c_blocks[ptr] = mem
        return ptr

    def deallocate(self, ptr, index):
        """Give memory from :meth:`allocate` back to CuPy's pool. ``ptr == 0`` is a no-op.
        In a process forked after CUDA was initialised, the memory belongs to
        the parent's context: it is forgotten, without a CUDA call.

        Raises
        ------
        InvalidArgumentError
            ``ptr`` was not allocated by this allocator, or was freed already.
        """
        cdef int64_t p = _count(ptr, "ptr")
        cdef int dev
        cdef DeviceGuard guard
        if p == 0:
            return
        mem = self.c_blocks.pop(p, None)
        if mem is None:
            raise_error(Error.InvalidArgument,
                        f"ptr={p:#x} (index={index}) was not allocated by this CudaAllocator "
                        f"or was freed already")
        if c_forked():
            # The parent's memory: freeing it, even into CuPy's pool, is not ours to do here.
            Py_INCREF(mem)
            return
        # CuPy's pool may switch devices while freeing; with the owning device
        # current it has no reason to (and no context appears on another device).
        dev = mem.device_id
        c_enter_device(dev, &guard)
        try:
            mem = None
        finally:
            c_exit_device(&guard)

    def copy_host_to_device(self, dst, src, nbytes, index, *, stream=None, threads=None,
                            slot_bytes=None, slots=None, small_copy_bytes=None):
        """Copy ``nbytes`` bytes from host address ``src`` to device address
        ``dst`` on device ``index`` (H2D).

        A page-locked ``src`` goes up in one DMA; a pageable one up to
        ``small_copy_bytes`` in one ``cudaMemcpyAsync``; a larger pageable one
        through pinned slots (``slots`` of ``slot_bytes`` bytes, each filled by
        ``threads`` threads while the previous slot's DMA runs). Settings left
        None come from :func:`etptr.cuda.get_copy_config`.

        Parameters
        ----------
        dst, src : int, addresses
        nbytes : int, bytes
        index : int, device index (-1 = current device)
        stream : CUDA stream, optional
            None: synchronous (ordered after the current stream's queued work;
            ``src`` may be reused and ``dst`` read on return). A stream: the
            copy is queued on it; a pageable ``src`` has been read on return,
            a page-locked ``src`` must not be modified or freed until the
            stream is synchronized.

        Raises
        ------
        InvalidArgumentError
            A null address with ``nbytes > 0``, a bad index or setting.
        EtError
            A CUDA call failed (``Error.Internal``); device memory and
            pinned slots are released.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        self.c_copy(True, dst, src, nbytes, index, stream, threads, slot_bytes, slots,
                    small_copy_bytes)

    def copy_device_to_host(self, dst, src, nbytes, index, *, stream=None, threads=None,
                            slot_bytes=None, slots=None, small_copy_bytes=None):
        """Copy ``nbytes`` bytes from device address ``src`` on device ``index``
        to host address ``dst`` (D2H).

        Into page-locked memory (a :class:`~etptr.cuda.PinnedBlock`, or other
        pinned memory above ``small_copy_bytes``): one DMA. Into pageable
        memory: staged in reverse through pinned slots, ``threads`` threads
        copying one slot out while the next slot's DMA runs.

        Parameters
        ----------
        dst, src : int, addresses
        nbytes : int, bytes
        index : int, device index (-1 = current device)
        stream : CUDA stream, optional
            None: synchronous, ``dst`` holds the data on return. A stream:
            into page-locked memory the DMA is queued on it and ``dst`` must
            not be read before the stream is synchronized; into pageable
            memory the copy is complete on return.

        Raises
        ------
        InvalidArgumentError
            A null address with ``nbytes > 0``, a bad index or setting.
        EtError
            A CUDA call failed (``Error.Internal``).
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        self.c_copy(False, dst, src, nbytes, index, stream, threads, slot_bytes, slots,
                    small_copy_bytes)

    def allocate_host(self, nbytes, index):
        """A block of page-locked host memory from the process-wide
        :class:`~etptr.cuda.PinnedHostPool` (None for 0 bytes), pinned under
        device ``index``. Device -> host clones land in it with one DMA, and
        the block goes back to the pool when the tensor holding it dies.

        Raises
        ------
        MemoryAllocationError
            The memory could not be pinned, even after the pool's cache was freed.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        cdef int64_t n = _count(nbytes, "nbytes")
        cdef int dev
        c_check_usable("CudaAllocator.allocate_host")
        dev = self.c_device(index)
        if n == 0:
            return None
        return c_default_pool().c_malloc(n, dev)

    @property
    def live_blocks(self):
        """Number of device allocations handed out and not yet freed."""
        return len(self.c_blocks)

    def __repr__(self):
        return f"<CudaAllocator live_blocks={len(self.c_blocks)}>"
