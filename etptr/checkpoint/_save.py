"""``save_safetensors``: tensors (CPU or device) into a safetensors file, or a sharded
checkpoint in Hugging Face's layout, atomically; in the caller's thread or in the
background.

Everything is checked before the first byte moves: the tensors, the metadata, the
path (and for a sharded save the directory and the names it will hold), every header,
and the room on the file system. Each file is written under a temporary name beside its
real one and renamed only once complete (a sharded save's index last): a failure at any
point removes every temporary file and leaves the real names as they were. The writing
itself is :mod:`etptr.checkpoint._pipeline`'s (through :mod:`etptr.checkpoint._sinks`),
the layout of shards :mod:`etptr.checkpoint._shards`', background saves
:mod:`etptr.checkpoint._background`'s.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from etptr._core._device_allocator import get_device_allocator
from etptr._core._error import NotFoundError
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint import _background, _shards
from etptr.checkpoint._background import SaveHandle
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._frameworks import as_tensor_ptr
from etptr.checkpoint._format import DTYPE_NAMES, MAX_HEADER_BYTES, SAFETENSORS_DTYPES, dtype_rank
from etptr.checkpoint._pipeline import (
    SYNC_STAGING_BYTES, FileSpec, background_staging_bytes, run_save)
from etptr.checkpoint._sinks import check_room, file_system, write_path

__all__ = ["save_safetensors"]

class _Item(NamedTuple):
    name: str
    tensor: TensorPtr
    dtype: str


def _check_tensors(tensors: object) -> list[_Item]:
    if not isinstance(tensors, Mapping):
        raise CheckpointError(f"tensors: expected a dict of name -> TensorPtr, got "
                              f"{type(tensors).__name__}")
    try:
        # one pass over a copy: what the tensors' own code (a __dlpack__) does to the
        # mapping meanwhile cannot change what is saved
        pairs = list(tensors.items())
    except RuntimeError as exc:             # changed by another thread while listed
        raise CheckpointError(f"tensors: changed while its items were listed ({exc})") \
            from None
    items = []
    seen: set[str] = set()
    for name, t in pairs:
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"tensors: the name {name!r} is not a non-empty str")
        if name in seen:
            raise CheckpointError(f"tensors: the name {name!r} occurs twice (the mapping's "
                                  f"items() gave it twice)")
        seen.add(name)
        if name == "__metadata__":
            raise CheckpointError("tensors: '__metadata__' is reserved by the format for "
                                  "metadata; it cannot name a tensor")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise CheckpointError(f"tensors: the name {name!r} cannot be encoded as UTF-8") \
                from None
        t = as_tensor_ptr(t, name)     # NumPy arrays, torch and CuPy tensors, in place
        # A view of the same memory with the tensor's layout now: the header, the file's
        # size and the copies all read this snapshot, which nothing else can resize (a
        # resize of ``t`` in another thread while the file is written would otherwise
        # make the copies disagree with the header and write past the mapped file).
        t = make_tensor_ptr(t)
        dtype = DTYPE_NAMES.get(t.scalar_type)
        if dtype is None:
            raise CheckpointError(
                f"tensor {name!r}: ScalarType.{t.scalar_type.name} has no safetensors dtype "
                f"(supported: {', '.join(st.name for st in SAFETENSORS_DTYPES.values())})")
        if t.nbytes and not t.data_ptr:
            raise CheckpointError(f"tensor {name!r}: sizes {t.sizes} span {t.nbytes} bytes but "
                                  f"its data is null")
        if t.nbytes and not t.device.is_cpu() and get_device_allocator(t.device.type) is None:
            raise NotFoundError(f"tensor {name!r} is on {t.device} and no allocator is "
                                f"registered for it, so its data cannot be read")
        items.append(_Item(name, t, dtype))
    return items


def _check_metadata(metadata: object) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise CheckpointError(f"metadata: expected a dict of str -> str, got "
                              f"{type(metadata).__name__}")
    out = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise CheckpointError(f"metadata[{key!r}] = {value!r}: keys and values must be str")
        try:
            key.encode("utf-8")
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise CheckpointError(f"metadata[{key!r}] cannot be encoded as UTF-8") from None
        out[key] = value
    return out


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str) \
            or not os.fspath(path):
        raise CheckpointError(f"path={path!r}: expected a non-empty str or os.PathLike path")
    text = os.fspath(path)
    if "\0" in text:
        raise CheckpointError(f"path={text!r}: a path may not hold a NUL byte")
    final = Path(text)
    parent = final.parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise CheckpointError(f"{final}: the directory {str(parent)!r} does not exist") \
            from None
    except OSError as exc:          # a component too long, a directory that cannot be searched
        raise CheckpointError(f"{final}: the directory {str(parent)!r} cannot be reached "
                              f"({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{final}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"{final}: the directory {str(parent)!r} is not writable")
    try:
        mode = os.stat(final).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise CheckpointError(f"{final}: cannot be examined ({exc.strerror or exc})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise CheckpointError(f"{final}: is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        # the file is renamed over the target: that would replace a device node, FIFO or
        # socket (say /dev/null) with a regular file instead of writing to it
        raise CheckpointError(f"{final}: is not a regular file (a device, FIFO or socket); "
                              f"save_safetensors writes regular files only")
    return final


def _header(order: list[_Item], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple of 8."""
    doc: dict[str, object] = {}
    if metadata is not None:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for it in order:
        n = it.tensor.nbytes
        doc[it.name] = {"dtype": it.dtype, "shape": list(it.tensor.sizes),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise CheckpointError(f"the header would be {len(text)} bytes, over the format's limit "
                              f"of {MAX_HEADER_BYTES}: too many tensors or too much metadata")
    return len(text).to_bytes(8, "little") + text


def _check_staging(staging_bytes: object) -> int | None:
    if staging_bytes is None:
        return None
    if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) \
            or staging_bytes < 1:
        raise CheckpointError(f"staging_bytes={staging_bytes!r}: expected a positive int "
                              f"(bytes), or None for the default")
    return staging_bytes


