/* A stand-in for libcuda.so.1, so that etptr's CUDA paths run on machines without a GPU.
   tests/fakes/_fake_libcuda.py builds it with

       cc -O2 -shared -fPIC -pthread -Wl,-soname,libcuda.so.1 tests/fakes/fakecuda.c -o libcuda.so.1

   and loads it before etptr looks for libcuda; tests/fakes/fakecupy.py, the stand-in for
   CuPy's Python API, calls it as CuPy's runtime calls the real driver.

   The driver starts uninitialised: until cuInit every other call returns
   CUDA_ERROR_NOT_INITIALIZED. There are fake_devices devices, each with a primary
   context (cuDevicePrimaryCtxRetain; fake_contexts has a bit for each one retained since
   fake_reset_contexts, which also makes every thread's current context stale).
   "Device" memory is host memory that the Python side registers (fake_register), as is
   page-locked memory. Each stream is a FIFO worked by its own thread with a random delay
   per operation, so copies really are asynchronous: a host that does not wait sees the
   bytes late; the legacy default stream (0) and the blocking streams wait for each
   other's earlier work, as in CUDA. Stream writes (cuStreamWriteValue32/64) and etptr's
   one kernel (etptr_copy_pieces: a device table of {u64 src, dst, n} pieces and a count,
   each piece moved with memmove) run in stream order. A child forked after cuInit gets
   CUDA_ERROR_NOT_INITIALIZED from every call, as from the real driver.

   For the tests: fake_calls counts every call; a log (fake_log_on) records each accepted
   copy (direction, bytes, addresses, stream, the current device, whether the host side
   is page-locked), stream and event synchronisation, stream waits, writes, launches and
   marks the tests make (fake_log_mark). Fault injection: copy calls refused with
   FAKE_INJECTED once fake_fail_copies_after more have been accepted; a sticky error after
   N executed copies; fixed return codes for stream writes; modules that do not load. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOT_INITIALIZED 3          /* CUDA_ERROR_NOT_INITIALIZED */
#define INVALID_VALUE 1            /* CUDA_ERROR_INVALID_VALUE */
#define INVALID_DEVICE 101         /* CUDA_ERROR_INVALID_DEVICE */
#define INVALID_CONTEXT 201        /* CUDA_ERROR_INVALID_CONTEXT */
#define NO_BINARY_FOR_GPU 209      /* CUDA_ERROR_NO_BINARY_FOR_GPU */
#define INVALID_HANDLE 400         /* CUDA_ERROR_INVALID_HANDLE */
#define NOT_FOUND 500              /* CUDA_ERROR_NOT_FOUND */
#define NOT_READY 600              /* CUDA_ERROR_NOT_READY */
#define ILLEGAL_ADDRESS 700        /* CUDA_ERROR_ILLEGAL_ADDRESS */
#define FAKE_INJECTED 9999         /* no CUresult: a copy call refused on purpose */

enum { OP_COPY, OP_WRITE32, OP_WRITE64, OP_KERNEL, OP_WAIT };

typedef struct Stream Stream;
typedef struct Op {
    int kind;
    uintptr_t dst, src;       /* a kernel's table is src */
    size_t n;                 /* a kernel's piece count */
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
    int nonblocking;          /* made with CU_STREAM_NON_BLOCKING */
    int destroyed;            /* cuStreamDestroy: its thread ends once the queue is empty */
    pthread_t th;
    Stream* next;
};

typedef struct Event {
    uintptr_t handle;
    int device;
    Stream* s;
    uint64_t target;
    struct Event* next;
} Event;

typedef struct Region { uintptr_t base; size_t size; int type; int managed; } Region;

#define MAX_REGIONS 65536
static pthread_mutex_t g = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gc = PTHREAD_COND_INITIALIZER;
static Stream* streams;
static Event* events;
static Region regions[MAX_REGIONS];
static int nregions;
static uintptr_t next_handle = 0x10000;

