"""Shared fixtures for etptr's tests: unit/ (one file per module or concern), safety/
(bad input, interrupts, fuzzing, lifetimes), cuda/ (needs CuPy and a GPU, or the stand-ins
with ETPTR_FAKE_CUPY=1) and fakes/ (the stand-ins for CuPy and libcuda, with their tests).

* an autouse fixture that puts the device-allocator registry back as it was
  after every test, so a test that registers an allocator cannot leak it;
* ``host_alloc`` / ``py_alloc``: a host-simulated CUDA allocator installed for
  one test (HostDeviceAllocator, and a Python DeviceAllocator subclass whose
  calls can be made to fail);
* the ``cuda`` marker: tests marked ``@pytest.mark.cuda`` are skipped unless
  CuPy imports and sees a CUDA device.
"""
import gc
import os
import sys

import pytest

import etptr
from etptr import DeviceType
from etptr._core._device_allocator import _replace_allocator
from etptr.testing import HostDeviceAllocator, use_allocator

from _helpers import FAKES_DIR, PyAllocator, cuda_available

sys.path.insert(0, FAKES_DIR)        # import fakecupy, _fake_libcuda
assert os.path.isdir(FAKES_DIR), FAKES_DIR


@pytest.fixture(autouse=True)
def _restore_allocator_registry():
    """Snapshot the registry before each test and restore it afterwards."""
    before = {dt: etptr.get_device_allocator(dt) for dt in DeviceType}
    yield
    for dt, alloc in before.items():
        if etptr.get_device_allocator(dt) is not alloc:
            _replace_allocator(dt, alloc)


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not cuda_available():
        pytest.skip("needs CuPy and a CUDA device")


@pytest.fixture
def host_alloc():
    """A fresh counting HostDeviceAllocator installed as the CUDA allocator."""
    alloc = HostDeviceAllocator(DeviceType.CUDA)
    with use_allocator(alloc):
        yield alloc
    gc.collect()


@pytest.fixture
def py_alloc():
    """A fresh PyAllocator installed as the CUDA allocator."""
    alloc = PyAllocator(DeviceType.CUDA)
    with use_allocator(alloc):
        yield alloc
    gc.collect()
