//! End-to-end tests of heap tracing: `tracer attach --host` on a program
//! that is already running (tests/c/heapsites.c), with its known sites,
//! built with and without frame pointers, under glibc and jemalloc, in
//! another mount namespace; and the errors a user meets.

use std::{path::Path, process::Command};

use serde_json::Value;
use tracer_e2e::{
    Attach, CudaLoad, Recorder, Scenario, TestCgroup, explain_json, heapsites, tracer, wait_for,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// What each site of heapsites holds at "done", per unit of scale, in
/// rank order.
const SITES: [(&str, u64); 8] = [
    ("big_blocks", 1024 * KIB),
    ("leak_steadily", 512 * KIB),
    ("small_blocks", 256 * KIB),
    ("grow_by_realloc", 128 * KIB),
    ("zeroed_blocks", 64 * KIB),
    ("aligned_blocks", 32 * KIB),
    // Anonymous mmap and mremap outside the allocator (syscall tracepoints).
    ("mapped_blocks", 24 * KIB),
    ("remapped_blocks", 8 * KIB),
];
/// Blocks live at "done" per unit of scale.
const BLOCKS: [u64; 8] = [4, 16, 64, 4, 4, 4, 2, 1];

/// The jemalloc of Debian's libjemalloc2 (installed by `cargo xtask setup`).
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
/// tcmalloc of Debian's libtcmalloc-minimal4 (installed by `cargo xtask setup`).
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";

fn function(site: &Value, i: usize) -> &str {
    site["frames"][i]["function"].as_str().unwrap_or("")
}

/// Starts `cmd` (heapsites), attaches with `extra`, lets it allocate,
/// stops the tracer while everything is live; returns the final report
/// and the tracer's stderr.
fn traced(cmd: Command, extra: &[&str]) -> (Value, String) {
    let mut prog = CudaLoad::spawn(cmd);
    let mut args = vec!["--host"];
    args.extend_from_slice(extra);
    let attach = Attach::start(prog.pid(), &args);
    let done = prog.cmd("go");
    assert!(done.starts_with("done "), "{done}");
    // A second of summaries after the last allocation.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let err = attach.stderr();
    let report = attach.stop();
    prog.exit();
    (report, err)
}

/// Checks that the sites are there, in rank order, with their stacks.
fn ranked(heap: &Value, sites: usize) {
    let listed = heap["sites"].as_array().expect("sites");
    assert!(listed.len() >= sites, "{heap:#}");
    for (i, (name, _)) in SITES.iter().take(sites).enumerate() {
        let s = &listed[i];
        assert_eq!(function(s, 0), *name, "site {i}: {s:#}");
        assert_eq!(function(s, 1), "run", "{s:#}");
        assert_eq!(function(s, 2), "main", "{s:#}");
        assert_eq!(s["frames"][0]["file"], "heapsites.c", "{s:#}");
        assert!(s["frames"][0]["line"].as_u64().unwrap_or(0) > 0, "{s:#}");
    }
}

fn exact(report: &Value, scale: u64) {
    let heap = &report["heap"];
    ranked(heap, SITES.len());
    for (i, (name, bytes)) in SITES.iter().enumerate() {
        let s = &heap["sites"][i];
        assert_eq!(
            s["live_bytes"].as_u64(),
            Some(bytes * scale),
            "{name}: {s:#}"
        );
        assert_eq!(
            s["live_samples"].as_u64(),
            Some(BLOCKS[i] * scale),
            "{name}"
        );
    }
    // churn (malloc + free) and free(NULL) leave nothing; nothing else live
    // was allocated after attach.
    let total: u64 = SITES.iter().map(|(_, b)| b * scale).sum();
    assert_eq!(heap["live_bytes"].as_u64(), Some(total), "{heap:#}");
    assert_eq!(heap["lost_samples"], 0);
    // Every sample unwound past its allocator's caller (whole stack copies).
    assert_eq!(heap["shallow_samples"], 0, "{heap:#}");
    assert_eq!(report["probes"]["map_full"], 0);
    assert_eq!(report["probes"]["stack_lost"], 0);
}

fn sampled(report: &Value, scale: u64) {
    let heap = &report["heap"];
    // The largest sites hold hundreds of samples each: their order is
    // certain; the smallest two are close enough to swap.
    ranked(heap, 5);
    let total: u64 = SITES.iter().map(|(_, b)| b * scale).sum();
    let est = heap["live_bytes"].as_u64().unwrap();
    let err = (est as f64 - total as f64).abs() / total as f64;
    // The estimate's standard error here is about 3% of the total.
    assert!(
        err < 0.10,
        "estimated {est} vs {total}: {:.1}% off",
        err * 100.0
    );
    assert_eq!(heap["lost_samples"], 0);
    let probes = &report["probes"];
    let sampled = probes["sampled"].as_u64().unwrap();
    let calls = probes["calls"].as_u64().unwrap();
    assert!(sampled > 500 && sampled < calls / 10, "{probes}");
}

fn in_cgroup(cg: &TestCgroup, bin: &Path, scale: u64) -> Command {
    let mut cmd = cg.command(bin);
    cmd.arg(scale.to_string());
    cmd
}

#[test]
fn sites_of_a_running_program_are_ranked_and_exact_with_sampling_off() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let cg = TestCgroup::new("heap-exact", 256 * MIB);
    let dir = &sc.dir;
    for variant in ["nofp", "fp"] {
        let svg = dir.path().join(format!("{variant}.svg"));
        let profile = dir.path().join(format!("{variant}.pb.gz"));
        let (report, err) = traced(
            in_cgroup(&cg, &heapsites(variant), 2),
            &[
                "--sample-bytes",
                "0",
                "--flamegraph",
                svg.to_str().unwrap(),
                "--pprof",
                profile.to_str().unwrap(),
            ],
        );
        exact(&report, 2);
        // Go's pprof: every site, and big_blocks' 2 MiB where it allocated.
        let top = tracer_e2e::go_pprof(
            &[
                "-top",
                "-nodefraction=0",
                "-unit=B",
                "-sample_index=inuse_space",
            ],
            &profile,
        );
        for (name, _) in SITES {
            assert!(
                top.contains(name),
                "{name} missing from pprof's view: {top}"
            );
        }
        assert!(
            top.lines()
                .any(|l| l.trim_start().starts_with("2097152B") && l.ends_with(" big_blocks")),
            "{top}"
        );
        // The flame graph of live bytes: an SVG with every site's frame,
        // and the 2 MiB of big_blocks in its tooltip.
        let svg = std::fs::read_to_string(&svg).expect("flame graph written");
        assert!(
            svg.starts_with("<?xml") && svg.contains("<svg"),
            "{svg:.200}"
        );
        for (name, _) in SITES {
            assert!(svg.contains(name), "{name} missing from the flame graph");
        }
        assert!(
            svg.contains("big_blocks (2,097,152 bytes"),
            "big_blocks' bytes"
        );
        // glibc's free starts with a single-stepped `test`: its probe, and
        // others, sit on the emulated branch after it.
        assert!(
            err.contains("libc.so.6") && !err.contains(" 0 probes past"),
            "{err}"
        );
    }
}

