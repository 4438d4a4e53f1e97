"""Page-locked (pinned) host staging and the host<->device copy engine.

Two parts, both used by :class:`etptr.cuda.CudaAllocator`:

* :class:`PinnedHostPool`, a thread-safe caching pool of page-locked host
  memory with size classes (waste stays under 1/8 of a block, or one 4 KiB
  page for small blocks), a cap on the bytes it keeps cached, statistics, and
  CUDA events that keep a block out of reuse while a copy touching it may
  still run.
* The copy engine. Host -> device from pageable memory goes in chunks through
  K pinned slots of S bytes: T OpenMP threads copy chunk i+1 into its slot,
  without the GIL, while the DMA of chunk i runs on the device's copy stream.
  A page-locked source goes up in one DMA; small copies take the shortest
  path. Device -> host into page-locked memory is one DMA; into pageable
  memory it is staged in reverse.

CuPy is imported on first use, at Python level: building etptr never needs it.
Every CUDA call runs with its device current, and the previous state is
restored afterwards (no context is created on a device the caller did not name).

Fork: the CUDA driver cannot be used in a child made by ``os.fork()`` once
the parent has initialised it. In such a child every CUDA entry point of
etptr raises :class:`~etptr.InvalidStateError` (naming fork and the 'spawn'
start method), and the parent's streams, events, pinned blocks and device
memory are forgotten without a CUDA call: they belong to the parent's
context. A child forked before CUDA was first used may use CUDA itself.
"""
cimport cython
from cython.parallel cimport prange
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from posix.unistd cimport getpid

import os
import sys
import threading
import warnings
import weakref

from etptr._core._error cimport raise_error

from etptr._core._error import Error, EtError, EtWarning

# cudaMemcpyKind, cudaHostAllocPortable, cudaEventDisableTiming, cudaMemoryTypeHost
cdef enum:
    _H2D = 1
    _D2H = 2
    _HOST_ALLOC_PORTABLE = 1
    _EVENT_DISABLE_TIMING = 2
    _MEMORY_TYPE_HOST = 1

cdef int64_t _PAGE = 4096
cdef int64_t _MIN_PIECE = 128 * 1024   # below this a chunk is copied by one thread

DEFAULT_MAX_CACHED_BYTES = 2 << 30


def _cpu_count():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# Defaults measured on an H200 host (PCIe Gen5 x16, 16 cores): bench/sweep_copy.py
# and its output bench/sweep_copy.txt. Threads never exceed the CPUs this process may use.
cdef CopyConfig _cfg
_cfg.threads = min(16, _cpu_count())
_cfg.slot_bytes = 16 << 20
_cfg.slots = 3
_cfg.small_bytes = 256 << 10
_tls = threading.local()

# ------------------------------------------------------------------ fork state

# The CUDA driver cannot be used in a child made by fork() once the parent has
# initialised it (the child would get errors or hang). etptr notes when it
# initialises CUDA, and before a fork asks the driver whether CuPy has (when
# CuPy is imported); a child forked after that refuses every CUDA call and
# forgets, without freeing, what belonged to the parent's context.
cdef bint _cuda_initialised = False   # by etptr, in this process or before the fork
cdef bint _forked_after_init = False  # this process was forked after that
cdef long _init_pid = 0               # the process that initialised CUDA
cdef int _omp_started = 0             # an OpenMP team has run here
cdef int _omp_forked = 0              # forked after that: copy on one thread (libgomp is
                                      # not fork-safe; its pool of threads is gone here)


cdef void _note_init() noexcept:
    global _cuda_initialised, _init_pid
    if not _cuda_initialised:
        _init_pid = getpid()
        _cuda_initialised = True


cdef bint c_forked() noexcept:
    """True in a child forked after CUDA was initialised: CUDA must not be called."""
    return _forked_after_init


cdef int c_check_usable(str what) except -1:
    """Raise InvalidStateError when CUDA cannot be used here (forked after initialisation)."""
    if _forked_after_init:
        raise_error(Error.InvalidState,
                    f"{what}: CUDA cannot be used in this process (pid {getpid()}): it was "
                    f"created by fork() after process {_init_pid} had initialised CUDA, and "
                    f"the CUDA driver does not survive fork. Start processes that use CUDA "
                    f"with the 'spawn' start method (multiprocessing.get_context('spawn'), or "
                    f"multiprocessing.set_start_method('spawn')), or fork before the first "
                    f"CUDA call. Host-only etptr functions work here.")
    return 0


def _note_cuda_init():
    """Record that CUDA is being initialised in this process (etptr.cuda.is_available)."""
    _note_init()


def _cuda_forked():
    """True in a process forked after CUDA was initialised (CUDA calls raise there)."""
    return _forked_after_init


cdef inline void _keep_forever(object obj) noexcept:
    # Objects that belong to the parent's CUDA context are never destroyed in a
    # forked child: destroying them could call into CUDA (or a lock held at fork).
    Py_INCREF(obj)


# ------------------------------------------------------------------ CuPy, lazily

cdef object _cp = None      # the cupy module (or a stand-in set by _set_backend)
cdef object _rt = None      # its cuda.runtime
cdef object _drv = None     # its cuda.driver
cdef object _CudaError = None
cdef object _current_stream = None   # cupy.cuda.get_current_stream


