//! Joins NVML's view of each GPU with what tracer knows of each process:
//! its container, its host memory and memory cgroup, and the device memory
//! its traced CUDA calls hold. The difference between NVML's figure and the
//! traced one (CUDA context, caching-allocator slack, untraced libraries)
//! is shown as such, never hidden.

use std::collections::BTreeMap;

use crate::{
    model::{ProcessTable, proc::ProcFacts, sampler::Sampler},
    nvml::GpuSample,
};

use crate::record::{ContainerGpu, DevicePicture, GpuView, ProcGpu, XidNote};

/// Traced device bytes and pinned host bytes of a process on a device.
pub trait TracedMemory {
    /// Device-side bytes `pid` holds on `device` through traced calls.
    fn device_bytes(&self, pid: u32, device: u32) -> Option<u64>;
    /// Pinned host bytes `pid` holds.
    fn pinned(&self, pid: u32) -> Option<u64>;
}

/// Builds the view of one NVML sample.
pub fn build(
    sample: &GpuSample,
    model: &ProcessTable,
    sampler: Option<&Sampler>,
    traced: Option<&dyn TracedMemory>,
    procs: &dyn ProcFacts,
    now_ns: i64,
) -> GpuView {
    let mut view = GpuView::default();
    for d in &sample.devices {
        let mut processes: Vec<ProcGpu> = d
            .processes
            .iter()
            .map(|gp| {
                let p = model.get(gp.pid);
                let memcg = p.and_then(|p| p.memcg.clone());
                let cg = memcg
                    .as_deref()
                    .and_then(|m| sampler.and_then(|s| s.window(m, now_ns - 5_000_000_000).pop()));
                let traced_device = traced.and_then(|t| t.device_bytes(gp.pid, d.index));
                let pinned_host = traced.and_then(|t| t.pinned(gp.pid));
                let memcg_limit = cg.as_ref().and_then(|c| c.limit_bytes);
                ProcGpu {
                    pid: gp.pid,
                    comm: p.map(|p| p.info.comm.clone()).unwrap_or_default(),
                    container: p.and_then(|p| p.owner.short()),
                    memcg,
                    device: d.index,
                    nvml_used: gp.used,
                    traced_device,
                    unexplained: match (gp.used, traced_device) {
                        (Some(n), Some(t)) => Some(n.saturating_sub(t)),
                        _ => None,
                    },
                    pinned_host,
                    host_rss_kb: procs.status_mem(gp.pid).map(|m| m.rss_kb),
                    memcg_usage: cg.as_ref().map(|c| c.usage_bytes),
                    memcg_limit,
                    pinned_pct_of_limit: match (pinned_host, memcg_limit) {
                        (Some(p), Some(l)) if l > 0 => Some(p as f64 * 100.0 / l as f64),
                        _ => None,
                    },
                }
            })
            .collect();
        processes.sort_by_key(|p| std::cmp::Reverse(p.nvml_used.unwrap_or(0)));
        let mut groups: BTreeMap<String, ContainerGpu> = BTreeMap::new();
        for p in &processes {
            let name = p
                .container
                .clone()
                .or_else(|| p.memcg.clone())
                .unwrap_or_else(|| "(unknown cgroup)".into());
            let c = groups.entry(name.clone()).or_insert_with(|| ContainerGpu {
                name,
                device: d.index,
                kube: model.get(p.pid).and_then(|p| p.owner.kube.clone()),
                ..Default::default()
            });
            c.nvml_used += p.nvml_used.unwrap_or(0);
            c.traced_device += p.traced_device.unwrap_or(0);
            c.pids.push(p.pid);
        }
        let mut containers: Vec<ContainerGpu> = groups
            .into_values()
            .map(|mut c| {
                c.share_pct = if d.total > 0 {
                    c.nvml_used as f64 * 100.0 / d.total as f64
                } else {
                    0.0
                };
                c
            })
            .collect();
        containers.sort_by_key(|c| std::cmp::Reverse(c.nvml_used));
        view.devices.push(DevicePicture {
            device: d.index,
            uuid: d.uuid.clone(),
            pci_bus_id: d.pci_bus_id.clone(),
            ts_ns: sample.ts_ns,
            total: d.total,
            used: d.used,
            free: d.free,
            reserved: d.reserved,
            processes,
            containers,
            xids: Vec::new(),
        });
    }
    view
}

