//! End-to-end tests of CUDA tracing: `tracer attach` on processes that are
//! already running, against the real libcudart from PyPI and the simulated
//! CUDA libraries of tests/simcuda (success paths, OOM, VMM, nesting).

use std::{
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_e2e::{
    Attach, CudaLoad, Scenario, explain_json, real_cudart, simcuda_dir, tracer, wait_for,
};

const MIB: u64 = 1 << 20;

fn func(c: &Value) -> &str {
    c["function"].as_str().unwrap_or("")
}

fn start_time(pid: u32) -> String {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_string()
}

/// tests/py/cuda_alloc.py.
fn cuda_alloc_script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py/cuda_alloc.py")
}

/// Debian's CPython running tests/py/cuda_alloc.py on the simulated
/// runtime, with a 1 GiB device.
fn cuda_alloc_py() -> CudaLoad {
    let mut cmd = Command::new("/usr/bin/python3.11");
    cmd.arg(cuda_alloc_script())
        .arg(simcuda_dir().join("libcudart.so.12"))
        .env("SIMCUDA_DEVICE_MEM", (1u64 << 30).to_string());
    CudaLoad::spawn(cmd)
}

#[test]
fn real_libcudart_calls_are_seen_with_their_return_code() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let lib = real_cudart();
    if !lib.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing: cargo xtask setup installs it",
            lib.display()
        );
        eprintln!("skipped: {} missing (run cargo xtask setup)", lib.display());
        return;
    }
    let mut cmd = Command::new(simcuda_dir().join("cudaload"));
    cmd.arg(&lib);
    let mut target = CudaLoad::spawn(cmd);
    let pid = target.pid();
    let started = start_time(pid);
    let attach = Attach::start(pid, &[]);
    assert!(
        attach.stderr().contains("libcudart.so.12"),
        "{}",
        attach.stderr()
    );
    // No NVIDIA driver on this machine: the real runtime answers 35.
    assert_eq!(target.cmd("malloc 1048576"), "err 35");
    assert_eq!(target.cmd("malloc 4096"), "err 35");
    let calls = attach.wait_calls(2, |c| func(c) == "cudaMalloc");
    assert_eq!(calls[0]["size"], 1048576);
    assert_eq!(calls[0]["ret"], 35);
    assert_eq!(calls[1]["size"], 4096);
    assert_eq!(calls[0]["pid"], pid);
    assert!(calls[0]["latency_ns"].as_u64().unwrap() > 0);
    let report = attach.stop();
    assert_eq!(report["type"], "detach");
    assert_eq!(report["ledger"]["by_kind"]["device"]["failed"], 2);
    // The target ran on, unchanged, and answers after the detach.
    assert_eq!(start_time(pid), started);
    assert_eq!(target.cmd("malloc 1"), "err 35");
}

#[test]
fn simulated_driver_ledger_by_kind_leaks_and_gpu_oom() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[("SIMCUDA_DEVICE_MEM", &(256 * MIB).to_string())]);
    let attach = Attach::start(target.pid(), &[]);
    target.ok("setdevice 0");
    let dev = target.ok("malloc 67108864")[0].clone();
    target.ok("managed 16777216");
    let host = target.ok("host 8388608")[0].clone();
    target.ok("async 4194304");
    target.ok("pool 2097152");
    target.ok("pitch 1000 100");
    let freed = target.ok("malloc 1048576")[0].clone();
    target.ok(&format!("free {freed}"));
    target.ok(&format!("freehost {host}"));
    // The device is full: a real GPU OOM, with its code.
    assert_eq!(target.cmd("malloc 268435456"), "err 2");
    let oom = attach.wait_calls(1, |c| func(c) == "cudaMalloc" && c["ret"] == 2);
    assert_eq!(oom[0]["size"], 268435456);
    assert_eq!(oom[0]["device"], 0);
    let summary = wait_for(Duration::from_secs(5), || {
        attach
            .of_type("summary")
            .into_iter()
            .rev()
            .find(|s| s["ledger"]["calls"].as_u64() >= Some(11))
    })
    .expect("a summary with every call");
    let k = &summary["ledger"]["by_kind"];
    assert_eq!(
        k["device"]["outstanding"],
        64 * MIB + 1024 * 100,
        "pitch 1000 rounds up to 1024"
    );
    assert_eq!(k["managed"]["outstanding"], 16 * MIB);
    assert_eq!(k["async_pool"]["outstanding"], 6 * MIB);
    assert_eq!(k["pinned_host"]["outstanding"], 0);
    assert_eq!(k["pinned_host"]["peak"], 8 * MIB);
    assert_eq!(k["device"]["failed"], 1);
    let _ = dev;
    // The target exits without freeing: the report lists what it leaked.
    target.exit();
    let report = attach.wait_end();
    assert_eq!(report["type"], "exit");
    let leaks = report["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 5, "{leaks:?}");
    assert_eq!(leaks[0]["size"], 64 * MIB);
    assert_eq!(leaks[0]["kind"], "device");
    assert_eq!(leaks[0]["function"], "cudaMalloc");
    assert_eq!(
        report["ledger"]["total_bytes"],
        64 * MIB + 16 * MIB + 6 * MIB + 102400
    );
}

