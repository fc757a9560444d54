//! The flight recorder: SQLite (WAL), schema versioned with migrations,
//! bounded by age and size. A kill is committed as soon as it is seen.

mod events;
mod gpu;
pub use gpu::ProcessPoint;
mod bounds;
mod checkpoint;
mod killlog;
mod kills;
mod schema;
mod sessions;
pub mod spill;
pub mod tables;

pub use bounds::{RESERVE_BYTES, SIZE_CHECK_SHARE, WAL_KEEP_BYTES};
pub use checkpoint::Checkpointer;

pub use crate::record::{DeviceRow, ProcRow};
pub use events::{DropRow, EventRow};
pub use kills::KillsRead;
pub use sessions::Session;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::util::fsafe;

/// Default location of the store.
pub const DEFAULT_PATH: &str = "/var/lib/tracer/tracer.db";

/// Current schema version (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 3;

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No store at the path.
    #[error(
        "no store at {path}: nothing has been recorded there; start `tracer record` (or pass --store)"
    )]
    NotFound {
        /// The path.
        path: PathBuf,
    },
    /// The store is there, but this user may not read it.
    #[error(
        "cannot read store {path}: permission denied (it is the recorder's, usually root's: run this as root, with sudo, or as a user its file and directory let read)"
    )]
    NotReadable {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The directory or file cannot be written.
    #[error("store {path} is not writable; pick another path with --store")]
    NotWritable {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a SQLite database, or is damaged.
    #[error(
        "store {path} is corrupt or not a tracer store ({detail}); it was left untouched: \
         move it away to start a new one, or open it with sqlite3 to recover it"
    )]
    Corrupt {
        /// The path.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// Written by a newer tracer.
    #[error(
        "store {path} has schema version {found}, newer than this tracer ({SCHEMA_VERSION}); upgrade tracer"
    )]
    TooNew {
        /// The path.
        path: PathBuf,
        /// Its version.
        found: i64,
    },
    /// A statement failed.
    #[error("store {op}")]
    Sql {
        /// What was being done.
        op: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The checkpoint thread could not start.
    #[error("starting the store's checkpoint thread")]
    Thread {
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path, or a file beside it, is not safe for a privileged writer.
    #[error("store {path} refused")]
    Unsafe {
        /// The store.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: crate::util::fsafe::UnsafePath,
    },
    /// Another recorder writes to this store.
    #[error(
        "store {path} is in use by another recorder ({holder}); stop it first, or pass another --store"
    )]
    Locked {
        /// The store.
        path: PathBuf,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// A stored record could not be read back.
    #[error("store record {id} is unreadable")]
    Record {
        /// Row id.
        id: i64,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    /// Whether the store's file system is full (SQLITE_FULL).
    pub fn is_disk_full(&self) -> bool {
        let code = match self {
            StoreError::Sql { source, .. } => source.sqlite_error_code(),
            _ => None,
        };
        code == Some(rusqlite::ErrorCode::DiskFull)
    }
}

fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { op, source }
}

/// The store.
pub struct Store {
    conn: Connection,
    /// The durable path of kills (see [`killlog`]): a recording store's
    /// (its thread stops before the lock is let go).
    kill_log: Option<killlog::KillLog>,
    path: PathBuf,
    /// The writer's lock, held as long as the store is open for writing
    /// (after `conn` in drop order).
    _lock: Option<StoreLock>,
    /// Whether this is a spill store (see [`spill`]): no reserve beside it.
    spill: bool,
}

fn classify(path: &Path, e: rusqlite::Error, op: &'static str) -> StoreError {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    match e.sqlite_error_code() {
        Some(NotADatabase | DatabaseCorrupt) => StoreError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
        },
        Some(
            rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::PermissionDenied,
        ) => StoreError::NotWritable {
            path: path.into(),
            source: std::io::Error::other(e.to_string()),
        },
        _ => StoreError::Sql { op, source: e },
    }
}

fn store_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Whether the file system of `dir` has twice [`RESERVE_BYTES`] free.
fn has_room(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statvfs is a valid value for statvfs to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string; st is a valid struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64) >= 2 * RESERVE_BYTES
}

