//! `cargo xtask dist --check`: the artifacts tested as an operator would
//! use them.
//!
//! - **Packaging is deterministic:** packaged again from the same builds,
//!   every artifact has the same SHA-256.
//! - **The static binary is static** (no interpreter, no needed library)
//!   and says so where NVML would be.
//! - **The .deb:** dpkg refuses it in an empty root (its dependencies are
//!   declared), installs it in a clean root holding only what it depends
//!   on (this machine's libc6, libgcc-s1 and gcc-12-base, and dash for the
//!   maintainer scripts), and `tracer doctor` run there in a chroot says
//!   recording works; dpkg removes it again.
//! - **The image:** umoci unpacks it (checking every digest), runc runs
//!   it as the DaemonSet does (privileged, the host's PID namespace, the
//!   host's /sys and /dev/kmsg, a state directory), it records a real OOM
//!   kill of a process outside the container in a memory cgroup made
//!   here, and `tracer explain` run inside the container names it. The
//!   driver's real libnvidia-ml.so.1, mounted in as the NVIDIA container
//!   toolkit would, loads (`doctor` finds it and says the kernel module is
//!   missing, which it is here).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use serde_json::json;
use tracer_e2e::{TestCgroup, wait_for};

use super::{Builds, IMAGE, Made, Stamp, VERSION, capture, package, sha256};
use crate::sh;

const MIB: u64 = 1 << 20;

/// Runs every check.
pub fn run(builds: &Builds, stamp: &Stamp, made: &Made) -> anyhow::Result<()> {
    ensure!(
        crate::is_root(),
        "dist --check installs packages and runs containers (runc, umoci): run it as root"
    );
    tools()?;
    deterministic(builds, stamp, made)?;
    statik(&made.statik)?;
    deb(&made.deb)?;
    image(&made.image)?;
    eprintln!("xtask: dist --check: every artifact passed");
    Ok(())
}

fn tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = ["runc", "umoci"]
        .into_iter()
        .filter(|t| capture(Command::new(t).arg("--version")).is_err())
        .collect();
    crate::setup::apt_install(&missing)
}

fn deterministic(builds: &Builds, stamp: &Stamp, made: &Made) -> anyhow::Result<()> {
    let again = tempfile::tempdir()?;
    let second = package(builds, stamp, again.path())?;
    for (a, b) in [
        (&made.statik, &second.statik),
        (&made.deb, &second.deb),
        (&made.image, &second.image),
    ] {
        let (x, y) = (sha256(a)?, sha256(b)?);
        ensure!(x == y, "{} is not reproducible: {x} then {y}", a.display());
    }
    eprintln!("xtask: check: packaged twice, the same SHA-256 for each artifact");
    Ok(())
}

fn statik(bin: &Path) -> anyhow::Result<()> {
    let headers = capture(Command::new("readelf").args(["-l", "-d"]).arg(bin))?;
    ensure!(
        !headers.contains("INTERP") && !headers.contains("(NEEDED)"),
        "the static binary has a loader or needs libraries:\n{headers}"
    );
    let doctor = capture(Command::new(bin).arg("doctor"))?;
    ensure!(
        doctor.contains("recording works here"),
        "static doctor:\n{doctor}"
    );
    // It knows it cannot load NVML, and does not blame the node for it.
    ensure!(
        doctor.contains("no NVIDIA driver (no kernel module loaded)")
            || doctor.contains("this is tracer's static build"),
        "the static build's NVML line:\n{doctor}"
    );
    eprintln!("xtask: check: the static binary has no loader and no library; doctor passes");
    Ok(())
}

/// The packages a clean root gets before the .deb: what it depends on and
/// what they depend on, and what maintainer scripts may use without
/// saying so (Debian's essential dash and coreutils, with their own).
const BASE: [&str; 10] = [
    "libc6",
    "libgcc-s1",
    "gcc-12-base",
    "dash",
    "coreutils",
    "libacl1",
    "libattr1",
    "libgmp10",
    "libselinux1",
    "libpcre2-8-0",
];

