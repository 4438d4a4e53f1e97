from etptr._core._device cimport Device
from etptr._core._tensor_ptr cimport TensorPtr

cdef TensorPtr c_clone_to(TensorPtr src, Device dst, object stream, bint pinned)
