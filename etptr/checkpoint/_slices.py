"""Which bytes of a tensor a slice needs: NumPy-style indexing turned into byte runs.

A tensor of a safetensors file lies in row-major order. An index (ints, slices with a
positive step, one ``...``) selects a box of it; the bytes of the box are runs of equal
length at computed offsets: one run when the box is a row-major block (a slice of the
leading dim, ``[a:b]``), one run per row for a column block (``[:, a:b]``), one per
element for steps in the last dim. The runs, read in order, are the slice's elements in
row-major order, so they can be read straight into the result: nothing else of the
tensor is read.

The indexing rules are NumPy's, which ``safetensors``' ``get_slice`` follows, with two
differences where that library fails: slice bounds past a dim's end clip as in NumPy
(``[5:]`` of a dim of 2 is empty; ``safetensors`` raises), and negative slice bounds count
from the end as in NumPy (``safetensors`` 0.8 raises OverflowError). Like ``safetensors``,
and unlike NumPy, ``None``, lists, arrays, booleans and negative steps are refused.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from etptr.checkpoint._errors import CheckpointError

__all__ = ["GATHER_RUN", "GATHER_STRIDE", "SliceRuns", "slice_runs"]

#: Runs shorter than GATHER_RUN bytes whose span averages at most GATHER_STRIDE bytes
#: a run are read as the span that holds them and gathered in memory: a read call costs
#: about what copying that many bytes costs (bench/results/DECISIONS.md, row
#: ``gathered slices``).
GATHER_STRIDE = 8 * 1024
GATHER_RUN = 4 * 1024


@dataclass(frozen=True)
class SliceRuns:
    """The bytes a slice reads.

    Attributes
    ----------
    shape : tuple of int
        The result's sizes (dims indexed by an int are dropped).
    offsets : numpy.ndarray of int64, one per run
        Byte offsets of the runs from the tensor's first byte, in the order their bytes
        go into the result.
    run_bytes : int
        Bytes of each run (0 when the result is empty).
    """

    shape: tuple[int, ...]
    offsets: npt.NDArray[np.int64]
    run_bytes: int
    grid: tuple[tuple[int, int], ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the result."""
        return int(self.offsets.size) * self.run_bytes

    @property
    def span(self) -> int:
        """Bytes from the first run's start to the last run's end (0 when empty)."""
        if not self.offsets.size or not self.run_bytes:
            return 0
        return int(self.offsets[-1] - self.offsets[0]) + self.run_bytes

    @property
    def gathered(self) -> bool:
        """Whether the runs are read as their span and gathered in memory: many runs
        shorter than GATHER_RUN bytes whose span averages at most GATHER_STRIDE bytes a
        run."""
        n = int(self.offsets.size)
        return (n > 1 and 0 < self.run_bytes < GATHER_RUN
                and self.span <= GATHER_STRIDE * n)

    def chunks(self, max_span: int) -> list[tuple[int, int]]:
        """``(first, stop)`` run numbers of consecutive groups of runs along the grid's
        outermost dim, each spanning at most ``max_span`` bytes of the file (a group
        of one outer step at least)."""
        count, step = self.grid[0]
        inner = int(self.offsets.size) // count
        per = max(1, (max_span - (self.span - (count - 1) * step)) // step + 1) if step else count
        return [(i * inner, min(count, i + per) * inner) for i in range(0, count, per)]

    def gather(self, span: np.ndarray, first: int, stop: int) -> np.ndarray:
        """A strided view of ``span`` (the file's bytes from run ``first``'s start) that
        holds runs ``first .. stop - 1`` in the result's order, shaped
        ``(outer counts..., run_bytes)``; ``first`` and ``stop`` from :meth:`chunks`."""
        counts = [c for c, _ in self.grid]
        counts[0] = (stop - first) // (int(self.offsets.size) // counts[0])
        strides = [st for _, st in self.grid]
        extent = sum((c - 1) * st for c, st in zip(counts, strides)) + self.run_bytes
        if extent > span.size:          # as_strided does not check: never read past it
            raise ValueError(f"runs {first}..{stop} span {extent} bytes; {span.size} given")
        return np.lib.stride_tricks.as_strided(span, shape=(*counts, self.run_bytes),
                                               strides=(*strides, 1), writeable=False)


def _dims(index: Any, shape: tuple[int, ...], name: str) -> list[tuple[int, int, int, bool]]:
    """``(start, count, step, kept)`` per dim of ``shape`` for ``index``."""
    items = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise CheckpointError(f"tensor {name!r}: an index may hold one '...' only")
    explicit = sum(1 for i in items if i is not Ellipsis)
    if explicit > len(shape):
        raise CheckpointError(f"tensor {name!r}: {explicit} indices for a tensor of "
                              f"{len(shape)} dims (shape {list(shape)})")
    expanded: list[Any] = []
    for i in items:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - explicit))
        else:
            expanded.append(i)
    expanded.extend([slice(None)] * (len(shape) - len(expanded)))
    out = []
    for dim, (i, d) in enumerate(zip(expanded, shape)):
        if isinstance(i, slice):
            try:
                start, stop, step = i.indices(d)
            except TypeError:
                raise CheckpointError(f"tensor {name!r}: dim {dim}: slice {i!r} is not made of "
                                      f"ints") from None
            if step <= 0:
                raise CheckpointError(f"tensor {name!r}: dim {dim}: step {step} of {i!r}; "
                                      f"slices read with positive steps only")
            count = len(range(start, stop, step))
            # one element or none: the step moves nowhere (a step past the dim's size
            # would only overflow the byte offsets)
            out.append((start, count, step if count > 1 else 1, True))
            continue
        if isinstance(i, (bool, np.bool_)) or i is None:
            raise CheckpointError(f"tensor {name!r}: dim {dim}: index {i!r} is not supported "
                                  f"(ints, slices and one '...')")
        try:
            k = operator.index(i)
        except TypeError:
            raise CheckpointError(f"tensor {name!r}: dim {dim}: index {i!r:.60} is not "
                                  f"supported (ints, slices and one '...')") from None
        if not -d <= k < d:
            raise CheckpointError(f"tensor {name!r}: dim {dim}: index {k} is out of range for "
                                  f"size {d}")
        out.append((k % d, 1, 1, False))
    return out