def _order(items: list[_Item]) -> list[_Item]:
    """The safetensors library's order: wider dtypes first, then by name."""
    return sorted(items, key=lambda it: (-dtype_rank(it.dtype), it.name))


def _commit_one(final: Path, durable: bool) -> Callable[[list[Any]], None]:
    def commit(sinks: list[Any]) -> None:
        try:
            sinks[0].commit()
            if durable:
                _shards.sync_directory(final.parent)
        except OSError as exc:
            raise CheckpointError(f"{final}: cannot be written ({exc.strerror or exc})") \
                from exc
    return commit


def _plan_shards(items: list[_Item], meta: dict[str, str] | None, path: object,
                 max_shard_size: object, durable: bool, created: list[Path]
                 ) -> tuple[list[FileSpec], Path, list[int], Callable[[list[Any]], None],
                            tuple[Path, ...]]:
    """The files of a sharded save, its directory (prepared: the directories it makes are
    appended to ``created``), the bytes of every file, the commit and the paths."""
    limit = _shards.parse_shard_size(max_shard_size)
    if str(path).endswith(".safetensors"):
        raise CheckpointError(f"{path}: max_shard_size= writes a directory (the shards and "
                              f"{_shards.INDEX_NAME}), and this path names a .safetensors "
                              f"file: give the directory's path")
    if not items:
        raise CheckpointError(f"{path}: max_shard_size was given but there is no tensor to "
                              f"shard")
    groups = [_order(g) for g in _shards.split(items, limit)]
    names = _shards.shard_names(len(groups))
    headers = [_header(g, meta) for g in groups]
    index = _shards.index_bytes(list(zip(names, groups)))
    directory = _shards.prepare_directory(path, names + [_shards.INDEX_NAME], created)
    specs = [FileSpec(directory / n, h, g) for n, h, g in zip(names, headers, groups)]
    sizes = [s.size for s in specs] + [len(index)]
    paths = tuple(s.final for s in specs) + (directory / _shards.INDEX_NAME,)

    def commit(sinks: list[Any]) -> None:
        _shards.commit(directory, sinks, index, durable)
    return specs, directory, sizes, commit, paths


