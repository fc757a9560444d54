//! Memory cgroup event counters: reclaim and fault pressure per memcg, and
//! OOM kills on kernels that count them through the same path.

use aya_ebpf::{
    bindings::BPF_NOEXIST, helpers::bpf_probe_read_kernel, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::{MemcgCountKey, MemcgEvent, kind};

use crate::{
    maps::MEMCG_COUNTS,
    util::{Ring, config, header},
};

/// `raw_tracepoint/count_memcg_events`, from `count_memcg_events()` in
/// mm/memcontrol.c: `TP_PROTO(struct mem_cgroup *memcg, int item, unsigned
/// long val)`, where `item` is an `enum vm_event_item` whose values differ
/// between kernels; userspace resolves the ones we want from BTF into
/// `CONFIG`. This fires on every memcg-charged page fault: raw, so that
/// the kernel builds no trace record for it (the tracefs form costs about
/// 700 ns a fault on the machines we measured, this one next to nothing),
/// and the common case (an item we do not count) is a few compares.
/// Minimum kernel: 6.10.
#[raw_tracepoint(tracepoint = "count_memcg_events")]
pub fn memcg_count_events(ctx: RawTracePointContext) -> u32 {
    try_count_events(&ctx);
    0
}

/// The id of `memcg` (its cgroup's kernfs node id, as the tracefs form
/// and /proc give it): `memcg->css.cgroup->kn->id`, offsets from BTF
/// (`css` is the first member of `struct mem_cgroup`); 0 when unknown.
#[inline(always)]
fn memcg_id(memcg: *const u8) -> u64 {
    let chain = config().memcg_chain;
    // chain[0] is 0 only when the chain is unknown; chain[2] (the first
    // member of the css) is 0 on every kernel.
    if memcg.is_null() || chain[0] == 0 || chain[3] == 0 {
        return 0;
    }
    let mut p = memcg;
    for off in [chain[2], chain[3]] {
        // SAFETY: kernel pointers read through bpf_probe_read_kernel,
        // which faults safely, at offsets from this kernel's BTF.
        match unsafe { bpf_probe_read_kernel(p.add(off as usize).cast::<*const u8>()) } {
            Ok(next) if !next.is_null() => p = next,
            _ => return 0,
        }
    }
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(p.add(chain[4] as usize).cast::<u64>()) }.unwrap_or(0)
}

#[inline(always)]
fn try_count_events(ctx: &RawTracePointContext) {
    let item = ctx.arg::<u64>(1) as i32;
    let cfg = config();
    let oom_kill = item == cfg.memcg_oom_kill_item;
    let mut counted = oom_kill;
    for wanted in cfg.memcg_counted_items {
        counted |= wanted >= 0 && wanted == item;
    }
    if !counted {
        return;
    }
    let memcg_id = memcg_id(ctx.arg::<u64>(0) as *const u8);
    let val = ctx.arg::<u64>(2);
    let key = MemcgCountKey {
        memcg_id,
        item,
        _pad: 0,
    };
    // Per-CPU values: no atomics needed (and the BPF target has none for
    // u64 in core); userspace sums the CPUs.
    match MEMCG_COUNTS.get_ptr_mut(&key) {
        // SAFETY: the pointer is this CPU's live u64 slot of the entry, and
        // a program does not migrate CPUs while it runs.
        Some(counter) => unsafe { *counter += val },
        None => {
            // A new entry starts at `val` on this CPU and zero on the others.
            let _ = MEMCG_COUNTS.insert(&key, &val, BPF_NOEXIST as u64);
        }
    }
    if oom_kill && let Some(slot) = Ring::Critical.reserve::<MemcgEvent>() {
        slot.submit_value(MemcgEvent {
            header: header(kind::MEMCG_OOM),
            memcg_id,
            item,
            _pad: 0,
            val,
        });
    }
}
