//! The recorder's CUDA side: the library watcher that attaches to every
//! distinct CUDA library on the node, and the ledgers of the processes that
//! use them (the CUDA correlator), whose snapshots it stores.

use crate::{
    correlate::cuda::CudaLedgers,
    probes::{Probes, uprobe::CUDA, watch::LibraryWatcher},
    record::LedgerSnapshot,
    store::{Store, StoreError},
    util::{term::escape, units::bytes},
};

/// The node-wide CUDA tracing state of the recorder.
pub struct GpuTracker {
    /// Finds and attaches to CUDA libraries, off the engine's thread.
    watcher: LibraryWatcher,
    /// The ledgers.
    pub ledgers: CudaLedgers,
}

fn store_snapshot(store: &Store, session: i64, s: &LedgerSnapshot) -> Result<(), StoreError> {
    store.insert_ledger(session, s.ts_ns, s.pid, &s.comm, s.at_exit, &s.ledger)
}

impl GpuTracker {
    /// Takes the loaded probes (the CUDA programs must be loaded) and
    /// attaches to the CUDA libraries every process has now; the watcher
    /// goes on finding new ones on its own thread.
    pub fn new(probes: Probes) -> std::io::Result<Self> {
        Ok(Self {
            watcher: LibraryWatcher::spawn(probes, &CUDA)?,
            ledgers: CudaLedgers::default(),
        })
    }

    /// A process exec'd: its libraries are looked at a few times as it starts.
    pub fn on_exec(&mut self, pid: u32, _now_ns: i64) {
        self.watcher.on_exec(pid);
    }

    /// Periodic work: ledger snapshots stored, long-gone processes forgotten.
    pub fn tick(&mut self, store: &Store, session: i64, now_ns: i64) -> Result<(), StoreError> {
        for s in self.ledgers.tick(now_ns) {
            store_snapshot(store, session, &s)?;
        }
        Ok(())
    }

    /// A process ended: its final ledger (what it never freed) is stored.
    pub fn on_exit(
        &mut self,
        store: &Store,
        session: i64,
        pid: u32,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let Some(s) = self.ledgers.on_exit(pid, now_ns) else {
            return Ok(());
        };
        if s.ledger.live_allocations > 0 {
            tracing::info!(
                "CUDA: pid {pid} ({}) exited holding {} in {} allocations",
                escape(&s.comm),
                bytes(s.ledger.total_bytes),
                s.ledger.live_allocations
            );
        }
        store_snapshot(store, session, &s)
    }

    /// GPU out-of-memory failures recorded.
    pub fn ooms(&self) -> u64 {
        self.ledgers.ooms
    }

    /// Stops the watcher and removes every probe (slow: a kernel grace
    /// period per uprobe).
    pub fn detach(self) {
        self.watcher.stop();
    }
}
