//! `cargo xtask <verb>`: everything a newcomer or CI runs, in one place.

mod bench;
mod demo;
mod dist;
mod progstats;
mod setup;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

/// Project tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Install what the build and the tests need (idempotent).
    Setup,
    /// Build tracer and the test workloads (release).
    Build,
    /// Build and run tracer as root: `cargo xtask run -- doctor`.
    Run {
        /// Arguments for tracer.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the unit tests and the privileged end-to-end tests.
    Test,
    /// Run the benchmarks and print their figures (markdown).
    Bench(bench::Options),
    /// Check this machine (tracer doctor).
    Doctor,
    /// Set up, build, record a real OOM kill in a scratch cgroup and explain it.
    Demo,
    /// Run the privileged end-to-end tests on other kernels, in guests.
    VmTest(vm::Options),
    /// Build the release artifacts (static binary, .deb, OCI image, sums).
    Dist(dist::Options),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.verb {
        Verb::Setup => setup::run(),
        Verb::Build => build_release().map(|_| ()),
        Verb::Run { args } => run_tracer(&args),
        Verb::Test => test(),
        Verb::Bench(opts) => bench::run(opts),
        Verb::Doctor => run_tracer(&["doctor".to_string()]),
        Verb::Demo => demo::run(),
        Verb::VmTest(opts) => vm::run(opts),
        Verb::Dist(opts) => dist::run(opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command in the workspace root (or the directory it names),
/// failing on a non-zero exit.
pub fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(root());
    }
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd.status().with_context(|| format!("spawn {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Release binaries: (tracer, memhog).
pub struct Bins {
    /// target/release/tracer.
    pub tracer: PathBuf,
    /// target/release/memhog.
    pub memhog: PathBuf,
    /// target/release/killstorm.
    pub killstorm: PathBuf,
    /// target/release/oomstorm.
    pub oomstorm: PathBuf,
}

fn build_release() -> anyhow::Result<Bins> {
    setup::check_toolchain()?;
    sh(cargo().args([
        "build",
        "--release",
        "-p",
        "tracer",
        "-p",
        "tracer-e2e",
        "--bins",
    ]))?;
    release_bins()
}

/// The release binaries as they are; an error naming the first missing.
fn release_bins() -> anyhow::Result<Bins> {
    let dir = root().join("target/release");
    let bins = Bins {
        tracer: dir.join("tracer"),
        memhog: dir.join("memhog"),
        killstorm: dir.join("killstorm"),
        oomstorm: dir.join("oomstorm"),
    };
    for b in [&bins.tracer, &bins.memhog, &bins.killstorm, &bins.oomstorm] {
        if !b.exists() {
            bail!(
                "{} is missing: build the release binaries first",
                b.display()
            );
        }
    }
    Ok(bins)
}

/// The release memhog alone (the artifacts' checks OOM-kill it).
pub fn build_memhog() -> anyhow::Result<PathBuf> {
    sh(cargo().args(["build", "--release", "-p", "tracer-e2e", "--bin", "memhog"]))?;
    Ok(root().join("target/release/memhog"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run_tracer(args: &[String]) -> anyhow::Result<()> {
    let bins = build_release()?;
    let mut cmd = if is_root() {
        Command::new(&bins.tracer)
    } else {
        let mut c = Command::new("sudo");
        c.arg(&bins.tracer);
        c
    };
    let status = cmd.args(args).status().context("run tracer")?;
    if !status.success() {
        bail!("tracer {} exited with {status}", args.join(" "));
    }
    Ok(())
}

/// The debug binaries the end-to-end tests start (target/debug/tracer,
/// memhog, killstorm).
pub fn build_test_bins() -> anyhow::Result<()> {
    sh(cargo().args(["build", "-p", "tracer", "-p", "tracer-e2e", "--bins"]))
}

fn test() -> anyhow::Result<()> {
    setup::check_toolchain()?;
    sh(cargo().args(["test", "-p", "tracer-common", "-p", "tracer", "-p", "xtask"]))?;
    build_test_bins()?;
    if !is_root() {
        if std::env::var_os("CI").is_some() {
            bail!("the end-to-end tests need root (and BPF); CI runs them as root");
        }
        eprintln!("xtask: not root: the end-to-end tests run under sudo");
        return sh(Command::new("sudo").args([
            "-E",
            "cargo",
            "test",
            "-p",
            "tracer-e2e",
            "--",
            "--test-threads=1",
        ]));
    }
    // One at a time: the tests make real OOM kills and read the one kernel log.
    sh(cargo().args(["test", "-p", "tracer-e2e", "--", "--test-threads=1"]))
}
