"""Page-locked (pinned) host staging and the host<->device copy engine.

Two parts, both used by :class:`etptr.cuda.CudaAllocator`:

* :class:`PinnedHostPool`, a thread-safe caching pool of page-locked host
  memory with size classes (waste stays under 1/8 of a block, or one 4 KiB
  page for small blocks), a cap on the bytes it keeps cached, statistics, and
  CUDA events that keep a block out of reuse while a copy touching it may
  still run.
* The copy engine. Host -> device from pageable memory goes in chunks through
  K pinned slots of S bytes: T threads (the caller and a pool of worker
  threads) copy chunk i+1 into its slot, without the GIL, while the DMA of
  chunk i runs on the device's copy stream. A page-locked source goes up in
  one DMA; small copies take the shortest path (one cudaMemcpyAsync).
  Device -> host into page-locked memory is one DMA; into pageable memory it
  is staged in reverse.

CuPy is imported on first use, at Python level: building etptr never needs it.
The calls made per copy and per chunk go to the CUDA driver (libcuda, which
CuPy loads) through C function pointers, without the GIL; pinning memory and
creating streams and events go through CuPy. Every CUDA call runs with its
device's primary context current, and the caller's context is restored
afterwards (no context is created on a device the caller did not name).

Fork: the CUDA driver cannot be used in a child made by ``os.fork()`` once
the parent has initialised it. In such a child every CUDA entry point of
etptr raises :class:`~etptr.InvalidStateError` (naming fork and the 'spawn'
start method), and the parent's streams, events, pinned blocks and device
memory are forgotten without a CUDA call: they belong to the parent's
context. A child forked before CUDA was first used may use CUDA itself.
"""
cimport cython
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from posix.unistd cimport getpid

import os
import sys
import threading
import warnings
import weakref

from etptr._core._error cimport raise_error

from etptr._core._error import Error, EtError, EtWarning

# cudaMemcpyKind, cudaHostAllocPortable, cudaEventDisableTiming, cudaMemoryTypeHost
cdef enum:
    _H2D = 1
    _D2H = 2
    _HOST_ALLOC_PORTABLE = 1
    _EVENT_DISABLE_TIMING = 2
    _MEMORY_TYPE_HOST = 1

cdef int64_t _PAGE = 4096
cdef int64_t _MAX_PIN = (<int64_t>1) << 62   # larger requests are refused (size classes overflow)
cdef int64_t _MIN_PIECE = 128 * 1024   # below this a chunk is copied by one thread

DEFAULT_MAX_CACHED_BYTES = 2 << 30


def _cpu_count():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# Defaults measured on H200 hosts (PCIe Gen5 x16; 2x H200 and 32 cores for the last run):
# bench/sweep_copy.py and its output bench/sweep_copy.txt. Threads never exceed the CPUs
# this process may use.
cdef CopyConfig _cfg
_cfg.threads = min(16, _cpu_count())
_cfg.slot_bytes = 16 << 20
_cfg.slots = 3
_cfg.small_bytes = 64 << 10
_tls = threading.local()

# ------------------------------------------------------------------ fork state

# The CUDA driver cannot be used in a child made by fork() once the parent has
# initialised it (the child would get errors or hang). etptr notes when it
# initialises CUDA, and before a fork asks the driver whether CuPy has (when
# CuPy is imported); a child forked after that refuses every CUDA call and
# forgets, without freeing, what belonged to the parent's context.
cdef bint _cuda_initialised = False   # by etptr, in this process or before the fork
cdef bint _forked_after_init = False  # this process was forked after that
cdef long _init_pid = 0               # the process that initialised CUDA


cdef void _note_init() noexcept:
    global _cuda_initialised, _init_pid
    if not _cuda_initialised:
        _init_pid = getpid()
        _cuda_initialised = True


cdef bint c_forked() noexcept:
    """True in a child forked after CUDA was initialised: CUDA must not be called."""
    return _forked_after_init


cdef int c_check_usable(str what) except -1:
    """Raise InvalidStateError when CUDA cannot be used here (forked after initialisation)."""
    if _forked_after_init:
        raise_error(Error.InvalidState,
                    f"{what}: CUDA cannot be used in this process (pid {getpid()}): it was "
                    f"created by fork() after process {_init_pid} had initialised CUDA, and "
                    f"the CUDA driver does not survive fork. Start processes that use CUDA "
                    f"with the 'spawn' start method (multiprocessing.get_context('spawn'), or "
                    f"multiprocessing.set_start_method('spawn')), or fork before the first "
                    f"CUDA call. Host-only etptr functions work here.")
    return 0


def _note_cuda_init():
    """Record that CUDA is being initialised in this process (etptr.cuda.is_available)."""
    _note_init()


def _cuda_forked():
    """True in a process forked after CUDA was initialised (CUDA calls raise there)."""
    return _forked_after_init


cdef inline void _keep_forever(object obj) noexcept:
    # Objects that belong to the parent's CUDA context are never destroyed in a
    # forked child: destroying them could call into CUDA (or a lock held at fork).
    Py_INCREF(obj)


# ------------------------------------------------------------------ CuPy, lazily

cdef object _cp = None      # the cupy module (or a stand-in set by _set_backend)
cdef object _rt = None      # its cuda.runtime: allocation, streams and events (rare calls)
cdef object _drv = None     # its cuda.driver
cdef object _CudaError = None
cdef object _current_stream = None   # cupy.cuda.get_current_stream


cdef object c_cupy():
    """The CuPy module, imported on first use; NotSupportedError without it."""
    c_check_usable("CUDA")
    if _cp is None:
        try:
            import cupy
        except ImportError as exc:
            raise_error(Error.NotSupported,
                        f"CUDA copies need CuPy (pip install cupy-cuda12x or cupy-cuda13x): {exc}")
        _set_backend(cupy)
    return _cp


def _set_backend(module):
    """Use ``module`` as CuPy (None: import CuPy again on next use). For tests."""
    global _cp, _rt, _drv, _CudaError, _current_stream, _driver_why, _ndev
    _ndev = -1
    with _engines_lock:
        _engines.clear()
    _forget_contexts()
    if module is None:
        _cp = _rt = _drv = _CudaError = _current_stream = None
        _use_python_calls()
        return
    _note_init()      # getDeviceCount below initialises the driver
    _cp = module
    _rt = module.cuda.runtime
    _drv = module.cuda.driver
    _CudaError = module.cuda.runtime.CUDARuntimeError
    _current_stream = module.cuda.get_current_stream
    try:
        _rt.getDeviceCount()      # initialises the driver (no context) before any driver call
    except Exception:
        pass
    if getattr(module, "is_fake", False):
        _driver_why = "a stand-in for CuPy"
        _use_python_calls()
    elif not _load_driver():
        _use_python_calls()


# ------------------------------------------------------------------ CUDA driver calls
#
# Every call made per copy or per chunk (memcpy, stream and event waits, context
# switches, pointer queries) goes through this table of C function pointers, so
# the engine makes them without the GIL and without a Python call. With real
# CuPy they are the CUDA driver API's own functions, looked up in libcuda.so.1
# (the library CuPy's runtime already loaded; runtime streams, events and
# primary contexts are the driver's handles). With a stand-in for CuPy (the
# tests' host-memory fake), or when libcuda lacks a symbol, they are shims that
# take the GIL and call the module's Python API instead. Rare calls (pinning,
# creating streams and events) always go through CuPy.

ctypedef int (*_f_ctx_get)(void** ctx) noexcept nogil
ctypedef int (*_f_ctx_set)(void* ctx) noexcept nogil
ctypedef int (*_f_ctx_device)(int* dev) noexcept nogil
ctypedef int (*_f_primary)(void** ctx, int dev) noexcept nogil
ctypedef int (*_f_htod)(unsigned long long dst, const void* src, size_t n, void* s) noexcept nogil
ctypedef int (*_f_dtoh)(void* dst, unsigned long long src, size_t n, void* s) noexcept nogil
ctypedef int (*_f_handle)(void* h) noexcept nogil
ctypedef int (*_f_record)(void* event, void* stream) noexcept nogil
ctypedef int (*_f_wait)(void* stream, void* event, unsigned int flags) noexcept nogil
ctypedef int (*_f_attr)(void* out, int attr, unsigned long long ptr) noexcept nogil
ctypedef int (*_f_name)(int rc, const char** name) noexcept nogil
ctypedef int (*_f_device_get)(int* device, int ordinal) noexcept nogil


cdef struct _Api:
    _f_ctx_get ctx_get              # cuCtxGetCurrent
    _f_ctx_set ctx_set              # cuCtxSetCurrent
    _f_ctx_device ctx_device        # cuCtxGetDevice
    _f_primary primary              # cuDeviceGet + cuDevicePrimaryCtxRetain
    _f_htod htod                    # cuMemcpyHtoDAsync
    _f_dtoh dtoh                    # cuMemcpyDtoHAsync
    _f_handle stream_sync           # cuStreamSynchronize
    _f_record event_record          # cuEventRecord
    _f_handle event_sync            # cuEventSynchronize
    _f_handle event_query           # cuEventQuery (0 done, _NOT_READY pending)
    _f_wait stream_wait_event       # cuStreamWaitEvent
    _f_attr pointer_attr            # cuPointerGetAttribute
    bint driver                     # True: libcuda's functions; False: the Python shims


cdef enum:
    _NOT_READY = 600                      # CUDA_ERROR_NOT_READY (and cudaErrorNotReady)
    _SHIM_FAILED = 999                    # a shim's Python call raised (kept in _shim_errors)
    _ATTR_MEMORY_TYPE = 2                 # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    _ATTR_RANGE_START = 11                # CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    _ATTR_RANGE_SIZE = 12                 # CU_POINTER_ATTRIBUTE_RANGE_SIZE
    _MAX_DEVICES = 1024

