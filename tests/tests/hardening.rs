//! The recorder tried the way a hostile local user, or a bad day on a real
//! node, would try it: hostile process names, closed and full outputs,
//! signals, planted links, a second recorder, read-only mounts, forged
//! kernel log lines, and kills from before the recorder started.
//! Run as root through `cargo xtask test`; in CI they fail if they cannot run.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::{
        fs::{MetadataExt as _, symlink},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_e2e::{
    Proc, Recorder, Scenario, TestCgroup, explain_json, oom_killed, summary_of, tracer, tracer_bin,
    tracer_json, wait_for,
};

const MIB: u64 = 1 << 20;

/// A terminal-hostile name: retitles the terminal and clears the screen.
const HOSTILE_COMM: &str = "\x1b]0;pwn\x07\x1b[2J";

/// A `sleep` in `cg` whose argv[0] holds a newline and an escape.
fn sleeper(cg: &TestCgroup) -> Proc {
    let mut cmd = cg.command("sleep");
    cmd.arg0("evil\nforged line\x1b[31m").arg("600");
    Proc::spawn(cmd)
}

/// The same, run through a link named [`HOSTILE_COMM`]: the kernel names
/// the process after the file it executed.
fn hostile_sleeper(cg: &TestCgroup, dir: &Path) -> Proc {
    let link = dir.join(HOSTILE_COMM);
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep");
    symlink(sleep, &link).unwrap();
    let mut cmd = cg.command(&link);
    cmd.arg0("evil\nforged line\x1b[31m").arg("600");
    Proc::spawn(cmd)
}

/// Kills `p` with SIGKILL from this process (a userspace kill).
fn sigkill(p: &mut Proc) {
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(p.pid() as i32, libc::SIGKILL) };
    assert_eq!(p.wait_signal(Duration::from_secs(10)), Some(libc::SIGKILL));
}

fn explain_pid(store: &Path, pid: u32) -> Value {
    explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &pid.to_string(),
        ],
        |_| true,
    )
}

/// `tracer record` with stderr going where the test says.
fn spawn_record(store: &Path, stderr: Stdio, extra: &[&str]) -> Child {
    Command::new(tracer_bin())
        .arg("record")
        .arg("--store")
        .arg(store)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start tracer record")
}

/// Waits until the recorder at `store` has started its session.
fn wait_session(store: &Path) {
    let ok = wait_for(Duration::from_secs(30), || {
        let c = rusqlite::Connection::open_with_flags(
            store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .ok()?;
        let n: i64 = c
            .query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
            .ok()?;
        (n > 0).then_some(())
    });
    assert!(ok.is_some(), "no session started in {}", store.display());
    // The session row is written before the model is seeded and the
    // first sample taken: give it that moment.
    std::thread::sleep(Duration::from_millis(1500));
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    wait_for(timeout, || child.try_wait().ok().flatten()).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("process did not end within {timeout:?}")
    })
}

