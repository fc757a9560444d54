//! Where each process's memory grew: sampled page faults, weighted, summed
//! per (process, stack) over any window of the recent past, and folded into
//! per-stack totals for as long as the process is followed. Pure: time
//! comes in with every call, stacks are already unwound.

use std::collections::{HashMap, VecDeque};

use super::heap::StackId;

/// Samples kept per process for windows (the newest; an older one folds
/// into the totals only).
pub const MAX_RECENT: usize = 200_000;
/// Distinct stacks kept per process; samples of further stacks count in
/// the process's totals and in [`GrowthProfile::overflow`].
pub const MAX_STACKS: usize = 4096;

#[derive(Debug, Default)]
struct Proc {
    /// (time, stack, weight), oldest first.
    recent: VecDeque<(u64, StackId, f64)>,
    /// Per stack: (bytes, samples) since first seen.
    totals: HashMap<StackId, (f64, u64)>,
    bytes: f64,
    samples: u64,
}

/// One site of a window.
#[derive(Clone, Debug, PartialEq)]
pub struct GrowthView {
    /// The stack.
    pub stack: StackId,
    /// Estimated bytes faulted in within the window.
    pub bytes: f64,
    /// Samples within the window.
    pub samples: u64,
}

/// The growth samples of every followed process.
#[derive(Debug, Default)]
pub struct GrowthProfile {
    stacks: HashMap<StackId, (u32, Vec<u64>)>,
    stack_ids: HashMap<(u32, Vec<u64>), StackId>,
    next_stack: StackId,
    procs: HashMap<u32, Proc>,
    /// Samples whose stack was not kept (a process past [`MAX_STACKS`]).
    pub overflow: u64,
}

impl GrowthProfile {
    /// A sample of `pid` with `frames`, standing for `weight` bytes at
    /// `ts_ns`; the stack's id, unless the process has too many.
    pub fn add(&mut self, pid: u32, frames: Vec<u64>, weight: f64, ts_ns: u64) -> Option<StackId> {
        let key = (pid, frames);
        let known = self.stack_ids.get(&key).copied();
        let proc = self.procs.entry(pid).or_default();
        proc.bytes += weight;
        proc.samples += 1;
        let id = match known {
            Some(id) => id,
            None if proc.totals.len() >= MAX_STACKS => {
                self.overflow += 1;
                return None;
            }
            None => {
                let id = self.next_stack;
                self.next_stack = self.next_stack.wrapping_add(1);
                self.stacks.insert(id, key.clone());
                self.stack_ids.insert(key, id);
                id
            }
        };
        let t = proc.totals.entry(id).or_default();
        t.0 += weight;
        t.1 += 1;
        proc.recent.push_back((ts_ns, id, weight));
        if proc.recent.len() > MAX_RECENT {
            proc.recent.pop_front();
        }
        Some(id)
    }

    /// The frames of a stack (none once its process is forgotten).
    pub fn frames(&self, id: StackId) -> &[u64] {
        self.stacks.get(&id).map_or(&[], |s| &s.1)
    }

    /// The processes with samples.
    pub fn pids(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self.procs.keys().copied().collect();
        p.sort_unstable();
        p
    }

    /// The stacks of `pid`.
    pub fn stacks_of(&self, pid: u32) -> Vec<StackId> {
        self.procs
            .get(&pid)
            .map(|p| p.totals.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Estimated bytes `pid` faulted in since first seen, and its samples.
    pub fn total(&self, pid: u32) -> (f64, u64) {
        self.procs
            .get(&pid)
            .map_or((0.0, 0), |p| (p.bytes, p.samples))
    }

    /// The sites of `pid` within `(until - window, until]`, most bytes
    /// first (ties: the stack seen first).
    pub fn window(&self, pid: u32, until_ns: u64, window_ns: u64) -> Vec<GrowthView> {
        let Some(p) = self.procs.get(&pid) else {
            return Vec::new();
        };
        let from = until_ns.saturating_sub(window_ns);
        let mut sums: HashMap<StackId, (f64, u64)> = HashMap::new();
        for &(ts, id, w) in p.recent.iter().rev() {
            if ts <= from {
                break;
            }
            if ts > until_ns {
                continue;
            }
            let s = sums.entry(id).or_default();
            s.0 += w;
            s.1 += 1;
        }
        let mut out: Vec<GrowthView> = sums
            .into_iter()
            .map(|(stack, (bytes, samples))| GrowthView {
                stack,
                bytes,
                samples,
            })
            .collect();
        out.sort_by(|a, b| b.bytes.total_cmp(&a.bytes).then(a.stack.cmp(&b.stack)));
        out
    }

    /// Drops samples older than `keep_ns` from the windows (their bytes
    /// stay in the totals).
    pub fn prune(&mut self, now_ns: u64, keep_ns: u64) {
        let from = now_ns.saturating_sub(keep_ns);
        for p in self.procs.values_mut() {
            while p.recent.front().is_some_and(|(ts, _, _)| *ts < from) {
                p.recent.pop_front();
            }
        }
    }

    /// Forgets a process and its stacks.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            for id in p.totals.keys() {
                if let Some(key) = self.stacks.remove(id) {
                    self.stack_ids.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_window_sums_its_samples_per_stack() {
        let mut g = GrowthProfile::default();
        let grow = g.add(7, vec![0x10, 0x20], 1e6, 10 * S).unwrap();
        g.add(7, vec![0x10, 0x20], 1e6, 50 * S);
        g.add(7, vec![0x10, 0x20], 1e6, 69 * S);
        let other = g.add(7, vec![0x30], 5e5, 65 * S).unwrap();
        g.add(8, vec![0x10, 0x20], 9e9, 65 * S);
        // The minute before t = 70 s: two samples of `grow`, one of the other.
        let w = g.window(7, 70 * S, 60 * S);
        assert_eq!(
            w,
            [
                GrowthView {
                    stack: grow,
                    bytes: 2e6,
                    samples: 2
                },
                GrowthView {
                    stack: other,
                    bytes: 5e5,
                    samples: 1
                },
            ]
        );
        // Samples after the window's end are not in it.
        assert_eq!(g.window(7, 60 * S, 60 * S)[0].samples, 2);
        assert_eq!(g.total(7), (3.5e6, 4));
        // Pruned samples leave the windows, not the totals.
        g.prune(70 * S, 10 * S);
        assert_eq!(g.window(7, 70 * S, 60 * S)[0].samples, 1);
        assert_eq!(g.total(7), (3.5e6, 4));
    }

    #[test]
    fn stacks_are_bounded_per_process_and_forgotten_with_it() {
        let mut g = GrowthProfile::default();
        for i in 0..MAX_STACKS as u64 + 10 {
            g.add(1, vec![i], 1.0, S);
        }
        assert_eq!(g.overflow, 10);
        assert_eq!(g.total(1).1, MAX_STACKS as u64 + 10);
        let id = g.add(2, vec![1], 1.0, S).unwrap();
        g.forget(1);
        assert!(g.stack_ids.keys().all(|(p, _)| *p == 2));
        assert_eq!(g.frames(id), [1]);
        assert_eq!(g.pids(), [2]);
    }
}
