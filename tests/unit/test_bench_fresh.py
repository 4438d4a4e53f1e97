"""etptr.bench._fresh: loaders timed in fresh processes under warm, cold and half-full page
caches, on the CPU here (etptr and the safetensors library)."""
import os

import numpy as np
import pytest

import etptr
from etptr.bench import _fresh


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    rng = np.random.default_rng(1)
    etptr.save_safetensors({f"t{i}": etptr.make_tensor_ptr(rng.integers(0, 255, 3 << 20,
                                                                         dtype=np.uint8))
                            for i in range(3)}, path)
    return [str(path)]


def test_file_systems_are_told_apart(tmp_path):
    assert _fresh.file_system("/proc/self/status") == "proc"
    assert _fresh.file_system(str(tmp_path)) != "?"


def test_the_page_cache_is_prepared_and_checked(ckpt):
    if _fresh.file_system(ckpt[0]) in ("tmpfs", "ramfs"):
        assert _fresh.prepare(ckpt, "cold")[0] is False
        return
    assert _fresh.prepare(ckpt, "warm") == (True, 1.0)
    achieved, share = _fresh.prepare(ckpt, "cold")
    assert achieved and share < 0.05
    achieved, share = _fresh.prepare(ckpt, "half")   # every other eighth of the file
    assert achieved and 0.3 < share < 0.7


def test_the_disk_rate_reads_every_byte(ckpt):
    rate, how = _fresh.disk_rate(ckpt, threads=3, request=1 << 20)
    assert rate > 0
    kind = _fresh.file_system(ckpt[0])
    assert how.startswith("buffered" if kind in ("tmpfs", "ramfs") else ("O_DIRECT", "buffered"))


@pytest.mark.parametrize("loader", ["etptr", "etptr-set-up", "safetensors"])
def test_a_loader_runs_in_a_fresh_process_and_is_checked(ckpt, loader):
    r = _fresh.run_fresh(loader, ckpt, "cpu", "warm")
    assert r.error is None, r.error
    assert (r.setup_s is not None and r.setup_s > 0) == (loader == "etptr-set-up")
    assert r.nbytes == 9 << 20 and r.first_s > 0 and r.later_s > 0
    assert sorted(r.digests) == ["t0", "t1", "t2"]
    other = _fresh.run_fresh("safetensors" if loader == "etptr" else "etptr", ckpt, "cpu",
                             "warm")
    assert other.digests == r.digests                # the same bytes, both ways


def test_a_cache_that_cannot_be_dropped_says_so(tmp_path):
    if not os.path.isdir("/dev/shm") or _fresh.file_system("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    path = os.path.join("/dev/shm", f"etptr-fresh-{os.getpid()}.safetensors")
    try:
        etptr.save_safetensors({"w": etptr.ones([1024])}, path)
        r = _fresh.run_fresh("etptr", [path], "cpu", "cold")
        assert r.first_s is None and "cannot be made cold" in r.error
    finally:
        os.unlink(path)