fn deb(deb: &Path) -> anyhow::Result<()> {
    let empty = tempfile::tempdir()?;
    dpkg_root(empty.path())?;
    let refused = Command::new("dpkg")
        .arg(format!("--root={}", empty.path().display()))
        .arg("-i")
        .arg(deb)
        .output()?;
    let said = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && said.contains("libc6"),
        "dpkg installed the .deb in an empty root, or refused it for another reason: {said}"
    );
    let clean = tempfile::tempdir()?;
    let r = clean.path();
    dpkg_root(r)?;
    for package in BASE {
        copy_installed(package, r)?;
    }
    sh(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .arg("-i")
        .arg(deb))?;
    let unit = std::fs::read_to_string(r.join("usr/lib/systemd/system/tracer.service"))?;
    ensure!(
        unit.contains("ExecStart=/usr/bin/tracer record"),
        "the unit runs another binary:\n{unit}"
    );
    let script = format!(
        "mount --make-rprivate / && mount -t proc proc {r}/proc && mount --rbind /sys {r}/sys \
         && mount --rbind /dev {r}/dev && chroot {r} /usr/bin/tracer doctor",
        r = r.display()
    );
    let doctor = capture(Command::new("unshare").args(["--mount", "sh", "-c", &script]))?;
    ensure!(
        doctor.contains("recording works here"),
        "doctor in the clean root:\n{doctor}"
    );
    ensure!(
        doctor.contains("no NVIDIA driver libraries"),
        "the packaged build did not look for the driver's library:\n{doctor}"
    );
    sh(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .args(["--purge", "tracer"]))?;
    ensure!(
        !r.join("usr/bin/tracer").exists(),
        "dpkg --purge left /usr/bin/tracer"
    );
    eprintln!(
        "xtask: check: the .deb is refused without libc6, installs in a clean root, doctor passes there, purge removes it"
    );
    Ok(())
}

/// Makes `r` a root dpkg can install into: usr-merged, an empty database.
fn dpkg_root(r: &Path) -> anyhow::Result<()> {
    for d in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "etc",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
    ] {
        std::fs::create_dir_all(r.join(d))?;
    }
    for l in ["bin", "sbin", "lib", "lib64"] {
        std::os::unix::fs::symlink(format!("usr/{l}"), r.join(l))?;
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "")?;
    Ok(())
}

/// Copies this machine's installed `package` into `r` and records it in
/// `r`'s dpkg database as installed.
fn copy_installed(package: &str, r: &Path) -> anyhow::Result<()> {
    let files = capture(Command::new("dpkg").args(["-L", package]))?;
    for f in files.lines().filter(|f| f.starts_with('/') && *f != "/.") {
        let src = Path::new(f);
        let dst = r.join(f.trim_start_matches('/'));
        let Ok(meta) = std::fs::symlink_metadata(src) else {
            continue;
        };
        if meta.is_dir() {
            std::fs::create_dir_all(&dst)?;
        } else if meta.file_type().is_symlink() {
            if dst.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(std::fs::read_link(src)?, &dst)?;
            }
        } else if meta.is_file() {
            std::fs::copy(src, &dst).with_context(|| format!("copy {f}"))?;
        }
    }
    let name = capture(Command::new("dpkg-query").args(["-W", "-f=${binary:Package}", package]))?;
    std::fs::write(
        r.join(format!("var/lib/dpkg/info/{}.list", name.trim())),
        &files,
    )?;
    if package == "dash" && r.join("usr/bin/sh").symlink_metadata().is_err() {
        std::os::unix::fs::symlink("dash", r.join("usr/bin/sh"))?;
    }
    let status = capture(Command::new("dpkg").args(["-s", package]))?;
    let mut db = std::fs::read_to_string(r.join("var/lib/dpkg/status"))?;
    db.push_str(status.trim_end());
    db.push_str("\n\n");
    std::fs::write(r.join("var/lib/dpkg/status"), db)?;
    Ok(())
}

/// runc, the reference OCI runtime: crun 1.8 (Debian 12's) refuses this
/// machine's hybrid cgroups (v1 controllers, hugetlb on the v2
/// hierarchy), even with its cgroup manager off.
fn runc() -> Command {
    Command::new("runc")
}

