//! `tracer record`: the node agent.

use std::{process::ExitCode, time::Duration};

use anyhow::{Context as _, anyhow};

use super::StoreArg;
use crate::{
    probes::{
        growth::{GrowthMode, GrowthOptions},
        heap::MAX_SAMPLE_BYTES,
    },
    recorder::{OtlpSettings, Recorder, RecorderConfig, Stops},
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
    /// Do not follow the systemd journal. Followed, systemd-oomd's,
    /// earlyoom's, nohang's and kubelet's entries give the kills they sent
    /// their reasons (the pressure against its limit, the memory left).
    #[arg(long)]
    pub no_journal: bool,
    /// Follow the journal files of this directory instead of the system
    /// journal (a journal kept elsewhere, or written by systemd-journal-remote).
    #[arg(long, value_name = "DIR", conflicts_with = "no_journal")]
    pub journal_dir: Option<std::path::PathBuf>,
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
    /// (`risk`: processes in a memory cgroup at risk of reaching its
    /// limit, the page-fault programs attached only while one is;
    /// `limited`: in any memory cgroup with a limit, always).
    #[arg(long, value_enum, default_value = "risk", value_name = "WHO")]
    pub growth: GrowthMode,
    /// With --growth risk: a memory cgroup whose working set reaches this
    /// share of its limit while it grows is armed (its processes' page
    /// faults sampled) until it has been calm 10 points under it for 10 s;
    /// a limit hit or an early warning arms it too.
    //
    // 60 %: a cgroup growing toward its limit has 40 % of it still to go
    // (at the rate that reaches the limit in 10 s, 4 s: several samples);
    // most long-running services sit below it at their steady state, and a
    // lower level would keep the hooks on for them for nothing.
    #[arg(long, value_parser = parse_percent, default_value = "60%", value_name = "PERCENT")]
    pub growth_arm: f64,
    /// With --growth risk: a memory cgroup armed whatever its risk, while
    /// it exists (its processes' page faults always sampled). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub growth_cgroup: Vec<String>,
    /// Slow leaks: a working-set point per memory cgroup every this long
    /// (the least of the samples in it). For tests, which cannot wait hours.
    #[arg(long, hide = true, default_value = "60s", value_parser = super::parse_duration)]
    pub leak_step: Duration,
    /// Slow leaks: a run of points spans at least this long before it is
    /// judged a leak.
    #[arg(long, hide = true, default_value = "30m", value_parser = super::parse_duration)]
    pub leak_min_span: Duration,
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
    /// Python frames in heap and growth stacks: the stack programs walk
    /// the sampled thread's CPython frames (3.9 to 3.13); `false` leaves
    /// CPython processes with their native frames only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub python_frames: bool,
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

/// Runs the recorder until SIGINT, SIGTERM or SIGHUP.
pub fn run(args: RecordArgs) -> anyhow::Result<ExitCode> {
    let cfg = config(args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(record(cfg))
}

/// The recorder's settings from the flags, refused where they make no
/// sense.
fn config(args: RecordArgs) -> anyhow::Result<RecorderConfig> {
    if args.sample_interval < Duration::from_millis(100) {
        return Err(anyhow!("--sample-interval must be at least 100ms"));
    }
    if args.gpu_interval < Duration::from_millis(100) {
        return Err(anyhow!("--gpu-interval must be at least 100ms"));
    }
    check_bounds(&args)?;
    if let Some(dir) = args.journal_dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(anyhow!(
            "--journal-dir {}: no such directory (journalctl reads journal files from a directory; leave the flag out to follow this machine's journal)",
            crate::util::term::escape(&dir.to_string_lossy())
        ));
    }
    if let Some(url) = &args.otlp {
        crate::export::otlp::check_url(url)?;
        if args.otlp_interval < Duration::from_secs(1) {
            return Err(anyhow!("--otlp-interval must be at least 1s"));
        }
    }
    let cfg = RecorderConfig {
        store: args.store.path,
        spill_dir: args.spill_dir,
        cgroups: args.cgroup,
        sample_interval: args.sample_interval,
        retention: args.retention,
        max_store_bytes: args.max_store_size,
        cuda: args.cuda,
        nvml_lib: args.nvml_lib,
        gpu_interval: args.gpu_interval,
        follow_journal: !args.no_journal,
        journal_dir: args.journal_dir,
        export_jsonl: args.export_jsonl,
        redact: (!args.no_redact).then_some(args.redact),
        metrics: args.metrics,
        metrics_token_file: args.metrics_token_file,
        otlp: args.otlp.map(|url| OtlpSettings {
            url,
            interval: args.otlp_interval,
            trusted_uid: args.otlp_trusted_uid,
            describe_kill: |k| {
                let v = crate::explain::verdict(k);
                let cause = serde_json::to_value(v.cause)
                    .ok()
                    .and_then(|c| c.as_str().map(String::from))
                    .unwrap_or_default();
                (cause, v.summary)
            },
            describe_gpu_oom: crate::explain::gpu::verdict,
        }),
        warn_before: args.warn_before,
        warn_psi: args.warn_psi,
        host_root: args.host_root,
        host_cgroups: args.host_cgroup,
        sample_bytes: args.sample_bytes,
        growth: GrowthOptions {
            mode: args.growth,
            sample_bytes: args.growth_sample_bytes,
            reserve_bytes: args.growth_reserve_bytes,
        },
        heap_on_pressure: args.heap_on_pressure,
        python_frames: args.python_frames,
        growth_arm_percent: args.growth_arm,
        leak_step: args.leak_step,
        leak_min_span: args.leak_min_span,
        growth_cgroups: args.growth_cgroup,
    };
    if !cfg.growth_cgroups.is_empty() && cfg.growth.mode != GrowthMode::Risk {
        return Err(anyhow!(
            "--growth-cgroup arms a cgroup for --growth risk; with --growth {} it has nothing to do",
            clap::ValueEnum::to_possible_value(&cfg.growth.mode)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        ));
    }
    for p in &cfg.growth_cgroups {
        super::check_cgroup_path("--growth-cgroup", p)?;
    }
    if cfg.traces_heap() && (cfg.sample_bytes == 0 || cfg.sample_bytes > MAX_SAMPLE_BYTES) {
        return Err(anyhow!(
            "--sample-bytes must be between 1 and {} for record (every allocation of a cgroup is attach --host's job)",
            crate::util::units::bytes(MAX_SAMPLE_BYTES)
        ));
    }
    if cfg.growth.sample_bytes > MAX_SAMPLE_BYTES {
        return Err(anyhow!(
            "--growth-sample-bytes must be at most {}",
            crate::util::units::bytes(MAX_SAMPLE_BYTES)
        ));
    }
    Ok(cfg)
}

async fn record(cfg: RecorderConfig) -> anyhow::Result<ExitCode> {
    let store = cfg.store.clone();
    // A closed terminal (or `kill -HUP`) is a clean stop like SIGTERM: the
    // summary is printed and the session closed in the store.
    let stops = Stops::install()?;
    let mut running = Recorder::start(cfg).await?;
    crate::say!(
        "tracer: recording to {}{} (session {}); {}/{} probes attached",
        store.display(),
        running.away.as_deref().unwrap_or(""),
        running.session,
        running.attached.0,
        running.attached.1
    );
    let failure = running.until(stops).await;
    let stopped = running.stop(failure).await?;
    crate::say!("tracer: stopped; {}", serde_json::to_string(&stopped)?);
    Ok(ExitCode::SUCCESS)
}
