//! The heap family on the user side: which files may hold an allocator,
//! the sampling configuration the programs run with, and their counters.

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    heap::{EXP_TABLE_LEN, EXP_TABLE_ONE, HeapConfig, stat},
    programs,
};

use super::{ProbeError, Probes};

/// Mean bytes between two samples by default (the jemalloc/tcmalloc
/// profiling default is of this order: 512 KiB).
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;
/// Allocations of at least this many bytes are always kept by default.
pub const DEFAULT_ALWAYS_BYTES: u64 = 1024 * 1024;
/// The largest sampling period accepted (keeps the kernel's fixed-point
/// product within 64 bits).
pub const MAX_SAMPLE_BYTES: u64 = 1 << 40;

/// Whether a mapped file, by its name, may export malloc: the C library
/// (glibc, musl) and the allocators that replace it.
pub fn is_allocator_library_name(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libc.so")
        || base.starts_with("libc-")
        || base.starts_with("ld-musl")
        || base.starts_with("libc.musl")
        || [
            "malloc", "jemalloc", "tcmalloc", "mimalloc", "hoard", "snmalloc",
        ]
        .iter()
        .any(|a| base.contains(a))
}

/// The configuration: one sample per `sample_bytes` allocated on average
/// (0 = every allocation), every allocation of `always_bytes` or more.
pub fn config(sample_bytes: u64, always_bytes: u64) -> HeapConfig {
    let mut c = HeapConfig::empty();
    c.sample_bytes = sample_bytes.min(MAX_SAMPLE_BYTES);
    c.always_bytes = always_bytes;
    c.exp_table = exp_table();
    c
}

/// Quantiles of the unit exponential distribution, 16.16 fixed point:
/// entry i is `-ln((i + 0.5) / EXP_TABLE_LEN)` (the sampling programs draw
/// their gaps from it).
pub fn exp_table() -> [u32; EXP_TABLE_LEN] {
    let mut t = [0u32; EXP_TABLE_LEN];
    for (i, q) in t.iter_mut().enumerate() {
        let u = (i as f64 + 0.5) / EXP_TABLE_LEN as f64;
        *q = (-u.ln() * EXP_TABLE_ONE as f64).round() as u32;
    }
    t
}

/// The bytes a sample of `size` stands for: itself when kept by size or
/// with sampling off; else its size over the chance it had of being
/// picked, `1 - exp(-size / sample_bytes)` (unbiased).
pub fn weight(size: u64, how: u32, sample_bytes: u64) -> f64 {
    if how != tracer_common::heap::how::SAMPLED || sample_bytes == 0 {
        return size as f64;
    }
    let p = -(-(size as f64) / sample_bytes as f64).exp_m1();
    if p > 0.0 { size as f64 / p } else { 0.0 }
}

/// The heap programs' counters (`tracer_common::heap::stat`).
pub struct HeapStats {
    map: PerCpuArray<MapData, u64>,
}

/// A read of [`HeapStats`], summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HeapCounts {
    /// Allocation calls seen.
    pub calls: u64,
    /// Allocations sampled.
    pub sampled: u64,
    /// Samples refused because the live-sample map was full.
    pub map_full: u64,
    /// Samples sent without their stack.
    pub stack_lost: u64,
    /// Samples and frees lost because the ring was full.
    pub ring_full: u64,
    /// Frees of sampled blocks.
    pub frees: u64,
}

impl HeapStats {
    /// Reads the counters.
    pub fn read(&self) -> Result<HeapCounts, aya::maps::MapError> {
        let get =
            |i: u32| -> Result<u64, aya::maps::MapError> { Ok(self.map.get(&i, 0)?.iter().sum()) };
        Ok(HeapCounts {
            calls: get(stat::CALLS)?,
            sampled: get(stat::SAMPLED)?,
            map_full: get(stat::MAP_FULL)?,
            stack_lost: get(stat::STACK_LOST)?,
            ring_full: get(stat::RING_FULL)?,
            frees: get(stat::FREES)?,
        })
    }
}

