//! End-to-end tests: real OOM kills in memory cgroups these tests make,
//! recorded by the real `tracer record` with real eBPF programs.
//! Run as root through `cargo xtask test`; in CI they fail if they cannot run.

use std::{
    fs,
    process::Command,
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use serde_json::Value;
use tracer_e2e::{
    Proc, Recorder, Scenario, TestCgroup, explain_json, tracer, tracer_json, wait_for,
};

const MIB: u64 = 1 << 20;

fn memhog(cg: &TestCgroup, step_mib: u64, interval_ms: u64, max_mib: Option<u64>) -> Proc {
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args([
        "--step-mib",
        &step_mib.to_string(),
        "--interval-ms",
        &interval_ms.to_string(),
    ]);
    if let Some(m) = max_mib {
        cmd.args(["--max-mib", &m.to_string()]);
    }
    Proc::spawn(cmd)
}

/// `tracer explain --log - ARGS` with `log` on its standard input.
fn explain_stdin(log: &str, args: &[&str]) -> std::process::Output {
    use std::io::Write as _;
    let mut child = Command::new(tracer_e2e::tracer_bin())
        .args(["explain", "--log", "-"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tracer explain --log -");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(log.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `explain --pid` JSON once the kill is recorded and joined with the
/// kernel's report (or after `timeout`, whatever is there).
fn explain_pid(store: &std::path::Path, pid: u32, want_kmsg: bool) -> Value {
    let (store, pid) = (store.to_str().expect("utf-8 path"), pid.to_string());
    explain_json(&["--store", store, "--pid", &pid], |v| {
        !want_kmsg
            || v["kill"]["source"]
                .as_str()
                .is_some_and(|s| s.contains("kmsg"))
    })
}

#[test]
fn reclaim_in_the_cgroup_before_a_kill_is_counted() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cache = sc.dir.path().join("cache.bin");
    let cg = TestCgroup::new("reclaim", 64 * MIB);
    let rec = Recorder::on(&store).start();
    // 40 MiB of page cache charged to the cgroup, then anonymous growth:
    // the kernel reclaims the cache (direct reclaim scans in this cgroup)
    // for a second or so before it has to kill.
    let mut cmd = cg.command("/bin/sh");
    cmd.args([
        "-c",
        &format!(
            "dd if=/dev/zero of={} bs=1M count=40 status=none && exec {} --step-mib 2 --interval-ms 100",
            cache.display(),
            env!("CARGO_BIN_EXE_memhog")
        ),
    ]);
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    let v = explain_pid(&store, pid, true);
    let scanned: Vec<u64> = v["kill"]["leadup"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["reclaim_scanned"].as_u64())
        .collect();
    // Counted in the kernel at each batch of reclaim, for the memory cgroup
    // of the task that reclaims (the hog, at its cgroup's limit), keyed by
    // the cgroup's id: found for this cgroup's samples.
    assert!(
        scanned.iter().any(|&n| n > 0),
        "no reclaim scans in the lead-up: {:#}",
        v["kill"]["leadup"]
    );
    rec.stop();
}

#[test]
fn memcg_oom_kill_is_recorded_and_explained() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("oom", 64 * MIB);
    let rec = Recorder::on(&store).start();
    // Grow 2 MiB every 100 ms: over 3 s to the limit, so the lead-up has samples.
    let mut hog = memhog(&cg, 2, 100, None);
    let pid = hog.pid();
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL),
        "memhog must be OOM killed"
    );
    assert_eq!(cg.oom_kills(), 1);

    let v = explain_pid(&store, pid, true);
    let k = &v["kill"];
    assert_eq!(k["victim"]["pid"], pid);
    assert_eq!(k["victim"]["comm"], "memhog");
    assert_eq!(k["victim"]["memcg"], cg.path.as_str());
    assert_eq!(k["killer"]["kind"], "kernel_oom");
    assert_eq!(k["killer"]["constraint"], "memcg");
    assert_eq!(k["memcg"]["path"], cg.path.as_str());
    assert_eq!(k["memcg"]["limit_bytes"], 64 * MIB);
    assert_eq!(k["memcg"]["source"], "kmsg");
    let usage = k["memcg"]["usage_bytes"].as_u64().unwrap();
    assert!(
        usage > 60 * MIB && usage <= 64 * MIB,
        "usage at the kill {usage}"
    );
    let anon = k["victim"]["memory"]["anon_rss_kb"].as_u64().unwrap();
    assert!(
        (40 * 1024..=64 * 1024).contains(&anon),
        "victim anon RSS {anon} kB"
    );
    assert_eq!(k["victim"]["memory"]["source"], "tracepoint");
    assert!(k["source"].as_str().unwrap().starts_with("tracepoint"));
    let leadup: Vec<u64> = k["leadup"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["usage_bytes"].as_u64().unwrap())
        .collect();
    assert!(leadup.len() >= 2, "lead-up samples: {leadup:?}");
    assert!(
        leadup.windows(2).all(|w| w[0] <= w[1]),
        "usage grew towards the kill: {leadup:?}"
    );
    let tasks = k["tasks"].as_array().unwrap();
    assert!(tasks.iter().any(|t| t["pid"] == pid && t["victim"] == true));
    assert_eq!(v["verdict"]["cause"], "own_growth");
    assert!(
        k["gaps"].as_array().unwrap().is_empty(),
        "nothing unknown: {}",
        k["gaps"]
    );

    // The default text report names the same facts.
    let out = tracer(&["explain", "--store", store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains(&format!(
            "memhog (pid {pid}) killed by the kernel OOM killer"
        )),
        "{text}"
    );
    assert!(text.contains("usage 64.0 MiB of limit 64.0 MiB"), "{text}");
    assert!(
        text.contains("verdict    the victim's own growth"),
        "{text}"
    );

    // The kill is the recorder's; the tracepoint event is in the events table.
    let events = tracer(&[
        "events",
        "--store",
        store.to_str().unwrap(),
        "--kind",
        "oom_victim",
        "--pid",
        &pid.to_string(),
    ]);
    let line = String::from_utf8_lossy(&events.stdout);
    let ev: Value =
        serde_json::from_str(line.lines().next().expect("one oom_victim event")).unwrap();
    assert_eq!(ev["victim_pid"], pid);
    // Its exit says how it ended (task_struct.exit_code, read at the exit).
    let ended = wait_for(Duration::from_secs(5), || {
        let out = tracer(&[
            "events",
            "--store",
            store.to_str().unwrap(),
            "--kind",
            "exit",
            "--pid",
            &pid.to_string(),
        ]);
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()?
            .to_string();
        serde_json::from_str::<Value>(&line).ok()
    });
    assert_eq!(
        ended.as_ref().map(|e| &e["exit"]),
        Some(&Value::from("killed by SIGKILL")),
        "{ended:?}"
    );
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "{log}");
}

