"""The copy engine's libcuda paths without a GPU: against tests/fakes/fakecuda.c, a stand-in
driver with asynchronous streams and fault injection (see tests/fakes/_fake_libcuda.py), with
its knobs turned further than tests/cuda's fake-GPU mode turns them. Each test runs in a
process of its own, since the driver is chosen when CuPy is first loaded.

What only a real GPU can show (speed, the real driver's ordering) is in tests/cuda.
"""
import os
import sys

import pytest

import _fake_libcuda

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the fake driver is a Linux shared library")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if not os.path.exists(_fake_libcuda.SOURCE):
        pytest.skip("tests/fakes/fakecuda.c is not here")
    path = _fake_libcuda.build(str(tmp_path_factory.mktemp("fakecuda")))
    if path is None:
        pytest.skip("no C compiler to build the fake libcuda")
    return path


def _run(path, body, timeout=120):
    """Run ``body`` after setting up the fake driver; its stdout (the process must exit 0)."""
    return _fake_libcuda.run(path, body, timeout)


def test_copies_of_every_size_round_trip_through_the_libcuda_paths(fake_driver):
    out = _run(fake_driver, """
        assert _small_copy._stream_writes_available()
        for n in [1, 3, 4, 5, 8, 12, 4096, 4100, 70000, 3 << 20]:
            a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
            d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
            for pinned in (True, False):       # a pinned result up to 1 MiB waits on the fence
                h = etptr.clone_tensor_ptr_to(d, "cpu", pinned=pinned)
                assert np.array_equal(h.numpy(), a), (n, pinned)
        print("writes", F.knob("fake_writes").value, "writes64", F.knob("fake_writes64").value,
              "overruns", F.knob("fake_overruns").value, "bad", F.knob("fake_bad_device").value)
    """)
    counts = dict(zip(out.split()[::2], map(int, out.split()[1::2])))
    assert counts["writes"] > 0 and counts["writes64"] > 0      # stream writes and fences ran
    assert counts["overruns"] == 0 and counts["bad"] == 0


def test_synchronous_small_copies_have_landed_on_return_from_many_threads(fake_driver):
    # "device" memory is host memory here, so a copy that returned early is seen at once;
    # operations take up to 0.3 ms each, longer than the fence spins
    out = _run(fake_driver, """
        F.knob("fake_delay_max_us").value = 300
        errors = []

        def work(t):
            rng = np.random.default_rng(t)
            dev = etptr.zeros([2048], etptr.ScalarType.Byte, device="cuda:0")
            for it in range(150):
                n = int(rng.choice([4, 8, 12, 100, 2048]))
                off = int(rng.choice([0, 4, 8])) if n <= 8 else 0
                a = rng.integers(0, 256, n, dtype=np.uint8)
                dst = etptr.from_blob(dev.data_ptr + off, [n], etptr.ScalarType.Byte,
                                      device="cuda:0")
                etptr.h2d_copy(etptr.make_tensor_ptr(a), dst)
                if ctypes.string_at(dev.data_ptr + off, n) != a.tobytes():
                    errors.append(("up", t, it, n, off))
                h = etptr.empty([n], etptr.ScalarType.Byte, pinned=True)
                etptr.d2h_copy(dst, h)
                if ctypes.string_at(h.data_ptr, n) != a.tobytes():
                    errors.append(("down", t, it, n, off))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(len(errors), errors[:3])
    """)
    assert out.startswith("0 []"), out


def test_a_refused_fence_write_falls_back_to_stream_synchronisation(fake_driver):
    # a driver that refuses stream writes into host memory: a small download into
    # page-locked memory still completes before it returns (its DMA does not write into
    # a block the pool has handed out again), and the fence is not asked for again
    out = _run(fake_driver, """
        F.knob("fake_delay_max_us").value = 20000
        a = np.full(4096, 0x11, np.uint8)
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
        F.knob("fake_write_host_rc").value = 801
        h = etptr.clone_tensor_ptr_to(d, "cpu")
        assert (h.numpy() == 0x11).all()
        del h
        mine = etptr.empty([4096], etptr.ScalarType.Byte, pinned=True)
        ctypes.memset(mine.data_ptr, 0x22, 4096)
        time.sleep(0.1)
        assert ctypes.string_at(mine.data_ptr, 4096) == b"\\x22" * 4096
        writes = F.knob("fake_writes").value
        assert (etptr.clone_tensor_ptr_to(d, "cpu").numpy() == 0x11).all()
        print("fence writes after the refusal:", F.knob("fake_writes").value - writes)
    """)
    assert "fence writes after the refusal: 0" in out, out


