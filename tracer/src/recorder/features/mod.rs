//! The recorder's features: each owns its state, takes what it needs of
//! the node through an [`Env`], and pushes [`Output`]s for the journal.
//! None sees the store, the exporters, the engine or another feature: what
//! one adds to another's kill goes through `KillEnricher`, called by the
//! engine in a visible order.
//!
//! [`Output`]: super::output::Output

pub mod arming;
pub mod cuda;
pub mod gpu;
pub mod kills;
pub mod leaks;
pub mod picture;
pub mod warnings;

use crate::{
    correlate::Context,
    model::{ProcessTable, proc::ProcFacts, sampler::Sampler},
    util::time::Clock,
};

/// What features read of the node: the clock, the process model (read
/// from /proc on demand, so mutable), the cgroup sampler, the session.
pub struct Env<'a> {
    /// Clock offsets.
    pub clock: &'a Clock,
    /// The process model.
    pub model: &'a mut ProcessTable,
    /// The cgroup sampler.
    pub sampler: &'a Sampler,
    /// The session being recorded.
    pub session_id: i64,
    /// What live processes hold now (/proc in the recorder).
    pub procs: &'a dyn ProcFacts,
}

impl Env<'_> {
    /// The correlators' context at `now_ns`.
    pub fn ctx(&self, now_ns: i64) -> Context<'_> {
        Context {
            clock: self.clock,
            model: self.model,
            sampler: self.sampler,
            session_id: Some(self.session_id),
            now_ns,
            procs: self.procs,
        }
    }
}

/// A kill in memory cgroup `path` at `ts_ns`, nothing else known (what the
/// features' enrichers read).
#[cfg(test)]
pub(crate) fn kill_in(path: &str, ts_ns: i64) -> crate::record::KillRecord {
    crate::record::KillRecord {
        ts_ns,
        memcg: Some(crate::record::MemcgAtKill {
            path: path.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The features' view of the empty node of the correlators' fixtures, with
/// a fixed clock and every process gone.
#[cfg(test)]
pub(crate) fn test_env(w: &mut crate::correlate::fixtures::World) -> Env<'_> {
    use crate::correlate::fixtures::{CLOCK, Gone};
    Env {
        clock: &CLOCK,
        model: &mut w.model,
        sampler: &w.sampler,
        session_id: 1,
        procs: &Gone,
    }
}
