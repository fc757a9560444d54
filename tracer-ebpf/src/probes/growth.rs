//! The growth family: page faults that bring new memory into a process,
//! counted per process and sampled by bytes with the user stack, for any
//! language and allocator; and, at an OOM kill, the stack of the task whose
//! allocation hit the limit.
//!
//! Per fault the cost is one LRU map lookup: whether a process is followed
//! is decided once (first fault, a move to another cgroup, or a new
//! generation from userspace) and kept in `GROWTH_PROCS` with its countdown.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use tracer_common::{
    field,
    growth::{self, GrowthConfig, GrowthProc, GrowthReturn, GrowthSample, error_code, mode, stat},
    heap::how,
    kind,
};

use crate::{
    maps::{
        GROWTH_ARMED, GROWTH_CONFIG, GROWTH_CPU, GROWTH_GEN, GROWTH_PROCS, GROWTH_SELECT,
        GROWTH_STATS,
    },
    probes::heap::next_gap,
    stack::{self, user_regs},
    util::{Ring, config, current_memcg_id, header, read_field},
};

/// User addresses end here (x86_64, 4-level and 5-level paging alike).
const USER_END: u64 = 1 << 56;

#[inline(always)]
fn cfg() -> &'static GrowthConfig {
    // SAFETY: GROWTH_CONFIG is a plain static; the volatile read of its
    // address keeps the compiler from folding the compile-time default.
    unsafe { &*core::ptr::read_volatile(&&raw const GROWTH_CONFIG) }
}

#[inline(always)]
fn count(idx: u32) {
    count_n(idx, 1);
}

#[inline(always)]
fn count_n(idx: u32, n: u64) {
    if let Some(c) = GROWTH_STATS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot; BPF programs do not migrate while running.
        unsafe { *c += n };
    }
}

/// Whether the current task's memory cgroup, or one of the
/// [`growth::LIMIT_LEVELS`] above it, has a limit: `mem_cgroup.memory.max`
/// below `PAGE_COUNTER_MAX`, following `page_counter.parent` (the same
/// counter of the parent cgroup). v1's `memory.limit_in_bytes` and v2's
/// `memory.max` both set it (mm/memcontrol.c, `mem_cgroup_resize_max`,
/// `memory_max_write`).
#[inline(always)]
fn limited(c: &GrowthConfig) -> bool {
    let chain = config().memcg_chain;
    if chain[0] == 0 || c.memcg_memory_off == 0 || c.counter_max_off == 0 {
        return false;
    }
    // SAFETY: every pointer is only read through bpf_probe_read_kernel,
    // which faults safely, at offsets from this kernel's BTF.
    unsafe {
        let task = aya_ebpf::helpers::bpf_get_current_task() as *const u8;
        let Ok(set) = bpf_probe_read_kernel(task.add(chain[0] as usize).cast::<*const u8>()) else {
            return false;
        };
        if set.is_null() {
            return false;
        }
        // `css` is the first member of `struct mem_cgroup`.
        let Ok(memcg) = bpf_probe_read_kernel(set.add(chain[1] as usize).cast::<*const u8>())
        else {
            return false;
        };
        if memcg.is_null() {
            return false;
        }
        let mut counter = memcg.add(c.memcg_memory_off as usize);
        for _ in 0..growth::LIMIT_LEVELS {
            let Ok(max) =
                bpf_probe_read_kernel(counter.add(c.counter_max_off as usize).cast::<u64>())
            else {
                return false;
            };
            if max < c.unlimited_pages {
                return true;
            }
            match bpf_probe_read_kernel(
                counter
                    .add(c.counter_parent_off as usize)
                    .cast::<*const u8>(),
            ) {
                Ok(p) if !p.is_null() => counter = p,
                _ => return false,
            }
        }
        false
    }
}

