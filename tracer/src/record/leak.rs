//! A slow leak of a memory cgroup (see `correlate::leak`): what the
//! `memory_leak` events say, and what a kill in a leaking cgroup keeps.

use serde::{Deserialize, Serialize};

/// The kind of the event rows of a memory cgroup found leaking, its
/// updates while it does, and its end.
pub const MEMORY_LEAK: &str = "memory_leak";

/// A memory cgroup found leaking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Leak {
    /// The cgroup.
    pub memcg: String,
    /// Its growth, bytes a second (the least-squares fit of its longest
    /// run of working-set points).
    pub bytes_per_second: f64,
    /// The same, percent of its limit an hour (None: no limit).
    pub percent_per_hour: Option<f64>,
    /// Since when it leaks: the start of its current run (its last restart
    /// or drop, or the first point tracer took), wall ns.
    pub since_ns: i64,
    /// The span of the run the rate was fitted over, seconds.
    pub fit_span_s: u32,
    /// Its working set at the last point, bytes.
    pub working_set: u64,
    /// Its limit, bytes.
    pub limit: Option<u64>,
    /// At this rate, seconds until the limit (None: no limit).
    pub limit_in_s: Option<f64>,
}

impl Leak {
    /// Its rate in words: `7.1 %/h of its limit (12.0 MiB/h)`, or
    /// `20.0 MiB/h, with no limit`.
    pub fn rate_words(&self) -> String {
        let per_hour = crate::util::units::bytes((self.bytes_per_second.max(0.0) * 3600.0) as u64);
        match self.percent_per_hour {
            Some(p) => format!("{p:.1} %/h of its limit ({per_hour}/h)"),
            None => format!("{per_hour}/h, with no limit"),
        }
    }

    /// In a few words, for `top`: `leaking 7.1 %/h, limit in ~9 h`, or
    /// `leaking 20.0 MiB/h`.
    pub fn short_words(&self) -> String {
        let rate = match self.percent_per_hour {
            Some(p) => format!("{p:.1} %/h"),
            None => format!(
                "{}/h",
                crate::util::units::bytes((self.bytes_per_second.max(0.0) * 3600.0) as u64)
            ),
        };
        format!("leaking {rate}{}", self.eta_words())
    }

    /// `, limit in ~9 h` at this rate (empty without a limit).
    pub fn eta_words(&self) -> String {
        self.limit_in_s
            .map(|s| format!(", limit in ~{}", crate::util::time::human_secs(s)))
            .unwrap_or_default()
    }
}
