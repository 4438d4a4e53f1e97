"""Where a save's bytes go: the file system's facts, the write path, and the new files.

A save writes each file under a temporary name (:class:`~etptr.checkpoint._descriptors.TempFile`)
through a *sink*, which takes byte ranges from host memory at file offsets:

* :class:`MapSink`: the file is sized and its space reserved (``posix_fallocate``; a full
  disk is an error there, never SIGBUS later), mapped shared, and filled by the copy
  threads (:func:`~etptr._core._host_copy.copy_buffer`), whose page faults run in parallel;
* :class:`PwriteSink`: ``pwrite`` from the source memory (a CPU tensor, or a staging block
  that device bytes came down into), no copy in user space; its space is reserved first
  on file systems that allocate blocks (``fallocate`` then ``pwrite`` measured faster on
  ext4) and not on tmpfs (slower there with it).

Which one a save uses (:func:`write_path`) depends on how many copy threads the process
has: the map when it has at least ``MAP_MIN_THREADS`` (faults spread over many CPUs),
``pwrite`` otherwise (one thread per file, no faults); ``bench/results/DECISIONS.md``,
``save write path``, has the figures. Before the first byte is written,
:func:`check_room` compares the bytes a save needs with the directory's free space
(``statvfs``) and with the process's file size limit (``RLIMIT_FSIZE``).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

from etptr._core._host_copy import copy_buffer, cpu_count
from etptr.checkpoint._descriptors import TempFile
from etptr.checkpoint._errors import CheckpointError

__all__ = ["MAP_MIN_THREADS", "WRITE_PATH", "MapSink", "PwriteSink", "check_room",
           "file_system", "open_sink", "write_path"]

#: "auto" (the rule below), "map" or "pwrite": the one door through which the benchmark
#: and the probes time a write path that the rule would not pick. Not an API.
WRITE_PATH = "auto"

#: Copy threads from which the mapped write path is used (bench/results/DECISIONS.md,
#: ``save write path``; ``save reservation`` for the reservations).
MAP_MIN_THREADS = 8

#: File systems whose files hold no blocks to allocate (pages of memory): no reservation.
_MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def copy_threads() -> int:
    """The copy threads a save uses: 16, or fewer when the process may use fewer CPUs."""
    return min(16, cpu_count())


def write_path() -> str:
    """``"map"`` or ``"pwrite"``: the write path of a save in this process."""
    if WRITE_PATH in ("map", "pwrite"):
        return WRITE_PATH
    return "map" if copy_threads() >= MAP_MIN_THREADS else "pwrite"


def _unescape(field: str) -> str:
    # /proc/self/mounts writes a space, tab, newline and backslash as octal escapes
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def file_system(directory: str | os.PathLike[str]) -> str:
    """The type of the file system holding ``directory`` (``"ext4"``, ``"tmpfs"``, ...), from
    the longest mount point over it in ``/proc/self/mounts``; ``""`` when it cannot be
    told."""
    path = os.path.realpath(directory)
    best, kind = -1, ""
    try:    # (read by pathlib: its file is closed whatever happens here meanwhile)
        lines = Path("/proc/self/mounts").read_text(encoding="utf-8",
                                                     errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = _unescape(fields[1]).rstrip("/") or "/"
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > best:
            best, kind = len(mount), fields[2]
    return kind


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n} bytes ({n / size:.1f} {unit})"
    return f"{n} bytes"


def check_room(directory: Path, sizes: list[int]) -> None:
    """Refuse, before anything is written, a save whose files (``sizes``, bytes each) do not
    fit: more bytes than ``directory``'s file system has free for this user, or a file
    larger than the process may write (``RLIMIT_FSIZE``).

    Raises
    ------
    CheckpointError
        Naming the directory, the bytes needed and the bytes free (or the limit).
    """
    need = sum(sizes)
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        raise CheckpointError(f"{directory}: its free space cannot be read "
                              f"({exc.strerror or exc})") from None
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise CheckpointError(f"{directory}: the checkpoint needs {_fmt_bytes(need)} and the "
                              f"file system has {_fmt_bytes(free)} free; nothing was written")
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return
    if limit != resource.RLIM_INFINITY and sizes and max(sizes) > limit:
        raise CheckpointError(f"{directory}: a file of the checkpoint needs "
                              f"{_fmt_bytes(max(sizes))} and this process may write files of "
                              f"{_fmt_bytes(limit)} at most (RLIMIT_FSIZE); nothing was written")


class _Sink:
    """A new file under a temporary name beside ``final``, ``size`` bytes once complete."""

    path_kind = ""

    def __init__(self, final: Path, size: int) -> None:
        self.final = final
        self.size = size
        self.file: TempFile | None = None

    def open(self) -> None:
        self.file = TempFile(self.final)

    def write_at(self, offset: int, src: object) -> None:
        raise NotImplementedError

    def finish(self, durable: bool) -> None:
        """The file is complete: let go of what wrote it; ``durable``: sync it."""
        if durable and self.file is not None:
            os.fsync(self.file.fileno())

    def commit(self) -> None:
        """Close the file and rename it to its real name."""
        assert self.file is not None
        self.file.commit(False)

    def discard(self) -> None:
        """Remove the temporary file (nothing after a commit); idempotent."""
        file, self.file = self.file, None
        if file is not None:
            file.discard()


class PwriteSink(_Sink):
    """The file written with ``pwrite`` from the caller's memory."""

    path_kind = "pwrite"

    def __init__(self, final: Path, size: int, reserve: bool) -> None:
        super().__init__(final, size)
        self.reserve = reserve

    def open(self) -> None:
        super().open()
        assert self.file is not None
        if self.size:
            if self.reserve:
                os.posix_fallocate(self.file.fileno(), 0, self.size)
            else:
                os.ftruncate(self.file.fileno(), self.size)

    def write_at(self, offset: int, src: object) -> None:
        assert self.file is not None
        fd = self.file.fileno()
        with memoryview(src) as whole, whole.cast("B") as view:    # type: ignore[arg-type]
            done, n = 0, len(view)
            while done < n:
                with view[done:] as rest:
                    done += os.pwrite(fd, rest, offset + done)


