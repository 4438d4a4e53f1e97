"""Type stubs for etptr._core._tensor_ptr: TensorPtr and TensorShapeDynamism."""
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, SupportsIndex, TypeAlias, TypedDict, final, overload

import numpy as np
import numpy.typing as npt
from typing_extensions import CapsuleType

from etptr._core._device import Device, _DeviceLike
from etptr._core._error import NamedIntEnum
from etptr._core._scalar_type import ScalarType, _ScalarTypeLike

class TensorShapeDynamism(NamedIntEnum):
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2

# sizes / dim_order / strides: a sequence of ints (or a 1-D integer array), at most 16 entries
_Ints: TypeAlias = Sequence[SupportsIndex] | npt.NDArray[np.integer[Any]]
_DynamismLike: TypeAlias = TensorShapeDynamism | int
_Deleter: TypeAlias = Callable[[int], object]
# a real number as the list overload and the fill makers take it
_Number: TypeAlias = bool | int | float | np.bool_ | np.integer[Any] | np.floating[Any]

class CudaArrayInterface(TypedDict):
    """``__cuda_array_interface__`` (version 3) of a CUDA TensorPtr; strides in bytes."""

    shape: tuple[int, ...]
    typestr: str
    data: tuple[int, bool]
    strides: tuple[int, ...] | None
    version: int
    stream: int | None

@final
class TensorPtr:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    @property
    def sizes(self) -> tuple[int, ...]: ...
    @property
    def dim_order(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def scalar_type(self) -> ScalarType: ...
    @property
    def shape_dynamism(self) -> TensorShapeDynamism: ...
    @property
    def device(self) -> Device: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    def dim(self) -> int: ...
    def numel(self) -> int: ...
    def element_size(self) -> int: ...
    def size(self, d: SupportsIndex) -> int: ...
    def numpy(self) -> npt.NDArray[Any]: ...
    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]: ...
    @property
    def __cuda_array_interface__(self) -> CudaArrayInterface: ...
    def __dlpack__(
        self,
        *,
        stream: int | Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> NoReturn: ...
    def __copy__(self) -> NoReturn: ...
    def __deepcopy__(self, memo: object) -> NoReturn: ...
