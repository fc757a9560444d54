//! The sampled heap of traced processes: live samples by address, their
//! weights summed per stack, growth over a window and age. Pure: time
//! comes in with every call, stacks are already unwound.

use std::collections::{HashMap, VecDeque};

/// An interned stack.
pub type StackId = u32;

#[derive(Clone, Copy, Debug)]
struct Live {
    stack: StackId,
    weight: f64,
    /// The block's own size.
    size: u64,
    ts_ns: u64,
}

/// Per stack totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StackTotals {
    /// Estimated live bytes.
    pub live_bytes: f64,
    /// Live samples.
    pub live_samples: u64,
    /// Estimated bytes ever allocated.
    pub allocated_bytes: f64,
}

/// One site as the profile sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteView {
    /// The stack.
    pub stack: StackId,
    /// Totals now.
    pub totals: StackTotals,
    /// Change of live bytes over the growth window.
    pub growth_bytes: f64,
    /// Live bytes older than the age asked for.
    pub old_bytes: f64,
}

/// The heap profile of every traced process.
#[derive(Debug, Default)]
pub struct HeapProfile {
    /// Interned stacks: (process, frames), removed with their process.
    stacks: HashMap<StackId, (u32, Vec<u64>)>,
    next_stack: StackId,
    stack_ids: HashMap<(u32, Vec<u64>), StackId>,
    live: HashMap<(u32, u64), Live>,
    totals: HashMap<StackId, StackTotals>,
    /// (time, live bytes per stack), one a second, oldest first.
    history: VecDeque<(u64, HashMap<StackId, f64>)>,
    /// Frees of blocks whose sample was never seen (lost or sent before
    /// tracing began): counted, nothing else.
    pub unknown_frees: u64,
    /// Samples of an address already live (a lost free): the old one is
    /// replaced.
    pub replaced: u64,
}

impl HeapProfile {
    fn intern(&mut self, pid: u32, frames: Vec<u64>) -> StackId {
        let key = (pid, frames);
        if let Some(id) = self.stack_ids.get(&key) {
            return *id;
        }
        let id = self.next_stack;
        self.next_stack = self.next_stack.wrapping_add(1);
        self.stacks.insert(id, key.clone());
        self.stack_ids.insert(key, id);
        id
    }

    fn owner(&self, id: StackId) -> Option<u32> {
        self.stacks.get(&id).map(|s| s.0)
    }

    /// The frames of a stack (none once its process is forgotten).
    pub fn frames(&self, id: StackId) -> &[u64] {
        self.stacks.get(&id).map_or(&[], |s| &s.1)
    }

    /// The processes with live samples or history.
    pub fn pids(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self
            .totals
            .keys()
            .filter_map(|id| self.stacks.get(id).map(|s| s.0))
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// The stacks of `pid`.
    pub fn stacks_of(&self, pid: u32) -> Vec<StackId> {
        self.totals
            .keys()
            .filter(|id| self.owner(**id) == Some(pid))
            .copied()
            .collect()
    }

    /// A sampled block of `pid` at `addr`, of `size` bytes standing for
    /// `weight`; returns its stack's id.
    pub fn alloc(
        &mut self,
        pid: u32,
        addr: u64,
        frames: Vec<u64>,
        (size, weight): (u64, f64),
        ts_ns: u64,
    ) -> StackId {
        let stack = self.intern(pid, frames);
        if let Some(old) = self.live.insert(
            (pid, addr),
            Live {
                stack,
                weight,
                size,
                ts_ns,
            },
        ) {
            self.replaced += 1;
            self.drop_live(old);
        }
        let t = self.totals.entry(stack).or_default();
        t.live_bytes += weight;
        t.live_samples += 1;
        t.allocated_bytes += weight;
        stack
    }

    fn drop_live(&mut self, l: Live) {
        if let Some(t) = self.totals.get_mut(&l.stack) {
            t.live_bytes = (t.live_bytes - l.weight).max(0.0);
            t.live_samples = t.live_samples.saturating_sub(1);
        }
    }

    /// A sampled block was freed. False when it was not known.
    pub fn free(&mut self, pid: u32, addr: u64) -> bool {
        match self.live.remove(&(pid, addr)) {
            Some(l) => {
                self.drop_live(l);
                true
            }
            None => {
                self.unknown_frees += 1;
                false
            }
        }
    }

    /// Records the live bytes per stack at `now_ns` (call about once a
    /// second), keeping `keep_ns` of history.
    pub fn tick(&mut self, now_ns: u64, keep_ns: u64) {
        let snap = self
            .totals
            .iter()
            .map(|(k, t)| (*k, t.live_bytes))
            .collect();
        self.history.push_back((now_ns, snap));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now_ns.saturating_sub(*t) > keep_ns)
        {
            self.history.pop_front();
        }
    }

    /// Estimated live bytes of `pid`, all stacks.
    pub fn live_bytes(&self, pid: u32) -> f64 {
        self.totals
            .iter()
            .filter(|(id, _)| self.owner(**id) == Some(pid))
            .map(|(_, t)| t.live_bytes)
            .sum()
    }

