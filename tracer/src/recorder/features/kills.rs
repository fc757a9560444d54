//! Kills: the kernel OOM killer's (its victim event, joined with its report
//! in the kernel log), userspace SIGKILLs (folded past a rate), kernel
//! SIGKILLs of processes by themselves, reaping, memory at exit, late
//! execs and `memory.oom.group` incidents. Kills wait in the book for the
//! engine to commit them; committed ones take later joins for a while.

use std::collections::BTreeSet;

use tracer_common::{OomVictim, ProcExit, Reap, SignalKill, victim_field};

use super::Env;
use crate::{
    collect::{
        decode::c_str,
        killers::Said,
        kmsg::{GROUP_SPAN_US, OomGroup, OomReport},
    },
    correlate::{
        KillEnricher, SI_KERNEL,
        join::{JOIN_WINDOW_NS, Reports},
        kill_from_report, kill_from_self_signal, kill_from_signal, kill_from_signal_lean,
        kill_from_victim,
        kills::{KillBook, exit_memory},
        merge_report,
        selfkill::SelfKills,
        storm::SignalStorm,
        userkill::{self, Logged},
    },
    model::StartTime,
    record::{KillRecord, MemcgSource},
    recorder::output::{Output, Outputs},
    util::time::{Clock, wall_now_ns},
};

/// How long a `memory.oom.group` announcement waits for its first kill.
const GROUP_WAIT_NS: i64 = 30_000_000_000;

/// The kills feature.
pub struct Kills {
    /// Kills queued for commit, and recently committed ones later events add to.
    book: KillBook,
    /// Kernel reports no kill has claimed yet.
    reports: Reports,
    /// Userspace SIGKILLs past the rate of full records.
    storm: SignalStorm,
    /// Kernel SIGKILLs of processes by themselves, waiting to be told from
    /// the OOM killer's.
    self_kills: SelfKills,
    /// `memory.oom.group` announcements waiting for their first kill.
    pending_groups: Vec<OomGroup>,
    /// Kills re-enrichment changed, to store again.
    dirty: BTreeSet<i64>,
    /// Kills whose blamed neighbour's growth was asked for.
    neighbours_asked: BTreeSet<i64>,
    /// Kills found in the kernel log only.
    pub kmsg_only: u64,
    /// Whether the kernel's SIGKILLs are seen (the signal probe runs and
    /// the kernel log is read): only then is a mark with none before it
    /// told from a kill.
    sees_kernel_kills: bool,
    /// OOM victims marked with no SIGKILL from the kernel before them,
    /// waiting for a "Killed process" line (when seen, wall ns; the event;
    /// its time).
    unsignalled: Vec<(i64, OomVictim, i64)>,
    /// Marks that no kill followed: the kernel gave a task that was
    /// already exiting its memory reserves, and killed nothing.
    pub marks_without_kill: u64,
    /// The userspace killers' journal entries, for SIGKILLs read after them.
    logged: Logged,
}

/// How long a mark with no SIGKILL before it waits for a "Killed process"
/// line; most unsignalled marks held at once.
const UNSIGNALLED_WAIT_NS: i64 = 5_000_000_000;
const UNSIGNALLED_HELD: usize = 1024;

/// What became of a SIGKILL event.
#[derive(Debug, PartialEq, Eq)]
pub enum Signal {
    /// Folded into a storm's aggregate: no row is stored.
    Folded,
    /// A kill was queued, or the event is kept as a raw event only.
    Stored,
}

impl Kills {
    /// A kills feature whose kernel reports older than `started_ns` are
    /// the log's backlog.
    pub fn new(started_ns: i64) -> Self {
        Self {
            book: KillBook::default(),
            reports: Reports::new(started_ns),
            storm: SignalStorm::default(),
            self_kills: SelfKills::default(),
            pending_groups: Vec::new(),
            dirty: BTreeSet::new(),
            neighbours_asked: BTreeSet::new(),
            kmsg_only: 0,
            sees_kernel_kills: false,
            unsignalled: Vec::new(),
            marks_without_kill: 0,
            logged: Logged::default(),
        }
    }

