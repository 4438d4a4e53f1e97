"""Type stubs for etptr.cuda._allocator: CudaAllocator, the allocator for DeviceType.CUDA."""
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol, TypeAlias, final

from etptr._core._device import DeviceType
from etptr._core._device_allocator import DEFAULT_ALIGNMENT as DEFAULT_ALIGNMENT
from etptr._core._device_allocator import DeviceAllocator
from etptr.cuda._pinned_pool import PinnedBlock

CUDA_MALLOC_ALIGNMENT: Final[int]

class _CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

class _HasPtr(Protocol):
    @property
    def ptr(self) -> int: ...

class _HasCudaStream(Protocol):
    @property
    def cuda_stream(self) -> int: ...

# a CUDA stream: a raw cudaStream_t handle, an object with __cuda_stream__, or one with an
# int ``ptr`` (CuPy) or ``cuda_stream`` (PyTorch) attribute
_Stream: TypeAlias = int | _CudaStreamProtocol | _HasPtr | _HasCudaStream

@final
class CudaAllocator(DeviceAllocator):
    def __init__(self) -> None: ...
    @property
    def device_type(self) -> DeviceType: ...
    def resolve_index(self, index: int) -> int: ...
    def allocate(
        self, nbytes: int, index: int, alignment: int = 8, *, stream: _Stream | None = None
    ) -> int: ...
    def deallocate(self, ptr: int, index: int) -> None: ...
    def copy_host_to_device(
        self,
        dst: int,
        src: int,
        nbytes: int,
        index: int,
        *,
        stream: _Stream | None = None,
        threads: int | None = None,
        slot_bytes: int | None = None,
        slots: int | None = None,
        small_copy_bytes: int | None = None,
    ) -> None: ...
    def copy_device_to_host(
        self,
        dst: int,
        src: int,
        nbytes: int,
        index: int,
        *,
        stream: _Stream | None = None,
        threads: int | None = None,
        slot_bytes: int | None = None,
        slots: int | None = None,
        small_copy_bytes: int | None = None,
    ) -> None: ...
    def copy_file_to_device(
        self,
        dst: int,
        fd: int,
        pieces: Iterable[tuple[int, int, int] | tuple[int, int, int, bool]],
        index: int,
        *,
        progress: Callable[[int], object] | None = None,
        on_queued: Callable[[], object] | None = None,
        gaps: bool = True,
        direct_fd: int = -1,
        stream: _Stream | None = None,
    ) -> None: ...
    def allocate_host(self, nbytes: int, index: int) -> PinnedBlock | None: ...
    @property
    def live_blocks(self) -> int: ...
