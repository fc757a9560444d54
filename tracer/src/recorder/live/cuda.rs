//! `tracer attach --pid N`'s loop: the CUDA calls (and a caching
//! allocator's USDT probes) of one running process, put back in the order
//! they happened, counted in its ledger, and handed to a [`View`] as they
//! come, each second, and at the end.

use std::{os::fd::OwnedFd, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use tracer_common::{CudaCall, cuda, usdt::UsdtEvent};

use super::{
    Ends, RESCAN, Target,
    attached::{AllocatorProbes, Attached},
    drain, first_libraries, start_readers,
};
use crate::{
    collect::decode::Event,
    model::ledger::{AllocatorSummary, Change, Ledger},
    probes::{CUDA_DATA_RING_BYTES, Probes, uprobe::CUDA},
    record::HeapSnapshot,
    recorder::{
        heap::{Of, View as HeapView},
        heap_worker::HeapWorker,
    },
    util::time::Clock,
};

/// What a live CUDA view shows.
pub trait View {
    /// A call, with its wall time.
    fn call(&mut self, c: &CudaCall, ts_ns: i64);
    /// A caching allocator's block handed out or given back.
    fn block(&mut self, b: &UsdtEvent, ts_ns: i64);
    /// An allocation that failed for lack of device memory, with what the
    /// process's caching allocator held then.
    fn gpu_oom(&mut self, c: &CudaCall, ts_ns: i64, size: u64, allocator: &AllocatorSummary);
    /// The second's summary: calls and failed calls in it.
    fn summary(&mut self, ledger: &Ledger, calls: u64, failed: u64);
    /// The end: the process exited (or the view detached), with the events
    /// the rings lost.
    fn report(&mut self, ledger: &Ledger, exited: bool, lost: u64);
    /// A batch of calls was shown.
    fn flush(&mut self);
    /// The device memory the process's traced allocations hold, by the
    /// stack that allocated it (with `--by stack`): each second, and at
    /// the `end`.
    fn stacks(&mut self, snap: &HeapSnapshot, end: bool);
    /// At the end, with the stacks: what its caching allocator's blocks
    /// hold, by the stack that asked for them.
    fn blocks(&mut self, _snap: &HeapSnapshot) {}
}

/// The CUDA probes, loaded for `pid` (named `comm`); a process with no
/// CUDA library yet is refused unless `wait`.
pub fn load(
    pid: u32,
    comm: &str,
    pidfd: &OwnedFd,
    floor: bool,
    wait: bool,
) -> anyhow::Result<Probes> {
    let mut probes = Probes::load(CUDA_DATA_RING_BYTES).context("cannot attach")?;
    probes.load_family(&CUDA, floor)?;
    let libs = first_libraries(&CUDA, pid, comm, pidfd)?;
    if libs.is_empty() && !wait {
        bail!(
            "pid {pid} ({comm}) has no CUDA library loaded: none of its mapped files is a libcudart or libcuda, \
             and its executable has no cudart linked in; pass --wait to wait for one"
        );
    }
    Ok(probes)
}

/// An event of the traced process waiting to be put in order: the CUDA
/// calls and the allocator's probes come through two rings.
enum Pending {
    Call(CudaCall),
    Block(UsdtEvent),
    /// An allocation's stack: applied in order with the frees, or a free
    /// of an address handed out again would take the new allocation's.
    Stack(Box<tracer_common::heap::HeapAlloc>),
}

impl Pending {
    fn ts(&self) -> u64 {
        match self {
            Pending::Call(c) => c.header.ts_boot_ns,
            Pending::Block(b) => b.header.ts_boot_ns,
            Pending::Stack(s) => s.header.ts_boot_ns,
        }
    }

    /// The traced process's CUDA calls and allocator probes.
    fn of(ev: Event, pid: u32) -> Option<Self> {
        match ev {
            Event::Cuda(c) if c.header.pid == pid => Some(Pending::Call(c)),
            Event::Usdt(u) if u.header.pid == pid => Some(Pending::Block(u)),
            Event::CudaStack(s) if s.header.pid == pid => Some(Pending::Stack(s)),
            _ => None,
        }
    }
}

/// The ledger of the process and this second's counts.
struct Session<V> {
    ledger: Ledger,
    /// With `--by stack`: the stacks of its allocations, unwound and named
    /// off this thread.
    stacks: Option<HeapWorker>,
    clock: Clock,
    calls_this_second: u64,
    failed_this_second: u64,
    quiet_seconds: u32,
    view: V,
}

impl<V: View> Session<V> {
    /// Applies and shows buffered events, oldest first.
    fn calls(&mut self, pending: &mut Vec<Pending>) {
        pending.sort_by_key(Pending::ts);
        for p in pending.drain(..) {
            match p {
                Pending::Call(c) => self.call(&c),
                Pending::Stack(s) => {
                    if let Some(w) = &self.stacks {
                        let ts = self.clock.boot_to_wall(s.header.ts_boot_ns).max(0) as u64;
                        w.cuda_alloc(s, ts);
                    }
                }
                Pending::Block(b) => {
                    if b.probe == tracer_common::usdt::TORCH_FREE
                        && let Some(w) = &self.stacks
                    {
                        w.cuda_free(Of::Blocks, b.header.pid, b.args[0]);
                    }
                    crate::correlate::cuda::apply_block(&mut self.ledger, &b);
                    self.calls_this_second += 1;
                    let ts = self.clock.boot_to_wall(b.header.ts_boot_ns);
                    self.view.block(&b, ts);
                }
            }
        }
        self.view.flush();
    }

    fn call(&mut self, c: &CudaCall) {
        if c.ret == 0
            && cuda::frees(c.func)
            && let Some(w) = &self.stacks
        {
            w.cuda_free(Of::Cuda, c.header.pid, c.ptr);
        }
        // A context reset frees the ledger's device memory, and the
        // stacks of what it frees (read before the ledger applies it).
        if c.ret == 0
            && cuda::resets(c.func)
            && let Some(w) = &self.stacks
        {
            for ptr in self.ledger.reset_ptrs(c.device) {
                w.cuda_free(Of::Cuda, c.header.pid, ptr);
            }
        }
        let ts = self.clock.boot_to_wall(c.header.ts_boot_ns);
        let change = self.ledger.apply(c, ts);
        self.calls_this_second += 1;
        if matches!(change, Change::Failed(..)) {
            self.failed_this_second += 1;
        }
        if let Change::Failed(_, size, cuda::OUT_OF_MEMORY) = change
            && let Some(a) = self.ledger.allocator()
        {
            self.view.gpu_oom(c, ts, size, &a);
        }
        self.view.call(c, ts);
    }

    /// The per-second summary: shown when there were calls, and every
    /// 10 s of quiet as a heartbeat.
    fn summary(&mut self) {
        if self.calls_this_second == 0 && self.quiet_seconds < 9 {
            self.quiet_seconds += 1;
            return;
        }
        self.quiet_seconds = 0;
        self.view.summary(
            &self.ledger,
            self.calls_this_second,
            self.failed_this_second,
        );
        self.calls_this_second = 0;
        self.failed_this_second = 0;
    }
}

impl<V: View> Session<V> {
    /// Shows the device memory by stack, as the worker has it now; at the
    /// end, the caching allocator's blocks by stack too.
    async fn stacks(&mut self, pid: u32, end: bool) {
        let ask = |of| self.stacks.as_ref().and_then(|w| w.request_cuda(of, pid));
        let (segments, blocks) = (ask(Of::Cuda), if end { ask(Of::Blocks) } else { None });
        let wait = |rx| tokio::time::timeout(Duration::from_secs(2), rx);
        if let Some(rx) = segments
            && let Ok(Ok(snap)) = wait(rx).await
        {
            self.view.stacks(&snap, end);
        }
        if let Some(rx) = blocks
            && let Ok(Ok(snap)) = wait(rx).await
        {
            self.view.blocks(&snap);
        }
    }
}

/// The stacks of a process's CUDA allocations, grouped: `top` of them
/// shown; allocations under 1 MiB sampled once per `sample_bytes` on
/// average (0: every one).
#[derive(Clone, Copy, Debug)]
pub struct Stacks {
    /// Stacks listed.
    pub top: usize,
    /// Mean bytes between samples under 1 MiB.
    pub sample_bytes: u64,
}

/// Follows the CUDA calls of `f.pid` until it exits, `f.duration` runs
/// out, SIGINT or SIGTERM, showing them through `view` (handed back at
/// the end); with `by_stack`, the stacks of its allocations too (see
/// [`Stacks`]).
pub async fn follow<V: View>(
    f: Target,
    mut probes: Probes,
    view: V,
    by_stack: Option<Stacks>,
) -> anyhow::Result<V> {
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 65536)?;
    let stacks = match by_stack.filter(|_| !f.floor) {
        Some(Stacks { top, sample_bytes }) => {
            let python = probes.take_python_map().ok();
            probes.cuda_stacks(Some(sample_bytes))?;
            let view = HeapView {
                top,
                growth_window_s: 10,
                old_after_s: 30,
            };
            let w =
                HeapWorker::spawn(0, crate::probes::growth::DEFAULT_SAMPLE_BYTES, view, python)?;
            w.set_cuda_sample_bytes(sample_bytes);
            w.follow(f.pid);
            Some(w)
        }
        None => None,
    };
    let mut attached = Attached::new(&CUDA, f.pid, f.floor, f.entry_sites);
    attached.scan(&mut probes)?;
    // The caching allocator's USDT probes (PyTorch's), where the process has them.
    let mut allocator = if f.floor {
        None
    } else {
        probes.load_usdt()?;
        let mut a = AllocatorProbes::new(f.pid);
        a.scan(&mut probes)?;
        Some(a)
    };
    match attached.counts() {
        (_, 0) => crate::say!(
            "tracer: pid {} ({}) has no CUDA library yet; waiting for one to be loaded",
            f.pid,
            f.comm
        ),
        (functions, files) => crate::say!(
            "tracer: tracing pid {} ({}): {functions} functions in {files} files",
            f.pid,
            f.comm
        ),
    }
    let mut session = Session {
        ledger: Ledger::default(),
        stacks,
        clock: Clock::now(),
        calls_this_second: 0,
        failed_this_second: 0,
        quiet_seconds: 0,
        view,
    };
    let mut ends = Ends::new(f.pidfd, f.duration)?;
    let mut summary = tokio::time::interval(Duration::from_secs(1));
    summary.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    // The two rings are read separately; a short buffer puts calls back
    // in the order they happened before they are shown.
    let mut pending: Vec<Pending> = Vec::new();
    let mut reorder = tokio::time::interval(Duration::from_millis(20));
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => pending.extend(Pending::of(ev, f.pid)),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            _ = reorder.tick() => session.calls(&mut pending),
            _ = summary.tick() => {
                session.calls(&mut pending);
                session.summary();
                session.stacks(f.pid, false).await;
            }
            _ = rescan.tick() => {
                attached.scan(&mut probes)?;
                if let Some(a) = &mut allocator {
                    a.scan(&mut probes)?;
                }
            }
            end = ends.wait() => break end?,
            Some(r) = tasks.join_next() => {
                r??;
                return Err(anyhow!("a ring buffer reader stopped"));
            }
        }
    };
    drain(&mut rx, &mut tasks, |ev| {
        pending.extend(Pending::of(ev, f.pid))
    })
    .await;
    session.calls(&mut pending);
    session.stacks(f.pid, true).await;
    let lost = drops.read().map(|d| d.critical + d.data).unwrap_or(0);
    session.summary();
    session.view.report(&session.ledger, exited, lost);
    // Report first: removing a library's worth of probes takes seconds.
    if let Some(a) = allocator {
        a.detach(&mut probes);
    }
    attached.detach(&mut probes);
    Ok(session.view)
}
