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
from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._format import FilePlan, TensorEntry, file_identity

__all__ = ["READ_THREADS", "check_unchanged", "host_view", "map_file", "open_checked"]

#: Copy threads a load reads a file's bytes with (parallel_read).
READ_THREADS = min(16, os.cpu_count() or 1)

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


def open_checked(plan: FilePlan) -> ReadOnlyFile:
    """The file opened read-only, after checking that it is still the file whose header
    was read (a regular file of the same size and
    :func:`~etptr.checkpoint._format.file_identity`). The caller closes it (``with``);
    it closes itself when dropped.

    Raises
    ------
    CheckpointError
        The file cannot be opened, or it changed since its header was read.
    """
    try:
        f = ReadOnlyFile(plan.path)
    except OSError as exc:
        raise CheckpointError(f"{plan.path}: cannot be opened ({exc.strerror or exc})") from None
    why = _difference(plan, os.fstat(f.fileno()))
    if why is not None:
        f.close()
        raise CheckpointError(f"{plan.path}: {why}: the file changed")
    return f


def check_unchanged(plan: FilePlan, f: ReadOnlyFile) -> None:
    """After reading: the open file is still the one :func:`open_checked` accepted
    (size and identity, its modification and status-change times included), so the
    bytes read are that file's.

    Raises
    ------
    CheckpointError
        It was written to or truncated while it was read.
    """
    why = _difference(plan, os.fstat(f.fileno()))
    if why is not None:
        raise CheckpointError(f"{plan.path}: was written to while it was read ({why}): the "
                              f"file changed while loading")


def map_file(plan: FilePlan) -> memoryview | None:
    """A read-only memoryview of the whole file, mapped privately (copy-on-write: a
    write through a view that ignores the read-only flag changes neither the file nor
    anyone else's memory, and cannot fault); None when the plan's tensors hold no bytes
    (nothing needs mapping).

    Raises
    ------
    CheckpointError
        The file cannot be opened or mapped, or it changed since its header
        was read (see :func:`open_checked`).
    """
    if not any(t.nbytes for t in plan.tensors):
        return None
    with open_checked(plan) as f:
        try:
            # private and copy-on-write: the views are read-only, but a consumer that
            # ignores that (torch.from_dlpack does) writes into private pages, never into
            # the file, instead of faulting on a read-only map
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as exc:
            raise CheckpointError(f"{plan.path}: cannot be mapped ({exc.strerror or exc})") \
                from None
    return memoryview(mm).toreadonly()


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
