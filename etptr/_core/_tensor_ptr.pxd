from libc.stdint cimport int64_t, uintptr_t

from etptr._core._device cimport Device
from etptr._core._metadata cimport Metadata
from etptr._core._storage cimport Storage
from etptr._core._types cimport dim_order_t, kTensorDimensionLimit, sizes_t, strides_t


cdef class TensorPtr:
    cdef sizes_t c_sizes[kTensorDimensionLimit]
    cdef dim_order_t c_dim_order[kTensorDimensionLimit]
    cdef strides_t c_strides[kTensorDimensionLimit]
    cdef int c_dim
    cdef int c_type
    cdef int c_dynamism
    cdef int64_t c_numel
    cdef int64_t c_numel_bound   # element count at creation: the bound for resizes
    cdef void* c_data            # the first element (a Storage's address, or inside it)
    cdef bint c_readonly
    cdef Device c_device
    cdef Storage c_storage       # the memory: shared with views, released with the last
    cdef object __weakref__

    cdef int64_t c_nbytes(self) noexcept nogil


cdef TensorPtr c_new_tensor(Metadata meta, int type, int dynamism, Device device,
                            Storage storage, uintptr_t data, bint readonly)
cdef Metadata c_snapshot(TensorPtr t)
cdef TensorPtr c_copy_layout(TensorPtr src, int type, Device device)
cdef void c_set_memory(TensorPtr t, Storage storage, uintptr_t data, bint readonly) noexcept
cdef TensorPtr c_tensor_arg(object t, str argname)
cdef int c_type_arg(object t, int default) except -1
cdef int c_dynamism_arg(object dynamism) except -1
cdef TensorPtr c_host_empty(Metadata meta, int type, int dynamism)
cdef TensorPtr c_host_empty_pinned(Metadata meta, int type, int dynamism)
cdef TensorPtr c_device_empty(Metadata meta, int type, int dynamism, Device device)
cdef object c_storage_array(TensorPtr t)
cdef Device c_cpu()