/// Whether the file system of the store at `path` has room to write to it
/// again (twice [`RESERVE_BYTES`] free).
pub fn has_room_for(path: &Path) -> bool {
    has_room(store_dir(path))
}

/// A path a privileged writer must not use.
fn refuse(path: &Path, source: fsafe::UnsafePath) -> StoreError {
    match source {
        fsafe::UnsafePath::Io { source, .. } => StoreError::NotWritable {
            path: path.into(),
            source,
        },
        source => StoreError::Unsafe {
            path: path.into(),
            source,
        },
    }
}

/// The file named like the store with `suffix` appended (`-wal`, `.lock`).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The files SQLite keeps beside the store.
fn side_files(path: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", "-journal"].map(|s| beside(path, s))
}

/// Bytes in the store's WAL file (0 when there is none).
pub fn wal_len(path: &Path) -> u64 {
    std::fs::symlink_metadata(&side_files(path)[0])
        .map(|m| m.len())
        .unwrap_or(0)
}

/// `path` as the path part of a SQLite `file:` URI.
fn uri_path(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.into());
    let mut out = String::new();
    for b in abs.as_os_str().as_encoded_bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                out.push(*b as char)
            }
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Checks an existing file before anything is written to it: a SQLite
/// database (header), not damaged, and either empty of tables or a tracer
/// store of a schema this tracer knows. Read-only: another application's
/// file is left exactly as it was.
fn validate(path: &Path) -> Result<(), StoreError> {
    use std::io::Read as _;
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.into(),
        detail,
    };
    let mut header = [0u8; 100];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut header))
        .map_err(|source| StoreError::NotWritable {
            path: path.into(),
            source,
        })?;
    if n < 100 || &header[..16] != b"SQLite format 3\0" {
        return Err(corrupt("not a SQLite database".into()));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )
    .map_err(|e| classify(path, e, "open"))?;
    let check: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(|e| classify(path, e, "check"))?;
    if check != "ok" {
        return Err(corrupt(check));
    }
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| classify(path, e, "version"))?;
    if v > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.into(),
            found: v,
        });
    }
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| classify(path, e, "check"))?;
    let ours = ["sessions", "events", "kills", "drops"]
        .iter()
        .all(|t| tables.iter().any(|n| n == t));
    match v {
        0 if tables.is_empty() => Ok(()),
        0 => Err(corrupt("a SQLite file with other tables".into())),
        v if v < 0 => Err(corrupt(format!("user_version {v} is not a tracer schema"))),
        _ if !ours => Err(corrupt(format!(
            "user_version {v} but not a tracer store's tables"
        ))),
        _ => Ok(()),
    }
}

/// The single-writer lock of a store: `flock` on `STORE.lock`, which
/// names the holder's pid. Released when the holder exits, however it ends.
pub struct StoreLock {
    _file: std::fs::File,
}

impl StoreLock {
    /// Takes the lock of the store at `path`, or says who holds it.
    pub fn take(path: &Path) -> Result<Self, StoreError> {
        use std::io::{Read as _, Seek as _, Write as _};
        use std::os::fd::AsRawFd as _;
        let mut f =
            fsafe::open_private(&beside(path, ".lock")).map_err(|source| StoreError::Unsafe {
                path: path.into(),
                source,
            })?;
        // SAFETY: flock on an fd this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = f.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "a process that has not written its pid yet".to_string(),
                h => crate::util::term::escape(h).into_owned(),
            };
            return Err(StoreError::Locked {
                path: path.into(),
                holder,
            });
        }
        let me = format!("pid {}", std::process::id());
        let written = f
            .set_len(0)
            .and_then(|()| f.rewind())
            .and_then(|()| f.write_all(me.as_bytes()));
        if let Err(e) = written {
            tracing::debug!("writing the store lock's holder: {e}");
        }
        Ok(Self { _file: f })
    }
}

impl Store {
    /// Opens (creating if needed) the store for recording, as the one
    /// writer. Nothing is written before the file has been checked: no link
    /// is followed, no file of another user or another application (or of a
    /// newer tracer) is changed, and a second recorder is told who holds it.
    pub fn open_rw(path: &Path) -> Result<Self, StoreError> {
        let lock = Self::lock_rw(path)?;
        let mut s = Self::open_rw_held(path, true)?;
        s._lock = Some(lock);
        Ok(s)
    }

