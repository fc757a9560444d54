//! The process model: pid -> what the process is and where it lives,
//! seeded from /proc and kept current by the sched events. Exited
//! processes stay for a while, so a kill can still be explained after the
//! victim is gone.

pub mod cgroup;
pub mod kube;
pub mod ledger;
pub mod proc;
pub mod sampler;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use cgroup::{CgroupLayout, Owner, owner_of};
use proc::ProcInfo;

/// Exits of unknown pids remembered for a late fork (forgotten in bulk past this).
const EARLY_EXITS: usize = 65_536;
/// What the table's entries may take in memory, about (their slots and
/// strings, see [`ProcessTable::bytes`]), before exited entries are
/// dropped oldest first, whatever their retention. Live entries are real
/// processes and are never dropped. Each entry's slot is about 450 bytes,
/// so this keeps about 37,000 entries with short command lines, or 3,600
/// whose own lines are at the 4 KiB cap (forks share their parent's). The
/// hash table's spare slots can add as much again.
pub const BUDGET_BYTES: usize = 16 << 20;
/// The least time between two walks of the memory cgroups for an id not
/// known yet.
const MEMCG_WALK_GAP: std::time::Duration = std::time::Duration::from_millis(20);

/// A new program's /proc entries (command line, executable, uid, cgroups)
/// are read once it has run this long, not at its exec: most programs a
/// node starts (shell tools, probes, health checks) end sooner, and reading
/// five /proc files for each of them costs a process-churning workload
/// several percent. Until then, and for the ones that end sooner, the
/// kernel's exec event says what they are (name, file, memory cgroup). A
/// kill or a signal reads its processes at once.
pub const EXEC_READ_DELAY_NS: i64 = 100_000_000;

/// One process of the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// What /proc (or the events) said.
    pub info: ProcInfo,
    /// The memory cgroup path (v1 memory hierarchy, else v2).
    pub memcg: Option<String>,
    /// Who owns its cgroup.
    pub owner: Owner,
    /// Wall time of its exit, once seen.
    pub exited_ns: Option<i64>,
    /// Wall time it started (its fork event, or /proc's start time), when
    /// known: with `exited_ns`, what tells it from another holder of its pid.
    pub started_ns: Option<i64>,
    /// Its start on the boot clock, as the kernel or /proc said it: with
    /// the pid, what names it. Where both this and an event's are known,
    /// they alone decide whether the event is this process's.
    #[serde(default)]
    pub start: Option<StartTime>,
}

impl Process {
    /// What the entry's strings take, but its command line (shared with
    /// its forks: the table counts each line once); its slot is the
    /// table's to count.
    pub fn weight(&self) -> usize {
        let s = |o: &Option<String>| o.as_ref().map_or(0, String::len);
        let i = &self.info;
        let o = &self.owner;
        i.comm.len()
            + s(&i.exe)
            + s(&i.cgroups.memory_v1)
            + s(&i.cgroups.unified)
            // The memory cgroup path once more in the by-cgroup index.
            + 2 * s(&self.memcg)
            + s(&o.runtime)
            + s(&o.container_id)
            + s(&o.pod_uid)
            + s(&o.qos)
            + s(&o.unit)
            + o.kube.as_ref().map_or(0, |k| k.weight())
    }
}

/// When a process started, on the boot clock: the kernel's own value
/// (`task_struct.start_boottime`, ns), or /proc's, which is the same value
/// cut to clock ticks (`nsec_to_clock_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartTime {
    /// Boot-clock ns (for /proc's, the start of its tick).
    pub ns: u64,
    /// Whether `ns` is the kernel's exact value.
    pub exact: bool,
}

/// Nanoseconds in one of /proc's clock ticks (read once: every start
/// comparison uses it).
fn tick_ns() -> u64 {
    static TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        1_000_000_000 / hz
    })
}

impl StartTime {
    /// An event's start (0: the kernel's value was not read).
    pub fn kernel(ns: u64) -> Option<Self> {
        (ns != 0).then_some(Self { ns, exact: true })
    }

    /// /proc/PID/stat's start time (0: unknown).
    pub fn ticks(ticks: u64) -> Option<Self> {
        (ticks != 0).then(|| Self {
            ns: ticks.saturating_mul(tick_ns()),
            exact: false,
        })
    }

    /// The boot-clock ns it may stand for: [lo, hi).
    fn range(self) -> (u64, u64) {
        let width = if self.exact { 1 } else { tick_ns() };
        (self.ns, self.ns.saturating_add(width))
    }

    /// How the process that started at `self` stands to the one that
    /// started at `other`: `Equal` when they can be the same process,
    /// `Less` when it started before.
    pub fn order(self, other: Self) -> std::cmp::Ordering {
        let ((a0, a1), (b0, b1)) = (self.range(), other.range());
        if a1 <= b0 {
            std::cmp::Ordering::Less
        } else if b1 <= a0 {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }
}

/// How far apart the clocks of events and /proc may put the same moment.
const HOLDER_SLACK_NS: i64 = 100_000_000;

impl Process {
    /// Whether this entry can be the process that held its pid at wall
    /// time `ts_ns`: it had not ended before then (an ended entry is an
    /// earlier holder of a reused pid) and, where its start is known, it
    /// had started.
    pub fn held_pid_at(&self, ts_ns: i64) -> bool {
        self.exited_ns.is_none_or(|t| t + HOLDER_SLACK_NS >= ts_ns)
            && self.started_ns.is_none_or(|t| t <= ts_ns + HOLDER_SLACK_NS)
    }
}

/// Whether two starts are of the same process; `None` when either is
/// not known.
fn same_start(a: Option<StartTime>, b: Option<StartTime>) -> Option<bool> {
    Some(a?.order(b?) == std::cmp::Ordering::Equal)
}

/// Wall time of a /proc start time (clock ticks after boot); `None` for 0.
fn started_from_ticks(ticks: u64) -> Option<i64> {
    if ticks == 0 {
        return None;
    }
    let boot_ns = ticks.saturating_mul(tick_ns());
    Some(crate::util::time::Clock::now().boot_to_wall(boot_ns))
}

/// Counters of what the model has seen, to check it stays exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelStats {
    /// Processes found in /proc at start.
    pub seeded: u64,
    /// Fork events applied.
    pub forks: u64,
    /// Exec events applied.
    pub execs: u64,
    /// Exit events applied.
    pub exits: u64,
    /// Exit events for pids the model did not know.
    pub unknown_exits: u64,
    /// Exited entries dropped after their retention.
    pub pruned: u64,
    /// Exited entries dropped before their retention to keep the table
    /// within its budget (entries or bytes).
    pub evicted: u64,
    /// Live entries found ended by the audit (their exit was never read:
    /// a full ring, or a process that ended while the recorder started).
    pub retired: u64,
}

