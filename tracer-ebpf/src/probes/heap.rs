//! The heap family: malloc and friends. One uprobe and one uretprobe
//! program serve every function (the attach cookie says which). The entry
//! decides, by the bytes asked for, whether this allocation is sampled
//! (one sample per `sample_bytes` allocated on average, every allocation of
//! `always_bytes` or more); the return records a sampled block in
//! `HEAP_LIVE` and sends it with the caller's registers, the kernel's
//! frame-pointer walk and a copy of the top of the user stack, so that
//! userspace can unwind whole stacks from `.eh_frame`. `free` is probed at
//! its entry only and costs one map lookup unless the block was sampled.

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_get_prandom_u32, bpf_ktime_get_boot_ns},
    },
    macros::{tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{
    heap::{self, HeapAlloc, HeapConfig, HeapFree, HeapInflight, HeapKey, Shape, how, stat},
    kind,
};

use crate::{
    maps::{
        COUNTDOWN_HEAP, HEAP_BRK, HEAP_CONFIG, HEAP_COUNTDOWN, HEAP_INFLIGHT, HEAP_LIVE, HEAP_PIDS,
        HEAP_SLOTS, HEAP_STATS, HEAP_SYSCALLS,
    },
    slots::{Frame, PerThread, frame_fields},
    stack::{self, user_regs},
    util::{Ring, header},
};

/// A frame older than this lost its return (the thread died in the call).
const STALE_NS: u64 = 10_000_000_000;

/// Each thread's heap call in flight: its slot, or its spill entry. (Made
/// in code, not a static: a static's pointers to maps would need data
/// relocations, which BPF loaders do not apply.)
#[inline(always)]
fn threads() -> PerThread<HeapInflight> {
    PerThread {
        slots: &HEAP_SLOTS,
        spill: &HEAP_INFLIGHT,
        stale_ns: STALE_NS,
        count: tracer_common::THREAD_SLOTS,
    }
}

impl Frame for HeapInflight {
    frame_fields!();

    #[inline(always)]
    fn claim(&mut self, tid: u64) {
        self.owner = tid;
        self.depth = 0;
    }
}

/// Whether thread `tid` is inside a probed allocator call (the allocator's
/// own system calls are its business, not the program's).
#[inline(always)]
fn inside_call(tid: u64) -> bool {
    // SAFETY: reading a live map value.
    threads()
        .current(tid)
        .is_some_and(|f| unsafe { (*f).depth } > 0)
}

/// Page size for `pvalloc`'s rounding (x86_64).
const PAGE: u64 = 4096;

#[inline(always)]
fn cfg() -> &'static HeapConfig {
    // SAFETY: HEAP_CONFIG is a plain static; the volatile read of its address
    // keeps the compiler from folding the compile-time default into the code.
    unsafe { &*core::ptr::read_volatile(&&raw const HEAP_CONFIG) }
}

#[inline(always)]
fn count(idx: u32) {
    if let Some(c) = HEAP_STATS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot; BPF programs do not migrate while running.
        unsafe { *c += 1 };
    }
}

/// Bytes to the next sample: `sample_bytes` (userspace keeps it under
/// 2^40, so the product fits) times a unit exponential variate (a quantile
/// of `table` picked at random), at least 1.
#[inline(always)]
pub fn next_gap(sample_bytes: u64, table: &[u32; heap::EXP_TABLE_LEN]) -> i64 {
    // SAFETY: helper without preconditions.
    let r = unsafe { bpf_get_prandom_u32() } as usize % heap::EXP_TABLE_LEN;
    let q = table[r] as u64;
    ((sample_bytes.wrapping_mul(q) >> 16) as i64).max(1)
}

/// Whether an allocation of `size` bytes is sampled, and why.
#[inline(always)]
fn decide(size: u64) -> u32 {
    let c = cfg();
    if size == 0 {
        return 0;
    }
    if c.sample_bytes == 0 {
        return how::EXACT;
    }
    if size >= c.always_bytes {
        return how::BIG;
    }
    if sampled(COUNTDOWN_HEAP, size, c.sample_bytes) {
        how::SAMPLED
    } else {
        0
    }
}

