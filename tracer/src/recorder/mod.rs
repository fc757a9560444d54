//! The recorder: the engine routes inputs (rings, kernel log, NVML, ticks)
//! to the features, whose outputs the journal writes and publishes (kills
//! durably first); upkeep keeps the store within its bounds.
//! [`Recorder::start`] wires it all from a [`RecorderConfig`]: probes,
//! readers, the library watcher, the NVML thread, exporters, the metrics
//! endpoint and the engine's thread.

pub mod engine;
pub mod features;
pub mod fold;
pub mod gauges;
pub mod growth;
pub mod heap;
mod heap_maps;
pub mod heap_worker;
pub mod journal;
pub mod live;
pub mod metrics;
pub mod output;
mod start;
pub mod summary;
pub mod upkeep;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

pub use start::{Recorder, Running, Stopped, Stops};

use crate::{
    export::otlp::{DescribeGpuOom, DescribeKill},
    probes::growth::GrowthOptions,
};

/// Every setting of a recording (`cli/record.rs` builds it from its flags).
#[derive(Clone, Debug)]
pub struct RecorderConfig {
    /// The store.
    pub store: PathBuf,
    /// Where kills are kept while the store's file system is full.
    pub spill_dir: PathBuf,
    /// Memory cgroups sampled even when they hold no process.
    pub cgroups: Vec<String>,
    /// Sampling period of the memory cgroups.
    pub sample_interval: Duration,
    /// Oldest data kept.
    pub retention: Duration,
    /// Largest store.
    pub max_store_bytes: u64,
    /// CUDA allocations of every process traced.
    pub cuda: bool,
    /// NVML library to load instead of the driver's.
    pub nvml_lib: Option<PathBuf>,
    /// NVML sampling period.
    pub gpu_interval: Duration,
    /// The systemd journal followed for the userspace OOM killers' reasons.
    pub follow_journal: bool,
    /// With `follow_journal`: the journal files of this directory instead
    /// of the system's.
    pub journal_dir: Option<PathBuf>,
    /// Every stored kill and GPU OOM appended to this file as JSON lines.
    pub export_jsonl: Option<PathBuf>,
    /// Words whose values are hidden in the command lines that leave the
    /// node (besides the usual secrets); `None`: sent whole.
    pub redact: Option<Vec<String>>,
    /// Prometheus metrics served at this address.
    pub metrics: Option<SocketAddr>,
    /// The bearer token the metrics endpoint asks for.
    pub metrics_token_file: Option<PathBuf>,
    /// OTLP export.
    pub otlp: Option<OtlpSettings>,
    /// Early warning this long before a memory cgroup reaches its limit
    /// (zero: off).
    pub warn_before: Duration,
    /// Early warning at this PSI `some avg10` share.
    pub warn_psi: Option<f64>,
    /// Where the host's files are (Kubernetes names).
    pub host_root: PathBuf,
    /// Memory cgroups whose processes' heaps are traced.
    pub host_cgroups: Vec<String>,
    /// Heap sampling: one sample per this many bytes allocated.
    pub sample_bytes: u64,
    /// Growth attribution.
    pub growth: GrowthOptions,
    /// Heap sampling for memory cgroups at this share of their limit.
    pub heap_on_pressure: Option<f64>,
    /// Python frames in heap and growth stacks.
    pub python_frames: bool,
    /// With `--growth risk`: the arming level, percent of the limit.
    pub growth_arm_percent: f64,
    /// With `--growth risk`: memory cgroups armed while they exist.
    pub growth_cgroups: Vec<String>,
    /// Slow leaks: a working-set point every this long.
    pub leak_step: Duration,
    /// Slow leaks: a run spans at least this long to be judged.
    pub leak_min_span: Duration,
}

impl RecorderConfig {
    /// Whether the heap family is loaded: for host cgroups, or for cgroups
    /// under pressure.
    pub fn traces_heap(&self) -> bool {
        !self.host_cgroups.is_empty() || self.heap_on_pressure.is_some()
    }
}

/// Where and how kills, GPU OOMs and metrics go over OTLP.
#[derive(Clone, Debug)]
pub struct OtlpSettings {
    /// The receiver, e.g. `http://127.0.0.1:4318`.
    pub url: String,
    /// How often the metrics are pushed.
    pub interval: Duration,
    /// Besides root, the uid whose receiver may get command lines.
    pub trusted_uid: Option<u32>,
    /// A kill's cause and summary (explain's verdict).
    pub describe_kill: DescribeKill,
    /// A GPU OOM's verdict.
    pub describe_gpu_oom: DescribeGpuOom,
}
