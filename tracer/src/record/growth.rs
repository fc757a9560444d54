//! Where a process's memory grew, as sampled page faults show it, and the
//! allocation that tipped an OOM kill.

use serde::{Deserialize, Serialize};

use crate::stacks::symbols::Frame;

/// One growth site: a whole stack and the bytes faulted in there.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthSite {
    /// The stack, innermost first: the first frame outside the C library
    /// and allocators (the code that asked for the memory), unless nothing
    /// outside them was unwound.
    pub frames: Vec<Frame>,
    /// Estimated bytes faulted in here within the window.
    pub bytes: u64,
    /// Samples within the window.
    pub samples: u64,
    /// Estimated bytes of those the process gave back (munmap, madvise)
    /// by the window's end; `bytes` less this is what it kept.
    #[serde(default)]
    pub returned_bytes: u64,
}

/// Where one process's memory grew over a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthReport {
    /// The process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Wall time the window ends (the kill, the exit, or now), ns.
    pub until_ns: u64,
    /// Seconds the window spans.
    pub window_s: u64,
    /// Mean bytes faulted in between two samples (0: every fault).
    pub sample_bytes: u64,
    /// Estimated bytes faulted in within the window, all sites.
    pub bytes: u64,
    /// Estimated bytes of those given back by the window's end (munmap,
    /// madvise that drops pages); `None` where that is not traced (the
    /// sites are then ranked by bytes faulted in, not kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_bytes: Option<u64>,
    /// Samples within the window.
    pub samples: u64,
    /// Estimated bytes faulted in since the process was first seen.
    pub total_bytes: u64,
    /// The top sites of the window by bytes kept (faulted in less given
    /// back), then by bytes faulted in.
    pub sites: Vec<GrowthSite>,
    /// Sites beyond those listed.
    pub more_sites: usize,
    /// Samples whose stack ended at its first frame (no stack copy, or code
    /// without unwind information).
    pub shallow_samples: u64,
    /// Samples the tracer could not take in time (its queue was full).
    pub lost_samples: u64,
    /// Bytes of large anonymous mappings made within the window (each one
    /// recorded, none sampled): memory reserved, faulted in later.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// The top sites of those mappings by bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<GrowthSite>,
}

/// The stack of the task whose allocation hit the limit, at the kill.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TipStack {
    /// The task's process.
    pub pid: u32,
    /// The task (thread).
    pub tid: u32,
    /// Its name.
    pub comm: String,
    /// The stack, innermost first, from the first frame outside the C
    /// library and allocators.
    pub frames: Vec<Frame>,
    /// Whether that task's process is the victim (else the kernel chose
    /// another process than the one whose allocation failed).
    pub victim_is_trigger: bool,
}

/// Why a memory cgroup armed growth attribution (`--growth risk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmReason {
    /// Its working set was over the arming level and growing.
    Level,
    /// Its limit was hit.
    LimitHit,
    /// Its usage went over `memory.high` (v2).
    High,
    /// An early warning stood for it.
    Warning,
    /// The user named it (`--growth-cgroup`).
    Named,
}

impl ArmReason {
    /// In words.
    pub fn says(self) -> &'static str {
        match self {
            ArmReason::Level => "over the arming level and growing",
            ArmReason::LimitHit => "its limit was hit",
            ArmReason::High => "it went over memory.high",
            ArmReason::Warning => "an early warning stood",
            ArmReason::Named => "named with --growth-cgroup",
        }
    }
}

/// The armed memory cgroup a kill happened in (`--growth risk`): growth
/// was sampled from `since_ns` on, not before.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrowthArmed {
    /// The armed cgroup (the victim's, or one above it).
    pub memcg: String,
    /// When it armed, wall ns.
    pub since_ns: i64,
    /// Why.
    pub reason: ArmReason,
    /// Its working set / limit then, percent, where known.
    pub percent: Option<f64>,
}

/// The kind of the event rows of the pictures taken as cgroups arm.
pub const GROWTH_PICTURE: &str = "growth_picture";

/// One picture of an armed memory cgroup's processes, taken over the first
/// seconds after it armed (`--growth risk`): a "before" for a kill that
/// comes later.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Picture {
    /// The armed cgroup.
    pub memcg: String,
    /// When it armed, wall ns.
    pub armed_ns: i64,
    /// When the picture was taken (the end of its window), wall ns.
    pub ts_ns: i64,
    /// Its processes, the largest first (by resident memory).
    pub processes: Vec<PictureProcess>,
    /// Processes of the cgroup left out (past the budget).
    pub more_processes: usize,
    /// What was not taken, and why (the budget, a busy worker, no heap
    /// tracing loaded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One process in a [`Picture`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PictureProcess {
    /// The process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Its resident memory when the picture was taken, bytes.
    pub rss_bytes: Option<u64>,
    /// What it faulted in since its cgroup armed, estimated bytes.
    pub growth_bytes: u64,
    /// Where, the top sites.
    pub growth_sites: Vec<GrowthSite>,
    /// What its traced heap allocations still held (None: not traced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_live_bytes: Option<u64>,
    /// Where, the top sites.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heap_sites: Vec<super::heap::HeapSite>,
}
