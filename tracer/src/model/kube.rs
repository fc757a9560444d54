//! Kubernetes names (namespace, pod, container) of a pod's cgroup from
//! node-local files, without the API server: the kubelet's log
//! directories (`/var/log/pods/<namespace>_<pod>_<uid>/`) and links
//! (`/var/log/containers/<pod>_<namespace>_<container>-<id>.log`), then the
//! runtime's OCI bundle annotations (containerd's `io.kubernetes.cri.*`,
//! CRI-O's `io.kubernetes.pod.*`) for what those miss. All of it under a
//! host root (`--host-root /host` for an agent in a container).
//!
//! A name read from a file is used only if it is a Kubernetes name (a DNS
//! subdomain: lowercase letters, digits, `-` and `.`): a file name that is
//! not one is not taken as one. Names are kept once seen, so a kill names
//! a pod whose directories are already gone.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub use super::cgroup::KubeNames;
use super::cgroup::Owner;

/// The directories are listed again for a name not known at most this often.
const RESCAN: Duration = Duration::from_secs(1);
/// An OCI bundle that did not name a container is read again after this.
const BUNDLE_RETRY: Duration = Duration::from_secs(10);
/// A pod or container not found is looked for again after this.
const MISS_RETRY: Duration = Duration::from_secs(10);
/// Names kept (pods and containers each); past it the oldest knowledge is
/// dropped in bulk and what still exists is read again.
const KEEP: usize = 65_536;

/// Where the runtimes keep a container's OCI bundle (`{}`: the id).
const BUNDLES: &[&str] = &[
    "run/containerd/io.containerd.runtime.v2.task/k8s.io/{}/config.json",
    "run/containers/storage/overlay-containers/{}/userdata/config.json",
    "var/lib/containers/storage/overlay-containers/{}/userdata/config.json",
];

/// Names pods and containers from the files of a node.
#[derive(Debug)]
pub struct KubeResolver {
    root: PathBuf,
    /// Pod UID -> (namespace, pod).
    pods: HashMap<String, (String, String)>,
    /// Container id -> container name (None: known to have none, as a
    /// pod's sandbox).
    containers: HashMap<String, Option<String>>,
    scanned: Option<Instant>,
    bundles_tried: HashMap<String, Instant>,
    /// Pods and containers looked for and not found, and when: looked for
    /// again only after [`MISS_RETRY`].
    misses: HashMap<String, Instant>,
    /// Pods and containers named since the last [`Self::take_new`].
    fresh: HashSet<String>,
}

/// Whether `s` is a Kubernetes object name (DNS-1123 subdomain).
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
}

fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// `<namespace>_<pod>_<uid>` (a directory of /var/log/pods).
fn parse_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let (rest, uid) = name.rsplit_once('_')?;
    let (ns, pod) = rest.split_once('_')?;
    (is_name(ns) && is_name(pod) && is_uid(uid)).then_some((ns, pod, uid))
}

/// `<pod>_<namespace>_<container>-<id>.log` (a link of /var/log/containers):
/// (container, id).
fn parse_container_link(name: &str) -> Option<(&str, &str)> {
    let stem = name.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    let mut parts = rest.split('_');
    let (pod, ns, ctr) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none()
        && is_name(pod)
        && is_name(ns)
        && is_name(ctr)
        && id.len() == 64
        && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some((ctr, id))
}

/// Names from an OCI bundle's annotations: (namespace, pod, uid,
/// container), each when given and valid.
fn from_annotations(
    ann: &serde_json::Map<String, serde_json::Value>,
) -> (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
) {
    let get = |keys: &[&str], valid: fn(&str) -> bool| {
        keys.iter()
            .find_map(|k| ann.get(*k)?.as_str())
            .filter(|v| valid(v))
            .map(String::from)
    };
    let sandbox = ann
        .get("io.kubernetes.cri.container-type")
        .and_then(|v| v.as_str())
        == Some("sandbox");
    let container = (!sandbox)
        .then(|| {
            get(
                &[
                    "io.kubernetes.cri.container-name",
                    "io.kubernetes.container.name",
                ],
                is_name,
            )
        })
        .flatten()
        .filter(|c| c != "POD");
    (
        get(
            &[
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace",
            ],
            is_name,
        ),
        get(
            &["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"],
            is_name,
        ),
        get(
            &["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"],
            is_uid,
        ),
        container,
    )
}

