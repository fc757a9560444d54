//! The library watcher: finds the files of a uprobe family in the
//! processes of the node and attaches to each distinct file once, for all
//! processes, on a thread of its own. Reading /proc of thousands of
//! processes and parsing ELF symbol tables must never run on the thread
//! that commits kills.
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
        mpsc::{Receiver, RecvTimeoutError, Sender, channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    Probes,
    uprobe::{Attachment, UprobeFamily, candidates_of, inspect},
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
}

/// The watcher thread's state.
struct Watch {
    probes: Probes,
    family: &'static UprobeFamily,
    looked_at: HashSet<(u64, u64)>,
    attached: Vec<Attachment>,
    rescans: Vec<(u32, Instant)>,
    last_full: Instant,
    stats: Arc<WatchStats>,
}

impl Watch {
    /// Attaches to the files of `pid` not looked at yet.
    fn scan(&mut self, pid: u32) {
        let Ok(candidates) = candidates_of(self.family, pid) else {
            return;
        };
        self.stats.processes_scanned.fetch_add(1, Ordering::Relaxed);
        for c in candidates {
            if !self.looked_at.insert(c.id) {
                continue;
            }
            self.stats.files_parsed.fetch_add(1, Ordering::Relaxed);
            let Some(lib) = inspect(self.family, &c) else {
                continue;
            };
            match self.probes.attach_family(self.family, &lib, None, false) {
                Ok(att) => {
                    self.stats.files_attached.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "{}: attached to {} ({} functions; found in pid {pid}{})",
                        self.family.name,
                        escape(&lib.path),
                        att.attached(),
                        if lib.executable {
                            ", linked into the executable"
                        } else {
                            ""
                        }
                    );
                    for (sym, why) in &att.failed {
                        tracing::warn!(
                            "{}: {sym} in {}: {why}",
                            self.family.name,
                            escape(&lib.path)
                        );
                    }
                    self.attached.push(att);
                }
                Err(e) => tracing::warn!(
                    "{}: attaching to {} failed: {e}",
                    self.family.name,
                    escape(&lib.path)
                ),
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
                    self.rescans
                        .extend(RESCAN_AFTER_EXEC.iter().map(|d| (pid, now + *d)));
                }
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

    /// Removes every probe (slow: a kernel grace period per uprobe).
    fn detach(mut self) {
        let n: usize = self.attached.iter().map(|a| a.attached() * 2).sum();
        if n > 0 {
            tracing::info!("{}: removing {n} probes", self.family.name);
        }
        for att in std::mem::take(&mut self.attached) {
            self.probes.detach_family(att);
        }
    }
}

/// Attaches a uprobe family to the files that hold it, node-wide.
pub struct LibraryWatcher {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<Watch>>,
    stats: Arc<WatchStats>,
}

impl LibraryWatcher {
    /// Scans every process once (on the calling thread, so what runs now is
    /// traced when this returns), then goes on watching on its own thread.
    /// `probes` must have the family's programs loaded.
    pub fn spawn(probes: Probes, family: &'static UprobeFamily) -> std::io::Result<Self> {
        let stats = Arc::new(WatchStats::default());
        let mut w = Watch {
            probes,
            family,
            looked_at: HashSet::new(),
            attached: Vec::new(),
            rescans: Vec::new(),
            last_full: Instant::now(),
            stats: stats.clone(),
        };
        w.full_scan();
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("tracer-libwatch".into())
            .spawn(move || w.run(rx))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        })
    }

    /// A process exec'd: its files are looked at a few times as it starts.
    pub fn on_exec(&self, pid: u32) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Exec(pid));
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
