"""save_safetensors: bit-for-bit with the safetensors library, checks first, atomic writes."""
import errno
import gc
import json
import os
import stat

import numpy as np
import pytest

import etptr
from etptr import ScalarType
from etptr.checkpoint import CheckpointError

from _checkpoint_helpers import (
    DTYPES, NUMPY_DTYPES, code_of, random_array, raw_bytes, reference_read, reference_serialize)

SHAPES = [(3, 2), (), (0, 2), (7,), (2, 1, 3)]


def _arrays(codes, seed=0):
    rng = np.random.default_rng(seed)
    return {f"{code.lower()}_{i}": random_array(code, shape, rng)
            for code in codes for i, shape in enumerate(SHAPES)}


def _tensors(arrays):
    # zero-copy CPU tensors of the arrays
    return {k: etptr.make_tensor_ptr(list(a.shape), np.array(a, order="C", copy=True),
                                     type=DTYPES[code_of(a.dtype)][0])
            for k, a in arrays.items()}


def _header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return n, f.read(n)


def _only(directory, *names):
    """The directory holds exactly these names: no temporary file is left behind."""
    assert sorted(os.listdir(directory)) == sorted(names)


# ------------------------------------------------------------------ agreement with safetensors

def test_every_dtype_in_one_file_matches_the_library_byte_for_byte(tmp_path):
    arrays = _arrays(DTYPES)
    path = tmp_path / "all.safetensors"
    etptr.save_safetensors(_tensors(arrays), path)
    assert path.read_bytes() == reference_serialize(arrays)
    read = reference_read(path)
    for name, arr in arrays.items():
        assert read[name] == (code_of(arr.dtype), arr.shape, raw_bytes(arr))
    _only(tmp_path, "all.safetensors")


@pytest.mark.parametrize("code", list(DTYPES))
def test_round_trip_through_the_library(tmp_path, code):
    arrays = _arrays([code], seed=7)
    path = tmp_path / "one.safetensors"
    etptr.save_safetensors(_tensors(arrays), str(path), metadata={"format": "pt"})
    assert path.read_bytes() == reference_serialize(arrays, {"format": "pt"})
    for name, (dtype, shape, data) in reference_read(path).items():
        assert (dtype, shape, data) == (code, arrays[name].shape, raw_bytes(arrays[name]))
    # and back through etptr's own reader
    back = etptr.load_safetensors(path, "cpu")
    for name, arr in arrays.items():
        assert back[name].sizes == arr.shape
        assert back[name].scalar_type == DTYPES[code][0]
        assert (raw_bytes(back[name].numpy()) if arr.size else b"") == raw_bytes(arr)


@pytest.mark.parametrize("code", NUMPY_DTYPES)
def test_safetensors_numpy_reads_it_and_writes_the_same_bytes(tmp_path, code):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save

    arrays = _arrays([code], seed=3)
    path = tmp_path / "np.safetensors"
    etptr.save_safetensors(_tensors(arrays), path, metadata={"k": "v"})
    loaded = load_file(str(path))
    for name, arr in arrays.items():
        assert loaded[name].dtype == arr.dtype and loaded[name].shape == arr.shape
        assert raw_bytes(loaded[name]) == raw_bytes(arr)
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"k": "v"}
    assert path.read_bytes() == save(arrays, metadata={"k": "v"})


def test_empty_dict_and_metadata_only(tmp_path):
    etptr.save_safetensors({}, tmp_path / "e.safetensors")
    assert (tmp_path / "e.safetensors").read_bytes() == reference_serialize({})
    etptr.save_safetensors({}, tmp_path / "m.safetensors", metadata={"a": "1", "b": "é\n\""})
    n, text = _header(tmp_path / "m.safetensors")
    assert json.loads(text) == {"__metadata__": {"a": "1", "b": "é\n\""}}
    assert etptr.load_safetensors(tmp_path / "m.safetensors", "cpu") == {}


