//! Slow leaks over hours (`correlate::leak`): a working-set point a step
//! for every memory cgroup sampled, 12 hours of them at most, judged at
//! each step. A cgroup found leaking is logged and stored as a
//! `memory_leak` event (again every ten steps while it leaks, for `top`,
//! and when it ends), published as `tracer_memory_leak_bytes_per_second`,
//! and a kill in it keeps the leak (`kill.leak`).
//!
//! A series is kept per cgroup, or per pod container where Kubernetes names
//! it: each restart of the container is another cgroup, and a new run of
//! the same series. A restart in place (the cgroup's oldest process gone)
//! starts a new run as well.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::Env;
use crate::{
    correlate::leak::{Judged, Point, Rule, judge},
    model::cgroup::at_or_below,
    record::{EventRow, KillRecord, Leak, MEMORY_LEAK},
    recorder::output::{Output, Outputs},
    util::term::escape,
};

/// Hours of points kept per series.
const KEEP_HOURS: f64 = 12.0;
/// Most points per series, whatever the step: 12 hours of minutes
/// (8.4 KiB per series).
const MAX_POINTS: usize = 720;
/// Most series (8.4 MiB of points at most): past it, new cgroups are not
/// watched, and the log says so once.
const MAX_SERIES: usize = 1024;
/// A series is said again every this many steps while it leaks.
const SAY_EVERY_STEPS: u32 = 10;
/// A leak is not said where a cgroup below it leaks at least this share
/// of its rate: it is that cgroup's leak.
const WITHIN_SHARE: f64 = 0.75;
/// A series with no sample for this long is dropped (its cgroup gone).
const GONE_NS: i64 = 10 * 60 * 1_000_000_000;

/// One cgroup's (or pod container's) series.
struct Series {
    /// Its cgroup now.
    path: String,
    /// Wall ns of t = 0.
    base_ns: i64,
    points: VecDeque<Point>,
    /// The current run.
    run: u32,
    /// Start (wall ns) of the oldest live process in it at the last point.
    oldest_ns: Option<i64>,
    /// The least working set of the step so far, and the limit.
    step_min: Option<(u64, Option<u64>)>,
    /// The last sample's working set.
    working_set: u64,
    /// When a sample was last taken.
    seen_ns: i64,
    /// The leak, while it leaks.
    leak: Option<Leak>,
    /// Why it does not, otherwise.
    why: &'static str,
    /// The leak last said to leak (None: said to end, or never said).
    said: Option<Leak>,
    /// Steps since it was last said.
    unsaid: u32,
}

impl Series {
    /// Takes in a sample of its cgroup, now at `path`.
    fn take(&mut self, path: &str, s: &crate::model::sampler::CgroupSample) {
        if self.path != path {
            // Another container of the same pod: a restart.
            self.path = path.to_string();
            self.run += 1;
            self.oldest_ns = None;
        }
        let ws = s.working_set();
        self.step_min = Some(match self.step_min {
            Some((m, _)) if m <= ws => (m, s.limit_bytes),
            _ => (ws, s.limit_bytes),
        });
        self.working_set = ws;
        self.seen_ns = s.ts_ns;
    }
}

/// The leak watch.
pub struct LeakWatch {
    rule: Rule,
    step_ns: i64,
    keep: usize,
    series: BTreeMap<String, Series>,
    /// Each cgroup's series key, made again every step.
    keys: std::collections::HashMap<String, String>,
    step_start_ns: Option<i64>,
    /// Leaks found so far (for the stop summary).
    pub found: u64,
    told_full: bool,
}

impl LeakWatch {
    /// A point every `step`; runs of at least `min_span` are judged.
    pub fn new(step: std::time::Duration, min_span: std::time::Duration) -> Self {
        let step_ns = step.as_nanos().max(1_000_000_000) as i64;
        let keep = ((KEEP_HOURS * 3.6e12) / step_ns as f64).ceil() as usize;
        Self {
            rule: Rule::new(min_span.as_secs_f64()),
            step_ns,
            keep: keep.clamp(16, MAX_POINTS),
            series: BTreeMap::new(),
            keys: Default::default(),
            step_start_ns: None,
            found: 0,
            told_full: false,
        }
    }

