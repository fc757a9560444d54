//! The kernel log's records and reports, from real kernels' lines.

use super::*;

fn feed(lines: &[&str]) -> Vec<KmsgEvent> {
    feed_into(Assembler::default(), lines)
}

/// The reports of `lines` read as a saved log.
fn saved_reports(lines: &[&str]) -> Vec<OomReport> {
    feed_into(Assembler::for_saved_log(), lines)
        .into_iter()
        .filter_map(|e| match e {
            KmsgEvent::Report(r) => Some(*r),
            _ => None,
        })
        .collect()
}

fn feed_into(mut asm: Assembler, lines: &[&str]) -> Vec<KmsgEvent> {
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let rec = KmsgRecord {
                seq: i as u64,
                ts_us: 134_488_421 + i as u64 * 10,
                level: 4,
                facility: 0,
                text: l.to_string(),
            };
            asm.push(&rec)
        })
        .collect()
}

fn one_report(lines: &[&str]) -> OomReport {
    let evs = feed(lines);
    let reports: Vec<_> = evs
        .into_iter()
        .filter_map(|e| match e {
            KmsgEvent::Report(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(reports.len(), 1, "exactly one report");
    reports.into_iter().next().unwrap()
}

/// A memcg OOM on cgroup v1, as this project's CI kernel (6.18) prints it.
const V1_MEMCG_6_18: &[&str] = &[
    "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "CPU: 0 UID: 0 PID: 3129 Comm: python3 Not tainted 6.18.44-fc-v1098 #1 PREEMPT(none) ",
    "Call Trace:",
    " <TASK>",
    " dump_stack_lvl+0x59/0x90",
    " </TASK>",
    "memory: usage 65536kB, limit 65536kB, failcnt 3543",
    "memory+swap: usage 65536kB, limit 9007199254740988kB, failcnt 0",
    "kmem: usage 260kB, limit 9007199254740988kB, failcnt 0",
    "Memory cgroup stats for /tracer-probe-1127:",
    "cache 106496",
    "rss 66736128",
    "shmem 0",
    "pgfault 23940",
    "total_rss 66736128",
    "Tasks state (memory values in pages):",
    "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
    "[   3129]     0  3129    18790    16950    16288      662         0   192512        0             0 python3",
    "[   3130]  1000  3130     5000     1200     1100      100         0    65536        0           500 side car",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/tracer-probe-1127,task_memcg=/tracer-probe-1127,task=python3,pid=3129,uid=0",
    "Memory cgroup out of memory: Killed process 3129 (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
    "oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
];

#[test]
fn memcg_v1_report_on_6_18() {
    let r = one_report(V1_MEMCG_6_18);
    assert_eq!(r.trigger_comm.as_deref(), Some("python3"));
    assert_eq!(r.trigger_pid, Some(3129));
    assert_eq!(r.gfp_mask.as_deref(), Some("0xcc0(GFP_KERNEL)"));
    assert_eq!(r.order, Some(0));
    assert_eq!(
        r.memory,
        Some(MemcgCounter {
            usage_kb: 65536,
            limit_kb: 65536,
            failcnt: 3543
        })
    );
    assert_eq!(r.swap.as_ref().unwrap().limit_kb, 9007199254740988);
    assert_eq!(r.kmem.as_ref().unwrap().usage_kb, 260);
    assert_eq!(r.stats_for.as_deref(), Some("/tracer-probe-1127"));
    assert_eq!(r.memcg_stats["rss"], 66736128);
    assert_eq!(r.memcg_stats["cache"], 106496);
    assert_eq!(r.tasks.len(), 2);
    assert_eq!(r.tasks[0].rss_anon_pages, Some(16288));
    assert_eq!(r.tasks[0].pgtables_bytes, Some(192512));
    assert_eq!(r.tasks[1].name, "side car");
    assert_eq!(r.tasks[1].oom_score_adj, 500);
    let s = r.summary.as_ref().unwrap();
    assert_eq!(s.constraint, "CONSTRAINT_MEMCG");
    assert_eq!(s.oom_memcg.as_deref(), Some("/tracer-probe-1127"));
    assert_eq!(s.task_memcg.as_deref(), Some("/tracer-probe-1127"));
    assert_eq!((s.task.as_str(), s.pid, s.uid), ("python3", 3129, Some(0)));
    assert_eq!(r.killed.pid, 3129);
    assert_eq!(r.killed.anon_rss_kb, Some(65152));
    assert_eq!(r.killed.file_rss_kb, Some(2648));
    assert_eq!(r.killed.pgtables_kb, Some(188));
    assert_eq!(r.killed.oom_score_adj, Some(0));
    assert!(r.killed.memcg);
    assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
}

#[test]
fn memcg_v2_report_on_6_1() {
    let r = one_report(&[
        "stress invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
        "CPU: 3 PID: 4205 Comm: stress Not tainted 6.1.0-18-amd64 #1  Debian 6.1.76-1",
        "memory: usage 102400kB, limit 102400kB, failcnt 27",
        "swap: usage 0kB, limit 0kB, failcnt 0",
        "Memory cgroup stats for /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope:",
        "anon 103825408",
        "file 0",
        "shmem 0",
        "Tasks state (memory values in pages):",
        "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
        "[   4205]     0  4205    26973    25412   253952        0           985 stress",
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-ab12.scope,mems_allowed=0-1,oom_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope,task_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope,task=stress,pid=4205,uid=0",
        "Memory cgroup out of memory: Killed process 4205 (stress) total-vm:107892kB, anon-rss:101420kB, file-rss:228kB, shmem-rss:0kB, UID:0 pgtables:248kB oom_score_adj:985",
    ]);
    assert_eq!(r.trigger_pid, Some(4205));
    assert_eq!(r.swap.as_ref().unwrap().limit_kb, 0);
    assert_eq!(r.memcg_stats["anon"], 103825408);
    assert_eq!(r.tasks[0].rss_pages, 25412);
    assert_eq!(r.tasks[0].rss_anon_pages, None);
    assert_eq!(r.tasks[0].oom_score_adj, 985);
    assert!(
        r.summary
            .as_ref()
            .unwrap()
            .oom_memcg
            .as_deref()
            .unwrap()
            .ends_with("cri-containerd-ab12.scope")
    );
    assert_eq!(r.killed.oom_score_adj, Some(985));
}

#[test]
fn global_oom_on_5_15() {
    let r = one_report(&[
        "java invoked oom-killer: gfp_mask=0x1100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
        "CPU: 1 PID: 812 Comm: java Not tainted 5.15.0-91-generic #101-Ubuntu",
        "Mem-Info:",
        "active_anon:1200 inactive_anon:900000 isolated_anon:0",
        "Tasks state (memory values in pages):",
        "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
        "[    812]  1000   812  2000000   950000  8000000        0             0 java",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-3.scope,task=java,pid=812,uid=1000",
        "Out of memory: Killed process 812 (java) total-vm:8000000kB, anon-rss:3800000kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:7812kB oom_score_adj:0",
    ]);
    let s = r.summary.as_ref().unwrap();
    assert_eq!(s.constraint, "CONSTRAINT_NONE");
    assert_eq!(s.oom_memcg, None);
    assert_eq!(
        s.task_memcg.as_deref(),
        Some("/user.slice/user-1000.slice/session-3.scope")
    );
    assert_eq!(s.uid, Some(1000));
    assert!(r.memory.is_none());
    assert!(!r.killed.memcg);
    assert_eq!(r.constraint(), "CONSTRAINT_NONE");
}

#[test]
fn old_kernel_kill_line_and_cpuset_with_commas() {
    let r = one_report(&[
        "a.out invoked oom-killer: gfp_mask=0x14200ca(GFP_HIGHUSER_MOVABLE), nodemask=(null), order=0, oom_score_adj=0",
        "CPU: 0 PID: 77 Comm: a.out Not tainted 4.19.0-25-amd64 #1 Debian 4.19.289-2",
        "Tasks state (memory values in pages):",
        "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
        "[     77]     0    77   300000   250000  2000000        0             0 a.out",
        "oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=job,mems_allowed=0-1,3,task_memcg=/,task=a.out,pid=77,uid=0",
        "Killed process 77 (a.out) total-vm:1200000kB, anon-rss:999000kB, file-rss:4kB, shmem-rss:0kB",
    ]);
    assert_eq!(r.summary.as_ref().unwrap().constraint, "CONSTRAINT_CPUSET");
    assert_eq!(r.killed.anon_rss_kb, Some(999000));
    assert_eq!(r.killed.uid, None);
    assert_eq!(r.killed.pgtables_kb, None);
    assert_eq!(r.order, Some(0));
}

/// In a saved log, the kernel's choices whose kill lines are not in it
/// (tests/fixtures/real-logs/hq-20: ten in a row) are ten kills; one
/// whose kill line follows names the process really killed (a child);
/// live, a choice alone is no kill.
#[test]
fn choices_without_their_kill_lines_are_kills_in_a_saved_log_only() {
    let lines = [
        "Memory cgroup out of memory: Kill process 19302 (java) score 1337 or sacrifice child",
        "Memory cgroup out of memory: Kill process 78753 (java) score 1348 or sacrifice child",
        "Memory cgroup out of memory: Kill process 107854 (java) score 1332 or sacrifice child",
        "Out of memory: Kill process 16959 (AsyncBlockInput) score 970 or sacrifice child",
        "Killed process 19079 (clickhouse-serv) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
    ];
    let run = |mut asm: Assembler| {
        let mut out: Vec<OomReport> = lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                asm.push(&KmsgRecord {
                    seq: i as u64,
                    ts_us: i as u64 * 1_000_000,
                    level: 4,
                    facility: 0,
                    text: l.to_string(),
                })
            })
            .filter_map(|e| match e {
                KmsgEvent::Report(r) => Some(*r),
                _ => None,
            })
            .collect();
        out.extend(asm.finish().map(|r| *r));
        out
    };
    let saved = run(Assembler::for_saved_log());
    let got: Vec<(u32, bool, bool)> = saved
        .iter()
        .map(|r| (r.killed.pid, r.chosen_only, r.killed.memcg))
        .collect();
    assert_eq!(
        got,
        [
            (19302, true, true),
            (78753, true, true),
            (107854, true, true),
            (19079, false, false)
        ]
    );
    assert_eq!(saved[3].constraint(), "CONSTRAINT_NONE");
    let live = run(Assembler::default());
    assert_eq!(
        live.iter().map(|r| r.killed.pid).collect::<Vec<_>>(),
        [19079]
    );
}

#[test]
fn rate_limited_header_gives_a_kill_line_only_report() {
    // The kernel rate-limits dump_header; the kill line always comes.
    let r = one_report(&[
        "Memory cgroup out of memory: Killed process 9 (x) total-vm:1kB, anon-rss:2kB, file-rss:3kB, shmem-rss:4kB, UID:0 pgtables:5kB oom_score_adj:0",
    ]);
    assert!(r.summary.is_none() && r.tasks.is_empty() && r.memory.is_none());
    assert_eq!(r.killed.shmem_rss_kb, Some(4));
    assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
}

#[test]
fn a_memory_oom_group_kill_is_one_incident_of_several_reports() {
    // As mm/oom_kill.c prints it: the chosen victim's full report, the
    // group announcement, then every other task of the group (the
    // reaper's line may come between).
    let mut lines = V1_MEMCG_6_18.to_vec();
    lines.extend([
        "Tasks in /job are going to be killed due to memory.oom.group set",
        "oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
        "Memory cgroup out of memory: Killed process 3130 (sh) total-vm:4000kB, anon-rss:200kB, file-rss:900kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0",
        "Memory cgroup out of memory: Killed process 3131 (worker) total-vm:8000kB, anon-rss:3200kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0",
    ]);
    let evs = feed(&lines);
    let mut reports = Vec::new();
    let mut groups = Vec::new();
    for e in evs {
        match e {
            KmsgEvent::Report(r) => reports.push(*r),
            KmsgEvent::OomGroup(g) => {
                g.mark_first(&mut reports);
                groups.push(g);
            }
            _ => {}
        }
    }
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].cgroup, "/job");
    let pids: Vec<u32> = reports.iter().map(|r| r.killed.pid).collect();
    assert_eq!(pids, [3129, 3130, 3131]);
    for r in &reports {
        assert_eq!(r.oom_group.as_deref(), Some("/job"), "{}", r.killed.pid);
    }
    // The first has the header; the members have their kill lines only.
    assert!(reports[0].summary.is_some());
    assert!(reports[1].summary.is_none() && reports[2].summary.is_none());
    // A later, unrelated OOM is not part of it.
    let mut later = lines.clone();
    later.extend(V1_MEMCG_6_18);
    let last = feed(&later)
        .into_iter()
        .filter_map(|e| match e {
            KmsgEvent::Report(r) => Some(r),
            _ => None,
        })
        .next_back()
        .unwrap();
    assert_eq!(last.oom_group, None);
}

