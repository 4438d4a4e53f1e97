"""save_safetensors(..., background=True): the handle, the copy-out into a bounded
staging, tensors changed or freed once staged, failures through result(), cancel, and
a process that exits or is interrupted with a save in flight."""
import errno
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import etptr
from etptr import DeviceType
from etptr.checkpoint import CheckpointError, SaveHandle
from etptr.checkpoint import _pipeline, _sinks
from etptr.testing import HostDeviceAllocator, use_allocator

from _checkpoint_helpers import open_fds, raw_bytes, reference_read
from _helpers import ETPTR_PARENT, child_env


class _Staging(HostDeviceAllocator):
    """A host-simulated CUDA allocator whose allocate_host blocks are counted while they
    live (and the most alive at once), and whose device -> host copies can be slowed."""

    def __init__(self, delay=0.0):
        super().__init__(DeviceType.CUDA)
        self.delay = delay
        self._host_blocks = []
        self.peak = 0
        self.lock = threading.Lock()

    def allocate_host(self, nbytes, index):
        block = np.empty(nbytes, np.uint8)
        with self.lock:
            self._host_blocks.append((weakref.ref(block), nbytes))
            self.peak = max(self.peak, self.host_bytes)
        return block

    @property
    def host_bytes(self):
        return sum(n for r, n in self._host_blocks if r() is not None)

    def copy_device_to_host(self, dst, src, nbytes, index):
        time.sleep(self.delay)
        super().copy_device_to_host(dst, src, nbytes, index)


@pytest.fixture
def staging():
    alloc = _Staging()
    with use_allocator(alloc):
        yield alloc
    gc.collect()


@pytest.fixture(params=["map", "pwrite"])
def write_path(request, monkeypatch):
    monkeypatch.setattr(_sinks, "WRITE_PATH", request.param)
    return request.param


