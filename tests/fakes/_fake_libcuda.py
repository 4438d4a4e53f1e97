"""The tests' CUDA without a GPU: tests/fakes/fakecuda.c (a stand-in for libcuda) and
tests/fakes/fakecupy.py (a stand-in for CuPy's Python API, calling it).

``build(directory)`` compiles fakecuda.c into a ``libcuda.so.1``; ``load(path)`` loads
it (RTLD_GLOBAL, before etptr looks for libcuda, which then finds this one) and returns
a :class:`Fake`: its knobs, call log and fault injection, and ``make_cupy()`` for a
fakecupy module over it. ``start()`` does both for the fake-GPU mode of tests/cuda
(``ETPTR_FAKE_CUPY=1``), reusing the library named by ``ETPTR_FAKE_LIBCUDA`` (which it
sets, for the processes the tests start). ``setup(path)`` is the whole setup of a
test process of tests/fakes/test_fake_libcuda.py: the fake CuPy as etptr's backend, and a
CudaAllocator registered over it. ``run(path, body)`` runs such a process.
"""
import atexit
import collections
import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fakecuda.c")
_LONGS = {"fake_fail_after", "fake_fail_copies_after", "fake_writes", "fake_writes64",
          "fake_copies", "fake_syncs", "fake_overruns", "fake_bad_device", "fake_launches",
          "fake_calls", "fake_stale_regions"}
_ULONGLONGS = {"fake_contexts"}
ENV = "ETPTR_FAKE_LIBCUDA"         # the built library, for the processes tests start


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


def built():
    """The library named by ETPTR_FAKE_LIBCUDA, else one built now into a folder removed at
    exit (and named in ETPTR_FAKE_LIBCUDA from then on); None without a C compiler."""
    path = os.environ.get(ENV)
    if path and os.path.exists(path):
        return path
    if not os.path.exists(SOURCE):
        return None
    directory = tempfile.mkdtemp(prefix="etptr-fakecuda-")
    atexit.register(shutil.rmtree, directory, True)
    path = build(directory)
    if path is not None:
        os.environ[ENV] = path
    return path


# One entry of the call log (struct FakeCall): ``what`` is one of WHAT's names.
Call = collections.namedtuple("Call", "what nbytes dst src stream pinned device")
WHAT = {1: "htod", 2: "dtoh", 3: "dtod", 4: "stream_sync", 5: "event_sync", 6: "wait",
        7: "write32", 8: "write64", 9: "mark", 10: "launch"}


class _FakeCall(ctypes.Structure):
    _fields_ = [("what", ctypes.c_int), ("pinned", ctypes.c_int), ("device", ctypes.c_int),
                ("pad", ctypes.c_int), ("nbytes", ctypes.c_uint64), ("dst", ctypes.c_uint64),
                ("src", ctypes.c_uint64), ("handle", ctypes.c_uint64)]


def _prototypes(lib):
    P, U64, SZ, UI, I = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
    PP, PI = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
    for name, args in {
            "cuInit": [UI], "cuCtxGetCurrent": [PP], "cuCtxSetCurrent": [P],
            "cuCtxGetDevice": [PI], "cuDeviceGet": [PI, I], "cuDevicePrimaryCtxRetain": [PP, I],
            "cuStreamCreate": [PP, UI], "cuStreamDestroy_v2": [P], "cuStreamSynchronize": [P],
            "cuEventCreate": [PP, UI], "cuEventDestroy_v2": [P], "cuEventRecord": [P, P],
            "cuEventSynchronize": [P], "cuEventQuery": [P], "cuStreamWaitEvent": [P, P, UI],
            "cuMemcpyHtoDAsync_v2": [U64, P, SZ, P], "cuMemcpyDtoHAsync_v2": [P, U64, SZ, P],
            "cuMemcpyDtoDAsync_v2": [U64, U64, SZ, P],
            "fake_register": [SZ, SZ, I, I], "fake_unregister": [SZ],
            "fake_log_read": [ctypes.POINTER(_FakeCall), ctypes.c_long, ctypes.c_long],
            "fake_log_mark": [U64]}.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = I
    lib.fake_register.restype = lib.fake_unregister.restype = lib.fake_log_mark.restype = None
    lib.fake_log_clear.restype = lib.fake_reset_contexts.restype = None
    lib.fake_log_length.restype = lib.fake_log_read.restype = ctypes.c_long