cdef _Api _api
cdef _f_device_get _cuDeviceGet = NULL
cdef _f_primary _cuDevicePrimaryCtxRetain = NULL
cdef _f_name _cuGetErrorName = NULL
cdef void* _primary_ctx[_MAX_DEVICES]     # each device's primary context, once retained
_shim_errors = threading.local()          # the exception a shim caught, per thread


cdef void _forget_contexts() noexcept:
    cdef int i
    for i in range(_MAX_DEVICES):
        _primary_ctx[i] = NULL


cdef int _real_primary(void** ctx, int ordinal) noexcept nogil:
    cdef int device = 0
    cdef int rc = _cuDeviceGet(&device, ordinal)
    if rc != 0:
        return rc
    return _cuDevicePrimaryCtxRetain(ctx, device)


cdef str _driver_why = "CuPy not loaded yet"   # why the shims are in use


# libcuda's functions the table uses, in the order _load_driver reads them
_DRIVER_SYMBOLS = (b"cuCtxGetCurrent", b"cuCtxSetCurrent", b"cuCtxGetDevice", b"cuDeviceGet",
                   b"cuDevicePrimaryCtxRetain", b"cuMemcpyHtoDAsync_v2", b"cuMemcpyDtoHAsync_v2",
                   b"cuStreamSynchronize", b"cuEventRecord", b"cuEventSynchronize",
                   b"cuEventQuery", b"cuStreamWaitEvent", b"cuPointerGetAttribute",
                   b"cuGetErrorName")


