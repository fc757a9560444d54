/* Known heap allocation sites, for the heap tracer's end-to-end tests.
 *
 * heapsites SCALE: prints "ready", waits for a line on stdin ("exit" ends
 * it there), then
 * allocates (every site in its own function, SCALE times over), prints
 * "done", and waits for another line before exiting (so a tracer can take
 * its picture while everything is live). What each site holds at "done":
 *
 *   big_blocks       4S x 256 KiB  = 1024 KiB x S
 *   leak_steadily   16S x  32 KiB  =  512 KiB x S  (in 8 rounds, 50 ms apart)
 *   small_blocks    64S x   4 KiB  =  256 KiB x S
 *   grow_by_realloc  4S x  32 KiB  =  128 KiB x S  (each grown 1 KiB -> 32 KiB)
 *   zeroed_blocks    4S x  16 KiB  =   64 KiB x S  (calloc)
 *   aligned_blocks   4S x   8 KiB  =   32 KiB x S  (posix_memalign)
 *   mapped_blocks    2S x  12 KiB  =   24 KiB x S  (anonymous mmap)
 *   remapped_blocks   S x   8 KiB  =    8 KiB x S  (mmap 4 KiB, mremap to 8 KiB)
 *
 * plus churn (malloc + free, mmap + munmap: nothing live) and free(NULL). Then "grow"
 * makes grow_until_killed take and touch 1 MiB every 50 ms, forever (run it
 * in a memory cgroup with a limit); any other line frees all and exits.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static void **keep;
static size_t kept, malloced;

static void hold(void *p) {
    if (!p) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    keep[kept++] = p;
}

__attribute__((noinline)) static void big_blocks(int s) {
    for (int i = 0; i < 4 * s; i++) hold(malloc(256 << 10));
}

__attribute__((noinline)) static void leak_steadily(int s) {
    struct timespec pause = {0, 50 * 1000 * 1000};
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < 2 * s; i++) hold(malloc(32 << 10));
        nanosleep(&pause, NULL);
    }
}

__attribute__((noinline)) static void small_blocks(int s) {
    for (int i = 0; i < 64 * s; i++) hold(malloc(4 << 10));
}

__attribute__((noinline)) static void grow_by_realloc(int s) {
    for (int i = 0; i < 4 * s; i++) {
        void *p = NULL;
        for (size_t n = 1 << 10; n <= 32 << 10; n *= 2) {
            void *q = realloc(p, n);
            if (!q) exit(2);
            p = q;
        }
        hold(p);
    }
}

__attribute__((noinline)) static void zeroed_blocks(int s) {
    for (int i = 0; i < 4 * s; i++) hold(calloc(16, 1 << 10));
}

__attribute__((noinline)) static void aligned_blocks(int s) {
    for (int i = 0; i < 4 * s; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 64, 8 << 10)) exit(2);
        hold(p);
    }
}

static inline __attribute__((always_inline)) void *map(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(2);
    return p;
}

__attribute__((noinline)) static void mapped_blocks(int s) {
    for (int i = 0; i < 2 * s; i++) keep[kept++] = map(12 << 10);
}

__attribute__((noinline)) static void remapped_blocks(int s) {
    for (int i = 0; i < s; i++) {
        void *p = map(4 << 10);
        void *q = mremap(p, 4 << 10, 8 << 10, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) exit(2);
        keep[kept++] = q;
    }
}

__attribute__((noinline)) static void churn(int s) {
    for (int i = 0; i < 64 * s; i++) {
        char *p = malloc(1 << 10);
        if (!p) exit(2);
        p[0] = 1;
        free(p);
        free(NULL);
    }
    for (int i = 0; i < s; i++) munmap(map(64 << 10), 64 << 10);
}

__attribute__((noinline)) static void grow_until_killed(void) {
    struct timespec pause = {0, 50 * 1000 * 1000};
    for (;;) {
        char *p = malloc(1 << 20);
        if (!p) exit(2);
        memset(p, 1, 1 << 20);
        nanosleep(&pause, NULL);
    }
}

__attribute__((noinline)) static void run(int s) {
    big_blocks(s);
    leak_steadily(s);
    small_blocks(s);
    grow_by_realloc(s);
    zeroed_blocks(s);
    aligned_blocks(s);
    mapped_blocks(s);
    remapped_blocks(s);
    churn(s);
}

int main(int argc, char **argv) {
    int s = argc > 1 ? atoi(argv[1]) : 1;
    char line[64];
    keep = calloc((size_t)128 * s, sizeof(void *));
    if (!keep || s < 1) return 2;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    if (!strncmp(line, "exit", 4)) return 0;
    run(s);
    printf("done %zu\n", kept);
    malloced = kept - 3 * (size_t)s;
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    if (!strncmp(line, "grow", 4)) grow_until_killed();
    /* The mappings are the last 3S entries: left to exit. */
    for (size_t i = 0; i < malloced; i++) free(keep[i]);
    return 0;
}
