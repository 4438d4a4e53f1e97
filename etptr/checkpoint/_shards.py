"""Sharded checkpoints in Hugging Face's layout: how tensors are split over shard files,
their names, the index, the directory's checks, and the order in which the files
appear under their real names.

The split is transformers' (``huggingface_hub.split_state_dict_into_shards_factory``):
tensors in the order given, a new shard whenever the next tensor would take the current
one past ``max_shard_size`` bytes of tensor data, and a tensor larger than that in a
shard of its own (appended when it is met). Shards are named
``model-0000k-of-0000N.safetensors``; the index, ``model.safetensors.index.json``, holds
``{"metadata": {"total_size": ...}, "weight_map": {name: shard}}`` written as
transformers writes it (sorted keys, two-space indent, a final newline). Unlike
transformers, a checkpoint of one shard is written in the same layout (the index and
``model-00001-of-00001.safetensors``), so that the index always exists.

:func:`commit` renames the complete shards and then writes the index: a crash at any
point leaves either the previous index with the shards it names untouched, or no index,
or the new index with all its shards. When a new shard replaces a file of the same name,
the previous index is removed first (it would name a shard of another save). Once the
index is in place, shard files of the pattern that the new index does not name are
removed, as transformers' ``save_pretrained`` does.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

from etptr.checkpoint._descriptors import ReadOnlyFile, TempFile
from etptr.checkpoint._errors import CheckpointError

__all__ = ["INDEX_NAME", "commit", "index_bytes", "parse_shard_size", "prepare_directory",
           "reading", "remove_created", "shard_names", "split", "sync_directory"]

#: The index file of a sharded checkpoint.
INDEX_NAME = "model.safetensors.index.json"

_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def parse_shard_size(value: object) -> int:
    """``max_shard_size`` in bytes: a positive int, or a str such as ``"5GB"`` (10**9),
    ``"500MiB"`` (2**20), ``"1.5GB"``, ``"4096"``.

    Raises
    ------
    CheckpointError
        Not a positive size, or a unit other than B, KB, MB, GB, TB, KiB, MiB, GiB, TiB
        (a lowercase ``b``, bits, is refused rather than read as bytes).
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise CheckpointError(f"max_shard_size={value!r}: expected a number of bytes (int) "
                              f"or a str such as '5GB'")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE.fullmatch(value)
        unit = m.group(2) if m else ""
        if m is None or unit.upper() not in _UNITS or (unit and unit[-1] == "b"):
            raise CheckpointError(f"max_shard_size={value!r}: expected a number and a unit "
                                  f"of B, KB, MB, GB, TB (10**3) or KiB, MiB, GiB, TiB (2**10)")
        size = int(Fraction(m.group(1)) * _UNITS[unit.upper()])   # exact, any length
    if size < 1:
        raise CheckpointError(f"max_shard_size={value!r}: a shard must be allowed at least "
                              f"1 byte")
    return size


def split(items: list[Any], max_bytes: int) -> list[list[Any]]:
    """``items`` (objects with ``.tensor``, in the order given) cut in shards as
    transformers cuts a state dict (see the module's docstring)."""
    shards: list[list[Any]] = []
    current: list[Any] = []
    size = 0
    for it in items:
        n = it.tensor.nbytes
        if n > max_bytes:
            shards.append([it])
            continue
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(it)
        size += n
    if current:
        shards.append(current)
    return shards


def shard_names(count: int) -> list[str]:
    """``model-00001-of-0000N.safetensors`` ... for ``count`` shards."""
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


def index_bytes(shards: list[tuple[str, list[Any]]]) -> bytes:
    """The index of ``shards`` ([(file name, items)]), as transformers writes it."""
    weight_map = {it.name: name for name, items in shards for it in items}
    total = sum(it.tensor.nbytes for _, items in shards for it in items)
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def prepare_directory(path: object, names: list[str], created: list[Path]) -> Path:
    """The directory of a sharded save, checked; created when missing, with its missing
    parents, each appended to ``created`` (outermost first) before it is made, for
    :func:`remove_created` to take back if the save fails.

    Raises
    ------
    CheckpointError
        ``path`` not a path, a file, not writable, or one of ``names`` (the shards and the
        index) already a directory or other non-regular file there.
    """
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str) \
            or not os.fspath(path):
        raise CheckpointError(f"path={path!r}: expected a non-empty str or os.PathLike path "
                              f"(the directory of a sharded checkpoint)")
    text = os.fspath(path)
    if "\0" in text:
        raise CheckpointError(f"path={text!r}: a path may not hold a NUL byte")
    directory = Path(text)
    missing = []
    probe = directory
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        for d in reversed(missing):
            created.append(d)               # listed first: an interrupt leaves none unlisted
            _make_directory(d, directory, created)
        _check_directory(directory, names)
    except BaseException:
        remove_created(created)
        raise
    return directory


