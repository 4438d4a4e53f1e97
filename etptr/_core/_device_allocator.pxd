from libc.stdint cimport int64_t, uintptr_t


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
                              int64_t count, int index, object stream, bint padded) except -1
    cdef int c_copy_d2h_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, bint padded) except -1
    cdef object c_allocate_host(self, int64_t nbytes, int index)
    cdef int c_resolve_index(self, int index) except -2


cpdef DeviceAllocator c_get_allocator(int device_type)
cdef DeviceAllocator c_allocator_for(int device_type, int index, str argname)
cdef int c_registry_generation() noexcept
