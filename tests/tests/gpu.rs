//! End-to-end tests of the NVML side: the simulated NVML of tests/simcuda
//! (loaded through nvml-wrapper, sharing state with the simulated CUDA
//! driver) beside real cgroups and the real recorder.

use std::{process::Command, time::Duration};

use serde_json::Value;
use tracer_e2e::{
    CudaLoad, Proc, Recorder, Scenario, TestCgroup, explain_json, simcuda_dir, tracer, tracer_bin,
    wait_for,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CTX: u64 = 300 * MIB;
const ID_A: &str = "aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111";
const ID_B: &str = "bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222";

/// One simulated GPU of 4 GiB whose state the driver and NVML share; each
/// CUDA context costs 300 MiB that no traced call accounts for.
struct Gpu {
    _dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Gpu {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            (
                "SIMCUDA_STATE",
                dir.path().join("gpu.state").display().to_string(),
            ),
            ("SIMCUDA_DEVICE_MEM", (4 * GIB).to_string()),
            ("SIMNVML_CONTEXT_BYTES", CTX.to_string()),
        ];
        Self { _dir: dir, env }
    }

    fn with(&self, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
        self.env
            .iter()
            .cloned()
            .chain(extra.iter().cloned())
            .collect()
    }

    fn nvml() -> String {
        simcuda_dir()
            .join("libnvidia-ml.so.1")
            .display()
            .to_string()
    }

    /// A recorder tracing CUDA and sampling this GPU every 200 ms, with
    /// `extra` in its environment.
    fn recorder(&self, store: &std::path::Path, extra: &[(&'static str, String)]) -> Recorder {
        Recorder::on(store)
            .args(&[
                "--cuda",
                "--nvml-lib",
                &Gpu::nvml(),
                "--gpu-interval",
                "200ms",
            ])
            .envs(&self.with(extra))
            .start()
    }

    /// A cudaload in `cg` on this GPU.
    fn process(&self, cg: &TestCgroup) -> CudaLoad {
        let d = simcuda_dir();
        let mut cmd = cg.command(d.join("cudaload"));
        cmd.arg(d.join("libcudart.so.12"))
            .arg(d.join("libcuda.so.1"));
        cmd.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        CudaLoad::spawn(cmd)
    }
}

fn top_json(gpu: &Gpu) -> Vec<Value> {
    let out = Command::new(tracer_bin())
        .args([
            "top",
            "--once",
            "--json",
            "--nvml-lib",
            &Gpu::nvml(),
            "--store",
            "/nonexistent/t.db",
        ])
        .envs(gpu.env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn two_containers_on_one_gpu_attribution_and_a_gpu_oom() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let gpu = Gpu::new();
    let store = sc.store.clone();
    let rec = gpu.recorder(&store, &[]);
    let (cg_a, cg_b) = (
        TestCgroup::container(ID_A, 8 * GIB),
        TestCgroup::container(ID_B, 8 * GIB),
    );
    let mut a = gpu.process(&cg_a);
    let mut b = gpu.process(&cg_b);
    let attached = wait_for(Duration::from_secs(20), || {
        rec.log().contains("libcudart.so.12 (").then_some(())
    });
    assert!(attached.is_some(), "{}", rec.log());
    a.ok("setdevice 0");
    a.ok("malloc 2147483648");
    b.ok("setdevice 0");
    b.ok("malloc 1073741824");

    // tracer top: per container, exactly what NVML charges each.
    let rows = top_json(&gpu);
    let container = |id: &str| -> Value {
        rows.iter()
            .find(|r| {
                r["type"] == "container"
                    && r["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(&format!("docker {}", &id[..12])))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no container {id} in {rows:?}"))
    };
    assert_eq!(container(ID_A)["gpu_nvml"], 2 * GIB + CTX);
    assert_eq!(container(ID_B)["gpu_nvml"], GIB + CTX);
    assert_eq!(container(ID_A)["pids"], serde_json::json!([a.pid()]));
    let device = rows.iter().find(|r| r["type"] == "device").unwrap();
    assert_eq!(device["used"], 3 * GIB + 2 * CTX);
    let shares: Vec<f64> = device["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["share_pct"].as_f64().unwrap())
        .collect();
    assert!(
        (shares[0] - 57.42).abs() < 0.1 && (shares[1] - 32.42).abs() < 0.1,
        "{shares:?}"
    );

    // An Xid for the simulated device (PCI 18:00) written to the kernel log
    // by a process, not by the driver: a forgery, never shown as the
    // driver's (only kernel-facility records count; the Xid parsing and its
    // join with the device picture are unit-tested on kernel records).
    std::fs::write("/dev/kmsg", "NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=tracer-e2e, MMU Fault forged by tracer's tests\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The device is full: B's next gigabyte fails. explain names A, the
    // process and the container holding the most, with both figures.
    assert_eq!(b.cmd("malloc 1073741824"), "err 2");
    let store_s = store.to_str().unwrap();
    // With NVML's picture of the moment, taken after the failure.
    let v = explain_json(&["--gpu-oom", "--store", store_s], |v| {
        v["gpu_oom"]["nvml"]["processes"]
            .as_array()
            .is_some_and(|p| p.len() == 2)
    });
    let n = &v["gpu_oom"]["nvml"];
    assert_eq!(v["gpu_oom"]["process"]["pid"], b.pid());
    assert_eq!(n["processes"][0]["pid"], a.pid());
    assert_eq!(n["processes"][0]["nvml_used"], 2 * GIB + CTX);
    assert_eq!(n["processes"][0]["traced_device"], 2 * GIB);
    assert_eq!(n["processes"][0]["unexplained"], CTX);
    assert_eq!(
        n["containers"][0]["name"],
        format!("docker {}", &ID_A[..12])
    );
    assert_eq!(n["containers"][0]["nvml_used"], 2 * GIB + CTX);
    assert_eq!(
        n["xids"].as_array().map(Vec::len),
        Some(0),
        "a process's forged Xid line is not on the device's picture: {n}"
    );
    assert_eq!(n["containers"][0]["traced_device"], 2 * GIB);
    let verdict = v["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(&format!("(pid {})", a.pid()))
            && verdict.contains("per NVML")
            && verdict.contains("traced"),
        "{verdict}"
    );
    assert!(
        verdict.contains(&format!("docker {}", &ID_A[..12])),
        "{verdict}"
    );
    let text =
        String::from_utf8_lossy(&tracer(&["explain", "--gpu-oom", "--store", store_s]).stdout)
            .to_string();
    assert!(
        text.contains("NVML") && text.contains("UNEXPLAINED") && text.contains("300.0 MiB"),
        "{text}"
    );
    let summary = rec.stop_summary();
    assert!(summary["summary"]["nvml_samples"].as_u64().unwrap() > 5);
    // The timeline holds both processes.
    let conn = rusqlite::Connection::open(&store).unwrap();
    let pids: i64 = conn
        .query_row("SELECT count(DISTINCT pid) FROM gpu_processes", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(pids, 2);
}

/// An Xid that hits applications (79, as NVML's critical Xid event gives
/// it) on the GPU a process holds memory on, then that process's abort:
/// its death is recorded, and explain says it died from the GPU fault. A
/// process on the same GPU that exits cleanly, and one on no GPU that
/// fails, are not.
#[test]
fn a_gpu_process_that_aborts_after_an_xid_died_from_the_gpu_fault() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let gpu = Gpu::new();
    let xids = gpu._dir.path().join("xids");
    std::fs::write(&xids, "").unwrap();
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let rec = gpu.recorder(&store, &[("SIMNVML_XID_FILE", xids.display().to_string())]);
    let cg = TestCgroup::new("xid", 8 * GIB);
    let (mut hit, mut clean, mut host) = (gpu.process(&cg), gpu.process(&cg), gpu.process(&cg));
    let attached = wait_for(Duration::from_secs(20), || {
        rec.log().contains("libcudart.so.12 (").then_some(())
    });
    assert!(attached.is_some(), "{}", rec.log());
    for p in [&mut hit, &mut clean] {
        p.ok("setdevice 0");
        p.ok("malloc 268435456");
    }
    // NVML's picture shows both on the GPU before the Xid.
    std::thread::sleep(tracer_e2e::scaled(Duration::from_secs(1)));
    std::fs::write(&xids, "0 79\n").unwrap();
    let seen = wait_for(Duration::from_secs(10), || {
        rec.log().contains("Xid 79").then_some(())
    });
    assert!(
        seen.is_some(),
        "NVML's Xid event was not received: {}",
        rec.log()
    );
    let (hit_pid, clean_pid, host_pid) = (hit.pid(), clean.pid(), host.pid());
    hit.send("abort");
    clean.send("exit");
    host.send("exit 3");
    let v = explain_json(&["--store", store_s, "--pid", &hit_pid.to_string()], |v| {
        v["verdict"]["cause"] == "gpu_fault"
    });
    let said = v["verdict"]["summary"].as_str().unwrap();
    assert!(
        said.starts_with("died from a GPU fault: Xid 79 (the GPU has fallen off the bus")
            && said.contains("on GPU 00000000:18:00.0")
            && said.contains("was killed by SIGABRT"),
        "{said}"
    );
    assert_eq!(v["kill"]["killer"]["kind"], "gpu_fault", "{v}");
    let text = String::from_utf8_lossy(
        &tracer(&["explain", "--store", store_s, "--pid", &hit_pid.to_string()]).stdout,
    )
    .to_string();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    assert!(
        text.contains(&format!(
            "cudaload (pid {hit_pid}) killed by SIGABRT after a GPU fault (Xid 79)"
        )) && text.contains("  verdict    died from a GPU fault: Xid 79"),
        "{text}"
    );
    assert_eq!(v["kill"]["source"], "exit", "{v}");
    // Its command line and place, as for any kill.
    assert_eq!(v["kill"]["victim"]["memcg"], cg.path.as_str(), "{v}");
    // The others' ends are recorded as exits, never as deaths.
    let exited = |pid: u32| {
        let c = rusqlite::Connection::open_with_flags(
            &store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        c.query_row(
            "SELECT json_extract(data, '$.exit') FROM events WHERE kind = 'exit' AND json_extract(data, '$.pid') = ?1",
            [pid],
            |r| r.get::<_, String>(0),
        )
        .ok()
    };
    let ends = wait_for(Duration::from_secs(10), || {
        Some((exited(clean_pid)?, exited(host_pid)?))
    });
    assert_eq!(
        ends,
        Some(("exited with status 0".into(), "exited with status 3".into()))
    );
    let all = tracer_e2e::explain_all(&store);
    let deaths: Vec<_> = all
        .iter()
        .filter(|e| e["kill"]["killer"]["kind"] == "gpu_fault")
        .map(|e| e["kill"]["victim"]["pid"].as_u64())
        .collect();
    assert_eq!(deaths, [Some(u64::from(hit_pid))], "{all:?}");
    drop(rec);
}

#[test]
fn without_nvml_the_recorder_runs_and_a_kill_of_a_host_only_process_has_no_gpu_note() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = Recorder::on(&store)
        .args(&["--cuda", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .start();
    assert!(rec.log().contains("NVML unavailable"), "{}", rec.log());
    let cg = TestCgroup::new("nonvml", 48 * MIB);
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "8", "--interval-ms", "20"]);
    let mut hog = Proc::spawn(cmd);
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL)
    );
    let pid = hog.pid().to_string();
    let v = explain_json(&["--store", store.to_str().unwrap(), "--pid", &pid], |_| {
        true
    });
    let gaps: Vec<&str> = v["kill"]["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_str())
        .collect();
    // The victim never used a GPU: on a node without NVML, a note on
    // every such kill would be noise (a victim whose CUDA calls were
    // traced keeps it: features::gpu's unit test).
    assert!(
        !gaps.iter().any(|g| g.starts_with("GPU data unavailable")),
        "{gaps:?}"
    );
    assert_eq!(v["kill"]["victim"]["comm"], "memhog");
    drop(rec);
}

#[test]
fn a_slow_nvml_does_not_delay_the_ring_buffers() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let gpu = Gpu::new();
    let store = sc.store.clone();
    // 200 ms per NVML call: a sample takes seconds, and is asked for every 100 ms.
    let env = gpu.with(&[("SIMNVML_DELAY_MS", "200".into())]);
    let rec = Recorder::on(&store)
        .args(&["--nvml-lib", &Gpu::nvml(), "--gpu-interval", "100ms"])
        .envs(&env)
        .start();
    let cg = TestCgroup::new("slownvml", 48 * MIB);
    // The first sample takes about 3 s (16 calls); kill while NVML is busy
    // with the next ones.
    std::thread::sleep(Duration::from_secs(5));
    let mut hogs = Vec::new();
    for _ in 0..3 {
        let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
        cmd.args(["--step-mib", "8", "--interval-ms", "20"]);
        let mut hog = Proc::spawn(cmd);
        assert_eq!(
            hog.wait_signal(Duration::from_secs(30)),
            Some(libc::SIGKILL)
        );
        hogs.push(hog);
        std::thread::sleep(Duration::from_millis(700));
    }
    let s = rec.stop_summary();
    let s = &s["summary"];
    assert!(
        s["nvml_samples"].as_u64().unwrap() >= 1,
        "NVML sampled: {s}"
    );
    assert!(
        s["nvml_sample_us_mean"].as_u64().unwrap() >= 2_000_000,
        "NVML was slow: {s}"
    );
    // Every kill became durable well within what one NVML call takes.
    let lat: Vec<u64> = s["kill_commit_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(lat.len(), 3, "{s}");
    assert!(
        lat.iter().all(|&us| us < 100_000),
        "kill to durable row, us: {lat:?}"
    );
}
