//! The library watcher: finds the files of uprobe families in the
//! processes of the node and attaches to them on a thread of its own.
//! Reading /proc of thousands of processes and parsing ELF symbol tables
//! must never run on the thread that commits kills.
//!
//! A family is watched node-wide (CUDA: each distinct file once, for all
//! processes) or for the processes of some memory cgroups only (the heap:
//! libc is mapped by every process, and every process mapping a probed
//! file would pay the trap, so each traced process gets its own
//! attachment, removed when it exits).
//!
//! Each file is known by (dev, inode) from a `stat` before anything of it
//! is read; a file looked at once (CUDA or not) is never parsed again, so
//! a full scan of a node costs a read of each process's maps and a `stat`
//! per candidate file.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    Probes,
    uprobe::{Attachment, UprobeFamily, candidates, candidates_of, inspect},
    usdt::{self, UsdtAttachment},
};
use crate::util::{sys::all_pids, term::escape};

/// Rescans of a new process after its exec (libraries such as libcudart
/// are often loaded seconds later, at `import torch`).
pub const RESCAN_AFTER_EXEC: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(10),
];
/// A full scan of every process, for what the exec rescans missed.
pub const FULL_SCAN: Duration = Duration::from_secs(30);

/// What the watcher has done, readable while it runs.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Processes whose files were looked at.
    pub processes_scanned: AtomicU64,
    /// Files whose symbols were read (each distinct file once).
    pub files_parsed: AtomicU64,
    /// Files attached to.
    pub files_attached: AtomicU64,
}

enum Msg {
    Exec(u32),
    Fork(u32),
    Exit(u32),
    Cgroup(&'static str, String, bool),
}

/// Which processes a watched family is attached for.
#[derive(Clone, Debug)]
pub enum Scope {
    /// Every process: each distinct file once, for all.
    Node,
    /// The processes of these memory cgroups and their descendants (paths
    /// as /proc/PID/cgroup names them): each process on its own.
    Cgroups(Vec<String>),
}

/// A family and the processes it is attached for.
#[derive(Clone, Debug)]
pub struct Watched {
    /// The family.
    pub family: &'static UprobeFamily,
    /// For whom.
    pub scope: Scope,
}

/// The memory cgroup path of `pid` (v1 `memory` controller, else v2).
fn memcg_of(pid: u32) -> Option<String> {
    let text = std::fs::read(format!("/proc/{pid}/cgroup")).ok()?;
    let text = String::from_utf8_lossy(&text);
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some(path.to_string());
        }
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    v2
}

