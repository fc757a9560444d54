//! `cargo xtask dist`: the release artifacts, built with no daemon and the
//! same bytes from the same commit and toolchain.
//!
//! - `tracer-V-x86_64-linux-static`: a static (musl) binary that runs on
//!   any x86_64 Linux. It cannot load the NVIDIA driver's libnvidia-ml.so.1
//!   (a static binary has no dynamic loader), so NVML is off in it; host,
//!   CUDA and Python tracing all work.
//! - `tracer_V_amd64.deb`: the glibc build (NVML works), the systemd unit,
//!   with `Depends: libc6 (>= the newest symbol version it uses)`.
//! - `tracer-V-oci.tar`: an OCI image layout (a tar `skopeo`, `podman
//!   load` and `ctr images import` read) named `tracer:V`: the glibc build
//!   and the glibc runtime it and the driver's libraries need, nothing
//!   else. The NVIDIA container toolkit mounts libnvidia-ml.so.1 into it.
//! - `SHA256SUMS` of the three.
//!
//! Timestamps come from `SOURCE_DATE_EPOCH` (default: the commit's time);
//! the build's paths are remapped (`/src/tracer`, `/cargo`) so that a
//! clone elsewhere builds the same binary. `--check` tests the artifacts:
//! the .deb installed in a clean root by dpkg and `tracer doctor` run
//! there, and the image run by a real OCI runtime (runc) as the DaemonSet
//! runs it, recording a real OOM kill outside it that `explain` inside it
//! names (check.rs).

mod check;
mod deb;
mod oci;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{root, sh};

/// The version in the artifacts' names: the workspace's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The image's name; the DaemonSet refers to it with [`VERSION`] as tag.
pub const IMAGE: &str = "tracer";

/// Options of `cargo xtask dist`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Also test the artifacts: the .deb in a clean root, the image under
    /// runc recording a real OOM kill (root; installs runc and umoci).
    #[arg(long)]
    check: bool,
    /// Where the artifacts are written.
    #[arg(long, default_value = "target/dist")]
    out: PathBuf,
}

/// The two builds the artifacts are made of.
pub struct Builds {
    /// The static (musl) binary.
    pub statik: PathBuf,
    /// The glibc binary.
    pub glibc: PathBuf,
}

/// What every artifact is stamped with.
pub struct Stamp {
    /// Seconds since the epoch: every file's time.
    pub epoch: u64,
    /// The commit built (`unknown` outside git).
    pub commit: String,
}

/// Runs `cargo xtask dist`.
pub fn run(opts: Options) -> anyhow::Result<()> {
    crate::setup::check_toolchain()?;
    let out = if opts.out.is_absolute() {
        opts.out
    } else {
        root().join(opts.out)
    };
    let stamp = stamp()?;
    let builds = Builds {
        statik: build("x86_64-unknown-linux-musl")?,
        glibc: build("x86_64-unknown-linux-gnu")?,
    };
    let made = package(&builds, &stamp, &out)?;
    eprintln!("xtask: artifacts in {}:", out.display());
    eprint!("{}", std::fs::read_to_string(out.join("SHA256SUMS"))?);
    if opts.check {
        check::run(&builds, &stamp, &made)?;
    }
    Ok(())
}

/// The artifacts made, by kind.
pub struct Made {
    /// The static binary.
    pub statik: PathBuf,
    /// The .deb.
    pub deb: PathBuf,
    /// The OCI image layout tar.
    pub image: PathBuf,
}

/// The names of the files `cargo xtask dist` writes into its `--out`.
pub fn artifact_names() -> [String; 4] {
    [
        format!("tracer-{VERSION}-x86_64-linux-static"),
        format!("tracer_{VERSION}_amd64.deb"),
        format!("{IMAGE}-{VERSION}-oci.tar"),
        "SHA256SUMS".to_string(),
    ]
}

