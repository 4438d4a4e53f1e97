"""A host-memory stand-in for the slice of CuPy that etptr's CUDA code calls.

It lets the copy engine, the pinned pool and CudaAllocator run on machines
without a GPU: "device" memory and page-locked memory are ordinary host
buffers, copies happen at once, streams and events are bookkeeping. It also
models what the real runtime does that tests care about: a CUDA call made
while no context is current creates one (on device 0 here), ``setDevice`` creates
one on the device it names, allocations past a device's capacity fail, and
failures can be injected (``fail_memcpy_after``, ``fail_host_alloc``). The
driver starts uninitialised (``state.initialised``): runtime calls initialise
it, and until then driver calls raise CUDA_ERROR_NOT_INITIALIZED.

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
    """Address -> (ctypes buffer, size), for one kind of memory; addresses aligned."""

    def __init__(self, alignment):
        self.blocks = {}
        self.alignment = alignment

    def new(self, size):
        buf = ctypes.create_string_buffer(max(size, 1) + self.alignment)
        addr = -(-ctypes.addressof(buf) // self.alignment) * self.alignment
        self.blocks[addr] = (buf, max(size, 1))
        return addr

    def size(self, base):
        return self.blocks[base][1]

    def owner(self, addr):
        # list(): a snapshot, as other threads may add or remove blocks meanwhile
        for base, (_, size) in list(self.blocks.items()):
            if base <= addr < base + size:
                return base
        return None


def make(ndev=2, device_bytes=1 << 30):
    """A fresh fake ``cupy`` module with ``ndev`` devices of ``device_bytes`` each."""
    state = types.SimpleNamespace(
        tls=threading.local(), contexts=set(), host=_Buffers(4096), dev=_Buffers(512),
        used=[0] * ndev, calls=[], fail_memcpy_after=None, fail_host_alloc=0,
        streams=set(), events={}, next_handle=[0x1000], lock=threading.RLock(),
        initialised=False)

    def _handle():
        with state.lock:
            state.next_handle[0] += 16
            return state.next_handle[0]

    def _current():
        return getattr(state.tls, "ctx", None)

    def _need_context():
        state.initialised = True
        # A call that needs a context while none is current gets one from the runtime;
        # modelled pessimistically as device 0's, whatever cudaSetDevice said before
        # (code that names a device must make it current itself).
        if _current() is None:
            state.contexts.add(0)
            state.tls.ctx = 0
        return state.tls.ctx

    rt = types.SimpleNamespace()
    rt.CUDARuntimeError = CUDARuntimeError
    rt.PointerAttributes = PointerAttributes
    rt.hostAllocPortable = 1
    rt.memcpyHostToDevice = 1
    rt.memcpyDeviceToHost = 2
    rt.eventDisableTiming = 2
    rt.memoryTypeHost = 1

    def getDeviceCount():
        state.initialised = True
        return ndev

    def getDevice():
        state.initialised = True
        c = _current()
        return c if c is not None else getattr(state.tls, "dev", 0)

    def setDevice(d):
        state.initialised = True
        if not 0 <= d < ndev:
            raise CUDARuntimeError(101, f"invalid device {d}")
        state.tls.dev = d
        state.contexts.add(d)       # CUDA 12+: cudaSetDevice initialises the primary context
        state.tls.ctx = d

    def hostAlloc(size, flags):
        _need_context()
        if state.fail_host_alloc:
            state.fail_host_alloc -= 1
            raise CUDARuntimeError(2, "out of memory (host)")
        state.calls.append(("hostAlloc", size))
        return state.host.new(size)

    def freeHost(ptr):
        _need_context()
        if state.host.blocks.pop(ptr, None) is None:
            raise CUDARuntimeError(1, f"freeHost of unknown {ptr:#x}")
        state.calls.append(("freeHost", ptr))

    def _check_copy(kind, dst, src, n):
        if state.fail_memcpy_after is not None:
            if state.fail_memcpy_after <= 0:
                raise CUDARuntimeError(700, "injected copy failure")
            state.fail_memcpy_after -= 1
        dev_side = dst if kind == 1 else src
        base = state.dev.owner(dev_side)
        if base is None or dev_side + n > base + state.dev.size(base):
            raise CUDARuntimeError(1, f"{'dst' if kind == 1 else 'src'}={dev_side:#x}: not device memory")

    def memcpyAsync(dst, src, n, kind, stream):
        dev = _need_context()
        _check_copy(kind, dst, src, n)
        pinned = state.host.owner(src if kind == 1 else dst) is not None
        state.calls.append(("memcpyAsync", kind, n, stream, pinned, dev, dst, src))
        ctypes.memmove(dst, src, n)

    def memcpy(dst, src, n, kind):
        memcpyAsync(dst, src, n, kind, 0)

    def streamCreateWithFlags(flags):
        h = _handle()
        ctx = _need_context()
        with state.lock:
            state.streams.add((h, ctx))
        return h

    def streamDestroy(h):
        with state.lock:
            state.streams = {s for s in state.streams if s[0] != h}

    def streamSynchronize(h):
        _need_context()
        state.calls.append(("streamSynchronize", h))

    def streamWaitEvent(stream, event, flags=0):
        state.calls.append(("streamWaitEvent", stream, event))

    def eventCreateWithFlags(flags):
        h = _handle()
        state.events[h] = _need_context()
        return h

    def eventDestroy(h):
        state.events.pop(h)

    def eventRecord(h, stream):
        if state.events.get(h) != _need_context():
            raise CUDARuntimeError(400, "event recorded on another device's stream")

    def eventQuery(h):
        return 0

    def eventSynchronize(h):
        if h not in state.events:
            raise CUDARuntimeError(400, "unknown event")

    def pointerGetRange(ptr):
        # not in CuPy: the driver's CU_POINTER_ATTRIBUTE_RANGE_START_ADDR / _SIZE, which
        # etptr's shims ask a stand-in for this way
        for mem in (state.dev, state.host):
            base = mem.owner(ptr)
            if base is not None:
                return base, mem.size(base)
        raise CUDARuntimeError(1, f"{ptr:#x}: not memory CUDA knows")

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
              pointerGetAttributes, pointerGetRange):
        setattr(rt, f.__name__, f)

    drv = types.SimpleNamespace()

    def ctxGetCurrent():
        if not state.initialised:
            raise CUDADriverError(3, "CUDA_ERROR_NOT_INITIALIZED")
        c = _current()
        return 0 if c is None else 0x100 + c

    def ctxSetCurrent(ctx):
        if not state.initialised:
            raise CUDADriverError(3, "CUDA_ERROR_NOT_INITIALIZED")
        state.tls.ctx = None if ctx == 0 else ctx - 0x100

    drv.CUDADriverError = CUDADriverError
    drv.ctxGetCurrent = ctxGetCurrent
    drv.ctxSetCurrent = ctxSetCurrent

    class MemoryPointer:
        def __init__(self, ptr, size, device):
            self.ptr = ptr
            self.size = size
            self.device_id = device

        def __del__(self):
            state.dev.blocks.pop(self.ptr, None)
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
