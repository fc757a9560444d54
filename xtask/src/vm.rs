//! `cargo xtask vm-test`: the privileged end-to-end tests on other kernels,
//! each booted in a throwaway guest (virtme-ng over QEMU) that sees this
//! machine's root file system read-only, with the memory controller on
//! cgroup v2 or v1 as asked.
//!
//! The tests are built here and only their binaries run in the guest, one
//! at a time, as root, with `CI=true`; the guest writes each binary's
//! output to a folder shared with the host, where the verdict is read
//! (virtme-ng loses the guest command's exit status). The host's kernel,
//! boot, apt configuration and cgroups are left alone: kernels are
//! downloaded with a private apt state under `target/vm-test/` and
//! unpacked there.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{root, sh};

/// Options of `cargo xtask vm-test`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// The guest kernel: 5.10, 6.1, 6.12, 7.3 (Debian's, pinned below) or
    /// the path of a vmlinuz with its modules beside it.
    #[arg(long, default_value = "7.3", conflicts_with = "all")]
    kernel: String,
    /// Where the memory controller is: v2 (unified) or v1 (hybrid, as a
    /// systemd host with the legacy controller has it).
    #[arg(long, value_enum, default_value = "v2", conflicts_with = "all")]
    cgroup: Cgroup,
    /// The whole matrix: every pinned kernel on v2, and 6.1 on v1.
    #[arg(long)]
    all: bool,
    /// A named set of tests instead of a filter: `kill-capture` (what
    /// must work on every kernel from 5.10) or `v2` (what differs on
    /// cgroup v2).
    #[arg(long, value_enum)]
    suite: Option<Suite>,
    /// Guest memory (QEMU's -m syntax).
    #[arg(long, default_value = "2G")]
    memory: String,
    /// Guest CPUs (one is faster than two under emulation here).
    #[arg(long, default_value_t = 1)]
    cpus: u32,
    /// Seconds a guest may run, boot included.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Run the kill-latency and idle benchmarks in the guest instead of
    /// tests (release binaries built here): figures to compare guest
    /// against guest, never against the host.
    #[arg(long, conflicts_with_all = ["suite", "filter"])]
    bench: bool,
    /// Test name filters, as `cargo test` takes them (any matches).
    #[arg(last = true)]
    filter: Vec<String>,
}

/// The benchmarks a `--bench` guest runs (`cargo xtask bench` arguments):
/// kill to durable row, and the idle recorder beside bpftrace, shortened
/// (emulation runs some twenty times slower).
const GUEST_BENCHES: &[&[&str]] = &[
    &["--only", "latency"],
    &["--only", "idle", "--idle-secs", "30"],
];

/// The memory controller's hierarchy in the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Cgroup {
    /// cgroup v2 at /sys/fs/cgroup with +memory.
    V2,
    /// cgroup v1's memory controller at /sys/fs/cgroup/memory, v2 beside it.
    V1,
}

impl Cgroup {
    fn name(self) -> &'static str {
        match self {
            Cgroup::V2 => "v2",
            Cgroup::V1 => "v1",
        }
    }
}

/// Named sets of tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// Kill capture, SIGKILL senders, memcg events and the kmsg join.
    KillCapture,
    /// The tests whose behaviour depends on the cgroup version.
    V2,
}

