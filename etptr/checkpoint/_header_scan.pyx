"""The safetensors header's fast path: one pass over the bytes of a well-formed header.

:func:`~etptr.checkpoint._format.parse_header` hands every header here first.
A header as writers make them (names, keys and dtypes without escapes, entries
of exactly ``dtype``, ``shape`` and ``data_offsets``, unsigned integers of at
most 18 digits, a ``__metadata__`` object of such strings) is decoded, checked
against every rule of :mod:`~etptr.checkpoint._format` and put in file order
in one pass over its bytes: 290 entries in about 0.1 ms, against 2 ms for
decoding the JSON with the strict hooks and checking the objects in Python.

For anything else (an escape, a float, a sign, a leading zero, ``true``,
another key, a repeated key, any broken rule) :func:`scan_header` returns None
and the full reader decides, with its messages. The fast path accepts only
headers the full reader accepts, with the same result, and raises nothing:
the header tests and the corrupted-header fuzz hold it to that.

Also here: :class:`TensorEntry`, one tensor of a header, built directly by the
scan (a frozen dataclass took as long to build as the scan of its entry).
"""
cimport cython
from cpython.number cimport PyNumber_Index
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, int64_t

from etptr._core._error cimport raise_error

from etptr._core._error import Error

cdef int _MAX_DIMS = 16        # ExecuTorch's kTensorDimensionLimit
cdef int _MAX_DIGITS = 18      # every integer of 18 digits fits int64


@cython.final
cdef class TensorEntry:
    """One tensor of a safetensors header (immutable, compared by value).

    ``TensorEntry(name, scalar_type, shape, begin, end)``, ``0 <= begin <= end``

    Attributes
    ----------
    name : str
    scalar_type : ScalarType
    shape : tuple of int, length ndim (at most 16), in elements
    begin, end : int
        Byte offsets of the tensor's data relative to the start of the data
        section; ``end - begin == nbytes``.
    """

    cdef readonly str name
    cdef readonly object scalar_type
    cdef readonly tuple shape
    cdef readonly int64_t begin
    cdef readonly int64_t end
    cdef object __weakref__

    __match_args__ = ("name", "scalar_type", "shape", "begin", "end")

    def __init__(self, str name, scalar_type, tuple shape, begin, end):
        cdef object b = PyNumber_Index(begin), e = PyNumber_Index(end)
        if not 0 <= b <= e <= INT64_MAX:
            raise_error(Error.InvalidArgument,
                        f"begin={b}, end={e}: need 0 <= begin <= end < 2**63 (byte offsets)")
        self.name = name
        self.scalar_type = scalar_type
        self.shape = shape
        self.begin = b
        self.end = e

    @property
    def nbytes(self):
        """Bytes of tensor data (``end - begin``)."""
        return self.end - self.begin     # both in [0, 2**63): no overflow

    def _key(self):
        return (self.name, self.scalar_type, self.shape, self.begin, self.end)

    def __eq__(self, other):
        if type(other) is not TensorEntry:
            return NotImplemented
        return self._key() == (<TensorEntry>other)._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"TensorEntry(name={self.name!r}, scalar_type={self.scalar_type!r}, "
                f"shape={self.shape!r}, begin={self.begin}, end={self.end})")

    def __reduce__(self):
        return (TensorEntry, self._key())


cdef struct _Cursor:
    const unsigned char* p
    const unsigned char* end


cdef inline void _skip_space(_Cursor* c) noexcept:
    """Skip JSON whitespace (space, tab, line feed, carriage return)."""
    cdef unsigned char ch
    while c.p < c.end:
        ch = c.p[0]
        if ch != 32 and ch != 10 and ch != 13 and ch != 9:
            return
        c.p += 1


cdef inline bint _take(_Cursor* c, unsigned char ch) noexcept:
    """Skip whitespace, then consume ``ch`` if it comes next."""
    _skip_space(c)
    if c.p < c.end and c.p[0] == ch:
        c.p += 1
        return True
    return False


