"""Safety under hostile conditions: user code that changes a tensor while etptr builds
from it, buffers their owners try to take back, garbage cycles, interrupts, threads,
allocators that misbehave, DLPack producers with Python destructors.

Each test names the class of defect it guards against. The rules they check:
every result is built from a snapshot of its source taken before user code ran, and
claims no more bytes than its memory holds; memory stays valid (and its owner
pinned) while any tensor over it lives; an interrupt stays an interrupt; the first
error is the one raised; every DLPack deleter runs exactly once; the test allocator
and the registry survive threads. GPU-only checks are in tests/cuda/test_safety_cuda.py.
"""
import ctypes
import gc
import mmap
import os
import re
import time
import tracemalloc
import warnings
import weakref

import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST
from etptr.testing import HostDeviceAllocator, use_allocator

from _helpers import buffer_address as _buffer_address, device_bytes as _device_bytes
from _helpers import arange_from_one as _arange, host_tensor as _host_tensor
from _helpers import outcome as _outcome, run_threads


class _HookAllocator(HostDeviceAllocator):
    """A HostDeviceAllocator that runs ``hook()`` inside ``allocate`` or ``allocate_host``
    (once, then forgets it) and records the size of every host block it hands out."""

    def __init__(self, where):
        super().__init__()
        self.where = where
        self.hook = None
        self.host_blocks = {}      # address -> bytes, of allocate_host results

    def _run_hook(self, where):
        if self.hook is not None and self.where == where:
            hook, self.hook = self.hook, None
            hook()

    def allocate(self, nbytes, index, alignment=etptr.DEFAULT_ALIGNMENT):
        self._run_hook("allocate")
        return super().allocate(nbytes, index, alignment)

    def allocate_host(self, nbytes, index):
        self._run_hook("allocate_host")
        buf = bytearray(max(nbytes, 1))
        self.host_blocks[_buffer_address(buf)] = len(buf)
        return buf


# ---------------------------------------------------------------------------------------
# Item 1 (a clone whose metadata outgrows its memory): results come from the snapshot


def test_clone_to_device_is_built_from_the_source_before_allocate_ran():
    """Item 1: ``allocate`` (user code) grows the CPU source back to its bound; the device
    clone still has the sizes the source had when the call began, and fits its memory."""
    alloc = _HookAllocator("allocate")
    src = _host_tensor(16)
    etptr.resize_tensor_ptr(src, [4])
    alloc.hook = lambda: etptr.resize_tensor_ptr(src, [16])
    with use_allocator(alloc):
        out = etptr.clone_tensor_ptr_to(src, "cuda")
        assert src.sizes == (16,)                       # the hook ran
        assert out.nbytes <= alloc.last_allocate_size == 16
        assert out.sizes == (4,) and out.strides == (1,)
        assert _device_bytes(out) == _arange(4).tobytes()
        del out


def test_clone_to_cpu_is_built_from_the_source_before_allocate_host_ran():
    """Item 1: ``allocate_host`` grows the device source back to its bound; the CPU clone
    claims no more bytes than ``allocate_host`` gave and holds the source's data as it was."""
    alloc = _HookAllocator("allocate_host")
    with use_allocator(alloc):
        dev = etptr.clone_tensor_ptr_to(_host_tensor(16), "cuda")
        etptr.resize_tensor_ptr(dev, [4])
        alloc.hook = lambda: etptr.resize_tensor_ptr(dev, [16])
        out = etptr.clone_tensor_ptr_to(dev, "cpu")
        assert dev.sizes == (16,)                       # the hook ran
        assert out.data_ptr in alloc.host_blocks
        assert out.nbytes <= alloc.host_blocks[out.data_ptr] == 16
        assert out.sizes == (4,)
        np.testing.assert_array_equal(out.numpy(), _arange(4))
        del out, dev


class _GrowOnIndex:
    """A size whose ``__index__`` runs ``action()`` first."""

    def __init__(self, value, action):
        self.value, self.action = value, action

    def __index__(self):
        self.action()
        return self.value


class _GrowOnLen(list):
    """A sizes list whose ``__len__`` runs ``action()`` first."""

    def __init__(self, items, action):
        super().__init__(items)
        self.action = action

    def __len__(self):
        self.action()
        return super().__len__()


