//! End-to-end tests against the NVIDIA driver's real user-space libraries
//! (`libcuda.so.1` and `libnvidia-ml.so.1` from Debian's non-free archive,
//! unpacked by `cargo xtask setup`) on a machine with no GPU and no NVIDIA
//! kernel module: the real runtime over the real driver, direct driver
//! calls through the driver's entry trampolines, NVML on a node whose
//! module is not loaded, and the releases a process loaded.
//!
//! Every process that loads the real libraries runs without CAP_MKNOD
//! (they create /dev/nvidiactl when they can), and each test checks that
//! /dev is left as it was.

use std::{path::Path, process::Command};

use serde_json::Value;
use tracer_e2e::{
    Attach, CudaLoad, Recorder, Scenario, driver_libs, real_cudart, simcuda_dir, tracer,
    tracer_json, without_mknod,
};

fn func(c: &Value) -> &str {
    c["function"].as_str().unwrap_or("")
}

/// The node's state these tests are about: the libraries without the module.
fn module_loaded() -> bool {
    Path::new("/proc/driver/nvidia/version").exists() || Path::new("/sys/module/nvidia").exists()
}

/// Asserts that /dev gained no NVIDIA device node while `f` ran.
fn leaves_dev_alone<T>(f: impl FnOnce() -> T) -> T {
    let before = Path::new("/dev/nvidiactl").exists();
    let out = f();
    assert_eq!(
        Path::new("/dev/nvidiactl").exists(),
        before,
        "/dev/nvidiactl appeared: a process loaded the driver with CAP_MKNOD"
    );
    out
}

/// cudaload with `runtime` and `driver` (paths, "-" for none), finding
/// the driver libraries as a process on a node with them installed would.
fn cudaload(runtime: &Path, driver: &Path, libs: &Path) -> CudaLoad {
    let mut cmd = Command::new(simcuda_dir().join("cudaload"));
    cmd.arg(runtime).arg(driver).env("LD_LIBRARY_PATH", libs);
    without_mknod(&mut cmd);
    CudaLoad::spawn(cmd)
}

#[test]
fn the_real_runtime_over_the_real_driver_shows_the_runtime_error_once() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let Some(libs) = driver_libs() else { return };
    let cudart = real_cudart();
    assert!(cudart.exists(), "{}: cargo xtask setup", cudart.display());
    leaves_dev_alone(|| {
        let mut target = cudaload(&cudart, &libs.join("libcuda.so.1"), &libs);
        let attach = Attach::start(target.pid(), &[]);
        let log = attach.stderr();
        assert!(log.contains("libcudart.so.12"), "{log}");
        assert!(log.contains("libcuda.so.535.261.03"), "{log}");
        // The runtime finds the driver, whose cuInit finds no device.
        assert_eq!(target.cmd("malloc 1048576"), "err 100");
        assert_eq!(target.cmd("malloc 4096"), "err 100");
        let calls = attach.wait_calls(2, |c| func(c) == "cudaMalloc");
        assert_eq!(calls[0]["size"], 1048576);
        assert_eq!(calls[0]["ret"], 100);
        assert_eq!(calls[1]["size"], 4096);
        assert_eq!(calls[1]["ret"], 100);
        // A direct call after them, so every nested one has been read.
        assert_eq!(target.cmd("init 0"), "err 100");
        attach.wait_calls(1, |c| func(c) == "cuInit");
        let all = attach.of_type("call");
        let driver: Vec<&Value> = all.iter().filter(|c| func(c) != "cudaMalloc").collect();
        assert_eq!(
            driver.len(),
            1,
            "the driver calls inside cudaMalloc count once, as cudaMalloc: {all:?}"
        );
        let report = attach.stop();
        assert_eq!(report["ledger"]["by_kind"]["device"]["failed"], 2);
        assert_eq!(report["ledger"]["total_bytes"], 0);
    });
}

