//! Growth samples of every process, kept in the heap tracer's thread:
//! sampled page faults (or reservations) summed per stack, each stack named
//! when first seen, and the sites of a window. The heap tracer unwinds and
//! names them with its own unwinders and symbols.

use std::collections::HashMap;

use crate::{
    correlate::{growth::GrowthProfile, heap::StackId},
    record::{GrowthReport, GrowthSite, TipStack},
    stacks::symbols::Frame,
};

/// What the worker found for a kill: where its victim grew, and the stack
/// that tipped it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KillGrowth {
    /// Wall time of the kill, ns.
    pub ts_ns: u64,
    /// The victim's growth in the window before the kill.
    pub growth: Option<GrowthReport>,
    /// The blamed neighbour's growth in the same window.
    pub neighbour: Option<GrowthReport>,
    /// The tipping stack.
    pub tip: Option<TipStack>,
}

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
    /// Adds a sample (of the page at `addr`, 0: none); the stack's id and
    /// frames when it has no names yet.
    pub(super) fn add(
        &mut self,
        pid: u32,
        frames: Vec<u64>,
        weight: f64,
        ts_ns: u64,
        addr: u64,
    ) -> Option<(StackId, Vec<u64>)> {
        let id = self.profile.add(pid, frames, weight, ts_ns, addr)?;
        (!self.named.contains_key(&id)).then(|| (id, self.profile.frames(id).to_vec()))
    }

    /// `pid` gave a range back at `ts_ns`.
    pub(super) fn returned(&mut self, pid: u32, start: u64, len: u64, ts_ns: u64) {
        self.profile.returned(pid, start, len, ts_ns);
    }

    /// The `top` sites of `pid` in `(until - window, until]`, named; with
    /// the window's bytes, samples, sites left out and bytes returned.
    pub(super) fn window(
        &self,
        pid: u32,
        until_ns: u64,
        window_ns: u64,
        top: usize,
    ) -> (Vec<GrowthSite>, u64, u64, usize, u64) {
        let sites = self.profile.window(pid, until_ns, window_ns);
        let (bytes, samples, returned) = sites.iter().fold((0.0, 0, 0.0), |(b, n, r), v| {
            (b + v.bytes, n + v.samples, r + v.returned)
        });
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
                returned_bytes: v.returned.round() as u64,
            })
            .collect();
        (
            listed,
            bytes.round() as u64,
            samples,
            more,
            returned.round() as u64,
        )
    }

    /// Names a stack `add` returned.
    pub(super) fn name(&mut self, id: StackId, names: Vec<Frame>) {
        self.named.insert(id, names);
    }

    /// Bytes and samples of `pid` since it was first seen.
    pub(super) fn total(&self, pid: u32) -> (f64, u64) {
        self.profile.total(pid)
    }

    /// Drops samples older than `keep_ns` before `now_ns`.
    pub(super) fn prune(&mut self, now_ns: u64, keep_ns: u64) {
        self.profile.prune(now_ns, keep_ns);
    }

    /// Forgets a process and its stacks' names.
    pub(super) fn forget(&mut self, pid: u32) {
        for id in self.profile.stacks_of(pid) {
            self.named.remove(&id);
        }
        self.profile.forget(pid);
    }
}
