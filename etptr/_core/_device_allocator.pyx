"""Device allocators and their process-wide, typed registry.

Mirrors ExecuTorch ``runtime/core/device_allocator.h``: one
:class:`DeviceAllocator` per :class:`DeviceType`, registered once, looked up
by tensors that live on (or are cloned to) that device type.

The rest of etptr reaches an allocator through its C-level methods
(``c_allocate``, ``c_copy_h2d``, ...). For an allocator written in Python they
call its Python methods and check what comes back (an address that is not an
address is refused, and never freed); the compiled CUDA allocator overrides
them with direct calls into the copy engine.

Beyond ExecuTorch's interface an allocator has capabilities with generic
defaults built on it, which an allocator may override with a faster path:
batched copies (``c_copy_h2d_batch`` / ``c_copy_d2h_batch``: one copy each
by default), page-locked landing memory (``allocate_host``: none by default)
and :meth:`DeviceAllocator.copy_file_to_device`, which uploads byte ranges of
an open file (the checkpoint loader's one device path): by default the copy
threads read the ranges into a host staging buffer and the batched copy takes
them up from there.
"""
cimport cython
from libc.stdint cimport INT64_MAX, int64_t, uintptr_t
from libc.stdlib cimport free, malloc

import os

import inspect
import threading
import weakref

from etptr._core._codes cimport (
    DEFAULT_ALIGNMENT_BYTES, DEVICE_ALIGNMENT_BYTES, DEVICE_CPU, DEVICE_CUDA)
from etptr._core._args cimport c_count_arg, c_int_arg, c_result_int, c_type_name
from etptr._core._device cimport Device, c_device
from etptr._core._error cimport raise_error
from etptr._core._host_copy cimport FILL_PIECES, Segment, c_cpu_count, c_par_copy_list

from etptr._core._device import DeviceType
from etptr._core._error import Error

DEFAULT_ALIGNMENT = DEFAULT_ALIGNMENT_BYTES  # bytes, ExecuTorch's kDefaultAlignment
#: Bytes where etptr starts the device tensors it lays out (cudaMalloc's guarantee).
DEVICE_ALIGNMENT = DEVICE_ALIGNMENT_BYTES

_DEVICE_TYPES = tuple(DeviceType)

# type(allocator) -> {(method, keyword): accepted}; weak, so that allocator classes can go
cdef object _kw_support = weakref.WeakKeyDictionary()


cdef bint _takes_keyword(object alloc, str method, str keyword) except -1:
    """Whether ``type(alloc).method`` accepts ``keyword`` (or ``**kwargs``); cached per type."""
    cls = type(alloc)
    per_type = _kw_support.get(cls)
    if per_type is None:
        per_type = {}
        try:
            _kw_support[cls] = per_type
        except TypeError:         # a type that cannot be weakly referenced: do not cache
            pass
    key = (method, keyword)
    found = per_type.get(key)
    if found is None:
        try:
            params = inspect.signature(getattr(cls, method)).parameters
            found = keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError, AttributeError):
            found = False
        per_type[key] = found
    return found