#[test]
fn hostile_names_never_reach_the_terminal_and_json_stays_exact() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let cg = TestCgroup::new("hostile", 64 * MIB);
    let rec = Recorder::on(&store).start();
    let mut victim = hostile_sleeper(&cg, sc.dir.path());
    let pid = victim.pid();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(),
        format!("{HOSTILE_COMM}\n")
    );

    // attach prints the process name on stderr: escaped.
    let out = tracer(&["attach", "--pid", &pid.to_string(), "--duration", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "{err:?}");
    assert!(err.contains("\\e]0;pwn\\x07\\e[2J"), "{err:?}");

    // top: no raw control byte, and no screen clearing into a pipe.
    let out = tracer(&["top", "--once", "--store", store_s, "--rows", "100000"]);
    assert!(out.status.success(), "{out:?}");
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(!top.contains('\x1b') && !top.contains('\x07'), "{top:?}");
    assert!(
        top.contains("\\e]0;pwn"),
        "the hostile process is listed, escaped: {top}"
    );

    sigkill(&mut victim);
    let json = explain_pid(&store, pid);
    rec.stop();
    assert_eq!(
        json["kill"]["victim"]["comm"], HOSTILE_COMM,
        "JSON is exact"
    );
    assert!(
        json["kill"]["victim"]["cmdline"]
            .as_str()
            .unwrap()
            .starts_with("evil\nforged line\x1b[31m"),
        "{json}"
    );

    let out = tracer(&["explain", "--store", store_s, "--pid", &pid.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "a control character reached the terminal: {text:?}"
    );
    let headline = text.lines().next().unwrap();
    assert!(
        headline.contains(&format!("\\e]0;pwn\\x07\\e[2J (pid {pid})")),
        "{headline}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("forged line")),
        "a newline in a command line forged a line: {text}"
    );
}

#[test]
fn closed_and_full_outputs_end_quietly_and_never_stop_recording() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("pipes", 64 * MIB);

    // The recorder's stderr is /dev/full: it records all the same.
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut rec = spawn_record(&store, Stdio::from(full), &[]);
    wait_session(&store);
    let mut victim = sleeper(&cg);
    std::thread::sleep(Duration::from_millis(300));
    sigkill(&mut victim);
    let v = explain_pid(&store, victim.pid());
    assert_eq!(v["kill"]["killer"]["kind"], "userspace");
    assert!(
        rec.try_wait().unwrap().is_none(),
        "the recorder is still running"
    );
    signal(&rec, libc::SIGTERM);
    let st = wait_exit(&mut rec, Duration::from_secs(10));
    assert!(
        st.success(),
        "stopped cleanly with stderr on /dev/full: {st}"
    );

    // Its stderr is a pipe whose reader leaves after the first line
    // (`tracer record 2>&1 | head -1`).
    let store2 = sc.dir.path().join("t2.db");
    let mut rec = spawn_record(&store2, Stdio::piped(), &[]);
    let mut first = String::new();
    BufReader::new(rec.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone: every later log line meets a closed pipe.
    wait_session(&store2);
    let mut victim = sleeper(&cg);
    std::thread::sleep(Duration::from_millis(300));
    sigkill(&mut victim);
    let v = explain_pid(&store2, victim.pid());
    assert_eq!(v["kill"]["victim"]["pid"], victim.pid());
    assert!(
        rec.try_wait().unwrap().is_none(),
        "the recorder is still running"
    );
    signal(&rec, libc::SIGTERM);
    let st = wait_exit(&mut rec, Duration::from_secs(10));
    assert!(st.success(), "stopped cleanly with a closed stderr: {st}");

    // explain into a pipe nobody reads: ends quietly, no panic.
    let (r, w) = {
        let mut fds = [0; 2];
        // SAFETY: pipe fills two fds that this test then owns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds were just created and are owned here.
        unsafe {
            use std::os::fd::FromRawFd as _;
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        }
    };
    drop(r);
    let out = Command::new(tracer_bin())
        .args(["explain", "--all", "--store", store.to_str().unwrap()])
        .stdout(Stdio::from(w))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // explain into a full device: one line saying so, no panic.
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(tracer_bin())
        .args(["explain", "--all", "--store", store.to_str().unwrap()])
        .stdout(Stdio::from(full))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        !err.contains("panicked") && err.contains("No space left"),
        "{err}"
    );
}

#[test]
fn sighup_is_a_clean_stop() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let mut rec = spawn_record(&store, Stdio::piped(), &[]);
    let mut err = BufReader::new(rec.stderr.take().unwrap());
    wait_session(&store);
    let t0 = Instant::now();
    signal(&rec, libc::SIGHUP);
    let st = wait_exit(&mut rec, Duration::from_secs(10));
    let mut log = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut log);
    assert!(st.success(), "exit on SIGHUP: {st}: {log}");
    assert!(t0.elapsed() < Duration::from_secs(2), "stopped within 2 s");
    assert!(log.contains("tracer: stopped"), "summary printed: {log}");
    let c = rusqlite::Connection::open(&store).unwrap();
    let open: i64 = c
        .query_row(
            "SELECT count(*) FROM sessions WHERE ended_ns IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(open, 0, "the session was closed");
}