#[test]
fn direct_calls_through_the_driver_trampolines_carry_their_arguments_and_results() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let Some(libs) = driver_libs() else { return };
    leaves_dev_alone(|| {
        let mut target = cudaload(Path::new("-"), &libs.join("libcuda.so.1"), &libs);
        let attach = Attach::start(target.pid(), &[]);
        // Each exported entry point is `cmpl $MAGIC, rip-relative; je; jmp
        // *rip-relative`: every probe sits on the emulated `je`, not on the
        // single-stepped compare.
        let log = attach.stderr();
        let line = log
            .lines()
            .find(|l| l.contains("libcuda.so.535.261.03"))
            .unwrap_or_else(|| panic!("{log}"));
        let count = |what: &str| -> u64 {
            let at = line.find(what).unwrap_or_else(|| panic!("{line}"));
            line[..at]
                .rsplit(['(', ','])
                .next()
                .and_then(|w| w.trim().parse().ok())
                .unwrap_or_else(|| panic!("{line}"))
        };
        let functions = count(" functions");
        assert!(functions >= 20, "{line}");
        assert_eq!(
            count(" probes past a single-stepped first instruction"),
            functions,
            "{line}"
        );
        // No device: cuInit says so; calls after it say "not initialized".
        assert_eq!(target.cmd("init 0"), "err 100");
        assert_eq!(target.cmd("drvmalloc 8192"), "err 3");
        assert_eq!(target.cmd("drvfree 0xdead0000"), "err 3");
        assert_eq!(target.cmd("drvcreate 2097152 1"), "err 3");
        assert_eq!(target.cmd("drvreserve 4194304"), "err 3");
        assert_eq!(target.cmd("drvmap 0x7f0000200000 2097152 0x1234"), "err 3");
        assert_eq!(target.cmd("drvunmap 0x7f0000200000 2097152"), "err 3");
        assert_eq!(target.cmd("drvaddrfree 0x7f0000000000 4194304"), "err 3");
        assert_eq!(target.cmd("drvrelease 0x1234"), "err 3");
        let calls = attach.wait_calls(9, |_| true);
        let names: Vec<&str> = calls.iter().map(func).collect();
        assert_eq!(
            names,
            [
                "cuInit",
                "cuMemAlloc_v2",
                "cuMemFree_v2",
                "cuMemCreate",
                "cuMemAddressReserve",
                "cuMemMap",
                "cuMemUnmap",
                "cuMemAddressFree",
                "cuMemRelease"
            ]
        );
        let rets: Vec<i64> = calls.iter().map(|c| c["ret"].as_i64().unwrap()).collect();
        assert_eq!(rets, [100, 3, 3, 3, 3, 3, 3, 3, 3]);
        let field = |i: usize, k: &str| calls[i][k].clone();
        assert_eq!(field(1, "size"), 8192);
        assert_eq!(field(1, "ptr"), "0x0", "a failed allocation has no pointer");
        assert_eq!(field(2, "ptr"), "0xdead0000");
        assert_eq!(field(3, "size"), 2097152);
        assert_eq!(field(3, "device"), 1, "read from the CUmemAllocationProp");
        assert_eq!(field(4, "size"), 4194304);
        assert_eq!(field(5, "ptr"), "0x7f0000200000");
        assert_eq!(field(5, "size"), 2097152);
        assert_eq!(field(6, "ptr"), "0x7f0000200000");
        assert_eq!(field(7, "size"), 4194304);
        assert_eq!(field(8, "ptr"), "0x1234");
        for c in &calls {
            assert_eq!(c["pid"], target.pid());
        }
        let report = attach.stop();
        assert_eq!(report["ledger"]["by_kind"]["device"]["failed"], 1);
        assert_eq!(report["ledger"]["by_kind"]["vmm_physical"]["failed"], 1);
        // Detached: the process calls on, untraced and unchanged.
        assert_eq!(target.cmd("drvmalloc 1"), "err 3");
    });
}

#[test]
fn a_node_with_the_driver_libraries_and_no_kernel_module_is_told_so() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(libs) = driver_libs() else { return };
    if module_loaded() {
        eprintln!("skipped: this node has the NVIDIA kernel module loaded");
        return;
    }
    let env = [("LD_LIBRARY_PATH", libs.display().to_string())];
    let says = |text: &str| {
        assert!(
            text.contains("NVIDIA driver libraries 535.261.03"),
            "{text}"
        );
        assert!(text.contains("libnvidia-ml.so.535.261.03"), "{text}");
        assert!(
            text.contains("the NVIDIA kernel module is not loaded"),
            "{text}"
        );
        assert!(text.contains("modprobe nvidia"), "{text}");
    };
    leaves_dev_alone(|| {
        let run = |args: &[&str]| {
            let out = Command::new(tracer_e2e::tracer_bin())
                .args(args)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .output()
                .expect("run tracer");
            String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
        };
        let dir = &sc.dir;
        let store = dir.path().join("t.db");
        let store_s = store.to_str().unwrap();
        let doctor: Value =
            serde_json::from_str(&run(&["doctor", "--format", "json", "--store", store_s]))
                .expect("doctor json");
        let nvml = doctor["checks"]
            .as_array()
            .or(doctor.as_array())
            .expect("checks")
            .iter()
            .find(|c| c["name"] == "NVML")
            .expect("an NVML check")
            .clone();
        assert_eq!(nvml["status"], "warn", "{nvml}");
        says(nvml["detail"].as_str().unwrap());
        says(&run(&["top", "--once", "--store", store_s]));
        let rec = Recorder::on(&store).envs(&env).start();
        says(&rec.stop());
        // Without the libraries it is the normal no-GPU state, not a warning.
        let plain = tracer_json(&["doctor", "--format", "json", "--store", store_s]);
        let plain = plain["checks"]
            .as_array()
            .or(plain.as_array())
            .unwrap()
            .iter()
            .find(|c| c["name"] == "NVML")
            .unwrap()
            .clone();
        assert_eq!(plain["status"], "info", "{plain}");
        assert!(
            plain["detail"]
                .as_str()
                .unwrap()
                .contains("no NVIDIA driver libraries"),
            "{plain}"
        );
    });
}

#[test]
fn doctor_pid_lists_the_driver_and_runtime_releases_a_process_loaded() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let Some(libs) = driver_libs() else { return };
    leaves_dev_alone(|| {
        let target = cudaload(&real_cudart(), &libs.join("libcuda.so.1"), &libs);
        let out = tracer(&[
            "doctor",
            "--pid",
            &target.pid().to_string(),
            "--store",
            "/nonexistent/dir/x.db",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("CUDA versions in pid {}", target.pid())))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("runtime 12.9.79 (libcudart.so.12)"), "{line}");
        assert!(
            line.contains("driver 535.261.03 (libcuda.so.535.261.03)"),
            "{line}"
        );
        if !module_loaded() {
            assert!(line.contains("kernel module not loaded"), "{line}");
        }
    });
}
