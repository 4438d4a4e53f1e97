"""Type stubs for etptr._core._error: ExecuTorch error codes and the exception tree."""
from enum import IntEnum
from typing import ClassVar

# A base for enums, with no members of its own (as enum.IntEnum has none).
class NamedIntEnum(IntEnum):  # type: ignore[misc]
    def __format__(self, format_spec: str) -> str: ...

class Error(NamedIntEnum):
    Ok = 0
    Internal = 1
    InvalidState = 2
    EndOfMethod = 3
    AlreadyLoaded = 4
    NotSupported = 16
    NotImplemented = 17
    InvalidArgument = 18
    InvalidType = 19
    OperatorMissing = 20
    RegistrationExceedingMaxKernels = 21
    RegistrationAlreadyRegistered = 22
    NotFound = 32
    MemoryAllocationFailed = 33
    AccessFailed = 34
    InvalidProgram = 35
    InvalidExternalData = 36
    OutOfResources = 37
    DelegateInvalidCompatibility = 48
    DelegateMemoryAllocationFailed = 49
    DelegateInvalidHandle = 50

class EtError(RuntimeError):
    default_error: ClassVar[Error]
    error: Error
    def __init__(self, message: str = "", error: Error | int | None = None) -> None: ...
    def __reduce__(self) -> tuple[type[EtError], tuple[str, Error]]: ...

class InvalidArgumentError(EtError, ValueError): ...
class InvalidTypeError(EtError, TypeError): ...
class NotSupportedError(EtError, NotImplementedError): ...
class MemoryAllocationError(EtError, MemoryError): ...
class NotFoundError(EtError, LookupError): ...
class InvalidStateError(EtError): ...
class EtWarning(RuntimeWarning): ...

def error_class(code: Error | int) -> type[EtError]: ...
