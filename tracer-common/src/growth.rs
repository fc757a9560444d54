//! The growth family: which code faults new memory into a process, for any
//! language and allocator. The page-fault tracepoints count the bytes each
//! process faults in and, one sample per `sample_bytes` on average, send the
//! faulting task's registers and user stack (the same [`HeapAlloc`] layout
//! as a heap sample); at an OOM kill the task whose allocation hit the limit
//! sends its stack the same way.
//!
//! [`HeapAlloc`]: crate::heap::HeapAlloc

use crate::heap::EXP_TABLE_LEN;

/// A sample of the growth family: the layout of a heap sample. For a fault
/// `addr` is the faulting address, `size` the bytes of one page and `func`
/// [`FAULT_USER`] or [`FAULT_KERNEL`]; for the allocation that tipped an OOM
/// kill `addr` is the victim's pid, `size` 0 and `func` [`TIP`].
pub type GrowthSample = crate::heap::HeapAlloc;

/// A fault taken in user mode (`exceptions:page_fault_user`).
pub const FAULT_USER: u32 = 16;
/// A fault on user memory taken by the kernel on the process's behalf
/// (`exceptions:page_fault_kernel`, e.g. `read()` into a new buffer).
pub const FAULT_KERNEL: u32 = 17;
/// The stack of the task whose allocation hit the limit, at `oom:mark_victim`.
pub const TIP: u32 = 18;
/// A large anonymous `mmap` of a followed process (a reservation: memory
/// that faults in later); `size` is its length.
pub const RESERVE: u32 = 19;

/// A followed process gave memory back (`munmap`, or `madvise` that drops
/// pages): the range, so that sampled faults in it stop counting as kept.
/// Sent without a stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthReturn {
    /// Common header (`kind` = [`crate::kind::GROWTH_RETURN`]).
    pub header: crate::EventHeader,
    /// Start of the range.
    pub start: u64,
    /// Its length, bytes.
    pub len: u64,
}
const _: () = assert!(size_of::<GrowthReturn>() == size_of::<crate::EventHeader>() + 16);

/// `madvise` advice that drops a range's pages (they fault in anew):
/// `MADV_DONTNEED`, `MADV_FREE` and `MADV_REMOVE`.
pub const DROPPING_ADVICE: [u64; 3] = [4, 8, 9];

/// Which processes the fault programs follow ([`GrowthConfig::mode`]).
pub mod mode {
    /// None: the fault programs return at once.
    pub const OFF: u32 = 0;
    /// Processes whose memory cgroup, or one above it, has a limit.
    pub const LIMITED: u32 = 1;
    /// Every process.
    pub const ALL: u32 = 2;
    /// The processes userspace lists in `GROWTH_SELECT`.
    pub const SELECTED: u32 = 3;
    /// Processes in the memory cgroups userspace armed (`GROWTH_ARMED`, by
    /// cgroup id): the cgroups at risk of reaching their limit.
    pub const ARMED: u32 = 4;
}

/// Levels of the memory cgroup hierarchy looked at for a limit.
pub const LIMIT_LEVELS: usize = 8;
/// Processes followed at once (`GROWTH_PROCS`, an LRU map).
pub const PROC_ENTRIES: u32 = 65_536;
/// Processes userspace may select (`GROWTH_SELECT`).
pub const SELECT_ENTRIES: u32 = 4096;
/// Memory cgroups userspace may arm at once (`GROWTH_ARMED`): an armed
/// cgroup and every cgroup below it, each by its id.
pub const ARMED_ENTRIES: u32 = 4096;
/// Bytes one fault stands for (a base page on x86_64; a transparent huge
/// page fault maps more, and is counted as one page).
pub const PAGE: u64 = 4096;

/// x86 page fault error code bits (arch/x86/include/asm/trap_pf.h).
pub mod error_code {
    /// A write access (the only faults growth attribution counts).
    pub const WRITE: u64 = 1 << 1;
}

/// Read-only configuration of the growth programs (`.rodata`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthConfig {
    /// One of [`mode`].
    pub mode: u32,
    /// Offset of `struct mem_cgroup.memory` (a `struct page_counter`), from
    /// BTF; 0 = unknown (then no process counts as limited).
    pub memcg_memory_off: u32,
    /// Offset of `struct page_counter.max` (pages).
    pub counter_max_off: u32,
    /// Offset of `struct page_counter.parent`.
    pub counter_parent_off: u32,
    /// `PAGE_COUNTER_MAX` of this kernel: a `max` this large is no limit.
    pub unlimited_pages: u64,
    /// Mean bytes faulted in between two samples of one process; 0 sends
    /// every fault.
    pub sample_bytes: u64,
    /// Anonymous private mappings of at least this many bytes by a followed
    /// process are sent with their stack ([`RESERVE`]); 0: none.
    pub reserve_bytes: u64,
    /// Quantiles of the unit exponential distribution, as
    /// [`crate::heap::HeapConfig::exp_table`].
    pub exp_table: [u32; EXP_TABLE_LEN],
}
const _: () = assert!(size_of::<GrowthConfig>() == 40 + 4 * EXP_TABLE_LEN);

impl GrowthConfig {
    /// Off, with an empty table (what the object holds before userspace
    /// writes the real one).
    pub const fn empty() -> Self {
        Self {
            mode: mode::OFF,
            memcg_memory_off: 0,
            counter_max_off: 0,
            counter_parent_off: 0,
            unlimited_pages: 0,
            sample_bytes: 0,
            reserve_bytes: 0,
            exp_table: [0; EXP_TABLE_LEN],
        }
    }
}

/// What the kernel keeps per process (`GROWTH_PROCS`, tgid -> this):
/// whether it is followed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthProc {
    /// The `GROWTH_GEN` value the decision was taken under; it changes to
    /// have every decision taken again (userspace: a limit set later, a
    /// process selected; the kernel: a task moved to another cgroup).
    pub generation: u32,
    /// 1 when the process is followed.
    pub on: u32,
}
const _: () = assert!(size_of::<GrowthProc>() == 8);

/// What the kernel keeps per CPU (`GROWTH_CPU`): the decision of the
/// process that faulted last on this CPU (most faults follow one of the
/// same process, and this copy spares them the per-process lookup), and
/// the sampling countdown of this CPU. The countdown is shared by the
/// followed processes' faults on the CPU: exponential gaps are memoryless,
/// so every followed fault has the same chance of being sampled whichever
/// process took the ones before it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthCpu {
    /// The process the decision is of (0: none yet).
    pub tgid: u32,
    /// The `GROWTH_GEN` value it was taken under.
    pub generation: u32,
    /// 1 when that process is followed.
    pub on: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// Bytes left before the next sample.
    pub left: i64,
    /// Bytes of the running gap between samples (its faults are counted in
    /// `stat::FAULTS` when it runs out); 0 before the first.
    pub gap: i64,
}
const _: () = assert!(size_of::<GrowthCpu>() == 32);

/// Counters of the growth programs (`GROWTH_STATS`, per CPU), by index.
pub mod stat {
    /// Faults of followed processes, counted a gap between samples at a
    /// time (each process's last, unfinished gap is not in it).
    pub const FAULTS: u32 = 0;
    /// Samples sent.
    pub const SAMPLES: u32 = 1;
    /// Samples lost because the ring was full.
    pub const RING_FULL: u32 = 2;
    /// Samples whose user stack could not be copied.
    pub const STACK_LOST: u32 = 3;
    /// Decisions taken (first sight of a process, or a new generation).
    pub const DECISIONS: u32 = 4;
    /// OOM kills whose tipping stack was sent.
    pub const TIPS: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}
