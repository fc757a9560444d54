/* A CUDA caching allocator shaped like PyTorch's, with the same USDT
 * probes: provider "pytorch", probe "malloc" (void *ptr, int8_t device,
 * size_t size, int64_t stream) after a block is handed out and "free"
 * (void *ptr) when one is given back, each behind its u16 semaphore in
 * .probes (the arguments are computed only while a tracer raised it).
 *
 *   torchalloc RUNTIME.so        the CUDA runtime to allocate segments from
 *
 * Segments come from cudaMalloc (2 MiB for requests up to 1 MiB, 20 MiB up
 * to 10 MiB, else the request rounded up to 2 MiB); blocks (sizes rounded
 * up to 512 bytes) are carved from the segments' free blocks, best fit,
 * split when the rest is at least 512 bytes; a freed block goes back to
 * its segment's free list, merged with free neighbours, and is not given
 * back to CUDA. When cudaMalloc fails, wholly free segments are released
 * (cudaFree) and it is tried once more, as PyTorch does.
 *
 * Prints "ready", then one reply line per command:
 *   alloc N     -> "ok PTR" or "err CODE" (the cudaMalloc error)
 *   free PTR    -> "ok"
 *   stats       -> "ok RESERVED ALLOCATED LARGEST_FREE SEGMENTS"
 *   sem         -> "ok MALLOC_SEMAPHORE FREE_SEMAPHORE"
 *   empty       -> "ok N" (segments released)
 *   device D    -> "ok" (cudaSetDevice; new blocks are on device D)
 *   bench N SIZE -> "ok NS" (N x alloc + free of SIZE from the cache, ns per pair)
 *   exit */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__extension__ volatile unsigned short pytorch_malloc_semaphore __attribute__((section(".probes"))) = 0;
__extension__ volatile unsigned short pytorch_free_semaphore __attribute__((section(".probes"))) = 0;

static int (*p_cudaMalloc)(void **, size_t);
static int (*p_cudaFree)(void *);
static int (*p_cudaSetDevice)(int);

struct block {
    uintptr_t ptr;
    size_t size;
    int allocated;
    struct segment *seg;
    struct block *prev, *next; /* address order within the segment */
};
struct segment {
    uintptr_t ptr;
    size_t size;
    struct block *first;
    struct segment *next;
};

static struct segment *segments;
static size_t reserved, allocated;
static int8_t current_device;
static const int64_t stream = 0;

