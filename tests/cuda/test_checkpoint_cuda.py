"""load_safetensors onto CUDA: the file is read straight into pinned slots
(CudaAllocator.copy_file_to_device), never mapped; bit-exact for every dtype; a file
that shrinks while it is read gives a CheckpointError and leaves nothing allocated."""
import mmap
import os

import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST
from etptr.checkpoint import CheckpointError
from etptr.checkpoint import _load as ckpt_load
from etptr.checkpoint._layout import layout_file
from etptr.cuda import _copy_engine, _tuning, copy_config

from _checkpoint_helpers import (
    DTYPES, open_fds, random_array, raw_bytes, reference_serialize, write_raw)

SMALL = dict(threads=4, slot_bytes=64 * 1024, slots=3, small_copy_bytes=4096)
SHAPES = [(2, 3), (), (0, 4), (5,), (1, 1, 3), (300, 77)]


def _file(tmp_path, codes, seed=0, name="m.safetensors"):
    rng = np.random.default_rng(seed)
    arrays = {f"{c}.{i}": random_array(c, s, rng) for c in codes for i, s in enumerate(SHAPES)}
    path = tmp_path / name
    path.write_bytes(reference_serialize(arrays))
    return path, arrays


def _host_bytes(t):
    return raw_bytes(etptr.clone_tensor_ptr_to_cpu(t).numpy()) if t.nbytes else b""


@pytest.fixture
def no_maps(monkeypatch):
    """Fails the test if the loader maps a file."""
    def refuse(*args, **kwargs):
        raise AssertionError("the CUDA load mapped the file")
    monkeypatch.setattr(mmap, "mmap", refuse)


@pytest.fixture
def hook():
    yield
    _tuning.tune(chunk_hook=None)


@pytest.fixture(params=["straight", "bounced"])
def file_fills(request):
    """Uploads from a file fill their slots by reading straight into them, or through
    the copy threads' bounce buffers (the default for files up to 128 MiB)."""
    with _tuning.tuned(nt_file_max=0 if request.param == "straight" else 1 << 62):
        yield request.param


@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_every_dtype_bit_exact_without_a_map(tmp_path, settings, no_maps, device_used,
                                             file_fills):
    path, arrays = _file(tmp_path, list(DTYPES))
    before = device_used()
    fds = open_fds()
    with copy_config(**settings):
        out = etptr.load_safetensors(path, "cuda:0", progress=False)
    assert open_fds() == fds
    assert sorted(out) == sorted(arrays)
    for name, arr in arrays.items():
        t = out[name]
        assert t.device == etptr.Device("cuda:0")
        assert t.sizes == arr.shape and t.scalar_type == DTYPES[name.split(".")[0]][0]
        assert t.nbytes == 0 or t.data_ptr % 256 == 0
        assert _host_bytes(t) == raw_bytes(arr), name
    del out, t
    assert device_used() == before


def test_progress_comes_from_inside_one_copy_per_file(tmp_path, no_maps):
    # 4 KiB slots: many chunks in one pipelined copy, reported as they go
    path, arrays = _file(tmp_path, ["F32", "I8", "F64"], seed=3)
    seen = []
    with copy_config(**dict(SMALL, slot_bytes=4096)), _tuning.tuned(trace=True):
        out = etptr.load_safetensors(path, "cuda:0", progress=lambda d, t: seen.append((d, t)))
    begins = [n for what, n, _ in _tuning.take_trace() if what == "begin"]
    total = sum(a.nbytes for a in arrays.values())
    assert len(begins) == 1                           # the file's upload is not cut
    assert len(seen) > 2 and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)   # never backwards
    assert all(d <= total for d, _ in seen)
    for name, arr in arrays.items():
        assert _host_bytes(out[name]) == raw_bytes(arr), name


def test_subset_reads_only_its_tensors(tmp_path, no_maps):
    path, arrays = _file(tmp_path, ["I32", "U16"], seed=5)
    want = ["U16.5", "I32.0"]
    out = etptr.load_safetensors(path, "cuda:0", names=want, progress=False)
    assert sorted(out) == sorted(want)
    for name in want:
        assert _host_bytes(out[name]) == raw_bytes(arrays[name])


