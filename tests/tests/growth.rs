//! End-to-end tests of growth attribution: `tracer record` (growth on by
//! default for memory-limited processes) while a process grows in a memory
//! cgroup until the kernel kills it, under glibc, jemalloc and CPython; and
//! the promise that no process's C library is probed while there is no
//! pressure.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use tracer_e2e::{
    Attach, CudaLoad, Proc, Recorder, Scenario, TestCgroup, explain_json, grower, heapsites,
    summary_of, tracer, wait_for,
};

const MIB: u64 = 1 << 20;
/// The jemalloc of Debian's libjemalloc2 (installed by `cargo xtask setup`).
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

fn function(frames: &Value, i: usize) -> &str {
    frames[i]["function"].as_str().unwrap_or("")
}

/// Records while `cmd` (started in `cg`, answering "ready") is told to go
/// and grows until the kernel kills it; returns the kill's JSON and its
/// text.
fn killed_while_recording(cg: &TestCgroup, cmd: Command) -> (Value, String, Value) {
    killed_after(cg, cmd, Duration::ZERO)
}

/// [`killed_while_recording`], with `settle` between the program's
/// "ready" and its growth.
fn killed_after(cg: &TestCgroup, cmd: Command, settle: Duration) -> (Value, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t.db");
    // Named, so armed from the start: what grew before it neared its
    // limit is seen too (growth_on_risk_follows_only_the_cgroup_at_risk
    // tests arming on risk itself).
    let rec = Recorder::on(&store)
        .args(&["--growth-cgroup", &cg.path])
        .start();
    let mut prog = CudaLoad::spawn(cmd);
    let pid = prog.pid().to_string();
    std::thread::sleep(settle);
    prog.send("go");
    let killed = wait_for(Duration::from_secs(60), || {
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.describe());
    let store_s = store.to_str().unwrap();
    let v = explain_json(&["--store", store_s, "--pid", &pid], |v| {
        !v["kill"]["growth"].is_null() && !v["kill"]["tipping_stack"].is_null()
    });
    let out = tracer(&["explain", "--store", store_s, "--pid", &pid]);
    drop(prog);
    let summary = summary_of(&rec.stop()).expect("the recorder's summary");
    (
        v["kill"].clone(),
        String::from_utf8_lossy(&out.stdout).into(),
        summary,
    )
}

/// The grower's growth and tipping stack name build_index first.
fn names_build_index(kill: &Value, text: &str, limit: u64) {
    names_build_index_of(kill, text, limit, true);
}

/// [`names_build_index`], with `grown` bytes seen growing (the limit, or
/// what was left of it when its cgroup armed) and the reservation made at
/// the start seen or not (`reserved`).
fn names_build_index_of(kill: &Value, text: &str, grown: u64, reserved: bool) {
    let limit = grown;
    let g = &kill["growth"];
    let sites = g["sites"].as_array().expect("sites");
    assert_eq!(function(&sites[0]["frames"], 0), "build_index", "{g:#}");
    assert_eq!(function(&sites[0]["frames"], 1), "main", "{g:#}");
    // The whole main-thread stack was copied and unwound, up to the
    // program's first frame (the copy ends where the stack began).
    let frames = sites[0]["frames"].as_array().expect("frames");
    assert_eq!(
        frames.last().map(|f| f["function"].as_str()),
        Some(Some("_start")),
        "{g:#}"
    );
    // About the limit was faulted in (one sample per MiB: within a third).
    let bytes = g["bytes"].as_u64().unwrap();
    assert!(
        (limit * 2 / 3..=limit * 4 / 3).contains(&bytes),
        "{bytes} bytes of growth for a {limit}-byte limit: {g:#}"
    );
    assert_eq!(g["lost_samples"], 0, "{g:#}");
    // The untouched 96 MiB mapping is a reservation, not growth.
    if reserved {
        let reserved = g["reserved"].as_array().expect("reserved");
        assert!(
            reserved
                .iter()
                .any(|r| function(&r["frames"], 0) == "reserve_arena" && r["bytes"] == 96 * MIB),
            "{g:#}"
        );
    }
    let tip = &kill["tipping_stack"];
    assert_eq!(function(&tip["frames"], 0), "build_index", "{tip:#}");
    assert_eq!(tip["victim_is_trigger"], true, "{tip:#}");
    assert_eq!(tip["pid"], kill["victim"]["pid"], "{tip:#}");
    assert!(
        text.contains("  growth ")
            && text.contains("build_index (grower.c:")
            && (!reserved || text.contains("  reserved   "))
            && text.contains("  tipped by  the allocation that hit the limit: grower (pid"),
        "{text}"
    );
}

#[test]
fn a_memcg_oom_kill_names_the_code_that_grew_and_the_allocation_that_tipped_it() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let limit = 128 * MIB;
    let cg = TestCgroup::new("growth", limit);
    let mut cmd = cg.command(grower());
    cmd.arg("grow");
    // Its warm-up is sampled and named first (its maps read, libnode's
    // symbols parsed), as for a program that ran a while before it grew.
    let (kill, text, summary) = killed_after(&cg, cmd, Duration::from_millis(1500));
    names_build_index(&kill, &text, limit);
    // The kernel counted the victim's faults, one sample per MiB of them,
    // and lost none.
    let g = &summary["summary"]["growth"];
    assert!(
        g["faults"].as_u64().unwrap() >= limit / 4096 / 2,
        "{summary}"
    );
    assert_eq!(g["ring_full"], 0, "{summary}");
    assert_eq!(g["tips"], 1, "{summary}");
}

