//! `tracer top`: processes and containers with host and GPU memory, live,
//! sorted by what is closest to its limit.

use std::{
    io::Write as _,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use super::StoreArg;
use crate::{
    explain::gpu::short,
    nvml,
    record::GpuView,
    recorder::live::top::{NodeRow, NodeTrend, Row, pct, snapshot},
    store::Store,
    util::term,
    util::time::{format_wall, wall_now_ns},
    util::units::bytes,
};

/// Options of `tracer top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    store: StoreArg,
    /// JSON lines (one per device, container and process, each refresh) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// One refresh, then exit.
    #[arg(long)]
    pub once: bool,
    /// Refresh period.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    pub interval: Duration,
    /// NVML library to load instead of the driver's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Rows of processes shown.
    #[arg(long, default_value_t = 25)]
    pub rows: usize,
    /// Where the host's files are, for Kubernetes names (as `record
    /// --host-root`).
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub host_root: PathBuf,
}

fn render(
    rows: &[Row],
    view: &GpuView,
    node: Option<&NodeRow>,
    nvml_note: &Option<String>,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "tracer top  {}  (sorted by closeness to the tightest limit: memcg or GPU)",
        format_wall(wall_now_ns())
    );
    if let Some(n) = node {
        let _ = writeln!(o, "{}", NodeTrend::line(n));
    }
    for d in &view.devices {
        let _ = writeln!(
            o,
            "gpu {}: {} of {} used ({:.0}%), {} processes",
            d.device,
            bytes(d.used),
            bytes(d.total),
            pct(d.used, Some(d.total)),
            d.processes.len()
        );
    }
    if let Some(n) = nvml_note {
        let _ = writeln!(o, "{}", term::escape(n));
    }
    let _ = writeln!(o);
    let opt = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "-".into());
    let _ = writeln!(
        o,
        "{:<9} {:>8}  {:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5} {:>6}  CONTAINER",
        "TYPE",
        "PID",
        "NAME",
        "HOST RSS",
        "MEMCG",
        "LIMIT",
        "GPU NVML",
        "GPU TRACED",
        "GPU ALLOC",
        "USE%",
        "PSI%"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<9} {:>8}  {:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>4.0}% {:>6}  {}",
            r.kind,
            r.pid.map(|p| p.to_string()).unwrap_or_default(),
            short(&term::escape(&r.name), 24),
            bytes(r.host_rss),
            opt(r.memcg_usage),
            opt(r.memcg_limit),
            bytes(r.gpu_nvml),
            opt(r.gpu_traced),
            opt(r.gpu_allocated),
            r.pressure_pct,
            r.psi_some_avg10
                .map(|p| format!("{p:.1}"))
                .unwrap_or_else(|| "-".into()),
            // A container row's name in full (NAME keeps only its end).
            term::escape(if r.kind == "process" {
                r.container.as_deref().unwrap_or_default()
            } else {
                &r.name
            })
        );
    }
    let _ = writeln!(
        o,
        "USE%: usage over the tightest limit (memcg or GPU); PSI%: the memory cgroup's PSI some avg10 (cgroup v2 only, else -)"
    );
    // Slow leaks the recorder found (hours of its samples; top has seconds).
    for r in rows.iter().filter(|r| r.kind == "container") {
        if let Some(l) = &r.leak {
            let _ = writeln!(
                o,
                "{}: {} (for {}, in {})",
                term::escape(&r.name),
                l.short_words(),
                crate::util::time::human_secs((wall_now_ns() - l.since_ns) as f64 / 1e9),
                term::escape(&l.memcg)
            );
        }
    }
    o
}

/// Runs `top`.
pub fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    let (nvml, nvml_note) = match nvml::open(args.nvml_lib.as_deref()) {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(format!("no GPU figures: {}", super::chain(&e)))),
    };
    let store = Store::open_ro(&args.store.path).ok();
    let mut kube = Some(crate::model::kube::KubeResolver::new(&args.host_root));
    if !args.json && !args.once && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        super::top_tui::run(
            args.interval,
            || snapshot(store.as_ref(), nvml.as_ref(), args.rows, &mut kube),
            nvml_note,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    let mut trend = NodeTrend::default();
    loop {
        let t0 = Instant::now();
        let (rows, view) = snapshot(store.as_ref(), nvml.as_ref(), args.rows, &mut kube);
        let node = trend.refresh();
        if args.json {
            if let Some(n) = &node {
                writeln!(out, "{}", serde_json::to_string(n)?)?;
            }
            for d in &view.devices {
                let v = serde_json::json!({ "type": "device", "device": d.device, "total": d.total, "used": d.used, "free": d.free, "containers": d.containers });
                writeln!(out, "{v}")?;
            }
            for r in &rows {
                writeln!(out, "{}", serde_json::to_string(r)?)?;
            }
        } else {
            // On a terminal, home and clear, then the table: a whole-screen
            // refresh. Into a pipe or a file, only the table.
            if std::io::IsTerminal::is_terminal(&out) {
                write!(out, "\x1b[H\x1b[2J")?;
            }
            write!(out, "{}", render(&rows, &view, node.as_ref(), &nvml_note))?;
        }
        out.flush()?;
        if args.once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(args.interval.saturating_sub(t0.elapsed()));
    }
}
