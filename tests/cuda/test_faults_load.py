"""The CUDA path under load, faults and fork.

* 16 threads clone up and down at once for a fixed time (``ETPTR_LOAD_SECONDS``,
  10 s on a device, 1.5 s under the fake CuPy), every round trip bit-exact,
  device memory and pinned blocks back at baseline afterwards;
* a Python DeviceAllocator or deleter that raises: the error propagates (or,
  during teardown, becomes an EtWarning) and nothing leaks;
* fork: a child forked after CUDA was used gets InvalidStateError from every
  CUDA entry point, quickly, while host-only etptr keeps working and inherited
  tensors die without calling CUDA; a child forked before CUDA was used may
  use it; the parent keeps working;
* KeyboardInterrupt from a real signal in the middle of a long staged copy.

Too large a device allocation is covered by test_cuda_allocator.py
(test_allocation_larger_than_device) and test_copy_engine.py
(test_out_of_device_memory_leaves_pool_and_device_at_baseline).
"""
import ctypes
import gc
import math
import os
import random
import signal
import threading
import time
import traceback

import numpy as np
import pytest

import etptr
from etptr import DeviceType, ScalarType
from etptr.cuda import copy_config
from etptr.testing import use_allocator

from _helpers import FORK_AND_WAIT, run_isolated

FAKE = os.environ.get("ETPTR_FAKE_CUPY") == "1"
MiB = 1 << 20
LOAD_SECONDS = float(os.environ.get("ETPTR_LOAD_SECONDS", "3" if FAKE else "10"))
LOAD_THREADS = 16
LOAD_MAX_BYTES = 64 * MiB


def _used(cp, dev):
    """Bytes CuPy's memory pool has handed out on device ``dev``."""
    if getattr(cp, "is_fake", False):
        return cp.state.used[dev]
    with cp.cuda.Device(dev):
        return cp.get_default_memory_pool().used_bytes()


def _usage(cp, pool, ndev):
    gc.collect()
    return [_used(cp, d) for d in range(ndev)], pool.stats()["in_use_bytes"]


def _host_bytes(t):
    """The bytes of a CPU tensor, as a uint8 array over its memory (no copy)."""
    if t.nbytes == 0:
        return np.empty(0, np.uint8)
    return np.frombuffer((ctypes.c_char * t.nbytes).from_address(t.data_ptr), np.uint8)


# ------------------------------------------------------------------ many threads at once

