//! The schema: one migration per version, applied in order.

use super::{SCHEMA_VERSION, Store, StoreError, classify, sql};

const MIGRATIONS: &[&str] = &[
    // 0 -> 1
    "CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        started_ns INTEGER NOT NULL,
        last_seen_ns INTEGER NOT NULL,
        ended_ns INTEGER,
        host TEXT, kernel TEXT, version TEXT, probes TEXT
     );
     CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        ts_ns INTEGER NOT NULL,
        kind TEXT NOT NULL,
        pid INTEGER NOT NULL,
        tid INTEGER NOT NULL,
        comm TEXT NOT NULL,
        session_id INTEGER,
        data TEXT NOT NULL
     );
     CREATE INDEX events_ts ON events(ts_ns);
     CREATE TABLE kills (
        id INTEGER PRIMARY KEY,
        ts_ns INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        comm TEXT NOT NULL,
        killer TEXT NOT NULL,
        session_id INTEGER,
        committed_ns INTEGER NOT NULL,
        record TEXT NOT NULL
     );
     CREATE INDEX kills_ts ON kills(ts_ns);
     CREATE INDEX kills_pid ON kills(pid);
     CREATE TABLE drops (
        id INTEGER PRIMARY KEY,
        session_id INTEGER,
        ring TEXT NOT NULL,
        count INTEGER NOT NULL,
        from_ns INTEGER NOT NULL,
        to_ns INTEGER NOT NULL
     );
     CREATE INDEX drops_to ON drops(to_ns);",
    // 1 -> 2: CUDA tracing.
    "CREATE TABLE gpu_ooms (
        id INTEGER PRIMARY KEY,
        ts_ns INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        comm TEXT NOT NULL,
        device INTEGER NOT NULL,
        session_id INTEGER,
        record TEXT NOT NULL
     );
     CREATE INDEX gpu_ooms_ts ON gpu_ooms(ts_ns);
     CREATE TABLE gpu_ledgers (
        id INTEGER PRIMARY KEY,
        ts_ns INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        comm TEXT NOT NULL,
        final INTEGER NOT NULL,
        session_id INTEGER,
        ledger TEXT NOT NULL
     );
     CREATE INDEX gpu_ledgers_pid ON gpu_ledgers(pid, ts_ns);",
    // 2 -> 3: NVML timelines, per device and per process, downsampled as they age.
    "CREATE TABLE gpu_devices (
        ts_ns INTEGER NOT NULL,
        res_s INTEGER NOT NULL,
        device INTEGER NOT NULL,
        total INTEGER NOT NULL,
        used INTEGER NOT NULL,
        util_gpu INTEGER,
        temperature_c INTEGER,
        power_mw INTEGER
     );
     CREATE INDEX gpu_devices_ts ON gpu_devices(ts_ns);
     CREATE TABLE gpu_processes (
        ts_ns INTEGER NOT NULL,
        res_s INTEGER NOT NULL,
        device INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        comm TEXT NOT NULL,
        container TEXT,
        nvml_used INTEGER,
        traced_device INTEGER,
        pinned_host INTEGER,
        host_rss_kb INTEGER,
        memcg_usage INTEGER,
        memcg_limit INTEGER
     );
     CREATE INDEX gpu_processes_ts ON gpu_processes(ts_ns);
     ALTER TABLE sessions ADD COLUMN gpu TEXT;",
];

impl Store {
    pub(super) fn version(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| classify(&self.path, e, "version"))
    }

    pub(super) fn migrate(&self) -> Result<(), StoreError> {
        let v = self.version()?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: v,
            });
        }
        if v == 0 {
            let tables: i64 = self
                .conn
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(sql("migrate"))?;
            if tables > 0 {
                return Err(StoreError::Corrupt {
                    path: self.path.clone(),
                    detail: "a SQLite file with other tables".into(),
                });
            }
        }
        for (i, step) in MIGRATIONS.iter().enumerate().skip(v as usize) {
            let to = i as i64 + 1;
            let sql_text = format!("BEGIN; {step} PRAGMA user_version = {to}; COMMIT;");
            self.conn.execute_batch(&sql_text).map_err(sql("migrate"))?;
            tracing::debug!("store {} migrated to schema {to}", self.path.display());
        }
        Ok(())
    }
}