#[test]
fn runtime_over_driver_counts_once_and_vmm_maps() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[]);
    let attach = Attach::start(target.pid(), &[]);
    target.ok("setdevice 0");
    for _ in 0..5 {
        let p = target.ok("malloc 4096")[0].clone();
        target.ok(&format!("free {p}"));
    }
    // The driver API called directly is traced as such.
    let d = target.ok("drvmalloc 8192")[0].clone();
    target.ok(&format!("drvfree {d}"));
    let vmm = target.ok("vmm 2097152");
    target.ok(&format!("vmmfree {} {} 2097152", vmm[0], vmm[1]));
    target.ok("reset");
    let calls = attach.wait_calls(1, |c| func(c) == "cudaDeviceReset");
    let all = attach.of_type("call");
    let count = |f: &str| all.iter().filter(|c| func(c) == f).count();
    assert_eq!(count("cudaMalloc"), 5);
    assert_eq!(count("cudaFree"), 5);
    assert_eq!(
        count("cuMemAlloc_v2"),
        1,
        "only the direct driver call: {all:?}"
    );
    assert_eq!(count("cuMemFree_v2"), 1);
    assert_eq!(count("cudaSetDevice"), 1);
    assert_eq!(
        count("cuDevicePrimaryCtxRetain"),
        0,
        "nested in cudaSetDevice"
    );
    for f in [
        "cuMemCreate",
        "cuMemAddressReserve",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemAddressFree",
        "cuMemRelease",
    ] {
        assert_eq!(count(f), 1, "{f}");
    }
    let create = all.iter().find(|c| func(c) == "cuMemCreate").unwrap();
    assert_eq!(create["size"], 2097152);
    assert_eq!(create["device"], 0);
    assert!(!calls.is_empty());
    let report = attach.stop();
    let k = &report["ledger"]["by_kind"];
    assert_eq!(k["device"]["allocs"], 6);
    assert_eq!(k["device"]["outstanding"], 0);
    assert_eq!(k["vmm_physical"]["peak"], 2097152);
    assert_eq!(k["vmm_physical"]["outstanding"], 0);
    assert_eq!(report["ledger"]["vmm_mapped_bytes"], 0);
}

/// Two threads whose ids are equal modulo the number of per-thread slots
/// of the CUDA programs, in calls at the same time: each call is seen once,
/// with its own thread's size and device (the slot's owner keeps it, the
/// other thread's call goes to the spill map, and a thread taking its slot
/// back gets its device from the per-thread device map).
#[test]
fn threads_sharing_a_slot_keep_their_own_calls_and_devices() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[("SIMCUDA_DEVICES", "3"), ("SIMCUDA_ALLOC_DELAY_MS", "400")]);
    let attach = Attach::start(target.pid(), &[]);
    let out = target.ok(&format!(
        "slotmate {} {} {}",
        tracer_common::THREAD_SLOTS,
        MIB,
        2 * MIB
    ));
    let (tid, mate): (u64, u64) = (out[0].parse().unwrap(), out[1].parse().unwrap());
    assert_ne!(tid, mate);
    assert_eq!(
        tid % u64::from(tracer_common::THREAD_SLOTS),
        mate % u64::from(tracer_common::THREAD_SLOTS)
    );
    let calls = attach.wait_calls(2, |c| func(c) == "cudaMalloc");
    let by = |t: u64| {
        calls
            .iter()
            .find(|c| c["tid"] == t)
            .unwrap_or_else(|| panic!("no cudaMalloc of thread {t}: {calls:?}"))
    };
    assert_eq!(by(tid)["size"], MIB);
    assert_eq!(by(tid)["device"], 1);
    assert_eq!(by(mate)["size"], 2 * MIB);
    assert_eq!(by(mate)["device"], 2);
    // The calls were open at once: each took the driver's 400 ms.
    for c in &calls {
        assert!(c["latency_ns"].as_u64().unwrap() >= 400_000_000, "{c}");
    }
    let all = attach.of_type("call");
    let count = |f: &str| all.iter().filter(|c| func(c) == f).count();
    assert_eq!(count("cudaMalloc"), 2, "{all:?}");
    assert_eq!(count("cuMemAlloc_v2"), 0, "nested in cudaMalloc: {all:?}");
    assert_eq!(count("cudaSetDevice"), 2, "{all:?}");
    let report = attach.stop();
    assert_eq!(
        report["ledger"]["by_kind"]["device"]["outstanding"],
        3 * MIB
    );
}