    /// Says whether the kernel's own SIGKILLs are seen (see
    /// [`Kills::on_victim`]).
    pub fn set_sees_kernel_kills(&mut self, yes: bool) {
        self.sees_kernel_kills = yes;
    }

    /// Sets when the probes started to be attached (wall ns).
    pub fn set_started(&mut self, ns: i64) {
        self.reports.set_started(ns);
    }

    /// The OOM killer's victim: a kill queued, joined with its report when
    /// the log already told of it.
    ///
    /// The kernel also marks a task that is already exiting (it had a
    /// SIGTERM, or an earlier kill) as a victim, to give it memory reserves,
    /// and kills nothing: no SIGKILL comes before that mark and no "Killed
    /// process" line after it. Such a mark is held until its line comes (a
    /// thread the kernel chose for its process is killed under the
    /// process's id, so its SIGKILL is not matched) and is no kill without
    /// one; its event row is kept either way.
    pub fn on_victim(&mut self, env: &mut Env<'_>, v: &OomVictim, ts_ns: i64, now_ns: i64) {
        self.self_kills.oom_victim(now_ns, v.victim_pid);
        if self.sees_kernel_kills && v.present & victim_field::KILL_SEEN == 0 {
            if self.unsignalled.len() < UNSIGNALLED_HELD {
                self.unsignalled.push((now_ns, *v, ts_ns));
            }
            return;
        }
        self.queue_victim(env, v, ts_ns, now_ns);
    }

    fn queue_victim(&mut self, env: &mut Env<'_>, v: &OomVictim, ts_ns: i64, now_ns: i64) {
        // The victim's cgroup from the kernel at the kill: read at the
        // SIGKILL the OOM killer sent it, or the trigger's when it was
        // killed for its own allocation.
        let id = match v.victim_memcg_id {
            0 if v.header.pid == v.victim_pid => v.trigger_memcg_id,
            id => id,
        };
        let kernel_memcg = env.model.memcg_by_id(id, true);
        let mut rec = kill_from_victim(&env.ctx(now_ns), v, kernel_memcg);
        tracing::debug!(
            "kill of {}: received {} us after the kernel, built in {} us",
            v.victim_pid,
            (now_ns - ts_ns) / 1000,
            (wall_now_ns() - now_ns) / 1000
        );
        if let Some(report) = self.reports.claim(&rec, env.clock) {
            merge_report(&mut rec, &report, Some(env.sampler), Some(env.model));
        }
        self.book.queue(rec);
    }

    /// A SIGKILL: a userspace kill is queued (or folded past the storm
    /// rate, with no /proc read); a kernel SIGKILL of a process by itself
    /// waits to be told from the OOM killer's; any other is a raw event.
    pub fn on_signal(
        &mut self,
        env: &mut Env<'_>,
        s: &SignalKill,
        ts_ns: i64,
        now_ns: i64,
    ) -> Signal {
        if s.result != 0 {
            return Signal::Stored;
        }
        if s.code != SI_KERNEL {
            if !self.storm.admit(ts_ns) {
                // Past the rate: no walk of the cgroups for an id not known.
                let kernel = env.model.memcg_by_id(s.target_memcg_id, false);
                let memcg = kernel.clone().or_else(|| {
                    env.model
                        .holder(s.target_pid, ts_ns, StartTime::kernel(s.target_start_ns))
                        .0
                        .and_then(|p| p.memcg.clone())
                });
                let comm = c_str(&s.target_comm);
                let ctx = env.ctx(ts_ns);
                self.storm.fold(
                    s.header.pid,
                    memcg,
                    (ts_ns, now_ns),
                    (s.target_pid, &comm),
                    || kill_from_signal_lean(&ctx, s, kernel),
                );
                return Signal::Folded;
            }
            env.model.get_or_read(s.header.pid);
            env.model.read_pending(s.target_pid);
            let memcg = env.model.memcg_by_id(s.target_memcg_id, true);
            if let Some(mut rec) = kill_from_signal(&env.ctx(now_ns), s, memcg) {
                self.logged.fill(&mut rec);
                self.book.queue(rec);
            }
        } else if s.header.pid == s.target_pid {
            // The OOM killer's when a mark_victim of it comes, else a BPF
            // program's or a kernel limit's (see `selfkill`).
            self.self_kills.signal(now_ns, *s);
        }
        Signal::Stored
    }

