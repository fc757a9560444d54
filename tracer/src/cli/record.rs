//! `tracer record`: the node agent.

use std::{path::Path, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context as _, anyhow};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot},
    task::JoinSet,
};

use super::StoreArg;
use crate::{
    collect::{self, ReaderStats},
    model::{ProcessTable, cgroup::CgroupLayout},
    probes::{
        Probes,
        growth::{GrowthMode, GrowthOptions},
        heap::MAX_SAMPLE_BYTES,
        layout::MEMCG_ITEM_NAMES,
        uprobe,
        watch::{LibraryWatcher, Scope, Watched},
    },
    recorder::journal::spill::{Home, Spill},
    recorder::{
        engine::{Engine, EngineOptions, Parts},
        heap::{HeapWorker, View},
    },
    store::{Checkpointer, Store, StoreError},
    util::time::wall_now_ns,
};

/// Options of `tracer record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Memory cgroup to sample even when it holds no process (path as in /proc/PID/cgroup). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Vec<String>,
    /// Sampling period of the memory cgroups.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    pub sample_interval: Duration,
    /// Drop recorded data older than this.
    #[arg(long, default_value = "7d", value_parser = super::parse_duration)]
    pub retention: Duration,
    /// Keep the store under this size (oldest events go first, kills last).
    #[arg(long, default_value = "512MiB", value_parser = super::parse_size)]
    pub max_store_size: u64,
    /// Where kills are kept while the store's file system is full (a
    /// tmpfs, at most 16MiB; imported into the store once it has room).
    #[arg(long, value_name = "DIR", default_value = crate::store::spill::DEFAULT_DIR)]
    pub spill_dir: std::path::PathBuf,
    /// Also trace CUDA allocations of every process on the node (uprobes on
    /// each distinct libcudart/libcuda file, and cudart linked into executables).
    #[arg(long)]
    pub cuda: bool,
    /// NVML library to load instead of the driver's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<std::path::PathBuf>,
    /// Append every stored kill and GPU OOM, with its store id, to this file
    /// as a JSON line (created 0600; a slow reader costs counted drops,
    /// never a late kill).
    #[arg(long, value_name = "PATH")]
    pub export_jsonl: Option<std::path::PathBuf>,
    /// Also hide the values of options and variables whose name contains
    /// WORD in the command lines that leave the node (OTLP, JSON lines);
    /// password, token, secret, key and the like always are. Repeatable.
    #[arg(long, value_name = "WORD")]
    pub redact: Vec<String>,
    /// Send command lines whole, secrets and all (the store always keeps
    /// them whole).
    #[arg(long)]
    pub no_redact: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464).
    /// An address that is taken is retried every 5 s; recording goes on.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// A file holding a bearer token that every page of --metrics but
    /// /healthz then needs (`Authorization: Bearer TOKEN`); required for an
    /// address other than loopback.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// Early warning: a `pressure` event (stored, counted, exported) when a
    /// memory cgroup, at its growth rate over the last 10 s, would reach its
    /// limit within this long, and another when it no longer would
    /// (0: off). A kill carries the warning that preceded it.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration, value_name = "DURATION")]
    pub warn_before: Duration,
    /// Early warning also when a memory cgroup's PSI `some avg10` reaches
    /// this share (cgroup v2 only; e.g. 20%).
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub warn_psi: Option<f64>,
    /// Also send the metrics (every --otlp-interval) and each stored kill
    /// and GPU OOM (a log record with its verdict) to this OTLP/HTTP
    /// receiver, e.g. http://127.0.0.1:4318 (a collector on the node).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// With --otlp on this host's loopback: besides root, the uid whose
    /// listening socket may receive command lines (a receiver run by
    /// another user gets kills without them).
    #[arg(long, value_name = "UID")]
    pub otlp_trusted_uid: Option<u32>,
    /// With --otlp: how often the metrics are pushed.
    #[arg(long, default_value = "15s", value_parser = super::parse_duration)]
    pub otlp_interval: Duration,
    /// Where the host's files are (Kubernetes names come from
    /// HOST_ROOT/var/log/pods, /var/log/containers and the runtimes' state
    /// under /run): `/host` for an agent in a container that mounts them there.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub host_root: std::path::PathBuf,
    /// NVML sampling period (at least 100ms).
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    pub gpu_interval: Duration,
    /// Trace the heap (malloc and friends, sampled) of every process of this
    /// memory cgroup and below, now and later (path as in /proc/PID/cgroup);
    /// a kill of one carries its top allocation sites. Repeatable.
    #[arg(long, value_name = "PATH")]
    pub host_cgroup: Vec<String>,
    /// With --host-cgroup: one sample per this many bytes allocated on average.
    #[arg(long, value_parser = super::parse_size, default_value = "512KiB", value_name = "SIZE")]
    pub sample_bytes: u64,
    /// Growth attribution: which processes' page faults are sampled with
    /// their stacks, so that a kill says which code grew the memory
    /// (`limited`: processes in a memory cgroup with a limit).
    #[arg(long, value_enum, default_value = "limited", value_name = "WHO")]
    pub growth: GrowthMode,
    /// Heap sampling under pressure: when a memory cgroup's usage reaches
    /// this share of its limit (e.g. 90%), trace the heap of its processes
    /// (as --host-cgroup does) until it has stayed 10 points under it for
    /// 10 s; both moments are recorded, and a kill meanwhile carries its
    /// victim's allocation sites. Off by default.
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub heap_on_pressure: Option<f64>,
    /// With growth attribution: every anonymous mapping of at least this
    /// many bytes by a followed process is recorded with its stack (a
    /// reservation; 0: none).
    #[arg(long, value_parser = super::parse_size, default_value = "64MiB", value_name = "SIZE")]
    pub growth_reserve_bytes: u64,
    /// One growth sample per this many bytes a process faults in, on
    /// average (0: every fault; for tests).
    #[arg(long, value_parser = super::parse_size, default_value = "1MiB", value_name = "SIZE")]
    pub growth_sample_bytes: u64,
}