/* knobs and counters */
int fake_devices = 2;           /* devices cuDeviceGet knows */
int fake_initialised = 0;       /* cuInit was called */
int fake_forked = 0;            /* a child forked after cuInit: every call fails */
unsigned long long fake_contexts = 0;   /* bit d: device d's primary context retained */
int fake_kernels = 1;           /* 0: cuModuleLoadData fails (a driver without PTX) */
int fake_delay_max_us = 50;     /* per-op delay, uniform in [0, max] */
int fake_sticky = 0;            /* the context's sticky error (0: none) */
long fake_fail_after = -1;      /* executed copies before a sticky 700 (-1: never) */
long fake_fail_copies_after = -1;   /* copy calls accepted before each one is refused
                                       with FAKE_INJECTED (-1: never) */
int fake_write_rc = 0;          /* returned by cuStreamWriteValue* (0: work normally) */
int fake_write_host_rc = 0;     /* returned by cuStreamWriteValue32 to host memory */
int fake_write64_rc = 0;        /* returned by cuStreamWriteValue64 only */
long fake_calls = 0;            /* every call made (cuGetErrorName included) */
long fake_writes = 0, fake_writes64 = 0, fake_copies = 0, fake_syncs = 0, fake_overruns = 0;
long fake_bad_device = 0, fake_launches = 0;
long fake_stale_regions = 0;       /* registered regions a new one overlapped */

/* ---------------------------------------------------------------- the call log */
enum { LOG_HTOD = 1, LOG_DTOH, LOG_DTOD, LOG_STREAM_SYNC, LOG_EVENT_SYNC, LOG_WAIT,
       LOG_WRITE32, LOG_WRITE64, LOG_MARK, LOG_LAUNCH };

typedef struct FakeCall {
    int what;                 /* LOG_... */
    int pinned;               /* copies: the host side is registered page-locked memory */
    int device;               /* the calling thread's current device (-1: none) */
    int pad;
    uint64_t nbytes;          /* copies: bytes; writes: the value; launches: pieces */
    uint64_t dst, src;        /* copies: addresses; writes: dst; launches: src = table */
    uint64_t handle;          /* the stream (for event syncs: the event) */
} FakeCall;

int fake_log_on = 0;
static FakeCall* log_calls;
static long log_len, log_cap;

static int current_device(void);

static void log_locked(int what, uint64_t dst, uint64_t src, uint64_t n, void* handle,
                       int pinned, int device) {
    if (!fake_log_on) return;
    if (log_len == log_cap) {
        long cap = log_cap ? 2 * log_cap : 4096;
        FakeCall* grown = realloc(log_calls, (size_t)cap * sizeof(FakeCall));
        if (!grown) { fprintf(stderr, "fakecuda: the call log is full\n"); abort(); }
        log_calls = grown;
        log_cap = cap;
    }
    FakeCall* c = &log_calls[log_len++];
    memset(c, 0, sizeof *c);
    c->what = what; c->pinned = pinned; c->device = device;
    c->nbytes = n; c->dst = dst; c->src = src; c->handle = (uint64_t)(uintptr_t)handle;
}

static void log_call(int what, uint64_t dst, uint64_t src, uint64_t n, void* handle,
                     int pinned) {
    int device = current_device();
    pthread_mutex_lock(&g);
    log_locked(what, dst, src, n, handle, pinned, device);
    pthread_mutex_unlock(&g);
}

long fake_log_length(void) {
    pthread_mutex_lock(&g);
    long n = log_len;
    pthread_mutex_unlock(&g);
    return n;
}

/* Up to ``max`` entries from ``from`` into ``out``; how many. */
long fake_log_read(FakeCall* out, long from, long max) {
    pthread_mutex_lock(&g);
    long n = 0;
    if (from >= 0 && from < log_len) {
        n = log_len - from < max ? log_len - from : max;
        memcpy(out, log_calls + from, (size_t)n * sizeof(FakeCall));
    }
    pthread_mutex_unlock(&g);
    return n;
}

