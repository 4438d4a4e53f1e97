"""File descriptors that cannot leak: each is owned by an object that closes it (and
removes an uncommitted temporary file) when it dies.

A descriptor opened in Python code and stored in a variable can be lost to a
KeyboardInterrupt that lands between the open returning and the store, or inside
the cleanup that would close it. Here the open and the store are one C step (no
signal handler runs between them), and the object's deallocation is the cleanup
of last resort: the ``with`` block or an explicit :meth:`close` closes at once, and
an object dropped any other way (an interrupt anywhere, a traceback cleared)
closes as it dies.

:class:`ReadOnlyFile` is a file opened for reading (the loader's); :class:`TempFile`
is a new file under a temporary name beside its target, renamed over the target by
:meth:`TempFile.commit` once complete (the saver's), and removed otherwise.
"""
cimport cython
from libc.errno cimport EEXIST, EINTR, errno

import os

cdef extern from "<fcntl.h>" nogil:
    int c_open "open"(const char* path, int flags, ...)
    enum:
        O_DIRECT
        O_RDONLY
        O_RDWR
        O_CREAT
        O_EXCL
        O_CLOEXEC
        O_NONBLOCK

cdef extern from "<unistd.h>" nogil:
    int close(int fd)
    int unlink(const char* path)
    int fsync(int fd)
    long sysconf(int name)
    enum:
        _SC_PAGESIZE

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long long offset)
    int munmap(void* addr, size_t length)
    int mincore(void* addr, size_t length, unsigned char* vec)
    enum:
        PROT_READ
        MAP_SHARED
    void* MAP_FAILED


cdef int _open(bytes path, int flags, int mode) noexcept:
    """open(2), retried on EINTR; the descriptor, or -1 with errno set."""
    cdef const char* p = path
    cdef int fd
    with nogil:
        while True:
            fd = c_open(p, flags, mode)
            if fd >= 0 or errno != EINTR:
                break
    return fd


cdef object _os_error(object path):
    return OSError(errno, os.strerror(errno), os.fsdecode(path))


@cython.final
cdef class ReadOnlyFile:
    """ReadOnlyFile(path, direct=False)

    ``path`` opened read-only (``O_CLOEXEC``; ``O_NONBLOCK``, so that a path that has
    become a FIFO does not block the open); ``direct``: with ``O_DIRECT`` too (reads then
    bypass the page cache and must be aligned: see the host copy threads' direct
    segments). Closed by :meth:`close`, at the end of a ``with`` block, or when the
    object dies.

    Raises
    ------
    OSError
        The open failed (``FileNotFoundError``, ``PermissionError``; ``EINVAL`` where
        the file system takes no ``O_DIRECT``).
    ValueError
        ``path`` holds a NUL byte.
    """
    cdef int fd
    cdef bytes path

    def __cinit__(self):
        self.fd = -1

    def __init__(self, path, bint direct=False):
        self.path = os.fsencode(path)
        if b"\0" in self.path:
            raise ValueError(f"{path!r}: a path may not hold a NUL byte")
        self.fd = _open(self.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK |
                        (O_DIRECT if direct else 0), 0)
        if self.fd < 0:
            raise _os_error(self.path)

    def resident(self, long long offset, long long length):
        """Which pages of bytes ``[offset, offset + length)`` of the file are in the page
        cache now (``mincore`` over a map of the range, whose pages are not touched):
        ``(first_page_offset, page_bytes, bytes of 0/1 per page)``.

        Raises
        ------
        OSError
            The map or ``mincore`` failed.
        """
        cdef long long page = sysconf(_SC_PAGESIZE)
        cdef long long start = offset - offset % page
        cdef long long span = offset + length - start
        cdef long long pages = (span + page - 1) // page
        cdef void* addr
        cdef int rc
        out = bytearray(pages)
        cdef unsigned char[::1] vec = out
        if pages == 0:
            return start, page, bytes(out)
        addr = mmap(NULL, <size_t>span, PROT_READ, MAP_SHARED, self.fd, start)
        if addr == MAP_FAILED:
            raise _os_error(self.path)
        rc = mincore(addr, <size_t>span, &vec[0])
        err = errno
        munmap(addr, <size_t>span)
        if rc != 0:
            raise OSError(err, os.strerror(err), os.fsdecode(self.path))
        for i in range(pages):
            vec[i] &= 1
        return start, page, bytes(out)

    def fileno(self):
        """The descriptor (-1 once closed)."""
        return self.fd

    def close(self):
        """Close the descriptor; idempotent."""
        cdef int fd = self.fd
        self.fd = -1
        if fd >= 0:
            close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __dealloc__(self):
        if self.fd >= 0:
            close(self.fd)


