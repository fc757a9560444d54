//! `cargo xtask setup`: the eBPF toolchain (nightly rust-src, bpf-linker),
//! what the tests run against (the CUDA runtime wheel, the NVIDIA driver's
//! user-space libraries from Debian's non-free archive, Debian's jemalloc,
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
/// The driver's user-space libraries the tests run against: `libcuda.so.1`
/// and `libnvidia-ml.so.1` of this release, from Debian's non-free archive.
const DRIVER_PACKAGES: [&str; 2] = ["libcuda1", "libnvidia-ml1"];
/// Debian's archive and the suite the driver packages come from.
const DRIVER_SOURCE: &str = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free";
/// PyTorch's CPU wheel on PyPI (the macOS one: a fifth the size of the
/// Linux wheel), whose `torch/cuda/_memory_viz.py` reads the memory
/// snapshots tracer writes in the tests. Nothing else of it is kept.
const TORCH_WHEEL: &str = "torch==2.11.0";
/// The manifests' validator from PyPI.
const KUBERNETES_VALIDATE: &str = "1.37.0";
const OPENTELEMETRY_PROTO: &str = "1.45.2";
/// Where Debian's `prometheus` (promtool and the server), `earlyoom` and
/// `nohang` come from.
const BOOKWORM_MAIN: &str = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main";

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
    driver_libraries()?;
    prometheus()?;
    oom_killer("earlyoom", "usr/bin/earlyoom")?;
    oom_killer("nohang", "usr/sbin/nohang")?;
    python_tools()?;
    torch_viz()?;
    test_packages()?;
    eprintln!(
        "xtask: setup done (nightly + rust-src, bpf-linker {BPF_LINKER}, {CUDA_WHEEL}, {}, prometheus)",
        DRIVER_PACKAGES.join(" + ")
    );
    Ok(())
}

