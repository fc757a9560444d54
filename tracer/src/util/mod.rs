//! Leaf helpers with no dependency on the rest of the crate.

pub mod fsafe;
pub mod out;
pub mod term;