/// Whether cgroup `path` is one of `roots` or below one.
pub fn under(path: &str, roots: &[String]) -> bool {
    roots.iter().any(|r| {
        let r = r.trim_end_matches('/');
        r.is_empty()
            || path == r
            || path
                .strip_prefix(r)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The watcher thread's state.
struct Watch {
    probes: Probes,
    watched: Vec<Watched>,
    /// (family index, process for per-process scopes or 0, file).
    looked_at: HashSet<(usize, u32, (u64, u64))>,
    /// (process for per-process scopes, attachment).
    attached: Vec<(Option<u32>, Attachment)>,
    rescans: Vec<(u32, Instant)>,
    last_full: Instant,
    stats: Arc<WatchStats>,
    /// Whether some family is attached per process.
    per_process: bool,
    /// Caching allocator probes (PyTorch's USDT), with the CUDA family.
    allocator: Option<AllocatorWatch>,
}

/// The caching allocator's USDT probes, node-wide: each file with probes
/// attached once for all processes. The kernel raises each probe's
/// semaphore in every process that maps the file (a probe stays silent in
/// a process whose semaphore is zero), and lowers it when the probes go.
#[derive(Default)]
struct AllocatorWatch {
    /// Files looked at (attached if they have probes).
    files: HashSet<(u64, u64)>,
    attached: Vec<UsdtAttachment>,
}

impl AllocatorWatch {
    fn scan(&mut self, probes: &mut Probes, pid: u32, stats: &WatchStats) {
        let Ok(files) = candidates(pid, usdt::is_usdt_library_name) else {
            return;
        };
        for c in files {
            if !self.files.insert(c.id) {
                continue;
            }
            stats.files_parsed.fetch_add(1, Ordering::Relaxed);
            let Some(f) = usdt::inspect(&c) else {
                continue;
            };
            for (probe, why) in &f.refused {
                tracing::warn!("{probe} in {}: not attached: {why}", escape(&c.path));
            }
            match probes.attach_usdt(&f, None) {
                Ok(att) => {
                    stats.files_attached.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "caching allocator: attached to {} USDT probes in {} (found in pid {pid}); the kernel raises their {} semaphores in every process that maps it",
                        att.attached(),
                        escape(&c.path),
                        f.semaphores()
                    );
                    for (probe, why) in &att.failed {
                        tracing::warn!("{probe} in {}: {why}", escape(&c.path));
                    }
                    self.attached.push(att);
                }
                Err(e) => tracing::warn!("attaching to {}: {e}", escape(&c.path)),
            }
        }
    }

    /// Removes the probes (the kernel lowers the semaphores).
    fn detach(self, probes: &mut Probes) {
        probes.detach_usdt(self.attached);
    }
}

impl Watch {
    /// Attaches to the files of `pid` not looked at yet, for every family
    /// whose scope takes it.
    fn scan(&mut self, pid: u32) {
        for i in 0..self.watched.len() {
            let target = match &self.watched[i].scope {
                Scope::Node => None,
                Scope::Cgroups(roots) => match memcg_of(pid) {
                    Some(cg) if under(&cg, roots) => Some(pid),
                    _ => continue,
                },
            };
            self.scan_family(i, pid, target);
        }
        if let Some(a) = &mut self.allocator {
            a.scan(&mut self.probes, pid, &self.stats);
        }
    }

    fn scan_family(&mut self, i: usize, pid: u32, target: Option<u32>) {
        let family = self.watched[i].family;
        let Ok(candidates) = candidates_of(family, pid) else {
            return;
        };
        self.stats.processes_scanned.fetch_add(1, Ordering::Relaxed);
        for c in candidates {
            if !self.looked_at.insert((i, target.unwrap_or(0), c.id)) {
                continue;
            }
            self.stats.files_parsed.fetch_add(1, Ordering::Relaxed);
            let Some(lib) = inspect(family, &c) else {
                continue;
            };
            match self.probes.attach_family(family, &lib, target, false) {
                Ok(att) => {
                    if let (true, Some(pid)) = (family.syscalls, target)
                        && let Err(e) = self.probes.heap_pid(pid, true)
                    {
                        tracing::warn!("{}: pid {pid}'s system calls: {e}", family.name);
                    }
                    self.stats.files_attached.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "{}: attached to {} ({} functions; {} pid {pid}{})",
                        family.name,
                        escape(&lib.path),
                        att.attached(),
                        if target.is_some() { "for" } else { "found in" },
                        if lib.executable {
                            ", linked into the executable"
                        } else {
                            ""
                        }
                    );
                    for (sym, why) in &att.failed {
                        tracing::warn!("{}: {sym} in {}: {why}", family.name, escape(&lib.path));
                    }
                    self.attached.push((target, att));
                }
                Err(e) => tracing::warn!(
                    "{}: attaching to {} failed: {e}",
                    family.name,
                    escape(&lib.path)
                ),
            }
        }
    }

    /// A traced process is gone: its own attachments are removed.
    fn exited(&mut self, pid: u32) {
        self.rescans.retain(|(p, _)| *p != pid);
        self.detach_pid(pid);
    }

    /// Removes what was attached for `pid` alone.
    fn detach_pid(&mut self, pid: u32) {
        if !self.per_process {
            return;
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.attached)
            .into_iter()
            .partition(|(t, _)| *t == Some(pid));
        self.attached = kept;
        self.looked_at.retain(|(_, p, _)| *p != pid);
        if !gone.is_empty() {
            let _ = self.probes.heap_pid(pid, false);
        }
        self.probes
            .detach_families(gone.into_iter().map(|(_, a)| a).collect());
    }

    /// Adds (or removes) memory cgroup `path` to the scope of the family
    /// called `family`: its processes are attached to now (or detached,
    /// unless another root of the scope still holds them).
    fn set_cgroup(&mut self, family: &str, path: String, on: bool) {
        let Some(i) = self
            .watched
            .iter()
            .position(|w| w.family.name == family && matches!(w.scope, Scope::Cgroups(_)))
        else {
            return;
        };
        let Scope::Cgroups(roots) = &mut self.watched[i].scope else {
            return;
        };
        if on {
            if !roots.contains(&path) {
                roots.push(path.clone());
            }
            let single = [path];
            for pid in all_pids() {
                if memcg_of(pid).is_some_and(|cg| under(&cg, &single)) {
                    self.scan_family(i, pid, Some(pid));
                }
            }
        } else {
            roots.retain(|r| *r != path);
            let roots = roots.clone();
            let pids: Vec<u32> = self
                .attached
                .iter()
                .filter_map(|(t, _)| *t)
                .collect::<HashSet<u32>>()
                .into_iter()
                .collect();
            for pid in pids {
                if !memcg_of(pid).is_some_and(|cg| under(&cg, &roots)) {
                    self.detach_pid(pid);
                }
            }
        }
    }

    fn full_scan(&mut self) {
        self.last_full = Instant::now();
        for pid in all_pids() {
            self.scan(pid);
        }
    }

    fn run(mut self, rx: Receiver<Msg>) -> Self {
        loop {
            match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(Msg::Exec(pid)) => {
                    let now = Instant::now();
                    // A new image. What was attached for this process
                    // stays: a uprobe bound to a process follows it through
                    // exec into every file the new image maps too (libc);
                    // files new to it are found by the rescans.
                    if self.per_process {
                        // Its libraries are mapped within milliseconds.
                        self.rescans.push((pid, now + Duration::from_millis(100)));
                    }
                    self.rescans
                        .extend(RESCAN_AFTER_EXEC.iter().map(|d| (pid, now + *d)));
                }
                Ok(Msg::Fork(pid)) => {
                    // A child shares its parent's files: looked at now.
                    self.scan(pid);
                }
                Ok(Msg::Exit(pid)) => self.exited(pid),
                Ok(Msg::Cgroup(family, path, on)) => self.set_cgroup(family, path, on),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self,
            }
            let now = Instant::now();
            if now.duration_since(self.last_full) >= FULL_SCAN {
                self.full_scan();
            }
            let due: Vec<u32> = self
                .rescans
                .iter()
                .filter(|(_, t)| *t <= now)
                .map(|(p, _)| *p)
                .collect();
            self.rescans.retain(|(_, t)| *t > now);
            for pid in due {
                self.scan(pid);
            }
        }
    }

    /// Removes every probe, together ([`super::drop_together`]).
    fn detach(mut self) {
        let n: usize = self.attached.iter().map(|(_, a)| a.probes()).sum();
        if n > 0 {
            tracing::info!("removing {n} probes");
        }
        let atts = std::mem::take(&mut self.attached);
        self.probes
            .detach_families(atts.into_iter().map(|(_, a)| a).collect());
        if let Some(a) = self.allocator.take() {
            a.detach(&mut self.probes);
        }
    }
}

