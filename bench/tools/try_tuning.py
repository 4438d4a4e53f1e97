"""Standard copies timed under other values of the copy engine's settings, in turns.

    python bench/tools/try_tuning.py [--cases CASE,...] [--dir DIR] [--rounds N]
                                     [--sizes SIZE,...] [-o OUTFILE] SETTING=V[,V...] ...

Asks again, on the machine at hand, the questions of bench/results/DECISIONS.md. A
SETTING is a tuning field of the engine (``etptr.cuda._tuning``: target_chunks,
min_chunk, signal_every, fill_pieces, ramp_first, ramp_growth, ramp_max, nt_max,
nt_file_max, read_bounce, stream_writes, fence, fence_spin_ns, fence_max, large_piece,
scattered_pipeline, scratch_max, near_gap) or a setting of the copy configuration
(threads, slot_bytes, slots, small_copy_bytes). A value is an integer, with an optional
KiB, MiB or GiB suffix, or true / false for a flag. Several settings give every
combination of their values; each combination is a mode. For example

    python bench/tools/try_tuning.py --cases file nt_file_max=0,128MiB,1GiB
    python bench/tools/try_tuning.py --cases tiny stream_writes=true,false fence=true,false

Each case runs under every mode in turns, ROUNDS times (one untimed call before each
timed one); a cell is the median microseconds per call and, for cases of 1 MiB or more,
in brackets, the fraction of the pinned line rate (one 256 MiB DMA from page-locked
memory). Cases (default: all):

  tiny    4-byte copies into existing tensors: h2d_copy, h2d_copy queued on the current
          stream, d2h_copy into page-locked memory (stream_writes, fence, fence_*)
  memory  h2d_copy from and d2h_copy into pageable host memory, one tensor of each of
          --sizes (target_chunks, min_chunk, nt_max, ramp_*, fill_pieces, the copy
          configuration)
  file    the upload alone and load_safetensors of all-MiniLM-L6-v2- and
          Qwen2.5-0.5B-shaped checkpoints written to DIR (nt_file_max, read_bounce,
          fill_pieces, ramp_*)
  batch   batched copies: clone_tensor_ptrs_to of 4096 tensors of 16 KiB up and down
          (scratch_max, large_piece), and h2d_copy / d2h_copy of Qwen2.5-0.5B's tensors
          between host arrays and tensors allocated one by one (scattered_pipeline)

Needs CuPy and a CUDA device; files go to DIR (default /dev/shm, which keeps them in
memory). Writes the report to OUTFILE too when given.
"""
import argparse
import contextlib
import itertools
import sys

import numpy as np
from _probes import (conditions, file_uploader, host_tensors, in_turns, layout_files,
                     pinned_line_gbps, say, write_log)

import etptr
import etptr.cuda
from etptr.cuda import _tuning

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
CONFIG = ("threads", "slot_bytes", "slots", "small_copy_bytes")
TUNING = tuple(k for k in _tuning.values() if k not in ("trace", "chunk_hook"))
CASES = ("tiny", "memory", "file", "batch")
SIZES = "64KiB,1MiB,4MiB,16MiB,64MiB,256MiB,1GiB"


def number(text):
    """An integer with an optional KiB / MiB / GiB suffix, or a flag's true / false."""
    low = text.strip().lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    for suffix, unit in (("kib", KiB), ("mib", MiB), ("gib", GiB)):
        if low.endswith(suffix):
            return int(low[:-len(suffix)], 0) * unit
    return int(low, 0)


def size_name(n):
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def modes_of(settings):
    """{mode name: a callable entering that mode} for every combination of ``settings``
    (SETTING=V,V... strings), checked against the engine before anything is timed."""
    axes = []
    for item in settings:
        name, sep, values = item.partition("=")
        if not sep or name not in TUNING + CONFIG:
            raise SystemExit(f"try_tuning.py: {item!r}: expected SETTING=V[,V...] with SETTING "
                             f"one of {', '.join(TUNING + CONFIG)}")
        axes.append([(name, number(v), v.strip()) for v in values.split(",")])
    modes = {}
    for combo in itertools.product(*axes):
        label = " ".join(f"{name}={text}" for name, _, text in combo)
        modes[label] = _enter({name: value for name, value, _ in combo})
        with modes[label]():          # a value out of range fails here, before any timing
            pass
    return modes


def _enter(mode):
    tuning = {k: v for k, v in mode.items() if k in TUNING}
    config = {k: v for k, v in mode.items() if k in CONFIG}

    @contextlib.contextmanager
    def enter():
        with _tuning.tuned(**tuning), etptr.cuda.copy_config(**config):
            yield
    return enter


def tiny_cases(cupy):
    host = np.array([1.5], np.float32)
    src = etptr.make_tensor_ptr(host)
    dev = etptr.clone_tensor_ptr_to(src, "cuda:0")
    pinned = etptr.clone_tensor_ptr_to(dev, "cpu")           # page-locked
    cur = cupy.cuda.get_current_stream()
    return [("h2d_copy, 4 B", 4, lambda: etptr.h2d_copy(src, dev), 2000, None),
            ("h2d_copy(stream=current), 4 B", 4,
             lambda: etptr.h2d_copy(src, dev, stream=cur), 2000, cur.synchronize),
            ("d2h_copy into page-locked, 4 B", 4, lambda: etptr.d2h_copy(dev, pinned), 2000,
             None)]


