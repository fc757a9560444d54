//! Saved logs of every shape, from real kernels' lines.

use super::*;

const T: i64 = 1_741_017_600_000_000_000; // 2025-03-03T16:00:00Z

/// (line, host, monotonic us, wall ns, text).
type Case<'a> = (&'a str, Option<&'a str>, Option<u64>, Option<i64>, &'a str);

#[test]
fn every_shape_of_a_line() {
    let cases: &[Case] = &[
        (
            "6,1234,5678901,-;Out of memory",
            None,
            Some(5_678_901),
            None,
            "Out of memory",
        ),
        (
            "[ 5678.901234] Out of memory",
            None,
            Some(5_678_901_234),
            None,
            "Out of memory",
        ),
        ("[    2.5] x", None, Some(2_500_000), None, "x"),
        (
            "[Mon Mar  3 16:00:00 2025] Out of memory",
            None,
            None,
            Some(T),
            "Out of memory",
        ),
        (
            "Mar  3 16:00:00 node-7 kernel: [ 5678.901234] Out of memory",
            Some("node-7"),
            Some(5_678_901_234),
            Some(T),
            "Out of memory",
        ),
        (
            "Mar 03 16:00:00 node-7 kernel: Out of memory",
            Some("node-7"),
            None,
            Some(T),
            "Out of memory",
        ),
        (
            "2025-03-03T17:00:00+0100 node-7 kernel: Out of memory",
            Some("node-7"),
            None,
            Some(T),
            "Out of memory",
        ),
        (
            "2025-03-03T16:00:00.250000+00:00 node-7 kernel: x",
            Some("node-7"),
            None,
            Some(T + 250_000_000),
            "x",
        ),
        (
            "2025-03-03T16:00:00,250000+00:00 node-7 kernel: x",
            Some("node-7"),
            None,
            Some(T + 250_000_000),
            "x",
        ),
        (
            "[ 5678.901234] node-7 kernel: Out of memory",
            Some("node-7"),
            Some(5_678_901_234),
            None,
            "Out of memory",
        ),
    ];
    for (line, host, mono, wall, text) in cases {
        let l = parse_line(line, 2025).unwrap_or_else(|| panic!("{line}"));
        assert_eq!(l.host.as_deref(), *host, "{line}");
        assert_eq!(l.mono_us, *mono, "{line}");
        assert_eq!(l.wall_ns, *wall, "{line}");
        assert_eq!(l.text, *text, "{line}");
        assert!(l.kernel);
    }
    // A syslog line of another program, and prose, are not kernel lines.
    assert_eq!(
        parse_line("Mar  3 16:00:00 node-7 sshd[99]: Accepted", 2025),
        None
    );
    assert_eq!(parse_line("the node died at 4 pm", 2025), None);
    // The tasks table's `[  pid  ]` is no timestamp.
    assert_eq!(parse_line("[   3129]     0  3129", 2025), None);
    // A record userspace wrote to /dev/kmsg is marked as such.
    assert!(
        !parse_line("12,7,100,-;Killed process 1 (x)", 2025)
            .unwrap()
            .kernel
    );
}

