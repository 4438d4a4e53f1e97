"""Type stubs for etptr._core._device_copy: host<->device copies of tensors."""
from etptr._core._device import _DeviceLike
from etptr._core._tensor_ptr import TensorPtr

def clone_tensor_ptr_to(
    tensor: TensorPtr, device: _DeviceLike, *, stream: object = None, pinned: bool = True
) -> TensorPtr: ...
def clone_tensor_ptr_to_device(
    tensor: TensorPtr, device: _DeviceLike = "cuda", device_index: int | None = None
) -> TensorPtr: ...
def clone_tensor_ptr_to_cpu(tensor: TensorPtr) -> TensorPtr: ...