/// A thread's name is kept with its CUDA state and read again once it is a
/// second old: a renamed thread's calls carry the new name within that.
#[test]
fn a_renamed_thread_shows_its_new_name() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[]);
    let attach = Attach::start(target.pid(), &[]);
    target.ok("malloc 4096");
    let first = attach.wait_calls(1, |c| func(c) == "cudaMalloc");
    assert_eq!(first[0]["comm"], "cudaload", "{first:?}");
    // A hostile name (a quote, a backslash, an escape byte, a brace)
    // stays one JSON line, the name intact.
    let hostile = "re\"n\\\u{1b}{d";
    target.ok(&format!("rename {hostile}"));
    std::thread::sleep(Duration::from_millis(1200));
    target.ok("malloc 8192");
    let calls = attach.wait_calls(2, |c| func(c) == "cudaMalloc");
    assert_eq!(calls[1]["size"], 8192);
    assert_eq!(calls[1]["comm"], hostile, "{calls:?}");
    attach.stop();
}

#[test]
fn a_library_loaded_after_attach_is_picked_up() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let d = simcuda_dir();
    let mut cmd = Command::new(d.join("cudaload"));
    cmd.arg("-");
    let mut target = CudaLoad::spawn(cmd);
    let attach = Attach::start(target.pid(), &["--wait"]);
    assert!(attach.stderr().contains("waiting for one"));
    let loaded = Instant::now();
    target.ok(&format!(
        "dlopen {} {}",
        d.join("libcudart.so.12").display(),
        d.join("libcuda.so.1").display()
    ));
    let seen = wait_for(Duration::from_secs(5), || {
        target.ok("malloc 1024");
        let c = attach.of_type("call");
        c.iter()
            .any(|c| func(c) == "cudaMalloc")
            .then(|| loaded.elapsed())
    })
    .expect("calls traced after the dlopen");
    assert!(seen < Duration::from_millis(1500), "picked up in {seen:?}");
}

#[test]
fn statically_linked_cudart_in_the_executable() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::spawn(Command::new(simcuda_dir().join("cudaload-static")));
    // doctor --pid says what it found, and which probed functions are missing.
    let out = tracer(&[
        "doctor",
        "--pid",
        &target.pid().to_string(),
        "--store",
        "/nonexistent/dir/x.db",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("cudart linked into the executable"), "{text}");
    assert!(
        text.contains("not exported, so not traced: cudaMallocAsync_ptsz"),
        "{text}"
    );
    let attach = Attach::start(target.pid(), &[]);
    assert!(
        attach.stderr().contains("linked into the executable"),
        "{}",
        attach.stderr()
    );
    target.ok("malloc 123456");
    let c = attach.wait_calls(1, |c| func(c) == "cudaMalloc");
    assert_eq!(c[0]["size"], 123456);
    assert_eq!(c[0]["ret"], 0);
}

#[test]
fn a_process_in_another_mount_namespace() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    // The libraries exist only inside the target's private mount namespace,
    // at a path that is an empty directory on the host.
    let dir = &sc.dir;
    let mnt = dir.path().join("private");
    fs::create_dir(&mnt).unwrap();
    let d = simcuda_dir();
    let script = format!(
        "mount -t tmpfs tracer-e2e {m} && cp {d}/libcudart.so.12 {d}/libcuda.so.1 {d}/cudaload {m}/ && exec {m}/cudaload {m}/libcudart.so.12 {m}/libcuda.so.1",
        m = mnt.display(),
        d = d.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    let mut target = CudaLoad::spawn(cmd);
    assert!(
        !mnt.join("libcudart.so.12").exists(),
        "not visible on the host"
    );
    let attach = Attach::start(target.pid(), &[]);
    target.ok("malloc 65536");
    let c = attach.wait_calls(1, |c| func(c) == "cudaMalloc");
    assert_eq!(c[0]["size"], 65536);
}