cdef bint _load_driver():
    """Point the table at libcuda's functions; False when a symbol is missing."""
    global _cuDeviceGet, _cuDevicePrimaryCtxRetain, _cuGetErrorName, _driver_why
    cdef void* lib = dlopen(b"libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    cdef void* f[14]
    cdef const char* err
    cdef bytes name
    if lib == NULL:
        lib = dlopen(b"libcuda.so", RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        err = dlerror()
        _driver_why = f"dlopen(libcuda.so.1): {err.decode() if err != NULL else '?'}"
        return False
    for i, name in enumerate(_DRIVER_SYMBOLS):
        f[i] = dlsym(lib, name)
        if f[i] == NULL:
            _driver_why = f"libcuda has no {name.decode()}"
            return False
    _api.ctx_get = <_f_ctx_get>f[0]
    _api.ctx_set = <_f_ctx_set>f[1]
    _api.ctx_device = <_f_ctx_device>f[2]
    _cuDeviceGet = <_f_device_get>f[3]
    _cuDevicePrimaryCtxRetain = <_f_primary>f[4]
    _api.primary = _real_primary
    _api.htod = <_f_htod>f[5]
    _api.dtoh = <_f_dtoh>f[6]
    _api.stream_sync = <_f_handle>f[7]
    _api.event_record = <_f_record>f[8]
    _api.event_sync = <_f_handle>f[9]
    _api.event_query = <_f_handle>f[10]
    _api.stream_wait_event = <_f_wait>f[11]
    _api.pointer_attr = <_f_attr>f[12]
    _cuGetErrorName = <_f_name>f[13]
    _api.driver = True
    _driver_why = ""
    return True


def _driver_calls():
    """'libcuda' when copies call the CUDA driver directly, else 'python (why)': CuPy's API.

    Loads CuPy first when it is importable (the choice is made then)."""
    if _cp is None:
        try:
            c_cupy()
        except EtError:
            pass
    return "libcuda" if _api.driver else f"python ({_driver_why})"


# The shims: the same calls through the Python module standing in for CuPy.

cdef int _shim_failed(BaseException exc) noexcept:
    # Kept without its traceback: the traceback's frames would keep the caller's locals
    # (tensors, device memory) alive for as long as the exception is kept.
    _shim_errors.exc = exc.with_traceback(None)
    return _SHIM_FAILED


cdef int _shim_call(object module, str name, tuple args, intptr_t* out=NULL) noexcept:
    """``module.name(*args)`` with the GIL held (its result into ``out`` when given): 0,
    or _SHIM_FAILED with the exception kept."""
    try:
        result = getattr(module, name)(*args)
        if out != NULL:
            out[0] = result
        return 0
    except BaseException as exc:
        return _shim_failed(exc)


cdef int _shim_ctx_get(void** ctx) noexcept nogil:
    cdef intptr_t v = 0
    cdef int rc
    with gil:
        rc = _shim_call(_drv, "ctxGetCurrent", (), &v)
    if rc == 0:
        ctx[0] = <void*>v
    return rc


cdef int _shim_ctx_set(void* ctx) noexcept nogil:
    with gil:
        return _shim_call(_drv, "ctxSetCurrent", (<intptr_t>ctx,))


cdef int _shim_ctx_device(int* dev) noexcept nogil:
    cdef intptr_t v = 0
    cdef int rc
    with gil:
        rc = _shim_call(_rt, "getDevice", (), &v)
    if rc == 0:
        dev[0] = <int>v
    return rc


cdef int _shim_primary(void** ctx, int dev) noexcept nogil:
    with gil:
        try:
            prev = _drv.ctxGetCurrent()
            _rt.setDevice(dev)
            ctx[0] = <void*><intptr_t>_drv.ctxGetCurrent()
            _drv.ctxSetCurrent(prev)
            return 0
        except BaseException as exc:
            return _shim_failed(exc)


cdef int _shim_htod(unsigned long long dst, const void* src, size_t n, void* s) noexcept nogil:
    with gil:
        return _shim_call(_rt, "memcpyAsync", (dst, <uintptr_t>src, n, _H2D, <intptr_t>s))


cdef int _shim_dtoh(void* dst, unsigned long long src, size_t n, void* s) noexcept nogil:
    with gil:
        return _shim_call(_rt, "memcpyAsync", (<uintptr_t>dst, src, n, _D2H, <intptr_t>s))


cdef int _shim_stream_sync(void* s) noexcept nogil:
    with gil:
        return _shim_call(_rt, "streamSynchronize", (<intptr_t>s,))


cdef int _shim_event_record(void* e, void* s) noexcept nogil:
    with gil:
        return _shim_call(_rt, "eventRecord", (<intptr_t>e, <intptr_t>s))


cdef int _shim_event_sync(void* e) noexcept nogil:
    with gil:
        return _shim_call(_rt, "eventSynchronize", (<intptr_t>e,))


cdef int _shim_event_query(void* e) noexcept nogil:
    cdef intptr_t v = 0
    cdef int rc
    with gil:
        rc = _shim_call(_rt, "eventQuery", (<intptr_t>e,), &v)
    return <int>v if rc == 0 else rc


cdef int _shim_stream_wait_event(void* s, void* e, unsigned int flags) noexcept nogil:
    with gil:
        return _shim_call(_rt, "streamWaitEvent", (<intptr_t>s, <intptr_t>e, flags))


cdef int _shim_pointer_attr(void* out, int attr, unsigned long long ptr) noexcept nogil:
    # The memory type: 1 host (page-locked), 2 device, else an error. A range's start
    # and size only when the stand-in offers pointerGetRange(ptr) -> (start, size)
    # (CuPy's Python API has no such call: callers then skip what needs it).
    if attr == _ATTR_RANGE_START or attr == _ATTR_RANGE_SIZE:
        with gil:
            get_range = getattr(_rt, "pointerGetRange", None)
            if get_range is None:
                return 1
            try:
                start, size = get_range(ptr)
            except BaseException as exc:
                return _shim_failed(exc)
            (<unsigned long long*>out)[0] = start if attr == _ATTR_RANGE_START else size
            return 0
    if attr != _ATTR_MEMORY_TYPE:
        return 1
    with gil:
        try:
            t = _rt.pointerGetAttributes(ptr).type
        except BaseException as exc:
            return _shim_failed(exc)
        if t != 1 and t != 2:
            return 1          # CUDA_ERROR_INVALID_VALUE: memory CUDA does not know
        (<unsigned int*>out)[0] = t
        return 0


cdef void _use_python_calls() noexcept:
    _api.ctx_get = _shim_ctx_get
    _api.ctx_set = _shim_ctx_set
    _api.ctx_device = _shim_ctx_device
    _api.primary = _shim_primary
    _api.htod = _shim_htod
    _api.dtoh = _shim_dtoh
    _api.stream_sync = _shim_stream_sync
    _api.event_record = _shim_event_record
    _api.event_sync = _shim_event_sync
    _api.event_query = _shim_event_query
    _api.stream_wait_event = _shim_stream_wait_event
    _api.pointer_attr = _shim_pointer_attr
    _api.driver = False


_use_python_calls()


cdef str _cu_message(int rc):
    """What failed, for an error message: the shim's exception or the driver's error name."""
    cdef const char* name = NULL
    if rc == _SHIM_FAILED:
        exc = getattr(_shim_errors, "exc", None)
        if exc is not None:
            return str(exc)
    if _api.driver and _cuGetErrorName != NULL and _cuGetErrorName(rc, &name) == 0 and name != NULL:
        return f"{name.decode('ascii', 'replace')} ({rc})"
    return f"CUDA error {rc}"


cdef int c_cuda_failed(int rc, str what) except -1:
    """Raise EtError(Error.Internal) for the failed call ``what`` (chained to a shim's exception)."""
    cdef object cause = None
    if rc == _SHIM_FAILED:
        cause = getattr(_shim_errors, "exc", None)
        _shim_errors.exc = None
    msg = f"{what} failed: {_cu_message(rc) if cause is None else cause}"
    if isinstance(cause, KeyboardInterrupt):
        raise cause
    raise EtError(msg, Error.Internal) from cause


cdef inline int _check(int rc, str what) except -1:
    if rc != 0:
        c_cuda_failed(rc, what)
    return 0


cdef void* _context_of(int dev) except NULL:
    """``dev``'s primary context, retained on first use (which initialises it)."""
    cdef void* ctx
    cdef int rc
    if dev < 0 or dev >= _MAX_DEVICES:
        raise_error(Error.InvalidArgument, f"device={dev}: not a CUDA device index")
    ctx = _primary_ctx[dev]
    if ctx == NULL:
        rc = _api.primary(&ctx, dev)
        if rc != 0 or ctx == NULL:
            c_cuda_failed(rc if rc != 0 else 201, f"making cuda:{dev}'s context")
        _primary_ctx[dev] = ctx
    return ctx


cdef int c_enter_device(int dev, DeviceGuard* guard) except -1:
    """Make ``dev``'s primary context current; ``guard`` records what to restore.

    When no context was current, none is current again after
    :func:`c_exit_device`: no context appears on device 0 when the caller only
    ever named another.
    """
    cdef void* ctx
    guard.prev = NULL
    guard.switched = False
    c_check_usable("CUDA")
    ctx = _context_of(dev)
    _check(_api.ctx_get(&guard.prev), "cuCtxGetCurrent")
    if guard.prev != ctx:
        _check(_api.ctx_set(ctx), f"making cuda:{dev} current")
        guard.switched = True
    return 0


cdef int c_exit_device(DeviceGuard* guard) except -1:
    if guard.switched:
        guard.switched = False
        _check(_api.ctx_set(guard.prev), "restoring the caller's CUDA context")
    return 0


cdef int _ndev = -1          # CUDA devices, read once per backend


cdef int _device_count() except -1:
    global _ndev
    if _ndev < 0:
        try:
            _ndev = _rt.getDeviceCount()
        except _CudaError as exc:
            raise EtError(f"counting CUDA devices failed: {exc}", Error.Internal) from exc
    return _ndev


cdef int c_current_device() except -1:
    """The CUDA device of the calling thread (that of its current context, else CuPy's answer)."""
    cdef void* ctx = NULL
    cdef int dev = 0
    c_cupy()
    if _api.ctx_get(&ctx) == 0 and ctx != NULL and _api.ctx_device(&dev) == 0:
        return dev
    return _rt.getDevice()


# ------------------------------------------------------------------ size classes

cdef int64_t c_size_class(int64_t nbytes) noexcept nogil:
    """Bytes actually reserved for a request of ``nbytes``.

    Up to 32 KiB: whole 4 KiB pages. Above: eight classes per power of two,
    so a block wastes less than 1/8 of itself (no power-of-two rounding).
    """
    cdef int64_t g
    cdef int bits = 0
    cdef uint64_t n
    if nbytes <= _PAGE:
        return _PAGE
    n = <uint64_t>(nbytes - 1)
    while n:
        bits += 1
        n >>= 1
    # 2**(bits-1) < nbytes <= 2**bits; granularity 2**(bits-4), at least a page
    g = (<int64_t>1) << (bits - 4) if bits - 4 > 12 else _PAGE
    return (nbytes + g - 1) & ~(g - 1)



def size_class(nbytes):
    """The bytes a :class:`PinnedHostPool` reserves for a request of ``nbytes``
    bytes: whole 4 KiB pages up to 32 KiB, then eight classes per power of
    two (waste below 1/8 of the block).
    """
    cdef int64_t n = _nonneg(nbytes, "nbytes")
    if n > _MAX_PIN:
        raise_error(Error.InvalidArgument, f"nbytes={n}: more than 2**62 bytes")
    return c_size_class(n)


cdef int64_t _nonneg(object v, str argname) except -1:
    if isinstance(v, bool):
        raise_error(Error.InvalidType, f"{argname}={v!r} must be an int")
    try:
        i = v.__index__()
    except (AttributeError, TypeError):
        raise_error(Error.InvalidType, f"{argname}={v!r} of type {type(v).__name__} must be an int")
    if i < 0 or i > INT64_MAX:
        raise_error(Error.InvalidArgument, f"{argname}={i}: must be within 0..2**63-1")
    return i


# ------------------------------------------------------------------ pool

@cython.final
@cython.no_gc
cdef class _Slab:
    def __cinit__(self):
        self.ptr = 0
        self.size = 0
        self.dev = 0
        self.event = 0
        self.event_dev = -1
        self.pending = False


cdef int _ensure_event(_Slab slab, int dev) except -1:
    """Give ``slab`` an event usable on ``dev`` (the current device)."""
    if slab.event != 0 and slab.event_dev == dev:
        return 0
    if slab.event != 0:
        if slab.pending:
            _check(_api.event_sync(<void*>slab.event), "waiting for a pinned block's last copy")
            slab.pending = False
        try:
            _rt.eventDestroy(slab.event)
        except _CudaError as exc:
            raise EtError(f"destroying a CUDA event failed: {exc}", Error.Internal) from exc
        slab.event = 0
    try:
        slab.event = _rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
    except _CudaError as exc:
        raise EtError(f"creating a CUDA event on cuda:{dev} failed: {exc}", Error.Internal) from exc
    slab.event_dev = dev
    return 0


cdef int _record(_Slab slab, intptr_t stream, int dev) except -1:
    """Mark ``slab`` as touched by the work queued on ``stream`` so far."""
    _ensure_event(slab, dev)
    _check(_api.event_record(<void*>slab.event, <void*>stream), "recording a pinned block's copy")
    slab.pending = True
    return 0


cdef int _free_slab(_Slab slab) except -1:
    """Give the slab's page-locked memory back to CUDA, after its last copy."""
    cdef DeviceGuard guard
    cdef uintptr_t ptr = slab.ptr
    if ptr == 0:
        return 0
    slab.ptr = 0
    if _forked_after_init:
        slab.event = 0        # the parent's memory and event: nothing to free here
        slab.pending = False
        return 0
    c_enter_device(slab.dev, &guard)
    try:
        try:
            if slab.event != 0:
                if slab.pending:
                    _check(_api.event_sync(<void*>slab.event),
                           "waiting for a pinned block's last copy")
                _rt.eventDestroy(slab.event)
            slab.event = 0
            slab.pending = False
            _rt.freeHost(ptr)
        except _CudaError as exc:
            raise EtError(f"freeing a page-locked block at {ptr:#x} failed: {exc}",
                          Error.Internal) from exc
    finally:
        c_exit_device(&guard)
    return 0


cdef int _free_all(object slabs) except -1:
    """Free every slab in ``slabs``, even when one fails; then raise the first failure."""
    cdef _Slab slab
    first = None
    for slab in slabs:
        try:
            _free_slab(slab)
        except BaseException as exc:
            if first is None:
                first = exc
    if first is not None:
        raise first
    return 0


@cython.final
@cython.no_gc
cdef class PinnedBlock:
    """A block of page-locked host memory from a :class:`PinnedHostPool`.

    Exposes ``nbytes`` writable bytes through the buffer protocol
    (``memoryview(block)``, ``numpy.frombuffer(block, ...)``). The block goes
    back to its pool when the last reference (including buffer exports)
    dies; the pool does not reuse it while a copy touching it may still run.
    Build blocks with :meth:`PinnedHostPool.malloc`.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("PinnedBlock cannot be built directly: use PinnedHostPool.malloc")

    def __dealloc__(self):
        cdef _Slab slab = self.c_slab
        cdef PinnedHostPool pool
        if slab is None:
            return
        self.c_slab = None
        if _forked_after_init:
            return            # a block of the parent's (forked after CUDA init): not ours to free
        try:
            pool = self.c_pool_ref() if self.c_pool_ref is not None else None
            if pool is not None:
                pool.c_release(slab, self.c_nbytes)
            else:
                _free_slab(slab)
        except BaseException as exc:
            try:
                warnings.warn(f"etptr: returning a pinned block raised during teardown: {exc!r}",
                              EtWarning, stacklevel=2)
            except BaseException:
                pass

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.c_slab.ptr, <Py_ssize_t>self.c_nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    @property
    def ptr(self):
        """Host address of the block (int)."""
        return self.c_slab.ptr

    @property
    def nbytes(self):
        """Bytes requested (the buffer's length)."""
        return self.c_nbytes

    @property
    def capacity(self):
        """Bytes reserved (the size class)."""
        return self.c_slab.size

    def __len__(self):
        return self.c_nbytes

    def __repr__(self):
        return f"<PinnedBlock ptr={self.c_slab.ptr:#x} nbytes={self.c_nbytes} capacity={self.c_slab.size}>"


_pools = weakref.WeakSet()    # every PinnedHostPool, to be emptied in a child after fork


@cython.final
cdef class PinnedHostPool:
    """PinnedHostPool(max_cached_bytes=DEFAULT_MAX_CACHED_BYTES)

    A thread-safe caching pool of page-locked (pinned) host memory.

    Requests are rounded to size classes (:func:`size_class`), so a block
    wastes less than 1/8 of itself. Freed blocks are cached per class, up to
    ``max_cached_bytes`` in all: past the cap the oldest cached blocks are
    freed. A block freed while a copy may still touch it (an event recorded
    on a stream) is only reused once that event has completed. When CUDA
    cannot pin more memory, the pool frees its cache and tries once more.

    Parameters
    ----------
    max_cached_bytes : int, bytes
        Cap on the bytes kept cached (blocks in use do not count).

    Notes
    -----
    Memory is allocated with ``cudaHostAlloc(cudaHostAllocPortable)`` under
    the device the caller names, so it is page-locked for every device.
    """

    def __cinit__(self, *args, **kwargs):
        self.c_free = {}
        self.c_order = {}
        self.c_live = {}
        self.c_limit = DEFAULT_MAX_CACHED_BYTES
        _pools.add(self)

    def __init__(self, max_cached_bytes=DEFAULT_MAX_CACHED_BYTES):
        self.c_limit = _nonneg(max_cached_bytes, "max_cached_bytes")

    # -------------------------------------------------------------- C level
    cdef _Slab c_acquire(self, int64_t nbytes, int dev):
        cdef int64_t size
        cdef _Slab slab = None
        cdef list lst
        cdef bint fresh = False
        cdef int rc
        if nbytes > _MAX_PIN:
            raise_error(Error.MemoryAllocationFailed,
                        f"could not pin nbytes={nbytes} of host memory: more than 2**62 bytes")
        size = c_size_class(nbytes)
        c_check_usable("pinned host memory")
        with self.c_lock:
            lst = self.c_free.get(size)
            if lst:
                slab = lst.pop()
                del self.c_order[slab]
                self.c_cached -= size
                if not slab.pending:
                    self._take(slab, nbytes, True)
                    return slab
        if slab is not None:
            rc = _api.event_query(<void*>slab.event)
            if rc != 0 and rc != _NOT_READY:
                self._recache(slab, [], True)     # neither lost nor handed out
                c_cuda_failed(rc, "querying a pinned block's last copy")
            if rc == 0:
                slab.pending = False
            else:
                # A copy may still touch it: leave it cached, take a new block.
                self._recache(slab, [], True)
                slab = None
        if slab is None:
            slab = self._new_slab(size, nbytes, dev)
            fresh = True
        with self.c_lock:
            self._take(slab, nbytes, not fresh)
        return slab

    cdef void _recache(self, _Slab slab, list spare, bint oldest) noexcept:
        # Put ``slab`` on its class's free list (``spare``: an empty list made
        # beforehand, so that nothing the garbage collector tracks is allocated
        # while c_lock is held: a collection run there could free a block and
        # re-enter the lock).
        cdef list lst
        with self.c_lock:
            lst = self.c_free.get(slab.size)
            if lst is None:
                lst = spare
                self.c_free[slab.size] = lst
            if oldest:
                lst.insert(0, slab)
            else:
                lst.append(slab)
            self.c_order[slab] = None
            self.c_cached += slab.size

    cdef void _take(self, _Slab slab, int64_t nbytes, bint hit) noexcept:
        # with c_lock held: account for a slab handed out
        self.c_live[slab.ptr] = slab
        self.c_in_use += slab.size
        self.c_requested += nbytes
        if hit:
            self.c_hits += 1
        else:
            self.c_misses += 1
        if self.c_in_use + self.c_cached > self.c_peak:
            self.c_peak = self.c_in_use + self.c_cached

    cdef _Slab _new_slab(self, int64_t size, int64_t nbytes, int dev):
        cdef DeviceGuard guard
        cdef _Slab slab = _Slab.__new__(_Slab)
        c_cupy()
        c_enter_device(dev, &guard)
        try:
            try:
                ptr = _rt.hostAlloc(size, _HOST_ALLOC_PORTABLE)
            except _CudaError:
                self.empty_cache()
                try:
                    ptr = _rt.hostAlloc(size, _HOST_ALLOC_PORTABLE)
                except _CudaError as exc:
                    with self.c_lock:
                        self.c_failures += 1
                    raise_error(Error.MemoryAllocationFailed,
                                f"could not pin {size} bytes of host memory (nbytes={nbytes}, "
                                f"cuda:{dev}), even after freeing the cache: {exc}")
        finally:
            c_exit_device(&guard)
        slab.ptr = ptr
        slab.size = size
        slab.dev = dev
        return slab

    cdef int c_release(self, _Slab slab, int64_t nbytes) except -1:
        cdef list to_free = []
        cdef list spare = []          # see _recache: no GC-tracked allocation under c_lock
        cdef list lst
        cdef _Slab old
        cdef int64_t size = slab.size
        if _forked_after_init:
            return 0          # the parent's block; the pool forgot it at the fork
        with self.c_lock:
            if self.c_live.pop(slab.ptr, None) is None:
                return 0
            self.c_in_use -= size
            self.c_requested -= nbytes
            if size > self.c_limit:
                to_free.append(slab)
            else:
                lst = self.c_free.get(size)
                if lst is None:
                    lst = spare
                    self.c_free[size] = lst
                lst.append(slab)
                self.c_order[slab] = None
                self.c_cached += size
                self._evict(to_free)
        _free_all(to_free)
        return 0

    cdef void _evict(self, list to_free) noexcept:
        # with c_lock held: move the oldest cached slabs to ``to_free`` until under the cap
        cdef _Slab old
        while self.c_cached > self.c_limit:
            for old in self.c_order:      # the oldest; PyDict_Next, no iterator object
                break
            else:
                break
            del self.c_order[old]
            self.c_free[old.size].remove(old)
            self.c_cached -= old.size
            self.c_evictions += 1
            to_free.append(old)

    cdef _Slab c_find(self, uintptr_t address):
        return self.c_live.get(address)

    cdef int c_forget(self) except -1:
        """In a child forked after CUDA init: drop the parent's blocks, free nothing."""
        _keep_forever(self.c_free)
        _keep_forever(self.c_order)
        _keep_forever(self.c_live)
        self.c_free = {}
        self.c_order = {}
        self.c_live = {}
        self.c_in_use = 0
        self.c_cached = 0
        self.c_requested = 0
        self.c_peak = 0
        return 0

    cdef PinnedBlock c_malloc(self, int64_t nbytes, int dev):
        cdef PinnedBlock b = PinnedBlock.__new__(PinnedBlock)
        b.c_slab = self.c_acquire(nbytes, dev)
        if self.c_ref is None:
            self.c_ref = weakref.ref(self)
        b.c_pool_ref = self.c_ref
        b.c_nbytes = nbytes
        return b

    # -------------------------------------------------------------- Python level
    def malloc(self, nbytes, device=-1):
        """A block of at least ``nbytes`` bytes of page-locked host memory.

        Parameters
        ----------
        nbytes : int, bytes
        device : int, CUDA device whose context pins new memory (-1: current)

        Raises
        ------
        MemoryAllocationError
            CUDA could not pin the memory, even after the cache was freed.
        NotSupportedError
            CuPy is not installed.
        """
        cdef int64_t n = _nonneg(nbytes, "nbytes")
        cdef int64_t d
        c_check_usable("PinnedHostPool.malloc")
        c_cupy()
        if isinstance(device, int) and not isinstance(device, bool) and device == -1:
            return self.c_malloc(n, c_current_device())
        d = _nonneg(device, "device")
        if d >= _device_count():
            raise_error(Error.InvalidArgument,
                        f"device={d}: there are {_device_count()} CUDA device(s)")
        return self.c_malloc(n, <int>d)

    def empty_cache(self):
        """Free every cached block (blocks in use are kept). A block whose last
        copy may still run is freed once that copy has completed.
        """
        cdef _Slab slab
        cdef dict slabs
        cdef dict order = {}
        cdef dict free = {}
        if _forked_after_init:
            return            # forked after CUDA init: the pool holds nothing of its own
        with self.c_lock:
            slabs = self.c_order
            self.c_order = order
            self.c_free, free = free, self.c_free
            self.c_cached = 0
        _free_all(slabs)

    def stats(self):
        """Counters, all in bytes except the counts: ``in_use_bytes`` (blocks
        handed out, by size class), ``requested_bytes`` (what their callers
        asked for), ``cached_bytes``, ``held_bytes`` (in use + cached: the
        page-locked memory held), ``peak_bytes`` (highest ``held_bytes``),
        ``max_cached_bytes``, ``hits``, ``misses``, ``evictions``,
        ``failures`` (pinning failures after the retry), ``blocks_in_use``,
        ``blocks_cached``.
        """
        cdef _Counts c
        if _forked_after_init:        # after a fork the lock may be held by a lost thread
            self._counts(&c)
        else:
            with self.c_lock:
                self._counts(&c)
        # the dict is built after the lock is released (see _recache)
        return {
            "in_use_bytes": c.in_use,
            "requested_bytes": c.requested,
            "cached_bytes": c.cached,
            "held_bytes": c.in_use + c.cached,
            "peak_bytes": c.peak,
            "max_cached_bytes": c.limit,
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "failures": c.failures,
            "blocks_in_use": c.blocks_in_use,
            "blocks_cached": c.blocks_cached,
        }

    cdef void _counts(self, _Counts* c) noexcept:
        c.in_use = self.c_in_use
        c.requested = self.c_requested
        c.cached = self.c_cached
        c.peak = self.c_peak
        c.limit = self.c_limit
        c.hits = self.c_hits
        c.misses = self.c_misses
        c.evictions = self.c_evictions
        c.failures = self.c_failures
        c.blocks_in_use = len(self.c_live)
        c.blocks_cached = len(self.c_order)

    def reset_peak(self):
        """Set ``peak_bytes`` to the bytes held now.
        """
        if _forked_after_init:
            self.c_peak = self.c_in_use + self.c_cached
            return
        with self.c_lock:
            self.c_peak = self.c_in_use + self.c_cached

    @property
    def max_cached_bytes(self):
        """Cap on cached bytes (int); setting it lower frees the oldest cached blocks."""
        return self.c_limit

    @max_cached_bytes.setter
    def max_cached_bytes(self, value):
        cdef int64_t limit = _nonneg(value, "max_cached_bytes")
        cdef list to_free = []
        cdef _Slab old
        if _forked_after_init:
            self.c_limit = limit      # nothing cached of its own to free
            return
        with self.c_lock:
            self.c_limit = limit
            self._evict(to_free)
        _free_all(to_free)

    def __repr__(self):
        s = self.stats()
        return (f"<PinnedHostPool in_use={s['in_use_bytes']} cached={s['cached_bytes']} "
                f"max_cached={s['max_cached_bytes']}>")


cdef PinnedHostPool _POOL = PinnedHostPool()


cdef PinnedHostPool c_default_pool():
    return _POOL


def get_pinned_host_pool():
    """The process-wide pool behind pinned clones, copy slots and ``pinned=True`` makers.
    """
    return _POOL


# ------------------------------------------------------------------ configuration

cdef object _ranged(object v, str argname, int64_t lo, int64_t hi):
    """``v`` as an int within lo..hi, or InvalidType/InvalidArgument naming ``argname``."""
    if isinstance(v, bool):
        raise_error(Error.InvalidType, f"{argname}={v!r} must be an int")
    try:
        i = v.__index__()
    except (AttributeError, TypeError):
        raise_error(Error.InvalidType, f"{argname}={v!r} of type {type(v).__name__} must be an int")
    if not lo <= i <= hi:
        raise_error(Error.InvalidArgument, f"{argname}={i}: must be within {lo}..{hi}")
    return i


def _check_config(threads, slot_bytes, slots, small_copy_bytes):
    out = {}
    if threads is not None:
        t = _ranged(threads, "threads", 1, 1024)
        if not 1 <= t <= 1024:
            raise_error(Error.InvalidArgument, f"threads={t}: must be within 1..1024")
        out["threads"] = t
    if slot_bytes is not None:
        s = _ranged(slot_bytes, "slot_bytes", 4096, 1 << 40)
        if not 4096 <= s <= (1 << 40):
            raise_error(Error.InvalidArgument, f"slot_bytes={s}: must be within 4096..2**40")
        out["slot_bytes"] = s
    if slots is not None:
        k = _ranged(slots, "slots", 1, 64)
        if not 1 <= k <= 64:
            raise_error(Error.InvalidArgument, f"slots={k}: must be within 1..64")
        out["slots"] = k
    if small_copy_bytes is not None:
        out["small_copy_bytes"] = _nonneg(small_copy_bytes, "small_copy_bytes")
    return out


cdef int _apply(CopyConfig* cfg, dict kw) except -1:
    if "threads" in kw:
        cfg.threads = kw["threads"]
    if "slot_bytes" in kw:
        cfg.slot_bytes = kw["slot_bytes"]
    if "slots" in kw:
        cfg.slots = kw["slots"]
    if "small_copy_bytes" in kw:
        cfg.small_bytes = kw["small_copy_bytes"]
    return 0


cdef int c_config(CopyConfig* cfg, object threads, object slot_bytes, object slots,
                  object small_bytes) except -1:
    """The settings for one copy: process-wide, then this thread's, then the call's."""
    cfg[0] = _cfg
    local = getattr(_tls, "stack", None)
    if local:
        _apply(cfg, local[-1])
    if threads is not None or slot_bytes is not None or slots is not None or small_bytes is not None:
        _apply(cfg, _check_config(threads, slot_bytes, slots, small_bytes))
    return 0


def set_copy_config(*, threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """Change the copy engine's process-wide settings (None keeps a setting).

    Parameters
    ----------
    threads : int, host threads copying each chunk (T)
    slot_bytes : int, bytes per pinned slot, the chunk size (S)
    slots : int, pinned slots in flight (K)
    small_copy_bytes : int, bytes up to which a copy skips the pipeline

    Notes
    -----
    The environment variable ``ETPTR_COPY_CONFIG`` (for example
    ``"threads=12,slot_bytes=16777216"``) sets the same values when etptr's
    copy engine is first imported.

    Raises
    ------
    InvalidArgumentError
        A value out of range.
    """
    _apply(&_cfg, _check_config(threads, slot_bytes, slots, small_copy_bytes))


def _config_from_env():
    """Apply ``ETPTR_COPY_CONFIG`` ("threads=12,slot_bytes=16777216,...") at import."""
    text = os.environ.get("ETPTR_COPY_CONFIG", "")
    if not text.strip():
        return
    try:
        kw = {}
        for item in text.split(","):
            if item.strip():
                key, value = item.split("=")
                kw[key.strip()] = int(value.strip(), 0)
        set_copy_config(**kw)
    except Exception as exc:
        warnings.warn(f"etptr: ignoring ETPTR_COPY_CONFIG={text!r}: {exc}", EtWarning,
                      stacklevel=2)


def get_copy_config():
    """The copy engine's settings in force for the calling thread: the
    process-wide ones (:func:`set_copy_config`, ``ETPTR_COPY_CONFIG``),
    overridden inside ``with etptr.cuda.copy_config(...)`` blocks of this thread.

    Keys: ``threads`` (host threads copying each chunk; by default 16, or
    fewer when the process may use fewer CPUs), ``slot_bytes`` (bytes per
    pinned slot, the largest chunk), ``slots`` (pinned slots in flight),
    ``small_copy_bytes`` (bytes up to which a pageable copy is one
    ``cudaMemcpyAsync``, without the pipeline).
    """
    cdef CopyConfig cfg
    c_config(&cfg, None, None, None, None)
    return {"threads": cfg.threads, "slot_bytes": cfg.slot_bytes, "slots": cfg.slots,
            "small_copy_bytes": cfg.small_bytes}


_config_from_env()


def _push_config(threads=None, slot_bytes=None, slots=None, small_copy_bytes=None):
    """Override settings for this thread until :func:`_pop_config`."""
    kw = _check_config(threads, slot_bytes, slots, small_copy_bytes)
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    merged = dict(stack[-1]) if stack else {}
    merged.update(kw)
    stack.append(merged)


def _pop_config():
    _tls.stack.pop()


# ------------------------------------------------------------------ engines (one per device)

@cython.final
cdef class _Engine:
    cdef int dev
    cdef intptr_t stream          # the device's copy stream (blocking)
    cdef intptr_t order_event     # orders the copy stream after the caller's stream
    cdef cython.pymutex lock


cdef dict _engines = {}
cdef cython.pymutex _engines_lock


cdef _Engine _engine(int dev):
    """The copy stream and events of ``dev``; the device must be current."""
    cdef _Engine eng = _engines.get(dev)
    if eng is not None:
        return eng
    eng = _Engine.__new__(_Engine)
    eng.dev = dev
    try:
        eng.stream = _rt.streamCreateWithFlags(0)
        try:
            eng.order_event = _rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
        except BaseException:
            _rt.streamDestroy(eng.stream)
            raise
    except _CudaError as exc:
        raise EtError(f"creating cuda:{dev}'s copy stream failed: {exc}", Error.Internal) from exc
    with _engines_lock:
        other = _engines.get(dev)
        if other is None:
            _engines[dev] = eng
    if other is not None:
        _rt.streamDestroy(eng.stream)
        _rt.eventDestroy(eng.order_event)
        return other
    return eng


cdef int _order_after(_Engine eng, intptr_t cur) except -1:
    """Make the copy stream wait for the work queued so far on the caller's stream ``cur``."""
    cdef int rc
    if cur == 0 or cur == eng.stream:
        return 0      # the legacy default stream already orders blocking streams
    with eng.lock:
        with nogil:
            rc = _api.event_record(<void*>eng.order_event, <void*>cur)
            if rc == 0:
                rc = _api.stream_wait_event(<void*>eng.stream, <void*>eng.order_event, 0)
    _check(rc, "ordering the copy after the caller's stream")
    return 0


_MAX_HANDLE = (1 << 63) - 1


cdef intptr_t c_stream_handle(object stream) except? -1:
    """A raw cudaStream_t from an int, a ``__cuda_stream__`` object, or ``.ptr``/``.cuda_stream``."""
    h = None
    if isinstance(stream, bool):
        h = None
    elif hasattr(stream, "__index__"):
        h = stream.__index__()
    else:
        proto = getattr(stream, "__cuda_stream__", None)
        if proto is not None:
            pair = proto()
            if isinstance(pair, tuple) and len(pair) == 2 and hasattr(pair[1], "__index__"):
                h = pair[1].__index__()
            else:
                raise_error(Error.InvalidType,
                            f"stream={stream!r}: __cuda_stream__() returned {pair!r}, not "
                            f"(version, handle)")
        else:
            for attr in ("ptr", "cuda_stream"):
                v = getattr(stream, attr, None)
                if isinstance(v, int) and not isinstance(v, bool):
                    h = v
                    break
    if h is None:
        raise_error(Error.InvalidType,
                    f"stream={stream!r}: expected a CUDA stream (an int handle, an object with "
                    f"__cuda_stream__, or a CuPy/PyTorch stream)")
    if not 0 <= h <= _MAX_HANDLE:
        raise_error(Error.InvalidArgument, f"stream={h}: not a stream handle (a pointer, >= 0)")
    return h


cdef int _pointer_attr(void* out, int attr, uintptr_t address) except -1:
    """cuPointerGetAttribute, for callers to whom a failure is an answer (memory CUDA
    does not know): its return code, except that a KeyboardInterrupt (or the like)
    caught in a shim is raised, not taken for that answer."""
    cdef int rc = _api.pointer_attr(out, attr, address)
    if rc == _SHIM_FAILED:
        exc = getattr(_shim_errors, "exc", None)
        _shim_errors.exc = None
        if exc is not None and not isinstance(exc, Exception):
            raise exc
    return rc


cdef bint _is_page_locked(uintptr_t address) except -1:
    cdef unsigned int kind = 0
    if _pointer_attr(&kind, _ATTR_MEMORY_TYPE, address) != 0:
        return False              # memory CUDA does not know: pageable
    return kind == _MEMORY_TYPE_HOST


# ------------------------------------------------------------------ host copy threads
#
# A process-wide pool of worker threads (plain pthreads that never touch
# Python) copies the pieces of each chunk. A caller posts a job (dst, src,
# pieces), copies pieces itself too, and waits until every piece is done and no
# worker still holds the job. Workers take pieces with an atomic counter, so
# two callers (two GPUs) share the pool; the job list is guarded by a spin lock
# held for a few instructions. While a pipelined copy runs (_tp_active > 0) idle
# workers spin, so the next chunk starts within a microsecond; otherwise they
# spin for _SPIN_NS and then sleep on a condition variable: nothing spins while
# no copy runs, so the pool does not compete with other thread pools in the
# process (OpenMP's in torch, BLAS). After fork() the child starts with no
# workers and makes new ones.

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_attr_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*) noexcept nogil,
                       void* arg)
    int pthread_attr_init(pthread_attr_t* attr)
    int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size)
    int pthread_attr_destroy(pthread_attr_t* attr)
    int pthread_detach(pthread_t t)
    int pthread_mutex_init(pthread_mutex_t* m, const void* attr)
    int pthread_mutex_lock(pthread_mutex_t* m)
    int pthread_mutex_unlock(pthread_mutex_t* m)
    int pthread_cond_init(pthread_cond_t* c, const void* attr)
    int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m)
    int pthread_cond_broadcast(pthread_cond_t* c)
    int pthread_cond_signal(pthread_cond_t* c)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t* s)
    int pthread_sigmask(int how, const sigset_t* s, sigset_t* old)
    enum:
        SIG_SETMASK

