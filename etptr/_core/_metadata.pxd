from libc.stdint cimport int64_t

from etptr._core._types cimport dim_order_t, kTensorDimensionLimit, sizes_t, strides_t


cdef class Metadata:
    # Validated sizes / dim_order / strides with their element count: computed once,
    # copied into tensors, and the snapshot a clone is built from.
    cdef sizes_t sizes[kTensorDimensionLimit]
    cdef dim_order_t dim_order[kTensorDimensionLimit]
    cdef strides_t strides[kTensorDimensionLimit]
    cdef int dim
    cdef int64_t numel


cdef Metadata c_metadata(object sizes, object dim_order, object strides)
cdef int c_fill_strides(Metadata m, const int64_t* strides, int nstrides) except -1
cdef Metadata c_new_metadata()
cdef int c_read_ints(object seq, int64_t* out, str argname) except -2
cdef int c_check_sizes(Metadata m) except -1
cdef int c_fill_metadata(Metadata m, object dim_order, object strides) except -1
cdef int c_dim_order_to_strides(const sizes_t* sizes, const dim_order_t* dim_order, int dim,
                                strides_t* strides) except -1
cdef int64_t c_nbytes(int64_t numel, int type) except -1
cdef tuple c_tuple64(const int64_t* a, int n)
cdef tuple c_tuple8(const dim_order_t* a, int n)