cdef int _name_max(bytes directory) except -1:
    try:
        return os.pathconf(directory or b".", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


@cython.final
cdef class TempFile:
    """TempFile(final)

    A new, empty file under a temporary name in ``final``'s directory (a dot file named
    after ``final``, cut to fit the file system's name limit in bytes), open for
    reading and writing. :meth:`commit` closes it and renames it over ``final``;
    :meth:`discard`, the end of a ``with`` block without a commit, or the object's
    death close it and remove the temporary file.

    Raises
    ------
    OSError
        The file could not be created (no free temporary name after 16 tries gives
        ``FileExistsError``).
    ValueError
        ``final`` holds a NUL byte.
    """
    cdef int fd
    cdef bytes tmp
    cdef bytes final
    cdef bint committed

    def __cinit__(self):
        self.fd = -1

    def __init__(self, final):
        cdef bytes head, tail, stem, name
        cdef int room, k
        self.final = os.fsencode(final)
        if b"\0" in self.final:
            raise ValueError(f"{final!r}: a path may not hold a NUL byte")
        head, tail = os.path.split(self.final)
        # "." + stem + "." + 12 hex digits + ".tmp" within the name limit, cut on a
        # UTF-8 character boundary
        room = _name_max(head) - 18
        stem = tail[:room].decode("utf-8", "ignore").encode("utf-8") if room > 0 else b""
        for k in range(16):
            name = b"." + stem + b"." + os.urandom(6).hex().encode() + b".tmp"
            self.tmp = os.path.join(head, name)
            self.fd = _open(self.tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
            if self.fd >= 0:
                return
            if errno != EEXIST:
                raise _os_error(self.tmp)
        self.tmp = None
        raise FileExistsError(EEXIST, "no free temporary name", os.fsdecode(head or b"."))

    @property
    def path(self):
        """The temporary file's path (str)."""
        return os.fsdecode(self.tmp) if self.tmp is not None else None

    def fileno(self):
        """The descriptor (-1 once committed or discarded)."""
        return self.fd

    def commit(self, bint durable=False):
        """Close the file (``fsync`` first when ``durable``) and rename it over ``final``.

        Raises
        ------
        OSError
            The sync or the rename failed; the temporary file is then removed.
        """
        cdef int fd = self.fd
        if self.committed or self.tmp is None:
            raise ValueError("the file was committed or discarded already")
        if durable and fd >= 0 and fsync(fd) != 0:
            error = _os_error(self.tmp)
            self.discard()
            raise error
        self.fd = -1
        if fd >= 0:
            close(fd)
        try:
            os.replace(self.tmp, self.final)
        except BaseException:
            self.discard()
            raise
        self.committed = True

    def discard(self):
        """Close the file and remove it; idempotent, and nothing after a commit."""
        cdef int fd = self.fd
        self.fd = -1
        if fd >= 0:
            close(fd)
        if not self.committed and self.tmp is not None:
            unlink(<const char*>self.tmp)
            self.tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.discard()
        return False

    def __dealloc__(self):
        if self.fd >= 0:
            close(self.fd)
        if not self.committed and self.tmp is not None:
            unlink(<const char*>self.tmp)