#[test]
fn the_store_refuses_links_other_users_and_a_second_writer() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let refused = |store: &Path, extra: &[&str], needle: &str| {
        let mut args = vec!["record", "--store", store.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = tracer(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };

    // A link to an empty file, a dangling link.
    let target = dir.path().join("victim-file");
    fs::write(&target, b"").unwrap();
    let link = dir.path().join("link.db");
    symlink(&target, &link).unwrap();
    refused(&link, &[], "symbolic link");
    assert_eq!(
        fs::read(&target).unwrap(),
        b"",
        "the link's target is untouched"
    );
    let dangling = dir.path().join("dangling.db");
    symlink(dir.path().join("made-through-link"), &dangling).unwrap();
    refused(&dangling, &[], "symbolic link");
    assert!(!dir.path().join("made-through-link").exists());

    // A link planted by uid 65534 in a directory it owns.
    let theirs = dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let planted = theirs.join("tracer.db");
    symlink(&target, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    refused(&planted, &[], "uid 65534");
    assert_eq!(fs::read(&target).unwrap(), b"");

    // Another application's SQLite file: refused before any write.
    let app = dir.path().join("app.db");
    rusqlite::Connection::open(&app)
        .unwrap()
        .execute_batch("PRAGMA journal_mode=DELETE; CREATE TABLE secrets(x); INSERT INTO secrets VALUES ('a');")
        .unwrap();
    let before = fs::read(&app).unwrap();
    refused(&app, &[], "not a tracer store");
    assert_eq!(fs::read(&app).unwrap(), before, "left exactly as it was");
    assert!(!dir.path().join("app.db-wal").exists());

    // Nonsense bounds.
    let fresh = dir.path().join("fresh.db");
    refused(&fresh, &["--retention", "0s"], "--retention");
    refused(&fresh, &["--max-store-size", "1MiB"], "--max-store-size");

    // A new store: private files in a private directory, one writer.
    let store = dir.path().join("var/lib/tracer/t.db");
    let rec = Recorder::on(&store).start();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(store.parent().unwrap()), 0o700);
    for f in ["t.db", "t.db-wal", "t.db-shm", "t.db.lock"] {
        let p = store.parent().unwrap().join(f);
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    refused(
        &store,
        &[],
        &format!("in use by another recorder (pid {})", rec.pid()),
    );
    rec.stop();
    // Once the first has stopped, the store is free again.
    Recorder::on(&store).start().stop();
}

/// A tmpfs the test mounted; unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Self {
        fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tracer-e2e",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs at {}", dir.display());
        Self(dir.into())
    }

    fn remount(&self, opts: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success(), "remount {opts}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn explain_reads_a_store_on_a_read_only_mount_and_skips_a_damaged_record() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let mnt = Mount::tmpfs(&dir.path().join("mnt"), "64m");
    let store = mnt.0.join("t.db");
    let cg = TestCgroup::new("ro", 64 * MIB);
    let rec = Recorder::on(&store).start();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let mut v = sleeper(&cg);
        std::thread::sleep(Duration::from_millis(300));
        sigkill(&mut v);
        explain_pid(&store, v.pid());
        pids.push(v.pid());
    }
    rec.stop();
    // Damage the middle record.
    rusqlite::Connection::open(&store)
        .unwrap()
        .execute(
            "UPDATE kills SET record = '{\"ts_ns\": \"half' WHERE pid = ?1",
            [pids[1]],
        )
        .unwrap();
    mnt.remount("ro");
    let out = tracer(&[
        "explain",
        "--all",
        "--store",
        store.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<u64> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kill"]["victim"]["pid"].as_u64().unwrap())
        .collect();
    assert!(
        got.contains(&u64::from(pids[0])) && got.contains(&u64::from(pids[2])),
        "{got:?}"
    );
    assert!(!got.contains(&u64::from(pids[1])), "{got:?}");
    assert!(err.contains("is damaged and left out"), "{err}");
    let events = tracer(&["events", "--store", store.to_str().unwrap()]);
    assert!(events.status.success(), "{events:?}");
}

#[test]
fn lines_written_to_the_kernel_log_by_a_process_are_not_kills() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = Recorder::on(&store).start();
    let forged = [
        "<4>forged invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "<6>oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/forged,task_memcg=/forged,task=forged,pid=3999999,uid=0",
        "<3>Memory cgroup out of memory: Killed process 3999999 (forged) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
    ];
    for l in forged {
        fs::write("/dev/kmsg", format!("{l}\n")).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    rec.stop();
    let out = tracer(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--pid",
        "3999999",
    ]);
    assert_eq!(out.status.code(), Some(1), "no kill stored: {out:?}");
    let out = tracer(&["explain", "--kmsg", "--pid", "3999999"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "none in explain --kmsg: {out:?}"
    );
}

#[test]
fn kills_from_before_the_recorder_are_stored_at_once() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("before", 32 * MIB);
    // Killed while no recorder runs.
    let hog = oom_killed(&cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 20);
    let pid = hog.pid();

    // A recorder that lives a moment (a crash loop) still stores it, and
    // hands it to its exporters like any other kill.
    let exported = sc.dir.path().join("kills.jsonl");
    let rec = Recorder::on(&store)
        .args(&["--export-jsonl", exported.to_str().unwrap()])
        .start();
    let t0 = Instant::now();
    let stored = wait_for(Duration::from_secs(5), || {
        let c = rusqlite::Connection::open_with_flags(
            &store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .ok()?;
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM kills WHERE pid = ?1 \
                 AND json_extract(record, '$.victim.memcg') = ?2",
                rusqlite::params![pid, cg.path],
                |r| r.get(0),
            )
            .ok()?;
        (n > 0).then(|| t0.elapsed())
    })
    .expect("the kill from before start was stored");
    let line = wait_for(Duration::from_secs(5), || {
        fs::read_to_string(&exported).ok()?.lines().find_map(|l| {
            let j: Value = serde_json::from_str(l).ok()?;
            // In its cgroup: the kernel log can hold an earlier holder's kill.
            (j["record"]["victim"]["pid"] == pid
                && j["record"]["victim"]["memcg"] == cg.path.as_str())
            .then_some(j)
        })
    })
    .expect("the kernel-log-only kill was exported");
    assert_eq!(line["record"]["source"], "kmsg");
    rec.crash();
    assert!(
        stored < Duration::from_millis(1500),
        "stored {stored:?} after the recorder was ready (it used to wait 2 s)"
    );
    let v = tracer_json(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--pid",
        &pid.to_string(),
        "--format",
        "json",
    ]);
    assert_eq!(v["recorder_running"], false, "{v}");
    assert!(
        v["kill"]["source"].as_str().unwrap().contains("kmsg"),
        "{v}"
    );

    // A kill 4 s after a recorder crashed is not shown as recorded over.
    let rec = Recorder::on(&store).start();
    std::thread::sleep(Duration::from_millis(1500));
    rec.crash();
    std::thread::sleep(Duration::from_secs(4));
    let hog = oom_killed(&cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 20);
    let rec = Recorder::on(&store).start();
    let v = explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &hog.pid().to_string(),
        ],
        |_| true,
    );
    rec.stop();
    assert_eq!(
        v["recorder_running"], false,
        "a crashed recorder's downtime is not covered: {v}"
    );

    // A kill just after a crash, within the heartbeat's grace: whether it
    // was recorded is not known, and said with the heartbeat's age; never
    // that a recorder ran.
    let rec = Recorder::on(&store).start();
    std::thread::sleep(Duration::from_millis(1500));
    rec.crash();
    let hog = oom_killed(&cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 5);
    let rec = Recorder::on(&store).start();
    let pid = hog.pid().to_string();
    let v = explain_json(&["--store", store.to_str().unwrap(), "--pid", &pid], |_| {
        true
    });
    rec.stop();
    let c = rusqlite::Connection::open(&store).unwrap();
    let last_seen: i64 = c
        .query_row(
            "SELECT max(last_seen_ns) FROM sessions WHERE ended_ns IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let since = (v["kill"]["ts_ns"].as_i64().unwrap() - last_seen) as f64 / 1e9;
    eprintln!(
        "kill {since:.2} s after the crashed recorder's last heartbeat: {}",
        v["recorder_running"]
    );
    assert_ne!(v["recorder_running"], true, "{v}");
    if since <= 3.0 {
        assert!(v["recorder_running"].is_null(), "{v}");
        let said = v["last_heartbeat_s"]
            .as_f64()
            .unwrap_or_else(|| panic!("{v}"));
        assert!((said - since).abs() < 0.01, "{said} against {since}");
        let text = String::from_utf8_lossy(
            &tracer(&["explain", "--store", store.to_str().unwrap(), "--pid", &pid]).stdout,
        )
        .to_string();
        assert!(text.contains("its last heartbeat was"), "{text}");
    } else {
        assert_eq!(v["recorder_running"], false, "{v}");
    }
}

