"""Checkpoint saves in ``etptr-bench``: each saver on the file systems named, beside the
file system's own write rate measured in the same run.

On each directory (``--dir``, default the system temporary directory, and ``/dev/shm``
with ``--tmpfs``) and for one file and ``--shards`` files, in turns (every case once per
round, ``--save-repeats`` rounds after one untimed round; outputs removed and ``sync()``
called between two timed writes, untimed):

* ``etptr.save_safetensors`` (one file; sharded with ``max_shard_size`` = bytes / shards);
* the background save (one file): the time from the call until the tensors are free
  (``staged``: the copy-out) and until the file is complete, with the default staging
  cap (the whole checkpoint) and with ``--staging-cap``;
* ``durable=True`` (one file and sharded, one timed pass, not on tmpfs);
* ``.cpu()`` of each torch tensor + ``safetensors.torch.save_file`` (one file), and
  fastsafetensors' ``ParallelSaver`` (1 and ``--shards`` shards) when importable;
* the raw write rate: the same bytes, already in host memory, into as many new files
  (the best of ``pwrite`` from the copy threads' count of threads and of a reserved shared
  map filled by the copy threads), renamed as a saver renames them.

Every rate is printed with its conditions: the directory and its file system, the
bytes, the files, and that it ran in the benchmark's process (not a fresh one).
"""
from __future__ import annotations

import math
import mmap
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

import etptr
from etptr._core._host_copy import copy_buffer
from etptr.bench._report import fmt_gbps, fmt_ratio, fmt_size, ratio, table
from etptr.bench._timing import GB, Timing
from etptr.checkpoint._shards import split
from etptr.checkpoint._sinks import copy_threads, file_system, write_path

__all__ = ["SaveRun", "measure_saves", "save_table", "save_dirs"]


def save_dirs(user_dir: Optional[str], tmpfs: bool) -> list[tuple[str, str]]:
    """``[(tag, directory)]``: the user's directory (or the system temporary one), and
    /dev/shm when ``tmpfs``."""
    out = [("dir", user_dir or tempfile.gettempdir())]
    if tmpfs and os.path.realpath(out[0][1]) != "/dev/shm":
        out.append(("tmpfs", "/dev/shm"))
    return out


@dataclass
class _Case:
    key: str
    label: str
    files: int
    run: Callable[[str], Any]            # run(directory) -> what it returns
    held: bool = False                   # a background save: also time its staged point
    rounds: Optional[int] = None         # timed rounds (None: the run's)


@dataclass
class SaveRun:
    """What :func:`measure_saves` measured: ``timings[key]`` (seconds per save, bytes),
    ``labels``, ``held[key]`` (a background save's seconds until staged), each case's
    directory, file system and file count in ``where``."""

    timings: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


class _Sized:
    def __init__(self, tensor):
        self.tensor = tensor


def _balanced(sizes: list[int], files: int) -> list[list[int]]:
    """Indices of ``sizes`` spread over ``files`` files, largest first into the emptiest."""
    out: list[list[int]] = [[] for _ in range(files)]
    load = [0] * files
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = load.index(min(load))
        out[k].append(i)
        load[k] += sizes[i]
    return out


def _raw_pwrite(directory: str, parts: list[list[np.ndarray]]) -> None:
    """Every file's arrays written with pwrite by the copy threads' count of threads,
    pieces of up to 64 MiB of all files interleaved; then renamed."""
    tmp = [os.path.join(directory, f".raw{k}.tmp") for k in range(len(parts))]
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for p in tmp]
    try:
        tasks = []
        for fd, arrays in zip(fds, parts):
            at = 0
            for a in arrays:
                view = memoryview(a.reshape(-1).view(np.uint8))
                for s in range(0, len(view), 64 << 20):
                    tasks.append((fd, view[s:s + (64 << 20)], at + s))
                at += a.nbytes
        tasks.sort(key=lambda t: t[2])

        def write(task):
            fd, view, at = task
            while len(view):
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n

        with ThreadPoolExecutor(copy_threads()) as ex:
            list(ex.map(write, tasks))
    finally:
        for fd in fds:
            os.close(fd)
    for k, p in enumerate(tmp):
        os.replace(p, os.path.join(directory, f"raw{k}"))


def _raw_map(directory: str, parts: list[list[np.ndarray]]) -> None:
    """Every file reserved (posix_fallocate), mapped and filled by the copy threads, the
    files at once; then renamed."""
    def one(k):
        path = os.path.join(directory, f".raw{k}.tmp")
        size = sum(a.nbytes for a in parts[k])
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
                with memoryview(mm) as view:
                    at = 0
                    for a in parts[k]:
                        with view[at:at + a.nbytes] as dst:
                            copy_buffer(dst, a.reshape(-1).view(np.uint8))
                        at += a.nbytes
                mm.close()
        finally:
            os.close(fd)
        os.replace(path, os.path.join(directory, f"raw{k}"))

    with ThreadPoolExecutor(min(len(parts), 8)) as ex:
        list(ex.map(one, range(len(parts))))