/// Lines as people paste them (each shape seen in tests/fixtures/real-logs):
/// (line, host, monotonic us, wall ns, text, no stamp at all).
#[test]
fn pasted_shapes_of_a_line() {
    let feb20 = wall((2024, 2, 20), (19, 15, 36), 0, 0);
    type Pasted<'a> = (
        &'a str,
        Option<&'a str>,
        Option<u64>,
        Option<i64>,
        &'a str,
        bool,
    );
    let cases: &[Pasted] = &[
        ("> > [ 1.5] x", None, Some(1_500_000), None, "x", false),
        ("```[ 1.5] x```", None, Some(1_500_000), None, "x", false),
        ("- `[ 1.5] x`", None, Some(1_500_000), None, "x", false),
        ("12: [ 1.5] x", None, Some(1_500_000), None, "x", false),
        ("  7 | [ 1.5] x", None, Some(1_500_000), None, "x", false),
        (
            "messages-20150510:Mar  3 16:00:00 localhost kernel: x",
            Some("localhost"),
            None,
            Some(T),
            "x",
            false,
        ),
        (
            "Mon Mar  3 16:00:00 2025 kern.warn kernel: [ 1.5] x",
            None,
            Some(1_500_000),
            Some(T),
            "x",
            false,
        ),
        ("Mar 03 16:00:00 kernel: x", None, None, Some(T), "x", false),
        (
            "Mar 03 16:00:00.250000 node-7 kernel: x",
            Some("node-7"),
            None,
            Some(T + 250_000_000),
            "x",
            false,
        ),
        (
            "2025-03-03T17:00:00,000000+01:00 pool invoked oom-killer: gfp_mask=0xcc0",
            None,
            None,
            Some(T),
            "pool invoked oom-killer: gfp_mask=0xcc0",
            false,
        ),
        (
            "  | Jun 25, 2021 @ 12:42:12.104 | kernel | [ 1.5] x",
            None,
            Some(1_500_000),
            None,
            "x",
            false,
        ),
        (
            "2023-12-04T10:49:30.127Z In(05) vcpu-5 - Guest: <6>[ 1.5] x",
            None,
            Some(1_500_000),
            wall((2023, 12, 4), (10, 49, 30), 127_000_000, 0),
            "x",
            false,
        ),
        ("[Di Feb 20 19:15:36 2024] x", None, None, feb20, "x", false),
        (
            "[Tue 20 Feb 19:15:36 2024] x",
            None,
            None,
            feb20,
            "x",
            false,
        ),
        ("[вт фев 20 19:15:36 2024] x", None, None, feb20, "x", false),
        (
            "[mar. févr. 20 19:15:36 2024] x",
            None,
            None,
            feb20,
            "x",
            false,
        ),
        (
            "kernel: Killed process 7919, UID 504 oracle",
            None,
            None,
            None,
            "Killed process 7919, UID 504 oracle",
            true,
        ),
        (
            "Out of memory: Kill process 957 (app.out) score 524 or sacrifice child",
            None,
            None,
            None,
            "Out of memory: Kill process 957 (app.out) score 524 or sacrifice child",
            true,
        ),
    ];
    for (line, host, mono, wall, text, untimed) in cases {
        let l = parse_pasted(line, 2025).unwrap_or_else(|| panic!("{line}"));
        assert_eq!(l.host.as_deref(), *host, "{line}");
        assert_eq!(l.mono_us, *mono, "{line}");
        assert_eq!(l.wall_ns, *wall, "{line}");
        assert_eq!(l.text, *text, "{line}");
        assert_eq!(l.untimed, *untimed, "{line}");
    }
    // Prose, prompts, other programs' lines and fences are no kernel lines.
    for line in [
        "the node died at 4 pm",
        "[root@server ~]# dmesg | grep -i oom",
        "Mar  3 16:00:00 node-7 sshd[99]: Accepted",
        "2025-03-03T16:00:00+0000 node-7 systemd[1]: Started x",
        "```",
    ] {
        assert_eq!(parse_pasted(line, 2025), None, "{line}");
    }
}

/// A syslog stamp has no year: one that would be days ahead of now is
/// of the year before, and the guess is kept with the line.
#[test]
fn a_syslog_date_ahead_of_now_is_of_last_year() {
    // Civil date of a day count (the inverse of days_from_civil).
    fn civil(z: i64) -> (i64, i64, i64) {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        (yoe + era * 400 + i64::from(m <= 2), m, d)
    }
    let today = crate::util::time::wall_now_ns() / 86_400_000_000_000;
    for (ahead, back) in [(10, true), (-10, false)] {
        let (y, m, d) = civil(today + ahead);
        let names = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let log = format!(
            "{} {d:2} 10:00:00 node-7 kernel: Out of memory: Killed process 4 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
            names[m as usize - 1]
        );
        let found = read_log(log.as_bytes(), y).unwrap();
        let r = &found.reports[0];
        let want_year = if back { y - 1 } else { y };
        assert_eq!(r.guessed, (Some(want_year), true), "{log}");
        let wall = r.report.ts_us as i64 * 1000 + r.mono_to_wall_ns.unwrap();
        assert_eq!(
            wall,
            super::wall((want_year, m, d), (10, 0, 0), 0, 0).unwrap(),
            "{log}"
        );
    }
}

/// `journalctl -o verbose`: the stamps of an entry's header line give
/// the time of its `MESSAGE=` line (tests/fixtures/real-logs/ho-03).
#[test]
fn journalctl_verbose_entries() {
    let log = "Thu 2023-02-02 11:49:13.015489 CET [s=1d8f;i=10823659;b=796d;m=1f6726955fe3;t=5f3b550c118c1;x=e534]\n    MESSAGE=Memory cgroup out of memory: Killed process 2855014 (tail) total-vm:4296kB, anon-rss:60kB, file-rss:516kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0\n";
    let found = read_log(log.as_bytes(), 2023).unwrap();
    let r = &found.reports[0];
    assert_eq!(r.report.killed.pid, 2_855_014);
    assert_eq!(r.report.ts_us, 0x1f67_2695_5fe3);
    let wall = r.report.ts_us as i64 * 1000 + r.mono_to_wall_ns.unwrap();
    assert_eq!(wall, 0x0005_f3b5_50c1_18c1 * 1000);
}

