//! tracer: an eBPF host (and later GPU-driver) memory tracer.
//!
//! Data flows one way, one module per stage:
//! [`probes`] (load, attach) -> [`collect`] (ring buffers, kernel log,
//! decode) -> [`model`] (processes, cgroups, containers, samples) ->
//! [`correlate`] (kills joined from all of them) -> [`store`] (SQLite) ->
//! [`explain`] / [`export`]. [`cli`] holds one module per subcommand.

pub mod cli;
pub mod collect;
pub mod correlate;
pub mod explain;
pub mod export;
pub mod gpu;
pub mod model;
pub mod probes;
pub mod store;
pub mod time;
pub mod util;
