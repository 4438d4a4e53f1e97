"""How etptr reaches CUDA: the driver's function table, contexts, pointer queries,
streams and events, page-locked memory, CuPy (imported lazily) and fork state.

This is the only module that knows how CUDA is reached. The calls made per copy
or per chunk go through :data:`api`, a table of C function pointers to the CUDA
driver API's own functions, looked up in the libcuda that CuPy's runtime loaded
(``dlopen``/``dlsym``) and called without the GIL. Where libcuda cannot be
loaded or lacks a function the table needs (or before CuPy is loaded), every
entry is a stub that returns an error, and a copy raises NotSupportedError
saying why. Rare calls (pinning memory, creating streams and events) go through
CuPy's runtime.

Every device-side call runs with its device's primary context current, and the
caller's context is restored afterwards: no context is created on a device the
caller did not name.

Fork: the CUDA driver cannot be used in a child made by ``os.fork()`` once
the parent has initialised it. In such a child every CUDA entry point of
etptr raises :class:`~etptr.InvalidStateError` (naming fork and the 'spawn'
start method), and what belonged to the parent's context (streams, events,
pinned blocks, device memory) is forgotten without a CUDA call: modules that
hold such things register a callback with :func:`_on_fork_child`. A child
forked before CUDA was first used may use CUDA itself.
"""
cimport cython
from cpython.ref cimport Py_INCREF
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uint64_t, uintptr_t
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym
from posix.unistd cimport getpid

import importlib
import os
import sys

from etptr._core._args cimport c_int_arg, c_type_name
from etptr._core._error cimport raise_error

from etptr._core._error import Error, EtError

# cudaMemcpyKind, cudaHostAllocPortable, cudaEventDisableTiming
cdef enum:
    _H2D = 1
    _D2H = 2
    _D2D = 3
    _HOST_ALLOC_PORTABLE = 1
    _EVENT_DISABLE_TIMING = 2
    _MAX_DEVICES = 128            # ExecuTorch's DeviceIndex is int8

# ------------------------------------------------------------------ fork state

cdef bint _cuda_initialised = False   # by etptr, in this process or before the fork
cdef bint _forked_after_init = False  # this process was forked after that
cdef long _init_pid = 0               # the process that initialised CUDA
_fork_callbacks = []                  # run in a child forked after CUDA was initialised


cdef void _note_init() noexcept:
    global _cuda_initialised, _init_pid
    if not _cuda_initialised:
        _init_pid = getpid()
        _cuda_initialised = True


cdef bint c_forked() noexcept nogil:
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


def _on_fork_child(callback):
    """Run ``callback()`` in a child forked after CUDA was initialised, before anything
    else: it drops what belonged to the parent's context, without a CUDA call."""
    _fork_callbacks.append(callback)


cdef void c_keep_forever(object obj) noexcept:
    """Never destroy ``obj`` (a parent's CUDA object seen in a forked child)."""
    Py_INCREF(obj)


# ------------------------------------------------------------------ CuPy, lazily

cdef object _cp = None      # the cupy module (or a stand-in set by _use_backend)
cdef object _rt = None      # its cuda.runtime
cdef tuple _stream_types = ()   # its stream classes, whose handle is their ``ptr``
cdef object _CudaError = None


cdef object c_runtime():
    """CuPy's ``cuda.runtime``, importing CuPy on first use; NotSupportedError without it.
    The caller has checked that CUDA is usable here (:func:`c_check_usable`)."""
    if _cp is None:
        try:
            cupy = importlib.import_module("cupy")
        except ImportError as exc:
            raise_error(Error.NotSupported,
                        f"CUDA copies need CuPy (pip install cupy-cuda12x or cupy-cuda13x): {exc}")
        _use_backend(cupy)
    return _rt


cdef object c_cupy():
    """The CuPy module (or its stand-in), imported on first use (see :func:`c_runtime`)."""
    c_runtime()
    return _cp


def _cupy():
    """The CuPy module (or its stand-in), imported on first use."""
    c_check_usable("CUDA")
    return c_cupy()


