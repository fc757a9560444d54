//! One module per probe family.
pub mod cuda;
pub mod growth;
pub mod heap;
pub mod memcg;
pub mod oom;
pub mod sched;
pub mod signal;
pub mod usdt;