    /// Makes the store's directory (private) and takes the store's lock.
    pub fn lock_rw(path: &Path) -> Result<StoreLock, StoreError> {
        fsafe::private_dir(store_dir(path)).map_err(|e| refuse(path, e))?;
        StoreLock::take(path)
    }

    /// Same as [`Store::open_rw`], for a caller that holds the store's lock
    /// ([`Store::lock_rw`]); `reserve`: whether to set [`RESERVE_BYTES`]
    /// aside beside it (not for a spill store, which lives in memory).
    pub(crate) fn open_rw_held(path: &Path, reserve: bool) -> Result<Self, StoreError> {
        let refuse = |e| refuse(path, e);
        let dir = store_dir(path);
        fsafe::private_dir(dir).map_err(refuse)?;
        // Restarted on a full file system: the reserve a recorder set aside
        // is what lets SQLite open (its -shm) and write the session.
        if !has_room(dir) && std::fs::remove_file(beside(path, ".reserve")).is_ok() {
            tracing::warn!(
                "the store's file system is full: its reserve was given back to open the store"
            );
        }
        for side in side_files(path) {
            fsafe::narrow_existing(&side).map_err(refuse)?;
        }
        let existed = fsafe::check_file(path).map_err(refuse)?;
        if existed && std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) > 0 {
            validate(path)?;
        }
        drop(fsafe::open_private(path).map_err(refuse)?);
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| classify(path, e, "open"))?;
        let mut store = Self {
            conn,
            path: path.into(),
            _lock: None,
            spill: !reserve,
            kill_log: None,
        };
        store.configure(true)?;
        store.migrate()?;
        if reserve {
            store.ensure_reserve();
            store.open_kill_log()?;
        }
        Ok(store)
    }

    /// Opens an existing store for reading. Writes nothing; a store on a
    /// read-only mount, or whose -shm file this user cannot write, is read
    /// as it is on disk.
    pub fn open_ro(path: &Path) -> Result<Self, StoreError> {
        // A store this user may not reach or read is said to be so, not
        // taken for no store (which `exists()` would say).
        if let Err(e) = std::fs::File::open(path) {
            return Err(match e.kind() {
                std::io::ErrorKind::NotFound => StoreError::NotFound { path: path.into() },
                std::io::ErrorKind::PermissionDenied => StoreError::NotReadable {
                    path: path.into(),
                    source: e,
                },
                _ => StoreError::Sql {
                    op: "open",
                    source: rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                        Some(e.to_string()),
                    ),
                },
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let open = |immutable: bool| -> Result<Self, StoreError> {
            let conn = if immutable {
                let uri = format!("file:{}?immutable=1", uri_path(path));
                Connection::open_with_flags(uri, flags)
            } else {
                Connection::open_with_flags(path, flags)
            }
            .map_err(|e| classify(path, e, "open"))?;
            let store = Self {
                conn,
                path: path.into(),
                _lock: None,
                spill: false,
                kill_log: None,
            };
            store.configure(false)?;
            Ok(store)
        };
        let store = match open(false) {
            Ok(s) => s,
            // No -shm can be made here (a read-only mount, a directory this
            // user cannot write): without a WAL to merge, the file is whole.
            Err(StoreError::NotWritable { .. } | StoreError::Sql { .. }) if wal_len(path) == 0 => {
                open(true)?
            }
            Err(e) => return Err(e),
        };
        let v = store.version()?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: path.into(),
                found: v,
            });
        }
        if v < 1 {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: "no tracer schema".into(),
            });
        }
        Ok(store)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn configure(&self, rw: bool) -> Result<(), StoreError> {
        let p = &self.path;
        self.conn
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| classify(p, e, "busy_timeout"))?;
        if !rw {
            // The first real read: a file that is not a database fails here.
            // (A writer's existing file was checked read-only by `validate`
            // before it was opened for writing; reading it all twice at
            // start would double the cost on a large store.)
            let check: String = self
                .conn
                .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                .map_err(|e| classify(p, e, "check"))?;
            if check != "ok" {
                return Err(StoreError::Corrupt {
                    path: p.clone(),
                    detail: check,
                });
            }
        } else {
            // auto_vacuum only takes effect on a new, empty database; an
            // existing store is not written to for it (a restart on a full
            // disk must get through here).
            if self.version()? == 0 {
                self.conn
                    .pragma_update(None, "auto_vacuum", "INCREMENTAL")
                    .map_err(|e| classify(p, e, "auto_vacuum"))?;
            }
            let mode: String = self
                .conn
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .map_err(|e| classify(p, e, "journal_mode"))?;
            let mode = if mode.eq_ignore_ascii_case("wal") {
                mode
            } else {
                self.conn
                    .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
                    .map_err(|e| classify(p, e, "journal_mode"))?
            };
            if !mode.eq_ignore_ascii_case("wal") {
                tracing::warn!("store {} is in {mode} mode, not WAL", p.display());
            }
            // A WAL that a burst grew is cut back to this once checkpointed.
            self.conn
                .pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES as i64)
                .map_err(|e| classify(p, e, "journal_size_limit"))?;
            // Checkpoints run on their own connection and thread (see
            // `Checkpointer`), never inside a kill's commit.
            self.conn
                .pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(|e| classify(p, e, "wal_autocheckpoint"))?;
            // NORMAL: commits survive a crash of the recorder; kills are
            // committed with FULL (see insert_kill) to survive power loss too.
            self.conn
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(|e| classify(p, e, "synchronous"))?;
        }
        Ok(())
    }

    /// Runs `write` with `synchronous=FULL` (its commit is fsynced, and
    /// every earlier one with it), and puts NORMAL back whatever happened.
    fn durably<T>(
        &mut self,
        write: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.conn
            .pragma_update(None, "synchronous", "FULL")
            .map_err(sql("synchronous"))?;
        let r = write(&mut self.conn);
        let restored = self
            .conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql("synchronous"));
        let v = r?;
        restored?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::KillRecord;
    use crate::record::Victim;

    fn kill(pid: u32, ts_ns: i64) -> KillRecord {
        KillRecord {
            ts_ns,
            source: crate::record::Seen::TRACEPOINT,
            victim: Victim {
                pid,
                comm: "python3".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn event(ts_ns: i64) -> EventRow {
        EventRow {
            ts_ns,
            kind: "exec".into(),
            pid: 1,
            tid: 1,
            comm: "sh".into(),
            data: serde_json::json!({"pid": 1}),
        }
    }

    #[test]
    fn round_trips_kills_events_sessions_and_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/t.db");
        let mut s = Store::open_rw(&path).unwrap();
        let sid = s.start_session(100, "h", "6.18", "[]").unwrap();
        let before = crate::util::time::wall_now_ns();
        let id = s
            .insert_kill(&kill(42, 1_000), &[event(900)], 1_005)
            .unwrap();
        assert_eq!(s.find_kill(42, 1_500, 1_000).unwrap(), Some(id));
        assert_eq!(s.find_kill(42, 5_000, 1_000).unwrap(), None);
        let mut k = kill(42, 1_000);
        k.victim.comm = "renamed".into();
        s.update_kill(id, &k).unwrap();
        s.insert_drops(
            sid,
            &DropRow {
                ring: "data".into(),
                count: 3,
                from_ns: 800,
                to_ns: 1_200,
            },
        )
        .unwrap();
        s.end_session(sid, 2_000).unwrap();
        drop(s);

        let r = Store::open_ro(&path).unwrap();
        let kills = r.kills(0, None, 10).unwrap();
        assert_eq!(kills.len(), 1);
        assert_eq!(kills[0].1.victim.comm, "renamed");
        assert_eq!(r.kills(0, Some(7), 10).unwrap().len(), 0);
        // Durable in the kill log: stamped when its sync returned.
        assert!(r.committed_ns(id).unwrap().unwrap() >= before);
        assert_eq!(
            r.events(0, Some("exec"), None, 10).unwrap(),
            vec![event(900)]
        );
        assert_eq!(r.drops_between(1_000, 1_100).unwrap().len(), 1);
        assert_eq!(r.sessions().unwrap()[0].ended_ns, Some(2_000));
    }

    #[test]
    fn missing_corrupt_and_foreign_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.db");
        assert!(matches!(
            Store::open_ro(&missing),
            Err(StoreError::NotFound { .. })
        ));

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
        let err = Store::open_rw(&garbage).err().expect("garbage refused");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(matches!(
            Store::open_ro(&garbage),
            Err(StoreError::Corrupt { .. })
        ));
        assert_eq!(
            std::fs::read(&garbage).unwrap(),
            vec![0x5a; 8192],
            "left untouched"
        );

        let foreign = dir.path().join("foreign.db");
        Connection::open(&foreign)
            .unwrap()
            .execute_batch("CREATE TABLE t(x);")
            .unwrap();
        assert!(matches!(
            Store::open_rw(&foreign),
            Err(StoreError::Corrupt { .. })
        ));

        let newer = dir.path().join("newer.db");
        drop(Store::open_rw(&newer).unwrap());
        Connection::open(&newer)
            .unwrap()
            .execute_batch("PRAGMA user_version = 99;")
            .unwrap();
        assert!(matches!(
            Store::open_rw(&newer),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn foreign_newer_and_odd_files_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        // Another application's database in rollback-journal mode.
        let foreign = dir.path().join("app.db");
        Connection::open(&foreign)
            .unwrap()
            .execute_batch(
                "PRAGMA journal_mode=DELETE; CREATE TABLE t(x); INSERT INTO t VALUES (1);",
            )
            .unwrap();
        let before = std::fs::read(&foreign).unwrap();
        assert!(matches!(
            Store::open_rw(&foreign),
            Err(StoreError::Corrupt { .. })
        ));
        assert_eq!(
            std::fs::read(&foreign).unwrap(),
            before,
            "not switched to WAL"
        );
        // A SQLite file that claims a user_version but has none of our tables.
        let claims = dir.path().join("claims.db");
        Connection::open(&claims)
            .unwrap()
            .execute_batch(
                "PRAGMA journal_mode=DELETE; CREATE TABLE t(x); PRAGMA user_version = 2;",
            )
            .unwrap();
        let before = std::fs::read(&claims).unwrap();
        assert!(matches!(
            Store::open_rw(&claims),
            Err(StoreError::Corrupt { .. })
        ));
        assert_eq!(std::fs::read(&claims).unwrap(), before);
        // user_version -1.
        let negative = dir.path().join("neg.db");
        Connection::open(&negative)
            .unwrap()
            .execute_batch("PRAGMA journal_mode=DELETE; PRAGMA user_version = -1;")
            .unwrap();
        let before = std::fs::read(&negative).unwrap();
        assert!(Store::open_rw(&negative).is_err());
        assert_eq!(std::fs::read(&negative).unwrap(), before);
        // A newer tracer's store: refused before anything is written.
        let newer = dir.path().join("newer.db");
        drop(Store::open_rw(&newer).unwrap());
        Connection::open(&newer)
            .unwrap()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA user_version = 99; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        let before = std::fs::read(&newer).unwrap();
        assert!(matches!(
            Store::open_rw(&newer),
            Err(StoreError::TooNew { found: 99, .. })
        ));
        assert_eq!(std::fs::read(&newer).unwrap(), before);
    }

    #[test]
    fn store_files_are_private_and_links_refused() {
        use std::os::unix::fs::{MetadataExt as _, symlink};
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("var");
        let path = sub.join("t.db");
        let mut s = Store::open_rw(&path).unwrap();
        s.insert_kill(&kill(1, 1), &[], 1).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(&path), 0o600);
        for side in side_files(&path).iter().filter(|p| p.exists()) {
            assert_eq!(mode(side), 0o600, "{}", side.display());
        }
        drop(s);
        // A link where the store belongs: refused, its target untouched.
        let target = dir.path().join("precious");
        std::fs::write(&target, b"").unwrap();
        let link = sub.join("link.db");
        symlink(&target, &link).unwrap();
        let err = Store::open_rw(&link).err().expect("link refused");
        assert!(matches!(err, StoreError::Unsafe { .. }), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"");
        // A link planted where the WAL will be.
        let wal_target = dir.path().join("wal-target");
        let p2 = sub.join("t2.db");
        symlink(&wal_target, side_files(&p2)[0].clone()).unwrap();
        assert!(matches!(
            Store::open_rw(&p2),
            Err(StoreError::Unsafe { .. })
        ));
        assert!(!wal_target.exists());
    }

    #[test]
    fn a_second_writer_is_told_who_holds_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let first = Store::open_rw(&path).unwrap();
        let err = Store::open_rw(&path).err().expect("second writer refused");
        match &err {
            StoreError::Locked { holder, .. } => {
                assert_eq!(holder, &format!("pid {}", std::process::id()))
            }
            e => panic!("{e}"),
        }
        // Readers are not writers.
        drop(Store::open_ro(&path).unwrap());
        drop(first);
        drop(Store::open_rw(&path).unwrap());
    }

    #[test]
    fn one_damaged_record_does_not_hide_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut s = Store::open_rw(&path).unwrap();
        let ids: Vec<i64> = (0..3)
            .map(|i| {
                s.insert_kill(&kill(10 + i, 100 + i as i64), &[], 200)
                    .unwrap()
            })
            .collect();
        s.conn
            .execute(
                "UPDATE kills SET record = '{\"ts_ns\": \"garbage' WHERE id = ?1",
                [ids[1]],
            )
            .unwrap();
        s.conn
            .execute(
                "UPDATE kills SET record = X'FF00FE' WHERE id = ?1",
                [ids[2]],
            )
            .unwrap();
        drop(s);
        let r = Store::open_ro(&path).unwrap();
        let (good, damaged) = r.kills_lenient(0, None, 100).unwrap();
        assert_eq!(
            good.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![ids[0]]
        );
        assert_eq!(
            damaged.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![ids[2], ids[1]]
        );
    }

    #[test]
    fn the_wal_counts_against_the_size_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut s = Store::open_rw(&path).unwrap();
        // No checkpointer: the WAL grows with every commit.
        for chunk in 0..40 {
            let events: Vec<EventRow> = (0..2_000).map(|i| event(chunk * 2_000 + i)).collect();
            s.insert_events(None, &events).unwrap();
        }
        assert!(
            wal_len(&path) > WAL_KEEP_BYTES,
            "the WAL grew: {}",
            wal_len(&path)
        );
        s.insert_kill(&kill(7, 90_000), &[], 90_000).unwrap();
        let max = 4 << 20;
        s.enforce_retention(90_000, i64::MAX / 2, max).unwrap();
        let total = std::fs::metadata(&path).unwrap().len() + wal_len(&path);
        assert!(total <= max, "store and WAL {total} > {max}");
        assert_eq!(s.kills(0, None, 10).unwrap().len(), 1, "the kill stays");
    }

    #[test]
    fn unwritable_location() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        // A path under a regular file can never be created, even as root.
        let err = Store::open_rw(&file.join("t.db")).err().expect("refused");
        assert!(matches!(err, StoreError::NotWritable { .. }), "{err}");
    }

    #[test]
    fn retention_by_age_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open_rw(&dir.path().join("t.db")).unwrap();
        let events: Vec<EventRow> = (0..20_000).map(event).collect();
        s.insert_events(None, &events).unwrap();
        s.insert_kill(&kill(1, 10), &[], 10).unwrap();
        s.insert_kill(&kill(2, 19_999), &[], 19_999).unwrap();
        // Age: everything before 10_000 goes, the old kill with it.
        s.enforce_retention(20_000, 10_000, u64::MAX).unwrap();
        assert_eq!(s.events(0, None, None, usize::MAX).unwrap().len(), 10_000);
        assert_eq!(s.kills(0, None, 10).unwrap().len(), 1);
        // Size: the oldest events go first, the newest kill stays.
        let before = s.size_bytes().unwrap();
        s.enforce_retention(20_000, i64::MAX / 2, before / 4)
            .unwrap();
        assert!(s.events(0, None, None, usize::MAX).unwrap().len() < 10_000);
        assert_eq!(s.kills(0, None, 10).unwrap().len(), 1);
        assert!(s.size_bytes().unwrap() < before, "file shrank");
    }
}
