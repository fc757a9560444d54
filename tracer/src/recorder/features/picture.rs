//! A picture before the kill (`--growth risk`): when a memory cgroup arms,
//! its processes are pictured over the first second after: where each
//! grew (sampled page faults, Python frames included) and, where heap
//! tracing is loaded, its top allocation sites from a bounded attach of
//! the heap probes to the cgroup. The picture is stored as a
//! `growth_picture` event and kept with the cgroup, so a kill that comes
//! seconds or minutes later has a "before" (`kill.picture`).
//!
//! Budgets: a second of window, two seconds for the worker's answers, 8
//! processes (the largest), 3 sites each of 8 frames, 16 KiB of JSON. What
//! does not fit, and what could not be taken, is said in `skipped`.

use std::collections::BTreeMap;

use tokio::sync::oneshot::Receiver;

use super::Env;
use crate::{
    model::proc::read_status_mem,
    probes::{uprobe::HEAP, watch::LibraryWatcher},
    record::{
        EventRow, GROWTH_PICTURE, GrowthReport, HeapSnapshot, KillRecord, Picture, PictureProcess,
    },
    recorder::{
        heap_worker::{HeapWorker, Reply},
        output::{Output, Outputs},
    },
    util::term::escape,
};

/// The picture covers this long after its cgroup armed.
pub const WINDOW_NS: i64 = 1_000_000_000;
/// The worker's answers are awaited this long; what is missing by then is
/// said.
const ANSWER_NS: i64 = 2_000_000_000;
/// Processes pictured, the largest first.
const PROCESSES: usize = 8;
/// Sites per process (growth, heap).
const SITES: usize = 3;
/// Frames per site.
const FRAMES: usize = 8;
/// The picture's JSON, at most.
const BYTES: usize = 16 * 1024;
/// A kill takes the picture of its cgroup taken at most this long before.
const KEEP_NS: i64 = 15 * 60 * 1_000_000_000;
/// A cgroup is pictured again only this long after its last picture (a
/// kill in it keeps the last one for [`KEEP_NS`]).
const AGAIN_NS: i64 = 10 * 60 * 1_000_000_000;
/// Pictures in progress at once, at most.
const AT_ONCE: usize = 4;

/// What the worker was asked about one process.
struct Asked {
    pid: u32,
    comm: String,
    rss_bytes: Option<u64>,
    growth: Option<Receiver<GrowthReport>>,
    heap: Option<Receiver<Reply>>,
    got_growth: Option<GrowthReport>,
    got_heap: Option<HeapSnapshot>,
}

impl Asked {
    /// Takes in what has come; true once nothing is awaited.
    fn poll(&mut self) -> bool {
        if let Some(r) = take(&mut self.growth) {
            self.got_growth = Some(r);
        }
        if let Some((snap, _)) = take(&mut self.heap) {
            self.got_heap = Some(snap);
        }
        self.growth.is_none() && self.heap.is_none()
    }
}

/// The answer in `rx` if it came; `rx` is emptied once it came or its
/// sender is gone.
fn take<T>(rx: &mut Option<Receiver<T>>) -> Option<T> {
    let got = rx.as_mut()?.try_recv();
    match got {
        Ok(v) => {
            *rx = None;
            Some(v)
        }
        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
            *rx = None;
            None
        }
        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => None,
    }
}

enum Stage {
    /// The window after arming, until `due_ns`.
    Window { due_ns: i64 },
    /// Awaiting the worker until `deadline_ns`.
    Answers { deadline_ns: i64, asked: Vec<Asked> },
}

/// A picture being taken.
struct Taking {
    path: String,
    armed_ns: i64,
    /// The heap probes were attached to the cgroup for it (and are taken
    /// off at the window's end).
    heap_on: bool,
    /// Heap sites are asked for (attached for it, or by heap on pressure).
    heap_asked: bool,
    stage: Stage,
    more: usize,
    skipped: Vec<String>,
}