/// Messages glued on one line (a paste that lost its line breaks) are
/// read one by one; one message with a stamp inside stays whole.
#[test]
fn glued_messages_are_parted() {
    let parts = |line: &str| {
        let mut from = 0;
        let mut out = Vec::new();
        for at in glued_starts(line) {
            out.push(line[from..at].trim().to_string());
            from = at;
        }
        out.push(line[from..].to_string());
        out
    };
    assert_eq!(
        parts(
            "Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child Killed process 5372 (mongod), UID 0, total-vm:2539052kB"
        ),
        [
            "Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child",
            "Killed process 5372 (mongod), UID 0, total-vm:2539052kB"
        ]
    );
    assert_eq!(
        parts(
            "[root@server ~]# dmesg | grep -i oom [197352.008908] Out of memory: Kill process 12166 (mysqld) score 870 or sacrifice child [197352.030461] Killed process 12166"
        ),
        [
            "[root@server ~]# dmesg | grep -i oom",
            "[197352.008908] Out of memory: Kill process 12166 (mysqld) score 870 or sacrifice child",
            "[197352.030461] Killed process 12166"
        ]
    );
    assert_eq!(
        parts(
            "Jul 19 05:19:24 asl131 kernel: Out of Memory: Killed process 2368 (jserver). Jul 19 05:19:24 asl131 kernel: OOM kill occurred"
        )
        .len(),
        2
    );
    // No space at all between them (tests/fixtures/real-logs/hz-02, a
    // 2.6.20 console quoted in a mail).
    assert_eq!(
        parts(
            "Killed process 19271 (trashapplet)Out of memory: kill process 12475 (qemu) score 7899 or a childKilled process 12475 (qemu)"
        ),
        [
            "Killed process 19271 (trashapplet)",
            "Out of memory: kill process 12475 (qemu) score 7899 or a child",
            "Killed process 12475 (qemu)"
        ]
    );
    assert_eq!(
        parts(
            "Killed process 9134 (init) total-vm:1868kB, anon-rss:84kB, file-rss:572kB Kill process 1 (init) sharing same memory"
        ),
        [
            "Killed process 9134 (init) total-vm:1868kB, anon-rss:84kB, file-rss:572kB",
            "Kill process 1 (init) sharing same memory"
        ]
    );
    for whole in [
        "Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child",
        "Memory cgroup out of memory: Kill process 1 (x) score 1 or sacrifice child",
        "Mar  3 16:00:06 node-7 kernel: [  100.000006] Memory cgroup out of memory: Killed process 3129 (python3)",
        "[Mon Mar  3 16:00:00 2025] Out of memory: Killed process 1 (x)",
        "[ 1.5] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=x,pid=1,uid=0",
    ] {
        assert_eq!(parts(whole), [whole], "{whole}");
    }
}

/// The kernel's lines of one memcg OOM kill (6.18, cgroup v1).
const REPORT: &[&str] = &[
    "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "memory: usage 65536kB, limit 65536kB, failcnt 3543",
    "Tasks state (memory values in pages):",
    "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
    "[   3129]     0  3129    18790    16950    16288      662         0   192512        0             0 python3",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=3129,uid=0",
    "Memory cgroup out of memory: Killed process 3129 (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
];

#[test]
fn a_report_from_each_shape_of_log() {
    let shapes: [fn(usize, &str) -> String; 4] = [
        |i, l| format!("[ 100.{i:06}] {l}"),
        |i, l| format!("Mar  3 16:00:0{} node-7 kernel: [  100.{i:06}] {l}", i % 10),
        |_, l| format!("2025-03-03T16:00:00+0000 node-7 kernel: {l}"),
        |_, l| format!("[Mon Mar  3 16:00:00 2025] {l}"),
    ];
    for (n, shape) in shapes.iter().enumerate() {
        let log: String = REPORT
            .iter()
            .enumerate()
            .map(|(i, l)| shape(i, l) + "\n")
            .collect();
        let found = read_reports(log.as_bytes(), 2025).unwrap();
        assert_eq!(found.len(), 1, "shape {n}:\n{log}");
        let r = &found[0];
        assert_eq!(r.report.killed.pid, 3129, "shape {n}");
        assert_eq!(r.report.memory.as_ref().unwrap().limit_kb, 65536);
        assert_eq!(r.report.tasks.len(), 1);
        // Wall time only where the lines carry one.
        assert_eq!(r.mono_to_wall_ns.is_some(), n > 0, "shape {n}");
    }
}

