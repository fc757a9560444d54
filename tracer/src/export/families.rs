//! The recorder's metrics as families of series, built from the [`Feeds`]
//! each time they are read: the Prometheus endpoint encodes them at a
//! scrape, the OTLP exporter observes them at a push. One list, so both
//! export the same metrics under the same names and labels.

use std::path::Path;

use super::feeds::{Feeds, who};
use crate::record::{DevicePicture, published::MemcgGauge};

/// A series' labels.
pub type Labels = Vec<(&'static str, String)>;

/// A family's series.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// A monotonic count (exposed with `_total` by Prometheus).
    Counter(Vec<(Labels, u64)>),
    /// A value now.
    Gauge(Vec<(Labels, f64)>),
}

/// One metric family.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// Its name (a counter's without `_total`).
    pub name: &'static str,
    /// What it measures.
    pub help: &'static str,
    /// Its series now (none for a family nothing feeds yet).
    pub values: Values,
}

fn counter(name: &'static str, help: &'static str, s: Vec<(Labels, u64)>) -> Family {
    Family {
        name,
        help,
        values: Values::Counter(s),
    }
}

fn gauge(name: &'static str, help: &'static str, s: Vec<(Labels, f64)>) -> Family {
    Family {
        name,
        help,
        values: Values::Gauge(s),
    }
}

fn dev(d: &DevicePicture) -> Labels {
    vec![
        ("gpu", d.device.to_string()),
        ("UUID", d.uuid.clone()),
        ("pci_bus_id", d.pci_bus_id.clone()),
    ]
}

impl Feeds {
    /// Every family, with its series now (`store`: the store's file, for
    /// its size). The kill commit latency histogram and the build info are
    /// the Prometheus endpoint's own.
    pub fn families(&self, store: &Path) -> Vec<Family> {
        let m = self.metrics.counters();
        let kills = self.kills.snapshot();
        let published = &self.published;
        let mut out = vec![
            counter(
                "tracer_kills",
                "Processes killed for memory, by killer, constraint and memory cgroup (from the kills the recorder stored).",
                kills.iter().map(|(k, (n, _))| (k.labels(), *n)).collect(),
            ),
            // The kernel's OOM kills alone, as cAdvisor's
            // container_oom_events_total counts them, but kept per pod
            // container across container and recorder restarts.
            counter(
                "tracer_oom_kills",
                "Processes the kernel OOM killer killed, by constraint and memory cgroup.",
                kills
                    .iter()
                    .filter(|(k, _)| k.killer == "kernel_oom")
                    .map(|(k, (n, _))| {
                        let mut labels = k.labels();
                        labels.retain(|(name, _)| *name != "killer");
                        (labels, *n)
                    })
                    .collect(),
            ),
            gauge(
                "tracer_last_oom_kill_timestamp_seconds",
                "Wall time of the latest kill of each series, seconds since the epoch.",
                kills.iter().map(|(k, (_, at))| (k.labels(), *at)).collect(),
            ),
        ];
        out.extend(self.memcg_families());
        out.extend(self.gpu_families());
        let cuda = published.cuda.get();
        let alloc = |f: fn((u64, u64)) -> u64| {
            cuda.iter()
                .filter_map(|c| Some((who(c.kube.as_ref(), &c.container), f(c.allocator?) as f64)))
                .collect::<Vec<_>>()
        };
        out.extend([
            gauge(
                "tracer_gpu_allocator_allocated_bytes",
                "Device memory in live blocks of a container's caching allocators (PyTorch's, through their USDT probes).",
                alloc(|(allocated, _)| allocated),
            ),
            gauge(
                "tracer_gpu_allocator_reserved_bytes",
                "Device memory the processes with a traced caching allocator reserved from CUDA, per container.",
                alloc(|(_, reserved)| reserved),
            ),
            gauge(
                "tracer_gpu_container_pinned_host_bytes",
                "Pinned host memory the traced CUDA calls of a container's processes hold (page-locked, charged to its memory cgroup).",
                cuda.iter()
                    .map(|c| (who(c.kube.as_ref(), &c.container), c.pinned_host as f64))
                    .collect(),
            ),
            counter(
                "tracer_cuda_allocation_failures",
                "CUDA allocations that failed, by function and error code (2: out of memory).",
                published.cuda_failures.series(),
            ),
            counter(
                "tracer_pressure_warnings",
                "Early warnings: a memory cgroup about to reach its limit at its growth rate (reason growth), or stalling on memory (reason psi).",
                published.warnings.series(),
            ),
            counter(
                "tracer_gpu_xid_errors",
                "NVIDIA Xid errors in the kernel log, by PCI address and Xid code.",
                published.xids.series(),
            ),
            counter(
                "tracer_events",
                "Kernel events the recorder handled.",
                vec![(vec![], m.events)],
            ),
            counter(
                "tracer_events_dropped",
                "Kernel events lost because a ring buffer was full, by ring.",
                [
                    ("oom", m.drops_oom),
                    ("critical", m.drops_critical),
                    ("data", m.drops_data),
                ]
                .into_iter()
                .map(|(ring, n)| (vec![("ring", ring.to_string())], n))
                .collect(),
            ),
            counter(
                "tracer_kill_records",
                "Kill records stored (a folded SIGKILL storm is one).",
                vec![(vec![], m.kills)],
            ),
            counter(
                "tracer_gpu_oom_errors",
                "CUDA out-of-memory errors stored.",
                vec![(vec![], m.gpu_ooms)],
            ),
            counter(
                "tracer_nvml_samples",
                "NVML samples taken.",
                vec![(vec![], m.nvml_samples)],
            ),
            gauge(
                "tracer_nvml_last_sample_duration_seconds",
                "How long the latest NVML sample took.",
                vec![(vec![], m.nvml_last_us as f64 / 1e6)],
            ),
            gauge(
                "tracer_last_kill_commit_latency_seconds",
                "From the kernel's stamp of the latest kill to its durable commit.",
                vec![(vec![], m.last_kill_commit_us as f64 / 1e6)],
            ),
            gauge(
                "tracer_store_size_bytes",
                "Size of the store's database file.",
                vec![(
                    vec![],
                    std::fs::metadata(store)
                        .map(|m| m.len() as f64)
                        .unwrap_or(0.0),
                )],
            ),
        ]);
        out
    }

