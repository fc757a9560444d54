//! `tracer attach --pid N --host`: the heap of a running process, live,
//! without restarting, stopping or signalling it. malloc and friends are
//! probed in whichever of its files export them (libc, musl, jemalloc,
//! tcmalloc, the executable), sampled by bytes in the kernel, unwound and
//! named here; each second the top sites by live bytes, their growth and
//! what has been live a long time.

use std::{
    collections::HashSet, io::Write as _, os::fd::OwnedFd, process::ExitCode, sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    task::JoinSet,
};

use super::attach::{AttachArgs, comm_of, has_exited, pidfd};
use crate::{
    collect::{self, ReaderStats, decode::Event},
    probes::{
        CUDA_DATA_RING_BYTES, Probes,
        heap::{HeapStats, MAX_SAMPLE_BYTES, config},
        uprobe::{Attachment, HEAP, libraries_of},
    },
    record::HeapSnapshot,
    recorder::heap::{HeapTracer, View},
    util::{
        term,
        time::{Clock, format_wall, wall_now_ns},
        units::bytes,
    },
};

/// How often the process's memory maps are read for newly loaded allocators.
const RESCAN: Duration = Duration::from_millis(500);
/// Frames shown per site in text.
const FRAMES_SHOWN: usize = 3;

/// Runs `attach --host`.
pub fn run(args: AttachArgs) -> anyhow::Result<ExitCode> {
    if args.sample_bytes > MAX_SAMPLE_BYTES {
        bail!("--sample-bytes must be at most {}", bytes(MAX_SAMPLE_BYTES));
    }
    let comm = comm_of(args.pid)?;
    crate::probes::caps::require_bpf()?;
    let pidfd = pidfd(args.pid)?;
    let heap = config(args.sample_bytes, args.always_bytes);
    let mut probes =
        Probes::load_with_heap(CUDA_DATA_RING_BYTES, &heap).context("cannot attach")?;
    probes.load_family(&HEAP, args.floor)?;
    let libs = match libraries_of(&HEAP, args.pid) {
        Ok(l) => l,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            bail!(
                "pid {} ({comm}) exited while tracer was attaching; nothing was traced",
                args.pid
            )
        }
        Err(e) => {
            return Err(e).with_context(|| format!("reading the memory maps of pid {}", args.pid));
        }
    };
    if libs.is_empty() && has_exited(&pidfd) {
        bail!(
            "pid {} ({comm}) exited while tracer was attaching; nothing was traced",
            args.pid
        );
    }
    if libs.is_empty() {
        bail!(
            "pid {} ({comm}) has no allocator tracer can probe: none of its mapped files \
             (libc.so*, ld-musl*, libc.musl*, or a library named like *malloc*, jemalloc, \
             tcmalloc, mimalloc) nor its executable exports both malloc and free \
             (a stripped static binary keeps its allocator to itself)",
            args.pid
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(attach(args, comm, probes, pidfd))
}

struct Session {
    pid: u32,
    comm: String,
    json: bool,
    view: View,
    tracer: HeapTracer,
    stats: HeapStats,
    clock: Clock,
    out: std::io::StdoutLock<'static>,
}

impl Session {
    fn event(&mut self, ev: &Event) {
        match ev {
            Event::HeapAlloc(a) if a.header.pid == self.pid => {
                let ts = self.clock.boot_to_wall(a.header.ts_boot_ns).max(0) as u64;
                self.tracer.alloc(a, ts);
            }
            Event::HeapFree(f) if f.header.pid == self.pid => self.tracer.free(f),
            _ => {}
        }
    }

    fn snapshot(&mut self) -> HeapSnapshot {
        let now = wall_now_ns().max(0) as u64;
        let counts = self.stats.read().ok();
        self.tracer
            .snapshot(self.pid, &self.comm, now, &self.view, counts)
    }

    fn show(&mut self, kind: &str) {
        let now = wall_now_ns().max(0) as u64;
        self.tracer.tick(now, &self.view);
        let snap = self.snapshot();
        if self.json {
            let counts = self.stats.read().ok();
            let v = json!({ "type": kind, "time": format_wall(now as i64), "heap": snap,
                "probes": counts, "unknown_stack_samples": self.tracer.shallow });
            let _ = writeln!(self.out, "{v}");
        } else {
            let _ = write!(self.out, "{}", render(&snap, &format_wall(now as i64)));
        }
        let _ = self.out.flush();
    }
}

/// The text view of a snapshot.
pub fn render(s: &HeapSnapshot, time: &str) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let rss = s
        .rss_bytes
        .map(|r| format!(", RSS {}", bytes(r)))
        .unwrap_or_default();
    let sampling = if s.sample_bytes == 0 {
        "every allocation".to_string()
    } else {
        format!("sampled every {}", bytes(s.sample_bytes))
    };
    let _ = writeln!(
        o,
        "-- {time} pid {} ({}): {} live from {} sites{rss}; {sampling}{}",
        s.pid,
        term::escape(&s.comm),
        bytes(s.live_bytes),
        s.sites.len() + s.more_sites,
        if s.lost_samples > 0 {
            format!("; {} samples lost (figures are low)", s.lost_samples)
        } else {
            String::new()
        }
    );
    if s.sites.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "   {:>10}  {:>11}  {:>10}  site",
        "live",
        format!("{}s growth", s.growth_window_s),
        format!("old>{}s", s.old_after_s)
    );
    for site in &s.sites {
        let frames: Vec<String> = site
            .frames
            .iter()
            .take(FRAMES_SHOWN)
            .map(|f| term::escape(&f.label()).into_owned())
            .collect();
        let more = if site.frames.len() > FRAMES_SHOWN {
            " <- ..."
        } else {
            ""
        };
        let growth = if site.growth_bytes < 0 {
            format!("-{}", bytes(site.growth_bytes.unsigned_abs()))
        } else {
            format!("+{}", bytes(site.growth_bytes as u64))
        };
        let _ = writeln!(
            o,
            "   {:>10}  {:>11}  {:>10}  {}{more}",
            bytes(site.live_bytes),
            growth,
            bytes(site.old_bytes),
            frames.join(" <- ")
        );
    }
    if s.more_sites > 0 {
        let _ = writeln!(o, "   ... and {} more sites", s.more_sites);
    }
    o
}

