/* A CUDA workload driven from stdin, for tracer's tests and benchmarks.
 *
 *   cudaload RUNTIME.so [DRIVER.so]   load the libraries now ("-": later)
 *   cudaload-static                   cudart (simulated) linked in
 *
 * Prints "ready", then one reply line per command:
 *   malloc N | managed N | host N | hostalloc N | async N | pool N | pitch W H
 *       -> "ok 0xPTR" or "err CODE"
 *   free P | freeasync P | freehost P | setdevice D | reset -> "ok" or "err CODE"
 *   drvmalloc N | drvfree P          the driver API directly
 *   init [FLAGS]                     cuInit
 *   drvcreate N DEV -> "ok HANDLE"   cuMemCreate of N bytes on device DEV
 *   drvreserve N -> "ok VA"          cuMemAddressReserve
 *   drvmap VA N H | drvunmap VA N | drvaddrfree VA N | drvrelease H
 *                                    one VMM call each, with these arguments
 *   vmm N -> "ok VA HANDLE"; vmmfree VA HANDLE N -> "ok"
 *   loop N BYTES                     N x (cudaMalloc + cudaFree), replies "ok NS" (ns per pair)
 *   loopany N BYTES [drv]            the same whatever the calls return (cuMemAlloc_v2 +
 *                                    cuMemFree_v2 with "drv"): "ok NS CODE" (the last code)
 *   rate CALLS_PER_S SECONDS BYTES [drv]
 *                                    paced cudaMalloc + cudaFree pairs (cuMemAlloc_v2 +
 *                                    cuMemFree_v2 with "drv"); replies "ok CALLS PER_S"
 *   slotmate SLOTS BYTES_A BYTES_B   an owner thread makes a mate whose id equals its own modulo
 *                                    SLOTS (a new owner where no such id is free); the owner
 *                                    sets device 1, the mate device 2, then the owner's
 *                                    cudaMalloc(BYTES_A) and, 100 ms into it, the
 *                                    mate's cudaMalloc(BYTES_B) (SIMCUDA_ALLOC_DELAY_MS holds
 *                                    them open): "ok TID MATE_TID PTR_A PTR_B"
 *   rename NAME                      this thread's name (prctl PR_SET_NAME) -> "ok"
 *   dlopen RUNTIME.so [DRIVER.so]    load libraries now
 *   addr SYMBOL                      the address the process calls it at
 *   exit [STATUS]                    exit without freeing anything (status 0 by default)
 *   abort                            abort(): end by SIGABRT, as a CUDA program's failed check does */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "simcuda.h"

static int (*p_cudaMalloc)(void **, size_t);
static int (*p_cudaMallocManaged)(void **, size_t, unsigned);
static int (*p_cudaMallocPitch)(void **, size_t *, size_t, size_t);
static int (*p_cudaMallocAsync)(void **, size_t, void *);
static int (*p_cudaMallocFromPoolAsync)(void **, size_t, void *, void *);
static int (*p_cudaMallocHost)(void **, size_t);
static int (*p_cudaHostAlloc)(void **, size_t, unsigned);
static int (*p_cudaFree)(void *);
static int (*p_cudaFreeAsync)(void *, void *);
static int (*p_cudaFreeHost)(void *);
static int (*p_cudaSetDevice)(int);
static int (*p_cudaDeviceReset)(void);
static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree_v2)(CUdeviceptr);
static CUresult (*p_cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*p_cuMemRelease)(CUmemGenericAllocationHandle);
static CUresult (*p_cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*p_cuMemAddressFree)(CUdeviceptr, size_t);
static CUresult (*p_cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*p_cuMemUnmap)(CUdeviceptr, size_t);

