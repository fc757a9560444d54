//! What `tracer top` shows at one refresh: every process and container
//! with its host, memory cgroup and GPU memory, most pressed first. The
//! plain and the full-screen views both draw these rows.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    correlate::gpuview::{self, TracedMemory},
    model::{
        ProcessTable,
        cgroup::CgroupLayout,
        ledger::{AllocKind, LedgerSummary},
        proc,
        sampler::read_cgroup,
    },
    nvml,
    record::GpuView,
    store::Store,
    util::time::wall_now_ns,
};

/// One row: a process or a container.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    /// `process` or `container`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Process name or container.
    pub name: String,
    /// Pid (processes).
    pub pid: Option<u32>,
    /// Pids (containers).
    pub pids: Vec<u32>,
    /// Container of a process.
    pub container: Option<String>,
    /// Its memory cgroup (a container's: its processes').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcg: Option<String>,
    /// Host RSS, bytes (a container: its processes').
    pub host_rss: u64,
    /// Memory cgroup usage, bytes.
    pub memcg_usage: Option<u64>,
    /// Memory cgroup limit, bytes.
    pub memcg_limit: Option<u64>,
    /// GPU memory per NVML, bytes, all devices.
    pub gpu_nvml: u64,
    /// GPU memory its traced calls hold, bytes (from the recorder's store).
    pub gpu_traced: Option<u64>,
    /// Pinned host memory (traced), bytes.
    pub pinned_host: Option<u64>,
    /// GPU memory in live blocks of its caching allocator (PyTorch's,
    /// through its probes), bytes; what it reserved is in `gpu_traced`.
    pub gpu_allocated: Option<u64>,
    /// How close to its tightest limit, percent (memcg or GPU).
    pub pressure_pct: f64,
}

/// Traced figures from the recorder's latest ledger snapshots.
struct StoredLedgers(BTreeMap<u32, LedgerSummary>);

impl TracedMemory for StoredLedgers {
    fn device_bytes(&self, pid: u32, device: u32) -> Option<u64> {
        self.0
            .get(&pid)
            .map(|l| l.by_device.get(&(device as i32)).copied().unwrap_or(0))
    }
    fn pinned(&self, pid: u32) -> Option<u64> {
        self.0.get(&pid).map(|l| {
            l.by_kind
                .get(&AllocKind::PinnedHost)
                .map(|t| t.outstanding)
                .unwrap_or(0)
        })
    }
}

/// `used` as a percentage of `limit` (0 without a limit).
pub fn pct(used: u64, limit: Option<u64>) -> f64 {
    match limit {
        Some(l) if l > 0 => used as f64 * 100.0 / l as f64,
        _ => 0.0,
    }
}

