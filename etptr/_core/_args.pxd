from libc.stdint cimport int64_t

cdef int64_t c_int_arg(object v, str argname, int64_t lo, int64_t hi, Py_ssize_t pos=*) except? -1
cdef int64_t c_count_arg(object v, str argname) except -1
cdef str c_type_name(object x)
cdef int64_t c_result_int(object v, str what, str expected, str out_of_range, int64_t lo,
                          int64_t hi) except? -1
