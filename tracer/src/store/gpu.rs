//! GPU records: CUDA out-of-memory failures, ledger snapshots, NVML timelines.

use rusqlite::{OptionalExtension, params};

use super::{DeviceRow, ProcRow, Store, StoreError, sql};
use crate::{model::ledger::LedgerSummary, record::GpuOomRecord};

/// A process on a device at one time: (wall ns, bytes NVML charged it,
/// bytes its traced calls held).
pub type ProcessPoint = (i64, Option<u64>, Option<u64>);

impl Store {
    /// Commits a GPU out-of-memory record (durably, like a kill).
    pub fn insert_gpu_oom(&mut self, rec: &GpuOomRecord) -> Result<i64, StoreError> {
        let json = serde_json::to_string(rec).expect("records serialize");
        self.durably(|conn| {
            conn.execute(
                "INSERT INTO gpu_ooms (ts_ns, pid, comm, device, session_id, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![rec.ts_ns, rec.process.pid, rec.process.comm, rec.device, rec.session_id, json],
            )
            .map_err(sql("insert gpu oom"))?;
            Ok(conn.last_insert_rowid())
        })
    }

    /// Replaces a GPU out-of-memory record (NVML's picture joined later).
    pub fn update_gpu_oom(&self, id: i64, rec: &GpuOomRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(rec).expect("records serialize");
        self.conn
            .execute(
                "UPDATE gpu_ooms SET record = ?2 WHERE id = ?1",
                params![id, json],
            )
            .map_err(sql("update gpu oom"))?;
        Ok(())
    }