def save_safetensors(tensors: Mapping[str, TensorPtr], path: str | os.PathLike[str], *,
                     metadata: Mapping[str, str] | None = None,
                     max_shard_size: int | str | None = None, durable: bool = False,
                     background: bool = False,
                     staging_bytes: int | None = None) -> SaveHandle | None:
    """Write tensors to a safetensors file, or to a sharded checkpoint in Hugging Face's
    layout, that the ``safetensors`` library reads bit for bit.

    Within a file, tensors are written in the order the ``safetensors`` library
    itself uses (wider dtypes first, then by name), so every tensor's data is
    aligned to its element size; the header is padded with spaces to a multiple of
    8 bytes. Each tensor's elements go in row-major (C) order whatever its
    dim_order. Every file is written under a temporary name in its directory and
    renamed once complete, so a real name never holds a partial file. Device
    bytes come down in batches of up to 64 MiB into staging blocks of host memory
    (page-locked for CUDA) while earlier blocks are written; CPU tensors are
    written from their own memory. Several files are written at once.

    Parameters
    ----------
    tensors : dict of str to tensor
        Names (non-empty str, not ``"__metadata__"``) -> CPU or device tensors: a
        TensorPtr, a NumPy array, or a torch / CuPy tensor (read in place through
        DLPack or the CUDA Array Interface, without a copy), of a supported ScalarType (Double, Float, Half, BFloat16,
        Long, Int, Short, Char, Byte, UInt16, UInt32, UInt64, Bool,
        Float8_e4m3fn, Float8_e5m2). Device tensors are read back through
        their allocator.
    path : str or os.PathLike
        The file to write (its directory must exist; an existing file is
        replaced, only when the new one is complete); with ``max_shard_size``,
        the checkpoint's directory (created when missing).
    metadata : dict of str to str, optional
        Written as the header's ``__metadata__`` (of every shard); a loaded
        checkpoint's is ``etptr.safe_open(path).metadata()``. transformers expects
        ``{"format": "pt"}``.
    max_shard_size : int or str, optional
        Bytes of tensor data per shard (an int, or ``"5GB"``, ``"500MiB"``...):
        the tensors, in the order given, are split as transformers'
        ``save_pretrained`` splits a state dict (a tensor larger than this gets a
        shard of its own) into ``model-0000k-of-0000N.safetensors``, written in
        parallel, and ``model.safetensors.index.json`` (``metadata.total_size``,
        ``weight_map``) is written once every shard is in place; shard files of
        that pattern which the new index does not name are then removed. One
        shard gives the same layout (``model-00001-of-00001.safetensors``). ``path``
        is then the directory; a path ending in ``.safetensors`` is refused.
        Saves into one directory commit one at a time (they hold an ``flock`` of it
        while renaming; a load of its index waits for a commit under way), from
        threads or processes: each leaves one complete checkpoint.
        ``load_safetensors(directory / "model.safetensors.index.json")`` reads it.
    durable : bool
        True: every file, and the directory's entries for them, reach the storage
        device before the call returns (or, in the background, before the save is
        done): the checkpoint survives a power loss, and the save runs at the
        disk's speed. False (the default, as the ``safetensors`` library and
        ``torch.save`` do): the data is in the page cache.
    background : bool
        True: return a :class:`SaveHandle` at once; the save runs in a thread of
        its own. ``handle.staged()`` turns true once every byte has been copied
        out of the tensors (then they may be changed or freed),
        ``handle.done()`` once the files are complete and renamed;
        ``handle.result()`` waits and raises what the save raised. Argument
        errors, a bad path and too little room are raised by the call itself.
    staging_bytes : int, optional
        The most host memory (page-locked for CUDA, from the pinned pool) the save
        holds at once for bytes on their way to the files; when it is full the
        copy-out waits for written blocks to come back. Default: 256 MiB for a
        call that returns when done; for a background save the whole checkpoint,
        up to a quarter of the machine's memory (so that the tensors are freed
        after one pass at the line rate).

    Returns
    -------
    SaveHandle or None
        The handle of a background save; None otherwise.

    Raises
    ------
    CheckpointError
        Before anything is written: ``tensors`` not a dict, a bad name, a
        value that is not a tensor, an unsupported ScalarType, null data
        for a tensor with bytes (the message names the tensor), bad
        ``metadata``, ``max_shard_size`` or ``staging_bytes``, a missing or
        read-only directory, ``path`` a directory (a file, for a sharded save;
        or a shard's name already a directory), a header over 100 MB, too
        little free space (naming the directory, the bytes needed and the
        bytes free) or a file over the process's size limit. While writing:
        the file system refuses (e.g. no space left; the message names the
        file). Nothing is left under a temporary name, and no real name holds
        a partial file; a sharded save's index never names a missing shard.
    NotFoundError
        A device tensor whose device has no registered allocator.

    Examples
    --------
    >>> import os, tempfile
    >>> import etptr
    >>> d = tempfile.mkdtemp()
    >>> tensors = {"w": etptr.ones([4, 4]), "b": etptr.zeros([4])}
    >>> etptr.save_safetensors(tensors, os.path.join(d, "m.safetensors"))
    >>> etptr.save_safetensors(tensors, os.path.join(d, "sharded"), max_shard_size=64)
    >>> sorted(os.listdir(os.path.join(d, "sharded")))  # doctest: +NORMALIZE_WHITESPACE
    ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors',
     'model.safetensors.index.json']
    >>> h = etptr.save_safetensors(tensors, os.path.join(d, "bg.safetensors"), background=True)
    >>> h.result()
    >>> h.done()
    True
    """
    items = _check_tensors(tensors)
    meta = _check_metadata(metadata)
    staging = _check_staging(staging_bytes)
    durable, background = bool(durable), bool(background)
    created: list[Path] = []        # directories a sharded save made, taken back on failure
    try:
        if max_shard_size is None:
            final = _check_path(path)
            order = _order(items)
            specs = [FileSpec(final, _header(order, meta), order)]
            directory, sizes = final.parent, [specs[0].size]
            commit = _commit_one(final, durable)
            paths: tuple[Path, ...] = (final,)
        else:
            specs, directory, sizes, commit, paths = _plan_shards(
                items, meta, path, max_shard_size, durable, created)
        check_room(directory, sizes)
        how, fs_type = write_path(), file_system(directory)
        if background:
            return _background.start(
                specs, commit, paths, cleanup=lambda: _shards.remove_created(created),
                staging_bytes=staging or background_staging_bytes(sum(sizes)),
                durable=durable, path=how, fs_type=fs_type)
        run_save(specs, commit, staging_bytes=staging or SYNC_STAGING_BYTES, durable=durable,
                 path=how, fs_type=fs_type)
    except BaseException:
        _shards.remove_created(created)
        raise
    return None
