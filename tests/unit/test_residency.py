"""read= of the loads: resident pages from the page cache, the others with O_DIRECT
(checkpoint/_residency.py, and the host copy threads' direct segments), on this machine's
disk file system; bit-exact every way, a file system without O_DIRECT read buffered, a
file that shrinks during a direct read refused."""
import errno
import os

import numpy as np
import pytest

import etptr
from etptr.checkpoint import CheckpointError, _residency
from etptr.checkpoint._descriptors import ReadOnlyFile
from etptr.testing import HostDeviceAllocator, use_allocator

MiB = 1 << 20


def _evict(path):
    """Drop the file's pages from the page cache (written back first); skip where the
    file system keeps them (tmpfs)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with ReadOnlyFile(path) as f:
        _, _, vec = f.resident(0, os.path.getsize(path))
    if sum(vec) > len(vec) // 4:
        pytest.skip("the page cache keeps this file system's pages (tmpfs?)")


def _resident_share(path):
    with ReadOnlyFile(path) as f:
        _, _, vec = f.resident(0, os.path.getsize(path))
    return sum(vec) / max(len(vec), 1)


@pytest.fixture
def ckpt(tmp_path):
    rng = np.random.default_rng(9)
    arrays = {f"t{i}": rng.integers(0, 255, n, dtype=np.uint8)
              for i, n in enumerate([3 * MiB + 17, 4096, 5 * MiB - 3, 1, 2 * MiB])}
    path = tmp_path / "m.safetensors"
    etptr.save_safetensors({k: etptr.make_tensor_ptr(v) for k, v in arrays.items()}, path)
    return path, arrays


def _check(out, arrays):
    for k, a in arrays.items():
        t = out[k]
        host = t if t.device.is_cpu() else etptr.clone_tensor_ptr_to_cpu(t)
        assert np.array_equal(host.numpy(), a), k


def test_residency_is_read_from_the_page_cache(ckpt):
    path, _ = ckpt
    _evict(path)
    with open(path, "rb") as f:
        f.seek(2 * MiB)
        f.read(MiB)                             # warm about a MiB in the middle
    with ReadOnlyFile(path) as f:
        first, page, vec = f.resident(0, os.path.getsize(path))
        assert first == 0 and page == os.sysconf("SC_PAGESIZE")
        assert all(vec[(2 * MiB) // page:(3 * MiB) // page])
        assert not all(vec)


def test_auto_splits_by_residency_and_covers_every_byte(ckpt):
    path, _ = ckpt
    size = os.path.getsize(path)
    _evict(path)
    with open(path, "rb") as f:
        f.seek(4 * MiB)
        f.read(2 * MiB)
    pieces = [(0, 0, 3 * MiB), (3 * MiB, 3 * MiB + 4096, size - 3 * MiB)]
    with ReadOnlyFile(path) as f:
        split = _residency.split_pieces(f, pieces, "auto")
        _, page, vec = f.resident(0, size)
    assert any(d for *_, d in split) and not all(d for *_, d in split)
    # the pieces cut at residency changes, in order, covering the same bytes
    assert sum(n for _, _, n, _ in split) == sum(n for _, _, n in pieces)
    for o, d, n, direct in split:
        if direct:
            assert n >= _residency.MIN_DIRECT_BYTES
            assert not any(vec[o // page:(o + n - 1) // page + 1])
    for mode in ("buffered", "direct"):
        with ReadOnlyFile(path) as f:
            assert [d for *_, d in _residency.split_pieces(f, pieces, mode)] == \
                [mode == "direct"] * 2


@pytest.mark.parametrize("read", ["auto", "direct", "buffered"])
@pytest.mark.parametrize("where", ["device", "pinned", "into"])
def test_loads_are_exact_every_way(ckpt, read, where):
    path, arrays = ckpt
    _evict(path)
    with open(path, "rb") as f:
        f.seek(MiB)
        f.read(3 * MiB)                         # half cached, more or less
    alloc = HostDeviceAllocator()
    alloc.allocate_host = lambda nbytes, index: np.empty(nbytes, np.uint8)
    with use_allocator(alloc):
        if where == "device":
            _check(etptr.load_safetensors(path, "cuda", read=read), arrays)
        elif where == "pinned":
            _check(etptr.load_safetensors(path, "cpu", pinned=True, read=read), arrays)
        else:
            targets = {k: np.zeros_like(v) for k, v in arrays.items()}
            etptr.load_safetensors(path, into=targets, read=read)
            assert all(np.array_equal(targets[k], v) for k, v in arrays.items())
        assert alloc.live_bytes == 0 or where == "device"


def test_auto_and_direct_leave_the_page_cache_as_they_found_it(ckpt):
    path, arrays = ckpt
    with use_allocator(HostDeviceAllocator()):
        for read in ("auto", "direct"):
            _evict(path)
            _check(etptr.load_safetensors(path, "cuda", read=read), arrays)
            assert _resident_share(path) < 0.25, read
        _evict(path)
        etptr.load_safetensors(path, "cuda", read="buffered")
        assert _resident_share(path) > 0.75


def test_a_file_system_without_o_direct_is_read_buffered(ckpt, monkeypatch):
    path, arrays = ckpt
    _evict(path)
    real = _residency.ReadOnlyFile

    def refuse(p, direct=False):
        if direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(p)

    monkeypatch.setattr(_residency, "ReadOnlyFile", refuse)
    with use_allocator(HostDeviceAllocator()):
        _check(etptr.load_safetensors(path, "cuda", read="direct"), arrays)


def test_a_file_shrinking_under_a_direct_read_is_refused(ckpt):
    path, _ = ckpt

    class Truncating(HostDeviceAllocator):
        def copy_host_to_device(self, dst, src, nbytes, index, **kw):
            os.truncate(path, 4096)
            return super().copy_host_to_device(dst, src, nbytes, index, **kw)

    big = path.parent / "big.safetensors"
    etptr.save_safetensors({"w": etptr.zeros([20 << 20], type="Byte")}, big)
    path = big
    alloc = Truncating()
    with use_allocator(alloc):
        with pytest.raises(CheckpointError, match="reading the data failed|changed"):
            etptr.load_safetensors(big, "cuda", read="direct")
        assert alloc.live_bytes == 0


def test_a_bad_read_mode_is_refused(ckpt):
    with pytest.raises(CheckpointError, match="read='cached'"):
        etptr.load_safetensors(ckpt[0], "cpu", read="cached")
