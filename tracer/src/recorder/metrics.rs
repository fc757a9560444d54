//! The recorder's counters in one place, shared: an exporter (or anything
//! holding the `Arc`) reads them at any time, not only in the stop summary.

use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::record::MetricsSnapshot;

/// Counters the engine keeps current (relaxed atomics: each is exact, a
/// reading of several is not one instant).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Events handled.
    pub events: AtomicU64,
    /// Kill records committed (aggregates count once).
    pub kills: AtomicU64,
    /// Userspace kills folded into aggregates.
    pub folded_kills: AtomicU64,
    /// GPU out-of-memory records committed.
    pub gpu_ooms: AtomicU64,
    /// Events lost on the critical ring, since start.
    pub drops_critical: AtomicU64,
    /// Events lost on the data ring, since start.
    pub drops_data: AtomicU64,
    /// Events lost on the OOM ring, since start.
    pub drops_oom: AtomicU64,
    /// NVML samples taken.
    pub nvml_samples: AtomicU64,
    /// How long the last NVML sample took, µs.
    pub nvml_last_us: AtomicU64,
    /// Microseconds from the kernel's stamp of the last kill to its commit.
    pub last_kill_commit_us: AtomicU64,
    /// Kills per commit latency bucket (`record::KILL_COMMIT_BUCKETS_US`).
    pub kill_commit_buckets: [AtomicU64; crate::record::KILL_COMMIT_BUCKETS_US.len() + 1],
    /// Sum of the kill commit latencies, µs.
    pub kill_commit_sum_us: AtomicU64,
}

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one kill's commit latency.
    pub fn kill_committed(&self, us: u64) {
        let i = crate::record::KILL_COMMIT_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(crate::record::KILL_COMMIT_BUCKETS_US.len());
        Self::add(&self.kill_commit_buckets[i], 1);
        Self::add(&self.kill_commit_sum_us, us);
        Self::set(&self.last_kill_commit_us, us);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// Every counter now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            events: r(&self.events),
            kills: r(&self.kills),
            folded_kills: r(&self.folded_kills),
            gpu_ooms: r(&self.gpu_ooms),
            drops_critical: r(&self.drops_critical),
            drops_data: r(&self.drops_data),
            drops_oom: r(&self.drops_oom),
            nvml_samples: r(&self.nvml_samples),
            nvml_last_us: r(&self.nvml_last_us),
            last_kill_commit_us: r(&self.last_kill_commit_us),
            kill_commit_buckets: std::array::from_fn(|i| r(&self.kill_commit_buckets[i])),
            kill_commit_sum_us: r(&self.kill_commit_sum_us),
        }
    }
}

impl crate::export::feeds::CounterSource for Metrics {
    fn counters(&self) -> MetricsSnapshot {
        self.snapshot()
    }
}
