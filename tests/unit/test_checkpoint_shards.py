"""save_safetensors(..., max_shard_size=): Hugging Face's sharded layout, written in
parallel; the index last; checks and faults leave no index naming a missing shard."""
import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import etptr
from etptr.checkpoint import CheckpointError
from etptr.checkpoint import _pipeline, _shards, _sinks

from _checkpoint_helpers import DTYPES, code_of, random_array, raw_bytes, reference_read
from _checkpoint_helpers import tiny_bert
from _helpers import ETPTR_PARENT, child_env, run_threads

INDEX = "model.safetensors.index.json"


def _tensors(sizes, seed=0, code="F32"):
    """{name: CPU tensor} of ``sizes`` elements each, in the order given, and their arrays."""
    rng = np.random.default_rng(seed)
    arrays = {f"t{i:02d}": random_array(code, (n,), rng) for i, n in enumerate(sizes)}
    tensors = {k: etptr.make_tensor_ptr(list(a.shape), np.array(a), type=DTYPES[code][0])
               for k, a in arrays.items()}
    return tensors, arrays


def _index(directory):
    return json.loads((directory / INDEX).read_text())


def _listing(directory):
    return sorted(os.listdir(directory))


def _assert_loads(directory, arrays):
    """load_safetensors of the index and the safetensors library give the arrays bit for
    bit."""
    back = etptr.load_safetensors(directory / INDEX, "cpu")
    assert set(back) == set(arrays)
    for name, arr in arrays.items():
        got = back[name].numpy() if back[name].nbytes else np.empty(0, arr.dtype)
        assert raw_bytes(got) == raw_bytes(arr), name
    index = _index(directory)
    for shard in set(index["weight_map"].values()):
        for name, (dtype, shape, data) in reference_read(directory / shard).items():
            assert index["weight_map"][name] == shard
            assert (dtype, shape, data) == (code_of(arrays[name].dtype), arrays[name].shape,
                                            raw_bytes(arrays[name]))


@pytest.fixture(params=["map", "pwrite"])
def write_path(request, monkeypatch):
    monkeypatch.setattr(_sinks, "WRITE_PATH", request.param)
    return request.param


# ------------------------------------------------------------------ the layout

@pytest.mark.parametrize("value, expected", [
    (1, 1), (4096, 4096), ("4096", 4096), ("5GB", 5 * 10**9), ("5gB", 5 * 10**9),
    ("500MB", 500 * 10**6), ("10KB", 10**4), ("2MiB", 2 << 20), ("1GiB", 1 << 30),
    ("1.5GB", 1_500_000_000), (" 3 KiB ", 3072), ("1TB", 10**12), ("7B", 7),
    ("0.1KB", 100), ("9" * 400, int("9" * 400)), ("9" * 400 + "GB", int("9" * 400) * 10**9)])
def test_shard_sizes(value, expected):
    assert _shards.parse_shard_size(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "", "GB", "5Gb", "5gb", "5 parsecs", 1.5,
                                   True, b"5GB", "-3MB"])
def test_bad_shard_sizes(tmp_path, value):
    with pytest.raises(CheckpointError, match="max_shard_size"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "d", max_shard_size=value)
    assert _listing(tmp_path) == []


def test_the_split_is_transformers(tmp_path):
    # huggingface_hub.split_state_dict_into_shards_factory: in order, a new shard when the
    # next tensor would pass the limit, a tensor over the limit in a shard of its own
    class It:
        def __init__(self, name, n):
            self.name = name
            self.tensor = etptr.zeros([n], type="Byte")

    items = [It(n, s) for n, s in [("a", 40), ("b", 50), ("c", 150), ("d", 10), ("e", 100),
                                   ("f", 1), ("g", 0)]]
    got = [[it.name for it in shard] for shard in _shards.split(items, 100)]
    assert got == [["c"], ["a", "b", "d"], ["e"], ["f", "g"]]
    assert _shards.shard_names(3) == ["model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors"]


def test_a_sharded_checkpoint_in_hugging_faces_layout(tmp_path, write_path):
    tensors, arrays = _tensors([100, 300, 50, 200, 10, 0, 600])
    directory = tmp_path / "ckpt"
    etptr.save_safetensors(tensors, directory, max_shard_size=1200, metadata={"format": "pt"})
    names = [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)]
    assert _listing(directory) == names + [INDEX]
    index = _index(directory)
    # bytes 400, 1200, 200, 800, 40, 0, 2400 under 1200: t06, over the limit, gets a shard
    # of its own when it is met; the shard being filled comes after it
    assert index == {"metadata": {"total_size": 1260 * 4},
                     "weight_map": {"t00": names[0], "t01": names[1], "t02": names[3],
                                    "t03": names[3], "t04": names[3], "t05": names[3],
                                    "t06": names[2]}}
    text = (directory / INDEX).read_text()
    assert text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    _assert_loads(directory, arrays)
    from safetensors import safe_open
    for name in names:
        with safe_open(str(directory / name), framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}


