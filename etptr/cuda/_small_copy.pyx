"""Small copies: tiny uploads, and the fence that small synchronous copies wait on.

The copy engine (:mod:`etptr.cuda._copy_engine`) sends a pageable upload of up
to ``TINY_BYTES`` here. One of 4 or 8 bytes into device memory that stream
memory operations may write goes as stream writes (``cuStreamWriteValue32/64``):
the value travels in the command, so the source has been read on return and no
host memory is involved. Other tiny uploads are copied into one of 64
page-locked slots per device and sent from there; a slot is reused once its
event has completed.

A synchronous copy that would end in ``cuStreamSynchronize`` can instead wait
on the device's fence (``_fence.h``): after the copy, the copy stream writes
the next number of a sequence into a word of page-locked memory, and the host
spins on the word for up to 0.2 ms before it synchronises the stream after all
(which also reports a copy that failed: the stream then writes nothing more).
The engine asks for the fence after stream writes and after downloads into
page-locked memory, where it was measured to pay; after an upload's DMA stream
synchronisation was as fast or faster (``bench/results/DECISIONS.md``, fence).
"""
cimport cython
from libc.stdint cimport int64_t, intptr_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy, memset

from etptr.cuda._driver cimport (
    NOT_SUPPORTED, api, c_cuda_failed, c_event_create, c_forget_on_change, c_host_alloc,
    c_host_free)

from etptr._core._error import EtError

cdef extern from "_fence.h" nogil:
    int etptr_fence_spin(const uint32_t* word, uint32_t seq, int64_t budget_ns)

from etptr.cuda._tuning cimport Tuning, c_tuning

cdef int _SLOTS = 64
cdef int64_t _FENCE_BYTES = 64           # the fence word's line, after the tiny slots
cdef Tuning* T = c_tuning()              # stream_writes, fence, fence_spin_ns, fence_max
cdef bint _writes_work = True            # False once the driver refused a stream write
cdef bint _write64_works = True          # False once the driver refused a 64-bit write
cdef bint _fence_works = True            # False once the driver refused a fence's write


def _stream_writes_available():
    """Whether the copies call libcuda and it has cuStreamWriteValue32 (for tests)."""
    return api.has_writes


@cython.final
cdef class _Small:
    """One device's tiny slots and fence (attributes in ``_small_copy.pxd``)."""


cdef dict _smalls = {}
cdef cython.pymutex _smalls_lock


cdef _Small _small(int dev):
    """``dev``'s slots and fence, with their block made (``dev`` current)."""
    cdef _Small sm = _smalls.get(dev)
    cdef char* extra
    if sm is None:
        with _smalls_lock:
            sm = _smalls.setdefault(dev, _Small.__new__(_Small))
    if sm.block == NULL:
        # pinned outside the lock (the allocation may run Python); a thread that lost
        # the race gives its block back
        extra = <char*>c_host_alloc(TINY_BYTES * _SLOTS + _FENCE_BYTES)
        memset(extra + TINY_BYTES * _SLOTS, 0, <size_t>_FENCE_BYTES)
        with sm.lock:
            if sm.block == NULL:
                sm.fence = <uint32_t*>(extra + TINY_BYTES * _SLOTS)
                sm.block = extra
                extra = NULL
        if extra != NULL:
            c_host_free(<uintptr_t>extra)
    return sm


c_forget_on_change(_smalls)     # the blocks and events belong to a backend, a context


# ------------------------------------------------------------------ the fence

cdef _Small c_fence_for(int dev, int64_t nbytes, bint sync_on_copy_stream):
    """The fence a copy of ``nbytes`` waits on, or None (stream synchronisation): a
    synchronous copy of up to 1 MiB on the device's copy stream (``sync_on_copy_stream``:
    the fence's numbers must all reach one stream), where libcuda has stream writes and
    the fence word could be pinned."""
    if not sync_on_copy_stream or not T.fence or not _fence_works or \
            not api.has_writes or nbytes > T.fence_max:
        return None
    try:
        return _small(dev)
    except EtError:
        return None                     # no page-locked memory for it: synchronise instead


