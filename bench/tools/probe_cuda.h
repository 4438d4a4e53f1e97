/* What the driver-level probes (probe_file_io.c, probe_tiny.c) share: the libcuda
   functions they call, opened at run time (no CUDA headers or toolkit needed), error
   checks and a monotonic clock. */
#ifndef ETPTR_PROBE_CUDA_H
#define ETPTR_PROBE_CUDA_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int*, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void**, int);
static CUresult (*cuCtxSetCurrent)(void*);
static CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
static CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, void*);
static CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, void*);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
static CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
static CUresult (*cuStreamCreate)(void**, unsigned);
static CUresult (*cuStreamSynchronize)(void*);
static CUresult (*cuEventCreate)(void**, unsigned);
static CUresult (*cuEventRecord)(void*, void*);
static CUresult (*cuEventSynchronize)(void*);

/* ``name`` (else ``alt``, when not NULL) in libcuda, or exit. */
static void* sym_or(void* h, const char* name, const char* alt) {
    void* p = dlsym(h, name);
    if (!p && alt) p = dlsym(h, alt);
    if (!p) { fprintf(stderr, "no %s\n", name); exit(1); }
    return p;
}
static void* sym(void* h, const char* name) { return sym_or(h, name, NULL); }

static void ck(CUresult r, const char* what) {
    if (r) { fprintf(stderr, "%s: %d\n", what, r); exit(1); }
}
#define CK(x) ck((x), #x)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* libcuda.so.1 opened and the functions above found (exit when one is missing). */
static void* load_cuda(void) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcuda.so.1\n"); exit(1); }
    cuInit = sym(h, "cuInit"); cuDeviceGet = sym(h, "cuDeviceGet");
    cuDevicePrimaryCtxRetain = sym(h, "cuDevicePrimaryCtxRetain");
    cuCtxSetCurrent = sym(h, "cuCtxSetCurrent"); cuMemAlloc = sym(h, "cuMemAlloc_v2");
    cuMemHostAlloc = sym(h, "cuMemHostAlloc");
    cuMemcpyHtoDAsync = sym(h, "cuMemcpyHtoDAsync_v2");
    cuMemcpyDtoHAsync = sym(h, "cuMemcpyDtoHAsync_v2");
    cuMemcpyHtoD = sym(h, "cuMemcpyHtoD_v2"); cuMemcpyDtoH = sym(h, "cuMemcpyDtoH_v2");
    cuStreamCreate = sym(h, "cuStreamCreate"); cuStreamSynchronize = sym(h, "cuStreamSynchronize");
    cuEventCreate = sym(h, "cuEventCreate"); cuEventRecord = sym(h, "cuEventRecord");
    cuEventSynchronize = sym(h, "cuEventSynchronize");
    return h;
}

#endif