def test_one_shard_has_the_same_layout(tmp_path):
    tensors, arrays = _tensors([10, 20])
    etptr.save_safetensors(tensors, tmp_path / "one", max_shard_size="1GB")
    assert _listing(tmp_path / "one") == ["model-00001-of-00001.safetensors", INDEX]
    _assert_loads(tmp_path / "one", arrays)


def test_every_dtype_and_device_tensors_sharded(tmp_path, host_alloc, write_path):
    rng = np.random.default_rng(3)
    arrays = {f"{code}.{i}": random_array(code, shape, rng)
              for code in DTYPES for i, shape in enumerate([(3, 5), (), (0, 2), (70,)])}
    tensors = {}
    for k, a in arrays.items():
        t = etptr.make_tensor_ptr(list(a.shape), np.array(a), type=DTYPES[code_of(a.dtype)][0])
        tensors[k] = etptr.clone_tensor_ptr_to(t, "cuda:0") if len(tensors) % 2 else t
    etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=256)
    assert len(_index(tmp_path / "d")["weight_map"]) == len(arrays)
    assert len(_listing(tmp_path / "d")) > 5
    _assert_loads(tmp_path / "d", arrays)


def test_large_tensors_span_chunks_and_shards_are_written_in_parallel(tmp_path, host_alloc,
                                                                      monkeypatch, write_path):
    # 1 MiB chunks (staging of 3 MiB): each 2.5 MiB tensor spans three chunks
    monkeypatch.setattr(_pipeline, "CHUNK_BYTES", 1 << 20)
    import threading
    import time
    lock, busy, most = threading.Lock(), set(), [0]
    real = _pipeline._Run._write

    def spy(self, k, sources):
        with lock:
            busy.add(k)
            most[0] = max(most[0], len(busy))
        time.sleep(0.02)                    # long enough for the other writers to start
        try:
            return real(self, k, sources)
        finally:
            with lock:
                busy.discard(k)

    monkeypatch.setattr(_pipeline._Run, "_write", spy)
    monkeypatch.setattr(_pipeline, "writer_count", lambda files: min(files, 3))
    rng = np.random.default_rng(1)
    arrays = {f"w{i}": rng.integers(0, 2**31, (5 << 20) // 8, dtype=np.int32) for i in range(4)}
    tensors = {k: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:0") if i % 2
               else etptr.make_tensor_ptr(a) for i, (k, a) in enumerate(arrays.items())}
    etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=3 << 20,
                           staging_bytes=3 << 20)
    assert most[0] >= 2                     # files written at the same time
    _assert_loads(tmp_path / "d", arrays)


def test_the_directory_is_made_and_a_previous_checkpoint_replaced(tmp_path):
    directory = tmp_path / "a" / "b"
    tensors, arrays = _tensors([100] * 6)
    etptr.save_safetensors(tensors, directory, max_shard_size=800)
    assert len(_listing(directory)) == 4
    (directory / "config.json").write_text("{}")
    (directory / "model-00009-of-00009.bin").write_text("not ours")
    # fewer, larger shards: the stale shards go, the other files stay
    tensors2, arrays2 = _tensors([100] * 5, seed=9)
    etptr.save_safetensors(tensors2, directory, max_shard_size=1200)
    assert _listing(directory) == ["config.json", "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors",
                                   "model-00009-of-00009.bin", INDEX]
    _assert_loads(directory, arrays2)


def test_an_empty_dict_cannot_be_sharded(tmp_path):
    with pytest.raises(CheckpointError, match="no tensor to shard"):
        etptr.save_safetensors({}, tmp_path / "d", max_shard_size=10)
    assert _listing(tmp_path) == []


# ------------------------------------------------------------------ checks before writing

def test_a_sharded_save_to_a_file_name_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="one.safetensors: max_shard_size= writes a "
                                              "directory .*give the directory's path"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "one.safetensors",
                               max_shard_size=10)
    assert _listing(tmp_path) == []


def test_path_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is not a directory"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "f", max_shard_size=10)
    with pytest.raises(CheckpointError, match="cannot be created"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "f" / "d", max_shard_size=10)
    assert _listing(tmp_path) == ["f"]


