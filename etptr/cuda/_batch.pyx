"""Many tensors at once: batched host<->device copies that move as few, large DMAs.

A batch is a list of pieces (destination, source, bytes). Fixed costs per
transfer dominate small tensors (a bare driver call is 2-5 us; the driver's
own batched copy runs 4-7 GB/s for 16 KiB pieces), so a batch is reshaped
into large transfers:

* Pieces whose device side is laid out in one range, in order (the results
  of a batched clone in their one allocation, a checkpoint file's tensors in
  their buffer): one pipelined copy of the range; the copy threads gather (H2D)
  or scatter (D2H) the host pieces into the pinned slots, one DMA per slot.
  Such a DMA also moves the bytes between pieces, so gaps count as one range
  only where nothing of anyone else's lies in them: in a batched clone's own
  allocation (BATCH_PADDED: each result's padding to a 256-byte multiple), in
  a file's upload (documented), or, read only, on the device side of a
  download into pageable memory. Elsewhere a range has no gaps.
* Device sides scattered over separate allocations (copies into existing
  tensors, a KV cache): large pieces (the tuning's ``large_piece``) with pageable
  host sides go in one pipelined copy of their bytes packed in order, each chunk's
  DMA one per piece it holds; page-locked ones go one by one through the
  single-copy path (one DMA each); the small ones go in rounds through a
  per-device scratch area: host pieces are packed into it by one pipelined
  copy and a kernel scatters them to their tensors (H2D), or a kernel gathers
  them into it and one copy brings it down (D2H). Without a kernel (a driver
  that cannot load PTX) each piece is copied alone.
* Pieces of an open file (a checkpoint's data) into one device range: one
  pipelined copy whose copy threads read the file straight into the pinned
  slots (``pread``; see :func:`c_h2d_file`).

What the caller knows of a batch comes down as ``facts`` (the BATCH_ flags of
``_device_allocator.pxd``: the pieces' padding, one device or host allocation,
host memory from ``allocate_host``); only what it does not know is asked of the
driver.

The scratch area (up to the tuning's ``scratch_max`` per device, grown on demand,
kept for reuse) is ordered by an event: a batch queued on another stream waits
for the previous user's last kernel before it writes to it.
"""
cimport cython
from libc.stdint cimport int64_t, intptr_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from etptr._core._codes cimport DEVICE_ALIGNMENT_BYTES, align_up
from etptr._core._device_allocator cimport (
    BATCH_DEVICE_ONE_ALLOCATION, BATCH_HOST_ALLOCATED, BATCH_HOST_ONE_ALLOCATION, BATCH_PADDED,
    FilePieces)
from etptr._core._error cimport raise_error
from etptr.cuda._copy_engine cimport (
    CopyConfig, HostList, c_copy_stream, c_staged, c_transfer)
from etptr.cuda._driver cimport (
    DeviceGuard, api, c_check, c_check_device_range, c_check_usable, c_cupy, c_enter_device,
    c_event_create, c_exit_device, c_is_page_locked, c_module_function, c_range_start)
from etptr.cuda._tuning cimport Tuning, c_tuning

from etptr._core._error import Error, NotSupportedError
from etptr.cuda._driver import _on_backend_change, _on_fork_child
from etptr.cuda import _kernels

cdef Tuning* T = c_tuning()              # large_piece, scattered_pipeline, scratch_max,
                                         # near_gap
cdef int64_t _PACK_ALIGN = 16            # packed pieces start at 16-byte multiples
cdef int64_t PIECE_BYTES = 24            # a piece in the kernel's table: {u64 src, dst, n}


cdef struct _Piece:
    uint64_t src
    uint64_t dst
    uint64_t n


@cython.final
cdef class _Scratch:
    """One device's scratch area and kernel."""
    cdef object mem             # CuPy MemoryPointer (None until first used)
    cdef uintptr_t ptr
    cdef int64_t size
    cdef intptr_t event         # recorded after the last kernel that used the area
    cdef void* kernel           # etptr_copy_pieces in the device's context, or NULL
    cdef bint no_kernel         # loading it failed: copy pieces one by one
    cdef cython.pymutex lock


cdef dict _scratch = {}


def _forget_scratch():
    global _scratch
    _scratch = {}


_on_fork_child(_forget_scratch)
_on_backend_change(_forget_scratch)


