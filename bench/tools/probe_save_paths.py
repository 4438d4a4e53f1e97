"""Probe: the fastest way to put bytes already in host memory into new files, on the file
systems given, for one file and for several (the save's write path).

    PYTHONPATH=. python bench/tools/probe_save_paths.py [--dir DIR ...] [--mib N]
        [--files 1,4] [--threads 2,4] [--rounds 5] [--out FILE]

Each way writes N MiB (split evenly over the files) into new files under temporary
names and renames them, as the saver does; the ways are timed in turns, one file count
at a time, ``--rounds`` rounds, and the median and the best are kept. Between two timed
writes the files are removed and ``sync()`` runs (untimed), so that no write finds the
previous one's dirty pages still queued. The ways:

* ``map+fallocate``: ``posix_fallocate``, a shared map, the copy threads' copy_buffer
  into it (the saver before this probe);
* ``map+ftruncate``: the same on a sparse file (a full disk is then SIGBUS, not an error:
  measured to know what the reservation costs, not a candidate);
* ``pwrite xT``: T Python threads (the GIL is released in ``os.pwrite``) writing pieces of
  ``--piece`` MiB of all the files, from the source memory, with no copy in user space;
* ``fallocate+pwrite xT``: the same after ``posix_fallocate``;
* ``write, 1 thread/file``: ``os.write`` of 64 MiB at a time, one thread per file.

``--durable`` also times each way followed by ``fsync`` of every file (in parallel) and
of the directory. ``--etptr`` adds ``etptr.save_safetensors`` itself through each of its
write paths (``etptr map``, ``etptr pwrite``: ``etptr.checkpoint._sinks.WRITE_PATH``),
of CPU tensors of 16 MiB over the same bytes, one file, or sharded into as many files.
The source is one array of random bytes, faulted in before timing.
"""
import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _probes import say, write_log  # noqa: E402

from etptr._core._host_copy import copy_buffer, cpu_count  # noqa: E402


def _fs_type(path):
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (path + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best):
                best, kind = mnt, fstype
    return kind


def _map_fill(path, src, reserve):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if reserve:
            os.posix_fallocate(fd, 0, len(src))
        else:
            os.ftruncate(fd, len(src))
        mm = mmap.mmap(fd, len(src), flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(mm)
        copy_buffer(view, src)
        view.release()
        mm.close()
    finally:
        os.close(fd)


def _pwrite_pieces(fd, src, piece):
    view = memoryview(src)
    at = 0
    while at < len(src):
        n = os.pwrite(fd, view[at:at + piece], at)
        at += n


def way_map(reserve):
    def run(paths, parts, threads, piece):
        with ThreadPoolExecutor(len(paths)) as ex:
            list(ex.map(lambda pp: _map_fill(pp[0], pp[1], reserve), zip(paths, parts)))
    return run


def way_pwrite(reserve):
    def run(paths, parts, threads, piece):
        fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644) for p in paths]
        try:
            if reserve:
                for fd, part in zip(fds, parts):
                    os.posix_fallocate(fd, 0, len(part))
            tasks = [(fd, memoryview(part)[a:a + piece], a)
                     for fd, part in zip(fds, parts) for a in range(0, len(part), piece)]
            # interleave the files' pieces so that every file is written at once
            tasks.sort(key=lambda t: t[2])
            with ThreadPoolExecutor(threads) as ex:
                list(ex.map(lambda t: _pwrite_pieces(t[0], t[1], len(t[1])) if t[2] == 0
                            else os.pwrite(t[0], t[1], t[2]), tasks))
        finally:
            for fd in fds:
                os.close(fd)
    return run


def way_write(paths, parts, threads, piece):
    def one(p, part):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(part)
            at = 0
            while at < len(part):
                at += os.write(fd, view[at:at + (64 << 20)])
        finally:
            os.close(fd)
    with ThreadPoolExecutor(len(paths)) as ex:
        list(ex.map(lambda pp: one(*pp), zip(paths, parts)))


