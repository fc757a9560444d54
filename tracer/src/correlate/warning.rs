//! Early warning: a memory cgroup that, at its growth rate over the last
//! seconds, reaches its limit within a threshold (or whose tasks stall on
//! memory: PSI `some avg10` over a threshold, cgroup v2) is warned about
//! once, and said to have recovered once that has not held for a while.
//! Pure: sample windows come in, events go out.

use std::collections::HashMap;

use crate::{
    model::sampler::CgroupSample,
    record::{PressureEvent, WarningReason, WarningState},
};

/// Whether warning `w` is about the limit the kernel's `report` says was
/// hit: a memcg OOM of that very cgroup (a warning about another cgroup's
/// limit, or a node-wide OOM, is not this kill's).
pub fn applies(w: &PressureEvent, report: &crate::collect::kmsg::OomReport) -> bool {
    report.constraint() == "CONSTRAINT_MEMCG" && report.oom_memcg().is_none_or(|m| m == w.memcg)
}

/// The growth rate is fitted over this much of the latest samples.
pub const RATE_WINDOW_NS: i64 = 10_000_000_000;
/// A warning ends once its condition (loosened by half) has not held for this long.
pub const CALM_NS: i64 = 10_000_000_000;

/// Working-set growth over `samples` (usage less inactive file cache,
/// which reclaim takes first), bytes per second: the least-squares slope
/// (None: fewer than three samples, or under two seconds of them).
pub fn growth_rate(samples: &[CgroupSample]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    if samples.len() < 3 || last.ts_ns - first.ts_ns < 2_000_000_000 {
        return None;
    }
    let n = samples.len() as f64;
    let t = |s: &CgroupSample| (s.ts_ns - first.ts_ns) as f64 / 1e9;
    let (mt, mu) = samples.iter().fold((0.0, 0.0), |(a, b), s| {
        (a + t(s) / n, b + s.working_set() as f64 / n)
    });
    let (mut num, mut den) = (0.0, 0.0);
    for s in samples {
        num += (t(s) - mt) * (s.working_set() as f64 - mu);
        den += (t(s) - mt).powi(2);
    }
    (den > 0.0).then(|| num / den)
}

/// Growth under this share of the limit per second is noise, not a trend.
const MIN_RATE_OF_LIMIT: f64 = 0.002;
/// Samples needed before a warning (about four seconds of them).
const MIN_SAMPLES: usize = 5;

/// What one window says: the growth rate, the seconds to the limit at
/// that rate (when it is a trend), and PSI.
struct Reading {
    rate: Option<f64>,
    projected: Option<f64>,
    psi: Option<f64>,
}

impl Reading {
    fn of(samples: &[CgroupSample]) -> Option<(Self, &CgroupSample)> {
        let last = samples.last()?;
        let rate = growth_rate(samples);
        let projected = match (rate, last.limit_bytes) {
            (Some(r), Some(l))
                if samples.len() >= MIN_SAMPLES && r > 0.0 && r >= l as f64 * MIN_RATE_OF_LIMIT =>
            {
                Some(l.saturating_sub(last.working_set()) as f64 / r)
            }
            _ => None,
        };
        Some((
            Self {
                rate,
                projected,
                psi: last.psi_some_avg10,
            },
            last,
        ))
    }

    /// Why it is warned at `before_s` and `psi_pct` (scaled by `factor`).
    fn reason(&self, before_s: f64, psi_pct: Option<f64>, factor: f64) -> Option<WarningReason> {
        if before_s > 0.0 && self.projected.is_some_and(|p| p <= before_s * factor) {
            return Some(WarningReason::Growth);
        }
        match (self.psi, psi_pct) {
            (Some(v), Some(t)) if v >= t / factor => Some(WarningReason::Psi),
            _ => None,
        }
    }
}

/// The warnings standing, per memory cgroup.
#[derive(Debug)]
pub struct WarnGate {
    before_s: f64,
    psi_pct: Option<f64>,
    /// Warned cgroups: their warning, and since when its condition has
    /// not held (None while it holds).
    active: HashMap<String, (PressureEvent, Option<i64>)>,
}