def memory_cases(sizes):
    out = []
    for n in sizes:
        host = etptr.make_tensor_ptr(np.random.default_rng(n).integers(0, 255, n, np.uint8))
        dev = etptr.empty([n], type=etptr.ScalarType.Byte, device="cuda:0")
        calls = max(1, min(200, (16 * MiB) // n))
        out.append((f"h2d_copy from pageable, {size_name(n)}", n,
                    lambda h=host, d=dev: etptr.h2d_copy(h, d), calls, None))
        out.append((f"d2h_copy into pageable, {size_name(n)}", n,
                    lambda h=host, d=dev: etptr.d2h_copy(d, h), calls, None))
    return out


def file_cases(path):
    from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
    from etptr.checkpoint._plan import read_plan
    f = read_plan(path).files[0]
    lay = layout_file(f, DEVICE_ALIGNMENT)
    buf = etptr.DeviceMemoryBuffer.create(lay.nbytes, "cuda:0", alignment=DEVICE_ALIGNMENT)
    upload = file_uploader(f, buf)
    upload.buf = buf                                         # kept while the case lives
    return [(f"file upload alone, {path.stem}", f.data_size, upload, 1, None),
            (f"load_safetensors, {path.stem}", f.data_size,
             lambda: etptr.load_safetensors(path, "cuda:0", progress=False), 1, None)]


def batch_cases(path):
    small = [etptr.make_tensor_ptr(a) for a in
             np.random.default_rng(2).integers(0, 255, (4096, 16 * KiB), dtype=np.uint8)]
    small_dev = etptr.clone_tensor_ptrs_to(small, "cuda:0")
    out = [("clone_tensor_ptrs_to, 4096 x 16 KiB up", 64 * MiB,
            lambda: etptr.clone_tensor_ptrs_to(small, "cuda:0"), 1, None),
           ("clone_tensor_ptrs_to, 4096 x 16 KiB down", 64 * MiB,
            lambda: etptr.clone_tensor_ptrs_to(small_dev, "cpu"), 1, None)]
    arrays, srcs = host_tensors(path)
    outs = [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in srcs]       # one by one
    nbytes = sum(a.nbytes for a in arrays)
    out += [(f"h2d_copy of {len(srcs)} tensors into separate ones, {path.stem}", nbytes,
             lambda: etptr.h2d_copy(srcs, outs), 1, None),
            (f"d2h_copy of {len(srcs)} separate tensors into host arrays, {path.stem}", nbytes,
             lambda: etptr.d2h_copy(outs, srcs), 1, None)]
    return out


def report(cases, modes, rounds, line):
    for name, nbytes, fn, calls, sync in cases:
        times = in_turns(fn, modes, rounds, calls, sync)
        cells = [f"{t * 1e6:9.1f}" + (f" ({nbytes / t / 1e9 / line:.3f})" if nbytes >= MiB
                                      else "") for t in times.values()]
        say(f"  {name}: " + " | ".join(cells))


def main(argv=None):
    p = argparse.ArgumentParser(prog="try_tuning.py", description=__doc__.splitlines()[0])
    p.add_argument("settings", nargs="+", metavar="SETTING=V[,V...]")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated, of {', '.join(CASES)} (default: all)")
    p.add_argument("--dir", default="/dev/shm", help="where checkpoint files are written")
    p.add_argument("--rounds", type=int, default=15, help="rounds of turns (default 15)")
    p.add_argument("--sizes", default=SIZES, help=f"the memory cases' sizes (default {SIZES})")
    p.add_argument("-o", "--out", help="also write the report to this file")
    args = p.parse_args(argv)
    wanted = args.cases.split(",")
    if set(wanted) - set(CASES):
        p.error(f"--cases: {', '.join(sorted(set(wanted) - set(CASES)))} unknown")
    import cupy
    modes = modes_of(args.settings)
    line = pinned_line_gbps()
    say(f"line (pinned 256 MiB): {line:.1f} GB/s; {conditions()}")
    say(f"median us per call of {args.rounds} rounds, modes in turns (x line); modes: "
        + " | ".join(modes))
    if "tiny" in wanted:
        report(tiny_cases(cupy), modes, args.rounds, line)
    if "memory" in wanted:
        report(memory_cases([number(s) for s in args.sizes.split(",")]), modes, args.rounds,
               line)
    if "file" in wanted or "batch" in wanted:
        for name, path in layout_files(args.dir, ("all-minilm-l6-v2", "qwen2.5-0.5b")):
            if "file" in wanted:
                report(file_cases(path), modes, args.rounds, line)
            if "batch" in wanted and name == "qwen2.5-0.5b":
                report(batch_cases(path), modes, args.rounds, line)
    if args.out:
        write_log(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
