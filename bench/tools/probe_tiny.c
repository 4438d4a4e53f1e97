/* Probe: the ways a 4-byte copy between host and device can be made, at the driver level
   (libcuda.so.1 opened at run time, so this measures the driver and the GPU, not etptr).

       cc -O2 bench/tools/probe_tiny.c -ldl -o /tmp/probe_tiny && /tmp/probe_tiny

   H2D, into device memory: a DMA from a page-locked slot or from pageable memory, a
   stream write (cuStreamWriteValue32: the value travels in the command, so the source
   has been read on return), a kernel whose argument is the value; each completed by a
   stream synchronisation, or by a flag the GPU writes into page-locked memory after it
   (the host spins on the flag), or not waited for (queued, as cudaMemcpyAsync from
   pageable memory). D2H, into page-locked memory: a DMA, or a kernel that stores the
   value and then the flag. Each line: median over 7 rounds of the mean of 4000 calls. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe_cuda.h"

static CUresult (*cuStreamWriteValue32)(void*, CUdeviceptr, uint32_t, unsigned);
static CUresult (*cuStreamWriteValue64)(void*, CUdeviceptr, uint64_t, unsigned);
static CUresult (*cuModuleLoadData)(void**, const void*);
static CUresult (*cuModuleGetFunction)(void**, void*, const char*);
static CUresult (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, void*, void**, void**);
static CUresult (*cuDeviceGetAttribute)(int*, int, int);
static CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
static CUresult (*cuPointerGetAttributes)(unsigned, int*, void**, CUdeviceptr);
static CUresult (*cuCtxGetCurrent)(void**);
static CUresult (*cuEventQuery)(void*);

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* put: *dst = val; [membar.sys; *flag = seq]. get: *dst = *src; membar.sys; *flag = seq. */
static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry put(.param .u64 dst, .param .u32 val)\n{\n"
    " .reg .b64 %rd<3>; .reg .b32 %r<2>;\n"
    " ld.param.u64 %rd1, [dst]; ld.param.u32 %r1, [val];\n"
    " cvta.to.global.u64 %rd1, %rd1;\n st.global.u32 [%rd1], %r1;\n ret;\n}\n"
    ".visible .entry put_flag(.param .u64 dst, .param .u32 val, .param .u64 flag, .param .u32 seq)\n{\n"
    " .reg .b64 %rd<3>; .reg .b32 %r<3>;\n"
    " ld.param.u64 %rd1, [dst]; ld.param.u32 %r1, [val];\n"
    " ld.param.u64 %rd2, [flag]; ld.param.u32 %r2, [seq];\n"
    " st.global.u32 [%rd1], %r1;\n membar.sys;\n st.volatile.global.u32 [%rd2], %r2;\n ret;\n}\n"
    ".visible .entry get_flag(.param .u64 dst, .param .u64 src, .param .u64 flag, .param .u32 seq)\n{\n"
    " .reg .b64 %rd<4>; .reg .b32 %r<3>;\n"
    " ld.param.u64 %rd1, [dst]; ld.param.u64 %rd2, [src];\n"
    " ld.param.u64 %rd3, [flag]; ld.param.u32 %r2, [seq];\n"
    " ld.global.u32 %r1, [%rd2];\n st.global.u32 [%rd1], %r1;\n"
    " membar.sys;\n st.volatile.global.u32 [%rd3], %r2;\n ret;\n}\n"
    ".visible .entry spin(.param .u64 n)\n{\n"
    " .reg .b64 %rd<4>; .reg .pred %p;\n"
    " ld.param.u64 %rd1, [n]; mov.u64 %rd2, %clock64;\n"
    "WAIT: mov.u64 %rd3, %clock64; sub.s64 %rd3, %rd3, %rd2; setp.lt.s64 %p, %rd3, %rd1;\n"
    " @%p bra WAIT;\n ret;\n}\n";

static volatile uint32_t* flag;
static uint32_t seq;
static void spin(void) {
    while (*flag != seq) __builtin_ia32_pause();
}

#define ROUNDS 7
#define REPS 4000
#define TIME(label, body) do { double r[ROUNDS]; \
        for (int i = 0; i < 300; i++) { body; } \
        for (int k = 0; k < ROUNDS; k++) { double t0 = now(); \
            for (int i = 0; i < REPS; i++) { body; } \
            r[k] = (now() - t0) / REPS * 1e6; } \
        CK(cuStreamSynchronize(st)); qsort(r, ROUNDS, sizeof *r, cmp); \
        printf("%-66s %6.2f us  (rounds %.2f-%.2f)\n", label, r[ROUNDS / 2], r[0], \
               r[ROUNDS - 1]); } while (0)

