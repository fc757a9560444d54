//! Growth attribution on risk (`--growth risk`): each tick, the memory
//! cgroups at risk are armed (their ids, and those of the cgroups below
//! them, in the programs' map) and the page-fault programs are attached
//! while at least one is; with none armed they are detached and a page
//! fault costs what it costs without tracer.

use std::collections::BTreeSet;

use super::Env;
use crate::{
    correlate::{
        arming::{ArmGate, Arming},
        warning,
    },
    model::cgroup::CgroupLayout,
    probes::growth::GrowthMaps,
    record::{EventRow, GrowthArmed, KillRecord},
    recorder::output::{Output, Outputs},
    util::term::escape,
};

/// Most cgroup ids found below one armed cgroup (the programs' map holds
/// [`tracer_common::growth::ARMED_ENTRIES`] in all).
const SUBTREE_IDS: usize = 1024;

/// A cgroup watched between samples: rising, near the level.
struct Watched {
    path: String,
    /// Its usage file (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    usage: std::path::PathBuf,
    limit: u64,
    /// Inactive file cache at the last sample (usage less it is the
    /// working set).
    inactive_file: u64,
}

/// The arming feature.
pub struct Armer {
    gate: ArmGate,
    watched: Vec<Watched>,
    /// Arming transitions so far (for the stop summary).
    pub arms: u64,
    /// When the hooks were last attached (wall ns), while they are.
    attached_since: Option<i64>,
    /// Nanoseconds the hooks have been attached, closed spells only.
    pub attached_ns: i64,
    /// The armed cgroups: since when, why, at what share of the limit.
    since: std::collections::BTreeMap<String, GrowthArmed>,
    /// Whether named cgroups missing at the first tick were said to be.
    told_missing: bool,
    /// Cgroups armed since [`Armer::take_armed`] was last called.
    armed_now: Vec<String>,
}

impl Armer {
    /// Arming at `level` percent of the limit, with `named` armed for good.
    pub fn new(level: f64, named: Vec<String>) -> Self {
        Self {
            gate: ArmGate::new(level, named),
            watched: Vec::new(),
            arms: 0,
            attached_since: None,
            attached_ns: 0,
            since: Default::default(),
            told_missing: false,
            armed_now: Vec::new(),
        }
    }