impl Suite {
    /// (test binary, test name filters).
    fn tests(self) -> &'static [(&'static str, &'static [&'static str])] {
        match self {
            Suite::KillCapture => &[
                (
                    "e2e",
                    &[
                        "memcg_oom_kill_is_recorded_and_explained",
                        "explain_kmsg_finds_a_kill_without_any_store",
                        "sigkill_from_another_process_names_the_sender",
                        "a_reused_pid_is_never_recorded_under_its_earlier_holder",
                        // Page cache reclaimed in the cgroup: the guest's
                        // scratch space is an ext4 disk (guest.sh).
                        "reclaim_in_the_cgroup_before_a_kill_is_counted",
                        "programs_killed_just_after_exec_keep_their_command_line_and_cgroup",
                    ],
                ),
                (
                    "kernel",
                    &["doctor_names_what_this_kernel_lacks_in_one_line_each"],
                ),
            ],
            Suite::V2 => &[
                (
                    "e2e",
                    &[
                        "memcg_oom_kill_is_recorded_and_explained",
                        "v2_only_a_live_memory_oom_group_kill_is_recorded_as_one_incident",
                        "sigkill_from_another_process_names_the_sender",
                        // 7.x moved the reclaim items out of the enum the
                        // counters had been keyed by.
                        "reclaim_in_the_cgroup_before_a_kill_is_counted",
                        "programs_killed_just_after_exec_keep_their_command_line_and_cgroup",
                    ],
                ),
                (
                    "hardening",
                    &["a_process_that_joins_a_cgroup_execs_and_dies_at_once_is_placed_right"],
                ),
                // systemd-oomd acts on cgroup v2 only: its entry names the
                // unified hierarchy's path, which the kill's must match;
                // kubelet's pod under the same hierarchy.
                (
                    "journal",
                    &[
                        "a_sigkill_from_systemd_oomd_takes_the_reason_of_its_journal_entry",
                        "the_runtime_s_sigkill_after_kubelet_s_liveness_restart_takes_its_reason",
                        "the_runtime_s_sigkill_after_a_pod_s_deletion_through_the_api_takes_its_reason",
                        // The real earlyoom and nohang act on the whole
                        // machine: only in a guest.
                        "vm_only_earlyoom_s_sigkill_takes_the_reason_of_its_own_lines",
                        "vm_only_nohang_s_sigkill_takes_the_reason_of_its_own_lines",
                    ],
                ),
                // Growth armed on risk, the default, on cgroup v2: at the
                // level (memory.current), and over memory.high.
                (
                    "growth",
                    &[
                        "growth_on_risk_follows_only_the_cgroup_at_risk",
                        "v2_only_a_cgroup_over_memory_high_arms_growth",
                    ],
                ),
                // kubelet's systemd driver's slices, the layout of a
                // Kubernetes node on cgroup v2.
                (
                    "metrics",
                    &["a_pod_under_the_systemd_drivers_slices_is_named_by_pod_and_container"],
                ),
                // PSI-based early warnings: a hog throttled at memory.high.
                (
                    "warning",
                    &["v2_only_memory_high_throttling_is_warned_by_psi_before_the_kill"],
                ),
                (
                    "kernel",
                    &["doctor_names_what_this_kernel_lacks_in_one_line_each"],
                ),
            ],
        }
    }
}

/// A Debian kernel, pinned by package and version.
struct Kernel {
    /// What `--kernel` calls it.
    name: &'static str,
    /// apt sources lines it comes from.
    sources: &'static [&'static str],
    /// The packages to unpack (image first), all of `version`.
    packages: &'static [&'static str],
    /// The Debian version of every package.
    version: &'static str,
}

/// The kernels of the matrix: Debian 11's, 12's, 13's and 13's backport,
/// the newest of each series on 2026-12-04.
const KERNELS: &[Kernel] = &[
    Kernel {
        name: "5.10",
        sources: &[
            "deb http://deb.debian.org/debian bullseye main",
            "deb http://deb.debian.org/debian-security bullseye-security main",
        ],
        packages: &["linux-image-5.10.0-46-amd64"],
        version: "5.10.262-1",
    },
    Kernel {
        name: "6.1",
        sources: &[
            "deb http://deb.debian.org/debian bookworm main",
            "deb http://deb.debian.org/debian-security bookworm-security main",
        ],
        packages: &["linux-image-6.1.0-57-amd64"],
        version: "6.1.192-3",
    },
    Kernel {
        name: "6.12",
        sources: &[
            "deb http://deb.debian.org/debian trixie main",
            "deb http://deb.debian.org/debian-security trixie-security main",
        ],
        packages: &["linux-image-6.12.118+deb13-amd64"],
        version: "6.12.118-1",
    },
    Kernel {
        name: "7.3",
        sources: &["deb http://deb.debian.org/debian trixie-backports main"],
        // Debian 13's backports split the kernel: the image is a
        // meta-package over binary (vmlinuz), modules and base (config).
        packages: &[
            "linux-image-7.3.4+deb13-amd64",
            "linux-binary-7.3.4+deb13-amd64",
            "linux-modules-7.3.4+deb13-amd64",
            "linux-base-7.3.4+deb13-amd64",
        ],
        version: "7.3.4-1~bpo13+1",
    },
];

/// The matrix of `--all`: every kernel on v2, and the newest kernel that
/// still has the v1 memory controller (Debian builds 6.12 and later
/// without CONFIG_MEMCG_V1) on v1.
const MATRIX: &[(&str, Cgroup)] = &[
    ("5.10", Cgroup::V2),
    ("6.1", Cgroup::V2),
    ("6.12", Cgroup::V2),
    ("7.3", Cgroup::V2),
    ("6.1", Cgroup::V1),
];