impl RecordArgs {
    /// Whether the heap family is loaded: for --host-cgroup, or for
    /// cgroups under pressure.
    fn traces_heap(&self) -> bool {
        !self.host_cgroup.is_empty() || self.heap_on_pressure.is_some()
    }
}

/// The OTLP exporter for `url`, with the verdicts of `explain`; a
/// receiver that does not answer now is said, not fatal (what it does not
/// take is counted).
fn start_otlp(
    url: &str,
    args: &RecordArgs,
    feeds: crate::export::prometheus::Feeds,
) -> anyhow::Result<crate::export::otlp::OtlpExporter> {
    use crate::export::otlp::{OtlpConfig, OtlpExporter};
    let (exporter, _lost) = OtlpExporter::start(OtlpConfig {
        endpoint: url.to_string(),
        interval: args.otlp_interval,
        host: crate::util::sys::hostname(),
        feeds,
        store: args.store.path.clone(),
        describe_kill: |k| {
            let v = crate::explain::verdict(k);
            let cause = serde_json::to_value(v.cause)
                .ok()
                .and_then(|c| c.as_str().map(String::from))
                .unwrap_or_default();
            (cause, v.summary)
        },
        describe_gpu_oom: crate::explain::gpu::verdict,
        trusted_uid: args.otlp_trusted_uid,
    })?;
    if crate::export::otlp::answers(url, Duration::from_secs(1)) {
        tracing::info!(
            "otlp: sending to {url} (metrics every {:?})",
            args.otlp_interval
        );
    } else {
        tracing::warn!(
            "otlp: nothing answers at {url} now; recording goes on, and what it does not take is counted"
        );
    }
    Ok(exporter)
}

/// `90%` or `90`: a share of a limit, above 0 and at most 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage (e.g. 90%)"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!(
            "{s}: a share of the limit is above 0% and at most 100%"
        ));
    }
    Ok(v)
}

/// How often the recorder drains the data ring without a wakeup: new
/// processes reach the model within this (kills nudge it at once).
const DATA_POLL: Duration = Duration::from_millis(100);

/// Capacity of the reader -> engine channels.
const CHANNEL: usize = 16384;