impl WarnGate {
    /// Warns `before_s` seconds ahead of a limit at the current rate, and
    /// at `psi_pct` of PSI `some avg10` when given.
    pub fn new(before_s: f64, psi_pct: Option<f64>) -> Self {
        Self {
            before_s,
            psi_pct,
            active: HashMap::new(),
        }
    }

    /// The latest samples of `path` (the last [`RATE_WINDOW_NS`] of them,
    /// oldest first) at `now_ns`: a warning when one begins, a recovery
    /// when one ends.
    pub fn sample(
        &mut self,
        path: &str,
        samples: &[CgroupSample],
        now_ns: i64,
    ) -> Option<PressureEvent> {
        let (r, last) = Reading::of(samples)?;
        let event = |state, reason| PressureEvent {
            ts_ns: now_ns,
            memcg: path.to_string(),
            state,
            reason,
            usage_bytes: last.usage_bytes,
            limit_bytes: last.limit_bytes,
            rate_bytes_per_s: r.rate,
            projected_s: r.projected,
            psi_some_avg10: r.psi,
            owner: None,
        };
        match self.active.get_mut(path) {
            None => {
                let reason = r.reason(self.before_s, self.psi_pct, 1.0)?;
                let ev = event(WarningState::Warning, reason);
                self.active.insert(path.to_string(), (ev.clone(), None));
                Some(ev)
            }
            Some((warned, calm)) => {
                if r.reason(self.before_s, self.psi_pct, 2.0).is_some() {
                    *calm = None;
                    return None;
                }
                let since = *calm.get_or_insert(now_ns);
                if now_ns - since < CALM_NS {
                    return None;
                }
                let reason = warned.reason;
                self.active.remove(path);
                Some(event(WarningState::Recovered, reason))
            }
        }
    }

    /// Whether PSI is watched (`--warn-psi`).
    pub fn watches_psi(&self) -> bool {
        self.psi_pct.is_some()
    }

    /// Whether `path` is warned about now.
    pub fn is_warned(&self, path: &str) -> bool {
        self.active.contains_key(path)
    }

    /// Ends the warnings of cgroups `keep` no longer has (gone, or no
    /// process left in them), at `now_ns`.
    pub fn end_missing(&mut self, keep: impl Fn(&str) -> bool, now_ns: i64) -> Vec<PressureEvent> {
        let gone: Vec<String> = self.active.keys().filter(|p| !keep(p)).cloned().collect();
        gone.into_iter()
            .filter_map(|p| self.active.remove(&p))
            .map(|(w, _)| PressureEvent {
                ts_ns: now_ns,
                state: WarningState::Recovered,
                ..w
            })
            .collect()
    }

