//! The heap worker: the heap tracer on a thread of its own, fed through a
//! bounded queue, with the maps of new processes read by readers beside
//! it. It publishes each traced process's snapshot every second, reports
//! where a killed process grew, and forgets exited processes after a while.

use std::collections::{HashMap, HashSet};

use tracer_common::{
    growth::GrowthSample,
    heap::{HeapAlloc, HeapFree},
};

mod cuda;
mod returns;

pub use super::growth::KillGrowth;
use super::{
    heap::{HeapTracer, Of, View},
    heap_maps::{MapsAgain, first_read},
};
use crate::{
    probes::python::PyProcs,
    record::{GrowthReport, HeapSnapshot, TipStack},
    stacks::maps::Mapping,
};

/// A snapshot asked of the worker, and every site with live bytes when
/// asked for.
pub type Reply = (HeapSnapshot, Vec<crate::record::HeapSite>);

/// Messages to the heap worker.
enum Msg {
    Alloc(Box<HeapAlloc>, u64),
    Free(HeapFree),
    Exit(u32, u64),
    Snapshot(u32, bool, tokio::sync::oneshot::Sender<Reply>),
    Fault(Box<GrowthSample>, u64),
    /// A range given back: (pid, start, len, wall time).
    Returned(u32, u64, u64, u64),
    ReturnsTraced,
    /// A CUDA allocation's stack, its wall time, and the mean bytes
    /// between samples under 1 MiB.
    CudaAlloc(Box<HeapAlloc>, u64, u64),
    /// A traced free of a pointer with a stack: (which, pid, pointer).
    CudaFree(super::heap::Of, u32, u64),
    /// The device memory of a process by stack (its CUDA allocations, or
    /// its caching allocator's blocks), asked for.
    CudaSnapshot(
        super::heap::Of,
        u32,
        tokio::sync::oneshot::Sender<HeapSnapshot>,
    ),
    /// A tip is waiting in `Urgent` (see [`HeapWorker::tip`]).
    Wake,
    /// A process's maps, read when its first sample came, and where its
    /// perf map is.
    Maps(u32, Vec<Mapping>, Option<crate::stacks::perfmap::Root>),
    Kill(u32, u64),
    /// The neighbour a kill's verdict blames: (victim, neighbour).
    Neighbour(u32, u32),
    Growth(u32, u64, tokio::sync::oneshot::Sender<GrowthReport>),
    Settle(std::sync::mpsc::SyncSender<()>),
    Exec(u32),
}

/// How long after a kill its growth report is still brought up to date
/// (samples taken just before it may still be queued behind it).
const KILL_SETTLE_NS: u64 = 15_000_000_000;

/// How long a stop waits for the worker to end.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The worker thread's nice value (the engine's is the process's).
const WORKER_NICE: libc::c_int = 10;

/// How long a process's last snapshot is kept after it exits (its kill
/// is committed long before).
const KEEP_AFTER_EXIT_NS: u64 = 120_000_000_000;

/// Exited processes whose state (samples, stacks, maps, names) is kept
/// for [`KEEP_AFTER_EXIT_NS`], at most: past this, the oldest are
/// forgotten at once (counted), except victims whose kill is still being
/// reported. A user whose short-lived processes are sampled (a fork storm
/// in a memory-limited cgroup) would otherwise hold about 20 KiB of the
/// recorder's memory per process for two minutes.
const MAX_EXITED_KEPT: usize = 512;

