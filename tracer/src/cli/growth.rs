//! `tracer growth --pid N | --cgroup PATH`: where a process's (or a
//! container's) memory is growing, live, before anything is killed. The
//! page faults of the chosen processes are sampled by bytes with their
//! stacks, as `record` does for every memory-limited process; nothing is
//! attached to their code.

use std::{process::ExitCode, time::Duration};

use anyhow::{anyhow, bail};
use serde_json::json;

use crate::recorder::live::{comm_of, growth::Follow, pidfd};
use crate::{
    model::cgroup::CgroupLayout,
    probes::heap::MAX_SAMPLE_BYTES,
    record::GrowthReport,
    util::{
        term,
        time::{format_wall, wall_now_ns},
        units::bytes,
    },
};

/// Options of `tracer growth`.
#[derive(Debug, clap::Args)]
pub struct GrowthArgs {
    /// The process to follow.
    #[arg(long, required_unless_present = "cgroup", conflicts_with = "cgroup")]
    pub pid: Option<u32>,
    /// Follow every process of this memory cgroup and below, now and later
    /// (path as in /proc/PID/cgroup).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Stop after this long (default: at Ctrl-C, or when the process exits).
    #[arg(long, value_parser = super::parse_duration)]
    pub duration: Option<Duration>,
    /// Show the growth of this last stretch of time.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    pub window: Duration,
    /// Show it this often.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    pub every: Duration,
    /// One sample per this many bytes a process faults in, on average (0: every fault).
    #[arg(long, value_parser = super::parse_size, default_value = "1MiB", value_name = "SIZE")]
    pub sample_bytes: u64,
    /// Sites shown per process.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
    /// At the end, write the growth of the last window by stack as a
    /// profile in pprof's format (gzipped protobuf, for `go tool pprof`,
    /// Pyroscope, Parca), every site of every process followed.
    #[arg(long, value_name = "PATH")]
    pub pprof: Option<std::path::PathBuf>,
}

/// Sites per process kept for `--pprof`.
const PPROF_SITES: usize = 10_000;

