"""The save pipeline: tensors' bytes into new files, device data through staging blocks
while earlier blocks are written, several files at once.

A save is a list of :class:`FileSpec` (a file's real name, its header and its tensors in
file order). Each file's data is cut in chunks of up to ``CHUNK_BYTES`` of consecutive
file bytes (a large tensor spans several). The caller's thread (or, for a background
save, the save's own thread) is the *producer*: it walks the chunks, files interleaved,
and for each chunk that needs it takes a *staging block* of host memory (the device
allocator's ``allocate_host``: page-locked memory from the pinned pool for CUDA;
ordinary memory where that gives None), copies the chunk's bytes into it (one batched
:func:`~etptr.d2h_copy` for its device pieces, the copy threads for CPU bytes) and queues
it. *Writer threads* take the queued jobs, first the opening of every file (created
under a temporary name, sized, its header written), then the chunks, and write each
through the file's sink (:mod:`etptr.checkpoint._sinks`); a written block goes back at
once, so staging never holds more than its cap (``staging_bytes``: the producer waits
for room, it never allocates beyond it). Row-major CPU tensors of a synchronous save are
written from their own memory, without staging; a background save stages every byte, so
that the caller may change its tensors once :meth:`_Run.produce` has returned. The last
chunk of a file closes its map and, for a durable save, syncs it, in the writer thread
(files sync in parallel). The caller renames the files (``commit``) only once all of
them are complete.

The first failure anywhere (a write, a copy, an interrupt in the producer) stops every
thread; :meth:`_Run.close` joins them, drops every staging block and removes every
temporary file. It is idempotent: a caller closes the run at the end of its ``try`` and
again in its ``except``, so that an interrupt landing inside the first call is finished
by the second. The caller's thread takes no lock of its own (see :class:`_Shared`).
"""
from __future__ import annotations

import _thread
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etptr._core._device_allocator import get_device_allocator
from etptr._core._device_copy import clone_tensor_ptr_to_cpu, d2h_copy
from etptr._core._host_copy import copy_buffer
from etptr._core._make_tensor_ptr import make_tensor_ptr
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorPtr
from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._sinks import copy_threads, open_sink

__all__ = ["CHUNK_BYTES", "SYNC_STAGING_BYTES", "FileSpec", "Flag", "background_staging_bytes",
           "run_save", "writer_count"]

#: Bytes of consecutive file data one staging block carries (one d2h batch, one write).
#: Not measured (bench/results/DECISIONS.md, ``save chunks and staging``).
CHUNK_BYTES = 64 << 20

#: Staging a synchronous save holds at most: four blocks in flight (the same row).
SYNC_STAGING_BYTES = 4 * CHUNK_BYTES

#: Writer threads at most (also at most one per file, and half the copy threads; at
#: least 2): bench/results/DECISIONS.md, ``save writers``.
MAX_WRITERS = 8