/// With `--growth risk` nothing is followed until a memory cgroup is at
/// risk. A process faulting in and unmapping 16 MiB at a time far under
/// its cgroup's limit is never counted, with the page-fault programs
/// attached or not; a grower crossing 60 % of its limit arms its cgroup
/// within a tick and its kill names the function that grew; once its
/// cgroup holds no process it disarms and the programs come off.
#[test]
fn growth_on_risk_follows_only_the_cgroup_at_risk() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let quiet_cg = TestCgroup::new("risk-quiet", 512 * MIB);
    let limit = 192 * MIB;
    let cg = TestCgroup::new("risk", limit);
    let rec = Recorder::on(&sc.store).args(&["--growth", "risk"]).start();
    let mut quiet = {
        let mut cmd = quiet_cg.command(grower());
        cmd.args(["touch", "16"]);
        CudaLoad::spawn(cmd)
    };
    // 64 MiB of faults with no cgroup at risk: the programs are off.
    for _ in 0..4 {
        assert!(quiet.cmd("round").starts_with("ns/page "));
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        !rec.log().contains("page-fault sampling on"),
        "{}",
        rec.log()
    );
    // A grower at 8 MiB every 150 ms (about 50 MiB/s): 60 % of its limit
    // in some 2.3 s, the limit some 1.5 s later.
    let mut prog = {
        let mut cmd = cg.command(grower());
        cmd.args(["grow", "150"]);
        CudaLoad::spawn(cmd)
    };
    let pid = prog.pid().to_string();
    prog.send("go");
    let level = limit * 60 / 100;
    let mut crossed = None;
    let mut quiet_rounds = 0u64;
    let killed = wait_for(Duration::from_secs(60), || {
        if crossed.is_none() && cg.usage() >= level {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            crossed = Some(now.unwrap().as_nanos() as i64);
        }
        // The quiet process faults on while the other cgroup is armed.
        if quiet_rounds < 64 && quiet.cmd("round").starts_with("ns/page ") {
            quiet_rounds += 1;
        }
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.describe());
    let store_s = sc.store.to_str().unwrap();
    let v = explain_json(&["--store", store_s, "--pid", &pid], |v| {
        !v["kill"]["growth"].is_null() && !v["kill"]["tipping_stack"].is_null()
    });
    let out = tracer(&["explain", "--store", store_s, "--pid", &pid]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    drop(prog);
    // Its cgroup holds no process now: disarmed, the programs off.
    let off = wait_for(Duration::from_secs(10), || {
        rec.log().contains("page-fault sampling off").then_some(())
    });
    assert!(off.is_some(), "{}", rec.log());
    let events = tracer(&["events", "--store", store_s, "--kind", "growth_armed"]);
    let events: Vec<Value> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|e: &Value| e["memcg_path"] == cg.path.as_str())
        .collect();
    assert_eq!(events.len(), 2, "armed, then disarmed: {events:#?}");
    assert_eq!(events[0]["armed"], true, "{events:#?}");
    assert_eq!(events[1]["armed"], false, "{events:#?}");
    let armed_at = events[0]["ts_ns"].as_i64().unwrap();
    let crossed = crossed.expect("the grower crossed 60 %");
    let latency_ms = (armed_at - crossed) as f64 / 1e6;
    eprintln!(
        "armed {latency_ms:.0} ms after crossing 60 % ({}, seen by {}); quiet rounds {quiet_rounds}",
        events[0]["reason"], events[0]["seen"]
    );
    // Read between samples once it rose near the level: well under a tick.
    assert!(latency_ms < 500.0, "{latency_ms} ms: {events:#?}");
    // What grew after it armed is named; the 96 MiB reservation made at
    // its start, before, is not seen.
    let percent = events[0]["percent"].as_f64().unwrap();
    let grown = (limit as f64 * (100.0 - percent) / 100.0) as u64;
    names_build_index_of(&v["kill"], &text, grown, false);
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    // The kill says since when its growth was sampled.
    let armed = &v["kill"]["growth_armed"];
    assert_eq!(armed["memcg"], cg.path.as_str(), "{armed}");
    assert_eq!(armed["reason"], "level", "{armed}");
    assert_eq!(armed["since_ns"], events[0]["ts_ns"], "{armed}");
    assert!(
        text.contains(&format!("since {} armed (at ", cg.path))
            && text.contains("over the arming level and growing; earlier growth not sampled)"),
        "{text}"
    );
    assert!(
        !rec.log().contains(&quiet_cg.path),
        "the quiet cgroup was armed: {}",
        rec.log()
    );
    let summary = summary_of(&rec.stop()).expect("summary");
    quiet.exit();
    // The faults counted are the grower's (its limit's worth, at most a
    // few rounds over): not the quiet process's 16 MiB rounds, which
    // alone are more.
    let faults = summary["summary"]["growth"]["faults"].as_u64().unwrap();
    let quiet_faults = (4 + quiet_rounds) * 16 * MIB / 4096;
    assert!(quiet_faults > 2 * limit / 4096, "{quiet_rounds} rounds");
    assert!(
        faults <= 2 * limit / 4096 && faults >= limit / 4096 / 4,
        "faults {faults}, the grower's {} pages, the quiet one's {quiet_faults}: {summary}",
        limit / 4096
    );
    assert_eq!(summary["summary"]["growth_arming"]["arms"], 1, "{summary}");
}

