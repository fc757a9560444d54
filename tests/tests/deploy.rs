//! What ships under deploy/, checked by the tools that will read it.

use std::{path::PathBuf, process::Command};

use tracer_e2e::tracer_bin;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify_without_a_warning() {
    let unit = std::fs::read_to_string(deploy().join("systemd/tracer.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/tracer record "),
        "{unit}"
    );
    // verify also checks that ExecStart's program exists: point it at the
    // binary under test, the rest of the unit as shipped.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("tracer.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/tracer", &tracer_bin().display().to_string()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze (Debian's systemd) is needed");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.trim().is_empty(), "warnings: {said}");
    // And the arguments it starts the recorder with are ones it takes.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/tracer "))
        .unwrap();
    let mut args: Vec<&str> = exec.split_whitespace().collect();
    args.push("--help");
    let help = Command::new(tracer_bin()).args(&args).output().unwrap();
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
}
