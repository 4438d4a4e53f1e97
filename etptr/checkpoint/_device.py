"""The two seams between checkpoints and device memory.

``_load_to_device`` moves a checked plan's tensors onto a device, and
``_fetch_to_host`` brings one device tensor's bytes back for writing. Both
go through the public clone functions and so work with any registered
allocator; they copy tensor by tensor.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from etptr._core._device import Device
from etptr._core._tensor_ptr import TensorPtr, clone_tensor_ptr_to, clone_tensor_ptr_to_cpu
from etptr.checkpoint._host import host_view, map_file
from etptr.checkpoint._plan import CheckpointPlan
from etptr.checkpoint._progress import Progress

__all__ = ["_fetch_to_host", "_load_to_device"]


def _load_to_device(plan: CheckpointPlan, device: Device,
                    progress: Progress | None) -> dict[str, TensorPtr]:
    """Every tensor of ``plan`` cloned onto ``device``.

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
        the header's shape and ScalarType, owning its device memory.

    Raises
    ------
    NotFoundError
        No allocator is registered for ``device``.
    CheckpointError
        A file changed since its header was read.
    MemoryAllocationError
        Device memory ran out; what was allocated so far is freed.
    """
    total = plan.nbytes
    done = 0
    out: dict[str, TensorPtr] = {}
    for f in plan.files:
        mapped = map_file(f)
        for t in f.tensors:
            out[t.name] = clone_tensor_ptr_to(host_view(f, t, mapped), device)
            if t.nbytes:
                done += t.nbytes
                if progress is not None:
                    progress(done, total)
        del mapped
    if progress is not None and done == 0:
        progress(0, total)
    return out


def _fetch_to_host(tensor: TensorPtr) -> npt.NDArray[np.generic]:
    """The bytes of a device tensor on the host, in row-major (C) order.

    Parameters
    ----------
    tensor : TensorPtr on a device, with data (``nbytes > 0``)

    Returns
    -------
    numpy.ndarray
        C-contiguous, ``tensor.nbytes`` bytes, the tensor's elements in
        row-major order whatever its dim_order.

    Raises
    ------
    NotFoundError
        No allocator is registered for the tensor's device.
    """
    return np.ascontiguousarray(clone_tensor_ptr_to_cpu(tensor).numpy())
