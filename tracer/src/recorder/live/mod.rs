//! What the live views (`attach`, `attach --host`, `growth`) share: the
//! ring readers of a live session, what ends it, and the process it
//! follows.

pub mod attached;
pub mod cuda;
pub mod growth;
pub mod heap;
pub mod top;

use std::{
    os::fd::{FromRawFd as _, OwnedFd},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    task::JoinSet,
};

use crate::{
    collect::{self, ReaderStats, decode::Event},
    probes::{
        Probes,
        uprobe::{UprobeFamily, libraries_of},
    },
    util::term,
};

/// The process a live view follows, and how its probes are placed.
pub struct Target {
    /// The process.
    pub pid: u32,
    /// Its name, as said.
    pub comm: String,
    /// Its pidfd: the session ends when it exits.
    pub pidfd: OwnedFd,
    /// Empty programs (the benchmark's floor; no allocator probes).
    pub floor: bool,
    /// Probes at the functions' first instructions, not the placed sites.
    pub entry_sites: bool,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

/// How often the process's memory maps are read for newly loaded libraries.
pub const RESCAN: Duration = Duration::from_millis(500);

/// What ends a live session: the process exits, `--duration` runs out,
/// SIGINT or SIGTERM.
pub struct Ends {
    exit: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    deadline: Option<tokio::time::Instant>,
}

impl Ends {
    /// Ends when the process of `pidfd` exits, `duration` runs out, or at
    /// SIGINT or SIGTERM.
    pub fn new(pidfd: OwnedFd, duration: Option<Duration>) -> anyhow::Result<Self> {
        Self::new_opt(Some(pidfd), duration)
    }

    /// As [`Ends::new`]; without a process only the deadline and the
    /// signals end the session.
    pub fn new_opt(pidfd: Option<OwnedFd>, duration: Option<Duration>) -> anyhow::Result<Self> {
        Ok(Self {
            exit: pidfd.map(collect::async_fd).transpose()?,
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
            deadline: duration.map(|d| tokio::time::Instant::now() + d),
        })
    }

    /// Waits for the end; true when the process exited. Cancel-safe: a
    /// select loop may drop it and call again.
    pub async fn wait(&mut self) -> anyhow::Result<bool> {
        let deadline = self.deadline;
        let until_deadline = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let exit = async {
            match &self.exit {
                Some(fd) => fd.readable().await.map(drop),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = exit => {
                r?;
                Ok(true)
            }
            _ = until_deadline => Ok(false),
            _ = self.sigint.recv() => Ok(false),
            _ = self.sigterm.recv() => Ok(false),
        }
    }
}

/// At the end of a live session: what the readers already queued belongs
/// to it (`f` takes each event), then the readers stop.
pub async fn drain(
    rx: &mut mpsc::Receiver<Event>,
    tasks: &mut JoinSet<anyhow::Result<()>>,
    mut f: impl FnMut(Event),
) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(ev) = rx.try_recv() {
        f(ev);
    }
    tasks.shutdown().await;
}

/// A process's name, or why it cannot be traced.
pub fn comm_of(pid: u32) -> anyhow::Result<String> {
    match std::fs::read(format!("/proc/{pid}/comm")) {
        // Shown on the terminal: escaped (a name is the process's choice).
        Ok(c) => Ok(term::escape(String::from_utf8_lossy(&c).trim_end_matches('\n')).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("no process with pid {pid}"),
        Err(e) => Err(e).with_context(|| format!("reading /proc/{pid}")),
    }
}

/// A pidfd of `pid`, or why there is none.
pub fn pidfd(pid: u32) -> anyhow::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            bail!("no process with pid {pid}");
        }
        return Err(e).context("pidfd_open");
    }
    // SAFETY: the fd was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process of `pidfd` has exited (its maps may already be
/// empty while /proc/PID is still there).
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
}

/// The ring readers of a live view (events show within 20 ms), feeding a
/// queue of `capacity`; and the rings' drop counters.
pub fn start_readers(
    probes: &mut Probes,
    capacity: usize,
) -> anyhow::Result<(
    mpsc::Receiver<Event>,
    JoinSet<anyhow::Result<()>>,
    crate::probes::DropCounters,
)> {
    let stats = Arc::new(ReaderStats::default());
    let (tx, rx) = mpsc::channel::<Event>(capacity);
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();
    for (ring, opts) in collect::ring_options(Duration::from_millis(20)) {
        let r = probes.take_ring(ring)?;
        let (tx, stats) = (tx.clone(), stats.clone());
        tasks.spawn(async move { Ok(collect::read_ring(r, ring, tx, stats, opts).await?) });
    }
    Ok((rx, tasks, probes.take_drop_counters()?))
}

/// The files of `family` in `pid` at attach time; a process that went away
/// meanwhile is said as that.
pub fn first_libraries(
    family: &UprobeFamily,
    pid: u32,
    comm: &str,
    pidfd: &OwnedFd,
) -> anyhow::Result<Vec<crate::probes::uprobe::Library>> {
    let gone =
        || anyhow!("pid {pid} ({comm}) exited while tracer was attaching; nothing was traced");
    let libs = match libraries_of(family, pid) {
        Ok(l) => l,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            return Err(gone());
        }
        Err(e) => {
            return Err(e).with_context(|| format!("reading the memory maps of pid {pid}"));
        }
    };
    // Its maps can be empty before /proc/PID goes away.
    if libs.is_empty() && has_exited(pidfd) {
        return Err(gone());
    }
    Ok(libs)
}