int main(void) {
    void* h = load_cuda();
    cuStreamWriteValue32 = sym_or(h, "cuStreamWriteValue32_v2", "cuStreamWriteValue32");
    cuStreamWriteValue64 = sym_or(h, "cuStreamWriteValue64_v2", "cuStreamWriteValue64");
    cuModuleLoadData = sym(h, "cuModuleLoadData");
    cuModuleGetFunction = sym(h, "cuModuleGetFunction");
    cuLaunchKernel = sym(h, "cuLaunchKernel");
    cuDeviceGetAttribute = sym(h, "cuDeviceGetAttribute");
    cuPointerGetAttribute = sym(h, "cuPointerGetAttribute");
    cuPointerGetAttributes = sym(h, "cuPointerGetAttributes");
    cuCtxGetCurrent = sym(h, "cuCtxGetCurrent");
    cuEventQuery = sym(h, "cuEventQuery");

    int d; void* ctx; void* st; void* ev;
    CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d));
    CK(cuCtxSetCurrent(ctx)); CK(cuStreamCreate(&st, 1)); CK(cuEventCreate(&ev, 2));
    int a64 = -1;
    cuDeviceGetAttribute(&a64, 93, d);      /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
    printf("64-bit stream memory operations: %d\n", a64);
    void* mod; void *put, *put_flag, *get_flag, *spin_k;
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&put, mod, "put"));
    CK(cuModuleGetFunction(&put_flag, mod, "put_flag"));
    CK(cuModuleGetFunction(&get_flag, mod, "get_flag"));
    CK(cuModuleGetFunction(&spin_k, mod, "spin"));

    CUdeviceptr dev; CK(cuMemAlloc(&dev, 4096));
    char page[4096] = {1};
    char* pin; CK(cuMemHostAlloc((void**)&pin, 4096, 3));   /* portable | device-mapped */
    flag = (volatile uint32_t*)(pin + 2048);
    CUdeviceptr flag_dev = (CUdeviceptr)(uintptr_t)flag;   /* unified addressing */
    uint32_t val = 7;
    CUdeviceptr dst = dev;
    CUdeviceptr src = dev + 256;
    uintptr_t out = (uintptr_t)pin;
    void* put_args[] = {&dst, &val};
    void* put_flag_args[] = {&dst, &val, &flag_dev, &seq};
    void* get_args[] = {&out, &src, &flag_dev, &seq};

    printf("## H2D, 4 bytes into device memory, completed on return\n");
    TIME("cuMemcpyHtoD, pageable (synchronous API; what ndarray.set() calls)",
         CK(cuMemcpyHtoD(dev, page, 4)));
    TIME("pinned slot: memcpy + HtoDAsync + stream sync",
         (memcpy(pin, page, 4), CK(cuMemcpyHtoDAsync(dev, pin, 4, st)),
          CK(cuStreamSynchronize(st))));
    TIME("pageable HtoDAsync + stream sync",
         (CK(cuMemcpyHtoDAsync(dev, page, 4, st)), CK(cuStreamSynchronize(st))));
    TIME("pinned slot: memcpy + HtoDAsync + flag write + spin",
         (memcpy(pin, page, 4), CK(cuMemcpyHtoDAsync(dev, pin, 4, st)), seq++,
          CK(cuStreamWriteValue32(st, flag_dev, seq, 0)), spin()));
    TIME("stream write + stream sync",
         (CK(cuStreamWriteValue32(st, dev, val, 0)), CK(cuStreamSynchronize(st))));
    TIME("stream write + event record + event sync",
         (CK(cuStreamWriteValue32(st, dev, val, 0)), CK(cuEventRecord(ev, st)),
          CK(cuEventSynchronize(ev))));
    TIME("stream write + flag write + spin",
         (CK(cuStreamWriteValue32(st, dev, val, 0)), seq++,
          CK(cuStreamWriteValue32(st, flag_dev, seq, 0)), spin()));
    TIME("stream write 64 + flag write + spin",
         (CK(cuStreamWriteValue64(st, dev, 0x0707070707070707ull, 0)), seq++,
          CK(cuStreamWriteValue32(st, flag_dev, seq, 0)), spin()));
    TIME("kernel(value) + stream sync",
         (CK(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, st, put_args, 0)),
          CK(cuStreamSynchronize(st))));
    TIME("kernel(value, flag) + spin",
         (seq++, CK(cuLaunchKernel(put_flag, 1, 1, 1, 1, 1, 1, 0, st, put_flag_args, 0)), spin()));

    printf("## H2D, 4 bytes, queued (the source has been read on return)\n");
    TIME("pageable HtoDAsync", CK(cuMemcpyHtoDAsync(dev, page, 4, st)));
    TIME("pinned slot: memcpy + HtoDAsync + event record",
         (memcpy(pin, page, 4), CK(cuMemcpyHtoDAsync(dev, pin, 4, st)),
          CK(cuEventRecord(ev, st))));
    TIME("stream write", CK(cuStreamWriteValue32(st, dev, val, 0)));
    TIME("kernel(value)", CK(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, st, put_args, 0)));

    /* queued behind a kernel that keeps the stream busy ~20 ms: does the call wait? */
    printf("## H2D, 4 bytes, queued behind a busy stream (1000 calls after a ~20 ms kernel)\n");
    unsigned long long cycles = 40000000ull;
    void* spin_args[] = {&cycles};
