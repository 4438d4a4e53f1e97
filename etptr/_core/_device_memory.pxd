from libc.stdint cimport int64_t, uintptr_t

from etptr._core._device cimport Device
from etptr._core._device_allocator cimport DeviceAllocator
from etptr._core._storage cimport Storage
from etptr._core._tensor_ptr cimport TensorPtr
from etptr._core._metadata cimport Metadata


cdef class DeviceMemoryBuffer:
    cdef Storage c_storage       # the allocation; None once closed
    cdef uintptr_t c_ptr
    cdef int64_t c_nbytes
    cdef Device c_device
    cdef DeviceAllocator c_allocator

    cdef TensorPtr _view(self, int64_t off, Metadata meta, int t, int dyn)


cdef DeviceMemoryBuffer c_buffer_create(int64_t nbytes, Device device, int64_t alignment,
                                        object stream)
cdef TensorPtr c_buffer_view(Storage storage, uintptr_t address, Metadata meta, int type,
                             int dynamism, Device device)