def _refused_mid_load(path, change, match):
    """Load ``path`` in 4 KiB slots with ``change(direction, chunk)`` run after each
    chunk: the load must raise CheckpointError matching ``match``."""
    _tuning.tune(chunk_hook=change)
    with copy_config(**dict(SMALL, slot_bytes=4096)):
        with pytest.raises(CheckpointError, match=match):
            etptr.load_safetensors(path, "cuda:0", progress=False)
    _tuning.tune(chunk_hook=None)


def test_a_file_truncated_while_read(tmp_path, hook, device_used, pool):
    # the file loses its tail after the first slot went up: a CheckpointError naming the
    # file, no device memory kept, the pinned slots back, no descriptor left open
    path, _ = _file(tmp_path, ["F64"], seed=7)
    size = path.stat().st_size
    before = device_used()
    fds = open_fds()

    def shrink(direction, i):
        if i == 0:
            os.truncate(path, size // 2)

    _refused_mid_load(path, shrink, "m.safetensors.*changed while loading")
    assert open_fds() == fds
    assert device_used() == before
    assert pool.stats()["in_use_bytes"] == 0


def test_a_file_written_in_place_while_read(tmp_path, hook, device_used):
    # the same size, new bytes, after the first slot went up: the reads mix two files,
    # so the load is refused
    path, _ = _file(tmp_path, ["F64"], seed=8)
    size = path.stat().st_size
    before = device_used()

    def rewrite(direction, i):
        if i == 0:
            with open(path, "r+b") as f:
                f.seek(size - 16)
                f.write(b"\x01" * 16)

    _refused_mid_load(path, rewrite, "changed while loading")
    assert device_used() == before


@pytest.mark.parametrize("dst", [None, 1.5, "0"])
def test_copy_file_to_device_refuses_a_dst_that_is_not_an_address(tmp_path, alloc, dst):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(64))
    with open(path, "rb") as f:
        with pytest.raises(etptr.InvalidTypeError, match="dst"):
            alloc.copy_file_to_device(dst, f.fileno(), [(0, 0, 8)], 0)


def test_a_file_replaced_before_the_read(tmp_path, monkeypatch):
    path, _ = _file(tmp_path, ["F32"], seed=9)
    plan = etptr.checkpoint.read_plan(path)
    other, _ = _file(tmp_path, ["F32"], seed=10, name="other.safetensors")
    os.replace(other, path)                       # same size, another file
    with pytest.raises(CheckpointError, match="another file"):
        ckpt_load._load_to_device(list(plan.files), etptr.Device("cuda:0"), None)


# ------------------------------------------------------------------ uploads that overlap the header

def _aligned_file(tmp_path, name="a.safetensors"):
    """A file whose tensors all start at multiples of 256 bytes: its own layout is the
    device layout, so it goes up while its header is checked."""
    rng = np.random.default_rng(3)
    arrays = {"w": rng.standard_normal((8, 32)).astype(np.float32),
              "b": rng.standard_normal(64).astype(np.float32),
              "e": np.zeros((0, 3), np.float32),
              "i": rng.integers(0, 9, (4, 16), dtype=np.int64)}
    path = tmp_path / name
    path.write_bytes(reference_serialize(arrays))
    return path, arrays


def _check_loaded(out, arrays):
    assert sorted(out) == sorted(arrays)
    for name, arr in arrays.items():
        assert out[name].sizes == arr.shape
        assert _host_bytes(out[name]) == raw_bytes(arr)
        assert out[name].data_ptr % 256 == 0 or out[name].nbytes == 0


def test_an_aligned_file_goes_up_before_its_header_is_checked(tmp_path, monkeypatch,
                                                              device_used, no_maps):
    path, arrays = _aligned_file(tmp_path)
    before = device_used()
    calls = []
    real = ckpt_load.plan_from_header
    monkeypatch.setattr(ckpt_load, "plan_from_header",
                        lambda *a: calls.append("header checked") or real(*a))
    with _tuning.tuned(chunk_hook=lambda direction, i: calls.append(f"{direction} chunk {i}")):
        out = etptr.load_safetensors(path, "cuda:0", progress=lambda d, t: calls.append((d, t)))
    data_size = sum(a.nbytes for a in arrays.values())
    # the data went up first (reported from inside the copy), then the header was checked,
    # once; the whole was reported once
    assert calls == ["h2d chunk 0", (data_size, data_size), "header checked"]
    _check_loaded(out, arrays)
    del out
    assert device_used() == before


