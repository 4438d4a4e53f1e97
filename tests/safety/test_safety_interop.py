"""Safety under hostile conditions (2): DLPack producers and consumers that misbehave
(device= and copy= honoured, every deleter run exactly once, malformed devices), allocators
that misbehave (non-addresses, failing copies and frees, threads, classes kept alive,
memory read through its owner, CuPy looked for once) and races between resizes, views,
clones and drops. The rules are those of test_safety.py."""
import ctypes
import gc
import importlib.abc
import re
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST
from etptr import TensorShapeDynamism as Dyn
from etptr._core._device_allocator import _replace_allocator
from etptr.testing import HostDeviceAllocator, use_allocator

from _dlpack_ctypes import DLManagedTensor, DLManagedTensorVersioned, HandMadeProducer, host_buffer
from _helpers import buffer_address as _buffer_address, device_bytes as _device_bytes
from _helpers import arange_from_one as _arange
from _helpers import outcome as _outcome, run_threads


# ---------------------------------------------------------------------------------------
# Item 8 (from_dlpack honours device= and copy=)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_from_dlpack_of_a_raw_capsule_moves_it_to_the_device_asked_for(host_alloc, versioned):
    """Item 8: ``from_dlpack(capsule, device="cuda")`` copies the data to the device
    through the registered allocator instead of returning a CPU tensor."""
    a = _arange(6)
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    t = etptr.from_dlpack(cap, device="cuda")
    assert t.device == etptr.Device("cuda:0")
    assert host_alloc.h2d_count == 1 and t.data_ptr == host_alloc.last_allocate_ptr
    assert _device_bytes(t) == a.tobytes()


def test_from_dlpack_copy_true_never_aliases_a_producer_that_ignores_copy():
    """Item 8: a producer that accepts ``copy=True`` but hands back its own memory without
    DLPack's IS_COPIED flag gets copied by etptr; its deleter still runs once."""
    buf = host_buffer([1, 2, 3, 4])
    p = HandMadeProducer(buf, [4])
    t = etptr.from_dlpack(p, copy=True)
    assert p.requests[0].get("copy") is True
    assert t.data_ptr != buf.ctypes.data
    buf[:] = 0
    np.testing.assert_array_equal(t.numpy(), [1, 2, 3, 4])
    gc.collect()
    assert p.settle() == 1


def test_from_dlpack_copy_true_copies_device_data_a_producer_did_not_copy(host_alloc):
    """Item 8: the same for device data: the result is a new device allocation holding
    the producer's bytes."""
    values = _arange(4)
    ptr = host_alloc.allocate(values.nbytes, 0)
    ctypes.memmove(ptr, values.ctypes.data, values.nbytes)
    p = HandMadeProducer(None, [4], data=ptr, device=(2, 0))
    t = etptr.from_dlpack(p, copy=True)
    assert t.device == etptr.Device("cuda:0") and t.data_ptr != ptr
    assert _device_bytes(t) == values.tobytes()
    del t
    gc.collect()
    assert p.settle() == 1
    host_alloc.deallocate(ptr, 0)


# ---------------------------------------------------------------------------------------
# Item 9 (an allocator's non-address is never freed; the first error wins)


@pytest.mark.parametrize("bad", [-1, 2 ** 70, True, np.int64(-8)], ids=repr)
@pytest.mark.parametrize("call", ["clone_tensor_ptr_to", "empty", "full"])
def test_allocate_result_that_is_not_an_address_is_refused_and_never_freed(py_alloc, bad, call):
    """Item 9: ``allocate`` returning something that is not an address raises an error
    naming ``allocate`` and is never handed to ``deallocate``."""
    py_alloc.allocate_result = lambda ptr: bad
    run = {"clone_tensor_ptr_to": lambda: etptr.clone_tensor_ptr_to(etptr.zeros([4]), "cuda"),
           "empty": lambda: etptr.empty([4], device="cuda"),
           "full": lambda: etptr.full([4], 2.0, device="cuda")}[call]
    with pytest.raises((etptr.InvalidArgumentError, etptr.InvalidTypeError), match="allocate"):
        run()
    gc.collect()
    assert py_alloc.named("deallocate") == []


