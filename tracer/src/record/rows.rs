//! Rows of the stored timelines, as the correlators make them.

use serde::Serialize;

/// One device in the timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    /// Window start, wall ns.
    pub ts_ns: i64,
    /// Device index.
    pub device: u32,
    /// Total memory.
    pub total: u64,
    /// Most used in the window.
    pub used: u64,
    /// Highest GPU utilization, percent.
    pub util_gpu: Option<u32>,
    /// Highest temperature.
    pub temperature_c: Option<u32>,
    /// Highest power, mW.
    pub power_mw: Option<u32>,
}

/// One process on one device in the timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcRow {
    /// Window start, wall ns.
    pub ts_ns: i64,
    /// Device index.
    pub device: u32,
    /// Pid.
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// Container, pod or cgroup.
    pub container: Option<String>,
    /// NVML's figure (max in the window).
    pub nvml_used: Option<u64>,
    /// Traced device bytes.
    pub traced_device: Option<u64>,
    /// Pinned host bytes.
    pub pinned_host: Option<u64>,
    /// Host RSS, kB.
    pub host_rss_kb: Option<u64>,
    /// Memory cgroup usage.
    pub memcg_usage: Option<u64>,
    /// Memory cgroup limit.
    pub memcg_limit: Option<u64>,
}

/// A process's CUDA ledger at a moment, as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LedgerSnapshot {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// The process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Whether this is the ledger at its exit (what it never freed).
    pub at_exit: bool,
    /// The ledger.
    pub ledger: crate::model::ledger::LedgerSummary,
}

/// A reading of the recorder's shared counters (`recorder::metrics::Metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Events handled.
    pub events: u64,
    /// Kill records committed.
    pub kills: u64,
    /// Userspace kills folded into aggregates.
    pub folded_kills: u64,
    /// GPU out-of-memory records committed.
    pub gpu_ooms: u64,
    /// Events lost on the critical ring.
    pub drops_critical: u64,
    /// Events lost on the data ring.
    pub drops_data: u64,
    /// Events lost on the OOM ring.
    pub drops_oom: u64,
    /// NVML samples taken.
    pub nvml_samples: u64,
    /// How long the last NVML sample took, µs.
    pub nvml_last_us: u64,
    /// Kernel stamp to commit of the last kill, µs.
    pub last_kill_commit_us: u64,
    /// Kills by commit latency: counts per bucket of
    /// [`KILL_COMMIT_BUCKETS_US`] (not cumulative), the last for the rest.
    pub kill_commit_buckets: [u64; KILL_COMMIT_BUCKETS_US.len() + 1],
    /// Sum of the kill commit latencies, µs.
    pub kill_commit_sum_us: u64,
}

/// Upper bounds of the kill commit latency buckets, µs: around the 10 ms
/// p99 target, and its failures.
pub const KILL_COMMIT_BUCKETS_US: [u64; 9] = [
    500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000,
];

/// A raw event as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventRow {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// Kind name.
    pub kind: String,
    /// Process of `current` when the hook ran.
    pub pid: u32,
    /// Thread of `current`.
    pub tid: u32,
    /// Name of `current`.
    pub comm: String,
    /// Kind-specific fields.
    pub data: serde_json::Value,
}

/// Drops counted by the probes in one interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropRow {
    /// Ring: `critical`, `data` or `oom`; `sigkill` for the SIGKILL events
    /// among the critical ring's losses; `stop` for events left unread at
    /// a stop.
    pub ring: String,
    /// Events lost.
    pub count: u64,
    /// Interval start, wall ns.
    pub from_ns: i64,
    /// Interval end, wall ns.
    pub to_ns: i64,
}

impl DropRow {
    /// What was lost, in words: `12 SIGKILLs lost on the critical ring`.
    pub fn describe(&self) -> String {
        match self.ring.as_str() {
            "sigkill" => format!("{} SIGKILLs lost on the critical ring", self.count),
            "stop" => format!("{} events left unread at the recorder's stop", self.count),
            ring => format!("{} events lost on the {ring} ring", self.count),
        }
    }
}

/// The kind of the event rows of NVIDIA Xid errors from the kernel log.
pub const GPU_XID: &str = "gpu_xid";
/// The kind of the event rows of early warnings (and their ends).
pub const PRESSURE: &str = "pressure";
/// The kind of the event rows of heap tracing turned on or off for a
/// memory cgroup under pressure.
pub const HEAP_PRESSURE: &str = "heap_pressure";

/// The kind of the event rows of a memory cgroup armed or disarmed for
/// growth attribution on risk (`--growth risk`).
pub const GROWTH_ARMED: &str = "growth_armed";

/// Every kind of stored event row: the probes' kinds that are stored
/// (tracer-common's registry), then the recorder's own.
pub fn stored_kinds() -> Vec<&'static str> {
    tracer_common::EVENT_KINDS
        .iter()
        .filter(|k| k.stored)
        .map(|k| k.name)
        .chain([
            GPU_XID,
            PRESSURE,
            HEAP_PRESSURE,
            GROWTH_ARMED,
            super::GROWTH_PICTURE,
            super::MEMORY_LEAK,
        ])
        .collect()
}
