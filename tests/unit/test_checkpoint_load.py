"""load_safetensors: zero-copy CPU views, pinned copies, device loads, subsets, progress."""
import gc
import io
import json
import mmap
import os
import textwrap

import numpy as np
import pytest

import etptr
from etptr import Device, DeviceType, ScalarType
from etptr.checkpoint import CheckpointError, CheckpointPlan, FilePlan
from etptr.testing import HostDeviceAllocator, use_allocator

from _checkpoint_helpers import (
    DTYPES, NUMPY_DTYPES, entry, open_fds, random_array, raw_bytes, reference_serialize, write_raw)
from _helpers import run_isolated

SHAPES = [(2, 3), (), (0, 4), (5,), (1, 1, 3)]


class PinnedHostAllocator(HostDeviceAllocator):
    """A host-simulated CUDA allocator whose allocate_host gives 256-byte aligned blocks."""

    def __init__(self):
        super().__init__(DeviceType.CUDA)
        self.host_blocks = []

    def allocate_host(self, nbytes, index):
        raw = np.empty(nbytes + 256, np.uint8)
        start = -raw.ctypes.data % 256
        block = raw[start:start + nbytes]
        self.host_blocks.append(nbytes)
        return block


def _reference_file(tmp_path, code, seed=0, name="m.safetensors", metadata=None):
    rng = np.random.default_rng(seed)
    arrays = {f"{code}.{i}": random_array(code, shape, rng) for i, shape in enumerate(SHAPES)}
    path = tmp_path / name
    path.write_bytes(reference_serialize(arrays, metadata))
    return path, arrays


def _host_bytes(t):
    if not t.device.is_cpu():
        t = etptr.clone_tensor_ptr_to_cpu(t)
    return raw_bytes(t.numpy()) if t.nbytes else b""


def _same(t, arr, st):
    assert t.sizes == arr.shape
    assert t.scalar_type == st
    assert t.dim_order == tuple(range(arr.ndim))
    assert _host_bytes(t) == raw_bytes(arr)


@pytest.fixture
def count_maps(monkeypatch):
    """How many mmaps the loader makes."""
    calls = []
    real = mmap.mmap

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", counting)
    return calls


# ------------------------------------------------------------------ device="cpu"

@pytest.mark.parametrize("code", list(DTYPES))
def test_cpu_load_of_a_reference_file(tmp_path, code):
    path, arrays = _reference_file(tmp_path, code)
    out = etptr.load_safetensors(path, "cpu")
    assert set(out) == set(arrays)
    for name, arr in arrays.items():
        _same(out[name], arr, DTYPES[code][0])
        assert out[name].readonly and out[name].device == Device("cpu")


@pytest.mark.parametrize("code", NUMPY_DTYPES)
def test_cpu_load_matches_safetensors_numpy(tmp_path, code):
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(1)
    arrays = {f"t{i}": random_array(code, s, rng) for i, s in enumerate(SHAPES)}
    path = tmp_path / "n.safetensors"
    save_file(arrays, str(path))
    ref = load_file(str(path))
    out = etptr.load_safetensors(str(path), device="cpu")
    for name in arrays:
        assert out[name].sizes == ref[name].shape
        assert etptr.scalar_type_to_numpy(out[name].scalar_type) == ref[name].dtype
        assert _host_bytes(out[name]) == raw_bytes(ref[name])


def test_cpu_views_alias_the_file_pages(tmp_path):
    header = {"a": entry("U8", [4], 0, 4), "b": entry("I32", [2], 4, 12)}
    path = write_raw(tmp_path / "z.safetensors", header, bytes(range(12)))
    out = etptr.load_safetensors(path, "cpu")
    a, b = out["a"], out["b"]
    assert b.data_ptr - a.data_ptr == 4
    assert not a.numpy().flags.writeable
    with pytest.raises(ValueError):
        a.numpy()[0] = 1
    # the views read the page cache: a write to the file shows through
    data_offset = etptr.checkpoint.parse_header(path).data_offset
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff", data_offset + 1)
    finally:
        os.close(fd)
    assert a.numpy()[1] == 255


def test_views_keep_the_map_alive(tmp_path):
    path, arrays = _reference_file(tmp_path, "F32")
    out = etptr.load_safetensors(path, "cpu")
    keep = out["F32.0"]
    del out
    gc.collect()
    os.unlink(path)
    assert _host_bytes(keep) == raw_bytes(arrays["F32.0"])


