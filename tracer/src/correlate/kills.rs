//! The kills the recorder holds: those queued for their durable commit, and
//! those committed in the last [`RECENT_NS`], which later events still add
//! to (the kernel's report, the OOM reaper, the memory the exit probe read,
//! the CUDA calls made just before the kill). Pure: each method says which
//! committed record changed, and the recorder writes it.

use super::{KillEnricher, join::Reports, name_task};
use crate::{
    collect::kmsg::OomReport,
    model::{ProcessTable, sampler::Sampler},
    record::{Gap, KillRecord, MemoryFrom, Reaping},
    util::time::Clock,
};

/// Names, a tick later, the tasks of a kill that the model did not know
/// when the kernel's report was joined (a neighbour that exec'd a moment
/// before, read after the report).
pub struct LateNames<'a>(pub &'a ProcessTable);

impl KillEnricher for LateNames<'_> {
    fn enrich(&self, kill: &mut KillRecord) {
        for t in kill.tasks.iter_mut().filter(|t| t.cmdline.is_none()) {
            name_task(self.0, t, kill.ts_ns);
        }
    }
}

/// A kill of `pid` whose victim's memory is unknown takes what its exit held
/// (pages: file, anon, shmem). Returns whether it did.
pub fn exit_memory(rec: &mut KillRecord, pid: u32, pages: [u64; 3], page_kb: u64) -> bool {
    if rec.victim.pid != pid || rec.victim.memory.source.is_some() {
        return false;
    }
    let m = &mut rec.victim.memory;
    m.file_rss_kb = Some(pages[0] * page_kb);
    m.anon_rss_kb = Some(pages[1] * page_kb);
    m.shmem_rss_kb = Some(pages[2] * page_kb);
    m.source = Some(MemoryFrom::Exit);
    rec.gaps.retain(|g| *g != Gap::MemoryUnknown);
    true
}

/// The record of a GPU process that ended abnormally (exit `x`, at wall
/// `ts_ns`) just after `fault`: nobody killed it; the Xid is its cause.
pub fn death_after_gpu_fault(
    ctx: &super::Context<'_>,
    x: &tracer_common::ProcExit,
    ts_ns: i64,
    fault: crate::record::GpuFault,
    page_kb: u64,
) -> KillRecord {
    use crate::{
        model::StartTime,
        record::{Killer, KillerKind, Seen},
    };
    let (p, reused) = ctx
        .model
        .holder(x.pid, ts_ns, StartTime::kernel(x.start_ns));
    let victim = super::victim_from(x.pid, crate::collect::decode::c_str(&x.header.comm), p);
    let mut rec = KillRecord {
        ts_ns,
        source: Seen::EXIT,
        killer: Killer {
            kind: KillerKind::GpuFault,
            gpu_fault: Some(fault),
            ..Default::default()
        },
        victim,
        session_id: ctx.session_id,
        ..Default::default()
    };
    if reused {
        rec.gaps.push(super::reused_pid_gap(x.pid));
    }
    let pages = [x.rss_file_pages, x.rss_anon_pages, x.rss_shmem_pages];
    if x.rss_known == 0 || !exit_memory(&mut rec, x.pid, pages, page_kb) {
        rec.gaps.push(Gap::MemoryUnknown);
    }
    rec
}

/// How long a committed kill still takes later joins.
pub const RECENT_NS: i64 = 30_000_000_000;

/// How long, and how many, exits are kept for a kill that reaches the
/// recorder after its victim's exit: the rings are read by separate tasks,
/// so an exit can be served before the SIGKILL that caused it.
const EXITS_KEPT_NS: i64 = 5_000_000_000;
const EXITS_KEPT: usize = 1024;

/// An exit with the memory its process held: pid, time, KiB (file, anon,
/// shmem).
type ExitMemory = (u32, i64, [u64; 3]);