void fake_log_clear(void) {
    pthread_mutex_lock(&g);
    log_len = 0;
    pthread_mutex_unlock(&g);
}

void fake_log_mark(uint64_t tag) { log_call(LOG_MARK, 0, 0, tag, NULL, 0); }

/* ---------------------------------------------------------------- memory */
void fake_register(uintptr_t base, size_t size, int type, int managed) {
    pthread_mutex_lock(&g);
    for (int i = 0; i < nregions; i++)      /* memory freed without fake_unregister */
        if (regions[i].base < base + size && base < regions[i].base + regions[i].size) {
            fake_stale_regions++;
            regions[i--] = regions[--nregions];
        }
    if (nregions == MAX_REGIONS) {
        fprintf(stderr, "fakecuda: more than %d registered regions\n", MAX_REGIONS);
        abort();
    }
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

/* 1 when [p, p + n) lies in one registered region (device or page-locked memory) */
static int known_locked(uintptr_t p, size_t n) {
    Region* r = find_locked(p);
    return r && p + n <= r->base + r->size;
}

/* ---------------------------------------------------------------- streams */
static unsigned rnd(void) {
    static __thread unsigned s = 0;
    if (!s) s = (unsigned)(uintptr_t)&s ^ (unsigned)time(NULL);
    s = s * 1103515245u + 12345u;
    return s >> 8;
}

typedef struct Piece { uint64_t src, dst, n; } Piece;

/* etptr_copy_pieces, run by a stream's thread: a piece outside memory the driver knows
   is an illegal address (sticky, as on a GPU) */
static void run_kernel(uintptr_t table, size_t count) {
    pthread_mutex_lock(&g);
    int ok = known_locked(table, count * sizeof(Piece));
    for (size_t i = 0; ok && i < count; i++) {
        const Piece* p = (const Piece*)table + i;
        ok = known_locked(p->src, p->n) && known_locked(p->dst, p->n);
    }
    if (!ok) {
        fake_sticky = ILLEGAL_ADDRESS;
        fake_bad_device++;
        fprintf(stderr, "fakecuda: etptr_copy_pieces read or wrote memory the driver does "
                "not know\n");
    }
    pthread_mutex_unlock(&g);
    for (size_t i = 0; ok && i < count; i++) {
        const Piece* p = (const Piece*)table + i;
        memmove((void*)(uintptr_t)p->dst, (const void*)(uintptr_t)p->src, p->n);
    }
}

static void* worker(void* arg) {
    Stream* s = arg;
    for (;;) {
        pthread_mutex_lock(&g);
        while (s->head == NULL && !s->destroyed) pthread_cond_wait(&gc, &g);
        if (s->head == NULL) {             /* destroyed and drained: out of the list */
            Stream** at = &streams;
            while (*at && *at != s) at = &(*at)->next;
            if (*at) *at = s->next;
            pthread_mutex_unlock(&g);
            return NULL;          /* (the Stream is kept: events and waits may name it) */
        }
        Op* op = s->head;
        pthread_mutex_unlock(&g);
        if (fake_delay_max_us > 0) {
            unsigned us = rnd() % (unsigned)(fake_delay_max_us + 1);
            struct timespec t = {0, (long)us * 1000};
            nanosleep(&t, NULL);
        }
        if (op->kind == OP_WAIT) {
            pthread_mutex_lock(&g);
            while (op->wait_s->done < op->wait_target) pthread_cond_wait(&gc, &g);
            pthread_mutex_unlock(&g);
        } else if (!__atomic_load_n(&fake_sticky, __ATOMIC_SEQ_CST)) {
            if (op->kind == OP_COPY) {
                pthread_mutex_lock(&g);
                int fail = 0;
                if (fake_fail_after >= 0) {
                    if (fake_fail_after == 0) fail = 1; else fake_fail_after--;
                }
                if (fail) fake_sticky = ILLEGAL_ADDRESS;
                pthread_mutex_unlock(&g);
                if (!fail) memmove((void*)op->dst, (void*)op->src, op->n);
            } else if (op->kind == OP_WRITE32) {
                __atomic_store_n((uint32_t*)op->dst, (uint32_t)op->val, __ATOMIC_SEQ_CST);
            } else if (op->kind == OP_WRITE64) {
                __atomic_store_n((uint64_t*)op->dst, op->val, __ATOMIC_SEQ_CST);
            } else if (op->kind == OP_KERNEL) {
                run_kernel(op->src, op->n);
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
}

static Stream* new_stream_locked(uintptr_t h) {
    Stream* s = calloc(1, sizeof(Stream));
    s->handle = h;
    s->next = streams;
    streams = s;
    pthread_create(&s->th, NULL, worker, s);
    pthread_detach(s->th);
    return s;
}

/* The stream ``h``: any handle names one (a test may queue on stream 0x77), made on
   first use (a blocking stream) unless cuStreamCreate made it */
static Stream* stream_locked(uintptr_t h) {
    for (Stream* s = streams; s; s = s->next)
        if (s->handle == h && !s->destroyed) return s;
    return new_stream_locked(h);
}

static uint64_t push_locked(Stream* s, Op* op) {
    op->next = NULL;
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    return ++s->submitted;
}

static void wait_for_locked(Stream* s, Stream* other) {
    if (other == s || other->done >= other->submitted) return;
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_WAIT; op->wait_s = other; op->wait_target = other->submitted;
    push_locked(s, op);
}

/* The legacy default stream (handle 0) and the blocking streams: work queued on one of
   them waits for the work queued before it on the other kind */
static void implicit_waits_locked(Stream* s) {
    if (s->nonblocking) return;
    for (Stream* o = streams; o; o = o->next)
        if (!o->nonblocking && (s->handle == 0) != (o->handle == 0)) wait_for_locked(s, o);
}

static Event* event_locked(uintptr_t h) {
    for (Event* e = events; e; e = e->next)
        if (e->handle == h) return e;
    return NULL;
}

static uint64_t enqueue(void* stream, Op* op) {
    pthread_mutex_lock(&g);
    Stream* s = stream_locked((uintptr_t)stream);
    implicit_waits_locked(s);
    uint64_t n = push_locked(s, op);
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

/* ---------------------------------------------------------------- init, fork */
/* Every entry point but cuGetErrorName starts with ENTER: counts the call and refuses
   it before cuInit and in a child forked after it. */
#define ENTER() do { \
        __atomic_fetch_add(&fake_calls, 1, __ATOMIC_SEQ_CST); \
        if (fake_forked || !fake_initialised) return NOT_INITIALIZED; \
    } while (0)

int cuInit(unsigned int flags) {
    __atomic_fetch_add(&fake_calls, 1, __ATOMIC_SEQ_CST);
    if (fake_forked) return NOT_INITIALIZED;
    fake_initialised = 1;
    return 0;
}

/* The lock is taken around fork(), so that a child never inherits it held by a thread it
   lacks; the child has none of the parent's stream threads. */
static void before_fork(void) { pthread_mutex_lock(&g); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&g);
    pthread_cond_init(&gc, NULL);      /* no waiter of the parent's is here */
    if (fake_initialised) fake_forked = 1;
}

__attribute__((constructor)) static void at_load(void) {
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---------------------------------------------------------------- contexts */
/* A context handle: (generation << 16) | 0x100 | device. One of an older generation
   (before fake_reset_contexts) is no context. */
static unsigned generation = 1;
static __thread uintptr_t cur_ctx;

static uintptr_t live_ctx(void) {
    return (cur_ctx >> 16) == generation ? cur_ctx : 0;
}

static int current_device(void) {
    uintptr_t c = live_ctx();
    return c ? (int)(c & 0xff) : -1;
}

void fake_reset_contexts(void) {
    pthread_mutex_lock(&g);
    generation++;
    fake_contexts = 0;
    pthread_mutex_unlock(&g);
}

int cuCtxGetCurrent(void** c) { ENTER(); *c = (void*)live_ctx(); return 0; }
int cuCtxSetCurrent(void* c) { ENTER(); cur_ctx = (uintptr_t)c; return 0; }
int cuCtxGetDevice(int* d) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    *d = current_device();
    return 0;
}
int cuDeviceGetCount(int* n) { ENTER(); *n = fake_devices; return 0; }
int cuDeviceGet(int* d, int o) {
    ENTER();
    if (o < 0 || o >= fake_devices) return INVALID_DEVICE;
    *d = o;
    return 0;
}
int cuDevicePrimaryCtxRetain(void** c, int d) {
    ENTER();
    if (d < 0 || d >= fake_devices || d > 63) return INVALID_DEVICE;
    pthread_mutex_lock(&g);
    fake_contexts |= 1ull << d;
    *c = (void*)(((uintptr_t)generation << 16) | 0x100 | (uintptr_t)d);
    pthread_mutex_unlock(&g);
    return 0;
}

/* ---------------------------------------------------------------- streams and events */
int cuStreamCreate(void** s, unsigned int flags) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    pthread_mutex_lock(&g);
    next_handle += 16;
    Stream* st = new_stream_locked(next_handle);
    st->nonblocking = flags & 1;
    *s = (void*)st->handle;
    pthread_mutex_unlock(&g);
    return 0;
}

int cuStreamDestroy_v2(void* h) {
    ENTER();
    pthread_mutex_lock(&g);
    Stream* s = streams;
    while (s && (s->handle != (uintptr_t)h || s->destroyed)) s = s->next;
    if (s) {                   /* its thread ends once its work is done */
        s->destroyed = 1;
        pthread_cond_broadcast(&gc);
    }
    pthread_mutex_unlock(&g);
    return s ? 0 : INVALID_HANDLE;
}

int cuEventCreate(void** e, unsigned int flags) {
    ENTER();
    int device = current_device();
    if (device < 0) return INVALID_CONTEXT;
    Event* ev = calloc(1, sizeof(Event));
    pthread_mutex_lock(&g);
    next_handle += 16;
    ev->handle = next_handle;
    ev->device = device;
    ev->next = events;
    events = ev;
    pthread_mutex_unlock(&g);
    *e = (void*)ev->handle;
    return 0;
}

int cuEventDestroy_v2(void* e) {
    ENTER();
    pthread_mutex_lock(&g);
    Event** at = &events;
    while (*at && (*at)->handle != (uintptr_t)e) at = &(*at)->next;
    Event* ev = *at;
    if (ev) *at = ev->next;
    pthread_mutex_unlock(&g);
    free(ev);
    return ev ? 0 : INVALID_HANDLE;
}

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

/* 1: this copy call is refused (FAKE_INJECTED) */
static int refused(void) {
    pthread_mutex_lock(&g);
    int refuse = fake_fail_copies_after == 0;
    if (fake_fail_copies_after > 0) fake_fail_copies_after--;
    pthread_mutex_unlock(&g);
    return refuse;
}

int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* s) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (refused()) return FAKE_INJECTED;
    if (!check_dev(dst, n)) return INVALID_VALUE;
    __atomic_fetch_add(&fake_copies, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_COPY; op->dst = dst; op->n = n;
    int pinned = host_pinned((uintptr_t)src, n);
    if (pinned) {
        op->src = (uintptr_t)src;
    } else {               /* pageable: staged, read before return */
        op->staging = malloc(n ? n : 1);
        memcpy(op->staging, src, n);
        op->src = (uintptr_t)op->staging;
    }
    log_call(LOG_HTOD, dst, (uintptr_t)src, n, s, pinned);
    enqueue(s, op);
    return 0;
}

int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void* s) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (refused()) return FAKE_INJECTED;
    if (!check_dev(src, n)) return INVALID_VALUE;
    __atomic_fetch_add(&fake_copies, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_COPY; op->dst = (uintptr_t)dst; op->src = src; op->n = n;
    int pinned = host_pinned((uintptr_t)dst, n);
    log_call(LOG_DTOH, (uintptr_t)dst, src, n, s, pinned);
    uint64_t k = enqueue(s, op);
    if (!pinned) {         /* pageable: synchronous */
        wait_done(s, k);
        return fake_sticky;
    }
    return 0;
}

