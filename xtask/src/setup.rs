//! `cargo xtask setup`: the eBPF toolchain (nightly rust-src, bpf-linker)
//! and, for the benchmarks, the peer tools. Idempotent: present things are
//! left alone.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::sh;

/// The bpf-linker release these machines build with (it uses rustc's LLVM).
const BPF_LINKER: &str = "0.10.3";

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs what is missing.
pub fn run() -> anyhow::Result<()> {
    let toolchains = output("rustup", &["toolchain", "list"]).context("rustup is required")?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        sh(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let components = output(
        "rustup",
        &["component", "list", "--toolchain", "nightly", "--installed"],
    )
    .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        sh(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let linker = output("bpf-linker", &["--version"]).unwrap_or_default();
    if !linker.contains(BPF_LINKER) {
        sh(Command::new("cargo").args([
            "install",
            &format!("bpf-linker@{BPF_LINKER}"),
            "--locked",
            "--force",
        ]))?;
    }
    check_toolchain()?;
    eprintln!("xtask: setup done (nightly + rust-src, bpf-linker {BPF_LINKER})");
    Ok(())
}

/// Fails with the fix when the eBPF toolchain is incomplete.
pub fn check_toolchain() -> anyhow::Result<()> {
    if output("bpf-linker", &["--version"]).is_none() {
        bail!("bpf-linker is missing: run `cargo xtask setup`");
    }
    let components = output(
        "rustup",
        &["component", "list", "--toolchain", "nightly", "--installed"],
    )
    .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        bail!("nightly rust-src is missing: run `cargo xtask setup`");
    }
    Ok(())
}

/// Installs the peer tools the benchmarks compare against (Debian packages).
pub fn bench_peers() -> anyhow::Result<()> {
    if output("bpftrace", &["--version"]).is_some() {
        return Ok(());
    }
    sh(Command::new("apt-get").args(["update", "-qq"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq", "bpftrace"])
        .env("DEBIAN_FRONTEND", "noninteractive"))
}