def test_a_shard_name_taken_by_a_directory(tmp_path):
    directory = tmp_path / "d"
    (directory / "model-00002-of-00002.safetensors").mkdir(parents=True)
    tensors, _ = _tensors([100, 100])
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: exists and "
                                              "is not a regular file"):
        etptr.save_safetensors(tensors, directory, max_shard_size=400)
    (directory / "model-00002-of-00002.safetensors").rmdir()
    (directory / INDEX).mkdir()
    with pytest.raises(CheckpointError, match="index.json: exists and is not a regular file"):
        etptr.save_safetensors(tensors, directory, max_shard_size=400)
    assert _listing(directory) == [INDEX]


@pytest.mark.parametrize("sharded", [False, True])
def test_an_unwritable_directory(tmp_path, monkeypatch, sharded):
    # (as root every directory is writable: the check is made to say no)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p).startswith(
        str(tmp_path)) and mode & os.W_OK else real(p, mode, **kw))
    target = tmp_path / "d" if sharded else tmp_path / "x.safetensors"
    if sharded:
        target.mkdir()
    with pytest.raises(CheckpointError, match="is not writable"):
        etptr.save_safetensors({"a": etptr.ones([2])}, target,
                               max_shard_size=10 if sharded else None)
    assert _listing(tmp_path) == (["d"] if sharded else [])


def test_the_single_file_target_is_a_directory(tmp_path):
    (tmp_path / "x.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        etptr.save_safetensors({"a": etptr.ones([2])}, tmp_path / "x.safetensors")


class _Statvfs:
    def __init__(self, real, free):
        self.f_bavail, self.f_frsize = free, 1
        self.real = real


@pytest.mark.parametrize("sharded", [False, True])
def test_too_little_free_space_writes_nothing(tmp_path, monkeypatch, sharded):
    tensors, _ = _tensors([1000] * 4)
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: _Statvfs(real(p), 5000))
    target = tmp_path / "new" / "dir" if sharded else tmp_path / "x.safetensors"
    with pytest.raises(CheckpointError) as info:
        etptr.save_safetensors(tensors, target, max_shard_size=4000 if sharded else None)
    text = str(info.value)
    directory = str(target if sharded else tmp_path)
    assert text.startswith(directory + ": the checkpoint needs ")
    assert "bytes (15.9 KiB) and the file system has 5000 bytes (4.9 KiB) free; nothing was " \
           "written" in text or sharded
    assert _listing(tmp_path) == []          # the directories made for it are gone too


