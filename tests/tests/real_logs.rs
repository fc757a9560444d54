//! `explain --log` on real kernel logs copied from public bug reports,
//! mailing lists, knowledge bases and forums (tests/fixtures/real-logs,
//! each with the URL it came from and the facts a reader finds in it).
//! No root needed.
//!
//! What must hold, over the whole corpus:
//! - no crash, and no kill the log does not hold (an invented victim);
//! - at least 95 % of the kills found with their victim's name, the
//!   constraint and the memory cgroups right;
//! - every figure a fact names (RSS, uid, trigger) right where the kill is
//!   found;
//! - logs of other killers (Xid, systemd-oomd, earlyoom, kubelet) yield no
//!   kernel kill beyond the ones they hold.

use std::{fs, path::PathBuf};

use serde_json::Value;
use tracer_e2e::tracer;

/// The facts a reader finds in a kill, and where `explain` puts each.
const POINTERS: &[(&str, &str, bool)] = &[
    // (fact, JSON pointer in the explanation, part of "found right")
    ("comm", "/kill/victim/comm", true),
    ("constraint", "/kill/killer/constraint", true),
    ("oom_memcg", "/kill/memcg/path", true),
    ("task_memcg", "/kill/victim/memcg", true),
    ("anon_rss_kb", "/kill/victim/memory/anon_rss_kb", false),
    ("file_rss_kb", "/kill/victim/memory/file_rss_kb", false),
    ("shmem_rss_kb", "/kill/victim/memory/shmem_rss_kb", false),
    ("uid", "/kill/victim/uid", false),
    ("trigger_pid", "/kill/trigger/task/pid", false),
    ("trigger_comm", "/kill/trigger/task/comm", false),
];

