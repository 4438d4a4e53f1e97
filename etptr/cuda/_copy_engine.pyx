"""The host<->device copy engine: settings, per-device copy streams, the pipeline.

Host -> device from pageable memory over the small-copy threshold goes in chunks
through K pinned slots of S bytes (an upload of K slots or more, up to the tuning's
``ramp_max``, starts with a ``ramp_first`` chunk that grows by ``ramp_growth``
percent each chunk up to S: its first DMA starts sooner): for chunk i the engine
waits for slot i%K's event, T threads copy the chunk into the slot (without the
GIL, :mod:`etptr._core._host_copy`; non-temporal stores in copies from memory up
to ``nt_max`` bytes, and in uploads from a file up to ``nt_file_max``, whose reads
go through each thread's bounce buffer), the slot's DMA is queued on the device's
copy stream and the slot's event recorded, so the host copy of chunk i+1 overlaps
the DMA of chunk i. A page-locked source goes up in one DMA; a small pageable one
in one ``cudaMemcpyAsync``, a tiny one as :mod:`etptr.cuda._small_copy` makes it
(stream writes, or page-locked slots). Device -> host into page-locked memory is
one DMA (a synchronous one of up to ``fence_max`` waited for on that module's
fence); into pageable memory it is staged in reverse. The pipeline also moves
many pieces at once (:c:type:`HostList`): each chunk is gathered from (or
scattered to) the pieces that fall in it. Every few chunks (``signal_every``) it
takes the GIL to call the copy's progress callback and to check for
KeyboardInterrupt and a fork.

:func:`c_h2d` and :func:`c_d2h` are the one entry per direction: each checks fork
state once, enters the device's context once, checks the device range, picks the
path and restores the caller's context. The tuning fields named here live in
:mod:`etptr.cuda._tuning`; the settings T, S, K and the small-copy threshold are
the users' (:func:`etptr.cuda.set_copy_config`; defaults T=16 capped at the CPUs
this process may use, S=16 MiB, K=3, 64 KiB: ``bench/results/DECISIONS.md``).
"""
cimport cython
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uintptr_t
from libc.stdlib cimport free, malloc

import contextvars
import os
import warnings

from etptr._core._args cimport c_count_arg, c_int_arg
from etptr._core._error cimport raise_error
from etptr._core._host_copy cimport (
    Segment, c_copy_begin, c_copy_end, c_cpu_count, c_par_copy, c_par_copy_list)
from etptr.cuda._driver cimport (
    DeviceGuard, api, c_check, c_check_device_range, c_check_usable, c_cuda_failed,
    c_current_stream, c_enter_device, c_event_create, c_event_destroy, c_exit_device, c_forked,
    c_forget_on_change, c_host_alloc, c_is_page_locked, c_runtime, c_stream_create,
    c_stream_destroy, c_stream_handle)
from etptr.cuda._pinned_pool cimport (
    PinnedHostPool, Slab, c_default_pool, c_ensure_event, c_pool_block_containing, c_record,
    c_release_all)
from etptr.cuda._small_copy cimport TINY_BYTES, _Small, c_complete, c_fence_for, c_tiny_h2d
from etptr.cuda._tuning cimport (
    STEP_BEGIN, STEP_FILLED, STEP_QUEUED, STEP_SLOTS, STEP_SYNCED, STEP_WAITED, Tuning,
    c_call_chunk_hook, c_mark, c_tuning)

from etptr._core._error import Error, EtWarning


# ------------------------------------------------------------------ configuration

cdef CopyConfig _cfg
_cfg.threads = min(16, c_cpu_count())
_cfg.slot_bytes = 16 << 20
_cfg.slots = 3
_cfg.small_bytes = 64 << 10


# The etptr.cuda.copy_config blocks open around the running code: None, or (blocks,
# merged), blocks a tuple of (key, settings) innermost last and merged their settings
# laid over one another. A context variable, so that each thread and each asyncio task
# has its own; reading it raises nothing (a missing thread-local attribute would, at
# about 1 us a copy). Blocks are removed by key, so blocks left out of order (generators)
# leave nothing behind.
_block_settings = contextvars.ContextVar("etptr_copy_config", default=None)


cdef object _blocks_value(tuple blocks):
    """The context variable's value for ``blocks``."""
    cdef dict merged = {}
    if not blocks:
        return None
    for _, kw in blocks:
        merged.update(kw)
    return (blocks, merged)


