//! The recorder's engine: one thread that owns the process model and the
//! cgroup sampler, routes each input to the features in a fixed order, and
//! hands what they make to the journal (kills durably first). It consumes
//! the readers' channels (the OOM ring first) and a once-a-second tick.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};

use super::{
    features::{
        arming::Armer,
        cuda::Cuda,
        gpu::Gpu,
        kills::{Kills, Signal},
        warnings::Warnings,
    },
    fold::CallFold,
    heap_worker::HeapWorker,
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
    model::{ProcessTable, StartTime, sampler::Sampler},
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
/// Most live process entries checked against /proc per tick (one stat
/// read each, some 10 us): a round takes some ten ticks
/// (`model::AUDIT_ROUND_CALLS`), a node of 2,000 processes 16.
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
    /// Growth attribution on risk: which cgroups are armed.
    armer: Option<Armer>,
    /// Slow leaks.
    leaks: crate::recorder::features::leaks::LeakWatch,
    /// Pictures of cgroups as they arm.
    pictures: crate::recorder::features::picture::Pictures,
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
        $crate::recorder::features::Env {
            clock: &$s.clock,
            model: &mut $s.model,
            sampler: &$s.sampler,
            session_id: $s.journal.session_id(),
            procs: &$crate::model::proc::LiveProc,
        }
    };
}

// After the macro: the engine's other files use it.
mod commit;
mod route;
mod stop;
mod tick;

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
        kills.set_sees_kernel_kills(p.opts.sees_kernel_kills);
        let leaks = crate::recorder::features::leaks::LeakWatch::new(
            p.opts.leak_step,
            p.opts.leak_min_span,
        );
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
            armer: p
                .arming
                .filter(|_| p.growth.as_ref().is_some_and(|g| g.hooks.is_some())),
            growth: p.growth,
            leaks,
            pictures: crate::recorder::features::picture::Pictures::new(p.heap_family),
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
        let mut journal_rx = inputs.journal.take();
        let mut stop_at = None;
        // Memory cgroups rising toward the growth arming level are read
        // between ticks (`--growth risk`), and pictures in progress moved
        // on; the deadline is kept across iterations so that a stream of
        // events does not push it back.
        let mut watch_at: Option<tokio::time::Instant> = None;
        while oom_open || crit_open || data_open || kmsg_open {
            if watch_at.is_none()
                && (self.armer.as_ref().is_some_and(Armer::watching) || self.pictures.busy())
            {
                watch_at = Some(
                    tokio::time::Instant::now()
                        + Duration::from_nanos(crate::correlate::arming::WATCH_NS as u64),
                );
            }
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
                    Some(crate::nvml::FromNvml::Sample(s)) => self.on_gpu_sample(s),
                    Some(crate::nvml::FromNvml::Xid { xid, ts_ns }) => {
                        self.gpu.on_xid(xid, ts_ns, &mut self.out);
                        self.late_gpu_deaths();
                        self.apply()
                    }
                    None => {
                        nvml_rx = None;
                        Ok(())
                    }
                },
                l = recv_opt(&mut journal_rx), if journal_rx.is_some() => match l {
                    Some(l) => {
                        self.kills.on_logged(l.ts_ns, l.said, &mut self.out);
                        self.apply()
                    }
                    None => {
                        journal_rx = None;
                        Ok(())
                    }
                },
                _ = sleep_until(settle_due), if settle_due.is_some() => {
                    settle_due = None;
                    self.settle_gpu(&mut inputs.data)
                }
                _ = sleep_until(watch_at), if watch_at.is_some() => {
                    watch_at = None;
                    self.watch_arming();
                    Ok(())
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

    /// Reads the cgroups watched for growth arming between ticks.
    fn watch_arming(&mut self) {
        if let (Some(armer), Some(maps)) = (&mut self.armer, &mut self.growth) {
            armer.watch(self.model.layout(), maps, wall_now_ns(), &mut self.out);
        }
        let now = wall_now_ns();
        self.start_pictures(now);
        // A picture ends its window and takes its answers at this pace
        // too, not only at the tick: a kill a second or two after arming
        // has it.
        if self.pictures.busy() {
            self.tick_pictures(now);
        }
    }

    /// Pictures in progress: windows that ended ask the worker, answers
    /// that came are kept.
    fn tick_pictures(&mut self, now: i64) {
        let env = env!(self);
        let warnings = &self.warnings;
        self.pictures.tick(
            &env,
            self.heap.as_ref(),
            self.watcher.as_ref(),
            |p| warnings.heap_traced(p),
            now,
            &mut self.out,
        );
    }

    /// Cgroups that armed start their pictures.
    fn start_pictures(&mut self, now: i64) {
        let Some(armer) = &mut self.armer else { return };
        for path in armer.take_armed() {
            let held = self.warnings.heap_traced(&path);
            self.pictures.armed(&path, now, self.watcher.as_ref(), held);
        }
    }

    /// A step's result: a full file system is survived.
    fn step(&mut self, r: Result<(), StoreError>) -> Result<(), StoreError> {
        r.or_else(|e| self.journal.survive(e))
    }

    /// What the features made so far, to the journal.
    fn apply(&mut self) -> Result<(), StoreError> {
        self.journal.apply(&mut self.out)
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
