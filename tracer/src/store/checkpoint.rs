//! The checkpoint thread: the WAL copied back into the database off the
//! recorder's thread.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::{StoreError, WAL_KEEP_BYTES, classify, sql, wal_len};

/// Copies the WAL back into the database from a thread of its own, so the
/// recorder's commits never wait for a checkpoint's writes and fsyncs.
pub struct Checkpointer {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Checkpoints `path` every `every` (PASSIVE: never blocks the writer)
    /// and once more, fully, when dropped. A WAL that grew past
    /// [`WAL_KEEP_BYTES`] (a burst of commits outran the passive copies) is
    /// cut back with a TRUNCATE checkpoint, which waits for the writer only
    /// for the few frames the passive one left.
    pub fn spawn(path: &Path, every: std::time::Duration) -> Result<Self, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| classify(path, e, "open checkpointer"))?;
        let wal_path = path.to_path_buf();
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql("checkpointer"))?;
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tracer-checkpoint".into())
            .spawn(move || {
                let checkpoint = |mode: &str| {
                    let r =
                        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()));
                    match r {
                        Ok(()) => {}
                        // The recorder says so once; here it would be every second.
                        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) => {
                            tracing::debug!("store checkpoint: {e}")
                        }
                        Err(e) => tracing::warn!("store checkpoint: {e}"),
                    }
                };
                // The WAL's size is looked at every second (a stat); the
                // copy, which fsyncs the database, runs every `every`, or
                // at once when a burst has grown the WAL.
                let mut last = std::time::Instant::now();
                let second = std::time::Duration::from_secs(1).min(every);
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(second)
                {
                    let big = wal_len(&wal_path) > WAL_KEEP_BYTES;
                    if big || last.elapsed() >= every {
                        checkpoint("PASSIVE");
                        last = std::time::Instant::now();
                    }
                    if big {
                        checkpoint("TRUNCATE");
                    }
                }
                checkpoint("TRUNCATE");
            })
            .map_err(|source| StoreError::Thread { source })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
