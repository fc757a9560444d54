//! Kill records: committed durably, updated as later joins add to them.

use rusqlite::{OptionalExtension, params};

use super::{EventRow, Store, StoreError, events::insert_events_tx, killlog::KillLog, sql};
use crate::record::KillRecord;
use crate::util::time::wall_now_ns;

/// Adds one kill's row.
fn insert_row(
    tx: &rusqlite::Transaction,
    kill: &KillRecord,
    committed_ns: i64,
) -> Result<i64, StoreError> {
    let json = serde_json::to_string(kill).expect("kill records serialize");
    tx.execute(
        "INSERT INTO kills (ts_ns, pid, comm, killer, session_id, committed_ns, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![kill.ts_ns, kill.victim.pid, kill.victim.comm, kill.killer.kind.as_str(), kill.session_id, committed_ns, json],
    )
    .map_err(sql("insert kill"))?;
    Ok(tx.last_insert_rowid())
}

/// Kills read back (id, record), and the ids of damaged ones with why.
pub type KillsRead = (Vec<(i64, KillRecord)>, Vec<(i64, String)>);

impl Store {
    /// Commits kills (and the events buffered with them) in one
    /// transaction; returns their ids in order. Kills that arrive together
    /// share one sync. A recording store makes them durable in its kill log
    /// (one append and one `fdatasync`) and commits them unsynced; without
    /// a log, or when the log cannot take them (a full disk), the commit
    /// itself is synced. `committed_ns` of the rows: when they were durable
    /// (after the log's sync), or `now_ns` for a synced commit.
    pub fn insert_kills(
        &mut self,
        kills: &[KillRecord],
        events: &[EventRow],
        now_ns: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let logged = self.kill_log.as_mut().and_then(|log| {
            let t0 = wall_now_ns();
            match log.append(kills, t0) {
                Ok(()) => {
                    let t = wall_now_ns();
                    tracing::debug!(
                        "{} kill(s) durable in the kill log in {} us",
                        kills.len(),
                        (t - t0) / 1000
                    );
                    Some(t)
                }
                Err(e) => {
                    tracing::debug!("the kill log did not take {} kill(s): {e}", kills.len());
                    None
                }
            }
        });
        let write = |conn: &mut rusqlite::Connection, committed_ns: i64| {
            let tx = conn.transaction().map_err(sql("insert kill"))?;
            let session = kills.first().and_then(|k| k.session_id);
            insert_events_tx(&tx, session, events)?;
            let ids = kills
                .iter()
                .map(|kill| insert_row(&tx, kill, committed_ns))
                .collect::<Result<Vec<_>, _>>()?;
            tx.commit().map_err(sql("insert kill"))?;
            Ok(ids)
        };
        match logged {
            // A log that kills kept coming into (its thread empties it
            // only between them) is emptied by a synced commit.
            Some(t) if self.kill_log.as_ref().is_some_and(|l| l.is_long()) => {
                self.durably_emptying_log(|conn| write(conn, t))
            }
            Some(t) => {
                let ids = write(&mut self.conn, t)?;
                if let Some(log) = self.kill_log.as_mut() {
                    log.stored();
                }
                Ok(ids)
            }
            // This commit syncs the WAL (and every earlier commit with it):
            // a kill is often followed by a node reboot.
            None => self.durably(|conn| write(conn, now_ns)),
        }
    }

    /// Runs `write` as a synced commit, which makes every kill of the kill
    /// log durable in the store itself, and empties the log.
    fn durably_emptying_log<T>(
        &mut self,
        write: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let v = self.durably(write)?;
        if let Some(log) = self.kill_log.as_mut()
            && let Err(e) = log.clear()
        {
            // Left as it is, the next start finds its kills stored.
            tracing::debug!("emptying the kill log: {e}");
        }
        Ok(v)
    }

    /// Opens the kill log of a recording store and first stores what an
    /// earlier writer left in it that the store lacks (its WAL lost them
    /// in a power loss or a crash of the machine).
    pub(super) fn open_kill_log(&mut self) -> Result<(), StoreError> {
        let log_path = KillLog::path_for(&self.path);
        let (log, left) = KillLog::open(&self.path).map_err(|e| match e {
            crate::util::fsafe::UnsafePath::Io { source, .. }
                if source.kind() == std::io::ErrorKind::InvalidData =>
            {
                StoreError::Corrupt {
                    path: log_path.clone(),
                    detail: source.to_string(),
                }
            }
            e => super::refuse(&self.path, e),
        })?;
        self.kill_log = Some(log);
        if left.kills.is_empty() && left.damaged == 0 {
            return Ok(());
        }
        let added = self.durably_emptying_log(|conn| {
            let tx = conn.transaction().map_err(sql("kill log"))?;
            let mut added = 0;
            for k in &left.kills {
                let known: bool = tx
                    .query_row(
                        "SELECT EXISTS(SELECT 1 FROM kills WHERE ts_ns = ?1 AND pid = ?2)",
                        params![k.record.ts_ns, k.record.victim.pid],
                        |r| r.get(0),
                    )
                    .map_err(sql("kill log"))?;
                if known {
                    continue;
                }
                let mut rec = k.record.clone();
                if let Some(s) = rec.session_id {
                    let session: bool = tx
                        .query_row(
                            "SELECT EXISTS(SELECT 1 FROM sessions WHERE id = ?1)",
                            [s],
                            |r| r.get(0),
                        )
                        .map_err(sql("kill log"))?;
                    rec.session_id = rec.session_id.filter(|_| session);
                }
                insert_row(&tx, &rec, k.logged_ns)?;
                added += 1;
            }
            tx.commit().map_err(sql("kill log"))?;
            Ok(added)
        })?;
        if added > 0 || left.damaged > 0 {
            tracing::warn!(
                "the kill log {} held {} kill(s) the store had lost{}",
                log_path.display(),
                added,
                if left.damaged > 0 {
                    format!(", and {} line(s) torn by a crash", left.damaged)
                } else {
                    String::new()
                }
            );
        }
        Ok(())
    }

