"""Which files a checkpoint argument names, and the checked plan of all of them.

A checkpoint is one ``.safetensors`` path, a list of them, or a sharded
checkpoint's ``*.safetensors.index.json``, whose ``"weight_map"`` maps every
tensor name to the shard file (beside the index) that holds it. Every file's
header is read and checked before anything else happens, so a bad shard
fails the whole load before memory is allocated.
"""
from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, Union

from etptr.checkpoint._errors import CheckpointError, CheckpointFileNotFoundError
from etptr.checkpoint._format import (
    MAX_HEADER_BYTES, FilePlan, TensorEntry, loads_strict, parse_header)
from etptr.checkpoint._shards import reading

__all__ = ["CheckpointPlan", "PathsLike", "read_plan"]

PathLike = Union[str, "os.PathLike[str]"]
#: What ``paths`` may be: one path (a file or an index) or a list/tuple of them.
PathsLike = Union[PathLike, "list[PathLike]", "tuple[PathLike, ...]"]


@dataclass(frozen=True, eq=False)
class CheckpointPlan:
    """The checked headers of every file of a checkpoint.

    Attributes
    ----------
    files : tuple of FilePlan
        In the order the files were named (an index's shards by file name).
    """

    files: tuple[FilePlan, ...]

    @property
    def names(self) -> list[str]:
        """Every tensor name, file by file, in file order."""
        return [t.name for f in self.files for t in f.tensors]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the plan names, over all files."""
        return sum(f.nbytes for f in self.files)

    def entries(self) -> Iterable[tuple[FilePlan, TensorEntry]]:
        """``(file, tensor)`` for every tensor, file by file, in file order."""
        for f in self.files:
            for t in f.tensors:
                yield f, t

    def select(self, names: Iterable[str]) -> CheckpointPlan:
        """The plan restricted to ``names``; files holding none of them are dropped.

        Parameters
        ----------
        names : iterable of str
            Tensor names; repeats are ignored. Order does not matter: the
            result keeps file order.

        Raises
        ------
        CheckpointError
            ``names`` is a str or not an iterable of str, or names a tensor
            the checkpoint lacks (the message lists close names).
        """
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise CheckpointError(
                f"names={names!r}: expected a list (or other collection) of tensor names")
        wanted = set()
        for n in names:
            if not isinstance(n, str):
                raise CheckpointError(f"names: {n!r} is not a str")
            wanted.add(n)
        have = self.names
        known = set(have)
        for n in sorted(wanted - known):
            close = difflib.get_close_matches(n, have, n=3, cutoff=0.6)
            hint = (f"close names: {', '.join(map(repr, close))}" if close
                    else f"it holds {len(have)} tensors, e.g. "
                         f"{', '.join(map(repr, have[:3]))}")
            where = self.files[0].path if len(self.files) == 1 else "the checkpoint"
            raise CheckpointError(f"{where}: no tensor named {n!r} ({hint})")
        files = []
        for f in self.files:
            kept = tuple(t for t in f.tensors if t.name in wanted)
            if kept:
                files.append(replace(f, tensors=kept))
        return CheckpointPlan(tuple(files))


def _fail(where: object, message: str) -> NoReturn:
    raise CheckpointError(f"{where}: {message}")


def _as_path(p: object, argname: str) -> Path:
    if isinstance(p, (str, os.PathLike)):
        s = os.fspath(p)
        if isinstance(s, str) and "\0" in s:
            raise CheckpointError(f"{argname}={s!r}: a path may not hold a NUL byte")
        if isinstance(s, str) and s:
            return Path(s)
    raise CheckpointError(f"{argname}={p!r}: expected a non-empty str or os.PathLike path")


def _read_index(index: Path) -> list[tuple[Path, set[str]]]:
    """``[(shard path, names the weight_map puts there)]``, shards sorted by file name."""
    try:
        st = index.stat()
    except FileNotFoundError:
        raise CheckpointFileNotFoundError(f"{index}: no such index file",
                                          filename=str(index)) from None
    except OSError as exc:
        _fail(index, f"cannot be read ({exc.strerror or exc})")
    if not stat.S_ISREG(st.st_mode):
        _fail(index, "is not a regular file")
    if st.st_size > MAX_HEADER_BYTES:
        _fail(index, f"is {st.st_size} bytes, more than an index may be ({MAX_HEADER_BYTES})")
    try:
        doc: Any = loads_strict(index.read_bytes().decode("utf-8"))
    except OSError as exc:
        _fail(index, f"cannot be read ({exc.strerror or exc})")
    except RecursionError:
        _fail(index, "the index's JSON nests too deeply")
    except ValueError as exc:                 # also UnicodeDecodeError
        _fail(index, f"is not a UTF-8 JSON index ({exc})")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        _fail(index, "has no \"weight_map\" object mapping tensor names to shard files")
    if not weight_map:
        _fail(index, "its weight_map is empty: it names no tensor")
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or not shard or shard in (".", "..")
                or os.path.basename(shard) != shard or "/" in shard):
            _fail(index, f"tensor {name!r}: weight_map gives {shard!r}, not the name of a shard "
                         f"file beside the index")
        shards.setdefault(shard, set()).add(name)
    out = []
    for shard in sorted(shards):
        path = index.parent / shard
        if not path.exists():
            first = sorted(shards[shard])[0]
            raise CheckpointFileNotFoundError(
                f"{index}: shard {shard!r} (holding tensor {first!r} and "
                f"{len(shards[shard]) - 1} more) does not exist at {path}", filename=str(path))
        out.append((path, shards[shard]))
    return out


def _check_shard(index: Path, plan: FilePlan, mapped: set[str]) -> None:
    held = {t.name for t in plan.tensors}
    for name in sorted(mapped - held):
        _fail(index, f"tensor {name!r} is mapped to shard {plan.path.name!r}, which does not "
                     f"hold it")
    for name in sorted(held - mapped):
        _fail(plan.path, f"tensor {name!r} is in this shard but the index {index.name!r} does "
                         f"not map it here")


def read_plan(paths: PathsLike) -> CheckpointPlan:
    """Read and check every header of a checkpoint.

    Parameters
    ----------
    paths : str, os.PathLike, or list/tuple of them
        One ``.safetensors`` file, several, or a ``*.json`` index of shards.

    Returns
    -------
    CheckpointPlan

    Raises
    ------
    CheckpointError
        A bad ``paths`` argument; a missing file or shard; an index that is
        not JSON, has no weight_map, maps a name to a shard that does not hold
        it or misses a name a shard holds; any header error of
        :func:`parse_header`; the same tensor name in two files, or the same
        file twice.
    """
    if isinstance(paths, (list, tuple)):
        if not paths:
            raise CheckpointError("paths=[]: no checkpoint file given")
        items = [_as_path(p, f"paths[{i}]") for i, p in enumerate(paths)]
    else:
        items = [_as_path(paths, "paths")]
    plans: list[FilePlan] = []
    for path in items:
        if path.name.endswith(".json"):
            with reading(path.parent):       # no save's commit in between
                for shard, mapped in _read_index(path):
                    plan = parse_header(shard)
                    _check_shard(path, plan, mapped)
                    plans.append(plan)
        else:
            plans.append(parse_header(path))
    seen_files: dict[str, Path] = {}
    owner: dict[str, Path] = {}
    for plan in plans:
        key = os.path.realpath(plan.path)
        if key in seen_files:
            _fail(plan.path, f"the same file is named twice (also as {seen_files[key]})")
        seen_files[key] = plan.path
        for t in plan.tensors:
            if t.name in owner:
                _fail(plan.path, f"tensor {t.name!r} is also in {owner[t.name]}: a name may "
                                 f"occur in one file only")
            owner[t.name] = plan.path
    return CheckpointPlan(tuple(plans))
