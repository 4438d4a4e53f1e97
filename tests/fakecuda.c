/* A stand-in for libcuda.so.1, so that the copy engine's libcuda-only paths (stream
   writes, the fence, tiny slots, the driver's pointer queries) run on machines without a
   GPU: tests/test_fake_libcuda.py builds it with

       cc -O2 -shared -fPIC -pthread -Wl,-soname,libcuda.so.1 tests/fakecuda.c -o libcuda.so.1

   and loads it before etptr looks for libcuda. "Device" memory is host memory that the
   Python side registers (fake_register). Each stream is a FIFO worked by its own thread
   with a random delay per operation, so copies really are asynchronous: a host that does
   not wait sees the bytes late. Stream writes (cuStreamWriteValue32/64) run in stream
   order. Fault injection: a sticky error after N executed copies; fixed return codes for
   stream writes. No kernels (cuLaunchKernel is absent, as in a driver that cannot load
   them). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct Stream Stream;
typedef struct Op {
    int kind;                 /* 0 copy, 1 write32, 2 write64, 4 wait */
    uintptr_t dst, src;
    size_t n;
    uint64_t val;
    void* staging;            /* freed after the copy */
    Stream* wait_s;
    uint64_t wait_target;
    struct Op* next;
} Op;

struct Stream {
    uintptr_t handle;
    Op *head, *tail;
    uint64_t submitted, done;
    pthread_t th;
    Stream* next;
};

typedef struct Event {
    uintptr_t handle;
    Stream* s;
    uint64_t target;
    struct Event* next;
} Event;

typedef struct Region { uintptr_t base; size_t size; int type; int managed; } Region;

static pthread_mutex_t g = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gc = PTHREAD_COND_INITIALIZER;
static Stream* streams;
static Event* events;
static Region regions[65536];
static int nregions;

/* knobs */
int fake_delay_max_us = 50;     /* per-op delay, uniform in [0, max] */
int fake_sticky = 0;            /* the context's sticky error (0: none) */
long fake_fail_after = -1;      /* executed copies before a sticky 700 (-1: never) */
int fake_write_rc = 0;          /* returned by cuStreamWriteValue* (0: work normally) */
int fake_write_host_rc = 0;     /* returned by cuStreamWriteValue32 to host memory */
int fake_write64_rc = 0;        /* returned by cuStreamWriteValue64 only */
long fake_writes = 0, fake_writes64 = 0, fake_copies = 0, fake_syncs = 0, fake_overruns = 0;
long fake_bad_device = 0;

void fake_register(uintptr_t base, size_t size, int type, int managed) {
    pthread_mutex_lock(&g);
    regions[nregions].base = base;
    regions[nregions].size = size;
    regions[nregions].type = type;
    regions[nregions].managed = managed;
    nregions++;
    pthread_mutex_unlock(&g);
}

void fake_unregister(uintptr_t base) {
    pthread_mutex_lock(&g);
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == base) { regions[i] = regions[--nregions]; break; }
    pthread_mutex_unlock(&g);
}

static Region* find_locked(uintptr_t p) {
    for (int i = 0; i < nregions; i++)
        if (regions[i].base <= p && p < regions[i].base + regions[i].size) return &regions[i];
    return NULL;
}

static unsigned rnd(void) {
    static __thread unsigned s = 0;
    if (!s) s = (unsigned)(uintptr_t)&s ^ (unsigned)time(NULL);
    s = s * 1103515245u + 12345u;
    return s >> 8;
}

static void* worker(void* arg) {
    Stream* s = arg;
    for (;;) {
        pthread_mutex_lock(&g);
        while (s->head == NULL) pthread_cond_wait(&gc, &g);
        Op* op = s->head;
        pthread_mutex_unlock(&g);
        if (fake_delay_max_us > 0) {
            unsigned us = rnd() % (unsigned)(fake_delay_max_us + 1);
            struct timespec t = {0, (long)us * 1000};
            nanosleep(&t, NULL);
        }
        if (op->kind == 4) {
            pthread_mutex_lock(&g);
            while (op->wait_s->done < op->wait_target) pthread_cond_wait(&gc, &g);
            pthread_mutex_unlock(&g);
        } else if (!__atomic_load_n(&fake_sticky, __ATOMIC_SEQ_CST)) {
            if (op->kind == 0) {
                pthread_mutex_lock(&g);
                int fail = 0;
                if (fake_fail_after >= 0) {
                    if (fake_fail_after == 0) fail = 1; else fake_fail_after--;
                }
                if (fail) fake_sticky = 700;
                pthread_mutex_unlock(&g);
                if (!fail) memmove((void*)op->dst, (void*)op->src, op->n);
            } else if (op->kind == 1) {
                __atomic_store_n((uint32_t*)op->dst, (uint32_t)op->val, __ATOMIC_SEQ_CST);
            } else if (op->kind == 2) {
                __atomic_store_n((uint64_t*)op->dst, op->val, __ATOMIC_SEQ_CST);
            }
        }
        free(op->staging);
        pthread_mutex_lock(&g);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->done++;
        pthread_cond_broadcast(&gc);
        pthread_mutex_unlock(&g);
        free(op);
    }
    return NULL;
}

