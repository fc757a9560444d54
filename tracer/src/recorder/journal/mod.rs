//! The journal: the only writer of the recorder's store and the only
//! caller of its exporters. Kills are made durable first, then the rest;
//! what was written is what is published, so a kill that changes is stored
//! and handed on again. The full-disk policy (shed events and samples, hold
//! kills, copy them to the spill store, go home when there is room) lives
//! here too.

pub mod spill;

use std::sync::Arc;

use super::{metrics::Metrics, output::Output};
use crate::record::published::Published;
use crate::{
    correlate::timeline::FRESH_RES_S,
    export::{Exported, Exporters},
    record::{
        GpuOomRecord, KillRecord, LedgerSnapshot, PressureEvent, WarningReason, WarningState,
    },
    store::{EventRow, Store, StoreError, spill::Imported},
    util::{term::escape, time::wall_now_ns},
};

/// Events buffered before a write.
const EVENT_BUFFER: usize = 4096;
/// Kill commit latencies kept for the stop summary.
const LATENCIES_KEPT: usize = 1000;

/// Starts a recording session in `store`, with the probes' attach
/// results; returns its id.
pub fn start_session(store: &mut Store, probes_json: &str) -> Result<i64, StoreError> {
    store.start_session(
        wall_now_ns(),
        &crate::util::sys::hostname(),
        &crate::util::sys::kernel_release(),
        probes_json,
    )
}

/// Says in `session` what GPUs NVML sees, or why there is no NVML.
pub fn session_gpu(store: &Store, session: i64, gpu: &str) -> Result<(), StoreError> {
    store.session_gpu(session, gpu)
}

/// What became of a batch of kills handed to [`Journal::commit_kills`].
#[derive(Default)]
pub struct Committed {
    /// The kills stored, with their row ids, in the order given.
    pub stored: Vec<(i64, KillRecord)>,
    /// The kills the store could not take (its file system is full): held
    /// by the caller and handed in again (copied to the spill store).
    pub held: Vec<KillRecord>,
    /// A store error other than a full file system (the kills are in
    /// `held`).
    pub error: Option<StoreError>,
}

/// The store and the exporters of one recording session.
pub struct Journal {
    pub(super) store: Store,
    exporters: Exporters,
    spill: spill::Spill,
    session_id: i64,
    /// Event rows waiting for the next write (or the next kill's commit).
    buffer: Vec<EventRow>,
    /// The store's file system was found full (said once; cleared when
    /// there is room again).
    pub(super) disk_full: bool,
    metrics: Arc<Metrics>,
    /// What the metrics endpoint reads: early warnings are counted there.
    published: Option<Arc<Published>>,
    /// Per kill stored on its own (the last 1,000): µs from the kernel's
    /// timestamp to the return of its durable commit.
    pub(super) kill_commit_us: Vec<u64>,
}

impl Journal {
    /// A journal writing session `session_id` into `store`.
    pub fn new(
        store: Store,
        session_id: i64,
        exporters: Exporters,
        spill: spill::Spill,
        metrics: Arc<Metrics>,
        published: Option<Arc<Published>>,
    ) -> Self {
        Self {
            store,
            exporters,
            spill,
            session_id,
            buffer: Vec::new(),
            disk_full: false,
            metrics,
            published,
            kill_commit_us: Vec::new(),
        }
    }

    /// The session written (it changes when the recorder comes home from
    /// the spill store).
    pub fn session_id(&self) -> i64 {
        self.session_id
    }

    /// Applies what the features made: the changed kills first (stored
    /// and handed on again), then the rest.
    pub fn apply(&mut self, out: &mut Vec<Output>) -> Result<(), StoreError> {
        if out.is_empty() {
            return Ok(());
        }
        // Changed kills first; most batches (the data ring's) have none.
        if out.iter().any(|o| matches!(o, Output::KillChanged { .. })) {
            out.sort_by_key(|o| !matches!(o, Output::KillChanged { .. }));
        }
        for o in out.drain(..) {
            match o {
                Output::Event(row) => self.buffer.push(row),
                Output::KillChanged { id, record } => {
                    self.store.update_kill(id, &record)?;
                    self.publish(Exported::KillUpdated { id, record });
                }
                Output::GpuOomChanged { id, record } => self.store.update_gpu_oom(id, &record)?,
                Output::Ledger(s) => self.ledger(&s)?,
                Output::Drops(row) => self.store.insert_drops(self.session_id, &row)?,
                Output::Pressure(ev) => self.pressure(ev),
            }
        }
        if self.buffer.len() >= EVENT_BUFFER {
            self.flush()?;
        }
        Ok(())
    }