def _random_case(rng, types):
    """(sizes, dim_order, scalar type, nbytes) with nbytes log-uniform in 4 B .. 64 MiB."""
    st = rng.choice(types)
    esize = etptr.element_size(st)
    nbytes = int(math.exp(rng.uniform(math.log(4), math.log(LOAD_MAX_BYTES))))
    numel = max(1, nbytes // esize)
    rank = rng.randint(0, 4) if numel == 1 else rng.randint(1, 4)
    sizes = [rng.randint(1, 6) for _ in range(max(rank - 1, 0))]
    if rank:
        sizes.append(max(1, numel // math.prod(sizes)))
    dim_order = list(range(rank))
    rng.shuffle(dim_order)
    return sizes, dim_order, st, math.prod(sizes) * esize


def test_sixteen_threads_round_trip_bit_exact(cp, pool, ndev):
    types = [st for st in ScalarType if etptr.element_size(st) > 0]
    source = np.frombuffer(np.random.default_rng(7).bytes(LOAD_MAX_BYTES + 4096), np.uint8)
    base = _usage(cp, pool, ndev)
    stop = threading.Event()
    counts = [0] * LOAD_THREADS
    moved = [0] * LOAD_THREADS
    errors = []
    deadline = time.monotonic() + LOAD_SECONDS

    def work(k):
        rng = random.Random(1000 + k)
        stream = None
        if not FAKE and k % 4 == 3:          # a quarter of the threads copy on their own stream
            stream = cp.cuda.Stream(non_blocking=True)
        case = None
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                sizes, dim_order, st, nbytes = case = _random_case(rng, types)
                off = rng.randrange(0, 4096, 64)
                want = source[off:off + nbytes]
                t = etptr.make_tensor_ptr(sizes, memoryview(want), dim_order=dim_order, type=st)
                dev = 0 if stream is not None else rng.randrange(ndev)   # a stream has one device
                d = etptr.clone_tensor_ptr_to(t, f"cuda:{dev}", stream=stream)
                assert d.device == etptr.Device(DeviceType.CUDA, dev)
                assert (d.sizes, d.dim_order, d.strides, d.scalar_type) == \
                    (t.sizes, t.dim_order, t.strides, st)
                h = etptr.clone_tensor_ptr_to(d, "cpu", stream=stream, pinned=rng.random() < 0.5)
                if stream is not None:
                    stream.synchronize()
                del d
                assert (h.sizes, h.dim_order, h.strides, h.scalar_type) == \
                    (t.sizes, t.dim_order, t.strides, st)
                got = _host_bytes(h)
                if not np.array_equal(got, want):
                    bad = int(np.flatnonzero(got != want)[0])
                    raise AssertionError(f"byte {bad} of {nbytes} differs")
                del h, got
                counts[k] += 1
                moved[k] += 2 * nbytes
        except BaseException as exc:         # reported by the main thread
            errors.append(f"thread {k}, round {counts[k]}, case {case}: "
                          + "".join(traceback.format_exception(exc)))
            stop.set()

    threads = [threading.Thread(target=work, args=(k,), name=f"load-{k}")
               for k in range(LOAD_THREADS)]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=LOAD_SECONDS + 300)
    elapsed = time.monotonic() - start
    assert not any(th.is_alive() for th in threads), "a loading thread did not finish"
    assert not errors, errors[0]
    total = sum(counts)
    print(f"\n{total} round trips ({sum(moved) / 2**30:.2f} GiB moved) by {LOAD_THREADS} "
          f"threads in {elapsed:.1f} s on {ndev} device(s); per thread: {counts}")
    assert all(counts), f"some thread made no round trip: {counts}"
    assert _usage(cp, pool, ndev) == base


# ------------------------------------------------------------------ Python allocators and deleters that raise

class Boom(Exception):
    pass


class FaultyAllocator(etptr.DeviceAllocator):
    """A Python DeviceAllocator over the CUDA allocator; ``fail`` names the calls that raise."""

    def __init__(self, inner, fail=(), error=Boom):
        super().__init__()
        self.inner = inner
        self.fail = set(fail)
        self.error = error
        self.kept = []          # pointers whose deallocate raised (freed by the test)

    def _maybe_fail(self, what):
        if what in self.fail:
            raise self.error(f"{what} failed on purpose")

    @property
    def device_type(self):
        return DeviceType.CUDA

    def resolve_index(self, index):
        return self.inner.resolve_index(index)

    def allocate(self, nbytes, index, alignment=etptr.DEFAULT_ALIGNMENT):
        self._maybe_fail("allocate")
        return self.inner.allocate(nbytes, index, alignment)

    def deallocate(self, ptr, index):
        if "deallocate" in self.fail:
            self.kept.append((ptr, index))
            raise self.error("deallocate failed on purpose")
        self.inner.deallocate(ptr, index)

    def copy_host_to_device(self, dst, src, nbytes, index):
        self._maybe_fail("copy_host_to_device")
        self.inner.copy_host_to_device(dst, src, nbytes, index)

    def copy_device_to_host(self, dst, src, nbytes, index):
        self._maybe_fail("copy_device_to_host")
        self.inner.copy_device_to_host(dst, src, nbytes, index)

    def allocate_host(self, nbytes, index):
        self._maybe_fail("allocate_host")
        return self.inner.allocate_host(nbytes, index)


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("call", ["allocate", "copy_host_to_device"])
def test_python_allocator_raising_on_upload(call, error, alloc, cp, pool, ndev):
    a = np.random.default_rng(1).integers(0, 256, 3 * MiB + 5, dtype=np.uint8)
    faulty = FaultyAllocator(alloc, {call}, error)
    base = _usage(cp, pool, ndev)
    live = alloc.live_blocks
    with use_allocator(faulty):
        with pytest.raises(error, match=f"{call} failed on purpose"):
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
        with pytest.raises(error):
            etptr.full([1000], 1.0, device="cuda") if call == "allocate" else \
                etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda")
        faulty.fail.clear()
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")    # still works
        assert np.array_equal(_host_bytes(etptr.clone_tensor_ptr_to(d, "cpu")), a)
        del d
    assert alloc.live_blocks == live
    assert _usage(cp, pool, ndev) == base


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("call, pinned", [("copy_device_to_host", True),
                                          ("copy_device_to_host", False),
                                          ("allocate_host", True)])
def test_python_allocator_raising_on_download(call, pinned, error, alloc, cp, pool, ndev):
    a = np.random.default_rng(2).integers(0, 256, 2 * MiB + 3, dtype=np.uint8)
    faulty = FaultyAllocator(alloc, (), error)
    base = _usage(cp, pool, ndev)
    with use_allocator(faulty):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
        in_use = pool.stats()["in_use_bytes"]
        faulty.fail = {call}
        with pytest.raises(error, match=f"{call} failed on purpose"):
            etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
        gc.collect()
        assert pool.stats()["in_use_bytes"] == in_use     # the result's block went back
        faulty.fail.clear()
        assert np.array_equal(_host_bytes(etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)), a)
        del d
    assert _usage(cp, pool, ndev) == base


def test_python_allocator_deallocate_raising_in_teardown_warns(alloc, cp, pool, ndev):
    faulty = FaultyAllocator(alloc)
    base = _usage(cp, pool, ndev)
    with use_allocator(faulty):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.arange(1000.0)), "cuda")
        e = etptr.zeros([64], device="cuda")
    faulty.fail = {"deallocate"}
    with pytest.warns(etptr.EtWarning, match="FaultyAllocator.deallocate.*deallocate failed"):
        del d, e
        gc.collect()
    assert len(faulty.kept) == 2
    for ptr, index in faulty.kept:       # the memory is still the allocator's to free
        alloc.deallocate(ptr, index)
    assert _usage(cp, pool, ndev) == base