cdef _Scratch _scratch_of(int dev, int64_t want):
    """``dev``'s scratch area of at least ``want`` bytes (``dev`` current)."""
    cdef _Scratch sc = _scratch.get(dev)
    if sc is None:
        sc = _Scratch.__new__(_Scratch)
        sc.event = c_event_create()
        _scratch[dev] = sc
    if sc.kernel == NULL and not sc.no_kernel:
        if not api.driver or not api.has_launch:
            sc.no_kernel = True
        else:
            try:
                sc.kernel = c_module_function(_kernels.COPY_PIECES, _kernels.COPY_PIECES_NAME)
            except Exception:
                sc.no_kernel = True
    if sc.size < want and not sc.no_kernel:
        if sc.event != 0:
            c_check(api.event_sync(<void*>sc.event), "waiting for the scratch area's last use")
        sc.mem = None
        sc.mem = c_cupy().cuda.memory.alloc(want)
        sc.ptr = sc.mem.ptr
        sc.size = want
    return sc


cdef int _launch(_Scratch sc, uintptr_t table, int64_t count, void* stream) except -1:
    """etptr_copy_pieces over ``count`` pieces of the device table at ``table``."""
    cdef void* args[2]
    cdef unsigned long long t = table, c = count
    cdef unsigned int grid = <unsigned int>(count if count < 65535 else 65535)
    cdef int rc
    args[0] = &t
    args[1] = &c
    with nogil:
        rc = api.launch(sc.kernel, grid, 1, 1, 256, 1, 1, 0, stream, args, NULL)
    c_check(rc, "launching the copy kernel")
    return 0


cdef bint _one_range(const uintptr_t* dev, const int64_t* n, int64_t count,
                     int64_t near) noexcept:
    """Whether the device sides follow each other in order, with gaps of up to ``near``
    bytes per piece at most."""
    cdef int64_t i
    cdef uint64_t end = dev[0] + <uint64_t>n[0]
    cdef uint64_t total = <uint64_t>n[0]
    for i in range(1, count):
        if dev[i] < end:
            return False
        end = dev[i] + <uint64_t>n[i]
        total += <uint64_t>n[i]
    return end - dev[0] <= total + <uint64_t>(near * count)


cdef bint _one_allocation(const uintptr_t* at, int64_t count) except -1:
    """Whether the first and the last piece, in order, lie in one allocation CUDA knows
    (device or page-locked memory), so every piece and gap between them does: a DMA may
    then span them. Pieces in separate allocations, or where the driver cannot say, are
    not moved as one range."""
    cdef uintptr_t start = c_range_start(at[0])
    return start != 0 and start == c_range_start(at[count - 1])


cdef bint _same_layout(const uintptr_t* a, const uintptr_t* b, int64_t count) noexcept:
    """Whether ``b`` is ``a`` shifted by one offset (the same relative layout)."""
    cdef int64_t i
    for i in range(1, count):
        if a[i] - a[0] != b[i] - b[0]:
            return False
    return True


cdef int _ranged(const uintptr_t* dev, const uintptr_t* host, const int64_t* n, int64_t count,
                 int d, intptr_t s, bint h2d, bint sync, CopyConfig* cfg, int fd, int facts,
                 object progress, const unsigned char* direct=NULL, int direct_fd=-1) except -1:
    """Pieces whose device sides lie in one range: one pipelined copy of the range. With
    ``fd >= 0`` (uploads) the host sides are byte offsets in that open file. An upload
    writes the gaps between pieces (their bytes are the caller's: see the module's
    notes); a download writes only the pieces, but for one page-locked host range of the
    same layout, which takes the whole range in one DMA when it has no gaps or is
    padded (``facts``: the BATCH_ flags). ``progress`` as for c_staged."""
    cdef HostList L
    cdef int64_t i, total = 0
    cdef uintptr_t base = dev[0]
    cdef int64_t span = <int64_t>(dev[count - 1] + <uint64_t>n[count - 1] - base)
    cdef int64_t* starts = <int64_t*>malloc(count * sizeof(int64_t))
    if starts == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            starts[i] = <int64_t>(dev[i] - base)
            total += n[i]
        if not h2d and (facts & BATCH_PADDED or total == span) and \
                _same_layout(dev, host, count) and _page_locked_range(host, count, facts):
            # the host side is one page-locked range with the same layout: one DMA
            c_transfer(base, host[0], span, d, s, sync, cfg, False)
            return 0
        L.host = <char**>host
        L.lens = n
        L.starts = starts
        L.n = count
        L.fd = fd
        L.dev = NULL
        L.direct = direct
        L.direct_fd = direct_fd
        c_staged(base, 0, &L, span, d, s, h2d, sync or not h2d, cfg, progress)
    finally:
        free(starts)
    return 0


