"""etptr's libcuda paths against tests/fakecuda.c, in a process of its own.

A test process runs ``setup(path)`` first: it loads the fake ``libcuda.so.1`` at
``path`` (so that etptr's dlopen finds it), makes the CuPy stand-in (tests/fakecupy.py)
the backend with its memory registered with the fake driver (page-locked blocks as host
memory, allocations as device memory), and registers a CudaAllocator over it.
"""
import ctypes
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fakecuda.c")
_LONGS = {"fake_fail_after", "fake_writes", "fake_writes64", "fake_copies", "fake_syncs",
          "fake_overruns", "fake_bad_device"}


def build(directory):
    """Compile the fake driver into ``directory``; its path, or None without a compiler."""
    out = os.path.join(directory, "libcuda.so.1")
    cc = os.environ.get("CC", "cc")
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread",
                               "-Wl,-soname,libcuda.so.1", SOURCE, "-o", out],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out if proc.returncode == 0 else None


class Fake:
    """The loaded fake driver: ``knob(name)`` is one of its globals (a ctypes value)."""

    def __init__(self, lib, cupy, registration):
        self.lib = lib
        self.cupy = cupy
        self.registration = registration      # the CudaAllocator's, kept for the process

    def knob(self, name):
        kind = ctypes.c_long if name in _LONGS else ctypes.c_int
        return kind.in_dll(self.lib, name)


def setup(path):
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    sys.path.insert(0, HERE)
    from _helpers import load_fakecupy

    from etptr.cuda import CudaAllocator, _driver
    from etptr.testing import use_allocator
    cp = load_fakecupy().make(ndev=2)
    rt = cp.cuda.runtime
    lib.fake_register.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.fake_unregister.argtypes = [ctypes.c_size_t]
    host_alloc, free_host, alloc = rt.hostAlloc, rt.freeHost, cp.cuda.memory.alloc

    def registered_host_alloc(size, flags):
        p = host_alloc(size, flags)
        lib.fake_register(p, max(size, 1), 1, 0)
        return p

    def unregistered_free_host(p):
        lib.fake_unregister(p)
        free_host(p)

    def registered_alloc(size):
        m = alloc(size)
        lib.fake_register(m.ptr, m.size, 2, 0)
        return m

    pointer = cp.cuda.memory.MemoryPointer
    dealloc = pointer.__del__

    def unregistered_del(self):
        lib.fake_unregister(self.ptr)
        dealloc(self)

    pointer.__del__ = unregistered_del
    rt.hostAlloc, rt.freeHost, cp.cuda.memory.alloc = (registered_host_alloc,
                                                       unregistered_free_host, registered_alloc)
    cp.is_fake = False                  # so that etptr loads "libcuda" (the fake)
    _driver._use_backend(cp)
    assert _driver._driver_calls() == "libcuda", _driver._driver_calls()
    registration = use_allocator(CudaAllocator())
    registration.__enter__()
    return Fake(lib, cp, registration)
