# DLPack declarations shared by the exporter (_tensor_ptr.pyx via _dlpack.pxi)
# and the importer (_interop.pyx). Struct layouts follow dlpack.h, DLPack 1.1;
# the capsule protocol follows the Python array API standard. Declarations only:
# no module is built from this file.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from *:
    """
    #include <stdint.h>
    #ifndef ETPTR_DLPACK_STRUCTS
    #define ETPTR_DLPACK_STRUCTS
    typedef struct { int32_t device_type; int32_t device_id; } etptr_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } etptr_DLDataType;
    typedef struct {
        void* data; etptr_DLDevice device; int32_t ndim; etptr_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } etptr_DLTensor;
    typedef struct etptr_DLManagedTensor {
        etptr_DLTensor dl_tensor; void* manager_ctx;
        void (*deleter)(struct etptr_DLManagedTensor*);
    } etptr_DLManagedTensor;
    typedef struct { uint32_t major; uint32_t minor; } etptr_DLPackVersion;
    typedef struct etptr_DLManagedTensorVersioned {
        etptr_DLPackVersion version; void* manager_ctx;
        void (*deleter)(struct etptr_DLManagedTensorVersioned*);
        uint64_t flags; etptr_DLTensor dl_tensor;
    } etptr_DLManagedTensorVersioned;
    #endif
    """
    ctypedef struct DLDevice "etptr_DLDevice":
        int32_t device_type
        int32_t device_id
    ctypedef struct DLDataType "etptr_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "etptr_DLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "etptr_DLManagedTensor":
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept nogil
    ctypedef struct DLPackVersion "etptr_DLPackVersion":
        uint32_t major
        uint32_t minor
    ctypedef struct DLManagedTensorVersioned "etptr_DLManagedTensorVersioned":
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor


# DLDeviceType
cdef enum:
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLROCM = 10
    kDLROCMHost = 11
    kDLCUDAManaged = 13

# DLDataTypeCode
cdef enum:
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLOpaqueHandle = 3
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6
    kDLFloat8_e3m4 = 7
    kDLFloat8_e4m3 = 8
    kDLFloat8_e4m3b11fnuz = 9
    kDLFloat8_e4m3fn = 10
    kDLFloat8_e4m3fnuz = 11
    kDLFloat8_e5m2 = 12
    kDLFloat8_e5m2fnuz = 13
    kDLFloat8_e8m0fnu = 14
    kDLFloat6_e2m3fn = 15
    kDLFloat6_e3m2fn = 16
    kDLFloat4_e2m1fn = 17

# DLManagedTensorVersioned.flags
cdef enum:
    DLPACK_FLAG_BITMASK_READ_ONLY = 1
    DLPACK_FLAG_BITMASK_IS_COPIED = 2
    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = 4

# The DLPack version etptr speaks (exports, and the newest it imports).
cdef enum:
    DLPACK_MAJOR_VERSION = 1
    DLPACK_MINOR_VERSION = 1
