//! The heap family: libc-style allocator functions probed by uprobes
//! (malloc and friends, in whichever library of a process exports them),
//! byte-weighted sampling in the kernel, and the events a sample sends.

use crate::EventHeader;

/// `malloc(size)`.
pub const MALLOC: u32 = 1;
/// `calloc(n, size)`.
pub const CALLOC: u32 = 2;
/// `realloc(ptr, size)`.
pub const REALLOC: u32 = 3;
/// `reallocarray(ptr, n, size)`.
pub const REALLOCARRAY: u32 = 4;
/// `free(ptr)`.
pub const FREE: u32 = 5;
/// `posix_memalign(&out, align, size)`.
pub const POSIX_MEMALIGN: u32 = 6;
/// `aligned_alloc(align, size)`.
pub const ALIGNED_ALLOC: u32 = 7;
/// `memalign(align, size)`.
pub const MEMALIGN: u32 = 8;
/// `valloc(size)`.
pub const VALLOC: u32 = 9;
/// `pvalloc(size)` (rounded up to whole pages).
pub const PVALLOC: u32 = 10;

/// An anonymous `mmap` outside the allocator (syscall tracepoints).
pub const MMAP: u32 = 11;
/// `mremap` outside the allocator: the old mapping goes, the new one comes.
pub const MREMAP: u32 = 12;
/// `brk` growing the heap outside the allocator.
pub const BRK: u32 = 13;
/// `munmap` of a sampled mapping.
pub const MUNMAP: u32 = 14;

/// The memory system calls traced for the processes of the family
/// (syscall tracepoints, not uprobes: never in [`FUNCTIONS`]).
pub const SYSCALLS: &[(u32, &str)] = &[
    (MMAP, "mmap"),
    (MREMAP, "mremap"),
    (BRK, "brk"),
    (MUNMAP, "munmap"),
];

/// Where a function's size, pointer and result are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `f(size)` returns the block.
    Size,
    /// `f(n, size)` returns the block of `n * size`.
    Array,
    /// `f(ptr, size)` returns the moved or grown block.
    Realloc,
    /// `f(ptr, n, size)` returns the block of `n * size`.
    ReallocArray,
    /// `f(ptr)`.
    Free,
    /// `f(&out, align, size)` returns 0 and writes the block to `out`.
    PosixMemalign,
    /// `f(align, size)` returns the block.
    Aligned,
    /// `f(size)` rounded up to whole pages.
    Pages,
}

/// The shape of function `func`.
pub const fn shape(func: u32) -> Option<Shape> {
    Some(match func {
        MALLOC | VALLOC => Shape::Size,
        CALLOC => Shape::Array,
        REALLOC => Shape::Realloc,
        REALLOCARRAY => Shape::ReallocArray,
        FREE => Shape::Free,
        POSIX_MEMALIGN => Shape::PosixMemalign,
        ALIGNED_ALLOC | MEMALIGN => Shape::Aligned,
        PVALLOC => Shape::Pages,
        _ => return None,
    })
}

/// Every probed function: (id, symbol).
pub const FUNCTIONS: &[(u32, &str)] = &[
    (MALLOC, "malloc"),
    (CALLOC, "calloc"),
    (REALLOC, "realloc"),
    (REALLOCARRAY, "reallocarray"),
    (FREE, "free"),
    (POSIX_MEMALIGN, "posix_memalign"),
    (ALIGNED_ALLOC, "aligned_alloc"),
    (MEMALIGN, "memalign"),
    (VALLOC, "valloc"),
    (PVALLOC, "pvalloc"),
];

/// The symbol of function `id`.
pub fn name(id: u32) -> &'static str {
    match crate::name_in(FUNCTIONS, id) {
        "?" => crate::name_in(SYSCALLS, id),
        n => n,
    }
}

/// Whether `id` is one of the [`SYSCALLS`].
pub fn name_in_syscalls(id: u32) -> bool {
    SYSCALLS.iter().any(|(i, _)| *i == id)
}

/// Processes whose memory system calls are traced (`HEAP_PIDS` entries).
pub const TRACED_PIDS: u32 = 4096;
/// `MAP_ANONYMOUS` (x86_64).
pub const MAP_ANONYMOUS: u64 = 0x20;
/// `MAP_SHARED` (x86_64).
pub const MAP_SHARED: u64 = 0x01;

/// Whether a function needs a return probe (every one but `free`).
pub const fn returns(func: u32) -> bool {
    func != FREE
}

/// Why an allocation was sampled (`HeapAlloc::how`).
pub mod how {
    /// Byte-weighted sampling picked it: it stands for
    /// `size / (1 - exp(-size / sample_bytes))` bytes.
    pub const SAMPLED: u32 = 1;
    /// At least `always_bytes`: kept, standing for itself.
    pub const BIG: u32 = 2;
    /// Sampling is off: every allocation is kept.
    pub const EXACT: u32 = 3;
}

/// Entries of [`HeapConfig::exp_table`].
pub const EXP_TABLE_LEN: usize = 1024;
/// Fixed-point scale of [`HeapConfig::exp_table`] (16.16).
pub const EXP_TABLE_ONE: u64 = 1 << 16;

