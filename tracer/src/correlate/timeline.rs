//! The stored GPU timeline: NVML views folded into windows (the maximum of
//! each figure), written once per window, and downsampled as they age.

use std::collections::BTreeMap;

use crate::record::{DeviceRow, GpuView, ProcRow};

/// Resolution of fresh timeline rows, seconds.
pub const FRESH_RES_S: i64 = 10;
/// Resolution rows get once older than [`DOWNSAMPLE_AFTER_NS`], seconds.
pub const AGED_RES_S: i64 = 60;
/// Age at which rows are downsampled.
pub const DOWNSAMPLE_AFTER_NS: i64 = 3_600_000_000_000;

/// The window being filled.
#[derive(Default)]
pub struct Window {
    start_ns: Option<i64>,
    devices: BTreeMap<u32, DeviceRow>,
    procs: BTreeMap<(u32, u32), ProcRow>,
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl Window {
    /// Folds a view in; returns the finished window's rows when `ts_ns`
    /// starts a new one.
    pub fn push(&mut self, view: &GpuView, ts_ns: i64) -> Option<(Vec<DeviceRow>, Vec<ProcRow>)> {
        let len = FRESH_RES_S * 1_000_000_000;
        let start = ts_ns - ts_ns.rem_euclid(len);
        let done = match self.start_ns {
            Some(s) if s != start => Some(self.take()),
            _ => None,
        };
        self.start_ns = Some(start);
        for d in &view.devices {
            let row = self.devices.entry(d.device).or_insert_with(|| DeviceRow {
                ts_ns: start,
                device: d.device,
                ..Default::default()
            });
            row.total = row.total.max(d.total);
            row.used = row.used.max(d.used);
            for p in &d.processes {
                let r = self
                    .procs
                    .entry((d.device, p.pid))
                    .or_insert_with(|| ProcRow {
                        ts_ns: start,
                        device: d.device,
                        pid: p.pid,
                        comm: p.comm.clone(),
                        container: p.container.clone().or_else(|| p.memcg.clone()),
                        ..Default::default()
                    });
                r.nvml_used = max_opt(r.nvml_used, p.nvml_used);
                r.traced_device = max_opt(r.traced_device, p.traced_device);
                r.pinned_host = max_opt(r.pinned_host, p.pinned_host);
                r.host_rss_kb = max_opt(r.host_rss_kb, p.host_rss_kb);
                r.memcg_usage = max_opt(r.memcg_usage, p.memcg_usage);
                r.memcg_limit = max_opt(r.memcg_limit, p.memcg_limit);
            }
        }
        done
    }

    /// Adds per-device figures NVML gives beside memory.
    pub fn device_extras(
        &mut self,
        device: u32,
        util_gpu: Option<u32>,
        temperature_c: Option<u32>,
        power_mw: Option<u32>,
    ) {
        if let Some(r) = self.devices.get_mut(&device) {
            let m = |a: Option<u32>, b: Option<u32>| {
                max_opt(a.map(u64::from), b.map(u64::from)).map(|v| v as u32)
            };
            r.util_gpu = m(r.util_gpu, util_gpu);
            r.temperature_c = m(r.temperature_c, temperature_c);
            r.power_mw = m(r.power_mw, power_mw);
        }
    }

    /// The rows gathered so far, emptying the window.
    pub fn take(&mut self) -> (Vec<DeviceRow>, Vec<ProcRow>) {
        self.start_ns = None;
        (
            std::mem::take(&mut self.devices).into_values().collect(),
            std::mem::take(&mut self.procs).into_values().collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{DevicePicture, ProcGpu};

    fn view(used: u64, proc_used: u64) -> GpuView {
        GpuView {
            devices: vec![DevicePicture {
                device: 0,
                total: 100,
                used,
                processes: vec![ProcGpu {
                    pid: 7,
                    comm: "p".into(),
                    nvml_used: Some(proc_used),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn folds_a_window_by_maximum_and_emits_it_when_the_next_starts() {
        let mut w = Window::default();
        let s = 1_000 * 1_000_000_000;
        assert!(w.push(&view(10, 5), s).is_none());
        assert!(w.push(&view(30, 2), s + 3_000_000_000).is_none());
        w.device_extras(0, Some(50), None, Some(1000));
        let (d, p) = w
            .push(&view(1, 1), s + 10_000_000_000)
            .expect("a finished window");
        assert_eq!((d[0].ts_ns, d[0].used, d[0].util_gpu), (s, 30, Some(50)));
        assert_eq!(p[0].nvml_used, Some(5));
        let (d, _) = w.take();
        assert_eq!(d[0].used, 1, "the new window holds the last view");
    }
}