#[test]
fn detach_leaves_no_probe_behind() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[]);
    let pid = target.pid();
    let addr =
        u64::from_str_radix(target.ok("addr cudaMalloc")[0].trim_start_matches("0x"), 16).unwrap();
    let first_byte = || {
        let mut mem = fs::File::open(format!("/proc/{pid}/mem")).unwrap();
        mem.seek(SeekFrom::Start(addr)).unwrap();
        let mut b = [0u8; 1];
        mem.read_exact(&mut b).unwrap();
        b[0]
    };
    let before = first_byte();
    assert_ne!(before, 0xcc);
    let attach = Attach::start(pid, &["--duration", "2s"]);
    assert_eq!(first_byte(), 0xcc, "the uprobe's breakpoint is in place");
    target.ok("malloc 1");
    let report = attach.wait_end();
    assert_eq!(report["type"], "detach");
    assert_eq!(first_byte(), before, "the original instruction is back");
    target.ok("malloc 1");
}

#[test]
fn bad_input() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let err = |args: &[&str]| {
        let out = tracer(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(err(&["attach", "--pid", "999999999"]).contains("no process with pid 999999999"));
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let e = err(&["attach", "--pid", &sleeper.id().to_string()]);
    assert!(
        e.contains("has no CUDA library loaded") && e.contains("--wait"),
        "{e}"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // A process that exits while tracer attaches: a clear end either way.
    tracer_e2e::attach_to_an_exiting_process(&["attach", "--wait"], 300, 0);
    // Not root.
    let target = CudaLoad::sim(&[]);
    let out = tracer_e2e::tracer_as_nobody(&["attach", "--pid", &target.pid().to_string()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs root"),
        "{out:?}"
    );
}

/// Waits until the recorder's log says it attached to the simulated runtime.
fn wait_attached(rec: &tracer_e2e::Recorder) {
    let ok = wait_for(Duration::from_secs(20), || {
        rec.log().contains("libcudart.so.12 (").then_some(())
    });
    assert!(
        ok.is_some(),
        "recorder never attached to the CUDA runtime: {}",
        rec.log()
    );
}

#[test]
fn record_cuda_explains_a_gpu_oom_with_the_other_processes_on_the_device() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = tracer_e2e::Recorder::on(&store).args(&["--cuda"]).start();
    let mut neighbour = CudaLoad::sim(&[]);
    let mut victim = CudaLoad::sim(&[("SIMCUDA_DEVICE_MEM", &(256 * MIB).to_string())]);
    wait_attached(&rec);
    neighbour.ok("setdevice 0");
    neighbour.ok("malloc 52428800");
    victim.ok("setdevice 0");
    victim.ok("malloc 104857600");
    victim.ok("host 1048576");
    assert_eq!(victim.cmd("malloc 209715200"), "err 2");
    let store_s = store.to_str().unwrap();
    let v = explain_json(&["--gpu-oom", "--store", store_s], |_| true);
    let r = &v["gpu_oom"];
    assert_eq!(r["process"]["pid"], victim.pid());
    assert_eq!(r["process"]["comm"], "cudaload");
    assert_eq!(r["function"], "cudaMalloc");
    assert_eq!(r["size"], 209715200);
    assert_eq!(r["kind"], "device");
    assert_eq!(r["device"], 0);
    assert_eq!(r["held"]["by_kind"]["device"]["outstanding"], 104857600);
    assert_eq!(r["held"]["by_kind"]["pinned_host"]["outstanding"], 1048576);
    let recent: Vec<&str> = r["held"]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["function"].as_str().unwrap())
        .collect();
    assert_eq!(recent, ["cudaMalloc", "cudaMallocHost", "cudaMalloc"]);
    let others = r["others"].as_array().unwrap();
    assert_eq!(others.len(), 1, "{others:?}");
    assert_eq!(others[0]["process"]["pid"], neighbour.pid());
    assert_eq!(others[0]["device_bytes"], 52428800);
    assert!(
        v["verdict"]
            .as_str()
            .unwrap()
            .contains("own allocations filled device 0"),
        "{}",
        v["verdict"]
    );
    let text =
        String::from_utf8_lossy(&tracer(&["explain", "--gpu-oom", "--store", store_s]).stdout)
            .to_string();
    assert!(
        text.contains(&format!(
            "GPU out of memory: cudaload (pid {}) asked cudaMalloc for 200.0 MiB on device 0",
            victim.pid()
        )),
        "{text}"
    );
    assert!(text.contains(&neighbour.pid().to_string()), "{text}");
    drop(rec);
    // Notable calls are events: the 100 MiB allocation and the failure,
    // not the 1 MiB of pinned memory nor the neighbour's 50 MiB.
    let out = tracer(&[
        "events",
        "--store",
        store_s,
        "--kind",
        "cuda_call",
        "--since",
        "1h",
    ]);
    let calls: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sizes: Vec<(u64, u64, i64)> = calls
        .iter()
        .map(|c| {
            (
                c["pid"].as_u64().unwrap(),
                c["size"].as_u64().unwrap(),
                c["ret"].as_i64().unwrap(),
            )
        })
        .collect();
    let v = u64::from(victim.pid());
    assert_eq!(sizes, [(v, 104857600, 0), (v, 209715200, 2)], "{calls:?}");
}

#[test]
fn a_host_oom_kill_shows_the_victims_pinned_host_memory() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = tracer_e2e::TestCgroup::new("pinned", 64 * MIB);
    let rec = tracer_e2e::Recorder::on(&store).args(&["--cuda"]).start();
    let d = simcuda_dir();
    let mut cmd = cg.command(d.join("cudaload"));
    cmd.arg(d.join("libcudart.so.12"))
        .arg(d.join("libcuda.so.1"));
    let mut target = CudaLoad::spawn(cmd);
    let pid = target.pid();
    wait_attached(&rec);
    target.ok("malloc 1073741824");
    // Pinned host memory is real host memory, charged to the cgroup: 8 MiB
    // at a time until the kernel kills the process.
    for _ in 0..16 {
        if target.try_cmd("host 8388608").is_none() {
            break; // killed before replying
        }
    }
    assert_eq!(cg.oom_kills(), 1, "the cgroup's OOM killer ran");
    let pid_s = pid.to_string();
    // Joined with the kernel's report and with the victim's ledger.
    let v = explain_json(
        &["--store", store.to_str().unwrap(), "--pid", &pid_s],
        |v| {
            v["kill"]["source"]
                .as_str()
                .is_some_and(|s| s.contains("kmsg"))
                && !v["kill"]["victim"]["gpu"].is_null()
        },
    );
    let gpu = &v["kill"]["victim"]["gpu"];
    let pinned = gpu["by_kind"]["pinned_host"]["outstanding"]
        .as_u64()
        .unwrap();
    assert!(pinned >= 40 * MIB, "pinned host at the kill: {pinned}");
    assert_eq!(gpu["by_kind"]["device"]["outstanding"], 1073741824);
    let verdict = v["verdict"]["summary"].as_str().unwrap();
    assert!(verdict.contains("pinned CUDA host memory"), "{verdict}");
    drop(rec);
}