def _arrays(n, nbytes, seed=0):
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.integers(0, 2**31, nbytes // 4, dtype=np.int32) for i in range(n)}


def _on_device(arrays):
    return {k: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:0")
            for k, a in arrays.items()}


def _check(path, arrays):
    read = reference_read(path)
    assert set(read) == set(arrays)
    for k, a in arrays.items():
        assert read[k] == ("I32", a.shape, raw_bytes(a)), k


def _slow_writes(monkeypatch, gate):
    """Writes wait for ``gate`` (a threading.Event) to be set."""
    for cls in (_sinks.PwriteSink, _sinks.MapSink):
        real = cls.write_at

        def write_at(self, offset, src, real=real):
            gate.wait(30)
            return real(self, offset, src)

        monkeypatch.setattr(cls, "write_at", write_at)


def test_the_handle(tmp_path, staging, write_path):
    arrays = _arrays(4, 1 << 20)
    path = tmp_path / "bg.safetensors"
    h = etptr.save_safetensors(_on_device(arrays) | {"cpu": etptr.ones([3])}, path,
                               background=True)
    assert isinstance(h, SaveHandle)
    assert h.result(timeout=30) is None
    assert h.staged() and h.done() and h.wait_staged(0)
    assert 0 < h.staged_seconds <= h.done_seconds
    assert h.paths == (path,)
    assert not h.cancel()
    assert repr(h).startswith("<SaveHandle done ")
    read = reference_read(path)
    assert read["cpu"] == ("F32", (3,), np.ones(3, np.float32).tobytes())
    for k, a in arrays.items():
        assert read[k][2] == raw_bytes(a)
    assert sorted(os.listdir(tmp_path)) == ["bg.safetensors"]
    with pytest.raises(TypeError, match="returned by save_safetensors"):
        SaveHandle()


def test_staged_comes_first_and_the_tensors_may_then_change_or_go(tmp_path, staging,
                                                                   monkeypatch, write_path):
    gate = threading.Event()
    _slow_writes(monkeypatch, gate)
    arrays = _arrays(3, 1 << 20, seed=1)
    tensors = _on_device(arrays)
    host = np.array(arrays["w0"])
    tensors["host"] = etptr.make_tensor_ptr(host)
    live = staging.live_bytes
    h = etptr.save_safetensors(tensors, tmp_path / "x.safetensors", background=True)
    assert h.wait_staged(30)
    assert not h.done()                       # the files wait for the gate
    # the caller changes its CPU tensor and frees its device tensors
    host[:] = 0
    tensors.clear()
    gc.collect()
    assert staging.live_bytes == live - sum(a.nbytes for a in arrays.values())
    gate.set()
    h.result(30)
    _check(tmp_path / "x.safetensors", arrays | {"host": arrays["w0"]})
    assert staging.host_bytes == 0


def test_a_tensor_freed_or_resized_while_it_is_copied(tmp_path, monkeypatch):
    # the copy-out is slow: the caller frees one tensor and resizes another meanwhile
    alloc = _Staging(delay=0.02)
    with use_allocator(alloc):
        arrays = _arrays(6, 64 << 10, seed=2)
        tensors = _on_device(arrays)
        resizable = etptr.clone_tensor_ptr_to(
            etptr.make_tensor_ptr([8], np.arange(8, dtype=np.int32),
                                  dynamism=etptr.TensorShapeDynamism.DYNAMIC_BOUND), "cuda:0")
        tensors["r"] = resizable
        monkeypatch.setattr(_pipeline, "CHUNK_BYTES", 1 << 20)
        h = etptr.save_safetensors(tensors, tmp_path / "x.safetensors", background=True,
                                   staging_bytes=1 << 20)
        etptr.resize_tensor_ptr(resizable, [2])
        del tensors["w3"], tensors
        gc.collect()
        h.result(30)
        read = reference_read(tmp_path / "x.safetensors")
        assert read["r"] == ("I32", (8,), np.arange(8, dtype=np.int32).tobytes())
        _check(tmp_path / "x.safetensors", arrays | {"r": np.arange(8, dtype=np.int32)})
        del resizable, h
        gc.collect()
        assert alloc.live_bytes == 0 and alloc.host_bytes == 0


@pytest.mark.parametrize("cap_mib", [1, 3])
def test_staging_never_passes_its_cap(tmp_path, staging, monkeypatch, cap_mib, write_path):
    monkeypatch.setattr(_pipeline, "CHUNK_BYTES", 1 << 20)
    arrays = _arrays(8, 1 << 20, seed=4)
    real = _sinks.PwriteSink.write_at if write_path == "pwrite" else _sinks.MapSink.write_at

    def slow(self, offset, src):
        time.sleep(0.01)
        return real(self, offset, src)

    monkeypatch.setattr(_sinks.PwriteSink if write_path == "pwrite" else _sinks.MapSink,
                        "write_at", slow)
    h = etptr.save_safetensors(_on_device(arrays), tmp_path / "d", max_shard_size=3 << 20,
                               background=True, staging_bytes=cap_mib << 20)
    h.result(60)
    assert 0 < staging.peak <= cap_mib << 20
    assert staging.host_bytes == 0
    from etptr.checkpoint._shards import INDEX_NAME
    back = etptr.load_safetensors(tmp_path / "d" / INDEX_NAME, "cpu")
    for k, a in arrays.items():
        assert raw_bytes(back[k].numpy()) == raw_bytes(a)


def test_the_default_cap_is_the_checkpoint(tmp_path, staging, monkeypatch):
    gate = threading.Event()
    _slow_writes(monkeypatch, gate)
    arrays = _arrays(4, 1 << 20, seed=5)
    h = etptr.save_safetensors(_on_device(arrays), tmp_path / "x.safetensors", background=True)
    assert h.wait_staged(30)          # every byte out while no block has been written yet
    assert staging.host_bytes >= 4 << 20
    gate.set()
    h.result(30)
    assert staging.host_bytes == 0


def test_a_failure_comes_through_result(tmp_path, staging, monkeypatch, write_path):
    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate" if write_path == "map" else "pwrite", full)
    old = tmp_path / "x.safetensors"
    old.write_bytes(b"previous")
    fds = open_fds()
    h = etptr.save_safetensors(_on_device(_arrays(2, 1 << 16)), old, background=True)
    with pytest.raises(CheckpointError, match="x.safetensors: cannot be written .No space"):
        h.result(30)
    assert h.done() and h.staged()
    assert old.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["x.safetensors"]
    assert open_fds() == fds
    assert staging.host_bytes == 0


def test_a_device_copy_failing(tmp_path, monkeypatch):
    class Flaky(_Staging):
        def copy_device_to_host(self, dst, src, nbytes, index):
            raise etptr.MemoryAllocationError("the device went away")

    alloc = Flaky()
    with use_allocator(alloc):
        tensors = _on_device(_arrays(2, 1 << 16))
        h = etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=1 << 16,
                                   background=True)
        with pytest.raises(etptr.MemoryAllocationError, match="went away"):
            h.result(30)
        assert os.listdir(tmp_path) == []         # the directory it made is gone too
        assert alloc.host_bytes == 0


def test_argument_errors_come_from_the_call(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path, background=True)
    with pytest.raises(CheckpointError, match="staging_bytes=0"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "x", background=True,
                               staging_bytes=0)
    assert os.listdir(tmp_path) == []


