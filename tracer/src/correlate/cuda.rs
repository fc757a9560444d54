//! The CUDA correlator: a ledger per process from its traced calls (what it
//! holds, by kind and device, and its recent history), and a GPU
//! out-of-memory record, with who else held the device, when an
//! allocation fails. Pure: the recorder stores the snapshots it returns.

use std::collections::{HashMap, hash_map::Entry};

use tracer_common::{
    CudaCall, cuda,
    usdt::{self, UsdtEvent},
};

use super::proc_ref;
use crate::{
    collect::decode::c_str,
    model::{
        ProcessTable, StartTime,
        ledger::{AllocKind, Change, Ledger, LedgerSummary},
        same_start,
    },
    record::{GpuHolder, GpuOomRecord, LedgerSnapshot},
};

/// Changed ledgers are stored this often.
const SNAPSHOT_NS: i64 = 10_000_000_000;
/// A ledger stays this long after its process exits (to explain a kill).
const KEEP_EXITED_NS: i64 = 300_000_000_000;

/// One process's ledger and when it was last stored.
pub struct Tracked {
    /// The ledger.
    pub ledger: Ledger,
    /// The process's start, as the process table knew it at its first
    /// call: a later holder of the pid is told from it.
    start: Option<StartTime>,
    comm: String,
    dirty: bool,
    stored_ns: i64,
    exited_ns: Option<i64>,
}

/// The ledgers of every traced process.
#[derive(Default)]
pub struct CudaLedgers {
    ledgers: HashMap<u32, Tracked>,
    /// GPU out-of-memory failures recorded.
    pub ooms: u64,
}

impl CudaLedgers {
    /// Periodic work: the snapshots of ledgers that changed (to store),
    /// and forgetting processes long gone.
    pub fn tick(&mut self, now_ns: i64) -> Vec<LedgerSnapshot> {
        let mut out = Vec::new();
        for (pid, t) in &mut self.ledgers {
            if t.dirty && now_ns - t.stored_ns >= SNAPSHOT_NS {
                out.push(LedgerSnapshot {
                    ts_ns: now_ns,
                    pid: *pid,
                    comm: t.comm.clone(),
                    at_exit: false,
                    ledger: t.ledger.summary(),
                });
                t.dirty = false;
                t.stored_ns = now_ns;
            }
        }
        self.ledgers
            .retain(|_, t| t.exited_ns.is_none_or(|e| now_ns - e < KEEP_EXITED_NS));
        out
    }

    /// The caching allocator figures of the live processes that have them.
    pub fn allocators(&self) -> Vec<(u32, crate::model::ledger::AllocatorSummary)> {
        self.ledgers
            .iter()
            .filter(|(_, t)| t.exited_ns.is_none())
            .filter_map(|(pid, t)| Some((*pid, t.ledger.allocator()?)))
            .collect()
    }