def way_etptr(path):
    import etptr
    from etptr.checkpoint import _sinks

    def run(paths, parts, threads, piece):
        work = os.path.dirname(paths[0])
        tensors = {}
        for k, part in enumerate(parts):
            for i, at in enumerate(range(0, len(part), 16 << 20)):
                tensors[f"f{k}.t{i:05d}"] = etptr.make_tensor_ptr(part[at:at + (16 << 20)])
        _sinks.WRITE_PATH = path
        try:
            if len(parts) == 1:
                etptr.save_safetensors(tensors, os.path.join(work, ".f0.tmp"))
            else:
                etptr.save_safetensors(tensors, os.path.join(work, "sharded"),
                                       max_shard_size=len(parts[0]))
                for i, name in enumerate(sorted(os.listdir(os.path.join(work, "sharded")))):
                    if name.startswith("model-"):
                        os.rename(os.path.join(work, "sharded", name),
                                  os.path.join(work, f".f{i}.tmp"))
                import shutil
                shutil.rmtree(os.path.join(work, "sharded"))
        finally:
            _sinks.WRITE_PATH = "auto"
    return run


def _sync_all(paths, directory):
    def one(p):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with ThreadPoolExecutor(len(paths)) as ex:
        list(ex.map(one, paths))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", help="directories to write in "
                    "(default: the system temporary directory and /dev/shm)")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--files", default="1,4")
    ap.add_argument("--threads", default="2,4")
    ap.add_argument("--piece", type=int, default=8, help="pwrite piece, MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--etptr", action="store_true",
                    help="also time etptr.save_safetensors through each write path")
    ap.add_argument("--out")
    args = ap.parse_args()
    dirs = args.dir or [tempfile.gettempdir(), "/dev/shm"]
    nbytes = args.mib << 20
    piece = args.piece << 20
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    say(f"probe_save_paths: {args.mib} MiB from host memory into new files | "
        f"{cpu_count()} CPUs, copy threads {min(16, cpu_count())} | rounds {args.rounds} "
        f"in turns | pwrite pieces {args.piece} MiB | sync() between writes, untimed")
    ways = [("map+fallocate", way_map(True)), ("map+ftruncate", way_map(False))]
    for t in [int(x) for x in args.threads.split(",")]:
        ways.append((f"pwrite x{t}", way_pwrite(False), t))
        ways.append((f"fallocate+pwrite x{t}", way_pwrite(True), t))
    ways.append(("write, 1 thread/file", way_write))
    if args.etptr:
        ways += [("etptr map", way_etptr("map")), ("etptr pwrite", way_etptr("pwrite"))]
    ways = [w if len(w) == 3 else (w[0], w[1], 1) for w in ways]
    for d in dirs:
        kind = _fs_type(os.path.realpath(d))
        for nfiles in [int(x) for x in args.files.split(",")]:
            step = nbytes // nfiles
            parts = [src[i * step:(i + 1) * step if i < nfiles - 1 else nbytes]
                     for i in range(nfiles)]
            times = {}
            for durable in ([False, True] if args.durable else [False]):
                for _ in range(args.rounds):
                    for name, fn, threads in ways:
                        work = tempfile.mkdtemp(prefix="probe-save-", dir=d)
                        paths = [os.path.join(work, f".f{i}.tmp") for i in range(nfiles)]
                        os.sync()
                        t0 = time.perf_counter()
                        fn(paths, parts, threads, piece)
                        if durable:
                            _sync_all(paths, work)
                        for i, p in enumerate(paths):
                            os.rename(p, os.path.join(work, f"f{i}"))
                        dt = time.perf_counter() - t0
                        times.setdefault((name, durable), []).append(dt)
                        for i in range(nfiles):
                            os.unlink(os.path.join(work, f"f{i}"))
                        os.rmdir(work)
            say("")
            say(f"{d} ({kind}), {nfiles} file(s), {args.mib} MiB: GB/s median (best)")
            for (name, durable), ts in times.items():
                say(f"  {name + (' + fsync' if durable else ''):32s} "
                    f"{nbytes / statistics.median(ts) / 1e9:6.2f} ({nbytes / min(ts) / 1e9:.2f})")
    if args.out:
        write_log(args.out)


if __name__ == "__main__":
    main()
