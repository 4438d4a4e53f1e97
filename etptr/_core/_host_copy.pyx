"""The host copy threads: a persistent pool of worker threads copying host memory.

A process-wide pool of plain pthreads (they never touch Python) copies the
pieces of a copy list: one range (:func:`c_par_copy`) or many segments at once
(:func:`c_par_copy_list`: gathering small tensors into one pinned slot, or
scattering a slot into many tensors). A caller posts a job, copies pieces
itself too, and waits until every piece is done and no worker still holds
the job. Workers take pieces with an atomic counter, so several callers (one
per GPU) share the pool; the job list is guarded by a spin lock held for a
few instructions. A job into page-locked memory (a pinned slot being filled) is cut
in FILL_PIECES pieces per thread, so threads that finish early take the rest instead
of the job waiting for the slowest; one into memory that may fault, in one per
thread. While a pipelined copy runs (between :func:`c_copy_begin`
and :func:`c_copy_end`) idle workers spin, so the next chunk starts within a
microsecond; otherwise they spin briefly and then sleep on a condition
variable, so nothing spins while no copy runs and the pool does not compete
with other thread pools (OpenMP's in torch, BLAS). Destinations read by a DMA
next are written with non-temporal stores (``nontemporal``). A segment may read a file
instead of memory (``pread``, for checkpoint loads: a fresh map of the file would
fault its pages in one by one, which halves a load's rate); in a ``nontemporal`` job
with a ``read_bounce`` each read lands in a buffer of that many bytes of the thread (its
bounce buffer, kept until the thread ends) and is copied out with non-temporal stores. The first read error ends the job
and is returned. After ``fork()`` the child starts with no workers and
makes new ones. No CUDA here.
"""
import os

from libc.errno cimport EINTR, ENOMEM, EOVERFLOW, errno
from libc.stdint cimport INT64_MAX, int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from etptr._core._args cimport c_count_arg, c_int_arg
from etptr._core._error cimport raise_error

from etptr._core._error import Error


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

cdef extern from "<unistd.h>" nogil:
    ssize_t pread(int fd, void* buf, size_t count, long long offset)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t* s)
    int pthread_sigmask(int how, const sigset_t* s, sigset_t* old)
    enum:
        SIG_SETMASK

cdef extern from "_host_copy.h" nogil:
    long long etptr_atomic_load(long long* p)
    long long etptr_atomic_add(long long* p, long long v)
    void etptr_cpu_relax()
    void etptr_spin_lock(long long* p)
    void etptr_spin_unlock(long long* p)
    void etptr_atomic_set_if_zero(long long* p, long long v)
    long long etptr_now_ns()
    void etptr_copy_nontemporal(char* dst, const char* src, size_t n)
    void etptr_bounce_init()
    char* etptr_bounce(size_t nbytes)