/// The process table.
pub struct ProcessTable {
    layout: CgroupLayout,
    /// Boxed: the table's spare slots (it doubles when full) then cost a
    /// pointer each, not a whole entry (26 MiB at 65,536 slots before).
    procs: HashMap<u32, Box<Process>>,
    /// Pids by memory cgroup: a kill's cgroup members without a walk of
    /// the whole table.
    by_memcg: BTreeMap<String, HashSet<u32>>,
    /// Exits of pids not in the table yet (their fork is still on its
    /// way): (time, the start of the process that ended).
    early_exits: HashMap<u32, (i64, Option<StartTime>)>,
    /// Memory cgroup paths by id, from the last walk of the hierarchy.
    memcg_ids: HashMap<u64, String>,
    /// When the hierarchy was last walked for an unknown id.
    memcg_walked: Option<std::time::Instant>,
    /// Kernel memcg ids a walk did not find (not walked for again).
    memcg_missing: std::collections::HashSet<u64>,
    keep_exited_ns: i64,
    max_entries: usize,
    /// The entries' weight and their distinct command lines' bytes, in
    /// all (their slots are counted apart: see [`ProcessTable::bytes`]).
    bytes: usize,
    /// Entries holding each command line (by the line's address; the
    /// table holds the line while it counts it, so no address is reused).
    lines: HashMap<usize, usize>,
    /// What the entries may reach.
    budget: usize,
    /// The weight at which exited entries are dropped next (the budget,
    /// or more while live entries alone exceed it: a pass that frees
    /// nothing is not repeated at every insert).
    evict_at: usize,
    /// Exec'd processes whose /proc entries are still to read, oldest
    /// first: (pid, exec time); `unread` holds the latest exec of each.
    reads: VecDeque<(u32, i64)>,
    unread: HashMap<u32, i64>,
    /// Live pids still to audit this round (see [`Self::audit`]).
    audit: Vec<u32>,
    /// Kubernetes names of pods' cgroups, when looked up (a lock: a kill's
    /// correlation names its processes through a shared table).
    kube: Option<std::sync::Mutex<kube::KubeResolver>>,
    /// What it has seen.
    pub stats: ModelStats,
}

impl ProcessTable {
    /// An empty table that keeps exited processes for `keep_exited_ns` and
    /// never holds more than `max_entries`.
    pub fn new(layout: CgroupLayout, keep_exited_ns: i64, max_entries: usize) -> Self {
        Self {
            layout,
            procs: HashMap::new(),
            by_memcg: BTreeMap::new(),
            early_exits: HashMap::new(),
            memcg_ids: HashMap::new(),
            memcg_walked: None,
            memcg_missing: Default::default(),
            keep_exited_ns,
            max_entries,
            bytes: 0,
            lines: HashMap::new(),
            budget: BUDGET_BYTES,
            evict_at: BUDGET_BYTES,
            reads: VecDeque::new(),
            unread: HashMap::new(),
            audit: Vec::new(),
            kube: None,
            stats: ModelStats::default(),
        }
    }