/// On cgroup v2, a cgroup whose usage goes over its `memory.high` arms,
/// far under its limit and not growing any more: the kernel throttled it
/// into reclaim (`memory.events` high).
#[test]
fn v2_only_a_cgroup_over_memory_high_arms_growth() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    if tracer_e2e::memory_root().1 {
        eprintln!("not run: memory.high is cgroup v2 only, and memory is on v1 here");
        return;
    }
    let cg = TestCgroup::new("high", 256 * MIB);
    std::fs::write(cg.dir().join("memory.high"), (32 * MIB).to_string()).expect("memory.high");
    let rec = Recorder::on(&sc.store).start();
    let mut hog = {
        let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
        cmd.args(["--step-mib", "4", "--interval-ms", "50", "--max-mib", "48"]);
        Proc::spawn(cmd)
    };
    hog.wait_line("held 48 MiB");
    let store_s = sc.store.to_str().unwrap();
    let armed = wait_for(Duration::from_secs(30), || {
        let out = tracer(&["events", "--store", store_s, "--kind", "growth_armed"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["memcg_path"] == cg.path.as_str() && e["armed"] == true)
    })
    .unwrap_or_else(|| panic!("not armed: {}\n{}", cg.describe(), rec.log()));
    assert_eq!(armed["reason"], "high", "{armed}");
    assert!(
        armed["percent"].as_f64().is_some_and(|p| p < 60.0),
        "{armed}"
    );
    drop(hog);
    rec.stop();
}

/// Growth is what was kept: a temporary buffer faulted in and unmapped
/// every round (glibc maps and unmaps a 40 MiB block) faults in far more
/// than the leak beside it, and is ranked below it.
#[test]
fn a_temporary_buffer_unmapped_again_ranks_below_the_leak_that_kept_its_memory() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    // The leak is at least 150 MiB at the kill, the buffer in use at most
    // 40: far apart, whatever the sampling's spread.
    let limit = 192 * MIB;
    let cg = TestCgroup::new("growth-net", limit);
    let mut cmd = cg.command(grower());
    cmd.arg("churn");
    let (kill, text, _) = killed_while_recording(&cg, cmd);
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    let g = &kill["growth"];
    let sites = g["sites"].as_array().expect("sites");
    // Where the map-lock tracepoint carries no memcg id (older kernels),
    // memory given back is not traced, and the report says faulted in.
    let format = std::fs::read_to_string(
        "/sys/kernel/tracing/events/mmap_lock/mmap_lock_acquire_returned/format",
    )
    .unwrap_or_default();
    // Where transparent huge pages are always on, the buffer's 2 MiB pages
    // fault in once each and are counted as one base page (the guests):
    // which site faulted in more is not measured there.
    let thp_always = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|t| t.contains("[always]"));
    if !format.contains("memcg_id") {
        assert!(g["returned_bytes"].is_null(), "{g:#}");
        assert!(
            thp_always || function(&sites[0]["frames"], 0) == "format_report",
            "{g:#}"
        );
        assert!(
            !text.contains(" kept of ") && text.contains(" faulted in over "),
            "{text}"
        );
        return;
    }
    let at = |name: &str| {
        sites
            .iter()
            .find(|s| function(&s["frames"], 0) == name)
            .unwrap_or_else(|| panic!("no {name} site: {g:#}"))
    };
    let kept = |s: &Value| s["bytes"].as_u64().unwrap() - s["returned_bytes"].as_u64().unwrap();
    let (index, report) = (at("build_index"), at("format_report"));
    // Ranked by what was kept: the leak first.
    assert_eq!(function(&sites[0]["frames"], 0), "build_index", "{g:#}");
    // Faulted in, the temporary buffer leads by far; almost all of it was
    // given back (what is kept is at most the one in use at the kill).
    assert!(
        thp_always || report["bytes"].as_u64().unwrap() > 4 * index["bytes"].as_u64().unwrap(),
        "{g:#}"
    );
    // (Sampled: one 40 MiB buffer, within the estimate's spread.)
    assert!(kept(report) <= 64 * MIB, "{g:#}");
    assert!(
        kept(report) * 10 < report["bytes"].as_u64().unwrap(),
        "{g:#}"
    );
    assert!(kept(index) >= 100 * MIB, "{g:#}");
    assert!(g["returned_bytes"].as_u64().unwrap() >= 128 * MIB, "{g:#}");
    assert!(
        text.contains(" kept of ") && text.contains(" faulted in)  format_report (grower.c:"),
        "{text}"
    );
}

