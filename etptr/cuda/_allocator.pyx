"""CudaAllocator: the DeviceAllocator for DeviceType.CUDA, over CuPy.

Mirrors ExecuTorch's ``CudaAllocator`` (``backends/cuda/runtime/cuda_allocator.h``):
device memory comes from CuPy's memory pool (so CuPy's pool figures show it),
and copies go to etptr's copy engine (:mod:`etptr.cuda._copy_engine`). The
registry's C-level methods are overridden here, so etptr's own calls reach
the engine without a Python call; the Python methods check their arguments
and call the same code. CuPy is imported on first use, never when this module
is imported.

In a child made by ``os.fork()`` after CUDA was initialised, every method
that would call CUDA raises :class:`~etptr.InvalidStateError`, and
:meth:`CudaAllocator.deallocate` forgets the parent's memory without freeing
it, so that inherited tensors die quietly.
"""
cimport cython
from libc.stdint cimport int64_t, uintptr_t

from etptr._core._args cimport c_count_arg, c_int_arg
from etptr._core._codes cimport DEVICE_ALIGNMENT_BYTES
from etptr._core._device_allocator cimport (
    DeviceAllocator, FilePieces, c_direct_fd, c_file_pieces)
from etptr._core._error cimport raise_error
from etptr.cuda._batch cimport c_d2h_batch, c_h2d_batch, c_h2d_file
from etptr.cuda._copy_engine cimport CopyConfig, c_config, c_d2h, c_h2d
from etptr.cuda._driver cimport (
    DeviceGuard, c_check_usable, c_enter_device, c_exit_device, c_forked, c_keep_forever,
    c_cupy, c_resolve_device, c_stream_handle)
from etptr.cuda._pinned_pool cimport c_default_pool

from etptr._core._device import DeviceType
from etptr._core._device_allocator import DEFAULT_ALIGNMENT
from etptr._core._error import Error

# cudaMalloc guarantees this alignment (CUDA programming guide); CuPy's pool
# hands out 512-byte multiples inside such allocations.
CUDA_MALLOC_ALIGNMENT = DEVICE_ALIGNMENT_BYTES


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


