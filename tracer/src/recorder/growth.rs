//! Growth samples in the heap tracer's thread: sampled page faults unwound,
//! named when first seen, summed per stack; the report of a window; the
//! stack that tipped an OOM kill. They share the heap tracer's unwinders
//! and names (one cache of parsed files and symbols per process).

use std::collections::HashMap;

use tracer_common::growth::{GrowthSample, RESERVE};

use super::heap::{HeapTracer, name_with};
use crate::{
    correlate::{growth::GrowthProfile, heap::StackId},
    probes::heap::weight,
    record::{GrowthReport, GrowthSite, TipStack},
    stacks::symbols::Frame,
};

/// Seconds of growth a kill carries (the minute before it).
pub const KILL_WINDOW_S: u64 = 60;
/// Seconds of samples kept for windows (older ones stay in the totals).
pub const KEEP_S: u64 = 300;

/// One kind of growth sample (faults, or reservations) of every process:
/// its profile, and each stack's names, taken when first seen.
#[derive(Default)]
pub(super) struct Sites {
    profile: GrowthProfile,
    named: HashMap<StackId, Vec<Frame>>,
}

impl Sites {
    /// Adds a sample; the stack's id and frames when it has no names yet.
    fn add(
        &mut self,
        pid: u32,
        frames: Vec<u64>,
        weight: f64,
        ts_ns: u64,
    ) -> Option<(StackId, Vec<u64>)> {
        let id = self.profile.add(pid, frames, weight, ts_ns)?;
        (!self.named.contains_key(&id)).then(|| (id, self.profile.frames(id).to_vec()))
    }

    /// The `top` sites of `pid` in `(until - window, until]`, named; with
    /// the window's bytes, samples and the sites left out.
    fn window(
        &self,
        pid: u32,
        until_ns: u64,
        window_ns: u64,
        top: usize,
    ) -> (Vec<GrowthSite>, u64, u64, usize) {
        let sites = self.profile.window(pid, until_ns, window_ns);
        let (bytes, samples) = sites
            .iter()
            .fold((0.0, 0), |(b, n), v| (b + v.bytes, n + v.samples));
        let more = sites.len().saturating_sub(top);
        let listed = sites
            .into_iter()
            .take(top)
            .map(|v| GrowthSite {
                frames: self.named.get(&v.stack).cloned().unwrap_or_else(|| {
                    vec![Frame::default(); self.profile.frames(v.stack).len().min(1)]
                }),
                bytes: v.bytes.round() as u64,
                samples: v.samples,
            })
            .collect();
        (listed, bytes.round() as u64, samples, more)
    }

    /// Forgets a process and its stacks' names.
    pub(super) fn forget(&mut self, pid: u32) {
        for id in self.profile.stacks_of(pid) {
            self.named.remove(&id);
        }
        self.profile.forget(pid);
    }
}

impl HeapTracer {
    /// Sets the mean bytes between growth samples the programs run with.
    pub fn set_growth_sample_bytes(&mut self, b: u64) {
        self.growth_sample_bytes = b;
    }

    /// A sampled fault, or a reservation (wall time `ts_ns`).
    pub fn fault(&mut self, s: &GrowthSample, ts_ns: u64) {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        // Faults in the C library's string functions and the allocators,
        // and mmap's wrapper, belong to their caller.
        self.trim_allocator(pid, &mut frames);
        let (sites, weight) = if s.func == RESERVE {
            (&mut self.reserve, s.size as f64)
        } else {
            if frames.len() < 2 {
                *self.growth_shallow.entry(pid).or_default() += 1;
            }
            let w = weight(s.size, s.how, self.growth_sample_bytes);
            (&mut self.growth, w)
        };
        if let Some((id, frames)) = sites.add(pid, frames, weight, ts_ns) {
            let names = name_with(&self.unwinders, &mut self.symbols, pid, &frames, s.ip);
            sites.named.insert(id, names);
        }
    }

    /// The stack of a task that tipped an OOM kill.
    pub fn tip(&mut self, s: &GrowthSample) -> TipStack {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        self.trim_allocator(pid, &mut frames);
        TipStack {
            pid,
            tid: s.header.tid,
            comm: crate::collect::decode::c_str(&s.header.comm),
            frames: self.name_from(pid, &frames, s.ip),
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
        let (listed, bytes, samples, more_sites) =
            self.growth.window(pid, until_ns, window_ns, top);
        let (reserved, reserved_bytes, _, _) =
            self.reserve.window(pid, until_ns, window_ns, top.min(3));
        GrowthReport {
            pid,
            comm: comm.to_string(),
            until_ns,
            window_s,
            sample_bytes: self.growth_sample_bytes,
            bytes,
            samples,
            total_bytes: self.growth.profile.total(pid).0.round() as u64,
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
        self.growth.profile.total(pid).1 > 0 || self.reserve.profile.total(pid).1 > 0
    }

    /// Drops growth samples too old for any window.
    pub fn prune_growth(&mut self, now_ns: u64) {
        self.growth.profile.prune(now_ns, KEEP_S * 1_000_000_000);
        self.reserve.profile.prune(now_ns, KEEP_S * 1_000_000_000);
    }
}