def test_cancel(tmp_path, staging, monkeypatch, write_path):
    gate = threading.Event()
    _slow_writes(monkeypatch, gate)
    h = etptr.save_safetensors(_on_device(_arrays(3, 1 << 20)), tmp_path / "d",
                               max_shard_size=1 << 20, background=True)
    assert h.wait_staged(30)
    assert h.cancel()
    gate.set()
    with pytest.raises(CheckpointError, match="cancelled; nothing was written"):
        h.result(30)
    assert not h.cancel()
    assert os.listdir(tmp_path) == []
    assert staging.host_bytes == 0


def test_result_times_out(tmp_path, monkeypatch):
    gate = threading.Event()
    _slow_writes(monkeypatch, gate)
    h = etptr.save_safetensors({"a": etptr.ones([4])}, tmp_path / "x.safetensors",
                               background=True)
    with pytest.raises(TimeoutError, match="still running"):
        h.result(timeout=0.05)
    gate.set()
    h.result(30)


@pytest.mark.parametrize("begun", [False, True])
def test_an_interrupt_while_the_save_starts_cancels_it(tmp_path, monkeypatch, begun):
    from etptr.checkpoint import _background
    tasks = lambda: len(os.listdir("/proc/self/task"))     # every thread, bare ones too
    baseline = tasks()
    real = _background._start_thread

    def start(fn, args):
        real(fn, args)
        if begun:                            # the save's thread got going first
            while "by" not in args[-1]:
                time.sleep(0.001)
        raise KeyboardInterrupt

    monkeypatch.setattr(_background, "_start_thread", start)
    with pytest.raises(KeyboardInterrupt):
        etptr.save_safetensors({"a": etptr.ones([1 << 16])}, tmp_path / "x.safetensors",
                               background=True)
    if begun and os.listdir(tmp_path):     # it had finished before the cancel: complete
        assert os.listdir(tmp_path) == ["x.safetensors"]
        reference_read(tmp_path / "x.safetensors")
    else:
        assert os.listdir(tmp_path) == []
    deadline = time.monotonic() + 10
    while tasks() > baseline and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tasks() == baseline
    assert not _background._IN_FLIGHT


_EXITING = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import etptr
    target, how = sys.argv[1], sys.argv[2]
    # Ctrl-C as an interactive process meets it (a job started in the background, as CI
    # may start this one, inherits SIGINT ignored and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    arrays = {f"w{i}": np.full(1 << 22, i, np.int32) for i in range(8)}   # 8 x 16 MiB
    h = etptr.save_safetensors({k: etptr.make_tensor_ptr(a) for k, a in arrays.items()},
                               target, background=True, max_shard_size="40MB")
    print("started", flush=True)
    if how == "exit":
        sys.exit(0)
    if how == "interrupt":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    if how == "kill":
        os._exit(0)
""")


@pytest.mark.parametrize("how", ["exit", "interrupt", "kill"])
def test_a_process_closing_with_a_save_in_flight(tmp_path, how):
    target = tmp_path / "ckpt"
    out = subprocess.run([sys.executable, "-c", _EXITING, str(target), how],
                         capture_output=True, text=True, timeout=120,
                         cwd=ETPTR_PARENT, env=child_env())
    assert "started" in out.stdout, out.stderr
    if how == "interrupt":
        assert "KeyboardInterrupt" in out.stderr
    names = sorted(os.listdir(target)) if target.exists() else []
    from etptr.checkpoint._shards import INDEX_NAME
    if how != "kill":
        # Python waits for the save's thread before it finalises: the save completes
        assert not [n for n in names if n.startswith(".")]
        back = etptr.load_safetensors(target / INDEX_NAME, "cpu")
        for i in range(8):
            assert (back[f"w{i}"].numpy() == i).all()
    else:
        # killed outright: at most temporary files; every real name is a complete file
        for n in names:
            if n.endswith(".safetensors") and not n.startswith("."):
                reference_read(target / n)
        if INDEX_NAME in names:
            etptr.load_safetensors(target / INDEX_NAME, "cpu")


def test_a_child_forked_during_a_background_save_exits_without_waiting_for_it(tmp_path):
    from etptr.checkpoint import _background
    release = threading.Lock()
    release.acquire()
    real = _background._produce_and_commit

    def held(*args):
        release.acquire()                    # the save stays in flight until released
        return real(*args)

    _background._produce_and_commit = held
    try:
        h = etptr.save_safetensors({"a": etptr.ones([4])}, tmp_path / "x.safetensors",
                                   background=True)
        pid = os.fork()
        if pid == 0:
            _background._wait_at_exit()      # what the child's exit runs: returns at once
            os._exit(0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited for its parent's save")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.release()
        _background._produce_and_commit = real
    h.result(30)