/// Whether an allocation of `size` bytes ends the gap counted down at
/// `entry` of `HEAP_COUNTDOWN` (one sample per `sample_bytes` on average,
/// at least 1); the next gap is drawn when it does.
#[inline(always)]
pub fn sampled(entry: u32, size: u64, sample_bytes: u64) -> bool {
    let Some(left) = HEAP_COUNTDOWN.get_ptr_mut(entry) else {
        return false;
    };
    let table = &cfg().exp_table;
    // SAFETY: per-CPU slot; BPF programs do not migrate while running. A
    // preempting program on this CPU can at worst skew one gap.
    unsafe {
        if *left == 0 {
            *left = next_gap(sample_bytes, table);
        }
        *left -= size as i64;
        if *left > 0 {
            return false;
        }
        *left = next_gap(sample_bytes, table);
    }
    true
}

/// `uprobe` at (or, where the placement allows, just after) the entry of
/// every heap function (cookie = function id, `tracer_common::heap`).
/// Minimum kernel: 5.15 (attach cookies).
#[uprobe]
pub fn heap_entry(ctx: ProbeContext) -> u32 {
    match try_entry(&ctx) {
        Some(()) => 0,
        None => 1,
    }
}

fn try_entry(ctx: &ProbeContext) -> Option<()> {
    // SAFETY: the context pointer is the one the kernel passed to this program.
    let func = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let shape = heap::shape(func)?;
    let tid = bpf_get_current_pid_tgid();
    if shape == Shape::Free {
        let ptr = arg(0);
        if ptr != 0 {
            forget(tid, ptr, func);
        }
        return Some(());
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let open = threads().entry(tid, now)?;
    // SAFETY: a live map value of this thread; only its probes write it
    // (see `slots` for a slot shared with another thread).
    if unsafe { threads().nested(open, now) } {
        return Some(());
    }
    let mut f = HeapInflight {
        owner: tid,
        func,
        depth: 1,
        ts_ns: now,
        ..Default::default()
    };
    match shape {
        Shape::Size => f.size = arg(0),
        Shape::Array => f.size = arg(0).wrapping_mul(arg(1)),
        Shape::Realloc => (f.old_ptr, f.size) = (arg(0), arg(1)),
        Shape::ReallocArray => (f.old_ptr, f.size) = (arg(0), arg(1).wrapping_mul(arg(2))),
        Shape::PosixMemalign => (f.out_addr, f.size) = (arg(0), arg(2)),
        Shape::Aligned => f.size = arg(1),
        Shape::Pages => f.size = arg(0).div_ceil(PAGE) * PAGE,
        Shape::Free => {}
    }
    count(stat::CALLS);
    f.how = decide(f.size);
    // Written in place: the slot stays the thread's between calls.
    // SAFETY: as above.
    unsafe { *open = f };
    Some(())
}

/// A block is gone: when it was sampled, drop it and tell userspace.
#[inline(always)]
fn forget(tid: u64, addr: u64, func: u32) {
    let key = HeapKey {
        pid: (tid >> 32) as u32,
        _pad: 0,
        addr,
    };
    // SAFETY: reading a plain u64 map value.
    if unsafe { HEAP_LIVE.get(&key) }.is_none() {
        return;
    }
    let Some(slot) = Ring::Data.reserve::<HeapFree>() else {
        count(stat::RING_FULL);
        // Still forgotten in the kernel: userspace counts the ring drop.
        let _ = HEAP_LIVE.remove(&key);
        return;
    };
    // Removed after the reservation: a sample sent by another thread for
    // the same address (reused after this free) is ordered after this one.
    let _ = HEAP_LIVE.remove(&key);
    count(stat::FREES);
    slot.submit_value(HeapFree {
        header: header(kind::HEAP_FREE),
        addr,
        func,
        _pad: 0,
    });
}

/// `uretprobe` at the return of every heap function but `free`. Sends one
/// [`HeapAlloc`] for a sampled outermost call. Minimum kernel: 5.15.
#[uretprobe]
pub fn heap_return(ctx: RetProbeContext) -> u32 {
    match try_return(&ctx) {
        Some(()) => 0,
        None => 1,
    }
}

fn try_return(ctx: &RetProbeContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid();
    let open = threads().current(tid)?;
    // SAFETY: a live map value of this thread.
    let Some(f) = (unsafe { threads().leave(open) }) else {
        return Some(());
    };
    let ret: u64 = ctx.ret();
    let shape = heap::shape(f.func)?;
    let addr = match shape {
        Shape::PosixMemalign if ret as i32 == 0 && f.out_addr != 0 => {
            // SAFETY: a user pointer the caller passed; the helper faults safely.
            unsafe { bpf_probe_read_user(f.out_addr as *const u64) }.unwrap_or(0)
        }
        Shape::PosixMemalign => 0,
        _ => ret,
    };
    if matches!(shape, Shape::Realloc | Shape::ReallocArray) && f.old_ptr != 0 {
        // The old block is gone when the call succeeded, or when it was a
        // resize to 0 (glibc frees and returns NULL); a failed resize
        // leaves it alone.
        if addr != 0 || f.size == 0 {
            forget(tid, f.old_ptr, f.func);
        }
    }
    if addr == 0 || f.how == 0 {
        return Some(());
    }
    let regs = ctx.as_ptr() as *const pt_regs;
    // SAFETY: `regs` is the context the kernel passed: the user registers.
    let regs = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
    sample(ctx, regs, tid, addr, &f)
}

/// Keeps a sampled block and sends it with the user registers `(ip, sp,
/// bp)` and stack of the current task.
#[inline(always)]
fn sample<C: EbpfContext>(
    ctx: &C,
    regs: (u64, u64, u64),
    tid: u64,
    addr: u64,
    f: &HeapInflight,
) -> Option<()> {
    let key = HeapKey {
        pid: (tid >> 32) as u32,
        _pad: 0,
        addr,
    };
    // Reserve first: a free of this block by another thread, right after
    // the insert, then reaches userspace after this sample.
    let Some(mut slot) = Ring::Data.reserve::<HeapAlloc>() else {
        count(stat::RING_FULL);
        return None;
    };
    if HEAP_LIVE.insert(&key, &f.size, 0).is_err() {
        count(stat::MAP_FULL);
        slot.discard();
        return None;
    }
    count(stat::SAMPLED);
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<HeapAlloc>();
    // every field is written through raw pointers (the event is far larger
    // than the BPF stack).
    unsafe {
        (&raw mut (*ev).header).write(header(kind::HEAP_ALLOC));
        (*ev).addr = addr;
        (*ev).size = f.size;
        (*ev).func = f.func;
        (*ev).how = f.how;
        if !stack::fill(ctx, ev, regs) {
            count(stat::STACK_LOST);
        }
    }
    slot.submit();
    Some(())
}

// ---- Memory system calls of the traced processes (outside the allocator).
//
// syscalls:sys_enter_* records are `struct syscall_trace_enter` (common
// fields, `int nr`, then `unsigned long args[6]` from offset 16);
// sys_exit_* are `struct syscall_trace_exit` (`long ret` at 16): the same
// on every kernel with syscall tracepoints (kernel/trace/trace_syscalls.c).

const ARGS: usize = 16;
const RET: usize = 16;

#[inline(always)]
fn arg(ctx: &TracePointContext, n: usize) -> u64 {
    // SAFETY: within the syscall record; the read faults safely.
    unsafe { ctx.read_at::<u64>(ARGS + 8 * n) }.unwrap_or(0)
}

#[inline(always)]
fn ret(ctx: &TracePointContext) -> Option<u64> {
    // SAFETY: within the syscall record; the read faults safely.
    let r = unsafe { ctx.read_at::<i64>(RET) }.ok()?;
    // -4095..-1 are errors.
    (!(-4095..0).contains(&r)).then_some(r as u64)
}

/// The calling thread when its process is traced and it is not inside a
/// probed allocator call (malloc's own mmap and brk are its business).
#[inline(always)]
fn traced_thread() -> Option<u64> {
    let tid = bpf_get_current_pid_tgid();
    // SAFETY: reading a plain u32 map value.
    unsafe { HEAP_PIDS.get(&((tid >> 32) as u32)) }?;
    if inside_call(tid) {
        return None;
    }
    Some(tid)
}

#[inline(always)]
fn open_syscall(tid: u64, func: u32, size: u64, old_ptr: u64) -> Option<()> {
    let f = HeapInflight {
        func,
        depth: 1,
        size,
        old_ptr,
        how: decide(size),
        ..Default::default()
    };
    HEAP_SYSCALLS.insert(&tid, &f, 0).ok()
}

#[inline(always)]
fn close_syscall() -> Option<(u64, HeapInflight)> {
    let tid = bpf_get_current_pid_tgid();
    // SAFETY: a plain map value owned by this thread's key.
    let f = *unsafe { HEAP_SYSCALLS.get(&tid) }?;
    let _ = HEAP_SYSCALLS.remove(&tid);
    Some((tid, f))
}

/// `tracepoint/syscalls/sys_enter_mmap`: private anonymous mappings of a
/// traced process, sampled like allocations. Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_mmap_enter(ctx: TracePointContext) -> u32 {
    let Some(tid) = traced_thread() else { return 0 };
    let flags = arg(&ctx, 3);
    if flags & heap::MAP_ANONYMOUS == 0 || flags & heap::MAP_SHARED != 0 {
        return 0;
    }
    let _ = open_syscall(tid, heap::MMAP, arg(&ctx, 1), 0);
    0
}