#[test]
fn default_sampling_estimates_within_ten_percent() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    // About 760 MiB live at scale 384, in a cgroup that holds it.
    let cg = TestCgroup::new("heap-sampled", 2048 * MIB);
    for variant in ["nofp", "fp"] {
        let (report, _) = traced(in_cgroup(&cg, &heapsites(variant), 384), &[]);
        sampled(&report, 384);
    }
}

#[test]
fn jemalloc_preloaded_is_traced_in_place_of_libc() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    assert!(
        Path::new(JEMALLOC).exists(),
        "{JEMALLOC} is missing: run `cargo xtask setup` (Debian's libjemalloc2)"
    );
    let cg = TestCgroup::new("heap-jemalloc", 256 * MIB);
    let mut cmd = in_cgroup(&cg, &heapsites("nofp"), 2);
    cmd.env("LD_PRELOAD", JEMALLOC);
    let (report, err) = traced(cmd, &["--sample-bytes", "0"]);
    assert!(err.contains("libjemalloc.so.2"), "{err}");
    exact(&report, 2);
}

#[test]
fn tcmalloc_preloaded_is_traced_in_place_of_libc() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    assert!(
        Path::new(TCMALLOC).exists(),
        "{TCMALLOC} is missing: run `cargo xtask setup` (Debian's libtcmalloc-minimal4)"
    );
    let cg = TestCgroup::new("heap-tcmalloc", 256 * MIB);
    let mut cmd = in_cgroup(&cg, &heapsites("nofp"), 2);
    cmd.env("LD_PRELOAD", TCMALLOC);
    let (report, err) = traced(cmd, &["--sample-bytes", "0"]);
    assert!(err.contains("libtcmalloc_minimal.so"), "{err}");
    // tcmalloc hooks mmap itself (and calls libc's syscall()): the mapped
    // sites are still the program's functions.
    exact(&report, 2);
}