/// The decision for the current process under `c.mode`.
#[inline(always)]
fn followed(c: &GrowthConfig, tgid: u32) -> bool {
    match c.mode {
        mode::ALL => true,
        mode::LIMITED => limited(c),
        // SAFETY: reading a plain u32 map value.
        mode::SELECTED => unsafe { GROWTH_SELECT.get(&tgid) }.is_some(),
        // SAFETY: as above. Decided once per process and generation:
        // userspace starts a new generation when it arms or disarms, and
        // the kernel when a task changes cgroup.
        mode::ARMED => unsafe { GROWTH_ARMED.get(&current_memcg_id()) }.is_some(),
        _ => false,
    }
}

/// Counts one fault of the current process and sends a sample when its
/// countdown runs out.
#[inline(always)]
fn on_fault(ctx: &RawTracePointContext, func: u32) -> u32 {
    let c = cfg();
    if c.mode == mode::OFF {
        return 0;
    }
    // TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long
    // error_code): the same on every kernel with the tracepoints.
    let address = ctx.arg::<u64>(0);
    let code = ctx.arg::<u64>(2);
    // Only a write gives a process new memory of its own: a new anonymous
    // page, or a private copy of a shared one (copy on write). A read maps
    // the zero page or the page cache (a program's code and data files,
    // most of a starting program's faults), and a protection fault that is
    // not a write (a NUMA hint) brings in nothing.
    if address >= USER_END || code & error_code::WRITE == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == 0 {
        return 0;
    }
    let generation = GROWTH_GEN.get(0).copied().unwrap_or(0);
    let Some(cpu) = GROWTH_CPU.get_ptr_mut(0) else {
        return 0;
    };
    let exact = c.sample_bytes == 0;
    // SAFETY: this CPU's slot, and a program does not migrate while it
    // runs; a program of this CPU interleaving with it would skew the
    // countdown, never memory safety.
    unsafe {
        if (*cpu).tgid != tgid || (*cpu).generation != generation {
            let Some(on) = decision(c, tgid, generation) else {
                return 0;
            };
            (*cpu).tgid = tgid;
            (*cpu).generation = generation;
            (*cpu).on = on as u32;
        }
        if (*cpu).on == 0 {
            return 0;
        }
        // The common case is this countdown and nothing else: the faults
        // of a gap are counted when it runs out, not one by one.
        if exact {
            count_n(stat::FAULTS, 1);
        } else {
            (*cpu).left -= growth::PAGE as i64;
            if (*cpu).left > 0 {
                return 0;
            }
            let first = (*cpu).gap == 0;
            count_n(stat::FAULTS, (*cpu).gap as u64 / growth::PAGE);
            let gap = next_gap(c.sample_bytes, &c.exp_table);
            (*cpu).left = gap;
            (*cpu).gap = gap;
            // This CPU's first fault only starts the countdown.
            if first {
                return 0;
            }
        }
    }
    send(
        ctx,
        kind::GROWTH_FAULT,
        func,
        address,
        growth::PAGE,
        if exact { how::EXACT } else { how::SAMPLED },
    );
    0
}

/// Whether process `tgid` is followed under `generation`: its entry in
/// `GROWTH_PROCS`, or a decision taken now and kept there. `None` when the
/// map refuses the entry.
#[inline(always)]
fn decision(c: &GrowthConfig, tgid: u32, generation: u32) -> Option<bool> {
    // SAFETY: reading a plain map value.
    if let Some(e) = unsafe { GROWTH_PROCS.get(&tgid) }
        && e.generation == generation
    {
        return Some(e.on != 0);
    }
    count(stat::DECISIONS);
    let on = followed(c, tgid);
    let fresh = GrowthProc {
        generation,
        on: on as u32,
    };
    GROWTH_PROCS.insert(&tgid, &fresh, 0).ok()?;
    Some(on)
}

