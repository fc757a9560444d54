//! The GPU picture: NVML samples joined with the model and the traced
//! ledgers, folded into the timeline; NVIDIA Xid errors from the kernel
//! log; GPU OOMs completed by the first picture taken after them; and the
//! note on every record when there is no NVML.

use std::sync::Arc;

use tracer_common::ProcExit;

use super::Env;
use crate::{
    collect::kmsg::{Xid, catalogue::meaning_of, pci_key},
    correlate::{KillEnricher, gpuview::TracedMemory, timeline::Window},
    nvml::GpuSample,
    record::EventRow,
    record::{
        DeviceRow, Gap, GpuFault, GpuOomRecord, GpuView, KillRecord, ProcRow, XidNote,
        published::Published,
    },
    recorder::output::{Output, Outputs},
};

/// Xid errors kept for the pictures of their device.
const XIDS_KEPT: usize = 64;
/// A GPU process's abnormal end this soon after an Xid that hits the
/// applications on its GPU is put down to the Xid.
const FAULT_TO_DEATH_NS: i64 = 60_000_000_000;
/// The same Xid (device and code) from the kernel log and from NVML's
/// events, this close in time, is one error.
const SAME_XID_NS: i64 = 5_000_000_000;
/// An Xid received this long after a process's end may still be its
/// cause: NVML's event is stamped when received, not when it happened.
const XID_STAMP_SLACK_NS: i64 = 1_000_000_000;
/// A GPU process's abnormal end no Xid explains yet is looked at again as
/// Xids come, this long: the kernel log, NVML and the rings are read by
/// separate tasks, so the Xid can come second.
const LATE_XID_NS: i64 = 5_000_000_000;
/// Such ends kept at most.
const EXITS_HELD: usize = 64;

/// The GPU feature.
#[derive(Default)]
pub struct Gpu {
    /// NVML's latest picture, joined with the model and the ledgers.
    view: Option<GpuView>,
    /// Why there is no GPU picture, when there is none.
    nvml_missing: Option<String>,
    /// Recent Xid errors: (PCI address as logged, note).
    xids: Vec<(String, XidNote)>,
    /// Abnormal ends of GPU processes waiting for a late Xid: (exit, wall ns).
    held_exits: Vec<(ProcExit, i64)>,
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
        let key = pci_key(&x.pci);
        if let Some((_, kept)) = self.xids.iter_mut().find(|(pci, n)| {
            n.code == x.code && pci_key(pci) == key && (n.ts_ns - ts_ns).abs() < SAME_XID_NS
        }) {
            // The kernel log names the process where NVML's event does not.
            kept.pid = kept.pid.or(x.pid);
            tracing::debug!(
                "GPU {} Xid {} reported twice (kernel log and NVML)",
                x.pci,
                x.code
            );
            return;
        }
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

    /// The Xid a GPU process `pid` that ended abnormally at `ts_ns` (with
    /// wait(2) status `exit_code`) most likely died of: the latest one
    /// that hits applications, in the minute before, on a GPU the process
    /// held memory on (in the latest picture) or naming it.
    pub fn fault_before(&self, pid: u32, exit_code: i32, ts_ns: i64) -> Option<GpuFault> {
        if self.xids.is_empty() {
            return None;
        }
        let devices: Vec<_> = self
            .view
            .iter()
            .flat_map(|v| v.holding(pid))
            .filter_map(|d| pci_key(&d.pci_bus_id))
            .collect();
        let (pci, xid) = self.xids.iter().rev().find(|(pci, x)| {
            let here = x.pid == Some(pid) || pci_key(pci).is_some_and(|k| devices.contains(&k));
            let hits = meaning_of(x.code).is_some_and(|m| m.apps_affected == Some(true));
            here && hits
                && x.ts_ns <= ts_ns + XID_STAMP_SLACK_NS
                && ts_ns - x.ts_ns <= FAULT_TO_DEATH_NS
        })?;
        Some(GpuFault {
            pci: pci.clone(),
            xid: xid.clone(),
            meaning: meaning_of(xid.code).map(|m| m.what.to_string()),
            exit: crate::util::sys::exit_text(exit_code),
        })
    }

    /// An abnormal end no Xid explains now, of a process on a GPU: held
    /// for an Xid that comes late ([`LATE_XID_NS`]).
    pub fn hold_exit(&mut self, x: &ProcExit, ts_ns: i64) {
        let on_gpu = self
            .view
            .as_ref()
            .is_some_and(|v| v.holding(x.pid).next().is_some());
        if on_gpu {
            if self.held_exits.len() == EXITS_HELD {
                self.held_exits.remove(0);
            }
            self.held_exits.push((*x, ts_ns));
        }
    }

