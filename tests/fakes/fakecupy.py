"""A host-memory stand-in for the slice of CuPy's Python API that etptr's CUDA code calls.

It runs over tests/fakes/fakecuda.c, the stand-in for libcuda (tests/fakes/_fake_libcuda.py builds
and loads it, and its ``Fake.make_cupy`` makes one of these), as CuPy's runtime runs
over the real driver: contexts, streams, events and copies are the fake driver's, and
etptr's own driver calls reach the same one. What is CuPy's here is its Python-level
part: the memory pool ("device" memory is ordinary host memory, registered with the
fake driver as device memory; allocations past a device's capacity fail), page-locked
host allocations (registered as such), stream objects and the device count. It also
models what the real runtime does that tests care about: a runtime call made while no
context is current initialises the driver and makes one current (on device 0 here),
and ``setDevice`` makes the primary context of the device it names current. Failures
of page-locked allocations can be injected (``state.fail_host_alloc``).

Use :func:`make` for a fresh instance and hand it to
``etptr.cuda._driver._use_backend``.
"""
import ctypes
import threading
import types


class CUDARuntimeError(RuntimeError):
    def __init__(self, status, what=""):
        self.status = status
        super().__init__(f"cudaError {status}: {what}")


class CUDADriverError(RuntimeError):
    def __init__(self, status, what=""):
        self.status = status
        super().__init__(f"CUresult {status}: {what}")


class OutOfMemoryError(MemoryError):
    pass


class PointerAttributes:
    def __init__(self, device, devicePointer, hostPointer, type=-1):
        self.device = device
        self.devicePointer = devicePointer
        self.hostPointer = hostPointer
        self.type = type


