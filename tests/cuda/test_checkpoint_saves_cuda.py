"""save_safetensors of CUDA tensors through the CudaAllocator: the bytes come down into
page-locked blocks of the pinned pool (never more than the staging cap alive), one file,
sharded and in the background, bit for bit; the blocks go back to the pool, also when
the save fails part way."""
import errno
import gc
import os

import numpy as np
import pytest

import etptr
from etptr.checkpoint import CheckpointError, _pipeline, _sinks
from etptr.checkpoint._shards import INDEX_NAME

from _checkpoint_helpers import DTYPES, code_of, random_array, raw_bytes, reference_read


@pytest.fixture(params=["map", "pwrite"])
def write_path(request, monkeypatch):
    monkeypatch.setattr(_sinks, "WRITE_PATH", request.param)
    return request.param


@pytest.fixture
def staged_blocks(monkeypatch, alloc):
    """Every staging block the saver takes: (nbytes, whether the pool knows it)."""
    taken = []
    real = type(alloc).allocate_host

    def spy(self, nbytes, index):
        block = real(self, nbytes, index)
        taken.append((nbytes, isinstance(block, etptr.cuda.PinnedBlock)))
        return block

    monkeypatch.setattr(_pipeline, "get_device_allocator",
                        lambda device_type: _Spy(alloc, spy))
    return taken


class _Spy:
    def __init__(self, alloc, spy):
        self.alloc, self.spy = alloc, spy

    def allocate_host(self, nbytes, index):
        return self.spy(self.alloc, nbytes, index)


def _device(seed, sizes=((3, 5), (), (0, 2), (300, 77), (4099,))):
    rng = np.random.default_rng(seed)
    arrays = {f"{c}.{i}": random_array(c, s, rng) for c in DTYPES for i, s in enumerate(sizes)}
    tensors = {k: etptr.clone_tensor_ptr_to(
        etptr.make_tensor_ptr(list(a.shape), np.array(a), type=DTYPES[code_of(a.dtype)][0]),
        "cuda:0") for k, a in arrays.items()}
    return tensors, arrays


def _check_file(path, arrays):
    for name, (dtype, shape, data) in reference_read(path).items():
        a = arrays[name]
        assert (dtype, shape, data) == (code_of(a.dtype), a.shape, raw_bytes(a)), name


def _pool_in_use(pool):
    gc.collect()
    return pool.stats()["in_use_bytes"]


def test_one_file_through_pinned_blocks(tmp_path, staged_blocks, pool, write_path):
    tensors, arrays = _device(0)
    before = _pool_in_use(pool)
    etptr.save_safetensors(tensors, tmp_path / "x.safetensors")
    _check_file(tmp_path / "x.safetensors", arrays)
    assert staged_blocks and all(pinned for _, pinned in staged_blocks)
    assert _pool_in_use(pool) == before


def test_sharded_and_background_with_a_small_cap(tmp_path, staged_blocks, pool, monkeypatch,
                                                 write_path):
    monkeypatch.setattr(_pipeline, "CHUNK_BYTES", 1 << 20)
    rng = np.random.default_rng(1)
    arrays = {f"w{i}": rng.integers(0, 2**31, (3 << 20) // 4, dtype=np.int32)
              for i in range(5)}
    tensors = {k: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:0")
               for k, a in arrays.items()}
    before = _pool_in_use(pool)
    pool.reset_peak()
    h = etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size="7MiB",
                               background=True, staging_bytes=2 << 20)
    assert h.wait_staged(60)
    del tensors
    h.result(60)
    back = etptr.load_safetensors(tmp_path / "d" / INDEX_NAME, "cpu")
    for k, a in arrays.items():
        assert raw_bytes(back[k].numpy()) == raw_bytes(a)
    assert sum(n for n, _ in staged_blocks) == 15 << 20      # every byte staged once
    assert max(n for n, _ in staged_blocks) <= 1 << 20
    assert _pool_in_use(pool) == before


def test_a_failure_part_way_gives_the_blocks_back(tmp_path, pool, monkeypatch, write_path):
    tensors, _ = _device(2)
    name = "posix_fallocate" if write_path == "map" else "pwrite"
    real = getattr(os, name)

    def full(fd, *args):
        if "model-00002" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, *args)

    monkeypatch.setattr(os, name, full)
    before = _pool_in_use(pool)
    with pytest.raises(CheckpointError, match="model-00002-of-.*: cannot be written"):
        etptr.save_safetensors(tensors, tmp_path / "d", max_shard_size=4096)
    h = etptr.save_safetensors(tensors, tmp_path / "e", max_shard_size=4096, background=True)
    with pytest.raises(CheckpointError, match="model-00002-of-.*: cannot be written"):
        h.result(60)
    assert os.listdir(tmp_path) == []
    assert _pool_in_use(pool) == before


def test_a_device_copy_failing_gives_the_blocks_back(tmp_path, pool, fake):
    tensors, _ = _device(3)
    before = _pool_in_use(pool)
    fake.fail_copies_after = 0
    try:
        with pytest.raises(etptr.EtError):
            etptr.save_safetensors(tensors, tmp_path / "x.safetensors")
        h = etptr.save_safetensors(tensors, tmp_path / "y.safetensors", background=True)
        with pytest.raises(etptr.EtError):
            h.result(60)
    finally:
        fake.fail_copies_after = None
    assert os.listdir(tmp_path) == []
    assert _pool_in_use(pool) == before