/// Xid errors are shown on their device's picture for this long.
pub const XID_SHOWN_NS: i64 = 3_600_000_000_000;

/// Puts the Xid errors of the last hour (`xids`: PCI address as the driver
/// logged it, and the note) on the picture of their device.
pub fn annotate_xids(view: &mut GpuView, xids: &[(String, XidNote)], now_ns: i64) {
    use crate::collect::kmsg::pci_key;
    for d in &mut view.devices {
        let key = pci_key(&d.pci_bus_id);
        d.xids = xids
            .iter()
            .filter(|(pci, x)| {
                key.is_some() && pci_key(pci) == key && now_ns - x.ts_ns < XID_SHOWN_NS
            })
            .map(|(_, x)| x.clone())
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::cgroup::CgroupLayout,
        nvml::{DeviceSample, GpuProcess},
    };

    struct Fixed;
    impl ProcFacts for Fixed {
        fn status_mem(&self, _pid: u32) -> Option<crate::model::proc::StatusMem> {
            None
        }
    }
    impl TracedMemory for Fixed {
        fn device_bytes(&self, pid: u32, _device: u32) -> Option<u64> {
            (pid == 4_000_001).then_some(600)
        }
        fn pinned(&self, _pid: u32) -> Option<u64> {
            None
        }
    }

    #[test]
    fn joins_nvml_with_traced_figures_and_groups_by_container() {
        let model = ProcessTable::new(CgroupLayout::default(), 0, 10);
        let sample = GpuSample {
            ts_ns: 1,
            devices: vec![DeviceSample {
                index: 0,
                total: 10_000,
                used: 1_500,
                processes: vec![
                    GpuProcess {
                        pid: 4_000_001,
                        used: Some(1_000),
                    },
                    GpuProcess {
                        pid: 4_000_002,
                        used: Some(500),
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = build(&sample, &model, None, Some(&Fixed), &Fixed, 1);
        let d = v.device(0).unwrap();
        assert_eq!(d.processes[0].pid, 4_000_001);
        assert_eq!(d.processes[0].traced_device, Some(600));
        assert_eq!(d.processes[0].unexplained, Some(400));
        assert_eq!(
            d.processes[1].traced_device, None,
            "untraced: no made-up zero"
        );
        assert_eq!(d.processes[1].unexplained, None);
        // Unknown processes share the unknown-cgroup group.
        assert_eq!(d.containers.len(), 1);
        assert_eq!(d.containers[0].nvml_used, 1_500);
        assert!((d.containers[0].share_pct - 15.0).abs() < 1e-9);
        assert_eq!(v.of_process(4_000_002).len(), 1);
        assert!(v.of_process(7).is_empty());
    }

    #[test]
    fn xids_go_on_their_device_for_an_hour() {
        let mut view = GpuView {
            devices: vec![
                DevicePicture {
                    device: 0,
                    pci_bus_id: "00000000:18:00.0".into(),
                    ..Default::default()
                },
                DevicePicture {
                    device: 1,
                    pci_bus_id: "00000000:3B:00.0".into(),
                    ..Default::default()
                },
            ],
        };
        let note = |ts_ns, code| XidNote {
            ts_ns,
            code,
            pid: None,
            message: String::new(),
        };
        let xids = vec![
            ("0000:18:00".to_string(), note(100, 31)),
            ("0000:3b:00".to_string(), note(0, 79)),
            ("0000:99:00".to_string(), note(100, 13)),
        ];
        annotate_xids(&mut view, &xids, XID_SHOWN_NS + 50);
        assert_eq!(view.devices[0].xids, vec![note(100, 31)]);
        assert!(view.devices[1].xids.is_empty(), "older than an hour");
    }
}