#[test]
fn a_kill_of_another_process_names_the_allocation_that_tipped_it() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let limit = 128 * MIB;
    let cg = TestCgroup::new("growth-tip", limit);
    let store = sc.store.clone();
    let rec = Recorder::on(&store)
        .args(&["--growth-cgroup", &cg.path])
        .start();
    // A large idle process, then a small one that grows until the cgroup
    // is full: the kernel kills the large one (the most memory), in the
    // small one's allocation; the small one goes on growing and is killed
    // next, a few hundred ms later (its stack is named all the same).
    let mut big = {
        let mut cmd = cg.command(grower());
        cmd.args(["hold", "96"]);
        CudaLoad::spawn(cmd)
    };
    assert_eq!(big.cmd("go"), "held");
    let mut small = {
        let mut cmd = cg.command(grower());
        cmd.arg("grow");
        CudaLoad::spawn(cmd)
    };
    small.send("go");
    let killed = wait_for(Duration::from_secs(60), || {
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.describe());
    let small_pid = small.pid();
    let store_s = store.to_str().unwrap();
    let big_pid = big.pid().to_string();
    let v = explain_json(&["--store", store_s, "--pid", &big_pid], |v| {
        !v["kill"]["tipping_stack"].is_null()
    });
    let kill = &v["kill"];
    assert_eq!(kill["victim"]["pid"], big.pid(), "{kill:#}");
    let tip = &kill["tipping_stack"];
    assert_eq!(tip["pid"], small_pid, "{tip:#}");
    assert_eq!(tip["victim_is_trigger"], false, "{tip:#}");
    assert_eq!(function(&tip["frames"], 0), "build_index", "{tip:#}");
    // The victim's own growth is where it filled its memory.
    let sites = kill["growth"]["sites"].as_array().expect("sites");
    assert_eq!(function(&sites[0]["frames"], 0), "fill_cache", "{kill:#}");
    let text = tracer(&["explain", "--store", store_s, "--pid", &big_pid]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "tipped by  the allocation that hit the limit: grower (pid {small_pid}, not the victim"
        )),
        "{text}"
    );
    drop(small);
    drop(big);
    rec.stop();
}

#[test]
fn jemalloc_preloaded_is_attributed_the_same() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    assert!(
        Path::new(JEMALLOC).exists(),
        "{JEMALLOC} missing: run cargo xtask setup"
    );
    let limit = 128 * MIB;
    let cg = TestCgroup::new("growth-je", limit);
    let mut cmd = cg.command(grower());
    cmd.arg("grow").env("LD_PRELOAD", JEMALLOC);
    let (kill, text, _) = killed_while_recording(&cg, cmd);
    names_build_index(&kill, &text, limit);
}

/// The CPython interpreters of this machine kind: pyenv's 3.9 to 3.13
/// (libpython shared, with symbols) and Debian's 3.11 (linked into a
/// stripped, non-PIE executable).
fn interpreters() -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = (9..=13).filter_map(tracer_e2e::pyenv_python).collect();
    out.push("/usr/bin/python3.11".into());
    out
}

/// The line of `tests/py/grow_lists.py` marked `mark`.
fn marked_line(script: &Path, mark: &str) -> u64 {
    let text = std::fs::read_to_string(script).unwrap();
    text.lines().position(|l| l.contains(mark)).expect(mark) as u64 + 1
}

/// The first frame named `function`, as (file, line).
fn python_frame<'a>(frames: &'a Value, function: &str) -> Option<(&'a str, u64)> {
    frames.as_array()?.iter().find_map(|f| {
        (f["function"] == function).then(|| {
            (
                f["file"].as_str().unwrap_or(""),
                f["line"].as_u64().unwrap_or(0),
            )
        })
    })
}

