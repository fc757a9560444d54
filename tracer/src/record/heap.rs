//! A process's heap as sampled by the heap probes: its allocation sites
//! (whole stacks, named) by live bytes, growth and age.

use serde::{Deserialize, Serialize};

use crate::stacks::symbols::Frame;

/// One allocation site: a whole stack and what it holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapSite {
    /// The stack, innermost (the allocator's caller) first.
    pub frames: Vec<Frame>,
    /// Estimated bytes allocated here and still live.
    pub live_bytes: u64,
    /// Sampled blocks still live.
    pub live_samples: u64,
    /// Change of `live_bytes` over the growth window (negative: shrank).
    pub growth_bytes: i64,
    /// Of `live_bytes`, what has been live longer than the leak age.
    pub old_bytes: u64,
    /// Estimated bytes allocated here since tracing began (freed or not).
    pub allocated_bytes: u64,
    /// Device memory sites only: the live allocations made here, largest
    /// first (at most [`SITE_ALLOCATIONS`]), for a PyTorch memory snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<SiteAllocation>,
}

/// Allocations listed per device memory site.
pub const SITE_ALLOCATIONS: usize = 64;

/// One live allocation of a device memory site.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteAllocation {
    /// The device pointer, hex.
    pub ptr: String,
    /// Bytes.
    pub size: u64,
    /// Wall time it was made, ns.
    pub ts_ns: u64,
}

/// The heap of one process at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapSnapshot {
    /// The process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Wall time, ns.
    pub ts_ns: u64,
    /// Mean bytes between samples (0: every allocation was kept).
    pub sample_bytes: u64,
    /// Estimated live bytes allocated since tracing began, all sites.
    pub live_bytes: u64,
    /// The process's resident memory, when it was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Seconds over which `growth_bytes` is measured.
    pub growth_window_s: u64,
    /// Seconds after which a live block counts in `old_bytes`.
    pub old_after_s: u64,
    /// The top sites by live bytes.
    pub sites: Vec<HeapSite>,
    /// Sites beyond those listed.
    pub more_sites: usize,
    /// What was lost on the way: samples the kernel could not keep or
    /// send, or the tracer could not take in time. Nonzero means the
    /// figures are low.
    pub lost_samples: u64,
    /// Samples whose stack went no further than the allocator's caller
    /// (no stack copy, or code without unwind information): their sites
    /// are cut short.
    #[serde(default)]
    pub shallow_samples: u64,
}
