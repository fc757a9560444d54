//! The process model: pid -> what the process is and where it lives,
//! seeded from /proc and kept current by the sched events. Exited
//! processes stay for a while, so a kill can still be explained after the
//! victim is gone.

pub mod cgroup;
mod exec;
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

/// Removed memory cgroups whose paths are kept (see
/// [`ProcessTable::on_cgroup_dir`]).
const MEMCGS_GONE: usize = 1024;

/// A new program's /proc entries (command line, executable, uid, cgroups)
/// are read once it has run this long, not at its exec: most programs a
/// node starts (shell tools, probes, health checks) end sooner, and reading
/// five /proc files for each of them costs a process-churning workload
/// several percent. Until then, and for the ones that end sooner, the
/// kernel's exec event says what they are (name, file, memory cgroup). A
/// kill or a signal reads its processes at once.
pub const EXEC_READ_DELAY_NS: i64 = 100_000_000;
/// [`ProcessTable::audit`] goes over every live entry in about this many
/// calls (one a tick): an exit lost to a full ring is found within some
/// ten seconds, at a tenth of the /proc reads a round a tick would take.
pub const AUDIT_ROUND_CALLS: usize = 10;

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
pub(crate) fn same_start(a: Option<StartTime>, b: Option<StartTime>) -> Option<bool> {
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
    /// Memory cgroups learnt from the kernel as they were made.
    pub memcgs_made: u64,
    /// Walks of the memory hierarchy for an id not known yet.
    pub memcg_walks: u64,
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
    /// Memory cgroups removed, newest last (at most [`MEMCGS_GONE`]): a
    /// kill that reaches the engine after its cgroup went still names it.
    memcgs_gone: VecDeque<(u64, String)>,
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
    /// Entries [`ProcessTable::audit`] checks a call in this round.
    audit_step: usize,
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
            memcgs_gone: VecDeque::new(),
            keep_exited_ns,
            max_entries,
            bytes: 0,
            lines: HashMap::new(),
            budget: BUDGET_BYTES,
            evict_at: BUDGET_BYTES,
            reads: VecDeque::new(),
            unread: HashMap::new(),
            audit: Vec::new(),
            audit_step: 0,
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
        if let Some((_, p)) = self.memcgs_gone.iter().rev().find(|(i, _)| *i == id) {
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
        self.stats.memcg_walks += 1;
        let found = self.memcg_ids.get(&id).cloned();
        if found.is_none() {
            if self.memcg_missing.len() >= EARLY_EXITS {
                self.memcg_missing.clear();
            }
            self.memcg_missing.insert(id);
        }
        found
    }

    /// A cgroup made (`made`) or removed in hierarchy `root` (the kernel's
    /// cgroup_mkdir and cgroup_rmdir): a memory cgroup's id maps to its
    /// path from the moment it exists, with no walk, so the first program
    /// of a new container is placed in it. `path`: `None` when the event's
    /// was cut (a walk finds it instead).
    pub fn on_cgroup_dir(&mut self, made: bool, root: i32, id: u64, path: Option<String>) {
        if Some(root) != self.layout.memory_hierarchy || id == 0 {
            return;
        }
        if made {
            if let Some(path) = path {
                self.memcg_missing.remove(&id);
                self.memcg_ids.insert(id, path);
                self.stats.memcgs_made += 1;
            }
        } else if let Some(path) = self.memcg_ids.remove(&id).or(path) {
            if self.memcgs_gone.len() >= MEMCGS_GONE {
                self.memcgs_gone.pop_front();
            }
            self.memcgs_gone.push_back((id, path));
        }
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

    /// Checks live entries against /proc, a round over every one in about
    /// [`AUDIT_ROUND_CALLS`] calls (at least 16 a call, at most `budget`):
    /// an entry whose pid no
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
            self.audit_step = self
                .audit
                .len()
                .div_ceil(AUDIT_ROUND_CALLS)
                .clamp(16, budget.max(16));
        }
        let mut retired = 0;
        for _ in 0..self.audit_step.min(budget) {
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
mod tests;
