//! End-to-end test of `record --otlp`: a real OTLP/HTTP receiver (Python,
//! decoding with PyPI's opentelemetry-proto) gets a real memcg OOM kill in
//! a pod-shaped cgroup as a log record with its verdict and the pod's
//! names, and the metrics with the resource attributes; with the receiver
//! gone the recorder keeps recording and counts what was lost. Command
//! lines leave redacted, and not at all to a receiver another user runs.

use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tracer_e2e::{
    KubePod, Proc, Recorder, Scenario, TestCgroup, explain_json, kubelet_files, summary_of,
    tracer_bin, wait_for,
};

const MIB: u64 = 1 << 20;

/// The receiver: its child and every JSON line it printed.
struct Receiver {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    port: u16,
}

impl Receiver {
    fn start() -> Option<Self> {
        Self::start_as(None)
    }

    /// The receiver, run as `uid` when given.
    fn start_as(uid: Option<u32>) -> Option<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let python = root.join("../target/pytools/bin/python");
        if !python.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} missing: cargo xtask setup makes it",
                python.display()
            );
            eprintln!("skipped: no target/pytools (run cargo xtask setup)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(python);
        cmd.arg(root.join("py/otlp_receiver.py"))
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(uid) = uid {
            cmd.arg(uid.to_string());
        }
        let mut child = cmd.spawn().expect("start the OTLP receiver");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        let r = Self { child, lines, port };
        wait_for(Duration::from_secs(20), || {
            r.find(|v| v["signal"] == "listening")
        })
        .expect("the receiver listens");
        Some(r)
    }

    fn find(&self, f: impl Fn(&Value) -> bool) -> Option<Value> {
        self.lines.lock().unwrap().iter().find(|v| f(v)).cloned()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn oom_kill_in(cg: &TestCgroup) -> u32 {
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "8", "--interval-ms", "20"]);
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    pid
}