cdef int c_cpu_count() except -1:
    """CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


cdef long long _MIN_PIECE = 128 * 1024   # below this a piece is not split across threads


cdef struct _Job:
    const Segment* segs
    long long nsegs
    const long long* starts  # starts[i]: offset of segs[i] in the list (NULL for one segment)
    long long total          # bytes in all
    long long piece          # bytes per piece (the last may be shorter)
    long long parts
    long long next           # atomic: the next piece to take
    long long done           # atomic: pieces copied
    long long refs           # atomic: workers inside the job
    long long error          # atomic: the first failed read's errno (-1: the file ended)
    bint nontemporal         # non-temporal stores (the destination is read by DMA next)
    long long read_bounce    # file reads of such a job go through this many bytes of the
                             # thread's bounce buffer (0: straight into the destination)
    _Job* link


cdef long long _SPIN_NS = 200000          # idle spin before a worker sleeps (no copy running)
cdef long long _SPIN_BUSY_NS = 20000      # the same while threads outnumber CPUs
cdef long long _tp_list_lock = 0          # spin lock over _tp_jobs
cdef _Job* _tp_jobs = NULL                # posted jobs, oldest first
cdef long long _tp_gen = 0                # atomic: bumped whenever a job is posted
cdef long long _tp_active = 0             # atomic: pipelined copies running (workers stay awake)
cdef pthread_mutex_t _tp_sleep_lock       # guards _tp_sleepers and the sleep itself
cdef pthread_cond_t _tp_wake              # idle workers sleep here
cdef long long _tp_sleepers = 0           # atomic: workers asleep, or about to sleep
cdef int _tp_workers = 0                  # threads started (changed under _tp_sleep_lock)
cdef int _tp_failed = 0                   # pthread_create failures (the callers copy alone)
cdef long long _tp_epoch = 0              # bumped by _tp_init (at import and after fork)
cdef int _tp_ncpu = c_cpu_count()
etptr_bounce_init()
cdef int _SPIN_RELAX = 32                 # pause instructions per turn of an idle worker's spin


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


def _after_fork_in_child():
    _tp_init()            # the parent's copy threads are not in this process


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef inline void _copy(char* dst, const char* src, long long n, bint nontemporal) noexcept nogil:
    if nontemporal:
        etptr_copy_nontemporal(dst, src, <size_t>n)
    else:
        memcpy(dst, src, <size_t>n)


cdef void _read_direct(_Job* job, const Segment* seg, long long off, long long m) noexcept nogil:
    """Bytes [off, off+m) of a segment of a file opened with O_DIRECT: whole aligned blocks
    read into the thread's bounce buffer, the wanted bytes copied out."""
    cdef char* dst = seg.dst + off
    cdef long long at = <long long><uintptr_t>seg.src + off
    cdef char* buf = etptr_bounce(READ_BOUNCE_MAX)
    cdef long long start, want, skip, got, take
    cdef ssize_t r
    if buf == NULL:
        etptr_atomic_set_if_zero(&job.error, ENOMEM)
        return
    while m > 0:
        if etptr_atomic_load(&job.error) != 0:
            return
        start = at & ~(<long long>DIRECT_ALIGN - 1)
        skip = at - start
        want = skip + m
        if want > READ_BOUNCE_MAX:
            want = READ_BOUNCE_MAX
        want = (want + DIRECT_ALIGN - 1) & ~(<long long>DIRECT_ALIGN - 1)
        r = pread(seg.fd, buf, <size_t>want, start)
        if r < 0 and errno == EINTR:
            continue
        if r < 0:
            etptr_atomic_set_if_zero(&job.error, errno)
            return
        got = r - skip                  # the bytes of this read past ``at`` (a short read
        if got <= 0:                    # at the end of the file is its tail)
            etptr_atomic_set_if_zero(&job.error, -1)
            return
        take = got if got < m else m
        _copy(dst, buf + skip, take, job.nontemporal)
        dst += take
        at += take
        m -= take


cdef void _read(_Job* job, const Segment* seg, long long off, long long m) noexcept nogil:
    """Bytes [off, off+m) of a file segment, read into its destination."""
    cdef char* dst = seg.dst + off
    cdef long long at = <long long><uintptr_t>seg.src + off
    cdef long long bounce = job.read_bounce
    cdef char* buf = etptr_bounce(READ_BOUNCE_MAX) if job.nontemporal and bounce > 0 else NULL
    cdef ssize_t r
    while m > 0:
        if etptr_atomic_load(&job.error) != 0:
            return                  # another piece failed: the job's result is an error
        if buf != NULL:
            r = pread(seg.fd, buf, <size_t>(m if m < bounce else bounce), at)
            if r > 0:
                etptr_copy_nontemporal(dst, buf, <size_t>r)
        else:
            r = pread(seg.fd, dst, <size_t>m, at)
        if r > 0:
            dst += r
            at += r
            m -= r
        elif r < 0 and errno == EINTR:
            continue
        else:
            etptr_atomic_set_if_zero(&job.error, errno if r < 0 else -1)
            return


cdef inline void _move(_Job* job, const Segment* seg, long long off, long long m) noexcept nogil:
    if seg.fd >= 0 and seg.direct:
        _read_direct(job, seg, off, m)
    elif seg.fd >= 0:
        _read(job, seg, off, m)
    else:
        _copy(seg.dst + off, seg.src + off, m, job.nontemporal)


