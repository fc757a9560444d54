//! The GPU memory ledger of one process, built from its traced CUDA calls:
//! what it holds, by kind and device, its peak, its failures and its
//! recent history, and what it never freed.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, VecDeque},
};

use serde::{Deserialize, Serialize};
use tracer_common::{CudaCall, cuda};

/// What an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocKind {
    /// `cudaMalloc`, `cuMemAlloc`, pitched allocations.
    Device,
    /// Unified memory (`cudaMallocManaged`).
    Managed,
    /// Page-locked host memory (`cudaMallocHost`, `cudaHostAlloc`): host RAM,
    /// charged to the process's memory cgroup.
    PinnedHost,
    /// Stream-ordered allocations (`cudaMallocAsync`, pools).
    AsyncPool,
    /// Physical memory of the virtual memory API (`cuMemCreate`), as used by
    /// PyTorch's expandable segments.
    VmmPhysical,
}

impl AllocKind {
    /// Every kind, in report order.
    pub const ALL: [AllocKind; 5] = [
        AllocKind::Device,
        AllocKind::Managed,
        AllocKind::PinnedHost,
        AllocKind::AsyncPool,
        AllocKind::VmmPhysical,
    ];

    /// The kind a function allocates, if it allocates.
    pub fn of(func: u32) -> Option<AllocKind> {
        use cuda::*;
        Some(match func {
            MALLOC | MALLOC_PITCH | MEM_ALLOC | MEM_ALLOC_PITCH => AllocKind::Device,
            MALLOC_MANAGED | MEM_ALLOC_MANAGED => AllocKind::Managed,
            MALLOC_HOST | HOST_ALLOC | MEM_ALLOC_HOST | MEM_HOST_ALLOC => AllocKind::PinnedHost,
            MALLOC_ASYNC
            | MALLOC_ASYNC_PTSZ
            | MALLOC_FROM_POOL_ASYNC
            | MALLOC_FROM_POOL_ASYNC_PTSZ
            | MEM_ALLOC_ASYNC
            | MEM_ALLOC_ASYNC_PTSZ
            | MEM_ALLOC_FROM_POOL_ASYNC
            | MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => AllocKind::AsyncPool,
            MEM_CREATE => AllocKind::VmmPhysical,
            _ => return None,
        })
    }

    /// Whether its pointers are device addresses (device, managed and
    /// stream-ordered memory; not pinned host memory, nor the handles of
    /// the virtual memory API): what a device memory snapshot holds.
    pub fn in_device_space(self) -> bool {
        self.space() == Space::Device
    }

    /// The address space its pointers live in.
    fn space(self) -> Space {
        match self {
            AllocKind::PinnedHost => Space::Host,
            AllocKind::VmmPhysical => Space::Handle,
            _ => Space::Device,
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::Device => "device",
            AllocKind::Managed => "managed",
            AllocKind::PinnedHost => "pinned host",
            AllocKind::AsyncPool => "async pool",
            AllocKind::VmmPhysical => "vmm physical",
        }
    }
}

/// Pointers of different kinds can collide across spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Space {
    Device,
    Host,
    Handle,
}

/// The space a free function releases from.
fn free_space(func: u32) -> Option<Space> {
    use cuda::*;
    Some(match func {
        FREE | FREE_ASYNC | FREE_ASYNC_PTSZ | MEM_FREE | MEM_FREE_ASYNC | MEM_FREE_ASYNC_PTSZ => {
            Space::Device
        }
        FREE_HOST | MEM_FREE_HOST => Space::Host,
        MEM_RELEASE => Space::Handle,
        _ => return None,
    })
}

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Pointer or handle, hex.
    pub ptr: String,
    /// Bytes.
    pub size: u64,
    /// Kind.
    pub kind: AllocKind,
    /// Device (-1 unknown).
    pub device: i32,
    /// The function that made it.
    pub function: Cow<'static, str>,
    /// Wall time, ns.
    pub ts_ns: i64,
}

/// One call, for the recent history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// Function.
    pub function: Cow<'static, str>,
    /// Bytes.
    pub size: u64,
    /// Return code.
    pub ret: i32,
    /// Device.
    pub device: i32,
}

