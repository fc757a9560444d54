//! Userspace SIGKILL storms. Every SIGKILL from userspace is a kill worth
//! recording, but an unprivileged process can send tens of thousands a
//! second (fork a child, kill it, repeat). One full, fsynced record each
//! would wedge the recorder and queue real OOM kills behind the storm.
//!
//! So full records are admitted by a token bucket (a burst, then a steady
//! rate); past it, kills are folded per (sender, target memory cgroup) into
//! one record a second that says how many and which. Folding costs a hash
//! lookup: no /proc read and no store write per kill.
//!
//! A window is a second of the kills' own time, not of the recorder's: a
//! recorder that lags its ring by more than a second (starved of CPU on a
//! busy node) still folds a second of the storm into each record, instead
//! of one record per batch it reads. A window no kill has joined for a
//! second of the recorder's time is closed too (the storm ended).

use std::collections::HashMap;

use crate::record::{KillAggregate, KillRecord};

/// Full userspace kill records allowed in a burst.
pub const BURST: f64 = 64.0;
/// Full userspace kill records allowed per second after the burst.
pub const RATE_PER_S: f64 = 32.0;
/// An aggregate holds the kills of this long (by their timestamps), and
/// is stored once no kill has joined it for this long (by the recorder's).
pub const WINDOW_NS: i64 = 1_000_000_000;

/// An open aggregate, and when (by the recorder's clock) a kill last
/// joined it.
struct Open {
    rec: KillRecord,
    touched_ns: i64,
}

/// Folds userspace kills past the rate.
pub struct SignalStorm {
    tokens: f64,
    last_ns: i64,
    open: HashMap<(u32, Option<String>), Open>,
    /// Aggregates whose window the kills' time has passed.
    closed: Vec<KillRecord>,
    /// Kills folded so far.
    pub folded: u64,
}

impl Default for SignalStorm {
    fn default() -> Self {
        Self {
            tokens: BURST,
            last_ns: 0,
            open: HashMap::new(),
            closed: Vec::new(),
            folded: 0,
        }
    }
}

