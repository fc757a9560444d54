//! The GPU picture: NVML samples joined with the model and the traced
//! ledgers, folded into the timeline; NVIDIA Xid errors from the kernel
//! log; GPU OOMs completed by the first picture taken after them; and the
//! note on every record when there is no NVML.

use std::sync::Arc;

use super::Env;
use crate::{
    collect::kmsg::Xid,
    correlate::{KillEnricher, gpuview::TracedMemory, timeline::Window},
    nvml::GpuSample,
    record::EventRow,
    record::{
        DeviceRow, Gap, GpuOomRecord, GpuView, KillRecord, ProcRow, XidNote, published::Published,
    },
    recorder::output::{Output, Outputs},
};

/// Xid errors kept for the pictures of their device.
const XIDS_KEPT: usize = 64;

/// The GPU feature.
#[derive(Default)]
pub struct Gpu {
    /// NVML's latest picture, joined with the model and the ledgers.
    view: Option<GpuView>,
    /// Why there is no GPU picture, when there is none.
    nvml_missing: Option<String>,
    /// Recent Xid errors: (PCI address as logged, note).
    xids: Vec<(String, XidNote)>,
    /// Asks the NVML thread for a sample now.
    sample_now: Option<std::sync::mpsc::Sender<()>>,
    /// GPU OOMs waiting for an NVML sample taken after them: (id, record).
    awaiting: Vec<(i64, GpuOomRecord)>,
    window: Window,
    published: Option<Arc<Published>>,
    /// NVML samples taken.
    pub samples: u64,
    /// Mean and longest time a sample took, µs.
    pub sample_us: (u64, u64),
}

impl Gpu {
    /// A GPU feature: `nvml_missing` says why there is no NVML, if so;
    /// `sample_now` asks the NVML thread for a sample; the picture and the
    /// Xid counts go to `published`.
    pub fn new(
        nvml_missing: Option<String>,
        sample_now: Option<std::sync::mpsc::Sender<()>>,
        published: Option<Arc<Published>>,
    ) -> Self {
        Self {
            nvml_missing,
            sample_now,
            published,
            ..Default::default()
        }
    }

    /// An Xid error from the NVIDIA driver: stored as an event, and kept
    /// (an hour, 64 at most) for the pictures of its device.
    pub fn on_xid(&mut self, x: Xid, ts_ns: i64, out: &mut Outputs) {
        tracing::warn!("GPU {} Xid {}: {}", x.pci, x.code, x.message);
        if let Some(c) = &self.published {
            c.xids.inc(vec![
                ("pci_bus_id", x.pci.clone()),
                ("xid", x.code.to_string()),
            ]);
        }
        out.push(Output::Event(EventRow {
            ts_ns,
            kind: crate::record::GPU_XID.into(),
            pid: x.pid.unwrap_or(0),
            tid: 0,
            comm: x.name.clone().unwrap_or_default(),
            data: serde_json::to_value(&x).unwrap_or_default(),
        }));
        if self.xids.len() == XIDS_KEPT {
            self.xids.remove(0);
        }
        self.xids.push((
            x.pci.clone(),
            XidNote {
                ts_ns,
                code: x.code,
                pid: x.pid,
                message: x.message,
            },
        ));
    }

