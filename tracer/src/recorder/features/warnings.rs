//! Memory cgroups at risk: early warnings (a cgroup about to reach its
//! limit, or stalling on memory) and heap tracing turned on for cgroups
//! under pressure, off once calm.

use std::collections::BTreeSet;

use super::Env;
use crate::{
    correlate::{
        KillEnricher,
        pressure::PressureGate,
        warning::{self, WarnGate},
    },
    probes::{uprobe::HEAP, watch::LibraryWatcher},
    record::EventRow,
    record::{KillRecord, WarningReason, WarningState},
    recorder::output::{Output, Outputs},
    util::{term::escape, units::bytes},
};

/// The warnings feature.
#[derive(Default)]
pub struct Warnings {
    /// Early warnings: memory cgroups about to reach their limit.
    warn: Option<WarnGate>,
    /// Heap sampling for memory cgroups under pressure.
    pressure: Option<PressureGate>,
}

impl Warnings {
    /// Whether heap tracing on pressure holds `path` traced now.
    pub fn heap_traced(&self, path: &str) -> bool {
        self.pressure
            .as_ref()
            .is_some_and(|g| g.active().any(|p| p == path))
    }

    /// Warnings from `warn`, heap tracing on pressure from `pressure`.
    pub fn new(warn: Option<WarnGate>, pressure: Option<PressureGate>) -> Self {
        Self { warn, pressure }
    }

    /// Whether an early warning stands for `path`.
    pub fn is_warned(&self, path: &str) -> bool {
        self.warn.as_ref().is_some_and(|g| g.is_warned(path))
    }

    /// Warns about the sampled memory cgroups `paths` about to reach their
    /// limit (and says when they no longer are).
    pub fn early(&mut self, env: &Env<'_>, paths: &BTreeSet<String>, now: i64, out: &mut Outputs) {
        let Some(gate) = &mut self.warn else {
            return;
        };
        let since = now - warning::RATE_WINDOW_NS;
        let mut events = Vec::new();
        for path in paths.iter().filter(|p| p.as_str() != "/") {
            // Most cgroups have no limit and no PSI: nothing to fit.
            let worth = env.sampler.latest(path).is_some_and(|s| {
                s.limit_bytes.is_some() || (gate.watches_psi() && s.psi_some_avg10.is_some())
            });
            if worth || gate.is_warned(path) {
                let window = env.sampler.window(path, since);
                events.extend(gate.sample(path, &window, now));
            }
        }
        events.extend(gate.end_missing(|p| paths.contains(p), now));
        for mut ev in events {
            let owner = env.model.owner_of(&ev.memcg);
            ev.owner = (!owner.is_empty()).then_some(owner);
            let what = match (ev.state, ev.projected_s, ev.psi_some_avg10) {
                (WarningState::Recovered, ..) => "no longer near its limit".to_string(),
                (_, Some(p), _) if ev.reason == WarningReason::Growth => format!(
                    "reaches its limit in {p:.0} s at {}/s",
                    bytes(ev.rate_bytes_per_s.unwrap_or(0.0) as u64)
                ),
                (_, _, psi) => format!(
                    "stalls on memory (PSI some avg10 {:.0}%)",
                    psi.unwrap_or(0.0)
                ),
            };
            match ev.state {
                WarningState::Warning => {
                    tracing::warn!("pressure: {} {what}", escape(&ev.memcg))
                }
                WarningState::Recovered => {
                    tracing::info!("pressure: {} {what}", escape(&ev.memcg))
                }
            }
            out.push(Output::Pressure(ev));
        }
    }

