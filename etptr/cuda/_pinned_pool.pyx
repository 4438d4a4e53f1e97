"""The caching pool of page-locked (pinned) host memory.

Requests are rounded to size classes (waste under 1/8 of a block, or one 4 KiB
page for small ones); freed blocks are cached per class up to a cap on cached
bytes, the oldest evicted first; a block that a copy may still touch (a CUDA
event recorded on a stream, or a caller's event given to
:meth:`PinnedBlock.hold_until`) is reused only once that event has completed.
When no more memory can be pinned, the pool frees its cache and tries once
more. Modelled on CuPy's ``PinnedMemoryPool``.

The memory comes from an injected allocator (``PinnedHostPool(allocator=...)``,
as CuPy's pool takes one): by default :class:`CudaHostAllocator`
(``cudaHostAlloc``); any object with ``malloc(nbytes, device) -> address`` and
``free(address, device)`` works, so the pool's policy is exercised with plain
host memory too.
"""
cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uint64_t, uintptr_t

import warnings
import weakref

from etptr._core._args cimport c_count_arg, c_int_arg, c_result_int, c_type_name
from etptr._core._error cimport raise_error
from etptr.cuda._driver cimport (
    DeviceGuard, NOT_READY, api, c_check, c_check_usable, c_cuda_failed, c_enter_device,
    c_event_create, c_event_destroy, c_exit_device, c_forked, c_host_alloc, c_host_free,
    c_keep_forever, c_range_start, c_resolve_device, c_runtime)

import os

from etptr._core._error import Error, EtWarning
from etptr.cuda._driver import _on_fork_child

cdef int64_t _PAGE = 4096
cdef int64_t _MAX_PIN = (<int64_t>1) << 62   # larger requests are refused (size classes overflow)



_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",                      # cgroup v2
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes")     # cgroup v1