fn work() -> PathBuf {
    root().join("target/vm-test")
}

/// One guest run's outcome.
#[derive(Debug)]
enum Verdict {
    /// Every test passed: (passed, seconds).
    Pass(usize, u64),
    /// Some failed, or the guest did not finish: why.
    Fail(String),
    /// Not run: why.
    Skip(String),
}

/// Runs the guests and prints per-test results; fails on any failure.
pub fn run(opts: Options) -> anyhow::Result<()> {
    let runs: Vec<(String, Cgroup)> = if opts.all {
        MATRIX.iter().map(|(k, c)| (k.to_string(), *c)).collect()
    } else {
        vec![(opts.kernel.clone(), opts.cgroup)]
    };
    tools()?;
    let plan = if opts.bench {
        crate::build_release()?;
        Vec::new()
    } else {
        build_plan(opts.suite, &opts.filter)?
    };
    let mut table = Vec::new();
    for (kernel, cgroup) in &runs {
        let verdict = match fetch(kernel)? {
            Err(why) => Verdict::Skip(why),
            Ok(vmlinuz) => guest(&vmlinuz, kernel, *cgroup, &plan, &opts)?,
        };
        eprintln!("xtask: vm-test {kernel} {}: {verdict:?}", cgroup.name());
        table.push((kernel.clone(), *cgroup, verdict));
    }
    println!("| kernel | cgroup | result |\n|---|---|---|");
    for (k, c, v) in &table {
        let r = match v {
            Verdict::Pass(n, s) => format!("pass ({n} tests, {s} s)"),
            Verdict::Fail(why) => format!("**fail**: {why}"),
            Verdict::Skip(why) => format!("skip: {why}"),
        };
        println!("| {k} | {} | {r} |", c.name());
    }
    let failed = table
        .iter()
        .filter(|(.., v)| matches!(v, Verdict::Fail(_)))
        .count();
    if failed > 0 {
        bail!("{failed} of {} guest runs failed", table.len());
    }
    Ok(())
}

