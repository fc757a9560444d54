//! Every map of the eBPF side, in one place. Names are the constants of
//! `tracer_common::maps`; the userspace loader looks them up by those.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    CUDA_THREAD_ENTRIES, CudaInflight, MEMCG_COUNTS_ENTRIES, MemcgCountKey, ProbeConfig,
    growth::{self, GrowthConfig, GrowthCpu, GrowthProc},
    heap::{self, HeapConfig, HeapInflight, HeapKey},
    python::{self, PyLayout},
    ring,
    usdt::{self, UsdtSpec},
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
pub static RING_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ring::DROP_SLOTS, 0);

/// Bytes submitted to each ring by this CPU since it last looked at how
/// much the ring holds (`ring::LOOK_BYTES`).
#[map(name = "RING_PACE")]
pub static RING_PACE: PerCpuArray<u64> = PerCpuArray::with_max_entries(ring::COUNT, 0);

/// Per memory cgroup counters of the memcg event items we aggregate.
#[map(name = "MEMCG_COUNTS")]
pub static MEMCG_COUNTS: LruPerCpuHashMap<MemcgCountKey, u64> =
    LruPerCpuHashMap::with_max_entries(MEMCG_COUNTS_ENTRIES, 0);

/// Each thread's CUDA state (its outermost call in flight, its device and
/// name), in slot `tid % THREAD_SLOTS`, owned by the thread that called last.
#[map(name = "CUDA_SLOTS")]
pub static CUDA_SLOTS: Array<CudaInflight> =
    Array::with_max_entries(tracer_common::THREAD_SLOTS, 0);

/// The outermost probed CUDA call in flight of a thread whose slot held
/// another thread's open call when it called, per thread (pid_tgid).
#[map(name = "CUDA_INFLIGHT")]
pub static CUDA_INFLIGHT: LruHashMap<u64, CudaInflight> =
    LruHashMap::with_max_entries(tracer_common::SPILL_ENTRIES, 0);

/// The device each thread last made current, per thread (pid_tgid): what a
/// thread's slot starts from when it takes the slot back.
#[map(name = "CUDA_THREAD_DEV")]
pub static CUDA_THREAD_DEVICE: LruHashMap<u64, i32> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// Targets of the kernel's own SIGKILLs (`SEND_SIG_PRIV`), by process:
/// (memory cgroup id, start). The OOM killer sends its victim SIGKILL
/// just before `mark_victim`, whose tracepoint names the victim by pid
/// only; the kill takes the victim's cgroup and start from here.
#[map(name = "KERNEL_KILLS")]
pub static KERNEL_KILLS: LruHashMap<u32, [u64; 2]> = LruHashMap::with_max_entries(1024, 0);

/// The device of each CUDA context seen created.
#[map(name = "CUDA_CTX_DEV")]
pub static CUDA_CTX_DEVICE: LruHashMap<u64, i32> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// Tracepoint layouts and kernel constants, written by userspace before load.
/// Lives in `.rodata`, so the verifier treats its fields as constants.
#[unsafe(no_mangle)]
pub static CONFIG: ProbeConfig = ProbeConfig::empty();

/// Each thread's outermost probed heap call in flight, in slot
/// `tid % THREAD_SLOTS`, owned by the thread that called last.
#[map(name = "HEAP_SLOTS")]
pub static HEAP_SLOTS: Array<HeapInflight> =
    Array::with_max_entries(tracer_common::THREAD_SLOTS, 0);

/// The outermost probed heap call in flight of a thread whose slot held
/// another thread's open call when it called, per thread (pid_tgid).
#[map(name = "HEAP_INFLIGHT")]
pub static HEAP_INFLIGHT: LruHashMap<u64, HeapInflight> =
    LruHashMap::with_max_entries(tracer_common::SPILL_ENTRIES, 0);

/// Sampled heap blocks still live: (process, address) -> bytes. Not an LRU:
/// a full map refuses (and counts) a sample rather than silently forgetting
/// a live one.
#[map(name = "HEAP_LIVE")]
pub static HEAP_LIVE: HashMap<HeapKey, u64> = HashMap::with_max_entries(heap::LIVE_ENTRIES, 0);