#[test]
fn noisy_neighbour_lists_both_and_blames_the_grower() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("neighbour", 96 * MIB);
    let rec = Recorder::on(&store).start();
    let mut small = memhog(&cg, 8, 10, Some(16));
    small.wait_line("held 16 MiB");
    let mut big = memhog(&cg, 4, 100, None);
    assert_eq!(
        big.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    assert!(
        small.child.try_wait().unwrap().is_none(),
        "the small neighbour survives"
    );

    let v = explain_pid(&store, big.pid(), true);
    let tasks = v["kill"]["tasks"].as_array().unwrap();
    let find = |pid: u32| {
        tasks
            .iter()
            .find(|t| t["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} in {tasks:?}"))
    };
    let big_rss = find(big.pid())["rss_kb"].as_u64().unwrap();
    let small_rss = find(small.pid())["rss_kb"].as_u64().unwrap();
    assert!(
        (14 * 1024..=24 * 1024).contains(&small_rss),
        "small RSS {small_rss} kB"
    );
    assert!(
        big_rss > 3 * small_rss,
        "big {big_rss} kB vs small {small_rss} kB"
    );
    assert_eq!(find(big.pid())["victim"], true);
    assert_eq!(find(small.pid())["victim"], false);
    assert_eq!(v["verdict"]["cause"], "own_growth", "{}", v["verdict"]);
    let text =
        String::from_utf8_lossy(&tracer(&["explain", "--store", store.to_str().unwrap()]).stdout)
            .to_string();
    assert!(
        text.contains(&small.pid().to_string()) && text.contains("<- victim"),
        "{text}"
    );
    drop(rec);
}

/// The kernel's own choice of a small victim over the big grower beside
/// it (its oom_score_adj is 1000, the grower's 0): the verdict says so,
/// names the grower by its command line and place, shows that the
/// allocation that hit the limit was the grower's, and where it grew.
#[test]
fn a_small_victim_chosen_for_its_oom_score_adj_names_the_grower() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("adj", 96 * MIB);
    let rec = Recorder::on(&store)
        .args(&["--growth-cgroup", &cg.path])
        .start();
    let mut small = memhog(&cg, 8, 10, Some(16));
    small.wait_line("held 16 MiB");
    fs::write(format!("/proc/{}/oom_score_adj", small.pid()), "1000").unwrap();
    let mut big = memhog(&cg, 4, 50, Some(88));
    assert_eq!(
        small.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL),
        "the kernel chose the small task with oom_score_adj 1000"
    );
    let v = explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &small.pid().to_string(),
        ],
        |v| {
            v["verdict"]["cause"] == "neighbour"
                && v["kill"]["tipping_stack"].is_object()
                && v["kill"]["neighbour_growth"]["pid"] == big.pid()
                // Named by the model, at the kill or (where the kernel's
                // report came first) a tick later.
                && v["kill"]["tasks"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["pid"] == big.pid() && t["cmdline"].is_string()))
        },
    );
    let said = v["verdict"]["summary"].as_str().unwrap();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("verdict: {said}");
    }
    assert!(
        said.contains(&format!("memhog (pid {}, `", big.pid()))
            && said.contains(&format!("in {}", cg.path))
            && said.contains("its oom_score_adj (1000) is higher than memhog's (0)")
            // Where a debug build's page write faults: memhog::main, or
            // the slice indexing it calls (not inlined) first.
            && said
                .split_once("the allocation that hit the limit was the neighbour's: ")
                .is_some_and(|(_, chain)| chain.contains("memhog::main")),
        "{said}"
    );
    // The grower's growth, not only the victim's: most of its 88 MiB came
    // in the minute before the kill, from memhog's own code.
    let grown = &v["kill"]["neighbour_growth"];
    assert!(grown["bytes"].as_u64().unwrap() >= 40 * MIB, "{grown}");
    assert!(
        grown["sites"][0]["frames"].to_string().contains("memhog"),
        "{grown}"
    );
    let text = String::from_utf8_lossy(
        &tracer(&[
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &small.pid().to_string(),
        ])
        .stdout,
    )
    .to_string();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    assert!(
        text.contains(&format!("  neighbour  memhog (pid {}): ", big.pid())),
        "{text}"
    );
    let _ = big.child.kill();
    drop(rec);
}

#[test]
fn explain_kmsg_finds_a_kill_without_any_store() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let cg = TestCgroup::new("kmsg", 48 * MIB);
    let mut hog = memhog(&cg, 8, 20, None);
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    let pid = hog.pid().to_string();
    let v = wait_for(Duration::from_secs(5), || {
        let out = tracer(&[
            "explain",
            "--kmsg",
            "--pid",
            &pid,
            "--format",
            "json",
            "--store",
            "/nonexistent/x.db",
        ]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
    })
    .expect("the kill is in the kernel log");
    let k = &v["kill"];
    assert_eq!(k["victim"]["comm"], "memhog");
    assert_eq!(k["source"], "kmsg");
    assert_eq!(k["killer"]["constraint"], "memcg");
    assert_eq!(k["memcg"]["limit_bytes"], 48 * MIB);
    assert_eq!(k["victim"]["memcg"], cg.path.as_str());
    assert!(k["victim"]["memory"]["anon_rss_kb"].as_u64().unwrap() > 20 * 1024);
}