    /// Series watched now.
    pub fn watched(&self) -> usize {
        self.series.len()
    }

    /// One tick, after the sampler's: the samples of `paths` are taken in;
    /// at the end of a step each series gets its point and is judged.
    pub fn tick(&mut self, env: &Env<'_>, paths: &BTreeSet<String>, now: i64, out: &mut Outputs) {
        let start = *self.step_start_ns.get_or_insert(now);
        let due = now - start >= self.step_ns;
        if due {
            // Names come later than cgroups: keys are made again each step.
            self.keys.clear();
        }
        for path in paths.iter().filter(|p| p.as_str() != "/") {
            // A cgroup's series, looked up once a step.
            if !self.keys.contains_key(path.as_str()) {
                let key = match env.model.owner_of(path).kube {
                    Some(k) if k.container.is_some() => format!(
                        "pod {}/{}/{}",
                        k.namespace,
                        k.pod,
                        k.container.unwrap_or_default()
                    ),
                    _ => path.clone(),
                };
                self.keys.insert(path.clone(), key);
            }
            let key = &self.keys[path.as_str()];
            let Some(s) = env
                .sampler
                .latest(path)
                .filter(|s| s.ts_ns >= now - 5_000_000_000)
            else {
                continue;
            };
            if let Some(e) = self.series.get_mut(key.as_str()) {
                // Another container of the pod while the one followed still
                // runs (a restart overlapping its end): the old one is
                // followed until it is gone.
                let old_runs = *path != e.path
                    && env
                        .sampler
                        .latest(&e.path)
                        .is_some_and(|o| o.ts_ns >= now - 5_000_000_000);
                if !old_runs {
                    e.take(path, s);
                }
                continue;
            }
            if self.series.len() >= MAX_SERIES {
                if !self.told_full {
                    tracing::warn!(
                        "leaks: {MAX_SERIES} memory cgroups watched; more are not watched for slow leaks"
                    );
                    self.told_full = true;
                }
                continue;
            }
            let mut e = Series {
                path: path.clone(),
                base_ns: now,
                points: VecDeque::new(),
                run: 0,
                oldest_ns: None,
                step_min: None,
                working_set: 0,
                seen_ns: now,
                leak: None,
                why: "",
                said: None,
                unsaid: 0,
            };
            e.take(path, s);
            self.series.insert(key.clone(), e);
        }
        if !due {
            return;
        }
        self.step_start_ns = Some(now);
        self.step(env, now, out);
    }