static size_t round_size(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

static size_t segment_size(size_t n) {
    if (n <= (1u << 20)) return 2u << 20;
    if (n < (10u << 20)) return 20u << 20;
    return (n + (2u << 20) - 1) / (2u << 20) * (2u << 20);
}

static struct block *best_fit(size_t n) {
    struct block *best = NULL;
    for (struct segment *s = segments; s; s = s->next)
        for (struct block *b = s->first; b; b = b->next)
            if (!b->allocated && b->size >= n && (!best || b->size < best->size)) best = b;
    return best;
}

static int release_free_segments(void) {
    int n = 0;
    for (struct segment **sp = &segments; *sp;) {
        struct segment *s = *sp;
        if (!s->first->allocated && !s->first->next) {
            p_cudaFree((void *)s->ptr);
            reserved -= s->size;
            *sp = s->next;
            free(s->first);
            free(s);
            n++;
        } else {
            sp = &s->next;
        }
    }
    return n;
}

static int new_segment(size_t n) {
    size_t size = segment_size(n);
    void *p = NULL;
    int r = p_cudaMalloc(&p, size);
    if (r) {
        release_free_segments();
        r = p_cudaMalloc(&p, size);
    }
    if (r) return r;
    struct segment *s = calloc(1, sizeof *s);
    struct block *b = calloc(1, sizeof *b);
    s->ptr = (uintptr_t)p;
    s->size = size;
    s->first = b;
    s->next = segments;
    segments = s;
    b->ptr = s->ptr;
    b->size = size;
    b->seg = s;
    reserved += size;
    return 0;
}

static int alloc(size_t request, void **out) {
    size_t n = round_size(request);
    struct block *b = best_fit(n);
    if (!b) {
        int r = new_segment(n);
        if (r) return r;
        b = best_fit(n);
    }
    if (b->size - n >= 512) {
        struct block *rest = calloc(1, sizeof *rest);
        rest->ptr = b->ptr + n;
        rest->size = b->size - n;
        rest->seg = b->seg;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = n;
    }
    b->allocated = 1;
    allocated += b->size;
    *out = (void *)b->ptr;
    if (pytorch_malloc_semaphore) {
        void *ptr = *out;
        int8_t device = current_device;
        STAP_PROBE4(pytorch, malloc, ptr, device, request, stream);
    }
    return 0;
}

static struct block *find(uintptr_t p) {
    for (struct segment *s = segments; s; s = s->next)
        for (struct block *b = s->first; b; b = b->next)
            if (b->ptr == p && b->allocated) return b;
    return NULL;
}

static int release(uintptr_t p) {
    struct block *b = find(p);
    if (!b) return 1;
    if (pytorch_free_semaphore) {
        void *ptr = (void *)p;
        STAP_PROBE1(pytorch, free, ptr);
    }
    b->allocated = 0;
    allocated -= b->size;
    struct block *n = b->next;
    if (n && !n->allocated) {
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        free(n);
    }
    struct block *v = b->prev;
    if (v && !v->allocated) {
        v->size += b->size;
        v->next = b->next;
        if (b->next) b->next->prev = v;
        free(b);
    }
    return 0;
}

static size_t largest_free(void) {
    size_t m = 0;
    for (struct segment *s = segments; s; s = s->next)
        for (struct block *b = s->first; b; b = b->next)
            if (!b->allocated && b->size > m) m = b->size;
    return m;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: torchalloc RUNTIME.so\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) { fprintf(stderr, "torchalloc: %s\n", dlerror()); return 1; }
    *(void **)&p_cudaMalloc = dlsym(h, "cudaMalloc");
    *(void **)&p_cudaFree = dlsym(h, "cudaFree");
    *(void **)&p_cudaSetDevice = dlsym(h, "cudaSetDevice");
    if (!p_cudaMalloc || !p_cudaFree) { fprintf(stderr, "torchalloc: no cudaMalloc/cudaFree\n"); return 1; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[256], cmd[32], a[64];
    while (fgets(line, sizeof line, stdin)) {
        cmd[0] = a[0] = 0;
        sscanf(line, "%31s %63s", cmd, a);
        if (!strcmp(cmd, "alloc")) {
            void *p = NULL;
            int r = alloc(strtoull(a, NULL, 0), &p);
            if (r) printf("err %d\n", r); else printf("ok %p\n", p);
        } else if (!strcmp(cmd, "free")) {
            printf(release(strtoull(a, NULL, 0)) ? "err 1\n" : "ok\n");
        } else if (!strcmp(cmd, "stats")) {
            int n = 0;
            for (struct segment *s = segments; s; s = s->next) n++;
            printf("ok %zu %zu %zu %d\n", reserved, allocated, largest_free(), n);
        } else if (!strcmp(cmd, "sem")) {
            printf("ok %u %u\n", pytorch_malloc_semaphore, pytorch_free_semaphore);
        } else if (!strcmp(cmd, "empty")) {
            printf("ok %d\n", release_free_segments());
        } else if (!strcmp(cmd, "bench")) {
            char b[64] = "";
            sscanf(line, "%*s %*s %63s", b);
            size_t n = strtoull(a, NULL, 0), size = strtoull(b, NULL, 0);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int r = 0;
            for (size_t i = 0; i < n && !r; i++) {
                void *p = NULL;
                r = alloc(size, &p);
                if (!r) r = release((uintptr_t)p);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
            if (r) printf("err %d\n", r); else printf("ok %.1f\n", n ? ns / n : 0.0);
        } else if (!strcmp(cmd, "device")) {
            int d = atoi(a);
            int r = p_cudaSetDevice ? p_cudaSetDevice(d) : -1;
            if (!r) current_device = (int8_t)d;
            if (r) printf("err %d\n", r); else printf("ok\n");
        } else if (!strcmp(cmd, "exit")) {
            return 0;
        } else {
            printf("err -2 unknown command %s\n", cmd);
        }
    }
    return 0;
}