/// Queued and recently committed kills.
#[derive(Debug, Default)]
pub struct KillBook {
    queued: Vec<KillRecord>,
    /// By row id, which grows with each commit: oldest first.
    recent: std::collections::BTreeMap<i64, KillRecord>,
    /// The last exits that held memory, oldest first (bounded by
    /// [`EXITS_KEPT`] and [`EXITS_KEPT_NS`]).
    exits: std::collections::VecDeque<ExitMemory>,
}

impl KillBook {
    /// Queues a kill for the next commit. A victim whose memory is unknown
    /// takes what its exit held, where that exit was served first: the
    /// first exit of its pid at or after the kill (an earlier one is of an
    /// earlier process that had the pid).
    pub fn queue(&mut self, mut rec: KillRecord) {
        if rec.victim.memory.source.is_none()
            && let Some(&(pid, _, kb)) = self
                .exits
                .iter()
                .find(|(pid, ts, _)| *pid == rec.victim.pid && *ts >= rec.ts_ns)
        {
            exit_memory(&mut rec, pid, kb, 1);
        }
        self.queued.push(rec);
    }

    /// Queues kills that could not be written, ahead of newer ones.
    pub fn requeue(&mut self, kills: Vec<KillRecord>) {
        self.queued.splice(0..0, kills);
    }

    /// Kills waiting for their commit.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Takes the queued kills, to commit them.
    pub fn take_queued(&mut self) -> Vec<KillRecord> {
        std::mem::take(&mut self.queued)
    }

    /// Queued kills at or after `since_ns`, for a caller that updates them
    /// itself: they are stored as they are at their commit.
    pub fn queued_since(&mut self, since_ns: i64) -> impl Iterator<Item = &mut KillRecord> {
        self.queued.iter_mut().filter(move |r| r.ts_ns >= since_ns)
    }

    /// A kill was committed with row `id`.
    pub fn committed(&mut self, id: i64, rec: KillRecord) {
        self.recent.insert(id, rec);
    }

    /// Recently committed kills at or after `since_ns`, with their row ids,
    /// for a caller that updates them itself.
    pub fn recent_since(&mut self, since_ns: i64) -> impl Iterator<Item = (i64, &mut KillRecord)> {
        self.recent
            .iter_mut()
            .filter(move |(_, r)| r.ts_ns >= since_ns)
            .map(|(id, r)| (*id, r))
    }

    /// The record of a committed kill.
    pub fn get(&self, id: i64) -> Option<&KillRecord> {
        self.recent.get(&id)
    }

    /// The kills moved to another store: committed ones to the rows of
    /// `ids` (old row, new row), every one to session `session_id`.
    pub fn moved(&mut self, ids: &std::collections::HashMap<i64, i64>, session_id: i64) {
        self.recent = std::mem::take(&mut self.recent)
            .into_iter()
            .map(|(id, mut rec)| {
                rec.session_id = Some(session_id);
                (ids.get(&id).copied().unwrap_or(id), rec)
            })
            .collect();
        for rec in &mut self.queued {
            rec.session_id = Some(session_id);
        }
    }

    /// Forgets committed kills older than [`RECENT_NS`].
    pub fn prune(&mut self, now_ns: i64) {
        self.recent.retain(|_, r| now_ns - r.ts_ns < RECENT_NS);
    }

    /// The OOM reaper started (or finished) on `pid` at `ts_ns`. Returns the
    /// row of a committed record that changed.
    pub fn on_reap(&mut self, pid: u32, ts_ns: i64, start: bool) -> Option<i64> {
        let set = |rec: &mut KillRecord| {
            let r = rec.reaping.get_or_insert_with(Reaping::default);
            if start {
                r.start_ns = Some(ts_ns);
            } else {
                r.finish_ns = Some(ts_ns);
            }
        };
        if let Some(rec) = self.queued.iter_mut().rev().find(|k| k.victim.pid == pid) {
            set(rec);
            return None;
        }
        let (id, rec) = self
            .recent
            .iter_mut()
            .rev()
            .find(|(_, r)| r.victim.pid == pid)?;
        set(rec);
        Some(*id)
    }

