//! Kill records: committed durably, updated as later joins add to them.

use rusqlite::{OptionalExtension, params};

use super::{EventRow, Store, StoreError, events::insert_events_tx, sql};
use crate::record::KillRecord;

/// Kills read back (id, record), and the ids of damaged ones with why.
pub type KillsRead = (Vec<(i64, KillRecord)>, Vec<(i64, String)>);

impl Store {
    /// Commits kills (and the events buffered with them) in one durable
    /// transaction; returns their ids in order. Kills that arrive together
    /// share one fsync.
    pub fn insert_kills(
        &mut self,
        kills: &[KillRecord],
        events: &[EventRow],
        now_ns: i64,
    ) -> Result<Vec<i64>, StoreError> {
        // This commit syncs the WAL (and every earlier commit with it): a
        // kill is often followed by a node reboot.
        self.durably(|conn| {
            let tx = conn.transaction().map_err(sql("insert kill"))?;
            let session = kills.first().and_then(|k| k.session_id);
            insert_events_tx(&tx, session, events)?;
            let mut ids = Vec::with_capacity(kills.len());
            for kill in kills {
                let json = serde_json::to_string(kill).expect("kill records serialize");
                tx.execute(
                    "INSERT INTO kills (ts_ns, pid, comm, killer, session_id, committed_ns, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![kill.ts_ns, kill.victim.pid, kill.victim.comm, kill.killer.kind.as_str(), kill.session_id, now_ns, json],
                )
                .map_err(sql("insert kill"))?;
                ids.push(tx.last_insert_rowid());
            }
            tx.commit().map_err(sql("insert kill"))?;
            Ok(ids)
        })
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
