from libc.stdint cimport int64_t

from etptr._core._types cimport sizes_t, dim_order_t, strides_t, kTensorDimensionLimit
from etptr._core._device cimport Device


cdef class TensorPtr:
    cdef sizes_t c_sizes[kTensorDimensionLimit]
    cdef dim_order_t c_dim_order[kTensorDimensionLimit]
    cdef strides_t c_strides[kTensorDimensionLimit]
    cdef int c_dim
    cdef int c_type
    cdef int c_dynamism
    cdef int64_t c_numel
    cdef int64_t c_numel_bound   # element count at creation: the bound for resizes
    cdef void* c_data
    cdef bint c_readonly
    cdef Device c_device
    cdef object c_owner          # keeps the memory alive (buffer, source tensor, pool block)
    cdef object c_deleter        # called once with the address when the tensor dies
    cdef object c_allocator      # device allocator that frees c_data when the tensor dies
    cdef int c_alloc_index
    cdef object __weakref__

    cdef int64_t c_nbytes(self) noexcept nogil


cdef class Metadata:
    # Validated sizes / dim_order / strides, computed once, copied into tensors.
    cdef sizes_t sizes[kTensorDimensionLimit]
    cdef dim_order_t dim_order[kTensorDimensionLimit]
    cdef strides_t strides[kTensorDimensionLimit]
    cdef int dim
    cdef int64_t numel


cdef Metadata c_metadata(object sizes, object dim_order, object strides)
cdef TensorPtr c_new_tensor(Metadata meta, int type, int dynamism, Device device)
cdef TensorPtr c_like_tensor(TensorPtr src, int type)
cdef int c_set_data(TensorPtr t, int64_t address, object owner, bint readonly) except -1
cdef TensorPtr c_host_empty(Metadata meta, int type, int dynamism)
cdef TensorPtr c_device_empty(Metadata meta, int type, int dynamism, Device device)
cdef int c_dynamism_arg(object dynamism) except -1
cdef int c_type_arg(object t, int default) except -1
cdef object c_storage_array(TensorPtr t)
cdef TensorPtr c_tensor_arg(object tensor, str argname)
cpdef TensorPtr clone_tensor_ptr_to(TensorPtr tensor, object device)
