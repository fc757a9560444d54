//! Recording sessions: when a recorder ran, and until when it was seen alive.

use rusqlite::params;
use serde::Serialize;

use super::{Store, StoreError, sql};

/// A recording session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Session {
    /// Id.
    pub id: i64,
    /// Start, wall ns.
    pub started_ns: i64,
    /// Last heartbeat, wall ns.
    pub last_seen_ns: i64,
    /// Clean end, wall ns (`None`: it did not end cleanly, or is running).
    pub ended_ns: Option<i64>,
}

impl Store {
    /// Starts a recording session.
    /// A recorder restarted on a full file system makes room first.
    pub fn start_session(
        &mut self,
        now_ns: i64,
        host: &str,
        kernel: &str,
        probes: &str,
    ) -> Result<i64, StoreError> {
        let insert = |s: &Self| {
            s.conn
                .execute(
                    "INSERT INTO sessions (started_ns, last_seen_ns, host, kernel, version, probes) VALUES (?1, ?1, ?2, ?3, ?4, ?5)",
                    params![now_ns, host, kernel, env!("CARGO_PKG_VERSION"), probes],
                )
                .map_err(sql("start session"))
        };
        if let Err(e) = insert(self) {
            if !e.is_disk_full() {
                return Err(e);
            }
            tracing::warn!(
                "the store's file system is full: making room (oldest events and samples go, kills stay)"
            );
            self.make_room();
            insert(self)?;
        }
        Ok(self.conn.last_insert_rowid())
    }

    /// Adds a copy of session `id` of `from` (its start, host and probes),
    /// for the kills of that session this store keeps; returns its id here.
    /// An import takes it back to the session it copies.
    pub fn copy_session(&self, from: &Store, id: i64) -> Result<i64, StoreError> {
        type Row = (
            i64,
            i64,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let row: Row = from
            .conn
            .query_row(
                "SELECT started_ns, last_seen_ns, host, kernel, version, probes, gpu FROM sessions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
            )
            .map_err(sql("copy session"))?;
        let (started, seen, host, kernel, version, probes, gpu) = row;
        self.conn
            .execute(
                "INSERT INTO sessions (started_ns, last_seen_ns, host, kernel, version, probes, gpu) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![started, seen, host, kernel, version, probes, gpu],
            )
            .map_err(sql("copy session"))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records that a session is still alive.
    pub fn heartbeat(&self, session: i64, now_ns: i64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE sessions SET last_seen_ns = ?2 WHERE id = ?1",
                params![session, now_ns],
            )
            .map_err(sql("heartbeat"))?;
        Ok(())
    }

    /// Ends a session cleanly. Not synced: a stop must be quick during an
    /// OOM storm, and kills whose commits the WAL has not synced yet stay
    /// in the kill log, which the next start reads.
    pub fn end_session(&self, session: i64, now_ns: i64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE sessions SET last_seen_ns = ?2, ended_ns = ?2 WHERE id = ?1",
                params![session, now_ns],
            )
            .map_err(sql("end session"))?;
        Ok(())
    }

    /// Every session, oldest first.
    pub fn sessions(&self) -> Result<Vec<Session>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, started_ns, last_seen_ns, ended_ns FROM sessions ORDER BY started_ns",
            )
            .map_err(sql("sessions"))?;
        let rows = st
            .query_map([], |r| {
                Ok(Session {
                    id: r.get(0)?,
                    started_ns: r.get(1)?,
                    last_seen_ns: r.get(2)?,
                    ended_ns: r.get(3)?,
                })
            })
            .map_err(sql("sessions"))?;
        rows.collect::<Result<_, _>>().map_err(sql("sessions"))
    }

    /// Says what the session knows of the GPUs (NVML present or why not).
    pub fn session_gpu(&self, session: i64, gpu: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE sessions SET gpu = ?2 WHERE id = ?1",
                params![session, gpu],
            )
            .map_err(sql("session gpu"))?;
        Ok(())
    }
}
