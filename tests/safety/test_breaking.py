"""Regression tests for defects found by hostile testing (CPU only).

Each test that could crash the interpreter when its defect comes back runs its case in a
child process, so that the crash fails the test instead of ending the test run.
"""
import os
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import etptr
from etptr.testing import HostDeviceAllocator, use_allocator

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(etptr.__file__)))


def _run_isolated(code, timeout=120):
    """Run ``code`` in a fresh interpreter that imports this etptr; (returncode, output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_ROOT, TESTS_DIR, os.path.join(TESTS_DIR, "fakes")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd="/")
    return proc.returncode, proc.stdout + proc.stderr


def _describe(rc):
    if rc < 0:
        return f"killed by {signal.Signals(-rc).name}"
    return f"exit status {rc}"


# ---------------------------------------------------------------------------------------
# save_safetensors read each tensor's nbytes three times (header, file size, copy): a
# resize in another thread between them made the CPU copy write past the mapped file
# (SIGSEGV) or leave a file whose header disagrees with its data.


@pytest.mark.parametrize("module, hook", [("_sinks", "TempFile"), ("_pipeline", "_host_bytes")])
def test_save_of_a_tensor_resized_after_the_header_was_built_writes_the_snapshot(module, hook):
    # the file is created (TempFile) and the tensor's bytes taken (_host_bytes) after the
    # header was built
    rc, out = _run_isolated(f"""
        import os, tempfile
        import numpy as np
        import etptr
        from etptr.checkpoint import {module} as hooked_module

        N = 1 << 22
        t = etptr.clone_tensor_ptr(etptr.make_tensor_ptr(np.arange(N, dtype=np.float32)))
        etptr.resize_tensor_ptr(t, [1])
        real = hooked_module.{hook}

        def hooked(*args):
            # what another thread may do once the header is built
            etptr.resize_tensor_ptr(t, [N])
            return real(*args)

        hooked_module.{hook} = hooked
        path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        etptr.save_safetensors({{"w": t}}, path)
        back = etptr.load_safetensors(path, "cpu")["w"]
        assert back.sizes == (1,), back.sizes
        assert back.numpy().tolist() == [0.0]
        assert t.sizes == (N,)
        print("OK")
    """)
    assert rc == 0 and "OK" in out, f"{_describe(rc)}:\n{out[-3000:]}"


# ---------------------------------------------------------------------------------------
# save_safetensors renamed its temporary file over any existing target: a FIFO, a socket or
# a device node (as root, /dev/null) was replaced by a regular file.


def test_save_refuses_a_fifo_target_and_leaves_it_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(etptr.CheckpointError, match="not a regular file"):
        etptr.save_safetensors({"a": etptr.ones([3])}, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]     # no temporary left


def test_save_over_a_symlink_to_a_regular_file_still_works(tmp_path):
    target = tmp_path / "real.safetensors"
    etptr.save_safetensors({"a": etptr.zeros([2])}, target)
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    etptr.save_safetensors({"a": etptr.ones([2])}, link)
    assert etptr.load_safetensors(link, "cpu")["a"].numpy().tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------------------------
# from_dlpack(copy=True) of strides no dim_order describes walked them without checking
# that |stride| * (size - 1) fits int64: an overflowing span wrapped the pointer (SIGSEGV).


def test_dlpack_copy_with_strides_whose_span_overflows_is_refused():
    rc, out = _run_isolated("""
        import etptr
        from _dlpack_ctypes import HandMadeProducer, host_buffer

        buf = host_buffer([1, 2, 3, 4])
        for shape, strides in (([3], [(2**63 - 1) // 4]), ([3], [-((2**63 - 1) // 4)]),
                               ([2, 3], [1, 2**61])):
            p = HandMadeProducer(buf, shape, strides)
            try:
                etptr.from_dlpack(p, copy=True)
            except etptr.InvalidArgumentError as exc:
                assert "strides" in str(exc), exc
            else:
                raise AssertionError(f"strides {strides} were accepted")
            assert p.settle() == 1, p.deleted      # the producer's deleter ran exactly once
        # strides that fit still copy
        p = HandMadeProducer(buf, [2], [2])
        assert etptr.from_dlpack(p, copy=True).numpy().tolist() == [1.0, 3.0]
        print("OK")
    """)
    assert rc == 0 and "OK" in out, f"{_describe(rc)}:\n{out[-3000:]}"


# ---------------------------------------------------------------------------------------
# numpy() of a zero-size tensor whose other sizes NumPy cannot shape (ExecuTorch allows
# (0, 2**62), e.g. after a resize) raised NumPy's bare ValueError.


@pytest.mark.parametrize("with_data", [False, True])
def test_numpy_of_a_zero_size_tensor_numpy_cannot_shape_is_an_etptr_error(with_data):
    if with_data:
        t = etptr.zeros([0, 5])
        etptr.resize_tensor_ptr(t, [0, 2**62])
    else:
        t = etptr.make_tensor_ptr([0, 2**62], None)
    with pytest.raises(etptr.NotSupportedError, match=r"numpy\(\).*sizes=\(0, 4611686018427387904\)"):
        t.numpy()


def test_numpy_of_a_read_only_zero_size_tensor_stays_read_only():
    a = np.zeros((0, 3), np.float32)
    a.flags.writeable = False
    v = etptr.make_tensor_ptr(a).numpy()
    assert v.shape == (0, 3) and not v.flags.writeable
    assert etptr.zeros([0, 3]).numpy().flags.writeable


# ---------------------------------------------------------------------------------------
# HostDeviceAllocator.allocate recorded its block before leaving its lock: an interrupt
# raised there (a signal handler's KeyboardInterrupt) lost the address on its way to etptr,
# and live_bytes reported a leak etptr never had.


def test_interrupts_inside_host_device_allocator_do_not_fake_a_leak():
    rc, out = _run_isolated("""
        import gc, random, signal
        import etptr
        from etptr.testing import HostDeviceAllocator, use_allocator

        def interrupt(sig, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        alloc = HostDeviceAllocator()
        src = etptr.zeros([1000])
        random.seed(7)
        with use_allocator(alloc):
            for i in range(1500):
                try:
                    signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-5, 2e-4))
                    x = (etptr.clone_tensor_ptr_to(src, "cuda") if i % 2 else
                         etptr.clone_tensor_ptrs_to([src] * 8, "cuda"))
                    while True:
                        pass
                except KeyboardInterrupt:
                    pass
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                try:
                    x = None
                except KeyboardInterrupt:
                    pass
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            gc.collect()
            assert alloc.live_bytes == 0, (alloc.live_bytes, len(alloc._blocks))
            assert alloc.allocate_count >= alloc.deallocate_count
        print("OK")
    """, timeout=300)
    assert rc == 0 and "OK" in out, f"{_describe(rc)}:\n{out[-3000:]}"


# ---------------------------------------------------------------------------------------
# Loading onto a device copied from a shared map of the file: a file truncated after it was
# mapped (another process or thread rewriting it in place) faulted the copy with SIGBUS and
# killed the interpreter. Every device load now reads the file (the allocator's
# copy_file_to_device): a truncation part way is a CheckpointError. (device="cpu" hands out
# views of a map, which fault the same way when read after such a truncation: the design's
# documented zero-copy views.)


@pytest.mark.parametrize("pinned", [False, True], ids=["device", "pinned"])
def test_a_load_of_a_file_truncated_part_way_raises_instead_of_sigbus(pinned):
    rc, out = _run_isolated(f"""
        import os, tempfile
        import etptr
        from etptr.testing import HostDeviceAllocator, use_allocator

        path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        etptr.save_safetensors({{"w": etptr.zeros([24 << 20]), "v": etptr.ones([4])}}, path)

        class Truncating(HostDeviceAllocator):
            # the file loses its tail while the first group of its pieces goes up
            def copy_host_to_device(self, dst, src, nbytes, index, **kw):
                os.truncate(path, 4096)
                return super().copy_host_to_device(dst, src, nbytes, index, **kw)

            def allocate_host(self, nbytes, index):
                os.truncate(path, 4096)
                return bytearray(nbytes)

        alloc = Truncating()
        with use_allocator(alloc):
            try:
                etptr.load_safetensors(path, "cpu" if {pinned} else "cuda", pinned={pinned})
            except etptr.CheckpointError as exc:
                print("raised", type(exc).__name__, exc)
            assert alloc.live_bytes == 0
        print("OK")
    """)
    assert rc == 0 and "OK" in out and "raised CheckpointError" in out, \
        f"{_describe(rc)}:\n{out[-3000:]}"


# ---------------------------------------------------------------------------------------
# A for_blob builder with a deleter handed that deleter to every tensor it made: two
# make_tensor_ptr() calls ran it twice for one address (with free(): a double free that
# aborts the interpreter). ExecuTorch's make_tensor_ptr() && consumes the builder.


def test_for_blob_builder_hands_its_deleter_to_one_tensor_only():
    buf = np.zeros(4, np.float32)
    seen = []
    b = etptr.for_blob(buf.ctypes.data, [4]).deleter(seen.append)
    t = b.make_tensor_ptr()
    with pytest.raises(etptr.InvalidStateError, match="deleter"):
        b.make_tensor_ptr()
    del t
    assert seen == [buf.ctypes.data]
    # a new deleter is a new grant; a builder without one makes any number of tensors
    t2 = b.deleter(seen.append).make_tensor_ptr()
    del t2
    assert seen == [buf.ctypes.data] * 2
    plain = etptr.for_blob(buf.ctypes.data, [4])
    assert plain.make_tensor_ptr().data_ptr == plain.make_tensor_ptr().data_ptr


def test_for_blob_builder_whose_first_build_failed_keeps_its_deleter():
    buf = np.zeros(4, np.float32)
    seen = []
    b = etptr.for_blob(buf.ctypes.data, [4]).deleter(seen.append).strides([2])
    with pytest.raises(etptr.InvalidArgumentError):
        b.make_tensor_ptr()
    t = b.strides([1]).make_tensor_ptr()
    del t
    assert seen == [buf.ctypes.data]


# ---------------------------------------------------------------------------------------
# load_safetensors read a file's header, then opened the path again to map the data: a
# save that renamed another file of the same size over the path in between had its data
# read with the old file's header (tensors of the wrong dtype and contents).


def _refused_when_changed_before_mapping(monkeypatch, path, device, change):
    """Load ``path`` onto ``device`` (HostDeviceAllocator for "cuda") with ``change()`` run
    between reading the header and mapping the file: refused, nothing kept."""
    from etptr.checkpoint import _load
    name = "map_file" if device == "cpu" else "open_checked"    # a device load reads the file
    real = getattr(_load, name)

    def change_then_open(plan):
        change()
        return real(plan)

    monkeypatch.setattr(_load, name, change_then_open)
    alloc = HostDeviceAllocator()
    with use_allocator(alloc):
        with pytest.raises(etptr.CheckpointError, match="the file changed"):
            etptr.load_safetensors(path, device)
        assert alloc.live_bytes == 0
    monkeypatch.undo()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_load_refuses_a_file_replaced_between_header_and_mapping(tmp_path, monkeypatch, device):
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({"a": etptr.full([2], 1.5), "b": etptr.full([2], 7, type="Int")}, path)
    # the same size, the same header length, the dtypes swapped
    _refused_when_changed_before_mapping(monkeypatch, path, device, lambda: etptr.save_safetensors(
        {"a": etptr.full([2], 7, type="Int"), "b": etptr.full([2], 1.5)}, path))
    back = etptr.load_safetensors(path, "cpu")
    assert back["a"].scalar_type == etptr.ScalarType.Int
    assert back["b"].numpy().tolist() == [1.5, 1.5]


# A rewrite in place that then set the modification time back (as cp -p and rsync -t do)
# kept the size, inode and mtime the header was read with: the new bytes were read with
# the old header. The status-change time, which cannot be set back, tells it now.


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_load_refuses_a_file_rewritten_in_place_with_its_mtime_restored(tmp_path, monkeypatch,
                                                                       device):
    import os
    import time
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({"a": etptr.full([64], 1.5)}, path)

    def rewrite():
        st = os.stat(path)
        time.sleep(0.01)                    # a ctime that differs on coarse clocks too
        with open(path, "r+b") as f:
            f.seek(st.st_size - 8)
            f.write(b"\x00" * 8)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns

    _refused_when_changed_before_mapping(monkeypatch, path, device, rewrite)