    /// The sites of `pid` holding live bytes or that did within the
    /// window, largest live first: growth against the oldest history entry
    /// within `window_ns`, and what is older than `old_ns`.
    pub fn sites(&self, pid: u32, now_ns: u64, window_ns: u64, old_ns: u64) -> Vec<SiteView> {
        let base = self
            .history
            .iter()
            .find(|(t, _)| now_ns.saturating_sub(*t) <= window_ns)
            .map(|(_, m)| m);
        let mut old: HashMap<StackId, f64> = HashMap::new();
        for ((p, _), l) in &self.live {
            if *p == pid && now_ns.saturating_sub(l.ts_ns) >= old_ns {
                *old.entry(l.stack).or_default() += l.weight;
            }
        }
        let mut out: Vec<SiteView> = self
            .totals
            .iter()
            .filter(|(id, _)| self.owner(**id) == Some(pid))
            .map(|(id, t)| {
                let before = base.and_then(|m| m.get(id)).copied().unwrap_or(0.0);
                SiteView {
                    stack: *id,
                    totals: *t,
                    growth_bytes: t.live_bytes - before,
                    old_bytes: old.get(id).copied().unwrap_or(0.0),
                }
            })
            .filter(|s| s.totals.live_bytes > 0.0 || s.growth_bytes != 0.0)
            .collect();
        out.sort_by(|a, b| {
            b.totals
                .live_bytes
                .total_cmp(&a.totals.live_bytes)
                .then(a.stack.cmp(&b.stack))
        });
        out
    }

    /// The live blocks of `pid` sampled at `stack`: (address, size, wall
    /// time of the sample), largest first.
    pub fn blocks(&self, pid: u32, stack: StackId) -> Vec<(u64, u64, u64)> {
        let mut v: Vec<(u64, u64, u64)> = self
            .live
            .iter()
            .filter(|((p, _), l)| *p == pid && l.stack == stack)
            .map(|((_, addr), l)| (*addr, l.size, l.ts_ns))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Forgets a process (it exited and was reported).
    pub fn forget(&mut self, pid: u32) {
        self.live.retain(|(p, _), _| *p != pid);
        let gone: Vec<StackId> = self
            .totals
            .keys()
            .filter(|id| self.owner(**id) == Some(pid))
            .copied()
            .collect();
        for id in gone {
            self.totals.remove(&id);
            if let Some(key) = self.stacks.remove(&id) {
                self.stack_ids.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn live_bytes_follow_allocs_and_frees_per_stack() {
        let mut p = HeapProfile::default();
        p.alloc(1, 0x10, vec![1, 2], (100, 100.0), 0);
        p.alloc(1, 0x20, vec![1, 2], (50, 50.0), 0);
        p.alloc(1, 0x30, vec![3], (10, 10.0), 0);
        p.alloc(2, 0x10, vec![1, 2], (7, 7.0), 0); // another process, same address
        assert!(p.free(1, 0x20));
        assert!(!p.free(1, 0x99), "a free of an unsampled block");
        assert_eq!(p.unknown_frees, 1);
        let sites = p.sites(1, S, 10 * S, 60 * S);
        assert_eq!(sites.len(), 2);
        assert_eq!(p.frames(sites[0].stack), [1, 2]);
        assert_eq!(sites[0].totals.live_bytes, 100.0);
        assert_eq!(sites[0].totals.live_samples, 1);
        assert_eq!(sites[0].totals.allocated_bytes, 150.0);
        assert_eq!(p.live_bytes(1), 110.0);
        assert_eq!(p.live_bytes(2), 7.0);
        // A realloc that moves: the old block freed, the new one sampled.
        assert!(p.free(1, 0x30));
        p.alloc(1, 0x40, vec![3], (20, 20.0), 0);
        assert_eq!(p.live_bytes(1), 120.0);
        // An address sampled again without its free (lost): replaced.
        p.alloc(1, 0x40, vec![3], (30, 30.0), 0);
        assert_eq!((p.live_bytes(1), p.replaced), (130.0, 1));
        p.forget(1);
        assert_eq!(p.live_bytes(1), 0.0);
        assert_eq!(p.live_bytes(2), 7.0);
        // Its stacks go with it (a recorder sees processes come and go for
        // months); the other process's stay.
        assert_eq!((p.stacks.len(), p.stack_ids.len()), (1, 1));
        assert_eq!(p.pids(), [2]);
    }

    #[test]
    fn growth_over_the_window_and_old_blocks() {
        let mut p = HeapProfile::default();
        p.alloc(1, 1, vec![9], (100, 100.0), 0);
        p.tick(0, 60 * S);
        p.alloc(1, 2, vec![9], (100, 100.0), 5 * S);
        p.tick(5 * S, 60 * S);
        p.alloc(1, 3, vec![9], (100, 100.0), 10 * S);
        p.alloc(1, 4, vec![8], (40, 40.0), 10 * S);
        p.tick(10 * S, 60 * S);
        // Over 10 s: from 100 to 300; over 5 s: from 200 to 300.
        let s = p.sites(1, 10 * S, 10 * S, 8 * S);
        assert_eq!(s[0].growth_bytes, 200.0);
        // Live for 8 s or more at 10 s: only the block of 0 s.
        assert_eq!(s[0].old_bytes, 100.0);
        let s = p.sites(1, 10 * S, 5 * S, 8 * S);
        assert_eq!(s[0].growth_bytes, 100.0);
        assert_eq!(s[1].growth_bytes, 40.0);
        // A site freed to nothing within the window still shows, shrinking.
        p.free(1, 4);
        let s = p.sites(1, 12 * S, 5 * S, 8 * S);
        let gone = s.iter().find(|v| p.frames(v.stack) == [8]).unwrap();
        assert_eq!((gone.totals.live_bytes, gone.growth_bytes), (0.0, -40.0));
        // Past the window it is gone from the list.
        p.tick(20 * S, 60 * S);
        assert_eq!(p.sites(1, 20 * S, 5 * S, 8 * S).len(), 1);
    }
}
