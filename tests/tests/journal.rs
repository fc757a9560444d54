//! The systemd journal's userspace OOM killers, with the real journalctl
//! reading journal files the real systemd-journal-remote wrote: a
//! recorder following the journal gives a SIGKILL from systemd-oomd the
//! reason of its entry, whichever comes first, and `explain --journal`
//! reads systemd-oomd's entries beside the kernel's.
//! Run as root through `cargo xtask test`; in CI it fails if it cannot run.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use tracer_e2e::{
    KubePod, Proc, Recorder, Scenario, TestCgroup, explain_json, kubelet_files, tracer_json,
};

const MIB: u64 = 1 << 20;
const REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// systemd-oomd's line of tests/fixtures/real-logs/ev-10 (systemd issue
/// 23606), for a cgroup of the test's.
fn oomd_message(cgroup: &str, monitored: &str) -> String {
    format!(
        "Killed {cgroup} due to memory pressure for {monitored} being 51.07% > 50.00% for > 20s with reclaim activity"
    )
}

/// Writes a journal file `name` in `dir` with systemd-journal-remote: one
/// entry of `program` (pid `pid`) saying `message` now, in this boot.
fn journal_entry(dir: &Path, name: &str, program: &str, pid: u32, message: &str) {
    journal_entries(dir, name, program, pid, &[message]);
}

/// [`journal_entry`] with an entry for each of `messages`, in one file (one
/// run of systemd-journal-remote, which takes most of a second in a guest),
/// a microsecond apart. Their monotonic stamps grow with the wall clock:
/// journalctl orders a boot's entries by them, and one no later than the
/// entry it last showed is not followed.
fn journal_entries(dir: &Path, name: &str, program: &str, pid: u32, messages: &[&str]) {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let export = dir.join(format!("{name}.export"));
    let entries: String = messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            format!(
                "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID={boot}\n_TRANSPORT=journal\n_HOSTNAME=gpu-node-7\nSYSLOG_IDENTIFIER={program}\n_PID={pid}\nPRIORITY=4\nMESSAGE={message}\n\n",
                now_us + i as u128,
                now_us + i as u128
            )
        })
        .collect();
    fs::write(&export, entries).unwrap();
    let out = Command::new(REMOTE)
        .arg(format!(
            "--output={}",
            dir.join(format!("{name}.journal")).display()
        ))
        .arg(&export)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    fs::remove_file(export).unwrap();
}

/// systemd-journal-remote, or the reason the test cannot run.
fn have_remote() -> bool {
    if Path::new(REMOTE).exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "systemd-journal-remote missing: cargo xtask setup installs it"
    );
    eprintln!("skipped: no systemd-journal-remote (cargo xtask setup)");
    false
}

/// A scenario with a journal directory for a recorder to follow (None
/// where the test cannot run): journalctl follows a journal that holds
/// this boot already, so it gets one entry first.
fn live_journal() -> Option<(Scenario, PathBuf)> {
    if !have_remote() {
        return None;
    }
    let sc = Scenario::new()?;
    let journal = sc.dir.path().join("journal");
    fs::create_dir(&journal).unwrap();
    journal_entry(
        &journal,
        "boot",
        "systemd",
        1,
        "Reached target multi-user.target - Multi-User System.",
    );
    Some((sc, journal))
}

/// `explain --pid` of `pid` once its kill has a killer's reason.
fn explained_with_reason(store: &Path, pid: u32) -> serde_json::Value {
    explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &pid.to_string(),
        ],
        |v| v["kill"]["killer"]["reason"].is_string(),
    )
}

/// [`live_journal`], a cgroup `tag` of 64 MiB, and a recorder following
/// the journal.
fn following_journal(tag: &str) -> Option<(Scenario, PathBuf, TestCgroup, Recorder)> {
    let (sc, journal) = live_journal()?;
    let cg = TestCgroup::new(tag, 64 * MIB);
    let rec = Recorder::on(&sc.store)
        .args(&["--journal-dir", journal.to_str().unwrap()])
        .start();
    Some((sc, journal, cg, rec))
}

/// A process of `cg` that waits to be killed.
fn sleeper(cg: &TestCgroup) -> Proc {
    let mut c = cg.command("sleep");
    c.arg("600");
    Proc::spawn(c)
}

/// `kill` under another name (its comm is what the recorder sees),
/// started held: it signals `victim` once its stdin gets a line.
struct Sender {
    child: std::process::Child,
}