def writer_count(files: int) -> int:
    """Writer threads for a save of ``files`` files."""
    return max(1, min(files, MAX_WRITERS, max(2, copy_threads() // 2)))


def background_staging_bytes(total: int) -> int:
    """The default cap of a background save's staging: the whole checkpoint, up to a
    quarter of the machine's memory (the pinned pool's own default cap), at least one
    chunk (bench/results/DECISIONS.md, ``background staging cap``)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        memory = 8 << 30
    return max(CHUNK_BYTES, min(total, memory // 4))


@dataclass
class FileSpec:
    """One file of a save: its real name, its header (length and JSON) and its tensors in
    file order (``items``: objects with ``.tensor``)."""

    final: Path
    header: bytes
    items: list[Any]

    @property
    def size(self) -> int:
        return len(self.header) + sum(int(it.tensor.nbytes) for it in self.items)


def _row_major(t: TensorPtr) -> bool:
    return t.dim_order == tuple(range(t.dim()))


def _host_bytes(t: TensorPtr) -> Any:
    """A row-major CPU tensor's bytes as a flat uint8 array over its memory (the caller
    keeps ``t`` alive while the array is used)."""
    return make_tensor_ptr([t.nbytes], t.data_ptr, type=ScalarType.Byte).numpy()


class _Chunk:
    """Bytes [offset, offset + nbytes) of file ``file``: ``parts`` are
    (tensor, offset in the tensor's bytes, nbytes, offset in the chunk)."""

    __slots__ = ("file", "offset", "nbytes", "parts", "host")

    def __init__(self, file: int, offset: int) -> None:
        self.file = file
        self.offset = offset
        self.nbytes = 0
        self.parts: list[tuple[TensorPtr, int, int, int]] = []
        self.host = True          # every part a row-major CPU tensor


def _chunks(index: int, spec: FileSpec, chunk_bytes: int) -> list[_Chunk]:
    out: list[_Chunk] = []
    cur: _Chunk | None = None
    pos = len(spec.header)
    for it in spec.items:
        t = it.tensor
        n, at = t.nbytes, 0
        while at < n:
            if cur is None or cur.nbytes == chunk_bytes:
                cur = _Chunk(index, pos)
                out.append(cur)
            take = min(n - at, chunk_bytes - cur.nbytes)
            cur.parts.append((t, at, take, cur.nbytes))
            cur.host = cur.host and t.device.is_cpu() and _row_major(t)
            cur.nbytes += take
            at += take
            pos += take
    return out


def _interleave(per_file: list[list[_Chunk]]) -> list[_Chunk]:
    """Chunk k of every file, then chunk k + 1 of every file: all files advance at once."""
    out: list[_Chunk] = []
    longest = max((len(c) for c in per_file), default=0)
    for k in range(longest):
        out.extend(c[k] for c in per_file if k < len(c))
    return out


class _Stopped(Exception):
    """The run was stopped (a failure elsewhere, or a cancel): the producer gives up."""


_MiB = 1 << 20


def _units(nbytes: int) -> int:
    """Staging is counted in MiB (rounded up), the units of the budget (:class:`_Budget`)."""
    return max(1, -(-nbytes // _MiB))


class Flag:
    """A flag threads wait for, set once: ``set``, ``is_set``, ``wait``. Each step is an
    attribute store or a C lock call, so an interrupt in the caller's thread cannot leave
    it broken (see :class:`_Shared`); a waiter also looks at the flag every second."""

    __slots__ = ("_set", "_lock")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()        # wakes a waiter at once
            except RuntimeError:
                pass                        # released already (two set at once)

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set (or ``timeout`` seconds); whether it is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                break
            if self._lock.acquire(timeout=left):
                try:
                    self._lock.release()    # the next waiter goes on too
                except RuntimeError:
                    pass
        return self._set


class _Budget:
    """The staging budget in units (MiB): a queue of tokens, whose ``get`` and ``put`` are
    C calls (see :class:`_Shared`)."""

    __slots__ = ("_tokens",)

    def __init__(self, units: int) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.give(units)

    def take(self) -> None:
        """One unit, once one is free."""
        self._tokens.get()

    def give(self, units: int) -> None:
        for _ in range(units):
            self._tokens.put(None)


class _Shared:
    """What the producer, the writer threads and a background save's handle share.

    The code of the caller's thread waits and signals only through objects whose every
    step is one C call (a queue.SimpleQueue, a C lock, a flag over one): an interrupt
    lands before or after such a call, never inside, so it can leave no lock held. The
    standard library's Event, Semaphore and Condition run Python code between taking and
    releasing their lock, and an interrupt there leaves it held for good. The writer
    threads (which no interrupt reaches) keep their own counters under ``count_lock``.
    """

    def __init__(self, cap: int, files: int) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.stop = Flag()
        self.error: BaseException | None = None
        self._first = threading.Lock()      # taken once, by the first failure
        self.gate = threading.Lock()        # taken once: by the renames, or by a cancel
        self.cap_units = _units(cap)
        self.room = _Budget(self.cap_units)
        self.opened = [Flag() for _ in range(files)]
        self.count_lock = threading.Lock()  # the writers' counters

    def fail(self, exc: BaseException) -> None:
        """Record the first failure and stop everything: the writers drop what is
        queued, a producer waiting for room or a writer waiting for a file wakes up."""
        if self._first.acquire(False):
            self.error = exc
        self.stop.set()
        self.room.give(self.cap_units)
        for flag in self.opened:
            flag.set()

    def check(self) -> None:
        if self.stop.is_set():
            raise _Stopped


class _Block:
    """A staging block: ``array`` (uint8) over ``owner``'s memory; its ``units`` go back
    to the budget once (:meth:`give`)."""

    __slots__ = ("owner", "array", "units", "_once", "_room")

    def __init__(self, units: int, room: _Budget) -> None:
        self.owner: Any = None
        self.array: Any = np.empty(0, np.uint8)       # a uint8 ndarray over ``owner``
        self.units = units
        self._once = threading.Lock()
        self._room = room

    def give(self) -> None:
        """Drop the memory and return its room to the budget; idempotent."""
        self.array = np.empty(0, np.uint8)
        self.owner = None
        if self._once.acquire(False):
            self._room.give(self.units)


class _Job:
    """A writer's task: ``run`` it, or ``drop`` it after a failure; either way the staging
    block it carries goes back."""

    __slots__ = ("fn", "block")

    def __init__(self, fn: Callable[[], None], block: _Block | None = None) -> None:
        self.fn: Callable[[], None] | None = fn
        self.block = block

    def run(self) -> None:
        try:
            assert self.fn is not None
            self.fn()
        finally:
            self.drop()

    def drop(self) -> None:
        self.fn = None
        if self.block is not None:
            self.block.give()


class _Writer:
    """One writer thread's slot. ``claim`` goes to whoever asks first (``setdefault``,
    one C call): the thread as it begins, or :meth:`_Run.close` for a thread that has
    not begun (which then returns at once). ``ended`` is set as the thread ends."""

    __slots__ = ("claim", "ended")

    def __init__(self) -> None:
        self.claim: dict[str, str] = {}
        self.ended = Flag()


def _writer_main(shared: _Shared, slot: _Writer) -> None:
    if slot.claim.setdefault("by", "writer") != "writer":
        return                              # the run was closed before this thread began
    try:
        while True:
            job = shared.jobs.get()
            if job is None:                 # the producer is done (or the run is closed)
                return
            try:
                if shared.stop.is_set():
                    job.drop()
                else:
                    job.run()
            except BaseException as exc:    # noqa: B036 (handed to the producer)
                shared.fail(exc)
            finally:
                job = None
    finally:
        slot.ended.set()                    # nothing of this save runs here any more


class _Run:
    """One save's files, threads and staging (see the module's docstring)."""

    def __init__(self, specs: list[FileSpec], *, durable: bool, stage_all: bool,
                 staging_bytes: int, path: str, fs_type: str) -> None:
        self.specs = specs
        self.durable = durable
        self.stage_all = stage_all
        self.chunk_bytes = max(_MiB, min(CHUNK_BYTES, staging_bytes))
        self.shared = _Shared(staging_bytes, len(specs))
        self.sinks = [open_sink(s.final, s.size, path, fs_type) for s in specs]
        self.remaining = [0] * len(specs)
        self.order: list[_Chunk] = []
        self.writers: list[_Writer] = []

    # ------------------------------------------------------------------ jobs (writers)

    def _named(self, k: int, exc: OSError) -> CheckpointError:
        err = CheckpointError(f"{self.sinks[k].final}: cannot be written "
                              f"({exc.strerror or exc})")
        err.__cause__ = exc
        return err

    def _open(self, k: int) -> None:
        sink = self.sinks[k]
        try:
            sink.open()
            sink.write_at(0, self.specs[k].header)
            if self.remaining[k] == 0:
                sink.finish(self.durable)
        except OSError as exc:
            raise self._named(k, exc) from exc
        self.shared.opened[k].set()

    def _write(self, k: int, sources: list[tuple[int, Any, Any]]) -> None:
        """Write ``sources`` ([(offset in the file, buffer, its owner)]) to file ``k``; the
        last chunk of a file finishes it."""
        self.shared.opened[k].wait()
        self.shared.check()
        try:
            for at, src, _ in sources:
                self.sinks[k].write_at(at, src)
            with self.shared.count_lock:
                self.remaining[k] -= 1
                last = self.remaining[k] == 0
            if last:
                self.sinks[k].finish(self.durable)
        except OSError as exc:
            raise self._named(k, exc) from exc
        finally:
            sources.clear()

    def _queue(self, job: _Job) -> None:
        self.shared.jobs.put(job)

    # ------------------------------------------------------------------ staging (producer)

    def take(self, nbytes: int, device: Any) -> _Block:
        """A staging block of ``nbytes``, once the blocks alive leave room for it under the
        cap (the producer waits; a failure elsewhere wakes it with _Stopped)."""
        block = _Block(0, self.shared.room)
        for _ in range(_units(nbytes)):
            self.shared.room.take()
            block.units += 1
        self.shared.check()
        owner: Any = None
        if device is not None:
            alloc = get_device_allocator(device.type)
            if alloc is not None:
                owner = alloc.allocate_host(nbytes, device.index)
        if owner is None:
            owner = np.empty(nbytes, np.uint8)
        block.owner = owner
        block.array = np.frombuffer(owner, np.uint8, count=nbytes)
        return block

    def _fill(self, chunk: _Chunk, block: _Block) -> None:
        """Copy ``chunk``'s bytes into ``block``: the device pieces in one batched copy per
        device, CPU bytes with the copy threads."""
        base = block.array.ctypes.data
        batches: dict[Any, tuple[list[TensorPtr], list[TensorPtr]]] = {}
        dense: tuple[TensorPtr, Any] | None = None
        for t, at, n, c in chunk.parts:
            if not _row_major(t):
                if dense is None or dense[0] is not t:
                    host = t if t.device.is_cpu() else clone_tensor_ptr_to_cpu(t)
                    # a dim_order other than 0..n-1 gives a strided view: copy it dense
                    flat: Any = np.ascontiguousarray(host.numpy()).reshape(-1).view(np.uint8)
                    dense = (t, flat)
                copy_buffer(block.array[c:c + n], dense[1][at:at + n])
            elif t.device.is_cpu():
                copy_buffer(block.array[c:c + n], _host_bytes(t)[at:at + n])
            else:
                srcs, outs = batches.setdefault(t.device, ([], []))
                if n == t.nbytes:
                    # the whole tensor: itself (what it shares with the others, one
                    # allocation of a loaded file, is then known without asking the driver)
                    srcs.append(t)
                    outs.append(make_tensor_ptr(list(t.sizes), base + c, type=t.scalar_type))
                else:
                    srcs.append(make_tensor_ptr([n], t.data_ptr + at, type=ScalarType.Byte,
                                                device=t.device))
                    outs.append(make_tensor_ptr([n], base + c, type=ScalarType.Byte))
        for srcs, outs in batches.values():
            d2h_copy(srcs, outs)

    # ------------------------------------------------------------------ the run

    def start(self) -> None:
        """Cut the files in chunks, start the writers, queue the files' opening."""
        per_file = [_chunks(k, s, self.chunk_bytes) for k, s in enumerate(self.specs)]
        for k, chunks in enumerate(per_file):
            self.remaining[k] = len(chunks)
        self.order = _interleave(per_file)
        self.writers = [_Writer() for _ in range(writer_count(len(self.specs)))]
        for slot in self.writers:
            # a bare thread: threading.Thread.start waits on an Event for the thread to
            # begin, and an interrupt in that wait can leave the thread stuck for good
            _thread.start_new_thread(_writer_main, (self.shared, slot))
        for k in range(len(self.specs)):
            self._queue(_Job(functools.partial(self._open, k)))

    def produce(self) -> None:
        """Queue every chunk (staging those that need it); on return no tensor of the
        save is read any more (a background save's staged point)."""
        order, self.order = self.order, []
        for i, chunk in enumerate(order):
            order[i] = None                 # type: ignore[call-overload]
            self.shared.check()
            if chunk.host and not self.stage_all:
                # written from the tensors' own memory (each source keeps its tensor)
                sources: list[tuple[int, Any, Any]] = [
                    (chunk.offset + c, _host_bytes(t)[at:at + n], t) for t, at, n, c in chunk.parts]
                self._queue(_Job(functools.partial(self._write, chunk.file, sources)))
                continue
            device = next((t.device for t, *_ in chunk.parts if not t.device.is_cpu()), None)
            block = self.take(chunk.nbytes, device)
            try:
                self._fill(chunk, block)
                sources = [(chunk.offset, block.array, None)]
                self._queue(_Job(functools.partial(self._write, chunk.file, sources), block))
            except BaseException:
                block.give()
                raise
        for spec in self.specs:
            spec.items = []                 # the tensors are not needed any more

    def produce_or_stop(self) -> None:
        """:meth:`produce`, which a failure in a writer stops (then :meth:`wait` raises
        it)."""
        try:
            self.produce()
        except _Stopped:
            pass

    def wait(self) -> None:
        """Let the writers finish what is queued and end; raise the first failure."""
        for _ in self.writers:
            self.shared.jobs.put(None)
        for slot in self.writers:           # every one started: start() returned
            slot.ended.wait()
        if self.shared.error is not None:
            raise self.shared.error
        self.shared.check()

    def close(self) -> None:
        """Stop and join the writers, drop what is still queued, remove every temporary
        file (nothing once committed). Idempotent."""
        self.shared.stop.set()
        for flag in self.shared.opened:
            flag.set()                      # a writer waiting for a file to open goes on
        for _ in self.writers:
            self.shared.jobs.put(None)
        for slot in self.writers:
            if slot.claim.setdefault("by", "closer") == "writer":
                slot.ended.wait()           # it began: let it finish its job and end
        while True:
            try:
                job = self.shared.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.drop()
        for sink in self.sinks:
            sink.discard()


def run_save(specs: list[FileSpec], commit: Callable[[list[Any]], None], *, durable: bool,
             staging_bytes: int, path: str, fs_type: str) -> None:
    """Write ``specs`` synchronously and hand the complete sinks to ``commit`` (which
    renames them); raise the first failure, leaving no temporary file."""
    run = _Run(specs, durable=durable, stage_all=False, staging_bytes=staging_bytes,
               path=path, fs_type=fs_type)
    # One try, no other in this frame: the line of a nested ``try`` lies outside the
    # handlers around it (CPython 3.11), so an exception raised there would skip them.
    try:
        run.start()
        run.produce_or_stop()
        run.wait()
        commit(run.sinks)
        run.close()
    except BaseException:
        run.close()                         # also finishes a close cut short above
        raise