#[test]
fn kills_and_metrics_reach_an_otlp_receiver_and_a_dead_one_costs_counted_drops() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let store = sc.store.clone();
    let host = tempfile::tempdir().unwrap();
    let uid = format!("{:08x}-0715-4c6d-8e9f-0a1b2c3d4e5f", std::process::id());
    let id = "c7".repeat(32);
    let pod = KubePod {
        namespace: "ml-team",
        pod: "trainer-1",
        container: "worker",
    };
    kubelet_files(host.path(), pod, &uid, 0, &id);
    let url = receiver.url();
    let rec = Recorder::on(&store)
        .args(&[
            "--otlp",
            &url,
            "--otlp-interval",
            "1s",
            "--host-root",
            host.path().to_str().unwrap(),
        ])
        .start();
    assert!(rec.log().contains("otlp: sending to"), "{}", rec.log());
    let top = format!("tracer-e2e-otlp-{}", std::process::id());
    let cg = TestCgroup::in_pod(&top, &uid, &id, 48 * MIB);
    let pid = oom_kill_in(&cg);

    // The kill, as a log record with its verdict and the pod's names.
    let log = wait_for(Duration::from_secs(20), || {
        receiver.find(|v| {
            v["signal"] == "log"
                && v["event_name"] == "tracer.kill"
                && v["attributes"]["process.pid"] == pid
        })
    })
    .unwrap_or_else(|| panic!("no kill record for pid {pid}: {}", rec.log()));
    assert_eq!(log["content_type"], "application/x-protobuf");
    assert_eq!(log["severity"], "ERROR");
    let a = &log["attributes"];
    assert_eq!(a["process.executable.name"], "memhog", "{log}");
    assert_eq!(a["tracer.killer"], "kernel_oom", "{log}");
    assert_eq!(a["k8s.namespace.name"], "ml-team", "{log}");
    assert_eq!(a["k8s.pod.name"], "trainer-1", "{log}");
    assert_eq!(a["k8s.pod.uid"], uid.as_str(), "{log}");
    assert_eq!(a["k8s.container.name"], "worker", "{log}");
    assert_eq!(a["container.id"], id.as_str(), "{log}");
    assert!(
        a["tracer.verdict"].as_str().is_some_and(|v| !v.is_empty())
            && log["body"]
                .as_str()
                .is_some_and(|b| b.starts_with(&format!("memhog (pid {pid}) killed"))),
        "{log}"
    );
    let res = &log["resource"];
    assert_eq!(res["service.name"], "tracer", "{log}");
    assert!(
        res["host.name"].as_str().is_some_and(|h| !h.is_empty()),
        "{log}"
    );
    // The kill's metrics, pushed with the same resource and the pod's labels.
    let metric = wait_for(Duration::from_secs(20), || {
        receiver.find(|v| {
            v["signal"] == "metric"
                && v["name"] == "tracer_oom_kills"
                && v["attributes"]["pod"] == "trainer-1"
        })
    })
    .unwrap_or_else(|| panic!("no tracer_oom_kills for the pod: {}", rec.log()));
    assert_eq!(metric["kind"], "sum");
    assert_eq!(metric["monotonic"], true);
    assert_eq!(metric["value"], 1, "{metric}");
    assert_eq!(metric["attributes"]["namespace"], "ml-team");
    assert_eq!(metric["attributes"]["container"], "worker");
    assert_eq!(metric["resource"]["service.name"], "tracer");
    // The recorder's own counters come with each push once they have
    // counted something (an OTLP counter has no point before its first add).
    wait_for(Duration::from_secs(10), || {
        receiver
            .find(|v| v["signal"] == "metric" && v["name"] == "tracer_events" && v["kind"] == "sum")
    })
    .unwrap_or_else(|| panic!("no tracer_events sum: {}", rec.log()));

    // The receiver goes away: the recorder records on and counts the loss.
    drop(receiver);
    drop(cg);
    let cg2 = TestCgroup::new("otlp-dead", 48 * MIB);
    let pid2 = oom_kill_in(&cg2);
    let store_s = store.to_str().unwrap();
    let v = explain_json(&["--store", store_s, "--pid", &pid2.to_string()], |v| {
        v["kill"]["killer"]["kind"] == "kernel_oom"
    });
    assert_eq!(v["kill"]["victim"]["pid"], pid2);
    // Let the batch processor try it (and fail).
    std::thread::sleep(Duration::from_secs(3));
    let log = rec.stop();
    let summary = summary_of(&log).unwrap_or_else(|| panic!("no summary: {log}"));
    let drops = summary["summary"]["export_drops"]
        .as_array()
        .unwrap_or_else(|| panic!("{summary}"));
    let otlp = drops
        .iter()
        .find(|d| d[0] == "otlp")
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        otlp[1].as_u64() >= Some(1),
        "the lost kill is counted: {summary}\n{log}"
    );
    assert!(
        log.contains("otlp: http://127.0.0.1:") && log.contains("did not take"),
        "{log}"
    );
}

#[test]
fn bad_otlp_urls_are_refused_before_anything_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.db");
    for bad in [
        "127.0.0.1:4318",
        "https://collector:4318",
        "http://host:port",
    ] {
        let out = Command::new(tracer_bin())
            .args(["record", "--store", store.to_str().unwrap(), "--otlp", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--otlp {bad}: not an http:// URL")),
            "{bad}: {err}"
        );
        assert!(!store.exists(), "nothing was started for {bad}");
    }
}

/// A victim whose command line carries secrets: python3 growing its
/// memory in `cg` until the kernel kills it. Returns its pid.
fn oom_kill_with_secrets_in(cg: &TestCgroup) -> u32 {
    let mut cmd = cg.command("python3");
    cmd.args([
        "-c",
        "import time\nb = []\nwhile True:\n    b.append(b'x' * (8 << 20))\n    time.sleep(0.02)",
        "--db-password=hunter2",
        "postgres://app:s3cr3t@db/prod",
    ]);
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    pid
}

/// The receiver's log record of the kill of `pid`.
fn kill_record(receiver: &Receiver, pid: u32) -> Value {
    wait_for(Duration::from_secs(20), || {
        receiver.find(|v| {
            v["event_name"] == "tracer.kill" && v["attributes"]["process.pid"] == i64::from(pid)
        })
    })
    .unwrap_or_else(|| panic!("no kill record of pid {pid}"))
}

