"""The ``progress=`` argument of the loader: nothing, a tqdm bar, or the caller's callback."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Union

from etptr.checkpoint._errors import CheckpointError

__all__ = ["BAR_MIN_BYTES", "Progress", "ProgressArg", "check_progress", "reporter"]

#: A callback: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], object]
#: What ``progress=`` accepts.
ProgressArg = Union[None, bool, Progress]

#: With ``progress=None``, loads of more bytes than this show a bar on a terminal.
BAR_MIN_BYTES = 256 << 20


def _have_tqdm() -> bool:
    try:
        return importlib.util.find_spec("tqdm") is not None
    except (ImportError, ValueError):
        return False


def _want_bar(progress: ProgressArg, total: int) -> bool:
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        try:
            tty = bool(isatty()) if isatty is not None else False
        except (ValueError, OSError):          # a closed or odd stderr
            tty = False
        return tty and total > BAR_MIN_BYTES and _have_tqdm()
    if progress is True:
        if not _have_tqdm():
            raise CheckpointError("progress=True draws a tqdm bar, and tqdm is not installed "
                                  "(pip install tqdm, or pass a callable)")
        return True
    return False


def check_progress(progress: object) -> ProgressArg:
    """``progress`` if it is None, a bool or a callable.

    Raises
    ------
    CheckpointError
        Anything else.
    """
    if progress is None or isinstance(progress, bool) or callable(progress):
        return progress
    raise CheckpointError(f"progress={progress!r}: expected None, True, False or a callable "
                          f"(done_bytes, total_bytes)")


@contextmanager
def reporter(progress: ProgressArg, total: int, desc: str) -> Iterator[Progress | None]:
    """What a loader calls as ``report(done_bytes, total_bytes)``, or None.

    ``progress=None`` shows a tqdm bar on stderr when tqdm is installed,
    stderr is a terminal and ``total`` (bytes) is over :data:`BAR_MIN_BYTES`;
    ``True`` always shows one; ``False`` none; a callable is called as is.
    The bar is closed when the block ends.
    """
    if callable(progress) and not isinstance(progress, bool):
        yield progress
        return
    if not _want_bar(progress, total):
        yield None
        return
    bar: Any = importlib.import_module("tqdm").tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
        leave=False)
    shown = [0]

    def update(done: int, _total: int) -> None:
        if done > shown[0]:
            bar.update(done - shown[0])
            shown[0] = done

    try:
        yield update
    finally:
        bar.close()
