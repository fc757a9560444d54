//! The event ABI shared by the eBPF programs (`tracer-ebpf`) and the
//! userspace collector (`tracer`).
//!
//! Everything that crosses a ring buffer or a map is defined here, once:
//! `#[repr(C)]`, `Copy`, fixed-width fields, explicit padding, and a size
//! assertion so that both sides agree byte for byte. Kinds are `u32`
//! constants on the wire; userspace turns them into enums with `TryFrom`.
#![no_std]

pub mod growth;
pub mod heap;
pub mod python;
pub mod usdt;
pub mod wire;

pub use wire::{EVENT_KINDS, EventKindInfo, MAX_EVENT_SIZE, WireEvent};

/// The symbol of function `id` in a family's (id, symbol) table, or `?`.
pub fn name_in(table: &[(u32, &'static str)], id: u32) -> &'static str {
    table
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
        .unwrap_or("?")
}

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Bytes of an exec'd file name that cross the ring (longer names are cut).
pub const FILENAME_LEN: usize = 256;
/// Bytes of a new program's arguments an exec event carries.
pub const ARGS_LEN: usize = 512;
/// Bytes of a cgroup's path a [`CgroupDir`] carries (a Kubernetes
/// container's, the longest common ones, is about 190).
pub const CGROUP_PATH_LEN: usize = 320;

/// Names of the maps, as the ELF object spells them.
pub mod maps {
    /// Ring buffer for kills, OOM and process-exit events. Small, and only
    /// low-rate events may use it, so that an allocation flood on the data
    /// ring can never make us lose a kill.
    pub const CRITICAL_RING: &str = "CRITICAL";
    /// Ring buffer for high-rate events (exec, fork; allocations later).
    pub const DATA_RING: &str = "DATA";
    /// `RingBuf` of kernel OOM kills (victims and reaping) only: no exit or
    /// signal flood can take its room.
    pub const OOM_RING: &str = "OOM";
    /// `PerCpuArray<u64>` of events dropped because a ring was full,
    /// indexed by [`super::ring::CRITICAL`] / [`super::ring::DATA`].
    pub const RING_DROPS: &str = "RING_DROPS";
    /// `LruPerCpuHashMap<MemcgCountKey, u64>`: per memory cgroup counters of the
    /// memcg events we aggregate in the kernel (reclaim, OOM kills).
    pub const MEMCG_COUNTS: &str = "MEMCG_COUNTS";
    /// `Array<CudaInflight>`: each thread's CUDA state, in the slot of its
    /// thread id ([`super::THREAD_SLOTS`]).
    pub const CUDA_SLOTS: &str = "CUDA_SLOTS";
    /// `LruHashMap<u64, CudaInflight>`: the CUDA call in flight of a thread
    /// whose slot holds another thread's open call.
    pub const CUDA_INFLIGHT: &str = "CUDA_INFLIGHT";
    /// `LruHashMap<u64, i32>`: the device each thread last made current.
    pub const CUDA_THREAD_DEVICE: &str = "CUDA_THREAD_DEV";
    /// `LruHashMap<u64, i32>`: the device of each CUDA context.
    pub const CUDA_CTX_DEVICE: &str = "CUDA_CTX_DEV";
    /// Targets of the kernel's own SIGKILLs: cgroup and start, for the OOM victim.
    pub const KERNEL_KILLS: &str = "KERNEL_KILLS";
    /// Heap calls in flight per thread.
    pub const HEAP_INFLIGHT: &str = "HEAP_INFLIGHT";
    /// `Array<HeapInflight>`: each thread's heap call in flight, in the
    /// slot of its thread id ([`super::THREAD_SLOTS`]).
    pub const HEAP_SLOTS: &str = "HEAP_SLOTS";
    /// Sampled live heap blocks.
    pub const HEAP_LIVE: &str = "HEAP_LIVE";
    /// Bytes to the next heap sample, per CPU.
    pub const HEAP_COUNTDOWN: &str = "HEAP_COUNTDOWN";
    /// Heap program counters (`heap::stat`), per CPU.
    pub const HEAP_STATS: &str = "HEAP_STATS";
    /// The heap programs' configuration (`.rodata`).
    pub const HEAP_CONFIG: &str = "HEAP_CONFIG";
    /// Processes whose memory system calls are traced.
    pub const HEAP_PIDS: &str = "HEAP_PIDS";
    /// Memory system calls in flight per thread.
    pub const HEAP_SYSCALLS: &str = "HEAP_SYSCALLS";
    /// Name of the read-only global that holds the [`super::ProbeConfig`].
    pub const CONFIG: &str = "CONFIG";
    /// Per process growth state (`growth::GrowthProc`).
    pub const GROWTH_PROCS: &str = "GROWTH_PROCS";
    /// Per CPU growth state (`growth::GrowthCpu`).
    pub const GROWTH_CPU: &str = "GROWTH_CPU";
    /// The generation of the growth decisions (one `u32`).
    pub const GROWTH_GEN: &str = "GROWTH_GEN";
    /// Processes selected for growth sampling (tgid -> 1).
    pub const GROWTH_SELECT: &str = "GROWTH_SELECT";
    /// Memory cgroups armed for growth sampling (cgroup id -> 1).
    pub const GROWTH_ARMED: &str = "GROWTH_ARMED";
    /// Counters of the growth programs (`growth::stat`).
    pub const GROWTH_STATS: &str = "GROWTH_STATS";
    /// The growth programs' configuration (`.rodata`).
    pub const GROWTH_CONFIG: &str = "GROWTH_CONFIG";
    /// `Array<usdt::UsdtSpec>`: how each attached USDT probe's arguments are read.
    pub const USDT_SPECS: &str = "USDT_SPECS";
    /// `HashMap<u32, python::PyLayout>`: where each process's CPython
    /// interpreter is, for the stack programs' walk of Python frames.
    pub const PY_PROCS: &str = "PY_PROCS";
    /// `Array<u32>` of one entry: non-zero when CUDA allocations of at
    /// least `cuda::STACK_MIN_BYTES` send their stacks.
    pub const CUDA_STACKS: &str = "CUDA_STACKS";
}

/// Names of the eBPF programs (the function names in `tracer-ebpf`).
pub mod programs {
    /// `tracepoint/oom/mark_victim`.
    pub const OOM_MARK_VICTIM: &str = "oom_mark_victim";
    /// `tracepoint/oom/start_task_reaping`.
    pub const OOM_START_TASK_REAPING: &str = "oom_start_task_reaping";
    /// `tracepoint/oom/finish_task_reaping`.
    pub const OOM_FINISH_TASK_REAPING: &str = "oom_finish_task_reaping";
    /// `raw_tracepoint/mm_vmscan_lru_shrink_inactive`.
    pub const MEMCG_RECLAIM: &str = "memcg_reclaim";
    /// `tracepoint/sched/sched_process_exec`.
    pub const SCHED_PROCESS_EXEC: &str = "sched_process_exec";
    /// `raw_tracepoint/sched_process_fork`.
    pub const SCHED_PROCESS_FORK: &str = "sched_process_fork";
    /// `tracepoint/sched/sched_process_exit`.
    pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
    /// `raw_tracepoint/signal_generate`.
    pub const SIGNAL_GENERATE: &str = "signal_generate";
    /// `tracepoint/cgroup/cgroup_mkdir`.
    pub const CGROUP_MKDIR: &str = "cgroup_mkdir";
    /// `tracepoint/cgroup/cgroup_rmdir`.
    pub const CGROUP_RMDIR: &str = "cgroup_rmdir";
    /// `uprobe` on every CUDA allocation API (the cookie says which).
    pub const CUDA_ENTRY: &str = "cuda_entry";
    /// `uretprobe` on every CUDA allocation API.
    pub const CUDA_RETURN: &str = "cuda_return";
    /// Empty `uprobe` at the same sites (the benchmark's floor).
    pub const CUDA_FLOOR_ENTRY: &str = "cuda_floor_entry";
    /// Empty `uretprobe` at the same sites.
    pub const CUDA_FLOOR_RETURN: &str = "cuda_floor_return";
    /// uprobe at the entry of every heap function.
    pub const HEAP_ENTRY: &str = "heap_entry";
    /// uretprobe at the return of every heap function but free.
    pub const HEAP_RETURN: &str = "heap_return";
    /// Empty twin of HEAP_ENTRY (benchmarks).
    pub const HEAP_FLOOR_ENTRY: &str = "heap_floor_entry";
    /// Empty twin of HEAP_RETURN (benchmarks).
    pub const HEAP_FLOOR_RETURN: &str = "heap_floor_return";
    /// `syscalls:sys_enter_mmap` for traced processes.
    pub const HEAP_MMAP_ENTER: &str = "heap_mmap_enter";
    /// `syscalls:sys_exit_mmap`.
    pub const HEAP_MMAP_EXIT: &str = "heap_mmap_exit";
    /// `syscalls:sys_enter_mremap`.
    pub const HEAP_MREMAP_ENTER: &str = "heap_mremap_enter";
    /// `syscalls:sys_exit_mremap`.
    pub const HEAP_MREMAP_EXIT: &str = "heap_mremap_exit";
    /// `syscalls:sys_enter_brk`.
    pub const HEAP_BRK_ENTER: &str = "heap_brk_enter";
    /// `syscalls:sys_exit_brk`.
    pub const HEAP_BRK_EXIT: &str = "heap_brk_exit";
    /// `syscalls:sys_enter_munmap`.
    pub const HEAP_MUNMAP_ENTER: &str = "heap_munmap_enter";
    /// `exceptions:page_fault_user`.
    pub const GROWTH_FAULT_USER: &str = "growth_fault_user";
    /// `exceptions:page_fault_kernel`.
    pub const GROWTH_FAULT_KERNEL: &str = "growth_fault_kernel";
    /// `cgroup:cgroup_attach_task`.
    pub const GROWTH_CGROUP_ATTACH: &str = "growth_cgroup_attach";
    /// `vm_unmapped_area` (large reservations of followed processes).
    pub const GROWTH_MMAP: &str = "growth_mmap";
    /// `tracepoint/oom/mark_victim`: the stack that tipped an OOM kill.
    pub const GROWTH_OOM_TIP: &str = "growth_oom_tip";
    /// `mmap_lock_acquire_returned` (memory given back: munmap, madvise).
    pub const GROWTH_MMAP_LOCK: &str = "growth_mmap_lock";
    /// `uprobe` at every attached USDT probe (the cookie is its spec's index).
    pub const USDT_PROBE: &str = "usdt_probe";
}

/// Sizes of the ring buffers, in bytes (powers of two, multiples of the page size).
pub mod ring {
    /// Index of the critical ring in `RING_DROPS`.
    pub const CRITICAL: u32 = 0;
    /// Index of the data ring in `RING_DROPS`.
    pub const DATA: u32 = 1;
    /// Index of the OOM ring in `RING_DROPS`.
    pub const OOM: u32 = 2;
    /// Number of rings.
    pub const COUNT: u32 = 3;
    /// Index in `RING_DROPS` of the SIGKILL events the critical ring could
    /// not take (also counted in [`CRITICAL`]'s slot): a storm's kills
    /// are counted whether stored or lost.
    pub const SIGKILLS: u32 = 3;
    /// Slots of `RING_DROPS`: one per ring and [`SIGKILLS`].
    pub const DROP_SLOTS: u32 = 4;
    /// 64 KiB: over 400 kill-sized events, for kernel OOM kills alone.
    pub const OOM_BYTES: u32 = 64 * 1024;
    /// 256 KiB: about 2,000 kill-sized events; the reader wakes on each one.
    pub const CRITICAL_BYTES: u32 = 256 * 1024;
    /// The data ring wakes its reader only once this much is waiting (the
    /// reader also polls): a wakeup per event would cost more than the event
    /// at hundreds of thousands of CUDA calls a second.
    pub const DATA_WAKEUP_BYTES: u64 = 64 * 1024;
    /// A CPU looks at how much a ring holds (for [`DATA_WAKEUP_BYTES`]) once
    /// it has submitted this much since it last looked, not at every event:
    /// the look reads positions the reader writes from another CPU, about
    /// 120 ns a submit on the test VM.
    pub const LOOK_BYTES: u64 = 4 * 1024;
    /// 2 MiB for the high-rate events: at 1,000 new processes a second
    /// (fork + exec, about 350 bytes) that is over 5 s of slack for the
    /// reader. Userspace maps the ring twice, so it costs twice this in RSS.
    pub const DATA_BYTES: u32 = 2 * 1024 * 1024;
}

/// Threads with a CUDA call in flight, and threads/contexts with a device.
pub const CUDA_THREAD_ENTRIES: u32 = 16384;

/// Slots of `CUDA_SLOTS` and `HEAP_SLOTS`, the per-thread state of the
/// uprobe families: one per thread id modulo this (a power of two). Array
/// slots cost the programs no map lookup (the verifier inlines an
/// array's), where a hash map's cost about 30 ns a call on the test VM.
pub const THREAD_SLOTS: u32 = 16384;
const _: () = assert!(THREAD_SLOTS.is_power_of_two());

/// Entries of the spill maps (`CUDA_INFLIGHT`, `HEAP_INFLIGHT`): threads
/// whose slot another thread's call held when they called (two threads
/// with ids equal modulo [`THREAD_SLOTS`], in calls at once).
pub const SPILL_ENTRIES: u32 = 1024;

/// Entries of `MEMCG_COUNTS` (LRU: an idle cgroup's counters age out).
pub const MEMCG_COUNTS_ENTRIES: u32 = 8192;

/// Event kinds (the first `u32` of every event).
pub mod kind {
    /// `oom:mark_victim`: the kernel OOM killer chose a victim ([`super::OomVictim`]).
    pub const OOM_VICTIM: u32 = 1;
    /// `oom:start_task_reaping` ([`super::Reap`]).
    pub const REAP_START: u32 = 2;
    /// `oom:finish_task_reaping` ([`super::Reap`]).
    pub const REAP_FINISH: u32 = 3;
    /// A memcg OOM kill counted through `memcg:count_memcg_events`
    /// ([`super::MemcgEvent`]). No program sends it since reclaim is read
    /// from `vmscan`; the kill itself comes from `oom:mark_victim`.
    pub const MEMCG_OOM: u32 = 4;
    /// `sched:sched_process_exec` ([`super::ProcExec`]).
    pub const PROC_EXEC: u32 = 5;
    /// `sched_process_fork` of a new process, not a thread ([`super::ProcFork`]).
    pub const PROC_FORK: u32 = 6;
    /// `sched:sched_process_exit` of a whole thread group ([`super::ProcExit`]).
    pub const PROC_EXIT: u32 = 7;
    /// `signal:signal_generate` of a SIGKILL ([`super::SignalKill`]).
    pub const SIGNAL_KILL: u32 = 8;
    /// A CUDA allocation API call returned ([`super::CudaCall`]).
    pub const CUDA_CALL: u32 = 9;
    /// A sampled heap allocation ([`crate::heap::HeapAlloc`]).
    pub const HEAP_ALLOC: u32 = 10;
    /// A sampled heap block freed ([`crate::heap::HeapFree`]).
    pub const HEAP_FREE: u32 = 11;
    /// A sampled page fault ([`crate::growth::GrowthSample`]).
    pub const GROWTH_FAULT: u32 = 12;
    /// The stack of the allocation that tipped an OOM kill
    /// ([`crate::growth::GrowthSample`]).
    pub const OOM_TIP: u32 = 13;
    /// A USDT probe fired ([`crate::usdt::UsdtEvent`]).
    pub const USDT: u32 = 14;
    /// `cgroup:cgroup_mkdir`: a cgroup was made ([`super::CgroupDir`]).
    pub const CGROUP_MKDIR: u32 = 15;
    /// `cgroup:cgroup_rmdir`: a cgroup was removed ([`super::CgroupDir`]).
    pub const CGROUP_RMDIR: u32 = 16;
    /// The user stack of a CUDA allocation of at least
    /// [`super::cuda::STACK_MIN_BYTES`] that succeeded
    /// ([`crate::heap::HeapAlloc`]: `addr` the device pointer, `size` its
    /// bytes, `func` the CUDA function).
    pub const CUDA_STACK: u32 = 17;
    /// A followed process gave a range back
    /// ([`crate::growth::GrowthReturn`]).
    pub const GROWTH_RETURN: u32 = 18;
}

/// What every event starts with. The task fields describe `current`: the
/// task in whose context the hook ran (for `mark_victim`, the task whose
/// allocation triggered the OOM kill; for a signal, the sender).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// `bpf_ktime_get_boot_ns()`.
    pub ts_boot_ns: u64,
    /// Process id (kernel tgid) of `current`.
    pub pid: u32,
    /// Thread id (kernel pid) of `current`.
    pub tid: u32,
    /// Name of `current`, NUL-padded.
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<EventHeader>() == 40);

/// Bits of [`OomVictim::present`]: which fields this kernel's `mark_victim`
/// tracepoint provides (kernels before 6.8 give only the pid).
pub mod victim_field {
    /// `comm`.
    pub const COMM: u16 = 1 << 0;
    /// `total_vm`.
    pub const TOTAL_VM: u16 = 1 << 1;
    /// `anon_rss`, `file_rss`, `shmem_rss`.
    pub const RSS: u16 = 1 << 2;
    /// `uid`.
    pub const UID: u16 = 1 << 3;
    /// `pgtables`.
    pub const PGTABLES: u16 = 1 << 4;
    /// `oom_score_adj`.
    pub const OOM_SCORE_ADJ: u16 = 1 << 5;
    /// Not a field: the kernel's SIGKILL to the victim was seen just before
    /// the mark (its start and cgroup came with it). Without it, where the
    /// signal probe runs, the victim was already exiting and the kernel
    /// only gave it memory reserves.
    pub const KILL_SEEN: u16 = 1 << 6;
}

/// `oom:mark_victim`: the OOM killer marked `victim_pid` to die. The header
/// is the task that triggered the kill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomVictim {
    /// Common header (`kind` = [`kind::OOM_VICTIM`]).
    pub header: EventHeader,
    /// Victim process id.
    pub victim_pid: u32,
    /// Victim's uid.
    pub uid: u32,
    /// Victim's virtual size, kB.
    pub total_vm_kb: u64,
    /// Victim's anonymous RSS, kB.
    pub anon_rss_kb: u64,
    /// Victim's file-backed RSS, kB.
    pub file_rss_kb: u64,
    /// Victim's shared-memory RSS, kB.
    pub shmem_rss_kb: u64,
    /// Victim's page tables, kB.
    pub pgtables_kb: u64,
    /// Victim's `oom_score_adj`.
    pub oom_score_adj: i16,
    /// Which fields the kernel filled in ([`victim_field`] bits).
    pub present: u16,
    /// Explicit padding.
    pub _pad: u32,
    /// Memory cgroup id (its kernfs node id) of the task that triggered the
    /// kill, read from its task_struct at the kill; 0 when unknown. When the
    /// trigger is the victim (a process killed for its own allocation), it is
    /// the victim's cgroup from the kernel, whatever /proc says later.
    pub trigger_memcg_id: u64,
    /// Victim's name, NUL-padded.
    pub victim_comm: [u8; COMM_LEN],
    /// Victim's start ([`ProcFork::child_start_ns`]): current's when it is
    /// the task that triggered the kill, else as read at the SIGKILL the
    /// OOM killer sent it just before (the tracepoint gives only its pid);
    /// 0 when unknown.
    pub victim_start_ns: u64,
    /// Victim's memory cgroup id, read from its task_struct as the start
    /// is; 0 when unknown.
    pub victim_memcg_id: u64,
}
const _: () = assert!(size_of::<OomVictim>() == 136);

/// `oom:start_task_reaping` / `oom:finish_task_reaping`: the OOM reaper
/// started or finished freeing the victim's memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reap {
    /// Common header (`kind` = [`kind::REAP_START`] or [`kind::REAP_FINISH`]).
    pub header: EventHeader,
    /// The victim being reaped.
    pub victim_pid: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Reap>() == 48);

