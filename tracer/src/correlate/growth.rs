//! Where each process's memory grew: sampled page faults, weighted, summed
//! per (process, stack) over any window of the recent past, and folded into
//! per-stack totals for as long as the process is followed. A sample whose
//! page the process gave back later (munmap, madvise) counts as returned
//! from then on: a window says what each site faulted in and how much of
//! it was still kept at its end. Pure: time comes in with every call,
//! stacks are already unwound.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::heap::StackId;

/// Samples kept per process for windows (the newest; an older one folds
/// into the totals only).
pub const MAX_RECENT: usize = 200_000;
/// Distinct stacks kept per process; samples of further stacks count in
/// the process's totals and in [`GrowthProfile::overflow`].
pub const MAX_STACKS: usize = 4096;

/// One sample of the recent past.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ts: u64,
    stack: StackId,
    weight: f64,
    /// The faulting page (0: none known, a reservation).
    page: u64,
    /// When its page was given back (0: kept).
    returned_ns: u64,
}

#[derive(Debug, Default)]
struct Proc {
    /// Oldest first.
    recent: VecDeque<Sample>,
    /// The sequence number of `recent[0]` (each sample's is its position
    /// counted from the process's first).
    first_seq: u64,
    /// Page -> sequence number of the newest kept sample there.
    at_page: BTreeMap<u64, u64>,
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
    /// Estimated bytes of those given back again by the window's end.
    pub returned: f64,
}

impl GrowthView {
    /// Bytes faulted in within the window and still kept at its end.
    pub fn net(&self) -> f64 {
        self.bytes - self.returned
    }
}

impl Proc {
    fn pop_front(&mut self) {
        if let Some(old) = self.recent.pop_front() {
            if old.page != 0 && self.at_page.get(&old.page) == Some(&self.first_seq) {
                self.at_page.remove(&old.page);
            }
            self.first_seq += 1;
        }
    }
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
    /// `ts_ns`, of the page at `addr` (0: none, a reservation); the stack's
    /// id, unless the process has too many.
    pub fn add(
        &mut self,
        pid: u32,
        frames: Vec<u64>,
        weight: f64,
        ts_ns: u64,
        addr: u64,
    ) -> Option<StackId> {
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
        let page = addr & !(tracer_common::growth::PAGE - 1);
        if page != 0 {
            let seq = proc.first_seq + proc.recent.len() as u64;
            proc.at_page.insert(page, seq);
        }
        proc.recent.push_back(Sample {
            ts: ts_ns,
            stack: id,
            weight,
            page,
            returned_ns: 0,
        });
        if proc.recent.len() > MAX_RECENT {
            proc.pop_front();
        }
        Some(id)
    }

    /// `pid` gave `[start, start + len)` back at `ts_ns`: its kept samples
    /// there count as returned from then on. The samples marked.
    pub fn returned(&mut self, pid: u32, start: u64, len: u64, ts_ns: u64) -> usize {
        let Some(p) = self.procs.get_mut(&pid) else {
            return 0;
        };
        let end = start.saturating_add(len);
        let pages: Vec<(u64, u64)> = p.at_page.range(start..end).map(|(&a, &s)| (a, s)).collect();
        for &(page, seq) in &pages {
            p.at_page.remove(&page);
            if let Some(s) = seq
                .checked_sub(p.first_seq)
                .and_then(|i| p.recent.get_mut(i as usize))
            {
                s.returned_ns = ts_ns;
            }
        }
        pages.len()
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
        let mut sums: HashMap<StackId, GrowthView> = HashMap::new();
        for x in p.recent.iter().rev() {
            if x.ts <= from {
                break;
            }
            if x.ts > until_ns {
                continue;
            }
            let v = sums.entry(x.stack).or_insert(GrowthView {
                stack: x.stack,
                bytes: 0.0,
                samples: 0,
                returned: 0.0,
            });
            v.bytes += x.weight;
            v.samples += 1;
            if x.returned_ns != 0 && x.returned_ns <= until_ns {
                v.returned += x.weight;
            }
        }
        let mut out: Vec<GrowthView> = sums.into_values().collect();
        // What was kept first: a site that faulted much in and gave it all
        // back (a temporary buffer) is not where the memory went.
        out.sort_by(|a, b| {
            b.net()
                .total_cmp(&a.net())
                .then(b.bytes.total_cmp(&a.bytes))
                .then(a.stack.cmp(&b.stack))
        });
        out
    }