    /// GPU out-of-memory records since `since_ns`, newest first.
    pub fn gpu_ooms(
        &self,
        since_ns: i64,
        pid: Option<u32>,
        limit: usize,
    ) -> Result<Vec<(i64, GpuOomRecord)>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, record FROM gpu_ooms WHERE ts_ns >= ?1 AND (?2 IS NULL OR pid = ?2)
                 ORDER BY ts_ns DESC, id DESC LIMIT ?3",
            )
            .map_err(sql("gpu ooms"))?;
        let rows = st
            .query_map(params![since_ns, pid, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql("gpu ooms"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json) = row.map_err(sql("gpu ooms"))?;
            out.push((
                id,
                serde_json::from_str(&json).map_err(|source| StoreError::Record { id, source })?,
            ));
        }
        Ok(out)
    }

    /// Stores a snapshot of a process's GPU ledger (`fin`: at its exit).
    pub fn insert_ledger(
        &self,
        session: i64,
        ts_ns: i64,
        pid: u32,
        comm: &str,
        fin: bool,
        l: &LedgerSummary,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(l).expect("ledgers serialize");
        self.conn
            .execute(
                "INSERT INTO gpu_ledgers (ts_ns, pid, comm, final, session_id, ledger) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![ts_ns, pid, comm, fin, session, json],
            )
            .map_err(sql("insert ledger"))?;
        Ok(())
    }

    /// The latest ledger snapshot of `pid` at or before `ts_ns`.
    pub fn ledger_at(&self, pid: u32, ts_ns: i64) -> Result<Option<LedgerSummary>, StoreError> {
        let row: Option<(i64, String)> = self
            .conn
            .query_row(
                "SELECT id, ledger FROM gpu_ledgers WHERE pid = ?1 AND ts_ns <= ?2 ORDER BY ts_ns DESC LIMIT 1",
                params![pid, ts_ns],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(sql("ledger"))?;
        row.map(|(id, json)| {
            serde_json::from_str(&json).map_err(|source| StoreError::Record { id, source })
        })
        .transpose()
    }

    /// The NVML timeline of `device` from `from_ns` to `to_ns`: (wall ns,
    /// its memory, bytes in use), oldest first.
    pub fn gpu_device_rows(
        &self,
        device: u32,
        from_ns: i64,
        to_ns: i64,
    ) -> Result<Vec<(i64, u64, u64)>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT ts_ns, total, used FROM gpu_devices WHERE device = ?1 AND ts_ns BETWEEN ?2 AND ?3 ORDER BY ts_ns",
            )
            .map_err(sql("timeline"))?;
        let rows = st
            .query_map(params![device, from_ns, to_ns], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as u64,
                ))
            })
            .map_err(sql("timeline"))?;
        rows.collect::<Result<_, _>>().map_err(sql("timeline"))
    }

    /// What `pid` held on `device` from `from_ns` to `to_ns`: (wall ns,
    /// bytes NVML charged it, bytes its traced calls held), oldest first.
    pub fn gpu_process_rows(
        &self,
        device: u32,
        pid: u32,
        from_ns: i64,
        to_ns: i64,
    ) -> Result<Vec<ProcessPoint>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT ts_ns, nvml_used, traced_device FROM gpu_processes WHERE device = ?1 AND pid = ?2 AND ts_ns BETWEEN ?3 AND ?4 ORDER BY ts_ns",
            )
            .map_err(sql("timeline"))?;
        let u = |v: Option<i64>| v.map(|x| x as u64);
        let rows = st
            .query_map(params![device, pid, from_ns, to_ns], |r| {
                Ok((r.get::<_, i64>(0)?, u(r.get(1)?), u(r.get(2)?)))
            })
            .map_err(sql("timeline"))?;
        rows.collect::<Result<_, _>>().map_err(sql("timeline"))
    }

    /// Appends timeline rows (one transaction).
    pub fn insert_timeline(
        &mut self,
        res_s: i64,
        devices: &[DeviceRow],
        procs: &[ProcRow],
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction().map_err(sql("timeline"))?;
        {
            let mut d = tx
                .prepare_cached("INSERT INTO gpu_devices VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
                .map_err(sql("timeline"))?;
            for r in devices {
                d.execute(params![
                    r.ts_ns,
                    res_s,
                    r.device,
                    r.total as i64,
                    r.used as i64,
                    r.util_gpu,
                    r.temperature_c,
                    r.power_mw
                ])
                .map_err(sql("timeline"))?;
            }
            let mut p = tx
                .prepare_cached("INSERT INTO gpu_processes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)")
                .map_err(sql("timeline"))?;
            let i = |v: Option<u64>| v.map(|x| x as i64);
            for r in procs {
                p.execute(params![
                    r.ts_ns,
                    res_s,
                    r.device,
                    r.pid,
                    r.comm,
                    r.container,
                    i(r.nvml_used),
                    i(r.traced_device),
                    i(r.pinned_host),
                    i(r.host_rss_kb),
                    i(r.memcg_usage),
                    i(r.memcg_limit)
                ])
                .map_err(sql("timeline"))?;
            }
        }
        tx.commit().map_err(sql("timeline"))
    }

    /// Folds timeline rows older than `cutoff_ns` at a finer resolution
    /// into one row per `res_s` seconds (the maximum of each figure).
    pub fn downsample_timeline(&mut self, cutoff_ns: i64, res_s: i64) -> Result<u64, StoreError> {
        let b = res_s * 1_000_000_000;
        let tx = self.conn.transaction().map_err(sql("downsample"))?;
        tx.execute(
            "INSERT INTO gpu_devices SELECT (ts_ns / ?2) * ?2, ?3, device, max(total), max(used), max(util_gpu),
                 max(temperature_c), max(power_mw)
             FROM gpu_devices WHERE res_s < ?3 AND ts_ns < ?1 GROUP BY ts_ns / ?2, device",
            params![cutoff_ns, b, res_s],
        )
        .map_err(sql("downsample"))?;
        tx.execute(
            "INSERT INTO gpu_processes SELECT (ts_ns / ?2) * ?2, ?3, device, pid, max(comm), max(container), max(nvml_used),
                 max(traced_device), max(pinned_host), max(host_rss_kb), max(memcg_usage), max(memcg_limit)
             FROM gpu_processes WHERE res_s < ?3 AND ts_ns < ?1 GROUP BY ts_ns / ?2, device, pid",
            params![cutoff_ns, b, res_s],
        )
        .map_err(sql("downsample"))?;
        let mut n = 0;
        for t in ["gpu_devices", "gpu_processes"] {
            n += tx
                .execute(
                    &format!("DELETE FROM {t} WHERE res_s < ?2 AND ts_ns < ?1"),
                    params![cutoff_ns, res_s],
                )
                .map_err(sql("downsample"))? as u64;
        }
        tx.commit().map_err(sql("downsample"))?;
        Ok(n)
    }
}
