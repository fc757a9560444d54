/* State shared by the simulated CUDA driver and the simulated NVML across
 * processes: device memory charged per (process, device), in a file every
 * process maps (SIMCUDA_STATE=path). Without SIMCUDA_STATE each process's
 * driver keeps its own accounting and NVML sees nothing. */
#ifndef SIMSTATE_H
#define SIMSTATE_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIM_SLOTS 512
#define SIM_MAGIC 0x53494d43u

struct sim_slot {
    int32_t pid;          /* 0 = free */
    int32_t device;
    uint64_t bytes;       /* device memory charged through the driver */
};

struct sim_state {
    uint32_t magic;
    uint32_t pad;
    struct sim_slot slots[SIM_SLOTS];
};

static inline struct sim_state *sim_state_map(void) {
    static struct sim_state *st;
    static int tried;
    if (tried) return st;
    tried = 1;
    const char *path = getenv("SIMCUDA_STATE");
    if (!path || !*path) return NULL;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return NULL;
    if (ftruncate(fd, sizeof(struct sim_state)) != 0) { close(fd); return NULL; }
    void *p = mmap(NULL, sizeof(struct sim_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return NULL;
    st = p;
    __atomic_store_n(&st->magic, SIM_MAGIC, __ATOMIC_RELEASE);
    return st;
}

/* The slot of (pid, device), claimed if new; NULL when full or unshared. */
static inline struct sim_slot *sim_slot(int32_t pid, int32_t device) {
    struct sim_state *st = sim_state_map();
    if (!st) return NULL;
    for (int i = 0; i < SIM_SLOTS; i++) {
        struct sim_slot *s = &st->slots[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == pid && s->device == device) return s;
    }
    for (int i = 0; i < SIM_SLOTS; i++) {
        struct sim_slot *s = &st->slots[i];
        int32_t zero = 0;
        if (__atomic_compare_exchange_n(&s->pid, &zero, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            s->device = device;
            /* A context's own memory: charged, never traced (SIMNVML_CONTEXT_BYTES). */
            const char *ctx = getenv("SIMNVML_CONTEXT_BYTES");
            __atomic_store_n(&s->bytes, ctx ? strtoull(ctx, NULL, 0) : 0, __ATOMIC_RELEASE);
            __atomic_store_n(&s->pid, pid, __ATOMIC_RELEASE);
            return s;
        }
    }
    return NULL;
}

static inline int sim_alive(int32_t pid) {
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* Bytes charged on `device` by every process still alive. */
static inline uint64_t sim_device_used(int32_t device) {
    struct sim_state *st = sim_state_map();
    if (!st) return 0;
    uint64_t sum = 0;
    for (int i = 0; i < SIM_SLOTS; i++) {
        struct sim_slot *s = &st->slots[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid > 0 && s->device == device && sim_alive(pid)) sum += __atomic_load_n(&s->bytes, __ATOMIC_ACQUIRE);
    }
    return sum;
}
#endif