impl KubeResolver {
    /// A resolver reading the node's files under `root` (`/` on the host).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            pods: HashMap::new(),
            containers: HashMap::new(),
            scanned: None,
            bundles_tried: HashMap::new(),
            misses: HashMap::new(),
            fresh: HashSet::new(),
        }
    }

    /// The host root it reads under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Fills `owner.kube` for a pod's cgroup, when its names can be found.
    pub fn fill(&mut self, owner: &mut Owner) {
        let Some(uid) = owner.pod_uid.as_deref() else {
            return;
        };
        let id = owner.container_id.as_deref();
        let key = id.unwrap_or(uid);
        let may_look = self
            .misses
            .get(key)
            .is_none_or(|t| t.elapsed() >= MISS_RETRY);
        if !self.complete(uid, id) && may_look {
            if self.scanned.is_none_or(|t| t.elapsed() >= RESCAN) {
                self.scan();
            }
            if !self.complete(uid, id)
                && let Some(id) = id
            {
                self.read_bundle(id, uid);
            }
            if self.complete(uid, id) {
                self.misses.remove(key);
            } else {
                if self.misses.len() >= KEEP {
                    self.misses.clear();
                }
                self.misses.insert(key.to_string(), Instant::now());
            }
        }
        owner.kube = self.pods.get(uid).map(|(ns, pod)| KubeNames {
            namespace: ns.clone(),
            pod: pod.clone(),
            container: id.and_then(|id| self.containers.get(id)).cloned().flatten(),
        });
    }

    fn complete(&self, uid: &str, id: Option<&str>) -> bool {
        self.pods.contains_key(uid) && id.is_none_or(|id| self.containers.contains_key(id))
    }

    fn keep<V>(map: &mut HashMap<String, V>, key: &str, value: V, fresh: &mut HashSet<String>) {
        if map.len() >= KEEP && !map.contains_key(key) {
            map.clear();
        }
        if map.insert(key.to_string(), value).is_none() {
            fresh.insert(key.to_string());
        }
    }

    /// Lists the kubelet's pod directories and container links.
    fn scan(&mut self) {
        self.scanned = Some(Instant::now());
        let list = |dir: &str| -> Vec<String> {
            fs::read_dir(self.root.join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        };
        for name in list("var/log/pods") {
            if let Some((ns, pod, uid)) = parse_pod_dir(&name) {
                let v = (ns.to_string(), pod.to_string());
                Self::keep(&mut self.pods, uid, v, &mut self.fresh);
            }
        }
        for name in list("var/log/containers") {
            if let Some((ctr, id)) = parse_container_link(&name) {
                Self::keep(
                    &mut self.containers,
                    id,
                    Some(ctr.to_string()),
                    &mut self.fresh,
                );
            }
        }
    }

    /// Reads container `id`'s OCI bundle for what the log directories did
    /// not give (a pod of pod UID `uid`).
    fn read_bundle(&mut self, id: &str, uid: &str) {
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return;
        }
        if self
            .bundles_tried
            .get(id)
            .is_some_and(|t| t.elapsed() < BUNDLE_RETRY)
        {
            return;
        }
        if self.bundles_tried.len() >= KEEP {
            self.bundles_tried.clear();
        }
        self.bundles_tried.insert(id.to_string(), Instant::now());
        for pattern in BUNDLES {
            let path = self.root.join(pattern.replace("{}", id));
            // A bundle's config is a few KiB; refuse a file that is not.
            let Ok(text) = crate::util::fsafe::read_capped(&path, 4 << 20) else {
                continue;
            };
            let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&text) else {
                continue;
            };
            let Some(ann) = doc.get("annotations").and_then(|a| a.as_object()) else {
                continue;
            };
            let (ns, pod, pod_uid, ctr) = from_annotations(ann);
            // The bundle must be of this pod when it says which.
            if pod_uid.as_deref().is_some_and(|u| u != uid) {
                continue;
            }
            if let (Some(ns), Some(pod)) = (ns, pod)
                && !self.pods.contains_key(uid)
            {
                Self::keep(&mut self.pods, uid, (ns, pod), &mut self.fresh);
            }
            // A sandbox (or CRI-O's infra container, `POD`) has no
            // container name: known, so never looked for again.
            Self::keep(&mut self.containers, id, ctr, &mut self.fresh);
            return;
        }
    }

    /// How many pods and containers were named since the last call.
    pub fn take_new(&mut self) -> usize {
        let n = self.fresh.len();
        self.fresh.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cgroup::owner_of;

    const UID: &str = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f";

    fn id(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn kubelet_files(root: &Path, ns: &str, pod: &str, ctr: &str, cid: &str) {
        let pdir = root.join(format!("var/log/pods/{ns}_{pod}_{UID}/{ctr}"));
        fs::create_dir_all(&pdir).unwrap();
        fs::write(pdir.join("0.log"), "").unwrap();
        let links = root.join("var/log/containers");
        fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            pdir.join("0.log"),
            links.join(format!("{pod}_{ns}_{ctr}-{cid}.log")),
        )
        .unwrap();
    }

    #[test]
    fn names_a_container_from_the_kubelets_log_directories() {
        let root = tempfile::tempdir().unwrap();
        let cid = id('a');
        kubelet_files(root.path(), "ml-team", "trainer-7d9f-x2", "worker", &cid);
        let mut r = KubeResolver::new(root.path());
        let mut o = owner_of(&format!("/kubepods/burstable/pod{UID}/{cid}"));
        r.fill(&mut o);
        assert_eq!(
            o.kube,
            Some(KubeNames {
                namespace: "ml-team".into(),
                pod: "trainer-7d9f-x2".into(),
                container: Some("worker".into()),
            })
        );
        assert_eq!(r.take_new(), 2);
        // The pod's cgroup itself: the pod's names, no container.
        let mut p = owner_of(&format!("/kubepods/burstable/pod{UID}"));
        r.fill(&mut p);
        assert_eq!(
            p.kube.as_ref().map(|k| k.pod.as_str()),
            Some("trainer-7d9f-x2")
        );
        assert_eq!(p.kube.unwrap().container, None);
        // Kept once seen: the pod's directories go, the names stay.
        fs::remove_dir_all(root.path().join("var/log")).unwrap();
        let mut again = owner_of(&format!("/kubepods/burstable/pod{UID}/{cid}"));
        r.fill(&mut again);
        assert_eq!(again.kube, o.kube);
        assert_eq!(r.take_new(), 0);
    }

    #[test]
    fn the_systemd_drivers_cgroup_names_resolve_too() {
        let root = tempfile::tempdir().unwrap();
        let cid = id('b');
        kubelet_files(root.path(), "default", "web-0", "nginx", &cid);
        let mut r = KubeResolver::new(root.path());
        let sd = UID.replace('-', "_");
        let mut o = owner_of(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/cri-containerd-{cid}.scope"
        ));
        r.fill(&mut o);
        let k = o.kube.expect("named");
        assert_eq!((k.namespace.as_str(), k.pod.as_str()), ("default", "web-0"));
        assert_eq!(k.container.as_deref(), Some("nginx"));
    }

    fn bundle(root: &Path, rel: &str, cid: &str, annotations: serde_json::Value) {
        let path = root.join(rel.replace("{}", cid));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let doc = serde_json::json!({ "ociVersion": "1.0.2", "annotations": annotations });
        fs::write(path, doc.to_string()).unwrap();
    }

    #[test]
    fn oci_bundle_annotations_fill_what_the_logs_do_not_give() {
        let root = tempfile::tempdir().unwrap();
        // containerd
        let c1 = id('c');
        bundle(
            root.path(),
            BUNDLES[0],
            &c1,
            serde_json::json!({
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "trainer",
                "io.kubernetes.cri.sandbox-name": "job-0",
                "io.kubernetes.cri.sandbox-namespace": "batch",
                "io.kubernetes.cri.sandbox-uid": UID,
            }),
        );
        let mut r = KubeResolver::new(root.path());
        let mut o = owner_of(&format!("/kubepods/pod{UID}/{c1}"));
        r.fill(&mut o);
        let k = o.kube.expect("named by containerd's bundle");
        assert_eq!(
            (k.namespace.as_str(), k.pod.as_str(), k.container.as_deref()),
            ("batch", "job-0", Some("trainer"))
        );
        // CRI-O, another pod
        let uid2 = "0a0b0c0d-1111-2222-3333-444455556666";
        let c2 = id('d');
        bundle(
            root.path(),
            BUNDLES[1],
            &c2,
            serde_json::json!({
                "io.kubernetes.container.name": "app",
                "io.kubernetes.pod.name": "api-1",
                "io.kubernetes.pod.namespace": "prod",
                "io.kubernetes.pod.uid": uid2,
            }),
        );
        let mut o = owner_of(&format!("/kubepods/besteffort/pod{uid2}/crio-{c2}"));
        r.fill(&mut o);
        let k = o.kube.expect("named by CRI-O's bundle");
        assert_eq!(
            (k.namespace.as_str(), k.pod.as_str(), k.container.as_deref()),
            ("prod", "api-1", Some("app"))
        );
        // A sandbox (pause) container names its pod but no container.
        let c3 = id('e');
        let uid3 = "99999999-8888-7777-6666-555544443333";
        bundle(
            root.path(),
            BUNDLES[0],
            &c3,
            serde_json::json!({
                "io.kubernetes.cri.container-type": "sandbox",
                "io.kubernetes.cri.sandbox-name": "job-1",
                "io.kubernetes.cri.sandbox-namespace": "batch",
                "io.kubernetes.cri.sandbox-uid": uid3,
            }),
        );
        let mut o = owner_of(&format!("/kubepods/pod{uid3}/{c3}"));
        r.fill(&mut o);
        let k = o.kube.expect("the sandbox's pod");
        assert_eq!((k.pod.as_str(), k.container), ("job-1", None));
        // Known to have no name: the files are not read again for it.
        let scanned = r.scanned;
        std::thread::sleep(RESCAN);
        let mut again = owner_of(&format!("/kubepods/pod{uid3}/{c3}"));
        r.fill(&mut again);
        assert_eq!(
            r.scanned, scanned,
            "no scan for a sandbox known to have no name"
        );
    }

    #[test]
    fn a_bundle_of_another_pod_or_hostile_names_are_not_taken() {
        let root = tempfile::tempdir().unwrap();
        let cid = id('f');
        bundle(
            root.path(),
            BUNDLES[0],
            &cid,
            serde_json::json!({
                "io.kubernetes.cri.container-name": "x",
                "io.kubernetes.cri.sandbox-name": "other",
                "io.kubernetes.cri.sandbox-namespace": "ns",
                "io.kubernetes.cri.sandbox-uid": "11111111-2222-3333-4444-555555555555",
            }),
        );
        let mut r = KubeResolver::new(root.path());
        let mut o = owner_of(&format!("/kubepods/pod{UID}/{cid}"));
        r.fill(&mut o);
        assert_eq!(o.kube, None, "a bundle of another pod names nothing");
        // Names that are not Kubernetes names: escapes, upper case, spaces.
        for bad in [
            "evil\x1b[2J_pod_{UID}",
            "Ns_pod_{UID}",
            "ns_po d_{UID}",
            "ns_pod",
        ] {
            assert_eq!(parse_pod_dir(&bad.replace("{UID}", UID)), None, "{bad:?}");
        }
        let long = format!("p_ns_c-{}.log", id('1'));
        assert_eq!(parse_container_link(&long), Some(("c", id('1').as_str())));
        for bad in [
            format!("p_ns_c\x07-{}.log", id('1')),
            format!("p_ns_c-{}.log", &id('1')[1..]),
            format!("p_ns_c_d-{}.log", id('1')),
            format!("p_ns_c-{}", id('1')),
        ] {
            assert_eq!(parse_container_link(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_pod_not_found_is_looked_for_again_only_after_a_while() {
        let root = tempfile::tempdir().unwrap();
        let mut r = KubeResolver::new(root.path());
        let path = format!("/kubepods/pod{UID}/{}", id('9'));
        r.fill(&mut owner_of(&path));
        let first = r.scanned.expect("looked once");
        std::thread::sleep(RESCAN);
        r.fill(&mut owner_of(&path));
        assert_eq!(
            r.scanned,
            Some(first),
            "a miss is not looked for every second"
        );
    }

    #[test]
    fn processes_outside_pods_are_not_looked_up() {
        let root = tempfile::tempdir().unwrap();
        let mut r = KubeResolver::new(root.path().join("nothing-here"));
        let mut o = owner_of(&format!("/docker/{}", id('a')));
        r.fill(&mut o);
        assert_eq!(o.kube, None);
        assert!(r.scanned.is_none(), "no pod: no directory listed");
    }
}