def _use_backend(module):
    """Use ``module`` as CuPy: CuPy itself, or a stand-in for it in tests (None: import
    CuPy again on next use). The table then points at the functions of the libcuda this
    process loads (the stubs where it cannot).

    Every module holding CUDA objects of the previous backend is told to forget them
    (the callbacks of :func:`_on_backend_change`)."""
    global _cp, _rt, _CudaError, _ndev, _stream_types
    _ndev = -1
    _stream_types = ()
    _forget_contexts()
    for callback in _backend_callbacks:
        callback()
    _use_stubs("CuPy not loaded yet")
    if module is None:
        _cp = _rt = _CudaError = None
        return
    _note_init()      # getDeviceCount below initialises the driver
    _cp = module
    _rt = module.cuda.runtime
    _stream_types = tuple(t for t in (getattr(module.cuda, "Stream", None),
                                      getattr(module.cuda, "ExternalStream", None))
                          if isinstance(t, type))
    _CudaError = module.cuda.runtime.CUDARuntimeError
    try:
        _rt.getDeviceCount()      # initialises the driver (no context) before any driver call
    except Exception:
        pass
    _load_driver()


_backend_callbacks = []


def _on_backend_change(callback):
    """Run ``callback()`` whenever the CUDA backend changes (tests swap in a stand-in)."""
    _backend_callbacks.append(callback)


cdef int c_forget_on_change(dict objects) except -1:
    """Empty ``objects`` (a module's CUDA objects by device) whenever they stop being
    valid: when the backend changes, and in a child forked after CUDA was initialised,
    where they are the parent's and are kept, never destroyed."""
    def forget():
        old = dict(objects)
        objects.clear()
        if c_forked():
            c_keep_forever(old)
    _on_fork_child(forget)
    _on_backend_change(forget)
    return 0


# ------------------------------------------------------------------ the driver table

cdef Api api
cdef str _driver_why = "CuPy not loaded yet"   # why the table holds the stubs
cdef void* _primary_ctx[_MAX_DEVICES]          # each device's primary context, once retained

ctypedef int (*_f_device_get)(int* device, int ordinal) noexcept nogil
ctypedef int (*_f_name)(int rc, const char** name) noexcept nogil
cdef _f_device_get _cuDeviceGet = NULL
cdef f_primary _cuDevicePrimaryCtxRetain = NULL
cdef _f_name _cuGetErrorName = NULL


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


# libcuda's functions the table uses: _sym[SYM_...] once _load_driver found them. Those
# from SYM_LAUNCH on may be missing (older drivers): their features are then off.
cdef enum:
    SYM_CTX_GET
    SYM_CTX_SET
    SYM_CTX_DEVICE
    SYM_DEVICE_GET
    SYM_PRIMARY_RETAIN
    SYM_HTOD
    SYM_DTOH
    SYM_DTOD
    SYM_STREAM_SYNC
    SYM_EVENT_RECORD
    SYM_EVENT_SYNC
    SYM_EVENT_QUERY
    SYM_STREAM_WAIT_EVENT
    SYM_POINTER_ATTR
    SYM_ERROR_NAME
    SYM_LAUNCH                    # the first optional one
    SYM_MODULE_LOAD
    SYM_MODULE_FUNCTION
    SYM_POINTER_ATTRS
    SYM_WRITE32
    SYM_WRITE64
    SYM_COUNT

_SYMBOL_NAMES = {
    SYM_CTX_GET: b"cuCtxGetCurrent",
    SYM_CTX_SET: b"cuCtxSetCurrent",
    SYM_CTX_DEVICE: b"cuCtxGetDevice",
    SYM_DEVICE_GET: b"cuDeviceGet",
    SYM_PRIMARY_RETAIN: b"cuDevicePrimaryCtxRetain",
    SYM_HTOD: b"cuMemcpyHtoDAsync_v2",
    SYM_DTOH: b"cuMemcpyDtoHAsync_v2",
    SYM_DTOD: b"cuMemcpyDtoDAsync_v2",
    SYM_STREAM_SYNC: b"cuStreamSynchronize",
    SYM_EVENT_RECORD: b"cuEventRecord",
    SYM_EVENT_SYNC: b"cuEventSynchronize",
    SYM_EVENT_QUERY: b"cuEventQuery",
    SYM_STREAM_WAIT_EVENT: b"cuStreamWaitEvent",
    SYM_POINTER_ATTR: b"cuPointerGetAttribute",
    SYM_ERROR_NAME: b"cuGetErrorName",
    SYM_LAUNCH: b"cuLaunchKernel",
    SYM_MODULE_LOAD: b"cuModuleLoadData",
    SYM_MODULE_FUNCTION: b"cuModuleGetFunction",
    SYM_POINTER_ATTRS: b"cuPointerGetAttributes",
    SYM_WRITE32: b"cuStreamWriteValue32_v2",
    SYM_WRITE64: b"cuStreamWriteValue64_v2",
}
cdef void* _sym[SYM_COUNT]

