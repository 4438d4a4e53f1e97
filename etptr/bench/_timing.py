"""Timing for ``etptr-bench``: every figure the command prints goes through :func:`measure`.

A measurement is a list of :class:`Case` objects run by :func:`run_cases`
under one progress bar. Each case is timed as ``warmup`` untimed calls
followed by ``repeats`` timed samples; a sample brackets ``number`` calls
with ``sync()`` (device synchronisation for GPU work) and ``perf_counter``,
with the garbage collector paused, and the result of the last call is
dropped only after the clock stops.

Throughput is reported in GB/s, where 1 GB = 1e9 bytes.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

GB = 1e9
STATS = ("median", "best")


def _no_sync():
    return None


@dataclass(frozen=True)
class Timing:
    """The samples of one measured operation.

    Attributes
    ----------
    samples : tuple of float
        Seconds per call, one entry per timed repeat.
    nbytes : int
        Bytes one call moves (0 for metadata operations).
    count : int
        Items (tensors) one call handles, for per-item times.
    """

    samples: tuple
    nbytes: int = 0
    count: int = 1

    @property
    def best(self) -> float:
        """Fastest sample, seconds per call."""
        return min(self.samples)

    @property
    def median(self) -> float:
        """Median sample, seconds per call."""
        return statistics.median(self.samples)

    def seconds(self, stat: str) -> float:
        """Seconds per call by ``stat`` ("median" or "best")."""
        return self.best if stat == "best" else self.median

    def gbps(self, stat: str) -> Optional[float]:
        """Throughput in GB/s (1e9 bytes/s) by ``stat``; None for operations that move no bytes."""
        secs = self.seconds(stat)
        if not self.nbytes or secs <= 0:
            return None
        return self.nbytes / secs / GB

    def as_dict(self) -> dict:
        """Plain figures for the JSON report."""
        return {
            "nbytes": self.nbytes,
            "count": self.count,
            "samples_s": list(self.samples),
            "best_s": self.best,
            "median_s": self.median,
            "best_gbps": self.gbps("best"),
            "median_gbps": self.gbps("median"),
        }


def measure(fn: Callable[[], object], *, repeats: int, warmup: int = 1, number: int = 1,
            sync: Optional[Callable[[], object]] = None, nbytes: int = 0, count: int = 1,
            tick: Optional[Callable[[], object]] = None) -> Timing:
    """Time ``fn`` and return a :class:`Timing`.

    Parameters
    ----------
    fn : callable with no arguments
        The operation; its return value is kept until the clock stops, so
        freeing it is never timed (except between the ``number`` calls of
        one sample).
    repeats : int, >= 1
        Timed samples.
    warmup : int, >= 0
        Untimed calls before the first sample.
    number : int, >= 1
        Calls per sample; a sample's time is divided by ``number``.
    sync : callable or None
        Called before the clock starts and before it stops (e.g. a CUDA
        device synchronisation), so that asynchronous work is counted.
    nbytes : int
        Bytes one call moves, for GB/s.
    count : int
        Items one call handles, for per-item times.
    tick : callable or None
        Called after every warm-up call and sample (progress bars).
    """
    if repeats < 1 or warmup < 0 or number < 1:
        raise ValueError(f"repeats={repeats}, warmup={warmup}, number={number}: need "
                         "repeats >= 1, warmup >= 0, number >= 1")
    sync = sync or _no_sync
    for _ in range(warmup):
        out = fn()
        sync()
        del out
        if tick:
            tick()
    samples = []
    gc_was_enabled = gc.isenabled()
    try:
        for _ in range(repeats):
            sync()
            gc.disable()
            t0 = time.perf_counter()
            for _ in range(number):
                out = fn()
            sync()
            elapsed = time.perf_counter() - t0
            if gc_was_enabled:
                gc.enable()
            del out
            samples.append(elapsed / number)
            if tick:
                tick()
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(tuple(samples), nbytes=nbytes, count=count)


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed or the bar is off."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        return None

    def set_postfix_str(self, s="", refresh=True):
        return None


def _progress_bar(total: int, desc: str, progress: bool):
    """A tqdm bar on stderr, drawn only when stderr is a terminal (so logs stay clean);
    a silent stand-in when ``progress`` is false or tqdm is not installed."""
    if not progress:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="run", leave=False, file=sys.stderr,
                disable=None, dynamic_ncols=True)


@dataclass
class Case:
    """One operation to measure.

    Attributes
    ----------
    key : str
        Name in the JSON report, e.g. ``"etptr.h2d"``.
    label : str
        Name in the printed table.
    fn : callable
        The operation (see :func:`measure`).
    nbytes : int
        Bytes one call moves; 0 for metadata operations.
    count : int
        Items (tensors) one call handles.
    number : int
        Calls per sample.
    sync : callable or None
        Synchronisation around each sample.
    repeats : int or None
        Overrides the run's repeat count (large sweep sizes use fewer).
    """

    key: str
    label: str
    fn: Callable[[], object]
    nbytes: int = 0
    count: int = 1
    number: int = 1
    sync: Optional[Callable[[], object]] = None
    repeats: Optional[int] = None


def run_cases(cases, *, repeats: int, warmup: int, progress: bool = True,
              desc: str = "etptr-bench") -> dict:
    """Run every case under one tqdm progress bar (on stderr, when it is a terminal and
    tqdm is installed).

    Returns
    -------
    dict
        ``{case.key: Timing}`` in the order of ``cases``.
    """
    cases = list(cases)
    total = sum(warmup + (c.repeats or repeats) for c in cases)
    results = {}
    with _progress_bar(total, desc, progress) as bar:
        for case in cases:
            bar.set_postfix_str(case.label, refresh=False)
            results[case.key] = measure(
                case.fn, repeats=case.repeats or repeats, warmup=warmup, number=case.number,
                sync=case.sync, nbytes=case.nbytes, count=case.count, tick=bar.update)
    return results