cdef bint _page_locked_range(const uintptr_t* host, int64_t count, int facts) except -1:
    """Whether the host sides lie in one page-locked allocation: known from the caller's
    ``facts`` (pieces of one block from allocate_host, a pool block), else asked of the
    driver."""
    if facts & BATCH_HOST_ALLOCATED:
        return (facts & BATCH_HOST_ONE_ALLOCATION) != 0
    return c_is_page_locked(host[0]) and _one_allocation(host, count)


cdef int _scattered(const uintptr_t* dev, const uintptr_t* host, const int64_t* n,
                    int64_t count, int d, intptr_t s, bint h2d, CopyConfig* cfg, int fd,
                    object progress, const unsigned char* direct=NULL,
                    int direct_fd=-1) except -1:
    """Large pieces with pageable host sides and scattered device sides: one pipelined
    copy of their bytes packed in order, each chunk's DMA one per piece it holds (a
    piece alone would be a short pipeline of its own, whose fixed costs the next piece
    waits behind). With ``fd >= 0`` (uploads) the host sides are byte offsets in that open
    file. Downloads are complete on return (the copy threads drain the slots)."""
    cdef HostList L
    cdef int64_t i, total = 0
    cdef int64_t* starts = <int64_t*>malloc(count * sizeof(int64_t))
    if starts == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            c_check_device_range(dev[i], n[i], "dst" if h2d else "src")
            starts[i] = total
            total += n[i]
        L.host = <char**>host
        L.lens = n
        L.starts = starts
        L.n = count
        L.fd = fd
        L.dev = dev
        L.direct = direct
        L.direct_fd = direct_fd
        c_staged(0, 0, &L, total, d, s, h2d, not h2d, cfg, progress)
    finally:
        free(starts)
    return 0


cdef int _rounds(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                 int d, intptr_t s, bint h2d, CopyConfig* cfg, int facts) except -1:
    """Small pieces with scattered device sides, in rounds through the scratch area."""
    cdef _Scratch sc
    cdef int64_t total = 0, i, first, last, used, table_bytes, k
    cdef _Piece* table = NULL
    cdef uintptr_t* hosts = NULL
    cdef int64_t* lens = NULL
    cdef uintptr_t* devs = NULL
    cdef int64_t off
    cdef const uintptr_t* dev_side = dst if h2d else src
    cdef const uintptr_t* host_side = src if h2d else dst
    for i in range(count):
        total += align_up(n[i], _PACK_ALIGN)
    total += count * PIECE_BYTES + DEVICE_ALIGNMENT_BYTES
    sc = _scratch_of(d, total if total < T.scratch_max else T.scratch_max)
    if sc.no_kernel:
        for i in range(count):
            c_transfer(dev_side[i], host_side[i], n[i], d, s, False, cfg, h2d)
        return 0
    with sc.lock:
        # the previous user's kernels (perhaps on another stream) first
        c_check(api.stream_wait_event(<void*>s, <void*>sc.event, 0), "ordering after the scratch")
        first = 0
        while first < count:
            # as many pieces as fit: the table, then the packed payload
            used = 0
            last = first
            while last < count:
                k = last - first + 1
                table_bytes = align_up(k * PIECE_BYTES, DEVICE_ALIGNMENT_BYTES)
                if last > first and table_bytes + used + n[last] > sc.size:
                    break
                used += align_up(n[last], _PACK_ALIGN)
                last += 1
            k = last - first
            table_bytes = align_up(k * PIECE_BYTES, DEVICE_ALIGNMENT_BYTES)
            table = <_Piece*>malloc(k * sizeof(_Piece))
            hosts = <uintptr_t*>malloc((k + 1) * sizeof(uintptr_t))
            lens = <int64_t*>malloc((k + 1) * sizeof(int64_t))
            devs = <uintptr_t*>malloc((k + 1) * sizeof(uintptr_t))
            try:
                if table == NULL or hosts == NULL or lens == NULL or devs == NULL:
                    raise MemoryError()
                off = table_bytes
                for i in range(k):
                    if h2d:
                        table[i].src = sc.ptr + off
                        table[i].dst = dst[first + i]
                    else:
                        table[i].src = src[first + i]
                        table[i].dst = sc.ptr + off
                    table[i].n = n[first + i]
                    hosts[i + 1] = host_side[first + i]
                    lens[i + 1] = n[first + i]
                    devs[i + 1] = sc.ptr + off
                    off += align_up(n[first + i], _PACK_ALIGN)
                if h2d:
                    # the table and the payload up in one pipelined copy, then the scatter
                    hosts[0] = <uintptr_t>table
                    lens[0] = k * PIECE_BYTES
                    devs[0] = sc.ptr
                    _ranged(devs, hosts, lens, k + 1, d, s, True, False, cfg, -1,
                            BATCH_PADDED, None)
                    _launch(sc, sc.ptr, k, <void*>s)
                else:
                    # the table up, the gather, then the payload down in one copy
                    c_transfer(sc.ptr, <uintptr_t>table, k * PIECE_BYTES, d, s, False, cfg, True)
                    _launch(sc, sc.ptr, k, <void*>s)
                    # (the host sides are the caller's outs: their gaps are not ours)
                    _ranged(devs + 1, hosts + 1, lens + 1, k, d, s, False, False, cfg, -1,
                            facts & (BATCH_HOST_ALLOCATED | BATCH_HOST_ONE_ALLOCATION), None)
            finally:
                free(table)
                free(hosts)
                free(lens)
                free(devs)
                table = NULL
                hosts = lens = devs = NULL
            first = last
        c_check(api.event_record(<void*>sc.event, <void*>s), "recording the scratch's last use")
    return 0


