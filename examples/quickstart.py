"""etptr in a few lines: tensors over NumPy memory, views, clones, resizes, makers,
and a device allocator of your own.

Run it with ``python examples/quickstart.py``; ``mypy --strict examples/quickstart.py``
type-checks it against etptr's stubs.
"""
from __future__ import annotations

import ctypes

import numpy as np

import etptr
from etptr import DeviceType, ScalarType, TensorShapeDynamism
from etptr.testing import use_allocator


def tensors() -> None:
    # make_tensor_ptr(ndarray) aliases the array: no copy, its own sizes and strides
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = etptr.make_tensor_ptr(a)
    assert (t.sizes, t.dim_order, t.strides) == ((3, 4), (0, 1), (4, 1))
    assert t.data_ptr == a.ctypes.data

    # the list overload copies and deduces the type; dim_order picks the layout
    u = etptr.make_tensor_ptr([2, 3], [1, 2, 3, 4, 5, 6], dim_order=[1, 0])
    assert u.scalar_type == ScalarType.Long and u.strides == (1, 2)

    # a view of the same memory with new sizes (the alias overload); it keeps t alive
    v = etptr.make_tensor_ptr(t, [2, 6])
    assert v.data_ptr == t.data_ptr and v.sizes == (2, 6)

    # a deep copy with a cast, under ExecuTorch's canCast rules
    h = etptr.clone_tensor_ptr(t, ScalarType.Half)
    assert h.scalar_type == ScalarType.Half and h.numpy()[2, 3] == 11.0

    # resize in place, within the element count the tensor was created with
    d = etptr.zeros([4, 5], dynamism=TensorShapeDynamism.DYNAMIC_BOUND)
    etptr.resize_tensor_ptr(d, [2, 10])
    assert d.sizes == (2, 10) and d.strides == (10, 1)

    # makers
    ones = etptr.ones([2, 2], ScalarType.Int)
    full = etptr.full([3], 7.5, ScalarType.Double)
    r = etptr.randint(0, 10, [8])
    assert int(ones.numpy().sum()) == 4 and float(full.numpy()[0]) == 7.5
    assert r.numpy().min() >= 0 and r.numpy().max() < 10
    print("tensors:", t, v, h, d, sep="\n  ")


class HostMemoryAllocator(etptr.DeviceAllocator):
    """A "device" backed by host memory, to show the DeviceAllocator interface."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[int, ctypes.Array[ctypes.c_char]] = {}

    @property
    def device_type(self) -> DeviceType:
        return DeviceType.CUDA

    def allocate(self, nbytes: int, index: int, alignment: int = etptr.DEFAULT_ALIGNMENT) -> int:
        block = ctypes.create_string_buffer(max(nbytes, 1))
        address = ctypes.addressof(block)
        self.blocks[address] = block
        return address

    def deallocate(self, ptr: int, index: int) -> None:
        self.blocks.pop(ptr, None)

    def copy_host_to_device(self, dst: int, src: int, nbytes: int, index: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def copy_device_to_host(self, dst: int, src: int, nbytes: int, index: int) -> None:
        ctypes.memmove(dst, src, nbytes)


def devices() -> None:
    alloc = HostMemoryAllocator()
    with use_allocator(alloc):
        host = etptr.make_tensor_ptr(np.arange(6, dtype=np.int64))
        dev = etptr.clone_tensor_ptr_to(host, "cuda:0")
        assert dev.device == etptr.Device("cuda:0") and len(alloc.blocks) == 1
        back = etptr.clone_tensor_ptr_to(dev, "cpu")
        assert back.numpy().tolist() == [0, 1, 2, 3, 4, 5]
        z = etptr.zeros([2, 3], device="cuda")     # makers allocate through the registry
        print("devices: (cuda:0 is host memory here, see HostMemoryAllocator)", dev, z,
              sep="\n  ")
        del dev, z
    assert not alloc.blocks                          # every block went back to the allocator


if __name__ == "__main__":
    tensors()
    devices()