cdef uintptr_t _address(object v, str argname) except 0:
    cdef int64_t a = c_count_arg(v, argname)
    if a == 0:
        raise_error(Error.InvalidArgument, f"{argname}=0: a null address")
    return <uintptr_t>a


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

    def __cinit__(self):
        self.c_blocks = {}

    @property
    def device_type(self):
        """``DeviceType.CUDA``."""
        return DeviceType.CUDA

    # -------------------------------------------------------------- C level
    cdef int c_resolve_index(self, int index) except -2:
        c_check_usable("CudaAllocator.resolve_index")
        return c_resolve_device(index, "index")

    cdef uintptr_t c_allocate(self, int64_t nbytes, int index, int64_t alignment,
                              object stream) except? 0:
        """``nbytes`` on device ``index`` (checked) from CuPy's pool."""
        cdef DeviceGuard guard
        cdef uintptr_t ptr
        if nbytes == 0:
            return 0
        cp = c_cupy()
        mem = None
        c_enter_device(index, &guard)
        try:
            try:
                if stream is None:
                    mem = cp.cuda.memory.alloc(nbytes)
                else:
                    with _cupy_stream(cp, stream):
                        mem = cp.cuda.memory.alloc(nbytes)
            except (cp.cuda.memory.OutOfMemoryError, cp.cuda.runtime.CUDARuntimeError,
                    MemoryError) as exc:
                raise_error(Error.MemoryAllocationFailed,
                            f"could not allocate nbytes={nbytes} on cuda:{index}: {exc}")
        finally:
            c_exit_device(&guard)
        ptr = mem.ptr
        if ptr % alignment:
            raise_error(Error.MemoryAllocationFailed,
                        f"CuPy returned {ptr:#x}, not aligned to alignment={alignment} bytes")
        self.c_blocks[ptr] = mem
        return ptr

    cdef int c_deallocate(self, uintptr_t ptr, int index) except -1:
        cdef DeviceGuard guard
        if ptr == 0:
            return 0
        mem = self.c_blocks.pop(ptr, None)
        if mem is None:
            raise_error(Error.InvalidArgument,
                        f"ptr={ptr:#x} (index={index}) was not allocated by this CudaAllocator "
                        f"or was freed already")
        if c_forked():
            # The parent's memory: freeing it, even into CuPy's pool, is not ours to do here.
            c_keep_forever(mem)
            return 0
        # CuPy's pool may switch devices while freeing; with the owning device
        # current it has no reason to (and no context appears on another device).
        c_enter_device(mem.device_id, &guard)
        try:
            mem = None
        finally:
            c_exit_device(&guard)
        return 0

    cdef int c_copy_h2d(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1:
        cdef CopyConfig cfg
        c_config(&cfg, None, None, None, None)
        return c_h2d(dst, src, nbytes, index, stream, &cfg)

    cdef int c_copy_d2h(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1:
        cdef CopyConfig cfg
        c_config(&cfg, None, None, None, None)
        return c_d2h(dst, src, nbytes, index, stream, &cfg)

    cdef int c_copy_h2d_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1:
        cdef CopyConfig cfg
        c_config(&cfg, None, None, None, None)
        return c_h2d_batch(dst, src, n, count, index, stream, &cfg, facts)

    cdef int c_copy_d2h_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1:
        cdef CopyConfig cfg
        c_config(&cfg, None, None, None, None)
        return c_d2h_batch(dst, src, n, count, index, stream, &cfg, facts)

    cdef object c_allocate_host(self, int64_t nbytes, int index):
        if nbytes == 0:
            return None
        if index == -1:
            index = self.c_resolve_index(-1)
        return c_default_pool().c_malloc(nbytes, index)

    # -------------------------------------------------------------- Python level
    cdef int _index(self, object index, str what) except -2:
        c_check_usable(what)
        return c_resolve_device(index, "index")

    def resolve_index(self, index):
        """The device ``index`` stands for: -1 becomes the current CUDA device.

        Raises
        ------
        InvalidArgumentError
            ``index < -1`` or past the last device.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        return self._index(index, "CudaAllocator.resolve_index")

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
        cdef int64_t n = c_count_arg(nbytes, "nbytes")
        cdef int64_t a = c_count_arg(alignment, "alignment")
        cdef int dev
        if a == 0 or (a & (a - 1)) != 0:
            raise_error(Error.InvalidArgument, f"alignment={a}: must be a power of two")
        if a > CUDA_MALLOC_ALIGNMENT:
            raise_error(Error.NotSupported,
                        f"alignment={a} exceeds cudaMalloc's guaranteed alignment of "
                        f"{CUDA_MALLOC_ALIGNMENT} bytes; stricter alignment is not supported")
        dev = self._index(index, "CudaAllocator.allocate")
        return self.c_allocate(n, dev, a, stream)

    def deallocate(self, ptr, index):
        """Give memory from :meth:`allocate` back to CuPy's pool. ``ptr == 0`` is a no-op.
        In a process forked after CUDA was initialised, the memory belongs to
        the parent's context: it is forgotten, without a CUDA call.

        Raises
        ------
        InvalidArgumentError
            ``ptr`` was not allocated by this allocator, or was freed already.
        """
        self.c_deallocate(<uintptr_t>c_count_arg(ptr, "ptr"), -1)

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
            A null address with ``nbytes > 0``, a bad index or setting, or a
            copy that would run past the end of ``dst``'s device allocation.
        EtError
            A CUDA call failed (``Error.Internal``); pinned slots are released.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        self._copy(True, dst, src, nbytes, index, stream, threads, slot_bytes, slots,
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
            A null address with ``nbytes > 0``, a bad index or setting, or a
            copy that would run past the end of ``src``'s device allocation.
        EtError
            A CUDA call failed (``Error.Internal``).
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        self._copy(False, dst, src, nbytes, index, stream, threads, slot_bytes, slots,
                   small_copy_bytes)

    cdef int _copy(self, bint h2d, object dst, object src, object nbytes, object index,
                   object stream, object threads, object slot_bytes, object slots,
                   object small_copy_bytes) except -1:
        """copy_host_to_device (``h2d``) / copy_device_to_host: check, then copy."""
        cdef CopyConfig cfg
        cdef int64_t n = c_count_arg(nbytes, "nbytes")
        cdef int dev = self._index(index, "CudaAllocator.copy_host_to_device" if h2d
                                   else "CudaAllocator.copy_device_to_host")
        c_config(&cfg, threads, slot_bytes, slots, small_copy_bytes)
        if n == 0:
            return 0
        if h2d:
            c_h2d(_address(dst, "dst"), _address(src, "src"), n, dev, stream, &cfg)
        else:
            c_d2h(_address(dst, "dst"), _address(src, "src"), n, dev, stream, &cfg)
        return 0

    def copy_file_to_device(self, dst, fd, pieces, index, *, progress=None, on_queued=None,
                            gaps=True, direct_fd=-1, stream=None):
        """Copy pieces of an open file to device memory on device ``index``, as one
        pipelined copy whose copy threads read the file (``pread``) straight into the
        pinned slots while the previous slot's DMA runs (the page cache is copied once;
        nothing is mapped, so a file truncated meanwhile gives an error, never SIGBUS).
        With ``gaps`` the device range from the first piece to the end of the last moves
        as one (one DMA per slot); without, each piece goes to its own place (one DMA per
        piece a slot holds). Overrides :meth:`etptr.DeviceAllocator.copy_file_to_device`,
        whose parameters, errors and notes apply; besides them:

        Parameters
        ----------
        progress : callable, optional
            ``progress(done_bytes)``, called every few slots from inside the pipeline.
        on_queued : callable, optional (only with ``stream`` None)
            Called once the whole file has been read and the last DMAs are queued,
            while they run (the loader makes its tensor views there), outside the
            device's context. The copy is complete on return even when it raised.
        stream : CUDA stream, optional
            None: complete on return. A stream: queued on it; the file has been read on
            return.

        Raises
        ------
        InvalidArgumentError
            Also: a range that runs past ``dst``'s device allocation, or ``on_queued``
            with a ``stream``.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        cdef CopyConfig cfg
        cdef FilePieces fp = c_file_pieces(pieces, dst, progress, on_queued)
        cdef int f = <int>c_int_arg(fd, "fd", 0, 1 << 30)
        cdef int df = c_direct_fd(direct_fd, fp)
        cdef int dev
        if on_queued is not None and stream is not None:
            raise_error(Error.InvalidArgument,
                        f"on_queued (a {type(on_queued).__name__}): only with stream=None, as "
                        f"it runs while the copy completes (given a {type(stream).__name__})")
        dev = self._index(index, "CudaAllocator.copy_file_to_device")
        c_config(&cfg, None, None, None, None)
        c_h2d_file(<uintptr_t>c_count_arg(dst, "dst"), f, fp, dev, stream, &cfg, progress,
                   on_queued, bool(gaps), df)

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
        cdef int64_t n = c_count_arg(nbytes, "nbytes")
        cdef int dev = self._index(index, "CudaAllocator.allocate_host")
        return self.c_allocate_host(n, dev)

    @property
    def live_blocks(self):
        """Number of device allocations handed out and not yet freed."""
        return len(self.c_blocks)

    def __repr__(self):
        return f"<CudaAllocator live_blocks={len(self.c_blocks)}>"