#[test]
fn doctor_as_another_user_says_tracefs_is_unreadable_not_missing() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    // As root first: doctor mounts tracefs where a new machine lacks it.
    let _ = tracer(&["doctor"]);
    let out = Command::new(tracer_bin())
        .arg("doctor")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("tracefs"))
        .unwrap_or_else(|| panic!("no tracefs line: {text}"));
    assert!(
        line.contains("not readable by this user") && !line.contains("not mounted"),
        "{line}"
    );
}

/// Fills the file system of `dir` with one new file until it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let path = (0..)
        .map(|n| dir.join(format!("filler{n}")))
        .find(|p| !p.exists())
        .expect("a free name");
    let mut f = fs::File::create(&path).unwrap();
    let block = vec![0x5au8; 1 << 16];
    loop {
        match f.write_all(&block) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
    // What a partial write left: fill the last bytes too.
    let small = vec![0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
    path
}

#[test]
fn a_full_disk_costs_events_never_kills_or_the_recorder() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let mnt = Mount::tmpfs(&dir.path().join("mnt"), "12m");
    let store = mnt.0.join("t.db");
    let cg = TestCgroup::new("full", 64 * MIB);
    let rec = Recorder::on(&store).start();
    // The kills read from the kernel's log at start leave the kill log
    // (zeros at its start) once the store's WAL is synced.
    let kill_log = mnt.0.join("t.db.kills");
    assert!(
        wait_for(Duration::from_secs(5), || fs::read(&kill_log)
            .ok()
            .filter(|b| b.first() == Some(&0))
            .map(|_| ()))
        .is_some(),
        "the kill log was not emptied"
    );
    let filler = fill(&mnt.0);

    // A userspace kill and a real OOM kill while nothing can be written.
    let mut victim = sleeper(&cg);
    std::thread::sleep(Duration::from_millis(300));
    sigkill(&mut victim);
    let oom_cg = TestCgroup::new("full-oom", 32 * MIB);
    let hog = oom_killed(&oom_cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 20);
    for pid in [victim.pid(), hog.pid()] {
        let v = explain_pid(&store, pid);
        assert_eq!(v["kill"]["victim"]["pid"], pid, "{v}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let log = rec.log();
    assert_eq!(
        log.matches("file system is full: shedding").count(),
        1,
        "said once: {log}"
    );
    // Room again: the recorder says so and takes its reserve back.
    fs::remove_file(&filler).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || rec
            .log()
            .contains("has room again")
            .then_some(()))
        .is_some(),
        "{}",
        rec.log()
    );
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "{log}");

    // A restart on a full file system: the reserve makes room for it.
    let filler = fill(&mnt.0);
    let rec = Recorder::on(&store).start();
    let mut victim = sleeper(&cg);
    std::thread::sleep(Duration::from_millis(300));
    sigkill(&mut victim);
    let v = explain_pid(&store, victim.pid());
    assert_eq!(v["kill"]["victim"]["pid"], victim.pid(), "{v}");
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "{log}");
    drop(filler);
    let all = tracer_json(&[
        "explain",
        "--all",
        "--store",
        store.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(all.as_array().unwrap().len() >= 3, "{all}");
}

/// A store on a small file system of its own (12 MiB, to be filled), and a
/// spill directory on another (24 MiB; /run is a tmpfs too).
struct FullDisk {
    mnt: Mount,
    run: Mount,
    store: PathBuf,
    /// Last: removed once both are unmounted.
    _dir: tempfile::TempDir,
}

impl FullDisk {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mnt = Mount::tmpfs(&dir.path().join("mnt"), "12m");
        let run = Mount::tmpfs(&dir.path().join("run"), "24m");
        let store = mnt.0.join("t.db");
        Self {
            mnt,
            run,
            store,
            _dir: dir,
        }
    }

    /// A recorder on the store, spilling into the spill directory.
    fn record(&self) -> Recorder {
        Recorder::on(&self.store)
            .args(&["--spill-dir", self.run.0.to_str().unwrap()])
            .start()
    }

    /// Takes the store's file system's free space.
    fn fill(&self) -> PathBuf {
        fill(&self.mnt.0)
    }

    /// The spill store (the one file a recorder made in the spill directory).
    fn spill(&self) -> Option<PathBuf> {
        fs::read_dir(&self.run.0)
            .ok()?
            .map_while(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "spill"))
    }

    /// How many times the store holds a kill of each of `pids`.
    fn stored(&self, pids: &[u32]) -> Vec<usize> {
        let all = tracer_e2e::explain_all(&self.store);
        pids.iter()
            .map(|&pid| {
                all.iter()
                    .filter(|v| v["kill"]["victim"]["pid"] == pid)
                    .count()
            })
            .collect()
    }
}

