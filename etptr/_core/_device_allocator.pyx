"""Device allocators and their process-wide, typed registry.

Mirrors ExecuTorch ``runtime/core/device_allocator.h``: one
:class:`DeviceAllocator` per :class:`DeviceType`, registered once, looked up
by tensors that live on (or are cloned to) that device type.
"""
cimport cython

import threading

from etptr._core._device cimport Device, c_device
from etptr._core._error cimport raise_error
from etptr._core._error import Error
from etptr._core._device import DeviceType

DEFAULT_ALIGNMENT = 8  # bytes, ExecuTorch's kDefaultAlignment


cdef class DeviceAllocator:
    """DeviceAllocator()

    Interface of an allocator of device memory (ExecuTorch ``DeviceAllocator``).

    Subclass it, from Python or Cython, and implement ``device_type``,
    ``allocate``, ``deallocate``, ``copy_host_to_device`` and
    ``copy_device_to_host``. Every address is a Python ``int``; every size is
    in bytes. The base methods raise :class:`NotSupportedError`.

    Examples
    --------
    >>> import ctypes, etptr
    >>> class Fake(etptr.DeviceAllocator):
    ...     device_type = etptr.DeviceType.CUDA
    ...     def __init__(self):
    ...         self.blocks = {}
    ...     def allocate(self, nbytes, index, alignment=8):
    ...         b = ctypes.create_string_buffer(max(nbytes, 1))
    ...         self.blocks[ctypes.addressof(b)] = b
    ...         return ctypes.addressof(b)
    ...     def deallocate(self, ptr, index):
    ...         self.blocks.pop(ptr, None)
    ...     def copy_host_to_device(self, dst, src, nbytes, index):
    ...         ctypes.memmove(dst, src, nbytes)
    ...     def copy_device_to_host(self, dst, src, nbytes, index):
    ...         ctypes.memmove(dst, src, nbytes)
    >>> Fake().device_type
    <DeviceType.CUDA: 1>
    """

    @property
    def device_type(self):
        """The :class:`DeviceType` this allocator serves."""
        raise_error(Error.NotSupported,
                    f"{type(self).__name__}.device_type must be implemented by subclasses")

    def allocate(self, nbytes, index, alignment=DEFAULT_ALIGNMENT):
        """Allocate ``nbytes`` bytes on device ``index`` and return the address.

        Parameters
        ----------
        nbytes : int, size in bytes
        index : int, device index (-1 = current device)
        alignment : int, power of two, bytes

        Raises
        ------
        MemoryAllocationError
            The device has not got the memory.
        """
        raise_error(Error.NotSupported,
                    f"{type(self).__name__}.allocate must be implemented by subclasses")

    def deallocate(self, ptr, index):
        """Free memory from :meth:`allocate`. ``ptr == 0`` is a no-op.
        """
        raise_error(Error.NotSupported,
                    f"{type(self).__name__}.deallocate must be implemented by subclasses")

    def copy_host_to_device(self, dst, src, nbytes, index):
        """Copy ``nbytes`` bytes from host address ``src`` to device address ``dst``.
        Synchronous from the caller's view: ``src`` may be reused on return.
        """
        raise_error(Error.NotSupported,
                    f"{type(self).__name__}.copy_host_to_device must be implemented by subclasses")

    def copy_device_to_host(self, dst, src, nbytes, index):
        """Copy ``nbytes`` bytes from device address ``src`` to host address ``dst``.
        Synchronous from the caller's view: ``dst`` holds the data on return.
        """
        raise_error(Error.NotSupported,
                    f"{type(self).__name__}.copy_device_to_host must be implemented by subclasses")

    def resolve_index(self, index):
        """The device index that ``index`` stands for: -1 (the current device)
        becomes a concrete index. The base class maps -1 to 0.
        """
        return 0 if index == -1 else index

    def allocate_host(self, nbytes, index):
        """Optional hook: host memory that device->host clones land in (e.g. a
        page-locked block). The object must expose a writable buffer of at
        least ``nbytes`` bytes and owns the memory; ``None`` (the default)
        makes etptr use ordinary pageable memory.
        """
        return None


# ------------------------------------------------------------------ registry

cdef cython.pymutex _lock
cdef dict _allocators = {}
cdef set _autoload_tried = set()       # device types whose built-in allocator was tried
cdef object _autoload_lock = threading.RLock()


cdef object _device_type_of(object alloc):
    if not isinstance(alloc, DeviceAllocator):
        raise_error(Error.InvalidType,
                    f"alloc must be an etptr.DeviceAllocator, got {type(alloc).__name__}")
    try:
        dt = alloc.device_type
    except Exception as exc:
        raise_error(Error.InvalidArgument,
                    f"alloc.device_type could not be read: {exc!r}")
    try:
        return DeviceType(dt)
    except (ValueError, TypeError):
        raise_error(Error.InvalidArgument, f"alloc.device_type={dt!r} is not a DeviceType")