#[test]
fn a_musl_program_is_traced_in_musl() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    // Debian's musl-tools (installed by `cargo xtask setup`).
    let dir = &sc.dir;
    let bin = dir.path().join("heapsites-musl");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/c/heapsites.c");
    let built = Command::new("musl-gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&bin)
        .arg(src)
        .status()
        .expect("musl-gcc is missing: run `cargo xtask setup` (Debian's musl-tools)");
    assert!(built.success());
    let cg = TestCgroup::new("heap-musl", 256 * MIB);
    let (report, err) = traced(in_cgroup(&cg, &bin, 2), &["--sample-bytes", "0"]);
    assert!(err.contains("x86_64-linux-musl/libc.so"), "{err}");
    let heap = &report["heap"];
    // The malloc family: exact, named. Debian's musl has no unwind tables,
    // so its mmap wrapper's callers cannot be unwound: those bytes count
    // in the total, at a site of their own.
    ranked(heap, 6);
    for (i, (name, bytes)) in SITES.iter().take(6).enumerate() {
        assert_eq!(
            heap["sites"][i]["live_bytes"].as_u64(),
            Some(bytes * 2),
            "{name}"
        );
    }
    let total: u64 = SITES.iter().map(|(_, b)| b * 2).sum();
    assert_eq!(heap["live_bytes"].as_u64(), Some(total), "{heap:#}");
    assert_eq!(heap["lost_samples"], 0);
}

#[test]
fn a_program_in_another_mount_namespace_is_named() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    // The program runs from a tmpfs mounted over a directory in its own
    // mount namespace only: on the host the directory is empty, so names
    // can only come through /proc/PID.
    let dir = &sc.dir;
    let d = dir.path().display().to_string();
    let src = heapsites("nofp").display().to_string();
    let script = format!("mount -t tmpfs none {d} && cp {src} {d}/hs && exec {d}/hs 1");
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    let (report, _) = traced(cmd, &["--sample-bytes", "0"]);
    assert!(
        !dir.path().join("hs").exists(),
        "the tmpfs leaked to the host"
    );
    exact(&report, 1);
}

#[test]
fn a_traced_process_killed_by_a_memcg_oom_keeps_its_top_sites() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("heap-oom", 96 * MIB);
    let rec = Recorder::on(&store)
        .args(&["--host-cgroup", &cg.path])
        .start();
    // Started after the recorder, in the traced cgroup: found at its exec.
    let mut prog = CudaLoad::spawn(in_cgroup(&cg, &heapsites("nofp"), 8));
    let pid = prog.pid();
    let attached = wait_for(std::time::Duration::from_secs(20), || {
        rec.log().contains(&format!("for pid {pid}")).then_some(())
    });
    assert!(attached.is_some(), "never attached: {}", rec.log());
    assert!(prog.cmd("go").starts_with("done "));
    // grow_until_killed takes 1 MiB every 50 ms until the kernel kills it.
    prog.send("grow");
    let killed = wait_for(std::time::Duration::from_secs(30), || {
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.path);
    let pid_s = pid.to_string();
    let v = explain_json(
        &["--store", store.to_str().unwrap(), "--pid", &pid_s],
        |v| !v["kill"]["victim"]["heap"].is_null(),
    );
    let heap = &v["kill"]["victim"]["heap"];
    let sites = heap["sites"].as_array().expect("sites");
    assert_eq!(function(&sites[0], 0), "grow_until_killed", "{heap:#}");
    assert_eq!(function(&sites[0], 1), "main", "{heap:#}");
    // Growing: most of its bytes are recent, and it holds tens of MiB
    // (1 MiB blocks are kept whole, not sampled).
    let top = sites[0]["live_bytes"].as_u64().unwrap();
    assert!((32 * MIB..=96 * MIB).contains(&top), "{heap:#}");
    assert!(
        sites.iter().any(|s| function(s, 0) == "big_blocks"),
        "{heap:#}"
    );
    // And in the text.
    let out = tracer(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--pid",
        &pid_s,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("heap ") && text.contains("grow_until_killed (heapsites.c:"),
        "{text}"
    );
    drop(prog);
    rec.stop();
}

