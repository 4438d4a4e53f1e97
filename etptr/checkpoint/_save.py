"""``save_safetensors``: TensorPtrs (CPU or device) into a safetensors file, atomically.

Everything is checked before the first byte moves. The file is written
under a temporary name in the target directory, synced, and renamed over
the target only once complete: a failure at any point removes the
temporary file and leaves the target as it was.
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from etptr._core._device_allocator import get_device_allocator
from etptr._core._device_copy import clone_tensor_ptr_to_cpu, d2h_copy
from etptr._core._error import NotFoundError
from etptr._core._host_copy import copy_buffer
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._descriptors import TempFile
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._frameworks import as_tensor_ptr
from etptr.checkpoint._format import DTYPE_NAMES, MAX_HEADER_BYTES, SAFETENSORS_DTYPES, dtype_rank

__all__ = ["save_safetensors"]

class _Item(NamedTuple):
    name: str
    tensor: TensorPtr
    dtype: str


def _check_tensors(tensors: object) -> list[_Item]:
    if not isinstance(tensors, Mapping):
        raise CheckpointError(f"tensors: expected a dict of name -> TensorPtr, got "
                              f"{type(tensors).__name__}")
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"tensors: the name {name!r} is not a non-empty str")
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


#: Bytes of device tensors fetched per batched copy while saving.
SAVE_GROUP = 64 << 20


def _row_major(t: TensorPtr) -> bool:
    return t.dim_order == tuple(range(t.dim()))


def _fill(mapped: memoryview, offset: int, order: list[_Item]) -> None:
    """Copy every tensor's row-major bytes into the mapped file at ``offset`` onwards, in
    ``order``. CPU tensors go by the copy threads. Row-major device tensors go in groups
    of up to SAVE_GROUP bytes, each group one batched :func:`~etptr.d2h_copy` into CPU
    tensors that view the file's pages (a kernel gathers the small ones on the device,
    the bytes come down through pinned slots, and the copy threads scatter them into
    the pages); other device tensors come down one by one and are made contiguous."""
    srcs: list[TensorPtr] = []
    outs: list[TensorPtr] = []
    size = 0
    try:
        for it in order:
            t = it.tensor
            n = t.nbytes
            if not n:
                continue
            dst = mapped[offset:offset + n]
            offset += n
            if t.device.is_cpu() or not _row_major(t):
                if not t.device.is_cpu():
                    t = clone_tensor_ptr_to_cpu(t)
                # a dim_order other than 0..n-1 gives a strided view; ascontiguousarray
                # copies it
                copy_buffer(dst, np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8))
                dst.release()
                continue
            srcs.append(t)
            outs.append(make_tensor_ptr(list(t.sizes), dst, type=t.scalar_type))
            size += n
            if size >= SAVE_GROUP:
                d2h_copy(srcs, outs)
                srcs.clear()
                outs.clear()
                size = 0
        if srcs:
            d2h_copy(srcs, outs)
    finally:
        # the outs export the mapped file's buffer: let go of them even on an error (a
        # traceback would otherwise keep them, and the map could not be closed)
        srcs.clear()
        outs.clear()


def _write_mapped(fd: int, header: bytes, order: list[_Item]) -> None:
    """The whole file through a shared mapping of it: space reserved first (a full disk is
    an error here, not a fault later), the header, then every tensor's bytes."""
    total = len(header) + sum(it.tensor.nbytes for it in order)
    os.posix_fallocate(fd, 0, total)
    mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mapped = memoryview(mm)
    try:
        mapped[:len(header)] = header
        _fill(mapped, len(header), order)
    finally:
        try:
            mapped.release()
            mm.close()
        except BufferError:      # a failure left a view alive: the map closes when it dies
            pass


def _sync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:       # some file systems cannot sync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def save_safetensors(tensors: Mapping[str, TensorPtr], path: str | os.PathLike[str], *,
                     metadata: Mapping[str, str] | None = None, fsync: bool = False) -> None:
    """Write tensors to a safetensors file that the ``safetensors`` library reads bit for bit.

    Tensors are written in the order the ``safetensors`` library itself uses
    (wider dtypes first, then by name), so every tensor's data is aligned to
    its element size; the header is padded with spaces to a multiple of 8
    bytes. Each tensor's elements go in row-major (C) order whatever its
    dim_order. The file is written under a temporary name in the same
    directory and renamed to ``path`` once complete, so ``path`` never holds a
    partial checkpoint. Device tensors come down in batched copies of up to
    64 MiB straight into the file's pages.

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
        The file to write; its directory must exist. An existing file is
        replaced, only when the new one is complete.
    metadata : dict of str to str, optional
        Written as the header's ``__metadata__``; a loaded checkpoint's is
        ``etptr.safe_open(path).metadata()`` (``{"format": "pt"}`` for torch's).
    fsync : bool
        True: flush the file, and the directory's entry for it, to the storage
        device before returning (the checkpoint survives a power loss; the save
        then runs at the disk's speed). False (the default, as the
        ``safetensors`` library and ``torch.save`` do): the data is in the page
        cache on return.

    Raises
    ------
    CheckpointError
        Before anything is written: ``tensors`` not a dict, a bad name, a
        value that is not a TensorPtr, an unsupported ScalarType, null data
        for a tensor with bytes (the message names the tensor), bad
        ``metadata``, a missing or read-only directory, ``path`` a
        directory, a header over 100 MB. While writing: the file system
        refuses (e.g. no space left). Nothing is left under ``path`` or a
        temporary name.
    NotFoundError
        A device tensor whose device has no registered allocator.
    """
    items = _check_tensors(tensors)
    meta = _check_metadata(metadata)
    final = _check_path(path)
    order = sorted(items, key=lambda it: (-dtype_rank(it.dtype), it.name))
    header = _header(order, meta)
    try:
        file = TempFile(final)
    except OSError as exc:
        raise CheckpointError(f"{final}: cannot create a file in {str(final.parent)!r} "
                              f"({exc.strerror or exc})") from None
    with file:                       # leaving without the commit removes the file
        try:
            _write_mapped(file.fileno(), header, order)
            file.commit(durable=fsync)
        except OSError as exc:
            raise CheckpointError(f"{final}: cannot be written ({exc.strerror or exc})") \
                from exc
    if fsync:
        _sync_dir(final.parent)