    /// The cgroups armed since the last call (for their pictures).
    pub fn take_armed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.armed_now)
    }

    /// Nanoseconds the hooks have been attached up to `now`.
    pub fn attached_total(&self, now: i64) -> i64 {
        self.attached_ns + self.attached_since.map_or(0, |s| now - s)
    }

    /// One tick: the cgroups in `paths` sampled, `warned` telling which
    /// stand warned; arms and disarms, then makes the programs' map and
    /// hooks match.
    pub fn tick(
        &mut self,
        env: &Env<'_>,
        maps: &mut GrowthMaps,
        warned: impl Fn(&str) -> bool,
        paths: &BTreeSet<String>,
        now: i64,
        out: &mut Outputs,
    ) {
        let mut changes = Vec::new();
        let since = now - warning::RATE_WINDOW_NS;
        let layout = env.model.layout();
        let named: Vec<String> = self.gate.named().map(String::from).collect();
        for path in named {
            let exists = layout.memcg_dir(&path).is_some_and(|d| d.is_dir());
            if !exists && !self.told_missing {
                tracing::warn!(
                    "growth: --growth-cgroup {} is not a memory cgroup here (yet); armed once it is",
                    escape(&path)
                );
            }
            changes.extend(self.gate.named_exists(&path, exists));
        }
        self.told_missing = true;
        self.watched.clear();
        for path in paths.iter().filter(|p| p.as_str() != "/") {
            // With a limit, or (v2) ever over memory.high: most cgroups
            // have neither, and nothing to fit.
            let limited = env
                .sampler
                .latest(path)
                .is_some_and(|s| s.limit_bytes.is_some() || s.high_events.is_some_and(|h| h > 0));
            let warned = warned(path);
            if !(limited || self.gate.is_armed(path) || warned) {
                continue;
            }
            let window = env.sampler.window(path, since);
            let risk = self.gate.risk(&window, warned);
            changes.extend(self.gate.sample(path, risk, now));
            if !self.gate.is_armed(path)
                && self.gate.worth_watching(&window)
                && let (Some(last), Some(dir)) = (window.last(), layout.memcg_dir(path))
            {
                let file = if layout.memory_is_v1() {
                    "memory.usage_in_bytes"
                } else {
                    "memory.current"
                };
                self.watched.push(Watched {
                    path: path.clone(),
                    usage: dir.join(file),
                    limit: last.limit_bytes.unwrap_or(u64::MAX),
                    inactive_file: last.inactive_file.unwrap_or(0),
                });
            }
        }
        // Gone: no process left in it (a named one stays).
        changes.extend(self.gate.end_missing(|p| paths.contains(p)));
        for c in &changes {
            self.say(c, "sample", now, out);
        }
        self.apply(layout, maps, now);
    }

    /// Whether some cgroup is watched between samples: [`Armer::watch`] is
    /// then due every [`WATCH_NS`](crate::correlate::arming::WATCH_NS).
    pub fn watching(&self) -> bool {
        !self.watched.is_empty()
    }

    /// Reads the watched cgroups' usage: one over the level arms now,
    /// without waiting for the next sample.
    pub fn watch(
        &mut self,
        layout: &CgroupLayout,
        maps: &mut GrowthMaps,
        now: i64,
        out: &mut Outputs,
    ) {
        let level = self.gate.level();
        let mut armed = Vec::new();
        self.watched.retain(|w| {
            let Some(usage) = std::fs::read_to_string(&w.usage)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            else {
                return false;
            };
            let percent = usage.saturating_sub(w.inactive_file) as f64 * 100.0 / w.limit as f64;
            if percent >= level {
                armed.push((w.path.clone(), percent));
                return false;
            }
            true
        });
        if armed.is_empty() {
            return;
        }
        for (path, percent) in armed {
            if let Some(c) = self.gate.arm_now(&path, percent) {
                self.say(&c, "watch", now, out);
            }
        }
        self.apply(layout, maps, now);
    }

    /// Makes the programs' map hold the armed cgroups and those below
    /// them, and the hooks attached while any is.
    fn apply(&mut self, layout: &CgroupLayout, maps: &mut GrowthMaps, now: i64) {
        let mut ids = BTreeSet::new();
        for path in self.gate.armed() {
            layout.memcg_ids_under(path, SUBTREE_IDS, |id| {
                ids.insert(id);
            });
        }
        match maps.armed.set(&ids) {
            Ok(true) => {
                if let Err(e) = maps.new_generation() {
                    tracing::warn!("growth: cannot renew the decisions: {e}");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("growth: cannot arm the programs' cgroups: {e}"),
        }
        let Some(hooks) = maps.hooks.as_mut() else {
            return;
        };
        match (maps.armed.is_empty(), hooks.is_attached()) {
            (false, false) => match hooks.attach() {
                Ok(()) => {
                    self.attached_since = Some(now);
                    tracing::info!(
                        "growth: page-fault sampling on ({} cgroup id(s) armed)",
                        maps.armed.len()
                    );
                }
                Err(e) => tracing::warn!("growth: cannot attach the page-fault programs: {e}"),
            },
            (true, true) => {
                hooks.detach();
                if let Some(s) = self.attached_since.take() {
                    self.attached_ns += now - s;
                }
                tracing::info!("growth: page-fault sampling off (no cgroup at risk)");
            }
            _ => {}
        }
    }

    /// Logs a transition and stores it as an event (`growth_armed`);
    /// `seen`: by a tick's samples, or by the watch between them.
    fn say(&mut self, c: &Arming, seen: &str, now: i64, out: &mut Outputs) {
        let at = c
            .percent
            .map(|p| format!(" at {p:.0}% of its limit"))
            .unwrap_or_default();
        match c.armed {
            Some(reason) => {
                self.arms += 1;
                self.armed_now.push(c.path.clone());
                self.since.insert(
                    c.path.clone(),
                    GrowthArmed {
                        memcg: c.path.clone(),
                        since_ns: now,
                        reason,
                        percent: c.percent,
                    },
                );
                tracing::info!("growth: {} armed{at}: {}", escape(&c.path), reason.says());
            }
            None => {
                self.since.remove(&c.path);
                tracing::info!("growth: {} disarmed{at}", escape(&c.path));
            }
        }
        out.push(Output::Event(EventRow {
            ts_ns: now,
            kind: crate::record::GROWTH_ARMED.into(),
            pid: 0,
            tid: 0,
            comm: String::new(),
            data: serde_json::json!({
                "memcg_path": c.path,
                "armed": c.armed.is_some(),
                "reason": c.armed,
                "percent": c.percent,
                "seen": seen,
            }),
        }));
    }
}

impl Armer {
    /// The nearest armed cgroup at or above `cgroup`.
    fn armed_over(&self, cgroup: &str) -> Option<&GrowthArmed> {
        self.since
            .values()
            .filter(|a| crate::model::cgroup::at_or_below(cgroup, &a.memcg))
            .max_by_key(|a| a.memcg.len())
    }

    /// Whether `cgroup`'s page faults are sampled now: it, or a cgroup
    /// above it, is armed.
    pub fn covers(&self, cgroup: &str) -> bool {
        self.armed_over(cgroup).is_some()
    }
}

/// A kill in an armed cgroup (or below one) says since when growth was
/// sampled there: what its `growth` covers.
impl crate::correlate::KillEnricher for Armer {
    fn enrich(&self, k: &mut KillRecord) {
        let Some(cg) = k.cgroup() else { return };
        k.growth_armed = self.armed_over(cg).cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{correlate::KillEnricher as _, record::ArmReason, recorder::features::kill_in};

    #[test]
    fn a_kill_in_or_below_an_armed_cgroup_says_since_when_and_no_other_does() {
        let mut a = Armer::new(60.0, Vec::new());
        let mut out = Vec::new();
        for (path, reason, at) in [
            ("/pod", ArmReason::Level, 5),
            ("/pod/ctr", ArmReason::LimitHit, 7),
        ] {
            let c = Arming {
                path: path.into(),
                armed: Some(reason),
                percent: Some(65.0),
            };
            a.say(&c, "sample", at, &mut out);
        }
        assert_eq!(out.len(), 2);
        // The nearest armed cgroup at or above the victim's.
        let mut k = kill_in("/pod/ctr/job", 0);
        a.enrich(&mut k);
        let got = k.growth_armed.expect("armed");
        assert_eq!((got.memcg.as_str(), got.since_ns), ("/pod/ctr", 7));
        assert_eq!(got.reason, ArmReason::LimitHit);
        let mut k = kill_in("/pod/other", 0);
        a.enrich(&mut k);
        assert_eq!(k.growth_armed.map(|g| g.memcg), Some("/pod".into()));
        // A sibling whose name starts the same is not below it.
        let mut k = kill_in("/podcast", 0);
        a.enrich(&mut k);
        assert!(k.growth_armed.is_none());
        assert!(a.covers("/pod/ctr/job") && a.covers("/pod") && !a.covers("/podcast"));
        // Disarmed: no longer said.
        let off = Arming {
            path: "/pod".into(),
            armed: None,
            percent: None,
        };
        a.say(&off, "sample", 9, &mut out);
        let mut k = kill_in("/pod/other", 0);
        a.enrich(&mut k);
        assert!(k.growth_armed.is_none());
        assert_eq!(a.arms, 2);
    }
}
