"""etptr.cuda._pinned_pool: the caching pinned-host pool's policy, on plain host memory.

The pool takes its memory from an injected allocator; here that is ordinary host
memory (no CuPy, no stand-in), so size classes, the cap, LRU eviction, the counters,
lowering the cap, the retry after an allocation failure and the rule that a block is
reused only once its event has completed are checked on any machine.
"""
import ctypes
import gc

import numpy as np
import pytest

import etptr
from etptr.cuda import PinnedHostPool, size_class

KiB, MiB = 1 << 10, 1 << 20


class HostMemory:
    """malloc/free of plain host memory, with a byte budget and a call log."""

    def __init__(self, budget=None):
        self.blocks = {}
        self.calls = []
        self.budget = budget

    def malloc(self, nbytes, device):
        if self.budget is not None and sum(len(b) for b in self.blocks.values()) + nbytes > self.budget:
            raise MemoryError(f"over the budget of {self.budget} bytes")
        buf = ctypes.create_string_buffer(nbytes)
        ptr = ctypes.addressof(buf)
        self.blocks[ptr] = buf
        self.calls.append(("malloc", nbytes, device))
        return ptr

    def free(self, ptr, device):
        del self.blocks[ptr]
        self.calls.append(("free", ptr, device))

    @property
    def live(self):
        return sum(len(b) for b in self.blocks.values())


class Fence:
    """A caller's event: done when told so (``query()``), ``synchronize()`` completes it."""

    def __init__(self):
        self.done = False
        self.waited = 0

    def query(self):
        return self.done

    def synchronize(self):
        self.waited += 1
        self.done = True


def test_size_classes():
    assert size_class(0) == size_class(1) == size_class(4096) == 4096
    assert size_class(4097) == 8192 and size_class(32 * KiB) == 32 * KiB
    for n in (32 * KiB + 1, MiB - 1, MiB + 1, 3 * MiB + 5, (1 << 40) + 17):
        c = size_class(n)
        assert n <= c < n * 9 / 8 + 4096, n              # waste under 1/8 of the block
        assert size_class(c) == c                       # classes are fixed points
    with pytest.raises(etptr.InvalidArgumentError, match="nbytes"):
        size_class(-1)


def test_blocks_are_cached_per_class_and_reused():
    mem = HostMemory()
    pool = PinnedHostPool(allocator=mem)
    assert pool.allocator is mem
    b = pool.malloc(5000)
    assert (b.nbytes, b.capacity, len(b)) == (5000, 8192, 5000)
    np.frombuffer(b, np.uint8)[:] = 7
    ptr = b.ptr
    del b
    assert pool.stats()["cached_bytes"] == 8192 and mem.live == 8192
    again = pool.malloc(6000)                        # the same class: the cached block
    assert again.ptr == ptr
    s = pool.stats()
    assert (s["hits"], s["misses"], s["blocks_in_use"], s["in_use_bytes"]) == (1, 1, 1, 8192)
    assert s["requested_bytes"] == 6000


def test_cap_and_lru_eviction():
    mem = HostMemory()
    pool = PinnedHostPool(max_cached_bytes=3 * 64 * KiB, allocator=mem)
    blocks = [pool.malloc(64 * KiB) for _ in range(5)]
    ptrs = [b.ptr for b in blocks]
    while blocks:                                    # freed in order: the first is the oldest
        blocks.pop(0)
    s = pool.stats()
    assert s["cached_bytes"] == 3 * 64 * KiB and s["evictions"] == 2
    freed = [c[1] for c in mem.calls if c[0] == "free"]
    assert freed == ptrs[:2]                         # the oldest two went back
    pool.max_cached_bytes = 64 * KiB                 # lowering the cap frees the oldest now
    freed = [c[1] for c in mem.calls if c[0] == "free"]
    assert freed == ptrs[:4] and pool.stats()["evictions"] == 4
    pool.empty_cache()
    assert mem.live == 0 and pool.stats()["cached_bytes"] == 0


