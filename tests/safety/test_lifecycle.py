"""Lifetimes: deleters run exactly once, views and exports keep sources alive, cycles are collected."""
import gc
import sys
import weakref

import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST

from _helpers import run_isolated


class Token:
    """Something a deleter can capture, observable through a weak reference."""


def raw(n=8):
    buf = np.arange(n, dtype=np.float32)
    return buf, buf.ctypes.data


def test_deleter_runs_once_when_the_last_reference_goes():
    buf, addr = raw()
    calls = []
    t = etptr.make_tensor_ptr([8], addr, deleter=calls.append)
    refs = [t, {"t": t}, (t,)]
    del t
    gc.collect()
    assert calls == []
    refs.clear()
    assert calls == [addr]
    gc.collect()
    assert calls == [addr]


@pytest.mark.parametrize("order", ["forward", "reverse", "views"])
def test_every_deleter_runs_when_thousands_of_tensors_go(order):
    """Regression: with tensor objects recycled through a freelist, storages released
    in bulk must still run each deleter exactly once (2048 tensors, more than the
    freelist holds), whatever order they go in and whether views share them."""
    buf, addr = raw(2048)
    calls = []
    tensors = [etptr.make_tensor_ptr([1], addr + 4 * i, deleter=calls.append)
               for i in range(2048)]
    if order == "reverse":
        tensors.reverse()
    elif order == "views":
        tensors = [etptr.make_tensor_ptr(t, [1]) for t in tensors]
    tensors.clear()
    gc.collect()
    assert sorted(calls) == [addr + 4 * i for i in range(2048)]


def test_deleter_and_captures_released_after_running():
    buf, addr = raw()
    token = Token()
    ref = weakref.ref(token)
    calls = []

    def deleter(ptr, keep=token):
        calls.append(ptr)

    t = etptr.make_tensor_ptr([8], addr, deleter=deleter)
    deleter_ref = weakref.ref(deleter)
    del token, deleter
    gc.collect()
    assert ref() is not None and deleter_ref() is not None
    del t
    assert calls == [addr]
    assert ref() is None and deleter_ref() is None


class _BoxDeleter:
    """A deleter object that holds its tensor: tensor -> deleter -> box -> tensor."""

    def __init__(self, calls):
        self.calls = calls
        self.box = []

    def __call__(self, ptr):
        self.calls.append((ptr, len(self.box)))  # reaches into the cycle being collected


def test_cycle_through_the_deleter_is_collected():
    buf, addr = raw()
    calls = []
    deleter = _BoxDeleter(calls)
    t = etptr.make_tensor_ptr([8], addr, deleter=deleter)
    deleter.box.append(t)
    tref = weakref.ref(t)
    del t, deleter
    assert calls == []  # only the cycle collector can free it
    gc.collect()
    assert tref() is None
    assert calls == [(addr, 1)]


def test_cycle_where_the_deleter_refers_to_the_tensor_itself():
    buf, addr = raw()
    calls = []
    holder = {}

    def deleter(ptr, holder=holder):
        calls.append((ptr, "t" in holder))  # the cycle is still intact when the deleter runs

    t = etptr.make_tensor_ptr([8], addr, deleter=deleter)
    holder["t"] = t
    deleter.holder = holder
    del t, deleter, holder
    gc.collect()
    assert calls == [(addr, True)]


class _Owner:
    """Holds a tensor whose deleter is one of its own bound methods: a reference cycle."""

    def __init__(self, freed):
        self.freed = freed
        self.buf = np.arange(4, dtype=np.float32)
        self.tensor = etptr.make_tensor_ptr([4], self.buf.ctypes.data, deleter=self._release)

    def _release(self, ptr):
        self.freed.append((ptr, self.buf.ctypes.data))


def test_owner_with_a_bound_method_deleter_is_collected():
    # Regression: the deleter ran after the collector had cleared the owner's __dict__,
    # so it failed (AttributeError, reported only as a warning) and the memory it was
    # meant to release never was.
    freed = []
    refs = []
    for _ in range(5):
        owner = _Owner(freed)
        refs.append(weakref.ref(owner))
    del owner
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(freed) == 5
    assert all(ptr == addr for ptr, addr in freed)


