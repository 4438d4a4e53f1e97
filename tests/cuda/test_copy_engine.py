"""The copy engine: pipelined H2D/D2H, page-locked paths, streams, faults, several GPUs."""
import ctypes
import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import etptr
from etptr import DeviceType
from etptr.cuda import _copy_engine, _driver, _pinned_pool, _tuning
from etptr.cuda import copy_config

CUDA = DeviceType.CUDA
MiB = 1 << 20

# small slots so that a few MiB already make a many-chunk pipeline
SMALL = dict(threads=4, slot_bytes=256 * 1024, slots=3, small_copy_bytes=64 * 1024)


def _payload(nbytes, seed=0):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _bytes(t):
    return ctypes.string_at(t.data_ptr, t.nbytes)


@pytest.fixture
def hook():
    yield
    _tuning.tune(chunk_hook=None)


def _h2d(fake):
    return fake.copies("htod")


def _d2h(fake):
    return fake.copies("dtoh")


# ------------------------------------------------------------------ correctness of each path

@pytest.mark.parametrize("nbytes", [1, 4, 4095, 64 * 1024, 64 * 1024 + 1, 3 * MiB + 12345])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned-result", "pageable-result"])
def test_round_trip_sizes_across_paths(nbytes, pinned):
    a = _payload(nbytes, seed=nbytes)
    with copy_config(**SMALL):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
        h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
    assert _bytes(h) == a.tobytes()


def test_default_config_large_round_trip():
    a = _payload(40 * MiB + 7, seed=3)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    for pinned in (True, False):
        h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
        assert np.array_equal(h.numpy(), a)


def test_pipeline_chunks_through_slots(fake, pool):
    a = _payload(2 * MiB + 100)
    with copy_config(**SMALL):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    ups = _h2d(fake)
    assert len(ups) == 9                            # ceil((2 MiB + 100) / 256 KiB)
    assert all(c.pinned for c in ups)               # every DMA reads a pinned slot
    assert sum(c.nbytes for c in ups) == a.nbytes
    assert pool.stats()["in_use_bytes"] == 0        # slots went back
    with copy_config(**SMALL):
        h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    downs = _d2h(fake)
    assert len(downs) == 9 and all(c.pinned for c in downs)
    assert np.array_equal(h.numpy(), a)