/// Totals of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindTotals {
    /// Bytes held now.
    pub outstanding: u64,
    /// Most bytes held at once.
    pub peak: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees (explicit or implicit).
    pub frees: u64,
    /// Failed allocations.
    pub failed: u64,
}

/// What changed with one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new allocation.
    Allocated(AllocKind, u64),
    /// An allocation freed.
    Freed(AllocKind, u64),
    /// A free of a pointer the ledger never saw allocated (made before attach).
    UntrackedFree,
    /// An allocation failed.
    Failed(Option<AllocKind>, u64, i32),
    /// A context reset freed `n` allocations, `bytes` in all.
    Reset(usize, u64),
    /// Nothing to count (device or context calls, failed frees).
    None,
}

/// The ledger of one process.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    live: HashMap<(Space, u64), Allocation>,
    totals: BTreeMap<AllocKind, KindTotals>,
    by_device: BTreeMap<i32, u64>,
    peak_total: u64,
    recent: VecDeque<CallRecord>,
    failures: VecDeque<CallRecord>,
    calls: u64,
    untracked_frees: u64,
    vmm_mapped: u64,
    peak_reserved: u64,
    blocks: Option<Blocks>,
}

/// What a caching allocator (PyTorch's) handed out inside its segments,
/// from its USDT probes: `malloc(ptr, device, size, stream)` and
/// `free(ptr)`.
#[derive(Clone, Debug, Default)]
struct Blocks {
    /// pointer -> (size as the allocator counts it, device, size asked for)
    live: HashMap<u64, (u64, i32, u64)>,
    allocated: u64,
    peak: u64,
    untracked_frees: u64,
}

/// The allocator's block granularity: PyTorch rounds every block up to a
/// multiple of 512 bytes, and counts the rounded size as allocated.
pub const BLOCK_ROUND: u64 = 512;

/// A block's size as the caching allocator counts it.
pub fn block_size(requested: u64) -> u64 {
    requested.max(1).div_ceil(BLOCK_ROUND) * BLOCK_ROUND
}

/// Calls kept in the recent history.
const RECENT: usize = 64;
/// Failures kept.
const FAILURES: usize = 16;

impl Ledger {
    /// Applies one call made at wall time `ts_ns`.
    pub fn apply(&mut self, c: &CudaCall, ts_ns: i64) -> Change {
        self.calls += 1;
        // Borrowed: no allocation per call on this hot path.
        let function = Cow::Borrowed(tracer_common::cuda::name(c.func));
        let record = CallRecord {
            ts_ns,
            function: function.clone(),
            size: c.size,
            ret: c.ret,
            device: c.device,
        };
        let kind = AllocKind::of(c.func);
        if kind.is_some() || free_space(c.func).is_some() {
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(record.clone());
        }
        if c.ret != 0 {
            if cuda::allocates(c.func) {
                if let Some(k) = kind {
                    self.totals.entry(k).or_default().failed += 1;
                }
                if self.failures.len() == FAILURES {
                    self.failures.pop_front();
                }
                self.failures.push_back(record);
                return Change::Failed(kind, c.size, c.ret);
            }
            return Change::None;
        }
        if let Some(kind) = kind {
            let a = Allocation {
                ptr: format!("{:#x}", c.ptr),
                size: c.size,
                kind,
                device: c.device,
                function,
                ts_ns,
            };
            if let Some(old) = self.live.insert((kind.space(), c.ptr), a) {
                // The same pointer again: the earlier one was freed where we could not see.
                self.release(&old);
            }
            let t = self.totals.entry(kind).or_default();
            t.allocs += 1;
            t.outstanding += c.size;
            t.peak = t.peak.max(t.outstanding);
            if kind != AllocKind::PinnedHost {
                *self.by_device.entry(c.device).or_default() += c.size;
            }
            self.peak_total = self.peak_total.max(self.total());
            self.peak_reserved = self.peak_reserved.max(self.reserved());
            return Change::Allocated(kind, c.size);
        }
        if let Some(space) = free_space(c.func) {
            if c.ptr == 0 {
                return Change::None;
            }
            return match self.live.remove(&(space, c.ptr)) {
                Some(a) => {
                    self.release(&a);
                    Change::Freed(a.kind, a.size)
                }
                None => {
                    self.untracked_frees += 1;
                    Change::UntrackedFree
                }
            };
        }
        match c.func {
            cuda::MEM_MAP => self.vmm_mapped += c.size,
            cuda::MEM_UNMAP => self.vmm_mapped = self.vmm_mapped.saturating_sub(c.size),
            cuda::DEVICE_RESET | cuda::DEVICE_PRIMARY_CTX_RESET => return self.reset(c.device),
            _ => {}
        }
        Change::None
    }