@pytest.mark.parametrize("call", ["clone_tensor_ptr_to", "full"])
def test_failed_copy_then_failed_free_raises_the_copy_error_first(py_alloc, call):
    """Item 9: when ``copy_host_to_device`` fails and freeing the block fails too, the
    copy's error is raised, with the free's chained to it."""
    copy_error = RuntimeError("copy failed")
    free_error = OSError("free failed")
    py_alloc.h2d_error, py_alloc.dealloc_error = copy_error, free_error
    run = {"clone_tensor_ptr_to": lambda: etptr.clone_tensor_ptr_to(etptr.zeros([4]), "cuda"),
           "full": lambda: etptr.full([4], 2.0, device="cuda")}[call]
    with pytest.raises(RuntimeError) as info:
        run()
    assert info.value is copy_error
    assert free_error in (info.value.__cause__, info.value.__context__)
    assert len(py_alloc.named("deallocate")) == 1


# ---------------------------------------------------------------------------------------
# Item 10 (stream=0 is refused for CUDA exports)


@pytest.mark.parametrize("stream", [0, np.int64(0)], ids=["int", "numpy"])
@pytest.mark.parametrize("max_version", [None, (1, 0)], ids=["legacy", "versioned"])
def test_dlpack_export_of_a_cuda_tensor_refuses_stream_zero(stream, max_version):
    """Item 10: ``__dlpack__(stream=0)`` of a CUDA tensor raises BufferError (DLPack
    forbids the ambiguous 0); 1 and None are accepted."""
    backing = np.zeros(4, np.float32)
    t = etptr.make_tensor_ptr([4], backing.ctypes.data, device="cuda")
    with pytest.raises(BufferError, match="stream=0"):
        t.__dlpack__(stream=stream, max_version=max_version)
    for ok in (None, 1):
        assert type(t.__dlpack__(stream=ok, max_version=max_version)).__name__ == "PyCapsule"


# ---------------------------------------------------------------------------------------
# Item 12 (every DLPack deleter runs exactly once, also with a Python capsule destructor)

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Prototypes of their own (not ctypes.pythonapi's shared function objects, which
# _dlpack_ctypes sets up with other argument types): a destructor gets the dying
# capsule as a raw pointer, which must not be turned back into a Python object.
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))


class DestructorProducer(HandMadeProducer):
    """A HandMadeProducer whose capsules carry a destructor written in Python (a ctypes
    callback), as a producer built with ctypes or cffi has: when a capsule dies still
    named ``dltensor*`` (not consumed), it runs the managed tensor's deleter."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.destructor_calls = 0
        self._by_address = {}

        def destroy(capsule):
            self.destructor_calls += 1
            for name in (b"dltensor_versioned", b"dltensor"):
                if _capsule_is_valid(capsule, name):
                    address = _capsule_get_pointer(capsule, name)
                    self._by_address[address].deleter(address)

        self._destroy = _CAPSULE_DESTRUCTOR(destroy)

    def capsule(self, versioned=True):
        if versioned:
            m = DLManagedTensorVersioned()
            m.version.major, m.version.minor = self.fields["version"]
            m.flags = self.fields["flags"]
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor()
            name = b"dltensor"
        self._fill(m.dl_tensor)
        m.deleter = self._deleter
        self._structs.append(m)
        self._by_address[ctypes.addressof(m)] = m
        return _capsule_new(ctypes.addressof(m), name,
                            ctypes.cast(self._destroy, ctypes.c_void_p))


_BAD_CAPSULES = {
    # name: (producer keywords, the etptr error from_dlpack raises)
    "unknown dtype code": (dict(code=99), etptr.InvalidTypeError),
    "vector lanes": (dict(lanes=4), etptr.NotSupportedError),
    "DLPack 2.0": (dict(version=(2, 0)), etptr.NotSupportedError),
    "17 dims": (dict(shape=[1] * 17), etptr.InvalidArgumentError),
    "null shape": (dict(null_shape=True), etptr.InvalidArgumentError),
    "null data": (dict(data=0, buf=None), etptr.InvalidArgumentError),
    "gapped strides": (dict(shape=[2], strides=[2]), etptr.InvalidArgumentError),
    "unknown device type": (dict(device=(7, 0), dlpack_device=(1, 0)), etptr.NotSupportedError),
    "device disagrees": (dict(device=(2, 0), dlpack_device=(1, 0)), etptr.InvalidArgumentError),
    "negative size": (dict(shape=[-1]), etptr.InvalidArgumentError),
}


def _destructor_producer(**kw):
    buf = kw.pop("buf", host_buffer([1, 2, 3, 4]))
    shape = kw.pop("shape", [4])
    strides = kw.pop("strides", None)
    return DestructorProducer(buf, shape, strides, **kw)


@pytest.mark.parametrize("legacy", [False, True], ids=["versioned", "legacy"])
@pytest.mark.parametrize("case", list(_BAD_CAPSULES))
def test_refused_capsule_with_a_python_destructor_has_its_deleter_run_once(case, legacy):
    """Item 12: a capsule that fails validation raises the etptr error that says why (not
    SystemError), and its Python destructor runs the producer's deleter exactly once."""
    kw, error = _BAD_CAPSULES[case]
    if legacy and case == "DLPack 2.0":
        pytest.skip("legacy capsules carry no version")
    p = _destructor_producer(legacy=legacy, **kw)
    exc = _outcome(lambda: etptr.from_dlpack(p))
    gc.collect()
    assert type(exc) is error, repr(exc)
    assert len(p._structs) == 1                  # one capsule handed out
    assert p.destructor_calls == 1 and p.deleted == 1


