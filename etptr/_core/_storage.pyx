"""Storage: the memory behind tensors, and who gives it back.

A :class:`Storage` holds an address with what keeps it valid (an owner: a
NumPy array, a held buffer export, a pinned block) and what releases it (a
deleter, or the device allocator that allocated it). A tensor and every view
of it share one Storage; the memory is released exactly once, when the last
of them is gone, mirroring the ``Storage`` behind ExecuTorch's
``std::shared_ptr<Tensor>``.

Garbage cycles: when a reference cycle holding tensors is collected, the
collector runs every finalizer of the cycle before it clears anything. A
Storage found there waits: it is released once the collection has ended
(from a ``gc.callbacks`` hook), after every other finalizer (which may still
read the tensors) has run, and while the objects its deleter needs are still
intact. Releasing it then also drops its references to the deleter and the
owner, which breaks cycles that run through them. A tensor that survives
such a collection (a finalizer stored it) reports that its memory was
released instead of reading it.

Buffers: memory taken from a Python object's buffer (``allocate_host``
results, buffers given to ``make_tensor_ptr``) keeps the buffer export for
the Storage's life, so the object cannot be resized or closed under it.
"""
cimport cython
from cpython.buffer cimport (
    PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer)
from cpython.long cimport PyLong_FromVoidPtr
from libc.stdint cimport int64_t, uintptr_t

import gc
import warnings

import numpy as np

from etptr._core._codes cimport DEVICE_CUDA
from etptr._core._args cimport c_type_name
from etptr._core._device_allocator cimport DeviceAllocator, c_get_allocator
from etptr._core._error cimport raise_error

from etptr._core._error import Error, EtWarning


cdef void _write_unraisable(object exc) noexcept:
    # A noexcept function that raises hands the exception to sys.unraisablehook.
    raise exc


cdef void c_warn_teardown(str what, object exc) noexcept:
    """Report a failure during teardown as an EtWarning (it cannot be raised).

    When warnings are errors (``-W error``), the warning itself goes to
    ``sys.unraisablehook`` instead of vanishing.
    """
    try:
        warnings.warn(f"etptr: {what} raised during teardown: {exc!r}", EtWarning, stacklevel=2)
    except BaseException as raised:
        _write_unraisable(raised)


# ------------------------------------------------------------------ collections

cdef bint _collecting = False      # a garbage collection is running (between its callbacks)
cdef list _deferred = []           # Storages found in a collection, released when it ends


def _gc_phase(phase, info):
    """gc.callbacks hook: Storages finalized by a collection are released when it ends."""
    global _collecting
    cdef Storage s
    if phase == "start":
        _collecting = True
        return
    _collecting = False
    while _deferred:
        s = _deferred.pop()
        s.c_release()


gc.callbacks.append(_gc_phase)


@cython.final
@cython.no_gc_clear
cdef class Storage:
    # No freelist: a reused object keeps its "finalized" mark, and __del__ would not run.
    """The memory behind one or more TensorPtrs (internal)."""

    def __cinit__(self):
        self.c_ptr = 0
        self.c_nbytes = -1
        self.c_index = 0
        self.c_released = False

    def __init__(self):
        raise TypeError("Storage is internal")

    def __del__(self):
        # tp_finalize. Inside a garbage collection other finalizers of the same cycle
        # may still read the tensors over this memory: wait until it has ended.
        if _collecting and not self.c_released:
            _deferred.append(self)
            return
        self.c_release()

    cdef int c_release(self) except -1:
        """Run the deleter and free through the allocator, once; drop the owner. A
        failure is reported as an EtWarning (this runs at teardown)."""
        self._free(False)
        return 0

    cdef int c_free_now(self) except -1:
        """Release now, raising the first failure (the deleter's or the allocator's;
        both run). For a tensor whose construction failed after its memory was taken."""
        self._free(True)
        return 0

    cdef int _free(self, bint raise_failure) except -1:
        cdef uintptr_t ptr = self.c_ptr
        deleter = self.c_deleter
        alloc = self.c_allocator
        owner = self.c_owner
        first = None
        if self.c_released:
            return 0
        self.c_released = True
        self.c_deleter = None
        self.c_allocator = None
        self.c_owner = None
        if deleter is not None:
            try:
                deleter(PyLong_FromVoidPtr(<void*>ptr))
            except BaseException as exc:
                first = exc
                if not raise_failure:
                    c_warn_teardown("a TensorPtr deleter", exc)
        if alloc is not None and ptr != 0:
            try:
                alloc.c_deallocate(ptr, self.c_index)
            except BaseException as exc:
                if first is None:
                    first = exc
                if not raise_failure:
                    c_warn_teardown(f"{c_type_name(alloc)}.deallocate", exc)
        del owner
        if first is not None and raise_failure:
            raise first
        return 0


