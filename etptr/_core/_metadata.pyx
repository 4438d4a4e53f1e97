"""ExecuTorch's metadata rules: sizes, dim_order and strides.

One home for the checks every tensor goes through, whichever way it is made
(``make_tensor_ptr``, views, the makers, DLPack import): sizes are
non-negative and their product fits int64; ``dim_order`` is a permutation (or
empty: ``0..n-1``, or with strides the dims by decreasing stride, a stable
sort); strides follow from sizes and dim_order (ExecuTorch's
``dim_order_to_stride``) and a given stride may differ only where the size is
1; at most 16 dims (``kTensorDimensionLimit``). Mirrors
``runtime/core/exec_aten/util/dim_order_util.h`` and the checks of
``extension/tensor/tensor_ptr.h``.

Every sequence argument is read once, element by element up to its length,
into C arrays; error messages are built from what was read, never by reading
the caller's object again.
"""
cimport cython
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t

from etptr._core._args cimport c_int_arg, c_type_name
from etptr._core._error cimport raise_error
from etptr._core._scalar_type cimport c_element_size

from collections.abc import Mapping

import numpy as np

from etptr._core._error import Error


@cython.final
cdef class Metadata:
    """Validated (sizes, dim_order, strides); internal."""

    def __init__(self):
        raise TypeError("Metadata is internal")


cdef Metadata c_new_metadata():
    return Metadata.__new__(Metadata)


cdef tuple c_tuple64(const int64_t* a, int n):
    return tuple([a[i] for i in range(n)])


cdef tuple c_tuple8(const dim_order_t* a, int n):
    return tuple([a[i] for i in range(n)])


cdef int _not_a_sequence(object seq, str argname) except -1:
    raise_error(Error.InvalidType,
                f"{argname} must be a sequence of ints, got {seq!r:.80} of type {c_type_name(seq)}")


cdef int c_read_ints(object seq, int64_t* out, str argname) except -2:
    """Read a sequence of at most 16 ints into ``out``; its length, or -1 for None.

    ``len()`` is asked once and exactly that many elements are read, each
    checked by :func:`c_int_arg` (so each ``__index__`` runs once). Strings,
    bytes, mappings and arrays of other than one dim are refused.
    """
    cdef Py_ssize_t n, i
    if seq is None:
        return -1
    if isinstance(seq, str) or isinstance(seq, bytes) or isinstance(seq, Mapping):
        _not_a_sequence(seq, argname)
    if isinstance(seq, np.ndarray) and seq.ndim != 1:
        _not_a_sequence(seq, argname)
    if not hasattr(seq, "__len__") or not hasattr(seq, "__getitem__"):
        _not_a_sequence(seq, argname)
    try:
        n = len(seq)
    except TypeError:  # e.g. a 0-dim ndarray has __len__ but no length
        _not_a_sequence(seq, argname)
    if n > kTensorDimensionLimit:
        raise_error(Error.InvalidArgument,
                    f"{argname} has {n} entries; ExecuTorch tensors have at most "
                    f"{kTensorDimensionLimit} dims (kTensorDimensionLimit)")
    for i in range(n):
        try:
            item = seq[i]
        except LookupError:  # a mapping in disguise, or a __len__ that overstates
            _not_a_sequence(seq, argname)
        out[i] = c_int_arg(item, argname, INT64_MIN, INT64_MAX, i)
    return n


cdef int c_dim_order_to_strides(const sizes_t* sizes, const dim_order_t* dim_order, int dim,
                                strides_t* strides) except -1:
    """ExecuTorch ``dim_order_to_stride``, with int64 overflow checks."""
    cdef int i
    cdef int64_t s, m
    if dim == 0:
        return 0
    strides[dim_order[dim - 1]] = 1
    for i in range(dim - 2, -1, -1):
        s = strides[dim_order[i + 1]]
        m = sizes[dim_order[i + 1]]
        if m == 0:
            strides[dim_order[i]] = s
        else:
            if s > INT64_MAX // m:
                raise_error(Error.InvalidArgument,
                            f"sizes: the stride of dim {dim_order[i]} overflows int64")
            strides[dim_order[i]] = s * m
    return 0


cdef int c_check_sizes(Metadata m) except -1:
    """Sizes non-negative, their product within int64; sets ``m.numel``."""
    cdef int i
    cdef int64_t numel = 1
    cdef bint zero = False
    for i in range(m.dim):
        if m.sizes[i] < 0:
            raise_error(Error.InvalidArgument, f"sizes[{i}]={m.sizes[i]} is negative")
        if m.sizes[i] == 0:
            zero = True
    for i in range(m.dim):      # overflow check on the product of the non-zero sizes
        if m.sizes[i] == 0:
            continue
        if numel > INT64_MAX // m.sizes[i]:
            raise_error(Error.InvalidArgument,
                        f"sizes={c_tuple64(m.sizes, m.dim)}: the element count overflows int64")
        numel *= m.sizes[i]
    m.numel = 0 if zero else numel
    return 0