/// What the guest runs: (test binary path, filters) per test binary.
fn build_plan(
    suite: Option<Suite>,
    filter: &[String],
) -> anyhow::Result<Vec<(PathBuf, Vec<String>)>> {
    crate::setup::check_toolchain()?;
    crate::build_test_bins()?;
    let out = crate::cargo()
        .current_dir(root())
        .args([
            "test",
            "-p",
            "tracer-e2e",
            "--tests",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the end-to-end tests failed");
    }
    let mut binaries = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str())
        else {
            continue;
        };
        if v["target"]["kind"][0] == "test" {
            binaries.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    let wanted: Vec<(String, Vec<String>)> = match suite {
        Some(s) => s
            .tests()
            .iter()
            .map(|(bin, tests)| {
                (
                    bin.to_string(),
                    tests.iter().map(|t| t.to_string()).collect(),
                )
            })
            .collect(),
        None => binaries
            .keys()
            .map(|b| (b.clone(), filter.to_vec()))
            .collect(),
    };
    wanted
        .into_iter()
        .map(|(bin, filters)| {
            let exe = binaries
                .get(&bin)
                .with_context(|| format!("no test binary {bin} in tracer-e2e"))?;
            Ok((exe.clone(), filters))
        })
        .collect()
}

/// QEMU, busybox and virtme-ng (in a venv of its own under target/).
fn tools() -> anyhow::Result<()> {
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !have("qemu-system-x86_64") {
        // This machine kind ships qemu-utils from bookworm-backports, which
        // breaks bookworm's qemu-system-common: take QEMU from the same
        // backports, through a private apt state, then install the .debs.
        let bpo = Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}", "qemu-utils"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("bpo"));
        let mut apt = Command::new("apt-get");
        if bpo {
            let private = crate::setup::private_apt(
                &work().join("apt-qemu"),
                &[
                    "deb http://deb.debian.org/debian bookworm main",
                    "deb http://deb.debian.org/debian bookworm-updates main",
                    "deb http://deb.debian.org/debian-security bookworm-security main",
                    "deb http://deb.debian.org/debian bookworm-backports main",
                ],
            )?;
            sh(Command::new("apt-get")
                .args(&private)
                .args(["update", "-qq"]))?;
            apt.args(&private).args(["-t", "bookworm-backports"]);
        } else {
            sh(Command::new("apt-get").args(["update", "-qq"]))?;
        }
        sh(apt
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "qemu-system-x86",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let mut missing = Vec::new();
    for (cmd, package) in [("busybox", "busybox-static"), ("depmod", "kmod")] {
        if !have(cmd) {
            missing.push(package);
        }
    }
    if !missing.is_empty() {
        sh(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let venv = work().join("venv");
    if !venv.join("bin/vng").exists() {
        sh(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        sh(Command::new(venv.join("bin/pip")).args(["install", "-q", "virtme-ng==1.42"]))?;
    }
    Ok(())
}

/// The vmlinuz of `name` (downloaded and unpacked once), or why there is none.
fn fetch(name: &str) -> anyhow::Result<Result<PathBuf, String>> {
    if Path::new(name).is_file() {
        return Ok(Ok(fs::canonicalize(name)?));
    }
    let Some(k) = KERNELS.iter().find(|k| k.name == name) else {
        bail!(
            "unknown kernel {name}: one of {} or a vmlinuz path",
            KERNELS
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let dir = work()
        .join("kernels")
        .join(format!("{}_{}", k.packages[0], k.version));
    if !dir.join(".done").exists() {
        let pinned: Vec<String> = k
            .packages
            .iter()
            .map(|p| format!("{p}={}", k.version))
            .collect();
        let pinned: Vec<&str> = pinned.iter().map(String::as_str).collect();
        eprintln!("xtask: downloading kernel {}", pinned.join(" "));
        if let Err(e) = crate::setup::private_debs(&dir, k.sources, &pinned) {
            // The archive keeps only the newest build of a series: a pin it
            // no longer lists is a skip; anything else (no network, a
            // full disk) is a failure, never a skip.
            let gone = unlisted(&dir, k.sources, &pinned)?;
            if gone.is_empty() {
                return Err(e.context(format!("downloading kernel {name}")));
            }
            return Ok(Err(format!(
                "the archive no longer has {}: pin the series' newest in xtask/src/vm.rs",
                gone.join(" ")
            )));
        }
        fs::write(dir.join(".done"), "")?;
    }
    for sub in ["root/boot", "root/usr/lib/modules"] {
        let Ok(entries) = fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let found = if p.is_dir() { p.join("vmlinuz") } else { p };
            if found
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz"))
                && found.is_file()
            {
                return Ok(Ok(found));
            }
        }
    }
    bail!("{} unpacked without a vmlinuz", dir.display())
}

/// Which of `pinned` (`name=version`) the private apt lists under `dir`,
/// read without error, do not have; empty when the lists were not read
/// (a failed update says nothing about the archive).
fn unlisted(dir: &Path, sources: &[&str], pinned: &[&str]) -> anyhow::Result<Vec<String>> {
    let read = fs::read_dir(dir.join("apt/lists")).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
    });
    if !read {
        return Ok(Vec::new());
    }
    let private = crate::setup::private_apt(dir, sources)?;
    let mut gone = Vec::new();
    for p in pinned {
        let (name, version) = p.split_once('=').unwrap_or((p, ""));
        // `apt-cache show NAME=VERSION` exits 0 even when it finds
        // nothing; madison's table says which versions there are.
        let out = Command::new("apt-cache")
            .args(&private)
            .args(["madison", name])
            .output()
            .context("apt-cache madison")?;
        let listed = String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.split('|').nth(1).is_some_and(|v| v.trim() == version));
        if !listed {
            gone.push(p.to_string());
        }
    }
    Ok(gone)
}

/// The kernel config beside `vmlinuz` (Debian's boot/config-VERSION).
fn kernel_config(vmlinuz: &Path) -> Option<String> {
    let boot = vmlinuz.parent()?;
    fs::read_dir(boot)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("config"))
        .and_then(|e| fs::read_to_string(e.path()).ok())
}

/// Boots `vmlinuz` with the guest script and reads what it wrote.
fn guest(
    vmlinuz: &Path,
    kernel: &str,
    cgroup: Cgroup,
    plan: &[(PathBuf, Vec<String>)],
    opts: &Options,
) -> anyhow::Result<Verdict> {
    if cgroup == Cgroup::V1
        && kernel_config(vmlinuz).is_some_and(|c| c.contains("# CONFIG_MEMCG_V1 is not set"))
    {
        return Ok(Verdict::Skip(
            "built without CONFIG_MEMCG_V1: no cgroup v1 memory controller".into(),
        ));
    }
    let tag = format!("{kernel}-{}", cgroup.name()).replace(
        |c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '-',
        "_",
    );
    let out = work().join("out").join(&tag);
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(&out)?;
    let mut plan_text = String::new();
    for (exe, filters) in plan {
        plan_text.push_str(&exe.display().to_string());
        for f in filters {
            plan_text.push('\t');
            plan_text.push_str(f);
        }
        plan_text.push('\n');
    }
    fs::write(out.join("plan"), plan_text)?;
    if opts.bench {
        let xtask = std::env::current_exe().context("this program's path")?;
        let lines: Vec<String> = GUEST_BENCHES
            .iter()
            .map(|args| {
                format!(
                    "{}\tbench\t--prebuilt\t{}",
                    xtask.display(),
                    args.join("\t")
                )
            })
            .collect();
        fs::write(out.join("bench"), lines.join("\n") + "\n")?;
    }
    let script = root().join("xtask/vm/guest.sh");
    // KVM only with real VT-x/AMD-V; nested paravirtualised hosts (no vmx
    // or svm flag) cannot run a stock kernel under KVM.
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kvm = (cpuinfo.contains(" vmx") || cpuinfo.contains(" svm"))
        && fs::OpenOptions::new().write(true).open("/dev/kvm").is_ok();
    eprintln!(
        "xtask: booting {} ({}, {} vCPU, {}), cgroup {}",
        vmlinuz.display(),
        if kvm {
            "KVM"
        } else {
            "no KVM here: software emulation (TCG)"
        },
        opts.cpus,
        opts.memory,
        cgroup.name()
    );
    let venv = work().join("venv/bin");
    let path = format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let start = Instant::now();
    let mut cmd = Command::new("timeout");
    cmd.arg(opts.timeout.to_string())
        .arg(venv.join("vng"))
        .arg("--run")
        .arg(vmlinuz);
    if !kvm {
        cmd.arg("--disable-kvm");
    }
    cmd.args(["--cpus", &opts.cpus.to_string(), "--memory", &opts.memory])
        .arg("--rwdir")
        .arg(format!("/mnt={}", out.display()))
        .arg("--verbose")
        .arg("--exec")
        .arg(format!(
            "{} {} /mnt {}",
            script.display(),
            cgroup.name(),
            root().join("target/debug").display()
        ))
        .env("PATH", path)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(fs::File::create(out.join("console.log"))?)
        .stderr(fs::File::create(out.join("console.err"))?);
    let status = cmd.status().context("run vng")?;
    let secs = start.elapsed().as_secs();
    eprintln!("xtask: guest ended after {secs} s ({status})");
    if fs::read_to_string(out.join("setup-failed")).is_ok_and(|s| !s.is_empty()) {
        let why = fs::read_to_string(out.join("setup-failed"))?;
        return Ok(Verdict::Fail(format!("guest setup: {}", why.trim())));
    }
    let mut passed = 0;
    let mut failures = Vec::new();
    // A filter is an error only when it matched a test in no binary.
    let mut matched: Vec<(String, bool)> = Vec::new();
    for (exe, filters) in plan {
        let file = exe
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        // `e2e-0123abcd`: cargo's hash is not part of the test's name.
        let name = file.rsplit_once('-').map_or(file.as_str(), |(n, _)| n);
        // One log per filter (BINARY.0.log, ...), one for a whole binary.
        let filters: Vec<&str> = if filters.is_empty() {
            vec![""]
        } else {
            filters.iter().map(String::as_str).collect()
        };
        for (i, filter) in filters.iter().enumerate() {
            let log = fs::read_to_string(out.join(format!("{file}.{i}.log"))).unwrap_or_default();
            let results = test_results(&log);
            for (test, ok) in &results {
                eprintln!(
                    "xtask:   {name}::{test} ... {}",
                    if *ok { "ok" } else { "FAILED" }
                );
            }
            for (test, _) in results.iter().filter(|(_, ok)| !ok) {
                // The guest's logs stay on the machine that ran it: what
                // the test said goes into the run's own output.
                for l in failure_output(&log, test) {
                    eprintln!("xtask:     | {l}");
                }
            }
            passed += results.iter().filter(|(_, ok)| *ok).count();
            failures.extend(
                results
                    .iter()
                    .filter(|(_, ok)| !ok)
                    .map(|(t, _)| format!("{name}::{t}")),
            );
            if !log.contains("test result:") {
                failures.push(format!("{name} {filter} did not finish"));
            }
            match matched.iter_mut().find(|(f, _)| f == filter) {
                Some((_, any)) => *any |= !results.is_empty(),
                None => matched.push((filter.to_string(), !results.is_empty())),
            }
        }
    }
    if opts.bench {
        for (i, args) in GUEST_BENCHES.iter().enumerate() {
            let md = fs::read_to_string(out.join(format!("bench.{i}.md"))).unwrap_or_default();
            let exit = fs::read_to_string(out.join(format!("bench.{i}.exit"))).unwrap_or_default();
            println!("{md}");
            if exit.trim() == "0" {
                passed += 1;
            } else {
                let log =
                    fs::read_to_string(out.join(format!("bench.{i}.log"))).unwrap_or_default();
                for l in log
                    .lines()
                    .rev()
                    .take(FAILURE_LINES)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    eprintln!("xtask:     | {l}");
                }
                failures.push(format!(
                    "bench {} exit {}",
                    args.join(" "),
                    if exit.is_empty() {
                        "none (did not finish)"
                    } else {
                        exit.trim()
                    }
                ));
            }
        }
    }
    for (filter, _) in matched.iter().filter(|(_, any)| !any) {
        failures.push(format!("no test matched {filter:?}"));
    }
    if status.code() == Some(124) {
        failures.push(format!("the guest ran past {} s", opts.timeout));
    }
    Ok(if failures.is_empty() {
        Verdict::Pass(passed, secs)
    } else {
        Verdict::Fail(format!(
            "{} (logs in {})",
            failures.join(", "),
            out.display()
        ))
    })
}

/// (test, passed) for each `test NAME ... ok|FAILED` line of a libtest run.
fn test_results(log: &str) -> Vec<(String, bool)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("test ")?;
            let (name, result) = rest.rsplit_once(" ... ")?;
            match result.trim() {
                "ok" => Some((name.to_string(), true)),
                "FAILED" => Some((name.to_string(), false)),
                _ => None,
            }
        })
        .collect()
}