def _check_config(threads, slot_bytes, slots, small_copy_bytes):
    """The given settings (None: not given), checked, as a dict."""
    out = {}
    if threads is not None:
        out["threads"] = c_int_arg(threads, "threads", 1, 1024)
    if slot_bytes is not None:
        out["slot_bytes"] = c_int_arg(slot_bytes, "slot_bytes", 4096, 1 << 40)
    if slots is not None:
        out["slots"] = c_int_arg(slots, "slots", 1, 64)
    if small_copy_bytes is not None:
        out["small_copy_bytes"] = c_count_arg(small_copy_bytes, "small_copy_bytes")
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
    """The settings for one copy: process-wide, then the copy_config block's, then the
    call's."""
    cfg[0] = _cfg
    local = _block_settings.get()
    if local is not None:
        _apply(cfg, (<tuple>local)[1])
    if threads is not None or slot_bytes is not None or slots is not None or small_bytes is not None:
        _apply(cfg, _check_config(threads, slot_bytes, slots, small_bytes))
    return 0


def set_copy_config(*, threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """Change the copy engine's process-wide settings (None keeps a setting).

    Parameters
    ----------
    threads : int, host threads copying each chunk (T), 1..1024
    slot_bytes : int, bytes per pinned slot, the chunk size (S), 4096..2**40
    slots : int, pinned slots in flight (K), 1..64
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
    """The copy engine's settings in force for the calling thread: the
    process-wide ones (:func:`set_copy_config`, ``ETPTR_COPY_CONFIG``),
    overridden inside ``with etptr.cuda.copy_config(...)`` blocks of this thread.

    Keys: ``threads`` (host threads copying each chunk; by default 16, or
    fewer when the process may use fewer CPUs), ``slot_bytes`` (bytes per
    pinned slot, the largest chunk), ``slots`` (pinned slots in flight),
    ``small_copy_bytes`` (bytes up to which a pageable copy is one
    ``cudaMemcpyAsync``, without the pipeline).
    """
    cdef CopyConfig cfg
    c_config(&cfg, None, None, None, None)
    return {"threads": cfg.threads, "slot_bytes": cfg.slot_bytes, "slots": cfg.slots,
            "small_copy_bytes": cfg.small_bytes}


_config_from_env()


def _push_config(threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """Override settings in the running thread or asyncio task until :func:`_pop_config`
    is given the key this returns."""
    kw = _check_config(threads, slot_bytes, slots, small_copy_bytes)
    key = object()
    local = _block_settings.get()
    _block_settings.set(_blocks_value(((<tuple>local)[0] if local is not None else ()) +
                                      ((key, kw),)))
    return key


def _pop_config(key):
    """End the override that :func:`_push_config` returned ``key`` for, wherever it is
    among the open ones (blocks of generators may end out of order).

    Raises
    ------
    InvalidStateError
        No override of this thread or task has that key: it ended already, or began
        in another thread or task (a generator resumed elsewhere; its settings then
        stay where it began).
    """
    cdef object local = _block_settings.get()
    cdef tuple blocks = (<tuple>local)[0] if local is not None else ()
    cdef tuple kept = tuple([b for b in blocks if b[0] is not key])
    if len(kept) == len(blocks):
        raise_error(Error.InvalidState, "a copy_config block ended that is not open in this "
                                        "thread or task (it ended already, or began in "
                                        "another one)")
    _block_settings.set(_blocks_value(kept))


# ------------------------------------------------------------------ copy streams (one per device)

@cython.final
cdef class _Engine:
    cdef intptr_t stream          # the device's copy stream (blocking)
    cdef intptr_t order_event     # orders the copy stream after the caller's stream
    cdef cython.pymutex lock
    # The device's own pinned slots (K of S bytes, kept for the process's life, outside
    # the pool): a staged copy waits for a slot's previous DMA instead of pinning more
    # memory while stream-ordered copies are still in flight. One copy at a time uses
    # them (``busy``, read and set with the GIL held); others take slots from the pool.
    cdef list ring
    cdef int64_t ring_bytes
    cdef bint busy


cdef dict _engines = {}
cdef cython.pymutex _engines_lock


cdef _Engine _engine(int dev):
    """The copy stream and events of ``dev``; the device must be current."""
    cdef _Engine eng = _engines.get(dev)
    if eng is not None:
        return eng
    eng = _Engine.__new__(_Engine)
    eng.ring = []
    eng.stream = c_stream_create()
    try:
        eng.order_event = c_event_create()
    except BaseException:
        c_stream_destroy(eng.stream)
        raise
    with _engines_lock:
        other = _engines.get(dev)
        if other is None:
            _engines[dev] = eng
    if other is not None:
        c_stream_destroy(eng.stream)
        c_event_destroy(eng.order_event)
        return other
    return eng


cdef int _order_after(_Engine eng, intptr_t cur) except -1:
    """Make the copy stream wait for the work queued so far on the caller's stream ``cur``."""
    cdef int rc
    if cur == 0 or cur == eng.stream:
        return 0      # the legacy default stream already orders blocking streams
    with eng.lock:
        with nogil:
            rc = api.event_record(<void*>eng.order_event, <void*>cur)
            if rc == 0:
                rc = api.stream_wait_event(<void*>eng.stream, <void*>eng.order_event, 0)
    c_check(rc, "ordering the copy after the caller's stream")
    return 0


cdef intptr_t c_copy_stream(int dev, object stream) except? -1:
    """The stream a copy on ``dev`` (current) runs on: ``stream``'s handle, or for None the
    device's copy stream, ordered after the caller's current stream."""
    cdef _Engine eng
    if stream is not None:
        return c_stream_handle(stream)
    eng = _engine(dev)
    _order_after(eng, c_current_stream())
    return eng.stream


c_forget_on_change(_engines)    # the streams and events belong to a backend, a context


# ------------------------------------------------------------------ the pipeline

cdef inline int64_t _ceil_div(int64_t n, int64_t d) noexcept nogil:
    return n // d + (1 if n % d else 0)      # no overflow near 2**63


cdef Tuning* T = c_tuning()


cdef int64_t _chunk_bytes(int64_t nbytes, CopyConfig* cfg) noexcept nogil:
    """The chunk size of a pipelined copy: the slot size, or less, so that a copy
    of a few slots still overlaps host copies with DMA (about ``target_chunks`` chunks)."""
    cdef int64_t s = cfg.slot_bytes
    cdef int64_t c
    if nbytes >= s * cfg.slots:
        return s
    c = _ceil_div(nbytes, T.target_chunks)
    c = (c + 65535) & ~(<int64_t>65535)
    if c < T.min_chunk:
        c = T.min_chunk
    return s if c > s else c


cdef struct _Pipe:
    char* host                # the pageable side (one range), or NULL with ``pieces``
    const HostList* pieces    # the pageable side as many pieces
    unsigned long long dev    # the device side
    int64_t nbytes
    int64_t chunk             # bytes per chunk (<= a slot)
    int64_t first             # uploads: bytes of the first chunk (<= chunk; the tuning's ramp)
    int k                     # slots
    int threads
    int device                # for messages
    bint nontemporal          # fill upload slots with non-temporal stores
    int64_t read_bounce       # ... reading a file through this much of a bounce buffer
    void* stream
    void* progress            # a callable progress(done_bytes), or NULL (the caller holds it)
    char* slot[64]
    void* event[64]
    bint pending[64]          # an event recorded on the slot that may not have completed


cdef inline int64_t _chunk_len(_Pipe* p, int64_t i) noexcept nogil:
    """Bytes in chunk ``i`` (the last one may be short)."""
    cdef int64_t m = p.nbytes - i * p.chunk
    return p.chunk if m > p.chunk else m


cdef int _pipe_failed(int rc, _Pipe* p, bint h2d) except -1 with gil:
    what = "host->device copy" if h2d else "device->host copy"
    c_cuda_failed(rc, f"{what} of nbytes={p.nbytes} on cuda:{p.device}")
    return -1


cdef int _read_failed(int err, _Pipe* p, int64_t off) except -1 with gil:
    if err == -1:
        raise EOFError(f"the file ended while reading the chunk at byte {off} of the "
                       f"{p.nbytes}-byte copy on cuda:{p.device} (it was truncated?)")
    raise OSError(err, f"{os.strerror(err)} (reading the chunk at byte {off} of the "
                       f"{p.nbytes}-byte copy on cuda:{p.device})")


cdef int _between_chunks(_Pipe* p, bint h2d, int64_t i, int64_t done) except -1 with gil:
    """Between chunks (every few, or each with a chunk hook): the hook, the progress
    callback with the ``done`` bytes, a check for KeyboardInterrupt and for a fork."""
    if T.chunk_hook:
        c_call_chunk_hook(h2d, i)
    if p.progress != NULL:
        (<object>p.progress)(done if p.pieces == NULL else _piece_bytes_before(p.pieces, done))
    PyErr_CheckSignals()
    c_check_usable("host->device copy" if h2d else "device->host copy")   # forked meanwhile?
    return 0


cdef int _move_pieces(_Pipe* p, char* slot, int64_t off, int64_t m, bint h2d,
                      bint nontemporal) noexcept nogil:
    """Copy bytes [off, off+m) of the device range between ``slot`` and the pieces
    that fall in it (gather into the slot for H2D, scatter out of it for D2H; read
    from the file for a file's pieces). Returns 0 or a file read's error (as
    :func:`~etptr._core._host_copy.c_par_copy_list`)."""
    cdef const HostList* L = p.pieces
    cdef int64_t lo = _first_piece(L, off), end, i, a, b, nseg = 0
    cdef int rc = 0
    cdef Segment one
    cdef Segment* segs
    end = lo
    while end < L.n and L.starts[end] < off + m:
        end += 1
    segs = <Segment*>malloc((end - lo + 1) * sizeof(Segment))
    one.fd = L.fd if h2d else -1
    one.direct = False
    for i in range(lo, end):
        a = L.starts[i] if L.starts[i] > off else off
        b = L.starts[i] + L.lens[i]
        if b > off + m:
            b = off + m
        if a >= b:
            continue
        if h2d:
            one.dst = slot + (a - off)
            one.src = L.host[i] + (a - L.starts[i])
            if L.direct != NULL:
                one.direct = L.direct[i]
                one.fd = L.direct_fd if L.direct[i] else L.fd
        else:
            one.dst = L.host[i] + (a - L.starts[i])
            one.src = slot + (a - off)
        one.n = b - a
        if segs == NULL:                # no memory for the list: copy the pieces in turn
            rc = c_par_copy_list(&one, 1, 1, nontemporal, 1, p.read_bounce)
            if rc != 0:
                return rc
            continue
        segs[nseg] = one
        nseg += 1
    if segs != NULL:
        rc = c_par_copy_list(segs, nseg, p.threads, nontemporal, T.fill_pieces if h2d else 1,
                             p.read_bounce)
        free(segs)
    return rc


cdef int64_t _piece_bytes_before(const HostList* L, int64_t off) noexcept:
    """Bytes of the pieces of ``L`` that lie before offset ``off`` of the range (the gaps
    between pieces do not count)."""
    cdef int64_t i, n = 0
    for i in range(L.n):
        if L.starts[i] >= off:
            break
        n += L.lens[i] if L.starts[i] + L.lens[i] <= off else off - L.starts[i]
    return n


cdef int64_t _first_piece(const HostList* L, int64_t off) noexcept nogil:
    """The first piece of ``L`` that ends after ``off`` (``L.n`` if none)."""
    cdef int64_t lo = 0, hi = L.n, mid
    while lo < hi:
        mid = (lo + hi) // 2
        if L.starts[mid] + L.lens[mid] <= off:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int _dma_pieces(_Pipe* p, char* slot, int64_t off, int64_t m, bint h2d) noexcept nogil:
    """Queue the DMAs between bytes [off, off+m) of the packed range, held in ``slot``,
    and the device addresses of the pieces they belong to (scattered device sides): to
    them for H2D, from them for D2H; the first failing call's return code, or 0."""
    cdef const HostList* L = p.pieces
    cdef int64_t i = _first_piece(L, off), a, b
    cdef unsigned long long dev
    cdef int rc
    while i < L.n and L.starts[i] < off + m:
        a = L.starts[i] if L.starts[i] > off else off
        b = L.starts[i] + L.lens[i]
        if b > off + m:
            b = off + m
        if a < b:
            dev = <unsigned long long>(L.dev[i] + <uintptr_t>(a - L.starts[i]))
            if h2d:
                rc = api.htod(dev, slot + (a - off), <size_t>(b - a), p.stream)
            else:
                rc = api.dtoh(slot + (a - off), dev, <size_t>(b - a), p.stream)
            if rc != 0:
                return rc
        i += 1
    return 0


cdef inline int _fill(_Pipe* p, char* slot, int64_t off, int64_t m) noexcept nogil:
    if p.pieces == NULL:
        c_par_copy(slot, p.host + off, m, p.threads, p.nontemporal, T.fill_pieces)
        return 0
    return _move_pieces(p, slot, off, m, True, p.nontemporal)


cdef inline void _drain(_Pipe* p, char* slot, int64_t off, int64_t m) noexcept nogil:
    if p.pieces == NULL:
        c_par_copy(p.host + off, slot, m, p.threads, False, 1)
    else:
        _move_pieces(p, slot, off, m, False, False)


cdef int _pipe_h2d(_Pipe* p, bint sync) except -1 nogil:
    """Chunk i: wait for its slot's previous DMA, fill the slot with ``threads`` threads,
    queue the slot's DMA and record the slot's event."""
    cdef int64_t i = 0, off = 0, m, want = p.first
    cdef int j, rc
    while off < p.nbytes:
        j = <int>(i % p.k)
        if p.pending[j]:
            rc = api.event_sync(p.event[j])
            if rc != 0:
                _pipe_failed(rc, p, True)
            p.pending[j] = False
        if T.trace:
            c_mark(STEP_WAITED, i)
        m = p.nbytes - off if p.nbytes - off < want else want
        if want < p.chunk:
            want = ((want * T.ramp_growth // 100) + 65535) & ~(<int64_t>65535)
            if want > p.chunk:
                want = p.chunk
        rc = _fill(p, p.slot[j], off, m)
        if rc != 0:
            _read_failed(rc, p, off)
        if T.trace:
            c_mark(STEP_FILLED, i)
        if p.pieces != NULL and p.pieces.dev != NULL:
            rc = _dma_pieces(p, p.slot[j], off, m, True)
        else:
            rc = api.htod(p.dev + <unsigned long long>off, p.slot[j], <size_t>m, p.stream)
        if rc == 0:
            rc = api.event_record(p.event[j], p.stream)
        if rc != 0:
            _pipe_failed(rc, p, True)
        if T.trace:
            c_mark(STEP_QUEUED, i)
        p.pending[j] = True
        off += m
        if T.chunk_hook or i % T.signal_every == T.signal_every - 1:
            _between_chunks(p, True, i, off)
        i += 1
    if sync:
        rc = api.stream_sync(p.stream)
        if rc != 0:
            _pipe_failed(rc, p, True)
        if T.trace:
            c_mark(STEP_SYNCED, i)
        for j in range(p.k):
            p.pending[j] = False
    return 0


cdef int _pipe_d2h(_Pipe* p) except -1 nogil:
    """The reverse: the DMAs of the first K chunks are queued at once; chunk i is
    copied out of its slot by ``threads`` threads once its event completes, and
    the slot's next DMA (chunk i+K) is queued right after."""
    cdef int64_t nchunks = _ceil_div(p.nbytes, p.chunk)
    cdef int64_t i, off, m
    cdef int j, rc
    for i in range(nchunks + p.k):
        if i >= p.k:
            # chunk i-K is in its slot once the slot's event completes: copy it out
            j = <int>((i - p.k) % p.k)
            rc = api.event_sync(p.event[j])
            if rc != 0:
                _pipe_failed(rc, p, False)
            p.pending[j] = False
            if T.trace:
                c_mark(STEP_WAITED, i - p.k)
            off = (i - p.k) * p.chunk
            m = _chunk_len(p, i - p.k)
            _drain(p, p.slot[j], off, m)
            if T.trace:
                c_mark(STEP_FILLED, i - p.k)
            if T.chunk_hook or (i - p.k) % T.signal_every == T.signal_every - 1:
                _between_chunks(p, False, i - p.k, off + m)
        if i < nchunks:
            j = <int>(i % p.k)
            off = i * p.chunk
            m = _chunk_len(p, i)
            if p.pieces != NULL and p.pieces.dev != NULL:
                rc = _dma_pieces(p, p.slot[j], off, m, False)
            else:
                rc = api.dtoh(p.slot[j], p.dev + <unsigned long long>off, <size_t>m, p.stream)
            if rc == 0:
                rc = api.event_record(p.event[j], p.stream)
            if rc != 0:
                _pipe_failed(rc, p, False)
            if T.trace:
                c_mark(STEP_QUEUED, i)
            p.pending[j] = True
    return 0


cdef void _settle(intptr_t stream, list slabs) noexcept:
    """On a failure: let queued copies finish before memory is freed or reused."""
    cdef Slab slab
    cdef int rc
    if c_forked():
        return        # forked during the copy: the stream is the parent's
    with nogil:
        rc = api.stream_sync(<void*>stream)
    if rc != 0:
        return        # the slabs keep their pending events: the pool waits for them
    for slab in slabs:
        slab.pending = False


cdef bint _take_ring(_Engine eng, CopyConfig* cfg, int dev, list slabs) except -1:
    """The engine's own slots for this copy, when free and of the copy's slot size (their
    pending events kept: the pipeline waits for them); else False."""
    cdef Slab slab
    cdef DeviceGuard guard
    if eng.busy or (eng.ring_bytes and eng.ring_bytes != cfg.slot_bytes):
        return False
    eng.busy = True
    try:
        while len(eng.ring) < cfg.slots:
            slab = Slab.__new__(Slab)
            slab.ptr = c_host_alloc(cfg.slot_bytes)
            slab.size = cfg.slot_bytes
            slab.dev = dev
            c_ensure_event(slab, dev)
            eng.ring.append(slab)
            eng.ring_bytes = cfg.slot_bytes
    except BaseException:
        eng.busy = False
        raise
    slabs.extend(eng.ring[:cfg.slots])
    return True


cdef int c_staged(uintptr_t dev_ptr, uintptr_t host, const HostList* pieces, int64_t nbytes,
                  int dev, intptr_t s, bint h2d, bint sync, CopyConfig* cfg,
                  object progress) except -1:
    """A pageable copy of the device range [dev_ptr, dev_ptr+nbytes) through K pinned
    slots; the host side is ``host`` (one range) or ``pieces``. ``dev`` is current.
    H2D with ``sync`` False leaves the DMAs queued (the host side has been read).
    ``progress`` (None or a callable) is called with the bytes moved so far every few
    chunks; what it raises ends the copy."""
    cdef _Pipe p
    cdef int64_t nchunks
    cdef long long epoch
    cdef list slabs = []
    cdef Slab slab
    cdef PinnedHostPool pool = c_default_pool()
    cdef _Engine eng = _engine(dev)
    cdef bint ring = False
    cdef int j
    p.host = <char*>host
    p.pieces = pieces
    p.dev = dev_ptr
    p.nbytes = nbytes
    p.chunk = _chunk_bytes(nbytes, cfg)
    p.first = p.chunk
    if h2d and p.chunk == cfg.slot_bytes and 0 < T.ramp_first < p.chunk and \
            nbytes <= T.ramp_max:
        p.first = T.ramp_first
    nchunks = _ceil_div(nbytes, p.chunk)
    p.k = <int>(cfg.slots if cfg.slots < nchunks else nchunks)
    p.threads = cfg.threads
    p.device = dev
    if pieces != NULL and pieces.fd >= 0:
        p.nontemporal = nbytes <= T.nt_file_max
        p.read_bounce = T.read_bounce
    else:
        p.nontemporal = nbytes <= T.nt_max
        p.read_bounce = 0
    p.stream = <void*>s
    p.progress = NULL if progress is None else <void*>progress
    if T.trace:
        c_mark(STEP_BEGIN, nbytes)
    epoch = c_copy_begin(p.threads)      # wakes the copy threads while the slots are found
    try:
        try:
            ring = _take_ring(eng, cfg, dev, slabs)
            if not ring:
                for j in range(p.k):
                    # whole slots (slot_bytes) even for shorter chunks: one size class to cache
                    slab = pool.c_acquire(cfg.slot_bytes, dev)
                    slabs.append(slab)
            for j in range(p.k):
                slab = slabs[j]
                c_ensure_event(slab, dev)
                p.slot[j] = <char*>slab.ptr
                p.event[j] = <void*>slab.event
                p.pending[j] = slab.pending
            if T.trace:
                c_mark(STEP_SLOTS, p.chunk)
            if h2d:
                with nogil:
                    _pipe_h2d(&p, sync)
            else:
                with nogil:
                    _pipe_d2h(&p)
        finally:
            for j in range(min(len(slabs), p.k)):   # which slots a queued DMA may still touch
                (<Slab>slabs[j]).pending = p.pending[j]
    except BaseException:
        _settle(s, slabs)
        raise
    finally:
        c_copy_end(epoch)
        if ring:
            eng.busy = False
        else:
            c_release_all(pool, slabs, cfg.slot_bytes)
    return 0


# ------------------------------------------------------------------ the entries

cdef int _one_dma(uintptr_t dst, uintptr_t src, int64_t nbytes, bint h2d, intptr_t s,
                  bint sync, _Small fence) except? -1:
    """One cudaMemcpyAsync (+ wait when ``sync``: on ``fence``, or for None by stream
    synchronisation); its return code."""
    cdef int rc
    with nogil:
        if h2d:
            rc = api.htod(dst, <const void*>src, <size_t>nbytes, <void*>s)
        else:
            rc = api.dtoh(<void*>dst, src, <size_t>nbytes, <void*>s)
    if rc == 0 and sync:
        rc = c_complete(fence, s)
    return rc


cdef bint _on_copy_stream(int dev, intptr_t s) except -1:
    """Whether ``s`` is ``dev``'s copy stream (where the default synchronous form runs)."""
    return s == _engine(dev).stream


cdef int c_transfer(uintptr_t dev_side, uintptr_t host, int64_t nbytes, int dev, intptr_t s,
                    bint sync, CopyConfig* cfg, bint h2d) except -1:
    """One copy between ``host`` and ``dev_side`` on stream ``s`` (``dev`` current), by the
    path that suits the host side; ``sync``: wait for it."""
    cdef Slab slab
    cdef int rc = 0
    cdef uintptr_t dst = dev_side if h2d else host
    cdef uintptr_t src = host if h2d else dev_side
    cdef bint writable = c_check_device_range(dev_side, nbytes, "dst" if h2d else "src")
    # a pool block at ``host``, or for a stream-ordered copy also one holding it
    slab = c_default_pool().c_find(host) if sync else c_pool_block_containing(host)
    if slab is not None or (nbytes > cfg.small_bytes and c_is_page_locked(host)):
        # page-locked: one DMA, read in stream order (a stream-ordered upload of a pool
        # block that an earlier copy on the stream fills must see what that copy wrote,
        # at any size); a pool block remembers the copy until it completes
        rc = _one_dma(dst, src, nbytes, h2d, s, sync,
                      None if h2d else c_fence_for(dev, nbytes, sync and _on_copy_stream(dev, s)))
        if rc == 0 and not sync and slab is not None:
            c_record(slab, s, dev)
    elif h2d and nbytes <= TINY_BYTES and api.driver:
        c_tiny_h2d(dst, src, nbytes, dev, s, sync, sync and _on_copy_stream(dev, s), writable)
    elif nbytes <= cfg.small_bytes:
        # small and pageable: one cudaMemcpyAsync; the driver stages it. Into pageable
        # memory, or for the default synchronous form, wait for it.
        rc = _one_dma(dst, src, nbytes, h2d, s, sync or not h2d, None)
    else:
        c_staged(dev_side, host, NULL, nbytes, dev, s, h2d, sync or not h2d, cfg, None)
    if rc != 0:
        c_cuda_failed(rc, f"{'host->device' if h2d else 'device->host'} copy of "
                          f"nbytes={nbytes} on cuda:{dev}")
    return 0


cdef int _entry(uintptr_t dev_side, uintptr_t host, int64_t nbytes, int dev, object stream,
                CopyConfig* cfg, bint h2d) except -1:
    """What :func:`c_h2d` and :func:`c_d2h` share: check the backend, make ``dev``
    current, run the copy on its copy stream (or ``stream``) and restore the device."""
    cdef DeviceGuard guard
    c_check_usable("host->device copy" if h2d else "device->host copy")
    if nbytes <= 0:
        return 0
    c_runtime()
    c_enter_device(dev, &guard)
    try:
        c_transfer(dev_side, host, nbytes, dev, c_copy_stream(dev, stream), stream is None,
                   cfg, h2d)
    finally:
        c_exit_device(&guard)
    return 0


cdef int c_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1:
    """Copy ``nbytes`` from host address ``src`` to device address ``dst`` on ``dev`` (a
    checked device index).

    ``stream`` None: synchronous (on the device's copy stream, ordered after the
    caller's current stream). Otherwise queued on ``stream``: a pageable ``src``
    has been read when this returns; a page-locked one is read by the DMA later.
    """
    return _entry(dst, src, nbytes, dev, stream, cfg, True)


cdef int c_d2h(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1:
    """Copy ``nbytes`` from device address ``src`` on ``dev`` to host address ``dst``.

    ``stream`` None: synchronous. Otherwise queued on ``stream``: into page-locked
    memory the DMA may still run on return; into pageable memory it has completed.
    """
    return _entry(src, dst, nbytes, dev, stream, cfg, False)
