//! `cargo xtask setup`: the eBPF toolchain (nightly rust-src, bpf-linker),
//! what the tests run against (the CUDA runtime wheel, Debian's jemalloc,
//! tcmalloc and musl)
//! and, for the benchmarks, the peer tools. Idempotent: present things are
//! left alone.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::sh;

/// The bpf-linker release these machines build with (it uses rustc's LLVM).
const BPF_LINKER: &str = "0.10.3";
/// The CUDA runtime wheel the tests run against (it ships libcudart.so.12).
const CUDA_WHEEL: &str = "nvidia-cuda-runtime-cu12==12.9.79";

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
    cuda_wheel()?;
    test_packages()?;
    eprintln!("xtask: setup done (nightly + rust-src, bpf-linker {BPF_LINKER}, {CUDA_WHEEL})");
    Ok(())
}

/// Debian packages the end-to-end tests run against: jemalloc and tcmalloc,
/// preloaded in place of glibc's malloc by the heap and growth tests,
/// musl-gcc, and Debian's CPython (the growth tests name its frames).
fn test_packages() -> anyhow::Result<()> {
    let wanted = [
        ("libjemalloc2", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        (
            "libtcmalloc-minimal4",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        ),
        ("musl-tools", "/usr/bin/musl-gcc"),
        ("python3", "/usr/bin/python3"),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(_, file)| !std::path::Path::new(file).exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    sh(Command::new("apt-get").args(["update", "-qq"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Where the wheel is unpacked: target/cuda-wheel/nvidia/cuda_runtime/lib/.
pub fn cuda_wheel_dir() -> std::path::PathBuf {
    crate::root().join("target/cuda-wheel")
}

/// Downloads the real CUDA runtime from PyPI and unpacks it (once).
fn cuda_wheel() -> anyhow::Result<()> {
    let dir = cuda_wheel_dir();
    if dir.join("nvidia/cuda_runtime/lib/libcudart.so.12").exists() {
        return Ok(());
    }
    let download = dir.join("download");
    sh(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            CUDA_WHEEL,
            "-d",
        ])
        .arg(&download))?;
    let unpack = "import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]).extractall(sys.argv[2])";
    sh(Command::new("python3")
        .args(["-c", unpack])
        .arg(&download)
        .arg(&dir))?;
    if !dir.join("nvidia/cuda_runtime/lib/libcudart.so.12").exists() {
        bail!("{CUDA_WHEEL} has no nvidia/cuda_runtime/lib/libcudart.so.12");
    }
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