def test_a_driver_refusing_stream_writes_uploads_through_the_slots(fake_driver):
    out = _run(fake_driver, """
        F.knob("fake_write_rc").value = 801
        d = etptr.zeros([2], etptr.ScalarType.Int, device="cuda")
        for i in range(3):
            etptr.h2d_copy(etptr.make_tensor_ptr(np.array([i, -i], np.int32)), d)
            assert etptr.clone_tensor_ptr_to(d, "cpu").numpy().tolist() == [i, -i]
        print("writes", F.knob("fake_writes").value)
    """)
    assert out.split() == ["writes", "0"]


def test_a_refused_64_bit_write_keeps_the_32_bit_ones(fake_driver):
    out = _run(fake_driver, """
        F.knob("fake_write64_rc").value = 801
        d8 = etptr.zeros([1], etptr.ScalarType.Long, device="cuda:0")
        etptr.h2d_copy(etptr.make_tensor_ptr(np.array([1 << 40], np.int64)), d8)
        assert etptr.clone_tensor_ptr_to(d8, "cpu").numpy().tolist() == [1 << 40]
        d4 = etptr.zeros([1], etptr.ScalarType.Int, device="cuda:0")
        w = F.knob("fake_writes").value
        etptr.h2d_copy(etptr.make_tensor_ptr(np.array([7], np.int32)), d4)
        t = _tuning.values()
        print("32-bit writes for a 4-byte upload:", F.knob("fake_writes").value - w,
              t["stream_writes"], t["fence"])
    """)
    assert "32-bit writes for a 4-byte upload: 2 True True" in out, out


def test_a_sticky_error_is_raised_at_once_and_keeps_no_pinned_memory(fake_driver):
    out = _run(fake_driver, """
        a = np.arange(2, dtype=np.int32)
        d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda")
        big = np.ones(3 << 20, np.uint8)
        F.knob("fake_fail_after").value = 0         # the next copy fails, sticky 700
        t0 = time.time()
        for f in (lambda: etptr.clone_tensor_ptr_to(d, "cpu"),
                  lambda: etptr.h2d_copy(etptr.make_tensor_ptr(a), d),
                  lambda: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(big), "cuda")):
            try:
                f()
                print("no error")
            except etptr.EtError as exc:
                assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(exc), exc
        print("seconds", round(time.time() - t0, 1), "blocks", pool.stats()["blocks_in_use"])
    """)
    assert "no error" not in out and "blocks 0" in out, out
    assert float(out.split()[1]) < 5


def test_backend_changes_under_running_copies_do_not_crash(fake_driver):
    # copies in two threads while a third swaps the backend between two fake CuPys over
    # the fake driver: copies may fail (their streams vanish, or they find the table's
    # stubs, which it holds during a swap), the process must not
    out = _run(fake_driver, """
        from etptr.cuda import _driver
        other = F.make_cupy(ndev=2)
        stop = time.time() + 3

        def copier():
            x = np.array([1, 2], np.int32)
            while time.time() < stop:
                try:
                    etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(
                        etptr.make_tensor_ptr(x), "cuda"), "cpu")
                except etptr.EtError:
                    pass

        def swapper():
            n = 0
            while time.time() < stop:
                _driver._use_backend(other if n % 2 == 0 else F.cupy)
                n += 1

        threads = [threading.Thread(target=f) for f in (copier, copier, swapper)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("survived")
    """)
    assert "survived" in out


def test_small_scattered_pieces_go_through_the_copy_kernel(fake_driver):
    # separately allocated small tensors: packed into the scratch area and scattered by the
    # kernel (up), gathered by it (down), each in stream order behind slow copies
    out = _run(fake_driver, """
        F.knob("fake_delay_max_us").value = 300
        rng = np.random.default_rng(0)
        arrays = [rng.integers(0, 1 << 30, 100 + 7 * i, dtype=np.int32) for i in range(50)]
        outs = [etptr.empty([a.size], etptr.ScalarType.Int, device="cuda") for a in arrays]
        etptr.h2d_copy([etptr.make_tensor_ptr(a) for a in arrays], outs)
        back = etptr.clone_tensor_ptrs_to(outs, "cpu")
        assert all(np.array_equal(a, b.numpy()) for a, b in zip(arrays, back))
        print("launches", F.knob("fake_launches").value, "bad", F.knob("fake_bad_device").value)
    """)
    counts = dict(zip(out.split()[::2], map(int, out.split()[1::2])))
    assert counts["launches"] >= 2 and counts["bad"] == 0, out