    /// The OOM reaper started or finished on a victim.
    pub fn on_reap(&mut self, r: &Reap, ts_ns: i64, out: &mut Outputs) {
        let start = r.header.kind == tracer_common::kind::REAP_START;
        if let Some(id) = self.book.on_reap(r.victim_pid, ts_ns, start) {
            self.changed(id, out);
        }
    }

    /// A process exited at `ts_ns` with the kernel's figures of its memory:
    /// a kill whose victim's memory was unknown gets them, now or when it
    /// comes (the exit may be served before the kill).
    pub fn on_exit_memory(&mut self, x: &ProcExit, ts_ns: i64, page_kb: u64, out: &mut Outputs) {
        let pages = [x.rss_file_pages, x.rss_anon_pages, x.rss_shmem_pages];
        if !self.self_kills.is_empty() {
            self.self_kills.on_exit_memory(x.pid, pages);
        }
        if let Some(id) = self.book.on_exit_memory(x.pid, ts_ns, pages, page_kb) {
            self.changed(id, out);
        }
    }

    /// A kernel OOM report: joined into the kill it belongs to (queued or
    /// committed), or left waiting for one.
    pub fn on_report(
        &mut self,
        env: &mut Env<'_>,
        report: OomReport,
        now_ns: i64,
        out: &mut Outputs,
    ) {
        // The line of a mark held for want of a SIGKILL: a kill after all.
        let at = env.clock.kmsg_to_wall(report.ts_us);
        if let Some(i) = self.unsignalled.iter().position(|(_, v, ts)| {
            v.victim_pid == report.killed.pid && (ts - at).abs() < JOIN_WINDOW_NS
        }) {
            let (_, v, ts) = self.unsignalled.swap_remove(i);
            self.queue_victim(env, &v, ts, now_ns);
        }
        let joined = self.book.on_report(
            report,
            &mut self.reports,
            env.clock,
            now_ns,
            Some(env.sampler),
            Some(env.model),
        );
        if let Some(id) = joined {
            self.changed(id, out);
            self.retry_groups(env.clock, now_ns, out);
        }
    }

    /// Whether reports from before the start wait to be settled.
    pub fn has_backlog(&self) -> bool {
        self.reports.has_backlog()
    }

    /// An exec that reached the engine after the kill of the program it
    /// started (the kill's ring is served first, and the exec's is read
    /// lazily): the kill gets its own program's command line, file and
    /// cgroup now, whether it is still queued for its commit or committed
    /// (then it is stored and handed on again).
    pub fn on_late_exec(&mut self, env: &Env<'_>, pid: u32, exec_ns: i64, out: &mut Outputs) {
        let Some(p) = env.model.get(pid) else {
            return;
        };
        let cmdline = Some(p.info.cmdline.to_string()).filter(|c| !c.is_empty());
        let (exe, memcg) = (p.info.exe.clone(), p.memcg.clone());
        // Whether the record changed.
        let fill = |rec: &mut KillRecord| {
            let v = &mut rec.victim;
            if v.pid != pid || (v.cmdline == cmdline && v.exe == exe) {
                return false;
            }
            v.cmdline = cmdline.clone();
            v.exe = exe.clone();
            if matches!(v.memcg_source, None | Some(MemcgSource::Model)) && memcg.is_some() {
                v.memcg = memcg.clone();
                v.memcg_source = Some(MemcgSource::Model);
            }
            true
        };
        for rec in self.book.queued_since(exec_ns) {
            fill(rec);
        }
        for (id, rec) in self.book.recent_since(exec_ns) {
            if fill(rec) {
                tracing::debug!(
                    "kill {id}: its victim's exec came after it; command line now known"
                );
                out.push(changed(id, rec));
            }
        }
    }

