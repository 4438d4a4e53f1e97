"""A KeyboardInterrupt at every line of the checkpoint save and load paths leaves nothing
behind: no file descriptor, no temporary file, no device or host block of the allocator,
and no file under the real name unless the save completed.

The interrupt is raised by a trace function (``sys.settrace``) at the k-th line executed
in etptr.checkpoint's Python modules, for every k the path runs through; each path is
first run once to count its lines.
"""
import gc
import os
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

import etptr
import etptr.checkpoint
from etptr import DeviceType
from etptr.testing import HostDeviceAllocator, use_allocator

from _checkpoint_helpers import open_fds

CHECKPOINT_DIR = str(Path(etptr.checkpoint.__file__).parent)


class _Interrupt:
    """A trace function raising KeyboardInterrupt at the ``at``-th line executed in
    etptr.checkpoint (or, with ``at`` None, only counting them)."""

    def __init__(self, at=None):
        self.at = at
        self.lines = 0

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(CHECKPOINT_DIR):
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                raise KeyboardInterrupt(f"at line {frame.f_lineno} of "
                                        f"{os.path.basename(frame.f_code.co_filename)}")
        return self._line


def _traced(fn, tracer):
    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(None)


class _HostBlocks(HostDeviceAllocator):
    """A host-simulated CUDA allocator whose allocate_host blocks are counted while they
    live (``host_live``)."""

    def __init__(self):
        super().__init__(DeviceType.CUDA)
        self._host = []

    def allocate_host(self, nbytes, index):
        block = np.empty(nbytes, np.uint8)
        self._host.append(weakref.ref(block))
        return block

    @property
    def host_live(self):
        return sum(1 for r in self._host if r() is not None)


def _every_line(make_call, check_clean):
    """Run ``make_call()()`` once to count its lines, then once per line with an interrupt
    there; after each, ``check_clean(interrupted)`` (interrupted: whether the interrupt
    was raised, i.e. the call did not complete)."""
    counter = _Interrupt()
    _traced(make_call(), counter)
    assert counter.lines > 20, counter.lines
    for at in range(1, counter.lines + 1):
        call = make_call()
        interrupted = False
        try:
            _traced(call, _Interrupt(at))
        except KeyboardInterrupt:
            interrupted = True
        call = None
        try:
            check_clean(at, interrupted)
        except AssertionError:
            gc.collect()                  # what a cycle still holds goes now, or never
            check_clean(at, interrupted)
    return counter.lines


def _save_inputs(where, **more):
    """The tensors the save tests write (a column-major one among them), on the CPU or
    moved to the installed allocator's device."""
    tensors = {"a": etptr.full([300], 2.5), "b": etptr.ones([7], type="Int"), **more,
               "t": etptr.make_tensor_ptr([2, 3], np.arange(6, dtype=np.int64),
                                          dim_order=[1, 0])}
    if where == "device":
        tensors = {k: etptr.clone_tensor_ptr_to(t, "cuda") for k, t in tensors.items()}
    return tensors


@pytest.fixture
def files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    path = src / "m.safetensors"
    etptr.save_safetensors({"a": etptr.full([300], 2.5), "b": etptr.ones([7], type="Int"),
                            "c": etptr.zeros([0, 3])}, path)
    return path


@pytest.mark.parametrize("where", ["cpu", "device"])
def test_an_interrupt_at_any_line_of_a_save_leaves_no_trace(tmp_path, where):
    out = tmp_path / "out"
    out.mkdir()
    target = out / "x.safetensors"
    alloc = HostDeviceAllocator()
    with use_allocator(alloc):
        tensors = _save_inputs(where)
        live = alloc.live_bytes
        fds = open_fds()

        def make_call():
            if target.exists():
                target.unlink()
            return lambda: etptr.save_safetensors(tensors, target)

        def check_clean(at, interrupted):
            assert open_fds() == fds, f"a descriptor is left after an interrupt at line {at}"
            names = os.listdir(out)
            # no temporary file; the real name only once the file is complete (an
            # interrupt may land after the rename, when the save has in fact completed)
            assert names in ([], ["x.safetensors"]), (at, names)
            if not interrupted or names:
                back = etptr.load_safetensors(target, "cpu")
                assert set(back) == set(tensors), at
                assert back["a"].numpy().tolist() == [2.5] * 300, at
            assert alloc.live_bytes == live, at

        _every_line(make_call, check_clean)


@pytest.mark.parametrize("how", ["cpu", "pinned", "device", "index"])
def test_an_interrupt_at_any_line_of_a_load_leaves_no_trace(files, how):
    path = files
    if how == "index":                    # an index naming the one shard
        index = path.parent / "m.safetensors.index.json"
        index.write_text('{"weight_map": {"a": "m.safetensors", "b": "m.safetensors", '
                         '"c": "m.safetensors"}}')
        path = index
    alloc = _HostBlocks()
    with use_allocator(alloc):
        fds = open_fds()

        def make_call():
            if how in ("cpu", "pinned"):
                return lambda: etptr.load_safetensors(path, "cpu", pinned=how == "pinned",
                                                      progress=False)
            return lambda: etptr.load_safetensors(path, "cuda", progress=False)

        def check_clean(at, interrupted):
            assert open_fds() == fds, f"a descriptor is left after an interrupt at line {at}"
            assert alloc.live_bytes == 0, at
            assert alloc.host_live == 0, at

        _every_line(make_call, check_clean)


