//! The recorder's engine: one thread that owns the process model, the
//! cgroup sampler, the correlation of kills and the store. It consumes the
//! readers' channels (critical first) and a once-a-second tick.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use tracer_common::{CudaCall, cuda};

use std::sync::Arc;

use super::{cuda::GpuTracker, metrics::Metrics};
use crate::correlate::{
    Context, KillEnricher,
    gpuview::TracedMemory,
    join::{JOIN_WINDOW_NS, Reports},
    kill_from_report, kill_from_signal, kill_from_victim,
    kills::KillBook,
    merge_report,
    timeline::{AGED_RES_S, DOWNSAMPLE_AFTER_NS, FRESH_RES_S, Window},
};
use crate::export::{Exported, Exporters};
use crate::record::{Gap, GpuView, KillRecord, MemcgSource, WarningReason, WarningState};
use crate::util::term::escape;
use crate::{
    collect::{
        decode::{Event, c_str},
        kmsg::KmsgEvent,
    },
    model::{ProcessTable, StartTime, proc::LiveProc, sampler::Sampler},
    probes::{DropCounters, Drops, MemcgCounters},
    store::{DropRow, EventRow, Store, StoreError},
    util::time::{Clock, wall_now_ns},
};

/// Events taken from one queue in one batch, at most: the loop then looks
/// at its other branches (stop, the tick) before the next batch, however
/// fast a storm refills the queue.
const MAX_BATCH: usize = 1024;

/// CUDA allocations at least this large are stored as events.
const NOTABLE_CUDA_BYTES: u64 = 64 << 20;
/// How long GPU OOMs and kills wait for the CUDA calls before them.
const GPU_SETTLE: Duration = Duration::from_millis(30);
/// Events buffered before a write.
const EVENT_BUFFER: usize = 4096;
/// How long the engine keeps taking in queued events once asked to stop
/// (OOM kills are all taken in whatever this says): the recorder stops
/// within 2 s of SIGTERM even when a storm has filled its queues.
const STOP_DRAIN: Duration = Duration::from_millis(700);
/// At stop, the rings are read until nothing more comes for this long.
const SWEEP_QUIET: Duration = Duration::from_millis(20);
/// Live process entries checked against /proc per tick (one stat read
/// each, some 10 us): a node of 2,000 processes is gone over in 16 ticks.
const AUDIT_PER_TICK: usize = 128;
/// How long the engine's whole stop may take from the request (drain,
/// the growth worker's last reports, the last commits): the rest of the
/// 2 s is the probes' detach (a grace period, 0.3 s on a busy node) and
/// the process's exit.
const STOP_BUDGET: Duration = Duration::from_millis(1000);
/// The least time exporters get at stop to hand on what they hold.
const EXPORT_MIN: Duration = Duration::from_millis(300);
/// The least the growth worker is given to settle at stop.
const SETTLE_MIN: Duration = Duration::from_millis(100);

/// Settings of the engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Sampling period.
    pub sample_interval: Duration,
    /// Oldest data kept.
    pub retention: Duration,
    /// Largest store.
    pub max_store_bytes: u64,
    /// Memory cgroups always sampled.
    pub cgroups: Vec<String>,
    /// `enum vm_event_item` values of the reclaim scan items.
    pub scan_items: Vec<i32>,
}

/// What the engine saw, printed when the recorder stops.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineSummary {
    /// Session id.
    pub session_id: i64,
    /// Events handled.
    pub events: u64,
    /// Kills recorded.
    pub kills: u64,
    /// Kills found in the kernel log only.
    pub kmsg_only_kills: u64,
    /// Userspace kills folded into aggregate records (a SIGKILL storm).
    pub folded_kills: u64,
    /// Failed calls counted in a window of identical ones rather than
    /// stored (a process retrying `cudaMalloc` in a loop).
    pub folded_calls: u64,
    /// Forks and exits counted in a window of a parent's rather than stored
    /// (a fork storm; see `fold::PROC_ALLOWANCE`).
    pub folded_procs: u64,
    /// Items each exporter lost (its queue was full), by exporter.
    pub export_drops: Vec<(String, u64)>,
    /// Drops by ring.
    pub drops: Drops,
    /// Model counters.
    pub model: crate::model::ModelStats,
    /// Processes in the model at the end.
    pub model_entries: usize,
    /// Live processes in the model at the end.
    pub model_live: usize,
    /// What the model's entries weigh at the end, bytes (its budget:
    /// [`crate::model::BUDGET_BYTES`]).
    pub model_bytes: usize,
    /// GPU out-of-memory failures recorded.
    pub gpu_ooms: u64,
    /// NVML samples taken.
    pub nvml_samples: u64,
    /// Mean time an NVML sample took, µs.
    pub nvml_sample_us_mean: u64,
    /// Longest NVML sample, µs.
    pub nvml_sample_us_max: u64,
    /// Timeline rows written (devices and processes).
    pub timeline_rows: u64,
    /// Per kill stored on its own (the last 1,000): µs from the kernel's
    /// timestamp of the kill to the return of its durable commit. A SIGKILL
    /// storm's aggregates are not in it (stored when their window ends).
    pub kill_commit_us: Vec<u64>,
    /// The growth programs' counters (growth attribution on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<crate::probes::growth::GrowthCounts>,
    /// Heap and growth samples the worker could not take in time.
    pub growth_queue_drops: u64,
    /// Exited processes whose heap and growth state was forgotten before
    /// its time, to keep the worker's memory bounded.
    pub growth_forgotten: u64,
    /// Reads of a sampled or tipping task's maps not made because both
    /// readers were busy (perhaps stuck on tasks holding their memory map
    /// lock); the worker reads those maps itself when it unwinds.
    pub maps_reads_skipped: u64,
}

/// Every this many ticks, each process's growth decision is taken again
/// (a limit set on a cgroup after its processes started).
const GROWTH_GENERATION_TICKS: u64 = 5;

/// The channels the engine reads.
pub struct Inputs {
    /// OOM ring events (kernel OOM kills): served before anything else.
    pub oom: mpsc::Receiver<Event>,
    /// Critical ring events.
    pub critical: mpsc::Receiver<Event>,
    /// Data ring events.
    pub data: mpsc::Receiver<Event>,
    /// Kernel log reports.
    pub kmsg: mpsc::Receiver<KmsgEvent>,
    /// NVML samples (none without NVML).
    pub gpu: Option<mpsc::Receiver<crate::nvml::GpuSample>>,
    /// Set to true when the recorder is asked to stop.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Makes the critical and data readers read their rings now: at stop,
    /// what the rings still hold is read, not left behind.
    pub sweep: Vec<std::sync::Arc<tokio::sync::Notify>>,
}

