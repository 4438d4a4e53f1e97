"""ExecuTorch's ``runtime::Error`` codes and the etptr exception tree.

Every failure raises a subclass of :class:`EtError` whose ``.error`` is an
:class:`Error`. Argument problems also subclass the builtin a Python user
expects (``ValueError``, ``TypeError``, ...). One table maps each code to its
class; codes without a dedicated class raise plain :class:`EtError`.
"""
from enum import IntEnum

# format() specs that ask for a number: they format the code, as for an int.
_NUMERIC_FORMATS = frozenset("bcdoxXneEfFgG%")


class NamedIntEnum(IntEnum):
    """An ``IntEnum`` whose ``str()`` and ``format()`` give the member's name.

    The base of etptr's ExecuTorch enums (``ScalarType``, ``DeviceType``,
    ``TensorShapeDynamism``, ``Error``): ``str(ScalarType.Float)`` is
    ``"Float"``, as ExecuTorch's ``toString(ScalarType)`` spells it, where a
    plain ``IntEnum`` gives ``"6"`` (or ``"ScalarType.Float"`` before Python
    3.11). Members still compare, hash and convert as their int codes.

    Notes
    -----
    A format spec that asks for a number (one ending in ``b c d o x X n e E f F
    g G %``, e.g. ``f"{t:d}"``, ``f"{t:02x}"``) formats the code; any other spec
    (``""``, ``">10"``) formats the name.

    Examples
    --------
    >>> from etptr import ScalarType
    >>> str(ScalarType.Float), f"{ScalarType.Half}", f"{ScalarType.Half:d}"
    ('Float', 'Half', '5')
    """

    def __str__(self):
        return self._name_

    def __format__(self, format_spec):
        if format_spec and format_spec[-1] in _NUMERIC_FORMATS:
            return int.__format__(self._value_, format_spec)
        return str.__format__(self._name_, format_spec)


class Error(NamedIntEnum):
    """ExecuTorch ``runtime::Error`` codes (``runtime/core/error.h``).

    ``str(Error.NotFound)`` is the enumerator's name, ``"NotFound"`` (ExecuTorch's
    ``to_string`` spells it ``"Error::NotFound"``).
    """
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