static Stream* stream_locked(uintptr_t h) {
    for (Stream* s = streams; s; s = s->next)
        if (s->handle == h) return s;
    Stream* s = calloc(1, sizeof(Stream));
    s->handle = h;
    s->next = streams;
    streams = s;
    pthread_create(&s->th, NULL, worker, s);
    pthread_detach(s->th);
    return s;
}

static Event* event_locked(uintptr_t h) {
    for (Event* e = events; e; e = e->next)
        if (e->handle == h) return e;
    Event* e = calloc(1, sizeof(Event));
    e->handle = h;
    e->next = events;
    events = e;
    return e;
}

static uint64_t enqueue(void* stream, Op* op) {
    pthread_mutex_lock(&g);
    Stream* s = stream_locked((uintptr_t)stream);
    op->next = NULL;
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    uint64_t n = ++s->submitted;
    pthread_cond_broadcast(&gc);
    pthread_mutex_unlock(&g);
    return n;
}

static void wait_done(void* stream, uint64_t n) {
    pthread_mutex_lock(&g);
    Stream* s = stream_locked((uintptr_t)stream);
    while (s->done < n) pthread_cond_wait(&gc, &g);
    pthread_mutex_unlock(&g);
}

/* ---------------------------------------------------------------- contexts */
static __thread void* cur_ctx;
int cuCtxGetCurrent(void** c) { *c = cur_ctx; return 0; }
int cuCtxSetCurrent(void* c) { cur_ctx = c; return 0; }
int cuCtxGetDevice(int* d) {
    if (!cur_ctx) return 201;
    *d = (int)((uintptr_t)cur_ctx - 0x100);
    return 0;
}
int cuDeviceGet(int* d, int o) { *d = o; return 0; }
int cuDevicePrimaryCtxRetain(void** c, int d) { *c = (void*)(uintptr_t)(0x100 + d); return 0; }

/* ---------------------------------------------------------------- copies */
static int check_dev(uintptr_t p, size_t n) {
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    int ok = r && r->type == 2 && p + n <= r->base + r->size;
    pthread_mutex_unlock(&g);
    if (!ok) __atomic_fetch_add(&fake_bad_device, 1, __ATOMIC_SEQ_CST);
    return ok;
}

/* 1: host memory registered as page-locked (then bounds are checked), 0: pageable */
static int host_pinned(uintptr_t p, size_t n) {
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    int pinned = r && r->type == 1;
    if (pinned && p + n > r->base + r->size) {
        fake_overruns++;
        fprintf(stderr, "fakecuda: copy of %zu bytes at %#lx overruns the page-locked block "
                "%#lx+%zu\n", n, (unsigned long)p, (unsigned long)r->base, r->size);
    }
    pthread_mutex_unlock(&g);
    return pinned;
}

int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* s) {
    if (fake_sticky) return fake_sticky;
    if (!check_dev(dst, n)) return 1;
    __atomic_fetch_add(&fake_copies, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = 0; op->dst = dst; op->n = n;
    if (host_pinned((uintptr_t)src, n)) {
        op->src = (uintptr_t)src;
    } else {               /* pageable: staged, read before return */
        op->staging = malloc(n ? n : 1);
        memcpy(op->staging, src, n);
        op->src = (uintptr_t)op->staging;
    }
    enqueue(s, op);
    return 0;
}

int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void* s) {
    if (fake_sticky) return fake_sticky;
    if (!check_dev(src, n)) return 1;
    __atomic_fetch_add(&fake_copies, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = 0; op->dst = (uintptr_t)dst; op->src = src; op->n = n;
    int pinned = host_pinned((uintptr_t)dst, n);
    uint64_t k = enqueue(s, op);
    if (!pinned) {         /* pageable: synchronous */
        wait_done(s, k);
        return fake_sticky;
    }
    return 0;
}

int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void* s) {
    if (fake_sticky) return fake_sticky;
    if (!check_dev(src, n) || !check_dev(dst, n)) return 1;
    Op* op = calloc(1, sizeof(Op));
    op->kind = 0; op->dst = dst; op->src = src; op->n = n;
    enqueue(s, op);
    return 0;
}