cdef str _string(_Cursor* c):
    """The JSON string at the cursor, decoded, if it holds no escape and no control
    character and is valid UTF-8; else None."""
    cdef const unsigned char* start
    cdef unsigned char ch
    if not _take(c, 34):                  # '"'
        return None
    start = c.p
    while True:
        if c.p >= c.end:
            return None
        ch = c.p[0]
        if ch == 34:
            break
        if ch == 92 or ch < 32:           # '\\' or a control character
            return None
        c.p += 1
    c.p += 1
    try:
        return PyUnicode_DecodeUTF8(<char*>start, c.p - 1 - start, NULL)
    except UnicodeDecodeError:
        return None


cdef bint _uint(_Cursor* c, int64_t* out) noexcept:
    """A JSON integer without sign, leading zero, fraction or exponent, of at most 18
    digits, into ``out``."""
    cdef int64_t v = 0
    cdef int digits = 0
    cdef unsigned char ch
    _skip_space(c)
    while c.p < c.end:
        ch = c.p[0]
        if ch < 48 or ch > 57:
            break
        if digits == _MAX_DIGITS or (digits == 1 and v == 0):
            return False
        v = v * 10 + (ch - 48)
        digits += 1
        c.p += 1
    if digits == 0:
        return False
    if c.p < c.end and (c.p[0] == 46 or c.p[0] == 101 or c.p[0] == 69):    # '.', 'e', 'E'
        return False
    out[0] = v
    return True


cdef int _uints(_Cursor* c, int64_t* out, int most) noexcept:
    """A JSON array of at most ``most`` such integers, into ``out``: their count, or -1."""
    cdef int n = 0
    if not _take(c, 91):                  # '['
        return -1
    if _take(c, 93):                      # ']'
        return 0
    while True:
        if n == most or not _uint(c, &out[n]):
            return -1
        n += 1
        if _take(c, 44):                  # ','
            continue
        return n if _take(c, 93) else -1


cdef TensorEntry _entry(_Cursor* c, str name, int64_t data_size, dict dtypes):
    """The entry object at the cursor, checked as ``_format._check_entry`` checks it."""
    cdef int64_t dims[16]
    cdef int64_t offsets[2]
    cdef int ndim = -1, noffsets = -1, k
    cdef int64_t numel = 1, d, esize
    cdef bint zero = False
    cdef str key
    cdef str dtype = None
    cdef TensorEntry e
    if not _take(c, 123):                 # '{'
        return None
    for k in range(3):                    # exactly the three keys, each once
        if k and not _take(c, 44):
            return None
        key = _string(c)
        if key is None or not _take(c, 58):           # ':'
            return None
        if key == "dtype" and dtype is None:
            dtype = _string(c)
            if dtype is None:
                return None
        elif key == "shape" and ndim < 0:
            ndim = _uints(c, dims, _MAX_DIMS)
            if ndim < 0:
                return None
        elif key == "data_offsets" and noffsets < 0:
            noffsets = _uints(c, offsets, 2)
            if noffsets != 2:
                return None
        else:
            return None
    if not _take(c, 125):                 # '}'
        return None
    kind = dtypes.get(dtype)
    if kind is None:
        return None
    esize = (<tuple>kind)[1]             # checked by scan_header: an int > 0
    for k in range(ndim):                 # the product of the nonzero dims must fit int64
        d = dims[k]
        if d == 0:
            zero = True
        elif numel > INT64_MAX // d:
            return None
        else:
            numel *= d
    if zero:
        numel = 0
    if numel > INT64_MAX // esize:
        return None
    if offsets[1] < offsets[0] or offsets[1] > data_size or \
            offsets[1] - offsets[0] != numel * esize:
        return None
    e = TensorEntry.__new__(TensorEntry)
    e.name = name
    e.scalar_type = (<tuple>kind)[0]
    e.shape = tuple([dims[k] for k in range(ndim)])
    e.begin = offsets[0]
    e.end = offsets[1]
    return e


cdef dict _metadata(_Cursor* c):
    """The ``__metadata__`` object at the cursor: str -> str, no key twice."""
    cdef dict out = {}
    cdef str key, value
    if not _take(c, 123):
        return None
    if _take(c, 125):
        return out
    while True:
        key = _string(c)
        if key is None or key in out or not _take(c, 58):
            return None
        value = _string(c)
        if value is None:
            return None
        out[key] = value
        if _take(c, 44):
            continue
        return out if _take(c, 125) else None