def _memory_bytes():
    """The memory this process may use: physical memory, or its cgroup's limit when lower
    (0 when neither can be read)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        ram = 0
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) and (ram == 0 or int(text) < ram):
            ram = int(text)
        break
    return ram


def _default_cap():
    """A quarter of the memory this process may use, at least 2 GiB."""
    return max(2 << 30, _memory_bytes() // 4)


# The default cap on cached page-locked bytes. A batched download's results share one
# block, so a model's weights coming down are one block of their whole size: when that
# is over the cap it is never cached and every pass pins and unpins it (Qwen2.5-1.5B's
# 3.09 GB down on an H200 host: 1.9 GB/s with a 2 GiB cap, 54.2 with 8 GiB;
# bench/results/DECISIONS.md, pinned pool cap). CuPy's and torch's pinned caches have no cap at all.
DEFAULT_MAX_CACHED_BYTES = _default_cap()


# ------------------------------------------------------------------ size classes

cdef int64_t _size_class(int64_t nbytes) noexcept nogil:
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
    """The bytes a :class:`PinnedHostPool` reserves for a request of ``nbytes``
    bytes: whole 4 KiB pages up to 32 KiB, then eight classes per power of
    two (waste below 1/8 of the block).

    Raises
    ------
    InvalidArgumentError
        ``nbytes`` is negative or more than 2**62.
    """
    return _size_class(c_int_arg(nbytes, "nbytes", 0, _MAX_PIN))


# ------------------------------------------------------------------ the CUDA allocator

@cython.final
cdef class CudaHostAllocator:
    """CudaHostAllocator()

    Page-locked host memory from CUDA (``cudaHostAlloc`` with
    ``cudaHostAllocPortable``: pinned for every device), allocated under the
    named device's primary context. The default allocator of
    :class:`PinnedHostPool`.
    """

    def malloc(self, nbytes, device):
        """``nbytes`` of page-locked memory pinned under CUDA device ``device``; its address.

        Raises
        ------
        MemoryAllocationError
            CUDA could not pin the memory.
        InvalidStateError
            This process was forked after CUDA was initialised.
        """
        cdef DeviceGuard guard
        cdef int64_t n = c_count_arg(nbytes, "nbytes")
        cdef int dev
        cdef uintptr_t ptr
        c_check_usable("pinning host memory")
        c_runtime()
        dev = c_resolve_device(device, "device")
        c_enter_device(dev, &guard)
        try:
            ptr = c_host_alloc(n)
        finally:
            c_exit_device(&guard)
        return ptr

    def free(self, ptr, device):
        """Unpin and free memory from :meth:`malloc` (under the device that pinned it)."""
        cdef DeviceGuard guard
        cdef int dev = c_resolve_device(device, "device")
        c_enter_device(dev, &guard)
        try:
            c_host_free(<uintptr_t>c_count_arg(ptr, "ptr"))
        finally:
            c_exit_device(&guard)

    def __repr__(self):
        return "<CudaHostAllocator cudaHostAlloc(portable)>"


# ------------------------------------------------------------------ slabs and their events

@cython.final
@cython.no_gc
cdef class Slab:
    def __cinit__(self):
        self.event_dev = -1


cdef int c_ensure_event(Slab slab, int dev) except -1:
    """Give ``slab`` an event usable on ``dev`` (the current device)."""
    if slab.event != 0 and slab.event_dev == dev:
        return 0
    if slab.event != 0:
        if slab.pending:
            c_check(api.event_sync(<void*>slab.event), "waiting for a pinned block's last copy")
            slab.pending = False
        c_event_destroy(slab.event)
        slab.event = 0
    slab.event = c_event_create()
    slab.event_dev = dev
    return 0


cdef int c_record(Slab slab, intptr_t stream, int dev) except -1:
    """Mark ``slab`` as touched by the work queued on ``stream`` so far (``dev`` current)."""
    c_ensure_event(slab, dev)
    c_check(api.event_record(<void*>slab.event, <void*>stream), "recording a pinned block's copy")
    slab.pending = True
    return 0


cdef bint _fence_done(object fence) except -1:
    query = getattr(fence, "query", None)
    if query is not None:
        return bool(query())
    return bool(fence.done)


cdef bint _slab_done(Slab slab) except -1:
    """Whether the last copy touching ``slab`` has completed (then it is no longer pending)."""
    cdef int rc
    if not slab.pending:
        return True
    if slab.fence is not None:
        if not _fence_done(slab.fence):
            return False
        slab.fence = None
    if slab.event != 0:
        rc = api.event_query(<void*>slab.event)
        if rc == NOT_READY:
            return False
        if rc != 0:
            c_cuda_failed(rc, "querying a pinned block's last copy")
    slab.pending = False
    return True


cdef int _slab_wait(Slab slab) except -1:
    """Wait until the last copy touching ``slab`` has completed."""
    cdef int rc
    if not slab.pending:
        return 0
    if slab.fence is not None:
        slab.fence.synchronize()
        slab.fence = None
    if slab.event != 0:
        with nogil:
            rc = api.event_sync(<void*>slab.event)
        c_check(rc, "waiting for a pinned block's last copy")
    slab.pending = False
    return 0


cdef int _free_slab(Slab slab) except -1:
    """Give the slab's memory back to its allocator, after its last copy."""
    cdef DeviceGuard guard
    cdef uintptr_t ptr = slab.ptr
    if ptr == 0:
        return 0
    if c_forked():
        slab.ptr = 0          # the parent's memory and event: nothing to free here
        slab.event = 0
        slab.pending = False
        return 0
    _slab_wait(slab)
    slab.ptr = 0
    if slab.event != 0:
        c_enter_device(slab.event_dev, &guard)
        try:
            c_event_destroy(slab.event)
        finally:
            slab.event = 0
            c_exit_device(&guard)
    slab.allocator.free(ptr, slab.dev)
    return 0


cdef int c_release_all(PinnedHostPool pool, object slabs, int64_t nbytes) except -1:
    """Give every slab in ``slabs`` back, even when one fails; then raise the first
    failure. To ``pool`` (each as a release of ``nbytes``), or with ``pool`` None to
    its allocator (freed)."""
    cdef Slab slab
    first = None
    for slab in slabs:
        try:
            if pool is None:
                _free_slab(slab)
            else:
                pool.c_release(slab, nbytes)
        except BaseException as exc:
            if first is None:
                first = exc
    if first is not None:
        raise first
    return 0


# ------------------------------------------------------------------ blocks

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
        cdef Slab slab = self.c_slab
        cdef PinnedHostPool pool
        if slab is None:
            return
        self.c_slab = None
        if c_forked():
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

    def hold_until(self, event):
        """Keep the block out of reuse, once it is freed, until ``event`` has completed.

        For copies queued by the caller that read or write the block (e.g. a
        ``cudaMemcpyAsync`` on the caller's stream). ``event`` is any object with
        ``query() -> bool`` and ``synchronize()`` (``torch.cuda.Event``) or with a
        ``done`` property and ``synchronize()`` (``cupy.cuda.Event``).

        Raises
        ------
        InvalidTypeError
            ``event`` has neither ``query()`` nor ``done``, or no ``synchronize()``.
        """
        if not (hasattr(event, "query") or hasattr(event, "done")) or \
                not hasattr(event, "synchronize"):
            raise_error(Error.InvalidType,
                        f"event={event!r:.80} of type {c_type_name(event)}: expected a CUDA event "
                        f"(query() or done, and synchronize())")
        self.c_slab.fence = event
        self.c_slab.pending = True

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


