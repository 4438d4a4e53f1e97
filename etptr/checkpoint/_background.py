"""Background saves: ``save_safetensors(..., background=True)`` and its :class:`SaveHandle`.

The save runs in a thread of its own. It first copies every byte of the
tensors out into staging blocks (page-locked memory of the device's allocator, at most
``staging_bytes`` alive at once: when the cap is smaller than the checkpoint it waits for
written blocks to come back, it never allocates beyond it), while the writer threads
write the blocks already filled; once the last byte is out the handle is *staged*: the
save holds no reference to the tensors any more, and the caller may change or free them.
The files are then completed, synced when durable, and renamed (the index last); the
handle is *done*, and :meth:`SaveHandle.result` returns or raises what the save raised.

A process that exits with a save in flight waits for it at exit (an ``atexit`` handler
waits for every save in flight), so the save completes; a process killed outright leaves
at most a temporary file (a dot file), never a partial file under a real name. An
exception in the caller's thread while the save is being started (an interrupt) cancels
it and waits for its cleanup before it propagates. The save's thread is a bare one
(``_thread.start_new_thread``, as the writers'): ``threading.Thread.start`` waits on an
Event for the thread to begin, and an interrupt in that wait can leave the thread stuck
for good, and a process with it unable to exit.

Ordering with the GPU: the copies run on the copy engine's stream, which is ordered after
the legacy default stream (as every etptr copy made from a thread with no current CuPy
stream); work queued on other streams that writes the tensors must be complete (or the
stream synchronised) before the call.
"""
from __future__ import annotations

import _thread
import atexit
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etptr.checkpoint._errors import CheckpointError
from etptr.checkpoint._pipeline import FileSpec, Flag, _Run, _Shared, _Stopped

__all__ = ["SaveHandle", "start"]


class SaveHandle:
    """The handle of a background save (``save_safetensors(..., background=True)``).

    Not made directly. Thread-safe.

    Attributes
    ----------
    paths : tuple of pathlib.Path
        The files the save writes, in order (a sharded save's shards, then its index).
    """

    paths: tuple[Path, ...]
    _shared: _Shared
    _staged: Flag
    _done: Flag
    _error: BaseException | None
    _started: float
    _staged_s: float | None
    _done_s: float | None

    def __init__(self) -> None:
        raise TypeError("SaveHandle is returned by save_safetensors(..., background=True)")

    @classmethod
    def _new(cls, paths: tuple[Path, ...], run: _Run) -> SaveHandle:
        self: SaveHandle = object.__new__(cls)
        self.paths = paths
        self._shared = run.shared
        self._staged = Flag()
        self._done = Flag()
        self._error = None
        self._started = time.perf_counter()
        self._staged_s = None
        self._done_s = None
        return self

    def staged(self) -> bool:
        """True once every byte of the tensors has been copied out (or the save failed):
        the caller may then change or free them."""
        return self._staged.is_set()

    def done(self) -> bool:
        """True once the save has finished: its files complete and renamed, or it failed
        (or was cancelled) and left nothing."""
        return self._done.is_set()

    def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`staged` (at most ``timeout`` seconds); return it."""
        return self._staged.wait(timeout)

    def result(self, timeout: float | None = None) -> None:
        """Wait for the save to finish and return None, or raise what it raised.

        Raises
        ------
        CheckpointError
            The save failed (the message names the file), or was cancelled.
        TimeoutError
            ``timeout`` seconds passed first; the save goes on.
        Exception
            Any other failure of the save (a device copy's), as raised.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the background save of {self.paths[0]} is still running "
                               f"after {timeout} s")
        if self._error is not None:
            raise self._error

    def cancel(self) -> bool:
        """Stop the save if its files are not being renamed yet: its temporary files are
        removed, :meth:`result` raises CheckpointError. Returns whether it was stopped
        (False once it is renaming, or done)."""
        if self._done.is_set() or not self._shared.gate.acquire(False):
            return False                    # done, or renaming (it took the gate)
        self._shared.fail(CheckpointError(f"{self.paths[0]}: the background save was "
                                          f"cancelled; nothing was written"))
        return True

    @property
    def staged_seconds(self) -> float | None:
        """Seconds from the call to the staged point (None before it)."""
        return self._staged_s

    @property
    def done_seconds(self) -> float | None:
        """Seconds from the call to the end of the save (None before it)."""
        return self._done_s

    def __repr__(self) -> str:
        state = ("failed" if self._error is not None else "done") if self.done() else \
            ("staged" if self.staged() else "copying")
        return f"<SaveHandle {state} {self.paths[0]}>"

    # the save's thread
    def _mark_staged(self) -> None:
        if self._staged_s is None:
            self._staged_s = time.perf_counter() - self._started
        self._staged.set()

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done_s = time.perf_counter() - self._started
        self._mark_staged()
        self._done.set()


def _begin_commit(run: _Run) -> None:
    if not run.shared.gate.acquire(False):
        raise _Stopped                      # cancelled before the renames: give up
    run.shared.check()


def _produce_and_commit(handle: SaveHandle, run: _Run,
                        commit: Callable[[list[Any]], None]) -> None:
    run.produce_or_stop()
    handle._mark_staged()
    run.wait()
    _begin_commit(run)
    commit(run.sinks)


#: The saves in flight, waited for at exit.
_IN_FLIGHT: set[SaveHandle] = set()


@atexit.register
def _wait_at_exit() -> None:
    for handle in list(_IN_FLIGHT):
        handle._done.wait()


# a forked child has none of the parent's save threads: it must not wait for their saves
os.register_at_fork(after_in_child=_IN_FLIGHT.clear)


def _save_main(handle: SaveHandle, run: _Run, commit: Callable[[list[Any]], None],
               cleanup: Callable[[], None], claim: dict[str, str]) -> None:
    if claim.setdefault("by", "save") != "save":
        return                              # the call gave up before this thread began
    error: BaseException | None = None
    try:
        _produce_and_commit(handle, run, commit)
    except _Stopped:
        error = run.shared.error or CheckpointError(f"{handle.paths[0]}: the background "
                                                    f"save was stopped")
    except BaseException as exc:        # noqa: B036 (handed to result())
        error = exc
    try:
        run.close()
        if error is not None:
            cleanup()
    finally:
        handle._finish(error)
        _IN_FLIGHT.discard(handle)


def start(specs: list[FileSpec], commit: Callable[[list[Any]], None], paths: tuple[Path, ...],
          *, durable: bool, staging_bytes: int, path: str, fs_type: str,
          cleanup: Callable[[], None]) -> SaveHandle:
    """Start a background save of ``specs`` (see the module's docstring); ``commit``
    renames the complete files, ``cleanup`` takes back what the call made before (a
    directory it created) if the save fails."""
    run = _Run(specs, durable=durable, stage_all=True, staging_bytes=staging_bytes,
               path=path, fs_type=fs_type)
    handle = SaveHandle._new(paths, run)
    claim: dict[str, str] = {}              # setdefault: the thread's, or the call's
    try:
        _IN_FLIGHT.add(handle)
        run.start()
        _start_thread(_save_main, (handle, run, commit, cleanup, claim))
        return handle
    except BaseException:
        # an interrupt (or a failure to start a thread): nothing may go on in the background
        if claim.setdefault("by", "call") == "save":
            handle.cancel()                 # it began: stop it and wait for its cleanup
            handle._done.wait()
        _IN_FLIGHT.discard(handle)
        run.close()
        raise


_start_thread = _thread.start_new_thread