cdef void _copy_range(_Job* job, long long a, long long b) noexcept nogil:
    """Copy bytes [a, b) of the job's list."""
    cdef long long lo, hi, mid, k, off, m
    cdef const Segment* seg
    if job.starts == NULL:
        _move(job, &job.segs[0], a, b - a)
        return
    lo = 0                          # the last segment starting at or before a
    hi = job.nsegs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if job.starts[mid] <= a:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    while a < b and k < job.nsegs:
        seg = &job.segs[k]
        off = a - job.starts[k]
        m = seg.n - off
        if m > b - a:
            m = b - a
        if m > 0:
            _move(job, seg, off, m)
            a += m
        k += 1


cdef void _run_pieces(_Job* job) noexcept nogil:
    cdef long long i, a, b
    while True:
        i = etptr_atomic_add(&job.next, 1)
        if i >= job.parts:
            return
        a = i * job.piece
        b = a + job.piece
        if b > job.total:
            b = job.total
        if a < b:
            _copy_range(job, a, b)
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
            for k in range(_SPIN_RELAX):
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


cdef long long c_copy_begin(int threads) noexcept nogil:
    """A pipelined copy starts: wake the workers now (they spin until :func:`c_copy_end`).
    Returns the pool's epoch, for c_copy_end."""
    cdef long long active = etptr_atomic_add(&_tp_active, 1) + 1
    _tp_grow(threads, active)
    etptr_atomic_add(&_tp_gen, 1)
    _tp_wake_some(threads - 1)
    return _tp_epoch


cdef void c_copy_end(long long epoch) noexcept nogil:
    # A copy that began before a fork (in the thread that forked) ends in the child
    # too: it did not count in the child's fresh pool.
    if epoch == _tp_epoch:
        etptr_atomic_add(&_tp_active, -1)


