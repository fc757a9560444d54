//! The recorder's wiring: the store (or its spill store), the probes, the
//! readers, the library watcher, the NVML thread, the exporters, the
//! metrics endpoint and the engine's thread, started from a
//! [`RecorderConfig`] and stopped in order.

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, anyhow};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinSet,
};

use super::{
    RecorderConfig,
    engine::{Engine, EngineOptions, EngineSummary, Inputs, Parts},
    heap::View,
    heap_worker::HeapWorker,
    journal::spill::Spill,
    metrics::Metrics,
};
use crate::{
    collect::{self, ReaderStats},
    correlate::{pressure::PressureGate, warning::WarnGate},
    export::{
        Exporters,
        feeds::{Feeds, KillCounter, KillCounts},
        prometheus::MetricsServer,
    },
    model::{ProcessTable, cgroup::CgroupLayout},
    probes::{
        Probes,
        growth::GrowthMode,
        layout::MEMCG_ITEM_NAMES,
        uprobe,
        watch::{LibraryWatcher, Scope, Watched},
    },
    store::{Checkpointer, Store},
    util::{chain, time::wall_now_ns, units::bytes},
};

/// How often the recorder drains the data ring without a wakeup: new
/// processes reach the model within this (kills nudge it at once).
const DATA_POLL: Duration = Duration::from_millis(100);

/// Capacity of the reader -> engine channels.
const CHANNEL: usize = 16384;

/// The recorder.
pub struct Recorder;

/// A recorder at work.
pub struct Running {
    tasks: JoinSet<anyhow::Result<()>>,
    stop_tx: watch::Sender<bool>,
    done_rx: oneshot::Receiver<()>,
    engine_done: bool,
    engine: std::thread::JoinHandle<anyhow::Result<EngineSummary>>,
    stats: Arc<ReaderStats>,
    /// The session recorded.
    pub session: i64,
    /// Probes attached, of all the recorder asked for.
    pub attached: (usize, usize),
    /// Where the recorder records when it is not the store itself (its
    /// file system is full).
    pub away: Option<String>,
    _checkpointer: Option<Checkpointer>,
    _metrics: Option<MetricsServer>,
    _probes: Option<Probes>,
}

/// What a recorder saw, once stopped.
#[derive(Debug, serde::Serialize)]
pub struct Stopped {
    /// The engine's summary.
    pub summary: EngineSummary,
    /// Records read from each ring.
    pub read: RingReads,
    /// Records that failed to decode.
    pub decode_errors: u64,
}

/// Records read from each ring.
#[derive(Debug, serde::Serialize)]
pub struct RingReads {
    /// The OOM ring.
    pub oom: u64,
    /// The critical ring.
    pub critical: u64,
    /// The data ring.
    pub data: u64,
}

impl Recorder {
    /// Starts recording as `cfg` says; returns once the engine has seeded
    /// the model and taken its first sample. Needs a tokio runtime with IO
    /// and time (the readers run on it).
    pub async fn start(cfg: RecorderConfig) -> anyhow::Result<Running> {
        crate::probes::caps::require_bpf()?;
        // The cgroup sampler holds its files open where the limit allows.
        crate::util::sys::raise_open_files();
        let (store, spill) = super::journal::spill::open_store(&cfg.store, &cfg.spill_dir)?;
        let checkpointer = match spill.home() {
            // The spill store checkpoints itself.
            Some(_) => None,
            None => Some(Checkpointer::spawn(&cfg.store, Duration::from_secs(5))?),
        };
        let probes = load_probes(&cfg)?;
        protect_from_oom_killer();
        measure_kmsg_clock();
        let (running, ready) = wire(cfg, store, spill, probes, checkpointer).await?;
        running.ready(ready).await
    }
}