    fn publish(&self, item: Exported) {
        if !self.exporters.is_empty() {
            self.exporters.publish(item);
        }
    }

    /// An early warning (or its end): an event stored, counted and handed
    /// on.
    fn pressure(&mut self, ev: PressureEvent) {
        if let Some(p) = &self.published
            && ev.state == WarningState::Warning
        {
            let mut labels = crate::export::feeds::owner_labels(ev.owner.as_ref());
            labels.push(("cgroup", ev.memcg.clone()));
            labels.push((
                "reason",
                match ev.reason {
                    WarningReason::Growth => "growth".into(),
                    WarningReason::Psi => "psi".into(),
                },
            ));
            p.warnings.inc(labels);
        }
        self.buffer.push(EventRow {
            ts_ns: ev.ts_ns,
            kind: crate::record::PRESSURE.into(),
            pid: 0,
            tid: 0,
            comm: String::new(),
            data: serde_json::to_value(&ev).unwrap_or_default(),
        });
        self.publish(Exported::Pressure {
            record: Box::new(ev),
        });
    }

    fn ledger(&self, s: &LedgerSnapshot) -> Result<(), StoreError> {
        self.store.insert_ledger(
            self.session_id,
            s.ts_ns,
            s.pid,
            &s.comm,
            s.at_exit,
            &s.ledger,
        )
    }