#ifdef CUDALOAD_STATIC
#define BIND(f) p_##f = f
static void bind_static(void) {
    BIND(cudaMalloc); BIND(cudaMallocManaged); BIND(cudaMallocPitch); BIND(cudaMallocAsync);
    BIND(cudaMallocFromPoolAsync); BIND(cudaMallocHost); BIND(cudaHostAlloc); BIND(cudaFree);
    BIND(cudaFreeAsync); BIND(cudaFreeHost); BIND(cudaSetDevice); BIND(cudaDeviceReset); BIND(cuMemAlloc_v2); BIND(cuMemFree_v2); BIND(cuInit);
    BIND(cuMemCreate); BIND(cuMemRelease); BIND(cuMemAddressReserve); BIND(cuMemAddressFree);
    BIND(cuMemMap); BIND(cuMemUnmap);
}
#endif

#define SYM(h, f) do { void *s = dlsym(h, #f); if (s) *(void **)&p_##f = s; } while (0)
static int load(const char *runtime, const char *drv) {
    if (runtime && strcmp(runtime, "-")) {
        void *h = dlopen(runtime, RTLD_NOW | RTLD_GLOBAL);
        if (!h) { fprintf(stderr, "cudaload: %s\n", dlerror()); return -1; }
        SYM(h, cudaMalloc); SYM(h, cudaMallocManaged); SYM(h, cudaMallocPitch); SYM(h, cudaMallocAsync);
        SYM(h, cudaMallocFromPoolAsync); SYM(h, cudaMallocHost); SYM(h, cudaHostAlloc); SYM(h, cudaFree);
        SYM(h, cudaFreeAsync); SYM(h, cudaFreeHost); SYM(h, cudaSetDevice); SYM(h, cudaDeviceReset);
    }
    if (drv && strcmp(drv, "-")) {
        void *h = dlopen(drv, RTLD_NOW | RTLD_GLOBAL);
        if (!h) { fprintf(stderr, "cudaload: %s\n", dlerror()); return -1; }
        SYM(h, cuInit); SYM(h, cuMemAlloc_v2); SYM(h, cuMemFree_v2); SYM(h, cuMemCreate); SYM(h, cuMemRelease);
        SYM(h, cuMemAddressReserve); SYM(h, cuMemAddressFree); SYM(h, cuMemMap); SYM(h, cuMemUnmap);
    }
    return 0;
}

static int current_device;

static void reply_ptr(int r, void *p) {
    if (r) printf("err %d\n", r); else printf("ok %p\n", p);
}
static void reply(int r) {
    if (r) printf("err %d\n", r); else printf("ok\n");
}
static void *ptr(const char *s) { return (void *)(uintptr_t)strtoull(s, NULL, 0); }
#define NEED(f) if (!p_##f) { printf("err -1 no %s\n", #f); continue; }

/* A thread sharing the calling thread's id modulo `slots`, and the steps
 * the two take in turn. */
struct mate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned slots;
    pid_t want, tid;
    int seen, step, r;
    size_t bytes;
    void *p;
};

