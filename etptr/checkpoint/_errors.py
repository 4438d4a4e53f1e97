"""The exception a malformed or unreadable checkpoint raises."""
from __future__ import annotations

import errno
import os

from etptr._core._error import Error, EtError

__all__ = ["CheckpointError", "CheckpointFileNotFoundError"]


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


class CheckpointFileNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file, shard or index that does not exist: a :class:`CheckpointError`
    that ``except FileNotFoundError`` catches too (``errno`` is ENOENT, ``filename`` the
    path)."""

    def __init__(self, message="", error=None, filename=None):
        super().__init__(message, error)
        self.errno = errno.ENOENT
        self.strerror = os.strerror(errno.ENOENT)
        self.filename = filename

    def __reduce__(self):
        return (type(self), (str(self), self.error, self.filename))

    def __str__(self):
        return str(self.args[0]) if self.args else ""


# Public as etptr.CheckpointError: tracebacks and pickles name it there.
CheckpointError.__module__ = "etptr"
CheckpointFileNotFoundError.__module__ = "etptr.checkpoint"