/// Each CPython grows a list in a known function until its cgroup kills
/// it: the growth site and the tipping stack name that function, its file
/// and line, and its caller's, in place of the interpreter's loop.
#[test]
fn python_lines_that_grew_until_killed_are_named_in_every_cpython() {
    let Some(sc) = Scenario::new() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/grow_lists.py");
    let loop_line = marked_line(&script, "# LOOP-LINE");
    let (grow_line, call_line) = (
        marked_line(&script, "# GROW-LINE"),
        marked_line(&script, "# CALL-LINE"),
    );
    // Each interpreter's cgroup is made as it runs: every memory-limited
    // process followed, as before arming on risk.
    let rec = Recorder::on(&sc.store)
        .args(&["--growth", "limited"])
        .start();
    let store_s = sc.store.to_str().unwrap();
    // Each interpreter grows in its main thread, and again in a thread of
    // its own: the walk finds the sampled thread's state among the
    // interpreter's (by pthread_self() before 3.11, by the kernel's tid
    // from 3.11).
    let runs = interpreters()
        .into_iter()
        .flat_map(|p| [(p.clone(), false), (p, true)]);
    for (python, threaded) in runs {
        let limit = 96 * MIB;
        let cg = TestCgroup::new("growth-py", limit);
        let mut cmd = cg.command(&python);
        cmd.arg(&script);
        if threaded {
            cmd.arg("thread");
        }
        let mut prog = CudaLoad::spawn(cmd);
        let pid = prog.pid().to_string();
        // The recorder learns of the interpreter at its first samples (the
        // script's warm-up); the walk starts after that.
        std::thread::sleep(Duration::from_millis(300));
        prog.send("go");
        let killed = wait_for(Duration::from_secs(60), || {
            (cg.oom_kills() > 0).then_some(())
        });
        assert!(
            killed.is_some(),
            "{}: no OOM kill in {}",
            python.display(),
            cg.describe()
        );
        let v = explain_json(&["--store", store_s, "--pid", &pid], |v| {
            !v["kill"]["growth"].is_null() && !v["kill"]["tipping_stack"].is_null()
        });
        let kill = &v["kill"];
        let g = &kill["growth"];
        let at = |frames: &Value, function: &str| {
            python_frame(frames, function)
                .map(|(file, line)| (file.ends_with("/grow_lists.py"), line))
        };
        let top = &g["sites"][0]["frames"];
        let who = format!(
            "{}{}",
            python.display(),
            if threaded { " (thread)" } else { "" }
        );
        assert_eq!(at(top, "grow"), Some((true, grow_line)), "{who}: {g:#}");
        if threaded {
            // The thread's own frames: threading's, not main's.
            let outer = python_frame(top, "Thread.run")
                .or_else(|| python_frame(top, "run"))
                .map(|(file, _)| file.ends_with("/threading.py"));
            assert_eq!(outer, Some(true), "{who}: {g:#}");
            assert!(python_frame(top, "main").is_none(), "{who}: {g:#}");
        } else {
            assert_eq!(at(top, "main"), Some((true, call_line)), "{who}: {g:#}");
            assert!(python_frame(top, "<module>").is_some(), "{who}: {g:#}");
        }
        // Python frames take the place of the interpreter's loop; no frame
        // says a walk failed.
        let labels: Vec<&str> = top
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        assert!(
            !labels.contains(&"_PyEval_EvalFrameDefault"),
            "{who}: {labels:?}"
        );
        assert!(
            !labels.iter().any(|l| l.contains("unavailable")),
            "{who}: {labels:?}"
        );
        // The tip is the one fault that hit the limit, wherever in the loop
        // it came: from 3.10 the loop's jump back (where the interpreter
        // runs its periodic checks) is on the `while` line (seen once in
        // CI, 3.11 in a thread).
        let tip = &kill["tipping_stack"]["frames"];
        let tip_line = at(tip, "grow");
        assert!(
            tip_line == Some((true, grow_line)) || tip_line == Some((true, loop_line)),
            "{who}: {tip:#}"
        );
        let text = tracer(&["explain", "--store", store_s, "--pid", &pid]);
        let text = String::from_utf8_lossy(&text.stdout);
        if std::env::var_os("SHOW").is_some() {
            eprintln!("{text}\n{:#}", kill["tipping_stack"]);
        }
        assert!(
            text.contains(&format!("grow_lists.py:{grow_line}")),
            "{who}: {text}"
        );
        drop(prog);
    }
    rec.stop();
}

/// The first bytes of `function` in `pid`'s C library, and the same bytes
/// in the library's file.
fn libc_bytes(pid: u32, function: &str) -> (Vec<u8>, Vec<u8>) {
    // Where the function is in this process's libc (the same file).
    let name = std::ffi::CString::new(function).unwrap();
    // SAFETY: dlsym with a NUL-terminated name; the result is only used as
    // a number.
    let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
    assert_ne!(addr, 0, "{function}");
    let mapping = |pid: String| -> Vec<(u64, u64, u64, String)> {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (a, b) = f.first()?.split_once('-')?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                    u64::from_str_radix(f.get(2)?, 16).ok()?,
                    f.get(5)?.to_string(),
                ))
            })
            .collect()
    };
    let mine = mapping("self".into());
    let (start, _, off, path) = mine
        .iter()
        .find(|(a, b, ..)| (*a..*b).contains(&addr))
        .expect("the test's libc mapping")
        .clone();
    let file_off = addr - start + off;
    let theirs = mapping(pid.to_string());
    let (tstart, ..) = theirs
        .iter()
        .find(|(_, _, o, p)| *p == path && *o == off)
        .unwrap_or_else(|| panic!("pid {pid} maps {path}"));
    let at = tstart + (addr - start);
    use std::os::unix::fs::FileExt as _;
    let mut live = vec![0u8; 32];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut live, at)
        .unwrap();
    let mut file = vec![0u8; 32];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut file, file_off)
        .unwrap();
    (live, file)
}

