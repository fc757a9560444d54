//! Triage on a store of many real kills of three kinds: a pod's container
//! OOM-killed again and again (a crash loop, each restart a new
//! container), one OOM kill in another cgroup, and SIGKILLs from a
//! process. `tracer kills` lists them a line each with crash loops
//! grouped, the filters pick each kind, and plain `explain` shows the
//! latest OOM kill, not the later `kill -9`, and says what it left out.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use tracer_e2e::{
    KubePod, Proc, Recorder, Scenario, TestCgroup, browser_dom, chromium, kubelet_files,
    oom_killed, tracer, tracer_json, wait_for,
};

const MIB: u64 = 1 << 20;
/// Restarts of the pod's container, each OOM-killed.
const RESTARTS: usize = 12;
/// SIGKILLs from `kill`: with the OOM kills, 100 kills of our own, the
/// size of report the index and the per-kill budget are meant for.
const SIGKILLS: usize = 87;

/// `tracer kills --store S --json ARGS`, as rows.
fn kills(store: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["kills", "--store", store.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    match tracer_json(&all) {
        Value::Array(rows) => rows,
        other => panic!("not a list of rows: {other}"),
    }
}

/// The rows of `rows` in one of our cgroups (the recorder sees the whole
/// node's kills).
fn ours<'a>(rows: &'a [Value], cgroups: &[&str]) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["cgroup"].as_str().is_some_and(|c| cgroups.contains(&c)))
        .collect()
}