/// Sends a [`GrowthSample`] of the current task; false when it was lost.
#[inline(always)]
fn send<C: aya_ebpf::EbpfContext>(
    ctx: &C,
    kind: u32,
    func: u32,
    addr: u64,
    size: u64,
    how: u32,
) -> bool {
    let Some(regs) = user_regs() else {
        return false;
    };
    let Some(mut slot) = Ring::Data.reserve::<GrowthSample>() else {
        count(stat::RING_FULL);
        return false;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<GrowthSample>().
    unsafe {
        (&raw mut (*ev).header).write(header(kind));
        (*ev).addr = addr;
        (*ev).size = size;
        (*ev).func = func;
        (*ev).how = how;
        if !stack::fill(ctx, ev, regs) {
            count(stat::STACK_LOST);
        }
    }
    // A tip wakes the reader: its task's maps are read when it arrives,
    // and that task may die next. Samples wait for the reader's poll.
    if kind == kind::OOM_TIP {
        slot.submit_now();
    } else {
        slot.submit();
    }
    count(stat::SAMPLES);
    true
}

/// `raw_tracepoint/page_fault_user`, from `trace_page_fault_entries()` in
/// arch/x86/mm/fault.c: a fault taken in user mode. Raw: on every fault
/// of the node, the kernel builds no trace record for it.
/// Minimum kernel: 3.16 (x86 only).
#[raw_tracepoint(tracepoint = "page_fault_user")]
pub fn growth_fault_user(ctx: RawTracePointContext) -> u32 {
    on_fault(&ctx, growth::FAULT_USER)
}

/// `raw_tracepoint/page_fault_kernel`: a fault taken in kernel mode; only
/// those on user addresses count (the kernel filling a process's new
/// buffer, as `read()` does). Minimum kernel: 3.16 (x86 only).
#[raw_tracepoint(tracepoint = "page_fault_kernel")]
pub fn growth_fault_kernel(ctx: RawTracePointContext) -> u32 {
    on_fault(&ctx, growth::FAULT_KERNEL)
}

/// `tracepoint/cgroup/cgroup_attach_task`, from `cgroup_attach_task()` in
/// kernel/cgroup/cgroup.c: a task moved to another cgroup. Every decision
/// is taken again at the process's next fault (a new generation: the
/// copies kept per CPU go stale with it; moves are rare next to faults).
/// Format: `dst_root, dst_level, dst_id, pid, dst_path, comm`. Minimum
/// kernel: 4.6.
#[tracepoint]
pub fn growth_cgroup_attach(_ctx: TracePointContext) -> u32 {
    if let Some(g) = GROWTH_GEN.get_ptr_mut(0) {
        // SAFETY: the map's one value; a racing bump may be lost, and
        // either one changes the generation.
        unsafe { *g = (*g).wrapping_add(1) };
    }
    0
}

/// `raw_tracepoint/vm_unmapped_area`, from `vm_unmapped_area()` in mm/:
/// where the kernel places a new mapping (every mmap without MAP_FIXED).
/// An anonymous private mapping of at least `reserve_bytes` asked for by
/// an `mmap` system call of a followed process is sent with its stack (the
/// memory faults in later, maybe elsewhere; the reservation says who asked
/// for it). The call's arguments are the task's saved user registers
/// (`orig_ax` the call's number, `si` the length, `r10` the flags). Raw,
/// and not `syscalls:sys_enter_mmap`: a program starting maps a dozen files,
/// and the syscall tracepoint builds a record for each before any filter.
/// Minimum kernel: 5.8.
#[raw_tracepoint(tracepoint = "vm_unmapped_area")]
pub fn growth_mmap(ctx: RawTracePointContext) -> u32 {
    let c = cfg();
    if c.mode == mode::OFF || c.reserve_bytes == 0 {
        return 0;
    }
    // A failed search (the kernel may search again, bottom-up) returns an
    // error code, never page-aligned: only the placed mapping counts.
    if ctx.arg::<u64>(0) & 0xfff != 0 {
        return 0;
    }
    let Some((nr, len, flags)) = stack::syscall_args() else {
        return 0;
    };
    if nr != SYS_MMAP
        || len < c.reserve_bytes
        || flags & tracer_common::heap::MAP_ANONYMOUS == 0
        || flags & tracer_common::heap::MAP_SHARED != 0
    {
        return 0;
    }
    // Only processes the fault programs follow.
    if !current_followed() {
        return 0;
    }
    send(&ctx, kind::GROWTH_FAULT, growth::RESERVE, 0, len, how::BIG);
    0
}

/// Whether the current process is followed (decided at its faults).
#[inline(always)]
fn current_followed() -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: reading a plain map value.
    unsafe { GROWTH_PROCS.get(&tgid) }.is_some_and(|e| e.on != 0)
}