async fn attach(
    args: AttachArgs,
    comm: String,
    mut probes: Probes,
    pidfd: OwnedFd,
) -> anyhow::Result<ExitCode> {
    let stats = Arc::new(ReaderStats::default());
    // Samples are large (they carry 8 KiB of stack): a short queue.
    let (tx, mut rx) = mpsc::channel::<Event>(4096);
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();
    for (ring, opts) in collect::ring_options(Duration::from_millis(20)) {
        let r = probes.take_ring(ring)?;
        let (tx, stats) = (tx.clone(), stats.clone());
        tasks.spawn(async move { Ok(collect::read_ring(r, ring, tx, stats, opts).await?) });
    }
    drop(tx);
    let drops = probes.take_drop_counters()?;
    let heap_stats = probes.take_heap_stats()?;
    let mut tracer = HeapTracer::new(args.sample_bytes);
    tracer.prepare(args.pid);
    let mut attached: Vec<Attachment> = Vec::new();
    let mut seen = HashSet::new();
    let mut attach_new = |probes: &mut Probes,
                          attached: &mut Vec<Attachment>|
     -> anyhow::Result<()> {
        let Ok(libs) = libraries_of(&HEAP, args.pid) else {
            return Ok(()); // the process is going away; the pidfd says so
        };
        for mut lib in libs {
            if !seen.insert(lib.id) {
                continue;
            }
            if args.entry_sites {
                lib.sites.iter_mut().for_each(|s| s.shift = 0);
            }
            let att = probes.attach_family(&HEAP, &lib, Some(args.pid), args.floor)?;
            if !att.failed.is_empty()
                && !std::path::Path::new(&format!("/proc/{}", args.pid)).exists()
            {
                bail!("pid {} exited while tracer was attaching", args.pid);
            }
            if att.attached() == 0 && !att.failed.is_empty() {
                bail!(
                    "attaching to {}: {}",
                    term::escape(&lib.path),
                    att.failed[0].1
                );
            }
            crate::say!(
                "tracer: attached to {} in pid {} ({} functions, {} probes past a single-stepped first instruction{})",
                term::escape(&lib.path),
                args.pid,
                att.attached(),
                lib.placed(),
                if lib.executable {
                    ", linked into the executable"
                } else {
                    ""
                }
            );
            for (sym, why) in &att.failed {
                tracing::warn!("{sym} in {}: {why}", term::escape(&lib.path));
            }
            attached.push(att);
        }
        Ok(())
    };
    attach_new(&mut probes, &mut attached)?;
    let functions: usize = attached.iter().map(|a| a.attached()).sum();
    crate::say!(
        "tracer: tracing the heap of pid {} ({comm}): {functions} functions in {} files",
        args.pid,
        attached.len()
    );

    let mut session = Session {
        pid: args.pid,
        comm: comm.clone(),
        json: args.json,
        view: View {
            top: args.top,
            growth_window_s: args.growth_window.as_secs().max(1),
            old_after_s: args.old_after.as_secs(),
        },
        tracer,
        stats: heap_stats,
        clock: Clock::now(),
        out: std::io::stdout().lock(),
    };
    let exit = collect::async_fd(pidfd)?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut each_second = tokio::time::interval(Duration::from_secs(1));
    each_second.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let until_deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => session.event(&ev),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            _ = each_second.tick() => session.show("heap"),
            _ = rescan.tick() => attach_new(&mut probes, &mut attached)?,
            r = exit.readable() => {
                let _ = r?;
                break true;
            }
            _ = &mut until_deadline => break false,
            _ = sigint.recv() => break false,
            _ = sigterm.recv() => break false,
            Some(r) = tasks.join_next() => {
                r??;
                return Err(anyhow!("a ring buffer reader stopped"));
            }
        }
    };
    // What the readers already queued belongs to this session.
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(ev) = rx.try_recv() {
        session.event(&ev);
    }
    tasks.shutdown().await;
    let ring_lost = drops.read().map(|d| d.data).unwrap_or(0);
    session.show(if exited { "exit" } else { "detach" });
    if exited {
        crate::say!("tracer: pid {} exited", args.pid);
    }
    if ring_lost > 0 {
        crate::say!("tracer: {ring_lost} events lost (ring buffer full): the figures are low");
    }
    if let Some(path) = &args.flamegraph {
        let now = wall_now_ns().max(0) as u64;
        let folded = session.tracer.folded(args.pid, now);
        write_flamegraph(path, &folded, args.pid, &comm)?;
    }
    drop(session);
    let n: usize = attached.iter().map(|a| a.probes()).sum();
    if n > 0 {
        crate::say!("tracer: removing {n} probes from pid {}", args.pid);
    }
    for att in attached {
        probes.detach_family(att);
    }
    Ok(ExitCode::SUCCESS)
}

fn write_flamegraph(
    path: &std::path::Path,
    folded: &[String],
    pid: u32,
    comm: &str,
) -> anyhow::Result<()> {
    if folded.is_empty() {
        crate::say!(
            "tracer: no live sampled bytes: no flame graph written to {}",
            path.display()
        );
        return Ok(());
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("Live heap of pid {pid} ({})", term::escape(comm));
    opts.count_name = "bytes".into();
    opts.deterministic = true;
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    inferno::flamegraph::from_lines(
        &mut opts,
        folded.iter().map(String::as_str),
        std::io::BufWriter::new(file),
    )
    .with_context(|| format!("writing the flame graph to {}", path.display()))?;
    crate::say!(
        "tracer: flame graph of live bytes written to {}",
        path.display()
    );
    Ok(())
}
