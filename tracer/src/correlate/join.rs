//! The join of a kill's tracepoint event with the kernel's OOM report of
//! the same kill. They arrive in either order, through different readers:
//! a report may come before its tracepoint event, after it, never (the
//! event was the only trace), or be a kill's from before the recorder
//! started. Pure: times come in as arguments, nothing is read or written.

use crate::{
    collect::kmsg::OomReport,
    record::{KillRecord, KillerKind, MemcgSource},
    util::time::Clock,
};

/// Tracepoint and kernel-log times of one kill are this close (both are
/// stamped within microseconds of each other; the rest is clock
/// conversion). A pid reused and killed again is further apart than this.
pub const JOIN_WINDOW_NS: i64 = 2_000_000_000;

/// How long a kernel report waits for its tracepoint event.
pub const UNMATCHED_NS: i64 = 2_000_000_000;

/// Whether a kernel report is about the kill in `rec`: the same pid, at
/// the same moment, and (where the kernel said so at the kill) in the same
/// memory cgroup, so a pid reused and killed again never takes another
/// kill's report. `started_ns`: when the probes started to be attached.
pub fn joins(rec: &KillRecord, report: &OomReport, clock: &Clock, started_ns: i64) -> bool {
    // Only the kernel's own view of the cgroup at the kill can veto a join
    // (the model's may be stale: that is what the report corrects).
    let same_cgroup = match (
        rec.victim.memcg.as_deref(),
        rec.victim.memcg_source,
        report.task_memcg(),
    ) {
        (Some(a), Some(MemcgSource::Kernel), Some(b)) => a == b,
        _ => true,
    };
    let report_ns = clock.kmsg_to_wall(report.ts_us);
    rec.killer.kind == KillerKind::KernelOom
        && rec.victim.pid == report.killed.pid
        && (rec.ts_ns - report_ns).abs() < JOIN_WINDOW_NS
        // A kill from before the probes were attached has no tracepoint
        // event: its report is never another kill's (a pid reused since).
        && report_ns >= started_ns
        && same_cgroup
}

/// Kernel reports no kill has claimed yet.
#[derive(Debug, Default)]
pub struct Reports {
    /// Each report with the wall time it was seen (`None`: due at once,
    /// a kill from before the probes started).
    waiting: Vec<(OomReport, Option<i64>)>,
    /// When the probes started to be attached.
    started_ns: i64,
}

impl Reports {
    /// No report yet; the probes started to be attached at `started_ns`.
    pub fn new(started_ns: i64) -> Self {
        Self {
            waiting: Vec::new(),
            started_ns,
        }
    }

    /// When the probes started to be attached.
    pub fn started_ns(&self) -> i64 {
        self.started_ns
    }

    /// Sets when the probes started to be attached.
    pub fn set_started(&mut self, ns: i64) {
        self.started_ns = ns;
    }