/// Kills a sleeper of `cg` with SIGKILL; returns its pid.
fn sigkilled_sleeper(cg: &TestCgroup) -> u32 {
    let mut victim = sleeper(cg);
    std::thread::sleep(Duration::from_millis(300));
    sigkill(&mut victim);
    victim.pid()
}

#[test]
fn a_recorder_started_on_a_full_disk_keeps_its_kills_in_a_spill_store_and_brings_them_home() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let disk = FullDisk::new();
    let store = &disk.store;
    let cg = TestCgroup::new("spill", 64 * MIB);
    let mut pids = Vec::new();
    // A store some recorder wrote, on a file system that filled up after
    // its reserve was spent: nothing, not even opening it, can be written.
    let rec = disk.record();
    pids.push(sigkilled_sleeper(&cg));
    explain_pid(store, pids[0]);
    rec.stop();
    fs::remove_file(disk.mnt.0.join("t.db.reserve")).unwrap();
    let filler = disk.fill();

    // Started on it: records into the spill store, a kill and an OOM kill.
    let rec = disk.record();
    assert!(
        rec.log().contains("recording into the spill store"),
        "{}",
        rec.log()
    );
    let spill = disk.spill().expect("a spill store");
    pids.push(sigkilled_sleeper(&cg));
    let oom_cg = TestCgroup::new("spill-oom", 32 * MIB);
    pids.push(oom_killed(&oom_cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 20).pid());
    for &pid in &pids[1..] {
        let v = explain_pid(&spill, pid);
        assert_eq!(v["kill"]["victim"]["pid"], pid, "{v}");
    }
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "{log}");
    assert!(
        log.contains("kept in the spill store"),
        "the stop says where the session is: {log}"
    );

    // Restarted, still full: the same spill store takes the next session.
    let rec = disk.record();
    pids.push(sigkilled_sleeper(&cg));
    explain_pid(&spill, pids[3]);
    // Room again: everything moves into the store, and recording goes on there.
    fs::remove_file(&filler).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || rec
            .log()
            .contains("has room again: recording into")
            .then_some(()))
        .is_some(),
        "{}",
        rec.log()
    );
    pids.push(sigkilled_sleeper(&cg));
    let v = explain_pid(store, pids[4]);
    assert_eq!(v["kill"]["victim"]["memcg"], cg.path.as_str(), "{v}");
    let log = rec.stop();
    assert!(log.contains("tracer: stopped"), "{log}");
    assert_eq!(disk.spill(), None, "the spill store is removed");
    assert_eq!(
        disk.stored(&pids),
        vec![1; pids.len()],
        "each stored once: {pids:?}"
    );
    // A session recorded in the spill store is a session of the store.
    let v = explain_pid(store, pids[2]);
    assert_eq!(v["kill"]["victim"]["memcg"], oom_cg.path.as_str(), "{v}");
    assert_eq!(v["recorder_running"], true, "{v}");
}