/// `memcg:count_memcg_events` for an OOM-kill item (kernels that count
/// `OOM_KILL` through the memcg event counters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgEvent {
    /// Common header (`kind` = [`kind::MEMCG_OOM`]).
    pub header: EventHeader,
    /// cgroup id of the memory cgroup (the inode of its directory).
    pub memcg_id: u64,
    /// `enum vm_event_item` value.
    pub item: i32,
    /// Explicit padding.
    pub _pad: u32,
    /// Count added.
    pub val: u64,
}
const _: () = assert!(size_of::<MemcgEvent>() == 64);

/// Key of `MEMCG_COUNTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemcgCountKey {
    /// cgroup id of the memory cgroup.
    pub memcg_id: u64,
    /// `enum vm_event_item` value.
    pub item: i32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<MemcgCountKey>() == 16);

/// `sched:sched_process_exec`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcExec {
    /// Common header (`kind` = [`kind::PROC_EXEC`]); `comm` is the new name.
    pub header: EventHeader,
    /// Pid after exec (a non-leader thread that execs takes the leader's pid).
    pub pid: u32,
    /// Pid of the thread that called exec.
    pub old_pid: u32,
    /// Memory cgroup id (kernfs node id) of the process at exec, from its
    /// task_struct; 0 when unknown. A process that joins a cgroup and execs
    /// is placed by this even when it is gone before /proc can be read.
    pub memcg_id: u64,
    /// The process's start ([`ProcFork::child_start_ns`]).
    pub start_ns: u64,
    /// The file exec'd, NUL-terminated, cut at [`FILENAME_LEN`].
    pub filename: [u8; FILENAME_LEN],
    /// Length of the new program's argument block (`mm->arg_end -
    /// arg_start`), which may be more than `args` holds; 0 = not read.
    pub args_total: u32,
    /// Bytes of the block in `args` (the rest of `args` is not written).
    pub args_len: u32,
    /// The arguments as /proc/PID/cmdline has them (NUL after each), read
    /// at exec: a program killed a moment later keeps its command line.
    pub args: [u8; ARGS_LEN],
}
const _: () = assert!(size_of::<ProcExec>() == 840);