def test_deleter_raising_in_teardown_warns(alloc, cp, pool, ndev):
    base = _usage(cp, pool, ndev)
    freed = []

    def deleter(ptr):
        freed.append(ptr)
        alloc.deallocate(ptr, 0)
        raise Boom("deleter failed on purpose")

    ptr = alloc.allocate(4096, 0)
    values = np.arange(1024, dtype=np.float32)
    alloc.copy_host_to_device(ptr, values.ctypes.data, 4096, 0)
    t = etptr.make_tensor_ptr([1024], ptr, device="cuda", deleter=deleter)
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to(t, "cpu").numpy(), values)
    blk = etptr.empty([256], pinned=True)           # a deleter over pinned host memory too
    h = etptr.make_tensor_ptr([256], blk.data_ptr, deleter=lambda p, keep=blk: 1 / 0)
    del blk
    with pytest.warns(etptr.EtWarning) as record:
        del t, h
        gc.collect()
    messages = " ".join(str(w.message) for w in record)
    assert "deleter failed on purpose" in messages and "ZeroDivisionError" in messages
    assert freed == [ptr]
    assert _usage(cp, pool, ndev) == base


# ------------------------------------------------------------------ fork

FORK_PRELUDE = FORK_AND_WAIT + """
    import gc
    import numpy as np
    import etptr
    import etptr.cuda
    from etptr._core import _host_copy
    from etptr.cuda import _copy_engine, _driver, _tuning

    FAKE = os.environ.get("ETPTR_FAKE_CUPY") == "1"
    if FAKE:      # the stand-in libcuda the suite built (ETPTR_FAKE_LIBCUDA), CuPy's over it
        import _fake_libcuda
        F = _fake_libcuda.start()
        fake = F.make_cupy(ndev=1)

    def use_fake_cuda():
        _driver._use_backend(fake)
        etptr.register_device_allocator(etptr.cuda.CudaAllocator())

"""

