//! Collecting: ring buffer readers (one task per ring, each in an
//! `AsyncFd`), the /dev/kmsg reader, and the decoder they share. Readers
//! only read, decode and hand on; everything slow happens downstream.

pub mod decode;
pub mod journal;
pub mod killers;
pub mod kmsg;
pub mod logfile;

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
};

use decode::{Event, decode};
use kmsg::{Assembler, KmsgEvent};

/// Reader failures (each ends the recorder with this message).
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The ring buffer fd could not be polled.
    #[error("polling ring buffer {ring}")]
    Poll {
        /// Ring name.
        ring: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// /dev/kmsg failed.
    #[error(transparent)]
    Kmsg(#[from] kmsg::KmsgError),
    /// /dev/kmsg could not be polled.
    #[error("polling {}", kmsg::KMSG)]
    KmsgPoll {
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Registers an fd-owning value with the tokio reactor for reads.
pub fn async_fd<T: std::os::fd::AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: every T passed here (aya's RingBuf and EbpfLogger, std's File)
    // owns its descriptor and keeps it open, unchanged, until dropped, and
    // the AsyncFd owns the value for its whole life.
    Ok(unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }?)
}

/// Counters the readers keep.
#[derive(Debug, Default)]
pub struct ReaderStats {
    /// Events read from the critical ring.
    pub critical: AtomicU64,
    /// Events read from the data ring.
    pub data: AtomicU64,
    /// Events read from the OOM ring.
    pub oom: AtomicU64,
    /// Records that failed to decode.
    pub decode_errors: AtomicU64,
    /// kmsg records the kernel overwrote before we read them.
    pub kmsg_lost: AtomicU64,
}

/// How a ring is read.
#[derive(Clone, Default)]
pub struct ReadOptions {
    /// Also drain this often without a wakeup (the data ring submits
    /// without waking the reader).
    pub poll: Option<std::time::Duration>,
    /// Drain at once when this is notified.
    pub drain_now: Option<Arc<tokio::sync::Notify>>,
    /// Notify these after each batch read.
    pub after_batch: Vec<Arc<tokio::sync::Notify>>,
}

/// Moves up to `max` decoded events from the ring into `batch`; returns
/// whether the ring may hold more.
fn drain(
    rb: &mut RingBuf<MapData>,
    name: &str,
    batch: &mut Vec<Event>,
    stats: &ReaderStats,
) -> bool {
    const MAX: usize = 4096;
    while batch.len() < MAX {
        let Some(item) = rb.next() else { return false };
        match decode(&item) {
            Ok(ev) => batch.push(ev),
            Err(e) => {
                if stats.decode_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("ring {name}: {e} (further decode errors are only counted)");
                }
            }
        }
    }
    true
}

/// Reads one ring until the receiver goes away.
pub async fn read_ring(
    ring: RingBuf<MapData>,
    name: &'static str,
    tx: mpsc::Sender<Event>,
    stats: Arc<ReaderStats>,
    opts: ReadOptions,
) -> Result<(), CollectError> {
    let mut fd = async_fd(ring).map_err(|source| CollectError::Poll { ring: name, source })?;
    let counter = match name {
        tracer_common::maps::CRITICAL_RING => &stats.critical,
        tracer_common::maps::OOM_RING => &stats.oom,
        _ => &stats.data,
    };
    let mut batch = Vec::with_capacity(256);
    // Polling backs off while the ring stays empty (an idle node wakes the
    // reader about once a second) and returns to `poll` as soon as events flow.
    let base = opts.poll.unwrap_or(std::time::Duration::from_secs(3600));
    let idle_max = base.max(std::time::Duration::from_secs(1));
    let mut wait = base;
    let never = Arc::new(tokio::sync::Notify::new());
    let drain_now = opts.drain_now.clone().unwrap_or(never);
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let mut guard = guard.map_err(|source| CollectError::Poll { ring: name, source })?;
                // Bounded batches keep memory flat while the consumer catches up.
                if !drain(guard.get_inner_mut(), name, &mut batch, &stats) {
                    guard.clear_ready();
                }
            }
            _ = tokio::time::sleep(wait), if opts.poll.is_some() => {
                drain(fd.get_mut(), name, &mut batch, &stats);
                wait = if batch.is_empty() { (wait * 2).min(idle_max) } else { base };
            }
            _ = drain_now.notified() => {
                drain(fd.get_mut(), name, &mut batch, &stats);
            }
        }
        if batch.is_empty() {
            continue;
        }
        wait = base;
        counter.fetch_add(batch.len() as u64, Ordering::Relaxed);
        for ev in batch.drain(..) {
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
        for n in &opts.after_batch {
            n.notify_one();
        }
    }
}

/// Read options for the three rings, in the order the recorder serves
/// them: OOM kills, critical events, data. The OOM reader is woken by every
/// kill. The critical reader is woken by urgent events (signal kills, CUDA
/// failures) and polls every `poll` for the rest (process ends, submitted
/// without a wakeup). The data reader polls. Each drains as soon as a
/// reader before it has read something, so what led up to a kill follows
/// it closely.
pub fn ring_options(poll: std::time::Duration) -> [(&'static str, ReadOptions); 3] {
    let critical = Arc::new(tokio::sync::Notify::new());
    let data = Arc::new(tokio::sync::Notify::new());
    [
        (
            tracer_common::maps::OOM_RING,
            ReadOptions {
                after_batch: vec![critical.clone(), data.clone()],
                ..Default::default()
            },
        ),
        (
            tracer_common::maps::CRITICAL_RING,
            ReadOptions {
                poll: Some(poll),
                drain_now: Some(critical),
                after_batch: vec![data.clone()],
            },
        ),
        (
            tracer_common::maps::DATA_RING,
            ReadOptions {
                poll: Some(poll),
                drain_now: Some(data),
                after_batch: Vec::new(),
            },
        ),
    ]
}

/// Reads /dev/kmsg (from the oldest record the kernel still holds) and
/// hands on OOM reports as they complete.
pub async fn read_kmsg(
    tx: mpsc::Sender<KmsgEvent>,
    stats: Arc<ReaderStats>,
) -> Result<(), CollectError> {
    let file = kmsg::open()?;
    let mut fd = async_fd(file).map_err(|source| CollectError::KmsgPoll { source })?;
    let mut asm = Assembler::default();
    let mut buf = vec![0u8; 8192];
    loop {
        let mut guard = fd
            .readable_mut()
            .await
            .map_err(|source| CollectError::KmsgPoll { source })?;
        let mut out = Vec::new();
        let mut lost = 0;
        while let Some(rec) = kmsg::read_record(guard.get_inner_mut(), &mut buf, &mut lost)? {
            out.extend(asm.push(&rec));
        }
        guard.clear_ready();
        drop(guard);
        if lost > 0 {
            stats.kmsg_lost.fetch_add(lost, Ordering::Relaxed);
            tracing::warn!("{lost} kernel log records were overwritten before tracer read them");
        }
        for ev in out {
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
    }
}