/// Keeps the recorder itself out of the OOM killer's reach.
fn protect_from_oom_killer() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        tracing::warn!(
            "could not set oom_score_adj to -1000: {e}; the OOM killer may pick the recorder"
        );
    }
}

/// Shortest `--retention`: less would delete a kill before anyone could
/// read it.
pub const MIN_RETENTION: Duration = Duration::from_secs(3600);
/// Smallest `--max-store-size`: room for the WAL and a day of kills.
pub const MIN_STORE_BYTES: u64 = 32 << 20;

/// Refuses bounds that would make the store useless (`--retention 0s`
/// would delete every kill as soon as it was written).
fn check_bounds(args: &RecordArgs) -> anyhow::Result<()> {
    if args.retention < MIN_RETENTION {
        return Err(anyhow!(
            "--retention {} is shorter than the minimum of 1h: kills would be deleted before anyone could explain them",
            humantime::format_duration(args.retention)
        ));
    }
    if args.max_store_size < MIN_STORE_BYTES {
        return Err(anyhow!(
            "--max-store-size {} is below the minimum of 32MiB (the WAL alone may use 4MiB)",
            args.max_store_size
        ));
    }
    Ok(())
}

/// Runs the recorder until SIGINT or SIGTERM.
pub fn run(args: RecordArgs) -> anyhow::Result<ExitCode> {
    if args.sample_interval < Duration::from_millis(100) {
        return Err(anyhow!("--sample-interval must be at least 100ms"));
    }
    if args.gpu_interval < Duration::from_millis(100) {
        return Err(anyhow!("--gpu-interval must be at least 100ms"));
    }
    check_bounds(&args)?;
    if let Some(url) = &args.otlp {
        crate::export::otlp::check_url(url)?;
        if args.otlp_interval < Duration::from_secs(1) {
            return Err(anyhow!("--otlp-interval must be at least 1s"));
        }
    }
    crate::probes::caps::require_bpf()?;
    let (store, spill) = open_store(&args.store.path, &args.spill_dir)?;
    let _checkpointer = match spill.home() {
        // The spill store checkpoints itself.
        Some(_) => None,
        None => Some(Checkpointer::spawn(
            &args.store.path,
            Duration::from_secs(5),
        )?),
    };
    let heap = args.traces_heap();
    if heap && (args.sample_bytes == 0 || args.sample_bytes > MAX_SAMPLE_BYTES) {
        return Err(anyhow!(
            "--sample-bytes must be between 1 and {} for record (every allocation of a cgroup is attach --host's job)",
            crate::util::units::bytes(MAX_SAMPLE_BYTES)
        ));
    }
    if args.growth_sample_bytes > MAX_SAMPLE_BYTES {
        return Err(anyhow!(
            "--growth-sample-bytes must be at most {}",
            crate::util::units::bytes(MAX_SAMPLE_BYTES)
        ));
    }
    let growth = args.growth != GrowthMode::Off;
    let ring = if heap {
        crate::probes::HEAP_DATA_RING_BYTES
    } else if growth {
        crate::probes::GROWTH_DATA_RING_BYTES
    } else if args.cuda {
        crate::probes::CUDA_DATA_RING_BYTES
    } else {
        crate::probes::DATA_RING_BYTES
    };
    let heap_config =
        crate::probes::heap::config(args.sample_bytes, crate::probes::heap::DEFAULT_ALWAYS_BYTES);
    let growth_opts = GrowthOptions {
        mode: args.growth,
        sample_bytes: args.growth_sample_bytes,
        reserve_bytes: args.growth_reserve_bytes,
    };
    let mut probes =
        Probes::load_with(ring, &heap_config, &growth_opts).context("cannot record")?;
    if args.cuda {
        probes.load_family(&uprobe::CUDA, false)?;
        probes.load_usdt()?;
    }
    if heap {
        probes.load_family(&uprobe::HEAP, false)?;
        for why in probes.attach_heap_syscalls() {
            tracing::warn!("{why}: mmap, mremap, brk and munmap are not traced");
        }
    }
    protect_from_oom_killer();
    // The kernel stamps its log with a clock that drifts from the monotonic
    // one (tens of ms a day here): measured, kill reports keep joining
    // their tracepoint events however long the node has been up.
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(record(args, store, spill, probes))
}

