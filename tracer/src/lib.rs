//! tracer: an eBPF host and GPU-driver memory tracer.
//!
//! Data flows one way, one module per stage, and no module imports one
//! that comes after it (`tests/layers.rs` checks):
//! [`util`] (leaf helpers) -> [`probes`] (load, attach) -> [`collect`]
//! (ring buffers, kernel log, decode) -> [`model`] (processes, cgroups,
//! containers, samples) -> [`nvml`] (the GPU sampler) -> [`record`] (what is
//! stored about a kill or a GPU OOM) -> [`correlate`] (the joins) ->
//! [`store`] (SQLite) -> [`export`] -> [`recorder`] (the loop that wires
//! them) -> [`explain`] -> [`cli`] (one module per subcommand).

pub mod cli;
pub mod collect;
pub mod correlate;
pub mod explain;
pub mod export;
pub mod model;
pub mod nvml;
pub mod probes;
pub mod record;
pub mod recorder;
pub mod report;
pub mod stacks;
pub mod store;
pub mod util;