#[test]
fn a_process_already_busy_in_cuda_calls_is_traced_from_its_first_second() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut target = CudaLoad::sim(&[]);
    // 10,000 cudaMalloc+cudaFree pairs a second for 20 s: a thread is
    // inside a probed call at almost any moment the probes arrive.
    target.send("rate 5000 20 4096 rt");
    std::thread::sleep(Duration::from_millis(500));
    let attach = Attach::start(target.pid(), &[]);
    let t0 = std::time::Instant::now();
    let calls = attach.wait_calls(50, |c| c["function"] == "cudaMalloc");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the first 50 calls took {took:?} to be seen"
    );
    assert!(calls.iter().all(|c| c["ret"] == 0), "{calls:?}");
    drop(attach);
}

#[test]
fn a_process_that_exits_during_attach_gets_a_clear_message() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    for delay_ms in [0u64, 20, 60, 150, 400] {
        let target = CudaLoad::sim(&[]);
        let pid = target.pid();
        let child = Command::new(tracer_e2e::tracer_bin())
            .args(["attach", "--pid", &pid.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        drop(target);
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !text.contains("os error"),
            "a raw OS error after {delay_ms} ms: {text}"
        );
        assert!(
            text.contains("exited") || text.contains("no process with pid"),
            "after {delay_ms} ms: {text}"
        );
    }
}

