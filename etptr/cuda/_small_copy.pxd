cimport cython
from libc.stdint cimport int64_t, intptr_t, uint32_t, uintptr_t


cdef enum:
    TINY_BYTES = 4096            # pageable uploads up to this size are tiny


@cython.final
cdef class _Small:
    # One device's tiny slots and fence: a page-locked block of the slots, each of
    # TINY_BYTES, then the fence word; made on first use, kept for the process's life.
    cdef cython.pymutex lock
    cdef char* block
    cdef intptr_t event[64]      # each slot's last upload
    cdef int next_slot
    cdef uint32_t* fence         # numbered in order by writes on the device's copy stream
    cdef uint32_t fence_seq


cdef _Small c_fence_for(int dev, int64_t nbytes, bint sync_on_copy_stream)
cdef int c_complete(_Small fence, intptr_t s) except? -1
cdef int c_tiny_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, intptr_t s,
                    bint sync, bint sync_on_copy_stream, bint writable) except -1