@pytest.mark.parametrize("user_code", ["__index__", "__len__", "deleter"])
def test_view_is_checked_against_the_source_before_user_code_ran(user_code):
    """Item 1: while ``make_tensor_ptr(src, sizes)`` reads ``sizes``, user code (a size's
    ``__index__``, the sequence's ``__len__``, or a deleter run by dropping another tensor
    there) grows ``src`` from 4 elements back to its bound of 16. The view is checked
    against the 4 elements ``src`` had when the call began: 16 is refused."""
    src = _host_tensor(16)
    etptr.resize_tensor_ptr(src, [4])

    def grow():
        etptr.resize_tensor_ptr(src, [16])

    if user_code == "__index__":
        sizes = [_GrowOnIndex(16, grow)]
    elif user_code == "__len__":
        sizes = _GrowOnLen([16], grow)
    else:
        backing = np.zeros(1, np.float32)
        other = [etptr.make_tensor_ptr([1], backing.ctypes.data, deleter=lambda ptr: grow())]
        sizes = [_GrowOnIndex(16, other.clear)]          # the deleter runs inside the call
    with pytest.raises(etptr.InvalidArgumentError, match="larger than its source"):
        etptr.make_tensor_ptr(src, sizes)
    assert src.sizes == (16,)                            # the user code ran


# ---------------------------------------------------------------------------------------
# Item 2 (allocate_host buffers are held): the export lives as long as the tensor


class _BufferHostAllocator(HostDeviceAllocator):
    """``allocate_host`` returns a fresh mmap or bytearray, kept in ``held``."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.held = []

    def allocate_host(self, nbytes, index):
        buf = mmap.mmap(-1, max(nbytes, 1)) if self.kind == "mmap" else bytearray(max(nbytes, 1))
        self.held.append(buf)
        return buf


def _take_back(buf):
    """Every way the owner of ``buf`` could take its memory back (each must be refused)."""
    if isinstance(buf, mmap.mmap):
        return [buf.close, lambda: buf.resize(1 << 20)]
    return [lambda: buf.extend(b"x" * 4096), buf.clear, lambda: buf.__delitem__(slice(0, 8))]


@pytest.mark.parametrize("kind", ["mmap", "bytearray"])
@pytest.mark.parametrize("how", ["clone_to_cpu", "empty_pinned"])
def test_allocate_host_buffer_cannot_be_taken_back_under_a_live_tensor(kind, how):
    """Item 2: the buffer ``allocate_host`` returned cannot be closed or resized while the
    tensor over it lives (BufferError); once the tensor is gone it can."""
    alloc = _BufferHostAllocator(kind)
    values = _arange(1024)
    with use_allocator(alloc):
        if how == "clone_to_cpu":
            dev = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(values), "cuda")
            h = etptr.clone_tensor_ptr_to(dev, "cpu")
            del dev
        else:
            h = etptr.empty([1024], ST.Float, pinned=True)
            h.numpy()[:] = values
        assert len(alloc.held) == 1
        buf = alloc.held[0]
        for take_back in _take_back(buf):
            with pytest.raises(BufferError):
                take_back()
        assert h.numpy().sum() == values.sum()          # still the same memory, intact
        del h
        gc.collect()
        _take_back(buf)[0]()                            # released with the tensor


# ---------------------------------------------------------------------------------------
# Item 3 (views and deleters in garbage cycles)


class _Reader:
    """In a cycle with a view: its finalizer reads the view's data."""

    def __init__(self, events):
        self.events = events

    def __del__(self):
        try:
            self.events.append(("read", self.view.numpy().tolist()))
        except BaseException as exc:      # noqa: BLE001 - recorded, checked by the test
            self.events.append(("read failed", repr(exc)))


def _finalizer_reads_view_in_cycle(reader_first):
    """Collect a cycle of a base tensor (its deleter poisons its ctypes buffer), a view of
    it and a _Reader of the view, created in the given order; return what happened."""
    events = []
    buf = ctypes.create_string_buffer(16)
    ctypes.memmove(buf, _arange(4).tobytes(), 16)

    def deleter(ptr, buf=buf):
        events.append(("deleted", ptr == ctypes.addressof(buf)))
        ctypes.memset(buf, 0xFF, 16)          # every float reads as NaN afterwards

    if reader_first:
        reader = _Reader(events)
        base = etptr.make_tensor_ptr([4], ctypes.addressof(buf), deleter=deleter)
    else:
        base = etptr.make_tensor_ptr([4], ctypes.addressof(buf), deleter=deleter)
        reader = _Reader(events)
    reader.view = etptr.make_tensor_ptr(base, [2])
    reader.cycle = [base, reader]
    ref = weakref.ref(reader)
    del base, reader
    assert events == []
    gc.collect()
    assert ref() is None, "one collection frees the cycle"
    return events


