/* A process whose memory grows in one known function, for the growth
 * attribution tests and benchmarks.
 *
 * grower MODE [ARG]: prints "ready", waits for a line on stdin, then
 *
 *   grow [MS] reserve_arena maps 96 MiB (anonymous, never touched) once;
 *             then build_index takes 1 MiB blocks from malloc and fills
 *             them (memset), 8 MiB every MS ms (20 unless told), forever;
 *             load_config takes
 *             and fills 64 KiB every round (an eighth of a MiB's worth of
 *             samples). Run it in a memory cgroup with a limit.
 *   touch N   faults in N MiB of fresh anonymous memory, page by page, in
 *             touch_pages, unmaps it, and repeats for the rounds given on
 *             each further line ("round" -> prints "ns/page X").
 *   churn     every round, format_report takes 40 MiB from malloc (past
 *             glibc's largest mmap threshold: mapped), writes every page
 *             and frees it (unmapped); build_index keeps 2 MiB; 20 ms
 *             between rounds. Faults: mostly format_report's; memory
 *             kept: build_index's. Run it in a memory cgroup with a limit.
 *   hold N    fills N MiB in fill_cache, prints "held", and keeps it until
 *             stdin ends (a large, idle process: the OOM killer's choice
 *             when another process of its cgroup hits the limit).
 *
 * Any line read at "ready" that is "exit" ends it there.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void **keep;
static size_t kept, cap;

static void hold(void *p) {
    if (!p) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    if (kept == cap) {
        cap = cap ? cap * 2 : 1024;
        keep = realloc(keep, cap * sizeof *keep);
        if (!keep)
            exit(2);
    }
    keep[kept++] = p;
}

__attribute__((noinline)) static void build_index(int blocks) {
    for (int i = 0; i < blocks; i++) {
        char *p = malloc(1 << 20);
        hold(p);
        memset(p, i + 1, 1 << 20);
    }
}

__attribute__((noinline)) static void reserve_arena(void) {
    void *p = mmap(0, 96 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    hold(p);
}

__attribute__((noinline)) static void load_config(void) {
    char *p = malloc(64 << 10);
    hold(p);
    memset(p, 7, 64 << 10);
}

__attribute__((noinline)) static void fill_cache(size_t mib) {
    for (size_t i = 0; i < mib; i++) {
        char *p = malloc(1 << 20);
        hold(p);
        memset(p, 3, 1 << 20);
    }
}

__attribute__((noinline)) static void format_report(void) {
    size_t n = 40 << 20;
    volatile char *p = malloc(n);
    if (!p) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 5;
    free((void *)p);
}

__attribute__((noinline)) static double touch_pages(size_t mib) {
    size_t n = mib << 20;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    munmap((void *)p, n);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    return ns / (n / 4096);
}

int main(int argc, char **argv) {
    char line[64];
    const char *mode = argc > 1 ? argv[1] : "grow";
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "exit", 4) == 0)
        return 0;
    if (strcmp(mode, "touch") == 0) {
        size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 256;
        do {
            if (strncmp(line, "exit", 4) == 0)
                return 0;
            printf("ns/page %.1f\n", touch_pages(mib));
        } while (fgets(line, sizeof line, stdin));
        return 0;
    }
    if (strcmp(mode, "hold") == 0) {
        fill_cache(argc > 2 ? strtoul(argv[2], NULL, 10) : 64);
        printf("held\n");
        while (fgets(line, sizeof line, stdin))
            ;
        return 0;
    }
    struct timespec pause = {0, 20 * 1000 * 1000};
    if (strcmp(mode, "churn") == 0) {
        for (;;) {
            format_report();
            build_index(2);
            nanosleep(&pause, NULL);
        }
    }
    if (argc > 2)
        pause.tv_nsec = strtoul(argv[2], NULL, 10) % 1000 * 1000 * 1000;
    reserve_arena();
    for (;;) {
        build_index(8);
        load_config();
        nanosleep(&pause, NULL);
    }
}