    /// The held ends an Xid now explains, taken out, with their faults;
    /// ends held past [`LATE_XID_NS`] are let go.
    pub fn late_faults(&mut self, now_ns: i64) -> Vec<(ProcExit, i64, GpuFault)> {
        let mut found = Vec::new();
        let held = std::mem::take(&mut self.held_exits);
        for (x, ts) in held {
            match self.fault_before(x.pid, x.exit_code, ts) {
                Some(f) => found.push((x, ts, f)),
                None if now_ns - ts < LATE_XID_NS => self.held_exits.push((x, ts)),
                None => {}
            }
        }
        found
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
        // Each one SAME_XID_NS after the last: a new error, not a repeat.
        for i in 0..(XIDS_KEPT as i64 + 6) {
            g.on_xid(parse_xid(line).expect("an Xid"), i * SAME_XID_NS, &mut out);
        }
        assert_eq!(out.len(), XIDS_KEPT + 6, "each one stored");
        let Output::Event(row) = &out[0] else {
            panic!("{:?}", out[0])
        };
        assert_eq!(row.kind, crate::record::GPU_XID);
        assert_eq!((row.pid, row.comm.as_str()), (1818990, "python3"));
        assert_eq!(row.data["code"], 45);
        assert_eq!(g.xids.len(), XIDS_KEPT);
        assert_eq!(g.xids[0].1.ts_ns, 6 * SAME_XID_NS, "the oldest went first");
        assert_eq!(g.xids[0].0, "0000:dc:00");
    }

    #[test]
    fn an_abnormal_end_after_an_xid_that_hits_apps_on_its_gpu_is_put_down_to_it() {
        use crate::record::{DevicePicture, ProcGpu};
        const S: i64 = 1_000_000_000;
        let mut g = Gpu {
            view: Some(GpuView {
                devices: vec![DevicePicture {
                    pci_bus_id: "00000000:18:00.0".into(),
                    processes: vec![ProcGpu {
                        pid: 10,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            }),
            ..Default::default()
        };
        let mut out = Vec::new();
        let xid = |pci: &str, code, pid| Xid {
            pci: pci.into(),
            code,
            pid,
            message: "m".into(),
            ..Default::default()
        };
        // NVML's event first (no pid), then the kernel log's line of the
        // same error: one error, which the log's pid completes.
        g.on_xid(xid("00000000:18:00.0", 79, None), 100 * S, &mut out);
        g.on_xid(xid("0000:18:00", 79, Some(10)), 100 * S + S / 2, &mut out);
        assert_eq!(out.len(), 1, "stored once");
        assert_eq!(g.xids[0].1.pid, Some(10));
        let f = g
            .fault_before(10, libc::SIGABRT | 0x80, 102 * S)
            .expect("a fault");
        assert_eq!((f.xid.code, f.pci.as_str()), (79, "00000000:18:00.0"));
        assert_eq!(f.exit, "killed by SIGABRT (core dumped)");
        assert!(f.meaning.unwrap().contains("fallen off the bus"));
        // A minute later, or before the Xid: not its cause.
        assert!(g.fault_before(10, 1 << 8, 161 * S).is_none());
        assert!(g.fault_before(10, 1 << 8, 98 * S).is_none());
        // A process on no GPU, not named by the Xid.
        assert!(g.fault_before(11, 1 << 8, 102 * S).is_none());
        // An Xid that hits no application (63: a page retired) is no cause,
        // though the process is on that GPU; one naming a process on
        // another GPU is.
        let mut g2 = Gpu {
            view: g.view.clone(),
            ..Default::default()
        };
        g2.on_xid(xid("0000:18:00", 63, None), 100 * S, &mut out);
        assert!(g2.fault_before(10, 1 << 8, 101 * S).is_none());
        g2.on_xid(xid("0000:3b:00", 31, Some(12)), 100 * S, &mut out);
        assert_eq!(
            g2.fault_before(12, 1 << 8, 101 * S).map(|f| f.xid.code),
            Some(31)
        );

        // An end read before its Xid: held, and explained when the Xid
        // comes; one on no GPU is not held; none is held past 5 s.
        let mut g3 = Gpu {
            view: g.view.clone(),
            ..Default::default()
        };
        let end = |pid| ProcExit {
            pid,
            exit_code: 1 << 8,
            exit_known: 1,
            ..Default::default()
        };
        g3.hold_exit(&end(10), 200 * S);
        g3.hold_exit(&end(11), 200 * S);
        assert_eq!(g3.held_exits.len(), 1);
        assert!(g3.late_faults(201 * S).is_empty());
        g3.on_xid(xid("0000:18:00", 48, None), 200 * S - S / 10, &mut out);
        let late = g3.late_faults(201 * S);
        assert_eq!(late.len(), 1);
        assert_eq!((late[0].0.pid, late[0].2.xid.code), (10, 48));
        g3.hold_exit(&end(10), 300 * S);
        assert!(g3.late_faults(306 * S).is_empty());
        assert!(g3.held_exits.is_empty());
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