def test_finalizer_in_a_cycle_reads_a_view_before_the_base_deleter_runs():
    """Item 3: a cycle holds a base tensor (its deleter poisons its ctypes buffer), a view
    of it and an object whose ``__del__`` reads the view. One collection frees it all; the
    read sees intact data, and the deleter runs once, after it. Both creation orders (they
    decide the order in which the collector runs the finalizers)."""
    for reader_first in (True, False):
        events = _finalizer_reads_view_in_cycle(reader_first)
        assert events == [("read", [1.0, 2.0]), ("deleted", True)], (reader_first, events)


_kept = []


class _Keeper:
    """Its finalizer stores the view it holds in a module global: the view survives the
    collection of its cycle."""

    def __del__(self):
        _kept.append(self.view)


def test_view_kept_alive_by_a_finalizer_reports_release_not_null_data():
    """Item 3: a view that a finalizer kept past the collection of its cycle either still
    works or raises InvalidStateError saying its memory was released, never the
    "null data (made with data=None)" of a tensor that never had memory."""
    calls = []
    buf = np.array([1, 2, 3, 4], np.float32)
    keeper = _Keeper()
    base = etptr.make_tensor_ptr([4], buf.ctypes.data, deleter=lambda ptr, buf=buf: calls.append(ptr))
    keeper.view = etptr.make_tensor_ptr(base, [2])
    keeper.cycle = [keeper, base]
    del keeper, base
    try:
        gc.collect()
        assert len(_kept) == 1
        view = _kept[0]
        for use in (view.numpy, lambda: etptr.clone_tensor_ptr(view),
                    lambda: etptr.clone_tensor_ptr(view, ST.Double)):
            exc = _outcome(use)
            if exc is not None:
                assert isinstance(exc, etptr.InvalidStateError), exc
                assert "released" in str(exc) and "data=None" not in str(exc)
        if _outcome(view.numpy) is None:
            np.testing.assert_array_equal(view.numpy(), [1, 2])
        assert len(calls) <= 1
    finally:
        _kept.clear()
        gc.collect()
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------
# Item 4 (a sequence read without a bound): a length is read once, then that many items


class _EndlessPair:
    """``len()`` says 2; ``__getitem__`` never raises IndexError (so iterating never ends).
    It gives up after ``limit`` reads so that a defect fails the test instead of hanging it."""

    limit = 10_000

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 2

    def __getitem__(self, i):
        self.reads += 1
        if self.reads > self.limit:
            raise RuntimeError(f"read {self.reads} items of a sequence whose len() is 2")
        return 0


@pytest.mark.parametrize("overload", ["address", "view"])
def test_mismatched_dim_order_of_endless_sequence_is_refused_after_len_reads(overload):
    """Item 4: ``dim_order=S()`` with ``len(S()) == 2`` for 3 sizes, where ``S.__getitem__``
    never raises: InvalidArgumentError after reading the 2 items ``len`` promised (building
    the error message may not iterate the caller's object)."""
    order = _EndlessPair()
    if overload == "address":
        call = lambda: etptr.make_tensor_ptr([1, 2, 3], None, dim_order=order)  # noqa: E731
    else:
        src = etptr.zeros([6])
        call = lambda: etptr.make_tensor_ptr(src, [1, 2, 3], dim_order=order)  # noqa: E731
    with pytest.raises(etptr.InvalidArgumentError, match="dim_order"):
        call()
    assert order.reads == 2


# ---------------------------------------------------------------------------------------
# Item 5 (an interrupted cast leaks nothing)


class _InterruptOnExit:
    """Wraps a context-manager factory: while ``armed``, a block that ends normally is
    interrupted (KeyboardInterrupt from ``__exit__``), as a signal arriving there would."""

    def __init__(self, factory):
        self.factory = factory
        self.armed = False
        self.interrupts = 0

    def __call__(self, *args, **kwargs):
        return _InterruptingContext(self, self.factory(*args, **kwargs))