impl Sender {
    fn held(bin: &Path, victim: u32) -> Self {
        let child = Command::new("sh")
            .args([
                "-c",
                &format!("read go && exec {} -9 {victim}", bin.display()),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        Self { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill_now(mut self) {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "{st}");
    }
}

#[test]
fn a_sigkill_from_systemd_oomd_takes_the_reason_of_its_journal_entry() {
    let Some((sc, journal, cg, rec)) = following_journal("oomd") else {
        return;
    };
    let store = sc.store.clone();
    let oomd: PathBuf = sc.dir.path().join("systemd-oomd");
    fs::copy("/usr/bin/kill", &oomd).unwrap();
    let monitored = cg.path.rsplit_once('/').map_or("/", |(p, _)| p).to_string();
    let monitored = if monitored.is_empty() {
        "/".into()
    } else {
        monitored
    };

    // The SIGKILL first, then the entry (as systemd-oomd does it).
    let first = sleeper(&cg);
    let killer = Sender::held(&oomd, first.pid());
    let killer_pid = killer.pid();
    killer.kill_now();
    journal_entry(
        &journal,
        "oomd-1",
        "systemd-oomd",
        killer_pid,
        &oomd_message(&cg.path, &monitored),
    );
    // The entry first, then the SIGKILL (a recorder reading its rings late).
    let second = sleeper(&cg);
    let killer = Sender::held(&oomd, second.pid());
    journal_entry(
        &journal,
        "oomd-2",
        "systemd-oomd",
        killer.pid(),
        &oomd_message(&cg.path, &monitored),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    killer.kill_now();

    let store_s = store.to_str().unwrap();
    for victim in [first.pid(), second.pid()] {
        let v = explain_json(&["--store", store_s, "--pid", &victim.to_string()], |v| {
            v["kill"]["killer"]["reason"].is_string()
        });
        assert_eq!(v["kill"]["killer"]["sender"]["comm"], "systemd-oomd", "{v}");
        assert_eq!(v["kill"]["victim"]["memcg"], cg.path.as_str(), "{v}");
        let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
        let want = format!("memory pressure 51.07% > 50.00% for 20s on {monitored};");
        assert!(
            summary.starts_with("killed by systemd-oomd (pid ") && summary.contains(&want),
            "{summary:?}, not {want:?}: {v}"
        );
        assert!(v["kill"]["source"].as_str().unwrap().contains("log"), "{v}");
    }
    // A SIGKILL from systemd-oomd with no entry keeps no reason.
    let third = sleeper(&cg);
    Sender::held(&oomd, third.pid()).kill_now();
    let v = explain_json(
        &["--store", store_s, "--pid", &third.pid().to_string()],
        |v| v["kill"]["killer"]["sender"]["comm"] == "systemd-oomd",
    );
    assert!(v["kill"]["killer"]["reason"].is_null(), "{v}");
    drop(rec);
}

/// kubelet's lines of a liveness probe's restart, as an AKS node's journal
/// has them (github.com/VijayRod/demo, container-storage/logs/k8s-pod.md,
/// `liveness-exec`), for the test's pod: the probe's failure, then the
/// container killed with a grace period.
fn kubelet_liveness(pod: &KubePod, uid: &str, id: &str) -> [String; 2] {
    let (ns, name, c) = (pod.namespace, pod.pod, pod.container);
    [
        format!(
            r#"I0516 18:34:49.885576    4052 kuberuntime_manager.go:1027] "Message for Container of pod" containerName="{c}" containerStatusID={{"Type":"containerd","ID":"{id}"}} pod="{ns}/{name}" containerMessage="Container {c} failed liveness probe, will be restarted""#
        ),
        format!(
            r#"I0516 18:34:49.885621    4052 kuberuntime_container.go:808] "Killing container with a grace period" pod="{ns}/{name}" podUID="{uid}" containerName="{c}" containerID="containerd://{id}" gracePeriod=30"#
        ),
    ]
}

/// kubelet's lines of a pod deleted through the API, as an AKS node's
/// journal has them (github.com/VijayRod/demo,
/// container-storage/logs/k8s-pod_container_logs.md, `kubectl delete po
/// nginx`; tests/fixtures/real-logs/ev-30), for the test's pod.
fn kubelet_api_delete(pod: &KubePod, uid: &str, id: &str) -> [String; 2] {
    let (ns, name, c) = (pod.namespace, pod.pod, pod.container);
    [
        format!(
            r#"I1129 18:20:18.242812    2775 kubelet.go:2449] "SyncLoop DELETE" source="api" pods=["{ns}/{name}"]"#
        ),
        format!(
            r#"I1129 18:20:18.242970    2775 kuberuntime_container.go:770] "Killing container with a grace period" pod="{ns}/{name}" podUID="{uid}" containerName="{c}" containerID="containerd://{id}" gracePeriod=30"#
        ),
    ]
}

/// A process of `pod`'s container, kubelet's lines `said` for it in the
/// journal a recorder follows, then the runtime's SIGKILL (a `kill` named
/// runc) after the grace period: `explain` of the victim once the kill has
/// kubelet's reason.
fn runtime_kill_after_kubelet(
    pod: KubePod,
    said: impl Fn(&KubePod, &str, &str) -> [String; 2],
) -> Option<serde_json::Value> {
    let (sc, journal) = live_journal()?;
    let host = tempfile::tempdir().unwrap();
    let uid = format!("{:08x}-ab55-461a-b526-29248d2554ad", std::process::id());
    let id = "05657a9c673d612aedd955a65136ccca36b82ba987831de7844cdc0238f1d707";
    let top = format!("tracer-e2e-kubelet-{}", std::process::id());
    kubelet_files(host.path(), KubePod { ..pod }, &uid, 0, id);
    let store = sc.store.clone();
    let rec = Recorder::on(&store)
        .args(&[
            "--journal-dir",
            journal.to_str().unwrap(),
            "--host-root",
            host.path().to_str().unwrap(),
        ])
        .start();
    let cg = TestCgroup::in_pod(&top, &uid, id, 48 * MIB);
    let victim = sleeper(&cg);
    let said = said(&pod, &uid, id);
    let said: Vec<&str> = said.iter().map(String::as_str).collect();
    journal_entries(&journal, "kubelet", "kubelet", 4052, &said);
    // The grace period (here 1 s), then the runtime's SIGKILL.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let runc = sc.dir.path().join("runc");
    fs::copy("/usr/bin/kill", &runc).unwrap();
    Sender::held(&runc, victim.pid()).kill_now();
    let v = explained_with_reason(&store, victim.pid());
    assert_eq!(v["kill"]["killer"]["sender"]["comm"], "runc", "{v}");
    assert_eq!(v["kill"]["killer"]["asked_by"], "kubelet", "{v}");
    let stopped = format!(
        "kubelet stopped container {} of pod {}/{}",
        pod.container, pod.namespace, pod.pod
    );
    assert!(v["kill"]["gaps"].to_string().contains(&stopped), "{v}");
    drop(rec);
    Some(v)
}

#[test]
fn the_runtime_s_sigkill_after_kubelet_s_liveness_restart_takes_its_reason() {
    let pod = KubePod {
        namespace: "default",
        pod: "liveness-exec",
        container: "liveness",
    };
    let Some(v) = runtime_kill_after_kubelet(pod, kubelet_liveness) else {
        return;
    };
    let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("killed by kubelet through runc (pid ")
            && summary.contains(
                "): Container liveness failed liveness probe, will be restarted, 30 s to exit before SIGKILL; "
            ),
        "{summary:?}: {v}"
    );
}

#[test]
fn the_runtime_s_sigkill_after_a_pod_s_deletion_through_the_api_takes_its_reason() {
    let pod = KubePod {
        namespace: "default",
        pod: "nginx",
        container: "nginx",
    };
    let Some(v) = runtime_kill_after_kubelet(pod, kubelet_api_delete) else {
        return;
    };
    let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("killed by kubelet through runc (pid ")
            && summary.contains(
                "): the pod was deleted through the API (kubectl delete, a rollout or scale-down, a controller, or the scheduler preempting it), 30 s to exit before SIGKILL; "
            ),
        "{summary:?}: {v}"
    );
}

#[test]
fn explain_journal_reads_systemd_oomd_s_entries_beside_the_kernel_s() {
    if !have_remote() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    fs::create_dir(&journal).unwrap();
    // ev-10's line, as systemd-oomd wrote it.
    let scope = "/user.slice/user-1001.slice/user@1001.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-dbb4a75e-031f-480d-924b-5de5af7579d2.scope";
    journal_entry(
        &journal,
        "oomd",
        "systemd-oomd",
        840,
        &oomd_message(scope, "/user.slice/user-1001.slice/user@1001.service"),
    );
    let all = tracer_json(&[
        "explain",
        "--journal",
        "--journal-dir",
        journal.to_str().unwrap(),
        "--all",
        "--format",
        "json",
    ]);
    let kills = all.as_array().unwrap_or_else(|| panic!("{all}"));
    assert_eq!(kills.len(), 1, "{all:#}");
    let k = &kills[0];
    assert_eq!(k["kill"]["killer"]["sender"]["comm"], "systemd-oomd");
    assert_eq!(k["kill"]["victim"]["memcg"], scope);
    assert_eq!(
        k["verdict"]["summary"],
        "killed by systemd-oomd (pid 840): memory pressure 51.07% > 50.00% for 20s on /user.slice/user-1001.slice/user@1001.service; not by the kernel OOM killer",
        "{k}"
    );
}

/// A userspace OOM killer Debian's package left in target/PACKAGE
/// (unpacked by `cargo xtask setup`).
fn oom_killer_bin(package: &str, bin: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(package)
        .join("root")
        .join(bin);
    assert!(bin.exists(), "{} missing: cargo xtask setup", bin.display());
    bin
}

/// A process of `cg` that the kernel would rank first (oom_score_adj
/// 1000): the one a userspace killer picks.
fn first_victim(cg: &TestCgroup) -> Proc {
    let mut c = cg.command("sh");
    c.args([
        "-c",
        "echo 1000 > /proc/self/oom_score_adj && exec sleep 600",
    ]);
    let victim = Proc::spawn(c);
    std::thread::sleep(std::time::Duration::from_millis(300));
    victim
}

/// Runs a userspace OOM killer (`killer`, its output piped) until the line
/// `sent` says it signalled, and stops it once `victim` is dead, before it
/// looks for another process (both killers print that line before they
/// signal; `victim` is a zombie of this test's). Gives the killer's pid and
/// its lines, each written to `journal` as its unit's output would be.
fn killed_by(
    journal: &Path,
    program: &str,
    mut killer: Command,
    victim: &mut Proc,
    sent: impl Fn(&str) -> bool,
) -> (u32, Vec<String>) {
    let mut k = killer.stdout(Stdio::piped()).spawn().unwrap();
    let k_pid = k.id();
    let out = k.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while let Ok(line) =
        rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        let done = sent(&line);
        lines.push(line);
        if done {
            break;
        }
    }
    let stat = format!("/proc/{}/stat", victim.pid());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(60)
        && fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with(['Z', 'X'])))
            == Some(false)
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let _ = k.kill();
    let _ = k.wait();
    let ended = victim.wait_signal(std::time::Duration::from_secs(5));
    assert_eq!(ended, Some(9), "the victim was not SIGKILLed: {lines:#?}");
    assert!(
        lines.iter().any(|l| sent(l)),
        "{program} sent no SIGKILL: {lines:#?}"
    );
    eprintln!("{program} (pid {k_pid}) said: {lines:#?}");
    let said: Vec<&str> = lines.iter().map(String::as_str).collect();
    journal_entries(journal, program, program, k_pid, &said);
    (k_pid, lines)
}

