//! `tracer attach --host`'s loop: the heap of one running process, sampled
//! by bytes in the kernel and unwound off the loop, a snapshot each second
//! and one at the end, handed to the caller to show.

use std::{os::fd::OwnedFd, time::Duration};

use anyhow::{Context as _, anyhow, bail};

use super::{Ends, RESCAN, Target, attached::Attached, drain, first_libraries, start_readers};
use crate::{
    collect::decode::Event,
    probes::{
        HEAP_DATA_RING_BYTES, Probes,
        heap::{HeapCounts, HeapStats},
        uprobe::HEAP,
    },
    record::HeapSnapshot,
    recorder::{
        heap::View,
        heap_worker::{HeapWorker, Reply},
    },
    util::time::Clock,
};

/// What to follow, and how.
pub struct Follow {
    /// The process.
    pub target: Target,
    /// One sample per this many bytes allocated.
    pub sample_bytes: u64,
    /// What each snapshot shows.
    pub view: View,
    /// The end carries every site with live bytes (for a flame graph or
    /// a profile).
    pub all_sites: bool,
}

/// How a session ended.
pub struct End {
    /// The process exited (rather than the duration or a signal).
    pub exited: bool,
    /// Events the data ring lost.
    pub ring_lost: u64,
    /// Every site with live bytes at the end, most first, when asked for.
    pub sites: Vec<crate::record::HeapSite>,
}

/// The heap probes, loaded for `pid` (named `comm`, whose pidfd says
/// whether it left), refused when none of its files has an allocator.
pub fn load(
    pid: u32,
    comm: &str,
    pidfd: &OwnedFd,
    heap: tracer_common::heap::HeapConfig,
    floor: bool,
) -> anyhow::Result<Probes> {
    let mut probes =
        Probes::load_with_heap(HEAP_DATA_RING_BYTES, &heap).context("cannot attach")?;
    probes.load_family(&HEAP, floor)?;
    if !floor {
        for why in probes.attach_heap_syscalls() {
            tracing::warn!("{why}: mmap, mremap, brk and munmap are not traced");
        }
        probes.heap_pid(pid, true)?;
    }
    let libs = first_libraries(&HEAP, pid, comm, pidfd)?;
    if libs.is_empty() {
        bail!(
            "pid {pid} ({comm}) has no allocator tracer can probe: none of its mapped files \
             (libc.so*, ld-musl*, libc.musl*, or a library named like *malloc*, jemalloc, \
             tcmalloc, mimalloc) nor its executable exports both malloc and free \
             (a stripped static binary keeps its allocator to itself)"
        );
    }
    Ok(probes)
}

/// The samples of one process, on their way to the worker.
struct Session {
    pid: u32,
    worker: HeapWorker,
    stats: HeapStats,
    clock: Clock,
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

    /// A snapshot the worker made, with what was lost on the way, and the
    /// probes' counts.
    fn complete(&self, mut snap: HeapSnapshot) -> (HeapSnapshot, Option<HeapCounts>) {
        let counts = self.stats.read().ok();
        snap.lost_samples =
            counts.map(|c| c.map_full + c.ring_full).unwrap_or(0) + self.worker.dropped();
        (snap, counts)
    }
}

/// Follows the heap of `f.target.pid` until it exits, `f.target.duration` runs out,
/// SIGINT or SIGTERM; `show` gets a snapshot each second (kind `heap`) and
/// the last one (`exit` or `detach`).
pub async fn follow(
    f: Follow,
    mut probes: Probes,
    mut show: impl FnMut(&str, &HeapSnapshot, Option<HeapCounts>),
) -> anyhow::Result<End> {
    // Samples are large (they carry 8 KiB of stack): a short queue.
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 4096)?;
    let heap_stats = probes.take_heap_stats()?;
    let python = probes.take_python_map().ok();
    let worker = HeapWorker::spawn(
        f.sample_bytes,
        crate::probes::growth::DEFAULT_SAMPLE_BYTES,
        f.view,
        python,
    )?;
    worker.follow(f.target.pid);
    let mut attached = Attached::new(&HEAP, f.target.pid, f.target.floor, f.target.entry_sites);
    attached.scan(&mut probes)?;
    let (functions, files) = attached.counts();
    crate::say!(
        "tracer: tracing the heap of pid {} ({}): {functions} functions in {files} files",
        f.target.pid,
        f.target.comm
    );
    let mut session = Session {
        pid: f.target.pid,
        worker,
        stats: heap_stats,
        clock: Clock::now(),
    };
    let mut ends = Ends::new(f.target.pidfd, f.target.duration)?;
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
                asked = session.worker.request(f.target.pid, false);
            }
            Ok((snap, _)) = async { asked.as_mut().expect("guarded").await }, if asked.is_some() => {
                asked = None;
                let (snap, counts) = session.complete(snap);
                show("heap", &snap, counts);
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
    let last = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match session.worker.request(f.target.pid, f.all_sites) {
                Some(rx) => break rx.await.ok(),
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .ok()
    .flatten();
    let Some((snap, sites)) = last else {
        bail!("the heap worker did not answer");
    };
    let (snap, counts) = session.complete(snap);
    show(if exited { "exit" } else { "detach" }, &snap, counts);
    session.worker.stop();
    attached.detach(&mut probes);
    Ok(End {
        exited,
        ring_lost,
        sites,
    })
}