/// A SIGKILL a BPF program sent (bpftrace's `signal()`: the kernel's
/// `bpf_send_signal`, in the victim's own context, as BPF-LSM enforcement
/// does) is a kill of its own, named as such: not `kill(2)`, not the OOM
/// killer. Its sender and target are the victim, its code SI_KERNEL, and
/// no `mark_victim` claims it. A memcg OOM kill whose victim set it off
/// (the same shape of SIGKILL) stays one kernel kill, not two.
#[test]
fn a_sigkill_from_a_bpf_program_is_named_as_such() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(bpftrace) = ["/usr/bin/bpftrace", "/usr/sbin/bpftrace"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "bpftrace missing: cargo xtask setup installs it"
        );
        eprintln!("skipped: no bpftrace (cargo xtask setup)");
        return;
    };
    let store = sc.store.clone();
    let rec = Recorder::on(&store).start();
    // The victim makes a system call every 100 ms; the BPF program kills
    // it from its own syscall entry.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "while :; do sleep 0.1; done"]);
    // Its pid may have been an earlier process's whose kill the recorder
    // read from the kernel log at its start: this kill is after this.
    let started_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let mut victim = Proc::spawn(cmd);
    let pid = victim.pid();
    let out = Command::new(bpftrace)
        .args([
            "--unsafe",
            "-e",
            &format!("tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{ signal(\"SIGKILL\"); exit(); }}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        victim.wait_signal(Duration::from_secs(10)),
        Some(libc::SIGKILL)
    );
    let v = explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &pid.to_string(),
        ],
        |v| v["kill"]["ts_ns"].as_i64().is_some_and(|t| t >= started_ns),
    );
    let k = &v["kill"];
    assert_eq!(k["killer"]["kind"], "userspace", "{v:#}");
    assert_eq!(k["killer"]["sender"]["pid"], pid, "{v:#}");
    assert_eq!(k["killer"]["signal_code"], 0x80, "{v:#}");
    assert_eq!(k["victim"]["comm"], "sh", "{v:#}");
    let verdict = v["verdict"]["summary"].as_str().unwrap();
    assert!(verdict.starts_with("killed by a BPF program"), "{verdict}");
    // Its memory, from its exit while the kill waited (kernels whose exit
    // tracepoint fires before exit_mm(): those with `group_dead`).
    let exit_rss = fs::read_to_string("/sys/kernel/tracing/events/sched/sched_process_exit/format")
        .is_ok_and(|f| f.contains("group_dead"));
    if exit_rss {
        assert!(
            matches!(
                k["victim"]["memory"]["source"].as_str(),
                Some("exit" | "proc")
            ),
            "{v:#}"
        );
    }

    // A memcg OOM kill of the task that set it off: one kill, the kernel's.
    let cg = TestCgroup::new("selfkill-oom", 32 * MIB);
    let oom = tracer_e2e::oom_killed(
        &cg,
        std::path::Path::new(env!("CARGO_BIN_EXE_memhog")),
        8,
        20,
    )
    .pid();
    std::thread::sleep(Duration::from_millis(2500));
    rec.stop();
    let all = tracer_e2e::explain_all(&store);
    // Its pid in its cgroup: CI forks past pid_max (32768 here), and the
    // kernel log the recorder reads at start can hold a kill of an earlier
    // holder of the same pid, in another test's cgroup.
    let of_oom: Vec<&Value> = all
        .iter()
        .filter(|e| {
            e["kill"]["victim"]["pid"] == oom
                && (e["kill"]["victim"]["memcg"] == cg.path.as_str()
                    || e["kill"]["memcg"]["path"] == cg.path.as_str())
        })
        .collect();
    assert_eq!(of_oom.len(), 1, "{of_oom:#?}");
    assert_eq!(of_oom[0]["kill"]["killer"]["kind"], "kernel_oom");
}

#[test]
fn sigkill_from_another_process_names_the_sender() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = Recorder::on(&store).start();
    let mut cmd = Command::new("sleep");
    cmd.arg("600");
    let mut victim = Proc::spawn(cmd);
    std::thread::sleep(Duration::from_millis(300));
    let killer = Command::new("kill")
        .args(["-9", &victim.pid().to_string()])
        .spawn()
        .unwrap();
    let killer_pid = killer.id();
    assert!(killer.wait_with_output().unwrap().status.success());
    assert_eq!(
        victim.wait_signal(Duration::from_secs(5)),
        Some(libc::SIGKILL)
    );

    // The victim's memory comes with the record (from /proc, if it was
    // still there), or from its exit just after (the kill is stored first)
    // where the exit tracepoint fires before exit_mm(): kernels whose
    // format has `group_dead` (6.x), as this machine's 6.18. Elsewhere
    // (5.10) it may be said unknown, never made up.
    let exit_rss = fs::read_to_string("/sys/kernel/tracing/events/sched/sched_process_exit/format")
        .or_else(|_| {
            fs::read_to_string("/sys/kernel/debug/tracing/events/sched/sched_process_exit/format")
        })
        .is_ok_and(|f| f.contains("group_dead"));
    let unknown = |v: &Value| {
        v["kill"]["gaps"].as_array().is_some_and(|g| {
            g.iter()
                .any(|g| g.as_str().is_some_and(|g| g.contains("memory is unknown")))
        })
    };
    let v = explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &victim.pid().to_string(),
        ],
        // The command line may come a moment after the kill's commit: the
        // victim's exec is read after the kill (see the next test).
        |v| {
            (v["kill"]["victim"]["memory"]["source"].is_string() || (!exit_rss && unknown(v)))
                && v["kill"]["victim"]["cmdline"].is_string()
        },
    );
    let k = &v["kill"];
    assert_eq!(k["killer"]["kind"], "userspace");
    assert_eq!(k["killer"]["sender"]["pid"], killer_pid);
    assert_eq!(k["killer"]["sender"]["comm"], "kill");
    assert_eq!(k["victim"]["comm"], "sleep");
    assert_eq!(k["victim"]["cmdline"], "sleep 600");
    assert_eq!(v["verdict"]["cause"], "userspace_kill");
    // The victim's memory: read from /proc if it was still there, else the
    // kernel's counters at its exit.
    let mem = &k["victim"]["memory"];
    if mem["source"].is_null() {
        assert!(!exit_rss && unknown(&v), "{v:#}");
        assert!(
            mem["file_rss_kb"].is_null() && mem["anon_rss_kb"].is_null(),
            "{mem}"
        );
    } else {
        assert!(
            matches!(mem["source"].as_str(), Some("proc" | "exit")),
            "{mem}"
        );
        assert!(mem["file_rss_kb"].as_u64().unwrap() > 0, "{mem}");
    }
    drop(rec);
}

