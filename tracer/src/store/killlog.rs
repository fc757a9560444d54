//! The kill log: the durable path of a kill, beside the store.
//!
//! A kill is appended here as one JSON line and made durable with one
//! `fdatasync` of this small file, the disk's own floor for a durable
//! write. The store then takes the same kill in a commit that is not
//! synced (SQLite's `synchronous=NORMAL`): a SQLite commit that syncs
//! writes several WAL pages (the row's leaf, index pages, page 1), which
//! took two to seven times the floor. Within a second a thread of the log
//! syncs the store's WAL file and empties the log; a store opened with a
//! log left behind (a stop before that, a power loss, a crash of the
//! machine) first takes from it the kills its WAL lost.
//!
//! The file is written once with zeros (1 MiB, synced) and then written
//! over, a page per append: a sync that changes no size and allocates no
//! block has no file-system journal commit to wait for (on ext4 it would
//! otherwise queue behind the commit of the WAL's own sync). A log is
//! emptied by a page of zeros at its start and a new generation: each
//! line names its generation, and a reader takes the lines from the start
//! while they are of the first line's, so what an earlier generation left
//! further on is never read again.
//!
//! Written by hand: the format is one line per kill, read back by the
//! same serde types as the store's rows; no crate adds anything here.

use std::{
    fs::File,
    io::{self, Read as _, Seek as _, SeekFrom},
    os::unix::fs::{FileExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
};

use serde::{Deserialize, Serialize};

use crate::record::KillRecord;
use crate::util::fsafe;

/// A log left behind is read up to this size; a bigger one is damaged or
/// not ours (a log holds the kills of about a second).
const MAX_READ: u64 = 64 << 20;

/// The page size the log's appends are aligned to.
const PAGE: u64 = 4096;

/// The log is written with zeros up to this size when opened.
const PREALLOC: u64 = 1 << 20;

/// A log this long (kills in a storm that never left its thread a quiet
/// moment) is emptied by the store's next commit of kills, synced.
const LONG: u64 = 4 << 20;

/// One line of the log.
#[derive(Serialize, Deserialize)]
pub(super) struct Logged {
    /// The log's generation when it was written.
    pub generation: u64,
    /// When it was written here (its `committed_ns` when it is stored
    /// from here).
    pub logged_ns: i64,
    /// The kill as stored.
    pub record: KillRecord,
}

/// What a log left behind held.
#[derive(Default)]
pub(super) struct LeftBehind {
    /// Its kills, in order.
    pub kills: Vec<Logged>,
    /// Lines that could not be read (a torn last write).
    pub damaged: usize,
}

/// The open kill log of a store, and the thread that empties it.
pub(super) struct KillLog {
    shared: Arc<Mutex<Inner>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    file: File,
    path: PathBuf,
    /// Where the next append goes (a page boundary).
    at: u64,
    /// This generation's lines are the log's.
    generation: u64,
    /// Kills appended, ever.
    appended: u64,
    /// `appended` when the store's unsynced commit of them returned.
    stored: u64,
    /// `appended` when the log was last emptied.
    emptied: u64,
}

impl Inner {
    /// A page of zeros at the start and a new generation (not synced: a
    /// crash before the page reaches the disk leaves kills the store has,
    /// which the next start finds there).
    fn clear(&mut self) -> io::Result<()> {
        self.file.write_all_at(&[0; PAGE as usize], 0)?;
        self.at = 0;
        self.generation += 1;
        self.emptied = self.appended;
        Ok(())
    }
}

/// Writes zeros from the end of `file` up to [`PREALLOC`] and syncs it,
/// so that appends write over blocks that exist. Best effort: a full disk
/// leaves the file as it is (appends then grow it).
fn preallocate(file: &File, path: &Path) {
    let grown = file.metadata().and_then(|m| {
        let len = m.len();
        if len >= PREALLOC {
            return Ok(());
        }
        let zeros = vec![0u8; (PREALLOC - len) as usize];
        file.write_all_at(&zeros, len)?;
        file.sync_all()
    });
    if let Err(e) = grown {
        tracing::debug!("writing zeros in {}: {e}", path.display());
    }
}

impl KillLog {
    /// The log of the store at `store`.
    pub fn path_for(store: &Path) -> PathBuf {
        super::beside(store, ".kills")
    }

    /// Opens (creating if needed, mode 0600, never through a link) the log
    /// of the store at `store`, and reads what an earlier writer left in
    /// it. The caller holds the store's lock. Once what was left is stored
    /// ([`KillLog::clear`]), a thread syncs the store's WAL each second
    /// after kills and empties the log.
    pub fn open(store: &Path) -> Result<(Self, LeftBehind), fsafe::UnsafePath> {
        let path = Self::path_for(store);
        let mut file = fsafe::open_private(&path)?;
        let io = |source| fsafe::UnsafePath::Io {
            path: path.clone(),
            source,
        };
        let (left, at) = read(&mut file).map_err(io)?;
        preallocate(&file, &path);
        let n = (left.kills.len() + left.damaged) as u64;
        // Lines left are followed by more of theirs; an empty log starts
        // a new generation, whatever earlier ones left further on.
        let generation = match left.kills.first() {
            Some(k) => k.generation,
            None => crate::util::time::wall_now_ns().max(0) as u64,
        };
        let shared = Arc::new(Mutex::new(Inner {
            file,
            path: path.clone(),
            at,
            generation,
            appended: n,
            // Not settled by the thread before the store has taken them.
            stored: 0,
            emptied: 0,
        }));
        let (stop, rx) = mpsc::channel();
        let wal = super::side_files(store)[0].clone();
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("tracer-killlog".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(SETTLE_EVERY) {
                    settle(&s, &wal);
                }
            })
            .map_err(io)?;
        Ok((
            Self {
                shared,
                stop: Some(stop),
                thread: Some(thread),
            },
            left,
        ))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the log holds kills (for tests).
    #[cfg(test)]
    pub fn pending(&self) -> bool {
        let i = self.inner();
        i.appended != i.emptied
    }

    /// Appends `kills` (written at `logged_ns`) in one write and makes
    /// them durable with one `fdatasync`.
    pub fn append(&mut self, kills: &[KillRecord], logged_ns: i64) -> io::Result<()> {
        let mut i = self.inner();
        let mut buf = Vec::with_capacity(4096 * kills.len());
        for record in kills {
            #[derive(Serialize)]
            struct Borrowed<'a> {
                generation: u64,
                logged_ns: i64,
                record: &'a KillRecord,
            }
            let line = Borrowed {
                generation: i.generation,
                logged_ns,
                record,
            };
            serde_json::to_writer(&mut buf, &line).map_err(io::Error::other)?;
            buf.push(b'\n');
        }
        let at = i.at;
        // Newlines up to the next page: every append starts a page of its
        // own, so its sync writes the pages a record needs, never one
        // that an earlier sync already wrote (a record is about 3.5 KiB).
        let end = at + buf.len() as u64;
        buf.resize(
            buf.len() + (end.next_multiple_of(PAGE) - end) as usize,
            b'\n',
        );
        let written = i
            .file
            .write_all_at(&buf, at)
            .and_then(|()| i.file.sync_data());
        if let Err(e) = written {
            // A part written (the disk filled) is ended by zeros where
            // there is room: the caller stores these kills another way.
            if let Err(e2) = i.file.write_all_at(&[0; PAGE as usize], at) {
                tracing::debug!("ending {} at {at}: {e2}", i.path.display());
            }
            return Err(e);
        }
        i.at = at + buf.len() as u64;
        i.appended += kills.len() as u64;
        Ok(())
    }

    /// Whether the log has grown past [`LONG`]: the store's next commit
    /// of kills is synced and empties it.
    pub fn is_long(&self) -> bool {
        self.inner().at > LONG
    }

    /// Bytes of the log in use (for tests).
    #[cfg(test)]
    pub fn written(&self) -> u64 {
        self.inner().at
    }

    /// The store's (unsynced) commit of every kill appended so far
    /// returned: a sync of its WAL now makes them durable there.
    pub fn stored(&mut self) {
        let mut i = self.inner();
        i.stored = i.appended;
    }

    /// Empties the log: the caller's synced commit holds its kills.
    pub fn clear(&mut self) -> io::Result<()> {
        let mut i = self.inner();
        i.stored = i.appended;
        i.clear()
    }
}