#[test]
fn a_process_retrying_a_failing_cuda_malloc_costs_a_row_a_second() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let rec = tracer_e2e::Recorder::on(&store).args(&["--cuda"]).start();
    let mut p = CudaLoad::sim(&[("SIMCUDA_DEVICE_MEM", &(256 * MIB).to_string())]);
    wait_attached(&rec);
    p.ok("setdevice 0");
    // 20,000 cudaMalloc calls of 1 TiB, each out of memory.
    let n = 20_000u64;
    let out = p.cmd(&format!("loopany {n} 1099511627776"));
    assert!(out.starts_with("ok ") && out.ends_with(" 2"), "{out}");
    // Stopped at once: what the rings still hold is read at stop.
    let summary = rec.stop_summary();
    let drops = summary["summary"]["drops"]["data"].as_u64().unwrap()
        + summary["summary"]["drops"]["critical"].as_u64().unwrap();
    let c = rusqlite::Connection::open(&store).unwrap();
    let rows: Vec<(i64, Value)> = c
        .prepare("SELECT ts_ns, data FROM events WHERE kind = 'cuda_call' AND pid = ?1")
        .unwrap()
        .query_map([p.pid()], |r| {
            Ok((
                r.get(0)?,
                serde_json::from_str(&r.get::<_, String>(1)?).unwrap(),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .filter(|(_, v): &(i64, Value)| v["ret"] == 2)
        .collect();
    let repeats: u64 = rows.iter().filter_map(|(_, v)| v["repeats"].as_u64()).sum();
    let firsts = rows.iter().filter(|(_, v)| v["repeats"].is_null()).count() as u64;
    let gpu_ooms: i64 = c
        .query_row(
            "SELECT count(*) FROM gpu_ooms WHERE pid = ?1",
            [p.pid()],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!(
        "failure loop: {n} failed calls -> {} rows ({firsts} first of a window, {repeats} counted), {gpu_ooms} GPU OOM records, {drops} ring drops",
        rows.len()
    );
    assert_eq!(
        firsts + repeats + drops,
        n,
        "every call stored, counted or a counted drop"
    );
    assert!(rows.len() <= 20, "{} rows", rows.len());
    assert_eq!(gpu_ooms as u64, firsts, "a GPU OOM record a window");
    assert_eq!(
        summary["summary"]["folded_calls"].as_u64(),
        Some(repeats),
        "{summary}"
    );
}

/// The Python frame of a stack named `function`: (file ends right, line).
fn py_frame(frames: &Value, function: &str) -> Option<(bool, u64)> {
    frames.as_array()?.iter().find_map(|f| {
        (f["python"] == true && f["function"] == function).then(|| {
            (
                f["file"].as_str().unwrap_or("").ends_with("/cuda_alloc.py"),
                f["line"].as_u64().unwrap_or(0),
            )
        })
    })
}

/// A Python program calls the CUDA runtime through ctypes from known
/// lines: `attach --by stack` groups its device memory by the stack that
/// allocated it, each stack naming its Python line, and follows a free.
#[test]
fn device_memory_by_stack_names_the_python_lines_that_allocated_it() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let (snapshot, profile) = (
        sc.dir.path().join("snap.pickle"),
        sc.dir.path().join("cuda.pb.gz"),
    );
    let script = cuda_alloc_script();
    let text = std::fs::read_to_string(&script).unwrap();
    let line = |m: &str| text.lines().position(|l| l.contains(m)).unwrap() as u64 + 1;
    let (weights, workspace, scratch) = (
        line("# WEIGHTS-LINE"),
        line("# WORKSPACE-LINE"),
        line("# SCRATCH-LINE"),
    );
    let mut prog = cuda_alloc_py();
    let attach = Attach::start(
        prog.pid(),
        &[
            "--by",
            "stack",
            "--summary-only",
            // Every allocation under 1 MiB has its stack too.
            "--sample-bytes",
            "0",
            "--snapshot",
            snapshot.to_str().unwrap(),
            "--pprof",
            profile.to_str().unwrap(),
        ],
    );
    assert_eq!(prog.cmd("go"), "done");
    // The per-second picture with all four allocations.
    let held = |want: u64| {
        wait_for(Duration::from_secs(20), || {
            attach
                .of_type("stacks")
                .into_iter()
                .rev()
                .find(|v| v["live_bytes"] == want)
        })
    };
    let v = held(160 * MIB + 64 * 1024).unwrap_or_else(|| panic!("{}", attach.stderr()));
    let sites = v["sites"].as_array().expect("sites");
    assert_eq!(sites.len(), 3, "{v:#}");
    assert_eq!(sites[0]["live_bytes"], 128 * MIB, "{v:#}");
    assert_eq!(
        py_frame(&sites[0]["frames"], "weights"),
        Some((true, weights)),
        "{v:#}"
    );
    assert_eq!(sites[1]["live_bytes"], 32 * MIB, "{v:#}");
    assert_eq!(
        py_frame(&sites[1]["frames"], "workspace"),
        Some((true, workspace)),
        "{v:#}"
    );
    assert_eq!(sites[2]["live_bytes"], 64 * 1024, "{v:#}");
    assert_eq!(
        py_frame(&sites[2]["frames"], "scratch"),
        Some((true, scratch)),
        "{v:#}"
    );
    // Freed: its stack holds nothing any more.
    assert_eq!(prog.cmd("free"), "done");
    let v = held(128 * MIB + 64 * 1024).unwrap_or_else(|| panic!("{}", attach.stderr()));
    assert_eq!(v["sites"].as_array().map(Vec::len), Some(2), "{v:#}");
    let end = attach.stop();
    assert_eq!(
        end["ledger"]["total_bytes"],
        128 * MIB + 64 * 1024,
        "{end:#}"
    );
    prog.exit();
    // PyTorch's own reader: the three segments still held, each named by
    // its Python line, and the stats' accounting adding up.
    let viz = tracer_e2e::torch_memory_viz(&snapshot);
    let segments = viz["segments"].as_array().expect("segments");
    let sizes: Vec<u64> = segments
        .iter()
        .map(|s| s["total_size"].as_u64().unwrap())
        .collect();
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![64 * 1024, 64 * MIB, 64 * MIB], "{viz:#}");
    let weights_frame = format!("cuda_alloc.py:{weights}:weights");
    let scratch_frame = format!("cuda_alloc.py:{scratch}:scratch");
    for s in segments {
        let want = if s["total_size"] == 64 * MIB {
            &weights_frame
        } else {
            &scratch_frame
        };
        let named = s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == want.as_str());
        assert!(named, "{want}: {s:#}");
        assert_eq!(
            s["states"],
            serde_json::json!(["active_allocated"]),
            "{s:#}"
        );
    }
    let stats = viz["stats"].as_str().unwrap();
    assert!(stats.contains("segments: 3"), "{stats}");
    let memory = viz["memory"].as_array().unwrap();
    let weights_lines = memory
        .iter()
        .map(|l| l.as_str().unwrap())
        .filter(|l| l.contains(&weights_frame) && l.ends_with(&format!(" {}", 64 * MIB)))
        .count();
    assert_eq!(weights_lines, 2, "{viz:#}");
    assert!(
        viz["trace"].as_str().unwrap().contains("cudaMalloc("),
        "{viz:#}"
    );
    // Go's pprof: the device memory by Python line.
    let top = tracer_e2e::go_pprof(&["-top", "-lines", "-sample_index=inuse_space"], &profile);
    assert!(
        top.lines().any(|l| l.contains("128MB")
            && l.ends_with(&format!("weights {}:{weights}", script.display()))),
        "{top}"
    );
    assert!(!top.contains("workspace"), "freed before the end: {top}");
}

/// Allocations under 1 MiB send their stacks once per `--sample-bytes`
/// allocated on average: 4096 allocations of 16 KiB from one line are
/// estimated within 30 % (about 126 samples, a standard error of 9 %).
#[test]
fn small_device_allocations_are_sampled_by_bytes_and_estimated() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let text = std::fs::read_to_string(cuda_alloc_script()).unwrap();
    let small = text
        .lines()
        .position(|l| l.contains("# SMALL-LINE"))
        .unwrap() as u64
        + 1;
    let mut prog = cuda_alloc_py();
    let attach = Attach::start(prog.pid(), &["--by", "stack", "--summary-only"]);
    assert_eq!(prog.cmd("small 4096"), "done");
    // Two pictures a second apart that agree: every sample is in.
    let v = wait_for(Duration::from_secs(20), || {
        let all = attach.of_type("stacks");
        let n = all.len();
        (n >= 2
            && all[n - 1]["live_bytes"] == all[n - 2]["live_bytes"]
            && all[n - 1]["live_bytes"] != 0)
            .then(|| all[n - 1].clone())
    })
    .unwrap_or_else(|| panic!("{}", attach.stderr()));
    let site = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| py_frame(&s["frames"], "small") == Some((true, small)))
        .unwrap_or_else(|| panic!("no site at cuda_alloc.py:{small}: {v:#}"));
    let bytes = site["live_bytes"].as_u64().unwrap();
    let samples = site["live_samples"].as_u64().unwrap();
    eprintln!("64 MiB in 16 KiB allocations: {samples} samples, estimated {bytes} bytes");
    assert!(
        (64 * MIB * 7 / 10..=64 * MIB * 13 / 10).contains(&bytes),
        "{bytes} from {samples} samples: {v:#}"
    );
    assert!((40..=400).contains(&samples), "{samples}: {v:#}");
    let end = attach.stop();
    assert_eq!(end["ledger"]["total_bytes"], 64 * MIB, "{end:#}");
    prog.exit();
}