def test_one_map_per_file_and_no_fd_left(tmp_path, count_maps):
    paths = [_reference_file(tmp_path, c, name=f"{c}.safetensors")[0] for c in ("F16", "I64")]
    empty = write_raw(tmp_path / "empty.safetensors", {"z": entry("F32", [0], 0, 0)})
    before = open_fds()
    out = etptr.load_safetensors(paths + [empty], "cpu")
    assert len(count_maps) == 2                    # the file without data is not mapped
    assert out["z"].sizes == (0,) and out["z"].numel() == 0
    del out
    gc.collect()
    assert open_fds() == before


def test_empty_checkpoint(tmp_path, count_maps):
    assert etptr.load_safetensors(write_raw(tmp_path / "e.safetensors", {}), "cpu") == {}
    assert count_maps == []


def test_sharded_index_load(tmp_path):
    p1, a1 = _reference_file(tmp_path, "BF16", 1, "model-00001-of-00002.safetensors")
    p2, a2 = _reference_file(tmp_path, "U16", 2, "model-00002-of-00002.safetensors")
    wm = {n: p1.name for n in a1} | {n: p2.name for n in a2}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    out = etptr.load_safetensors(index, "cpu")
    assert list(out) == list(etptr.checkpoint.read_plan(index).names)
    for name, arr in (a1 | a2).items():
        _same(out[name], arr, etptr.scalar_type_from_numpy(arr.dtype))


def test_names_subset(tmp_path, count_maps):
    path, arrays = _reference_file(tmp_path, "F64")
    out = etptr.load_safetensors(path, "cpu", names=["F64.3", "F64.0"])
    assert sorted(out) == ["F64.0", "F64.3"]
    _same(out["F64.3"], arrays["F64.3"], ScalarType.Double)
    assert etptr.load_safetensors(path, "cpu", names=[]) == {}
    assert len(count_maps) == 1                    # the empty subset maps nothing


def test_names_subset_unknown_name(tmp_path):
    path, _ = _reference_file(tmp_path, "F64")
    with pytest.raises(CheckpointError) as info:
        etptr.load_safetensors(path, "cpu", names=["F64.9"])
    msg = str(info.value)
    assert "no tensor named 'F64.9'" in msg and "close names: 'F64." in msg and str(path) in msg


def test_file_that_changes_after_its_header_was_read(tmp_path, monkeypatch):
    path, _ = _reference_file(tmp_path, "U8")
    real = etptr.checkpoint._load.read_plan

    def read_then_grow(paths):
        plan = real(paths)
        with open(path, "ab") as f:
            f.write(b"\0")
        return plan

    monkeypatch.setattr(etptr.checkpoint._load, "read_plan", read_then_grow)
    with pytest.raises(CheckpointError, match="the file changed"):
        etptr.load_safetensors(path, "cpu")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 3.5, None])
def test_bad_device(tmp_path, device):
    path, _ = _reference_file(tmp_path, "U8")
    with pytest.raises(CheckpointError, match="device"):
        etptr.load_safetensors(path, device)


# ------------------------------------------------------------------ pinned=True

def test_pinned_needs_a_cuda_allocator(tmp_path, count_maps):
    if etptr.get_device_allocator("cuda") is not None:
        pytest.skip("a CUDA allocator is registered")
    path, _ = _reference_file(tmp_path, "F32")
    with pytest.raises(etptr.NotFoundError, match="pinned=True"):
        etptr.load_safetensors(path, "cpu", pinned=True)
    with pytest.raises(etptr.NotFoundError, match="pinned=True"):
        etptr.load_safetensors(path, "cpu", pinned=True, names=[])
    assert count_maps == []