    /// A userspace OOM killer's journal entry (systemd-oomd, earlyoom, kubelet): the
    /// SIGKILLs it sent, queued or committed, take its reason (committed
    /// ones are stored and handed on again), and it is kept for those read
    /// after it.
    pub fn on_logged(&mut self, ts_ns: i64, said: Said, out: &mut Outputs) {
        let Said::Kill(uk) = said else {
            return;
        };
        let since = ts_ns - userkill::WINDOW_NS;
        for rec in self.book.queued_since(since) {
            if userkill::sent_by(&uk, ts_ns, rec) {
                userkill::fill(&uk, rec);
            }
        }
        for (id, rec) in self.book.recent_since(since) {
            if userkill::sent_by(&uk, ts_ns, rec) {
                userkill::fill(&uk, rec);
                tracing::debug!("kill {id}: the reason its killer logged is joined");
                out.push(changed(id, rec));
            }
        }
        self.logged.push(ts_ns, *uk);
    }

    /// The kill the kernel reported just before announcing a
    /// `memory.oom.group` kill is that incident's first (the others'
    /// reports say so themselves).
    pub fn on_oom_group(&mut self, g: OomGroup, clock: &Clock, out: &mut Outputs) {
        if !self.try_group(&g, clock, out) {
            // Its first kill has not met its report yet.
            self.pending_groups.push(g);
        }
    }

    /// Announcements still waiting for their first kill: tried again once
    /// kills are committed or joined, for [`GROUP_WAIT_NS`].
    pub fn retry_groups(&mut self, clock: &Clock, now_ns: i64, out: &mut Outputs) {
        for g in std::mem::take(&mut self.pending_groups) {
            let fresh = now_ns - clock.kmsg_to_wall(g.ts_us) < GROUP_WAIT_NS;
            if !self.try_group(&g, clock, out) && fresh {
                self.pending_groups.push(g);
            }
        }
    }

    fn try_group(&mut self, g: &OomGroup, clock: &Clock, out: &mut Outputs) -> bool {
        let since = clock.kmsg_to_wall(g.ts_us) - 10_000_000_000;
        let reported = |r: &KillRecord| r.kmsg.as_ref().map(|k| k.ts_us);
        let first = self
            .book
            .recent_since(since)
            .filter(|(_, r)| {
                r.oom_group.is_none()
                    && reported(r).is_some_and(|ts| ts <= g.ts_us && g.ts_us - ts <= GROUP_SPAN_US)
            })
            .max_by_key(|(_, r)| reported(r));
        let Some((id, rec)) = first else {
            return false;
        };
        rec.oom_group = Some(g.cgroup.clone());
        out.push(changed(id, rec));
        true
    }

    /// Reports nobody claimed: kills from before the recorder started (or
    /// whose tracepoint event was lost) become kernel-log-only records,
    /// unless `stored` says the store has them already.
    pub fn settle_unmatched(
        &mut self,
        env: &Env<'_>,
        now_ns: i64,
        all: bool,
        mut stored: impl FnMut(u32, i64, i64) -> bool,
    ) {
        let (gone, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unsignalled)
            .into_iter()
            .partition(|(seen, ..)| all || now_ns - seen >= UNSIGNALLED_WAIT_NS);
        self.unsignalled = held;
        for (_, v, _) in gone {
            self.marks_without_kill += 1;
            tracing::debug!(
                "pid {}: marked an OOM victim while already exiting; no kill followed",
                v.victim_pid
            );
        }
        for report in self.reports.due(now_ns, all) {
            let ts = env.clock.kmsg_to_wall(report.ts_us);
            if !stored(report.killed.pid, ts, JOIN_WINDOW_NS) {
                self.kmsg_only += 1;
                self.book
                    .queue(kill_from_report(&report, env.clock, Some(env.model)));
            }
        }
    }

