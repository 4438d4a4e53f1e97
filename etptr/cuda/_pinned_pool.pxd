from libc.stdint cimport int64_t, intptr_t, uintptr_t

cimport cython


cdef class Slab:
    # One page-locked host allocation of ``size`` bytes (a size class).
    cdef uintptr_t ptr
    cdef int64_t size
    cdef int dev              # device whose context allocated it
    cdef object allocator     # what frees it: free(ptr, dev)
    cdef intptr_t event       # 0, or the slab's CUDA event, made on ``event_dev``
    cdef int event_dev
    cdef object fence         # None, or a caller's event (query() / done) guarding it
    cdef bint pending         # a copy touching the slab may still run


cdef class PinnedBlock:
    cdef Slab c_slab
    cdef object c_pool_ref    # weakref to the pool the slab goes back to
    cdef int64_t c_nbytes


cdef struct _Counts:
    int64_t in_use, requested, cached, peak, limit, hits, misses, evictions, failures
    int64_t blocks_in_use, blocks_cached


cdef class PinnedHostPool:
    cdef cython.pymutex c_lock
    cdef dict c_free          # size class -> list of cached Slab (newest last)
    cdef dict c_order         # cached Slab -> None, oldest first (eviction order)
    cdef dict c_live          # address -> Slab handed out
    cdef object c_allocator   # malloc(nbytes, device) -> address, free(address, device)
    cdef bint c_cuda          # c_allocator is the CUDA page-locked allocator
    cdef int64_t c_limit
    cdef int64_t c_in_use
    cdef int64_t c_cached
    cdef int64_t c_requested
    cdef int64_t c_peak
    cdef int64_t c_hits
    cdef int64_t c_misses
    cdef int64_t c_evictions
    cdef int64_t c_failures
    cdef object c_ref           # weakref to self, handed to blocks
    cdef object __weakref__

    cdef Slab c_acquire(self, int64_t nbytes, int dev)
    cdef int c_release(self, Slab slab, int64_t nbytes) except -1
    cdef Slab c_find(self, uintptr_t address)
    cdef PinnedBlock c_malloc(self, int64_t nbytes, int dev)
    cdef void _recache(self, Slab slab, list spare, bint oldest) noexcept
    cdef void _take(self, Slab slab, int64_t nbytes, bint hit) noexcept
    cdef Slab _new_slab(self, int64_t size, int64_t nbytes, int dev)
    cdef void _evict(self, list to_free) noexcept
    cdef int _forget(self) except -1
    cdef void _counts(self, _Counts* c) noexcept


cdef PinnedHostPool c_default_pool()
cdef int c_release_all(PinnedHostPool pool, object slabs, int64_t nbytes) except -1
cdef int c_record(Slab slab, intptr_t stream, int dev) except -1
cdef int c_ensure_event(Slab slab, int dev) except -1
cdef Slab c_pool_block_containing(uintptr_t address)
