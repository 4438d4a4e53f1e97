"""Loads as users meet them: each loader in a process of its own, its first load and a
later one, with the page cache warm, cold or half full, on the file system the checkpoint
lies on.

A program loads its model once, right after it starts: what that first load costs (the
imports, CUDA's and the loader's setup) is what a user waits for. So each loader runs in a
fresh interpreter (``python -c``) that initialises CUDA first (a context exists, as in an
inference server), then times one load, then a second; every tensor lands on the device as
a torch tensor (or a CuPy array without torch) and is checked against the safetensors
library's reading, outside the timing. The page cache is prepared by this process before
each child starts: read through (warm), dropped (``posix_fadvise(POSIX_FADV_DONTNEED)``,
checked with ``mincore``: cold), or every other 64 MiB region dropped (half). A file system
that keeps its pages (tmpfs) cannot be made cold: the table says so.

The loaders: etptr's ``load_safetensors``, the ``safetensors`` library, and, when they
import (the ``peers`` extra), fastsafetensors, InstantTensor, KvikIO (the raw file into
one device buffer: no tensors) and the Run:ai model streamer. Each child also reports the
device memory it took beyond the tensors (``cudaMemGetInfo`` around the load) and, for
etptr, the peak page-locked bytes of its pool.
"""
from __future__ import annotations

import importlib.util
import json
import os
import mmap
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

from etptr.checkpoint import _sinks
from etptr.checkpoint._descriptors import ReadOnlyFile

__all__ = ["CONDITIONS", "LOADERS", "FreshResult", "available", "disk_rate", "evict",
           "file_system", "prepare", "resident_share", "run_fresh", "run_mode"]

MiB = 1 << 20
#: The page-cache conditions a load is timed under.
CONDITIONS = ("warm", "cold", "half")
_REGION = 64 * MiB                      # half: every other region of (at most) this size dropped

# ------------------------------------------------------------------ the page cache


def file_system(path: str) -> str:
    """The type of the file system ``path`` lies on, e.g. ``"ext4"`` or ``"tmpfs"`` (the
    saver's reading of ``/proc/self/mounts``); ``"?"`` where it cannot be told."""
    return _sinks.file_system(path) or "?"


def resident_share(paths: list[str]) -> float:
    """The share of the files' pages in the page cache now (0..1)."""
    have = total = 0
    for p in paths:
        with ReadOnlyFile(p) as f:
            _, _, vec = f.resident(0, os.path.getsize(p))
        have += sum(vec)
        total += len(vec)
    return have / total if total else 1.0


