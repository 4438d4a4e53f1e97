"""GPU parts of ``etptr-bench``: CUDA probing, the copy paths, and the pinned line rate.

Every device-side call of the peers goes through CuPy (and torch, when it is
importable and sees CUDA). etptr itself is driven only through its public
API: ``clone_tensor_ptr_to``, ``clone_tensor_ptrs_to`` (the batched round trip)
and, when it exists, ``etptr.empty(..., pinned=True)`` for a page-locked source.

Synchronisation: a case's ``sync`` is ``cudaDeviceSynchronize`` on the
benchmarked device (``torch.cuda.synchronize`` for torch cases), called
before the clock starts and before it stops.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import numpy as np

import etptr
from etptr.bench._cpu import mismatches, plain_view
from etptr.bench._timing import Case


@dataclass
class CudaEnv:
    """What the GPU parts can use in this run.

    Attributes
    ----------
    cupy : module or None
        None when the GPU parts are skipped (``reason`` says why).
    torch : module or None
        torch, when importable and CUDA-capable (``torch_reason`` says why not).
    index : int
        CUDA device index benchmarked.
    name : str
        Device name from the driver.
    etptr_ok : bool
        etptr has a CUDA allocator registered (``etptr_reason`` says why not).
    """

    cupy: object = None
    torch: object = None
    index: int = 0
    name: str = ""
    reason: Optional[str] = None
    torch_reason: Optional[str] = None
    etptr_ok: bool = False
    etptr_reason: Optional[str] = None

    @property
    def available(self) -> bool:
        return self.cupy is not None

    @property
    def device(self) -> str:
        """The etptr device string, ``"cuda:N"``."""
        return f"cuda:{self.index}"

    def context(self):
        """A context manager that makes the benchmarked device current (no-op without CUDA)."""
        if self.cupy is None:
            return contextlib.nullcontext()
        return self.cupy.cuda.Device(self.index)

    def sync(self):
        """``cudaDeviceSynchronize`` on the benchmarked device."""
        self.cupy.cuda.Device(self.index).synchronize()

    def torch_sync(self):
        """``torch.cuda.synchronize`` on the benchmarked device."""
        self.torch.cuda.synchronize(self.index)


def probe(index: int = 0, use_torch: bool = True, force_cpu: bool = False) -> CudaEnv:
    """Find out which GPU parts can run; never raises for a missing GPU stack."""
    env = CudaEnv(index=index)
    if force_cpu:
        env.reason = "--cpu was given"
        return env
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy that cannot load its CUDA libraries
        env.reason = f"CuPy is not importable ({type(exc).__name__}: {exc})"
        return env
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or device
        env.reason = f"CuPy finds no CUDA device ({exc})"
        return env
    if count < 1:
        env.reason = "CuPy finds no CUDA device"
        return env
    if not 0 <= index < count:
        env.reason = f"--device {index} is not present (CuPy sees {count} device(s))"
        return env
    env.cupy = cupy
    name = cupy.cuda.runtime.getDeviceProperties(index).get("name", b"")
    env.name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    try:
        alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    except Exception as exc:
        alloc = None
        env.etptr_reason = f"etptr's CUDA allocator failed to load ({type(exc).__name__}: {exc})"
    if alloc is not None:
        env.etptr_ok = True
    elif env.etptr_reason is None:
        env.etptr_reason = "etptr has no CUDA allocator registered"
    if use_torch:
        try:
            import torch
        except Exception as exc:
            env.torch_reason = f"torch is not importable ({type(exc).__name__})"
        else:
            if torch.cuda.is_available() and index < torch.cuda.device_count():
                env.torch = torch
            else:
                env.torch_reason = "torch sees no CUDA device"
    else:
        env.torch_reason = "--no-torch was given"
    return env


def etptr_pinned_empty(nbytes: int):
    """A page-locked etptr Byte tensor of ``nbytes``, or None where etptr has no
    ``empty(..., pinned=True)`` (feature detection)."""
    try:
        return etptr.empty([nbytes], etptr.ScalarType.Byte, pinned=True)
    except (TypeError, etptr.EtError):
        return None


class RawPinned:
    """The line rate: one ``cudaMemcpyAsync`` between a page-locked host buffer and
    device memory, ``capacity`` bytes each, on a non-blocking stream.

    Call :meth:`close` to give the page-locked memory back to CuPy's pool.
    """

    def __init__(self, cupy, capacity: int):
        self._cp = cupy
        self._rt = cupy.cuda.runtime
        self.capacity = capacity
        self.host = cupy.cuda.alloc_pinned_memory(capacity)
        np.frombuffer(self.host, np.uint8, capacity)[:] = 0x5A
        self.dev = cupy.empty(capacity, dtype=cupy.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def h2d(self, nbytes: int):
        """Queue ``nbytes`` host -> device."""
        self._rt.memcpyAsync(self.dev.data.ptr, self.host.ptr, nbytes,
                             self._rt.memcpyHostToDevice, self.stream.ptr)

    def d2h(self, nbytes: int):
        """Queue ``nbytes`` device -> host."""
        self._rt.memcpyAsync(self.host.ptr, self.dev.data.ptr, nbytes,
                             self._rt.memcpyDeviceToHost, self.stream.ptr)

    def close(self):
        self.stream.synchronize()
        self.host = self.dev = None
        self._cp.get_default_pinned_memory_pool().free_all_blocks()


@dataclass
class Prepared:
    """Device-side state for the checkpoint cases, made before timing starts."""

    cases: list
    round_trip_bad: Optional[list]  # None when etptr was not run
    line: Optional[RawPinned]

    def close(self):
        if self.line is not None:
            self.line.close()


def checkpoint_cases(env: CudaEnv, names, arrays, tensors, line_bytes: int) -> Prepared:
    """Round-trip check and the timed copy cases for a checkpoint.

    Untimed first: every tensor goes up and back down through
    ``clone_tensor_ptr_to`` and is compared bit for bit with its source; the
    device copies then serve as the D2H sources. The peers get their own
    device copies. Call inside ``env.context()``.
    """
    cp, torch = env.cupy, env.torch
    count, nbytes = len(arrays), sum(a.nbytes for a in arrays)
    clone_to = etptr.clone_tensor_ptr_to
    dev = env.device
    cases = []

    def add(key, fn, sync=env.sync):
        cases.append(Case(key, key, fn, nbytes=nbytes, count=count, sync=sync))

    bad = None
    if env.etptr_ok:
        clones_to = etptr.clone_tensor_ptrs_to
        on_dev = [clone_to(t, dev) for t in tensors]
        back = [clone_to(d, "cpu") for d in on_dev]
        batch_dev = clones_to(tensors, dev)
        batch_back = clones_to(batch_dev, "cpu")
        env.sync()
        bad = mismatches(names, arrays, back) + [
            f"{n} (batched)" for n in mismatches(names, arrays, batch_back)]
        del back, batch_back
        add("etptr.h2d", lambda: [clone_to(t, dev) for t in tensors])
        add("etptr.d2h", lambda: [clone_to(d, "cpu") for d in on_dev])
        add("etptr_batch.h2d", lambda: clones_to(tensors, dev))
        add("etptr_batch.d2h", lambda: clones_to(batch_dev, "cpu"))
    plain = [plain_view(a) for a in arrays]
    cp_dev = [cp.asarray(a) for a in plain]
    add("cupy.h2d", lambda: [cp.asarray(a) for a in plain])
    add("cupy.d2h", lambda: [d.get() for d in cp_dev])
    if torch is not None:
        tdev = torch.device("cuda", env.index)
        th_dev = [torch.from_numpy(a).to(tdev) for a in plain]
        add("torch.h2d", lambda: [torch.from_numpy(a).to(tdev) for a in plain], env.torch_sync)
        add("torch.d2h", lambda: [t.cpu() for t in th_dev], env.torch_sync)
    line = RawPinned(cp, line_bytes)
    cases += [
        Case("line.h2d", "line.h2d", lambda: line.h2d(line_bytes), nbytes=line_bytes,
             sync=env.sync),
        Case("line.d2h", "line.d2h", lambda: line.d2h(line_bytes), nbytes=line_bytes,
             sync=env.sync),
    ]
    cases += tiny_cases(env)
    env.sync()
    return Prepared(cases=cases, round_trip_bad=bad, line=line)


TINY_CALLS = 200


def tiny_cases(env: CudaEnv) -> list:
    """Latency of a 4-byte tensor (one float32) up and down, per path; keys ``tiny.*``.

    Each sample makes ``TINY_CALLS`` calls, so a figure is seconds per call.
    """
    cp, torch = env.cupy, env.torch
    tiny = np.array([1.5], dtype=np.float32)
    cases = []

    def add(key, fn, sync=env.sync):
        cases.append(Case(key, key, fn, nbytes=tiny.nbytes, number=TINY_CALLS, sync=sync))

    if env.etptr_ok:
        clone_to, dev = etptr.clone_tensor_ptr_to, env.device
        t = etptr.make_tensor_ptr(tiny)
        d = clone_to(t, dev)
        add("tiny.etptr.h2d", lambda: clone_to(t, dev))
        add("tiny.etptr.d2h", lambda: clone_to(d, "cpu"))
    cd = cp.asarray(tiny)
    add("tiny.cupy.h2d", lambda: cp.asarray(tiny))
    add("tiny.cupy.d2h", lambda: cd.get())
    if torch is not None:
        tdev = torch.device("cuda", env.index)
        td = torch.from_numpy(tiny).to(tdev)
        add("tiny.torch.h2d", lambda: torch.from_numpy(tiny).to(tdev), env.torch_sync)
        add("tiny.torch.d2h", lambda: td.cpu(), env.torch_sync)
    return cases


SWEEP_SERIES = {
    "etptr.h2d": "etptr H2D",
    "etptr.h2d_pinned": "etptr H2D, pinned source",
    "etptr.d2h": "etptr D2H",
    "cupy.h2d": "cupy.asarray",
    "cupy.d2h": "cupy ndarray.get()",
    "torch.h2d": "torch .cuda(), pageable",
    "torch.h2d_pinned": "torch .cuda(), pinned",
    "torch.d2h": "torch .cpu()",
    "torch.d2h_pinned": "torch copy_ to pinned",
    "line.h2d": "pinned line rate H2D",
    "line.d2h": "pinned line rate D2H",
}


@dataclass
class SweepPrepared:
    """Device-side state for the sweep, made before timing starts."""

    series: dict
    cases: list
    round_trip_bad: Optional[list]  # sizes whose etptr round trip differs; None if not run
    line: RawPinned

    def close(self):
        self.line.close()


def sweep_cases(env: CudaEnv, host: np.ndarray, sizes, number_for, repeats_for) -> SweepPrepared:
    """Cases for every path at every size; case keys are ``"series@size"``.

    All paths read the first ``size`` bytes of the same pageable ``host``
    array (or page-locked buffers of the same capacity) and of device
    buffers made once, so allocation of the sources is never timed; the
    destinations are allocated inside the timed call, as each path does
    for its users. Call inside ``env.context()``.
    """
    cp, torch = env.cupy, env.torch
    capacity = max(sizes)
    host = host[:capacity]
    clone_to, make = etptr.clone_tensor_ptr_to, etptr.make_tensor_ptr
    dev = env.device
    series = {}
    per_size = {n: [] for n in sizes}

    def add(key, n, fn, sync):
        series.setdefault(key, SWEEP_SERIES[key])
        per_size[n].append(Case(f"{key}@{n}", f"{SWEEP_SERIES[key]} {n}", fn, nbytes=n,
                                number=number_for(n), repeats=repeats_for(n), sync=sync))

    bad = None
    if env.etptr_ok:
        big_dev = clone_to(make(host), dev)
        pinned_src = etptr_pinned_empty(capacity)
        if pinned_src is not None:
            pinned_src.numpy()[:] = host
        bad = []
        for n in sizes:
            src, dsrc = make(host[:n]), make(big_dev, [n])
            back = clone_to(clone_to(src, dev), "cpu")
            env.sync()
            if not np.array_equal(back.numpy(), host[:n]):
                bad.append(n)
            add("etptr.h2d", n, lambda s=src: clone_to(s, dev), env.sync)
            if pinned_src is not None:
                pinned_view = make(pinned_src, [n])
                add("etptr.h2d_pinned", n, lambda s=pinned_view: clone_to(s, dev), env.sync)
            add("etptr.d2h", n, lambda d=dsrc: clone_to(d, "cpu"), env.sync)

    cp_dev = cp.asarray(host)
    for n in sizes:
        add("cupy.h2d", n, lambda a=host[:n]: cp.asarray(a), env.sync)
        add("cupy.d2h", n, lambda d=cp_dev[:n]: d.get(), env.sync)

    if torch is not None:
        tdev = torch.device("cuda", env.index)
        t_host = torch.from_numpy(host)
        t_pinned = t_host.pin_memory()
        t_pinned_dst = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
        t_dev = t_host.to(tdev)
        for n in sizes:
            add("torch.h2d", n, lambda t=t_host[:n]: t.to(tdev), env.torch_sync)
            add("torch.h2d_pinned", n, lambda t=t_pinned[:n]: t.to(tdev), env.torch_sync)
            add("torch.d2h", n, lambda t=t_dev[:n]: t.cpu(), env.torch_sync)
            add("torch.d2h_pinned", n,
                lambda d=t_pinned_dst[:n], s=t_dev[:n]: d.copy_(s, non_blocking=True),
                env.torch_sync)

    line = RawPinned(cp, capacity)
    for n in sizes:
        add("line.h2d", n, lambda n=n: line.h2d(n), env.sync)
        add("line.d2h", n, lambda n=n: line.d2h(n), env.sync)
    env.sync()
    cases = [c for n in sizes for c in per_size[n]]
    ordered = {k: series[k] for k in SWEEP_SERIES if k in series}
    return SweepPrepared(series=ordered, cases=cases, round_trip_bad=bad, line=line)