ctypedef int (*_f_attrs)(unsigned int n, int* attrs, void** data,
                         unsigned long long ptr) noexcept nogil
cdef _f_attrs _cuPointerGetAttributes = NULL


cdef bint _load_driver():
    """Point the table at libcuda's functions; False (the stubs stay, ``_driver_why``
    says why) when libcuda cannot be loaded or lacks a function it needs."""
    global _cuDeviceGet, _cuDevicePrimaryCtxRetain, _cuGetErrorName, _driver_why
    global _cuPointerGetAttributes
    cdef void* lib = dlopen(b"libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    cdef const char* err = NULL
    cdef str why = ""
    cdef bytes name
    cdef int i
    if lib == NULL:
        err = dlerror()          # the first failure's reason, before the next dlopen
        why = err.decode(errors="replace") if err != NULL else "?"
        lib = dlopen(b"libcuda.so", RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        _driver_why = f"dlopen(libcuda.so.1): {why}"
        return False
    for i in range(SYM_COUNT):
        name = _SYMBOL_NAMES[i]
        _sym[i] = dlsym(lib, name)
        if _sym[i] == NULL and i < SYM_LAUNCH:
            _driver_why = f"libcuda has no {name.decode()}"
            return False
    api.ctx_get = <f_ctx_get>_sym[SYM_CTX_GET]
    api.ctx_set = <f_ctx_set>_sym[SYM_CTX_SET]
    api.ctx_device = <f_ctx_device>_sym[SYM_CTX_DEVICE]
    _cuDeviceGet = <_f_device_get>_sym[SYM_DEVICE_GET]
    _cuDevicePrimaryCtxRetain = <f_primary>_sym[SYM_PRIMARY_RETAIN]
    api.primary = _real_primary
    api.htod = <f_htod>_sym[SYM_HTOD]
    api.dtoh = <f_dtoh>_sym[SYM_DTOH]
    api.dtod = <f_dtod>_sym[SYM_DTOD]
    api.stream_sync = <f_handle>_sym[SYM_STREAM_SYNC]
    api.event_record = <f_record>_sym[SYM_EVENT_RECORD]
    api.event_sync = <f_handle>_sym[SYM_EVENT_SYNC]
    api.event_query = <f_handle>_sym[SYM_EVENT_QUERY]
    api.stream_wait_event = <f_wait>_sym[SYM_STREAM_WAIT_EVENT]
    api.pointer_attr = <f_attr>_sym[SYM_POINTER_ATTR]
    _cuGetErrorName = <_f_name>_sym[SYM_ERROR_NAME]
    _cuPointerGetAttributes = <_f_attrs>_sym[SYM_POINTER_ATTRS]
    api.has_launch = _sym[SYM_LAUNCH] != NULL
    api.has_writes = _sym[SYM_WRITE32] != NULL
    api.has_write64 = _sym[SYM_WRITE64] != NULL
    if api.has_launch:
        api.launch = <f_launch>_sym[SYM_LAUNCH]
    if api.has_writes:
        api.write32 = <f_write32>_sym[SYM_WRITE32]
    if api.has_write64:
        api.write64 = <f_write64>_sym[SYM_WRITE64]
    api.driver = True
    _driver_why = ""
    return True


def _driver_calls():
    """'libcuda' when copies call the CUDA driver, else 'unavailable (why)'.

    Loads CuPy first when it is importable (the driver is looked for then)."""
    if _cp is None:
        try:
            _cupy()
        except EtError:
            pass
    return "libcuda" if api.driver else f"unavailable ({_driver_why})"


ctypedef int (*_f_load)(void** module, const void* image) noexcept nogil
ctypedef int (*_f_get)(void** fn, void* module, const char* name) noexcept nogil


cdef void* c_module_function(bytes image, bytes name) except NULL:
    """A kernel of a PTX or cubin ``image`` (cuModuleLoadData + cuModuleGetFunction) in
    the current context; NotSupportedError where libcuda cannot load modules."""
    cdef void* module = NULL
    cdef void* fn = NULL
    if not api.driver or _sym[SYM_MODULE_LOAD] == NULL or _sym[SYM_MODULE_FUNCTION] == NULL \
            or not api.has_launch:
        raise_error(Error.NotSupported, f"loading CUDA kernels needs libcuda "
                                        f"({_driver_why or 'it cannot launch kernels'})")
    c_check((<_f_load>_sym[SYM_MODULE_LOAD])(&module, <const char*>image), "cuModuleLoadData")
    c_check((<_f_get>_sym[SYM_MODULE_FUNCTION])(&fn, module, <const char*>name),
            "cuModuleGetFunction")
    return fn


# ------------------------------------------------------------------ the stubs

# What the table holds where libcuda cannot be used: functions that return NO_DRIVER
# (c_cuda_failed turns it into NotSupportedError saying why), and for the optional
# ones NOT_SUPPORTED. Never NULL: a copy that read the table just before the backend
# changed still calls something that answers.

cdef int _stub_ctx_get(void** ctx) noexcept nogil:
    ctx[0] = NULL
    return NO_DRIVER


cdef int _stub_ctx_set(void* ctx) noexcept nogil:
    return NO_DRIVER


cdef int _stub_ctx_device(int* dev) noexcept nogil:
    return NO_DRIVER


cdef int _stub_primary(void** ctx, int dev) noexcept nogil:
    ctx[0] = NULL
    return NO_DRIVER


cdef int _stub_htod(unsigned long long dst, const void* src, size_t n, void* s) noexcept nogil:
    return NO_DRIVER


cdef int _stub_dtoh(void* dst, unsigned long long src, size_t n, void* s) noexcept nogil:
    return NO_DRIVER


cdef int _stub_dtod(unsigned long long dst, unsigned long long src, size_t n,
                    void* s) noexcept nogil:
    return NO_DRIVER


cdef int _stub_handle(void* h) noexcept nogil:
    return NO_DRIVER


cdef int _stub_record(void* e, void* s) noexcept nogil:
    return NO_DRIVER


cdef int _stub_wait(void* s, void* e, unsigned int flags) noexcept nogil:
    return NO_DRIVER


cdef int _stub_attr(void* out, int attr, unsigned long long ptr) noexcept nogil:
    return NO_DRIVER


cdef int _no_launch(void* fn, unsigned int gx, unsigned int gy, unsigned int gz,
                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                    void* stream, void** params, void** extra) noexcept nogil:
    return NOT_SUPPORTED


cdef int _no_write32(void* s, unsigned long long addr, unsigned int value,
                     unsigned int flags) noexcept nogil:
    return NOT_SUPPORTED


cdef int _no_write64(void* s, unsigned long long addr, unsigned long long value,
                     unsigned int flags) noexcept nogil:
    return NOT_SUPPORTED


cdef void _use_stubs(str why) noexcept:
    """Point every entry of the table at its stub; ``why``: what a failed call says."""
    global _driver_why
    _driver_why = why
    api.ctx_get = _stub_ctx_get
    api.ctx_set = _stub_ctx_set
    api.ctx_device = _stub_ctx_device
    api.primary = _stub_primary
    api.htod = _stub_htod
    api.dtoh = _stub_dtoh
    api.dtod = _stub_dtod
    api.stream_sync = _stub_handle
    api.event_record = _stub_record
    api.event_sync = _stub_handle
    api.event_query = _stub_handle
    api.stream_wait_event = _stub_wait
    api.pointer_attr = _stub_attr
    api.has_launch = api.has_writes = api.has_write64 = False
    api.launch = _no_launch
    api.write32 = _no_write32
    api.write64 = _no_write64
    api.driver = False


_use_stubs("CuPy not loaded yet")


# ------------------------------------------------------------------ errors

cdef str _cu_message(int rc):
    """What failed, for an error message: the driver's name for ``rc``."""
    cdef const char* name = NULL
    if api.driver and _cuGetErrorName != NULL and _cuGetErrorName(rc, &name) == 0 and name != NULL:
        return f"{name.decode('ascii', 'replace')} ({rc})"
    return f"CUDA error {rc}"


cdef int c_cuda_failed(int rc, str what) except -1:
    """Raise for the failed call ``what``: NotSupportedError where the table holds the
    stubs (saying why libcuda is not used), else EtError(Error.Internal)."""
    if rc == NO_DRIVER:
        raise_error(Error.NotSupported,
                    f"{what} failed: CUDA copies need libcuda: {_driver_why}")
    raise EtError(f"{what} failed: {_cu_message(rc)}", Error.Internal)


cdef int c_check(int rc, str what) except -1:
    if rc != 0:
        c_cuda_failed(rc, what)
    return 0


# ------------------------------------------------------------------ devices and contexts

cdef void* _context_of(int dev) except NULL:
    """``dev``'s primary context, retained on first use (which initialises it)."""
    cdef void* ctx = _primary_ctx[dev]
    cdef int rc
    if ctx == NULL:
        rc = api.primary(&ctx, dev)
        if rc != 0 or ctx == NULL:
            c_cuda_failed(rc if rc != 0 else 201, f"making cuda:{dev}'s context")
        _primary_ctx[dev] = ctx
    return ctx


cdef int c_enter_device(int dev, DeviceGuard* guard) except -1:
    """Make ``dev``'s primary context current; ``guard`` records what to restore.

    ``dev`` is a device index checked by :func:`c_resolve_device`. When no context
    was current, none is current again after :func:`c_exit_device`.
    """
    cdef void* ctx
    guard.prev = NULL
    guard.switched = False
    ctx = _context_of(dev)
    c_check(api.ctx_get(&guard.prev), "cuCtxGetCurrent")
    if guard.prev != ctx:
        c_check(api.ctx_set(ctx), f"making cuda:{dev} current")
        guard.switched = True
    return 0


cdef int c_exit_device(DeviceGuard* guard) except -1:
    """Restore the context :func:`c_enter_device` found; nothing in a child forked since
    (a thread that forks mid-copy exits its device there, and makes no CUDA call)."""
    if guard.switched:
        guard.switched = False
        if not _forked_after_init:
            c_check(api.ctx_set(guard.prev), "restoring the caller's CUDA context")
    return 0


cdef int _ndev = -1          # CUDA devices, read once per backend


cdef int c_device_count() except -1:
    global _ndev
    if _ndev < 0:
        rt = c_runtime()
        try:
            n = rt.getDeviceCount()
        except _CudaError as exc:
            raise EtError(f"counting CUDA devices failed: {exc}", Error.Internal) from exc
        _ndev = min(n, _MAX_DEVICES)
    return _ndev


cdef int _current_device() except -1:
    """The CUDA device of the calling thread (that of its current context, else CuPy's)."""
    cdef void* ctx = NULL
    cdef int dev = 0
    if api.ctx_get(&ctx) == 0 and ctx != NULL and api.ctx_device(&dev) == 0:
        return dev
    return c_runtime().getDevice()


cdef int c_resolve_device(object index, str argname) except -2:
    """The one device resolver: ``index`` (an int, -1 = the current device) checked and
    made concrete, 0..device count-1. The caller has checked :func:`c_check_usable`."""
    cdef int n
    cdef int i
    if type(index) is int and 0 <= <object>index < _ndev:
        return <int>index
    i = <int>c_int_arg(index, argname, -1, 127)
    if i == -1:
        c_runtime()
        return _current_device()
    n = c_device_count()
    if i >= n:
        raise_error(Error.InvalidArgument, f"{argname}={i}: there are {n} CUDA device(s)")
    return i


def _resolve_device(index, argname="device"):
    """:func:`c_resolve_device` for Python callers (checks fork state first)."""
    c_check_usable("CUDA")
    return c_resolve_device(index, argname)


# ------------------------------------------------------------------ pointers

cdef int c_pointer_attr(void* out, int attr, uintptr_t address) noexcept nogil:
    """cuPointerGetAttribute, for callers to whom a failure is an answer (memory CUDA
    does not know): its return code."""
    return api.pointer_attr(out, attr, address)


cdef int _quiet_attr(void* out, int attr, uintptr_t address) noexcept nogil:
    """One pointer attribute, for callers to whom "memory CUDA does not know" is an
    answer: through cuPointerGetAttributes where libcuda has it (which answers for such
    memory with a zero value, not by its slower error path), else :func:`c_pointer_attr`."""
    cdef int attrs[1]
    cdef void* data[1]
    if api.driver and _cuPointerGetAttributes != NULL:
        attrs[0] = attr
        data[0] = out
        return _cuPointerGetAttributes(1, attrs, data, address)
    return c_pointer_attr(out, attr, address)


cdef bint c_is_page_locked(uintptr_t address) except -1:
    cdef unsigned int kind = 0
    if _quiet_attr(&kind, ATTR_MEMORY_TYPE, address) != 0:
        return False              # memory CUDA does not know: pageable
    return kind == MEMORY_TYPE_HOST


cdef uintptr_t c_range_start(uintptr_t address) except? 0:
    """Start of the allocation holding ``address``, or 0 when the driver cannot say."""
    cdef unsigned long long start = 0
    if _quiet_attr(&start, ATTR_RANGE_START, address) != 0:
        return 0
    return <uintptr_t>start


cdef int c_check_device_range(uintptr_t address, int64_t nbytes, str argname) except -1:
    """Refuse a copy that would run past the end of the device allocation holding
    ``address`` (asked of the driver, in one call where it can), before any byte is read
    or written. Returns 1 when the driver described the allocation in that one call and
    it is not managed memory (a stream memory operation may write it), else 0."""
    cdef unsigned long long start = 0, size = 0, managed = 0
    cdef int attrs[3]
    cdef void* data[3]
    if api.driver and _cuPointerGetAttributes != NULL:
        attrs[0] = ATTR_RANGE_START
        attrs[1] = ATTR_RANGE_SIZE
        attrs[2] = ATTR_IS_MANAGED
        data[0] = &start
        data[1] = &size
        data[2] = &managed
        if _cuPointerGetAttributes(3, attrs, data, address) != 0 or size == 0:
            return 0          # not an allocation the driver can describe: leave it to CUDA
    else:
        if c_pointer_attr(&start, ATTR_RANGE_START, address) != 0:
            return 0
        if c_pointer_attr(&size, ATTR_RANGE_SIZE, address) != 0 or size == 0:
            return 0
        managed = 1           # not asked: no stream memory operations
    if address < start or <uint64_t>nbytes > size - (address - start):
        raise_error(Error.InvalidArgument,
                    f"nbytes={nbytes}: {argname}={address:#x} is {address - start} bytes into a "
                    f"device allocation of {size} bytes, so the copy would run past its end")
    return 1 if managed == 0 else 0


def pointer_device(ptr):
    """``(kind, device)`` of address ``ptr``: kind 'host' (page-locked host memory),
    'device' or 'managed' with the owning device index; InvalidArgumentError for
    memory CUDA does not know. For etptr.from_cuda_array_interface."""
    c_check_usable("finding the device of a pointer")
    rt = c_runtime()
    try:
        attrs = rt.pointerGetAttributes(ptr)
    except Exception as exc:
        raise_error(Error.InvalidArgument,
                    f"data=0x{ptr:x}: the CUDA runtime does not know this pointer ({exc})")
    kind = int(attrs.type)
    if kind == 1:
        return "host", -1
    if kind == 2 or kind == 3:
        return ("device" if kind == 2 else "managed"), int(attrs.device)
    raise_error(Error.InvalidArgument,
                f"data=0x{ptr:x} is not CUDA memory (cudaPointerGetAttributes type {kind})")


def current_device():
    """The calling thread's current CUDA device index."""
    c_check_usable("CUDA")
    c_runtime()
    return _current_device()


def synchronize_stream(stream):
    """Wait for the work queued on ``stream`` (a handle or stream object)."""
    c_check_usable("waiting for a CUDA stream")
    cdef intptr_t h = c_stream_handle(stream)
    cdef int rc
    c_runtime()
    with nogil:
        rc = api.stream_sync(<void*>h)
    c_check(rc, f"synchronizing stream {h:#x}")


cdef dict _zero_size = {}      # device -> a small allocation kept for the process's life


def zero_size_address(dev):
    """A valid device address on ``dev`` for exports of zero-size tensors (never read)."""
    cdef DeviceGuard guard
    found = _zero_size.get(dev)
    if found is not None:
        return found.ptr
    c_check_usable("CUDA")
    d = c_resolve_device(dev, "device")
    rt = c_runtime()
    c_enter_device(d, &guard)
    try:
        mem = _cp.cuda.memory.alloc(256)
    finally:
        c_exit_device(&guard)
    _zero_size.setdefault(d, mem)
    return _zero_size[d].ptr


# ------------------------------------------------------------------ streams and events

_MAX_HANDLE = (1 << 63) - 1


cdef object _handle_from_index(object obj, object stream, str what):
    """``obj.__index__()`` as a stream handle: an int that is not a bool, else
    InvalidTypeError naming ``stream``."""
    h = obj.__index__()
    if isinstance(h, bool) or not isinstance(h, int):
        raise_error(Error.InvalidType, f"stream={stream!r:.80}: {what} returned "
                                       f"{h!r:.40} of type {type(h).__name__}, not an int handle")
    return h


cdef intptr_t c_stream_handle(object stream) except? -1:
    """A raw cudaStream_t from an int, a ``__cuda_stream__`` object, or ``.ptr``/``.cuda_stream``."""
    h = None
    if type(stream) in _stream_types:   # CuPy's own classes (not subclasses): at once
        h = stream.ptr
        if isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= _MAX_HANDLE:
            return h
        h = None
    if isinstance(stream, bool):
        h = None
    elif hasattr(stream, "__index__"):
        h = _handle_from_index(stream, stream, "its __index__()")
    else:
        proto = getattr(stream, "__cuda_stream__", None)
        if proto is not None:
            pair = proto()
            if isinstance(pair, tuple) and len(pair) == 2 and hasattr(pair[1], "__index__") \
                    and not isinstance(pair[1], bool):
                h = _handle_from_index(pair[1], stream,
                                       "the __index__() of __cuda_stream__()'s handle")
            else:
                raise_error(Error.InvalidType,
                            f"stream={stream!r:.80}: __cuda_stream__() returned {pair!r:.80}, not "
                            f"(version, handle)")
        else:
            for attr in ("ptr", "cuda_stream"):
                v = getattr(stream, attr, None)
                if isinstance(v, int) and not isinstance(v, bool):
                    h = v
                    break
    if h is None:
        raise_error(Error.InvalidType,
                    f"stream={stream!r:.80}: expected a CUDA stream (an int handle, an object with "
                    f"__cuda_stream__, or a CuPy/PyTorch stream)")
    if not 0 <= h <= _MAX_HANDLE:
        raise_error(Error.InvalidArgument, f"stream={h}: not a stream handle (a pointer, >= 0)")
    return h


cdef intptr_t c_current_stream() except? -1:
    """CuPy's current stream on the current device (0: the legacy default stream)."""
    return _cp.cuda.get_current_stream().ptr


cdef intptr_t c_event_create() except? 0:
    """A timing-free CUDA event on the current device."""
    try:
        return _rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
    except _CudaError as exc:
        raise EtError(f"creating a CUDA event failed: {exc}", Error.Internal) from exc


cdef int c_event_destroy(intptr_t event) except -1:
    try:
        _rt.eventDestroy(event)
    except _CudaError as exc:
        raise EtError(f"destroying a CUDA event failed: {exc}", Error.Internal) from exc
    return 0


cdef intptr_t c_stream_create() except? 0:
    """A blocking CUDA stream on the current device (ordered after the legacy default stream)."""
    try:
        return _rt.streamCreateWithFlags(0)
    except _CudaError as exc:
        raise EtError(f"creating a CUDA stream failed: {exc}", Error.Internal) from exc


cdef int c_stream_destroy(intptr_t stream) except -1:
    try:
        _rt.streamDestroy(stream)
    except _CudaError as exc:
        raise EtError(f"destroying a CUDA stream failed: {exc}", Error.Internal) from exc
    return 0


# ------------------------------------------------------------------ page-locked memory

cdef uintptr_t c_host_alloc(int64_t nbytes) except? 0:
    """``nbytes`` of page-locked host memory (cudaHostAlloc, portable) under the current
    context; MemoryAllocationError when CUDA cannot pin it."""
    try:
        return _rt.hostAlloc(nbytes, _HOST_ALLOC_PORTABLE)
    except _CudaError as exc:
        raise_error(Error.MemoryAllocationFailed,
                    f"could not pin {nbytes} bytes of host memory: {exc}")


cdef int c_host_free(uintptr_t ptr) except -1:
    try:
        _rt.freeHost(ptr)
    except _CudaError as exc:
        raise EtError(f"freeing a page-locked block at {ptr:#x} failed: {exc}",
                      Error.Internal) from exc
    return 0


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
    """os.register_at_fork(after_in_child=...): see "Fork" above."""
    global _forked_after_init
    if not _cuda_initialised or _forked_after_init:
        return
    _forked_after_init = True
    for callback in _fork_callbacks:
        callback()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
