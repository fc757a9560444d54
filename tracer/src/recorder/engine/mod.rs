//! The recorder's engine: one thread that owns the process model and the
//! cgroup sampler, routes each input to the features in a fixed order, and
//! hands what they make to the journal (kills durably first). It consumes
//! the readers' channels (the OOM ring first) and a once-a-second tick.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};

use super::{
    features::{
        Env,
        cuda::Cuda,
        gpu::Gpu,
        kills::{Kills, Signal},
        warnings::Warnings,
    },
    fold::CallFold,
    heap::HeapWorker,
    journal::Journal,
    metrics::Metrics,
    output::{Output, Outputs},
    upkeep::Upkeep,
};
use crate::{
    collect::{
        decode::{Event, c_str},
        kmsg::KmsgEvent,
    },
    model::{ProcessTable, StartTime, proc::LiveProc, sampler::Sampler},
    probes::{MemcgCounters, growth::GrowthMaps, watch::LibraryWatcher},
    record::published::Published,
    store::{EventRow, StoreError},
    util::time::{Clock, wall_now_ns},
};

pub use super::summary::EngineSummary;
pub use parts::{EngineOptions, Inputs, Parts};

mod parts;

/// Events taken from one queue in one batch, at most: the loop then looks
/// at its other branches (stop, the tick) before the next batch, however
/// fast a storm refills the queue.
const MAX_BATCH: usize = 1024;
/// How long GPU OOMs and kills wait for the CUDA calls before them.
const GPU_SETTLE: Duration = Duration::from_millis(30);
/// Live process entries checked against /proc per tick (one stat read
/// each, some 10 us): a node of 2,000 processes is gone over in 16 ticks.
const AUDIT_PER_TICK: usize = 128;
/// Every this many ticks, each process's growth decision is taken again
/// (a limit set on a cgroup after its processes started).
const GROWTH_GENERATION_TICKS: u64 = 5;
/// How late the engine wakes for a pending /proc read (see the loop).
const READ_COALESCE_NS: i64 = 50_000_000;

/// The engine.
pub struct Engine {
    journal: Journal,
    upkeep: Upkeep,
    model: ProcessTable,
    sampler: Sampler,
    clock: Clock,
    opts: EngineOptions,
    memcg: Option<MemcgCounters>,
    kills: Kills,
    cuda: Option<Cuda>,
    gpu: Gpu,
    warnings: Warnings,
    watcher: Option<LibraryWatcher>,
    heap: Option<HeapWorker>,
    growth: Option<GrowthMaps>,
    published: Option<Arc<Published>>,
    /// Forks and exits past a parent's allowance, folded.
    proc_fold: CallFold,
    /// What the features made, for the journal.
    out: Outputs,
    summary: EngineSummary,
    ticks: u64,
    metrics: Arc<Metrics>,
}

/// The features' view of the node, borrowed from the engine's fields.
macro_rules! env {
    ($s:ident) => {
        Env {
            clock: &$s.clock,
            model: &mut $s.model,
            sampler: &$s.sampler,
            session_id: $s.journal.session_id(),
            procs: &LiveProc,
        }
    };
}

// After the macro: the engine's other files use it.
mod commit;
mod stop;

impl Engine {
    /// An engine made of `p`.
    pub fn new(p: Parts) -> Self {
        let sampler = Sampler::new(
            p.model.layout().clone(),
            crate::correlate::LEADUP_NS + 5_000_000_000,
            p.opts.scan_items.clone(),
        );
        let now = wall_now_ns();
        let mut kills = Kills::new(now);
        kills.set_started(p.started_ns);
        Self {
            journal: Journal::new(
                p.store,
                p.session_id,
                p.exporters,
                p.spill,
                p.metrics.clone(),
                p.published.clone(),
            ),
            upkeep: Upkeep::new(p.opts.retention, p.opts.max_store_bytes, p.drops, now),
            model: p.model,
            sampler,
            clock: Clock::now(),
            opts: p.opts,
            memcg: p.memcg,
            kills,
            cuda: p.cuda.then(|| Cuda::new(p.published.clone())),
            gpu: Gpu::new(p.nvml_missing, p.sample_now, p.published.clone()),
            warnings: Warnings::new(p.warn, p.pressure),
            watcher: p.watcher,
            heap: p.heap,
            growth: p.growth,
            published: p.published,
            proc_fold: CallFold::default(),
            out: Vec::new(),
            summary: EngineSummary {
                session_id: p.session_id,
                ..Default::default()
            },
            ticks: 0,
            metrics: p.metrics,
        }
    }

