//! Repeated failures folded into one row.
//!
//! A process that retries a failing call in a loop (`cudaMalloc` out of
//! memory, thousands of times a second) would otherwise fill the store
//! with identical rows. As a SIGKILL storm is folded, the same process
//! making the same call with the same size and the same result within
//! [`WINDOW_NS`] of the first is counted, not stored: the first call of a
//! window is handled in full, and when the window closes one more row
//! (the first's, with `repeats`, `first_ns` and `until_ns`) says how many
//! followed. Nothing is lost: every call is the first of its window or
//! counted in its repeats.
//!
//! Process churn is folded the same way, with an allowance: the first
//! [`PROC_ALLOWANCE`] forks of one parent in a window (and exits of
//! processes of one name) are stored, the rest counted. A fork storm of thousands a
//! second filled the store at 78 MiB a minute with a row for each.

use std::collections::HashMap;

use crate::store::EventRow;

/// How long a window of identical calls lasts.
pub const WINDOW_NS: i64 = 1_000_000_000;
/// Windows open at once, at most; past that, all are closed.
const MAX_WINDOWS: usize = 4096;

/// What makes two calls the same: process, function, size, result.
pub type CallKey = (u32, u32, u64, i32);

/// The "function" of a key for the forks of a parent (its pid in the
/// "size"), and for the exits of processes of one name (its hash there),
/// beyond every CUDA function's number.
pub const FORKS: u32 = u32::MAX;
/// See [`FORKS`].
pub const EXITS: u32 = u32::MAX - 1;

/// Forks of one parent (and exits of processes of one name) stored in
/// full per window, before the rest are counted.
pub const PROC_ALLOWANCE: u32 = 32;

#[derive(Debug)]
struct Window {
    first: EventRow,
    last_ns: i64,
    /// Events of the window stored in full, the first included.
    admitted: u32,
    repeats: u64,
}

/// The open windows.
#[derive(Debug, Default)]
pub struct CallFold {
    open: HashMap<CallKey, Window>,
    /// Calls counted in a window rather than stored, in all.
    pub folded: u64,
}

impl CallFold {
    /// Whether the call `key` at `ts_ns` is the first of its window (then
    /// it is handled in full, and `row` is kept to summarise the window);
    /// otherwise it is counted. Closed windows' rows go to `out`.
    pub fn admit(
        &mut self,
        key: CallKey,
        ts_ns: i64,
        row: impl FnOnce() -> EventRow,
        out: &mut Vec<EventRow>,
    ) -> bool {
        self.admit_some(key, ts_ns, 1, row, out)
    }

    /// Same, where the first `allowance` events of a window are stored in
    /// full (true) and the rest counted.
    pub fn admit_some(
        &mut self,
        key: CallKey,
        ts_ns: i64,
        allowance: u32,
        row: impl FnOnce() -> EventRow,
        out: &mut Vec<EventRow>,
    ) -> bool {
        if let Some(w) = self.open.get_mut(&key) {
            if ts_ns - w.first.ts_ns < WINDOW_NS {
                if w.admitted < allowance {
                    w.admitted += 1;
                    return true;
                }
                w.repeats += 1;
                w.last_ns = w.last_ns.max(ts_ns);
                self.folded += 1;
                return false;
            }
            if let Some(w) = self.open.remove(&key) {
                out.extend(summary(w));
            }
        }
        if self.open.len() >= MAX_WINDOWS {
            self.close(i64::MAX, out);
        }
        let first = row();
        self.open.insert(
            key,
            Window {
                last_ns: first.ts_ns,
                first,
                admitted: 1,
                repeats: 0,
            },
        );
        true
    }

    /// Closes the windows that ended before `now_ns` (all, with
    /// `i64::MAX`): their summary rows go to `out`.
    pub fn close(&mut self, now_ns: i64, out: &mut Vec<EventRow>) {
        let ended: Vec<CallKey> = self
            .open
            .iter()
            .filter(|(_, w)| now_ns.saturating_sub(w.first.ts_ns) >= WINDOW_NS)
            .map(|(k, _)| *k)
            .collect();
        for k in ended {
            if let Some(w) = self.open.remove(&k) {
                out.extend(summary(w));
            }
        }
    }
}

/// The row that says how many calls followed a window's first, if any.
fn summary(w: Window) -> Option<EventRow> {
    if w.repeats == 0 {
        return None;
    }
    let mut row = w.first;
    let first_ns = row.ts_ns;
    row.ts_ns = w.last_ns;
    if let Some(o) = row.data.as_object_mut() {
        o.insert("repeats".into(), w.repeats.into());
        o.insert("first_ns".into(), first_ns.into());
        o.insert("until_ns".into(), w.last_ns.into());
    }
    Some(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ts_ns: i64) -> EventRow {
        EventRow {
            ts_ns,
            kind: "cuda_call".into(),
            pid: 7,
            tid: 7,
            comm: "train".into(),
            data: serde_json::json!({"function": "cudaMalloc", "size": 1, "ret": 2}),
        }
    }

    #[test]
    fn a_failure_loop_is_one_row_a_window_with_every_call_counted() {
        let mut f = CallFold::default();
        let mut out = Vec::new();
        let key = (7, 1, 1 << 40, 2);
        let mut first = 0;
        // 10,000 calls over 2.5 s: windows at 0, 1 and 2 s.
        for i in 0..10_000i64 {
            let ts = i * 250_000;
            if f.admit(key, ts, || row(ts), &mut out) {
                first += 1;
            }
        }
        // Another process's call is its own.
        assert!(f.admit((8, 1, 1 << 40, 2), 10, || row(10), &mut out));
        f.close(i64::MAX, &mut out);
        assert_eq!(first, 3);
        let repeats: u64 = out
            .iter()
            .filter(|r| r.pid == 7)
            .map(|r| r.data["repeats"].as_u64().unwrap())
            .sum();
        assert_eq!(first + repeats, 10_000, "every call stored or counted");
        assert_eq!(out.len(), 3, "one summary a window, none for a single call");
        assert_eq!(out[0].data["first_ns"], 0);
        assert!(out[0].data["until_ns"].as_i64().unwrap() < WINDOW_NS);
        assert_eq!(f.folded, repeats);
    }

    #[test]
    fn a_fork_storm_keeps_its_allowance_and_counts_the_rest() {
        let mut f = CallFold::default();
        let mut out = Vec::new();
        let key = (0, FORKS, 7, 0);
        // 5,000 forks in 1 s, then one a second later.
        let kept = (0..5_000i64)
            .filter(|i| {
                f.admit_some(
                    key,
                    i * 200_000,
                    PROC_ALLOWANCE,
                    || row(i * 200_000),
                    &mut out,
                )
            })
            .count();
        assert_eq!(kept, PROC_ALLOWANCE as usize);
        assert!(f.admit_some(
            key,
            WINDOW_NS + 1,
            PROC_ALLOWANCE,
            || row(WINDOW_NS + 1),
            &mut out
        ));
        // A quiet parent loses nothing.
        let quiet = (0..PROC_ALLOWANCE as i64)
            .filter(|i| f.admit_some((0, FORKS, 8, 0), *i, PROC_ALLOWANCE, || row(*i), &mut out))
            .count();
        assert_eq!(quiet, PROC_ALLOWANCE as usize);
        f.close(i64::MAX, &mut out);
        assert_eq!(out.len(), 1, "one summary, for the storm's window: {out:?}");
        assert_eq!(out[0].data["repeats"], 5_000 - u64::from(PROC_ALLOWANCE));
        assert_eq!(f.folded, 5_000 - u64::from(PROC_ALLOWANCE));
    }
}