    /// The end of a step: a point for each series sampled in it, judged.
    fn step(&mut self, env: &Env<'_>, now: i64, out: &mut Outputs) {
        let mut gone = Vec::new();
        for (key, e) in &mut self.series {
            let Some((ws, limit)) = e.step_min.take() else {
                if now - e.seen_ns > GONE_NS {
                    gone.push(key.clone());
                }
                continue;
            };
            // A restart in place: its oldest process is gone, and a later
            // one is the oldest now.
            let oldest = env
                .model
                .in_memcg(&e.path, now)
                .filter(|p| p.exited_ns.is_none())
                .filter_map(|p| p.started_ns)
                .min();
            if let (Some(was), Some(is)) = (e.oldest_ns, oldest)
                && is > was
            {
                e.run += 1;
            }
            e.oldest_ns = oldest.or(e.oldest_ns);
            e.points.push_back(Point {
                t_s: ((now - e.base_ns) / 1_000_000_000).max(0) as u32,
                kib: (ws / 1024).min(u64::from(u32::MAX)) as u32,
                run: e.run,
            });
            while e.points.len() > self.keep {
                e.points.pop_front();
            }
            let judged = judge(
                e.points.make_contiguous(),
                limit,
                &self.rule,
                e.leak.is_some(),
            );
            e.leak = match judged {
                Judged::Leak(f) => {
                    let rate = f.bytes_per_second;
                    Some(Leak {
                        memcg: e.path.clone(),
                        bytes_per_second: rate,
                        percent_per_hour: limit.map(|l| rate * 3600.0 * 100.0 / l as f64),
                        since_ns: e.base_ns + i64::from(f.since_s) * 1_000_000_000,
                        fit_span_s: f.fit_span_s,
                        working_set: e.working_set,
                        limit,
                        limit_in_s: limit.map(|l| l.saturating_sub(e.working_set) as f64 / rate),
                    })
                }
                Judged::No(why) => {
                    e.why = why;
                    None
                }
            };
        }
        // Then what is said: a leak, unless a leaking cgroup below it
        // grows at least WITHIN_SHARE as fast (the parent of a leaking
        // container leaks too, and is not news).
        let leaking: Vec<(String, f64)> = self
            .series
            .values()
            .filter_map(|e| Some((e.path.clone(), e.leak.as_ref()?.bytes_per_second)))
            .collect();
        for e in self.series.values_mut() {
            let within = e.leak.as_ref().and_then(|l| {
                leaking
                    .iter()
                    .find(|(p, r)| {
                        *p != l.memcg
                            && at_or_below(p, &l.memcg)
                            && *r >= l.bytes_per_second * WITHIN_SHARE
                    })
                    .map(|(p, _)| p.clone())
            });
            match (&e.leak, within) {
                (Some(l), None) => {
                    e.unsaid += 1;
                    if e.said.is_none() {
                        self.found += 1;
                        tracing::info!("leaks: {}", says(l));
                    }
                    if e.said.is_none() || e.unsaid >= SAY_EVERY_STEPS {
                        out.push(event(now, l, true, None));
                        e.unsaid = 0;
                    }
                    e.said = Some(l.clone());
                }
                (_, within) => {
                    if let Some(was) = e.said.take() {
                        let why =
                            within.map_or_else(|| e.why.to_string(), |p| format!("within {p}"));
                        tracing::info!(
                            "leaks: {} no longer leaks ({})",
                            escape(&was.memcg),
                            escape(&why)
                        );
                        out.push(event(now, &was, false, Some(&why)));
                    }
                }
            }
        }
        for key in gone {
            if let Some(leak) = self.series.remove(&key).and_then(|e| e.said) {
                out.push(event(now, &leak, false, Some("gone")));
            }
        }
    }

    /// The series of `cgroup`, or of the nearest cgroup above it that
    /// leaks.
    fn leak_over(&self, cgroup: &str) -> Option<&Leak> {
        self.series
            .values()
            .filter_map(|e| e.leak.as_ref())
            .filter(|l| at_or_below(cgroup, &l.memcg))
            .max_by_key(|l| l.memcg.len())
    }

    /// For the metric: `cgroup`'s leak rate, bytes a second (0 while it
    /// does not leak; None: not watched). `cgroup` is one of the last
    /// tick's paths (its key was made then).
    pub fn rate_of(&self, cgroup: &str) -> Option<f64> {
        let e = self.series.get(self.keys.get(cgroup)?)?;
        (e.path == cgroup).then(|| e.leak.as_ref().map_or(0.0, |l| l.bytes_per_second))
    }
}

/// A leak in words: "/x leaking 7.1 %/h of its limit (12.0 MiB/h), limit
/// in ~9 h".
pub fn says(l: &Leak) -> String {
    format!(
        "{} leaking {}{}",
        escape(&l.memcg),
        l.rate_words(),
        l.eta_words()
    )
}

fn event(now: i64, l: &Leak, leaking: bool, why: Option<&str>) -> Output {
    let mut data = serde_json::to_value(l).unwrap_or_default();
    data["memcg_path"] = l.memcg.clone().into();
    data["leaking"] = leaking.into();
    if let Some(w) = why {
        data["ended"] = w.into();
    }
    Output::Event(EventRow {
        ts_ns: now,
        kind: MEMORY_LEAK.into(),
        pid: 0,
        tid: 0,
        comm: String::new(),
        data,
    })
}