#[test]
fn kills_held_on_a_full_disk_outlive_the_recorder_in_the_spill_store() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let disk = FullDisk::new();
    let cg = TestCgroup::new("held", 64 * MIB);
    let rec = disk.record();
    // Full: the recorder gives its reserve back and sheds events to make
    // room; then that room is taken too.
    let filler = disk.fill();
    let first = sigkilled_sleeper(&cg);
    assert!(
        wait_for(Duration::from_secs(10), || rec
            .log()
            .contains("file system is full: shedding")
            .then_some(()))
        .is_some(),
        "{}",
        rec.log()
    );
    let filler2 = disk.fill();
    // Kills that cannot be written now: held, and copied out at once.
    let held: Vec<u32> = (0..3).map(|_| sigkilled_sleeper(&cg)).collect();
    let copied = wait_for(Duration::from_secs(10), || {
        rec.log()
            .contains("copied to the spill store")
            .then_some(())
    });
    let log = rec.stop();
    assert!(copied.is_some(), "{log}");
    assert!(log.contains("tracer: stopped"), "{log}");
    let spill = disk.spill().expect("the spill store outlives the recorder");
    assert!(log.contains("kept in"), "{log}");
    // Every kill is in the store or the spill store; the held ones at least
    // in the spill store.
    for &pid in &held {
        let v = explain_pid(&spill, pid);
        assert_eq!(v["kill"]["victim"]["pid"], pid, "{v}");
    }

    // Room again; the next start imports them, each once.
    fs::remove_file(&filler2).unwrap();
    fs::remove_file(&filler).unwrap();
    let rec = disk.record();
    assert!(
        rec.log()
            .contains("from the spill store an earlier recorder left"),
        "{}",
        rec.log()
    );
    rec.stop();
    assert_eq!(disk.spill(), None, "imported and removed");
    for &pid in held.iter().chain([first].iter()) {
        let v = explain_pid(&disk.store, pid);
        assert_eq!(v["kill"]["victim"]["pid"], pid, "{v}");
        assert_eq!(v["kill"]["victim"]["memcg"], cg.path.as_str(), "{v}");
    }
    assert_eq!(
        disk.stored(&held),
        vec![1; held.len()],
        "each stored once: {held:?}"
    );
}

