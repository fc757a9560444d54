//! Reclaim per memory cgroup: the pages scanned and reclaimed by each
//! cgroup's tasks (a cgroup at its limit reclaims in the tasks that charge
//! it), the pressure that leads up to a memcg OOM kill. And the cgroups
//! made and removed, which keep the recorder's map of cgroup ids current.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_comm,
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use tracer_common::{CgroupDir, MemcgCountKey, field, kind};

use crate::{
    maps::MEMCG_COUNTS,
    util::{Ring, config, current_memcg_id, header, read_data_loc_str, read_field},
};

/// `tracepoint/cgroup/cgroup_mkdir`, from `cgroup_mkdir()` in
/// kernel/cgroup/cgroup.c, in every hierarchy. Format: `int root, int
/// level, u64 id, __data_loc char[] path` (`id` a `u64` since 5.5).
/// Sent on the data ring, which also carries the execs: a program that
/// starts in a new cgroup comes after the cgroup. Minimum kernel: 4.13.
#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    on_cgroup_dir(&ctx, kind::CGROUP_MKDIR)
}

/// `tracepoint/cgroup/cgroup_rmdir`, from `cgroup_rmdir()`: the same
/// event class as [`cgroup_mkdir`].
#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    on_cgroup_dir(&ctx, kind::CGROUP_RMDIR)
}

#[inline(always)]
fn on_cgroup_dir(ctx: &TracePointContext, kind: u32) -> u32 {
    let Some(id) = read_field::<u64>(ctx, field::CGDIR_ID) else {
        return 0;
    };
    let Some(mut slot) = Ring::Data.reserve::<CgroupDir>() else {
        return 1;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<CgroupDir>()
    // bytes that only this program writes until submit; every field is
    // written before submit but `path` past its NUL, which userspace does
    // not read.
    unsafe {
        (*ev).header = header(kind);
        (*ev).root = read_field::<i32>(ctx, field::CGDIR_ROOT).unwrap_or(-1);
        (*ev).level = read_field::<i32>(ctx, field::CGDIR_LEVEL).unwrap_or(-1);
        (*ev).id = id;
        (*ev)._pad = 0;
        (*ev).path[0] = 0;
        // The kernel's length tells a path cut to fit; 0 (unread) sends
        // userspace to its walk of the hierarchy.
        (*ev).path_len = read_data_loc_str(ctx, field::CGDIR_PATH, &mut (*ev).path).unwrap_or(0);
    }
    slot.submit();
    0
}

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