int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void* s) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (refused()) return FAKE_INJECTED;
    if (!check_dev(src, n) || !check_dev(dst, n)) return INVALID_VALUE;
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_COPY; op->dst = dst; op->src = src; op->n = n;
    log_call(LOG_DTOD, dst, src, n, s, 0);
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
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (fake_write_rc) return fake_write_rc;
    if (addr % 4 || !writable(addr, 4, &is_host)) return INVALID_VALUE;
    if (is_host && fake_write_host_rc) return fake_write_host_rc;
    __atomic_fetch_add(&fake_writes, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_WRITE32; op->dst = addr; op->val = value;
    log_call(LOG_WRITE32, addr, 0, value, s, is_host);
    enqueue(s, op);
    return 0;
}

int cuStreamWriteValue64_v2(void* s, unsigned long long addr, unsigned long long value, unsigned int flags) {
    int is_host = 0;
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (fake_write_rc) return fake_write_rc;
    if (fake_write64_rc) return fake_write64_rc;
    if (addr % 8 || !writable(addr, 8, &is_host)) return INVALID_VALUE;
    __atomic_fetch_add(&fake_writes64, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_WRITE64; op->dst = addr; op->val = value;
    log_call(LOG_WRITE64, addr, 0, value, s, is_host);
    enqueue(s, op);
    return 0;
}

/* ---------------------------------------------------------------- kernels */
static const char KERNEL[] = "etptr_copy_pieces";
static int module_token, function_token;       /* their addresses are the handles */

int cuModuleLoadData(void** module, const void* image) {
    ENTER();
    if (!fake_kernels) return NO_BINARY_FOR_GPU;
    if (!live_ctx()) return INVALID_CONTEXT;
    if (!strstr((const char*)image, KERNEL)) return NO_BINARY_FOR_GPU;
    *module = &module_token;
    return 0;
}

int cuModuleGetFunction(void** fn, void* module, const char* name) {
    ENTER();
    if (module != &module_token) return INVALID_HANDLE;
    if (strcmp(name, KERNEL) != 0) return NOT_FOUND;
    *fn = &function_token;
    return 0;
}

/* etptr_copy_pieces(const Piece* table, unsigned long long count): the parameters are
   read at the launch, the table and the pieces when the stream reaches the kernel */
int cuLaunchKernel(void* fn, unsigned int gx, unsigned int gy, unsigned int gz,
                   unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                   void* s, void** params, void** extra) {
    ENTER();
    if (!live_ctx()) return INVALID_CONTEXT;
    if (fake_sticky) return fake_sticky;
    if (fn != &function_token || params == NULL || extra != NULL) return INVALID_VALUE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return INVALID_VALUE;
    __atomic_fetch_add(&fake_launches, 1, __ATOMIC_SEQ_CST);
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_KERNEL;
    op->src = (uintptr_t)*(const unsigned long long*)params[0];
    op->n = (size_t)*(const unsigned long long*)params[1];
    log_call(LOG_LAUNCH, 0, op->src, op->n, s, 0);
    enqueue(s, op);
    return 0;
}

/* ---------------------------------------------------------------- sync */
int cuStreamSynchronize(void* s) {
    ENTER();
    __atomic_fetch_add(&fake_syncs, 1, __ATOMIC_SEQ_CST);
    log_call(LOG_STREAM_SYNC, 0, 0, 0, s, 0);
    pthread_mutex_lock(&g);
    Stream* st = stream_locked((uintptr_t)s);
    if (st->handle == 0) implicit_waits_locked(st);
    uint64_t n = st->submitted;
    pthread_cond_broadcast(&gc);
    pthread_mutex_unlock(&g);
    wait_done(s, n);
    return fake_sticky;
}

/* An event is recorded on a stream of the device it was made on (checked against the
   caller's current device, as the stand-in for CuPy always did) */
int cuEventRecord(void* e, void* s) {
    ENTER();
    if (fake_sticky) return fake_sticky;
    int device = current_device();
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    int rc = !ev || ev->device != device ? INVALID_HANDLE : 0;
    if (rc == 0) {
        Stream* st = stream_locked((uintptr_t)s);
        implicit_waits_locked(st);
        pthread_cond_broadcast(&gc);
        ev->s = st;
        ev->target = st->submitted;
    }
    pthread_mutex_unlock(&g);
    return rc;
}

int cuEventSynchronize(void* e) {
    ENTER();
    log_call(LOG_EVENT_SYNC, 0, 0, 0, e, 0);
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    while (ev && ev->s && ev->s->done < ev->target) pthread_cond_wait(&gc, &g);
    pthread_mutex_unlock(&g);
    return ev ? fake_sticky : INVALID_HANDLE;
}

int cuEventQuery(void* e) {
    int rc = 0;
    ENTER();
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    if (!ev) rc = INVALID_HANDLE;
    else if (ev->s && ev->s->done < ev->target) rc = NOT_READY;
    pthread_mutex_unlock(&g);
    return fake_sticky && rc != INVALID_HANDLE ? fake_sticky : rc;
}

int cuStreamWaitEvent(void* s, void* e, unsigned int flags) {
    ENTER();
    if (fake_sticky) return fake_sticky;
    pthread_mutex_lock(&g);
    Event* ev = event_locked((uintptr_t)e);
    Stream* src = ev ? ev->s : NULL;
    uint64_t target = ev ? ev->target : 0;
    pthread_mutex_unlock(&g);
    if (!ev) return INVALID_HANDLE;
    log_call(LOG_WAIT, 0, 0, 0, s, 0);
    if (!src) return 0;
    Op* op = calloc(1, sizeof(Op));
    op->kind = OP_WAIT; op->wait_s = src; op->wait_target = target;
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
    default: return INVALID_VALUE;
    }
}

int cuPointerGetAttribute(void* out, int attr, unsigned long long p) {
    ENTER();
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    Region copy;
    if (r) copy = *r;
    pthread_mutex_unlock(&g);
    if (!r) return INVALID_VALUE;
    return attr_one(out, attr, &copy);
}

int cuPointerGetAttributes(unsigned int n, int* attrs, void** data, unsigned long long p) {
    ENTER();
    pthread_mutex_lock(&g);
    Region* r = find_locked(p);
    Region copy;
    if (r) copy = *r;
    pthread_mutex_unlock(&g);
    for (unsigned i = 0; i < n; i++)
        if (attr_one(data[i], attrs[i], r ? &copy : NULL) != 0) return INVALID_VALUE;
    return 0;
}

int cuGetErrorName(int rc, const char** name) {
    __atomic_fetch_add(&fake_calls, 1, __ATOMIC_SEQ_CST);
    switch (rc) {
    case INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case NO_BINARY_FOR_GPU: *name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    case INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
    case NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case NOT_READY: *name = "CUDA_ERROR_NOT_READY"; break;
    case ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case FAKE_INJECTED: *name = "FAKECUDA_INJECTED_FAILURE"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return 0;
}