FORK_AFTER_CUDA = FORK_PRELUDE + """
    if FAKE:
        use_fake_cuda()
    pool = etptr.cuda.get_pinned_host_pool()
    a = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)   # 4 MiB: staged
    src = etptr.make_tensor_ptr(a)
    d = etptr.clone_tensor_ptr_to(src, "cuda")
    h = etptr.clone_tensor_ptr_to(d, "cpu")                  # in a pinned block
    p = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    assert np.array_equal(h.numpy(), a) and np.array_equal(p.numpy(), a)
    blk = pool.malloc(1000)
    pinned_maker = etptr.zeros([10], pinned=True)
    alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    raw = alloc.allocate(256, 0)
    in_use = pool.stats()["in_use_bytes"]
    assert in_use > 0

    def child():
        global d, h, p, blk, pinned_maker
        calls = []
        if FAKE:      # record every CUDA call from here on: CuPy's and the driver's
            for ns in (fake.cuda.runtime, fake.cuda.driver):
                for name, f in list(vars(ns).items()):
                    if callable(f) and not isinstance(f, type):
                        def spy(*args, _f=f, _name=name):
                            calls.append(_name)
                            return _f(*args)
                        setattr(ns, name, spy)
            used = list(fake.state.used)
            driver_calls = F.knob("fake_calls").value
        start = time.monotonic()
        try:
            etptr.clone_tensor_ptr_to(src, "cuda")
        except etptr.InvalidStateError as exc:
            msg = str(exc)
        else:
            raise AssertionError("a clone to CUDA worked in a child forked after CUDA init")
        took = time.monotonic() - start
        # liveness, not speed: a lock held by a thread the child lacks would hang forever
        assert took < 60, took
        assert "fork" in msg and "'spawn'" in msg and str(os.getpid()) in msg, msg
        print("CHILD MESSAGE", msg)
        attempts = {
            "clone down, pinned": lambda: etptr.clone_tensor_ptr_to(d, "cpu"),
            "clone down, pageable": lambda: etptr.clone_tensor_ptr_to(d, "cpu", pinned=False),
            "device maker": lambda: etptr.zeros([4], device="cuda"),
            "pinned maker": lambda: etptr.zeros([4], pinned=True),
            "pool.malloc": lambda: pool.malloc(100),
            "allocate": lambda: alloc.allocate(64, 0),
            "resolve_index": lambda: alloc.resolve_index(-1),
            "allocate_host": lambda: alloc.allocate_host(64, 0),
            "copy_host_to_device": lambda: alloc.copy_host_to_device(raw, src.data_ptr, 64, 0),
            "copy_device_to_host": lambda: alloc.copy_device_to_host(p.data_ptr, raw, 64, 0),
            "a new CudaAllocator": lambda: etptr.cuda.CudaAllocator().allocate(64, 0),
        }
        for name, call in attempts.items():
            try:
                call()
            except etptr.InvalidStateError as exc:
                assert "fork" in str(exc), (name, str(exc))
            else:
                raise AssertionError(f"{name} worked in a child forked after CUDA init")
        assert etptr.cuda.is_available() is False
        # host-only etptr keeps working
        t = etptr.make_tensor_ptr([3, 2], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dim_order=[1, 0])
        c = etptr.clone_tensor_ptr(t, etptr.ScalarType.Double)
        assert c.strides == (1, 3) and c.numpy().sum() == 21.0
        etptr.resize_tensor_ptr(etptr.zeros([4], dynamism=etptr.TensorShapeDynamism.DYNAMIC_BOUND), [2])
        assert etptr.randint(0, 5, [100]).numpy().max() < 5
        assert np.array_equal(p.numpy(), a)              # pageable memory is the child's copy
        assert etptr.make_tensor_ptr(np.arange(6.0)).numpy().sum() == 15.0
        with etptr.cuda.copy_config(threads=2):
            assert etptr.cuda.get_copy_config()["threads"] == 2
        assert pool.stats()["in_use_bytes"] == 0        # the parent's blocks are not the child's
        pool.empty_cache()
        pool.max_cached_bytes = 1 << 20
        # inherited tensors and blocks die without a CUDA call, a warning or an error
        unraisable = []
        sys.unraisablehook = unraisable.append
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            alloc.deallocate(raw, 0)
            del d, h, p, blk, pinned_maker
            gc.collect()
        assert not unraisable, [u.exc_value for u in unraisable]
        if FAKE:
            assert calls == [], calls
            assert F.knob("fake_calls").value == driver_calls, "libcuda was called"
            assert fake.state.used == used              # nothing went back to "CuPy's pool"
        print("CHILD OK", f"{took * 1e3:.1f} ms")
        return 0

    status = fork_and_wait(child)
    assert status == 0, f"child exit status {status}"
    # the parent keeps working, and gets everything back
    b = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(src, "cuda"), "cpu")
    assert np.array_equal(b.numpy(), a)
    assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu", pinned=False).numpy(), a)
    alloc.deallocate(raw, 0)
    del b, d, h, p, blk, pinned_maker
    gc.collect()
    assert pool.stats()["in_use_bytes"] == 0, pool.stats()
    assert alloc.live_blocks == 0
    print("PARENT OK")
"""

