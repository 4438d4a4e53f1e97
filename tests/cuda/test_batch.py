"""Many tensors at once on CUDA: DeviceMemoryBuffer, h2d_copy / d2h_copy, clone_tensor_ptrs_to.

The scattered paths use the copy kernel, on a real device and against the stand-in
driver (ETPTR_FAKE_CUPY=1, tests/fakes/fakecuda.c); tests that look at each piece's DMA run
the stand-in without the kernel (the ``no_kernel`` fixture), where the same calls copy
piece by piece, which checks the bookkeeping (layouts, what is freed, errors)."""
import gc

import numpy as np
import pytest

import etptr
from etptr import ScalarType as ST
from etptr.cuda import _copy_engine, _tuning, copy_config

MiB = 1 << 20
SMALL = dict(threads=4, slot_bytes=256 * 1024, slots=3, small_copy_bytes=64 * 1024)


def _arrays(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1 << 31, n, dtype=np.int32) for n in sizes]


MIXED = [1, 3, 0, 4096, 1000, 300_000, 1, 17, (2 * MiB) // 4 + 3, 64, 5]


def _host(t):
    return etptr.clone_tensor_ptr_to(t, "cpu").numpy()


def _traced_begins(settings, copy, *args):
    """``copy(*args)`` under ``settings`` with the engine's trace on: the byte counts of
    the pipelined copies it began."""
    try:
        _tuning.tune(trace=True)
        with copy_config(**settings):
            copy(*args)
    finally:
        _tuning.tune(trace=False)
    return [n for what, n, _ in _tuning.take_trace() if what == "begin"]


def _fails_part_way(fake, after, copy, *args):
    """``copy(*args)`` under SMALL with the stand-in's copy calls failing after ``after``
    calls: it must raise the injected error."""
    fake.fail_copies_after = after
    try:
        with copy_config(**SMALL):
            with pytest.raises(etptr.EtError, match="FAKECUDA_INJECTED_FAILURE"):
                copy(*args)
    finally:
        fake.fail_copies_after = None


@pytest.fixture
def hook():
    yield
    _tuning.tune(chunk_hook=None)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_batched_clone_round_trip(pinned, settings, device_used):
    arrays = _arrays(MIXED)
    before = device_used()
    with copy_config(**settings):
        up = etptr.clone_tensor_ptrs_to([etptr.make_tensor_ptr(a) for a in arrays], "cuda")
        down = etptr.clone_tensor_ptrs_to(up, "cpu", pinned=pinned)
    for a, d, h in zip(arrays, up, down):
        assert d.device == etptr.Device("cuda:0") and d.sizes == a.shape
        assert h.device == etptr.Device("cpu")
        np.testing.assert_array_equal(h.numpy(), a)
        assert d.data_ptr % 256 == 0 or d.nbytes == 0
    # one allocation for the device results, in order
    ptrs = [d.data_ptr for d in up if d.nbytes]
    assert ptrs == sorted(ptrs)
    assert device_used() - before >= sum(a.nbytes for a in arrays)
    del up, down, d, h
    assert device_used() == before


def test_batched_clone_keeps_layout_and_dynamism():
    src = etptr.make_tensor_ptr([2, 3], list(range(6)), dim_order=[1, 0],
                                dynamism=etptr.TensorShapeDynamism.STATIC)
    (d,) = etptr.clone_tensor_ptrs_to([src], "cuda")
    assert (d.sizes, d.dim_order, d.strides, d.shape_dynamism) == \
        (src.sizes, src.dim_order, src.strides, src.shape_dynamism)
    (h,) = etptr.clone_tensor_ptrs_to([d], "cpu")
    np.testing.assert_array_equal(h.numpy(), src.numpy())


@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_copies_into_existing_scattered_tensors(settings, pool):
    arrays = _arrays(MIXED, seed=1)
    outs = [etptr.empty([a.size], ST.Int, device="cuda") for a in arrays]
    srcs = [etptr.make_tensor_ptr(a) for a in arrays]
    with copy_config(**settings):
        assert etptr.h2d_copy(srcs, outs) == outs
        for a, o in zip(arrays, outs):
            np.testing.assert_array_equal(_host(o), a)
        back = [etptr.empty([a.size], ST.Int, pinned=True) for a in arrays]
        back += [etptr.empty([a.size], ST.Int) for a in arrays]
        assert etptr.d2h_copy(outs + outs, back) == back
    for a, b in zip(arrays + arrays, back):
        np.testing.assert_array_equal(b.numpy(), a)


def _views(base, offsets, n, device):
    return [etptr.from_blob(base.data_ptr + o, [n], ST.Byte, device=device) for o in offsets]


def _stale_slots():
    """Leave the pinned slots holding 0xEE, as an earlier upload would."""
    junk = etptr.make_tensor_ptr(np.full(4 * MiB, 0xEE, np.uint8))
    etptr.h2d_copy(junk, etptr.empty([4 * MiB], ST.Byte, device="cuda"))


# piece bytes, gap bytes: small pieces (through the scratch area) and large ones
GAPPED = [(64, 64), (1000, 24), (2 * MiB, 128), (MiB + 3, 253)]


@pytest.mark.parametrize("n, gap", GAPPED, ids=[f"{n}+{g}" for n, g in GAPPED])
@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_batched_h2d_copy_keeps_the_device_bytes_between_its_outs(n, gap, settings):
    offsets = [0, n + gap, 2 * (n + gap)]
    size = offsets[-1] + n + 512
    dev = etptr.full([size], 0x77, ST.Byte, device="cuda")
    srcs = [etptr.make_tensor_ptr(np.full(n, i + 1, np.uint8)) for i in range(3)]
    with copy_config(**settings):
        _stale_slots()
        etptr.h2d_copy(srcs, _views(dev, offsets, n, "cuda"))
    back = _host(dev)
    for i, o in enumerate(offsets):
        assert (back[o:o + n] == i + 1).all()
        back[o:o + n] = 0x77
    assert (back == 0x77).all(), "bytes between or after the outs were written"


@pytest.mark.parametrize("n, gap", GAPPED, ids=[f"{n}+{g}" for n, g in GAPPED])
@pytest.mark.parametrize("pinned", [True, False], ids=["page-locked", "pageable"])
def test_batched_d2h_copy_keeps_the_host_bytes_between_its_outs(n, gap, pinned):
    offsets = [0, n + gap, 2 * (n + gap)]
    size = offsets[-1] + n + 512
    dev = etptr.full([size], 0x11, ST.Byte, device="cuda")
    host = etptr.full([size], 0x77, ST.Byte, pinned=pinned)
    etptr.d2h_copy(_views(dev, offsets, n, "cuda"), _views(host, offsets, n, "cpu"))
    back = host.numpy().copy()
    for o in offsets:
        assert (back[o:o + n] == 0x11).all()
        back[o:o + n] = 0x77
    assert (back == 0x77).all(), "bytes between or after the outs were written"


def test_outs_laid_end_to_end_in_one_allocation_go_up_in_one_dma(fake):
    dev = etptr.empty([64 * 1024], ST.Byte, device="cuda")
    outs = _views(dev, [1024 * i for i in range(64)], 1024, "cuda")
    srcs = [etptr.make_tensor_ptr(np.full(1024, i, np.uint8)) for i in range(64)]
    fake.clear()
    etptr.h2d_copy(srcs, outs)
    assert len(_ups(fake)) == 1
    back = _host(dev).reshape(64, 1024)
    assert all((back[i] == i).all() for i in range(64))


def test_a_batched_clone_down_reads_separate_allocations_separately(fake, no_kernel, cp,
                                                                    monkeypatch):
    # two separate device allocations 212 bytes apart (as successive allocations may lie):
    # one DMA across both would read memory that belongs to neither
    import ctypes
    arena = ctypes.create_string_buffer(1 << 20)
    cursor = [-(-ctypes.addressof(arena) // 4096) * 4096]

    def adjacent(size):
        rounded = (size + 511) // 512 * 512
        ptr, cursor[0] = cursor[0], cursor[0] + rounded
        fake.cupy.state.dev.add(ptr, arena, rounded)
        return cp.cuda.memory.MemoryPointer(ptr, rounded, 0)

    monkeypatch.setattr(cp.cuda.memory, "alloc", adjacent)
    a = etptr.full([300], 1, ST.Byte, device="cuda")
    b = etptr.full([300], 2, ST.Byte, device="cuda")
    assert b.data_ptr - a.data_ptr == 512
    for pinned in (True, False):
        fake.clear()
        down = etptr.clone_tensor_ptrs_to([a, b], "cpu", pinned=pinned)
        assert [d.numpy().tolist() for d in down] == [[1] * 300, [2] * 300]
        assert sorted(c.nbytes for c in fake.calls if c.what in ("htod", "dtoh")) == [300, 300]


def test_batched_d2h_copy_of_small_pieces_keeps_the_host_bytes_between_its_outs():
    # small pieces come down through the scratch area (gathered by a kernel on a GPU), packed
    # at 16-byte steps: outs laid out the same way in one page-locked block must still get
    # their own bytes only
    devs = [etptr.full([4], i + 1, ST.Byte, device="cuda") for i in range(8)]
    host = etptr.full([8 * 16], 0x77, ST.Byte, pinned=True)
    etptr.d2h_copy(devs, _views(host, [16 * i for i in range(8)], 4, "cpu"))
    back = host.numpy().reshape(8, 16)
    for i in range(8):
        assert (back[i, :4] == i + 1).all() and (back[i, 4:] == 0x77).all()


def test_h2d_copy_into_all_but_one_of_a_batched_clone_leaves_that_one_alone():
    arrays = [np.full(256, float(i), np.float32) for i in range(10)]
    up = etptr.clone_tensor_ptrs_to([etptr.make_tensor_ptr(a) for a in arrays], "cuda")
    _stale_slots()
    keep = [i for i in range(10) if i != 5]
    etptr.h2d_copy([etptr.make_tensor_ptr(-arrays[i]) for i in keep], [up[i] for i in keep])
    for i, d in enumerate(up):
        np.testing.assert_array_equal(_host(d), arrays[i] if i == 5 else -arrays[i])


LARGE = [MiB // 4, (3 * MiB) // 4 + 5, (2 * MiB) // 4 + 100, 5 * MiB // 4, MiB // 4 + 1]


def _ups(fake):
    return fake.copies("htod")


@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_large_pieces_to_scattered_tensors_go_up_in_one_pipeline(fake, no_kernel, settings, pool):
    # pageable pieces of 1 MiB and more: their bytes packed into the slots in order,
    # each chunk's DMA one per piece it holds, never past a piece's end; small pieces
    # and a page-locked large one beside them take their own paths
    arrays = _arrays(LARGE + [3, 1000], seed=7)
    outs = [etptr.empty([a.size], ST.Int, device="cuda") for a in arrays]
    srcs = [etptr.make_tensor_ptr(a) for a in arrays]
    pinned = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(srcs[1], "cuda"), "cpu")
    srcs.append(pinned)
    arrays.append(arrays[1])
    outs.append(etptr.empty([arrays[1].size], ST.Int, device="cuda"))
    fake.clear()
    begins = _traced_begins(settings, etptr.h2d_copy, srcs, outs)
    ups = _ups(fake)
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(_host(o), a)
    spans = {o.data_ptr: o.nbytes for o in outs}
    for c in ups:
        n, dst = c.nbytes, c.dst
        base = max(p for p in spans if p <= dst)
        assert dst + n <= base + spans[base]          # no DMA runs past a piece's end
    large = sum(a.nbytes for a in arrays[:len(LARGE)])
    into_large = [c for c in ups if any(o.data_ptr <= c.dst < o.data_ptr + o.nbytes
                                        for o in outs[:len(LARGE)])]
    assert sum(c.nbytes for c in into_large) == large
    # in order through the packed bytes: each DMA starts where the one before ended
    packed_at, at = {}, 0
    for o in outs[:len(LARGE)]:
        packed_at[o.data_ptr] = at
        at += o.nbytes
    at = 0
    for c in into_large:
        base = max(p for p in packed_at if p <= c.dst)
        assert packed_at[base] + (c.dst - base) == at
        at += c.nbytes
    assert begins == [large]                          # one pipelined copy of them all
    assert [c.nbytes for c in ups if c.src == pinned.data_ptr] == [pinned.nbytes]   # one DMA
    assert pool.stats()["blocks_in_use"] == 1                                  # ``pinned``


@pytest.mark.parametrize("settings", [SMALL, {}], ids=["small-slots", "defaults"])
def test_large_pieces_from_scattered_tensors_come_down_in_one_pipeline(fake, no_kernel, settings,
                                                                       pool):
    # the mirror for downloads into pageable outs: the device pieces come down into the
    # slots packed in order (one DMA per piece a chunk holds), the copy threads scatter
    # them to their outs; a page-locked out takes one DMA of its own
    arrays = _arrays(LARGE + [3, 1000], seed=10)
    devs = [etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda") for a in arrays]
    outs = [etptr.empty([a.size], ST.Int) for a in arrays]
    pinned = etptr.empty([arrays[1].size], ST.Int, pinned=True)
    devs.append(devs[1])
    outs.append(pinned)
    arrays.append(arrays[1])
    fake.clear()
    begins = _traced_begins(settings, etptr.d2h_copy, devs, outs)
    downs = fake.copies("dtoh")
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(o.numpy(), a)
    large = sum(a.nbytes for a in arrays[:len(LARGE)])
    assert begins == [large]                          # one pipelined copy of them all
    spans = {d.data_ptr: d.nbytes for d in devs}
    for c in downs:
        n, src = c.nbytes, c.src
        base = max(p for p in spans if p <= src)
        assert src + n <= base + spans[base]          # no DMA runs past a piece's end
    assert [c.nbytes for c in downs if c.dst == pinned.data_ptr] == [pinned.nbytes]   # one DMA


def test_large_pieces_one_by_one_when_the_pipeline_is_off(fake):
    arrays = _arrays(LARGE, seed=8)
    outs = [etptr.empty([a.size], ST.Int, device="cuda") for a in arrays]
    back = [etptr.empty([a.size], ST.Int) for a in arrays]
    _tuning.tune(scattered_pipeline=False)
    try:
        _tuning.tune(trace=True)
        with copy_config(**SMALL):
            etptr.h2d_copy([etptr.make_tensor_ptr(a) for a in arrays], outs)
            etptr.d2h_copy(outs, back)
    finally:
        _tuning.tune(trace=False)
        _tuning.tune(scattered_pipeline=True)
    begins = [n for what, n, _ in _tuning.take_trace() if what == "begin"]
    assert begins == [a.nbytes for a in arrays] * 2   # a pipelined copy each, both ways
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(b.numpy(), a)
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(_host(o), a)


def test_failure_in_the_scattered_pipeline_keeps_nothing(fake, pool, device_used):
    # a DMA failing part way through the packed upload: the error names the copy, no
    # pinned slot stays taken, and the outs hold old or new bytes, nothing else
    arrays = _arrays(LARGE, seed=9)
    outs = [etptr.zeros([a.size], ST.Int, device="cuda") for a in arrays]
    srcs = [etptr.make_tensor_ptr(a) for a in arrays]
    before = pool.stats()["blocks_in_use"]
    _fails_part_way(fake, 4, etptr.h2d_copy, srcs, outs)
    gc.collect()
    assert pool.stats()["blocks_in_use"] == before
    for a, o in zip(arrays, outs):
        got = _host(o)
        assert np.all((got == a) | (got == 0))
    etptr.h2d_copy(srcs, outs)                       # and the next batch works
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(_host(o), a)
    del got                                          # (a page-locked clone)
    back = [etptr.zeros([a.size], ST.Int) for a in arrays]
    _fails_part_way(fake, 3, etptr.d2h_copy, outs, back)      # and the same for a download
    gc.collect()
    assert pool.stats()["blocks_in_use"] == before
    for a, b in zip(arrays, back):
        assert np.all((b.numpy() == a) | (b.numpy() == 0))


def test_single_pair_copies(cp):
    a = np.arange(10, dtype=np.float32)
    out = etptr.empty([10], device="cuda")
    assert etptr.h2d_copy(etptr.make_tensor_ptr(a), out) is out
    h = etptr.empty([10], pinned=True)
    etptr.d2h_copy(out, h)
    np.testing.assert_array_equal(h.numpy(), a)


def test_stream_ordered_batches(real_cupy):
    cupy = real_cupy
    arrays = _arrays(MIXED, seed=2)
    s = cupy.cuda.Stream(non_blocking=True)
    up = etptr.clone_tensor_ptrs_to([etptr.make_tensor_ptr(a) for a in arrays], "cuda", stream=s)
    outs = [etptr.empty([a.size], ST.Int, device="cuda") for a in arrays]
    etptr.h2d_copy([etptr.make_tensor_ptr(a) for a in arrays], outs, stream=s)
    back = etptr.clone_tensor_ptrs_to(outs, "cpu", stream=s)
    s.synchronize()
    for a, d, b in zip(arrays, up, back):
        np.testing.assert_array_equal(_host(d), a)
        np.testing.assert_array_equal(b.numpy(), a)


def test_many_small_tensors_round_trip():
    arrays = _arrays([4096] * 600, seed=3)            # 600 x 16 KiB: the scratch path
    outs = [etptr.empty([a.size], ST.Int, device="cuda") for a in arrays]
    etptr.h2d_copy([etptr.make_tensor_ptr(a) for a in arrays], outs)
    back = [etptr.empty([a.size], ST.Int, pinned=True) for a in arrays]
    etptr.d2h_copy(outs, back)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(arrays, back))
    clones = etptr.clone_tensor_ptrs_to(outs, "cpu")
    assert all(np.array_equal(a, c.numpy()) for a, c in zip(arrays, clones))


def test_empty_batches():
    assert etptr.clone_tensor_ptrs_to([], "cuda") == []
    assert etptr.h2d_copy([], []) == []
    assert etptr.d2h_copy([], []) == []


def test_mismatched_pairs_are_refused_before_any_byte_moves(fake):
    a = etptr.make_tensor_ptr(np.arange(4, dtype=np.float32))
    good = etptr.empty([4], device="cuda")
    cases = [
        ([a, a], [good, etptr.empty([5], device="cuda")], r"out\[1\]\.sizes"),
        ([a, a], [good, etptr.empty([4], ST.Int, device="cuda")], r"out\[1\]\.scalar_type"),
        ([a, a], [good, etptr.empty([4])], r"out\[1\]\.device"),
        ([a, a], [good], "src has 2 tensors but out has 1"),
        ([a, good], [good, good], r"src\[1\]\.device"),
        ([a, a], [good, etptr.make_tensor_ptr([4], None, device="cuda")], r"out\[1\] has null"),
    ]
    for srcs, outs, match in cases:
        fake.clear()
        with pytest.raises(etptr.InvalidArgumentError, match=match):
            etptr.h2d_copy(srcs, outs)
        assert not [c for c in fake.calls if c.what in ("htod", "dtoh", "dtod")]
    t = etptr.make_tensor_ptr([2, 2], list(range(4)), type=ST.Float, dim_order=[1, 0])
    with pytest.raises(etptr.InvalidArgumentError, match=r"out\.dim_order"):
        etptr.h2d_copy(t, etptr.empty([2, 2], device="cuda"))
    with pytest.raises(etptr.InvalidTypeError, match=r"out\[0\]"):
        etptr.h2d_copy([a], ["not a tensor"])
    with pytest.raises(etptr.InvalidTypeError, match="out is one TensorPtr but src is a list"):
        etptr.h2d_copy([a], good)


def test_batch_from_two_devices_is_refused(ndev):
    if ndev < 2:
        pytest.skip("needs two devices")
    x = etptr.clone_tensor_ptr_to(etptr.ones([4]), "cuda:0")
    y = etptr.clone_tensor_ptr_to(etptr.ones([4]), "cuda:1")
    with pytest.raises(etptr.InvalidArgumentError, match=r"tensors\[1\]\.device"):
        etptr.clone_tensor_ptrs_to([x, y], "cpu")
    with pytest.raises(etptr.InvalidArgumentError, match=r"out\[1\]\.device"):
        etptr.h2d_copy([etptr.ones([4]), etptr.ones([4])], [x, y])


def test_failure_part_way_frees_everything(fake, pool, device_used):
    arrays = _arrays([100_000] * 8, seed=4)
    srcs = [etptr.make_tensor_ptr(a) for a in arrays]
    before = device_used()
    _fails_part_way(fake, 3, etptr.clone_tensor_ptrs_to, srcs, "cuda")
    gc.collect()
    assert device_used() == before
    assert pool.stats()["blocks_in_use"] == 0


def test_interrupt_between_slots_loses_nothing(hook, pool, device_used):
    arrays = _arrays([1 << 20] * 3, seed=5)             # 12 MiB through 256 KiB slots
    srcs = [etptr.make_tensor_ptr(a) for a in arrays]
    before = device_used()

    def interrupt(direction, i):
        if i == 5:
            raise KeyboardInterrupt

    _tuning.tune(chunk_hook=interrupt)
    with copy_config(**SMALL):
        with pytest.raises(KeyboardInterrupt):
            etptr.clone_tensor_ptrs_to(srcs, "cuda")
    _tuning.tune(chunk_hook=None)
    gc.collect()
    assert device_used() == before and pool.stats()["blocks_in_use"] == 0


def test_device_memory_buffer_views(alloc):
    before = alloc.live_blocks
    buf = etptr.DeviceMemoryBuffer.create(4096, "cuda")
    assert buf.nbytes == 4096 and buf.device == etptr.Device("cuda:0") and buf.data_ptr
    v = buf.tensor(256, [4, 8], ST.Float)
    etptr.h2d_copy(etptr.make_tensor_ptr(np.arange(32, dtype=np.float32).reshape(4, 8)), v)
    np.testing.assert_array_equal(_host(v).ravel(), np.arange(32))
    with pytest.raises(etptr.InvalidArgumentError, match="offset=2"):
        buf.tensor(2, [1], ST.Float)
    with pytest.raises(etptr.InvalidArgumentError, match="run past"):
        buf.tensor(4000, [100], ST.Float)
    buf.close()
    with pytest.raises(etptr.InvalidStateError, match="closed"):
        buf.tensor(0, [1])
    del buf
    gc.collect()
    assert alloc.live_blocks == before + 1      # the view keeps the memory
    del v
    gc.collect()
    assert alloc.live_blocks == before


def test_device_memory_buffer_views_in_one_call(alloc):
    buf = etptr.DeviceMemoryBuffer.create(4096, "cuda")
    offsets, shapes, types = [0, 256, 512, 1024], [(4, 8), (), (3,), (0, 5)], \
        [ST.Float, ST.Half, ST.Long, ST.Float]
    views = buf._views(offsets, shapes, types)
    for v, o, s, t in zip(views, offsets, shapes, types):
        one = buf.tensor(o, list(s), t)
        assert (v.data_ptr, v.sizes, v.strides, v.dim_order, v.scalar_type, v.shape_dynamism,
                v.device) == (one.data_ptr, one.sizes, one.strides, one.dim_order,
                              one.scalar_type, one.shape_dynamism, one.device)
    with pytest.raises(etptr.InvalidArgumentError, match="offset=2"):
        buf._views([0, 2], [(1,), (1,)], [ST.Float, ST.Float])
    with pytest.raises(etptr.InvalidArgumentError, match="run past"):
        buf._views([4000], [(100,)], [ST.Float])
    with pytest.raises(etptr.InvalidArgumentError, match="offset"):
        buf._views([-256], [(1,)], [ST.Float])
    with pytest.raises(ValueError):
        buf._views([0, 4, 8], [(1,)], [ST.Float] * 3)          # lengths differ: no view lost
    with pytest.raises(etptr.InvalidTypeError):
        buf._views([0, 0], [(1,), (1,)], [ST.Float, 6.0])    # as tensor(0, (1,), 6.0) refuses
    with pytest.raises(etptr.InvalidTypeError):
        buf._views([0], [(1,)], [[6]])
    with pytest.raises(etptr.InvalidTypeError):
        buf._views([0, 0], [(1,), (1,)], [1, True])          # True == 1, but not a type
    buf.close()
    with pytest.raises(etptr.InvalidStateError, match="closed"):
        buf._views([0], [(1,)], [ST.Float])
    assert buf._views([], [], []) == []