def test_a_file_with_another_layout_goes_up_once(tmp_path, fake, device_used):
    # its header's offsets show that tensors move to 256-byte multiples: no overlap
    path, arrays = _file(tmp_path, ["F32", "I8"])
    before = device_used()
    out = etptr.load_safetensors(path, "cuda:0", progress=False)
    up = sum(c.nbytes for c in fake.copies("htod"))
    layout = layout_file(etptr.checkpoint.parse_header(path))
    assert len(layout.runs) > 1
    assert up == layout.nbytes                    # the device range once, gaps and all
    _check_loaded(out, arrays)
    del out
    assert device_used() == before


def test_a_file_whose_hint_is_wrong_is_loaded_from_the_header_already_checked(
        tmp_path, monkeypatch, device_used):
    # "data\u005foffsets" is data_offsets to JSON but not to the hint, which sees only
    # a's aligned offsets: the upload starts, and the layout then shows b at byte 4
    path = tmp_path / "escaped.safetensors"
    header = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
              b'"b":{"dtype":"F32","shape":[64],"data\\u005foffsets":[4,260]}}')
    data = np.arange(65, dtype=np.float32)
    write_raw(path, header, data.tobytes(), pad=False)
    before = device_used()
    reads = []
    real = ckpt_load.plan_from_header
    monkeypatch.setattr(ckpt_load, "plan_from_header", lambda *a: reads.append(1) or real(*a))
    monkeypatch.setattr("etptr.checkpoint._load.read_plan",
                        lambda *a: pytest.fail("the header was read twice"))
    uploads = []
    load = ckpt_load._file_to_device
    monkeypatch.setattr(ckpt_load, "_file_to_device",
                        lambda source, *a: uploads.append(type(source).__name__) or
                        load(source, *a))
    progress = []
    out = etptr.load_safetensors(path, "cuda:0", progress=lambda d, t: progress.append((d, t)))
    # up early, then up again in its own layout, from the plan already checked
    assert reads == [1] and uploads == ["_Unchecked", "FilePlan"]
    assert progress == [(260, 260)]
    _check_loaded(out, {"a": data[:1], "b": data[1:]})
    del out
    assert device_used() == before


@pytest.mark.parametrize("header, match", [
    (b'{"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}', "JSON"),
    (b'{"w": {"dtype": "F32", "shape": [65], "data_offsets": [0, 256]}}', "shape"),
    (b'{"w": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}}', "belong to no"),
])
def test_a_malformed_header_is_refused_once_the_copy_is_done(tmp_path, header, match,
                                                             device_used, pool):
    path = tmp_path / "bad.safetensors"
    write_raw(path, header, bytes(256), pad=False)
    with pytest.raises(CheckpointError, match=match) as want:
        etptr.checkpoint.parse_header(path)
    before = device_used()
    fds = open_fds()
    with pytest.raises(CheckpointError, match=match) as got:
        etptr.load_safetensors(path, "cuda:0", progress=False)
    assert str(got.value) == str(want.value)
    del got
    assert device_used() == before
    assert open_fds() == fds
    assert pool.stats()["in_use_bytes"] == 0


def test_a_malformed_header_comes_before_a_device_error(tmp_path, fake, no_kernel, pool):
    # the upload starts before the header is checked: a full device or a failing copy
    # must not hide the header's error
    path = tmp_path / "bad.safetensors"
    write_raw(path, b'{"w":{"dtype":"F32","shape":[9],"data_offsets":[0,4096]}}',
              bytes(4096), pad=False)
    with pytest.raises(CheckpointError, match="needs 36 bytes") as want:
        etptr.checkpoint.parse_header(path)
    fds = open_fds()
    # the fake's 1 GiB (no_kernel: no scratch area holds any of it)
    hog = etptr.empty([(1 << 30) - 2048], type=ST.Byte, device="cuda:0")
    with pytest.raises(CheckpointError) as got:
        etptr.load_safetensors(path, "cuda:0", progress=False)
    assert str(got.value) == str(want.value)
    del hog
    fake.fail_copies_after = 0
    try:
        with pytest.raises(CheckpointError) as got:
            etptr.load_safetensors(path, "cuda:0", progress=False)
    finally:
        fake.fail_copies_after = None
    assert str(got.value) == str(want.value)
    with pytest.raises(CheckpointError) as got:
        etptr.load_safetensors(path, "cuda:7", progress=False)
    assert str(got.value) == str(want.value)
    assert open_fds() == fds
    assert pool.stats()["in_use_bytes"] == 0


