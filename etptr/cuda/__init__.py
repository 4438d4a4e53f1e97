"""CUDA support for etptr, over CuPy.

:class:`CudaAllocator` serves ``DeviceType.CUDA``; it registers itself the
first time the CUDA allocator is looked up, when CuPy imports and a CUDA
device exists. Importing this package does not import CuPy: CuPy is imported
on the first call that needs it, and ``import etptr`` does not import this
package (the registry does, on the first lookup of CUDA's allocator).

The copy engine's settings (threads T, slot bytes S, slots K, small-copy
threshold) are process-wide (:func:`set_copy_config`, or the environment
variable ``ETPTR_COPY_CONFIG="threads=16,slot_bytes=16777216,slots=3"`` read on
first import), per thread for a block (:func:`copy_config`), or per call
(keywords of :meth:`CudaAllocator.copy_host_to_device` / ``copy_device_to_host``).
The defaults (16 threads, or one per CPU the process may use when fewer;
16 MiB slots, 3 slots, 64 KiB small-copy threshold) were measured on H200 hosts
(PCIe Gen5 x16); ``bench/results/DECISIONS.md`` records how, as it does for the
engine's internal tuning (:mod:`etptr.cuda._tuning`).

The byte ranges the engine speaks of:

* a **piece**: one contiguous range a caller asks to move (a tensor's bytes, a
  run of a file); a batch is a list of pieces;
* a **run**: consecutive pieces of a file that go into consecutive device
  bytes (a checkpoint's layout, :func:`etptr.checkpoint.layout_file`);
* a **chunk**: the part of a pipelined copy that moves through one slot at a
  time (at most S bytes);
* a **slot**: one page-locked staging buffer of S bytes; K of them form a
  device's ring, used round-robin, each with the event of its last DMA;
* a **block**: page-locked memory from the :class:`PinnedHostPool` (a slot taken
  from the pool, or a device -> host result); sized by size class.

Processes: CUDA does not survive ``os.fork()``. In a child forked after CUDA
was initialised (by etptr, or by CuPy before the fork), every CUDA call
through etptr raises :class:`~etptr.InvalidStateError` naming fork; start
such workers with the 'spawn' start method. Tensors inherited from the parent
are released there without calling CUDA, and host-only etptr works as usual.
A child forked before CUDA was first used may use CUDA itself.
"""
import contextlib as _contextlib
from collections.abc import Iterator as _Iterator

from etptr.cuda import _copy_engine, _driver
from etptr.cuda._allocator import CUDA_MALLOC_ALIGNMENT, CudaAllocator
from etptr.cuda._copy_engine import get_copy_config, set_copy_config
from etptr.cuda._pinned_pool import (
    DEFAULT_MAX_CACHED_BYTES,
    CudaHostAllocator,
    PinnedBlock,
    PinnedHostPool,
    get_pinned_host_pool,
    size_class,
)

__all__ = [
    "CUDA_MALLOC_ALIGNMENT",
    "CudaAllocator",
    "CudaHostAllocator",
    "DEFAULT_MAX_CACHED_BYTES",
    "PinnedBlock",
    "PinnedHostPool",
    "copy_config",
    "get_copy_config",
    "get_pinned_host_pool",
    "is_available",
    "set_copy_config",
    "size_class",
    "unavailable_reason",
]


def is_available() -> bool:
    """is_available() -> bool

    True when CuPy imports and at least one CUDA device is present. False in a
    process created by ``os.fork()`` after CUDA was initialised (CUDA cannot
    be used there); asking initialises the CUDA driver, so fork before it.
    """
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """unavailable_reason() -> str | None

    Why CUDA cannot be used through etptr here (CuPy missing, no device, no
    driver, a forked child), or None when it can. Like :func:`is_available`,
    asking initialises the CUDA driver.
    """
    if _driver._cuda_forked():
        return "CUDA was initialised before this process was forked; use the 'spawn' start method"
    try:
        import cupy  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except Exception as exc:
        return (f"CuPy is not importable ({type(exc).__name__}: {exc}); "
                f"pip install 'etptr[cuda13]' or 'etptr[cuda12]'")
    _driver._note_cuda_init()     # getDeviceCount initialises the driver
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy finds no usable CUDA device ({exc})"
    return None if n > 0 else "CuPy finds no CUDA device"


@_contextlib.contextmanager
def copy_config(*, threads: int | None = None, slot_bytes: int | None = None,
                slots: int | None = None,
                small_copy_bytes: int | None = None) -> _Iterator[None]:
    """copy_config(*, threads=None, slot_bytes=None, slots=None, small_copy_bytes=None)

    Context manager: copies made inside the block by this thread (or this
    asyncio task) use these settings (None keeps the surrounding value); other
    threads and tasks keep theirs. See :func:`set_copy_config`.

    Raises
    ------
    InvalidArgumentError
        A value out of range.
    InvalidStateError
        On leaving, the block is left in another thread or task than it was
        entered in (a generator resumed elsewhere).

    Examples
    --------
    >>> import etptr.cuda
    >>> with etptr.cuda.copy_config(threads=4):
    ...     etptr.cuda.get_copy_config()["threads"]
    4
    """
    key = _copy_engine._push_config(threads, slot_bytes, slots, small_copy_bytes)
    try:
        yield
    finally:
        _copy_engine._pop_config(key)


def _autoregister() -> None:
    """Register a :class:`CudaAllocator` when CuPy imports and a CUDA device exists.

    Called once by the registry on the first lookup of ``DeviceType.CUDA``;
    does nothing, silently, without CuPy or a device, or when an allocator is
    already registered. In a child forked after CUDA was initialised it
    registers one all the same: its methods raise InvalidStateError naming
    fork, which says more than NotFoundError would.
    """
    if not is_available() and not _driver._cuda_forked():
        return
    from etptr._core._device_allocator import DeviceAllocatorRegistry
    from etptr._core._error import InvalidStateError
    try:
        DeviceAllocatorRegistry.instance().register_allocator(CudaAllocator())
    except InvalidStateError:
        pass
