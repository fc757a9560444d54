//! What the engine is made of, and the channels it reads.

use std::{sync::Arc, time::Duration};

use tokio::sync::mpsc;

use crate::{
    collect::{decode::Event, kmsg::KmsgEvent},
    correlate::{pressure::PressureGate, warning::WarnGate},
    export::Exporters,
    model::ProcessTable,
    probes::{DropCounters, MemcgCounters, growth::GrowthMaps, watch::LibraryWatcher},
    record::published::Published,
    recorder::{heap_worker::HeapWorker, journal::spill::Spill, metrics::Metrics},
    store::Store,
};

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
    /// The reclaim counters' keys of the scan items (`MEMCG_ITEM_NAMES` slots).
    pub scan_items: Vec<i32>,
    /// The kernel's own SIGKILLs are seen and its log is read: an OOM
    /// victim marked with no SIGKILL before it is told from a kill.
    pub sees_kernel_kills: bool,
    /// Slow leaks: a working-set point every this long.
    pub leak_step: Duration,
    /// Slow leaks: a run spans at least this long to be judged.
    pub leak_min_span: Duration,
}

/// Everything the engine is made of; what is off is `None`.
pub struct Parts {
    /// The store, and the session recorded there.
    pub store: Store,
    /// The session.
    pub session_id: i64,
    /// The process model.
    pub model: ProcessTable,
    /// Settings.
    pub opts: EngineOptions,
    /// The rings' drop counters.
    pub drops: Option<DropCounters>,
    /// The kernel's memory cgroup event counters.
    pub memcg: Option<MemcgCounters>,
    /// CUDA tracing (`record --cuda`).
    pub cuda: bool,
    /// Why there is no NVML, for records that would have GPU figures.
    pub nvml_missing: Option<String>,
    /// Asks the NVML thread for a sample now.
    pub sample_now: Option<std::sync::mpsc::Sender<()>>,
    /// Attaches uprobe families (CUDA node-wide, the heap per traced
    /// process) off this thread.
    pub watcher: Option<LibraryWatcher>,
    /// Heap and growth samples.
    pub heap: Option<HeapWorker>,
    /// The growth programs' maps.
    pub growth: Option<GrowthMaps>,
    /// Growth attribution on risk (`--growth risk`).
    pub arming: Option<crate::recorder::features::arming::Armer>,
    /// The heap probes are loaded (the watcher can attach them to a
    /// cgroup): pictures at arming take heap sites.
    pub heap_family: bool,
    /// Early warnings.
    pub warn: Option<WarnGate>,
    /// Heap sampling for memory cgroups under pressure.
    pub pressure: Option<PressureGate>,
    /// Where kills go while the store's file system is full.
    pub spill: Spill,
    /// Where stored records are handed on.
    pub exporters: Exporters,
    /// What the metrics endpoint reads as the engine goes.
    pub published: Option<Arc<Published>>,
    /// The counters (shared with the endpoint).
    pub metrics: Arc<Metrics>,
    /// When the probes started to be attached (wall ns): kernel reports
    /// before it are the log's backlog.
    pub started_ns: i64,
}

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
    pub gpu: Option<mpsc::Receiver<crate::nvml::FromNvml>>,
    /// The userspace OOM killers' journal entries (none when the journal
    /// is not followed).
    pub journal: Option<mpsc::Receiver<crate::collect::journal::Logged>>,
    /// Set to true when the recorder is asked to stop.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Makes the critical and data readers read their rings now: at stop,
    /// what the rings still hold is read, not left behind.
    pub sweep: Vec<Arc<tokio::sync::Notify>>,
}