/// Programs OOM-killed within milliseconds of their exec, each in a
/// memory cgroup made a moment before it: every record has the program's
/// whole command line (read at exec by the kernel event, not from /proc,
/// which is gone or not yet read) and its own cgroup.
#[test]
fn programs_killed_just_after_exec_keep_their_command_line_and_cgroup() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let rec = Recorder::on(&store).start();
    let bin = env!("CARGO_BIN_EXE_memhog");
    let mut killed = Vec::new();
    for i in 0..20u64 {
        // A fresh cgroup for every other program, 0.2 s before it starts.
        let cg = TestCgroup::new(&format!("fresh{}", i / 2), 16 * MIB);
        std::thread::sleep(Duration::from_millis(200));
        let mut cmd = cg.command(bin);
        let max = (100 + i).to_string();
        cmd.args(["--step-mib", "64", "--interval-ms", "1", "--max-mib", &max]);
        let t0 = Instant::now();
        let mut hog = Proc::spawn(cmd);
        assert_eq!(
            hog.wait_signal(Duration::from_secs(30)),
            Some(libc::SIGKILL)
        );
        let lived = t0.elapsed();
        let want = format!("{bin} --step-mib 64 --interval-ms 1 --max-mib {max}");
        killed.push((hog.pid(), want, cg.path.clone(), lived, cg));
    }
    for (pid, want, path, lived, _cg) in &killed {
        // The record is committed at once; where the program's exec was
        // read after its kill, its command line follows a moment later.
        let pid_s = pid.to_string();
        let args = ["--store", store_s, "--pid", &pid_s];
        let kill = || explain_json(&args, |v| v["kill"].is_object());
        let v = wait_for(Duration::from_secs(15), || {
            let v = kill();
            v["kill"]["victim"]["cmdline"].is_string().then_some(v)
        })
        .unwrap_or_else(kill);
        let k = &v["kill"];
        assert_eq!(k["killer"]["kind"], "kernel_oom", "{v:#}");
        let events = || {
            let out = tracer(&["events", "--store", store_s, "--pid", &pid.to_string()]);
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(
            k["victim"]["cmdline"],
            want.as_str(),
            "pid {pid}, seen dead {lived:?} after it started: {k:#}\nits events: {}",
            events()
        );
        assert_eq!(k["victim"]["memcg"], path.as_str(), "pid {pid}");
    }
    // The exec events carry the command line themselves (the kernel's
    // copy of the arguments, not /proc's).
    let (pid, want, ..) = &killed[0];
    let ev = tracer(&[
        "events",
        "--store",
        store_s,
        "--kind",
        "exec",
        "--pid",
        &pid.to_string(),
    ]);
    let ev = String::from_utf8_lossy(&ev.stdout);
    let ev: Value = serde_json::from_str(ev.lines().next().unwrap_or("null")).unwrap();
    assert_eq!(ev["cmdline"], want.as_str(), "{ev}");
    let lived: Vec<Duration> = killed.iter().map(|k| k.3).collect();
    eprintln!("seen dead after {lived:?}");
    drop(rec);
}

/// A pid the kernel hands out again (as after a pid space wraps): a
/// program started under the pid of one that ended, and killed at once,
/// is never recorded nor exported under the ended one's command line or
/// cgroup, even when the kill is read before the new program's fork and
/// exec events (the kill's ring is served first).
#[test]
fn a_reused_pid_is_never_recorded_under_its_earlier_holder() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let jsonl = sc.dir.path().join("kills.jsonl");
    let rec = Recorder::on(&store)
        .args(&["--export-jsonl", jsonl.to_str().unwrap()])
        .start();
    let old_cg = TestCgroup::new("reuse-old", 64 * MIB);
    let new_cg = TestCgroup::new("reuse-new", 16 * MIB);
    let t0 = Instant::now();
    let mut reused = Vec::new();
    for i in 0..8 {
        // The earlier holder: known to the model (fork, exec, /proc), ended.
        let old_cmdline = format!("sleep 1.{i}");
        let mut cmd = old_cg.command("sleep");
        cmd.arg(format!("1.{i}"));
        let mut old = Proc::spawn(cmd);
        let pid = old.pid();
        let old_ticks = start_ticks(pid);
        assert_eq!(old.wait_signal(Duration::from_secs(10)), None);
        drop(old); // reaped: its pid is free
        std::thread::sleep(Duration::from_millis(500));
        // Its successor under the same pid, which SIGKILLs itself a moment
        // after its exec: the kill (woken at once) is read before its fork
        // and exec (read lazily), while the model still has the ended one.
        let tag = format!("reuse-{i}");
        let argv = ["/bin/sh", "-c", "kill -9 $$", &tag];
        let got = new_cg
            .spawn_as_pid(pid, &argv)
            .unwrap_or_else(|e| panic!("clone3 with set_tid {pid}: {e}"));
        assert_eq!(got, pid);
        assert_eq!(
            tracer_e2e::wait_pid(pid, Duration::from_secs(30)),
            Some(libc::SIGKILL)
        );
        reused.push((pid, argv.join(" "), old_cmdline, old_ticks));
    }
    let mut without_line = 0;
    for (pid, want, old, old_ticks) in &reused {
        // The kernel's starts, as the events carry them: the kill's target
        // is the program exec'd under the reused pid, not the earlier one,
        // whose start /proc gave (in clock ticks) while it ran.
        let events = |kind: &str| -> Vec<Value> {
            let out = tracer(&[
                "events",
                "--store",
                store_s,
                "--kind",
                kind,
                "--pid",
                &pid.to_string(),
            ]);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        };
        let kill = wait_for(Duration::from_secs(10), || {
            events("signal_kill").into_iter().next()
        })
        .unwrap_or_else(|| panic!("no signal_kill event of pid {pid}"));
        let target_start = kill["target_start_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("the kill carries no start: {kill}"));
        let execs = wait_for(Duration::from_secs(10), || {
            let e = events("exec");
            (e.len() >= 2).then_some(e)
        })
        .unwrap_or_else(|| panic!("pid {pid}: not two execs: {:?}", events("exec")));
        let start_of = |needle: &str| {
            execs
                .iter()
                .find(|e| e["cmdline"].as_str().is_some_and(|c| c.contains(needle)))
                .and_then(|e| e["start_ns"].as_u64())
                .unwrap_or_else(|| panic!("pid {pid}: no start for {needle}: {execs:?}"))
        };
        assert_eq!(start_of("reuse-"), target_start, "pid {pid}");
        let old_start = start_of("sleep");
        assert!(
            old_start < target_start,
            "pid {pid}: {old_start} {target_start}"
        );
        assert_eq!(
            old_start / tick_ns(),
            *old_ticks,
            "pid {pid}: the kernel's start is /proc's"
        );
        // Only this test's kills (not an earlier one's of the same pid in
        // the kernel log), however slowly it runs (a guest under
        // emulation), and for as long as explain_json asks again: a window
        // that slid past the kill while it waited would hide the answer
        // that was not complete behind "no kill".
        let asked = std::time::Instant::now();
        let window = t0.elapsed() + tracer_e2e::scaled(Duration::from_secs(15));
        let since = format!("{}s", window.as_secs() + 120);
        let v = explain_json(
            &[
                "--store",
                store_s,
                "--pid",
                &pid.to_string(),
                "--since",
                &since,
            ],
            |v| {
                let line = &v["kill"]["victim"]["cmdline"];
                line.as_str().is_some_and(|c| c.contains("reuse-"))
                    // No line at all (its exec came after the kill and did
                    // not complete it: seen under emulation on 5.10, not
                    // on the host; a known gap, said in its own count
                    // below) is taken once the correction had its time.
                    || (line.is_null() && asked.elapsed() > tracer_e2e::scaled(Duration::from_secs(10)))
            },
        );
        let victim = &v["kill"]["victim"];
        if victim["cmdline"].is_null() {
            eprintln!("pid {pid}: the kill kept no command line: {v:#}");
            without_line += 1;
        } else {
            assert_eq!(victim["cmdline"], want.as_str(), "pid {pid}: {v:#}");
        }
        assert_eq!(victim["memcg"], new_cg.path.as_str(), "pid {pid}");
        // Not even for a moment: what was exported as it was first stored.
        let lines = fs::read_to_string(&jsonl).unwrap();
        for l in lines.lines() {
            let e: Value = serde_json::from_str(l).unwrap();
            let k = &e["record"];
            if k["victim"]["pid"] == *pid {
                assert_ne!(
                    k["victim"]["cmdline"],
                    old.as_str(),
                    "pid {pid} exported as its earlier holder: {l}"
                );
                assert_ne!(k["victim"]["memcg"], old_cg.path.as_str(), "pid {pid}: {l}");
            }
        }
    }
    // The late exec's correction still works for most: a kill that keeps
    // no line now and then is the gap above, not the rule.
    assert!(
        without_line * 2 < reused.len(),
        "{without_line} of {} kills kept no command line",
        reused.len()
    );
    drop(rec);
}