def evict(paths: list[str], every_other: bool = False) -> None:
    """Drop the files' pages from the page cache (all, or every other region of 64 MiB,
    or of an eighth of a smaller file)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)                  # dirty pages are not dropped: write them back
            size = os.path.getsize(p)
            if not every_other:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                continue
            # at least 8 regions a file, so that a small file is half cached too
            region = max(mmap.PAGESIZE, min(_REGION, size // 8 // mmap.PAGESIZE * mmap.PAGESIZE))
            for start in range(0, size, 2 * region):
                os.posix_fadvise(fd, start, region, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_through(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(64 * MiB):
                pass


def prepare(paths: list[str], condition: str) -> tuple[bool, float]:
    """Bring the files' pages to ``condition`` (one of CONDITIONS); ``(achieved, share of
    pages resident)``: False where the file system keeps its pages (tmpfs)."""
    _read_through(paths)
    if condition == "warm":
        return True, resident_share(paths)
    if condition == "half":
        evict(paths, every_other=True)
        share = resident_share(paths)
        return 0.3 < share < 0.7, share
    evict(paths)
    share = resident_share(paths)
    return share < 0.05, share


def disk_rate(paths: list[str], threads: int = 8, request: int = 4 * MiB) -> tuple[float, str]:
    """GB/s of reading the files from a cold page cache the way the disk reads fastest
    (O_DIRECT, ``threads`` requests of ``request`` bytes in flight, into page-aligned
    anonymous memory), and how: the rate no loader of cold files can pass. Where the file
    system takes no O_DIRECT (tmpfs) the files are read buffered, with the cache as it is."""
    evict(paths)
    direct = getattr(os, "O_DIRECT", 0)
    jobs, fds, how = [], [], "O_DIRECT"
    try:
        for p in paths:
            try:
                fd = os.open(p, os.O_RDONLY | direct)
            except OSError:
                fd, how = os.open(p, os.O_RDONLY), "buffered (no O_DIRECT here)"
            fds.append(fd)
            jobs += [(fd, off) for off in range(0, os.path.getsize(p), request)]
        buffers = [mmap.mmap(-1, request) for _ in range(threads)]

        def read(i: int) -> int:
            buf, done = buffers[i], 0
            for fd, off in jobs[i::threads]:
                done += os.preadv(fd, [buf], off)     # the last one may be short
            return done

        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            nbytes = sum(pool.map(read, range(threads)))
        seconds = time.perf_counter() - t
    finally:
        for fd in fds:
            os.close(fd)
    return nbytes / seconds / 1e9, f"{how}, {threads} x {request // MiB} MiB requests"


# ------------------------------------------------------------------ the loaders

# Each loader: the modules it needs, and the body of the child's timed load. The body gets
# ``paths`` (the .safetensors files) and ``device`` (``"cuda:0"`` or ``"cpu"``) and sets
# ``out`` to {name: tensor} (or None for a raw read); ``sync()`` waits for the device.
_LOAD_BODIES = {
    "etptr": (("etptr",), """
        import etptr
        fw = "pt" if torch is not None else ("cupy" if device != "cpu" else "np")
        out = etptr.load_safetensors(paths, device, framework=fw, progress=False)
    """),
    # etptr once its once-per-process setup is paid (timed apart: setup_s): import
    # etptr.cuda and a 4-byte upload start CuPy, the driver table, the copy threads,
    # the pool and the slots; the difference to "etptr" is what the first load pays
    "etptr-set-up": (("etptr",), """
        import etptr
        fw = "pt" if torch is not None else ("cupy" if device != "cpu" else "np")
        out = etptr.load_safetensors(paths, device, framework=fw, progress=False)
    """),
    "safetensors": (("safetensors",), """
        if torch is not None:
            import safetensors.torch as st
            out = {}
            for p in paths:
                out.update(st.load_file(p, device=device))
        else:
            import safetensors.numpy as sn
            out = {}
            for p in paths:
                out.update(sn.load_file(p))
            if device != "cpu":
                out = {k: cupy.asarray(v) for k, v in out.items()}
    """),
    "fastsafetensors": (("fastsafetensors", "torch"), """
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup
        loader = SafeTensorsFileLoader(SingleGroup(), torch.device(device), nogds=True)
        loader.add_filenames({0: list(paths)})
        fb = loader.copy_files_to_device()
        out = {k: fb.get_tensor(k).clone() for k in fb.key_to_rank_lidx}
        fb.close()
        loader.close()
    """),
    "instanttensor": (("instanttensor", "torch"), """
        from instanttensor import safe_open
        out = {}
        with safe_open(list(paths), framework="pt", device=0) as f:
            for name, tensor in f.tensors():
                out[name] = tensor.clone()
    """),
    "kvikio": (("kvikio", "cupy"), """
        import kvikio
        out = None
        bufs = []
        for p in paths:
            buf = cupy.empty(os.path.getsize(p), dtype=cupy.uint8)
            with kvikio.CuFile(p, "r") as f:
                f.read(buf)
            bufs.append(buf)
    """),
    "runai": (("runai_model_streamer", "torch"), """
        from runai_model_streamer import SafetensorsStreamer
        out = {}
        with SafetensorsStreamer() as s:
            for p in paths:
                s.stream_file(p)
                for name, tensor in s.get_tensors():
                    out[name] = tensor.to(device)
    """),
}

#: Code run and timed apart before a loader's first load.
_SETUPS = {
    "etptr-set-up": "import etptr, etptr.cuda\n"
                    "if device != 'cpu':\n"
                    "    etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1], [0.0]), device)\n",
}

#: The loaders, in the order of the table.
LOADERS = tuple(_LOAD_BODIES)


def available(name: str) -> bool:
    """Whether loader ``name``'s modules import here (without importing them)."""
    modules = _LOAD_BODIES[name][0]
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except (ImportError, ValueError):
        return False