def test_a_malformed_header_comes_before_a_change_of_the_file(tmp_path, monkeypatch):
    # the file shrinks between reading its header and opening it for the data
    path = tmp_path / "bad.safetensors"
    write_raw(path, b'{"w":{"dtype":"F32","shape":[9],"data_offsets":[0,4096]}}',
              bytes(4096), pad=False)
    with pytest.raises(CheckpointError, match="needs 36 bytes") as want:
        etptr.checkpoint.parse_header(path)
    real = ckpt_load.open_checked

    def shrink_then_open(plan):
        os.truncate(path, 100)
        return real(plan)

    monkeypatch.setattr(ckpt_load, "open_checked", shrink_then_open)
    fds = open_fds()
    with pytest.raises(CheckpointError) as got:
        etptr.load_safetensors(path, "cuda:0", progress=False)
    assert str(got.value) == str(want.value)
    assert open_fds() == fds


@pytest.mark.parametrize("how", ["names", "large", "list"])
def test_the_usual_load_where_the_overlap_does_not_apply(tmp_path, monkeypatch, how):
    path, arrays = _aligned_file(tmp_path)
    uploads = []
    real = ckpt_load._file_to_device
    monkeypatch.setattr(ckpt_load, "_file_to_device",
                        lambda source, *a: uploads.append(type(source).__name__) or
                        real(source, *a))
    if how == "large":
        monkeypatch.setattr(ckpt_load, "EARLY_UPLOAD_MAX", 255)
    names = ["w", "b"] if how == "names" else None
    out = etptr.load_safetensors([path] if how == "list" else path, "cuda:0", names=names,
                                 progress=False)
    assert uploads == ["FilePlan"]                    # the header was checked first
    _check_loaded(out, {k: v for k, v in arrays.items() if names is None or k in names})


def test_a_path_like_is_asked_for_its_path_once(tmp_path):
    path, arrays = _aligned_file(tmp_path)
    asked = []

    class Once:
        def __fspath__(self):
            asked.append(1)
            return str(path) if len(asked) == 1 else str(tmp_path / "other.safetensors")

    _check_loaded(etptr.load_safetensors(Once(), "cuda:0", progress=False), arrays)
    assert asked == [1]


# ------------------------------------------------------------------ copy_file_to_device

