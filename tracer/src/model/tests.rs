//! The process table: identity across pid reuse, cgroups, budgets.

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

/// A program killed a moment after its exec is a zombie when /proc is
/// read (its exit not read yet): /proc shows no command line and no file,
/// and what the exec event said stays. A pid held by a process of another
/// start is not read into this one's entry.
#[test]
fn a_read_of_proc_never_loses_what_the_exec_said() {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    // Ended, not waited for: a zombie.
    let zombie = (0..500).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(zombie, "true did not become a zombie");
    let mut t = table();
    t.on_exec(
        pid,
        "hog",
        ("/usr/bin/hog", Some("hog --step 64".into())),
        0,
        1_000,
        None,
    );
    t.read_pending(pid);
    let p = t.get(pid).unwrap();
    assert_eq!(&*p.info.cmdline, "hog --step 64");
    assert_eq!(p.info.exe.as_deref(), Some("/usr/bin/hog"));
    assert!(p.start.is_some(), "the start /proc gave");
    // The same pid under another start: another process's /proc.
    let other = StartTime::kernel(p.start.unwrap().ns + 10 * tick_ns());
    t.on_exec(
        pid,
        "hog",
        ("/usr/bin/hog", Some("hog --b".into())),
        0,
        2_000,
        other,
    );
    t.read_pending(pid);
    let p = t.get(pid).unwrap();
    assert_eq!(&*p.info.cmdline, "hog --b");
    assert_eq!(p.start, other);
    child.wait().expect("wait");
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

#[test]
fn a_cgroup_made_is_known_by_its_id_at_once_and_one_removed_is_kept_a_while() {
    // An empty memory hierarchy: a walk finds nothing, so what is found
    // came from the cgroup events.
    let root = tempfile::tempdir().unwrap();
    let layout = CgroupLayout {
        memory_v1: Some(root.path().into()),
        memory_hierarchy: Some(4),
        ..Default::default()
    };
    let mut t = ProcessTable::new(layout, 1_000, 100);
    let ctr = "/kubepods/burstable/pod1/0123abcd";
    t.on_cgroup_dir(true, 4, 77, Some(ctr.into()));
    // The same path in another hierarchy (systemd's unified one on a
    // hybrid host) has another id: not a memory cgroup.
    t.on_cgroup_dir(true, 0, 78, Some(ctr.into()));
    // A path the event had to cut is left to a walk.
    t.on_cgroup_dir(true, 4, 79, None);
    assert_eq!(t.memcg_by_id(77, false).as_deref(), Some(ctr));
    assert_eq!(t.stats.memcgs_made, 1);
    assert_eq!(t.stats.memcg_walks, 0, "known without a walk");
    assert_eq!(t.memcg_by_id(78, true), None);
    assert_eq!(t.stats.memcg_walks, 1);
    // Removed (the walk above did not see it): still named for a kill
    // that comes after, within a bound.
    t.on_cgroup_dir(false, 4, 77, Some(ctr.into()));
    assert_eq!(t.memcg_by_id(77, false).as_deref(), Some(ctr));
    for id in 1000..1000 + MEMCGS_GONE as u64 {
        t.on_cgroup_dir(true, 4, id, Some(format!("/c{id}")));
        t.on_cgroup_dir(false, 4, id, Some(format!("/c{id}")));
    }
    assert_eq!(t.memcgs_gone.len(), MEMCGS_GONE);
    assert_eq!(t.memcg_by_id(77, true), None, "the oldest went first");
}