_CHILD = """
import hashlib, json, os, sys, time
paths, device, check = {paths!r}, {device!r}, {check!r}
try:
    import torch
except ImportError:
    torch = None
cupy = None
if device != "cpu":
    if torch is not None:
        torch.cuda.init()
        torch.empty(1, device=device)          # a context exists before the timing
        sync = lambda: torch.cuda.synchronize()
        free = lambda: torch.cuda.mem_get_info()[0]
    else:
        import cupy
        cupy.cuda.Device(0).use()
        cupy.empty(1)
        sync = lambda: cupy.cuda.Device(0).synchronize()
        free = lambda: cupy.cuda.runtime.memGetInfo()[0]
else:
    sync = lambda: None
    free = lambda: 0

def load():
{body}
    return out

def nbytes(out):
    if out is None:
        return sum(os.path.getsize(p) for p in paths)
    return sum(int(t.nbytes) for t in out.values())

report = {{}}
if {setup!r}:
    t = time.perf_counter()
    exec({setup!r})
    sync()
    report["setup_s"] = time.perf_counter() - t
before = free()
t = time.perf_counter()
out = load()
sync()
report["first_s"] = time.perf_counter() - t
report["bytes"] = nbytes(out)
report["device_bytes"] = before - free() - (report["bytes"] if out is not None else 0)
if check and out is not None:
    import numpy as np
    digests = {{}}
    for k, v in out.items():
        if torch is not None and isinstance(v, torch.Tensor):
            raw = v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        elif hasattr(v, "get"):
            raw = v.get().view(np.uint8).reshape(-1)
        else:
            raw = np.ascontiguousarray(v).view(np.uint8).reshape(-1)
        digests[k] = hashlib.sha1(raw.tobytes()).hexdigest()
    report["digests"] = digests
del out
t = time.perf_counter()
out = load()
sync()
report["later_s"] = time.perf_counter() - t
if device != "cpu" and "etptr.cuda._copy_engine" in sys.modules:   # the pool's peak, the ring
    import etptr.cuda
    cfg = etptr.cuda.get_copy_config()
    report["pinned_peak"] = (etptr.cuda.get_pinned_host_pool().stats()["peak_bytes"]
                             + cfg["slots"] * cfg["slot_bytes"])
print("FRESH " + json.dumps(report))
"""


@dataclass
class FreshResult:
    """One loader's fresh-process run.

    Attributes
    ----------
    loader, condition : str
    resident : float
        Share of the files' pages in the page cache when the child started.
    first_s, later_s : float or None
        Seconds of the first load and of the second, in the same child.
    nbytes : int
        Bytes loaded.
    device_bytes : int or None
        Device memory the load took beyond its tensors (cudaMemGetInfo).
    pinned_peak : int or None
        etptr: the pool's peak page-locked bytes.
    setup_s : float or None
        Seconds of the setup run before the first load (``etptr-set-up``).
    digests : dict of str to str
        sha1 of each tensor's bytes, for the bit check.
    error : str or None
        Why the child failed.
    """

    loader: str
    condition: str
    resident: float
    first_s: Optional[float] = None
    later_s: Optional[float] = None
    nbytes: int = 0
    device_bytes: Optional[int] = None
    pinned_peak: Optional[int] = None
    setup_s: Optional[float] = None
    digests: dict = field(default_factory=dict)
    error: Optional[str] = None

    def gbps(self, which: str) -> Optional[float]:
        """GB/s of the ``"first"`` or ``"later"`` load."""
        s = self.first_s if which == "first" else self.later_s
        return self.nbytes / s / 1e9 if s else None