/// A container, deleted (killed first) when dropped.
struct Container {
    id: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = runc().args(["kill", &self.id, "KILL"]).output();
        let _ = wait_for(Duration::from_secs(10), || {
            let state = capture(runc().args(["state", &self.id])).ok()?;
            state.contains("\"stopped\"").then_some(())
        });
        let _ = runc().args(["delete", "--force", &self.id]).output();
        // runc gives up on a cgroup whose last task is still exiting;
        // the cgroups are ours (cgroupsPath), and go once empty.
        let _ = wait_for(Duration::from_secs(10), || {
            let left: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
                .ok()?
                .flatten()
                .map(|c| c.path().join(&self.id))
                .filter(|d| d.exists() && std::fs::remove_dir(d).is_err())
                .collect();
            left.is_empty().then_some(())
        });
    }
}

fn image(image: &Path) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let layout = work.path().join("layout");
    std::fs::create_dir_all(&layout)?;
    sh(Command::new("tar")
        .arg("-xf")
        .arg(image)
        .arg("-C")
        .arg(&layout))?;
    let bundle = work.path().join("bundle");
    sh(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{VERSION}", layout.display()))
        .arg(&bundle))?;
    let state = work.path().join("state");
    let spill = work.path().join("spill");
    std::fs::create_dir_all(&state)?;
    std::fs::create_dir_all(&spill)?;
    let nvml = nvml_library()?;
    let id = format!("tracer-dist-check-{}", std::process::id());
    privileged(&bundle.join("config.json"), &id, &state, &spill, &nvml)?;

    let bins = crate::build_memhog()?;
    let log_path = work.path().join("recorder.log");
    let log = std::fs::File::create(&log_path)?;
    let started = runc()
        .args(["run", "--detach", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()?;
    let container = Container { id };
    ensure!(
        started.success(),
        "runc run failed: {}",
        std::fs::read_to_string(&log_path)?
    );
    let ready = wait_for(Duration::from_secs(60), || {
        std::fs::read_to_string(&log_path)
            .ok()
            .filter(|l| l.contains("tracer: recording"))
    });
    ensure!(
        ready.is_some(),
        "the recorder in the container did not start:\n{}",
        std::fs::read_to_string(&log_path)?
    );

    let cg = TestCgroup::new("dist", 64 * MIB);
    let hog = tracer_e2e::oom_killed(&cg, &bins, 2, 20);
    let pid = hog.pid().to_string();
    let exec = |args: &[&str]| {
        capture(
            runc()
                .args(["exec", &container.id, "/usr/bin/tracer"])
                .args(args),
        )
    };
    let joined = wait_for(Duration::from_secs(20), || {
        let out = exec(&[
            "explain",
            "--store=/var/lib/tracer/tracer.db",
            "--pid",
            &pid,
            "--format=json",
        ])
        .ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v["kill"]["source"]
            .as_str()
            .is_some_and(|s| s.contains("kmsg"))
            .then_some(v)
    });
    let Some(v) = joined else {
        bail!(
            "explain in the container did not name pid {pid}:\n{}",
            std::fs::read_to_string(&log_path)?
        );
    };
    ensure!(
        v["kill"]["victim"]["comm"] == "memhog",
        "the victim is not memhog: {}",
        v["kill"]["victim"]
    );
    let text = exec(&[
        "explain",
        "--store=/var/lib/tracer/tracer.db",
        "--pid",
        &pid,
    ])?;
    ensure!(
        text.contains(&cg.path),
        "explain does not name the cgroup {}:\n{text}",
        cg.path
    );
    eprintln!("xtask: check: in the container, $ tracer explain --pid {pid}\n{text}");
    let doctor = exec(&["doctor"]).unwrap_or_else(|e| e.to_string());
    ensure!(
        doctor.contains("installed but the NVIDIA kernel module is not loaded"),
        "the driver's libnvidia-ml.so.1 did not load in the image:\n{doctor}"
    );
    sh(runc().args(["kill", &container.id, "TERM"]))?;
    let gone = wait_for(Duration::from_secs(20), || {
        let state = capture(runc().args(["state", &container.id])).ok()?;
        state.contains("\"stopped\"").then_some(())
    });
    ensure!(
        gone.is_some(),
        "the recorder in the container did not stop on SIGTERM"
    );
    let log = std::fs::read_to_string(&log_path)?;
    ensure!(
        !log.contains('\x1b'),
        "the container's log has terminal escapes:\n{log}"
    );
    let id = container.id.clone();
    drop(container);
    drop(cg);
    let left: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")?
        .flatten()
        .map(|c| c.path().join(&id))
        .filter(|d| d.exists())
        .collect();
    ensure!(
        left.is_empty(),
        "the container's cgroups are left: {left:?}"
    );
    eprintln!(
        "xtask: check: {IMAGE}:{VERSION} under runc recorded the OOM kill of pid {pid} outside it; explain inside named it"
    );
    Ok(())
}

/// The driver's real libnvidia-ml.so.1 (`cargo xtask setup` unpacks it).
fn nvml_library() -> anyhow::Result<PathBuf> {
    let lib = tracer_e2e::driver_libs()
        .context("no driver libraries: run cargo xtask setup")?
        .join("libnvidia-ml.so.1");
    std::fs::canonicalize(&lib).with_context(|| lib.display().to_string())
}

/// Rewrites umoci's config into the DaemonSet's: privileged (every
/// capability, no seccomp, nothing masked), the host's PID, network and
/// cgroup namespaces, the host's /sys and /dev/kmsg, the state and spill
/// directories, and NVML where the toolkit would put it.
fn privileged(
    config: &Path,
    id: &str,
    state: &Path,
    spill: &Path,
    nvml: &Path,
) -> anyhow::Result<()> {
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config)?)?;
    let all = all_capabilities();
    let p = &mut c["process"];
    p["args"] = json!([
        "/usr/bin/tracer",
        "record",
        "--store=/var/lib/tracer/tracer.db",
        "--cuda"
    ]);
    p["terminal"] = json!(false);
    p["noNewPrivileges"] = json!(false);
    p["capabilities"] = json!({
        "bounding": all, "effective": all, "permitted": all, "inheritable": all,
    });
    if let Some(o) = p.as_object_mut() {
        // The runtime's own limits, as a DaemonSet's container gets them.
        o.remove("rlimits");
        o.remove("apparmorProfile");
        o.remove("selinuxLabel");
    }
    c["root"]["readonly"] = json!(false);
    let linux = &mut c["linux"];
    linux["namespaces"] = json!([{"type": "mount"}, {"type": "uts"}, {"type": "ipc"}]);
    // runc makes this cgroup (in each v1 controller) and removes it.
    linux["cgroupsPath"] = json!(format!("/{id}"));
    linux["maskedPaths"] = json!([]);
    linux["readonlyPaths"] = json!([]);
    linux["resources"] = json!({"devices": [{"allow": true, "access": "rwm"}]});
    if let Some(o) = linux.as_object_mut() {
        o.remove("seccomp");
    }
    let bind = |from: &Path, to: &str, rec: bool| {
        json!({"destination": to, "type": "bind", "source": from,
               "options": [if rec { "rbind" } else { "bind" }, "rw"]})
    };
    let mut mounts: Vec<serde_json::Value> = c["mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            let d = m["destination"].as_str().unwrap_or_default();
            d != "/sys" && !d.starts_with("/sys/")
        })
        .collect();
    mounts.push(bind(Path::new("/sys"), "/sys", true));
    mounts.push(bind(Path::new("/dev/kmsg"), "/dev/kmsg", false));
    mounts.push(bind(state, "/var/lib/tracer", false));
    mounts.push(bind(spill, "/run/tracer", false));
    mounts.push(bind(
        nvml,
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        false,
    ));
    c["mounts"] = json!(mounts);
    std::fs::write(config, serde_json::to_string_pretty(&c)?)?;
    Ok(())
}

/// Every capability this process may hold (its bounding set), as OCI
/// names them: what a privileged container gets from its runtime.
fn all_capabilities() -> Vec<String> {
    const NAMES: [&str; 41] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    let bounding = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .unwrap_or(0);
    NAMES
        .iter()
        .enumerate()
        .filter(|(bit, _)| bounding & (1 << bit) != 0)
        .map(|(_, n)| format!("CAP_{n}"))
        .collect()
}