/// A kill in a leaking cgroup (or below one) keeps the leak.
impl crate::correlate::KillEnricher for LeakWatch {
    fn enrich(&self, k: &mut KillRecord) {
        let Some(cg) = k.cgroup() else { return };
        k.leak = self.leak_over(cg).cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::{KillEnricher as _, fixtures::World},
        model::sampler::CgroupSample,
        recorder::features::{kill_in, test_env},
    };

    const S: i64 = 1_000_000_000;

    fn sample(ts_ns: i64, ws: u64) -> CgroupSample {
        CgroupSample {
            ts_ns,
            usage_bytes: ws,
            limit_bytes: Some(256 << 20),
            ..Default::default()
        }
    }

    #[test]
    fn a_cgroup_growing_steadily_is_found_said_and_kept_by_its_kill() {
        let mut w = World::default();
        let mut lw = LeakWatch::new(
            std::time::Duration::from_secs(5),
            std::time::Duration::from_secs(60),
        );
        // A container and its pod's cgroup, which grows with it.
        let paths: BTreeSet<String> = ["/pod".into(), "/pod/ctr".into(), "/flat".into()].into();
        let mut out = Vec::new();
        let t0 = 1_000 * S;
        // 0.2 MiB/s for 3 minutes, a sample a second; the other flat.
        for i in 0..180 {
            let now = t0 + i * S;
            let ws = (50 << 20) + (i as u64) * (200 << 10);
            w.sampler.push("/pod/ctr", sample(now, ws));
            w.sampler.push("/pod", sample(now, ws + (1 << 20)));
            w.sampler.push("/flat", sample(now, 80 << 20));
            lw.tick(&test_env(&mut w), &paths, now, &mut out);
        }
        let said: Vec<&EventRow> = out
            .iter()
            .filter_map(|o| match o {
                Output::Event(e) if e.kind == MEMORY_LEAK => Some(e),
                _ => None,
            })
            .collect();
        assert!(!said.is_empty());
        // The container's leak, not also its pod's.
        assert!(said.iter().all(|e| e.data["memcg_path"] == "/pod/ctr"));
        let first = &said[0];
        assert_eq!(first.data["leaking"], true);
        // Found once its run spans a minute (and 8 points).
        assert!(first.ts_ns <= t0 + 70 * S, "{}", first.ts_ns - t0);
        let rate = lw.rate_of("/pod/ctr").unwrap();
        assert!(
            (rate / f64::from(200 << 10) - 1.0).abs() < 0.05,
            "{rate} B/s"
        );
        assert_eq!(lw.rate_of("/flat"), Some(0.0));
        assert_eq!(lw.rate_of("/other"), None);
        assert_eq!(lw.found, 1);
        // A kill below it keeps the leak; one elsewhere does not.
        let mut k = kill_in("/pod/ctr/job", 0);
        lw.enrich(&mut k);
        let l = k.leak.expect("kept");
        // Since its first point, at the end of the first step.
        assert_eq!((l.memcg.as_str(), l.since_ns), ("/pod/ctr", t0 + 5 * S));
        assert!(says(&l).contains("%/h of its limit"), "{}", says(&l));
        let mut k = kill_in("/flat", 0);
        lw.enrich(&mut k);
        assert!(k.leak.is_none());
        // A kill in another container of the pod keeps the pod's leak.
        let mut k = kill_in("/pod/other", 0);
        lw.enrich(&mut k);
        assert_eq!(k.leak.map(|l| l.memcg), Some("/pod".into()));
        // It drops (a restart): no longer a leak, and said so.
        for i in 180..200 {
            let now = t0 + i * S;
            w.sampler.push("/pod/ctr", sample(now, 20 << 20));
            w.sampler.push("/pod", sample(now, 21 << 20));
            lw.tick(&test_env(&mut w), &paths, now, &mut out);
        }
        assert_eq!(lw.rate_of("/pod/ctr"), Some(0.0));
        let last = out
            .iter()
            .rev()
            .find_map(|o| match o {
                Output::Event(e) if e.kind == MEMORY_LEAK => Some(e),
                _ => None,
            })
            .unwrap();
        assert_eq!(last.data["leaking"], false);
        assert_eq!(last.data["ended"], "restarted");
    }
}
