//! Reclaim per memory cgroup: the pages scanned and reclaimed by each
//! cgroup's tasks (a cgroup at its limit reclaims in the tasks that charge
//! it), the pressure that leads up to a memcg OOM kill.

use aya_ebpf::{
    bindings::BPF_NOEXIST, helpers::bpf_get_current_comm, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::MemcgCountKey;

use crate::{
    maps::MEMCG_COUNTS,
    util::{config, current_memcg_id},
};

/// `raw_tracepoint/mm_vmscan_lru_shrink_inactive`, from the reclaim of an
/// inactive LRU list (`shrink_inactive_list()`, and `evict_folios()` of
/// the multi-generational LRU) in mm/vmscan.c: `TP_PROTO(int nid, unsigned
/// long nr_scanned, unsigned long nr_reclaimed, ...)`. It fires only while
/// the kernel reclaims, a batch of pages at a time, so it costs nothing
/// while memory is plentiful (`memcg:count_memcg_events`, which this
/// replaces, fired at every charged page fault). The scans count for the
/// memory cgroup of the reclaiming task, as direct reclaim, or as kswapd's
/// in the cgroup of kswapd (the root). Minimum kernel: 4.17 (raw
/// tracepoints; these arguments since 4.8).
#[raw_tracepoint(tracepoint = "mm_vmscan_lru_shrink_inactive")]
pub fn memcg_reclaim(ctx: RawTracePointContext) -> u32 {
    let scanned = ctx.arg::<u64>(1);
    let reclaimed = ctx.arg::<u64>(2);
    let items = config().memcg_counted_items;
    // `memcg_counted_items`: PGSCAN_DIRECT, PGSTEAL_DIRECT, PGSCAN_KSWAPD,
    // PGSTEAL_KSWAPD (see MEMCG_ITEM_NAMES in userspace).
    let kswapd = bpf_get_current_comm().is_ok_and(|c| c.starts_with(b"kswapd"));
    let (scan, steal) = if kswapd {
        (items[2], items[3])
    } else {
        (items[0], items[1])
    };
    let memcg_id = current_memcg_id();
    add(memcg_id, scan, scanned);
    add(memcg_id, steal, reclaimed);
    0
}

#[inline(always)]
fn add(memcg_id: u64, item: i32, val: u64) {
    if item < 0 || val == 0 {
        return;
    }
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
}