#[test]
fn without_pressure_no_process_libc_is_probed() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let cg = TestCgroup::new("growth-calm", 1024 * MIB);
    let rec = Recorder::on(&store)
        .args(&["--growth-cgroup", &cg.path])
        .start();
    let mut prog = {
        let mut cmd = cg.command(grower());
        cmd.args(["touch", "16"]);
        CudaLoad::spawn(cmd)
    };
    // Faults in 16 MiB, a few times over: followed, sampled, not probed.
    for _ in 0..3 {
        assert!(prog.cmd("round").starts_with("ns/page "));
    }
    std::thread::sleep(Duration::from_millis(500));
    for f in ["malloc", "free", "calloc", "realloc"] {
        let (live, file) = libc_bytes(prog.pid(), f);
        assert_eq!(live, file, "{f} of pid {} was modified", prog.pid());
    }
    let summary = summary_of(&rec.stop()).expect("summary");
    let g = &summary["summary"]["growth"];
    assert!(g["samples"].as_u64().unwrap() >= 30, "{summary}");
    // The control: the same check sees heap tracing's probe.
    let rec = Recorder::on(&store)
        .args(&["--host-cgroup", &cg.path])
        .start();
    let pid = prog.pid();
    let attached = wait_for(Duration::from_secs(20), || {
        let (live, file) = libc_bytes(pid, "malloc");
        (live != file).then_some(())
    });
    assert!(
        attached.is_some(),
        "heap tracing's probe on malloc not seen: {}",
        rec.log()
    );
    rec.stop();
    prog.exit();
}

/// The growth of `report`'s process at the end, in bytes, and its top
/// function.
fn top_of(report: &Value, pid: u32) -> (u64, String) {
    let p = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {report:#}"));
    (
        p["bytes"].as_u64().unwrap(),
        function(&p["sites"][0]["frames"], 0).to_string(),
    )
}

#[test]
fn growth_follows_a_live_process_and_a_cgroup() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let cg = TestCgroup::new("growth-live", 1024 * MIB);
    let mut prog = {
        let mut cmd = cg.command(grower());
        cmd.args(["touch", "32"]);
        CudaLoad::spawn(cmd)
    };
    let pid = prog.pid();
    // By pid: three rounds of 32 MiB faulted in by touch_pages.
    let live = Attach::growth(&["--pid", &pid.to_string(), "--every", "500ms"]);
    for _ in 0..3 {
        assert!(prog.cmd("round").starts_with("ns/page "));
    }
    std::thread::sleep(Duration::from_millis(700));
    let report = live.stop();
    let (bytes, top) = top_of(&report, pid);
    assert_eq!(top, "touch_pages", "{report:#}");
    assert!((64 * MIB..=128 * MIB).contains(&bytes), "{report:#}");
    // By cgroup: a process that joins later is followed too.
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("growth.pb.gz");
    let live = Attach::growth(&["--cgroup", &cg.path, "--pprof", profile.to_str().unwrap()]);
    let mut late = {
        let mut cmd = cg.command(grower());
        cmd.args(["touch", "16"]);
        CudaLoad::spawn(cmd)
    };
    // Found within a rescan.
    std::thread::sleep(Duration::from_millis(1200));
    for _ in 0..4 {
        assert!(late.cmd("round").starts_with("ns/page "));
    }
    assert!(prog.cmd("round").starts_with("ns/page "));
    std::thread::sleep(Duration::from_millis(700));
    let report = live.stop();
    let (late_bytes, top) = top_of(&report, late.pid());
    assert_eq!(top, "touch_pages", "{report:#}");
    assert!((40 * MIB..=88 * MIB).contains(&late_bytes), "{report:#}");
    let (bytes, _) = top_of(&report, pid);
    assert!((16 * MIB..=48 * MIB).contains(&bytes), "{report:#}");
    // Go's pprof: touch_pages of both processes, told apart by their pid label.
    let top = tracer_e2e::go_pprof(&["-top"], &profile);
    assert!(top.contains(" touch_pages"), "{top}");
    let tags = tracer_e2e::go_pprof(&["-tags"], &profile);
    for p in [pid, late.pid()] {
        assert!(
            tags.contains(&format!(" {p} ")) || tags.contains(&format!(" {p}\n")),
            "{p}: {tags}"
        );
    }
    late.exit();
    prog.exit();
}