static int writable(uintptr_t p, size_t n, int* is_host) {
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    int ok = r && p + n <= r->base + r->size && !r->managed;
    *is_host = r && r->type == 1;
    pthread_mutex_unlock(&g);
    return ok;
}

int cuStreamWriteValue32_v2(void* s, unsigned long long addr, unsigned int value, unsigned int flags) {
    int is_host = 0;
    if (fake_sticky) return fake_sticky;
    if (fake_write_rc) return fake_write_rc;
    if (addr % 4 || !writable(addr, 4, &is_host)) return 1;
    if (is_host && fake_write_host_rc) return fake_write_host_rc;
    __atomic_fetch_add(&fake_writes, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = 1; op->dst = addr; op->val = value;
    enqueue(s, op);
    return 0;
}

int cuStreamWriteValue64_v2(void* s, unsigned long long addr, unsigned long long value, unsigned int flags) {
    int is_host = 0;
    if (fake_sticky) return fake_sticky;
    if (fake_write_rc) return fake_write_rc;
    if (fake_write64_rc) return fake_write64_rc;
    if (addr % 8 || !writable(addr, 8, &is_host)) return 1;
    __atomic_fetch_add(&fake_writes64, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = 2; op->dst = addr; op->val = value;
    enqueue(s, op);
    return 0;
}

/* ---------------------------------------------------------------- sync */
int cuStreamSynchronize(void* s) {
    __atomic_fetch_add(&fake_syncs, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&g);
    Stream* st = stream_locked((uintptr_t)s);
    uint64_t n = st->submitted;
    pthread_mutex_unlock(&g);
    wait_done(s, n);
    return fake_sticky;
}

int cuEventRecord(void* e, void* s) {
    if (fake_sticky) return fake_sticky;
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    Stream* st = stream_locked((uintptr_t)s);
    ev->s = st;
    ev->target = st->submitted;
    pthread_mutex_unlock(&g);
    return 0;
}

int cuEventSynchronize(void* e) {
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    while (ev->s && ev->s->done < ev->target) pthread_cond_wait(&gc, &g);
    pthread_mutex_unlock(&g);
    return fake_sticky;
}

int cuEventQuery(void* e) {
    int rc = 0;
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    if (ev->s && ev->s->done < ev->target) rc = 600;
    pthread_mutex_unlock(&g);
    return fake_sticky ? fake_sticky : rc;
}

int cuStreamWaitEvent(void* s, void* e, unsigned int flags) {
    if (fake_sticky) return fake_sticky;
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    Stream* src = ev->s;
    uint64_t target = ev->target;
    pthread_mutex_unlock(&g);
    if (!src) return 0;
    Op* op = calloc(1, sizeof(Op));
    op->kind = 4; op->wait_s = src; op->wait_target = target;
    enqueue(s, op);
    return 0;
}

/* ---------------------------------------------------------------- pointers */
static int attr_one(void* out, int attr, Region* r) {
    switch (attr) {
    case 2: *(unsigned int*)out = r ? (unsigned)r->type : 0; return 0;
    case 11: *(unsigned long long*)out = r ? r->base : 0; return 0;
    case 12: *(size_t*)out = r ? r->size : 0; return 0;
    case 8: *(unsigned int*)out = r ? (unsigned)r->managed : 0; return 0;
    default: return 1;
    }
}

int cuPointerGetAttribute(void* out, int attr, unsigned long long p) {
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    Region copy;
    if (r) copy = *r;
    pthread_mutex_unlock(&g);
    if (!r) return 1;
    return attr_one(out, attr, &copy);
}

int cuPointerGetAttributes(unsigned int n, int* attrs, void** data, unsigned long long p) {
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    Region copy;
    if (r) copy = *r;
    pthread_mutex_unlock(&g);
    for (unsigned i = 0; i < n; i++)
        if (attr_one(data[i], attrs[i], r ? &copy : NULL) != 0) return 1;
    return 0;
}

int cuGetErrorName(int rc, const char** name) {
    switch (rc) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case 600: *name = "CUDA_ERROR_NOT_READY"; break;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return 0;
}