    /// Pinned host memory of the live processes that hold some.
    pub fn pinned_by_pid(&self) -> Vec<(u32, u64)> {
        self.ledgers
            .iter()
            .filter(|(_, t)| t.exited_ns.is_none())
            .map(|(pid, t)| (*pid, t.ledger.outstanding(AllocKind::PinnedHost)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// A traced call. Returns a GPU OOM record when an allocation failed
    /// for lack of memory.
    pub fn on_call(
        &mut self,
        c: &CudaCall,
        ts_ns: i64,
        model: &ProcessTable,
        session: i64,
    ) -> Option<GpuOomRecord> {
        let pid = c.header.pid;
        let t = tracked(&mut self.ledgers, &c.header, ts_ns, model);
        let change = t.ledger.apply(c, ts_ns);
        t.dirty = true;
        let Change::Failed(kind, size, ret) = change else {
            return None;
        };
        if ret != cuda::OUT_OF_MEMORY {
            return None;
        }
        self.ooms += 1;
        let held = t.ledger.summary();
        let comm = t.comm.clone();
        let device = c.device;
        let mut others: Vec<GpuHolder> = self
            .ledgers
            .iter()
            .filter(|(p, t)| **p != pid && t.exited_ns.is_none())
            .filter_map(|(p, t)| {
                let s = t.ledger.summary();
                let on_device = s.by_device.get(&device).copied().unwrap_or(0);
                (on_device > 0).then(|| GpuHolder {
                    process: proc_ref(*p, t.comm.clone(), model.get(*p)),
                    device_bytes: on_device,
                    ledger: s,
                })
            })
            .collect();
        others.sort_by_key(|h| std::cmp::Reverse(h.device_bytes));
        let mut gaps = Vec::new();
        if device < 0 {
            gaps.push("the device is unknown: the process chose it before tracing started".into());
        }
        if held.untracked_frees > 0 {
            gaps.push("the process allocated memory before tracing started: what it held is a lower bound".into());
        }
        Some(GpuOomRecord {
            ts_ns,
            process: proc_ref(pid, comm, model.get(pid)),
            function: tracer_common::cuda::name(c.func).into(),
            size,
            kind,
            device,
            ret,
            tid: c.header.tid,
            held,
            others,
            session_id: Some(session),
            gaps,
            nvml: None,
            stacks: Vec::new(),
        })
    }

    /// A caching allocator's USDT probe (PyTorch's `malloc` / `free` of a
    /// block inside its segments), counted in its process's ledger.
    pub fn on_block(&mut self, e: &UsdtEvent, ts_ns: i64, model: &ProcessTable) {
        let t = tracked(&mut self.ledgers, &e.header, ts_ns, model);
        apply_block(&mut t.ledger, e);
        t.dirty = true;
    }

    /// A process ended: its final ledger (what it never freed), to store.
    pub fn on_exit(&mut self, pid: u32, now_ns: i64) -> Option<LedgerSnapshot> {
        let t = self.ledgers.get_mut(&pid)?;
        t.exited_ns = Some(now_ns);
        t.dirty = false;
        Some(LedgerSnapshot {
            ts_ns: now_ns,
            pid,
            comm: t.comm.clone(),
            at_exit: true,
            ledger: t.ledger.summary(),
        })
    }

    /// The pointers a context reset of `device` frees in `pid`'s ledger.
    pub fn reset_ptrs(&self, pid: u32, device: i32) -> Vec<u64> {
        self.ledgers
            .get(&pid)
            .map(|t| t.ledger.reset_ptrs(device))
            .unwrap_or_default()
    }

    /// The ledger of `pid`, if it used CUDA.
    pub fn ledger(&self, pid: u32) -> Option<LedgerSummary> {
        self.ledgers.get(&pid).map(|t| t.ledger.summary())
    }

    /// Pinned host memory `pid` holds (it is charged to its memory cgroup).
    pub fn pinned(&self, pid: u32) -> u64 {
        self.ledgers
            .get(&pid)
            .map(|t| t.ledger.outstanding(AllocKind::PinnedHost))
            .unwrap_or(0)
    }
}

impl super::gpuview::TracedMemory for CudaLedgers {
    fn device_bytes(&self, pid: u32, device: u32) -> Option<u64> {
        let l = self.ledger(pid)?;
        Some(l.by_device.get(&(device as i32)).copied().unwrap_or(0))
    }

    fn pinned(&self, pid: u32) -> Option<u64> {
        let l = self.ledger(pid)?;
        Some(
            l.by_kind
                .get(&AllocKind::PinnedHost)
                .map(|t| t.outstanding)
                .unwrap_or(0),
        )
    }
}

/// The ledger of the process an event is from: a new one at its first, or
/// where the ledger kept for its pid is an earlier holder's. That one
/// exited before the event (its final ledger was stored then), or, its
/// exit lost, started at another time than the process the table knows
/// now. An event from before that exit (read late, from another ring) is
/// still its own.
fn tracked<'a>(
    ledgers: &'a mut HashMap<u32, Tracked>,
    h: &tracer_common::EventHeader,
    ts_ns: i64,
    model: &ProcessTable,
) -> &'a mut Tracked {
    let start = model.get(h.pid).and_then(|p| p.start);
    let fresh = || Tracked {
        ledger: Ledger::default(),
        start,
        comm: c_str(&h.comm),
        dirty: true,
        stored_ns: ts_ns,
        exited_ns: None,
    };
    match ledgers.entry(h.pid) {
        Entry::Occupied(mut e) => {
            let t = e.get();
            let ended = t.exited_ns.is_some_and(|x| ts_ns >= x);
            if ended || same_start(t.start, start) == Some(false) {
                e.insert(fresh());
            }
            e.into_mut()
        }
        Entry::Vacant(v) => v.insert(fresh()),
    }
}

/// Applies one caching allocator probe to a ledger:
/// `malloc(ptr, int8 device, size, stream)`, `free(ptr)`.
pub fn apply_block(ledger: &mut Ledger, e: &UsdtEvent) {
    match e.probe {
        usdt::TORCH_MALLOC if e.nargs >= 3 => {
            ledger.block_malloc(e.args[0], e.args[2], e.args[1] as i64 as i32)
        }
        usdt::TORCH_FREE if e.nargs >= 1 => ledger.block_free(e.args[0]),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{correlate::fixtures::cuda_call as call, model::cgroup::CgroupLayout};

    const GIB: u64 = 1 << 30;

    #[test]
    fn an_out_of_memory_failure_names_what_each_process_held_on_the_device() {
        let model = ProcessTable::new(CgroupLayout::default(), 0, 16);
        let mut l = CudaLedgers::default();
        assert!(
            l.on_call(
                &call(10, cuda::MALLOC, 0, 2 * GIB, 0xa000, 0),
                100,
                &model,
                1
            )
            .is_none()
        );
        assert!(
            l.on_call(&call(11, cuda::MALLOC, 0, GIB, 0xb000, 0), 200, &model, 1)
                .is_none()
        );
        assert!(
            l.on_call(
                &call(12, cuda::MALLOC, 0, 3 * GIB, 0xc000, 1),
                250,
                &model,
                1
            )
            .is_none()
        );
        let oom = l
            .on_call(
                &call(11, cuda::MALLOC, cuda::OUT_OF_MEMORY, GIB, 0, 0),
                300,
                &model,
                1,
            )
            .expect("a GPU OOM record");
        assert_eq!(l.ooms, 1);
        assert_eq!((oom.process.pid, oom.size, oom.device), (11, GIB, 0));
        assert_eq!(oom.function, "cudaMalloc");
        assert_eq!(oom.held.total_bytes, GIB);
        let others: Vec<(u32, u64)> = oom
            .others
            .iter()
            .map(|h| (h.process.pid, h.device_bytes))
            .collect();
        assert_eq!(others, [(10, 2 * GIB)], "only who holds device 0");
        // A failure that is not out-of-memory makes no record.
        assert!(
            l.on_call(&call(11, cuda::MALLOC, 1, GIB, 0, 0), 310, &model, 1)
                .is_none()
        );
        assert!(
            l.on_call(&call(11, cuda::FREE, 0, 0, 0xb000, 0), 320, &model, 1)
                .is_none()
        );
        assert_eq!(l.ledger(11).unwrap().total_bytes, 0, "freed");
    }

    #[test]
    fn a_reused_pid_gets_a_ledger_of_its_own() {
        let mut model = ProcessTable::new(CgroupLayout::default(), 0, 16);
        let mut l = CudaLedgers::default();
        let start = |ns| StartTime::kernel(ns);
        model.on_fork_at(1, 30, "old", 100, start(100));
        l.on_call(
            &call(30, cuda::MALLOC, 0, 2 * GIB, 0xa000, 0),
            200,
            &model,
            1,
        );
        l.on_exit(30, 1_000).expect("its final ledger");
        // A call made before the exit, read after it: still the old one's.
        l.on_call(&call(30, cuda::MALLOC, 0, GIB, 0xb000, 0), 900, &model, 1);
        assert_eq!(l.ledger(30).unwrap().total_bytes, 3 * GIB);
        // The pid's next holder: a ledger of its own, counted as live.
        model.on_fork_at(1, 30, "new", 2_000, start(2_000));
        l.on_call(&call(30, cuda::MALLOC, 0, GIB, 0xc000, 0), 2_100, &model, 1);
        assert_eq!(l.ledger(30).unwrap().total_bytes, GIB);
        assert_eq!(l.pinned_by_pid(), [], "no pinned memory");
        let oom = l
            .on_call(
                &call(32, cuda::MALLOC, cuda::OUT_OF_MEMORY, GIB, 0, 0),
                2_200,
                &model,
                1,
            )
            .expect("a GPU OOM record");
        let others: Vec<(u32, u64)> = oom
            .others
            .iter()
            .map(|h| (h.process.pid, h.device_bytes))
            .collect();
        assert_eq!(others, [(30, GIB)], "the live holder, not the dead one");
        // Its exit was lost: the table's next start of the pid tells.
        model.on_fork_at(1, 30, "third", 3_000, start(3_000));
        l.on_call(
            &call(30, cuda::MALLOC, 0, 4 * GIB, 0xd000, 0),
            3_100,
            &model,
            1,
        );
        assert_eq!(l.ledger(30).unwrap().total_bytes, 4 * GIB);
    }

    #[test]
    fn snapshots_when_changed_and_at_exit_then_forgotten() {
        let model = ProcessTable::new(CgroupLayout::default(), 0, 16);
        let mut l = CudaLedgers::default();
        l.on_call(
            &call(20, cuda::MALLOC_HOST, 0, GIB, 0xd000, -1),
            0,
            &model,
            1,
        );
        assert!(l.tick(SNAPSHOT_NS / 2).is_empty(), "not yet");
        let s = l.tick(SNAPSHOT_NS);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].pid, s[0].at_exit, s[0].ledger.total_bytes),
            (20, false, GIB)
        );
        assert!(l.tick(2 * SNAPSHOT_NS).is_empty(), "unchanged since");
        assert_eq!(
            l.pinned(20),
            GIB,
            "pinned host memory counts against the memcg"
        );
        let fin = l.on_exit(20, 3 * SNAPSHOT_NS).expect("a final ledger");
        assert!(
            fin.at_exit && fin.ledger.live_allocations == 1,
            "it never freed it"
        );
        assert!(l.on_exit(21, 0).is_none(), "not a CUDA process");
        l.tick(3 * SNAPSHOT_NS + KEEP_EXITED_NS);
        assert!(l.ledger(20).is_none(), "forgotten");
    }

    #[test]
    fn a_kill_of_a_cuda_process_is_enriched_with_its_ledger() {
        use crate::{
            correlate::KillEnricher,
            record::{KillRecord, Victim},
        };
        let model = ProcessTable::new(CgroupLayout::default(), 0, 16);
        let mut l = CudaLedgers::default();
        l.on_call(
            &call(30, cuda::MALLOC_HOST, 0, GIB, 0xe000, -1),
            0,
            &model,
            1,
        );
        let mut k = KillRecord {
            victim: Victim {
                pid: 30,
                ..Default::default()
            },
            ..Default::default()
        };
        l.enrich(&mut k);
        let gpu = k.victim.gpu.expect("the victim's ledger");
        assert_eq!(gpu.by_kind[&AllocKind::PinnedHost].outstanding, GIB);
        let mut other = KillRecord::default();
        l.enrich(&mut other);
        assert!(other.victim.gpu.is_none(), "not a CUDA process");
    }
}
