//! The engine's routing: each input to the features that take it, in a
//! fixed order, and what they make to the journal.

use super::*;
use crate::recorder::heap::Of;

impl Engine {
    /// Kernel log records, with whatever else is already queued; the
    /// backlog found at start is stored at once, in one commit.
    pub(super) fn on_kmsg_batch(
        &mut self,
        first: KmsgEvent,
        rx: &mut mpsc::Receiver<KmsgEvent>,
    ) -> Result<(), StoreError> {
        self.on_kmsg(first);
        for _ in 0..MAX_BATCH {
            let Ok(ev) = rx.try_recv() else { break };
            self.on_kmsg(ev);
        }
        self.apply()?;
        if self.kills.has_backlog() {
            self.settle_unmatched(wall_now_ns(), false)?;
        }
        // A kill a report completed (a kernel mark that waited for its
        // line) is made durable now, not at the next tick.
        self.commit_kills().map(drop)
    }

    /// A kernel log record, to the feature it belongs to.
    pub(super) fn on_kmsg(&mut self, ev: KmsgEvent) {
        let now = wall_now_ns();
        match ev {
            KmsgEvent::Report(r) => self
                .kills
                .on_report(&mut env!(self), *r, now, &mut self.out),
            KmsgEvent::Xid(x) => {
                let ts = self.clock.kmsg_to_wall(x.ts_us);
                self.gpu.on_xid(x, ts, &mut self.out);
                self.late_gpu_deaths();
            }
            KmsgEvent::Reaped(_) => {}
            KmsgEvent::OomGroup(g) => self.kills.on_oom_group(g, &self.clock, &mut self.out),
        }
    }

    /// The CUDA calls before a GPU OOM or a kill come on the data ring (its
    /// reader was nudged): they are taken in first, so ledgers are as of
    /// the failure or the kill.
    pub(super) fn settle_gpu(
        &mut self,
        data: &mut mpsc::Receiver<Event>,
    ) -> Result<(), StoreError> {
        while let Ok(ev) = data.try_recv() {
            self.on_event(ev)?;
        }
        self.apply()?;
        self.commit_gpu_ooms()?;
        self.refresh_kill_gpu()
    }

    /// Recording into the spill store, and the store's file system has
    /// room again: the journal goes home, and the features follow the
    /// rows that moved.
    pub(super) fn go_home(&mut self) {
        let Some(imported) = self.journal.go_home() else {
            return;
        };
        let session = self.journal.session_id();
        self.summary.session_id = session;
        self.kills.moved(&imported.kill_ids, session);
        self.gpu.moved(&imported.gpu_oom_ids, session);
    }