@pytest.mark.parametrize("code", ["BF16", "BOOL", "F8_E5M2", "I64"])
def test_pinned_copies(tmp_path, code):
    path, arrays = _reference_file(tmp_path, code)
    other, more = _reference_file(tmp_path, "U8", 3, "other.safetensors")
    with use_allocator(PinnedHostAllocator()) as alloc:
        out = etptr.load_safetensors([path, other], "cpu", pinned=True)
    assert len(alloc.host_blocks) == 2                      # one block per file
    mapped = etptr.load_safetensors(path, "cpu")
    for name, arr in (arrays | more).items():
        t = out[name]
        _same(t, arr, etptr.scalar_type_from_numpy(arr.dtype))
        assert not t.readonly and t.data_ptr % 256 == 0
    for name in arrays:
        if arrays[name].size:
            assert out[name].data_ptr != mapped[name].data_ptr
    # copies: writing one changes neither the file nor the mapped view
    t = out[f"{code}.0"]
    t.numpy().reshape(-1).view(np.uint8)[0] ^= 0xFF
    assert _host_bytes(mapped[f"{code}.0"]) == raw_bytes(arrays[f"{code}.0"])


def test_pinned_copies_outlive_the_dict(tmp_path):
    path, arrays = _reference_file(tmp_path, "F16")
    with use_allocator(PinnedHostAllocator()):
        keep = etptr.load_safetensors(path, "cpu", pinned=True)["F16.4"]
    gc.collect()
    os.unlink(path)
    assert _host_bytes(keep) == raw_bytes(arrays["F16.4"])


def test_pinned_with_a_device_is_refused(tmp_path):
    path, _ = _reference_file(tmp_path, "U8")
    with pytest.raises(CheckpointError, match="pinned=True gives page-locked CPU copies"):
        etptr.load_safetensors(path, "cuda:0", pinned=True)
    with pytest.raises(CheckpointError, match="pinned='yes' is not a bool"):
        etptr.load_safetensors(path, "cpu", pinned="yes")


# ------------------------------------------------------------------ devices

@pytest.mark.parametrize("code", list(DTYPES))
def test_device_load_through_host_allocator(tmp_path, host_alloc, code):
    path, arrays = _reference_file(tmp_path, code)
    out = etptr.load_safetensors(path, "cuda")
    for name, arr in arrays.items():
        assert out[name].device == Device("cuda:0")
        _same(out[name], arr, DTYPES[code][0])
    # one buffer for the file: the tensors' bytes, each at a 256-byte multiple
    plan = etptr.checkpoint.read_plan(path)
    assert host_alloc.allocate_count == 1
    assert host_alloc.live_bytes == etptr.checkpoint.layout_file(plan.files[0]).nbytes
    assert all(t.data_ptr % 256 == 0 for t in out.values())
    del out
    gc.collect()
    assert host_alloc.live_bytes == 0


def test_device_load_default_device_and_subset(tmp_path, host_alloc):
    path, arrays = _reference_file(tmp_path, "I32")
    out = etptr.load_safetensors(path, names=["I32.0"])
    assert list(out) == ["I32.0"] and out["I32.0"].device == Device(DeviceType.CUDA, 0)
    _same(out["I32.0"], arrays["I32.0"], ScalarType.Int)


def test_device_load_failure_frees_everything(tmp_path):
    # two files: the second file's buffer cannot be allocated; the first one's goes back
    first, _ = _reference_file(tmp_path, "F32", name="a.safetensors")
    second, _ = _reference_file(tmp_path, "I16", name="b.safetensors")
    alloc = HostDeviceAllocator()
    alloc.fail_after = 1
    with use_allocator(alloc):
        with pytest.raises(etptr.MemoryAllocationError):
            etptr.load_safetensors([first, second], "cuda:0")
        gc.collect()
        assert alloc.live_bytes == 0 and alloc.allocate_count == 1


def test_device_load_without_an_allocator(tmp_path):
    if etptr.get_device_allocator("cuda") is not None:
        pytest.skip("a CUDA allocator is registered")
    path, _ = _reference_file(tmp_path, "F32")
    with pytest.raises(etptr.NotFoundError):
        etptr.load_safetensors(path, "cuda:0")


def test_device_loads_go_through_the_seam(tmp_path, monkeypatch):
    path, _ = _reference_file(tmp_path, "U8")
    seen = []

    def fake(sources, device, progress, read):
        seen.append((sources, device, progress))
        assert read == "auto"
        return {"sentinel": None}

    monkeypatch.setattr(etptr.checkpoint._load, "_load_to_device", fake)
    report = []
    assert etptr.load_safetensors(path, "cuda:1", progress=lambda d, t: report.append(d)) \
        == {"sentinel": None}
    (sources, device, progress), = seen
    assert len(sources) == 1 and sources[0].path == path
    # an index, or several files, go as their checked plans
    assert etptr.load_safetensors([path], "cuda:1") == {"sentinel": None}
    assert [type(f) for f in seen[1][0]] == [FilePlan] and seen[1][0][0].path == path
    assert device == Device("cuda:1") and callable(progress)
    assert etptr.load_safetensors(path, "cuda:1", progress=False) == {"sentinel": None}
    assert seen[2][2] is None