#[test]
fn a_header_for_another_pid_is_not_joined() {
    let mut lines = V1_MEMCG_6_18[..20].to_vec();
    lines.push("Memory cgroup out of memory: Killed process 999 (other) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:0");
    let r = one_report(&lines);
    assert_eq!(r.killed.pid, 999);
    assert!(r.summary.is_none() && r.tasks.is_empty());
}

#[test]
fn xid_lines() {
    // (line, code, pci, pid, name, message start)
    type Case<'a> = (&'a str, u32, &'a str, Option<u32>, Option<&'a str>, &'a str);
    let cases: &[Case] = &[
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
            79,
            "0000:3b:00",
            Some(1234),
            Some("python"),
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0000:18:00): 31, pid=2561, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
            31,
            "0000:18:00",
            Some(2561),
            Some("python3"),
            "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
        ),
        (
            "NVRM: Xid (PCI:0000:02:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)",
            13,
            "0000:02:00",
            None,
            None,
            "Graphics SM Warp Exception on (GPC 0",
        ),
    ];
    for &(line, code, pci, pid, name, msg) in cases {
        let x = parse_xid(line).unwrap_or_else(|| panic!("{line}"));
        assert_eq!(
            (x.code, x.pci.as_str(), x.pid, x.name.as_deref()),
            (code, pci, pid, name),
            "{line}"
        );
        assert!(x.message.starts_with(msg), "{line}: {}", x.message);
    }
    // Older drivers, NVSwitches, a hidden address.
    let old = parse_xid("NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120").unwrap();
    assert_eq!(
        (old.code, old.pci.as_str(), old.sxid),
        (31, "0000:01:00", false)
    );
    let sw =
        parse_xid("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0}").unwrap();
    assert_eq!(
        (sw.code, sw.pci.as_str(), sw.sxid),
        (12028, "0000:84:00.0", true)
    );
    let hidden = parse_xid("NVRM: Xid (PCI:...): 145, RLW_REMAP").unwrap();
    assert_eq!((hidden.code, hidden.pci.as_str()), (145, "..."));
    for bad in [
        "NVRM: Xid (PCI:0000:02:00): abc",
        "some program: Xid (PCI:0000:02:00): 79, not the driver",
        "NVRM: loading driver",
        "Xid 79",
    ] {
        assert!(parse_xid(bad).is_none(), "{bad}");
    }
    assert_eq!(pci_key("00000000:3B:00.0"), pci_key("0000:3b:00"));
    assert_eq!(pci_key("0000:3b:00"), Some((0x3b, 0)));
    assert_ne!(pci_key("0000:3b:00"), pci_key("0000:18:00"));
    let evs =
        feed(&["NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=x, An uncorrectable double bit error"]);
    assert!(matches!(&evs[0], KmsgEvent::Xid(x) if x.code == 48));
}