class MapSink(_Sink):
    """The file reserved, mapped shared and filled by the copy threads."""

    path_kind = "map"

    def __init__(self, final: Path, size: int) -> None:
        super().__init__(final, size)
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    def open(self) -> None:
        super().open()
        assert self.file is not None
        if not self.size:
            return
        fd = self.file.fileno()
        os.posix_fallocate(fd, 0, self.size)
        self._map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._view = memoryview(self._map)

    def write_at(self, offset: int, src: object) -> None:
        view = self._view
        assert view is not None
        with memoryview(src) as whole, whole.cast("B") as s:       # type: ignore[arg-type]
            with view[offset:offset + len(s)] as dst:
                copy_buffer(dst, s)

    def _unmap(self) -> None:
        # by the writer of the file's last chunk, or once the writers are joined: never
        # while a write runs
        view, self._view = self._view, None
        mm, self._map = self._map, None
        if view is not None:
            view.release()
        if mm is not None:
            try:
                mm.close()
            except BufferError:     # a view still lives (a traceback): it closes as it dies
                pass

    def finish(self, durable: bool) -> None:
        self._unmap()
        super().finish(durable)

    def discard(self) -> None:
        self._unmap()
        super().discard()


def open_sink(final: Path, size: int, path: str, fs_type: str) -> _Sink:
    """The sink for one new file (not yet opened: :meth:`_Sink.open` creates it)."""
    if path == "map":
        return MapSink(final, size)
    return PwriteSink(final, size, reserve=fs_type not in _MEMORY_FILE_SYSTEMS)