cdef void _run_job(_Job* job, int nthreads, int pieces) noexcept nogil:
    """Copy ``job`` with up to ``nthreads`` threads (the caller and pool workers), cut in
    ``pieces`` pieces per thread (of at least _MIN_PIECE bytes)."""
    global _tp_jobs
    cdef _Job* p
    cdef long long parts = <long long>nthreads * (pieces if pieces > 1 else 1)
    cdef long long workers
    cdef long long spins = 0
    if parts > job.total // _MIN_PIECE:
        parts = job.total // _MIN_PIECE
    if parts <= 1:
        job.piece = job.total
        job.parts = 1 if job.total > 0 else 0
        job.next = 0
        _run_pieces(job)
        return
    workers = parts if parts < nthreads else nthreads
    if _tp_workers < workers - 1:
        _tp_grow(<int>workers, 1)
    job.piece = ((job.total + parts - 1) // parts + 63) & ~(<long long>63)
    job.parts = parts
    job.next = 0
    job.done = 0
    job.refs = 0
    job.link = NULL
    etptr_spin_lock(&_tp_list_lock)
    p = _tp_jobs
    if p == NULL:
        _tp_jobs = job
    else:
        while p.link != NULL:
            p = p.link
        p.link = job
    etptr_spin_unlock(&_tp_list_lock)
    etptr_atomic_add(&_tp_gen, 1)
    _tp_wake_some(workers - 1)
    _run_pieces(job)
    # every piece is taken: wait for the ones workers are copying (spin briefly; yield
    # the CPU at once when threads outnumber CPUs, where the worker may need this one)
    while etptr_atomic_load(&job.done) < parts:
        spins += 1
        if spins < 20000 and _tp_workers + etptr_atomic_load(&_tp_active) <= _tp_ncpu:
            etptr_cpu_relax()
        else:
            sched_yield()
    _unlink_job(job)


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


cdef void c_par_copy(char* dst, const char* src, long long n, int threads,
                     bint nontemporal, int pieces) noexcept nogil:
    """memcpy of ``n`` bytes with up to ``threads`` threads, in ``pieces`` pieces per
    thread of at least 128 KiB; ``nontemporal``: with non-temporal stores."""
    cdef Segment seg
    cdef _Job job
    seg.dst = dst
    seg.src = src
    seg.n = n
    seg.fd = -1
    seg.direct = False
    job.error = 0
    job.segs = &seg
    job.nsegs = 1
    job.starts = NULL
    job.total = n
    job.nontemporal = nontemporal
    job.read_bounce = 0
    job.done = 0
    job.refs = 0
    _run_job(&job, threads, pieces)


cdef int c_par_copy_list(const Segment* segs, long long nsegs, int threads,
                         bint nontemporal, int pieces, long long read_bounce) noexcept nogil:
    """Copy (or read, for file segments) every segment of ``segs`` with up to
    ``threads`` threads, in ``pieces`` pieces per thread; the work is split by bytes,
    so large and small segments mix freely. ``nontemporal``: with non-temporal stores,
    a file's reads then through ``read_bounce`` bytes (at most READ_BOUNCE_MAX; 0:
    straight into the destination) of each thread's bounce buffer. Returns 0, the first failed read's errno
    (-1: a file ended before its segment did), or EOVERFLOW when the segments' bytes
    add up past int64; after a failed read some destinations hold only part of their
    bytes."""
    cdef _Job job
    cdef long long* starts = NULL
    cdef long long i, at = 0
    cdef int rc
    if nsegs <= 0:
        return 0
    if nsegs == 1:
        at = segs[0].n
    else:
        starts = <long long*>malloc(nsegs * sizeof(long long))
        if starts == NULL:                # no memory for the index: one segment at a time
            for i in range(nsegs):
                rc = c_par_copy_list(&segs[i], 1, threads, nontemporal, pieces,
                                     read_bounce)
                if rc != 0:
                    return rc
            return 0
        for i in range(nsegs):
            if segs[i].n > INT64_MAX - at:
                free(starts)
                return EOVERFLOW          # more bytes than a job can count
            starts[i] = at
            at += segs[i].n
    job.segs = segs
    job.nsegs = nsegs
    job.starts = starts
    job.total = at
    job.nontemporal = nontemporal
    job.read_bounce = read_bounce if read_bounce < READ_BOUNCE_MAX else READ_BOUNCE_MAX
    job.done = 0
    job.refs = 0
    job.error = 0
    _run_job(&job, threads, pieces)
    free(starts)
    return <int>job.error


# ------------------------------------------------------------------ Python entries

def copy_buffer(dst, src, threads=None):
    """Copy the bytes of ``src`` into ``dst`` with the copy threads (the saver writes CPU
    tensors into a mapped file this way).

    Parameters
    ----------
    dst : writable C-contiguous buffer (a memoryview of a mapped file, a NumPy array)
    src : C-contiguous buffer of the same length in bytes
    threads : int, optional
        Copy threads to use, 1..1024; default 16, or fewer when the process may use
        fewer CPUs.

    Raises
    ------
    InvalidArgumentError
        The lengths differ, or ``threads`` is out of range.
    """
    cdef const unsigned char[::1] s = memoryview(src).cast("B")
    cdef unsigned char[::1] d = memoryview(dst).cast("B")
    cdef int t = min(16, _tp_ncpu) if threads is None else <int>c_int_arg(threads, "threads",
                                                                           1, 1024)
    cdef long long n = s.shape[0]
    if d.shape[0] != n:
        raise_error(Error.InvalidArgument,
                    f"dst holds {d.shape[0]} bytes and src {n}: a copy needs the same length")
    if n:
        with nogil:
            c_par_copy(<char*>&d[0], <const char*>&s[0], n, t, False, 1)


def parallel_copy(dst, src, nbytes, threads, nontemporal=False, pieces=1):
    """Copy ``nbytes`` bytes between host addresses ``src`` -> ``dst`` with up to
    ``threads`` threads (``nontemporal``: non-temporal stores), in ``pieces`` pieces per
    thread (1..64). For tests and probes (:func:`copy_buffer` takes buffers).

    Raises
    ------
    InvalidArgumentError
        A null address with ``nbytes > 0``, or ``threads`` outside 1..1024.
    """
    cdef int64_t n = c_count_arg(nbytes, "nbytes")
    cdef int t = <int>c_int_arg(threads, "threads", 1, 1024)
    cdef uintptr_t d = <uintptr_t>c_count_arg(dst, "dst")
    cdef uintptr_t s = <uintptr_t>c_count_arg(src, "src")
    cdef bint nt = nontemporal
    cdef int per = <int>c_int_arg(pieces, "pieces", 1, 64)
    if n and (d == 0 or s == 0):
        raise_error(Error.InvalidArgument, "dst and src must not be null")
    with nogil:
        c_par_copy(<char*>d, <const char*>s, n, t, nt, per)


cdef int _run_segments(object segments, int fd, object threads, bint nontemporal,
                       object pieces, object read_bounce, bint direct=False) except? -2:
    """Copy (``fd`` -1) or read (from ``fd``) every ``(dst, src or file offset, nbytes)``
    of ``segments`` as one job; the job's result (see :func:`c_par_copy_list`)."""
    cdef list items = list(segments)          # read once: its length is what is copied
    cdef long long n = len(items), i
    cdef int t = <int>c_int_arg(threads, "threads", 1, 1024)
    cdef int per = <int>c_int_arg(pieces, "pieces", 1, 64)
    cdef long long bounce = c_int_arg(read_bounce, "read_bounce", 0, READ_BOUNCE_MAX)
    cdef int rc
    cdef long long total = 0
    cdef str what = "src" if fd < 0 else "file_offset"
    cdef Segment* segs = <Segment*>malloc((n if n > 0 else 1) * sizeof(Segment))
    if segs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            d, s, m = items[i]
            segs[i].dst = <char*><uintptr_t>c_count_arg(d, f"segments[{i}].dst")
            segs[i].src = <const char*><uintptr_t>c_count_arg(s, f"segments[{i}].{what}")
            segs[i].n = c_count_arg(m, f"segments[{i}].nbytes")
            segs[i].fd = fd
            segs[i].direct = direct and fd >= 0
            if segs[i].n and (segs[i].dst == NULL or (fd < 0 and segs[i].src == NULL)):
                raise_error(Error.InvalidArgument, f"segments[{i}]: a null address")
            if segs[i].n > INT64_MAX - total:
                raise_error(Error.InvalidArgument, f"segments[{i}]: the segments' bytes "
                                                   f"add up past 2**63 - 1")
            total += segs[i].n
        with nogil:
            rc = c_par_copy_list(segs, n, t, nontemporal, per, bounce)
    finally:
        free(segs)
    return rc


def parallel_copy_list(segments, threads, nontemporal=False, pieces=1):
    """Copy every ``(dst, src, nbytes)`` of ``segments`` (host addresses) with up to
    ``threads`` threads, as one job in ``pieces`` pieces per thread. For tests and
    probes."""
    _run_segments(segments, -1, threads, nontemporal, pieces, 0)


def parallel_read(fd, segments, threads, pieces=FILL_PIECES, nontemporal=False,
                  read_bounce=0, direct=False):
    """Read every ``(dst, file_offset, nbytes)`` of ``segments`` from the open file
    ``fd`` into host addresses, with up to ``threads`` threads, as one job in
    ``pieces`` pieces per thread (the loader's reads: FILL_PIECES); ``nontemporal``
    with ``read_bounce`` bytes (at most READ_BOUNCE_MAX): through that much of each
    thread's bounce buffer, copied out with non-temporal stores (by the thread, as
    :func:`parallel_copy` copies: a destination that is not writable memory faults
    instead of failing the read with EFAULT); ``direct``: ``fd`` was opened with
    O_DIRECT, and each read goes through the bounce buffer in aligned blocks.

    Raises
    ------
    OSError
        A read failed (its errno).
    EOFError
        The file ended before a segment did.
    """
    cdef int rc = _run_segments(segments, <int>c_int_arg(fd, "fd", 0, 1 << 30), threads,
                                nontemporal, pieces, read_bounce, direct)
    if rc == -1:
        raise EOFError("the file ended before the bytes to read did")
    if rc != 0:
        raise OSError(rc, os.strerror(rc))


def copy_threads():
    """Worker threads the pool has started in this process, and start failures."""
    return {"workers": _tp_workers, "failed": _tp_failed}


def cpu_count():
    """CPUs this process may use."""
    return c_cpu_count()
