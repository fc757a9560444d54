//! What `tracer top` shows at one refresh: every process and container
//! with its host, memory cgroup and GPU memory, most pressed first. The
//! plain and the full-screen views both draw these rows.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::{
    correlate::gpuview::{self, TracedMemory},
    model::{
        ProcessTable,
        cgroup::CgroupLayout,
        ledger::{AllocKind, LedgerSummary},
        proc,
        sampler::{CgroupSample, NodeMemory, read_cgroup},
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
    /// How close to its tightest limit, percent (memcg or GPU): usage
    /// over limit, not pressure.
    pub pressure_pct: f64,
    /// Its memory cgroup's PSI `some avg10`, percent (cgroup v2 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi_some_avg10: Option<f64>,
    /// Its memory cgroup's slow leak, as the recorder last said it
    /// (containers only; from the store's `memory_leak` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leak: Option<crate::record::Leak>,
}

/// The node's memory at one refresh (a JSON line of its own).
#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    /// `node`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// MemTotal, bytes.
    pub mem_total: u64,
    /// MemAvailable, bytes.
    pub mem_available: u64,
    /// PSI `some avg10` of the node, percent, where the kernel has PSI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi_some_avg10: Option<f64>,
    /// Growth of what is in use (MemTotal - MemAvailable), bytes/s, over
    /// the last refreshes.
    pub growth_bytes_per_s: Option<f64>,
    /// Seconds until MemAvailable is gone at that rate, when growing.
    pub oom_in_s: Option<f64>,
}

/// The growth rate (bytes/s) of a series of (wall ns, bytes), over its
/// last [`crate::correlate::warning::RATE_WINDOW_NS`].
pub fn rate_of(history: &VecDeque<(i64, u64)>) -> Option<f64> {
    let since = history.back()?.0 - crate::correlate::warning::RATE_WINDOW_NS;
    let samples: Vec<CgroupSample> = history
        .iter()
        .filter(|(t, _)| *t >= since)
        .map(|&(ts_ns, usage_bytes)| CgroupSample {
            ts_ns,
            usage_bytes,
            ..Default::default()
        })
        .collect();
    crate::correlate::warning::growth_rate(&samples)
}

/// The node's memory over the refreshes of one `top`: for its growth rate
/// and the time until it runs out.
#[derive(Default)]
pub struct NodeTrend {
    history: VecDeque<(i64, u64)>,
}

impl NodeTrend {
    /// Samples kept (a window of [`crate::correlate::warning::RATE_WINDOW_NS`] is used).
    const KEPT: usize = 300;

    /// The node now, with its trend.
    pub fn refresh(&mut self) -> Option<NodeRow> {
        let n = crate::model::sampler::read_node()?;
        Some(self.take(wall_now_ns(), n))
    }

    fn take(&mut self, ts_ns: i64, n: NodeMemory) -> NodeRow {
        let used = n.total.saturating_sub(n.available);
        self.history.push_back((ts_ns, used));
        if self.history.len() > Self::KEPT {
            self.history.pop_front();
        }
        let rate = rate_of(&self.history);
        NodeRow {
            kind: "node",
            mem_total: n.total,
            mem_available: n.available,
            psi_some_avg10: n.psi_some_avg10,
            growth_bytes_per_s: rate,
            oom_in_s: rate.filter(|r| *r > 0.0).map(|r| n.available as f64 / r),
        }
    }

