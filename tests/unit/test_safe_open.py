"""etptr.safe_open against the safetensors library's safe_open on the same files: keys,
metadata, shapes, dtypes, get_tensor and get_slice with every index form the library
takes (the cases of its Python tests: leading and inner slices, ints, '...', steps), the
batched get_slices, the frameworks, and the refusals. Where the library fails (slice
bounds past the end, negative slice bounds) etptr follows NumPy, as its docstring says."""
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import etptr
from etptr.checkpoint import CheckpointError
from etptr.testing import HostDeviceAllocator, use_allocator

ARRAYS = {
    "test": np.arange(6, dtype=np.float32).reshape(1, 2, 3),
    "w_2d": np.arange(8 * 16, dtype=np.float32).reshape(8, 16),
    "w_3d": np.arange(4 * 6 * 8, dtype=np.int64).reshape(4, 6, 8),
    "w_bf16": np.arange(8 * 16, dtype=np.float32).reshape(8, 16).astype(ml_dtypes.bfloat16),
    "flag": np.array([True, False, True]),
    "scalar": np.array(7, dtype=np.int16),
    "empty": np.zeros((0, 4), dtype=np.float16),
}

# indices the library takes, as its own tests use them
INDICES = [
    ("test", (slice(None), slice(None), slice(1, 2))), ("test", (0,)), ("test", (..., 1)),
    ("test", (0, slice(None), 2)), ("test", ()), ("test", (slice(0, 1),)),
    ("w_2d", (slice(2, 5),)), ("w_2d", (slice(None), slice(4, 12))), ("w_2d", (3, 5)),
    ("w_2d", (-1,)), ("w_2d", (slice(None, None, 2),)), ("w_2d", (slice(1, 7, 3), slice(2, 9, 2))),
    ("w_2d", (Ellipsis, slice(0, 16))), ("w_2d", (slice(0, 8), slice(0, 16))),
    ("w_3d", (slice(None), slice(1, 4))), ("w_3d", (1, slice(None), slice(3, 5))),
    ("w_3d", (Ellipsis, 2)), ("w_3d", (slice(1, 3), Ellipsis, slice(0, 8, 3))),
    ("w_bf16", (slice(1, 3),)), ("w_bf16", (slice(None), slice(5, 9))),
    ("flag", (slice(1, None),)), ("scalar", ()),
]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("so") / "m.safetensors"
    safetensors.numpy.save_file(ARRAYS, str(p), metadata={"format": "np", "k": "v"})
    return p


def _bytes(a):
    return np.ascontiguousarray(a).tobytes()


def test_keys_metadata_shapes_and_dtypes_match_the_library(path):
    with safetensors.safe_open(str(path), framework="np") as ref, \
            etptr.safe_open(path, framework="np") as f:
        assert f.keys() == list(ref.keys())
        assert f.metadata() == ref.metadata() == {"format": "np", "k": "v"}
        assert sorted(f.offset_keys()) == sorted(ref.keys())
        for name in ref.keys():
            assert f.get_slice(name).get_shape() == list(ref.get_slice(name).get_shape())
            assert f.get_slice(name).get_dtype() == ref.get_slice(name).get_dtype()


@pytest.mark.parametrize("name, index", INDICES, ids=[f"{n}{i}" for n, i in INDICES])
def test_slices_match_the_library_and_numpy(path, name, index):
    want = ARRAYS[name][index]
    got = etptr.safe_open(path, framework="np").get_slice(name)[index]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert _bytes(got) == _bytes(want)
    if ARRAYS[name].dtype != ml_dtypes.bfloat16:        # the library's numpy has no bf16
        with safetensors.safe_open(str(path), framework="np") as ref:
            assert _bytes(ref.get_slice(name)[index]) == _bytes(got)


