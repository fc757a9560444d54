//! `cargo xtask demo`: the first thing a newcomer runs. Records a real OOM
//! kill in a scratch memory cgroup and explains it; cleans up after itself.

use std::{process::Command, time::Duration};

use anyhow::{Context as _, bail};
use tracer_e2e::{Proc, Recorder, TestCgroup, wait_for};

const MIB: u64 = 1 << 20;

/// Runs the demo.
pub fn run() -> anyhow::Result<()> {
    crate::setup::run()?;
    let bins = crate::build_release()?;
    if !crate::is_root() {
        bail!("the demo loads eBPF programs and makes a memory cgroup: run it as root");
    }
    let dir = tempfile::tempdir().context("temporary store")?;
    let store = dir.path().join("demo.db");
    let store_s = store.to_str().context("utf-8 path")?;
    eprintln!("demo: starting `tracer record --store {store_s}`");
    let recorder = Recorder::on(&store).bin(&bins.tracer).quiet().start();
    let cg = TestCgroup::new("demo", 64 * MIB);
    eprintln!(
        "demo: made scratch memory cgroup {} with a 64 MiB limit",
        cg.path
    );
    let mut cmd = cg.command(&bins.memhog);
    cmd.args(["--step-mib", "2", "--interval-ms", "100"]);
    let mut hog = Proc::spawn(cmd);
    let pid = hog.pid();
    eprintln!("demo: memhog (pid {pid}) grows 2 MiB every 100 ms inside it...");
    match hog.wait_signal(Duration::from_secs(60)) {
        Some(libc::SIGKILL) => eprintln!("demo: the kernel killed memhog (SIGKILL)"),
        other => bail!("memhog was not OOM killed (ended by {other:?})"),
    }
    let pid_s = pid.to_string();
    let explained = wait_for(Duration::from_secs(10), || {
        let out = Command::new(&bins.tracer)
            .args([
                "explain", "--store", store_s, "--pid", &pid_s, "--format", "json",
            ])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["kill"]["source"]
            .as_str()
            .is_some_and(|s| s.contains("kmsg"))
            .then_some(())
    });
    if explained.is_none() {
        eprintln!(
            "demo: the kernel's report was not joined within 10 s; showing what was recorded"
        );
    }
    eprintln!("demo: $ tracer explain --store {store_s}\n");
    let status = Command::new(&bins.tracer)
        .args(["explain", "--store", store_s])
        .status()?;
    recorder.stop();
    drop(cg);
    eprintln!("\ndemo: recorder stopped, scratch cgroup removed");
    if !status.success() {
        bail!("tracer explain failed");
    }
    Ok(())
}
