//! `tracer growth`'s loop: the page faults of the followed processes (one
//! process, or every process of a memory cgroup, now and later) sampled by
//! bytes with their stacks, and their growth reported as it goes.

use std::{collections::BTreeSet, os::fd::OwnedFd, path::PathBuf, time::Duration};

use anyhow::{Context as _, anyhow};

use super::{Ends, RESCAN, drain, start_readers};
use crate::{
    collect::decode::Event,
    probes::{
        HEAP_DATA_RING_BYTES, Probes,
        growth::{GrowthMaps, GrowthMode, GrowthOptions},
    },
    record::GrowthReport,
    recorder::{heap::View, heap_worker::HeapWorker},
    util::{
        time::{Clock, wall_now_ns},
        units::bytes,
    },
};

/// What to follow, and how.
pub struct Follow {
    /// The process (its pidfd ends the session when it exits).
    pub pid: Option<u32>,
    /// The process's pidfd.
    pub pidfd: Option<OwnedFd>,
    /// The memory cgroup's directory (cgroup mode).
    pub dir: Option<PathBuf>,
    /// What is followed, as said at the start.
    pub what: String,
    /// One sample per this many bytes faulted in.
    pub sample_bytes: u64,
    /// Sites kept per process.
    pub top: usize,
    /// The growth of this last stretch of time is reported.
    pub window: Duration,
    /// Reported this often.
    pub every: Duration,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

/// The probes growth following needs, loaded.
pub fn load(sample_bytes: u64) -> anyhow::Result<Probes> {
    let heap = crate::probes::heap::config(
        crate::probes::heap::DEFAULT_SAMPLE_BYTES,
        crate::probes::heap::DEFAULT_ALWAYS_BYTES,
    );
    let opts = GrowthOptions {
        mode: GrowthMode::Selected,
        sample_bytes,
        reserve_bytes: crate::probes::growth::DEFAULT_RESERVE_BYTES,
    };
    Probes::load_with(HEAP_DATA_RING_BYTES, &heap, &opts).context("cannot follow growth")
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

/// Follows the growth of `f`'s processes until the process exits,
/// `f.duration` runs out, SIGINT or SIGTERM; `show` gets the reports every
/// `f.every` (kind `growth`) and once at the end (`exit` or `end`), with
/// when following started.
pub async fn follow(
    f: Follow,
    mut probes: Probes,
    mut show: impl FnMut(&str, &[GrowthReport], i64),
) -> anyhow::Result<()> {
    let mut followed = Followed {
        dir: f.dir,
        pids: BTreeSet::new(),
    };
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 4096)?;
    let mut maps = probes.take_growth_maps()?;
    let statuses = probes
        .attach_growth(false)
        .context("growth attribution needs the page fault tracepoints")?;
    if let Some(pid) = f.pid {
        probes.growth_select(pid, true)?;
        followed.pids.insert(pid);
    }
    followed.scan(&mut probes, &mut maps)?;
    // Renewed once selected: the decision of a selected process is taken
    // again at its next fault.
    maps.new_generation()?;
    let python = probes.take_python_map().ok();
    let worker = HeapWorker::spawn(
        crate::probes::heap::DEFAULT_SAMPLE_BYTES,
        f.sample_bytes,
        View {
            top: f.top,
            growth_window_s: 60,
            old_after_s: 60,
        },
        python,
    )?;
    if let Some(pid) = f.pid {
        worker.follow(pid);
    }
    if crate::probes::growth::returns_traced(&statuses) {
        worker.returns_traced();
    }
    crate::say!(
        "tracer: following the growth of {} (one sample per {} faulted in)",
        f.what,
        bytes(f.sample_bytes)
    );
    let clock = Clock::now();
    let start = wall_now_ns();
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut ends = Ends::new_opt(f.pidfd, f.duration)?;
    let mut every = tokio::time::interval(f.every);
    every.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    let window_s = f.window.as_secs();
    let on_event = |ev: Event, seen: &mut BTreeSet<u32>| match ev {
        Event::GrowthFault(s) => {
            let ts = clock.boot_to_wall(s.header.ts_boot_ns).max(0) as u64;
            seen.insert(s.header.pid);
            worker.fault(s, ts);
        }
        Event::GrowthReturn(r) => {
            worker.gave_back(&r, clock.boot_to_wall(r.header.ts_boot_ns).max(0) as u64);
        }
        _ => {}
    };
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => on_event(ev, &mut seen),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            _ = every.tick() => {
                let reports = reports(&worker, &seen, window_s).await;
                show("growth", &reports, start);
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
    show(if exited { "exit" } else { "end" }, &reports, start);
    let counts = maps.read().ok();
    let ring_lost = drops.read().map(|d| d.data).unwrap_or(0)
        + counts.map(|c| c.ring_full).unwrap_or(0)
        + worker.dropped();
    if ring_lost > 0 {
        crate::say!("tracer: {ring_lost} samples lost: the figures are low");
    }
    worker.stop();
    Ok(())
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