/// The heap tracer on a thread of its own (unwinding and naming must never
/// delay a kill's commit, nor the reading of the ring): samples go in
/// through a bounded queue (full: counted, dropped); each second every
/// traced process's snapshot is published, for the kills to carry, and a
/// snapshot can be asked for (it sees every sample sent before).
pub struct HeapWorker {
    tx: Option<std::sync::mpsc::SyncSender<Msg>>,
    /// Processes a sample was sent for: only their exits are the worker's
    /// business (a storm of other exits must not crowd out samples).
    sampled: std::sync::Mutex<HashMap<u32, MapsAgain>>,
    latest: std::sync::Arc<std::sync::Mutex<HashMap<u32, HeapSnapshot>>>,
    latest_cuda: std::sync::Arc<std::sync::Mutex<HashMap<u32, HeapSnapshot>>>,
    kills: std::sync::Arc<std::sync::Mutex<HashMap<u32, KillGrowth>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    forgotten: std::sync::Arc<std::sync::atomic::AtomicU64>,
    urgent: Urgent,
    /// Readers of tasks' maps (see [`MapsJob`]).
    maps: crate::util::handoff::Handoff<MapsJob>,
    maps_skipped: std::sync::atomic::AtomicU64,
    /// Set at stop: the worker ends without taking in its backlog (what
    /// the kills needed was settled before, within the stop's budget).
    quit: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The worker thread's id (0 until it runs), to raise its priority
    /// when the engine waits for it.
    tid: std::sync::Arc<std::sync::atomic::AtomicI32>,
    /// Where the stack programs learn of interpreters.
    python: Option<PyProcs>,
    /// What is known of them, and their code objects.
    interpreters: crate::stacks::python::Interpreters,
    /// What files hold interpreters.
    detector: crate::stacks::python::Detector,
    /// Device pointers whose allocations sent a stack, (pid, pointer):
    /// live allocations of 1 MiB or more, and the sampled smaller ones;
    /// and the caching allocators' blocks that did.
    cuda_ptrs: std::sync::Mutex<HashSet<(u32, u64)>>,
    block_ptrs: std::sync::Mutex<HashSet<(u32, u64)>>,
    /// Mean bytes between the CUDA allocations under 1 MiB that send a
    /// stack, as the programs were told (see [`HeapWorker::set_cuda_sample_bytes`]).
    cuda_sample_bytes: std::sync::atomic::AtomicU64,
}

/// Tipping stacks, taken by the worker before anything queued: the task
/// that tipped a kill may end soon after it (killed next, or done), and
/// its stack is unwound with its memory map, read while it lives.
type Urgent = std::sync::Arc<std::sync::Mutex<Vec<(Box<GrowthSample>, Option<Vec<Mapping>>)>>>;

/// A task's maps to read at once, off the engine's thread: a read of
/// /proc/PID/maps waits for the task's memory map lock, which a task stuck
/// in an OOM (the one that set it off, or one queued for the lock behind
/// it) may hold for seconds. Two readers take these only when idle (see
/// [`crate::util::handoff`]); a job neither can take is done without.
enum MapsJob {
    /// A process's first sample came: its maps, while it surely lives.
    First(u32),
    /// Code objects of a process's Python frames not read yet: read while
    /// it lives (it may be killed before the worker names the sample).
    Codes(u32, Vec<u64>),
    /// The stack that tipped an OOM kill: with its task's maps.
    Tip(Box<GrowthSample>),
}

/// How many threads read tasks' maps.
const MAPS_READERS: usize = 2;

/// Hands a tipping stack to the worker, ahead of its queue.
fn push_tip(
    urgent: &Urgent,
    tx: Option<&std::sync::mpsc::SyncSender<Msg>>,
    s: Box<GrowthSample>,
    maps: Option<Vec<Mapping>>,
) {
    if let Ok(mut u) = urgent.lock() {
        u.push((s, maps));
    }
    // A full queue needs no wake: the worker is busy, and looks at the
    // tips before each thing it takes.
    if let Some(tx) = tx {
        let _ = tx.try_send(Msg::Wake);
    }
}

