//! The recorder's CUDA side: the ledgers of the processes that use CUDA
//! (the CUDA correlator), whose snapshots it stores. The library watcher
//! that attaches to every distinct CUDA library is the engine's (it serves
//! the heap family too).

use crate::{
    correlate::cuda::CudaLedgers,
    record::LedgerSnapshot,
    store::{Store, StoreError},
    util::{term::escape, units::bytes},
};

/// The node-wide CUDA tracing state of the recorder.
#[derive(Default)]
pub struct GpuTracker {
    /// The ledgers.
    pub ledgers: CudaLedgers,
}

fn store_snapshot(store: &Store, session: i64, s: &LedgerSnapshot) -> Result<(), StoreError> {
    store.insert_ledger(session, s.ts_ns, s.pid, &s.comm, s.at_exit, &s.ledger)
}

impl GpuTracker {
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
}
