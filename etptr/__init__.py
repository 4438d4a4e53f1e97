"""etptr: ExecuTorch's TensorPtr API for Python.

Tensor metadata with ExecuTorch semantics (sizes, dim_order, strides,
ScalarType, TensorShapeDynamism, Device), a typed registry of device
allocators, and fast host<->device clones through page-locked staging.
``import etptr`` needs neither CuPy nor a GPU; the CUDA allocator registers
itself on first use when CuPy and a device are present.
"""
try:
    from etptr._core import _error as _compiled_check  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on how etptr was installed
    import os as _os
    if _os.path.exists(_os.path.join(_os.path.dirname(__file__), "_core", "_error.pyx")):
        raise ImportError(
            f"etptr's compiled core is missing from {_os.path.dirname(__file__)}: this is an "
            "uncompiled source checkout shadowing the installed package (python -m, python -c "
            "and the interactive interpreter put the current folder first on sys.path). Run "
            "from another folder, use the pytest script instead of python -m pytest, or build "
            "in place with pip install -e ."
        ) from _exc
    raise
from etptr._core._error import (
    EtError,
    EtWarning,
    Error,
    InvalidArgumentError,
    InvalidStateError,
    InvalidTypeError,
    MemoryAllocationError,
    NotFoundError,
    NotSupportedError,
)
from etptr._core._scalar_type import (
    ScalarType,
    can_cast,
    element_size,
    scalar_type_from_numpy,
    scalar_type_to_numpy,
)
from etptr._core._device import Device, DeviceType
from etptr._core._device_allocator import (
    DEFAULT_ALIGNMENT,
    DeviceAllocator,
    DeviceAllocatorRegistry,
    get_device_allocator,
    register_device_allocator,
)
from etptr._core._tensor_ptr import TensorPtr, TensorShapeDynamism
from etptr._core._make_tensor_ptr import clone_tensor_ptr, make_tensor_ptr, resize_tensor_ptr
from etptr._core._device_copy import (
    clone_tensor_ptr_to,
    clone_tensor_ptr_to_cpu,
    clone_tensor_ptr_to_device,
    clone_tensor_ptrs_to,
    d2h_copy,
    h2d_copy,
)
from etptr._core._device_memory import DeviceMemoryBuffer
from etptr._core._interop import from_cuda_array_interface, from_dlpack
from etptr._core._tensor_ptr_maker import (
    TensorPtrMaker,
    empty,
    empty_like,
    empty_strided,
    for_blob,
    from_blob,
    full,
    full_like,
    full_strided,
    manual_seed,
    ones,
    ones_like,
    rand,
    rand_like,
    rand_strided,
    randint,
    randint_like,
    randint_strided,
    randn,
    randn_like,
    randn_strided,
    scalar_tensor,
    zeros,
    zeros_like,
)
from etptr.checkpoint import CheckpointError, load_safetensors, save_safetensors

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "DEFAULT_ALIGNMENT",
    "Device",
    "DeviceAllocator",
    "DeviceAllocatorRegistry",
    "DeviceMemoryBuffer",
    "DeviceType",
    "Error",
    "EtError",
    "EtWarning",
    "InvalidArgumentError",
    "InvalidStateError",
    "InvalidTypeError",
    "MemoryAllocationError",
    "NotFoundError",
    "NotSupportedError",
    "ScalarType",
    "TensorPtr",
    "TensorPtrMaker",
    "TensorShapeDynamism",
    "can_cast",
    "clone_tensor_ptr",
    "clone_tensor_ptr_to",
    "clone_tensor_ptr_to_cpu",
    "clone_tensor_ptr_to_device",
    "clone_tensor_ptrs_to",
    "d2h_copy",
    "element_size",
    "empty",
    "empty_like",
    "empty_strided",
    "for_blob",
    "from_blob",
    "from_cuda_array_interface",
    "from_dlpack",
    "full",
    "full_like",
    "full_strided",
    "get_device_allocator",
    "h2d_copy",
    "load_safetensors",
    "make_tensor_ptr",
    "manual_seed",
    "ones",
    "ones_like",
    "rand",
    "rand_like",
    "rand_strided",
    "randint",
    "randint_like",
    "randint_strided",
    "randn",
    "randn_like",
    "randn_strided",
    "register_device_allocator",
    "resize_tensor_ptr",
    "save_safetensors",
    "scalar_tensor",
    "scalar_type_from_numpy",
    "scalar_type_to_numpy",
    "zeros",
    "zeros_like",
]
