cdef class DeviceAllocator:
    pass

cpdef object c_get_allocator(int device_type)
