"""Type stubs for etptr._core._device_memory: DeviceMemoryBuffer."""
from collections.abc import Iterable
from typing import Any, Literal, final

from typing_extensions import Self

from etptr._core._device import Device, _DeviceLike
from etptr._core._device_allocator import DeviceAllocator
from etptr._core._scalar_type import _ScalarTypeLike
from etptr._core._tensor_ptr import TensorPtr, _DynamismLike, _Ints

@final
class DeviceMemoryBuffer:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    @staticmethod
    def create(
        nbytes: int, device: _DeviceLike = "cuda", *, alignment: int = 8, stream: object = None
    ) -> DeviceMemoryBuffer: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> Device: ...
    @property
    def allocator(self) -> DeviceAllocator: ...
    @property
    def closed(self) -> bool: ...
    def tensor(
        self,
        offset: int,
        sizes: _Ints,
        type: _ScalarTypeLike = ...,
        *,
        dim_order: _Ints | None = None,
        strides: _Ints | None = None,
        dynamism: _DynamismLike = ...,
    ) -> TensorPtr: ...
    def _views(
        self, offsets: Iterable[int], shapes: Iterable[_Ints], types: Iterable[_ScalarTypeLike]
    ) -> list[TensorPtr]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...