# ------------------------------------------------------------------ progress

def _progress_file(tmp_path):
    header = {"a": entry("U8", [300], 0, 300), "e": entry("F32", [0], 300, 300),
              "b": entry("I16", [50], 300, 400)}
    return write_raw(tmp_path / "p.safetensors", header, bytes(400))


@pytest.mark.parametrize("how", ["cpu", "pinned", "device"])
def test_progress_callback(tmp_path, how):
    path = _progress_file(tmp_path)
    calls = []
    kwargs = {"progress": lambda done, total: calls.append((done, total))}
    with use_allocator(PinnedHostAllocator()):
        if how == "cpu":
            etptr.load_safetensors(path, "cpu", **kwargs)
        elif how == "pinned":
            etptr.load_safetensors(path, "cpu", pinned=True, **kwargs)
        else:
            etptr.load_safetensors(path, "cuda:0", **kwargs)
    assert calls and calls[-1] == (400, 400)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and all(t == 400 for _, t in calls)


def test_progress_of_an_empty_load(tmp_path):
    calls = []
    etptr.load_safetensors(_progress_file(tmp_path), "cpu", names=[],
                           progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 0)]


def test_progress_default_is_quiet_off_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(etptr.checkpoint._progress, "BAR_MIN_BYTES", 0)
    etptr.load_safetensors(_progress_file(tmp_path), "cpu")
    assert capsys.readouterr().err == ""


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_default_draws_a_bar_on_a_terminal(tmp_path, monkeypatch):
    pytest.importorskip("tqdm")
    fake = _Terminal()
    monkeypatch.setattr("sys.stderr", fake)
    etptr.load_safetensors(_progress_file(tmp_path), "cpu")
    assert fake.getvalue() == ""                   # 400 bytes: under the threshold
    monkeypatch.setattr(etptr.checkpoint._progress, "BAR_MIN_BYTES", 100)
    etptr.load_safetensors(_progress_file(tmp_path), "cpu")
    assert "loading to cpu" in fake.getvalue()


def test_progress_true_and_false(tmp_path, capsys):
    pytest.importorskip("tqdm")
    etptr.load_safetensors(_progress_file(tmp_path), "cpu", progress=True)
    assert "loading to cpu" in capsys.readouterr().err
    etptr.load_safetensors(_progress_file(tmp_path), "cpu", progress=False)
    assert capsys.readouterr().err == ""


def test_progress_true_without_tqdm(tmp_path, monkeypatch):
    monkeypatch.setattr(etptr.checkpoint._progress, "_have_tqdm", lambda: False)
    with pytest.raises(CheckpointError, match="tqdm is not installed"):
        etptr.load_safetensors(_progress_file(tmp_path), "cpu", progress=True)


@pytest.mark.parametrize("progress", ["yes", 3, [print]])
def test_bad_progress(tmp_path, progress):
    with pytest.raises(CheckpointError, match="progress="):
        etptr.load_safetensors(_progress_file(tmp_path), "cpu", progress=progress)