def slice_runs(index: Any, shape: tuple[int, ...], element_size: int, name: str) -> SliceRuns:
    """The runs of bytes that ``tensor[index]`` reads from a row-major tensor of ``shape``
    with elements of ``element_size`` bytes; ``name`` is the tensor's, for messages.

    Raises
    ------
    CheckpointError
        An index that is not ints, slices with positive steps and one ``...``, an int out
        of range, more indices than dims.
    """
    dims = _dims(index, shape, name)
    result = tuple(count for _, count, _, kept in dims if kept)
    if any(count == 0 for _, count, _, _ in dims):
        return SliceRuns(result, np.zeros(0, np.int64), 0)
    strides = [element_size] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    # the innermost dims taken whole form one block; the dim before them sets the runs
    k = len(shape) - 1
    while k >= 0 and dims[k][0] == 0 and dims[k][1] == shape[k] and dims[k][2] == 1:
        k -= 1
    if k < 0:
        total = element_size * int(np.prod(shape, dtype=np.int64)) if shape else element_size
        return SliceRuns(result, np.zeros(1, np.int64), total, ((1, 0),))
    start_k, count_k, step_k, _ = dims[k]
    if step_k == 1:
        run_bytes = count_k * strides[k]
        outer = range(k)
    else:
        run_bytes = strides[k]
        outer = range(k + 1)
    offsets = np.zeros(1, np.int64)
    grid = []
    for i in outer:
        start, count, step, _ = dims[i]
        if count == 1:                  # a fixed offset, not a dim of the grid (whose
            offsets += start * strides[i]   # first dim is the one spans are cut along)
            continue
        picks = (start + step * np.arange(count, dtype=np.int64)) * strides[i]
        offsets = np.add.outer(offsets, picks).reshape(-1)
        grid.append((count, step * strides[i]))
    if step_k == 1:
        offsets += start_k * strides[k]
    return SliceRuns(result, offsets, run_bytes, tuple(grid) or ((1, 0),))
