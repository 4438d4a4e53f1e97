import mmap, os, time, numpy as np, etptr, platform
from etptr._core import _host_copy
print("kernel", platform.release())
n = 1 << 30
path = "/tmp/etptr_probe.bin"
with open(path, "wb") as f:
    f.write(np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).tobytes())
open(path, "rb").read()
for mode in ("fresh map, copy faults", "fresh map, populated first", "fresh map, populated first", "fresh map, copy faults"):
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    a = np.frombuffer(mm, np.uint8)
    t0 = time.perf_counter()
    if "populated" in mode:
        _host_copy.parallel_populate(a.ctypes.data, n, 16)
    t1 = time.perf_counter()
    d = etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(a), "cuda:0")
    t2 = time.perf_counter()
    print(f"{mode}: populate {1e3*(t1-t0):.1f} ms, clone {1e3*(t2-t1):.1f} ms, total {n/(t2-t0)/1e9:.1f} GB/s")
    del d, a
    mm.close()
os.unlink(path)