/// The engine.
pub struct Engine {
    store: Store,
    model: ProcessTable,
    sampler: Sampler,
    clock: Clock,
    session_id: i64,
    opts: EngineOptions,
    drops: Option<DropCounters>,
    memcg: Option<MemcgCounters>,
    last_drops: Drops,
    last_drops_ns: i64,
    /// Kills queued for commit, and recently committed ones later events add to.
    kills: KillBook,
    gpu: Option<GpuTracker>,
    /// Attaches uprobe families (CUDA node-wide, the heap per traced
    /// process) off this thread.
    watcher: Option<crate::probes::watch::LibraryWatcher>,
    /// The heaps of the processes of `record --host-cgroup`, and the
    /// growth samples of every followed process.
    heap: Option<super::heap::HeapWorker>,
    /// The growth programs' counters and decision generation.
    growth: Option<crate::probes::growth::GrowthMaps>,
    /// Heap sampling for memory cgroups under pressure.
    pressure: Option<crate::correlate::pressure::PressureGate>,
    /// Early warnings: memory cgroups about to reach their limit.
    warn: Option<crate::correlate::warning::WarnGate>,
    gpu_ooms: Vec<CudaCall>,
    /// NVML's latest picture, joined with the model and the ledgers.
    gpu_view: Option<GpuView>,
    published: Option<Arc<crate::export::prometheus::Published>>,
    /// Why there is no GPU picture, when there is none.
    nvml_missing: Option<String>,
    /// Recent Xid errors: (PCI address as logged, note).
    xids: Vec<(String, crate::record::XidNote)>,
    /// Asks the NVML thread for a sample now.
    sample_now: Option<std::sync::mpsc::Sender<()>>,
    /// GPU OOMs waiting for an NVML sample taken after them: (id, record).
    ooms_awaiting_nvml: Vec<(i64, crate::record::GpuOomRecord)>,
    window: Window,
    /// Kernel reports no kill has claimed yet.
    reports: Reports,
    buffer: Vec<EventRow>,
    /// `memory.oom.group` announcements waiting for their first kill.
    pending_groups: Vec<crate::collect::kmsg::OomGroup>,
    summary: EngineSummary,
    ticks: u64,
    /// Userspace SIGKILLs past the rate of full records.
    storm: crate::correlate::storm::SignalStorm,
    /// Identical failed calls, folded.
    call_fold: super::fold::CallFold,
    /// Forks and exits past a parent's allowance, folded.
    proc_fold: super::fold::CallFold,
    /// The store's file system was found full (said once; cleared when
    /// there is room again).
    disk_full: bool,
    /// Counters readable at any time.
    metrics: Arc<Metrics>,
    /// Where stored records are handed on.
    exporters: Exporters,
    /// Where kills go while the store's file system is full.
    spill: super::spill::Spill,
    /// Kills re-enrichment changed, to store again (see `DIRTY_PER_TICK`).
    dirty: std::collections::BTreeSet<i64>,
    /// Kernel SIGKILLs of processes by themselves, waiting to be told from
    /// the OOM killer's.
    self_kills: crate::correlate::selfkill::SelfKills,
}

impl Engine {
    /// Hands the engine the library watcher (it tells it of execs, forks
    /// and exits, and stops it at the end).
    pub fn set_watcher(&mut self, w: crate::probes::watch::LibraryWatcher) {
        self.watcher = Some(w);
    }

    /// Warns about memory cgroups about to reach their limit.
    pub fn set_warnings(&mut self, g: crate::correlate::warning::WarnGate) {
        self.warn = Some(g);
    }

    /// Turns on heap sampling under pressure (the watcher must serve the
    /// heap family per cgroup).
    pub fn set_pressure(&mut self, g: crate::correlate::pressure::PressureGate) {
        self.pressure = Some(g);
    }

    /// Hands the engine the growth programs' maps.
    pub fn set_growth(&mut self, g: crate::probes::growth::GrowthMaps) {
        self.growth = Some(g);
    }

    /// Hands the engine the heap worker (heap and growth samples).
    pub fn set_heap(&mut self, h: super::heap::HeapWorker) {
        self.heap = Some(h);
    }

    /// A new engine writing to `store` in session `session_id`.
    pub fn new(
        store: Store,
        model: ProcessTable,
        session_id: i64,
        opts: EngineOptions,
        drops: Option<DropCounters>,
        memcg: Option<MemcgCounters>,
        gpu: Option<GpuTracker>,
    ) -> Self {
        let sampler = Sampler::new(
            model.layout().clone(),
            crate::correlate::LEADUP_NS + 5_000_000_000,
            opts.scan_items.clone(),
        );
        Self {
            store,
            model,
            sampler,
            clock: Clock::now(),
            session_id,
            opts,
            drops,
            memcg,
            last_drops: Drops::default(),
            last_drops_ns: wall_now_ns(),
            kills: KillBook::default(),
            gpu,
            watcher: None,
            heap: None,
            growth: None,
            pressure: None,
            warn: None,
            gpu_ooms: Vec::new(),
            gpu_view: None,
            published: None,
            nvml_missing: None,
            xids: Vec::new(),
            sample_now: None,
            ooms_awaiting_nvml: Vec::new(),
            window: Window::default(),
            reports: Reports::new(wall_now_ns()),
            buffer: Vec::new(),
            pending_groups: Vec::new(),
            summary: EngineSummary {
                session_id,
                ..Default::default()
            },
            ticks: 0,
            storm: Default::default(),
            call_fold: Default::default(),
            proc_fold: Default::default(),
            disk_full: false,
            metrics: Arc::default(),
            exporters: Exporters::default(),
            spill: super::spill::Spill::new(crate::store::spill::DEFAULT_DIR.into(), None),
            dirty: Default::default(),
            self_kills: Default::default(),
        }
    }