cdef void _order_from_strides(const int64_t* strides, int dim, dim_order_t* order) noexcept:
    """Dims sorted by decreasing stride; equal strides keep ascending dim index (stable)."""
    cdef int i, j
    cdef dim_order_t d
    for i in range(dim):
        order[i] = i
    for i in range(1, dim):
        d = order[i]
        j = i - 1
        while j >= 0 and strides[order[j]] < strides[d]:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = d


cdef int _fill(Metadata m, const int64_t* order, int norder, const int64_t* given,
               int nstrides) except -1:
    """Validate dim_order / strides (already read) against m.sizes; compute m.strides."""
    cdef bint seen[kTensorDimensionLimit]
    cdef int i
    if norder > 0 and norder != m.dim:
        raise_error(Error.InvalidArgument,
                    f"dim_order={c_tuple64(order, norder)!r} has {norder} entries but sizes has "
                    f"{m.dim}; it must be empty or match")
    if nstrides > 0 and nstrides != m.dim:
        raise_error(Error.InvalidArgument,
                    f"strides={c_tuple64(given, nstrides)!r} has {nstrides} entries but "
                    f"sizes has {m.dim}; it must be empty or match")
    if norder > 0:
        for i in range(m.dim):
            seen[i] = False
        for i in range(m.dim):
            if order[i] < 0 or order[i] >= m.dim or seen[order[i]]:
                raise_error(Error.InvalidArgument,
                            f"dim_order={c_tuple64(order, norder)!r} is not a permutation "
                            f"of 0..{m.dim - 1}")
            seen[order[i]] = True
            m.dim_order[i] = <dim_order_t>order[i]
    elif nstrides > 0:
        _order_from_strides(given, m.dim, m.dim_order)
    else:
        for i in range(m.dim):
            m.dim_order[i] = i
    c_dim_order_to_strides(m.sizes, m.dim_order, m.dim, m.strides)
    if nstrides > 0:
        for i in range(m.dim):
            if given[i] != m.strides[i] and m.sizes[i] != 1:
                raise_error(Error.InvalidArgument,
                            f"strides={c_tuple64(given, nstrides)!r} disagree with "
                            f"dim_order={c_tuple8(m.dim_order, m.dim)!r}: strides[{i}] is "
                            f"{given[i]} but sizes {c_tuple64(m.sizes, m.dim)!r} in that "
                            f"order need {m.strides[i]} (only a size-1 dim may differ)")
    return 0


cdef int c_fill_metadata(Metadata m, object dim_order, object strides) except -1:
    """Read and validate ``dim_order`` and ``strides`` against ``m.sizes``; compute ``m.strides``."""
    cdef int64_t order[kTensorDimensionLimit]
    cdef int64_t given[kTensorDimensionLimit]
    cdef int norder = c_read_ints(dim_order, order, "dim_order")
    cdef int nstrides = c_read_ints(strides, given, "strides")
    return _fill(m, order, norder, given, nstrides)


cdef Metadata c_metadata(object sizes, object dim_order, object strides):
    """Validate sizes, dim_order and strides (ExecuTorch's make_tensor_ptr checks)."""
    cdef Metadata m = Metadata.__new__(Metadata)
    if sizes is None:
        raise_error(Error.InvalidArgument, "sizes must be a sequence of ints, got None")
    m.dim = c_read_ints(sizes, m.sizes, "sizes")
    c_check_sizes(m)
    c_fill_metadata(m, dim_order, strides)
    return m


cdef int c_fill_strides(Metadata m, const int64_t* strides, int nstrides) except -1:
    """:func:`c_fill_metadata` with strides given as a C array (an array's or a DLPack
    tensor's) and no dim_order: the dim_order they describe, checked."""
    return _fill(m, NULL, 0, strides, nstrides)


cdef int64_t c_nbytes(int64_t numel, int type) except -1:
    """``numel * element_size(type)``, or InvalidArgumentError when it overflows int64."""
    cdef int64_t esize = c_element_size(type)
    if numel > INT64_MAX // esize:
        raise_error(Error.InvalidArgument,
                    f"sizes: the byte count overflows int64 ({numel} elements of {esize} bytes)")
    return numel * esize