/// `tracepoint/syscalls/sys_exit_mmap`. Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_mmap_exit(ctx: TracePointContext) -> u32 {
    let Some((tid, f)) = close_syscall() else {
        return 0;
    };
    if let (Some(addr), true, Some(regs)) = (ret(&ctx), f.how != 0, user_regs()) {
        let _ = sample(&ctx, regs, tid, addr, &f);
    }
    0
}

/// `tracepoint/syscalls/sys_enter_munmap`: a sampled mapping unmapped (at
/// its start). Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_munmap_enter(ctx: TracePointContext) -> u32 {
    if let Some(tid) = traced_thread() {
        forget(tid, arg(&ctx, 0), heap::MUNMAP);
    }
    0
}

/// `tracepoint/syscalls/sys_enter_mremap`. Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_mremap_enter(ctx: TracePointContext) -> u32 {
    if let Some(tid) = traced_thread() {
        let _ = open_syscall(tid, heap::MREMAP, arg(&ctx, 2), arg(&ctx, 0));
    }
    0
}

/// `tracepoint/syscalls/sys_exit_mremap`: the old mapping goes, the new one
/// is sampled as an allocation of its new size. Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_mremap_exit(ctx: TracePointContext) -> u32 {
    let Some((tid, f)) = close_syscall() else {
        return 0;
    };
    let Some(addr) = ret(&ctx) else { return 0 };
    forget(tid, f.old_ptr, heap::MREMAP);
    if let (true, Some(regs)) = (f.how != 0, user_regs()) {
        let _ = sample(&ctx, regs, tid, addr, &f);
    }
    0
}