/// earlyoom's real SIGKILL and its real lines (Debian's 1.7): it runs
/// with limits the guest is always below, and kills the process with the
/// highest oom_score there, the test's victim. Only in a guest: earlyoom
/// acts on the whole machine, and on a shared host it could pick another
/// program.
#[test]
fn vm_only_earlyoom_s_sigkill_takes_the_reason_of_its_own_lines() {
    if std::env::var_os("TRACER_VM_GUEST").is_none() {
        eprintln!("not run: earlyoom kills on the whole machine; this test runs in the v2 guest");
        return;
    }
    let bin = oom_killer_bin("earlyoom", "usr/bin/earlyoom");
    let Some((sc, journal, cg, rec)) = following_journal("earlyoom") else {
        return;
    };
    let mut victim = first_victim(&cg);
    let mut eo = Command::new("sh");
    eo.args([
        "-c",
        r#"exec "$0" -m 99,99 -s 100,100 -r 0 --prefer '^sleep$' --avoid '^(tracer|journal|journalctl|systemd-journal|cargo|sh)' 2>&1"#,
    ])
    .arg(&bin);
    let (eo_pid, lines) = killed_by(&journal, "earlyoom", eo, &mut victim, |l| {
        l.starts_with("sending SIGKILL")
    });
    let sent = lines
        .iter()
        .find(|l| l.starts_with("sending SIGKILL"))
        .unwrap();
    assert!(
        sent.contains(&format!("process {} ", victim.pid())),
        "earlyoom chose another process: {sent}"
    );
    let v = explained_with_reason(&sc.store, victim.pid());
    assert_eq!(v["kill"]["killer"]["sender"]["comm"], "earlyoom", "{v}");
    assert_eq!(v["kill"]["killer"]["sender"]["pid"], eo_pid, "{v}");
    let reason = v["kill"]["killer"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("low memory! at or below SIGKILL limits: mem 99.00%"),
        "{v}"
    );
    let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with(&format!("killed by earlyoom (pid {eo_pid}): low memory!")),
        "{summary:?}: {v}"
    );
    drop(rec);
}

