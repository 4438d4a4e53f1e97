"""How mid-size pageable copies should be cut into chunks.

    python bench/probe_chunking.py [OUTFILE]

For pageable uploads and downloads (into pageable memory) of 512 KiB - 128 MiB,
times clone_tensor_ptr_to (median of 9, GB/s) under several ways of cutting a copy
shorter than K slots: one chunk per slot ("1 x slot"), or about N chunks of at least
M bytes. The engine's choice (etptr/_core/_staging.pyx, _TARGET_CHUNKS and _MIN_CHUNK)
comes from this table; bench/results/ keeps a run.
"""
import statistics
import sys
import time

import numpy as np

MiB = 1 << 20
LINES = []


def say(line=""):
    LINES.append(line)
    print(line, flush=True)


def median_s(fn, reps=9, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv):
    import cupy
    import etptr
    from etptr._core import _staging

    cupy.cuda.Device(0).use()
    saved = _staging._get_chunking()
    ways = [("1 x slot", 1, 1 << 40), ("2 x >=1M", 2, MiB), ("4 x >=1M", 4, MiB),
            ("4 x >=512K", 4, MiB // 2), ("8 x >=512K", 8, MiB // 2), ("8 x >=1M", 8, MiB)]
    sizes = [MiB // 2, MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB]
    say(f"# chunking probe, {_staging._driver_calls()}, config {etptr.cuda.get_copy_config()}")
    for direction in ("H2D", "D2H pageable"):
        say(f"\n## {direction} (GB/s)")
        say("size      " + "".join(f"{w[0]:>12s}" for w in ways))
        for n in sizes:
            a = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
            t = etptr.make_tensor_ptr(a)
            d = etptr.clone_tensor_ptr_to(t, "cuda")
            row = []
            for _, target, minimum in ways:
                _staging._set_chunking(target, minimum)
                if direction == "H2D":
                    s = median_s(lambda: etptr.clone_tensor_ptr_to(t, "cuda"))
                else:
                    s = median_s(lambda: etptr.clone_tensor_ptr_to(d, "cpu", pinned=False))
                row.append(n / s / 1e9)
            best = max(range(len(ways)), key=lambda i: row[i])
            say(f"{n // 1024:6d} KiB" + "".join(f"{r:12.1f}" for r in row)
                + f"   best: {ways[best][0]}")
    _staging._set_chunking(*saved)
    if argv:
        with open(argv[0], "w") as f:
            f.write("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
