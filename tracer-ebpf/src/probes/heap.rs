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
    bindings::{BPF_F_USER_STACK, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{
            bpf_get_attach_cookie, bpf_get_prandom_u32, bpf_get_stack, bpf_ktime_get_boot_ns,
        },
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    heap::{self, HeapAlloc, HeapConfig, HeapFree, HeapInflight, HeapKey, Shape, how, stat},
    kind,
};

use crate::{
    maps::{HEAP_CONFIG, HEAP_COUNTDOWN, HEAP_INFLIGHT, HEAP_LIVE, HEAP_STATS},
    util::{Ring, header},
};

/// A frame older than this lost its return (the thread died in the call).
const STALE_NS: u64 = 10_000_000_000;
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
/// 2^40, so the product fits) times a unit exponential
/// variate (a table quantile picked at random), at least 1.
#[inline(always)]
fn next_gap(c: &HeapConfig) -> i64 {
    // SAFETY: helper without preconditions.
    let r = unsafe { bpf_get_prandom_u32() } as usize % heap::EXP_TABLE_LEN;
    let q = c.exp_table[r] as u64;
    ((c.sample_bytes.wrapping_mul(q) >> 16) as i64).max(1)
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
    let Some(left) = HEAP_COUNTDOWN.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot; BPF programs do not migrate while running. A
    // preempting program on this CPU can at worst skew one gap.
    unsafe {
        if *left == 0 {
            *left = next_gap(c);
        }
        *left -= size as i64;
        if *left > 0 {
            return 0;
        }
        *left = next_gap(c);
    }
    how::SAMPLED
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
    if let Some(open) = HEAP_INFLIGHT.get_ptr_mut(&tid) {
        // SAFETY: a live map value owned by this thread's key; only this
        // thread's probes touch it.
        unsafe {
            if now.saturating_sub((*open).ts_ns) < STALE_NS {
                (*open).depth += 1;
                return Some(());
            }
        }
    }
    let mut f = HeapInflight {
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
    HEAP_INFLIGHT.insert(&tid, &f, 0).ok()
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
    let open = HEAP_INFLIGHT.get_ptr_mut(&tid)?;
    // SAFETY: a live map value owned by this thread's key.
    let f = unsafe {
        if (*open).depth > 1 {
            (*open).depth -= 1;
            return Some(());
        }
        *open
    };
    let _ = HEAP_INFLIGHT.remove(&tid);
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
    sample(ctx, tid, addr, &f)
}

/// Keeps a sampled block and sends it with its stack.
#[inline(always)]
fn sample(ctx: &RetProbeContext, tid: u64, addr: u64, f: &HeapInflight) -> Option<()> {
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
    let regs = ctx.as_ptr() as *const pt_regs;
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<HeapAlloc>();
    // every field is written through raw pointers (the event is far larger
    // than the BPF stack). `regs` is the context the kernel passed.
    unsafe {
        (&raw mut (*ev).header).write(header(kind::HEAP_ALLOC));
        (*ev).addr = addr;
        (*ev).size = f.size;
        (*ev).func = f.func;
        (*ev).how = f.how;
        let (ip, sp, bp) = ((*regs).rip, (*regs).rsp, (*regs).rbp);
        (*ev).ip = ip;
        (*ev).sp = sp;
        (*ev).bp = bp;
        let fp_bytes = bpf_get_stack(
            ctx.as_ptr(),
            (&raw mut (*ev).fp).cast(),
            (8 * heap::FP_FRAMES) as u32,
            BPF_F_USER_STACK as u64,
        );
        (*ev).fp_len = if fp_bytes > 0 { fp_bytes as u32 / 8 } else { 0 };
        // The whole copy fails when the stack mapping ends sooner: then a
        // quarter of it, which any live stack has.
        let dst = (&raw mut (*ev).stack).cast::<u8>();
        let mut len = heap::STACK_BYTES as u32;
        if aya_ebpf::helpers::generated::bpf_probe_read_user(dst.cast(), len, sp as *const _) != 0 {
            len = (heap::STACK_BYTES / 4) as u32;
            if aya_ebpf::helpers::generated::bpf_probe_read_user(dst.cast(), len, sp as *const _)
                != 0
            {
                len = 0;
                count(stat::STACK_LOST);
            }
        }
        (*ev).stack_len = len;
    }
    slot.submit();
    Some(())
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
