//! The process model: pid -> what the process is and where it lives,
//! seeded from /proc and kept current by the sched events. Exited
//! processes stay for a while, so a kill can still be explained after the
//! victim is gone.

pub mod cgroup;
pub mod ledger;
pub mod proc;
pub mod sampler;

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use cgroup::{CgroupLayout, Owner, owner_of};
use proc::ProcInfo;

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
}

/// The process table.
pub struct ProcessTable {
    layout: CgroupLayout,
    procs: HashMap<u32, Process>,
    keep_exited_ns: i64,
    max_entries: usize,
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
            keep_exited_ns,
            max_entries,
            stats: ModelStats::default(),
        }
    }

    /// The cgroup layout in use.
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    fn make(&self, info: ProcInfo) -> Process {
        let memcg = info.cgroups.memory_path(&self.layout).map(String::from);
        let owner = owner_of(
            memcg
                .as_deref()
                .or(info.cgroups.unified.as_deref())
                .unwrap_or(""),
        );
        Process {
            info,
            memcg,
            owner,
            exited_ns: None,
        }
    }

    /// Adds every process in /proc.
    pub fn seed(&mut self) {
        for pid in proc::all_pids() {
            if let Ok(info) = proc::read(pid) {
                let p = self.make(info);
                self.procs.insert(pid, p);
                self.stats.seeded += 1;
            }
        }
    }

    /// A new process: it starts as a copy of its parent (same program, same
    /// cgroups) until it execs. `comm` is the name at fork.
    pub fn on_fork(&mut self, parent: u32, child: u32, comm: &str) {
        self.stats.forks += 1;
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
        let p = self.make(info);
        self.insert(child, p);
    }

    /// A new program: re-read /proc, falling back to the event's fields
    /// when the process is already gone.
    pub fn on_exec(&mut self, pid: u32, comm: &str, filename: &str) {
        self.stats.execs += 1;
        let info = proc::read(pid).unwrap_or_else(|_| {
            let prev = self
                .procs
                .get(&pid)
                .map(|p| p.info.clone())
                .unwrap_or_default();
            ProcInfo {
                pid,
                comm: comm.into(),
                cmdline: filename.into(),
                exe: Some(filename.into()),
                ..prev
            }
        });
        let p = self.make(info);
        self.insert(pid, p);
    }

    /// A process ended.
    pub fn on_exit(&mut self, pid: u32, now_ns: i64) {
        self.stats.exits += 1;
        match self.procs.get_mut(&pid) {
            Some(p) => p.exited_ns = Some(now_ns),
            None => self.stats.unknown_exits += 1,
        }
    }

    fn insert(&mut self, pid: u32, p: Process) {
        if self.procs.len() >= self.max_entries && !self.procs.contains_key(&pid) {
            self.evict_oldest_exited();
        }
        self.procs.insert(pid, p);
    }

    fn evict_oldest_exited(&mut self) {
        if let Some(pid) = self
            .procs
            .iter()
            .filter_map(|(pid, p)| Some((*pid, p.exited_ns?)))
            .min_by_key(|(_, t)| *t)
            .map(|(pid, _)| pid)
        {
            self.procs.remove(&pid);
            self.stats.pruned += 1;
        }
    }

    /// Looks a process up; unknown live pids are read from /proc and added.
    pub fn get_or_read(&mut self, pid: u32) -> Option<&Process> {
        if !self.procs.contains_key(&pid) {
            let info = proc::read(pid).ok()?;
            let p = self.make(info);
            self.insert(pid, p);
        }
        self.procs.get(&pid)
    }

    /// Looks a process up.
    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.procs.get(&pid)
    }

    /// Drops exited processes older than the retention.
    pub fn prune(&mut self, now_ns: i64) {
        let keep = self.keep_exited_ns;
        let before = self.procs.len();
        self.procs
            .retain(|_, p| p.exited_ns.is_none_or(|t| now_ns - t < keep));
        self.stats.pruned += (before - self.procs.len()) as u64;
    }

    /// Live processes.
    pub fn live(&self) -> impl Iterator<Item = &Process> {
        self.procs.values().filter(|p| p.exited_ns.is_none())
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
        self.procs.values().filter(move |p| {
            p.exited_ns.is_none_or(|t| t >= since_ns)
                && p.memcg.as_deref().is_some_and(|m| {
                    m == path || (m.starts_with(path) && m[path.len()..].starts_with('/'))
                })
        })
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
    fn fork_copies_the_parent_and_exit_is_kept_then_pruned() {
        let mut t = table();
        let parent = t.make(info(4_000_000, "/kubepods/burstable/podabc/x"));
        t.insert(4_000_000, parent);
        t.on_fork(4_000_000, 4_000_001, "worker");
        let child = t.get(4_000_001).unwrap();
        assert_eq!(child.info.comm, "worker");
        assert_eq!(child.info.ppid, 4_000_000);
        assert_eq!(child.memcg.as_deref(), Some("/kubepods/burstable/podabc/x"));
        assert_eq!(child.owner.pod_uid.as_deref(), Some("abc"));
        t.on_exit(4_000_001, 10_000);
        assert!(t.get(4_000_001).unwrap().exited_ns.is_some());
        t.prune(10_500);
        assert!(t.get(4_000_001).is_some(), "kept within retention");
        t.prune(11_000);
        assert!(t.get(4_000_001).is_none(), "pruned after retention");
        assert_eq!(t.stats.forks, 1);
        assert_eq!(t.stats.exits, 1);
        t.on_exit(4_000_002, 0);
        assert_eq!(t.stats.unknown_exits, 1);
    }

    #[test]
    fn memcgs_include_ancestors_and_members_include_children() {
        let mut t = table();
        for (pid, cg) in [(1, "/a/b"), (2, "/a/c"), (3, "/ab")] {
            let p = t.make(info(pid, cg));
            t.insert(pid, p);
        }
        let set: Vec<_> = t.memcgs_in_use().into_iter().collect();
        assert_eq!(set, ["/a", "/a/b", "/a/c", "/ab"]);
        let mut members: Vec<u32> = t.in_memcg("/a", 0).map(|p| p.info.pid).collect();
        members.sort();
        assert_eq!(members, [1, 2], "/ab is not under /a");
    }

    #[test]
    fn bounded_size_evicts_exited_first() {
        let layout = CgroupLayout::default();
        let mut t = ProcessTable::new(layout, i64::MAX, 2);
        for pid in [10, 11] {
            let p = t.make(info(pid, "/"));
            t.insert(pid, p);
        }
        t.on_exit(10, 5);
        let p = t.make(info(12, "/"));
        t.insert(12, p);
        assert!(t.get(10).is_none() && t.get(11).is_some() && t.get(12).is_some());
    }
}
