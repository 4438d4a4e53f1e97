"""The safetensors header of one file: reading it and checking every rule.

A safetensors file is an 8-byte little-endian header length ``N``, ``N``
bytes of UTF-8 JSON, then the data section. The JSON object maps each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (byte offsets
relative to the data section) and may hold ``"__metadata__"``, an object of
str -> str. The rules checked here are those of the format's reference
reader, plus a few more that etptr's tensors need (at most 16 dims, sizes
and byte counts that fit int64, no duplicate keys):

* the header is at most 100,000,000 bytes and lies inside the file;
* the tensors' byte ranges, sorted, tile the data section exactly: no
  overlap, no gap, nothing past its end, nothing left over;
* each range holds exactly ``prod(shape) * element size`` bytes.

Headers as writers make them are read by the one-pass scan of
:mod:`~etptr.checkpoint._header_scan`; the rest (and every broken rule, with its
message) by the JSON decoder and the checks here. Nothing here allocates
memory for tensor data or maps the file.
"""
from __future__ import annotations

import json
import os
import reprlib
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from etptr._core._scalar_type import ScalarType, element_size
from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.checkpoint._errors import CheckpointError, CheckpointFileNotFoundError
from etptr.checkpoint._header_scan import TensorEntry, scan_header

__all__ = [
    "DTYPE_NAMES",
    "FilePlan",
    "MAX_HEADER_BYTES",
    "SAFETENSORS_DTYPES",
    "TensorEntry",
    "dtype_rank",
    "loads_strict",
    "parse_header",
    "plan_from_header",
]

#: The largest header the format allows, in bytes (the reference reader's limit).
MAX_HEADER_BYTES = 100_000_000
#: (st_dev, st_ino, st_mtime_ns, st_ctime_ns): see :func:`file_identity`.
FileIdentity = tuple[int, int, int, int]

#: safetensors dtype name -> the ScalarType etptr gives the tensor.
SAFETENSORS_DTYPES: dict[str, ScalarType] = {
    "F64": ScalarType.Double,
    "F32": ScalarType.Float,
    "F16": ScalarType.Half,
    "BF16": ScalarType.BFloat16,
    "I64": ScalarType.Long,
    "I32": ScalarType.Int,
    "I16": ScalarType.Short,
    "I8": ScalarType.Char,
    "U8": ScalarType.Byte,
    "U16": ScalarType.UInt16,
    "U32": ScalarType.UInt32,
    "U64": ScalarType.UInt64,
    "BOOL": ScalarType.Bool,
    "F8_E4M3": ScalarType.Float8_e4m3fn,
    "F8_E5M2": ScalarType.Float8_e5m2,
}

#: ScalarType -> the safetensors dtype name written for it.
DTYPE_NAMES: dict[ScalarType, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}

# Every dtype the format defines, in the order of its reference implementation's
# dtype enumeration (increasing alignment). Its writer sorts tensors by this
# rank, descending, then by name; the ones without a ScalarType mapping are
# named in errors as format dtypes etptr cannot hold.
_FORMAT_DTYPES = (
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
    "F64", "I64", "U64",
)
_RANK = {name: i for i, name in enumerate(_FORMAT_DTYPES)}

_INT64_MAX = (1 << 63) - 1
_MAX_DIMS = 16            # ExecuTorch's kTensorDimensionLimit
_MAX_INT_DIGITS = 20      # a JSON integer longer than this cannot fit int64 or uint64
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")


def dtype_rank(dtype: str) -> int:
    """The position of a safetensors dtype name in the format's own ordering.

    Parameters
    ----------
    dtype : str
        A safetensors dtype name such as ``"BF16"``.

    Returns
    -------
    int
        Larger for wider types; the format's writer puts larger ranks first.

    Raises
    ------
    KeyError
        ``dtype`` is not a safetensors dtype name.
    """
    return _RANK[dtype]