impl SignalStorm {
    /// Whether a kill at `now_ns` gets a full record of its own.
    pub fn admit(&mut self, now_ns: i64) -> bool {
        if self.last_ns != 0 {
            let dt = (now_ns - self.last_ns).max(0) as f64 / 1e9;
            self.tokens = (self.tokens + dt * RATE_PER_S).min(BURST);
        }
        self.last_ns = now_ns;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Folds a kill (at `ts_ns`, read at `now_ns`) that was not admitted.
    /// `first` builds the record the aggregate is stored as, from the first
    /// kill of its window.
    pub fn fold(
        &mut self,
        sender: u32,
        memcg: Option<String>,
        (ts_ns, now_ns): (i64, i64),
        victim: (u32, &str),
        first: impl FnOnce() -> KillRecord,
    ) {
        self.folded += 1;
        let key = (sender, memcg);
        let passed = |o: &Open| {
            o.rec
                .aggregate
                .as_ref()
                .is_some_and(|a| ts_ns - a.first_ns >= WINDOW_NS)
        };
        if self.open.get(&key).is_some_and(passed)
            && let Some(o) = self.open.remove(&key)
        {
            self.closed.push(o.rec);
        }
        let o = self.open.entry(key).or_insert_with(|| {
            let mut r = first();
            r.aggregate = Some(KillAggregate {
                first_ns: ts_ns,
                ..Default::default()
            });
            Open {
                rec: r,
                touched_ns: now_ns,
            }
        });
        o.touched_ns = now_ns;
        let a = o.rec.aggregate.get_or_insert_with(Default::default);
        a.count += 1;
        a.last_ns = ts_ns;
        if a.victims.len() < KillAggregate::NAMED {
            a.victims.push((victim.0, victim.1.to_string()));
        }
    }

    /// Aggregates whose window the kills' time has passed, or that no kill
    /// joined for a window by `now_ns` (all of them with `all`), ready to
    /// be stored.
    pub fn take_due(&mut self, now_ns: i64, all: bool) -> Vec<KillRecord> {
        let due: Vec<_> = self
            .open
            .iter()
            .filter(|(_, o)| all || now_ns - o.touched_ns >= WINDOW_NS)
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = std::mem::take(&mut self.closed);
        out.extend(
            due.into_iter()
                .filter_map(|k| self.open.remove(&k).map(|o| o.rec)),
        );
        for r in &mut out {
            if let Some(a) = &r.aggregate {
                r.gaps.push(crate::record::Gap::Note(format!(
                    "one record for {} SIGKILLs from this sender into this cgroup: they came faster than {RATE_PER_S} a second, so only the first {} victims are named and none has its memory read",
                    a.count,
                    a.victims.len()
                )));
            }
        }
        out.sort_by_key(|r| r.ts_ns);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Victim;

    fn rec(pid: u32, ts: i64) -> KillRecord {
        KillRecord {
            ts_ns: ts,
            victim: Victim {
                pid,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_burst_is_admitted_then_the_rate_then_folded_per_sender_and_cgroup() {
        let mut s = SignalStorm::default();
        let t0 = 1_000_000_000_000;
        let admitted = (0..1000).filter(|i| s.admit(t0 + i * 1_000)).count();
        assert_eq!(
            admitted, BURST as usize,
            "the burst, then nothing within 1 ms"
        );
        // A second later the bucket has RATE_PER_S tokens again.
        let later = t0 + 1_000_000_000;
        let admitted = (0..1000).filter(|i| s.admit(later + i)).count();
        assert_eq!(admitted, RATE_PER_S as usize);

        for i in 0..50_000u32 {
            let cg = if i % 2 == 0 { "/a" } else { "/b" };
            let ts = t0 + i64::from(i) * 10_000;
            s.fold(7, Some(cg.into()), (ts, ts), (100 + i, "child"), || {
                rec(100 + i, ts)
            });
        }
        assert_eq!(s.folded, 50_000);
        assert!(
            s.take_due(t0 + 1, false).is_empty(),
            "not due within the window"
        );
        let due = s.take_due(t0 + 500_000_000 + WINDOW_NS, false);
        assert_eq!(due.len(), 2, "one record per (sender, cgroup)");
        let total: u64 = due
            .iter()
            .map(|r| r.aggregate.as_ref().unwrap().count)
            .sum();
        assert_eq!(total, 50_000, "every kill counted");
        let a = due[0].aggregate.as_ref().unwrap();
        assert_eq!(a.victims.len(), KillAggregate::NAMED);
        assert_eq!(
            due[0].victim.pid, a.victims[0].0,
            "the record's victim is the first"
        );
        assert!(
            due[0].gaps[0].to_string().contains("25000 SIGKILLs"),
            "{:?}",
            due[0].gaps
        );
        assert!(s.take_due(i64::MAX, true).is_empty());
    }

    #[test]
    fn a_recorder_lagging_its_ring_folds_a_second_of_kills_per_record() {
        // 20,000 kills a second for 3 s, read 1.5 s late in batches of
        // 1,000, with the due aggregates taken after every batch (the
        // engine's tick): three windows of the kills' time, not one record
        // per batch.
        let mut s = SignalStorm::default();
        let t0 = 1_000_000_000_000;
        let lag = 1_500_000_000;
        let mut due = Vec::new();
        for i in 0..60_000u32 {
            let ts = t0 + i64::from(i) * 50_000;
            s.fold(7, Some("/a".into()), (ts, ts + lag), (i, "child"), || {
                rec(i, ts)
            });
            if i % 1_000 == 999 {
                due.extend(s.take_due(ts + lag, false));
            }
        }
        let last = t0 + 60_000 * 50_000 + lag;
        assert_eq!(due.len(), 2, "two windows closed by the kills' time");
        assert!(s.take_due(last + 1, false).is_empty(), "the third is open");
        due.extend(s.take_due(last + WINDOW_NS, false));
        let counts: Vec<u64> = due
            .iter()
            .map(|r| r.aggregate.as_ref().unwrap().count)
            .collect();
        assert_eq!(counts, [20_000, 20_000, 20_000]);
    }
}
