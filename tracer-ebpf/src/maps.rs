//! Every map of the eBPF side, in one place. Names are the constants of
//! `tracer_common::maps`; the userspace loader looks them up by those.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    CUDA_THREAD_ENTRIES, CudaInflight, MEMCG_COUNTS_ENTRIES, MemcgCountKey, ProbeConfig, ring,
};

/// Kills, OOM events and process exits. Small, low rate, wakes the reader on
/// every event.
#[map(name = "CRITICAL")]
pub static CRITICAL: RingBuf = RingBuf::with_byte_size(ring::CRITICAL_BYTES, 0);

/// Kernel OOM kills and their reaping, and nothing else: a flood of exits
/// or SIGKILLs on the critical ring can never cost an OOM kill.
#[map(name = "OOM")]
pub static OOM: RingBuf = RingBuf::with_byte_size(ring::OOM_BYTES, 0);

/// High-rate events (exec, fork).
#[map(name = "DATA")]
pub static DATA: RingBuf = RingBuf::with_byte_size(ring::DATA_BYTES, 0);

/// Events lost because a ring was full, per ring, per CPU.
#[map(name = "RING_DROPS")]
pub static RING_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ring::COUNT, 0);

/// Per memory cgroup counters of the memcg event items we aggregate.
#[map(name = "MEMCG_COUNTS")]
pub static MEMCG_COUNTS: LruPerCpuHashMap<MemcgCountKey, u64> =
    LruPerCpuHashMap::with_max_entries(MEMCG_COUNTS_ENTRIES, 0);

/// The outermost probed CUDA call in flight, per thread (pid_tgid).
#[map(name = "CUDA_INFLIGHT")]
pub static CUDA_INFLIGHT: LruHashMap<u64, CudaInflight> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// The CUDA device each thread last made current.
#[map(name = "CUDA_THREAD_DEV")]
pub static CUDA_THREAD_DEVICE: LruHashMap<u64, i32> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// The device of each CUDA context seen created.
#[map(name = "CUDA_CTX_DEV")]
pub static CUDA_CTX_DEVICE: LruHashMap<u64, i32> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// Tracepoint layouts and kernel constants, written by userspace before load.
/// Lives in `.rodata`, so the verifier treats its fields as constants.
#[unsafe(no_mangle)]
pub static CONFIG: ProbeConfig = ProbeConfig::empty();
