"""``load_safetensors(..., into=...)``: a checkpoint read into tensors that already exist
(a model's parameters), as torch's ``load_state_dict`` fills them, with no memory taken.

Every target is checked against its tensor's header entry (shape, dtype, a row-major
layout, writable, the device it lives on) before a byte moves, and ``strict`` names the
missing and unexpected names as ``load_state_dict`` does. Then each file goes in one
copy: its tensors for CPU targets read by the copy threads straight into them, its
tensors for a device's targets uploaded by that device's allocator
(:meth:`~etptr.DeviceAllocator.copy_file_to_device` without gaps: each tensor to its own
place).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

from etptr._core._device_allocator import get_device_allocator
from etptr._core._error import NotFoundError
from etptr._core._host_copy import parallel_read
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._file import READ_THREADS, check_unchanged, open_checked
from etptr.checkpoint._format import DTYPE_NAMES, FilePlan, TensorEntry
from etptr.checkpoint._frameworks import as_tensor_ptr
from etptr.checkpoint._plan import CheckpointPlan
from etptr.checkpoint._progress import Progress
from etptr.checkpoint._residency import direct_kw, read_pieces

__all__ = ["IncompatibleKeys", "load_into"]


class IncompatibleKeys(NamedTuple):
    """What ``load_safetensors(..., into=...)`` returns, as torch's ``load_state_dict``:
    the names of ``into`` the checkpoint lacks, and the checkpoint's names ``into``
    lacks (both empty after a strict load)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _listed(names: list[str]) -> str:
    shown = ", ".join(map(repr, names[:5]))
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_target(entry: TensorEntry, t: TensorPtr) -> None:
    name = entry.name
    if t.sizes != entry.shape:
        raise CheckpointError(f"into[{name!r}]: shape {list(t.sizes)}, the checkpoint's is "
                              f"{list(entry.shape)}")
    if t.scalar_type != entry.scalar_type:
        raise CheckpointError(f"into[{name!r}]: ScalarType.{t.scalar_type.name}, the "
                              f"checkpoint's is {DTYPE_NAMES[entry.scalar_type]} "
                              f"(ScalarType.{entry.scalar_type.name})")
    if t.dim_order != tuple(range(t.dim())):
        raise CheckpointError(f"into[{name!r}]: dim_order {t.dim_order}; a checkpoint's "
                              f"tensor is row-major, so is the tensor it is read into")
    if t.readonly:
        raise CheckpointError(f"into[{name!r}] is read-only")
    if t.nbytes and not t.data_ptr:
        raise CheckpointError(f"into[{name!r}] has null data")
    if not t.device.is_cpu() and get_device_allocator(t.device.type) is None:
        raise NotFoundError(f"into[{name!r}] is on {t.device} and no allocator is "
                            f"registered for it, so it cannot be written")


def _fill_file(plan: FilePlan, pairs: list[tuple[TensorEntry, TensorPtr]], read: str) -> None:
    """Every pair's tensor read from ``plan``'s file into its target (buffered or direct
    as ``read`` decides)."""
    cpu = [(e, t) for e, t in pairs if t.device.is_cpu() and e.nbytes]
    devices: dict[Any, list[tuple[TensorEntry, TensorPtr]]] = {}
    for e, t in pairs:
        if not t.device.is_cpu() and e.nbytes:
            devices.setdefault(t.device, []).append((e, t))
    if not cpu and not devices:
        return
    with open_checked(plan) as f:
        if cpu:
            cpu.sort(key=lambda et: et[1].data_ptr)
            base = cpu[0][1].data_ptr
            split, direct = read_pieces(plan, f, [(plan.data_offset + e.begin,
                                                   t.data_ptr - base, e.nbytes)
                                                  for e, t in cpu], read)
            with _closing(direct):
                for use, flag in ((f, False), (direct, True)):
                    segs = [(base + p[1], p[0], p[2]) for p in split
                            if (len(p) == 4 and p[3]) == flag]
                    if segs and use is not None:
                        parallel_read(use.fileno(), segs, READ_THREADS,
                                      direct=flag)
        for device, group in devices.items():
            group.sort(key=lambda et: et[1].data_ptr)
            base = group[0][1].data_ptr
            pieces, direct = read_pieces(plan, f, [(plan.data_offset + e.begin,
                                                    t.data_ptr - base, e.nbytes)
                                                   for e, t in group], read)
            alloc = get_device_allocator(device.type)
            with _closing(direct):
                alloc.copy_file_to_device(base, f.fileno(), pieces, device.index, gaps=False,
                                          **direct_kw(direct))
        check_unchanged(plan, f)