/// Debian packages the end-to-end tests run against: jemalloc and tcmalloc,
/// preloaded in place of glibc's malloc by the heap and growth tests,
/// musl-gcc, Debian's CPython (the growth tests name its frames),
/// `<sys/sdt.h>` for the test program with PyTorch's USDT probes,
/// `systemd-analyze` for the shipped unit, systemd-journal-remote to
/// write the journal files `explain --journal-dir` reads in its test, and
/// Chromium, the headless browser the HTML report's test renders it in,
/// tmux, the terminal the full-screen `top` is driven in by its test,
/// bpftrace, whose `signal()` is the BPF program that kills in its test,
/// gdb, which reads the CPython builds' field offsets from their DWARF for
/// the test of the Python frame walker's table, Node.js, whose perf
/// map names its JIT frames in the growth test, and Go, whose `go tool
/// pprof` reads the profiles tracer writes.
fn test_packages() -> anyhow::Result<()> {
    let wanted = [
        ("libjemalloc2", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        (
            "libtcmalloc-minimal4",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        ),
        ("musl-tools", "/usr/bin/musl-gcc"),
        ("python3", "/usr/bin/python3"),
        (
            "systemtap-sdt-dev",
            "/usr/include/x86_64-linux-gnu/sys/sdt.h",
        ),
        ("systemd", "/usr/bin/systemd-analyze"),
        ("chromium", "/usr/bin/chromium"),
        ("tmux", "/usr/bin/tmux"),
        // A real BPF program's SIGKILL (bpftrace's signal()).
        ("bpftrace", "/usr/bin/bpftrace"),
        ("gdb", "/usr/bin/gdb"),
        // A JIT runtime that writes a perf map (`node --perf-basic-prof`).
        ("nodejs", "/usr/bin/node"),
        // `go tool pprof`, the reader of the pprof profiles tracer writes.
        ("golang-go", "/usr/bin/go"),
        (
            "systemd-journal-remote",
            "/lib/systemd/systemd-journal-remote",
        ),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(_, file)| !std::path::Path::new(file).exists())
        .map(|(package, _)| *package)
        .collect();
    apt_install(&missing)
}

/// Installs Debian `packages` (none: nothing is done).
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    sh(Command::new("apt-get").args(["update", "-qq"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
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
    pip_wheel(&download, &[CUDA_WHEEL])?;
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

/// Downloads one wheel from PyPI, without its dependencies, into
/// `download` (`args`: pip's options, then the requirement).
fn pip_wheel(download: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    sh(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args(args)
        .arg("-d")
        .arg(download))
}

/// Where PyTorch's memory snapshot reader is kept: target/torch-viz/.
pub fn torch_viz_dir() -> std::path::PathBuf {
    crate::root().join("target/torch-viz")
}

/// Takes `torch/cuda/_memory_viz.py` out of PyTorch's wheel (once).
fn torch_viz() -> anyhow::Result<()> {
    let dir = torch_viz_dir();
    if dir.join("_memory_viz.py").exists() {
        return Ok(());
    }
    let download = dir.join("download");
    pip_wheel(
        &download,
        &[
            "--platform",
            "macosx_11_0_arm64",
            "--python-version",
            "3.11",
            TORCH_WHEEL,
        ],
    )?;
    let take = "import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]); \
                open(sys.argv[2] + '/_memory_viz.py', 'wb').write(z.read('torch/cuda/_memory_viz.py'))";
    sh(Command::new("python3")
        .args(["-c", take])
        .arg(&download)
        .arg(&dir))?;
    std::fs::remove_dir_all(&download)?;
    Ok(())
}

/// Where the driver packages are unpacked: the libraries are in
/// target/nvidia-driver/root/usr/lib/x86_64-linux-gnu/nvidia/current/.
pub fn driver_dir() -> std::path::PathBuf {
    crate::root().join("target/nvidia-driver")
}

/// Downloads Debian's `libcuda1` and `libnvidia-ml1` and unpacks them
/// (once): the driver's real user-space libraries, in
/// target/nvidia-driver/root/usr/lib/x86_64-linux-gnu/nvidia/current/.
fn driver_libraries() -> anyhow::Result<()> {
    let dir = driver_dir();
    let libs = dir.join("root/usr/lib/x86_64-linux-gnu/nvidia/current");
    if libs.join("libcuda.so.1").exists() && libs.join("libnvidia-ml.so.1").exists() {
        return Ok(());
    }
    private_debs(&dir, &[DRIVER_SOURCE], &DRIVER_PACKAGES)?;
    if !libs.join("libcuda.so.1").exists() || !libs.join("libnvidia-ml.so.1").exists() {
        bail!(
            "{} unpacked without libcuda.so.1 and libnvidia-ml.so.1 in {}",
            DRIVER_PACKAGES.join(" and "),
            libs.display()
        );
    }
    Ok(())
}

/// Where Debian's `prometheus` package is unpacked: promtool is
/// target/prometheus/root/usr/bin/promtool.
pub fn prometheus_dir() -> std::path::PathBuf {
    crate::root().join("target/prometheus")
}

/// Downloads Debian's `prometheus` and unpacks it (once), for `promtool`
/// and the server the metrics tests scrape with; nothing is installed and
/// no service is started.
fn prometheus() -> anyhow::Result<()> {
    let dir = prometheus_dir();
    if dir.join("root/usr/bin/promtool").exists() {
        return Ok(());
    }
    private_debs(&dir, &[BOOKWORM_MAIN], &["prometheus"])?;
    if !dir.join("root/usr/bin/promtool").exists() {
        bail!(
            "prometheus unpacked without usr/bin/promtool in {}",
            dir.display()
        );
    }
    Ok(())
}

/// Downloads a userspace OOM killer from Debian (`earlyoom`, `nohang`)
/// and unpacks it (once) into target/PACKAGE: the real programs that the
/// v2 guest's journal tests run. Not installed: a package would start its
/// service, which kills on the whole machine.
fn oom_killer(package: &str, bin: &str) -> anyhow::Result<()> {
    let dir = crate::root().join("target").join(package);
    let bin = dir.join("root").join(bin);
    if bin.exists() {
        return Ok(());
    }
    private_debs(&dir, &[BOOKWORM_MAIN], &[package])?;
    if !bin.exists() {
        bail!("{package} unpacked without {}", bin.display());
    }
    Ok(())
}

/// The Python tools the tests use, from PyPI, in a virtual environment of
/// their own (target/pytools): the Kubernetes manifests' offline schema
/// validator (kubernetes-validate) and the OTLP protobuf messages
/// (opentelemetry-proto) the test's OTLP receiver decodes with.
fn python_tools() -> anyhow::Result<()> {
    let dir = crate::root().join("target/pytools");
    let wanted = [
        format!("kubernetes-validate=={KUBERNETES_VALIDATE}"),
        format!("opentelemetry-proto=={OPENTELEMETRY_PROTO}"),
    ];
    let marker = dir.join("installed.txt");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted.join("\n")) {
        return Ok(());
    }
    if !dir.join("bin/pip").exists() {
        sh(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    }
    sh(Command::new(dir.join("bin/pip"))
        .args(["install", "--quiet"])
        .args(&wanted))?;
    std::fs::write(&marker, wanted.join("\n"))?;
    Ok(())
}

/// apt-get and apt-cache options for a private apt state under `dir`/apt
/// whose sources list is the `sources` lines (the directories are made):
/// the machine's apt configuration and package lists are left as they are.
pub fn private_apt(dir: &std::path::Path, sources: &[&str]) -> anyhow::Result<Vec<String>> {
    let apt = dir.join("apt");
    for d in ["lists/partial", "cache/archives/partial", "debs"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    std::fs::write(apt.join("sources.list"), sources.join("\n") + "\n")?;
    let opt = |k: &str, v: &std::path::Path| format!("-o{k}={}", v.display());
    Ok(vec![
        opt("Dir::Etc::SourceList", &apt.join("sources.list")),
        opt("Dir::Etc::SourceParts", std::path::Path::new("/dev/null")),
        opt("Dir::State::Lists", &apt.join("lists")),
        opt("Dir::Cache", &apt.join("cache")),
        // Downloads run as root here, not as apt's sandbox user.
        "-oAPT::Sandbox::User=root".to_string(),
    ])
}

/// Downloads `packages` (`name` or `name=version`) from the `sources`
/// lines and unpacks them with `dpkg-deb -x` into `dir`/root, through
/// [`private_apt`]: nothing is installed.
pub fn private_debs(
    dir: &std::path::Path,
    sources: &[&str],
    packages: &[&str],
) -> anyhow::Result<()> {
    let private = private_apt(dir, sources)?;
    sh(Command::new("apt-get")
        .args(&private)
        .args(["update", "-qq"]))?;
    sh(Command::new("apt-get")
        .args(&private)
        .args(["download", "-qq"])
        .args(packages)
        .current_dir(dir.join("apt/debs")))?;
    for entry in std::fs::read_dir(dir.join("apt/debs"))? {
        let deb = entry?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            sh(Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(dir.join("root")))?;
        }
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