/// Opens the store for recording. On a full file system, where even
/// opening it fails, the recorder records into the store's spill store
/// (`store::spill`) and goes back to the store when it has room. A spill
/// store an earlier recorder left is imported first.
fn open_store(path: &Path, spill_dir: &Path) -> anyhow::Result<(Store, Spill)> {
    match Store::open_rw(path) {
        Ok(mut store) => {
            match store.import_left_spill(spill_dir) {
                Ok(Some(i)) => tracing::info!(
                    "imported {} kill(s) ({} already stored), {} GPU OOM(s) and {} other rows from the spill store an earlier recorder left",
                    i.kills,
                    i.known,
                    i.gpu_ooms,
                    i.rows
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    "the spill store {} an earlier recorder left was not imported, and is left in place: {e:#}",
                    crate::store::spill::path_for(path, spill_dir).display()
                ),
            }
            Ok((store, Spill::new(spill_dir.into(), None)))
        }
        Err(e @ StoreError::Sql { .. })
            if e.is_disk_full() || !crate::store::has_room_for(path) =>
        {
            let lock = Store::lock_rw(path)?;
            let store = Store::open_spill(path, spill_dir).with_context(|| {
                format!("the store's file system is full ({e}), and the spill store in {} cannot be opened", spill_dir.display())
            })?;
            tracing::warn!(
                "the store's file system is full ({:#}): recording into the spill store {} until it has room",
                anyhow::Error::from(e),
                store.path().display()
            );
            let home = Home {
                path: path.into(),
                lock,
            };
            Ok((store, Spill::new(spill_dir.into(), Some(home))))
        }
        Err(e) => Err(e.into()),
    }
}