    /// Runs until every input closes; `ready` fires once the model is seeded
    /// and the first sample taken.
    pub async fn run(
        mut self,
        mut inputs: Inputs,
        ready: oneshot::Sender<()>,
    ) -> Result<EngineSummary, StoreError> {
        self.model.seed();
        let r = self.tick();
        self.step(r)?;
        let _ = ready.send(());
        let mut tick = tokio::time::interval(self.opts.sample_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first sample was just taken: the next one is a period away.
        tick.reset();
        let (mut oom_open, mut crit_open, mut data_open, mut kmsg_open) = (true, true, true, true);
        let mut settle_due: Option<tokio::time::Instant> = None;
        let mut nvml_rx = inputs.gpu.take();
        let mut stop_at = None;
        while oom_open || crit_open || data_open || kmsg_open {
            let mut stop = false;
            // New programs' /proc reads fall due on their own, not only
            // when the next event comes; a little late, so that one wakeup
            // reads the programs of a burst together.
            let read_due = self.model.next_read_ns().map(|t| {
                let wait = (t + READ_COALESCE_NS - wall_now_ns()).max(0) as u64;
                tokio::time::Instant::now() + Duration::from_nanos(wait)
            });
            let cuda = self.cuda.is_some();
            let result: Result<(), StoreError> = tokio::select! {
                // Stop first, the tick before bulk events: under a storm the
                // kill and log queues are never empty, and a branch polled
                // after them would never be reached (a recorder that did
                // not stop on SIGTERM during an OOM storm).
                biased;
                _ = inputs.stop.changed() => {
                    stop = true;
                    stop_at = Some(std::time::Instant::now());
                    self.drain_for_stop(&mut inputs)
                }
                ev = inputs.oom.recv(), if oom_open => match ev {
                    Some(ev) => self.on_kill_batch(ev, &mut inputs.oom, &inputs.stop).map(|killed| {
                        if cuda && killed && settle_due.is_none() {
                            settle_due = Some(tokio::time::Instant::now() + GPU_SETTLE);
                        }
                    }),
                    None => {
                        oom_open = false;
                        Ok(())
                    }
                },
                ev = inputs.critical.recv(), if crit_open => match ev {
                    Some(ev) => self.on_kill_batch(ev, &mut inputs.critical, &inputs.stop).map(|killed| {
                        let ooms = self.cuda.as_ref().is_some_and(Cuda::has_ooms);
                        if cuda && (killed || ooms) && settle_due.is_none() {
                            settle_due = Some(tokio::time::Instant::now() + GPU_SETTLE);
                        }
                    }),
                    None => {
                        crit_open = false;
                        Ok(())
                    }
                },
                ev = inputs.kmsg.recv(), if kmsg_open => match ev {
                    Some(ev) => self.on_kmsg_batch(ev, &mut inputs.kmsg),
                    None => {
                        kmsg_open = false;
                        Ok(())
                    }
                },
                _ = tick.tick() => self.tick(),
                ev = inputs.data.recv(), if data_open => match ev {
                    Some(ev) => self.on_event(ev).and_then(|()| self.apply()),
                    None => {
                        data_open = false;
                        Ok(())
                    }
                },
                s = recv_opt(&mut nvml_rx), if nvml_rx.is_some() => match s {
                    Some(s) => self.on_gpu_sample(s),
                    None => {
                        nvml_rx = None;
                        Ok(())
                    }
                },
                _ = sleep_until(settle_due), if settle_due.is_some() => {
                    settle_due = None;
                    self.settle_gpu(&mut inputs.data)
                }
                _ = sleep_until(read_due), if read_due.is_some() => {
                    self.model.read_due(wall_now_ns());
                    Ok(())
                }
            };
            if let Err(e) = result {
                self.journal.survive(e)?;
            }
            if stop {
                break;
            }
        }
        self.finish(stop_at.unwrap_or_else(std::time::Instant::now))
    }

    /// A step's result: a full file system is survived.
    fn step(&mut self, r: Result<(), StoreError>) -> Result<(), StoreError> {
        r.or_else(|e| self.journal.survive(e))
    }

    /// What the features made so far, to the journal.
    fn apply(&mut self) -> Result<(), StoreError> {
        self.journal.apply(&mut self.out)
    }

    /// Kernel log records, with whatever else is already queued; the
    /// backlog found at start is stored at once, in one commit.
    fn on_kmsg_batch(
        &mut self,
        first: KmsgEvent,
        rx: &mut mpsc::Receiver<KmsgEvent>,
    ) -> Result<(), StoreError> {
        self.on_kmsg(first);
        for _ in 0..MAX_BATCH {
            let Ok(ev) = rx.try_recv() else { break };
            self.on_kmsg(ev);
        }
        self.apply()?;
        if self.kills.has_backlog() {
            self.settle_unmatched(wall_now_ns(), false)?;
        }
        Ok(())
    }

    /// A kernel log record, to the feature it belongs to.
    fn on_kmsg(&mut self, ev: KmsgEvent) {
        let now = wall_now_ns();
        match ev {
            KmsgEvent::Report(r) => self.kills.on_report(&env!(self), *r, now, &mut self.out),
            KmsgEvent::Xid(x) => {
                let ts = self.clock.kmsg_to_wall(x.ts_us);
                self.gpu.on_xid(x, ts, &mut self.out);
            }
            KmsgEvent::Reaped(_) => {}
            KmsgEvent::OomGroup(g) => self.kills.on_oom_group(g, &self.clock, &mut self.out),
        }
    }

    /// The CUDA calls before a GPU OOM or a kill come on the data ring (its
    /// reader was nudged): they are taken in first, so ledgers are as of
    /// the failure or the kill.
    fn settle_gpu(&mut self, data: &mut mpsc::Receiver<Event>) -> Result<(), StoreError> {
        while let Ok(ev) = data.try_recv() {
            self.on_event(ev)?;
        }
        self.apply()?;
        self.commit_gpu_ooms()?;
        self.refresh_kill_gpu()
    }

    /// Recording into the spill store, and the store's file system has
    /// room again: the journal goes home, and the features follow the
    /// rows that moved.
    fn go_home(&mut self) {
        let Some(imported) = self.journal.go_home() else {
            return;
        };
        let session = self.journal.session_id();
        self.summary.session_id = session;
        self.kills.moved(&imported.kill_ids, session);
        self.gpu.moved(&imported.gpu_oom_ids, session);
    }

    /// An event of a ring that carries kills, with whatever else is already
    /// queued behind it: all of it in one durable commit. Returns whether a
    /// kill was committed.
    fn on_kill_batch(
        &mut self,
        first: Event,
        rx: &mut mpsc::Receiver<Event>,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<bool, StoreError> {
        self.on_event(first)?;
        for _ in 0..MAX_BATCH {
            // A stop asked meanwhile is answered first (the drain reads
            // the rest), not after a storm's full batch.
            if stop.has_changed().unwrap_or(true) {
                break;
            }
            let Ok(ev) = rx.try_recv() else { break };
            self.on_event(ev)?;
        }
        let committed = self.commit_kills()?;
        // A storm's aggregates are stored when their window ends, not at
        // the next tick (up to a period later).
        self.commit_storms(wall_now_ns(), false)?;
        self.apply()?;
        Ok(committed)
    }

    /// One ring event, routed: heap samples to the heap worker, CUDA calls
    /// to the CUDA feature, kills to the kills feature, the lives of
    /// processes to the model, the watcher, the heap worker, the CUDA
    /// ledgers and the kills (in that order). What they make waits in
    /// `out` for the journal.
    fn on_event(&mut self, ev: Event) -> Result<(), StoreError> {
        Metrics::add(&self.metrics.events, 1);
        let clock = &self.clock;
        let wall = |ts_boot: u64| clock.boot_to_wall(ts_boot);
        match ev {
            Event::Cuda(c) => {
                if let Some(cuda) = &mut self.cuda {
                    let env = env!(self);
                    let ev = Event::Cuda(c);
                    cuda.on_call(&env, &c, &ev, |e| row_of(env.clock, e), &mut self.out);
                }
                return Ok(());
            }
            Event::Usdt(u) => {
                if let Some(cuda) = &mut self.cuda {
                    cuda.on_block(&u, wall(u.header.ts_boot_ns));
                }
                return Ok(());
            }
            // Heap samples go to the heap worker's thread, not the store:
            // no row is made for them.
            Event::HeapAlloc(a) => {
                if let Some(h) = &self.heap {
                    let ts = wall(a.header.ts_boot_ns).max(0) as u64;
                    h.alloc(a, ts);
                }
                return Ok(());
            }
            Event::HeapFree(f) => {
                if let Some(h) = &self.heap {
                    h.free(&f);
                }
                return Ok(());
            }
            Event::GrowthFault(s) => {
                if let Some(h) = &self.heap {
                    let ts = wall(s.header.ts_boot_ns).max(0) as u64;
                    h.fault(s, ts);
                }
                return Ok(());
            }
            Event::OomTip(s) => {
                // Its task's maps are read at once, off this thread: the
                // task may be stuck in the OOM it set off, holding its
                // memory map lock.
                if let Some(h) = &self.heap {
                    h.tip(s);
                }
                return Ok(());
            }
            _ => {}
        }
        let mut row = row_of(&self.clock, &ev);
        let now = wall_now_ns();
        // Forks and exits past their parent's allowance are counted, not
        // stored.
        let mut stored = true;
        match &ev {
            Event::OomVictim(v) => self.kills.on_victim(&mut env!(self), v, row.ts_ns, now),
            Event::SignalKill(s) => {
                stored = self.kills.on_signal(&mut env!(self), s, row.ts_ns, now) == Signal::Stored;
            }
            Event::Reap(r) => self.kills.on_reap(r, row.ts_ns, &mut self.out),
            Event::Exec(e) => {
                let args = crate::collect::decode::exec_cmdline(e);
                self.model.on_exec(
                    e.pid,
                    &c_str(&e.header.comm),
                    (&c_str(&e.filename), args),
                    e.memcg_id,
                    row.ts_ns,
                    StartTime::kernel(e.start_ns),
                );
                self.model.read_due(row.ts_ns);
                self.kills
                    .on_late_exec(&env!(self), e.pid, row.ts_ns, &mut self.out);
                if let Some(w) = &self.watcher {
                    w.on_exec(e.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exec(e.pid);
                }
            }
            Event::Fork(f) => {
                stored = self.admit_churn(super::fold::FORKS, u64::from(f.header.pid), &row);
                self.model.on_fork_at(
                    f.header.pid,
                    f.child_pid,
                    &c_str(&f.header.comm),
                    row.ts_ns,
                    StartTime::kernel(f.child_start_ns),
                );
                if let Some(w) = &self.watcher {
                    w.on_fork(f.child_pid);
                }
            }
            Event::Exit(x) => {
                // By name: an exit often comes before its fork (the two
                // rings are read apart), so its parent is not known yet.
                let name = crate::util::fnv1a(&x.header.comm);
                stored = self.admit_churn(super::fold::EXITS, name, &row);
                self.model
                    .on_exit(x.pid, row.ts_ns, StartTime::kernel(x.start_ns));
                self.model.read_due(row.ts_ns);
                if let Some(w) = &self.watcher {
                    w.on_exit(x.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exit(x.pid, row.ts_ns.max(0) as u64);
                }
                if let Some(cuda) = &mut self.cuda {
                    cuda.on_exit(x.pid, row.ts_ns, &mut self.out);
                }
                if x.rss_known != 0 {
                    self.kills
                        .on_exit_memory(x, crate::util::sys::page_kb(), &mut self.out);
                }
            }
            Event::MemcgOom(m) => {
                let path = self.model.memcg_by_id(m.memcg_id, false);
                row.data["memcg_path"] = path.into();
            }
            Event::Cuda(_)
            | Event::Usdt(_)
            | Event::HeapAlloc(_)
            | Event::HeapFree(_)
            | Event::GrowthFault(_)
            | Event::OomTip(_) => unreachable!("routed above"),
        }
        if stored {
            self.out.push(Output::Event(row));
        }
        Ok(())
    }

    /// Whether a fork of `parent`'s (or an exit of a process named `name`,
    /// hashed) is within the allowance of its window, and so stored; past
    /// it, it is counted.
    fn admit_churn(&mut self, kind: u32, key: u64, row: &EventRow) -> bool {
        let mut closed = Vec::new();
        let admitted = self.proc_fold.admit_some(
            (0, kind, key, 0),
            row.ts_ns,
            super::fold::PROC_ALLOWANCE,
            || row.clone(),
            &mut closed,
        );
        self.out.extend(closed.into_iter().map(Output::Event));
        admitted
    }

    /// Stores the summaries of the windows of identical failed calls and of
    /// process churn that ended before `now_ns`.
    fn close_call_windows(&mut self, now_ns: i64) {
        if let Some(cuda) = &mut self.cuda {
            cuda.close_windows(now_ns, &mut self.out);
            self.summary.folded_calls = cuda.folded();
        }
        let mut closed = Vec::new();
        self.proc_fold.close(now_ns, &mut closed);
        self.out.extend(closed.into_iter().map(Output::Event));
        self.summary.folded_procs = self.proc_fold.folded;
    }

    /// An NVML sample: the new GPU picture, folded into the timeline.
    fn on_gpu_sample(&mut self, s: crate::nvml::GpuSample) -> Result<(), StoreError> {
        let traced = self
            .cuda
            .as_ref()
            .map(|c| &c.ledgers as &dyn crate::correlate::gpuview::TracedMemory);
        let env = env!(self);
        let took = s.took_us;
        let rows = self.gpu.on_sample(&env, s, traced, &mut self.out);
        Metrics::set(&self.metrics.nvml_samples, self.gpu.samples);
        Metrics::set(&self.metrics.nvml_last_us, took);
        if let Some(rows) = rows {
            self.summary.timeline_rows += self.journal.timeline(rows)?;
        }
        self.apply()
    }

    fn tick(&mut self) -> Result<(), StoreError> {
        let t0 = wall_now_ns();
        self.tick_inner()?;
        tracing::debug!("tick took {} us", (wall_now_ns() - t0) / 1000);
        Ok(())
    }

    /// The tick: the model's due reads, the cgroup samples, what is
    /// published of them, the warnings, the drops, the kills that fall
    /// due, the late enrichments, then the store's upkeep.
    fn tick_inner(&mut self) -> Result<(), StoreError> {
        self.ticks += 1;
        let now = wall_now_ns();
        self.model.read_due(now);
        let per_min = (60.0 / self.opts.sample_interval.as_secs_f64())
            .ceil()
            .max(1.0) as u64;
        if self.ticks.is_multiple_of(per_min) {
            self.clock = Clock::now();
        }
        let counters = self.memcg.as_ref().map(|m| m.read()).unwrap_or_default();
        let mut paths: BTreeSet<String> = self.model.memcgs_in_use();
        paths.extend(self.opts.cgroups.iter().cloned());
        self.sampler
            .sample(paths.iter().map(String::as_str), &counters, now);
        if let Some(p) = &self.published {
            p.memcg.set(super::gauges::container_memcgs(
                &self.model,
                &self.sampler,
                &paths,
                now,
            ));
            if let Some(cuda) = &self.cuda {
                p.cuda
                    .set(super::gauges::container_cuda(&self.model, &cuda.ledgers));
            }
        }
        let named = self.model.kube_named();
        if named > 0 {
            tracing::debug!("{named} pod(s) and container(s) named from the node's files");
        }
        let since = now - 2 * self.opts.sample_interval.as_nanos() as i64;
        let env = env!(self);
        self.warnings.heap_on_pressure(
            &env,
            self.watcher.as_ref(),
            &paths,
            (since, now),
            &mut self.out,
        );
        self.warnings.early(&env, &paths, now, &mut self.out);
        self.out.extend(self.upkeep.read_drops(now, &self.metrics));
        self.apply()?;
        self.commit_storms(now, false)?;
        self.refresh_kill_growth()?;
        if let Some(g) = &mut self.growth
            && self.ticks.is_multiple_of(GROWTH_GENERATION_TICKS)
            && let Err(e) = g.new_generation()
        {
            tracing::warn!("growth: cannot renew the decisions: {e}");
        }
        self.go_home();
        // Kernel SIGKILLs of processes by themselves no OOM kill claimed.
        self.commit_self_kills(now)?;
        // Kills held while the file system was full.
        self.commit_kills()?;
        self.upkeep.reserve(&mut self.journal);
        self.close_call_windows(now);
        self.apply()?;
        self.journal.flush()?;
        self.kills.prune(now);
        self.settle_unmatched(now, false)?;
        self.model.prune(now);
        // Entries whose exit was lost (a full ring) are found within a
        // round of the live entries; the cost per tick is bounded.
        let retired = self.model.audit(now, AUDIT_PER_TICK);
        if retired > 0 {
            tracing::debug!("{retired} processes found ended without their exit");
        }
        if let Some(cuda) = &mut self.cuda {
            cuda.tick(now, &mut self.out);
            self.apply()?;
        }
        self.upkeep
            .tick(&mut self.journal, now, self.ticks % per_min == 1)
    }
}

/// The store's row of an event.
fn row_of(clock: &Clock, ev: &Event) -> EventRow {
    let h = ev.header();
    EventRow {
        ts_ns: clock.boot_to_wall(h.ts_boot_ns),
        kind: ev.kind().name().into(),
        pid: h.pid,
        tid: h.tid,
        comm: c_str(&h.comm),
        data: ev.details(),
    }
}

/// Sleeps until `t` (a branch guard keeps `None` from being polled).
async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Receives from an optional channel (a branch guard keeps `None` from being polled).
async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