cdef extern from *:
    """
    #include <time.h>
    static inline long long etptr_atomic_load(long long* p) {
        return __atomic_load_n(p, __ATOMIC_SEQ_CST);
    }
    static inline long long etptr_atomic_add(long long* p, long long v) {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    }
    static inline void etptr_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield" ::: "memory");
    #endif
    }
    static inline void etptr_spin_lock(long long* p) {
        for (;;) {
            if (!__atomic_exchange_n(p, 1, __ATOMIC_ACQUIRE)) return;
            while (__atomic_load_n(p, __ATOMIC_RELAXED)) etptr_cpu_relax();
        }
    }
    static inline void etptr_spin_unlock(long long* p) {
        __atomic_store_n(p, 0, __ATOMIC_RELEASE);
    }
    /* Copy with non-temporal (streaming) stores: the destination's lines go to
       memory without being read into the cache first or left dirty in it, so a
       DMA that reads them next does not have to pull them out of the CPU's cache. */
    #if defined(__x86_64__)
    #include <emmintrin.h>
    static void etptr_copy_stream(char* dst, const char* src, size_t n) {
        size_t head = (16 - ((size_t)dst & 15)) & 15;
        size_t blocks;
        if (head > n) head = n;
        memcpy(dst, src, head);
        dst += head; src += head; n -= head;
        for (blocks = n / 64; blocks; blocks--) {
            __m128i a = _mm_loadu_si128((const __m128i*)src);
            __m128i b = _mm_loadu_si128((const __m128i*)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i*)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i*)(src + 48));
            _mm_stream_si128((__m128i*)dst, a);
            _mm_stream_si128((__m128i*)(dst + 16), b);
            _mm_stream_si128((__m128i*)(dst + 32), c);
            _mm_stream_si128((__m128i*)(dst + 48), d);
            src += 64; dst += 64;
        }
        memcpy(dst, src, n & 63);
        _mm_sfence();
    }
    #else
    static void etptr_copy_stream(char* dst, const char* src, size_t n) {
        memcpy(dst, src, n);
    }
    #endif
    static inline long long etptr_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    """
    long long etptr_atomic_load(long long* p) noexcept nogil
    long long etptr_atomic_add(long long* p, long long v) noexcept nogil
    void etptr_cpu_relax() noexcept nogil
    void etptr_spin_lock(long long* p) noexcept nogil
    void etptr_spin_unlock(long long* p) noexcept nogil
    long long etptr_now_ns() noexcept nogil
    void etptr_copy_stream(char* dst, const char* src, size_t n) noexcept nogil