/// nohang's real SIGKILL and its real lines (Debian's 0.2.0, a Python
/// program run by the machine's python3). nohang will not act above 50 %
/// of MemAvailable, so a ballast of the test's, in a cgroup of its own
/// with a limit, holds the guest's memory below that; its oom_score_adj
/// is -1000, and nohang's `min_badness` of 500 leaves it, the recorder and
/// everything else alone: only the victim is ranked high enough.
#[test]
fn vm_only_nohang_s_sigkill_takes_the_reason_of_its_own_lines() {
    if std::env::var_os("TRACER_VM_GUEST").is_none() {
        eprintln!("not run: nohang kills on the whole machine; this test runs in the v2 guest");
        return;
    }
    let bin = oom_killer_bin("nohang", "usr/sbin/nohang");
    let Some((sc, journal, cg, rec)) = following_journal("nohang") else {
        return;
    };
    let meminfo = |key: &str| -> u64 {
        let m = fs::read_to_string("/proc/meminfo").unwrap();
        let line = m.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let (total, available) = (meminfo("MemTotal:"), meminfo("MemAvailable:"));
    // Down to 40 % of MemTotal available.
    let ballast_mib = available.saturating_sub(total * 2 / 5) / MIB;
    assert!(ballast_mib > 0, "MemAvailable {available} of {total}");
    let ballast_cg = TestCgroup::new("nohang-ballast", (ballast_mib + 64) * MIB);
    let mut c = ballast_cg.command("sh");
    c.args([
        "-c",
        r#"echo -1000 > /proc/self/oom_score_adj && exec "$0" --step-mib 16 --interval-ms 1 --max-mib "$1""#,
        env!("CARGO_BIN_EXE_memhog"),
        &ballast_mib.to_string(),
    ]);
    let ballast = Proc::spawn(c);
    tracer_e2e::wait_for(std::time::Duration::from_secs(60), || {
        (ballast_cg.usage() >= ballast_mib * MIB).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the ballast reached {} of {ballast_mib} MiB",
            ballast_cg.usage() / MIB
        )
    });

    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("nohang.conf");
    let shipped = fs::read_to_string(
        bin.ancestors()
            .nth(3)
            .unwrap()
            .join("etc/nohang/nohang.conf"),
    )
    .unwrap();
    let mut edited = String::new();
    for line in shipped.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        let line = match key {
            "soft_threshold_min_mem" | "hard_threshold_min_mem" => format!("{key} = 50 %"),
            "soft_threshold_min_swap" | "hard_threshold_min_swap" => format!("{key} = 100 %"),
            "min_badness" => "min_badness = 500".into(),
            _ => line.to_string(),
        };
        edited.push_str(&line);
        edited.push('\n');
    }
    fs::write(&conf, edited).unwrap();
    let mut victim = first_victim(&cg);
    let mut nh = Command::new("sh");
    nh.args(["-c", r#"exec "$0" -c "$1" --monitor 2>&1"#])
        .arg(&bin)
        .arg(&conf)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONWARNINGS", "ignore");
    let (nh_pid, lines) = killed_by(&journal, "nohang", nh, &mut victim, |l| {
        l.trim() == "Sending SIGKILL to the victim"
    });
    drop(ballast);
    assert!(
        lines
            .iter()
            .any(|l| l.trim().starts_with(&format!("PID: {}, ", victim.pid()))),
        "nohang chose another process: {lines:#?}"
    );
    let v = explained_with_reason(&sc.store, victim.pid());
    assert_eq!(v["kill"]["killer"]["sender"]["comm"], "nohang", "{v}");
    assert_eq!(v["kill"]["killer"]["sender"]["pid"], nh_pid, "{v}");
    let reason = v["kill"]["killer"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("MemAvailable [") && reason.contains("<= hard_threshold_min_mem ["),
        "{v}"
    );
    let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with(&format!("killed by nohang (pid {nh_pid}): MemAvailable [")),
        "{summary:?}: {v}"
    );
    drop(rec);
}

#[test]
fn a_journal_dir_that_does_not_exist_is_refused_before_anything_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-journal-here");
    let store = dir.path().join("store/t.db");
    let out = tracer_e2e::tracer(&[
        "record",
        "--journal-dir",
        missing.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "--journal-dir {}: no such directory",
            missing.display()
        )),
        "{err}"
    );
    assert!(!store.parent().unwrap().exists(), "nothing was made");
}
