"""Safety checks that need a real CUDA device, CuPy and (for some) torch.

The host-only part of the safety suite is tests/safety/test_safety*.py; these skip under
the fake CuPy (``ETPTR_FAKE_CUPY=1``) and without a device.
"""
import numpy as np
import pytest

import etptr

SHAPES = [(0,), (3, 0), (0, 4, 2)]


def _zero_size_device_tensor(how, shape):
    if how == "empty":
        return etptr.empty(list(shape), device="cuda")
    return etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr(np.zeros(shape, np.float32)), "cuda")


@pytest.mark.parametrize("how", ["empty", "clone_tensor_ptr_to"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_zero_size_device_tensor_round_trips_through_cupy(real_cupy, how, shape):
    """Item 11 (zero-size device tensors export): a zero-size CUDA tensor goes to CuPy
    through ``cupy.from_dlpack`` and ``cupy.asarray`` (the CUDA Array Interface), and back
    through ``etptr.from_dlpack`` / ``from_cuda_array_interface``, keeping its shape."""
    cupy = real_cupy
    t = _zero_size_device_tensor(how, shape)
    assert t.numel() == 0 and t.device.type == etptr.DeviceType.CUDA
    x = cupy.from_dlpack(t)
    assert x.shape == shape and x.dtype == np.float32 and x.size == 0
    assert x.device.id == t.device.index
    y = cupy.asarray(t)
    assert y.shape == shape and y.dtype == np.float32 and y.size == 0
    assert (x + 1).shape == shape                       # CuPy can compute with it
    for back in (etptr.from_dlpack(x), etptr.from_cuda_array_interface(y)):
        assert back.sizes == shape and back.numel() == 0
        assert back.device == t.device
        assert etptr.clone_tensor_ptr_to_cpu(back).numpy().shape == shape


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_zero_size_device_tensor_round_trips_through_torch(real_cupy, shape):
    """Item 11: the same through ``torch.from_dlpack`` and back."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    t = _zero_size_device_tensor("empty", shape)
    x = torch.from_dlpack(t)
    assert tuple(x.shape) == shape and x.numel() == 0
    assert x.device.type == "cuda" and x.device.index == t.device.index
    assert x.dtype == torch.float32
    assert tuple((x + 1).shape) == shape
    back = etptr.from_dlpack(x)
    assert back.sizes == shape and back.device == t.device
    assert etptr.clone_tensor_ptr_to_cpu(back).numpy().shape == shape