class _InterruptingContext:
    def __init__(self, owner, inner):
        self.owner, self.inner = owner, inner

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *exc_info):
        suppress = self.inner.__exit__(*exc_info)
        if exc_info[0] is None and self.owner.armed:
            self.owner.interrupts += 1
            raise KeyboardInterrupt("interrupted at the end of a with block")
        return suppress


@pytest.mark.thread_unsafe
def test_interrupted_cast_clone_leaks_nothing(monkeypatch):
    """Item 5: ``clone_tensor_ptr(t, type=Double)`` interrupted where its cast helpers'
    ``with`` blocks end (``numpy.errstate``, ``warnings.catch_warnings``), 20 times, keeps
    none of the 2 MiB cast arrays (traced by tracemalloc, which sees NumPy's data)."""
    errstate = _InterruptOnExit(np.errstate)
    catch = _InterruptOnExit(warnings.catch_warnings)
    monkeypatch.setattr(np, "errstate", errstate)
    monkeypatch.setattr(warnings, "catch_warnings", catch)
    src = etptr.make_tensor_ptr(np.ones(1 << 18, np.float32))      # 1 MiB; the cast 2 MiB
    calls, interrupted = 20, 0
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        errstate.armed = catch.armed = True
        for _ in range(calls):
            exc = _outcome(lambda: etptr.clone_tensor_ptr(src, type=ST.Double))
            if isinstance(exc, KeyboardInterrupt):
                interrupted += 1
            else:
                assert exc is None, exc
        errstate.armed = catch.armed = False
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert interrupted > 0, "no cast was interrupted: the test no longer reaches the cast"
    assert grown < (1 << 20), f"{grown} bytes kept after {interrupted} interrupted casts"


# ---------------------------------------------------------------------------------------
# Item 6 (a cast clone racing a resize)


@pytest.mark.thread_unsafe
def test_cast_clone_racing_a_resize_is_one_consistent_snapshot():
    """Item 6: threads resize a DYNAMIC_BOUND tensor of 1..64 while others cast-clone it
    to Double; every result is a tensor whose data is the source at one of its sizes
    (never a NumPy broadcast error, never the first element repeated)."""
    src = _host_tensor(64)
    sizes = [64, 1, 32, 3]
    results = []

    def resize(deadline):
        i = 0
        while time.monotonic() < deadline:
            etptr.resize_tensor_ptr(src, [sizes[i % len(sizes)]])
            i += 1

    def clone(deadline):
        while time.monotonic() < deadline:
            out = etptr.clone_tensor_ptr(src, type=ST.Double)
            n = out.numel()
            assert isinstance(out, etptr.TensorPtr) and out.sizes in [(k,) for k in sizes], out
            assert out.scalar_type == ST.Double
            np.testing.assert_array_equal(out.numpy(), _arange(n, np.float64))
            results.append(n)

    errors = run_threads([resize] * 4 + [clone] * 4, 1.5)
    assert errors == []
    assert results, "no clone finished"


# ---------------------------------------------------------------------------------------
# Item 7 (an interrupt stays an interrupt)


class _Interrupting:
    """Reading ``__class__`` raises KeyboardInterrupt, as a signal arriving while an
    ``isinstance`` check reads it would (abstract base classes and non-exact type checks
    read ``__class__``)."""

    @property
    def __class__(self):
        raise KeyboardInterrupt("interrupted inside isinstance")


_INTERRUPT_CASES = {
    "sizes": lambda x: etptr.make_tensor_ptr(x, None),
    "view sizes": lambda x: etptr.make_tensor_ptr(etptr.zeros([2]), x),
    "empty sizes": lambda x: etptr.empty(x),
    "list element": lambda x: etptr.make_tensor_ptr([1.0, x, 2.0]),
    "list element with sizes": lambda x: etptr.make_tensor_ptr([1], [x]),
    "dim_order": lambda x: etptr.make_tensor_ptr([2], None, dim_order=x),
    "strides": lambda x: etptr.make_tensor_ptr([2], None, strides=x),
    "data": lambda x: etptr.make_tensor_ptr([2], x),
    "cuda array interface read-only flag": lambda x: etptr.from_cuda_array_interface(
        _CaiObject(x), device="cuda"),
    "fill value": lambda x: etptr.full([4], x),
    "type": lambda x: etptr.make_tensor_ptr([2], None, type=x),
    "randint bound": lambda x: etptr.randint(x, 10, [2]),
    "device type": lambda x: etptr.Device(x),
    "device index": lambda x: etptr.Device(etptr.DeviceType.CUDA, x),
}