@pytest.mark.parametrize("how", ["slices-cpu", "slices-device", "into-cpu", "into-device"])
def test_an_interrupt_at_any_line_of_slices_and_loads_in_place_leaves_no_trace(files, how):
    path = files
    alloc = _HostBlocks()
    with use_allocator(alloc):
        device = "cuda" if how.endswith("device") else "cpu"
        targets = {"a": etptr.empty([300], device=device),
                   "b": etptr.empty([7], type="Int", device=device),
                   "c": etptr.empty([0, 3], device=device)}
        live = alloc.live_bytes
        fds = open_fds()

        def make_call():
            if how.startswith("slices"):
                def call():
                    with etptr.safe_open(path, device=device) as f:
                        return f.get_slices([("a", (slice(10, 200),)), ("b", ...)])
                return call
            return lambda: etptr.load_safetensors(path, into=targets)

        def check_clean(at, interrupted):
            assert open_fds() == fds, f"a descriptor is left after an interrupt at line {at}"
            assert alloc.live_bytes == live, at

        _every_line(make_call, check_clean)


@pytest.mark.parametrize("where", ["cpu", "device"])
@pytest.mark.parametrize("how", ["sharded", "background", "background sharded"])
def test_an_interrupt_at_any_line_of_a_sharded_or_background_save(tmp_path, where, how):
    """The interrupt lands in the caller's thread: in the checks, the writing (a sharded
    save's), the start of a background save or the wait for its result. Afterwards (once
    a background save that got going has finished) no descriptor, temporary file, device
    or page-locked block is left, and every real name holds a complete file; an index, if
    any, names only complete shards."""
    from etptr.checkpoint._shards import INDEX_NAME

    out = tmp_path / "out"
    out.mkdir()
    sharded = "sharded" in how
    target = out / "ckpt" if sharded else out / "x.safetensors"
    if sharded:
        target.mkdir()                       # (a directory made by the save: unit tests)
    alloc = _HostBlocks()
    with use_allocator(alloc):
        tensors = _save_inputs(where, c=etptr.full([100], 1.5))
        live = alloc.live_bytes
        fds = open_fds()
        handles = []
        kw = {"max_shard_size": 1000} if sharded else {}

        def make_call():
            for name in os.listdir(target if sharded else out):
                os.unlink((target if sharded else out) / name)
            handles.clear()
            if "background" not in how:
                return lambda: etptr.save_safetensors(tensors, target, **kw)

            def call():
                handles.append(etptr.save_safetensors(tensors, target, background=True, **kw))
                handles[-1].result()
            return call

        def check_clean(at, interrupted):
            for h in handles:                # a save that got going finishes by itself
                h.result(30)
            assert open_fds() == fds, f"a descriptor is left after an interrupt at line {at}"
            names = sorted(os.listdir(target if sharded else out))
            assert not [n for n in names if n.startswith(".")], (at, names)
            for n in names:
                if n.endswith(".safetensors"):
                    back = etptr.load_safetensors((target if sharded else out) / n, "cpu")
                    if "a" in back:
                        assert back["a"].numpy().tolist() == [2.5] * 300, at
            if sharded and INDEX_NAME in names:
                back = etptr.load_safetensors(target / INDEX_NAME, "cpu")
                assert set(back) == set(tensors), at
            if not interrupted:
                assert (INDEX_NAME in names) if sharded else names == ["x.safetensors"], at
            assert alloc.live_bytes == live, at
            assert alloc.host_live == 0, at

        _every_line(make_call, check_clean)


class _AlsoInJoin(_Interrupt):
    """:class:`_Interrupt` counting also the lines of ``Thread.join`` (where a join cut
    short marks a thread that runs on as stopped, and a later join returns at once).
    Not the lines of ``Condition.wait``: an interrupt there can break CPython's own
    condition ("release unlocked lock"), whoever calls it."""

    def __call__(self, frame, event, arg):
        import threading
        code = frame.f_code
        if code.co_filename == threading.__file__:
            return self._line if code.co_name in ("join", "_wait_for_tstate_lock") else None
        return super().__call__(frame, event, arg)


def test_an_interrupt_while_the_writers_run_leaves_none_running(tmp_path):
    """An interrupt at any line of the save or of a Thread.join it makes: every writer
    thread of the save still ends, and no temporary file is left."""
    import time

    tensors = {f"t{i}": etptr.full([50_000], float(i)) for i in range(8)}
    target = tmp_path / "x.safetensors"

    def tasks():
        return len(os.listdir("/proc/self/task"))   # every thread, bare ones too

    baseline = tasks()

    def writers():
        return tasks() > baseline

    counter = _AlsoInJoin()
    _traced(lambda: etptr.save_safetensors(tensors, target), counter)
    assert counter.lines > 20, counter.lines
    for at in range(1, counter.lines + 1):
        try:
            _traced(lambda: etptr.save_safetensors(tensors, target), _AlsoInJoin(at))
        except KeyboardInterrupt:
            pass
        deadline = time.monotonic() + 10
        while writers() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not writers(), f"a writer runs on after an interrupt at line {at}"
        assert os.listdir(tmp_path) in ([], ["x.safetensors"]), at