def test_a_path_that_becomes_a_fifo_is_refused_not_waited_on(tmp_path):
    # the second file turns into a FIFO after the headers were read: opening it must
    # not block (a FIFO with no writer would wait forever)
    from _helpers import run_isolated
    first, _ = _reference_file(tmp_path, "F32", name="a.safetensors")
    second, _ = _reference_file(tmp_path, "I8", seed=1, name="b.safetensors")
    out = run_isolated(f"""
        import os, etptr
        from etptr.checkpoint import CheckpointError
        second = {str(second)!r}
        def progress(done, total):
            if done and not os.path.exists(second + ".done"):
                open(second + ".done", "w").close()
                os.unlink(second)
                os.mkfifo(second)
        try:
            etptr.load_safetensors([{str(first)!r}, second], "cpu", progress=progress)
        except CheckpointError as exc:
            print("refused:", exc)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "not a regular file" in out.stdout


# ------------------------------------------------------------------ writes through read-only views

_WRITE_IGNORING_THE_FLAG = """
    import ctypes, os, sys
    import numpy as np
    import etptr
    sys.path.insert(0, {tests!r})
    from _dlpack_ctypes import DLManagedTensorVersioned

    path = {path!r}
    before = open(path, "rb").read()
    out = etptr.load_safetensors(path, "cpu")
    t = out["a"]
    assert t.readonly
    {write}
    assert open(path, "rb").read() == before, "the file changed"
    print("OK", out["b"].numpy().tolist())
"""

_MINIMAL_CONSUMER = """
    # a DLPack consumer that ignores DLPACK_FLAG_BITMASK_READ_ONLY: it writes through the
    # pointer, then renames the capsule and runs the deleter, as consumers do
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    cap = t.__dlpack__(max_version=(1, 0))
    ptr = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    managed = DLManagedTensorVersioned.from_address(ptr)
    assert managed.flags & 1                            # DLPACK_FLAG_BITMASK_READ_ONLY
    ctypes.memset(managed.dl_tensor.data + managed.dl_tensor.byte_offset, 0x7F, t.nbytes)
    api.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    managed.deleter(ptr)
    assert (t.numpy().view(np.uint8) == 0x7F).all()   # the view sees its own write
"""


@pytest.mark.parametrize("consumer", ["minimal", "torch"])
def test_a_consumer_ignoring_read_only_cannot_crash_or_change_the_file(tmp_path, consumer):
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({"a": etptr.full([1024], 1.5), "b": etptr.full([3], 2.0)}, path)
    if consumer == "torch":
        pytest.importorskip("torch")
        write = "import torch; torch.from_dlpack(t).add_(1)"
    else:
        write = _MINIMAL_CONSUMER
    write = textwrap.dedent(write).strip("\n").replace("\n", "\n    ")
    code = _WRITE_IGNORING_THE_FLAG.format(tests=os.path.dirname(os.path.dirname(__file__)), path=str(path),
                                          write=write)
    proc = run_isolated(code, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split() == ["OK", "[2.0,", "2.0,", "2.0]"]    # its neighbour intact
    back = etptr.load_safetensors(path, "cpu")
    assert back["a"].numpy().tolist() == [1.5] * 1024


# ------------------------------------------------------------------ files rewritten in place

def _aged_file(tmp_path, nbytes):
    """A checkpoint of one U8 tensor whose modification time lies in the past, so that a
    rewrite now changes it whatever the file system's timestamp granularity."""
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({"w": etptr.make_tensor_ptr(np.full(nbytes, 1, np.uint8))}, path)
    os.utime(path, ns=(10**18, 10**18))
    return path, etptr.checkpoint.parse_header(path).data_offset


def _rewrite(path, offset, nbytes):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([2]) * nbytes, offset)     # in place: same size, same inode
    finally:
        os.close(fd)


def test_a_file_rewritten_during_a_device_load_is_refused(tmp_path):
    n = (64 << 20) + 4096                  # two groups of the generic upload
    path, offset = _aged_file(tmp_path, n)

    class Rewriting(HostDeviceAllocator):
        def copy_host_to_device(self, dst, src, nbytes, index, **kw):
            _rewrite(path, offset, n)      # after the first group was read
            return super().copy_host_to_device(dst, src, nbytes, index, **kw)

    alloc = Rewriting()
    with use_allocator(alloc):
        with pytest.raises(CheckpointError, match="was written to while it was read"):
            etptr.load_safetensors(path, "cuda", progress=False)
        assert alloc.live_bytes == 0


def test_a_file_rewritten_during_a_pinned_load_is_refused(tmp_path, monkeypatch):
    n = 1 << 20
    path, offset = _aged_file(tmp_path, n)
    real = etptr.checkpoint._load.parallel_read

    def rewrite_then_read(*args, **kwargs):
        _rewrite(path, offset, n // 2)     # half the data new: the read mixes both
        return real(*args, **kwargs)

    monkeypatch.setattr(etptr.checkpoint._load, "parallel_read", rewrite_then_read)
    with use_allocator(PinnedHostAllocator()):
        with pytest.raises(CheckpointError, match="was written to while it was read"):
            etptr.load_safetensors(path, "cpu", pinned=True)