#[test]
fn stored_kills_are_exported_as_json_lines_with_their_store_id() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let out = sc.dir.path().join("kills.jsonl");
    let rec = Recorder::on(&store)
        .args(&["--export-jsonl", out.to_str().unwrap()])
        .start();
    let mut victim = Proc::spawn({
        let mut c = Command::new("sleep");
        c.arg("600");
        c
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain syscall on this test's own child.
    unsafe { libc::kill(victim.pid() as i32, libc::SIGKILL) };
    assert_eq!(
        victim.wait_signal(Duration::from_secs(5)),
        Some(libc::SIGKILL)
    );
    let v = explain_pid(&store, victim.pid(), false);
    let line = wait_for(Duration::from_secs(5), || {
        fs::read_to_string(&out).ok()?.lines().find_map(|l| {
            let j: Value = serde_json::from_str(l).ok()?;
            // Not a kernel-log kill of an earlier holder of the pid.
            (j["record"]["victim"]["pid"] == victim.pid() && j["record"]["source"] != "kmsg")
                .then_some(j)
        })
    })
    .expect("the kill was exported");
    let summary = rec.stop_summary();
    assert_eq!(line["type"], "kill");
    assert_eq!(line["id"], v["id"], "the store's row id");
    assert_eq!(line["record"]["killer"]["kind"], "userspace");
    assert_eq!(summary["summary"]["export_drops"][0][0], "jsonl");
    assert_eq!(summary["summary"]["export_drops"][0][1], 0);
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(fs::metadata(&out).unwrap().mode() & 0o777, 0o600);
}

#[test]
fn history_survives_restart_and_a_crashed_recorder() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let cg = TestCgroup::new("restart", 48 * MIB);

    let rec = Recorder::on(&store).start();
    let mut first = memhog(&cg, 8, 20, None);
    assert_eq!(
        first.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    explain_pid(&store, first.pid(), true);
    rec.stop();

    // A new recorder on the same store: reading the kernel log again must
    // not duplicate the kill it already has.
    let rec = Recorder::on(&store).start();
    let mut second = memhog(&cg, 8, 20, None);
    assert_eq!(
        second.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    explain_pid(&store, second.pid(), false);
    std::thread::sleep(Duration::from_secs(3));
    rec.crash();

    let all = tracer_json(&["explain", "--store", store_s, "--all", "--format", "json"]);
    // Only this test's cgroup: the kernel log replayed at the first start
    // holds earlier tests' kills, and after the pid space wraps one of them
    // can carry the same pid as a memhog here.
    let pids: Vec<u64> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kill"]["victim"]["memcg"] == cg.path.as_str())
        .map(|e| e["kill"]["victim"]["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        pids.iter()
            .filter(|&&p| p == u64::from(first.pid()))
            .count(),
        1,
        "{pids:?}"
    );
    assert_eq!(
        pids.iter()
            .filter(|&&p| p == u64::from(second.pid()))
            .count(),
        1,
        "{pids:?}"
    );
    // The crashed session is not a clean end, and the store still opens read-write.
    let conn = rusqlite::Connection::open(&store).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let open: i64 = conn
        .query_row(
            "SELECT count(*) FROM sessions WHERE ended_ns IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(open, 1);
}

#[test]
fn bad_input_gives_clear_errors() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;

    // Not root: a clear message naming what is missing.
    let out = Command::new(tracer_e2e::tracer_bin())
        .args([
            "record",
            "--store",
            dir.path().join("n.db").to_str().unwrap(),
        ])
        .env("TRACER_LOG", "error")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs root") && err.contains("CAP_BPF"),
        "{err}"
    );

    // A corrupt store: refused, left untouched.
    let garbage = dir.path().join("garbage.db");
    fs::write(&garbage, vec![0xa5u8; 16384]).unwrap();
    for cmd in [
        &["explain", "--store"][..],
        &["record", "--store"][..],
        &["events", "--store"][..],
    ] {
        let mut args = cmd.to_vec();
        args.push(garbage.to_str().unwrap());
        let out = tracer(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("corrupt") && err.contains("left untouched"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(fs::read(&garbage).unwrap(), vec![0xa5u8; 16384]);

    // An unwritable store location.
    let file = dir.path().join("plain-file");
    fs::write(&file, b"x").unwrap();
    let out = tracer(&["record", "--store", file.join("t.db").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not writable"), "{err}");

    // A store that does not exist, and an unknown pid in one that does.
    let out = tracer(&[
        "explain",
        "--store",
        dir.path().join("none.db").to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no store at"),
        "{out:?}"
    );
    let store = dir.path().join("t.db");
    let rec = Recorder::on(&store).start();

    // Garbage in the kernel log neither crashes the recorder nor makes a kill.
    let t0 = Instant::now();
    fs::write(
        "/dev/kmsg",
        "tracer-e2e: Memory cgroup out of memory: Killed process notapid (x\n",
    )
    .unwrap();
    fs::write("/dev/kmsg", "tracer-e2e: oom-kill:constraint=,pid=,uid=\n").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "recorder survived: {log}");
    let all = tracer_json(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--all",
        "--since",
        &format!("{}s", t0.elapsed().as_secs() + 1),
        "--format",
        "json",
    ]);
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .all(|e| e["kill"]["victim"]["comm"] != "x"),
        "{all}"
    );

    let out = tracer(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--pid",
        "999999999",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no kill of pid 999999999"));
    let out = tracer(&["explain", "--pid", "abc"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects a non-numeric pid");
}

/// A real memcg OOM kill, read back from a saved kernel log in the shapes
/// people paste: `dmesg`, `dmesg -T`, and syslog lines of the kind
/// kern.log and `journalctl -k` write (made from the kernel's own lines).
#[test]
fn explain_reads_saved_kernel_logs() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let cg = TestCgroup::new("savedlog", 48 * 1024 * 1024);
    let hog = tracer_e2e::oom_killed(
        &cg,
        std::path::Path::new(env!("CARGO_BIN_EXE_memhog")),
        8,
        20,
    );
    let pid = hog.pid();
    let dmesg = |args: &[&str]| {
        let out = Command::new("dmesg").args(args).output().expect("dmesg");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let explain_log = |log: &str, extra: &[&str]| {
        let mut args = vec!["--pid".to_string(), pid.to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        explain_stdin(log, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let json = |log: &str| -> Value {
        let out = explain_log(log, &["--format", "json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    // dmesg: seconds since boot only: no wall time is made up.
    let plain = dmesg(&[]);
    let v = json(&plain);
    assert_eq!(v["kill"]["victim"]["pid"], pid);
    assert_eq!(v["kill"]["memcg"]["path"], cg.path.as_str(), "{v:#}");
    let text = String::from_utf8_lossy(&explain_log(&plain, &[]).stdout).into_owned();
    assert!(
        text.contains("s after boot]") && text.contains("wall time of this kill is not known"),
        "{text}"
    );
    // dmesg -T: the wall time, to the second.
    let v = json(&dmesg(&["-T"]));
    let ts = v["kill"]["ts_ns"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!((now - ts).abs() < 120_000_000_000, "{ts} vs now {now}");
    // syslog (kern.log / journalctl -k short-iso) from the same lines.
    let iso: String = dmesg(&["--time-format", "iso"])
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(stamp, text)| format!("{stamp} node-7 kernel: {text}\n"))
        .collect();
    let v = json(&iso);
    assert_eq!(v["kill"]["victim"]["pid"], pid);
    let ts2 = v["kill"]["ts_ns"].as_i64().unwrap();
    assert!((ts2 - ts).abs() < 2_000_000_000, "{ts2} vs {ts}");
    assert!(
        v["kill"]["gaps"]
            .to_string()
            .contains("logged by host node-7"),
        "{v:#}"
    );
}

/// A live `memory.oom.group` kill: cgroup v2 only (v1 has no such file;
/// there the saved-log test below stands for it, and this one says it did
/// not run). It runs in the v2 guest of `cargo xtask vm-test`. Every task
/// of the group is killed as one incident, and each recorded kill says so.
#[test]
fn v2_only_a_live_memory_oom_group_kill_is_recorded_as_one_incident() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    if tracer_e2e::memory_root().1 {
        eprintln!("not run: memory.oom.group is cgroup v2 only, and memory is on v1 here");
        return;
    }
    let store = sc.store.clone();
    let cg = TestCgroup::new("oomgroup", 64 * MIB);
    fs::write(cg.dir().join("memory.oom.group"), "1").expect("memory.oom.group");
    let _rec = Recorder::on(&store).start();
    let mut holder = memhog(&cg, 4, 10, Some(8));
    holder.wait_line("held 8 MiB");
    let mut grower = memhog(&cg, 2, 50, None);
    for p in [&mut grower, &mut holder] {
        assert_eq!(
            p.wait_signal(Duration::from_secs(30)),
            Some(libc::SIGKILL),
            "every task of the group is killed"
        );
    }
    let pids = [grower.pid(), holder.pid()];
    let store_s = store.to_str().expect("utf-8 path");
    for pid in pids {
        // Each kill's record (with its kernel report), once the other's is
        // stored too: the second kill of the incident may be committed a
        // moment after the first is readable (a slow guest).
        let v = explain_json(&["--store", store_s, "--pid", &pid.to_string()], |v| {
            v["kill"]["source"]
                .as_str()
                .is_some_and(|s| s.contains("kmsg"))
                && v["incident"]
                    .as_array()
                    .is_some_and(|i| i.len() == pids.len())
        });
        let k = &v["kill"];
        assert_eq!(k["victim"]["pid"], pid, "{v:#}");
        assert_eq!(k["oom_group"], cg.path.as_str(), "{v:#}");
        let mut incident: Vec<u64> = v["incident"]
            .as_array()
            .unwrap_or_else(|| panic!("no incident: {v:#}"))
            .iter()
            .filter_map(|k| k["pid"].as_u64())
            .collect();
        incident.sort_unstable();
        let mut want = pids.map(u64::from).to_vec();
        want.sort_unstable();
        assert_eq!(incident, want, "{v:#}");
    }
}

/// A `memory.oom.group` kill (cgroup v2 only, so from a saved log on this
/// v1 machine), as the kernel prints it: `explain --log` says every kill
/// of the incident belongs to it, and says so in the verdict.
#[test]
fn a_memory_oom_group_kill_is_explained_as_one_incident() {
    let log = "\
[ 5120.100000] stress invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[ 5120.100010] CPU: 1 UID: 0 PID: 4205 Comm: stress Not tainted 6.8.0-49-generic #49-Ubuntu
[ 5120.100100] memory: usage 102400kB, limit 102400kB, failcnt 0
[ 5120.100101] swap: usage 0kB, limit 0kB, failcnt 0
[ 5120.100102] Memory cgroup stats for /system.slice/job.service:
[ 5120.100103] anon 103809024
[ 5120.100104] file 0
[ 5120.100200] Tasks state (memory values in pages):
[ 5120.100201] [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name
[ 5120.100202] [   4201]     0  4201     1000      225       50      175         0    45056        0             0 sh
[ 5120.100203] [   4205]     0  4205    26973    25355    25355        0         0   249856        0             0 stress
[ 5120.100204] [   4206]     0  4206     2000      800      800        0         0    45056        0             0 worker
[ 5120.100300] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/system.slice/job.service,task_memcg=/system.slice/job.service,task=stress,pid=4205,uid=0
[ 5120.100400] Memory cgroup out of memory: Killed process 4205 (stress) total-vm:107892kB, anon-rss:101420kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:244kB oom_score_adj:0
[ 5120.100500] Tasks in /system.slice/job.service are going to be killed due to memory.oom.group set
[ 5120.100600] Memory cgroup out of memory: Killed process 4201 (sh) total-vm:4000kB, anon-rss:200kB, file-rss:700kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0
[ 5120.100700] Memory cgroup out of memory: Killed process 4206 (worker) total-vm:8000kB, anon-rss:3200kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0
[ 5120.130000] oom_reaper: reaped process 4205 (stress), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
";
    let run = |extra: &[&str]| {
        let mut args = vec!["--all"];
        args.extend_from_slice(extra);
        let out = explain_stdin(log, &args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: Value = serde_json::from_str(&run(&["--format", "json"])).expect("json");
    let all = v.as_array().unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(all.len(), 3, "{v:#}");
    for e in all {
        assert_eq!(e["kill"]["oom_group"], "/system.slice/job.service", "{e:#}");
        let pids: Vec<u64> = e["incident"]
            .as_array()
            .unwrap_or_else(|| panic!("{e:#}"))
            .iter()
            .map(|k| k["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids, [4205, 4201, 4206], "in the kernel's order: {e:#}");
    }
    // The chosen victim keeps its full report and its own verdict.
    let first = all
        .iter()
        .find(|e| e["kill"]["victim"]["pid"] == 4205)
        .unwrap();
    assert_eq!(first["verdict"]["cause"], "own_growth", "{first:#}");
    // The others were killed with their group, not for their memory.
    for e in all.iter().filter(|e| e["kill"]["victim"]["pid"] != 4205) {
        assert_eq!(e["verdict"]["cause"], "oom_group", "{e:#}");
        assert!(e["kill"]["trigger"].is_null(), "no trigger made up: {e:#}");
    }
    let text = run(&[]);
    assert!(
        text.contains("memory.oom.group is set on /system.slice/job.service, so the kernel killed every task in it as one incident (3 kills known: stress (pid 4205), sh (pid 4201), worker (pid 4206))"),
        "{text}"
    );
    assert!(
        text.contains("killed with its group, not for its own memory: memory.oom.group is set on /system.slice/job.service, so when the kernel chose stress (pid 4205)"),
        "{text}"
    );
}

/// Every saved kernel log of tests/fixtures/kernel-logs (each kernel
/// generation and log shape) yields the facts its `.facts.json` lists,
/// through `explain --log FILE --all --format json`.
#[test]
fn every_saved_log_fixture_yields_its_facts() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kernel-logs");
    let mut logs: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    assert!(logs.len() >= 9, "{logs:?}");
    for log in &logs {
        let name = log.file_name().unwrap().to_string_lossy().into_owned();
        let facts: Value =
            serde_json::from_str(&fs::read_to_string(log.with_extension("facts.json")).unwrap())
                .unwrap_or_else(|e| panic!("{name}: facts: {e}"));
        let got = tracer_json(&[
            "explain",
            "--log",
            log.to_str().unwrap(),
            "--all",
            "--format",
            "json",
        ]);
        let all = got.as_array().unwrap_or_else(|| panic!("{name}: {got}"));
        assert_eq!(
            all.len() as u64,
            facts["kills"].as_u64().unwrap(),
            "{name}: {got:#}"
        );
        for want in facts["facts"].as_array().unwrap() {
            let pid = &want["pid"];
            let e = all
                .iter()
                .find(|e| &e["kill"]["victim"]["pid"] == pid)
                .unwrap_or_else(|| panic!("{name}: no kill of pid {pid}: {got:#}"));
            for (key, value) in want.as_object().unwrap() {
                match key.as_str() {
                    "pid" => {}
                    "tasks" => assert_eq!(
                        e["kill"]["tasks"].as_array().map(Vec::len).unwrap_or(0) as u64,
                        value.as_u64().unwrap(),
                        "{name} pid {pid}: task table rows"
                    ),
                    "host" => {
                        let gaps = e["kill"]["gaps"].to_string();
                        match value.as_str() {
                            Some(h) => assert!(
                                gaps.contains(&format!("logged by host {h}")),
                                "{name} pid {pid}: host {h}: {gaps}"
                            ),
                            None => assert!(!gaps.contains("logged by host"), "{name}: {gaps}"),
                        }
                    }
                    pointer => assert_eq!(
                        e.pointer(pointer).unwrap_or(&Value::Null),
                        value,
                        "{name} pid {pid}: {pointer} in {e:#}"
                    ),
                }
            }
        }
    }
}

/// What is not a kernel log is said to be so (exit 2); a kernel log
/// without a kill is `no kills` (exit 1, as for a store).
#[test]
fn saved_logs_that_cannot_be_explained_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let mut binary = b"\x7fELF\x02\x01\x01\x00".to_vec();
    binary.extend((0..4096u32).map(|i| (i * 7919 % 251) as u8));
    let cases = [
        (write("empty.log", b""), 2, "is empty: nothing to explain"),
        (write("a.out", &binary), 2, "is binary data, not a text log"),
        (
            write("notes.txt", b"dear ops,\nthe job died again\n"),
            2,
            "has no kernel log line of a known shape",
        ),
        (
            write(
                "quiet.log",
                b"[    0.000000] Linux version 6.18.0 (gcc 14.2.0)\n[    1.234567] EXT4-fs (vda1): mounted filesystem\n",
            ),
            1,
            "no OOM kills in",
        ),
        (
            dir.path().join("missing.log").to_str().unwrap().to_string(),
            2,
            "No such file or directory",
        ),
        (dir.path().to_str().unwrap().to_string(), 2, "Is a directory"),
    ];
    for (path, code, says) in cases {
        for format in ["text", "json"] {
            let out = tracer(&["explain", "--log", &path, "--format", format]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{path} ({format}): {err}");
            assert!(err.contains(says), "{path} ({format}): {err}");
        }
    }
}

/// `explain --journal --journal-dir DIR`: the kernel's messages of a saved
/// journal (written by systemd-journal-remote from two boots of two
/// saved logs, with a userspace line that only looks like a kill), read
/// with the real journalctl.
#[test]
fn explain_reads_the_kernel_messages_of_a_saved_journal() {
    let remote = std::path::Path::new("/lib/systemd/systemd-journal-remote");
    if !remote.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "systemd-journal-remote missing: cargo xtask setup installs it"
        );
        eprintln!("skipped: no systemd-journal-remote (cargo xtask setup)");
        return;
    }
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kernel-logs");
    let dir = tempfile::tempdir().unwrap();
    let mut export = String::new();
    let mut entry = |boot: &str, host: &str, transport: &str, us: u64, message: &str| {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={us}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID={boot}\n_TRANSPORT={transport}\nSYSLOG_IDENTIFIER=kernel\n_HOSTNAME={host}\nPRIORITY=6\nMESSAGE={message}\n\n",
            us % 1_000_000_000
        ));
    };
    // Boot 1 (2025-03-03 10:00 UTC): the cpuset kill; boot 2, an hour on: the pod's memcg kill.
    let boots = [
        (
            "5.10-cpuset-journalctl-iso.log",
            "a1".repeat(16),
            1_740_996_000_000_000u64,
        ),
        (
            "6.1-memcg-v2-journalctl-monotonic.log",
            "b2".repeat(16),
            1_740_999_600_000_000,
        ),
    ];
    for (file, boot, t0) in &boots {
        let text = fs::read_to_string(fixtures.join(file)).unwrap();
        for (i, line) in text
            .lines()
            .filter_map(|l| l.split_once(" kernel: "))
            .enumerate()
        {
            entry(boot, "gpu-node-7", "kernel", t0 + i as u64 * 10, line.1);
        }
    }
    entry(
        &"b2".repeat(16),
        "gpu-node-7",
        "syslog",
        1_740_999_700_000_000,
        "Out of memory: Killed process 1 (init) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB",
    );
    let export_file = dir.path().join("saved.export");
    fs::write(&export_file, export).unwrap();
    let journal = dir.path().join("journal");
    fs::create_dir(&journal).unwrap();
    let out = Command::new(remote)
        .arg(format!(
            "--output={}",
            journal.join("saved.journal").display()
        ))
        .arg(&export_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let j = journal.to_str().unwrap();
    let all = tracer_json(&[
        "explain",
        "--journal",
        "--journal-dir",
        j,
        "--all",
        "--format",
        "json",
    ]);
    let kills = all.as_array().unwrap_or_else(|| panic!("{all}"));
    let pids: Vec<u64> = kills
        .iter()
        .map(|e| e["kill"]["victim"]["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        pids,
        [20121, 9001],
        "both boots, latest first, no userspace line: {all:#}"
    );
    assert_eq!(kills[0]["kill"]["killer"]["constraint"], "memcg");
    assert_eq!(kills[1]["kill"]["killer"]["constraint"], "cpuset");
    // The journal's wall times (to the microsecond).
    assert_eq!(
        kills[1]["kill"]["ts_ns"], 1_740_996_000_000_070_000i64,
        "{all:#}"
    );
    assert!(
        kills[0]["kill"]["gaps"]
            .to_string()
            .contains("logged by host gpu-node-7")
    );
    // The same journal as journalctl -o json (and -o cat, its bare
    // messages), every transport, pasted into --log: the same kills (the
    // userspace line that looks like one is not, by its transport in JSON).
    // (-o cat has no transport to tell them by: the kernel's messages only.)
    for (output, only) in [("json", None), ("cat", Some("_TRANSPORT=kernel"))] {
        let text = Command::new("journalctl")
            .args(["-D", j, "-o", output, "--no-pager"])
            .args(only)
            .output()
            .unwrap();
        assert!(text.status.success(), "{text:?}");
        let saved = dir.path().join(format!("journal.{output}"));
        fs::write(&saved, &text.stdout).unwrap();
        let again = tracer_json(&[
            "explain",
            "--log",
            saved.to_str().unwrap(),
            "--all",
            "--format",
            "json",
        ]);
        let mut got: Vec<u64> = again
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kill"]["victim"]["pid"].as_u64().unwrap())
            .collect();
        got.sort();
        assert_eq!(got, [9001, 20121], "-o {output}: {again:#}");
        if output == "json" {
            // Every kill at the journal's time, in its cgroup, as --journal.
            for (a, b) in again.as_array().unwrap().iter().zip(kills) {
                for p in [
                    "/kill/victim/pid",
                    "/kill/ts_ns",
                    "/kill/killer/constraint",
                    "/kill/victim/memcg",
                ] {
                    assert_eq!(a.pointer(p), b.pointer(p), "-o json {p}: {a:#}");
                }
            }
        }
    }
    // A window that holds none of them; a directory that holds no journal.
    let recent = tracer(&["explain", "--journal", "--journal-dir", j, "--since", "1h"]);
    assert_eq!(recent.status.code(), Some(1), "{recent:?}");
    assert!(
        String::from_utf8_lossy(&recent.stderr)
            .contains("no OOM kills in the last 1h in the journal in")
    );
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let none = tracer(&[
        "explain",
        "--journal",
        "--journal-dir",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains(
            "the journal holds no kernel message (journalctl: No journal files were found"
        ) && err.contains("nothing to explain"),
        "{err}"
    );
    let missing = tracer(&[
        "explain",
        "--journal",
        "--journal-dir",
        "/nonexistent-journal",
    ]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("--journal-dir /nonexistent-journal: not a directory")
    );
}

/// /proc/PID/stat's start time (clock ticks after boot).
fn start_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the name's closing parenthesis; starttime is field 22.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(19).unwrap().parse().unwrap()
}

/// Nanoseconds in one of /proc's clock ticks.
fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64
}