def test_get_tensor_matches_the_library_and_is_a_read_only_view(path):
    with safetensors.safe_open(str(path), framework="np") as ref, \
            etptr.safe_open(path, framework="np") as f:
        for name in ARRAYS:
            got = f.get_tensor(name)
            assert _bytes(got) == _bytes(ARRAYS[name]) and got.shape == ARRAYS[name].shape
            if ARRAYS[name].dtype != ml_dtypes.bfloat16:
                assert _bytes(ref.get_tensor(name)) == _bytes(got)
            if got.nbytes:
                assert not got.flags.writeable      # a view of the file's private map


@pytest.mark.parametrize("index", [(slice(5, None),), (slice(None), slice(-3, None)),
                                   (slice(-20, 2),), (slice(3, 1),), (slice(2, 2),),
                                   (slice(None, None, 10**30),),
                                   (slice(None), slice(None, None, 2**62)),
                                   (slice(1, 7, 2**63), slice(0, 9, 10**20))])
def test_where_the_library_fails_slices_follow_numpy(path, index):
    want = ARRAYS["w_2d"][index]
    got = etptr.safe_open(path, framework="np").get_slice("w_2d")[index]
    assert got.shape == want.shape and _bytes(got) == _bytes(want)


def test_frameworks(path):
    torch = pytest.importorskip("torch")
    for fw, kind in (("etptr", etptr.TensorPtr), ("np", np.ndarray), ("pt", torch.Tensor),
                     ("numpy", np.ndarray), ("torch", torch.Tensor), ("pytorch", torch.Tensor)):
        with etptr.safe_open(path, framework=fw) as f:
            assert isinstance(f.get_tensor("w_2d"), kind)
            assert isinstance(f.get_slice("w_2d")[1:2], kind)
    t = etptr.safe_open(path, framework="pt").get_slice("w_bf16")[1:3]
    assert t.dtype == torch.bfloat16 and t.shape == (2, 16)
    assert _bytes(t.view(torch.int16).numpy()) == _bytes(ARRAYS["w_bf16"][1:3])
    with pytest.raises(CheckpointError, match="framework='cupy' gives device arrays"):
        etptr.safe_open(path, framework="cupy").get_tensor("w_2d")
    with pytest.raises(CheckpointError, match="framework='flax'.*also 'torch', 'pytorch'"):
        etptr.safe_open(path, framework="flax")


def test_a_batch_of_slices_comes_back_in_order(path):
    reqs = [("w_3d", (slice(None), slice(0, 3))), ("test", ...), ("w_2d", (slice(None), 7)),
            ("w_3d", (1,))]
    got = etptr.safe_open(path, framework="np").get_slices(reqs)
    for (name, index), g in zip(reqs, got):
        assert _bytes(g) == _bytes(ARRAYS[name][index])


@pytest.mark.parametrize("name, index, match", [
    ("w_2d", (8,), "tensor 'w_2d': dim 0: index 8 is out of range for size 8"),
    ("w_2d", (slice(None, None, -1),), "tensor 'w_2d': dim 0: step -1"),
    ("w_2d", (0, 0, 0), "tensor 'w_2d': 3 indices for a tensor of 2 dims"),
    ("w_2d", (None,), "tensor 'w_2d': dim 0: index None is not supported"),
    ("w_2d", ([0, 1],), "tensor 'w_2d': dim 0: index .0, 1. is not supported"),
    ("w_2d", (..., ...), "one '...' only"),
    ("w_2d", (slice("a", None),), "slice .* is not made of ints"),
    ("missing", (), "no tensor named 'missing'"),
])
def test_bad_slices_are_refused_naming_the_tensor(path, name, index, match):
    with etptr.safe_open(path) as f:
        with pytest.raises(CheckpointError, match=match):
            f.get_slices([(name, index)])


