//! The spill store: a small store under /run (a tmpfs) that keeps kills
//! durable while the store's own file system is full.
//!
//! A recorder started on a full file system records into it until the
//! store has room, then moves what it holds into the store and goes on
//! there. A recorder whose store filled up while it ran copies the kills it
//! cannot write into it, so that a crash or a stop loses none; the next
//! start (or the recorder itself, once the store has room) imports them.
//! Kills already in the store are never imported twice: a kill is the same
//! kill when its pid is and its times are within the join window (as a
//! recorder decides whether the kernel log's report of a kill is new: a
//! spill store's kernel-log-only records of old kills were made without
//! the store to look in, and their times come from another clock reading).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError, StoreLock, beside, side_files, sql};
use crate::correlate::join::JOIN_WINDOW_NS;
use crate::util::fsafe;

/// Default directory of spill stores.
pub const DEFAULT_DIR: &str = "/run/tracer";

/// A spill store is kept under this size (it is memory, on a tmpfs): the
/// oldest events go first, kills last, as in the store.
pub const MAX_BYTES: u64 = 16 << 20;

/// The spill store of the store at `store`, in `dir`: named after the
/// store's file and a hash of its absolute path, so two stores on one node
/// never share one.
pub fn path_for(store: &Path, dir: &Path) -> PathBuf {
    let abs = std::path::absolute(store).unwrap_or_else(|_| store.to_path_buf());
    let h = crate::util::fnv1a(abs.as_os_str().as_encoded_bytes());
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".into());
    dir.join(format!("{name}-{h:016x}.spill"))
}

/// Removes a spill store's files (after its import).
pub fn remove(spill: &Path) {
    for p in side_files(spill)
        .into_iter()
        .chain([spill.to_path_buf(), beside(spill, ".lock")])
    {
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("removing {}: {e}", p.display());
        }
    }
}

/// What an import moved.
#[derive(Debug, Default)]
pub struct Imported {
    /// Kills added to the store.
    pub kills: usize,
    /// Kills the store already had.
    pub known: usize,
    /// GPU OOMs added.
    pub gpu_ooms: usize,
    /// Events and samples added (best effort: they are shed first when
    /// the file system has no room for them).
    pub rows: usize,
    /// Each kill's row in the spill store, and its row in the store.
    pub kill_ids: HashMap<i64, i64>,
    /// Same, for GPU OOMs.
    pub gpu_oom_ids: HashMap<i64, i64>,
    /// Same, for sessions.
    pub session_ids: HashMap<i64, i64>,
}

impl Store {
    /// Opens (creating if needed) the spill store of the store at `store`,
    /// in `dir` (made private to root if new). It checkpoints itself: its
    /// recorder's checkpoint thread follows the store.
    pub fn open_spill(store: &Path, dir: &Path) -> Result<Self, StoreError> {
        let path = path_for(store, dir);
        let lock = Self::lock_rw(&path)?;
        let mut s = Self::open_rw_held(&path, false)?;
        s._lock = Some(lock);
        s.conn
            .pragma_update(None, "wal_autocheckpoint", 1000)
            .map_err(sql("spill autocheckpoint"))?;
        Ok(s)
    }

    /// Imports the spill store left for this store in `dir`, if any, and
    /// removes it. A spill store another recorder holds is left alone.
    pub fn import_left_spill(&mut self, dir: &Path) -> Result<Option<Imported>, StoreError> {
        let spill = path_for(&self.path, dir);
        if std::fs::symlink_metadata(&spill).is_err() {
            return Ok(None);
        }
        // The spill store's files are checked as the store's are.
        fsafe::check_file(&spill).map_err(|source| StoreError::Unsafe {
            path: spill.clone(),
            source,
        })?;
        let _lock = StoreLock::take(&spill)?;
        let imported = self.import_spill(&spill)?;
        remove(&spill);
        Ok(Some(imported))
    }