FORK_BEFORE_CUDA = FORK_PRELUDE + """
    a = np.arange(300_000, dtype=np.float64)               # 2.4 MiB: staged
    src = etptr.make_tensor_ptr(a)                          # host-only before the fork

    def child():
        if FAKE:
            use_fake_cuda()
        d = etptr.clone_tensor_ptr_to(src, "cuda")
        assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), a)
        assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu", pinned=False).numpy(), a)
        print("CHILD OK")
        return 0

    status = fork_and_wait(child)
    assert status == 0, f"child exit status {status}"
    if FAKE:
        use_fake_cuda()
    d = etptr.clone_tensor_ptr_to(src, "cuda")
    assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), a)
    print("PARENT OK")
"""


FORK_AFTER_CUPY_USE = FORK_PRELUDE + """
    # CUDA initialised by the user through CuPy, never by etptr, before the fork
    if FAKE:
        sys.modules["cupy"] = fake         # etptr imports the fake as CuPy
    import cupy
    assert cupy.cuda.runtime.getDeviceCount() >= 1
    src = etptr.make_tensor_ptr(np.arange(1000.0))

    def child():
        try:
            etptr.clone_tensor_ptr_to(src, "cuda")
        except etptr.InvalidStateError as exc:
            assert "fork" in str(exc) and "'spawn'" in str(exc), str(exc)
        else:
            raise AssertionError("a clone to CUDA worked in a child forked after CUDA init")
        print("CHILD OK")
        return 0

    status = fork_and_wait(child)
    assert status == 0, f"child exit status {status}"
    d = etptr.clone_tensor_ptr_to(src, "cuda")
    assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), np.arange(1000.0))
    print("PARENT OK")
"""

FORK_AFTER_CUPY_IMPORT = FORK_PRELUDE + """
    # CuPy imported, CUDA not initialised: the child may use CUDA
    if FAKE:
        sys.modules["cupy"] = fake
    import cupy
    try:
        cupy.cuda.driver.ctxGetCurrent()      # initialises nothing
        print("SKIP: importing CuPy initialised the CUDA driver here")
        sys.exit(0)
    except cupy.cuda.driver.CUDADriverError:
        pass
    a = np.arange(300_000, dtype=np.float64)
    src = etptr.make_tensor_ptr(a)

    def child():
        d = etptr.clone_tensor_ptr_to(src, "cuda")
        assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), a)
        print("CHILD OK")
        return 0

    status = fork_and_wait(child)
    assert status == 0, f"child exit status {status}"
    d = etptr.clone_tensor_ptr_to(src, "cuda")
    assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), a)
    print("PARENT OK")
"""

FORK_CHILD_EXITS_NORMALLY = FORK_PRELUDE + """
    if FAKE:
        use_fake_cuda()
    a = np.arange(1 << 20, dtype=np.float32)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    blk = etptr.cuda.get_pinned_host_pool().malloc(4096)

    def child():
        warnings.simplefilter("error")      # a teardown warning must not pass unseen
        print("CHILD OK")
        return 0                            # d, h and blk die in the interpreter's shutdown

    status = fork_and_wait(child, normal_exit=True)
    assert status == 0, f"child exit status {status}"
    assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), a)
    print("PARENT OK")
"""

