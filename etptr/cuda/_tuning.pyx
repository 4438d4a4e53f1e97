"""The copy engine's tuning: every measured constant in one structure, and one door.

The engine's modules read :c:type:`Tuning` through ``c_tuning()``; nothing else in
the package changes it. Probes and tests go through :func:`tune` (or the
:func:`tuned` block) to try other values, and through the measurement equipment
kept here: the trace table of the pipeline's steps and the chunk hook. Each default
was chosen by a measurement on H200 hosts (PCIe Gen5 x16); the question, answer and
result file of each are in ``bench/results/DECISIONS.md`` under the field's name.

The users' settings (threads, slot bytes, slots, the small-copy threshold) are not
tuning: they are :func:`etptr.cuda.set_copy_config` and its block.
"""
from contextlib import contextmanager

from libc.stdint cimport INT64_MAX, int64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from etptr._core._args cimport c_int_arg
from etptr._core._codes cimport DEVICE_ALIGNMENT_BYTES
from etptr._core._error cimport raise_error
from etptr._core._host_copy cimport FILL_PIECES, READ_BOUNCE_MAX

from etptr._core._error import Error

cdef Tuning _t
_t.target_chunks = 4
_t.min_chunk = 1 << 20
_t.signal_every = 4
_t.fill_pieces = FILL_PIECES
_t.ramp_first = 8 << 20
_t.ramp_growth = 150
_t.ramp_max = 256 << 20
_t.nt_max = 64 << 20
_t.nt_file_max = 128 << 20
_t.read_bounce = 256 << 10
_t.stream_writes = True
_t.fence = True
_t.fence_spin_ns = 200000
_t.fence_max = 1 << 20
_t.large_piece = 1 << 20
_t.scattered_pipeline = True
_t.scratch_max = 64 << 20
_t.near_gap = DEVICE_ALIGNMENT_BYTES
_t.trace = False
_t.chunk_hook = False


cdef Tuning* c_tuning() noexcept nogil:
    """The engine's tuning (read it; change it through :func:`tune` only)."""
    return &_t


# name -> (lowest, highest) for integers; None for flags
_FIELDS = {
    "target_chunks": (1, 1 << 20),
    "min_chunk": (4096, INT64_MAX),
    "signal_every": (1, 1 << 20),
    "fill_pieces": (1, 64),
    "ramp_first": (0, INT64_MAX),
    "ramp_growth": (101, 1000),
    "ramp_max": (0, INT64_MAX),
    "nt_max": (0, INT64_MAX),
    "nt_file_max": (0, INT64_MAX),
    "read_bounce": (0, READ_BOUNCE_MAX),
    "stream_writes": None,
    "fence": None,
    "fence_spin_ns": (0, 10 ** 10),
    "fence_max": (0, INT64_MAX),
    "large_piece": (1, INT64_MAX),
    "scattered_pipeline": None,
    "scratch_max": (1 << 16, 1 << 40),
    "near_gap": (0, 1 << 20),
    "trace": None,
}


def values():
    """Every tuning field and its value, and ``chunk_hook`` (the callable, or None)."""
    out = dict(<dict>_t)
    out.pop("chunk_hook")
    out["chunk_hook"] = _hook
    return out


def tune(**changes):
    """Change tuning fields (and ``chunk_hook``); return their previous values.

    The one door to the engine's tuning, for probes and tests. ``trace=True`` clears
    the trace table and starts stamping; ``chunk_hook=fn`` calls ``fn(direction, i)``
    (``"h2d"`` or ``"d2h"``, the chunk's index) after each pipelined chunk, None stops.

    Raises
    ------
    InvalidArgumentError
        An unknown field or a value out of range; nothing is changed then.
    """
    global _hook, _trace_n, _t
    checked = {}
    for name, value in changes.items():
        if name == "chunk_hook":
            if value is not None and not callable(value):
                raise_error(Error.InvalidArgument, f"chunk_hook={value!r:.60}: not callable")
            checked[name] = value
        elif name not in _FIELDS:
            raise_error(Error.InvalidArgument,
                        f"{name!r} is no tuning field (fields: {', '.join(_FIELDS)})")
        elif _FIELDS[name] is None:
            checked[name] = bool(value)
        else:
            lo, hi = _FIELDS[name]
            checked[name] = c_int_arg(value, name, lo, hi)
    before = values()
    previous = {name: before[name] for name in checked}
    fields = dict(<dict>_t)
    for name, value in checked.items():
        if name == "chunk_hook":
            _hook = value
            fields["chunk_hook"] = value is not None
        else:
            fields[name] = value
    if checked.get("trace"):
        _trace_n = 0
    _t = fields
    return previous


@contextmanager
def tuned(**changes):
    """``tune(**changes)`` for the block; the previous values come back after it."""
    previous = tune(**changes)
    try:
        yield
    finally:
        tune(**previous)


# ------------------------------------------------------------------ the chunk hook

cdef object _hook = None


cdef int c_call_chunk_hook(bint h2d, int64_t chunk) except -1:
    """Call the chunk hook, if one is set (the caller holds the GIL)."""
    hook = _hook
    if hook is not None:
        hook("h2d" if h2d else "d2h", chunk)
    return 0


# ------------------------------------------------------------------ the trace table

# While ``trace`` is on, each pipelined copy's steps are stamped (CLOCK_MONOTONIC, ns)
# into a fixed table. Each stamp claims its row atomically, so copies in several
# threads cannot write past the table; their rows interleave (one copy at a time gives
# one timeline).
cdef extern from *:
    """
    static inline long long etptr_trace_claim(long long* n) {
        return __atomic_fetch_add(n, 1, __ATOMIC_RELAXED);
    }
    """
    long long etptr_trace_claim(long long* n) noexcept nogil

cdef enum:
    _TRACE_MAX = 8192
cdef long long _trace_n = 0
cdef int _trace_step[_TRACE_MAX]
cdef int64_t _trace_number[_TRACE_MAX]
cdef int64_t _trace_ns[_TRACE_MAX]

#: The names of the steps (STEP_BEGIN ... STEP_SYNCED in _tuning.pxd).
TRACE_STEPS = ("begin", "slots", "waited", "copied", "queued", "synced")


cdef void c_mark(int step, int64_t number) noexcept nogil:
    """Stamp ``step`` (one of the STEP_ codes) with ``number``; the caller has seen
    ``trace`` on."""
    cdef timespec ts
    cdef long long row = etptr_trace_claim(&_trace_n)
    if row < 0 or row >= _TRACE_MAX:
        return                  # the table is full
    clock_gettime(CLOCK_MONOTONIC, &ts)
    _trace_step[row] = step
    _trace_number[row] = number
    _trace_ns[row] = <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


def take_trace():
    """The stamps so far (at most 8192), as ``[(step name, number, ns)]``, and clear the
    table. Take it once the traced copies have returned."""
    global _trace_n
    cdef long long n = _trace_n if _trace_n < _TRACE_MAX else _TRACE_MAX
    out = [(TRACE_STEPS[_trace_step[i]], _trace_number[i], _trace_ns[i]) for i in range(n)]
    _trace_n = 0
    return out