def test_a_block_larger_than_the_cap_is_not_cached():
    mem = HostMemory()
    pool = PinnedHostPool(max_cached_bytes=MiB, allocator=mem)
    b = pool.malloc(2 * MiB)
    del b
    assert mem.live == 0 and pool.stats()["cached_bytes"] == 0


def test_reuse_only_after_the_blocks_event():
    mem = HostMemory()
    pool = PinnedHostPool(allocator=mem)
    b = pool.malloc(10 * KiB)
    fence = Fence()
    b.hold_until(fence)
    ptr = b.ptr
    del b
    busy = pool.malloc(10 * KiB)                     # the cached block may still be read
    assert busy.ptr != ptr and pool.stats()["misses"] == 2
    del busy
    fence.done = True
    reused = [pool.malloc(10 * KiB) for _ in range(2)]
    assert ptr in [r.ptr for r in reused]
    del reused
    held = pool.malloc(10 * KiB)
    pending = Fence()
    held.hold_until(pending)
    del held
    pool.empty_cache()                               # freeing waits for the event first
    assert pending.waited == 1 and mem.live == 0


def test_hold_until_checks_the_event():
    pool = PinnedHostPool(allocator=HostMemory())
    b = pool.malloc(10)
    with pytest.raises(etptr.InvalidTypeError, match="expected a CUDA event"):
        b.hold_until(object())


def test_allocation_failure_frees_the_cache_and_retries_once():
    mem = HostMemory(budget=2 * 64 * KiB + 96 * KiB)
    pool = PinnedHostPool(allocator=mem)
    kept = [pool.malloc(64 * KiB) for _ in range(2)]
    spare = pool.malloc(32 * KiB)
    del spare                                        # cached: 32 KiB
    big = pool.malloc(96 * KiB)                      # fits only once the cache is freed
    assert big.capacity == 96 * KiB and pool.stats()["cached_bytes"] == 0
    with pytest.raises(etptr.MemoryAllocationError, match="even after freeing the cache"):
        pool.malloc(64 * KiB)
    assert pool.stats()["failures"] == 1
    del kept, big
    gc.collect()


def test_bad_arguments_and_bad_allocators():
    pool = PinnedHostPool(allocator=HostMemory())
    for bad, cls in ((-1, etptr.InvalidArgumentError), (1.5, etptr.InvalidTypeError),
                     (True, etptr.InvalidTypeError)):
        with pytest.raises(cls, match="nbytes"):
            pool.malloc(bad)
    with pytest.raises(etptr.InvalidArgumentError, match="device"):
        pool.malloc(10, 128)
    with pytest.raises(etptr.InvalidTypeError, match="allocator="):
        PinnedHostPool(allocator=object())

    class Garbage(HostMemory):
        def malloc(self, nbytes, device):
            return -8

    g = Garbage()
    with pytest.raises(etptr.InvalidArgumentError, match="not an address"):
        PinnedHostPool(allocator=g).malloc(10)
    assert not [c for c in g.calls if c[0] == "free"]      # never freed what it did not get


def test_the_block_outlives_its_pool():
    mem = HostMemory()
    pool = PinnedHostPool(allocator=mem)
    b = pool.malloc(100)
    del pool
    gc.collect()
    del b
    assert mem.live == 0


def test_default_cap_follows_a_lower_cgroup_limit(tmp_path, monkeypatch):
    from etptr.cuda import _pinned_pool
    phys = _pinned_pool._memory_bytes()
    limit = tmp_path / "memory.max"
    limit.write_text("8589934592\n")                     # 8 GiB
    monkeypatch.setattr(_pinned_pool, "_CGROUP_LIMITS", (str(limit),))
    if phys == 0 or phys > 8 << 30:
        assert _pinned_pool._memory_bytes() == 8 << 30
    assert _pinned_pool._default_cap() == max(2 << 30, _pinned_pool._memory_bytes() // 4)
    limit.write_text("max\n")                            # no limit: physical memory
    assert _pinned_pool._memory_bytes() == phys or phys == 0
    monkeypatch.setattr(_pinned_pool, "_CGROUP_LIMITS", (str(tmp_path / "absent"),))
    assert _pinned_pool._default_cap() >= 2 << 30