    /// Memory cgroups that reach the pressure threshold get their heap
    /// traced through `watcher`, and lose it once calm; both moments are
    /// stored as events (`heap_pressure`). `since` is how old a sample may
    /// be.
    pub fn heap_on_pressure(
        &mut self,
        env: &Env<'_>,
        watcher: Option<&LibraryWatcher>,
        paths: &BTreeSet<String>,
        (since, now): (i64, i64),
        out: &mut Outputs,
    ) {
        let (Some(gate), Some(watcher)) = (&mut self.pressure, watcher) else {
            return;
        };
        let mut changes = Vec::new();
        for path in paths {
            if path == "/" {
                continue;
            }
            if let Some(s) = env.sampler.latest(path).filter(|s| s.ts_ns >= since) {
                changes.extend(gate.sample(path, s.usage_bytes, s.limit_bytes, now));
            }
        }
        changes.extend(gate.end_missing(|p| paths.contains(p)));
        for t in changes {
            if !watcher.watch_cgroup(&HEAP, &t.path, t.on) {
                tracing::warn!(
                    "heap on pressure: the library watcher is busy; {} not {} (tried again)",
                    escape(&t.path),
                    if t.on { "traced" } else { "released" }
                );
                gate.undo(&t);
                continue;
            }
            let at = match t.percent {
                Some(p) => format!("at {p:.0}% of its limit"),
                None => "holds no process any more".into(),
            };
            tracing::info!(
                "heap on pressure: {} {at}: heap tracing {}",
                escape(&t.path),
                if t.on { "on" } else { "off" }
            );
            out.push(Output::Event(EventRow {
                ts_ns: now,
                kind: crate::record::HEAP_PRESSURE.into(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                data: serde_json::json!({ "memcg_path": t.path, "on": t.on, "percent": t.percent }),
            }));
        }
    }
}

/// A kill in a cgroup that stands warned gets the warning, when it applies
/// to the kernel's report of the kill.
impl KillEnricher for Warnings {
    fn enrich(&self, k: &mut KillRecord) {
        let Some(gate) = &self.warn else { return };
        if let Some(w) = k.cgroup().and_then(|m| gate.standing(m))
            && k.kmsg.as_ref().is_none_or(|r| warning::applies(w, r))
        {
            k.warning = Some(w.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{
        correlate::fixtures::{CLOCK, Gone},
        model::{ProcessTable, cgroup::CgroupLayout, sampler::Sampler},
        record::PressureEvent,
        recorder::features::kill_in,
    };

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_cgroup_growing_toward_its_limit_is_warned_once_and_its_kill_carries_it() {
        // A v1 memory cgroup as the kernel shows it, in files the test
        // writes: 300 MiB growing 80 MiB/s toward a 1 GiB limit, sampled
        // each second (a warning needs five samples).
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("job");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("memory.limit_in_bytes"), (1024 * MIB).to_string()).unwrap();
        let layout = CgroupLayout {
            memory_v1: Some(root.path().into()),
            ..Default::default()
        };
        let mut sampler = Sampler::new(layout.clone(), 60_000_000_000, Vec::new());
        let mut model = ProcessTable::new(layout, 0, 16);
        let mut w = Warnings::new(Some(WarnGate::new(60.0, None)), None);
        let paths = BTreeSet::from(["/job".to_string()]);
        let mut events: Vec<PressureEvent> = Vec::new();
        for i in 0..8u64 {
            let now = (i * 1_000_000_000) as i64;
            std::fs::write(
                cg.join("memory.usage_in_bytes"),
                ((300 + 80 * i) * MIB).to_string(),
            )
            .unwrap();
            sampler.sample(["/job"], &HashMap::new(), now);
            let env = Env {
                clock: &CLOCK,
                model: &mut model,
                sampler: &sampler,
                session_id: 1,
                procs: &Gone,
            };
            let mut out = Vec::new();
            w.early(&env, &paths, now, &mut out);
            events.extend(out.into_iter().filter_map(|o| match o {
                Output::Pressure(e) => Some(e),
                _ => None,
            }));
        }
        assert_eq!(events.len(), 1, "warned once: {events:?}");
        assert_eq!(events[0].state, WarningState::Warning);
        assert_eq!(events[0].memcg, "/job");
        assert!(
            events[0].projected_s.is_some_and(|p| p < 10.0),
            "{events:?}"
        );
        let mut kill = kill_in("/job", 0);
        w.enrich(&mut kill);
        assert_eq!(
            kill.warning.as_ref().map(|w| w.memcg.as_str()),
            Some("/job")
        );
        let mut elsewhere = KillRecord::default();
        w.enrich(&mut elsewhere);
        assert!(elsewhere.warning.is_none());
    }
}