@dataclass(frozen=True, eq=False)
class FilePlan:
    """The checked header of one safetensors file.

    Attributes
    ----------
    path : pathlib.Path
    file_size : int
        Bytes in the file when its header was read.
    data_offset : int
        File offset of the data section in bytes (``8 + N``).
    data_size : int
        Bytes in the data section (``file_size - data_offset``).
    tensors : tuple of TensorEntry
        In file order (by ``begin``, then ``end``, then name). A plan made by
        :meth:`CheckpointPlan.select` may hold a subset; the offsets still
        refer to the whole file.
    metadata : dict of str to str, or None
        The header's ``__metadata__``, when it has one.
    identity : tuple of int, or None
        ``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)`` of the file whose header
        was read (:func:`file_identity`): the file read later must be that one,
        not another renamed over the path nor the same one rewritten.
    """

    path: Path
    file_size: int
    data_offset: int
    data_size: int
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str] | None = None
    identity: FileIdentity | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data this plan names (the data section for a whole file)."""
        return sum(t.nbytes for t in self.tensors)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 4, 8, 8, 60, 60


def _show(value: object) -> str:
    """``repr(value)``, cut short for a message (a header's value may be huge or deep)."""
    return _REPR.repr(value)


def _fail(path: Path, message: str, tensor: str | None = None) -> NoReturn:
    where = f"{path}: " if tensor is None else f"{path}: tensor {tensor!r}: "
    raise CheckpointError(where + message)


class _Refused(ValueError):
    """Raised inside the JSON decoder's hooks; the message says what was refused."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"the key {key!r} occurs twice in one object")
        out[key] = value
    return out


def _constant(name: str) -> NoReturn:
    raise _Refused(f"{name} is not JSON")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} digits ({text[:12]}...) is past int64")
    return int(text)


def loads_strict(text: str) -> Any:
    """Decode JSON text, refusing duplicate keys, NaN/Infinity and integers
    of more than 20 digits.

    Raises
    ------
    ValueError
        The text is not such JSON (a ``json.JSONDecodeError`` or a refusal).
    RecursionError
        The text nests too deeply for the decoder.
    """
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int)


def _pread_exact(fd: int, nbytes: int, offset: int, path: Path) -> bytes:
    chunks = []
    done = 0
    while done < nbytes:
        chunk = os.pread(fd, nbytes - done, offset + done)
        if not chunk:
            _fail(path, f"the file ended after {offset + done} bytes while its header was read "
                        f"(it changed while being read?)")
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def file_identity(st: os.stat_result) -> FileIdentity:
    """What tells one file at a path from another put there later (by a rename, or a
    rewrite in place): device, inode, modification time and status-change time. The
    last cannot be set back, so a rewrite that restores the modification time
    (``cp -p``, ``rsync -t``) shows too; so does any change of the file's status
    (chmod, chown, a new hard link, setting its times with ``touch`` or ``utime``)."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _read_header_bytes(path: Path) -> tuple[bytes, int, FileIdentity]:
    """``(header JSON bytes, file size, file identity)``; every failure is a CheckpointError."""
    try:
        f = ReadOnlyFile(path)
    except FileNotFoundError:
        raise CheckpointFileNotFoundError(f"{path}: no such file", filename=str(path)) from None
    except OSError as exc:
        _fail(path, f"cannot be opened ({exc.strerror or exc})")
    except ValueError as exc:                    # a NUL byte in the path
        _fail(path, str(exc))
    with f:
        try:
            fd = f.fileno()
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                _fail(path, "is a directory, not a .safetensors file")
            if not stat.S_ISREG(st.st_mode):
                _fail(path, "is not a regular file")
            size = st.st_size
            if size < 8:
                _fail(path, f"is {size} bytes long, too short for the 8-byte header length")
            n = int.from_bytes(_pread_exact(fd, 8, 0, path), "little")
            hint = ""
            if n > MAX_HEADER_BYTES or 8 + n > size:
                head = _pread_exact(fd, min(size, 16), 0, path)
                if not head[8:9] == b"{":             # a safetensors header is a JSON object
                    hint = " (the file does not look like a safetensors file)"
            if n > MAX_HEADER_BYTES:
                _fail(path, f"the header length {n} bytes is over the format's limit of "
                            f"{MAX_HEADER_BYTES} bytes{hint}")
            if 8 + n > size:
                _fail(path, f"the header length {n} bytes runs past the end of the file "
                            f"({size} bytes){hint}")
            return _pread_exact(fd, n, 8, path), size, file_identity(st)
        except OSError as exc:
            _fail(path, f"cannot be read ({exc.strerror or exc})")


def _decode(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(path, f"the header is not UTF-8 (bad byte at header offset {exc.start})")
    try:
        header = loads_strict(text)
    except _Refused as exc:
        _fail(path, f"the header is refused: {exc}", _tensor_refused(text))
    except RecursionError:
        _fail(path, "the header's JSON nests too deeply")
    except ValueError as exc:
        _fail(path, f"the header is not valid JSON ({exc})")
    if not isinstance(header, dict):
        _fail(path, f"the header is a JSON {type(header).__name__}, not an object")
    return header


class _Flagged(dict):  # type: ignore[type-arg]
    """An object of the lenient decoding whose keys repeat."""


class _Refusal:
    """A value the strict decoding refuses (NaN, an integer past int64)."""


def _refused_inside(value: object) -> bool:
    if isinstance(value, (_Flagged, _Refusal)):
        return True
    if isinstance(value, dict):
        return any(_refused_inside(v) for v in value.values())
    if isinstance(value, list):
        return any(_refused_inside(v) for v in value)
    return False


def _tensor_refused(text: str) -> str | None:
    """The tensor whose header entry holds what the strict decoding refused, found by
    decoding ``text`` again without refusing; None when the refusal is not inside one
    entry (a tensor name repeated at the top level names itself)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        return (_Flagged if len(set(keys)) != len(keys) else dict)(items)

    def integer(digits: str) -> object:
        return _Refusal() if len(digits.lstrip("-")) > _MAX_INT_DIGITS else int(digits)

    try:
        header = json.loads(text, object_pairs_hook=pairs, parse_int=integer,
                            parse_constant=lambda name: _Refusal())
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    for name, entry in header.items():
        if name != "__metadata__" and _refused_inside(entry):
            return name
    return None


def _check_name(path: Path, name: str) -> None:
    """A tensor name must be Unicode text: a lone surrogate (a ``\\ud800`` escape) cannot
    be UTF-8, which the format's names are."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        _fail(path, f"the name {name!r} is not valid Unicode (a lone surrogate escape): the "
                    f"format's names are UTF-8")


def _check_shape(path: Path, name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list):
        _fail(path, f"shape {_show(shape)} is not a list of ints", name)
    if len(shape) > _MAX_DIMS:
        _fail(path, f"shape has {len(shape)} dims, more than the {_MAX_DIMS} a tensor may have",
              name)
    nonzero = 1
    for d in shape:
        if type(d) is not int or d < 0:       # JSON integers only: bool and float are refused
            _fail(path, f"shape {_show(shape)} is not a list of non-negative ints", name)
        if d and nonzero > _INT64_MAX // d:
            _fail(path, f"shape {_show(shape)}: the element count overflows int64", name)
        nonzero *= d or 1
    return tuple(shape)


# bytes per element of each safetensors dtype etptr reads
_ELEMENT_BYTES = {code: element_size(st) for code, st in SAFETENSORS_DTYPES.items()}
# what the fast path needs of each: (ScalarType, element size)
_DTYPE_INFO = {code: (st, _ELEMENT_BYTES[code]) for code, st in SAFETENSORS_DTYPES.items()}
_ENTRY_KEY_SET = frozenset(_ENTRY_KEYS)


def _check_entry(path: Path, name: str, entry: object, data_size: int) -> TensorEntry:
    """The entry as a TensorEntry, or the CheckpointError that names what is wrong.

    A well-formed entry costs a few comparisons; the messages are made only on a
    failure."""
    _check_name(path, name)
    if not isinstance(entry, dict):
        _fail(path, f"its header entry is a JSON {type(entry).__name__}, not an object", name)
    if entry.keys() != _ENTRY_KEY_SET:
        missing = [k for k in _ENTRY_KEYS if k not in entry]
        if missing:
            _fail(path, f"its header entry lacks {', '.join(map(repr, missing))}", name)
        extra = sorted(k for k in entry if k not in _ENTRY_KEYS)
        _fail(path, f"its header entry has unexpected key(s) {', '.join(map(repr, extra))}",
              name)
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        _fail(path, f"dtype {_show(dtype)} is not a string", name)
    esize = _ELEMENT_BYTES.get(dtype)
    if esize is None:
        if dtype in _RANK:
            _fail(path, f"dtype {_show(dtype)} has no etptr ScalarType (supported: "
                        f"{', '.join(SAFETENSORS_DTYPES)})", name)
        _fail(path, f"dtype {_show(dtype)} is not a safetensors dtype", name)
    shape = _check_shape(path, name, entry["shape"])
    numel = 1
    for d in shape:
        numel *= d
    if numel > _INT64_MAX // esize:
        _fail(path, f"shape {list(shape)} of {dtype}: the byte count overflows int64", name)
    nbytes = numel * esize
    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or type(offsets[0]) is not int \
            or type(offsets[1]) is not int:           # JSON integers only, as in shapes
        _fail(path, f"data_offsets {_show(offsets)} is not a list of two ints", name)
    begin, end = offsets
    if begin < 0 or end < begin:
        _fail(path, f"data_offsets {_show(offsets)}: need 0 <= begin <= end", name)
    if end > data_size:
        _fail(path, f"data_offsets {_show(offsets)} run past the end of the data section "
                    f"({data_size} bytes)", name)
    if end - begin != nbytes:
        _fail(path, f"shape {list(shape)} of {dtype} needs {nbytes} bytes but data_offsets "
                    f"{_show(offsets)} hold {end - begin}", name)
    return TensorEntry(name, SAFETENSORS_DTYPES[dtype], shape, begin, end)


def _check_metadata(path: Path, metadata: object) -> dict[str, str]:
    if not isinstance(metadata, dict):
        _fail(path, f"__metadata__ is a JSON {type(metadata).__name__}, not an object of "
                    f"strings")
    for key, value in metadata.items():
        if not isinstance(value, str):
            _fail(path, f"__metadata__[{key!r}] = {_show(value)} is not a string")
        try:
            key.encode("utf-8")
            value.encode("utf-8")
        except UnicodeEncodeError:
            _fail(path, f"__metadata__[{key!r}] is not valid Unicode (a lone surrogate "
                        f"escape): the format's text is UTF-8")
    return metadata


def _check_tiling(path: Path, tensors: list[TensorEntry], data_size: int) -> None:
    """The sorted byte ranges must cover ``[0, data_size)`` exactly once."""
    cursor = 0
    prev: TensorEntry | None = None
    for t in tensors:
        if t.begin < cursor:
            assert prev is not None
            _fail(path, f"data_offsets [{t.begin}, {t.end}] overlap those of tensor "
                        f"{prev.name!r} [{prev.begin}, {prev.end}]", t.name)
        if t.begin > cursor:
            _fail(path, f"bytes [{cursor}, {t.begin}) of the data section belong to no tensor "
                        f"(a gap before data_offsets [{t.begin}, {t.end}])", t.name)
        if t.end > t.begin or prev is None:
            prev = t        # the last tensor that holds bytes: the one that set the cursor
        cursor = t.end
    if cursor != data_size:
        after = f" (after tensor {prev.name!r})" if prev is not None else ""
        _fail(path, f"bytes [{cursor}, {data_size}) of the data section belong to no "
                    f"tensor{after}")


def parse_header(path: str | os.PathLike[str]) -> FilePlan:
    """Read and check the header of one safetensors file.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    FilePlan
        The data section's offset and size, and every tensor in file order.

    Raises
    ------
    CheckpointError
        The file is missing, a directory, not a regular file, shorter than
        8 bytes; the header length runs past the end or is over 100 MB; the
        header is not UTF-8 JSON, not an object, or repeats a key; an entry
        is not an object of exactly ``dtype``, ``shape``, ``data_offsets``;
        an unknown or unsupported dtype; a shape that is not a list of at
        most 16 non-negative ints or whose element or byte count overflows
        int64; data_offsets that are not two ints with ``begin <= end``, that
        disagree with the shape, overlap, leave a gap or run past the data
        section; ``__metadata__`` that is not an object of strings. The
        message names the file and, where one is at fault, the tensor.
    """
    p = Path(path)
    raw, size, identity = _read_header_bytes(p)
    return plan_from_header(p, raw, size, identity)


def plan_from_header(path: Path, raw: bytes, size: int,
                     identity: FileIdentity | None) -> FilePlan:
    """The checked plan of the file ``path`` from its header bytes ``raw`` (read with
    its size and identity by ``_read_header_bytes``); the errors of :func:`parse_header`
    that concern the header's contents."""
    data_offset = 8 + len(raw)
    data_size = size - data_offset
    checked = scan_header(raw, data_size, _DTYPE_INFO)
    if checked is None:
        checked = _check_header(path, raw, data_size)
    return FilePlan(path, size, data_offset, data_size, checked[0], checked[1], identity)


def _check_header(path: Path, raw: bytes,
                  data_size: int) -> tuple[tuple[TensorEntry, ...], dict[str, str] | None]:
    """The full reader: ``(tensors in file order, metadata)`` of the header JSON ``raw``,
    or the CheckpointError naming the first broken rule. :func:`parse_header` calls it
    for the headers that :func:`~etptr.checkpoint._header_scan.scan_header` does not
    read; for every other header the two return the same."""
    header = _decode(path, raw)
    metadata = None
    if "__metadata__" in header:
        metadata = _check_metadata(path, header.pop("__metadata__"))
    tensors = [_check_entry(path, name, entry, data_size) for name, entry in header.items()]
    tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    _check_tiling(path, tensors, data_size)
    return tuple(tensors), metadata