    /// Queues the SIGKILL aggregates whose window has closed (all of them
    /// with `all`). Returns how many.
    pub fn storms_due(&mut self, now_ns: i64, all: bool) -> usize {
        let due = self.storm.take_due(now_ns, all);
        let n = due.len();
        for rec in due {
            if let Some(a) = &rec.aggregate {
                tracing::warn!(
                    "{} SIGKILLs from {} (pid {}) folded into one record",
                    a.count,
                    crate::util::term::escape(
                        rec.killer.sender.as_ref().map_or("?", |s| s.comm.as_str())
                    ),
                    rec.killer.sender.as_ref().map_or(0, |s| s.pid),
                );
            }
            self.book.queue(rec);
        }
        n
    }

    /// SIGKILLs folded into aggregates so far.
    pub fn folded(&self) -> u64 {
        self.storm.folded
    }

    /// Queues the self-kills (see `selfkill`) no OOM kill claimed by
    /// `due_ns`, with the memory their processes held at exit.
    pub fn self_kills_due(&mut self, env: &mut Env<'_>, due_ns: i64, now_ns: i64, page_kb: u64) {
        for (ev, pages) in self.self_kills.due(due_ns) {
            env.model.read_pending(ev.target_pid);
            let memcg = env.model.memcg_by_id(ev.target_memcg_id, true);
            let Some(mut rec) = kill_from_self_signal(&env.ctx(now_ns), &ev, memcg) else {
                continue;
            };
            if let Some(pages) = pages {
                exit_memory(&mut rec, ev.target_pid, pages, page_kb);
            }
            self.book.queue(rec);
        }
    }

    /// Queues a record built elsewhere (a GPU fault's death), for commit.
    pub fn queue(&mut self, rec: KillRecord) {
        self.book.queue(rec);
    }

    /// Kills waiting for their commit.
    pub fn queued(&self) -> usize {
        self.book.queued()
    }

    /// Takes the queued kills, to commit them.
    pub fn take_queued(&mut self) -> Vec<KillRecord> {
        self.book.take_queued()
    }

    /// Kills that could not be written, queued again ahead of newer ones.
    pub fn requeue(&mut self, kills: Vec<KillRecord>) {
        if !kills.is_empty() {
            self.book.requeue(kills);
        }
    }

    /// A kill was committed with row `id`.
    pub fn committed(&mut self, id: i64, rec: KillRecord) {
        self.book.committed(id, rec);
    }

    /// Runs `enricher` again over the kills committed since `since_ns` and
    /// marks those whose `part` it changed, to be stored again by
    /// [`Self::take_dirty`] (what it adds may come after the kill's commit).
    pub fn re_enrich<P: PartialEq>(
        &mut self,
        enricher: &dyn KillEnricher,
        since_ns: i64,
        part: impl Fn(&KillRecord) -> P,
    ) {
        for (id, rec) in self.book.recent_since(since_ns) {
            let before = part(rec);
            enricher.enrich(rec);
            if part(rec) != before {
                self.dirty.insert(id);
            }
        }
    }

    /// Up to `n` re-enriched kills to store again, oldest first.
    pub fn take_dirty(&mut self, n: usize) -> Vec<(i64, KillRecord)> {
        std::iter::from_fn(|| self.dirty.pop_first())
            .take(n)
            .filter_map(|id| Some((id, self.book.get(id)?.clone())))
            .collect()
    }