cdef struct _Job:
    char* dst
    const char* src
    long long nbytes
    long long piece        # bytes per piece (the last may be shorter)
    long long parts
    long long next         # atomic: the next piece to take
    long long done         # atomic: pieces copied
    long long refs         # atomic: workers inside the job
    bint stream            # non-temporal stores (the destination is read by DMA next)
    _Job* link


cdef long long _SPIN_NS = 200000          # idle spin before a worker sleeps (no copy running)
cdef long long _SPIN_BUSY_NS = 20000      # the same while threads outnumber CPUs
cdef long long _tp_list_lock = 0          # spin lock over _tp_jobs
cdef _Job* _tp_jobs = NULL                # posted jobs, oldest first
cdef long long _tp_gen = 0                # atomic: bumped whenever a job is posted
cdef long long _tp_active = 0             # atomic: pipelined copies running (workers stay awake)
cdef pthread_mutex_t _tp_sleep_lock       # guards _tp_sleepers and the sleep itself
cdef pthread_cond_t _tp_wake              # idle workers sleep here
cdef long long _tp_sleepers = 0          # atomic: workers asleep, or about to sleep
cdef int _tp_workers = 0                  # threads started (changed under _tp_sleep_lock)
cdef int _tp_failed = 0                   # pthread_create failures (the callers copy alone)
cdef long long _tp_epoch = 0              # bumped by _tp_init (at import and after fork)
cdef int _tp_ncpu = 1                     # CPUs this process may use


