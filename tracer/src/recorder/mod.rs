//! The recorder's loop and its wiring: inputs (rings, kernel log, NVML,
//! ticks) go to the model and the correlators, what they make goes to the
//! store (kills durably first).

pub mod cuda;
pub mod engine;
pub mod fold;
pub mod growth;
pub mod heap;
pub mod metrics;
pub mod spill;