    /// Commits one kill; returns its id.
    pub fn insert_kill(
        &mut self,
        kill: &KillRecord,
        events: &[EventRow],
        now_ns: i64,
    ) -> Result<i64, StoreError> {
        Ok(self.insert_kills(std::slice::from_ref(kill), events, now_ns)?[0])
    }

    /// Replaces kills' records in one transaction.
    pub fn update_kills<'a>(
        &self,
        kills: impl IntoIterator<Item = (i64, &'a KillRecord)>,
    ) -> Result<(), StoreError> {
        let e = || sql("update kills");
        let tx = self.conn.unchecked_transaction().map_err(e())?;
        {
            let mut st = tx
                .prepare_cached("UPDATE kills SET record = ?2, comm = ?3 WHERE id = ?1")
                .map_err(e())?;
            for (id, kill) in kills {
                let json = serde_json::to_string(kill).expect("kill records serialize");
                st.execute(params![id, json, kill.victim.comm])
                    .map_err(e())?;
            }
        }
        tx.commit().map_err(e())
    }

    /// Replaces a kill's record (a later join added to it).
    pub fn update_kill(&self, id: i64, kill: &KillRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(kill).expect("kill records serialize");
        self.conn
            .execute(
                "UPDATE kills SET record = ?2, comm = ?3 WHERE id = ?1",
                params![id, json, kill.victim.comm],
            )
            .map_err(sql("update kill"))?;
        Ok(())
    }

    /// The kill of `pid` recorded within `window_ns` of `ts_ns`, if any.
    pub fn find_kill(
        &self,
        pid: u32,
        ts_ns: i64,
        window_ns: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row(
                "SELECT id FROM kills WHERE pid = ?1 AND ts_ns BETWEEN ?2 AND ?3 ORDER BY abs(ts_ns - ?4) LIMIT 1",
                params![pid, ts_ns - window_ns, ts_ns + window_ns, ts_ns],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("find kill"))
    }