def run_fresh(loader: str, paths: list[str], device: str, condition: str,
              check: bool = True, timeout: float = 900) -> FreshResult:
    """Time ``loader`` on ``paths`` in a fresh interpreter after preparing the page cache
    for ``condition``; see the module's docstring."""
    achieved, share = prepare(paths, condition)
    result = FreshResult(loader, condition, share)
    if not achieved:
        result.error = (f"the page cache cannot be made {condition} here "
                        f"({share:.0%} of the pages stay resident: tmpfs, or mapped by a process)")
        return result
    body = textwrap.indent(textwrap.dedent(_LOAD_BODIES[loader][1]).strip("\n"), "    ")
    code = _CHILD.format(paths=[str(p) for p in paths], device=device, check=check, body=body,
                         setup=_SETUPS.get(loader, ""))
    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=os.path.dirname(str(paths[0])))
    except subprocess.TimeoutExpired:
        result.error = f"did not finish in {timeout:.0f} s"
        return result
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FRESH ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        result.error = tail[-1][:200] if tail else f"exit status {proc.returncode}"
        return result
    report: dict[str, Any] = json.loads(lines[-1][len("FRESH "):])
    result.first_s = report.get("first_s")
    result.later_s = report.get("later_s")
    result.nbytes = report.get("bytes", 0)
    result.device_bytes = report.get("device_bytes")
    result.pinned_peak = report.get("pinned_peak")
    result.setup_s = report.get("setup_s")
    result.digests = report.get("digests", {})
    return result


# ------------------------------------------------------------------ etptr-bench --fresh

_REFERENCE = "safetensors"


def _label(loader: str, device: str) -> str:
    if loader == "etptr-set-up":
        return "etptr, its setup paid first" + (" (a map)" if device == "cpu" else "")
    if loader == "etptr" and device == "cpu":
        return "etptr (a map: pages are read when first touched)"
    if loader == "kvikio":
        return "kvikio (raw file into one buffer, no tensors)"
    return loader


