"""The seams between checkpoints and device memory: loading a plan onto a device, and
streaming device tensors back for writing.

Loading: each file's tensors go into one :class:`~etptr.DeviceMemoryBuffer`
laid out by :func:`~etptr.checkpoint._layout.layout_file` (every tensor at a
256-byte multiple). With the CUDA allocator the file's copy runs go up as one
pipelined copy (:meth:`~etptr.cuda.CudaAllocator.copy_file_to_device`) whose
copy threads read the file with ``pread`` straight into the pinned slots while
the previous slot's DMA runs: the page cache is copied once, and no map of the
file is made. (Copying from a fresh map instead runs at half the rate on an
H200 host: 23.0 GB/s against 52.4 from a map already faulted in, because the
first touch of every page faults; see ``bench/probe_file_io.c``.) With any other
allocator the runs go up from a read-only ``mmap`` of the file as one batched
:func:`~etptr.h2d_copy`. No tensor is copied on the host first. The tensors
are views of the buffer, made while the last DMAs run (the copy threads have
read the whole file by then); its memory returns when the last one dies.

A whole file of up to :data:`OVERLAP_MAX` bytes of data whose header puts every
tensor at a multiple of 256 bytes (read from the header's bytes, unchecked) goes
up before its header is checked (:func:`load_file_overlapped`): its data section
is copied as it lies in the file, and the header is checked, laid out and
viewed while the last DMAs run. Where the layout turns out not to be the file's
own after all, that buffer is given back and the file loads the usual way; a
malformed header raises once the copy is complete, with the buffer given back
(and before any error of the allocation or the copy).

Saving: the output file is mapped; device tensors come down in groups of up to
64 MiB, each group one batched ``d2h_copy`` whose copy threads write the bytes
straight into the file's pages.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from etptr._core._device import Device
from etptr._core._device_allocator import get_device_allocator
from etptr._core._device_copy import clone_tensor_ptr_to_cpu, d2h_copy, h2d_copy
from etptr._core._device_memory import DeviceMemoryBuffer
from etptr._core._error import NotFoundError
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._format import FilePlan, _read_header_bytes, plan_from_header
from etptr.checkpoint._header_scan import offsets_aligned
from etptr.checkpoint._host import check_unchanged, map_file, open_checked
from etptr.checkpoint._layout import DEVICE_ALIGNMENT, CopyRun, layout_file
from etptr.checkpoint._plan import CheckpointPlan
from etptr.checkpoint._progress import Progress, ProgressArg, reporter
from etptr.cuda._allocator import CudaAllocator

__all__ = ["_copy_device_bytes", "_fetch_to_host", "_load_to_device", "load_file_overlapped"]

#: Bytes moved per batched copy while loading, so that progress advances on large files.
LOAD_STEP = 256 << 20
#: Files with up to this many bytes of data go up while their header is checked.
OVERLAP_MAX = 256 << 20
#: Bytes of device tensors fetched per group while saving.
SAVE_GROUP = 64 << 20


def _steps(runs: Sequence[CopyRun], limit: int) -> list[list[CopyRun]]:
    """The runs in groups of about ``limit`` bytes (a run longer than that is cut)."""
    groups: list[list[CopyRun]] = [[]]
    size = 0
    for run in runs:
        done = 0
        while done < run.nbytes:
            n = min(run.nbytes - done, limit - size)
            groups[-1].append(CopyRun(run.file_offset + done, run.buffer_offset + done, n))
            done += n
            size += n
            if size >= limit:
                groups.append([])
                size = 0
    return [g for g in groups if g]


def _upload_file(f: FilePlan, buf: DeviceMemoryBuffer, groups: list[list[CopyRun]],
                 progress: Callable[[int], None], finish: Callable[[], None]) -> None:
    """The file's runs into ``buf``: read straight into pinned slots for the CUDA
    allocator, else through a read-only map and batched ``h2d_copy``. ``finish()`` runs
    once the whole file has been read and checked unchanged: with the CUDA allocator
    while the last DMAs still run (the upload is complete when this returns)."""
    alloc = get_device_allocator(buf.device.type)
    if type(alloc) is CudaAllocator:
        fd = open_checked(f)

        def read() -> None:
            check_unchanged(f, fd)
            finish()

        try:
            for i, group in enumerate(groups):
                try:
                    alloc.copy_file_to_device(
                        buf.data_ptr, fd,
                        [(r.file_offset, r.buffer_offset, r.nbytes) for r in group],
                        buf.device.index, on_queued=read if i == len(groups) - 1 else None)
                except (OSError, EOFError) as exc:
                    raise CheckpointError(f"{f.path}: reading the data failed, the file "
                                          f"changed while loading? ({exc})") from None
                progress(sum(r.nbytes for r in group))
        finally:
            os.close(fd)
        return
    mapped = map_file(f)
    assert mapped is not None
    try:
        for group in groups:
            srcs = [make_tensor_ptr([r.nbytes], mapped[r.file_offset:r.file_offset + r.nbytes],
                                    type=ScalarType.Byte) for r in group]
            outs = [buf.tensor(r.buffer_offset, [r.nbytes], ScalarType.Byte) for r in group]
            h2d_copy(srcs, outs)
            del srcs, outs
            progress(sum(r.nbytes for r in group))
    finally:
        del mapped
    finish()


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
        Called as bytes arrive (every LOAD_STEP bytes), the last time with
        ``done == total``; once with ``(0, 0)`` when no tensor holds bytes.

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
        A file changed since its header was read, or while it was read.
    MemoryAllocationError
        Device memory ran out; every buffer taken so far is given back.
    """
    total = plan.nbytes
    done = 0
    out: dict[str, TensorPtr] = {}
    limit = LOAD_STEP if progress is not None else max(total, 1)

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    views: list[TensorPtr] = []
    try:
        for f in plan.files:
            layout = layout_file(f, DEVICE_ALIGNMENT)
            with DeviceMemoryBuffer.create(layout.nbytes, device,
                                           alignment=DEVICE_ALIGNMENT) as buf:

                def make_views() -> None:
                    views.extend(buf._views(layout.offsets, [t.shape for t in f.tensors],
                                            [t.scalar_type for t in f.tensors]))

                if layout.runs:       # the views are made while the last DMAs run
                    _upload_file(f, buf, _steps(layout.runs, limit), advance, make_views)
                else:
                    make_views()
                out.update(zip([t.name for t in f.tensors], views))
                views.clear()
    except BaseException:
        # a traceback keeps this frame: let go of every buffer taken so far
        views.clear()
        out.clear()
        raise
    if progress is not None and done == 0:
        progress(0, total)
    return out