    /// Kills since `since_ns`, newest first, optionally of one pid.
    pub fn kills(
        &self,
        since_ns: i64,
        pid: Option<u32>,
        limit: usize,
    ) -> Result<Vec<(i64, KillRecord)>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, record, committed_ns FROM kills WHERE ts_ns >= ?1 AND (?2 IS NULL OR pid = ?2)
                 ORDER BY ts_ns DESC, id DESC LIMIT ?3",
            )
            .map_err(sql("kills"))?;
        let rows = st
            .query_map(params![since_ns, pid, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql("kills"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json) = row.map_err(sql("kills"))?;
            let rec =
                serde_json::from_str(&json).map_err(|source| StoreError::Record { id, source })?;
            out.push((id, rec));
        }
        Ok(out)
    }

    /// Like [`Store::kills`], but a record that cannot be read back does
    /// not hide the others: it is returned apart, with why.
    pub fn kills_lenient(
        &self,
        since_ns: i64,
        pid: Option<u32>,
        limit: usize,
    ) -> Result<KillsRead, StoreError> {
        let (mut good, mut damaged) = (Vec::new(), Vec::new());
        self.each_kill(since_ns, pid, |id, rec| {
            match rec {
                Ok(rec) => good.push((id, rec)),
                Err(why) => damaged.push((id, why)),
            }
            good.len() + damaged.len() < limit
        })?;
        Ok((good, damaged))
    }

    /// Each kill since `since_ns` (of `pid`), latest first, read one at a
    /// time (a store of many kills is never held whole): `f` gets its id
    /// and its record, or why the record cannot be read back; it returns
    /// whether to go on.
    pub fn each_kill(
        &self,
        since_ns: i64,
        pid: Option<u32>,
        mut f: impl FnMut(i64, Result<KillRecord, String>) -> bool,
    ) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, CAST(record AS BLOB) FROM kills WHERE ts_ns >= ?1 AND (?2 IS NULL OR pid = ?2)
                 ORDER BY ts_ns DESC, id DESC",
            )
            .map_err(sql("kills"))?;
        let mut rows = st.query(params![since_ns, pid]).map_err(sql("kills"))?;
        while let Some(r) = rows.next().map_err(sql("kills"))? {
            let id: i64 = r.get(0).map_err(sql("kills"))?;
            let json: Option<Vec<u8>> = r.get(1).map_err(sql("kills"))?;
            let rec = serde_json::from_slice(json.as_deref().unwrap_or_default())
                .map_err(|e| e.to_string());
            if !f(id, rec) {
                break;
            }
        }
        Ok(())
    }

    /// The readable kills from `from_ns` to `to_ns` (wall ns), oldest
    /// first; a damaged record is left out (`kills_lenient` reports it).
    pub fn kills_between(
        &self,
        from_ns: i64,
        to_ns: i64,
    ) -> Result<Vec<(i64, KillRecord)>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, CAST(record AS BLOB) FROM kills WHERE ts_ns BETWEEN ?1 AND ?2 ORDER BY ts_ns, id",
            )
            .map_err(sql("kills"))?;
        let rows = st
            .query_map(params![from_ns, to_ns], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, Option<Vec<u8>>>(1)?))
            })
            .map_err(sql("kills"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json) = row.map_err(sql("kills"))?;
            if let Ok(rec) = serde_json::from_slice(json.as_deref().unwrap_or_default()) {
                out.push((id, rec));
            }
        }
        Ok(out)
    }

    /// When each kill became durable (wall ns), by kill id.
    pub fn committed_ns(&self, id: i64) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row("SELECT committed_ns FROM kills WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("committed_ns"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Victim;

    fn kill(pid: u32, ts_ns: i64, session_id: Option<i64>) -> KillRecord {
        KillRecord {
            ts_ns,
            session_id,
            victim: Victim {
                pid,
                comm: "python3".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn log_len(store: &std::path::Path) -> usize {
        super::super::killlog::left_in(store)
    }

    #[test]
    fn a_kill_is_in_the_log_until_the_wal_is_synced_and_the_next_start_stores_what_the_wal_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut s = Store::open_rw(&path).unwrap();
        let sid = s.start_session(100, "h", "6.18", "[]").unwrap();
        s.insert_kills(
            &[kill(7, 1_000, Some(sid)), kill(8, 1_000, Some(sid))],
            &[],
            5,
        )
        .unwrap();
        assert!(log_len(&path) > 0, "the kills are durable in the log");
        // The log's thread syncs the WAL and empties it within a second
        // or two.
        let t0 = std::time::Instant::now();
        while log_len(&path) > 0 && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(log_len(&path), 0, "the WAL synced, the log is emptied");
        s.insert_kill(&kill(9, 3_000, Some(sid)), &[], 5).unwrap();
        drop(s);
        // What a power loss leaves: the log has kills 9 (stored) and, as
        // if the WAL lost them, 10 (of a session the store never got) and
        // 11, logged twice (a retry after a failed commit).
        let (mut log, _) = KillLog::open(&path).unwrap();
        log.append(&[kill(10, 4_000, Some(sid + 5))], 4_100)
            .unwrap();
        log.append(&[kill(11, 5_000, Some(sid))], 5_100).unwrap();
        log.append(&[kill(11, 5_000, Some(sid))], 5_200).unwrap();
        drop(log);
        let s = Store::open_rw(&path).unwrap();
        assert_eq!(log_len(&path), 0);
        drop(s);
        let r = Store::open_ro(&path).unwrap();
        let kills = r.kills(0, None, 10).unwrap();
        let got: Vec<(u32, Option<i64>)> = kills
            .iter()
            .map(|(_, k)| (k.victim.pid, k.session_id))
            .collect();
        assert_eq!(
            got,
            [
                (11, Some(sid)),
                (10, None),
                (9, Some(sid)),
                (8, Some(sid)),
                (7, Some(sid))
            ]
        );
        let id11 = kills[0].0;
        assert_eq!(r.committed_ns(id11).unwrap(), Some(5_100));
        drop(r);
        // A second start adds nothing.
        drop(Store::open_rw(&path).unwrap());
        assert_eq!(
            Store::open_ro(&path)
                .unwrap()
                .kills(0, None, 10)
                .unwrap()
                .len(),
            5
        );
    }

    #[test]
    fn kills_that_never_stop_keep_the_log_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut s = Store::open_rw(&path).unwrap();
        let sid = s.start_session(100, "h", "6.18", "[]").unwrap();
        let mut longest = 0;
        for pid in 0..1100 {
            s.insert_kill(&kill(pid, 1_000 + pid as i64, Some(sid)), &[], 5)
                .unwrap();
            longest = longest.max(s.kill_log.as_ref().unwrap().written());
        }
        assert!(longest <= (4 << 20) + 4096, "{longest}");
        assert_eq!(s.kills(0, None, 2000).unwrap().len(), 1100);
    }

    #[test]
    fn a_kill_log_too_big_to_be_ours_is_refused_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(Store::open_rw(&path).unwrap());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(KillLog::path_for(&path))
            .unwrap();
        f.set_len(65 << 20).unwrap();
        let err = Store::open_rw(&path).err().unwrap();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(".kills"), "{err}");
    }
}
