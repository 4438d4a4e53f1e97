"""ExecuTorch's ``runtime::Error`` codes and the etptr exception tree.

Every failure raises a subclass of :class:`EtError` whose ``.error`` is an
:class:`Error`. Argument problems also subclass the builtin a Python user
expects (``ValueError``, ``TypeError``, ...). One table maps each code to its
class; codes without a dedicated class raise plain :class:`EtError`.
"""
from enum import IntEnum


class Error(IntEnum):
    """ExecuTorch ``runtime::Error`` codes (``runtime/core/error.h``)."""
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
    """Base class of every etptr exception.

    Attributes
    ----------
    error : Error
        The ExecuTorch error code this exception carries.
    """
    default_error = Error.Internal

    def __init__(self, message="", error=None):
        super().__init__(message)
        self.error = Error(self.default_error if error is None else error)

    def __reduce__(self):
        return (type(self), (str(self), self.error))


class InvalidArgumentError(EtError, ValueError):
    """An argument has a bad value (``Error.InvalidArgument``)."""
    default_error = Error.InvalidArgument


class InvalidTypeError(EtError, TypeError):
    """A scalar type or Python type is refused (``Error.InvalidType``)."""
    default_error = Error.InvalidType


class NotSupportedError(EtError, NotImplementedError):
    """The operation is not supported for these inputs (``Error.NotSupported``)."""
    default_error = Error.NotSupported


class MemoryAllocationError(EtError, MemoryError):
    """Host or device memory could not be allocated (``Error.MemoryAllocationFailed``)."""
    default_error = Error.MemoryAllocationFailed


class NotFoundError(EtError, LookupError):
    """Something looked up is not there, e.g. no allocator for a device type (``Error.NotFound``)."""
    default_error = Error.NotFound


class InvalidStateError(EtError):
    """The operation is not valid in the current state (``Error.InvalidState``)."""
    default_error = Error.InvalidState


class EtWarning(RuntimeWarning):
    """Issued when a failure cannot be raised, e.g. a deleter failing during teardown."""


_ERROR_CLASSES = {
    Error.InvalidArgument: InvalidArgumentError,
    Error.InvalidType: InvalidTypeError,
    Error.NotSupported: NotSupportedError,
    Error.NotImplemented: NotSupportedError,
    Error.MemoryAllocationFailed: MemoryAllocationError,
    Error.NotFound: NotFoundError,
    Error.InvalidState: InvalidStateError,
}


# Public under etptr: tracebacks and pickles name etptr.InvalidArgumentError, not the core module.
for _cls in (Error, EtError, InvalidArgumentError, InvalidTypeError, NotSupportedError,
             MemoryAllocationError, NotFoundError, InvalidStateError, EtWarning):
    _cls.__module__ = "etptr"


def error_class(code):
    """The exception class raised for ``code`` (an :class:`Error` or int)."""
    return _ERROR_CLASSES.get(Error(code), EtError)


cdef int raise_error(int code, str message) except -1:
    raise _ERROR_CLASSES.get(code, EtError)(message, Error(code))