    /// The node's line in `top`.
    pub fn line(n: &NodeRow) -> String {
        use crate::util::units::bytes;
        let used = n.mem_total.saturating_sub(n.mem_available);
        let trend = match (n.growth_bytes_per_s, n.oom_in_s) {
            (Some(r), Some(s)) => format!(
                "; growing {}/s: node out of memory in ~{s:.0} s",
                bytes(r as u64)
            ),
            (Some(r), None) if r < -1024.0 => format!("; shrinking {}/s", bytes(-r as u64)),
            (Some(_), None) => "; not growing".into(),
            (None, _) => String::new(),
        };
        let psi = n
            .psi_some_avg10
            .map(|p| format!("; PSI some {p:.1}%"))
            .unwrap_or_else(|| "; no PSI in this kernel".into());
        format!(
            "node: {} of {} in use ({:.0}%), {} available{trend}{psi}",
            bytes(used),
            bytes(n.mem_total),
            pct(used, Some(n.mem_total)),
            bytes(n.mem_available)
        )
    }
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
    let memcg = |path: &Option<String>| -> (Option<u64>, Option<u64>, Option<f64>) {
        let Some(dir) = path.as_deref().and_then(|p| layout.memcg_dir(p)) else {
            return (None, None, None);
        };
        match read_cgroup(&dir, v1, now) {
            Some(s) => (Some(s.usage_bytes), s.limit_bytes, s.psi_some_avg10),
            None => (None, None, None),
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
        let (usage, limit, psi) = memcg(&p.memcg);
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
            psi_some_avg10: psi,
            leak: None,
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
            g.psi_some_avg10 = r.psi_some_avg10;
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
    if let Some(st) = store {
        let leaks = leaks_said(st, now);
        for c in &mut containers {
            c.leak = c.memcg.as_ref().and_then(|m| leaks.get(m)).cloned();
        }
    }
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

/// The recorder says a leak again every ten steps (ten minutes by
/// default): one not said for this long is no longer shown.
const LEAK_SAID_NS: i64 = 30 * 60 * 1_000_000_000;

/// The leaks the recorder last said, by memory cgroup: the latest
/// `memory_leak` event of each, where it still leaks.
fn leaks_said(store: &Store, now: i64) -> BTreeMap<String, crate::record::Leak> {
    let mut latest: BTreeMap<String, Option<crate::record::Leak>> = BTreeMap::new();
    let rows = store
        .events(
            now - LEAK_SAID_NS,
            Some(crate::record::MEMORY_LEAK),
            None,
            100_000,
        )
        .unwrap_or_default();
    for e in rows {
        let Some(path) = e.data["memcg_path"].as_str().map(String::from) else {
            continue;
        };
        let leak = (e.data["leaking"] == true)
            .then(|| serde_json::from_value(e.data.clone()).ok())
            .flatten();
        latest.insert(path, leak);
    }
    latest
        .into_iter()
        .filter_map(|(p, l)| Some((p, l?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_row_says_when_memory_runs_out_at_its_growth_rate() {
        const GIB: u64 = 1 << 30;
        let mut t = NodeTrend::default();
        let t0 = 1_750_000_000_000_000_000i64;
        // 22 GiB in use of 24, growing 40 MiB/s.
        let mut row = None;
        for i in 0..6u64 {
            let used = 22 * GIB + i * 40 * (1 << 20);
            row = Some(t.take(
                t0 + i as i64 * 1_000_000_000,
                NodeMemory {
                    total: 24 * GIB,
                    available: 24 * GIB - used,
                    psi_some_avg10: Some(3.5),
                },
            ));
        }
        let row = row.unwrap();
        let rate = row.growth_bytes_per_s.unwrap();
        assert!((rate - 40.0 * (1 << 20) as f64).abs() < 1024.0, "{rate}");
        // 2 GiB - 200 MiB left at 40 MiB/s: 46 s.
        assert_eq!(row.oom_in_s.map(|s| s.round()), Some(46.0));
        let line = NodeTrend::line(&row);
        assert!(line.contains("node out of memory in ~46 s"), "{line}");
        assert!(line.contains("PSI some 3.5%"), "{line}");
        // A node that is not growing has no time to OOM.
        let mut flat = NodeTrend::default();
        for i in 0..3 {
            let r = flat.take(
                t0 + i * 1_000_000_000,
                NodeMemory {
                    total: 24 * GIB,
                    available: 2 * GIB,
                    psi_some_avg10: None,
                },
            );
            assert_eq!(r.oom_in_s, None);
        }
    }
}
