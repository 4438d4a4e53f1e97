cdef class Device:
    cdef readonly int c_type
    cdef readonly int c_index
    cdef bint c_frozen  # set once built: Devices are shared, so they never change

cdef Device c_device(object spec, str argname)
cdef Device c_make_device(int type, int index)
