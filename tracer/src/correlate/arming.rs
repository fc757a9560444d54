//! Which memory cgroups are at risk, for growth attribution on risk
//! (`--growth risk`): the page-fault programs run only while one is, and
//! follow only the processes in those. Pure: sample windows come in,
//! transitions go out.
//!
//! A cgroup arms when
//! - its working set is at or above the arming level of its limit and
//!   growing (the least-squares slope of the window, as the early warning
//!   fits it, at least [`MIN_RISE_OF_LIMIT`] of the limit per second);
//! - its limit was hit since the last sample (v1 `memory.failcnt`, v2
//!   `memory.events` max): reclaim at the limit; or (v2) its usage went
//!   over `memory.high` (`memory.events` high): throttled into reclaim;
//! - an early warning stands for it (about to reach its limit, or
//!   stalling on memory);
//! - the user named it (`--growth-cgroup`): armed while it exists.
//!
//! It disarms once none of these has held for [`CALM_NS`] and its working
//! set is [`HYSTERESIS`] points under the level, or when it holds no
//! process any more (a named one: when its directory is removed).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::sampler::CgroupSample;

/// Growth under this share of the limit per second is not a rise.
pub const MIN_RISE_OF_LIMIT: f64 = 0.0005;
/// Percentage points under the level before a cgroup counts as calm: as
/// for heap tracing on pressure.
pub use super::pressure::HYSTERESIS;
/// A cgroup disarms once calm for this long.
pub const CALM_NS: i64 = 10_000_000_000;
/// A rising cgroup this many points under the level is watched between
/// samples (its usage alone, every [`WATCH_NS`]).
pub const WATCH_BELOW: f64 = 30.0;
/// How often watched cgroups are read.
pub const WATCH_NS: i64 = 50_000_000;

pub use crate::record::ArmReason;

/// A change of state for one cgroup.
#[derive(Clone, Debug, PartialEq)]
pub struct Arming {
    /// The cgroup.
    pub path: String,
    /// Why it armed (`None`: it disarmed).
    pub armed: Option<ArmReason>,
    /// Working set / limit at the moment, percent (`None`: unknown, or
    /// the cgroup holds no process any more).
    pub percent: Option<f64>,
}

/// What one cgroup's window says about its risk now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Risk {
    /// Working set / limit, percent.
    pub percent: Option<f64>,
    /// Whether it is at risk now, and why.
    pub reason: Option<ArmReason>,
}

/// The gate.
#[derive(Debug)]
pub struct ArmGate {
    level: f64,
    named: BTreeSet<String>,
    /// Armed cgroups: path -> since when calm (None while at risk).
    armed: BTreeMap<String, Option<i64>>,
}

impl ArmGate {
    /// A gate at `level` percent of the limit, with the cgroups the user
    /// named armed for good.
    pub fn new(level: f64, named: impl IntoIterator<Item = String>) -> Self {
        Self {
            level,
            named: named.into_iter().collect(),
            armed: BTreeMap::new(),
        }
    }

    /// The arming level, percent.
    pub fn level(&self) -> f64 {
        self.level
    }

    /// Cgroups armed now.
    pub fn armed(&self) -> impl Iterator<Item = &str> {
        self.armed.keys().map(String::as_str)
    }

