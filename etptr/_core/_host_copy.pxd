# The host copy threads: a persistent pool of pthreads that copy host memory in
# parallel (no CUDA here). See _host_copy.pyx.

cdef struct Segment:
    # one piece of a copy list: ``n`` bytes from ``src`` to ``dst``; with ``fd >= 0``
    # the source is that open file and ``src`` holds the byte offset in it (read with
    # pread(): no page of the file is mapped, so none is faulted in). ``direct``: ``fd`` was
    # opened with O_DIRECT, so its reads go through the thread's bounce buffer in
    # DIRECT_ALIGN-aligned blocks (the page cache is neither read nor filled)
    char* dst
    const char* src
    long long n
    int fd
    bint direct


# Pieces per thread of a job whose destination is page-locked memory (a pinned slot
# being filled): threads that finish early take the rest, so the job does not wait for
# the slowest (the engine's tuning, fill_pieces, starts from this). Into memory that may fault (a
# drain into tensors), one piece per thread: finer pieces there contended.
cdef enum:
    FILL_PIECES = 8

cdef enum:
    # bytes of each copy thread's bounce buffer (file reads of non-temporal jobs, and
    # direct reads)
    READ_BOUNCE_MAX = 512 * 1024
    # the alignment of a direct read's offset, length and buffer (every Linux file system's
    # logical block size divides it)
    DIRECT_ALIGN = 4096

cdef void c_par_copy(char* dst, const char* src, long long n, int threads,
                     bint nontemporal, int pieces) noexcept nogil
cdef int c_par_copy_list(const Segment* segs, long long nsegs, int threads,
                         bint nontemporal, int pieces, long long read_bounce) noexcept nogil
cdef long long c_copy_begin(int threads) noexcept nogil
cdef void c_copy_end(long long epoch) noexcept nogil
cdef int c_cpu_count() except -1