#[test]
fn growth_refuses_bad_input_clearly() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    for (args, want) in [
        (
            &["growth", "--pid", "999999999"][..],
            "no process with pid 999999999",
        ),
        (
            &["growth", "--cgroup", "/no/such/cgroup"][..],
            "no memory cgroup /no/such/cgroup on this node",
        ),
        (&["growth"][..], "--pid"),
        (
            &["growth", "--pid", "1", "--window", "0s"][..],
            "--window must be at least 1s",
        ),
        // A path that climbs out of the cgroup file system.
        (
            &["growth", "--cgroup", "/../../../../etc"][..],
            "a cgroup path has no '..' in it",
        ),
        // A share of a limit that is none.
        (
            &["record", "--heap-on-pressure", "0%"][..],
            "a share of the limit is above 0% and at most 100%",
        ),
        (
            &["record", "--heap-on-pressure", "lots"][..],
            "is not a percentage",
        ),
        // Named cgroups for growth on risk: a real path, under the
        // cgroup file system, and only where they mean something.
        (
            &["record", "--growth-cgroup", "/../../etc"][..],
            "a cgroup path has no '..' in it",
        ),
        (
            &["record", "--growth-cgroup", "kubepods"][..],
            "starting with /",
        ),
        (
            &["record", "--growth", "limited", "--growth-cgroup", "/job"][..],
            "--growth-cgroup arms a cgroup for --growth risk; with --growth limited it has nothing to do",
        ),
        (
            &["record", "--growth-arm", "0%"][..],
            "a share of the limit is above 0% and at most 100%",
        ),
    ] {
        let out = tracer(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn heap_sampling_turns_on_under_pressure_and_the_kill_carries_its_sites() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let store_s = store.to_str().unwrap();
    let cg = TestCgroup::new("pressure", 128 * MIB);
    let rec = Recorder::on(&store)
        .args(&["--heap-on-pressure", "50%"])
        .start();
    let mut prog = {
        let mut cmd = cg.command(heapsites("nofp"));
        cmd.arg("8");
        CudaLoad::spawn(cmd)
    };
    let pid = prog.pid();
    assert!(prog.cmd("go").starts_with("done "));
    // About 16 MiB of 128: no pressure, nothing attached to its libc.
    std::thread::sleep(Duration::from_millis(2500));
    let (live, file) = libc_bytes(pid, "malloc");
    assert_eq!(live, file, "malloc probed with no pressure: {}", rec.log());
    // 1 MiB every 50 ms until killed: past 64 MiB the heap is traced.
    prog.send("grow");
    let killed = wait_for(Duration::from_secs(30), || {
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.describe());
    let pid_s = pid.to_string();
    let v = explain_json(&["--store", store_s, "--pid", &pid_s], |v| {
        !v["kill"]["victim"]["heap"].is_null()
    });
    let heap = &v["kill"]["victim"]["heap"];
    assert_eq!(
        function(&heap["sites"][0]["frames"], 0),
        "grow_until_killed",
        "{heap:#}"
    );
    let log = rec.stop();
    assert!(
        log.contains("heap on pressure: ") && log.contains("heap tracing on"),
        "{log}"
    );
    // The moment is stored.
    let out = tracer(&["events", "--store", store_s, "--since", "10m"]);
    let events = String::from_utf8_lossy(&out.stdout);
    let on = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["kind"] == "heap_pressure" && e["on"] == true)
        .unwrap_or_else(|| panic!("no heap_pressure event: {events}"));
    assert_eq!(on["memcg_path"], cg.path.as_str(), "{on}");
    assert!(on["percent"].as_f64().unwrap() >= 50.0, "{on}");
}

/// Node.js, run with `--perf-basic-prof`: V8 writes a perf map naming the
/// functions it runs, and the growth site names the JavaScript function
/// that grew the memory from it (its code is in no file).
#[test]
fn a_node_program_is_named_from_its_perf_map() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let node = Path::new("/usr/bin/node");
    assert!(node.exists(), "node missing: cargo xtask setup installs it");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("js/grow_array.js");
    // node's 99 MB binary is read into the page cache from here first,
    // charged to this test's cgroup, not the one under test. Pages of it
    // faulted first by the node below would be charged to its cgroup, and
    // at the limit the kernel would evict them and node read them back,
    // again and again (state D in folio_wait_bit_common, over 60 s with no
    // OOM kill): a thrash, not the kill this test is about.
    std::io::copy(
        &mut std::fs::File::open(node).expect("open node"),
        &mut std::io::sink(),
    )
    .expect("read node");
    let cg = TestCgroup::new("growth-js", 128 * MIB);
    // In a mount namespace of its own with a tmpfs on /tmp: its perf map
    // is where the process sees it (read through its root), not on the
    // host, and goes with it.
    // The script is copied in after the mount (a checkout under /tmp would
    // be hidden by it), and node runs there: what V8 writes in its working
    // directory goes with the tmpfs too.
    let mut cmd = cg.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "js=$(cat \"$0\") && mount -t tmpfs none /tmp && printf '%s\\n' \"$js\" > /tmp/grow_array.js \
             && cd /tmp && exec {} --perf-basic-prof --interpreted-frames-native-stack /tmp/grow_array.js",
            node.display()
        ))
        .arg(&script);
    // Its warm-up is sampled and named first (its maps read, libnode's
    // symbols parsed), as for a program that ran a while before it grew.
    let (kill, text, summary) = killed_after(&cg, cmd, Duration::from_millis(1500));
    let g = &kill["growth"];
    let named: Vec<(&str, &str)> = g["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .flat_map(|s| s["frames"].as_array().into_iter().flatten())
        .filter_map(|f| Some((f["function"].as_str()?, f["module"].as_str()?)))
        .filter(|(_, m)| m.starts_with("perf-") && m.ends_with(".map"))
        .collect();
    assert!(
        named.iter().any(|(f, _)| f.contains("growArray")),
        "no frame named growArray from the perf map: {g:#}\n{text}\n{summary}"
    );
}

