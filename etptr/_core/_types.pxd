# Element types of the metadata arrays, ExecuTorch's SizesType / DimOrderType /
# StridesType, widened to 64 bits so that sizes and strides past 2**31 work.
from libc.stdint cimport int64_t, uint8_t

ctypedef int64_t sizes_t
ctypedef uint8_t dim_order_t
ctypedef int64_t strides_t

# ExecuTorch's kTensorDimensionLimit.
cdef enum:
    kTensorDimensionLimit = 16