/// A new process (not a thread) was forked. Read from the raw
/// `sched_process_fork` tracepoint, which hands us the child's task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcFork {
    /// Common header (`kind` = [`kind::PROC_FORK`]); the task is the parent.
    pub header: EventHeader,
    /// The child's process id.
    pub child_pid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The child's start: its `task_struct.start_boottime` (boot-clock ns,
    /// what /proc/PID/stat's start time is in clock ticks); with the pid,
    /// what names a process for as long as the machine runs. 0 = unknown.
    pub child_start_ns: u64,
}
const _: () = assert!(size_of::<ProcFork>() == 56);

/// `sched:sched_process_exit` of the last thread of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcExit {
    /// Common header (`kind` = [`kind::PROC_EXIT`]); the task is the one exiting.
    pub header: EventHeader,
    /// Process id that exited.
    pub pid: u32,
    /// Non-zero when the RSS fields were read (the kernel still had the
    /// process's mm when the tracepoint fired, as recent kernels do).
    pub rss_known: u32,
    /// File-backed pages at exit (the kernel's approximate counter).
    pub rss_file_pages: u64,
    /// Anonymous pages at exit.
    pub rss_anon_pages: u64,
    /// Shared-memory pages at exit.
    pub rss_shmem_pages: u64,
    /// The process's start ([`ProcFork::child_start_ns`]).
    pub start_ns: u64,
    /// `task_struct.exit_code` of its last thread, as wait(2) would give it:
    /// the status shifted left 8 bits after exit(), the signal's number
    /// (0x80 with a core dump) after a fatal signal.
    pub exit_code: i32,
    /// Non-zero when `exit_code` was read.
    pub exit_known: u32,
}
const _: () = assert!(size_of::<ProcExit>() == 88);