def load_file_overlapped(path: Path, device: Device,
                         progress: ProgressArg) -> dict[str, TensorPtr] | FilePlan | None:
    """One whole file onto ``device``, its data section uploaded while its header is
    checked; what :func:`_load_to_device` returns for it, with the same errors.

    Returns
    -------
    dict of str to TensorPtr
        Every tensor, when the file's own layout is the device layout (every
        tensor at a multiple of 256 bytes in the data section).
    FilePlan
        The file's checked plan, when it is not: the buffer is given back,
        nothing is kept, and the caller loads the plan the usual way.
    None
        The file is not loaded this way: the device's allocator is not the
        ``CudaAllocator``, the data section is empty or over OVERLAP_MAX, or the
        header's offsets show another layout
        (:func:`~etptr.checkpoint._header_scan.offsets_aligned`).

    Raises
    ------
    CheckpointError
        As :func:`~etptr.checkpoint._format.parse_header` (a malformed header
        once the copy is complete, also where the allocation or the copy
        failed first), or the file changed while it was read; nothing stays
        allocated.
    MemoryAllocationError
        Device memory ran out (and the header is well formed).
    """
    try:
        alloc = get_device_allocator(device.type)
    except NotFoundError:
        return None                  # the usual way raises, after checking the header
    if type(alloc) is not CudaAllocator:
        return None
    raw, size, identity = _read_header_bytes(path)
    data_offset = 8 + len(raw)
    data_size = size - data_offset
    if not 0 < data_size <= OVERLAP_MAX or not offsets_aligned(raw, DEVICE_ALIGNMENT):
        return None                  # (another layout: the copy would be made twice)
    whole = CopyRun(data_offset, 0, data_size)
    found: list[FilePlan] = []
    views: list[TensorPtr] = []
    fd = -1
    try:
        fd = open_checked(FilePlan(path, size, data_offset, data_size, (), None, identity))
        with DeviceMemoryBuffer.create(data_size, device, alignment=DEVICE_ALIGNMENT) as buf:

            def check_then_view() -> None:
                # the file has been read; its DMAs run meanwhile
                plan = plan_from_header(path, raw, size, identity)
                check_unchanged(plan, fd)
                found.append(plan)
                layout = layout_file(plan, DEVICE_ALIGNMENT)
                if layout.runs == (whole,) and layout.nbytes == data_size:
                    views.extend(buf._views(layout.offsets, [t.shape for t in plan.tensors],
                                            [t.scalar_type for t in plan.tensors]))

            try:
                alloc.copy_file_to_device(buf.data_ptr, fd, [(data_offset, 0, data_size)],
                                          device.index, on_queued=check_then_view)
            except (OSError, EOFError) as exc:
                raise CheckpointError(f"{path}: reading the data failed, the file "
                                      f"changed while loading? ({exc})") from None
            if not views:
                return found[0]      # another layout: the buffer goes back on leaving
            with reporter(progress, data_size, f"loading to {device}") as report:
                if report is not None:
                    report(data_size, data_size)
            return dict(zip([t.name for t in found[0].tensors], views))
    except BaseException as exc:
        views.clear()                # a traceback keeps this frame: let go of the buffer
        if isinstance(exc, Exception) and not found:
            # failed before the header was checked (the file changed, device memory, the
            # copy): a malformed header is the error, as where the header is checked first
            try:
                plan_from_header(path, raw, size, identity)
            except CheckpointError as bad:
                raise bad from None
        raise
    finally:
        if fd >= 0:
            os.close(fd)


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