    /// Re-enriched kills not yet stored again.
    pub fn dirty(&self) -> usize {
        self.dirty.len()
    }

    /// The store moved (the recorder came home from its spill store): kills
    /// follow their rows, every one to session `session_id`.
    pub fn moved(&mut self, ids: &std::collections::HashMap<i64, i64>, session_id: i64) {
        self.book.moved(ids, session_id);
        self.dirty = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|id| ids.get(&id).copied().unwrap_or(id))
            .collect();
    }

    /// Forgets committed kills too old for later joins.
    pub fn prune(&mut self, now_ns: i64) {
        self.book.prune(now_ns);
        let book = &self.book;
        self.neighbours_asked.retain(|&id| book.get(id).is_some());
    }

    /// Kills committed since `since_ns` whose verdict will blame a
    /// neighbour (see [`KillRecord::biggest_neighbour`]), each once:
    /// (victim pid, neighbour pid). The kernel's report names the tasks,
    /// so a kill is ready once it is joined.
    pub fn neighbours_to_ask(&mut self, since_ns: i64) -> Vec<(u32, u32)> {
        let mut ask = Vec::new();
        for (id, rec) in self.book.recent_since(since_ns) {
            if let Some(n) = rec.biggest_neighbour()
                && self.neighbours_asked.insert(id)
            {
                ask.push((rec.victim.pid, n.pid));
            }
        }
        ask
    }

    fn changed(&mut self, id: i64, out: &mut Outputs) {
        if let Some(rec) = self.book.get(id) {
            out.push(changed(id, rec));
        }
    }
}

