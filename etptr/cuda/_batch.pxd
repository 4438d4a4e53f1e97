from libc.stdint cimport int64_t, uintptr_t

from etptr._core._device_allocator cimport FilePieces
from etptr.cuda._copy_engine cimport CopyConfig


cdef int c_h2d_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, int facts) except -1
cdef int c_d2h_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, int facts) except -1
cdef int c_h2d_file(uintptr_t dst, int fd, FilePieces fp, int dev, object stream,
                    CopyConfig* cfg, object progress, object on_queued, bint gaps,
                    int direct_fd) except -1