/// Attaches uprobe families to the files that hold them.
pub struct LibraryWatcher {
    tx: Option<SyncSender<Msg>>,
    /// Whether some family is attached per process (forks and exits matter).
    per_process: bool,
    thread: Option<JoinHandle<Watch>>,
    stats: Arc<WatchStats>,
}

impl LibraryWatcher {
    /// Scans every process once (on the calling thread, so what runs now is
    /// traced when this returns), then goes on watching on its own thread.
    /// `probes` must have the families' programs loaded.
    pub fn spawn(probes: Probes, watched: Vec<Watched>) -> std::io::Result<Self> {
        let stats = Arc::new(WatchStats::default());
        let per_process = watched.iter().any(|w| matches!(w.scope, Scope::Cgroups(_)));
        // With CUDA node-wide, the caching allocator's probes too.
        let allocator = watched
            .iter()
            .any(|w| w.family.name == super::uprobe::CUDA.name && matches!(w.scope, Scope::Node))
            .then(AllocatorWatch::default);
        let mut w = Watch {
            probes,
            watched,
            looked_at: HashSet::new(),
            attached: Vec::new(),
            rescans: Vec::new(),
            last_full: Instant::now(),
            stats: stats.clone(),
            per_process,
            allocator,
        };
        w.full_scan();
        // Bounded: a fork storm drops messages (the full scan catches up)
        // rather than growing a queue without end.
        let (tx, rx) = sync_channel(4096);
        let thread = std::thread::Builder::new()
            .name("tracer-libwatch".into())
            .spawn(move || w.run(rx))?;
        Ok(Self {
            tx: Some(tx),
            per_process,
            thread: Some(thread),
            stats,
        })
    }

    /// A process exec'd: its files are looked at a few times as it starts.
    pub fn on_exec(&self, pid: u32) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Msg::Exec(pid));
        }
    }

    /// A process forked: the child is looked at (it may be in a traced cgroup).
    pub fn on_fork(&self, pid: u32) {
        if let (true, Some(tx)) = (self.per_process, &self.tx) {
            let _ = tx.try_send(Msg::Fork(pid));
        }
    }

    /// Adds (or removes) memory cgroup `path` to the per-process scope of
    /// `family` (heap sampling for a cgroup under pressure). False when the
    /// watcher's queue was full (the caller tries again).
    pub fn watch_cgroup(&self, family: &'static UprobeFamily, path: &str, on: bool) -> bool {
        self.tx.as_ref().is_some_and(|tx| {
            tx.try_send(Msg::Cgroup(family.name, path.to_string(), on))
                .is_ok()
        })
    }

    /// A process exited: what was attached for it alone is removed.
    pub fn on_exit(&self, pid: u32) {
        if let (true, Some(tx)) = (self.per_process, &self.tx) {
            let _ = tx.try_send(Msg::Exit(pid));
        }
    }

    /// What it has done so far.
    pub fn stats(&self) -> &WatchStats {
        &self.stats
    }

    /// Stops watching and removes every probe it attached.
    pub fn stop(mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take()
            && let Ok(w) = t.join()
        {
            w.detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_scopes_take_descendants_only() {
        let roots = vec!["/kubepods/pod1".to_string()];
        assert!(under("/kubepods/pod1", &roots));
        assert!(under("/kubepods/pod1/ctr", &roots));
        assert!(!under("/kubepods/pod10", &roots));
        assert!(!under("/kubepods", &roots));
        assert!(under("/anything", &["/".to_string()]));
        // This process is somewhere under the root.
        let me = memcg_of(std::process::id()).expect("a cgroup");
        assert!(under(&me, &["/".to_string()]), "{me}");
    }
}