    fn release(&mut self, a: &Allocation) {
        let t = self.totals.entry(a.kind).or_default();
        t.frees += 1;
        t.outstanding = t.outstanding.saturating_sub(a.size);
        if a.kind != AllocKind::PinnedHost
            && let Some(d) = self.by_device.get_mut(&a.device)
        {
            *d = d.saturating_sub(a.size);
        }
    }

    /// The pointers a context reset of `device` (every device when
    /// negative) frees: its device-space allocations.
    pub fn reset_ptrs(&self, device: i32) -> Vec<u64> {
        self.reset_keys(device)
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    fn reset_keys(&self, device: i32) -> Vec<(Space, u64)> {
        self.live
            .iter()
            .filter(|((space, _), a)| *space == Space::Device && (device < 0 || a.device == device))
            .map(|(k, _)| *k)
            .collect()
    }

    /// A context reset frees every device-space allocation on `device`.
    fn reset(&mut self, device: i32) -> Change {
        let gone = self.reset_keys(device);
        let mut bytes = 0;
        for k in &gone {
            if let Some(a) = self.live.remove(k) {
                bytes += a.size;
                self.release(&a);
            }
        }
        Change::Reset(gone.len(), bytes)
    }

    /// A block handed out by the process's caching allocator.
    pub fn block_malloc(&mut self, ptr: u64, requested: u64, device: i32) {
        let b = self.blocks.get_or_insert_with(Blocks::default);
        let size = block_size(requested);
        if let Some((old, ..)) = b.live.insert(ptr, (size, device, requested)) {
            // Handed out again without a free we saw.
            b.allocated = b.allocated.saturating_sub(old);
        }
        b.allocated += size;
        b.peak = b.peak.max(b.allocated);
    }

    /// A block given back to the caching allocator (not to CUDA).
    pub fn block_free(&mut self, ptr: u64) {
        let b = self.blocks.get_or_insert_with(Blocks::default);
        match b.live.remove(&ptr) {
            Some((size, ..)) => b.allocated = b.allocated.saturating_sub(size),
            None => b.untracked_frees += 1,
        }
    }

    /// Device memory the process reserved from CUDA: its cudaMalloc-family
    /// segments and its cuMemCreate handles (what a caching allocator
    /// holds, whether or not it handed it out).
    pub fn reserved(&self) -> u64 {
        self.outstanding(AllocKind::Device) + self.outstanding(AllocKind::VmmPhysical)
    }

    /// The caching allocator's figures, once its probes were seen.
    pub fn allocator(&self) -> Option<AllocatorSummary> {
        let b = self.blocks.as_ref()?;
        let reserved = self.reserved();
        Some(AllocatorSummary {
            allocated: b.allocated,
            peak_allocated: b.peak,
            reserved,
            peak_reserved: self.peak_reserved,
            free_in_cache: reserved.saturating_sub(b.allocated),
            fragmentation: (b.allocated > 0)
                .then(|| (reserved as f64 / b.allocated as f64 * 100.0).round() / 100.0),
            largest_free_block: self.largest_free_block(),
            blocks: b.live.len() as u64,
            untracked_frees: b.untracked_frees,
        })
    }

    /// The largest free range inside one cudaMalloc segment, between the
    /// blocks handed out in it (the caching allocator merges free
    /// neighbours, so such a range is one of its free blocks). `None`
    /// without segments, or when the process maps memory through the VMM
    /// API (expandable segments), whose ranges the ledger does not place.
    fn largest_free_block(&self) -> Option<u64> {
        let b = self.blocks.as_ref()?;
        if self.outstanding(AllocKind::VmmPhysical) > 0 {
            return None;
        }
        let mut segments: Vec<(u64, u64)> = self
            .live
            .iter()
            .filter(|((space, _), a)| *space == Space::Device && a.kind == AllocKind::Device)
            .map(|((_, ptr), a)| (*ptr, ptr.saturating_add(a.size)))
            .collect();
        if segments.is_empty() {
            return None;
        }
        segments.sort_unstable();
        let mut blocks: Vec<(u64, u64)> = b
            .live
            .iter()
            .map(|(ptr, (size, ..))| (*ptr, ptr.saturating_add(*size)))
            .collect();
        blocks.sort_unstable();
        let mut largest = 0;
        let mut i = 0;
        for (start, end) in segments {
            while i < blocks.len() && blocks[i].0 < start {
                i += 1;
            }
            let mut at = start;
            while i < blocks.len() && blocks[i].0 < end {
                largest = largest.max(blocks[i].0.saturating_sub(at));
                at = at.max(blocks[i].1);
                i += 1;
            }
            largest = largest.max(end.saturating_sub(at));
        }
        Some(largest)
    }

    /// Live allocations in device address space (device, managed and
    /// stream-ordered memory; not pinned host memory, nor the handles of
    /// the virtual memory API, which have no address): (pointer,
    /// allocation), lowest address first.
    pub fn device_segments(&self) -> Vec<(u64, &Allocation)> {
        let mut v: Vec<(u64, &Allocation)> = self
            .live
            .iter()
            .filter(|((space, _), _)| *space == Space::Device)
            .map(|((_, ptr), a)| (*ptr, a))
            .collect();
        v.sort_unstable_by_key(|(ptr, _)| *ptr);
        v
    }

    /// The blocks the caching allocator has handed out: (pointer, size as
    /// it counts it, size asked for), lowest address first; `None` until
    /// its probes were seen.
    pub fn allocator_blocks(&self) -> Option<Vec<(u64, u64, u64)>> {
        let b = self.blocks.as_ref()?;
        let mut v: Vec<(u64, u64, u64)> = b
            .live
            .iter()
            .map(|(ptr, (size, _, requested))| (*ptr, *size, *requested))
            .collect();
        v.sort_unstable();
        Some(v)
    }

    /// Bytes held now, all kinds.
    pub fn total(&self) -> u64 {
        self.totals.values().map(|t| t.outstanding).sum()
    }

    /// Bytes held of one kind.
    pub fn outstanding(&self, kind: AllocKind) -> u64 {
        self.totals.get(&kind).map(|t| t.outstanding).unwrap_or(0)
    }

    /// Allocations never freed, largest first.
    pub fn live(&self) -> Vec<Allocation> {
        let mut v: Vec<Allocation> = self.live.values().cloned().collect();
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.ts_ns.cmp(&b.ts_ns)));
        v
    }

    /// A serializable snapshot.
    pub fn summary(&self) -> LedgerSummary {
        let live = self.live();
        LedgerSummary {
            total_bytes: self.total(),
            peak_total_bytes: self.peak_total,
            by_kind: self.totals.iter().map(|(k, t)| (*k, *t)).collect(),
            by_device: self
                .by_device
                .iter()
                .filter(|(_, b)| **b > 0)
                .map(|(d, b)| (*d, *b))
                .collect(),
            live_allocations: live.len() as u64,
            largest: live.into_iter().take(5).collect(),
            calls: self.calls,
            untracked_frees: self.untracked_frees,
            vmm_mapped_bytes: self.vmm_mapped,
            failures: self.failures.iter().cloned().collect(),
            recent: self.recent.iter().rev().take(16).rev().cloned().collect(),
            allocator: self.allocator(),
        }
    }
}