def offsets_aligned(bytes raw, alignment):
    """Whether every ``"data_offsets": [begin, end]`` in the header bytes ``raw`` with
    ``begin < end`` has ``begin % alignment == 0`` (``alignment`` > 0, bytes): then a
    checked header lays its file out as the device layout. A hint read without
    checking the header; True where it cannot tell (offsets it does not read).

    Raises
    ------
    InvalidArgumentError
        ``alignment`` is not an integer in ``[1, 2**63)``.
    """
    cdef const unsigned char* key = <const unsigned char*>b'"data_offsets"'
    cdef Py_ssize_t klen = 14, i
    cdef _Cursor c
    cdef int64_t begin, end, align
    try:
        a = PyNumber_Index(alignment)
    except TypeError:
        a = None
    if a is None or isinstance(alignment, bool) or not 0 < a <= INT64_MAX:
        raise_error(Error.InvalidArgument,
                    f"alignment={alignment!r:.40}: must be an integer in [1, 2**63) (bytes)")
    align = a
    c.p = <const unsigned char*><const char*>raw
    c.end = c.p + len(raw)
    while c.end - c.p >= klen:
        if c.p[0] != 34:                  # '"'
            c.p += 1
            continue
        for i in range(1, klen):
            if c.p[i] != key[i]:
                break
        else:
            c.p += klen
            if _take(&c, 58) and _take(&c, 91) and _uint(&c, &begin) and _take(&c, 44) \
                    and _uint(&c, &end) and begin < end and begin % align:
                return False
            continue
        c.p += 1
    return True


def _file_order(TensorEntry e):
    return (e.begin, e.end, e.name)


cdef bint _dtypes_ok(dict dtypes):
    """Every value ``(ScalarType, element size > 0)``: what :func:`_entry` relies on."""
    for kind in dtypes.values():
        if type(kind) is not tuple or len(<tuple>kind) != 2 or \
                type((<tuple>kind)[1]) is not int or not 0 < (<tuple>kind)[1] <= 64:
            return False
    return True


def scan_header(bytes raw, data_size, dict dtypes):
    """Decode and check a well-formed safetensors header in one pass.

    Parameters
    ----------
    raw : bytes
        The header's JSON, as in the file (UTF-8, perhaps padded with spaces).
    data_size : int
        Bytes in the file's data section.
    dtypes : dict
        safetensors dtype name -> ``(ScalarType, element size in bytes)``.

    Raises
    ------
    TypeError
        ``raw`` is not bytes, ``data_size`` not an integer or ``dtypes`` not a dict.
    InvalidArgumentError
        A ``dtypes`` value that is not ``(scalar_type, element size 1..64)``.

    Returns
    -------
    (tuple of TensorEntry, dict or None) or None
        The tensors in file order (by ``begin``, then ``end``, then name) and the
        ``__metadata__``, exactly as the full reader returns them; None when the
        header is not one this path reads, or breaks a rule (the full reader then
        decides and names the fault).
    """
    cdef _Cursor c
    cdef set names = set()
    cdef list tensors = []
    cdef dict metadata = None
    cdef str name
    cdef TensorEntry e
    cdef int64_t cursor = 0, ds
    cdef object size = PyNumber_Index(data_size)
    if not _dtypes_ok(dtypes):
        raise_error(Error.InvalidArgument,
                    "dtypes: each value must be (scalar_type, element size in bytes, 1..64)")
    if not 0 <= size <= INT64_MAX:
        return None
    ds = size
    c.p = <const unsigned char*><const char*>raw
    c.end = c.p + len(raw)
    if not _take(&c, 123):
        return None
    if not _take(&c, 125):
        while True:
            name = _string(&c)
            if name is None or not _take(&c, 58):
                return None
            if name == "__metadata__":
                if metadata is not None:
                    return None
                metadata = _metadata(&c)
                if metadata is None:
                    return None
            else:
                if name in names:
                    return None
                e = _entry(&c, name, ds, dtypes)
                if e is None:
                    return None
                names.add(name)
                tensors.append(e)
            if _take(&c, 44):
                continue
            if _take(&c, 125):
                break
            return None
    _skip_space(&c)
    if c.p != c.end:
        return None
    tensors.sort(key=_file_order)
    for e in tensors:                     # the ranges tile the data section exactly
        if e.begin != cursor:
            return None
        cursor = e.end
    if cursor != ds:
        return None
    return tuple(tensors), metadata