def _make_directory(d: Path, directory: Path, created: list[Path]) -> None:
    try:
        os.mkdir(d)
    except OSError as exc:
        created.remove(d)                   # not made here: not ours to remove
        if isinstance(exc, FileExistsError) and os.path.isdir(d):
            return                          # made meanwhile by another save: use it
        raise CheckpointError(f"{directory}: the directory cannot be created "
                              f"({exc.strerror or exc} at {str(d)!r})") from None


def _check_directory(directory: Path, names: list[str]) -> None:
    try:
        st = os.stat(directory)
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot be reached ({exc.strerror or exc})") \
            from None
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{directory}: is not a directory; with max_shard_size, path "
                              f"names the directory of a sharded checkpoint")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CheckpointError(f"{directory}: the directory is not writable")
    for name in names:
        try:
            mode = os.lstat(directory / name).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CheckpointError(f"{directory / name}: cannot be examined "
                                  f"({exc.strerror or exc})") from None
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"{directory / name}: exists and is not a regular file "
                                  f"(a directory?); the checkpoint would replace it")


def remove_created(created: list[Path]) -> None:
    """Remove the directories :func:`prepare_directory` created, innermost first, where
    they are still empty."""
    for d in reversed(created):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError:
            return


def sync_directory(directory: Path) -> None:
    """``fsync`` the directory (its entries: creations, renames, removals); a file system
    that cannot sync a directory is let be."""
    try:
        d = ReadOnlyFile(directory)         # owns its descriptor: no interrupt leaks it
    except OSError:
        return
    with d:
        try:
            os.fsync(d.fileno())
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise


def _write_index(path: Path, data: bytes, durable: bool) -> None:
    with TempFile(path) as f:               # removed unless committed
        fd = f.fileno()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        f.commit(durable)


def commit(directory: Path, sinks: list[Any], index: bytes, durable: bool) -> None:
    """Put the complete shards (``sinks``, in shard order) under their names, then the
    index; remove stale shards. See the module's docstring for the order.

    Raises
    ------
    CheckpointError
        A rename, the index or a sync failed (naming the file).
    """
    try:
        # one commit at a time per directory (saves from other threads or processes wait):
        # each leaves its own complete set, never a mix or an index naming a shard that
        # another commit removed as stale
        with ReadOnlyFile(directory) as lock:
            locked = _lock(lock.fileno())
            try:
                _commit_locked(directory, sinks, index, durable)
            finally:
                if locked:
                    # unlocked, not only closed: a process forked meanwhile shares the
                    # descriptor's lock and would hold it as long as it lives
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot be locked ({exc.strerror or exc})") from exc


@contextlib.contextmanager
def reading(directory: Path) -> Iterator[None]:
    """A shared ``flock`` of a sharded checkpoint's directory while a load reads its index
    and its shards' headers: a save's commit (which holds it exclusively) then happens
    wholly before or after, never in between, so the load sees one save's files (a shard
    replaced after that is refused when the load reads it). Where the directory cannot be
    opened or locked the load goes ahead unlocked (its own checks then report)."""
    try:
        f = ReadOnlyFile(directory)
    except (OSError, ValueError):
        yield
        return
    with f:
        locked = _lock(f.fileno(), fcntl.LOCK_SH)
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _lock(fd: int, how: int = fcntl.LOCK_EX) -> bool:
    """An exclusive (or ``how``) ``flock`` of the directory's descriptor (waiting for
    another save's commit); False where the file system takes none (some network file systems): the
    commit then goes ahead unlocked."""
    try:
        fcntl.flock(fd, how)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return False
    return True


def _commit_locked(directory: Path, sinks: list[Any], index: bytes, durable: bool) -> None:
    index_path = directory / INDEX_NAME
    where = index_path
    try:
        if any(os.path.lexists(s.final) for s in sinks) and os.path.lexists(index_path):
            try:
                os.unlink(index_path)
            except FileNotFoundError:
                pass                        # removed meanwhile by a program other than etptr
            if durable:
                sync_directory(directory)
        for s in sinks:
            where = s.final
            s.commit()
        where = index_path
        if durable:
            sync_directory(directory)
        _write_index(index_path, index, durable)
        if durable:
            sync_directory(directory)
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be written ({exc.strerror or exc})") from exc
    keep = {s.final.name for s in sinks}
    for name in os.listdir(directory):
        if _SHARD_NAME.fullmatch(name) and name not in keep:
            try:
                if stat.S_ISREG(os.lstat(directory / name).st_mode):
                    os.unlink(directory / name)
            except OSError:
                pass                        # a stale shard left is no harm: no index names it