    /// An event of a ring that carries kills, with whatever else is already
    /// queued behind it: all of it in one durable commit. Returns whether a
    /// kill was committed.
    pub(super) fn on_kill_batch(
        &mut self,
        first: Event,
        rx: &mut mpsc::Receiver<Event>,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<bool, StoreError> {
        self.on_event(first)?;
        for _ in 0..MAX_BATCH {
            // A stop asked meanwhile is answered first (the drain reads
            // the rest), not after a storm's full batch.
            if stop.has_changed().unwrap_or(true) {
                break;
            }
            let Ok(ev) = rx.try_recv() else { break };
            self.on_event(ev)?;
        }
        let committed = self.commit_kills()?;
        // A storm's aggregates are stored when their window ends, not at
        // the next tick (up to a period later).
        self.commit_storms(wall_now_ns(), false)?;
        self.apply()?;
        Ok(committed)
    }

    /// One ring event, routed: heap samples to the heap worker, CUDA calls
    /// to the CUDA feature, kills to the kills feature, the lives of
    /// processes to the model, the watcher, the heap worker, the CUDA
    /// ledgers and the kills (in that order). What they make waits in
    /// `out` for the journal.
    pub(super) fn on_event(&mut self, ev: Event) -> Result<(), StoreError> {
        Metrics::add(&self.metrics.events, 1);
        let clock = &self.clock;
        let wall = |ts_boot: u64| clock.boot_to_wall(ts_boot);
        match ev {
            Event::Cuda(c) => {
                if let Some(h) = &self.heap {
                    if !tracer_common::cuda::frees(c.func) {
                        h.notice(c.header.pid);
                    } else if c.ret == 0 {
                        h.cuda_free(Of::Cuda, c.header.pid, c.ptr);
                    }
                    // A context reset frees what the ledger holds on the
                    // device: their stacks go with them (read before the
                    // ledger applies it).
                    if c.ret == 0
                        && tracer_common::cuda::resets(c.func)
                        && let Some(f) = &self.cuda
                    {
                        for ptr in f.ledgers.reset_ptrs(c.header.pid, c.device) {
                            h.cuda_free(Of::Cuda, c.header.pid, ptr);
                        }
                    }
                }
                if let Some(cuda) = &mut self.cuda {
                    let env = env!(self);
                    let ev = Event::Cuda(c);
                    cuda.on_call(&env, &c, &ev, |e| row_of(env.clock, e), &mut self.out);
                }
                return Ok(());
            }
            Event::Usdt(u) => {
                if let Some(h) = &self.heap
                    && u.probe == tracer_common::usdt::TORCH_FREE
                {
                    h.cuda_free(Of::Blocks, u.header.pid, u.args[0]);
                }
                if let Some(cuda) = &mut self.cuda {
                    let ts = wall(u.header.ts_boot_ns);
                    cuda.on_block(&env!(self), &u, ts);
                }
                return Ok(());
            }
            // The map of memory cgroup ids, kept current: no row.
            Event::CgroupDir(d) => {
                let made = d.header.kind == tracer_common::kind::CGROUP_MKDIR;
                let path = crate::collect::decode::cgroup_path(&d);
                self.model.on_cgroup_dir(made, d.root, d.id, path);
                return Ok(());
            }
            // Heap samples go to the heap worker's thread, not the store:
            // no row is made for them.
            Event::HeapAlloc(a) => {
                if let Some(h) = &self.heap {
                    let ts = wall(a.header.ts_boot_ns).max(0) as u64;
                    h.alloc(a, ts);
                }
                return Ok(());
            }
            Event::HeapFree(f) => {
                if let Some(h) = &self.heap {
                    h.free(&f);
                }
                return Ok(());
            }
            Event::GrowthFault(s) => {
                if let Some(h) = &self.heap {
                    let ts = wall(s.header.ts_boot_ns).max(0) as u64;
                    h.fault(s, ts);
                }
                return Ok(());
            }
            Event::GrowthReturn(r) => {
                if let Some(h) = &self.heap {
                    let ts = wall(r.header.ts_boot_ns).max(0) as u64;
                    h.gave_back(&r, ts);
                }
                return Ok(());
            }
            Event::CudaStack(s) => {
                if let Some(h) = &self.heap {
                    let ts = wall(s.header.ts_boot_ns).max(0) as u64;
                    h.cuda_alloc(s, ts);
                }
                return Ok(());
            }
            Event::OomTip(s) => {
                // Its task's maps are read at once, off this thread: the
                // task may be stuck in the OOM it set off, holding its
                // memory map lock.
                if let Some(h) = &self.heap {
                    h.tip(s);
                }
                return Ok(());
            }
            _ => {}
        }
        let mut row = row_of(&self.clock, &ev);
        let now = wall_now_ns();
        // Forks and exits past their parent's allowance are counted, not
        // stored.
        let mut stored = true;
        match &ev {
            Event::OomVictim(v) => self.kills.on_victim(&mut env!(self), v, row.ts_ns, now),
            Event::SignalKill(s) => {
                stored = self.kills.on_signal(&mut env!(self), s, row.ts_ns, now) == Signal::Stored;
            }
            Event::Reap(r) => self.kills.on_reap(r, row.ts_ns, &mut self.out),
            Event::Exec(e) => {
                let args = crate::collect::decode::exec_cmdline(e);
                self.model.on_exec(
                    e.pid,
                    &c_str(&e.header.comm),
                    (&c_str(&e.filename), args),
                    e.memcg_id,
                    row.ts_ns,
                    StartTime::kernel(e.start_ns),
                );
                self.model.read_due(row.ts_ns);
                self.kills
                    .on_late_exec(&env!(self), e.pid, row.ts_ns, &mut self.out);
                if let Some(w) = &self.watcher {
                    w.on_exec(e.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exec(e.pid);
                }
            }
            Event::Fork(f) => {
                stored =
                    self.admit_churn(crate::recorder::fold::FORKS, u64::from(f.header.pid), &row);
                self.model.on_fork_at(
                    f.header.pid,
                    f.child_pid,
                    &c_str(&f.header.comm),
                    row.ts_ns,
                    StartTime::kernel(f.child_start_ns),
                );
                if let Some(w) = &self.watcher {
                    w.on_fork(f.child_pid);
                }
            }
            Event::Exit(x) => {
                // By name: an exit often comes before its fork (the two
                // rings are read apart), so its parent is not known yet.
                let name = crate::util::fnv1a(&x.header.comm);
                stored = self.admit_churn(crate::recorder::fold::EXITS, name, &row);
                self.on_abnormal_exit(x, row.ts_ns);
                self.model
                    .on_exit(x.pid, row.ts_ns, StartTime::kernel(x.start_ns));
                self.model.read_due(row.ts_ns);
                if let Some(w) = &self.watcher {
                    w.on_exit(x.pid);
                }
                if let Some(h) = &self.heap {
                    h.on_exit(x.pid, row.ts_ns.max(0) as u64);
                }
                if let Some(cuda) = &mut self.cuda {
                    cuda.on_exit(x.pid, row.ts_ns, &mut self.out);
                }
                if x.rss_known != 0 {
                    self.kills.on_exit_memory(
                        x,
                        row.ts_ns,
                        crate::util::sys::page_kb(),
                        &mut self.out,
                    );
                }
            }
            Event::MemcgOom(m) => {
                let path = self.model.memcg_by_id(m.memcg_id, false);
                row.data["memcg_path"] = path.into();
            }
            Event::Cuda(_)
            | Event::Usdt(_)
            | Event::HeapAlloc(_)
            | Event::HeapFree(_)
            | Event::GrowthFault(_)
            | Event::GrowthReturn(_)
            | Event::OomTip(_)
            | Event::CudaStack(_)
            | Event::CgroupDir(_) => unreachable!("routed above"),
        }
        if stored {
            self.out.push(Output::Event(row));
        }
        Ok(())
    }

    /// A process that ended abnormally (a status other than 0, a fatal
    /// signal other than SIGKILL, whose senders are recorded as kills)
    /// just after an Xid on its GPU: its death is recorded, with the Xid.
    fn on_abnormal_exit(&mut self, x: &tracer_common::ProcExit, ts_ns: i64) {
        if x.exit_known == 0 || x.exit_code == 0 || x.exit_code & 0x7f == libc::SIGKILL {
            return;
        }
        match self.gpu.fault_before(x.pid, x.exit_code, ts_ns) {
            Some(fault) => self.record_gpu_death(x, ts_ns, fault),
            None => self.gpu.hold_exit(x, ts_ns),
        }
    }

    /// Abnormal ends an Xid that came after them explains.
    pub(super) fn late_gpu_deaths(&mut self) {
        for (x, ts_ns, fault) in self.gpu.late_faults(wall_now_ns()) {
            self.record_gpu_death(&x, ts_ns, fault);
        }
    }

    fn record_gpu_death(
        &mut self,
        x: &tracer_common::ProcExit,
        ts_ns: i64,
        fault: crate::record::GpuFault,
    ) {
        tracing::warn!(
            "{} (pid {}) {} {:.1} s after Xid {} on GPU {}",
            crate::util::term::escape(&crate::collect::decode::c_str(&x.header.comm)),
            x.pid,
            fault.exit,
            (ts_ns - fault.xid.ts_ns) as f64 / 1e9,
            fault.xid.code,
            fault.pci
        );
        let env = env!(self);
        let rec = crate::correlate::kills::death_after_gpu_fault(
            &env.ctx(ts_ns),
            x,
            ts_ns,
            fault,
            crate::util::sys::page_kb(),
        );
        self.kills.queue(rec);
    }

    /// Whether a fork of `parent`'s (or an exit of a process named `name`,
    /// hashed) is within the allowance of its window, and so stored; past
    /// it, it is counted.
    pub(super) fn admit_churn(&mut self, kind: u32, key: u64, row: &EventRow) -> bool {
        let mut closed = Vec::new();
        let admitted = self.proc_fold.admit_some(
            (0, kind, key, 0),
            row.ts_ns,
            crate::recorder::fold::PROC_ALLOWANCE,
            || row.clone(),
            &mut closed,
        );
        self.out.extend(closed.into_iter().map(Output::Event));
        admitted
    }

    /// Stores the summaries of the windows of identical failed calls and of
    /// process churn that ended before `now_ns`.
    pub(super) fn close_call_windows(&mut self, now_ns: i64) {
        if let Some(cuda) = &mut self.cuda {
            cuda.close_windows(now_ns, &mut self.out);
            self.summary.folded_calls = cuda.folded();
        }
        let mut closed = Vec::new();
        self.proc_fold.close(now_ns, &mut closed);
        self.out.extend(closed.into_iter().map(Output::Event));
        self.summary.folded_procs = self.proc_fold.folded;
    }

    /// An NVML sample: the new GPU picture, folded into the timeline.
    pub(super) fn on_gpu_sample(&mut self, s: crate::nvml::GpuSample) -> Result<(), StoreError> {
        let traced = self
            .cuda
            .as_ref()
            .map(|c| &c.ledgers as &dyn crate::correlate::gpuview::TracedMemory);
        let env = env!(self);
        let took = s.took_us;
        let rows = self.gpu.on_sample(&env, s, traced, &mut self.out);
        Metrics::set(&self.metrics.nvml_samples, self.gpu.samples);
        Metrics::set(&self.metrics.nvml_last_us, took);
        if let Some(rows) = rows {
            self.summary.timeline_rows += self.journal.timeline(rows)?;
        }
        self.apply()
    }
}

/// The store's row of an event.
pub(super) fn row_of(clock: &Clock, ev: &Event) -> EventRow {
    let h = ev.header();
    EventRow {
        ts_ns: clock.boot_to_wall(h.ts_boot_ns),
        kind: ev.kind().name().into(),
        pid: h.pid,
        tid: h.tid,
        comm: c_str(&h.comm),
        data: ev.details(),
    }
}