def test_ramp_up_starts_uploads_with_growing_chunks(fake):
    a = _payload(2 * MiB + 100)
    t = _tuning.values()
    assert (t["ramp_first"], t["ramp_growth"], t["ramp_max"]) == (8 * MiB, 150, 256 * MiB)
    with _tuning.tuned(ramp_first=64 * 1024, ramp_growth=200):
        with copy_config(**SMALL):
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
            h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    KiB = 1024
    ups = [c.nbytes for c in _h2d(fake)]
    assert ups == [64 * KiB, 128 * KiB] + [256 * KiB] * 7 + [64 * KiB + 100]
    assert [c.nbytes for c in _d2h(fake)] == [256 * KiB] * 8 + [100]  # downloads: whole slots
    fake.clear()
    with copy_config(**SMALL):                 # the default: 8 MiB, more than a slot here
        etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    assert [c.nbytes for c in _h2d(fake)] == [256 * KiB] * 8 + [100]
    fake.clear()
    etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(_payload(64 * MiB)), "cuda")
    assert [c.nbytes // MiB for c in _h2d(fake)] == [8, 12, 16, 16, 12]   # default slots
    fake.clear()
    with _tuning.tuned(ramp_max=63 * MiB):                  # larger copies: whole slots
        etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(_payload(64 * MiB)), "cuda")
    assert [c.nbytes // MiB for c in _h2d(fake)] == [16] * 4
    assert np.array_equal(h.numpy(), a)


def test_trace_stamps_each_chunk_in_order():
    a = _payload(2 * MiB + 100)
    try:
        with copy_config(**SMALL):
            _tuning.tune(trace=True)
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
            _tuning.tune(trace=False)
            up = _tuning.take_trace()
            _tuning.tune(trace=True)
            h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
            down = _tuning.take_trace()
    finally:
        _tuning.tune(trace=False)
    assert np.array_equal(h.numpy(), a)
    steps = [(what, i) for what, i, _ in up]
    assert steps[:2] == [("begin", a.nbytes), ("slots", 256 * 1024)]
    assert steps[2:-1] == [(w, i) for i in range(9) for w in ("waited", "copied", "queued")]
    assert steps[-1] == ("synced", 9)
    times = [ns for *_, ns in up]
    assert times == sorted(times)
    # downloads: the first K DMAs are queued before chunk 0 is drained
    steps = [(what, i) for what, i, _ in down]
    assert steps[2:5] == [("queued", 0), ("queued", 1), ("queued", 2)]
    assert [i for w, i in steps if w == "copied"] == list(range(9))
    assert _tuning.take_trace() == []       # taking clears the table
    etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    assert _tuning.take_trace() == []       # off: nothing stamped


def test_trace_keeps_its_first_rows_when_full():
    a = _payload(48 * MiB)
    try:
        with copy_config(threads=2, slot_bytes=16 * 1024, slots=3, small_copy_bytes=4096):
            _tuning.tune(trace=True)
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")   # 3072 chunks
            _tuning.tune(trace=False)
    finally:
        _tuning.tune(trace=False)
    rows = _tuning.take_trace()
    assert len(rows) == 8192                          # 2 + 3 * 3072 + 1 stamps made
    assert rows[:3] == [("begin", a.nbytes, rows[0][2]), ("slots", 16 * 1024, rows[1][2]),
                        ("waited", 0, rows[2][2])]
    assert _tuning.take_trace() == []


def test_page_locked_source_goes_in_one_dma(fake):
    src = etptr.empty([3 * MiB], etptr.ScalarType.Byte, pinned=True)
    src.numpy()[:] = _payload(3 * MiB)
    with copy_config(**SMALL):
        d = etptr.clone_tensor_ptr_to(src, "cuda")
    ups = _h2d(fake)
    assert len(ups) == 1 and ups[0].nbytes == 3 * MiB and ups[0].pinned
    assert _bytes(etptr.clone_tensor_ptr_to(d, "cpu")) == src.numpy().tobytes()


def test_small_copy_takes_one_call(fake):
    # one driver call writes the device bytes (8 bytes: a 64-bit stream write), one reads them
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda")
    assert len([c for c in fake.calls if c.dst == d.data_ptr]) == 1
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert len([c for c in fake.calls if c.src == d.data_ptr]) == 1
    assert len(_d2h(fake)) == 1 and list(h.numpy()) == [1.0, 2.0]


def test_d2h_default_result_is_page_locked(pool, cp):
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.arange(1000.0)), "cuda")
    before = pool.stats()["in_use_bytes"]
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert pool.stats()["in_use_bytes"] == before + etptr.cuda.size_class(8000)
    assert cp.cuda.runtime.pointerGetAttributes(h.data_ptr).type == 1   # cudaMemoryTypeHost
    assert h.numpy().flags.writeable
    np.testing.assert_array_equal(h.numpy(), np.arange(1000.0))
    del h
    gc.collect()
    assert pool.stats()["in_use_bytes"] == before


def test_d2h_pageable_result_is_not_from_pool(pool):
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.arange(100.0)), "cuda")
    before = pool.stats()["in_use_bytes"]
    h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    assert pool.stats()["in_use_bytes"] == before
    np.testing.assert_array_equal(h.numpy(), np.arange(100.0))


