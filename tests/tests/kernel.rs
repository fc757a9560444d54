//! What each kernel can have: run on this machine's kernel and, through
//! `cargo xtask vm-test`, on every kernel of the matrix (5.10 to 7.x).

use serde_json::Value;
use tracer_e2e::{Scenario, tracer};

/// The running kernel's (major, minor).
fn kernel() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// `tracer doctor` names each feature this kernel cannot have, with the
/// helper it lacks and the release that brought it, in one line (never a
/// verifier log); kill capture works on every kernel. Before 5.15 (no
/// `bpf_get_attach_cookie`, no `bpf_task_pt_regs`) the uprobe families
/// and growth attribution are unavailable; from 5.15 everything loads.
#[test]
fn doctor_names_what_this_kernel_lacks_in_one_line_each() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let out = tracer(&["doctor", "--format", "json"]);
    let rows: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --format json: {e}: {out:?}"));
    let rows = rows.as_array().expect("an array of checks");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no doctor row {name}: {rows:#?}"))
    };
    for r in rows {
        let detail = r["detail"].as_str().unwrap_or_default();
        assert!(
            !detail.contains('\n') && detail.len() < 400,
            "a doctor row is one short line: {r}"
        );
    }
    // Whether record can follow this boot's journal, one way or the other
    // (no journal here, in the guests: said, not a failure).
    let journal = row("journal");
    assert!(
        ["ok", "info"].contains(&journal["status"].as_str().unwrap_or_default())
            && journal["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("userspace OOM killers")
                != (journal["status"] == "ok"),
        "{journal}"
    );
    for kill_capture in [
        "tracepoint/oom/mark_victim",
        "raw_tracepoint/signal_generate",
        "tracepoint/sched/sched_process_exit",
    ] {
        assert_eq!(row(kill_capture)["status"], "ok", "{}", row(kill_capture));
    }
    let (major, minor) = kernel();
    let old = (major, minor) < (5, 15);
    for name in [
        "CUDA tracing",
        "heap tracing",
        "USDT probes",
        "raw_tracepoint/page_fault_user",
    ] {
        let r = row(name);
        let detail = r["detail"].as_str().unwrap_or_default();
        if old {
            assert_eq!(r["status"], "warn", "{major}.{minor}: {r}");
            assert!(
                detail.contains("needs the BPF helper bpf_")
                    && detail.contains("which this kernel lacks"),
                "{major}.{minor}: {r}"
            );
        } else {
            assert_eq!(r["status"], "ok", "{major}.{minor}: {r}");
        }
    }
    if !old {
        // Two programs on oom:mark_victim: the kill's and growth's tip.
        let tips: Vec<&Value> = rows
            .iter()
            .filter(|r| r["name"] == "tracepoint/oom/mark_victim")
            .collect();
        assert_eq!(tips.len(), 2, "{tips:#?}");
        assert!(tips.iter().all(|r| r["status"] == "ok"), "{tips:#?}");
    }
}