/// `dmesg -H`: a minute's first message at its wall time without a year,
/// the rest at their offsets from the one before (the shape of
/// tests/fixtures/real-logs/hr-07); a stamp that lost its `[` in a quote
/// (hr-27); a pid after two spaces (hr-22); a header whose figures a
/// paste cut off (hr-12).
#[test]
fn human_stamps_and_damaged_lines() {
    let log = "[Oct28 16:58] mysqld invoked oom-killer: gfp_mask=0x14200ca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0\n\
               [  +0.000082] Out of memory: Kill process 16556 (mysqld) score 1663 or sacrifice child\n\
               [  +0.000003] Killed process 16556 (mysqld) total-vm:16816660kB, anon-rss:4469476kB, file-rss:0kB, shmem-rss:0kB\n";
    let found = read_log(log.as_bytes(), 2025).unwrap();
    let r = &found.reports[0];
    assert_eq!(r.report.killed.pid, 16556);
    assert_eq!(r.report.trigger_comm.as_deref(), Some("mysqld"));
    let wall = r.report.ts_us as i64 * 1000 + r.mono_to_wall_ns.unwrap();
    assert_eq!(
        wall,
        super::wall((2025, 10, 28), (16, 58, 0), 0, 0).unwrap()
    );
    assert_eq!(r.guessed.0, Some(2025));

    let l = parse_pasted("> 95327.384563] Out of memory: Kill process 1 (x)", 2025).unwrap();
    assert_eq!(l.mono_us, Some(95_327_384_563));
    assert_eq!(l.text, "Out of memory: Kill process 1 (x)");
    // Not a stamp: no `[` is put before it.
    assert_eq!(parse_pasted("95327.384563 Out of memory", 2025), None);

    let log = "Jul 22 19:16:26 kodi kernel: Out of memory: Killed process  532 (kodi.bin) total-vm:1561568kB, anon-rss:397140kB, file-rss:112348kB, shmem-rss:0kB\n";
    let found = read_log(log.as_bytes(), 2025).unwrap();
    assert_eq!(found.reports[0].report.killed.pid, 532);
    assert_eq!(found.reports[0].report.killed.comm, "kodi.bin");

    let log = "kernel: mysqld invoked oom-killer\nkernel: Out of memory: Killed process 14612 (mysqld) total-vm:106961224kB, anon-rss:104949800kB\n";
    let found = read_log(log.as_bytes(), 2025).unwrap();
    assert_eq!(
        found.reports[0].report.trigger_comm.as_deref(),
        Some("mysqld")
    );
    // Prose is no header.
    let log = "the job invoked oom-killer\nkernel: Out of memory: Killed process 14612 (mysqld) total-vm:1kB\n";
    let found = read_log(log.as_bytes(), 2025).unwrap();
    assert_eq!(found.reports[0].report.trigger_comm, None);
}

