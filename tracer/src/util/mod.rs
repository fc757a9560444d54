//! Leaf helpers with no dependency on the rest of the crate.

pub mod fsafe;
pub mod handoff;
pub mod out;
pub mod sys;
pub mod term;
pub mod time;
pub mod units;
