/* Probe: how a checkpoint file's bytes reach pinned staging slots (load), how device
   bytes reach a new file (save), and what a 4-byte copy costs at the driver level.
   The driver API is called directly (libcuda.so.1, opened at run time), so this
   measures the kernel and the driver, not etptr's layers.

       cc -O2 -pthread bench/tools/probe_file_io.c -ldl -o /tmp/probe_file_io
       /tmp/probe_file_io [DIR] [MiB] [THREADS]     (default: /dev/shm 1024 15)

   Load: a DIR file of MiB MiB goes up through K=3 slots of 16 MiB (page-locked), a
   chunk's bytes filled by THREADS threads, each slot's DMA queued once it is full;
   the source is read (a) from a map already faulted in, (b) from a fresh map (what a
   new load sees), (c) by pread() into the slot, (d) from a fresh map after
   MADV_POPULATE_READ by each thread on its part. Save: MiB MiB from memory into a
   new file in DIR by (a) memcpy into a fresh shared map, (b) pwrite from THREADS
   threads, (c) pwrite from one thread, (d) fallocate, then (a). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#include "probe_cuda.h"

#define SLOT (16L << 20)
#define K 3
static long N;
static int T;

/* a crude pool: T-1 workers and the caller run job(part) for part in [0, T) */
static pthread_barrier_t go, done;
static void (*job)(int);
static void* worker(void* a) {
    int id = (int)(long)a;
    for (;;) {
        pthread_barrier_wait(&go);
        job(id);
        pthread_barrier_wait(&done);
    }
    return 0;
}
static void run_all(void (*f)(int)) {
    job = f;
    pthread_barrier_wait(&go);
    f(0);
    pthread_barrier_wait(&done);
}

/* load */
static int mode, fd;
static const char* src;
static char* slot_ptr;
static long chunk_off, chunk_len;
static void fill(int id) {
    long per = (chunk_len / T + 4095) & ~4095L;
    long a = id * per, b = a + per;
    if (b > chunk_len) b = chunk_len;
    if (a >= b) return;
    if (mode == 2) {
        long got = 0;
        while (got < b - a) {
            ssize_t r = pread(fd, slot_ptr + a + got, b - a - got, chunk_off + a + got);
            if (r <= 0) { perror("pread"); exit(1); }
            got += r;
        }
        return;
    }
    if (mode == 3) madvise((void*)(src + ((chunk_off + a) & ~4095L)), b - a, MADV_POPULATE_READ);
    memcpy(slot_ptr + a, src + chunk_off + a, b - a);
}

static double load_once(const char* path, int m, char** slots, void** ev, void* st,
                        CUdeviceptr dev, const char* premapped) {
    double t0 = now();
    mode = m;
    fd = open(path, O_RDONLY);
    const char* map = premapped;
    if (!map && m != 2) map = mmap(0, N, PROT_READ, MAP_SHARED, fd, 0);
    src = map;
    long nchunks = (N + SLOT - 1) / SLOT;
    for (long i = 0; i < nchunks; i++) {
        int j = i % K;
        if (i >= K) CK(cuEventSynchronize(ev[j]));
        chunk_off = i * SLOT;
        chunk_len = N - chunk_off < SLOT ? N - chunk_off : SLOT;
        slot_ptr = slots[j];
        run_all(fill);
        CK(cuMemcpyHtoDAsync(dev + chunk_off, slots[j], chunk_len, st));
        CK(cuEventRecord(ev[j], st));
    }
    CK(cuStreamSynchronize(st));
    if (map && !premapped) munmap((void*)map, N);
    close(fd);
    return now() - t0;
}

/* save */
static char* wsrc;
static char* wmap;
static int wmode;
static void wfill(int id) {
    long per = (N / T + 4095) & ~4095L;
    long a = id * per, b = a + per;
    if (b > N) b = N;
    if (a >= b) return;
    if (wmode == 1) {
        long put = 0;
        while (put < b - a) {
            ssize_t r = pwrite(fd, wsrc + a + put, b - a - put, a + put);
            if (r <= 0) { perror("pwrite"); exit(1); }
            put += r;
        }
        return;
    }
    if (wmode == 4) madvise(wmap + a, b - a, MADV_POPULATE_WRITE);
    memcpy(wmap + a, wsrc + a, b - a);
}

