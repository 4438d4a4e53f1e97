"""Tensors of the frameworks users bring, in and out: the ``framework=`` of the loaders,
and what the saver and ``into=`` accept.

Out: ``"etptr"`` gives the TensorPtr itself; ``"pt"`` a torch tensor sharing its memory
(``torch.from_dlpack``), ``"np"`` a NumPy array viewing it (CPU only), ``"cupy"`` a CuPy
array sharing it (device only). In: a TensorPtr, a NumPy array (aliased), or any object
that speaks DLPack (``__dlpack__``: torch, CuPy, JAX) or the CUDA Array Interface, aliased
through :func:`etptr.from_dlpack` / :func:`etptr.from_cuda_array_interface`. Nothing is
copied either way; what cannot be aliased is refused with the conversion to make.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from etptr._core._error import EtError
from etptr._core._interop import from_cuda_array_interface, from_dlpack
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._errors import CheckpointError

__all__ = ["FRAMEWORKS", "as_tensor_ptr", "check_framework", "to_framework"]

#: The ``framework=`` values, and the spellings taken for them.
FRAMEWORKS = {"etptr": "etptr", "pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np",
              "numpy": "np", "cupy": "cupy"}


def check_framework(framework: object) -> str:
    """``framework`` as one of ``"etptr"``, ``"pt"``, ``"np"``, ``"cupy"`` (``"torch"`` and
    ``"pytorch"`` are ``"pt"``, ``"numpy"`` is ``"np"``, as the safetensors library reads them).

    Raises
    ------
    CheckpointError
        Another value (the message lists the ones taken).
    """
    if isinstance(framework, str) and framework in FRAMEWORKS:
        return FRAMEWORKS[framework]
    raise CheckpointError(f"framework={framework!r}: expected 'etptr' (TensorPtr), 'pt' "
                          f"(torch; also 'torch', 'pytorch'), 'np' (NumPy, on the CPU; also "
                          f"'numpy') or 'cupy' (on a device)")


def _module(name: str, framework: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise CheckpointError(f"framework={framework!r} needs {name}, which does not import "
                              f"({exc})") from None


def to_framework(t: TensorPtr, framework: str, name: str) -> Any:
    """``t`` as ``framework`` (checked by :func:`check_framework`) gives it, sharing its
    memory; ``name`` is the tensor's, for messages.

    Raises
    ------
    CheckpointError
        ``"np"`` for a device tensor, ``"cupy"`` for a CPU one, or the framework's
        module does not import.
    """
    if framework == "etptr":
        return t
    if framework == "np":
        if not t.device.is_cpu():
            raise CheckpointError(f"tensor {name!r} is on {t.device}: framework='np' gives "
                                  f"host arrays; load with device='cpu', or use 'pt' or 'cupy'")
        return t.numpy()
    if framework == "cupy":
        if t.device.is_cpu():
            raise CheckpointError(f"tensor {name!r} is on the CPU: framework='cupy' gives "
                                  f"device arrays; load with device='cuda', or use 'np' or 'pt'")
        return _module("cupy", framework).from_dlpack(t)
    return _module("torch", framework).from_dlpack(t)


def as_tensor_ptr(x: object, name: str) -> TensorPtr:
    """``x`` as a TensorPtr over the same memory: a TensorPtr itself, a NumPy array, or an
    object speaking DLPack or the CUDA Array Interface (torch and CuPy tensors).

    Raises
    ------
    CheckpointError
        Anything else, or a layout no TensorPtr can alias (the message names the tensor
        and says what to do, e.g. make it contiguous first).
    """
    if isinstance(x, TensorPtr):
        return x
    try:
        if isinstance(x, np.ndarray):
            return make_tensor_ptr(x)
        if hasattr(x, "__dlpack__"):
            return from_dlpack(x)
        if hasattr(x, "__cuda_array_interface__"):
            return from_cuda_array_interface(x)
    except EtError as exc:
        raise CheckpointError(f"tensor {name!r} ({type(x).__module__}.{type(x).__name__}) "
                              f"cannot be read in place: {exc}") from None
    except Exception as exc:          # the producer refused to export (torch: requires_grad)
        raise CheckpointError(f"tensor {name!r} ({type(x).__module__}.{type(x).__name__}) "
                              f"cannot be exported: {type(exc).__name__}: {exc}") from None
    raise CheckpointError(f"tensor {name!r}: expected an etptr.TensorPtr, a NumPy array or a "
                          f"tensor speaking DLPack or the CUDA Array Interface (torch, CuPy), "
                          f"got {type(x).__name__}")