/// `cgroup:cgroup_mkdir` or `cgroup_rmdir`, in any hierarchy: what keeps
/// the recorder's map of memory cgroup ids to paths current, so a new
/// container's first programs are placed in it, not in its parent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupDir {
    /// Common header (`kind` = [`kind::CGROUP_MKDIR`] or
    /// [`kind::CGROUP_RMDIR`]); the task is the one that made or removed it.
    pub header: EventHeader,
    /// The hierarchy's id, as `/proc/cgroups` numbers it (0: the unified
    /// hierarchy).
    pub root: i32,
    /// Depth below the hierarchy's root.
    pub level: i32,
    /// The cgroup's id: its kernfs node id, the inode of its directory,
    /// as the events' `memcg_id` fields hold it.
    pub id: u64,
    /// Bytes of the path with its NUL, as the kernel recorded it: more
    /// than [`CGROUP_PATH_LEN`] means `path` was cut.
    pub path_len: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The path from the hierarchy's root, NUL-terminated.
    pub path: [u8; CGROUP_PATH_LEN],
}
const _: () = assert!(size_of::<CgroupDir>() == 64 + CGROUP_PATH_LEN);

/// `signal_generate` of SIGKILL, read from the raw tracepoint, which
/// hands us the target's task. The header is the sender.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalKill {
    /// Common header (`kind` = [`kind::SIGNAL_KILL`]).
    pub header: EventHeader,
    /// Target process id (its tgid: a SIGKILL ends the whole process).
    pub target_pid: u32,
    /// Signal number (9).
    pub sig: i32,
    /// `si_code`: 0 (`SI_USER`, kill(2)), 0x80 (`SI_KERNEL`), negative for tkill/queue.
    pub code: i32,
    /// Non-zero when sent to the whole thread group.
    pub group: i32,
    /// `TRACE_SIGNAL_*` result (0 = delivered).
    pub result: i32,
    /// Explicit padding.
    pub _pad: u32,
    /// Target's name, NUL-padded.
    pub target_comm: [u8; COMM_LEN],
    /// Target's start ([`ProcFork::child_start_ns`]).
    pub target_start_ns: u64,
    /// Target's memory cgroup id (kernfs node id) from its task_struct at
    /// the signal; 0 when unknown. A process killed a moment after it
    /// joined a cgroup and exec'd is placed by this, not by what was read
    /// of it before.
    pub target_memcg_id: u64,
}
const _: () = assert!(size_of::<SignalKill>() == 96);

