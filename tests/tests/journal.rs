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
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let export = dir.join(format!("{name}.export"));
    fs::write(
        &export,
        format!(
            "__REALTIME_TIMESTAMP={now_us}\n__MONOTONIC_TIMESTAMP=1\n_BOOT_ID={boot}\n_TRANSPORT=journal\n_HOSTNAME=gpu-node-7\nSYSLOG_IDENTIFIER={program}\n_PID={pid}\nPRIORITY=4\nMESSAGE={message}\n\n"
        ),
    )
    .unwrap();
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

#[test]
fn the_runtime_s_sigkill_after_kubelet_s_liveness_restart_takes_its_reason() {
    let Some((sc, journal)) = live_journal() else {
        return;
    };
    let host = tempfile::tempdir().unwrap();
    let pod = KubePod {
        namespace: "default",
        pod: "liveness-exec",
        container: "liveness",
    };
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
    for (i, line) in kubelet_liveness(&pod, &uid, id).iter().enumerate() {
        journal_entry(&journal, &format!("kubelet-{i}"), "kubelet", 4052, line);
    }
    // The grace period (here 1 s), then the runtime's SIGKILL.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let runc = sc.dir.path().join("runc");
    fs::copy("/usr/bin/kill", &runc).unwrap();
    Sender::held(&runc, victim.pid()).kill_now();
    let v = explained_with_reason(&store, victim.pid());
    assert_eq!(v["kill"]["killer"]["sender"]["comm"], "runc", "{v}");
    assert_eq!(v["kill"]["killer"]["asked_by"], "kubelet", "{v}");
    let summary = v["verdict"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("killed by kubelet through runc (pid ")
            && summary.contains(
                "): Container liveness failed liveness probe, will be restarted, 30 s to exit before SIGKILL; "
            ),
        "{summary:?}: {v}"
    );
    assert!(
        v["kill"]["gaps"]
            .to_string()
            .contains("kubelet stopped container liveness of pod default/liveness-exec"),
        "{v}"
    );
    drop(rec);
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

/// The real earlyoom (Debian's 1.7, unpacked by `cargo xtask setup`).
fn earlyoom_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/earlyoom/root/usr/bin/earlyoom")
}

/// earlyoom's real SIGKILL and its real lines: it runs with limits the
/// guest is always below, and kills the process with the highest
/// oom_score there, the test's victim (oom_score_adj 1000); its lines go
/// to the journal as its unit's output would. Only in a guest: earlyoom
/// acts on the whole machine, and on a shared host it could pick another
/// program.
#[test]
fn vm_only_earlyoom_s_sigkill_takes_the_reason_of_its_own_lines() {
    if std::env::var_os("TRACER_VM_GUEST").is_none() {
        eprintln!("not run: earlyoom kills on the whole machine; this test runs in the v2 guest");
        return;
    }
    let bin = earlyoom_bin();
    assert!(bin.exists(), "{} missing: cargo xtask setup", bin.display());
    let Some((sc, journal, cg, rec)) = following_journal("earlyoom") else {
        return;
    };
    let store = sc.store.clone();
    let mut c = cg.command("sh");
    c.args([
        "-c",
        "echo 1000 > /proc/self/oom_score_adj && exec sleep 600",
    ]);
    let mut victim = Proc::spawn(c);
    std::thread::sleep(std::time::Duration::from_millis(300));

    let mut eo = Command::new("sh")
        .args([
            "-c",
            r#"exec "$0" -m 99,99 -s 100,100 -r 0 --prefer '^sleep$' --avoid '^(tracer|journal|journalctl|systemd-journal|cargo|sh)' 2>&1"#,
        ])
        .arg(&bin)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let eo_pid = eo.id();
    let out = eo.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Its lines up to its SIGKILL; then it is stopped before it looks for
    // another process.
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Ok(line) =
        rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        let done = line.starts_with("sending SIGKILL");
        lines.push(line);
        if done {
            break;
        }
    }
    // earlyoom says so before it signals: it is stopped as soon as the
    // victim is dead (a zombie of this test's), long before it looks
    // again (it first waits for its victim to be gone, then sleeps).
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
    let _ = eo.kill();
    let _ = eo.wait();
    let ended = victim.wait_signal(std::time::Duration::from_secs(5));
    assert_eq!(ended, Some(9), "the victim was not SIGKILLed: {lines:#?}");
    let sent = lines
        .iter()
        .find(|l| l.starts_with("sending SIGKILL"))
        .unwrap_or_else(|| panic!("earlyoom sent no SIGKILL: {lines:#?}"));
    assert!(
        sent.contains(&format!("process {} ", victim.pid())),
        "earlyoom chose another process: {sent}"
    );
    for (i, line) in lines.iter().enumerate() {
        journal_entry(&journal, &format!("earlyoom-{i}"), "earlyoom", eo_pid, line);
    }
    let v = explained_with_reason(&store, victim.pid());
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