# ------------------------------------------------------------------ the pool

_pools = weakref.WeakSet()    # every PinnedHostPool, to be emptied in a child after fork


@cython.final
cdef class PinnedHostPool:
    """PinnedHostPool(max_cached_bytes=DEFAULT_MAX_CACHED_BYTES, *, allocator=None)

    A thread-safe caching pool of page-locked (pinned) host memory.

    Requests are rounded to size classes (:func:`size_class`), so a block
    wastes less than 1/8 of itself. Freed blocks are cached per class, up to
    ``max_cached_bytes`` in all: past the cap the oldest cached blocks are
    freed. A block freed while a copy may still touch it (an event recorded
    on a stream) is only reused once that event has completed. When the
    allocator cannot give more memory, the pool frees its cache and tries once
    more.

    Parameters
    ----------
    max_cached_bytes : int, bytes
        Cap on the bytes kept cached (blocks in use do not count). Default
        ``DEFAULT_MAX_CACHED_BYTES``: a quarter of the machine's physical
        memory (or of the process's cgroup memory limit, when lower), at least
        2 GiB; the process-wide pool's cap too.
    allocator : object, optional
        Where the memory comes from: ``malloc(nbytes, device) -> int`` (an
        address; raise ``MemoryError`` when out of memory) and
        ``free(address, device)``. Default: :class:`CudaHostAllocator`.

    Notes
    -----
    The pool never calls its allocator while holding its lock.
    """

    def __cinit__(self, *args, **kwargs):
        self.c_free = {}
        self.c_order = {}
        self.c_live = {}
        self.c_limit = DEFAULT_MAX_CACHED_BYTES
        _pools.add(self)

    def __init__(self, max_cached_bytes=DEFAULT_MAX_CACHED_BYTES, *, allocator=None):
        self.c_limit = c_count_arg(max_cached_bytes, "max_cached_bytes")
        if allocator is None:
            allocator = CudaHostAllocator()
        elif not (callable(getattr(allocator, "malloc", None))
                  and callable(getattr(allocator, "free", None))):
            raise_error(Error.InvalidType,
                        f"allocator={allocator!r:.80}: expected an object with malloc(nbytes, "
                        f"device) and free(address, device)")
        self.c_allocator = allocator
        self.c_cuda = isinstance(allocator, CudaHostAllocator)

    # -------------------------------------------------------------- C level
    cdef Slab c_acquire(self, int64_t nbytes, int dev):
        """A slab of at least ``nbytes`` whose last copy has completed, pinned under ``dev``."""
        cdef int64_t size
        cdef Slab slab = None
        cdef list lst
        cdef bint fresh = False
        if nbytes > _MAX_PIN:
            raise_error(Error.MemoryAllocationFailed,
                        f"could not pin nbytes={nbytes} of host memory: more than 2**62 bytes")
        size = _size_class(nbytes)
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
                done = _slab_done(slab)
            except BaseException:
                self._recache(slab, [], True)     # neither lost nor handed out
                raise
            if not done:
                # A copy may still touch it: leave it cached, take a new block.
                self._recache(slab, [], True)
                slab = None
        if slab is None:
            slab = self._new_slab(size, nbytes, dev)
            fresh = True
        with self.c_lock:
            self._take(slab, nbytes, not fresh)
        return slab

    cdef void _recache(self, Slab slab, list spare, bint oldest) noexcept:
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

    cdef void _take(self, Slab slab, int64_t nbytes, bint hit) noexcept:
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

    cdef Slab _new_slab(self, int64_t size, int64_t nbytes, int dev):
        cdef Slab slab = Slab.__new__(Slab)
        try:
            ptr = self.c_allocator.malloc(size, dev)
        except MemoryError:
            self.empty_cache()
            try:
                ptr = self.c_allocator.malloc(size, dev)
            except MemoryError as exc:
                with self.c_lock:
                    self.c_failures += 1
                raise_error(Error.MemoryAllocationFailed,
                            f"could not pin {size} bytes of host memory (nbytes={nbytes}, "
                            f"device {dev}), even after freeing the cache: {exc}")
        slab.ptr = <uintptr_t>c_result_int(ptr, f"{c_type_name(self.c_allocator)}.malloc",
                                           "an int address", ", not an address", 1,
                                           INT64_MAX)
        slab.size = size
        slab.dev = dev
        slab.allocator = self.c_allocator
        return slab

    cdef int c_release(self, Slab slab, int64_t nbytes) except -1:
        cdef list to_free = []
        cdef list spare = []          # see _recache: no GC-tracked allocation under c_lock
        cdef list lst
        cdef int64_t size = slab.size
        if c_forked():
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
        c_release_all(None, to_free, 0)
        return 0

    cdef void _evict(self, list to_free) noexcept:
        # with c_lock held: move the oldest cached slabs to ``to_free`` until under the cap
        cdef Slab old
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

    cdef Slab c_find(self, uintptr_t address):
        return self.c_live.get(address)

    cdef int _forget(self) except -1:
        """In a child forked after CUDA init: drop the parent's blocks, free nothing."""
        c_keep_forever(self.c_free)
        c_keep_forever(self.c_order)
        c_keep_forever(self.c_live)
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
        """A block of at least ``nbytes`` bytes of page-locked host memory.

        Parameters
        ----------
        nbytes : int, bytes
        device : int, CUDA device whose context pins new memory (-1: current)

        Raises
        ------
        MemoryAllocationError
            The memory could not be pinned, even after the cache was freed.
        InvalidArgumentError
            A negative ``nbytes``, or ``device`` not a device index.
        NotSupportedError
            CuPy is not installed (the default allocator).
        """
        cdef int64_t n = c_count_arg(nbytes, "nbytes")
        cdef int dev
        if self.c_cuda:
            c_check_usable("PinnedHostPool.malloc")
            c_runtime()
            dev = c_resolve_device(device, "device")
        else:
            dev = <int>c_int_arg(device, "device", -1, 127)
        return self.c_malloc(n, dev)

    @property
    def allocator(self):
        """The object the pool's memory comes from (``malloc`` / ``free``)."""
        return self.c_allocator

    def empty_cache(self):
        """Free every cached block (blocks in use are kept). A block whose last
        copy may still run is freed once that copy has completed.
        """
        cdef dict slabs
        cdef dict order = {}
        cdef dict free = {}
        if c_forked():
            return            # forked after CUDA init: the pool holds nothing of its own
        with self.c_lock:
            slabs = self.c_order
            self.c_order = order
            self.c_free, free = free, self.c_free
            self.c_cached = 0
        c_release_all(None, slabs, 0)

    def stats(self):
        """Counters, all in bytes except the counts: ``in_use_bytes`` (blocks
        handed out, by size class), ``requested_bytes`` (what their callers
        asked for), ``cached_bytes``, ``held_bytes`` (in use + cached: the
        page-locked memory held), ``peak_bytes`` (highest ``held_bytes``),
        ``max_cached_bytes``, ``hits``, ``misses``, ``evictions``,
        ``failures`` (pinning failures after the retry), ``blocks_in_use``,
        ``blocks_cached``.
        """
        cdef _Counts c
        if c_forked():        # after a fork the lock may be held by a lost thread
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
        """Set ``peak_bytes`` to the bytes held now.
        """
        if c_forked():
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
        cdef int64_t limit = c_count_arg(value, "max_cached_bytes")
        cdef list to_free = []
        if c_forked():
            self.c_limit = limit      # nothing cached of its own to free
            return
        with self.c_lock:
            self.c_limit = limit
            self._evict(to_free)
        c_release_all(None, to_free, 0)

    def __repr__(self):
        s = self.stats()
        return (f"<PinnedHostPool in_use={s['in_use_bytes']} cached={s['cached_bytes']} "
                f"max_cached={s['max_cached_bytes']}>")


cdef PinnedHostPool _POOL = PinnedHostPool()


cdef PinnedHostPool c_default_pool():
    return _POOL


def get_pinned_host_pool():
    """The process-wide pool behind pinned clones, copy slots and ``pinned=True`` makers.
    """
    return _POOL


cdef Slab c_pool_block_containing(uintptr_t address):
    """The default pool's live block whose memory holds ``address``, or None (asked of the
    driver, so that a stream-ordered copy from a view into a block protects it too)."""
    cdef Slab slab = _POOL.c_find(address)
    cdef uintptr_t start
    if slab is not None:
        return slab
    start = c_range_start(address)
    if start == 0 or start == address:
        return None
    return _POOL.c_find(start)


def _pool_block_pending(address):
    """Whether the default pool's live block at ``address`` has a copy that may still
    run (an event recorded, not yet seen complete). For tests."""
    cdef Slab slab = _POOL.c_find(<uintptr_t>c_count_arg(address, "address"))
    if slab is None:
        raise_error(Error.InvalidArgument, f"address={address:#x}: not a live pool block")
    return bool(slab.pending)


def _forget_all_pools():
    cdef PinnedHostPool pool
    for pool in list(_pools):
        pool._forget()


_on_fork_child(_forget_all_pools)