    /// Writes the buffered events.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        let events = std::mem::take(&mut self.buffer);
        self.store.insert_events(Some(self.session_id), &events)
    }

    /// Stores kills again that re-enrichment changed, in one transaction,
    /// and hands them on again.
    pub fn kills_rewritten(&mut self, kills: Vec<(i64, KillRecord)>) -> Result<(), StoreError> {
        if kills.is_empty() {
            return Ok(());
        }
        self.store
            .update_kills(kills.iter().map(|(id, rec)| (*id, rec)))?;
        for (id, rec) in kills {
            self.publish(Exported::KillUpdated {
                id,
                record: Box::new(rec),
            });
        }
        Ok(())
    }

    /// Whether the store holds a kill of `pid` within `window_ns` of `ts_ns`.
    pub fn has_kill(&self, pid: u32, ts_ns: i64, window_ns: i64) -> Result<bool, StoreError> {
        Ok(self.store.find_kill(pid, ts_ns, window_ns)?.is_some())
    }

    /// A GPU out-of-memory failure, made durable and handed on. Returns
    /// its row id.
    pub fn gpu_oom(&mut self, rec: &GpuOomRecord) -> Result<i64, StoreError> {
        let id = self.store.insert_gpu_oom(rec)?;
        Metrics::add(&self.metrics.gpu_ooms, 1);
        self.publish(Exported::GpuOom {
            id,
            record: Box::new(rec.clone()),
        });
        tracing::info!(
            "GPU out of memory: {} (pid {}) asked {} for {} on device {}",
            escape(&rec.process.comm),
            rec.process.pid,
            rec.function,
            crate::util::units::bytes(rec.size),
            rec.device
        );
        Ok(id)
    }

    /// Rows of the GPU timeline. Returns how many were written.
    pub fn timeline(
        &mut self,
        rows: (Vec<crate::record::DeviceRow>, Vec<crate::record::ProcRow>),
    ) -> Result<u64, StoreError> {
        let (devices, procs) = rows;
        self.store.insert_timeline(FRESH_RES_S, &devices, &procs)?;
        Ok((devices.len() + procs.len()) as u64)
    }

    /// Commits `kills`, with the events buffered so far, in one
    /// transaction: a burst of kills shares one fsync. On a full file
    /// system it makes room and tries once more without the events; kills
    /// it still cannot write are held (and copied to the spill store).
    pub fn commit_kills(&mut self, kills: Vec<KillRecord>) -> Committed {
        if kills.is_empty() {
            return Committed::default();
        }
        let events = std::mem::take(&mut self.buffer);
        let t_commit = wall_now_ns();
        let ids = match self.store.insert_kills(&kills, &events, t_commit) {
            Ok(ids) => ids,
            Err(e) if e.is_disk_full() => {
                self.on_disk_full();
                match self.store.insert_kills(&kills, &[], t_commit) {
                    Ok(ids) => ids,
                    Err(e) if e.is_disk_full() => {
                        self.hold(&kills, t_commit);
                        return Committed {
                            held: kills,
                            ..Default::default()
                        };
                    }
                    Err(e) => {
                        return Committed {
                            held: kills,
                            error: Some(e),
                            ..Default::default()
                        };
                    }
                }
            }
            Err(e) => {
                return Committed {
                    held: kills,
                    error: Some(e),
                    ..Default::default()
                };
            }
        };
        let done = wall_now_ns();
        self.spill.all_stored();
        tracing::debug!(
            "{} kill(s) committed in {} us",
            kills.len(),
            (done - t_commit) / 1000
        );
        let mut stored = Vec::with_capacity(kills.len());
        for (id, rec) in ids.into_iter().zip(kills) {
            // An aggregate of a SIGKILL storm is stored when its window
            // ends, by design: it is not a kill's latency to the disk.
            if let Some(t) = rec.tracepoint_ns.filter(|_| rec.aggregate.is_none()) {
                if self.kill_commit_us.len() == LATENCIES_KEPT {
                    self.kill_commit_us.remove(0);
                }
                let us = (done - t).max(0) as u64 / 1000;
                self.kill_commit_us.push(us);
                self.metrics.kill_committed(us);
            }
            Metrics::add(&self.metrics.kills, 1);
            tracing::info!(
                "kill recorded: {} (pid {}) by {} [{}]",
                escape(&rec.victim.comm),
                rec.victim.pid,
                escape(
                    rec.killer
                        .sender
                        .as_ref()
                        .map(|s| s.comm.as_str())
                        .unwrap_or("the kernel OOM killer")
                ),
                rec.source
            );
            self.publish(Exported::Kill {
                id,
                record: Box::new(rec.clone()),
            });
            stored.push((id, rec));
        }
        Committed {
            stored,
            ..Default::default()
        }
    }

    /// Kills the store cannot take: copied to the spill store, so that a
    /// crash or a stop loses none of them.
    fn hold(&mut self, kills: &[KillRecord], now_ns: i64) {
        let n = kills.len();
        match self
            .spill
            .copy_held(&self.store, self.session_id, kills, now_ns)
        {
            Ok(copied) if copied > 0 => tracing::warn!(
                "{n} kill(s) held in memory, and copied to the spill store {}: the store's file system is still full",
                self.spill
                    .side_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(
                "{n} kill(s) held in memory only: the store's file system is full and the spill store failed: {e}"
            ),
        }
    }

    /// A store error in the loop: a full file system costs the write that
    /// failed (events and samples are shed; kills are held and retried),
    /// never the recorder. Anything else ends it.
    pub fn survive(&mut self, e: StoreError) -> Result<(), StoreError> {
        if !e.is_disk_full() {
            return Err(e);
        }
        self.on_disk_full();
        Ok(())
    }

    /// Says once that the store's file system is full, and makes room.
    pub(super) fn on_disk_full(&mut self) {
        if !self.disk_full {
            self.disk_full = true;
            tracing::warn!(
                "the store's file system is full: shedding the oldest events and samples to keep kills; \
                 kills that cannot be written are held in memory and retried every second"
            );
        }
        let n = self.store.make_room();
        tracing::debug!("made room: {n} rows shed");
    }

    /// Recording into the spill store, and the store's file system has
    /// room again: what the spill store holds moves into the store, and the
    /// journal goes on there. Returns how row ids and the session changed
    /// (records already handed to exporters keep the spill store's ids).
    pub fn go_home(&mut self) -> Option<Imported> {
        let (store, imported) = self.spill.go_home(&self.store)?;
        let spill = std::mem::replace(&mut self.store, store);
        let spill_path = spill.path().to_path_buf();
        drop(spill);
        self.spill.arrived(&spill_path);
        tracing::info!(
            "{} kill(s), {} GPU OOM(s) and {} other rows moved from the spill store",
            imported.kills,
            imported.gpu_ooms,
            imported.rows
        );
        if let Some(&id) = imported.session_ids.get(&self.session_id) {
            self.session_id = id;
        }
        Some(imported)
    }

    /// Whether kills still held have somewhere to go at stop.
    pub fn has_spill_store(&self) -> bool {
        self.spill.side_path().is_some()
    }

    /// The end of the session: the spill store closed (`held` kills still
    /// unwritten) and the session ended.
    pub fn end_session(&mut self, held: usize) -> Result<(), StoreError> {
        self.spill.close(held, wall_now_ns());
        if self.spill.home().is_some() {
            tracing::warn!(
                "the store's file system is still full: this session is kept in the spill store {}, which the next start imports",
                self.store.path().display()
            );
        }
        self.store.end_session(self.session_id, wall_now_ns())
    }

    /// The exporters are given until `deadline` to hand on what they hold.
    /// Returns what each one lost.
    pub fn finish(self, deadline: std::time::Instant) -> Vec<(String, u64)> {
        self.exporters.finish(deadline)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{export::Exporter, record::Victim};

    /// What an exporter was handed: (kind, id, the victim's name).
    type Seen = Vec<(&'static str, i64, String)>;

    /// Keeps what it is handed.
    struct Keep(Arc<Mutex<Seen>>);
    impl Exporter for Keep {
        fn name(&self) -> &str {
            "keep"
        }
        fn export(&mut self, item: &Exported) -> std::io::Result<()> {
            let seen = match item {
                Exported::Kill { id, record } => ("kill", *id, record.victim.comm.clone()),
                Exported::KillUpdated { id, record } => {
                    ("updated", *id, record.victim.comm.clone())
                }
                _ => ("other", 0, String::new()),
            };
            self.0.lock().unwrap().push(seen);
            Ok(())
        }
    }

    fn kill(pid: u32, comm: &str) -> KillRecord {
        KillRecord {
            ts_ns: 1_000,
            victim: Victim {
                pid,
                comm: comm.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn every_change_of_a_stored_kill_is_stored_and_handed_on_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut store = Store::open_rw(&path).unwrap();
        let sid = store.start_session(100, "h", "6.18", "[]").unwrap();
        let kept = Arc::new(Mutex::new(Vec::new()));
        let mut ex = Exporters::default();
        ex.add(Box::new(Keep(kept.clone()))).unwrap();
        let spill = spill::Spill::new(dir.path().join("spill"), None);
        let mut j = Journal::new(store, sid, ex, spill, Arc::default(), None);

        let c = j.commit_kills(vec![kill(42, "first"), kill(43, "second")]);
        assert!(c.error.is_none() && c.held.is_empty());
        let ids: Vec<i64> = c.stored.iter().map(|(id, _)| *id).collect();
        // A change from a later join (reaping, exit memory, a report)...
        let mut out = vec![Output::KillChanged {
            id: ids[0],
            record: Box::new(kill(42, "reaped")),
        }];
        j.apply(&mut out).unwrap();
        // ...and from re-enrichment (growth, GPU ledgers).
        j.kills_rewritten(vec![(ids[1], kill(43, "grown"))])
            .unwrap();
        j.end_session(0).unwrap();
        let lost = j.finish(std::time::Instant::now() + std::time::Duration::from_secs(5));
        assert!(lost.iter().all(|(_, n)| *n == 0), "{lost:?}");

        let r = Store::open_ro(&path).unwrap();
        let mut stored: Vec<(i64, String)> = r
            .kills(0, None, 10)
            .unwrap()
            .into_iter()
            .map(|(id, k)| (id, k.victim.comm))
            .collect();
        stored.sort();
        assert_eq!(
            stored,
            [(ids[0], "reaped".into()), (ids[1], "grown".into())]
        );
        let kept = kept.lock().unwrap().clone();
        assert_eq!(
            kept,
            [
                ("kill", ids[0], "first".into()),
                ("kill", ids[1], "second".into()),
                ("updated", ids[0], "reaped".into()),
                ("updated", ids[1], "grown".into()),
            ]
        );
    }
}
