"""DeviceMemoryBuffer: one device allocation through the registry, with tensor views.

Mirrors ExecuTorch ``runtime/core/device_memory_buffer.h``: ``create(size,
device_type, device_index)`` asks the allocator registered for the device type
for one allocation and owns it; the memory goes back through the same
allocator. Here the buffer and every TensorPtr viewing it share the
allocation (a :class:`~etptr._core._storage.Storage`), so it is freed when the
buffer and the last view are gone; ``close()`` refuses new views and lets go
of the buffer's own hold. Registry-generic: it works with any registered
allocator, ``HostDeviceAllocator`` included.
"""
cimport cython
from libc.stdint cimport INT64_MAX, int64_t, uintptr_t

from etptr._core._codes cimport DEVICE_CPU, TYPE_FLOAT
from etptr._core._args cimport c_count_arg, c_int_arg
from etptr._core._device cimport Device, c_device, c_make_device
from etptr._core._device_allocator cimport DeviceAllocator, c_allocator_for
from etptr._core._error cimport raise_error
from etptr._core._metadata cimport Metadata, c_metadata, c_nbytes, c_tuple64
from etptr._core._scalar_type cimport c_element_size
from etptr._core._storage cimport Storage, c_device_storage
from etptr._core._tensor_ptr cimport TensorPtr, c_dynamism_arg, c_new_tensor, c_type_arg

from etptr._core import _device_allocator
from etptr._core._error import Error
from etptr._core._scalar_type import ScalarType
from etptr._core._tensor_ptr import TensorShapeDynamism


cdef DeviceMemoryBuffer c_buffer_create(int64_t nbytes, Device device, int64_t alignment,
                                        object stream):
    """One allocation of ``nbytes`` on ``device`` through its allocator."""
    cdef DeviceMemoryBuffer b
    cdef DeviceAllocator alloc
    cdef int index
    if alignment <= 0 or (alignment & (alignment - 1)) != 0:
        raise_error(Error.InvalidArgument, f"alignment={alignment}: must be a power of two")
    if device.c_type == DEVICE_CPU:
        raise_error(Error.NotFound,
                    "device=cpu: no DeviceAllocator is registered for DeviceType.CPU (a "
                    "DeviceMemoryBuffer holds device memory; host memory needs none)")
    alloc = c_allocator_for(device.c_type, device.c_index, "device")
    index = alloc.c_resolve_index(device.c_index)
    b = DeviceMemoryBuffer.__new__(DeviceMemoryBuffer)
    b.c_storage = c_device_storage(alloc, nbytes, index, alignment, stream)
    b.c_ptr = b.c_storage.c_ptr
    b.c_nbytes = nbytes
    b.c_device = c_make_device(device.c_type, index)
    b.c_allocator = alloc
    return b


cdef TensorPtr c_buffer_view(Storage storage, uintptr_t address, Metadata meta, int type,
                             int dynamism, Device device):
    return c_new_tensor(meta, type, dynamism, device, storage, address, False)