FORK_WHILE_THREADS_COPY = FORK_PRELUDE + """
    import threading
    if FAKE:
        use_fake_cuda()
    pool = etptr.cuda.get_pinned_host_pool()
    stop = threading.Event()
    rounds = [0] * 4
    errors = []

    def work(k):
        a = np.random.default_rng(k).standard_normal((k + 1) * 300_000)
        t = etptr.make_tensor_ptr(a)
        try:
            while not stop.is_set():
                d = etptr.clone_tensor_ptr_to(t, "cuda")
                h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=rounds[k] % 2 == 0)
                assert np.array_equal(h.numpy(), a)
                rounds[k] += 1
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    while min(rounds) < 2 and not errors:
        time.sleep(0.005)

    def child():
        # the parent's threads (and any lock they held) are gone here
        start = time.monotonic()
        try:
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda")
        except etptr.InvalidStateError as exc:
            assert "fork" in str(exc)
        else:
            raise AssertionError("a clone to CUDA worked in a child forked after CUDA init")
        # liveness, not speed: a lock held by a thread the child lacks would hang forever
        assert time.monotonic() - start < 60
        s = pool.stats()
        assert s["in_use_bytes"] == 0 and s["cached_bytes"] == 0, s
        pool.empty_cache()
        assert etptr.clone_tensor_ptr(etptr.make_tensor_ptr([1.0, 2.0])).numpy().sum() == 3.0
        print("CHILD OK")
        return 0

    status = fork_and_wait(child)
    time.sleep(0.05)
    stop.set()
    for th in threads:
        th.join(60)
    assert status == 0, f"child exit status {status}"
    assert not errors, errors
    assert not any(th.is_alive() for th in threads)
    gc.collect()
    assert pool.stats()["in_use_bytes"] == 0, pool.stats()
    print("PARENT OK", rounds)
"""


def _run_fork_script(script, out=None):
    out = run_isolated(script, timeout=180) if out is None else out
    report = f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.returncode == 0, report
    assert "CHILD OK" in out.stdout and "PARENT OK" in out.stdout, report
    return out.stdout


def test_fork_after_cuda_use_child_gets_clear_error():
    out = _run_fork_script(FORK_AFTER_CUDA)
    print(out)


def test_fork_before_cuda_use_child_may_use_cuda():
    _run_fork_script(FORK_BEFORE_CUDA)


def test_fork_after_cuda_use_through_cupy_child_gets_clear_error():
    _run_fork_script(FORK_AFTER_CUPY_USE)


def test_fork_after_cupy_import_alone_child_may_use_cuda():
    out = run_isolated(FORK_AFTER_CUPY_IMPORT, timeout=180)
    if out.returncode == 0 and "SKIP:" in out.stdout:
        pytest.skip(out.stdout.strip())
    _run_fork_script(FORK_AFTER_CUPY_IMPORT, out)


def test_fork_after_cuda_use_child_exits_through_interpreter_shutdown():
    out = run_isolated(FORK_CHILD_EXITS_NORMALLY, timeout=180)
    report = f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.returncode == 0, report
    assert "CHILD OK" in out.stdout and "PARENT OK" in out.stdout, report
    # etptr's teardown reports (an EtWarning, turned into an error in the child, or
    # any traceback through etptr) would name etptr; CuPy's own shutdown is not ours
    assert "etptr" not in out.stderr, report


def test_fork_while_threads_copy():
    _run_fork_script(FORK_WHILE_THREADS_COPY)


# ------------------------------------------------------------------ a real signal mid-copy