#[test]
fn reaper_line() {
    let evs = feed(&[
        "oom_reaper: reaped process 3129 (python3), now anon-rss:12kB, file-rss:0kB, shmem-rss:0kB",
    ]);
    assert!(
        matches!(&evs[0], KmsgEvent::Reaped(r) if r.pid == 3129 && r.anon_rss_kb == Some(12) && r.comm == "python3")
    );
}

#[test]
fn a_huge_task_table_keeps_its_largest_and_most_preferred_rows() {
    let mut lines = vec![
        "x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0".to_string(),
        "Tasks state (memory values in pages):".into(),
        "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name".into(),
    ];
    let n = 100_000u32;
    for i in 0..n {
        // Small tasks, one large one and one the kernel prefers.
        let (rss, adj) = match i {
            77_777 => (900_000, 0),
            88_888 => (10, 1000),
            _ => (100 + u64::from(i % 1000), 0),
        };
        lines.push(format!(
            "[{:7}] 0 {:5} 1000 {rss} 45056 0 {adj} w{i}",
            10_000 + i,
            10_000 + i
        ));
    }
    lines.push("Memory cgroup out of memory: Killed process 87777 (w77777) total-vm:4000kB, anon-rss:3600000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0".into());
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let r = one_report(&refs);
    assert_eq!(r.tasks.len(), MAX_TASK_ROWS);
    assert_eq!(r.tasks_omitted, u64::from(n) - MAX_TASK_ROWS as u64);
    for pid in [87_777, 98_888] {
        assert!(r.tasks.iter().any(|t| t.pid == pid), "{pid} kept");
    }
    assert!(
        r.tasks.windows(2).all(|w| w[0].pid < w[1].pid),
        "in printed order"
    );
}