    /// Whether any kill still waits for its victim's memory.
    pub fn awaiting_memory(&self) -> bool {
        self.queued
            .iter()
            .chain(self.recent.values())
            .any(|r| r.victim.memory.source.is_none())
    }

    /// `pid` exited at `ts_ns` holding these pages (file, anon, shmem): a
    /// kill whose victim's memory was unknown (gone before /proc could be
    /// read) gets them, now or when it is queued. Returns the row of a
    /// committed record that changed.
    pub fn on_exit_memory(
        &mut self,
        pid: u32,
        ts_ns: i64,
        pages: [u64; 3],
        page_kb: u64,
    ) -> Option<i64> {
        while self.exits.len() >= EXITS_KEPT
            || self
                .exits
                .front()
                .is_some_and(|(_, t, _)| ts_ns - t > EXITS_KEPT_NS)
        {
            self.exits.pop_front();
        }
        self.exits
            .push_back((pid, ts_ns, pages.map(|p| p * page_kb)));
        if !self.awaiting_memory() {
            return None;
        }
        let fill = |rec: &mut KillRecord| exit_memory(rec, pid, pages, page_kb);
        if self.queued.iter_mut().rev().any(fill) {
            return None;
        }
        let (id, rec) = self
            .recent
            .iter_mut()
            .rev()
            .find(|(_, r)| r.victim.pid == pid)?;
        fill(rec).then_some(*id)
    }