def test_view_keeps_source_alive_and_teardown_order():
    buf, addr = raw()
    order = []
    src = etptr.make_tensor_ptr([8], addr, deleter=lambda p: order.append("src"))
    v1 = etptr.make_tensor_ptr(src, [2, 4], deleter=lambda p: order.append("v1"))
    v2 = etptr.make_tensor_ptr(v1, [4], deleter=lambda p: order.append("v2"))
    sref, v1ref = weakref.ref(src), weakref.ref(v1)
    del src, v1
    gc.collect()
    assert order == [] and sref() is not None and v1ref() is not None
    assert v2.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    del v2
    assert order == ["v2", "v1", "src"]
    assert sref() is None and v1ref() is None


def test_view_deleter_gets_the_shared_address():
    buf, addr = raw()
    seen = []
    src = etptr.make_tensor_ptr([8], addr)
    v = etptr.make_tensor_ptr(src, [4], deleter=seen.append)
    del v
    assert seen == [addr]
    assert src.numpy()[7] == 7.0


def test_numpy_view_keeps_the_tensor_alive():
    buf, addr = raw()
    calls = []
    t = etptr.make_tensor_ptr([8], addr, deleter=calls.append)
    a = t.numpy()
    b = a[2:4]
    del t, a
    gc.collect()
    assert calls == [] and b.tolist() == [2.0, 3.0]
    del b
    gc.collect()
    assert calls == [addr]


def test_dlpack_exports_keep_the_tensor_alive():
    buf, addr = raw()
    calls = []
    t = etptr.make_tensor_ptr([8], addr, deleter=calls.append)
    imported = np.from_dlpack(t)
    unused_capsule = t.__dlpack__(max_version=(1, 0))
    del t
    gc.collect()
    assert calls == []
    del unused_capsule
    gc.collect()
    assert calls == [] and imported[5] == 5.0
    del imported
    gc.collect()
    assert calls == [addr]


def test_owned_buffers_are_released():
    arr = np.zeros(16, dtype=np.float32)
    aref = weakref.ref(arr)
    base_refs = sys.getrefcount(arr)
    t = etptr.make_tensor_ptr([4, 4], arr)
    assert sys.getrefcount(arr) == base_refs + 1
    v = etptr.make_tensor_ptr(t, [16])
    del t
    gc.collect()
    assert sys.getrefcount(arr) == base_refs + 1
    del v
    gc.collect()
    assert sys.getrefcount(arr) == base_refs
    del arr
    assert aref() is None        # nothing of etptr's kept the array alive


def test_tensor_supports_weak_references():
    t = etptr.make_tensor_ptr([1.0])
    r = weakref.ref(t)
    assert r() is t
    del t
    assert r() is None


@pytest.mark.parametrize("bad", [
    lambda d, a: etptr.make_tensor_ptr([-1], a, deleter=d),
    lambda d, a: etptr.make_tensor_ptr([2], a, dim_order=[0, 0], deleter=d),
    lambda d, a: etptr.make_tensor_ptr([2], a, type="x", deleter=d),
    lambda d, a: etptr.make_tensor_ptr([2], a, device="npu", deleter=d),
    lambda d, a: etptr.make_tensor_ptr([1 << 62], a, type=ST.Long, deleter=d),
    lambda d, a: etptr.make_tensor_ptr([100], np.zeros(2), deleter=d),
    lambda d, a: etptr.make_tensor_ptr([2], np.zeros(4)[::2], deleter=d),
    lambda d, a: etptr.make_tensor_ptr(etptr.make_tensor_ptr([2], a), [3], deleter=d),
    lambda d, a: etptr.for_blob(a, [2]).deleter(d).strides([5]).make_tensor_ptr(),
    lambda d, a: etptr.from_blob(a, [2], type=99, deleter=d),
], ids=["negative", "dim_order", "type", "device", "overflow", "small-buffer", "non-contiguous",
        "view-too-big", "for_blob-strides", "from_blob-type"])