def test_pinned_makers_come_from_pool(pool, cp):
    before = pool.stats()["in_use_bytes"]
    t = etptr.zeros([1000], pinned=True)
    assert pool.stats()["in_use_bytes"] > before
    assert cp.cuda.runtime.pointerGetAttributes(t.data_ptr).type == 1
    assert not t.numpy().any()
    f = etptr.full([10], 4.0, pinned=True, device="cuda")
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to(f, "cpu").numpy(), np.full(10, 4.0))
    del t
    gc.collect()
    assert pool.stats()["in_use_bytes"] == before


def test_per_call_settings(alloc, device_used):
    a = _payload(MiB)
    ptr = alloc.allocate(a.nbytes, 0)
    try:
        alloc.copy_host_to_device(ptr, a.ctypes.data, a.nbytes, 0, threads=2,
                                  slot_bytes=64 * 1024, slots=2, small_copy_bytes=0)
        out = np.empty_like(a)
        alloc.copy_device_to_host(out.ctypes.data, ptr, a.nbytes, 0, threads=3,
                                  slot_bytes=100_000, slots=4, small_copy_bytes=0)
        assert np.array_equal(out, a)
        with pytest.raises(etptr.InvalidArgumentError, match="slots=0"):
            alloc.copy_host_to_device(ptr, a.ctypes.data, a.nbytes, 0, slots=0)
        with pytest.raises(etptr.InvalidArgumentError, match="src=0"):
            alloc.copy_host_to_device(ptr, 0, a.nbytes, 0)
    finally:
        alloc.deallocate(ptr, 0)


# ------------------------------------------------------------------ stream-ordered form

def test_stream_ordered_round_trip(real_cupy):
    cupy = real_cupy
    s = cupy.cuda.Stream(non_blocking=True)
    a = _payload(5 * MiB + 3)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda", stream=s)
    h = etptr.clone_tensor_ptr_to(d, "cpu", stream=s)
    s.synchronize()
    assert np.array_equal(h.numpy(), a)
    # an int handle works too, and small copies
    h2 = etptr.clone_tensor_ptr_to(
        etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1, 2]), "cuda", stream=s.ptr),
        "cpu", stream=s.ptr)
    s.synchronize()
    assert list(h2.numpy()) == [1, 2]


def test_stream_ordered_after_kernel_on_stream(real_cupy):
    cupy = real_cupy
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.arange(1 << 20, dtype=cupy.float32) * 2
    t = etptr.make_tensor_ptr(x.shape, x.data.ptr, type=etptr.ScalarType.Float, device="cuda",
                              deleter=lambda p, keep=x: None)
    h = etptr.clone_tensor_ptr_to(t, "cpu", stream=s)
    s.synchronize()
    np.testing.assert_array_equal(h.numpy(), np.arange(1 << 20, dtype=np.float32) * 2)


def test_sync_clone_orders_after_current_stream(real_cupy):
    cupy = real_cupy
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.zeros(1 << 22, dtype=cupy.float32)
        x += 1                      # queued on s
        t = etptr.make_tensor_ptr(x.shape, x.data.ptr, type=etptr.ScalarType.Float,
                                  device="cuda", deleter=lambda p, keep=x: None)
        h = etptr.clone_tensor_ptr_to(t, "cpu")     # synchronous: must see the += 1
    assert (h.numpy() == 1).all()


def test_stream_fallback_for_allocators_without_stream_keyword():
    from etptr.testing import HostDeviceAllocator, use_allocator
    a = HostDeviceAllocator()
    with use_allocator(a):
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0, 2.0]), "cuda", stream=7)
        h = etptr.clone_tensor_ptr_to(d, "cpu", stream=7, pinned=False)
    assert list(h.numpy()) == [1.0, 2.0]
    assert a.h2d_count == 1 and a.d2h_count == 1


# ------------------------------------------------------------------ faults

