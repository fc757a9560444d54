//! `tracer attach --pid N --host`: the heap of a running process, live,
//! without restarting, stopping or signalling it. malloc and friends are
//! probed in whichever of its files export them (libc, musl, jemalloc,
//! tcmalloc, the executable), sampled by bytes in the kernel, unwound and
//! named here; each second the top sites by live bytes, their growth and
//! what has been live a long time.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::attach::AttachArgs;
use crate::recorder::live::{Target, comm_of, heap, pidfd};
use crate::{
    probes::heap::{HeapCounts, MAX_SAMPLE_BYTES, config},
    record::{HeapSite, HeapSnapshot},
    recorder::heap::View,
    util::{
        term,
        time::{format_wall, wall_now_ns},
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
    for path in [&args.flamegraph, &args.pprof].into_iter().flatten() {
        crate::util::fsafe::check_file(path)?;
    }
    crate::probes::caps::require_bpf()?;
    let pidfd = pidfd(args.pid)?;
    let probes = heap::load(
        args.pid,
        &comm,
        &pidfd,
        config(args.sample_bytes, args.always_bytes),
        args.floor,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let follow = heap::Follow {
        target: Target {
            pid: args.pid,
            comm: comm.clone(),
            pidfd,
            floor: args.floor,
            entry_sites: args.entry_sites,
            duration: args.duration,
        },
        sample_bytes: args.sample_bytes,
        view: View {
            top: args.top,
            growth_window_s: args.growth_window.as_secs().max(1),
            old_after_s: args.old_after.as_secs(),
        },
        all_sites: args.flamegraph.is_some() || args.pprof.is_some(),
    };
    let mut out = std::io::stdout().lock();
    let end = rt.block_on(heap::follow(follow, probes, |kind, snap, counts| {
        show(&mut out, args.json, kind, snap, counts)
    }))?;
    if end.exited {
        crate::say!("tracer: pid {} exited", args.pid);
    }
    if end.ring_lost > 0 {
        crate::say!(
            "tracer: {} events lost (ring buffer full): the figures are low",
            end.ring_lost
        );
    }
    if let Some(path) = &args.flamegraph {
        write_flamegraph(path, &fold(&end.sites), args.pid, &comm)?;
    }
    if let Some(path) = &args.pprof {
        write_pprof(path, &end.sites, &args, &comm)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows a snapshot, with what the probes counted.
fn show(
    out: &mut impl std::io::Write,
    json: bool,
    kind: &str,
    snap: &HeapSnapshot,
    counts: Option<HeapCounts>,
) {
    let now = wall_now_ns();
    if json {
        let v = json!({ "type": kind, "time": format_wall(now), "heap": snap, "probes": counts });
        let _ = writeln!(out, "{v}");
    } else {
        let _ = write!(out, "{}", render(snap, &format_wall(now)));
    }
    let _ = out.flush();
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

/// Folded stacks of the live bytes (`outer;...;inner bytes`), the input
/// of a flame graph.
fn fold(sites: &[HeapSite]) -> Vec<String> {
    sites
        .iter()
        .map(|s| {
            let names: Vec<String> = s
                .frames
                .iter()
                .rev()
                .map(|f| f.short().replace(';', ":"))
                .collect();
            format!("{} {}", names.join(";"), s.live_bytes)
        })
        .collect()
}

/// The live heap by stack as a pprof profile: live and allocated bytes.
fn write_pprof(
    path: &std::path::Path,
    sites: &[HeapSite],
    args: &AttachArgs,
    comm: &str,
) -> anyhow::Result<()> {
    use crate::export::pprof::{Meta, Stack, sampling, write};
    let meta = Meta {
        sample_types: &[("inuse_space", "bytes"), ("alloc_space", "bytes")],
        period: ("space", "bytes", args.sample_bytes),
        time_ns: wall_now_ns(),
        duration_ns: 0,
        comments: vec![format!(
            "tracer attach --host: the live heap of pid {} ({comm}), {}",
            args.pid,
            sampling(args.sample_bytes, "allocated", "every allocation kept")
        )],
    };
    let stacks = sites.iter().map(|s| Stack {
        frames: &s.frames,
        values: vec![s.live_bytes as i64, s.allocated_bytes as i64],
        process: None,
    });
    write(path, &meta, stacks, "live bytes")
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
