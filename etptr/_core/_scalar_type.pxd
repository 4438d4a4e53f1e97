from libc.stdint cimport int64_t

cdef enum:
    kNumScalarTypes = 30

cdef int64_t c_element_size(int t) noexcept nogil
cdef bint c_valid_scalar_type(int t) noexcept nogil
cdef bint c_can_cast(int src, int dst) noexcept nogil
cdef bint c_castable(int t) noexcept nogil
cdef object c_scalar_type(object t, str argname)
cdef object c_numpy_dtype(int t)
