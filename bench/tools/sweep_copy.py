"""Sweep of the copy configuration on a CUDA machine; picks its defaults.

Run from the repository root on the GPU machine (PYTHONPATH=. for an in-place build):

    PYTHONPATH=. python bench/tools/sweep_copy.py [--quick] [OUTFILE]

It measures the baselines (one raw cudaMemcpyAsync from/to pinned memory,
cupy.asarray, cupy.ndarray.get, the host memcpy rate per thread count), then
host->device clones from pageable memory over threads T x slot bytes S x slots
K, device->host clones into pageable memory for the best of them, the
small-copy crossover (the chosen threshold is at least 64 KiB), 4-byte clones, and
the chosen defaults' rates as ratios to the baselines. Every figure is the median of
several timed runs, each synchronised. The report goes to stdout and, when given,
OUTFILE (bench/results/h200x2_sweep_copy.txt keeps the run the defaults of
etptr/cuda/_copy_engine.pyx come from; bench/results/DECISIONS.md, threads, slot_bytes,
slots and small_copy_bytes, says how).
"""
import gc
import sys

import numpy as np
from _probes import conditions, say, write_log
from _probes import median_seconds as median_time

MiB = 1 << 20
GiB = 1 << 30


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def main(argv):
    quick = "--quick" in argv
    args = [a for a in argv if not a.startswith("--")]
    outfile = args[0] if args else None

    import cupy
    import etptr
    import etptr.cuda
    from etptr._core import _host_copy

    rt = cupy.cuda.runtime
    dev = cupy.cuda.Device(0)
    dev.use()
    props = rt.getDeviceProperties(0)
    say(f"# etptr copy sweep on {props['name'].decode()} ({rt.getDeviceCount()} device(s)), "
        f"{_host_copy.cpu_count()} CPUs, CuPy {cupy.__version__}")
    say(f"# {conditions()}")

    pool = etptr.cuda.get_pinned_host_pool()
    stream = cupy.cuda.Stream(non_blocking=False)

    sizes = [256 * MiB, GiB]
    host = {n: np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8) for n in sizes}
    pinned = {n: pool.malloc(n, 0) for n in sizes}
    for n in sizes:
        np.frombuffer(pinned[n], np.uint8)[:] = host[n]
    dbuf = {n: cupy.empty(n, np.uint8) for n in sizes}

    # ------------------------------------------------------------ baselines
    say("\n## baselines (GB/s, median)")
    base = {}
    for n in sizes:
        reps = 5 if n == GiB else 10

        def raw_h2d():
            rt.memcpyAsync(dbuf[n].data.ptr, pinned[n].ptr, n, 1, stream.ptr)
            stream.synchronize()

        def raw_d2h():
            rt.memcpyAsync(pinned[n].ptr, dbuf[n].data.ptr, n, 2, stream.ptr)
            stream.synchronize()

        def asarray():
            cupy.asarray(host[n])
            cupy.cuda.Device().synchronize()

        def get():
            dbuf[n].get()

        out = np.empty(n, np.uint8)
        out[:] = 1

        def get_out():
            dbuf[n].get(out=out)

        b = {k: gbps(n, median_time(f, reps)) for k, f in
             [("raw_h2d", raw_h2d), ("raw_d2h", raw_d2h), ("cupy_asarray", asarray),
              ("cupy_get", get), ("cupy_get_out", get_out)]}
        base[n] = b
        say(f"{n // MiB:5d} MiB  " + "  ".join(f"{k}={v:6.2f}" for k, v in b.items()))

    say("\n## host memcpy pageable -> pinned (GB/s) by threads, 256 MiB")
    n = 256 * MiB
    for t in (1, 2, 4, 6, 8, 12, 16):
        s = median_time(lambda: _host_copy.parallel_copy(pinned[n].ptr, host[n].ctypes.data, n, t), 7)
        say(f"T={t:2d}  {gbps(n, s):6.2f}")

    # ------------------------------------------------------------ H2D sweep
    src_t = {n: etptr.make_tensor_ptr(host[n]) for n in sizes}

    def h2d_rate(n, reps, **cfg):
        def run():
            with etptr.cuda.copy_config(**cfg):
                etptr.clone_tensor_ptr_to(src_t[n], "cuda")
        return gbps(n, median_time(run, reps))

    say("\n## H2D clone from pageable memory, 256 MiB (GB/s): T x S x K")
    n = 256 * MiB
    grid = []
    threads = (4, 8, 16) if quick else (4, 6, 8, 12, 16)
    slot_sizes = (4, 8, 16) if quick else (4, 8, 16, 32)
    slot_counts = (2, 3) if quick else (2, 3, 4)
    for t in threads:
        for s in slot_sizes:
            row = []
            for k in slot_counts:
                r = h2d_rate(n, 5, threads=t, slot_bytes=s * MiB, slots=k)
                grid.append((r, t, s, k))
                row.append(f"K={k}:{r:6.2f}")
            say(f"T={t:2d} S={s:2d}MiB  " + "  ".join(row))
    grid.sort(reverse=True)
    cands = [g for g in grid if g[0] >= 0.95 * grid[0][0]][:10]
    say(f"{len(cands)} candidates within 5% of the best ({grid[0][0]:.2f})")

    # Every candidate: H2D at 1 GiB and 256 MiB again, and D2H into pageable memory
    # (the same T, S, K serve both directions).
    dsrc = etptr.clone_tensor_ptr_to(src_t[256 * MiB], "cuda")

    def d2h_rate(n, t, reps, **cfg):
        def run():
            with etptr.cuda.copy_config(**cfg):
                etptr.clone_tensor_ptr_to(t, "cpu", pinned=False)
        return gbps(n, median_time(run, reps))

    say("\n## candidates (GB/s): H2D 1 GiB, H2D 256 MiB, D2H pageable 256 MiB")
    scored = []
    for _, t, s, k in cands:
        cfg = dict(threads=t, slot_bytes=s * MiB, slots=k)
        r1 = h2d_rate(GiB, 5, **cfg)
        r2 = h2d_rate(256 * MiB, 9, **cfg)
        r3 = d2h_rate(256 * MiB, dsrc, 5, **cfg)
        scored.append((min(r1, r2), r3, t, s, k))
        say(f"T={t:2d} S={s:2d}MiB K={k}: h2d 1GiB={r1:6.2f} 256MiB={r2:6.2f}  d2h pageable={r3:6.2f}")
    top = max(x[0] for x in scored)
    near = [x for x in scored if x[0] >= 0.97 * top]
    _, _, T, S, K = max(near, key=lambda x: x[1])
    say(f"chosen: threads={T} slot_bytes={S}MiB slots={K} (best D2H among the configs within 3% "
        f"of the best H2D)")
    del dsrc

    etptr.cuda.set_copy_config(threads=T, slot_bytes=S * MiB, slots=K)

    # ------------------------------------------------------------ small-copy crossover
    say("\n## small copies: direct cudaMemcpyAsync vs pipeline (us, H2D clone)")
    crossover = 0
    for n in (4 * 1024, 64 * 1024, 256 * 1024, 512 * 1024, MiB, 2 * MiB, 4 * MiB, 8 * MiB):
        t = etptr.make_tensor_ptr(np.ones(n, np.uint8))

        def direct():
            with etptr.cuda.copy_config(small_copy_bytes=1 << 40):
                etptr.clone_tensor_ptr_to(t, "cuda")

        def piped():
            with etptr.cuda.copy_config(small_copy_bytes=0):
                etptr.clone_tensor_ptr_to(t, "cuda")

        a, b = (median_time(f, 50 if n <= MiB else 20, warmup=3) * 1e6 for f in (direct, piped))
        if a <= b:
            crossover = n
        say(f"{n // 1024:6d} KiB  direct={a:8.1f}  pipeline={b:8.1f}")
    say(f"chosen small_copy_bytes={crossover} (largest size where direct <= pipeline)")
    small = max(crossover, 64 * 1024)
    etptr.cuda.set_copy_config(small_copy_bytes=small)

    # ------------------------------------------------------------ tiny clones
    say("\n## 4-byte clones (us, median of 2000)")
    four = etptr.make_tensor_ptr(np.ones(1, np.float32))
    four_np = np.ones(1, np.float32)
    four_d = etptr.clone_tensor_ptr_to(four, "cuda")
    four_c = cupy.ones(1, np.float32)

    def up():
        etptr.clone_tensor_ptr_to(four, "cuda")

    def down():
        etptr.clone_tensor_ptr_to(four_d, "cpu")

    def c_up():
        cupy.asarray(four_np)
        cupy.cuda.get_current_stream().synchronize()

    def c_down():
        four_c.get()

    tiny = {k: median_time(f, 2000, warmup=50) * 1e6 for k, f in
            [("etptr_up", up), ("cupy_asarray", c_up),
             ("etptr_down", down), ("cupy_get", c_down)]}
    say("  ".join(f"{k}={v:.1f}" for k, v in tiny.items()))

    # ------------------------------------------------------------ goals
    say("\n## goals (chosen defaults)", etptr.cuda.get_copy_config())
    for n in sizes:
        up_r = h2d_rate(n, 7)
        pin_src = etptr.make_tensor_ptr([n], pinned[n], type=etptr.ScalarType.Byte)
        pin_r = gbps(n, median_time(lambda: etptr.clone_tensor_ptr_to(pin_src, "cuda"), 7))
        dn = etptr.clone_tensor_ptr_to(src_t[n], "cuda")
        gc.collect()
        dn_r = gbps(n, median_time(lambda: etptr.clone_tensor_ptr_to(dn, "cpu"), 7))
        dn_pg = gbps(n, median_time(lambda: etptr.clone_tensor_ptr_to(dn, "cpu", pinned=False), 3))
        b = base[n]
        say(f"{n // MiB} MiB: pageable up {up_r:.2f} GB/s = {up_r / b['raw_h2d']:.3f} of line rate,"
            f" {up_r / b['cupy_asarray']:.2f}x cupy.asarray;"
            f" page-locked up {pin_r:.2f} = {pin_r / b['raw_h2d']:.3f} of raw cudaMemcpyAsync;"
            f" down pinned result {dn_r:.2f} = {dn_r / b['raw_d2h']:.3f} of line rate;"
            f" down pageable {dn_pg:.2f} = {dn_pg / b['cupy_get']:.2f}x ndarray.get()")
        dn = None                     # its device memory goes before the next size's
    say(f"4 B: up {tiny['etptr_up']:.1f} us = {tiny['etptr_up'] / tiny['cupy_asarray']:.2f}x "
        f"cupy.asarray; down {tiny['etptr_down']:.1f} us = "
        f"{tiny['etptr_down'] / tiny['cupy_get']:.2f}x ndarray.get()")

    gc.collect()
    pool.reset_peak()
    s0 = pool.stats()
    src = etptr.make_tensor_ptr(np.arange(1024, dtype=np.float32))
    for _ in range(1000):
        h = etptr.clone_tensor_ptr_to(etptr.clone_tensor_ptr_to(src, "cuda"), "cpu")
    del h
    gc.collect()
    s1 = pool.stats()
    cfg = etptr.cuda.get_copy_config()
    own = sum(b.capacity for b in pinned.values())
    say(f"1000 clones up+down: pinned held {s1['held_bytes']} B = {s1['in_use_bytes']} in use "
        f"(the sweep's own blocks: {own}) + {s1['cached_bytes']} cached; held beyond the sweep's "
        f"own blocks {s1['held_bytes'] - own} B vs cap + K*S = "
        f"{s1['max_cached_bytes'] + cfg['slots'] * cfg['slot_bytes']}; peak {s1['peak_bytes']} "
        f"(before the loop {s0['held_bytes']}); hits +{s1['hits'] - s0['hits']}"
        f" misses +{s1['misses'] - s0['misses']}")
    say(f"device memory in use after: {cupy.get_default_memory_pool().used_bytes()} B "
        f"(the sweep's own buffers: {sum(d.nbytes for d in dbuf.values())} B)")
    say(f"\nDEFAULTS threads={T},slot_bytes={S * MiB},slots={K},small_copy_bytes={small}")
    if outfile:
        write_log(outfile)


if __name__ == "__main__":
    main(sys.argv[1:])
