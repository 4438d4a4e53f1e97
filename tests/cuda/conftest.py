"""Fixtures for the CUDA tests: CuPy and a device, or skip the whole directory.

With ``ETPTR_FAKE_CUPY=1`` the tests run without a GPU: against tests/fakes/fakecuda.c, a
stand-in for libcuda built here with the C compiler (they skip without one), and
tests/fakes/fakecupy.py over it for CuPy's Python API (host memory standing in for the
device). That exercises the copy engine's logic and its libcuda paths; tests that need
real CuPy arrays skip there.
"""
import gc
import os

import pytest

import etptr
from etptr.cuda import _driver
from etptr.testing import use_allocator

import _fake_libcuda

FAKE = os.environ.get("ETPTR_FAKE_CUPY") == "1"
FAKE_DRIVER = None          # the loaded tests/fakes/fakecuda.c (an _fake_libcuda.Fake)


def _find_cupy():
    global FAKE_DRIVER
    if FAKE:
        FAKE_DRIVER = _fake_libcuda.start()
        if FAKE_DRIVER is None:
            return None, ("the fake GPU (ETPTR_FAKE_CUPY=1) needs a C compiler to build "
                          f"tests/fakes/fakecuda.c ({os.environ.get('CC', 'cc')!r} could not "
                          f"build it)")
        FAKE_DRIVER.cupy = FAKE_DRIVER.make_cupy(ndev=2)
        return FAKE_DRIVER.cupy, "fake CuPy over tests/fakes/fakecuda.c (ETPTR_FAKE_CUPY=1)"
    try:
        import cupy
    except ImportError as exc:
        return None, f"CuPy is not installed ({exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA device ({exc})"
    if n < 1:
        return None, "no CUDA device"
    return cupy, ""


CP, WHY = _find_cupy()


@pytest.fixture(autouse=True, scope="session")
def _cuda_session():
    if CP is None:
        pytest.skip(WHY)
    if FAKE:
        _driver._use_backend(CP)
    yield
    if FAKE:
        _driver._use_backend(None)


@pytest.fixture(autouse=True)
def _allocator(_cuda_session):
    """The CudaAllocator every test uses (the registered one on a real device)."""
    from etptr.cuda import CudaAllocator
    if FAKE:
        a = CudaAllocator()
        with use_allocator(a):
            yield a
    else:
        a = etptr.get_device_allocator(etptr.DeviceType.CUDA)
        assert isinstance(a, CudaAllocator)
        yield a
    gc.collect()


@pytest.fixture
def alloc(_allocator):
    return _allocator


@pytest.fixture
def cp():
    """CuPy, or the fake standing in for it."""
    return CP


@pytest.fixture
def fake():
    """The fake driver (its call log, from this test's start, and fault injection; see
    tests/fakes/_fake_libcuda.py), or skip on a real device."""
    if not FAKE:
        pytest.skip("needs the fake GPU (its call log and fault injection)")
    FAKE_DRIVER.log()
    FAKE_DRIVER.fail_copies_after = None
    CP.state.fail_host_alloc = 0
    yield FAKE_DRIVER
    FAKE_DRIVER.log(on=False)
    FAKE_DRIVER.fail_copies_after = None
    CP.state.fail_host_alloc = 0


@pytest.fixture
def no_kernel(fake):
    """The fake driver without etptr's copy kernel (cuModuleLoadData fails, as in a driver
    that cannot load PTX): the batch layer copies small scattered pieces one by one, and
    holds no scratch area on the device."""
    from etptr.cuda import _batch
    fake.knob("fake_kernels").value = 0
    _batch._forget_scratch()
    yield fake
    fake.knob("fake_kernels").value = 1
    _batch._forget_scratch()


@pytest.fixture
def real_cupy():
    """Real CuPy with a device (interop tests), or skip under the fake."""
    if FAKE:
        pytest.skip("needs real CuPy arrays")
    return CP


@pytest.fixture
def ndev():
    return CP.cuda.runtime.getDeviceCount()


@pytest.fixture
def pool():
    p = etptr.cuda.get_pinned_host_pool()
    return p


@pytest.fixture
def device_used():
    """used_bytes() of CuPy's memory pool on the current device, after a gc."""
    def used():
        gc.collect()
        return CP.get_default_memory_pool().used_bytes()
    return used
