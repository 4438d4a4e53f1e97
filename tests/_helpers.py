"""Helpers shared by the etptr unit tests (imported by conftest.py and the test modules)."""
import ctypes
import functools
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import etptr
from etptr import DeviceType

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
#: The stand-ins for CuPy and libcuda (fakecupy.py, fakecuda.c, _fake_libcuda.py).
FAKES_DIR = os.path.join(TESTS_DIR, "fakes")
# Where the etptr under test was imported from: the installed package, or the
# checkout itself after an in-place build. Child interpreters must import the same one.
ETPTR_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(etptr.__file__)))


@functools.lru_cache(maxsize=None)
def cuda_available():
    """True when CuPy imports and reports at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class PyAllocator(etptr.DeviceAllocator):
    """A DeviceAllocator written in Python, with switches to make each call misbehave.

    ``live`` maps address -> ctypes block for memory not yet deallocated, so a
    test can check that etptr frees what it takes on every path.
    """

    def __init__(self, device_type=DeviceType.CUDA):
        super().__init__()
        self._kind = device_type
        self.live = {}
        self.calls = []
        self.allocate_result = None    # callable(ptr) -> what allocate returns
        self.h2d_error = None          # exception instance raised by copy_host_to_device
        self.d2h_error = None          # exception instance raised by copy_device_to_host
        self.dealloc_error = None      # exception instance raised by deallocate
        self.host_buffer = None        # callable(nbytes) -> what allocate_host returns
        self.resolved = None           # what resolve_index returns, when set

    @property
    def device_type(self):
        return self._kind

    def allocate(self, nbytes, index, alignment=etptr.DEFAULT_ALIGNMENT):
        block = ctypes.create_string_buffer(max(int(nbytes), 1))
        ptr = ctypes.addressof(block)
        self.live[ptr] = block
        self.calls.append(("allocate", nbytes, index, alignment))
        return ptr if self.allocate_result is None else self.allocate_result(ptr)

    def deallocate(self, ptr, index):
        self.calls.append(("deallocate", ptr, index))
        if self.dealloc_error is not None:
            raise self.dealloc_error
        self.live.pop(int(ptr), None)

    def copy_host_to_device(self, dst, src, nbytes, index):
        self.calls.append(("h2d", dst, src, nbytes, index))
        if self.h2d_error is not None:
            raise self.h2d_error
        ctypes.memmove(int(dst), int(src), nbytes)

    def copy_device_to_host(self, dst, src, nbytes, index):
        self.calls.append(("d2h", dst, src, nbytes, index))
        if self.d2h_error is not None:
            raise self.d2h_error
        ctypes.memmove(int(dst), int(src), nbytes)

    def resolve_index(self, index):
        if self.resolved is not None:
            return self.resolved
        return super().resolve_index(index)

    def allocate_host(self, nbytes, index):
        self.calls.append(("allocate_host", nbytes, index))
        return None if self.host_buffer is None else self.host_buffer(nbytes)

    def named(self, name):
        return [c[1:] for c in self.calls if c[0] == name]


def child_env(**extra):
    """The environment for a child interpreter that must import the etptr under test.

    etptr's own location first (so a checkout's uncompiled sources never shadow an
    installed package), then tests/ for ``_helpers``. Run the child with
    ``cwd=ETPTR_PARENT`` (or any folder without an ``etptr`` in it): ``python -c`` puts
    its working folder first on sys.path.
    """
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ETPTR_PARENT, TESTS_DIR, FAKES_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return env


def run_isolated(code, timeout=60):
    """Run ``code`` in a fresh interpreter; returns the CompletedProcess.

    A segfault shows as a negative ``returncode`` instead of killing the run.
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout,
                          cwd=ETPTR_PARENT, env=child_env())


# Every scalar type NumPy has that ExecuTorch has too, as (NumPy type, ScalarType).
NUMPY_TYPES = [
    (np.uint8, etptr.ScalarType.Byte), (np.int8, etptr.ScalarType.Char), (np.int16, etptr.ScalarType.Short),
    (np.int32, etptr.ScalarType.Int), (np.int64, etptr.ScalarType.Long), (np.float16, etptr.ScalarType.Half),
    (np.float32, etptr.ScalarType.Float), (np.float64, etptr.ScalarType.Double),
    (np.complex64, etptr.ScalarType.ComplexFloat), (np.complex128, etptr.ScalarType.ComplexDouble),
    (np.bool_, etptr.ScalarType.Bool), (np.uint16, etptr.ScalarType.UInt16),
    (np.uint32, etptr.ScalarType.UInt32), (np.uint64, etptr.ScalarType.UInt64),
]


# Script text for run_isolated: fork_and_wait(child) forks, runs child() in the child and
# exits with its status (os._exit, or with normal_exit through the interpreter's
# shutdown), and returns the child's exit code; a child that hangs past ``limit`` s is
# killed and fails the script. Indented like the scripts it is prepended to.
FORK_AND_WAIT = """
    import os, signal, sys, time, traceback, warnings

    def fork_and_wait(child, limit=60, normal_exit=False):
        # fork; run child() there and exit with its status (os._exit, or with
        # normal_exit through the interpreter's shutdown); wait at most ``limit`` s
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # fork with threads running
            pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.alarm(limit)          # a hang in the child ends it with SIGALRM
                status = child()
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                if not normal_exit:
                    os._exit(status)
            raise SystemExit(status)         # unwinds the script: atexit, module teardown
        deadline = time.monotonic() + limit + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung")
"""


def run_threads(targets, seconds):
    """Run the callables in threads with a tiny switch interval until ``seconds`` pass
    (each callable gets the deadline); returns what they raised."""
    errors = []
    deadline = time.monotonic() + seconds

    def run(fn):
        try:
            fn(deadline)
        except BaseException as exc:      # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in targets]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)     # liveness only: a thread still running has hung
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    return errors


# ---------------------------------------------------------------- the safety suites
def arange_from_one(n, dtype=np.float32):
    return np.arange(1, n + 1, dtype=dtype)


def host_tensor(n, dtype=np.float32):
    """A CPU tensor that owns a copy of 1..n (DYNAMIC_BOUND, bound n)."""
    return etptr.clone_tensor_ptr(etptr.make_tensor_ptr(arange_from_one(n, dtype)))


def device_bytes(t):
    """The bytes of a tensor in HostDeviceAllocator memory (host memory under the label)."""
    return ctypes.string_at(t.data_ptr, t.nbytes)


def buffer_address(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def outcome(fn):
    """What ``fn()`` raised (any BaseException, so that an interrupt cannot escape the
    test), or None."""
    try:
        fn()
    except BaseException as exc:      # noqa: BLE001 - the test inspects it
        return exc
    return None
