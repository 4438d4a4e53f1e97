cdef class Device:
    cdef readonly int c_type
    cdef readonly int c_index

cdef Device c_device(object spec, str argname)
cdef Device c_make_device(int type, int index)