@cython.final
cdef class DeviceMemoryBuffer:
    """One device allocation made through the registered allocator, and tensor views of it.

    Mirrors ExecuTorch's ``DeviceMemoryBuffer``. Build it with :meth:`create`.
    The memory goes back through the allocator when the buffer and every view
    made by :meth:`tensor` are gone; after :meth:`close` (or the end of a
    ``with`` block) no new view can be made, and the memory is freed as soon as
    the live views are gone. The memory is not initialised.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("DeviceMemoryBuffer cannot be built directly: use "
                        "DeviceMemoryBuffer.create(nbytes, device)")

    @staticmethod
    def create(nbytes, device="cuda", *, alignment=_device_allocator.DEFAULT_ALIGNMENT,
               stream=None):
        """Allocate ``nbytes`` bytes on ``device`` (ExecuTorch ``DeviceMemoryBuffer::create``).

        Parameters
        ----------
        nbytes : int, bytes
        device : Device, DeviceType or str ("cuda", "cuda:N"); index -1 is the current device
        alignment : int, power of two, bytes (the CUDA allocator guarantees up to 256)
        stream : CUDA stream, optional, handed to allocators that take one

        Raises
        ------
        NotFoundError
            No allocator is registered for the device type (CPU has none).
        MemoryAllocationError
            The allocator could not allocate.
        InvalidArgumentError
            A negative ``nbytes`` or an ``alignment`` that is not a power of two.
        """
        return c_buffer_create(c_count_arg(nbytes, "nbytes"), c_device(device, "device"),
                               c_int_arg(alignment, "alignment", 1, 1 << 30), stream)

    @property
    def data_ptr(self):
        """Device address of the allocation (int; 0 for a 0-byte buffer)."""
        return self.c_ptr

    @property
    def nbytes(self):
        """Bytes allocated (ExecuTorch's ``size()``)."""
        return self.c_nbytes

    @property
    def device(self):
        """The :class:`Device` holding the memory (a concrete index)."""
        return self.c_device

    @property
    def allocator(self):
        """The :class:`~etptr.DeviceAllocator` that allocated the memory (and frees it)."""
        return self.c_allocator

    @property
    def closed(self):
        """True after :meth:`close`: no new views can be made."""
        return self.c_storage is None

    def tensor(self, offset, sizes, type=ScalarType.Float, *, dim_order=None, strides=None,
               dynamism=TensorShapeDynamism.DYNAMIC_BOUND):
        """A TensorPtr view of the buffer at byte ``offset``.

        Parameters
        ----------
        offset : int, bytes from the start of the buffer; a multiple of the element size
        sizes : sequence of int, length ndim
        type : ScalarType, a NumPy dtype or a ScalarType name (default Float)
        dim_order, strides : as for :func:`etptr.make_tensor_ptr` (strides in elements)
        dynamism : TensorShapeDynamism

        Raises
        ------
        InvalidArgumentError
            ``offset`` negative, not aligned for the type, or the view runs past the
            end of the buffer; bad sizes, dim_order or strides.
        InvalidStateError
            The buffer is closed.
        """
        return self._view(c_count_arg(offset, "offset"), c_metadata(sizes, dim_order, strides),
                          c_type_arg(type, TYPE_FLOAT), c_dynamism_arg(dynamism))

    def _views(self, offsets, shapes, types):
        """``[tensor(o, s, t) for o, s, t in zip(offsets, shapes, types)]``, row-major and
        DYNAMIC_BOUND, in one call: each distinct ``type`` object is read once (a
        checkpoint's hundreds of views, once its upload is done).
        Raises as :meth:`tensor`, and ValueError when the three differ in length; the
        views made before are dropped."""
        cdef list out = []
        cdef dict codes = {}
        for off, sizes, t in zip(offsets, shapes, types, strict=True):
            key = (type(t), t)              # 6.0 == Float, True == 1: not the same argument
            try:
                code = codes.get(key)
            except TypeError:               # unhashable: refused by c_type_arg below
                code = None
            if code is None:
                code = c_type_arg(t, TYPE_FLOAT)
                codes[key] = code
            out.append(self._view(c_count_arg(off, "offset"), c_metadata(sizes, None, None),
                                  code, 1))
        return out

    cdef TensorPtr _view(self, int64_t off, Metadata meta, int t, int dyn):
        """The view at byte ``off`` of ``meta`` and type ``t``, checked against the buffer."""
        cdef Storage s = self.c_storage
        cdef int64_t need = c_nbytes(meta.numel, t)
        cdef int64_t esize = c_element_size(t)
        if s is None:
            raise_error(Error.InvalidState, "the DeviceMemoryBuffer is closed: it makes no new views")
        if (self.c_ptr + <uintptr_t>off) % <uintptr_t>esize:
            raise_error(Error.InvalidArgument,
                        f"offset={off}: the view's address {self.c_ptr + off:#x} is not aligned "
                        f"to its element size ({esize} bytes)")
        if off > self.c_nbytes or need > self.c_nbytes - off:
            raise_error(Error.InvalidArgument,
                        f"offset={off}, sizes={c_tuple64(meta.sizes, meta.dim)}: "
                        f"{need} bytes from offset {off} run past the buffer's {self.c_nbytes} bytes")
        return c_buffer_view(s, self.c_ptr + off, meta, t, dyn, self.c_device)

    def close(self):
        """Refuse new views; the memory goes back once the live views are gone. Idempotent."""
        self.c_storage = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"<DeviceMemoryBuffer {self.c_device} data_ptr={self.c_ptr:#x} "
                f"nbytes={self.c_nbytes}{' closed' if self.c_storage is None else ''}>")