cdef void _tp_init() noexcept nogil:
    global _tp_list_lock, _tp_jobs, _tp_gen, _tp_active, _tp_sleepers, _tp_workers, _tp_epoch
    _tp_epoch += 1
    pthread_mutex_init(&_tp_sleep_lock, NULL)
    pthread_cond_init(&_tp_wake, NULL)
    _tp_list_lock = 0
    _tp_jobs = NULL
    _tp_gen = 0
    _tp_active = 0
    _tp_sleepers = 0
    _tp_workers = 0


_tp_init()


cdef void _run_pieces(_Job* job) noexcept nogil:
    cdef long long i, off, m
    while True:
        i = etptr_atomic_add(&job.next, 1)
        if i >= job.parts:
            return
        off = i * job.piece
        m = job.nbytes - off
        if m > job.piece:
            m = job.piece
        if m > 0:
            if job.stream:
                etptr_copy_stream(job.dst + off, job.src + off, <size_t>m)
            else:
                memcpy(job.dst + off, job.src + off, <size_t>m)
        etptr_atomic_add(&job.done, 1)


cdef _Job* _take_job() noexcept nogil:
    """The oldest posted job with pieces left, its refs raised; NULL if none."""
    cdef _Job* job
    etptr_spin_lock(&_tp_list_lock)
    job = _tp_jobs
    while job != NULL and etptr_atomic_load(&job.next) >= job.parts:
        job = job.link
    if job != NULL:
        etptr_atomic_add(&job.refs, 1)
    etptr_spin_unlock(&_tp_list_lock)
    return job


cdef void* _tp_worker(void* arg) noexcept nogil:
    cdef _Job* job
    cdef long long gen, idle_since, idle
    cdef int k
    cdef bint crowded
    idle_since = etptr_now_ns()
    while True:
        job = _take_job()
        if job != NULL:
            _run_pieces(job)
            etptr_atomic_add(&job.refs, -1)
            idle_since = etptr_now_ns()
            continue
        # Nothing to do: spin until a job is posted. Sleep when no copy is running,
        # or soon when threads outnumber CPUs (spinning would slow the callers down).
        gen = etptr_atomic_load(&_tp_gen)
        while etptr_atomic_load(&_tp_gen) == gen:
            for k in range(32):
                etptr_cpu_relax()
            crowded = _tp_workers + etptr_atomic_load(&_tp_active) > _tp_ncpu
            idle = etptr_now_ns() - idle_since
            if (crowded and idle > _SPIN_BUSY_NS) or (
                    etptr_atomic_load(&_tp_active) == 0 and idle > _SPIN_NS):
                pthread_mutex_lock(&_tp_sleep_lock)
                # Announce the sleep before looking at _tp_gen again: a poster bumps
                # _tp_gen before it reads _tp_sleepers, so one of the two sees the other.
                etptr_atomic_add(&_tp_sleepers, 1)
                if etptr_atomic_load(&_tp_gen) == gen:
                    pthread_cond_wait(&_tp_wake, &_tp_sleep_lock)
                etptr_atomic_add(&_tp_sleepers, -1)
                pthread_mutex_unlock(&_tp_sleep_lock)
                idle_since = etptr_now_ns()
                break
    return NULL


cdef void _tp_wake_some(long long n) noexcept nogil:
    """Wake up to ``n`` sleeping workers (call after bumping _tp_gen)."""
    cdef long long i
    if etptr_atomic_load(&_tp_sleepers) <= 0:
        return
    pthread_mutex_lock(&_tp_sleep_lock)
    if n >= _tp_sleepers:
        pthread_cond_broadcast(&_tp_wake)
    else:
        for i in range(n):
            pthread_cond_signal(&_tp_wake)
    pthread_mutex_unlock(&_tp_sleep_lock)


cdef void _tp_grow(int threads, long long callers) noexcept nogil:
    """Start workers for ``callers`` concurrent copies of ``threads`` threads each: up to
    one per CPU (less the caller), or ``threads - 1`` when a caller asks for more."""
    global _tp_workers, _tp_failed
    cdef pthread_t t
    cdef pthread_attr_t attr
    cdef sigset_t all_signals, old
    cdef long long want = (threads - 1) * callers
    cdef long long limit = _tp_ncpu - 1 if _tp_ncpu - 1 > threads - 1 else threads - 1
    if want > limit:
        want = limit
    if _tp_workers >= want:
        return
    pthread_mutex_lock(&_tp_sleep_lock)
    sigfillset(&all_signals)
    pthread_sigmask(SIG_SETMASK, &all_signals, &old)
    pthread_attr_init(&attr)
    pthread_attr_setstacksize(&attr, 256 * 1024)     # workers only call memcpy
    while _tp_workers < want:
        if pthread_create(&t, &attr, _tp_worker, NULL) != 0:
            _tp_failed += 1
            break
        pthread_detach(t)
        _tp_workers += 1
    pthread_attr_destroy(&attr)
    pthread_sigmask(SIG_SETMASK, &old, NULL)
    pthread_mutex_unlock(&_tp_sleep_lock)