def _in_fake_accounting(frame):
    """True inside the fake CuPy's device-memory bookkeeping (its alloc or a block's __del__)."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("fakecupy.py") and code.co_name in ("alloc", "__del__"):
            return True
        frame = frame.f_back
    return False


def _interrupt_by_signal(run, delay):
    """Run ``run()`` repeatedly until SIGALRM (``delay`` s from now) raises KeyboardInterrupt.

    Returns the traceback's function names, or None when no interrupt came.
    CuPy's calls are compiled and run no signal handler: there the handler runs
    at the copy engine's signal checks between chunks, or in Python code around
    the clone. The fake's calls are Python, so the interrupt may also come out
    of one of them, like an error from a CUDA call; only inside the fake's own
    device-memory bookkeeping, which has no counterpart in CuPy's compiled
    pool, is it put off for a moment.
    """
    def on_alarm(signum, frame):
        if _in_fake_accounting(frame):
            signal.setitimer(signal.ITIMER_REAL, 0.0002)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, delay)
        try:
            for _ in range(10_000):
                run()
        except KeyboardInterrupt as exc:
            return [f.name for f in traceback.extract_tb(exc.__traceback__)]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return None


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_keyboard_interrupt_from_signal_during_staged_copy(direction, cp, pool, ndev):
    nbytes = (32 if FAKE else 256) * MiB
    a = np.frombuffer(np.random.default_rng(3).bytes(nbytes), np.uint8)
    t = etptr.make_tensor_ptr(a)
    settings = dict(slot_bytes=(1 if FAKE else 4) * MiB, slots=3, small_copy_bytes=64 * 1024)
    if FAKE:
        settings["threads"] = 1       # keeps the fake quick on small hosts
    pool.empty_cache()
    with copy_config(**settings):
        d = etptr.clone_tensor_ptr_to(t, "cuda") if direction == "d2h" else None
    base = _usage(cp, pool, ndev)
    engine = "_pipe_h2d" if direction == "h2d" else "_pipe_d2h"
    inside = 0
    rng = random.Random(5)

    def copy():
        if direction == "h2d":
            return etptr.clone_tensor_ptr_to(t, "cuda")
        return etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)

    # Where a timed signal lands depends on the machine's speed and load: the delays are
    # drawn within the time one copy takes here (measured first), and attempts go on (at
    # least 4, at most 40) until one has landed inside the pipeline itself.
    with copy_config(**settings):
        t0 = time.perf_counter()
        copy()
        took = time.perf_counter() - t0
    for attempt in range(40):
        if attempt >= 4 and inside:
            break
        with copy_config(**settings):
            where = _interrupt_by_signal(copy, max(0.0005, rng.uniform(0.1, 0.9) * took))
        assert where is not None, "no KeyboardInterrupt arrived"
        inside += any(engine in name for name in where)
        assert _usage(cp, pool, ndev) == base, f"attempt {attempt}, interrupted in {where}"
    assert inside, "no interrupt landed inside the staged copy"
    with copy_config(**settings):         # the engine still works
        back = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(t, "cuda"), "cpu")
    assert np.array_equal(_host_bytes(back), a)


FORK_FROM_THE_COPYING_THREAD = r"""
import os, sys, time, warnings
import numpy as np
import etptr, etptr.cuda
from etptr._core import _host_copy
from etptr.cuda import _copy_engine, _driver, _tuning
from etptr.testing import use_allocator
warnings.simplefilter("ignore", DeprecationWarning)
sys.path.insert(0, os.environ["ETPTR_TESTS_DIR"])
import _fake_libcuda
fake = _fake_libcuda.start().make_cupy(ndev=2); _driver._use_backend(fake)
pid = []
def hook(direction, i):
    if i == 2 and not pid:
        pid.append(os.fork())       # the copying thread itself forks, mid-copy
_tuning.tune(chunk_hook=hook)
x = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8)
try:
    with use_allocator(etptr.cuda.CudaAllocator()):
        with etptr.cuda.copy_config(threads=2, slot_bytes=1 << 20, slots=3):
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(x), "cuda")
    outcome = "completed"
except etptr.InvalidStateError:
    outcome = "refused"
_tuning.tune(chunk_hook=None)

def idle_cpu():
    a = np.ones(4 << 20, np.uint8); b = np.zeros_like(a)
    _host_copy.parallel_copy(b.ctypes.data, a.ctypes.data, a.nbytes, 2)
    assert np.array_equal(a, b)
    t = os.times(); c0 = t.user + t.system
    time.sleep(1.5)
    t = os.times()
    return t.user + t.system - c0

if pid[0] == 0:
    print(f"CHILD {outcome} {idle_cpu():.2f}", flush=True)
    os._exit(0)
os.waitpid(pid[0], 0)
print(f"PARENT {outcome} {idle_cpu():.2f}", flush=True)
"""


@pytest.mark.skipif(not FAKE or not hasattr(os, "fork"), reason="needs the fake GPU and fork")
def test_fork_from_the_copying_thread_mid_copy(monkeypatch):
    # The child refuses to go on with the parent's copy (no CUDA call after the fork),
    # and its copy threads go idle afterwards (they once spun forever there).
    monkeypatch.setenv("ETPTR_TESTS_DIR", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes"))
    out = run_isolated(FORK_FROM_THE_COPYING_THREAD, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.split("\n") if line)
    child_outcome, child_cpu = lines["CHILD"].split()
    parent_outcome, parent_cpu = lines["PARENT"].split()
    assert child_outcome == "refused" and parent_outcome == "completed", out.stdout
    # a worker spinning through the 1.5 s sleep burns about 1.5 s of CPU, an idle one almost
    # none: half the window tells them apart on any machine (a state check, not a speed one)
    assert float(child_cpu) < 0.75 and float(parent_cpu) < 0.75, out.stdout