cdef object c_cupy():
    """The CuPy module, imported on first use; NotSupportedError without it."""
    global _cp, _rt, _drv, _CudaError
    c_check_usable("CUDA")
    if _cp is None:
        try:
            import cupy
        except ImportError as exc:
            raise_error(Error.NotSupported,
                        f"CUDA copies need CuPy (pip install cupy-cuda12x or cupy-cuda13x): {exc}")
        _set_backend(cupy)
    return _cp


def _set_backend(module):
    """Use ``module`` as CuPy (None: import CuPy again on next use). For tests."""
    global _cp, _rt, _drv, _CudaError, _current_stream
    with _engines_lock:
        _engines.clear()
    if module is None:
        _cp = _rt = _drv = _CudaError = _current_stream = None
        return
    _note_init()      # getDeviceCount below initialises the driver
    _cp = module
    _rt = module.cuda.runtime
    _drv = module.cuda.driver
    _CudaError = module.cuda.runtime.CUDARuntimeError
    _current_stream = module.cuda.get_current_stream
    try:
        _rt.getDeviceCount()      # initialises the driver (no context) before ctxGetCurrent
    except Exception:
        pass


cdef int c_enter_device(int dev, int* saved) except -1:
    """Make ``dev`` current; ``saved`` (2 ints) records what to restore."""
    saved[0] = 0
    saved[1] = 0
    c_check_usable("CUDA")
    if _drv.ctxGetCurrent() == 0:
        # No context is current: restore exactly that afterwards, so that no
        # context appears on device 0 when the caller only ever named another.
        # (cudaGetDevice may still answer ``dev`` here: only a current context
        # proves the runtime will not pick a device of its own.)
        _rt.setDevice(dev)
        saved[1] = 2
        return 0
    saved[0] = _rt.getDevice()
    if saved[0] != dev:
        _rt.setDevice(dev)
        saved[1] = 1
    return 0


cdef int c_exit_device(int dev, int* saved) except -1:
    if saved[1] == 2:
        _drv.ctxSetCurrent(0)
    elif saved[1] == 1:
        _rt.setDevice(saved[0])
    return 0


# ------------------------------------------------------------------ size classes

cdef int64_t c_size_class(int64_t nbytes) noexcept nogil:
    """Bytes actually reserved for a request of ``nbytes``.

    Up to 32 KiB: whole 4 KiB pages. Above: eight classes per power of two,
    so a block wastes less than 1/8 of itself (no power-of-two rounding).
    """
    cdef int64_t g
    cdef int bits = 0
    cdef uint64_t n
    if nbytes <= _PAGE:
        return _PAGE
    n = <uint64_t>(nbytes - 1)
    while n:
        bits += 1
        n >>= 1
    # 2**(bits-1) < nbytes <= 2**bits; granularity 2**(bits-4), at least a page
    g = (<int64_t>1) << (bits - 4) if bits - 4 > 12 else _PAGE
    return (nbytes + g - 1) & ~(g - 1)



def size_class(nbytes):
    """size_class(nbytes) -> int
    --

    The bytes a :class:`PinnedHostPool` reserves for a request of ``nbytes``
    bytes: whole 4 KiB pages up to 32 KiB, then eight classes per power of
    two (waste below 1/8 of the block).
    """
    cdef int64_t n = _nonneg(nbytes, "nbytes")
    return c_size_class(n)


cdef int64_t _nonneg(object v, str argname) except -1:
    if isinstance(v, bool):
        raise_error(Error.InvalidType, f"{argname}={v!r} must be an int")
    try:
        i = v.__index__()
    except (AttributeError, TypeError):
        raise_error(Error.InvalidType, f"{argname}={v!r} of type {type(v).__name__} must be an int")
    if i < 0 or i > INT64_MAX:
        raise_error(Error.InvalidArgument, f"{argname}={i}: must be within 0..2**63-1")
    return i


# ------------------------------------------------------------------ pool

@cython.final
@cython.no_gc
cdef class _Slab:
    def __cinit__(self):
        self.ptr = 0
        self.size = 0
        self.dev = 0
        self.event = 0
        self.event_dev = -1
        self.pending = False


cdef int _ensure_event(_Slab slab, int dev) except -1:
    """Give ``slab`` an event usable on ``dev`` (the current device)."""
    if slab.event != 0 and slab.event_dev == dev:
        return 0
    if slab.event != 0:
        if slab.pending:
            _rt.eventSynchronize(slab.event)
            slab.pending = False
        _rt.eventDestroy(slab.event)
        slab.event = 0
    slab.event = _rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
    slab.event_dev = dev
    return 0


cdef int _record(_Slab slab, intptr_t stream, int dev) except -1:
    """Mark ``slab`` as touched by the work queued on ``stream`` so far."""
    _ensure_event(slab, dev)
    _rt.eventRecord(slab.event, stream)
    slab.pending = True
    return 0


cdef int _free_slab(_Slab slab) except -1:
    """Give the slab's page-locked memory back to CUDA, after its last copy."""
    cdef int saved[2]
    cdef uintptr_t ptr = slab.ptr
    if ptr == 0:
        return 0
    slab.ptr = 0
    if _forked_after_init:
        slab.event = 0        # the parent's memory and event: nothing to free here
        slab.pending = False
        return 0
    c_enter_device(slab.dev, saved)
    try:
        if slab.event != 0:
            if slab.pending:
                _rt.eventSynchronize(slab.event)
            _rt.eventDestroy(slab.event)
        slab.event = 0
        slab.pending = False
        _rt.freeHost(ptr)
    finally:
        c_exit_device(slab.dev, saved)
    return 0


