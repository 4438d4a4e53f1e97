"""etptr._core._host_copy: the host copy threads, copy lists and page population (no GPU)."""
import threading

import numpy as np
import pytest

import etptr
from etptr._core import _host_copy

from _helpers import run_isolated

MiB = 1 << 20


def _bytes(n, seed):
    return np.frombuffer(np.random.default_rng(seed).bytes(n), np.uint8)


@pytest.mark.parametrize("nbytes", [0, 1, 63, 4095, 128 * 1024, 128 * 1024 + 1, MiB - 7,
                                    3 * MiB + 5, 16 * MiB])
@pytest.mark.parametrize("threads", [1, 3, 8, 64])
@pytest.mark.parametrize("nontemporal", [False, True], ids=["memcpy", "nontemporal"])
@pytest.mark.parametrize("shift", [0, 3])
@pytest.mark.parametrize("pieces", [1, 8, 64])
def test_parallel_copy_is_exact(nbytes, threads, nontemporal, shift, pieces):
    # ``shift``: source and destination off any 16-byte boundary; ``pieces`` per thread
    a = _bytes(nbytes + 8, nbytes + threads)
    out = np.zeros(nbytes + 16, np.uint8)
    out[-1] = 0xA5
    dst = out.ctypes.data + shift
    _host_copy.parallel_copy(dst, a.ctypes.data + shift, nbytes, threads, nontemporal, pieces)
    assert np.array_equal(out[shift:shift + nbytes], a[shift:shift + nbytes])
    assert not out[:shift].any() and not out[shift + nbytes:-1].any()   # nothing else written
    assert out[-1] == 0xA5


def test_copies_from_several_threads_at_once_share_the_pool():
    n = 8 * MiB + 123
    srcs = [_bytes(n, i) for i in range(6)]
    outs = [np.zeros(n, np.uint8) for _ in srcs]
    errors = []
    barrier = threading.Barrier(len(srcs))

    def run(i):
        try:
            barrier.wait()
            for r in range(20):
                outs[i][:] = 0
                _host_copy.parallel_copy(outs[i].ctypes.data, srcs[i].ctypes.data, n, 5 + r % 4)
                assert np.array_equal(outs[i], srcs[i]), (i, r)
        except BaseException as exc:          # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(srcs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a copy never finished"
    assert errors == []
    assert _host_copy.copy_threads()["failed"] == 0


