//! Early warnings: a memory cgroup about to reach its limit.

use serde::{Deserialize, Serialize};

use crate::model::cgroup::Owner;

/// Whether a warning begins or ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningState {
    /// The cgroup is about to reach its limit.
    Warning,
    /// It no longer is.
    Recovered,
}

/// Why a cgroup is warned about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningReason {
    /// At its growth rate it reaches its limit within the threshold.
    Growth,
    /// Its tasks stall on memory (PSI `some avg10` over the threshold).
    Psi,
}

/// A `pressure` event: an early warning about a memory cgroup, or its end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PressureEvent {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// The memory cgroup.
    pub memcg: String,
    /// Begins or ends.
    pub state: WarningState,
    /// Why (for a recovery: why it was warned).
    pub reason: WarningReason,
    /// Memory charged, bytes.
    pub usage_bytes: u64,
    /// Its limit, bytes.
    pub limit_bytes: Option<u64>,
    /// Growth over the last seconds, bytes per second (least squares).
    pub rate_bytes_per_s: Option<f64>,
    /// Seconds to the limit at that rate.
    pub projected_s: Option<f64>,
    /// PSI `some avg10`, percent (cgroup v2).
    pub psi_some_avg10: Option<f64>,
    /// Container, pod or unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}