/// Shapes of the fifth held-out set (tests/fixtures/real-logs/hs-*):
/// printk's caller id (hs-15), a `memory.oom.group` kill of a kernel
/// before 4.19 (hs-13), a summary cut before its task (hs-12), a quoted
/// and indented `CPU:` line (hs-10), one kill pasted twice (hs-18).
#[test]
fn caller_ids_old_group_kills_cut_summaries_and_copies() {
    let one = |log: &str| read_log(log.as_bytes(), 2025).unwrap().reports;
    let r = one(
        "[   49.921978][ T6736] leaker invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n\
                 [   50.052086][ T6736] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/leaker,task_memcg=/leaker,task=leaker,pid=6736,uid=0\n\
                 [   50.052090][ T6736] Memory cgroup out of memory: Killed process 6736 (leaker) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].report.trigger_comm.as_deref(), Some("leaker"));
    assert_eq!(r[0].report.task_memcg(), Some("/leaker"));

    let r = one(
        "[   52.835327] Out of memory: Kill process 1221 (allocate) score 241 or sacrifice child\n\
                 [   52.836625] Killed process 1221 (allocate) total-vm:2257144kB, anon-rss:2009128kB, file-rss:4kB, shmem-rss:0kB\n\
                 [   52.841431] Tasks in /A1 are going to be killed due to memory.oom.group set\n\
                 [   52.869439] Killed process 1217 (allocate) total-vm:2052344kB, anon-rss:1704036kB, file-rss:0kB, shmem-rss:0kB\n\
                 [   52.903770] Killed process 1221 (allocate) total-vm:2257144kB, anon-rss:2009128kB, file-rss:4kB, shmem-rss:0kB\n\
                 [   52.905574] Killed process 1222 (allocate) total-vm:2257144kB, anon-rss:2063640kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    let pids: Vec<u32> = r.iter().map(|r| r.report.killed.pid).collect();
    assert_eq!(pids, [1221, 1217, 1222]);
    for r in &r {
        assert_eq!(
            r.report.known_constraint(),
            Some("CONSTRAINT_NONE"),
            "{r:?}"
        );
    }
    // The first victim's second line (with its group) is the same kill,
    // and says the group.
    assert_eq!(r[0].report.oom_group.as_deref(), Some("/A1"));
    assert_eq!(r[1].report.oom_group.as_deref(), Some("/A1"));

    let r = one(
        "[ 2787.216534] oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=test,mems_allowed=0\n\
                 [ 2787.216900] Out of memory: Killed process 13432 (mem_on_node1) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.known_constraint(), Some("CONSTRAINT_CPUSET"));

    let r = one(
        ">   runc:[2:INIT] invoked oom-killer: gfp_mask=0x500cc2(GFP_HIGHUSER|__GFP_ACCOUNT), order=0, oom_score_adj=0\n\
                 >   CPU: 8 PID: 8291 Comm: runc:[2:INIT] Tainted: G        W I E     5.8.2 #1\n\
                 >   Out of memory: Killed process 4100 (containerd) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.trigger_pid, Some(8291));

    // The same kill quoted without a time, then in the console's log.
    let r = one(
        ">> Killed process 6410 (syz-executor5) total-vm:37708kB, anon-rss:2128kB, file-rss:0kB, shmem-rss:0kB\n\
                 > : [   65.996474] Killed process 6410 (syz-executor5) total-vm:37708kB, anon-rss:2128kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r.len(), 1);
    assert!(!r[0].untimed);
    // node-problem-detector's event before the kernel's choice (hs-03).
    let r = one(
        "1 OOMKilling: Memory cgroup out of memory: Kill process 605624 (pause) score 0 or sacrifice child\n\
                 Killed process 605624 (pause) total-vm:1024kB, anon-rss:4kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].report.known_constraint(), Some("CONSTRAINT_MEMCG"));
    // A raw quoted-printable mail (hs-14): `=3D` and soft breaks.
    let r = one(
        "[   71.736596] oom-kill:constraint=3DCONSTRAINT_MEMCG,nodemask=3D(null),cpu=\n\
                 set=3D/,mems_allowed=3D0-1,oom_memcg=3D/mglru,task_memcg=3D/mglru,task=3Dte=\n\
                 st.sh,pid=3D7215,uid=3D0\n\
                 [   71.736600] Memory cgroup out of memory: Killed process 7215 (test.sh) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.task_memcg(), Some("/mglru"));
    assert_eq!(
        r[0].report.summary.as_ref().map(|s| s.task.as_str()),
        Some("test.sh")
    );
    // Held across a soft break at the very end: still read.
    let r = one(
        "mems_allowed=3D0,cpu=\nset=3D/\n[ 1.0] Out of memory: Killed process 8 (b) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0k=\nB\n",
    );
    assert_eq!(r.len(), 1);
    // `=3D` in a task's name is no mail: `pid=12..` stays as it is.
    let r = one(
        "[ 2.0] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=3DMark,pid=1234,uid=1000\n\
                 [ 2.1] Out of memory: Killed process 1234 (3DMark) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.killed.pid, 1234);
    assert_eq!(
        r[0].report.summary.as_ref().map(|s| (s.pid, s.uid)),
        Some((1234, Some(1000)))
    );
    // minikube's klog prefix before relayed `dmesg -H` lines (ht-06).
    let r = one(
        "I0601 23:23:10.446437   13604 utils.go:240] > [  +0.000036] Out of memory: Kill process 3400 (sshd) score 1 or sacrifice child\n\
                 I0601 23:23:10.447437   13604 utils.go:240] > [  +0.000005] Killed process 3433 (scp) total-vm:21492kB, anon-rss:312kB, file-rss:2320kB, shmem-rss:0kB\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].report.killed.pid, 3433);
    // The header pasted below its kill (ht-09): the kill takes its
    // trigger; a later report's header (after the kill in time) does not.
    let r = one(
        "Apr  6 06:43:33 exocortex kernel: [1504351.813020] Out of memory: Kill process 8055 (ruby) score 267 or sacrifice child\n\
                 Apr  6 06:43:33 exocortex kernel: [1504351.813029] Killed process 8055 (ruby) total-vm:2159008kB, anon-rss:1kB, file-rss:0kB\n\
                 With the following right before it:\n\
                 Apr  6 06:43:33 exocortex kernel: [1504351.812543] mysqld invoked oom-killer: gfp_mask=0x201da, order=0, oom_score_adj=0\n\
                 Apr  6 06:43:33 exocortex kernel: [1504351.812562] mysqld cpuset=/ mems_allowed=0\n\
                 Apr  6 06:43:33 exocortex kernel: [1504351.812577] CPU: 0 PID: 1251 Comm: mysqld Tainted: GF 3.13.0-24-generic #46-Ubuntu\n\
                 Apr  6 06:44:33 exocortex kernel: [1504411.000000] java invoked oom-killer: gfp_mask=0x201da, order=0, oom_score_adj=0\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].report.trigger_comm.as_deref(), Some("mysqld"));
    assert_eq!(r[0].report.trigger_pid, Some(1251));
    assert_eq!(r[0].report.order, Some(0));
    // A pid used again, by another process (other figures): two kills.
    let r = one(
        "[ 1.0] Out of memory: Killed process 7 (a) total-vm:10kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n\
                 [ 9.0] Out of memory: Killed process 7 (a) total-vm:20kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
    );
    assert_eq!(r.len(), 2);
    // node-problem-detector's event as `kubectl get events -o json`
    // prints it: the kernel's line is a member of the object (hw-02).
    let r = one("    \"reason\": \"OOMKilling\",\n\
                 \"message\": \"Memory cgroup out of memory: Killed process 3504804 (kubectl) total-vm:753508kB, anon-rss:58776kB, file-rss:29400kB, shmem-rss:0kB, UID:0 pgtables:288kB oom_score_adj:999\",\n\
                 \"source\": {\n");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].report.killed.anon_rss_kb, Some(58776));
    assert_eq!(r[0].report.known_constraint(), Some("CONSTRAINT_MEMCG"));
    // A quoted line a mail archive joined to the next, its `> ` inside
    // (hw-26).
    let r = one(
        "> Dec 1 15:01:07 cluster1 kernel: Out of memory: Kill process 7963 > (sge_qmaster) score 948 or sacrifice child it's also worth pointing out that you can explicitly tell the OOM killer to lay off a process\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].report.killed.pid, r[0].report.killed.comm.as_str()),
        (7963, "sge_qmaster")
    );
    // A kubectl event whose cells a tab parts (hx-29), and the event
    // aggregator's prefix (hx-30): the choice line says memcg.
    let r = one(
        "kernel-monitor, gke-cluster-1-default-pool-81a54c78-gl40\t\t\tWarning\t\tOOMKilling\tMemory cgroup out of memory: Kill process 1371 (node) score 2081 or sacrifice child\n\
                 Killed process 1371 (node) total-vm:783352kB, anon-rss:201844kB, file-rss:22852kB\n",
    );
    assert_eq!(r[0].report.known_constraint(), Some("CONSTRAINT_MEMCG"));
    let r = one(
        "Message:(combined from similar events): Memory cgroup out of memory: Kill process 302951 (AsyncLogger-1) score 2366 or sacrifice child\n\
                 Killed process 300907 (java) total-vm:5870996kB, anon-rss:101048kB, file-rss:40932kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.killed.pid, 300907);
    assert_eq!(r[0].report.known_constraint(), Some("CONSTRAINT_MEMCG"));
    // The summary names the process the kernel chose, whose child it
    // sacrificed (hx-17): it is that kill's summary.
    let r = one(
        "[65267.037323] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=aba6,mems_allowed=0-1,oom_memcg=/kubepods/burstable/poddfc7,task_memcg=/kubepods/burstable/poddfc7/aba6,task=nginx,pid=22232,uid=0\n\
                 [65267.037327] Memory cgroup out of memory: Kill process 22232 (nginx) score 1182 or sacrifice child\n\
                 [65267.042541] Killed process 22964 (nginx) total-vm:14136kB, anon-rss:844kB, file-rss:4kB, shmem-rss:0kB\n",
    );
    assert_eq!(r[0].report.killed.pid, 22964);
    assert_eq!(
        r[0].report.task_memcg(),
        Some("/kubepods/burstable/poddfc7/aba6")
    );
    // An untimed header whose gfp flags a `|` parts is no table row
    // (hx-26): the choice after it takes its trigger.
    let r = one(
        "kthread invoked oom-killer: gfp_mask=0x27080c0(GFP_KERNEL_ACCOUNT|__GFP_ZERO|__GFP_NOTRACK), nodemask=0, order=2, oom_score_adj=0\n\
                 Out of memory: Kill process 7248 (python3) score 266 or sacrifice child\n",
    );
    assert_eq!(r[0].report.trigger_comm.as_deref(), Some("kthread"));
    // The members of a `memory.oom.group` kill are of the first's incident:
    // the cgroup at its limit, not its trigger (a linux-block mail's 6.11
    // log, hx-02, lines unwrapped).
    let r = one(
        "[   81.623460] cc1 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n\
                 [   81.624056] CPU: 64 UID: 1000 PID: 5646 Comm: cc1 Tainted: G S 6.11.0-rc6+ #34\n\
                 [   82.522782] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg=/build-kernel-tmpfs,task_memcg=/build-kernel-tmpfs,task=cc1,pid=5646,uid=1000\n\
                 [   82.528351] Memory cgroup out of memory: Killed process 5646 (cc1) total-vm:63292kB, anon-rss:21852kB, file-rss:12704kB, shmem-rss:0kB, UID:1000 pgtables:148kB oom_score_adj:0\n\
                 [   82.534240] Tasks in /build-kernel-tmpfs are going to be killed due to memory.oom.group set\n\
                 [   82.535005] Memory cgroup out of memory: Killed process 2025 (kbench) total-vm:7180kB, anon-rss:0kB, file-rss:1800kB, shmem-rss:0kB, UID:1000 pgtables:60kB oom_score_adj:0\n",
    );
    assert_eq!(r.len(), 2);
    let member = r.iter().find(|r| r.report.killed.pid == 2025).unwrap();
    assert_eq!(member.report.oom_memcg(), Some("/build-kernel-tmpfs"));
    assert_eq!(
        (
            member.report.trigger_pid,
            member.report.trigger_comm.as_deref()
        ),
        (None, None)
    );
    assert_eq!(member.report.task_memcg(), None);
    // A mail's wraps inside a kill line's fields and figures (hx-02), and
    // inside a summary's field names, after a piece shorter than any
    // wrap (hx-13).
    let r = one(
        "[   82.536248] Memory cgroup out of memory: Killed process 4734 (time)\n\
                 total-vm:2544kB, anon-rss:0kB, file-rss:1196kB, sh\n\
                 mem-rss:0kB, UID:1000 pgtables:48kB oom_score_adj:0\n\
                 [   82.528351] Memory cgroup out of memory: Killed process 5646 (cc1)\n\
                 total-vm:63292kB, anon-rss:21852kB, file-rss:12704k\n\
                 B, shmem-rss:0kB, UID:1000 pgtables:148kB oom_score_adj:0\n",
    );
    let k = |pid| {
        &r.iter()
            .find(|r| r.report.killed.pid == pid)
            .unwrap()
            .report
            .killed
    };
    assert_eq!(k(4734).shmem_rss_kb, Some(0));
    assert_eq!(k(5646).file_rss_kb, Some(12704));
    let r = one(
        "[   56.419654] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom\n\
                 _memcg=/test512mb,task_m\n\
                 emcg=/test512mb,task=stress,pid=1122,uid=0\n\
                 [   56.419663] Memory cgroup out of memory: Killed process 1122 (stress) \n\
                 total-vm:719740kB, anon-rss:522880kB, file-rss\n\
                 :536kB, shmem-rss:0kB, UID:0 pgtables:1072kB oom_score_adj:0\n",
    );
    assert_eq!(r[0].report.task_memcg(), Some("/test512mb"));
    assert_eq!(r[0].report.killed.file_rss_kb, Some(536));
    // A damaged `uid0` in a summary and `UID:00` in a kill line (hx-06):
    // the summary is read without its uid, and `00` is no uid.
    let r = one(
        "[   88.339563] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-2,oom_memcg=/a,task_memcg=/a,task=tail,pid=108,uid0\n\
                 [   88.339588] Memory cgroup out of memory: Killed process 108 (tail) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:00 pgtables:1kB oom_score_adj:0\n",
    );
    assert_eq!(r[0].report.task_memcg(), Some("/a"));
    assert_eq!(r[0].report.killed.uid, None);
}

/// Wraps `line` at `width` columns the way mail clients do: at a space
/// when there is one, else hard.
fn wrap(line: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while rest.len() > width {
        let cut = rest[..width].rfind(' ').filter(|&i| i > 0);
        match cut {
            Some(i) => {
                out.push(rest[..i].to_string());
                rest = &rest[i + 1..];
            }
            None => {
                out.push(rest[..width].to_string());
                rest = &rest[width..];
            }
        }
    }
    out.push(rest.to_string());
    out
}

#[test]
fn lines_rewrapped_by_a_mail_client_are_put_back() {
    for width in [60, 72, 78] {
        let log: String = REPORT
            .iter()
            .enumerate()
            .flat_map(|(i, l)| wrap(&format!("[ 100.{i:06}] {l}"), width))
            .map(|l| l + "\n")
            .collect();
        let found = read_reports(log.as_bytes(), 2025).unwrap();
        assert_eq!(found.len(), 1, "width {width}:\n{log}");
        let r = &found[0].report;
        assert_eq!(r.killed.pid, 3129);
        assert_eq!(r.killed.anon_rss_kb, Some(65152), "width {width}");
        assert_eq!(r.killed.oom_score_adj, Some(0), "width {width}");
        let s = r.summary.as_ref().expect("the oom-kill line");
        assert_eq!(s.task_memcg.as_deref(), Some("/job"), "width {width}");
        assert_eq!((s.task.as_str(), s.pid, s.uid), ("python3", 3129, Some(0)));
        assert_eq!(r.tasks.len(), 1, "width {width}");
    }
}

#[test]
fn interleaved_hosts_are_assembled_apart() {
    let mut log = String::new();
    for l in REPORT {
        log += &format!("2025-03-03T16:00:00+0000 node-a kernel: {l}\n");
        log += &format!(
            "2025-03-03T16:00:01+0000 node-b kernel: {}\n",
            l.replace("3129", "4242")
        );
    }
    let found = read_reports(log.as_bytes(), 2025).unwrap();
    let mut got: Vec<(String, u32)> = found
        .iter()
        .map(|r| (r.host.clone().unwrap(), r.report.killed.pid))
        .collect();
    got.sort();
    assert_eq!(got, [("node-a".into(), 3129), ("node-b".into(), 4242)]);
}

#[test]
fn civil_dates() {
    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    assert_eq!(wall((2025, 3, 3), (16, 0, 0), 0, 0), Some(T));
}

#[test]
fn a_summary_parted_between_its_fields_gets_its_comma_back_and_one_cut_inside_a_field_does_not() {
    let mut t = String::from("oom-kill:constraint=CONSTRAINT_MEMCG");
    rejoin(&mut t, "task=java,pid=90057,uid=0", false);
    assert_eq!(
        t,
        "oom-kill:constraint=CONSTRAINT_MEMCG,task=java,pid=90057,uid=0"
    );
    let mut t = String::from("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),ta");
    rejoin(&mut t, "sk=java,pid=90057,uid=0", false);
    assert!(t.ends_with(",task=java,pid=90057,uid=0"), "{t}");
    // Bare text after a host's syslog line is that host's.
    let log = "2026-03-22T15:00:03 mini-might kernel: oom-kill:constraint=CONSTRAINT_MEMCG\n\
               task=java,pid=90057,uid=0\n\
               Memory cgroup out of memory: Killed process 90057 (java)\n\
               total-vm:2007864kB, anon-rss:518828kB\n";
    let r = read_reports(log.as_bytes(), 2026).unwrap();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].host.as_deref(), Some("mini-might"));
    let s = r[0].report.summary.as_ref().expect("the summary, rejoined");
    assert_eq!((s.pid, s.uid), (90057, Some(0)));
    assert_eq!(r[0].report.killed.anon_rss_kb, Some(518_828));
}

/// A mark where the writer left lines out (tests/fixtures/real-logs/hz-06:
/// `> >[...]` after a quoted `Task in ... limit of /1066`) is no tail of
/// the line before; the kernel's words are.
#[test]
fn a_mark_of_left_out_lines_is_no_wrapped_tail() {
    for mark in ["[...]", "> >[...]", "...", "<snip>", "[snip]", "…"] {
        assert_eq!(tail(mark), None, "{mark}");
    }
    assert_eq!(tail(" file-rss:1088kB"), Some("file-rss:1088kB"));
}