    /// Moves what the spill store at `spill` holds into this store: its
    /// sessions (one the store already has is extended, not copied), its
    /// kills and GPU OOMs in one durable commit, then its events, drops,
    /// ledgers and timelines where there is room. The spill store is left
    /// as it was; the caller removes it.
    pub fn import_spill(&mut self, spill: &Path) -> Result<Imported, StoreError> {
        // The spill store's files were checked by whoever opened it (no
        // link, ours); the path is ours too.
        self.conn
            .execute(
                "ATTACH DATABASE ?1 AS spill",
                [spill.to_string_lossy().as_ref()],
            )
            .map_err(sql("attach spill"))?;
        let r = self.import_attached();
        if let Err(e) = self.conn.execute("DETACH DATABASE spill", []) {
            tracing::debug!("detaching the spill store: {e}");
        }
        r
    }

    fn import_attached(&mut self) -> Result<Imported, StoreError> {
        let mut out = self.durably(|conn| {
            let tx = conn.transaction().map_err(sql("import spill"))?;
            let mut out = Imported::default();
            import_sessions(&tx, &mut out)?;
            import_kills(&tx, &mut out)?;
            import_gpu_ooms(&tx, &mut out)?;
            tx.commit().map_err(sql("import spill"))?;
            Ok(out)
        })?;
        // The rest is best effort, and one commit: a file system with room
        // for the kills but not for these keeps the kills.
        let map = serde_json::to_string(&out.session_ids).expect("a map of ids serializes");
        let bulk = (|| -> Result<usize, rusqlite::Error> {
            let tx = self.conn.transaction()?;
            // json_extract on the map: spill session id -> store session id.
            let session = "json_extract(?1, '$.\"' || s.session_id || '\"')";
            let mut n = 0;
            n += tx.execute(
                &format!(
                    "INSERT INTO main.events (ts_ns, kind, pid, tid, comm, session_id, data)
                     SELECT s.ts_ns, s.kind, s.pid, s.tid, s.comm, {session}, s.data FROM spill.events s"
                ),
                [&map],
            )?;
            n += tx.execute(
                &format!(
                    "INSERT INTO main.drops (session_id, ring, count, from_ns, to_ns)
                     SELECT {session}, s.ring, s.count, s.from_ns, s.to_ns FROM spill.drops s"
                ),
                [&map],
            )?;
            n += tx.execute(
                &format!(
                    "INSERT INTO main.gpu_ledgers (ts_ns, pid, comm, final, session_id, ledger)
                     SELECT s.ts_ns, s.pid, s.comm, s.final, {session}, s.ledger FROM spill.gpu_ledgers s"
                ),
                [&map],
            )?;
            for t in ["gpu_devices", "gpu_processes"] {
                n += tx.execute(&format!("INSERT INTO main.{t} SELECT * FROM spill.{t}"), [])?;
            }
            tx.commit()?;
            Ok(n)
        })();
        match bulk {
            Ok(n) => out.rows = n,
            Err(e) => tracing::warn!(
                "the spill store's events and samples were not imported (its kills were): {e}"
            ),
        }
        Ok(out)
    }
}

/// Sessions: one the store already has (same start and host: its kills
/// were spilled while it recorded here) is extended to the spilled one's
/// last sign of life; any other is added.
fn import_sessions(tx: &rusqlite::Transaction, out: &mut Imported) -> Result<(), StoreError> {
    let e = sql("import spill sessions");
    let mut st = tx
        .prepare(
            "SELECT id, started_ns, last_seen_ns, ended_ns, host, kernel, version, probes, gpu
             FROM spill.sessions ORDER BY id",
        )
        .map_err(e)?;
    type Row = (
        i64,
        i64,
        i64,
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
            ))
        })
        .and_then(|rows| rows.collect())
        .map_err(sql("import spill sessions"))?;
    for (id, started, seen, ended, host, kernel, version, probes, gpu) in rows {
        let known: Option<i64> = tx
            .query_row(
                "SELECT id FROM main.sessions WHERE started_ns = ?1 AND host IS ?2",
                params![started, host],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("import spill sessions"))?;
        let to = match known {
            Some(to) => {
                tx.execute(
                    "UPDATE main.sessions SET last_seen_ns = max(last_seen_ns, ?2),
                     ended_ns = coalesce(?3, ended_ns) WHERE id = ?1",
                    params![to, seen, ended],
                )
                .map_err(sql("import spill sessions"))?;
                to
            }
            None => {
                tx.execute(
                    "INSERT INTO main.sessions (started_ns, last_seen_ns, ended_ns, host, kernel, version, probes, gpu)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![started, seen, ended, host, kernel, version, probes, gpu],
                )
                .map_err(sql("import spill sessions"))?;
                tx.last_insert_rowid()
            }
        };
        out.session_ids.insert(id, to);
    }
    Ok(())
}

