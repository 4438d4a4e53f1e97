"""``etptr-bench --many``: many tensors at once, against peers and the pinned line rate.

Two sets of tensors, each timed up and down as per-tensor clones, one batched clone
(``clone_tensor_ptrs_to``), copies into existing tensors (``h2d_copy`` / ``d2h_copy``),
and loops of ``cupy.asarray`` / ``get()`` and torch ``.cuda()`` / ``.cpu()``:

* 4096 tensors of 16 KiB (many small pieces: fixed cost per transfer dominates);
* the 290 bf16 tensors of a Qwen2.5-0.5B-shaped checkpoint, viewed zero-copy in a
  page-cached file (per-tensor clones synchronous and stream-ordered, the batch, one
  clone of the whole data section).

Then 4-byte copies into existing tensors against ``cupy.ndarray.set()`` and
``get(out=)``, and a probe of the alternative to staging for large page-cache sources:
registering the pages with the driver (``cudaHostRegister``, read-only) and one DMA.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import numpy as np

import etptr
from etptr.bench._report import fmt_gbps, fmt_ratio, fmt_size, ratio, table
from etptr.bench._timing import Case, run_cases

KiB, MiB = 1 << 10, 1 << 20
SMALL_COUNT, SMALL_BYTES = 4096, 16 * KiB
LINE_BYTES = 256 * MiB
TINY_CALLS = 500


@dataclass
class _Set:
    title: str
    nbytes: int
    rows: list = field(default_factory=list)      # (key, label, direction)


def _line_cases(env):
    cp, rt = env.cupy, env.cupy.cuda.runtime
    host = cp.cuda.alloc_pinned_memory(LINE_BYTES)
    dev = cp.empty(LINE_BYTES, np.uint8)
    s = cp.cuda.Stream(non_blocking=True)

    def up():
        rt.memcpyAsync(dev.data.ptr, host.ptr, LINE_BYTES, 1, s.ptr)
        s.synchronize()

    def down():
        rt.memcpyAsync(host.ptr, dev.data.ptr, LINE_BYTES, 2, s.ptr)
        s.synchronize()
    keep = (host, dev, s)
    return [Case("line.h2d", "pinned line rate (one cudaMemcpyAsync, 256 MiB)", up,
                 nbytes=LINE_BYTES, sync=env.sync),
            Case("line.d2h", "pinned line rate D2H", down, nbytes=LINE_BYTES, sync=env.sync)], keep


def _cases_for_a_set(env, prefix, host_arrays, tensors, whole=None):
    """Cases for one set of tensors (``tensors`` wrap ``host_arrays`` on the CPU)."""
    cp, torch, dev = env.cupy, env.torch, env.device
    nbytes = sum(t.nbytes for t in tensors)
    count = len(tensors)
    cases = []

    def add(key, label, fn, direction, sync=env.sync):
        cases.append((Case(f"{prefix}.{key}", label, fn, nbytes=nbytes, count=count, sync=sync),
                      direction))

    clone_to, clones_to = etptr.clone_tensor_ptr_to, etptr.clone_tensor_ptrs_to
    on_dev = [clone_to(t, dev) for t in tensors]
    batch = clones_to(tensors, dev)
    outs = [etptr.empty_like(t, device=dev) for t in tensors]
    pins = [etptr.empty_like(t, pinned=True) for t in tensors]
    s = cp.cuda.Stream(non_blocking=True)

    def streamed():
        out = [clone_to(t, dev, stream=s) for t in tensors]
        s.synchronize()
        return out
    add("etptr.h2d", "etptr clone_tensor_ptr_to per tensor", lambda: [clone_to(t, dev) for t in tensors], "H2D")
    add("etptr_stream.h2d", "etptr clone_tensor_ptr_to(stream=s) per tensor, one sync", streamed, "H2D")
    add("etptr_batch.h2d", "etptr clone_tensor_ptrs_to (batched)", lambda: clones_to(tensors, dev), "H2D")
    add("etptr_copy.h2d", "etptr h2d_copy into existing tensors (batched)",
        lambda: etptr.h2d_copy(tensors, outs), "H2D")
    if whole is not None:
        add("etptr_whole.h2d", "etptr clone_tensor_ptr_to of the whole range (reference)",
            lambda: clone_to(whole, dev), "H2D")
    add("etptr.d2h", "etptr clone_tensor_ptr_to per tensor", lambda: [clone_to(d, "cpu") for d in on_dev], "D2H")
    add("etptr_batch.d2h", "etptr clone_tensor_ptrs_to (batched)", lambda: clones_to(batch, "cpu"), "D2H")
    add("etptr_copy.d2h", "etptr d2h_copy into existing pinned tensors (batched)",
        lambda: etptr.d2h_copy(outs, pins), "D2H")
    from etptr.bench._cpu import plain_view
    plain = [plain_view(a) for a in host_arrays]
    cdev = [cp.asarray(a) for a in plain]
    add("cupy.h2d", "cupy.asarray per tensor", lambda: [cp.asarray(a) for a in plain], "H2D")
    add("cupy.d2h", "cupy ndarray.get() per tensor", lambda: [d.get() for d in cdev], "D2H")
    if torch is not None:
        tdev = torch.device("cuda", env.index)
        th = [torch.from_numpy(a) for a in plain]
        tg = [t.to(tdev) for t in th]
        add("torch.h2d", "torch .cuda() per tensor", lambda: [t.to(tdev) for t in th], "H2D",
            env.torch_sync)
        add("torch.d2h", "torch .cpu() per tensor", lambda: [t.cpu() for t in tg], "D2H",
            env.torch_sync)
    check = etptr.clone_tensor_ptrs_to(etptr.h2d_copy(tensors, outs), "cpu")
    ok = all(np.array_equal(np.asarray(c.numpy()).view(np.uint8), np.asarray(a).view(np.uint8))
             for c, a in zip(check, host_arrays))
    keep = (on_dev, batch, outs, pins, cdev, s)
    return cases, keep, ok


def _tiny_cases(env):
    cp = env.cupy
    tiny = np.array([1.5], np.float32)
    src = etptr.make_tensor_ptr(tiny)
    dev = etptr.clone_tensor_ptr_to(src, env.device)
    pin = etptr.empty([1], pinned=True)
    cdev = cp.asarray(tiny)
    cpin = np.frombuffer(cp.cuda.alloc_pinned_memory(4), np.float32, 1)
    cur = cp.cuda.get_current_stream()
    cases = [Case(k, k, fn, nbytes=4, number=TINY_CALLS, sync=env.sync) for k, fn in (
        ("tiny.etptr_copy.h2d", lambda: etptr.h2d_copy(src, dev)),
        ("tiny.etptr_copy_stream.h2d", lambda: etptr.h2d_copy(src, dev, stream=cur)),
        ("tiny.cupy_set.h2d", lambda: cdev.set(tiny)),
        ("tiny.etptr_copy.d2h", lambda: etptr.d2h_copy(dev, pin)),
        ("tiny.cupy_get_out.d2h", lambda: cdev.get(out=cpin)),
    )]
    return cases, (src, dev, pin, cdev, cpin)


def _register_probe(env, path, sizes):
    """Seconds for registering page-cache pages read-only + one DMA + unregistering,
    and for the staged clone of the same bytes; {} when registration fails."""
    import mmap
    from etptr.bench._timing import measure
    cp, rt = env.cupy, env.cupy.cuda.runtime
    out = {}
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    arr = np.frombuffer(mm, np.uint8)
    base = arr.ctypes.data
    try:
        for n in sizes:
            n = min(n, (arr.nbytes // 4096) * 4096)
            d = cp.empty(n, np.uint8)
            page = base & ~4095

            def registered():
                rt.hostRegister(page, n, 8)            # cudaHostRegisterReadOnly
                try:
                    rt.memcpyAsync(d.data.ptr, base, n, 1, 0)
                    rt.deviceSynchronize()
                finally:
                    rt.hostUnregister(page)
            view = etptr.make_tensor_ptr(arr[:n])
            try:
                out[n] = (measure(registered, repeats=3, warmup=1, nbytes=n).gbps("median"),
                          measure(lambda: etptr.clone_tensor_ptr_to(view, env.device), repeats=3,
                                  warmup=1, nbytes=n, sync=env.sync).gbps("median"))
            except Exception as exc:
                out[n] = (f"registration failed: {exc}", None)
            del view, d
    finally:
        del arr
        mm.close()
    return out


def run_many(env, args, out) -> tuple:
    """Measure and print; returns (status, report)."""
    from etptr.bench import _model_shapes
    if not (env.available and env.etptr_ok):
        out(f"--many needs CUDA and etptr's CUDA allocator: "
            f"{env.reason or env.etptr_reason}; nothing to measure")
        return 0, {"many": None}
    rng = np.random.default_rng(0)
    small = [rng.integers(0, 255, SMALL_BYTES, dtype=np.uint8) for _ in range(SMALL_COUNT)]
    small_t = [etptr.make_tensor_ptr(a) for a in small]
    from etptr.bench._file_io import scratch_dir
    tmp = tempfile.TemporaryDirectory(prefix="etptr-many-", dir=scratch_dir(1 << 31, args.dir))
    report, ok = {}, True
    try:
        with env.context():
            path = _model_shapes.write_layout("qwen2.5-0.5b", tmp.name)
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass                                  # page cache warm
            views = list(etptr.load_safetensors(path, "cpu").values())
            arrays = [v.numpy() for v in views]
            lo = min(v.data_ptr for v in views)
            hi = max(v.data_ptr + v.nbytes for v in views)
            # the whole data section as one tensor (the views keep the map alive)
            whole = etptr.make_tensor_ptr([hi - lo], lo, type=etptr.ScalarType.Byte)
            line, keep_line = _line_cases(env)
            small_cases, keep_small, ok_small = _cases_for_a_set(env, "small", small, small_t)
            ckpt_cases, keep_ckpt, ok_ckpt = _cases_for_a_set(env, "ckpt", arrays, views, whole)
            ckpt_cases.append((Case("ckpt.etptr_load.h2d", "etptr.load_safetensors(file) (the same "
                                    "bytes from a fresh map)",
                                    lambda: etptr.load_safetensors(path, env.device, progress=False),
                                    nbytes=sum(v.nbytes for v in views), count=len(views),
                                    sync=env.sync), "H2D"))
            tiny, keep_tiny = _tiny_cases(env)
            cases = line + [c for c, _ in small_cases] + [c for c, _ in ckpt_cases] + tiny
            timings = run_cases(cases, repeats=args.repeats, warmup=args.warmup,
                                progress=not args.no_progress)
            probe = _register_probe(env, path, [256 * MiB, 1 << 30])
            del keep_line, keep_small, keep_ckpt, keep_tiny, whole
        ok = ok_small and ok_ckpt
        g = {k: t.gbps(args.stat) for k, t in timings.items()}
        for title, group, n in ((f"{SMALL_COUNT} tensors of 16 KiB", small_cases, SMALL_COUNT),
                                (f"Qwen2.5-0.5B-shaped checkpoint, {len(views)} bf16 tensors "
                                 f"viewed in a page-cached file", ckpt_cases, len(views))):
            rows = []
            for case, direction in group:
                rate = g[case.key]
                line_rate = g[f"line.{direction.lower()}"]
                peer = g.get(case.key.rsplit(".", 2)[0] + (".cupy.h2d" if direction == "H2D"
                                                          else ".cupy.d2h"))
                rows.append([f"{direction} {case.label}", fmt_gbps(rate),
                             fmt_ratio(ratio(rate, line_rate)),
                             fmt_ratio(ratio(rate, peer)) if "etptr" in case.key else "-"])
            out("")
            out(table([f"{title} ({fmt_size(timings[group[0][0].key].nbytes)})",
                       "GB/s", "x line", "x cupy"], rows))
        out("")
        out(table(["pinned line rate", "GB/s"], [["H2D", fmt_gbps(g["line.h2d"])],
                                                 ["D2H", fmt_gbps(g["line.d2h"])]]))
        us = {k: timings[k].seconds(args.stat) * 1e6 for k in timings if k.startswith("tiny.")}
        out("")
        out(table(["4-byte copy into an existing tensor, us per call", "etptr", "cupy",
                   "etptr / cupy"],
                  [["H2D: h2d_copy vs ndarray.set()", f"{us['tiny.etptr_copy.h2d']:.2f}",
                    f"{us['tiny.cupy_set.h2d']:.2f}",
                    fmt_ratio(ratio(us['tiny.etptr_copy.h2d'], us['tiny.cupy_set.h2d']))],
                   ["H2D: h2d_copy(stream=current), queued as set()",
                    f"{us['tiny.etptr_copy_stream.h2d']:.2f}", f"{us['tiny.cupy_set.h2d']:.2f}",
                    fmt_ratio(ratio(us['tiny.etptr_copy_stream.h2d'], us['tiny.cupy_set.h2d']))],
                   ["D2H: d2h_copy vs ndarray.get(out=pinned)", f"{us['tiny.etptr_copy.d2h']:.2f}",
                    f"{us['tiny.cupy_get_out.d2h']:.2f}",
                    fmt_ratio(ratio(us['tiny.etptr_copy.d2h'], us['tiny.cupy_get_out.d2h']))]]))
        out("")
        rows = []
        for n, (reg, staged) in probe.items():
            if isinstance(reg, str):
                rows.append([f"{n >> 20} MiB", reg, fmt_gbps(staged)])
            else:
                rows.append([f"{n >> 20} MiB", fmt_gbps(reg), fmt_gbps(staged)])
        out(table(["page-cache source -> GPU, GB/s", "cudaHostRegister + DMA", "staged clone"],
                  rows))
        out(f"bit-identical (h2d_copy then batched clone back): {ok}")
        st = etptr.cuda.get_pinned_host_pool().stats()
        out(f"pinned pool at the end: {st['in_use_bytes'] / MiB:.0f} MiB in use, "
            f"{st['cached_bytes'] / MiB:.0f} MiB cached (cache cap "
            f"{st['max_cached_bytes'] / MiB:.0f} MiB), {st['misses']} misses, "
            f"{st['evictions']} evictions")
        report = {"gbps": g, "tiny_us": us, "bit_identical": ok,
                  "register_probe": {str(k): v for k, v in probe.items()},
                  "timings": {k: t.as_dict() for k, t in timings.items()}}
    finally:
        tmp.cleanup()
    return (0 if ok else 1), report