/// A context reset (cudaDeviceReset) frees every allocation of the
/// device: the device memory by stack goes to nothing with the ledger.
#[test]
fn a_context_reset_takes_the_device_memory_by_stack_with_it() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut prog = cuda_alloc_py();
    let attach = Attach::start(prog.pid(), &["--by", "stack", "--summary-only"]);
    assert_eq!(prog.cmd("init"), "done");
    assert_eq!(prog.cmd("go"), "done");
    let held = |bytes: u64| {
        wait_for(Duration::from_secs(20), || {
            let all = attach.of_type("stacks");
            let last = all.last()?;
            (last["live_bytes"].as_u64() == Some(bytes)).then(|| last.clone())
        })
    };
    // The weights and the workspace, each with its stack (the 64 KiB
    // scratch is sampled, so not counted here exactly).
    wait_for(Duration::from_secs(20), || {
        let all = attach.of_type("stacks");
        (all.last()?["live_bytes"].as_u64()? >= 160 * MIB).then_some(())
    })
    .unwrap_or_else(|| panic!("no stacks of 160 MiB: {}", attach.stderr()));
    assert_eq!(prog.cmd("reset"), "done");
    let after = held(0).unwrap_or_else(|| {
        panic!(
            "the reset left stacks: {:#}",
            attach.of_type("stacks").last().cloned().unwrap_or_default()
        )
    });
    assert!(
        after["sites"].as_array().is_none_or(|s| s.is_empty()),
        "{after:#}"
    );
    attach.stop();
    prog.exit();
}

