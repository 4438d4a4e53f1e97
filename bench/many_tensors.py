"""Many tensors and checkpoints on a CUDA machine: the figures behind DESIGN.md's goals.

Run from the repository root on the GPU machine:

    PYTHONPATH=bench python bench/many_tensors.py [--quick] [OUTFILE]

Measures, in one run and against the pinned line rate measured in the same run:
4096 tensors of 16 KiB up and down (per-tensor clones, batched clones, copies into
existing separately allocated tensors, cupy and torch loops); the 290 tensors of a
Qwen2.5-0.5B-shaped bf16 checkpoint from mmap'd views of a page-cached file
(per-tensor clones synchronous and stream-ordered, one batched clone, one clone of
the whole data section); checkpoint loads and saves against the safetensors library;
registering page-cache pages with the driver against staging; and 4-byte copies into
existing tensors against cupy's set() and get(out=). Figures are medians of timed runs,
each bracketed by a device synchronisation.
"""
import gc
import os
import sys
import tempfile
import time

import numpy as np

from _timing import median_seconds, say, write_log

MiB = 1 << 20
KiB = 1 << 10


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def row(label, nbytes, seconds, line=None, peer=None):
    rate = gbps(nbytes, seconds)
    extra = ""
    if line:
        extra += f"  {rate / line:5.2f}x line"
    if peer:
        extra += f"  {rate / peer:6.2f}x peer"
    say(f"  {label:<58} {rate:7.2f} GB/s{extra}")
    return rate