@pytest.mark.parametrize("case", ["unknown dtype code", "null data", "gapped strides"])
def test_refused_raw_capsule_stays_with_its_caller_and_is_deleted_once(case):
    """Item 12: ``from_dlpack(capsule)`` that refuses the caller's own capsule leaves it
    unconsumed; when the caller drops it, its destructor runs the deleter once."""
    kw, error = _BAD_CAPSULES[case]
    p = _destructor_producer(**kw)
    cap = p.capsule()
    with pytest.raises(error):
        etptr.from_dlpack(cap)
    assert p.deleted == 0
    del cap
    gc.collect()
    assert p.destructor_calls == 1 and p.deleted == 1


def test_refused_capsule_on_the_device_change_path_is_deleted_once(host_alloc):
    """Item 12: the same when ``device=`` asks for a move (the capsule is requested with
    ``dl_device`` and imported on the path that copies afterwards)."""
    p = _destructor_producer(code=99)
    with pytest.raises(etptr.InvalidTypeError):
        etptr.from_dlpack(p, device="cuda")
    gc.collect()
    assert len(p._structs) >= 1
    assert p.deleted == p.destructor_calls == len(p._structs)
    assert host_alloc.allocate_count == 0


@pytest.mark.parametrize("how", ["alias", "copy=True", "device=cuda", "raw capsule"])
def test_imported_capsule_with_a_python_destructor_is_deleted_once(host_alloc, how):
    """Item 12 (companion): on the paths that succeed the deleter runs once too: when the
    last tensor over the memory dies (alias), or as soon as etptr's copy exists."""
    p = _destructor_producer()
    if how == "alias":
        t = etptr.from_dlpack(p)
        assert p.deleted == 0
    elif how == "copy=True":
        t = etptr.from_dlpack(p, copy=True)
    elif how == "device=cuda":
        t = etptr.from_dlpack(p, device="cuda")
        assert t.device == etptr.Device("cuda:0")
    else:
        cap = p.capsule()
        t = etptr.from_dlpack(cap)
        del cap
    gc.collect()
    assert p.deleted == (0 if how in ("alias", "raw capsule") else 1)
    del t
    gc.collect()
    assert p.deleted == 1
    assert p.destructor_calls == 1


# ---------------------------------------------------------------------------------------
# Item 13 (HostDeviceAllocator is thread-safe)


