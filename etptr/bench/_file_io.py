"""File <-> device parts of ``etptr-bench``: loading a checkpoint onto the GPU, for etptr
and the loaders people use, and the bit-for-bit checks of loads and saves.

File -> GPU: ``etptr.load_safetensors(device=)``, ``safetensors.torch.load_file(device=)``
(when torch is importable) and the safetensors library's numpy reading followed by one
``cupy.asarray`` per tensor. Every path reads the same files from a warm page cache (they
are read once before timing starts). Without CUDA, the CPU forms are timed, each labelled
by what it does: ``load_safetensors(device="cpu")`` and ``safetensors.torch.load_file``
map the files (views, no byte read: the keys say ``map``), ``load_safetensors(into=)``
NumPy arrays and ``safetensors.numpy.load_file`` read every byte. The loaded
tensors (etptr's, and torch's when importable) are kept for the saves, which
:mod:`etptr.bench._saves` times on the file systems the user names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

import etptr
from etptr.bench._cpu import mismatches, plain_view
from etptr.bench._timing import Case


def scratch_dir(need_bytes: int, given: Optional[str] = None):
    """A directory for files the benchmark writes: ``given`` (``--dir``) when there is
    one; else a RAM-backed one (``/dev/shm``) when it has room, so that files stay in the
    page cache and writes are not throttled by the disk; else None (the system's
    temporary directory)."""
    if given:
        return given
    for candidate in ("/dev/shm",):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        if os.access(candidate, os.W_OK) and st.f_bavail * st.f_frsize >= need_bytes * 1.25:
            return candidate
    return None


def warm(files) -> None:
    """Read every file once, so that the timed passes find it in the page cache."""
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def _loaded_mismatches(names, arrays, loaded: dict) -> list:
    """Tensors of ``loaded`` (by the reference's names) that differ from the reference."""
    tensors = []
    for name in names:
        t = loaded[name.split(":", 1)[-1]] if name not in loaded else loaded[name]
        tensors.append(t if t.device.is_cpu() else etptr.clone_tensor_ptr_to(t, "cpu"))
    return mismatches(names, arrays, tensors)


@dataclass
class FileCases:
    """The file <-> device cases of one run, and what the checks found."""

    cases: list = field(default_factory=list)
    load_bad: Optional[list] = None      # tensors etptr.load_safetensors got wrong
    save_bad: Optional[list] = None      # tensors etptr.save_safetensors wrote wrong
    tmpdir: Any = None
    loaded: dict = field(default_factory=dict)     # name -> etptr tensor, for the saves
    torch_loaded: Optional[dict] = None            # name -> torch tensor on the device

    def close(self) -> None:
        if self.tmpdir is not None:
            self.tmpdir.cleanup()
            self.tmpdir = None


def _cpu_load_cases(add, args: list, ckpt, use_torch: bool) -> Optional[dict]:
    """The CPU loads, each labelled by what it does (see the module's docstring); returns
    the torch tensors over etptr's views for the saves (None without torch)."""
    add("etptr.map", "etptr.load_safetensors(device='cpu'): a map, no byte read",
        lambda: [etptr.load_safetensors(a, "cpu", progress=False) for a in args])
    targets = {}
    for name, a in zip(ckpt.names, ckpt.arrays):
        targets[name.split(":", 1)[-1]] = np.empty_like(a)
    per_file = [dict(targets)] if len(args) == 1 else [
        {k: targets[k] for k in etptr.checkpoint.read_plan(a).names} for a in args]
    add("etptr.into", "etptr.load_safetensors(into=NumPy arrays): every byte read",
        lambda: [etptr.load_safetensors(a, into=t, progress=False)
                 for a, t in zip(args, per_file)])
    import safetensors.numpy as st_numpy
    files = [str(f) for f in ckpt.files]
    try:
        for f in files:
            st_numpy.load_file(f)
    except Exception:               # noqa: BLE001 - bfloat16 and float8: NumPy has none
        pass
    else:
        add("safetensors.load", "safetensors.numpy.load_file: every byte read",
            lambda: [st_numpy.load_file(f) for f in files])
    if not use_torch:
        return None
    try:
        import safetensors.torch as st_torch
        import torch
    except ImportError:
        return None
    add("torch.map", "safetensors.torch.load_file: a map too, no byte read",
        lambda: [st_torch.load_file(f) for f in files])
    return torch


def file_cases(env, paths, ckpt, progress: bool, where: Optional[str] = None,
               use_torch: bool = True) -> FileCases:
    """Checks, then the timed cases, for files -> ``env.device`` and back (or the CPU
    forms without CUDA). ``ckpt`` is the safetensors library's own reading of ``paths``
    (:func:`etptr.bench._checkpoint.load`), the reference for every check; the saves
    write to ``where`` (``--dir``; see :func:`scratch_dir`); ``use_torch``: False keeps
    torch out of the CPU rows (``--no-torch``)."""
    import tempfile

    nbytes, count = ckpt.nbytes, len(ckpt.arrays)
    out = FileCases(tmpdir=tempfile.TemporaryDirectory(prefix="etptr-bench-",
                                                       dir=scratch_dir(2 * nbytes + (64 << 20), where)))
    warm(ckpt.files)
    device = env.device if env.available and env.etptr_ok else "cpu"
    target = os.path.join(out.tmpdir.name, "etptr.safetensors")
    # Each argument is one checkpoint (a file or an index: names are unique within it).
    # Untimed first: load (with a progress bar for large checkpoints), check, save, check.
    from etptr.bench._checkpoint import load as reference_load
    args = [str(p) for p in paths]
    references = [reference_load([a]) for a in args] if len(args) > 1 else [ckpt]
    loaded = [etptr.load_safetensors(a, device, progress=None if progress else False)
              for a in args]            # None: a bar on a terminal only
    targets = [os.path.join(out.tmpdir.name, f"etptr{i}.safetensors") for i in range(len(args))]
    out.load_bad, out.save_bad = [], []
    for ref, got, target in zip(references, loaded, targets):
        out.load_bad += _loaded_mismatches(ref.names, ref.arrays, got)
        etptr.save_safetensors(got, target)
        out.save_bad += _loaded_mismatches(ref.names, ref.arrays,
                                           etptr.load_safetensors(target, "cpu"))
    sync = env.sync if device != "cpu" else None
    key = "file" if device != "cpu" else "file.cpu"
    for i, got in enumerate(loaded):
        for name, t in got.items():
            out.loaded[name if name not in out.loaded else f"{i}:{name}"] = t

    def add(name, label, fn, sync=sync):
        out.cases.append(Case(f"{key}.{name}", label, fn, nbytes=nbytes, count=count, sync=sync))

    for t in targets:
        os.unlink(t)                 # the checks' files: out of the page cache's way
    if device == "cpu":
        torch = _cpu_load_cases(add, args, ckpt, use_torch)
        if torch is not None:          # the saves' safetensors row: torch over etptr's views
            out.torch_loaded = {k: torch.from_dlpack(v) for k, v in out.loaded.items()}
        return out
    add("etptr.load", f"etptr.load_safetensors(device={device!r})",
        lambda: [etptr.load_safetensors(a, device, progress=False) for a in args])
    cp, torch = env.cupy, env.torch
    add("cupy.load", "safetensors (numpy) + cupy.asarray per tensor",
        lambda: [cp.asarray(plain_view(a)) for a in reference_load(paths).arrays])
    if torch is not None:
        import safetensors.torch as st_torch
        dev = f"cuda:{env.index}"
        files = [str(f) for f in ckpt.files]
        t_loaded = {}
        for f in files:
            t_loaded.update(st_torch.load_file(f, device=dev))
        out.torch_loaded = t_loaded
        add("torch.load", f"safetensors.torch.load_file(device={dev!r})",
            lambda: [st_torch.load_file(f, device=dev) for f in files], env.torch_sync)
    return out


def plot_bars(rows, path, title: str) -> None:
    """A horizontal bar chart of ``rows`` = [(label, GB/s)] to ``path`` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(label, value) for label, value in rows if value is not None]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    maps = [": a map" in r[0] for r in rows][::-1]      # views made, no byte read
    ax.barh([r[0] for r in rows][::-1], [r[1] for r in rows][::-1],
            color=["#bbbbbb" if m else "#4477aa" for m in maps])
    ax.set_xlabel("GB/s (1e9 bytes per second)"
                  + ("; grey: maps (views made, pages read when touched)" if any(maps) else ""))
    ax.set_title(title)
    for i, (_, value) in enumerate(rows[::-1]):
        ax.text(value, i, f" {value:.1f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