/// CUDA runtime (`cuda*`) and driver (`cu*`) functions tracer probes.
/// The id is the uprobe's attach cookie and the `func` of [`CudaCall`];
/// runtime ids are below [`cuda::DRIVER`].
pub mod cuda {
    /// `cudaMalloc(void **devPtr, size_t size)`.
    pub const MALLOC: u32 = 1;
    /// `cudaMallocManaged(void **devPtr, size_t size, unsigned flags)`.
    pub const MALLOC_MANAGED: u32 = 2;
    /// `cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)`.
    pub const MALLOC_PITCH: u32 = 3;
    /// `cudaMallocAsync(void **devPtr, size_t size, cudaStream_t)`.
    pub const MALLOC_ASYNC: u32 = 4;
    /// `cudaMallocAsync_ptsz` (per-thread default stream builds).
    pub const MALLOC_ASYNC_PTSZ: u32 = 5;
    /// `cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t, cudaStream_t)`.
    pub const MALLOC_FROM_POOL_ASYNC: u32 = 6;
    /// `cudaMallocFromPoolAsync_ptsz`.
    pub const MALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 7;
    /// `cudaMallocHost(void **ptr, size_t size)`.
    pub const MALLOC_HOST: u32 = 8;
    /// `cudaHostAlloc(void **pHost, size_t size, unsigned flags)`.
    pub const HOST_ALLOC: u32 = 9;
    /// `cudaFree(void *devPtr)`.
    pub const FREE: u32 = 10;
    /// `cudaFreeAsync(void *devPtr, cudaStream_t)`.
    pub const FREE_ASYNC: u32 = 11;
    /// `cudaFreeAsync_ptsz`.
    pub const FREE_ASYNC_PTSZ: u32 = 12;
    /// `cudaFreeHost(void *ptr)`.
    pub const FREE_HOST: u32 = 13;
    /// `cudaSetDevice(int device)`.
    pub const SET_DEVICE: u32 = 14;
    /// First driver id.
    pub const DRIVER: u32 = 32;
    /// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
    pub const MEM_ALLOC: u32 = 32;
    /// `cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned flags)`.
    pub const MEM_ALLOC_MANAGED: u32 = 33;
    /// `cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h, unsigned elem)`.
    pub const MEM_ALLOC_PITCH: u32 = 34;
    /// `cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream)`.
    pub const MEM_ALLOC_ASYNC: u32 = 35;
    /// `cuMemAllocAsync_ptsz`.
    pub const MEM_ALLOC_ASYNC_PTSZ: u32 = 36;
    /// `cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t, CUmemoryPool, CUstream)`.
    pub const MEM_ALLOC_FROM_POOL_ASYNC: u32 = 37;
    /// `cuMemAllocFromPoolAsync_ptsz`.
    pub const MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 38;
    /// `cuMemAllocHost_v2(void **pp, size_t bytesize)`.
    pub const MEM_ALLOC_HOST: u32 = 39;
    /// `cuMemHostAlloc(void **pp, size_t bytesize, unsigned flags)`.
    pub const MEM_HOST_ALLOC: u32 = 40;
    /// `cuMemFree_v2(CUdeviceptr dptr)`.
    pub const MEM_FREE: u32 = 41;
    /// `cuMemFreeAsync(CUdeviceptr dptr, CUstream)`.
    pub const MEM_FREE_ASYNC: u32 = 42;
    /// `cuMemFreeAsync_ptsz`.
    pub const MEM_FREE_ASYNC_PTSZ: u32 = 43;
    /// `cuMemFreeHost(void *p)`.
    pub const MEM_FREE_HOST: u32 = 44;
    /// `cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, u64 flags)`.
    pub const MEM_CREATE: u32 = 45;
    /// `cuMemRelease(CUmemGenericAllocationHandle h)`.
    pub const MEM_RELEASE: u32 = 46;
    /// `cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, u64 flags)`.
    pub const MEM_MAP: u32 = 47;
    /// `cuMemUnmap(CUdeviceptr ptr, size_t size)`.
    pub const MEM_UNMAP: u32 = 48;
    /// `cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, u64 flags)`.
    pub const MEM_ADDRESS_RESERVE: u32 = 49;
    /// `cuMemAddressFree(CUdeviceptr ptr, size_t size)`.
    pub const MEM_ADDRESS_FREE: u32 = 50;
    /// `cuCtxSetCurrent(CUcontext ctx)`.
    pub const CTX_SET_CURRENT: u32 = 51;
    /// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
    pub const DEVICE_PRIMARY_CTX_RETAIN: u32 = 52;
    /// `cuDevicePrimaryCtxReset_v2(CUdevice dev)`: frees every allocation of the context.
    pub const DEVICE_PRIMARY_CTX_RESET: u32 = 53;
    /// `cuInit(unsigned flags)`: the driver's start; on a node without a
    /// usable GPU it is where the reason shows (no device, no kernel module).
    pub const INIT: u32 = 54;
    /// `cudaDeviceReset(void)`: the current device's context, freed.
    pub const DEVICE_RESET: u32 = 15;

