"""``safe_open``: a checkpoint opened for reading, tensor by tensor or slice by slice, as
the ``safetensors`` library's ``safe_open`` opens one.

Every header is read and checked when the handle is made; nothing of the data is read
until a tensor is asked for. A slice reads only the bytes it needs
(:mod:`~etptr.checkpoint._slices`): the copy threads read them from the file straight
into the result's memory, on a device through the allocator's
:meth:`~etptr.DeviceAllocator.copy_file_to_device` (the pinned slots, for CUDA). Many
slices asked for at once (:meth:`SafeOpen.get_slices`, a tensor-parallel rank's share of
every weight) move as one copy per file.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from etptr._core._device import Device, DeviceType
from etptr._core._device_allocator import DEVICE_ALIGNMENT
from etptr._core._device_copy import h2d_copy
from etptr._core._device_memory import DeviceMemoryBuffer
from etptr._core._host_copy import parallel_read
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType, element_size
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._file import (
    READ_THREADS, check_unchanged, host_view, map_file, open_checked)
from etptr.checkpoint._format import DTYPE_NAMES, FilePlan, TensorEntry
from etptr.checkpoint._frameworks import check_framework, to_framework
from etptr.checkpoint._load import _device_arg
from etptr.checkpoint._plan import PathsLike, read_plan
from etptr.checkpoint._slices import SliceRuns, slice_runs

__all__ = ["SafeOpen", "SafeSlice", "read_selections", "safe_open"]


class Selection(NamedTuple):
    """One result to read: ``runs`` of the tensor ``entry`` of its file."""

    entry: TensorEntry
    runs: SliceRuns


def _align(n: int) -> int:
    return (n + DEVICE_ALIGNMENT - 1) & ~(DEVICE_ALIGNMENT - 1)


def read_selections(plan: FilePlan, selections: Sequence[Selection],
                    device: Device) -> list[TensorPtr]:
    """The selections of one file read into memory of their own on ``device`` (one host
    block or one DeviceMemoryBuffer for all, each result at a 256-byte multiple), in
    order; only their runs' bytes are read.

    Raises
    ------
    CheckpointError
        The file changed since its header was read, or while it was read.
    NotFoundError, MemoryAllocationError
        As for :func:`etptr.load_safetensors` onto ``device``.
    """
    starts, total = [], 0
    for sel in selections:
        starts.append(total)
        total = _align(total + sel.runs.nbytes)
    shapes = [sel.runs.shape for sel in selections]
    types = [sel.entry.scalar_type for sel in selections]
    # large runs are read straight into the result; many small ones close together
    # (a column block) as their span, gathered in memory (SliceRuns.gathered)
    pieces, gathered = [], []
    for sel, at in zip(selections, starts):
        if sel.runs.gathered:
            gathered.append((sel, at))
            continue
        n = sel.runs.run_bytes
        first = plan.data_offset + sel.entry.begin
        pieces.extend((first + int(o), at + i * n, n) for i, o in enumerate(sel.runs.offsets))
    if device.is_cpu():
        block = _host_block(total)
        if pieces or gathered:
            base = block.ctypes.data
            with open_checked(plan) as f:
                try:
                    if pieces:
                        parallel_read(f.fileno(), [(base + d, o, n) for o, d, n in pieces],
                                      READ_THREADS)
                    for sel, at in gathered:
                        _gather(plan, f.fileno(), sel, block[at:at + sel.runs.nbytes])
                except (OSError, EOFError) as exc:
                    raise CheckpointError(f"{plan.path}: reading the data failed, the file "
                                          f"changed while loading? ({exc})") from None
                check_unchanged(plan, f)
        return [make_tensor_ptr(list(shape), block[at:at + r.nbytes], type=t)
                for shape, t, at, r in zip(shapes, types, starts,
                                           (s.runs for s in selections))]
    views: list[TensorPtr] = []
    with DeviceMemoryBuffer.create(total, device, alignment=DEVICE_ALIGNMENT) as buf:
        if not (pieces or gathered):
            return buf._views(starts, shapes, types)
        with open_checked(plan) as f:

            def view() -> None:
                check_unchanged(plan, f)
                views.extend(buf._views(starts, shapes, types))

            try:
                if gathered:                   # gathered on the host, then one batched upload
                    _gather_up(plan, f.fileno(), gathered, buf)
                if pieces:
                    buf.allocator.copy_file_to_device(buf.data_ptr, f.fileno(), pieces,
                                                      buf.device.index, on_queued=view)
                else:
                    view()
            except (OSError, EOFError) as exc:
                views.clear()
                raise CheckpointError(f"{plan.path}: reading the data failed, the file "
                                      f"changed while loading? ({exc})") from None
    return views


_GATHER_SPAN = 64 << 20          # the most file bytes a gathered read holds at once


def _host_block(nbytes: int) -> np.ndarray:
    """``nbytes`` of host memory starting at a DEVICE_ALIGNMENT multiple."""
    raw = np.empty(nbytes + DEVICE_ALIGNMENT, np.uint8)
    return raw[-raw.ctypes.data % DEVICE_ALIGNMENT:][:nbytes]


def _gather_up(plan: FilePlan, fd: int, gathered: list[tuple[Selection, int]],
               buf: DeviceMemoryBuffer) -> None:
    """Gathered selections into their places in ``buf`` (offsets ``at``): each gathered
    into a host block, then all moved by one batched :func:`h2d_copy`."""
    host = _host_block(sum(_align(sel.runs.nbytes) for sel, _ in gathered))
    srcs, at_host = [], 0
    for sel, _ in gathered:
        dst = host[at_host:at_host + sel.runs.nbytes]
        _gather(plan, fd, sel, dst)
        srcs.append(make_tensor_ptr([sel.runs.nbytes], dst, type=ScalarType.Byte))
        at_host += _align(sel.runs.nbytes)
    outs = buf._views([at for _, at in gathered], [[sel.runs.nbytes] for sel, _ in gathered],
                      [ScalarType.Byte] * len(gathered))
    h2d_copy(srcs, outs)


def _gather(plan: FilePlan, fd: int, sel: Selection, dst: np.ndarray) -> None:
    """The runs of ``sel`` into ``dst`` (its result's bytes): the file's bytes from the
    first run to the last read by the copy threads in spans of at most _GATHER_SPAN,
    each span's runs copied out."""
    runs = sel.runs
    first_byte = plan.data_offset + sel.entry.begin
    chunks = [(a, b, int(runs.offsets[a]), int(runs.offsets[b - 1] - runs.offsets[a])
               + runs.run_bytes) for a, b in runs.chunks(_GATHER_SPAN)]
    span = np.empty(max(n for _, _, _, n in chunks), np.uint8)
    out = dst.reshape(-1, runs.run_bytes)
    for a, b, lo, n in chunks:
        part = span[:n]
        parallel_read(fd, [(part.ctypes.data, first_byte + lo, n)], READ_THREADS)
        runs_ab = runs.gather(part, a, b)
        np.copyto(out[a:b].reshape(runs_ab.shape), runs_ab)


class SafeSlice:
    """A tensor of a :class:`SafeOpen` handle, not read yet (``safetensors``'
    ``PySafeSlice``): its shape and dtype, and indexing that reads only the bytes the
    slice needs.

    ``s[index]``: ints, slices with positive steps and one ``...``, as NumPy indexes
    (see :mod:`etptr.checkpoint._slices` for where this differs from ``safetensors``).
    The result is the handle's framework's tensor on its device, in memory of its own.
    """

    def __init__(self, handle: SafeOpen, entry: TensorEntry) -> None:
        self._handle = handle
        self._entry = entry

    def get_shape(self) -> list[int]:
        """The tensor's sizes, in elements."""
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        """The tensor's safetensors dtype code (``"F16"``, ``"BF16"``, ...)."""
        return DTYPE_NAMES[self._entry.scalar_type]

    def __getitem__(self, index: Any) -> Any:
        return self._handle.get_slices([(self._entry.name, index)])[0]

    def __repr__(self) -> str:
        return f"<SafeSlice {self._entry.name!r} {self.get_dtype()} {self.get_shape()}>"


class SafeOpen:
    """A checkpoint opened for reading (``safe_open(...)`` makes one); see
    :func:`safe_open`."""

    def __init__(self, paths: PathsLike, framework: str = "etptr",
                 device: Device | DeviceType | str = "cpu") -> None:
        self._framework = check_framework(framework)
        self._device = _device_arg(device)
        self._plan = read_plan(paths)
        self._where = {t.name: (f, t) for f, t in self._plan.entries()}
        self._maps: dict[int, memoryview | None] = {}
        self._open = True

    # the context manager
    def __enter__(self) -> SafeOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the handle's maps; tensors already returned stay valid. Idempotent."""
        self._maps.clear()
        self._open = False

    def _entry(self, name: object) -> tuple[FilePlan, TensorEntry]:
        if not self._open:
            raise CheckpointError("the safe_open handle is closed")
        if not isinstance(name, str):
            raise CheckpointError(f"name={name!r}: a tensor name is a str")
        found = self._where.get(name)
        if found is None:
            self._plan.select([name])          # raises, listing close names
        assert found is not None
        return found

    def keys(self) -> list[str]:
        """Every tensor name, sorted (as ``safetensors`` lists them)."""
        return sorted(self._where)

    def offset_keys(self) -> list[str]:
        """Every tensor name in file order (files in the order named)."""
        return list(self._where)

    def metadata(self) -> dict[str, str] | None:
        """The ``__metadata__`` of the (first) file: pass it to
        :func:`etptr.save_safetensors` to keep it; None when it has none."""
        meta = self._plan.files[0].metadata if self._plan.files else None
        return dict(meta) if meta is not None else None

    def get_tensor(self, name: str) -> Any:
        """The whole tensor ``name``, as :func:`etptr.load_safetensors` gives it: on the
        CPU a read-only view of the file's pages (a private map), on a device in memory of
        its own.

        Raises
        ------
        CheckpointError
            No tensor of that name (the message lists close names), a closed handle, a
            file that changed since its header was read.
        """
        f, t = self._entry(name)
        if self._device.is_cpu():
            key = id(f)
            if key not in self._maps:
                self._maps[key] = map_file(f)
            return to_framework(host_view(f, t, self._maps[key]), self._framework, name)
        return self.get_slices([(name, ...)])[0]

    def get_slice(self, name: str) -> SafeSlice:
        """The tensor ``name`` to slice (``f.get_slice(name)[:, a:b]``), read when indexed.

        Raises
        ------
        CheckpointError
            No tensor of that name, or a closed handle.
        """
        return SafeSlice(self, self._entry(name)[1])

    def get_slices(self, requests: Iterable[tuple[str, Any]]) -> list[Any]:
        """Many slices at once: ``[(name, index), ...]`` -> the results, in order (an
        index of ``...`` takes the whole tensor). The slices of one file move as one copy
        (one pipeline through the pinned slots for CUDA), so a tensor-parallel rank's
        share of every weight goes as a few large transfers.

        Raises
        ------
        CheckpointError
            A name that is not there, an index that is not ints, slices with positive
            steps and one ``...`` (or is out of range), a closed handle; checked for every
            request before any byte is read.
        """
        items = list(requests)
        by_file: dict[int, tuple[FilePlan, list[int], list[Selection]]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, tuple) or len(item) != 2:
                raise CheckpointError(f"requests[{i}]={item!r:.60}: expected (name, index)")
            f, t = self._entry(item[0])
            runs = slice_runs(item[1], t.shape, element_size(t.scalar_type), t.name)
            group = by_file.setdefault(id(f), (f, [], []))
            group[1].append(i)
            group[2].append(Selection(t, runs))
        out: list[Any] = [None] * len(items)
        for f, order, selections in by_file.values():
            for i, tensor in zip(order, read_selections(f, selections, self._device)):
                out[i] = to_framework(tensor, self._framework, items[i][0])
        return out

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return (f"<SafeOpen {len(self._where)} tensors in {len(self._plan.files)} file(s), "
                f"framework={self._framework!r}, device='{self._device}', {state}>")


def safe_open(paths: PathsLike, framework: str = "etptr",
              device: Device | DeviceType | str = "cpu") -> SafeOpen:
    """Open a checkpoint for reading, tensor by tensor or slice by slice (``safetensors``'
    ``safe_open``).

    Parameters
    ----------
    paths : str, os.PathLike, or list/tuple of them
        One ``.safetensors`` file, several, or a sharded checkpoint's index.
    framework : str, default ``"etptr"``
        What the tensors come back as: ``"etptr"`` (TensorPtr), ``"pt"`` (torch, sharing
        etptr's memory), ``"np"`` (NumPy, on the CPU), ``"cupy"`` (on a device).
    device : Device, DeviceType or str, default ``"cpu"``
        Where tensors go: ``"cpu"``, or a device through its registered allocator.

    Returns
    -------
    SafeOpen
        A context manager with ``keys()``, ``offset_keys()``, ``metadata()``,
        ``get_tensor(name)``, ``get_slice(name)`` (``get_shape()``, ``get_dtype()``,
        indexing) and ``get_slices([(name, index), ...])``.

    Raises
    ------
    CheckpointError
        A missing file (also a FileNotFoundError), a malformed header or index, a bad
        ``framework`` or ``device``: every header is checked here.

    Examples
    --------
    >>> import os, tempfile, etptr
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> etptr.save_safetensors({"w": etptr.full([4, 6], 2.0)}, path)
    >>> with etptr.safe_open(path, framework="np") as f:
    ...     f.keys(), f.get_slice("w").get_shape(), f.get_slice("w")[:, 1:3].shape
    (['w'], [4, 6], (4, 2))
    """
    return SafeOpen(paths, framework, device)