fn changed(id: i64, rec: &KillRecord) -> Output {
    Output::KillChanged {
        id,
        record: Box::new(rec.clone()),
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{EventHeader, SignalKill, kind};

    use super::*;
    use crate::{
        collect::decode::comm,
        correlate::fixtures::{CLOCK, START_NS, World, report, victim_event},
        recorder::features::test_env,
    };

    /// Commits what is queued as the journal would, with ids from `next`.
    fn commit(k: &mut Kills, next: &mut i64) -> Vec<i64> {
        k.take_queued()
            .into_iter()
            .map(|rec| {
                *next += 1;
                k.committed(*next, rec);
                *next
            })
            .collect()
    }

    fn changed(out: &[Output]) -> Vec<(i64, &KillRecord)> {
        out.iter()
            .filter_map(|o| match o {
                Output::KillChanged { id, record } => Some((*id, record.as_ref())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_report_after_the_commit_changes_the_stored_kill() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let t = 5_000_000_000;
        k.on_victim(&mut test_env(&mut w), &victim_event(42, t as u64), t, t);
        assert_eq!(k.queued(), 1);
        let ids = commit(&mut k, &mut 0);
        let mut out = Vec::new();
        k.on_report(
            &mut test_env(&mut w),
            report(42, "/job", 5_000_300),
            t + 1_000_000,
            &mut out,
        );
        let c = changed(&out);
        assert_eq!(c.len(), 1, "{out:?}");
        let (id, rec) = c[0];
        assert_eq!(id, ids[0]);
        assert_eq!(rec.victim.memcg.as_deref(), Some("/job"));
        assert_eq!(rec.source.to_string(), "tracepoint+kmsg");
    }

    #[test]
    fn a_mark_with_no_sigkill_before_it_is_a_kill_only_if_its_line_comes() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        k.set_sees_kernel_kills(true);
        let t = 5_000_000_000;
        // Marked while already exiting: no SIGKILL before, no line after.
        k.on_victim(&mut test_env(&mut w), &victim_event(50, t as u64), t, t);
        // Its SIGKILL seen: a kill at once.
        let mut seen = victim_event(51, t as u64);
        seen.present |= victim_field::KILL_SEEN;
        k.on_victim(&mut test_env(&mut w), &seen, t, t);
        assert_eq!(k.queued(), 1);
        // No SIGKILL matched, but its "Killed process" line comes: a kill.
        k.on_victim(&mut test_env(&mut w), &victim_event(52, t as u64), t, t);
        let mut out = Vec::new();
        k.on_report(
            &mut test_env(&mut w),
            report(52, "/a", 5_000_100),
            t + 1_000_000,
            &mut out,
        );
        let q = k.take_queued();
        let pids: Vec<u32> = q.iter().map(|r| r.victim.pid).collect();
        assert_eq!(pids, [51, 52]);
        assert_eq!(q[1].source.to_string(), "tracepoint+kmsg");
        assert_eq!(q[1].victim.memcg.as_deref(), Some("/a"));
        // The first is no kill once its wait is over.
        k.settle_unmatched(
            &test_env(&mut w),
            t + UNSIGNALLED_WAIT_NS - 1,
            false,
            |_, _, _| false,
        );
        assert_eq!((k.queued(), k.marks_without_kill), (0, 0), "still waiting");
        k.settle_unmatched(
            &test_env(&mut w),
            t + UNSIGNALLED_WAIT_NS,
            false,
            |_, _, _| false,
        );
        assert_eq!((k.queued(), k.marks_without_kill), (0, 1));
    }

    /// The exec of a killed program read after its kill: a kill still
    /// queued for its commit is stored with the command line, a committed
    /// one is stored again with it.
    #[test]
    fn an_exec_read_after_the_kill_names_it_queued_or_committed() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let t = 5_000_000_000;
        let exec = |w: &mut World, pid: u32, args: &str| {
            let ts = t - 1_000_000;
            w.model
                .on_exec(pid, "hog", ("/bin/hog", Some(args.into())), 0, ts, None);
            ts
        };
        // Committed: changed, and handed on.
        k.on_victim(&mut test_env(&mut w), &victim_event(42, t as u64), t, t);
        let ids = commit(&mut k, &mut 0);
        assert_eq!(k.book.get(ids[0]).unwrap().victim.cmdline, None);
        let ts = exec(&mut w, 42, "hog --a");
        let mut out = Vec::new();
        k.on_late_exec(&test_env(&mut w), 42, ts, &mut out);
        let c = changed(&out);
        assert_eq!(c.len(), 1, "{out:?}");
        assert_eq!(c[0].1.victim.cmdline.as_deref(), Some("hog --a"));
        // Queued (a kill a report completed, not committed yet): filled in
        // place, nothing handed on before its commit.
        k.on_victim(&mut test_env(&mut w), &victim_event(43, t as u64), t, t);
        assert_eq!(k.queued(), 1);
        let ts = exec(&mut w, 43, "hog --b");
        let mut out = Vec::new();
        k.on_late_exec(&test_env(&mut w), 43, ts, &mut out);
        assert!(changed(&out).is_empty(), "{out:?}");
        let rec = k.take_queued().pop().expect("queued");
        assert_eq!(rec.victim.cmdline.as_deref(), Some("hog --b"));
        assert_eq!(rec.victim.exe.as_deref(), Some("/bin/hog"));
    }

    #[test]
    fn a_report_before_the_victim_event_is_claimed_at_the_kill() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let mut out = Vec::new();
        k.on_report(
            &mut test_env(&mut w),
            report(7, "/a", 5_000_000),
            5_000_000_100,
            &mut out,
        );
        assert!(out.is_empty(), "no kill to join yet: {out:?}");
        let t = 5_000_000_050;
        k.on_victim(&mut test_env(&mut w), &victim_event(7, t as u64), t, t);
        let rec = k.take_queued().pop().expect("queued");
        assert_eq!(rec.victim.memcg.as_deref(), Some("/a"));
        k.settle_unmatched(&test_env(&mut w), i64::MAX, true, |_, _, _| false);
        assert_eq!(k.queued(), 0, "the report was claimed, not left over");
    }

    #[test]
    fn an_unclaimed_report_becomes_a_log_only_kill_unless_the_store_has_it() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let mut out = Vec::new();
        k.on_report(
            &mut test_env(&mut w),
            report(77, "/x", 8_000_000),
            9_000_000_000,
            &mut out,
        );
        k.on_report(
            &mut test_env(&mut w),
            report(78, "/y", 8_100_000),
            9_000_000_000,
            &mut out,
        );
        let mut asked = Vec::new();
        k.settle_unmatched(&test_env(&mut w), i64::MAX, true, |pid, _, _| {
            asked.push(pid);
            pid == 78
        });
        assert_eq!(asked, [77, 78]);
        let queued = k.take_queued();
        assert_eq!(queued.len(), 1);
        assert_eq!(queued[0].victim.pid, 77);
        assert_eq!(queued[0].source.to_string(), "kmsg");
        assert_eq!(k.kmsg_only, 1);
    }

    #[test]
    fn an_oom_group_announced_before_its_first_kill_joined_waits_for_it() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let t = 5_000_000_000;
        k.on_victim(&mut test_env(&mut w), &victim_event(42, t as u64), t, t);
        commit(&mut k, &mut 10);
        let mut out = Vec::new();
        let g = OomGroup {
            ts_us: 5_000_400,
            cgroup: "/job".into(),
        };
        k.on_oom_group(g, &CLOCK, &mut out);
        assert!(out.is_empty(), "the kill has no report yet: {out:?}");
        k.on_report(
            &mut test_env(&mut w),
            report(42, "/job", 5_000_300),
            t + 1_000_000,
            &mut out,
        );
        let c = changed(&out);
        assert_eq!(c.len(), 2, "the join, then the group: {out:?}");
        assert_eq!(c[1].1.oom_group.as_deref(), Some("/job"));
        assert_eq!(c[1].0, 11);
    }

    #[test]
    fn reaping_changes_a_committed_kill_and_says_so() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let t = 5_000_000_000;
        k.on_victim(&mut test_env(&mut w), &victim_event(42, t as u64), t, t);
        let ids = commit(&mut k, &mut 0);
        let mut out = Vec::new();
        let reap = tracer_common::Reap {
            header: EventHeader {
                kind: kind::REAP_START,
                pid: 42,
                ..Default::default()
            },
            victim_pid: 42,
            ..Default::default()
        };
        k.on_reap(&reap, t + 10, &mut out);
        let c = changed(&out);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, ids[0]);
        assert_eq!(
            c[0].1.reaping.as_ref().and_then(|r| r.start_ns),
            Some(t + 10)
        );
    }

    #[test]
    fn userspace_sigkills_past_the_rate_fold_into_one_aggregate() {
        let mut w = World::default();
        let mut k = Kills::new(START_NS);
        let mut stored = 0;
        let mut folded = 0;
        for i in 0..2_000u32 {
            let s = SignalKill {
                header: EventHeader {
                    kind: kind::SIGNAL_KILL,
                    pid: 1000,
                    comm: comm("killer"),
                    ..Default::default()
                },
                target_pid: 50_000 + i,
                target_comm: comm("victim"),
                ..Default::default()
            };
            let ts = 5_000_000_000 + i64::from(i) * 100_000;
            match k.on_signal(&mut test_env(&mut w), &s, ts, ts) {
                Signal::Stored => stored += 1,
                Signal::Folded => folded += 1,
            }
        }
        assert!(folded > 1_000, "stored {stored}, folded {folded}");
        assert_eq!(k.queued() as u64, stored);
        k.take_queued();
        assert!(k.storms_due(i64::MAX, true) >= 1);
        let agg = k.take_queued();
        let n: u64 = agg
            .iter()
            .filter_map(|r| r.aggregate.as_ref().map(|a| a.count))
            .sum();
        assert_eq!(n, folded);
        assert_eq!(k.folded(), folded);
    }
}
