"""Where each tensor of one file goes in one device buffer, and the copies that fill it.

Device kernels want every tensor to start at a multiple of 256 bytes (what
CUDA allocations guarantee, and more than any element size needs). A
safetensors file packs its tensors back to back, so a tensor keeps its file
neighbour's distance only when that distance is already a multiple of the
alignment. The layout walks the tensors in file order: a tensor that follows
the previous one in the file *and* lands on an aligned buffer offset extends
the current copy run; any other starts a new run at the next aligned offset.
A whole file of 256-byte multiples is therefore one copy.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from etptr._core._device_allocator import DEVICE_ALIGNMENT
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._format import FilePlan, TensorEntry

__all__ = ["DEVICE_ALIGNMENT", "CopyRun", "FileLayout", "layout_file"]



@dataclass(frozen=True)
class CopyRun:
    """One contiguous copy from the file into the buffer.

    Attributes
    ----------
    file_offset : int
        Bytes from the start of the file (not of the data section).
    buffer_offset : int
        Bytes from the start of the buffer.
    nbytes : int
        Bytes to copy; always > 0.
    """

    file_offset: int
    buffer_offset: int
    nbytes: int


@dataclass(frozen=True)
class FileLayout:
    """The buffer layout of one file's tensors.

    Attributes
    ----------
    names : tuple of str
        The tensors, in file order (that of ``FilePlan.tensors``).
    offsets : tuple of int
        ``offsets[i]``: the buffer offset of ``names[i]`` in bytes, a multiple
        of ``alignment``; non-decreasing; at most ``nbytes``.
    runs : tuple of CopyRun
        In increasing file and buffer order; together they cover exactly the
        tensors' bytes, each byte once.
    nbytes : int
        The buffer size in bytes (0 when no tensor holds bytes).
    alignment : int
        Bytes, a power of two.
    """

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    runs: tuple[CopyRun, ...]
    nbytes: int
    alignment: int


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) & ~(alignment - 1)


def layout_tensors(tensors: Sequence[TensorEntry], data_offset: int,
                   alignment: int = DEVICE_ALIGNMENT) -> FileLayout:
    """The layout of ``tensors`` (in file order) of a file whose data section
    starts at ``data_offset``; see :func:`layout_file`.
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise CheckpointError(f"alignment={alignment!r} is not a positive power of two")
    offsets: list[int] = []
    runs: list[CopyRun] = []
    cursor = 0                 # first free buffer byte
    file_end = -1              # data-section offset where the current run ends in the file
    run_file = run_buf = 0     # where the current run starts (data-section and buffer offsets)
    prev_begin = -1
    for t in tensors:
        if t.begin < prev_begin:
            raise CheckpointError(f"tensor {t.name!r}: tensors are not in file order")
        prev_begin = t.begin
        if t.begin == t.end:
            # no bytes: an aligned offset inside what is laid out so far, no copy
            offsets.append(cursor & ~(alignment - 1))
            continue
        if t.begin == file_end and cursor % alignment == 0:
            dest = cursor                        # follows in the file and stays aligned
        else:
            if file_end > run_file:
                runs.append(CopyRun(data_offset + run_file, run_buf, file_end - run_file))
            dest = _align_up(cursor, alignment)
            run_file, run_buf = t.begin, dest
        offsets.append(dest)
        cursor = dest + t.nbytes
        file_end = t.end
    if file_end > run_file:
        runs.append(CopyRun(data_offset + run_file, run_buf, file_end - run_file))
    return FileLayout(tuple(t.name for t in tensors), tuple(offsets), tuple(runs), cursor,
                      alignment)


def layout_file(plan: FilePlan, alignment: int = DEVICE_ALIGNMENT) -> FileLayout:
    """Lay out one file's tensors in one buffer, each at an aligned offset.

    Tensors keep file order. A tensor that directly follows the previous one
    in the file and whose buffer offset would already be aligned stays
    adjacent to it, so the two share one copy run; otherwise it starts at the
    next multiple of ``alignment`` and a new run. A zero-size tensor gets an
    aligned offset no greater than the buffer size, and no bytes.

    Parameters
    ----------
    plan : FilePlan
        A file's plan (possibly a subset of its tensors, from
        ``CheckpointPlan.select``; tensors not in it are not copied).
    alignment : int, bytes, power of two
        256 by default (``DEVICE_ALIGNMENT``).

    Returns
    -------
    FileLayout
        Buffer offsets per tensor, the copy runs (file range -> buffer range)
        and the buffer size in bytes.

    Raises
    ------
    CheckpointError
        ``alignment`` is not a positive power of two.
    """
    return layout_tensors(plan.tensors, plan.data_offset, alignment)
