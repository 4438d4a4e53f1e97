cdef int raise_error(int code, str message) except -1
