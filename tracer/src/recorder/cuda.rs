//! The recorder's CUDA side: attaching to every distinct CUDA library on
//! the node (one attachment per file, for all processes), the ledgers of
//! the processes that use them, and GPU out-of-memory records.

use std::collections::HashMap;

use tracer_common::{CudaCall, cuda};

use crate::correlate::proc_ref;
use crate::record::{GpuHolder, GpuOomRecord};
use crate::{
    collect::decode::c_str,
    model::{
        ProcessTable,
        ledger::{AllocKind, Change, Ledger, LedgerSummary},
    },
    probes::{Probes, uprobe::CUDA, watch::LibraryWatcher},
    store::{Store, StoreError},
};

/// Changed ledgers are stored this often.
const SNAPSHOT_NS: i64 = 10_000_000_000;
/// A ledger stays this long after its process exits (to explain a kill).
const KEEP_EXITED_NS: i64 = 300_000_000_000;

/// One process's ledger and when it was last stored.
pub struct Tracked {
    /// The ledger.
    pub ledger: Ledger,
    comm: String,
    dirty: bool,
    stored_ns: i64,
    exited_ns: Option<i64>,
}

/// The node-wide CUDA tracing state of the recorder.
pub struct GpuTracker {
    /// Finds and attaches to CUDA libraries, off the engine's thread.
    watcher: LibraryWatcher,
    ledgers: HashMap<u32, Tracked>,
    /// GPU out-of-memory failures recorded.
    pub ooms: u64,
}

impl GpuTracker {
    /// Takes the loaded probes (the CUDA programs must be loaded) and
    /// attaches to the CUDA libraries every process has now; the watcher
    /// goes on finding new ones on its own thread.
    pub fn new(probes: Probes) -> std::io::Result<Self> {
        Ok(Self {
            watcher: LibraryWatcher::spawn(probes, &CUDA)?,
            ledgers: HashMap::new(),
            ooms: 0,
        })
    }

    /// A process exec'd: its libraries are looked at a few times as it starts.
    pub fn on_exec(&mut self, pid: u32, _now_ns: i64) {
        self.watcher.on_exec(pid);
    }

    /// Periodic work: ledger snapshots, pruning.
    pub fn tick(&mut self, store: &Store, session: i64, now_ns: i64) -> Result<(), StoreError> {
        for (pid, t) in &mut self.ledgers {
            if t.dirty && now_ns - t.stored_ns >= SNAPSHOT_NS {
                store.insert_ledger(session, now_ns, *pid, &t.comm, false, &t.ledger.summary())?;
                t.dirty = false;
                t.stored_ns = now_ns;
            }
        }
        self.ledgers
            .retain(|_, t| t.exited_ns.is_none_or(|e| now_ns - e < KEEP_EXITED_NS));
        Ok(())
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
        let t = self.ledgers.entry(pid).or_insert_with(|| Tracked {
            ledger: Ledger::default(),
            comm: c_str(&c.header.comm),
            dirty: true,
            stored_ns: ts_ns,
            exited_ns: None,
        });
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
        })
    }

    /// A process ended: store its final ledger (what it never freed).
    pub fn on_exit(
        &mut self,
        store: &Store,
        session: i64,
        pid: u32,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        if let Some(t) = self.ledgers.get_mut(&pid) {
            let s = t.ledger.summary();
            if s.live_allocations > 0 {
                tracing::info!(
                    "CUDA: pid {pid} ({}) exited holding {} in {} allocations",
                    t.comm,
                    crate::util::units::bytes(s.total_bytes),
                    s.live_allocations
                );
            }
            store.insert_ledger(session, now_ns, pid, &t.comm, true, &s)?;
            t.exited_ns = Some(now_ns);
            t.dirty = false;
        }
        Ok(())
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

    /// Stops the watcher and removes every probe (slow: a kernel grace
    /// period per uprobe).
    pub fn detach(self) {
        self.watcher.stop();
    }
}

impl crate::correlate::gpuview::TracedMemory for GpuTracker {
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
