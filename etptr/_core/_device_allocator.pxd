from libc.stdint cimport int64_t, uintptr_t


cdef enum:
    # What the caller of a batched copy (c_copy_h2d_batch / c_copy_d2h_batch) knows of its
    # pieces, or'ed into ``facts``, so that the allocator need not ask the driver:
    BATCH_PADDED = 1                 # the bytes between the pieces on the side written are
                                     # the caller's padding (a batched clone's own allocation)
    BATCH_DEVICE_ONE_ALLOCATION = 2  # every device side lies in one allocation of this
                                     # allocator
    BATCH_HOST_ONE_ALLOCATION = 4    # every host side lies in one allocation
    BATCH_HOST_ALLOCATED = 8         # every host side is memory this allocator's
                                     # allocate_host gave (page-locked, for CUDA)


cdef class DeviceAllocator:
    # The registry's C-level interface: the etptr functions call these; the base
    # implementation forwards to the Python methods (so Python subclasses work), and a
    # compiled allocator (CudaAllocator) overrides them with direct C calls.
    cdef uintptr_t c_allocate(self, int64_t nbytes, int index, int64_t alignment,
                              object stream) except? 0
    cdef int c_deallocate(self, uintptr_t ptr, int index) except -1
    cdef int c_copy_h2d(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1
    cdef int c_copy_d2h(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1
    cdef int c_copy_h2d_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1
    cdef int c_copy_d2h_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1
    cdef object c_allocate_host(self, int64_t nbytes, int index)
    cdef int c_resolve_index(self, int index) except -2


cdef class FilePieces:
    # the checked pieces of a file upload (see c_file_pieces)
    cdef int64_t* file_offset
    cdef int64_t* dst_offset
    cdef int64_t* nbytes
    cdef unsigned char* direct       # 1: read through the direct descriptor
    cdef int64_t count
    cdef bint any_direct


cdef FilePieces c_file_pieces(object pieces, object dst, object progress, object on_queued)
cdef int c_direct_fd(object direct_fd, FilePieces fp) except -2
cpdef DeviceAllocator c_get_allocator(int device_type)
cdef DeviceAllocator c_allocator_for(int device_type, int index, str argname)
cdef int c_registry_generation() noexcept