/// A spilled record, with its session id taken to the store's.
fn remap_session(record: &str, sessions: &HashMap<i64, i64>) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(record) else {
        return record.to_string();
    };
    if let Some(s) = v.get_mut("session_id")
        && let Some(id) = s.as_i64()
        && let Some(to) = sessions.get(&id)
    {
        *s = (*to).into();
    }
    v.to_string()
}

/// Kills: one the store already has (its victim's pid within
/// [`JOIN_WINDOW_NS`] of it: the recorder wrote it home after its copy) is
/// not added again.
fn import_kills(tx: &rusqlite::Transaction, out: &mut Imported) -> Result<(), StoreError> {
    let moved = move_rows(
        tx,
        &out.session_ids,
        "kills",
        &["ts_ns", "pid", "comm", "killer", "committed_ns"],
        &format!(
            "m.pid = s.pid AND m.ts_ns BETWEEN s.ts_ns - {JOIN_WINDOW_NS} AND s.ts_ns + {JOIN_WINDOW_NS}
             ORDER BY abs(m.ts_ns - s.ts_ns)"
        ),
    )?;
    out.kills = moved.added;
    out.known = moved.ids.len() - moved.added;
    out.kill_ids = moved.ids;
    Ok(())
}

/// GPU OOMs: one of the same time, pid and device is the same.
fn import_gpu_ooms(tx: &rusqlite::Transaction, out: &mut Imported) -> Result<(), StoreError> {
    let moved = move_rows(
        tx,
        &out.session_ids,
        "gpu_ooms",
        &["ts_ns", "pid", "comm", "device"],
        "m.ts_ns = s.ts_ns AND m.pid = s.pid AND m.device = s.device",
    )?;
    out.gpu_ooms = moved.added;
    out.gpu_oom_ids = moved.ids;
    Ok(())
}

/// What [`move_rows`] did.
struct Moved {
    /// Each row's id in the spill store, and its id in the store.
    ids: HashMap<i64, i64>,
    /// Rows added (the rest the store had).
    added: usize,
}