/// A caching allocator's figures (PyTorch's, through its USDT probes):
/// what it handed out to tensors against what it reserved from CUDA.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSummary {
    /// Bytes in live blocks (each rounded up to 512 bytes, as PyTorch's
    /// `memory_allocated` counts them).
    pub allocated: u64,
    /// Most bytes in live blocks at once.
    pub peak_allocated: u64,
    /// Device memory reserved from CUDA (segments and VMM handles).
    pub reserved: u64,
    /// Most reserved at once.
    pub peak_reserved: u64,
    /// Reserved and not handed out: free inside the allocator's cache.
    pub free_in_cache: u64,
    /// reserved / allocated (1.0: every reserved byte is in a live block).
    pub fragmentation: Option<f64>,
    /// The largest free range inside one segment, where it can be derived.
    pub largest_free_block: Option<u64>,
    /// Live blocks.
    pub blocks: u64,
    /// Frees of blocks handed out before tracing started.
    pub untracked_frees: u64,
}

/// A ledger snapshot, as stored and printed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerSummary {
    /// Bytes held now, all kinds.
    pub total_bytes: u64,
    /// Most bytes held at once.
    pub peak_total_bytes: u64,
    /// Totals by kind.
    pub by_kind: BTreeMap<AllocKind, KindTotals>,
    /// Device-side bytes held per device (-1: device unknown).
    pub by_device: BTreeMap<i32, u64>,
    /// Allocations held.
    pub live_allocations: u64,
    /// The largest allocations held.
    pub largest: Vec<Allocation>,
    /// Calls seen.
    pub calls: u64,
    /// Frees of pointers allocated before tracing started.
    pub untracked_frees: u64,
    /// Virtual memory mapped with `cuMemMap`.
    pub vmm_mapped_bytes: u64,
    /// The latest failed allocations.
    pub failures: Vec<CallRecord>,
    /// The latest allocation and free calls.
    pub recent: Vec<CallRecord>,
    /// The process's caching allocator, when its probes were seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(func: u32, ret: i32, size: u64, ptr: u64, device: i32) -> CudaCall {
        CudaCall {
            func,
            ret,
            size,
            ptr,
            device,
            ..Default::default()
        }
    }

    #[test]
    fn tracks_each_kind_peak_and_frees() {
        let mut l = Ledger::default();
        assert_eq!(
            l.apply(&call(cuda::MALLOC, 0, 100, 0x1000, 0), 1),
            Change::Allocated(AllocKind::Device, 100)
        );
        l.apply(&call(cuda::MALLOC, 0, 50, 0x2000, 1), 2);
        l.apply(&call(cuda::MALLOC_HOST, 0, 30, 0x1000, 0), 3);
        l.apply(&call(cuda::MEM_CREATE, 0, 2 << 20, 0xabc, 0), 4);
        l.apply(&call(cuda::MALLOC_ASYNC, 0, 7, 0x3000, 0), 5);
        assert_eq!(l.outstanding(AllocKind::Device), 150);
        assert_eq!(l.outstanding(AllocKind::PinnedHost), 30);
        assert_eq!(l.outstanding(AllocKind::VmmPhysical), 2 << 20);
        // Same pointer value in another space is another allocation.
        assert_eq!(
            l.apply(&call(cuda::FREE_HOST, 0, 0, 0x1000, 0), 6),
            Change::Freed(AllocKind::PinnedHost, 30)
        );
        assert_eq!(l.outstanding(AllocKind::Device), 150);
        assert_eq!(
            l.apply(&call(cuda::FREE, 0, 0, 0x1000, 0), 7),
            Change::Freed(AllocKind::Device, 100)
        );
        assert_eq!(
            l.apply(&call(cuda::MEM_RELEASE, 0, 0, 0xabc, 0), 8),
            Change::Freed(AllocKind::VmmPhysical, 2 << 20)
        );
        let s = l.summary();
        assert_eq!(s.total_bytes, 57);
        assert_eq!(s.by_kind[&AllocKind::Device].peak, 150);
        assert_eq!(s.by_device.get(&1), Some(&50));
        assert_eq!(s.live_allocations, 2);
        assert_eq!(s.largest[0].size, 50);
        assert!(s.peak_total_bytes >= 150 + 30 + (2 << 20));
    }

    #[test]
    fn failures_untracked_frees_and_resets() {
        let mut l = Ledger::default();
        assert_eq!(
            l.apply(&call(cuda::MALLOC, 2, 1 << 30, 0, 0), 1),
            Change::Failed(Some(AllocKind::Device), 1 << 30, 2)
        );
        assert_eq!(
            l.apply(&call(cuda::MALLOC, 35, 10, 0, -1), 2),
            Change::Failed(Some(AllocKind::Device), 10, 35)
        );
        assert_eq!(
            l.apply(&call(cuda::FREE, 0, 0, 0xdead, 0), 3),
            Change::UntrackedFree
        );
        assert_eq!(
            l.apply(&call(cuda::FREE, 0, 0, 0, 0), 4),
            Change::None,
            "cudaFree(NULL)"
        );
        l.apply(&call(cuda::MALLOC, 0, 10, 0x10, 0), 5);
        l.apply(&call(cuda::MALLOC_MANAGED, 0, 20, 0x20, 0), 6);
        l.apply(&call(cuda::MALLOC, 0, 40, 0x40, 1), 7);
        l.apply(&call(cuda::MALLOC_HOST, 0, 5, 0x50, 0), 8);
        // What the reset will free, as told to the stacks' worker first.
        let mut gone = l.reset_ptrs(0);
        gone.sort();
        assert_eq!(gone, [0x10, 0x20]);
        assert_eq!(l.reset_ptrs(-1).len(), 3, "every device");
        assert_eq!(
            l.apply(&call(cuda::DEVICE_RESET, 0, 0, 0, 0), 9),
            Change::Reset(2, 30)
        );
        assert_eq!(l.total(), 45, "device 1 and host memory stay");
        let s = l.summary();
        assert_eq!(s.failures.len(), 2);
        assert_eq!(s.untracked_frees, 1);
        assert_eq!(s.by_kind[&AllocKind::Device].failed, 2);
        l.apply(&call(cuda::MEM_MAP, 0, 4096, 0x7e00, 0), 10);
        assert_eq!(l.summary().vmm_mapped_bytes, 4096);
        l.apply(&call(cuda::MEM_UNMAP, 0, 4096, 0x7e00, 0), 11);
        assert_eq!(l.summary().vmm_mapped_bytes, 0);
    }

    #[test]
    fn caching_allocator_blocks_against_reserved_segments() {
        const MIB: u64 = 1 << 20;
        let mut l = Ledger::default();
        assert!(
            l.allocator().is_none(),
            "no probe seen: no allocator figures"
        );
        l.apply(&call(cuda::MALLOC, 0, 20 * MIB, 0x1000_0000, 0), 1);
        l.apply(&call(cuda::MALLOC, 0, 2 * MIB, 0x2000_0000, 0), 2);
        // Blocks: 4 MiB, 1000 B (counted as 1024, as PyTorch rounds), 8 MiB.
        l.block_malloc(0x1000_0000, 4 * MIB, 0);
        l.block_malloc(0x1040_0000, 1000, 0);
        l.block_malloc(0x1080_0000, 8 * MIB, 0);
        let a = l.allocator().unwrap();
        assert_eq!(a.allocated, 12 * MIB + 1024);
        assert_eq!(a.reserved, 22 * MIB);
        assert_eq!(a.free_in_cache, 22 * MIB - 12 * MIB - 1024);
        assert_eq!(a.blocks, 3);
        // Gaps: 0x1040_0400..0x1080_0000 (4 MiB - 1 KiB), after the 8 MiB
        // block 4 MiB to the segment's end, and the whole 2 MiB segment.
        assert_eq!(a.largest_free_block, Some(4 * MIB));
        l.block_free(0x1000_0000);
        l.block_free(0xdead);
        let a = l.allocator().unwrap();
        assert_eq!(a.allocated, 8 * MIB + 1024);
        assert_eq!(a.peak_allocated, 12 * MIB + 1024);
        assert_eq!(a.untracked_frees, 1);
        assert_eq!(
            a.largest_free_block,
            Some(4 * MIB),
            "the freed 4 MiB block and its neighbour gap are not adjacent"
        );
        assert_eq!(
            a.fragmentation,
            Some(2.75),
            "22 MiB over 8 MiB + 1 KiB, rounded"
        );
        // A segment given back to CUDA leaves reserved; the peak stays.
        l.apply(&call(cuda::FREE, 0, 0, 0x2000_0000, 0), 3);
        let a = l.allocator().unwrap();
        assert_eq!((a.reserved, a.peak_reserved), (20 * MIB, 22 * MIB));
        assert_eq!(block_size(0), 512);
        assert_eq!(block_size(512), 512);
        assert_eq!(block_size(513), 1024);
        // The snapshot carries it; an older stored snapshot without it reads.
        let s = l.summary();
        assert_eq!(s.allocator.as_ref().unwrap().allocated, 8 * MIB + 1024);
        let mut v = serde_json::to_value(&s).unwrap();
        v.as_object_mut().unwrap().remove("allocator");
        let old: LedgerSummary = serde_json::from_value(v).unwrap();
        assert!(old.allocator.is_none());
    }
}