    /// The warning standing for `memcg` or the nearest cgroup above it
    /// (the limit may be a parent's).
    pub fn standing(&self, memcg: &str) -> Option<&PressureEvent> {
        self.active
            .iter()
            .filter(|(p, _)| crate::model::cgroup::at_or_below(memcg, p))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, (w, _))| w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Samples one a second from `t0_s`, usage `start + rate * t`.
    fn ramp(t0_s: i64, n: i64, start: u64, rate: u64, limit: u64) -> Vec<CgroupSample> {
        (0..n)
            .map(|i| CgroupSample {
                ts_ns: (t0_s + i) * 1_000_000_000,
                usage_bytes: start + rate * i as u64,
                limit_bytes: Some(limit),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn the_rate_is_the_least_squares_slope() {
        let s = ramp(0, 10, 100 * MIB, 2 * MIB, 1 << 30);
        let r = growth_rate(&s).unwrap();
        assert!((r - 2.0 * MIB as f64).abs() < 1.0, "{r}");
        // Noise around a steady rate averages out.
        let mut noisy = s.clone();
        for (i, x) in noisy.iter_mut().enumerate() {
            if i % 2 == 0 {
                x.usage_bytes += MIB / 2;
            } else {
                x.usage_bytes -= MIB / 2;
            }
        }
        let r = growth_rate(&noisy).unwrap();
        assert!((r / (2.0 * MIB as f64) - 1.0).abs() < 0.2, "{r}");
        assert_eq!(growth_rate(&s[..2]), None, "two samples say nothing");
    }

    #[test]
    fn a_steady_grower_is_warned_once_ahead_of_its_limit_then_recovers() {
        let limit = 200 * MIB;
        let mut g = WarnGate::new(10.0, None);
        // 10 MiB/s from 50 MiB: 15 s to the limit; not yet within 10 s.
        let s = ramp(0, 5, 50 * MIB, 10 * MIB, limit);
        assert_eq!(g.sample("/job", &s, 4_000_000_000), None);
        // At t=9 s it is 110 MiB: 9 s left.
        let s = ramp(0, 10, 50 * MIB, 10 * MIB, limit);
        let w = g.sample("/job", &s, 9_000_000_000).expect("a warning");
        assert_eq!(
            (w.state, w.reason),
            (WarningState::Warning, WarningReason::Growth)
        );
        let p = w.projected_s.unwrap();
        assert!((p - 6.0).abs() < 0.01, "(200 - 140 MiB) / 10 MiB/s: {p}");
        assert_eq!(
            g.standing("/job/worker").map(|w| w.ts_ns),
            Some(9_000_000_000)
        );
        assert_eq!(g.standing("/jobs"), None);
        // Still growing: no second warning.
        let s = ramp(1, 10, 60 * MIB, 10 * MIB, limit);
        assert_eq!(g.sample("/job", &s, 10_000_000_000), None);
        // Killed: usage falls and stays flat; recovered after the calm.
        let flat = |t0| ramp(t0, 10, 10 * MIB, 0, limit);
        assert_eq!(g.sample("/job", &flat(20), 30_000_000_000), None);
        let r = g
            .sample("/job", &flat(30), 40_000_000_000)
            .expect("recovered");
        assert_eq!(r.state, WarningState::Recovered);
        assert_eq!(g.standing("/job"), None);
    }

    #[test]
    fn unlimited_shrinking_or_slow_cgroups_are_not_warned() {
        let mut g = WarnGate::new(60.0, None);
        let mut s = ramp(0, 10, 50 * MIB, 10 * MIB, 0);
        for x in &mut s {
            x.limit_bytes = None;
        }
        assert_eq!(g.sample("/nolimit", &s, 9_000_000_000), None);
        let shrinking: Vec<_> = ramp(0, 10, 150 * MIB, 0, 200 * MIB)
            .into_iter()
            .enumerate()
            .map(|(i, mut x)| {
                x.usage_bytes -= i as u64 * MIB;
                x
            })
            .collect();
        assert_eq!(g.sample("/shrink", &shrinking, 9_000_000_000), None);
        // 1 MiB/s with 1 GiB left: 17 minutes away.
        let slow = ramp(0, 10, 10 * MIB, MIB, 1 << 30);
        assert_eq!(g.sample("/slow", &slow, 9_000_000_000), None);
    }

    #[test]
    fn page_cache_at_the_limit_and_noise_are_not_warned() {
        let mut g = WarnGate::new(60.0, None);
        // 199 MiB of 200 MiB in use, 150 MiB of it inactive file cache,
        // jittering by a few KiB: nothing to warn about.
        let s: Vec<_> = ramp(0, 10, 199 * MIB, 0, 200 * MIB)
            .into_iter()
            .enumerate()
            .map(|(i, mut x)| {
                x.usage_bytes += (i as u64 % 3) * 4096;
                x.inactive_file = Some(150 * MIB);
                x
            })
            .collect();
        assert_eq!(g.sample("/cache", &s, 9_000_000_000), None);
        // Three samples are too few to call a trend.
        let short = ramp(0, 3, 150 * MIB, 10 * MIB, 200 * MIB);
        assert_eq!(g.sample("/new", &short, 2_000_000_000), None);
    }

    #[test]
    fn psi_warns_when_asked_and_a_gone_cgroup_recovers() {
        let mut g = WarnGate::new(60.0, Some(20.0));
        let mut s = ramp(0, 5, 10 * MIB, 0, 1 << 30);
        s.last_mut().unwrap().psi_some_avg10 = Some(35.0);
        let w = g
            .sample("/stalled", &s, 5_000_000_000)
            .expect("psi warning");
        assert_eq!(w.reason, WarningReason::Psi);
        let ended = g.end_missing(|_| false, 6_000_000_000);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].state, WarningState::Recovered);
        assert_eq!(ended[0].ts_ns, 6_000_000_000);
    }
}