impl Drop for KillLog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the log's thread looks for kills to settle.
const SETTLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Makes the store's commits of the logged kills durable by syncing its
/// WAL file (the same `fdatasync` a synced SQLite commit ends with, off
/// the recorder's thread), then empties the log, unless a kill came
/// meanwhile or a commit of logged kills has not returned (they stay
/// logged, and the next second tries again).
fn settle(shared: &Mutex<Inner>, wal: &Path) {
    let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
    let seen = {
        let i = lock();
        if i.appended == i.emptied || i.stored != i.appended {
            return;
        }
        i.appended
    };
    let synced = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(wal)
        .and_then(|f| f.sync_data());
    if let Err(e) = synced {
        tracing::debug!("syncing {}: {e}", wal.display());
        return;
    }
    let mut i = lock();
    if i.appended == seen
        && let Err(e) = i.clear()
    {
        tracing::debug!("emptying {}: {e}", i.path.display());
    }
}

/// The kills a log holds now (for tests).
#[cfg(test)]
pub(super) fn left_in(store: &Path) -> usize {
    let mut f = File::open(KillLog::path_for(store)).unwrap();
    read(&mut f).unwrap().0.kills.len()
}

/// Reads a log from its start: one JSON line per kill, while they are of
/// the first line's generation, up to zeros. A line that does not read (a
/// write torn by a crash) is counted. Returns them, and the page after
/// them, where the next append goes.
fn read(file: &mut File) -> io::Result<(LeftBehind, u64)> {
    let len = file.metadata()?.len();
    let mut out = LeftBehind::default();
    if len > MAX_READ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, more than a kill log ever holds ({MAX_READ})"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(0))?;
    file.take(MAX_READ).read_to_end(&mut bytes)?;
    let mut generation = None;
    let mut end = 0;
    let mut at = 0;
    for line in bytes.split(|&b| b == b'\n') {
        let here = at;
        at += line.len() + 1;
        if line.is_empty() {
            continue;
        }
        if line[0] == 0 {
            break;
        }
        match serde_json::from_slice::<Logged>(line) {
            Ok(k) if *generation.get_or_insert(k.generation) != k.generation => break,
            Ok(k) => out.kills.push(k),
            Err(_) => out.damaged += 1,
        }
        end = here + line.len() + 1;
    }
    Ok((out, (end as u64).next_multiple_of(PAGE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Victim;

    fn kill(pid: u32) -> KillRecord {
        KillRecord {
            ts_ns: 1_000 + pid as i64,
            victim: Victim {
                pid,
                comm: "python3\nx".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn appended_kills_are_read_back_by_the_next_writer_and_a_torn_tail_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("t.db");
        let path = KillLog::path_for(&store);
        let (mut log, left) = KillLog::open(&store).unwrap();
        assert!(left.kills.is_empty() && !log.pending());
        log.append(&[kill(7), kill(8)], 42).unwrap();
        log.append(&[kill(9)], 43).unwrap();
        assert!(log.pending());
        assert_eq!(
            log.inner().at,
            2 * PAGE,
            "each append takes a page of its own"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            PREALLOC,
            "written over"
        );
        drop(log);
        // A crash in the middle of a write.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"{\"generation\":3,\"rec", 2 * PAGE)
            .unwrap();
        drop(f);
        let (mut log, left) = KillLog::open(&store).unwrap();
        let pids: Vec<(u32, i64)> = left
            .kills
            .iter()
            .map(|k| (k.record.victim.pid, k.logged_ns))
            .collect();
        assert_eq!(pids, [(7, 42), (8, 42), (9, 43)]);
        assert_eq!(left.kills[0].record.victim.comm, "python3\nx");
        assert_eq!(left.damaged, 1);
        assert!(log.pending());
        // Not emptied by the thread before the store took what was left.
        std::fs::write(dir.path().join("t.db-wal"), b"").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(log.pending());
        // Emptied: a new generation over the first page; what the earlier
        // one left further on is not read again.
        log.clear().unwrap();
        log.append(&[kill(10)], 45).unwrap();
        drop(log);
        let (_, left) = KillLog::open(&store).unwrap();
        assert_eq!(left.kills.len(), 1);
        assert_eq!(left.kills[0].record.victim.pid, 10);
        assert_eq!(left.damaged, 0);
    }

    #[test]
    fn the_thread_empties_the_log_only_once_the_store_returned_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("t.db");
        std::fs::write(dir.path().join("t.db-wal"), b"").unwrap();
        let (mut log, _) = KillLog::open(&store).unwrap();
        log.append(&[kill(7)], 1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(log.pending(), "its commit has not returned");
        log.stored();
        let t0 = std::time::Instant::now();
        while log.pending() && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!log.pending());
        assert_eq!(left_in(&store), 0);
    }

    #[test]
    fn a_log_planted_as_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("t.db");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, KillLog::path_for(&store)).unwrap();
        assert!(KillLog::open(&store).is_err());
    }
}