/// The most lines of a failed test's output the run prints.
const FAILURE_LINES: usize = 60;

/// What libtest printed for failed `test` (its `---- TEST stdout ----`
/// section), at most [`FAILURE_LINES`] lines, the last ones kept (the
/// panic message comes last).
fn failure_output<'a>(log: &'a str, test: &str) -> Vec<&'a str> {
    let head = format!("---- {test} stdout ----");
    let Some(at) = log.find(&head) else {
        return Vec::new();
    };
    let section: Vec<&str> = log[at + head.len()..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("---- ") && *l != "failures:")
        .collect();
    section[section.len().saturating_sub(FAILURE_LINES)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_tests_own_output_is_found() {
        let log = "test a ... FAILED\n\nfailures:\n\n---- a stdout ----\n\
                   seen dead\nthread 'a' panicked at e2e.rs:1:\nno answer\n\n\
                   ---- b stdout ----\nother\n\nfailures:\n    a\n";
        let out = failure_output(log, "a");
        assert_eq!(out[0], "seen dead");
        assert!(out.contains(&"no answer"), "{out:?}");
        assert!(!out.contains(&"other"), "{out:?}");
        assert!(failure_output(log, "c").is_empty());
    }

    #[test]
    fn libtest_lines_are_read_and_the_rest_ignored() {
        let log = "running 3 tests\ntest a ... ok\ntest b::c ... FAILED\n\
                   test d ... ignored\nsome output ... ok\ntest result: FAILED. 1 passed";
        assert_eq!(
            test_results(log),
            vec![("a".to_string(), true), ("b::c".to_string(), false)]
        );
    }

    #[test]
    fn every_matrix_kernel_is_pinned_and_every_suite_names_known_binaries() {
        for (k, _) in MATRIX {
            assert!(KERNELS.iter().any(|p| p.name == *k), "{k}");
        }
        let tests = root().join("tests/tests");
        for s in [Suite::KillCapture, Suite::V2] {
            for (bin, names) in s.tests() {
                let src = fs::read_to_string(tests.join(format!("{bin}.rs"))).unwrap();
                for n in *names {
                    assert!(src.contains(&format!("fn {n}()")), "{bin}::{n}");
                }
            }
        }
    }
}
