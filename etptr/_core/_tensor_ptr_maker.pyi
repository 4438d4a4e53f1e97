"""Type stubs for etptr._core._tensor_ptr_maker: the tensor_ptr_maker.h functions."""
from typing import Any, final

from typing_extensions import Buffer

from etptr._core._device import _DeviceLike
from etptr._core._make_tensor_ptr import make_tensor_ptr as make_tensor_ptr
from etptr._core._scalar_type import ScalarTypeLike
from etptr._core._tensor_ptr import TensorPtr, _Deleter, _DynamismLike, _Ints, _Number

_Blob = int | None | Buffer

@final
class TensorPtrMaker:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def type(self, type: ScalarTypeLike) -> TensorPtrMaker: ...
    def dim_order(self, dim_order: _Ints | None) -> TensorPtrMaker: ...
    def strides(self, strides: _Ints | None) -> TensorPtrMaker: ...
    def dynamism(self, dynamism: _DynamismLike) -> TensorPtrMaker: ...
    def deleter(self, deleter: _Deleter | None) -> TensorPtrMaker: ...
    def device(self, device: _DeviceLike) -> TensorPtrMaker: ...
    def make_tensor_ptr(self) -> TensorPtr: ...

def manual_seed(seed: int | None) -> None: ...
def for_blob(data: _Blob, sizes: _Ints, type: ScalarTypeLike = ...) -> TensorPtrMaker: ...
def from_blob(
    data: _Blob,
    sizes: _Ints,
    type: ScalarTypeLike = ...,
    *,
    dim_order: _Ints | None = None,
    strides: _Ints | None = None,
    dynamism: _DynamismLike = ...,
    deleter: _Deleter | None = None,
    device: _DeviceLike = "cpu",
) -> TensorPtr: ...
def empty(
    sizes: _Ints, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def empty_strided(
    sizes: _Ints, strides: _Ints | None, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def empty_like(
    other: TensorPtr, type: ScalarTypeLike | None = None, dynamism: _DynamismLike = ..., *,
    device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def full(
    sizes: _Ints, fill_value: _Number, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def full_strided(
    sizes: _Ints, strides: _Ints | None, fill_value: _Number, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def full_like(
    other: TensorPtr, fill_value: _Number, type: ScalarTypeLike | None = None,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def scalar_tensor(
    value: _Number, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def zeros(
    sizes: _Ints, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def zeros_like(
    other: TensorPtr, type: ScalarTypeLike | None = None, dynamism: _DynamismLike = ..., *,
    device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def ones(
    sizes: _Ints, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def ones_like(
    other: TensorPtr, type: ScalarTypeLike | None = None, dynamism: _DynamismLike = ..., *,
    device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def rand(
    sizes: _Ints, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def rand_strided(
    sizes: _Ints, strides: _Ints | None, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def rand_like(
    other: TensorPtr, type: ScalarTypeLike | None = None, dynamism: _DynamismLike = ..., *,
    device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def randn(
    sizes: _Ints, type: ScalarTypeLike = ..., dynamism: _DynamismLike = ..., *,
    device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def randn_strided(
    sizes: _Ints, strides: _Ints | None, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def randn_like(
    other: TensorPtr, type: ScalarTypeLike | None = None, dynamism: _DynamismLike = ..., *,
    device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
def randint(
    low: int, high: int, sizes: _Ints, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def randint_strided(
    low: int, high: int, sizes: _Ints, strides: _Ints | None, type: ScalarTypeLike = ...,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike = "cpu", pinned: bool = False,
) -> TensorPtr: ...
def randint_like(
    other: TensorPtr, low: int, high: int, type: ScalarTypeLike | None = None,
    dynamism: _DynamismLike = ..., *, device: _DeviceLike | None = None, pinned: bool = False,
) -> TensorPtr: ...
