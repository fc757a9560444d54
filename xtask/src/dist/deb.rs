//! The .deb, by dpkg-deb from a staged tree: the glibc build as
//! /usr/bin/tracer, the systemd unit (not enabled: the operator enables
//! it), the licence, md5sums and maintainer scripts that reload systemd
//! and stop the service on removal. dpkg-deb, not cargo-deb: it is on
//! every Debian machine, needs no build of its own, and writes the same
//! bytes for the same tree and SOURCE_DATE_EPOCH.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use super::{Stamp, VERSION, capture, glibc_needed, install_file, set_times, write_file};
use crate::{root, sh};

/// The licence file both packages carry.
pub const COPYRIGHT: &str = "\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tracer
Source: the tracer repository

Files: *
License: MIT or Apache-2.0
 tracer may be used under the terms of either the MIT licence or the
 Apache License, Version 2.0, at your option.
";

const POSTINST: &str = "\
#!/bin/sh
set -e
# The unit is installed, not enabled: `systemctl enable --now tracer`.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    if [ \"$1\" = configure ] && systemctl is-active --quiet tracer.service; then
        systemctl restart tracer.service || true
    fi
fi
";

const PRERM: &str = "\
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
    systemctl stop tracer.service || true
    systemctl disable tracer.service >/dev/null 2>&1 || true
fi
";

const POSTRM: &str = "\
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
# Purging removes the recorded kills; removing keeps them.
if [ \"$1\" = purge ]; then
    rm -rf /var/lib/tracer
fi
";

/// Builds the .deb at `deb`.
pub fn build(glibc: &Path, stamp: &Stamp, deb: &Path) -> anyhow::Result<()> {
    let stage = tempfile::tempdir().context("staging directory")?;
    let tree = stage.path().join("tree");
    install_file(glibc, &tree.join("usr/bin/tracer"), 0o755)?;
    write_file(
        &tree.join("usr/lib/systemd/system/tracer.service"),
        &unit()?,
        0o644,
    )?;
    write_file(
        &tree.join("usr/share/doc/tracer/copyright"),
        COPYRIGHT,
        0o644,
    )?;
    let sums = capture(
        Command::new("sh")
            .args(["-c", "find usr -type f | LC_ALL=C sort | xargs md5sum"])
            .current_dir(&tree),
    )?;
    let size_kib = capture(
        Command::new("du")
            .args(["-sk", "--apparent-size", "usr"])
            .current_dir(&tree),
    )?;
    let size_kib = size_kib
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_string();
    let debian = tree.join("DEBIAN");
    write_file(&debian.join("md5sums"), &sums, 0o644)?;
    write_file(&debian.join("control"), &control(glibc, &size_kib)?, 0o644)?;
    write_file(&debian.join("postinst"), POSTINST, 0o755)?;
    write_file(&debian.join("prerm"), PRERM, 0o755)?;
    write_file(&debian.join("postrm"), POSTRM, 0o755)?;
    set_times(&tree, stamp.epoch)?;
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(deb)
        .env("SOURCE_DATE_EPOCH", stamp.epoch.to_string()))
}

/// The repository's unit, with the package's path for the binary.
fn unit() -> anyhow::Result<String> {
    let path = root().join("deploy/systemd/tracer.service");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    // Its first comment says how to install it by hand; the package did.
    let body: String = text
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| l.replace("/usr/local/bin/tracer", "/usr/bin/tracer") + "\n")
        .collect();
    Ok(format!(
        "# tracer's recorder as a node service (the tracer package).\n# Enable it: sudo systemctl enable --now tracer\n{body}"
    ))
}

fn control(glibc: &Path, size_kib: &str) -> anyhow::Result<String> {
    let libc = glibc_needed(glibc)?;
    Ok(format!(
        "Package: tracer
Version: {VERSION}
Architecture: amd64
Maintainer: tracer developers <tracer@localhost>
Installed-Size: {size_kib}
Depends: libc6 (>= {libc}), libgcc-s1
Section: admin
Priority: optional
Description: OOM kill and GPU memory flight recorder (eBPF)
 tracer records every OOM kill on the node with what led to it (the
 victim's cgroup, the memory that grew and the code that grew it, GPU
 memory from NVML and CUDA) and explains it afterwards: tracer explain.
 It runs as a systemd service (tracer.service) or a DaemonSet.
"
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_packaged_unit_runs_the_packaged_binary_and_says_how_to_enable_it() {
        let unit = super::unit().unwrap();
        assert!(
            unit.contains("\nExecStart=/usr/bin/tracer record "),
            "{unit}"
        );
        assert!(!unit.contains("/usr/local"), "{unit}");
        assert!(unit.contains("systemctl enable --now tracer"), "{unit}");
        assert!(
            unit.contains("\n[Service]\n") && unit.contains("\n[Install]\n"),
            "{unit}"
        );
    }
}
