//! CUDA calls: each counted in its process's ledger; the notable ones
//! (failures, the virtual memory API, allocations of 64 MiB or more) kept
//! as events; identical failures folded into one row a window; GPU
//! out-of-memory failures joined with the ledgers once the calls before
//! them are in.

use std::sync::Arc;

use tracer_common::{CudaCall, cuda};

use super::Env;
use crate::{
    collect::decode::Event,
    correlate::cuda::CudaLedgers,
    record::EventRow,
    record::{GpuOomRecord, published::Published},
    recorder::{
        fold::CallFold,
        output::{Output, Outputs},
    },
    util::{term::escape, units::bytes},
};

/// CUDA allocations at least this large are stored as events.
const NOTABLE_CUDA_BYTES: u64 = 64 << 20;

/// The CUDA feature.
#[derive(Default)]
pub struct Cuda {
    /// The ledgers of the processes that use CUDA.
    pub ledgers: CudaLedgers,
    /// Out-of-memory failures waiting for the calls before them.
    ooms: Vec<CudaCall>,
    /// Identical failed calls, folded.
    fold: CallFold,
    /// Counts of failed allocations, published.
    published: Option<Arc<Published>>,
}

impl Cuda {
    /// A CUDA feature counting failed allocations into `published`.
    pub fn new(published: Option<Arc<Published>>) -> Self {
        Self {
            published,
            ..Default::default()
        }
    }

    /// A CUDA call. Only the notable ones become stored events (their row
    /// is built only then: this runs for every call, hundreds of thousands
    /// a second). A failure repeated within its window is counted, not
    /// handled again: a retry loop costs a row a second, not one a call.
    pub fn on_call(
        &mut self,
        env: &Env<'_>,
        c: &CudaCall,
        ev: &Event,
        row: impl Fn(&Event) -> EventRow,
        out: &mut Outputs,
    ) {
        if c.ret != 0
            && cuda::allocates(c.func)
            && let Some(n) = &self.published
        {
            n.cuda_failures.inc(vec![
                ("function", cuda::name(c.func).to_string()),
                ("error", c.ret.to_string()),
            ]);
        }
        if c.ret != 0 {
            let ts = env.clock.boot_to_wall(c.header.ts_boot_ns);
            let key = (c.header.pid, c.func, c.size, c.ret);
            let mut closed = Vec::new();
            let first = self.fold.admit(key, ts, || row(ev), &mut closed);
            out.extend(closed.into_iter().map(Output::Event));
            if !first {
                return;
            }
        }
        if c.ret == cuda::OUT_OF_MEMORY && cuda::allocates(c.func) {
            self.ooms.push(*c);
            out.push(Output::Event(row(ev)));
            return;
        }
        self.ledgers.on_call(
            c,
            env.clock.boot_to_wall(c.header.ts_boot_ns),
            env.model,
            env.session_id,
        );
        let vmm = matches!(
            c.func,
            cuda::MEM_CREATE | cuda::MEM_RELEASE | cuda::MEM_MAP | cuda::MEM_UNMAP
        );
        if c.ret != 0 || vmm || (cuda::allocates(c.func) && c.size >= NOTABLE_CUDA_BYTES) {
            out.push(Output::Event(row(ev)));
        }
    }

    /// A caching allocator's block event (its USDT probes).
    pub fn on_block(&mut self, env: &Env<'_>, u: &tracer_common::usdt::UsdtEvent, ts_ns: i64) {
        self.ledgers.on_block(u, ts_ns, env.model);
    }

    /// Whether GPU out-of-memory failures wait for their join.
    pub fn has_ooms(&self) -> bool {
        !self.ooms.is_empty()
    }

    /// The GPU out-of-memory failures, joined with the ledgers (the calls
    /// before them are in), oldest first.
    pub fn take_ooms(&mut self, env: &Env<'_>) -> Vec<GpuOomRecord> {
        let mut calls = std::mem::take(&mut self.ooms);
        calls.sort_by_key(|c| c.header.ts_boot_ns);
        calls
            .iter()
            .filter_map(|c| {
                let ts = env.clock.boot_to_wall(c.header.ts_boot_ns);
                self.ledgers.on_call(c, ts, env.model, env.session_id)
            })
            .collect()
    }

