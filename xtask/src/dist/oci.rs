//! The OCI image, written as an image layout by hand: one layer (a tar of
//! a staged root), its config, a manifest, an index, all JSON with sorted
//! keys. No daemon, no base image to pull; buildah or umoci would need a
//! base and write times of their own. The layer holds the glibc build and
//! the glibc runtime from this machine's Debian packages: the loader,
//! libc, libm, libgcc_s, and libpthread, libdl and librt, which the
//! driver's libnvidia-ml.so.1 links against when the NVIDIA container
//! toolkit mounts it in.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};
use serde_json::json;

use super::{IMAGE, Stamp, VERSION, capture, install_file, set_times, sha256, tar, write_file};

/// The glibc libraries in the image, by soname.
const RUNTIME: [&str; 7] = [
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
];
/// Where this machine (Debian) and the image keep them.
const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

/// Builds the image layout tar at `image`.
pub fn build(glibc: &Path, stamp: &Stamp, image: &Path) -> anyhow::Result<()> {
    let stage = tempfile::tempdir().context("staging directory")?;
    let rootfs = stage.path().join("rootfs");
    stage_root(glibc, stamp.epoch, &rootfs)?;
    let layout = stage.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;

    let layer_tar = stage.path().join("layer.tar");
    tar(&rootfs, stamp.epoch, &layer_tar)?;
    let diff_id = sha256(&layer_tar)?;
    let layer_gz = stage.path().join("layer.tar.gz");
    let gz = std::fs::File::create(&layer_gz)?;
    let status = Command::new("gzip")
        .args(["-n", "-9", "-c"])
        .arg(&layer_tar)
        .stdout(gz)
        .status()?;
    if !status.success() {
        bail!("gzip failed ({status})");
    }
    let layer = blob(&blobs, &layer_gz)?;

    let created = capture(
        Command::new("date")
            .args(["-u", "-d"])
            .arg(format!("@{}", stamp.epoch))
            .arg("+%Y-%m-%dT%H:%M:%SZ"),
    )?;
    let created = created.trim();
    let labels = json!({
        "org.opencontainers.image.title": "tracer",
        "org.opencontainers.image.description": "OOM kill and GPU memory flight recorder (eBPF)",
        "org.opencontainers.image.version": VERSION,
        "org.opencontainers.image.revision": stamp.commit,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
    });
    let config = json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/bin/tracer"],
            "Cmd": ["record", "--store=/var/lib/tracer/tracer.db"],
            "Env": [
                "PATH=/usr/bin",
                // The NVIDIA container toolkit mounts NVML (and only it)
                // into a container that asks for the utility capability.
                "NVIDIA_DRIVER_CAPABILITIES=utility",
            ],
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created": created, "created_by": "cargo xtask dist"}],
    });
    let config = json_blob(&blobs, &config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
        "annotations": labels,
    });
    let manifest = json_blob(&blobs, &manifest)?;
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["annotations"] = json!({
        "org.opencontainers.image.ref.name": VERSION,
        "io.containerd.image.name": format!("docker.io/library/{IMAGE}:{VERSION}"),
    });
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    });
    write_file(&layout.join("index.json"), &index.to_string(), 0o644)?;
    write_file(
        &layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    set_times(&layout, stamp.epoch)?;
    tar(&layout, stamp.epoch, image)
}

/// The image's root: the binary, the glibc runtime, the directories the
/// recorder writes, the licences.
fn stage_root(glibc: &Path, epoch: u64, rootfs: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{PermissionsExt as _, symlink};
    install_file(glibc, &rootfs.join("usr/bin/tracer"), 0o755)?;
    for name in RUNTIME {
        let host = Path::new("/").join(LIBDIR).join(name);
        let real = std::fs::canonicalize(&host)
            .with_context(|| format!("{} (libc6 or libgcc-s1 is not installed)", host.display()))?;
        install_file(&real, &rootfs.join(LIBDIR).join(name), 0o755)?;
    }
    std::fs::create_dir_all(rootfs.join("usr/lib64"))?;
    symlink(
        format!("../lib/x86_64-linux-gnu/{}", RUNTIME[0]),
        rootfs.join("usr/lib64").join(RUNTIME[0]),
    )?;
    symlink("usr/lib", rootfs.join("lib"))?;
    symlink("usr/lib64", rootfs.join("lib64"))?;
    symlink("usr/bin", rootfs.join("bin"))?;
    // ldconfig (the toolkit runs the host's on this root) reads these.
    write_file(
        &rootfs.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
        0o644,
    )?;
    write_file(
        &rootfs.join("etc/ld.so.conf.d/x86_64-linux-gnu.conf"),
        "/usr/lib/x86_64-linux-gnu\n",
        0o644,
    )?;
    write_file(
        &rootfs.join("usr/share/doc/tracer/copyright"),
        super::deb::COPYRIGHT,
        0o644,
    )?;
    for package in ["libc6", "libgcc-s1"] {
        let from = Path::new("/usr/share/doc").join(package).join("copyright");
        install_file(
            &from,
            &rootfs.join("usr/share/doc").join(package).join("copyright"),
            0o644,
        )?;
    }
    for (dir, mode) in [
        ("tmp", 0o1777),
        ("var/lib/tracer", 0o700),
        ("run", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
    ] {
        let d = rootfs.join(dir);
        std::fs::create_dir_all(&d)?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))?;
    }
    set_times(rootfs, epoch)
}

/// A blob and its size.
struct Blob {
    digest: String,
    size: u64,
}

fn descriptor(media_type: &str, b: &Blob) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": format!("sha256:{}", b.digest), "size": b.size})
}

/// Moves `file` into `blobs` under its digest.
fn blob(blobs: &Path, file: &Path) -> anyhow::Result<Blob> {
    let digest = sha256(file)?;
    let size = std::fs::metadata(file)?.len();
    std::fs::copy(file, blobs.join(&digest))?;
    Ok(Blob { digest, size })
}

fn json_blob(blobs: &Path, v: &serde_json::Value) -> anyhow::Result<Blob> {
    let tmp = blobs.join("tmp.json");
    std::fs::write(&tmp, v.to_string())?;
    let b = blob(blobs, &tmp)?;
    std::fs::remove_file(&tmp)?;
    Ok(b)
}