static double save_once(const char* dir, int m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/probe_save.tmp", dir);
    double t0 = now();
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (ftruncate(fd, N)) { perror("ftruncate"); exit(1); }
    wmode = m;
    if (m == 3 && fallocate(fd, 0, 0, N)) perror("fallocate");
    if (m == 2) {
        long put = 0;
        while (put < N) {
            ssize_t r = pwrite(fd, wsrc + put, N - put, put);
            if (r <= 0) { perror("pwrite"); exit(1); }
            put += r;
        }
    } else if (m == 1) {
        run_all(wfill);
    } else {
        wmap = mmap(0, N, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        run_all(wfill);
        munmap(wmap, N);
    }
    close(fd);
    double t = now() - t0;
    unlink(path);
    return t;
}

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
static double median(double* v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : "/dev/shm";
    N = (argc > 2 ? atol(argv[2]) : 1024) << 20;
    T = argc > 3 ? atoi(argv[3]) : 15;
    load_cuda();
    int d; void* ctx; void* st;
    CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d));
    CK(cuCtxSetCurrent(ctx)); CK(cuStreamCreate(&st, 1));
    CUdeviceptr dev; CK(cuMemAlloc(&dev, N));
    char* slots[K]; void* ev[K];
    for (int j = 0; j < K; j++) {
        CK(cuMemHostAlloc((void**)&slots[j], SLOT, 0));
        memset(slots[j], 0, SLOT);
        CK(cuEventCreate(&ev[j], 2));
    }
    pthread_barrier_init(&go, 0, T);
    pthread_barrier_init(&done, 0, T);
    for (long i = 1; i < T; i++) { pthread_t t; pthread_create(&t, 0, worker, (void*)i); }

    char path[4096];
    snprintf(path, sizeof path, "%s/probe_load.bin", dir);
    wsrc = malloc(N);
    for (long i = 0; i < N; i += 8) *(long*)(wsrc + i) = i * 2654435761L;
    int wfd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    for (long put = 0; put < N;) put += pwrite(wfd, wsrc + put, N - put, put);
    close(wfd);

    double v[7];
    /* the line: one pinned buffer, one DMA of 256 MiB */
    char* big; CK(cuMemHostAlloc((void**)&big, 256L << 20, 0)); memset(big, 1, 256L << 20);
    for (int r = 0; r < 7; r++) {
        double t0 = now();
        CK(cuMemcpyHtoDAsync(dev, big, 256L << 20, st)); CK(cuStreamSynchronize(st));
        v[r] = now() - t0;
    }
    printf("%s, %ld MiB, %d threads, slots %d x %ld MiB\n", dir, N >> 20, T, K, SLOT >> 20);
    printf("line: pinned 256 MiB H2D %.1f GB/s\n", (256L << 20) / median(v, 7) / 1e9);

    const char* premapped = mmap(0, N, PROT_READ, MAP_SHARED, open(path, O_RDONLY), 0);
    volatile long sink = 0;
    for (long i = 0; i < N; i += 4096) sink += premapped[i];
    const char* names[] = {"faulted map + memcpy", "fresh map + memcpy", "pread into slot",
                           "fresh map + MADV_POPULATE_READ"};
    for (int m = 0; m < 4; m++) {
        for (int r = 0; r < 7; r++)
            v[r] = load_once(path, m, slots, ev, st, dev, m == 0 ? premapped : NULL);
        printf("load %-34s %6.1f GB/s (median of 7)\n", names[m], N / median(v, 7) / 1e9);
    }
    /* host only: a fresh map's first touch vs pread, no DMA */
    const char* snames[] = {"fresh shared map + memcpy", "pwrite, all threads",
                            "pwrite, one thread", "fallocate + map + memcpy",
                            "map + MADV_POPULATE_WRITE + memcpy"};
    for (int m = 0; m < 5; m++) {
        for (int r = 0; r < 5; r++) v[r] = save_once(dir, m);
        printf("save %-34s %6.1f GB/s (median of 5)\n", snames[m], N / median(v, 5) / 1e9);
    }
    {   /* the host's own copy rate: memory to memory, all threads */
        wmap = malloc(N); memset(wmap, 0, N); wmode = 0;
        for (int r = 0; r < 5; r++) { double t0 = now(); run_all(wfill); v[r] = now() - t0; }
        printf("host memcpy (faulted anonymous memory), all threads %6.1f GB/s\n",
               N / median(v, 5) / 1e9);
    }
    unlink(path);

    /* 4 bytes: what the driver costs */
    char page[4096] = {1};
    char* pin4; CK(cuMemHostAlloc((void**)&pin4, 4096, 0));
    int reps = 20000;
    double t0;
#define TIME(label, body) do { for (int i = 0; i < 200; i++) { body; } t0 = now(); \
        for (int i = 0; i < reps; i++) { body; } \
        printf("4 bytes %-54s %6.2f us\n", label, (now() - t0) / reps * 1e6); } while (0)
    TIME("cuMemcpyHtoD (pageable, synchronous API)", CK(cuMemcpyHtoD(dev, page, 4)));
    TIME("memcpy to pinned + HtoDAsync + stream sync", (memcpy(pin4, page, 4),
         CK(cuMemcpyHtoDAsync(dev, pin4, 4, st)), CK(cuStreamSynchronize(st))));
    TIME("memcpy to pinned + HtoDAsync + event record (no wait)", (memcpy(pin4, page, 4),
         CK(cuMemcpyHtoDAsync(dev, pin4, 4, st)), CK(cuEventRecord(ev[0], st))));
    CK(cuStreamSynchronize(st));
    TIME("pageable HtoDAsync on the stream (no wait)", CK(cuMemcpyHtoDAsync(dev, page, 4, st)));
    CK(cuStreamSynchronize(st));
    TIME("DtoHAsync into pinned + stream sync", (CK(cuMemcpyDtoHAsync(pin4, dev, 4, st)),
         CK(cuStreamSynchronize(st))));
    TIME("cuMemcpyDtoH into pinned (synchronous API)", CK(cuMemcpyDtoH(pin4, dev, 4)));
    TIME("cuMemcpyDtoH into pageable (synchronous API)", CK(cuMemcpyDtoH(page, dev, 4)));
    (void)sink;
    return 0;
}
