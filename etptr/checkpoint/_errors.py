"""The exception a malformed or unreadable checkpoint raises."""
from __future__ import annotations

from etptr._core._error import Error, EtError

__all__ = ["CheckpointError"]


class CheckpointError(EtError, ValueError):
    """A checkpoint file, index or argument that cannot be read or written
    (``Error.InvalidExternalData``).

    The message names the file and, where one is at fault, the tensor. It
    subclasses :class:`ValueError` as well as :class:`~etptr.EtError`, and
    pickles like every etptr exception.

    Attributes
    ----------
    error : Error
        Always ``Error.InvalidExternalData`` unless another code is given.
    """

    default_error = Error.InvalidExternalData


# Public as etptr.CheckpointError: tracebacks and pickles name it there.
CheckpointError.__module__ = "etptr"