/// The pictures feature.
pub struct Pictures {
    /// Heap tracing is loaded (`--heap-on-pressure`, `--host-cgroup`).
    heap_loaded: bool,
    taking: Vec<Taking>,
    /// The last picture of each cgroup.
    last: BTreeMap<String, Picture>,
    /// Pictures taken (for the stop summary).
    pub taken: u64,
    /// Armings not pictured: [`AT_ONCE`] in progress, or the cgroup
    /// pictured within [`AGAIN_NS`].
    pub not_taken: u64,
}

impl Pictures {
    /// Pictures with heap sites where `heap_loaded`.
    pub fn new(heap_loaded: bool) -> Self {
        Self {
            heap_loaded,
            taking: Vec::new(),
            last: BTreeMap::new(),
            taken: 0,
            not_taken: 0,
        }
    }

    /// `path` armed at `now`: its picture starts. `heap_held`: heap tracing
    /// on pressure traces it already.
    pub fn armed(
        &mut self,
        path: &str,
        now: i64,
        watcher: Option<&LibraryWatcher>,
        heap_held: bool,
    ) {
        if self.taking.iter().any(|t| t.path == path) {
            return;
        }
        // Bounded against cgroups that arm again and again, or many at
        // once (any user with a delegated subtree can make them): each
        // picture asks the worker for up to 8 processes and stores 16 KiB.
        let recent = self
            .last
            .get(path)
            .is_some_and(|p| now - p.ts_ns < AGAIN_NS);
        if recent || self.taking.len() >= AT_ONCE {
            self.not_taken += 1;
            tracing::debug!(
                "picture: {} not pictured ({})",
                escape(path),
                if recent {
                    "pictured within 10 min"
                } else {
                    "4 pictures in progress"
                }
            );
            return;
        }
        let mut skipped = Vec::new();
        let mut heap_on = false;
        let heap_asked = match (self.heap_loaded, watcher) {
            (true, Some(_)) if heap_held => true,
            (true, Some(w)) => {
                heap_on = w.watch_cgroup(&HEAP, path, true);
                if !heap_on {
                    skipped.push("heap sites: the library watcher was busy".into());
                }
                heap_on
            }
            _ => {
                skipped.push(
                    "heap sites: heap tracing is not loaded (record --heap-on-pressure or --host-cgroup loads it)"
                        .into(),
                );
                false
            }
        };
        self.taking.push(Taking {
            path: path.to_string(),
            armed_ns: now,
            heap_on,
            heap_asked,
            stage: Stage::Window {
                due_ns: now + WINDOW_NS,
            },
            more: 0,
            skipped,
        });
    }

    /// Whether a picture is in progress.
    pub fn busy(&self) -> bool {
        !self.taking.is_empty()
    }

