from libc.stdint cimport int64_t, uintptr_t

from etptr._core._device_allocator cimport DeviceAllocator


cdef class Storage:
    # The memory behind one or more TensorPtrs: the address, who keeps it alive, and
    # who gives it back. Shared by a tensor and its views; released exactly once,
    # when the last of them is gone.
    cdef uintptr_t c_ptr
    cdef int64_t c_nbytes             # bytes the memory holds (-1: not known, raw address)
    cdef object c_owner               # keeps the memory alive (buffer export, array, ...)
    cdef object c_deleter             # deleter(address), called once at release
    cdef DeviceAllocator c_allocator  # frees c_ptr through c_deallocate(ptr, c_index)
    cdef int c_index
    cdef DeviceAllocator c_host_of    # the allocator whose allocate_host gave this host memory
    cdef bint c_released              # given back (during a garbage collection)

    cdef int c_release(self) except -1
    cdef int c_free_now(self) except -1
    cdef int _free(self, bint raise_failure) except -1


cdef Storage c_storage(uintptr_t ptr, int64_t nbytes, object owner, object deleter)
cdef Storage c_host_storage(int64_t nbytes)
cdef Storage c_export_storage(object obj, int64_t nbytes, bint writable, str what)
cdef Storage c_device_storage(DeviceAllocator alloc, int64_t nbytes, int index,
                              int64_t alignment, object stream)
cdef Storage c_pinned_storage(int64_t nbytes, int index)
cdef int c_check_alive(Storage s, str what) except -1
cdef void c_warn_teardown(str what, object exc) noexcept