cdef Storage c_storage(uintptr_t ptr, int64_t nbytes, object owner, object deleter):
    cdef Storage s = Storage.__new__(Storage)
    s.c_ptr = ptr
    s.c_nbytes = nbytes
    s.c_owner = owner
    s.c_deleter = deleter
    return s


cdef int c_check_alive(Storage s, str what) except -1:
    """InvalidStateError when ``s`` was released while a tensor over it survived."""
    if s.c_released:
        raise_error(Error.InvalidState,
                    f"{what}: the tensor's memory was released (a garbage collection freed "
                    f"the reference cycle that held it, and a finalizer kept this tensor)")
    return 0


cdef Storage c_host_storage(int64_t nbytes):
    """Owned, uninitialised host memory of ``nbytes`` bytes (a NumPy byte array)."""
    try:
        buf = np.empty(nbytes if nbytes > 0 else 1, dtype=np.uint8)
    except MemoryError:
        raise_error(Error.MemoryAllocationFailed,
                    f"could not allocate {nbytes} bytes of host memory")
    return c_storage(<uintptr_t>buf.ctypes.data, nbytes, buf, None)


@cython.final
@cython.no_gc
cdef class _BufferExport:
    """A held buffer export (Py_buffer): the exporter cannot resize, close or free the
    memory while this lives."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            self.held = False
            PyBuffer_Release(&self.view)


cdef Storage c_export_storage(object obj, int64_t nbytes, bint writable, str what):
    """Storage over ``obj``'s buffer (contiguous, at least ``nbytes`` bytes, writable when
    asked), holding the export for the Storage's life."""
    cdef _BufferExport ex = _BufferExport.__new__(_BufferExport)
    cdef int flags = PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
    try:
        PyObject_GetBuffer(obj, &ex.view, flags)
    except TypeError:
        raise_error(Error.InvalidType,
                    f"{what} returned {c_type_name(obj)}, not an object with the buffer protocol")
    except (BufferError, ValueError) as exc:
        raise_error(Error.InvalidArgument,
                    f"{what} returned a {'read-only or ' if writable else ''}non-contiguous "
                    f"buffer ({c_type_name(obj)}): {exc}")
    ex.held = True
    if ex.view.len < nbytes:
        raise_error(Error.InvalidArgument,
                    f"{what} returned a buffer of {ex.view.len} bytes; {nbytes} are needed")
    return c_storage(<uintptr_t>ex.view.buf, ex.view.len, ex, None)


cdef Storage c_device_storage(DeviceAllocator alloc, int64_t nbytes, int index,
                              int64_t alignment, object stream):
    """``nbytes`` of device memory from ``alloc`` on device ``index``, freed through it."""
    cdef uintptr_t ptr = alloc.c_allocate(nbytes, index, alignment, stream)
    cdef Storage s
    try:
        s = c_storage(ptr, nbytes, None, None)
    except BaseException:
        if ptr:
            alloc.c_deallocate(ptr, index)
        raise
    s.c_allocator = alloc
    s.c_index = index
    return s


cdef Storage c_pinned_storage(int64_t nbytes, int index):
    """Page-locked host memory from the CUDA allocator's ``allocate_host`` hook."""
    cdef DeviceAllocator alloc = c_get_allocator(DEVICE_CUDA)
    cdef Storage s
    if alloc is None:
        raise_error(Error.NotFound,
                    "pinned=True: page-locked memory comes from the CUDA DeviceAllocator, and "
                    "none is registered (install CuPy, or etptr.register_device_allocator your own)")
    host = alloc.c_allocate_host(nbytes, index)
    if host is None:
        if nbytes:
            raise_error(Error.NotSupported,
                        f"pinned=True: {c_type_name(alloc)}.allocate_host gives no page-locked memory")
        return c_host_storage(0)
    s = c_export_storage(host, nbytes, True, f"{c_type_name(alloc)}.allocate_host")
    s.c_host_of = alloc
    return s
