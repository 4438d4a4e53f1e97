"""``load_safetensors``: a checkpoint's tensors as TensorPtrs, on the CPU or a device.

Three destinations, one function each:

* ``"cpu"``: read-only views of a map of each file (:func:`_load_mapped`);
* ``"cpu"`` with ``pinned=True``: one page-locked block per file, read into by the
  copy threads (:func:`_load_pinned`);
* a device: one :class:`~etptr.DeviceMemoryBuffer` per file, laid out by
  :func:`~etptr.checkpoint._layout.layout_file` (every tensor at a 256-byte
  multiple), filled by the device's allocator from the open file
  (:meth:`~etptr.DeviceAllocator.copy_file_to_device`: the registry's capability,
  whose CUDA override reads the file straight into pinned slots while the
  previous slot's DMA runs), the tensors made as views of it once the file has
  been read, while the last copies may still run (:func:`_load_to_device`). The
  same path serves every allocator; it names no allocator class.

A lone file of up to :data:`EARLY_UPLOAD_MAX` bytes of data, loaded whole onto a
device, whose header puts every tensor at a multiple of 256 bytes (read from the
header's bytes, unchecked) starts its upload before its header is checked: its
data section is its device layout, so the copy and the check overlap. Where the
checked layout turns out to be another after all, that buffer is given back and
the file loads as the others do; a malformed header raises once the copy is
complete, with the buffer given back (and before any error of the allocation or
the copy).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etptr._core._device import Device, DeviceType, as_device
from etptr._core._device_allocator import DEVICE_ALIGNMENT
from etptr._core._device_memory import DeviceMemoryBuffer
from etptr._core._error import EtError
from etptr._core._host_copy import parallel_read
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorPtr
from etptr._core._tensor_ptr_maker import empty
from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._file import (
    READ_THREADS, check_unchanged, host_view, map_file, open_checked)
from etptr.checkpoint._format import FilePlan, _read_header_bytes, plan_from_header
from etptr.checkpoint._frameworks import check_framework, to_framework
from etptr.checkpoint._header_scan import offsets_aligned
from etptr.checkpoint._into import load_into
from etptr.checkpoint._layout import CopyRun, FileLayout, layout_file
from etptr.checkpoint._plan import CheckpointPlan, PathsLike, _as_path, read_plan
from etptr.checkpoint._residency import check_read, direct_kw, read_pieces
from etptr.checkpoint._progress import Progress, ProgressArg, check_progress, reporter

__all__ = ["load_safetensors"]

#: A lone file with up to this many bytes of data goes up while its header is checked.
EARLY_UPLOAD_MAX = 256 << 20


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


def _read_host(plan: FilePlan, base: int, pieces: list[tuple[int, int, int]], read: str,
               threads: int) -> None:
    """The pieces ``(file_offset, dst_offset, nbytes)`` of the file read to host address
    ``base`` + dst_offset by the copy threads (buffered or direct as ``read`` decides),
    then the file checked unchanged."""
    with open_checked(plan) as opened:
        split, direct = read_pieces(plan, opened, pieces, read)
        try:
            for use, flag in ((opened, False), (direct, True)):
                segs = [(base + p[1], p[0], p[2]) for p in split
                        if (len(p) == 4 and p[3]) == flag]
                if segs and use is not None:
                    parallel_read(use.fileno(), segs, threads, direct=flag)
        except (OSError, EOFError) as exc:
            raise CheckpointError(f"{plan.path}: reading the data failed, the file "
                                  f"changed while loading? ({exc})") from None
        finally:
            if direct is not None:
                direct.close()
        check_unchanged(plan, opened)


def _load_pinned(plan: CheckpointPlan, progress: Progress | None,
                 read: str) -> dict[str, TensorPtr]:
    layouts = [layout_file(f) for f in plan.files]
    # every block first: a missing CUDA allocator fails before any file is opened
    blocks = [empty([lay.nbytes], ScalarType.Byte, pinned=True) for lay in layouts]
    if not blocks:
        empty([0], ScalarType.Byte, pinned=True)   # the same NotFoundError for an empty load
    out: dict[str, TensorPtr] = {}
    total = plan.nbytes
    done = 0
    for f, lay, block in zip(plan.files, layouts, blocks):
        dst: Any = block.numpy()
        if lay.runs:
            _read_host(f, block.data_ptr, [(r.file_offset, r.buffer_offset, r.nbytes)
                                           for r in lay.runs], read, READ_THREADS)
            done += f.nbytes
            if progress is not None:
                progress(done, total)
        for t, offset in zip(f.tensors, lay.offsets):
            out[t.name] = make_tensor_ptr(list(t.shape), dst[offset:offset + t.nbytes],
                                          type=t.scalar_type)
    if progress is not None and done == 0:
        progress(0, total)
    return out


@dataclass(frozen=True)
class _Unchecked:
    """A lone file whose header bytes have been read but not yet checked."""

    path: Path
    raw: bytes
    size: int
    identity: Any

    def checked(self) -> FilePlan:
        return plan_from_header(self.path, self.raw, self.size, self.identity)

    @property
    def nbytes(self) -> int:
        """Bytes of the data section (all of it is the tensors', once checked)."""
        return self.size - 8 - len(self.raw)

    def opened(self) -> FilePlan:
        """What :func:`~etptr.checkpoint._file.open_checked` needs: the file's size and
        identity (no tensors yet)."""
        data_offset = 8 + len(self.raw)
        return FilePlan(self.path, self.size, data_offset, self.size - data_offset, (), None,
                        self.identity)


def _early(path: Path) -> _Unchecked | FilePlan:
    """A lone file's header, read once: unchecked when its data section may go up while
    the header is checked (up to EARLY_UPLOAD_MAX bytes of data, every tensor at a
    256-byte multiple), else its checked plan."""
    raw, size, identity = _read_header_bytes(path)
    data_size = size - 8 - len(raw)
    if 0 < data_size <= EARLY_UPLOAD_MAX and offsets_aligned(raw, DEVICE_ALIGNMENT):
        return _Unchecked(path, raw, size, identity)
    return plan_from_header(path, raw, size, identity)


def _file_to_device(source: FilePlan | _Unchecked, device: Device,
                    advance: Callable[[int], None] | None,
                    read: str) -> dict[str, TensorPtr] | FilePlan:
    """One file's tensors on ``device``, as views of one DeviceMemoryBuffer, or, for an
    unchecked file whose checked layout is not its data section, that plan (the buffer is
    given back; the caller loads it again as a checked file)."""
    if isinstance(source, FilePlan):
        plan: FilePlan | None = source
        layout = layout_file(source, DEVICE_ALIGNMENT)
        opened = source
    else:
        plan = None
        opened = source.opened()
        whole = CopyRun(opened.data_offset, 0, opened.data_size)
        layout = FileLayout((), (), (whole,), opened.data_size, DEVICE_ALIGNMENT)
    checked: list[FilePlan] = []
    views: list[TensorPtr] = []
    file: ReadOnlyFile | None = None
    direct: ReadOnlyFile | None = None
    try:
        with DeviceMemoryBuffer.create(layout.nbytes, device, alignment=DEVICE_ALIGNMENT) as buf:

            def read_then_view() -> None:
                # the file has been read; its last device copies may run meanwhile
                p = plan if plan is not None else source.checked()   # type: ignore[union-attr]
                if file is not None:
                    check_unchanged(p, file)
                checked.append(p)
                own = layout_file(p, DEVICE_ALIGNMENT)
                if plan is None and (own.runs != layout.runs or own.nbytes != layout.nbytes):
                    return                       # another layout: the caller loads the plan
                views.extend(buf._views(own.offsets, [t.shape for t in p.tensors],
                                        [t.scalar_type for t in p.tensors]))

            if not layout.runs:
                read_then_view()
            else:
                file = open_checked(opened)
                pieces, direct = read_pieces(
                    opened, file, [(r.file_offset, r.buffer_offset, r.nbytes)
                                   for r in layout.runs], read)
                try:
                    buf.allocator.copy_file_to_device(
                        buf.data_ptr, file.fileno(), pieces, buf.device.index,
                        progress=advance, on_queued=read_then_view, **direct_kw(direct))
                except (OSError, EOFError) as exc:
                    raise CheckpointError(f"{opened.path}: reading the data failed, the file "
                                          f"changed while loading? ({exc})") from None
            if len(views) != len(checked[0].tensors):
                return checked[0]                # another layout: the buffer goes back
            return dict(zip([t.name for t in checked[0].tensors], views))
    except BaseException as exc:
        views.clear()                # a traceback keeps this frame: let go of the buffer
        if isinstance(exc, Exception) and plan is None and not checked:
            # failed before the header was checked (device memory, the copy, the file
            # changed): a malformed header is the error, as where it is checked first
            try:
                source.checked()     # type: ignore[union-attr]
            except CheckpointError as bad:
                raise bad from None
        raise
    finally:
        if file is not None:
            file.close()
        if direct is not None:
            direct.close()


def _load_to_device(sources: list[FilePlan | _Unchecked], device: Device,
                    progress: Progress | None, read: str = "auto") -> dict[str, TensorPtr]:
    """Every tensor of ``sources`` (checked plans, or one unchecked lone file) on
    ``device``, one device buffer per file, through the device's registered allocator.

    ``progress(done_bytes, total_bytes)`` is called from inside each file's copy as it
    advances, and once with ``done == total`` at the end.

    Raises
    ------
    NotFoundError
        No allocator is registered for ``device``.
    CheckpointError
        A malformed header (of an unchecked file), or a file changed since its header
        was read, or while it was read.
    MemoryAllocationError
        Device memory ran out; every buffer taken so far is given back.
    """
    total = sum(s.nbytes for s in sources)
    done = 0
    shown = [-1]
    out: dict[str, TensorPtr] = {}

    def advance_by(base: int) -> Callable[[int], None] | None:
        def advance(n: int) -> None:
            assert progress is not None
            shown[0] = min(base + n, total)
            progress(shown[0], total)
        return advance if progress is not None else None

    try:
        for source in sources:
            got = _file_to_device(source, device, advance_by(done), read)
            if isinstance(got, FilePlan):
                got = _file_to_device(got, device, advance_by(done), read)
            assert isinstance(got, dict)
            out.update(got)
            done += source.nbytes
    except BaseException:
        out.clear()                  # a traceback keeps this frame: let go of the buffers
        raise
    if progress is not None and shown[0] != total:
        progress(total, total)
    return out


def _device_arg(device: object) -> Device:
    try:
        return as_device(device, "device")  # type: ignore[arg-type]
    except EtError as exc:
        raise CheckpointError(str(exc)) from None


def load_safetensors(paths: PathsLike, device: Device | DeviceType | str = "cuda:0", *,
                     names: Iterable[str] | None = None, progress: ProgressArg = None,
                     pinned: bool = False, framework: str = "etptr", into: Any = None,
                     strict: bool = True, read: str = "auto") -> Any:
    """Load a safetensors checkpoint as TensorPtrs (or as torch, NumPy or CuPy tensors), or
    into tensors that already exist.

    Every header is read and checked first, and nothing is mapped or
    allocated until the whole checkpoint has passed, except for one file of up
    to 256 MiB of data loaded whole onto a device: its data section goes up while
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
    framework : str, default ``"etptr"``
        What the tensors come back as: ``"etptr"`` (TensorPtr), ``"pt"`` (torch
        tensors sharing etptr's memory), ``"np"`` (NumPy arrays, on the CPU),
        ``"cupy"`` (on a device).
    into : mapping of str to tensor, optional
        Existing tensors to fill in place, by name (a model's ``state_dict()``): each a
        TensorPtr, a NumPy array, or a torch / CuPy tensor (through DLPack or the CUDA
        Array Interface), contiguous and writable, with the checkpoint's shape and
        dtype, on the CPU or any device with a registered allocator. ``device``,
        ``pinned`` and ``framework`` do not apply; no memory is allocated for the data.
    strict : bool, default True
        With ``into``: a name only one side has is an error (before any byte moves), as
        in torch's ``load_state_dict``; False loads the names both have.
    read : str, default ``"auto"``
        How the files are read (onto a device, with ``pinned=True`` and with ``into``;
        ``"cpu"`` views map the file): ``"auto"`` reads the pages the page cache holds
        from it and the others straight from the storage (``O_DIRECT``, many reads in
        flight), decided by the pages resident when the load starts, so a load adds
        nothing to the cache; ``"buffered"`` reads everything through the page cache
        (and leaves the file in it, for the next load); ``"direct"`` reads everything
        with ``O_DIRECT``. A file system that takes no ``O_DIRECT`` is read buffered.

    Returns
    -------
    dict of str to tensor
        Name -> tensor, file by file in file order; each with the header's
        shape (sizes in elements, default dim_order) and ScalarType.
    IncompatibleKeys
        With ``into``: ``(missing_keys, unexpected_keys)``, as ``load_state_dict``
        returns them.

    Raises
    ------
    CheckpointError
        A missing file or shard (also a ``FileNotFoundError``), a malformed header
        or index (see ``etptr.checkpoint.parse_header``), a name in two files, a
        name in ``names`` the checkpoint lacks (the message lists close names), a
        bad ``device``, ``progress``, ``pinned``, ``framework`` or ``strict``
        argument, ``pinned=True`` with a non-CPU device; with ``into``, a target
        that does not fit its tensor (shape, dtype, layout, read-only), checked for
        every name before any byte moves, and a failure part way says which targets
        were written. The message names the file and the tensor.
    NotFoundError
        No allocator for ``device``; with ``pinned=True``, no CUDA allocator
        (page-locked memory comes from it).
    MemoryAllocationError
        Device or page-locked memory ran out; nothing stays allocated.

    Notes
    -----
    Onto a device and with ``pinned=True`` the file is read (``pread``), not
    mapped: a file truncated or written to while it is read gives a
    CheckpointError and nothing stays allocated. A write is seen by the file's
    modification and status-change times, which the kernel keeps at its clock
    tick (a few milliseconds) and set as a write starts: a rewrite in place that
    keeps the size is not seen when it falls within the same tick as the
    file's previous change, or when it had begun before the load read the
    header and ends during the load (its bytes may then be mixed with the old
    ones). A writer that replaces the file whole (a new file renamed over it,
    as save_safetensors does) never mixes with a load. A file replaced by
    another between reading the header and opening it is refused
    (CheckpointError).

    For ``"cpu"`` the tensors are read-only views of a private, copy-on-write
    map of each file, as ``numpy.memmap`` and the ``safetensors`` library read
    it: they show later changes of the file's pages, and a file that another
    process truncates while its views live ends the process with SIGBUS when
    they are read. A consumer that ignores the read-only flag (``torch.from_dlpack``
    does) writes into private copies of the pages: the file never changes and
    nothing faults.

    Examples
    --------
    >>> import os, tempfile, etptr
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> etptr.save_safetensors({"w": etptr.ones([2, 3])}, path)
    >>> t = etptr.load_safetensors(path, "cpu")["w"]
    >>> t.sizes, t.scalar_type.name, t.readonly
    ((2, 3), 'Float', True)
    """
    fw = check_framework(framework)
    mode = check_read(read)
    if into is not None:
        plan = read_plan(paths)
        if names is not None:
            plan = plan.select(names)
        with reporter(check_progress(progress), plan.nbytes, "loading in place") as report:
            return load_into(plan, into, strict, report, mode)
    if fw != "etptr":
        out = load_safetensors(paths, device, names=names, progress=progress, pinned=pinned,
                               read=mode)
        return {k: to_framework(v, fw, k) for k, v in out.items()}
    dev = _device_arg(device)
    if not isinstance(pinned, bool):
        raise CheckpointError(f"pinned={pinned!r} is not a bool")
    if pinned and not dev.is_cpu():
        raise CheckpointError(f"pinned=True gives page-locked CPU copies; device={str(dev)!r} "
                              f"loads into device memory: pass device='cpu' or pinned=False")
    checked = check_progress(progress)
    if not isinstance(paths, (list, tuple)):
        paths = _as_path(paths, "paths")          # one fspath: the path is read once
    if isinstance(paths, Path) and not paths.name.endswith(".json") and names is None \
            and not dev.is_cpu():
        sources: list[FilePlan | _Unchecked] = [_early(paths)]
    else:
        plan = read_plan(paths)
        if names is not None:
            plan = plan.select(names)
        if dev.is_cpu():
            with reporter(checked, plan.nbytes, "loading to cpu") as report:
                return _load_pinned(plan, report, mode) if pinned else \
                    _load_mapped(plan, report)
        sources = list(plan.files)
    with reporter(checked, sum(s.nbytes for s in sources), f"loading to {dev}") as report:
        return _load_to_device(sources, dev, report, mode)