def test_worker_count_is_bounded():
    # In a fresh process: concurrent calls asking for up to 8 threads start at most
    # max(CPUs - 1, 7) workers; one call asking for more gets what it asked for.
    out = run_isolated("""
    import threading
    import numpy as np
    from etptr._core import _host_copy
    n = 4 << 20
    a = np.ones(n, np.uint8)
    outs = [np.zeros(n, np.uint8) for _ in range(4)]
    assert _host_copy.copy_threads()["workers"] == 0
    def run(o):
        for _ in range(10):
            _host_copy.parallel_copy(o.ctypes.data, a.ctypes.data, n, 8)
    ts = [threading.Thread(target=run, args=(o,)) for o in outs]
    for t in ts: t.start()
    for t in ts: t.join()
    assert all(o.all() for o in outs)
    w = _host_copy.copy_threads()["workers"]
    assert 1 <= w <= max(_host_copy.cpu_count() - 1, 7), w
    _host_copy.parallel_copy(outs[0].ctypes.data, a.ctypes.data, n, 24)
    w = _host_copy.copy_threads()["workers"]
    assert w >= 23, w
    print("OK", w)
    """, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("nontemporal", [False, True], ids=["memcpy", "nontemporal"])
@pytest.mark.parametrize("pieces", [1, 8])
def test_copy_lists_gather_and_scatter_exactly(threads, nontemporal, pieces):
    # many segments of mixed sizes, as the engine packs small tensors into one slot
    rng = np.random.default_rng(threads)
    sizes = [int(n) for n in rng.integers(0, 300_000, 200)] + [0, 1, 3 * MiB]
    srcs = [_bytes(n, i) for i, n in enumerate(sizes)]
    packed = np.zeros(sum(sizes) + 64, np.uint8)
    offs = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    gather = [(packed.ctypes.data + int(o), s.ctypes.data, n) for o, s, n in zip(offs, srcs, sizes)]
    _host_copy.parallel_copy_list(gather, threads, nontemporal, pieces)
    assert np.array_equal(packed[:sum(sizes)], np.concatenate(srcs))
    assert not packed[sum(sizes):].any()
    outs = [np.zeros(n, np.uint8) for n in sizes]
    scatter = [(o.ctypes.data, packed.ctypes.data + int(off), n)
               for o, off, n in zip(outs, offs, sizes)]
    _host_copy.parallel_copy_list(scatter, threads, pieces=pieces)
    assert all(np.array_equal(o, s) for o, s in zip(outs, srcs))


@pytest.fixture(params=[(False, 0), (True, 0), (True, 4096), (True, 100_000), (True, MiB // 2)],
                ids=lambda p: f"nt{int(p[0])}-bounce{p[1]}")
def read_mode(request):
    """``nontemporal`` and ``read_bounce`` for parallel_read: file reads straight into
    the destination, or (non-temporal, with a bounce buffer) through a per-thread
    buffer of that size."""
    nontemporal, bounce = request.param
    return {"nontemporal": nontemporal, "read_bounce": bounce}


@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("per_thread", [1, 8])
def test_file_reads_land_exactly(tmp_path, threads, per_thread, read_mode):
    # pieces of a file read into memory, as the loader fills pinned slots
    data = _bytes(5 * MiB + 11, threads)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    rng = np.random.default_rng(threads)
    pieces = [(int(o), int(n)) for o, n in zip(rng.integers(0, 4 * MiB, 60),
                                               rng.integers(0, 300_000, 60))]
    pieces += [(0, 0), (len(data) - 1, 1), (0, 3 * MiB)]
    dst = np.zeros(sum(n for _, n in pieces) + 64, np.uint8)
    segs, at = [], 0
    for off, n in pieces:
        segs.append((dst.ctypes.data + at, off, n))
        at += n
    with open(path, "rb") as f:
        _host_copy.parallel_read(f.fileno(), segs, threads, per_thread, **read_mode)
    want = np.concatenate([data[o:o + n] for o, n in pieces])
    assert np.array_equal(dst[:at], want)
    assert not dst[at:].any()


def test_file_reads_report_a_short_file_and_a_bad_descriptor(tmp_path, read_mode):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(1000))
    dst = np.zeros(4 * MiB, np.uint8)
    with open(path, "rb") as f:
        with pytest.raises(EOFError, match="file ended"):
            _host_copy.parallel_read(f.fileno(), [(dst.ctypes.data, 0, 2 * MiB)], 4,
                                     **read_mode)
        with pytest.raises(EOFError):          # one piece past the end among good ones
            _host_copy.parallel_read(f.fileno(), [(dst.ctypes.data, 0, 500),
                                                  (dst.ctypes.data + 500, 999, 2)], 2,
                                     **read_mode)
    with pytest.raises(OSError) as info:
        _host_copy.parallel_read(1 << 29, [(dst.ctypes.data, 0, MiB)], 4, **read_mode)
    assert info.value.errno == 9                 # EBADF
    with pytest.raises(etptr.InvalidArgumentError, match=r"segments\[0\]: a null address"):
        _host_copy.parallel_read(0, [(0, 0, 4)], 2)


def test_copy_lists_refuse_null_addresses():
    a = np.zeros(8, np.uint8)
    with pytest.raises(etptr.InvalidArgumentError, match=r"segments\[1\]: a null address"):
        _host_copy.parallel_copy_list([(a.ctypes.data, a.ctypes.data, 4), (0, a.ctypes.data, 4)], 2)
    with pytest.raises(etptr.InvalidArgumentError, match=r"segments\[0\]\.nbytes"):
        _host_copy.parallel_copy_list([(a.ctypes.data, a.ctypes.data, -1)], 2)


def test_copy_lists_read_their_sequence_once():
    # a sequence whose __len__ lies cannot size the segment table: the list is taken
    # first (here its length hint is refused as too large)
    buf = np.zeros(16, np.uint8)

    class Lying:
        def __len__(self):
            return (1 << 61) + 1

        def __getitem__(self, i):
            if i > 3:
                raise IndexError
            return (buf.ctypes.data, buf.ctypes.data, 1)

    for call in (lambda: _host_copy.parallel_copy_list(Lying(), 2),
                 lambda: _host_copy.parallel_read(0, Lying(), 2)):
        with pytest.raises((MemoryError, OverflowError)):
            call()


@pytest.mark.parametrize("nbytes", [-1, MiB // 2 + 1, 2.5])
def test_the_read_bounce_size_is_checked(nbytes):
    a = np.zeros(16, np.uint8)
    with pytest.raises((etptr.InvalidArgumentError, TypeError), match="read_bounce"):
        _host_copy.parallel_read(0, [(a.ctypes.data, 0, 16)], 2, nontemporal=True,
                                 read_bounce=nbytes)


@pytest.mark.parametrize("pieces", [0, 65, 2.5])
def test_pieces_per_thread_is_checked(pieces):
    a = np.zeros(16, np.uint8)
    err = etptr.InvalidTypeError if isinstance(pieces, float) else etptr.InvalidArgumentError
    with pytest.raises(err, match="pieces"):
        _host_copy.parallel_copy(a.ctypes.data, a.ctypes.data, 16, 2, False, pieces)
    with pytest.raises(err, match="pieces"):
        _host_copy.parallel_copy_list([(a.ctypes.data, a.ctypes.data, 16)], 2, False, pieces)


def test_copy_lists_whose_bytes_add_up_past_int64_are_refused(tmp_path):
    a = np.zeros(16, np.uint8)
    huge = [(a.ctypes.data, a.ctypes.data, 2**62)] * 4
    with pytest.raises(etptr.InvalidArgumentError, match=r"segments\[1\].*2\*\*63"):
        _host_copy.parallel_copy_list(huge, 2)
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 16)
    with open(path, "rb") as f:
        with pytest.raises(etptr.InvalidArgumentError, match=r"segments\[1\]"):
            _host_copy.parallel_read(f.fileno(), [(a.ctypes.data, 0, 2**62)] * 4, 2, 8)
