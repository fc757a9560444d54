//! What ships under deploy/, checked by the tools that will read it.

use std::{path::PathBuf, process::Command};

use tracer_e2e::tracer_bin;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify_without_a_warning() {
    let unit = std::fs::read_to_string(deploy().join("systemd/tracer.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/tracer record "),
        "{unit}"
    );
    // verify also checks that ExecStart's program exists: point it at the
    // binary under test, the rest of the unit as shipped.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("tracer.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/tracer", &tracer_bin().display().to_string()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze (Debian's systemd) is needed");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.trim().is_empty(), "warnings: {said}");
    // And the arguments it starts the recorder with are ones it takes.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/tracer "))
        .unwrap();
    let mut args: Vec<&str> = exec.split_whitespace().collect();
    args.push("--help");
    let help = Command::new(tracer_bin()).args(&args).output().unwrap();
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
}

/// PyPI's kubernetes-validate and its Python, set up by `cargo xtask setup`.
fn pytools() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pytools/bin");
    if dir.join("kubernetes-validate").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} missing: cargo xtask setup installs it",
        dir.display()
    );
    eprintln!("skipped: no kubernetes-validate (run cargo xtask setup)");
    None
}

#[test]
fn the_kubernetes_manifests_validate_and_agree_with_each_other() {
    let Some(bin) = pytools() else { return };
    let k8s = deploy().join("kubernetes");
    let out = Command::new(bin.join("kubernetes-validate"))
        .arg("--strict")
        .arg(k8s.join("daemonset.yaml"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("passed for resource daemonset/tracer"),
        "{said}"
    );
    // The PodMonitor is a CRD the validator has no schema for: check that it
    // selects the DaemonSet's pods and names a port they have, and that the
    // probes and the recorder's arguments agree.
    let check = r#"
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "DaemonSet"][0]
pm = yaml.safe_load(open(sys.argv[2]))
pod = ds["spec"]["template"]
labels = pod["metadata"]["labels"]
assert all(labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items()), "selector"
c = pod["spec"]["containers"][0]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
for ep in pm["spec"]["podMetricsEndpoints"]:
    assert ep["port"] in ports, ep
assert c["livenessProbe"]["httpGet"]["port"] in ports
metrics = [a for a in c["args"] if a.startswith("--metrics=")][0]
assert metrics.endswith(":%d" % ports["metrics"]), metrics
# Remote scraping is authenticated: the token file is the Secret's key,
# mounted where the argument says, and the PodMonitor sends that Secret.
token = [a for a in c["args"] if a.startswith("--metrics-token-file=")][0].split("=", 1)[1]
mount = [m for m in c["volumeMounts"] if token.startswith(m["mountPath"] + "/")][0]
vol = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]][0]
secret = vol["secret"]["secretName"]
assert token == mount["mountPath"] + "/token", token
for ep in pm["spec"]["podMetricsEndpoints"]:
    cred = ep["authorization"]["credentials"]
    assert ep["authorization"]["type"] == "Bearer" and cred == {"name": secret, "key": "token"}, ep
# Probes send no token: they ask the one page that needs none.
assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
assert pod["spec"]["hostPID"] is True and c["securityContext"]["privileged"] is True
# The image `cargo xtask dist` builds, by its name and tag, and its binary.
assert c["image"] == "tracer:" + sys.argv[3], c["image"]
assert c["command"] == ["/usr/bin/tracer"], c["command"]
print("ok", " ".join(c["args"]))
"#;
    let out = Command::new(bin.join("python"))
        .arg("-c")
        .arg(check)
        .arg(k8s.join("daemonset.yaml"))
        .arg(k8s.join("podmonitor.yaml"))
        .arg(env!("CARGO_PKG_VERSION"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The recorder takes those arguments.
    let args = String::from_utf8_lossy(&out.stdout).to_string();
    let mut argv: Vec<&str> = args.trim().split(' ').skip(1).collect();
    argv.push("--help");
    let help = Command::new(tracer_bin()).args(&argv).output().unwrap();
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
}

#[test]
fn the_front_door_installs_what_cargo_xtask_dist_builds() {
    let root = deploy().join("..");
    let version = env!("CARGO_PKG_VERSION");
    let deb = format!("sudo apt install ./tracer_{version}_amd64.deb");
    let image = format!("tracer:{version}");
    for doc in ["README.md", "docs/operate/install.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        assert!(text.contains(&deb), "{doc} does not install {deb:?}");
        assert!(
            text.contains(&image),
            "{doc} does not name the image {image}"
        );
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let install = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    assert_eq!(
        install.lines().count(),
        2,
        "the README's first commands are the install, in two lines:\n{install}"
    );
}