def test_a_closed_handle_is_refused_and_its_tensors_live_on(path):
    with etptr.safe_open(path, framework="np") as f:
        kept = f.get_tensor("w_2d")
        s = f.get_slice("w_2d")
    assert _bytes(kept) == _bytes(ARRAYS["w_2d"])
    with pytest.raises(CheckpointError, match="closed"):
        f.get_tensor("w_2d")
    with pytest.raises(CheckpointError, match="closed"):
        s[0]


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        etptr.safe_open(tmp_path / "nope.safetensors")
    assert isinstance(info.value, CheckpointError)
    assert info.value.filename == str(tmp_path / "nope.safetensors")


class _Counting(HostDeviceAllocator):
    """Counts the file uploads and the bytes they move."""

    def __init__(self):
        super().__init__()
        self.uploads = []

    def copy_file_to_device(self, dst, fd, pieces, index, **kw):
        pieces = list(pieces)
        self.uploads.append(sum(n for _, _, n in pieces))
        return super().copy_file_to_device(dst, fd, pieces, index, **kw)


def test_device_slices_read_only_their_bytes_in_one_copy_per_file(path, monkeypatch):
    from etptr.checkpoint import _slices
    monkeypatch.setattr(_slices, "GATHER_STRIDE", 0)          # every run read by itself
    alloc = _Counting()
    with use_allocator(alloc):
        with etptr.safe_open(path, device="cuda") as f:
            reqs = [(n, (slice(None), slice(0, 2))) for n in ("w_2d", "w_bf16", "w_3d")]
            got = f.get_slices(reqs)
            whole = f.get_tensor("w_3d")
        for (name, index), g in zip(reqs, got):
            assert g.device == etptr.Device("cuda:0")
            host = etptr.clone_tensor_ptr_to_cpu(g).numpy()
            assert _bytes(host) == _bytes(ARRAYS[name][index])
        assert alloc.uploads == [8 * 2 * 4 + 8 * 2 * 2 + 4 * 2 * 8 * 8, ARRAYS["w_3d"].nbytes]
        del got, whole, g
    assert alloc.live_bytes == 0


def test_cpu_slices_read_only_their_bytes(path, monkeypatch):
    from etptr.checkpoint import _safe_open, _slices
    monkeypatch.setattr(_slices, "GATHER_STRIDE", 0)
    read = []
    real = _safe_open.parallel_read

    def counting(fd, segments, *args, **kwargs):
        segments = list(segments)
        read.append(sum(n for _, _, n in segments))
        return real(fd, segments, *args, **kwargs)

    monkeypatch.setattr(_safe_open, "parallel_read", counting)
    got = etptr.safe_open(path, framework="np").get_slice("w_2d")[:, 3:5]
    assert read == [8 * 2 * 4] and _bytes(got) == _bytes(ARRAYS["w_2d"][:, 3:5])
    assert got.flags.writeable                   # memory of its own


def _counting_reads(monkeypatch):
    from etptr.checkpoint import _safe_open
    read = []
    real = _safe_open.parallel_read

    def counting(fd, segments, *args, **kwargs):
        segments = list(segments)
        read.append([n for _, _, n in segments])
        return real(fd, segments, *args, **kwargs)

    monkeypatch.setattr(_safe_open, "parallel_read", counting)
    return read


GATHERED = [("w_2d", (slice(None), slice(3, 5))), ("w_2d", (slice(1, 7, 3), slice(2, 9, 2))),
            ("w_3d", (slice(None), slice(1, 4), slice(2, 6))), ("w_3d", (Ellipsis, 2)),
            ("w_bf16", (slice(None), slice(5, 9))), ("test", (0, slice(None), 2))]


@pytest.mark.parametrize("name, index", GATHERED, ids=[f"{n}{i}" for n, i in GATHERED])
def test_runs_close_together_are_read_as_their_span_once(path, monkeypatch, name, index):
    read = _counting_reads(monkeypatch)
    want = ARRAYS[name][index]
    got = etptr.safe_open(path, framework="np").get_slice(name)[index]
    assert got.shape == want.shape and _bytes(got) == _bytes(want)
    runs = etptr.checkpoint._slices.slice_runs(index, ARRAYS[name].shape,
                                               ARRAYS[name].itemsize, name)
    assert runs.gathered and read == [[runs.span]]