/// Moves the rows of `table` (its `cols`, a `session_id` and a JSON
/// `record`) from the attached spill store into the store, oldest first. A
/// row for which `same` (SQL over `m`, a row of the store, and `s`, the
/// spill store's row; it may end in ORDER BY) finds one is not added again.
/// Session ids, in the column and in the record, become the store's.
fn move_rows(
    tx: &rusqlite::Transaction,
    sessions: &HashMap<i64, i64>,
    table: &str,
    cols: &[&str],
    same: &str,
) -> Result<Moved, StoreError> {
    let e = || sql("import spill rows");
    let rows: Vec<(i64, Option<i64>, String)> = tx
        .prepare(&format!(
            "SELECT id, session_id, record FROM spill.{table} ORDER BY id"
        ))
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(e())?;
    let mut known = tx
        .prepare(&format!(
            "SELECT m.id FROM main.{table} m, spill.{table} s WHERE s.id = ?1 AND {same} LIMIT 1"
        ))
        .map_err(e())?;
    let cols = cols.join(", ");
    let mut insert = tx
        .prepare(&format!(
            "INSERT INTO main.{table} ({cols}, session_id, record)
             SELECT {cols}, ?2, ?3 FROM spill.{table} WHERE id = ?1"
        ))
        .map_err(e())?;
    let mut out = Moved {
        ids: HashMap::new(),
        added: 0,
    };
    for (id, session, record) in rows {
        let to = match known
            .query_row([id], |r| r.get(0))
            .optional()
            .map_err(e())?
        {
            Some(to) => to,
            None => {
                let session = session.map(|s| sessions.get(&s).copied().unwrap_or(s));
                insert
                    .execute(params![id, session, remap_session(&record, sessions)])
                    .map_err(e())?;
                out.added += 1;
                tx.last_insert_rowid()
            }
        };
        out.ids.insert(id, to);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{KillRecord, Victim};

    fn kill(pid: u32, ts_ns: i64, session: i64) -> KillRecord {
        KillRecord {
            ts_ns,
            session_id: Some(session),
            victim: Victim {
                pid,
                comm: "memhog".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_spilled_session_is_imported_once_with_its_ids_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("store/t.db");
        let spill_dir = dir.path().join("run");
        // The store has a session and a kill of its own.
        let mut store = Store::open_rw(&home).unwrap();
        let s1 = store.start_session(1_000, "h", "6.18", "[]").unwrap();
        store.insert_kill(&kill(7, 2_000, s1), &[], 2_001).unwrap();
        // A second recorder started on a full disk: its session, and three
        // kills, one of them the store's (its kernel-log-only copy, a few ms
        // off), live in the spill store.
        let mut spill = Store::open_spill(&home, &spill_dir).unwrap();
        let sp = spill.start_session(10_000, "h", "6.18", "[]").unwrap();
        let ids = spill
            .insert_kills(
                &[
                    kill(7, 2_000 + 3_000_000, sp),
                    kill(8, 20_000, sp),
                    kill(9, 30_000, sp),
                ],
                &[],
                30_001,
            )
            .unwrap();
        spill.end_session(sp, 40_000).unwrap();
        // A session copied from the store, with a kill the store had no
        // room for (held at stop).
        let copy = spill.copy_session(&store, s1).unwrap();
        spill
            .insert_kill(&kill(10, 3_000, copy), &[], 3_001)
            .unwrap();
        spill.end_session(copy, 5_000).unwrap();
        let spill_path = spill.path().to_path_buf();
        assert!(spill_path.starts_with(&spill_dir));
        drop(spill);

        let got = store.import_left_spill(&spill_dir).unwrap().unwrap();
        assert_eq!((got.kills, got.known), (3, 1));
        assert!(!spill_path.exists(), "the spill store is removed");
        // Nothing is left to import a second time.
        assert!(store.import_left_spill(&spill_dir).unwrap().is_none());

        let sessions = store.sessions().unwrap();
        assert_eq!(sessions.len(), 2, "{sessions:?}");
        let new = sessions.iter().find(|s| s.started_ns == 10_000).unwrap();
        assert_eq!(got.session_ids[&sp], new.id);
        assert_eq!(new.ended_ns, Some(40_000));
        // The copied session is the store's own, now ended.
        assert_eq!(got.session_ids[&copy], s1);
        assert_eq!(sessions[0].ended_ns, Some(5_000));

        let kills = store.kills(0, None, 10).unwrap();
        assert_eq!(kills.len(), 4, "{kills:?}");
        for (id, k) in &kills {
            let want = match k.victim.pid {
                7 | 10 => s1,
                _ => new.id,
            };
            assert_eq!(k.session_id, Some(want), "kill {id}: {k:?}");
        }
        // Row ids map to the imported rows (the one already stored, to its).
        for (from, pid) in ids.iter().zip([7, 8, 9]) {
            let to = got.kill_ids[from];
            let k = kills.iter().find(|(id, _)| *id == to).unwrap();
            assert_eq!(k.1.victim.pid, pid);
        }
    }

    #[test]
    fn spill_stores_of_two_stores_differ() {
        let dir = Path::new("/run/tracer");
        let a = path_for(Path::new("/var/lib/a/tracer.db"), dir);
        let b = path_for(Path::new("/var/lib/b/tracer.db"), dir);
        assert_ne!(a, b);
        assert!(a.starts_with(dir) && a.to_string_lossy().contains("tracer.db-"));
        assert_eq!(a, path_for(Path::new("/var/lib/a/tracer.db"), dir));
    }
}
