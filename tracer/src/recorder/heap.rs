//! The heap tracer: sampled allocations and frees from the ring, unwound
//! and named, summed per site; snapshots of a process's top sites and a
//! flame graph of its live bytes. `tracer attach --host` drives it for one
//! process; it serves any number.

use std::collections::HashSet;

use tracer_common::heap::{HeapAlloc, HeapFree};

use crate::{
    correlate::heap::HeapProfile,
    probes::heap::{HeapCounts, weight},
    record::{HeapSite, HeapSnapshot},
    stacks::{
        symbols::{Frame, Symbols},
        unwind::{Sample, Unwinders},
    },
};

/// How a snapshot is cut.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Sites listed.
    pub top: usize,
    /// Growth is measured over this many seconds.
    pub growth_window_s: u64,
    /// Blocks live this long count as old (leak candidates).
    pub old_after_s: u64,
}

/// Sampled heaps of the traced processes.
pub struct HeapTracer {
    /// Mean bytes between samples (0 = every allocation).
    pub sample_bytes: u64,
    profile: HeapProfile,
    unwinders: Unwinders,
    symbols: Symbols,
    /// Samples whose stack could not be unwound past the allocator's caller.
    pub shallow: u64,
    prepared: HashSet<u32>,
}

impl HeapTracer {
    /// A tracer for samples taken every `sample_bytes` on average.
    pub fn new(sample_bytes: u64) -> Self {
        Self {
            sample_bytes,
            profile: HeapProfile::default(),
            unwinders: Unwinders::default(),
            symbols: Symbols::default(),
            shallow: 0,
            prepared: HashSet::new(),
        }
    }

    /// Reads `pid`'s mappings now (call when it is attached to).
    pub fn prepare(&mut self, pid: u32) {
        if self.prepared.insert(pid) {
            self.unwinders.prepare(pid);
        }
    }

    /// A sampled allocation; `ts_ns` is its wall time.
    pub fn alloc(&mut self, a: &HeapAlloc, ts_ns: u64) {
        let pid = a.header.pid;
        let stack = &a.stack[..(a.stack_len as usize).min(a.stack.len())];
        let fp = &a.fp[..(a.fp_len as usize).min(a.fp.len())];
        let frames = self.unwinders.unwind(
            pid,
            &Sample {
                ip: a.ip,
                sp: a.sp,
                bp: a.bp,
                stack,
                fp,
            },
        );
        if frames.len() < 2 {
            self.shallow += 1;
        }
        let w = weight(a.size, a.how, self.sample_bytes);
        self.profile.alloc(pid, a.addr, frames, w, ts_ns);
    }

    /// A sampled block freed.
    pub fn free(&mut self, f: &HeapFree) {
        self.profile.free(f.header.pid, f.addr);
    }

    /// Records the live bytes per site (call once a second).
    pub fn tick(&mut self, now_ns: u64, view: &View) {
        let keep = view.growth_window_s.max(1) * 1_000_000_000;
        self.profile.tick(now_ns, keep);
    }

    fn name(&mut self, pid: u32, frames: &[u64]) -> Vec<Frame> {
        // Every frame is a return address (the first too: the sample is
        // taken as the allocator returns), so name the call before it.
        let lookup: Vec<u64> = frames.iter().map(|a| a.saturating_sub(1)).collect();
        self.symbols.resolve(pid, &lookup)
    }

    /// The heap of `pid` now.
    pub fn snapshot(
        &mut self,
        pid: u32,
        comm: &str,
        now_ns: u64,
        view: &View,
        counts: Option<HeapCounts>,
    ) -> HeapSnapshot {
        let s = 1_000_000_000;
        let sites = self
            .profile
            .sites(pid, now_ns, view.growth_window_s * s, view.old_after_s * s);
        let more_sites = sites.len().saturating_sub(view.top);
        let listed: Vec<_> = sites.into_iter().take(view.top).collect();
        let sites = listed
            .iter()
            .map(|v| {
                let frames = self.profile.frames(v.stack).to_vec();
                HeapSite {
                    frames: self.name(pid, &frames),
                    live_bytes: v.totals.live_bytes.round() as u64,
                    live_samples: v.totals.live_samples,
                    growth_bytes: v.growth_bytes.round() as i64,
                    old_bytes: v.old_bytes.round() as u64,
                    allocated_bytes: v.totals.allocated_bytes.round() as u64,
                }
            })
            .collect();
        let lost = counts
            .map(|c| c.map_full + c.ring_full + c.stack_lost)
            .unwrap_or(0);
        HeapSnapshot {
            pid,
            comm: comm.to_string(),
            ts_ns: now_ns,
            sample_bytes: self.sample_bytes,
            live_bytes: self.profile.live_bytes(pid).round() as u64,
            rss_bytes: crate::model::proc::read_status_mem(pid).map(|m| m.rss_kb * 1024),
            growth_window_s: view.growth_window_s,
            old_after_s: view.old_after_s,
            sites,
            more_sites,
            lost_samples: lost,
        }
    }

    /// Folded stacks of `pid`'s live bytes (`outer;...;inner bytes`), the
    /// input of a flame graph.
    pub fn folded(&mut self, pid: u32, now_ns: u64) -> Vec<String> {
        let sites = self.profile.sites(pid, now_ns, 0, u64::MAX);
        let mut out = Vec::with_capacity(sites.len());
        for v in sites {
            let bytes = v.totals.live_bytes.round() as u64;
            if bytes == 0 {
                continue;
            }
            let frames = self.profile.frames(v.stack).to_vec();
            let names: Vec<String> = self
                .name(pid, &frames)
                .iter()
                .rev()
                .map(|f| f.short().replace(';', ":"))
                .collect();
            out.push(format!("{} {bytes}", names.join(";")));
        }
        out
    }

    /// Forgets a process.
    pub fn forget(&mut self, pid: u32) {
        self.profile.forget(pid);
        self.unwinders.forget(pid);
        self.symbols.forget(pid);
        self.prepared.remove(&pid);
    }
}