    /// An NVML sample: the new picture; timeline rows when a window of the
    /// timeline closes; GPU OOMs waiting for it completed.
    pub fn on_sample(
        &mut self,
        env: &Env<'_>,
        s: GpuSample,
        traced: Option<&dyn TracedMemory>,
        out: &mut Outputs,
    ) -> Option<(Vec<DeviceRow>, Vec<ProcRow>)> {
        if let Some(e) = &s.error {
            tracing::debug!("NVML sample: {e}");
        }
        let mut view = crate::correlate::gpuview::build(
            &s,
            env.model,
            Some(env.sampler),
            traced,
            env.procs,
            s.ts_ns,
        );
        crate::correlate::gpuview::annotate_xids(&mut view, &self.xids, s.ts_ns);
        let (mean, max) = &mut self.sample_us;
        *mean = (*mean * self.samples + s.took_us) / (self.samples + 1);
        *max = (*max).max(s.took_us);
        self.samples += 1;
        let rows = self.window.push(&view, s.ts_ns);
        for d in &s.devices {
            self.window
                .device_extras(d.index, d.util_gpu, d.temperature_c, d.power_mw);
        }
        // GPU OOMs get the first picture taken after them: who held the
        // device at that moment.
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.awaiting)
            .into_iter()
            .partition(|(_, r)| s.ts_ns >= r.ts_ns);
        self.awaiting = waiting;
        for (id, mut rec) in ready {
            if rec.device >= 0
                && let Some(d) = view.device(rec.device as u32)
            {
                rec.nvml = Some(d.clone());
                out.push(Output::GpuOomChanged {
                    id,
                    record: Box::new(rec),
                });
            }
        }
        if let Some(p) = &self.published {
            p.gpu.set(Some(view.clone()));
        }
        self.view = Some(view);
        rows
    }

    /// A GPU OOM, before it is stored: the device as the latest picture
    /// shows it, or why there is none.
    pub fn annotate_oom(&self, rec: &mut GpuOomRecord) {
        match &self.view {
            Some(v) if rec.device >= 0 => rec.nvml = v.device(rec.device as u32).cloned(),
            Some(_) => {}
            None => {
                if let Some(why) = &self.nvml_missing {
                    rec.gaps.push(format!("GPU data unavailable: {why}"));
                }
            }
        }
    }

    /// A GPU OOM was stored as row `id`: a sample is asked for now, and
    /// the record completed with it.
    pub fn oom_stored(&mut self, id: i64, rec: GpuOomRecord) {
        if let Some(now) = &self.sample_now {
            let _ = now.send(());
            self.awaiting.push((id, rec));
        }
    }

    /// The store moved: GPU OOMs waiting for a picture follow their rows.
    pub fn moved(&mut self, ids: &std::collections::HashMap<i64, i64>, session_id: i64) {
        for (id, rec) in &mut self.awaiting {
            if let Some(&to) = ids.get(id) {
                *id = to;
            }
            rec.session_id = Some(session_id);
        }
    }

    /// The timeline's open window, at stop.
    pub fn take_timeline(&mut self) -> (Vec<DeviceRow>, Vec<ProcRow>) {
        self.window.take()
    }
}

/// A kill gets its device's picture, or the note that there is none.
impl KillEnricher for Gpu {
    fn enrich(&self, kill: &mut KillRecord) {
        match &self.view {
            Some(v) => v.enrich(kill),
            // Said only of a victim that used a GPU (its CUDA calls were
            // traced): for any other, on a node with no GPU, it is noise.
            None if kill.victim.gpu.is_some() => {
                if let Some(why) = &self.nvml_missing {
                    let gap = Gap::Note(format!("GPU data unavailable: {why}"));
                    if !kill.gaps.contains(&gap) {
                        kill.gaps.push(gap);
                    }
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::kmsg::parse_xid;

    #[test]
    fn an_xid_is_stored_kept_for_its_device_and_the_kept_ones_are_bounded() {
        let mut g = Gpu::default();
        let mut out = Vec::new();
        // A line of tests/fixtures/real-logs/ev-03-xid45-python3-kernel-prefix.log.
        let line = "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149";
        for i in 0..(XIDS_KEPT as i64 + 6) {
            g.on_xid(parse_xid(line).expect("an Xid"), i, &mut out);
        }
        assert_eq!(out.len(), XIDS_KEPT + 6, "each one stored");
        let Output::Event(row) = &out[0] else {
            panic!("{:?}", out[0])
        };
        assert_eq!(row.kind, crate::record::GPU_XID);
        assert_eq!((row.pid, row.comm.as_str()), (1818990, "python3"));
        assert_eq!(row.data["code"], 45);
        assert_eq!(g.xids.len(), XIDS_KEPT);
        assert_eq!(g.xids[0].1.ts_ns, 6, "the oldest went first");
        assert_eq!(g.xids[0].0, "0000:dc:00");
    }

    #[test]
    fn without_nvml_a_kill_and_a_gpu_oom_say_why_once() {
        let g = Gpu::new(Some("no NVIDIA driver".into()), None, None);
        // A victim that never used a GPU: nothing to say.
        let mut host_only = KillRecord::default();
        g.enrich(&mut host_only);
        assert!(host_only.gaps.is_empty(), "{:?}", host_only.gaps);
        let mut k = KillRecord::default();
        k.victim.gpu = Some(Default::default());
        g.enrich(&mut k);
        g.enrich(&mut k);
        let notes: Vec<_> = k
            .gaps
            .iter()
            .filter(|x| {
                x.to_string()
                    .contains("GPU data unavailable: no NVIDIA driver")
            })
            .collect();
        assert_eq!(notes.len(), 1, "{:?}", k.gaps);
        let mut oom = GpuOomRecord::default();
        g.annotate_oom(&mut oom);
        assert_eq!(oom.gaps, ["GPU data unavailable: no NVIDIA driver"]);
        // No way to ask for a sample: nothing waits for one.
        let mut g = g;
        g.oom_stored(1, oom);
        assert!(g.awaiting.is_empty());
    }
}