/// Read-only configuration of the heap programs (`.rodata`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapConfig {
    /// Mean bytes allocated between two samples; 0 keeps every allocation.
    pub sample_bytes: u64,
    /// Allocations of at least this many bytes are always kept.
    pub always_bytes: u64,
    /// Quantiles of the unit exponential distribution, 16.16 fixed point:
    /// entry i is `-ln((i + 0.5) / EXP_TABLE_LEN)`. The gap to the next
    /// sample is `sample_bytes * entry[random]`.
    pub exp_table: [u32; EXP_TABLE_LEN],
}
const _: () = assert!(size_of::<HeapConfig>() == 16 + 4 * EXP_TABLE_LEN);

impl HeapConfig {
    /// Sampling off and an empty table (what the object holds before
    /// userspace writes the real one).
    pub const fn empty() -> Self {
        Self {
            sample_bytes: 0,
            always_bytes: 0,
            exp_table: [0; EXP_TABLE_LEN],
        }
    }
}

/// A probed allocator call in flight on one thread (the outermost one:
/// probed functions it calls, `realloc(NULL, n)` -> `malloc`, only deepen
/// `depth`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapInflight {
    /// The thread (pid_tgid) this state belongs to: in `HEAP_SLOTS`, the
    /// slot's current owner.
    pub owner: u64,
    /// Function id.
    pub func: u32,
    /// Probed calls open on this thread (1 = only the outermost).
    pub depth: u32,
    /// Entry time, `bpf_ktime_get_boot_ns`.
    pub ts_ns: u64,
    /// Bytes asked for.
    pub size: u64,
    /// The block passed in (`realloc`).
    pub old_ptr: u64,
    /// Where `posix_memalign` writes the block.
    pub out_addr: u64,
    /// One of [`how`], or 0 when this call is not sampled.
    pub how: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<HeapInflight>() == 56);

/// Key of a sampled live block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeapKey {
    /// Process (tgid).
    pub pid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The block's address.
    pub addr: u64,
}
const _: () = assert!(size_of::<HeapKey>() == 16);

/// Counters of the heap programs (`HEAP_STATS`, per CPU), by index.
pub mod stat {
    /// Allocation calls seen (outermost frames).
    pub const CALLS: u32 = 0;
    /// Allocations sampled.
    pub const SAMPLED: u32 = 1;
    /// Samples not kept because the live-sample map was full.
    pub const MAP_FULL: u32 = 2;
    /// Samples whose user stack could not be copied.
    pub const STACK_LOST: u32 = 3;
    /// Samples lost because the ring was full.
    pub const RING_FULL: u32 = 4;
    /// Frees of sampled blocks.
    pub const FREES: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}

/// Bytes of the user stack copied with each sample, from the stack
/// pointer up, for unwinding in userspace.
pub const STACK_BYTES: usize = 8192;
/// Return addresses of the kernel's frame-pointer walk kept per sample.
pub const FP_FRAMES: usize = 32;
/// Live sampled blocks tracked at once (all traced processes).
pub const LIVE_ENTRIES: u32 = 131_072;

/// A sampled allocation, sent when its call returns. The registers are the
/// caller's at the return (the allocator's frame is gone).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapAlloc {
    /// Common header (`kind` = [`crate::kind::HEAP_ALLOC`]).
    pub header: EventHeader,
    /// The block.
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Function id.
    pub func: u32,
    /// One of [`how`].
    pub how: u32,
    /// Instruction pointer (the return address in the caller).
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer register.
    pub bp: u64,
    /// Valid entries of `fp`.
    pub fp_len: u32,
    /// Valid bytes of `stack` (0 when it could not be read).
    pub stack_len: u32,
    /// Valid entries of `py`.
    pub py_len: u16,
    /// What the walk of Python frames found (`python::status`).
    pub py_status: u16,
    /// Explicit padding.
    pub _py_pad: u32,
    /// The thread's Python frames, innermost first (a CPython process
    /// whose interpreter userspace has found).
    pub py: [crate::python::PyFrame; crate::python::FRAMES],
    /// The kernel's frame-pointer walk of the user stack.
    pub fp: [u64; FP_FRAMES],
    /// The user stack from `sp` up.
    pub stack: [u8; STACK_BYTES],
}
const _: () = assert!(
    size_of::<HeapAlloc>()
        == 40 + 56 + 8 + 16 * crate::python::FRAMES + 8 * FP_FRAMES + STACK_BYTES
);

impl HeapAlloc {
    /// A sample of `kind` for `pid` with every other field zero (tests,
    /// and userspace that builds one).
    pub const fn empty(kind: u32, pid: u32) -> Self {
        Self {
            header: crate::EventHeader {
                kind,
                cpu: 0,
                ts_boot_ns: 0,
                pid,
                tid: pid,
                comm: [0; crate::COMM_LEN],
            },
            addr: 0,
            size: 0,
            func: 0,
            how: 0,
            ip: 0,
            sp: 0,
            bp: 0,
            fp_len: 0,
            stack_len: 0,
            py_len: 0,
            py_status: 0,
            _py_pad: 0,
            py: [crate::python::PyFrame { code: 0, instr: 0 }; crate::python::FRAMES],
            fp: [0; FP_FRAMES],
            stack: [0; STACK_BYTES],
        }
    }
}

/// A sampled block was freed (or moved by `realloc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapFree {
    /// Common header (`kind` = [`crate::kind::HEAP_FREE`]).
    pub header: EventHeader,
    /// The block.
    pub addr: u64,
    /// Function id of the call that freed it.
    pub func: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<HeapFree>() == 56);