cdef long long _tp_begin(int threads) noexcept nogil:
    """A pipelined copy starts: wake the workers now (they spin until _tp_end). Returns
    the pool's epoch, for _tp_end."""
    cdef long long active = etptr_atomic_add(&_tp_active, 1) + 1
    _tp_grow(threads, active)
    etptr_atomic_add(&_tp_gen, 1)
    _tp_wake_some(threads - 1)
    return _tp_epoch


cdef void _tp_end(long long epoch) noexcept nogil:
    # A copy that began before a fork (in the thread that forked) ends in the child
    # too: it did not count in the child's fresh pool.
    if epoch == _tp_epoch:
        etptr_atomic_add(&_tp_active, -1)


cdef void _par_copy(char* dst, const char* src, int64_t n, int nthreads,
                    bint stream) noexcept nogil:
    """memcpy with up to ``nthreads`` threads (the caller and pool workers), pieces of at
    least _MIN_PIECE bytes; ``stream``: with non-temporal stores."""
    global _tp_jobs
    cdef _Job job
    cdef _Job* p
    cdef long long parts = nthreads
    cdef long long spins = 0
    if parts > n // _MIN_PIECE:
        parts = n // _MIN_PIECE
    if parts <= 1:
        if stream:
            etptr_copy_stream(dst, src, <size_t>n)
        else:
            memcpy(dst, src, <size_t>n)
        return
    if _tp_workers < parts - 1:
        _tp_grow(<int>parts, 1)
    job.dst = dst
    job.src = src
    job.nbytes = n
    job.piece = ((n + parts - 1) // parts + 63) & ~(<int64_t>63)
    job.parts = parts
    job.next = 0
    job.done = 0
    job.refs = 0
    job.stream = stream
    job.link = NULL
    etptr_spin_lock(&_tp_list_lock)
    p = _tp_jobs
    if p == NULL:
        _tp_jobs = &job
    else:
        while p.link != NULL:
            p = p.link
        p.link = &job
    etptr_spin_unlock(&_tp_list_lock)
    etptr_atomic_add(&_tp_gen, 1)
    _tp_wake_some(parts - 1)
    _run_pieces(&job)
    # every piece is taken: wait for the ones workers are copying (spin briefly; yield
    # the CPU at once when threads outnumber CPUs, where the worker may need this one)
    while etptr_atomic_load(&job.done) < parts:
        spins += 1
        if spins < 20000 and _tp_workers + etptr_atomic_load(&_tp_active) <= _tp_ncpu:
            etptr_cpu_relax()
        else:
            sched_yield()
    _unlink_job(&job)


cdef void _unlink_job(_Job* job) noexcept nogil:
    """Take ``job`` off the list, then wait until no worker holds it."""
    global _tp_jobs
    cdef _Job* p
    etptr_spin_lock(&_tp_list_lock)
    if _tp_jobs == job:
        _tp_jobs = job.link
    else:
        p = _tp_jobs
        while p != NULL and p.link != job:
            p = p.link
        if p != NULL:
            p.link = job.link
    etptr_spin_unlock(&_tp_list_lock)
    while etptr_atomic_load(&job.refs) > 0:
        sched_yield()


def _host_copy(dst, src, nbytes, threads, stream=False):
    """Copy ``nbytes`` bytes between host addresses with ``threads`` threads (``stream``:
    non-temporal stores). For measurements."""
    cdef char* d = <char*><uintptr_t>dst
    cdef const char* s = <const char*><uintptr_t>src
    cdef int64_t n = _nonneg(nbytes, "nbytes")
    cdef int t = _check_config(threads, None, None, None)["threads"]
    cdef bint nt = stream
    if n and (dst == 0 or src == 0):
        raise_error(Error.InvalidArgument, "dst and src must not be null")
    with nogil:
        _par_copy(d, s, n, t, nt)


def _copy_threads():
    """Worker threads the host copy pool has started here, and start failures. For tests."""
    return {"workers": _tp_workers, "failed": _tp_failed}


_tp_ncpu = _cpu_count()


# ------------------------------------------------------------------ the engine

cdef object _chunk_hook = None   # tests: called as hook(direction, chunk index) after each chunk
cdef bint _hook_set = False
cdef int64_t _MIN_CHUNK = 1 << 20      # smallest pipelined chunk
cdef int _TARGET_CHUNKS = 4            # a copy shorter than K slots is cut in this many chunks
cdef int _SIGNAL_EVERY = 4             # chunks between checks for KeyboardInterrupt
cdef bint _stream_h2d = True           # fill upload slots with non-temporal stores ...
cdef int64_t _STREAM_MAX = 64 << 20    # ... in copies up to this size: above it memcpy was
                                       # faster (bench/results/h200x2_chunking.txt)


def _set_chunking(int target_chunks, int64_t min_chunk):
    """Cut copies shorter than K slots in ``target_chunks`` chunks of at least ``min_chunk``
    bytes (1: one chunk per slot). For measurements (bench/sweep_copy.py)."""
    global _TARGET_CHUNKS, _MIN_CHUNK
    if target_chunks < 1 or min_chunk < 4096:
        raise_error(Error.InvalidArgument,
                    f"target_chunks={target_chunks}, min_chunk={min_chunk}: need >= 1 and >= 4096")
    _TARGET_CHUNKS = target_chunks
    _MIN_CHUNK = min_chunk


def _set_streaming_stores(bint on):
    """Fill upload slots with non-temporal stores (True) or memcpy. For measurements."""
    global _stream_h2d
    _stream_h2d = on


def _get_chunking():
    """(target_chunks, min_chunk) in use; see _set_chunking."""
    return _TARGET_CHUNKS, _MIN_CHUNK


def _set_chunk_hook(hook):
    """Call ``hook(direction, i)`` after each pipelined chunk (None: stop). For tests."""
    global _chunk_hook, _hook_set
    _chunk_hook = hook
    _hook_set = hook is not None


cdef inline int64_t _ceil_div(int64_t n, int64_t d) noexcept nogil:
    return n // d + (1 if n % d else 0)      # no overflow near 2**63


cdef int64_t _chunk_bytes(int64_t nbytes, CopyConfig* cfg) noexcept nogil:
    """The chunk size of a pipelined copy: the slot size, or less, so that a copy
    of a few slots still overlaps host copies with DMA (about _TARGET_CHUNKS chunks)."""
    cdef int64_t s = cfg.slot_bytes
    cdef int64_t c
    if nbytes >= s * cfg.slots:
        return s
    c = _ceil_div(nbytes, _TARGET_CHUNKS)
    c = (c + 65535) & ~(<int64_t>65535)
    if c < _MIN_CHUNK:
        c = _MIN_CHUNK
    return s if c > s else c


cdef struct _Pipe:
    char* host                # the pageable side
    unsigned long long dev    # the device side
    int64_t nbytes
    int64_t chunk             # bytes per chunk (<= a slot)
    int k                     # slots
    int threads
    int device                # for messages
    bint stream_stores        # fill upload slots with non-temporal stores
    void* stream
    char* slot[64]
    void* event[64]
    bint pending[64]          # an event recorded on the slot that may not have completed


cdef inline int64_t _chunk_len(_Pipe* p, int64_t i) noexcept nogil:
    """Bytes in chunk ``i`` (the last one may be short)."""
    cdef int64_t m = p.nbytes - i * p.chunk
    return p.chunk if m > p.chunk else m


cdef int _pipe_failed(int rc, _Pipe* p, bint h2d) except -1 with gil:
    what = "host->device copy" if h2d else "device->host copy"
    c_cuda_failed(rc, f"{what} of nbytes={p.nbytes} on cuda:{p.device}")
    return -1


cdef int _between_chunks(bint h2d, int64_t i) except -1 with gil:
    if _hook_set and _chunk_hook is not None:
        _chunk_hook("h2d" if h2d else "d2h", i)
    PyErr_CheckSignals()
    c_check_usable("host->device copy" if h2d else "device->host copy")   # forked meanwhile?
    return 0


cdef int _pipe_h2d(_Pipe* p, bint sync) except -1 nogil:
    """Chunk i: wait for its slot's previous DMA, copy it into the slot with
    ``threads`` threads, queue the slot's DMA and record the slot's event."""
    cdef int64_t nchunks = _ceil_div(p.nbytes, p.chunk)
    cdef int64_t i, off, m
    cdef int j, rc
    for i in range(nchunks):
        j = <int>(i % p.k)
        if p.pending[j]:
            rc = _api.event_sync(p.event[j])
            if rc != 0:
                _pipe_failed(rc, p, True)
            p.pending[j] = False
        off = i * p.chunk
        m = _chunk_len(p, i)
        _par_copy(p.slot[j], p.host + off, m, p.threads, p.stream_stores)
        rc = _api.htod(p.dev + <unsigned long long>off, p.slot[j], <size_t>m, p.stream)
        if rc == 0:
            rc = _api.event_record(p.event[j], p.stream)
        if rc != 0:
            _pipe_failed(rc, p, True)
        p.pending[j] = True
        if _hook_set or i % _SIGNAL_EVERY == _SIGNAL_EVERY - 1:
            _between_chunks(True, i)
    if sync:
        rc = _api.stream_sync(p.stream)
        if rc != 0:
            _pipe_failed(rc, p, True)
        for j in range(p.k):
            p.pending[j] = False
    return 0


cdef int _pipe_d2h(_Pipe* p) except -1 nogil:
    """The reverse: the DMAs of the first K chunks are queued at once; chunk i is
    copied out of its slot by ``threads`` threads once its event completes, and
    the slot's next DMA (chunk i+K) is queued right after."""
    cdef int64_t nchunks = _ceil_div(p.nbytes, p.chunk)
    cdef int64_t i, off, m
    cdef int j, rc
    for i in range(nchunks + p.k):
        if i >= p.k:
            # chunk i-K is in its slot once the slot's event completes: copy it out
            j = <int>((i - p.k) % p.k)
            rc = _api.event_sync(p.event[j])
            if rc != 0:
                _pipe_failed(rc, p, False)
            p.pending[j] = False
            off = (i - p.k) * p.chunk
            m = _chunk_len(p, i - p.k)
            _par_copy(p.host + off, p.slot[j], m, p.threads, False)
            if _hook_set or (i - p.k) % _SIGNAL_EVERY == _SIGNAL_EVERY - 1:
                _between_chunks(False, i - p.k)
        if i < nchunks:
            j = <int>(i % p.k)
            off = i * p.chunk
            m = _chunk_len(p, i)
            rc = _api.dtoh(p.slot[j], p.dev + <unsigned long long>off, <size_t>m, p.stream)
            if rc == 0:
                rc = _api.event_record(p.event[j], p.stream)
            if rc != 0:
                _pipe_failed(rc, p, False)
            p.pending[j] = True
    return 0


cdef void _drain(intptr_t stream, list slabs) noexcept:
    """On a failure: let queued copies finish before memory is freed or reused."""
    cdef _Slab slab
    cdef int rc
    if _forked_after_init:
        return        # forked during the copy: the stream is the parent's
    with nogil:
        rc = _api.stream_sync(<void*>stream)
    if rc != 0:
        return        # the slabs keep their pending events: the pool waits for them
    for slab in slabs:
        slab.pending = False


cdef int _staged(uintptr_t dev_ptr, uintptr_t host, int64_t nbytes, int dev, intptr_t s,
                 bint h2d, bint sync, CopyConfig* cfg) except -1:
    """A pageable copy through K pinned slots (H2D: ``sync`` False leaves the DMAs queued)."""
    cdef _Pipe p
    cdef int64_t nchunks
    cdef long long epoch
    cdef list slabs = []
    cdef _Slab slab
    cdef int j
    p.host = <char*>host
    p.dev = dev_ptr
    p.nbytes = nbytes
    p.chunk = _chunk_bytes(nbytes, cfg)
    nchunks = _ceil_div(nbytes, p.chunk)
    p.k = <int>(cfg.slots if cfg.slots < nchunks else nchunks)
    p.threads = cfg.threads
    p.device = dev
    p.stream_stores = _stream_h2d and nbytes <= _STREAM_MAX
    p.stream = <void*>s
    for j in range(p.k):
        p.pending[j] = False
    epoch = _tp_begin(p.threads)      # wakes the copy threads while the slots are found
    try:
        try:
            for j in range(p.k):
                # whole slots (slot_bytes) even for shorter chunks: one size class to cache
                slab = _POOL.c_acquire(cfg.slot_bytes, dev)
                slabs.append(slab)
                _ensure_event(slab, dev)
                p.slot[j] = <char*>slab.ptr
                p.event[j] = <void*>slab.event
            if h2d:
                with nogil:
                    _pipe_h2d(&p, sync)
            else:
                with nogil:
                    _pipe_d2h(&p)
        finally:
            for j in range(len(slabs)):   # which slots a queued DMA may still touch
                (<_Slab>slabs[j]).pending = p.pending[j]
    except BaseException:
        _drain(s, slabs)
        raise
    finally:
        _tp_end(epoch)
        _release_all(slabs, cfg.slot_bytes)
    return 0


cdef int _release_all(list slabs, int64_t nbytes) except -1:
    """Give every slot back to the pool, even when one fails; then raise the first failure."""
    cdef _Slab slab
    first = None
    for slab in slabs:
        try:
            _POOL.c_release(slab, nbytes)
        except BaseException as exc:
            if first is None:
                first = exc
    if first is not None:
        raise first
    return 0


cdef int _check_device_range(uintptr_t address, int64_t nbytes, str argname) except -1:
    """Refuse a copy that would run past the end of the device allocation holding
    ``address`` (asked of the driver), before any byte is read or written."""
    cdef unsigned long long start = 0, size = 0
    if _pointer_attr(&start, _ATTR_RANGE_START, address) != 0:
        return 0              # not an allocation the driver can describe: leave it to CUDA
    if _pointer_attr(&size, _ATTR_RANGE_SIZE, address) != 0 or size == 0:
        return 0
    if address < start or <uint64_t>nbytes > size - (address - start):
        raise_error(Error.InvalidArgument,
                    f"nbytes={nbytes}: {argname}={address:#x} is {address - start} bytes into a "
                    f"device allocation of {size} bytes, so the copy would run past its end")
    return 0


cdef _Slab _pool_block_containing(uintptr_t address):
    """The pool block whose memory holds ``address`` (not its start), or None: asked of
    the driver, so that a stream-ordered copy from a view into a block protects it too."""
    cdef unsigned long long start = 0
    if _pointer_attr(&start, _ATTR_RANGE_START, address) != 0 or start == 0:
        return None
    if start == address:
        return None
    return _POOL.c_find(<uintptr_t>start)


cdef int _one_dma(uintptr_t dst, uintptr_t src, int64_t nbytes, bint h2d, intptr_t s,
                  bint sync) except -1:
    """One cudaMemcpyAsync (+ wait when ``sync``), without the GIL."""
    cdef int rc
    with nogil:
        if h2d:
            rc = _api.htod(dst, <const void*>src, <size_t>nbytes, <void*>s)
        else:
            rc = _api.dtoh(<void*>dst, src, <size_t>nbytes, <void*>s)
        if rc == 0 and sync:
            rc = _api.stream_sync(<void*>s)
    return rc


cdef int c_copy(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                CopyConfig* cfg, bint h2d) except -1:
    """Copy ``nbytes`` host -> device (``h2d``: ``src`` host, ``dst`` on ``dev``) or
    device -> host (``src`` on ``dev``, ``dst`` host).

    ``stream`` None: synchronous (on the device's copy stream, ordered after the
    caller's current stream). Otherwise queued on ``stream``: a pageable host side
    has been read (H2D) or written (D2H) when this returns; a page-locked one is
    read or written by the DMA later.
    """
    cdef DeviceGuard guard
    cdef _Engine eng
    cdef intptr_t s
    cdef bint sync = stream is None
    cdef _Slab slab
    cdef uintptr_t host = src if h2d else dst
    cdef int rc = 0
    cdef str what = "host->device copy" if h2d else "device->host copy"
    c_check_usable(what)
    if nbytes <= 0:
        return 0
    c_cupy()
    c_enter_device(dev, &guard)
    try:
        _check_device_range(dst if h2d else src, nbytes, "dst" if h2d else "src")
        if sync:
            eng = _engine(dev)
            s = eng.stream
            _order_after(eng, _current_stream().ptr)
        else:
            s = c_stream_handle(stream)
        slab = _POOL.c_find(host)
        if slab is None and not sync:
            slab = _pool_block_containing(host)
        if slab is not None or (nbytes > cfg.small_bytes and _is_page_locked(host)):
            # page-locked: one DMA; a pool block remembers the copy until it completes
            rc = _one_dma(dst, src, nbytes, h2d, s, sync)
            if rc == 0 and not sync and slab is not None:
                _record(slab, s, dev)
        elif nbytes <= cfg.small_bytes:
            # small and pageable: one cudaMemcpyAsync; the driver stages it. Into pageable
            # memory, or for the default synchronous form, wait for it.
            rc = _one_dma(dst, src, nbytes, h2d, s, sync or not h2d)
        else:
            _staged(dst if h2d else src, host, nbytes, dev, s, h2d, sync or not h2d, cfg)
        if rc != 0:
            c_cuda_failed(rc, f"{what} of nbytes={nbytes} on cuda:{dev}")
    finally:
        c_exit_device(&guard)
    return 0


def _pool_block_pending(address):
    """Whether the default pool's live block at ``address`` has a copy that may still
    run (an event recorded, not yet seen complete). For tests."""
    cdef _Slab slab = _POOL.c_find(<uintptr_t>address)
    if slab is None:
        raise_error(Error.InvalidArgument, f"address={address:#x}: not a live pool block")
    return bool(slab.pending)


def _engine_stream(int dev):
    """The raw handle of ``dev``'s copy stream (created on first use). For tests."""
    cdef DeviceGuard guard
    c_cupy()
    c_enter_device(dev, &guard)
    try:
        return _engine(dev).stream
    finally:
        c_exit_device(&guard)


# ------------------------------------------------------------------ fork handlers

def _before_fork():
    """os.register_at_fork(before=...): note CUDA initialised outside etptr (through CuPy).

    Before cuInit every driver call returns CUDA_ERROR_NOT_INITIALIZED, so a
    successful cuCtxGetCurrent (which initialises nothing) means the driver
    is initialised in this process.
    """
    if _cuda_initialised:
        return
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    try:
        cupy.cuda.driver.ctxGetCurrent()
    except Exception:
        return        # not initialised, or no usable driver
    _note_init()


def _after_fork_in_child():
    """os.register_at_fork(after_in_child=...): see "fork state" above.

    Runs in the child with one thread. When the parent had initialised CUDA,
    the copy streams and events, and every pool's pinned blocks, are dropped
    without a CUDA call (they belong to the parent's context, and a lock in
    them may have been held by a thread that the child does not have); from
    then on every CUDA entry point raises InvalidStateError and inherited
    tensors are released without freeing anything.
    """
    global _forked_after_init, _engines
    _tp_init()            # the parent's copy threads are not in this process
    if not _cuda_initialised or _forked_after_init:
        return
    _forked_after_init = True
    _keep_forever(_engines)
    _engines = {}
    for pool in list(_pools):
        (<PinnedHostPool>pool).c_forget()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