cdef int c_complete(_Small fence, intptr_t s) except? -1:
    """Wait for the work queued on the copy stream ``s`` so far: on ``fence``, or (None)
    by stream synchronisation; its return code. A fence whose write the driver refuses
    falls back to stream synchronisation (and after NOT_SUPPORTED is not used again)."""
    global _fence_works
    cdef uint32_t seq = 0
    cdef int rc = -1
    if fence is not None:
        with fence.lock:                # the numbers reach the stream in order
            rc = api.write32(<void*>s, <unsigned long long><uintptr_t>fence.fence,
                             fence.fence_seq + 1, 0)
            if rc == 0:
                fence.fence_seq += 1
                seq = fence.fence_seq
        if rc == NOT_SUPPORTED:
            _fence_works = False
    with nogil:
        if rc != 0 or not etptr_fence_spin(fence.fence, seq, T.fence_spin_ns):
            rc = api.stream_sync(<void*>s)
    return rc


# ------------------------------------------------------------------ tiny uploads

cdef int _write_words(uintptr_t dst, uintptr_t src, int64_t nbytes, intptr_t s) noexcept nogil:
    """A 4- or 8-byte upload as stream writes (cuStreamWriteValue32/64; two 32-bit ones
    where the 64-bit one is missing, refused or not aligned); its return code."""
    global _write64_works
    cdef uint32_t lo = 0, hi = 0
    cdef uint64_t both = 0
    cdef int rc
    if nbytes == 8 and dst % 8 == 0 and api.has_write64 and _write64_works:
        memcpy(&both, <const void*>src, 8)
        rc = api.write64(<void*>s, dst, both, 0)
        if rc != NOT_SUPPORTED:
            return rc
        _write64_works = False
    memcpy(&lo, <const void*>src, 4)
    rc = api.write32(<void*>s, dst, lo, 0)
    if rc == 0 and nbytes == 8:
        memcpy(&hi, <const void*>(src + 4), 4)
        rc = api.write32(<void*>s, dst + 4, hi, 0)
    return rc


cdef int c_tiny_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, intptr_t s,
                    bint sync, bint sync_on_copy_stream, bint writable) except -1:
    """Upload ``nbytes`` (at most TINY_BYTES) of pageable memory, read at the call, to
    device address ``dst`` on ``dev`` (current) on stream ``s``; ``sync``: wait for it
    (``sync_on_copy_stream``: and ``s`` is the device's copy stream, where the fence may
    serve). ``writable``: stream writes may target ``dst`` (not managed memory). A queued 4-byte
    stream write took half the time of a slot's copy, whose cuEventSynchronize alone
    costs about 1.3 us (``bench/results/DECISIONS.md``, stream_writes)."""
    global _writes_work
    cdef _Small sm
    cdef _Small fence = None
    cdef int j
    cdef int rc = -1
    cdef char* slot
    if T.stream_writes and _writes_work and writable and api.has_writes and (nbytes == 4 or nbytes == 8) \
            and dst % 4 == 0:
        with nogil:
            rc = _write_words(dst, src, nbytes, s)
        if rc == 0:
            fence = c_fence_for(dev, nbytes, sync_on_copy_stream)
        elif rc == NOT_SUPPORTED:
            _writes_work = False      # this driver has no stream writes: the slots from now on
    if rc != 0:
        sm = _small(dev)
        with sm.lock:
            j = sm.next_slot
            sm.next_slot = (j + 1) % _SLOTS
            if sm.event[j] == 0:
                sm.event[j] = c_event_create()
            slot = sm.block + j * TINY_BYTES
            with nogil:
                rc = api.event_sync(<void*>sm.event[j])      # its last upload has been read
                if rc == 0:
                    memcpy(slot, <const void*>src, <size_t>nbytes)
                    rc = api.htod(dst, slot, <size_t>nbytes, <void*>s)
                if rc == 0:
                    rc = api.event_record(<void*>sm.event[j], <void*>s)
    if rc == 0 and sync:
        rc = c_complete(fence, s)
    if rc != 0:
        c_cuda_failed(rc, f"host->device copy of nbytes={nbytes} on cuda:{dev}")
    return 0
