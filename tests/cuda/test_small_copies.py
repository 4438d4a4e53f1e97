"""Small copies on a real GPU: 4- and 8-byte uploads as stream writes, the tiny slots, and
the fence that synchronous small copies wait on; each path also with the others off."""
import numpy as np
import pytest

import etptr
from etptr.cuda import _small_copy, _tuning

PATHS = [dict(stream_writes=True, fence=True), dict(stream_writes=False, fence=True),
         dict(stream_writes=True, fence=False), dict(stream_writes=False, fence=False)]
PATH_IDS = ["writes+fence", "slots+fence", "writes+sync", "slots+sync"]


@pytest.fixture(params=PATHS, ids=PATH_IDS)
def paths(request, real_cupy):
    with _tuning.tuned(**request.param):
        yield request.param


@pytest.fixture
def spin(real_cupy):
    """spin(stream, cycles, dst=0, value=0): a one-thread kernel that keeps ``stream``
    busy for ``cycles`` GPU clocks, then writes the int32 ``value`` at ``dst`` (if not 0)."""
    k = real_cupy.RawKernel(r'''extern "C" __global__
        void spin(long long n, int* dst, int value) {
            long long t = clock64(); while (clock64() - t < n) {}
            if (dst) *dst = value; }''', "spin")

    def run(stream, cycles, dst=0, value=0):
        with stream:
            k((1,), (1,), (np.int64(cycles), np.uintp(dst), np.int32(value)))
    return run


def _read_now(cp, ptr, nbytes):
    """The device bytes at ``ptr`` as they are now: read on a stream of its own that is
    ordered after nothing else (so a copy still queued elsewhere is not waited for)."""
    reader = cp.cuda.Stream(non_blocking=True)
    out = np.zeros(nbytes, np.uint8)
    cp.cuda.runtime.memcpyAsync(out.ctypes.data, ptr, nbytes, 2, reader.ptr)
    reader.synchronize()
    return out.tobytes()


def test_small_uploads_write_exactly_their_bytes(real_cupy, paths):
    # at every size and alignment, synchronous and queued: the bytes arrive, and the
    # bytes beside them are untouched
    cp = real_cupy
    buf = etptr.DeviceMemoryBuffer.create(8192, "cuda:0")
    rng = np.random.default_rng(5)
    for nbytes in (1, 2, 3, 4, 5, 8, 12, 16, 4096, 4100):
        for offset in (0, 1, 2, 4, 8):
            for queued in (False, True):
                case = f"nbytes={nbytes} offset={offset} queued={queued}"
                cp.cuda.runtime.memset(buf.data_ptr, 0xEE, 8192)
                cp.cuda.runtime.deviceSynchronize()      # before a copy on any stream
                payload = rng.integers(0, 255, nbytes, dtype=np.uint8)
                out = buf.tensor(offset, [nbytes], etptr.ScalarType.Byte)
                if queued:
                    s = cp.cuda.Stream(non_blocking=True)
                    etptr.h2d_copy(etptr.make_tensor_ptr(payload), out, stream=s)
                    s.synchronize()
                else:
                    etptr.h2d_copy(etptr.make_tensor_ptr(payload), out)
                got = _read_now(cp, buf.data_ptr, 8192)
                assert got[offset:offset + nbytes] == payload.tobytes(), case
                assert got[:offset] == b"\xee" * offset, case
                assert got[offset + nbytes:] == b"\xee" * (8192 - offset - nbytes), case