    /// Sets what the entries may weigh, in all (see [`BUDGET_BYTES`]).
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
        self.evict_at = bytes;
    }

    /// What the entries take now: their slots in the table and their
    /// strings (see [`Process::weight`]). The hash table's spare slots
    /// (it doubles when full) are not counted: a pointer and a key each,
    /// at most 17 bytes per entry.
    pub fn bytes(&self) -> usize {
        self.bytes + self.procs.len() * Self::SLOT
    }

    /// Names pods' processes (namespace, pod, container) from the node's
    /// files under the resolver's root, from now on (set before seeding).
    pub fn set_kube(&mut self, r: kube::KubeResolver) {
        self.kube = Some(std::sync::Mutex::new(r));
    }

    /// Takes the resolver back (to keep what it learnt for another table).
    pub fn take_kube(&mut self) -> Option<kube::KubeResolver> {
        self.kube
            .take()
            .map(|k| k.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    /// Who owns the cgroup at `path`, with its Kubernetes names when they
    /// are looked up and found.
    pub fn owner_of(&self, path: &str) -> Owner {
        let mut o = owner_of(path);
        if o.pod_uid.is_some()
            && let Some(k) = &self.kube
        {
            k.lock().unwrap_or_else(|e| e.into_inner()).fill(&mut o);
        }
        o
    }

    /// How many pods and containers were named since the last call.
    pub fn kube_named(&self) -> usize {
        self.kube
            .as_ref()
            .map(|k| k.lock().unwrap_or_else(|e| e.into_inner()).take_new())
            .unwrap_or(0)
    }

    /// The cgroup layout in use.
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// A process of the table: in `kernel_memcg` when the kernel said
    /// where it is (it wins over /proc, which may be read late), else in
    /// the memory cgroup its /proc entries name.
    fn make(&self, info: ProcInfo, kernel_memcg: Option<String>) -> Process {
        let memcg =
            kernel_memcg.or_else(|| info.cgroups.memory_path(&self.layout).map(String::from));
        let owner = self.owner_of(
            memcg
                .as_deref()
                .or(info.cgroups.unified.as_deref())
                .unwrap_or(""),
        );
        Process {
            started_ns: started_from_ticks(info.start_ticks),
            start: StartTime::ticks(info.start_ticks),
            info,
            memcg,
            owner,
            exited_ns: None,
        }
    }

    /// Adds a process known from elsewhere than /proc or the events (a
    /// fixture): placed in its cgroups as a seeded one would be.
    pub fn add(&mut self, info: ProcInfo) {
        let pid = info.pid;
        let p = self.make(info, None);
        self.insert(pid, p);
    }

    /// Adds every process in /proc.
    pub fn seed(&mut self) {
        for pid in proc::all_pids() {
            if let Ok(info) = proc::read(pid) {
                let p = self.make(info, None);
                self.insert(pid, p);
                self.stats.seeded += 1;
            }
        }
    }

    /// A fork stamped `ts_ns` of a child that started at `start` (the
    /// kernel's, when read). The exit of a short-lived child travels on
    /// the critical ring and can be applied before its fork (data ring): a
    /// fork of the process an exit already seen for that pid ended (the
    /// same start; else one older than the exit) has ended, not a live one.
    pub fn on_fork_at(
        &mut self,
        parent: u32,
        child: u32,
        comm: &str,
        ts_ns: i64,
        start: Option<StartTime>,
    ) {
        let exited = self
            .early_exits
            .remove(&child)
            .filter(|&(t, s)| same_start(s, start).unwrap_or(t >= ts_ns))
            .map(|(t, _)| t);
        self.on_fork(parent, child, comm);
        if let Some(p) = self.procs.get_mut(&child) {
            p.started_ns = Some(ts_ns);
            p.start = start;
            if exited.is_some() {
                p.exited_ns = exited;
            }
        }
    }

    /// A new process: it starts as a copy of its parent (same program, same
    /// cgroups) until it execs. `comm` is the name at fork.
    pub fn on_fork(&mut self, parent: u32, child: u32, comm: &str) {
        self.stats.forks += 1;
        self.unread.remove(&child);
        let info = match self.procs.get(&parent) {
            Some(p) => ProcInfo {
                pid: child,
                ppid: parent,
                comm: comm.to_string(),
                start_ticks: 0,
                ..p.info.clone()
            },
            None => proc::read(child).unwrap_or(ProcInfo {
                pid: child,
                ppid: parent,
                comm: comm.into(),
                ..Default::default()
            }),
        };
        let p = self.make(info, None);
        self.insert(child, p);
    }

    /// The path of the memory cgroup with kernel id `id` (0: unknown). An
    /// id not seen in the last walk of the hierarchy walks it again, once
    /// per id and at most every [`MEMCG_WALK_GAP`] unless `force` (a kill
    /// is worth a walk).
    pub fn memcg_by_id(&mut self, id: u64, force: bool) -> Option<String> {
        if id == 0 {
            return None;
        }
        if let Some(p) = self.memcg_ids.get(&id) {
            return Some(p.clone());
        }
        // An id not known yet is a cgroup made since the last walk (a
        // container starting): walked for at once, once per id, at most
        // every MEMCG_WALK_GAP, so that its first program is never placed
        // in its parent's cgroup.
        let recent = self
            .memcg_walked
            .is_some_and(|t| t.elapsed() < MEMCG_WALK_GAP);
        if (recent || self.memcg_missing.contains(&id)) && !force {
            return None;
        }
        self.memcg_ids = self.layout.memcg_ids();
        self.memcg_walked = Some(std::time::Instant::now());
        let found = self.memcg_ids.get(&id).cloned();
        if found.is_none() {
            if self.memcg_missing.len() >= EARLY_EXITS {
                self.memcg_missing.clear();
            }
            self.memcg_missing.insert(id);
        }
        found
    }

    /// A new program, in the memory cgroup with kernel id `memcg_id` at
    /// exec (0: unknown), at wall time `ts_ns`, with the command line the
    /// event read (`args`; else its file name stands in): known from the
    /// event's fields and what its parent was, and read from /proc once it
    /// has run for [`EXEC_READ_DELAY_NS`] (see [`Self::read_due`]). The
    /// kernel's cgroup wins over /proc's: /proc is read later, perhaps
    /// from a zombie.
    pub fn on_exec(
        &mut self,
        pid: u32,
        comm: &str,
        (filename, args): (&str, Option<String>),
        memcg_id: u64,
        ts_ns: i64,
        start: Option<StartTime>,
    ) {
        self.stats.execs += 1;
        let kernel_memcg = self.memcg_by_id(memcg_id, false);
        // The entry of this process (its fork copy), not that of an
        // earlier holder of the pid whose successor's fork was not seen.
        let (prev, prev_started, prev_exited, prev_start) = match self.holder(pid, ts_ns, start) {
            (Some(p), _) => (p.info.clone(), p.started_ns, p.exited_ns, p.start),
            (None, _) => (ProcInfo::default(), None, None, None),
        };
        // Its exit may be known already: exits travel on the critical
        // ring, read before the data ring's forks and execs. The program
        // it exec'd has ended then, and its pid may be another's by now:
        // no /proc read.
        let ended = prev_exited.or_else(|| {
            self.early_exits
                .get(&pid)
                .copied()
                .filter(|&(t, s)| same_start(s, start).unwrap_or(t >= ts_ns))
                .map(|(t, _)| t)
                .inspect(|_| {
                    self.early_exits.remove(&pid);
                })
        });
        let info = ProcInfo {
            pid,
            comm: comm.into(),
            cmdline: args.unwrap_or_else(|| filename.into()).into(),
            exe: Some(filename.into()),
            ..prev
        };
        let mut p = self.make(info, kernel_memcg);
        p.started_ns = p.started_ns.or(prev_started);
        p.start = start.or(prev_start);
        p.exited_ns = ended;
        self.insert(pid, p);
        if ended.is_none() {
            self.reads.push_back((pid, ts_ns));
            self.unread.insert(pid, ts_ns);
        }
    }

    /// Reads /proc for the programs exec'd at least [`EXEC_READ_DELAY_NS`]
    /// before `now_ns` that are still running. Cheap when none is due.
    pub fn read_due(&mut self, now_ns: i64) {
        while let Some(&(pid, ts)) = self.reads.front() {
            if now_ns - ts < EXEC_READ_DELAY_NS {
                break;
            }
            self.reads.pop_front();
            if self.unread.get(&pid) == Some(&ts) {
                self.read_pending(pid);
            }
        }
    }

    /// When the next pending read falls due (wall ns), if any is pending.
    pub fn next_read_ns(&self) -> Option<i64> {
        self.reads.front().map(|(_, ts)| ts + EXEC_READ_DELAY_NS)
    }

    /// Reads a process's /proc entries now if its exec's read is pending.
    pub fn read_pending(&mut self, pid: u32) {
        if self.unread.remove(&pid).is_none() {
            return;
        }
        let Some(old) = self.procs.get(&pid) else {
            return;
        };
        if old.exited_ns.is_some() {
            return;
        }
        let Ok(info) = proc::read(pid) else { return };
        let kernel_memcg = old.memcg.clone();
        let p = self.make(info, kernel_memcg);
        self.insert(pid, p);
    }

    /// A process that started at `start` (the kernel's, when read) ended.
    pub fn on_exit(&mut self, pid: u32, now_ns: i64, start: Option<StartTime>) {
        self.stats.exits += 1;
        let entry = self.procs.get_mut(&pid);
        let order = entry.as_ref().and_then(|p| Some(p.start?.order(start?)));
        match (entry, order) {
            // The entry is of a later holder (its fork was read before
            // this exit of the one before it): it lives on.
            (Some(_), Some(std::cmp::Ordering::Greater)) => {
                self.stats.unknown_exits += 1;
            }
            (Some(p), Some(std::cmp::Ordering::Equal) | None) if p.exited_ns.is_none() => {
                p.exited_ns = Some(now_ns);
            }
            // Its own exit, after the audit found it ended: the exit's
            // time is the true one.
            (Some(p), Some(std::cmp::Ordering::Equal)) => {
                p.exited_ns = Some(now_ns.min(p.exited_ns.unwrap_or(now_ns)));
            }
            // An ended entry's pid ended again, or an entry of an earlier
            // holder whose end was missed: a new holder whose fork was
            // not seen (the old one is over either way).
            (entry, _) => {
                if let Some(p) = entry {
                    p.exited_ns.get_or_insert(now_ns);
                }
                self.stats.unknown_exits += 1;
                if self.early_exits.len() >= EARLY_EXITS {
                    self.early_exits.clear();
                }
                self.early_exits.insert(pid, (now_ns, start));
            }
        }
    }

    /// Counts one more holder of `line`: its bytes (and its count's) when
    /// it is the first.
    fn hold_line(&mut self, line: &std::sync::Arc<str>) -> usize {
        let n = self.lines.entry(line.as_ptr() as usize).or_insert(0);
        *n += 1;
        if *n == 1 { Self::line_cost(line) } else { 0 }
    }

    /// What a command line takes while an entry holds it: its bytes and
    /// its count.
    fn line_cost(line: &str) -> usize {
        line.len() + 16
    }

    /// What `line` would add to the table: nothing when an entry already
    /// holds it.
    fn new_line_cost(&self, line: &std::sync::Arc<str>) -> usize {
        if self.lines.contains_key(&(line.as_ptr() as usize)) {
            0
        } else {
            Self::line_cost(line)
        }
    }

    /// Counts one holder of `line` less: its bytes when it was the last.
    fn release_line(&mut self, line: &std::sync::Arc<str>) -> usize {
        let key = line.as_ptr() as usize;
        match self.lines.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                0
            }
            Some(_) => {
                self.lines.remove(&key);
                Self::line_cost(line)
            }
            None => 0,
        }
    }

    /// What one entry takes: its slot of the table (key, box, control byte)
    /// and its box (the entry and the allocator's header).
    const SLOT: usize = size_of::<(u32, Box<Process>)>() + 1 + size_of::<Process>() + 16;

    fn insert(&mut self, pid: u32, p: Process) {
        let line = &p.info.cmdline;
        let new = !self.procs.contains_key(&pid);
        let w = p.weight() + self.new_line_cost(line);
        let after = self.bytes() + w + usize::from(new) * Self::SLOT;
        if (new && self.procs.len() >= self.max_entries) || after > self.evict_at {
            self.evict_exited(w + Self::SLOT);
        }
        if let Some(m) = &p.memcg {
            self.by_memcg.entry(m.clone()).or_default().insert(pid);
        }
        self.bytes += p.weight() + self.hold_line(&p.info.cmdline);
        if let Some(old) = self.procs.insert(pid, Box::new(p)) {
            self.bytes -= old.weight() + self.release_line(&old.info.cmdline);
            self.unindex(pid, &old);
        }
    }

    /// Removes `pid` from the index entry of `old`, unless the entry now in
    /// the table has the same cgroup.
    fn unindex(&mut self, pid: u32, old: &Process) {
        let Some(m) = &old.memcg else { return };
        if self
            .procs
            .get(&pid)
            .is_some_and(|p| p.memcg.as_ref() == Some(m))
        {
            return;
        }
        if let Some(set) = self.by_memcg.get_mut(m) {
            set.remove(&pid);
            if set.is_empty() {
                self.by_memcg.remove(m);
            }
        }
    }

    fn remove(&mut self, pid: u32) {
        self.unread.remove(&pid);
        if let Some(old) = self.procs.remove(&pid) {
            self.bytes -= old.weight() + self.release_line(&old.info.cmdline);
            self.unindex(pid, &old);
        }
    }

    /// Drops exited entries, oldest exit first, until the table is a tenth
    /// under its limits with room for an entry of `room` bytes: one sort
    /// serves the many inserts that follow, where dropping one entry at a
    /// time would look over the whole table at every insert.
    fn evict_exited(&mut self, room: usize) {
        let entries = self.max_entries - self.max_entries / 10;
        let bytes = (self.budget - self.budget / 10).saturating_sub(room);
        let mut exited: Vec<(i64, u32)> = self
            .procs
            .iter()
            .filter_map(|(pid, p)| Some((p.exited_ns?, *pid)))
            .collect();
        exited.sort_unstable();
        for (_, pid) in exited {
            if self.procs.len() < entries.max(1) && self.bytes() <= bytes {
                break;
            }
            self.remove(pid);
            self.stats.evicted += 1;
        }
        // Live entries alone over the budget: the next pass waits until an
        // eighth more has come (so passes are few however far over it is).
        let over = self.bytes() + room;
        self.evict_at = if over <= self.budget {
            self.budget
        } else {
            over + (over / 8).max(self.budget / 10)
        };
    }

    /// Looks a process up; unknown live pids, and programs whose read is
    /// still pending, are read from /proc.
    pub fn get_or_read(&mut self, pid: u32) -> Option<&Process> {
        self.read_pending(pid);
        if !self.procs.contains_key(&pid) {
            let info = proc::read(pid).ok()?;
            let p = self.make(info, None);
            self.insert(pid, p);
        }
        self.procs.get(&pid).map(|p| &**p)
    }

    /// Looks a process up.
    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.procs.get(&pid).map(|p| &**p)
    }

    /// The entry of the process that held `pid` at wall time `ts_ns` (and
    /// started at `start`, when the event said), and whether an entry of
    /// another holder of the pid (one that started at another time, or,
    /// where a start is not known, had ended before or started after) was
    /// set aside.
    pub fn holder(
        &self,
        pid: u32,
        ts_ns: i64,
        start: Option<StartTime>,
    ) -> (Option<&Process>, bool) {
        let Some(p) = self.procs.get(&pid) else {
            return (None, false);
        };
        let same = same_start(p.start, start).unwrap_or_else(|| p.held_pid_at(ts_ns));
        if same { (Some(p), false) } else { (None, true) }
    }

    /// Checks up to `budget` live entries against /proc (a round over
    /// every live entry, `budget` at a time): an entry whose pid no
    /// process holds now, or another process (a start of its own), ended
    /// without its exit being read, and is marked ended at `now_ns`. Reads
    /// only /proc/PID/stat, which never waits on a process's memory map.
    /// Returns how many were retired.
    pub fn audit(&mut self, now_ns: i64, budget: usize) -> usize {
        if self.audit.is_empty() {
            self.audit = self
                .procs
                .iter()
                .filter(|(_, p)| p.exited_ns.is_none())
                .map(|(pid, _)| *pid)
                .collect();
        }
        let mut retired = 0;
        for _ in 0..budget {
            let Some(pid) = self.audit.pop() else { break };
            let Some(p) = self.procs.get(&pid) else {
                continue;
            };
            if p.exited_ns.is_some() {
                continue;
            }
            // Younger than a read's delay: its fork may be read before
            // /proc has it, or its exec's read is still due.
            if p.started_ns
                .is_some_and(|t| now_ns - t < EXEC_READ_DELAY_NS)
            {
                continue;
            }
            let ended = match proc::start_ticks(pid) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(_) => false,
                Ok(t) => match (p.start, StartTime::ticks(t)) {
                    (Some(a), Some(b)) => a.order(b) != std::cmp::Ordering::Equal,
                    _ => false,
                },
            };
            if ended && let Some(p) = self.procs.get_mut(&pid) {
                p.exited_ns = Some(now_ns);
                self.unread.remove(&pid);
                retired += 1;
            }
        }
        self.stats.retired += retired as u64;
        retired
    }

    /// Drops exited processes older than the retention.
    pub fn prune(&mut self, now_ns: i64) {
        let keep = self.keep_exited_ns;
        let old: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.exited_ns.is_some_and(|t| now_ns - t >= keep))
            .map(|(pid, _)| *pid)
            .collect();
        self.stats.pruned += old.len() as u64;
        for pid in old {
            self.remove(pid);
        }
        self.evict_at = self
            .evict_at
            .min(self.budget.max(self.bytes() + self.budget / 10));
    }

    /// Live processes.
    pub fn live(&self) -> impl Iterator<Item = &Process> {
        self.procs
            .values()
            .map(|p| &**p)
            .filter(|p| p.exited_ns.is_none())
    }

    /// Number of entries, live and exited.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Memory cgroups of live processes, with their ancestors (a limit can
    /// sit on a parent, as Kubernetes pod cgroups do), root excluded.
    pub fn memcgs_in_use(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for p in self.live() {
            let Some(mut path) = p.memcg.as_deref() else {
                continue;
            };
            while path != "/" && !path.is_empty() && out.insert(path.to_string()) {
                path = path
                    .rfind('/')
                    .map(|i| if i == 0 { "/" } else { &path[..i] })
                    .unwrap_or("/");
            }
        }
        out
    }

    /// Processes (live, or exited within `since_ns`) in memcg `path` or below it.
    pub fn in_memcg<'a>(
        &'a self,
        path: &'a str,
        since_ns: i64,
    ) -> impl Iterator<Item = &'a Process> + 'a {
        self.by_memcg
            .range::<str, _>((std::ops::Bound::Included(path), std::ops::Bound::Unbounded))
            .take_while(move |(m, _)| m.starts_with(path))
            .filter(move |(m, _)| m.len() == path.len() || m[path.len()..].starts_with('/'))
            .flat_map(|(_, pids)| pids.iter())
            .filter_map(|pid| self.procs.get(pid).map(|p| &**p))
            .filter(move |p| p.exited_ns.is_none_or(|t| t >= since_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgroup::ProcCgroups;

    fn table() -> ProcessTable {
        let layout = CgroupLayout {
            memory_v1: Some("/sys/fs/cgroup/memory".into()),
            ..Default::default()
        };
        ProcessTable::new(layout, 1_000, 100)
    }

    fn info(pid: u32, memcg: &str) -> ProcInfo {
        ProcInfo {
            pid,
            comm: format!("p{pid}"),
            cgroups: ProcCgroups {
                memory_v1: Some(memcg.into()),
                unified: None,
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_reused_pid_is_not_taken_for_its_earlier_holder() {
        let mut t = table();
        t.add(info(1, "/a"));
        // pid 7 runs, ends at 2 s; its successor's fork is never seen.
        t.on_fork_at(1, 7, "old", 1_000_000_000, None);
        t.on_exit(7, 2_000_000_000, None);
        assert!(t.holder(7, 1_500_000_000, None).0.is_some(), "alive then");
        assert!(
            t.holder(7, 2_050_000_000, None).0.is_some(),
            "its own exit, just after"
        );
        let (p, reused) = t.holder(7, 5_000_000_000, None);
        assert!(
            p.is_none() && reused,
            "a kill at 5 s is not of the old pid 7"
        );
        // Nor a process that started after the moment asked about.
        assert!(t.holder(7, 500_000_000, None).1, "before its fork");
        assert!(!t.holder(8, 1, None).1, "unknown is not reused");
        // An exec of the new holder starts from nothing of the old one.
        t.on_exec(
            7,
            "new",
            ("/bin/new", Some("new --x".into())),
            0,
            6_000_000_000,
            None,
        );
        let p = t.holder(7, 6_500_000_000, None).0.unwrap();
        assert_eq!(&*p.info.cmdline, "new --x");
        assert_eq!(p.info.ppid, 0, "not the old holder's parent");
    }

    /// The issue of a busy node: exits lost (a full ring) leave entries of
    /// ended processes, and forks lost leave their successors unknown. The
    /// kernel's start times tell them apart whatever arrives, or not, and
    /// in whatever order.
    #[test]
    fn starts_tell_holders_of_a_pid_apart_whatever_was_lost() {
        let s = |ns: u64| StartTime::kernel(ns);
        let mut t = table();
        t.add(info(1, "/a"));
        t.on_fork_at(1, 7, "old", 1_000_000_000, s(1_000));
        // Its exit is lost; pid 7 is held by a new process (fork lost too)
        // that is killed 1 ms later: not the old one, though the time rule
        // alone would say it still held the pid.
        let (p, reused) = t.holder(7, 1_001_000_000, s(2_000));
        assert!(p.is_none() && reused, "{p:?}");
        assert!(
            t.holder(7, 1_001_000_000, None).0.is_some(),
            "by time alone"
        );
        assert!(t.holder(7, 9_000_000_000, s(1_000)).0.is_some(), "its own");
        // The new one's exit: the old entry is over, and the exit waits
        // for its fork, which is then known as ended.
        t.on_exit(7, 1_002_000_000, s(2_000));
        assert!(t.get(7).unwrap().exited_ns.is_some());
        t.on_fork_at(1, 7, "new", 1_000_500_000, s(2_000));
        assert_eq!(t.get(7).unwrap().exited_ns, Some(1_002_000_000));
        // A later holder's fork read before its predecessor's exit: that
        // exit does not end it.
        t.on_fork_at(1, 7, "third", 3_000_000_000, s(3_000));
        t.on_exit(7, 2_900_000_000, s(2_500));
        assert_eq!(t.get(7).unwrap().exited_ns, None, "the third lives on");
        // /proc's start is the kernel's cut to clock ticks.
        let tick = tick_ns();
        let proc_start = StartTime::ticks(12).unwrap();
        assert_eq!(
            proc_start.order(s(12 * tick + tick - 1).unwrap()),
            std::cmp::Ordering::Equal
        );
        assert_eq!(
            proc_start.order(s(13 * tick).unwrap()),
            std::cmp::Ordering::Less
        );
        assert_eq!(
            proc_start.order(s(12 * tick - 1).unwrap()),
            std::cmp::Ordering::Greater
        );
    }

    /// Entries whose exit was never read are found against /proc: a pid
    /// no process holds, and a pid held by a process of another start.
    #[test]
    fn the_audit_retires_entries_whose_exit_was_lost() {
        let me = std::process::id();
        let mut t = table();
        t.seed();
        let live = t.live().count();
        assert!(live > 1);
        // Beyond any pid_max: no process holds it.
        t.on_fork_at(me, 4_000_100, "gone", 0, StartTime::kernel(5));
        // This process under a start that is not its own: a ghost.
        let mine = t.get(me).unwrap().start.unwrap();
        let mut ghost = t.get(me).unwrap().clone();
        ghost.start = StartTime::kernel(mine.ns + 10 * tick_ns());
        t.insert(me, ghost);
        // Long after any of them started.
        let now = i64::MAX / 2;
        // A round, a few entries at a time.
        let mut retired = 0;
        for _ in 0..live + 1 {
            retired += t.audit(now, 4);
        }
        assert!(retired >= 2, "{retired}");
        assert_eq!(t.get(4_000_100).unwrap().exited_ns, Some(now));
        assert_eq!(t.get(me).unwrap().exited_ns, Some(now));
        assert_eq!(t.stats.retired, retired as u64);
        // Its own start: kept. The seeded entries of live processes stay.
        let mut t = table();
        t.seed();
        t.audit(now, usize::MAX);
        assert!(t.get(me).unwrap().exited_ns.is_none());
        // The lost exit read at last: the true time, no early exit kept.
        t.on_fork_at(me, 4_000_101, "gone", 0, StartTime::kernel(5));
        t.audit(now, usize::MAX);
        t.on_exit(4_000_101, 7, StartTime::kernel(5));
        assert_eq!(t.get(4_000_101).unwrap().exited_ns, Some(7));
        assert!(t.early_exits.is_empty());
    }

    #[test]
    fn an_exec_is_read_from_proc_only_once_the_program_has_run_a_while() {
        let me = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let mut t = table();
        t.add(info(1, "/a"));
        t.on_fork(1, me, "sh");
        t.on_exec(me, "prog", ("/usr/bin/prog", None), 0, 1_000, None);
        // Not yet: the event's fields, the parent's cgroup.
        t.read_due(1_000 + EXEC_READ_DELAY_NS - 1);
        let p = t.get(me).unwrap();
        assert_eq!(&*p.info.cmdline, "/usr/bin/prog");
        assert_eq!(p.memcg.as_deref(), Some("/a"));
        // Due: /proc says what it really is.
        t.read_due(1_000 + EXEC_READ_DELAY_NS);
        let p = t.get(me).unwrap();
        assert_eq!(p.info.exe.as_deref(), exe.to_str());
        assert_ne!(&*p.info.cmdline, "/usr/bin/prog");
        // Once: a second exec is read again, an ended program never.
        t.on_exec(
            me,
            "prog2",
            ("/usr/bin/prog2", Some("prog2 --x".into())),
            0,
            5_000,
            None,
        );
        t.on_exit(me, 6_000, None);
        t.read_due(i64::MAX);
        assert_eq!(&*t.get(me).unwrap().info.cmdline, "prog2 --x");
        // A kill reads a pending one at once.
        t.on_fork(1, me, "sh");
        t.on_exec(me, "prog3", ("/usr/bin/prog3", None), 0, 7_000, None);
        t.read_pending(me);
        assert_eq!(t.get(me).unwrap().info.exe.as_deref(), exe.to_str());
        assert!(t.reads.len() <= 3 && t.unread.is_empty());
    }

    #[test]
    fn fork_copies_the_parent_and_exit_is_kept_then_pruned() {
        let mut t = table();
        let parent = t.make(info(4_000_000, "/kubepods/burstable/podabc/x"), None);
        t.insert(4_000_000, parent);
        t.on_fork(4_000_000, 4_000_001, "worker");
        let child = t.get(4_000_001).unwrap();
        assert_eq!(child.info.comm, "worker");
        assert_eq!(child.info.ppid, 4_000_000);
        assert_eq!(child.memcg.as_deref(), Some("/kubepods/burstable/podabc/x"));
        assert_eq!(child.owner.pod_uid.as_deref(), Some("abc"));
        t.on_exit(4_000_001, 10_000, None);
        assert!(t.get(4_000_001).unwrap().exited_ns.is_some());
        t.prune(10_500);
        assert!(t.get(4_000_001).is_some(), "kept within retention");
        t.prune(11_000);
        assert!(t.get(4_000_001).is_none(), "pruned after retention");
        assert_eq!(t.stats.forks, 1);
        assert_eq!(t.stats.exits, 1);
        t.on_exit(4_000_002, 0, None);
        assert_eq!(t.stats.unknown_exits, 1);
    }

    #[test]
    fn an_exit_read_before_its_fork_and_exec_leaves_no_live_ghost() {
        // The critical ring (exits) is read before the data ring (forks,
        // execs): a short-lived child's events arrive exit first.
        let mut t = table();
        let parent = t.make(info(4_000_000, "/job"), None);
        t.insert(4_000_000, parent);
        for (i, child) in (4_100_000..4_100_100u32).enumerate() {
            let at = 1_000_000 * i as i64;
            t.on_exit(child, at + 900, None);
            t.on_fork_at(4_000_000, child, "sh", at + 100, None);
            t.on_exec(
                child,
                "true",
                ("/bin/true", Some("true x".into())),
                0,
                at + 200,
                None,
            );
            let p = t.get(child).unwrap();
            assert_eq!(p.exited_ns, Some(at + 900), "{child}");
            assert_eq!(&*p.info.cmdline, "true x");
        }
        // An exec whose fork was never seen, after its exit: ended too.
        t.on_exit(4_200_000, 5_000, None);
        t.on_exec(4_200_000, "x", ("/bin/x", None), 0, 4_000, None);
        assert_eq!(t.get(4_200_000).unwrap().exited_ns, Some(5_000));
        assert_eq!(t.live().count(), 1, "only the parent is live");
        assert!(t.unread.is_empty(), "no /proc read of an ended program");
    }

    #[test]
    fn memcgs_include_ancestors_and_members_include_children() {
        let mut t = table();
        for (pid, cg) in [(1, "/a/b"), (2, "/a/c"), (3, "/ab")] {
            let p = t.make(info(pid, cg), None);
            t.insert(pid, p);
        }
        let set: Vec<_> = t.memcgs_in_use().into_iter().collect();
        assert_eq!(set, ["/a", "/a/b", "/a/c", "/ab"]);
        let mut members: Vec<u32> = t.in_memcg("/a", 0).map(|p| p.info.pid).collect();
        members.sort();
        assert_eq!(members, [1, 2], "/ab is not under /a");
        // A process that moves (exec in a new cgroup) leaves its old one.
        let moved = t.make(info(1, "/ab"), None);
        t.insert(1, moved);
        let mut members: Vec<u32> = t.in_memcg("/a", 0).map(|p| p.info.pid).collect();
        members.sort();
        assert_eq!(members, [2]);
        let mut ab: Vec<u32> = t.in_memcg("/ab", 0).map(|p| p.info.pid).collect();
        ab.sort();
        assert_eq!(ab, [1, 3]);
        // Exited and pruned: gone from the index too.
        t.on_exit(3, 0, None);
        t.prune(10_000);
        assert_eq!(
            t.in_memcg("/ab", 0).map(|p| p.info.pid).collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(
            t.by_memcg.values().map(HashSet::len).sum::<usize>(),
            t.len()
        );
    }

    #[test]
    fn an_exit_seen_before_its_fork_leaves_no_live_ghost() {
        let mut t = table();
        let parent = t.make(info(50, "/storm"), None);
        t.insert(50, parent);
        t.on_exit(51, 2_000, None);
        t.on_fork_at(50, 51, "child", 1_000, None);
        assert!(
            t.get(51).unwrap().exited_ns.is_some(),
            "the child has ended"
        );
        assert_eq!(t.live().count(), 1);
        // A later fork of a reused pid is live.
        t.on_fork_at(50, 51, "child", 3_000, None);
        assert!(t.get(51).unwrap().exited_ns.is_none());
    }

    #[test]
    fn bounded_size_evicts_exited_first() {
        let layout = CgroupLayout::default();
        let mut t = ProcessTable::new(layout, i64::MAX, 2);
        for pid in [10, 11] {
            let p = t.make(info(pid, "/"), None);
            t.insert(pid, p);
        }
        t.on_exit(10, 5, None);
        let p = t.make(info(12, "/"), None);
        t.insert(12, p);
        assert!(t.get(10).is_none() && t.get(11).is_some() && t.get(12).is_some());
    }

    /// A local user's long command line forking short-lived children: the
    /// children share their parent's line, and the exited ones are dropped
    /// oldest first to keep the table within its budget; live entries stay.
    #[test]
    fn forks_share_the_command_line_and_exited_entries_keep_to_the_budget() {
        let mut t = ProcessTable::new(CgroupLayout::default(), i64::MAX, 1 << 20);
        t.set_budget(1 << 20);
        let parent = ProcInfo {
            cmdline: "x".repeat(proc::CMDLINE_MAX).into(),
            ..info(100, "/attacker")
        };
        t.add(parent);
        let line = t.get(100).unwrap().info.cmdline.clone();
        let mut most = 0;
        for i in 0..20_000u32 {
            let child = 1_000 + i;
            t.on_fork_at(100, child, "child", i64::from(i), None);
            assert!(
                std::sync::Arc::ptr_eq(&t.get(child).unwrap().info.cmdline, &line),
                "a fork shares its parent's line"
            );
            t.on_exit(child, i64::from(i) + 1, None);
            most = most.max(t.bytes());
        }
        assert!(
            most <= 1 << 20,
            "at most {most} bytes against a budget of 1 MiB"
        );
        println!("{} entries in 1 MiB", t.len());
        assert!(t.stats.evicted > 10_000, "{:?}", t.stats);
        assert!(t.get(100).is_some(), "the live parent stays");
        assert!(t.get(1_000 + 19_999).is_some(), "the newest exit stays");
        assert!(t.get(1_000).is_none(), "the oldest exit went first");
        // The weight is kept exactly: what is left adds up, each line once.
        assert_eq!(t.bytes(), exact(&t));
        assert_eq!(t.lines.len(), 1, "the parent's line, shared");
    }

    /// Live entries are never dropped, and when they alone exceed the
    /// budget the table does not look over every entry at each insert.
    #[test]
    fn live_entries_over_the_budget_stay_and_inserts_stay_cheap() {
        let mut t = ProcessTable::new(CgroupLayout::default(), i64::MAX, 1 << 20);
        t.set_budget(64 << 10);
        let started = std::time::Instant::now();
        for pid in 1..=30_000 {
            t.add(info(pid, "/a"));
        }
        let took = started.elapsed();
        assert_eq!(t.live().count(), 30_000);
        assert_eq!(t.stats.evicted, 0);
        // A pass over the whole table at each insert would take seconds.
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        assert_eq!(t.bytes(), exact(&t));
    }

    /// The table's weight added up from scratch.
    fn exact(t: &ProcessTable) -> usize {
        let mut lines = HashMap::new();
        for p in t.procs.values() {
            lines.insert(p.info.cmdline.as_ptr() as usize, p.info.cmdline.len() + 16);
        }
        t.procs.values().map(|p| p.weight()).sum::<usize>()
            + lines.values().sum::<usize>()
            + t.procs.len() * ProcessTable::SLOT
    }
}
