from libc.stdint cimport int64_t, intptr_t, uintptr_t

cimport cython


cdef class _Slab:
    # One page-locked host allocation of ``size`` bytes (a size class).
    cdef uintptr_t ptr
    cdef int64_t size
    cdef int dev              # device whose context allocated it
    cdef intptr_t event       # 0, or a CUDA event on ``event_dev``
    cdef int event_dev
    cdef bint pending         # event recorded; the copy may still run


cdef class PinnedBlock:
    cdef _Slab c_slab
    cdef object c_pool_ref    # weakref to the pool the slab goes back to
    cdef int64_t c_nbytes


cdef struct _Counts:
    int64_t in_use, requested, cached, peak, limit, hits, misses, evictions, failures
    int64_t blocks_in_use, blocks_cached


cdef class PinnedHostPool:
    cdef cython.pymutex c_lock
    cdef dict c_free          # size class -> list of cached _Slab (newest last)
    cdef dict c_order         # cached _Slab -> None, oldest first (eviction order)
    cdef dict c_live          # address -> _Slab handed out
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

    cdef _Slab c_acquire(self, int64_t nbytes, int dev)
    cdef _Slab _new_slab(self, int64_t size, int64_t nbytes, int dev)
    cdef void _recache(self, _Slab slab, list spare, bint oldest) noexcept
    cdef void _take(self, _Slab slab, int64_t nbytes, bint hit) noexcept
    cdef int c_release(self, _Slab slab, int64_t nbytes) except -1
    cdef void _evict(self, list to_free) noexcept
    cdef _Slab c_find(self, uintptr_t address)
    cdef int c_forget(self) except -1
    cdef void _counts(self, _Counts* c) noexcept
    cdef PinnedBlock c_malloc(self, int64_t nbytes, int dev)


cdef struct CopyConfig:
    int threads
    int64_t slot_bytes
    int slots
    int64_t small_bytes


cdef int64_t c_size_class(int64_t nbytes) noexcept nogil
cdef bint c_forked() noexcept
cdef int c_check_usable(str what) except -1
cdef object c_cupy()
cdef PinnedHostPool c_default_pool()
cdef int c_config(CopyConfig* cfg, object threads, object slot_bytes, object slots,
                  object small_bytes) except -1
cdef int c_copy(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                CopyConfig* cfg, bint h2d) except -1
cdef intptr_t c_stream_handle(object stream) except? -1
cdef struct DeviceGuard:
    void* prev                # the context current before c_enter_device (may be NULL)
    bint switched             # c_enter_device made another one current


cdef int c_enter_device(int dev, DeviceGuard* guard) except -1
cdef int c_exit_device(DeviceGuard* guard) except -1
cdef int c_current_device() except -1
cdef int c_cuda_failed(int rc, str what) except -1