@pytest.mark.parametrize("nbytes", [4, 8, 16])
def test_synchronous_upload_has_landed_on_return(real_cupy, paths, nbytes):
    # the default form completes the copy: a reader ordered after nothing sees it at once
    cp = real_cupy
    dev = etptr.zeros([nbytes // 4], etptr.ScalarType.Int, device="cuda:0")
    for i in range(200):
        src = np.arange(i, i + nbytes // 4, dtype=np.int32)
        etptr.h2d_copy(etptr.make_tensor_ptr(src), dev)
        assert _read_now(cp, dev.data_ptr, nbytes) == src.tobytes()


@pytest.mark.parametrize("nbytes", [4, 8, 64])
def test_synchronous_upload_waits_for_the_callers_stream_past_the_fences_spin(
        real_cupy, paths, spin, nbytes):
    # the caller's current stream is busy far longer than the fence spins (about 30 ms
    # against 0.2 ms): the copy runs after that work, and has landed on return
    cp = real_cupy
    dev = etptr.zeros([nbytes // 4], etptr.ScalarType.Int, device="cuda:0")
    busy = cp.cuda.Stream(non_blocking=True)
    spin(busy, 50_000_000, dev.data_ptr, 1)          # writes 1 after the spin
    src = np.full(nbytes // 4, 2, np.int32)
    with busy:
        etptr.h2d_copy(etptr.make_tensor_ptr(src), dev)
    assert _read_now(cp, dev.data_ptr, nbytes) == src.tobytes()


@pytest.mark.parametrize("nbytes", [4, 8])
def test_queued_upload_is_ordered_after_earlier_work_on_its_stream(real_cupy, paths, spin,
                                                                   nbytes):
    # a stream write reads its source at the call but lands in stream order: after the
    # kernel queued before it, whose write it must overwrite
    cp = real_cupy
    dev = etptr.zeros([nbytes // 4], etptr.ScalarType.Int, device="cuda:0")
    s = cp.cuda.Stream(non_blocking=True)
    spin(s, 20_000_000, dev.data_ptr, 1)
    src = np.full(nbytes // 4, 7, np.int32)
    etptr.h2d_copy(etptr.make_tensor_ptr(src), dev, stream=s)
    src[:] = -1                                       # read at the call: this never arrives
    s.synchronize()
    assert _read_now(cp, dev.data_ptr, nbytes) == np.full(nbytes // 4, 7, np.int32).tobytes()


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
def test_synchronous_download_sees_the_callers_earlier_work(real_cupy, paths, spin, pinned):
    # a small synchronous download waits (fence or stream sync) for the kernel queued on
    # the caller's stream before it, and its bytes are in the out on return
    cp = real_cupy
    dev = etptr.zeros([1], etptr.ScalarType.Int, device="cuda:0")
    out = etptr.zeros([1], etptr.ScalarType.Int, pinned=pinned)
    busy = cp.cuda.Stream(non_blocking=True)
    for value, cycles in ((5, 50_000_000), (6, 0), (7, 1000)):
        spin(busy, cycles, dev.data_ptr, value)
        with busy:
            etptr.d2h_copy(dev, out)
        assert out.numpy().tolist() == [value]


def test_upload_into_managed_memory_goes_through_the_slots(real_cupy, alloc):
    # stream writes do not take managed memory: a 4-byte upload into it (through the
    # allocator's raw-address copy) still arrives, and the bytes after it are untouched
    cp = real_cupy
    mem = cp.cuda.ManagedMemory(256)
    arr = cp.ndarray((2,), np.int32, cp.cuda.MemoryPointer(mem, 0))
    arr[:] = -3
    cp.cuda.runtime.deviceSynchronize()
    for i in range(3):
        src = np.array([i + 40], np.int32)
        alloc.copy_host_to_device(arr.data.ptr, src.ctypes.data, 4, 0)
        cp.cuda.runtime.deviceSynchronize()
        assert arr.tolist() == [i + 40, -3]


def test_threads_share_the_fence(real_cupy):
    # synchronous small copies from several threads number the one fence word in stream
    # order: none of them waits forever or returns before its own copy has landed
    import threading
    cp = real_cupy
    errors = []

    def work(k):
        try:
            dev = etptr.zeros([2], etptr.ScalarType.Int, device="cuda:0")
            for i in range(300):
                src = np.array([k, i], np.int32)
                etptr.h2d_copy(etptr.make_tensor_ptr(src), dev)
                if _read_now(cp, dev.data_ptr, 8) != src.tobytes():
                    errors.append((k, i))
                    return
        except BaseException as exc:       # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_the_small_copy_paths_are_tuning_fields(real_cupy):
    etptr.zeros([1], device="cuda:0")                     # the copies' driver is loaded
    assert _small_copy._stream_writes_available()      # libcuda on this machine has them
    before = _tuning.values()
    assert before["stream_writes"] and before["fence"]  # both on by default
    with _tuning.tuned(stream_writes=False):
        assert _tuning.values() == dict(before, stream_writes=False)
        with _tuning.tuned(fence=False):                # the other stays
            assert _tuning.values() == dict(before, stream_writes=False, fence=False)
    assert _tuning.values() == before
