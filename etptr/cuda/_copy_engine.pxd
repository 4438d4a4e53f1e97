from libc.stdint cimport int64_t, intptr_t, uintptr_t


cdef struct CopyConfig:
    int threads               # host threads copying each chunk (T)
    int64_t slot_bytes        # bytes per pinned slot: the largest chunk (S)
    int slots                 # pinned slots in flight (K)
    int64_t small_bytes       # a pageable copy up to this is one cudaMemcpyAsync


cdef struct HostList:
    # The host side of a pipelined copy made of many pieces: piece i is lens[i] bytes
    # at host[i], at offset starts[i] of the device range (sorted, not overlapping;
    # the gaps between pieces are neither read nor written on the host). With
    # ``fd >= 0`` (uploads only) the pieces are in that open file: host[i] is the
    # piece's byte offset in it, and the copy threads read it with pread(). With
    # ``dev`` not NULL the device sides are scattered too: piece i is at device address
    # dev[i], the "range" is the pieces' bytes packed in order, and each chunk's DMA is
    # one per piece it holds.
    char** host
    const int64_t* lens
    const int64_t* starts
    int64_t n
    int fd
    const uintptr_t* dev
    # With ``direct`` not NULL, piece i with direct[i] set is read through ``direct_fd``
    # (the file opened with O_DIRECT) instead of ``fd``.
    const unsigned char* direct
    int direct_fd


cdef int c_config(CopyConfig* cfg, object threads, object slot_bytes, object slots,
                  object small_bytes) except -1
cdef int c_h2d(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1
cdef int c_d2h(uintptr_t dst, uintptr_t src, int64_t nbytes, int dev, object stream,
                    CopyConfig* cfg) except -1
cdef intptr_t c_copy_stream(int dev, object stream) except? -1
cdef int c_staged(uintptr_t dev_ptr, uintptr_t host, const HostList* pieces, int64_t nbytes,
                  int dev, intptr_t stream, bint h2d, bint sync, CopyConfig* cfg,
                  object progress) except -1
cdef int c_transfer(uintptr_t dev_side, uintptr_t host, int64_t nbytes, int dev, intptr_t s,
                    bint sync, CopyConfig* cfg, bint h2d) except -1
