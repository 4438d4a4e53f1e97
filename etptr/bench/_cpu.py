"""Host-side parts of ``etptr-bench``: wrapping, metadata operations, host clones, checks.

These run with or without a GPU. Every timed operation is built as a
:class:`~etptr.bench._timing.Case` over all tensors of a checkpoint, so the
table can give both the total per pass and the time per tensor.
"""
from __future__ import annotations

import numpy as np

import etptr
from etptr.bench._timing import Case


def plain_view(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or the same bytes viewed as a signed integer of the same width for
    dtypes some CuPy or torch releases do not take: ``ml_dtypes`` types (bfloat16,
    float8) and unsigned integers wider than a byte."""
    builtin = a.dtype.num < 256
    if builtin and not (a.dtype.kind == "u" and a.dtype.itemsize > 1):
        return a
    return a.view(np.dtype(f"i{a.dtype.itemsize}"))


def _as_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def mismatches(names, arrays, tensors) -> list:
    """Names of tensors whose CPU copy differs from the source array.

    A tensor matches when its sizes, its ScalarType and every byte of its
    data equal the array's (a bit-for-bit comparison, so NaN payloads and
    signed zeros count).
    """
    bad = []
    for name, a, t in zip(names, arrays, tensors, strict=True):
        if (tuple(t.sizes) != a.shape
                or t.scalar_type != etptr.scalar_type_from_numpy(a.dtype)
                or not np.array_equal(_as_bytes(t.numpy()), _as_bytes(a))):
            bad.append(name)
    return bad


def wrap(arrays) -> list:
    """Every array as a TensorPtr that aliases it (``make_tensor_ptr(ndarray)``, no copy).

    Raises
    ------
    RuntimeError
        A TensorPtr whose data pointer is not the array's (a copy was made).
    """
    tensors = [etptr.make_tensor_ptr(a) for a in arrays]
    for a, t in zip(arrays, tensors, strict=True):
        if a.nbytes and t.data_ptr != a.ctypes.data:
            raise RuntimeError("make_tensor_ptr(ndarray) copied instead of aliasing")
    return tensors


def host_cases(arrays, tensors, torch=None) -> list:
    """Cases for the host operations over every tensor of a checkpoint.

    Parameters
    ----------
    arrays : list of numpy.ndarray
    tensors : list of TensorPtr
        The same data wrapped by :func:`wrap`.
    torch : module or None
        When given, ``torch.from_numpy`` is timed beside ``make_tensor_ptr(ndarray)``.
    """
    make, resize, clone = etptr.make_tensor_ptr, etptr.resize_tensor_ptr, etptr.clone_tensor_ptr
    count = len(arrays)
    nbytes = sum(a.nbytes for a in arrays)
    flat_sizes = [[t.numel()] for t in tensors]
    views = [make(t) for t in tensors]
    view_sizes = [list(v.sizes) for v in views]

    cases = [Case("host.make_tensor_ptr", "make_tensor_ptr(ndarray)",
                  lambda: [make(a) for a in arrays], count=count)]
    if torch is not None:
        from_numpy = torch.from_numpy
        plain = [plain_view(a) for a in arrays]
        cases.append(Case("host.torch_from_numpy", "torch.from_numpy(ndarray)",
                          lambda: [from_numpy(a) for a in plain], count=count))
    cases += [
        Case("host.view", "make_tensor_ptr(tensor)",
             lambda: [make(t) for t in tensors], count=count),
        Case("host.flat_view", "make_tensor_ptr(tensor, [numel])",
             lambda: [make(t, s) for t, s in zip(tensors, flat_sizes, strict=True)], count=count),
        Case("host.resize", "resize_tensor_ptr(view, sizes)",
             lambda: [resize(v, s) for v, s in zip(views, view_sizes, strict=True)], count=count),
        Case("host.clone", "clone_tensor_ptr(tensor)",
             lambda: [clone(t) for t in tensors], nbytes=nbytes, count=count),
        Case("host.numpy_copy", "ndarray.copy()",
             lambda: [a.copy() for a in arrays], nbytes=nbytes, count=count),
    ]
    return cases


def sweep_cases(host: np.ndarray, sizes, number_for, repeats_for) -> tuple:
    """Host-only sweep (no GPU): ``clone_tensor_ptr`` against ``ndarray.copy()`` per size.

    Returns
    -------
    (series, cases)
        ``series`` maps a series key to its label; case keys are ``"key@size"``.
    """
    series = {"host.clone": "etptr clone_tensor_ptr", "host.numpy_copy": "ndarray.copy()"}
    cases = []
    for n in sizes:
        t = etptr.make_tensor_ptr(host[:n])
        a = host[:n]
        common = dict(nbytes=n, number=number_for(n), repeats=repeats_for(n))
        cases.append(Case(f"host.clone@{n}", f"clone_tensor_ptr {n}",
                          lambda t=t: etptr.clone_tensor_ptr(t), **common))
        cases.append(Case(f"host.numpy_copy@{n}", f"ndarray.copy() {n}",
                          lambda a=a: a.copy(), **common))
    return series, cases


def sweep_check(host: np.ndarray, sizes) -> list:
    """Sizes at which ``clone_tensor_ptr`` of the host pattern is not bit-identical."""
    bad = []
    for n in sizes:
        c = etptr.clone_tensor_ptr(etptr.make_tensor_ptr(host[:n]))
        if not np.array_equal(c.numpy(), host[:n]):
            bad.append(n)
    return bad