    /// Where kills go while the store's file system is full; with a home,
    /// `store` is that home's spill store, left for it when it has room.
    pub fn set_spill(&mut self, s: super::spill::Spill) {
        self.spill = s;
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
                tokio::time::Instant::now() + std::time::Duration::from_nanos(wait)
            });
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
                        if self.gpu.is_some() && killed && settle_due.is_none() {
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
                        if self.gpu.is_some() && (killed || !self.gpu_ooms.is_empty()) && settle_due.is_none() {
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
                    Some(ev) => self.on_event(ev),
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
                self.survive(e)?;
            }
            if stop {
                break;
            }
        }
        self.finish(stop_at.unwrap_or_else(std::time::Instant::now))
    }

    /// Kernel log records, with whatever else is already queued; the
    /// backlog found at start is stored at once, in one commit.
    fn on_kmsg_batch(
        &mut self,
        first: KmsgEvent,
        rx: &mut mpsc::Receiver<KmsgEvent>,
    ) -> Result<(), StoreError> {
        self.on_kmsg(first)?;
        for _ in 0..MAX_BATCH {
            let Ok(ev) = rx.try_recv() else { break };
            self.on_kmsg(ev)?;
        }
        if self.reports.has_backlog() {
            self.settle_unmatched(wall_now_ns(), false)?;
        }
        Ok(())
    }

    /// The CUDA calls before a GPU OOM or a kill come on the data ring (its
    /// reader was nudged): they are taken in first, so ledgers are as of
    /// the failure or the kill.
    fn settle_gpu(&mut self, data: &mut mpsc::Receiver<Event>) -> Result<(), StoreError> {
        while let Ok(ev) = data.try_recv() {
            self.on_event(ev)?;
        }
        self.commit_gpu_ooms()?;
        self.refresh_kill_gpu()
    }

    /// A store error in the loop: a full file system costs the write that
    /// failed (events and samples are shed; kills are held and retried, see
    /// `commit_kills`), never the recorder. Anything else ends it.
    fn survive(&mut self, e: StoreError) -> Result<(), StoreError> {
        if !e.is_disk_full() {
            return Err(e);
        }
        self.on_disk_full();
        Ok(())
    }

    /// A step's result: a full file system is survived.
    fn step(&mut self, r: Result<(), StoreError>) -> Result<(), StoreError> {
        r.or_else(|e| self.survive(e))
    }

    /// Recording into the spill store, and the store's file system has
    /// room again: what the spill store holds moves into the store, and the
    /// engine goes on there. Row ids change on the way (kills recent enough
    /// to be updated follow theirs); records already handed to exporters
    /// keep the spill store's.
    fn go_home(&mut self) {
        let Some((store, imported)) = self.spill.go_home(&self.store) else {
            return;
        };
        let spill = std::mem::replace(&mut self.store, store);
        let spill_path = spill.path().to_path_buf();
        drop(spill);
        self.spill.arrived(&spill_path);
        tracing::info!(
            "{} kill(s), {} GPU OOM(s) and {} other rows moved from the spill store",
            imported.kills,
            imported.gpu_ooms,
            imported.rows
        );
        if let Some(&id) = imported.session_ids.get(&self.session_id) {
            self.session_id = id;
            self.summary.session_id = id;
        }
        self.kills.moved(&imported.kill_ids, self.session_id);
        // Kills still to be stored again go to their new rows.
        self.dirty = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|id| imported.kill_ids.get(&id).copied().unwrap_or(id))
            .collect();
        for (id, rec) in &mut self.ooms_awaiting_nvml {
            if let Some(&to) = imported.gpu_oom_ids.get(id) {
                *id = to;
            }
            rec.session_id = Some(self.session_id);
        }
    }

    /// Says once that the store's file system is full, and makes room.
    fn on_disk_full(&mut self) {
        if !self.disk_full {
            self.disk_full = true;
            tracing::warn!(
                "the store's file system is full: shedding the oldest events and samples to keep kills; \
                 kills that cannot be written are held in memory and retried every second"
            );
        }
        let n = self.store.make_room();
        tracing::debug!("made room: {n} rows shed");
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
        Ok(committed)
    }

    /// Asked to stop: every queued OOM kill, then whatever else is queued
    /// until [`STOP_DRAIN`] has passed; what is left is counted as lost.
    fn drain_for_stop(&mut self, inputs: &mut Inputs) -> Result<(), StoreError> {
        while let Ok(ev) = inputs.oom.try_recv() {
            self.on_event(ev)?;
        }
        self.commit_kills()?;
        let deadline = std::time::Instant::now() + STOP_DRAIN;
        // The rings themselves are read too (the data reader polls them
        // only every 100 ms): the readers are asked again whenever the
        // queues run dry, until they stay dry for SWEEP_QUIET.
        let sweep = |inputs: &Inputs| inputs.sweep.iter().for_each(|n| n.notify_one());
        sweep(inputs);
        let mut dry_since: Option<std::time::Instant> = None;
        while std::time::Instant::now() < deadline {
            let ev = match inputs.critical.try_recv() {
                Ok(ev) => ev,
                Err(_) => match inputs.data.try_recv() {
                    Ok(ev) => ev,
                    Err(_) => {
                        let since = *dry_since.get_or_insert_with(std::time::Instant::now);
                        if inputs.sweep.is_empty() || since.elapsed() >= SWEEP_QUIET {
                            break;
                        }
                        sweep(inputs);
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                },
            };
            dry_since = None;
            self.on_event(ev)?;
            if self.kills.queued() >= 64 {
                self.commit_kills()?;
            }
        }
        self.commit_kills()?;
        let left = (inputs.critical.len() + inputs.data.len()) as u64;
        if left > 0 {
            let now = wall_now_ns();
            tracing::warn!("{left} queued events not processed: the recorder was asked to stop");
            self.store.insert_drops(
                self.session_id,
                &DropRow {
                    ring: "stop".into(),
                    count: left,
                    from_ns: now,
                    to_ns: now,
                },
            )?;
        }
        Ok(())
    }

    fn ctx(&self) -> Context<'_> {
        Context {
            clock: &self.clock,
            model: &self.model,
            sampler: &self.sampler,
            session_id: Some(self.session_id),
            now_ns: wall_now_ns(),
            procs: &LiveProc,
        }
    }

    fn row(&self, ev: &Event) -> EventRow {
        row_of(&self.clock, ev)
    }

    fn on_event(&mut self, ev: Event) -> Result<(), StoreError> {
        Metrics::add(&self.metrics.events, 1);
        if let Event::Cuda(c) = &ev {
            return self.on_cuda(c, &ev);
        }
        if let Event::Usdt(u) = &ev {
            if let Some(gpu) = &mut self.gpu {
                gpu.ledgers
                    .on_block(u, self.clock.boot_to_wall(u.header.ts_boot_ns));
            }
            return Ok(());
        }
        // Heap samples go to the heap worker's thread, not the store: no
        // row is made for them.
        let ev = match ev {
            Event::HeapAlloc(a) => {
                if let Some(h) = &self.heap {
                    let ts = self.clock.boot_to_wall(a.header.ts_boot_ns).max(0) as u64;
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
                    let ts = self.clock.boot_to_wall(s.header.ts_boot_ns).max(0) as u64;
                    h.fault(s, ts);
                }
                return Ok(());
            }
            Event::OomTip(s) => {
                if let Some(h) = &self.heap {
                    // Its task's maps are read at once, off this thread:
                    // the task may be stuck in the OOM it set off, holding
                    // its memory map lock.
                    h.tip(s);
                }
                return Ok(());
            }
            ev => ev,
        };
        let mut row = self.row(&ev);
        // Forks and exits past their parent's allowance are counted, not
        // stored.
        let mut stored = true;
        match &ev {
            Event::OomVictim(v) => {
                self.self_kills.oom_victim(wall_now_ns(), v.victim_pid);
                let t_recv = wall_now_ns();
                // The victim's cgroup from the kernel at the kill: read at
                // the SIGKILL the OOM killer sent it, or the trigger's when
                // it was killed for its own allocation.
                let id = match v.victim_memcg_id {
                    0 if v.header.pid == v.victim_pid => v.trigger_memcg_id,
                    id => id,
                };
                let kernel_memcg = self.model.memcg_by_id(id, true);
                let mut rec = kill_from_victim(&self.ctx(), v, kernel_memcg);
                tracing::debug!(
                    "kill of {}: received {} us after the kernel, built in {} us",
                    v.victim_pid,
                    (t_recv - row.ts_ns) / 1000,
                    (wall_now_ns() - t_recv) / 1000
                );
                if let Some(report) = self.reports.claim(&rec, &self.clock) {
                    merge_report(&mut rec, &report, Some(&self.sampler), Some(&self.model));
                }
                self.buffer.push(row);
                self.commit_kill(rec)?;
                return Ok(());
            }
            Event::SignalKill(s) if s.code != crate::correlate::SI_KERNEL && s.result == 0 => {
                // Past the rate of full records: folded, no /proc read, no row.
                if !self.storm.admit(row.ts_ns) {
                    let memcg = self
                        .model
                        .holder(
                            s.target_pid,
                            row.ts_ns,
                            StartTime::kernel(s.target_start_ns),
                        )
                        .0
                        .and_then(|p| p.memcg.clone());
                    let comm = c_str(&s.target_comm);
                    let ctx = Context {
                        clock: &self.clock,
                        model: &self.model,
                        sampler: &self.sampler,
                        session_id: Some(self.session_id),
                        now_ns: row.ts_ns,
                        procs: &LiveProc,
                    };
                    self.storm.fold(
                        s.header.pid,
                        memcg,
                        row.ts_ns,
                        (s.target_pid, &comm),
                        || crate::correlate::kill_from_signal_lean(&ctx, s),
                    );
                    return Ok(());
                }
                self.model.get_or_read(s.header.pid);
                self.model.read_pending(s.target_pid);
                if let Some(rec) = kill_from_signal(&self.ctx(), s) {
                    self.buffer.push(row);
                    self.commit_kill(rec)?;
                    return Ok(());
                }
            }
            // A kernel SIGKILL of a process by itself: the OOM killer's
            // when a mark_victim of it comes, else a BPF program's or a
            // kernel limit's (kept waiting for that, see `selfkill`).
            Event::SignalKill(s)
                if s.code == crate::correlate::SI_KERNEL
                    && s.header.pid == s.target_pid
                    && s.result == 0 =>
            {
                self.self_kills.signal(wall_now_ns(), *s);
            }
            // The kernel's own SIGKILLs and undelivered signals: a raw event only.
            Event::SignalKill(_) => {}
            Event::Reap(r) => {
                let start = r.header.kind == tracer_common::kind::REAP_START;
                if let Some(id) = self.kills.on_reap(r.victim_pid, row.ts_ns, start)
                    && let Some(rec) = self.kills.get(id)
                {
                    self.store.update_kill(id, rec)?;
                }
            }
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
                self.on_late_exec(e.pid, row.ts_ns)?;
                if let Some(w) = &self.watcher {
                    w.on_exec(e.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exec(e.pid);
                }
            }
            Event::Fork(f) => {
                if !self.admit_churn(super::fold::FORKS, u64::from(f.header.pid), &row) {
                    stored = false;
                }
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
                if !self.admit_churn(super::fold::EXITS, crate::util::fnv1a(&x.header.comm), &row) {
                    stored = false;
                }
                self.model
                    .on_exit(x.pid, row.ts_ns, StartTime::kernel(x.start_ns));
                self.model.read_due(row.ts_ns);
                if let Some(w) = &self.watcher {
                    w.on_exit(x.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exit(x.pid, row.ts_ns.max(0) as u64);
                }
                if let Some(gpu) = &mut self.gpu {
                    gpu.on_exit(&self.store, self.session_id, x.pid, row.ts_ns)?;
                }
                if x.rss_known != 0 {
                    self.memory_at_exit(x)?;
                }
            }
            Event::Cuda(_)
            | Event::HeapAlloc(_)
            | Event::HeapFree(_)
            | Event::GrowthFault(_)
            | Event::OomTip(_)
            | Event::Usdt(_) => {
                unreachable!("CUDA calls, allocator probes and heap samples are handled above")
            }
            Event::MemcgOom(m) => {
                let path = self.model.memcg_by_id(m.memcg_id, false);
                row.data["memcg_path"] = path.into();
            }
        }
        if stored {
            self.buffer.push(row);
        }
        if self.buffer.len() >= EVENT_BUFFER {
            self.flush()?;
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
        self.buffer.extend(closed);
        admitted
    }

    /// A CUDA call: counted in its process's ledger. Only the notable ones
    /// become stored events (their row is built only then: this runs for
    /// every call, hundreds of thousands a second): failures, the virtual
    /// memory API (segments, not single tensors), and allocations of 64 MiB
    /// or more. Out-of-memory failures wait for the calls before them.
    fn on_cuda(&mut self, c: &CudaCall, ev: &Event) -> Result<(), StoreError> {
        if c.ret != 0
            && cuda::allocates(c.func)
            && let Some(n) = &self.published
        {
            n.cuda_failures.inc(vec![
                ("function", cuda::name(c.func).to_string()),
                ("error", c.ret.to_string()),
            ]);
        }
        // A failure repeated within its window is counted, not handled
        // again: a retry loop costs a row a second, not one a call.
        if c.ret != 0 {
            let ts = self.clock.boot_to_wall(c.header.ts_boot_ns);
            let key = (c.header.pid, c.func, c.size, c.ret);
            let clock = &self.clock;
            let row = || row_of(clock, ev);
            let mut closed = Vec::new();
            let first = self.call_fold.admit(key, ts, row, &mut closed);
            for r in closed {
                self.buffer.push(r);
            }
            if !first {
                return Ok(());
            }
        }
        if c.ret == cuda::OUT_OF_MEMORY && cuda::allocates(c.func) {
            self.gpu_ooms.push(*c);
            self.buffer.push(self.row(ev));
            return Ok(());
        }
        if let Some(gpu) = &mut self.gpu {
            gpu.ledgers.on_call(
                c,
                self.clock.boot_to_wall(c.header.ts_boot_ns),
                &self.model,
                self.session_id,
            );
        }
        let vmm = matches!(
            c.func,
            cuda::MEM_CREATE | cuda::MEM_RELEASE | cuda::MEM_MAP | cuda::MEM_UNMAP
        );
        if c.ret != 0 || vmm || (cuda::allocates(c.func) && c.size >= NOTABLE_CUDA_BYTES) {
            self.buffer.push(self.row(ev));
        }
        Ok(())
    }

    /// Stores the summaries of the windows of identical failed calls that
    /// ended before `now_ns`.
    fn close_call_windows(&mut self, now_ns: i64) {
        let mut closed = Vec::new();
        self.call_fold.close(now_ns, &mut closed);
        self.proc_fold.close(now_ns, &mut closed);
        self.buffer.extend(closed);
        self.summary.folded_calls = self.call_fold.folded;
        self.summary.folded_procs = self.proc_fold.folded;
    }

    /// Queues a kill; `commit_kills` makes it durable before the engine
    /// waits for anything else.
    fn commit_kill(&mut self, rec: KillRecord) -> Result<(), StoreError> {
        self.kills.queue(rec);
        Ok(())
    }

    /// Sets when the probes started to be attached (wall ns); the engine's
    /// own start is the default.
    pub fn set_started(&mut self, ns: i64) {
        self.reports.set_started(ns);
    }

    /// The counters, for whoever wants to read them while it runs.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Where stored kills and GPU OOMs are handed on.
    pub fn set_exporters(&mut self, exporters: Exporters) {
        self.exporters = exporters;
    }

    /// The way to ask the NVML thread for a sample now.
    pub fn set_sample_now(&mut self, tx: Option<std::sync::mpsc::Sender<()>>) {
        self.sample_now = tx;
    }

    /// An Xid error from the NVIDIA driver: stored as an event, and kept
    /// (an hour, 64 at most) for the pictures of its device.
    fn on_xid(&mut self, x: crate::collect::kmsg::Xid) -> Result<(), StoreError> {
        let ts_ns = self.clock.kmsg_to_wall(x.ts_us);
        tracing::warn!("GPU {} Xid {}: {}", x.pci, x.code, x.message);
        if let Some(c) = &self.published {
            c.xids.inc(vec![
                ("pci_bus_id", x.pci.clone()),
                ("xid", x.code.to_string()),
            ]);
        }
        self.buffer.push(EventRow {
            ts_ns,
            kind: "gpu_xid".into(),
            pid: x.pid.unwrap_or(0),
            tid: 0,
            comm: x.name.clone().unwrap_or_default(),
            data: serde_json::to_value(&x).unwrap_or_default(),
        });
        if self.xids.len() == 64 {
            self.xids.remove(0);
        }
        self.xids.push((
            x.pci.clone(),
            crate::record::XidNote {
                ts_ns,
                code: x.code,
                pid: x.pid,
                message: x.message,
            },
        ));
        Ok(())
    }

    /// Sets why GPU figures are missing from every record (no NVML).
    pub fn set_nvml_missing(&mut self, why: Option<String>) {
        self.nvml_missing = why;
    }

    /// An NVML sample: the new GPU picture, folded into the timeline.
    fn on_gpu_sample(&mut self, s: crate::nvml::GpuSample) -> Result<(), StoreError> {
        if let Some(e) = &s.error {
            tracing::debug!("NVML sample: {e}");
        }
        let traced = self.gpu.as_ref().map(|g| &g.ledgers as &dyn TracedMemory);
        let mut view = crate::correlate::gpuview::build(
            &s,
            &self.model,
            Some(&self.sampler),
            traced,
            &LiveProc,
            s.ts_ns,
        );
        crate::correlate::gpuview::annotate_xids(&mut view, &self.xids, s.ts_ns);
        let n = &mut self.summary;
        n.nvml_sample_us_mean =
            (n.nvml_sample_us_mean * n.nvml_samples + s.took_us) / (n.nvml_samples + 1);
        n.nvml_samples += 1;
        Metrics::set(&self.metrics.nvml_samples, n.nvml_samples);
        Metrics::set(&self.metrics.nvml_last_us, s.took_us);
        n.nvml_sample_us_max = n.nvml_sample_us_max.max(s.took_us);
        if let Some((devices, procs)) = self.window.push(&view, s.ts_ns) {
            self.store.insert_timeline(FRESH_RES_S, &devices, &procs)?;
            self.summary.timeline_rows += (devices.len() + procs.len()) as u64;
        }
        for d in &s.devices {
            self.window
                .device_extras(d.index, d.util_gpu, d.temperature_c, d.power_mw);
        }
        // GPU OOMs get the first picture taken after them: who held the
        // device at that moment.
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ooms_awaiting_nvml)
            .into_iter()
            .partition(|(_, r)| s.ts_ns >= r.ts_ns);
        self.ooms_awaiting_nvml = waiting;
        for (id, mut rec) in ready {
            if rec.device >= 0
                && let Some(d) = view.device(rec.device as u32)
            {
                rec.nvml = Some(d.clone());
                self.store.update_gpu_oom(id, &rec)?;
            }
        }
        if let Some(p) = &self.published {
            p.gpu.set(Some(view.clone()));
        }
        self.gpu_view = Some(view);
        Ok(())
    }

    /// Where the engine publishes for the metrics endpoint: each GPU
    /// picture, each tick's samples of containers' memory cgroups and
    /// caching allocators, and its counts of Xids and failed CUDA
    /// allocations.
    pub fn set_published(&mut self, p: Arc<crate::export::prometheus::Published>) {
        self.published = Some(p);
    }

    /// The latest sample of each of `paths` that belongs to a container or
    /// a pod.
    fn container_memcgs(
        &self,
        paths: &std::collections::BTreeSet<String>,
        now: i64,
    ) -> Vec<crate::export::prometheus::MemcgGauge> {
        paths
            .iter()
            .filter_map(|path| {
                let owner = self.model.owner_of(path);
                if owner.container_id.is_none() && owner.pod_uid.is_none() {
                    return None;
                }
                let s = self
                    .sampler
                    .latest(path)
                    .filter(|s| s.ts_ns >= now - 60_000_000_000)?;
                Some(crate::export::prometheus::MemcgGauge {
                    cgroup: path.clone(),
                    container: owner.short().unwrap_or_default(),
                    kube: owner.kube,
                    usage: s.usage_bytes,
                    limit: s.limit_bytes,
                    failcnt: s.failcnt,
                })
            })
            .collect()
    }

    /// What the traced CUDA calls hold per container (or memory cgroup,
    /// for a process in none): caching allocators and pinned host memory.
    fn container_cuda(
        &self,
        ledgers: &crate::correlate::cuda::CudaLedgers,
    ) -> Vec<crate::export::prometheus::ContainerCuda> {
        use crate::export::prometheus::ContainerCuda;
        let mut by: std::collections::BTreeMap<String, ContainerCuda> = Default::default();
        let get = |pid: u32| {
            let p = self.model.get(pid);
            // Names read now (a process's may not have been readable at its exec).
            let owner = p.and_then(|p| Some(self.model.owner_of(p.memcg.as_deref()?)));
            let name = owner
                .as_ref()
                .and_then(|o| o.short())
                .or_else(|| p.and_then(|p| p.memcg.clone()))
                .unwrap_or_default();
            (name, owner.and_then(|o| o.kube))
        };
        // (pid, its allocator's allocated and reserved, its pinned host bytes)
        let held = ledgers
            .allocators()
            .into_iter()
            .map(|(pid, a)| (pid, Some((a.allocated, a.reserved)), 0))
            .chain(
                ledgers
                    .pinned_by_pid()
                    .into_iter()
                    .map(|(pid, n)| (pid, None, n)),
            );
        for (pid, allocator, pinned) in held {
            let (name, kube) = get(pid);
            let c = by.entry(name.clone()).or_insert_with(|| ContainerCuda {
                container: name,
                kube,
                ..Default::default()
            });
            if let Some((allocated, reserved)) = allocator {
                let e = c.allocator.get_or_insert((0, 0));
                e.0 += allocated;
                e.1 += reserved;
            }
            c.pinned_host += pinned;
        }
        by.into_values().collect()
    }

    /// Kills committed in the last few seconds get their victim's GPU
    /// ledger again, now that the calls before the kill are counted.
    fn refresh_kill_gpu(&mut self) -> Result<(), StoreError> {
        let Some(gpu) = &self.gpu else { return Ok(()) };
        let since = wall_now_ns() - 5_000_000_000;
        re_enrich(&mut self.kills, &mut self.dirty, &gpu.ledgers, since, |r| {
            r.victim.gpu.clone()
        });
        self.write_dirty(DIRTY_PER_TICK)
    }

    /// Records the self-kills (see `selfkill`) no OOM kill claimed by
    /// `now`, with the memory their processes held at exit.
    fn commit_self_kills(&mut self, now: i64) -> Result<(), StoreError> {
        for (ev, pages) in self.self_kills.due(now) {
            self.model.read_pending(ev.target_pid);
            let Some(mut rec) = crate::correlate::kill_from_self_signal(&self.ctx(), &ev) else {
                continue;
            };
            if let Some(pages) = pages {
                crate::correlate::kills::exit_memory(
                    &mut rec,
                    ev.target_pid,
                    pages,
                    crate::util::sys::page_kb(),
                );
            }
            self.commit_kill(rec)?;
        }
        Ok(())
    }

    /// Stores again up to `n` kills that re-enrichment changed, oldest
    /// kill first, in one transaction.
    fn write_dirty(&mut self, n: usize) -> Result<(), StoreError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = std::iter::from_fn(|| self.dirty.pop_first())
            .take(n)
            .collect();
        let kills = &self.kills;
        self.store
            .update_kills(ids.iter().filter_map(|&id| Some((id, kills.get(id)?))))
    }

    /// Warns about the sampled memory cgroups about to reach their limit
    /// (and says when they no longer are): a `pressure` event stored,
    /// counted and exported.
    fn early_warnings(&mut self, paths: &std::collections::BTreeSet<String>, now: i64) {
        let Some(gate) = &mut self.warn else {
            return;
        };
        let since = now - crate::correlate::warning::RATE_WINDOW_NS;
        let mut events = Vec::new();
        for path in paths.iter().filter(|p| p.as_str() != "/") {
            // Most cgroups have no limit and no PSI: nothing to fit.
            let worth = self.sampler.latest(path).is_some_and(|s| {
                s.limit_bytes.is_some() || (gate.watches_psi() && s.psi_some_avg10.is_some())
            });
            if worth || gate.is_warned(path) {
                let window = self.sampler.window(path, since);
                events.extend(gate.sample(path, &window, now));
            }
        }
        events.extend(gate.end_missing(|p| paths.contains(p), now));
        for mut ev in events {
            let owner = self.model.owner_of(&ev.memcg);
            ev.owner = (!owner.is_empty()).then_some(owner);
            let what = match (ev.state, ev.projected_s, ev.psi_some_avg10) {
                (WarningState::Recovered, ..) => "no longer near its limit".to_string(),
                (_, Some(p), _) if ev.reason == WarningReason::Growth => format!(
                    "reaches its limit in {p:.0} s at {}/s",
                    crate::util::units::bytes(ev.rate_bytes_per_s.unwrap_or(0.0) as u64)
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
            if let Some(p) = &self.published
                && ev.state == WarningState::Warning
            {
                let mut labels = crate::export::prometheus::owner_labels(ev.owner.as_ref());
                labels.push(("cgroup", ev.memcg.clone()));
                labels.push((
                    "reason",
                    match ev.reason {
                        WarningReason::Growth => "growth".into(),
                        WarningReason::Psi => "psi".into(),
                    },
                ));
                p.warnings.inc(labels);
            }
            self.buffer.push(EventRow {
                ts_ns: now,
                kind: "pressure".into(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                data: serde_json::to_value(&ev).unwrap_or_default(),
            });
            if !self.exporters.is_empty() {
                self.exporters.publish(Exported::Pressure {
                    record: Box::new(ev),
                });
            }
        }
    }

    /// Memory cgroups that reach the pressure threshold get their heap
    /// traced, and lose it once calm; both moments are stored as events
    /// (`heap_pressure`).
    fn heap_on_pressure(&mut self, paths: &std::collections::BTreeSet<String>, now: i64) {
        let (Some(gate), Some(watcher)) = (&mut self.pressure, &self.watcher) else {
            return;
        };
        let since = now - 2 * self.opts.sample_interval.as_nanos() as i64;
        let mut changes = Vec::new();
        for path in paths {
            if path == "/" {
                continue;
            }
            if let Some(s) = self.sampler.latest(path).filter(|s| s.ts_ns >= since) {
                changes.extend(gate.sample(path, s.usage_bytes, s.limit_bytes, now));
            }
        }
        changes.extend(gate.end_missing(|p| paths.contains(p)));
        for t in changes {
            if !watcher.watch_cgroup(&crate::probes::uprobe::HEAP, &t.path, t.on) {
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
            self.buffer.push(EventRow {
                ts_ns: now,
                kind: "heap_pressure".into(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                data: serde_json::json!({ "memcg_path": t.path, "on": t.on, "percent": t.percent }),
            });
        }
    }

    /// Kills committed in the last seconds get where their victim grew and
    /// the stack that tipped them, as the heap worker finds them (after
    /// the kill's commit: unwinding never delays it).
    fn refresh_kill_growth(&mut self) -> Result<(), StoreError> {
        let Some(h) = &self.heap else { return Ok(()) };
        let since = wall_now_ns() - 20_000_000_000;
        re_enrich(&mut self.kills, &mut self.dirty, h, since, |r| {
            (
                r.growth.clone(),
                r.tipping_stack.clone(),
                r.victim.heap.is_some(),
            )
        });
        self.write_dirty(DIRTY_PER_TICK)
    }

    /// GPU out-of-memory failures, joined with the ledgers, made durable.
    fn commit_gpu_ooms(&mut self) -> Result<(), StoreError> {
        let mut calls = std::mem::take(&mut self.gpu_ooms);
        calls.sort_by_key(|c| c.header.ts_boot_ns);
        let Some(gpu) = &mut self.gpu else {
            return Ok(());
        };
        for c in calls {
            let ts = self.clock.boot_to_wall(c.header.ts_boot_ns);
            if let Some(mut rec) = gpu.ledgers.on_call(&c, ts, &self.model, self.session_id) {
                match &self.gpu_view {
                    Some(v) if rec.device >= 0 => rec.nvml = v.device(rec.device as u32).cloned(),
                    Some(_) => {}
                    None => {
                        if let Some(why) = &self.nvml_missing {
                            rec.gaps.push(format!("GPU data unavailable: {why}"));
                        }
                    }
                }
                let id = self.store.insert_gpu_oom(&rec)?;
                Metrics::add(&self.metrics.gpu_ooms, 1);
                if !self.exporters.is_empty() {
                    self.exporters.publish(Exported::GpuOom {
                        id,
                        record: Box::new(rec.clone()),
                    });
                }
                if let Some(now) = &self.sample_now {
                    let _ = now.send(());
                    self.ooms_awaiting_nvml.push((id, rec.clone()));
                }
                tracing::info!(
                    "GPU out of memory: {} (pid {}) asked {} for {} on device {}",
                    escape(&rec.process.comm),
                    rec.process.pid,
                    rec.function,
                    crate::util::units::bytes(rec.size),
                    rec.device
                );
            }
        }
        Ok(())
    }

    /// Commits every queued kill, with the events buffered so far, in one
    /// transaction: a burst of kills shares one fsync instead of queueing
    /// behind one another's.
    fn commit_kills(&mut self) -> Result<bool, StoreError> {
        if self.kills.queued() == 0 {
            return Ok(false);
        }
        let mut kills = self.kills.take_queued();
        let enrichers: Vec<&dyn KillEnricher> = [
            self.gpu.as_ref().map(|g| &g.ledgers as &dyn KillEnricher),
            self.gpu_view.as_ref().map(|v| v as &dyn KillEnricher),
            self.heap.as_ref().map(|h| h as &dyn KillEnricher),
        ]
        .into_iter()
        .flatten()
        .collect();
        for k in &mut kills {
            for e in &enrichers {
                e.enrich(k);
            }
            if let Some(gate) = &self.warn {
                let memcg = k
                    .memcg
                    .as_ref()
                    .map(|m| m.path.as_str())
                    .or(k.victim.memcg.as_deref());
                if let Some(w) = memcg.and_then(|m| gate.standing(m))
                    && k.kmsg
                        .as_ref()
                        .is_none_or(|r| crate::correlate::warning::applies(w, r))
                {
                    k.warning = Some(w.clone());
                }
            }
            if self.gpu_view.is_none()
                && let Some(why) = &self.nvml_missing
            {
                let gap = Gap::Note(format!("GPU data unavailable: {why}"));
                if !k.gaps.contains(&gap) {
                    k.gaps.push(gap);
                }
            }
        }
        let events = std::mem::take(&mut self.buffer);
        let t_commit = wall_now_ns();
        let ids = match self.store.insert_kills(&kills, &events, t_commit) {
            Ok(ids) => ids,
            Err(e) if e.is_disk_full() => {
                // Make room and try once more, without the events (shed).
                self.on_disk_full();
                match self.store.insert_kills(&kills, &[], t_commit) {
                    Ok(ids) => ids,
                    Err(e) => {
                        let n = kills.len();
                        if !e.is_disk_full() {
                            self.kills.requeue(kills);
                            return Err(e);
                        }
                        // Held in memory and retried every tick; copied to
                        // the spill store, so that a crash or a stop loses
                        // none of them.
                        match self
                            .spill
                            .copy_held(&self.store, self.session_id, &kills, t_commit)
                        {
                            Ok(copied) if copied > 0 => tracing::warn!(
                                "{n} kill(s) held in memory, and copied to the spill store {}: the store's file system is still full",
                                self.spill
                                    .side_path()
                                    .map(|p| p.display().to_string())
                                    .unwrap_or_default()
                            ),
                            Ok(_) => {}
                            Err(e) => tracing::error!(
                                "{n} kill(s) held in memory only: the store's file system is full and the spill store failed: {e}"
                            ),
                        }
                        self.kills.requeue(kills);
                        return Ok(false);
                    }
                }
            }
            Err(e) => {
                self.kills.requeue(kills);
                return Err(e);
            }
        };
        let done = wall_now_ns();
        if self.kills.queued() == 0 {
            self.spill.all_stored();
        }
        tracing::debug!(
            "{} kill(s) committed in {} us",
            kills.len(),
            (done - t_commit) / 1000
        );
        for (id, rec) in ids.into_iter().zip(kills) {
            // An aggregate of a SIGKILL storm is stored when its window
            // ends, by design: it is not a kill's latency to the disk.
            if let Some(t) = rec.tracepoint_ns.filter(|_| rec.aggregate.is_none()) {
                if self.summary.kill_commit_us.len() == 1000 {
                    self.summary.kill_commit_us.remove(0);
                }
                let us = (done - t).max(0) as u64 / 1000;
                self.summary.kill_commit_us.push(us);
                self.metrics.kill_committed(us);
            }
            Metrics::add(&self.metrics.kills, 1);
            tracing::info!(
                "kill recorded: {} (pid {}) by {} [{}]",
                escape(&rec.victim.comm),
                rec.victim.pid,
                escape(
                    rec.killer
                        .sender
                        .as_ref()
                        .map(|s| s.comm.as_str())
                        .unwrap_or("the kernel OOM killer")
                ),
                rec.source
            );
            if !self.exporters.is_empty() {
                self.exporters.publish(Exported::Kill {
                    id,
                    record: Box::new(rec.clone()),
                });
            }
            if let Some(h) = &self.heap {
                h.on_kill(rec.victim.pid, rec.ts_ns.max(0) as u64);
            }
            self.kills.committed(id, rec);
        }
        self.retry_oom_groups()?;
        Ok(true)
    }

    /// A killed process whose memory was unknown at the signal (it was gone
    /// before /proc could be read) gets the RSS the kernel had at its exit.
    fn memory_at_exit(&mut self, x: &tracer_common::ProcExit) -> Result<(), StoreError> {
        let pages = [x.rss_file_pages, x.rss_anon_pages, x.rss_shmem_pages];
        if !self.self_kills.is_empty() {
            self.self_kills.on_exit_memory(x.pid, pages);
        }
        // Most exits are of processes no kill record waits for: one check.
        if !self.kills.awaiting_memory() {
            return Ok(());
        }
        if let Some(id) = self
            .kills
            .on_exit_memory(x.pid, pages, crate::util::sys::page_kb())
            && let Some(rec) = self.kills.get(id)
        {
            self.store.update_kill(id, rec)?;
        }
        Ok(())
    }

    fn on_kmsg(&mut self, ev: KmsgEvent) -> Result<(), StoreError> {
        let report = match ev {
            KmsgEvent::Report(r) => r,
            KmsgEvent::Xid(x) => return self.on_xid(x),
            KmsgEvent::Reaped(_) => return Ok(()),
            KmsgEvent::OomGroup(g) => return self.on_oom_group(&g),
        };
        let joined = self.kills.on_report(
            *report,
            &mut self.reports,
            &self.clock,
            wall_now_ns(),
            Some(&self.sampler),
            Some(&self.model),
        );
        if let Some(id) = joined
            && let Some(rec) = self.kills.get(id)
        {
            store_changed(&mut self.store, &self.exporters, id, rec)?;
            self.retry_oom_groups()?;
        }
        Ok(())
    }

    /// An exec that reached the engine after the kill of the program it
    /// started (the kill's ring is served first, and the exec's is read
    /// lazily): the kill was recorded with the model's entry of that
    /// moment, its parent's copy from the fork. It gets its own program's
    /// command line, file and cgroup now, and is stored and exported again.
    fn on_late_exec(&mut self, pid: u32, exec_ns: i64) -> Result<(), StoreError> {
        let Some(p) = self.model.get(pid) else {
            return Ok(());
        };
        let cmdline = Some(p.info.cmdline.to_string()).filter(|c| !c.is_empty());
        let (exe, memcg) = (p.info.exe.clone(), p.memcg.clone());
        for (id, rec) in self.kills.recent_since(exec_ns) {
            let v = &mut rec.victim;
            if v.pid != pid || (v.cmdline == cmdline && v.exe == exe) {
                continue;
            }
            v.cmdline = cmdline.clone();
            v.exe = exe.clone();
            if matches!(v.memcg_source, None | Some(MemcgSource::Model)) && memcg.is_some() {
                v.memcg = memcg.clone();
                v.memcg_source = Some(MemcgSource::Model);
            }
            tracing::debug!("kill {id}: its victim's exec came after it; command line now known");
            store_changed(&mut self.store, &self.exporters, id, rec)?;
        }
        Ok(())
    }

    /// The kill the kernel reported just before announcing a
    /// `memory.oom.group` kill is that incident's first (the others'
    /// reports say so themselves).
    fn on_oom_group(&mut self, g: &crate::collect::kmsg::OomGroup) -> Result<(), StoreError> {
        if !self.try_oom_group(g)? {
            // Its first kill has not met its report yet (the report can
            // come before the kill's event, or the other way round).
            self.pending_groups.push(g.clone());
        }
        Ok(())
    }

    /// Announcements still waiting for their first kill: tried again once
    /// kills are committed or joined, for [`GROUP_WAIT_NS`].
    fn retry_oom_groups(&mut self) -> Result<(), StoreError> {
        if self.pending_groups.is_empty() {
            return Ok(());
        }
        let now = wall_now_ns();
        for g in std::mem::take(&mut self.pending_groups) {
            let fresh = now - self.clock.kmsg_to_wall(g.ts_us) < GROUP_WAIT_NS;
            if !self.try_oom_group(&g)? && fresh {
                self.pending_groups.push(g);
            }
        }
        Ok(())
    }

    /// Marks the first kill of the incident `g` announces; false when no
    /// committed kill is it yet.
    fn try_oom_group(&mut self, g: &crate::collect::kmsg::OomGroup) -> Result<bool, StoreError> {
        let since = self.clock.kmsg_to_wall(g.ts_us) - 10_000_000_000;
        let reported = |r: &KillRecord| r.kmsg.as_ref().map(|k| k.ts_us);
        let first = self
            .kills
            .recent_since(since)
            .filter(|(_, r)| {
                r.oom_group.is_none()
                    && reported(r).is_some_and(|ts| {
                        ts <= g.ts_us && g.ts_us - ts <= crate::collect::kmsg::GROUP_SPAN_US
                    })
            })
            .max_by_key(|(_, r)| reported(r));
        let Some((id, rec)) = first else {
            return Ok(false);
        };
        rec.oom_group = Some(g.cgroup.clone());
        store_changed(&mut self.store, &self.exporters, id, rec)?;
        Ok(true)
    }

    /// Reports nobody claimed: kills from before the recorder started (or
    /// whose tracepoint event was lost) become kernel-log-only records,
    /// unless the store has them already.
    fn settle_unmatched(&mut self, now_ns: i64, all: bool) -> Result<(), StoreError> {
        for report in self.reports.due(now_ns, all) {
            let ts = self.clock.kmsg_to_wall(report.ts_us);
            if self
                .store
                .find_kill(report.killed.pid, ts, JOIN_WINDOW_NS)?
                .is_none()
            {
                self.summary.kmsg_only_kills += 1;
                self.kills
                    .queue(kill_from_report(&report, &self.clock, Some(&self.model)));
            }
        }
        // Through the one commit path (held on a full disk, exported, ...);
        // a backlog found at start (many old kills) costs one commit.
        self.commit_kills().map(drop)
    }

    /// Stores the SIGKILL aggregates whose window has closed (all of them
    /// with `all`).
    fn commit_storms(&mut self, now_ns: i64, all: bool) -> Result<(), StoreError> {
        let due = self.storm.take_due(now_ns, all);
        if due.is_empty() {
            return Ok(());
        }
        for r in &due {
            if let Some(a) = &r.aggregate {
                tracing::warn!(
                    "{} SIGKILLs from {} (pid {}) folded into one record",
                    a.count,
                    crate::util::term::escape(
                        r.killer.sender.as_ref().map_or("?", |s| s.comm.as_str())
                    ),
                    r.killer.sender.as_ref().map_or(0, |s| s.pid),
                );
            }
        }
        Metrics::set(&self.metrics.folded_kills, self.storm.folded);
        for rec in due {
            self.kills.queue(rec);
        }
        self.commit_kills()?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let events = std::mem::take(&mut self.buffer);
        self.store.insert_events(Some(self.session_id), &events)
    }

    fn tick(&mut self) -> Result<(), StoreError> {
        let t0 = wall_now_ns();
        self.tick_inner()?;
        tracing::debug!("tick took {} us", (wall_now_ns() - t0) / 1000);
        Ok(())
    }

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
        let mut paths = self.model.memcgs_in_use();
        paths.extend(self.opts.cgroups.iter().cloned());
        self.sampler
            .sample(paths.iter().map(String::as_str), &counters, now);
        if let Some(p) = &self.published {
            p.memcg.set(self.container_memcgs(&paths, now));
            if let Some(gpu) = &self.gpu {
                p.cuda.set(self.container_cuda(&gpu.ledgers));
            }
        }
        let named = self.model.kube_named();
        if named > 0 {
            tracing::debug!("{named} pod(s) and container(s) named from the node's files");
        }
        self.heap_on_pressure(&paths, now);
        self.early_warnings(&paths, now);
        self.read_drops(now)?;
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
        if (self.disk_full || !self.store.has_reserve()) && self.store.has_room() {
            let reserved = self.store.ensure_reserve();
            if reserved && self.disk_full {
                self.disk_full = false;
                tracing::info!("the store's file system has room again");
            }
        }
        self.close_call_windows(now);
        self.flush()?;
        self.kills.prune(now);
        self.settle_unmatched(now, false)?;
        self.model.prune(now);
        // Entries whose exit was lost (a full ring) are found within a
        // round of the live entries; the cost per tick is bounded.
        let retired = self.model.audit(now, AUDIT_PER_TICK);
        if retired > 0 {
            tracing::debug!("{retired} processes found ended without their exit");
        }
        if let Some(gpu) = &mut self.gpu {
            gpu.tick(&self.store, self.session_id, now)?;
        }
        // Every tick: a kill after the last heartbeat of a crashed session
        // is said to be unrecorded within seconds of the crash.
        self.store.heartbeat(self.session_id, now)?;
        // The size bound holds at every tick: a flood of events fills a
        // store faster than once a minute can catch.
        // A spill store is memory: it keeps to its own, smaller bound.
        let max_bytes = if self.store.is_spill() {
            self.opts
                .max_store_bytes
                .min(crate::store::spill::MAX_BYTES)
        } else {
            self.opts.max_store_bytes
        };
        if self.ticks % per_min != 1 && self.store.near_size(max_bytes) {
            // A tenth below the bound: the flood goes on while the next
            // tick comes, and the WAL runs ahead of its checkpoints.
            let max = max_bytes;
            let n = self.store.enforce_size(max, max / 10, true)?;
            if n > 0 {
                tracing::debug!("size bound removed {n} rows");
            }
        }
        if self.ticks % per_min == 1 {
            let n = self.store.enforce_retention(
                now,
                self.opts.retention.as_nanos() as i64,
                max_bytes,
            )?;
            if n > 0 {
                tracing::debug!("retention removed {n} rows");
            }
            self.store
                .downsample_timeline(now - DOWNSAMPLE_AFTER_NS, AGED_RES_S)?;
            // Bursts (churn, kill storms) grow the heap; give it back.
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
        }
        Ok(())
    }

    fn read_drops(&mut self, now: i64) -> Result<(), StoreError> {
        let Some(d) = &self.drops else { return Ok(()) };
        let cur = match d.read() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("reading drop counters: {e}");
                return Ok(());
            }
        };
        for (ring, before, after) in [
            ("critical", self.last_drops.critical, cur.critical),
            ("data", self.last_drops.data, cur.data),
            ("oom", self.last_drops.oom, cur.oom),
        ] {
            if after > before {
                let row = DropRow {
                    ring: ring.into(),
                    count: after - before,
                    from_ns: self.last_drops_ns,
                    to_ns: now,
                };
                tracing::warn!(
                    "{} events lost on the {ring} ring (ring buffer full)",
                    row.count
                );
                self.store.insert_drops(self.session_id, &row)?;
            }
        }
        self.last_drops = cur;
        Metrics::set(&self.metrics.drops_critical, cur.critical);
        Metrics::set(&self.metrics.drops_data, cur.data);
        Metrics::set(&self.metrics.drops_oom, cur.oom);
        self.last_drops_ns = now;
        Ok(())
    }

    /// The last writes, kills first, within [`STOP_BUDGET`] of `stop_at`
    /// (when the stop was asked) where a busy node slows the growth worker.
    /// A full file system costs what cannot be written (said in the log),
    /// not the summary.
    fn finish(mut self, stop_at: std::time::Instant) -> Result<EngineSummary, StoreError> {
        let r = self.commit_storms(wall_now_ns(), true);
        self.step(r)?;
        // The rings are read to the end: a self-kill no OOM kill claimed by
        // now is a kill of its own.
        let r = self.commit_self_kills(i64::MAX);
        self.step(r)?;
        let r = self.commit_kills().map(drop);
        self.step(r)?;
        let r = self.commit_gpu_ooms();
        self.step(r)?;
        let r = self.refresh_kill_gpu();
        self.step(r)?;
        if let Some(gpu) = self.gpu.take() {
            self.summary.gpu_ooms = gpu.ooms();
        }
        if let Some(h) = &self.heap {
            // Every sample queued before the stop is in the kills' reports,
            // within a quarter of the budget: under an OOM storm the worker
            // never catches up, and waiting for it took the stop past 2 s.
            h.settle(
                STOP_BUDGET
                    .saturating_sub(stop_at.elapsed())
                    .min(STOP_BUDGET / 4)
                    .max(SETTLE_MIN),
            );
        }
        let r = self.refresh_kill_growth();
        self.step(r)?;
        if let Some(g) = &self.growth {
            self.summary.growth = g.read().ok();
        }
        if let Some(h) = self.heap.take() {
            self.summary.growth_queue_drops = h.dropped();
            self.summary.growth_forgotten = h.forgotten();
            self.summary.maps_reads_skipped = h.maps_skipped();
            h.stop();
        }
        if let Some(w) = self.watcher.take() {
            w.stop();
        }
        let (devices, procs) = self.window.take();
        let r = self.store.insert_timeline(FRESH_RES_S, &devices, &procs);
        self.step(r)?;
        let now = wall_now_ns();
        let r = self.read_drops(now);
        self.step(r)?;
        self.close_call_windows(i64::MAX);
        let r = self.flush();
        self.step(r)?;
        let r = self.settle_unmatched(now, true);
        self.step(r)?;
        let r = self.commit_kills().map(drop);
        self.step(r)?;
        if self.kills.queued() > 0 && self.spill.side_path().is_none() {
            tracing::error!(
                "{} kill(s) could not be written before the recorder stopped: the store's file system is full, and so is the spill store's",
                self.kills.queued()
            );
        }
        // What re-enrichment changed, last and only within half the stop's
        // budget, in small steps: the kills themselves are stored.
        while !self.dirty.is_empty() && stop_at.elapsed() < STOP_BUDGET / 2 {
            let r = self.write_dirty(DIRTY_PER_TICK);
            self.step(r)?;
        }
        if !self.dirty.is_empty() {
            tracing::warn!(
                "{} kill(s) keep their late growth or GPU details unstored: the stop's budget ran out",
                self.dirty.len()
            );
        }
        self.spill.close(self.kills.queued(), wall_now_ns());
        if self.spill.home().is_some() {
            tracing::warn!(
                "the store's file system is still full: this session is kept in the spill store {}, which the next start imports",
                self.store.path().display()
            );
        }
        let r = self.store.end_session(self.session_id, wall_now_ns());
        self.step(r)?;
        tracing::debug!(
            "the engine stopped {:?} after the request",
            stop_at.elapsed()
        );
        let m = self.metrics.snapshot();
        (self.summary.events, self.summary.kills) = (m.events, m.kills);
        self.summary.folded_kills = m.folded_kills;
        self.summary.drops = self.last_drops;
        // Exporters get what is left of the budget, and at least
        // EXPORT_MIN: a slow destination is left behind, never waited for.
        let export_deadline = std::time::Instant::now()
            + STOP_BUDGET
                .saturating_sub(stop_at.elapsed())
                .max(EXPORT_MIN);
        self.summary.export_drops = std::mem::take(&mut self.exporters).finish(export_deadline);
        self.summary.model = self.model.stats;
        self.summary.model_entries = self.model.len();
        self.summary.model_live = self.model.live().count();
        self.summary.model_bytes = self.model.bytes();
        Ok(self.summary)
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

/// Stores a changed kill again and hands it to the exporters, so that what
/// they were told is what the store holds.
fn store_changed(
    store: &mut Store,
    exporters: &Exporters,
    id: i64,
    rec: &KillRecord,
) -> Result<(), StoreError> {
    store.update_kill(id, rec)?;
    if !exporters.is_empty() {
        exporters.publish(Exported::KillUpdated {
            id,
            record: Box::new(rec.clone()),
        });
    }
    Ok(())
}

/// Runs `enricher` again over the kills committed since `since_ns` and
/// marks those whose `part` it changed in `dirty`, to be stored again by
/// `write_dirty` (what it adds may come after the kill's commit).
fn re_enrich<P: PartialEq>(
    kills: &mut KillBook,
    dirty: &mut std::collections::BTreeSet<i64>,
    enricher: &dyn KillEnricher,
    since_ns: i64,
    part: impl Fn(&KillRecord) -> P,
) {
    for (id, rec) in kills.recent_since(since_ns) {
        let before = part(rec);
        enricher.enrich(rec);
        if part(rec) != before {
            dirty.insert(id);
        }
    }
}

/// Kills re-enriched but not yet stored again, written at most this many a
/// tick, in one transaction: under an OOM storm the growth worker hands
/// over hundreds of tipping stacks at once, and storing 715 kills again in
/// one tick kept the engine 3.4-4.3 s (debug build) from kills and stop.
const DIRTY_PER_TICK: usize = 16;

/// How long a `memory.oom.group` announcement waits for its first kill.
const GROUP_WAIT_NS: i64 = 30_000_000_000;

/// How late the engine wakes for a pending /proc read (see the loop).
const READ_COALESCE_NS: i64 = 50_000_000;

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
