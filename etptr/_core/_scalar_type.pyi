"""Type stubs for etptr._core._scalar_type: ScalarType, element sizes, canCast, NumPy mapping."""
from typing import Any, Literal, TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from etptr._core._error import NamedIntEnum

class ScalarType(NamedIntEnum):
    Byte = 0
    Char = 1
    Short = 2
    Int = 3
    Long = 4
    Half = 5
    Float = 6
    Double = 7
    ComplexHalf = 8
    ComplexFloat = 9
    ComplexDouble = 10
    Bool = 11
    QInt8 = 12
    QUInt8 = 13
    QInt32 = 14
    BFloat16 = 15
    QUInt4x2 = 16
    QUInt2x4 = 17
    Bits1x8 = 18
    Bits2x4 = 19
    Bits4x2 = 20
    Bits8 = 21
    Bits16 = 22
    Float8_e5m2 = 23
    Float8_e4m3fn = 24
    Float8_e5m2fnuz = 25
    Float8_e4m3fnuz = 26
    UInt16 = 27
    UInt32 = 28
    UInt64 = 29

# The names a ``type=`` argument accepts (ScalarType member names).
ScalarTypeName: TypeAlias = Literal[
    "Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "ComplexHalf",
    "ComplexFloat", "ComplexDouble", "Bool", "QInt8", "QUInt8", "QInt32", "BFloat16",
    "QUInt4x2", "QUInt2x4", "Bits1x8", "Bits2x4", "Bits4x2", "Bits8", "Bits16",
    "Float8_e5m2", "Float8_e4m3fn", "Float8_e5m2fnuz", "Float8_e4m3fnuz", "UInt16",
    "UInt32", "UInt64",
]
# Everything accepted where a scalar type is: a ScalarType, its int code, its name
# ("BFloat16"), or a NumPy dtype or scalar type (np.dtype("int32"), np.float16,
# ml_dtypes.bfloat16).
ScalarTypeLike: TypeAlias = ScalarType | int | ScalarTypeName | np.dtype[Any] | type[np.generic]
_ScalarTypeLike: TypeAlias = ScalarTypeLike

def element_size(t: ScalarTypeLike) -> int: ...
def can_cast(from_t: ScalarTypeLike, to_t: ScalarTypeLike) -> bool: ...
def scalar_type_from_numpy(dtype: DTypeLike) -> ScalarType: ...
def scalar_type_to_numpy(t: ScalarTypeLike) -> np.dtype[Any]: ...