/// Bytes left before the next sample, per CPU (0 = not drawn yet): the
/// heap's at [`COUNTDOWN_HEAP`], small CUDA allocations' at
/// [`COUNTDOWN_CUDA`].
#[map(name = "HEAP_COUNTDOWN")]
pub static HEAP_COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(2, 0);

/// [`HEAP_COUNTDOWN`]'s entry for heap samples.
pub const COUNTDOWN_HEAP: u32 = 0;
/// [`HEAP_COUNTDOWN`]'s entry for CUDA allocations' stacks.
pub const COUNTDOWN_CUDA: u32 = 1;

/// Counters of the heap programs (`tracer_common::heap::stat`), per CPU.
#[map(name = "HEAP_STATS")]
pub static HEAP_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(heap::stat::COUNT, 0);

/// The heap programs' sampling configuration, written by userspace before load.
#[unsafe(no_mangle)]
pub static HEAP_CONFIG: HeapConfig = HeapConfig::empty();

/// Processes whose memory system calls are traced (tgid -> 1), written by
/// userspace as it attaches the heap family to them.
#[map(name = "HEAP_PIDS")]
pub static HEAP_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(heap::TRACED_PIDS, 0);

/// A traced memory system call in flight, per thread (pid_tgid).
#[map(name = "HEAP_SYSCALLS")]
pub static HEAP_SYSCALLS: LruHashMap<u64, HeapInflight> =
    LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);

/// The last program break seen per traced process (tgid -> brk).
#[map(name = "HEAP_BRK")]
pub static HEAP_BRK: LruHashMap<u32, u64> = LruHashMap::with_max_entries(heap::TRACED_PIDS, 0);

/// Per process growth state: whether it is followed, its countdown, its
/// totals. An LRU: the node's processes come and go.
#[map(name = "GROWTH_PROCS")]
pub static GROWTH_PROCS: LruHashMap<u32, GrowthProc> =
    LruHashMap::with_max_entries(growth::PROC_ENTRIES, 0);

/// The last decision and the sampling countdown, per CPU.
#[map(name = "GROWTH_CPU")]
pub static GROWTH_CPU: PerCpuArray<GrowthCpu> = PerCpuArray::with_max_entries(1, 0);

/// The generation of the growth decisions (userspace bumps it, and the
/// kernel when a task changes cgroup).
#[map(name = "GROWTH_GEN")]
pub static GROWTH_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// Processes selected for growth sampling (tgid -> 1), in `mode::SELECTED`.
#[map(name = "GROWTH_SELECT")]
pub static GROWTH_SELECT: HashMap<u32, u32> = HashMap::with_max_entries(growth::SELECT_ENTRIES, 0);

/// Memory cgroups armed for growth sampling (cgroup id -> 1), in
/// `mode::ARMED`: a cgroup at risk and every cgroup below it.
#[map(name = "GROWTH_ARMED")]
pub static GROWTH_ARMED: HashMap<u64, u32> = HashMap::with_max_entries(growth::ARMED_ENTRIES, 0);

/// Counters of the growth programs (`tracer_common::growth::stat`), per CPU.
#[map(name = "GROWTH_STATS")]
pub static GROWTH_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(growth::stat::COUNT, 0);

/// The growth programs' configuration, written by userspace before load.
#[unsafe(no_mangle)]
pub static GROWTH_CONFIG: GrowthConfig = GrowthConfig::empty();

/// How each attached USDT probe's arguments are read, by attach cookie.
#[map(name = "USDT_SPECS")]
pub static USDT_SPECS: Array<UsdtSpec> = Array::with_max_entries(usdt::MAX_SPECS, 0);

/// Whether CUDA allocations send their stacks (all of at least
/// `cuda::STACK_MIN_BYTES`, smaller ones sampled by bytes), set by
/// userspace when something reads them.
#[map(name = "CUDA_STACKS")]
pub static CUDA_STACKS: Array<tracer_common::cuda::StackConfig> = Array::with_max_entries(1, 0);

/// Where each process's CPython interpreter is (tgid -> layout), written by
/// userspace when it finds one; the stack programs walk Python frames of
/// these processes.
#[map(name = "PY_PROCS")]
pub static PY_PROCS: HashMap<u32, PyLayout> = HashMap::with_max_entries(python::PROCS, 0);