@cython.final
@cython.no_gc
cdef class PinnedBlock:
    """A block of page-locked host memory from a :class:`PinnedHostPool`.

    Exposes ``nbytes`` writable bytes through the buffer protocol
    (``memoryview(block)``, ``numpy.frombuffer(block, ...)``). The block goes
    back to its pool when the last reference (including buffer exports)
    dies; the pool does not reuse it while a copy touching it may still run.
    Build blocks with :meth:`PinnedHostPool.malloc`.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("PinnedBlock cannot be built directly: use PinnedHostPool.malloc")

    def __dealloc__(self):
        cdef _Slab slab = self.c_slab
        cdef PinnedHostPool pool
        if slab is None:
            return
        self.c_slab = None
        if _forked_after_init:
            return            # a block of the parent's (forked after CUDA init): not ours to free
        try:
            pool = self.c_pool_ref() if self.c_pool_ref is not None else None
            if pool is not None:
                pool.c_release(slab, self.c_nbytes)
            else:
                _free_slab(slab)
        except BaseException as exc:
            try:
                warnings.warn(f"etptr: returning a pinned block raised during teardown: {exc!r}",
                              EtWarning, stacklevel=2)
            except BaseException:
                pass

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.c_slab.ptr, <Py_ssize_t>self.c_nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    @property
    def ptr(self):
        """Host address of the block (int)."""
        return self.c_slab.ptr

    @property
    def nbytes(self):
        """Bytes requested (the buffer's length)."""
        return self.c_nbytes

    @property
    def capacity(self):
        """Bytes reserved (the size class)."""
        return self.c_slab.size

    def __len__(self):
        return self.c_nbytes

    def __repr__(self):
        return f"<PinnedBlock ptr={self.c_slab.ptr:#x} nbytes={self.c_nbytes} capacity={self.c_slab.size}>"


_pools = weakref.WeakSet()    # every PinnedHostPool, to be emptied in a child after fork


@cython.final
cdef class PinnedHostPool:
    """PinnedHostPool(max_cached_bytes=DEFAULT_MAX_CACHED_BYTES)
    --

    A thread-safe caching pool of page-locked (pinned) host memory.

    Requests are rounded to size classes (:func:`size_class`), so a block
    wastes less than 1/8 of itself. Freed blocks are cached per class, up to
    ``max_cached_bytes`` in all: past the cap the oldest cached blocks are
    freed. A block freed while a copy may still touch it (an event recorded
    on a stream) is only reused once that event has completed. When CUDA
    cannot pin more memory, the pool frees its cache and tries once more.

    Parameters
    ----------
    max_cached_bytes : int, bytes
        Cap on the bytes kept cached (blocks in use do not count).

    Notes
    -----
    Memory is allocated with ``cudaHostAlloc(cudaHostAllocPortable)`` under
    the device the caller names, so it is page-locked for every device.
    """

    def __cinit__(self, *args, **kwargs):
        self.c_free = {}
        self.c_order = {}
        self.c_live = {}
        self.c_limit = DEFAULT_MAX_CACHED_BYTES
        _pools.add(self)

    def __init__(self, max_cached_bytes=DEFAULT_MAX_CACHED_BYTES):
        self.c_limit = _nonneg(max_cached_bytes, "max_cached_bytes")

    # -------------------------------------------------------------- C level
    cdef _Slab c_acquire(self, int64_t nbytes, int dev):
        cdef int64_t size = c_size_class(nbytes)
        cdef _Slab slab = None
        cdef list lst
        cdef bint fresh = False
        c_check_usable("pinned host memory")
        with self.c_lock:
            lst = self.c_free.get(size)
            if lst:
                slab = lst.pop()
                del self.c_order[slab]
                self.c_cached -= size
                if not slab.pending:
                    self._take(slab, nbytes, True)
                    return slab
        if slab is not None:
            try:
                done = _rt.eventQuery(slab.event) == 0
            except BaseException:
                self._recache(slab, [], True)     # neither lost nor handed out
                raise
            if done:
                slab.pending = False
            else:
                # A copy may still touch it: leave it cached, take a new block.
                self._recache(slab, [], True)
                slab = None
        if slab is None:
            slab = self._new_slab(size, nbytes, dev)
            fresh = True
        with self.c_lock:
            self._take(slab, nbytes, not fresh)
        return slab

    cdef void _recache(self, _Slab slab, list spare, bint oldest) noexcept:
        # Put ``slab`` on its class's free list (``spare``: an empty list made
        # beforehand, so that nothing the garbage collector tracks is allocated
        # while c_lock is held: a collection run there could free a block and
        # re-enter the lock).
        cdef list lst
        with self.c_lock:
            lst = self.c_free.get(slab.size)
            if lst is None:
                lst = spare
                self.c_free[slab.size] = lst
            if oldest:
                lst.insert(0, slab)
            else:
                lst.append(slab)
            self.c_order[slab] = None
            self.c_cached += slab.size

    cdef void _take(self, _Slab slab, int64_t nbytes, bint hit) noexcept:
        # with c_lock held: account for a slab handed out
        self.c_live[slab.ptr] = slab
        self.c_in_use += slab.size
        self.c_requested += nbytes
        if hit:
            self.c_hits += 1
        else:
            self.c_misses += 1
        if self.c_in_use + self.c_cached > self.c_peak:
            self.c_peak = self.c_in_use + self.c_cached

    cdef _Slab _new_slab(self, int64_t size, int64_t nbytes, int dev):
        cdef int saved[2]
        cdef _Slab slab = _Slab.__new__(_Slab)
        c_cupy()
        c_enter_device(dev, saved)
        try:
            try:
                ptr = _rt.hostAlloc(size, _HOST_ALLOC_PORTABLE)
            except _CudaError:
                self.empty_cache()
                try:
                    ptr = _rt.hostAlloc(size, _HOST_ALLOC_PORTABLE)
                except _CudaError as exc:
                    with self.c_lock:
                        self.c_failures += 1
                    raise_error(Error.MemoryAllocationFailed,
                                f"could not pin {size} bytes of host memory (nbytes={nbytes}, "
                                f"cuda:{dev}), even after freeing the cache: {exc}")
        finally:
            c_exit_device(dev, saved)
        slab.ptr = ptr
        slab.size = size
        slab.dev = dev
        return slab

    cdef int c_release(self, _Slab slab, int64_t nbytes) except -1:
        cdef list to_free = []
        cdef list spare = []          # see _recache: no GC-tracked allocation under c_lock
        cdef list lst
        cdef _Slab old
        cdef int64_t size = slab.size
        if _forked_after_init:
            return 0          # the parent's block; the pool forgot it at the fork
        with self.c_lock:
            if self.c_live.pop(slab.ptr, None) is None:
                return 0
            self.c_in_use -= size
            self.c_requested -= nbytes
            if size > self.c_limit:
                to_free.append(slab)
            else:
                lst = self.c_free.get(size)
                if lst is None:
                    lst = spare
                    self.c_free[size] = lst
                lst.append(slab)
                self.c_order[slab] = None
                self.c_cached += size
                self._evict(to_free)
        for old in to_free:
            _free_slab(old)
        return 0

    cdef void _evict(self, list to_free) noexcept:
        # with c_lock held: move the oldest cached slabs to ``to_free`` until under the cap
        cdef _Slab old
        while self.c_cached > self.c_limit:
            for old in self.c_order:      # the oldest; PyDict_Next, no iterator object
                break
            else:
                break
            del self.c_order[old]
            self.c_free[old.size].remove(old)
            self.c_cached -= old.size
            self.c_evictions += 1
            to_free.append(old)

    cdef _Slab c_find(self, uintptr_t address):
        return self.c_live.get(address)

    cdef int c_forget(self) except -1:
        """In a child forked after CUDA init: drop the parent's blocks, free nothing."""
        _keep_forever(self.c_free)
        _keep_forever(self.c_order)
        _keep_forever(self.c_live)
        self.c_free = {}
        self.c_order = {}
        self.c_live = {}
        self.c_in_use = 0
        self.c_cached = 0
        self.c_requested = 0
        self.c_peak = 0
        return 0

    cdef PinnedBlock c_malloc(self, int64_t nbytes, int dev):
        cdef PinnedBlock b = PinnedBlock.__new__(PinnedBlock)
        b.c_slab = self.c_acquire(nbytes, dev)
        if self.c_ref is None:
            self.c_ref = weakref.ref(self)
        b.c_pool_ref = self.c_ref
        b.c_nbytes = nbytes
        return b

    # -------------------------------------------------------------- Python level
    def malloc(self, nbytes, device=-1):
        """malloc(nbytes, device=-1) -> PinnedBlock
        --

        A block of at least ``nbytes`` bytes of page-locked host memory.

        Parameters
        ----------
        nbytes : int, bytes
        device : int, CUDA device whose context pins new memory (-1: current)

        Raises
        ------
        MemoryAllocationError
            CUDA could not pin the memory, even after the cache was freed.
        NotSupportedError
            CuPy is not installed.
        """
        cdef int64_t n = _nonneg(nbytes, "nbytes")
        cdef int dev
        c_check_usable("PinnedHostPool.malloc")
        c_cupy()
        dev = _rt.getDevice() if device == -1 else _nonneg(device, "device")
        return self.c_malloc(n, dev)

    def empty_cache(self):
        """empty_cache() -> None
        --

        Free every cached block (blocks in use are kept). A block whose last
        copy may still run is freed once that copy has completed.
        """
        cdef _Slab slab
        cdef dict slabs
        cdef dict order = {}
        cdef dict free = {}
        if _forked_after_init:
            return            # forked after CUDA init: the pool holds nothing of its own
        with self.c_lock:
            slabs = self.c_order
            self.c_order = order
            self.c_free, free = free, self.c_free
            self.c_cached = 0
        for slab in slabs:
            _free_slab(slab)

    def stats(self):
        """stats() -> dict
        --

        Counters, all in bytes except the counts: ``in_use_bytes`` (blocks
        handed out, by size class), ``requested_bytes`` (what their callers
        asked for), ``cached_bytes``, ``held_bytes`` (in use + cached: the
        page-locked memory held), ``peak_bytes`` (highest ``held_bytes``),
        ``max_cached_bytes``, ``hits``, ``misses``, ``evictions``,
        ``failures`` (pinning failures after the retry), ``blocks_in_use``,
        ``blocks_cached``.
        """
        cdef _Counts c
        if _forked_after_init:        # after a fork the lock may be held by a lost thread
            self._counts(&c)
        else:
            with self.c_lock:
                self._counts(&c)
        # the dict is built after the lock is released (see _recache)
        return {
            "in_use_bytes": c.in_use,
            "requested_bytes": c.requested,
            "cached_bytes": c.cached,
            "held_bytes": c.in_use + c.cached,
            "peak_bytes": c.peak,
            "max_cached_bytes": c.limit,
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "failures": c.failures,
            "blocks_in_use": c.blocks_in_use,
            "blocks_cached": c.blocks_cached,
        }

    cdef void _counts(self, _Counts* c) noexcept:
        c.in_use = self.c_in_use
        c.requested = self.c_requested
        c.cached = self.c_cached
        c.peak = self.c_peak
        c.limit = self.c_limit
        c.hits = self.c_hits
        c.misses = self.c_misses
        c.evictions = self.c_evictions
        c.failures = self.c_failures
        c.blocks_in_use = len(self.c_live)
        c.blocks_cached = len(self.c_order)

    def reset_peak(self):
        """reset_peak() -> None
        --

        Set ``peak_bytes`` to the bytes held now.
        """
        if _forked_after_init:
            self.c_peak = self.c_in_use + self.c_cached
            return
        with self.c_lock:
            self.c_peak = self.c_in_use + self.c_cached

    @property
    def max_cached_bytes(self):
        """Cap on cached bytes (int); setting it lower frees the oldest cached blocks."""
        return self.c_limit

    @max_cached_bytes.setter
    def max_cached_bytes(self, value):
        cdef int64_t limit = _nonneg(value, "max_cached_bytes")
        cdef list to_free = []
        cdef _Slab old
        if _forked_after_init:
            self.c_limit = limit      # nothing cached of its own to free
            return
        with self.c_lock:
            self.c_limit = limit
            self._evict(to_free)
        for old in to_free:
            _free_slab(old)

    def __repr__(self):
        s = self.stats()
        return (f"<PinnedHostPool in_use={s['in_use_bytes']} cached={s['cached_bytes']} "
                f"max_cached={s['max_cached_bytes']}>")


cdef PinnedHostPool _POOL = PinnedHostPool()


cdef PinnedHostPool c_default_pool():
    return _POOL


def get_pinned_host_pool():
    """get_pinned_host_pool() -> PinnedHostPool
    --

    The process-wide pool behind pinned clones, copy slots and ``pinned=True`` makers.
    """
    return _POOL


# ------------------------------------------------------------------ configuration

def _check_config(threads, slot_bytes, slots, small_copy_bytes):
    out = {}
    if threads is not None:
        t = _nonneg(threads, "threads")
        if not 1 <= t <= 1024:
            raise_error(Error.InvalidArgument, f"threads={t}: must be within 1..1024")
        out["threads"] = t
    if slot_bytes is not None:
        s = _nonneg(slot_bytes, "slot_bytes")
        if not 4096 <= s <= (1 << 40):
            raise_error(Error.InvalidArgument, f"slot_bytes={s}: must be within 4096..2**40")
        out["slot_bytes"] = s
    if slots is not None:
        k = _nonneg(slots, "slots")
        if not 1 <= k <= 64:
            raise_error(Error.InvalidArgument, f"slots={k}: must be within 1..64")
        out["slots"] = k
    if small_copy_bytes is not None:
        out["small_copy_bytes"] = _nonneg(small_copy_bytes, "small_copy_bytes")
    return out


cdef int _apply(CopyConfig* cfg, dict kw) except -1:
    if "threads" in kw:
        cfg.threads = kw["threads"]
    if "slot_bytes" in kw:
        cfg.slot_bytes = kw["slot_bytes"]
    if "slots" in kw:
        cfg.slots = kw["slots"]
    if "small_copy_bytes" in kw:
        cfg.small_bytes = kw["small_copy_bytes"]
    return 0


cdef int c_config(CopyConfig* cfg, object threads, object slot_bytes, object slots,
                  object small_bytes) except -1:
    """The settings for one copy: process-wide, then this thread's, then the call's."""
    cfg[0] = _cfg
    local = getattr(_tls, "stack", None)
    if local:
        _apply(cfg, local[-1])
    if threads is not None or slot_bytes is not None or slots is not None or small_bytes is not None:
        _apply(cfg, _check_config(threads, slot_bytes, slots, small_bytes))
    return 0


def set_copy_config(*, threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """set_copy_config(*, threads=None, slot_bytes=None, slots=None, small_copy_bytes=None) -> None
    --

    Change the copy engine's process-wide settings (None keeps a setting).

    Parameters
    ----------
    threads : int, host threads copying each chunk (T)
    slot_bytes : int, bytes per pinned slot, the chunk size (S)
    slots : int, pinned slots in flight (K)
    small_copy_bytes : int, bytes up to which a copy skips the pipeline

    Notes
    -----
    The environment variable ``ETPTR_COPY_CONFIG`` (for example
    ``"threads=12,slot_bytes=16777216"``) sets the same values when etptr's
    copy engine is first imported.

    Raises
    ------
    InvalidArgumentError
        A value out of range.
    """
    _apply(&_cfg, _check_config(threads, slot_bytes, slots, small_copy_bytes))


def _config_from_env():
    """Apply ``ETPTR_COPY_CONFIG`` ("threads=12,slot_bytes=16777216,...") at import."""
    text = os.environ.get("ETPTR_COPY_CONFIG", "")
    if not text.strip():
        return
    try:
        kw = {}
        for item in text.split(","):
            if item.strip():
                key, value = item.split("=")
                kw[key.strip()] = int(value.strip(), 0)
        set_copy_config(**kw)
    except Exception as exc:
        warnings.warn(f"etptr: ignoring ETPTR_COPY_CONFIG={text!r}: {exc}", EtWarning,
                      stacklevel=2)


def get_copy_config():
    """get_copy_config() -> dict
    --

    The settings in force for this thread: ``threads``, ``slot_bytes``,
    ``slots``, ``small_copy_bytes``.
    """
    cdef CopyConfig cfg
    c_config(&cfg, None, None, None, None)
    return {"threads": cfg.threads, "slot_bytes": cfg.slot_bytes, "slots": cfg.slots,
            "small_copy_bytes": cfg.small_bytes}


_config_from_env()


def _push_config(threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """Override settings for this thread until :func:`_pop_config`."""
    kw = _check_config(threads, slot_bytes, slots, small_copy_bytes)
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    merged = dict(stack[-1]) if stack else {}
    merged.update(kw)
    stack.append(merged)


def _pop_config():
    _tls.stack.pop()


# ------------------------------------------------------------------ engines (one per device)

@cython.final
cdef class _Engine:
    cdef int dev
    cdef intptr_t stream          # the device's copy stream (blocking)
    cdef intptr_t order_event     # orders the copy stream after the caller's stream
    cdef cython.pymutex lock


cdef dict _engines = {}
cdef cython.pymutex _engines_lock


cdef _Engine _engine(int dev):
    """The copy stream and events of ``dev``; the device must be current."""
    cdef _Engine eng = _engines.get(dev)
    if eng is not None:
        return eng
    eng = _Engine.__new__(_Engine)
    eng.dev = dev
    eng.stream = _rt.streamCreateWithFlags(0)
    eng.order_event = _rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
    with _engines_lock:
        other = _engines.get(dev)
        if other is None:
            _engines[dev] = eng
    if other is not None:
        _rt.streamDestroy(eng.stream)
        _rt.eventDestroy(eng.order_event)
        return other
    return eng


cdef int _order_after(_Engine eng, intptr_t cur) except -1:
    """Make the copy stream wait for the work queued so far on the caller's stream ``cur``."""
    if cur == 0 or cur == eng.stream:
        return 0      # the legacy default stream already orders blocking streams
    with eng.lock:
        _rt.eventRecord(eng.order_event, cur)
        _rt.streamWaitEvent(eng.stream, eng.order_event, 0)
    return 0


cdef intptr_t c_stream_handle(object stream) except? -1:
    """A raw cudaStream_t from an int, a ``__cuda_stream__`` object, or ``.ptr``/``.cuda_stream``."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("ptr", "cuda_stream"):
        h = getattr(stream, attr, None)
        if isinstance(h, int) and not isinstance(h, bool):
            return h
    raise_error(Error.InvalidType,
                f"stream={stream!r}: expected a CUDA stream (an int handle, an object with "
                f"__cuda_stream__, or a CuPy/PyTorch stream)")


cdef bint _is_page_locked(uintptr_t address) except -1:
    try:
        return _rt.pointerGetAttributes(address).type == _MEMORY_TYPE_HOST
    except _CudaError:
        return False


# ------------------------------------------------------------------ host copies

@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _par_copy(char* dst, const char* src, int64_t n, int nthreads) noexcept nogil:
    """memcpy with up to ``nthreads`` OpenMP threads, pieces of at least _MIN_PIECE bytes."""
    global _omp_started
    cdef Py_ssize_t i, parts
    cdef int64_t piece, off, m
    parts = nthreads
    if parts > n // _MIN_PIECE:
        parts = n // _MIN_PIECE
    if parts <= 1 or _omp_forked:
        memcpy(dst, src, n)
        return
    _omp_started = 1
    piece = ((n + parts - 1) // parts + 63) & ~(<int64_t>63)
    for i in prange(parts, num_threads=parts, schedule="static", chunksize=1):
        off = i * piece
        if off < n:
            m = piece
            if m > n - off:
                m = n - off
            memcpy(dst + off, src + off, m)


def _host_copy(dst, src, nbytes, threads):
    """Copy ``nbytes`` bytes between host addresses with ``threads`` threads. For measurements."""
    cdef char* d = <char*><uintptr_t>dst
    cdef const char* s = <const char*><uintptr_t>src
    cdef int64_t n = nbytes
    cdef int t = threads
    with nogil:
        _par_copy(d, s, n, t)


# ------------------------------------------------------------------ the engine

cdef object _chunk_hook = None   # tests: called as hook(direction, chunk index) after each chunk
cdef int _small_mode = 0
# small synchronous copies: 0 (the default): cudaMemcpyAsync on the copy stream + wait;
# 1: through a pool block; 2: cudaMemcpy when the caller's stream is the legacy default
# stream, which orders it after the caller's work (else as 0). bench/probe_small.txt and
# bench/results/h200x2_probe_small.txt compare them: no mode wins on every machine.


def _set_chunk_hook(hook):
    """Call ``hook(direction, i)`` after each pipelined chunk (None: stop). For tests."""
    global _chunk_hook
    _chunk_hook = hook


def _get_small_mode():
    """The small-copy path in use (see ``_small_mode``). For measurements."""
    return _small_mode


def _set_small_mode(int mode):
    """Choose the small-copy path (see ``_small_mode``). For measurements."""
    global _small_mode
    if mode not in (0, 1, 2):
        raise_error(Error.InvalidArgument, f"mode={mode}: must be 0, 1 or 2")
    _small_mode = mode


cdef int _sync(intptr_t stream) except -1:
    _rt.streamSynchronize(stream)
    return 0


cdef void _drain(intptr_t stream, list slabs) noexcept:
    """On a failure: let queued copies finish before memory is freed or reused."""
    cdef _Slab slab
    try:
        _rt.streamSynchronize(stream)
    except BaseException:
        return
    for slab in slabs:
        slab.pending = False


cdef int _acquire_slots(list slabs, int k, int64_t size, int dev) except -1:
    cdef _Slab slab
    for _ in range(k):
        slab = _POOL.c_acquire(size, dev)
        slabs.append(slab)
        _ensure_event(slab, dev)
    return 0


cdef int _release_slots(list slabs, int64_t size) except -1:
    cdef _Slab slab
    for slab in slabs:
        _POOL.c_release(slab, size)
    return 0


cdef int _staged_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, intptr_t s,
                     bint sync, CopyConfig* cfg) except -1:
    cdef int64_t S = cfg.slot_bytes
    cdef int64_t nchunks = (nbytes + S - 1) // S
    cdef int K = <int>(cfg.slots if cfg.slots < nchunks else nchunks)
    cdef int T = cfg.threads
    cdef list slabs = []
    cdef _Slab slab
    cdef int64_t i, off, n
    cdef char* sp
    cdef const char* srcp = <const char*>src
    hook = _chunk_hook
    try:
        try:
            _acquire_slots(slabs, K, S, dev)
            for i in range(nchunks):
                slab = <_Slab>slabs[i % K]
                if slab.pending:
                    _rt.eventSynchronize(slab.event)    # the slot's previous DMA is done
                    slab.pending = False
                off = i * S
                n = nbytes - off if nbytes - off < S else S
                sp = <char*>slab.ptr
                with nogil:
                    _par_copy(sp, srcp + off, n, T)
                _rt.memcpyAsync(dst + off, slab.ptr, n, _H2D, s)
                _rt.eventRecord(slab.event, s)
                slab.pending = True
                if hook is not None:
                    hook("h2d", i)
                PyErr_CheckSignals()
            if sync:
                _sync(s)
                for slab in slabs:
                    slab.pending = False
        except BaseException:
            _drain(s, slabs)
            raise
    finally:
        _release_slots(slabs, S)
    return 0


cdef int _staged_d2h(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, intptr_t s,
                     CopyConfig* cfg) except -1:
    cdef int64_t S = cfg.slot_bytes
    cdef int64_t nchunks = (nbytes + S - 1) // S
    cdef int K = <int>(cfg.slots if cfg.slots < nchunks else nchunks)
    cdef int T = cfg.threads
    cdef list slabs = []
    cdef _Slab slab
    cdef int64_t i, j, off, n
    cdef char* sp
    cdef char* dstp = <char*>dst
    hook = _chunk_hook
    try:
        try:
            _acquire_slots(slabs, K, S, dev)
            for j in range(K):
                slab = <_Slab>slabs[j]
                off = j * S
                n = nbytes - off if nbytes - off < S else S
                _rt.memcpyAsync(slab.ptr, src + off, n, _D2H, s)
                _rt.eventRecord(slab.event, s)
                slab.pending = True
            for i in range(nchunks):
                slab = <_Slab>slabs[i % K]
                _rt.eventSynchronize(slab.event)
                slab.pending = False
                off = i * S
                n = nbytes - off if nbytes - off < S else S
                sp = <char*>slab.ptr
                with nogil:
                    _par_copy(dstp + off, sp, n, T)
                j = i + K
                if j < nchunks:
                    off = j * S
                    n = nbytes - off if nbytes - off < S else S
                    _rt.memcpyAsync(slab.ptr, src + off, n, _D2H, s)
                    _rt.eventRecord(slab.event, s)
                    slab.pending = True
                if hook is not None:
                    hook("d2h", i)
                PyErr_CheckSignals()
        except BaseException:
            _drain(s, slabs)
            raise
    finally:
        _release_slots(slabs, S)
    return 0


cdef int _small_via_block(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, intptr_t s,
                          int kind) except -1:
    """A small copy through a pool block: host memcpy + one DMA (+ wait)."""
    cdef _Slab slab = _POOL.c_acquire(nbytes, dev)
    try:
        if kind == _H2D:
            memcpy(<void*>slab.ptr, <const void*>src, nbytes)
            _rt.memcpyAsync(dst, slab.ptr, nbytes, _H2D, s)
            _sync(s)
        else:
            _rt.memcpyAsync(slab.ptr, src, nbytes, _D2H, s)
            _sync(s)
            memcpy(<void*>dst, <const void*>slab.ptr, nbytes)
    except BaseException:
        _drain(s, [])
        raise
    finally:
        _POOL.c_release(slab, nbytes)
    return 0


cdef int _cuda_failed(object exc, str what, int64_t nbytes, int dev) except -1:
    raise EtError(f"{what} of nbytes={nbytes} on cuda:{dev} failed: {exc}", Error.Internal) from exc


cdef int c_copy_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1:
    """Copy ``nbytes`` from host ``src`` to device ``dst`` on device ``dev``.

    ``stream`` None: synchronous (on the device's copy stream, ordered after
    the caller's current stream). Otherwise queued on ``stream``: a pageable
    source has been read when this returns; a page-locked one is read by the
    DMA later.
    """
    cdef int saved[2]
    cdef _Engine eng
    cdef intptr_t s, cur
    cdef bint sync = stream is None
    cdef _Slab slab
    c_check_usable("host->device copy")
    if nbytes <= 0:
        return 0
    c_cupy()
    c_enter_device(dev, saved)
    try:
        try:
            if sync:
                cur = _current_stream().ptr
                if cur == 0 and _small_mode == 2 and nbytes <= cfg.small_bytes:
                    # the legacy default stream orders this after the caller's work
                    _rt.memcpy(dst, src, nbytes, _H2D)
                    _sync(0)
                    return 0
                eng = _engine(dev)
                s = eng.stream
                _order_after(eng, cur)
            else:
                s = c_stream_handle(stream)
            slab = _POOL.c_find(src)
            if slab is not None or (nbytes > cfg.small_bytes and _is_page_locked(src)):
                _rt.memcpyAsync(dst, src, nbytes, _H2D, s)
                if sync:
                    _sync(s)
                elif slab is not None:
                    _record(slab, s, dev)
            elif nbytes <= cfg.small_bytes:
                if _small_mode == 1 and sync:
                    _small_via_block(dst, src, nbytes, dev, s, _H2D)
                else:
                    # from pageable memory the driver has taken the bytes when this returns
                    _rt.memcpyAsync(dst, src, nbytes, _H2D, s)
                    if sync:
                        _sync(s)
            else:
                _staged_h2d(dst, src, nbytes, dev, s, sync, cfg)
        except _CudaError as exc:
            _cuda_failed(exc, "host->device copy", nbytes, dev)
    finally:
        c_exit_device(dev, saved)
    return 0


cdef int c_copy_d2h(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1:
    """Copy ``nbytes`` from device ``src`` (on ``dev``) to host ``dst``.

    Into page-locked memory: one DMA, synchronous when ``stream`` is None,
    else queued on ``stream`` (``dst`` holds the data once it is synchronized).
    Into pageable memory the copy is always complete when this returns.
    """
    cdef int saved[2]
    cdef _Engine eng
    cdef intptr_t s, cur
    cdef bint sync = stream is None
    cdef _Slab slab
    c_check_usable("device->host copy")
    if nbytes <= 0:
        return 0
    c_cupy()
    c_enter_device(dev, saved)
    try:
        try:
            if sync:
                cur = _current_stream().ptr
                if cur == 0 and _small_mode == 2 and nbytes <= cfg.small_bytes:
                    # the legacy default stream orders this after the caller's work
                    _rt.memcpy(dst, src, nbytes, _D2H)
                    return 0
                eng = _engine(dev)
                s = eng.stream
                _order_after(eng, cur)
            else:
                s = c_stream_handle(stream)
            slab = _POOL.c_find(dst)
            if slab is not None or (nbytes > cfg.small_bytes and _is_page_locked(dst)):
                _rt.memcpyAsync(dst, src, nbytes, _D2H, s)
                if sync:
                    _sync(s)
                elif slab is not None:
                    _record(slab, s, dev)
            elif nbytes <= cfg.small_bytes:
                if _small_mode == 1:
                    _small_via_block(dst, src, nbytes, dev, s, _D2H)
                else:
                    _rt.memcpyAsync(dst, src, nbytes, _D2H, s)
                    _sync(s)
            else:
                _staged_d2h(dst, src, nbytes, dev, s, cfg)
        except _CudaError as exc:
            _cuda_failed(exc, "device->host copy", nbytes, dev)
    finally:
        c_exit_device(dev, saved)
    return 0


def _engine_stream(int dev):
    """The raw handle of ``dev``'s copy stream (created on first use). For tests."""
    cdef int saved[2]
    c_cupy()
    c_enter_device(dev, saved)
    try:
        return _engine(dev).stream
    finally:
        c_exit_device(dev, saved)


# ------------------------------------------------------------------ fork handlers

def _before_fork():
    """os.register_at_fork(before=...): note CUDA initialised outside etptr (through CuPy).

    Before cuInit every driver call returns CUDA_ERROR_NOT_INITIALIZED, so a
    successful cuCtxGetCurrent (which initialises nothing) means the driver
    is initialised in this process.
    """
    if _cuda_initialised:
        return
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    try:
        cupy.cuda.driver.ctxGetCurrent()
    except Exception:
        return        # not initialised, or no usable driver
    _note_init()


def _after_fork_in_child():
    """os.register_at_fork(after_in_child=...): see "fork state" above.

    Runs in the child with one thread. When the parent had initialised CUDA,
    the copy streams and events, and every pool's pinned blocks, are dropped
    without a CUDA call (they belong to the parent's context, and a lock in
    them may have been held by a thread that the child does not have); from
    then on every CUDA entry point raises InvalidStateError and inherited
    tensors are released without freeing anything.
    """
    global _forked_after_init, _engines, _omp_forked
    if _omp_started:
        _omp_forked = 1
    if not _cuda_initialised or _forked_after_init:
        return
    _forked_after_init = True
    _keep_forever(_engines)
    _engines = {}
    for pool in list(_pools):
        (<PinnedHostPool>pool).c_forget()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
