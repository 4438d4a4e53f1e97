/* Atomics, a spin lock, a monotonic clock and a copy with non-temporal stores, for
   etptr's host copy threads (_host_copy.pyx). */
#ifndef ETPTR_HOST_COPY_H
#define ETPTR_HOST_COPY_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline long long etptr_atomic_load(long long* p) {
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static inline long long etptr_atomic_add(long long* p, long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

/* *p = v unless *p already holds a value other than 0 (the first error wins) */
static inline void etptr_atomic_set_if_zero(long long* p, long long v) {
    long long zero = 0;
    __atomic_compare_exchange_n(p, &zero, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static inline void etptr_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void etptr_spin_lock(long long* p) {
    for (;;) {
        if (!__atomic_exchange_n(p, 1, __ATOMIC_ACQUIRE)) return;
        while (__atomic_load_n(p, __ATOMIC_RELAXED)) etptr_cpu_relax();
    }
}

static inline void etptr_spin_unlock(long long* p) {
    __atomic_store_n(p, 0, __ATOMIC_RELEASE);
}

static inline long long etptr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Copy with non-temporal (streaming) stores: the destination's lines go to memory
   without being read into the cache first or left dirty in it, so a DMA that reads
   them next does not have to pull them out of the CPU's caches. */
#if defined(__x86_64__)
#include <emmintrin.h>
static void etptr_copy_nontemporal(char* dst, const char* src, size_t n) {
    size_t head = (16 - ((size_t)dst & 15)) & 15;
    size_t blocks;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head; src += head; n -= head;
    for (blocks = n / 64; blocks; blocks--) {
        __m128i a = _mm_loadu_si128((const __m128i*)src);
        __m128i b = _mm_loadu_si128((const __m128i*)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i*)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i*)(src + 48));
        _mm_stream_si128((__m128i*)dst, a);
        _mm_stream_si128((__m128i*)(dst + 16), b);
        _mm_stream_si128((__m128i*)(dst + 32), c);
        _mm_stream_si128((__m128i*)(dst + 48), d);
        src += 64; dst += 64;
    }
    memcpy(dst, src, n & 63);
    _mm_sfence();
}
#else
static void etptr_copy_nontemporal(char* dst, const char* src, size_t n) {
    memcpy(dst, src, n);
}
#endif

/* A per-thread bounce buffer of READ_BOUNCE_MAX bytes (_host_copy.pxd; freed when its
   thread ends), for file reads that land in it and are then copied out with
   non-temporal stores. */
static pthread_key_t etptr_bounce_key;
static int etptr_bounce_key_ok = 0;

/* Made once, at import (not lazily: a fork while another thread made it could leave
   the child waiting for a key that never comes). */
static void etptr_bounce_init(void) {
    if (!etptr_bounce_key_ok)
        etptr_bounce_key_ok = pthread_key_create(&etptr_bounce_key, free) == 0;
}

/* This thread's bounce buffer of ``nbytes`` (the same in every call), or NULL when none
   can be had (read straight then). */
static char* etptr_bounce(size_t nbytes) {
    void* p;
    if (!etptr_bounce_key_ok) return NULL;
    p = pthread_getspecific(etptr_bounce_key);
    if (p == NULL) {
        if (posix_memalign(&p, 4096, nbytes) != 0) return NULL;
        if (pthread_setspecific(etptr_bounce_key, p) != 0) {
            free(p);
            return NULL;
        }
    }
    return (char*)p;
}

#endif