def test_order_padding_and_alignment(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"z8": random_array("U8", (3,), rng), "a64": random_array("F64", (2,), rng),
              "b16": random_array("BF16", (5,), rng), "a16": random_array("F16", (1,), rng),
              "i64": random_array("I64", (1,), rng), "u64": random_array("U64", (1,), rng),
              "c32": random_array("F32", (3,), rng), "bool": random_array("BOOL", (2,), rng)}
    path = tmp_path / "o.safetensors"
    etptr.save_safetensors(_tensors(arrays), path)
    n, text = _header(path)
    # padded with spaces (fewer than 8) to a multiple of 8
    assert n % 8 == 0 and text.rstrip(b" ").endswith(b"}")
    assert len(text) - len(text.rstrip(b" ")) < 8
    header = json.loads(text)
    # the library's order: its dtype ranking, widest first, then by name
    assert list(header) == ["u64", "i64", "a64", "c32", "b16", "a16", "z8", "bool"]
    for name, e in header.items():
        esize = etptr.element_size(DTYPES[e["dtype"]][0])
        assert (8 + n + e["data_offsets"][0]) % esize == 0


def test_unicode_and_escaped_names(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {name: random_array("F32", (2,), rng)
              for name in ["é", "权重", 'quo"te', "back\\slash", "tab\t", "\x01", "B", "a"]}
    path = tmp_path / "u.safetensors"
    etptr.save_safetensors(_tensors(arrays), path)
    assert path.read_bytes() == reference_serialize(arrays)


# ------------------------------------------------------------------ layouts and devices

def test_non_default_dim_order_is_written_row_major(tmp_path):
    data = np.arange(6, dtype=np.float32)
    t = etptr.make_tensor_ptr([2, 3], data, dim_order=[1, 0])
    assert t.strides == (1, 2)
    expected = np.ascontiguousarray(t.numpy())
    etptr.save_safetensors({"t": t}, tmp_path / "d.safetensors")
    (dtype, shape, raw), = reference_read(tmp_path / "d.safetensors").values()
    assert (dtype, shape) == ("F32", (2, 3))
    assert raw == expected.tobytes() and raw != data.tobytes()


def test_device_tensors(tmp_path, host_alloc, monkeypatch):
    arrays = _arrays(["BF16", "I16", "BOOL"], seed=11)
    on_device = {k: etptr.clone_tensor_ptr_to(t, "cuda:0") for k, t in _tensors(arrays).items()}
    transposed = etptr.clone_tensor_ptr_to(
        etptr.make_tensor_ptr([2, 3], np.arange(6, dtype=np.int64), dim_order=[1, 0]), "cuda:0")
    fetched = []
    batched = etptr.checkpoint._pipeline.d2h_copy
    alone = etptr.checkpoint._pipeline.clone_tensor_ptr_to_cpu

    def spy_batch(srcs, outs):
        # the tensors (or byte ranges of them) come down, into CPU bytes of a staging block
        assert all(isinstance(t, etptr.TensorPtr) and not t.device.is_cpu() for t in srcs)
        assert all(o.device.is_cpu() for o in outs)
        assert [(o.sizes, o.scalar_type) for o in outs] == [(t.sizes, t.scalar_type)
                                                            for t in srcs]
        fetched.extend(t.nbytes for t in srcs)
        return batched(srcs, outs)

    def spy_alone(t):
        fetched.append(t.nbytes)
        return alone(t)

    monkeypatch.setattr(etptr.checkpoint._pipeline, "d2h_copy", spy_batch)
    monkeypatch.setattr(etptr.checkpoint._pipeline, "clone_tensor_ptr_to_cpu", spy_alone)
    path = tmp_path / "dev.safetensors"
    etptr.save_safetensors(on_device | {"transposed": transposed}, path)
    expected = arrays | {"transposed": np.arange(6, dtype=np.int64).reshape(3, 2).T}
    read = reference_read(path)
    for name, arr in expected.items():
        assert read[name] == (code_of(arr.dtype), arr.shape, raw_bytes(arr))
    assert sum(fetched) == sum(a.nbytes for a in expected.values())   # each byte once


def test_zero_size_tensor_with_null_data(tmp_path):
    t = etptr.make_tensor_ptr([0, 3], None, type=ScalarType.Half)
    assert t.data_ptr == 0
    etptr.save_safetensors({"t": t}, tmp_path / "z.safetensors")
    assert reference_read(tmp_path / "z.safetensors") == {"t": ("F16", (0, 3), b"")}


def test_existing_file_is_replaced(tmp_path):
    path = tmp_path / "r.safetensors"
    path.write_bytes(b"old")
    etptr.save_safetensors({"a": etptr.ones([2])}, path)
    assert reference_read(path)["a"][2] == np.ones(2, np.float32).tobytes()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    _only(tmp_path, "r.safetensors")


# ------------------------------------------------------------------ checks before writing

_GOOD = etptr.ones([2])


@pytest.mark.parametrize("tensors, fragment", [
    ([("a", _GOOD)], "expected a dict"),
    ({3: _GOOD}, "the name 3 is not a non-empty str"),
    ({"": _GOOD}, "the name '' is not a non-empty str"),
    ({"__metadata__": _GOOD}, "'__metadata__' is reserved"),
    ({"bad\udc80": _GOOD}, "cannot be encoded as UTF-8"),
    ({"ok": _GOOD, "arr": [1.0, 2.0]}, "tensor 'arr': expected an etptr.TensorPtr, a NumPy "
                                       "array or a tensor speaking DLPack"),
    ({"ok": _GOOD, "strided": np.ones(8)[::2]}, "tensor 'strided' (numpy.ndarray) cannot be "
                                               "read in place"),
    ({"c": etptr.make_tensor_ptr([1], bytes(8), type=ScalarType.ComplexFloat)},
     "tensor 'c': ScalarType.ComplexFloat has no safetensors dtype"),
    ({"q": etptr.make_tensor_ptr([1], bytes(1), type=ScalarType.QInt8)},
     "tensor 'q': ScalarType.QInt8"),
    ({"n": etptr.make_tensor_ptr([2], None, type=ScalarType.Float)},
     "tensor 'n': sizes (2,) span 8 bytes but its data is null"),
])
def test_bad_tensors(tmp_path, tensors, fragment):
    with pytest.raises(CheckpointError) as info:
        etptr.save_safetensors(tensors, tmp_path / "x.safetensors")
    assert fragment in str(info.value)
    _only(tmp_path)


@pytest.mark.parametrize("metadata, fragment", [
    (["a"], "metadata: expected a dict"),
    ({"a": 1}, "metadata['a'] = 1"),
    ({1: "a"}, "metadata[1]"),
    ({"a": None}, "metadata['a'] = None"),
    ({"a": "\ud800"}, "cannot be encoded as UTF-8"),
])
def test_bad_metadata(tmp_path, metadata, fragment):
    with pytest.raises(CheckpointError) as info:
        etptr.save_safetensors({"a": _GOOD}, tmp_path / "x.safetensors", metadata=metadata)
    assert fragment in str(info.value)
    _only(tmp_path)


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        etptr.save_safetensors({"a": _GOOD}, tmp_path / "no" / "x.safetensors")
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        etptr.save_safetensors({"a": _GOOD}, tmp_path / "d.safetensors")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(CheckpointError, match="file' is not a directory"):
        etptr.save_safetensors({"a": _GOOD}, tmp_path / "file" / "x.safetensors")
    for bad in (b"x.safetensors", 3, "", None):
        with pytest.raises(CheckpointError, match="path="):
            etptr.save_safetensors({"a": _GOOD}, bad)
    _only(tmp_path, "d.safetensors", "file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match="is not writable"):
            etptr.save_safetensors({"a": _GOOD}, ro / "x.safetensors")
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)


def test_device_tensor_whose_allocator_is_gone(tmp_path):
    alloc = etptr.testing.HostDeviceAllocator()
    with etptr.testing.use_allocator(alloc):
        t = etptr.clone_tensor_ptr_to(_GOOD, "cuda:0")
    if etptr.get_device_allocator("cuda") is not None:
        pytest.skip("another CUDA allocator is registered")
    with pytest.raises(etptr.NotFoundError, match="tensor 't' is on cuda:0"):
        etptr.save_safetensors({"ok": _GOOD, "t": t}, tmp_path / "x.safetensors")
    _only(tmp_path)


def test_header_over_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(etptr.checkpoint._save, "MAX_HEADER_BYTES", 64)
    with pytest.raises(CheckpointError, match="over the format's limit of 64"):
        etptr.save_safetensors({f"t{i}": _GOOD for i in range(5)}, tmp_path / "x.safetensors")
    _only(tmp_path)


# ------------------------------------------------------------------ failures while writing

def _old_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    path.write_bytes(b"the previous checkpoint")
    return path


def test_device_copy_failing_part_way_leaves_nothing(tmp_path, host_alloc, monkeypatch):
    tensors = {f"t{i}": etptr.clone_tensor_ptr_to(etptr.full([64], float(i)), "cuda:0")
               for i in range(4)}
    calls = []

    class Flaky(etptr.testing.HostDeviceAllocator):
        def copy_device_to_host(self, dst, src, nbytes, index):
            calls.append(nbytes)
            if len(calls) == 3:
                raise etptr.MemoryAllocationError("the device went away")
            super().copy_device_to_host(dst, src, nbytes, index)

    flaky = Flaky()
    with etptr.testing.use_allocator(flaky):
        on_flaky = {k: etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to_cpu(t), "cuda:0")
                    for k, t in tensors.items()}
        path = _old_file(tmp_path)
        with pytest.raises(etptr.MemoryAllocationError, match="went away"):
            etptr.save_safetensors(on_flaky, path)
    assert len(calls) == 3
    assert path.read_bytes() == b"the previous checkpoint"
    _only(tmp_path, "ckpt.safetensors")