def _fastsafetensors_saver():
    try:
        from fastsafetensors import ParallelSaver
    except ImportError:
        try:
            from fastsafetensors.saver import ParallelSaver
        except ImportError:
            return None
    return ParallelSaver


def _clear(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def measure_saves(env, tensors: dict, arrays: list, nbytes: int, *, torch_tensors=None,
                  dirs: list[tuple[str, str]], shards: int, rounds: int, staging_cap: int,
                  durable: bool, out: Callable[[str], None]) -> SaveRun:
    """Time every save case (see the module's docstring) on every directory of ``dirs``.

    ``tensors``: name -> TensorPtr (on the device, or CPU without CUDA); ``arrays``: the
    same bytes in host memory (the raw writes' source); ``torch_tensors``: name -> torch
    tensor on the device, or None.
    """
    res = SaveRun()
    sync = env.sync if env.available else (lambda: None)
    shard_bytes = max(1, math.ceil(nbytes / shards))
    sizes = [a.nbytes for a in arrays]
    ParallelSaver = _fastsafetensors_saver() if torch_tensors is not None else None
    if torch_tensors is not None and ParallelSaver is None:
        res.notes.append("fastsafetensors is not importable: its ParallelSaver rows are "
                         "skipped")
    for tag, directory in dirs:
        fs = file_system(directory) or "?"
        try:
            work = tempfile.mkdtemp(prefix="etptr-bench-save-", dir=directory)
        except OSError as exc:
            res.notes.append(f"{directory}: cannot be written ({exc.strerror or exc}); "
                             f"its saves are skipped")
            continue
        cases = _cases(tag, tensors, torch_tensors, ParallelSaver, arrays, sizes, shards,
                       shard_bytes, staging_cap, durable and fs not in ("tmpfs", "ramfs"))
        try:
            _run_cases(res, cases, work, directory, fs, nbytes, rounds, sync, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return res


def _cases(tag, tensors, torch_tensors, ParallelSaver, arrays, sizes, shards, shard_bytes,
           staging_cap, durable) -> list[_Case]:
    p = f"save.{tag}."
    # the files a sharded save makes (transformers' split): the peers and the raw write
    # rate of the sharded rows write as many
    shards = len(split([_Sized(t) for t in tensors.values()], shard_bytes))
    one = [[a for a in arrays]]
    many = [[arrays[i] for i in idx] for idx in _balanced(sizes, shards)]

    def save(**kw):
        return lambda d: etptr.save_safetensors(tensors, os.path.join(d, "etptr"), **kw)

    def background(**kw):
        return lambda d: etptr.save_safetensors(tensors, os.path.join(d, "etptr"),
                                                background=True, **kw)

    cases = [
        _Case(p + "etptr.1", "etptr.save_safetensors", 1, save()),
        _Case(p + "etptr.n", f"etptr.save_safetensors(max_shard_size={fmt_size(shard_bytes)})",
              shards, save(max_shard_size=shard_bytes)),
        _Case(p + "bg.1", "etptr.save_safetensors(background=True)", 1, background(),
              held=True),
        _Case(p + "bg_cap.1", f"etptr.save_safetensors(background=True, staging_bytes="
                              f"{fmt_size(staging_cap)})", 1,
              background(staging_bytes=staging_cap), held=True),
    ]
    if torch_tensors is not None:
        import safetensors.torch as st_torch
        on_cpu = all(v.device.type == "cpu" for v in torch_tensors.values())
        cases.append(_Case(p + "torch.1", ("" if on_cpu else ".cpu() + ")
                           + "safetensors.torch.save_file", 1,
                           lambda d: st_torch.save_file(
                               {k: v.cpu() for k, v in torch_tensors.items()},
                               os.path.join(d, "torch.safetensors"))))
    if ParallelSaver is not None:
        for n, key in ((1, "1"), (shards, "n")):
            cases.append(_Case(p + f"fastsafetensors.{key}",
                               f"fastsafetensors ParallelSaver(num_shards={n})", n,
                               lambda d, n=n: ParallelSaver(num_shards=n).save(
                                   torch_tensors, os.path.join(d, "fst"))))
    cases += [
        _Case(p + "raw.1", "raw write rate (best of pwrite and a reserved map)", 1,
              lambda d: _best_raw(d, one)),
        _Case(p + "raw.n", "raw write rate (best of pwrite and a reserved map)", shards,
              lambda d: _best_raw(d, many)),
    ]
    if durable:
        cases += [
            _Case(p + "etptr_durable.1", "etptr.save_safetensors(durable=True)", 1,
                  save(durable=True), rounds=1),
            _Case(p + "etptr_durable.n", f"etptr.save_safetensors(max_shard_size="
                                         f"{fmt_size(shard_bytes)}, durable=True)", shards,
                  save(max_shard_size=shard_bytes, durable=True), rounds=1),
        ]
    return cases


def _best_raw(directory: str, parts: list[list[np.ndarray]]) -> dict:
    """Both raw ways, each timed alone (the directory cleared and synced between them):
    {way: seconds}."""
    times = {}
    for way, fn in (("pwrite", _raw_pwrite), ("map", _raw_map)):
        _clear(directory)
        os.sync()
        t0 = time.perf_counter()
        fn(directory, parts)
        times[way] = time.perf_counter() - t0
    return times


def _run_cases(res, cases, work, directory, fs, nbytes, rounds, sync, out) -> None:
    samples: dict[str, list[float]] = {c.key: [] for c in cases}
    held: dict[str, list[float]] = {c.key: [] for c in cases if c.held}
    ways: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds + 1):                      # round 0 is untimed
        for c in cases:
            if c.rounds is not None and r > c.rounds:
                continue
            _clear(work)
            os.sync()
            sync()
            t0 = time.perf_counter()
            got = c.run(work)
            if c.held:
                got.wait_staged()
                t_held = time.perf_counter() - t0
                got.result()
            sync()
            dt = time.perf_counter() - t0
            if isinstance(got, dict):                # a raw write: its ways' own times
                for way, s in got.items():
                    ways.setdefault(c.key, {}).setdefault(way, []).append(s)
                dt = min(got.values())
            if r == 0:
                continue
            samples[c.key].append(dt)
            if c.held:
                held[c.key].append(t_held)
    _clear(work)
    for c in cases:
        if not samples[c.key]:
            continue
        res.timings[c.key] = Timing(tuple(samples[c.key]), nbytes=nbytes, count=c.files)
        res.labels[c.key] = c.label
        res.where[c.key] = (directory, fs, c.files)
        if c.held:
            res.held[c.key] = Timing(tuple(held[c.key]), nbytes=nbytes, count=c.files)
    for key, by_way in ways.items():
        for way, s in by_way.items():
            wk = f"{key}.{way}"
            res.timings[wk] = Timing(tuple(s[1:]) or tuple(s), nbytes=nbytes)
            res.labels[wk] = f"raw {way}"
            res.where[wk] = res.where[key]


def save_table(res: SaveRun, stat: str, nbytes: int, line_d2h: Optional[float],
               shards: int, rounds: int) -> tuple[str, dict]:
    """The save table (one block per directory) and its ratios: etptr against
    fastsafetensors and against the raw write rate of the same bytes and file count; the
    background save's hold time against a device -> host copy of the bytes at the line."""
    def g(key):
        t = res.timings.get(key)
        return t.gbps(stat) if t is not None else None

    blocks, ratios = [], {}
    tags = []
    for key in res.timings:
        tag = key.split(".")[1]
        if tag not in tags:
            tags.append(tag)
    for tag in tags:
        p = f"save.{tag}."
        directory, fs, _ = next(w for k, w in res.where.items() if k.startswith(p))
        rows = []
        for key, t in res.timings.items():
            if not key.startswith(p) or key.count(".") > 3:
                continue
            files = res.where[key][2]
            raw = g(p + ("raw.1" if files == 1 else "raw.n"))
            fst = g(p + ("fastsafetensors.1" if files == 1 else "fastsafetensors.n"))
            st = g(p + "torch.1") if files == 1 else None
            mine = key.split(".")[2].startswith("etptr") or key.split(".")[2].startswith("bg")
            row = [res.labels[key], str(files), fmt_gbps(g(key)),
                   fmt_ratio(ratio(g(key), raw)) if mine else "-",
                   fmt_ratio(ratio(g(key), st)) if mine else "-",
                   fmt_ratio(ratio(g(key), fst)) if mine else "-"]
            if key in res.held:
                h = res.held[key].seconds(stat)
                row.append(f"{h * 1e3:.0f} ms")
                if line_d2h:
                    row.append(fmt_ratio(h / (nbytes / (line_d2h * GB))))
            rows.append(row)
            ratios[key] = {"gbps": g(key), "raw": ratio(g(key), raw) if mine else None,
                           "safetensors": ratio(g(key), st) if mine else None,
                           "fastsafetensors": ratio(g(key), fst) if mine else None}
            if key in res.held:
                ratios[key]["held_s"] = res.held[key].seconds(stat)
        for key in (p + "raw.1", p + "raw.n"):
            for way in ("pwrite", "map"):
                if f"{key}.{way}" in res.timings:
                    files = res.where[key][2]
                    rows.append([f"  of which {way}", str(files),
                                 fmt_gbps(g(f"{key}.{way}")), "-", "-", "-"])
        headers = [f"saves into {directory} ({fs}), {fmt_size(nbytes)}, {stat} of {rounds} "
                   f"rounds in this process", "files", "GB/s", "x raw", "x safetensors",
                   "x fastsafetensors", "tensors held"]
        if line_d2h:
            headers.append("held / D2H at line")
        blocks.append(table(headers, [r + ["-"] * (len(headers) - len(r)) for r in rows]))
    text = "\n\n".join(blocks)
    text += (f"\n  etptr writes through {write_path()} ({copy_threads()} copy threads); "
             f"sharded rows: max_shard_size = bytes / {shards}; 'tensors held': from the call "
             f"until the background save has copied every byte out")
    if line_d2h:
        text += (f"; 'held / D2H at line': that time over {fmt_size(nbytes)} at the pinned "
                 f"line rate measured in this run ({line_d2h:.1f} GB/s)")
    for note in res.notes:
        text += f"\n  {note}"
    return text, ratios
