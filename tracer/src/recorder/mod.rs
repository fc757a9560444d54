//! The recorder: the engine routes inputs (rings, kernel log, NVML, ticks)
//! to the features, whose outputs the journal writes and publishes (kills
//! durably first); upkeep keeps the store within its bounds.

pub mod engine;
pub mod features;
pub mod fold;
pub mod gauges;
pub mod growth;
pub mod heap;
pub mod journal;
pub mod metrics;
pub mod output;
pub mod summary;
pub mod upkeep;