#[test]
fn a_process_that_joins_a_cgroup_execs_and_dies_at_once_is_placed_right() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = Recorder::on(&store).start();
    let mut wrong = Vec::new();
    for i in 0..20 {
        // Joins the cgroup, execs, and is OOM-killed within milliseconds,
        // as a container runtime's first process can be.
        let cg = TestCgroup::new(&format!("fast{i}"), 16 * MIB);
        let hog = oom_killed(&cg, Path::new(env!("CARGO_BIN_EXE_memhog")), 8, 0);
        let v = explain_json(
            &[
                "--store",
                store.to_str().unwrap(),
                "--pid",
                &hog.pid().to_string(),
            ],
            |v| {
                v["kill"]["source"]
                    .as_str()
                    .is_some_and(|s| s.contains("kmsg"))
            },
        );
        let victim = &v["kill"]["victim"];
        // The victim allocated itself into the kill: its cgroup comes from
        // the kernel at the kill, and the kernel's report agrees.
        if victim["memcg"] != cg.path.as_str() || victim["memcg_source"] != "kernel" {
            wrong.push(format!(
                "{} {}: {}",
                victim["memcg"], victim["memcg_source"], cg.path
            ));
        }
    }
    let log = rec.stop();
    assert!(wrong.is_empty(), "placed in the wrong cgroup: {wrong:#?}");
    // Each cgroup was known from the kernel's cgroup_mkdir as it was
    // made, not from a walk of the hierarchy after its program came.
    let model = &summary_of(&log).expect("the recorder's summary")["summary"]["model"];
    assert!(
        model["memcgs_made"].as_u64() >= Some(20),
        "cgroups learnt as made: {model}"
    );
}

#[test]
fn a_process_whose_name_is_not_utf8_gets_its_own_cgroup() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    use std::os::unix::ffi::OsStrExt as _;
    let (dir, store) = (&sc.dir, sc.store.clone());
    let cg = TestCgroup::new("bytes", 64 * MIB);
    let rec = Recorder::on(&store).start();
    let link = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"bad\xff\xfename"));
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep");
    symlink(sleep, &link).unwrap();
    let mut cmd = cg.command(&link);
    cmd.arg("600");
    let mut p = Proc::spawn(cmd);
    std::thread::sleep(Duration::from_millis(500));
    sigkill(&mut p);
    let v = explain_pid(&store, p.pid());
    rec.stop();
    assert_eq!(v["kill"]["victim"]["memcg"], cg.path.as_str(), "{v}");
    assert!(
        v["kill"]["victim"]["comm"]
            .as_str()
            .unwrap()
            .starts_with("bad"),
        "{v}"
    );
}