/// Removes an earlier run's artifacts from `out`, and nothing else: `--out`
/// may name a directory that holds other files, which stay as they were.
fn clear_artifacts(out: &Path) -> anyhow::Result<()> {
    for name in artifact_names() {
        let path = out.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => bail!(
                "{} is a directory, not an earlier artifact; remove it or pick another --out",
                path.display()
            ),
            Ok(_) => std::fs::remove_file(&path)
                .with_context(|| format!("remove the earlier {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        }
    }
    Ok(())
}

/// Writes the artifacts and their sums into `out`, replacing an earlier
/// run's and leaving any other file there alone.
pub fn package(builds: &Builds, stamp: &Stamp, out: &Path) -> anyhow::Result<Made> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    clear_artifacts(out)?;
    let [statik_name, deb_name, image_name, _] = artifact_names();
    let statik = out.join(statik_name);
    install_file(&builds.statik, &statik, 0o755)?;
    set_times(&statik, stamp.epoch)?;
    let deb = out.join(deb_name);
    deb::build(&builds.glibc, stamp, &deb)?;
    let image = out.join(image_name);
    oci::build(&builds.glibc, stamp, &image)?;
    let names: Vec<&str> = [&statik, &deb, &image]
        .iter()
        .map(|p| p.file_name().and_then(|n| n.to_str()).unwrap_or_default())
        .collect();
    let sums = capture(Command::new("sha256sum").args(&names).current_dir(out))?;
    std::fs::write(out.join("SHA256SUMS"), sums)?;
    Ok(Made { statik, deb, image })
}

/// Builds tracer (release, locked) for `target`, with the workspace and
/// cargo's home remapped; the binary's path.
///
/// The remapping is passed by a rustc wrapper, not by rustflags: the
/// eBPF programs are built by a cargo that tracer's build script starts
/// (aya-build), which sets rustflags of its own and would keep this
/// machine's paths in the programs' BTF; a wrapper reaches it too.
fn build(target: &str) -> anyhow::Result<PathBuf> {
    let root = root();
    let cargo_home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo")
        });
    let wrapper = root.join("target/dist-rustc");
    write_file(
        &wrapper,
        &format!(
            "#!/bin/sh\n# cargo xtask dist: rustc with this machine's paths remapped.\nexec \"$@\" --remap-path-prefix={}=/src/tracer --remap-path-prefix={}=/cargo\n",
            root.display(),
            cargo_home.display()
        ),
        0o755,
    )?;
    // A target directory of its own: cargo does not rebuild what it built
    // without the wrapper when only the wrapper is new.
    let dir = root.join("target/dist-build");
    let mut cmd = crate::cargo();
    cmd.args(["build", "--release", "--locked", "-p", "tracer"])
        .args(["--target", target, "--target-dir"])
        .arg(&dir)
        .env("RUSTC_WRAPPER", &wrapper);
    if target.ends_with("musl") {
        // SQLite (rusqlite's bundled C) is compiled against musl too.
        cmd.env("CC_x86_64_unknown_linux_musl", "musl-gcc");
    }
    sh(&mut cmd)?;
    Ok(dir.join(target).join("release/tracer"))
}

/// The commit and its time, or `SOURCE_DATE_EPOCH` where it is set.
fn stamp() -> anyhow::Result<Stamp> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v.parse().context("SOURCE_DATE_EPOCH is not a number")?,
        Err(_) => git(&["log", "-1", "--format=%ct"])
            .and_then(|s| s.parse().ok())
            .context("no SOURCE_DATE_EPOCH and no git commit to take the time from")?,
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    Ok(Stamp { epoch, commit })
}

/// Copies `from` to `to` with `mode` (times: [`set_times`] over the
/// whole tree, once).
pub fn install_file(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Writes `text` to `to` with `mode`.
pub fn write_file(to: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(to, text)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Sets every time under `path` (links themselves included) to `epoch`.
pub fn set_times(path: &Path, epoch: u64) -> anyhow::Result<()> {
    sh(Command::new("find")
        .arg(path)
        .args(["-exec", "touch", "-h", "-d"])
        .arg(format!("@{epoch}"))
        .args(["{}", "+"]))
}

/// A tar of `dir`'s contents that depends on nothing but them and `epoch`:
/// names sorted, owner root, times `epoch`, no extended headers.
pub fn tar(dir: &Path, epoch: u64, out: &Path) -> anyhow::Result<()> {
    sh(Command::new("tar")
        .args([
            "--sort=name",
            "--format=gnu",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
        ])
        .arg(format!("--mtime=@{epoch}"))
        .arg("-cf")
        .arg(out)
        .arg("-C")
        .arg(dir)
        .arg("."))
}

/// A command's standard output; fails on a non-zero exit.
pub fn capture(cmd: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("spawn {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The SHA-256 of a file, hex.
pub fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = capture(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(String::from)
        .context("sha256sum printed nothing")
}

/// The newest glibc symbol version `bin` needs (`2.34`).
pub fn glibc_needed(bin: &Path) -> anyhow::Result<String> {
    let dump = capture(Command::new("objdump").arg("-T").arg(bin))?;
    let mut best: Option<(u32, u32)> = None;
    for v in dump.split("GLIBC_").skip(1) {
        let v: String = v
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (Some(major), minor) = (parts.next(), parts.next().unwrap_or(0)) else {
            continue;
        };
        best = best.max(Some((major, minor)));
    }
    let (major, minor) = best.context("the glibc build names no GLIBC_ symbol version")?;
    Ok(format!("{major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rerun_replaces_its_own_artifacts_and_keeps_everything_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        for name in artifact_names() {
            std::fs::write(out.join(name), b"earlier run").unwrap();
        }
        std::fs::write(out.join("notes.txt"), b"the user's").unwrap();
        std::fs::create_dir(out.join("keep")).unwrap();
        std::fs::write(out.join("keep/file"), b"x").unwrap();
        clear_artifacts(out).unwrap();
        for name in artifact_names() {
            assert!(!out.join(&name).exists(), "{name} left behind");
        }
        assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"the user's");
        assert!(out.join("keep/file").exists());
    }

    #[test]
    fn a_directory_in_an_artifacts_place_is_refused_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let [_, deb, ..] = artifact_names();
        std::fs::create_dir(dir.path().join(&deb)).unwrap();
        std::fs::write(dir.path().join(&deb).join("inside"), b"x").unwrap();
        let err = clear_artifacts(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("is a directory"), "{err:#}");
        assert!(dir.path().join(&deb).join("inside").exists());
    }
}