    /// The cgroups the user named.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.named.iter().map(String::as_str)
    }

    /// A named cgroup is armed while its directory exists (`exists`): a
    /// transition when that changes.
    pub fn named_exists(&mut self, path: &str, exists: bool) -> Option<Arming> {
        if !self.named.contains(path) || exists == self.armed.contains_key(path) {
            return None;
        }
        if exists {
            self.armed.insert(path.to_string(), None);
        } else {
            self.armed.remove(path);
        }
        Some(Arming {
            path: path.into(),
            armed: exists.then_some(ArmReason::Named),
            percent: None,
        })
    }

    /// What `window` (oldest first, the last sample the newest) says of
    /// its cgroup; `warned`: an early warning stands for it.
    pub fn risk(&self, window: &[CgroupSample], warned: bool) -> Risk {
        let Some(last) = window.last() else {
            return Risk::default();
        };
        let limit = last.limit_bytes.filter(|&l| l > 0);
        let percent = limit.map(|l| last.working_set() as f64 * 100.0 / l as f64);
        // The limit hit, or (v2) usage over memory.high, since the sample
        // before.
        let rose = |f: fn(&CgroupSample) -> Option<u64>| {
            window.len() >= 2
                && matches!((f(&window[window.len() - 2]), f(last)), (Some(a), Some(b)) if b > a)
        };
        let hit = rose(|s| s.failcnt);
        let high = rose(|s| s.high_events);
        // The fit of the window where it has enough samples, else the
        // step from the one before: a cgroup that just crossed the level
        // is not made to wait two more seconds of samples.
        let rate = super::warning::growth_rate(window).or_else(|| {
            let prev = &window[window.len().checked_sub(2)?];
            let dt = (last.ts_ns - prev.ts_ns) as f64 / 1e9;
            (dt > 0.0).then(|| (last.working_set() as f64 - prev.working_set() as f64) / dt)
        });
        let rising = match (percent, limit, rate) {
            (Some(p), Some(l), Some(rate)) => {
                p >= self.level && rate >= l as f64 * MIN_RISE_OF_LIMIT
            }
            _ => false,
        };
        let reason = if hit && limit.is_some() {
            Some(ArmReason::LimitHit)
        } else if high {
            Some(ArmReason::High)
        } else if rising {
            Some(ArmReason::Level)
        } else if warned {
            Some(ArmReason::Warning)
        } else {
            None
        };
        Risk { percent, reason }
    }

    /// Whether `path` is armed.
    pub fn is_armed(&self, path: &str) -> bool {
        self.armed.contains_key(path)
    }

    /// Whether `window`'s cgroup, not armed, is worth watching between
    /// samples: it rose since the sample before, and its working set is
    /// within [`WATCH_BELOW`] points under the level.
    pub fn worth_watching(&self, window: &[CgroupSample]) -> bool {
        let Some(last) = window.last() else {
            return false;
        };
        let Some(limit) = last.limit_bytes.filter(|&l| l > 0) else {
            return false;
        };
        let percent = last.working_set() as f64 * 100.0 / limit as f64;
        // A cgroup first seen near the level counts as rising.
        let rising = match window {
            [.., prev, _] => last.working_set() > prev.working_set(),
            _ => true,
        };
        rising && percent >= self.level - WATCH_BELOW
    }

    /// Arms `path` now: a watch between samples saw it over the level at
    /// `percent` (a transition, unless it was armed already).
    pub fn arm_now(&mut self, path: &str, percent: f64) -> Option<Arming> {
        if self.armed.contains_key(path) {
            return None;
        }
        self.armed.insert(path.to_string(), None);
        Some(Arming {
            path: path.into(),
            armed: Some(ArmReason::Level),
            percent: Some(percent),
        })
    }

    /// One cgroup's risk at `now_ns`: a transition when it arms or disarms.
    pub fn sample(&mut self, path: &str, risk: Risk, now_ns: i64) -> Option<Arming> {
        if self.named.contains(path) {
            return None;
        }
        match (self.armed.get_mut(path), risk.reason) {
            (None, Some(reason)) => {
                self.armed.insert(path.to_string(), None);
                Some(Arming {
                    path: path.into(),
                    armed: Some(reason),
                    percent: risk.percent,
                })
            }
            (None, None) => None,
            (Some(calm), reason) => {
                let under = risk.percent.is_none_or(|p| p < self.level - HYSTERESIS);
                if reason.is_some() || !under {
                    *calm = None;
                    return None;
                }
                let since = *calm.get_or_insert(now_ns);
                if now_ns - since < CALM_NS {
                    return None;
                }
                self.armed.remove(path);
                Some(Arming {
                    path: path.into(),
                    armed: None,
                    percent: risk.percent,
                })
            }
        }
    }

    /// The armed cgroups, not named, that `present` no longer has (no
    /// process left): they disarm.
    pub fn end_missing(&mut self, present: impl Fn(&str) -> bool) -> Vec<Arming> {
        let gone: Vec<String> = self
            .armed
            .keys()
            .filter(|p| !present(p) && !self.named.contains(*p))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|path| {
                self.armed.remove(&path);
                Arming {
                    path,
                    armed: None,
                    percent: None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const MIB: u64 = 1 << 20;

    fn at(t: i64, usage_mib: u64, failcnt: u64) -> CgroupSample {
        CgroupSample {
            ts_ns: t * S,
            usage_bytes: usage_mib * MIB,
            limit_bytes: Some(100 * MIB),
            failcnt: Some(failcnt),
            ..Default::default()
        }
    }

    /// The gate fed one sample a second from `usage` (MiB, one a second),
    /// with the window of the last ten: the transitions, with their second.
    fn run(gate: &mut ArmGate, usage: &[u64]) -> Vec<(i64, Option<ArmReason>)> {
        let samples: Vec<CgroupSample> = usage
            .iter()
            .enumerate()
            .map(|(i, &u)| at(i as i64, u, 0))
            .collect();
        let mut out = Vec::new();
        for i in 0..samples.len() {
            let window = &samples[i.saturating_sub(9)..=i];
            let risk = gate.risk(window, false);
            if let Some(t) = gate.sample("/a", risk, i as i64 * S) {
                out.push((i as i64, t.armed));
            }
        }
        out
    }

    #[test]
    fn a_cgroup_growing_past_the_level_arms_and_disarms_once_calm_under_it() {
        let mut g = ArmGate::new(60.0, []);
        // Flat at 70 %: a steady service over the level, never armed.
        assert_eq!(run(&mut g, &[70; 15]), []);
        let mut g = ArmGate::new(60.0, []);
        // 40 -> 76 MiB at 4 MiB/s, armed the second it is over 60 %; it
        // stays armed while it sits there, then drops to 30 % and is calm
        // ten seconds later.
        let mut usage: Vec<u64> = (0..10).map(|i| 40 + 4 * i).collect();
        usage.extend([76; 5]);
        usage.extend([30; 12]);
        let t = run(&mut g, &usage);
        assert_eq!(t, [(5, Some(ArmReason::Level)), (25, None)], "{usage:?}");
    }

    #[test]
    fn a_limit_hit_or_a_warning_arms_whatever_the_level() {
        let g = ArmGate::new(60.0, []);
        let window = [at(0, 20, 3), at(1, 20, 4)];
        let r = g.risk(&window, false);
        assert_eq!(r.reason, Some(ArmReason::LimitHit));
        assert!((r.percent.unwrap() - 20.0).abs() < 1e-9);
        let calm = [at(0, 20, 4), at(1, 20, 4)];
        assert_eq!(g.risk(&calm, false).reason, None);
        assert_eq!(g.risk(&calm, true).reason, Some(ArmReason::Warning));
        // Over memory.high (v2), with or without a limit.
        let high = |t, n| CgroupSample {
            ts_ns: t * S,
            high_events: Some(n),
            ..Default::default()
        };
        assert_eq!(
            g.risk(&[high(0, 2), high(1, 5)], false).reason,
            Some(ArmReason::High)
        );
        assert_eq!(g.risk(&[high(0, 5), high(1, 5)], false).reason, None);
        // No limit: no level and no hit.
        let free = [CgroupSample {
            usage_bytes: 1 << 40,
            ..Default::default()
        }];
        assert_eq!(g.risk(&free, false).reason, None);
        assert_eq!(g.risk(&[], true).reason, None);
    }

    #[test]
    fn a_rising_cgroup_near_the_level_is_watched_and_armed_between_samples() {
        let mut g = ArmGate::new(60.0, []);
        // Rising at 45 %, or first seen there: watched; flat or far
        // under: not.
        assert!(g.worth_watching(&[at(0, 40, 0), at(1, 45, 0)]));
        assert!(g.worth_watching(&[at(1, 45, 0)]));
        assert!(!g.worth_watching(&[at(0, 45, 0), at(1, 45, 0)]));
        assert!(!g.worth_watching(&[at(0, 10, 0), at(1, 20, 0)]));
        assert!(!g.worth_watching(&[]));
        // Just crossed, two samples: the step says it rises.
        let r = g.risk(&[at(0, 50, 0), at(1, 62, 0)], false);
        assert_eq!(r.reason, Some(ArmReason::Level));
        let t = g.arm_now("/a", 61.0).unwrap();
        assert_eq!(t.armed, Some(ArmReason::Level));
        assert!(g.is_armed("/a"));
        assert_eq!(g.arm_now("/a", 70.0), None);
    }

    #[test]
    fn named_cgroups_are_armed_while_their_directory_exists() {
        let mut g = ArmGate::new(60.0, ["/job".to_string()]);
        assert_eq!(g.named_exists("/other", true), None);
        let t = g.named_exists("/job", true).unwrap();
        assert_eq!(t.armed, Some(ArmReason::Named));
        assert_eq!(g.named_exists("/job", true), None);
        // Calm for a long time, or holding no process: still armed.
        for s in 0..30 {
            assert_eq!(g.sample("/job", Risk::default(), s * S), None);
        }
        assert!(g.end_missing(|_| false).is_empty());
        assert_eq!(g.armed().collect::<Vec<_>>(), ["/job"]);
        // Removed: disarmed; made again: armed again.
        assert_eq!(g.named_exists("/job", false).unwrap().armed, None);
        assert_eq!(g.armed().count(), 0);
        assert!(g.named_exists("/job", true).is_some());
    }
}