def main(argv):
    quick = "--quick" in argv
    args = [a for a in argv if not a.startswith("--")]
    outfile = args[0] if args else None
    reps = 3 if quick else 7

    import cupy
    import etptr
    import etptr.cuda
    from etptr.bench import _layouts
    from etptr.cuda import _driver
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except Exception:
        torch = None
    import safetensors.numpy

    rt = cupy.cuda.runtime
    dev = cupy.cuda.Device(0)
    dev.use()
    sync = dev.synchronize
    say(f"# many tensors and checkpoints on {rt.getDeviceProperties(0)['name'].decode()}, "
        f"{os.cpu_count()} CPUs, CuPy {cupy.__version__}, torch "
        f"{getattr(torch, '__version__', 'absent')}, CUDA calls: {_driver._driver_calls()}")
    pool = etptr.cuda.get_pinned_host_pool()

    def timed(fn, r=reps):
        def run():
            out = fn()
            sync()
            return out
        return median_seconds(run, r, warmup=1)

    # ------------------------------------------------------------ line rate
    n_line = 256 * MiB
    pin = cupy.cuda.alloc_pinned_memory(n_line)
    dline = cupy.empty(n_line, np.uint8)
    s0 = cupy.cuda.Stream(non_blocking=True)
    up_line = gbps(n_line, timed(lambda: rt.memcpyAsync(dline.data.ptr, pin.ptr, n_line, 1, s0.ptr)
                                 or s0.synchronize()))
    down_line = gbps(n_line, timed(lambda: rt.memcpyAsync(pin.ptr, dline.data.ptr, n_line, 2, s0.ptr)
                                   or s0.synchronize()))
    say(f"line rate (one pinned cudaMemcpyAsync of 256 MiB): H2D {up_line:.2f} GB/s, "
        f"D2H {down_line:.2f} GB/s")
    del pin, dline

    # ------------------------------------------------------------ 4096 x 16 KiB
    count, each = 4096, 16 * KiB
    total = count * each
    rng = np.random.default_rng(0)
    host = [rng.integers(0, 255, each, dtype=np.uint8) for _ in range(count)]
    srcs = [etptr.make_tensor_ptr(a) for a in host]
    say(f"\n{count} x 16 KiB ({total / MiB:.0f} MiB), GB/s")
    t_cupy_up = timed(lambda: [cupy.asarray(a) for a in host])
    cdev = [cupy.asarray(a) for a in host]
    t_cupy_down = timed(lambda: [d.get() for d in cdev])
    cupy_up, cupy_down = gbps(total, t_cupy_up), gbps(total, t_cupy_down)
    row("cupy.asarray loop (H2D)", total, t_cupy_up, up_line)
    row("cupy get() loop (D2H)", total, t_cupy_down, down_line)
    if torch is not None:
        th = [torch.from_numpy(a) for a in host]
        tdev = [t.cuda() for t in th]
        row("torch .cuda() loop (H2D)", total, timed(lambda: [t.cuda() for t in th]), up_line)
        row("torch .cpu() loop (D2H)", total, timed(lambda: [t.cpu() for t in tdev]), down_line)
        del th, tdev
    row("etptr clone_tensor_ptr_to per tensor (H2D)", total,
        timed(lambda: [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in srcs]), up_line, cupy_up)
    edev = [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in srcs]
    row("etptr clone_tensor_ptr_to per tensor (D2H)", total,
        timed(lambda: [etptr.clone_tensor_ptr_to(d, "cpu") for d in edev]), down_line, cupy_down)
    row("etptr clone_tensor_ptrs_to batched (H2D)", total,
        timed(lambda: etptr.clone_tensor_ptrs_to(srcs, "cuda:0")), up_line, cupy_up)
    bdev = etptr.clone_tensor_ptrs_to(srcs, "cuda:0")
    row("etptr clone_tensor_ptrs_to batched (D2H, results share one pinned block)", total,
        timed(lambda: etptr.clone_tensor_ptrs_to(bdev, "cpu")), down_line, cupy_down)
    row("etptr clone_tensor_ptrs_to batched (D2H from separate tensors)", total,
        timed(lambda: etptr.clone_tensor_ptrs_to(edev, "cpu")), down_line, cupy_down)
    outs = [etptr.empty([each], etptr.ScalarType.Byte, device="cuda:0") for _ in range(count)]
    row("etptr h2d_copy batch into existing separate device tensors", total,
        timed(lambda: etptr.h2d_copy(srcs, outs)), up_line, cupy_up)
    pins = [etptr.empty([each], etptr.ScalarType.Byte, pinned=True) for _ in range(count)]
    row("etptr d2h_copy batch into existing pinned tensors", total,
        timed(lambda: etptr.d2h_copy(outs, pins)), down_line, cupy_down)
    ok = all(np.array_equal(p.numpy(), a) for p, a in zip(pins, host))
    say(f"  bit-exact round trip through existing tensors: {ok}")
    whole = etptr.make_tensor_ptr(np.concatenate(host))
    row("one clone of the concatenation (H2D, reference)", total,
        timed(lambda: etptr.clone_tensor_ptr_to(whole, "cuda:0")), up_line)
    del edev, bdev, outs, pins, cdev, whole
    gc.collect()

    # ------------------------------------------------------------ Qwen2.5-0.5B-shaped checkpoint
    tmp = tempfile.mkdtemp(prefix="etptr-many-")
    layouts = ["qwen2.5-0.5b"] if quick else ["qwen2.5-0.5b", "qwen2.5-1.5b"]
    for name in layouts:
        path = _layouts.write_layout(name, tmp)
        data = open(path, "rb").read()           # page cache warm
        nbytes_file = len(data)
        del data
        say(f"\n{name} checkpoint ({nbytes_file / 1e9:.2f} GB, {path.name}), page cache warm")
        views = etptr.load_safetensors(path, "cpu")
        tensors = list(views.values())
        nbytes = sum(t.nbytes for t in tensors)
        t_seq = timed(lambda: [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in tensors])
        row("per-tensor clone_tensor_ptr_to from mmap'd views (sync)", nbytes, t_seq, up_line)
        s = cupy.cuda.Stream(non_blocking=True)

        def streamed():
            out = [etptr.clone_tensor_ptr_to(t, "cuda:0", stream=s) for t in tensors]
            s.synchronize()
            return out
        row("per-tensor clone_tensor_ptr_to(stream=s), one sync", nbytes, timed(streamed), up_line)
        row("clone_tensor_ptrs_to batched from mmap'd views", nbytes,
            timed(lambda: etptr.clone_tensor_ptrs_to(tensors, "cuda:0")), up_line)
        t_load = timed(lambda: etptr.load_safetensors(path, "cuda:0", progress=False))
        peers = {}
        if torch is not None:
            import safetensors.torch
            peers["safetensors.torch.load_file(device=cuda:0)"] = timed(
                lambda: safetensors.torch.load_file(str(path), device="cuda:0"), 3)
            peers["safetensors.torch.load_file() then .to(cuda) per tensor"] = timed(
                lambda: {k: v.to("cuda:0") for k, v in safetensors.torch.load_file(str(path)).items()},
                3)
        ref = None
        for label, t in peers.items():
            ref = ref or gbps(nbytes, t)
            row(label, nbytes, t, up_line)
        row("etptr.load_safetensors(device=cuda:0)", nbytes, t_load, up_line, ref)
        loaded = etptr.load_safetensors(path, "cuda:0", progress=False)
        out_path = os.path.join(tmp, "out.safetensors")
        t_save = timed(lambda: etptr.save_safetensors(loaded, out_path), 3)
        ref_views = etptr.load_safetensors(path, "cpu")
        new_views = etptr.load_safetensors(out_path, "cpu")
        same = ref_views.keys() == new_views.keys() and all(
            bytes(memoryview(ref_views[k].numpy()).cast("B")) ==
            bytes(memoryview(new_views[k].numpy()).cast("B")) for k in ref_views)
        del ref_views, new_views
        save_ref = None
        if torch is not None:
            tl = safetensors.torch.load_file(str(path), device="cuda:0")
            out2 = os.path.join(tmp, "out_torch.safetensors")
            t_ts = timed(lambda: safetensors.torch.save_file({k: v.cpu() for k, v in tl.items()},
                                                             out2), 3)
            save_ref = gbps(nbytes, t_ts)
            row(".cpu() + safetensors.torch.save_file (GPU -> file)", nbytes, t_ts, down_line)
            del tl
        row("etptr.save_safetensors (GPU -> file)", nbytes, t_save, down_line, save_ref)
        say(f"  every tensor of the saved file bit-identical to the source: {same}")
        # registration of the page-cache pages against staging, for the biggest tensor range
        import mmap
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arr = np.frombuffer(mm, np.uint8)
        base = arr.ctypes.data
        for n in (256 * MiB, min(1 << 30, (nbytes_file // 4096) * 4096)):
            off = 0
            start = base + off
            page = start & ~4095
            size = ((start + n + 4095) & ~4095) - page
            d = cupy.empty(n, np.uint8)

            def registered():
                rt.hostRegister(page, size, 8)           # cudaHostRegisterReadOnly
                try:
                    rt.memcpyAsync(d.data.ptr, start, n, 1, 0)
                    rt.deviceSynchronize()
                finally:
                    rt.hostUnregister(page)
            try:
                t_reg = timed(registered, 3)
                row(f"cudaHostRegister(read-only) + DMA + unregister, {n >> 20} MiB", n, t_reg,
                    up_line)
            except Exception as exc:
                say(f"  cudaHostRegister path not available: {exc}")
            v = etptr.make_tensor_ptr(arr[off:off + n])
            row(f"staged clone of the same {n >> 20} MiB", n,
                timed(lambda: etptr.clone_tensor_ptr_to(v, "cuda:0"), 3), up_line)
            del v, d
        del arr
        mm.close()
        del views, tensors, loaded
        gc.collect()

    # ------------------------------------------------------------ 4-byte copies
    say("\n4-byte copies, us per call")
    tiny = np.array([1.5], np.float32)
    t_src = etptr.make_tensor_ptr(tiny)
    t_dev = etptr.clone_tensor_ptr_to(t_src, "cuda:0")
    t_pin = etptr.empty([1], pinned=True)
    c_dev = cupy.asarray(tiny)
    c_pin = cupy.cuda.alloc_pinned_memory(4)
    c_out = np.frombuffer(c_pin, np.float32, 1)

    def per_call(fn, number=2000):
        def run():
            for _ in range(number):
                fn()
        return median_seconds(run, 5, warmup=1) / number * 1e6
    u_set = per_call(lambda: c_dev.set(tiny))
    u_h2d = per_call(lambda: etptr.h2d_copy(t_src, t_dev))
    u_clone_up = per_call(lambda: etptr.clone_tensor_ptr_to(t_src, "cuda:0"))
    u_asarray = per_call(lambda: cupy.asarray(tiny))
    u_get = per_call(lambda: c_dev.get(out=c_out))
    u_d2h = per_call(lambda: etptr.d2h_copy(t_dev, t_pin))
    u_clone_down = per_call(lambda: etptr.clone_tensor_ptr_to(t_dev, "cpu"))
    u_get_new = per_call(lambda: c_dev.get())
    say(f"  h2d_copy {u_h2d:.2f} us vs cupy set() {u_set:.2f} us: {u_h2d / u_set:.2f}x")
    say(f"  d2h_copy into pinned {u_d2h:.2f} us vs get(out=pinned) {u_get:.2f} us: "
        f"{u_d2h / u_get:.2f}x")
    say(f"  clone up {u_clone_up:.2f} us vs cupy.asarray {u_asarray:.2f} us: "
        f"{u_clone_up / u_asarray:.2f}x")
    say(f"  clone down {u_clone_down:.2f} us vs get() {u_get_new:.2f} us: "
        f"{u_clone_down / u_get_new:.2f}x")
    st = pool.stats()
    say(f"\npinned pool: held {st['held_bytes'] / MiB:.0f} MiB (cap {st['max_cached_bytes'] / MiB:.0f} "
        f"MiB + K*S), in use {st['in_use_bytes'] / MiB:.0f} MiB, blocks in use {st['blocks_in_use']}")
    if outfile:
        write_log(outfile)


if __name__ == "__main__":
    main(sys.argv[1:])