#[test]
fn an_unprivileged_receiver_on_loopback_gets_kills_without_command_lines() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(receiver) = Receiver::start_as(Some(65534)) else {
        return;
    };
    let dir = &sc.dir;
    let rec = Recorder::on(&dir.path().join("t.db"))
        .args(&["--otlp", &receiver.url(), "--no-redact"])
        .start();
    let cg = TestCgroup::new("otlp-nobody", 64 * MIB);
    let pid = oom_kill_with_secrets_in(&cg);
    let log = kill_record(&receiver, pid);
    assert!(
        log["attributes"].get("process.command_line").is_none(),
        "{log}"
    );
    let all = receiver.lines.lock().unwrap().clone();
    let text = serde_json::to_string(&all).unwrap();
    assert!(
        !text.contains("hunter2") && !text.contains("s3cr3t"),
        "{text}"
    );
    assert!(
        rec.log().contains("belongs to uid 65534, not root"),
        "{}",
        rec.log()
    );
}

#[test]
fn command_lines_leave_redacted_and_the_store_keeps_them_whole() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let (dir, store) = (&sc.dir, sc.store.clone());
    let jsonl = dir.path().join("kills.jsonl");
    let rec = Recorder::on(&store)
        .args(&[
            "--otlp",
            &receiver.url(),
            "--export-jsonl",
            jsonl.to_str().unwrap(),
        ])
        .start();
    let cg = TestCgroup::new("otlp-redact", 64 * MIB);
    let pid = oom_kill_with_secrets_in(&cg);
    let want = "--db-password=*** postgres://app:***@db/prod";
    let log = kill_record(&receiver, pid);
    let line = log["attributes"]["process.command_line"]
        .as_str()
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.ends_with(want), "{line}");
    let exported = wait_for(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&jsonl).ok()?;
        let line = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["record"]["victim"]["pid"] == pid)?;
        Some((text, line))
    });
    let (exported, line) = exported.expect("the kill in the JSON lines");
    let cmdline = line["record"]["victim"]["cmdline"]
        .as_str()
        .unwrap_or_default();
    assert!(cmdline.ends_with(want), "{line}");
    drop(rec);
    for text in [
        serde_json::to_string(&*receiver.lines.lock().unwrap()).unwrap(),
        exported,
    ] {
        assert!(
            !text.contains("hunter2") && !text.contains("s3cr3t"),
            "{text}"
        );
    }
    // The store keeps the whole line; the report shows it redacted unless
    // told otherwise.
    let c = rusqlite::Connection::open(&store).unwrap();
    let stored: String = c
        .query_row("SELECT record FROM kills WHERE pid = ?1", [pid], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(stored.contains("--db-password=hunter2"), "{stored}");
    let html = dir.path().join("r.html");
    for (extra, hidden) in [(None, true), (Some("--no-redact"), false)] {
        let mut cmd = Command::new(tracer_bin());
        cmd.args(["report", "--store", store.to_str().unwrap(), "--html"])
            .arg(&html)
            .args(["--pid", &pid.to_string()])
            .args(extra);
        assert!(cmd.status().unwrap().success());
        let page = std::fs::read_to_string(&html).unwrap();
        assert_eq!(!page.contains("hunter2"), hidden, "{extra:?}");
        assert_eq!(page.contains("--db-password=***"), hidden, "{extra:?}");
    }
}

#[test]
fn a_collector_that_drips_its_answers_never_holds_up_the_stop() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    // Accepts, reads the request, then answers one byte a second.
    let drip = r#"
import socket, sys, threading, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(16)
print(srv.getsockname()[1], flush=True)
def serve(c):
    try:
        c.recv(65536)
        for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
            c.send(bytes([b]))
            time.sleep(1)
    except OSError:
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;
    let mut collector = Command::new("python3")
        .arg("-c")
        .arg(drip)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(collector.stdout.as_mut().unwrap())
        .read_line(&mut port)
        .unwrap();
    let url = format!("http://127.0.0.1:{}", port.trim());
    let dir = &sc.dir;
    let rec = Recorder::on(&dir.path().join("t.db"))
        .args(&["--otlp", &url, "--otlp-interval", "1s"])
        .start();
    let cg = TestCgroup::new("otlp-drip", 48 * MIB);
    oom_kill_in(&cg);
    // The kill's record and a metrics push are on their way by now.
    std::thread::sleep(Duration::from_millis(1500));
    let stop = rec.terminate_timed();
    let _ = collector.kill();
    let _ = collector.wait();
    eprintln!("stop with a dripping collector: {stop:?}");
    assert!(stop < Duration::from_secs(2), "stop took {stop:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        rec.log()
            .contains("exporter otlp: its destination is too slow"),
        "the slow collector is said: {}",
        rec.log()
    );
}
