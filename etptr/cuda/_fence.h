/* A completion fence for small copies: the GPU writes a sequence number into a word of
   page-locked host memory after the copy (cuStreamWriteValue32, in stream order, with a
   system-scope memory barrier before the write); the host waits for the word to reach
   it by spinning, which costs less than cuStreamSynchronize for a copy of a few bytes. */
#ifndef ETPTR_FENCE_H
#define ETPTR_FENCE_H

#include <stdint.h>
#include <time.h>

static inline void etptr_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t etptr_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* 1 once *word has reached seq (in wrap-around order), 0 when budget_ns ran out first. */
static inline int etptr_fence_spin(const uint32_t* word, uint32_t seq, int64_t budget_ns) {
    const volatile uint32_t* w = (const volatile uint32_t*)word;
    int64_t deadline = 0;
    unsigned i;
    for (i = 0;; i++) {
        if ((int32_t)(*w - seq) >= 0) {
            __atomic_thread_fence(__ATOMIC_ACQUIRE);   /* what the GPU wrote before it */
            return 1;
        }
        if ((i & 31) == 31) {
            int64_t now = etptr_now_ns();
            if (deadline == 0)
                deadline = now + budget_ns;
            else if (now >= deadline)
                return 0;
        }
        etptr_cpu_relax();
    }
}

#endif
