//! Growth samples in the heap tracer's thread: sampled page faults unwound,
//! named when first seen, summed per stack; the report of a window; the
//! stack that tipped an OOM kill. They share the heap tracer's unwinders
//! and names (one cache of parsed files and symbols per process).

use std::collections::HashMap;

use tracer_common::growth::{FAULT_KERNEL, GrowthSample, RESERVE};

use super::heap::HeapTracer;
use crate::{
    probes::heap::weight,
    record::{GrowthReport, GrowthSite, TipStack},
    stacks::symbols::Frame,
};

/// Seconds of growth a kill carries (the minute before it).
pub const KILL_WINDOW_S: u64 = 60;
/// Seconds of samples kept for windows (older ones stay in the totals).
pub const KEEP_S: u64 = 300;

impl HeapTracer {
    /// Sets the mean bytes between growth samples the programs run with.
    pub fn set_growth_sample_bytes(&mut self, b: u64) {
        self.growth_sample_bytes = b;
    }

    /// A sampled fault, or a reservation (wall time `ts_ns`).
    pub fn fault(&mut self, s: &GrowthSample, ts_ns: u64) {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        if s.func == RESERVE {
            // At the system call: libc's mmap wrapper belongs to its caller.
            self.trim_allocator(pid, &mut frames);
            if let Some(id) = self.reserve.add(pid, frames, s.size as f64, ts_ns)
                && !self.reserve_named.contains_key(&id)
            {
                let frames = self.reserve.frames(id).to_vec();
                let exact = frames.first() == Some(&s.ip);
                let names = self.name_exact_first(pid, &frames, exact);
                self.reserve_named.insert(id, names);
            }
            return;
        }
        // A fault in a kernel-mode copy is reported at the system call;
        // either way, faults in the C library's string functions and the
        // allocators belong to their caller.
        self.trim_allocator(pid, &mut frames);
        if frames.len() < 2 {
            *self.growth_shallow.entry(pid).or_default() += 1;
        }
        let w = weight(s.size, s.how, self.growth_sample_bytes);
        if let Some(id) = self.growth.add(pid, frames, w, ts_ns)
            && !self.growth_named.contains_key(&id)
        {
            let frames = self.growth.frames(id).to_vec();
            // The first frame is the faulting instruction itself (user
            // faults), or the system call's return point (kernel-mode
            // faults); untrimmed or not, naming it as is lands in its
            // function.
            let exact = s.func != FAULT_KERNEL || frames.first() == Some(&s.ip);
            let names = self.name_exact_first(pid, &frames, exact);
            self.growth_named.insert(id, names);
        }
    }

    /// The stack of a task that tipped an OOM kill.
    pub fn tip(&mut self, s: &GrowthSample) -> TipStack {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        self.trim_allocator(pid, &mut frames);
        let exact = frames.first() == Some(&s.ip);
        TipStack {
            pid,
            tid: s.header.tid,
            comm: crate::collect::decode::c_str(&s.header.comm),
            frames: self.name_exact_first(pid, &frames, exact),
            victim_is_trigger: pid == s.addr as u32,
        }
    }

    /// Where `pid` grew in the `window_s` seconds up to `until_ns`: the
    /// `top` sites by bytes.
    pub fn growth_report(
        &mut self,
        pid: u32,
        comm: &str,
        until_ns: u64,
        window_s: u64,
        top: usize,
    ) -> GrowthReport {
        let window_ns = window_s * 1_000_000_000;
        let (listed, bytes, samples, more_sites) = sites_of(
            &self.growth,
            &self.growth_named,
            pid,
            until_ns,
            window_ns,
            top,
        );
        let (reserved, reserved_bytes, _, _) = sites_of(
            &self.reserve,
            &self.reserve_named,
            pid,
            until_ns,
            window_ns,
            top.min(3),
        );
        GrowthReport {
            pid,
            comm: comm.to_string(),
            until_ns,
            window_s,
            sample_bytes: self.growth_sample_bytes,
            bytes,
            samples,
            total_bytes: self.growth.total(pid).0.round() as u64,
            sites: listed,
            more_sites,
            shallow_samples: self.growth_shallow.get(&pid).copied().unwrap_or(0),
            lost_samples: 0,
            reserved_bytes,
            reserved,
        }
    }

    /// Whether `pid` has growth samples or reservations.
    pub fn has_growth(&self, pid: u32) -> bool {
        self.growth.total(pid).1 > 0 || self.reserve.total(pid).1 > 0
    }

    /// Drops growth samples too old for any window.
    pub fn prune_growth(&mut self, now_ns: u64) {
        self.growth.prune(now_ns, KEEP_S * 1_000_000_000);
        self.reserve.prune(now_ns, KEEP_S * 1_000_000_000);
    }
}

/// The `top` sites of `pid` in a window of `profile`, named; with the
/// window's bytes, samples and the sites left out.
fn sites_of(
    profile: &crate::correlate::growth::GrowthProfile,
    named: &HashMap<crate::correlate::heap::StackId, Vec<Frame>>,
    pid: u32,
    until_ns: u64,
    window_ns: u64,
    top: usize,
) -> (Vec<GrowthSite>, u64, u64, usize) {
    let sites = profile.window(pid, until_ns, window_ns);
    let (bytes, samples) = sites
        .iter()
        .fold((0.0, 0), |(b, n), v| (b + v.bytes, n + v.samples));
    let more = sites.len().saturating_sub(top);
    let listed = sites
        .into_iter()
        .take(top)
        .map(|v| GrowthSite {
            frames: named
                .get(&v.stack)
                .cloned()
                .unwrap_or_else(|| vec![Frame::default(); profile.frames(v.stack).len().min(1)]),
            bytes: v.bytes.round() as u64,
            samples: v.samples,
        })
        .collect();
    (listed, bytes.round() as u64, samples, more)
}
