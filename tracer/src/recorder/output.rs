//! What the features make, for the journal to write and publish. New kills
//! and new GPU OOMs are not here: their row ids go back to the features
//! that keep them, so the engine hands them to the journal itself.

use crate::{
    record::{GpuOomRecord, KillRecord, LedgerSnapshot, PressureEvent},
    store::{DropRow, EventRow},
};

/// One thing to write.
#[derive(Debug)]
pub enum Output {
    /// An event row (buffered; written with the next kill or flush).
    Event(EventRow),
    /// A stored kill whose record changed: stored again and handed on
    /// again, whatever changed it.
    KillChanged {
        /// Its row id.
        id: i64,
        /// The record as it is now.
        record: Box<KillRecord>,
    },
    /// A stored GPU OOM completed by a later NVML picture.
    GpuOomChanged {
        /// Its row id.
        id: i64,
        /// The record as it is now.
        record: Box<GpuOomRecord>,
    },
    /// A CUDA ledger snapshot (periodic, or a process's last).
    Ledger(LedgerSnapshot),
    /// Events lost on a ring.
    Drops(DropRow),
    /// An early warning about a memory cgroup, or its end.
    Pressure(PressureEvent),
}

/// What the features made, in the order they made it.
pub type Outputs = Vec<Output>;