    /// `cudaErrorMemoryAllocation` and `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = 2;

    /// A successful allocation of at least this many bytes sends its user
    /// stack ([`super::kind::CUDA_STACK`]): the allocations that make up a
    /// device's memory, at one stack copy each.
    pub const STACK_MIN_BYTES: u64 = 1 << 20;

    /// The `func` of a [`super::kind::CUDA_STACK`] event that is not a CUDA
    /// call but a block a caching allocator handed out (PyTorch's
    /// `pytorch:malloc` probe): its stack is the tensor's.
    pub const CACHING_BLOCK: u32 = 0xb10c;

    /// Smaller allocations send theirs once per this many bytes allocated
    /// on average (byte sampling, as the heap's), unless told otherwise.
    pub const STACK_SAMPLE_BYTES: u64 = 512 << 10;

    /// The value of the `CUDA_STACKS` map: whether allocations send their
    /// stacks, and how those under [`STACK_MIN_BYTES`] are sampled.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StackConfig {
        /// Non-zero: allocations send stacks.
        pub on: u32,
        /// Padding.
        pub _pad: u32,
        /// Mean bytes between samples under [`STACK_MIN_BYTES`] (0: every
        /// allocation sends its stack).
        pub sample_bytes: u64,
    }

    /// Whether a successful call of `func` releases what its `ptr` names.
    pub const fn frees(func: u32) -> bool {
        matches!(shape(func), Some(Shape::Free))
    }

    /// Whether a successful call of `func` resets a device's context (and
    /// so frees every allocation on it).
    pub const fn resets(func: u32) -> bool {
        matches!(shape(func), Some(Shape::Reset))
    }

    /// Offset of `location.id` in `CUmemAllocationProp` (`type`,
    /// `requestedHandleTypes`, then `CUmemLocation { type, id }`): a stable
    /// part of the CUDA driver ABI.
    pub const PROP_LOCATION_ID: u64 = 12;

    /// How a function's arguments are read.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Shape {
        /// `(T **out, size_t size, ...)`: the new pointer is written to `*out`.
        Alloc,
        /// `(T **out, size_t *pitch, size_t width, size_t height, ...)`.
        Pitch,
        /// `(T *ptr, ...)`.
        Free,
        /// `cuMemCreate`: handle out, size, and the device from `prop`.
        Create,
        /// `cuMemMap`: address, size, handle (4th argument).
        Map,
        /// `(ptr, size)`: `cuMemUnmap`, `cuMemAddressFree`.
        PtrSize,
        /// `cudaSetDevice(int)`.
        SetDevice,
        /// `cuCtxSetCurrent(ctx)`.
        SetContext,
        /// `cuDevicePrimaryCtxRetain(CUcontext *out, CUdevice dev)`.
        RetainContext,
        /// A context reset: `cuDevicePrimaryCtxReset_v2(dev)`, `cudaDeviceReset()`.
        Reset,
        /// `cuInit(flags)`: flags in `aux`.
        Init,
    }

    /// The shape of function `func` (`None` for unknown ids).
    pub const fn shape(func: u32) -> Option<Shape> {
        Some(match func {
            MALLOC
            | MALLOC_MANAGED
            | MALLOC_ASYNC
            | MALLOC_ASYNC_PTSZ
            | MALLOC_FROM_POOL_ASYNC
            | MALLOC_FROM_POOL_ASYNC_PTSZ
            | MALLOC_HOST
            | HOST_ALLOC
            | MEM_ALLOC
            | MEM_ALLOC_MANAGED
            | MEM_ALLOC_ASYNC
            | MEM_ALLOC_ASYNC_PTSZ
            | MEM_ALLOC_FROM_POOL_ASYNC
            | MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
            | MEM_ALLOC_HOST
            | MEM_HOST_ALLOC
            | MEM_ADDRESS_RESERVE => Shape::Alloc,
            MALLOC_PITCH | MEM_ALLOC_PITCH => Shape::Pitch,
            FREE | FREE_ASYNC | FREE_ASYNC_PTSZ | FREE_HOST | MEM_FREE | MEM_FREE_ASYNC
            | MEM_FREE_ASYNC_PTSZ | MEM_FREE_HOST | MEM_RELEASE => Shape::Free,
            MEM_CREATE => Shape::Create,
            MEM_MAP => Shape::Map,
            MEM_UNMAP | MEM_ADDRESS_FREE => Shape::PtrSize,
            SET_DEVICE => Shape::SetDevice,
            CTX_SET_CURRENT => Shape::SetContext,
            DEVICE_PRIMARY_CTX_RETAIN => Shape::RetainContext,
            DEVICE_RESET | DEVICE_PRIMARY_CTX_RESET => Shape::Reset,
            INIT => Shape::Init,
            _ => return None,
        })
    }

    /// Whether `func` allocates (a failure with [`OUT_OF_MEMORY`] is a GPU OOM).
    pub const fn allocates(func: u32) -> bool {
        matches!(
            shape(func),
            Some(Shape::Alloc | Shape::Pitch | Shape::Create)
        ) && func != MEM_ADDRESS_RESERVE
    }

    /// Every probed function: (id, symbol).
    pub const FUNCTIONS: &[(u32, &str)] = &[
        (MALLOC, "cudaMalloc"),
        (MALLOC_MANAGED, "cudaMallocManaged"),
        (MALLOC_PITCH, "cudaMallocPitch"),
        (MALLOC_ASYNC, "cudaMallocAsync"),
        (MALLOC_ASYNC_PTSZ, "cudaMallocAsync_ptsz"),
        (MALLOC_FROM_POOL_ASYNC, "cudaMallocFromPoolAsync"),
        (MALLOC_FROM_POOL_ASYNC_PTSZ, "cudaMallocFromPoolAsync_ptsz"),
        (MALLOC_HOST, "cudaMallocHost"),
        (HOST_ALLOC, "cudaHostAlloc"),
        (FREE, "cudaFree"),
        (FREE_ASYNC, "cudaFreeAsync"),
        (FREE_ASYNC_PTSZ, "cudaFreeAsync_ptsz"),
        (FREE_HOST, "cudaFreeHost"),
        (SET_DEVICE, "cudaSetDevice"),
        (DEVICE_RESET, "cudaDeviceReset"),
        (MEM_ALLOC, "cuMemAlloc_v2"),
        (MEM_ALLOC_MANAGED, "cuMemAllocManaged"),
        (MEM_ALLOC_PITCH, "cuMemAllocPitch_v2"),
        (MEM_ALLOC_ASYNC, "cuMemAllocAsync"),
        (MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync_ptsz"),
        (MEM_ALLOC_FROM_POOL_ASYNC, "cuMemAllocFromPoolAsync"),
        (
            MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
            "cuMemAllocFromPoolAsync_ptsz",
        ),
        (MEM_ALLOC_HOST, "cuMemAllocHost_v2"),
        (MEM_HOST_ALLOC, "cuMemHostAlloc"),
        (MEM_FREE, "cuMemFree_v2"),
        (MEM_FREE_ASYNC, "cuMemFreeAsync"),
        (MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync_ptsz"),
        (MEM_FREE_HOST, "cuMemFreeHost"),
        (MEM_CREATE, "cuMemCreate"),
        (MEM_RELEASE, "cuMemRelease"),
        (MEM_MAP, "cuMemMap"),
        (MEM_UNMAP, "cuMemUnmap"),
        (MEM_ADDRESS_RESERVE, "cuMemAddressReserve"),
        (MEM_ADDRESS_FREE, "cuMemAddressFree"),
        (CTX_SET_CURRENT, "cuCtxSetCurrent"),
        (DEVICE_PRIMARY_CTX_RETAIN, "cuDevicePrimaryCtxRetain"),
        (DEVICE_PRIMARY_CTX_RESET, "cuDevicePrimaryCtxReset_v2"),
        (INIT, "cuInit"),
    ];

    /// The symbol of function `id`.
    pub fn name(id: u32) -> &'static str {
        crate::name_in(FUNCTIONS, id)
    }

    /// How long a thread's name read at one call serves its next calls:
    /// reading it costs about 80 ns a call on the test VM, a third of
    /// what the return program added to a call.
    pub const COMM_FRESH_NS: u64 = 1_000_000_000;
}

