"""Read-only maps of checkpoint files, and tensors that view them.

One ``mmap`` per file, read-only; a tensor made here aliases the mapped
pages (no copy) and keeps the map alive, so the file's memory stays mapped
(and the map holds one file descriptor) for as long as any of its tensors
lives.
"""
from __future__ import annotations

import mmap
import os
import stat
from typing import Any

import numpy as np

from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._format import FilePlan, TensorEntry, file_identity

__all__ = ["check_unchanged", "host_view", "map_file", "open_checked"]

# What zero-size tensors alias: a valid, read-only, empty buffer.
_EMPTY = np.empty(0, dtype=np.uint8)
_EMPTY.flags.writeable = False


def _difference(plan: FilePlan, st: os.stat_result) -> str | None:
    """How the file ``st`` describes differs from the one whose header was read, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file now (it was when its header was read)"
    if st.st_size != plan.file_size:
        return f"is {st.st_size} bytes now, {plan.file_size} when its header was read"
    if plan.identity is not None and file_identity(st) != plan.identity:
        # e.g. a save renamed a new file of the same size over the path: its data
        # would be read with the old file's header
        return "is another file (or was rewritten) since its header was read"
    return None


def open_checked(plan: FilePlan) -> int:
    """A read-only file descriptor of the file, after checking that it is still the
    file whose header was read (a regular file of the same size and
    :func:`~etptr.checkpoint._format.file_identity`). The caller closes it.

    Raises
    ------
    CheckpointError
        The file cannot be opened, or it changed since its header was read.
    """
    try:
        # O_NONBLOCK: a path that became a FIFO meanwhile must not block the open
        fd = os.open(plan.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise CheckpointError(f"{plan.path}: cannot be opened ({exc.strerror or exc})") from None
    try:
        why = _difference(plan, os.fstat(fd))
        if why is not None:
            raise CheckpointError(f"{plan.path}: {why}: the file changed")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_unchanged(plan: FilePlan, fd: int) -> None:
    """After reading: the open file is still the one :func:`open_checked` accepted
    (size and identity, its modification and status-change times included), so the
    bytes read are that file's.

    Raises
    ------
    CheckpointError
        It was written to or truncated while it was read.
    """
    why = _difference(plan, os.fstat(fd))
    if why is not None:
        raise CheckpointError(f"{plan.path}: was written to while it was read ({why}): the "
                              f"file changed while loading")


def map_file(plan: FilePlan) -> memoryview | None:
    """A read-only memoryview of the whole file, mapped; None when the plan's
    tensors hold no bytes (nothing needs mapping).

    Raises
    ------
    CheckpointError
        The file cannot be opened or mapped, or it changed since its header
        was read (see :func:`open_checked`).
    """
    if not any(t.nbytes for t in plan.tensors):
        return None
    fd = open_checked(plan)
    try:
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise CheckpointError(f"{plan.path}: cannot be mapped ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return memoryview(mm)


def host_view(plan: FilePlan, entry: TensorEntry, mapped: memoryview | None) -> TensorPtr:
    """A read-only CPU tensor viewing ``entry``'s bytes in the mapped file,
    with the header's shape and ScalarType; it keeps the map alive.

    Parameters
    ----------
    plan : FilePlan
    entry : TensorEntry, one of ``plan.tensors``
    mapped : memoryview from :func:`map_file`; may be None when
        ``entry.nbytes == 0``.
    """
    if entry.nbytes == 0 or mapped is None:
        data: Any = _EMPTY
    else:
        start = plan.data_offset + entry.begin
        data = mapped[start:start + entry.nbytes]
    return make_tensor_ptr(list(entry.shape), data, type=entry.scalar_type)