/// The memory system calls traced for the heap family's processes:
/// (program, tracepoint).
const SYSCALL_PROBES: [(&str, &str); 7] = [
    (programs::HEAP_MMAP_ENTER, "sys_enter_mmap"),
    (programs::HEAP_MMAP_EXIT, "sys_exit_mmap"),
    (programs::HEAP_MUNMAP_ENTER, "sys_enter_munmap"),
    (programs::HEAP_MREMAP_ENTER, "sys_enter_mremap"),
    (programs::HEAP_MREMAP_EXIT, "sys_exit_mremap"),
    (programs::HEAP_BRK_ENTER, "sys_enter_brk"),
    (programs::HEAP_BRK_EXIT, "sys_exit_brk"),
];

impl Probes {
    /// Attaches the heap family's syscall tracepoints (mmap, munmap,
    /// mremap, brk), which act only for the processes entered with
    /// [`Probes::heap_pid`]. A kernel without syscall tracepoints
    /// (`CONFIG_FTRACE_SYSCALLS` off) traces malloc and friends only: the
    /// returned lines say what is missing.
    pub fn attach_heap_syscalls(&mut self) -> Vec<String> {
        let mut missing = Vec::new();
        for (program, tp) in SYSCALL_PROBES {
            if let Err(e) = self.attach_tracepoint(program, "syscalls", tp) {
                missing.push(format!("syscalls:{tp}: {e}"));
            }
        }
        missing
    }

    /// Enters (or removes) a process whose memory system calls are traced.
    pub fn heap_pid(&mut self, pid: u32, traced: bool) -> Result<(), ProbeError> {
        self.set_pid(tracer_common::maps::HEAP_PIDS, pid, traced)
    }

    /// Takes the heap counters out of the object.
    pub fn take_heap_stats(&mut self) -> Result<HeapStats, ProbeError> {
        let name = tracer_common::maps::HEAP_STATS;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        let map = PerCpuArray::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        Ok(HeapStats { map })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_names() {
        for (p, want) in [
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", true),
            ("/lib/ld-musl-x86_64.so.1", true),
            ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", true),
            ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", true),
            ("/usr/lib/libmimalloc.so.2", true),
            ("/usr/lib/x86_64-linux-gnu/libcrypt.so.1", false),
            ("/usr/lib/x86_64-linux-gnu/libcudart.so.12", false),
        ] {
            assert_eq!(is_allocator_library_name(p), want, "{p}");
        }
    }

    #[test]
    fn the_exponential_table_has_mean_one() {
        let c = config(DEFAULT_SAMPLE_BYTES, 1 << 20);
        let mean = c.exp_table.iter().map(|&q| q as f64).sum::<f64>()
            / (EXP_TABLE_LEN as f64 * EXP_TABLE_ONE as f64);
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        // Decreasing quantiles; the largest gap stays well inside 64 bits
        // at the largest period.
        assert!(c.exp_table.windows(2).all(|w| w[0] >= w[1]));
        assert!((MAX_SAMPLE_BYTES as u128) * (c.exp_table[0] as u128) < u64::MAX as u128);
    }

    #[test]
    fn weights_are_unbiased() {
        use tracer_common::heap::how;
        let n = 512 * 1024;
        assert_eq!(weight(4096, how::EXACT, 0), 4096.0);
        assert_eq!(weight(8 << 20, how::BIG, n), (8 << 20) as f64);
        // Small blocks stand for about sample_bytes each; a block of the
        // period for size / (1 - 1/e).
        assert!((weight(16, how::SAMPLED, n) - n as f64).abs() < 16.0);
        let w = weight(n, how::SAMPLED, n);
        assert!((w - n as f64 / (1.0 - (-1.0f64).exp())).abs() < 1.0);
        // Expected weight of a sampled 1 KiB block times its chance = 1 KiB.
        let p = 1.0 - (-(1024.0) / n as f64).exp();
        assert!((weight(1024, how::SAMPLED, n) * p - 1024.0).abs() < 1e-6);
    }
}
