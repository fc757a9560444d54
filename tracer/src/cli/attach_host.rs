//! `tracer attach --pid N --host`: the heap of a running process, live,
//! without restarting, stopping or signalling it. malloc and friends are
//! probed in whichever of its files export them (libc, musl, jemalloc,
//! tcmalloc, the executable), sampled by bytes in the kernel, unwound and
//! named here; each second the top sites by live bytes, their growth and
//! what has been live a long time.

use std::{io::Write as _, os::fd::OwnedFd, process::ExitCode, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;

use super::attach::{AttachArgs, Attached};
use crate::recorder::live::{Ends, RESCAN, comm_of, drain, first_libraries, pidfd, start_readers};
use crate::{
    collect::decode::Event,
    probes::{
        HEAP_DATA_RING_BYTES, Probes,
        heap::{HeapStats, MAX_SAMPLE_BYTES, config},
        uprobe::HEAP,
    },
    record::HeapSnapshot,
    recorder::heap::{HeapWorker, Reply, View},
    util::{
        term,
        time::{Clock, format_wall, wall_now_ns},
        units::bytes,
    },
};

/// Frames shown per site in text.
const FRAMES_SHOWN: usize = 3;

/// Runs `attach --host`.
pub fn run(args: AttachArgs) -> anyhow::Result<ExitCode> {
    if args.sample_bytes > MAX_SAMPLE_BYTES {
        bail!("--sample-bytes must be at most {}", bytes(MAX_SAMPLE_BYTES));
    }
    let comm = comm_of(args.pid)?;
    // Refused now, not after the session: a link or another user's file.
    if let Some(path) = &args.flamegraph {
        crate::util::fsafe::check_file(path)?;
    }
    crate::probes::caps::require_bpf()?;
    let pidfd = pidfd(args.pid)?;
    let heap = config(args.sample_bytes, args.always_bytes);
    let mut probes =
        Probes::load_with_heap(HEAP_DATA_RING_BYTES, &heap).context("cannot attach")?;
    probes.load_family(&HEAP, args.floor)?;
    if !args.floor {
        for why in probes.attach_heap_syscalls() {
            tracing::warn!("{why}: mmap, mremap, brk and munmap are not traced");
        }
        probes.heap_pid(args.pid, true)?;
    }
    let libs = first_libraries(&HEAP, args.pid, &comm, &pidfd)?;
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
    json: bool,
    worker: HeapWorker,
    stats: HeapStats,
    clock: Clock,
    out: std::io::StdoutLock<'static>,
}

impl Session {
    fn event(&mut self, ev: Event) {
        match ev {
            // The 8.5 KiB sample moves on to the worker as it is.
            Event::HeapAlloc(a) if a.header.pid == self.pid => {
                let ts = self.clock.boot_to_wall(a.header.ts_boot_ns).max(0) as u64;
                self.worker.alloc(a, ts);
            }
            Event::HeapFree(f) if f.header.pid == self.pid => self.worker.free(&f),
            _ => {}
        }
    }

    /// Shows a snapshot the worker made, with what was lost on the way.
    fn show(&mut self, kind: &str, (mut snap, _): Reply) {
        let now = wall_now_ns();
        let counts = self.stats.read().ok();
        snap.lost_samples =
            counts.map(|c| c.map_full + c.ring_full).unwrap_or(0) + self.worker.dropped();
        if self.json {
            let v =
                json!({ "type": kind, "time": format_wall(now), "heap": snap, "probes": counts });
            let _ = writeln!(self.out, "{v}");
        } else {
            let _ = write!(self.out, "{}", render(&snap, &format_wall(now)));
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
        } + &if s.shallow_samples > 0 {
            format!("; {} samples with a stack cut short", s.shallow_samples)
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
    // Samples are large (they carry 8 KiB of stack): a short queue.
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 4096)?;
    let heap_stats = probes.take_heap_stats()?;
    let worker = HeapWorker::spawn(
        args.sample_bytes,
        crate::probes::growth::DEFAULT_SAMPLE_BYTES,
        View {
            top: args.top,
            growth_window_s: args.growth_window.as_secs().max(1),
            old_after_s: args.old_after.as_secs(),
        },
    )?;
    let mut attached = Attached::new(&HEAP, &args);
    attached.scan(&mut probes)?;
    let (functions, files) = attached.counts();
    crate::say!(
        "tracer: tracing the heap of pid {} ({comm}): {functions} functions in {files} files",
        args.pid
    );

    let mut session = Session {
        pid: args.pid,
        json: args.json,
        worker,
        stats: heap_stats,
        clock: Clock::now(),
        out: std::io::stdout().lock(),
    };
    let mut ends = Ends::new(pidfd, args.duration)?;
    let mut each_second = tokio::time::interval(Duration::from_secs(1));
    each_second.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    let mut asked: Option<tokio::sync::oneshot::Receiver<Reply>> = None;
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => session.event(ev),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            // One snapshot asked for at a time; the loop goes on reading
            // the ring while the worker makes it.
            _ = each_second.tick(), if asked.is_none() => {
                asked = session.worker.request(args.pid, false);
            }
            Ok(reply) = async { asked.as_mut().expect("guarded").await }, if asked.is_some() => {
                asked = None;
                session.show("heap", reply);
            }
            _ = rescan.tick() => attached.scan(&mut probes)?,
            end = ends.wait() => break end?,
            Some(r) = tasks.join_next() => {
                r??;
                return Err(anyhow!("a ring buffer reader stopped"));
            }
        }
    };
    drain(&mut rx, &mut tasks, |ev| session.event(ev)).await;
    let ring_lost = drops.read().map(|d| d.data).unwrap_or(0);
    // The first naming of a large program's symbols can take seconds; a
    // full queue takes the request once the worker has made room.
    let folded = args.flamegraph.is_some();
    let last = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match session.worker.request(args.pid, folded) {
                Some(rx) => break rx.await.ok(),
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .ok()
    .flatten();
    let Some(last) = last else {
        bail!("the heap worker did not answer");
    };
    let folded = last.1.clone();
    session.show(if exited { "exit" } else { "detach" }, last);
    if exited {
        crate::say!("tracer: pid {} exited", args.pid);
    }
    if ring_lost > 0 {
        crate::say!("tracer: {ring_lost} events lost (ring buffer full): the figures are low");
    }
    if let Some(path) = &args.flamegraph {
        write_flamegraph(path, &folded, args.pid, &comm)?;
    }
    session.worker.stop();
    attached.detach(&mut probes);
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
    // Written as root: never through a link, nor over another user's file.
    let file = crate::util::fsafe::open_private(path)?;
    file.set_len(0)
        .with_context(|| format!("emptying {}", path.display()))?;
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