/// A CUDA call in flight on one thread (the outermost one: calls it makes
/// into other probed functions only deepen `depth`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaInflight {
    /// The thread (pid_tgid) this state belongs to: in `CUDA_SLOTS`, the
    /// slot's current owner.
    pub owner: u64,
    /// Function id ([`cuda`]).
    pub func: u32,
    /// Probed calls open on this thread (1 = only the outermost).
    pub depth: u32,
    /// Entry time, `bpf_ktime_get_boot_ns`.
    pub ts_ns: u64,
    /// Bytes asked for (the height for pitched allocations).
    pub size: u64,
    /// User address where the callee writes its result (pointer, handle, context).
    pub out_addr: u64,
    /// Pointer or handle passed in (frees, maps).
    pub ptr: u64,
    /// Second value: `cuMemMap`'s handle, a context, a pitch out-pointer.
    pub aux: u64,
    /// Device the call names (`cudaSetDevice`, `cuMemCreate`), else -1.
    pub device: i32,
    /// Explicit padding.
    pub _pad: u32,
    /// What the thread's entry keeps across its calls.
    pub thread: CudaThread,
}
const _: () = assert!(size_of::<CudaInflight>() == 96);

/// What a thread's [`CudaInflight`] entry keeps from call to call (the
/// entry stays while the thread does).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaThread {
    /// The device this thread last made current (`cudaSetDevice`, a
    /// context of a known device made current), -1 when unknown.
    pub device: i32,
    /// Explicit padding.
    pub _pad: u32,
    /// The thread's name, as last read.
    pub comm: [u8; COMM_LEN],
    /// When `comm` was read (`bpf_ktime_get_boot_ns`); it is read again
    /// once it is [`cuda::COMM_FRESH_NS`] old, so a rename or an exec shows
    /// within that time.
    pub comm_ns: u64,
}

/// A CUDA allocation-API call, sent when its outermost probed frame returns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCall {
    /// Common header (`kind` = [`kind::CUDA_CALL`]); the task is the caller.
    pub header: EventHeader,
    /// Function id ([`cuda`]).
    pub func: u32,
    /// Return code (`cudaError_t` / `CUresult`; 0 = success).
    pub ret: i32,
    /// Bytes (for pitched allocations: pitch x height).
    pub size: u64,
    /// The resulting pointer/handle (allocations), or the one passed in (frees).
    pub ptr: u64,
    /// `cuMemMap`'s handle; a context for context calls.
    pub aux: u64,
    /// Time in the call, ns.
    pub latency_ns: u64,
    /// Device: the one the call names, else the thread's current one; -1 unknown.
    pub device: i32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<CudaCall>() == 88);

/// A field offset that the running kernel's tracepoint does not have.
pub const FIELD_ABSENT: u16 = u16::MAX;

