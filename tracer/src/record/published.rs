//! What the recorder publishes as it goes, for whoever reads it (the
//! metrics endpoint, the OTLP exporter): the latest pictures and the
//! counts of events, under neutral names.

use std::{collections::BTreeMap, sync::Mutex};

use crate::model::kube::KubeNames;

/// The latest value of something the engine publishes and a scrape
/// reads (a GPU picture, the samples of a tick), replaced whole each time.
#[derive(Debug, Default)]
pub struct Latest<T>(Mutex<T>);

impl<T: Clone> Latest<T> {
    /// Publishes a new value.
    pub fn set(&self, v: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Counters by label set, for events the engine counts as they come
/// (GPU Xid errors, failed CUDA allocations). The label sets are bounded
/// by what they name: PCI addresses and Xid codes, error codes and the
/// probed functions.
#[derive(Debug, Default)]
pub struct LabeledCounts {
    series: Mutex<BTreeMap<Vec<(&'static str, String)>, u64>>,
}

impl LabeledCounts {
    /// Adds one to the series of `labels`.
    pub fn inc(&self, labels: Vec<(&'static str, String)>) {
        let mut s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        *s.entry(labels).or_default() += 1;
    }

    /// Every series now.
    pub fn series(&self) -> Vec<(Vec<(&'static str, String)>, u64)> {
        let s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        s.iter().map(|(l, n)| (l.clone(), *n)).collect()
    }
}

/// What the traced CUDA calls of a container's processes hold, summed
/// over them: its caching allocators' figures (PyTorch's, through their
/// USDT probes) and its pinned host memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerCuda {
    /// The container, or the memory cgroup path.
    pub container: String,
    /// Its pod's names, when known.
    pub kube: Option<KubeNames>,
    /// Bytes in live blocks and bytes reserved from CUDA, when a caching
    /// allocator is traced.
    pub allocator: Option<(u64, u64)>,
    /// Pinned host memory (page-locked, charged to its memory cgroup).
    pub pinned_host: u64,
}

/// One sampled memory cgroup of a container or pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemcgGauge {
    /// The cgroup path.
    pub cgroup: String,
    /// The container (`docker 8f3c5d9e0b1a`, `pod …`).
    pub container: String,
    /// Its pod's names, when known.
    pub kube: Option<KubeNames>,
    /// Usage, bytes.
    pub usage: u64,
    /// Limit, bytes (None: unlimited).
    pub limit: Option<u64>,
    /// Times the limit was hit (v1 `failcnt`, v2 `memory.events max`).
    pub failcnt: Option<u64>,
    /// With `record --growth risk`: whether its page faults are sampled
    /// now (it, or a cgroup above it, is armed).
    pub growth_armed: Option<bool>,
    /// Its slow leak, bytes a second (0: none found; None: not watched).
    pub leak_bytes_per_second: Option<f64>,
}

/// What the engine publishes for the endpoint as it goes.
#[derive(Debug, Default)]
pub struct Published {
    /// The latest GPU picture (NVML beside the traced ledgers), replaced at
    /// every NVML sample.
    pub gpu: Latest<Option<crate::record::GpuView>>,
    /// The latest samples of the memory cgroups that belong to a container
    /// or a pod (only those: a series per cgroup of every process would
    /// not be bounded), replaced at every sampling tick.
    pub memcg: Latest<Vec<MemcgGauge>>,
    /// Traced CUDA figures per container, replaced every tick.
    pub cuda: Latest<Vec<ContainerCuda>>,
    /// NVIDIA Xid errors from the kernel log, by PCI address and code.
    pub xids: LabeledCounts,
    /// Failed CUDA allocations, by function and error code.
    pub cuda_failures: LabeledCounts,
    /// Early warnings: memory cgroups about to reach their limit.
    pub warnings: LabeledCounts,
}