cdef int _sync(intptr_t s) except -1:
    cdef int rc
    with nogil:
        rc = api.stream_sync(<void*>s)
    c_check(rc, "waiting for the batched copy")
    return 0


cdef int _batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                int d, object stream, CopyConfig* cfg, bint h2d, int facts) except -1:
    """Both directions: ``d`` is current. ``facts``: the BATCH_ flags the caller passed
    (what it knows of the pieces; what it does not know is asked of the driver)."""
    cdef bint sync = stream is None
    cdef intptr_t s = c_copy_stream(d, stream)
    cdef const uintptr_t* dev_side = dst if h2d else src
    cdef const uintptr_t* host_side = src if h2d else dst
    cdef int64_t i, nsmall = 0, nlarge = 0
    cdef int64_t near = T.near_gap if facts & BATCH_PADDED or not h2d else 0
    cdef bint pinned = (facts & BATCH_HOST_ALLOCATED) != 0
    cdef uintptr_t* sd
    cdef uintptr_t* ss
    cdef int64_t* sn
    cdef uintptr_t* ld
    cdef uintptr_t* ls
    cdef int64_t* ln
    if _one_range(dev_side, n, count, near) and (
            facts & BATCH_DEVICE_ONE_ALLOCATION or _one_allocation(dev_side, count)):
        return _ranged(dev_side, host_side, n, count, d, s, h2d, sync, cfg, -1, facts, None)
    sd = <uintptr_t*>malloc(count * sizeof(uintptr_t))
    ss = <uintptr_t*>malloc(count * sizeof(uintptr_t))
    sn = <int64_t*>malloc(count * sizeof(int64_t))
    ld = <uintptr_t*>malloc(count * sizeof(uintptr_t))
    ls = <uintptr_t*>malloc(count * sizeof(uintptr_t))
    ln = <int64_t*>malloc(count * sizeof(int64_t))
    try:
        if sd == NULL or ss == NULL or sn == NULL or ld == NULL or ls == NULL or ln == NULL:
            raise MemoryError()
        for i in range(count):
            if n[i] >= T.large_piece and T.scattered_pipeline and not pinned and \
                    not c_is_page_locked(host_side[i]):
                ld[nlarge] = dev_side[i]      # pageable: packed into one pipeline below
                ls[nlarge] = host_side[i]
                ln[nlarge] = n[i]
                nlarge += 1
            elif n[i] >= T.large_piece:
                c_transfer(dev_side[i], host_side[i], n[i], d, s, False, cfg, h2d)
            elif n[i] > 0:
                sd[nsmall] = dst[i]
                ss[nsmall] = src[i]
                sn[nsmall] = n[i]
                nsmall += 1
        if nlarge:
            _scattered(ld, ls, ln, nlarge, d, s, h2d, cfg, -1, None)
        if nsmall:
            _rounds(sd, ss, sn, nsmall, d, s, h2d, cfg, facts)
    finally:
        free(sd)
        free(ss)
        free(sn)
        free(ld)
        free(ls)
        free(ln)
    if sync:
        _sync(s)
    return 0


