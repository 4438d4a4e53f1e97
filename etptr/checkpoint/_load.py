"""``load_safetensors``: a checkpoint's tensors as TensorPtrs, on the CPU or a device."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from etptr._core._device import Device, DeviceType, as_device
from etptr._core._error import EtError
from etptr._core._scalar_type import ScalarType
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr._core._tensor_ptr_maker import empty
from etptr.checkpoint import _device
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._host import host_view, map_file
from etptr.checkpoint._layout import layout_file
from etptr.checkpoint._plan import CheckpointPlan, PathsLike, _as_path, read_plan
from etptr.checkpoint._progress import Progress, ProgressArg, check_progress, reporter

__all__ = ["load_safetensors"]

# Pinned copies go in pieces of this many bytes, so progress moves on large tensors.
_COPY_PIECE = 64 << 20


def _load_mapped(plan: CheckpointPlan, progress: Progress | None) -> dict[str, TensorPtr]:
    out: dict[str, TensorPtr] = {}
    total = plan.nbytes
    done = 0
    for f in plan.files:
        mapped = map_file(f)
        for t in f.tensors:
            out[t.name] = host_view(f, t, mapped)
        if f.nbytes:
            done += f.nbytes
            if progress is not None:
                progress(done, total)
    if progress is not None and done == 0:
        progress(0, total)
    return out


def _load_pinned(plan: CheckpointPlan, progress: Progress | None) -> dict[str, TensorPtr]:
    layouts = [layout_file(f) for f in plan.files]
    # every block first: a missing CUDA allocator fails before any file is mapped
    blocks = [empty([lay.nbytes], ScalarType.Byte, pinned=True) for lay in layouts]
    if not blocks:
        empty([0], ScalarType.Byte, pinned=True)   # the same NotFoundError for an empty load
    out: dict[str, TensorPtr] = {}
    total = plan.nbytes
    done = 0
    for f, lay, block in zip(plan.files, layouts, blocks):
        mapped = map_file(f)
        dst: Any = block.numpy()
        for run in lay.runs:
            assert mapped is not None
            for piece in range(0, run.nbytes, _COPY_PIECE):
                n = min(_COPY_PIECE, run.nbytes - piece)
                b = run.buffer_offset + piece
                dst[b:b + n] = np.frombuffer(mapped, np.uint8, n, run.file_offset + piece)
                done += n
                if progress is not None:
                    progress(done, total)
        del mapped
        for t, offset in zip(f.tensors, lay.offsets):
            out[t.name] = make_tensor_ptr(list(t.shape), dst[offset:offset + t.nbytes],
                                          type=t.scalar_type)
    if progress is not None and done == 0:
        progress(0, total)
    return out


def _device_arg(device: object) -> Device:
    try:
        return as_device(device, "device")  # type: ignore[arg-type]
    except EtError as exc:
        raise CheckpointError(str(exc)) from None


def load_safetensors(paths: PathsLike, device: Device | DeviceType | str = "cuda:0", *,
                     names: Iterable[str] | None = None, progress: ProgressArg = None,
                     pinned: bool = False) -> dict[str, TensorPtr]:
    """Load a safetensors checkpoint as TensorPtrs.

    Every header is read and checked first, and nothing is mapped or
    allocated until the whole checkpoint has passed, except for one file of up
    to 256 MiB of data loaded whole onto CUDA: its data section goes up while
    its header is checked (a malformed header then raises once that copy is
    complete, after giving its device memory back).

    Parameters
    ----------
    paths : str, os.PathLike, or list/tuple of them
        One ``.safetensors`` file, several, or a sharded checkpoint's
        ``*.safetensors.index.json`` (its ``weight_map`` names the shards,
        which lie beside it).
    device : Device, DeviceType or str, default ``"cuda:0"``
        ``"cpu"``: read-only, zero-copy views of each file's pages (one
        read-only ``mmap`` per file, kept alive by its tensors). Any other
        device: the tensors in that device's memory, through its registered
        allocator.
    names : iterable of str, optional
        Load only these tensors (default: all).
    progress : None, bool or callable, optional
        ``callable(done_bytes, total_bytes)`` is called as data arrives, the
        last time with ``done_bytes == total_bytes``. ``True`` draws a tqdm
        bar on stderr, ``False`` nothing; ``None`` (default) draws one when
        tqdm is installed, stderr is a terminal and the load is over 256 MiB.
    pinned : bool, default False
        With ``device="cpu"``: page-locked, writable copies instead of views
        of the file; one page-locked block per file (every tensor at a
        256-byte aligned offset) with the tensors as views into it.

    Returns
    -------
    dict of str to TensorPtr
        Name -> tensor, file by file in file order; each with the header's
        shape (sizes in elements, default dim_order) and ScalarType.

    Raises
    ------
    CheckpointError
        A missing file or shard, a malformed header or index (see
        ``etptr.checkpoint.parse_header``), a name in two files, a name in
        ``names`` the checkpoint lacks (the message lists close names), a
        bad ``device``, ``progress`` or ``pinned`` argument, ``pinned=True``
        with a non-CPU device. The message names the file and the tensor.
    NotFoundError
        No allocator for ``device``; with ``pinned=True``, no CUDA allocator
        (page-locked memory comes from it).
    MemoryAllocationError
        Device or page-locked memory ran out; nothing stays allocated.

    Notes
    -----
    Onto CUDA (the registered ``CudaAllocator``) the copy threads read each file
    with ``pread`` straight into pinned slots: a file truncated or written to
    while it is read gives a CheckpointError and nothing stays allocated. For
    ``"cpu"``, ``pinned=True`` and other allocators the data is read through a
    map of each file, as ``numpy.memmap`` and the ``safetensors`` library read
    it: a file that another process truncates while it is mapped (during such
    a load, or while ``"cpu"`` views of it live) ends the process with SIGBUS.
    A file replaced by another between reading the header and opening it is
    refused (CheckpointError).

    Examples
    --------
    >>> import os, tempfile, etptr
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> etptr.save_safetensors({"w": etptr.ones([2, 3])}, path)
    >>> t = etptr.load_safetensors(path, "cpu")["w"]
    >>> t.sizes, t.scalar_type.name, t.readonly
    ((2, 3), 'Float', True)
    """
    dev = _device_arg(device)
    if not isinstance(pinned, bool):
        raise CheckpointError(f"pinned={pinned!r} is not a bool")
    if pinned and not dev.is_cpu():
        raise CheckpointError(f"pinned=True gives page-locked CPU copies; device={str(dev)!r} "
                              f"loads into device memory: pass device='cpu' or pinned=False")
    checked = check_progress(progress)
    if not isinstance(paths, (list, tuple)):
        paths = _as_path(paths, "paths")          # one fspath: the path is read once
    plan: CheckpointPlan | None = None
    if isinstance(paths, Path) and not paths.name.endswith(".json") and names is None \
            and not dev.is_cpu():
        loaded = _device.load_file_overlapped(paths, dev, checked)
        if isinstance(loaded, dict):
            return loaded
        if loaded is not None:       # checked already: another layout than the file's
            plan = CheckpointPlan((loaded,))
    if plan is None:
        plan = read_plan(paths)
        if names is not None:
            plan = plan.select(names)
    with reporter(checked, plan.nbytes, f"loading to {dev}") as report:
        if not dev.is_cpu():
            return _device._load_to_device(plan, dev, report)
        if pinned:
            return _load_pinned(plan, report)
        return _load_mapped(plan, report)