    /// A process ended: its final ledger (what it never freed) is stored.
    pub fn on_exit(&mut self, pid: u32, now_ns: i64, out: &mut Outputs) {
        let Some(s) = self.ledgers.on_exit(pid, now_ns) else {
            return;
        };
        if s.ledger.live_allocations > 0 {
            tracing::info!(
                "CUDA: pid {pid} ({}) exited holding {} in {} allocations",
                escape(&s.comm),
                bytes(s.ledger.total_bytes),
                s.ledger.live_allocations
            );
        }
        out.push(Output::Ledger(s));
    }

    /// Periodic work: ledger snapshots stored, long-gone processes forgotten.
    pub fn tick(&mut self, now_ns: i64, out: &mut Outputs) {
        out.extend(self.ledgers.tick(now_ns).into_iter().map(Output::Ledger));
    }

    /// Stores the summaries of the windows of identical failed calls that
    /// ended before `now_ns`.
    pub fn close_windows(&mut self, now_ns: i64, out: &mut Outputs) {
        let mut closed = Vec::new();
        self.fold.close(now_ns, &mut closed);
        out.extend(closed.into_iter().map(Output::Event));
    }

    /// Failed calls folded so far.
    pub fn folded(&self) -> u64 {
        self.fold.folded
    }

    /// GPU out-of-memory failures recorded.
    pub fn ooms(&self) -> u64 {
        self.ledgers.ooms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::fixtures::{World, cuda_call},
        recorder::{features::test_env, fold::WINDOW_NS},
    };

    fn rows(out: &[Output]) -> Vec<&EventRow> {
        out.iter()
            .filter_map(|o| match o {
                Output::Event(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    fn row_of(ev: &Event) -> EventRow {
        let h = ev.header();
        EventRow {
            ts_ns: h.ts_boot_ns as i64,
            kind: ev.kind().name().into(),
            pid: h.pid,
            tid: h.tid,
            comm: String::new(),
            data: ev.details(),
        }
    }

    #[test]
    fn a_retry_loop_of_failures_is_one_row_a_window_and_its_oom_waits_for_the_join() {
        let mut w = World::default();
        let env = test_env(&mut w);
        let mut c = Cuda::default();
        let mut out = Vec::new();
        for _ in 0..1_000 {
            let call = cuda_call(11, cuda::MALLOC, cuda::OUT_OF_MEMORY, 1 << 30, 0, 0);
            c.on_call(&env, &call, &Event::Cuda(call), row_of, &mut out);
        }
        assert_eq!(rows(&out).len(), 1, "the first failure only");
        assert!(c.has_ooms());
        let ooms = c.take_ooms(&env);
        assert_eq!(ooms.len(), 1);
        assert_eq!((ooms[0].process.pid, ooms[0].size), (11, 1 << 30));
        assert_eq!(ooms[0].function, "cudaMalloc");
        assert!(!c.has_ooms());
        c.close_windows(WINDOW_NS * 10, &mut out);
        let all = rows(&out);
        assert_eq!(all.len(), 2, "and the window's summary");
        assert_eq!(all[1].data["repeats"], 999);
        assert_eq!(c.folded(), 999);
    }

    #[test]
    fn only_notable_calls_become_rows_and_every_call_counts_in_the_ledger() {
        let mut w = World::default();
        let env = test_env(&mut w);
        let mut c = Cuda::default();
        let mut out = Vec::new();
        let small = cuda_call(7, cuda::MALLOC, 0, 1 << 20, 0xa000, 0);
        let big = cuda_call(7, cuda::MALLOC, 0, NOTABLE_CUDA_BYTES, 0xb000, 0);
        for call in [small, big] {
            c.on_call(&env, &call, &Event::Cuda(call), row_of, &mut out);
        }
        assert_eq!(rows(&out).len(), 1, "only the 64 MiB one");
        let held = c.ledgers.ledger(7).expect("a ledger");
        assert_eq!(held.live_allocations, 2);
        assert_eq!(held.total_bytes, (1 << 20) + NOTABLE_CUDA_BYTES);
        c.on_exit(7, 1_000, &mut out);
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Ledger(s) if s.at_exit && s.pid == 7)),
            "its last ledger is stored: {out:?}"
        );
    }
}