/// Runs `tracer growth`.
pub fn run(args: GrowthArgs) -> anyhow::Result<ExitCode> {
    if args.sample_bytes > MAX_SAMPLE_BYTES {
        bail!("--sample-bytes must be at most {}", bytes(MAX_SAMPLE_BYTES));
    }
    if args.window < Duration::from_secs(1) || args.every < Duration::from_millis(100) {
        bail!("--window must be at least 1s and --every at least 100ms");
    }
    let (dir, pidfd, what) = match (&args.pid, &args.cgroup) {
        (Some(pid), _) => {
            let comm = comm_of(*pid)?;
            (None, Some(pidfd(*pid)?), format!("pid {pid} ({comm})"))
        }
        (None, Some(path)) => {
            // Joined under the cgroup file system: no climbing out of it.
            super::check_no_climbing("--cgroup", path)?;
            let layout = CgroupLayout::detect();
            let dir = layout
                .memcg_dir(path)
                .filter(|d| d.is_dir())
                .ok_or_else(|| {
                    anyhow!(
                        "no memory cgroup {} on this node (the path as /proc/PID/cgroup \
                         gives it, e.g. /kubepods.slice/...; the memory hierarchy is {})",
                        term::escape(path),
                        layout.kind()
                    )
                })?;
            (
                Some(dir),
                None,
                format!("memory cgroup {}", term::escape(path)),
            )
        }
        (None, None) => bail!("--pid or --cgroup is needed"),
    };
    if let Some(path) = &args.pprof {
        crate::util::fsafe::check_file(path)?;
    }
    crate::probes::caps::require_bpf()?;
    let probes = crate::recorder::live::growth::load(args.sample_bytes)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let follow = Follow {
        pid: args.pid,
        pidfd,
        dir,
        what,
        sample_bytes: args.sample_bytes,
        top: if args.pprof.is_some() {
            PPROF_SITES
        } else {
            args.top
        },
        window: args.window,
        every: args.every,
        duration: args.duration,
    };
    let mut out = std::io::stdout().lock();
    let mut last: Vec<GrowthReport> = Vec::new();
    let started = wall_now_ns();
    rt.block_on(crate::recorder::live::growth::follow(
        follow,
        probes,
        |kind, reports, start| {
            show(&mut out, args.json, kind, reports, args.top, start);
            if kind != "growth" {
                last = reports.to_vec();
            }
        },
    ))?;
    if let Some(path) = &args.pprof {
        write_pprof(path, &last, &args, wall_now_ns() - started)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The last window's growth by stack, every process, as a pprof profile.
fn write_pprof(
    path: &std::path::Path,
    reports: &[GrowthReport],
    args: &GrowthArgs,
    followed_ns: i64,
) -> anyhow::Result<()> {
    use crate::export::pprof::{Meta, Stack, sampling, write};
    let window_ns = (args.window.as_nanos() as i64).min(followed_ns);
    let meta = Meta {
        sample_types: &[("growth_space", "bytes"), ("samples", "count")],
        period: ("space", "bytes", args.sample_bytes),
        time_ns: wall_now_ns() - window_ns,
        duration_ns: window_ns,
        comments: vec![format!(
            "tracer growth: memory faulted in by stack over the last {} s, {}",
            window_ns / 1_000_000_000,
            sampling(args.sample_bytes, "faulted in", "every fault kept")
        )],
    };
    let stacks = reports.iter().flat_map(|r| {
        r.sites.iter().map(|s| Stack {
            frames: &s.frames,
            values: vec![s.bytes as i64, s.samples as i64],
            process: Some((r.pid, r.comm.as_str())),
        })
    });
    write(path, &meta, stacks, "growth")
}

fn show(
    out: &mut impl std::io::Write,
    json: bool,
    kind: &str,
    reports: &[GrowthReport],
    top: usize,
    start_ns: i64,
) {
    let now = wall_now_ns();
    if json {
        // As many sites as the reports have without --pprof.
        let shown: Vec<GrowthReport> = reports
            .iter()
            .map(|r| {
                let keep = r.sites.len().min(top.max(10));
                GrowthReport {
                    sites: r.sites[..keep].to_vec(),
                    more_sites: r.more_sites + (r.sites.len() - keep),
                    ..r.clone()
                }
            })
            .collect();
        let v = json!({ "type": kind, "time": format_wall(now), "processes": shown });
        let _ = writeln!(out, "{v}");
    } else {
        let _ = write!(
            out,
            "{}",
            render(reports, top, &format_wall(now), now - start_ns)
        );
    }
    let _ = out.flush();
}

/// The text view.
pub fn render(reports: &[GrowthReport], top: usize, time: &str, followed_ns: i64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if reports.is_empty() {
        let _ = writeln!(
            o,
            "-- {time}: no growth sampled yet ({:.0} s followed)",
            followed_ns as f64 / 1e9
        );
        return o;
    }
    for r in reports {
        let window = (r.window_s as f64).min(followed_ns.max(0) as f64 / 1e9);
        let kept = r
            .returned_bytes
            .map(|g| format!(" ({} kept)", bytes(r.bytes.saturating_sub(g))))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "-- {time} pid {} ({}): {} faulted in{kept} over the last {window:.0} s, {} since followed",
            r.pid,
            term::escape(&r.comm),
            bytes(r.bytes),
            bytes(r.total_bytes)
        );
        for site in r.sites.iter().take(top) {
            let _ = writeln!(
                o,
                "   {}  {}",
                crate::explain::site_figure(r, site),
                crate::explain::frame_chain(&site.frames)
            );
        }
        let more = r.more_sites + r.sites.len().saturating_sub(top);
        if more > 0 {
            let _ = writeln!(o, "   ... and {more} more sites");
        }
        for site in &r.reserved {
            let _ = writeln!(
                o,
                "   {:>10}  reserved (mmap) by {}",
                bytes(site.bytes),
                crate::explain::frame_chain(&site.frames)
            );
        }
    }
    o
}