#[test]
fn kmsg_escapes_are_undone() {
    let r = parse_record(
        "6,7,8,-;Killed process 5 (m\\xe2\\x80\\xaehog) in /caf\\xc3\\xa9 a\\x5cx41 \\xzz\\x4",
    )
    .unwrap();
    assert_eq!(
        r.text,
        "Killed process 5 (m\u{202e}hog) in /caf\u{e9} a\\x41 \\xzz\\x4"
    );
}

#[test]
fn garbage_is_ignored_without_panic() {
    let garbage = [
        "",
        "Killed process",
        "Killed process abc (x)",
        "oom-kill:",
        "oom-kill:constraint=",
        "x invoked oom-killer: ",
        "memory: usage lots",
        "[  12] not a row",
        "Memory cgroup out of memory: Killed process 12 (unterminated",
        "\u{0}\u{1}\u{2}",
    ];
    let evs = feed(&garbage);
    assert!(evs.is_empty(), "{evs:?}");
}

#[test]
fn a_summary_line_cut_by_printk_is_said_to_be_cut() {
    let long = format!("/{}", "k".repeat(900));
    let mut lines: Vec<String> = V1_MEMCG_6_18.iter().map(|l| l.to_string()).collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with("oom-kill:"))
        .unwrap();
    let full = format!(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={long},task_memcg={long},task=python3,pid=3129,uid=0"
    );
    lines[i] = full[..1000].to_string();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let r = one_report(&refs);
    assert!(r.summary.is_none());
    assert_eq!(r.summary_cut, Some(1000));
    assert_eq!(r.killed.pid, 3129, "the rest of the report is read");
}