/// `record --cuda`: a GPU out-of-memory failure of a Python program says
/// which of its lines hold the device memory.
#[test]
fn a_gpu_oom_names_the_python_lines_that_hold_the_device_memory() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let text = std::fs::read_to_string(cuda_alloc_script()).unwrap();
    let weights = text
        .lines()
        .position(|l| l.contains("# WEIGHTS-LINE"))
        .unwrap() as u64
        + 1;
    let rec = tracer_e2e::Recorder::on(&sc.store)
        .args(&["--cuda"])
        .start();
    let mut prog = cuda_alloc_py();
    wait_attached(&rec);
    // A program's first CUDA call has the recorder look for its
    // interpreter; its allocations come later.
    assert_eq!(prog.cmd("init"), "done");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(prog.cmd("go"), "done");
    // The worker publishes each process's device memory by stack each second.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(prog.cmd("oom"), "err 2");
    let store_s = sc.store.to_str().unwrap();
    let v = explain_json(&["--gpu-oom", "--store", store_s], |v| {
        !v["gpu_oom"]["stacks"].is_null()
    });
    let r = &v["gpu_oom"];
    assert_eq!(r["process"]["pid"], prog.pid(), "{r:#}");
    let stacks = r["stacks"].as_array().expect("stacks");
    assert_eq!(stacks[0]["live_bytes"], 128 * MIB, "{r:#}");
    assert_eq!(
        py_frame(&stacks[0]["frames"], "weights"),
        Some((true, weights)),
        "{r:#}"
    );
    // The same as PyTorch's snapshot and as a pprof profile, from the record.
    let (snapshot, profile) = (
        sc.dir.path().join("oom.pickle"),
        sc.dir.path().join("oom.pb.gz"),
    );
    let out = Command::new(tracer_e2e::tracer_bin())
        .args(["explain", "--gpu-oom", "--store", store_s, "--snapshot"])
        .arg(&snapshot)
        .arg("--pprof")
        .arg(&profile)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let viz = tracer_e2e::torch_memory_viz(&snapshot);
    let weights_frame = format!("cuda_alloc.py:{weights}:weights");
    let named: Vec<u64> = viz["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == weights_frame.as_str())
        })
        .map(|s| s["total_size"].as_u64().unwrap())
        .collect();
    assert_eq!(named, vec![64 * MIB, 64 * MIB], "{viz:#}");
    assert!(
        viz["trace"]
            .as_str()
            .unwrap()
            .contains("raise OutOfMemoryError # 64.0GiB requested"),
        "{viz:#}"
    );
    let top = tracer_e2e::go_pprof(&["-top", "-lines"], &profile);
    assert!(top.contains(&format!("cuda_alloc.py:{weights}")), "{top}");
    let verdict = v["verdict"].as_str().unwrap();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{verdict}");
    }
    assert!(
        verdict.contains("128.0 MiB from ")
            && verdict.contains(&format!("weights (cuda_alloc.py:{weights})")),
        "{verdict}"
    );
    prog.exit();
    rec.stop();
}
