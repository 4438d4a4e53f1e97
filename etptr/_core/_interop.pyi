"""Type stubs for etptr._core._interop: DLPack and CUDA Array Interface import."""
from collections.abc import Mapping
from typing import Any, Protocol

from typing_extensions import CapsuleType

from etptr._core._device import _DeviceLike
from etptr._core._tensor_ptr import TensorPtr

class _SupportsDLPack(Protocol):
    def __dlpack__(self) -> object: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class _SupportsCudaArrayInterface(Protocol):
    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...

def from_dlpack(
    obj: _SupportsDLPack | CapsuleType,
    *,
    device: _DeviceLike | None = None,
    copy: bool | None = None,
) -> TensorPtr: ...
def from_cuda_array_interface(
    obj: _SupportsCudaArrayInterface, *, device: _DeviceLike | None = None
) -> TensorPtr: ...