/// The probes `cfg` asks for, loaded (not attached).
fn load_probes(cfg: &RecorderConfig) -> anyhow::Result<Probes> {
    let heap = cfg.traces_heap();
    let growth = cfg.growth.mode != GrowthMode::Off;
    let ring = if heap {
        crate::probes::HEAP_DATA_RING_BYTES
    } else if growth {
        crate::probes::GROWTH_DATA_RING_BYTES
    } else if cfg.cuda {
        crate::probes::CUDA_DATA_RING_BYTES
    } else {
        crate::probes::DATA_RING_BYTES
    };
    let heap_config =
        crate::probes::heap::config(cfg.sample_bytes, crate::probes::heap::DEFAULT_ALWAYS_BYTES);
    let mut probes = Probes::load_with(ring, &heap_config, &cfg.growth).context("cannot record")?;
    if cfg.cuda {
        probes.load_family(&uprobe::CUDA, false)?;
        probes.load_usdt()?;
    }
    if heap {
        probes.load_family(&uprobe::HEAP, false)?;
        for why in probes.attach_heap_syscalls() {
            tracing::warn!("{why}: mmap, mremap, brk and munmap are not traced");
        }
    }
    Ok(probes)
}

/// Keeps the recorder itself out of the OOM killer's reach.
fn protect_from_oom_killer() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        tracing::warn!(
            "could not set oom_score_adj to -1000: {e}; the OOM killer may pick the recorder"
        );
    }
}

/// The kernel stamps its log with a clock that drifts from the monotonic
/// one (tens of ms a day here): measured, kill reports keep joining their
/// tracepoint events however long the node has been up.
/// Whether the kernel's own SIGKILLs reach the OOM probe (the signal
/// probe is attached and has the task offsets it needs) and the kernel log
/// is read, so a mark with no SIGKILL before it can wait for its "Killed
/// process" line.
fn sees_kernel_kills(
    probes: &crate::probes::Probes,
    statuses: &[crate::probes::ProbeStatus],
) -> bool {
    let signal = statuses
        .iter()
        .any(|s| s.spec.program == tracer_common::programs::SIGNAL_GENERATE && s.error.is_none());
    signal
        && probes.config.task_tgid_off != 0
        && probes.config.task_comm_off != 0
        && std::fs::File::open(crate::collect::kmsg::KMSG).is_ok()
}

fn measure_kmsg_clock() {
    match crate::collect::kmsg::measure_clock_skew() {
        Some(ns) => {
            crate::util::time::set_kmsg_skew_ns(ns);
            tracing::debug!(
                "the kernel log's clock is {:.3} ms off the monotonic clock",
                ns as f64 / 1e6
            );
        }
        None => tracing::warn!(
            "cannot measure the kernel log's clock (writing to {} failed); kernel reports are joined as if it were the monotonic clock",
            crate::collect::kmsg::KMSG
        ),
    }
}

/// The readers of the three rings and the kernel log, started before the
/// probes attach so that nothing they emit is lost.
struct Readers {
    tasks: JoinSet<anyhow::Result<()>>,
    stats: Arc<ReaderStats>,
    inputs: (
        mpsc::Receiver<collect::decode::Event>,
        mpsc::Receiver<collect::decode::Event>,
        mpsc::Receiver<collect::decode::Event>,
        mpsc::Receiver<collect::kmsg::KmsgEvent>,
    ),
    sweep: Vec<Arc<tokio::sync::Notify>>,
}