class _Buffers:
    """Address -> (ctypes buffer, size), for one kind of memory (``kind``: the fake
    driver's memory type, 1 page-locked host, 2 device), each block registered with the
    driver while it is here; addresses aligned."""

    def __init__(self, driver, kind, alignment):
        self.driver = driver
        self.kind = kind
        self.blocks = {}
        self.alignment = alignment

    def new(self, size):
        buf = ctypes.create_string_buffer(max(size, 1) + self.alignment)
        addr = -(-ctypes.addressof(buf) // self.alignment) * self.alignment
        self.add(addr, buf, max(size, 1))
        return addr

    def add(self, addr, buf, size):
        """Make ``size`` bytes at ``addr`` (in ``buf``, kept alive here) one block."""
        self.blocks[addr] = (buf, size)
        self.driver.fake_register(addr, size, self.kind, 0)

    def pop(self, addr):
        """Forget the block at ``addr``; False when there is none."""
        block = self.blocks.pop(addr, None)
        if block is None:
            return False
        self.driver.fake_unregister(addr)
        del block          # its memory goes once the driver has forgotten it, not before
        return True

    def size(self, base):
        return self.blocks[base][1]

    def __del__(self):
        # the fake itself is going: its memory with it, so the driver must not know it
        for addr in list(self.blocks):
            self.driver.fake_unregister(addr)

    def owner(self, addr):
        # list(): a snapshot, as other threads may add or remove blocks meanwhile
        for base, (_, size) in list(self.blocks.items()):
            if base <= addr < base + size:
                return base
        return None


class _State:
    """What a test may look at or change: memory, device usage, injected failures."""

    def __init__(self, driver, ndev):
        self.driver = driver
        self.tls = threading.local()     # the device setDevice named, per thread
        self.host = _Buffers(driver, 1, 4096)
        self.dev = _Buffers(driver, 2, 512)
        self.used = [0] * ndev
        self.fail_host_alloc = 0         # page-locked allocations that fail from now on
        self.lock = threading.RLock()

    @property
    def contexts(self):
        """The devices whose primary context was made since this fake was made."""
        mask = ctypes.c_ulonglong.in_dll(self.driver, "fake_contexts").value
        return {d for d in range(64) if mask >> d & 1}

    @property
    def initialised(self):
        """Whether the driver was initialised (cuInit, by a runtime call)."""
        return bool(ctypes.c_int.in_dll(self.driver, "fake_initialised").value)


def make(driver, ndev=2, device_bytes=1 << 30):
    """A fresh fake ``cupy`` module with ``ndev`` devices of ``device_bytes`` each, over
    ``driver`` (tests/fakes/fakecuda.c loaded by ctypes, its prototypes set: see
    tests/fakes/_fake_libcuda.py). No context is current or made afterwards until one is used."""
    lib = driver
    ctypes.c_int.in_dll(lib, "fake_devices").value = ndev
    lib.fake_reset_contexts()
    state = _State(lib, ndev)

    def _driver_call(rc, what, error=CUDARuntimeError):
        if rc != 0:
            raise error(rc, what)

    def _init():
        _driver_call(lib.cuInit(0), "cuInit")

    def _current():
        """The device of the calling thread's current context, or None."""
        ctx = ctypes.c_void_p()
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
            return None
        dev = ctypes.c_int()
        _driver_call(lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
        return dev.value

    def _make_current(d):
        ctx = ctypes.c_void_p()
        _driver_call(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), f"device {d}")
        _driver_call(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _need_context():
        _init()
        # A call that needs a context while none is current gets one from the runtime;
        # modelled pessimistically as device 0's, whatever cudaSetDevice said before
        # (code that names a device must make it current itself).
        d = _current()
        if d is None:
            _make_current(0)
            d = 0
        return d

    rt = types.SimpleNamespace()
    rt.CUDARuntimeError = CUDARuntimeError
    rt.PointerAttributes = PointerAttributes
    rt.hostAllocPortable = 1
    rt.memcpyHostToDevice = 1
    rt.memcpyDeviceToHost = 2
    rt.eventDisableTiming = 2
    rt.memoryTypeHost = 1

    def getDeviceCount():
        _init()
        return ndev

    def getDevice():
        _init()
        c = _current()
        return c if c is not None else getattr(state.tls, "dev", 0)

    def setDevice(d):
        _init()
        if not 0 <= d < ndev:
            raise CUDARuntimeError(101, f"invalid device {d}")
        state.tls.dev = d
        _make_current(d)     # CUDA 12+: cudaSetDevice initialises the primary context

    def hostAlloc(size, flags):
        _need_context()
        if state.fail_host_alloc:
            state.fail_host_alloc -= 1
            raise CUDARuntimeError(2, "out of memory (host)")
        return state.host.new(size)

    def freeHost(ptr):
        _need_context()
        if not state.host.pop(ptr):
            raise CUDARuntimeError(1, f"freeHost of unknown {ptr:#x}")

    def memcpyAsync(dst, src, n, kind, stream):
        _need_context()
        if kind == 1:
            rc = lib.cuMemcpyHtoDAsync_v2(dst, src, n, stream)
        elif kind == 2:
            rc = lib.cuMemcpyDtoHAsync_v2(dst, src, n, stream)
        else:
            rc = lib.cuMemcpyDtoDAsync_v2(dst, src, n, stream)
        _driver_call(rc, f"memcpyAsync kind {kind}")

    def memcpy(dst, src, n, kind):
        memcpyAsync(dst, src, n, kind, 0)
        streamSynchronize(0)

    def streamCreateWithFlags(flags):
        _need_context()
        h = ctypes.c_void_p()
        _driver_call(lib.cuStreamCreate(ctypes.byref(h), flags), "cuStreamCreate")
        return h.value

    def streamDestroy(h):
        _driver_call(lib.cuStreamDestroy_v2(h), "cuStreamDestroy")

    def streamSynchronize(h):
        _init()
        _driver_call(lib.cuStreamSynchronize(h), "cuStreamSynchronize")

    def streamWaitEvent(stream, event, flags=0):
        _driver_call(lib.cuStreamWaitEvent(stream, event, flags), "cuStreamWaitEvent")

    def eventCreateWithFlags(flags):
        _need_context()
        h = ctypes.c_void_p()
        _driver_call(lib.cuEventCreate(ctypes.byref(h), flags), "cuEventCreate")
        return h.value

    def eventDestroy(h):
        _driver_call(lib.cuEventDestroy_v2(h), "cuEventDestroy")

    def eventRecord(h, stream):
        _need_context()
        _driver_call(lib.cuEventRecord(h, stream), "event recorded on another device's stream")

    def eventQuery(h):
        rc = lib.cuEventQuery(h)
        if rc not in (0, 600):
            _driver_call(rc, "cuEventQuery")
        return rc

    def eventSynchronize(h):
        _driver_call(lib.cuEventSynchronize(h), "cuEventSynchronize")

    def pointerGetAttributes(ptr):
        _need_context()
        if state.host.owner(ptr) is not None:
            return PointerAttributes(-1, ptr, ptr, 1)
        if state.dev.owner(ptr) is not None:
            return PointerAttributes(0, ptr, 0, 2)
        return PointerAttributes(-2, 0, 0, 0)

    for f in (getDeviceCount, getDevice, setDevice, hostAlloc, freeHost, memcpyAsync, memcpy,
              streamCreateWithFlags, streamDestroy, streamSynchronize, streamWaitEvent,
              eventCreateWithFlags, eventDestroy, eventRecord, eventQuery, eventSynchronize,
              pointerGetAttributes):
        setattr(rt, f.__name__, f)

    drv = types.SimpleNamespace()

    def ctxGetCurrent():
        ctx = ctypes.c_void_p()
        _driver_call(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent", CUDADriverError)
        return ctx.value or 0

    def ctxSetCurrent(ctx):
        _driver_call(lib.cuCtxSetCurrent(ctx or None), "cuCtxSetCurrent", CUDADriverError)

    drv.CUDADriverError = CUDADriverError
    drv.ctxGetCurrent = ctxGetCurrent
    drv.ctxSetCurrent = ctxSetCurrent

    class MemoryPointer:
        def __init__(self, ptr, size, device):
            self.ptr = ptr
            self.size = size
            self.device_id = device

        def __del__(self):
            state.dev.pop(self.ptr)
            with state.lock:
                state.used[self.device_id] -= self.size

    def alloc(size):
        d = _need_context()
        rounded = (size + 511) // 512 * 512
        with state.lock:           # threads allocate at once: check and count under the lock
            if state.used[d] + rounded > device_bytes:
                raise OutOfMemoryError(f"out of memory allocating {size} bytes on device {d}")
            state.used[d] += rounded
        try:
            ptr = state.dev.new(rounded)
        except BaseException:
            with state.lock:
                state.used[d] -= rounded
            raise
        return MemoryPointer(ptr, rounded, d)

    memory = types.SimpleNamespace(alloc=alloc, OutOfMemoryError=OutOfMemoryError,
                                   MemoryPointer=MemoryPointer)

    class Stream:
        def __init__(self, ptr=0):
            self.ptr = ptr

        @classmethod
        def from_external(cls, obj):
            return cls(obj.__cuda_stream__()[1])

        def synchronize(self):
            streamSynchronize(self.ptr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def get_current_stream(device_id=-1):
        return Stream(0)

    class Pool:
        def used_bytes(self):
            return state.used[getDevice()]

    pool = Pool()
    cuda = types.SimpleNamespace(runtime=rt, driver=drv, memory=memory, Stream=Stream,
                                 get_current_stream=get_current_stream)
    mod = types.ModuleType("fakecupy")
    mod.cuda = cuda
    mod.get_default_memory_pool = lambda: pool
    mod.state = state
    mod.is_fake = True
    return mod