cdef int _batch_entry(const uintptr_t* dst, const uintptr_t* src, const int64_t* n,
                      int64_t count, int dev, object stream, CopyConfig* cfg,
                      bint h2d, int facts) except -1:
    """What :func:`c_h2d_batch` and :func:`c_d2h_batch` share: check the backend, make
    ``dev`` current for the batch and restore the device."""
    cdef DeviceGuard guard
    c_check_usable("batched host->device copy" if h2d else "batched device->host copy")
    if count <= 0:
        return 0
    c_cupy()
    c_enter_device(dev, &guard)
    try:
        _batch(dst, src, n, count, dev, stream, cfg, h2d, facts)
    finally:
        c_exit_device(&guard)
    return 0


cdef int c_h2d_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, int facts) except -1:
    """Copy ``count`` pieces host -> device on ``dev`` (a checked index): piece i is
    ``n[i]`` bytes from host ``src[i]`` to device ``dst[i]``. ``stream`` as for
    :func:`etptr.cuda._copy_engine.c_h2d` (None: complete on return). ``facts``: the
    BATCH_ flags of what the caller knows (with BATCH_PADDED the device bytes between
    pieces may be overwritten; else nothing outside the pieces is written)."""
    return _batch_entry(dst, src, n, count, dev, stream, cfg, True, facts)


cdef int c_d2h_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, int facts) except -1:
    """Copy ``count`` pieces device -> host: piece i is ``n[i]`` bytes from device
    ``src[i]`` to host ``dst[i]``. ``stream`` as for the single copy; ``facts`` as for
    :func:`c_h2d_batch` (BATCH_PADDED: the host bytes between pieces may be written)."""
    return _batch_entry(dst, src, n, count, dev, stream, cfg, False, facts)


cdef int c_h2d_file(uintptr_t dst, int fd, FilePieces fp, int dev, object stream,
                    CopyConfig* cfg, object progress, object on_queued, bint gaps,
                    int direct_fd) except -1:
    """Copy the pieces ``fp`` of the open file ``fd`` to device memory at ``dst`` on
    ``dev`` (a checked index). One pipelined copy: the copy threads read the file into
    the pinned slots with ``pread`` (the page cache is copied once; no map of the file is
    made, so no page fault is taken and a file truncated meanwhile gives an error, not
    SIGBUS), each slot's DMA runs while the next is read. ``gaps``: the device range from
    the first piece to the end of the last moves as one, its bytes between pieces
    overwritten (one DMA per slot); else only the pieces are written, each checked
    against its own allocation (one DMA per piece a slot holds). ``progress``: called
    with the pieces' bytes moved so far every few slots. ``stream`` None: ``on_queued()``
    (if given) runs once the whole file has been read, while the last DMAs run, outside
    the device's context; the copy is complete when this returns, also when it raised.
    A stream: queued on it. The pieces ``fp`` marks direct are read through ``direct_fd``
    (the file opened with O_DIRECT), in aligned blocks through the copy threads' bounce
    buffers.

    Raises
    ------
    InvalidArgumentError
        The range runs past ``dst``'s device allocation; nothing has moved.
    OSError
        A read failed; EOFError: the file ended before a piece did. The device
        range may hold part of the data.
    """
    cdef DeviceGuard guard
    cdef intptr_t s
    cdef int64_t i, count = fp.count
    cdef uintptr_t* devs
    c_check_usable("file upload")
    if count <= 0:
        if on_queued is not None:
            on_queued()
        return 0
    devs = <uintptr_t*>malloc(count * sizeof(uintptr_t))
    if devs == NULL:
        raise MemoryError()
    c_cupy()
    c_enter_device(dev, &guard)
    try:
        for i in range(count):
            devs[i] = dst + <uintptr_t>fp.dst_offset[i]
        s = c_copy_stream(dev, stream)
        if gaps:
            # a raw device address from the caller: the range is checked against its
            # allocation (without gaps each piece is, by _scattered)
            c_check_device_range(devs[0], <int64_t>(devs[count - 1] - devs[0]) +
                                 fp.nbytes[count - 1], "dst")
            _ranged(devs, <const uintptr_t*>fp.file_offset, fp.nbytes, count, dev, s, True,
                    False, cfg, fd, BATCH_PADDED, progress,
                    fp.direct if fp.any_direct else NULL, direct_fd)
        else:
            _scattered(devs, <const uintptr_t*>fp.file_offset, fp.nbytes, count, dev, s,
                       True, cfg, fd, progress, fp.direct if fp.any_direct else NULL,
                       direct_fd)
    finally:
        c_exit_device(&guard)
        free(devs)
    if stream is None:
        try:
            if on_queued is not None:
                on_queued()
        finally:
            c_enter_device(dev, &guard)
            try:
                _sync(s)
            finally:
                c_exit_device(&guard)
    return 0