async fn record(
    args: RecordArgs,
    mut store: Store,
    spill: Spill,
    mut probes: Probes,
) -> anyhow::Result<ExitCode> {
    let stats = Arc::new(ReaderStats::default());
    let (oom_tx, oom_rx) = mpsc::channel(1024);
    let (crit_tx, crit_rx) = mpsc::channel(CHANNEL);
    let (data_tx, data_rx) = mpsc::channel(CHANNEL);
    let (kmsg_tx, kmsg_rx) = mpsc::channel(256);
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();

    // Readers first, so nothing the probes emit after attach is lost.
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
    let drops = probes.take_drop_counters()?;
    let memcg = probes.take_memcg_counters()?;
    let growth_maps = if args.growth != GrowthMode::Off {
        Some(probes.take_growth_maps()?)
    } else {
        None
    };
    let attach_ns = wall_now_ns();
    let mut statuses = probes.attach()?;
    let growth_maps = match growth_maps.map(|m| (m, probes.attach_growth())) {
        Some((m, Ok(more))) => {
            if let Some(why) = &probes.growth_note {
                tracing::warn!("growth: {why}; only --growth all follows processes");
            }
            statuses.extend(more);
            Some(m)
        }
        Some((_, Err(e))) => {
            tracing::warn!("growth attribution off: {}", super::chain(&e));
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

    let layout = CgroupLayout::detect();
    let mut model = ProcessTable::new(layout, 300_000_000_000, 1 << 20);
    model.set_kube(crate::model::kube::KubeResolver::new(&args.host_root));
    let session = store.start_session(
        wall_now_ns(),
        &crate::util::sys::hostname(),
        &crate::util::sys::kernel_release(),
        &probe_json,
    )?;
    let items = probes.notes.memcg_items.clone();
    let opts = EngineOptions {
        sample_interval: args.sample_interval,
        retention: args.retention,
        max_store_bytes: args.max_store_size,
        cgroups: args.cgroup.clone(),
        scan_items: MEMCG_ITEM_NAMES
            .iter()
            .filter(|n| n.starts_with("PGSCAN"))
            .filter_map(|n| items.get(*n).copied())
            .collect(),
    };
    // With uprobe families the library watcher owns the probes (it
    // attaches as libraries and processes appear); otherwise they stay
    // here, attached, until the end.
    let heap = args.traces_heap();
    let mut watched = Vec::new();
    if args.cuda {
        watched.push(Watched {
            family: &uprobe::CUDA,
            scope: Scope::Node,
        });
    }
    if heap {
        watched.push(Watched {
            family: &uprobe::HEAP,
            scope: Scope::Cgroups(args.host_cgroup.clone()),
        });
    }
    let (watcher, _probes) = if watched.is_empty() {
        (None, Some(probes))
    } else {
        let w = LibraryWatcher::spawn(probes, watched).context("starting the library watcher")?;
        (Some(w), None)
    };
    // NVML on a thread of its own; no driver is a normal state.
    let (gpu_rx, nvml_missing) = match crate::nvml::open(args.nvml_lib.as_deref()) {
        Ok(nvml) => {
            let desc = crate::nvml::describe(&nvml);
            store.session_gpu(session, &desc)?;
            let (tx, rx) = mpsc::channel(4);
            let now = crate::nvml::spawn(nvml, args.gpu_interval, tx)?;
            tracing::info!(
                "NVML: {desc}, sampled every {}",
                humantime::format_duration(args.gpu_interval)
            );
            (Some((rx, now)), None)
        }
        Err(e) => {
            let why = super::chain(&e);
            if e.is_broken_driver() {
                tracing::warn!("{why}");
            } else {
                tracing::info!("{why}");
            }
            store.session_gpu(session, &why)?;
            (None, Some(why))
        }
    };
    let redactor = (!args.no_redact).then(|| crate::export::redact::Redactor::new(&args.redact));
    let mut exporters = crate::export::Exporters::redacting(redactor);
    if let Some(path) = &args.export_jsonl {
        let j = crate::export::jsonl::JsonLines::open(path)
            .with_context(|| format!("--export-jsonl {}", path.display()))?;
        exporters
            .add(Box::new(j))
            .context("starting the JSON-lines exporter")?;
    }
    // Kill counters start from the kills the store holds: a restart
    // does not reset them.
    let kill_counts = if args.metrics.is_some() || args.otlp.is_some() {
        let counts = Arc::new(crate::export::prometheus::KillCounts::default());
        let (kills, _damaged) = store.kills_lenient(i64::MIN, None, usize::MAX)?;
        for (_, k) in &kills {
            counts.count(k);
        }
        exporters
            .add(Box::new(crate::export::prometheus::KillCounter(
                counts.clone(),
            )))
            .context("starting the metrics")?;
        Some(counts)
    } else {
        None
    };
    let away = spill.home().map(|_| {
        format!(
            ", into its spill store {} while its file system is full",
            store.path().display()
        )
    });
    let metrics = Arc::new(crate::recorder::metrics::Metrics::default());
    let feeds =
        kill_counts.map(|counts| crate::export::prometheus::Feeds::new(metrics.clone(), counts));
    if let (Some(url), Some(feeds)) = (&args.otlp, &feeds) {
        exporters
            .add(Box::new(start_otlp(url, &args, feeds.clone())?))
            .context("starting the OTLP exporter")?;
    }
    let published = feeds.as_ref().map(|f| f.published.clone());
    let _metrics_server = match (args.metrics, feeds) {
        (Some(addr), Some(feeds)) => {
            let server = crate::export::prometheus::MetricsServer::start(
                addr,
                args.metrics_token_file.as_deref(),
                feeds,
                args.store.path.clone(),
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
    let warn = (!args.warn_before.is_zero() || args.warn_psi.is_some()).then(|| {
        crate::correlate::warning::WarnGate::new(args.warn_before.as_secs_f64(), args.warn_psi)
    });
    let heap_worker = if heap || growth_maps.is_some() {
        let view = View {
            top: 10,
            growth_window_s: 60,
            old_after_s: 60,
        };
        Some(
            HeapWorker::spawn(args.sample_bytes, args.growth_sample_bytes, view)
                .context("starting the heap worker")?,
        )
    } else {
        None
    };
    if !args.host_cgroup.is_empty() {
        tracing::info!(
            "heap: tracing the processes of {} (one sample per {})",
            args.host_cgroup.join(", "),
            crate::util::units::bytes(args.sample_bytes)
        );
    }
    let pressure = args.heap_on_pressure.map(|pct| {
        tracing::info!(
            "heap: tracing the processes of any memory cgroup at {pct}% of its limit, while it stays there"
        );
        crate::correlate::pressure::PressureGate::new(pct, 10_000_000_000)
    });
    if growth_maps.is_some() {
        match args.growth {
            GrowthMode::Floor => tracing::info!(
                "growth: programs on the page-fault hooks that follow nobody (the benchmark's floor)"
            ),
            mode => tracing::info!(
                "growth: sampling the page faults of {} processes (one sample per {})",
                if mode == GrowthMode::All {
                    "all"
                } else {
                    "memory-limited"
                },
                crate::util::units::bytes(args.growth_sample_bytes)
            ),
        }
    }
    let (ready_tx, ready_rx) = oneshot::channel();
    let (gpu_rx, sample_now) = match gpu_rx {
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
        cuda: args.cuda,
        // Records say GPU data is missing when GPUs were asked for.
        nvml_missing: nvml_missing.filter(|_| args.cuda || args.nvml_lib.is_some()),
        sample_now,
        watcher,
        heap: heap_worker,
        growth: growth_maps,
        warn,
        pressure,
        spill,
        exporters,
        published,
        metrics,
        started_ns: attach_ns,
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let inputs = crate::recorder::engine::Inputs {
        stop: stop_rx,
        oom: oom_rx,
        critical: crit_rx,
        data: data_rx,
        kmsg: kmsg_rx,
        gpu: gpu_rx,
        sweep,
    };
    let (done_tx, mut done_rx) = oneshot::channel();
    let engine_thread = std::thread::Builder::new()
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

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // A closed terminal (or `kill -HUP`) is a clean stop like SIGTERM: the
    // summary is printed and the session closed in the store.
    let mut sighup = signal(SignalKind::hangup())?;
    let mut engine_done = false;
    tokio::select! {
        r = ready_rx => if r.is_ok() {
            crate::say!(
                "tracer: recording to {}{} (session {session}); {attached}/{} probes attached",
                args.store.path.display(),
                away.as_deref().unwrap_or(""),
                statuses.len()
            );
        },
        _ = &mut done_rx => engine_done = true,
    }
    let failure = if engine_done {
        Some(anyhow!("the engine stopped"))
    } else {
        tokio::select! {
            _ = sigint.recv() => None,
            _ = sigterm.recv() => None,
            _ = sighup.recv() => None,
            _ = &mut done_rx => {
                engine_done = true;
                Some(anyhow!("the engine stopped"))
            }
            Some(r) = tasks.join_next() => Some(match r {
                Ok(Ok(())) => anyhow!("a reader stopped"),
                Ok(Err(e)) => e,
                Err(e) => anyhow!("a reader panicked: {e}"),
            }),
        }
    };
    // The engine takes in what is queued and what the rings still hold
    // (briefly, OOM kills first; the readers keep reading meanwhile),
    // then ends; only then are the readers stopped.
    let _ = stop_tx.send(true);
    if !engine_done {
        let _ = (&mut done_rx).await;
    }
    tasks.shutdown().await;
    let summary = engine_thread
        .join()
        .map_err(|_| anyhow!("the engine thread panicked"))?;
    let summary = match (summary, failure) {
        (Ok(s), None) => s,
        (Err(e), _) => return Err(e.context("recording failed")),
        (Ok(_), Some(e)) => return Err(e.context("recording failed")),
    };
    crate::say!(
        "tracer: stopped; {}",
        serde_json::to_string(&serde_json::json!({
            "summary": summary,
            "read": { "oom": stats.oom.load(std::sync::atomic::Ordering::Relaxed), "critical": stats.critical.load(std::sync::atomic::Ordering::Relaxed), "data": stats.data.load(std::sync::atomic::Ordering::Relaxed) },
            "decode_errors": stats.decode_errors.load(std::sync::atomic::Ordering::Relaxed),
        }))?
    );
    Ok(ExitCode::SUCCESS)
}
