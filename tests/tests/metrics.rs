//! End-to-end tests of the metrics endpoint (`record --metrics`): a real
//! memcg OOM kill counted once it is durable, the count surviving a
//! recorder restart, the exposition checked by Debian's `promtool`, bad
//! addresses refused clearly, and the endpoint against hostile clients.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use tracer_e2e::{
    KubePod, Proc, Recorder, Scenario, TestCgroup, kubelet_files, tracer, tracer_bin, tracer_json,
    wait_for,
};

const MIB: u64 = 1 << 20;

const POD: KubePod = KubePod {
    namespace: "ml-team",
    pod: "trainer-0",
    container: "worker",
};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET /metrics` (OpenMetrics when `openmetrics`, as
/// Prometheus asks; the Prometheus text format otherwise), or None when
/// nothing answers.
fn get(port: u16, openmetrics: bool) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = if openmetrics {
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
    } else {
        ""
    };
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: localhost\r\n{accept}\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    let want = if openmetrics {
        "content-type: application/openmetrics-text"
    } else {
        "content-type: text/plain; version=0.0.4"
    };
    assert!(head.to_ascii_lowercase().contains(want), "{head}");
    if openmetrics {
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
    Some(body.to_string())
}

fn scrape(port: u16) -> Option<String> {
    get(port, true)
}

/// Debian's promtool, unpacked by `cargo xtask setup`.
fn promtool() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/prometheus/root/usr/bin/promtool");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} missing: cargo xtask setup unpacks it",
        p.display()
    );
    eprintln!("skipped: no promtool (run cargo xtask setup)");
    None
}

/// `promtool check metrics` (its parser and lint rules) passes on `body`.
fn promtool_check_metrics(promtool: &Path, body: &str) {
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A real Prometheus server (Debian's, unpacked by `cargo xtask setup`)
/// scraping `target` every second, on loopback; stopped when dropped.
struct PromServer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PromServer {
    fn start(target: &str) -> Self {
        let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/prometheus/root/usr/bin/prometheus");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tracer\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    /// Prometheus's answer to an instant query: its status and error.
    fn check(&self, promql: &str) -> Option<(String, String)> {
        let v = self.get(promql)?;
        Some((
            v["status"].as_str().unwrap_or("").to_string(),
            v["error"].as_str().unwrap_or("").to_string(),
        ))
    }

    /// The values of an instant PromQL query, as (labels JSON, value).
    fn query(&self, promql: &str) -> Option<Vec<(serde_json::Value, String)>> {
        let v = self.get(promql)?;
        Some(
            v["data"]["result"]
                .as_array()?
                .iter()
                .map(|r| {
                    (
                        r["metric"].clone(),
                        r["value"][1].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect(),
        )
    }

    fn get(&self, promql: &str) -> Option<serde_json::Value> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let q: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        s.write_all(
            format!("GET /api/v1/query?query={q} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes(),
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (_, body) = out.split_once("\r\n\r\n")?;
        serde_json::from_str(body).ok()
    }
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kill_line(body: &str, cgroup: &str) -> Option<String> {
    body.lines()
        .find(|l| {
            l.starts_with("tracer_kills_total{")
                && l.contains(&format!("cgroup=\"{cgroup}\""))
                && l.contains("killer=\"kernel_oom\"")
        })
        .map(String::from)
}

#[test]
fn a_kill_is_counted_once_durable_scraped_by_prometheus_and_kept_across_a_restart() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(promtool) = promtool() else { return };
    let store = sc.store.clone();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let rec = Recorder::on(&store).args(&["--metrics", &addr]).start();
    assert!(
        rec.log()
            .contains(&format!("metrics at http://{addr}/metrics")),
        "{}",
        rec.log()
    );
    let before = scrape(port).expect("the endpoint answers");
    assert!(before.contains("tracer_build_info{version="), "{before}");
    let cg = TestCgroup::new("metrics", 48 * MIB);
    assert!(kill_line(&before, &cg.path).is_none());
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "8", "--interval-ms", "20"]);
    let mut hog = Proc::spawn(cmd);
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    let line = wait_for(Duration::from_secs(10), || {
        kill_line(&scrape(port)?, &cg.path)
    })
    .unwrap_or_else(|| panic!("no kill series for {}: {:?}", cg.path, scrape(port)));
    assert!(line.contains("constraint=\"memcg\""), "{line}");
    assert!(line.ends_with(" 1"), "{line}");
    let body = get(port, false).unwrap();
    // The shipped alert fires on this time (a series is born at 1, where
    // increase() sees nothing): it is the kill's wall time, now.
    let at: f64 = body
        .lines()
        .find(|l| l.starts_with("tracer_last_oom_kill_timestamp_seconds{") && l.contains(&cg.path))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no kill time for {}: {body}", cg.path));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (0.0..60.0).contains(&(now - at)),
        "the kill's time {at} is not within a minute before now {now}"
    );
    assert!(body.contains("tracer_events_total "), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("tracer_oom_kills_total{")
                && l.contains(&format!("cgroup=\"{}\"", cg.path))
                && l.contains("constraint=\"memcg\"")
                && l.ends_with(" 1")),
        "{body}"
    );
    let committed: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("tracer_kill_commit_latency_seconds_count "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no commit latency histogram: {body}"));
    assert!(
        committed >= 1,
        "the kill's commit latency is counted: {body}"
    );
    // promtool's own parser and lint rules on a live scrape.
    promtool_check_metrics(&promtool, &body);
    // A real Prometheus server scrapes it, and PromQL finds the kill.
    let prom = PromServer::start(&addr);
    let promql = format!(
        "tracer_kills_total{{killer=\"kernel_oom\",constraint=\"memcg\",cgroup=\"{}\"}}",
        cg.path
    );
    let found = wait_for(Duration::from_secs(30), || {
        prom.query(&promql).filter(|r| !r.is_empty())
    })
    .unwrap_or_else(|| panic!("Prometheus never had {promql}: up = {:?}", prom.query("up")));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, "1", "{found:?}");
    assert_eq!(found[0].0["job"], "tracer");
    let up = prom.query("up{job=\"tracer\"}").unwrap();
    assert_eq!(up[0].1, "1", "{up:?}");
    drop(prom);
    rec.stop();
    // A new recorder on the same store starts from the kills it holds.
    let port2 = free_port();
    let addr2 = format!("127.0.0.1:{port2}");
    let rec = Recorder::on(&store).args(&["--metrics", &addr2]).start();
    let again = scrape(port2).expect("the endpoint answers");
    let line2 = kill_line(&again, &cg.path).unwrap_or_else(|| panic!("{again}"));
    assert!(line2.ends_with(" 1"), "{line2}");
    rec.stop();
}

/// A memhog OOM-killed in `cg`.
fn oom_kill_in(cg: &TestCgroup) {
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "8", "--interval-ms", "20"]);
    let mut hog = Proc::spawn(cmd);
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
}

#[test]
fn a_pods_kill_is_named_and_counted_by_pod_and_container_across_a_replaced_container() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(_) = promtool() else { return };
    let store = sc.store.clone();
    let host = tempfile::tempdir().unwrap();
    let host_root = host.path().to_str().unwrap();
    let uid = format!("{:08x}-5e1f-4c6d-8e9f-0a1b2c3d4e5f", std::process::id());
    let top = format!("tracer-e2e-pod-{}", std::process::id());
    let (id1, id2) = ("a1".repeat(32), "b2".repeat(32));
    kubelet_files(host.path(), POD, &uid, 0, &id1);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let rec = Recorder::on(&store)
        .args(&["--metrics", &addr, "--host-root", host_root])
        .start();
    let cg = TestCgroup::in_pod(&top, &uid, &id1, 48 * MIB);
    let pod_cgroup = format!("/{top}/kubepods/burstable/pod{uid}");
    oom_kill_in(&cg);
    let series = |body: &str| {
        body.lines()
            .find(|l| {
                l.starts_with("tracer_oom_kills_total{")
                    && l.contains("namespace=\"ml-team\",pod=\"trainer-0\",container=\"worker\"")
            })
            .map(String::from)
    };
    let line = wait_for(Duration::from_secs(10), || series(&scrape(port)?))
        .unwrap_or_else(|| panic!("no named kill series: {:?}", scrape(port)));
    assert!(
        line.contains(&format!("cgroup=\"{pod_cgroup}\"")) && line.ends_with(" 1"),
        "counted in its pod's cgroup: {line}"
    );
    // A real Prometheus joins on the names.
    let prom = PromServer::start(&addr);
    let promql =
        "tracer_oom_kills_total{namespace=\"ml-team\",pod=\"trainer-0\",container=\"worker\"}";
    let found = wait_for(Duration::from_secs(30), || {
        prom.query(promql).filter(|r| !r.is_empty())
    })
    .unwrap_or_else(|| panic!("Prometheus never had {promql}: up = {:?}", prom.query("up")));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, "1", "{found:?}");
    drop(prom);
    rec.stop();
    // The container is replaced (a new id and cgroup in the same pod);
    // the recorder restarts meanwhile: the series goes on counting.
    drop(cg);
    kubelet_files(host.path(), POD, &uid, 1, &id2);
    let port2 = free_port();
    let addr2 = format!("127.0.0.1:{port2}");
    let rec = Recorder::on(&store)
        .args(&["--metrics", &addr2, "--host-root", host_root])
        .start();
    let again = series(&scrape(port2).expect("the endpoint answers"))
        .unwrap_or_else(|| panic!("the series is restored from the store"));
    assert!(again.ends_with(" 1"), "{again}");
    let cg2 = TestCgroup::in_pod(&top, &uid, &id2, 48 * MIB);
    // `top` names the pod's processes too.
    let _sleeper = top_names_the_worker(&cg2, host_root, &id2);
    oom_kill_in(&cg2);
    let line2 = wait_for(Duration::from_secs(10), || {
        series(&scrape(port2)?).filter(|l| l.ends_with(" 2"))
    })
    .unwrap_or_else(|| {
        panic!(
            "the replaced container's kill counts in the same series: {:?}",
            scrape(port2)
        )
    });
    assert!(
        line2.contains(&format!("cgroup=\"{pod_cgroup}\"")),
        "{line2}"
    );
    rec.stop();
    // The pod is gone from the node; its kills still say whose they were.
    drop(cg2);
    std::fs::remove_dir_all(host.path().join("var")).unwrap();
    let all = tracer_json(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--all",
        "--format",
        "json",
    ]);
    let kills = all.as_array().unwrap_or_else(|| panic!("{all}"));
    // Only this test's pod (Prometheus, stopped by SIGKILL, is a kill
    // too, and the kernel log holds earlier runs' kills).
    let mut ids: Vec<&str> = kills
        .iter()
        .filter(|e| {
            e["kill"]["victim"]["memcg"]
                .as_str()
                .is_some_and(|m| m.starts_with(&pod_cgroup))
        })
        .map(|e| {
            let o = &e["kill"]["victim"]["owner"];
            assert_eq!(o["kube"]["namespace"], "ml-team", "{e}");
            assert_eq!(o["kube"]["pod"], "trainer-0", "{e}");
            assert_eq!(o["kube"]["container"], "worker", "{e}");
            o["container_id"].as_str().unwrap_or_else(|| panic!("{e}"))
        })
        .collect();
    ids.sort();
    assert_eq!(ids, [id1.as_str(), id2.as_str()]);
    let text = Command::new(tracer_bin())
        .args(["explain", "--store", store.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("pod        trainer-0 in namespace ml-team, container worker"),
        "{text}"
    );
}

/// kubelet's systemd cgroup driver (kubeadm's default since 1.22, and the
/// one for cgroup v2) names a pod's cgroup after its uid with `_` for `-`,
/// in slices, and a container's after its runtime and id, in a scope. A
/// live kill there, and `top`'s row of a process there, are named by pod
/// and container as under the cgroupfs driver. Both cgroup versions.
#[test]
fn a_pod_under_the_systemd_drivers_slices_is_named_by_pod_and_container() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let host = tempfile::tempdir().unwrap();
    let host_root = host.path().to_str().unwrap();
    let uid = format!("{:08x}-7a2b-4c6d-8e9f-0a1b2c3d4e5f", std::process::id());
    let top = format!("tracer-e2e-sdpod-{}", std::process::id());
    let id = "c3".repeat(32);
    kubelet_files(host.path(), POD, &uid, 0, &id);
    let rec = Recorder::on(&store)
        .args(&["--host-root", host_root])
        .start();
    let cg = TestCgroup::in_systemd_pod(&top, &uid, &id, 48 * MIB);
    let pod_cgroup = format!(
        "/{top}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        uid.replace('-', "_")
    );
    assert_eq!(cg.path, format!("{pod_cgroup}/cri-containerd-{id}.scope"));
    drop(top_names_the_worker(&cg, host_root, &id));
    oom_kill_in(&cg);
    rec.stop();
    let all = tracer_json(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--all",
        "--format",
        "json",
    ]);
    // The sleeper's SIGKILL (ended by the test) and the OOM kill.
    let kills: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap_or_else(|| panic!("{all}"))
        .iter()
        .filter(|e| e["kill"]["victim"]["memcg"] == cg.path.as_str())
        .collect();
    let comms: Vec<&str> = kills
        .iter()
        .filter_map(|e| e["kill"]["victim"]["comm"].as_str())
        .collect();
    assert!(comms.contains(&"memhog"), "{all:#}");
    for e in kills {
        let o = &e["kill"]["victim"]["owner"];
        assert_eq!(o["kube"]["namespace"], "ml-team", "{o}");
        assert_eq!(o["kube"]["pod"], "trainer-0", "{o}");
        assert_eq!(o["kube"]["container"], "worker", "{o}");
        assert_eq!(o["container_id"], id.as_str(), "{o}");
        assert_eq!(o["runtime"], "containerd", "{o}");
        // The slice's `_` are the uid's `-` again.
        assert_eq!(o["pod_uid"], uid.as_str(), "{o}");
        assert_eq!(o["qos"], "Burstable", "{o}");
    }
}

/// Starts a sleeper in `cg` and checks that `top --once --json` names it
/// as [`POD`]'s worker in containerd's container `id` (pods named from
/// `host_root`); returns the sleeper.
fn top_names_the_worker(cg: &TestCgroup, host_root: &str, id: &str) -> Proc {
    let mut sleeper = cg.command("sleep");
    sleeper.arg("120");
    let sleeper = Proc::spawn(sleeper);
    let rows = tracer(&[
        "top",
        "--once",
        "--json",
        "--store",
        "/nonexistent/t.db",
        "--host-root",
        host_root,
    ]);
    let rows = String::from_utf8_lossy(&rows.stdout);
    let row = rows
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["pid"] == sleeper.pid())
        .unwrap_or_else(|| panic!("no row of pid {}: {rows}", sleeper.pid()));
    assert_eq!(
        row["container"],
        format!("ml-team/trainer-0/worker (containerd {})", &id[..12]),
        "{row}"
    );
    sleeper
}

/// Runs `tracer record` with `extra`; it must fail within 60 s.
fn record_fails(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.db");
    let mut child = Command::new(tracer_bin())
        .arg("record")
        .arg("--store")
        .arg(&store)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tracer record");
    let status = wait_for(Duration::from_secs(60), || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("tracer record {extra:?} did not fail");
    }
    assert!(!status.unwrap().success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

#[test]
fn bad_metrics_addresses_are_refused_clearly() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let err = record_fails(&["--metrics", "0.0.0.0:9464"]);
    assert!(err.contains("--metrics-token-file"), "{err}");
    let err = record_fails(&[
        "--metrics",
        "0.0.0.0:9464",
        "--metrics-token-file",
        "/nonexistent/token",
    ]);
    assert!(
        err.contains("--metrics-token-file /nonexistent/token"),
        "{err}"
    );
}

#[test]
fn gpu_memory_per_device_and_container_with_the_simulated_nvml() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let env = vec![
        (
            "SIMCUDA_STATE",
            sc.dir.path().join("gpu.state").display().to_string(),
        ),
        ("SIMCUDA_DEVICE_MEM", (4096 * MIB).to_string()),
        ("SIMNVML_CONTEXT_BYTES", (300 * MIB).to_string()),
    ];
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let nvml = tracer_e2e::simcuda_dir().join("libnvidia-ml.so.1");
    let rec = Recorder::on(&store)
        .args(&[
            "--cuda",
            "--nvml-lib",
            nvml.to_str().unwrap(),
            "--metrics",
            &addr,
        ])
        .envs(&env)
        .start();
    let cg = TestCgroup::new("metricsgpu", 1024 * MIB);
    let d = tracer_e2e::simcuda_dir();
    let mut cmd = cg.command(d.join("cudaload"));
    cmd.arg(d.join("libcudart.so.12"))
        .arg(d.join("libcuda.so.1"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let mut target = tracer_e2e::CudaLoad::spawn(cmd);
    wait_for(Duration::from_secs(15), || {
        let log = rec.log();
        (log.contains("CUDA: attached to") && log.contains("libcudart.so.12")).then_some(())
    })
    .unwrap_or_else(|| panic!("CUDA never attached: {}", rec.log()));
    target.ok("setdevice 0");
    target.ok("malloc 268435456");
    let series = |body: &str, name: &str, extra: &str| -> Option<f64> {
        body.lines()
            .find(|l| l.starts_with(&format!("{name}{{gpu=\"0\"")) && l.contains(extra))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    let container = format!("container=\"{}\"", cg.path);
    let body = wait_for(Duration::from_secs(15), || {
        let b = scrape(port)?;
        (series(&b, "tracer_gpu_container_traced_bytes", &container) == Some(268435456.0))
            .then_some(b)
    })
    .unwrap_or_else(|| panic!("no traced bytes for {}: {:?}", cg.path, scrape(port)));
    assert_eq!(
        series(&body, "tracer_gpu_container_memory_bytes", &container),
        Some((256 + 300) as f64 * MIB as f64),
        "{body}"
    );
    assert_eq!(
        series(&body, "tracer_gpu_memory_total_bytes", ""),
        Some(4096.0 * MIB as f64)
    );
    assert_eq!(
        series(&body, "tracer_gpu_memory_reserved_bytes", ""),
        Some(512.0 * MIB as f64),
        "the simulated driver reserves 512 MiB: {body}"
    );
    assert_eq!(
        series(&body, "tracer_gpu_memory_untraced_bytes", ""),
        Some(300.0 * MIB as f64),
        "the context NVML charges and no call accounts for: {body}"
    );
    // Pinned host memory, per container (charged to its memory cgroup).
    target.ok("host 8388608");
    let pinned = format!(
        "tracer_gpu_container_pinned_host_bytes{{namespace=\"\",pod=\"\",{container}}} 8388608.0"
    );
    wait_for(Duration::from_secs(10), || {
        scrape(port)?.lines().any(|l| l == pinned).then_some(())
    })
    .unwrap_or_else(|| panic!("no {pinned}: {:?}", scrape(port)));
    // A failed allocation is counted by function and error.
    assert_eq!(target.cmd("malloc 17179869184"), "err 2");
    let failures = wait_for(Duration::from_secs(10), || {
        scrape(port)?
            .lines()
            .find(|l| {
                l.starts_with(
                    "tracer_cuda_allocation_failures_total{function=\"cudaMalloc\",error=\"2\"}",
                )
            })
            .map(String::from)
    })
    .expect("the failure is counted");
    assert!(failures.ends_with(" 1"), "{failures}");
    target.exit();
    rec.stop();
}

#[test]
fn the_shipped_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = promtool() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    for args in [
        &["check", "rules", "tracer-rules.yml"][..],
        &["test", "rules", "tracer-rules.test.yml"][..],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_containers_memory_cgroup_is_a_series_and_a_plain_cgroup_is_not() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    const ID: &str = "cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333";
    let store = sc.store.clone();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let ctr = TestCgroup::container(ID, 96 * MIB);
    let plain = TestCgroup::new("metricsplain", 96 * MIB);
    // Its growth armed by name: the gauge says its page faults are sampled.
    let rec = Recorder::on(&store)
        .args(&["--metrics", &addr, "--growth-cgroup", &ctr.path])
        .start();
    let mut procs = Vec::new();
    for cg in [&ctr, &plain] {
        let mut cmd = cg.command("sleep");
        cmd.arg("60");
        procs.push(Proc::spawn(cmd));
    }
    let label = format!("cgroup=\"{}\"", ctr.path);
    let body = wait_for(Duration::from_secs(15), || {
        let b = scrape(port)?;
        b.lines()
            .any(|l| l.starts_with("tracer_memcg_limit_bytes{") && l.contains(&label))
            .then_some(b)
    })
    .unwrap_or_else(|| panic!("no series for {}: {:?}", ctr.path, scrape(port)));
    let limit = body
        .lines()
        .find(|l| l.starts_with("tracer_memcg_limit_bytes{") && l.contains(&label))
        .unwrap();
    assert!(
        limit.contains("container=\"docker cccc3333cccc\""),
        "{limit}"
    );
    assert!(limit.ends_with(&format!(" {}.0", 96 * MIB)), "{limit}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("tracer_memcg_usage_bytes{") && l.contains(&label)),
        "{body}"
    );
    assert!(
        !body.contains(&plain.path),
        "a cgroup of no container has no series: {body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("tracer_memcg_growth_armed{")
                && l.contains(&label)
                && l.ends_with(" 1.0")),
        "{body}"
    );
    drop(procs);
    rec.stop();
}

#[test]
fn every_dashboard_query_is_valid_promql_to_a_real_prometheus() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    if promtool().is_none() {
        return;
    }
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/tracer.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    for a in dash["annotations"]["list"].as_array().unwrap() {
        exprs.push(a["expr"].as_str().unwrap().to_string());
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    // Nothing to scrape: the queries are only parsed and evaluated.
    let prom = PromServer::start("127.0.0.1:1");
    for e in &exprs {
        // Grafana's interval variable, as Grafana would fill it in.
        let q = e.replace("$__rate_interval", "1m");
        let (status, error) = wait_for(Duration::from_secs(30), || prom.check(&q))
            .unwrap_or_else(|| panic!("Prometheus did not answer for {q}"));
        assert_eq!(status, "success", "{q}: {error}");
    }
    // And a broken one is refused, so the check means something.
    let (status, _) = prom.check("sum by (x (tracer_events_total)").unwrap();
    assert_eq!(status, "error");
}

// The endpoint against hostile clients (issue: a metrics endpoint no
// client can wedge). Each attack runs as uid 65534, as any local user
// could, from Debian's python3.

/// `GET path` with extra header lines: the status code and the body, or
/// None when nothing answers within 5 s.
fn request(port: u16, path: &str, headers: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{headers}\r\n").as_bytes())
        .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let out = String::from_utf8_lossy(&out).to_string();
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// A python3 program run as uid 65534 with `args`; its stdout is piped.
fn as_nobody(program: &str, args: &[String]) -> std::process::Child {
    use std::os::unix::process::CommandExt as _;
    Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 as uid 65534")
}

/// A field of /proc/PID/status, in its unit (kB for memory).
fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} for pid {pid}"))
}

/// A self-metric of the endpoint from a scrape.
fn self_metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

/// Reads one line of the child's stdout.
fn line_of(child: &mut std::process::Child) -> String {
    use std::io::BufRead as _;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

/// A recorder with its store in `dir`, serving metrics on a free loopback
/// port, and the port.
fn with_metrics(dir: &Path) -> (Recorder, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    (
        Recorder::on(&dir.join("t.db"))
            .args(&["--metrics", &addr])
            .start(),
        port,
    )
}

#[test]
fn an_endless_request_header_is_cut_off_and_grows_nothing() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let (rec, port) = with_metrics(dir.path());
    assert!(scrape(port).is_some());
    let rss_before = status_field(rec.pid(), "VmRSS:");
    // 256 MiB of one header, sent as fast as the server takes it.
    let client = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Endless: ")
sent, chunk = 0, b"a" * 65536
try:
    while sent < 256 << 20:
        s.sendall(chunk)
        sent += len(chunk)
    print("not cut", sent)
except OSError as e:
    print("cut", sent)
"#;
    let out = as_nobody(client, &[port.to_string()])
        .wait_with_output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let sent: u64 = said
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}{}", String::from_utf8_lossy(&out.stderr)));
    assert!(said.starts_with("cut "), "{said}");
    let rss_after = status_field(rec.pid(), "VmRSS:");
    eprintln!(
        "endless header: cut after {} KiB sent (socket buffers included); recorder RSS {rss_before} -> {rss_after} kB",
        sent >> 10
    );
    assert!(sent < 16 << 20, "{sent} bytes taken before the cut");
    assert!(
        rss_after < rss_before + 4096,
        "RSS {rss_before} -> {rss_after} kB"
    );
    assert!(scrape(port).is_some(), "the endpoint still answers");
    rec.stop();
}

#[test]
fn two_thousand_idle_connections_take_no_thread_and_scrapes_come_back() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let (rec, port) = with_metrics(dir.path());
    assert!(scrape(port).is_some());
    let pid = rec.pid();
    let threads = status_field(pid, "Threads:");
    // Leave the recorder 32 file descriptors more than it holds, fewer
    // than the connections it serves at once: accepts fail too.
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let lim = open + 32;
    let st = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={lim}:{lim}")])
        .status()
        .expect("util-linux prlimit");
    assert!(st.success());
    let client = r#"
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held, end = [], time.monotonic() + 10
while len(held) < 2000 and time.monotonic() < end:
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(float(sys.argv[2]))
"#;
    let mut attacker = as_nobody(client, &[port.to_string(), "25".into()]);
    let held = line_of(&mut attacker);
    let during = status_field(pid, "Threads:");
    // While the attacker holds its sockets, the idle ones are closed at
    // the head timeout and a scrape gets through.
    let t0 = std::time::Instant::now();
    let body = wait_for(Duration::from_secs(20), || scrape(port))
        .unwrap_or_else(|| panic!("no scrape while {held} idle connections are held"));
    let waited = t0.elapsed();
    let _ = attacker.kill();
    let _ = attacker.wait();
    let refused = self_metric(&body, "tracer_metrics_connections_refused_total");
    let accept_errors = self_metric(&body, "tracer_metrics_accept_errors_total");
    eprintln!(
        "idle connections: {} held by the attacker; recorder threads {threads} -> {during}; a scrape answered after {waited:?}; {refused} refused at the cap, {accept_errors} failed accepts (fd limit {lim})",
        held.trim()
    );
    assert!(held.trim().parse::<u32>().unwrap() >= 100, "{held}");
    assert!(during <= threads + 1, "threads {threads} -> {during}");
    assert!(refused + accept_errors > 0, "{body}");
    assert!(
        scrape(port).is_some(),
        "the endpoint answers after the attack"
    );
    assert!(
        rec.terminate_timed() < Duration::from_secs(2),
        "stop after the attack"
    );
}

#[test]
fn a_client_that_never_reads_blocks_no_scrape_and_no_stop() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    let (rec, port) = with_metrics(dir.path());
    assert!(scrape(port).is_some());
    // Thousands of pipelined requests, answers never read.
    let client = r#"
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setblocking(False)
req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 5000
sent = 0
try:
    while sent < len(req):
        sent += s.send(req[sent:])
except BlockingIOError:
    pass
print(sent, flush=True)
time.sleep(60)
"#;
    let mut attacker = as_nobody(client, &[port.to_string()]);
    let sent = line_of(&mut attacker);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = std::time::Instant::now();
    assert!(scrape(port).is_some(), "a scrape beside the stuck client");
    assert!(
        request(port, "/healthz", "").map(|r| r.0) == Some(200),
        "healthz"
    );
    let scraped = t0.elapsed();
    let stop = rec.terminate_timed();
    let _ = attacker.kill();
    let _ = attacker.wait();
    eprintln!(
        "never-reading client ({} bytes of requests sent): scrape and healthz in {scraped:?}, stop in {stop:?}",
        sent.trim()
    );
    assert!(scraped < Duration::from_secs(2), "{scraped:?}");
    assert!(stop < Duration::from_secs(2), "stop took {stop:?}");
}

#[test]
fn a_port_taken_before_start_is_retried_while_recording_goes_on() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let squatter = r#"
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
print("bound", flush=True)
sys.stdin.read()
"#;
    let mut squat = {
        use std::os::unix::process::CommandExt as _;
        Command::new("python3")
            .arg("-c")
            .arg(squatter)
            .arg(port.to_string())
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    assert_eq!(line_of(&mut squat).trim(), "bound");
    let rec = Recorder::on(&store).args(&["--metrics", &addr]).start();
    assert!(
        rec.log()
            .contains(&format!("--metrics {addr}: cannot listen there")),
        "{}",
        rec.log()
    );
    // It records meanwhile.
    let cg = TestCgroup::new("taken-port", 48 * MIB);
    oom_kill_in(&cg);
    let stored = wait_for(Duration::from_secs(10), || {
        let c = rusqlite::Connection::open_with_flags(
            &store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .ok()?;
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM kills WHERE instr(record, ?1) > 0",
                [&cg.path],
                |r| r.get(0),
            )
            .ok()?;
        (n > 0).then_some(())
    });
    assert!(
        stored.is_some(),
        "the kill is stored while the port is taken"
    );
    drop(squat.stdin.take());
    let _ = squat.wait();
    let t0 = std::time::Instant::now();
    let body = wait_for(Duration::from_secs(15), || scrape(port))
        .expect("the endpoint listens once the port is free");
    eprintln!("taken port: served {:?} after it was freed", t0.elapsed());
    assert!(kill_line(&body, &cg.path).is_some(), "{body}");
    assert!(self_metric(&body, "tracer_metrics_bind_failures_total") >= 1);
    rec.stop();
}

#[test]
fn a_hostile_cgroup_name_keeps_every_scrape_valid() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(promtool) = promtool() else { return };
    let dir = &sc.dir;
    let (rec, port) = with_metrics(dir.path());
    let cg = TestCgroup::new("q\"b\\s} 1 x{", 48 * MIB);
    oom_kill_in(&cg);
    let escaped = cg.path.replace('\\', "\\\\").replace('"', "\\\"");
    for openmetrics in [true, false] {
        let body = wait_for(Duration::from_secs(10), || {
            get(port, openmetrics).filter(|b| kill_line(b, &escaped).is_some())
        })
        .unwrap_or_else(|| {
            panic!(
                "no escaped series for {}: {:?}",
                cg.path,
                get(port, openmetrics)
            )
        });
        // Nothing of the name leaks out of its label value.
        assert!(!body.lines().any(|l| l.starts_with(" 1 x{")), "{body}");
        if openmetrics {
            // promtool reads the Prometheus text format only.
            continue;
        }
        promtool_check_metrics(&promtool, &body);
    }
    rec.stop();
}

/// The DaemonSet's `--NAME=VALUE` argument.
fn daemonset_arg(name: &str) -> String {
    let ds = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/daemonset.yaml"),
    )
    .unwrap();
    ds.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("- --{name}="))
                .map(String::from)
        })
        .unwrap_or_else(|| panic!("the DaemonSet has no --{name}"))
}

#[test]
fn remote_scraping_as_the_daemonset_ships_it_needs_the_token() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let dir = &sc.dir;
    // The shipped listen address (all addresses), on a free port, and a
    // token file like the Secret the DaemonSet mounts.
    let shipped = daemonset_arg("metrics");
    assert!(shipped.starts_with("0.0.0.0:"), "{shipped}");
    assert!(daemonset_arg("metrics-token-file").starts_with("/etc/tracer/"));
    let port = free_port();
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    let rec = Recorder::on(&dir.path().join("t.db"))
        .args(&[
            "--metrics",
            &format!("0.0.0.0:{port}"),
            "--metrics-token-file",
            token.to_str().unwrap(),
        ])
        .start();
    let auth = "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n";
    assert_eq!(request(port, "/metrics", "").map(|r| r.0), Some(401));
    assert_eq!(
        request(
            port,
            "/metrics",
            "Authorization: Bearer 0123456789abcdef0123456789abcdee\r\n"
        )
        .map(|r| r.0),
        Some(401)
    );
    assert_eq!(request(port, "/healthz", "").map(|r| r.0), Some(200));
    let (code, body) = request(port, "/metrics", auth).unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        self_metric(&body, "tracer_metrics_unauthorized_requests_total"),
        2
    );
    rec.stop();
}

/// The value of the line of `family` with `label`, in a scrape.
fn value_of(body: &str, family: &str, label: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(&format!("{family}{{")) && l.contains(label))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// A slow leak, time-compressed only in how long a run must be (150 s, a
/// point every 5 s, where the defaults are 30 min and a minute): a real
/// container cgroup growing 6 MiB a minute for minutes is found at its
/// rate, published, shown by `top`, and kept by a later OOM kill; a
/// container holding steady beside it is not.
#[test]
fn a_slow_leak_is_found_at_its_rate_published_shown_and_kept_by_its_kill() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    const LEAKY: &str = "1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac1eac";
    const QUIET: &str = "0dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd50dd5";
    let store = sc.store.clone();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let leaky = TestCgroup::container(LEAKY, 256 * MIB);
    let quiet = TestCgroup::container(QUIET, 256 * MIB);
    let rec = Recorder::on(&store)
        .args(&[
            "--metrics",
            &addr,
            "--leak-step",
            "5s",
            "--leak-min-span",
            "150s",
        ])
        .start();
    let memhog = env!("CARGO_BIN_EXE_memhog");
    let hog = |cg: &TestCgroup, step: &str, interval: &str, max: &str| {
        let mut cmd = cg.command(memhog);
        cmd.args([
            "--step-mib",
            step,
            "--interval-ms",
            interval,
            "--max-mib",
            max,
        ]);
        Proc::spawn(cmd)
    };
    // 1 MiB every 10 s: 6 MiB a minute, 0.1 MiB a second.
    let started = std::time::Instant::now();
    let mut leaker = hog(&leaky, "1", "10000", "200");
    let _steady = hog(&quiet, "16", "10", "16");
    let want = MIB as f64 / 10.0;
    let leaky_label = format!("cgroup=\"{}\"", leaky.path);
    let quiet_label = format!("cgroup=\"{}\"", quiet.path);
    let family = "tracer_memory_leak_bytes_per_second";
    let body = wait_for(Duration::from_secs(240), || {
        let b = scrape(port)?;
        (value_of(&b, family, &leaky_label)? > 0.0).then_some(b)
    })
    .unwrap_or_else(|| {
        panic!(
            "no leak found in {} s: {:?}\n{}",
            started.elapsed().as_secs(),
            scrape(port),
            rec.log()
        )
    });
    let found_after = started.elapsed().as_secs_f64();
    let rate = value_of(&body, family, &leaky_label).unwrap();
    let show = std::env::var_os("SHOW").is_some();
    if show {
        eprintln!("found after {found_after:.0} s at {rate:.0} B/s (grown at {want:.0} B/s)");
    }
    assert!(
        (rate / want - 1.0).abs() <= 0.2,
        "{rate} B/s against {want}"
    );
    // Not before the run spans 150 s.
    assert!(found_after >= 150.0, "found after {found_after} s");
    assert_eq!(value_of(&body, family, &quiet_label), Some(0.0), "{body}");

    // `top` shows it, from the recorder's store.
    let out = tracer(&[
        "top",
        "--store",
        store.to_str().unwrap(),
        "--once",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let row = |path: &str| {
        rows.iter()
            .find(|r| r["type"] == "container" && r["memcg"] == path)
            .cloned()
    };
    let leaky_row = row(&leaky.path).unwrap_or_else(|| panic!("no row: {rows:?}"));
    let leak = &leaky_row["leak"];
    assert!(
        (leak["bytes_per_second"].as_f64().unwrap() / want - 1.0).abs() <= 0.2,
        "{leak}"
    );
    assert!(leak["limit_in_s"].as_f64().unwrap() > 0.0, "{leak}");
    assert!(
        row(&quiet.path).is_some_and(|r| r["leak"].is_null()),
        "{rows:?}"
    );
    let text = String::from_utf8_lossy(
        &tracer(&["top", "--store", store.to_str().unwrap(), "--once"]).stdout,
    )
    .into_owned();
    if show {
        eprintln!("$ tracer top --once\n{text}");
    }
    assert!(
        text.lines().any(|l| l.contains("leaking")
            && l.contains("%/h, limit in ~")
            && l.contains(&leaky.path)),
        "{text}"
    );

    // A kill now keeps the leak: the leaker (oom_score_adj 1000) is the
    // victim when a fast grower takes the cgroup to its limit.
    std::fs::write(format!("/proc/{}/oom_score_adj", leaker.pid()), "1000").unwrap();
    let _burst = hog(&leaky, "8", "20", "300");
    assert_eq!(
        leaker.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL),
        "the kernel chose the leaker"
    );
    let v = tracer_e2e::explain_json(
        &[
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &leaker.pid().to_string(),
        ],
        |v| v["kill"]["memcg"]["path"] == leaky.path.as_str() && v["kill"]["leak"].is_object(),
    );
    let leak = &v["kill"]["leak"];
    assert_eq!(leak["memcg"], leaky.path.as_str());
    let kill_ns = v["kill"]["ts_ns"].as_i64().unwrap();
    let leaked_s = (kill_ns - leak["since_ns"].as_i64().unwrap()) as f64 / 1e9;
    assert!(
        leaked_s >= 150.0 && leaked_s <= started.elapsed().as_secs_f64(),
        "leaked {leaked_s} s"
    );
    let text = String::from_utf8_lossy(
        &tracer(&[
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &leaker.pid().to_string(),
        ])
        .stdout,
    )
    .into_owned();
    if show {
        eprintln!("$ tracer explain --pid {}\n{text}", leaker.pid());
    }
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("leaked")
            && l.contains("before the kill")
            && l.contains("%/h of its limit")),
        "{text}"
    );
    let log = rec.stop();
    let summary = tracer_e2e::summary_of(&log).unwrap_or_else(|| panic!("{log}"));
    // The container's leak, not its parent's too.
    assert_eq!(summary["summary"]["leaks"]["found"], 1, "{summary}");
}
