"""How a load reads each byte range of a file: from the page cache, or straight from the
storage (``O_DIRECT``), decided by the pages actually resident.

A warm page cache gives its pages at memory speed; an uncached range read through the
cache crawls (the kernel reads ahead one window at a time, then copies) and fills the cache
with a checkpoint that is read once. So ``read="auto"`` asks the kernel which pages are
resident now (``mincore`` over a map of the range, which touches no page) and reads the
resident spans buffered and the others with ``O_DIRECT``, many reads in flight (the copy
threads), through the threads' aligned bounce buffers. Short uncached spans (under
MIN_DIRECT_BYTES) are read buffered: a direct read pays a whole request for them.
``"buffered"`` and ``"direct"`` force one way. A file system that refuses ``O_DIRECT``
(some network file systems; tmpfs before Linux 6.6) is read buffered.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import numpy as np

from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._format import FilePlan

__all__ = ["MIN_DIRECT_BYTES", "READ_MODES", "check_read", "direct_kw", "open_direct",
           "read_pieces", "split_pieces"]

#: How a load may read its files.
READ_MODES = ("auto", "buffered", "direct")
#: Uncached spans shorter than this are read through the page cache.
MIN_DIRECT_BYTES = 256 << 10

Piece = tuple[int, int, int]               # (file_offset, dst_offset, nbytes)


def check_read(read: object) -> str:
    """``read`` as one of READ_MODES.

    Raises
    ------
    CheckpointError
        Another value.
    """
    if isinstance(read, str) and read in READ_MODES:
        return read
    raise CheckpointError(f"read={read!r}: expected 'auto' (by the pages resident), "
                          f"'buffered' or 'direct'")


def open_direct(plan: FilePlan, opened: ReadOnlyFile) -> ReadOnlyFile | None:
    """The file opened with ``O_DIRECT`` beside ``opened`` (its checked, buffered
    descriptor: the direct one must be the same file), or None where its file system
    takes no direct reads.

    Raises
    ------
    CheckpointError
        The file cannot be opened, or the path names another file now.
    """
    try:
        f = ReadOnlyFile(plan.path, direct=True)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise CheckpointError(f"{plan.path}: cannot be opened ({exc.strerror or exc})") \
            from None
    a, b = os.fstat(f.fileno()), os.fstat(opened.fileno())
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        f.close()
        raise CheckpointError(f"{plan.path}: is another file since its header was read: the "
                              f"file changed")
    return f


def _spans(resident: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(first page, end page, resident)`` runs of ``resident`` (0/1 per page)."""
    if resident.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(resident)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [resident.size]))
    return [(int(a), int(b), bool(resident[a])) for a, b in zip(starts, ends)]


def split_pieces(file: ReadOnlyFile, pieces: Sequence[Piece],
                 mode: str) -> list[tuple[int, int, int, bool]]:
    """``pieces`` (in device order) as ``(file_offset, dst_offset, nbytes, direct)``: each
    cut where the page cache's residency changes (``mode="auto"``), or all one way."""
    if mode != "auto" or not pieces:
        return [(o, d, n, mode == "direct") for o, d, n in pieces]
    lo = min(o for o, _, _ in pieces)
    hi = max(o + n for o, _, n in pieces)
    first, page, vec = file.resident(lo, hi - lo)
    resident = np.frombuffer(vec, np.uint8)
    small = MIN_DIRECT_BYTES // page
    out = []
    for o, d, n in pieces:
        a = (o - first) // page
        b = (o + n - 1 - first) // page + 1
        at = o
        for pa, pb, warm in _spans(resident[a:b]):
            end = min(o + n, first + (a + pb) * page)
            direct = not warm and pb - pa >= small
            if out and out[-1][3] == direct and out[-1][0] + out[-1][2] == at and \
                    out[-1][1] + out[-1][2] == d + (at - o):
                prev = out[-1]
                out[-1] = (prev[0], prev[1], prev[2] + end - at, direct)
            else:
                out.append((at, d + (at - o), end - at, direct))
            at = end
    return out


def read_pieces(plan: FilePlan, opened: ReadOnlyFile, pieces: Sequence[Piece],
                mode: str) -> tuple[list[tuple[int, ...]], ReadOnlyFile | None]:
    """``pieces`` of the checked, open file marked for direct reads as ``mode`` decides
    (:func:`split_pieces`: ``(file_offset, dst_offset, nbytes, direct)``), and the direct
    descriptor they need; when no piece is marked, or the file system takes no direct
    reads, the plain ``(file_offset, dst_offset, nbytes)`` pieces and None. The caller
    closes the descriptor."""
    split = split_pieces(opened, pieces, mode)
    direct = open_direct(plan, opened) if any(p[3] for p in split) else None
    if direct is None:
        return [(o, d, n) for o, d, n, _ in split], None
    return list(split), direct


def direct_kw(direct: ReadOnlyFile | None) -> dict[str, int]:
    """The keyword that hands the direct descriptor to ``copy_file_to_device``: none when
    there is none (an allocator written before direct reads takes none)."""
    return {"direct_fd": direct.fileno()} if direct is not None else {}