def _usage(pool, device_used):
    s = pool.stats()
    return device_used(), s["in_use_bytes"], s["blocks_in_use"]


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_interrupt_between_chunks_releases_everything(direction, hook, pool, device_used):
    a = _payload(4 * MiB)
    t = etptr.make_tensor_ptr(a)
    d = etptr.clone_tensor_ptr_to(t, "cuda") if direction == "d2h" else None
    base = _usage(pool, device_used)

    def interrupt(where, i):
        if where == direction and i == 2:
            raise KeyboardInterrupt

    _tuning.tune(chunk_hook=interrupt)
    with copy_config(**SMALL), pytest.raises(KeyboardInterrupt):
        if direction == "h2d":
            etptr.clone_tensor_ptr_to(t, "cuda")
        else:
            etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    _tuning.tune(chunk_hook=None)
    assert _usage(pool, device_used) == base
    # the engine still works afterwards
    with copy_config(**SMALL):
        back = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(t, "cuda"), "cpu")
    assert np.array_equal(back.numpy(), a)


def test_cuda_error_mid_copy_releases_everything(fake, pool, device_used):
    a = _payload(2 * MiB)
    base = _usage(pool, device_used)
    fake.fail_copies_after = 3
    with copy_config(**SMALL), pytest.raises(etptr.EtError, match="host->device copy") as ei:
        etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
    fake.fail_copies_after = None
    assert ei.value.error == etptr.Error.Internal
    assert _usage(pool, device_used) == base


def test_out_of_device_memory_leaves_pool_and_device_at_baseline(alloc, pool, device_used):
    base = _usage(pool, device_used)
    with pytest.raises(etptr.MemoryAllocationError):
        etptr.empty([1 << 50], etptr.ScalarType.Byte, device="cuda")
    assert _usage(pool, device_used) == base


def test_pinning_failure_frees_cache_and_retries(fake, pool):
    pool.empty_cache()
    keep = pool.malloc(10 * MiB)
    del keep                                         # one cached block
    assert pool.stats()["cached_bytes"] > 0
    fake.cupy.state.fail_host_alloc = 1
    b = pool.malloc(3 * MiB + 1)                     # fails once, cache freed, retried
    assert pool.stats()["cached_bytes"] == 0 and b.nbytes == 3 * MiB + 1
    fake.cupy.state.fail_host_alloc = 2
    failures = pool.stats()["failures"]
    with pytest.raises(etptr.MemoryAllocationError, match="could not pin"):
        pool.malloc(5 * MiB + 1)
    assert pool.stats()["failures"] == failures + 1


# ------------------------------------------------------------------ many clones, threads

def test_thousand_small_clones_hold_bounded_pinned_memory(pool, device_used):
    base_dev = device_used()
    gc.collect()
    pool.reset_peak()
    start = pool.stats()
    src = etptr.make_tensor_ptr(np.arange(256.0))
    for i in range(1000):
        h = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(src, "cuda"), "cpu")
    np.testing.assert_array_equal(h.numpy(), np.arange(256.0))
    del h
    gc.collect()
    s = pool.stats()
    assert s["in_use_bytes"] == start["in_use_bytes"]
    assert s["held_bytes"] - start["held_bytes"] <= 2 * etptr.cuda.size_class(2048)
    # the result blocks are reused: at most two new ones, however many clones
    assert s["misses"] - start["misses"] <= 2
    assert s["hits"] - start["hits"] >= 998
    assert s["peak_bytes"] <= start["held_bytes"] + 2 * etptr.cuda.size_class(2048)
    assert device_used() == base_dev


def test_concurrent_uploads_from_threads():
    arrays = [_payload(3 * MiB + i, seed=i) for i in range(6)]
    results = [None] * len(arrays)
    errors = []

    def work(i):
        try:
            with copy_config(**SMALL):
                d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(arrays[i]), "cuda")
                results[i] = etptr.clone_tensor_ptr_to(d, "cpu", pinned=bool(i % 2))
        except BaseException as exc:      # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(arrays))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for a, r in zip(arrays, results):
        assert np.array_equal(r.numpy(), a)