@pytest.mark.thread_unsafe
def test_host_device_allocator_survives_16_threads():
    """Item 13: 16 threads allocate, copy both ways, read ``live_bytes`` and free through
    one HostDeviceAllocator for about 2 s with a 1 us switch interval: no error, every
    call counted exactly once, nothing left allocated, every copy intact."""
    alloc = HostDeviceAllocator()
    done = [0] * 16

    def worker(i):
        def run(deadline):
            rng = np.random.default_rng(i)
            src = rng.integers(0, 256, 512, dtype=np.uint8)
            back = np.zeros(512, np.uint8)
            while time.monotonic() < deadline:
                n = int(rng.integers(1, 512))
                ptr = alloc.allocate(n, 0)
                alloc.copy_host_to_device(ptr, src.ctypes.data, n, 0)
                back[:n] = 0
                alloc.copy_device_to_host(back.ctypes.data, ptr, n, 0)
                assert np.array_equal(back[:n], src[:n])
                assert alloc.live_bytes >= n
                alloc.deallocate(ptr, 0)
                done[i] += 1
        return run

    errors = run_threads([worker(i) for i in range(16)], 2.0)
    assert errors == []
    total = sum(done)
    assert total > 0
    assert alloc.allocate_count == alloc.deallocate_count == total
    assert alloc.h2d_count == alloc.d2h_count == total
    assert alloc.live_bytes == 0


# ---------------------------------------------------------------------------------------
# Item 14 (the keyword-support cache does not keep allocator classes alive)


def test_allocator_classes_are_not_kept_alive_by_etptr():
    """Item 14: allocator classes used once each (with ``stream=``, so etptr asks which
    keywords their methods take) are freed once the program drops them."""
    refs = []
    for i in range(5):
        cls = type(f"Transient{i}", (HostDeviceAllocator,), {})
        alloc = cls()
        with use_allocator(alloc):
            dev = etptr.clone_tensor_ptr_to(etptr.zeros([4]), "cuda", stream=1)
            back = etptr.clone_tensor_ptr_to(dev, "cpu", stream=1)
            assert alloc.h2d_count == alloc.d2h_count == 1
        refs.append(weakref.ref(cls))
        del cls, alloc, dev, back
    gc.collect()
    assert [r() for r in refs] == [None] * 5


# ---------------------------------------------------------------------------------------
# Item 15 (device memory is read and freed through the allocator that owns it)


@pytest.mark.parametrize("call", ["clone_tensor_ptr_to_cpu", "clone_tensor_ptr_to",
                                  "clone_tensor_ptr_to of a view"])
def test_device_to_cpu_reads_through_the_allocator_that_owns_the_memory(call):
    """Item 15: a device tensor made under allocator A is read (and later freed) through
    A after ``use_allocator`` installed B."""
    first, second = HostDeviceAllocator(), HostDeviceAllocator()
    with use_allocator(first):
        dev = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0, 3.0]), "cuda")
    with use_allocator(second):
        if call == "clone_tensor_ptr_to_cpu":
            back = etptr.clone_tensor_ptr_to_cpu(dev)
        elif call == "clone_tensor_ptr_to":
            back = etptr.clone_tensor_ptr_to(dev, "cpu")
        else:
            back = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(dev, [2]), "cpu")
        np.testing.assert_array_equal(back.numpy(), [1.0, 2.0, 3.0][:back.numel()])
        assert first.d2h_count == 1
        del dev
        gc.collect()
        assert first.deallocate_count == 1 and first.live_bytes == 0
    assert (second.allocate_count, second.deallocate_count, second.h2d_count,
            second.d2h_count) == (0, 0, 0, 0)


# ---------------------------------------------------------------------------------------
# Item 16 (without an allocator, CuPy is not looked for on every call)


class _CupyFinder(importlib.abc.MetaPathFinder):
    """Counts the lookups of ``cupy`` and answers them as if it were not installed."""

    def __init__(self):
        self.lookups = 0

    def find_spec(self, name, path=None, target=None):
        if name == "cupy" or name.startswith("cupy."):
            self.lookups += 1
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.mark.thread_unsafe
def test_failing_device_calls_look_for_cupy_once_per_registry_change(monkeypatch):
    """Item 16: with no CUDA allocator and no CuPy, 50 failing ``clone_tensor_ptr_to(t,
    "cuda")`` calls (each NotFoundError saying why) look for CuPy at most once; a
    registry change allows one more look."""
    finder = _CupyFinder()
    for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [finder] + sys.meta_path)
    previous = _replace_allocator(etptr.DeviceType.CUDA, None)
    try:
        t = etptr.zeros([4])
        for _ in range(50):
            with pytest.raises(etptr.NotFoundError, match="CuPy"):
                etptr.clone_tensor_ptr_to(t, "cuda")
        assert finder.lookups <= 1
        with use_allocator(HostDeviceAllocator()):
            pass                                      # two registry changes
        for _ in range(50):
            with pytest.raises(etptr.NotFoundError):
                etptr.clone_tensor_ptr_to(t, "cuda")
        assert finder.lookups <= 2
    finally:
        _replace_allocator(etptr.DeviceType.CUDA, previous)