    /// Moves the pictures on: at a window's end its processes are asked
    /// for; once answered (or past the budget) the picture is stored.
    pub fn tick(
        &mut self,
        env: &Env<'_>,
        heap: Option<&HeapWorker>,
        watcher: Option<&LibraryWatcher>,
        heap_held: impl Fn(&str) -> bool,
        now: i64,
        out: &mut Outputs,
    ) {
        let mut done = Vec::new();
        for (i, t) in self.taking.iter_mut().enumerate() {
            match &mut t.stage {
                Stage::Window { due_ns } if now >= *due_ns => {
                    let mut procs: Vec<(u32, String, Option<u64>)> = env
                        .model
                        .in_memcg(&t.path, now)
                        .filter(|p| p.exited_ns.is_none())
                        .map(|p| {
                            let rss = read_status_mem(p.info.pid).map(|m| m.rss_kb * 1024);
                            (p.info.pid, p.info.comm.clone(), rss)
                        })
                        .collect();
                    procs.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
                    t.more = procs.len().saturating_sub(PROCESSES);
                    procs.truncate(PROCESSES);
                    let window_s = ((now - t.armed_ns) as u64).div_ceil(1_000_000_000).max(1);
                    if heap.is_none() {
                        t.skipped
                            .push("growth sites: growth attribution is not running".into());
                    }
                    let mut busy = 0;
                    let asked = procs
                        .into_iter()
                        .map(|(pid, comm, rss_bytes)| {
                            let growth = heap.and_then(|h| h.request_growth(pid, window_s));
                            let hp = heap
                                .filter(|_| t.heap_asked)
                                .and_then(|h| h.request(pid, false));
                            busy += usize::from(heap.is_some() && growth.is_none());
                            Asked {
                                pid,
                                comm,
                                rss_bytes,
                                growth,
                                heap: hp,
                                got_growth: None,
                                got_heap: None,
                            }
                        })
                        .collect();
                    if busy > 0 {
                        t.skipped.push(format!(
                            "{busy} process(es): the growth worker's queue was full"
                        ));
                    }
                    // The answers come after every sample sent so far: the
                    // probes can come off now.
                    if t.heap_on && !heap_held(&t.path) {
                        if let Some(w) = watcher
                            && !w.watch_cgroup(&HEAP, &t.path, false)
                        {
                            tracing::warn!(
                                "picture: the library watcher is busy; the heap probes stay on {}",
                                escape(&t.path)
                            );
                        }
                        t.heap_on = false;
                    }
                    t.stage = Stage::Answers {
                        deadline_ns: now + ANSWER_NS,
                        asked,
                    };
                }
                Stage::Window { .. } => {}
                Stage::Answers { deadline_ns, asked } => {
                    // Every one polled (no short cut): each takes in what came.
                    let awaited = asked
                        .iter_mut()
                        .map(Asked::poll)
                        .filter(|done| !done)
                        .count();
                    if awaited == 0 || now >= *deadline_ns {
                        done.push(i);
                    }
                }
            }
        }
        for i in done.into_iter().rev() {
            let t = self.taking.remove(i);
            let Stage::Answers { asked, .. } = t.stage else {
                continue;
            };
            let pic = finish(t.path, t.armed_ns, now, asked, t.more, t.skipped);
            tracing::info!(
                "picture: {} ({} process(es){})",
                escape(&pic.memcg),
                pic.processes.len(),
                if pic.skipped.is_empty() {
                    String::new()
                } else {
                    format!("; {}", pic.skipped.join("; "))
                }
            );
            out.push(Output::Event(EventRow {
                ts_ns: now,
                kind: GROWTH_PICTURE.into(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                data: serde_json::to_value(&pic).unwrap_or_default(),
            }));
            self.taken += 1;
            self.last.insert(pic.memcg.clone(), pic);
        }
        self.last.retain(|_, p| now - p.ts_ns <= KEEP_NS);
    }
}

/// Builds the picture from the answers, within the budget.
fn finish(
    memcg: String,
    armed_ns: i64,
    now: i64,
    asked: Vec<Asked>,
    more: usize,
    mut skipped: Vec<String>,
) -> Picture {
    let cut = |frames: &mut Vec<crate::stacks::symbols::Frame>| frames.truncate(FRAMES);
    let unanswered = asked
        .iter()
        .filter(|a| a.growth.is_some() || a.heap.is_some())
        .count();
    if unanswered > 0 {
        skipped.push(format!(
            "{unanswered} process(es): no answer from the worker within {} s",
            ANSWER_NS / 1_000_000_000
        ));
    }
    // Heap probes attach as each process's allocator is found: a process
    // with no sample may not have had them on yet.
    let no_heap = asked
        .iter()
        .filter(|a| a.got_heap.as_ref().is_some_and(|h| h.sites.is_empty()))
        .count();
    if no_heap > 0 {
        skipped.push(format!(
            "heap sites: {no_heap} process(es) had no allocation sampled in the window (their heap probes may not have been attached yet)"
        ));
    }
    let processes = asked
        .into_iter()
        .map(|a| {
            let (growth_bytes, mut growth_sites) =
                a.got_growth.map(|g| (g.bytes, g.sites)).unwrap_or_default();
            growth_sites.truncate(SITES);
            growth_sites.iter_mut().for_each(|s| cut(&mut s.frames));
            let (heap_live_bytes, mut heap_sites) = match a.got_heap {
                Some(h) => (Some(h.live_bytes), h.sites),
                None => (None, Vec::new()),
            };
            heap_sites.truncate(SITES);
            for s in &mut heap_sites {
                cut(&mut s.frames);
                s.allocations.clear();
            }
            PictureProcess {
                pid: a.pid,
                comm: a.comm,
                rss_bytes: a.rss_bytes,
                growth_bytes,
                growth_sites,
                heap_live_bytes,
                heap_sites,
            }
        })
        .collect();
    let mut pic = Picture {
        memcg,
        armed_ns,
        ts_ns: now,
        processes,
        more_processes: more,
        skipped,
    };
    // The size budget: sites go from the smallest processes first, then
    // the processes themselves.
    let mut left_out = 0usize;
    while serde_json::to_vec(&pic).map_or(0, |v| v.len()) > BYTES {
        let Some(p) = pic
            .processes
            .iter_mut()
            .rev()
            .find(|p| !p.growth_sites.is_empty() || !p.heap_sites.is_empty())
        else {
            if pic.processes.pop().is_none() {
                break;
            }
            pic.more_processes += 1;
            continue;
        };
        if p.heap_sites.pop().is_none() {
            p.growth_sites.pop();
        }
        left_out += 1;
    }
    if left_out > 0 {
        pic.skipped.push(format!(
            "{left_out} site(s) left out to keep the picture under {} KiB",
            BYTES / 1024
        ));
    }
    pic
}

impl Pictures {
    /// The picture of `cgroup` or the nearest cgroup above it, taken before
    /// `ts_ns` and at most [`KEEP_NS`] before.
    fn picture_of(&self, cgroup: &str, ts_ns: i64) -> Option<&Picture> {
        self.last
            .values()
            .filter(|p| p.ts_ns <= ts_ns && ts_ns - p.ts_ns <= KEEP_NS)
            .filter(|p| crate::model::cgroup::at_or_below(cgroup, &p.memcg))
            .max_by_key(|p| p.memcg.len())
    }
}

/// A kill keeps the last picture of its cgroup.
impl crate::correlate::KillEnricher for Pictures {
    fn enrich(&self, k: &mut KillRecord) {
        let Some(cg) = k.cgroup() else { return };
        k.picture = self.picture_of(cg, k.ts_ns).cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::KillEnricher as _,
        record::{GrowthSite, HeapSite},
        recorder::features::kill_in,
        stacks::symbols::Frame,
    };