def _tied(work: list[tuple[FilePlan, list[tuple[TensorEntry, TensorPtr]]]]
          ) -> set[tuple[int, int]]:
    """The (file, pair) positions not to read: of targets that are one tensor under
    several names (tied weights in a model's state_dict), only the name the checkpoint
    lists last is read into it, as copying them one after another would leave it.

    Raises
    ------
    CheckpointError
        Two targets overlap without being the same bytes (naming both).
    """
    spans = sorted(((str(t.device), t.data_ptr, e.nbytes, fi, pi, e.name)
                    for fi, (_, pairs) in enumerate(work)
                    for pi, (e, t) in enumerate(pairs) if e.nbytes),
                   key=lambda s: s[:3])
    skip = set()
    for a, b in zip(spans, spans[1:]):
        if a[0] != b[0] or a[1] + a[2] <= b[1]:
            continue
        if a[1:3] != b[1:3]:
            raise CheckpointError(f"into: the targets of {a[5]!r} and {b[5]!r} overlap "
                                  f"in memory without being the same tensor")
        skip.add(min(a[3:5], b[3:5]))                  # the one listed earlier
    return skip


@contextmanager
def _closing(f: ReadOnlyFile | None) -> Iterator[None]:
    try:
        yield
    finally:
        if f is not None:
            f.close()


def load_into(plan: CheckpointPlan, into: object, strict: bool,
              progress: Progress | None, read: str = "auto") -> IncompatibleKeys:
    """Fill the tensors of ``into`` (a mapping of name -> TensorPtr, NumPy array, or a
    DLPack / CUDA Array Interface tensor) from ``plan``; see :func:`etptr.load_safetensors`.

    Raises
    ------
    CheckpointError
        ``into`` is not a mapping; with ``strict``, names only one side has; a target
        whose shape, dtype, layout or writability does not fit, or that cannot be read in
        place (before any byte moves); a file that changed or could not be read part way
        (the message says which targets were written by then).
    NotFoundError
        A target on a device without a registered allocator.
    """
    if not isinstance(into, Mapping):
        raise CheckpointError(f"into: expected a mapping of tensor name -> tensor (a model's "
                              f"state_dict()), got {type(into).__name__}")
    if not isinstance(strict, bool):
        raise CheckpointError(f"strict={strict!r} is not a bool")
    have = set(plan.names)
    missing = sorted(k for k in into if k not in have)
    unexpected = [n for n in plan.names if n not in into]
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {_listed(missing)}")
        if unexpected:
            parts.append(f"not in into: {_listed(unexpected)}")
        raise CheckpointError("load into existing tensors (strict=True): "
                              + "; ".join(parts) + "; pass strict=False to load the rest")
    work: list[tuple[FilePlan, list[tuple[TensorEntry, TensorPtr]]]] = []
    for f in plan.files:
        pairs = []
        for e in f.tensors:
            if e.name in into:
                t = as_tensor_ptr(into[e.name], e.name)
                _check_target(e, t)
                pairs.append((e, t))
        if pairs:
            work.append((f, pairs))
    tied = _tied(work)
    total = sum(e.nbytes for _, pairs in work for e, _ in pairs)
    done = 0
    written: list[str] = []
    for fi, (f, pairs) in enumerate(work):
        try:
            _fill_file(f, [p for pi, p in enumerate(pairs) if (fi, pi) not in tied], read)
        except (CheckpointError, OSError, EOFError) as exc:
            said = (f"the targets of earlier files were written ({_listed(written)})"
                    if written else "no earlier target was written")
            raise CheckpointError(f"{f.path}: reading into existing tensors failed ({exc}); "
                                  f"its targets may hold part of their data; {said}") from None
        written.extend(e.name for e, _ in pairs)
        done += sum(e.nbytes for e, _ in pairs)
        if progress is not None:
            progress(done, total)
    if progress is not None and done == 0:
        progress(0, total)
    return IncompatibleKeys(missing, unexpected)
