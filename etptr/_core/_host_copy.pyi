"""Type stubs for etptr._core._host_copy: the host copy threads."""
from collections.abc import Sequence
from typing import TypedDict

from typing_extensions import Buffer

class CopyThreads(TypedDict):
    workers: int
    failed: int

def copy_buffer(dst: Buffer, src: Buffer, threads: int | None = None) -> None: ...
def parallel_copy(
    dst: int, src: int, nbytes: int, threads: int, nontemporal: bool = False, pieces: int = 1
) -> None: ...
def parallel_copy_list(
    segments: Sequence[tuple[int, int, int]],
    threads: int,
    nontemporal: bool = False,
    pieces: int = 1,
) -> None: ...
def parallel_read(
    fd: int,
    segments: Sequence[tuple[int, int, int]],
    threads: int,
    pieces: int = 8,
    nontemporal: bool = False,
    read_bounce: int = 0,
    direct: bool = False,
) -> None: ...
def copy_threads() -> CopyThreads: ...
def cpu_count() -> int: ...
def _after_fork_in_child() -> None: ...
