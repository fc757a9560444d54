//! What the engine saw, printed and returned when the recorder stops.

use crate::probes::Drops;

/// What the engine saw, printed when the recorder stops.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineSummary {
    /// Session id.
    pub session_id: i64,
    /// Events handled.
    pub events: u64,
    /// Kills recorded.
    pub kills: u64,
    /// Kills found in the kernel log only.
    pub kmsg_only_kills: u64,
    /// OOM victims the kernel marked while they were already exiting, with
    /// no kill (see `features::kills`).
    pub oom_marks_without_kill: u64,
    /// Userspace kills folded into aggregate records (a SIGKILL storm).
    pub folded_kills: u64,
    /// Failed calls counted in a window of identical ones rather than
    /// stored (a process retrying `cudaMalloc` in a loop).
    pub folded_calls: u64,
    /// Forks and exits counted in a window of a parent's rather than stored
    /// (a fork storm; see `fold::PROC_ALLOWANCE`).
    pub folded_procs: u64,
    /// Items each exporter lost (its queue was full), by exporter.
    pub export_drops: Vec<(String, u64)>,
    /// Drops by ring.
    pub drops: Drops,
    /// Model counters.
    pub model: crate::model::ModelStats,
    /// Processes in the model at the end.
    pub model_entries: usize,
    /// Live processes in the model at the end.
    pub model_live: usize,
    /// What the model's entries weigh at the end, bytes (its budget:
    /// [`crate::model::BUDGET_BYTES`]).
    pub model_bytes: usize,
    /// GPU out-of-memory failures recorded.
    pub gpu_ooms: u64,
    /// NVML samples taken.
    pub nvml_samples: u64,
    /// Mean time an NVML sample took, µs.
    pub nvml_sample_us_mean: u64,
    /// Longest NVML sample, µs.
    pub nvml_sample_us_max: u64,
    /// Timeline rows written (devices and processes).
    pub timeline_rows: u64,
    /// Per kill stored on its own (the last 1,000): µs from the kernel's
    /// timestamp of the kill to the return of its durable commit. A SIGKILL
    /// storm's aggregates are not in it (stored when their window ends).
    pub kill_commit_us: Vec<u64>,
    /// The growth programs' counters (growth attribution on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<crate::probes::growth::GrowthCounts>,
    /// With `--growth risk`: cgroups armed, and seconds the page-fault
    /// programs were attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth_arming: Option<ArmingSummary>,
    /// Memory cgroups watched for slow leaks at the stop, and leaks found.
    pub leaks: LeakSummary,
    /// Heap and growth samples the worker could not take in time.
    pub growth_queue_drops: u64,
    /// Exited processes whose heap and growth state was forgotten before
    /// its time, to keep the worker's memory bounded.
    pub growth_forgotten: u64,
    /// Reads of a sampled or tipping task's maps not made because both
    /// readers were busy (perhaps stuck on tasks holding their memory map
    /// lock); the worker reads those maps itself when it unwinds.
    pub maps_reads_skipped: u64,
}

/// Slow leaks over a session.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct LeakSummary {
    /// Series watched at the stop (memory cgroups, pod containers).
    pub watched: usize,
    /// Leaks found.
    pub found: u64,
}

/// Growth attribution on risk over a session.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ArmingSummary {
    /// Times a cgroup armed.
    pub arms: u64,
    /// Seconds the page-fault programs were attached.
    pub attached_s: f64,
    /// Pictures taken as cgroups armed.
    pub pictures: u64,
    /// Armings not pictured (4 in progress, or pictured within 10 min).
    pub pictures_not_taken: u64,
}