#[test]
fn many_kills_are_listed_a_line_each_filtered_and_their_crash_loops_grouped() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let host = tempfile::tempdir().unwrap();
    let uid = format!("{:08x}-7a1e-4c6d-8e9f-0a1b2c3d4e5f", std::process::id());
    let pod = || KubePod {
        namespace: "ml",
        pod: "trainer-0",
        container: "worker",
    };
    let ids: Vec<String> = (0..RESTARTS)
        .map(|r| format!("{:08x}{:056x}", std::process::id(), r + 1))
        .collect();
    for (r, id) in ids.iter().enumerate() {
        kubelet_files(host.path(), pod(), &uid, r as u32, id);
    }
    // Pods' cgroups are made as they restart: every memory-limited process
    // followed, as before arming on risk.
    let rec = Recorder::on(&store)
        .args(&[
            "--host-root",
            host.path().to_str().unwrap(),
            "--growth",
            "limited",
        ])
        .start();
    let memhog = Path::new(env!("CARGO_BIN_EXE_memhog"));

    // The crash loop: each restart a new container cgroup of the same pod.
    let top = format!("tracer-e2e-triage-{}", std::process::id());
    let mut pod_cgroups = Vec::new();
    let mut last_pod_pid = 0;
    for id in &ids {
        let cg = TestCgroup::in_pod(&top, &uid, id, 48 * MIB);
        last_pod_pid = oom_killed(&cg, memhog, 8, 10).pid();
        pod_cgroups.push(cg.path.clone());
    }
    // One OOM kill elsewhere, after the loop.
    let plain = TestCgroup::new("triage-plain", 48 * MIB);
    let plain_pid = oom_killed(&plain, memhog, 8, 10).pid();
    // Then `kill -9`s, the latest kills of all.
    let sig = TestCgroup::new("triage-sig", 64 * MIB);
    for _ in 0..SIGKILLS {
        let mut cmd = sig.command("sleep");
        cmd.arg("600");
        let mut victim = Proc::spawn(cmd);
        assert!(
            Command::new("kill")
                .args(["-9", &victim.pid().to_string()])
                .status()
                .unwrap()
                .success()
        );
        assert_eq!(
            victim.wait_signal(Duration::from_secs(5)),
            Some(libc::SIGKILL)
        );
        // Slower than the storm rate (32 a second past a burst of 64), so
        // each is stored in full, none folded.
        std::thread::sleep(Duration::from_millis(40));
    }
    let mut cgroups: Vec<&str> = pod_cgroups.iter().map(String::as_str).collect();
    cgroups.extend([plain.path.as_str(), sig.path.as_str()]);

    // Every kill, a line each, once the kernel's reports have joined
    // (a kill's verdict can change with its report).
    let each = wait_for(Duration::from_secs(30), || {
        let rows = kills(&store, &["--each"]);
        let n = ours(&rows, &cgroups).len();
        let grouped = kills(&store, &[]);
        let pod_loop = ours(&grouped, &cgroups)
            .into_iter()
            .any(|r| r["count"] == RESTARTS);
        (n == RESTARTS + 1 + SIGKILLS && pod_loop).then_some(rows)
    })
    .unwrap_or_else(|| {
        panic!(
            "not every kill listed: {}\n{}",
            String::from_utf8_lossy(&tracer(&["kills", "--store", store.to_str().unwrap()]).stdout),
            rec.log()
        )
    });
    let each = ours(&each, &cgroups);
    // Its log, a pipe here as under systemd, has no terminal colour codes.
    assert!(
        !rec.log().contains('\x1b'),
        "colour codes in the log: {}",
        rec.log()
    );
    let by = |killer: &str| each.iter().filter(|r| r["killer"] == killer).count();
    assert_eq!(by("kernel_oom"), RESTARTS + 1);
    assert_eq!(by("process"), SIGKILLS);
    assert!(
        each.iter()
            .all(|r| r["count"] == 1 && r["ids"].as_array().unwrap().len() == 1)
    );

    // Grouped: the pod's loop is one row named by its pod, not its
    // container ids; the SIGKILLs of `sleep` one more; the lone kill its own.
    let grouped = kills(&store, &[]);
    let grouped = ours(&grouped, &cgroups);
    assert_eq!(grouped.len(), 3, "{grouped:#?}");
    let pod_row = grouped.iter().find(|r| r["count"] == RESTARTS).unwrap();
    assert_eq!(pod_row["killer"], "kernel_oom");
    assert_eq!(pod_row["pid"], last_pod_pid);
    assert!(
        pod_row["place"]
            .as_str()
            .unwrap()
            .starts_with("ml/trainer-0/worker"),
        "{pod_row}"
    );
    assert_eq!(pod_row["ids"].as_array().unwrap().len(), RESTARTS);
    assert_eq!(pod_row["cause"], "own_growth", "{pod_row}");
    assert!(pod_row["first_ns"].as_i64() < pod_row["ts_ns"].as_i64());
    let sig_row = grouped.iter().find(|r| r["killer"] == "process").unwrap();
    assert_eq!(sig_row["count"], SIGKILLS);
    assert_eq!(sig_row["cause"], "userspace_kill");
    let lone = grouped.iter().find(|r| r["count"] == 1).unwrap();
    assert_eq!(lone["pid"], plain_pid);
    let text =
        String::from_utf8_lossy(&tracer(&["kills", "--store", store.to_str().unwrap()]).stdout)
            .into_owned();
    let show = std::env::var_os("SHOW").is_some();
    if show {
        eprintln!("$ tracer kills\n{text}");
    }
    assert!(
        text.contains(&format!("killed {RESTARTS} times in"))
            && text.contains("same verdict")
            && text.contains("ml/trainer-0/worker"),
        "{text}"
    );

    // Filters, each picking one kind.
    let n = |args: &[&str]| {
        let mut a = vec!["--each"];
        a.extend_from_slice(args);
        ours(&kills(&store, &a), &cgroups).len()
    };
    assert_eq!(n(&["--killer", "kernel"]), RESTARTS + 1);
    assert_eq!(n(&["--killer", "oom"]), RESTARTS + 1);
    assert_eq!(n(&["--killer", "signal"]), SIGKILLS);
    assert_eq!(n(&["--killer", "oomd"]), 0);
    assert_eq!(n(&["--pod", "ml/trainer-0"]), RESTARTS);
    assert_eq!(n(&["--pod", "trainer-0"]), RESTARTS);
    assert_eq!(n(&["--pod", "default/trainer-0"]), 0);
    assert_eq!(n(&["--container", "worker"]), RESTARTS);
    assert_eq!(n(&["--container", &ids[0]]), 1);
    assert_eq!(n(&["--cgroup", &plain.path]), 1);
    assert_eq!(n(&["--cgroup", &format!("/{top}")]), RESTARTS);
    assert_eq!(n(&["--comm", "sleep"]), SIGKILLS);
    assert_eq!(n(&["--comm", "memhog", "--killer", "signal"]), 0);
    let bad = tracer(&[
        "kills",
        "--store",
        store.to_str().unwrap(),
        "--pod",
        "a/b/c",
    ]);
    assert!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("NAMESPACE/NAME"),
        "{bad:?}"
    );

    // Plain `explain`: the latest OOM kill, though SIGKILLs came after it,
    // and a word on the kills it did not show.
    let out = tracer(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kill"]["victim"]["pid"], plain_pid, "{v}");
    let said = String::from_utf8_lossy(&out.stderr);
    if show {
        let text = tracer(&["explain", "--store", store.to_str().unwrap()]);
        eprintln!(
            "$ tracer explain\n{}{}",
            String::from_utf8_lossy(&text.stdout),
            String::from_utf8_lossy(&text.stderr)
        );
    }
    assert!(
        said.contains("SIGKILL from a process") && said.contains("`tracer kills` lists them"),
        "{said}"
    );
    let latest_of = |args: &[&str]| {
        let mut a = vec![
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--format",
            "json",
        ];
        a.extend_from_slice(args);
        tracer_json(&a)
    };
    assert_eq!(
        latest_of(&["--killer", "signal"])["kill"]["victim"]["comm"],
        "sleep"
    );
    assert_eq!(
        latest_of(&["--pod", "ml/trainer-0"])["kill"]["victim"]["pid"],
        last_pod_pid
    );

    // `--depth N`: frames of each text stack (4 by default).
    let growth_line = |depth: &str| {
        let out = tracer(&[
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--pid",
            &plain_pid.to_string(),
            "--depth",
            depth,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.contains("memhog::main"))
            .map(|l| l.matches(" <- ").count() + 1)
    };
    // Where growth attribution ran (this host; not every guest kernel
    // under emulation samples a cgroup made a moment before).
    if let Some(all) = growth_line("64") {
        // As deep as asked, or as deep as the stack is.
        assert_eq!(growth_line("2"), Some(all.min(2)));
        assert_eq!(growth_line("4"), Some(all.min(4)));
        if std::env::var_os("TRACER_VM_GUEST").is_none() {
            // Here memhog's stack reaches Rust's runtime and main.
            assert!(all > 4, "{all} frames");
        }
    } else {
        let v = latest_of(&["--pid", &plain_pid.to_string()]);
        assert!(
            v["kill"]["growth"].is_null(),
            "a growth site not shown: {v}"
        );
        assert!(
            std::env::var_os("TRACER_VM_GUEST").is_some(),
            "no growth sites on the host: {v}"
        );
    }
    assert!(
        !tracer(&[
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--depth",
            "0"
        ])
        .status
        .success()
    );

    // `explain --all` shows the crash loop once, and says so.
    let all = String::from_utf8_lossy(
        &tracer(&[
            "explain",
            "--store",
            store.to_str().unwrap(),
            "--all",
            "--pod",
            "ml/trainer-0",
        ])
        .stdout,
    )
    .into_owned();
    if show {
        eprintln!("$ tracer explain --all --pod ml/trainer-0\n{all}");
    }
    assert_eq!(all.matches("crash loop: killed").count(), 1, "{all}");
    assert!(all.contains(&format!("killed {RESTARTS} times")), "{all}");
    let every = tracer_json(&[
        "explain",
        "--store",
        store.to_str().unwrap(),
        "--all",
        "--each",
        "--pod",
        "ml/trainer-0",
        "--format",
        "json",
    ]);
    assert_eq!(every.as_array().map(Vec::len), Some(RESTARTS));

    // Another user: a store it may not read is said to be so, not "no
    // store" (a directory it cannot enter, then a file it cannot read).
    let denied = |path: &Path| {
        for args in [&["explain", "--store"][..], &["kills", "--store"][..]] {
            let mut a = args.to_vec();
            a.push(path.to_str().unwrap());
            let out = tracer_e2e::tracer_as_nobody(&a);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.code() == Some(2)
                    && err.contains("permission denied")
                    && !err.contains("no store"),
                "{a:?}: {out:?}"
            );
        }
    };
    denied(&store);
    let open_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        open_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let copy = open_dir.path().join("t.db");
    std::fs::copy(&store, &copy).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    denied(&copy);

    // The report of every kill, in a real browser: an index by place, the
    // crash loop under one row, every kill's section, each in its budget.
    let Some(chromium) = chromium() else {
        return;
    };
    let page = sc.dir.path().join("kills.html");
    let out = tracer(&[
        "report",
        "--store",
        store.to_str().unwrap(),
        "--all",
        "--killer",
        "any",
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    let dom = browser_dom(&chromium, &page, &sc.dir.path().join("profile"));
    let all = kills(&store, &["--each"]).len();
    assert!(all >= RESTARTS + 1 + SIGKILLS && all >= 100, "{all} kills");
    let sections = dom.matches("<section class=\"kill\"").count();
    assert_eq!(sections, all, "one section per kill");
    assert_eq!(
        dom.matches("<tr class=\"kill\"").count(),
        all,
        "one index row per kill"
    );
    assert!(dom.contains("<nav id=\"index\">"), "no index");
    let place = dom
        .find("data-place=\"ml/trainer-0/worker\"")
        .map(|at| &dom[at..at + 200])
        .unwrap_or_else(|| panic!("no index group for the pod"));
    assert!(
        place.contains(&format!("data-kills=\"{RESTARTS}\"")),
        "{place}"
    );
    assert!(
        dom.contains(&format!("<tr class=\"loop\" data-kills=\"{RESTARTS}\">")),
        "the crash loop is not one row"
    );
    // Each kill's section, as written, within the budget the page states.
    assert!(
        html.contains("Each kill is kept under 48.0 KiB"),
        "the budget is not said"
    );
    let starts: Vec<usize> = html
        .match_indices("<section class=\"kill\"")
        .map(|(i, _)| i)
        .collect();
    for (n, &at) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(html.len());
        assert!(
            end - at <= 48 * 1024 + 512,
            "section {n} is {} bytes",
            end - at
        );
    }
    drop(rec);
}