fn start_readers(probes: &mut Probes) -> anyhow::Result<Readers> {
    let stats = Arc::new(ReaderStats::default());
    let (oom_tx, oom_rx) = mpsc::channel(1024);
    let (crit_tx, crit_rx) = mpsc::channel(CHANNEL);
    let (data_tx, data_rx) = mpsc::channel(CHANNEL);
    let (kmsg_tx, kmsg_rx) = mpsc::channel(256);
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();
    let mut sweep = Vec::new();
    for ((name, opts), tx) in collect::ring_options(DATA_POLL)
        .into_iter()
        .zip([oom_tx, crit_tx, data_tx])
    {
        sweep.extend(opts.drain_now.clone());
        let ring = probes.take_ring(name)?;
        let stats = stats.clone();
        tasks.spawn(async move { Ok(collect::read_ring(ring, name, tx, stats, opts).await?) });
    }
    {
        let stats = stats.clone();
        tasks.spawn(async move {
            if let Err(e) = collect::read_kmsg(kmsg_tx, stats).await {
                tracing::warn!(
                    "kernel log unavailable ({e}); kills are recorded without the kernel's report"
                );
            }
            std::future::pending::<()>().await;
            Ok(())
        });
    }
    if let Some(logger) = probes.logger() {
        tasks.spawn(async move {
            let mut fd = collect::async_fd(logger)?;
            loop {
                let mut guard = fd.readable_mut().await?;
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        });
    }
    Ok(Readers {
        tasks,
        stats,
        inputs: (oom_rx, crit_rx, data_rx, kmsg_rx),
        sweep,
    })
}

/// The exporters, the kill counters the endpoint and OTLP read, and the
/// published feed.
fn start_exports(
    cfg: &RecorderConfig,
    store: &Store,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(Exporters, Option<Feeds>)> {
    let redactor = cfg
        .redact
        .as_ref()
        .map(|words| crate::export::redact::Redactor::new(words));
    let mut exporters = Exporters::redacting(redactor);
    if let Some(path) = &cfg.export_jsonl {
        let j = crate::export::jsonl::JsonLines::open(path)
            .with_context(|| format!("--export-jsonl {}", path.display()))?;
        exporters
            .add(Box::new(j))
            .context("starting the JSON-lines exporter")?;
    }
    if cfg.metrics.is_none() && cfg.otlp.is_none() {
        return Ok((exporters, None));
    }
    // Kill counters start from the kills the store holds: a restart does
    // not reset them.
    let counts = Arc::new(KillCounts::default());
    let (kills, _damaged) = store.kills_lenient(i64::MIN, None, usize::MAX)?;
    for (_, k) in &kills {
        counts.count(k);
    }
    exporters
        .add(Box::new(KillCounter(counts.clone())))
        .context("starting the metrics")?;
    let feeds = Feeds::new(metrics.clone(), counts);
    if let Some(o) = &cfg.otlp {
        exporters
            .add(Box::new(start_otlp(cfg, o, feeds.clone())?))
            .context("starting the OTLP exporter")?;
    }
    Ok((exporters, Some(feeds)))
}

/// The OTLP exporter; a receiver that does not answer now is said, not
/// fatal (what it does not take is counted).
fn start_otlp(
    cfg: &RecorderConfig,
    o: &super::OtlpSettings,
    feeds: Feeds,
) -> anyhow::Result<crate::export::otlp::OtlpExporter> {
    use crate::export::otlp::{OtlpConfig, OtlpExporter};
    let (exporter, _lost) = OtlpExporter::start(OtlpConfig {
        endpoint: o.url.clone(),
        interval: o.interval,
        host: crate::util::sys::hostname(),
        feeds,
        store: cfg.store.clone(),
        describe_kill: o.describe_kill,
        describe_gpu_oom: o.describe_gpu_oom,
        trusted_uid: o.trusted_uid,
    })?;
    if crate::export::otlp::answers(&o.url, Duration::from_secs(1)) {
        tracing::info!(
            "otlp: sending to {} (metrics every {:?})",
            o.url,
            o.interval
        );
    } else {
        tracing::warn!(
            "otlp: nothing answers at {} now; recording goes on, and what it does not take is counted",
            o.url
        );
    }
    Ok(exporter)
}

/// The systemd journal's userspace OOM killers, followed on a thread of
/// their own (see `collect::journal`), unless asked not to.
fn follow_journal(
    cfg: &RecorderConfig,
    since_ns: i64,
) -> Option<mpsc::Receiver<crate::collect::journal::Logged>> {
    if !cfg.follow_journal {
        return None;
    }
    let (tx, rx) = mpsc::channel(64);
    match crate::collect::journal::follow(cfg.journal_dir.as_deref(), since_ns, tx) {
        Ok(()) => Some(rx),
        Err(e) => {
            tracing::warn!("the systemd journal is not followed: no thread ({e})");
            None
        }
    }
}

/// NVML on a thread of its own; no driver is a normal state, said in the
/// session and in the log. Returns the samples, the way to ask for one
/// now, and why there is no NVML.
#[allow(clippy::type_complexity)]
fn start_nvml(
    cfg: &RecorderConfig,
    store: &Store,
    session: i64,
) -> anyhow::Result<(
    Option<(
        mpsc::Receiver<crate::nvml::FromNvml>,
        std::sync::mpsc::Sender<()>,
    )>,
    Option<String>,
)> {
    match crate::nvml::open(cfg.nvml_lib.as_deref()) {
        Ok(nvml) => {
            let desc = crate::nvml::describe(&nvml);
            super::journal::session_gpu(store, session, &desc)?;
            let (tx, rx) = mpsc::channel(4);
            let now = crate::nvml::spawn(nvml, cfg.gpu_interval, tx)?;
            tracing::info!(
                "NVML: {desc}, sampled every {}",
                humantime::format_duration(cfg.gpu_interval)
            );
            Ok((Some((rx, now)), None))
        }
        Err(e) => {
            let why = chain(&e);
            if e.is_broken_driver() {
                tracing::warn!("{why}");
            } else {
                tracing::info!("{why}");
            }
            super::journal::session_gpu(store, session, &why)?;
            Ok((None, Some(why)))
        }
    }
}

/// Says what heap and growth tracing will do.
fn say_tracing(cfg: &RecorderConfig, growth: bool) {
    if !cfg.host_cgroups.is_empty() {
        tracing::info!(
            "heap: tracing the processes of {} (one sample per {})",
            cfg.host_cgroups.join(", "),
            bytes(cfg.sample_bytes)
        );
    }
    if let Some(pct) = cfg.heap_on_pressure {
        tracing::info!(
            "heap: tracing the processes of any memory cgroup at {pct}% of its limit, while it stays there"
        );
    }
    if growth {
        match cfg.growth.mode {
            GrowthMode::Floor => tracing::info!(
                "growth: programs on the page-fault hooks that follow nobody (the benchmark's floor)"
            ),
            GrowthMode::Risk => tracing::info!(
                "growth: sampling the page faults of memory cgroups at risk (working set at {}% of the limit and growing, a limit hit, an early warning{}; one sample per {}); off while none is",
                cfg.growth_arm_percent,
                if cfg.growth_cgroups.is_empty() {
                    String::new()
                } else {
                    format!("; always {}", cfg.growth_cgroups.join(", "))
                },
                bytes(cfg.growth.sample_bytes)
            ),
            mode => tracing::info!(
                "growth: sampling the page faults of {} processes (one sample per {})",
                if mode == GrowthMode::All {
                    "all"
                } else {
                    "memory-limited"
                },
                bytes(cfg.growth.sample_bytes)
            ),
        }
    }
}

/// Everything after the probes are loaded: readers, attach, the session,
/// the watcher, NVML, exports, the engine's thread.
async fn wire(
    cfg: RecorderConfig,
    mut store: Store,
    spill: Spill,
    mut probes: Probes,
    checkpointer: Option<Checkpointer>,
) -> anyhow::Result<(Running, oneshot::Receiver<()>)> {
    // Readers first, so nothing the probes emit after attach is lost.
    let readers = start_readers(&mut probes)?;
    let drops = probes.take_drop_counters()?;
    let memcg = probes.take_memcg_counters()?;
    let growth_maps = if cfg.growth.mode != GrowthMode::Off {
        Some(probes.take_growth_maps()?)
    } else {
        None
    };
    // Python frames in heap and growth stacks: a kernel that cannot load
    // the map records without them.
    let python = cfg
        .python_frames
        .then(|| probes.take_python_map().ok())
        .flatten();
    // The stacks of large CUDA allocations, for a GPU OOM's "held by":
    // read by the heap worker, which runs with heap or growth tracing.
    let cuda_stacks = cfg.cuda && (cfg.traces_heap() || growth_maps.is_some());
    if cuda_stacks {
        probes.cuda_stacks(Some(tracer_common::cuda::STACK_SAMPLE_BYTES))?;
    }
    let attach_ns = wall_now_ns();
    let mut statuses = probes.attach()?;
    let on_risk = cfg.growth.mode == GrowthMode::Risk;
    let growth_maps = match growth_maps.map(|m| (m, probes.attach_growth(on_risk))) {
        Some((mut m, Ok(more))) => {
            if let Some(why) = &probes.growth_note {
                tracing::warn!("growth: {why}; only --growth all follows processes");
            }
            statuses.extend(more);
            m.hooks = probes.take_fault_hooks();
            Some(m)
        }
        Some((_, Err(e))) => {
            tracing::warn!("growth attribution off: {}", chain(&e));
            None
        }
        None => None,
    };
    let attached = statuses.iter().filter(|s| s.error.is_none()).count();
    let probe_json = serde_json::to_string(
        &statuses
            .iter()
            .map(|s| serde_json::json!({ "hook": s.spec.hook.to_string(), "error": s.error }))
            .collect::<Vec<_>>(),
    )?;

    let mut model = ProcessTable::new(CgroupLayout::detect(), 300_000_000_000, 1 << 20);
    model.set_kube(crate::model::kube::KubeResolver::new(&cfg.host_root));
    let session = super::journal::start_session(&mut store, &probe_json)?;
    let opts = EngineOptions {
        sample_interval: cfg.sample_interval,
        retention: cfg.retention,
        max_store_bytes: cfg.max_store_bytes,
        cgroups: cfg.cgroups.clone(),
        scan_items: (0..)
            .zip(MEMCG_ITEM_NAMES)
            .filter(|(_, n)| n.starts_with("PGSCAN"))
            .map(|(slot, _)| slot)
            .collect(),
        sees_kernel_kills: sees_kernel_kills(&probes, &statuses),
        leak_step: cfg.leak_step,
        leak_min_span: cfg.leak_min_span,
    };
    // With uprobe families the library watcher owns the probes (it
    // attaches as libraries and processes appear); otherwise they stay
    // here, attached, until the end.
    let heap = cfg.traces_heap();
    let mut watched = Vec::new();
    if cfg.cuda {
        watched.push(Watched {
            family: &uprobe::CUDA,
            scope: Scope::Node,
        });
    }
    if heap {
        watched.push(Watched {
            family: &uprobe::HEAP,
            scope: Scope::Cgroups(cfg.host_cgroups.clone()),
        });
    }
    let (watcher, probes) = if watched.is_empty() {
        (None, Some(probes))
    } else {
        let w = LibraryWatcher::spawn(probes, watched).context("starting the library watcher")?;
        (Some(w), None)
    };
    let (gpu, nvml_missing) = start_nvml(&cfg, &store, session)?;
    let metrics = Arc::new(Metrics::default());
    let (exporters, feeds) = start_exports(&cfg, &store, &metrics)?;
    let published = feeds.as_ref().map(|f| f.published.clone());
    let metrics_server = match (cfg.metrics, feeds) {
        (Some(addr), Some(feeds)) => {
            let server = MetricsServer::start(
                addr,
                cfg.metrics_token_file.as_deref(),
                feeds,
                cfg.store.clone(),
            )?;
            if server
                .stats()
                .bind_failures
                .load(std::sync::atomic::Ordering::Relaxed)
                == 0
            {
                tracing::info!("metrics at http://{}/metrics", server.addr);
            }
            Some(server)
        }
        _ => None,
    };
    let warn = (!cfg.warn_before.is_zero() || cfg.warn_psi.is_some())
        .then(|| WarnGate::new(cfg.warn_before.as_secs_f64(), cfg.warn_psi));
    let heap_worker = if heap || growth_maps.is_some() {
        let view = View {
            top: 10,
            growth_window_s: 60,
            old_after_s: 60,
        };
        let w = HeapWorker::spawn(cfg.sample_bytes, cfg.growth.sample_bytes, view, python)
            .context("starting the heap worker")?;
        if cuda_stacks {
            w.set_cuda_sample_bytes(tracer_common::cuda::STACK_SAMPLE_BYTES);
        }
        if crate::probes::growth::returns_traced(&statuses) {
            w.returns_traced();
        }
        Some(w)
    } else {
        None
    };
    say_tracing(&cfg, growth_maps.is_some());
    let pressure = cfg
        .heap_on_pressure
        .map(|pct| PressureGate::new(pct, 10_000_000_000));
    let away = spill.home().map(|_| {
        format!(
            ", into its spill store {} while its file system is full",
            store.path().display()
        )
    });
    let (gpu_rx, sample_now) = match gpu {
        Some((rx, now)) => (Some(rx), Some(now)),
        None => (None, None),
    };
    let engine = Engine::new(Parts {
        store,
        session_id: session,
        model,
        opts,
        drops: Some(drops),
        memcg: Some(memcg),
        cuda: cfg.cuda,
        // Records say GPU data is missing when GPUs were asked for.
        nvml_missing: nvml_missing.filter(|_| cfg.cuda || cfg.nvml_lib.is_some()),
        sample_now,
        watcher,
        heap: heap_worker,
        arming: on_risk.then(|| {
            crate::recorder::features::arming::Armer::new(
                cfg.growth_arm_percent,
                cfg.growth_cgroups.clone(),
            )
        }),
        growth: growth_maps,
        heap_family: heap,
        warn,
        pressure,
        spill,
        exporters,
        published,
        metrics,
        started_ns: attach_ns,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (oom, critical, data, kmsg) = readers.inputs;
    let inputs = Inputs {
        stop: stop_rx,
        oom,
        critical,
        data,
        kmsg,
        gpu: gpu_rx,
        journal: follow_journal(&cfg, attach_ns),
        sweep: readers.sweep,
    };
    let (ready_tx, ready_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let engine = std::thread::Builder::new()
        .name("tracer-engine".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build();
            let result = match rt {
                Ok(rt) => rt
                    .block_on(engine.run(inputs, ready_tx))
                    .map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::Error::from(e).context("engine runtime")),
            };
            let _ = done_tx.send(());
            result
        })?;
    Ok((
        Running {
            tasks: readers.tasks,
            stop_tx,
            done_rx,
            engine_done: false,
            engine,
            stats: readers.stats,
            session,
            attached: (attached, statuses.len()),
            away,
            _checkpointer: checkpointer,
            _metrics: metrics_server,
            _probes: probes,
        },
        ready_rx,
    ))
}

/// The signals that stop a recorder cleanly: SIGINT, SIGTERM and SIGHUP
/// (a closed terminal). Installed before the recorder starts, so that one
/// that comes during start-up stops it once it is ready.
pub struct Stops {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Stops {
    /// Installs the handlers.
    pub fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

impl Running {
    /// Waits for one of `stops`, or for the recorder to fail on its own
    /// (then the error, for [`Running::stop`]).
    pub async fn until(&mut self, mut stops: Stops) -> Option<anyhow::Error> {
        tokio::select! {
            _ = stops.int.recv() => None,
            _ = stops.term.recv() => None,
            _ = stops.hup.recv() => None,
            e = self.failed() => Some(e),
        }
    }

    /// Waits for the engine's first sample; an engine that stops first is
    /// stopped in order and its error returned.
    async fn ready(mut self, ready: oneshot::Receiver<()>) -> anyhow::Result<Self> {
        tokio::select! {
            r = ready => if r.is_ok() {
                return Ok(self);
            },
            _ = &mut self.done_rx => self.engine_done = true,
        }
        Err(match self.stop(Some(anyhow!("the engine stopped"))).await {
            Err(e) => e,
            Ok(_) => anyhow!("the engine stopped"),
        })
    }

    /// Resolves when the recorder fails on its own: the engine or a reader
    /// stopped.
    pub async fn failed(&mut self) -> anyhow::Error {
        tokio::select! {
            _ = &mut self.done_rx => {
                self.engine_done = true;
                anyhow!("the engine stopped")
            }
            Some(r) = self.tasks.join_next() => match r {
                Ok(Ok(())) => anyhow!("a reader stopped"),
                Ok(Err(e)) => e,
                Err(e) => anyhow!("a reader panicked: {e}"),
            },
        }
    }

    /// Stops: the engine takes in what is queued and what the rings still
    /// hold (briefly, OOM kills first; the readers keep reading
    /// meanwhile), then ends; only then are the readers stopped. `failure`
    /// is why, when the recorder failed.
    pub async fn stop(self, failure: Option<anyhow::Error>) -> anyhow::Result<Stopped> {
        let Self {
            mut tasks,
            stop_tx,
            mut done_rx,
            engine_done,
            engine,
            stats,
            ..
        } = self;
        let _ = stop_tx.send(true);
        if !engine_done {
            let _ = (&mut done_rx).await;
        }
        tasks.shutdown().await;
        let summary = engine
            .join()
            .map_err(|_| anyhow!("the engine thread panicked"))?;
        let summary = match (summary, failure) {
            (Ok(s), None) => s,
            (Err(e), _) | (Ok(_), Some(e)) => return Err(e.context("recording failed")),
        };
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        Ok(Stopped {
            summary,
            read: RingReads {
                oom: n(&stats.oom),
                critical: n(&stats.critical),
                data: n(&stats.data),
            },
            decode_errors: n(&stats.decode_errors),
        })
    }
}
