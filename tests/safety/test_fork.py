"""Host-only etptr in a child made by os.fork(), on machines without a GPU.

(A child forked after CUDA was used is covered by tests/cuda/test_faults_load.py,
on a device or under the fake CuPy.)
"""
import os

import pytest

from _helpers import FORK_AND_WAIT, run_isolated

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")



def test_threaded_host_copy_in_child_after_parent_used_copy_threads():
    # The parent's copy threads do not exist in a forked child: the child must
    # start its own (not wait forever for the parent's), and the parent keeps its own.
    out = run_isolated(FORK_AND_WAIT + """
    import numpy as np
    from etptr._core import _host_copy
    from etptr.cuda import _driver
    a = np.frombuffer(np.random.default_rng(0).bytes(16 << 20), np.uint8)
    b = np.zeros_like(a)
    _host_copy.parallel_copy(b.ctypes.data, a.ctypes.data, a.nbytes, 4)
    assert np.array_equal(a, b)
    parent_workers = _host_copy.copy_threads()["workers"]
    assert parent_workers >= 3, _host_copy.copy_threads()

    def child():
        assert _host_copy.copy_threads()["workers"] == 0, _host_copy.copy_threads()
        c = np.zeros_like(a)
        _host_copy.parallel_copy(c.ctypes.data, a.ctypes.data, a.nbytes, 4)
        assert np.array_equal(a, c)
        assert _host_copy.copy_threads()["workers"] >= 3, _host_copy.copy_threads()
        print("CHILD OK")
        return 0

    status = fork_and_wait(child, limit=30)
    assert status == 0, status
    b[:] = 0
    _host_copy.parallel_copy(b.ctypes.data, a.ctypes.data, a.nbytes, 4)   # the parent still uses threads
    assert np.array_equal(a, b)
    assert _host_copy.copy_threads()["workers"] == parent_workers
    print("PARENT OK")
    """, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CHILD OK" in out.stdout and "PARENT OK" in out.stdout, out.stdout + out.stderr


def test_streaming_file_reads_in_child_forked_while_the_parent_reads():
    # A child forked from one thread while another reads a file through the copy
    # threads' bounce buffers reads through its own threads and buffers, exactly.
    out = run_isolated(FORK_AND_WAIT + """
    import os, tempfile, threading
    import numpy as np
    from etptr._core import _host_copy
    data = np.frombuffer(np.random.default_rng(1).bytes(24 << 20), np.uint8)
    fd, path = tempfile.mkstemp()
    os.write(fd, data.tobytes())
    segs = lambda dst: [(dst.ctypes.data + 1, 3, (8 << 20) + 5), (dst.ctypes.data + (9 << 20), 7 << 20, 11 << 20)]
    want = np.concatenate([data[3:3 + (8 << 20) + 5], data[7 << 20:18 << 20]])
    got = lambda dst: np.concatenate([dst[1:1 + (8 << 20) + 5], dst[9 << 20:20 << 20]])
    stop = threading.Event()
    errors = []

    def reader():
        dst = np.zeros(21 << 20, np.uint8)
        while not stop.is_set():
            _host_copy.parallel_read(fd, segs(dst), 4, 8, True, 256 << 10)
            if not np.array_equal(got(dst), want):
                errors.append("parent read wrong bytes")

    t = threading.Thread(target=reader)
    t.start()

    def child():
        dst = np.zeros(21 << 20, np.uint8)
        for _ in range(3):
            _host_copy.parallel_read(fd, segs(dst), 4, 8, True, 256 << 10)
            assert np.array_equal(got(dst), want)
        print("CHILD OK")
        return 0

    try:
        statuses = [fork_and_wait(child, limit=30) for _ in range(3)]
    finally:
        stop.set()
        t.join()
    os.unlink(path)
    assert statuses == [0, 0, 0], statuses
    assert not errors, errors
    print("PARENT OK")
    """, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("CHILD OK") == 3 and "PARENT OK" in out.stdout, out.stdout + out.stderr


def test_host_only_etptr_in_child_without_cuda():
    out = run_isolated(FORK_AND_WAIT + """
    import numpy as np
    import etptr, etptr.cuda
    from etptr.testing import HostDeviceAllocator, use_allocator
    t = etptr.make_tensor_ptr(np.arange(12.0).reshape(3, 4))
    pool = etptr.cuda.get_pinned_host_pool()

    def child():
        from etptr._core import _host_copy
        from etptr.cuda import _driver
        assert not _driver._cuda_forked()          # CUDA was never used: nothing refused
        c = etptr.clone_tensor_ptr(t, etptr.ScalarType.Float)
        assert c.numpy().sum() == 66.0
        assert pool.stats()["in_use_bytes"] == 0
        with use_allocator(HostDeviceAllocator()):
            d = etptr.clone_tensor_ptr_to(t, "cuda")
            assert np.array_equal(etptr.clone_tensor_ptr_to(d, "cpu").numpy(), t.numpy())
        print("CHILD OK")
        return 0

    status = fork_and_wait(child, limit=30)
    assert status == 0, status
    print("PARENT OK")
    """, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CHILD OK" in out.stdout and "PARENT OK" in out.stdout, out.stdout + out.stderr