/// `tracepoint/syscalls/sys_enter_brk`: followed inside the allocator too
/// (its growth must not be charged to the next brk outside it), sampled
/// only outside. Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_brk_enter(_ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid();
    // SAFETY: reading a plain u32 map value.
    if unsafe { HEAP_PIDS.get(&((tid >> 32) as u32)) }.is_none() {
        return 0;
    }
    let inside = inside_call(tid);
    let f = HeapInflight {
        func: heap::BRK,
        depth: if inside { 2 } else { 1 },
        ..Default::default()
    };
    let _ = HEAP_SYSCALLS.insert(&tid, &f, 0);
    0
}

/// `tracepoint/syscalls/sys_exit_brk`: growth of the program break past
/// the last one seen is sampled as an allocation at the old break (a
/// shrink is not followed). Minimum kernel: 5.15.
#[tracepoint]
pub fn heap_brk_exit(ctx: TracePointContext) -> u32 {
    let Some((tid, mut f)) = close_syscall() else {
        return 0;
    };
    let Some(top) = ret(&ctx) else { return 0 };
    let pid = (tid >> 32) as u32;
    // SAFETY: reading a plain u64 map value.
    let last = unsafe { HEAP_BRK.get(&pid) }.copied();
    let _ = HEAP_BRK.insert(&pid, &top, 0);
    let Some(last) = last.filter(|l| top > *l && f.depth == 1) else {
        return 0;
    };
    f.size = top - last;
    f.how = decide(f.size);
    if let (true, Some(regs)) = (f.how != 0, user_regs()) {
        let _ = sample(&ctx, regs, tid, last, &f);
    }
    0
}

/// An empty `uprobe` at the same sites as [`heap_entry`] (benchmarks).
#[uprobe]
pub fn heap_floor_entry(_ctx: ProbeContext) -> u32 {
    0
}

/// The empty `uretprobe` twin of [`heap_floor_entry`].
#[uretprobe]
pub fn heap_floor_return(_ctx: RetProbeContext) -> u32 {
    0
}
