//! End-to-end test of the early warning: a memory cgroup growing at a
//! steady rate is warned about before its real OOM kill, with a projected
//! time to its limit within 25% of the time it really took, and the kill
//! says so; after the kill the warning ends.

use std::time::Duration;

use tracer_e2e::{Proc, Recorder, Scenario, TestCgroup, explain_json, tracer, wait_for};

const MIB: u64 = 1 << 20;

#[test]
fn a_steady_grower_is_warned_before_its_kill_within_a_quarter_of_the_real_time() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let rec = Recorder::on(&store).args(&["--warn-before", "8s"]).start();
    let cg = TestCgroup::new("warn", 160 * MIB);
    // 2 MiB every 200 ms: about 10 MiB/s, some 15 s to the limit.
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "2", "--interval-ms", "200"]);
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    assert_eq!(
        hog.wait_signal(Duration::from_secs(60)),
        Some(libc::SIGKILL)
    );
    let v = explain_json(&["--store", store_s, "--pid", &pid.to_string()], |v| {
        v["kill"]["killer"]["kind"] == "kernel_oom"
    });
    let k = &v["kill"];
    let w = &k["warning"];
    assert_eq!(w["state"], "warning", "{v:#}");
    assert_eq!(w["reason"], "growth", "{v:#}");
    assert_eq!(w["memcg"], cg.path.as_str(), "{v:#}");
    let projected = w["projected_s"].as_f64().unwrap();
    let lead = (k["ts_ns"].as_i64().unwrap() - w["ts_ns"].as_i64().unwrap()) as f64 / 1e9;
    assert!(
        lead > 0.0 && (projected - lead).abs() <= 0.25 * lead,
        "projected {projected:.1} s to the limit; the kill came {lead:.1} s after the warning"
    );
    let rate = w["rate_bytes_per_s"].as_f64().unwrap() / MIB as f64;
    assert!((3.0..=15.0).contains(&rate), "{rate} MiB/s");
    let text = String::from_utf8_lossy(
        &tracer(&["explain", "--store", store_s, "--pid", &pid.to_string()]).stdout,
    )
    .into_owned();
    assert!(
        text.contains(&format!(
            "  warned     {lead:.1} s before the kill ({}): growing",
            cg.path
        )),
        "{text}"
    );
    // Killed, the cgroup is flat: the warning ends, as an event.
    let recovered = wait_for(Duration::from_secs(30), || {
        let out = tracer(&["events", "--store", store_s, "--kind", "pressure"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|e| e["memcg"] == cg.path.as_str() && e["state"] == "recovered")
            .then_some(text)
    });
    let log = rec.stop();
    assert!(recovered.is_some(), "no recovery event: {log}");
    assert!(
        log.contains(&format!("pressure: {} reaches its limit in", cg.path)),
        "{log}"
    );
}

/// cgroup v2 only (memory.high and per-cgroup PSI have no v1 equivalent
/// here: the v1 host runs the growth warning above): a process throttled
/// at its cgroup's memory.high stalls on memory, PSI rises past
/// `--warn-psi`, the cgroup is warned, and the OOM kill at memory.max that
/// follows carries that warning.
#[test]
fn v2_only_memory_high_throttling_is_warned_by_psi_before_the_kill() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    if tracer_e2e::memory_root().1 {
        eprintln!(
            "not run: memory.high and cgroup PSI are cgroup v2 only, and memory is on v1 here"
        );
        return;
    }
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    // PSI alone: growth warnings off.
    let _rec = Recorder::on(&store)
        .args(&["--warn-before", "0", "--warn-psi", "5"])
        .start();
    let cg = TestCgroup::new("high", 64 * MIB);
    std::fs::write(cg.dir().join("memory.high"), (16 * MIB).to_string()).expect("memory.high");
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "2", "--interval-ms", "100"]);
    let t0 = std::time::Instant::now();
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    // Throttled at memory.high, the hog stalls on memory: the warning
    // comes from PSI while it is still far from memory.max.
    let warned = wait_for(Duration::from_secs(120), || {
        let out = tracer(&["events", "--store", store_s, "--kind", "pressure"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["memcg"] == cg.path.as_str() && e["state"] == "warning")
    });
    let warned = warned.unwrap_or_else(|| {
        panic!(
            "no warning while throttled: memory.pressure {:?}, memory.current {:?}",
            std::fs::read_to_string(cg.dir().join("memory.pressure")),
            std::fs::read_to_string(cg.dir().join("memory.current"))
        )
    });
    assert_eq!(warned["reason"], "psi", "{warned}");
    eprintln!(
        "warned {:.1} s after the start: {warned}",
        t0.elapsed().as_secs_f64()
    );
    // Then the limit closes in on it: memory.max at what the cgroup holds
    // now, so that its next step is refused and the kernel kills it at
    // memory.max at once. (Left to grow to the first limit, a throttled
    // hog takes minutes under software emulation.)
    let current = std::fs::read_to_string(cg.dir().join("memory.current")).expect("memory.current");
    let t1 = std::time::Instant::now();
    std::fs::write(cg.dir().join("memory.max"), current.trim()).expect("memory.max");
    assert_eq!(
        hog.wait_signal(Duration::from_secs(60)),
        Some(libc::SIGKILL)
    );
    eprintln!(
        "killed {:.1} s after memory.max was set",
        t1.elapsed().as_secs_f64()
    );
    let events = std::fs::read_to_string(cg.dir().join("memory.events")).unwrap();
    let high: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("high "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(high > 0, "memory.high throttled nothing: {events}");
    let v = explain_json(&["--store", store_s, "--pid", &pid.to_string()], |v| {
        v["kill"]["killer"]["kind"] == "kernel_oom" && !v["kill"]["warning"].is_null()
    });
    let w = &v["kill"]["warning"];
    assert_eq!(w["reason"], "psi", "{v:#}");
    assert_eq!(w["memcg"], cg.path.as_str(), "{v:#}");
    eprintln!(
        "memory.high: {high} throttling events; warned {:.1} s before the kill at PSI some avg10 {}",
        (v["kill"]["ts_ns"].as_i64().unwrap() - w["ts_ns"].as_i64().unwrap()) as f64 / 1e9,
        w["psi_some_avg10"]
    );
}