/// As a cgroup arms, its processes are pictured (their growth sites, and
/// their heap sites through a bounded attach of the heap probes, loaded
/// here by `--heap-on-pressure`); a kill seconds later keeps the picture
/// as its "before", and `explain` shows it.
#[test]
fn a_picture_taken_as_a_cgroup_arms_is_its_kills_before() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let limit = 128 * MIB;
    let cg = TestCgroup::new("picture", limit);
    let rec = Recorder::on(&sc.store)
        .args(&["--growth", "risk", "--heap-on-pressure", "97%"])
        .start();
    // 8 MiB every 800 ms (10 MiB/s): 60 % of the limit at about 8 s, the
    // limit some 5 s after.
    let mut prog = {
        let mut cmd = cg.command(grower());
        cmd.args(["grow", "800"]);
        CudaLoad::spawn(cmd)
    };
    let pid = prog.pid();
    prog.send("go");
    let killed = wait_for(Duration::from_secs(60), || {
        (cg.oom_kills() > 0).then_some(())
    });
    assert!(killed.is_some(), "no OOM kill in {}", cg.describe());
    let store_s = sc.store.to_str().unwrap();
    let v = explain_json(&["--store", store_s, "--pid", &pid.to_string()], |v| {
        !v["kill"]["growth"].is_null()
    });
    let pic = &v["kill"]["picture"];
    assert_eq!(pic["memcg"], cg.path.as_str(), "{}", v["kill"]);
    let kill_ns = v["kill"]["ts_ns"].as_i64().unwrap();
    let (armed, taken) = (
        pic["armed_ns"].as_i64().unwrap(),
        pic["ts_ns"].as_i64().unwrap(),
    );
    assert!(taken - armed >= 1_000_000_000 && taken <= kill_ns, "{pic}");
    // Its window ends at the arming watch's pace (50 ms), not at the next
    // one-second tick: a kill soon after arming has it. Not timed in a
    // guest under emulation.
    if std::env::var_os("TRACER_VM_GUEST").is_none() {
        assert!(taken - armed < 1_300_000_000, "window ended late: {pic}");
    }
    let me = pic["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("not pictured: {pic}"));
    assert!(me["growth_bytes"].as_u64() > Some(0), "{me}");
    assert_eq!(
        function(&me["growth_sites"][0]["frames"], 0),
        "build_index",
        "{me}"
    );
    // The heap probes, attached for the picture, saw build_index's blocks;
    // in a guest under emulation they may attach after the window, and the
    // picture then says so.
    let heap_seen = me["heap_sites"]
        .as_array()
        .is_some_and(|s| s.iter().any(|s| function(&s["frames"], 0) == "build_index"));
    let heap_said_missing = pic["skipped"].as_array().is_some_and(|s| {
        s.iter().any(|s| {
            s.as_str()
                .unwrap_or("")
                .contains("no allocation sampled in the window")
        })
    });
    assert!(
        heap_seen || (heap_said_missing && std::env::var_os("TRACER_VM_GUEST").is_some()),
        "{pic}"
    );
    let text = String::from_utf8_lossy(
        &tracer(&["explain", "--store", store_s, "--pid", &pid.to_string()]).stdout,
    )
    .into_owned();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    assert!(
        text.contains(&format!("  before     a picture of {}", cg.path))
            && text.contains("most at build_index"),
        "{text}"
    );
    let events = tracer(&["events", "--store", store_s, "--kind", "growth_picture"]);
    assert!(
        String::from_utf8_lossy(&events.stdout).contains(&cg.path),
        "{events:?}"
    );
    drop(prog);
    let log = rec.stop();
    let summary = summary_of(&log).unwrap_or_else(|| panic!("{log}"));
    assert!(
        summary["summary"]["growth_arming"]["pictures"].as_u64() >= Some(1),
        "{summary}"
    );
}
