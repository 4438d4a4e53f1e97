from libc.stdint cimport int64_t, intptr_t, uintptr_t

ctypedef int (*f_ctx_get)(void** ctx) noexcept nogil
ctypedef int (*f_ctx_set)(void* ctx) noexcept nogil
ctypedef int (*f_ctx_device)(int* dev) noexcept nogil
ctypedef int (*f_primary)(void** ctx, int dev) noexcept nogil
ctypedef int (*f_htod)(unsigned long long dst, const void* src, size_t n, void* s) noexcept nogil
ctypedef int (*f_dtoh)(void* dst, unsigned long long src, size_t n, void* s) noexcept nogil
ctypedef int (*f_dtod)(unsigned long long dst, unsigned long long src, size_t n, void* s) noexcept nogil
ctypedef int (*f_handle)(void* h) noexcept nogil
ctypedef int (*f_record)(void* event, void* stream) noexcept nogil
ctypedef int (*f_wait)(void* stream, void* event, unsigned int flags) noexcept nogil
ctypedef int (*f_attr)(void* out, int attr, unsigned long long ptr) noexcept nogil
ctypedef int (*f_write32)(void* s, unsigned long long addr, unsigned int value,
                          unsigned int flags) noexcept nogil
ctypedef int (*f_write64)(void* s, unsigned long long addr, unsigned long long value,
                          unsigned int flags) noexcept nogil
ctypedef int (*f_launch)(void* fn, unsigned int gx, unsigned int gy, unsigned int gz,
                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                         void* stream, void** params, void** extra) noexcept nogil


cdef struct Api:
    # The CUDA calls made per copy or per chunk, without the GIL: libcuda's own
    # functions, or where libcuda cannot be used (not loaded, or without a function the
    # table needs) stubs that return NO_DRIVER.
    f_ctx_get ctx_get               # cuCtxGetCurrent
    f_ctx_set ctx_set               # cuCtxSetCurrent
    f_ctx_device ctx_device         # cuCtxGetDevice
    f_primary primary               # cuDeviceGet + cuDevicePrimaryCtxRetain
    f_htod htod                     # cuMemcpyHtoDAsync
    f_dtoh dtoh                     # cuMemcpyDtoHAsync
    f_dtod dtod                     # cuMemcpyDtoDAsync
    f_handle stream_sync            # cuStreamSynchronize
    f_record event_record           # cuEventRecord
    f_handle event_sync             # cuEventSynchronize
    f_handle event_query            # cuEventQuery (0 done, NOT_READY pending)
    f_wait stream_wait_event        # cuStreamWaitEvent
    f_attr pointer_attr             # cuPointerGetAttribute
    f_launch launch                 # cuLaunchKernel
    f_write32 write32               # cuStreamWriteValue32
    f_write64 write64               # cuStreamWriteValue64
    bint driver                     # True: libcuda's functions; False: the stubs
    # Whether launch / write32 / write64 are libcuda's. Where they are not they return
    # NOT_SUPPORTED (never NULL: a copy that read the flags just before the backend
    # changed still calls something that answers).
    bint has_launch
    bint has_writes
    bint has_write64


cdef enum:
    NOT_READY = 600                  # CUDA_ERROR_NOT_READY (and cudaErrorNotReady)
    NOT_SUPPORTED = 801              # CUDA_ERROR_NOT_SUPPORTED
    NO_DRIVER = 1000                 # not a CUresult: the table's stubs (no libcuda)
    ATTR_MEMORY_TYPE = 2             # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    ATTR_RANGE_START = 11            # CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    ATTR_RANGE_SIZE = 12             # CU_POINTER_ATTRIBUTE_RANGE_SIZE
    ATTR_IS_MANAGED = 8              # CU_POINTER_ATTRIBUTE_IS_MANAGED
    MEMORY_TYPE_HOST = 1             # CU_MEMORYTYPE_HOST
    MEMORY_TYPE_DEVICE = 2           # CU_MEMORYTYPE_DEVICE


cdef Api api


cdef struct DeviceGuard:
    void* prev                # the context current before c_enter_device (may be NULL)
    bint switched             # c_enter_device made another one current


cdef bint c_forked() noexcept nogil
cdef int c_check_usable(str what) except -1
cdef object c_runtime()
cdef object c_cupy()
cdef int c_enter_device(int dev, DeviceGuard* guard) except -1
cdef int c_exit_device(DeviceGuard* guard) except -1
cdef int c_device_count() except -1
cdef int c_resolve_device(object index, str argname) except -2
cdef int c_cuda_failed(int rc, str what) except -1
cdef int c_check(int rc, str what) except -1
cdef int c_pointer_attr(void* out, int attr, uintptr_t address) noexcept nogil
cdef bint c_is_page_locked(uintptr_t address) except -1
cdef uintptr_t c_range_start(uintptr_t address) except? 0
cdef int c_check_device_range(uintptr_t address, int64_t nbytes, str argname) except -1
cdef intptr_t c_stream_handle(object stream) except? -1
cdef intptr_t c_current_stream() except? -1
cdef intptr_t c_event_create() except? 0
cdef int c_event_destroy(intptr_t event) except -1
cdef intptr_t c_stream_create() except? 0
cdef int c_stream_destroy(intptr_t stream) except -1
cdef uintptr_t c_host_alloc(int64_t nbytes) except? 0
cdef int c_host_free(uintptr_t ptr) except -1
cdef void c_keep_forever(object obj) noexcept
cdef int c_forget_on_change(dict objects) except -1
cdef void* c_module_function(bytes image, bytes name) except NULL