    /// A kernel report: joined into the kill it belongs to, queued or
    /// committed, or left waiting in `reports`. Returns the row of the
    /// committed record it joined (a queued one is stored with it: a report
    /// that came while its kill waited for the commit is never left to
    /// become a second, log-only kill).
    pub fn on_report(
        &mut self,
        report: OomReport,
        reports: &mut Reports,
        clock: &Clock,
        now_ns: i64,
        sampler: Option<&Sampler>,
        model: Option<&crate::model::ProcessTable>,
    ) -> Option<i64> {
        let queued = self.queued.len();
        let all = self.queued.iter().chain(self.recent.values());
        let (i, report) = reports.offer(report, all, clock, now_ns)?;
        if i < queued {
            super::merge_report(&mut self.queued[i], &report, sampler, model);
            return None;
        }
        let (id, rec) = self.recent.iter_mut().nth(i - queued)?;
        super::merge_report(rec, &report, sampler, model);
        Some(*id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collect::{
            decode::{Event, as_bytes, decode},
            kmsg::KilledProcess,
        },
        record::{Killer, KillerKind, Seen, Victim},
    };
    use tracer_common::{EventHeader, ProcExit, Reap, kind};

    fn kill(pid: u32, ts_ns: i64) -> KillRecord {
        KillRecord {
            ts_ns,
            source: Seen::SIGNAL,
            killer: Killer {
                kind: KillerKind::Userspace,
                ..Default::default()
            },
            victim: Victim {
                pid,
                ..Default::default()
            },
            gaps: vec![Gap::MemoryUnknown],
            ..Default::default()
        }
    }

    fn header(kind: u32, pid: u32) -> EventHeader {
        EventHeader {
            kind,
            pid,
            tid: pid,
            ..Default::default()
        }
    }

    /// The exit probe's record of `pid`, through the real decoder.
    fn exit(pid: u32, pages: [u64; 3]) -> ProcExit {
        let ev = ProcExit {
            header: header(kind::PROC_EXIT, pid),
            pid,
            rss_known: 1,
            rss_file_pages: pages[0],
            rss_anon_pages: pages[1],
            rss_shmem_pages: pages[2],
            start_ns: 0,
            exit_code: 9,
            exit_known: 1,
        };
        match decode(&as_bytes(&ev)).unwrap() {
            Event::Exit(x) => x,
            other => panic!("{other:?}"),
        }
    }

    fn reap(pid: u32, start: bool) -> Reap {
        let k = if start {
            kind::REAP_START
        } else {
            kind::REAP_FINISH
        };
        let ev = Reap {
            header: header(k, 0),
            victim_pid: pid,
            _pad: 0,
        };
        match decode(&as_bytes(&ev)).unwrap() {
            Event::Reap(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_exit_fills_a_victims_unknown_memory_queued_or_committed() {
        let mut book = KillBook::default();
        book.queue(kill(10, 1_000));
        assert!(book.awaiting_memory());
        let x = exit(10, [1, 200, 3]);
        let pages = [x.rss_file_pages, x.rss_anon_pages, x.rss_shmem_pages];
        assert_eq!(
            book.on_exit_memory(x.pid, 1_500, pages, 4),
            None,
            "queued: nothing to rewrite"
        );
        let queued = book.take_queued();
        let m = &queued[0].victim.memory;
        assert_eq!(
            (m.file_rss_kb, m.anon_rss_kb, m.shmem_rss_kb),
            (Some(4), Some(800), Some(12))
        );
        assert_eq!(m.source, Some(MemoryFrom::Exit));
        assert!(queued[0].gaps.is_empty(), "the memory-unknown gap is gone");

        book.committed(7, kill(11, 2_000));
        assert_eq!(
            book.on_exit_memory(11, 2_500, [0, 5, 0], 4),
            Some(7),
            "committed: rewrite row 7"
        );
        assert_eq!(
            book.on_exit_memory(11, 2_600, [0, 9, 0], 4),
            None,
            "filled once"
        );
        assert_eq!(book.get(7).unwrap().victim.memory.anon_rss_kb, Some(20));
        assert_eq!(
            book.on_exit_memory(99, 2_700, [0, 1, 0], 4),
            None,
            "not a victim"
        );
        assert!(!book.awaiting_memory());
    }

    #[test]
    fn an_exit_served_before_its_kill_fills_the_kill_when_it_is_queued() {
        let mut book = KillBook::default();
        // An earlier process with pid 40 exited before the kill: not its.
        let x = exit(40, [0, 7, 0]);
        let pages = [x.rss_file_pages, x.rss_anon_pages, x.rss_shmem_pages];
        assert_eq!(book.on_exit_memory(40, 900, pages, 4), None);
        // The victim's own exit, read before the SIGKILL that caused it.
        assert_eq!(book.on_exit_memory(40, 1_200, [2, 300, 0], 4), None);
        assert_eq!(book.on_exit_memory(40, 1_900, [0, 1, 0], 4), None);
        book.queue(kill(40, 1_000));
        let queued = book.take_queued();
        let m = &queued[0].victim.memory;
        assert_eq!((m.file_rss_kb, m.anon_rss_kb), (Some(8), Some(1_200)));
        assert_eq!(m.source, Some(MemoryFrom::Exit));
        assert!(queued[0].gaps.is_empty());
        // A kill with no exit after it stays unknown.
        book.queue(kill(40, 2_000));
        assert_eq!(book.take_queued()[0].victim.memory.source, None);
        // Kept exits are bounded in time.
        book.on_exit_memory(41, 2_000 + EXITS_KEPT_NS + 1, [0, 1, 0], 4);
        assert_eq!(book.exits.len(), 1);
    }

    #[test]
    fn reaping_lands_on_the_latest_kill_of_the_pid() {
        let mut book = KillBook::default();
        book.committed(1, kill(20, 1_000));
        book.committed(2, kill(20, 9_000));
        let r = reap(20, true);
        assert_eq!(book.on_reap(r.victim_pid, 9_100, true), Some(2));
        let r = reap(20, false);
        assert_eq!(book.on_reap(r.victim_pid, 9_300, false), Some(2));
        let reaping = book.get(2).unwrap().reaping.clone().unwrap();
        assert_eq!(
            (reaping.start_ns, reaping.finish_ns),
            (Some(9_100), Some(9_300))
        );
        assert!(book.get(1).unwrap().reaping.is_none());
        book.queue(kill(21, 10_000));
        assert_eq!(
            book.on_reap(21, 10_100, true),
            None,
            "queued: committed with it"
        );
        assert!(book.take_queued()[0].reaping.is_some());
    }

    #[test]
    fn a_report_joins_the_committed_kill_and_recent_kills_age_out() {
        let clock = Clock::fixed(0, 0);
        let mut reports = Reports::new(0);
        let mut book = KillBook::default();
        let mut k = kill(30, 5_000_000_000);
        k.killer.kind = KillerKind::KernelOom;
        k.source = Seen::TRACEPOINT;
        book.committed(4, k);
        let report = OomReport {
            ts_us: 5_000_100,
            killed: KilledProcess {
                pid: 30,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            book.on_report(report, &mut reports, &clock, 5_100_000_000, None, None),
            Some(4)
        );
        assert_eq!(book.get(4).unwrap().source.to_string(), "tracepoint+kmsg");
        book.prune(5_000_000_000 + RECENT_NS);
        assert!(book.get(4).is_none());
    }

    #[test]
    fn a_report_that_comes_while_its_kill_waits_for_the_commit_joins_it() {
        let clock = Clock::fixed(0, 0);
        let mut reports = Reports::new(0);
        let mut book = KillBook::default();
        let mut k = kill(31, 6_000_000_000);
        k.killer.kind = KillerKind::KernelOom;
        k.source = Seen::TRACEPOINT;
        book.queue(k);
        let report = OomReport {
            ts_us: 6_000_050,
            killed: KilledProcess {
                pid: 31,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            book.on_report(report, &mut reports, &clock, 6_100_000_000, None, None),
            None,
            "queued: stored with its commit"
        );
        assert!(
            reports.due(6_100_000_000, true).is_empty(),
            "no report is left to become a log-only kill"
        );
        let queued = book.take_queued();
        assert_eq!(queued[0].source.to_string(), "tracepoint+kmsg");
    }

    #[test]
    fn a_task_the_model_learns_late_is_named_and_a_reused_pid_is_not() {
        use crate::{
            model::{ProcessTable, cgroup::CgroupLayout, proc::ProcInfo},
            record::TaskAtKill,
        };
        let mut model = ProcessTable::new(CgroupLayout::default(), 0, 16);
        let task = |pid: u32, comm: &str, victim: bool| TaskAtKill {
            pid,
            comm: comm.into(),
            victim,
            ..Default::default()
        };
        let mut k = kill(10, 1);
        k.tasks = vec![
            task(10, "small", true),
            task(11, "grower", false),
            task(12, "old", false),
            task(13, "quitter", false),
            task(14, "gone", false),
        ];
        // Joined before the model read them: nothing to name yet.
        LateNames(&model).enrich(&mut k);
        assert!(k.tasks.iter().all(|t| t.cmdline.is_none()));
        model.add(ProcInfo {
            pid: 11,
            comm: "grower".into(),
            cmdline: "/bin/grower --fast".into(),
            ..Default::default()
        });
        // Pid 12 is another program's now: not named after it.
        model.add(ProcInfo {
            pid: 12,
            comm: "other".into(),
            cmdline: "/bin/other".into(),
            ..Default::default()
        });
        model.add(ProcInfo {
            pid: 10,
            comm: "small".into(),
            cmdline: "/bin/small".into(),
            ..Default::default()
        });
        // Pid 13 ended after the kill (the OOM killer took it next): it
        // held the pid at the kill, and is named; pid 14's process ended a
        // second before it, so another may hold the pid: not named.
        for (pid, comm, ended) in [(13, "quitter", 5), (14, "gone", -1_000_000_000)] {
            model.add(ProcInfo {
                pid,
                comm: comm.into(),
                cmdline: format!("/bin/{comm}").into(),
                ..Default::default()
            });
            model.on_exit(pid, ended, None);
        }
        LateNames(&model).enrich(&mut k);
        assert_eq!(k.tasks[1].cmdline.as_deref(), Some("/bin/grower --fast"));
        assert_eq!(k.tasks[2].cmdline, None);
        assert_eq!(k.tasks[3].cmdline.as_deref(), Some("/bin/quitter"));
        assert_eq!(k.tasks[4].cmdline, None);
        // The victim's own record names it; its row is left alone.
        assert_eq!(k.tasks[0].cmdline, None);
    }
}