# ---------------------------------------------------------------------------------------
# Item 17 (clear errors for malformed devices and DLPack arguments)


@pytest.mark.parametrize("spec", ["cuda:1_0", "cuda:0_1", "cuda: 1", "cuda:1 0", "cuda:\u0663",
                                  "cuda:--1", "cuda:0x1"])
def test_device_index_that_is_not_decimal_digits_is_refused(spec):
    """Item 17: the index is ASCII decimal digits with an optional sign; ``"cuda:1_0"``
    is not ``cuda:10``, nor is an Arabic-Indic digit an index: InvalidArgumentError
    naming the string."""
    with pytest.raises(etptr.InvalidArgumentError, match=re.escape(repr(spec))):
        etptr.Device(spec)


@pytest.mark.parametrize("spec", ["cpu:7", "cpu:1", "cpu:-1"])
def test_cpu_device_with_another_index_is_refused(spec):
    """Item 17: the CPU has one device; ``"cpu:7"`` is refused with InvalidArgumentError
    naming the string (instead of giving a "cpu" that is unequal to ``Device("cpu")``
    or silently becomes it)."""
    with pytest.raises(etptr.InvalidArgumentError, match=re.escape(repr(spec))):
        etptr.Device(spec)


def test_cpu_device_index_zero_is_the_cpu():
    """Item 17 (companion): ``"cpu:0"`` is the CPU, equal to ``Device("cpu")``."""
    assert etptr.Device("cpu:0") == etptr.Device("cpu") == etptr.Device(etptr.DeviceType.CPU)
    assert str(etptr.Device("cpu:0")) == "cpu"


class _Type7Allocator(HostDeviceAllocator):
    @property
    def device_type(self):
        return 7


@pytest.mark.parametrize("how", ["use_allocator", "register_device_allocator"])
def test_allocator_for_an_unknown_device_type_is_an_etptr_error(how):
    """Item 17: an allocator whose ``device_type`` is 7 is refused with
    InvalidArgumentError naming ``device_type``, not a raw ValueError from the enum."""
    alloc = _Type7Allocator()
    if how == "use_allocator":
        call = lambda: use_allocator(alloc).__enter__()  # noqa: E731
    else:
        call = lambda: etptr.register_device_allocator(alloc)  # noqa: E731
    exc = _outcome(call)
    assert isinstance(exc, etptr.InvalidArgumentError), repr(exc)
    assert "device_type" in str(exc) and "7" in str(exc)


@pytest.mark.parametrize("dl_device", [5, "cpu", (1,), (1, 0, 0), ("a", 0)], ids=repr)
def test_dlpack_export_with_a_malformed_dl_device_raises_buffer_error(dl_device):
    """Item 17: ``__dlpack__(dl_device=...)`` that is not a (device_type, device_id) pair
    of ints raises BufferError naming ``dl_device``."""
    t = etptr.zeros([2])
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=dl_device)


# ---------------------------------------------------------------------------------------
# Races: results of concurrent resizes, views, clones and drops fit their memory


class _TrackingAllocator(HostDeviceAllocator):
    """Remembers the size of every block it hands out, device blocks and the bytearrays
    ``allocate_host`` returns, by address (a reused address maps to its newest block;
    a live tensor's block is always the newest at its address)."""

    def __init__(self):
        super().__init__()
        self.block_sizes = {}

    def allocate(self, nbytes, index, alignment=etptr.DEFAULT_ALIGNMENT):
        ptr = super().allocate(nbytes, index, alignment)
        self.block_sizes[ptr] = nbytes
        return ptr

    def allocate_host(self, nbytes, index):
        buf = bytearray(max(nbytes, 1))
        self.block_sizes[_buffer_address(buf)] = len(buf)
        return buf


_ROWS = (1, 2, 4, 8)         # the shared tensors are (rows, 8) Float, bound 8 x 8
_VALUES = _arange(64)