# ------------------------------------------------------------------ devices and contexts

def test_caller_device_is_restored(cp, ndev):
    if ndev < 2:
        pytest.skip("needs two CUDA devices")
    cp.cuda.runtime.setDevice(1)
    try:
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cuda:0")
        assert cp.cuda.runtime.getDevice() == 1
        assert d.device.index == 0
        d1 = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([2.0]), etptr.Device(CUDA, -1))
        assert d1.device.index == 1
        assert list(etptr.clone_tensor_ptr_to(d1, "cpu").numpy()) == [2.0]
        assert cp.cuda.runtime.getDevice() == 1
    finally:
        cp.cuda.runtime.setDevice(0)


def test_second_gpu_round_trip(ndev):
    if ndev < 2:
        pytest.skip("needs two CUDA devices")
    a = _payload(3 * MiB + 5)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:1")
    assert d.device == etptr.Device(CUDA, 1)
    for pinned in (True, False):
        assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned).numpy(), a)


def test_no_context_on_gpu0_when_only_gpu1_is_named_fake(fake, cp):
    from etptr.cuda import CudaAllocator
    from etptr.testing import use_allocator
    pool = etptr.cuda.PinnedHostPool()
    shared = etptr.cuda.get_pinned_host_pool()
    shared.empty_cache()                     # its blocks belong to the other fake
    fresh = fake.make_cupy(ndev=2)           # no context made from here on, none current
    try:
        _driver._use_backend(fresh)
        with use_allocator(CudaAllocator()), copy_config(**SMALL):
            a = _payload(MiB + 3)
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:1")
            for pinned in (True, False):
                h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
                assert np.array_equal(h.numpy(), a)
            del d, h
            blk = pool.malloc(1000, 1)
            del blk
            pool.empty_cache()
            shared.empty_cache()
        assert fresh.state.contexts == {1}
    finally:
        shared.empty_cache()
        _driver._use_backend(cp)


CHILD = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    import etptr
    a = np.arange(1 << 20, dtype=np.float32)
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:1")
    h = etptr.clone_tensor_ptr_to(d, "cpu")
    assert np.array_equal(h.numpy(), a)
    h2 = etptr.clone_tensor_ptr_to(d, "cpu", pinned=False)
    del d, h, h2
    cuda = ctypes.CDLL("libcuda.so.1")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0
    print("ACTIVE0", active.value)