    fn frames(n: usize, name: &str) -> Vec<Frame> {
        (0..n)
            .map(|i| Frame {
                function: Some(format!("{name}_{i}_{}", "x".repeat(200))),
                ..Default::default()
            })
            .collect()
    }

    fn answered(pid: u32, sites: usize) -> Asked {
        Asked {
            pid,
            comm: format!("p{pid}"),
            rss_bytes: Some(u64::from(pid) << 20),
            growth: None,
            heap: None,
            got_growth: Some(GrowthReport {
                pid,
                bytes: 8 << 20,
                sites: (0..sites)
                    .map(|i| GrowthSite {
                        frames: frames(20, &format!("grow{i}")),
                        bytes: 1 << 20,
                        samples: 1,
                        returned_bytes: 0,
                    })
                    .collect(),
                ..Default::default()
            }),
            got_heap: Some(HeapSnapshot {
                pid,
                live_bytes: 4 << 20,
                sites: (0..sites)
                    .map(|i| HeapSite {
                        frames: frames(20, &format!("alloc{i}")),
                        live_bytes: 1 << 20,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_picture_keeps_to_its_budget_and_says_what_it_left_out() {
        let asked: Vec<Asked> = (1..=8).map(|pid| answered(pid, 10)).collect();
        let mut unanswered = answered(9, 0);
        unanswered.got_growth = None;
        unanswered.got_heap = Some(HeapSnapshot::default());
        let (_tx, rx) = tokio::sync::oneshot::channel();
        unanswered.growth = Some(rx);
        let mut asked = asked;
        asked.push(unanswered);
        let pic = finish("/ctr".into(), 5, 10, asked, 4, Vec::new());
        let size = serde_json::to_vec(&pic).unwrap().len();
        assert!(size <= BYTES, "{size} bytes");
        // Sites at most 3 a process, 8 frames a site, the largest
        // processes keeping theirs.
        assert!(pic.processes.iter().all(|p| p.growth_sites.len() <= SITES
            && p.growth_sites.iter().all(|s| s.frames.len() <= FRAMES)));
        assert_eq!(pic.processes[0].growth_sites.len(), SITES);
        assert!(
            pic.skipped
                .iter()
                .any(|s| s.contains("left out to keep the picture under 16 KiB")),
            "{:?}",
            pic.skipped
        );
        assert!(
            pic.skipped
                .iter()
                .any(|s| s.starts_with("1 process(es): no answer")),
            "{:?}",
            pic.skipped
        );
        assert!(
            pic.skipped
                .iter()
                .any(|s| s.starts_with("heap sites: 1 process(es) had no allocation sampled")),
            "{:?}",
            pic.skipped
        );
        assert_eq!(pic.more_processes, 4);
    }

    #[test]
    fn pictures_are_bounded_at_once_and_per_cgroup() {
        let mut p = Pictures::new(false);
        for i in 0..6 {
            p.armed(&format!("/c{i}"), 100, None, false);
        }
        assert_eq!((p.taking.len(), p.not_taken), (AT_ONCE, 2));
        // Arming again while its picture is taken: nothing new.
        p.armed("/c0", 200, None, false);
        assert_eq!((p.taking.len(), p.not_taken), (AT_ONCE, 2));
        // Pictured a minute ago: not again until AGAIN_NS has passed.
        p.taking.clear();
        p.last.insert(
            "/c0".into(),
            Picture {
                memcg: "/c0".into(),
                ts_ns: 1_000,
                ..Default::default()
            },
        );
        p.armed("/c0", 1_000 + 60_000_000_000, None, false);
        assert_eq!((p.taking.len(), p.not_taken), (0, 3));
        p.armed("/c0", 1_000 + AGAIN_NS, None, false);
        assert_eq!((p.taking.len(), p.not_taken), (1, 3));
    }

    #[test]
    fn a_kill_takes_the_picture_of_its_cgroup_or_the_nearest_above() {
        let mut p = Pictures::new(false);
        for (path, ts) in [("/pod", 100), ("/pod/ctr", 200)] {
            p.last.insert(
                path.into(),
                Picture {
                    memcg: path.into(),
                    ts_ns: ts,
                    ..Default::default()
                },
            );
        }
        let kill = |path: &str, ts_ns: i64| {
            let mut k = kill_in(path, ts_ns);
            p.enrich(&mut k);
            k.picture.map(|p| p.memcg)
        };
        assert_eq!(kill("/pod/ctr/job", 300), Some("/pod/ctr".into()));
        assert_eq!(kill("/pod/other", 300), Some("/pod".into()));
        assert_eq!(kill("/podcast", 300), None);
        // Not a picture taken after the kill, nor one too old.
        assert_eq!(kill("/pod/ctr", 150), Some("/pod".into()));
        assert_eq!(kill("/pod/ctr", 200 + KEEP_NS + 1), None);
    }
}
