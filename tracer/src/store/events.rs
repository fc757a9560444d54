//! Raw events and the drop intervals the probes counted.

use rusqlite::params;

use super::{Store, StoreError, sql};

pub use crate::record::{DropRow, EventRow};

impl Store {
    /// Appends events in one transaction.
    pub fn insert_events(
        &mut self,
        session: Option<i64>,
        events: &[EventRow],
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let tx = self.conn.transaction().map_err(sql("insert events"))?;
        insert_events_tx(&tx, session, events)?;
        tx.commit().map_err(sql("insert events"))
    }

    /// Appends a drop interval.
    pub fn insert_drops(&self, session: i64, row: &DropRow) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO drops (session_id, ring, count, from_ns, to_ns) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![session, row.ring, row.count as i64, row.from_ns, row.to_ns],
            )
            .map_err(sql("insert drops"))?;
        Ok(())
    }

    /// Drop intervals overlapping [from_ns, to_ns].
    pub fn drops_between(&self, from_ns: i64, to_ns: i64) -> Result<Vec<DropRow>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT ring, count, from_ns, to_ns FROM drops WHERE to_ns >= ?1 AND from_ns <= ?2 ORDER BY from_ns")
            .map_err(sql("drops"))?;
        let rows = st
            .query_map(params![from_ns, to_ns], |r| {
                Ok(DropRow {
                    ring: r.get(0)?,
                    count: r.get::<_, i64>(1)? as u64,
                    from_ns: r.get(2)?,
                    to_ns: r.get(3)?,
                })
            })
            .map_err(sql("drops"))?;
        rows.collect::<Result<_, _>>().map_err(sql("drops"))
    }

    /// Events since `since_ns`, oldest first, filtered by kind and pid.
    pub fn events(
        &self,
        since_ns: i64,
        kind: Option<&str>,
        pid: Option<u32>,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT ts_ns, kind, pid, tid, comm, data FROM events
                 WHERE ts_ns >= ?1 AND (?2 IS NULL OR kind = ?2) AND (?3 IS NULL OR pid = ?3 OR json_extract(data, '$.victim_pid') = ?3
                   OR json_extract(data, '$.target_pid') = ?3 OR json_extract(data, '$.child_pid') = ?3)
                 ORDER BY ts_ns, id LIMIT ?4",
            )
            .map_err(sql("events"))?;
        let rows = st
            .query_map(params![since_ns, kind, pid, limit as i64], |r| {
                let data: String = r.get(5)?;
                Ok(EventRow {
                    ts_ns: r.get(0)?,
                    kind: r.get(1)?,
                    pid: r.get(2)?,
                    tid: r.get(3)?,
                    comm: r.get(4)?,
                    data: serde_json::from_str(&data).unwrap_or(serde_json::Value::Null),
                })
            })
            .map_err(sql("events"))?;
        rows.collect::<Result<_, _>>().map_err(sql("events"))
    }
}

pub(super) fn insert_events_tx(
    tx: &rusqlite::Transaction<'_>,
    session: Option<i64>,
    events: &[EventRow],
) -> Result<(), StoreError> {
    let mut st = tx
        .prepare_cached("INSERT INTO events (ts_ns, kind, pid, tid, comm, session_id, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
        .map_err(sql("insert events"))?;
    for e in events {
        st.execute(params![
            e.ts_ns,
            e.kind,
            e.pid,
            e.tid,
            e.comm,
            session,
            e.data.to_string()
        ])
        .map_err(sql("insert events"))?;
    }
    Ok(())
}
