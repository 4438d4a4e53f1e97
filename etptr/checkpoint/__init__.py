"""safetensors checkpoints: ``load_safetensors`` and ``save_safetensors``.

``load_safetensors`` reads one ``.safetensors`` file, several, or a sharded
checkpoint's ``*.safetensors.index.json``, checking every header against the
format's rules before anything is mapped or allocated, and gives each tensor
as a :class:`~etptr.TensorPtr`: zero-copy read-only views of the file's pages
on the CPU, page-locked copies, or tensors in device memory.
``save_safetensors`` writes CPU or device tensors to a file the
``safetensors`` library reads bit for bit, atomically (temporary name, then
rename). A malformed file or a bad argument raises :class:`CheckpointError`
naming the file and the tensor.

The lower layers are importable from here too: :func:`read_plan` and
:func:`parse_header` (the checked headers), :func:`layout_file` (where each
tensor of a file goes in one device buffer, and the copy runs that fill it).
"""
from etptr.checkpoint._errors import CheckpointError, CheckpointFileNotFoundError
from etptr.checkpoint._format import (
    DTYPE_NAMES, MAX_HEADER_BYTES, SAFETENSORS_DTYPES, FilePlan, TensorEntry, parse_header)
from etptr.checkpoint._layout import DEVICE_ALIGNMENT, CopyRun, FileLayout, layout_file
from etptr.checkpoint._into import IncompatibleKeys
from etptr.checkpoint._load import load_safetensors
from etptr.checkpoint._background import SaveHandle
from etptr.checkpoint._plan import CheckpointPlan, read_plan
from etptr.checkpoint._safe_open import SafeOpen, SafeSlice, safe_open
from etptr.checkpoint._save import save_safetensors

__all__ = [
    "DEVICE_ALIGNMENT",
    "DTYPE_NAMES",
    "MAX_HEADER_BYTES",
    "SAFETENSORS_DTYPES",
    "CheckpointError",
    "CheckpointFileNotFoundError",
    "CheckpointPlan",
    "CopyRun",
    "FileLayout",
    "FilePlan",
    "IncompatibleKeys",
    "SafeOpen",
    "SafeSlice",
    "SaveHandle",
    "TensorEntry",
    "layout_file",
    "load_safetensors",
    "parse_header",
    "read_plan",
    "safe_open",
    "save_safetensors",
]