@pytest.mark.parametrize("span", [1, 64, 200, 1 << 20])
def test_a_gathered_slice_read_in_spans_of_any_size(path, monkeypatch, span):
    from etptr.checkpoint import _safe_open
    monkeypatch.setattr(_safe_open, "_GATHER_SPAN", span)
    read = _counting_reads(monkeypatch)
    for name, index in GATHERED:
        got = etptr.safe_open(path, framework="np").get_slice(name)[index]
        assert _bytes(got) == _bytes(ARRAYS[name][index]), (name, index)
    assert all(sum(r) <= max(span, 16 * 6 * 8) for r in read)   # one outer step at least


def test_dims_of_one_index_do_not_hold_the_spans_back(tmp_path, monkeypatch):
    # an outer dim of size 1 (or indexed by an int) is no dim to cut spans along: the
    # spans stay under the bound along the next one
    from etptr.checkpoint import _safe_open
    monkeypatch.setattr(_safe_open, "_GATHER_SPAN", 4096)
    arr = np.arange(1 * 300 * 64, dtype=np.uint8).reshape(1, 300, 64)
    p = tmp_path / "t.safetensors"
    etptr.save_safetensors({"t": arr}, p)
    read = _counting_reads(monkeypatch)
    for index in ((0, slice(None), slice(0, 1)), (slice(None), slice(None), slice(0, 1))):
        got = etptr.safe_open(p, framework="np").get_slice("t")[index]
        assert _bytes(got) == _bytes(arr[index]), index
    assert read and all(sum(r) <= 4096 for r in read), read


def test_gathered_slices_on_a_device_go_up_in_one_batch(path, monkeypatch):
    calls = []
    real = etptr.checkpoint._safe_open.h2d_copy
    monkeypatch.setattr(etptr.checkpoint._safe_open, "h2d_copy",
                        lambda srcs, outs: (calls.append(len(srcs)), real(srcs, outs)))
    alloc = _Counting()
    with use_allocator(alloc):
        with etptr.safe_open(path, device="cuda") as f:
            reqs = GATHERED + [("w_2d", (slice(2, 5),))]
            got = f.get_slices(reqs)
        for (name, index), g in zip(reqs, got):
            assert _bytes(etptr.clone_tensor_ptr_to_cpu(g).numpy()) == _bytes(ARRAYS[name][index])
        assert calls == [len(GATHERED)] and alloc.uploads == [3 * 16 * 4]
        del got, g
    assert alloc.live_bytes == 0


def test_a_file_cut_under_a_gathered_read_is_refused(tmp_path):
    p = tmp_path / "cut.safetensors"
    etptr.save_safetensors({"w": etptr.make_tensor_ptr(np.ones((64, 64), np.float32))}, p)
    f = etptr.safe_open(p)
    with open(p, "r+b") as fh:                    # cut inside the tensor, times kept
        st = os.stat(p)
        fh.truncate(st.st_size - 1000)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        f.get_slice("w")[:, 0:8]
    f.close()


def test_metadata_survives_a_load_save_round_trip(path, tmp_path):
    out = tmp_path / "again.safetensors"
    with etptr.safe_open(path) as f:
        etptr.save_safetensors({k: f.get_tensor(k) for k in f.keys()}, out,
                               metadata=f.metadata())
    with safetensors.safe_open(str(out), framework="np") as ref:
        assert ref.metadata() == {"format": "np", "k": "v"}


def test_a_file_changed_since_open_is_refused(tmp_path):
    p = tmp_path / "c.safetensors"
    etptr.save_safetensors({"w": etptr.full([64], 1.0)}, p)
    f = etptr.safe_open(p)
    os.utime(p, ns=(10**18, 10**18))               # rewritten, as far as its times say
    with pytest.raises(CheckpointError, match="the file changed"):
        f.get_slice("w")[0:4]
