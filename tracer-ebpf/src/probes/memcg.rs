//! Memory cgroup event counters: reclaim and fault pressure per memcg, and
//! OOM kills on kernels that count them through the same path.

use aya_ebpf::{bindings::BPF_NOEXIST, macros::tracepoint, programs::TracePointContext};
use tracer_common::{MemcgCountKey, MemcgEvent, field, kind};

use crate::{
    maps::MEMCG_COUNTS,
    util::{Ring, config, header, read_field},
};

/// `tracepoint/memcg/count_memcg_events`, from `count_memcg_events()` in
/// mm/memcontrol.c. Format: `u64 id, int item, unsigned long val`, where
/// `item` is an `enum vm_event_item` whose values differ between kernels;
/// userspace resolves the ones we want from BTF into `CONFIG`.
/// This fires on every memcg-charged page fault, so the common case (an
/// item we do not count) costs one field read and a few compares.
/// Minimum kernel: 6.10.
#[tracepoint(category = "memcg", name = "count_memcg_events")]
pub fn memcg_count_events(ctx: TracePointContext) -> u32 {
    try_count_events(&ctx);
    0
}

#[inline(always)]
fn try_count_events(ctx: &TracePointContext) {
    let Some(item) = read_field::<i32>(ctx, field::MEMCG_ITEM) else {
        return;
    };
    let cfg = config();
    let oom_kill = item == cfg.memcg_oom_kill_item;
    let mut counted = oom_kill;
    for wanted in cfg.memcg_counted_items {
        counted |= wanted >= 0 && wanted == item;
    }
    if !counted {
        return;
    }
    let memcg_id = read_field::<u64>(ctx, field::MEMCG_ID).unwrap_or(0);
    let val = read_field::<u64>(ctx, field::MEMCG_VAL).unwrap_or(0);
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