def test_room_is_checked_against_the_file_size_limit(tmp_path):
    script = textwrap.dedent(f"""
        import resource, sys
        import numpy as np
        import etptr
        from etptr.checkpoint import CheckpointError
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        big = {{"w": etptr.make_tensor_ptr(np.ones(1 << 19, np.float32))}}   # 2 MiB
        try:
            etptr.save_safetensors(big, {str(tmp_path / "x.safetensors")!r})
        except CheckpointError as exc:
            print("refused:", exc)
        etptr.save_safetensors(big, {str(tmp_path / "d")!r}, max_shard_size="512KiB") \\
            if False else None
        parts = {{f"w{{i}}": etptr.make_tensor_ptr(np.ones(1 << 17, np.float32))
                 for i in range(4)}}                                        # 4 x 512 KiB
        etptr.save_safetensors(parts, {str(tmp_path / "d")!r}, max_shard_size="600KiB")
        print("sharded ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ETPTR_PARENT, env=child_env(PYTHONWARNINGS="error"))
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "RLIMIT_FSIZE" in out.stdout
    assert "sharded ok" in out.stdout
    assert _listing(tmp_path) == ["d"]
    assert len(_listing(tmp_path / "d")) == 5


# ------------------------------------------------------------------ faults part way

def _fd_path(fd):
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def previous(tmp_path):
    """A complete sharded checkpoint already in the directory (its arrays)."""
    tensors, arrays = _tensors([300] * 6, seed=5)
    etptr.save_safetensors(tensors, tmp_path / "ckpt", max_shard_size=2400)
    return arrays


@pytest.mark.parametrize("how", ["disk full", "device copy", "rename"])
def test_a_failure_in_the_middle_of_a_sharded_save(tmp_path, monkeypatch, write_path, how,
                                                   previous):
    directory = tmp_path / "ckpt"
    before = {n: (directory / n).read_bytes() for n in _listing(directory)}
    tensors, _ = _tensors([300] * 6, seed=6)
    if how == "disk full":
        # the second shard's space runs out: its reservation, or a write part way
        name = "posix_fallocate" if write_path == "map" else "pwrite"
        real = getattr(os, name)

        def full(fd, *args):
            if "model-00002" in _fd_path(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, *args)

        monkeypatch.setattr(os, name, full)
        expected = (CheckpointError, r"model-00002-of-00003.safetensors: cannot be written "
                                     r"\(No space left on device\)")
    elif how == "device copy":
        class Flaky(etptr.testing.HostDeviceAllocator):
            calls = 0

            def copy_device_to_host(self, dst, src, nbytes, index):
                Flaky.calls += 1
                if Flaky.calls == 2:
                    raise etptr.MemoryAllocationError("the device went away")
                super().copy_device_to_host(dst, src, nbytes, index)

        alloc = Flaky()
        monkeypatch.setattr(_pipeline, "CHUNK_BYTES", 1 << 20)
        ctx = etptr.testing.use_allocator(alloc)
        ctx.__enter__()
        tensors = {k: etptr.clone_tensor_ptr_to(t, "cuda:0") for k, t in tensors.items()}
        expected = (etptr.MemoryAllocationError, "went away")
    else:
        real = os.replace

        def no_rename(src, dst):
            if "model-00003" in str(dst):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(src, dst)

        monkeypatch.setattr(os, "replace", no_rename)
        expected = (CheckpointError, r"model-00003-of-00003.safetensors: cannot be written")
    try:
        with pytest.raises(expected[0], match=expected[1]):
            etptr.save_safetensors(tensors, directory, max_shard_size=2400)
    finally:
        if how == "device copy":
            ctx.__exit__(None, None, None)
    after = _listing(directory)
    assert not [n for n in after if n.startswith(".")]              # no temporary file
    if how == "rename":
        # shards 1 and 2 replaced their namesakes, so the previous index went first:
        # no index names a shard of another save; none names a missing one
        assert INDEX not in after
        assert after == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    else:
        assert {n: (directory / n).read_bytes() for n in after} == before
        _assert_loads(directory, previous)


def test_a_full_file_system_part_way(tmp_path):
    """A real full file system: a 1 MiB tmpfs mounted in a private mount namespace, the
    room check skipped (as if another writer took the space after it)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        import etptr
        from etptr.checkpoint import CheckpointError, _sinks
        from etptr.checkpoint import _save
        _save.check_room = lambda directory, sizes: None
        mnt = {str(mnt)!r}
        arrays = {{f"w{{i}}": np.full(1 << 16, i, np.float32) for i in range(6)}}   # 6 x 256 KiB
        tensors = {{k: etptr.make_tensor_ptr(a) for k, a in arrays.items()}}
        for path in ("map", "pwrite"):
            _sinks.WRITE_PATH = path
            for kw in ({{}}, {{"max_shard_size": 600 << 10}}):
                target = os.path.join(mnt, "d" if kw else "x.safetensors")
                try:
                    etptr.save_safetensors(tensors, target, **kw)
                    print("saved?!")
                except CheckpointError as exc:
                    print("error:", exc)
                print("left:", sorted(os.listdir(mnt)))
    """)
    cmd = ["unshare", "-rm", "sh", "-c",
           f"mount -t tmpfs -o size=1m tmpfs {mnt} && exec {sys.executable} -c \"$0\"", script]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         cwd=ETPTR_PARENT, env=child_env())
    if out.returncode != 0 and ("mount" in out.stderr or "unshare" in out.stderr):
        pytest.skip(f"no private tmpfs here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 4, out.stdout
    for line in errors:
        assert "No space left on device" in line or "File too large" in line, line
        assert ".safetensors: cannot be written" in line, line
    # nothing left: no temporary file, and the directory the sharded save made is gone
    assert [line for line in lines if line.startswith("left:")] == ["left: []"] * 4, out.stdout


def test_durable_syncs_every_file_and_the_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(_fd_path(fd))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    tensors, arrays = _tensors([300] * 3)
    etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=1200, durable=True)
    shards = [p for p in synced if ".tmp" in p]
    assert len(shards) == 3                    # each shard before its rename
    assert str(tmp_path / "d") in synced       # and the directory's entries
    _assert_loads(tmp_path / "d", arrays)
    synced.clear()
    etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=1200)
    assert synced == []


# ------------------------------------------------------------------ saves into one directory

def test_commits_into_one_directory_take_turns(tmp_path):
    d = tmp_path / "d"
    old = {f"t{i}": np.full(1000, i, np.float32) for i in range(6)}
    new = {k: v + 100 for k, v in old.items()}
    etptr.save_safetensors(old, d, max_shard_size=8000)
    before = {n: (d / n).read_bytes() for n in _listing(d)}
    real = lambda: {n: (d / n).read_bytes() for n in _listing(d) if not n.startswith(".")}
    lock = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)               # another save's commit under way
        saver = threading.Thread(target=etptr.save_safetensors, args=(new, d),
                                 kwargs={"max_shard_size": 12000})
        saver.start()
        saver.join(0.5)
        assert saver.is_alive()                        # waits for the directory
        assert real() == before                        # its shards wait under temporary names
    finally:
        os.close(lock)
    saver.join(60)
    assert not saver.is_alive()
    _assert_loads(d, new)


def test_a_process_forked_during_a_commit_does_not_keep_the_directory_locked(tmp_path,
                                                                            monkeypatch):
    d = tmp_path / "d"
    tensors = {f"t{i}": np.full(100, i, np.float32) for i in range(4)}
    real = _shards._commit_locked
    children = []

    def forking(*args):
        pid = os.fork()                  # a DataLoader worker, say, forked mid-commit
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
        return real(*args)

    monkeypatch.setattr(_shards, "_commit_locked", forking)
    try:
        etptr.save_safetensors(tensors, d, max_shard_size=800)
        monkeypatch.setattr(_shards, "_commit_locked", real)
        etptr.save_safetensors(tensors, d, max_shard_size=400)   # does not wait for it
        assert os.waitpid(children[0], os.WNOHANG) == (0, 0)    # the child lives on
    finally:
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    _assert_loads(d, tensors)


def test_a_load_of_the_index_waits_for_a_commit_under_way(tmp_path):
    d = tmp_path / "d"
    tensors = {f"t{i}": np.full(100, i, np.float32) for i in range(4)}
    etptr.save_safetensors(tensors, d, max_shard_size=800)
    got = []
    lock = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)               # a save's commit under way
        loader = threading.Thread(target=lambda: got.append(
            etptr.load_safetensors(d / INDEX, "cpu", framework="np")))
        loader.start()
        loader.join(0.5)
        assert loader.is_alive() and not got           # reads no index meanwhile
    finally:
        os.close(lock)
    loader.join(60)
    assert sorted(got[0]) == sorted(tensors)


def test_loads_beside_saves_never_mix_two_checkpoints(tmp_path):
    d = tmp_path / "d"
    versions = [{f"t{i}": np.full(100, v, np.float32) for i in range(4)} for v in range(3)]
    etptr.save_safetensors(versions[0], d, max_shard_size=800)

    def save(deadline):
        k = 0
        while time.monotonic() < deadline:
            k += 1
            etptr.save_safetensors(versions[k % 3], d, max_shard_size=800)

    seen = set()

    def load(deadline):
        while time.monotonic() < deadline:
            try:
                back = etptr.load_safetensors(d / INDEX, "cpu", framework="np")
            except CheckpointError:
                continue                     # a shard replaced after the plan: refused
            values = {float(a[0]) for a in back.values()}
            assert len(values) == 1, values   # one save's tensors, never a mix
            seen.update(values)

    assert run_threads([save, load], seconds=1.0) == []
    assert seen


def test_concurrent_sharded_saves_leave_one_complete_checkpoint(tmp_path):
    d = tmp_path / "d"
    tensors = {f"t{i}": np.full(1000, i, np.float32) for i in range(12)}
    for _ in range(5):
        errors = run_threads([lambda _deadline, sz=sz: etptr.save_safetensors(
                                  tensors, d, max_shard_size=sz)
                              for sz in (4000, 8000, 16000, 48000)], seconds=0.2)
        assert errors == []
        _assert_loads(d, tensors)
        index = _index(d)
        assert sorted(n for n in _listing(d) if n.startswith("model-")) == \
            sorted(set(index["weight_map"].values()))


# ------------------------------------------------------------------ transformers

def test_a_transformers_model_loads_the_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_bert(transformers, torch, seed=0)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        tensors = {k: etptr.make_tensor_ptr(v.numpy()) for k, v in state.items()}
        directory = tmp_path / "bert"
        etptr.save_safetensors(tensors, directory, max_shard_size="20KB",
                               metadata={"format": "pt"})
        model.config.save_pretrained(directory)
        assert len(_index(directory)["weight_map"]) == len(state)
        assert len([n for n in _listing(directory) if n.startswith("model-")]) > 2
        loaded = transformers.BertModel.from_pretrained(directory)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, state[k]), k