#[test]
fn lines_written_by_userspace_are_never_reports() {
    // `echo '<3>...' > /dev/kmsg` from a process: facility LOG_USER (prio 11).
    let mut asm = Assembler::default();
    let mut out = Vec::new();
    for (i, l) in V1_MEMCG_6_18.iter().enumerate() {
        let rec = parse_record(&format!("11,{i},{},-;{l}", 1_000 + i)).unwrap();
        out.extend(asm.push(&rec));
    }
    assert!(out.is_empty(), "{out:?}");
    // The same lines from the kernel (prio 3) are a report.
    for (i, l) in V1_MEMCG_6_18.iter().enumerate() {
        let rec = parse_record(&format!("3,{i},{},-;{l}", 2_000 + i)).unwrap();
        out.extend(asm.push(&rec));
    }
    assert!(out.iter().any(|e| matches!(e, KmsgEvent::Report(_))));
}

#[test]
fn records() {
    let r = parse_record("6,1234,134499307,-;Memory cgroup out of memory: Killed\n SUBSYSTEM=x\n")
        .unwrap();
    assert_eq!((r.level, r.seq, r.ts_us), (6, 1234, 134499307));
    assert_eq!(r.text, "Memory cgroup out of memory: Killed");
    assert_eq!(parse_record("12,7,99,c,extra;hi").unwrap().level, 4);
    assert_eq!(parse_record("12,7,99,c,extra;hi").unwrap().facility, 1);
    assert_eq!(parse_record("3,7,99,-;hi").unwrap().facility, 0);
    for bad in ["", "no semicolon", "x,1,2,-;msg", "6,1;msg"] {
        assert!(parse_record(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_figure_whose_separator_a_renderer_ate_is_whole_and_a_damaged_one_is_not() {
    let k = super::lines::parse_killed(
        "Killed process 11587 (ffmpeg) total-vm:540752kBundefined anon-rss:69412kBundefined file-rss:0kB",
    )
    .unwrap();
    assert_eq!(
        (k.total_vm_kb, k.anon_rss_kb, k.file_rss_kb),
        (Some(540_752), Some(69_412), Some(0))
    );
    let k = super::lines::parse_killed(
        "Killed process 9 (x) total-vm:1kB, anon-rss:153,700,88kB, file-rss:12kB9",
    )
    .unwrap();
    assert_eq!((k.anon_rss_kb, k.file_rss_kb), (None, None));
    let s = super::lines::parse_summary(
        "cOnstraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=emulator,mems_allowed=0-1,oom_memcg=/machine.slice,task_memcg=/machine.slice/x.scope,task=kvm,pid=2016872,uid=0",
    )
    .unwrap();
    assert_eq!(s.constraint, "CONSTRAINT_MEMCG");
}

#[test]
fn a_memcg_kill_of_4_19_to_5_2_said_constraint_none_and_stays_memcg() {
    // The summary and kill line of tests/fixtures/real-logs/hy-02 (a
    // 5.2-rc kernel: the summary printed before the constraint was set).
    let r = one_report(&[
        "stress invoked oom-killer: gfp_mask=0x6000c0(GFP_KERNEL), order=0, oom_score_adj=0",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),oom_memcg=/foo,task_memcg=/foo,task=stress,pid=210,uid=0",
        "Memory cgroup out of memory: Killed process 210 (stress) total-vm:265768kB, anon-rss:0kB, file-rss:224kB, shmem-rss:0kB",
    ]);
    assert_eq!(r.summary.as_ref().unwrap().constraint, "CONSTRAINT_NONE");
    assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
    assert_eq!(r.oom_memcg(), Some("/foo"));
    // So is a constraint no mainline kernel prints (a patch's
    // `CONSTRAINT_BPF_PSI_MEM`, tests/fixtures/real-logs/hz-16).
    let r = one_report(&[
        "test_progs invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "oom-kill:constraint=CONSTRAINT_BPF_PSI_MEM,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/t/cg2,task_memcg=/t/cg2,task=test_progs,pid=675,uid=0",
        "Memory cgroup out of memory: Killed process 675 (test_progs) total-vm:648052kB, anon-rss:42848kB, file-rss:1028kB, shmem-rss:0kB, UID:0 pgtables:152kB oom_score_adj:0",
    ]);
    assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
}

#[test]
fn the_stack_dump_line_before_3_11_names_the_trigger() {
    assert_eq!(
        super::dump_task("Pid: 6344, comm: sh Not tainted 3.2.32-pk06.11-i386 #1"),
        Some((Some(6344), Some("sh")))
    );
    assert_eq!(super::dump_task("Pid: x, comm: sh"), None);
    let r = one_report(&[
        "sh invoked oom-killer: gfp_mask=0xd0, order=1, oom_adj=0, oom_score_adj=0",
        "Pid: 6344, comm: sh Not tainted 3.2.32-pk06.11-i386 #1",
        "Out of memory (oom_kill_allocating_task): Kill process 6344 (sh) score 0 or sacrifice child",
        "Killed process 6345 (sleep) total-vm:4804kB, anon-rss:104kB, file-rss:332kB",
    ]);
    assert_eq!((r.trigger_pid, r.killed.pid), (Some(6344), 6345));
}

/// A kill line with an Oops glued after it (tests/fixtures/real-logs/hz-03,
/// 2.6.35 on POWER): the name ends at its first figure, not at the last
/// `)` of what follows; a name with a `)` of its own is whole.
#[test]
fn a_kill_line_s_name_ends_before_its_figures() {
    let k = lines::parse_killed("Killed process 9140 (memcg_test_1) vsz:3456kB, anon-rss:448kB, file-rss:1088kB Unable to handle kernel paging request for data at address 0x720 REGS: c000 (2.6.35-rc2-autotest) MSR: 8000 <EE,ME,IR,DR>").unwrap();
    assert_eq!(k.comm, "memcg_test_1");
    assert_eq!(
        (k.total_vm_kb, k.anon_rss_kb, k.file_rss_kb),
        (Some(3456), Some(448), Some(1088))
    );
    let k =
        lines::parse_killed("Killed process 812 ((sd-pam)) total-vm:1kB, anon-rss:1kB").unwrap();
    assert_eq!(k.comm, "(sd-pam)");
    let k = lines::parse_killed("Out of Memory: Killed process 2368 (jserver).").unwrap();
    assert_eq!(k.comm, "jserver");
}

/// A saved log without the report's header (tests/fixtures/real-logs/hz-04,
/// 3.2): the stack dump's task is the trigger once its call trace goes
/// through the OOM killer; a stack dump of anything else is not.
#[test]
fn a_stack_dump_through_the_oom_killer_names_the_trigger_of_a_headless_paste() {
    let run = |trace: &str| {
        let r = saved_reports(&[
            "Pid: 9247, comm: apache2 Not tainted 3.2.34-grsec #1",
            "Call Trace:",
            trace,
            "Out of memory: Kill process 2188 (mysqld) score 60 or sacrifice child",
            "Killed process 2188 (mysqld) total-vm:3330016kB, anon-rss:864176kB, file-rss:8072kB",
        ]);
        let r = r.last().expect("a report");
        (r.trigger_pid, r.trigger_comm.clone())
    };
    assert_eq!(
        run(" [<ffffffff810ccdd5>] oom_kill_process+0x85/0x2a0"),
        (Some(9247), Some("apache2".to_string()))
    );
    assert_eq!(
        run(" [<ffffffff8102739e>] do_page_fault+0x3ee/0x460"),
        (None, None)
    );
}

/// 3.0's choice with the victim's figures (tests/fixtures/real-logs/ia-10),
/// a process killed for sharing the victim's memory (ia-03: `init`, whose
/// line names no OOM), and a summary cut by `less` after its task_memcg's
/// comma (ia-01).
#[test]
fn choices_with_figures_kills_of_shared_memory_and_a_summary_cut_after_task_memcg() {
    let k = lines::parse_chosen(
        "Out of memory: Kill process 5462 (abrtd) points:393 total-vm:262300kB, anon-rss:1024kB, file-rss:0kB",
    )
    .unwrap();
    assert_eq!((k.pid, k.comm.as_str()), (5462, "abrtd"));
    assert_eq!((k.anon_rss_kb, k.file_rss_kb), (Some(1024), Some(0)));
    let reports = saved_reports(&[
        "Out of memory: Kill process 9134 (init) score 3 or sacrifice child",
        "Killed process 9134 (init) total-vm:1868kB, anon-rss:84kB, file-rss:572kB",
        "Kill process 1 (init) sharing same memory",
    ]);
    let pids: Vec<u32> = reports.iter().map(|r| r.killed.pid).collect();
    assert_eq!(pids, [9134, 1]);
    assert!(reports[1].killed.bare, "its line names no OOM");
    let r = one_report(&[
        "tuned invoked oom-killer: gfp_mask=0x6200ca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/firewalld.service,>",
        "Out of memory: Killed process 925 (firewalld) total-vm:298292kB, anon-rss:21912kB, file-rss:0kB, shmem-rss:0kB, UID:0",
    ]);
    assert_eq!(r.task_memcg(), Some("/system.slice/firewalld.service"));
    assert_eq!(r.constraint(), "CONSTRAINT_NONE");
}