# Checks that still give up the interrupt, in modules this suite does not own.


class _CaiObject:
    def __init__(self, readonly):
        self.readonly = readonly

    @property
    def __cuda_array_interface__(self):
        return {"shape": (2,), "typestr": "<f4", "data": (4096, self.readonly), "version": 3}


@pytest.mark.parametrize("case", list(_INTERRUPT_CASES))
def test_interrupt_inside_an_isinstance_check_stays_an_interrupt(case):
    """Item 7: an interrupt raised while etptr checks an argument's type (here: by reading
    its ``__class__``) propagates as KeyboardInterrupt, not as InvalidTypeError,
    SystemError or a TypeError from a later step."""
    exc = _outcome(lambda: _INTERRUPT_CASES[case](_Interrupting()))
    assert type(exc) is KeyboardInterrupt, repr(exc)


_BUILTIN_TYPES = frozenset({
    "bool", "int", "float", "complex", "str", "bytes", "bytearray", "list", "tuple", "dict",
    "set", "frozenset", "memoryview", "type", "object", "slice", "range"})


def _split_top_level(text):
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _closing(text, open_at):
    """Index of the bracket closing the one at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced brackets")


def tuple_isinstance_offenders(source):
    """``isinstance(x, (A, B, ...))`` calls in Cython ``source`` whose tuple names
    something other than a builtin type, as (line number, call text).

    Cython compiles such a tuple into PyObject_IsInstance calls whose -1 (an exception,
    e.g. KeyboardInterrupt) it does not check; builtin types become exact type checks
    that cannot fail, so tuples of builtins only are never reported.
    """
    found = []
    for m in re.finditer(r"\bisinstance\(", source):
        line_start = source.rfind("\n", 0, m.start()) + 1
        if "#" in source[line_start:m.start()]:
            continue                              # in a comment
        end = _closing(source, m.end() - 1)
        args = _split_top_level(source[m.end():end])
        if len(args) != 2 or not (args[1].startswith("(") and args[1].endswith(")")):
            continue
        names = _split_top_level(args[1][1:-1])
        if any(n not in _BUILTIN_TYPES for n in names):
            found.append((source.count("\n", 0, m.start()) + 1, source[m.start():end + 1]))
    return found


def test_tuple_isinstance_guard_reports_only_non_builtin_tuples():
    """Item 7: the static guard below flags a tuple with a Python class and leaves
    builtin-only tuples, single classes and comments alone."""
    src = ("if isinstance(a, (int, float)) or isinstance(b, (tuple, list)):\n"
           "    pass  # isinstance(c, (int, np.integer)) in a comment\n"
           "x = isinstance(d, np.integer) and isinstance(e, Mapping)\n"
           "y = isinstance(f, (bool,\n                  np.bool_))\n"
           "z = isinstance(g, (int, Mapping))\n")
    assert [line for line, _ in tuple_isinstance_offenders(src)] == [4, 6]


def _cython_sources():
    root = os.path.dirname(os.path.abspath(etptr.__file__))
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith((".pyx", ".pxi")):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


@pytest.mark.parametrize("path", _cython_sources())
def test_no_tuple_isinstance_with_a_python_class(path):
    """Item 7 (static guard): no ``isinstance(x, (..., SomePythonClass))`` is left in the
    Cython sources; split such a check into one ``isinstance`` per class."""
    root = os.path.dirname(os.path.abspath(etptr.__file__))
    with open(os.path.join(root, path), encoding="utf-8") as f:
        offenders = tuple_isinstance_offenders(f.read())
    assert offenders == [], "\n".join(f"{path}:{line}: {call}" for line, call in offenders)


def test_cuda_array_interface_read_only_flag_of_the_wrong_type_is_refused():
    """Item 7 (companion): splitting the read-only check kept its meaning: a flag that is
    not a bool is refused with InvalidTypeError naming the field; NumPy's bool passes."""
    with pytest.raises(etptr.InvalidTypeError, match=r"\['data'\]\[1\]"):
        etptr.from_cuda_array_interface(_CaiObject(1), device="cuda")
    t = etptr.from_cuda_array_interface(_CaiObject(np.bool_(True)), device="cuda")
    assert t.readonly and t.device == etptr.Device("cuda:0")
