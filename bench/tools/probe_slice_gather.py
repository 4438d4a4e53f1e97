"""Column blocks of a tensor (``[:, a:b]``: one run a row) read two ways, in turns: a
read call a run, or the span of the runs read once and the runs copied out in memory
(``SliceRuns.gathered``); for row lengths and rank counts of real models, on the file
system given, page cache warm or cold. Answers where ``GATHER_STRIDE`` and
``GATHER_RUN`` lie.

    python bench/tools/probe_slice_gather.py [--dir /dev/shm] [--cold] [--device cpu]
"""
import argparse
import os
import tempfile

import numpy as np
from _probes import median_seconds, say

import etptr
from etptr.checkpoint import _slices

# (rows, row bytes): Qwen2.5-0.5B o_proj / down_proj, Qwen2.5-1.5B o_proj / down_proj,
# a 7B-class o_proj, rows of 64 KiB
SHAPES = ((896, 1792), (896, 9728), (1536, 3072), (1536, 17920), (4096, 8192), (256, 65536))
RANKS = (2, 4, 8)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--cold", action="store_true", help="drop the file's pages before each read")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(dir=args.dir)
    path = os.path.join(tmp, "shapes.safetensors")
    rng = np.random.default_rng(0)
    etptr.save_safetensors({f"t{i}": etptr.make_tensor_ptr(
        rng.integers(0, 255, rows * row, dtype=np.uint8).reshape(rows, row))
        for i, (rows, row) in enumerate(SHAPES)}, path)
    fd = os.open(path, os.O_RDONLY)
    default = _slices.GATHER_STRIDE, _slices.GATHER_RUN
    say(f"file {path} ({'cold' if args.cold else 'warm'}), device {args.device}, "
        f"GATHER_STRIDE, GATHER_RUN now {default}")
    say(f"{'rows':>6} {'row B':>7} {'ranks':>5} {'run B':>7} {'per run MB/s':>13} "
        f"{'gathered MB/s':>14} {'gathered / per run':>19}")
    try:
        with etptr.safe_open(path, device=args.device) as f:
            for i, (rows, row) in enumerate(SHAPES):
                for n in RANKS:
                    cut = row // n
                    need = rows * cut

                    def read():
                        if args.cold:
                            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        f.get_slice(f"t{i}")[:, :cut]

                    rates = []
                    for limit in (0, 1 << 40):      # never gathered, always gathered
                        _slices.GATHER_STRIDE = _slices.GATHER_RUN = limit
                        rates.append(need / median_seconds(read, args.reps) / 1e6)
                    _slices.GATHER_STRIDE, _slices.GATHER_RUN = default
                    say(f"{rows:>6} {row:>7} {n:>5} {cut:>7} {rates[0]:>13.0f} "
                        f"{rates[1]:>14.0f} {rates[1] / rates[0]:>19.2f}")
    finally:
        _slices.GATHER_STRIDE, _slices.GATHER_RUN = default
        os.close(fd)
        os.unlink(path)
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
