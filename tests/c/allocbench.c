/* An allocation-heavy workload for the heap benchmarks.
 *
 * allocbench THREADS SECONDS: prints "ready", waits for a line on stdin,
 * then THREADS threads each replace a random one of 256 live blocks with a
 * new one of a mixed size (80% 16-256 B, 18% up to 4 KiB, 2% up to 64 KiB:
 * one malloc and one free per operation) for SECONDS; prints "ops N" (all
 * threads) and exits.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    uint64_t x = 88172645463325252ull ^ (uintptr_t)arg, ops = 0;
    void *slots[256] = {0};
    double end = now() + seconds;
    for (;;) {
        for (int i = 0; i < 1024; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            unsigned r = x % 100;
            size_t size = r < 80 ? 16 + x % 241 : r < 98 ? 257 + x % 3840 : 4097 + x % 61440;
            unsigned slot = (x >> 32) % 256;
            free(slots[slot]);
            char *p = malloc(size);
            if (!p) exit(2);
            p[0] = 1;
            slots[slot] = p;
        }
        ops += 1024;
        if (now() >= end) break;
    }
    for (int i = 0; i < 256; i++) free(slots[i]);
    return (void *)(uintptr_t)ops;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    seconds = argc > 2 ? atof(argv[2]) : 3;
    char line[64];
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (uintptr_t)r;
    }
    printf("ops %llu\n", (unsigned long long)total);
    fflush(stdout);
    return 0;
}