def run_mode(args: Any, env: Any, out: Any, paths: list) -> tuple[int, dict]:
    """``etptr-bench --fresh``: every loader of ``args.loaders`` (default: those that
    import) under every condition of ``args.cache``, each in a fresh process; prints the
    table and returns ``(status, report)``: status 1 when a loader's tensors differ from
    the safetensors library's."""
    from etptr.bench._checkpoint import resolve
    from etptr.bench._report import fmt_gbps, fmt_ratio, fmt_size, ratio, table

    files = [str(f.path) for f in resolve(paths)]
    nbytes = sum(os.path.getsize(f) for f in files)
    device = env.device if env.available else "cpu"
    # on the CPU etptr sets nothing up (it maps the file): no row for a setup paid first
    loaders = list(args.loaders or [name for name in LOADERS if available(name)
                                    and not (name in _SETUPS and device == "cpu")])
    missing = [name for name in LOADERS if name not in loaders]
    fs = file_system(files[0])
    out(f"fresh processes: {len(files)} file(s), {fmt_size(nbytes)} on {fs} "
        f"({os.path.dirname(os.path.abspath(files[0]))}) -> {device}")
    if missing:
        out(f"not run (not importable here, or not asked for): {', '.join(missing)}")
    disk, how = disk_rate(files)
    out(f"the file system reads these files at {fmt_gbps(disk)} GB/s from a cold cache "
        f"({how}): the bound of a cold load")
    results: list[FreshResult] = []
    for condition in args.cache:
        for loader in loaders:
            r = run_fresh(loader, files, device, condition)
            results.append(r)
            if not args.no_progress:
                print(f"  {condition:>4} {loader}: "
                      + (r.error or f"{r.first_s:.2f} s, later {r.later_s:.2f} s"),
                      file=sys.stderr, flush=True)
    reference = {r.condition: r.digests for r in results
                 if r.loader == _REFERENCE and r.digests}
    rows, bad, report_rows, notes = [], {}, [], []
    for r in results:
        is_map = r.loader.startswith("etptr") and device == "cpu"
        if r.error:
            notes.append(f"{r.condition} {r.loader}: {r.error}")
        ref = reference.get(r.condition)
        differ = None
        if ref is not None and r.digests and r.loader != _REFERENCE:
            differ = sorted(k for k in ref if r.digests.get(k) != ref[k])
            if differ:
                bad[f"{r.condition}.{r.loader}"] = differ
        mine = next((x for x in results if x.loader == "etptr" and x.condition == r.condition),
                    None)
        first = r.gbps("first")
        bound = disk if r.condition != "warm" and fs != "tmpfs" and not is_map else None
        rows.append([_label(r.loader, device), r.condition,
                     f"{r.resident:.0%}",
                     f"{r.first_s:.2f}" if r.first_s else "-", fmt_gbps(first),
                     fmt_gbps(r.gbps("later")), fmt_ratio(ratio(first, bound)),
                     fmt_ratio(ratio(mine.gbps("first"), first))
                     if mine and not r.loader.startswith("etptr") else "-",
                     fmt_size(max(r.device_bytes, 0))
                     if r.device_bytes is not None and device != "cpu" else "-",
                     ("ok" if differ == [] else f"{len(differ)} differ" if differ else "-")
                     if not r.error else "not run (below)"])
        report_rows.append({"loader": r.loader, "condition": r.condition,
                            "map": is_map,
                            "resident": r.resident, "first_s": r.first_s,
                            "later_s": r.later_s, "bytes": r.nbytes,
                            "first_gbps": first, "later_gbps": r.gbps("later"),
                            "device_bytes": r.device_bytes, "pinned_peak": r.pinned_peak,
                            "setup_s": r.setup_s,
                            "differ": differ, "error": r.error})
    out("")
    out(table(["loader (fresh process)", "cache", "resident", "first s", "first GB/s",
               "later GB/s", "x disk", "etptr x", "extra device", "vs safetensors"], rows))
    out("  first: the first load in the process"
        + (" (CUDA already initialised)" if device != "cpu" else "")
        + "; later: a second load in the same process; x disk: first load / the cold read "
        "rate above (cold and half); etptr x: etptr's first-load rate / this loader's"
        + ("; extra device: device memory taken beyond the tensors" if device != "cpu" else ""))
    for note in notes:
        out(f"  {note}")
    if device == "cpu":
        out("  on the CPU etptr maps the file, and so does the safetensors library with torch: "
            "pages are read when first touched, so a first load there is a map's time, not "
            "a read's")
    for r in results:
        if r.setup_s is not None and r.first_s:
            plain = next((x for x in results if x.loader == "etptr"
                          and x.condition == r.condition and x.first_s), None)
            what = "import etptr.cuda" + (", a 4-byte upload" if device != "cpu" else "")
            out(f"  {r.condition}: etptr's once-per-process setup ({what}) took "
                f"{r.setup_s * 1e3:.0f} ms; the first load after it "
                f"{r.first_s * 1e3:.0f} ms"
                + (f", against {plain.first_s * 1e3:.0f} ms for a first load that pays it"
                   if plain else ""))
    peak = [r.pinned_peak for r in results if r.pinned_peak]
    if peak:
        out(f"  etptr's page-locked memory at its peak: {fmt_size(max(peak))}")
    for key, names in bad.items():
        out(f"differ from the safetensors library ({key}): {', '.join(names[:5])}")
    report = {"files": files, "bytes": nbytes, "file_system": fs, "device": device,
              "disk_gbps": disk, "disk_read": how, "fresh": report_rows, "mismatches": bad}
    return (1 if bad else 0), report
