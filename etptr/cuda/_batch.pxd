from libc.stdint cimport int64_t, uintptr_t

from etptr.cuda._copy_engine cimport CopyConfig


cdef int c_h2d_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, bint padded) except -1
cdef int c_d2h_batch(const uintptr_t* dst, const uintptr_t* src, const int64_t* n, int64_t count,
                     int dev, object stream, CopyConfig* cfg, bint padded) except -1
cdef int c_h2d_file(uintptr_t dst, int fd, const int64_t* file_offsets, const int64_t* starts,
                    const int64_t* n, int64_t count, int dev, object stream,
                    CopyConfig* cfg, object on_queued) except -1
