//! `tracer growth --pid N | --cgroup PATH`: where a process's (or a
//! container's) memory is growing, live, before anything is killed. The
//! page faults of the chosen processes are sampled by bytes with their
//! stacks, as `record` does for every memory-limited process; nothing is
//! attached to their code.

use std::{collections::BTreeSet, process::ExitCode, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;

use super::attach::{Ends, RESCAN, comm_of, drain, pidfd, start_readers};
use crate::{
    collect::decode::Event,
    model::cgroup::CgroupLayout,
    probes::{
        HEAP_DATA_RING_BYTES, Probes,
        growth::{GrowthMaps, GrowthMode, GrowthOptions},
        heap::MAX_SAMPLE_BYTES,
    },
    record::GrowthReport,
    recorder::heap::{HeapWorker, View},
    util::{
        term,
        time::{Clock, format_wall, wall_now_ns},
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
}

/// The processes followed and how to find more.
struct Followed {
    /// The cgroup's directory (cgroup mode).
    dir: Option<std::path::PathBuf>,
    pids: BTreeSet<u32>,
}

impl Followed {
    /// Selects the processes now in the cgroup (and below) that are not
    /// yet, and deselects those gone; returns the latter. A change renews
    /// the decisions.
    fn scan(&mut self, probes: &mut Probes, maps: &mut GrowthMaps) -> anyhow::Result<Vec<u32>> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        let mut now = BTreeSet::new();
        procs_below(dir, &mut now);
        for &pid in now.difference(&self.pids) {
            probes.growth_select(pid, true)?;
        }
        let gone: Vec<u32> = self.pids.difference(&now).copied().collect();
        for &pid in &gone {
            probes.growth_select(pid, false)?;
        }
        if now != self.pids {
            maps.new_generation()?;
        }
        self.pids = now;
        Ok(gone)
    }
}

/// Every process listed in `dir`'s cgroup.procs and its descendants'.
fn procs_below(dir: &std::path::Path, out: &mut BTreeSet<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&e.path(), out);
            }
        }
    }
}

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
            if path.split('/').any(|c| c == "..") {
                bail!(
                    "--cgroup {}: a cgroup path has no '..' in it",
                    term::escape(path)
                );
            }
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
    crate::probes::caps::require_bpf()?;
    let heap = crate::probes::heap::config(
        crate::probes::heap::DEFAULT_SAMPLE_BYTES,
        crate::probes::heap::DEFAULT_ALWAYS_BYTES,
    );
    let opts = GrowthOptions {
        mode: GrowthMode::Selected,
        sample_bytes: args.sample_bytes,
        reserve_bytes: crate::probes::growth::DEFAULT_RESERVE_BYTES,
    };
    let probes =
        Probes::load_with(HEAP_DATA_RING_BYTES, &heap, &opts).context("cannot follow growth")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(follow(
        args,
        probes,
        Followed {
            dir,
            pids: BTreeSet::new(),
        },
        pidfd,
        what,
    ))
}

async fn follow(
    args: GrowthArgs,
    mut probes: Probes,
    mut followed: Followed,
    pidfd: Option<std::os::fd::OwnedFd>,
    what: String,
) -> anyhow::Result<ExitCode> {
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 4096)?;
    let mut maps = probes.take_growth_maps()?;
    probes
        .attach_growth()
        .context("growth attribution needs the page fault tracepoints")?;
    if let Some(pid) = args.pid {
        probes.growth_select(pid, true)?;
        followed.pids.insert(pid);
    }
    followed.scan(&mut probes, &mut maps)?;
    // Renewed once selected: the decision of a selected process is taken
    // again at its next fault.
    maps.new_generation()?;
    let worker = HeapWorker::spawn(
        crate::probes::heap::DEFAULT_SAMPLE_BYTES,
        args.sample_bytes,
        View {
            top: args.top,
            growth_window_s: 60,
            old_after_s: 60,
        },
    )?;
    crate::say!(
        "tracer: following the growth of {what} (one sample per {} faulted in)",
        bytes(args.sample_bytes)
    );
    let clock = Clock::now();
    let start = wall_now_ns();
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut ends = Ends::new_opt(pidfd, args.duration)?;
    let mut every = tokio::time::interval(args.every);
    every.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    let mut out = std::io::stdout().lock();
    let window_s = args.window.as_secs();
    let on_event = |ev: Event, seen: &mut BTreeSet<u32>| {
        if let Event::GrowthFault(s) = ev {
            let ts = clock.boot_to_wall(s.header.ts_boot_ns).max(0) as u64;
            seen.insert(s.header.pid);
            worker.fault(s, ts);
        }
    };
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => on_event(ev, &mut seen),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            _ = every.tick() => {
                let reports = reports(&worker, &seen, window_s).await;
                show(&mut out, args.json, "growth", &reports, args.top, start);
                // A process gone and forgotten by the worker is shown no more.
                seen.retain(|p| followed.pids.contains(p) || reports.iter().any(|r| r.pid == *p));
            }
            _ = rescan.tick() => {
                // Gone from the cgroup: the worker keeps its samples a while
                // (its growth stays in view), then forgets it.
                let now = wall_now_ns().max(0) as u64;
                for pid in followed.scan(&mut probes, &mut maps)? {
                    worker.on_exit(pid, now);
                }
            }
            end = ends.wait() => break end?,
            Some(r) = tasks.join_next() => {
                r??;
                return Err(anyhow!("a ring buffer reader stopped"));
            }
        }
    };
    drain(&mut rx, &mut tasks, |ev| on_event(ev, &mut seen)).await;
    let reports = reports(&worker, &seen, window_s).await;
    show(
        &mut out,
        args.json,
        if exited { "exit" } else { "end" },
        &reports,
        args.top,
        start,
    );
    let counts = maps.read().ok();
    let ring_lost = drops.read().map(|d| d.data).unwrap_or(0)
        + counts.map(|c| c.ring_full).unwrap_or(0)
        + worker.dropped();
    if ring_lost > 0 {
        crate::say!("tracer: {ring_lost} samples lost: the figures are low");
    }
    worker.stop();
    Ok(ExitCode::SUCCESS)
}

/// The report of every process with samples, most growth first.
async fn reports(worker: &HeapWorker, pids: &BTreeSet<u32>, window_s: u64) -> Vec<GrowthReport> {
    let mut out = Vec::new();
    for &pid in pids {
        let r = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match worker.request_growth(pid, window_s) {
                    Some(rx) => break rx.await.ok(),
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        })
        .await;
        // Nothing sampled (or forgotten since it left): not shown.
        if let Ok(Some(r)) = r
            && (r.samples > 0 || r.total_bytes > 0 || r.reserved_bytes > 0)
        {
            out.push(r);
        }
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    out
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
        let v = json!({ "type": kind, "time": format_wall(now), "processes": reports });
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
        let _ = writeln!(
            o,
            "-- {time} pid {} ({}): {} faulted in over the last {window:.0} s, {} since followed",
            r.pid,
            term::escape(&r.comm),
            bytes(r.bytes),
            bytes(r.total_bytes)
        );
        for site in r.sites.iter().take(top) {
            let _ = writeln!(
                o,
                "   {:>10}  {}",
                bytes(site.bytes),
                crate::explain::frame_chain(&site.frames)
            );
        }
        if r.more_sites > 0 {
            let _ = writeln!(o, "   ... and {} more sites", r.more_sites);
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
