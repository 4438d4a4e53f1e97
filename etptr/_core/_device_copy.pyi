"""Type stubs for etptr._core._device_copy: host<->device copies of tensors."""
from collections.abc import Sequence
from typing import TypeVar, final, overload
from etptr._core._device import _DeviceLike
from etptr._core._tensor_ptr import TensorPtr

def clone_tensor_ptr_to(
    tensor: TensorPtr, device: _DeviceLike, *, stream: object = None, pinned: bool = True
) -> TensorPtr: ...
def clone_tensor_ptr_to_device(
    tensor: TensorPtr, device: _DeviceLike = "cuda", device_index: int | None = None
) -> TensorPtr: ...
def clone_tensor_ptr_to_cpu(tensor: TensorPtr) -> TensorPtr: ...

_Out = TypeVar("_Out", bound=TensorPtr)

def clone_tensor_ptrs_to(
    tensors: Sequence[TensorPtr], device: _DeviceLike, *, stream: object = None,
    pinned: bool = True,
) -> list[TensorPtr]: ...
@overload
def h2d_copy(src: TensorPtr, out: _Out, *, stream: object = None) -> _Out: ...
@overload
def h2d_copy(
    src: Sequence[TensorPtr], out: Sequence[TensorPtr], *, stream: object = None
) -> list[TensorPtr]: ...
@overload
def d2h_copy(src: TensorPtr, out: _Out, *, stream: object = None) -> _Out: ...
@overload
def d2h_copy(
    src: Sequence[TensorPtr], out: Sequence[TensorPtr], *, stream: object = None
) -> list[TensorPtr]: ...

@final
class _Pieces: ...