    /// Takes the waiting report of the kill in `rec` (a tracepoint event
    /// that arrived after its report), the closest in time if several join.
    pub fn claim(&mut self, rec: &KillRecord, clock: &Clock) -> Option<OomReport> {
        let i = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, (r, _))| joins(rec, r, clock, self.started_ns))
            .min_by_key(|(_, (r, _))| (rec.ts_ns - clock.kmsg_to_wall(r.ts_us)).abs())
            .map(|(i, _)| i)?;
        Some(self.waiting.swap_remove(i).0)
    }

    /// Which of `records` (kills already recorded, without a report) a new
    /// report belongs to, the closest in time: the index and the report to
    /// merge. `None`: the report waits (one from before the probes started
    /// is due at once).
    pub fn offer<'a>(
        &mut self,
        report: OomReport,
        records: impl IntoIterator<Item = &'a KillRecord>,
        clock: &Clock,
        now_ns: i64,
    ) -> Option<(usize, OomReport)> {
        let ts = clock.kmsg_to_wall(report.ts_us);
        let found = records
            .into_iter()
            .enumerate()
            .filter(|(_, r)| r.kmsg.is_none() && joins(r, &report, clock, self.started_ns))
            .min_by_key(|(_, r)| (r.ts_ns - ts).abs())
            .map(|(i, _)| i);
        if let Some(i) = found {
            return Some((i, report));
        }
        let seen = (ts >= self.started_ns).then_some(now_ns);
        self.waiting.push((report, seen));
        None
    }

    /// Whether a report is due at once (a kill from before the start).
    pub fn has_backlog(&self) -> bool {
        self.waiting.iter().any(|(_, seen)| seen.is_none())
    }

    /// Reports that waited long enough for a tracepoint event (all of them
    /// with `all`): kills to record from the kernel log alone.
    pub fn due(&mut self, now_ns: i64, all: bool) -> Vec<OomReport> {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, seen)| all || seen.is_none_or(|s| now_ns - s >= UNMATCHED_NS));
        self.waiting = keep;
        due.into_iter().map(|(r, _)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collect::kmsg::{KilledProcess, OomSummary},
        correlate::{Context, kill_from_report, kill_from_victim, merge_report},
        record::{MemcgSource, Victim},
    };
    use tracer_common::OomVictim;

    use crate::correlate::fixtures::{CLOCK, Gone, START_NS, World, report, victim_event};

    trait Kill {
        fn kill(&self, ev: &OomVictim, memcg: Option<&str>) -> KillRecord;
    }

    impl Kill for World {
        fn kill(&self, ev: &OomVictim, memcg: Option<&str>) -> KillRecord {
            let ctx = Context {
                clock: &CLOCK,
                model: &self.model,
                sampler: &self.sampler,
                session_id: Some(1),
                now_ns: ev.header.ts_boot_ns as i64,
                procs: &Gone,
            };
            kill_from_victim(&ctx, ev, memcg.map(String::from))
        }
    }

    #[test]
    fn a_report_before_its_tracepoint_event_is_claimed_by_it() {
        let w = World::default();
        let mut reports = Reports::new(START_NS);
        // The report is read first (the kmsg reader was quicker).
        assert!(
            reports
                .offer(report(42, "/job", 5_000_000), [], &CLOCK, 5_000_000_100)
                .is_none()
        );
        let mut rec = w.kill(&victim_event(42, 5_000_000_050), None);
        let r = reports.claim(&rec, &CLOCK).expect("claimed");
        merge_report(&mut rec, &r, None, None);
        assert_eq!(rec.source.to_string(), "tracepoint+kmsg");
        assert_eq!(rec.victim.memcg.as_deref(), Some("/job"));
        assert_eq!(rec.victim.memcg_source, Some(MemcgSource::Kmsg));
        assert_eq!(rec.memcg.as_ref().unwrap().usage_bytes, Some(65536 * 1024));
        assert!(!rec.gaps.contains(&crate::record::Gap::AwaitingReport));
        assert!(
            reports.due(i64::MAX, true).is_empty(),
            "nothing left waiting"
        );
    }

    #[test]
    fn a_report_after_its_event_joins_the_recorded_kill() {
        let w = World::default();
        let mut reports = Reports::new(START_NS);
        let recs = vec![w.kill(&victim_event(42, 5_000_000_000), Some("/job"))];
        let (i, r) = reports
            .offer(report(42, "/job", 5_000_300), &recs, &CLOCK, 5_001_000_000)
            .expect("joined");
        assert_eq!(i, 0);
        assert_eq!(r.killed.pid, 42);
    }

    #[test]
    fn a_report_that_never_matches_becomes_a_kernel_log_only_kill() {
        let mut reports = Reports::new(START_NS);
        let now = 9_000_000_000;
        assert!(
            reports
                .offer(report(77, "/other", 8_000_000), [], &CLOCK, now)
                .is_none()
        );
        assert!(
            reports.due(now + 1_000_000_000, false).is_empty(),
            "still waiting"
        );
        let due = reports.due(now + UNMATCHED_NS, false);
        assert_eq!(due.len(), 1);
        let rec = kill_from_report(&due[0], &CLOCK, None);
        assert_eq!(rec.victim.pid, 77);
        assert_eq!(rec.source.to_string(), "kmsg");
        assert!(
            rec.gaps
                .iter()
                .any(|g| g.to_string().contains("kernel log only"))
        );
    }

    #[test]
    fn two_kills_of_one_cgroup_in_the_same_millisecond_each_get_their_report() {
        let w = World::default();
        let mut reports = Reports::new(START_NS);
        let t = 5_000_000_000u64;
        let recs = vec![
            w.kill(&victim_event(42, t), Some("/job")),
            w.kill(&victim_event(43, t + 300_000), Some("/job")),
        ];
        let (i, _) = reports
            .offer(report(43, "/job", t / 1000 + 300), &recs, &CLOCK, 0)
            .expect("43 joined");
        assert_eq!(i, 1);
        let (i, _) = reports
            .offer(report(42, "/job", t / 1000), &recs, &CLOCK, 0)
            .expect("42 joined");
        assert_eq!(i, 0);
    }

    #[test]
    fn a_pid_reused_after_a_kill_gets_only_its_own_report() {
        let w = World::default();
        let mut reports = Reports::new(START_NS);
        let mut first = w.kill(&victim_event(42, 5_000_000_000), None);
        merge_report(&mut first, &report(42, "/a", 5_000_000), None, None);
        let second = w.kill(&victim_event(42, 10_000_000_000), None);
        let recs = vec![first, second];
        let (i, _) = reports
            .offer(report(42, "/b", 10_000_100), &recs, &CLOCK, 0)
            .expect("joined");
        assert_eq!(i, 1, "the second kill, not the first (it has its report)");
        // A late copy of the first report joins neither: the first has one,
        // and the second is 5 s away.
        assert!(
            reports
                .offer(report(42, "/a", 5_000_000), &recs, &CLOCK, 0)
                .is_none()
        );
    }

    #[test]
    fn a_kill_from_before_the_start_is_due_at_once_and_never_joins() {
        let w = World::default();
        let mut reports = Reports::new(START_NS);
        // Killed at 0.9 s, before the probes; its pid reused and killed
        // again at 1.3 s, while recording.
        assert!(
            reports
                .offer(report(42, "/a", 900_000), [], &CLOCK, 1_350_000_000)
                .is_none()
        );
        assert!(reports.has_backlog());
        let rec = w.kill(&victim_event(42, 1_300_000_000), None);
        assert!(
            reports.claim(&rec, &CLOCK).is_none(),
            "not the second kill's report"
        );
        assert_eq!(reports.due(1_350_000_000, false).len(), 1, "due at once");
    }

    fn bare_kill(pid: u32, ts_ns: i64, memcg: Option<(&str, MemcgSource)>) -> KillRecord {
        KillRecord {
            ts_ns,
            victim: Victim {
                pid,
                memcg: memcg.map(|(m, _)| m.to_string()),
                memcg_source: memcg.map(|(_, s)| s),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn bare_report(pid: u32, ts_us: u64, task_memcg: &str) -> OomReport {
        OomReport {
            ts_us,
            killed: KilledProcess {
                pid,
                ..Default::default()
            },
            summary: Some(OomSummary {
                task_memcg: Some(task_memcg.into()),
                pid,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn joins_on_pid_time_and_the_kernels_cgroup() {
        let at = |us: u64| bare_report(7, us, "/a");
        let s = START_NS;
        let k = MemcgSource::Kernel;
        assert!(joins(
            &bare_kill(7, 5_000_000_000, Some(("/a", k))),
            &at(5_000_100),
            &CLOCK,
            s
        ));
        assert!(!joins(
            &bare_kill(8, 5_000_000_000, None),
            &at(5_000_000),
            &CLOCK,
            s
        ));
        assert!(!joins(
            &bare_kill(7, 9_000_000_000, None),
            &at(5_000_000),
            &CLOCK,
            s
        ));
        assert!(!joins(
            &bare_kill(7, 5_000_000_000, Some(("/b", k))),
            &at(5_000_000),
            &CLOCK,
            s
        ));
        let model = MemcgSource::Model;
        assert!(
            joins(
                &bare_kill(7, 5_000_000_000, Some(("/b", model))),
                &at(5_000_000),
                &CLOCK,
                s
            ),
            "the model's cgroup may be stale: it does not veto"
        );
        assert!(!joins(
            &bare_kill(7, 1_300_000_000, None),
            &at(900_000),
            &CLOCK,
            s
        ));
    }
}