def test_copy_file_to_device_pieces_and_gaps(tmp_path, alloc, file_fills):
    data = np.arange(1 << 16, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    dev = etptr.zeros([1 << 16], type=ST.Byte, device="cuda:0")
    pieces = [(100, 0, 5000), (9000, 8192, 0), (30000, 8192, 20000), (0, 60000, 16)]
    fd = os.open(path, os.O_RDONLY)
    try:
        with copy_config(**SMALL):
            alloc.copy_file_to_device(dev.data_ptr, fd, pieces, 0)
    finally:
        os.close(fd)
    got = etptr.clone_tensor_ptr_to_cpu(dev).numpy()
    for off, at, n in pieces:                     # (the gaps between pieces: unspecified)
        np.testing.assert_array_equal(got[at:at + n], data[off:off + n])
    assert not got[60016:].any()                  # past the last piece: untouched


def _raw_file(tmp_path, n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    return path, data


def test_copy_file_to_device_calls_on_queued_once_after_every_read(tmp_path, alloc, hook):
    n = 1 << 20
    path, data = _raw_file(tmp_path, n)
    dev = etptr.zeros([n], type=ST.Byte, device="cuda:0")
    events = []
    _tuning.tune(chunk_hook=lambda direction, i: events.append(i))
    fd = os.open(path, os.O_RDONLY)
    try:
        with copy_config(**SMALL):
            alloc.copy_file_to_device(dev.data_ptr, fd, [(0, 0, n)], 0,
                                      on_queued=lambda: events.append("queued"))
    finally:
        os.close(fd)
    assert events == list(range(n // SMALL["slot_bytes"])) + ["queued"]
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to_cpu(dev).numpy(), data)


def test_copy_file_to_device_on_queued_without_pieces_is_called(tmp_path, alloc):
    path, _ = _raw_file(tmp_path, 16)
    called = []
    fd = os.open(path, os.O_RDONLY)
    try:
        alloc.copy_file_to_device(0, fd, [], 0, on_queued=lambda: called.append(1))
    finally:
        os.close(fd)
    assert called == [1]


def test_copy_file_to_device_on_queued_raising_still_completes_the_copy(tmp_path, alloc, fake):
    n = 1 << 20
    path, data = _raw_file(tmp_path, n)
    dev = etptr.zeros([n], type=ST.Byte, device="cuda:0")
    fake.clear()

    def fail():
        fake.mark()                                      # "on_queued", among the calls
        raise KeyError("from on_queued")

    fd = os.open(path, os.O_RDONLY)
    try:
        with copy_config(**SMALL), pytest.raises(KeyError, match="from on_queued"):
            alloc.copy_file_to_device(dev.data_ptr, fd, [(0, 0, n)], 0, on_queued=fail)
    finally:
        os.close(fd)
    names = [c.what for c in fake.calls]
    at = names.index("mark")
    assert "htod" not in names[at:]                      # every DMA was queued before it
    assert "stream_sync" in names[at:]                   # and waited for after it
    np.testing.assert_array_equal(etptr.clone_tensor_ptr_to_cpu(dev).numpy(), data)


def test_copy_file_to_device_reports_progress_from_inside(tmp_path, alloc, pool):
    n = 1 << 20
    path, data = _raw_file(tmp_path, n)
    dev = etptr.zeros([n + 4096], type=ST.Byte, device="cuda:0")
    seen = []
    pieces = [(0, 0, n // 2), (n // 2, n // 2 + 4096, n // 2)]      # a gap on the device
    fd = os.open(path, os.O_RDONLY)
    try:
        with copy_config(**SMALL):
            alloc.copy_file_to_device(dev.data_ptr, fd, pieces, 0, progress=seen.append)
            stop = KeyError("from progress")

            def fail(done):
                raise stop
            with pytest.raises(KeyError, match="from progress"):
                alloc.copy_file_to_device(dev.data_ptr, fd, pieces, 0, progress=fail)
    finally:
        os.close(fd)
    assert len(seen) > 2 and seen == sorted(seen) and seen[-1] <= n   # the pieces' bytes
    assert pool.stats()["in_use_bytes"] == 0
    got = etptr.clone_tensor_ptr_to_cpu(dev).numpy()
    np.testing.assert_array_equal(got[:n // 2], data[:n // 2])
    np.testing.assert_array_equal(got[n // 2 + 4096:], data[n // 2:])


@pytest.mark.parametrize("kw", [dict(on_queued=5), dict(on_queued=print, stream=0)],
                         ids=["not-callable", "with-a-stream"])
def test_copy_file_to_device_refuses_a_bad_on_queued(tmp_path, alloc, kw):
    path, _ = _raw_file(tmp_path, 4096)
    dev = etptr.zeros([4096], type=ST.Byte, device="cuda:0")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(etptr.InvalidArgumentError, match=r"on_queued \(a "):
            alloc.copy_file_to_device(dev.data_ptr, fd, [(0, 0, 4096)], 0, **kw)
    finally:
        os.close(fd)
    assert not etptr.clone_tensor_ptr_to_cpu(dev).numpy().any()   # nothing moved


@pytest.mark.parametrize("pieces, match", [
    ([(0, 0, -1)], r"pieces\[0\].nbytes"),
    ([(-5, 0, 4)], r"pieces\[0\].file_offset"),
    ([(0, 100, 8), (0, 104, 8)], r"pieces\[1\].dst_offset=104: overlaps"),
    ([(0, 0)], r"pieces\[0\]=\(0, 0\): expected"),
    ([5], r"pieces\[0\]=5: expected"),
    # past the end of the allocation holding dst: the driver knows the allocation, not the
    # tensor, and a memory pool may have cut the tensor from a large one
    ([(0, 0, 1 << 40)], r"past the end|dst"),
])
def test_copy_file_to_device_refuses_bad_pieces(tmp_path, alloc, pieces, match):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(4096))
    dev = etptr.zeros([4096], type=ST.Byte, device="cuda:0")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(etptr.InvalidArgumentError, match=match):
            alloc.copy_file_to_device(dev.data_ptr, fd, pieces, 0)
    finally:
        os.close(fd)


def test_copy_file_to_device_read_errors(tmp_path, alloc, pool):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(1000))
    dev = etptr.zeros([1 << 14], type=ST.Byte, device="cuda:0")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(EOFError, match="file ended"):
            alloc.copy_file_to_device(dev.data_ptr, fd, [(0, 0, 8192)], 0)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as info:                   # no such descriptor
        alloc.copy_file_to_device(dev.data_ptr, 1 << 29, [(0, 0, 8192)], 0)
    assert info.value.errno == 9
    assert pool.stats()["in_use_bytes"] == 0


# ------------------------------------------------------------------ into= and slices on the device

def test_a_load_into_existing_device_tensors_writes_only_them(tmp_path, alloc, device_used):
    path, arrays = _file(tmp_path, ["F32", "I8", "F64"], seed=21)
    targets = {k: etptr.empty(list(a.shape), type=a.dtype, device="cuda:0")
               for k, a in arrays.items()}
    # a neighbour in each target's allocation must keep its bytes: only the pieces move
    guards = {k: etptr.full([64], 7, type=ST.Byte, device="cuda:0") for k in arrays}
    before = device_used()
    got = etptr.load_safetensors(path, into=targets)
    assert got == etptr.checkpoint.IncompatibleKeys([], [])
    assert device_used() == before                        # no device memory taken
    for k, a in arrays.items():
        assert _host_bytes(targets[k]) == raw_bytes(a), k
        assert etptr.clone_tensor_ptr_to_cpu(guards[k]).numpy().tolist() == [7] * 64


@pytest.mark.parametrize("gather_stride", [0, 8 * 1024], ids=["runs", "gathered"])
def test_device_slices_of_a_checkpoint(tmp_path, alloc, pool, monkeypatch, gather_stride):
    # each run read into the pinned slots, or runs close together read as their span,
    # gathered on the host and taken up in one batched upload
    from etptr.checkpoint import _slices
    monkeypatch.setattr(_slices, "GATHER_STRIDE", gather_stride)
    rng = np.random.default_rng(3)
    arrays = {"w": rng.standard_normal((64, 96)).astype(np.float32),
              "v": rng.integers(0, 9, (32, 40), dtype=np.int64)}
    path = tmp_path / "s.safetensors"
    path.write_bytes(reference_serialize(arrays))
    with copy_config(**SMALL):
        with etptr.safe_open(path, device="cuda:0") as f:
            reqs = [("w", (slice(None), slice(32, 64))), ("v", (slice(8, 24),)),
                    ("w", (slice(None), 5)), ("v", (slice(None), slice(1, 40, 3)))]
            got = f.get_slices(reqs)
    for (name, index), t in zip(reqs, got):
        assert t.device == etptr.Device("cuda:0") and t.data_ptr % 256 == 0
        assert _host_bytes(t) == raw_bytes(np.ascontiguousarray(arrays[name][index]))
    assert pool.stats()["in_use_bytes"] == 0


@pytest.mark.parametrize("read", ["direct", "auto", "buffered"])
def test_reads_through_the_pinned_slots_every_way(tmp_path, read, pool, device_used):
    # direct reads go through the copy threads' aligned bounce buffers into the slots
    path, arrays = _file(tmp_path, ["F32", "I8", "F64", "BF16"], seed=31)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)     # cold where the disk allows
    finally:
        os.close(fd)
    before = device_used()
    with copy_config(**SMALL):
        out = etptr.load_safetensors(path, "cuda:0", read=read, progress=False)
    for name, arr in arrays.items():
        assert _host_bytes(out[name]) == raw_bytes(arr), name
    del out
    assert device_used() == before
    assert pool.stats()["in_use_bytes"] == 0