def _check_snapshot(t, memory_bytes=None):
    """``t`` is the shared tensors' data at one of their sizes, and fits its memory."""
    assert isinstance(t, etptr.TensorPtr)
    assert t.sizes in [(r, 8) for r in _ROWS], t
    assert t.strides == (8, 1) and t.scalar_type in (ST.Float, ST.Double)
    n = t.numel()
    assert t.nbytes == n * t.element_size()
    if memory_bytes is not None:
        assert t.nbytes <= memory_bytes, (t, memory_bytes)
    if t.device.is_cpu():
        np.testing.assert_array_equal(t.numpy().ravel(), _VALUES[:n])
    else:
        assert _device_bytes(t) == _VALUES[:n].tobytes()


@pytest.mark.thread_unsafe
def test_concurrent_resizes_views_clones_and_drops_give_consistent_results():
    """16 threads resize, view, clone (on the host, to "cuda" through a tracking
    HostDeviceAllocator and back, cast) and replace shared tensors for 2.5 s with a 1 us
    switch interval. Every result claims no more bytes than the block it lives in and
    holds the source's data at one of the sizes it had; nothing stays allocated."""
    alloc = _TrackingAllocator()
    done = {}
    lock = threading.Lock()

    with use_allocator(alloc):
        def fresh_host():
            t = etptr.clone_tensor_ptr(etptr.make_tensor_ptr(_VALUES.reshape(8, 8)))
            assert t.shape_dynamism == Dyn.DYNAMIC_BOUND
            return t

        host = [fresh_host() for _ in range(4)]
        dev = [etptr.clone_tensor_ptr_to(fresh_host(), "cuda") for _ in range(4)]

        def device_block(t):
            return alloc.block_sizes[t.data_ptr]

        def op_resize(rng, slots):
            etptr.resize_tensor_ptr(slots[rng.integers(4)], [_ROWS[rng.integers(4)], 8])

        def op_view(rng, slots):
            src = slots[rng.integers(4)]
            try:
                v = etptr.make_tensor_ptr(src, [_ROWS[rng.integers(4)], 8])
            except etptr.InvalidArgumentError as exc:      # larger than src is now
                assert "larger than its source" in str(exc)
                return
            assert v.data_ptr == src.data_ptr
            _check_snapshot(v, 64 * 4)
            if not v.device.is_cpu():
                _check_snapshot(etptr.clone_tensor_ptr_to(v, "cpu"))

        def op_clone(rng, slots):
            _check_snapshot(etptr.clone_tensor_ptr(host[rng.integers(4)],
                                                   type=None if rng.integers(2) else ST.Double))

        def op_up(rng, slots):
            d = etptr.clone_tensor_ptr_to(host[rng.integers(4)], "cuda")
            _check_snapshot(d, device_block(d))
            pinned = bool(rng.integers(2))
            back = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
            # pageable results are etptr's own memory, which the allocator never saw
            _check_snapshot(back, alloc.block_sizes[back.data_ptr] if pinned else None)
            assert back.sizes == d.sizes

        def op_down(rng, slots):
            h = etptr.clone_tensor_ptr_to(dev[rng.integers(4)], "cpu")
            _check_snapshot(h, alloc.block_sizes[h.data_ptr])

        def op_drop(rng, slots):
            i = rng.integers(4)
            if slots is host:
                host[i] = fresh_host()
            else:
                dev[i] = etptr.clone_tensor_ptr_to(fresh_host(), "cuda")

        ops = [op_resize, op_view, op_clone, op_up, op_down, op_drop]

        def worker(seed):
            def run(deadline):
                rng = np.random.default_rng(seed)
                counts = [0] * len(ops)
                while time.monotonic() < deadline:
                    k = rng.integers(len(ops))
                    ops[k](rng, host if rng.integers(2) else dev)
                    counts[k] += 1
                with lock:
                    done[seed] = counts
            return run

        errors = run_threads([worker(i) for i in range(16)], 2.5)
        assert errors == []
        assert len(done) == 16
        totals = [sum(c[k] for c in done.values()) for k in range(len(ops))]
        assert all(totals), totals
        del host, dev
        gc.collect()
        assert alloc.live_bytes == 0