class Fake:
    """The loaded fake driver: its knobs (``knob(name)``: one of its globals, a ctypes
    value), its call log and its fault injection."""

    def __init__(self, lib):
        self.lib = lib
        self.cupy = None               # setup(): etptr's backend
        self.registration = None       # setup(): the CudaAllocator's, kept for the process

    def knob(self, name):
        kind = (ctypes.c_long if name in _LONGS else
                ctypes.c_ulonglong if name in _ULONGLONGS else ctypes.c_int)
        return kind.in_dll(self.lib, name)

    def make_cupy(self, ndev=2, device_bytes=1 << 30):
        """A fresh fakecupy module over this driver (see fakecupy.make)."""
        spec = importlib.util.spec_from_file_location("etptr_tests_fakecupy",
                                                      os.path.join(HERE, "fakecupy.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.make(self.lib, ndev=ndev, device_bytes=device_bytes)

    # the call log: what the driver was asked to do, in order (see fakecuda.c)

    def log(self, on=True):
        """Empty the log, and record from now on (``on``) or not."""
        self.knob("fake_log_on").value = 0
        self.lib.fake_log_clear()
        self.knob("fake_log_on").value = int(on)

    def clear(self):
        """Empty the log (it goes on recording)."""
        self.lib.fake_log_clear()

    def mark(self, tag=0):
        """Put a "mark" entry (nbytes=tag) in the log: where something happened among the calls."""
        self.lib.fake_log_mark(tag)

    @property
    def calls(self):
        """The log as Call tuples, oldest first."""
        out, at = [], 0
        chunk = (_FakeCall * 4096)()
        while True:
            n = self.lib.fake_log_read(chunk, at, len(chunk))
            out.extend(Call(WHAT[c.what], c.nbytes, c.dst, c.src, c.handle, bool(c.pinned),
                            c.device) for c in chunk[:n])
            at += n
            if n < len(chunk):
                return out

    def copies(self, what):
        """The logged copies of one direction: "htod", "dtoh" or "dtod"."""
        return [c for c in self.calls if c.what == what]

    # fault injection

    @property
    def fail_copies_after(self):
        """Copy calls still accepted before each one is refused with
        FAKECUDA_INJECTED_FAILURE (synchronously, not sticky); None: never."""
        n = self.knob("fake_fail_copies_after").value
        return None if n < 0 else n

    @fail_copies_after.setter
    def fail_copies_after(self, n):
        self.knob("fake_fail_copies_after").value = -1 if n is None else n


def load(path):
    """Load the fake driver at ``path`` (before etptr looks for libcuda)."""
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    _prototypes(lib)
    return Fake(lib)


def start():
    """The fake driver loaded (built first where ETPTR_FAKE_LIBCUDA names none), or None
    without a C compiler."""
    path = built()
    return None if path is None else load(path)


def setup(path):
    """A test process of tests/fakes/test_fake_libcuda.py: the fake driver at ``path``, a fake
    CuPy over it as etptr's backend, a CudaAllocator registered."""
    fake = load(path)
    sys.path.insert(0, HERE)
    from etptr.cuda import CudaAllocator, _driver
    from etptr.testing import use_allocator
    fake.cupy = fake.make_cupy(ndev=2)
    _driver._use_backend(fake.cupy)
    assert _driver._driver_calls() == "libcuda", _driver._driver_calls()
    fake.registration = use_allocator(CudaAllocator())
    fake.registration.__enter__()
    return fake


def run(path, body, timeout=120, env=None):
    """Run ``body`` in a fresh interpreter after ``F = setup(path)`` (with ``ctypes``,
    ``threading``, ``time``, ``np``, ``etptr``, ``_small_copy``, ``_tuning`` and the
    pinned ``pool`` at hand); its stdout (the process must exit 0)."""
    code = (f"import sys; sys.path.insert(0, {HERE!r})\n"
            f"import _fake_libcuda; F = _fake_libcuda.setup({path!r})\n"
            "import ctypes, threading, time\nimport numpy as np\nimport etptr\n"
            "from etptr.cuda import _small_copy, _tuning\n"
            "pool = etptr.cuda.get_pinned_host_pool()\n" + textwrap.dedent(body))
    env = dict(os.environ if env is None else env)
    env.pop("ETPTR_FAKE_CUPY", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=HERE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
