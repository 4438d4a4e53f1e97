"""Test helpers: a host-memory stand-in for a device, and scoped allocator installs.

Nothing here needs a GPU. :class:`HostDeviceAllocator` mirrors ExecuTorch's
``MockCudaAllocator`` (``runtime/core/test/mock_cuda_allocator.h``): it serves
a device type with ordinary host memory and counts every call.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import ctypes
import numbers
import threading
from typing import Any, TypeVar

from etptr._core._device import DeviceType
from etptr._core._device_allocator import DEFAULT_ALIGNMENT, DeviceAllocator, _replace_allocator
from etptr._core._error import (
    Error, InvalidArgumentError, InvalidTypeError, MemoryAllocationError)

__all__ = ["HostDeviceAllocator", "use_allocator"]

_A = TypeVar("_A", bound=DeviceAllocator)


class HostDeviceAllocator(DeviceAllocator):
    """HostDeviceAllocator(device_type=DeviceType.CUDA)

    A :class:`~etptr.DeviceAllocator` that simulates a device with host memory.

    Counters: ``allocate_count``, ``deallocate_count``, ``h2d_count``,
    ``d2h_count``. Last arguments: ``last_allocate_size`` (bytes),
    ``last_allocate_index``, ``last_allocate_ptr``, ``last_deallocate_ptr``,
    ``last_deallocate_index``, ``last_h2d_dst``, ``last_h2d_src``,
    ``last_h2d_size`` (bytes), ``last_h2d_index`` and the same four for
    ``d2h``. ``live_bytes`` is the memory it currently holds, so tests can
    check that etptr frees everything it allocates.

    Thread-safe: every method may be called from several threads at once (and
    from a garbage collection that frees a tensor inside another call). Each
    counter counts the calls of its method exactly; the ``last_*`` values come
    from one call (the last one to record them). Copies run outside the lock.

    Raises
    ------
    InvalidArgumentError
        ``deallocate`` of an address it did not allocate; a copy that runs
        outside a block it allocated.
    MemoryAllocationError
        ``allocate`` beyond ``fail_after`` allocations (when set), to test
        failure paths.
    """

    _device_type: DeviceType
    _lock: threading.RLock
    _blocks: dict[int, Any]
    fail_after: int | None
    allocate_count: int
    deallocate_count: int
    h2d_count: int
    d2h_count: int
    last_allocate_size: int
    last_allocate_index: int
    last_allocate_ptr: int
    last_deallocate_ptr: int
    last_deallocate_index: int
    last_h2d_dst: int
    last_h2d_src: int
    last_h2d_size: int
    last_h2d_index: int
    last_d2h_dst: int
    last_d2h_src: int
    last_d2h_size: int
    last_d2h_index: int

    def __init__(self, device_type: DeviceType | int = DeviceType.CUDA) -> None:
        super().__init__()
        if isinstance(device_type, bool) or not isinstance(device_type, numbers.Integral):
            raise InvalidTypeError(f"device_type must be an etptr.DeviceType, got {device_type!r}")
        if device_type not in DeviceType.__members__.values():
            raise InvalidArgumentError(f"device_type={device_type!r} is not a DeviceType code")
        self._device_type = DeviceType(device_type)
        # Guards _blocks, the counters and the last_* values. Reentrant: a garbage
        # collection that runs while this thread holds it may free a tensor, and
        # with it call deallocate.
        self._lock = threading.RLock()
        self._blocks = {}      # aligned address -> ctypes buffer (.requested)
        self.fail_after: int | None = None
        self.allocate_count = 0
        self.deallocate_count = 0
        self.h2d_count = 0
        self.d2h_count = 0
        self.last_allocate_size = 0
        self.last_allocate_index = 0
        self.last_allocate_ptr = 0
        self.last_deallocate_ptr = 0
        self.last_deallocate_index = 0
        self.last_h2d_dst = 0
        self.last_h2d_src = 0
        self.last_h2d_size = 0
        self.last_h2d_index = 0
        self.last_d2h_dst = 0
        self.last_d2h_src = 0
        self.last_d2h_size = 0
        self.last_d2h_index = 0

    @property
    def device_type(self) -> DeviceType:
        return self._device_type

    @property
    def live_bytes(self) -> int:
        """Bytes currently allocated and not yet deallocated."""
        return sum(raw.requested for raw in self._snapshot().values())

    def _snapshot(self) -> dict[int, Any]:
        # A copy to iterate: other threads (or a collection in this one) may
        # allocate or free while it is read.
        with self._lock:
            return self._blocks.copy()

    def allocate(self, nbytes: int, index: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        for name, value in (("nbytes", nbytes), ("alignment", alignment)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidTypeError(f"{name}={value!r} is not an int")
        if nbytes < 0:
            raise InvalidArgumentError(f"nbytes={nbytes} is negative")
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidArgumentError(f"alignment={alignment} is not a power of two")
        with self._lock:
            if self.fail_after is not None and self.allocate_count >= self.fail_after:
                raise MemoryAllocationError(
                    f"HostDeviceAllocator: allocation {self.allocate_count + 1} refused "
                    f"(fail_after={self.fail_after})", Error.MemoryAllocationFailed)
            raw: Any
            try:
                raw = ctypes.create_string_buffer(max(int(nbytes), 1) + alignment)
            except (MemoryError, OverflowError):
                raise MemoryAllocationError(
                    f"HostDeviceAllocator: cannot allocate nbytes={nbytes} bytes of host memory",
                    Error.MemoryAllocationFailed) from None
            base = ctypes.addressof(raw)
            ptr = (base + alignment - 1) & ~(alignment - 1)
            raw.requested = int(nbytes)
            self.allocate_count += 1
            self.last_allocate_size = nbytes
            self.last_allocate_index = index
            self.last_allocate_ptr = ptr
        # The block is recorded last, with nothing between the record and the return
        # where an interrupt (a signal handler's KeyboardInterrupt) can be raised: one
        # raised after the record would lose the address, and the block would count as
        # leaked though nobody ever got it. (A dict store is atomic; the lock guards the
        # counters and the snapshots.)
        self._blocks[ptr] = raw
        return ptr

    def deallocate(self, ptr: int, index: int) -> None:
        # the block first, in one step (dict.pop is atomic): an interrupt landing in the
        # bookkeeping below cannot keep it alive
        raw = self._blocks.pop(ptr, None) if ptr else None
        with self._lock:
            self.deallocate_count += 1
            self.last_deallocate_ptr = ptr
            self.last_deallocate_index = index
        if ptr == 0:
            return
        if raw is None:
            raise InvalidArgumentError(f"ptr=0x{ptr:x} was not allocated by this allocator")

    def _check_span(self, ptr: int, nbytes: int, argname: str) -> None:
        for start, raw in self._snapshot().items():
            if start <= ptr and ptr + nbytes <= start + max(raw.requested, 1):
                return
        raise InvalidArgumentError(
            f"{argname}=0x{ptr:x}: {nbytes} bytes there are not inside a block of this allocator")

    def copy_host_to_device(self, dst: int, src: int, nbytes: int, index: int) -> None:
        with self._lock:
            self.h2d_count += 1
            self.last_h2d_dst, self.last_h2d_src = dst, src
            self.last_h2d_size, self.last_h2d_index = nbytes, index
        if nbytes:
            self._check_span(dst, nbytes, "dst")
            ctypes.memmove(dst, src, nbytes)

    def copy_device_to_host(self, dst: int, src: int, nbytes: int, index: int) -> None:
        with self._lock:
            self.d2h_count += 1
            self.last_d2h_dst, self.last_d2h_src = dst, src
            self.last_d2h_size, self.last_d2h_index = nbytes, index
        if nbytes:
            self._check_span(src, nbytes, "src")
            ctypes.memmove(dst, src, nbytes)


@contextmanager
def use_allocator(alloc: _A) -> Iterator[_A]:
    """Install ``alloc`` for ``alloc.device_type`` for the duration of the block.

    The previous registration (or none) is restored afterwards, also when the
    block raises. Nests.
    """
    if not isinstance(alloc, DeviceAllocator):
        raise InvalidTypeError(f"alloc must be an etptr.DeviceAllocator, got {type(alloc).__name__}")
    prev = _replace_allocator(alloc.device_type, alloc)
    try:
        yield alloc
    finally:
        _replace_allocator(alloc.device_type, prev)