""")


def test_no_context_on_gpu0_when_only_gpu1_is_named(real_cupy, ndev):
    if ndev < 2:
        pytest.skip("needs two CUDA devices")
    import os
    import pathlib
    site = str(pathlib.Path(etptr.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (site, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120, env=env, cwd=site)
    assert out.returncode == 0, out.stderr
    assert "ACTIVE0 0" in out.stdout


# ------------------------------------------------------------------ bad sizes, bad handles

@pytest.mark.parametrize("nbytes", [2**63 - 1, 2**63 - 16 * MiB + 1, 2**62])
def test_copy_past_the_device_allocation_is_refused_before_any_byte_moves(alloc, nbytes):
    # nbytes near 2**63 once overflowed the chunk count and "copied" nothing; a copy
    # past the device allocation is now refused first (no host byte read or written)
    host = np.zeros(MiB, np.uint8)
    ptr = alloc.allocate(MiB, 0)
    try:
        with pytest.raises(etptr.InvalidArgumentError, match="past its end"):
            alloc.copy_host_to_device(ptr, host.ctypes.data, nbytes, 0)
        with pytest.raises(etptr.InvalidArgumentError, match="past its end"):
            alloc.copy_device_to_host(host.ctypes.data, ptr, nbytes, 0)
    finally:
        alloc.deallocate(ptr, 0)


def test_copy_one_byte_past_the_device_allocation_is_refused(fake, alloc):
    # (CuPy's pool may carve allocations out of a larger cudaMalloc, whose end is what
    # the driver reports; the stand-in's allocations are exact)
    host = np.zeros(2 * MiB, np.uint8)
    ptr = alloc.allocate(MiB, 0)
    try:
        with pytest.raises(etptr.InvalidArgumentError, match="past its end"):
            alloc.copy_host_to_device(ptr, host.ctypes.data, MiB + 1, 0)
        with pytest.raises(etptr.InvalidArgumentError, match="80 bytes into"):
            alloc.copy_device_to_host(host.ctypes.data, ptr + 80, MiB - 79, 0)
        alloc.copy_host_to_device(ptr + 80, host.ctypes.data, MiB - 80, 0)   # exactly to the end
    finally:
        alloc.deallocate(ptr, 0)


@pytest.mark.parametrize("stream, error", [
    (-5, etptr.InvalidArgumentError), (2**63, etptr.InvalidArgumentError),
    (True, etptr.InvalidTypeError), ("0", etptr.InvalidTypeError),
])
def test_bad_stream_handles_are_refused(alloc, stream, error):
    t = etptr.make_tensor_ptr(np.ones(16, np.float32))
    with pytest.raises(error, match="stream="):
        etptr.clone_tensor_ptr_to(t, "cuda", stream=stream)


def test_stream_protocol_returning_garbage_is_refused(alloc):
    class Odd:
        def __cuda_stream__(self):
            return None
    with pytest.raises(etptr.InvalidTypeError, match="__cuda_stream__"):
        etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.ones(4)), "cuda", stream=Odd())


def test_stream_objects_giving_a_bool_are_refused(alloc):
    # True is an int to Python, but no stream handle: from __index__ or __cuda_stream__
    class Index:
        def __index__(self):
            return True

    class Proto:
        def __cuda_stream__(self):
            return (0, True)

    for stream, match in ((Index(), "__index__"), (Proto(), "__cuda_stream__")):
        with pytest.raises(etptr.InvalidTypeError, match=match):
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.ones(4)), "cuda", stream=stream)


@pytest.mark.parametrize("value", ["abc", 1.5, None], ids=["str", "float", "None"])
def test_stream_objects_whose_index_gives_no_int_are_refused(alloc, value):
    class Index:
        def __index__(self):
            return value

    class Proto:
        def __cuda_stream__(self):
            return (0, Index())

    for stream, match in ((Index(), "__index__"), (Proto(), "__cuda_stream__")):
        with pytest.raises(etptr.InvalidTypeError, match=f"stream=.*{match}.*not an int"):
            etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.ones(4)), "cuda", stream=stream)


def test_stream_handle_may_be_any_integer_type(alloc, cp):
    t = etptr.make_tensor_ptr(np.arange(8, dtype=np.float32))
    d = etptr.clone_tensor_ptr_to(t, "cuda", stream=np.int64(0))
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), t.numpy())


def test_size_class_and_pool_refuse_absurd_sizes(pool):
    assert etptr.cuda.size_class(2**62) == 2**62
    with pytest.raises(etptr.InvalidArgumentError, match="2\\*\\*62"):
        etptr.cuda.size_class(2**62 + 1)
    before = pool.stats()
    with pytest.raises(etptr.MemoryAllocationError, match="2\\*\\*62"):
        pool.malloc(2**63 - 1)
    after = pool.stats()
    assert after["in_use_bytes"] == before["in_use_bytes"] >= 0


def test_pool_malloc_checks_the_device(pool, ndev):
    for bad in (ndev, 2**32 + 1, 2**40):
        with pytest.raises(etptr.InvalidArgumentError, match="device="):
            pool.malloc(10, bad)                 # also when a cached block would fit
    with pytest.raises(etptr.InvalidArgumentError, match="device="):
        pool.malloc(10, -2)


def test_stream_ordered_copy_from_inside_a_pool_block_protects_the_block(fake, alloc):
    # a view into a pinned block (not its start) records the block's event too
    src = etptr.empty([MiB], etptr.ScalarType.Byte, pinned=True)
    view = etptr.make_tensor_ptr(src.numpy()[64:])
    ptr = alloc.allocate(MiB, 0)
    try:
        fake.clear()
        alloc.copy_host_to_device(ptr, view.data_ptr, MiB - 64, 0, stream=0x77)
        assert _pinned_pool._pool_block_pending(src.data_ptr), "the block's event was not recorded"
        assert not _pinned_pool._pool_block_pending(etptr.empty([16], pinned=True).data_ptr)
    finally:
        alloc.deallocate(ptr, 0)


def test_empty_cache_frees_every_block_even_when_one_fails(fake, pool, cp):
    pool.empty_cache()
    blocks = [pool.malloc(4096 * (i + 1)) for i in range(6)]
    del blocks
    assert pool.stats()["blocks_cached"] == 6
    held = len(fake.cupy.state.host.blocks)
    calls = []
    rt = cp.cuda.runtime
    real_free = rt.freeHost

    def failing_free(ptr):
        calls.append(ptr)
        if len(calls) == 1:
            raise rt.CUDARuntimeError(999, "injected freeHost failure")
        return real_free(ptr)

    rt.freeHost = failing_free
    try:
        with pytest.raises(etptr.EtError, match="freeing a page-locked block"):
            pool.empty_cache()
    finally:
        rt.freeHost = real_free
    assert len(calls) == 6                       # every block was tried
    assert pool.stats()["blocks_cached"] == 0
    assert len(fake.cupy.state.host.blocks) == held - 5     # only the one that failed is left


def test_stream_ordered_clone_from_pageable_memory_keeps_nothing_alive(fake, alloc, device_used):
    # a CUDA call that fails on purpose (the driver's pointer-range query, for pageable
    # memory) once kept a traceback, and with it these locals
    base = device_used()

    def run():
        t = etptr.make_tensor_ptr(np.arange(300_000, dtype=np.float32))
        d = etptr.clone_tensor_ptr_to(t, "cuda", stream=0x77)
        return d.nbytes

    assert run() == 1_200_000
    assert device_used() == base


def test_tiny_stream_ordered_upload_of_a_pageable_source_has_read_it_on_return(cp):
    # a small pageable upload is staged at the call: overwriting the source right after
    # the call does not change what arrives
    src = etptr.full([8], 3.0)
    dev = etptr.zeros([8], device="cuda:0")
    s = cp.cuda.Stream()
    for _ in range(100):                  # past the ring of tiny slots
        etptr.h2d_copy(src, dev, stream=s)
    src.numpy()[:] = -1.0
    cp.cuda.runtime.streamSynchronize(s.ptr)
    assert etptr.clone_tensor_ptr_to_cpu(dev).numpy().tolist() == [3.0] * 8


@pytest.mark.parametrize("n", [8, 1024, 1025, 1 << 16], ids=["32B", "4KiB", "4100B", "256KiB"])
def test_stream_ordered_upload_of_a_pinned_block_sees_the_download_before_it(real_cupy, n):
    # download into a page-locked block, then upload from it, both queued on one busy
    # stream: the upload reads the block in stream order, at every size
    cp = real_cupy
    spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long n) {
        long long t = clock64(); while (clock64() - t < n) {} }''', "spin")
    s = cp.cuda.Stream(non_blocking=True)
    a = etptr.full([n], 5.0, device="cuda:0")
    pin = etptr.zeros([n], pinned=True)
    b = etptr.zeros([n], device="cuda:0")
    with s:
        spin((1,), (1,), (np.int64(50_000_000),))        # keeps the stream busy a while
    etptr.d2h_copy(a, pin, stream=s)
    etptr.h2d_copy(pin, b, stream=s)
    s.synchronize()
    assert (etptr.clone_tensor_ptr_to_cpu(b).numpy() == 5.0).all()