#define BUSY(label, body) do { CK(cuLaunchKernel(spin_k, 1, 1, 1, 1, 1, 1, 0, st, spin_args, 0)); \
        double t0 = now(); for (int i = 0; i < 1000; i++) { body; } double t1 = now(); \
        CK(cuStreamSynchronize(st)); double t2 = now(); \
        printf("%-66s %6.2f us per call (calls %.1f ms, then the stream %.1f ms)\n", label, \
               (t1 - t0) / 1000 * 1e6, (t1 - t0) * 1e3, (t2 - t1) * 1e3); } while (0)
    BUSY("pageable HtoDAsync", CK(cuMemcpyHtoDAsync(dev, page, 4, st)));
    BUSY("stream write", CK(cuStreamWriteValue32(st, dev, val, 0)));
    BUSY("pinned slot (one of 1000): memcpy + HtoDAsync",
         (memcpy(pin + 4 * (i % 500), page, 4), CK(cuMemcpyHtoDAsync(dev, pin + 4 * (i % 500), 4, st))));

    printf("## D2H, 4 bytes into page-locked memory, completed on return\n");
    TIME("cuMemcpyDtoH (synchronous API; what ndarray.get(out=) calls)",
         CK(cuMemcpyDtoH(pin, dev, 4)));
    TIME("DtoHAsync + stream sync",
         (CK(cuMemcpyDtoHAsync(pin, dev, 4, st)), CK(cuStreamSynchronize(st))));
    TIME("DtoHAsync + event record + event sync",
         (CK(cuMemcpyDtoHAsync(pin, dev, 4, st)), CK(cuEventRecord(ev, st)),
          CK(cuEventSynchronize(ev))));
    TIME("DtoHAsync + flag write + spin",
         (CK(cuMemcpyDtoHAsync(pin, dev, 4, st)), seq++,
          CK(cuStreamWriteValue32(st, flag_dev, seq, 0)), spin()));
    TIME("kernel(load, store, flag) + spin",
         (seq++, CK(cuLaunchKernel(get_flag, 1, 1, 1, 1, 1, 1, 0, st, get_args, 0)), spin()));
    TIME("kernel(load, store, flag) + stream sync",
         (seq++, CK(cuLaunchKernel(get_flag, 1, 1, 1, 1, 1, 1, 0, st, get_args, 0)),
          CK(cuStreamSynchronize(st))));

    printf("## what a copy's bookkeeping costs\n");
    unsigned long long start = 0, size = 0;
    int attrs[2] = {11, 12};        /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, _RANGE_SIZE */
    void* data[2] = {&start, &size};
    void* cur;
    TIME("cuPointerGetAttributes(range start, size) of device memory",
         cuPointerGetAttributes(2, attrs, data, dev));
    TIME("cuPointerGetAttribute(range start) of pageable memory (an error)",
         cuPointerGetAttribute(&start, 11, (CUdeviceptr)(uintptr_t)page));
    TIME("cuPointerGetAttribute(range start) of page-locked memory",
         cuPointerGetAttribute(&start, 11, (CUdeviceptr)(uintptr_t)pin));
    TIME("cuCtxGetCurrent", CK(cuCtxGetCurrent(&cur)));
    CK(cuEventRecord(ev, st)); CK(cuStreamSynchronize(st));
    TIME("cuEventSynchronize of a completed event", CK(cuEventSynchronize(ev)));
    TIME("cuEventQuery of a completed event", CK(cuEventQuery(ev)));
    TIME("cuEventRecord on an idle stream", CK(cuEventRecord(ev, st)));
    TIME("cuStreamSynchronize of an idle stream", CK(cuStreamSynchronize(st)));

    /* the values arrive */
    uint32_t got = 0, want = 0x01020304u;
    CK(cuStreamWriteValue32(st, dev, want, 0)); CK(cuStreamSynchronize(st));
    CK(cuMemcpyDtoH(&got, dev, 4));
    printf("check stream write: %s\n", got == want ? "ok" : "WRONG");
    CK(cuMemcpyHtoD(src, &want, 4)); memset(pin, 0, 4);
    seq++; CK(cuLaunchKernel(get_flag, 1, 1, 1, 1, 1, 1, 0, st, get_args, 0)); spin();
    memcpy(&got, pin, 4);
    printf("check kernel get: %s\n", got == want ? "ok" : "WRONG");
    return 0;
}
