//! The recorder's CUDA side: attaching to every distinct CUDA library on
//! the node (one attachment per file, for all processes), the ledgers of
//! the processes that use them, and GPU out-of-memory records.

use std::collections::{HashMap, HashSet};

use tracer_common::{CudaCall, cuda};

use crate::correlate::proc_ref;
use crate::record::{GpuHolder, GpuOomRecord};
use crate::{
    collect::decode::c_str,
    model::{
        ProcessTable,
        ledger::{AllocKind, Change, Ledger, LedgerSummary},
        proc,
    },
    probes::{
        Probes,
        cuda::{CudaAttachment, libraries_of},
    },
    store::{Store, StoreError},
};

/// Rescans of a new process's maps after its exec (libraries such as
/// libcudart are often loaded seconds later, at `import torch`).
const RESCAN_AFTER_EXEC_NS: [i64; 3] = [1_000_000_000, 3_000_000_000, 10_000_000_000];
/// A full scan of every process, for what the exec rescans missed.
const FULL_SCAN_NS: i64 = 30_000_000_000;
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
    probes: Probes,
    attached: Vec<CudaAttachment>,
    seen: HashSet<(u64, u64)>,
    rescans: Vec<(u32, i64)>,
    last_full_scan_ns: Option<i64>,
    ledgers: HashMap<u32, Tracked>,
    /// GPU out-of-memory failures recorded.
    pub ooms: u64,
}

impl GpuTracker {
    /// Takes the loaded probes (the CUDA programs must be loaded).
    pub fn new(probes: Probes) -> Self {
        Self {
            probes,
            attached: Vec::new(),
            seen: HashSet::new(),
            rescans: Vec::new(),
            last_full_scan_ns: None,
            ledgers: HashMap::new(),
            ooms: 0,
        }
    }

    /// Attaches to the CUDA libraries `pid` has that are not attached yet.
    fn scan(&mut self, pid: u32) {
        let Ok(libs) = libraries_of(pid) else { return };
        for lib in libs {
            if !self.seen.insert(lib.id) {
                continue;
            }
            match self.probes.attach_cuda(&lib, None, false) {
                Ok(att) => {
                    tracing::info!(
                        "CUDA: attached to {} ({} functions; found in pid {pid}{})",
                        lib.path,
                        att.attached(),
                        if lib.executable {
                            ", linked into the executable"
                        } else {
                            ""
                        }
                    );
                    for (sym, why) in &att.failed {
                        tracing::warn!("CUDA: {sym} in {}: {why}", lib.path);
                    }
                    self.attached.push(att);
                }
                Err(e) => tracing::warn!("CUDA: attaching to {} failed: {e}", lib.path),
            }
        }
    }

    /// Every process, now.
    fn full_scan(&mut self, now_ns: i64) {
        self.last_full_scan_ns = Some(now_ns);
        for pid in proc::all_pids() {
            self.scan(pid);
        }
    }

    /// A process exec'd: look at its libraries a few times as it starts.
    pub fn on_exec(&mut self, pid: u32, now_ns: i64) {
        self.rescans
            .extend(RESCAN_AFTER_EXEC_NS.iter().map(|d| (pid, now_ns + d)));
    }

    /// Periodic work: due rescans, the full scan, ledger snapshots, pruning.
    pub fn tick(&mut self, store: &Store, session: i64, now_ns: i64) -> Result<(), StoreError> {
        if self
            .last_full_scan_ns
            .is_none_or(|t| now_ns - t >= FULL_SCAN_NS)
        {
            self.full_scan(now_ns);
        }
        let due: Vec<u32> = self
            .rescans
            .iter()
            .filter(|(_, t)| *t <= now_ns)
            .map(|(p, _)| *p)
            .collect();
        self.rescans.retain(|(_, t)| *t > now_ns);
        for pid in due {
            self.scan(pid);
        }
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

    /// Removes every probe (slow: a kernel grace period per uprobe).
    pub fn detach(mut self) {
        let n: usize = self.attached.iter().map(|a| a.attached() * 2).sum();
        if n > 0 {
            tracing::info!("CUDA: removing {n} probes");
        }
        for att in std::mem::take(&mut self.attached) {
            self.probes.detach_cuda(att);
        }
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