/// Sends the range the current process gives back; no stack.
#[inline(always)]
fn gave_back(start: u64, len: u64) {
    if len == 0 {
        return;
    }
    let Some(mut slot) = Ring::Data.reserve::<GrowthReturn>() else {
        count(stat::RING_FULL);
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of its size.
    unsafe {
        (&raw mut (*ev).header).write(header(kind::GROWTH_RETURN));
        (*ev).start = start;
        (*ev).len = len;
    }
    slot.submit();
}

/// `tracepoint/mmap_lock/mmap_lock_acquire_returned`, from
/// `__mmap_lock_do_trace_acquire_returned()` in mm/mmap_lock.c: a task took
/// a memory map's lock. When the task is in `munmap`, or in an `madvise`
/// that drops pages (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`), the
/// range is sent: its sampled faults stop counting as kept. The call and
/// its arguments are the task's saved user registers (a lock the call did
/// not get ends the process: a fatal signal). Not the syscall tracepoints:
/// any one of them sends every system call of every task on the node
/// through the slow path (+35 to 50 ns each here); this fires only where a
/// map's lock is taken. Attached only where the tracepoint carries the
/// memory cgroup's id (`memcg_id`): before that, the kernel builds the
/// cgroup's path at every lock taken while it is on. An `madvise` served
/// under a per-VMA lock (6.x kernels, one VMA) takes no map lock and is
/// not seen.
#[tracepoint(category = "mmap_lock", name = "mmap_lock_acquire_returned")]
pub fn growth_mmap_lock(_ctx: TracePointContext) -> u32 {
    // Most locks are other processes': one lookup, before any register.
    if cfg().mode == mode::OFF || !current_followed() {
        return 0;
    }
    let Some([nr, start, len, advice]) = stack::syscall_args4() else {
        return 0;
    };
    let drops = match nr {
        SYS_MUNMAP => true,
        SYS_MADVISE => growth::DROPPING_ADVICE.contains(&advice),
        _ => false,
    };
    if drops {
        gave_back(start, len);
    }
    0
}

/// `munmap`'s and `madvise`'s system call numbers on x86_64.
const SYS_MUNMAP: u64 = 11;
const SYS_MADVISE: u64 = 28;

/// `mmap`'s system call number on x86_64.
const SYS_MMAP: u64 = 9;

/// `tracepoint/oom/mark_victim`, a program of its own beside the kill's
/// (`oom_mark_victim`): the stack of the current task, which triggered the
/// OOM kill of the victim. Kernel threads and tasks without user memory
/// have no user stack: nothing is sent. Kept apart because it needs
/// `bpf_get_current_task_btf` (5.11) and `bpf_task_pt_regs` (5.15), which
/// the kill itself must not: on older kernels only this program fails.
/// Minimum kernel: 5.15.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn growth_oom_tip(ctx: TracePointContext) -> u32 {
    if cfg().mode == mode::OFF {
        return 0;
    }
    let victim_pid = read_field::<i32>(&ctx, field::MV_PID).unwrap_or(0) as u32;
    if send(&ctx, kind::OOM_TIP, growth::TIP, victim_pid as u64, 0, 0) {
        count(stat::TIPS);
    }
    0
}