    /// Drops samples older than `keep_ns` from the windows (their bytes
    /// stay in the totals).
    pub fn prune(&mut self, now_ns: u64, keep_ns: u64) {
        let from = now_ns.saturating_sub(keep_ns);
        for p in self.procs.values_mut() {
            while p.recent.front().is_some_and(|x| x.ts < from) {
                p.pop_front();
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
        let grow = g.add(7, vec![0x10, 0x20], 1e6, 10 * S, 0).unwrap();
        g.add(7, vec![0x10, 0x20], 1e6, 50 * S, 0);
        g.add(7, vec![0x10, 0x20], 1e6, 69 * S, 0);
        let other = g.add(7, vec![0x30], 5e5, 65 * S, 0).unwrap();
        g.add(8, vec![0x10, 0x20], 9e9, 65 * S, 0);
        // The minute before t = 70 s: two samples of `grow`, one of the other.
        let w = g.window(7, 70 * S, 60 * S);
        assert_eq!(
            w,
            [
                GrowthView {
                    stack: grow,
                    bytes: 2e6,
                    samples: 2,
                    returned: 0.0,
                },
                GrowthView {
                    stack: other,
                    bytes: 5e5,
                    samples: 1,
                    returned: 0.0,
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
            g.add(1, vec![i], 1.0, S, 0);
        }
        assert_eq!(g.overflow, 10);
        assert_eq!(g.total(1).1, MAX_STACKS as u64 + 10);
        let id = g.add(2, vec![1], 1.0, S, 0).unwrap();
        g.forget(1);
        assert!(g.stack_ids.keys().all(|(p, _)| *p == 2));
        assert_eq!(g.frames(id), [1]);
        assert_eq!(g.pids(), [2]);
    }

    #[test]
    fn pages_given_back_count_as_returned_and_rank_a_site_below_what_was_kept() {
        let mut g = GrowthProfile::default();
        const MIB: u64 = 1 << 20;
        // A temporary buffer at 0x10000000 faults in 3 samples and is
        // unmapped; a leak at 0x20000000 faults in 2 and keeps them.
        let temp = g.add(7, vec![0x1], 1e6, 10 * S, 0x1000_0000).unwrap();
        g.add(7, vec![0x1], 1e6, 11 * S, 0x1000_0000 + MIB + 123);
        g.add(7, vec![0x1], 1e6, 12 * S, 0x1000_0000 + 2 * MIB);
        let leak = g.add(7, vec![0x2], 1e6, 13 * S, 0x2000_0000).unwrap();
        g.add(7, vec![0x2], 1e6, 14 * S, 0x2000_0000 + MIB);
        // Before the unmap the temporary site leads on bytes.
        assert_eq!(g.window(7, 20 * S, 60 * S)[0].stack, temp);
        // munmap(0x10000000, 2 MiB): its first two samples; the third
        // page lies just past the range and stays kept.
        assert_eq!(g.returned(7, 0x1000_0000, 2 * MIB, 15 * S), 2);
        let w = g.window(7, 20 * S, 60 * S);
        assert_eq!((w[0].stack, w[0].net()), (leak, 2e6));
        assert_eq!((w[1].stack, w[1].bytes, w[1].returned), (temp, 3e6, 2e6));
        // A window ending before the unmap still has it kept.
        assert_eq!(g.window(7, 14 * S, 60 * S)[0].returned, 0.0);
        // Given back once: the same range again marks nothing; another
        // process's range is its own.
        assert_eq!(g.returned(7, 0x1000_0000, 2 * MIB, 16 * S), 0);
        assert_eq!(g.returned(8, 0x2000_0000, MIB, 16 * S), 0);
        // Samples that leave the window leave the page index with them.
        g.prune(100 * S, 10 * S);
        assert!(g.procs[&7].at_page.is_empty());
        assert_eq!(g.returned(7, 0, u64::MAX, 101 * S), 0);
    }
}