#[test]
fn bad_input_is_said_clearly() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    // A stripped static binary: its allocator is its own.
    let prog = CudaLoad::spawn({
        let mut c = Command::new(heapsites("static"));
        c.arg("1");
        c
    });
    let out = tracer(&["attach", "--host", "--pid", &prog.pid().to_string()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        e.contains("no allocator") && e.contains("malloc and free") && e.contains("static"),
        "{e}"
    );
    prog.exit();
    // A process that exits while tracer attaches (its libc mapped
    // already): a clear end either way.
    tracer_e2e::attach_to_an_exiting_process(&["attach", "--host"], 400, 100);
    // Not root.
    let prog = CudaLoad::spawn({
        let mut c = Command::new(heapsites("nofp"));
        c.arg("1");
        c
    });
    let out = tracer_e2e::tracer_as_nobody(&["attach", "--host", "--pid", &prog.pid().to_string()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs root"),
        "{out:?}"
    );
    // A flame graph path planted as a link by another user: refused before
    // anything is attached, the link's target untouched.
    let dir = &sc.dir;
    let target = dir.path().join("precious");
    std::fs::write(&target, b"keep").unwrap();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let planted = theirs.join("heap.svg");
    std::os::unix::fs::symlink(&target, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let out = tracer(&[
        "attach",
        "--host",
        "--pid",
        &prog.pid().to_string(),
        "--duration",
        "1s",
        "--flamegraph",
        planted.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symbolic link"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    // A sampling period the kernel's arithmetic cannot take.
    let out = tracer(&[
        "attach",
        "--host",
        "--pid",
        &prog.pid().to_string(),
        "--sample-bytes",
        "2TiB",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--sample-bytes"),
        "{out:?}"
    );
    prog.exit();
}

/// The first Python frame of a site named `function`, as (file, line).
fn python_at(site: &Value, function: &str) -> Option<(String, u64)> {
    site["frames"].as_array()?.iter().find_map(|f| {
        (f["python"] == true && f["function"] == function).then(|| {
            (
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
    })
}

/// `attach --host` to a CPython script started before it: its sites are
/// ranked by live bytes and named by the Python function and line that
/// allocated (Debian's stripped 3.11, and pyenv's 3.13 with libpython
/// shared).
#[test]
fn a_python_script_started_before_attach_is_named_by_its_lines() {
    let Some(_sc) = Scenario::new() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/heap_sites.py");
    let text = std::fs::read_to_string(&script).unwrap();
    let line = |mark: &str| text.lines().position(|l| l.contains(mark)).unwrap() as u64 + 1;
    let (big, small) = (line("# BIG-LINE"), line("# SMALL-LINE"));
    let cg = TestCgroup::new("heap-py", 256 * MIB);
    let mut pythons = vec![std::path::PathBuf::from("/usr/bin/python3.11")];
    pythons.extend(tracer_e2e::pyenv_python(13));
    // And Debian's interpreter copied with the script into a tmpfs mounted
    // in the program's own mount namespace only (a container's view):
    // neither file is at its path on the host.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let in_namespace = format!(
        "mount -t tmpfs none {d} && cp /usr/bin/python3.11 {script} {d}/ && exec {d}/python3.11 {d}/heap_sites.py",
        script = script.display()
    );
    pythons.push(in_namespace.into());
    for python in pythons {
        let cmd = if python.starts_with("/") {
            let mut cmd = cg.command(&python);
            cmd.arg(&script);
            cmd
        } else {
            let mut cmd = cg.command("unshare");
            cmd.args(["--mount", "--propagation", "private", "sh", "-c"]);
            cmd.arg(&python);
            cmd
        };
        let (report, err) = traced(cmd, &["--sample-bytes", "0"]);
        let heap = &report["heap"];
        let sites = heap["sites"].as_array().expect("sites");
        assert!(
            !dir.path().join("heap_sites.py").exists(),
            "the tmpfs leaked to the host"
        );
        let who = python.display();
        let file_of = |s: &Value, f: &str| {
            python_at(s, f).map(|(file, l)| (file.ends_with("/heap_sites.py"), l))
        };
        assert_eq!(
            file_of(&sites[0], "big"),
            Some((true, big)),
            "{who}: {heap:#}\n{err}"
        );
        assert!(
            sites[0]["live_bytes"].as_u64().unwrap() >= 40 * 256 * KIB,
            "{who}: {heap:#}"
        );
        assert_eq!(
            file_of(&sites[1], "small"),
            Some((true, small)),
            "{who}: {heap:#}"
        );
        assert!(
            sites[1]["live_bytes"].as_u64().unwrap() >= 40 * 64 * KIB,
            "{who}: {heap:#}"
        );
    }
}