def test_device_bytes_come_down_into_staging_blocks_that_are_written(tmp_path, host_alloc,
                                                                     monkeypatch):
    t = etptr.clone_tensor_ptr_to(etptr.ones([4]), "cuda:0")

    def write_twos(srcs, outs):
        for o in outs:
            o.numpy()[...] = 2.0

    monkeypatch.setattr(etptr.checkpoint._pipeline, "d2h_copy", write_twos)
    etptr.save_safetensors({"t": t}, tmp_path / "x.safetensors")
    assert reference_read(tmp_path / "x.safetensors")["t"][2] == np.full(4, 2.0, np.float32).tobytes()


@pytest.fixture(params=["map", "pwrite"])
def write_path(request, monkeypatch):
    """Each test run once per write path."""
    monkeypatch.setattr(etptr.checkpoint._sinks, "WRITE_PATH", request.param)
    return request.param


def test_disk_full_leaves_nothing(tmp_path, monkeypatch, write_path):
    # the map's space is reserved before any data moves (a full disk is an error there,
    # not SIGBUS later); pwrite says so itself
    def no_space(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate" if write_path == "map" else "pwrite", no_space)
    path = _old_file(tmp_path)
    tensors = {f"t{i}": etptr.full([1000], 1.0) for i in range(4)}
    with pytest.raises(CheckpointError, match="cannot be written .No space left on device") as info:
        etptr.save_safetensors(tensors, path)
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert path.read_bytes() == b"the previous checkpoint"
    _only(tmp_path, "ckpt.safetensors")


def test_interrupt_part_way_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real = etptr.checkpoint._pipeline._host_bytes

    def interrupted(t):
        calls.append(t)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(t)

    monkeypatch.setattr(etptr.checkpoint._pipeline, "_host_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        etptr.save_safetensors({"a": _GOOD, "b": _GOOD, "c": _GOOD}, tmp_path / "x.safetensors")
    assert len(calls) == 2
    _only(tmp_path)


def test_rename_failing_leaves_nothing(tmp_path, monkeypatch):
    def no_rename(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(etptr.checkpoint._save.os, "replace", no_rename)
    path = _old_file(tmp_path)
    with pytest.raises(CheckpointError, match="cannot be written"):
        etptr.save_safetensors({"a": _GOOD}, path)
    assert path.read_bytes() == b"the previous checkpoint"
    _only(tmp_path, "ckpt.safetensors")


def test_no_file_descriptor_is_left_open(tmp_path, monkeypatch):
    from _checkpoint_helpers import open_fds

    monkeypatch.setattr(etptr.checkpoint._sinks, "WRITE_PATH", "map")   # it reserves space

    before = open_fds()
    etptr.save_safetensors({"a": _GOOD}, tmp_path / "ok.safetensors")
    monkeypatch.setattr(os, "posix_fallocate",
                        lambda fd, offset, length: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(CheckpointError):
        etptr.save_safetensors({"a": _GOOD}, tmp_path / "bad.safetensors")
    gc.collect()
    assert open_fds() == before
    _only(tmp_path, "ok.safetensors")


@pytest.mark.parametrize("durable", [False, True])
def test_durable_syncs_only_when_asked(tmp_path, monkeypatch, durable):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    etptr.save_safetensors({"t": etptr.ones([4])}, tmp_path / "f.safetensors", durable=durable)
    assert bool(synced) is durable
    assert reference_read(tmp_path / "f.safetensors")["t"][2] == np.ones(4, np.float32).tobytes()


# ------------------------------------------------------------------ names and directories

@pytest.mark.parametrize("nbytes", [243, 255])
def test_a_long_utf8_name_the_file_system_takes_is_saved(tmp_path, nbytes):
    # 4-byte characters: the temporary name is cut in bytes, on a character boundary
    stem = "\U0001F600" * ((nbytes - len(".safetensors")) // 4)
    name = stem + "x" * ((nbytes - len(".safetensors")) % 4) + ".safetensors"
    assert len(name.encode()) == nbytes
    path = tmp_path / name
    etptr.save_safetensors({"a": _GOOD}, path)
    assert reference_read(path)["a"][2] == np.ascontiguousarray(_GOOD.numpy()).tobytes()
    _only(tmp_path, name)


def test_a_name_past_the_file_systems_limit_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot"):
        etptr.save_safetensors({"a": _GOOD}, tmp_path / ("n" * 300 + ".safetensors"))
    _only(tmp_path)


def test_a_directory_that_cannot_be_reached_is_a_checkpoint_error(tmp_path):
    long_component = tmp_path / ("d" * 300) / "x.safetensors"     # ENAMETOOLONG
    with pytest.raises(CheckpointError, match="cannot be reached .File name too long"):
        etptr.save_safetensors({"a": _GOOD}, long_component)
    if os.geteuid() == 0:
        return                          # root searches any directory
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0)
    try:
        with pytest.raises(CheckpointError, match="cannot be reached .Permission denied"):
            etptr.save_safetensors({"a": _GOOD}, locked / "inner" / "x.safetensors")
    finally:
        locked.chmod(0o700)


def test_a_name_given_twice_by_a_mapping_is_refused(tmp_path):
    from collections.abc import Mapping

    class Twice(Mapping):               # a Mapping whose items() repeats a name
        def __getitem__(self, k):
            return np.ones(4, np.float32)

        def __iter__(self):
            return iter(["w", "w"])

        def __len__(self):
            return 2

    with pytest.raises(CheckpointError, match="the name 'w' occurs twice"):
        etptr.save_safetensors(Twice(), tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("background", [False, True])
def test_a_mapping_changed_by_a_tensors_own_code_saves_what_it_held(tmp_path, background):
    tensors = {}

    class Meddling:                      # its export adds a tensor to the dict being saved
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            tensors["late"] = np.zeros(2, np.float32)
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    tensors.update(a=np.arange(3, dtype=np.float32), m=Meddling(np.ones(5, np.int32)))
    h = etptr.save_safetensors(tensors, tmp_path / "x.safetensors", background=background)
    if background:
        h.result(30)
    back = etptr.load_safetensors(tmp_path / "x.safetensors", "cpu", framework="np")
    assert sorted(back) == ["a", "m"] and back["m"].tolist() == [1] * 5
