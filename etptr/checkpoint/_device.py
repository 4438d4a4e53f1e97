"""The seams between checkpoints and device memory: loading a plan onto a device, and
streaming device tensors back for writing.

Loading: each file's tensors go into one :class:`~etptr.DeviceMemoryBuffer`
laid out by :func:`~etptr.checkpoint._layout.layout_file` (every tensor at a
256-byte multiple); the file's copy runs go up from a read-only ``mmap`` of the
file as one batched :func:`~etptr.h2d_copy`, which the CUDA copy engine moves
as one pipelined copy: its threads copy the page cache into pinned slots while
the previous slot's DMA runs. No tensor is copied on the host first. The
tensors are views of the buffer; its memory returns when the last one dies.

Saving: the output file is mapped; device tensors come down in groups of up to
64 MiB, each group one batched ``d2h_copy`` whose copy threads write the bytes
straight into the file's pages.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from etptr._core._device import Device
from etptr._core._device_copy import clone_tensor_ptr_to_cpu, d2h_copy, h2d_copy
from etptr._core._device_memory import DeviceMemoryBuffer
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._host import map_file
from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
from etptr.checkpoint._plan import CheckpointPlan
from etptr.checkpoint._progress import Progress

__all__ = ["_copy_device_bytes", "_fetch_to_host", "_load_to_device"]

#: Bytes moved per batched copy while loading, so that progress advances on large files.
LOAD_STEP = 256 << 20
#: Bytes of device tensors fetched per group while saving.
SAVE_GROUP = 64 << 20


def _load_to_device(plan: CheckpointPlan, device: Device,
                    progress: Progress | None) -> dict[str, TensorPtr]:
    """Every tensor of ``plan`` on ``device``, one device buffer per file.

    Parameters
    ----------
    plan : CheckpointPlan
        Checked headers (possibly a subset of tensors); files in order.
    device : Device
        A non-CPU device; its allocator comes from the registry.
    progress : callable(done_bytes, total_bytes) or None
        Called as bytes arrive, the last time with ``done == total``; once
        with ``(0, 0)`` when no tensor holds bytes.

    Returns
    -------
    dict of str to TensorPtr
        Name -> tensor on ``device``, file by file in file order; each with
        the header's shape and ScalarType, a view of its file's buffer.

    Raises
    ------
    NotFoundError
        No allocator is registered for ``device``.
    CheckpointError
        A file changed since its header was read.
    MemoryAllocationError
        Device memory ran out; every buffer taken so far is given back.
    """
    total = plan.nbytes
    done = 0
    out: dict[str, TensorPtr] = {}
    limit = LOAD_STEP if progress is not None else total
    for f in plan.files:
        layout = layout_file(f, DEVICE_ALIGNMENT)
        mapped = map_file(f)
        with DeviceMemoryBuffer.create(layout.nbytes, device, alignment=DEVICE_ALIGNMENT) as buf:
            if mapped is not None:
                srcs: list[TensorPtr] = []
                outs: list[TensorPtr] = []
                step = 0
                for run in layout.runs:
                    srcs.append(make_tensor_ptr(
                        [run.nbytes], mapped[run.file_offset:run.file_offset + run.nbytes],
                        type=ScalarType.Byte))
                    outs.append(buf.tensor(run.buffer_offset, [run.nbytes], ScalarType.Byte))
                    step += run.nbytes
                    if step >= limit or run is layout.runs[-1]:
                        h2d_copy(srcs, outs)
                        done += step
                        srcs, outs, step = [], [], 0
                        if progress is not None:
                            progress(done, total)
            for t, offset in zip(f.tensors, layout.offsets):
                out[t.name] = buf.tensor(offset, list(t.shape), t.scalar_type)
        del mapped
    if progress is not None and done == 0:
        progress(0, total)
    return out


def _fetch_to_host(tensor: TensorPtr) -> npt.NDArray[np.generic]:
    """The bytes of one device tensor on the host, in row-major (C) order.

    Parameters
    ----------
    tensor : TensorPtr on a device, with data (``nbytes > 0``)

    Raises
    ------
    NotFoundError
        No allocator is registered for the tensor's device.
    """
    return np.ascontiguousarray(clone_tensor_ptr_to_cpu(tensor).numpy())


def _row_major(t: TensorPtr) -> bool:
    return t.dim_order == tuple(range(t.dim()))


def _copy_device_bytes(tensors: Sequence[TensorPtr], dsts: Sequence[memoryview]) -> None:
    """Copy each device tensor's bytes, in row-major (C) order, into the writable host
    buffer of the same length beside it (a piece of the mapped output file).

    Row-major tensors go in groups of up to SAVE_GROUP bytes, each group one batched
    ``d2h_copy``: a kernel gathers the small ones on the device, the bytes come down
    through pinned slots, and the copy threads scatter them into the file's pages.
    Other tensors are fetched one by one through a contiguous copy.

    Raises
    ------
    NotFoundError
        No allocator is registered for a tensor's device.
    """
    srcs: list[TensorPtr] = []
    outs: list[TensorPtr] = []
    size = 0
    try:
        for t, dst in zip(tensors, dsts):
            if not _row_major(t):
                np.frombuffer(dst, np.uint8)[:] = _fetch_to_host(t).reshape(-1).view(np.uint8)
                continue
            srcs.append(make_tensor_ptr([t.nbytes], t.data_ptr, type=ScalarType.Byte,
                                        device=t.device))
            outs.append(make_tensor_ptr([t.nbytes], dst, type=ScalarType.Byte))
            size += t.nbytes
            if size >= SAVE_GROUP:
                d2h_copy(srcs, outs)
                srcs.clear()
                outs.clear()
                size = 0
        if srcs:
            d2h_copy(srcs, outs)
    finally:
        # the views export the mapped file's buffer: let go of them even on an error (a
        # traceback would otherwise keep them, and the map could not be closed)
        srcs.clear()
        outs.clear()