impl HeapWorker {
    /// Starts the worker, for heap samples taken every `sample_bytes` and
    /// growth samples every `growth_sample_bytes` on average.
    /// `python`: where the stack programs learn of interpreters; with it,
    /// each sampled process's interpreter is looked for, and its samples
    /// carry Python frames.
    pub fn spawn(
        sample_bytes: u64,
        growth_sample_bytes: u64,
        view: View,
        python: Option<PyProcs>,
    ) -> std::io::Result<Self> {
        use std::sync::{Arc, Mutex, atomic::AtomicU64};
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(4096);
        let latest: Arc<Mutex<HashMap<u32, HeapSnapshot>>> = Arc::default();
        let kills: Arc<Mutex<HashMap<u32, KillGrowth>>> = Arc::default();
        let dropped = Arc::new(AtomicU64::new(0));
        let forgotten = Arc::new(AtomicU64::new(0));
        let urgent = Urgent::default();
        let worker_urgent = urgent.clone();
        let quit = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker_quit = quit.clone();
        let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        let worker_tid = tid.clone();
        let interpreters = crate::stacks::python::Interpreters::default();
        let detector = crate::stacks::python::Detector::default();
        let worker_interpreters = interpreters.clone();
        let latest_cuda: std::sync::Arc<std::sync::Mutex<HashMap<u32, HeapSnapshot>>> =
            Default::default();
        let out = Outputs {
            latest: latest.clone(),
            latest_cuda: latest_cuda.clone(),
            kills: kills.clone(),
            dropped: dropped.clone(),
            forgotten: forgotten.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("tracer-heap".into())
            .spawn(move || {
                // Below the engine: on a busy node, unwinding and naming
                // wait, a kill's commit does not.
                // SAFETY: plain syscalls on this thread's own id.
                unsafe {
                    let tid = libc::gettid();
                    worker_tid.store(tid, std::sync::atomic::Ordering::Relaxed);
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, WORKER_NICE);
                }
                // Made here: the symbolizer's caches stay on this thread.
                let mut tracer = HeapTracer::new(sample_bytes);
                tracer.set_interpreters(worker_interpreters);
                tracer.set_growth_sample_bytes(growth_sample_bytes);
                work(rx, tracer, view, out, worker_urgent, &worker_quit)
            })?;
        let maps =
            {
                let (tx, urgent, dropped) = (tx.clone(), urgent.clone(), dropped.clone());
                let (python, interpreters) = (python.clone(), interpreters.clone());
                let detector = detector.clone();
                crate::util::handoff::Handoff::spawn("tracer-maps", MAPS_READERS, move |job| {
                    match job {
                        MapsJob::First(pid) => {
                            if let Some((maps, root)) =
                                first_read(pid, python.as_ref(), &interpreters, &detector)
                                && tx.try_send(Msg::Maps(pid, maps, root)).is_err()
                            {
                                dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        MapsJob::Codes(pid, codes) => interpreters.read(pid, &codes),
                        MapsJob::Tip(s) => {
                            interpreters.read(s.header.pid, &interpreters.unread(s.header.pid, &s));
                            let maps = crate::stacks::maps::exec_mappings(s.header.pid).ok();
                            push_tip(&urgent, Some(&tx), s, maps);
                        }
                    }
                })?
            };
        Ok(Self {
            tx: Some(tx),
            sampled: std::sync::Mutex::default(),
            latest,
            latest_cuda,
            kills,
            thread: Some(thread),
            dropped,
            forgotten,
            urgent,
            maps,
            maps_skipped: Default::default(),
            python,
            interpreters,
            detector,
            cuda_ptrs: Default::default(),
            block_ptrs: Default::default(),
            cuda_sample_bytes: Default::default(),
            quit,
            tid,
        })
    }

    /// A sampled page fault (wall time `ts_ns`).
    pub fn fault(&self, s: Box<GrowthSample>, ts_ns: u64) {
        self.notice(s.header.pid);
        self.read_codes(&s);
        self.send(Msg::Fault(s, ts_ns));
    }

    /// Notes a process a sample is sent for: its maps are read by a reader
    /// at its first (since start or its last exec), while it surely lives
    /// (the worker may unwind its samples after it ended), and again as it
    /// runs ([`MapsAgain`]: libraries mapped later). The engine calls it at
    /// each CUDA call too, so that its allocations' stacks carry Python
    /// frames from the first.
    pub fn notice(&self, pid: u32) {
        let now = std::time::Instant::now();
        let read = self
            .sampled
            .lock()
            .is_ok_and(|mut p| match p.get_mut(&pid) {
                None => {
                    p.insert(pid, MapsAgain::from(now));
                    true
                }
                Some(again) => again.due(now),
            });
        if read && self.maps.offer(MapsJob::First(pid)).is_err() {
            self.maps_skipped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A process followed from the start (`attach --host`, `growth
    /// --pid`): its maps and its interpreter are read now, so that its
    /// first samples carry Python frames too.
    pub fn follow(&self, pid: u32) {
        if self.sampled.lock().is_ok_and(|mut p| {
            p.insert(pid, MapsAgain::from(std::time::Instant::now()))
                .is_none()
        }) && let Some(tx) = &self.tx
            && let Some((maps, root)) = first_read(
                pid,
                self.python.as_ref(),
                &self.interpreters,
                &self.detector,
            )
            && tx.try_send(Msg::Maps(pid, maps, root)).is_err()
        {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Has the code objects of a sample's Python frames read at once, by
    /// an idle reader, while its process surely lives.
    fn read_codes(&self, s: &HeapAlloc) {
        // Both readers busy: the next sample asks again, and the worker
        // reads what is left when it names the sample.
        let codes = self.interpreters.unread(s.header.pid, s);
        if !codes.is_empty() {
            let _ = self.maps.offer(MapsJob::Codes(s.header.pid, codes));
        }
    }

    /// A process exec'd a new program: its addresses mean other code now.
    pub fn on_exec(&self, pid: u32) {
        if self.unsample(pid) {
            self.interpreters.forget(pid);
            self.send(Msg::Exec(pid));
            // And its maps read again now, behind the exec in the worker's
            // queue. A read offered before the exec (a sample taken between
            // fork and exec, in the parent's program) may deliver its maps
            // after the exec: the last maps the worker gets must be the new
            // program's.
            self.notice(pid);
        }
    }

    /// The stack that tipped an OOM kill: an idle reader reads its task's
    /// maps at once (with both busy it goes without; the worker reads them
    /// when it unwinds), and the worker takes it ahead of its queue.
    pub fn tip(&self, s: Box<GrowthSample>) {
        if let Err(job) = self.maps.offer(MapsJob::Tip(s)) {
            self.maps_skipped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let MapsJob::Tip(s) = job {
                push_tip(&self.urgent, self.tx.as_ref(), s, None);
            }
        }
    }

    /// Reads of tasks' maps not made: both readers were busy.
    pub fn maps_skipped(&self) -> u64 {
        self.maps_skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A kill of `pid` at wall time `ts_ns` was recorded: the worker
    /// reports where it grew before (see [`HeapWorker::kill_growth`]).
    pub fn on_kill(&self, pid: u32, ts_ns: u64) {
        self.send(Msg::Kill(pid, ts_ns));
    }

    /// The kill of `victim` blames `neighbour`: its growth in the window
    /// before the kill is reported with the victim's.
    pub fn kill_neighbour(&self, victim: u32, neighbour: u32) {
        self.send(Msg::Neighbour(victim, neighbour));
    }

    /// What the worker has found so far for the kill of `pid`.
    /// Never waits: `None` while the worker holds the map (it runs
    /// niced, and on a busy node a wait for it was a wait of seconds for
    /// the engine); the engine asks again at its next tick.
    pub fn kill_growth(&self, pid: u32) -> Option<KillGrowth> {
        self.kills.try_lock().ok()?.get(&pid).cloned()
    }

    /// Asks for the growth of `pid` over the `window_s` seconds to now,
    /// after every sample sent so far. `None` while the queue is full.
    pub fn request_growth(
        &self,
        pid: u32,
        window_s: u64,
    ) -> Option<tokio::sync::oneshot::Receiver<GrowthReport>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .as_ref()?
            .try_send(Msg::Growth(pid, window_s, tx))
            .ok()?;
        Some(rx)
    }

    fn send(&self, m: Msg) {
        if let Some(tx) = &self.tx
            && tx.try_send(m).is_err()
        {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A sampled allocation (wall time `ts_ns`).
    pub fn alloc(&self, a: Box<HeapAlloc>, ts_ns: u64) {
        self.notice(a.header.pid);
        self.read_codes(&a);
        self.send(Msg::Alloc(a, ts_ns));
    }

    /// A sampled block freed.
    pub fn free(&self, f: &HeapFree) {
        self.send(Msg::Free(*f));
    }

    /// Asks for the snapshot of `pid` after every sample sent so far, with
    /// every site with live bytes when `all`; the answer comes when the worker
    /// has taken in what was queued before. `None` while the queue is full
    /// (the caller asks again; it never waits here).
    pub fn request(&self, pid: u32, all: bool) -> Option<tokio::sync::oneshot::Receiver<Reply>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .as_ref()?
            .try_send(Msg::Snapshot(pid, all, tx))
            .ok()?;
        Some(rx)
    }

    /// Waits (up to `limit`) until the worker has taken in everything sent
    /// before, and brought the kills' reports up to date. The engine waits
    /// on it now, so it runs at the engine's priority from here on.
    pub fn settle(&self, limit: std::time::Duration) {
        let Some(tx) = &self.tx else { return };
        let tid = self.tid.load(std::sync::atomic::Ordering::Relaxed);
        if tid > 0 {
            // SAFETY: plain syscall on a thread of this process.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0) };
        }
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let deadline = std::time::Instant::now() + limit;
        let mut msg = Msg::Settle(reply);
        loop {
            match tx.try_send(msg) {
                Ok(()) => break,
                Err(std::sync::mpsc::TrySendError::Full(m))
                    if std::time::Instant::now() < deadline =>
                {
                    msg = m;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
    }

    /// Samples dropped because the worker was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Exited processes whose state was forgotten early (past
    /// [`MAX_EXITED_KEPT`]).
    pub fn forgotten(&self) -> u64 {
        self.forgotten.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A process exited: when it was sampled, its last snapshot is taken
    /// now and kept a while.
    pub fn on_exit(&self, pid: u32, ts_ns: u64) {
        if self.unsample(pid) {
            self.send(Msg::Exit(pid, ts_ns));
        }
    }

    /// A sampled process's program ended (exit or exec; false: it was not
    /// sampled): the programs stop walking its Python frames at once, and
    /// its device pointers with stacks are dropped.
    fn unsample(&self, pid: u32) -> bool {
        if !self
            .sampled
            .lock()
            .is_ok_and(|mut s| s.remove(&pid).is_some())
        {
            return false;
        }
        if let Some(p) = &self.python {
            p.remove(pid);
        }
        for ptrs in [&self.cuda_ptrs, &self.block_ptrs] {
            if let Ok(mut ptrs) = ptrs.lock() {
                ptrs.retain(|&(p, _)| p != pid);
            }
        }
        true
    }

    /// The latest snapshot of `pid`.
    /// Never waits (see [`HeapWorker::kill_growth`]).
    pub fn latest(&self, pid: u32) -> Option<HeapSnapshot> {
        self.latest.try_lock().ok()?.get(&pid).cloned()
    }

    /// Stops the worker; what is still queued is not taken in. It is
    /// waited for briefly: a worker starved of CPU on a busy node (it runs
    /// niced) may be in the middle of one long step, and ends with the
    /// process instead of holding up the stop.
    pub fn stop(mut self) {
        self.quit.store(true, std::sync::atomic::Ordering::Relaxed);
        self.tx = None;
        // Idle readers end, and with them their senders to the worker.
        self.maps.close();
        if let Some(t) = self.thread.take() {
            let deadline = std::time::Instant::now() + STOP_WAIT;
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::debug!("the heap worker is still busy; it ends with the process");
            }
        }
    }
}

impl crate::correlate::KillEnricher for HeapWorker {
    fn enrich(&self, kill: &mut crate::record::KillRecord) {
        if kill.victim.heap.is_none() {
            kill.victim.heap = self.latest(kill.victim.pid);
        }
        // The report for this kill (a later kill of a reused pid is another).
        if let Some(k) = self.kill_growth(kill.victim.pid)
            && k.ts_ns.abs_diff(kill.ts_ns.max(0) as u64) < 1_000_000_000
        {
            if k.growth.is_some() {
                kill.growth = k.growth;
            }
            if k.neighbour.is_some() {
                kill.neighbour_growth = k.neighbour;
            }
            if k.tip.is_some() {
                kill.tipping_stack = k.tip;
            }
        }
    }
}

/// What the worker publishes.
struct Outputs {
    latest: std::sync::Arc<std::sync::Mutex<HashMap<u32, HeapSnapshot>>>,
    /// Each process's device memory by stack, each second.
    latest_cuda: std::sync::Arc<std::sync::Mutex<HashMap<u32, HeapSnapshot>>>,
    kills: std::sync::Arc<std::sync::Mutex<HashMap<u32, KillGrowth>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    forgotten: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Forgets an exited process's state, and its last snapshot.
fn forget_exited(
    tracer: &mut HeapTracer,
    comms: &mut HashMap<u32, String>,
    out: &Outputs,
    pid: u32,
) {
    tracer.forget(pid);
    comms.remove(&pid);
    if let Ok(mut m) = out.latest.lock() {
        m.remove(&pid);
    }
}

fn comm_of(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/comm"))
        .map(|c| String::from_utf8_lossy(&c).trim_end().to_string())
        .unwrap_or_default()
}

fn work(
    rx: std::sync::mpsc::Receiver<Msg>,
    mut tracer: HeapTracer,
    view: View,
    out: Outputs,
    urgent: Urgent,
    quit: &std::sync::atomic::AtomicBool,
) {
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::{Duration, Instant};
    let mut comms: HashMap<u32, String> = HashMap::new();
    let mut exited: Vec<(u32, u64)> = Vec::new();
    // Kills whose report is still brought up to date: victim -> kill time.
    let mut kills: HashMap<u32, u64> = HashMap::new();
    // Tipping stacks by victim, with when each came: one whose kill is not
    // here yet (the kill is sent after its commit, the tip as soon as it
    // is read) waits for it.
    let mut tips: HashMap<u32, (TipStack, u64)> = HashMap::new();
    // Blamed neighbours by victim, while their kills are reported.
    let neighbours: std::cell::RefCell<HashMap<u32, u32>> = Default::default();
    let mut next = Instant::now() + Duration::from_secs(1);
    let publish = |tracer: &mut HeapTracer, comms: &HashMap<u32, String>, pid: u32, now: u64| {
        if !tracer.pids().contains(&pid) {
            return;
        }
        let comm = comms.get(&pid).cloned().unwrap_or_default();
        let snap = tracer.snapshot(pid, &comm, now, &view, None);
        if let Ok(mut m) = out.latest.lock() {
            m.insert(pid, snap);
        }
    };
    // Brings the reports of these kills up to date. A victim with neither
    // growth samples nor a tipping stack has nothing to report, and costs
    // a lookup: a SIGKILL storm's thousands of kills stay cheap.
    let report_kills = |tracer: &mut HeapTracer,
                        comms: &HashMap<u32, String>,
                        kills: &mut dyn Iterator<Item = (u32, u64)>,
                        tips: &HashMap<u32, (TipStack, u64)>| {
        let lost = out.dropped.load(std::sync::atomic::Ordering::Relaxed);
        for (pid, ts) in kills {
            let grew = tracer.has_growth(pid);
            let neighbour = neighbours.borrow().get(&pid).copied();
            let neighbour = neighbour.filter(|&n| tracer.has_growth(n));
            if !grew && !tips.contains_key(&pid) && neighbour.is_none() {
                continue;
            }
            let mut report = |pid: u32| {
                let comm = comms.get(&pid).cloned().unwrap_or_default();
                let mut r = tracer.growth_report(pid, &comm, ts, super::growth::KILL_WINDOW_S, 10);
                r.lost_samples = lost;
                r
            };
            let growth = grew.then(|| report(pid));
            let neighbour = neighbour.map(report);
            if let Ok(mut m) = out.kills.lock() {
                m.insert(
                    pid,
                    KillGrowth {
                        ts_ns: ts,
                        growth,
                        neighbour,
                        tip: tips.get(&pid).map(|(t, _)| t.clone()),
                    },
                );
            }
        }
    };
    // A sample of a pid whose exit was read, taken after that exit, is of
    // a new holder of the pid: the earlier one's samples, stacks, maps and
    // name go first (its kill's report brought up to date a last time), so
    // the two are never summed nor named or unwound as one. A sample from
    // before the exit, read after it (the rings are read apart), is still
    // the earlier one's.
    let earlier_holder_gone = |tracer: &mut HeapTracer,
                               comms: &mut HashMap<u32, String>,
                               exited: &mut Vec<(u32, u64)>,
                               kills: &mut HashMap<u32, u64>,
                               tips: &mut HashMap<u32, (TipStack, u64)>,
                               pid: u32,
                               ts: u64| {
        let Some(i) = exited.iter().position(|&(p, x)| p == pid && ts > x) else {
            return;
        };
        exited.swap_remove(i);
        if let Some(k) = kills.remove(&pid) {
            report_kills(tracer, comms, &mut std::iter::once((pid, k)), tips);
        }
        tips.remove(&pid);
        neighbours.borrow_mut().remove(&pid);
        forget_exited(tracer, comms, &out, pid);
    };
    loop {
        if quit.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let waiting = urgent.lock().map(|mut u| std::mem::take(&mut *u));
        for (s, maps) in waiting.unwrap_or_default() {
            if let Some(maps) = maps.filter(|m| !m.is_empty()) {
                tracer.unwinders.set_maps(s.header.pid, &maps);
            }
            let victim = s.addr as u32;
            let at = crate::util::time::wall_now_ns().max(0) as u64;
            tips.insert(victim, (tracer.tip(&s), at));
            if let Some(&ts) = kills.get(&victim) {
                report_kills(
                    &mut tracer,
                    &comms,
                    &mut std::iter::once((victim, ts)),
                    &tips,
                );
            }
        }
        let msg = rx.recv_timeout(next.saturating_duration_since(Instant::now()));
        if let Ok(Msg::Alloc(s, ts) | Msg::Fault(s, ts) | Msg::CudaAlloc(s, ts, _)) = &msg {
            earlier_holder_gone(
                &mut tracer,
                &mut comms,
                &mut exited,
                &mut kills,
                &mut tips,
                s.header.pid,
                *ts,
            );
        }
        match msg {
            Ok(Msg::Alloc(a, ts)) => {
                comms
                    .entry(a.header.pid)
                    .or_insert_with(|| crate::collect::decode::c_str(&a.header.comm));
                tracer.alloc(&a, ts);
            }
            Ok(Msg::Free(f)) => tracer.free(&f),
            Ok(Msg::Fault(s, ts)) => {
                comms.insert(s.header.pid, crate::collect::decode::c_str(&s.header.comm));
                tracer.fault(&s, ts);
            }
            Ok(Msg::Returned(pid, start, len, ts)) => tracer.gave_back(pid, start, len, ts),
            Ok(Msg::ReturnsTraced) => tracer.set_returns_traced(),
            Ok(Msg::CudaAlloc(a, ts, sample_bytes)) => {
                comms
                    .entry(a.header.pid)
                    .or_insert_with(|| crate::collect::decode::c_str(&a.header.comm));
                tracer.cuda_alloc(&a, ts, sample_bytes);
            }
            Ok(Msg::CudaFree(of, pid, ptr)) => tracer.cuda_free(of, pid, ptr),
            Ok(Msg::CudaSnapshot(of, pid, reply)) => {
                let comm = comms.get(&pid).cloned().unwrap_or_else(|| comm_of(pid));
                let now = crate::util::time::wall_now_ns().max(0) as u64;
                let _ = reply.send(tracer.cuda_snapshot(of, pid, &comm, now, &view));
            }
            Ok(Msg::Exec(pid)) => tracer.exec(pid),
            Ok(Msg::Wake) => {}
            Ok(Msg::Maps(pid, maps, root)) => {
                tracer.unwinders.set_maps(pid, &maps);
                if let Some(root) = root {
                    tracer.set_perf_root(pid, root);
                }
            }
            Ok(Msg::Kill(pid, ts)) => {
                kills.insert(pid, ts);
                report_kills(&mut tracer, &comms, &mut std::iter::once((pid, ts)), &tips);
            }
            Ok(Msg::Neighbour(pid, n)) => {
                neighbours.borrow_mut().insert(pid, n);
                if let Some(&ts) = kills.get(&pid) {
                    report_kills(&mut tracer, &comms, &mut std::iter::once((pid, ts)), &tips);
                }
            }
            Ok(Msg::Settle(done)) => {
                report_kills(
                    &mut tracer,
                    &comms,
                    &mut kills.iter().map(|(&p, &t)| (p, t)),
                    &tips,
                );
                let _ = done.send(());
            }
            Ok(Msg::Growth(pid, window_s, reply)) => {
                let now = crate::util::time::wall_now_ns().max(0) as u64;
                let comm = comms.get(&pid).cloned().unwrap_or_else(|| comm_of(pid));
                // At least ten sites; more where the view asks (a profile).
                let mut r = tracer.growth_report(pid, &comm, now, window_s, view.top.max(10));
                r.lost_samples = out.dropped.load(std::sync::atomic::Ordering::Relaxed);
                let _ = reply.send(r);
            }
            Ok(Msg::Snapshot(pid, all, reply)) => {
                let now = crate::util::time::wall_now_ns().max(0) as u64;
                tracer.tick(now, &view);
                let comm = comms.get(&pid).cloned().unwrap_or_else(|| comm_of(pid));
                let snap = tracer.snapshot(pid, &comm, now, &view, None);
                let sites = if all {
                    tracer.all_sites(pid, now, &view)
                } else {
                    Vec::new()
                };
                let _ = reply.send((snap, sites));
            }
            Ok(Msg::Exit(pid, ts)) => {
                publish(&mut tracer, &comms, pid, ts);
                exited.push((pid, ts));
                // Over the cap by a quarter: back to it, oldest first.
                if exited.len() > MAX_EXITED_KEPT + MAX_EXITED_KEPT / 4 {
                    let mut excess = exited.len() - MAX_EXITED_KEPT;
                    let mut n = 0;
                    exited.retain(|&(pid, _)| {
                        if excess == 0 || kills.contains_key(&pid) || tips.contains_key(&pid) {
                            return true;
                        }
                        excess -= 1;
                        n += 1;
                        forget_exited(&mut tracer, &mut comms, &out, pid);
                        false
                    });
                    out.forgotten
                        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() < next {
            continue;
        }
        next += Duration::from_secs(1);
        let now = crate::util::time::wall_now_ns().max(0) as u64;
        tracer.tick(now, &view);
        tracer.prune_growth(now);
        report_kills(
            &mut tracer,
            &comms,
            &mut kills.iter().map(|(&p, &t)| (p, t)),
            &tips,
        );
        kills.retain(|_, ts| now.saturating_sub(*ts) < KILL_SETTLE_NS);
        neighbours.borrow_mut().retain(|v, _| kills.contains_key(v));
        // A tip is kept while its kill is, or, kill not come yet, for as
        // long as a kill is; dropping it at the next second's tick lost
        // the tip of a kill whose commit came just after that tick.
        tips.retain(|pid, (_, at)| {
            kills.contains_key(pid) || now.saturating_sub(*at) < KILL_SETTLE_NS
        });
        let gone: HashSet<u32> = exited.iter().map(|(p, _)| *p).collect();
        for pid in tracer.pids() {
            if !gone.contains(&pid) {
                publish(&mut tracer, &comms, pid, now);
            }
        }
        let cuda: HashMap<u32, HeapSnapshot> = tracer
            .cuda_pids()
            .into_iter()
            .map(|pid| {
                let comm = comms.get(&pid).cloned().unwrap_or_default();
                (pid, tracer.cuda_snapshot(Of::Cuda, pid, &comm, now, &view))
            })
            .collect();
        if let Ok(mut m) = out.latest_cuda.lock() {
            *m = cuda;
        }
        exited.retain(|&(pid, ts)| {
            let keep = now.saturating_sub(ts) < KEEP_AFTER_EXIT_NS;
            if !keep {
                forget_exited(&mut tracer, &mut comms, &out, pid);
            }
            keep
        });
        if let Ok(mut m) = out.kills.lock() {
            m.retain(|_, k| now.saturating_sub(k.ts_ns) < KEEP_AFTER_EXIT_NS);
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{growth::FAULT_USER, heap::how, kind};

    use super::*;

    /// A page fault sample of `pid` at `ip` (no stack: one frame).
    fn fault(pid: u32, ip: u64) -> Box<GrowthSample> {
        let mut s = GrowthSample::empty(kind::GROWTH_FAULT, pid);
        (s.size, s.func, s.how, s.ip) = (1 << 20, FAULT_USER, how::EXACT, ip);
        Box::new(s)
    }

    #[test]
    fn a_reused_pid_does_not_add_to_its_earlier_holders_growth() {
        let view = View {
            top: 10,
            growth_window_s: 60,
            old_after_s: 60,
        };
        let w = HeapWorker::spawn(0, 1 << 20, view, None).expect("the worker");
        // A pid no process here has (above the default pid_max).
        let pid = 4_000_000;
        let now = crate::util::time::wall_now_ns() as u64;
        let s = 1_000_000_000;
        w.fault(fault(pid, 0x1000), now - 5 * s);
        w.fault(fault(pid, 0x1000), now - 4 * s);
        w.on_exit(pid, now - 3 * s);
        // Taken before the exit, read after it: still the first holder's.
        w.fault(fault(pid, 0x1000), now - 3 * s - 1);
        let growth = |w: &HeapWorker| {
            w.request_growth(pid, 60)
                .expect("queued")
                .blocking_recv()
                .expect("an answer")
        };
        assert_eq!(growth(&w).samples, 3);
        // The pid's next holder grows: its own growth only.
        w.fault(fault(pid, 0x2000), now - 2 * s);
        let r = growth(&w);
        assert_eq!((r.samples, r.total_bytes), (1, 1 << 20), "{r:?}");
        w.stop();
    }
}