    /// Usage, limit and failures of the memory cgroups of containers.
    fn memcg_families(&self) -> Vec<Family> {
        let list = self.published.memcg.get();
        let labels = |m: &MemcgGauge| {
            let mut l = who(m.kube.as_ref(), &m.container);
            l.push(("cgroup", m.cgroup.clone()));
            l
        };
        vec![
            gauge(
                "tracer_memcg_usage_bytes",
                "Memory a container's cgroup uses.",
                list.iter().map(|m| (labels(m), m.usage as f64)).collect(),
            ),
            gauge(
                "tracer_memcg_limit_bytes",
                "A container's memory cgroup limit.",
                list.iter()
                    .filter_map(|m| Some((labels(m), m.limit? as f64)))
                    .collect(),
            ),
            counter(
                "tracer_memcg_failcnt",
                "Times a container's memory cgroup hit its limit (each one a reclaim, maybe an OOM kill).",
                list.iter()
                    .filter_map(|m| Some((labels(m), m.failcnt?)))
                    .collect(),
            ),
            gauge(
                "tracer_memcg_growth_armed",
                "1 while growth attribution samples the page faults of a container's memory cgroup (it, or a cgroup above it, is at risk: record --growth risk), else 0.",
                list.iter()
                    .filter_map(|m| Some((labels(m), f64::from(u8::from(m.growth_armed?)))))
                    .collect(),
            ),
            gauge(
                "tracer_memory_leak_bytes_per_second",
                "How fast a container's memory cgroup leaks: the working set's steady growth over its longest run since a restart or drop, at least 1 % of its limit an hour (16 MiB an hour without one); 0 while it does not leak.",
                list.iter()
                    .filter_map(|m| Some((labels(m), m.leak_bytes_per_second?)))
                    .collect(),
            ),
        ]
    }

    /// Per device (labels as DCGM's exporter names them: `gpu`, `UUID`,
    /// `pci_bus_id`) and per container on a device.
    fn gpu_families(&self) -> Vec<Family> {
        let view = self.published.gpu.get().unwrap_or_default();
        let per = |f: fn(&DevicePicture) -> f64| {
            view.devices
                .iter()
                .map(|d| (dev(d), f(d)))
                .collect::<Vec<_>>()
        };
        let mut nvml = Vec::new();
        let mut traced = Vec::new();
        for d in &view.devices {
            for c in &d.containers {
                let mut l = dev(d);
                l.extend(who(c.kube.as_ref(), &c.name));
                nvml.push((l.clone(), c.nvml_used as f64));
                traced.push((l, c.traced_device as f64));
            }
        }
        vec![
            gauge(
                "tracer_gpu_memory_used_bytes",
                "Device memory in use, per NVML.",
                per(|d| d.used as f64),
            ),
            gauge(
                "tracer_gpu_memory_free_bytes",
                "Device memory free, per NVML.",
                per(|d| d.free as f64),
            ),
            gauge(
                "tracer_gpu_memory_reserved_bytes",
                "Device memory the driver reserves (neither used nor free), per NVML.",
                per(|d| d.reserved as f64),
            ),
            gauge(
                "tracer_gpu_memory_total_bytes",
                "Device memory, per NVML.",
                per(|d| d.total as f64),
            ),
            gauge(
                "tracer_gpu_memory_untraced_bytes",
                "What NVML charges the processes on a device beyond what their traced CUDA calls hold (contexts, other libraries, processes not traced).",
                per(|d| {
                    d.processes
                        .iter()
                        .filter_map(|p| p.unexplained)
                        .sum::<u64>() as f64
                }),
            ),
            gauge(
                "tracer_gpu_container_memory_bytes",
                "Device memory NVML charges the processes of a container (or memory cgroup) on a device.",
                nvml,
            ),
            gauge(
                "tracer_gpu_container_traced_bytes",
                "Device memory the traced CUDA calls of a container's processes hold on a device.",
                traced,
            ),
        ]
    }
}