cdef uintptr_t _address(object ptr, object alloc, int64_t nbytes) except? 0:
    """What ``alloc.allocate`` returned, checked to be an address (0 only for 0 bytes).
    Something else is refused and never handed to ``deallocate``: it was not allocated."""
    cdef str what = f"{c_type_name(alloc)}.allocate"
    cdef int64_t a = c_result_int(ptr, what, "an int address", ", not an address", 0, INT64_MAX)
    if a == 0 and nbytes > 0:
        raise_error(Error.MemoryAllocationFailed,
                    f"{what} returned a null address for {nbytes} bytes")
    return <uintptr_t>a


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
        alignment : int, power of two, bytes; the address returned must be a
            multiple of it (etptr gives one that is not back to
            :meth:`deallocate` and raises MemoryAllocationError)

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
        least ``nbytes`` bytes and owns the memory; etptr holds the object
        (and its buffer export) for as long as the tensor over it lives.
        ``None`` (the default) makes etptr use ordinary pageable memory.
        """
        return None

    def copy_file_to_device(self, dst, fd, pieces, index, *, progress=None, on_queued=None,
                            gaps=True, direct_fd=-1):
        """Copy byte ranges of an open file into device memory (the checkpoint loader's
        upload: :func:`etptr.load_safetensors` moves every file's tensors this way).

        The generic default, for every allocator: the copy threads read the pieces
        (``pread``, in groups of up to 64 MiB) into a host staging buffer, and the
        allocator's batched host -> device copy takes each group up; nothing of the
        file is mapped, so a file truncated meanwhile gives an error, never SIGBUS.
        An allocator may override it with a faster path (the CUDA allocator reads
        straight into its pinned slots while the previous slot's DMA runs).

        Parameters
        ----------
        dst : int, device address the offsets count from
        fd : int, a file descriptor open for reading
        pieces : sequence of (file_offset, dst_offset, nbytes[, direct]), ints in bytes;
            ``dst_offset`` increasing and pieces not overlapping on the device side;
            pieces of 0 bytes are skipped; a piece marked ``direct`` is read through
            ``direct_fd``
        direct_fd : int, optional
            The same file opened with ``O_DIRECT``, for the pieces marked direct (the
            copy threads read them in aligned blocks through their bounce buffers: the
            page cache is neither read nor filled); required when a piece is marked.
        gaps : bool, default True
            True: the device bytes between pieces are the caller's, and may be
            overwritten with unspecified values (an override may move the range from
            the first piece to the end of the last as one). False: only the pieces'
            bytes are written, and the pieces may lie in separate allocations (a load
            into existing tensors). The generic default writes only the pieces either way.
        index : int, device index (-1 = current device)
        progress : callable, optional
            Called as ``progress(done_bytes)`` (bytes of the pieces copied so far) from
            inside the copy, as it advances; an exception it raises ends the copy and
            propagates.
        on_queued : callable, optional
            Called with no arguments once the whole file has been read (an override may
            call it while the last device copies still run). The copy is complete on
            return, also when it raised; its exception propagates.

        Raises
        ------
        InvalidArgumentError
            A negative value, a piece that is not a 3-tuple, pieces out of order or
            overlapping, a null ``dst`` with pieces, a callable argument that is not
            callable; nothing has moved.
        InvalidTypeError
            A value that is not an integer.
        OSError
            A read failed; ``EOFError``: the file ended before a piece did (it was
            truncated). The device range may then hold part of the data.
        """
        cdef FilePieces fp = c_file_pieces(pieces, dst, progress, on_queued)
        cdef int f = <int>c_int_arg(fd, "fd", 0, 1 << 30)
        cdef int df = c_direct_fd(direct_fd, fp)
        cdef int dev = self.c_resolve_index(<int>c_int_arg(index, "index", -1, 127))
        _copy_file_generic(self, <uintptr_t>c_count_arg(dst, "dst"), f, df, fp, dev, progress)
        if on_queued is not None:
            on_queued()

    # -------------------------------------------------------------- C level
    cdef uintptr_t c_allocate(self, int64_t nbytes, int index, int64_t alignment,
                              object stream) except? 0:
        """``allocate(nbytes, index, alignment[, stream=])``, its result checked: an address
        that is no multiple of ``alignment`` is given back to ``deallocate`` and refused."""
        cdef uintptr_t a
        if stream is not None and _takes_keyword(self, "allocate", "stream"):
            ptr = self.allocate(nbytes, index, alignment, stream=stream)
        else:
            ptr = self.allocate(nbytes, index, alignment)
        a = _address(ptr, self, nbytes)
        if alignment > 1 and a % <uintptr_t>alignment:
            msg = (f"{c_type_name(self)}.allocate returned {a:#x} for {nbytes} bytes, no "
                   f"multiple of the alignment={alignment} asked for")
            try:
                self.deallocate(a, index)
            except Exception as exc:        # (chained as the context of the error below)
                raise_error(Error.MemoryAllocationFailed,
                            f"{msg}; giving it back to deallocate raised {exc!r:.200}")
            raise_error(Error.MemoryAllocationFailed, msg)
        return a

    cdef int c_deallocate(self, uintptr_t ptr, int index) except -1:
        self.deallocate(ptr, index)
        return 0

    cdef int c_copy_h2d(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1:
        if stream is not None and _takes_keyword(self, "copy_host_to_device", "stream"):
            self.copy_host_to_device(dst, src, nbytes, index, stream=stream)
        else:
            self.copy_host_to_device(dst, src, nbytes, index)
        return 0

    cdef int c_copy_d2h(self, uintptr_t dst, uintptr_t src, int64_t nbytes, int index,
                        object stream) except -1:
        if stream is not None and _takes_keyword(self, "copy_device_to_host", "stream"):
            self.copy_device_to_host(dst, src, nbytes, index, stream=stream)
        else:
            self.copy_device_to_host(dst, src, nbytes, index)
        return 0

    cdef int c_copy_h2d_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1:
        """``count`` host -> device copies (the base: one ``copy_host_to_device`` each).
        ``facts``: what the caller knows of the pieces (the BATCH_ flags); with
        BATCH_PADDED the bytes between the destinations are the caller's padding, which a
        copy may overwrite (a batched clone's fresh allocation); else they are kept."""
        cdef int64_t i
        for i in range(count):
            self.c_copy_h2d(dst[i], src[i], n[i], index, stream)
        return 0

    cdef int c_copy_d2h_batch(self, const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                              int64_t count, int index, object stream, int facts) except -1:
        """``count`` device -> host copies (the base: one ``copy_device_to_host`` each);
        ``facts`` as for :meth:`c_copy_h2d_batch`."""
        cdef int64_t i
        for i in range(count):
            self.c_copy_d2h(dst[i], src[i], n[i], index, stream)
        return 0

    cdef object c_allocate_host(self, int64_t nbytes, int index):
        return self.allocate_host(nbytes, index)

    cdef int c_resolve_index(self, int index) except -2:
        """``resolve_index(index)``, checked to be a concrete device index (0..127)."""
        r = self.resolve_index(index)
        return <int>c_result_int(r, f"{c_type_name(self)}.resolve_index({index})",
                                 "an int device index", "; expected a device index in 0..127",
                                 0, 127)


# ------------------------------------------------------------------ file uploads

@cython.final
cdef class FilePieces:
    """The checked pieces of a file upload: piece i is ``nbytes[i]`` bytes at byte
    ``file_offset[i]`` of the file, to ``dst_offset[i]`` bytes past the destination
    (increasing, not overlapping, each > 0)."""

    def __dealloc__(self):
        free(self.file_offset)
        free(self.dst_offset)
        free(self.nbytes)
        free(self.direct)


cdef FilePieces c_file_pieces(object pieces, object dst, object progress, object on_queued):
    """``pieces`` of :meth:`DeviceAllocator.copy_file_to_device` checked into C arrays
    (with ``dst``, ``progress`` and ``on_queued``): every refusal before anything moves."""
    cdef FilePieces fp = FilePieces.__new__(FilePieces)
    cdef list items = list(pieces)
    cdef Py_ssize_t count = len(items), i
    cdef int64_t end = 0, o, at, n
    if progress is not None and not callable(progress):
        raise_error(Error.InvalidArgument,
                    f"progress (a {type(progress).__name__}): expected a callable or None")
    if on_queued is not None and not callable(on_queued):
        raise_error(Error.InvalidArgument,
                    f"on_queued (a {type(on_queued).__name__}): expected a callable or None")
    fp.file_offset = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    fp.dst_offset = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    fp.nbytes = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    fp.direct = <unsigned char*>malloc(count + 1)
    if fp.file_offset == NULL or fp.dst_offset == NULL or fp.nbytes == NULL or \
            fp.direct == NULL:
        raise MemoryError()
    for i in range(count):
        item = items[i]
        if not isinstance(item, (tuple, list)) or len(item) not in (3, 4):
            raise_error(Error.InvalidArgument, f"pieces[{i}]={item!r:.80}: expected "
                                               f"(file_offset, dst_offset, nbytes[, direct])")
        a, b, c = item[0], item[1], item[2]
        d = len(item) == 4 and bool(item[3])
        o = c_count_arg(a, f"pieces[{i}].file_offset")
        at = c_count_arg(b, f"pieces[{i}].dst_offset")
        n = c_count_arg(c, f"pieces[{i}].nbytes")
        if n == 0:
            continue
        if at < end:
            raise_error(Error.InvalidArgument,
                        f"pieces[{i}].dst_offset={at}: overlaps or precedes the previous "
                        f"piece, which ends at {end}")
        if o > INT64_MAX - n or at > INT64_MAX - n:
            raise_error(Error.InvalidArgument, f"pieces[{i}]: offset + nbytes overflows")
        fp.file_offset[fp.count] = o
        fp.dst_offset[fp.count] = at
        fp.nbytes[fp.count] = n
        fp.direct[fp.count] = d
        fp.any_direct = fp.any_direct or d
        end = at + n
        fp.count += 1
    if fp.count and c_count_arg(dst, "dst") == 0:
        raise_error(Error.InvalidArgument, "dst must not be null")
    return fp


cdef int64_t _STAGING_BYTES = 64 << 20     # the generic upload's staging buffer, at most


cdef int c_direct_fd(object direct_fd, FilePieces fp) except -2:
    """``direct_fd`` checked: a descriptor when a piece is marked direct, else -1 or one."""
    cdef int df = <int>c_int_arg(direct_fd, "direct_fd", -1, 1 << 30)
    if fp.any_direct and df < 0:
        raise_error(Error.InvalidArgument, "pieces marked direct need direct_fd, the file "
                                           "opened with O_DIRECT")
    return df


cdef int _copy_file_generic(DeviceAllocator alloc, uintptr_t dst, int fd, int direct_fd,
                            FilePieces fp, int index, object progress) except -1:
    """The default :meth:`DeviceAllocator.copy_file_to_device`: groups of pieces read into
    a staging buffer by the copy threads, each group one batched copy up."""
    cdef int64_t total = 0, done = 0, used, i = 0, j, k, part, start, rc
    cdef int threads = min(16, c_cpu_count())
    for j in range(fp.count):
        total += fp.nbytes[j]
    if total == 0:
        return 0
    size = total if total < _STAGING_BYTES else _STAGING_BYTES
    staging = bytearray(size)
    cdef unsigned char[::1] view = staging
    cdef uintptr_t base = <uintptr_t>&view[0]
    cdef int64_t cap = fp.count + 1
    cdef Segment* segs = <Segment*>malloc(cap * sizeof(Segment))
    cdef uintptr_t* dsts = <uintptr_t*>malloc(cap * sizeof(uintptr_t))
    cdef uintptr_t* srcs = <uintptr_t*>malloc(cap * sizeof(uintptr_t))
    cdef int64_t* lens = <int64_t*>malloc(cap * sizeof(int64_t))
    cdef int64_t offset = 0            # bytes of piece i already copied
    try:
        if segs == NULL or dsts == NULL or srcs == NULL or lens == NULL:
            raise MemoryError()
        while i < fp.count:
            used = 0
            k = 0
            while i < fp.count and used < size and k < cap:
                part = fp.nbytes[i] - offset
                if part > size - used:
                    part = size - used
                start = fp.file_offset[i] + offset
                segs[k].dst = <char*>(base + <uintptr_t>used)
                segs[k].src = <const char*><uintptr_t>start
                segs[k].n = part
                segs[k].direct = fp.direct[i]
                segs[k].fd = direct_fd if fp.direct[i] else fd
                dsts[k] = dst + <uintptr_t>(fp.dst_offset[i] + offset)
                srcs[k] = base + <uintptr_t>used
                lens[k] = part
                used += part
                k += 1
                offset += part
                if offset == fp.nbytes[i]:
                    i += 1
                    offset = 0
            with nogil:
                rc = c_par_copy_list(segs, k, threads, False, FILL_PIECES, 0)
            if rc == -1:
                raise EOFError(f"the file ended before the piece at file offset "
                               f"{<int64_t><uintptr_t>segs[0].src} did (it was truncated?)")
            if rc != 0:
                raise OSError(rc, f"{os.strerror(rc)} (reading the file's pieces)")
            alloc.c_copy_h2d_batch(dsts, srcs, lens, k, index, None, 0)
            done += used
            if progress is not None:
                progress(done)
    finally:
        free(segs)
        free(dsts)
        free(srcs)
        free(lens)
    return 0


# ------------------------------------------------------------------ registry

cdef cython.pymutex _lock
cdef dict _allocators = {}
cdef set _autoload_tried = set()       # device types whose built-in allocator was tried
cdef object _autoload_lock = threading.RLock()
cdef int _generation = 0               # bumped whenever a registration changes


cdef int c_registry_generation() noexcept:
    """A counter that changes whenever an allocator is registered or replaced."""
    return _generation


cdef object _device_type_of(object alloc):
    if not isinstance(alloc, DeviceAllocator):
        raise_error(Error.InvalidType,
                    f"alloc must be an etptr.DeviceAllocator, got {type(alloc).__name__}")
    try:
        dt = alloc.device_type
    except Exception as exc:
        raise_error(Error.InvalidArgument,
                    f"alloc.device_type could not be read: {exc!r}")
    if isinstance(dt, bool) or not hasattr(type(dt), "__index__") or \
            not 0 <= dt.__index__() < len(_DEVICE_TYPES):
        raise_error(Error.InvalidArgument, f"alloc.device_type={dt!r:.80} is not a DeviceType")
    return _DEVICE_TYPES[dt.__index__()]


cdef int _device_type_arg(object device_type, str argname) except -1:
    """``device_type`` (DeviceType, int code, Device or a device string) checked, as an int."""
    if isinstance(device_type, str) or isinstance(device_type, Device):
        return (<Device>c_device(device_type, argname)).c_type
    if isinstance(device_type, bool) or not hasattr(type(device_type), "__index__"):
        raise_error(Error.InvalidType,
                    f"{argname} must be an etptr.DeviceType, got {device_type!r:.80}")
    code = device_type.__index__()
    if not 0 <= code < len(_DEVICE_TYPES):
        raise_error(Error.InvalidArgument,
                    f"{argname}={device_type!r} is not a DeviceType code (0=CPU, 1=CUDA)")
    return code


cdef _autoload(int device_type):
    """Let a built-in allocator register itself on first lookup (CUDA through CuPy)."""
    if device_type == DEVICE_CUDA:
        try:
            from etptr.cuda import _autoregister
        except ImportError:
            return
        _autoregister()


cpdef DeviceAllocator c_get_allocator(int device_type):
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


cdef object _why_cache = None      # (registry generation, reason CUDA is unavailable)


cdef str _why_no_allocator(int device_type):
    """Why no allocator serves ``device_type``, as a message suffix. The reason CUDA is
    unavailable (a failed ``import cupy`` costs about a millisecond) is asked once per
    state of the registry."""
    global _why_cache
    if device_type != 1:
        return "; register one with etptr.register_device_allocator"
    if _why_cache is not None and _why_cache[0] == _generation:
        why = _why_cache[1]
    else:
        try:
            from etptr.cuda import unavailable_reason
            why = unavailable_reason()
        except Exception:
            why = None
        _why_cache = (_generation, why)
    if why:
        return f" ({why}); or register your own with etptr.register_device_allocator"
    return (" (the CUDA allocator needs CuPy and a CUDA device: pip install 'etptr[cuda13]' "
            "or 'etptr[cuda12]'); or register your own with etptr.register_device_allocator")


cdef DeviceAllocator c_allocator_for(int device_type, int index, str argname):
    """The allocator registered for ``device_type``, or NotFoundError naming ``argname``."""
    cdef DeviceAllocator alloc = c_get_allocator(device_type)
    if alloc is None:
        raise_error(Error.NotFound,
                    f"{argname}={_device_str(device_type, index)}: no DeviceAllocator is "
                    f"registered for DeviceType.{_DEVICE_TYPES[device_type].name}"
                    + _why_no_allocator(device_type))
    return alloc


cdef str _device_str(int device_type, int index):
    return "cpu" if device_type == DEVICE_CPU else f"cuda:{index}"


def _forget_autoload(device_type):
    """Let the next lookup of ``device_type`` try its built-in allocator again. For tests."""
    _autoload_tried.discard(_device_type_arg(device_type, "device_type"))


def _replace_allocator(device_type, alloc):
    """Install ``alloc`` (or None) for ``device_type`` and return the previous one.

    For :func:`etptr.testing.use_allocator`; not part of the public API.
    """
    global _generation
    cdef int dt = _device_type_arg(device_type, "device_type")
    if alloc is not None and _device_type_of(alloc) != dt:
        raise_error(Error.InvalidArgument,
                    f"alloc serves {alloc.device_type!r}, not {_DEVICE_TYPES[dt]!r}")
    _autoload_tried.add(dt)
    with _lock:
        prev = _allocators.get(dt)
        if alloc is None:
            _allocators.pop(dt, None)
        else:
            _allocators[dt] = alloc
        _generation += 1
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
        global _generation
        dt = _device_type_of(alloc)
        if dt == DeviceType.CPU:
            raise_error(Error.InvalidArgument,
                        "alloc.device_type is CPU: CPU memory needs no device allocator")
        with _lock:
            prev = _allocators.get(int(dt))
            if prev is None:
                _allocators[int(dt)] = alloc
                _generation += 1
        if prev is not None:
            raise_error(Error.InvalidState,
                        f"an allocator is already registered for {dt!r}: "
                        f"{type(prev).__name__}; one allocator per device type")

    def get_allocator(self, device_type):
        """The allocator registered for ``device_type``, or None. The first
        lookup of CUDA registers :class:`etptr.cuda.CudaAllocator` when CuPy
        imports and a CUDA device exists.
        """
        return c_get_allocator(_device_type_arg(device_type, "device_type"))


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
    return c_get_allocator(_device_type_arg(device_type, "device_type"))