/// Indexes into [`ProbeConfig::fields`]: the tracepoint fields the programs
/// read. Offsets come from the tracefs `format` files of the running kernel,
/// never from compiled-in constants.
pub mod field {
    /// `oom:mark_victim` `pid`.
    pub const MV_PID: usize = 0;
    /// `oom:mark_victim` `comm` (a `__data_loc char[]`).
    pub const MV_COMM: usize = 1;
    /// `oom:mark_victim` `total_vm`.
    pub const MV_TOTAL_VM: usize = 2;
    /// `oom:mark_victim` `anon_rss`.
    pub const MV_ANON_RSS: usize = 3;
    /// `oom:mark_victim` `file_rss`.
    pub const MV_FILE_RSS: usize = 4;
    /// `oom:mark_victim` `shmem_rss`.
    pub const MV_SHMEM_RSS: usize = 5;
    /// `oom:mark_victim` `uid`.
    pub const MV_UID: usize = 6;
    /// `oom:mark_victim` `pgtables`.
    pub const MV_PGTABLES: usize = 7;
    /// `oom:mark_victim` `oom_score_adj`.
    pub const MV_OOM_SCORE_ADJ: usize = 8;
    /// `oom:start_task_reaping` / `finish_task_reaping` `pid`.
    pub const REAP_PID: usize = 9;
    /// `sched:sched_process_exec` `filename` (a `__data_loc char[]`).
    pub const EXEC_FILENAME: usize = 10;
    /// `sched:sched_process_exec` `pid`.
    pub const EXEC_PID: usize = 11;
    /// `sched:sched_process_exec` `old_pid`.
    pub const EXEC_OLD_PID: usize = 12;
    /// `sched:sched_process_exit` `pid`.
    pub const EXIT_PID: usize = 13;
    /// `sched:sched_process_exit` `group_dead` (newer kernels only).
    pub const EXIT_GROUP_DEAD: usize = 14;
    /// `cgroup:cgroup_attach_task` `pid`.
    pub const CGROUP_ATTACH_PID: usize = 15;
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir` `root` (the hierarchy id).
    pub const CGDIR_ROOT: usize = 16;
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir` `level`.
    pub const CGDIR_LEVEL: usize = 17;
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir` `id` (a `u64` since 5.5).
    pub const CGDIR_ID: usize = 18;
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir` `path` (a `__data_loc char[]`).
    pub const CGDIR_PATH: usize = 19;
    /// Number of fields.
    pub const COUNT: usize = 20;
}

/// Number of memcg event items aggregated in `MEMCG_COUNTS`.
pub const MEMCG_COUNTED_ITEMS: usize = 4;

/// Read-only configuration of the programs, written by userspace into the
/// `CONFIG` global before load (the verifier then sees constants).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Tracepoint field offsets, indexed by [`field`]; [`FIELD_ABSENT`] where missing.
    pub fields: [u16; field::COUNT],
    /// Offset of `task_struct.tgid` (from BTF), for the raw fork tracepoint.
    pub task_tgid_off: u32,
    /// Offsets in `task_struct` (from BTF) of `group_leader`,
    /// `start_boottime` (`real_start_time` before 5.5) and `comm`: a
    /// process's start, and the target of a signal; 0 = unknown.
    pub task_leader_off: u32,
    /// See `task_leader_off`.
    pub task_start_off: u32,
    /// See `task_leader_off`.
    pub task_comm_off: u32,
    /// Offset of `task_struct.mm` (from BTF); 0 = unknown.
    pub task_mm_off: u32,
    /// Offsets in `mm_struct` of the file, anon and shmem RSS counters
    /// (a `long`/`s64` each, from BTF); 0 = unknown.
    pub mm_rss_off: [u32; 3],
    /// The keys the reclaim counters of `MEMCG_COUNTS` are kept under:
    /// pages scanned and reclaimed, directly and by kswapd (userspace
    /// sets each item's slot); -1 = not counted.
    pub memcg_counted_items: [i32; MEMCG_COUNTED_ITEMS],
    /// The chain from a task to its memory cgroup's id, offsets from BTF
    /// (0 = unknown): `task_struct.cgroups` (a `css_set *`), then in the
    /// css_set the `subsys[memory_cgrp_id]` slot (a `cgroup_subsys_state *`),
    /// `cgroup_subsys_state.cgroup`, `cgroup.kn`, `kernfs_node.id` (u64, 5.5+).
    pub memcg_chain: [u32; 5],
    /// Offset of `mm_struct.start_stack` (from BTF): where the main
    /// thread's stack began at exec; 0 = unknown.
    pub mm_start_stack_off: u32,
    /// Offsets of `mm_struct.arg_start` and `arg_end` (from BTF), for the
    /// arguments of a new program; 0 = unknown.
    pub mm_arg_off: [u32; 2],
    /// Offset in `task_struct` of `thread.fsbase` (from BTF): a thread's
    /// `pthread_self()` on x86_64, which CPython before 3.11 names its
    /// threads by; 0 = unknown.
    pub task_fsbase_off: u32,
    /// Offset of `task_struct.exit_code` (from BTF): how a process ended;
    /// 0 = unknown.
    pub task_exit_code_off: u32,
}
const _: () = assert!(size_of::<ProbeConfig>() == 128);

impl ProbeConfig {
    /// A configuration with every field absent; userspace fills it in.
    pub const fn empty() -> Self {
        Self {
            fields: [FIELD_ABSENT; field::COUNT],
            task_tgid_off: 0,
            task_leader_off: 0,
            task_start_off: 0,
            task_comm_off: 0,
            task_mm_off: 0,
            mm_rss_off: [0; 3],
            memcg_counted_items: [-1; MEMCG_COUNTED_ITEMS],
            memcg_chain: [0; 5],
            mm_start_stack_off: 0,
            mm_arg_off: [0; 2],
            task_fsbase_off: 0,
            task_exit_code_off: 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: every type below is #[repr(C)], Copy, made only of integers
    // and integer arrays, with explicit padding fields: any bit pattern is valid.
    unsafe impl aya::Pod for ProbeConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for MemcgCountKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CudaInflight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for cuda::StackConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for heap::HeapConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for heap::HeapInflight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for heap::HeapKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for growth::GrowthConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for growth::GrowthProc {}
    // SAFETY: as above.
    unsafe impl aya::Pod for growth::GrowthCpu {}
    // SAFETY: as above.
    unsafe impl aya::Pod for usdt::UsdtSpec {}
    // SAFETY: as above.
    unsafe impl aya::Pod for python::PyLayout {}
}