cdef int _device_type_arg(object device_type) except -1:
    """``device_type`` (DeviceType, int code, Device or a device string) checked, as an int."""
    if isinstance(device_type, (str, Device)):
        return (<Device>c_device(device_type, "device_type")).c_type
    if isinstance(device_type, bool) or not hasattr(type(device_type), "__index__"):
        raise_error(Error.InvalidType,
                    f"device_type must be an etptr.DeviceType, got {device_type!r}")
    try:
        return DeviceType(device_type.__index__())
    except ValueError:
        raise_error(Error.InvalidArgument,
                    f"device_type={device_type!r} is not a DeviceType code (0=CPU, 1=CUDA)")


cdef _autoload(int device_type):
    """Let a built-in allocator register itself on first lookup (CUDA through CuPy)."""
    if device_type == 1:
        try:
            from etptr.cuda import _autoregister
        except ImportError:
            return
        _autoregister()


cpdef object c_get_allocator(int device_type):
    cdef object found
    with _lock:
        found = _allocators.get(device_type)
    if found is None and device_type not in _autoload_tried:
        # The first lookups of a device type wait for the one that registers the
        # built-in allocator, so that none of them sees "no allocator" meanwhile.
        # A threading lock (it releases the GIL while it waits), never the
        # registry's own lock: registration takes that one.
        with _autoload_lock:
            if device_type not in _autoload_tried:
                try:
                    _autoload(device_type)
                finally:
                    _autoload_tried.add(device_type)
        with _lock:
            found = _allocators.get(device_type)
    return found


def _forget_autoload(device_type):
    """Let the next lookup of ``device_type`` try its built-in allocator again. For tests."""
    _autoload_tried.discard(int(device_type))


def _replace_allocator(device_type, alloc):
    """Install ``alloc`` (or None) for ``device_type`` and return the previous one.

    For :func:`etptr.testing.use_allocator`; not part of the public API.
    """
    dt = DeviceType(device_type)
    if alloc is not None and _device_type_of(alloc) != dt:
        raise_error(Error.InvalidArgument,
                    f"alloc serves {alloc.device_type!r}, not {dt!r}")
    _autoload_tried.add(int(dt))
    with _lock:
        prev = _allocators.get(int(dt))
        if alloc is None:
            _allocators.pop(int(dt), None)
        else:
            _allocators[int(dt)] = alloc
    return prev


@cython.final
cdef class DeviceAllocatorRegistry:
    """The process-wide registry of device allocators (ExecuTorch ``DeviceAllocatorRegistry``).

    One allocator per :class:`DeviceType`. Use :meth:`instance`; registration
    and lookup are thread-safe.
    """

    def __init__(self):
        raise TypeError("DeviceAllocatorRegistry is a singleton: use DeviceAllocatorRegistry.instance()")

    @staticmethod
    def instance():
        """The process-wide registry.
        """
        return _REGISTRY

    def register_allocator(self, alloc):
        """Register ``alloc`` for ``alloc.device_type``.

        Raises
        ------
        InvalidStateError
            An allocator is already registered for that device type.
        InvalidTypeError
            ``alloc`` is not a :class:`DeviceAllocator`.
        InvalidArgumentError
            ``alloc.device_type`` is not a DeviceType, or is CPU.
        """
        dt = _device_type_of(alloc)
        if dt == DeviceType.CPU:
            raise_error(Error.InvalidArgument,
                        "alloc.device_type is CPU: CPU memory needs no device allocator")
        with _lock:
            prev = _allocators.get(int(dt))
            if prev is None:
                _allocators[int(dt)] = alloc
        if prev is not None:
            raise_error(Error.InvalidState,
                        f"an allocator is already registered for {dt!r}: "
                        f"{type(prev).__name__}; one allocator per device type")

    def get_allocator(self, device_type):
        """The allocator registered for ``device_type``, or None. The first
        lookup of CUDA registers :class:`etptr.cuda.CudaAllocator` when CuPy
        imports and a CUDA device exists.
        """
        return c_get_allocator(_device_type_arg(device_type))


cdef DeviceAllocatorRegistry _REGISTRY = DeviceAllocatorRegistry.__new__(DeviceAllocatorRegistry)


def register_device_allocator(alloc):
    """Register ``alloc`` in the process-wide registry
    (ExecuTorch ``register_device_allocator``). See
    :meth:`DeviceAllocatorRegistry.register_allocator` for the errors raised.
    """
    _REGISTRY.register_allocator(alloc)


def get_device_allocator(device_type):
    """The allocator registered for ``device_type``, or None
    (ExecuTorch ``get_device_allocator``).
    """
    return c_get_allocator(_device_type_arg(device_type))