static void mate_go(struct mate *m, int step) {
    pthread_mutex_lock(&m->mu);
    m->step = step;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static void mate_wait(struct mate *m, int step) {
    pthread_mutex_lock(&m->mu);
    while (m->step < step) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

static void *mate_main(void *arg) {
    struct mate *m = arg;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    int match = (unsigned)tid % m->slots == (unsigned)m->want % m->slots;
    pthread_mutex_lock(&m->mu);
    m->seen = 1;
    if (match) m->tid = tid;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (!match) return NULL;
    mate_wait(m, 2);
    m->r = p_cudaSetDevice(2);
    mate_go(m, 3);
    mate_wait(m, 4);
    struct timespec t = {0, 100000000};
    nanosleep(&t, NULL);
    if (!m->r) m->r = p_cudaMalloc(&m->p, m->bytes);
    mate_go(m, 5);
    return NULL;
}

/* The kernel's pid_max: a thread id modulo `slots` that no new thread
 * got in two turns of the pid space is held by another process. */
static long pid_space(void) {
    long max = 32768;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    if (f) { if (fscanf(f, "%ld", &max) != 1) max = 32768; fclose(f); }
    return max;
}

/* Runs `slotmate` from the calling thread; 0 or the first error (-3: no
 * thread id modulo `slots` is free for a mate of this one). */
static int slotmate_here(unsigned slots, size_t bytes_a, size_t bytes_b, pid_t *mate_tid, void **pa, void **pb) {
    struct mate m = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, slots ? slots : 1,
                      (pid_t)syscall(SYS_gettid), 0, 0, 0, 0, bytes_b, NULL };
    pthread_t t;
    long limit = 2 * pid_space();
    for (long tries = 0; !m.tid; tries++) {
        if (tries > limit) return -3;
        m.seen = 0;
        if (pthread_create(&t, NULL, mate_main, &m)) return -4;
        pthread_mutex_lock(&m.mu);
        while (!m.seen) pthread_cond_wait(&m.cv, &m.mu);
        int found = m.tid != 0;
        pthread_mutex_unlock(&m.mu);
        if (!found) pthread_join(t, NULL);
    }
    int r = p_cudaSetDevice(1);
    if (!r) current_device = 1;
    mate_go(&m, 2);
    mate_wait(&m, 3);
    mate_go(&m, 4);
    if (!r) r = p_cudaMalloc(pa, bytes_a);
    mate_wait(&m, 5);
    pthread_join(t, NULL);
    *mate_tid = m.tid;
    *pb = m.p;
    return r ? r : m.r;
}

struct slot_owner { unsigned slots; size_t a, b; pid_t tid, mate; void *pa, *pb; int r; };

static void *slot_owner_main(void *arg) {
    struct slot_owner *o = arg;
    o->tid = (pid_t)syscall(SYS_gettid);
    o->r = slotmate_here(o->slots, o->a, o->b, &o->mate, &o->pa, &o->pb);
    return NULL;
}

/* `slotmate`, from a thread of its own: where every id a mate of one
 * owner could take is held by another process (on a busy node, with a
 * small pid_max), a new owner, of another id, tries again. */
static int slotmate(unsigned slots, size_t bytes_a, size_t bytes_b, pid_t *owner, pid_t *mate_tid, void **pa, void **pb) {
    for (int round = 0; round < 8; round++) {
        struct slot_owner o = { slots, bytes_a, bytes_b, 0, 0, NULL, NULL, 0 };
        pthread_t t;
        if (pthread_create(&t, NULL, slot_owner_main, &o)) return -4;
        pthread_join(t, NULL);
        if (o.r == -3) continue;
        *owner = o.tid; *mate_tid = o.mate; *pa = o.pa; *pb = o.pb;
        return o.r;
    }
    return -3;
}

int main(int argc, char **argv) {
#ifdef CUDALOAD_STATIC
    (void)argc; (void)argv;
    bind_static();
#else
    if (argc > 1 && load(argv[1], argc > 2 ? argv[2] : NULL)) return 1;
#endif
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[512], a[128], b[128], c[128], e[128];
    while (fgets(line, sizeof line, stdin)) {
        a[0] = b[0] = c[0] = e[0] = 0;
        char cmd[32] = "";
        sscanf(line, "%31s %127s %127s %127s %127s", cmd, a, b, c, e);
        size_t n = strtoull(a, NULL, 0);
        void *p = NULL;
        if (!strcmp(cmd, "malloc")) { NEED(cudaMalloc); int r = p_cudaMalloc(&p, n); reply_ptr(r, p); }
        else if (!strcmp(cmd, "managed")) { NEED(cudaMallocManaged); int r = p_cudaMallocManaged(&p, n, 1); reply_ptr(r, p); }
        else if (!strcmp(cmd, "host")) { NEED(cudaMallocHost); int r = p_cudaMallocHost(&p, n); reply_ptr(r, p); }
        else if (!strcmp(cmd, "hostalloc")) { NEED(cudaHostAlloc); int r = p_cudaHostAlloc(&p, n, 0); reply_ptr(r, p); }
        else if (!strcmp(cmd, "async")) { NEED(cudaMallocAsync); int r = p_cudaMallocAsync(&p, n, NULL); reply_ptr(r, p); }
        else if (!strcmp(cmd, "pool")) { NEED(cudaMallocFromPoolAsync); int r = p_cudaMallocFromPoolAsync(&p, n, NULL, NULL); reply_ptr(r, p); }
        else if (!strcmp(cmd, "pitch")) { NEED(cudaMallocPitch); size_t pitch = 0; int r = p_cudaMallocPitch(&p, &pitch, n, strtoull(b, NULL, 0)); reply_ptr(r, p); }
        else if (!strcmp(cmd, "free")) { NEED(cudaFree); reply(p_cudaFree(ptr(a))); }
        else if (!strcmp(cmd, "freeasync")) { NEED(cudaFreeAsync); reply(p_cudaFreeAsync(ptr(a), NULL)); }
        else if (!strcmp(cmd, "freehost")) { NEED(cudaFreeHost); reply(p_cudaFreeHost(ptr(a))); }
        else if (!strcmp(cmd, "setdevice")) { NEED(cudaSetDevice); int r = p_cudaSetDevice((int)n); if (!r) current_device = (int)n; reply(r); }
        else if (!strcmp(cmd, "reset")) { NEED(cudaDeviceReset); reply(p_cudaDeviceReset()); }
        else if (!strcmp(cmd, "drvmalloc")) { NEED(cuMemAlloc_v2); CUdeviceptr d = 0; int r = p_cuMemAlloc_v2(&d, n); reply_ptr(r, (void *)(uintptr_t)d); }
        else if (!strcmp(cmd, "drvfree")) { NEED(cuMemFree_v2); reply(p_cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr(a))); }
        else if (!strcmp(cmd, "init")) { NEED(cuInit); reply(p_cuInit((unsigned)n)); }
        else if (!strcmp(cmd, "drvcreate")) {
            NEED(cuMemCreate);
            CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
            prop.type = 1; prop.location.type = 1; prop.location.id = (int)strtol(b, NULL, 0);
            CUmemGenericAllocationHandle h = 0;
            int r = p_cuMemCreate(&h, n, &prop, 0);
            if (r) printf("err %d\n", r); else printf("ok 0x%llx\n", h);
        }
        else if (!strcmp(cmd, "drvreserve")) {
            NEED(cuMemAddressReserve); CUdeviceptr va = 0;
            int r = p_cuMemAddressReserve(&va, n, 0, 0, 0);
            if (r) printf("err %d\n", r); else printf("ok 0x%llx\n", va);
        }
        else if (!strcmp(cmd, "drvmap")) {
            NEED(cuMemMap);
            reply(p_cuMemMap((CUdeviceptr)strtoull(a, NULL, 0), strtoull(b, NULL, 0), 0, strtoull(c, NULL, 0), 0));
        }
        else if (!strcmp(cmd, "drvunmap")) { NEED(cuMemUnmap); reply(p_cuMemUnmap((CUdeviceptr)strtoull(a, NULL, 0), strtoull(b, NULL, 0))); }
        else if (!strcmp(cmd, "drvaddrfree")) { NEED(cuMemAddressFree); reply(p_cuMemAddressFree((CUdeviceptr)strtoull(a, NULL, 0), strtoull(b, NULL, 0))); }
        else if (!strcmp(cmd, "drvrelease")) { NEED(cuMemRelease); reply(p_cuMemRelease(strtoull(a, NULL, 0))); }
        else if (!strcmp(cmd, "vmm")) {
            NEED(cuMemCreate); NEED(cuMemAddressReserve); NEED(cuMemMap);
            CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
            prop.type = 1; prop.location.type = 1; prop.location.id = current_device;
            CUmemGenericAllocationHandle h = 0; CUdeviceptr va = 0;
            int r = p_cuMemCreate(&h, n, &prop, 0);
            if (!r) r = p_cuMemAddressReserve(&va, n, 0, 0, 0);
            if (!r) r = p_cuMemMap(va, n, 0, h, 0);
            if (r) printf("err %d\n", r); else printf("ok 0x%llx 0x%llx\n", va, h);
        }
        else if (!strcmp(cmd, "vmmfree")) {
            NEED(cuMemUnmap); NEED(cuMemAddressFree); NEED(cuMemRelease);
            CUdeviceptr va = (CUdeviceptr)strtoull(a, NULL, 0);
            CUmemGenericAllocationHandle h = strtoull(b, NULL, 0);
            size_t size = strtoull(c, NULL, 0);
            int r = p_cuMemUnmap(va, size);
            if (!r) r = p_cuMemAddressFree(va, size);
            if (!r) r = p_cuMemRelease(h);
            reply(r);
        }
        else if (!strcmp(cmd, "loop")) {
            NEED(cudaMalloc); NEED(cudaFree);
            size_t bytes = strtoull(b, NULL, 0);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int r = 0;
            for (size_t i = 0; i < n && !r; i++) {
                r = p_cudaMalloc(&p, bytes);
                if (!r) r = p_cudaFree(p);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
            if (r) printf("err %d\n", r); else printf("ok %.1f\n", n ? ns / n : 0.0);
        }
        else if (!strcmp(cmd, "loopany")) {
            int drv = !strcmp(c, "drv");
            if (drv) { NEED(cuMemAlloc_v2); NEED(cuMemFree_v2); } else { NEED(cudaMalloc); NEED(cudaFree); }
            size_t bytes = strtoull(b, NULL, 0);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int r = 0;
            for (size_t i = 0; i < n; i++) {
                if (drv) {
                    CUdeviceptr d = 0;
                    r = p_cuMemAlloc_v2(&d, bytes);
                    r |= p_cuMemFree_v2(d);
                } else {
                    r = p_cudaMalloc(&p, bytes);
                    r |= p_cudaFree(p);
                }
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
            printf("ok %.1f %d\n", n ? ns / n : 0.0, r);
        }
        else if (!strcmp(cmd, "addr")) {
            void *s = dlsym(RTLD_DEFAULT, a);
            if (!strcmp(a, "cudaMalloc") && p_cudaMalloc) s = (void *)p_cudaMalloc;
            if (s) printf("ok %p\n", s); else printf("err -1\n");
        }
        else if (!strcmp(cmd, "rate")) {
            int drv = !strcmp(e, "drv");
            if (drv) { NEED(cuMemAlloc_v2); NEED(cuMemFree_v2); } else { NEED(cudaMalloc); NEED(cudaFree); }
            double rate = strtod(a, NULL), secs = strtod(b, NULL);
            size_t bytes = strtoull(c, NULL, 0), calls = 0;
            struct timespec t0, t;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int r = 0;
            for (;;) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                double el = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
                if (el >= secs) break;
                /* Pairs due by now; spin politely when ahead. */
                if (calls >= rate * el) { struct timespec ns = {0, 20000}; nanosleep(&ns, NULL); continue; }
                for (int i = 0; i < 64 && !r; i++) {
                    if (drv) {
                        CUdeviceptr d = 0;
                        r = p_cuMemAlloc_v2(&d, bytes);
                        if (!r) r = p_cuMemFree_v2(d);
                    } else {
                        r = p_cudaMalloc(&p, bytes);
                        if (!r) r = p_cudaFree(p);
                    }
                    calls += 2;
                }
                if (r) break;
            }
            clock_gettime(CLOCK_MONOTONIC, &t);
            double el = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
            if (r) printf("err %d\n", r); else printf("ok %zu %.0f\n", calls, calls / el);
        }
        else if (!strcmp(cmd, "slotmate")) {
            NEED(cudaMalloc); NEED(cudaSetDevice);
            pid_t owner = 0, mate = 0;
            void *pb = NULL;
            int r = slotmate((unsigned)n, strtoull(b, NULL, 0), strtoull(c, NULL, 0), &owner, &mate, &p, &pb);
            if (r) printf("err %d\n", r);
            else printf("ok %d %d %p %p\n", (int)owner, (int)mate, p, pb);
        }
        else if (!strcmp(cmd, "rename")) { reply(prctl(PR_SET_NAME, a, 0, 0, 0)); }
        else if (!strcmp(cmd, "dlopen")) { reply(load(a, b[0] ? b : NULL) ? -1 : 0); }
        else if (!strcmp(cmd, "exit")) { return (int)n; }
        else if (!strcmp(cmd, "abort")) { abort(); }
        else printf("err -2 unknown command %s\n", cmd);
    }
    return 0;
}
