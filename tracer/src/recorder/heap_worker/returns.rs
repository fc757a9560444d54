//! Memory the followed processes give back (munmap, madvise that drops
//! pages), sent to the worker so that growth is shown net of it.

use tracer_common::growth::GrowthReturn;

use super::{HeapWorker, Msg};

impl HeapWorker {
    /// The programs that see memory given back are attached: growth
    /// reports say what each site kept, not only what it faulted in.
    pub fn returns_traced(&self) {
        self.send(Msg::ReturnsTraced);
    }

    /// A range a followed process gave back (wall time `ts_ns`).
    pub fn gave_back(&self, r: &GrowthReturn, ts_ns: u64) {
        self.send(Msg::Returned(r.header.pid, r.start, r.len, ts_ns));
    }
}