def test_deleter_never_runs_when_construction_fails(bad):
    buf, addr = raw()
    calls = []
    with pytest.raises(etptr.EtError):
        bad(calls.append, addr)
    gc.collect()
    assert calls == []


def test_deleter_exception_becomes_a_warning():
    buf, addr = raw()

    def deleter(ptr):
        raise OSError(f"cannot free {ptr}")

    t = etptr.make_tensor_ptr([8], addr, deleter=deleter)
    with pytest.warns(etptr.EtWarning, match=r"a TensorPtr deleter raised during teardown: OSError"):
        del t
        gc.collect()


def test_device_memory_freed_exactly_once(host_alloc):
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([2, 2], [1.0, 2.0, 3.0, 4.0]), "cuda:1")
    ptr = d.data_ptr
    views = [etptr.make_tensor_ptr(d, [4]), etptr.make_tensor_ptr(d, [2, 2], dim_order=[1, 0])]
    del d
    gc.collect()
    assert host_alloc.deallocate_count == 0 and host_alloc.live_bytes == 16
    views.pop()
    gc.collect()
    assert host_alloc.deallocate_count == 0
    views.clear()
    gc.collect()
    assert (host_alloc.deallocate_count, host_alloc.last_deallocate_ptr,
            host_alloc.last_deallocate_index, host_alloc.live_bytes) == (1, ptr, 1, 0)


def test_many_device_tensors_leave_nothing_behind(host_alloc):
    cpu = etptr.make_tensor_ptr([64], [float(i) for i in range(64)])
    for i in range(50):
        d = etptr.clone_tensor_ptr_to(cpu, f"cuda:{i % 3}")
        back = etptr.clone_tensor_ptr_to(d, "cpu")
        assert back.numpy()[63] == 63.0
    del d
    gc.collect()
    assert (host_alloc.allocate_count, host_alloc.deallocate_count, host_alloc.live_bytes) == (50, 50, 0)


def test_deleters_run_at_interpreter_exit():
    proc = run_isolated("""
        import os
        import numpy as np, etptr
        buf = np.zeros(4, dtype=np.float32)
        # defaults, not globals: module globals may be cleared before the deleter runs,
        # and print() is gone once sys.stdout is torn down
        def deleter(p, write=os.write, addr=buf.ctypes.data):
            write(1, b"deleted %d\\n" % (p == addr))
        keep = etptr.make_tensor_ptr([4], buf.ctypes.data, deleter=deleter)
        view = etptr.make_tensor_ptr(keep, [2, 2])
        print("exiting", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exiting", "deleted", "1"]
    assert "Traceback" not in proc.stderr


def test_no_growth_over_many_tensors():
    # every construction path, repeated: the number of live objects must not grow
    buf = np.zeros(16, dtype=np.float32)

    def churn():
        for _ in range(200):
            a = etptr.make_tensor_ptr([4, 4], buf)
            etptr.make_tensor_ptr(a, [16]).numpy()
            etptr.make_tensor_ptr([4], buf.ctypes.data, deleter=lambda p: None)
            etptr.clone_tensor_ptr(a, type=ST.Double)
            etptr.make_tensor_ptr([1.0, 2.0])
            np.from_dlpack(a)
            try:
                etptr.make_tensor_ptr([-1], buf)
            except etptr.InvalidArgumentError:
                pass

    churn()
    gc.collect()
    before = len(gc.get_objects())
    churn()
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_deleter_failure_is_reported_when_warnings_are_errors():
    # With -W error the EtWarning itself cannot be raised from teardown; it must reach
    # sys.unraisablehook rather than vanish.
    proc = run_isolated("""
        import sys, warnings
        warnings.simplefilter("error")
        import numpy as np, etptr
        seen = []
        sys.unraisablehook = lambda args: seen.append(args.exc_value)
        b = np.zeros(2)
        t = etptr.make_tensor_ptr([2], b.ctypes.data, deleter=lambda p: 1 / 0)
        del t
        print(type(seen[0]).__name__, "ZeroDivisionError" in str(seen[0]))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["EtWarning", "True"]
