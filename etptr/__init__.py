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
    from etptr._core import _missing_core_message
    _message = _missing_core_message(__file__)
    if _message is None:
        raise
    raise ImportError(_message) from _exc
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
from etptr.checkpoint import CheckpointError, load_safetensors, safe_open, save_safetensors

def _version() -> str:
    # The installed distribution's version; an in-place build (no metadata) reads the
    # pyproject.toml beside the package.
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("etptr")
    except PackageNotFoundError:
        import re
        from pathlib import Path
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', pyproject.read_text())
        except OSError:
            found = None
        return found.group(1) if found else "0+unknown"


__version__: str          # (declared for type checkers; set by __getattr__ on first use)


def __getattr__(name: str) -> str:
    # __version__ is read on first use: importlib.metadata costs a new process tens of
    # milliseconds that a load should not pay
    if name == "__version__":
        value = _version()
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'etptr' has no attribute {name!r}")

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
    "safe_open",
    "save_safetensors",
    "scalar_tensor",
    "scalar_type_from_numpy",
    "scalar_type_to_numpy",
    "zeros",
    "zeros_like",
]