/// One refresh: every row, most pressed first, and the GPU view. `kube`
/// names pods; it is kept from one refresh to the next (what it learnt,
/// and when it last looked).
pub fn snapshot(
    store: Option<&Store>,
    nvml: Option<&nvml_wrapper::Nvml>,
    rows: usize,
    kube: &mut Option<crate::model::kube::KubeResolver>,
) -> (Vec<Row>, GpuView) {
    let layout = CgroupLayout::detect();
    let v1 = layout.memory_is_v1();
    let mut model = ProcessTable::new(layout.clone(), 0, 1 << 20);
    if let Some(k) = kube.take() {
        model.set_kube(k);
    }
    model.seed();
    *kube = model.take_kube();
    let now = wall_now_ns();
    let sample = nvml.map(nvml::sample);
    let ledgers = StoredLedgers(match (store, &sample) {
        (Some(st), Some(s)) => s
            .devices
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.pid))
            .filter_map(|pid| Some((pid, st.ledger_at(pid, now).ok()??)))
            .collect(),
        _ => BTreeMap::new(),
    });
    let traced = (!ledgers.0.is_empty()).then_some(&ledgers as &dyn TracedMemory);
    let view = sample
        .as_ref()
        .map(|s| gpuview::build(s, &model, None, traced, &crate::model::proc::LiveProc, now))
        .unwrap_or_default();
    let memcg = |path: &Option<String>| -> (Option<u64>, Option<u64>) {
        let Some(dir) = path.as_deref().and_then(|p| layout.memcg_dir(p)) else {
            return (None, None);
        };
        match read_cgroup(&dir, v1, now) {
            Some(s) => (Some(s.usage_bytes), s.limit_bytes),
            None => (None, None),
        }
    };
    // Processes: every one on a GPU, and the largest by RSS.
    let mut procs: Vec<Row> = Vec::new();
    for p in model.live() {
        let rss = proc::read_status_mem(p.info.pid)
            .map(|m| m.rss_kb * 1024)
            .unwrap_or(0);
        let on_gpu: Vec<_> = view
            .devices
            .iter()
            .flat_map(|d| {
                d.processes
                    .iter()
                    .filter(|g| g.pid == p.info.pid)
                    .map(move |g| (d, g))
            })
            .collect();
        let gpu_nvml: u64 = on_gpu.iter().map(|(_, g)| g.nvml_used.unwrap_or(0)).sum();
        let gpu_pct = on_gpu
            .iter()
            .map(|(d, _)| pct(d.used, Some(d.total)))
            .fold(0.0, f64::max);
        let (usage, limit) = memcg(&p.memcg);
        let traced: Option<u64> = if on_gpu.is_empty() {
            None
        } else {
            on_gpu.iter().map(|(_, g)| g.traced_device).sum()
        };
        procs.push(Row {
            kind: "process",
            name: p.info.comm.clone(),
            pid: Some(p.info.pid),
            pids: vec![p.info.pid],
            container: p.owner.short().or_else(|| p.memcg.clone()),
            memcg: p.memcg.clone(),
            host_rss: rss,
            memcg_usage: usage,
            memcg_limit: limit,
            gpu_nvml,
            gpu_traced: traced,
            pinned_host: ledgers.pinned(p.info.pid),
            gpu_allocated: ledgers
                .0
                .get(&p.info.pid)
                .and_then(|l| l.allocator.as_ref())
                .map(|a| a.allocated),
            pressure_pct: pct(usage.unwrap_or(0), limit).max(gpu_pct),
        });
    }
    // Containers: processes grouped by container (or memory cgroup).
    let mut groups: BTreeMap<String, Row> = BTreeMap::new();
    for r in &procs {
        let key = r.container.clone().unwrap_or_else(|| "(no cgroup)".into());
        let g = groups.entry(key.clone()).or_insert_with(|| Row {
            kind: "container",
            name: key,
            ..Default::default()
        });
        g.pids.push(r.pid.unwrap_or(0));
        g.host_rss += r.host_rss;
        g.gpu_nvml += r.gpu_nvml;
        g.gpu_traced = match (g.gpu_traced, r.gpu_traced) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        g.gpu_allocated = match (g.gpu_allocated, r.gpu_allocated) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        // Processes of one container share its memory cgroup, or its parent.
        if g.memcg_usage.is_none() {
            (g.memcg_usage, g.memcg_limit) = (r.memcg_usage, r.memcg_limit);
            g.memcg = r.memcg.clone();
        }
        g.pressure_pct = g.pressure_pct.max(r.pressure_pct);
    }
    let by_pressure = |a: &Row, b: &Row| {
        b.pressure_pct
            .total_cmp(&a.pressure_pct)
            .then(b.gpu_nvml.cmp(&a.gpu_nvml))
            .then(b.host_rss.cmp(&a.host_rss))
    };
    let mut containers: Vec<Row> = groups
        .into_values()
        .filter(|g| g.name != "/" && g.name != "(no cgroup)")
        .collect();
    containers.sort_by(by_pressure);
    procs.sort_by(by_pressure);
    let gpu_pids: Vec<u32> = view
        .devices
        .iter()
        .flat_map(|d| d.processes.iter().map(|p| p.pid))
        .collect();
    let mut shown: Vec<Row> = procs
        .iter()
        .filter(|p| gpu_pids.contains(&p.pid.unwrap_or(0)))
        .cloned()
        .collect();
    shown.extend(
        procs
            .into_iter()
            .filter(|p| !gpu_pids.contains(&p.pid.unwrap_or(0)))
            .take(rows.saturating_sub(shown.len())),
    );
    shown.sort_by(by_pressure);
    containers.extend(shown);
    (containers, view)
}
