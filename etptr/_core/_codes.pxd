# Named C constants for the codes etptr shares with ExecuTorch, and its alignments.
# cimport-only: the Python enums (ScalarType, DeviceType, TensorShapeDynamism) carry
# the same values for users.

# ExecuTorch's ScalarType codes (runtime/core/portable_type/scalar_type.h).
cdef enum:
    TYPE_BYTE = 0
    TYPE_CHAR = 1
    TYPE_SHORT = 2
    TYPE_INT = 3
    TYPE_LONG = 4
    TYPE_HALF = 5
    TYPE_FLOAT = 6
    TYPE_DOUBLE = 7
    TYPE_BOOL = 11
    TYPE_BFLOAT16 = 15
    TYPE_UINT16 = 27
    TYPE_UINT32 = 28
    TYPE_UINT64 = 29

# ExecuTorch's DeviceType codes (runtime/core/device.h).
cdef enum:
    DEVICE_CPU = 0
    DEVICE_CUDA = 1

# ExecuTorch's TensorShapeDynamism codes (runtime/core/tensor_shape_dynamism.h).
cdef enum:
    DYNAMISM_STATIC = 0
    DYNAMISM_DYNAMIC_BOUND = 1
    DYNAMISM_DYNAMIC_UNBOUND = 2

# Alignments, in bytes.
cdef enum:
    # ExecuTorch's kDefaultAlignment: what an allocation is aligned to unless asked for more
    DEFAULT_ALIGNMENT_BYTES = 8
    # Where device tensors laid out by etptr start (a batched clone's results, a
    # checkpoint's tensors): cudaMalloc's guarantee, more than any element size needs
    DEVICE_ALIGNMENT_BYTES = 256


cdef inline long long align_up(long long n, long long alignment) noexcept nogil:
    """``n`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (n + alignment - 1) & ~(alignment - 1)