fn corpus() -> Vec<(String, PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-logs");
    let mut out: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".facts.json"))
        .map(|p| {
            let name = p
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".facts.json", "");
            let facts: Value = serde_json::from_str(&fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                facts["source"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("http")),
                "{name}: every fixture names its source"
            );
            (
                name,
                dir.join(
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .replace(".facts.json", ".log"),
                ),
                facts,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `explain --log LOG --all --format json`: the kills, or why none.
fn explain(log: &std::path::Path) -> (Vec<Value>, String) {
    let out = tracer(&[
        "explain",
        "--log",
        log.to_str().unwrap(),
        "--all",
        "--format",
        "json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("panicked") && matches!(out.status.code(), Some(0..=2)),
        "{}: {:?} {err}",
        log.display(),
        out.status
    );
    let kills = match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    (kills, err)
}

#[test]
fn real_kernel_logs_yield_their_kills_and_nothing_else() {
    let corpus = corpus();
    let (mut want, mut right, mut invented, mut logs) = (0usize, 0usize, 0usize, 0usize);
    let (mut misses, mut wrong_figures) = (Vec::new(), Vec::new());
    for (name, log, facts) in &corpus {
        let Some(kills) = facts["kills"].as_array() else {
            continue;
        };
        logs += 1;
        let (got, err) = explain(log);
        for g in &got {
            let pid = &g["kill"]["victim"]["pid"];
            if !kills.iter().any(|k| &k["pid"] == pid) {
                invented += 1;
                misses.push(format!("{name}: invented a kill of pid {pid}"));
            }
        }
        for k in kills {
            want += 1;
            // One pid may be killed twice in a paste (two boots): each
            // kill is the one with its own figures.
            let same_pid: Vec<&Value> = got
                .iter()
                .filter(|g| g["kill"]["victim"]["pid"] == k["pid"])
                .collect();
            let by_figures = same_pid.iter().find(|g| {
                same_pid.len() > 1
                    && g.pointer("/kill/victim/memory/anon_rss_kb") == Some(&k["anon_rss_kb"])
            });
            let Some(g) = by_figures.or(same_pid.first()).copied() else {
                misses.push(format!(
                    "{name}: no kill of pid {} ({}) {}",
                    k["pid"],
                    k["comm"],
                    err.trim()
                ));
                continue;
            };
            let mut core = true;
            for (fact, pointer, part_of_core) in POINTERS {
                let Some(value) = k.get(*fact) else { continue };
                let found = g.pointer(pointer).unwrap_or(&Value::Null);
                if found != value {
                    let miss = format!(
                        "{name}: pid {}: {fact} is {found}, the log says {value}",
                        k["pid"]
                    );
                    if *part_of_core {
                        core = false;
                        misses.push(miss);
                    } else {
                        wrong_figures.push(miss);
                    }
                }
            }
            if core {
                right += 1;
            }
        }
    }
    eprintln!(
        "real logs: {logs} logs, {want} kills; {right} found with victim, constraint and memory cgroups right ({:.1} %); {invented} invented",
        100.0 * right as f64 / want.max(1) as f64
    );
    for m in misses.iter().chain(&wrong_figures) {
        eprintln!("  {m}");
    }
    assert!(
        logs >= 40 && want >= 50,
        "the corpus is {logs} logs, {want} kills"
    );
    assert_eq!(invented, 0, "{misses:#?}");
    // A figure of a kill that was found is never wrong.
    assert!(wrong_figures.is_empty(), "{wrong_figures:#?}");
    assert!(right * 100 >= want * 95, "{right} of {want}: {misses:#?}");
}

#[test]
fn logs_of_other_killers_hold_no_kernel_kill_beyond_their_own() {
    for (name, log, facts) in corpus() {
        let Some(n) = facts["kernel_kills"].as_u64() else {
            continue;
        };
        let (got, _) = explain(&log);
        let kernel = got
            .iter()
            .filter(|k| k["kill"]["killer"]["kind"] == "kernel_oom")
            .count();
        assert_eq!(kernel as u64, n, "{name}: {got:#?}");
    }
}

/// Every kill systemd-oomd, earlyoom, kubelet, nohang and Talos's OOM
/// controller logged in the real logs (journal, syslog, monotonic, a
/// pager's wrapping, earlyoom's and nohang's own terminal output, klog,
/// `talosctl dmesg`) is a kill by that killer, of the process, cgroup, pod or
/// container it named, with the signal it names and its reason in the
/// verdict.
#[test]
fn kills_by_userspace_oom_killers_name_their_killer_and_reason() {
    let mut n = 0;
    for (name, log, facts) in corpus() {
        let kind = facts["kind"].as_str().unwrap_or("");
        if !["systemd-oomd", "earlyoom", "kubelet", "nohang", "talos-oom"].contains(&kind) {
            continue;
        }
        // Talos's OOM controller runs in machined, which sends its signals.
        let sender = if kind == "talos-oom" {
            "machined"
        } else {
            kind
        };
        let (got, err) = explain(&log);
        let by_it: Vec<&Value> = got
            .iter()
            .filter(|k| k["kill"]["killer"]["sender"]["comm"] == sender)
            .collect();
        let events = facts["events"].as_array().unwrap();
        // One kill an action of nohang's or Talos's (an action printed
        // twice is one; a count in a summary is none).
        if ["nohang", "talos-oom"].contains(&kind) {
            assert_eq!(by_it.len(), events.len(), "{name}: {got:#?} {err}");
        }
        for (i, e) in events.iter().enumerate() {
            // kubelet's own lines (the runtime's signals beside them are not
            // kubelet's kills).
            if kind == "kubelet" && !e["comm"].is_null() {
                continue;
            }
            let k = by_it
                .iter()
                .find(|k| match e["pid"].as_u64() {
                    Some(pid) => k["kill"]["victim"]["pid"] == pid,
                    None if kind == "kubelet" => k["kill"]["victim"]["comm"] == e["cgroup_or_unit"],
                    None => k["kill"]["victim"]["memcg"] == e["cgroup_or_unit"],
                })
                .unwrap_or_else(|| panic!("{name}: no kill by {kind} for {e}: {got:#?} {err}"));
            // A signal a later line escalates (earlyoom: SIGTERM, then
            // SIGKILL) is the kill's last one.
            let escalated = events[i + 1..]
                .iter()
                .any(|l| !e["pid"].is_null() && l["pid"] == e["pid"]);
            if e["signal"].is_string() && !escalated {
                assert_eq!(k["kill"]["killer"]["signal"], e["signal"], "{name}: {k:#}");
            }
            let verdict = k["verdict"]["summary"].as_str().unwrap();
            assert!(
                verdict.starts_with(&format!("killed by {sender}")),
                "{name}: {verdict}"
            );
            // kubelet's reason for the pod, in the verdict's words.
            if let Some(why) = e["why"].as_str() {
                let says = match why {
                    "api-delete" => "the pod was deleted through the API",
                    "preemption" => "preempted by kubelet to admit a critical pod",
                    "active-deadline" => "longer than the specified deadline",
                    other => panic!("{name}: no such reason {other}"),
                };
                assert!(verdict.contains(says), "{name}: {verdict}");
            }
            // The killer's figures are in the verdict (systemd-oomd's
            // pressure, earlyoom's limits).
            let reason = e["reason"].as_str().unwrap_or("");
            let figure = reason
                .split_whitespace()
                .find(|w| w.ends_with('%') || w.contains("SIGKILL"))
                .unwrap_or("");
            assert!(
                verdict.contains(figure),
                "{name}: {figure} not in {verdict}"
            );
            n += 1;
        }
    }
    eprintln!("userspace OOM killer kills read from the real logs: {n}");
    assert!(n >= 17, "{n}");
}

/// systemd's notices that a unit lost a process to the kernel's OOM killer,
/// in logs without the kernel's own lines, are said with their units.
#[test]
fn systemds_oom_notices_without_the_kernels_lines_are_said() {
    for (name, log, facts) in corpus() {
        if facts["kind"] != "systemd-unit" {
            continue;
        }
        let out = tracer(&["explain", "--log", log.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        for e in facts["events"].as_array().unwrap() {
            let unit = e["cgroup_or_unit"].as_str().unwrap();
            assert!(
                err.contains("systemd says these units") && err.contains(unit),
                "{name}: {unit}: {err}"
            );
        }
    }
}

/// Every NVIDIA Xid and SXid line of the real logs (bare, `kernel:`,
/// dmesg, `dmesg -T`, Talos, quoted in a diff, inside a monitoring agent's
/// output) is listed by `explain --xid` with its code, process and
/// meaning; a log of Xids and no kill says it holds them.
#[test]
fn every_gpu_fault_line_of_the_real_logs_is_listed_with_its_meaning() {
    let mut n = 0;
    for (name, log, facts) in corpus() {
        if facts["kind"] != "xid" {
            continue;
        }
        let out = tracer(&[
            "explain",
            "--log",
            log.to_str().unwrap(),
            "--xid",
            "--all",
            "--format",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let key = |code: &Value, pid: &Value| format!("{code}/{pid}");
        let mut want: Vec<String> = facts["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| key(&e["xid"], &e["pid"]))
            .collect();
        let mut found: Vec<String> = got.iter().map(|x| key(&x["code"], &x["pid"])).collect();
        want.sort();
        found.sort();
        assert_eq!(found, want, "{name}");
        for x in &got {
            let known = [
                8, 13, 31, 32, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 109, 119, 154,
            ];
            if known.contains(&x["code"].as_u64().unwrap()) || x["sxid"] == true {
                assert!(x["meaning"]["what"].is_string(), "{name}: {x}");
            }
        }
        n += got.len();
        // Without --xid: no kills, and the faults are pointed at.
        if facts["kernel_kills"] == 0 {
            let out = tracer(&["explain", "--log", log.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name}: {err}");
            assert!(err.contains("GPU fault line(s)"), "{name}: {err}");
        }
    }
    eprintln!("GPU faults listed from the real logs: {n}");
    assert!(n >= 25, "{n}");
}
