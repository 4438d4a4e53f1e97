"""Type stubs for etptr._core._make_tensor_ptr: the make_tensor_ptr overloads, clone, resize."""
from collections.abc import Sequence
from typing import Any, final, overload

import numpy.typing as npt
from typing_extensions import Buffer

from etptr._core._device import _DeviceLike
from etptr._core._scalar_type import _ScalarTypeLike
from etptr._core._tensor_ptr import TensorPtr, _Deleter, _DynamismLike, _Ints, _Number

@overload
def make_tensor_ptr(
    sizes: TensorPtr,
    data: _Ints | None = None,
    /,
    *,
    dim_order: _Ints | None = None,
    strides: _Ints | None = None,
    deleter: _Deleter | None = None,
    device: _DeviceLike | None = None,
) -> TensorPtr: ...
@overload
def make_tensor_ptr(
    sizes: npt.NDArray[Any] | Sequence[_Number] | _Number,
    /,
    *,
    type: _ScalarTypeLike | None = None,
    dynamism: _DynamismLike = ...,
    device: _DeviceLike = "cpu",
) -> TensorPtr: ...
@overload
def make_tensor_ptr(
    sizes: _Ints,
    data: int | None | bytes | Sequence[_Number] | Buffer,
    dim_order: _Ints | None = None,
    strides: _Ints | None = None,
    type: _ScalarTypeLike | None = None,
    dynamism: _DynamismLike = ...,
    deleter: _Deleter | None = None,
    device: _DeviceLike = "cpu",
) -> TensorPtr: ...
def clone_tensor_ptr(tensor: TensorPtr, type: _ScalarTypeLike | None = None) -> TensorPtr: ...
def resize_tensor_ptr(tensor: TensorPtr, sizes: _Ints) -> None: ...

@final
class _Bytes:
    def __buffer__(self, flags: int, /) -> memoryview: ...
